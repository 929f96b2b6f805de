// Softmax over the last dimension, with temperature: y = softmax(x / t).
//
// Numerics: max-subtracted, computed in f32 as p = exp2((x - m) * log2(e) / t) with m the
// row's maximum of x (t > 0, so max(x / t) = max(x) / t), y = p / sum(p), rounded once to
// the output type. Special values, per row:
//  - every element -inf (a fully masked row): y = 0 everywhere (defined, not NaN);
//  - -inf elements among finite ones: y = 0 there;
//  - any NaN or +inf in the row: the whole row is NaN (the maximum is NaN-propagating).
//
// Paths, chosen per call on the host:
//  - register: n a multiple of the 16-byte vector width of the input, x and y 16-byte
//    aligned, n <= 1024 * 4 vectors (32768 f16/bf16, 16384 f32). Block per row; the row is
//    read once into registers, block max, block sum, written once (2 passes over registers,
//    1 over memory). Few rows: up to 1024 threads per row; >= 1024 rows: 256 threads.
//  - cluster (sm_90+ only; vectors as above, 4096 < n / vec <= 8 * 256 * 16 vectors, i.e.
//    n <= 262144 f16/bf16, 131072 f32): one thread-block cluster of 8 blocks of 256 threads
//    per row (clusters loop over rows when there are many). Each block holds its eighth of
//    the row in registers (VPT = 4, 8 or 16 vectors per thread), computes its block's
//    (max, sum of exp2) from them, and the 8 pairs are exchanged through distributed shared
//    memory (one cluster.sync per row) and merged; then each block writes its part. One read
//    and one write of the data, whatever the number of rows. The host takes this path only
//    on a device of compute capability >= 9 whose loaded kernel image is sm_90+ code (a
//    build with only compute_80 PTX JIT-compiles the empty body: never launched), and falls
//    back to the other paths if the cluster launch is refused.
//  - split (few long rows: rows < 128, n > 4096, a workspace given, and not the cluster
//    path): each row is cut into chunks, one block of 256 threads per (row, chunk), with the
//    chunk length chosen so that rows * chunks ~ 4 * SMs and each thread has >= 8 vectors
//    (or 8 elements on the scalar path). Kernel 1 writes the chunk's (max, sum) to the
//    workspace; kernel 2 merges the row's partials and writes its chunk, re-reading x (from
//    L2). The workspace is sized for the shortest chunk (2048 elements).
//    With `prefetch` (FL_SOFTMAX_LONG=cluster_pf) each block also asks the L2 for its part of
//    the cluster's next row (cp.async.bulk.prefetch) as soon as it has issued the loads of
//    the current row, so the next row's DRAM reads overlap this row's reductions, cluster
//    barrier and writes.
//  - twopass (only when forced; sized for many long rows: rows >= SMs, 16-byte vectors, the
//    rows in flight in ~60% of L2): one block of 1024 threads per row, one block per
//    SM, looping over rows. Pass 1 reads the row once: the first 2 vectors per thread (32 KB;
//    more would spill under the 64-register cap of 1024 threads) stay in registers, the rest
//    streams through an online (max, sum) with 4 vectors per thread in flight (64 KB per
//    SM), loaded with an L2 evict_last policy; block merge; pass 2 writes the register part
//    and re-reads the rest (from L2: at most SMs x (row - 32 KB) bytes are live, under ~60%
//    of L2; loads marked evict-first, stores streaming). DRAM sees one read and one write of
//    the data; no cross-SM barrier, no cluster scheduling.
//  - generic: anything else (unaligned, odd n, long rows with many rows before sm_90, no
//    workspace). Block of up to 1024 threads per row: one online (max, sum) pass, merged
//    over the block, then a pass that re-reads x and writes y. For long rows the grid is
//    capped at one block per SM so that the rows in flight fit in L2 and the second read
//    mostly hits it.
// Long-row path override (read once per process, for A/B runs; any value is correct, only
// speed moves): FL_SOFTMAX_LONG = cluster (the cluster path wherever it applies, else split /
// generic: the behaviour before twopass existed), cluster_pf (the same with the next-row L2
// prefetch), cluster_db (the same with the next row's loads issued into a second register set
// before the current row's writes; measured 20-35 points slower on the H100), twopass (twopass for every row the register path does not take, on any GPU),
// portable (split / generic only, as before sm_90). Unset or anything else: automatic
// (cluster, split, generic: the measured order; twopass and cluster_pf were slower on the
// H100, see bench/RESULTS.md). fl_softmax_path
// selects the same per call (tests). FL_SOFTMAX_CLUSTER_GRID (an experiment; on the H100 neither "rows" nor "resident" beat the default)
// sets how many clusters the cluster path launches: unset 2 per SM (each loops over ~rows / (2
// SMs) rows, and the rows are dealt out in whole-cluster units, so the last wave can leave SMs
// idle), "rows" one per row, "resident" as many as fit at once, or a number.
// Every element of y is written by the thread that reads the same element of x, so y may
// alias x when the dtypes are equal.
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <cooperative_groups.h>

#include "common/common.cuh"

