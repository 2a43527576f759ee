"""`llogos chat`: a conversation through the model's chat template, in a terminal or from a script."""

import sys
from pathlib import Path

import click

from llogos_cli.cli.group import cli
from llogos_cli.cli.options import (
    batch_options,
    drop_newline,
    escape_option,
    model_options,
    reasoning_option,
    sampling_options,
    template_options,
)
from llogos_cli.cli.repl import Repl, ReplyOutput, stream
from llogos_cli.cli.shift_options import context_shift_options
from llogos_cli.cli.spec_options import speculation_options
from llogos_cli.cli.text_input import read_file, read_stdin, unescape
from llogos_cli.console import err, notice, warn
from llogos_cli.engine.batch import BatchEngine
from llogos_cli.engine.chat import Chat
from llogos_cli.engine.conversation import Message, TemplateChoice, read_messages, with_system
from llogos_cli.engine.draft_model import load_draft_model
from llogos_cli.engine.sampling import SamplingOverrides
from llogos_cli.engine.speculation import SpecParams
from llogos_cli.errors import LlogosError
from llogos_cli.model.loader import LoadOptions
from llogos_cli.model.registry import ModelEntry

_FILE = click.Path(path_type=Path, dir_okay=False)
# GGUF `general.finetune` values that name a pretrained checkpoint: convert_hf_to_gguf takes the
# finetune from the model's name (Qwen3-0.6B-Base, gemma-3-1b-pt).
_BASE_FINETUNES = frozenset({"base", "pt", "pretrained"})


@cli.command()
@model_options
@click.option("-sys", "--system", help="System prompt.")
@click.option("-sys-file", "-sysf", "--system-file", type=_FILE, help="Read the system prompt from a file.")
@click.option("--messages", type=_FILE, help="Continue this conversation: a JSON list of {\"role\", "
              "\"content\"} messages (or {\"messages\": [...]}). Answers once and exits unless -i.")
@click.option("-i", "--interactive", is_flag=True, help="With --messages: go on chatting in the terminal.")
@click.option("-cnv", "--conversation", is_flag=True, expose_value=False,
              help="Accepted for llama.cpp's command lines: chat is always a conversation.")
@click.option("-p", "--prompt", help="The first message, answered before the conversation goes on (llama-cli's -p).")
@escape_option
@click.option("-st", "--single-turn", is_flag=True, help="Answer the first message and exit, as llama-cli's -st.")
@template_options
@click.option("--print-prompt", is_flag=True,
              help="Print the conversation as the model would read it (template applied) and exit.")
@click.option("-n", "--n-predict", type=click.IntRange(min=-1), default=-1, show_default=True,
              help="Most tokens per reply; -1 = until the end of the turn or a full context.")
@batch_options
@context_shift_options(on=True)
@sampling_options
@speculation_options
@reasoning_option
@click.option("--stats/--no-stats", help="Timings of each reply on stderr (/stats shows the last one).")
@click.option("--simple-io", is_flag=True, help="Plain terminal: no colours, no line editing.")
def chat(model: LoadOptions, sampling: SamplingOverrides, speculation: SpecParams, template: TemplateChoice, system,
         system_file, messages, interactive, prompt, escape, single_turn, print_prompt, n_predict, batch_size,
         split_reasoning, stats, simple_io, context_shift, keep):
    """Talk with a model through its chat template.

    On a terminal this opens a conversation (type /help in it). With a message piped on stdin, or
    with --messages, it writes one reply to stdout and exits.
    """
    if system is not None and system_file is not None:
        raise LlogosError("give the system prompt either with --system or with --system-file, not both")
    if interactive and not sys.stdin.isatty():
        raise LlogosError("-i/--interactive needs a terminal on stdin")
    if system_file is not None:
        system = drop_newline(read_file(system_file, "system prompt file"))
    conversation = with_system(read_messages(messages) if messages else [], system)
    if prompt is not None:   # -p, as llama-cli takes it: the message, not stdin's
        conversation.append(Message("user", unescape(prompt) if escape else prompt))
    in_terminal = sys.stdin.isatty() and (messages is None or interactive) and not single_turn
    if not in_terminal and prompt is None:
        conversation += _piped_message(required=messages is None)
    if print_prompt and ((in_terminal and prompt is None) or not conversation):
        raise LlogosError("--print-prompt needs a conversation: --messages FILE or a message on stdin")
    mf = model.open()
    fmt = template.format(mf)
    if print_prompt:
        sys.stdout.write(fmt.text(conversation))
        sys.stdout.flush()
        return
    name = mf.entry.name if mf.entry else mf.path.name
    if _base_model(mf.file.meta, mf.entry):
        warn(f"{name} is a base model, not tuned to chat: it continues the conversation as text, so its replies "
             "may be gibberish that runs on until the context fills (`llogos generate` suits it better)")
    n_ctx = model.n_ctx(mf)
    m = model.load(mf, n_ctx)
    # One slot that keeps its tokens for the next turn, and a prefix cache for /load and /clear.
    engine = BatchEngine(m.model, mf.tokenizer, 1, n_ctx, model.cache_types, batch_size, keep_slots=True,
                         speculation=speculation, draft_model=load_draft_model(speculation, model, m, n_ctx),
                         context_shift=context_shift, n_keep=keep)
    talk = Chat(fmt, engine, sampling.params(mf.sampling_defaults), n_predict, conversation, split_reasoning)
    if in_terminal:
        if simple_io:
            err.no_color = True
        notice(f"chatting with {name} (template: {fmt.template.origin}); /help for commands, Ctrl-D to leave")
        if prompt is not None:
            _answer(talk, stats)
        Repl(talk, simple_io, stats).run()
        return
    _answer(talk, stats)


def _answer(talk: Chat, stats: bool) -> None:
    """One reply to the conversation's last message, on stdout."""
    out = ReplyOutput()
    reply = talk.respond(out.answer, think=out.think)
    out.end()
    stream("\n")
    if stats:
        notice(reply.summary())


def _piped_message(required: bool) -> list[Message]:
    """The user message piped on stdin (one trailing newline dropped, as for prompts), if any."""
    text = "" if sys.stdin.isatty() else drop_newline(read_stdin("the message"))
    if text.strip():
        return [Message("user", text)]
    if required:
        raise LlogosError("no message on stdin: pipe one in, run in a terminal to chat, or give --messages FILE")
    return []


def _base_model(meta: dict, entry: ModelEntry | None) -> bool:
    """Whether models.toml or the GGUF's metadata says the model was not instruction-tuned."""
    return (entry is not None and entry.base) or str(meta.get("general.finetune", "")).lower() in _BASE_FINETUNES
