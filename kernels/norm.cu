// Row norms: RMSNorm, fused residual-add + RMSNorm, LayerNorm (weight, optional bias), and
// fused add-bias + residual + LayerNorm (BERT's post-LN sublayer end, FasterTransformer's
// addBiasInputLayernorm).
//
// One kernel template serves the three ops (NormKind). Statistics and the normalisation are
// computed in f32; each output is rounded to T once: y = T((v - mean) * rstd * w [+ b]).
// (HF LLaMA's RMSNorm rounds twice, `weight * T(x * rstd)`; the two agree to within one
// rounding of T.)
//
// Paths, chosen per call on the host:
//  - register, warp per row: hidden a multiple of the 16-byte vector width, every pointer
//    16-byte aligned, at most 32 * 4 vectors per row (hidden <= 1024 f16/bf16, <= 512 f32).
//    Each lane holds up to 4 vectors of its row; reductions are warp shuffles only.
//  - register, block per row: the same conditions, up to 1024 * 4 vectors per row
//    (hidden <= 32768 f16/bf16, <= 16384 f32). Each thread holds VPT in {1,2,4} vectors;
//    the row is read once, kept in registers across the block reduction, and written once.
//    Few rows: up to 1024 threads and 1 vector each (latency); many rows: <= 256 threads
//    and more vectors per thread (occupancy).
//  - generic: any hidden, any alignment. Block per row, scalar accesses, the row is read
//    again (from L1/L2) for the write (and for LayerNorm's variance).
// Every element is read and written by the same thread, so y may alias x.
#include <cmath>

#include "common/common.cuh"

namespace fl {

enum class NormKind { Rms, AddRms, Layer, AddLayer };

// LayerNorm statistics and the affine part are shared by Layer and AddLayer.
template <NormKind K> constexpr bool is_layer() { return K == NormKind::Layer || K == NormKind::AddLayer; }

template <typename T> struct NormArgs {
    const T *x;
    T *residual;  // AddRms: read, then overwritten with T(residual + x); AddLayer: read
    const T *w;
    const T *b;   // Layer, AddLayer: may be null
    const T *pb;  // AddLayer: bias added to x before the residual; may be null
    T *y;
    int64_t rows;
    int64_t hidden;
    float eps;
};

// ------------------------------------------------------------------ register kernel
// WARP: one warp per row (rows_per_block = blockDim.x / 32); else one block per row.
// VPT: vectors of vec16<T>() elements per thread.
template <NormKind K, typename T, int VPT, bool WARP>
__global__ void __launch_bounds__(1024) norm_reg_kernel(NormArgs<T> a) {
    constexpr int N = vec16<T>();
    using V = Vec<T, N>;
    __shared__ float scratch[32];
    const int nvec = (int)(a.hidden / N);
    const float inv_h = 1.f / (float)a.hidden;
    int lane, stride;
    int64_t row, row_step;
    if constexpr (WARP) {
        lane = threadIdx.x & 31;
        stride = 32;
        row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
        row_step = (int64_t)gridDim.x * (blockDim.x >> 5);
    } else {
        lane = threadIdx.x;
        stride = blockDim.x;
        row = blockIdx.x;
        row_step = gridDim.x;
    }
    auto reduce = [&](float v) -> float {
        if constexpr (WARP) return warp_sum(v);
        else return block_sum(v, scratch);
    };
    const V *wv = reinterpret_cast<const V *>(a.w);
    const V *bv = reinterpret_cast<const V *>(a.b);
    const V *pbv = reinterpret_cast<const V *>(a.pb);

    for (; row < a.rows; row += row_step) {
        const int64_t off = row * a.hidden;
        const V *xv = reinterpret_cast<const V *>(a.x + off);
        V r[VPT];  // the row (for AddRms: the updated residual), kept between the passes
        float acc = 0.f;
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int i = lane + k * stride;
            if (i < nvec) {
                V xk = xv[i];
                if constexpr (K == NormKind::AddRms) {
                    V *rv = reinterpret_cast<V *>(a.residual + off);
                    V rk = rv[i];
#pragma unroll
                    for (int j = 0; j < N; ++j)
                        r[k].v[j] = from_f32<T>(to_f32(rk.v[j]) + to_f32(xk.v[j]));
                    rv[i] = r[k];
                } else if constexpr (K == NormKind::AddLayer) {
                    const V rk = reinterpret_cast<const V *>(a.residual + off)[i];
                    V pk;
                    if (pbv) pk = pbv[i];
#pragma unroll
                    for (int j = 0; j < N; ++j) {
                        float v = to_f32(xk.v[j]);
                        if (pbv) v += to_f32(pk.v[j]);
                        r[k].v[j] = from_f32<T>(v + to_f32(rk.v[j]));
                    }
                } else {
                    r[k] = xk;
                }
#pragma unroll
                for (int j = 0; j < N; ++j) {
                    const float v = to_f32(r[k].v[j]);
                    acc += is_layer<K>() ? v : v * v;
                }
            }
        }
        float mean = 0.f, rstd;
        if constexpr (is_layer<K>()) {
            mean = reduce(acc) * inv_h;
            float acc2 = 0.f;
#pragma unroll
            for (int k = 0; k < VPT; ++k) {
                if (lane + k * stride < nvec) {
#pragma unroll
                    for (int j = 0; j < N; ++j) {
                        const float d = to_f32(r[k].v[j]) - mean;
                        acc2 += d * d;
                    }
                }
            }
            rstd = rsqrtf(reduce(acc2) * inv_h + a.eps);
        } else {
            rstd = rsqrtf(reduce(acc) * inv_h + a.eps);
        }
        V *yv = reinterpret_cast<V *>(a.y + off);
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int i = lane + k * stride;
            if (i < nvec) {
                const V wk = wv[i];
                V bk;
                if constexpr (is_layer<K>()) {
                    if (bv) bk = bv[i];
                }
                V o;
#pragma unroll
                for (int j = 0; j < N; ++j) {
                    float v = (to_f32(r[k].v[j]) - mean) * rstd * to_f32(wk.v[j]);
                    if constexpr (is_layer<K>()) {
                        if (bv) v += to_f32(bk.v[j]);
                    }
                    o.v[j] = from_f32<T>(v);
                }
                yv[i] = o;
            }
        }
    }
}