namespace fl {
namespace softmax_detail {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int64_t kMinChunk = 2048;     // split path: shortest chunk (sizes the workspace)
constexpr int kChunkThreads = 256;      // split path: threads per block
constexpr int64_t kSplitMaxRows = 128;  // split path only for fewer rows than this
constexpr int kCluster = 8;             // cluster path: blocks per cluster (portable maximum)
constexpr int kClusterThreads = 256;    // cluster path: threads per block
constexpr int kClusterMaxVpt = 16;      // cluster path: most vectors per thread
constexpr int kTpThreads = 1024;        // twopass: threads per block (one block per SM)
constexpr int kTpKeep = 2;              // twopass: vectors per thread kept in registers
constexpr int kTpUnroll = 4;            // twopass: vectors per thread in flight (streamed part)

// The larger of a and b; NaN when either is NaN.
__device__ __forceinline__ float nanmax(float a, float b) { return (a > b || a != a) ? a : b; }

__device__ __forceinline__ float warp_nanmax(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = nanmax(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// NaN-propagating block max; every thread gets the result. scratch: >= 32 floats.
__device__ __forceinline__ float block_nanmax(float x, float *scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    x = warp_nanmax(x);
    __syncthreads();
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    x = lane < nwarps ? scratch[lane] : -INFINITY;
    return warp_nanmax(x);
}

// Running statistics of a set of x: m = max x, s = sum exp2((x - m) * scale).
// The empty set is {-inf, 0}; so is a set of only -inf.
struct Stats {
    float m, s;
};

// 2^x by the bare MUFU.EX2 (ex2.approx.ftz, max rel. error 2^-22 as exp2f's): results below
// 2^-126 flush to 0, so probabilities under 1.2e-38 come out as 0 (f32 and bf16 outputs could
// hold them as denormals; f16 flushes far above). exp2f adds a range fix-up for them around
// the same instruction: 3 more instructions per element and pass. Measured on the H100
// (bench/RESULTS.md, session 11): bf16 2048 x 128256 427.7 -> 407.8 us in the cluster path.
__device__ __forceinline__ float ex2_ftz(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ Stats merge(Stats a, Stats b, float scale) {
    const float m = nanmax(a.m, b.m);
    if (m == -INFINITY) return {m, 0.f};
    return {m, a.s * ex2_ftz((a.m - m) * scale) + b.s * ex2_ftz((b.m - m) * scale)};
}

// Adds K values to the running statistics (one rescale per call).
template <int K>
__device__ __forceinline__ void update(Stats &t, const float (&v)[K], float scale) {
    float vm = v[0];
#pragma unroll
    for (int j = 1; j < K; ++j) vm = nanmax(vm, v[j]);
    const float m = nanmax(t.m, vm);
    if (m == -INFINITY) return;  // nothing but -inf so far: s stays 0
    float s = t.s * ex2_ftz((t.m - m) * scale);
#pragma unroll
    for (int j = 0; j < K; ++j) s += ex2_ftz((v[j] - m) * scale);
    t = {m, s};
}

__device__ __forceinline__ Stats warp_merge(Stats t, float scale) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        Stats u{__shfl_xor_sync(0xffffffffu, t.m, o), __shfl_xor_sync(0xffffffffu, t.s, o)};
        t = merge(t, u, scale);  // commutative: every lane ends with the same value
    }
    return t;
}

// Block-wide merge; every thread gets the result. scratch: >= 64 floats.
__device__ __forceinline__ Stats block_merge(Stats t, float *scratch, float scale) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    t = warp_merge(t, scale);
    __syncthreads();
    if (lane == 0) {
        scratch[warp] = t.m;
        scratch[32 + warp] = t.s;
    }
    __syncthreads();
    Stats u = lane < nwarps ? Stats{scratch[lane], scratch[32 + lane]} : Stats{-INFINITY, 0.f};
    return warp_merge(u, scale);
}

// Stores N f32 values to p as T, in accesses of at most 16 bytes (p aligned to
// min(16, N * sizeof(T)) bytes).
template <typename T, int N> __device__ __forceinline__ void store_f32(T *p, const float (&v)[N]) {
    constexpr int W = (N * (int)sizeof(T) > 16) ? 16 / (int)sizeof(T) : N;
#pragma unroll
    for (int c = 0; c < N / W; ++c) {
        Vec<T, W> o;
#pragma unroll
        for (int j = 0; j < W; ++j) o.v[j] = from_f32<T>(v[c * W + j]);
        reinterpret_cast<Vec<T, W> *>(p)[c] = o;
    }
}

__device__ __forceinline__ float prob(float v, float m, float inv, float scale, bool zero) {
    return zero ? 0.f : ex2_ftz((v - m) * scale) * inv;
}

// This thread's statistics over x[begin, end), elements strided over the block.
// VEC: 16-byte vectors (x 16-byte aligned, begin and end multiples of the vector width).
template <typename T, bool VEC>
__device__ __forceinline__ Stats thread_stats(const T *x, int64_t begin, int64_t end, float scale) {
    Stats t{-INFINITY, 0.f};
    const int64_t stride = blockDim.x;
    if constexpr (VEC) {
        constexpr int N = vec16<T>();
        constexpr int U = 16 / N;  // vectors in flight per thread: 16 values, 32-64 bytes
        using V = Vec<T, N>;
        const V *xv = reinterpret_cast<const V *>(x);
        const int64_t ve = end / N;
        for (int64_t i = begin / N + threadIdx.x; i < ve; i += U * stride) {
            V buf[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int64_t k = i + u * stride;
                if (k < ve) buf[u] = xv[k];
            }
            float v[U * N];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const bool in = i + u * stride < ve;
#pragma unroll
                for (int j = 0; j < N; ++j) v[u * N + j] = in ? to_f32(buf[u].v[j]) : -INFINITY;
            }
            update(t, v, scale);
        }
    } else {
        constexpr int U = 4;
        for (int64_t i = begin + threadIdx.x; i < end; i += U * stride) {
            float v[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int64_t k = i + u * stride;
                v[u] = k < end ? to_f32(x[k]) : -INFINITY;
            }
            update(t, v, scale);
        }
    }
    return t;
}

// y[i] = softmax value of x[i] for i in [begin, end), given the row's (m, 1 / s).
template <typename Tin, typename Tout, bool VEC>
__device__ __forceinline__ void write_range(const Tin *x, Tout *y, int64_t begin, int64_t end,
                                            float m, float inv, float scale) {
    const bool zero = (m == -INFINITY);
    const int64_t stride = blockDim.x;
    if constexpr (VEC) {
        constexpr int U = 2;
        constexpr int N = vec16<Tin>();
        using V = Vec<Tin, N>;
        const V *xv = reinterpret_cast<const V *>(x);
        const int64_t ve = end / N;
        for (int64_t i = begin / N + threadIdx.x; i < ve; i += U * stride) {
            V buf[U];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (i + u * stride < ve) buf[u] = xv[i + u * stride];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int64_t k = i + u * stride;
                if (k < ve) {
                    float o[N];
#pragma unroll
                    for (int j = 0; j < N; ++j) o[j] = prob(to_f32(buf[u].v[j]), m, inv, scale, zero);
                    store_f32<Tout, N>(y + k * N, o);
                }
            }
        }
    } else {
        for (int64_t i = begin + threadIdx.x; i < end; i += stride)
            y[i] = from_f32<Tout>(prob(to_f32(x[i]), m, inv, scale, zero));
    }
}

