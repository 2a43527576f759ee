"""Command-line options shared by `generate` and `chat`, and the objects built from them."""

import dataclasses
import functools
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from llogos_cli.backends import BACKENDS, CACHE_TYPES, DEFAULT_CACHE_TYPE
from llogos_cli.backends.cpu.cpu_threads import available_cores
from llogos_cli.cli.text_input import read_file, read_stdin
from llogos_cli.engine.conversation import TemplateChoice
from llogos_cli.engine.grammar import Grammar
from llogos_cli.engine.sampling import DRAW_SEED, SamplingOverrides
from llogos_cli.errors import LlogosError
from llogos_cli.model.loader import LoadOptions
from llogos_cli.model.memory import PREFILL_BATCH
from llogos_cli.tokenizer import chat_template


def _random_seed(ctx, param, seed: int | None) -> int | None:
    return None if seed == DRAW_SEED else seed


def _sampler_names(ctx, param, value: str | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(name for name in value.split(";") if name)


def _breakers(ctx, param, values: tuple[str, ...]) -> tuple[str, ...] | None:
    """llama.cpp's rule: the first breaker given replaces the defaults, and "none" clears those before it."""
    if not values:
        return None
    kept: list[str] = []
    for value in values:
        kept = [] if value == "none" else [*kept, value]
    return tuple(kept)


def _logit_biases(ctx, param, values: tuple[str, ...]) -> tuple[tuple[int, float], ...] | None:
    """-l TOKEN_ID(+|-)BIAS, as llama.cpp reads it: 15043+1, 15043-1.5, 15043-inf (banned)."""
    biases = []
    for value in values:
        match = re.fullmatch(r"\s*(\d+)\s*([+-])\s*(\S+)\s*", value)
        try:
            biases.append((int(match[1]), float(match[2] + match[3])))
        except (TypeError, ValueError):
            raise click.BadParameter(f"'{value}' is not TOKEN_ID+BIAS or TOKEN_ID-BIAS (e.g. 15043+1, 15043-inf)",
                                     param_hint="-l/--logit-bias") from None
    return tuple(biases) or None


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
    click.option("--typical", "--typical-p", "typical_p", type=float,
                 help="Locally typical sampling: keep the tokens nearest the expected surprise up to this "
                      "total probability; 1 disables. [default: 1.0]"),
    click.option("--top-nsigma", "--top-n-sigma", "top_n_sigma", type=float,
                 help="Keep tokens within N standard deviations of the best logit; -1 disables. [default: -1]"),
    click.option("--xtc-probability", type=float,
                 help="XTC: how often to drop the likeliest tokens but one; 0 disables. [default: 0]"),
    click.option("--xtc-threshold", type=float,
                 help="XTC: the probability a token needs to be dropped; above 0.5 disables. [default: 0.1]"),
    click.option("--mirostat", type=int, help="Mirostat sampling instead of the sampler chain "
                 "(1: Mirostat, 2: Mirostat 2.0; top-k, top-p, typical and penalties are then unused); 0 disables. [default: 0]"),
    click.option("--mirostat-lr", "mirostat_eta", type=float, help="Mirostat's learning rate, eta. [default: 0.1]"),
    click.option("--mirostat-ent", "mirostat_tau", type=float, help="Mirostat's target entropy, tau. [default: 5.0]"),
    click.option("--dry-multiplier", type=float, help="DRY: penalise tokens that extend a repeat; 0 disables. [default: 0]"),
    click.option("--dry-base", type=float, help="DRY: the penalty grows by this factor per repeated token. [default: 1.75]"),
    click.option("--dry-allowed-length", type=int, help="DRY: repeats this long go unpenalised. [default: 2]"),
    click.option("--dry-penalty-last-n", type=int, help="DRY: how many recent tokens it looks at; -1 = context, "
                 "0 disables. [default: -1]"),
    click.option("--dry-sequence-breaker", "dry_sequence_breakers", multiple=True, callback=_breakers, metavar="TEXT",
                 help="DRY: a repeat never reaches back past this text. Repeatable; replaces the defaults "
                      "('\\n', ':', '\"', '*'); 'none' for none."),
    click.option("--min-keep", type=int, help="Top-p, min-p, typical and XTC keep at least N tokens. [default: 0]"),
    click.option("--samplers", callback=_sampler_names, metavar="NAMES", help="The samplers in order, separated by "
                 "';'. [default: penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature]"),
    click.option("--sampling-seq", "--sampler-seq", "sampling_seq", metavar="LETTERS",
                 help="The samplers' order in letters (e d s k y p m x t). [default: edskypmxt]"),
    click.option("-l", "--logit-bias", "logit_bias", multiple=True, callback=_logit_biases, metavar="TOKEN_ID(+|-)BIAS",
                 help="Add BIAS to a token's logit, e.g. 15043+1 or 15043-1; 15043-inf bans it. Repeatable."),
]

