"""Continuous batching: many requests in one running batch of cache slots.

Each step decodes one token for every running row and prefills prompt chunks of new rows within
a token budget; a row that finishes frees its slot, which the next waiting request takes at the
next step. The scheduler decides, the runner evaluates and samples, and the rows fold the tokens
in; `generate` is add-requests-then-step-until-done, pulling requests lazily so that a file of
millions of prompts never sits in memory.

The KV is a pool of blocks that rows take as they grow (engine/prefix_cache.py keeps the books,
the scheduler admits and preempts by them). With a prefix cache (prefix_cache_bytes > 0, the
default), every full block of a row's tokens is named as the row goes, and a request whose prompt
begins with named blocks, any earlier row's, starts after them, its table pointing at the same
blocks. Recurrent layers (Qwen3.5's DeltaNet, LFM2's short convolutions) carry a
state that a KV prefix cannot rebuild: such models run without the prefix cache.
"""

import hashlib
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from llogos_cli.backends import resolve_cache_types
from llogos_cli.engine.grammar import Grammar
from llogos_cli.engine.prefix_cache import BLOCK_SIZE, CACHE_RAM_MIB, BlockManager
from llogos_cli.engine.reasoning import Reasoning, Split
from llogos_cli.engine.runner import ModelRunner
from llogos_cli.engine.sampling import Sampler, SamplingParams
from llogos_cli.engine.scheduler import Scheduler
from llogos_cli.engine.speculation import Drafting, SpecParams, Speculator, verified
from llogos_cli.engine.completion import Completion, Timings, Token
from llogos_cli.engine.context_shift import ContextShift
from llogos_cli.engine.draft_model import DraftModel
from llogos_cli.engine.ngram_cache import NgramCache
from llogos_cli.engine.ngram_map import NgramMap
from llogos_cli.engine.ngram_mod import NgramMod
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.console import warn
from llogos_cli.errors import LlogosError
from llogos_cli.model import memory
from llogos_cli.model.forward import Model
from llogos_cli.model.memory import PREFILL_BATCH


@dataclass(frozen=True, slots=True)
class Request:
    id: object                       # any JSON value; results carry it back
    prompt: list[int]
    params: SamplingParams = SamplingParams()
    criteria: StopCriteria = StopCriteria()
    n_logprobs: int = 0
    grammar: Grammar | None = None   # constrains this request's output alone
    special: bool = False            # control tokens' text in the output instead of hidden
    reasoning: Reasoning | None = None   # a chat reply's: how its reasoning is told from its answer
    cache_prompt: bool = True        # may start from KV an earlier request left (llama-server's cache_prompt)
    n_keep: int | None = None        # prompt tokens a context shift keeps (-1: all; None: the engine's --keep)


@dataclass(slots=True)
class Result:
    id: object
    text: str
    tokens: list[int]                # generated ids, the end-of-generation token left out
    stop: str                        # "eos", "limit" or "stop-string"
    timings: Timings
    logprobs: list | None = None     # per token: [(id, logprob), ...]
    error: str | None = None         # why the request could not run (nothing else is set then)
    prefix_hit: int = 0              # prompt tokens whose KV came from the prefix cache
    context_full: bool = False       # it stopped because the context had no room left
    reasoning: Reasoning | None = None   # its request's

    def timings_record(self) -> dict:
        """llama-server's `timings` object: the engine's times, and the prompt tokens the cache gave."""
        return {**self.timings.as_dict(), "cache_n": self.prefix_hit}

    def as_dict(self) -> dict:
        """The JSON record: a chat reply with reasoning has its answer as "text" and its
        reasoning as "reasoning_content" (the server's field)."""
        if self.error is not None:
            return {"id": self.id, "error": self.error}
        split = self.reasoning.split(self.text) if self.reasoning else Split(content=self.text)
        d = {"id": self.id, "text": split.content, "tokens": self.tokens, "stop": self.stop,
             "timings": self.timings_record()}
        if split.reasoning:
            d["reasoning_content"] = split.reasoning
        if self.logprobs is not None:
            d["logprobs"] = [[[i, lp] for i, lp in top] for top in self.logprobs]
        return d


@dataclass(frozen=True, slots=True)
class Update:
    """What one step did for one request: the token it emitted, if any, and its result once done."""
    id: object
    token: Token | None
    result: Result | None


