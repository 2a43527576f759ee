"""An API request -> the engine's Request: the prompt's tokens, sampling, stops and limits.

Runs on a worker thread, never on the event loop: rendering a chat template and tokenizing a long
prompt take real time. Anything the client got wrong is an ApiError (a 400) here, before the
request reaches the engine.
"""

import secrets
from dataclasses import dataclass, field, replace

from llogos_cli.engine.batch import Request, row_seed
from llogos_cli.engine.conversation import ChatFormat
from llogos_cli.engine.grammar import Grammar, Matcher
from llogos_cli.engine.reasoning import Reasoning
from llogos_cli.engine.sampling import DRAW_SEED, SamplingParams
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.errors import LlogosError
from llogos_cli.server.errors import ApiError
from llogos_cli.server import tool_calls, tool_prompt
from llogos_cli.server.schemas import ChatCompletionRequest, CompletionRequest

# A banned token's bias (llama-server's logit_bias false, its -inf): far below any logit, so never drawn,
# and finite, as SamplingParams' biases are.
BANNED = -1e30


@dataclass(frozen=True, slots=True)
class RequestDefaults:
    """What a request does not say: `llogos serve`'s flags over the model's defaults."""
    params: SamplingParams
    n_predict: int
    split_reasoning: bool = True   # --reasoning-format auto: a reply's reasoning in reasoning_content
    context_shift: bool = False    # --context-shift: max_tokens may pass the context


@dataclass(frozen=True, slots=True)
class Prepared:
    id: str                            # the response's
    requests: tuple[Request, ...]      # one per choice, in the choices' order
    n_top: int | None                  # top log-probabilities to report; None: none at all
    tools: dict[str, dict] = field(default_factory=dict)   # functions whose calls the reply is searched for,
                                                           # each with its parameters' schema
    parallel_tool_calls: bool = True
    reasoning: Reasoning | None = None    # how the reply's reasoning is told from its answer
    return_tokens: bool = False           # each choice carries its token ids


def prepare_chat(body: ChatCompletionRequest, tokenizer, chat: ChatFormat | None, defaults: RequestDefaults,
                 n_ctx: int) -> Prepared:
    if chat is None:
        raise ApiError(400, "the model has no chat template; start the server with --chat-template NAME "
                       "or use /v1/completions", code="no_chat_template")
    tools = [t.function.model_dump(exclude_none=True) for t in body.tools or ()]
    choice = body.tool_choice or ("auto" if tools else "none")
    if choice != "none" and not tools:
        raise ApiError(400, "tool_choice needs tools", param="tool_choice")
    if choice == "none":
        tools = []
    elif not isinstance(choice, str):
        tools = [t for t in tools if t["name"] == choice.function.name]
        if not tools:
            raise ApiError(400, f"tool_choice names '{choice.function.name}', which is not among the tools",
                           param="tool_choice")
    messages = tool_prompt.template_messages(body.messages, tools, chat.template.source)
    try:
        text = chat.text(messages, [{"type": "function", "function": t} for t in tools] or None,
                         body.template_kwargs)
    except LlogosError as e:
        raise ApiError(400, str(e), code="template_error") from None
    ids = _encode(tokenizer, text, add_bos=False)
    criteria = StopCriteria(stop_strings=body.stops + chat.stop_strings(), ignore_eos=body.ignore_eos,
                            stop_ids=chat.stop_ids())
    if choice in ("none", "auto"):
        grammar = _response_format(body)
    else:   # "required" or a named function: the reply is one call, whatever the model would rather say
        grammar = _grammar(lambda: Grammar.json_schema(tool_calls.call_schema(tools), lenient=True), "tools")
    split = defaults.split_reasoning if body.reasoning_format is None else body.reasoning_format != "none"
    reasoning = chat.reasoning(text) if split else None
    prepared = _prepared("chatcmpl", body, ids, criteria, defaults, n_ctx, tokenizer, grammar)
    return replace(prepared, tools={t["name"]: t.get("parameters") or {} for t in tools}, parallel_tool_calls=body.parallel_tool_calls,
                   reasoning=reasoning)


def _response_format(body) -> Grammar | None:
    """The constraint a request's response_format, json_schema or grammar asks for."""
    fmt = getattr(body, "response_format", None)
    asked = [name for name, given in (("response_format", fmt is not None and fmt.type != "text"),
                                      ("json_schema", body.json_schema is not None),
                                      ("grammar", body.grammar is not None)) if given]
    if len(asked) > 1:
        raise ApiError(400, f"give one of {' and '.join(asked)}, not both", param=asked[1])
    if not asked:
        return None
    if asked[0] == "grammar":
        return _grammar(lambda: Grammar.gbnf(body.grammar), "grammar")
    if asked[0] == "json_schema":
        return _grammar(lambda: Grammar.json_schema(body.json_schema), "json_schema")
    if fmt.type == "json_object":
        return Grammar.json_object()
    schema = fmt.json_schema.schema_
    return _grammar(lambda: Grammar.json_schema(schema if schema is not None else {}), "response_format")


def _grammar(make, param: str):
    try:
        return make()
    except LlogosError as e:
        raise ApiError(400, str(e), param=param, code="invalid_schema") from None


