// Dense f16/bf16 GEMV / small GEMM for decode (m = 1..16 tokens) with fused epilogues:
// y = x . W^T (+ bias), out = silu(x . Wg^T) * (x . Wu^T), residual += x . W^T.
//
// The work is memory-bound (each weight byte is read once, m <= 16 FMAs per weight value),
// so everything is organised around streaming W at copy bandwidth:
//
// - The products run on the tensor cores: mma.sync m16n8k16 (f32 accumulation) with the
//   16 tokens as the M side (A = x, rows of tokens >= m are zero) and 8 weight rows as the N
//   side (B = W^T, "col" layout = W row-major). One instruction does 16 x 8 x 16 FMAs, so
//   m = 16 costs no more issue slots than m = 1 (CUDA-core FMAs at m = 16 would need ~70%
//   of the FP32 peak just to keep up with HBM).
// - The k order inside a 32-wide chunk is permuted (a dot product does not care, as long as
//   A and B agree): lane (g = lane / 4, t = lane % 4) loads the 16 bytes k = 8t..8t+7 of
//   weight row g, and the 16 bytes k = 8t..8t+7 of token rows g and g + 8 of x. Those are
//   exactly the B fragments (words 0,1 / 2,3) and A fragments (words 0,1 / 2,3) of two
//   m16n8k16 mmas: fragment k-slots {2t, 2t+1, 2t+8, 2t+9} map to k = 8t + {0,1,2,3} in the
//   first mma and to 8t + {4,5,6,7} in the second. So every load is a plain 16-byte vector
//   load, with no shuffles or shared memory on the main path.
// - Weights are streamed with ld.global.nc.L1::no_allocate and an L2 evict-first policy
//   (used once per decode step; x and activations keep the L2). x is read through L1
//   (__ldg): it is small and shared by every CTA.
// - A CTA owns NT tiles of 8 weight rows (for SwiGLU: the 8 gate rows j0.. and their 8 up
//   rows I + j0.., so the product is formed in registers) and its W warps split k: warp w
//   takes U consecutive 32-wide chunks out of every W * U. Each lane issues U * NT 16-byte
//   weight loads back to back (U * NT = 8: 4 KB in flight per warp). The warps' partial
//   tiles are summed through shared memory (fixed order: deterministic), then the epilogue
//   writes each output once, rounded once from f32.
// - The host picks NT (2 when there are enough rows for 2 CTAs per SM, else 1) and W. For
//   m > 1, W is 4, 8 or 16 warps (fewer for short k) so that the grid fills whole waves of
//   resident CTAs (~16-20 resident warps per SM at 96-122 registers, each with 4 KB of loads
//   in flight): on an H100, 4096 x 4096 gets 512 CTAs x 4 warps (one wave), 1024 x 4096
//   128 x 16, 12288 x 4096 768 x 8 (NT = 2), 32000 x 4096 2000 x 8. At m = 1, W = 8 for every
//   shape, which is faster in a whole decode step (see launch_nt).
#include <type_traits>

#include "common/common.cuh"

