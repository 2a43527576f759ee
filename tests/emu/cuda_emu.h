// The CUDA built-ins that cuda/*.cu use, for compiling those sources as host C++ (force-included
// before them). Each thread of a block runs as a fiber (emu_runtime.cpp): __syncthreads and warp
// shuffles switch fibers until every thread involved has arrived, so they really synchronize.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

// `used` keeps entry points in the preprocessed text where emulator.py finds them by name.
#define __global__ __attribute__((used))
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Blocks run one at a time on one OS thread, so a static is exactly a block's shared memory.
#define __shared__ static

struct uint3 { unsigned x, y, z; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(8) float2 { float x, y; };

namespace emu {
extern uint3 block_idx, block_dim, grid_dim;
const uint3& thread_idx();
int lane();
void sync_block();
// Publishes this lane's value and returns the one lane `src` published, after the whole warp has.
unsigned long long exchange(unsigned long long value, int src);
[[noreturn]] void fail(const char* what);
}  // namespace emu

#define threadIdx (emu::thread_idx())
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)

#define CHECK_ALIGNED(p, n) \
    ((reinterpret_cast<uintptr_t>(p) % (n)) ? emu::fail("misaligned " #n "-byte load") : (void)0)

inline void __syncthreads() {
    asm volatile("" ::: "memory");  // other fibers wrote shared memory meanwhile
    emu::sync_block();
    asm volatile("" ::: "memory");
}

template <class T>
T emu_shuffle(unsigned mask, T value, int src) {
    static_assert(sizeof(T) <= 8, "shuffled values are at most 8 bytes");
    if (mask != 0xffffffffu) emu::fail("only full-warp shuffles are emulated");
    unsigned long long bits = 0;
    std::memcpy(&bits, &value, sizeof(T));
    bits = emu::exchange(bits, src);
    std::memcpy(&value, &bits, sizeof(T));
    return value;
}

template <class T>
T __shfl_sync(unsigned mask, T value, int src, int width = 32) {
    return emu_shuffle(mask, value, (emu::lane() & ~(width - 1)) + (src & (width - 1)));
}

template <class T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
    const int src = emu::lane() ^ lane_mask;
    return emu_shuffle(mask, value, src < ((emu::lane() & ~(width - 1)) + width) ? src : emu::lane());
}

template <class T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = 32) {
    const int src = emu::lane() + (int)delta;
    return emu_shuffle(mask, value, src < ((emu::lane() & ~(width - 1)) + width) ? src : emu::lane());
}

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __expf(float x) { return std::exp(x); }
// The product and sum rounded each on its own, never joined into an FMA (the host does not join them either).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline void __trap() { emu::fail("__trap"); }
// Round to nearest even, as cvt.rni (the host's default rounding mode).
inline int __float2int_rn(float x) { return (int)std::nearbyint(x); }
// The 4 signed bytes of a times those of b, summed, plus c.
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
}

// IEEE binary16 <-> binary32, bit-exact with the GPU's cvt instructions and NumPy.
inline float f16_to_f32(unsigned short h) {
    const unsigned sign = (unsigned)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    if (exp == 0x1F) return __uint_as_float(sign | 0x7F800000u | (man << 13));
    if (exp != 0) return __uint_as_float(sign | ((exp + 112) << 23) | (man << 13));
    const float magnitude = std::ldexp((float)man, -24);  // subnormal or zero
    return sign ? -magnitude : magnitude;
}

inline unsigned short f32_to_f16(float f) {
    const unsigned u = __float_as_uint(f), sign = (u >> 16) & 0x8000, a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (unsigned short)(sign | 0x7E00 | ((a >> 13) & 0x3FF));  // NaN
    if (a >= 0x477FF000u) return (unsigned short)(sign | 0x7C00);  // rounds past 65504: infinity
    if (a < 0x38800000u) {  // below the smallest normal half: a multiple of 2^-24, rounded to even
        const float scaled = __uint_as_float(a) * 16777216.0f;  // exact: a power-of-two scale
        return (unsigned short)(sign | (unsigned)std::nearbyint(scaled));
    }
    const unsigned rounded = a + 0xFFF + ((a >> 13) & 1);  // round to nearest even on bit 13
    return (unsigned short)(sign | ((rounded - (112u << 23)) >> 13));
}

