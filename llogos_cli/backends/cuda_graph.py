"""Decode steps replayed from a CUDA graph: one launch per token instead of hundreds.

A decode step of a small model is bound by launch overhead, not by memory: SmolLM2-135M reads
~100 MB per token (~35 µs at H100 bandwidth) but launches ~400 kernels (~5 µs each from Python).
The first step is captured; each later one writes its token and position into the device buffers
the captured kernels read, and replays. Everything else a step touches is fixed at capture: the
weights, the KV cache, and the intermediates, which the capture keeps alive. Only one-token steps
are captured, which take the same kernels at every position.
"""

import numpy as np

from llogos_cli.errors import LlogosError


class DecodeGraph:
    def __init__(self, model, ctx):
        self.model, self.ctx = model, ctx
        self._graph = None
        self._logits = self._ids = self._pos = None

    def step(self, token: int):
        """Logits (1, n_vocab), on the device, of `token` at position ctx.n_past; advances ctx."""
        model, ctx, b = self.model, self.ctx, self.model.b
        if ctx.n_past >= ctx.n_ctx:
            raise LlogosError(f"context is full: {ctx.n_past} + 1 tokens exceed --ctx-size {ctx.n_ctx}")
        if not 0 <= token < model.cfg.n_vocab:
            raise LlogosError(f"token id {token} outside the vocabulary [0, {model.cfg.n_vocab})")
        if self._graph is None:
            # The forward pass reads its inputs from the buffers device_input hands out; the graph
            # takes them over, and the backend uses new ones from then on.
            ids = np.array([token], np.int32)
            self._ids = b.device_input("ids", ids)
            self._pos = b.device_input("pos", np.array([ctx.n_past], np.int32))
            self._graph, self._logits = b.k.capture(lambda: model.forward(ctx, ids))
            b.release_inputs()
        else:
            self._ids[...] = token
            self._pos[...] = ctx.n_past
            ctx.n_past += 1
        self._graph.launch()
        return self._logits
