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
// Both write NaN everywhere when the device code was not compiled for sm_90a (no wgmma).
#include "common/common.cuh"

namespace fl {
namespace wgmma_probe {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FL_HAVE_WGMMA 1

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Byte offset of 16-byte chunk c (0..7) of row r in a 128B-swizzled region of 128-byte rows
// (Swizzle<3,4,3>: address bits 4-6 ^= bits 7-9); the region must be 1024-byte aligned.
__device__ __forceinline__ uint32_t swz128(int r, int c) {
    return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4));
}
// Shared-memory matrix descriptor: start address, leading / stride byte offsets (>> 4),
// base offset 0 (1024-byte aligned atoms), swizzle mode 1 = 128 bytes (bits 62-63).
__device__ __forceinline__ uint64_t mdesc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Generic-proxy writes to shared memory made visible to the async proxy (wgmma operands).
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// d += A (64 x 16, smem, K-major) * B (16 x 64, smem; K-major when TB = 0, MN-major when 1).
template <int TB>
__device__ __forceinline__ void wgmma_ss_m64n64k16(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, %35;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(accumulate), "n"(TB));
}

// d += A (64 x 16, registers: the m16n8k16 A fragment of each warp's 16 rows) * B (16 x 128,
// smem; K-major when TB = 0, MN-major when 1).
template <int TB>
__device__ __forceinline__ void wgmma_rs_m64n128k16(float (&d)[64], const uint32_t (&a)[4], uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate), "n"(TB));
}

// Copies a [64, 128] f16 row-major tile into shared memory as two 64-column atoms (atom a =
// columns 64a..64a+63 at byte a * 8192), rows 128 bytes, 128B-swizzled. This one layout is
// K-major for Q and K (rows = M / N, columns = k) and MN-major for V (rows = k, columns = N).
__device__ __forceinline__ void load_tile(const __half *__restrict__ g, char *s) {
    for (int i = threadIdx.x; i < 64 * 16; i += blockDim.x) {  // 16-byte chunks
        const int r = i >> 4, c16 = i & 15, a = c16 >> 3, c = c16 & 7;
        const uint4 v = *reinterpret_cast<const uint4 *>(g + r * 128 + c16 * 8);
        *reinterpret_cast<uint4 *>(s + a * 8192 + swz128(r, c)) = v;
    }
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}
#endif

__global__ void __launch_bounds__(128) qk_kernel(const __half *q, const __half *k, float *s) {
#ifdef FL_HAVE_WGMMA
    __shared__ __align__(1024) char sq[16384];
    __shared__ __align__(1024) char sk[16384];
    load_tile(q, sq);
    load_tile(k, sk);
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
        wgmma_ss_m64n64k16<0>(d, mdesc(aq + off, 16, 1024), mdesc(ak + off, 16, 1024), kk > 0);
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
    __shared__ __align__(1024) char sv[16384];
    load_tile(v, sv);
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
        for (int i = 0; i < 4; ++i) a[kk][i] = pack_half2(pa[8 * kk + 2 * i], pa[8 * kk + 2 * i + 1]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        // k-step kk = V rows 16kk..16kk+15: two 8-row groups of 1024 bytes.
        wgmma_rs_m64n128k16<1>(d, a[kk], mdesc(av + (uint32_t)kk * 2048u, 8192, 1024), kk > 0);
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
