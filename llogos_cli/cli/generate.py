"""`llogos generate`: continue one prompt and stream the text to stdout."""

import dataclasses
import json
import sys
from pathlib import Path

import click

from llogos_cli.cli.group import cli
from llogos_cli.cli.options import (
    cache_types,
    chat_format,
    grammar,
    grammar_options,
    model_options,
    parse_token_list,
    read_prompt,
    sampling_options,
    sampling_params,
    template_options,
    threads,
)
from llogos_cli.cli.report import print_stats
from llogos_cli.console import err
from llogos_cli.engine.conversation import Message
from llogos_cli.engine.batch import Request, check_fits
from llogos_cli.engine.generation import Generation
from llogos_cli.engine.sampling import draw_seed
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.errors import LlogosError
from llogos_cli.model.loader import load, open_model


@cli.command()
@model_options
@click.option("-p", "--prompt", help="Prompt text; '-' reads stdin (as does piping with no -p/-f).")
@click.option("-f", "--file", type=click.Path(path_type=Path, dir_okay=False), help="Read the prompt from a file.")
@click.option("--tokens", help="The prompt as exact comma-separated token ids, e.g. 504,3575,282.")
@click.option("-n", "--n-predict", type=click.IntRange(min=-1), default=-1, show_default=True,
              help="Tokens to generate; -1 = until end of generation or a full context.")
@sampling_options
@grammar_options
@click.option("--stop", multiple=True, help="Stop when this text is generated (not printed). Repeatable.")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-generation tokens.")
@click.option("--echo", is_flag=True, help="Print the prompt before the generated text.")
@click.option("--special", is_flag=True, help="Print control tokens' text instead of hiding it.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per token on stdout, then a summary.")
@click.option("--logprobs", type=click.IntRange(min=0), default=0,
              help="With --json: the top N log-probabilities of each step, before sampling.")
@click.option("--stats", is_flag=True, help="Print llama.cpp-style timings to stderr.")
@click.option("--chat", is_flag=True, help="Send the prompt as a user message through the model's chat template.")
@template_options
@click.option("--print-prompt", is_flag=True, help="With --chat: print the templated prompt and exit.")
def generate(**o):
    """Continue a prompt and stream the continuation to stdout."""
    if o["tokens"] is not None and (o["prompt"] is not None or o["file"] is not None):
        raise LlogosError("--tokens replaces -p/-f; give only one of them")
    if o["logprobs"] and not o["as_json"]:
        raise LlogosError("--logprobs needs --json (log-probabilities are reported per token in JSON)")
    text = None if o["tokens"] is not None else read_prompt(o["prompt"], o["file"])
    if text is None and o["tokens"] is None:
        raise LlogosError("no prompt: give -p TEXT, -f FILE or --tokens IDS, or pipe text on stdin")
    if (o["chat_template"] or o["chat_template_file"] or o["print_prompt"]) and not o["chat"]:
        raise LlogosError("--chat-template, --chat-template-file and --print-prompt go with --chat")
    if o["chat"] and o["tokens"] is not None:
        raise LlogosError("--chat wraps prompt text in the chat template; it cannot take --tokens")
    constraint = grammar(o)   # a bad schema or grammar fails before the model is opened
    mf = open_model(o["model_name"])
    tok = mf.tokenizer
    params = sampling_params(o, mf.sampling_defaults)
    if params.seed is None:   # drawn here, so --stats can name it
        params = dataclasses.replace(params, seed=draw_seed())
    chat = chat_format(o, mf.file.meta, mf.entry, tok) if o["chat"] else None
    if chat:   # from here on the prompt is the templated text, BOS spelled out; --echo shows it too
        text = chat.text([Message("user", text)])
        if o["print_prompt"]:
            sys.stdout.write(text)
            return
    ids = (parse_token_list(o["tokens"]) if o["tokens"] is not None
           else tok.encode(text, add_bos=False if chat else None))
    bad = [i for i in ids if not 0 <= i < tok.n_vocab]
    if bad:
        raise LlogosError(f"token id {bad[0]} is out of range (the vocabulary has {tok.n_vocab} tokens)")
    if not ids:
        raise LlogosError("the prompt is empty after tokenization")
    n_ctx = mf.n_ctx(o["ctx_size"], o["allow_long_ctx"])
    check_fits(len(ids), n_ctx)   # before the weights load
    m = load(mf, o["backend"], o["cpu_weights"], n_ctx, cache_types(o), threads=threads(o))
    criteria = StopCriteria(o["n_predict"], tuple(o["stop"]) + (chat.stop_strings() if chat else ()),
                            o["ignore_eos"], chat.stop_ids() if chat else frozenset())
    gen = Generation.alone(m.model, tok, n_ctx, Request(0, ids, params, criteria, o["logprobs"], constraint,
                                                        o["special"]), cache_types(o))
    out = sys.stdout
    if o["echo"] and not o["as_json"]:
        out.write(text if text is not None else tok.decode(ids, special=o["special"]))
        out.flush()
    for t in gen:
        if o["as_json"]:
            record = {"id": t.id, "text": t.text}
            if t.logprobs is not None:
                record["logprobs"] = [[i, lp] for i, lp in t.logprobs]
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
        else:
            out.write(t.text)
        out.flush()
    if o["as_json"]:
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
    if o["stats"]:
        print_stats(m, gen.timings, None if params.greedy else params.seed)