// ------------------------------------------------------------------ cache-hinted accesses
// L2 policy for data read now and again soon (the twopass path's streamed part).
__device__ __forceinline__ uint64_t l2_evict_last_policy() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
    return p;
}

// 16-byte load kept in L2 with `pol` (not allocated in L1).
template <typename V> __device__ __forceinline__ V ld16_keep(const V *p, uint64_t pol) {
    static_assert(sizeof(V) == 16, "16-byte vectors only");
    uint4 r;
    asm volatile("ld.global.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p), "l"(pol));
    V v;
    memcpy(&v, &r, 16);
    return v;
}

// 16-byte load of data read for the last time (cache-streaming: evict-first).
template <typename V> __device__ __forceinline__ V ld16_last(const V *p) {
    static_assert(sizeof(V) == 16, "16-byte vectors only");
    uint4 r;
    asm volatile("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    V v;
    memcpy(&v, &r, 16);
    return v;
}

// Stores N f32 values to p as T in 16-byte streaming stores (evict-first; p 16-byte aligned).
template <typename T, int N>
__device__ __forceinline__ void store_f32_stream(T *p, const float (&v)[N]) {
    constexpr int W = 16 / (int)sizeof(T);
    static_assert(N % W == 0, "whole 16-byte stores only");
#pragma unroll
    for (int c = 0; c < N / W; ++c) {
        Vec<T, W> o;
#pragma unroll
        for (int j = 0; j < W; ++j) o.v[j] = from_f32<T>(v[c * W + j]);
        uint4 r;
        memcpy(&r, &o, 16);
        asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p + c * W), "r"(r.x),
                     "r"(r.y), "r"(r.z), "r"(r.w)
                     : "memory");
    }
}

// Adds the vectors b[u] (u < U) with first + u * stride < end to the running statistics
// (one rescale per call; the values are widened on the fly, never all held as f32).
template <typename T, int N, int U>
__device__ __forceinline__ void update_vecs(Stats &t, const Vec<T, N> (&b)[U], int first,
                                            int stride, int end, float scale) {
    float vm = -INFINITY;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        if (first + u * stride < end) {
#pragma unroll
            for (int j = 0; j < N; ++j) vm = nanmax(vm, to_f32(b[u].v[j]));
        }
    }
    const float m = nanmax(t.m, vm);
    if (m == -INFINITY) return;  // nothing but -inf so far: s stays 0
    float s = t.s * ex2_ftz((t.m - m) * scale);
#pragma unroll
    for (int u = 0; u < U; ++u) {
        if (first + u * stride < end) {
#pragma unroll
            for (int j = 0; j < N; ++j) s += ex2_ftz((to_f32(b[u].v[j]) - m) * scale);
        }
    }
    t = {m, s};
}

// ------------------------------------------------------------------ register path
template <typename Tin, typename Tout, int VPT>
__global__ void __launch_bounds__(1024)
    softmax_reg_kernel(const Tin *x, Tout *y, int64_t rows, int64_t n, float scale) {
    constexpr int N = vec16<Tin>();
    using V = Vec<Tin, N>;
    __shared__ float scratch[32];
    const int nvec = (int)(n / N);
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const V *xv = reinterpret_cast<const V *>(x + row * n);
        Tout *yr = y + row * n;
        V r[VPT];
        float tmax = -INFINITY;
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int i = threadIdx.x + k * blockDim.x;
            if (i < nvec) {
                r[k] = xv[i];
#pragma unroll
                for (int j = 0; j < N; ++j) tmax = nanmax(tmax, to_f32(r[k].v[j]));
            }
        }
        const float m = block_nanmax(tmax, scratch);
        const bool zero = (m == -INFINITY);
        float ts = 0.f;
        if (!zero) {
#pragma unroll
            for (int k = 0; k < VPT; ++k) {
                if (threadIdx.x + k * blockDim.x < nvec) {
#pragma unroll
                    for (int j = 0; j < N; ++j) ts += ex2_ftz((to_f32(r[k].v[j]) - m) * scale);
                }
            }
        }
        const float inv = 1.f / block_sum(ts, scratch);  // inf for a masked row, unused
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int i = threadIdx.x + k * blockDim.x;
            if (i < nvec) {
                float o[N];
#pragma unroll
                for (int j = 0; j < N; ++j) o[j] = prob(to_f32(r[k].v[j]), m, inv, scale, zero);
                store_f32<Tout, N>(yr + (int64_t)i * N, o);
            }
        }
    }
}

