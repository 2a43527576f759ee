"""A reply's reasoning apart from its answer (engine/reasoning.py): <think> tags and gpt-oss's
harmony channels, whole and streamed in any cuts."""

import json

import numpy as np
import pytest

from llogos_cli.engine.conversation import ChatFormat, Message
from llogos_cli.engine.reasoning import Reasoning, Splitter, opens_thinking, split, style_of
from llogos_cli.engine.sampling import SamplingParams
from llogos_cli.tokenizer.chat_template import ChatTemplate

THINK = [
    # (reply, thinking at start, reasoning, answer)
    ("<think>\nWeigh it.\n</think>\n\nParis.", False, "\nWeigh it.\n", "Paris."),
    ("  <think>a</think>b", False, "a", "b"),
    ("Weigh it.</think>\n\nParis.", True, "Weigh it.", "Paris."),
    ("Paris, <think> not a tag here", False, "", "Paris, <think> not a tag here"),
    ("<think>never closed", False, "never closed", ""),
    ("<think>a < b </thin", False, "a < b </thin", ""),
    ("<think></think>", False, "", ""),
    ("", False, "", ""),
    ("<thi", False, "", "<thi"),
]

HARMONY = [
    ("<|channel|>analysis<|message|>User wants a city.<|end|><|start|>assistant<|channel|>final<|message|>Paris.",
     "User wants a city.", "Paris."),
    ("<|channel|>final<|message|>Just this.", "", "Just this."),
    ("<|channel|>analysis<|message|>cut short", "cut short", ""),
    ("<|channel|>commentary<|message|>A preamble.<|end|><|start|>assistant<|channel|>final<|message|>Done.",
     "", "A preamble.Done."),
    ("Plain text from a model without channels.", "", "Plain text from a model without channels."),
    ("<|channel|>analysis<|message|>a <| b<|end|><|start|>assistant<|channel|>final <|constrain|>json<|message|>{}",
     "a <| b", "{}"),
]


def _streamed(text: str, style: str, thinking: bool, cuts: list[int]) -> tuple[str, str]:
    s = Splitter(style, thinking)
    reasoning = answer = ""
    for a, b in zip([0, *cuts], [*cuts, len(text)]):
        out = s.push(text[a:b])
        reasoning, answer = reasoning + out.reasoning, answer + out.content
    out = s.finish()
    return reasoning + out.reasoning, answer + out.content


@pytest.mark.parametrize("text,thinking,reasoning,answer", THINK)
def test_think_tags(text, thinking, reasoning, answer):
    whole = split(text, "think", thinking)
    assert (whole.reasoning, whole.content) == (reasoning, answer)


@pytest.mark.parametrize("text,reasoning,answer", HARMONY)
def test_harmony_channels(text, reasoning, answer):
    whole = split(text, "harmony")
    assert (whole.reasoning, whole.content) == (reasoning, answer)


@pytest.mark.parametrize("case", range(len(THINK) + len(HARMONY)))
def test_streamed_in_any_pieces_as_whole(case):
    """One character at a time, and random cuts: the same reasoning and answer as the whole reply."""
    if case < len(THINK):
        text, thinking, *expected = THINK[case]
        style = "think"
    else:
        text, *expected = HARMONY[case - len(THINK)]
        style, thinking = "harmony", False
    rng = np.random.default_rng(case)
    cuttings = [list(range(1, len(text)))] + [sorted(set(rng.integers(1, max(len(text), 2), 4).tolist()))
                                             for _ in range(20)]
    for cuts in cuttings:
        assert list(_streamed(text, style, thinking, [c for c in cuts if c < len(text)])) == expected, cuts


def test_what_a_piece_releases_is_certain():
    """A piece that may begin a marker is held; the rest goes out at once."""
    s = Splitter("think")
    assert s.push("<think>abc</th").reasoning == "abc"
    assert s.push("ink>\n").reasoning == "" and s.push("Answer").content == "Answer"
    h = Splitter("harmony")
    assert h.push("<|channel|>analysis<|message|>think<|e").reasoning == "think"
    assert h.push("nd|><|start|>assistant<|channel|>final<|message|>Hi").content == "Hi"