def check_fits(n_prompt: int, n_ctx: int) -> None:
    if n_prompt > n_ctx:
        raise LlogosError(f"prompt has {n_prompt} tokens, more than the context size {n_ctx} "
                          f"(raise it with -c/--ctx-size)")


def row_seed(seed: int, request_id) -> int:
    """A request's own random stream from the run's seed and its id, so its sampled text does not
    depend on what else is in the batch or in which order requests arrive."""
    digest = hashlib.sha256(f"{seed}:{json.dumps(request_id, sort_keys=True)}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


@dataclass(slots=True, eq=False)
class Row:
    request: Request
    completion: Completion           # what it has generated, and whether that has ended
    tokens: list[int]                # prompt + generated; the last one is not yet in the cache
    slot: int = -1
    n_cached: int = 0                # tokens of this row in the cache
    blocks: list[int] = field(default_factory=list)   # its block table: the blocks holding its tokens
    n_sealed: int = 0                # blocks at the head of its table named for prefix reuse
    prefix_hit: int = 0              # prompt tokens taken from the prefix cache
    copy_block: tuple | None = None  # (source, destination, positions) to copy before its next chunk
    restore: list | None = None      # recurrent state to restore before its next chunk
    mark_at: int = -1                # the position before which the runner snapshots its state
    mark: tuple | None = None        # (position, snapshot) of its recurrent state there
    shifted: bool = False            # its context has shifted (engine/context_shift.py)
    emitted: list[Token] = field(default_factory=list)
    drafting: Drafting = field(default_factory=Drafting)   # its speculative decoding
    started: float = 0.0
    first_token: float = 0.0

    @property
    def cache_prompt(self) -> bool:
        return self.request.cache_prompt

    def result(self, now: float, stop: str | None = None) -> Result:
        c = self.completion
        logprobs = [t.logprobs for t in self.emitted] if self.request.n_logprobs else None
        timings = Timings(prompt_n=len(c.prompt) - self.prefix_hit, prompt_ms=(self.first_token - self.started) * 1e3,
                          predicted_n=len(c.generated), predicted_ms=(now - self.first_token) * 1e3,
                          draft_n=self.drafting.n_drafted, draft_n_accepted=self.drafting.n_accepted)
        return Result(self.request.id, "".join(t.text for t in self.emitted) + c.tail,
                      [t.id for t in self.emitted], stop or c.stop, timings, logprobs, prefix_hit=self.prefix_hit,
                      context_full=c.context_full, reasoning=self.request.reasoning)


class BatchEngine:
    """Takes requests, steps them through the model in up to n_slots rows, and reports tokens and
    finished results. Results depend only on each request, never on its batch-mates."""

    def __init__(self, model: Model, tokenizer, n_slots: int, n_ctx: int,
                 cache_types: tuple[str | None, str | None] = (None, None), step_tokens: int = PREFILL_BATCH,
                 prefix_cache_bytes: int = CACHE_RAM_MIB << 20, keep_slots: bool = False,
                 speculation: SpecParams = SpecParams(), draft_model: Model | None = None,
                 context_shift: bool = False, n_keep: int = 0):
        self.tokenizer, self.n_ctx = tokenizer, n_ctx
        self.generates = bool(model.cfg.output)   # an encoder's engine only refuses, with a reason
        recurrent = any(model.cfg.recurrent)
        self.speculator = _speculator(speculation, draft_model, recurrent, n_slots, n_ctx)
        cache_prefixes = bool(prefix_cache_bytes) and not recurrent
        n_blocks = _kv_pool_blocks(model, cache_types, n_slots, n_ctx, prefix_cache_bytes if cache_prefixes else 0)
        self.scheduler = Scheduler(n_slots, step_tokens, BlockManager(n_blocks), cache_prefixes, keep_slots, recurrent)
        self.runner = ModelRunner(model, n_slots, n_ctx, cache_types, n_blocks)
        self.n_blocks = n_blocks   # the KV pool's, of BLOCK_SIZE positions each
        self.shift = (ContextShift(self.runner, self.scheduler.blocks, n_ctx, tokenizer.bos_id, recurrent, n_keep)
                      if context_shift else None)
        self._done: list[Update] = []    # requests that ended before needing a slot
        self._forks: dict[Row, list[Row]] = {}   # a prompt's first row -> its other choices, until it is prefilled

    @property
    def idle(self) -> bool:
        return self.scheduler.idle and not self._done and not self._forks

    @property
    def n_waiting(self) -> int:
        return len(self.scheduler.waiting) + sum(map(len, self._forks.values()))

    def add(self, request: Request) -> None:
        """Queue a request; a prompt that cannot run raises LlogosError and queues nothing."""
        self.add_choices([request])

    def add_choices(self, requests: list[Request]) -> None:
        """Queue requests of one prompt (a response's n choices), all or none. With a prefix cache the
        first prefills the prompt and the others wait for it, then start from the blocks it left."""
        if not self.generates:
            raise LlogosError("this model has no LM head: it makes embeddings (/v1/embeddings), not text")
        rows = [self._row(request) for request in requests]
        now = time.perf_counter()
        for row in rows:
            if row.completion.stop is not None:   # nothing to generate (n_predict 0, or no room left)
                self._done.append(Update(row.request.id, None, row.result(now)))
        rows = [row for row in rows if row.completion.stop is None]
        if not rows:
            return
        self.scheduler.add(rows[0])
        if self.scheduler.blocks is None or not self.scheduler.cache_prefixes:
            for row in rows[1:]:
                self.scheduler.add(row)
        elif len(rows) > 1:
            self._forks[rows[0]] = rows[1:]

    def _row(self, request: Request) -> Row:
        if not request.prompt:
            raise LlogosError("the prompt is empty after tokenization")
        n_vocab = self.tokenizer.n_vocab
        if any(not 0 <= t < n_vocab for t in request.prompt):
            raise LlogosError(f"a prompt token id is out of range (the vocabulary has {n_vocab} tokens)")
        check_fits(len(request.prompt), self.n_ctx)
        sampler = Sampler(request.params, self.n_ctx, self.tokenizer)
        completion = Completion(self.tokenizer, request.prompt, sampler, request.criteria, self.n_ctx,
                                request.n_logprobs, request.special, request.grammar, self.shift is not None)
        return Row(request, completion, list(request.prompt))

    def _release_forks(self, row: Row) -> None:
        """A first row's prompt is in the prefix cache (or never will be): its other choices may start."""
        for fork in self._forks.pop(row, ()):
            self.scheduler.add(fork)

    def cancel(self, request_id, keep: bool = True) -> Result | None:
        """Drop a request, waiting or running; its slot is free for the next step. -> its result so
        far (stop "cancelled"), None when no such request is queued. keep=False: a step was cut
        inside the forward pass, so the row's cache is not parked for reuse."""
        now = time.perf_counter()
        for first, forks in self._forks.items():
            for row in forks:
                if row.request.id == request_id:
                    forks.remove(row)
                    if not forks:
                        del self._forks[first]
                    return row.result(now, "cancelled")
        for row in list(self.scheduler.waiting):
            if row.request.id == request_id:
                self.scheduler.waiting.remove(row)
                self._release_forks(row)
                return row.result(now, "cancelled")
        for row in self.scheduler.running:
            if row.request.id == request_id:
                self._finish(row, keep)
                self._release_forks(row)
                return row.result(now, "cancelled")
        return None

    def step(self) -> list[Update]:
        updates, self._done = self._done, []
        if self.shift is not None:
            updates += self._make_room()
        work = self.scheduler.schedule(self._drafts())
        if not work:
            return updates
        now = time.perf_counter()
        for w in work:
            if not w.row.started:   # the row's first chunk
                w.row.started = now
            if w.samples:   # a constrained row's mask is computed while the forward pass runs
                w.row.completion.start_mask()
        chosen = self.runner.run(work)
        now = time.perf_counter()
        self._keep_blocks(work)
        sampling = [w for w in work if w.samples]   # before the rows take their new tokens
        for w in work:
            if not w.samples:
                w.row.n_cached = w.end
        for w, choices in zip(sampling, chosen):
            updates += self._fold(w, choices, now)
        return updates

    def _make_room(self) -> list[Update]:
        """Rows whose last token has no position left in the context: shifted, or ended."""
        updates = []
        for row in [row for row in self.scheduler.running if len(row.tokens) > self.n_ctx]:
            if not self.shift.make_room(row):
                row.completion.fill_context()
                self._finish(row)
                updates.append(Update(row.request.id, None, row.result(time.perf_counter())))
            elif self.speculator is not None:
                self.speculator.forget(row)
        return updates

    def _drafts(self) -> dict:
        """The tokens drafted for each decoding row that has a draft (speculative decoding)."""
        if self.speculator is None:
            return {}
        drafts = {row: self.speculator.draft(row) for row in self.scheduler.decoding}
        return {row: draft for row, draft in drafts.items() if draft}

    def _fold(self, w, choices, now: float) -> list[Update]:
        """Fold the tokens a sampling item chose into its row: the next one, or with a draft each
        drafted token the model chose too and then the one after. The cache holds the row's KV up
        to its last token: the item's and the drafted ones kept."""
        row, draft, updates = w.row, w.draft, []
        row.n_cached = w.end
        n_kept, ended = 0, None
        for i, (token_id, logprobs) in enumerate(verified(draft, choices)):
            if not row.completion.generated:
                row.first_token = now
                self._release_forks(row)
            n_kept += i < len(draft) and token_id == draft[i]
            token = row.completion.push(token_id, logprobs)
            if token is not None:
                row.emitted.append(token)
            if row.completion.stop is not None:
                ended = token
                break
            row.tokens.append(token_id)
            row.n_cached = w.end + n_kept
            updates.append(Update(row.request.id, token, None))
        if draft:
            self.speculator.kept(row, len(draft), n_kept)
        if row.completion.stop is not None:
            self._finish(row)
            updates.append(Update(row.request.id, ended, row.result(now)))
        return updates

    def _finish(self, row: Row, keep: bool = True) -> None:
        """The row ends: its slot freed, and the speculator told (ngram-cache's -lcd file takes its n-grams)."""
        self.scheduler.finish(row, keep)
        if self.speculator is not None:
            self.speculator.finished(row, not self.scheduler.running and not self.scheduler.waiting)

    def _keep_blocks(self, work) -> None:
        """Name each row's newly filled blocks for the prefix cache, while its row still holds them."""
        if not self.scheduler.cache_prefixes:
            return
        for w in work:
            row = w.row
            if not row.shifted:   # its KV past n_keep is no longer its tokens' alone
                row.n_sealed = self.scheduler.blocks.seal(row.blocks, row.tokens, w.end, row.n_sealed)

    def generate(self, requests: Iterable[Request]) -> Iterator[Result]:
        """Run every request, yielding each result as it finishes. Requests are pulled from the
        iterable only as slots come free, so it may be a lazy stream of any length."""
        pending = iter(requests)
        exhausted = False
        while True:
            while not exhausted and self.n_waiting <= self.scheduler.slots.n_free:
                request = next(pending, None)
                if request is None:
                    exhausted = True
                    continue
                try:
                    self.add(request)
                except LlogosError as e:   # one bad request never costs the others
                    yield Result(request.id, "", [], "", Timings(), error=str(e))
            if exhausted and self.idle:
                return
            for update in self.step():
                if update.result is not None:
                    yield update.result


def _speculator(params: SpecParams, draft_model: Model | None, recurrent: bool, n_slots: int,
                n_ctx: int) -> Speculator | None:
    """What drafts for the rows: n-grams, a draft model, or nothing."""
    if params.spec_draft_model is not None and draft_model is None:
        raise LlogosError("speculation with a draft model needs the draft model loaded (draft_model)")
    if not params.on:
        return None
    if recurrent:
        warn("speculative decoding is off: this model's recurrent layers cannot step back from a rejected draft")
        return None
    if draft_model is not None:
        return DraftModel(params, draft_model, n_slots, n_ctx)
    kinds = {"ngram-mod": NgramMod, "ngram-map-k": NgramMap, "ngram-map-k4v": NgramMap, "ngram-cache": NgramCache}
    return kinds.get(params.spec_type, Speculator)(params)


def _kv_pool_blocks(model: Model, cache_types: tuple[str | None, str | None], n_slots: int, n_ctx: int,
                    prefix_cache_bytes: int) -> int:
    """Blocks of the KV pool (see memory.kv_pool_blocks)."""
    return memory.kv_pool_blocks(model.cfg, "cuda" if model.backend.name == "cuda" else "cpu",
                                 *resolve_cache_types(cache_types), BLOCK_SIZE, n_slots, n_ctx, prefix_cache_bytes)

