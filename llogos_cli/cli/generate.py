"""`llogos generate`: continue one prompt and stream the text to stdout."""

import dataclasses
import json
import sys
from pathlib import Path

import click

from llogos_cli.cli.group import cli
from llogos_cli.cli.options import (
    GrammarFlags,
    batch_options,
    escape_option,
    grammar_options,
    model_options,
    parse_token_list,
    read_prompt,
    sampling_options,
    template_options,
)
from llogos_cli.cli.report import print_stats
from llogos_cli.cli.shift_options import context_shift_options
from llogos_cli.cli.spec_options import speculation_options
from llogos_cli.cli.text_input import unescape
from llogos_cli.console import err
from llogos_cli.engine.batch import Request, check_fits
from llogos_cli.engine.conversation import Message, TemplateChoice
from llogos_cli.engine.generation import Generation
from llogos_cli.engine.draft_model import load_draft_model
from llogos_cli.engine.sampling import SamplingOverrides, draw_seed
from llogos_cli.engine.speculation import SpecParams
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.errors import LlogosError
from llogos_cli.model.loader import LoadOptions


@cli.command()
@click.argument("words", nargs=-1, metavar="[PROMPT WORDS]...")
@model_options
@click.option("-p", "--prompt", help="Prompt text; '-' reads stdin (as does piping with no -p/-f).")
@escape_option
@click.option("-f", "--file", type=click.Path(path_type=Path, dir_okay=False), help="Read the prompt from a file.")
@click.option("--tokens", help="The prompt as exact comma-separated token ids, e.g. 504,3575,282.")
@click.option("-n", "--n-predict", type=click.IntRange(min=-1), default=-1, show_default=True,
              help="Tokens to generate; -1 = until end of generation or a full context.")
@batch_options
@context_shift_options(on=True)
@sampling_options
@speculation_options
@grammar_options
@click.option("--stop", multiple=True, help="Stop when this text is generated (not printed). Repeatable.")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-generation tokens.")
@click.option("--echo/--no-echo", help="Print the prompt before the generated text.")
@click.option("--special", is_flag=True, help="Print control tokens' text instead of hiding it.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per token on stdout, then a summary.")
@click.option("--logprobs", type=click.IntRange(min=0), default=0,
              help="With --json: the top N log-probabilities of each step, before sampling.")
@click.option("--stats/--no-stats", help="Print llama.cpp-style timings to stderr.")
@click.option("--chat", is_flag=True, help="Send the prompt as a user message through the model's chat template.")
@click.option("-no-cnv", "--no-conversation", is_flag=True, expose_value=False,
              help="Accepted for llama.cpp's command lines: generate never converses (--chat wraps one prompt).")
@template_options
@click.option("--print-prompt", is_flag=True, help="With --chat: print the templated prompt and exit.")
def generate(model: LoadOptions, sampling: SamplingOverrides, speculation: SpecParams, grammar: GrammarFlags,
             template: TemplateChoice, words, prompt, escape, file, tokens, n_predict, batch_size, stop, ignore_eos,
             echo, special, as_json, logprobs, stats, chat, print_prompt, context_shift, keep):
    """Continue a prompt and stream the continuation to stdout. The prompt may also follow the options
    as words, joined by spaces as llama-simple takes it (no escapes)."""
    if tokens is not None and (prompt is not None or file is not None):
        raise LlogosError("--tokens replaces -p/-f; give only one of them")
    if logprobs and not as_json:
        raise LlogosError("--logprobs needs --json (log-probabilities are reported per token in JSON)")
    if escape:
        prompt = None if prompt is None else prompt if prompt == "-" else unescape(prompt)
        stop = [unescape(s) for s in stop]
    if words:
        if prompt is not None or file is not None or tokens is not None:
            raise LlogosError(f"give the prompt once: as words ('{' '.join(words)}') or with -p, -f or --tokens")
        prompt = " ".join(words)
    text = None if tokens is not None else read_prompt(prompt, file)
    if text is None and tokens is None:
        raise LlogosError("no prompt: give -p TEXT, -f FILE or --tokens IDS, or pipe text on stdin")
    if (template.given or print_prompt) and not chat:
        raise LlogosError("--chat-template, --chat-template-file and --print-prompt go with --chat")
    if chat and tokens is not None:
        raise LlogosError("--chat wraps prompt text in the chat template; it cannot take --tokens")
    constraint = grammar.constraint()   # a bad schema or grammar fails before the model is opened
    mf = model.open()
    tok = mf.tokenizer
    params = sampling.params(mf.sampling_defaults)
    if params.seed is None:   # drawn here, so --stats can name it
        params = dataclasses.replace(params, seed=draw_seed())
    fmt = template.format(mf) if chat else None
    if fmt:   # from here on the prompt is the templated text, BOS spelled out; --echo shows it too
        text = fmt.text([Message("user", text)])
        if print_prompt:
            sys.stdout.write(text)
            return
    ids = (parse_token_list(tokens) if tokens is not None
           else tok.encode(text, add_bos=False if fmt else None))
    bad = [i for i in ids if not 0 <= i < tok.n_vocab]
    if bad:
        raise LlogosError(f"token id {bad[0]} is out of range (the vocabulary has {tok.n_vocab} tokens)")
    if not ids:
        raise LlogosError("the prompt is empty after tokenization")
    n_ctx = model.n_ctx(mf)
    check_fits(len(ids), n_ctx)   # before the weights load
    m = model.load(mf, n_ctx)
    criteria = StopCriteria(n_predict, tuple(stop) + (fmt.stop_strings() if fmt else ()),
                            ignore_eos, fmt.stop_ids() if fmt else frozenset())
    gen = Generation.alone(m.model, tok, n_ctx, Request(0, ids, params, criteria, logprobs, constraint, special),
                           model.cache_types, batch_size, speculation, load_draft_model(speculation, model, m, n_ctx),
                           context_shift, keep)
    out = sys.stdout
    if echo and not as_json:
        out.write(text if text is not None else tok.decode(ids, special=special))
        out.flush()
    for t in gen:
        if as_json:
            record = {"id": t.id, "text": t.text}
            if t.logprobs is not None:
                record["logprobs"] = [[i, lp] for i, lp in t.logprobs]
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
        else:
            out.write(t.text)
        out.flush()
    if as_json:
        done = {"done": True, "stop": gen.stop, "timings": gen.timings.as_dict()}
        if gen.tail:
            done["text"] = gen.tail
        out.write(json.dumps(done, ensure_ascii=False) + "\n")
    else:
        out.write(gen.tail)
        if out.isatty():   # leave the shell prompt on a line of its own; pipes get the text as is
            out.write("\n")
        if gen.context_full:
            err.print(f"[dim]stopped: the context of {n_ctx} tokens is full[/dim]")
    out.flush()
    if stats:
        print_stats(m, gen.timings, None if params.greedy else params.seed)