CPU_WEIGHTS = ("auto", "quantized", "f32")


def _all_cores(ctx, param, threads: int) -> int:
    return available_cores() if threads == -1 else threads


def _gpu_layers(ctx, param, value: str | None) -> int | str | None:
    """-ngl as llama.cpp reads it: a layer count, auto or all (-1 is auto there too)."""
    if value is None or value in ("auto", "all"):
        return value
    try:
        layers = int(value)
    except ValueError:
        raise click.BadParameter(f"'{value}' is not a layer count, auto or all") from None
    if layers < -1:
        raise click.BadParameter(f"{layers} is not a layer count, auto (-1) or all")
    return "auto" if layers == -1 else layers


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
    click.option("--cache-type-k", type=click.Choice(CACHE_TYPES), help="KV cache type for keys, on either "
                 f"backend (f32: exact float32 keys at twice the memory). [default: {DEFAULT_CACHE_TYPE}]"),
    click.option("--cache-type-v", type=click.Choice(CACHE_TYPES), help="KV cache type for values, on either "
                 f"backend (f32: exact float32 values at twice the memory). [default: {DEFAULT_CACHE_TYPE}]"),
    click.option("-t", "--threads", type=click.IntRange(min=-1), default=0, callback=_all_cores, help="Threads for "
                 "generating (steps of one token); 0 = auto: the cores other processes leave free, looked at again "
                 "every few seconds; -1 = every core, as in llama.cpp. [default: 0]"),
    click.option("-tb", "--threads-batch", type=click.IntRange(min=-1), default=0, callback=_all_cores,
                 help="Threads for prompts and batches of sequences; 0 = auto, -1 = every core. [default: 0]"),
    click.option("-ngl", "--gpu-layers", "--n-gpu-layers", "gpu_layers", metavar="N|auto|all", callback=_gpu_layers,
                 help="llama.cpp's offload: above 0 (or all) runs on the GPU when there is one, else on the CPU "
                 "with a note; 0 runs on the CPU; auto as --backend auto. A model runs whole on one device: "
                 "a count below its layers runs all of them on the GPU, and says so."),
    click.option("-fa", "--flash-attn", type=click.Choice(["on", "off", "auto"]), expose_value=False,
                 help="Accepted for llama.cpp's command lines: each backend has one attention kernel, which "
                 "on, off and auto all run."),
    click.option("--mlock", is_flag=True, help="Lock the loaded model in memory (never swapped out), as llama.cpp's."),
    click.option("--mmap/--no-mmap", default=True, show_default=True,
                 help="Map the model file into memory; --no-mmap reads it in whole instead, as llama.cpp's."),
    click.option("--offline", is_flag=True, expose_value=False, callback=_go_offline,
                 help="Never install a models.toml model on first use (as LLOGOS_OFFLINE=1)."),
]

_TEMPLATE = [
    click.option("--chat-template", metavar="NAME", help="A built-in chat template instead of the model's: "
                 f"{', '.join(chat_template.BUILTIN)}. [default: the GGUF's, else models.toml's]"),
    click.option("--chat-template-file", type=click.Path(path_type=Path, dir_okay=False),
                 help="Read the chat template (Jinja, as in HF tokenizer_config.json) from a file."),
    click.option("--jinja", is_flag=True, expose_value=False,
                 help="Accepted for llama.cpp's command lines: llogos renders every chat template with Jinja."),
]


