// Causal prefill attention on Hopper tensor cores (wgmma), head_dim 128, f16 / bf16: the
// FL_PREFILL_PATH=wgmma path of fl_attention_prefill (attention_prefill.cu keeps the
// mma.sync kernel as the default until this one is measured; see bench/RESULTS.md).
//
// EXPERIMENTAL, written in session 7 without a GPU run: its building blocks (descriptors,
// 128-byte swizzle, accumulator and register-A layouts) are the ones tests/wgmma_probe.rs
// checks; the prefill tests run this path with FL_PREFILL_PATH=wgmma.
//
// One CTA owns BM = 128 query rows of one (sequence, q head): two warpgroups of 64 rows each,
// sharing the K/V tiles. Per key tile of BN = 64 keys (from the diagonal tile down, as the
// mma.sync kernel):
//   S = Q K^T     8 x wgmma.m64n64k16, both operands in shared memory (K-major, 128B swizzle)
//   online softmax on the accumulator fragments (base 2, causal / window mask), O rescaled
//   O += P V      4 x wgmma.m64n128k16, P from registers (the S accumulator layout is the A
//                 fragment layout), V in shared memory MN-major (transposed B)
// K and V stream through two stages of shared memory with cp.async (one tile ahead); after a
// tile's copies land each thread fences them to the async proxy (wgmma reads shared memory
// through it) and the CTA synchronises. Q is loaded once. No [L, L] matrix, no workspace.
// Not yet done (what FA3 adds): TMA loads, a producer warp, softmax of one tile overlapped
// with the wgmmas of the next, GQA heads sharing a CTA.
#include "common/common.cuh"
#include "common/wgmma.cuh"

