// Shared device code: dtype traits, vector loads, reductions, launch helpers.
// Every kernels/*.cu includes this; no helper lives in two .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>

#include "../include/fl_kernels.h"

namespace fl {

// ---------------------------------------------------------------- dtype traits
template <typename T> struct Dtype;
template <> struct Dtype<float> {
    static constexpr fl_dtype id = FL_DTYPE_F32;
    __device__ __forceinline__ static float to_f32(float x) { return x; }
    __device__ __forceinline__ static float from_f32(float x) { return x; }
};
template <> struct Dtype<__half> {
    static constexpr fl_dtype id = FL_DTYPE_F16;
    __device__ __forceinline__ static float to_f32(__half x) { return __half2float(x); }
    __device__ __forceinline__ static __half from_f32(float x) { return __float2half_rn(x); }
};
template <> struct Dtype<__nv_bfloat16> {
    static constexpr fl_dtype id = FL_DTYPE_BF16;
    // A bf16 is the top half of an f32: widen with a shift (cheaper, and lighter on
    // registers, than the header's conversion).
    __device__ __forceinline__ static float to_f32(__nv_bfloat16 x) {
        return __uint_as_float(((uint32_t)__bfloat16_as_ushort(x)) << 16);
    }
    __device__ __forceinline__ static __nv_bfloat16 from_f32(float x) {
        return __float2bfloat16_rn(x);
    }
};

template <typename T> __device__ __forceinline__ float to_f32(T x) { return Dtype<T>::to_f32(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x) {
    return Dtype<T>::from_f32(x);
}

// ---------------------------------------------------------------- vectors
// N elements of T moved as one aligned access (16 bytes when N * sizeof(T) == 16).
template <typename T, int N> struct alignas(sizeof(T) * N) Vec {
    T v[N];
};

template <typename T> constexpr int vec16() { return 16 / (int)sizeof(T); }

__host__ __device__ __forceinline__ bool aligned16(const void *p) {
    return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Whether an fl_rope_params is usable by any rotary kernel (the checks of fl_rope.h): non-NULL,
// head_dim > 0, rotary_dim even in 2..head_dim and at most 2 * FL_ROPE_MAX_PAIRS, interleaved
// 0 or 1. Launchers add their own restrictions on top.
inline bool rope_params_ok(const fl_rope_params *p) {
    return p && p->head_dim > 0 && p->rotary_dim >= 2 && p->rotary_dim % 2 == 0 &&
           p->rotary_dim <= p->head_dim && p->rotary_dim / 2 <= FL_ROPE_MAX_PAIRS &&
           (p->interleaved == 0 || p->interleaved == 1);
}

// ---------------------------------------------------------------- reductions
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// Block-wide sum; every thread gets the result. `scratch` holds >= 32 floats.
// blockDim.x must be a multiple of 32.
__device__ __forceinline__ float block_sum(float x, float *scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    x = warp_sum(x);
    __syncthreads();  // scratch may be in use by a previous reduction
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    x = lane < nwarps ? scratch[lane] : 0.f;
    return warp_sum(x);
}
__device__ __forceinline__ float block_max(float x, float *scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    x = warp_max(x);
    __syncthreads();
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    x = lane < nwarps ? scratch[lane] : -INFINITY;
    return warp_max(x);
}

// ---------------------------------------------------------------- launch helpers
inline cudaStream_t as_stream(fl_stream s) { return reinterpret_cast<cudaStream_t>(s); }

// The status of the launch just made (never synchronises).
inline fl_status launch_status() {
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? FL_OK : (fl_status)e;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Grid size for a grid-stride loop over `work` items with `threads` per block:
// enough blocks to fill the GPU several times over, never more than needed.
inline unsigned grid_for(int64_t work, int threads) {
    int64_t blocks = ceil_div(work, threads);
    const int64_t cap = 65535LL * 8;
    return (unsigned)(blocks < 1 ? 1 : (blocks > cap ? cap : blocks));
}


// ---------------------------------------------------------------- row copies (gathers)
// Whole rows moved as raw words: embedding lookups and (un)padding are row gathers, so
// they copy bytes without converting. The word is the widest of 16/8/4/2/1 bytes that
// divides the row size and both base pointers' alignment (16 for any usual hidden size).
__host__ __device__ inline int row_word_bytes(const void *src, const void *dst, int64_t row_bytes) {
    const uintptr_t m = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) |
                        static_cast<uintptr_t>(row_bytes);
    return (m & 15u) == 0 ? 16 : (m & 7u) == 0 ? 8 : (m & 3u) == 0 ? 4 : (m & 1u) == 0 ? 2 : 1;
}

// Words each thread of a row-copy block moves (all loads issued before the stores).
constexpr int kRowUnroll = 4;

// One block per (row, chunk): grid.x = rows (< 2^31), grid.y = chunks of a row,
// blockDim.x * kRowUnroll words per chunk. Returns false when the shape does not fit.
inline bool row_grid(int64_t rows, int64_t row_words, dim3 *grid, dim3 *block) {
    if (rows <= 0 || row_words <= 0 || rows > 0x7fffffffLL) return false;
    const int64_t per_thread = ceil_div(row_words, kRowUnroll);
    const int64_t threads = per_thread >= 256 ? 256 : ((per_thread + 31) / 32) * 32;
    const int64_t chunks = ceil_div(row_words, threads * kRowUnroll);
    if (chunks > 65535) return false;
    *grid = dim3((unsigned)rows, (unsigned)chunks, 1);
    *block = dim3((unsigned)threads, 1, 1);
    return true;
}

// This block's chunk of one row: dst[i] = src[i] (or 0 when src is null) for the words
// of chunk blockIdx.y of a row of `row_words` words.
template <typename W>
__device__ __forceinline__ void copy_row_chunk(const W *__restrict__ src, W *__restrict__ dst,
                                               int64_t row_words) {
    const int64_t base = (int64_t)blockIdx.y * blockDim.x * kRowUnroll + threadIdx.x;
    W r[kRowUnroll];
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
        const int64_t i = base + (int64_t)u * blockDim.x;
        if (i < row_words) r[u] = src ? src[i] : W{};
    }
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
        const int64_t i = base + (int64_t)u * blockDim.x;
        if (i < row_words) dst[i] = r[u];
    }
}

// ---------------------------------------------------------------- device checks
// Records one failed device-side check in an fl device status (layout and semantics:
// FL_DEVICE_STATUS_WORDS in fl_embedding.h). `nonce` identifies the launch: only the
// first failing launch since the last reset writes the details; among its failures the
// smallest `index` is kept. Never on a hot path (only failing threads call it).
__device__ __forceinline__ void record_failure(int32_t *status, uint32_t nonce, int32_t code,
                                               int64_t index, int32_t value, int32_t limit) {
    atomicAdd(reinterpret_cast<unsigned long long *>(status), 1ull);
    const unsigned prev = atomicCAS(reinterpret_cast<unsigned *>(status + 2), 0u, nonce);
    if (prev == 0u || prev == nonce) {
        status[3] = code;   // the same value from every failing thread of this launch
        status[6] = limit;
        const unsigned long long key =
            ((unsigned long long)(uint32_t)index << 32) | (unsigned long long)(uint32_t)value;
        atomicMax(reinterpret_cast<unsigned long long *>(status + 4), ~key);
    }
}

// RoPE on one pair: (x0, x1) -> (x0 c - x1 s, x1 c + x0 s), the rounding steps spelled out
// (no contraction left to the compiler), so every kernel that rotates (rope.cu's computed and
// table paths, kv_cache.cu's fused append, quant.cu's dequant_rope) rounds identically.
__device__ __forceinline__ void rope_rotate(float x0, float x1, float c, float s, float &y0,
                                            float &y1) {
    y0 = __fmaf_rn(x0, c, -__fmul_rn(x1, s));
    y1 = __fmaf_rn(x1, c, __fmul_rn(x0, s));
}

// Bounds [start, start + len) of packed sequence b from prefix offsets `cu` ([batch + 1]),
// clamped to the packed tensor's `total` tokens whatever `cu` holds (len >= 0).
__device__ __forceinline__ void packed_seq(const int32_t *cu, int b, int total, int &start, int &len) {
    int s = cu[b], e = cu[b + 1];
    s = min(max(s, 0), total);
    e = min(max(e, s), total);
    start = s;
    len = e - s;
}

// Attribute A of the current device, looked up once per device (`fallback` when the lookup
// fails or gives less than 1; a lookup error is cleared, the launch reports its own).
template <cudaDeviceAttr A> inline int device_attr(int fallback) {
    static std::atomic<int> cache[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        cudaGetLastError();
        return fallback;
    }
    if (dev >= 0 && dev < 64) {
        const int c = cache[dev].load(std::memory_order_relaxed);
        if (c > 0) return c;
    }
    int v = 0;
    if (cudaDeviceGetAttribute(&v, A, dev) != cudaSuccess || v < 1) {
        cudaGetLastError();
        return fallback;
    }
    if (dev >= 0 && dev < 64) cache[dev].store(v, std::memory_order_relaxed);
    return v;
}
// Multiprocessors of the current device (132 when the lookup fails).
inline int sm_count() { return device_attr<cudaDevAttrMultiProcessorCount>(132); }
// Compute-capability major of the current device (0 when the lookup fails).
inline int cc_major() { return device_attr<cudaDevAttrComputeCapabilityMajor>(0); }
// The most shared memory a block of the current device may opt into (0 when the lookup fails).
inline int smem_optin() { return device_attr<cudaDevAttrMaxSharedMemoryPerBlockOptin>(0); }

// ---------------------------------------------------------------- weight streaming (sm_80+)
// Loads of data read once per launch (a GEMV's weights): read-only, not allocated in L1, and
// marked evict-first in L2 so the small, reused data (activations, KV) keeps the cache.
// `policy` comes from l2_evict_first_policy() (one createpolicy per thread, hoisted).
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
    uint64_t p;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}
