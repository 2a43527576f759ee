"""`llogos batch --ray` on a real Ray cluster of two CPU workers on this machine: the same results
as one machine, a worker killed mid-run, an interrupted run resumed, and what a user sees when Ray
or the model is missing."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests import test_cli
from tests.conftest import interruptible
from tests.test_cli import assert_one_line_error, llogos

env = test_cli.env   # the fixture: a subprocess environment with its own cache folder

N = 200
ARGS = ["-m", "smollm2-135m", "--temp", "0", "-n", "8", "-np", "8", "-c", "128", "--backend", "cpu"]
WORKERS = ["--workers", "2", "--cpus-per-worker", "1"]
# Lines that fail: one the driver rejects (not JSON), one a worker rejects (an unknown field), a repeated id.
BAD = ['{"id": "broken", "prompt": ', '{"id": "odd", "prompt": "x", "colour": 1}', '{"id": "q7", "prompt": "again"}']


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ray") / "prompts.jsonl"
    lines = [json.dumps({"id": f"q{i}", "prompt": f"Item {i}: a short note about"}) for i in range(N)]
    path.write_text("\n".join(lines[:100] + BAD + lines[100:]) + "\n")
    return path


@pytest.fixture(scope="module")
def expected(env, smollm_path, prompts, tmp_path_factory) -> dict:
    """The results of `llogos batch` without --ray, by id."""
    out = tmp_path_factory.mktemp("local") / "out.jsonl"
    r = llogos(env, "batch", *ARGS, "-i", str(prompts), "-o", str(out))
    assert r.returncode == 1 and "3 prompts failed" in r.stderr, r.stderr
    return by_id(out.read_text().splitlines())


@pytest.fixture(scope="module")
def ray_env(env) -> dict:
    # Ray 2.5x turns on token authentication when it finds ~/.ray/auth_token, which a client of this
    # cluster would then need to find too; the test cluster listens on this machine only.
    return dict(env, RAY_AUTH_MODE="disabled")


@pytest.fixture(scope="module")
def cluster(ray_env):
    """A Ray head with 2 CPUs, started once for the module: its address and its process."""
    pytest.importorskip("ray")   # protection only: `make test` installs llogos[ray]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")   # short: Ray's socket paths live under it
    log = open(Path(temp) / "head.log", "w+")
    head = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--num-cpus", "2",
                             "--port", str(port), "--temp-dir", temp, "--include-dashboard=false",
                             "--disable-usage-stats"], env=dict(ray_env, RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0"),
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while "Ray runtime started" not in Path(log.name).read_text():
        assert head.poll() is None and time.monotonic() < deadline, Path(log.name).read_text()
        time.sleep(0.2)
    yield f"127.0.0.1:{port}", head
    head.send_signal(signal.SIGTERM)   # the head stops its GCS, raylet and workers, and waits for them
    head.wait(60)
    log.close()
    shutil.rmtree(temp, ignore_errors=True)


def by_id(lines: list[str]) -> dict:
    """Records by id (and line, for an input line's error), each once; timings differ from run to
    run and are left out."""
    records = [json.loads(line) for line in lines]
    out = {json.dumps([rec["id"], rec.get("line")]): {k: v for k, v in rec.items() if k != "timings"}
           for rec in records}
    assert len(out) == len(records), "a result is in the output twice"
    return out


def results(folder: Path) -> dict:
    return by_id([line for part in sorted(folder.glob("part-*.jsonl")) for line in part.read_text().splitlines()])


@contextmanager
def start(environ: dict, *args) -> Iterator[subprocess.Popen]:
    """A `llogos` run in the background, killed if a test fails while it still runs."""
    with subprocess.Popen([sys.executable, "-m", "llogos_cli", *args], env=environ, preexec_fn=interruptible,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            yield proc
        finally:
            proc.kill()


def wait_for_results(folder: Path, proc: subprocess.Popen) -> None:
    """Until the workers have sent results (the driver writes the lines it cannot parse at once)."""
    deadline = time.monotonic() + 120
    while sum(p.read_bytes().count(b"\n") for p in folder.glob("part-*.jsonl")) < 10:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)


def workers_of(head: subprocess.Popen) -> list[int]:
    """The PIDs of the llogos workers under the cluster's head process."""
    parent = {}
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            title = (entry / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if entry.name.isdigit():
            parent[int(entry.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), b"BatchWorker" in title)

    def under_head(pid: int) -> bool:
        while pid > 1:
            if pid == head.pid:
                return True
            pid = parent.get(pid, (0, False))[0]
        return False

    return [pid for pid, (_, is_worker) in parent.items() if is_worker and under_head(pid)]


def test_results_equal_one_machine_for_every_id(ray_env, cluster, prompts, expected, tmp_path):
    r = llogos(ray_env, "batch", *ARGS, *WORKERS, "--ray", cluster[0], "-i", str(prompts), "-o", str(tmp_path / "out"))
    assert r.returncode == 1 and "3 prompts failed" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert results(tmp_path / "out") == expected
    assert len(expected) == N + len(BAD)


def test_a_killed_worker_loses_and_repeats_nothing(ray_env, cluster, prompts, expected, tmp_path):
    out = tmp_path / "out"
    with start(ray_env, "batch", *ARGS, *WORKERS, "--ray", cluster[0], "-i", str(prompts), "-o", str(out)) as proc:
        wait_for_results(out, proc)
        victims = workers_of(cluster[1])
        assert len(victims) == 2
        os.kill(victims[0], signal.SIGKILL)
        _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "3 prompts failed" in stderr, stderr
    assert results(out) == expected


def test_an_interrupted_run_resumes(ray_env, cluster, prompts, expected, tmp_path):
    out = tmp_path / "out"
    args = ["batch", *ARGS, *WORKERS, "--ray", cluster[0], "-i", str(prompts), "-o", str(out)]
    with start(ray_env, *args) as proc:
        wait_for_results(out, proc)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr
    first = results(out)
    assert 0 < len(first) < len(expected)
    assert_one_line_error(llogos(ray_env, *args), "--resume")
    r = llogos(ray_env, *args, "--resume")
    assert r.returncode in (0, 1), r.stderr
    assert len(list(out.glob("part-*.jsonl"))) == 2
    assert results(out) == expected


def test_a_worker_without_the_model_names_its_node(ray_env, cluster, prompts, tmp_path):
    r = llogos(ray_env, "batch", *WORKERS, "--ray", cluster[0], "-m", str(tmp_path / "missing.gguf"),
               "-i", str(prompts), "-o", str(tmp_path / "out"))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]   # after Ray's own notices
    assert last.startswith("error: worker on node ") and socket.gethostname() in last and "missing.gguf" in last


def test_without_ray_installed_one_line_says_how_to_get_it(env, tmp_path):
    (tmp_path / "in.txt").write_text("hello\n")
    code = "import sys; sys.modules['ray'] = None; from llogos_cli.cli.main import main; main()"
    r = subprocess.run([sys.executable, "-c", code, "batch", "--ray", "auto", "-i", str(tmp_path / "in.txt"),
                        "-o", str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=60)
    assert_one_line_error(r, "pip install 'llogos[ray]'")


def test_llogos_never_imports_ray_without_the_flag(env):
    code = "import sys, llogos_cli.cli.main, llogos_cli.server.app; print('ray' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stderr