# llama-server's name; "deepseek" is its name for what auto does with <think> models. The command
# takes it as split_reasoning: whether auto was chosen.
reasoning_option = click.option(
    "--reasoning-format", "split_reasoning", type=click.Choice(["auto", "none"]), default="auto", show_default=True,
    callback=lambda ctx, param, value: value == "auto",
    help="auto: a reply's reasoning (<think>...</think>, gpt-oss's analysis channel) apart from its answer; "
         "none: the reply's text as the model wrote it.")


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


def _grouped(options, record, keyword: str):
    """The options as one keyword argument of the command: `record` (a dataclass whose fields are the
    options' names) built from them, so that a command reads typed fields, not a dict of flags."""
    names = [f.name for f in dataclasses.fields(record)]

    def decorate(f):
        @functools.wraps(f)
        def command(**kwargs):
            kwargs[keyword] = record(**{name: kwargs.pop(name) for name in names})
            return f(**kwargs)
        return _apply(options)(command)
    return decorate


@dataclass(frozen=True, slots=True)
class GrammarFlags:
    json_schema: str | None = None
    json_schema_file: Path | None = None
    grammar: str | None = None
    grammar_file: Path | None = None

    def constraint(self) -> Grammar | None:
        """The constraint asked for, checked (a bad one fails here, before any loading)."""
        given = [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None]
        if len(given) > 1:
            names = " and ".join("--" + name.replace("_", "-") for name in given)
            raise LlogosError(f"give one of --json-schema, --json-schema-file, --grammar and --grammar-file, not {names}")
        if not given:
            return None
        name = given[0]
        value = getattr(self, name)
        text = value if not name.endswith("_file") else read_file(value, name.replace("_", " "))
        return Grammar.json_schema(text) if name.startswith("json_schema") else Grammar.gbnf(text)


def batch_options(f):
    """-b and llama.cpp's -ub as the one `batch_size` llogos has: the tokens of one engine step. llama.cpp
    computes a -b batch in -ub pieces, so the smaller of the two is what a step takes."""
    @functools.wraps(f)
    def command(batch_size: int, ubatch_size: int | None, **kwargs):
        return f(batch_size=min(batch_size, ubatch_size or batch_size), **kwargs)
    return _apply([
        click.option("-b", "--batch-size", type=click.IntRange(min=1), default=PREFILL_BATCH, show_default=True,
                     help="Tokens per step: one per decoding sequence, the rest for prompt chunks."),
        click.option("-ub", "--ubatch-size", type=click.IntRange(min=1),
                     help="llama.cpp's physical batch: a step takes at most this many tokens. [default: -b]"),
    ])(command)


# llama.cpp's --escape, on by default there: \n, \t, \xHH... in text typed on the command line.
escape_option = click.option("-e", "--escape/--no-escape", default=True,
                             help="Turn \\n, \\r, \\t, \\', \\\", \\\\ and \\xHH in -p text (and generate's --stop) "
                                  "into the characters they name, as llama.cpp does. [default: --escape]")


sampling_options = _grouped(_SAMPLING_OPTIONS, SamplingOverrides, "sampling")
model_options = _grouped(_MODEL, LoadOptions, "model")


def several_models(f):
    """model_options with -m repeatable (serve's router mode, as llama-server's): `model` has the first
    -m, `model_names` every one given."""
    grouped = _grouped([], LoadOptions, "model")(f)

    @functools.wraps(f)
    def command(model_name: tuple[str, ...], **kwargs):
        return grouped(model_name=model_name[0] if model_name else None, model_names=model_name, **kwargs)
    several = click.option("-m", "--model", "model_name", metavar="NAME|PATH", multiple=True,
                           help="A name from models.toml or a path to a .gguf file; given several times, "
                                "requests are routed by their model field. [default: models.toml's default]")
    return _apply([several, *_MODEL[1:]])(command)
template_options = _grouped(_TEMPLATE, TemplateChoice, "template")
grammar_options = _grouped(_GRAMMAR, GrammarFlags, "grammar")


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