// 16 bits, zero-extended.
__device__ __forceinline__ uint32_t ld_stream16(const void *p, uint64_t policy) {
    unsigned short v;
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.u16 %0, [%1], %2;" : "=h"(v) : "l"(p), "l"(policy));
    return v;
}
__device__ __forceinline__ uint32_t ld_stream32(const void *p, uint64_t policy) {
    uint32_t v;
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(v) : "l"(p), "l"(policy));
    return v;
}
__device__ __forceinline__ uint2 ld_stream64(const void *p, uint64_t policy) {
    uint2 v;
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;"
        : "=r"(v.x), "=r"(v.y)
        : "l"(p), "l"(policy));
    return v;
}
__device__ __forceinline__ uint4 ld_stream128(const void *p, uint64_t policy) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "l"(policy));
    return v;
}

// ---------------------------------------------------------------- cp.async (sm_80+)
// 16 bytes global -> shared (dst: a shared-memory address, cvta); bytes = 0 writes zeros and
// reads nothing (any other value below 16 compiles to a whole 16-byte read, LDGSTS.ZFILL:
// only 0 and 16 are safe at the end of a buffer). The "memory" clobbers keep the compiler from
// moving shared-memory reads across the copy and the wait (loops that rely on wait_group alone,
// with no __syncthreads, need that). Used by the decode attention, the one-token GEMV and the
// wgmma probes.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---------------------------------------------------------------- mbarriers and bulk copies (sm_90+)
// Callers compile these only for sm_90 and later (their kernels' bodies are guarded by
// __CUDA_ARCH__ >= 900, their hosts by cc_major() >= 9). `bar` / `dst`: shared-memory
// addresses (cvta).
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes mbarrier initialisations visible to the async proxy (TMA) and the other threads; the
// caller then synchronises the CTA once.
__device__ __forceinline__ void fence_mbar_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Arrives on `bar` and adds `bytes` to the transaction count the phase waits for.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Spins until the phase of `bar` with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
    uint32_t done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
