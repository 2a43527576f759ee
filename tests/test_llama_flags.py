"""llama.cpp's flags as its users type them: parsed to llama.cpp's meaning, refused by name when
llogos has no equivalent, escapes in -p, llama-tokenize's input and output, llama-perplexity's line."""

import json
import os
import re
import subprocess
import sys

import click
import pytest

from llogos_cli.backends.cpu.cpu_threads import available_cores
from llogos_cli.cli.group import cli
from llogos_cli.cli.text_input import unescape
from llogos_cli.errors import LlogosError
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model import loader
from llogos_cli.model.loader import LoadOptions, open_tokenizer
from tests.conftest import FIXTURES, REFERENCE, need

TINY = FIXTURES / "tiny-llama-f32.gguf"


def parsed(command: str, *args: str) -> dict:
    """The values Click hands the command for these words, without running it."""
    return cli.get_command(None, command).make_context(command, list(args)).params


def llogos(*args, stdin: str | bytes | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_COLOR="1")
    env.pop("COLUMNS", None)
    return subprocess.run([sys.executable, "-m", "llogos_cli", *args], input=stdin, env=env, capture_output=True,
                          text=not isinstance(stdin, bytes), timeout=600)


def test_multi_letter_short_options_are_not_split_into_short_ones():
    p = parsed("generate", "-m", "x.gguf", "-ngl", "99", "-fa", "on", "-ctk", "q8_0", "-ctv", "f16", "-c", "64",
               "-n", "12", "-tb", "2", "-t", "3", "-f", "p.txt", "-ub", "8", "-b", "32")
    assert (p["gpu_layers"], p["cache_type_k"], p["cache_type_v"], p["ctx_size"]) == (99, "q8_0", "f16", 64)
    assert (p["n_predict"], p["threads"], p["threads_batch"], str(p["file"])) == (12, 3, 2, "p.txt")
    assert (p["batch_size"], p["ubatch_size"]) == (32, 8)


@pytest.mark.parametrize("args, meaning", [
    (("--predict", "7"), {"n_predict": 7}),
    (("-s", "5", "--temperature", "0.3"), {"seed": 5, "temp": 0.3}),
    (("-t", "-1", "-tb", "-1"), {"threads": available_cores(), "threads_batch": available_cores()}),
    (("-ngl", "all"), {"gpu_layers": "all"}),
    (("-ngl", "-1"), {"gpu_layers": "auto"}),
    (("-ngl", "0"), {"gpu_layers": 0}),
    (("--n-gpu-layers", "12"), {"gpu_layers": 12}),
    (("-r", "User:", "--reverse-prompt", "###"), {"stop": ("User:", "###")}),
    (("-sp", "-cnv", "--no-display-prompt"), {"special": True, "chat": True, "echo": False}),
    (("--display-prompt", "--perf"), {"echo": True, "stats": True}),
    (("-jf", "s.json"), {"json_schema_file": "s.json"}),
    (("--mlock", "--no-mmap"), {"mlock": True, "mmap": False}),
    (("--no-escape", "-no-cnv", "-fa", "off"), {"escape": False}),
    ((), {"escape": True, "mmap": True, "mlock": False, "gpu_layers": None}),
])
def test_llama_cpp_spellings_mean_what_they_mean_there(args, meaning):
    p = parsed("generate", "-p", "x", *args)
    assert {k: str(p[k]) if k.endswith("_file") else p[k] for k in meaning} == meaning


def test_spellings_on_the_other_commands():
    p = parsed("chat", "-sys", "be brief", "-cnv", "--predict", "9", "-ctk", "f16")
    assert (p["system"], p["n_predict"], p["cache_type_k"]) == ("be brief", 9, "f16")
    assert str(parsed("chat", "--system-prompt-file", "s.txt")["system_file"]) == "s.txt"
    assert parsed("chat", "--system-prompt", "hi")["system"] == "hi"
    p = parsed("serve", "-np", "4", "-b", "256", "-ub", "64", "-cram", "100", "-ngl", "99", "-fa", "auto", "--jinja",
               "-cb", "--metrics", "-a", "my-model", "--embeddings", "--reranking")
    assert (p["parallel"], p["batch_size"], p["ubatch_size"], p["cache_ram"], p["gpu_layers"]) == (4, 256, 64, 100, 99)
    assert p["alias"] == "my-model" and p["reranking"]
    assert "embedding" not in parsed("serve", "--embedding")
    p = parsed("perplexity", "-f", "t.txt", "-c", "128", "-b", "64", "--chunks", "3", "-ngl", "0")
    assert (p["ctx_size"], p["batch_size"], p["chunks"], p["gpu_layers"]) == (128, 64, 3, 0)
    p = parsed("tokenize", "-m", "x.gguf", "--stdin", "--ids", "--show-count", "--no-bos", "--no-parse-special")
    assert p["from_stdin"] and p["ids"] and p["show_count"] and p["no_bos"] and p["no_parse_special"]