// ------------------------------------------------------------------ generic path
template <typename Tin, typename Tout, bool VEC>
__global__ void __launch_bounds__(1024)
    softmax_generic_kernel(const Tin *x, Tout *y, int64_t rows, int64_t n, float scale) {
    __shared__ float scratch[64];
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const Tin *xr = x + row * n;
        const Stats t = block_merge(thread_stats<Tin, VEC>(xr, 0, n, scale), scratch, scale);
        write_range<Tin, Tout, VEC>(xr, y + row * n, 0, n, t.m, 1.f / t.s, scale);
    }
}

// ------------------------------------------------------------------ twopass path
// Block of kTpThreads per row, rows strided over the grid (grid <= SMs, one block per SM).
// VEC: thread t keeps vectors t + k * T (k < kTpKeep) in registers and streams vectors
// kTpKeep * T + t + u * T ... in groups of kTpUnroll; y written by the thread that read the
// same elements of x (in place allowed).
template <typename Tin, typename Tout, bool VEC>
__global__ void __launch_bounds__(kTpThreads, 1)
    softmax_twopass_kernel(const Tin *x, Tout *y, int64_t rows, int64_t n, float scale) {
    __shared__ float scratch[64];
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const Tin *xr = x + row * n;
        Tout *yr = y + row * n;
        if constexpr (VEC) {
            // 32-bit offsets within the row (the host takes this path only for n < 2^31).
            constexpr int N = vec16<Tin>();
            using V = Vec<Tin, N>;
            const V *xv = reinterpret_cast<const V *>(xr);
            const int T = blockDim.x, tid = threadIdx.x;
            const int nvec = (int)(n / N);
            const int kept_end = nvec < kTpKeep * T ? nvec : kTpKeep * T;
            const uint64_t pol = l2_evict_last_policy();
            // Pass 1: the kept prefix (read once: evict-first), then the streamed rest.
            V kept[kTpKeep];
#pragma unroll
            for (int k = 0; k < kTpKeep; ++k) {
                const int i = tid + k * T;
                if (i < kept_end) kept[k] = ld16_last(xv + i);
            }
            Stats t{-INFINITY, 0.f};
            for (int i = kept_end + tid; i < nvec; i += kTpUnroll * T) {
                V buf[kTpUnroll];
#pragma unroll
                for (int u = 0; u < kTpUnroll; ++u) {
                    const int k = i + u * T;
                    if (k < nvec) buf[u] = ld16_keep(xv + k, pol);
                }
                update_vecs<Tin, N, kTpUnroll>(t, buf, i, T, nvec, scale);
            }
            update_vecs<Tin, N, kTpKeep>(t, kept, tid, T, kept_end, scale);
            t = block_merge(t, scratch, scale);
            const bool zero = (t.m == -INFINITY);
            const float inv = 1.f / t.s;  // inf for a masked row (unused); NaN for a NaN row
            // Pass 2: the kept prefix from registers, the rest re-read (from L2).
#pragma unroll
            for (int k = 0; k < kTpKeep; ++k) {
                const int i = tid + k * T;
                if (i < kept_end) {
                    float o[N];
#pragma unroll
                    for (int j = 0; j < N; ++j)
                        o[j] = prob(to_f32(kept[k].v[j]), t.m, inv, scale, zero);
                    store_f32_stream<Tout, N>(yr + (int64_t)i * N, o);
                }
            }
            for (int i = kept_end + tid; i < nvec; i += kTpUnroll * T) {
                V buf[kTpUnroll];
#pragma unroll
                for (int u = 0; u < kTpUnroll; ++u) {
                    const int k = i + u * T;
                    if (k < nvec) buf[u] = ld16_last(xv + k);
                }
#pragma unroll
                for (int u = 0; u < kTpUnroll; ++u) {
                    const int k = i + u * T;
                    if (k < nvec) {
                        float o[N];
#pragma unroll
                        for (int j = 0; j < N; ++j)
                            o[j] = prob(to_f32(buf[u].v[j]), t.m, inv, scale, zero);
                        store_f32_stream<Tout, N>(yr + (int64_t)k * N, o);
                    }
                }
            }
        } else {
            const Stats t =
                block_merge(thread_stats<Tin, false>(xr, 0, n, scale), scratch, scale);
            write_range<Tin, Tout, false>(xr, yr, 0, n, t.m, 1.f / t.s, scale);
        }
    }
}

// ------------------------------------------------------------------ split path
// grid (chunks, rows), `chunk` elements per block (a multiple of the vector width when VEC);
// ws[row * chunks + c] = (max, sum) of chunk c.
template <typename Tin, bool VEC>
__global__ void __launch_bounds__(kChunkThreads)
    softmax_split_stats_kernel(const Tin *x, float2 *ws, int64_t n, int64_t chunk, float scale) {
    __shared__ float scratch[64];
    const int64_t row = blockIdx.y, chunks = gridDim.x, c = blockIdx.x;
    const int64_t begin = c * chunk, end = begin + chunk < n ? begin + chunk : n;
    const Stats t =
        block_merge(thread_stats<Tin, VEC>(x + row * n, begin, end, scale), scratch, scale);
    if (threadIdx.x == 0) ws[row * chunks + c] = make_float2(t.m, t.s);
}

template <typename Tin, typename Tout, bool VEC>
__global__ void __launch_bounds__(kChunkThreads)
    softmax_split_write_kernel(const Tin *x, Tout *y, const float2 *ws, int64_t n, int64_t chunk,
                               float scale) {
    __shared__ float scratch[64];
    const int64_t row = blockIdx.y, chunks = gridDim.x, c = blockIdx.x;
    Stats t{-INFINITY, 0.f};
    for (int64_t j = threadIdx.x; j < chunks; j += blockDim.x) {
        const float2 p = ws[row * chunks + j];
        t = merge(t, Stats{p.x, p.y}, scale);
    }
    t = block_merge(t, scratch, scale);
    const int64_t begin = c * chunk, end = begin + chunk < n ? begin + chunk : n;
    write_range<Tin, Tout, VEC>(x + row * n, y + row * n, begin, end, t.m, 1.f / t.s, scale);
}