// ------------------------------------------------------------------ generic kernel
// Block per row, scalar accesses, any hidden and alignment.
template <NormKind K, typename T> __global__ void norm_generic_kernel(NormArgs<T> a) {
    __shared__ float scratch[32];
    const int64_t h = a.hidden;
    const float inv_h = (float)(1.0 / (double)h);
    for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
        const int64_t off = row * h;
        const T *x = a.x + off;
        T *res = a.residual ? a.residual + off : nullptr;
        // After the first pass the row's values are `val(i)`: x, the updated residual, or
        // (AddLayer) T(x + pb + residual) recomputed from the inputs, which y may alias: each
        // element is read by the thread that writes it, before the write.
        const T *src = (K == NormKind::AddRms) ? res : x;
        auto val = [&](int64_t i) -> float {
            if constexpr (K == NormKind::AddLayer) {
                float v = to_f32(x[i]);
                if (a.pb) v += to_f32(a.pb[i]);
                return to_f32(from_f32<T>(v + to_f32(res[i])));
            } else {
                return to_f32(src[i]);
            }
        };
        float acc = 0.f;
        for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
            float v;
            if constexpr (K == NormKind::AddRms) {
                const T r = from_f32<T>(to_f32(res[i]) + to_f32(x[i]));
                res[i] = r;
                v = to_f32(r);
            } else {
                v = val(i);
            }
            acc += is_layer<K>() ? v : v * v;
        }
        float mean = 0.f, rstd;
        if constexpr (is_layer<K>()) {
            mean = block_sum(acc, scratch) * inv_h;
            float acc2 = 0.f;
            for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
                const float d = val(i) - mean;
                acc2 += d * d;
            }
            rstd = rsqrtf(block_sum(acc2, scratch) * inv_h + a.eps);
        } else {
            rstd = rsqrtf(block_sum(acc, scratch) * inv_h + a.eps);
        }
        T *y = a.y + off;
        for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
            float v = (val(i) - mean) * rstd * to_f32(a.w[i]);
            if constexpr (is_layer<K>()) {
                if (a.b) v += to_f32(a.b[i]);
            }
            y[i] = from_f32<T>(v);
        }
    }
}

// ------------------------------------------------------------------ host dispatch
inline unsigned row_grid(int64_t blocks) {
    const int64_t cap = 65535LL * 32;  // a grid-stride loop covers the rest
    return (unsigned)(blocks < 1 ? 1 : (blocks > cap ? cap : blocks));
}

template <NormKind K, typename T, bool WARP>
fl_status launch_reg(const NormArgs<T> &a, int vpt, unsigned grid, int threads, cudaStream_t s) {
    switch (vpt) {
    case 1: norm_reg_kernel<K, T, 1, WARP><<<grid, threads, 0, s>>>(a); break;
    case 2: norm_reg_kernel<K, T, 2, WARP><<<grid, threads, 0, s>>>(a); break;
    case 4: norm_reg_kernel<K, T, 4, WARP><<<grid, threads, 0, s>>>(a); break;
    default: return FL_ERR_INVALID_ARGUMENT;
    }
    return launch_status();
}

