"""`llogos batch`: every prompt of a file through one running batch of -np slots."""

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

import click

from llogos_cli.cli.group import cli
from llogos_cli.cli.options import batch_options, model_options, reasoning_option, sampling_options, template_options
from llogos_cli.cli.spec_options import speculation_options
from llogos_cli.engine.conversation import TemplateChoice
from llogos_cli.engine.sampling import SamplingOverrides
from llogos_cli.engine.speculation import SpecParams
from llogos_cli.jobs.lines import Done, LineError, read_items
from llogos_cli.jobs.progress import Tally
from llogos_cli.jobs.ray_driver import CPUS_PER_WORKER, RayCluster, run_on_ray
from llogos_cli.jobs.results import Output, Writer, file_done
from llogos_cli.jobs.spec import JobSpec, set_up
from llogos_cli.model.loader import LoadOptions
from llogos_cli.console import err
from llogos_cli.engine.batch import BatchEngine, Request
from llogos_cli.engine.sampling import draw_seed
from llogos_cli.errors import LlogosError

_PATH = click.Path(path_type=Path, dir_okay=False, allow_dash=True)


@cli.command()
@model_options
@click.option("-i", "--input", "input_path", type=_PATH,
              help="JSON lines ({\"id\", \"prompt\" or \"messages\", overrides}) or plain text, one prompt a line; "
                   "'-' or a pipe reads stdin.")
@click.option("-o", "--output", type=click.Path(path_type=Path),
              help="Write results here as JSON lines (with --ray: a directory of them). [default: stdout]")
@click.option("-np", "--parallel", type=click.IntRange(min=1, max=256), default=8, show_default=True,
              help="Slots: prompts in flight at once.")
@batch_options
@click.option("-cb", "--cont-batching", is_flag=True, expose_value=False,
              help="Accepted for llama.cpp's command lines: prompts always join the running batch.")
@click.option("-n", "--n-predict", type=click.IntRange(min=-1), default=-1, show_default=True,
              help="Tokens to generate per prompt; -1 = until end of generation or a full context.")
@sampling_options
@speculation_options
@click.option("--stop", multiple=True, help="Stop a prompt when this text is generated. Repeatable.")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-generation tokens.")
@click.option("--logprobs", type=click.IntRange(min=0), default=0, help="Report the top N log-probabilities per token.")
@template_options
@reasoning_option
@click.option("--ordered", is_flag=True, help="Write results in input order (default: as each finishes).")
@click.option("--resume", is_flag=True, help="Skip the ids already in the output file and append the rest.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output file.")
@click.option("--ray", metavar="ADDRESS", help="Run across a Ray cluster, -o then naming a directory: auto (the "
              "cluster this machine is in), HOST:PORT, ray://HOST:10001, or local (start Ray here). "
              "Needs llogos[ray].")
@click.option("--workers", type=click.IntRange(min=1), help="Ray workers, each with one model and -np slots. "
              "[default: one per GPU, else one per --cpus-per-worker CPUs]")
@click.option("--cpus-per-worker", type=click.IntRange(min=1),
              help=f"CPUs each Ray worker takes on nodes without GPUs. [default: {CPUS_PER_WORKER}]")
def batch(model: LoadOptions, sampling: SamplingOverrides, speculation: SpecParams, template: TemplateChoice, input_path,
          output, parallel, batch_size, n_predict, stop, ignore_eos, logprobs, split_reasoning, ordered, resume,
          overwrite, ray, workers, cpus_per_worker):
    """Run many prompts with up to -np at once; one JSON result per prompt."""
    if ray is None and (workers or cpus_per_worker):
        raise LlogosError("--workers and --cpus-per-worker size a Ray run: add --ray")
    spec = JobSpec(model, sampling, template, parallel, batch_size, n_predict, tuple(stop), ignore_eos, logprobs,
                   split_reasoning, speculation)
    out = Output(output, resume, overwrite, ordered)
    if ray is not None:
        with _lines(_input(input_path)) as lines:
            failed = run_on_ray(spec, RayCluster(ray, workers, cpus_per_worker), out, lines, draw_seed())
    else:
        failed = _here(spec, out, input_path)
    if failed:
        raise LlogosError(f"{failed} prompt{'s' if failed > 1 else ''} failed (see the \"error\" lines of the output)")


def _here(spec: JobSpec, out: Output, input_path: Path | None) -> int:
    out_path = out.path
    if out.resume and out_path is None:
        raise LlogosError("--resume continues an output file: give it with -o")
    if out_path is not None and out_path.is_dir():
        raise LlogosError(f"{out_path} is a directory: give -o a file (a directory of results is for --ray)")
    if out_path is not None and out_path.exists() and out_path.stat().st_size and not (out.resume or out.overwrite):
        raise LlogosError(f"{out_path} already holds results: add --resume to continue it or --overwrite to replace it")
    source = _input(input_path)
    done = file_done(out_path) if out.resume else Done()
    total = _count_lines(source) if isinstance(source, Path) else None
    setup = set_up(spec, draw_seed())
    err.print(f"[dim]{setup.description}{_resuming(done)}[/dim]", soft_wrap=True)
    tally = Tally(None if total is None else max(total - len(done), 0))
    try:
        with _lines(source) as lines:
            writer = Writer(out_path, out.resume, out.ordered)
            try:
                items = read_items(lines, setup.tokenizer, setup.chat, setup.defaults, done)
                return _run(setup.engine, items, writer, tally)
            finally:
                writer.close()
    except KeyboardInterrupt:
        where = f" to {out_path}; the same command with --resume continues" if out_path else ""
        err.print(f"[dim]interrupted: {tally.done} results ({tally.failed} failed) written{where}[/dim]",
                  soft_wrap=True)
        raise click.Abort from None   # reported: exit 130 without another line


def _resuming(done: Done) -> str:
    if not done and not done.failed:
        return ""
    again = f", running the {done.failed} that failed again" if done.failed else ""
    return f"; resuming after {len(done)} results{again}"


def _run(engine: BatchEngine, items, writer: Writer, tally: Tally) -> int:
    """Feed the engine, write every result and error; the number of failures."""
    in_flight: dict[str, tuple[int, int]] = {}   # request id -> its place in the input and its line number

    def requests():
        for place, (line, item) in enumerate(items):
            if isinstance(item, LineError):
                writer.write(place, item.as_dict())
                tally.add(failed=True)
                continue
            in_flight[_key(item)] = place, line
            yield item

    prompt = cached = 0
    with tally:
        for result in engine.generate(requests()):
            place, line = in_flight.pop(_key(result))
            # A prompt the engine refuses (too long for -c, say) is reported as a bad line is.
            record = result.as_dict() if result.error is None else LineError(result.id, line, result.error).as_dict()
            writer.write(place, record)
            tally.add(len(result.tokens), result.error is not None)
            prompt, cached = prompt + result.timings.prompt_n + result.prefix_hit, cached + result.prefix_hit
    tally.summary()
    if cached:
        err.print(f"[dim]prefix cache: {cached} of {prompt} prompt tokens reused ({cached / prompt:.0%})[/dim]")
    return tally.failed


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


@contextmanager
def _lines(source: Path | None) -> Iterator[TextIO]:
    """The input's lines: the file, or stdin."""
    if source is None:
        yield sys.stdin
        return
    with open(source, encoding="utf-8", errors="replace") as f:
        yield f


def _count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())
