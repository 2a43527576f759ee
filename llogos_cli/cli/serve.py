"""`llogos serve`: an OpenAI-compatible HTTP server on one running batch of -np slots.

The socket is bound and the server answers (/health says 503) while the weights load on a thread
of their own; the engine thread starts once they have. Ctrl-C or SIGTERM stops accepting, lets
in-flight requests finish for a few seconds, cancels the rest, and exits 0.
"""

import ipaddress
import socket
import threading
from dataclasses import replace
from pathlib import Path

import click

from llogos_cli.cli.group import cli
from llogos_cli.cli.options import batch_options, several_models, reasoning_option, sampling_options, template_options
from llogos_cli.cli.shift_options import context_shift_options
from llogos_cli.cli.spec_options import speculation_options
from llogos_cli.console import err, warn
from llogos_cli.engine.batch import BatchEngine
from llogos_cli.engine.conversation import TemplateChoice
from llogos_cli.engine.draft_model import draft_footprint, load_draft_model
from llogos_cli.engine.prefix_cache import BLOCK_SIZE, CACHE_RAM_MIB
from llogos_cli.engine.sampling import SamplingOverrides
from llogos_cli.engine.speculation import SpecParams
from llogos_cli.errors import LlogosError
from llogos_cli.model.config import POOLING_TYPES
from llogos_cli.model.loader import LoadOptions
from llogos_cli.model.registry import resolve_model

GRACE_S = 3   # how long in-flight requests may run on after Ctrl-C or SIGTERM before they are cancelled


@cli.command()
@several_models
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback lets other machines in: add --api-key.")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="Port to listen on; 0 picks a free one.")
@click.option("-np", "--parallel", type=click.IntRange(min=1, max=256), default=8, show_default=True,
              help="Slots: requests generating at once.")
@batch_options
@click.option("-cb", "--cont-batching", is_flag=True, expose_value=False,
              help="Accepted for llama.cpp's command lines: requests always join the running batch.")
@click.option("--metrics", is_flag=True, expose_value=False,
              help="Accepted for llama.cpp's command lines: /metrics is always served.")
@click.option("--queue-size", type=click.IntRange(min=0), default=64, show_default=True,
              help="Requests that may wait for a slot; beyond them the server answers 503.")
@click.option("-n", "--n-predict", type=click.IntRange(min=-1), default=-1, show_default=True,
              help="Tokens to generate when a request gives no max_tokens; -1 = until the end of generation "
                   "or a full context.")
@click.option("--cache-prompt/--no-cache-prompt", default=True, show_default=True,
              help="Reuse the KV of a prompt's beginning that an earlier request already evaluated (prefix caching, "
                   "and each slot's last request, recurrent state included).")
@click.option("--cache-ram", type=click.IntRange(min=0), default=CACHE_RAM_MIB, show_default=True, metavar="MiB",
              help="Memory the paged KV pool holds beyond its slots' contexts for blocks kept for prefix reuse "
                   "(the pool: at most half of what is free after loading); the least recently used go first. "
                   "0 turns the cache off.")
@context_shift_options(on=False)
@sampling_options
@speculation_options
@template_options
@reasoning_option
@click.option("-a", "--alias", help="The model's name in the API (llama-server's -a). [default: its models.toml name, "
              "else its file's]")
@click.option("--api-key", envvar="LLOGOS_API_KEY", metavar="KEY[,KEY...]",
              help="Require `Authorization: Bearer KEY` on every endpoint but /health and the web page's files; "
                   "several keys comma-separated. [env: LLOGOS_API_KEY]")
@click.option("--api-key-file", type=click.Path(path_type=Path), metavar="FILE",
              help="API keys one a line, taken as --api-key's are (with them, if both are given).")
@click.option("--webui/--no-webui", default=True, show_default=True,
              help="Serve the chat page at / (it asks for the --api-key once).")
@click.option("--models-dir", type=click.Path(path_type=Path, file_okay=False), metavar="DIR",
              help="Router mode (llama-server's): serve every GGUF in DIR, each request by its model field "
                   "(a file's name without .gguf), loading each on its first request.")
