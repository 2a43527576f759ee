"""Chat messages: reading and writing them as JSON, and turning them into the model's prompt."""

import json
from dataclasses import dataclass
from pathlib import Path

from llogos_cli.errors import LlogosError
from llogos_cli.engine.reasoning import Reasoning, style_of
from llogos_cli.model.loader import ModelFile
from llogos_cli.tokenizer import chat_template
from llogos_cli.tokenizer.chat_template import ChatTemplate
from llogos_cli.tokenizer.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class Message:
    role: str        # "system", "user", "assistant" (templates may know others, such as "tool")
    content: str

    def as_dict(self) -> dict:
        return {"role": self.role, "content": self.content}


def parse_messages(data, origin: str) -> list[Message]:
    """Messages from decoded JSON: a list of {"role", "content"} objects, or {"messages": [...]}."""
    if isinstance(data, dict) and "messages" in data:
        data = data["messages"]
    if not isinstance(data, list):
        raise LlogosError(f"{origin}: expected a JSON list of messages or an object with \"messages\"")
    messages = []
    for i, m in enumerate(data):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and m["role"]
                and isinstance(m.get("content"), str)):
            raise LlogosError(f"{origin}: message {i} needs a \"role\" and a \"content\", both strings")
        messages.append(Message(m["role"], m["content"]))
    return messages


def read_messages(path: Path) -> list[Message]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise LlogosError(f"cannot read {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise LlogosError(f"{path} is not valid JSON: {e}") from None
    return parse_messages(data, str(path))


def write_messages(path: Path, messages: list[Message]) -> None:
    text = json.dumps([m.as_dict() for m in messages], ensure_ascii=False, indent=2) + "\n"
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise LlogosError(f"cannot write {path}: {e}") from None


def with_system(messages: list[Message], system: str | None) -> list[Message]:
    """The conversation with its system message replaced (or added, or with None kept as it is)."""
    if system is None:
        return list(messages)
    rest = messages[1:] if messages and messages[0].role == "system" else messages
    return [Message("system", system), *rest]


@dataclass(frozen=True, slots=True)
class ChatFormat:
    """A template and a tokenizer: messages -> the prompt's text and token ids, and what ends a reply."""
    template: ChatTemplate
    tokenizer: Tokenizer

    def _special(self, token_id: int | None) -> str:
        return "" if token_id is None else self.tokenizer.piece(token_id)

    def _body(self, messages: list[Message | dict], tools: list[dict] | None = None,
              variables: dict | None = None) -> str:
        """The rendered template less a leading BOS when the tokenizer adds one: templates often
        write bos_token themselves, and llama.cpp cuts theirs so that the prompt has only one.
        Messages may be dicts, for fields beyond role and content (an API's tool calls); `variables`
        are the template's own switches (enable_thinking, reasoning_effort...)."""
        tok = self.tokenizer
        bos = self._special(tok.bos_id)
        rendered = self.template.render([m if isinstance(m, dict) else m.as_dict() for m in messages], True, bos,
                                        self._special(tok.eos_id), tools, variables)
        return rendered[len(bos):] if tok.add_bos and bos and rendered.startswith(bos) else rendered

    def text(self, messages: list[Message | dict], tools: list[dict] | None = None,
             variables: dict | None = None) -> str:
        """Exactly what the model reads before its reply, BOS included where the tokenizer adds one."""
        body = self._body(messages, tools, variables)
        return self._special(self.tokenizer.bos_id) + body if self.tokenizer.add_bos else body

    def ids(self, messages: list[Message]) -> list[int]:
        return self.tokenizer.encode(self._body(messages))

    def _end_of_turn(self) -> tuple[str, ...]:
        # harmony's <|end|> closes each message of a reply (its reasoning, then its answer): the
        # reply ends at <|return|> or <|call|>, which the vocabulary has as end-of-generation tokens.
        harmony = style_of(self.template.source) == "harmony"
        return tuple(m for m in self.template.end_of_turn if not (harmony and m == "<|end|>"))

    def stop_ids(self) -> frozenset[int]:
        ids = (self.tokenizer.token_id(m) for m in self._end_of_turn())
        return frozenset(i for i in ids if i is not None)

    def stop_strings(self) -> tuple[str, ...]:
        """End-of-turn markers this vocabulary has no single token for, to be caught as text."""
        return tuple(m for m in self._end_of_turn() if self.tokenizer.token_id(m) is None)

    def reasoning(self, prompt: str) -> Reasoning | None:
        """How the reply to this rendered prompt writes its reasoning, if this model writes any."""
        return Reasoning.of(self.template.source, prompt)


def fit(fmt: ChatFormat, messages: list[Message], limit: int) -> tuple[list[Message], list[int]]:
    """Drop the oldest turns, never the system message, until the prompt has at most `limit` tokens.
    Returns the messages kept and the prompt's ids. A turn is a user message and what follows it,
    so what is left still starts with a user message, as strict templates demand."""
    head = messages[:1] if messages and messages[0].role == "system" else []
    rest = messages[len(head):]
    while True:
        ids = fmt.ids(head + rest)
        if len(ids) <= limit:
            return head + rest, ids
        if len(rest) <= 1:
            raise LlogosError(f"the conversation's last message alone needs {len(ids)} tokens, more than the "
                              f"{limit} the context has room for (raise it with -c/--ctx-size)")
        cut = next((i for i in range(1, len(rest)) if rest[i].role == "user"), len(rest) - 1)
        rest = rest[cut:]


@dataclass(frozen=True, slots=True)
class TemplateChoice:
    """The chat template asked for on the command line (--chat-template, --chat-template-file), if any."""
    chat_template: str | None = None
    chat_template_file: Path | None = None

    @property
    def given(self) -> bool:
        return bool(self.chat_template or self.chat_template_file)

    def format(self, mf: ModelFile) -> ChatFormat:
        """The chat format: these flags' template, else the GGUF's, else models.toml's."""
        template = chat_template.resolve(self.chat_template_file, self.chat_template,
                                         mf.file.meta.get("tokenizer.chat_template"),
                                         mf.entry.chat_template if mf.entry else None)
        if template is None:
            raise LlogosError("the model has no chat template (none in the GGUF or models.toml); choose one with "
                              f"--chat-template NAME ({', '.join(chat_template.BUILTIN)}) or --chat-template-file FILE")
        return ChatFormat(template, mf.tokenizer)

    def format_or_none(self, mf: ModelFile) -> ChatFormat | None:
        """The chat format for messages, where a model without a template can still run plain
        prompts: None unless a template was asked for on the command line."""
        try:
            return self.format(mf)
        except LlogosError:
            if self.given:
                raise
            return None