// ------------------------------------------------------------------ cluster path (sm_90+)
// grid: a multiple of kCluster blocks, cluster dims (kCluster, 1, 1); cluster c handles rows
// c, c + clusters, ... Block rank r of a cluster holds vectors [r * 256 * VPT, (r + 1) * 256 *
// VPT) of the row, thread t vectors r * 256 * VPT + k * 256 + t, k < VPT (coalesced).
// PF: after issuing a row's loads, warp 0 asks the L2 for this block's part of the
// cluster's next row (4 KB bulk prefetches, no registers, no completion to wait for).
// DB (pipelined): the next row's loads go into a second register set before this row's
// writes, so each block keeps DRAM reads in flight while it writes (VPT <= 8: 2 x 8 vectors
// per thread fit the 128-register cap without spilling).
template <typename Tin, typename Tout, int VPT, bool PF, bool DB>
__global__ void __launch_bounds__(kClusterThreads, 2)
    softmax_cluster_kernel(const Tin *x, Tout *y, int64_t rows, int64_t n, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    constexpr int N = vec16<Tin>();
    using V = Vec<Tin, N>;
    __shared__ float scratch[32];
    // This block's (max, sum) per row, read by every block of the cluster; double-buffered
    // by row parity so one cluster.sync per row suffices (a buffer is rewritten two rows
    // later, after the next row's cluster.sync, which every reader of it has passed).
    __shared__ float2 part[2];
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = (int)cluster.block_rank();
    const int lane = threadIdx.x & 31;
    const int64_t nvec = n / N;
    const int64_t base = (int64_t)rank * (kClusterThreads * VPT) + threadIdx.x;
    const int64_t clusters = gridDim.x / kCluster;
    static_assert(!DB || VPT <= 8, "two register sets of VPT vectors");
    int buf = 0;
    V r[VPT];
    if (DB && blockIdx.x / kCluster < rows) {
        const V *xv = reinterpret_cast<const V *>(x + (int64_t)(blockIdx.x / kCluster) * n);
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int64_t i = base + k * kClusterThreads;
            if (i < nvec) r[k] = xv[i];
        }
    }
    for (int64_t row = blockIdx.x / kCluster; row < rows; row += clusters) {
        Tout *yr = y + row * n;
        float tmax = -INFINITY;
        if (!DB) {
            const V *xv = reinterpret_cast<const V *>(x + row * n);
#pragma unroll
            for (int k = 0; k < VPT; ++k) {
                const int64_t i = base + k * kClusterThreads;
                if (i < nvec) r[k] = xv[i];
            }
        }
        if (PF && threadIdx.x < 32 && row + clusters < rows) {
            const int64_t first = (int64_t)rank * (kClusterThreads * VPT);
            int64_t cnt = nvec - first;
            if (cnt > kClusterThreads * VPT) cnt = kClusterThreads * VPT;
            const char *p =
                reinterpret_cast<const char *>(x + (row + clusters) * n) + first * 16;
            const int64_t bytes = cnt * 16;  // <= 0 for a block past the row's end
            for (int64_t off = (int64_t)lane * 4096; off < bytes; off += 32 * 4096) {
                const unsigned sz = (unsigned)(bytes - off < 4096 ? bytes - off : 4096);
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(sz)
                             : "memory");
            }
        }
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            if (base + k * kClusterThreads < nvec) {
#pragma unroll
                for (int j = 0; j < N; ++j) tmax = nanmax(tmax, to_f32(r[k].v[j]));
            }
        }
        const float bm = block_nanmax(tmax, scratch);
        float ts = 0.f;
        if (bm != -INFINITY) {  // a block of only -inf (or past the row's end): sum 0
#pragma unroll
            for (int k = 0; k < VPT; ++k) {
                if (base + k * kClusterThreads < nvec) {
#pragma unroll
                    for (int j = 0; j < N; ++j) ts += ex2_ftz((to_f32(r[k].v[j]) - bm) * scale);
                }
            }
        }
        const float bs = block_sum(ts, scratch);
        if (threadIdx.x == 0) part[buf] = make_float2(bm, bs);
        cluster.sync();  // every block's part[buf] written and visible cluster-wide
        // Lanes 0..7 of every warp read one block's pair each and merge them over the 8
        // lanes (xor 4, 2, 1 stays within the group); lane 0's result goes to the warp.
        Stats t{-INFINITY, 0.f};
        if (lane < kCluster) {
            const float2 p = *cluster.map_shared_rank(&part[buf], lane);
            t = Stats{p.x, p.y};
        }
#pragma unroll
        for (int o = kCluster / 2; o > 0; o >>= 1) {
            const Stats u{__shfl_xor_sync(0xffffffffu, t.m, o), __shfl_xor_sync(0xffffffffu, t.s, o)};
            t = merge(t, u, scale);
        }
        const float m = __shfl_sync(0xffffffffu, t.m, 0);
        const float s = __shfl_sync(0xffffffffu, t.s, 0);
        const bool zero = (m == -INFINITY);
        const float inv = 1.f / s;  // inf for a masked row (unused); NaN for a NaN/+inf row
        V nx[DB ? VPT : 1];
        if (DB && row + clusters < rows) {  // the next row's reads, in flight during the writes
            const V *xn = reinterpret_cast<const V *>(x + (row + clusters) * n);
#pragma unroll
            for (int k = 0; k < (DB ? VPT : 0); ++k) {
                const int64_t i = base + k * kClusterThreads;
                if (i < nvec) nx[k] = xn[i];
            }
        }
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int64_t i = base + k * kClusterThreads;
            if (i < nvec) {
                float o[N];
#pragma unroll
                for (int j = 0; j < N; ++j) o[j] = prob(to_f32(r[k].v[j]), m, inv, scale, zero);
                store_f32<Tout, N>(yr + i * N, o);
            }
        }
        if (DB) {
#pragma unroll
            for (int k = 0; k < (DB ? VPT : 0); ++k) r[k] = nx[k];
        }
        buf ^= 1;
    }
    cluster.sync();  // no block exits while another may still read its part[]
