"""Anthropic's `thinking` and the Responses API's `reasoning.effort` as the chat template's reasoning
switches (enable_thinking, gpt-oss's reasoning effort): through the official SDKs against a server
whose template has the switch, and the prompts each setting renders for each family."""

import pytest

from tests.conftest import lazy_import
from tests.test_cli import env  # noqa: F401  (env is a fixture)
from tests.test_server import Server
from tests.test_server_tools import QWEN_TOOLS, prompt_text

anthropic = lazy_import("anthropic")
openai = lazy_import("openai")

TEMPLATES = QWEN_TOOLS.parent
ASK = [{"role": "user", "content": "What is two and two?"}]


@pytest.fixture(scope="module")
def qwen3(env, tmp_path_factory):
    """SmolLM2 with Qwen3's template, whose enable_thinking=false closes an empty <think> block."""
    server = Server(env, tmp_path_factory.mktemp("thinking") / "log", "-m", "smollm2-135m", "-c", "1024",
                    "--chat-template-file", str(TEMPLATES / "qwen3-tools.jinja"))
    yield server
    server.stop()
    log = server.log.read_text()
    assert server.proc.returncode == 0 and "Traceback" not in log, log


def test_anthropic_thinking_disabled_renders_the_closed_think_block_and_enabled_does_not(qwen3):
    client = anthropic.Anthropic(base_url=qwen3.url, api_key="none", max_retries=0)
    count = {kind: client.messages.count_tokens(model="m", messages=ASK, thinking=thinking).input_tokens
             for kind, thinking in (("on", {"type": "enabled", "budget_tokens": 2048}),
                                    ("off", {"type": "disabled"}))}
    assert count["off"] > count["on"]
    reply = client.messages.create(model="m", max_tokens=4, messages=ASK, thinking={"type": "disabled"},
                                   extra_body={"temperature": 0})
    assert reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0) == count["off"]


def test_responses_effort_none_turns_thinking_off_and_the_others_leave_it_on(qwen3):
    client = qwen3.client()
    prompt = {effort: client.responses.create(model="m", input="What is two and two?", max_output_tokens=1,
                                              temperature=0, reasoning={"effort": effort}).usage.input_tokens
              for effort in ("none", "minimal", "low", "high")}
    assert prompt["none"] == prompt["minimal"] > prompt["low"] == prompt["high"]


@pytest.mark.parametrize("template, off, on", [
    ("qwen3-tools.jinja", "<think>\n\n</think>", None),
    ("glm4.5-tools.jinja", "<think></think>", None),
    ("gpt-oss-tools.jinja", "Reasoning: low", "Reasoning: high"),
])
def test_each_family_s_switch_follows_anthropic_thinking_and_responses_effort(template, off, on):
    from llogos_cli.server import anthropic as messages_api
    from llogos_cli.server import anthropic_schemas, responses, responses_schemas
    source = (TEMPLATES / template).read_text()

    def anthropic_prompt(thinking: dict) -> str:
        body = anthropic_schemas.MessagesRequest.model_validate(
            {"model": "m", "max_tokens": 8, "messages": ASK, "thinking": thinking})
        return prompt_text(source, messages_api.chat_request(body).model_dump(exclude_none=True))

    def responses_prompt(effort: str) -> str:
        body = responses_schemas.ResponsesRequest.model_validate(
            {"model": "m", "input": ASK[0]["content"], "reasoning": {"effort": effort}})
        return prompt_text(source, responses.chat_request(body).model_dump(exclude_none=True))

    for prompt_off, prompt_on in ((anthropic_prompt({"type": "disabled"}),
                                   anthropic_prompt({"type": "enabled", "budget_tokens": 20000})),
                                  (responses_prompt("minimal"), responses_prompt("high"))):
        assert off in prompt_off and off not in prompt_on
        assert on is None or on in prompt_on
