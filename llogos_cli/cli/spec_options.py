"""Speculative decoding's options, with llama.cpp's names and defaults, for every command that generates."""

import click

from llogos_cli.cli.options import _grouped
from llogos_cli.engine.speculation import SPEC_TYPES, SpecParams

_DEFAULTS = SpecParams()

_SPECULATION = [
    click.option("--spec-type", type=click.Choice(SPEC_TYPES), default=_DEFAULTS.spec_type, show_default=True,
                 help="Speculative decoding: ngram-simple drafts the tokens that followed the last n tokens' "
                      "earlier occurrence (prompt or output); ngram-map-k as much of it as the last draft of those "
                      "tokens kept, ngram-map-k4v only when one continuation of them dominates; ngram-mod chains "
                      "through a table of every request's n-grams; ngram-cache drafts the likeliest next token "
                      "after the last 1-4 tokens, token by token. The model checks a draft in one pass and the "
                      "output is unchanged."),
    click.option("--spec-ngram-simple-size-n", type=click.IntRange(min=1), default=_DEFAULTS.spec_ngram_simple_size_n,
                 show_default=True, help="ngram-simple: how many of the last tokens are looked up."),
    click.option("--spec-ngram-simple-size-m", type=click.IntRange(min=1), default=_DEFAULTS.spec_ngram_simple_size_m,
                 show_default=True, help="ngram-simple: how many tokens after the match are drafted, at most (a step's draft)."),
    *[click.option(f"--spec-ngram-map-{kind}-size-{x}", type=click.IntRange(1, 1024),
                   default=getattr(_DEFAULTS, f"spec_ngram_map_{kind}_size_{x}"), show_default=True,
                   help=f"ngram-map-{kind}: " + ("how many of the last tokens are looked up." if x == "n" else
                                                 "how many tokens after the match are drafted, at most."))
      for kind in ("k", "k4v") for x in "nm"],
    *[click.option(f"--spec-ngram-map-{kind}-min-hits", type=click.IntRange(min=1),
                   default=getattr(_DEFAULTS, f"spec_ngram_map_{kind}_min_hits"), show_default=True,
                   help=f"ngram-map-{kind}: how many times the last tokens are found before they draft.")
      for kind in ("k", "k4v")],
    click.option("--spec-ngram-mod-n-match", type=click.IntRange(1, 1024), default=_DEFAULTS.spec_ngram_mod_n_match,
                 show_default=True, help="ngram-mod: how many of the last tokens are hashed to find the next."),
    click.option("--spec-ngram-mod-n-min", type=click.IntRange(0, 1024), default=_DEFAULTS.spec_ngram_mod_n_min,
                 show_default=True, help="ngram-mod: a shorter draft is not tried."),
    click.option("--spec-ngram-mod-n-max", type=click.IntRange(0, 1024), default=_DEFAULTS.spec_ngram_mod_n_max,
                 show_default=True, help="ngram-mod: tokens drafted a step, at most."),
    click.option("--draft-max", "--spec-draft-n-max", "--draft", "--draft-n", "draft_max", type=click.IntRange(min=0),
                 default=_DEFAULTS.draft_max, show_default=True,
                 help="The draft model's tokens drafted a step, at most (the n-gram kinds have their own)."),
    click.option("--draft-min", "--spec-draft-n-min", "--draft-n-min", "draft_min", type=click.IntRange(min=0),
                 default=_DEFAULTS.draft_min, show_default=True, help="A shorter draft is not tried."),
    click.option("-md", "--spec-draft-model", "--model-draft", "spec_draft_model", metavar="NAME|PATH",
                 help="Draft with this smaller model of the same vocabulary."),
    click.option("--draft-p-min", "--spec-draft-p-min", "draft_p_min", type=float, default=_DEFAULTS.draft_p_min, show_default=True,
                 help="The draft model stops drafting when its best token is less likely than this."),
    click.option("-lcs", "--lookup-cache-static", "lookup_cache_static", metavar="FILE",
                 help="ngram-cache: also draft from this file of 2-gram counts over a corpus (llama.cpp's "
                      "llama-lookup-create writes it; llogos lookup-create too). Read only."),
    click.option("-lcd", "--lookup-cache-dynamic", "lookup_cache_dynamic", metavar="FILE",
                 help="ngram-cache: also draft from this file of 1-4-gram counts from earlier runs (llama.cpp's "
                      "layout), read if it exists; the n-grams of each finished request are written back to it."),
]

speculation_options = _grouped(_SPECULATION, SpecParams, "speculation")