@pytest.mark.parametrize("command, args, named", [
    ("generate", ("-dev", "cuda0"), "-dev/--device"),
    ("generate", ("-mu", "http://example.com/m.gguf"), "-mu/--model-url"),      # Click alone: -m u
    ("generate", ("-ptc", "10"), "-ptc/--print-token-count"),                   # Click alone: -p tc
    ("generate", ("-ncmoe", "4"), "-ncmoe/--n-cpu-moe"),                        # Click alone: -n cmoe
    ("generate", ("-np", "4"), "-np/--parallel"),                               # serve and batch have it
    ("generate", ("--hf-repo", "a/b"), "-hf/-hfr/--hf-repo"),
    ("chat", ("-sm", "row"), "-sm/--split-mode"),
    ("serve", ("--ssl-key-file", "k.pem"), "--ssl-key-file"),
    ("perplexity", ("--hellaswag",), "--hellaswag"),
    ("tokenize", ("-ngl", "99"), "-ngl/--gpu-layers/--n-gpu-layers"),
    ("batch", ("--no-mmproj",), "--no-mmproj/--no-mmproj-auto"),
])
def test_a_llama_cpp_option_llogos_lacks_is_one_line_naming_it(command, args, named):
    r = llogos(command, "-m", str(need(TINY)), *args, "-p", "x")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == f"error: {named} is a llama.cpp option that llogos {command} does not have\n"


def test_a_value_may_follow_an_equals_sign():
    p = parsed("generate", "-p", "x", "-ngl=99", "--temperature=0.5", "-ctk=f16")
    assert (p["gpu_layers"], p["temp"], p["cache_type_k"]) == (99, 0.5, "f16")
    with pytest.raises(click.UsageError, match="-dev/--device is a llama.cpp option"):
        parsed("generate", "-p", "x", "-dev=cuda0")


def test_a_value_that_looks_like_a_llama_cpp_option_is_still_a_value():
    assert parsed("generate", "-p", "-dev", "--stop", "-np")["prompt"] == "-dev"
    assert parsed("tokenize", "-m", "x.gguf", "--", "-ngl")["args"] == ("-ngl",)


def test_gpu_layers_pick_the_device(monkeypatch, capsys):
    monkeypatch.setattr(loader, "cuda_available", lambda: False)
    assert LoadOptions(gpu_layers=99).placement(30) == "cpu"
    assert "-ngl 99: no CUDA GPU" in capsys.readouterr().err
    assert LoadOptions(gpu_layers=0).placement(30) == "cpu"
    assert LoadOptions(gpu_layers="auto", backend="cpu").placement(30) == "cpu"
    with pytest.raises(LlogosError, match="disagree"):
        LoadOptions(gpu_layers=0, backend="cuda").placement(30)
    monkeypatch.setattr(loader, "cuda_available", lambda: True)
    assert LoadOptions(gpu_layers="all").placement(30) == "cuda"
    assert capsys.readouterr().err == ""
    assert LoadOptions(gpu_layers=10).placement(30) == "cuda"
    said = capsys.readouterr().err
    assert "-ngl 10: llogos does not split" in said and "all 30 layers run on the GPU" in said


def test_no_mmap_reads_the_same_bytes_into_memory():
    mapped, read = GGUFFile(need(TINY)), GGUFFile(TINY, mmap=False)
    name = next(iter(mapped.tensors))
    assert type(read.raw(name)).__name__ == "ndarray" and (read.raw(name) == mapped.raw(name)).all()


@pytest.mark.parametrize("typed, meant", [
    (r"a\nb", "a\nb"), (r"\t\r\'\"\\", "\t\r'\"\\"), (r"\x41\x4", "A\\x4"), (r"\q", "\\q"), ("end\\", "end\\"),
    (r"\xe2\x82\xac", "€"), (r"\\n", "\\n"),
])
def test_escapes_as_llama_cpp_processes_them(typed, meant):
    assert unescape(typed) == meant