namespace fl {
namespace gemv_dense {

constexpr int kMaxWarps = 16;
enum Epi : int { LINEAR = FL_GEMV_DENSE_LINEAR, SWIGLU = FL_GEMV_DENSE_SWIGLU, ADD = FL_GEMV_DENSE_ADD };
// Internal epilogue of fl_gemv_dense_rope_append (not in the public enum): the QKV projection
// with the interleaved rotation of q and k and the KV-cache append.
constexpr int ROPE = 16;

// The extra kernel argument of the ROPE epilogue, by value (the inverse frequencies live in
// the parameter space, as rope.cu passes them); other epilogues get the empty NoExtra.
// The cache is contiguous [batch, nkv, max_seq, head_dim] when block_table is NULL, else paged
// [num_blocks, nkv, block_size, head_dim] through block_table [batch, max_blocks] (one kernel
// serves both: the layout is a uniform branch in the epilogue).
template <typename T> struct RopeExtra {
    float inv_freq[FL_ROPE_MAX_PAIRS];
    const int32_t *seq_ids, *positions;
    T *q_out, *k_cache, *v_cache;
    int32_t *err;
    const int32_t *block_table;  // paged only
    int64_t max_seq;             // contiguous only
    int64_t num_blocks;          // paged only
    int32_t nq, nkv, head_dim, half;  // half = rotary_dim / 2
    int32_t batch;                    // sequences: cache rows, or block-table rows when paged
    int32_t max_blocks, block_size;   // paged only
};
struct NoExtra {};
template <typename T, int EPI>
using ExtraOf = typename std::conditional<EPI == ROPE, RopeExtra<T>, NoExtra>::type;

// Chunks (32 k-values) per warp per batch: 8 weight loads of 16 bytes per lane in flight.
template <int NT> __host__ __device__ constexpr int unroll() { return 8 / NT; }

// ---------------------------------------------------------------- device helpers
// The weight loads (ld_stream128, evict-first policy) and the m16n8k16 mma are common.cuh's.
__device__ __forceinline__ float silu(float g) { return g / (1.f + __expf(-g)); }

// The element offset of (sequence s, position p)'s head-0 row in the paged cache of a ROPE
// launch, or -1 - FL_KV_ERR_* when that slot does not exist (kv_cache.cu's slot_of rules).
template <typename T>
__device__ __forceinline__ int64_t paged_slot(const RopeExtra<T> &ex, int s, int p) {
    if (s < 0 || s >= ex.batch) return -1 - FL_KV_ERR_SEQUENCE;
    if (p < 0) return -1 - FL_KV_ERR_POSITION;
    const int bi = p / ex.block_size;
    if (bi >= ex.max_blocks) return -1 - FL_KV_ERR_POSITION;
    const int b = __ldg(ex.block_table + (int64_t)s * ex.max_blocks + bi);
    if (b < 0 || b >= ex.num_blocks) return -1 - FL_KV_ERR_BLOCK;
    return ((int64_t)b * ex.nkv * ex.block_size + (p - bi * ex.block_size)) * ex.head_dim;
}

// ---------------------------------------------------------------- the kernel
// grid.x = ceil(n / (8 * NT)) (SWIGLU: ceil(n / 8)), block = 32 * W (W <= kMaxWarps).
// M16: some token >= 8 (loads x rows g + 8).
// NORM: x is the un-normalised residual h; each x chunk is normalised as it is loaded,
// x = T(h * rstd[token] * gamma) with rstd = 1 / sqrt(mean(h^2) + eps), exactly as
// fl_rms_norm writes it (same f32 formula, one rounding to T), rstd computed by every CTA
// in a prologue (m rows of k values from L2) while its first weight lines are prefetched.
template <typename T, int EPI, int NT, bool M16, bool NORM>
__global__ void __launch_bounds__(kMaxWarps * 32, 1)
gemv_dense_kernel(const T *__restrict__ x, const T *__restrict__ w, const T *__restrict__ bias,
                  T *__restrict__ y, int m, int64_t n, int64_t k, const T *__restrict__ gamma,
                  float eps, const ExtraOf<T, EPI> ex) {
    static_assert(EPI != SWIGLU || NT == 2, "SwiGLU pairs a gate tile with an up tile");
    constexpr int U = unroll<NT>();
    __shared__ float red[kMaxWarps * NT * 128];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    // Output columns of this CTA: [base, base + 8 * NT) (SWIGLU: [base, base + 8)).
    const int64_t base = (int64_t)blockIdx.x * (EPI == SWIGLU ? 8 : 8 * NT);

    // This lane's weight row in each tile, and whether it exists.
    const T *wrow[NT];
    bool vrow[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const int64_t col = base + (EPI == SWIGLU ? 0 : 8 * j) + g;  // output column
        vrow[j] = col < n;
        const int64_t row = (EPI == SWIGLU && j == 1) ? n + col : col;
        wrow[j] = w + (vrow[j] ? row : 0) * k;
    }
    const T *xr0 = x + (int64_t)(g < m ? g : 0) * k;
    const T *xr1 = x + (int64_t)(g + 8 < m ? g + 8 : 0) * k;
    const bool vx0 = g < m, vx1 = M16 && g + 8 < m;
    const uint64_t policy = l2_evict_first_policy();
    const int64_t chunks = (k + 31) >> 5;

    // Start this warp's first weight lines towards L2 while the CTA reduces the norm.
    if constexpr (NORM) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int64_t kk = ((int64_t)warp * U + u) * 32 + 8 * t;
            if (kk < k) {
#pragma unroll
                for (int j = 0; j < NT; ++j)
                    if (vrow[j]) asm volatile("prefetch.global.L2 [%0];" ::"l"(wrow[j] + kk));
            }
        }
    }