namespace fl {
namespace prefill_wgmma {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int D = 128, WGS = 2, BM = 64 * WGS, THREADS = 128 * WGS;
constexpr int TILE_BYTES = 64 * D * 2;                      // 64 rows of 128 16-bit values
constexpr int SMEM_BYTES = (WGS + 4) * TILE_BYTES + 1024;   // Q, 2 x (K, V), alignment slack

struct Params {
    const void *q, *k, *v;
    void *out;
    const int32_t *cu_seqlens;
    int32_t batch, q_heads, kv_heads, total_tokens, window;
    float scale_log2;  // softmax scale * log2(e)
};

#ifdef FL_HAVE_WGMMA
constexpr int BN = 64;  // keys per tile
#endif

template <typename T>
__global__ void __launch_bounds__(THREADS, 1) prefill_wgmma_kernel(Params p) {
#ifdef FL_HAVE_WGMMA
    using namespace fl::wg;
    extern __shared__ unsigned char smem_raw[];
    const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
    const uint32_t s_q = base;
    auto s_k = [&](int st) { return base + (uint32_t)((WGS + 2 * st) * TILE_BYTES); };
    auto s_v = [&](int st) { return base + (uint32_t)((WGS + 2 * st + 1) * TILE_BYTES); };

    const int h = blockIdx.x, b = blockIdx.y;
    const int m_block = gridDim.z - 1 - blockIdx.z;  // heavy (late) query tiles first
    const int kvh = h / (p.q_heads / p.kv_heads);
    int start = p.cu_seqlens[b], end = p.cu_seqlens[b + 1];
    start = min(max(start, 0), p.total_tokens);
    end = min(max(end, start), p.total_tokens);
    const int len = end - start;
    const int q_start = m_block * BM;
    if (q_start >= len) return;
    const int q_last = min(q_start + BM, len) - 1;

    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int wg_first = q_start + 64 * wg;       // this warpgroup's first query row
    const int wg_last = min(wg_first + 63, len - 1);  // < wg_first: no rows here
    const int r0 = wg_first + 16 * warp + g, r1 = r0 + 8;  // this thread's two rows

    const int64_t q_stride = (int64_t)p.q_heads * D, kv_stride = (int64_t)p.kv_heads * D;
    const T *qg = static_cast<const T *>(p.q) + (int64_t)start * q_stride + (int64_t)h * D;
    const T *kg = static_cast<const T *>(p.k) + (int64_t)start * kv_stride + (int64_t)kvh * D;
    const T *vg = static_cast<const T *>(p.v) + (int64_t)start * kv_stride + (int64_t)kvh * D;

    // Key tiles [n_lo, n_hi): keys 0..q_last (causal), >= q_start - window + 1 (window).
    const int n_hi = (q_last + BN) / BN;
    const int n_lo = p.window > 0 ? max(0, q_start - p.window + 1) / BN : 0;

#pragma unroll
    for (int w = 0; w < WGS; ++w)
        load_rows<THREADS>(s_q + (uint32_t)(w * TILE_BYTES), qg, q_stride, q_start + 64 * w, len, tid);
    load_rows<THREADS>(s_k(0), kg, kv_stride, (n_hi - 1) * BN, len, tid);
    load_rows<THREADS>(s_v(0), vg, kv_stride, (n_hi - 1) * BN, len, tid);
    cp_async_commit();

    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    const uint32_t q_wg = s_q + (uint32_t)(wg * TILE_BYTES);

    int st = 0;
    for (int j = n_hi - 1; j >= n_lo; --j) {
        if (j - 1 >= n_lo) {
            load_rows<THREADS>(s_k(st ^ 1), kg, kv_stride, (j - 1) * BN, len, tid);
            load_rows<THREADS>(s_v(st ^ 1), vg, kv_stride, (j - 1) * BN, len, tid);
        }
        cp_async_commit();
        cp_async_wait<1>();  // tile j (and Q) landed: this thread's copies
        fence_async_smem();  // ... made visible to the wgmma (async) proxy
        __syncthreads();     // ... and everyone's

        // Warpgroup-uniform: does this tile hold a key some row of this warpgroup sees?
        const bool active = wg_last >= wg_first && j * BN <= wg_last &&
                            (p.window <= 0 || (j + 1) * BN - 1 > wg_first - p.window);
        if (active) {
            float s[32];
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 8; ++kk) {
                const uint32_t off = (uint32_t)((kk >> 2) * 8192 + (kk & 3) * 32);
                Wg<T>::ss_m64n64k16(s, mdesc(q_wg + off, 16, 1024), mdesc(s_k(st) + off, 16, 1024),
                                    kk);
            }
            wgmma_commit();
            wgmma_wait0();

            // s[4c + e] = (row r0, key 8c + 2t + e), s[4c + 2 + e] = (row r1, same key).
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int c = 0; c < 8; ++c)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int key = j * BN + 8 * c + 2 * t + e;
                    float v0 = s[4 * c + e] * p.scale_log2, v1 = s[4 * c + 2 + e] * p.scale_log2;
                    if (key > r0 || (p.window > 0 && key <= r0 - p.window)) v0 = -INFINITY;
                    if (key > r1 || (p.window > 0 && key <= r1 - p.window)) v1 = -INFINITY;
                    s[4 * c + e] = v0;
                    s[4 * c + 2 + e] = v1;
                    mx0 = fmaxf(mx0, v0);
                    mx1 = fmaxf(mx1, v1);
                }
#pragma unroll
            for (int x = 1; x <= 2; x <<= 1) {
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
            }
            const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
            // A row with no visible key yet keeps m = -inf; exp2 against 0 then gives 0s.
            const float u0 = n0 == -INFINITY ? 0.f : n0, u1 = n1 == -INFINITY ? 0.f : n1;
            const float a0 = exp2f(m0 - u0), a1 = exp2f(m1 - u1);
            m0 = n0;
            m1 = n1;
            float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
            for (int c = 0; c < 8; ++c)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    s[4 * c + e] = exp2f(s[4 * c + e] - u0);
                    s[4 * c + 2 + e] = exp2f(s[4 * c + 2 + e] - u1);
                    sum0 += s[4 * c + e];
                    sum1 += s[4 * c + 2 + e];
                }
            l0 = l0 * a0 + sum0;  // per-thread partial sums; the quad adds them at the end
            l1 = l1 * a1 + sum1;
#pragma unroll
            for (int c = 0; c < 16; ++c) {
                o[4 * c] *= a0;
                o[4 * c + 1] *= a0;
                o[4 * c + 2] *= a1;
                o[4 * c + 3] *= a1;
            }
            // P as the A fragments of the 4 k-steps (keys 16kk..16kk+15).
            uint32_t pa[4][4];
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    pa[kk][i] = Wg<T>::pack(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
                Wg<T>::rs_m64n128k16_tb(o, pa[kk], mdesc(s_v(st) + (uint32_t)kk * 2048u, 8192, 1024));
            wgmma_commit();
            wgmma_wait0();
        }
        __syncthreads();  // stage st is overwritten by the next iteration's copies
        st ^= 1;
    }

