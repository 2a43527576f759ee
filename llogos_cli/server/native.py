"""llama-server's own endpoints beside the OpenAI ones: /completion's request, /tokenize, /detokenize,
/apply-template and /slots, in its shapes (tools/server/README.md).

/completion is /v1/completions under another body: the same preparation and engine request, rendered
by native_render. The others do no generation; /slots asks the engine thread for a snapshot between
steps, so that it never reads rows the thread is changing.
"""

from dataclasses import replace
from typing import Annotated, Any

from pydantic import Field, model_validator

from llogos_cli.engine.batch import BatchEngine
from llogos_cli.errors import LlogosError
from llogos_cli.server import tool_prompt
from llogos_cli.server.errors import ApiError
from llogos_cli.server.prepare import Prepared, RequestDefaults, prepare_completion
from llogos_cli.server.props import sampling_settings
from llogos_cli.server.schemas import ChatMessage, CompletionRequest, _Strict

TokenId = Annotated[int, Field(ge=0)]


class NativeCompletionRequest(CompletionRequest):
    """/completion's body: a prompt may mix token ids and texts ([12, "text", 34]), and a list with no
    ids at its top (["one", [12, "two"]]) is several prompts, a reply each; the stream is its own
    chunks, with no usage chunk and no [DONE]."""
    prompt: str | Annotated[list[TokenId | str | Annotated[list[TokenId | str], Field(min_length=1)]],
                            Field(min_length=1)]
    timings_per_token: bool = False   # accepted: the last chunk always carries the timings

    @property
    def include_usage(self) -> bool:
        return False

    @property
    def prompts(self) -> list:
        if isinstance(self.prompt, list) and not any(isinstance(p, int) for p in self.prompt):
            return list(self.prompt)
        return [self.prompt]

    @model_validator(mode="after")
    def _lists_alone(self):
        if isinstance(self.prompt, list) and any(isinstance(p, list) for p in self.prompt) and len(self.prompts) == 1:
            raise ValueError("prompt: give token ids and texts in one list, or several prompts as a list of them, "
                             "not both")
        return self


class ModelRequest(_Strict):
    """/models/load's and /models/unload's body."""
    model: str


class TokenizeRequest(_Strict):
    content: str
    add_special: bool = False        # the model's special tokens (BOS where it adds one)
    parse_special: bool = True       # control-token text becomes those tokens
    with_pieces: bool = False        # each token as {"id", "piece"}
    model: str | None = None


class DetokenizeRequest(_Strict):
    tokens: list[TokenId]
    model: str | None = None


class ApplyTemplateRequest(_Strict):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    chat_template_kwargs: dict[str, Any] | None = None
    model: str | None = None


def prepare(body: NativeCompletionRequest, tokenizer, defaults: RequestDefaults, n_ctx: int) -> Prepared:
    """Each prompt's engine requests, its n choices', one prompt after another: reply i is the
    (i // n)-th prompt's, as llama-server numbers its results."""
    each = [prepare_completion(body.model_copy(update={"prompt": p}), tokenizer, defaults, n_ctx) for p in body.prompts]
    return replace(each[0], requests=tuple(r for prepared in each for r in prepared.requests))


def tokenize(body: TokenizeRequest, tokenizer) -> dict:
    try:
        ids = tokenizer.encode(body.content, add_bos=None if body.add_special else False,
                               parse_special=body.parse_special)
    except LlogosError as e:
        raise ApiError(400, str(e), param="content") from None
    if not body.with_pieces:
        return {"tokens": ids}
    return {"tokens": [{"id": i, "piece": _piece(tokenizer.token_bytes(i, special=True))} for i in ids]}


def _piece(raw: bytes) -> str | list[int]:
    """A token's text, or its bytes where they are not UTF-8 on their own (part of a character)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def detokenize(body: DetokenizeRequest, tokenizer) -> dict:
    try:
        return {"content": tokenizer.decode(body.tokens, special=True)}
    except LlogosError as e:
        raise ApiError(400, str(e), param="tokens") from None


def apply_template(body: ApplyTemplateRequest, chat) -> dict:
    """The prompt the chat endpoint would give the model for these messages, as text."""
    if chat is None:
        raise ApiError(400, "the model has no chat template; start the server with --chat-template NAME",
                       code="no_chat_template")
    messages = tool_prompt.template_messages(body.messages, [], chat.template.source)
    try:
        return {"prompt": chat.text(messages, None, body.chat_template_kwargs or {})}
    except LlogosError as e:
        raise ApiError(400, str(e), code="template_error") from None


def slots(engine: BatchEngine, n_slots: int, defaults) -> list[dict]:
    """Each slot's state as llama-server's /slots gives it; run on the engine thread. A slot's
    `params` are its request's, or the server's defaults while it is idle."""
    rows = {row.slot: row for row in engine.scheduler.running if row.slot >= 0}
    out = []
    for slot in range(n_slots):
        row = rows.get(slot)
        state = {"id": slot, "n_ctx": engine.n_ctx, "speculative": engine.speculator is not None,
                 "is_processing": row is not None}
        if row is None:
            state["params"] = sampling_settings(defaults.params, defaults.n_predict)
            out.append(state)
            continue
        c = row.completion
        n_predict = row.request.criteria.n_predict
        state.update(id_task=row.request.id, n_prompt_tokens=len(c.prompt), n_prompt_tokens_cache=row.prefix_hit,
                     params=sampling_settings(row.request.params, n_predict),
                     next_token=[{"has_next_token": c.stop is None, "n_decoded": len(c.generated),
                                  "n_remain": -1 if n_predict < 0 else n_predict - len(c.generated)}])
        out.append(state)
    return out