    // RMSNorm prologue: rstd of the token rows this lane loads (rs0: row g, rs1: row g + 8).
    float rs0 = 0.f, rs1 = 0.f;
    if constexpr (NORM) {
        // Each thread sums the squares of 8-value chunks tid, tid + blockDim, ... of every
        // token row; warp sums go to shared memory (reusing `red`) and are added in warp order.
        float *ss = red;  // [nwarps][16]
        for (int tok = 0; tok < m; ++tok) {
            const T *hr = x + (int64_t)tok * k;
            float acc = 0.f;
#pragma unroll 4
            for (int64_t i = (int64_t)threadIdx.x * 8; i < k; i += (int64_t)blockDim.x * 8) {
                const uint4 v = __ldg(reinterpret_cast<const uint4 *>(hr + i));
                const T *e = reinterpret_cast<const T *>(&v);
#pragma unroll
                for (int q = 0; q < 8; ++q) {
                    const float f = to_f32<T>(e[q]);
                    acc += f * f;
                }
            }
            acc = warp_sum(acc);
            if (lane == 0) ss[warp * 16 + tok] = acc;
        }
        __syncthreads();
        const float inv_k = 1.f / (float)k;
        float s0 = 0.f, s1 = 0.f;
        for (int v = 0; v < nwarps; ++v) {
            s0 += vx0 ? ss[v * 16 + g] : 0.f;
            s1 += vx1 ? ss[v * 16 + g + 8] : 0.f;
        }
        rs0 = rsqrtf(s0 * inv_k + eps);
        rs1 = rsqrtf(s1 * inv_k + eps);
        __syncthreads();  // `red` is reused by the partial tiles below
    }
    // x normalised as fl_rms_norm rounds it: T(h * rs * gamma), 8 values of 16 bytes.
    auto normalise = [&](uint4 v, uint4 gv, float rs) -> uint4 {
        const T *e = reinterpret_cast<const T *>(&v);
        const T *ge = reinterpret_cast<const T *>(&gv);
        uint4 o;
        T *oe = reinterpret_cast<T *>(&o);
#pragma unroll
        for (int q = 0; q < 8; ++q) oe[q] = from_f32<T>(to_f32<T>(e[q]) * rs * to_f32<T>(ge[q]));
        return o;
    };

    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[j][c] = 0.f;

    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    for (int64_t c0 = (int64_t)warp * U; c0 < chunks; c0 += (int64_t)nwarps * U) {
        uint4 wv[U][NT], xa[U], xb[U], ga[NORM ? U : 1];
        // Every load of the batch is issued before any value is used (the normalisation of
        // x must not stall the weight stream).
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int64_t kk = (c0 + u) * 32 + 8 * t;  // k is a multiple of 8: all in or out
            const bool kin = kk < k;
#pragma unroll
            for (int j = 0; j < NT; ++j) wv[u][j] = (kin && vrow[j]) ? ld_stream128(wrow[j] + kk, policy) : zero;
            xa[u] = (kin && vx0) ? __ldg(reinterpret_cast<const uint4 *>(xr0 + kk)) : zero;
            xb[u] = zero;
            if (M16) xb[u] = (kin && vx1) ? __ldg(reinterpret_cast<const uint4 *>(xr1 + kk)) : zero;
            if constexpr (NORM) ga[u] = (kin && vx0) ? __ldg(reinterpret_cast<const uint4 *>(gamma + kk)) : zero;
        }
        if constexpr (NORM) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                xa[u] = normalise(xa[u], ga[u], rs0);
                if (M16) xb[u] = normalise(xb[u], ga[u], rs1);
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                mma_m16n8k16<T>(acc[j], xa[u].x, xb[u].x, xa[u].y, xb[u].y, wv[u][j].x, wv[u][j].y);
                mma_m16n8k16<T>(acc[j], xa[u].z, xb[u].z, xa[u].w, xb[u].w, wv[u][j].z, wv[u][j].w);
            }
        }
    }

    // acc[j][c] is (token g + 8 * (c >= 2), column 8j + 2t + (c & 1)) of this warp's partial
    // tile. Stored at red[warp][e] with e = (4j + c) * 32 + lane; summed over the warps.
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) red[warp * NT * 128 + (4 * j + c) * 32 + lane] = acc[j][c];

    if constexpr (EPI == ROPE) {
        // Paged cache: each token's slot (paged_slot: the block-table lookup) once per CTA, by
        // thread tok, before the barrier that the partial tiles need anyway.
        __shared__ int64_t slot_base[FL_GEMV_DENSE_MAX_M];
        if (ex.block_table && threadIdx.x < m)
            slot_base[threadIdx.x] = paged_slot(ex, __ldg(ex.seq_ids + threadIdx.x),
                                                __ldg(ex.positions + threadIdx.x));
        __syncthreads();
        // One thread per pair of adjacent columns (2c, 2c + 1) of one token: e = (2j + hi) * 32
        // + ln holds acc entries c = 2 hi and 2 hi + 1 of lane ln in tile j (token (ln >> 2) +
        // 8 hi, columns 8j + 2 (ln & 3) + {0, 1}). n and head_dim are even, so a pair never
        // straddles n or a head.
        for (int e = threadIdx.x; e < NT * 64; e += blockDim.x) {
            const int ln = e & 31, hi = (e >> 5) & 1, j = e >> 6;
            const int tok = (ln >> 2) + 8 * hi;
            const int col = (int)base + 8 * j + 2 * (ln & 3);  // n <= INT32_MAX (launcher)
            if (tok >= m || col >= n) continue;
            const int i0 = (4 * j + 2 * hi) * 32 + ln, i1 = i0 + 32;
            float a0 = 0.f, a1 = 0.f;
            for (int v = 0; v < nwarps; ++v) {
                a0 += red[v * NT * 128 + i0];
                a1 += red[v * NT * 128 + i1];
            }
            if (bias) {
                a0 += to_f32<T>(bias[col]);
                a1 += to_f32<T>(bias[col + 1]);
            }
            const int s = __ldg(ex.seq_ids + tok), p = __ldg(ex.positions + tok);
            const int64_t sb = ex.block_table ? slot_base[tok] : 0;
            const int code = ex.block_table ? (sb < 0 ? (int)(-1 - sb) : 0)
                             : (s < 0 || s >= ex.batch)   ? FL_KV_ERR_SEQUENCE
                             : (p < 0 || p >= ex.max_seq) ? FL_KV_ERR_POSITION
                                                          : 0;
            if (code) {
                // Reported once per token (by its first column's thread), nothing written.
                if (ex.err && col == 0) atomicOr(ex.err, code);
                continue;
            }
            const int head = col / ex.head_dim, el = col - head * ex.head_dim;
            const bool v_head = head >= ex.nq + ex.nkv;
            if (!v_head && el < 2 * ex.half) {
                float sn, cs, y0, y1;
                sincosf(__fmul_rn((float)p, ex.inv_freq[el >> 1]), &sn, &cs);
                rope_rotate(a0, a1, cs, sn, y0, y1);
                a0 = y0;
                a1 = y1;
            }
            T *dst;
            if (head < ex.nq) {
                dst = ex.q_out + ((int64_t)tok * ex.nq + head) * ex.head_dim + el;
            } else {
                const int kh = v_head ? head - ex.nq - ex.nkv : head - ex.nq;
                dst = (v_head ? ex.v_cache : ex.k_cache) +
                      (ex.block_table
                           ? sb + ((int64_t)kh * ex.block_size) * ex.head_dim + el
                           : (((int64_t)s * ex.nkv + kh) * ex.max_seq + p) * ex.head_dim + el);
            }
            dst[0] = from_f32<T>(a0);
            dst[1] = from_f32<T>(a1);
        }
        return;
    }
    __syncthreads();
    constexpr int OUTS = (EPI == SWIGLU ? 1 : NT) * 128;
    for (int e = threadIdx.x; e < OUTS; e += blockDim.x) {
        const int ln = e & 31, c = (e >> 5) & 3, j = e >> 7;
        const int tok = (ln >> 2) + (c >= 2 ? 8 : 0);
        const int64_t col = base + 8 * j + 2 * (ln & 3) + (c & 1);
        if (tok >= m || col >= n) continue;
        float s = 0.f;
        for (int v = 0; v < nwarps; ++v) s += red[v * NT * 128 + e];
        T *out = y + (int64_t)tok * n + col;
        if constexpr (EPI == SWIGLU) {
            float up = 0.f;
            for (int v = 0; v < nwarps; ++v) up += red[v * NT * 128 + 128 + e];
            *out = from_f32<T>(silu(s) * up);
        } else if constexpr (EPI == ADD) {
            *out = from_f32<T>(to_f32<T>(*out) + s);
        } else {
            if (bias) s += to_f32<T>(bias[col]);
            *out = from_f32<T>(s);
        }
    }
}

