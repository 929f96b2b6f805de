// Building blocks of a Hopper (sm_90a) prefill attention, each checked on its own before the
// kernel that combines them is written (issue 6: the mma.sync kernel reaches 0.42-0.54x of
// cuDNN; wgmma is the way). One warpgroup (128 threads), one CTA:
//
//   fl_wgmma_probe_qk: S = Q K^T, Q [64, 128] and K [64, 128] f16 row-major (head_dim 128),
//     both in shared memory in the 128-byte-swizzled K-major layout, 8 x wgmma.m64n64k16
//     (SS: both operands from shared memory through matrix descriptors); S [64, 64] f32 is
//     written from the accumulator fragments. Checks: the descriptor fields (start address,
//     stride byte offset 1024 between 8-row groups, 128B swizzle mode), the k-step inside a
//     swizzled 128-byte row (+32 bytes), the jump between the two 64-column atoms, and the
//     accumulator layout (warp w: rows 16w..16w+15; lane g = lane / 4, t = lane % 4:
//     d[4j + {0,1}] = (16w + g, 8j + 2t + {0,1}), d[4j + {2,3}] = (16w + g + 8, same)).
//   fl_wgmma_probe_pv: O = P V, P [64, 64] f32 read into registers in that accumulator layout
//     (as S leaves them), converted to f16 A fragments (k-step kk: a0 = d[8kk + {0,1}],
//     a1 = d[8kk + {2,3}], a2 = d[8kk + {4,5}], a3 = d[8kk + {6,7}]), V [64, 128] f16 row-major
//     in shared memory MN-major (d contiguous; two 64-column atoms 8 KB apart = the leading
//     byte offset, 8-row groups 1 KB apart = the stride byte offset), 4 x wgmma.m64n128k16
//     (RS, transposed B). Writes O [64, 128] f32.
//
// The tiles are loaded, and the wgmmas issued, by the very helpers of common/wgmma.cuh that
// the prefill kernel (attention_prefill_wgmma.cu) uses. Both write NaN everywhere when the
// device code was not compiled for sm_90a (no wgmma).
#include "common/common.cuh"
#include "common/wgmma.cuh"

namespace fl {
namespace wgmma_probe {

__global__ void __launch_bounds__(128) qk_kernel(const __half *q, const __half *k, float *s) {
#ifdef FL_HAVE_WGMMA
    using namespace fl::wg;
    __shared__ __align__(1024) char sq[16384];
    __shared__ __align__(1024) char sk[16384];
    load_rows<128>(smem_addr(sq), q, 128, 0, 64, threadIdx.x);
    load_rows<128>(smem_addr(sk), k, 128, 0, 64, threadIdx.x);
    cp_async_commit();
    cp_async_wait<0>();
    fence_async_smem();
    __syncthreads();
    float d[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) d[i] = 0.f;
    const uint32_t aq = smem_addr(sq), ak = smem_addr(sk);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
        const uint32_t off = (uint32_t)((kk >> 2) * 8192 + (kk & 3) * 32);
        Wg<__half>::ss_m64n64k16(d, mdesc(aq + off, 16, 1024), mdesc(ak + off, 16, 1024), kk);
    }
    wgmma_commit();
    wgmma_wait0();
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int r = 16 * w + g, c = 8 * j + 2 * t;
        s[r * 64 + c] = d[4 * j];
        s[r * 64 + c + 1] = d[4 * j + 1];
        s[(r + 8) * 64 + c] = d[4 * j + 2];
        s[(r + 8) * 64 + c + 1] = d[4 * j + 3];
    }
#else
    for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) s[i] = __int_as_float(0x7fc00000);
#endif
}

__global__ void __launch_bounds__(128) pv_kernel(const float *p, const __half *v, float *o) {
#ifdef FL_HAVE_WGMMA
    using namespace fl::wg;
    __shared__ __align__(1024) char sv[16384];
    load_rows<128>(smem_addr(sv), v, 128, 0, 64, threadIdx.x);
    cp_async_commit();
    cp_async_wait<0>();
    fence_async_smem();
    __syncthreads();
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    // P in the accumulator layout of a m64n64 wgmma (as the S = Q K^T product leaves it).
    float pa[32];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int r = 16 * w + g, c = 8 * j + 2 * t;
        pa[4 * j] = p[r * 64 + c];
        pa[4 * j + 1] = p[r * 64 + c + 1];
        pa[4 * j + 2] = p[(r + 8) * 64 + c];
        pa[4 * j + 3] = p[(r + 8) * 64 + c + 1];
    }
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.f;
    const uint32_t av = smem_addr(sv);
    uint32_t a[4][4];  // A fragments of the 4 k-steps, formed before the wgmmas read them
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i) a[kk][i] = Wg<__half>::pack(pa[8 * kk + 2 * i], pa[8 * kk + 2 * i + 1]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        // k-step kk = V rows 16kk..16kk+15: two 8-row groups of 1024 bytes.
        Wg<__half>::rs_m64n128k16_tb(d, a[kk], mdesc(av + (uint32_t)kk * 2048u, 8192, 1024));
    }
    wgmma_commit();
    wgmma_wait0();
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const int r = 16 * w + g, c = 8 * j + 2 * t;
        o[r * 128 + c] = d[4 * j];
        o[r * 128 + c + 1] = d[4 * j + 1];
        o[(r + 8) * 128 + c] = d[4 * j + 2];
        o[(r + 8) * 128 + c + 1] = d[4 * j + 3];
    }
#else
    for (int i = threadIdx.x; i < 64 * 128; i += blockDim.x) o[i] = __int_as_float(0x7fc00000);
#endif
}

}  // namespace wgmma_probe
}  // namespace fl

extern "C" fl_status fl_wgmma_probe_qk(const void *q, const void *k, float *s, fl_stream stream) {
    if (!q || !k || !s) return FL_ERR_INVALID_ARGUMENT;
    if (!fl::aligned16(q) || !fl::aligned16(k)) return FL_ERR_MISALIGNED;
    fl::wgmma_probe::qk_kernel<<<1, 128, 0, fl::as_stream(stream)>>>(
        static_cast<const __half *>(q), static_cast<const __half *>(k), s);
    return fl::launch_status();
}

extern "C" fl_status fl_wgmma_probe_pv(const float *p, const void *v, float *o, fl_stream stream) {
    if (!p || !v || !o) return FL_ERR_INVALID_ARGUMENT;
    if (!fl::aligned16(v)) return FL_ERR_MISALIGNED;
    fl::wgmma_probe::pv_kernel<<<1, 128, 0, fl::as_stream(stream)>>>(
        p, static_cast<const __half *>(v), o);
    return fl::launch_status();
}
