"""`llogos lookup-create`: a static lookup cache (-lcs) from a corpus, as llama.cpp's llama-lookup-create."""

from pathlib import Path

import click

from llogos_cli.cli.group import cli
from llogos_cli.cli.options import model_name_option
from llogos_cli.cli.text_input import read_file
from llogos_cli.console import err
from llogos_cli.engine.ngram_cache import STATIC_SIZE, count, save
from llogos_cli.errors import LlogosError
from llogos_cli.model.loader import open_tokenizer


@cli.command(name="lookup-create")
@model_name_option
@click.option("-f", "--file", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="The corpus: this file's text, tokenized whole (BOS as the model asks, special tokens parsed).")
@click.option("-lcs", "--lookup-cache-static", "lookup_cache_static", metavar="FILE", required=True,
              help="Write the 2-gram counts here, in llama.cpp's lookup cache layout.")
def lookup_create(model_name, file, lookup_cache_static):
    """Count which token follows each pair of tokens in a corpus, for ngram-cache's -lcs (the model's
    tokenizer only is read)."""
    text = read_file(file, "corpus", exact=True)
    tokens = open_tokenizer(model_name).encode(text)
    counts = count(tokens, (STATIC_SIZE,))
    try:
        save(counts, lookup_cache_static)
    except OSError as e:
        raise LlogosError(f"cannot write {lookup_cache_static}: {e.strerror or e}") from None
    err.print(f"{len(tokens)} tokens, {len(counts)} 2-grams: {lookup_cache_static}", soft_wrap=True)
