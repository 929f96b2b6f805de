// Elementwise ops: add, cast; and prefetch_l2 (a hint that warms the L2 with a buffer). Memory-bound;
// 16-byte vector accesses when every pointer is 16-byte aligned, a scalar grid-stride loop otherwise.
#include "common/common.cuh"

namespace fl {

template <typename T, int N>
__global__ void add_vec_kernel(const T *__restrict__ a, const T *__restrict__ b,
                               T *__restrict__ out, int64_t nvec) {
    using V = Vec<T, N>;
    const V *va = reinterpret_cast<const V *>(a);
    const V *vb = reinterpret_cast<const V *>(b);
    V *vo = reinterpret_cast<V *>(out);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nvec;
         i += (int64_t)gridDim.x * blockDim.x) {
        V x = va[i], y = vb[i], r;
#pragma unroll
        for (int j = 0; j < N; ++j) r.v[j] = from_f32<T>(to_f32(x.v[j]) + to_f32(y.v[j]));
        vo[i] = r;
    }
}

template <typename T>
__global__ void add_scalar_kernel(const T *__restrict__ a, const T *__restrict__ b,
                                  T *__restrict__ out, int64_t start, int64_t n) {
    for (int64_t i = start + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = from_f32<T>(to_f32(a[i]) + to_f32(b[i]));
}

template <typename T>
fl_status add(const T *a, const T *b, T *out, int64_t n, cudaStream_t s) {
    constexpr int N = vec16<T>();
    constexpr int threads = 256;
    int64_t nvec = 0;
    if (aligned16(a) && aligned16(b) && aligned16(out)) {
        nvec = n / N;
        if (nvec > 0) add_vec_kernel<T, N><<<grid_for(nvec, threads), threads, 0, s>>>(a, b, out, nvec);
    }
    const int64_t done = nvec * N;
    if (done < n) add_scalar_kernel<T><<<grid_for(n - done, threads), threads, 0, s>>>(a, b, out, done, n);
    return launch_status();
}

template <typename S, typename D, int N>
__global__ void cast_vec_kernel(const S *__restrict__ src, D *__restrict__ dst, int64_t nvec) {
    using VS = Vec<S, N>;
    using VD = Vec<D, N>;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nvec;
         i += (int64_t)gridDim.x * blockDim.x) {
        VS x = reinterpret_cast<const VS *>(src)[i];
        VD r;
#pragma unroll
        for (int j = 0; j < N; ++j) r.v[j] = from_f32<D>(to_f32(x.v[j]));
        reinterpret_cast<VD *>(dst)[i] = r;
    }
}

template <typename S, typename D>
__global__ void cast_scalar_kernel(const S *__restrict__ src, D *__restrict__ dst, int64_t start,
                                   int64_t n) {
    for (int64_t i = start + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = from_f32<D>(to_f32(src[i]));
}

template <typename S, typename D>
fl_status cast(const S *src, D *dst, int64_t n, cudaStream_t s) {
    // 8 elements per access: 16 bytes of a 2-byte type, 32 of f32 (two 16-byte accesses).
    constexpr int N = 8;
    constexpr int threads = 256;
    int64_t nvec = 0;
    if (aligned16(src) && aligned16(dst)) {
        nvec = n / N;
        if (nvec > 0) cast_vec_kernel<S, D, N><<<grid_for(nvec, threads), threads, 0, s>>>(src, dst, nvec);
    }
    const int64_t done = nvec * N;
    if (done < n) cast_scalar_kernel<S, D><<<grid_for(n - done, threads), threads, 0, s>>>(src, dst, done, n);
    return launch_status();
}

}  // namespace fl


// ---------------------------------------------------------------- L2 prefetch
namespace fl {
// Bytes per prefetch request: one cp.async.bulk.prefetch (sm_90+) or 128 line prefetches.
constexpr int64_t kPrefetchChunk = 16384;

// Thread c of the grid asks the L2 for chunks c, c + threads, ... of [p, p + bytes) (bytes a
// multiple of 16, p 16-byte aligned). Fire and forget: nothing is waited for, no register or
// shared memory receives data, so the kernel ends as soon as the requests are issued and the
// L2 fills while the kernels after it run.
__global__ void prefetch_l2_kernel(const char *__restrict__ p, int64_t bytes) {
    const int64_t threads = (int64_t)gridDim.x * blockDim.x;
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c * kPrefetchChunk < bytes;
         c += threads) {
        const int64_t off = c * kPrefetchChunk;
        const int64_t len = bytes - off < kPrefetchChunk ? bytes - off : kPrefetchChunk;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"((uint32_t)len)
                     : "memory");
#else
        for (int64_t i = 0; i < len; i += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off + i));
#endif
    }
}

fl_status prefetch_l2(const void *p, int64_t bytes, cudaStream_t s) {
    const int64_t chunks = ceil_div(bytes, kPrefetchChunk);
    const int threads = 128;
    const int64_t blocks = ceil_div(chunks, (int64_t)threads);
    const int64_t cap = 4 * (int64_t)sm_count();
    prefetch_l2_kernel<<<(unsigned)(blocks < cap ? blocks : cap), threads, 0, s>>>(
        static_cast<const char *>(p), bytes);
    return launch_status();
}
}  // namespace fl

extern "C" fl_status fl_add(fl_dtype dtype, const void *a, const void *b, void *out, int64_t n,
                            fl_stream stream) {
    if (n < 0 || (n > 0 && (!a || !b || !out))) return FL_ERR_INVALID_ARGUMENT;
    if (n == 0) return FL_OK;
    FL_DISPATCH_FLOAT(dtype, return fl::add<scalar_t>(static_cast<const scalar_t *>(a),
                                                      static_cast<const scalar_t *>(b),
                                                      static_cast<scalar_t *>(out), n,
                                                      fl::as_stream(stream)));
    return FL_ERR_UNSUPPORTED_DTYPE;
}

extern "C" fl_status fl_cast(fl_dtype src_dtype, const void *src, fl_dtype dst_dtype, void *dst,
                             int64_t n, fl_stream stream) {
    if (n < 0 || (n > 0 && (!src || !dst))) return FL_ERR_INVALID_ARGUMENT;
    if (n == 0) return FL_OK;
    FL_DISPATCH_FLOAT(src_dtype, {
        using src_t = scalar_t;
        FL_DISPATCH_FLOAT(dst_dtype, return fl::cast<src_t, scalar_t>(
                                         static_cast<const src_t *>(src),
                                         static_cast<scalar_t *>(dst), n, fl::as_stream(stream)));
    });
    return FL_ERR_UNSUPPORTED_DTYPE;
}

extern "C" fl_status fl_prefetch_l2(const void *p, int64_t bytes, fl_stream stream) {
    if (bytes < 0 || (bytes > 0 && !p)) return FL_ERR_INVALID_ARGUMENT;
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return FL_ERR_MISALIGNED;
    bytes &= ~(int64_t)15;  // whole 16-byte units (a hint: the last < 16 bytes are left out)
    if (bytes == 0) return FL_OK;
    return fl::prefetch_l2(p, bytes, fl::as_stream(stream));
}