def test_styles_from_templates_and_prompts():
    assert style_of("{% if m.thinking %}<|channel|>analysis<|message|>{{ m.thinking }}<|end|>{% endif %}") == "harmony"
    assert style_of("{{ content.split('</think>')[-1] }}") == "think"
    assert style_of("{{ '<|im_start|>' + m.role }}") is None
    assert opens_thinking("<|im_start|>assistant\n<think>\n") and not opens_thinking("<|im_start|>assistant\n")
    with pytest.raises(ValueError):
        Splitter("xml")


# ------------------------------------------------------ the server's chat replies, from fixed pieces

def render(pieces: list[str], reasoning, tools: frozenset = frozenset()) -> tuple[list[dict], dict]:
    """A ChatRenderer's streamed deltas for a reply arriving in these pieces, and its whole body's message."""
    from llogos_cli.engine.batch import Result
    from llogos_cli.engine.completion import Timings, Token
    from llogos_cli.server.render import ChatRenderer, Envelope
    envelope = Envelope("chatcmpl-x", "m", None, None, False, tools, True, reasoning)
    result = Result("chatcmpl-x", "".join(pieces), [1] * len(pieces), "eos", Timings())
    streamed = ChatRenderer(envelope)
    chunks = [c for p in pieces if (c := streamed.token(Token(1, p))) is not None] + streamed.last(result)
    deltas = [json.loads(c[6:])["choices"][0]["delta"] for c in chunks]
    body = json.loads(ChatRenderer(envelope).choice(result).model_dump_json())["message"]
    return deltas, body


def joined(deltas: list[dict], field: str) -> str:
    return "".join(d.get(field) or "" for d in deltas)


def test_server_streams_reasoning_apart_and_the_body_agrees():
    pieces = ["<think>", "Weigh", " it.</th", "ink>\n\nPar", "is."]
    deltas, body = render(pieces, Reasoning("think"))
    assert joined(deltas, "reasoning_content") == body["reasoning_content"] == "Weigh it."
    assert joined(deltas, "content") == body["content"] == "Paris."
    assert not any("reasoning_content" in d and "content" in d and d["content"] for d in deltas[:2])
    harmony = ["<|channel|>analysis<|message|>", "Short.", "<|end|><|start|>assistant", "<|channel|>final<|message|>",
               "Hi", "!"]
    deltas, body = render(harmony, Reasoning("harmony"))
    assert (joined(deltas, "reasoning_content"), joined(deltas, "content")) == ("Short.", "Hi!")
    assert (body["reasoning_content"], body["content"]) == ("Short.", "Hi!")


def test_without_a_reasoning_style_the_reply_is_as_written_and_has_no_reasoning_field():
    deltas, body = render(["<think>a</think>", "b"], None)
    assert joined(deltas, "content") == body["content"] == "<think>a</think>b"
    assert "reasoning_content" not in body and not any("reasoning_content" in d for d in deltas)


def test_tool_calls_are_read_from_the_answer_not_the_reasoning():
    pieces = ["<think>Call <tool_call> it?</think>", '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>']
    deltas, body = render(pieces, Reasoning("think"), frozenset({"get_weather"}))
    assert body["reasoning_content"] == "Call <tool_call> it?" and body["tool_calls"][0]["function"]["name"] == "get_weather"
    assert joined(deltas, "reasoning_content") == "Call <tool_call> it?"
    assert [c["function"]["name"] for d in deltas for c in d.get("tool_calls", [])] == ["get_weather"]


# ------------------------------------------------------------- templates, stops and requests

HARMONY_TEMPLATE = ("{%- for m in messages %}<|start|>{{ m.role }}{% if m.role == 'assistant' %}<|channel|>final"
                    "{% endif %}<|message|>{{ m.content }}<|end|>{% endfor -%}"
                    "{%- if add_generation_prompt %}<|start|>assistant{% endif %}")
