"""The Anthropic Messages API's request and response bodies, as Claude Code and the `anthropic` SDK
send and read them.

Fields are typed strictly, as the OpenAI API's are ("5" is not 5), but a field this server does
not know is ignored rather than refused: Anthropic adds request fields every few months, and Claude
Code sends them to whatever server it is pointed at. Every field that changes what runs is read.
"""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llogos_cli.server.schemas import MAX_STOPS


class _Read(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


# ---------------------------------------------------------------------------------------- requests

class TextBlock(_Read):
    type: Literal["text"]
    text: str


class ImageBlock(_Read):
    type: Literal["image", "document"]   # refused when translated: the models served read text only


class ToolUseBlock(_Read):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Read):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[Annotated[TextBlock | ImageBlock, Field(discriminator="type")]] = ""
    is_error: bool = False


class ThinkingBlock(_Read):
    """Reasoning of an earlier reply, sent back in the history; chat templates drop it."""
    type: Literal["thinking", "redacted_thinking"]


Block = Annotated[TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock, Field(discriminator="type")]


class Message(_Read):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(_Read):
    """A client tool (no type, or "custom") has an input schema; Anthropic's own server tools
    (web_search_..., bash_..., typed) are not the client's to run, and are left out."""
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    type: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None

    @property
    def client(self) -> bool:
        return self.type in (None, "custom")

    @model_validator(mode="after")
    def _schema_for_client_tools(self):
        if self.client and self.input_schema is None:
            raise ValueError("a tool needs an input_schema")
        return self


class ToolChoice(_Read):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False

    @model_validator(mode="after")
    def _name_with_tool(self):
        if (self.type == "tool") != (self.name is not None):
            raise ValueError("name goes with type \"tool\", and only with it")
        return self


class Thinking(_Read):
    """Whether the reply may reason first: the template's thinking switch, and the budget as its
    reasoning effort (anthropic.py); a model that reasons does so in thinking blocks, one that cannot
    simply answers. The reply's max_tokens bounds the reasoning."""
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Annotated[int, Field(ge=0)] | None = None


class OutputFormat(_Read):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Read):
    format: OutputFormat | None = None   # structured output: the reply is JSON valid for the schema
    effort: str | None = None            # accepted, as thinking's budget is


class CountTokensRequest(_Read):
    """What decides a request's prompt: /v1/messages/count_tokens reads only this."""
    model: str
    messages: Annotated[list[Message], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: Annotated[int, Field(ge=1)]   # beyond the context's room: up to the context's end
    stop_sequences: Annotated[list[str], Field(max_length=MAX_STOPS)] | None = None
    stream: bool = False
    temperature: Annotated[float, Field(ge=0.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    metadata: dict[str, Any] | None = None   # user_id, for the client's own records
    output_config: OutputConfig | None = None


# --------------------------------------------------------------------------------------- responses

class TextOut(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ThinkingOut(BaseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""   # Anthropic's proof of its own reasoning; there is none to give here


class ToolUseOut(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class Usage(BaseModel):
    input_tokens: int                 # the prompt's tokens not read from the cache
    output_tokens: int
    cache_read_input_tokens: int = 0  # the prompt's tokens read from the prefix cache
    cache_creation_input_tokens: int = 0


class MessageOut(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ThinkingOut | TextOut | ToolUseOut]
    stop_reason: str | None
    stop_sequence: str | None = None
    usage: Usage


class CountTokens(BaseModel):
    input_tokens: int


class ErrorDetail(BaseModel):
    type: str
    message: str


class ErrorOut(BaseModel):
    type: Literal["error"] = "error"
    error: ErrorDetail