template <NormKind K, typename T> fl_status norm(const NormArgs<T> &a, cudaStream_t s) {
    constexpr int N = vec16<T>();
    const bool vec_ok = a.hidden % N == 0 && aligned16(a.x) && aligned16(a.w) && aligned16(a.y) &&
                        (K != NormKind::AddRms || aligned16(a.residual)) &&
                        (K != NormKind::AddLayer || (aligned16(a.residual) &&
                                                     (a.pb == nullptr || aligned16(a.pb)))) &&
                        (!is_layer<K>() || a.b == nullptr || aligned16(a.b));
    const int64_t nvec = a.hidden / N;
    if (vec_ok && nvec <= 32 * 4) {
        const int vpt = nvec <= 32 ? 1 : (nvec <= 64 ? 2 : 4);
        constexpr int rows_per_block = 4;
        return launch_reg<K, T, true>(a, vpt, row_grid(ceil_div(a.rows, rows_per_block)),
                                      32 * rows_per_block, s);
    }
    if (vec_ok && nvec <= 1024 * 4) {
        // Few rows: spread each row over up to 1024 threads. Many rows: 256 threads per row
        // when 4 vectors each suffice, so that several blocks share an SM and hide each
        // other's reductions. (8 vectors per thread would spill at 1024 threads.)
        const int64_t target = a.rows >= 1024 ? 256 : 1024;
        int vpt = 1;
        while (vpt < 4 && ceil_div(nvec, vpt) > target) vpt *= 2;
        const int threads = (int)(ceil_div(ceil_div(nvec, vpt), 32) * 32);
        return launch_reg<K, T, false>(a, vpt, row_grid(a.rows), threads, s);
    }
    const int64_t want = ceil_div(ceil_div(a.hidden, 8), 32) * 32;
    const int threads = (int)(want < 64 ? 64 : (want > 1024 ? 1024 : want));
    norm_generic_kernel<K, T><<<row_grid(a.rows), threads, 0, s>>>(a);
    return launch_status();
}

template <NormKind K>
fl_status norm_entry(fl_dtype dtype, const void *x, void *residual, const void *w, const void *b,
                     void *y, int64_t rows, int64_t hidden, float eps, fl_stream stream,
                     const void *pb = nullptr) {
    if (rows < 0 || hidden < 1 || !(eps > 0.f) || !std::isfinite(eps)) return FL_ERR_INVALID_ARGUMENT;
    if (rows == 0) return FL_OK;
    if (!x || !w || !y || ((K == NormKind::AddRms || K == NormKind::AddLayer) && !residual))
        return FL_ERR_INVALID_ARGUMENT;
    FL_DISPATCH_FLOAT(dtype, {
        NormArgs<scalar_t> a;
        a.x = static_cast<const scalar_t *>(x);
        a.residual = static_cast<scalar_t *>(residual);
        a.w = static_cast<const scalar_t *>(w);
        a.b = static_cast<const scalar_t *>(b);
        a.pb = static_cast<const scalar_t *>(pb);
        a.y = static_cast<scalar_t *>(y);
        a.rows = rows;
        a.hidden = hidden;
        a.eps = eps;
        return norm<K, scalar_t>(a, as_stream(stream));
    });
    return FL_ERR_UNSUPPORTED_DTYPE;
}

}  // namespace fl

extern "C" fl_status fl_rms_norm(fl_dtype dtype, const void *x, const void *weight, void *y,
                                 int64_t rows, int64_t hidden, float eps, fl_stream stream) {
    return fl::norm_entry<fl::NormKind::Rms>(dtype, x, nullptr, weight, nullptr, y, rows, hidden,
                                             eps, stream);
}

extern "C" fl_status fl_add_rms_norm(fl_dtype dtype, const void *x, void *residual,
                                     const void *weight, void *y, int64_t rows, int64_t hidden,
                                     float eps, fl_stream stream) {
    if (residual != nullptr && (residual == y || residual == x)) return FL_ERR_INVALID_ARGUMENT;
    return fl::norm_entry<fl::NormKind::AddRms>(dtype, x, residual, weight, nullptr, y, rows,
                                                hidden, eps, stream);
}

extern "C" fl_status fl_layer_norm(fl_dtype dtype, const void *x, const void *weight,
                                   const void *bias, void *y, int64_t rows, int64_t hidden,
                                   float eps, fl_stream stream) {
    return fl::norm_entry<fl::NormKind::Layer>(dtype, x, nullptr, weight, bias, y, rows, hidden,
                                               eps, stream);
}

extern "C" fl_status fl_add_bias_layer_norm(fl_dtype dtype, const void *x, const void *x_bias,
                                            const void *residual, const void *weight,
                                            const void *bias, void *y, int64_t rows,
                                            int64_t hidden, float eps, fl_stream stream) {
    // The residual is only read here; the launcher's args keep one mutable pointer type.
    return fl::norm_entry<fl::NormKind::AddLayer>(dtype, x, const_cast<void *>(residual), weight,
                                                  bias, y, rows, hidden, eps, stream, x_bias);
}
