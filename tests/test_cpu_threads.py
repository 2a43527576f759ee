"""-t/--threads and -tb/--threads-batch: the counts reach numba and OpenBLAS for steps of one and of
several tokens, auto runs on the cores other processes leave free, and every computing command
takes the flags."""

import multiprocessing
import time
from types import SimpleNamespace

import numba
import numpy as np
import pytest
from threadpoolctl import threadpool_info

from llogos_cli.backends.cpu import cpu_threads
from llogos_cli.backends.cpu.cpu_threads import CpuThreads, available_cores, free_cores
from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from tests.conftest import FIXTURES, need
from tests.test_cli import assert_one_line_error, env, llogos  # noqa: F401  (env is a fixture)


def _openblas_threads() -> set[int]:
    return {lib["num_threads"] for lib in threadpool_info() if lib["internal_api"] == "openblas"}


def test_steps_of_one_and_of_several_tokens_take_their_own_counts():
    threads = CpuThreads(threads=1, threads_batch=2)
    NumpyBackend("quantized", threads=threads)   # loads numba, whose count is then set too
    try:
        for n_tokens, expected in ((1, 1), (7, 2), (1, 1), (64, 2)):
            assert threads.for_step(n_tokens) == expected
            assert _openblas_threads() == {expected}
            assert numba.get_num_threads() == min(expected, numba.config.NUMBA_NUM_THREADS)
    finally:
        CpuThreads(available_cores(), available_cores()).for_step(1)


def test_the_backend_sets_the_count_once_per_forward_pass():
    backend = NumpyBackend(threads=CpuThreads(threads=1, threads_batch=2))
    backend.batch_layout(np.zeros(5, np.int32), np.arange(5, dtype=np.int32))
    assert _openblas_threads() == {2}
    backend.batch_layout(np.zeros(1, np.int32), np.array([5], np.int32))
    assert _openblas_threads() == {1}
    CpuThreads(available_cores(), available_cores()).for_step(1)


def test_free_cores_subtracts_what_other_processes_used():
    # samples: (wall s, CPU s of every process, CPU s of this one)
    assert free_cores((0, 0, 0), (1, 1.0, 0.0), 2) == 1     # one core busy elsewhere
    assert free_cores((0, 0, 0), (1, 0.8, 0.0), 2) == 1     # most of one
    assert free_cores((0, 0, 0), (1, 0.6, 0.0), 2) == 2     # a light neighbour takes no core
    assert free_cores((0, 0, 0), (1, 2.0, 1.9), 2) == 2     # the work was our own
    assert free_cores((0, 0, 0), (1, 3.5, 0.0), 4) == 1     # keeps one core however busy
    assert free_cores((0, 0, 0), (2, 6.0, 0.0), 16) == 13   # a rate: 3 cores' worth over 2 s
    assert free_cores((5, 1, 1), (5, 1, 1), 8) == 8         # no time between the samples


def _spin(cpu_seconds: float) -> None:
    """Busy until this process has used cpu_seconds of CPU, however long other load makes that take."""
    while time.process_time() < cpu_seconds:
        pass


def test_a_sample_counts_the_cpu_other_processes_used():
    before = cpu_threads._busy_sample()
    busy = multiprocessing.Process(target=_spin, args=(0.5,))
    busy.start()
    busy.join()
    after = cpu_threads._busy_sample()
    others = (after[1] - before[1]) - (after[2] - before[2])
    assert others >= 0.45   # the spinner's half second at least (ticks of 10 ms), whatever else ran


def test_auto_leaves_the_cores_that_busy_processes_hold(monkeypatch):
    """The machine as scripted samples on a scripted clock: what auto decides from them, counted again
    every RECOUNT_S, whatever the real machine is doing."""
    cores = available_cores()
    if cores < 2:
        pytest.skip("needs two cores to leave one to others")
    clock, used = [100.0], [0.0]   # seconds; CPU seconds every process used (this one none)
    monkeypatch.setattr(cpu_threads, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(cpu_threads, "_busy_sample", lambda: (clock[0], used[0], 0.0))

    def run(seconds: float, busy_cores: float) -> None:
        clock[0] += seconds
        used[0] += seconds * busy_cores

    threads = CpuThreads()
    assert threads.for_step(1) == cores
    run(cpu_threads.RECOUNT_S, cores - 1)          # others keep all but one core busy
    assert threads.for_step(1) == 1
    run(cpu_threads.RECOUNT_S / 2, 0)              # not yet counted again
    assert threads.for_step(1) == 1
    run(cpu_threads.RECOUNT_S / 2, 0)              # the others have gone
    assert threads.for_step(1) == cores
    CpuThreads(cores, cores).for_step(1)


@pytest.mark.parametrize("command", ["generate", "chat", "batch", "serve", "perplexity"])
def test_every_computing_command_takes_the_thread_flags(env, command):
    help_text = llogos(env, command, "--help").stdout
    assert "-t, --threads" in help_text and "-tb, --threads-batch" in help_text
    assert_one_line_error(llogos(env, command, "-t", "-2"), "-2", code=2)   # -1 is llama.cpp's every core


def test_generate_runs_on_the_threads_it_is_given(env):
    plain = llogos(env, "generate", "-m", "smollm2-135m", "-p", "The capital of France is", "-n", "6", "--temp", "0")
    for flags in (["-t", "1", "-tb", "1"], ["-t", "2", "-tb", "1"]):
        r = llogos(env, "generate", "-m", "smollm2-135m", "-p", "The capital of France is", "-n", "6", "--temp", "0",
                   *flags)
        assert r.returncode == 0 and r.stdout == plain.stdout, r.stderr


@pytest.mark.parametrize("command", ["generate", "perplexity"])
def test_thread_counts_above_the_cores_are_warned_of_in_one_line(env, command, tmp_path):
    """-t or -tb above the cores this process may run on warns on stderr (threads that wait for a
    core slow every step); the cores themselves do not."""
    cores = available_cores()
    (tmp_path / "text.txt").write_text("Once upon a time there was a little model. " * 8)
    args = [command, "-m", str(need(FIXTURES / "tiny-llama-f32.gguf")), "-c", "32",
            *(["-p", "Once upon a time", "-n", "2"] if command == "generate" else ["-f", str(tmp_path / "text.txt")])]
    for flags, warned in ((["-t", str(cores + 1)], "-t"), (["-tb", str(cores + 3)], "-tb"), (["-t", str(cores)], None)):
        r = llogos(env, *args, *flags)
        assert r.returncode == 0, r.stderr
        lines = [line for line in r.stderr.splitlines() if "more threads than" in line]
        if warned is None:
            assert lines == []
        else:
            assert lines == [f"warning: {warned} {flags[1]} is more threads than the {cores} cores this process may run "
                             "on: the extra threads wait for a core, which makes every step slower, not faster"]
