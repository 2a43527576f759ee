"""The KV cache's context shift on the NumPy backend (kv_shift): positions moved down a slot, keys
turned back by RoPE through the backend's own rope, stored again as the cache type rounds them."""

import numpy as np

from llogos_cli.backends.cpu.numpy_attention import KVCache, _cache_round, _floats


class KVShiftOps:
    """Mixed into NumpyBackend."""

    def kv_shift(self, cache: KVCache, slot: int, src: int, n: int, delta: int, rope: tuple | None) -> None:
        """Positions src..src+n-1 of slot move to src-delta.., the keys turned by -delta positions
        with rope = (dims, base, freq_scale, neox, factors) (None: only moved)."""
        slots = np.full(n, slot, np.int32)
        pos = np.arange(src, src + n, dtype=np.int32)
        first, at = cache.where(slots, pos)
        k = _floats(cache.k[first, :, at], cache.type_k)             # (n, n_kv, dk), decoded
        v = cache.v[first, :, at]                                      # (n, n_kv, dv) as stored, a copy
        if rope is not None:
            k = self.rope(k, np.full(n, -delta, np.int32), *rope)    # (n, n_kv, dk)
        first, at = cache.where(slots, pos - delta)
        cache.k[first, :, at] = _cache_round(k, cache.type_k)
        cache.v[first, :, at] = v