#endif
}

// ------------------------------------------------------------------ host side
inline bool split_applies(int64_t rows, int64_t n) {
    return rows < kSplitMaxRows && n > 2 * kMinChunk;
}

// Sized for the shortest chunk, so it holds the partials of any chunk length chosen below.
inline int64_t workspace_bytes(int64_t rows, int64_t n) {
    if (rows <= 0 || n <= 0 || !split_applies(rows, n)) return 0;
    return rows * ceil_div(n, kMinChunk) * (int64_t)sizeof(float2);
}

inline unsigned row_grid(int64_t blocks) {
    const int64_t cap = 65535LL * 32;  // a grid-stride loop covers the rest
    return (unsigned)(blocks < 1 ? 1 : (blocks > cap ? cap : blocks));
}

// Per-device facts, looked up once per device (0 in a slot: not looked up yet).
constexpr int kMaxDevices = 64;
struct DeviceFacts {
    int sms;           // multiprocessors
    bool cluster_ok;   // cluster path usable: cc >= 9, cluster launch, sm_90+ kernel image
    int64_t l2_bytes;  // L2 cache size
};

inline int current_device() {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        cudaGetLastError();  // clear it: the launch reports its own errors
        return -1;
    }
    return dev;
}

inline DeviceFacts device_facts() {
    static std::atomic<int> sms_cache[kMaxDevices];      // 0 unknown, else SM count
    static std::atomic<int> cluster_cache[kMaxDevices];  // 0 unknown, 1 no, 2 yes
    static std::atomic<int> l2_cache[kMaxDevices];       // 0 unknown, else L2 bytes
    constexpr int64_t kDefaultL2 = 40LL << 20;
    const int dev = current_device();
    const bool cached = dev >= 0 && dev < kMaxDevices;
    if (cached) {
        const int s = sms_cache[dev].load(std::memory_order_relaxed);
        const int c = cluster_cache[dev].load(std::memory_order_relaxed);
        const int l = l2_cache[dev].load(std::memory_order_relaxed);
        if (s > 0 && c > 0 && l > 0) return {s, c == 2, (int64_t)l};
    }
    int sms = 0, major = 0, cl = 0, l2 = 0;
    bool ok = dev >= 0;
    ok = ok && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess;
    ok = ok && cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess;
    if (ok && major >= 9 && cudaDeviceGetAttribute(&cl, cudaDevAttrClusterLaunch, dev) != cudaSuccess)
        cl = 0;
    if (ok && (cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev) != cudaSuccess || l2 < 1))
        l2 = (int)kDefaultL2;
    bool cluster_ok = ok && major >= 9 && cl != 0;
    if (cluster_ok) {
        // The image loaded for this device must hold sm_90+ code: a build with only
        // compute_80 PTX would JIT the kernel's empty (pre-sm_90) body.
        cudaFuncAttributes fa{};
        cluster_ok = cudaFuncGetAttributes(&fa, softmax_cluster_kernel<float, float, 4, false, false>) ==
                         cudaSuccess &&
                     fa.binaryVersion >= 90;
    }
    cudaGetLastError();  // clear any lookup error: the launch reports its own errors
    if (!ok || sms < 1) return {132, false, kDefaultL2};  // not cached: looked up again next call
    if (cached) {
        sms_cache[dev].store(sms, std::memory_order_relaxed);
        cluster_cache[dev].store(cluster_ok ? 2 : 1, std::memory_order_relaxed);
        l2_cache[dev].store(l2, std::memory_order_relaxed);
    }
    return {sms, cluster_ok, (int64_t)l2};
}

// The long-row path forced by FL_SOFTMAX_LONG (read once; FL_SOFTMAX_LONG_AUTO when unset).
inline int env_long_path() {
    static const EnvChoice choices[] = {{"cluster", FL_SOFTMAX_LONG_CLUSTER},
                                        {"cluster_pf", FL_SOFTMAX_LONG_CLUSTER_PREFETCH},
                                        {"cluster_db", FL_SOFTMAX_LONG_CLUSTER_PIPELINED},
                                        {"twopass", FL_SOFTMAX_LONG_TWOPASS},
                                        {"portable", FL_SOFTMAX_LONG_PORTABLE}};
    static const int v = env_choice("FL_SOFTMAX_LONG", choices, FL_SOFTMAX_LONG_AUTO);
    return v;
}

// Twopass grid: one block per SM at most, and no more rows in flight than fit in ~60% of
// L2 (each holds its row minus the register-kept prefix there until pass 2 re-reads it).
inline int64_t twopass_grid(int64_t rows, int64_t row_bytes, bool vec, const DeviceFacts &dev) {
    const int64_t kept = vec ? (int64_t)kTpKeep * kTpThreads * 16 : 0;
    int64_t live = row_bytes - kept;
    if (live < (16 << 10)) live = 16 << 10;
    int64_t fit = dev.l2_bytes * 6 / 10 / live;
    if (fit < 1) fit = 1;
    int64_t g = dev.sms < fit ? dev.sms : fit;
    return rows < g ? rows : g;
}

// The cluster kernel's variant: plain, next-row L2 prefetch, or pipelined (register double
// buffer; VPT <= 8, else plain).
enum ClusterVariant { kClusterPlain, kClusterPrefetch, kClusterPipelined };