def prepare_completion(body: CompletionRequest, tokenizer, defaults: RequestDefaults, n_ctx: int) -> Prepared:
    ids = _prompt_ids(body.prompt, tokenizer)
    criteria = StopCriteria(stop_strings=body.stops, ignore_eos=body.ignore_eos)
    return _prepared("cmpl", body, ids, criteria, defaults, n_ctx, tokenizer, _response_format(body))


def _prompt_ids(prompt: str | list, tokenizer) -> list[int]:
    """A prompt's tokens: a text's, token ids as given, or (llama-server's /completion) a list mixing
    ids and texts. BOS leads where the model adds one if the prompt starts with text, as llama-server does."""
    parts = [prompt] if isinstance(prompt, str) else prompt
    ids = []
    for k, part in enumerate(parts):
        if isinstance(part, str):
            ids += _encode(tokenizer, part, add_bos=None if k == 0 else False)
        elif part >= tokenizer.n_vocab:
            raise ApiError(400, f"prompt token id {part} is out of range (the vocabulary has {tokenizer.n_vocab} "
                           "tokens)", param="prompt")
        else:
            ids.append(part)
    return ids


def _encode(tokenizer, text: str, add_bos: bool | None) -> list[int]:
    try:
        return tokenizer.encode(text, add_bos=add_bos)
    except LlogosError as e:
        raise ApiError(400, str(e)) from None


def _prepared(kind: str, body, ids: list[int], criteria: StopCriteria, defaults: RequestDefaults, n_ctx: int,
              tokenizer, grammar: Grammar | None = None) -> Prepared:
    if not ids:
        raise ApiError(400, "the prompt is empty after tokenization")
    if len(ids) > n_ctx:
        raise ApiError(400, f"the prompt has {len(ids)} tokens, more than the context of {n_ctx}",
                       code="context_length_exceeded")
    n_predict = defaults.n_predict if body.limit is None else body.limit
    if body.limit is not None and n_predict > n_ctx - len(ids) and not defaults.context_shift:
        raise ApiError(400, f"max_tokens {n_predict} does not fit: the prompt has {len(ids)} tokens and the "
                       f"context {n_ctx}, leaving {n_ctx - len(ids)}", code="context_length_exceeded",
                       param="max_tokens")
    overrides = body.sampling()
    if body.logit_bias:
        overrides["logit_bias"] = _logit_bias(body.logit_bias, tokenizer)
    if overrides.get("seed") == DRAW_SEED:   # a random one, even over the server's --seed, as llama-server does
        overrides["seed"] = None
    try:
        params = replace(defaults.params, **overrides)
    except LlogosError as e:
        raise ApiError(400, str(e)) from None
    if grammar is not None:   # compiled here, off the engine's thread; the engine's row copies it
        _grammar(lambda: Matcher(grammar, tokenizer), "response_format")
    n_top = body.n_top
    # Unique across requests and restarts, as OpenAI's are: clients and logs may key on them.
    rid = f"{kind}-{secrets.token_hex(12)}"
    criteria = replace(criteria, n_predict=n_predict)
    requests = tuple(Request(rid if body.n == 1 else f"{rid}/{i}", ids, _choice_params(params, i), criteria,
                             _engine_logprobs(n_top, params), grammar, cache_prompt=body.cache_prompt,
                             n_keep=body.n_keep)
                     for i in range(body.n))
    return Prepared(rid, requests, n_top, return_tokens=body.return_tokens)


def _choice_params(params: SamplingParams, index: int) -> SamplingParams:
    """Choice i's own random stream: choice 0 keeps the seed (it answers as n = 1 would), the others
    draw from seeds derived from it, so a seed gives the same n choices every time."""
    if index == 0 or params.seed is None:
        return params
    return replace(params, seed=row_seed(params.seed, index))


def _logit_bias(biases: dict | list, tokenizer) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"id": bias} or llama-server's [[id, bias], ["text", bias]] (each of the text's tokens
    biased) as (token id, bias) pairs; a bias of false bans the token."""
    n_vocab, pairs = tokenizer.n_vocab, []
    for key, bias in biases.items() if isinstance(biases, dict) else biases:
        bias = BANNED if bias is False else bias
        if isinstance(biases, list) and isinstance(key, str):
            pairs += [(i, bias) for i in _encode(tokenizer, key, add_bos=False)]
            continue
        token = key if isinstance(key, int) else int(key) if key.isdigit() else None
        if token is None or token >= n_vocab:
            raise ApiError(400, f"logit_bias: '{key}' is not a token id of this model (0..{n_vocab - 1})",
                           param="logit_bias")
        pairs.append((token, bias))
    return tuple(pairs)


def _engine_logprobs(n_top: int | None, params: SamplingParams) -> int:
    """How many top log-probabilities to ask the engine for. The API reports the sampled token's own
    log-probability, and the engine gives only the top N, so N must reach the sampled token: top-k
    sampling never draws past the k-th (penalties aside), and greedy takes the first."""
    if n_top is None:
        return 0
    reach = params.top_k if not params.greedy and params.top_k > 0 else 1
    return max(n_top, reach)
