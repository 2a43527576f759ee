"""Chat templates: HF-compatible rendering, the built-in formats, the sandbox, and which template wins."""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import jinja2
import pytest

from llogos_cli.engine.conversation import ChatFormat, Message
from llogos_cli.errors import LlogosError
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.registry import find_entry
from llogos_cli.tokenizer.chat_template import BUILTIN, ChatTemplate, resolve
from llogos_cli.tokenizer.tokenizer import Tokenizer
from tests.conftest import FIXTURES, need

CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4."}, {"role": "user", "content": "  And 3+3? \n"}],
    [{"role": "user", "content": "Ünïcode <b>tags</b> & {{ braces }}"}, {"role": "assistant", "content": ""}],
]


def hf_render(source: str, messages: list[dict], add_generation_prompt: bool,
              bos_token: str = "", eos_token: str = "", tools: list[dict] | None = None) -> str:
    """The rendering HF transformers' apply_chat_template does, without its sandbox: Jinja with
    trim_blocks, lstrip_blocks and loopcontrols, its tojson that leaves HTML alone, raise_exception,
    strftime_now, and the variables it passes."""
    def raise_exception(message):
        raise jinja2.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    return env.from_string(source).render(messages=messages, tools=tools, documents=None,
                                          add_generation_prompt=add_generation_prompt,
                                          bos_token=bos_token, eos_token=eos_token)


@pytest.fixture(scope="module")
def smollm_file(smollm_path):
    return GGUFFile(smollm_path)


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_smollm2_template_renders_as_transformers_does(smollm_file, conversation, add_generation_prompt):
    source = smollm_file.meta["tokenizer.chat_template"]
    ours = ChatTemplate(source, "the GGUF").render(conversation, add_generation_prompt, "<|im_start|>", "<|im_end|>")
    assert ours == hf_render(source, conversation, add_generation_prompt, "<|im_start|>", "<|im_end|>")


def test_smollm2_template_output_written_out(smollm_file):
    # SmolLM2's template adds its own system prompt when the conversation has none.
    source = smollm_file.meta["tokenizer.chat_template"]
    assert ChatTemplate(source, "the GGUF").render(CONVERSATIONS[0], True) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


EXPECTED_BUILTIN = {
    "chatml": "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
              "<|im_start|>assistant\n4.<|im_end|>\n<|im_start|>user\n  And 3+3? \n<|im_end|>\n"
              "<|im_start|>assistant\n",
    "llama3": "<BOS><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n4.<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nAnd 3+3?<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "gemma": "<BOS><start_of_turn>user\nYou are terse.\n\nWhat is 2+2?<end_of_turn>\n"
             "<start_of_turn>model\n4.<end_of_turn>\n<start_of_turn>user\nAnd 3+3?<end_of_turn>\n"
             "<start_of_turn>model\n",
    "phi3": "<|system|>\nYou are terse.<|end|>\n<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n4.<|end|>\n"
            "<|user|>\n  And 3+3? \n<|end|>\n<|assistant|>\n",
}


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_builtin_templates_produce_their_documented_formats(name):
    template = ChatTemplate(BUILTIN[name], name)
    assert template.render(CONVERSATIONS[1], True, "<BOS>", "<EOS>") == EXPECTED_BUILTIN[name]
    assert template.render(CONVERSATIONS[1], True, "<BOS>", "<EOS>") == \
        hf_render(BUILTIN[name], CONVERSATIONS[1], True, "<BOS>", "<EOS>")


def test_gemma_without_system_message_and_end_of_turn_markers():
    gemma = ChatTemplate(BUILTIN["gemma"], "gemma")
    assert gemma.render(CONVERSATIONS[0], False, "<bos>") == "<bos><start_of_turn>user\nHi<end_of_turn>\n"
    assert gemma.end_of_turn == ("<end_of_turn>",)
    assert ChatTemplate(BUILTIN["llama3"], "llama3").end_of_turn == ("<|eot_id|>",)


