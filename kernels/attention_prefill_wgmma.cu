// Causal prefill attention on Hopper tensor cores (wgmma), head_dim 128, f16 / bf16: the
// FL_PREFILL_PATH=wgmma path of fl_attention_prefill (attention_prefill.cu keeps the
// mma.sync kernel as the default until this one measures faster; see bench/RESULTS.md).
//
// One CTA owns BM = 128 query rows of one (sequence, q head): two warpgroups of 64 rows each,
// sharing the K/V tiles. Key tiles of BN = 128 keys, from the diagonal tile down:
//   S_j = Q K_j^T   8 x wgmma.m64n128k16, both operands in shared memory (K-major, 128B swizzle)
//   O += P V        8 x wgmma.m64n128k16, P from registers (the S accumulator layout is the A
//                   fragment layout), V in shared memory MN-major (transposed B)
// Within a warpgroup the P V product of tile j+1 is issued right after S_j and runs while the
// softmax of S_j is computed (FlashAttention-3's intra-warpgroup overlap): O is rescaled only
// once that product has landed. Registers: O 64, S 64, P 32 (222 in all, one CTA per SM). K and V stream through two stages each with cp.async; the copy
// of K_{j-1} and V_j is issued at the top of iteration j, right after the barrier that makes
// the previous copies visible (each thread fences its own copies to the async proxy, which
// wgmma reads shared memory through, before the barrier). Q is loaded once. No [L, L] matrix,
// no workspace.
// Not yet done (what FA3 adds): TMA loads and a producer warp, ping-pong scheduling of the
// two warpgroups' softmax against each other's wgmmas, GQA heads sharing a CTA.
#include "common/common.cuh"
#include "common/wgmma.cuh"