#pragma unroll
    for (int x = 1; x <= 2; x <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, x);
        l1 += __shfl_xor_sync(0xffffffffu, l1, x);
    }
    // __fdividef (2 ulp; l >= 1 for a row with a visible key): an IEEE division is a called
    // subroutine, and with relocatable device code ptxas then serialises every wgmma of the
    // kernel (warning C7509).
    const float i0 = l0 > 0.f ? __fdividef(1.f, l0) : 0.f, i1 = l1 > 0.f ? __fdividef(1.f, l1) : 0.f;
    T *og = static_cast<T *>(p.out) + (int64_t)start * q_stride + (int64_t)h * D;
#pragma unroll
    for (int c = 0; c < 16; ++c) {
        const int col = 8 * c + 2 * t;
        if (r0 < len && r0 <= wg_last)
            *reinterpret_cast<uint32_t *>(og + (int64_t)r0 * q_stride + col) =
                Wg<T>::pack(o[4 * c] * i0, o[4 * c + 1] * i0);
        if (r1 < len && r1 <= wg_last)
            *reinterpret_cast<uint32_t *>(og + (int64_t)r1 * q_stride + col) =
                Wg<T>::pack(o[4 * c + 2] * i1, o[4 * c + 3] * i1);
    }
#endif
}

// Whether this process's device runs the kernel (compute capability 9.x: sm_90a code).
inline bool device_ok() {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return major == 9;
}

template <typename T>
fl_status launch_t(const fl_prefill_attention_args *a, cudaStream_t st) {
    Params p;
    p.q = a->q;
    p.k = a->k;
    p.v = a->v;
    p.out = a->out;
    p.cu_seqlens = a->cu_seqlens;
    p.batch = a->batch;
    p.q_heads = a->q_heads;
    p.kv_heads = a->kv_heads;
    p.total_tokens = a->total_tokens;
    p.window = a->window;
    p.scale_log2 = a->scale * kLog2e;
    const int64_t m_blocks = ceil_div(a->max_seq_len, BM);
    if (m_blocks > 65535) return FL_ERR_INVALID_ARGUMENT;
    auto kern = prefill_wgmma_kernel<T>;
    const cudaError_t e =
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return (fl_status)e;
    }
    dim3 grid((unsigned)a->q_heads, (unsigned)a->batch, (unsigned)m_blocks);
    kern<<<grid, THREADS, SMEM_BYTES, st>>>(p);
    return launch_status();
}

// Arguments already checked by fl_attention_prefill. FL_ERR_UNSUPPORTED_DTYPE when this path
// cannot run the call (head_dim != 128, f32, a device other than sm_90): the caller then uses
// the mma.sync kernel.
fl_status launch(const fl_prefill_attention_args *a, cudaStream_t st) {
    if (a->head_dim != D || a->dtype == FL_DTYPE_F32 || !device_ok())
        return FL_ERR_UNSUPPORTED_DTYPE;
    if (a->dtype == FL_DTYPE_F16) return launch_t<__half>(a, st);
    return launch_t<__nv_bfloat16>(a, st);
}

}  // namespace prefill_wgmma
}  // namespace fl