def test_tojson_does_not_escape_html():
    out = ChatTemplate("{{ messages | tojson }}", "test").render(CONVERSATIONS[2][:1], False)
    assert json.loads(out) == CONVERSATIONS[2][:1] and "<b>" in out and "Ü" in out


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__ }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ lipsum.__globals__['os'] }}",
    "{{ messages.append({'role': 'x'}) }}",
])
def test_sandbox_refuses_python_internals(source):
    with pytest.raises(LlogosError, match="stopped by the sandbox"):
        ChatTemplate(source, "test").render(CONVERSATIONS[0], True)


@pytest.mark.parametrize("source", ["{% include '/etc/passwd' %}", "{% import '/etc/hosts' as h %}",
                                    "{% extends '/etc/passwd' %}"])
def test_sandbox_refuses_file_access(source):
    with pytest.raises(LlogosError, match="cannot include or import files") as e:
        ChatTemplate(source, "test").render(CONVERSATIONS[0], True)
    assert "root:" not in str(e.value)


def test_raise_exception_is_reported_with_its_message():
    source = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('a system message must come first') }}{% endif %}"
    with pytest.raises(LlogosError, match="refused the conversation: a system message must come first"):
        ChatTemplate(source, "my.jinja").render(CONVERSATIONS[0], True)


def test_syntax_and_runtime_errors_are_one_line():
    with pytest.raises(LlogosError, match="syntax error on line 2"):
        ChatTemplate("ok\n{% for %}", "broken.jinja").render([], True)
    with pytest.raises(LlogosError, match="ZeroDivisionError"):
        ChatTemplate("{{ 1 / 0 }}", "broken.jinja").render([], True)