// `bytes` (a multiple of 16; src and dst 16-byte aligned) global -> shared by the bulk-copy
// engine, counted on `bar`'s transactions.
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

// TMA: the box at element coordinates (c0, c1) of the 2-d tensor `map` describes, into shared
// memory at `dst` (128-byte aligned), counted in bytes on `bar` (the whole box, including what
// lies out of bounds and is zero-filled). `map`: the address of a __grid_constant__ kernel
// parameter.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void *map, uint32_t bar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
        "l"(map), "r"(bar), "r"(c0), "r"(c1)
        : "memory");
}

// ---------------------------------------------------------------- tensor-core mma (sm_80+)
// d += A (16 x 16, row-major fragment a0..a3) . B (16 x 8, col-major fragment b0, b1) with f32
// accumulation: mma.sync.m16n8k16 on f16 or bf16 operands (T picks which). Fragment layouts
// as in the PTX ISA ("Matrix fragments for mma.m16n8k16").
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma_m16n8k16<__half>(float (&d)[4], uint32_t a0, uint32_t a1,
                                                     uint32_t a2, uint32_t a3, uint32_t b0,
                                                     uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float (&d)[4], uint32_t a0, uint32_t a1,
                                                            uint32_t a2, uint32_t a3, uint32_t b0,
                                                            uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// ---------------------------------------------------------------- GEMV launch shape
// Warps per CTA for the decode GEMVs (gemv_dense.cu, gemv_mma.cu): 4, 8 or 16
// (fewer when k has fewer `batches` of chunks than that), the one whose grid of `ctas` fills
// the resident CTA slots best, score = ctas / (waves * slots), e.g. 768 CTAs on 132 SMs x 5
// slots (4 warps) run 1.16 waves, but 2.9 with 8 warps per CTA. A size that leaves one CTA
// per SM over several waves scores 15% less (the SM drains between CTAs); ties (within 0.02)
// go to smaller CTAs (more of them resident, staggered). `occupancy` caches the resident
// CTAs per SM of `kernel` for 4, 8 and 16 warps (0: not looked up yet), one array per kernel
// instance; a failed lookup counts as 1 (its error is cleared: not sticky).
template <typename Kernel>
int pick_gemv_warps(Kernel kernel, std::atomic<int> (&occupancy)[3], int64_t ctas,
                    int64_t batches, int64_t sms) {
    int best = 4;
    double best_score = -1.0;
    for (int i = 0, w = 4; i < 3; ++i, w *= 2) {
        if (w > 4 && w > batches) break;
        int occ = occupancy[i].load(std::memory_order_relaxed);
        if (occ <= 0) {
            if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, 32 * w, 0) != cudaSuccess ||
                occ <= 0) {
                (void)cudaGetLastError();  // leave no error for launch_status
                occ = 1;
            }
            occupancy[i].store(occ, std::memory_order_relaxed);
        }
        const int64_t slots = sms * occ;
        double score = (double)ctas / (double)(ceil_div(ctas, slots) * slots);
        if (occ == 1 && ctas > slots) score *= 0.85;
        if (score > best_score + 0.02) {
            best_score = score;
            best = w;
        }
    }
    while (best > 1 && best > batches) best /= 2;
    return best;
}

