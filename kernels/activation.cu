// Activations: SwiGLU (fused [gate | up] input or two inputs), GELU (tanh or erf form, with
// an optional bias), bias add. Memory-bound: each thread moves one vector of V elements per
// row it visits, V the widest of 16 / sizeof(T), ..., 2, 1 that the row length and every
// pointer allow (so odd sizes and offset pointers stay correct, and even sizes stay fast).
// Launch shape: a 2-D grid, x over the vectors of a row, y over rows (looping past 65535),
// 128 threads per block, split between the two axes when a row holds few vectors.
#include <type_traits>

#include "common/common.cuh"
#include "common/gelu.cuh"

namespace fl {
namespace act {

constexpr int kThreads = 128;

// silu(x) = x / (1 + e^-x). Overflow-safe without a branch: for x << 0, e^-x = inf and
// x / inf = -0; for 2^126 < 1 + e^-x < inf __fdividef gives 0, where the true value is
// below 2^-119 |x|. For x >> 0, e^-x underflows to 0 and silu(x) = x. f32 accuracy:
// __expf's 2 + 1.2|x| ulp and __fdividef's 2 ulp, about 1e-6 relative for |x| < 8.
__device__ __forceinline__ float silu(float x) { return __fdividef(x, 1.f + __expf(-x)); }

enum class Op { BiasOnly, GeluTanh, GeluErf };

template <Op O> __device__ __forceinline__ float apply(float x) {
    if constexpr (O == Op::GeluTanh) return gelu_tanh(x);
    else if constexpr (O == Op::GeluErf) return gelu_erf(x);
    else return x;
}

// out[r, :] = silu(gate[r, :]) * up[r, :]; gate and up rows are `in_stride` elements apart
// (inter for two inputs, 2 * inter for the fused [gate | up] rows), out rows `inter` apart.
// Requires inter % V == 0 and every row start aligned to V elements (checked by the caller).
template <typename T, int V>
__global__ void swiglu_kernel(const T *__restrict__ gate, const T *__restrict__ up,
                              T *__restrict__ out, int64_t rows, int64_t inter,
                              int64_t in_stride) {
    using Vt = Vec<T, V>;
    const int64_t nv = inter / V;
    const int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (c >= nv) return;
    for (int64_t r = blockIdx.y * (int64_t)blockDim.y + threadIdx.y; r < rows;
         r += (int64_t)gridDim.y * blockDim.y) {
        const Vt g = reinterpret_cast<const Vt *>(gate + r * in_stride)[c];
        const Vt u = reinterpret_cast<const Vt *>(up + r * in_stride)[c];
        Vt o;
#pragma unroll
        for (int j = 0; j < V; ++j) o.v[j] = from_f32<T>(silu(to_f32(g.v[j])) * to_f32(u.v[j]));
        reinterpret_cast<Vt *>(out + r * inter)[c] = o;
    }
}

// out[r, c] = op(x[r, c] (+ bias[c])). x and out may be the same buffer (each element is
// read and then written by one thread), hence no __restrict__ on them.
template <typename T, int V, Op O, bool HasBias>
__global__ void bias_act_kernel(const T *x, const T *__restrict__ bias, T *out, int64_t rows,
                                int64_t cols) {
    using Vt = Vec<T, V>;
    const int64_t nv = cols / V;
    const int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (c >= nv) return;
    float b[V];
#pragma unroll
    for (int j = 0; j < V; ++j) b[j] = 0.f;
    if constexpr (HasBias) {
        const Vt bv = reinterpret_cast<const Vt *>(bias)[c];
#pragma unroll
        for (int j = 0; j < V; ++j) b[j] = to_f32(bv.v[j]);
    }
    for (int64_t r = blockIdx.y * (int64_t)blockDim.y + threadIdx.y; r < rows;
         r += (int64_t)gridDim.y * blockDim.y) {
        const int64_t i = r * nv + c;
        const Vt xv = reinterpret_cast<const Vt *>(x)[i];
        Vt o;
#pragma unroll
        for (int j = 0; j < V; ++j) {
            float t = to_f32(xv.v[j]);
            if constexpr (HasBias) t += b[j];
            o.v[j] = from_f32<T>(apply<O>(t));
        }
        reinterpret_cast<Vt *>(out)[i] = o;
    }
}

// The widest V in {16 / sizeof(T), ..., 2, 1} with len % V == 0 and every pointer aligned
// to V elements.
template <typename T> int pick_vec(int64_t len, std::initializer_list<const void *> ptrs) {
    for (int v = vec16<T>(); v > 1; v /= 2) {
        if (len % v != 0) continue;
        bool ok = true;
        for (const void *p : ptrs)
            ok = ok && (reinterpret_cast<uintptr_t>(p) % (uintptr_t)(v * sizeof(T)) == 0);
        if (ok) return v;
    }
    return 1;
}

// Calls f(std::integral_constant<int, V>) for the runtime width v (a value pick_vec<T> gave).
template <typename T, typename F> fl_status with_vec(int v, F &&f) {
    switch (v) {
    case 8:
        if constexpr (vec16<T>() >= 8) return f(std::integral_constant<int, 8>{});
        break;
    case 4: return f(std::integral_constant<int, 4>{});
    case 2: return f(std::integral_constant<int, 2>{});
    default: return f(std::integral_constant<int, 1>{});
    }
    return FL_ERR_INVALID_ARGUMENT;
}

// Grid and block for `rows` rows of `nv` vectors: x over vectors (up to kThreads threads per
// block), y over rows (the rest of the block, and up to 65535 blocks; kernels loop past).
struct RowLaunch {
    dim3 grid, block;
    bool ok;
};
inline RowLaunch row_launch(int64_t rows, int64_t nv) {
    int tx = 1;
    while (tx < nv && tx < kThreads) tx <<= 1;
    const int ty = kThreads / tx;
    const int64_t gx = ceil_div(nv, tx);
    int64_t gy = ceil_div(rows, ty);
    if (gy > 65535) gy = 65535;
    RowLaunch l;
    l.ok = gx <= 0x7fffffffLL;
    l.grid = dim3((unsigned)(l.ok ? gx : 1), (unsigned)gy, 1);
    l.block = dim3((unsigned)tx, (unsigned)ty, 1);
    return l;
}

template <typename T>
fl_status swiglu(const T *gate, const T *up, T *out, int64_t rows, int64_t inter,
                 int64_t in_stride, cudaStream_t s) {
    const int v = pick_vec<T>(inter, {gate, up, out});
    return with_vec<T>(v, [&](auto vc) {
        constexpr int V = decltype(vc)::value;
        const RowLaunch l = row_launch(rows, inter / V);
        if (!l.ok) return (fl_status)FL_ERR_INVALID_ARGUMENT;
        swiglu_kernel<T, V><<<l.grid, l.block, 0, s>>>(gate, up, out, rows, inter, in_stride);
        return launch_status();
    });
}

template <typename T, Op O>
fl_status bias_act(const T *x, const T *bias, T *out, int64_t rows, int64_t cols,
                   cudaStream_t s) {
    // Without a bias the rows are independent of the columns: treat the tensor as one row,
    // so that only the total length decides the vector width.
    if (!bias) {
        cols *= rows;
        rows = 1;
    }
    const int v = bias ? pick_vec<T>(cols, {x, bias, out}) : pick_vec<T>(cols, {x, out});
    return with_vec<T>(v, [&](auto vc) {
        constexpr int V = decltype(vc)::value;
        const RowLaunch l = row_launch(rows, cols / V);
        if (!l.ok) return (fl_status)FL_ERR_INVALID_ARGUMENT;
        if constexpr (O == Op::BiasOnly) {
            bias_act_kernel<T, V, O, true><<<l.grid, l.block, 0, s>>>(x, bias, out, rows, cols);
        } else {
            if (bias)
                bias_act_kernel<T, V, O, true><<<l.grid, l.block, 0, s>>>(x, bias, out, rows,
                                                                          cols);
            else
                bias_act_kernel<T, V, O, false><<<l.grid, l.block, 0, s>>>(x, bias, out, rows,
                                                                           cols);
        }
        return launch_status();
    });
}

// rows, cols >= 0 and rows * cols * mult fits int64_t.
inline bool sizes_ok(int64_t rows, int64_t cols, int64_t mult) {
    if (rows < 0 || cols < 0) return false;
    if (rows == 0 || cols == 0) return true;
    return cols <= INT64_MAX / mult && rows <= INT64_MAX / (cols * mult);
}

}  // namespace act
}  // namespace fl