def test_resolution_order(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("from file")
    assert resolve(path, None, "gguf", "gemma").source == "from file"
    assert resolve(None, "phi3", "gguf", "gemma").source == BUILTIN["phi3"]
    assert resolve(None, None, "gguf", "gemma").origin == "the GGUF"
    assert resolve(None, None, None, "gemma").source == BUILTIN["gemma"]
    assert resolve(None, None, None, None) is None
    assert find_entry("gemma3-270m").chat_template == "gemma"


def test_resolution_errors(tmp_path):
    with pytest.raises(LlogosError, match="not both"):
        resolve(tmp_path / "t.jinja", "chatml", None, None)
    with pytest.raises(LlogosError, match="unknown chat template 'vicuna'.*chatml, llama3, gemma, phi3"):
        resolve(None, "vicuna", None, None)
    with pytest.raises(LlogosError, match="models.toml names an unknown chat template"):
        resolve(None, None, None, "vicuna")
    with pytest.raises(LlogosError, match="cannot read chat template file"):
        resolve(tmp_path / "missing.jinja", None, None, None)


def test_one_bos_when_template_and_tokenizer_both_add_it(gemma_path):
    tok = Tokenizer.from_gguf(GGUFFile(gemma_path))
    assert tok.add_bos
    fmt = ChatFormat(ChatTemplate(BUILTIN["gemma"], "gemma"), tok)
    messages = [Message("user", "Hi")]
    assert fmt.text(messages) == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    ids = fmt.ids(messages)
    assert ids[0] == tok.bos_id and tok.bos_id not in ids[1:]
    assert ids == tok.encode(fmt.text(messages), add_bos=False)
    assert fmt.stop_ids() == {tok.token_id("<end_of_turn>")} and fmt.stop_strings() == ()


def test_end_of_turn_without_a_token_is_a_stop_string():
    # The tiny fixture's vocabulary has <|im_end|> but no <end_of_turn>: Gemma's marker is caught as text.
    tok = Tokenizer.from_gguf(GGUFFile(need(FIXTURES / "tiny-llama-f32.gguf")))
    chatml = ChatFormat(ChatTemplate(BUILTIN["chatml"], "chatml"), tok)
    assert chatml.stop_ids() == {tok.token_id("<|im_end|>")} and chatml.stop_strings() == ()
    gemma = ChatFormat(ChatTemplate(BUILTIN["gemma"], "gemma"), tok)
    assert gemma.stop_ids() == frozenset() and gemma.stop_strings() == ("<end_of_turn>",)


# Constructs that real templates use (Llama 3.x, Qwen, Mistral, Phi, SmolLM, Gemma): loops with loop
# variables, namespaces, macros, call blocks, set blocks, ~, + and %, str.format, string methods,
# slicing, tests and the filters they lean on. The bounded sandbox must render them exactly as Jinja does.
CONSTRUCTS = """{%- set ns = namespace(system='', count=0, users=[]) -%}
{%- macro turn(role, text) -%}<|{{ role | upper }}|>{{ text | trim }}{{ caller() if caller is defined }}{%- endmacro -%}
{%- for m in messages -%}
{%- if loop.first and m['role'] == 'system' -%}{%- set ns.system = m['content'] ~ '\\n' -%}{%- continue -%}{%- endif -%}
{%- set ns.count = ns.count + 1 -%}
{%- if m.role == 'user' %}{% set ns.users = ns.users + [m.content] %}{% endif -%}
{{ turn(m.role, ns.system + m.content if loop.index0 == 1 else m.content) }}
{{- '[%d/%d]' % (loop.index, loop.length) }}{{ ' {}:{}'.format(m.role[:1], m.content | length) }}
{%- if not loop.last %}{{ loop.cycle('\\n', ' ') }}{% endif -%}
{%- endfor %}
{% set summary %}{{ ns.count }} turns, users said {{ ns.users | map('lower') | join(' / ') }}{% endset -%}
{{ summary.split(' ')[0] | int * 2 }} {{ summary | replace('turns', 'messages') }}
{% filter center(40) %}{{ messages | selectattr('role', 'equalto', 'user') | list | length }} user{% endfilter %}
{{ messages | map(attribute='role') | unique | sort | join(',') }} {{ (messages | last).content[::-1] }}
{{ {'tools': [{'name': 'get_weather', 'args': {'city': 'str'}}]} | tojson(indent=2) }}
{{ '-' * 20 }} {{ 2 ** 10 }} {{ 17 // 5 }} {{ 17 % 5 }} {{ range(3) | list }} {{ (messages | first).role.startswith('sys') }}
{%- for k, v in {'b': 1, 'a': 2} | dictsort %} {{ k }}={{ v }}{% endfor %}
{% call turn('tool', 'result') %} (called){% endcall %}
{{ 'x\\ny' | indent(2, first=True) }} {{ messages[1:] | batch(2) | list | length }} {{ messages | sum(attribute='content', start='') if false }}
{%- if add_generation_prompt %}{{ '\\n<|assistant|>' }}{% endif -%}"""


@pytest.mark.parametrize("conversation", CONVERSATIONS[1:2])
def test_constructs_real_templates_use_render_as_jinja_does(conversation):
    ours = ChatTemplate(CONSTRUCTS, "constructs").render(conversation, True, "<s>", "</s>")
    assert ours == hf_render(CONSTRUCTS, conversation, True, "<s>", "</s>")
    assert "3 messages" in ours and "<|ASSISTANT|>4." in ours


# Real models' templates, written out in their shapes (tests/chat_templates/*.jinja): chat and tool
# use, reasoning, typed content parts. Each must render exactly as plain Jinja renders it, and each
# case names a piece of the output that shows the branch it is there for really ran.
TEMPLATES = Path(__file__).parent / "chat_templates"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city's name"}},
                   "required": ["city"]}}}
