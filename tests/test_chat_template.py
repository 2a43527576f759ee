"""Chat templates: HF-compatible rendering, the built-in formats, the sandbox, and which template wins."""

import json

import jinja2
import pytest

from llogos_cli.chat_template import BUILTIN, ChatTemplate, resolve
from llogos_cli.conversation import ChatFormat, Message
from llogos_cli.errors import LlogosError
from llogos_cli.gguf_file import GGUFFile
from llogos_cli.registry import find_entry
from llogos_cli.tokenizer import Tokenizer
from tests.conftest import FIXTURES, need

CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4."}, {"role": "user", "content": "  And 3+3? \n"}],
    [{"role": "user", "content": "Ünïcode <b>tags</b> & {{ braces }}"}, {"role": "assistant", "content": ""}],
]


def hf_render(source: str, messages: list[dict], add_generation_prompt: bool,
              bos_token: str = "", eos_token: str = "") -> str:
    """The rendering HF transformers' apply_chat_template documents, without its sandbox: Jinja with
    trim_blocks and lstrip_blocks, a tojson that leaves HTML alone, and raise_exception."""
    def raise_exception(message):
        raise jinja2.TemplateError(message)
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source).render(messages=messages, add_generation_prompt=add_generation_prompt,
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
