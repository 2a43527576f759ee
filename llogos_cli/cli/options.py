"""Command-line options shared by `generate` and `chat`, and the objects built from them."""

import os
import sys
from pathlib import Path

import click

from llogos_cli.backends import BACKENDS, CACHE_TYPES
from llogos_cli.cli.text_input import read_file, read_stdin
from llogos_cli.engine.conversation import ChatFormat
from llogos_cli.engine.grammar import Grammar
from llogos_cli.engine.sampling import DRAW_SEED, SamplingParams
from llogos_cli.errors import LlogosError
from llogos_cli.model.registry import ModelEntry
from llogos_cli.tokenizer import chat_template
from llogos_cli.tokenizer.tokenizer import Tokenizer


def _random_seed(ctx, param, seed: int | None) -> int | None:
    return None if seed == DRAW_SEED else seed


# Sampling flags, each with llama.cpp's name and meaning. Defaults live in SamplingParams so a
# model's [models.X.sampling] table in models.toml can sit between them and the command line.
_SAMPLING_OPTIONS = [
    click.option("--temp", type=float, help="Temperature; 0 samples greedily. [default: 0.8]"),
    click.option("--top-k", type=int, help="Keep the K most likely tokens; 0 keeps all. [default: 40]"),
    click.option("--top-p", type=float, help="Keep the smallest set with this total probability. [default: 0.95]"),
    click.option("--min-p", type=float, help="Drop tokens below this fraction of the best one's probability. [default: 0.05]"),
    click.option("--repeat-penalty", type=float, help="Penalise recently seen tokens; 1 disables. [default: 1.0]"),
    click.option("--repeat-last-n", type=int, help="How many recent tokens the penalties look at; -1 = context. [default: 64]"),
    click.option("--presence-penalty", type=float, help="Subtract this from seen tokens' logits. [default: 0]"),
    click.option("--frequency-penalty", type=float, help="Subtract this times each token's count. [default: 0]"),
    click.option("--seed", type=int, callback=_random_seed,
                 help="Random seed; the same seed gives the same output; -1 draws one. [default: random]"),
]

CPU_WEIGHTS = ("auto", "quantized", "f32")


def _go_offline(ctx, param, on: bool) -> None:
    # The registry reads the environment, so the flag reaches it without threading through every command.
    if on:
        os.environ["LLOGOS_OFFLINE"] = "1"


# -m alone: tokenize and info need the model but none of the loading options below.
model_name_option = click.option("-m", "--model", "model_name", metavar="NAME|PATH",
                                 help="A name from models.toml or a path to a .gguf file. "
                                      "[default: models.toml's default]")

_MODEL = [
    model_name_option,
    click.option("-c", "--ctx-size", type=click.IntRange(min=0), help="Context size in tokens; 0 = the model's trained context. "
                 "[default: trained context, at most 4096]"),
    click.option("--allow-long-ctx", is_flag=True, help="Keep a -c beyond the model's trained context "
                 "(else it is capped there); output may degrade past it."),
    click.option("--backend", type=click.Choice(BACKENDS), default="auto", show_default=True,
                 help="Where to run: cpu (NumPy), cuda (CuPy), auto (cuda when a GPU is visible)."),
    click.option("--cpu-weights", type=click.Choice(CPU_WEIGHTS), default="auto", show_default=True,
                 help="How the CPU holds weights: quantized (read in place from the file, memory = file "
                 "size), f32 (expanded, 4 bytes a weight), auto (f32 only for a small model that fits easily)."),
    click.option("--cache-type-k", type=click.Choice(CACHE_TYPES), help="KV cache type for keys. "
                 "[default: f32 on cpu, f16 on cuda]"),
    click.option("--cache-type-v", type=click.Choice(CACHE_TYPES), help="KV cache type for values. "
                 "[default: f32 on cpu, f16 on cuda]"),
    click.option("-t", "--threads", type=click.IntRange(min=0), default=0, help="Threads for generating "
                 "(steps of one token); 0 = auto: the cores other processes leave free, looked at again "
                 "every few seconds. [default: 0]"),
    click.option("-tb", "--threads-batch", type=click.IntRange(min=0), default=0,
                 help="Threads for prompts and batches of sequences; 0 = auto. [default: 0]"),
    click.option("--offline", is_flag=True, expose_value=False, callback=_go_offline,
                 help="Never install a models.toml model on first use (as LLOGOS_OFFLINE=1)."),
]

_TEMPLATE = [
    click.option("--chat-template", metavar="NAME", help="A built-in chat template instead of the model's: "
                 f"{', '.join(chat_template.BUILTIN)}. [default: the GGUF's, else models.toml's]"),
    click.option("--chat-template-file", type=click.Path(path_type=Path, dir_okay=False),
                 help="Read the chat template (Jinja, as in HF tokenizer_config.json) from a file."),
]


