"""The engine's own thread: it takes requests from the event loop, steps the running batch, and
hands every request's tokens back to the loop as they come. Other work on the model (embeddings)
is handed to it as calls, run between steps.

The event loop never touches the engine. It submits and cancels through a locked inbox that the
thread drains between steps (so a cancelled request's slot is free by the next step), and it gets
each request's events on an asyncio.Queue; the thread fills them all with one call_soon_threadsafe
per step, so waking the loop costs the same for one stream as for a full batch.
"""

import asyncio
import threading
import traceback
from collections.abc import Callable

from llogos_cli.console import err
from llogos_cli.engine.batch import BatchEngine, Request
from llogos_cli.errors import LlogosError
from llogos_cli.server.metrics import Metrics

ACCEPTED = "accepted"   # a request's first event when the engine took it; else a LlogosError


class Busy(Exception):
    """Every slot is taken and the wait queue is full."""


class ShuttingDown(LlogosError):
    """The event in place of a request's result when the server stopped before it finished."""


class CallFailed(LlogosError):
    """A call's result when it failed for want of memory or by a bug, not by its input."""


class EngineThread:
    def __init__(self, engine: BatchEngine, loop: asyncio.AbstractEventLoop, n_slots: int, queue_size: int,
                 metrics: Metrics):
        self.engine, self.metrics = engine, metrics
        self.capacity = n_slots + queue_size   # engine requests (a response's choices each count) running or waiting
        self._loop = loop
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._adds: list[tuple[tuple[Request, ...], asyncio.Queue]] = []
        self._cancels: list[str] = []
        self._calls: list[tuple[Callable, asyncio.Future]] = []
        self._stopping = self._closing = False
        self._in_flight = 0
        self._events: dict[str, asyncio.Queue] = {}   # the thread's own: requests the engine holds
        self._thread = threading.Thread(target=self._run, name="llogos-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, requests: tuple[Request, ...]) -> asyncio.Queue:
        """Queue the requests of one response's choices, all or none (event loop side); their events
        arrive on the returned queue: ACCEPTED or a LlogosError, then each request's Updates, until
        each has had the one that carries its result."""
        events: asyncio.Queue = asyncio.Queue()
        with self._lock:
            if self._stopping:   # a router unloaded this model after the request picked it
                events.put_nowait(ShuttingDown("the model was unloaded"))
                return events
            if self._in_flight + len(requests) > self.capacity:
                raise Busy
            self._in_flight += len(requests)
            self._adds.append((requests, events))
        self._wake.set()
        return events

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def call(self, fn: Callable) -> asyncio.Future:
        """Run fn() on this thread before the next step (event loop side): the future gets its value,
        or the LlogosError it raised (ShuttingDown once the server is stopping)."""
        future = self._loop.create_future()
        with self._lock:
            self._calls.append((fn, future))
        self._wake.set()
        return future

    def cancel(self, request_id: str) -> None:
        with self._lock:
            self._cancels.append(request_id)
        self._wake.set()

    def close(self) -> None:
        """End every request in flight (each gets ShuttingDown) and refuse new ones."""
        with self._lock:
            self._closing = True
        self._wake.set()

    def stop(self, timeout: float) -> None:
        with self._lock:
            self._stopping = True
        self._wake.set()
        self._thread.join(timeout)

    def _release(self, n: int = 1) -> None:
        with self._lock:
            self._in_flight -= n

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._stopping:
                    return
                adds, self._adds = self._adds, []
                cancels, self._cancels = self._cancels, []
                calls, self._calls = self._calls, []
                closing = self._closing
            out = self._end_all(adds) if closing else self._admit(adds)
            settled = [(future, _run_call(fn, closing)) for fn, future in calls]
            if settled:
                self._loop.call_soon_threadsafe(_settle, settled)
            for rid in cancels:
                if self._events.pop(rid, None) is not None:
                    self.engine.cancel(rid)
                    self._release()
            generated = prompt = cached = 0
            drafts = (0, 0)
            if not self.engine.idle:
                step, generated, prompt, cached, drafts = self._step()
                out += step
            scheduler = self.engine.scheduler
            self.metrics.step(generated, prompt, cached, len(scheduler.running), self.engine.n_waiting,
                              scheduler.n_preempted, *drafts)
            if out:
                self._loop.call_soon_threadsafe(_deliver, out)
            if self.engine.idle:
                self._wake.wait()
                self._wake.clear()

    def _admit(self, adds: list[tuple[tuple[Request, ...], asyncio.Queue]]) -> list:
        out = []
        for requests, events in adds:
            try:
                self.engine.add_choices(list(requests))
            except LlogosError as e:
                out.append((events, e))
                self._release(len(requests))
                continue
            for request in requests:
                self._events[request.id] = events
            out.append((events, ACCEPTED))
        return out

    def _end_all(self, adds: list[tuple[tuple[Request, ...], asyncio.Queue]]) -> list:
        out = [(events, ShuttingDown("the server is shutting down")) for _, events in adds]
        for requests, _ in adds:
            self._release(len(requests))
        for rid, events in self._events.items():
            self.engine.cancel(rid)
            self._release()
            out.append((events, ShuttingDown("the server is shutting down")))
        self._events.clear()
        return out

    def _step(self) -> tuple[list, int, int, int, tuple[int, int]]:
        """One engine step: the events for the loop, tokens generated, the prompt tokens of finished
        requests, all and those taken from the prefix cache, and their drafted and accepted tokens."""
        try:
            updates = self.engine.step()
        except Exception as e:   # a bug or out of memory: fail what is in flight, keep serving the next ones
            err.print("[red]engine step failed:[/red]")
            err.print(traceback.format_exc(), markup=False, highlight=False)
            failed = [(events, LlogosError(f"the engine failed: {type(e).__name__}: {e}"))
                      for events in self._events.values()]
            for rid in list(self._events):
                self.engine.cancel(rid)
                self._release()
            self._events.clear()
            return failed, 0, 0, 0, (0, 0)
        out, generated, prompt, cached, drafted, accepted = [], 0, 0, 0, 0, 0
        for u in updates:
            events = self._events.get(u.id)
            if events is None:
                continue
            if u.token is not None or (u.result is not None and u.result.timings.predicted_n):
                generated += 1
            if u.result is not None:
                prompt += u.result.timings.prompt_n + u.result.prefix_hit
                cached += u.result.prefix_hit
                drafted += u.result.timings.draft_n
                accepted += u.result.timings.draft_n_accepted
                del self._events[u.id]
                self._release()
            out.append((events, u))
        return out, generated, prompt, cached, (drafted, accepted)


def _run_call(fn: Callable, closing: bool):
    """fn()'s value, or the LlogosError in its place."""
    if closing:
        return ShuttingDown("the server is shutting down")
    try:
        return fn()
    except LlogosError as e:
        return e
    except Exception as e:   # a bug or out of memory: this call fails, the engine serves on
        err.print("[red]engine call failed:[/red]")
        err.print(traceback.format_exc(), markup=False, highlight=False)
        return CallFailed(f"the engine failed: {type(e).__name__}: {e}")


def _settle(settled: list) -> None:
    for future, value in settled:
        if future.done():   # its request was cancelled (the client left)
            continue
        if isinstance(value, LlogosError):
            future.set_exception(value)
        else:
            future.set_result(value)


def _deliver(out: list) -> None:
    for events, item in out:
        events.put_nowait(item)
