"""The OpenAI API's request and response bodies, as llama-server accepts and writes them.

Requests are strict: an unknown field, or a value of the wrong type, is a 400 rather than being
coerced ("5" is not 5, true is not 1, NaN is no temperature), so a client's typo cannot quietly
change what runs. Responses are plain models whose JSON is what the `openai` client parses.
"""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from llogos_cli.engine.sampling import DRAW_SEED

MAX_TOP_LOGPROBS = 20
MAX_STOPS = 16


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


# ---------------------------------------------------------------------------------------- requests

class StreamOptions(_Strict):
    include_usage: bool = False


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]   # OpenAI's; "developer" is its new "system"
    content: str | list[TextPart]

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


Count = Annotated[int, Field(ge=-1)]   # -1: until end of generation or a full context


class _Generation(_Strict):
    """What chat and text completions share: the model, sampling, limits and streaming."""
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: Count | None = None
    n_predict: Count | None = None            # llama-server's name for max_tokens
    temperature: Annotated[float, Field(ge=0.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    repeat_penalty: Annotated[float, Field(gt=0.0)] | None = None
    seed: Annotated[int, Field(ge=DRAW_SEED, lt=2 ** 64)] | None = None   # DRAW_SEED: a random one
    stop: str | Annotated[list[str], Field(max_length=MAX_STOPS)] | None = None
    ignore_eos: bool = False
    n: Literal[1] = 1                         # one choice per request
    user: str | None = None                   # accepted for OpenAI clients that send it; unused

    @property
    def limit(self) -> int | None:
        return next((n for n in (self.max_tokens, self.n_predict, getattr(self, "max_completion_tokens", None))
                     if n is not None), None)

    @property
    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @model_validator(mode="after")
    def _one_limit(self):
        given = [n for n in ("max_tokens", "n_predict", "max_completion_tokens") if getattr(self, n, None) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of {' and '.join(given)}, not both")
        return self


class ChatCompletionRequest(_Generation):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Count | None = None   # OpenAI's newer name for max_tokens
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None

    @model_validator(mode="after")
    def _top_needs_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @property
    def n_top(self) -> int | None:
        """Top log-probabilities to report per token; None: no log-probabilities at all."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_Generation):
    prompt: str | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None

    @property
    def n_top(self) -> int | None:
        return self.logprobs


# --------------------------------------------------------------------------------------- responses

class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str
    logprobs: ChatLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer(mode="wrap")
    def _leave_out_none(self, handler):
        # A chunk carries only what it adds: OpenAI omits the role after the first chunk, never nulls it.
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None = None
    logprobs: CompletionLogprobs | None = None


class Completion(BaseModel):
    """A text completion, and also each chunk of a streamed one (the API uses one object for both)."""
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "llogos"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    code: str | int | None = None
    param: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody
