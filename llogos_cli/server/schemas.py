"""The OpenAI API's request and response bodies, as llama-server accepts and writes them.

Requests are strict: an unknown field, or a value of the wrong type, is a 400 rather than being
coerced ("5" is not 5, true is not 1, NaN is no temperature), so a client's typo cannot quietly
change what runs. Responses are plain models whose JSON is what the `openai` client parses.
"""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from llogos_cli.engine.sampling import DRAW_SEED, REQUEST_FIELDS

MAX_TOP_LOGPROBS = 20
MAX_STOPS = 16
# Choices per request: each is a row of the batch, so one request may not take a whole server's slots.
MAX_CHOICES = 16


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


# ---------------------------------------------------------------------------------------- requests

class StreamOptions(_Strict):
    include_usage: bool = False


class TextPart(_Strict):
    type: Literal["text"]
    text: str


FunctionName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]   # OpenAI's rule for function names


class FunctionCall(_Strict):
    name: str
    arguments: str                            # a JSON object, as text


class MessageToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]   # OpenAI's; "developer" is its new "system"
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None    # an assistant's earlier calls
    tool_call_id: str | None = None                    # a tool message: the call it answers

    @model_validator(mode="after")
    def _complete(self):
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required (only an assistant message with tool_calls may leave it out)")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        return self

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class FunctionDef(_Strict):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema of the arguments
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Strict):
    name: FunctionName
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema goes with type \"json_schema\", and only with it")
        return self


Count = Annotated[int, Field(ge=-1)]   # -1: until end of generation or a full context
# A logit bias: added to the token's logit, or false to ban the token (llama-server's).
Bias = Annotated[float, Field(ge=-100.0, le=100.0)] | Literal[False]
TopN = Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)]


