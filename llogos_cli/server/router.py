"""llama-server's router mode: several models behind one server, each request served by the model
its `model` field names (a GET's `?model=`).

A model loads on its first request (or /models/load; not on a request where --no-models-autoload or
the request's ?autoload=false says not to), on a worker thread, with its own engine
thread; concurrent requests for a model that is loading wait on that one load. Before a load the
router makes room for it: beyond --models-max models, or past --models-memory bytes of the models'
footprints (weights as held and KV pool, and a -md draft model's), it unloads the least recently used idle models first,
and where every model is busy the load waits for one to become idle rather than overrun the limit.

A request holds the model it uses until its response has been sent, a stream's last chunk
included (HoldModels, a context variable as request_log's); a model being unloaded takes no new
requests (they wait and load it again), and its engine stops once the last holder is done, so an
unload never cuts a reply.
"""

import asyncio
import time
import traceback
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

from fastapi.concurrency import run_in_threadpool

from llogos_cli.console import err
from llogos_cli.errors import LlogosError
from llogos_cli.server import metrics
from llogos_cli.server.errors import ApiError

GGUF = ".gguf"
MiB = 1 << 20


def sources(model_names: tuple[str, ...], models_dir: Path | None) -> dict[str, str]:
    """Each servable model's name -> its -m value: a models.toml name is its own name, a file is
    named by its file name without .gguf; --models-dir adds every GGUF in the folder."""
    found = {}
    for value in model_names:
        found[Path(value).stem if value.endswith(GGUF) else value] = value
    if models_dir is not None:
        if not models_dir.is_dir():
            raise LlogosError(f"--models-dir {models_dir}: not a directory")
        for path in sorted(models_dir.glob("*" + GGUF)):
            found.setdefault(path.stem, str(path))
    if not found:
        raise LlogosError(f"--models-dir {models_dir}: no {GGUF} files in it")
    return found


@dataclass(frozen=True, slots=True)
class Limits:
    models_max: int = 0      # models loaded at once; 0: any number
    memory: int = 0          # bytes the loaded models' footprints may add up to; 0: no budget
    autoload: bool = True    # a request for a model that is not loaded loads it


@dataclass(eq=False, slots=True)
class _Entry:
    """One model in memory or on its way in or out."""
    state: str = "loading"           # "loading", "loaded", "unloading"
    footprint: int = 0               # bytes: estimated before the load, measured after
    admitted: bool = False           # room was made for it: it counts against the limits
    users: int = 0                   # requests holding it
    last_used: float = field(default_factory=time.monotonic)
    loaded: object = None            # the app's LoadedModel once loaded
    ready: asyncio.Future | None = None   # the load
    stopping: bool = False


_HELD: ContextVar[list | None] = ContextVar("llogos_models_held", default=None)


