"""`llogos batch --ray`: a prompt file across a Ray cluster, one loaded model per worker.

The driver reads the input once, as one machine does: line numbers, ids, repeated ids and
--resume need every line seen in one place (and so the input need not sit on a filesystem the
nodes share). The parsed lines go to Ray Data in blocks, one per worker call, and Ray Data feeds
them through a pool of BatchWorker actors, each holding one model and one continuous-batching
engine of -np slots. Only the driver writes, into a new part file of the output directory: a batch
whose worker dies is run again by a restarted worker (Ray's actor restarts and task retries) and
only its one finished run comes back, so every id lands exactly once.

Ray is imported here only when --ray is given; the rest of llogos never imports it.
"""

import json
import logging
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from llogos_cli.jobs.lines import Done, LineError, read_lines
from llogos_cli.jobs.results import Output, Writer, folder_done, new_part, parts
from llogos_cli.jobs.progress import Tally
from llogos_cli.jobs.ray_worker import BatchWorker
from llogos_cli.jobs.spec import JobSpec
from llogos_cli.console import err
from llogos_cli.errors import LlogosError

CPUS_PER_WORKER = 4      # --cpus-per-worker's default
# A call's engine drains before it returns, leaving slots idle at its end, so calls are long
# (up to this many prompts per slot); a small input is still cut so that every worker gets a share.
PROMPTS_PER_SLOT = 16
CALLS_PER_WORKER = 2
_THREADS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


@dataclass(frozen=True, slots=True)
class RayCluster:
    """--ray and the flags that size its workers."""
    address: str                       # auto, local, HOST:PORT or ray://HOST:PORT
    workers: int | None = None         # None: one per GPU, else one per cpus_per_worker CPUs
    cpus_per_worker: int | None = None


def run_on_ray(spec: JobSpec, cluster: RayCluster, output: Output, lines: Iterable[str], seed: int) -> int:
    """Run every line on the Ray cluster, writing results into the directory output.path; the
    number of failed prompts."""
    folder = _output_dir(output)
    done = folder_done(folder) if output.resume else Done()
    ray = _import_ray()
    _connect(ray, cluster.address)
    try:
        workers, resources = _pool(ray, cluster, spec.model.backend)
        refs, errors, n_rows, rows_per_call = _blocks(ray, lines, done, workers, spec.parallel)
        err.print(f"[dim]{workers} Ray worker{'s' if workers > 1 else ''} of {spec.parallel} slots"
                  f"{f'; resuming after {len(done)} results' if done else ''}[/dim]")
        writer = Writer(new_part(folder), False, output.ordered)
        try:
            with Tally(len(errors) + n_rows) as tally:
                for place, error in errors:
                    writer.write(place, error.as_dict())
                    tally.add(failed=True)
                if n_rows:
                    # Ray Data builds its actor pools restartable with task retries (max_restarts=-1,
                    # max_task_retries): a dead worker is rebuilt and its batch runs again.
                    results = ray.data.from_arrow_refs(refs).map_batches(
                        BatchWorker, fn_constructor_kwargs={"spec": spec, "seed": seed}, batch_size=rows_per_call,
                        batch_format="numpy", compute=ray.data.ActorPoolStrategy(size=workers), **resources)
                    _collect(results, writer, tally)
        finally:
            writer.close()
        tally.summary(f" on {workers} Ray worker{'s' if workers > 1 else ''}")
        return tally.failed
    finally:
        ray.shutdown()


def _collect(results, writer: Writer, tally: Tally) -> None:
    """Write the workers' results as they come back; a worker that could not load the model ends the run."""
    for batch in results.iter_batches(batch_size=None, batch_format="numpy"):
        for place, record, tokens, failed in zip(batch["place"], batch["record"], batch["tokens"], batch["failed"]):
            if place < 0:
                raise LlogosError(record)
            writer.write(int(place), json.loads(record))
            tally.add(int(tokens), bool(failed))