template <typename Tin, typename Tout, int VPT>
auto cluster_kernel_for(ClusterVariant v) {
    if (v == kClusterPrefetch) return softmax_cluster_kernel<Tin, Tout, VPT, true, false>;
    if constexpr (VPT <= 8) {
        if (v == kClusterPipelined) return softmax_cluster_kernel<Tin, Tout, VPT, false, true>;
    }
    return softmax_cluster_kernel<Tin, Tout, VPT, false, false>;
}

template <typename Tin, typename Tout, int VPT>
cudaError_t launch_cluster(const Tin *x, Tout *y, int64_t rows, int64_t n, float scale,
                           int sms, ClusterVariant variant, cudaStream_t s) {
    const auto kernel = cluster_kernel_for<Tin, Tout, VPT>(variant);
    // Clusters loop over rows. How many clusters the grid holds (FL_SOFTMAX_CLUSTER_GRID, an
    // experiment knob until measured): default 2 per SM (16 blocks per SM, more than fit at
    // once, so the hardware keeps every SM busy; beyond that the blocks loop); "rows": one
    // cluster per row (the scheduler balances single rows); "resident": as many as fit at
    // once (cudaOccupancyMaxActiveClusters), each looping over rows; a number: that many.
    int64_t cap = 2 * (int64_t)sms;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = kCluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.blockDim = dim3(kClusterThreads, 1, 1);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    static const int64_t grid_env = [] {
        const char *e = getenv("FL_SOFTMAX_CLUSTER_GRID");
        if (e && e[0] >= '1' && e[0] <= '9') return (int64_t)atoll(e);
        static const EnvChoice choices[] = {{"rows", -1}, {"resident", -2}};
        return (int64_t)env_choice("FL_SOFTMAX_CLUSTER_GRID", choices, 0);
    }();
    if (grid_env == -1) {
        cap = rows;
    } else if (grid_env == -2) {
        int resident = 0;
        cfg.gridDim = dim3((unsigned)kCluster, 1, 1);
        const cudaError_t oe = cudaOccupancyMaxActiveClusters(&resident, kernel, &cfg);
        if (oe != cudaSuccess || resident <= 0) (void)cudaGetLastError();
        else cap = resident;
    } else if (grid_env > 0) {
        cap = grid_env;
    }
    const int64_t clusters = rows < cap ? rows : cap;
    if (clusters * kCluster > 0x7fffffffLL) return cudaErrorInvalidValue;
    cfg.gridDim = dim3((unsigned)(clusters * kCluster), 1, 1);
    return cudaLaunchKernelEx(&cfg, kernel, x, y, rows, n, scale);
}