CALL = {"id": "call00001", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
TOOL_CHAT = [
    {"role": "system", "content": "You plan trips."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call00001", "content": '{"temperature_c": 18}'},
    {"role": "assistant", "content": "It is 18 °C in Paris."},
    {"role": "user", "content": "And in <b>Zürich</b>?"},
]
THINKING_CHAT = [
    {"role": "user", "content": "Is 91 prime?"},
    {"role": "assistant", "content": "<think>\n91 = 7 * 13.\n</think>\n\nNo: 91 is 7 times 13."},
    {"role": "user", "content": "And 97?"},
    {"role": "assistant", "content": "<think>\nNo divisor up to 9.\n</think>\n\nYes.", "tool_calls": [CALL]},
]
PARTS_CHAT = [
    {"role": "system", "content": [{"type": "text", "text": "Describe images."}]},
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " What is this? "}]},
]
REASONING_CHAT = [
    {"role": "system", "content": "Enable deep thinking subroutine."},
    {"role": "user", "content": "<think> Why is the sky blue?"},
    {"role": "assistant", "content": "<think>\r\nRayleigh.\r\n</think>\r\nScattering."},
    {"role": "user", "content": "Thanks!"},
]
PHI_TOOL_CHAT = [{"role": "system", "content": "You plan trips.", "tools": json.dumps([WEATHER["function"]])},
                 *TOOL_CHAT[1:]]

REAL_TEMPLATES = [   # template, conversation, tools, a piece of the output
    ("qwen2.5-tools", CONVERSATIONS[1], None, "<|im_start|>system\nYou are terse.<|im_end|>"),
    ("qwen2.5-tools", TOOL_CHAT, [WEATHER], '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'),
    ("qwen3-tools", TOOL_CHAT, [WEATHER], '<|im_start|>user\n<tool_response>\n{"temperature_c": 18}'),
    ("qwen3-tools", THINKING_CHAT, None, "<think>\nNo divisor up to 9.\n</think>\n\nYes.\n<tool_call>"),
    ("llama3.1-tools", CONVERSATIONS[1], None, "Today Date: 26 Jul 2024\n\nYou are terse.<|eot_id|>"),
    ("llama3.1-tools", TOOL_CHAT, [WEATHER], '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>'),
    ("llama3.2-tools", TOOL_CHAT, [WEATHER], '\n    "function": {\n        "name": "get_weather"'),
    ("mistral-v3-tools", CONVERSATIONS[1], None, "[INST] You are terse.\n\n  And 3+3? \n[/INST]"),
    ("mistral-v3-tools", TOOL_CHAT, [WEATHER],
     '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "call00001"}]</s>[TOOL_RESULTS]'),
    ("gemma3", CONVERSATIONS[1], None, "<start_of_turn>model\n4.<end_of_turn>"),
    ("gemma3", PARTS_CHAT, None, "<start_of_turn>user\nDescribe images.\n\n<start_of_image>What is this?<end_of_turn>"),
    ("phi3.5", CONVERSATIONS[1], None, "<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n4.<|end|>"),
    ("phi4-mini-tools", PHI_TOOL_CHAT, None, '<|tool|>[{"name": "get_weather"'),
    ("llama3-reasoning", REASONING_CHAT, None, "<think>Why is the sky blue?<|eot_id|>"),
]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("name, conversation, tools, piece", REAL_TEMPLATES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(REAL_TEMPLATES)])
def test_real_templates_render_as_jinja_does(name, conversation, tools, piece, add_generation_prompt):
    source = (TEMPLATES / f"{name}.jinja").read_text()
    ours = ChatTemplate(source, name).render(conversation, add_generation_prompt, "<s>", "</s>", tools)
    assert ours == hf_render(source, conversation, add_generation_prompt, "<s>", "</s>", tools)
    assert piece in ours


def test_method_calls_in_loops_and_blocks_are_still_sized():
    # Jinja adds the loop's and block's variables to calls made there: the sizing must see past them.
    ok = "{% for m in messages %}{{ m.content.replace('i', 'ii').center(6, '*') }}{% endfor %}"
    assert ChatTemplate(ok, "t").render(CONVERSATIONS[0], False) == "*Hii**"
    block = "{% block b %}{{ ','.join(['a', 'b']).zfill(4) }}{% endblock %}"
    assert ChatTemplate(block, "t").render([], False) == "0a,b"
    for source in ("{% for m in messages %}{{ ('a' * 100000).replace('a', 'b' * 100000) }}{% endfor %}",
                   "{% block b %}{{ 'a'.center(10**10) }}{% endblock %}"):
        with pytest.raises(LlogosError, match="would build"):
            ChatTemplate(source, "t").render(CONVERSATIONS[0], False)