def _output_dir(output: Output) -> Path:
    folder = output.path
    if folder is None:
        raise LlogosError("--ray writes a directory of results: give it with -o DIR")
    if folder.exists() and not folder.is_dir():
        raise LlogosError(f"{folder} is a file, but --ray writes a directory of results (one part file per run)")
    old = [p for p in parts(folder) if p.stat().st_size] if folder.is_dir() else []
    if old and not (output.resume or output.overwrite):
        raise LlogosError(f"{folder} already holds results: add --resume to continue them or --overwrite to replace them")
    if old and output.overwrite and not output.resume:
        for p in parts(folder):
            p.unlink()
    return folder


def _import_ray():
    try:
        import ray
        import ray.data
    except ImportError:
        raise LlogosError("--ray needs Ray: pip install 'llogos[ray]'") from None
    return ray


def _connect(ray, address: str) -> None:
    # Workers' own output stays on their nodes: what matters reaches the driver as results or errors.
    quiet = {"log_to_driver": False, "logging_level": logging.ERROR}
    # Ray's C++ core logs on stderr too, e.g. an error line for every restartable worker built from
    # arguments in the object store, which is how Ray Data builds all of them.
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
    try:
        if address == "local":
            ray.init(address="local", include_dashboard=False, **quiet)
        else:
            ray.init(address=address, **quiet)
    except ConnectionError as e:
        raise LlogosError(f"cannot reach a Ray cluster at {address} ({str(e).splitlines()[0]}); start one with "
                          "`ray start --head`, or use --ray local") from None
    logging.getLogger("ray.data").setLevel(logging.ERROR)   # the driver shows its own progress line
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False


def _pool(ray, cluster: RayCluster, backend: str) -> tuple[int, dict]:
    """How many workers, and what each asks of Ray: a GPU each where the cluster has GPUs (unless
    --backend cpu), else --cpus-per-worker CPUs with its thread pools sized to them."""
    nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
    env = {k: v for k, v in os.environ.items() if k == "LLOGOS_OFFLINE"}   # --offline reaches every node
    gpus = int(sum(r.get("GPU", 0) for r in nodes))
    if gpus and backend != "cpu":
        return cluster.workers or gpus, {"num_gpus": 1, "runtime_env": {"env_vars": env}}
    largest = int(max((r.get("CPU", 0) for r in nodes), default=0))
    if not largest:
        raise LlogosError("the Ray cluster has no CPUs for workers")
    cpus = min(cluster.cpus_per_worker or CPUS_PER_WORKER, largest)
    workers = cluster.workers or sum(int(r.get("CPU", 0)) // cpus for r in nodes)
    return workers, {"num_cpus": cpus, "runtime_env": {"env_vars": env | dict.fromkeys(_THREADS, str(cpus))}}


def _blocks(ray, lines: Iterable[str], done: Done, workers: int, parallel: int):
    """The input's parsed lines as Arrow tables in Ray's object store, one per worker call; the
    lines that failed to parse, with their places; the number of lines in the tables; and the
    lines per call. Up to CALLS_PER_WORKER calls a worker of PROMPTS_PER_SLOT prompts per slot are
    held back: an input that ends before that is cut evenly among the workers instead."""
    import pyarrow as pa
    most, hold = PROMPTS_PER_SLOT * parallel, CALLS_PER_WORKER * workers * PROMPTS_PER_SLOT * parallel
    refs, errors, rows, n_rows = [], [], [], 0

    def put(block: list[tuple]) -> None:
        refs.append(ray.put(pa.table(dict(zip(("place", "line", "id", "fields"), map(list, zip(*block)))))))

    for place, item in enumerate(read_lines(lines, done)):
        if isinstance(item, LineError):
            errors.append((place, item))
            continue
        rows.append((place, item.number, json.dumps(item.id), json.dumps(item.fields)))
        n_rows += 1
        if len(rows) == hold:
            put(rows[:most])
            del rows[:most]
    size = most if refs else max(parallel, math.ceil(len(rows) / (CALLS_PER_WORKER * workers)))
    for start in range(0, len(rows), size):
        put(rows[start:start + size])
    return refs, errors, n_rows, size