extern "C" fl_status fl_swiglu(fl_dtype dtype, const void *gate, const void *up, void *out,
                               int64_t rows, int64_t inter, fl_stream stream) {
    if (!fl::act::sizes_ok(rows, inter, 1)) return FL_ERR_INVALID_ARGUMENT;
    if (rows == 0 || inter == 0) return FL_OK;
    if (!gate || !up || !out) return FL_ERR_INVALID_ARGUMENT;
    // Three contiguous tensors of one shape: one row of rows * inter elements (only the total
    // length then limits the vector width).
    const int64_t n = rows * inter;
    FL_DISPATCH_FLOAT(dtype, return fl::act::swiglu<scalar_t>(
                                 static_cast<const scalar_t *>(gate),
                                 static_cast<const scalar_t *>(up), static_cast<scalar_t *>(out),
                                 1, n, n, fl::as_stream(stream)));
    return FL_ERR_UNSUPPORTED_DTYPE;
}

extern "C" fl_status fl_swiglu_fused(fl_dtype dtype, const void *x, void *out, int64_t rows,
                                     int64_t inter, fl_stream stream) {
    if (!fl::act::sizes_ok(rows, inter, 2)) return FL_ERR_INVALID_ARGUMENT;
    if (rows == 0 || inter == 0) return FL_OK;
    if (!x || !out) return FL_ERR_INVALID_ARGUMENT;
    FL_DISPATCH_FLOAT(dtype, {
        const scalar_t *g = static_cast<const scalar_t *>(x);
        return fl::act::swiglu<scalar_t>(g, g + inter, static_cast<scalar_t *>(out), rows, inter,
                                         2 * inter, fl::as_stream(stream));
    });
    return FL_ERR_UNSUPPORTED_DTYPE;
}