class RequestFields(_Strict):
    """What every request to the engine may say, in the API's names: limits, sampling, stops and a
    constraint. The server's requests and each line of `llogos batch` are read with these."""
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
    # llama-server's samplers beyond OpenAI's
    repeat_last_n: Annotated[int, Field(ge=-1)] | None = None
    typical_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    mirostat: Annotated[int, Field(ge=0, le=2)] | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    dry_multiplier: Annotated[float, Field(ge=0.0)] | None = None
    dry_base: Annotated[float, Field(ge=1.0)] | None = None
    dry_allowed_length: Annotated[int, Field(ge=0)] | None = None
    dry_penalty_last_n: Annotated[int, Field(ge=-1)] | None = None
    dry_sequence_breakers: Annotated[list[str], Field(min_length=1)] | None = None
    xtc_probability: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    xtc_threshold: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_n_sigma: float | None = None
    min_keep: Annotated[int, Field(ge=0)] | None = None
    samplers: str | list[str] | None = None   # names, or --sampling-seq letters
    stop: str | Annotated[list[str], Field(max_length=MAX_STOPS)] | None = None
    ignore_eos: bool = False
    json_schema: dict[str, Any] | bool | None = None   # llama-server's: constrain the output to this schema
    grammar: str | None = None                # llama-server's: constrain the output to this GBNF grammar

    @property
    def limit(self) -> int | None:
        return next((n for n in (self.max_tokens, self.n_predict, getattr(self, "max_completion_tokens", None))
                     if n is not None), None)

    @property
    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def sampling(self) -> dict:
        """The sampling fields given, as SamplingParams' fields."""
        return {field: getattr(self, name) for name, field in REQUEST_FIELDS.items() if getattr(self, name) is not None}

    @model_validator(mode="after")
    def _one_limit(self):
        given = [n for n in ("max_tokens", "n_predict", "max_completion_tokens") if getattr(self, n, None) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of {' and '.join(given)}, not both")
        return self


class _Generation(RequestFields):
    """What chat and text completions add: the model, choices and streaming."""
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] = 1   # choices, each sampled on its own
    user: str | None = None                   # accepted for OpenAI clients that send it; unused
    # OpenAI's {"token id": bias}, or llama-server's [[token id or text, bias], ...]
    logit_bias: dict[str, Bias] | list[tuple[Annotated[int, Field(ge=0)] | str, Bias]] | None = None
    # llama-server's fields
    cache_prompt: bool = True                 # false: evaluate the whole prompt, reusing no cached KV
    n_keep: Annotated[int, Field(ge=-1)] | None = None   # prompt tokens a context shift keeps; None: --keep
    n_probs: TopN | None = None               # top log-probabilities per token, as top_logprobs
    id_slot: Annotated[int, Field(ge=-1)] | None = None   # accepted; the server picks the slot
    return_tokens: bool = False               # each choice's token ids, as "tokens"

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(_Generation):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Count | None = None   # OpenAI's newer name for max_tokens
    logprobs: bool = False
    top_logprobs: TopN | None = None
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    # llama-server's: how the reply's reasoning is told apart ("none": left in the content), and
    # variables for the chat template (reasoning_effort is one, as llama-server passes it)
    reasoning_format: Literal["none", "auto", "deepseek", "deepseek-legacy"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: Annotated[str, Field(max_length=32)] | None = None

    @model_validator(mode="after")
    def _top_needs_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @property
    def n_top(self) -> int | None:
        """Top log-probabilities to report per token; None: no log-probabilities at all."""
        return (self.top_logprobs or 0) if self.logprobs else (self.n_probs or None)

    @property
    def template_kwargs(self) -> dict[str, Any]:
        given = {"reasoning_effort": self.reasoning_effort} if self.reasoning_effort is not None else {}
        return {**given, **(self.chat_template_kwargs or {})}


class CompletionRequest(_Generation):
    prompt: str | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
    logprobs: TopN | None = None

    @property
    def n_top(self) -> int | None:
        return self.logprobs if self.logprobs is not None else (self.n_probs or None)


def explain(errors) -> str:
    """One line from pydantic's errors: where, and what is wrong, in the API's field names."""
    e = errors[0]
    where = _where(e["loc"])
    if e["type"] == "json_invalid":
        return f"the body is not valid JSON: {e['msg'].removeprefix('Invalid JSON: ')}"
    if e["type"] == "extra_forbidden":
        return f"unknown field '{where}'"
    if e["type"] == "model_type" and not where:
        return "the body must be a JSON object"
    message = e["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def _where(loc) -> str:
    # A union's members show in the path as their types ("str", "list[...]"): not the client's words.
    return ".".join(str(p) for p in loc if isinstance(p, int) or not (p in _TYPE_TAGS or "[" in p))


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict"}


# --------------------------------------------------------------------------------------- responses

class PromptTokensDetails(BaseModel):
    cached_tokens: int   # prompt tokens taken from the prefix cache instead of evaluated


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class _Sparse(BaseModel):
    @model_serializer(mode="wrap")
    def _leave_out_none(self, handler):
        # A chunk carries only what it adds: OpenAI omits the role after the first chunk, never nulls it.
        return {k: v for k, v in handler(self).items() if v is not None}


class FunctionCallOut(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None    # llama-server's and DeepSeek's: the reply's reasoning, apart
    tool_calls: list[ToolCallOut] | None = None

    @model_serializer(mode="wrap")
    def _calls_only_when_made(self, handler):
        body = handler(self)
        for optional in ("tool_calls", "reasoning_content"):
            if body.get(optional) is None:
                body.pop(optional, None)
        return body


class _Tokens(BaseModel):
    tokens: list[int] | None = None           # the choice's token ids, when the request asked (return_tokens)

    @model_serializer(mode="wrap")
    def _tokens_when_asked(self, handler):
        body = handler(self)
        if body.get("tokens") is None:
            body.pop("tokens", None)
        return body


class ChatChoice(_Tokens):
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


class FunctionDelta(_Sparse):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(_Sparse):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta | None = None


class ChatDelta(_Sparse):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(_Tokens):
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


class TimedChatCompletionChunk(ChatCompletionChunk):
    """A choice's finishing chunk with llama-server's `timings` (its web page shows the speeds)."""
    timings: dict[str, int | float]


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(_Tokens):
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


class ModelCard(_Sparse):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "llogos"
    path: str | None = None          # router mode: the model's -m value
    status: dict | None = None       # router mode: llama-server's {"value": "loaded" | "loading" | "unloaded"}


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