// Publishes this lane's fragments of a warp's mma (a[0..3], b[0..1]) and returns its warp's
// [lane][a[0..3], b[0..1]] once every lane's are in; valid until the caller's closing exchange.
inline unsigned (*emu_mma_fragments(const unsigned a[4], const unsigned b[2]))[6] {
    static unsigned frags[32][32][6];  // [warp][lane]
    const uint3& t = emu::thread_idx();
    const int warp = (int)((t.z * emu::block_dim.y + t.y) * emu::block_dim.x + t.x) / 32, lane = emu::lane();
    for (int i = 0; i < 4; i++) frags[warp][lane][i] = a[i];
    for (int i = 0; i < 2; i++) frags[warp][lane][4 + i] = b[i];
    emu::exchange(0, lane);
    return frags[warp];
}

// PTX mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 for a whole warp (cuda/mma_s8.cuh): each lane
// publishes its fragments, and each lane's four sums take the rows of A and columns of B from
// the lanes that PTX's fragment layout puts them in, so a kernel that fills fragments wrongly
// gets wrong sums here as on a GPU. The exchanges are warp barriers around the fragments' buffer.
inline void mma_s8_16x8x32(int c[4], const unsigned a[4], const unsigned b[2]) {
    const auto frags = emu_mma_fragments(a, b);
    const int lane = emu::lane();
    auto a_at = [&](int row, int k) {  // A[row][k]: register (row >= 8) + 2 (k >= 16) of lane 4 (row % 8) + (k % 16) / 4
        const unsigned r = frags[4 * (row % 8) + (k % 16) / 4][(row >= 8) + 2 * (k >= 16)];
        return (int)(signed char)(r >> (8 * (k % 4)));
    };
    auto b_at = [&](int k, int col) {  // B[k][col]: register (k >= 16) of lane 4 col + (k % 16) / 4
        const unsigned r = frags[4 * col + (k % 16) / 4][4 + (k >= 16)];
        return (int)(signed char)(r >> (8 * (k % 4)));
    };
    const int g = lane / 4, tg = lane % 4;
    for (int i = 0; i < 4; i++) {
        const int row = g + 8 * (i / 2), col = 2 * tg + i % 2;
        for (int k = 0; k < 32; k++) c[i] += a_at(row, k) * b_at(k, col);
    }
    emu::exchange(0, lane);  // every lane has read them before any lane writes the next
}

// PTX mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 for a whole warp (cuda/mma_f16.cuh), as
// mma_s8_16x8x32: each lane's sums take A's rows and B's columns from the lanes PTX's layout puts
// them in. The products of halves are exact in float; each sum is formed in double and rounded to
// float once with c, within the hardware's f32 accumulation (which may round inside the sum).
inline void mma_f16_16x8x16(float c[4], const unsigned a[4], const unsigned b[2]) {
    const auto frags = emu_mma_fragments(a, b);
    const int lane = emu::lane();
    auto half = [](unsigned r, int hi) { return (double)f16_to_f32((unsigned short)(r >> (16 * hi))); };
    auto a_at = [&](int row, int k) {  // A[row][k]: register (row >= 8) + 2 (k >= 8) of lane 4 (row % 8) + (k % 8) / 2
        return half(frags[4 * (row % 8) + (k % 8) / 2][(row >= 8) + 2 * (k >= 8)], k % 2);
    };
    auto b_at = [&](int k, int col) {  // B[k][col]: register (k >= 8) of lane 4 col + (k % 8) / 2
        return half(frags[4 * col + (k % 8) / 2][4 + (k >= 8)], k % 2);
    };
    const int g = lane / 4, tg = lane % 4;
    for (int i = 0; i < 4; i++) {
        const int row = g + 8 * (i / 2), col = 2 * tg + i % 2;
        double sum = c[i];
        for (int k = 0; k < 16; k++) sum += a_at(row, k) * b_at(k, col);
        c[i] = (float)sum;
    }
    emu::exchange(0, lane);  // every lane has read them before any lane writes the next
}