@click.option("--models-max", type=click.IntRange(min=0), default=4, show_default=True, metavar="N",
              help="Router mode: models loaded at once; beyond them the least recently used idle one is "
                   "unloaded. 0 = no limit.")
@click.option("--models-memory", type=click.IntRange(min=0), default=0, show_default=True, metavar="MiB",
              help="Router mode (llogos' own): memory the loaded models may take together, each its weights as "
                   "held and its KV pool, and its -md draft model's; the least recently used idle ones are "
                   "unloaded to make room. 0 = no budget.")
@click.option("--models-autoload/--no-models-autoload", default=True, show_default=True,
              help="Router mode: a request for a model that is not loaded loads it; without, it is refused until "
                   "POST /models/load. A request's ?autoload=true|false decides for itself.")
@click.option("--slots/--no-slots", default=True, show_default=True,
              help="Serve GET /slots: what each slot is doing (llama-server's).")
@click.option("--rerank", "--reranking", "reranking", is_flag=True,
              help="Serve /v1/rerank (and /rerank): documents scored against a query by a reranker's "
                   "classification head.")
@click.option("--embedding", "--embeddings", is_flag=True, expose_value=False,
              help="Accepted for llama-server's command lines: /v1/embeddings is served with any model.")
@click.option("--pooling", type=click.Choice(POOLING_TYPES),
              help="How /v1/embeddings pools token states (none, mean, cls, last); rank: serve /v1/rerank, "
                   "as --reranking. [default: the GGUF's pooling_type]")
