"""`llogos batch`: every prompt of a file through one running batch of -np slots."""

import sys
import time
from pathlib import Path

import click
import numpy as np
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from llogos_cli.cli.batch_input import Defaults, LineError, read_items
from llogos_cli.cli.batch_output import Writer, done_ids
from llogos_cli.cli.group import cli
from llogos_cli.cli.options import (
    cache_types,
    chat_format_or_none,
    model_options,
    sampling_options,
    sampling_params,
    template_options,
)
from llogos_cli.console import err
from llogos_cli.engine.batch import BatchEngine, Request
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.errors import LlogosError
from llogos_cli.model.loader import load, open_model

_PATH = click.Path(path_type=Path, dir_okay=False, allow_dash=True)


@cli.command()
@model_options
@click.option("-i", "--input", "input_path", type=_PATH,
              help="JSON lines ({\"id\", \"prompt\" or \"messages\", overrides}) or plain text, one prompt a line; "
                   "'-' or a pipe reads stdin.")
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False),
              help="Write results here as JSON lines. [default: stdout]")
@click.option("-np", "--parallel", type=click.IntRange(min=1, max=256), default=8, show_default=True,
              help="Slots: prompts in flight at once.")
@click.option("-b", "--batch-size", type=click.IntRange(min=1), default=512, show_default=True,
              help="Tokens per step: one per decoding row, the rest for prompt chunks.")
@click.option("-n", "--n-predict", type=click.IntRange(min=-1), default=-1, show_default=True,
              help="Tokens to generate per prompt; -1 = until end of generation or a full context.")
@sampling_options
@click.option("--stop", multiple=True, help="Stop a prompt when this text is generated. Repeatable.")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-generation tokens.")
@click.option("--logprobs", type=click.IntRange(min=0), default=0, help="Report the top N log-probabilities per token.")
@template_options
@click.option("--ordered", is_flag=True, help="Write results in input order (default: as each finishes).")
@click.option("--resume", is_flag=True, help="Skip the ids already in the output file and append the rest.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output file.")
def batch(**o):
    """Run many prompts with up to -np at once; one JSON result per prompt."""
    out_path = o["output"]
    if o["resume"] and out_path is None:
        raise LlogosError("--resume continues an output file: give it with -o")
    if out_path is not None and out_path.exists() and out_path.stat().st_size and not (o["resume"] or o["overwrite"]):
        raise LlogosError(f"{out_path} already holds results: add --resume to continue it or --overwrite to replace it")
    source = _input(o["input_path"])
    mf = open_model(o["model_name"])
    tok = mf.tokenizer
    params = sampling_params(o, mf.sampling_defaults)
    chat = chat_format_or_none(o, mf.file.meta, mf.entry, tok)
    defaults = Defaults(params, StopCriteria(o["n_predict"], tuple(o["stop"]), o["ignore_eos"]), o["logprobs"],
                        params.seed if params.seed is not None else int(np.random.SeedSequence().entropy % 2 ** 32))
    skip = done_ids(out_path) if o["resume"] else set()
    total = _count_lines(source) if isinstance(source, Path) else None
    n_ctx = mf.n_ctx(o["ctx_size"], o["allow_long_ctx"])
    m = load(mf, o["backend"], o["cpu_weights"], n_ctx, cache_types(o), o["parallel"])
    engine = BatchEngine(m.model, tok, o["parallel"], n_ctx, cache_types(o), o["batch_size"])
    err.print(f"[dim]{o['parallel']} slots of {n_ctx} tokens on {m.model.b.name}"
              f"{f'; resuming after {len(skip)} results' if skip else ''}[/dim]")
    writer = Writer(out_path, o["resume"], o["ordered"])
    lines = open(source, encoding="utf-8", errors="replace") if isinstance(source, Path) else sys.stdin
    try:
        failed = _run(engine, read_items(lines, tok, chat, defaults, skip), writer,
                      None if total is None else max(total - len(skip), 0))
    finally:
        writer.close()
        if lines is not sys.stdin:
            lines.close()
    if failed:
        raise LlogosError(f"{failed} prompt{'s' if failed > 1 else ''} failed (see the \"error\" lines of the output)")


def _run(engine: BatchEngine, items, writer: Writer, total: int | None) -> int:
    """Feed the engine, write every result and error; the number of failures."""
    number: dict[str, int] = {}   # in-flight request id -> its place in the input
    counter = {"items": 0, "failed": 0, "tokens": 0}

    def requests():
        for item in items:
            place = counter["items"]
            counter["items"] += 1
            if isinstance(item, LineError):
                counter["failed"] += 1
                writer.write(place, item.as_dict())
                progress.advance(task)
                continue
            number[_key(item)] = place
            yield item

    t0 = time.perf_counter()
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                  console=err, transient=False, disable=not err.is_terminal) as progress:
        task = progress.add_task("batch", total=total, rate="")
        for result in engine.generate(requests()):
            if result.error is not None:
                counter["failed"] += 1
            counter["tokens"] += len(result.tokens)
            writer.write(number.pop(_key(result)), result.as_dict())
            rate = counter["tokens"] / max(time.perf_counter() - t0, 1e-9)
            progress.update(task, advance=1, rate=f"{rate:7.1f} tok/s")
    elapsed = time.perf_counter() - t0
    err.print(f"[dim]{counter['items']} prompts ({counter['failed']} failed), {counter['tokens']} tokens generated "
              f"in {elapsed:.1f} s: {counter['tokens'] / max(elapsed, 1e-9):.1f} tok/s[/dim]")
    return counter["failed"]


def _key(item: Request) -> str:
    return repr(item.id)


def _input(path: Path | None) -> Path | None:
    """The input file, or None for stdin (with -i - or a pipe)."""
    if path is not None and str(path) != "-":
        if not path.is_file():
            raise LlogosError(f"cannot read {path}: no such file")
        return path
    if path is None and sys.stdin.isatty():
        raise LlogosError("no input: give -i FILE, or pipe prompts on stdin")
    return None


def _count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())