# Structured output, with llama.cpp's names: one of a JSON Schema or a GBNF grammar, inline or from a file.
_GRAMMAR = [
    click.option("-j", "--json-schema", metavar="SCHEMA", help="Constrain the output to JSON valid under "
                 "this JSON Schema, e.g. '{\"type\": \"object\"}' ('{}': any JSON)."),
    click.option("--json-schema-file", type=click.Path(path_type=Path, dir_okay=False),
                 help="Read the JSON Schema from a file."),
    click.option("--grammar", metavar="GBNF", help="Constrain the output to this grammar "
                 "(llama.cpp's GBNF, e.g. 'root ::= \"yes\" | \"no\"')."),
    click.option("--grammar-file", type=click.Path(path_type=Path, dir_okay=False),
                 help="Read the GBNF grammar from a file."),
]


def _apply(options):
    def decorate(f):
        for option in reversed(options):
            f = option(f)
        return f
    return decorate


sampling_options = _apply(_SAMPLING_OPTIONS)
model_options = _apply(_MODEL)
template_options = _apply(_TEMPLATE)
grammar_options = _apply(_GRAMMAR)


def grammar(opts: dict) -> Grammar | None:
    """The constraint the grammar options ask for, checked (a bad one fails here, before any loading)."""
    names = ("json_schema", "json_schema_file", "grammar", "grammar_file")
    given = [name for name in names if opts.get(name) is not None]
    if len(given) > 1:
        names = " and ".join("--" + name.replace("_", "-") for name in given)
        raise LlogosError(f"give one of --json-schema, --json-schema-file, --grammar and --grammar-file, not {names}")
    if not given:
        return None
    name = given[0]
    text = opts[name] if not name.endswith("_file") else read_file(opts[name], name.replace("_", " "))
    return Grammar.json_schema(text) if name.startswith("json_schema") else Grammar.gbnf(text)


def sampling_params(opts: dict, model_defaults: dict) -> SamplingParams:
    values = {}
    for name in SamplingParams.__slots__:
        if opts.get(name) is not None:
            values[name] = opts[name]
        elif name in model_defaults:
            values[name] = model_defaults[name]
    try:
        return SamplingParams(**values)
    except TypeError as e:
        raise LlogosError(f"bad sampling default in models.toml: {e}") from None


def cache_types(opts: dict) -> tuple[str | None, str | None]:
    """--cache-type-k/-v; None leaves the choice to the backend."""
    return opts.get("cache_type_k"), opts.get("cache_type_v")


def threads(opts: dict) -> tuple[int, int]:
    """-t and -tb (0: auto)."""
    return opts.get("threads") or 0, opts.get("threads_batch") or 0


def read_prompt(prompt: str | None, file: Path | None) -> str | None:
    """The prompt from -p, -f, or piped stdin (-p - reads stdin too). One trailing newline of a
    file or of stdin is dropped, as llama.cpp does for -f, so `echo text |` means "text"."""
    if prompt is not None and file is not None:
        raise LlogosError("give the prompt either with -p or with -f, not both")
    if file is not None:
        return drop_newline(read_file(file, "prompt file"))
    if prompt == "-" or (prompt is None and not sys.stdin.isatty()):
        text = read_stdin("the prompt")
        if not text.strip():
            raise LlogosError("the prompt on stdin is empty")
        return drop_newline(text)
    return prompt


def drop_newline(text: str) -> str:
    return text[:-1] if text.endswith("\n") else text


def parse_token_list(value: str) -> list[int]:
    try:
        ids = [int(part) for part in value.replace(" ", "").split(",") if part]
    except ValueError:
        raise LlogosError(f"--tokens takes comma-separated token ids, got '{value}'") from None
    if not ids:
        raise LlogosError("--tokens is empty")
    return ids


def chat_format(opts: dict, meta: dict, entry: ModelEntry | None, tokenizer: Tokenizer) -> ChatFormat:
    template = chat_template.resolve(opts.get("chat_template_file"), opts.get("chat_template"),
                                     meta.get("tokenizer.chat_template"), entry.chat_template if entry else None)
    if template is None:
        raise LlogosError("the model has no chat template (none in the GGUF or models.toml); choose one with "
                          f"--chat-template NAME ({', '.join(chat_template.BUILTIN)}) or --chat-template-file FILE")
    return ChatFormat(template, tokenizer)


def chat_format_or_none(opts: dict, meta: dict, entry: ModelEntry | None, tokenizer: Tokenizer) -> ChatFormat | None:
    """The chat format for messages, where a model without a template can still run plain prompts:
    None unless a template was asked for on the command line."""
    try:
        return chat_format(opts, meta, entry, tokenizer)
    except LlogosError:
        if opts.get("chat_template") or opts.get("chat_template_file"):
            raise
        return None