// ---------------------------------------------------------------- host side
// Warps per CTA: pick_gemv_warps (common.cuh), once per kernel instance's occupancy.
template <typename T, int EPI, int NT, bool M16, bool NORM>
int pick_warps(int64_t ctas, int64_t batches) {
    static std::atomic<int> occupancy[3];
    return pick_gemv_warps(gemv_dense_kernel<T, EPI, NT, M16, NORM>, occupancy, ctas, batches,
                           sm_count());
}

// The RMSNorm of a NORM launch: gamma [k] and eps.
template <typename T> struct NormArgs {
    const T *gamma;
    float eps;
};

template <typename T, int EPI, int NT, bool M16, bool NORM>
fl_status launch_nt(const T *x, const T *w, const T *bias, T *y, int m, int64_t n, int64_t k,
                    NormArgs<T> na, const ExtraOf<T, EPI> &ex, cudaStream_t s) {
    const int64_t ctas = ceil_div(n, EPI == SWIGLU ? 8 : 8 * NT);
    if (ctas > 0x7fffffffLL) return FL_ERR_INVALID_ARGUMENT;
    const int64_t batches = ceil_div(ceil_div(k, 32), unroll<NT>());
    // One token: 8 warps per CTA (fewer for short k) rather than the wave-fill choice, which
    // is faster over a whole decode step at m = 1 but not at m = 4 (so m > 1 keeps
    // pick_warps; kernels/experiments/gemv_dense.md).
    int warps;
    if (m == 1) {
        warps = 8;
        while (warps > 1 && warps > batches) warps /= 2;
    } else {
        warps = pick_warps<T, EPI, NT, M16, NORM>(ctas, batches);
    }
    gemv_dense_kernel<T, EPI, NT, M16, NORM>
        <<<dim3((unsigned)ctas), dim3(32 * warps), 0, s>>>(x, w, bias, y, m, n, k, na.gamma,
                                                           na.eps, ex);
    return launch_status();
}