template <typename Tin, typename Tout>
fl_status softmax(const Tin *x, Tout *y, int64_t rows, int64_t n, float scale, void *ws,
                  int64_t ws_bytes, int path, cudaStream_t s) {
    constexpr int N = vec16<Tin>();
    const bool vec_ok = n % N == 0 && aligned16(x) && aligned16(y);
    const int64_t nvec = n / N;
    if (vec_ok && nvec <= 1024 * 4) {
        const int64_t target = rows >= 1024 ? 256 : 1024;
        int vpt = 1;
        while (vpt < 4 && ceil_div(nvec, vpt) > target) vpt *= 2;
        const int threads = (int)(ceil_div(ceil_div(nvec, vpt), 32) * 32);
        const unsigned grid = row_grid(rows);
        switch (vpt) {
        case 1: softmax_reg_kernel<Tin, Tout, 1><<<grid, threads, 0, s>>>(x, y, rows, n, scale); break;
        case 2: softmax_reg_kernel<Tin, Tout, 2><<<grid, threads, 0, s>>>(x, y, rows, n, scale); break;
        default: softmax_reg_kernel<Tin, Tout, 4><<<grid, threads, 0, s>>>(x, y, rows, n, scale); break;
        }
        return launch_status();
    }
    const DeviceFacts dev = device_facts();
    if (path == FL_SOFTMAX_LONG_AUTO) path = env_long_path();
    const int64_t tp_grid = twopass_grid(rows, n * (int64_t)sizeof(Tin), vec_ok, dev);
    bool twopass = path == FL_SOFTMAX_LONG_TWOPASS;
    // Automatic: never twopass. Measured on the H100 (bf16 2048 x 128256, 2026-11-23):
    // cluster 428 us (82% of copy), twopass 488 us (72%), cluster_pf 513 us (68%); twopass
    // stays selectable (FL_SOFTMAX_LONG=twopass, fl_softmax_path) for GPUs without clusters.
    if (twopass) {
        const unsigned grid = row_grid(tp_grid);
        if (vec_ok && n <= INT32_MAX)  // the vector kernel indexes a row in 32 bits
            softmax_twopass_kernel<Tin, Tout, true><<<grid, kTpThreads, 0, s>>>(x, y, rows, n, scale);
        else
            softmax_twopass_kernel<Tin, Tout, false><<<grid, kTpThreads, 0, s>>>(x, y, rows, n, scale);
        return launch_status();
    }
    const ClusterVariant variant = path == FL_SOFTMAX_LONG_CLUSTER_PREFETCH  ? kClusterPrefetch
                                   : path == FL_SOFTMAX_LONG_CLUSTER_PIPELINED ? kClusterPipelined
                                                                               : kClusterPlain;
    // Cluster path: nvec > 4096 here, so a cluster of 8 x 256 threads needs >= 4 vectors per
    // thread (VPT 2 would hold only the register path's 4096 vectors).
    constexpr int64_t kPerVpt = (int64_t)kCluster * kClusterThreads;  // vectors per VPT step
    if (path != FL_SOFTMAX_LONG_PORTABLE && vec_ok && dev.cluster_ok &&
        nvec <= kPerVpt * kClusterMaxVpt) {
        cudaError_t e;
        if (nvec <= kPerVpt * 4)
            e = launch_cluster<Tin, Tout, 4>(x, y, rows, n, scale, dev.sms, variant, s);
        else if (nvec <= kPerVpt * 8)
            e = launch_cluster<Tin, Tout, 8>(x, y, rows, n, scale, dev.sms, variant, s);
        else
            e = launch_cluster<Tin, Tout, 16>(x, y, rows, n, scale, dev.sms, variant, s);
        if (e == cudaSuccess) return launch_status();
        // Refused (e.g. no room for a cluster on a partitioned GPU): a launch-configuration
        // error, not sticky. Clear it and take the other paths.
        cudaGetLastError();
    }
    const int64_t need = workspace_bytes(rows, n);
    if (need > 0 && ws != nullptr && ws_bytes >= need &&
        (reinterpret_cast<uintptr_t>(ws) & 7u) == 0) {
        // Chunks: ~4 blocks per SM over all rows, each thread >= 8 vectors (8 elements on
        // the scalar path); chunk lengths a multiple of the vector width.
        const int64_t gran = vec_ok ? N : 1;
        const int64_t min_chunk = (int64_t)kChunkThreads * 8 * gran;  // >= kMinChunk
        int64_t chunks = ceil_div(4 * (int64_t)dev.sms, rows);
        const int64_t most = n / min_chunk;
        if (chunks > most) chunks = most;
        if (chunks >= 2) {
            const int64_t chunk = ceil_div(ceil_div(n, chunks), gran) * gran;
            const dim3 grid((unsigned)ceil_div(n, chunk), (unsigned)rows);
            float2 *w = static_cast<float2 *>(ws);  // grid.x * rows <= need / 8 partials
            if (vec_ok) {
                softmax_split_stats_kernel<Tin, true>
                    <<<grid, kChunkThreads, 0, s>>>(x, w, n, chunk, scale);
                softmax_split_write_kernel<Tin, Tout, true>
                    <<<grid, kChunkThreads, 0, s>>>(x, y, w, n, chunk, scale);
            } else {
                softmax_split_stats_kernel<Tin, false>
                    <<<grid, kChunkThreads, 0, s>>>(x, w, n, chunk, scale);
                softmax_split_write_kernel<Tin, Tout, false>
                    <<<grid, kChunkThreads, 0, s>>>(x, y, w, n, chunk, scale);
            }
            return launch_status();
        }
    }
    // Generic: threads for ~4 vectors (or 4 elements) each, 64..1024.
    const int64_t per_thread = vec_ok ? 4 * N : 4;
    const int64_t want = ceil_div(ceil_div(n, per_thread), 32) * 32;
    const int threads = (int)(want < 64 ? 64 : (want > 1024 ? 1024 : want));
    int64_t blocks = rows;
    if (n * (int64_t)sizeof(Tin) > (64 << 10)) {
        const int64_t cap = dev.sms;  // long rows: one block per SM (rows in flight fit L2)
        if (blocks > cap) blocks = cap;
    }
    const unsigned grid = row_grid(blocks);
    if (vec_ok)
        softmax_generic_kernel<Tin, Tout, true><<<grid, threads, 0, s>>>(x, y, rows, n, scale);
    else
        softmax_generic_kernel<Tin, Tout, false><<<grid, threads, 0, s>>>(x, y, rows, n, scale);
    return launch_status();
}

}  // namespace softmax_detail
}  // namespace fl

extern "C" int64_t fl_softmax_workspace_size(int64_t rows, int64_t n) {
    return fl::softmax_detail::workspace_bytes(rows, n);
}

extern "C" fl_status fl_softmax_path(fl_dtype x_dtype, const void *x, fl_dtype y_dtype, void *y,
                                     int64_t rows, int64_t n, float temperature, void *workspace,
                                     int64_t workspace_bytes, int32_t long_path,
                                     fl_stream stream) {
    using namespace fl::softmax_detail;
    if (rows < 0 || n < 1 || workspace_bytes < 0) return FL_ERR_INVALID_ARGUMENT;
    if (long_path < FL_SOFTMAX_LONG_AUTO || long_path > FL_SOFTMAX_LONG_CLUSTER_PIPELINED)
        return FL_ERR_INVALID_ARGUMENT;
    if (!(temperature >= FLT_MIN) || !std::isfinite(temperature)) return FL_ERR_INVALID_ARGUMENT;
    if (y_dtype != x_dtype && y_dtype != FL_DTYPE_F32) return FL_ERR_UNSUPPORTED_DTYPE;
    if (rows == 0) return FL_OK;
    if (!x || !y) return FL_ERR_INVALID_ARGUMENT;
    if (x == y && x_dtype != y_dtype) return FL_ERR_INVALID_ARGUMENT;
    const float scale = kLog2e / temperature;
    cudaStream_t s = fl::as_stream(stream);
    FL_DISPATCH_FLOAT(x_dtype, {
        if (y_dtype == x_dtype)
            return softmax<scalar_t, scalar_t>(static_cast<const scalar_t *>(x),
                                               static_cast<scalar_t *>(y), rows, n, scale,
                                               workspace, workspace_bytes, long_path, s);
        return softmax<scalar_t, float>(static_cast<const scalar_t *>(x), static_cast<float *>(y),
                                        rows, n, scale, workspace, workspace_bytes, long_path, s);
    });
    return FL_ERR_UNSUPPORTED_DTYPE;
}

extern "C" fl_status fl_softmax(fl_dtype x_dtype, const void *x, fl_dtype y_dtype, void *y,
                                int64_t rows, int64_t n, float temperature, void *workspace,
                                int64_t workspace_bytes, fl_stream stream) {
    return fl_softmax_path(x_dtype, x, y_dtype, y, rows, n, temperature, workspace,
                           workspace_bytes, FL_SOFTMAX_LONG_AUTO, stream);
}
