"""Chat templates: Jinja programs that turn a list of messages into the text a model was tuned on.

A template usually comes from the GGUF (`tokenizer.chat_template`), which makes it untrusted input
from a downloaded file. It runs in Jinja's immutable sandbox with no loader, so it can neither
reach Python internals nor read files, and it sees what HF transformers' `apply_chat_template`
gives it: `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, `raise_exception`,
`strftime_now` and a `tojson` that does not escape HTML. The sandbox (template_sandbox.py) also
bounds each render in time, memory and length, so a hostile template fails with one line.
"""

import functools
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import SecurityError

from llogos_cli.errors import LlogosError
from llogos_cli.tokenizer import template_sandbox

# Formats for models whose GGUF has no template, written in the shape HF templates take: every
# newline that matters is in a string literal, because trim_blocks eats the one after a tag.
BUILTIN = {
    "chatml": (
        "{% for m in messages %}"
        "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"),
    "llama3": (
        "{{ bos_token }}"
        "{% for m in messages %}"
        "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"),
    # Gemma has no system role: the system text opens the first turn after it. Its assistant is "model".
    "gemma": (
        "{{ bos_token }}"
        "{% set ns = namespace(prefix='') %}"
        "{% for m in messages %}"
        "{% if m['role'] == 'system' %}{% set ns.prefix = m['content'] + '\\n\\n' %}{% else %}"
        "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n'"
        " + ns.prefix + m['content'] | trim + '<end_of_turn>\\n' }}"
        "{% set ns.prefix = '' %}{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"),
    "phi3": (
        "{% for m in messages %}"
        "{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"),
}

# Markers that close a message in the formats above and in the templates models ship with. Those a
# template mentions end a reply, as a token where the vocabulary has one, else as text.
END_OF_TURN = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>", "<|endoftext|>",
               "<|end_of_text|>", "<end_of_utterance>", "<|eom_id|>")


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    source: str
    origin: str       # where it came from, for messages: "the GGUF", "built-in 'gemma'", a path

    @property
    def end_of_turn(self) -> tuple[str, ...]:
        return tuple(m for m in END_OF_TURN if m in self.source)

    def render(self, messages: list[dict], add_generation_prompt: bool,
               bos_token: str = "", eos_token: str = "", tools: list[dict] | None = None,
               variables: dict | None = None) -> str:
        """The prompt's text. `tools`: function schemas for tool-use templates, as apply_chat_template passes them;
        `variables`: more of the template's inputs (apply_chat_template's extra keyword arguments), which
        cannot replace these."""
        template = _compile(self.source, self.origin)
        try:
            given = dict(messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos_token,
                         eos_token=eos_token, tools=tools, documents=None)
            return template_sandbox.render(template, **{**(variables or {}), **given})
        except SecurityError as e:
            raise LlogosError(f"chat template from {self.origin} was stopped by the sandbox: {e}") from None
        except _Raised as e:
            raise LlogosError(f"chat template from {self.origin} refused the conversation: {e}") from None
        except jinja2.TemplateError as e:
            raise LlogosError(f"chat template from {self.origin} failed: {e}") from None
        except Exception as e:  # a template is untrusted code: whatever it raises is its own failure
            raise LlogosError(f"chat template from {self.origin} failed: {type(e).__name__}: {e}") from None


class _Raised(jinja2.TemplateError):
    """raise_exception() called by the template itself, usually to reject a conversation it cannot format."""


class _NoFiles(jinja2.BaseLoader):
    def get_source(self, environment, template):
        raise jinja2.TemplateNotFound(template, f"a chat template cannot include or import files ({template!r})")


def _raise_exception(message):
    raise _Raised(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's own tojson escapes <, > and & for HTML, which would change what the model reads.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    if len(fmt) > 1024:  # Python lets strftime write up to 256 characters per format character
        raise template_sandbox.LimitExceeded(f"strftime_now was given a format of {len(fmt):,} characters")
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=8)
def _compile(source: str, origin: str) -> jinja2.Template:
    env = template_sandbox.BoundedSandbox({"tojson": _tojson},
                                          {"raise_exception": _raise_exception, "strftime_now": _strftime_now},
                                          trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols],
                                          loader=_NoFiles())
    try:
        return env.from_source(source)
    except jinja2.TemplateSyntaxError as e:
        raise LlogosError(f"chat template from {origin} has a syntax error on line {e.lineno}: {e.message}") from None
    except SecurityError as e:
        raise LlogosError(f"chat template from {origin} was stopped by the sandbox: {e}") from None
    except Exception as e:  # the parser and compiler meet untrusted text too: deep nesting, odd literals
        raise LlogosError(f"chat template from {origin} cannot be compiled: {type(e).__name__}: {e}") from None


def resolve(file: Path | None, name: str | None, gguf_source: str | None,
            registry_name: str | None) -> ChatTemplate | None:
    """The template to use, in order: --chat-template-file, --chat-template NAME, the GGUF's own,
    the models.toml entry's built-in name. None when there is none at all."""
    if file is not None and name is not None:
        raise LlogosError("give either --chat-template or --chat-template-file, not both")
    if file is not None:
        try:
            return ChatTemplate(file.read_text(encoding="utf-8"), str(file))
        except (OSError, UnicodeDecodeError) as e:
            raise LlogosError(f"cannot read chat template file {file}: {e}") from None
    if name is not None:
        return builtin(name, "--chat-template")
    if gguf_source:
        return ChatTemplate(gguf_source, "the GGUF")
    if registry_name:
        return builtin(registry_name, "models.toml")
    return None


def builtin(name: str, asked_by: str) -> ChatTemplate:
    if name not in BUILTIN:
        raise LlogosError(f"{asked_by} names an unknown chat template '{name}' (known: {', '.join(BUILTIN)})")
    return ChatTemplate(BUILTIN[name], f"built-in '{name}'")

