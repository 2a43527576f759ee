"""A reply's reasoning apart from its answer, as it streams.

Two ways models write their reasoning before the answer:
- "think": between <think> and </think> at the reply's start (Qwen3, DeepSeek-R1, SmolLM3). A
  template that opens the tag itself (its generation prompt ends with <think>) leaves the reply
  starting inside it; the answer's leading blank lines are dropped, as llama.cpp drops them.
- "harmony": gpt-oss's channels, one message each: <|channel|>analysis<|message|>...<|end|> is
  reasoning, <|start|>assistant<|channel|>final<|message|>... the answer (commentary counts as
  answer). Its markers are in the reply's text: llama.cpp's vocabulary, and llogos', always shows them.
  A message to a tool (a recipient, `to=functions.NAME`, in its header) is released whole, header
  and markers included, as answer: the server reads the call from it.

A Splitter takes the reply's text piece by piece and releases what is certain: a piece that may
be the start of a marker is held until the next one says. Nothing of the text is lost: every
character is released once, as reasoning, as answer, or (markers) as neither.
"""

from dataclasses import dataclass

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CHANNEL, MESSAGE = "<|channel|>", "<|message|>"
_HARMONY_ENDS = ("<|end|>", "<|return|>", "<|call|>")   # what closes a message
RECIPIENT = "to="   # in a header: the message is addressed to a tool
_HARMONY_HEADS = ("<|", RECIPIENT)   # how a message's header may begin (the recipient may come first)
STYLES = ("think", "harmony")


def style_of(template_source: str) -> str | None:
    """The reasoning style a chat template's model writes in, or None for a model without one."""
    if CHANNEL in template_source and MESSAGE in template_source:
        return "harmony"
    if THINK_CLOSE in template_source:
        return "think"
    return None


def opens_thinking(prompt: str) -> bool:
    """Whether a rendered prompt leaves the reply inside <think> (its generation prompt opened it)."""
    return prompt.rstrip().endswith(THINK_OPEN)


@dataclass(slots=True)
class Split:
    reasoning: str = ""
    content: str = ""

    def __iadd__(self, other: "Split") -> "Split":
        self.reasoning += other.reasoning
        self.content += other.content
        return self


def _partial(text: str, markers: tuple[str, ...]) -> int:
    """The length of text's longest tail that is a proper beginning of one of the markers."""
    return max((n for m in markers for n in range(1, min(len(m) - 1, len(text)) + 1) if text.endswith(m[:n])),
               default=0)


class Splitter:
    """push(text) -> the Split released by it; finish() -> what was held, at the reply's end."""

    def __init__(self, style: str, thinking: bool = False):
        if style not in STYLES:
            raise ValueError(f"unknown reasoning style {style!r}")
        self.style = style
        self._held = ""
        # think: "start" (a <think> may come), "reasoning", "gap" (blank lines after </think>), "answer"
        # harmony: "header" (up to <|message|>), "analysis" or "final" (a message's body), "call" (a
        # message to a tool, released with its markers)
        self._state = ("reasoning" if thinking else "start") if style == "think" else "header"

    def push(self, text: str) -> Split:
        self._held += text
        out = Split()
        while True:
            step = self._think() if self.style == "think" else self._harmony()
            if step is None:
                return out
            out += step

    def finish(self) -> Split:
        """The held text, released as the state it was in: an unclosed <think> is reasoning."""
        held, self._held = self._held, ""
        if self._state in ("reasoning", "analysis"):
            return Split(reasoning=held)
        if self._state == "header":   # a message's header, cut short: markers, not text
            return Split()
        return Split(content=held.lstrip() if self._state == "gap" else held)

    # Each step consumes what it can decide from the held text and returns what it releases, or None
    # when the held text says nothing more until more comes.

    def _think(self) -> Split | None:
        held = self._held
        if not held:
            return None
        if self._state == "start":
            stripped = held.lstrip()
            if stripped.startswith(THINK_OPEN):
                self._held, self._state = stripped[len(THINK_OPEN):], "reasoning"
                return Split()
            if not stripped or THINK_OPEN.startswith(stripped):
                return None   # blank so far, or the beginning of <think>
            self._state = "answer"
            return Split()
        if self._state == "reasoning":
            at = held.find(THINK_CLOSE)
            if at >= 0:
                self._held, self._state = held[at + len(THINK_CLOSE):], "gap"
                return Split(reasoning=held[:at])
            keep = _partial(held, (THINK_CLOSE,))
            if keep == len(held):
                return None
            self._held = held[len(held) - keep:]
            return Split(reasoning=held[:len(held) - keep])
        if self._state == "gap":
            stripped = held.lstrip()
            if not stripped:
                self._held = ""
                return None
            self._held, self._state = stripped, "answer"
            return Split()
        self._held = ""
        return Split(content=held)

    def _harmony(self) -> Split | None:
        held = self._held
        if not held:
            return None
        if self._state == "header":
            head = held.lstrip()
            if not any(head.startswith(m) or m.startswith(head) for m in _HARMONY_HEADS):
                self._state = "final"   # not a harmony message after all: all of it is answer
                return Split()
            at = held.find(MESSAGE)
            if at < 0:
                return None
            header = held[:at]
            if RECIPIENT in header:
                self._state = "call"
                self._held = held[at + len(MESSAGE):]
                return Split(content=header + MESSAGE)
            channel = header.split(CHANNEL, 1)[1].split() if CHANNEL in header else []
            self._state = "analysis" if channel[:1] == ["analysis"] else "final"
            self._held = held[at + len(MESSAGE):]
            return Split()
        analysis, call = self._state == "analysis", self._state == "call"
        ends = [(held.find(m), m) for m in _HARMONY_ENDS if m in held]
        if ends:
            at, marker = min(ends)
            body, self._held = held[:at] + (marker if call else ""), held[at + len(marker):]
            self._state = "header"
        else:
            keep = _partial(held, _HARMONY_ENDS)
            if keep == len(held):
                return None
            body, self._held = held[:len(held) - keep], held[len(held) - keep:]
        return Split(reasoning=body) if analysis else Split(content=body)


def split(text: str, style: str, thinking: bool = False) -> Split:
    """A whole reply's reasoning and answer."""
    s = Splitter(style, thinking)
    out = s.push(text)
    out += s.finish()
    return out


@dataclass(frozen=True, slots=True)
class Reasoning:
    """How one reply is split: its model's style, and whether its prompt opened <think>."""
    style: str
    thinking: bool = False

    @classmethod
    def of(cls, template_source: str, prompt: str) -> "Reasoning | None":
        style = style_of(template_source)
        return None if style is None else cls(style, style == "think" and opens_thinking(prompt))

    def splitter(self) -> Splitter:
        return Splitter(self.style, self.thinking)

    def split(self, text: str) -> Split:
        return split(text, self.style, self.thinking)
