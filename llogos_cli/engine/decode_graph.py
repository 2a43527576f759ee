"""Decode steps replayed from CUDA graphs: one launch per step instead of hundreds.

The runner's graph capture (nano-vllm's capture_cudagraph): a decode step of a small model is bound
by kernel launches, not by memory, so the step's launches are recorded once and replayed. A step of
R rows (one token each, of R sequences) is padded to the next bucket size with rows at the
cache's scratch pad_slot, position 0, and each bucket is captured once, on first use. Later steps
write their tokens, slots and positions into the device buffers the captured kernels read, and
replay. Everything else a step touches is fixed at capture: the weights, the cache, and the
intermediates, which the capture keeps alive. The launches of a bucket's step are the same
whatever rows it holds (cuda_batch), which is what makes the replay valid. The backend offers
only the primitives: capture(fn), device_input(name, values), release_inputs().

Rows may also be several tokens of one slot at consecutive positions: a short prompt, or a
decoding row and its draft (engine/speculation.py). A step's kernels store every row's keys and
values of a layer before any row's attention in it, and each row attends its slot's cache up to its
own position, so such rows give the prompt's own logits, from one replay instead of a prompt's
hundreds of launches. Recurrent layers step each row from its slot's state as it was before the
step, so a model with them takes rows of distinct slots only.
"""

import functools

import numpy as np

from llogos_cli.errors import LlogosError

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
# A run of up to this many tokens of one slot goes through the decode step as rows (prompt_rows).
# Up to here a prompt run eagerly takes the same kernel families as the rows do (fused attention,
# FUSED_MAX_TOKENS; batched products below GEMM_MIN_TOKENS), so the replay only drops launches;
# longer runs keep the eager pass's GEMM attention. Not measured on a GPU yet: bench_cuda's TTFT
# at 5 tokens is the figure, and a 16-to-32-token prompt's is the one to move it by.
PROMPT_ROWS = 16


def decode_step(model, cache):
    """The decode step of R rows of the cache, one token each: step(tokens, slots, pos) -> logits
    (R, n_vocab) as backend arrays; replayed from CUDA graphs where the backend captures them."""
    if model.backend.graphs:
        return GraphDecoder(model, cache).step
    return functools.partial(model.forward_rows, cache)


def prompt_rows(model) -> int:
    """How many tokens of one slot a decode step takes as rows (a short prompt, a drafted row):
    PROMPT_ROWS where the step is a graph replay and the model has no recurrent layers; else 1 (a
    CPU forward pass is one pass either way, and its rows' LM head would cost more than it saves)."""
    return PROMPT_ROWS if model.backend.graphs and not any(model.cfg.recurrent) else 1


class GraphDecoder:
    """step(tokens, slots, pos) -> logits (R, n_vocab) of one decode step of a cache's rows."""

    def __init__(self, model, cache, buckets: tuple[int, ...] = BUCKETS):
        self.model, self.cache, self.buckets = model, cache, buckets
        self._graphs: dict[int, _BucketGraph] = {}

    def step(self, tokens, slots, pos):
        """Logits on the device, valid until the next step (a replay rewrites them)."""
        tokens, slots, pos = (np.asarray(a, np.int32).reshape(-1) for a in (tokens, slots, pos))
        self._check(tokens, slots, pos)
        most = self.buckets[-1]
        if len(tokens) <= most:
            return self._replay(tokens, slots, pos)
        # More rows than the largest bucket: in chunks of it, each copied out before the next replay.
        out = self.model.backend.xp.empty((len(tokens), self.model.cfg.n_vocab), np.float32)
        for r0 in range(0, len(tokens), most):
            r = slice(r0, r0 + most)
            out[r] = self._replay(tokens[r], slots[r], pos[r])
        return out

    def _check(self, tokens: np.ndarray, slots: np.ndarray, pos: np.ndarray) -> None:
        cache, n_vocab = self.cache, self.model.cfg.n_vocab
        if not len(tokens) == len(slots) == len(pos) > 0:
            raise LlogosError("a decode step needs one slot and one position per token")
        if tokens.min() < 0 or tokens.max() >= n_vocab:
            raise LlogosError(f"token id outside the vocabulary [0, {n_vocab})")
        if slots.min() < 0 or slots.max() >= cache.n_slots:
            raise LlogosError(f"a decode step's rows need slots in [0, {cache.n_slots})")
        if pos.min() < 0 or pos.max() >= cache.n_ctx:
            raise LlogosError(f"context is full: position {pos.max()} is past --ctx-size {cache.n_ctx}")
        if len(np.unique(slots)) != len(slots):
            if any(self.model.cfg.recurrent):
                raise LlogosError("a decode step of a model with recurrent layers needs distinct slots")
            if len(np.unique(slots.astype(np.int64) * cache.n_ctx + pos)) != len(slots):
                raise LlogosError("a decode step's rows of one slot need distinct positions")

    def _replay(self, tokens: np.ndarray, slots: np.ndarray, pos: np.ndarray):
        rows = len(tokens)
        size = next(n for n in self.buckets if n >= rows)
        graph = self._graphs.get(size)
        if graph is None:
            graph = self._graphs[size] = _BucketGraph(self.model, self.cache, size)
        pad = size - rows
        graph.launch(np.pad(tokens, (0, pad)), np.pad(slots, (0, pad), constant_values=self.cache.pad_slot),
                     np.pad(pos, (0, pad)))
        return graph.logits[:rows]


class _BucketGraph:
    """The captured step of `size` rows."""

    def __init__(self, model, cache, size: int):
        b = model.backend
        tokens, slots, pos = np.zeros(size, np.int32), np.full(size, cache.pad_slot, np.int32), np.zeros(size, np.int32)
        # First one step run eagerly, on padding rows (they write only the scratch slot): it compiles
        # the kernels and makes the buffers the backend keeps and grows on demand (dequantization
        # scratch, decoded conv kernels, rope factors) outside the capture, which must not allocate
        # memory that outlives it.
        model.forward_rows(cache, tokens, slots, pos)
        # The forward pass reads its inputs from the buffers device_input hands out; the graph takes
        # them over, and the backend uses new ones from then on.
        self.ids, self.slots, self.pos = (b.device_input(name, a) for name, a in
                                          (("ids", tokens), ("slots", slots), ("pos", pos)))
        self._graph, self.logits = b.capture(lambda: model.forward_rows(cache, tokens, slots, pos))
        b.release_inputs()
        self._xp = b.xp

    def launch(self, tokens: np.ndarray, slots: np.ndarray, pos: np.ndarray) -> None:
        for buffer, values in ((self.ids, tokens), (self.slots, slots), (self.pos, pos)):
            buffer[...] = self._xp.asarray(values)
        self._graph.launch()
