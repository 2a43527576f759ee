"""The HTTP routes of `llogos serve`: the OpenAI API as llama-server speaks it.

Routes only check, enqueue and forward: a request is turned into the engine's Request on a worker
thread (templating and tokenizing take time), submitted to the engine thread, and its tokens are
forwarded as they arrive, as server-sent events or gathered into one response. The event loop does
no model work, so one slow prompt never stalls the other clients.
"""

import asyncio
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import Depends, FastAPI, Header, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import (
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from llogos_cli.engine.conversation import ChatFormat
from llogos_cli.errors import LlogosError
from llogos_cli.server import anthropic, anthropic_schemas, embeddings, native, rerank, responses, responses_schemas, schemas, webui
from llogos_cli.server.engine_thread import Busy, EngineThread, ShuttingDown
from llogos_cli.server.errors import ApiError
from llogos_cli.server.guards import MAX_BODY, BodyLimit, check_key
from llogos_cli.server.metrics import Metrics, render
from llogos_cli.server.native_render import NativeRenderer
from llogos_cli.server.props import props
from llogos_cli.server.prepare import (
    RequestDefaults,
    Prepared,
    prepare_chat,
    prepare_completion,
)
from llogos_cli.server.render import ChatRenderer, Choices, CompletionRenderer, Envelope
from llogos_cli.server.request_log import RequestLog
from llogos_cli.server.router import HoldModels, Router

RETRY_AFTER_S = 1   # what a client told the queue is full should wait before trying again


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """The loaded model, ready to take requests."""
    engine: EngineThread
    tokenizer: object
    chat: ChatFormat | None
    defaults: RequestDefaults
    n_ctx: int
    name: str = ""    # the model's name in the API
    path: str = ""    # its GGUF file
    reranker: object = None   # server/rerank.load's: None where reranking is off
    pooling: str | None = None   # --pooling of its embeddings, None for the GGUF's
    footprint: int = 0   # bytes: its weights as held, its KV pool and its draft model (--models-memory)


class ServerState:
    """What the routes share: the loaded model once it has loaded (None until then), the metrics,
    and the start and stop of the work behind them, run by the app's lifespan."""

    def __init__(self, model_id: str, api_key: tuple[str, ...], metrics: Metrics,
                 start: Callable[[asyncio.AbstractEventLoop], None], stop: Callable[[], None]):
        self.model_id, self.api_key, self.metrics = model_id, api_key, metrics
        self.start, self.stop = start, stop
        self.loaded: LoadedModel | None = None
        self.router: Router | None = None   # router mode: the models, by name, in place of `loaded`
        self.created = int(time.time())

    def ready(self) -> LoadedModel:
        if self.loaded is None:
            raise ApiError(503, "Loading model", code="model_loading")
        return self.loaded

    async def model(self, request: Request, name: str | None) -> LoadedModel:
        """The model a request names: in router mode that one, loaded if it is not (unless the server
        or the request's `?autoload=false` says not to); else the one model (whatever the request
        names, as llama-server does)."""
        if self.router is None:
            return self.ready()
        return await self.router.get(name, _autoload(request.query_params.get("autoload")))


def create_app(shared: ServerState, max_body: int = MAX_BODY, web_page: bool = True, slots: bool = True) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        shared.start(asyncio.get_running_loop())
        yield
        shared.stop()

    app = FastAPI(title="llogos", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(BodyLimit, limit=max_body, render=_error_for)
    app.add_middleware(HoldModels)
    app.add_middleware(RequestLog)   # outermost: it also sees what BodyLimit refuses

    def authorized(authorization: str | None = Header(None), x_api_key: str | None = Header(None)) -> None:
        # Anthropic's clients may send the key as x-api-key instead
        check_key(shared.api_key, authorization if x_api_key is None else f"Bearer {x_api_key}")

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        if request.url.path.startswith("/v1/") and e.status != 401:
            shared.metrics.request("rejected")
        return _error_response(request, e)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        return _error_response(request, ApiError(e.status_code, str(e.detail), headers=e.headers))

    @app.get("/health")
    @app.get("/v1/health")
    async def health():
        if shared.loaded is None and shared.router is None:
            return ApiError(503, "Loading model", code="model_loading").response()
        return {"status": "ok"}

    @app.get("/metrics", dependencies=[Depends(authorized)], response_class=PlainTextResponse)
    async def metrics(request: Request):
        if shared.router is None:
            text = shared.metrics.render()
        else:   # each model's under its label, and the requests refused before reaching one
            name = request.query_params.get("model")
            text = render(shared.router.metrics(name) + ([] if name else [("", shared.metrics.families(True))]))
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    def routed() -> Router:
        if shared.router is None:
            raise ApiError(404, "this server serves one model: start it with -m several times or --models-dir "
                           "(router mode) to load and unload models")
        return shared.router

    @app.post("/models/load", dependencies=[Depends(authorized)])
    async def load_model(request: Request):
        await routed().load(_parse(native.ModelRequest, await request.body()).model)
        return {"success": True}

    @app.post("/models/unload", dependencies=[Depends(authorized)])
    async def unload_model(request: Request):
        routed().unload(_parse(native.ModelRequest, await request.body()).model)
        return {"success": True}

    @app.get("/v1/models", dependencies=[Depends(authorized)])
    async def models() -> schemas.ModelList:
        if shared.router is not None:
            return schemas.ModelList(data=[schemas.ModelCard(id=name, created=shared.created, path=path,
                                                             status=shared.router.status(name))
                                           for name, path in shared.router.models.items()])
        return schemas.ModelList(data=[schemas.ModelCard(id=shared.model_id, created=shared.created)])

    @app.get("/props", dependencies=[Depends(authorized)])
    async def server_props(request: Request):
        loaded = await shared.model(request, request.query_params.get("model"))
        return props(loaded.path, shared.metrics.n_slots, loaded, loaded.name)

    @app.get("/slots", dependencies=[Depends(authorized)])
    async def slot_states(request: Request):
        if not slots:
            raise ApiError(501, "this server does not serve /slots: start it with --slots")
        loaded = await shared.model(request, request.query_params.get("model"))
        try:
            states = await loaded.engine.call(lambda: native.slots(loaded.engine.engine, shared.metrics.n_slots,
                                                                   loaded.defaults))
        except LlogosError as e:
            raise _failure(e) from None
        if request.query_params.get("fail_on_no_slot") in ("1", "true") and all(s["is_processing"] for s in states):
            raise ApiError(503, "no slot available", code="no_slot_available")
        return states

    @app.post("/v1/chat/completions", dependencies=[Depends(authorized)])
    async def chat_completions(request: Request):
        body = _parse(schemas.ChatCompletionRequest, await request.body())
        loaded = await shared.model(request, body.model)
        prepared = await run_in_threadpool(prepare_chat, body, loaded.tokenizer, loaded.chat, loaded.defaults,
                                           loaded.n_ctx)
        return await _answer(loaded, prepared, body, ChatRenderer, request)

    async def completion(request: Request, schema, prepare, renderer_class):
        body = _parse(schema, await request.body())
        loaded = await shared.model(request, body.model)
        prepared = await run_in_threadpool(prepare, body, loaded.tokenizer, loaded.defaults, loaded.n_ctx)
        return await _answer(loaded, prepared, body, renderer_class, request)

    @app.post("/v1/completions", dependencies=[Depends(authorized)])
    async def completions(request: Request):
        return await completion(request, schemas.CompletionRequest, prepare_completion, CompletionRenderer)

    @app.post("/completion", dependencies=[Depends(authorized)])
    @app.post("/completions", dependencies=[Depends(authorized)])
    async def native_completion(request: Request):
        return await completion(request, native.NativeCompletionRequest, native.prepare, NativeRenderer)

    @app.post("/tokenize", dependencies=[Depends(authorized)])
    async def tokenize(request: Request):
        body = _parse(native.TokenizeRequest, await request.body())
        return await run_in_threadpool(native.tokenize, body, (await shared.model(request, body.model)).tokenizer)

    @app.post("/detokenize", dependencies=[Depends(authorized)])
    async def detokenize(request: Request):
        body = _parse(native.DetokenizeRequest, await request.body())
        return await run_in_threadpool(native.detokenize, body, (await shared.model(request, body.model)).tokenizer)

    @app.post("/apply-template", dependencies=[Depends(authorized)])
    async def apply_template(request: Request):
        body = _parse(native.ApplyTemplateRequest, await request.body())
        return await run_in_threadpool(native.apply_template, body, (await shared.model(request, body.model)).chat)

    @app.post("/v1/embeddings", dependencies=[Depends(authorized)])
    async def v1_embeddings(request: Request) -> embeddings.EmbeddingList:
        body = _parse(embeddings.EmbeddingRequest, await request.body())
        loaded = await shared.model(request, body.model)
        return await embeddings.v1_embeddings(loaded, loaded.name, body)

    @app.post("/embedding", dependencies=[Depends(authorized)])
    async def llama_embedding(request: Request):
        body = _parse(embeddings.LlamaEmbeddingRequest, await request.body())
        return await embeddings.llama_embedding(await shared.model(request, body.model), body)

    async def reranking(request: Request):
        body = _parse(rerank.RerankRequest, await request.body())
        loaded = await shared.model(request, body.model)
        return await rerank.rerank(loaded, loaded.name, body)

    for path in rerank.PATHS:
        app.post(path, dependencies=[Depends(authorized)])(reranking)

    async def translated(request: Request, schema, prepare, renderer_class):
        """An API translated onto the chat endpoint's: `prepare` gives the chat request its body means
        and that request's engine requests; the renderer writes the reply in the API's shape."""
        body = _parse(schema, await request.body())
        loaded = await shared.model(request, body.model)
        chat_body, prepared = await run_in_threadpool(prepare, body, loaded.tokenizer, loaded.chat, loaded.defaults,
                                                      loaded.n_ctx)
        return await _answer(loaded, prepared, chat_body, renderer_class, request)

    @app.post(anthropic.PATH, dependencies=[Depends(authorized)])
    async def messages(request: Request):
        return await translated(request, anthropic_schemas.MessagesRequest, anthropic.prepare,
                                anthropic.MessageRenderer)

    @app.post(anthropic.PATH + "/count_tokens", dependencies=[Depends(authorized)])
    async def count_tokens(request: Request) -> anthropic_schemas.CountTokens:
        body = _parse(anthropic_schemas.CountTokensRequest, await request.body())
        loaded = await shared.model(request, body.model)
        return await run_in_threadpool(anthropic.count_tokens, body, loaded.tokenizer, loaded.chat, loaded.defaults,
                                       loaded.n_ctx)

    @app.post(responses.PATH, dependencies=[Depends(authorized)])
    async def create_response(request: Request):
        return await translated(request, responses_schemas.ResponsesRequest, responses.prepare,
                                responses.ResponseRenderer)

    @app.post(responses.PATH + "/input_tokens", dependencies=[Depends(authorized)])
    async def count_input_tokens(request: Request):
        body = _parse(responses_schemas.ResponsesRequest, await request.body())
        loaded = await shared.model(request, body.model)
        return await run_in_threadpool(responses.input_tokens, body, loaded.tokenizer, loaded.chat, loaded.defaults,
                                       loaded.n_ctx)

    if web_page:
        webui.register(app)
    return app


def _autoload(value: str | None) -> bool | None:
    """llama-server's `?autoload=true|false`: whether this request may load its model (None: as the
    server's --models-autoload says)."""
    if value is None:
        return None
    if value not in ("true", "false", "1", "0"):
        raise ApiError(400, f"autoload must be true or false, not '{value}'", param="autoload")
    return value in ("true", "1")


def _error_response(request: Request, e: ApiError) -> Response:
    return _error_for(request.url.path, e)


def _error_for(path: str, e: ApiError) -> Response:
    """The error in the shape of the API at that path."""
    if path.startswith(anthropic.PATH):
        return anthropic.error_response(e)
    return e.response()


async def _answer(loaded: LoadedModel, prepared: Prepared, body, renderer_class, request: Request):
    requests = prepared.requests
    if len(requests) > loaded.engine.capacity:
        raise ApiError(400, f"n {len(requests)} is more choices than this server has slots and queue places "
                       f"({loaded.engine.capacity})", param="n")
    try:
        events = loaded.engine.submit(requests)
    except Busy:
        raise ApiError(503, "the server is busy: every slot is taken and the queue is full", code="queue_full",
                       headers={"Retry-After": str(RETRY_AFTER_S)}) from None
    envelope = Envelope(prepared.id, loaded.name, loaded.tokenizer, prepared.n_top, body.include_usage,
                        prepared.tools, prepared.parallel_tool_calls, prepared.reasoning, prepared.return_tokens,
                        body.stops, len(requests[0].prompt), tuple(len(r.prompt) for r in requests))
    ids = [r.id for r in requests]
    choices = Choices(renderer_class, envelope, ids, len(requests[0].prompt))
    accepted = await _until_disconnect(events.get(), request)
    if isinstance(accepted, LlogosError):
        raise _failure(accepted) if isinstance(accepted, ShuttingDown) else ApiError(400, str(accepted))
    if accepted is not GONE and body.stream:   # from here the stream owns the request
        return StreamingResponse(_stream(loaded, ids, events, choices), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    failed = GONE if accepted is GONE else await _until_disconnect(_results(events, choices), request)
    if failed is GONE:
        for rid in ids:
            loaded.engine.cancel(rid)
        loaded.engine.metrics.request("cancelled")
        return Response(status_code=499)   # nginx's "client closed request": nobody reads it
    if failed is not None:
        loaded.engine.metrics.request("failed")
        return _error_response(request, _failure(failed))
    loaded.engine.metrics.request("ok")
    return JSONResponse(choices.body().model_dump(mode="json"))


async def _results(events: asyncio.Queue, choices: Choices) -> LlogosError | None:
    """Every choice's Result into `choices`; or the LlogosError that ended them."""
    while not choices.done:
        item = await events.get()
        if isinstance(item, LlogosError):
            return item
        if item.result is not None:
            choices.add(item.result)
    return None


GONE = object()   # what _until_disconnect returns when the client left first


async def _until_disconnect(awaitable, request: Request):
    """The awaitable's value, or GONE when the client disconnects first."""
    task = asyncio.ensure_future(awaitable)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()   # takes effect at the loop's next turn: the task is not done yet
    return task.result() if task.done() and not task.cancelled() else GONE


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _stream(loaded: LoadedModel, ids: list, events: asyncio.Queue, choices: Choices):
    """The events of one response's requests as SSE. Starlette cancels this generator when the client
    disconnects; the finally then frees every choice's slot before the engine's next step."""
    done = False
    try:
        for chunk in choices.first():
            yield chunk
        while True:
            # Everything that waits goes out in one write: a client (or a loop) that fell behind a
            # fast model catches up in one send, not one a token, and an error after a backlog
            # (the server stopping) reaches it before uvicorn's own deadline cuts the connection.
            items = [await events.get()]
            while not events.empty():
                items.append(events.get_nowait())
            out = []
            for item in items:
                if isinstance(item, LlogosError):
                    done = True
                    loaded.engine.metrics.request("failed")
                    yield b"".join([*out, choices.error(_failure(item))])
                    return
                if item.token is not None and (chunk := choices.token(item.id, item.token)) is not None:
                    out.append(chunk)
                if item.result is not None:
                    out += choices.last(item.result)
                    if choices.done:
                        done = True
                        loaded.engine.metrics.request("ok")
                        yield b"".join(out)
                        return
            if out:
                yield b"".join(out)
    finally:
        if not done:
            for rid in ids:
                loaded.engine.cancel(rid)
            loaded.engine.metrics.request("cancelled")


def _failure(e: LlogosError) -> ApiError:
    """A request the engine could not finish: the server stopping, or the engine failing."""
    if isinstance(e, ShuttingDown):
        return ApiError(503, str(e), code="shutting_down")
    return ApiError(500, str(e), code="engine_error")


def _parse(schema, raw: bytes):
    """The body as the schema, whatever Content-Type the client sent (curl -d says form data)."""
    try:
        return schema.model_validate_json(raw)
    except ValidationError as e:
        code = "invalid_value" if e.errors()[0]["type"] == "literal_error" else None   # OpenAI's, for a value outside a set
        raise ApiError(400, schemas.explain(e.errors()), param=_param(e.errors()), code=code) from None


def _param(errors) -> str | None:
    loc = errors[0]["loc"]
    return str(loc[0]) if loc else None