class HoldModels:
    """ASGI middleware: the models a request took stay held until its response has been sent."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        held: list = []
        reset = _HELD.set(held)
        try:
            await self.app(scope, receive, send)
        finally:
            _HELD.reset(reset)
            for router, entry in held:
                router.release(entry)


class Router:
    def __init__(self, models: dict[str, str], open_model: Callable, load: Callable, unload: Callable,
                 limits: Limits = Limits()):
        """Run on worker threads: `open_model(name, source)` -> (the opened file, its estimated
        footprint); `load(name, opened)` -> the app's LoadedModel, with its measured `footprint`;
        `unload(loaded)` stops its engine thread."""
        self.models, self.limits = models, limits
        self._open, self._load, self._unload = open_model, load, unload
        self._entries: dict[str, _Entry] = {}
        self._changed = asyncio.Event()
        self.failed: dict[str, str] = {}           # name -> why its last load failed

    def _check_name(self, name: str | None) -> None:
        if name is None or name not in self.models:
            available = ", ".join(self.models)
            given = "the request names no model" if name is None else f"model '{name}' is not served here"
            raise ApiError(404 if name else 400, f"{given}; available: {available}", param="model",
                           code="model_not_found")

    async def get(self, name: str | None, autoload: bool | None = None):
        """The loaded model, held by the current request; loaded first where it is not."""
        self._check_name(name)
        while True:
            entry = self._entries.get(name)
            if entry is None:
                if not (self.limits.autoload if autoload is None else autoload):
                    raise ApiError(400, f"model '{name}' is not loaded (load it with POST /models/load)",
                                   param="model", code="model_not_loaded")
                entry = self._entries[name] = _Entry()
                entry.ready = asyncio.ensure_future(self._load_one(name, entry))
                entry.ready.add_done_callback(_retrieve)   # its error reaches whoever still waits
            elif entry.state == "unloading":
                await self._wait_for_change()
                continue
            held = self._hold(entry)
            if entry.state == "loading":
                await asyncio.shield(entry.ready)
                if entry.state != "loaded":   # unloaded before this request resumed: it must not keep it
                    if held:
                        _HELD.get().remove((self, entry))
                        self.release(entry)
                    continue
            entry.last_used = time.monotonic()
            return entry.loaded

    def _hold(self, entry: _Entry) -> bool:
        held = _HELD.get()
        if held is None:   # outside a request (HoldModels): nothing to wait for
            return False
        entry.users += 1
        held.append((self, entry))
        return True

    def release(self, entry: _Entry) -> None:
        entry.users -= 1
        if entry.users == 0:
            if entry.state == "unloading":
                self._stop(entry)
            self._notify()

    async def load(self, name: str | None) -> None:
        """POST /models/load: the model loaded, or why not."""
        self._check_name(name)
        if name in self._entries and self._entries[name].state != "unloading":
            raise ApiError(400, f"model '{name}' is already {self.status(name)['value']}", param="model")
        await self.get(name, autoload=True)

    def unload(self, name: str | None) -> None:
        """POST /models/unload: new requests wait for it to go (and load it again); the engine stops
        once the requests that hold it are done."""
        self._check_name(name)
        entry = self._entries.get(name)
        if entry is None or entry.state == "unloading":
            raise ApiError(400, f"model '{name}' is not loaded", param="model")
        if entry.state == "loading":
            raise ApiError(400, f"model '{name}' is loading: unload it once it has loaded", param="model")
        self._start_unload(name, entry)

    async def _load_one(self, name: str, entry: _Entry):
        try:
            opened, entry.footprint = await run_in_threadpool(self._open, name, self.models[name])
            budget = self.limits.memory
            if budget and entry.footprint > budget:
                raise LlogosError(f"it needs {entry.footprint / MiB:.0f} MiB (weights and KV), more than "
                                  f"--models-memory {budget // MiB}")
            await self._make_room(name, entry)
            entry.loaded = await run_in_threadpool(self._load, name, opened)
        except (LlogosError, MemoryError) as e:
            self._drop(name, entry, str(e))
            raise ApiError(503, f"model '{name}' could not be loaded: {e}", code="model_load_failed") from None
        except Exception as e:   # a bug: this load fails, the server serves on
            err.print(f"[red]loading {name} failed:[/red]")
            err.print(traceback.format_exc(), markup=False, highlight=False)
            self._drop(name, entry, f"{type(e).__name__}: {e}")
            raise ApiError(500, f"model '{name}' could not be loaded: {type(e).__name__}: {e}",
                           code="model_load_failed") from None
        entry.footprint = entry.loaded.footprint
        entry.state = "loaded"
        self.failed.pop(name, None)
        self._notify()

    def _drop(self, name: str, entry: _Entry, why: str) -> None:
        self.failed[name] = why
        if self._entries.get(name) is entry:
            del self._entries[name]
        entry.state = "failed"
        self._notify()

    async def _make_room(self, name: str, entry: _Entry) -> None:
        """Admit the entry once it fits the limits, unloading idle models (least recently used first)
        while that helps; a model already on its way out still counts until it is gone."""
        while True:
            admitted = [e for e in self._entries.values() if e.admitted]
            if self._fits(admitted, entry.footprint):
                entry.admitted = True
                return
            staying = [e for e in admitted if e.state != "unloading"]
            idle = [(n, e) for n, e in self._entries.items() if e.state == "loaded" and e.users == 0]
            if not self._fits(staying, entry.footprint) and idle:
                self._start_unload(*min(idle, key=lambda item: item[1].last_used))
                continue
            await self._wait_for_change()

    def _fits(self, entries: list[_Entry], footprint: int) -> bool:
        models_max, budget = self.limits.models_max, self.limits.memory
        return ((not models_max or len(entries) < models_max)
                and (not budget or sum(e.footprint for e in entries) + footprint <= budget))

    def _start_unload(self, name: str, entry: _Entry) -> None:
        entry.state = "unloading"
        if entry.users == 0:
            self._stop(entry)
        err.print(f"llogos serve: unloading {name}", markup=False, highlight=False, soft_wrap=True)

    def _stop(self, entry: _Entry) -> None:
        if not entry.stopping:
            entry.stopping = True
            asyncio.ensure_future(self._stopped(entry)).add_done_callback(_retrieve)

    async def _stopped(self, entry: _Entry) -> None:
        try:
            await run_in_threadpool(self._unload, entry.loaded)
        finally:
            entry.loaded = None   # its weights go with the last reference
            for name, e in list(self._entries.items()):
                if e is entry:
                    del self._entries[name]
            self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_for_change(self) -> None:
        await self._changed.wait()

    def status(self, name: str) -> dict:
        entry = self._entries.get(name)
        if entry is not None:
            return {"value": entry.state}
        return {"value": "unloaded", "failed": True} if name in self.failed else {"value": "unloaded"}

    def metrics(self, name: str | None) -> list[tuple[str, list]]:
        """GET /metrics: each loaded model's metric families under its model label (only `name`'s,
        where the scrape asks for one, as llama-server's router forwards ?model= to that model)."""
        if name is not None:
            self._check_name(name)
        return [(metrics.label("model", n), loaded.engine.metrics.families()) for n, loaded in self.each_loaded()
                if name in (None, n)]

    def each_loaded(self) -> list[tuple[str, object]]:
        return [(name, e.loaded) for name, e in self._entries.items() if e.loaded is not None]


def _retrieve(task: asyncio.Future) -> None:
    """Take a finished task's error so that asyncio does not report it as never retrieved: the
    requests that waited on it have had it, or left."""
    if not task.cancelled():
        task.exception()