template <typename T, int EPI, bool M16, bool NORM>
fl_status launch_m(const T *x, const T *w, const T *bias, T *y, int m, int64_t n, int64_t k,
                   NormArgs<T> na, const ExtraOf<T, EPI> &ex, cudaStream_t s) {
    if constexpr (EPI == SWIGLU) {
        return launch_nt<T, EPI, 2, M16, NORM>(x, w, bias, y, m, n, k, na, ex, s);
    } else {
        // Two tiles per CTA (more bytes per lane in flight) when that still gives >= 2 CTAs
        // per SM; one (twice the CTAs) for small n.
        const int nt = ceil_div(n, 16) >= 2LL * sm_count() ? 2 : 1;
        if (nt == 2) return launch_nt<T, EPI, 2, M16, NORM>(x, w, bias, y, m, n, k, na, ex, s);
        return launch_nt<T, EPI, 1, M16, NORM>(x, w, bias, y, m, n, k, na, ex, s);
    }
}

template <typename T, int EPI>
fl_status launch(const void *x, const void *w, const void *bias, void *y, int m, int64_t n,
                 int64_t k, const void *gamma, float eps, cudaStream_t s,
                 const ExtraOf<T, EPI> &ex = {}) {
    const T *xt = static_cast<const T *>(x), *wt = static_cast<const T *>(w),
            *bt = static_cast<const T *>(bias);
    T *yt = static_cast<T *>(y);
    const NormArgs<T> na{static_cast<const T *>(gamma), eps};
    if (gamma) {
        if (m > 8) return launch_m<T, EPI, true, true>(xt, wt, bt, yt, m, n, k, na, ex, s);
        return launch_m<T, EPI, false, true>(xt, wt, bt, yt, m, n, k, na, ex, s);
    }
    if (m > 8) return launch_m<T, EPI, true, false>(xt, wt, bt, yt, m, n, k, na, ex, s);
    return launch_m<T, EPI, false, false>(xt, wt, bt, yt, m, n, k, na, ex, s);
}