# Each hostile template asks for far more memory or time than any chat needs. The runner renders them
# one after another in a fresh interpreter (so its peak resident memory means something) under a hard
# address-space limit (so a regression cannot take the machine down), and reports per template.
# Cases that grow output or memory a step at a time may meet the clock first on a loaded machine.
SLOW_MACHINE = "ran longer than"
HOSTILE = {
    "string repetition": ("{{ 'a' * 10**10 }}", "would build 10,000,000,000 characters"),
    "list repetition": ("{{ [1, 2] * 10000000000 }}", "would build"),
    "repetition of a repetition": ("{{ ('a' * 1000000) * 1000 }}", "would build"),
    "huge power": ("{{ 2 ** 100000000 }}", "bits in an integer"),
    "squaring in a loop": ("{% set ns = namespace(x=3) %}{% for i in range(64) %}{% set ns.x = ns.x * ns.x %}"
                           "{% endfor %}", "bits in an integer"),
    "nested loops": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                     "ran longer than"),
    "nested loops writing": ("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
                             ("would build", SLOW_MACHINE)),
    "loop over a long string": ("{% for c in 'a' * 1000000 %}{% for d in 'b' * 1000000 %}{% endfor %}{% endfor %}",
                                "ran longer than"),
    "endless recursion": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "RecursionError"),
    "exponential recursion": ("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% else %}xxxxxxxx{% endif %}"
                              "{% endmacro %}{{ f(60) }}", "ran longer than"),
    "namespace doubling with ~": ("{% set ns = namespace(s='a') %}{% for i in range(100) %}"
                                  "{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "would build"),
    "namespace doubling with +": ("{% set ns = namespace(s='a') %}{% for i in range(100) %}"
                                  "{% set ns.s = ns.s + ns.s %}{% endfor %}", "would build"),
    "set block doubling": ("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set s %}{{ ns.s }}{{ ns.s }}"
                           "{% endset %}{% set ns.s = s %}{% endfor %}", "would build"),
    "repetition inside a loop": ("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
                                 "{% set ns.l = ns.l + ['a' * 1000000] %}{% endfor %}", ("MB of memory", SLOW_MACHINE)),
    "growing nest of literals": ("{% set ns = namespace(d=none) %}{% for i in range(100000) %}{% for j in range(100000) %}"
                                 "{% set ns.d = {'a': ns.d, 'b': [1, 2, 3, 4, 5, 6, 7, 8]} %}{% endfor %}{% endfor %}",
                                 "ran longer than"),
    "join filter": ("{{ (['a' * 1000000] * 1000) | join }}", "would build"),
    "join method": ("{{ ','.join(['a' * 1000000] * 1000) }}", "would build"),
    "huge range": ("{{ range(10**10) | list }}", "Range too big"),
    "center method": ("{{ 'a'.center(10**10) }}", "would build"),
    "center filter": ("{{ 'a' | center(10000000000) }}", "would build"),
    "indent filter": ("{{ ('a\\n' * 100000) | indent(100000) }}", "would build"),
    "wordwrap filter": ("{{ ('a ' * 500000) | wordwrap(1, wrapstring='x' * 1000) }}", "would build"),
    "percent width": ("{{ '%999999999d' % 1 }}", "would build"),
    "percent star width": ("{{ '%*d' % (999999999, 1) }}", "would build"),
    "format filter width": ("{{ '%999999999d' | format(1) }}", "would build"),
    "format method width": ("{{ '{:>{w}}'.format(1, w=999999999) }}", "would build"),
    "replace method": ("{{ ('a' * 100000).replace('a', 'b' * 100000) }}", "would build"),
    "replace filter": ("{{ ('a' * 100000) | replace('a', 'b' * 100000) }}", "would build"),
    "printing an aliased list": ("{% set x = 'a' * 1000000 %}{{ [x] * 1000 }}", "would build"),
    "tojson of an aliased list": ("{% set x = 'a' * 1000000 %}{{ ([x] * 1000) | tojson }}", "would build"),
    "tojson indent": ("{{ [[[1]]] | tojson(indent=1000000000) }}", "would build"),
    "int to_bytes": ("{{ (1).to_bytes(10000000000, 'big') }}", "would build"),
    "batch padding": ("{{ [1] | batch(10000000000, 0) | list }}", "would build"),
    "round precision": ("{{ 1.5 | round(1000000000, 'floor') }}", "bits in an integer"),
    "sum of lists": ("{{ ([['a'] * 1000000] * 1000) | sum(start=[]) }}", "would build"),
    "chain of lazy filters": ("{{ ('a' * 1000000)" + " | map('upper')" * 12 + " | list | length }}", "ran longer than"),
    "lipsum": ("{{ lipsum(10000000) }}", "would build"),
    "expandtabs": ("{{ ('\\t' * 1000000).expandtabs(100000) }}", "would build"),
    "block called again": ("{% block b %}x{% endblock %}{{ self.b() }}", "cannot call its blocks"),
    "strftime format": ("{{ strftime_now('%c' * 100000) }}", "strftime_now was given a format"),
    "huge source": ("{{ 1 }}" * 100000, "characters of template source"),
}

