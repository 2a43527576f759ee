// The (token, choice) pairs of a batch grouped by expert, a counting sort: offsets (n_expert + 1)
// with offsets[e] the first grouped place of expert e's pairs and offsets[n_expert] = P, and order
// (P) the pairs p = t * k + j in that grouping, each expert's in ascending p (stable), from
// experts (P), every entry in [0, n_expert).
//
// One block of MOE_SORT_THREADS: thread i owns experts i, i + MOE_SORT_THREADS, ... (at most
// MOE_SORT_MAX_EXPERTS in all) and counts, then places, its own pairs on two passes over the
// experts read a tile at a time into shared memory. A pass is P shared loads a thread (4096 for a
// 512-token prompt with k = 8: tens of µs at most, estimated, not timed), small beside the
// products it lets read each expert's matrix once; and with no atomics the grouping is the same
// on every run.
#include "common.cuh"

#define MOE_SORT_THREADS 256
#define MOE_SORT_MAX_EXPERTS 1024
#define MOE_SORT_TILE 1024
#define MOE_SORT_OWN (MOE_SORT_MAX_EXPERTS / MOE_SORT_THREADS)   // experts a thread owns, at most

extern "C" __global__ void __launch_bounds__(MOE_SORT_THREADS)
    moe_sort_i32(const int* __restrict__ experts, int* __restrict__ order, int* __restrict__ offsets, int pairs,
                 int n_expert) {
    __shared__ int tile[MOE_SORT_TILE];
    __shared__ int start[MOE_SORT_MAX_EXPERTS + 1];
    const int tid = threadIdx.x, nt = MOE_SORT_THREADS;
    int next[MOE_SORT_OWN] = {};   // pass 1: pairs counted; pass 2: the next place of each owned expert
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            for (int j = 0; tid + j * nt < n_expert; j++) start[tid + j * nt] = next[j];
            __syncthreads();
            if (tid == 0) {   // exclusive scan of the counts: at most MOE_SORT_MAX_EXPERTS adds
                int sum = 0;
                for (int e = 0; e < n_expert; e++) {
                    const int count = start[e];
                    start[e] = sum;
                    sum += count;
                }
                start[n_expert] = sum;
            }
            __syncthreads();
            for (int e = tid; e <= n_expert; e += nt) offsets[e] = start[e];
            for (int j = 0; tid + j * nt < n_expert; j++) next[j] = start[tid + j * nt];
        }
        for (int p0 = 0; p0 < pairs; p0 += MOE_SORT_TILE) {
            const int n = min(MOE_SORT_TILE, pairs - p0);
            __syncthreads();   // the last tile read by all
            for (int i = tid; i < n; i += nt) tile[i] = experts[p0 + i];
            __syncthreads();
            for (int i = 0; i < n; i++) {
                const int e = tile[i];
                if (e % nt != tid) continue;
                if (pass == 0) next[e / nt]++;
                else order[next[e / nt]++] = p0 + i;
            }
        }
    }
}