template <typename T>
fl_status dispatch_epilogue(fl_gemv_dense_epilogue epi, const void *x, const void *w,
                            const void *bias, void *y, int m, int64_t n, int64_t k,
                            const void *gamma, float eps, cudaStream_t s) {
    switch (epi) {
    case FL_GEMV_DENSE_LINEAR: return launch<T, LINEAR>(x, w, bias, y, m, n, k, gamma, eps, s);
    case FL_GEMV_DENSE_SWIGLU: return launch<T, SWIGLU>(x, w, bias, y, m, n, k, gamma, eps, s);
    case FL_GEMV_DENSE_ADD: return launch<T, ADD>(x, w, bias, y, m, n, k, gamma, eps, s);
    }
    return FL_ERR_INVALID_ARGUMENT;
}

}  // namespace gemv_dense
}  // namespace fl

namespace fl {
namespace gemv_dense {
// Both launchers: arguments checked, then dispatched. gamma == NULL: no RMSNorm.
static fl_status run(fl_dtype dtype, fl_gemv_dense_epilogue epilogue, const void *x,
                     const void *w, const void *bias, void *y, int64_t m, int64_t n, int64_t k,
                     const void *gamma, float eps, fl_stream stream) {
    if (m < 0 || m > FL_GEMV_DENSE_MAX_M || n < 0 || k <= 0 || k % 8 != 0)
        return FL_ERR_INVALID_ARGUMENT;
    if (epilogue != FL_GEMV_DENSE_LINEAR && epilogue != FL_GEMV_DENSE_SWIGLU &&
        epilogue != FL_GEMV_DENSE_ADD)
        return FL_ERR_INVALID_ARGUMENT;
    if (epilogue != FL_GEMV_DENSE_LINEAR && bias != nullptr) return FL_ERR_INVALID_ARGUMENT;
    const int64_t rows = epilogue == FL_GEMV_DENSE_SWIGLU ? 2 : 1;
    if (n > INT64_MAX / rows / k) return FL_ERR_INVALID_ARGUMENT;
    if (dtype != FL_DTYPE_F16 && dtype != FL_DTYPE_BF16) return FL_ERR_UNSUPPORTED_DTYPE;
    if (m == 0 || n == 0) return FL_OK;
    if (!x || !w || !y) return FL_ERR_INVALID_ARGUMENT;
    if (!aligned16(x) || !aligned16(w) || (gamma && !aligned16(gamma))) return FL_ERR_MISALIGNED;
    if ((reinterpret_cast<uintptr_t>(y) & 1u) != 0 || (reinterpret_cast<uintptr_t>(bias) & 1u) != 0)
        return FL_ERR_MISALIGNED;
    const cudaStream_t s = as_stream(stream);
    if (dtype == FL_DTYPE_F16)
        return dispatch_epilogue<__half>(epilogue, x, w, bias, y, (int)m, n, k, gamma, eps, s);
    return dispatch_epilogue<__nv_bfloat16>(epilogue, x, w, bias, y, (int)m, n, k, gamma, eps, s);
}
}  // namespace gemv_dense
}  // namespace fl