RUNNER = """
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
from llogos_cli.errors import LlogosError
from llogos_cli.tokenizer.chat_template import ChatTemplate
def peak(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
start = peak()
for name, source in json.load(sys.stdin).items():
    t0 = time.monotonic()
    try:
        error = 'rendered ' + str(len(ChatTemplate(source, 'hostile.jinja').render([{'role': 'user', 'content': 'Hi'}], True)))
    except LlogosError as e:
        error = str(e)
    print(json.dumps({'name': name, 'seconds': time.monotonic() - t0, 'growth': peak() - start, 'error': error}), flush=True)
"""


@pytest.fixture(scope="module")
def hostile_results():
    r = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps({k: v[0] for k, v in HOSTILE.items()}),
                       capture_output=True, text=True, timeout=600)
    results = {row["name"]: row for row in map(json.loads, r.stdout.splitlines())}
    assert r.returncode == 0 and len(results) == len(HOSTILE), r.stderr[-2000:]
    return results


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_template_fails_quickly_with_one_line_and_little_memory(hostile_results, name):
    row = hostile_results[name]
    assert row["error"].startswith("chat template from hostile.jinja ") and "\n" not in row["error"]
    expected = HOSTILE[name][1]
    assert any(fragment in row["error"] for fragment in ((expected,) if isinstance(expected, str) else expected))
    assert "MemoryError" not in row["error"]
    assert row["seconds"] < 5
    assert row["growth"] < 256 << 20, f"peak memory grew by {row['growth'] >> 20} MB"


def test_hostile_template_on_the_command_line(tmp_path):
    template = tmp_path / "hostile.jinja"
    template.write_text("{% for m in messages %}{{ m.content * 10**10 }}{% endfor %}")
    r = subprocess.run([sys.executable, "-m", "llogos_cli", "chat", "-m", str(need(FIXTURES / "tiny-llama-f32.gguf")),
                        "--chat-template-file", str(template), "--print-prompt"], input="Hi\n", capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, NO_COLOR="1"))
    assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0, r.stderr
    assert r.stderr.startswith(f"error: chat template from {template} was stopped by the sandbox: it would build")


def test_threads_render_a_shared_template_as_one_thread_does():
    """The server renders every request's messages with one compiled template, from many threads."""
    template = ChatTemplate((Path(__file__).parent / "chat_templates" / "qwen2.5-tools.jinja").read_text(), "test")
    conversations = [[{"role": "system", "content": f"Rule {i}: {'é' * (i % 5)}"},
                      {"role": "user", "content": f"Question {i} {'日本' * (i % 3)} " + "x" * i}] for i in range(64)]
    alone = [template.render(c, True) for c in conversations]
    with ThreadPoolExecutor(16) as pool:
        assert list(pool.map(lambda c: template.render(c, True), conversations)) == alone
