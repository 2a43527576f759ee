"""The CPU kernels compiled in child processes on a machine's first run, so that every run, that one
included, runs the code numba's cache holds; and what is said and timed while they compile.

numba's freshly compiled code and the code it writes to its cache for the same kernel can differ in
their last bits: where fastmath lets LLVM regroup a sum, the two builds vectorize it differently
(seen on an Intel Sapphire Rapids host: a decode step's attention, and greedy output that changed
from the first run to the second). Compiling in children and then loading from the cache in the
process that runs the model makes the first run's answers those of every later run.

A warm-up is a list of steps that share no kernel (NumpyBackend.warm_up_steps): as many children as
there are cores take them one at a time, so the first run's compile takes about as long as its
longest step where the cores are free. Whether anything compiles is numba's own word (its
"numba:compile" event, which loading from the cache never raises), never a guess from time.
"""

import contextlib
import hashlib
import json
import os
import selectors
import subprocess
import sys
import time
from dataclasses import dataclass

from llogos_cli.backends.cpu import cpu_jit
from llogos_cli.backends.cpu.cpu_threads import available_cores
from numba.core import event   # (after cpu_jit, which sets numba's cache folder first)


@dataclass(frozen=True, slots=True)
class CompileProgress:
    """Where a warm-up's compiling stands, given to its progress callback each time a step begins
    to compile (`started`, the step number-th of total) or a compiling step ends."""
    total: int
    done: int                    # steps finished, compiled or loaded from the cache
    compiling: tuple[str, ...]   # steps compiling now, in the order they began
    started: str | None = None
    number: int = 0


class _Compiles(event.Listener):
    """Hears numba compile (the outermost kernel of each compile): calls on_first the first time,
    and adds up the seconds."""

    def __init__(self, on_first):
        self.on_first, self.depth, self.seconds, self.t0 = on_first, 0, 0.0, 0.0

    def on_start(self, ev) -> None:
        if self.depth == 0:
            if self.on_first is not None:
                self.on_first()
                self.on_first = None
            self.t0 = time.perf_counter()
        self.depth += 1

    def on_end(self, ev) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.seconds += time.perf_counter() - self.t0


@contextlib.contextmanager
def _listening(on_first):
    listener = _Compiles(on_first)
    with event.install_listener("numba:compile", listener):
        yield listener


def run_steps(steps: list, progress=None) -> float:
    """Run the warm-up's (name, call) steps here, telling progress of each that compiles (none, when
    the children did): -> the seconds spent compiling."""
    seconds = 0.0
    for i, (name, call) in enumerate(steps):
        def started(name=name, i=i):
            if progress is not None:
                progress(CompileProgress(len(steps), i, (name,), name, i + 1))
        with _listening(started) as heard:
            call()
        seconds += heard.seconds
    return seconds


def compile_in_children(spec: dict, names: list[str], progress=None) -> float:
    """Have child processes compile what NumpyBackend(spec's weights, batched).warm_up_steps(types,
    experts) names, unless they already have since the kernels' sources last changed:
    -> the seconds that took. Does nothing where numba's cache is not llogos' folder (there
    is nowhere to note that it is done); on any failure the caller compiles what is missing itself."""
    folder = cpu_jit.cache_folder()
    if folder is None or not names:
        return 0.0
    text = json.dumps(dict(spec, isa=os.environ.get("LLOGOS_CPU_ISA", "")), sort_keys=True)
    done = folder / f"compiled-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    if done.exists():
        return 0.0
    t0 = time.perf_counter()
    try:
        if _Children(text, names, progress).run():
            done.touch()
    except OSError:
        pass
    return time.perf_counter() - t0


class _Children:
    """Children that each take a step's number on stdin, compile it, and say on stdout
    "compiling N" when numba begins to compile for it and "done N" when it is ready."""

    def __init__(self, spec: str, names: list[str], progress):
        self.names, self.progress = names, progress
        self.waiting = list(range(len(names)))
        self.done, self.compiling = 0, []
        self.procs = [subprocess.Popen([sys.executable, "-m", __name__, spec], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
                      for _ in range(min(len(names), available_cores()))]

    def run(self) -> bool:
        """Hand out the steps until every one is done: -> whether every child compiled its steps."""
        selector = selectors.DefaultSelector()
        try:
            for proc in self.procs:
                self._next(proc)
                selector.register(proc.stdout, selectors.EVENT_READ, [proc, b""])
            while selector.get_map():
                for key, _ in selector.select():
                    proc, held = key.data
                    chunk = os.read(key.fd, 4096)
                    if not chunk:
                        selector.unregister(key.fileobj)
                        continue
                    *lines, key.data[1] = (held + chunk).split(b"\n")
                    for line in lines:
                        self._heard(proc, line.decode(errors="replace").split())
            return all(proc.wait() == 0 for proc in self.procs) and self.done == len(self.names)
        finally:
            selector.close()
            for proc in self.procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()

    def _heard(self, proc, words: list[str]) -> None:
        if len(words) != 2 or not words[1].isdigit() or int(words[1]) >= len(self.names):
            return
        name = self.names[int(words[1])]
        if words[0] == "compiling":
            self.compiling.append(name)
            self._tell(name, int(words[1]) + 1)
        elif words[0] == "done":
            self.done += 1
            if name in self.compiling:
                self.compiling.remove(name)
                self._tell(None, 0)
            self._next(proc)

    def _tell(self, started: str | None, number: int) -> None:
        if self.progress is not None:
            self.progress(CompileProgress(len(self.names), self.done, tuple(self.compiling), started, number))

    def _next(self, proc) -> None:
        """Give the child the next step, or tell it that there are no more."""
        if self.waiting:
            proc.stdin.write(f"{self.waiting.pop(0)}\n".encode())
            proc.stdin.flush()
        else:
            proc.stdin.close()


def _main(spec: str) -> None:
    from gguf import GGMLQuantizationType

    from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
    s = json.loads(spec)
    backend = NumpyBackend(s["weights"], batched=s["batched"])
    steps = backend.warm_up_steps({GGMLQuantizationType(t) for t in s["types"]}, s["experts"], tuple(s["cache_types"]))

    def say(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    for line in sys.stdin:
        n = int(line)
        with _listening(lambda: say(f"compiling {n}")):
            steps[n][1]()
        say(f"done {n}")


if __name__ == "__main__":
    _main(sys.argv[1])