// ---------------------------------------------------------------- programmatic dependent launch
// On sm_90 a kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization may start
// while the kernel before it on the stream is still running, once every CTA of that kernel has
// executed pdl_trigger() (or exited). It must call pdl_wait() before it touches memory the
// earlier kernel writes or reads: griddepcontrol.wait returns when the earlier grid has completed
// and its writes are visible. Both are no-ops on older GPUs and in kernels launched normally, so
// a kernel can trigger unconditionally. Used by the decode attention's split combine (a
// programmatic dependent of the split kernel on sm_90).
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

}  // namespace fl

// Dispatch on a float dtype: runs BODY with `scalar_t` bound to the C++ type.
#define FL_DISPATCH_FLOAT(DTYPE, ...)                                                          \
    switch (DTYPE) {                                                                           \
    case FL_DTYPE_F32: { using scalar_t = float; __VA_ARGS__; break; }                         \
    case FL_DTYPE_F16: { using scalar_t = __half; __VA_ARGS__; break; }                        \
    case FL_DTYPE_BF16: { using scalar_t = __nv_bfloat16; __VA_ARGS__; break; }                \
    default: return FL_ERR_UNSUPPORTED_DTYPE;                                                  \
    }

// Dispatch on the byte width of a row word (row_word_bytes): runs BODY with `word_t`.
#define FL_DISPATCH_WORD(BYTES, ...)                                                           \
    switch (BYTES) {                                                                           \
    case 16: { using word_t = uint4; __VA_ARGS__; break; }                                     \
    case 8: { using word_t = uint2; __VA_ARGS__; break; }                                      \
    case 4: { using word_t = uint32_t; __VA_ARGS__; break; }                                   \
    case 2: { using word_t = uint16_t; __VA_ARGS__; break; }                                   \
    default: { using word_t = uint8_t; __VA_ARGS__; break; }                                   \
    }