THINK_TEMPLATE = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content.split('</think>')[-1] }}<|im_end|>\n"
                  "{% endfor -%}{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")


def test_harmony_replies_run_past_each_message_s_end():
    """gpt-oss ends every message of a reply with <|end|> (its reasoning, then its answer) and the
    reply with <|return|>: <|end|> is no stop for a harmony template, though the template names it."""
    from tests.vocab_fixtures import tokenizer
    o200k = tokenizer("o200k")
    harmony = ChatFormat(ChatTemplate(HARMONY_TEMPLATE, "test"), o200k)
    end = o200k.token_id("<|end|>")
    assert end not in harmony.stop_ids() and "<|end|>" not in harmony.stop_strings()
    assert harmony.reasoning(harmony.text([Message("user", "hi")])) == Reasoning("harmony")
    chatml = ChatFormat(ChatTemplate("{{ m }}<|end|>", "test"), o200k)
    assert end in chatml.stop_ids() and chatml.reasoning("x") is None


def test_a_server_request_says_how_its_reply_is_split(tmp_path):
    from llogos_cli.gguf.file import GGUFFile
    from llogos_cli.server.prepare import RequestDefaults, prepare_chat
    from llogos_cli.server.schemas import ChatCompletionRequest
    from llogos_cli.tokenizer.tokenizer import Tokenizer
    from tests.conftest import FIXTURES, need
    tok = Tokenizer.from_gguf(GGUFFile(need(FIXTURES / "tiny-llama-f32.gguf")))
    body = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}]})
    think = ChatFormat(ChatTemplate(THINK_TEMPLATE, "test"), tok)
    assert prepare_chat(body, tok, think, RequestDefaults(SamplingParams(), 8), 256).reasoning == Reasoning("think", True)
    off = RequestDefaults(SamplingParams(), 8, split_reasoning=False)
    assert prepare_chat(body, tok, think, off, 256).reasoning is None


SWITCHED_TEMPLATE = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor -%}"
                     "{%- if reasoning_effort is defined %}effort: {{ reasoning_effort }}\n{% endif -%}"
                     "<|im_start|>assistant\n<think>\n"
                     "{%- if enable_thinking is defined and not enable_thinking %}\n</think>\n\n{% endif %}")


def test_a_request_s_reasoning_format_and_template_kwargs_are_its_own(tmp_path):
    from llogos_cli.gguf.file import GGUFFile
    from llogos_cli.server.prepare import RequestDefaults, prepare_chat
    from llogos_cli.server.schemas import ChatCompletionRequest
    from llogos_cli.tokenizer.tokenizer import Tokenizer
    from tests.conftest import FIXTURES, need
    tok = Tokenizer.from_gguf(GGUFFile(need(FIXTURES / "tiny-llama-f32.gguf")))
    fmt = ChatFormat(ChatTemplate(SWITCHED_TEMPLATE, "test"), tok)
    on, off = RequestDefaults(SamplingParams(), 8), RequestDefaults(SamplingParams(), 8, split_reasoning=False)

    def prepared(defaults=on, **fields):
        body = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})
        return prepare_chat(body, tok, fmt, defaults, 256)

    assert prepared(reasoning_format="none").reasoning is None
    assert prepared(off, reasoning_format="deepseek").reasoning == Reasoning("think", True)
    assert prepared(off).reasoning is None
    plain = prepared()
    assert plain.reasoning == Reasoning("think", True)
    unthinking = prepared(chat_template_kwargs={"enable_thinking": False})
    assert tok.decode(unthinking.requests[0].prompt).endswith("</think>\n\n")
    assert unthinking.reasoning == Reasoning("think", False)   # the template closed the reasoning itself
    effort = prepared(reasoning_effort="low", chat_template_kwargs={"messages": []})   # no kwarg replaces the messages
    assert "effort: low\n" in tok.decode(effort.requests[0].prompt)
    assert "hi" in tok.decode(effort.requests[0].prompt)


