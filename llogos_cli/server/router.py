"""llama-server's router mode: several models behind one server, each request served by the model
its `model` field names (a GET's `?model=`).

A model loads on its first request, on a worker thread, with its own engine thread; concurrent
requests for a model that is loading wait on that one load. Beyond --models-max loaded models the
least recently used one with nothing in flight is unloaded: its engine thread stops, and its
weights go with the last reference to them.
"""

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from fastapi.concurrency import run_in_threadpool

from llogos_cli.errors import LlogosError
from llogos_cli.server.errors import ApiError

GGUF = ".gguf"


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


class Router:
    def __init__(self, models: dict[str, str], load: Callable, unload: Callable, models_max: int):
        """`load(name, source)` gives the app's LoadedModel (run on a worker thread); `unload(loaded)`
        stops its engine thread. models_max 0: no limit."""
        self.models, self._load, self._unload, self.models_max = models, load, unload, models_max
        self.loaded: OrderedDict = OrderedDict()   # name -> LoadedModel, least recently used first
        self._loading: dict[str, asyncio.Future] = {}
        self.failed: dict[str, str] = {}           # name -> why its last load failed

    async def get(self, name: str | None):
        if name is None or name not in self.models:
            available = ", ".join(self.models)
            given = "the request names no model" if name is None else f"model '{name}' is not served here"
            raise ApiError(404 if name else 400, f"{given}; available: {available}", param="model",
                           code="model_not_found")
        if name in self.loaded:
            self.loaded.move_to_end(name)
            return self.loaded[name]
        loading = self._loading.get(name)
        if loading is None:
            loading = self._loading[name] = asyncio.ensure_future(self._load_one(name))
        return await asyncio.shield(loading)

    async def _load_one(self, name: str):
        try:
            loaded = await run_in_threadpool(self._load, name, self.models[name])
        except (LlogosError, MemoryError) as e:
            self.failed[name] = str(e)
            raise ApiError(503, f"model '{name}' could not be loaded: {e}", code="model_load_failed") from None
        finally:
            self._loading.pop(name, None)
        self.failed.pop(name, None)
        self.loaded[name] = loaded
        await self._evict()
        return loaded

    async def _evict(self) -> None:
        """Unload the least recently used idle models while more than models_max are loaded; the one
        just loaded stays, and a model with requests in flight is never cut off."""
        while self.models_max and len(self.loaded) > self.models_max:
            idle = next((n for n, m in list(self.loaded.items())[:-1] if m.engine.in_flight == 0), None)
            if idle is None:
                return
            await run_in_threadpool(self._unload, self.loaded.pop(idle))

    def status(self, name: str) -> dict:
        if name in self.loaded:
            return {"value": "loaded"}
        if name in self._loading:
            return {"value": "loading"}
        return {"value": "unloaded", "failed": True} if name in self.failed else {"value": "unloaded"}

    def each_loaded(self) -> list:
        return list(self.loaded.values())