extern "C" fl_status fl_gemv_dense(fl_dtype dtype, fl_gemv_dense_epilogue epilogue,
                                   const void *x, const void *w, const void *bias, void *y,
                                   int64_t m, int64_t n, int64_t k, fl_stream stream) {
    return fl::gemv_dense::run(dtype, epilogue, x, w, bias, y, m, n, k, nullptr, 0.f, stream);
}

extern "C" fl_status fl_gemv_dense_rms_norm(fl_dtype dtype, fl_gemv_dense_epilogue epilogue,
                                            const void *h, const void *gamma, float eps,
                                            const void *w, const void *bias, void *y, int64_t m,
                                            int64_t n, int64_t k, fl_stream stream) {
    if (!gamma || !(eps > 0.f) || !(eps < INFINITY)) return FL_ERR_INVALID_ARGUMENT;
    return fl::gemv_dense::run(dtype, epilogue, h, w, bias, y, m, n, k, gamma, eps, stream);
}

namespace fl {
namespace gemv_dense {
// Where a ROPE launch appends: contiguous (block_table NULL; batch, max_seq) or paged
// (block_table [batch, max_blocks], num_blocks, block_size).
struct CacheDest {
    const int32_t *block_table;
    int32_t batch;
    int64_t max_seq;
    int32_t max_blocks;
    int64_t num_blocks;
    int32_t block_size;
};

// Fills the ROPE epilogue's argument (frequencies past rotary_dim / 2 zeroed).
template <typename T>
static void fill_extra(RopeExtra<T> &ex, const fl_rope_params *p, const int32_t *seq_ids,
                       const int32_t *positions, void *q_out, void *k_cache, void *v_cache,
                       int32_t *err, int32_t nq, int32_t nkv, const CacheDest &c) {
    const int half = p->rotary_dim / 2;
    for (int i = 0; i < FL_ROPE_MAX_PAIRS; ++i) ex.inv_freq[i] = i < half ? p->inv_freq[i] : 0.f;
    ex.seq_ids = seq_ids;
    ex.positions = positions;
    ex.q_out = static_cast<T *>(q_out);
    ex.k_cache = static_cast<T *>(k_cache);
    ex.v_cache = static_cast<T *>(v_cache);
    ex.err = err;
    ex.block_table = c.block_table;
    ex.max_seq = c.max_seq;
    ex.num_blocks = c.num_blocks;
    ex.nq = nq;
    ex.nkv = nkv;
    ex.head_dim = p->head_dim;
    ex.half = half;
    ex.batch = c.batch;
    ex.max_blocks = c.max_blocks;
    ex.block_size = c.block_size;
}

// Both ROPE launchers: the checks that do not depend on the cache layout, then the launch.
static fl_status rope_append_run(fl_dtype dtype, const void *h, const void *gamma, float eps,
                                 const void *w, const void *bias, int64_t m, int64_t k,
                                 int32_t q_heads, int32_t kv_heads, const fl_rope_params *p,
                                 const int32_t *seq_ids, const int32_t *positions, void *q_out,
                                 void *k_cache, void *v_cache, const CacheDest &c,
                                 int32_t *err_flag, fl_stream stream) {
    if (!rope_params_ok(p) || p->interleaved != 1 || p->head_dim % 8 != 0)
        return FL_ERR_INVALID_ARGUMENT;
    if (q_heads < 0 || kv_heads < 1 || c.batch < 1) return FL_ERR_INVALID_ARGUMENT;
    if (gamma && (!(eps > 0.f) || !(eps < INFINITY))) return FL_ERR_INVALID_ARGUMENT;
    if (m < 0 || m > FL_GEMV_DENSE_MAX_M || k <= 0 || k % 8 != 0) return FL_ERR_INVALID_ARGUMENT;
    const int64_t n = ((int64_t)q_heads + 2 * (int64_t)kv_heads) * p->head_dim;
    if (n > INT32_MAX || n > INT64_MAX / k) return FL_ERR_INVALID_ARGUMENT;
    if (dtype != FL_DTYPE_F16 && dtype != FL_DTYPE_BF16) return FL_ERR_UNSUPPORTED_DTYPE;
    if (m == 0) return FL_OK;
    if (!h || !w || !seq_ids || !positions || !k_cache || !v_cache || (q_heads > 0 && !q_out))
        return FL_ERR_INVALID_ARGUMENT;
    if (!aligned16(h) || !aligned16(w) || (gamma && !aligned16(gamma))) return FL_ERR_MISALIGNED;
    // Pairs are stored as two 2-byte values; bias is read per element.
    if (((reinterpret_cast<uintptr_t>(q_out) | reinterpret_cast<uintptr_t>(k_cache) |
          reinterpret_cast<uintptr_t>(v_cache) | reinterpret_cast<uintptr_t>(bias)) & 1u) != 0)
        return FL_ERR_MISALIGNED;
    const cudaStream_t s = as_stream(stream);
    if (dtype == FL_DTYPE_F16) {
        RopeExtra<__half> ex;
        fill_extra(ex, p, seq_ids, positions, q_out, k_cache, v_cache, err_flag, q_heads,
                   kv_heads, c);
        return launch<__half, ROPE>(h, w, bias, nullptr, (int)m, n, k, gamma, eps, s, ex);
    }
    RopeExtra<__nv_bfloat16> ex;
    fill_extra(ex, p, seq_ids, positions, q_out, k_cache, v_cache, err_flag, q_heads, kv_heads,
               c);
    return launch<__nv_bfloat16, ROPE>(h, w, bias, nullptr, (int)m, n, k, gamma, eps, s, ex);
}
}  // namespace gemv_dense
}  // namespace fl

