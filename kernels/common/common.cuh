// Shared device code: dtype traits, vector loads, reductions, launch helpers.
// Every kernels/*.cu includes this; no helper lives in two .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

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
    __device__ __forceinline__ static float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
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

}  // namespace fl

// Dispatch on a float dtype: runs BODY with `scalar_t` bound to the C++ type.
#define FL_DISPATCH_FLOAT(DTYPE, ...)                                                          \
    switch (DTYPE) {                                                                           \
    case FL_DTYPE_F32: { using scalar_t = float; __VA_ARGS__; break; }                         \
    case FL_DTYPE_F16: { using scalar_t = __half; __VA_ARGS__; break; }                        \
    case FL_DTYPE_BF16: { using scalar_t = __nv_bfloat16; __VA_ARGS__; break; }                \
    default: return FL_ERR_UNSUPPORTED_DTYPE;                                                  \
    }
