"""`llogos batch` through a real subprocess: input forms, output order, bad lines, and resuming."""

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import FIXTURES, interruptible, need
from tests.test_cli import assert_one_line_error, env, llogos  # noqa: F401  (env is a fixture)

TINY = ["-m", str(FIXTURES / "tiny-llama-f32.gguf"), "--temp", "0", "--ignore-eos"]


@pytest.fixture
def tiny():
    need(FIXTURES / "tiny-llama-f32.gguf")
    return TINY


def records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_jsonl_results_equal_generate_for_every_prompt(env, smollm_path, tmp_path):
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "1, 2, 3, 4,"]
    lines = [json.dumps({"id": f"p{i}", "prompt": p}) for i, p in enumerate(prompts)]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    # float32 weights on both sides (auto's choice for a batch of a small model): alone and batched
    # then differ by float32 rounding only, where the integer products' 8-bit activations can round
    # an element to the other side of a step and turn a near-tie
    r = llogos(env, "batch", "-m", "smollm2-135m", "--temp", "0", "-n", "12", "-np", "3", "--cpu-weights", "f32",
               "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl"))
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    out = {rec["id"]: rec for rec in records((tmp_path / "out.jsonl").read_text())}
    assert sorted(out) == ["p0", "p1", "p2", "p3"]
    for i, p in enumerate(prompts):
        alone = llogos(env, "generate", "-m", "smollm2-135m", "--temp", "0", "-n", "12", "-p", p, "--cpu-weights", "f32")
        assert out[f"p{i}"]["text"] == alone.stdout
        assert out[f"p{i}"]["stop"] in ("limit", "eos") and out[f"p{i}"]["timings"]["prompt_n"] > 0


def test_plain_text_from_stdin_to_stdout_in_order(env, tiny):
    text = "first prompt\n\nsecond one\nthird\n"
    r = llogos(env, "batch", *tiny, "-n", "3", "-np", "2", "--ordered", stdin=text)
    assert r.returncode == 0, r.stderr
    out = records(r.stdout)
    assert [rec["id"] for rec in out] == [1, 3, 4]            # line numbers; the blank line is no prompt
    assert all(len(rec["tokens"]) == 3 and rec["stop"] == "limit" for rec in out)