def test_prompt_escapes_by_default_and_no_escape_keeps_them():
    args = ("generate", "-m", str(need(TINY)), "--chat", "--chat-template", "chatml", "--print-prompt", "-p")
    assert "line one\nline two" in llogos(*args, r"line one\nline two").stdout
    assert r"line one\nline two" in llogos(*args, r"line one\nline two", "--no-escape").stdout


@pytest.fixture(scope="module")
def smollm():
    try:
        return open_tokenizer("smollm2-135m")
    except LlogosError as e:
        pytest.skip(str(e))


# Whitespace-only texts and trailing newlines are what llama.cpp's tokenizer tests feed llama-tokenize.
@pytest.mark.parametrize("text", ["\t\n", "hello\n", "  ", "a\r\nb\r", "\n\n\n", " "])
def test_tokenize_stdin_takes_exactly_the_bytes_given(smollm, text):
    want = smollm.encode(text)
    for args in (("--stdin", "--ids"), ("-",), ()):
        r = llogos("tokenize", "-m", "smollm2-135m", *args, stdin=text.encode())
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == want


def test_tokenize_llama_tokenize_outputs(smollm, tmp_path):
    ids = smollm.encode("Hello world")
    r = llogos("tokenize", "-m", "smollm2-135m", "-p", "Hello world")
    assert r.stdout == "".join(f"{i:6d} -> '{smollm.token_bytes(i, True).decode()}'\n" for i in ids)
    r = llogos("tokenize", "-m", "smollm2-135m", "-p", "Hello world", "--ids", "--show-count")
    assert r.stdout == f"{json.dumps(ids)}\nTotal number of tokens: {len(ids)}\n"
    (tmp_path / "t.txt").write_bytes(b"Hello world\n")
    r = llogos("tokenize", "-m", "smollm2-135m", "-f", str(tmp_path / "t.txt"), "--ids")
    assert json.loads(r.stdout) == smollm.encode("Hello world\n")
    r = llogos("tokenize", "-m", "smollm2-135m", "-p", r"a\tb", "--ids", "--no-bos")
    assert json.loads(r.stdout) == smollm.encode("a\tb", add_bos=False)


def test_tokenize_refuses_a_lone_model_name():
    r = llogos("tokenize", "gemma3-270m")
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1
    assert "'gemma3-270m' names a model" in r.stderr
    r = llogos("tokenize", "-m", str(need(TINY)), "-p", "a", "--stdin")
    assert r.returncode == 2 and "one way" in r.stderr


def test_perplexity_prints_llama_perplexitys_final_estimate():
    args = ("perplexity", "-m", str(need(TINY)), "-f", str(need(REFERENCE / "ppl.txt")), "-c", "32", "--chunks", "2",
            "-b", "8")
    r = llogos(*args)
    assert r.returncode == 0, r.stderr
    line = re.fullmatch(r"Final estimate: PPL = (\d+\.\d{4}) \+/- (\d+\.\d{5})\n", r.stdout)
    assert line, r.stdout
    result = json.loads(llogos(*args, "--json").stdout)
    assert line.groups() == (f"{result['ppl']:.4f}", f"{result['ppl_stderr']:.5f}") and result["ppl_stderr"] > 0
    assert "2 chunks of 32 tokens, 30 tokens scored" in r.stderr


def test_generate_takes_the_prompt_as_words_as_llama_simple_does():
    assert parsed("generate", "-m", "x.gguf", "-n", "32", "-ngl", "99", "Hello", "my", "name")["words"] == (
        "Hello", "my", "name")
    args = ("generate", "-m", str(need(TINY)), "--chat", "--chat-template", "chatml", "--print-prompt")
    assert llogos(*args, "Hello", r"my\nname").stdout == llogos(*args, "--no-escape", "-p", r"Hello my\nname").stdout
    r = llogos("generate", "-m", str(TINY), "-p", "x", "Hello")
    assert r.returncode == 1 and r.stderr == "error: give the prompt once: as words ('Hello') or with -p, -f or --tokens\n"


def test_chat_takes_llama_clis_prompt_and_single_turn():
    args = ("chat", "-m", str(need(TINY)), "--chat-template", "chatml", "-sys", "Be brief.", "-st", "--print-prompt")
    r = llogos(*args, "-p", r"one\ntwo", stdin="not this")
    assert r.returncode == 0, r.stderr
    assert "Be brief." in r.stdout and "one\ntwo" in r.stdout and "not this" not in r.stdout
