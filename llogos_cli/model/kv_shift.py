"""A slot's KV moved down the positions, keys turned back by RoPE: the cache's part of a context shift.

RoPE turns the key at position p by p times each pair's frequency, so a key moved from p to p - d
is the key turned by -d: exactly (up to rounding) what the same key vector rotated at p - d would
be, as llama.cpp's K-shift computes it. The turn is a pure rotation: the magnitude a family's RoPE
scales keys by (Phi-3's attn_factor, YaRN's) was applied once when the key was stored. Values and
layers without RoPE only move.
"""

from llogos_cli.model.cache import Cache
from llogos_cli.model.forward import Model


def shift_kv(model: Model, cache: Cache, slot: int, n_keep: int, n_discard: int, n_past: int) -> None:
    """Slot's positions n_keep + n_discard .. n_past - 1 move to n_keep.., over positions
    n_keep .. n_keep + n_discard - 1, in every attention layer (a paged slot through its row of
    block_tables, which must be written already)."""
    c, b = model.cfg, model.backend
    factors = model.rope_factors(cache.n_ctx)
    src = n_keep + n_discard
    for il, kv in enumerate(cache.kv):
        if kv is not None:
            rope = model.rope_args(il, factors)[:5] if c.rope_layers[il] else None
            b.kv_shift(kv, slot, src, n_past - src, n_discard, rope)
