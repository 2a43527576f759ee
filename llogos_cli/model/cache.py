"""What a forward pass reads and writes besides the weights: the KV cache of attention layers and
the recurrent state of the rest, for every slot (Cache), or for one sequence (Context)."""

import dataclasses
from dataclasses import dataclass


@dataclass(slots=True)
class Cache:
    """The KV cache of attention layers and the recurrent state of the rest, one region per slot
    (the first axis of every array); slot n_slots is the scratch pad_slot. A paged cache's KV is a
    pool of blocks instead, block_tables[slot] listing the blocks that hold the slot's positions
    in order (its first entries only: as many as the slot's sequence has reached)."""
    n_slots: int
    n_ctx: int
    kv: list
    state: list
    block_tables: object = None   # paged: backend int32 (n_slots + 1, ceil(n_ctx / block size))

    @property
    def pad_slot(self) -> int:
        return self.n_slots

    def reset(self, slot: int) -> None:
        """Start a new sequence in slot: its recurrent state back to zeros (KV entries past a
        sequence's length are never read, so they need no clearing)."""
        for s in self.state:
            if s is not None:
                for f in dataclasses.fields(s):
                    getattr(s, f.name)[slot] = 0

    def copy_block(self, dst: int, src: int, n: int) -> None:
        """Paged: copy the attention layers' KV of block src's first n positions into block dst, in
        place (a captured CUDA graph keeps reading these arrays). Every backend lays a paged
        layer's KV out as (block, head, position, ...)."""
        for kv in self.kv:
            if kv is not None:
                kv.k[dst, :, :n] = kv.k[src, :, :n]
                kv.v[dst, :, :n] = kv.v[src, :, :n]

    def snapshot(self, slot: int) -> list:
        """A copy of slot's recurrent state (its size does not grow with the context)."""
        return [None if s is None else [getattr(s, f.name)[slot].copy() for f in dataclasses.fields(s)]
                for s in self.state]

    def restore(self, slot: int, snap: list) -> None:
        """Copy a snapshot back into the arrays in place, which a captured CUDA graph keeps reading."""
        for current, saved in zip(self.state, snap):
            if current is not None:
                for f, arr in zip(dataclasses.fields(current), saved):
                    getattr(current, f.name)[slot] = arr


@dataclass(slots=True)
class Context:
    """One sequence in slot 0 of its own cache, with the number of positions it holds."""
    cache: Cache
    n_past: int = 0

    @property
    def n_ctx(self) -> int:
        return self.cache.n_ctx
