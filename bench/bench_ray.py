"""`llogos batch --ray` against `llogos batch` on one machine: throughput of 1 and 2 Ray workers
and what starting Ray costs a run.

One file of prompts (greedy, --ignore-eos, so every prompt generates exactly -n tokens) runs
end to end, start-up included, as a user would run it:
- locally with -np S and -np 2S (the total slots of 1 and 2 workers of S slots);
- on a Ray head started once here with all this machine's CPUs: 1 worker of S slots holding all
  the CPUs, and 2 workers of S slots with half of them each;
- with --ray local, which starts (and stops) a Ray instance of its own for the run.
Reported: wall time, prompts/s and generated tokens/s. Ray's per-run overhead is the wall time of
one prompt and one token on the running head and with --ray local, less the same run locally.

    python bench/bench_ray.py [-m smollm2-135m] [--prompts 64] [-n 16] [-np 4]
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORDS = "the of a river city music light story garden winter machine letter".split()
# The head listens on this machine only; without this, Ray 2.5x turns token authentication on when
# ~/.ray/auth_token exists, and its clients need RAY_AUTH_MODE=token to match.
ENV = dict(os.environ, RAY_AUTH_MODE="disabled")


def run(args: list[str], out: Path) -> tuple[float, int]:
    """Wall seconds of one `llogos batch` and the tokens it generated."""
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "llogos_cli", "batch", *args, "-o", str(out)],
                       capture_output=True, text=True, env=ENV)
    wall = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(r.stderr)
    files = sorted(out.glob("part-*.jsonl")) if out.is_dir() else [out]
    return wall, sum(len(json.loads(line)["tokens"]) for f in files for line in f.read_text().splitlines())


def start_head(temp: str, cpus: int) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    Path(temp).mkdir()
    log = Path(temp) / "head.log"
    head = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
                             "--num-cpus", str(cpus), "--port", str(port), "--temp-dir", temp,
                             "--include-dashboard=false", "--disable-usage-stats"],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env=dict(ENV, RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0"))   # stop at once when told
    while "Ray runtime started" not in log.read_text():
        if head.poll() is not None:
            raise SystemExit(log.read_text())
        time.sleep(0.2)
    return head, f"127.0.0.1:{port}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("-n", "--n-predict", type=int, default=16)
    ap.add_argument("-np", "--parallel", type=int, default=4, help="slots per worker (S)")
    ap.add_argument("--cpus", type=int, default=os.cpu_count(), help="CPUs of the Ray head")
    a = ap.parse_args()
    common = ["-m", a.model, "--temp", "0", "--ignore-eos", "--backend", "cpu", "-c", "256"]
    half = max(a.cpus // 2, 1)
    with tempfile.TemporaryDirectory(prefix="ray", dir="/tmp") as d:
        d = Path(d)
        texts = (" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(12)) for i in range(a.prompts))
        (d / "in.jsonl").write_text("".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in enumerate(texts)))
        (d / "one.jsonl").write_text(json.dumps({"id": 0, "prompt": "Hello"}) + "\n")
        many = [*common, "-i", str(d / "in.jsonl"), "-n", str(a.n_predict)]
        one = [*common, "-i", str(d / "one.jsonl"), "-n", "1", "-np", "1"]
        head, address = start_head(str(d / "ray"), a.cpus)
        try:
            rows = [
                ("local", "-", a.parallel, run([*many, "-np", str(a.parallel)], d / "l1.jsonl")),
                ("local", "-", 2 * a.parallel, run([*many, "-np", str(2 * a.parallel)], d / "l2.jsonl")),
                ("ray", f"1 x {a.cpus} CPU", a.parallel,
                 run([*many, "-np", str(a.parallel), "--ray", address, "--workers", "1",
                      "--cpus-per-worker", str(a.cpus)], d / "r1")),
                ("ray", f"2 x {half} CPU", 2 * a.parallel,
                 run([*many, "-np", str(a.parallel), "--ray", address, "--workers", "2",
                      "--cpus-per-worker", str(half)], d / "r2")),
            ]
            alone = run(one, d / "o1.jsonl")[0]
            on_head = run([*one, "--ray", address, "--workers", "1"], d / "o2")[0]
        finally:
            head.send_signal(signal.SIGTERM)
            head.wait(60)
        own = run([*one, "--ray", "local", "--workers", "1"], d / "o3")[0]
    print(f"{a.model}: {a.prompts} prompts x {a.n_predict} tokens, greedy, CPU backend, {a.cpus} CPUs; "
          "wall time includes start-up")
    print(f"{'run':<6} {'workers':<12} {'slots':>5} {'wall s':>7} {'prompts/s':>10} {'tok/s':>7}")
    for mode, workers, slots, (wall, tokens) in rows:
        print(f"{mode:<6} {workers:<12} {slots:>5} {wall:>7.1f} {a.prompts / wall:>10.2f} {tokens / wall:>7.1f}")
    print(f"per-run overhead of Ray (1 prompt, 1 token; {alone:.1f} s locally): "
          f"+{on_head - alone:.1f} s on a running cluster, +{own - alone:.1f} s with --ray local")


if __name__ == "__main__":
    main()