extern "C" fl_status fl_gemv_dense_rope_append(
    fl_dtype dtype, const void *h, const void *gamma, float eps, const void *w, const void *bias,
    int64_t m, int64_t k, int32_t q_heads, int32_t kv_heads, const fl_rope_params *params,
    const int32_t *seq_ids, const int32_t *positions, void *q_out, void *k_cache, void *v_cache,
    int32_t batch, int64_t max_seq, int32_t *err_flag, fl_stream stream) {
    if (max_seq < 1) return FL_ERR_INVALID_ARGUMENT;
    const fl::gemv_dense::CacheDest c{nullptr, batch, max_seq, 0, 0, 0};
    return fl::gemv_dense::rope_append_run(dtype, h, gamma, eps, w, bias, m, k, q_heads,
                                           kv_heads, params, seq_ids, positions, q_out, k_cache,
                                           v_cache, c, err_flag, stream);
}

extern "C" fl_status fl_gemv_dense_rope_append_paged(
    fl_dtype dtype, const void *h, const void *gamma, float eps, const void *w, const void *bias,
    int64_t m, int64_t k, int32_t q_heads, int32_t kv_heads, const fl_rope_params *params,
    const int32_t *seq_ids, const int32_t *positions, void *q_out, void *k_cache, void *v_cache,
    const int32_t *block_table, int32_t batch, int32_t max_blocks_per_seq, int64_t num_blocks,
    int32_t block_size, int32_t *err_flag, fl_stream stream) {
    if (max_blocks_per_seq < 1 || num_blocks < 1 || block_size < 1 || (m > 0 && !block_table))
        return FL_ERR_INVALID_ARGUMENT;
    const fl::gemv_dense::CacheDest c{block_table, batch, 0, max_blocks_per_seq, num_blocks,
                                      block_size};
    return fl::gemv_dense::rope_append_run(dtype, h, gamma, eps, w, bias, m, k, q_heads,
                                           kv_heads, params, seq_ids, positions, q_out, k_cache,
                                           v_cache, c, err_flag, stream);
}
