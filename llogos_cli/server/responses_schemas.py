"""The OpenAI Responses API's request body (/v1/responses, what Codex sends).

Fields are typed strictly, but, as with the Messages API, a field this server does not know is
ignored rather than refused: Codex sends each new field of OpenAI's API (include, prompt_cache_key,
store, ...) to whatever server it is pointed at. Every field that changes what runs is read.
"""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from llogos_cli.server.schemas import FunctionName


class _Read(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class TextPart(_Read):
    type: Literal["input_text", "output_text"]
    text: str


class OtherPart(_Read):
    type: Literal["input_image", "input_file", "input_audio", "refusal"]   # refused: the model reads text only


Part = Annotated[TextPart | OtherPart, Field(discriminator="type")]


class MessageItem(_Read):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Part]


class FunctionCallItem(_Read):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str   # a JSON object, as text


class FunctionCallOutputItem(_Read):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[Part]


class ReasoningItem(_Read):
    """Reasoning of an earlier reply, sent back in the history; chat templates drop it."""
    type: Literal["reasoning"]


def _item_type(value) -> str:
    # A message may leave its type out ({"role", "content"}, the API's "easy" input message).
    return value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", "message")


Item = Annotated[Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
                 | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
                 | Annotated[ReasoningItem, Tag("reasoning")], Discriminator(_item_type)]


class FunctionTool(_Read):
    type: Literal["function"]
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class HostedTool(_Read):
    """One of OpenAI's own tools (web_search, file_search, ...): not the client's to run, left out."""
    type: str


def _tool_type(value) -> str:
    return "function" if _item_type(value) == "function" else "hosted"


Tool = Annotated[Annotated[FunctionTool, Tag("function")] | Annotated[HostedTool, Tag("hosted")],
                 Discriminator(_tool_type)]


class NamedFunction(_Read):
    type: Literal["function"]
    name: str


class TextFormat(_Read):
    type: Literal["text", "json_object", "json_schema"]
    name: FunctionName | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(_Read):
    format: TextFormat | None = None


class ReasoningConfig(_Read):
    """The template's thinking switch and reasoning effort (responses.py); a model that reasons does
    so at its own length, which the reply's limit bounds."""
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None


class ResponsesRequest(_Read):
    model: str | None = None
    input: Annotated[list[Item], Field(min_length=1)] | str   # the list first: its errors are the telling ones
    instructions: str | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    stream: bool = False
    store: bool | None = None                  # accepted: nothing is kept either way
    previous_response_id: str | None = None    # refused: nothing is kept to continue from
