// Building blocks of a Hopper (sm_90a) prefill attention, each checked on its own against the
// tile shapes the prefill kernel uses (issue 6: the mma.sync kernel trails cuDNN on Hopper;
// wgmma is the way): 64 queries x 128 keys per tile, head_dim 128. One warpgroup
// (128 threads), one CTA:
//
//   fl_wgmma_probe_qk: S = Q K^T, Q [64, 128] and K [128, 128] f16 row-major, both in shared
//     memory in the 128-byte-swizzled K-major layout (two 64-column atoms each: 8 KB apart
//     for Q, 16 KB apart for K), 8 x wgmma.m64n128k16 (SS: both operands from shared memory
//     through matrix descriptors); S [64, 128] f32 is written from the accumulator fragments.
//     Checks: the descriptor fields (start address, stride byte offset 1024 between 8-row
//     groups, 128B swizzle mode), the k-step inside a swizzled 128-byte row (+32 bytes), the
//     jump between the two atoms, and the n128 accumulator layout (warp w: rows 16w..16w+15;
//     g = lane / 4, t = lane % 4, j = 0..15: d[4j + {0,1}] = (16w + g, 8j + 2t + {0,1}),
//     d[4j + {2,3}] = (16w + g + 8, same)).
//   fl_wgmma_probe_pv: O = P V, P [64, 128] f32 read into registers in that accumulator layout
//     (as S leaves them), converted to f16 A fragments (k-step kk = keys 16kk..16kk+15:
//     a[kk][i] = d[8kk + 2i], d[8kk + 2i + 1], i = 0..3), V [128, 128] f16 row-major in shared
//     memory MN-major (d contiguous; two 64-column atoms 16 KB apart = the leading byte
//     offset, 8-row groups 1 KB apart = the stride byte offset), 8 x wgmma.m64n128k16 (RS,
//     transposed B). Writes O [64, 128] f32.
//
// The tiles are loaded, and the wgmmas issued, by the very helpers of common/wgmma.cuh that
// the prefill kernel (attention_prefill_wgmma.cu) uses. Both write NaN everywhere when the
// device code was not compiled for sm_90a (no wgmma).
#include "common/common.cuh"
#include "common/wgmma.cuh"

namespace fl {
namespace wgmma_probe {

constexpr int Q_BYTES = 64 * 128 * 2;    // Q tile: 64 rows of 128 f16
constexpr int KV_BYTES = 128 * 128 * 2;  // K or V tile: 128 rows of 128 f16
// Dynamic shared memory of qk_kernel: Q and K tiles, plus slack to align the base to 1024.
constexpr int QK_SMEM = Q_BYTES + KV_BYTES + 1024;

// Offset in a row-major [64, 128] matrix of accumulator register i of this thread in a
// m64n128 wgmma (warp w: rows 16w..16w+15; g = lane / 4, t = lane % 4): d[4j + e] is
// (16w + g + 8 (e / 2), 8j + 2t + e % 2).
__device__ __forceinline__ int acc_offset(int i) {
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int j = i >> 2, e = i & 3;
    return (16 * w + g + 8 * (e >> 1)) * 128 + 8 * j + 2 * t + (e & 1);
}

__global__ void __launch_bounds__(128) qk_kernel(const __half *q, const __half *k, float *s) {
#ifdef FL_HAVE_WGMMA
    using namespace fl::wg;
    extern __shared__ unsigned char smem_raw[];
    // Swizzle atoms must be 1024-byte aligned (descriptor base offset 0).
    const uint32_t aq = (smem_addr(smem_raw) + 1023u) & ~1023u;
    const uint32_t ak = aq + (uint32_t)Q_BYTES;
    load_rows<128, __half, 64>(aq, q, 128, 0, 64, threadIdx.x);
    load_rows<128, __half, 128>(ak, k, 128, 0, 128, threadIdx.x);
    cp_async_commit();
    cp_async_wait<0>();
    fence_async_smem();
    __syncthreads();
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.f;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
        // k-step kk = head dims 16kk..16kk+15: atom kk / 4, 32 bytes per step inside a row.
        const uint32_t oq = (uint32_t)((kk >> 2) * 8192 + (kk & 3) * 32);
        const uint32_t ok = (uint32_t)((kk >> 2) * 16384 + (kk & 3) * 32);
        Wg<__half>::ss_m64n128k16(d, mdesc(aq + oq, 16, 1024), mdesc(ak + ok, 16, 1024), kk);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(d);
#pragma unroll
    for (int i = 0; i < 64; ++i) s[acc_offset(i)] = d[i];
#else
    for (int i = threadIdx.x; i < 64 * 128; i += blockDim.x) s[i] = __int_as_float(0x7fc00000);
#endif
}

__global__ void __launch_bounds__(128) pv_kernel(const float *p, const __half *v, float *o) {
#ifdef FL_HAVE_WGMMA
    using namespace fl::wg;
    __shared__ __align__(1024) char sv[KV_BYTES];
    const uint32_t av = smem_addr(sv);
    load_rows<128, __half, 128>(av, v, 128, 0, 128, threadIdx.x);
    cp_async_commit();
    cp_async_wait<0>();
    fence_async_smem();
    __syncthreads();
    // P in the accumulator layout of a m64n128 wgmma (as the S = Q K^T product leaves it).
    float pa[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) pa[i] = p[acc_offset(i)];
    uint32_t a[8][4];  // A fragments of the 8 k-steps, formed before the wgmmas read them
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i) a[kk][i] = Wg<__half>::pack(pa[8 * kk + 2 * i], pa[8 * kk + 2 * i + 1]);
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.f;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
        // k-step kk = V rows 16kk..16kk+15: two 8-row groups of 1024 bytes.
        Wg<__half>::rs_m64n128k16_tb(d, a[kk], mdesc(av + (uint32_t)kk * 2048u, 16384, 1024));
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(d);
#pragma unroll
    for (int i = 0; i < 64; ++i) o[acc_offset(i)] = d[i];
#else
    for (int i = threadIdx.x; i < 64 * 128; i += blockDim.x) o[i] = __int_as_float(0x7fc00000);
#endif
}

}  // namespace wgmma_probe
}  // namespace fl

extern "C" fl_status fl_wgmma_probe_qk(const void *q, const void *k, float *s, fl_stream stream) {
    if (!q || !k || !s) return FL_ERR_INVALID_ARGUMENT;
    if (!fl::aligned16(q) || !fl::aligned16(k)) return FL_ERR_MISALIGNED;
    using fl::wgmma_probe::QK_SMEM;
    auto kern = fl::wgmma_probe::qk_kernel;
    static_assert(QK_SMEM > 48 * 1024, "the opt-in below is needed only above 48 KB");
    const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, QK_SMEM);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();  // leave no error for later launches
        return (fl_status)e;
    }
    kern<<<1, 128, QK_SMEM, fl::as_stream(stream)>>>(static_cast<const __half *>(q),
                                                     static_cast<const __half *>(k), s);
    return fl::launch_status();
}

extern "C" fl_status fl_wgmma_probe_pv(const float *p, const void *v, float *o, fl_stream stream) {
    if (!p || !v || !o) return FL_ERR_INVALID_ARGUMENT;
    if (!fl::aligned16(v)) return FL_ERR_MISALIGNED;
    fl::wgmma_probe::pv_kernel<<<1, 128, 0, fl::as_stream(stream)>>>(
        p, static_cast<const __half *>(v), o);
    return fl::launch_status();
}
