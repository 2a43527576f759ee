"""`llogos embed`: one embedding per text, as llama.cpp's llama-embedding makes them."""

import json
import sys
from pathlib import Path

import click

from llogos_cli.cli.group import cli
from llogos_cli.cli.options import drop_newline, model_options
from llogos_cli.cli.text_input import read_file, read_stdin
from llogos_cli.cli.rerank_output import rerank_lines
from llogos_cli.engine.embedding import DEFAULT_NORMALIZE, Embedder, EmbedOptions, prompt_ids
from llogos_cli.errors import LlogosError
from llogos_cli.model.config import POOLING_TYPES
from llogos_cli.model.loader import LoadOptions


@cli.command()
@model_options
@click.option("-p", "--prompt", "prompts", multiple=True, help="A text to embed. Repeatable.")
@click.option("-f", "--file", type=click.Path(path_type=Path, dir_okay=False),
              help="Embed each line of this file (stdin, when piped, is read the same way).")
@click.option("--pooling", type=click.Choice(POOLING_TYPES),
              help="How token states become one vector: none (one per token), mean, cls (the first token), "
                   "last; rank: a reranker's score of each line's query and document (split at --cls-separator). "
                   "[default: the GGUF's pooling_type, else mean for encoders and last for decoders]")
@click.option("--embd-normalize", type=click.IntRange(min=-1), default=DEFAULT_NORMALIZE, show_default=True,
              help="-1 none, 0 max absolute scaled to int16, 1 taxicab, 2 euclidean, p > 2 the p-norm.")
@click.option("--cls-separator", default="\t", show_default=repr("\t"),
              help="With --pooling rank: what parts a line into its query and its document.")
@click.option("--json", "as_json", is_flag=True,
              help='One {"index": i, "embedding": [...]} object a line (rank: {"index": i, "score": s}).')
def embed(model: LoadOptions, prompts, file, pooling, embd_normalize, cls_separator, as_json):
    """Embed texts with the model's final hidden states, pooled, one line each on stdout; or, with
    --pooling rank, score each query and document as a reranker (scores as the head gives them,
    never normalized)."""
    texts = _texts(prompts, file)
    mf = model.open(generates=False)
    n_ctx = model.n_ctx(mf)
    if (pooling or mf.cfg.pooling) == "rank":
        if not cls_separator:
            raise LlogosError("--cls-separator is empty: it must part a line into its query and its document")
        rerank_lines(model, mf, n_ctx, texts, cls_separator, as_json)
        return
    options = EmbedOptions(pooling or mf.cfg.pooling, embd_normalize)
    ids = [prompt_ids(mf.tokenizer, text) for text in texts]
    loaded = model.load(mf, n_ctx)
    vectors = Embedder(loaded.model, n_ctx).embed(ids, options)
    row = 0
    for index, vector in enumerate(vectors):
        if as_json:
            sys.stdout.write(json.dumps({"index": index, "embedding": vector.tolist()}) + "\n")
            continue
        for token_vector in vector.reshape(-1, vector.shape[-1]):   # pooling none: a line a token, as llama-embedding
            number = "{:6.0f}" if embd_normalize == 0 else "{:9.6f}"
            sys.stdout.write(f"embedding {row}: " + " ".join(number.format(v) for v in token_vector) + "\n")
            row += 1


def _texts(prompts: tuple[str, ...], file: Path | None) -> list[str]:
    """-p's texts, or each line of -f's file or of stdin."""
    if prompts and file is not None:
        raise LlogosError("give the texts either with -p or with -f, not both")
    if prompts:
        return list(prompts)
    if file is not None:
        text = read_file(file, "input file")
    elif not sys.stdin.isatty():
        text = read_stdin("the input")
    else:
        raise LlogosError("nothing to embed: give -p TEXT, -f FILE or pipe the texts in, one a line")
    lines = drop_newline(text).split("\n")
    if not text.strip():
        raise LlogosError("the input is empty: there is nothing to embed")
    return lines