namespace fl {
namespace prefill_wgmma {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int D = 128, WGS = 2, BM = 64 * WGS, BN = 128, THREADS = 128 * WGS;
constexpr int Q_BYTES = 64 * D * 2;    // one warpgroup's 64 query rows
constexpr int KV_BYTES = BN * D * 2;   // one K or V tile
constexpr int SMEM_BYTES = WGS * Q_BYTES + 4 * KV_BYTES + 1024;  // Q, 2 x K, 2 x V, alignment

struct Params {
    const void *q, *k, *v;
    void *out;
    const int32_t *cu_seqlens;
    int32_t batch, q_heads, kv_heads, total_tokens, window;
    float scale_log2;  // softmax scale * log2(e)
};

template <typename T>
__global__ void __launch_bounds__(THREADS, 1) prefill_wgmma_kernel(Params p) {
#ifdef FL_HAVE_WGMMA
    using namespace fl::wg;
    extern __shared__ unsigned char smem_raw[];
    const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
    const uint32_t s_q = base;
    auto s_k = [&](int j) { return base + (uint32_t)(WGS * Q_BYTES + (j & 1) * KV_BYTES); };
    auto s_v = [&](int j) { return base + (uint32_t)(WGS * Q_BYTES + (2 + (j & 1)) * KV_BYTES); };

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
    const int wg_first = q_start + 64 * wg;           // this warpgroup's first query row
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
        load_rows<THREADS, T, 64>(s_q + (uint32_t)(w * Q_BYTES), qg, q_stride, q_start + 64 * w, len, tid);
    load_rows<THREADS, T, BN>(s_k(n_hi - 1), kg, kv_stride, (n_hi - 1) * BN, len, tid);
    cp_async_commit();

    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    float s[64];
    uint32_t pa[8][4];  // P of the previous tile, as the A fragments of 8 k-steps
    const uint32_t q_wg = s_q + (uint32_t)(wg * Q_BYTES);

    // Every wgmma below is issued unconditionally by both warpgroups (a wgmma in a path ptxas
    // cannot prove warpgroup-uniform gets serialised, warning C7520). A tile that holds no key a
    // row of this warpgroup sees (a warpgroup past the sequence end, a tile before its window)
    // is computed fully masked and adds nothing.
    // Top of iteration j: K_j and V_{j+1} landed (this thread's copies), fenced to the async
    // proxy, and everyone's; everyone also finished reading K_{j+1} and V_{j+2}, whose stages
    // the copies of K_{j-1} and V_j then overwrite.
    auto sync_and_load = [&](int j) {
        cp_async_wait<0>();
        fence_async_smem();
        __syncthreads();
        if (j - 1 >= n_lo) load_rows<THREADS, T, BN>(s_k(j - 1), kg, kv_stride, (j - 1) * BN, len, tid);
        load_rows<THREADS, T, BN>(s_v(j), vg, kv_stride, j * BN, len, tid);
        cp_async_commit();
    };
    auto issue_s = [&](int j) {
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
            const uint32_t oq = (uint32_t)((kk >> 2) * 8192 + (kk & 3) * 32);
            const uint32_t ok = (uint32_t)((kk >> 2) * 16384 + (kk & 3) * 32);
            Wg<T>::ss_m64n128k16(s, mdesc(q_wg + oq, 16, 1024), mdesc(s_k(j) + ok, 16, 1024), kk);
        }
        wgmma_commit();
    };
    auto issue_pv = [&](int j) {
#pragma unroll
        for (int kk = 0; kk < 8; ++kk)
            Wg<T>::rs_m64n128k16_tb(o, pa[kk], mdesc(s_v(j) + (uint32_t)kk * 2048u, 16384, 1024));
        wgmma_commit();
    };
    // Online softmax of S_j in place (s becomes P), returning the factors O must be rescaled by.
    auto softmax = [&](int j, float &a0, float &a1, float &sum0, float &sum1) {
        // s[4c + e] = (row r0, key 8c + 2t + e), s[4c + 2 + e] = (row r1, same key). Masks only
        // where a key of the tile lies beyond a row (the diagonal) or before its window.
        const bool masked = (j + 1) * BN - 1 > wg_first || (p.window > 0 && j * BN <= wg_last - p.window);
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int c = 0; c < 16; ++c)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float v0 = s[4 * c + e] * p.scale_log2, v1 = s[4 * c + 2 + e] * p.scale_log2;
                if (masked) {
                    const int key = j * BN + 8 * c + 2 * t + e;
                    if (key > r0 || (p.window > 0 && key <= r0 - p.window)) v0 = -INFINITY;
                    if (key > r1 || (p.window > 0 && key <= r1 - p.window)) v1 = -INFINITY;
                }
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
        a0 = exp2f(m0 - u0);
        a1 = exp2f(m1 - u1);
        m0 = n0;
        m1 = n1;
        sum0 = 0.f;
        sum1 = 0.f;
#pragma unroll
        for (int c = 0; c < 16; ++c)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                s[4 * c + e] = exp2f(s[4 * c + e] - u0);
                s[4 * c + 2 + e] = exp2f(s[4 * c + 2 + e] - u1);
                sum0 += s[4 * c + e];
                sum1 += s[4 * c + 2 + e];
            }
    };
    auto rescale_and_pack = [&](float a0, float a1, float sum0, float sum1) {
        l0 = l0 * a0 + sum0;  // per-thread partial sums; the quad adds them at the end
        l1 = l1 * a1 + sum1;
#pragma unroll
        for (int c = 0; c < 16; ++c) {
            o[4 * c] *= a0;
            o[4 * c + 1] *= a0;
            o[4 * c + 2] *= a1;
            o[4 * c + 3] *= a1;
        }
#pragma unroll
        for (int kk = 0; kk < 8; ++kk)
#pragma unroll
            for (int i = 0; i < 4; ++i) pa[kk][i] = Wg<T>::pack(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
    };

    float a0, a1, sum0, sum1;
    {  // the diagonal tile: S only
        const int j = n_hi - 1;
        sync_and_load(j);
        wgmma_fence();
        issue_s(j);
        wgmma_wait<0>();
        fence_regs(s);
        softmax(j, a0, a1, sum0, sum1);
        rescale_and_pack(a0, a1, sum0, sum1);
    }
    for (int j = n_hi - 2; j >= n_lo; --j) {
        sync_and_load(j);
        // S_j, then O += P_{j+1} V_{j+1}, which runs while S_j's softmax is computed
        wgmma_fence();
        issue_s(j);
        issue_pv(j + 1);
        wgmma_wait<1>();
        fence_regs(s);
        softmax(j, a0, a1, sum0, sum1);
        wgmma_wait<0>();  // O and pa may be touched again
        fence_regs(o);
        rescale_and_pack(a0, a1, sum0, sum1);
    }
    // The last P V product, with V_{n_lo} (copied at the top of the last iteration).
    cp_async_wait<0>();
    fence_async_smem();
    __syncthreads();
    wgmma_fence();
    issue_pv(n_lo);
    wgmma_wait<0>();
    fence_regs(o);

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
