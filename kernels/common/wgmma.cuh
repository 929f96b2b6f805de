// Hopper (sm_90a) warpgroup-MMA helpers shared by the wgmma prefill attention
// (attention_prefill_wgmma.cu) and the probes that test these very pieces (wgmma_probe.cu):
// shared-memory matrix descriptors of 128-byte-swizzled tiles, the wgmma shapes the attention
// uses (f16 and bf16), cp.async tile loads (the probes), mbarriers and TMA loads (the kernel). Everything is defined only when compiling for
// sm_90a (FL_HAVE_WGMMA); the including kernels write NaN or nothing on other targets.
#pragma once
#include "common.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FL_HAVE_WGMMA 1

namespace fl {
namespace wg {

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// cp_async16 / cp_async_commit / cp_async_wait: common.cuh's.
// Byte offset of 16-byte chunk c (0..7) of row r in a 128B-swizzled region of 128-byte rows.
__device__ __forceinline__ uint32_t swz128(int r, int c) {
    return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4));
}
// Shared-memory matrix descriptor (128-byte swizzle, base offset 0: atoms 1024-byte aligned).
__device__ __forceinline__ uint64_t mdesc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

template <typename T> struct Wg {
    // d (64 x 128) (+)= A (64 x 16, smem K-major) B (16 x 128, smem K-major); acc = 0: d = A B.
    static __device__ void ss_m64n128k16(float (&d)[64], uint64_t da, uint64_t db, int acc);
    // d (64 x 128) += A (64 x 16, registers) B (16 x 128, smem MN-major).
    static __device__ void rs_m64n128k16_tb(float (&d)[64], const uint32_t (&a)[4], uint64_t db);
    static __device__ uint32_t pack(float lo, float hi);
};
template <> __device__ __forceinline__ uint32_t Wg<__half>::pack(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}
template <> __device__ __forceinline__ uint32_t Wg<__nv_bfloat16>::pack(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}
// The asm for one 16-bit type: T its C++ type, TY its wgmma type suffix ("f16" or "bf16");
// the two specialisations differ in nothing else. FL_WG_D64 is the 64-register accumulator
// operand list (one "+f" per register), FL_WG_D64_OPS its placeholders %0..%63.
#define FL_WG_D64_OPS "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define FL_WG_D64 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define FL_WG_SPECIALISE(T, TY)                                                                                 \
template <>                                                                                                     \
__device__ __forceinline__ void Wg<T>::ss_m64n128k16(float (&d)[64], uint64_t da, uint64_t db, int acc) {       \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                   \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {" FL_WG_D64_OPS                    \
                 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"                                                             \
                 : FL_WG_D64                                                                                    \
                 : "l"(da), "l"(db), "r"(acc));                                                                 \
}                                                                                                               \
template <>                                                                                                     \
__device__ __forceinline__ void Wg<T>::rs_m64n128k16_tb(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                     \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {" FL_WG_D64_OPS                    \
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                               \
                 : FL_WG_D64                                                                                    \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));                                        \
}
FL_WG_SPECIALISE(__half, "f16")
FL_WG_SPECIALISE(__nv_bfloat16, "bf16")
#undef FL_WG_SPECIALISE
#undef FL_WG_D64
#undef FL_WG_D64_OPS

// Pins accumulator registers between a wgmma's issue and its wait: without it the compiler
// may move ordinary reads or writes of them across the (opaque) wait.
template <int N> __device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// Waits until at most N committed wgmma groups of this warp are still in flight.
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Copies rows row0..row0+ROWS-1 of a [*, 128] matrix (row stride gstride elements; rows >= len
// zero-filled) into `s` as two 64-column atoms ROWS x 128 bytes apart, 128-byte rows,
// 128B-swizzled: K-major for Q and K, MN-major for V. cp.async by NTH threads (tid < NTH); the
// caller commits, waits, then fences the copies to the async proxy (fence_async_smem) and
// synchronises.
template <int NTH, typename T, int ROWS = 64>
__device__ __forceinline__ void load_rows(uint32_t s, const T *g, int64_t gstride, int row0,
                                          int len, int tid) {
#pragma unroll 4
    for (int i = tid; i < ROWS * 16; i += NTH) {
        const int r = i >> 4, c16 = i & 15;
        const int row = row0 + r;
        const bool ok = row < len;
        const T *src = g + (int64_t)(ok ? row : 0) * gstride + c16 * 8;
        cp_async16(s + (uint32_t)((c16 >> 3) * (ROWS * 128)) + swz128(r, c16 & 7), src, ok ? 16 : 0);
    }
}

// --- TMA (cp.async.bulk.tensor); the mbarriers are common.cuh's (mbar_init, ...) ---------------
// TMA: the box at element coordinates (c0, c1, c2) of the 3-d tensor `map` describes, into
// shared memory at `dst`; completion is counted in bytes on `bar`. `map` is the address of a
// __grid_constant__ kernel parameter.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void *map, uint32_t bar, int c0, int c1, int c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(dst),
        "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}
// 2^x on the special-function unit, flushing denormal results to zero: one MUFU.EX2, where
// exp2f adds range fix-ups around it.
__device__ __forceinline__ float ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

}  // namespace wg
}  // namespace fl
#endif  // sm_90a