# --------------------------------------------------------------------------- `llogos chat`

def test_chat_keeps_the_answer_and_shows_the_reasoning_apart():
    """A template whose prompt opens <think>: a reply that never closes it is all reasoning (a tiny
    random model's), sent to `think`, and the conversation keeps only the answer."""
    from llogos_cli.engine.batch import BatchEngine
    from llogos_cli.engine.chat import Chat
    from llogos_cli.model.loader import load
    from tests.conftest import FIXTURES, need
    m = load(str(need(FIXTURES / "tiny-llama-f32.gguf")), "cpu", n_ctx=128)
    fmt = ChatFormat(ChatTemplate(THINK_TEMPLATE, "test"), m.tokenizer)
    replies = {}
    for split_reasoning in (True, False):
        engine = BatchEngine(m.model, m.tokenizer, 1, 128, keep_slots=True)
        chat = Chat(fmt, engine, SamplingParams(temp=0.0), 10, [Message("user", "hi")], split_reasoning)
        answered, thought = [], []
        reply = chat.respond(answered.append, think=thought.append)
        replies[split_reasoning] = reply
        assert "".join(answered) == reply.text and "".join(thought) == reply.reasoning
        assert chat.messages[-1] == Message("assistant", reply.text)
    whole = replies[False].text
    assert "</think>" not in whole and len(whole) > 0
    assert (replies[True].reasoning, replies[True].text) == (whole, "")


# --------------------------------------------------------------------------- `llogos batch`

def test_a_batch_record_has_its_answer_as_text_and_its_reasoning_apart():
    from llogos_cli.engine.batch import Result
    from llogos_cli.engine.completion import Timings
    reply = "<think>Weigh it.</think>\n\nParis."
    record = Result(7, reply, [1, 2], "eos", Timings(), reasoning=Reasoning("think")).as_dict()
    assert (record["text"], record["reasoning_content"]) == ("Paris.", "Weigh it.")
    assert "reasoning_content" not in Result(7, reply, [1, 2], "eos", Timings()).as_dict()
    assert "reasoning_content" not in Result(7, "Paris.", [1], "eos", Timings(), reasoning=Reasoning("think")).as_dict()


def test_batch_lines_with_messages_split_their_reasoning_unless_told_not_to():
    """A template whose prompt opens <think>: a tiny random model's reply never closes it, so a
    messages line's record is all reasoning; with --reasoning-format none, all text. A prompt
    line is never split."""
    from llogos_cli.engine.batch import BatchEngine
    from llogos_cli.engine.stops import StopCriteria
    from llogos_cli.jobs.lines import LineDefaults, read_items
    from llogos_cli.model.loader import load
    from tests.conftest import FIXTURES, need
    m = load(str(need(FIXTURES / "tiny-llama-f32.gguf")), "cpu", n_ctx=128)
    fmt = ChatFormat(ChatTemplate(THINK_TEMPLATE, "test"), m.tokenizer)
    lines = [json.dumps({"id": "chat", "messages": [{"role": "user", "content": "hi"}]}),
             json.dumps({"id": "plain", "prompt": "<think>hi"})]
    records = {}
    for split_reasoning in (True, False):
        defaults = LineDefaults(SamplingParams(temp=0.0), StopCriteria(8), 0, 1, split_reasoning)
        engine = BatchEngine(m.model, m.tokenizer, 2, 128)
        requests = [item for _, item in read_items(lines, m.tokenizer, fmt, defaults)]
        records[split_reasoning] = {r.id: r.as_dict() for r in engine.generate(iter(requests))}
    whole = records[False]["chat"]["text"]
    assert whole and "</think>" not in whole and "reasoning_content" not in records[False]["chat"]
    assert (records[True]["chat"]["text"], records[True]["chat"]["reasoning_content"]) == ("", whole)
    plain = [records[split_reasoning]["plain"] for split_reasoning in (True, False)]
    assert plain[0]["text"] == plain[1]["text"] and "reasoning_content" not in plain[0]
