"""`llogos batch` input: JSON lines or plain text, one prompt per line, turned into engine Requests.

A JSON line is {"id", "prompt"} or {"id", "messages"} with optional overrides of the sampling
and stop flags, and optionally a "json_schema" (a schema object) or a "grammar" (GBNF text) that
constrains that line's output alone; a line without "id" gets its line number. Its fields are
read with the server's request schema (RequestFields, in pydantic), so that a field means and is
checked the same in a batch line as in a request to `llogos serve`. A file whose first
non-blank line is not a JSON object is plain text: each non-blank line is a prompt, its id the
line number. A line that cannot become a request is reported as an error of its own and never
stops the others.
"""

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Annotated

from pydantic import Field, ValidationError, model_validator

from llogos_cli.engine.batch import Request, row_seed
from llogos_cli.engine.conversation import ChatFormat, Message
from llogos_cli.engine.grammar import Grammar
from llogos_cli.engine.sampling import DRAW_SEED, SamplingParams
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.errors import LlogosError
from llogos_cli.server.schemas import ChatMessage, RequestFields, explain


@dataclass(frozen=True, slots=True)
class LineDefaults:
    """What a line does not say: the command line's flags."""
    params: SamplingParams
    criteria: StopCriteria
    n_logprobs: int
    seed: int                  # the run's seed (--seed, or drawn at start) from which each row's own is made
    split_reasoning: bool = True   # --reasoning-format auto: a chat reply's reasoning apart from its "text"


@dataclass(frozen=True, slots=True)
class Done:
    """What earlier runs wrote, for --resume: the ids (JSON-spelled) with results, and how many
    error lines were taken out of the output so that their prompts run again."""
    ids: frozenset[str] = frozenset()
    failed: int = 0

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True, slots=True)
class LineError:
    id: object
    line: int
    error: str

    def as_dict(self) -> dict:
        return {"id": self.id, "line": self.line, "error": self.error}


@dataclass(frozen=True, slots=True)
class Line:
    """An input line that parsed: its id, its line number and its fields, not yet a request."""
    id: object
    number: int
    fields: dict


def read_items(lines: Iterable[str], tokenizer, chat: ChatFormat | None, defaults: LineDefaults,
               done: Done = Done()) -> Iterator[tuple[int, Request | LineError]]:
    """Requests (or LineErrors) in input order, each with its line number; what is `done` already
    (for --resume) is passed over."""
    for item in read_lines(lines, done):
        if isinstance(item, LineError):
            yield item.line, item
        else:
            yield item.number, to_request(item, tokenizer, chat, defaults)


def read_lines(lines: Iterable[str], done: Done = Done()) -> Iterator[Line | LineError]:
    """The first half of read_items, which needs no model: each line parsed and given its id, what
    is done passed over and repeated ids reported. Whether the input is JSON is decided by
    its first non-blank line, and duplicates by all lines before, so this runs over the whole input
    in one place; to_request, the second half, can then run anywhere."""
    seen: dict[str, int] = {}   # id -> the line that has it
    is_json = None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if is_json is None:
            is_json = line.lstrip().startswith("{")
        try:
            fields = _parse_json(line) if is_json else {"prompt": line.rstrip("\r\n")}
        except LlogosError as e:
            yield LineError(number, number, str(e))
            continue
        rid = fields.get("id", number)
        key = json.dumps(rid, sort_keys=True)
        if key in seen:
            yield LineError(rid, number, f"duplicate id {key}: line {seen[key]} has it, so this line is not run "
                                         "(each line needs its own id)")
            continue
        seen[key] = number   # done or not, so that a later line repeating it is still caught
        if key not in done.ids:
            yield Line(rid, number, fields)


def to_request(line: Line, tokenizer, chat: ChatFormat | None, defaults: LineDefaults) -> Request | LineError:
    """The line's request, or the LineError that says why it cannot be one."""
    try:
        return _request(line.id, line.fields, tokenizer, chat, defaults)
    except LlogosError as e:
        return LineError(line.id, line.number, str(e))


def _parse_json(line: str) -> dict:
    try:
        fields = json.loads(line)
    except json.JSONDecodeError as e:
        # json's messages are capitalised and some end in "at", expecting a position to follow.
        what = e.msg.removesuffix(" at")
        where = "the end of the line" if e.pos >= len(line.rstrip()) else f"column {e.pos + 1}"
        raise LlogosError(f"{what[0].lower()}{what[1:]} at {where}: not valid JSON") from None
    if not isinstance(fields, dict):
        raise LlogosError("a line must be a JSON object with \"prompt\" or \"messages\"")
    rid = fields.get("id")
    if rid is not None and (isinstance(rid, bool) or not isinstance(rid, (str, int))):
        raise LlogosError("\"id\" must be a string or an integer")
    return fields


class BatchLine(RequestFields):
    """A JSON line: the server's request fields (RequestFields), its id, and its prompt or messages."""
    id: str | int | None = None
    prompt: str | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)] | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    logprobs: Annotated[int, Field(ge=0)] | bool | None = None   # top log-probabilities per token (true: 1)

    @model_validator(mode="after")
    def _prompt_or_messages(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of \"prompt\" and \"messages\"")
        return self


def _request(rid, fields: dict, tokenizer, chat: ChatFormat | None, d: LineDefaults) -> Request:
    try:
        line = BatchLine.model_validate(fields)
    except ValidationError as e:
        raise LlogosError(explain(e.errors())) from None
    given = line.model_fields_set
    criteria, reasoning = d.criteria, None
    if line.stop is not None:
        criteria = replace(criteria, stop_strings=line.stops)
    if line.messages is not None:
        if chat is None:
            raise LlogosError("\"messages\" needs a chat template (the model has none; see --chat-template)")
        text = chat.text([Message(m.role, m.text) for m in line.messages])
        ids = tokenizer.encode(text, add_bos=False)
        criteria = replace(criteria, stop_strings=criteria.stop_strings + chat.stop_strings(),
                           stop_ids=criteria.stop_ids | chat.stop_ids())
        reasoning = chat.reasoning(text) if d.split_reasoning else None
    elif isinstance(line.prompt, str):
        ids = tokenizer.encode(line.prompt)
    else:
        ids = list(line.prompt)   # token ids; the engine checks their range
    if line.limit is not None:
        criteria = replace(criteria, n_predict=line.limit)
    if "ignore_eos" in given:
        criteria = replace(criteria, ignore_eos=line.ignore_eos)
    n_logprobs = d.n_logprobs if line.logprobs is None else int(line.logprobs)
    overrides = line.sampling()
    if overrides.get("seed") == DRAW_SEED:   # the row's own, as without "seed"
        del overrides["seed"]
    overrides.setdefault("seed", row_seed(d.seed, rid))
    return Request(rid, ids, replace(d.params, **overrides), criteria, n_logprobs, _grammar(line), reasoning=reasoning)


def _grammar(line: BatchLine) -> Grammar | None:
    if line.json_schema is not None and line.grammar is not None:
        raise LlogosError("give either \"json_schema\" or \"grammar\", not both")
    if line.json_schema is not None:
        return Grammar.json_schema(line.json_schema)
    if line.grammar is not None:
        return Grammar.gbnf(line.grammar)
    return None