def serve(model: LoadOptions, sampling: SamplingOverrides, speculation: SpecParams, template: TemplateChoice, host, port,
          parallel, batch_size, queue_size, n_predict, cache_prompt, cache_ram, split_reasoning, alias, api_key,
          api_key_file, webui, slots, models_dir, models_max, models_memory, models_autoload, model_names, context_shift,
          keep, reranking, pooling):
    """Serve the OpenAI API (chat and text completions) with up to -np requests at once."""
    try:   # the server extra is optional: other commands never import it
        from llogos_cli.server.app import LoadedModel, ServerState, create_app
        from llogos_cli.server.engine_thread import EngineThread
        from llogos_cli.server.guards import api_keys
        from llogos_cli.server.metrics import Metrics
        from llogos_cli.server.prepare import RequestDefaults
        from llogos_cli.server.rerank import load as load_reranker
        from llogos_cli.server.router import Limits, Router, sources
        from llogos_cli.server.run import run
    except ImportError as e:
        raise LlogosError(f"`llogos serve` needs the server extra ({e.name} is missing): "
                          "pip install 'llogos[server]'") from None

    keys = api_keys(api_key, api_key_file)
    routed = sources(model_names, models_dir) if len(model_names) > 1 or models_dir else None
    if routed and (speculation.lookup_cache_static or speculation.lookup_cache_dynamic):
        raise LlogosError("a lookup cache file (-lcs/-lcd) holds one model's token ids: "
                          "not with several models (router mode)")
    if routed:
        for source in routed.values():
            resolve_model(source)   # a name or path that is not there fails now, not on its first request
    mf = None if routed else model.open(generates=False)   # an encoder serves embeddings alone
    # the one model's template and sampling are checked before it loads; a routed model's as it loads
    settings = None if routed else (template.format_or_none(mf), sampling.params(mf.sampling_defaults))
    sock = _listen(host, port)
    where = f"http://{_url_host(host)}:{sock.getsockname()[1]}"
    model_id = "router" if routed else alias or (mf.entry.name if mf.entry else mf.path.name)
    if not _loopback(host):
        warn(f"listening on {host}: other machines can reach this server"
             f"{'' if keys else ', and it has no --api-key'}")
    failure: list[BaseException] = []

    slots_text = f"{parallel} slot{'s' if parallel > 1 else ''}"

    cache_bytes = cache_ram << 20 if cache_prompt else 0

    def build(opened, name: str, loop, chat, params, metrics):
        """The model loaded with its engine thread running; and the backend it runs on."""
        n_ctx = model.n_ctx(opened)
        m = model.load(opened, n_ctx, parallel)
        engine = BatchEngine(m.model, opened.tokenizer, parallel, n_ctx, model.cache_types, batch_size,
                             cache_bytes, keep_slots=cache_prompt, speculation=speculation,
                             context_shift=context_shift, n_keep=keep,
                             draft_model=load_draft_model(speculation, model, m, n_ctx, parallel))
        thread = EngineThread(engine, loop, parallel, queue_size, metrics)
        thread.start()
        defaults = RequestDefaults(params, n_predict, split_reasoning, context_shift)
        reranker = load_reranker(reranking or pooling == "rank", m.model, opened, n_ctx)
        if isinstance(reranker, LlogosError):
            warn(f"{name}: /v1/rerank will answer 400: {reranker}")
        footprint = (model.footprint(opened, n_ctx, parallel, BLOCK_SIZE, cache_bytes, engine.n_blocks)
                     + draft_footprint(speculation, model, n_ctx, parallel))
        return (LoadedModel(thread, opened.tokenizer, chat, defaults, n_ctx, name, str(opened.path), reranker,
                            None if pooling == "rank" else pooling, footprint), m.model.backend.name)

    def start(loop):
        if routed:
            limits = Limits(models_max, models_memory << 20, models_autoload)
            shared.router = Router(routed, open_routed, lambda name, opened: load_routed(name, opened, loop), unload,
                                   limits)
            budget = f", {models_memory} MiB in all" if models_memory else ""
            err.print(f"llogos serve: listening on {where} (router: {', '.join(routed)}; up to "
                      f"{models_max or 'any number of'} loaded{budget}, {slots_text} each)", markup=False,
                      highlight=False, soft_wrap=True)
            return
        threading.Thread(target=load_then_run, args=(loop,), name="llogos-load", daemon=True).start()

    def open_routed(name: str, source: str):
        opened = replace(model, model_name=source).open(generates=False)
        n_ctx = model.n_ctx(opened)
        return opened, (model.footprint(opened, n_ctx, parallel, BLOCK_SIZE, cache_bytes)
                        + draft_footprint(speculation, model, n_ctx, parallel))

    def load_routed(name: str, opened, loop):
        loaded, backend = build(opened, name, loop, template.format_or_none(opened),
                                sampling.params(opened.sampling_defaults), Metrics(parallel))
        err.print(f"llogos serve: loaded {name} on {backend} ({loaded.footprint / 2 ** 20:.0f} MiB)", markup=False,
                  highlight=False, soft_wrap=True)
        return loaded

    def unload(loaded):
        loaded.engine.stop(timeout=GRACE_S)
        err.print(f"llogos serve: unloaded {loaded.name}", markup=False, highlight=False, soft_wrap=True)

    def load_then_run(loop):
        try:
            shared.loaded, backend = build(mf, model_id, loop, *settings, shared.metrics)
        except (LlogosError, MemoryError) as e:
            failure.append(e)
            app.state.server.should_exit = True
            return
        err.print(f"llogos serve: listening on {where} ({model_id} on {backend}, {slots_text} of "
                  f"{shared.loaded.n_ctx} tokens)", markup=False, highlight=False, soft_wrap=True)

    def running() -> list:
        if shared.router:
            return [loaded for _, loaded in shared.router.each_loaded()]
        return [shared.loaded] if shared.loaded else []

    def close():
        for loaded in running():
            loaded.engine.close()

    def stop():
        for loaded in running():
            loaded.engine.stop(timeout=GRACE_S)

    shared = ServerState(model_id, keys, Metrics(parallel), start, stop)
    app = create_app(shared, web_page=webui, slots=slots)
    run(app, sock, GRACE_S, close)
    if failure:
        raise failure[0]
    err.print("llogos serve: stopped", markup=False, highlight=False)


def _listen(host: str, port: int) -> socket.socket:
    """The bound socket, so that a port in use is a one-line error before the weights load."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as e:
        raise LlogosError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
