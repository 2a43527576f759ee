// Write new keys or values x (T, n_kv, d) of a batch into a cache (kv_cache.cuh): token t goes to
// position pos[t] of slot slots[t], through the block tables in a paged cache. Slots, positions and
// tables come from device memory so that a captured decode step can be replayed for other rows at
// later positions.
#include "kv_cache.cuh"

template <class C>
__device__ void kv_store(const float* x, u8* cache, const int* slots, const int* pos, int T, int d,
                         kv_where where) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const int chunks = d / C::QK, n_kv = where.n_kv;
    if (i >= (i64)T * n_kv * chunks) return;
    const int e = (i % chunks) * C::QK, head = (i / chunks) % n_kv, t = i / ((i64)chunks * n_kv);
    u8* row = cache + where.row(slots[t], head, pos[t]) * C::row_bytes(d);
    C::store(row, e, x + ((i64)t * n_kv + head) * d + e);
}

#define KV_STORE(type)                                                                                     \
    extern "C" __global__ void kv_store_##type(const float* __restrict__ x, u8* __restrict__ cache,           \
                                               const int* __restrict__ slots, const int* __restrict__ pos,  \
                                               int T, int n_kv, int d, const int* __restrict__ tables,      \
                                               int paged, int max_blocks, int block_size) {                 \
        kv_store<kv_##type>(x, cache, slots, pos, T, d, kv_where{tables, paged, max_blocks, block_size, n_kv}); \
    }

KV_STORE(f32)
KV_STORE(f16)
KV_STORE(q8_0)
KV_STORE(q4_0)
KV_STORE(iq4_nl)