extern "C" fl_status fl_gelu(fl_dtype dtype, fl_gelu_kind kind, const void *x, const void *bias,
                             void *out, int64_t rows, int64_t cols, fl_stream stream) {
    if (!fl::act::sizes_ok(rows, cols, 1)) return FL_ERR_INVALID_ARGUMENT;
    if (kind != FL_GELU_TANH && kind != FL_GELU_ERF) return FL_ERR_INVALID_ARGUMENT;
    if (rows == 0 || cols == 0) return FL_OK;
    if (!x || !out) return FL_ERR_INVALID_ARGUMENT;
    using fl::act::Op;
    FL_DISPATCH_FLOAT(dtype, {
        const scalar_t *px = static_cast<const scalar_t *>(x);
        const scalar_t *pb = static_cast<const scalar_t *>(bias);
        scalar_t *po = static_cast<scalar_t *>(out);
        cudaStream_t s = fl::as_stream(stream);
        if (kind == FL_GELU_TANH)
            return fl::act::bias_act<scalar_t, Op::GeluTanh>(px, pb, po, rows, cols, s);
        return fl::act::bias_act<scalar_t, Op::GeluErf>(px, pb, po, rows, cols, s);
    });
    return FL_ERR_UNSUPPORTED_DTYPE;
}

extern "C" fl_status fl_bias_add(fl_dtype dtype, const void *x, const void *bias, void *out,
                                 int64_t rows, int64_t cols, fl_stream stream) {
    if (!fl::act::sizes_ok(rows, cols, 1)) return FL_ERR_INVALID_ARGUMENT;
    if (rows == 0 || cols == 0) return FL_OK;
    if (!x || !bias || !out) return FL_ERR_INVALID_ARGUMENT;
    FL_DISPATCH_FLOAT(dtype, return fl::act::bias_act<scalar_t, fl::act::Op::BiasOnly>(
                                 static_cast<const scalar_t *>(x),
                                 static_cast<const scalar_t *>(bias),
                                 static_cast<scalar_t *>(out), rows, cols,
                                 fl::as_stream(stream)));
    return FL_ERR_UNSUPPORTED_DTYPE;
}