def test_per_line_overrides(env, tiny, tmp_path):
    lines = [{"id": "short", "prompt": "a b c", "n_predict": 2},
             {"id": "long", "prompt": "a b c", "max_tokens": 7, "logprobs": 2},
             {"id": "hot", "prompt": "a b c", "temperature": 1.5, "seed": 3, "n_predict": 5}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = llogos(env, "batch", *tiny, "-n", "4", "-i", str(tmp_path / "in.jsonl"))
    assert r.returncode == 0, r.stderr
    out = {rec["id"]: rec for rec in records(r.stdout)}
    assert len(out["short"]["tokens"]) == 2 and "logprobs" not in out["short"]
    assert len(out["long"]["tokens"]) == 7
    assert len(out["long"]["logprobs"]) == 7 and all(len(top) == 2 for top in out["long"]["logprobs"])
    again = records(llogos(env, "batch", *tiny, "-i", str(tmp_path / "in.jsonl")).stdout)
    assert [x for x in again if x["id"] == "hot"][0]["tokens"] == out["hot"]["tokens"]   # its own seed


def test_bad_lines_get_error_objects_and_the_rest_still_run(env, tiny, tmp_path):
    lines = ['{"id": "ok", "prompt": "hello"}', "{not json", '{"id": "u", "prompt": "x", "colour": 1}',
             '{"id": "t", "prompt": 5}', '{"id": "big", "prompt": "' + "word " * 80 + '"}',
             '{"id": "neg", "prompt": "x", "n_predict": -5}', '{"id": "ok", "prompt": "again"}',
             '{"id": "both", "prompt": "x", "messages": []}', '{"id": "p", "prompt": "x", "top_p": 7}']
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    r = llogos(env, "batch", *tiny, "-n", "2", "-c", "32", "-i", str(tmp_path / "in.jsonl"), "--ordered")
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and "8 prompts failed" in r.stderr
    out = records(r.stdout)
    assert [rec.get("id") for rec in out] == ["ok", 2, "u", "t", "big", "neg", "ok", "both", "p"]
    assert "text" in out[0] and all("error" in rec for rec in out[1:])
    assert "not valid JSON" in out[1]["error"] and "colour" in out[2]["error"] and out[3]["error"].startswith("prompt")
    assert "context size" in out[4]["error"] and "duplicate id" in out[6]["error"] and out[8]["error"].startswith("top_p")


def test_bad_json_line_says_what_is_wrong_first(env, tiny):
    r = llogos(env, "batch", *tiny, "-n", "2", "--ordered", stdin='{"id": "tab", "prompt": "a\tb"}\n{"id": 2,\n')
    assert r.returncode == 1
    assert [rec["error"] for rec in records(r.stdout)] == [
        "invalid control character at column 27: not valid JSON",
        "expecting property name enclosed in double quotes at the end of the line: not valid JSON"]


def test_prompt_too_long_for_the_context_names_its_line_as_other_errors_do(env, tiny):
    lines = ['{"id": "fits", "prompt": "a b"}', '{"id": "big", "prompt": "' + "word " * 80 + '"}', "{not json"]
    r = llogos(env, "batch", *tiny, "-n", "2", "-c", "32", "--ordered", stdin="\n".join(lines) + "\n")
    assert r.returncode == 1
    errors = [rec for rec in records(r.stdout) if "error" in rec]
    assert [(rec["id"], rec["line"]) for rec in errors] == [("big", 2), (3, 3)]
    assert all(set(rec) == {"id", "line", "error"} for rec in errors)


def test_repeated_id_runs_the_first_line_and_refuses_the_next_naming_the_first(env, tiny):
    lines = ['{"id": "a", "prompt": "one"}', '{"id": "b", "prompt": "two"}', '{"id": "a", "prompt": "three"}']
    r = llogos(env, "batch", *tiny, "-n", "2", "--ordered", stdin="\n".join(lines) + "\n")
    assert r.returncode == 1 and "1 prompt failed" in r.stderr
    first, _, repeat = records(r.stdout)
    assert first["id"] == "a" and "text" in first
    assert repeat == {"id": "a", "line": 3,
                      "error": 'duplicate id "a": line 1 has it, so this line is not run (each line needs its own id)'}


def test_resume_runs_the_lines_that_failed_again(env, tiny, tmp_path):
    lines = ['{"id": "ok", "prompt": "a b"}', '{"id": "big", "prompt": "' + "word " * 40 + '"}', "{not json"]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    args = ["batch", *tiny, "-n", "2", "-i", str(tmp_path / "in.jsonl"), "-o", str(out)]
    assert llogos(env, *args, "-c", "32").returncode == 1
    first = out.read_text()
    assert [rec["id"] for rec in records(first) if "error" in rec] == ["big", 3]
    r = llogos(env, *args, "-c", "256", "--resume")          # room for "big" now; line 3 is still broken
    assert r.returncode == 1 and "running the 2 that failed again" in r.stderr and "1 prompt failed" in r.stderr
    now = out.read_text().splitlines()
    assert now[0] == next(line for line in first.splitlines() if '"ok"' in line)   # kept, and the errors gone
    again = {rec["id"]: rec for rec in records(out.read_text())}
    assert len(now) == 3 and sorted(map(str, again)) == ["3", "big", "ok"]
    assert len(again["big"]["tokens"]) == 2 and "error" in again[3]


def test_stdout_reader_going_away_ends_the_run_with_success(env, tiny):
    proc = subprocess.Popen([sys.executable, "-m", "llogos_cli", "batch", *tiny, "-n", "8", "-np", "2"], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdin.write("".join(f"prompt {i}\n" for i in range(2000)))
    proc.stdin.close()
    assert json.loads(proc.stdout.readline())["id"] == 1      # `| head -1`: read one result and go
    proc.stdout.close()
    assert proc.wait(timeout=120) == 0
    stderr = proc.stderr.read()
    assert "Traceback" not in stderr and "error" not in stderr


def test_empty_input_and_missing_file(env, tiny, tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    r = llogos(env, "batch", *tiny, "-i", str(tmp_path / "empty.jsonl"))
    assert r.returncode == 0 and r.stdout == ""
    assert_one_line_error(llogos(env, "batch", *tiny, "-i", str(tmp_path / "nope.jsonl")), "no such file")


def test_refuses_to_overwrite_results_without_resume(env, tiny, tmp_path):
    (tmp_path / "out.jsonl").write_text('{"id": 1, "text": "x"}\n')
    (tmp_path / "in.txt").write_text("hello\n")
    assert_one_line_error(llogos(env, "batch", *tiny, "-i", str(tmp_path / "in.txt"), "-o", str(tmp_path / "out.jsonl")),
                          "--resume")


def test_interrupted_run_resumes_with_every_id_once(env, tiny, tmp_path):
    n = 400
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"prompt number {i}"}) + "\n"
                                               for i in range(n)))
    out = tmp_path / "out.jsonl"
    args = ["batch", *tiny, "-n", "48", "-np", "4", "-i", str(tmp_path / "in.jsonl"), "-o", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "llogos_cli", *args], env=env, preexec_fn=interruptible,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while (not out.exists() or out.read_text().count("\n") < 8) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in stderr
    first = out.read_text()
    assert first.endswith("\n") and 8 <= first.count("\n") < n
    assert f"interrupted: {first.count(chr(10))} results (0 failed) written to {out}" in stderr
    assert "the same command with --resume continues" in stderr
    with open(out, "a") as f:   # a kill inside a write leaves a torn line: --resume cuts it off
        f.write('{"id": "q3", "te')
    r = llogos(env, *args, "--resume")
    assert r.returncode == 0, r.stderr
    ids = [rec["id"] for rec in records(out.read_text())]
    assert sorted(ids) == sorted(f"q{i}" for i in range(n))
    assert ids[:first.count("\n")] == [rec["id"] for rec in records(first)]
