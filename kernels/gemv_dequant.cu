// Dequantise a whole quantised weight into a dense matrix (fl_gemv_dequantize): the prefill
// path, where past FL_GEMV_MAX_M tokens the weight is dequantised once into a dense buffer and
// a tensor-core GEMM reads it. One thread per unit (16 int8 values, 32 int4 values, one
// 32-value GGUF block); units never straddle rows (k is a multiple of 32). The per-unit code is
// __host__ __device__: fl_gemv_dequantize_host runs the very same code on the CPU for the CPU
// tests. The K-quants (64-value units of 256-value super-blocks) are gemv_kquant.cu's.
#include "gemv_kquant.cuh"
#include "gemv_unpack.cuh"

namespace fl {
namespace gemv {
namespace {

// The 16 bytes at p (16-byte aligned on the device: int8 and int4 units).
__host__ __device__ __forceinline__ void load_unit16(const uint8_t *p, uint8_t (&b)[16]) {
#ifdef __CUDA_ARCH__
    const uint4 v = __ldg(reinterpret_cast<const uint4 *>(p));
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 16; ++i) b[i] = (uint8_t)(w[i / 4] >> (8 * (i % 4)));
#else
    std::memcpy(b, p, 16);
#endif
}

// NB bytes at p, which is only 2-byte aligned (GGUF blocks): 16-bit loads on the device.
template <int NB>
__host__ __device__ __forceinline__ void load_unit_a2(const uint8_t *p, uint8_t (&b)[NB]) {
    static_assert(NB % 2 == 0, "GGUF blocks have an even size");
#ifdef __CUDA_ARCH__
    const unsigned short *h = reinterpret_cast<const unsigned short *>(p);
#pragma unroll
    for (int i = 0; i < NB / 2; ++i) {
        const unsigned short v = __ldg(h + i);
        b[2 * i] = (uint8_t)(v & 0xff);
        b[2 * i + 1] = (uint8_t)(v >> 8);
    }
#else
    std::memcpy(b, p, NB);
#endif
}

// The f16 with the little-endian bytes lo, hi, as f32 (host and device).
__host__ __device__ __forceinline__ float f16_bytes(uint8_t lo, uint8_t hi) {
    __half_raw r;
    r.x = (unsigned short)(lo | (hi << 8));
    return __half2float(__half(r));
}

// The values of unit u (row-major over the whole [n, k] weight) as f32, in value order:
// INT8 q * scale[row] (one rounded f32 product); INT4 (nib - zero) * scale[group], Q8_0
// d * qs, Q4_0 d * (nib - 8) (exact: a small integer times an f16).
template <int F>
__host__ __device__ __forceinline__ void dequant_unit(const uint8_t *w, const void *scales,
                                                      const uint8_t *zeros, int group, int64_t k,
                                                      int64_t u, float (&f)[unit_values(F)]) {
    constexpr int UV = unit_values(F), UB = unit_bytes(F);
    const int64_t per_row = k / UV;
    const int64_t row = u / per_row;
    const uint8_t *p = w + u * UB;
    if constexpr (F == I8) {
        uint8_t b[16];
        load_unit16(p, b);
        const float s = static_cast<const float *>(scales)[row];
#pragma unroll
        for (int e = 0; e < 16; ++e) f[e] = (float)(int8_t)b[e] * s;
    } else if constexpr (F == I4 || F == I4Z) {
        uint8_t b[16];
        load_unit16(p, b);
        const int64_t j0 = (u - row * per_row) * UV;
        const int64_t g = row * (k / group) + j0 / group;
        const float s = __half2float(static_cast<const __half *>(scales)[g]);
        const float z = F == I4Z ? (float)zeros[g] : 8.f;
#pragma unroll
        for (int e = 0; e < 32; ++e) f[e] = ((float)((b[e / 2] >> (4 * (e % 2))) & 15) - z) * s;
    } else if constexpr (F == Q80) {
        uint8_t b[34];
        load_unit_a2<34>(p, b);
        const float d = f16_bytes(b[0], b[1]);
#pragma unroll
        for (int e = 0; e < 32; ++e) f[e] = d * (float)(int8_t)b[2 + e];
    } else {
        uint8_t b[18];
        load_unit_a2<18>(p, b);
        const float d = f16_bytes(b[0], b[1]);
#pragma unroll
        for (int e = 0; e < 16; ++e) {
            f[e] = d * (float)((int)(b[2 + e] & 15) - 8);
            f[e + 16] = d * (float)((int)(b[2 + e] >> 4) - 8);
        }
    }
}

}  // namespace

// out [n, k] = T(W) (with a row map: T(W[rows]), RowMap): grid-stride over the n * k / UV
// output units; 16-byte stores.
template <int F, typename T>
__global__ void __launch_bounds__(256)
gemv_dequantize_kernel(const uint8_t *__restrict__ w, const void *__restrict__ scales,
                       const uint8_t *__restrict__ zeros, int group, T *__restrict__ out, int64_t units,
                       int64_t k, RowMap map) {
    constexpr int UV = unit_values(F), VW = 16 / (int)sizeof(T);
    using V = Vec<T, VW>;
    const int64_t per_row = k / UV;
    for (int64_t u = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; u < units;
         u += (int64_t)gridDim.x * blockDim.x) {
        float f[UV];
        int64_t src = u;  // W's unit
        if (map.rows) {
            const int64_t r = u / per_row, j = u - r * per_row;
            const int64_t row = map_row(map, r, j == 0);
            src = row >= 0 ? row * per_row + j : -1;
        }
        if (src >= 0) {
            dequant_unit<F>(w, scales, zeros, group, k, src, f);
        } else {  // an id outside the table: a zero row
#pragma unroll
            for (int e = 0; e < UV; ++e) f[e] = 0.f;
        }
        V *o = reinterpret_cast<V *>(out + u * UV);
#pragma unroll
        for (int c = 0; c < UV / VW; ++c) {
            V v;
#pragma unroll
            for (int e = 0; e < VW; ++e) v.v[e] = from_f32<T>(f[c * VW + e]);
            o[c] = v;
        }
    }
}

namespace {

template <int F, typename T>
fl_status dequant_launch(const void *w, const void *scales, const void *zeros, int group, void *out,
                         int64_t n, int64_t k, cudaStream_t s, const RowMap &map) {
    constexpr int threads = 256;
    const int64_t units = n * (k / unit_values(F));
    gemv_dequantize_kernel<F, T><<<grid_for(units, threads), threads, 0, s>>>(
        static_cast<const uint8_t *>(w), scales, static_cast<const uint8_t *>(zeros), group,
        static_cast<T *>(out), units, k, map);
    return launch_status();
}

template <typename T>
fl_status dequant_dispatch(fl_gemv_format format, const void *w, const void *scales,
                           const void *zeros, int group, void *out, int64_t n, int64_t k,
                           cudaStream_t s, const RowMap &map) {
    switch (format) {
    case FL_GEMV_INT8: return dequant_launch<I8, T>(w, scales, zeros, group, out, n, k, s, map);
    case FL_GEMV_INT4: return dequant_launch<I4, T>(w, scales, zeros, group, out, n, k, s, map);
    case FL_GEMV_INT4_ZP: return dequant_launch<I4Z, T>(w, scales, zeros, group, out, n, k, s, map);
    case FL_GEMV_Q8_0: return dequant_launch<Q80, T>(w, scales, zeros, group, out, n, k, s, map);
    case FL_GEMV_Q4_0: return dequant_launch<Q40, T>(w, scales, zeros, group, out, n, k, s, map);
    }
    return FL_ERR_INVALID_ARGUMENT;
}

template <int F>
void dequant_host(const void *w, const void *scales, const void *zeros, int group, float *out,
                  int64_t n, int64_t k) {
    constexpr int UV = unit_values(F);
    const int64_t units = n * (k / UV);
    for (int64_t u = 0; u < units; ++u) {
        float f[UV];
        dequant_unit<F>(static_cast<const uint8_t *>(w), scales, static_cast<const uint8_t *>(zeros),
                        group, k, u, f);
        std::memcpy(out + u * UV, f, sizeof(f));
    }
}

// out [n, k] = W[ids] on the host (fl_gemv_embedding_host): the kernels' own per-unit code for
// each valid id, a zero row for the others.
template <int F>
void embedding_host(const int32_t *ids, int64_t n, const void *w, const void *scales,
                    const void *zeros, int group, int64_t vocab, float *out, int64_t k) {
    constexpr int UV = unit_values(F);
    const int64_t per_row = k / UV;
    for (int64_t r = 0; r < n; ++r) {
        float *o = out + r * k;
        if (ids[r] < 0 || ids[r] >= vocab) {
            std::memset(o, 0, sizeof(float) * k);
            continue;
        }
        for (int64_t j = 0; j < per_row; ++j) {
            float f[UV];
            dequant_unit<F>(static_cast<const uint8_t *>(w), scales,
                            static_cast<const uint8_t *>(zeros), group, k, ids[r] * per_row + j, f);
            std::memcpy(o + j * UV, f, sizeof(f));
        }
    }
}

// Argument checks shared by fl_gemv_dequantize and its host twin (dtype and alignment aside).
inline fl_status dequant_check(fl_gemv_format format, const void *w, const void *scales,
                               const void *zeros, int32_t group_size, const void *out, int64_t n,
                               int64_t k) {
    if (n < 0 || k <= 0 || k % 32 != 0) return FL_ERR_INVALID_ARGUMENT;
    if (is_kquant(format) && k % 256 != 0) return FL_ERR_INVALID_ARGUMENT;
    const bool int4 = format == FL_GEMV_INT4 || format == FL_GEMV_INT4_ZP;
    if (int4 && ((group_size != 32 && group_size != 64 && group_size != 128) || k % group_size != 0))
        return FL_ERR_INVALID_ARGUMENT;
    if (fl_gemv_weight_bytes(format, n, k) < 0 || (n > 0 && k > INT64_MAX / n))
        return FL_ERR_INVALID_ARGUMENT;
    if (n == 0) return FL_OK;
    const bool need_scales = format == FL_GEMV_INT8 || int4;
    if (!w || !out || (need_scales && !scales) || (format == FL_GEMV_INT4_ZP && !zeros))
        return FL_ERR_INVALID_ARGUMENT;
    return FL_OK;
}

// The alignment the dequantisation kernels need (fl_gemv_dequantize and fl_gemv_embedding): w
// and out 16-byte, int8's f32 scales 4-byte, int4's f16 scales 2-byte.
inline fl_status dequant_aligned(fl_gemv_format format, const void *w, const void *scales,
                                 const void *out) {
    if (!aligned16(w) || !aligned16(out)) return FL_ERR_MISALIGNED;
    const uintptr_t sc = reinterpret_cast<uintptr_t>(scales);
    if (format == FL_GEMV_INT8 && (sc & 3u) != 0) return FL_ERR_MISALIGNED;
    if ((format == FL_GEMV_INT4 || format == FL_GEMV_INT4_ZP) && (sc & 1u) != 0)
        return FL_ERR_MISALIGNED;
    return FL_OK;
}

// Launches the dequantisation of checked arguments: out [n, k] = dtype(W) under `map` (the
// K-quants through gemv_kquant.cu).
inline fl_status dequant_launch_checked(fl_dtype dtype, fl_gemv_format format, const void *w,
                                        const void *scales, const void *zeros, int group,
                                        void *out, int64_t n, int64_t k, cudaStream_t s,
                                        const RowMap &map) {
    if (is_kquant(format)) return launch_kquant_dequantize(dtype, format, w, out, n, k, s, map);
    FL_DISPATCH_FLOAT(dtype, return dequant_dispatch<scalar_t>(format, w, scales, zeros, group,
                                                                out, n, k, s, map));
    return FL_ERR_UNSUPPORTED_DTYPE;
}

}  // namespace
}  // namespace gemv
}  // namespace fl

extern "C" fl_status fl_gemv_dequantize(fl_dtype dtype, fl_gemv_format format, const void *w,
                                        const void *scales, const void *zeros, int32_t group_size,
                                        void *out, int64_t n, int64_t k, fl_stream stream) {
    using namespace fl;
    const fl_status st = gemv::dequant_check(format, w, scales, zeros, group_size, out, n, k);
    if (st != FL_OK) return st;
    if (dtype != FL_DTYPE_F32 && dtype != FL_DTYPE_F16 && dtype != FL_DTYPE_BF16)
        return FL_ERR_UNSUPPORTED_DTYPE;
    if (n == 0) return FL_OK;
    const fl_status al = gemv::dequant_aligned(format, w, scales, out);
    if (al != FL_OK) return al;
    return gemv::dequant_launch_checked(dtype, format, w, scales, zeros, group_size, out, n, k,
                                        as_stream(stream), gemv::RowMap{});
}

namespace fl {
namespace gemv {
namespace {
// fl_gemv_embedding's checks beyond the table's own (dequant_check over [vocab, hidden]).
inline fl_status embedding_check(const int32_t *ids, int64_t n, int64_t vocab, int64_t hidden,
                                 const void *out) {
    if (n < 0 || n > INT32_MAX || vocab < 0) return FL_ERR_INVALID_ARGUMENT;
    if (n > 0 && (!ids || !out || hidden > INT64_MAX / n)) return FL_ERR_INVALID_ARGUMENT;
    return FL_OK;
}
}  // namespace
}  // namespace gemv
}  // namespace fl

extern "C" fl_status fl_gemv_embedding(fl_dtype dtype, fl_gemv_format format, const int32_t *ids,
                                       int64_t n, const void *w, const void *scales,
                                       const void *zeros, int32_t group_size, int64_t vocab,
                                       int64_t hidden, void *out, int32_t *status,
                                       uint32_t status_nonce, fl_stream stream) {
    using namespace fl;
    fl_status st = gemv::embedding_check(ids, n, vocab, hidden, out);
    if (st != FL_OK) return st;
    // The table: [vocab, hidden] in `format` (a table of 0 rows is never read).
    st = gemv::dequant_check(format, w, scales, zeros, group_size, out, vocab, hidden);
    if (st != FL_OK) return st;
    if (status && status_nonce == 0) return FL_ERR_INVALID_ARGUMENT;
    if (dtype != FL_DTYPE_F32 && dtype != FL_DTYPE_F16 && dtype != FL_DTYPE_BF16)
        return FL_ERR_UNSUPPORTED_DTYPE;
    if (n == 0) return FL_OK;
    if (status && (reinterpret_cast<uintptr_t>(status) & 7u)) return FL_ERR_MISALIGNED;
    st = gemv::dequant_aligned(format, w, scales, out);
    if (st != FL_OK) return st;
    return gemv::dequant_launch_checked(dtype, format, w, scales, zeros, group_size, out, n,
                                        hidden, as_stream(stream),
                                        gemv::RowMap{ids, vocab, status, status_nonce});
}

extern "C" fl_status fl_gemv_embedding_host(fl_gemv_format format, const int32_t *ids, int64_t n,
                                            const void *w, const void *scales, const void *zeros,
                                            int32_t group_size, int64_t vocab, int64_t hidden,
                                            float *out) {
    using namespace fl::gemv;
    fl_status st = embedding_check(ids, n, vocab, hidden, out);
    if (st != FL_OK) return st;
    st = dequant_check(format, w, scales, zeros, group_size, out, vocab, hidden);
    if (st != FL_OK) return st;
    if (n == 0) return FL_OK;
    if (is_kquant(format)) {
        const int64_t row = fl_gemv_weight_bytes(format, 1, hidden);
        for (int64_t r = 0; r < n; ++r) {
            if (ids[r] < 0 || ids[r] >= vocab)
                std::memset(out + r * hidden, 0, sizeof(float) * hidden);
            else
                kquant_dequantize_host(format, static_cast<const uint8_t *>(w) + ids[r] * row,
                                       out + r * hidden, 1, hidden);
        }
        return FL_OK;
    }
    switch (format) {
    case FL_GEMV_INT8: embedding_host<I8>(ids, n, w, scales, zeros, group_size, vocab, out, hidden); return FL_OK;
    case FL_GEMV_INT4: embedding_host<I4>(ids, n, w, scales, zeros, group_size, vocab, out, hidden); return FL_OK;
    case FL_GEMV_INT4_ZP: embedding_host<I4Z>(ids, n, w, scales, zeros, group_size, vocab, out, hidden); return FL_OK;
    case FL_GEMV_Q8_0: embedding_host<Q80>(ids, n, w, scales, zeros, group_size, vocab, out, hidden); return FL_OK;
    case FL_GEMV_Q4_0: embedding_host<Q40>(ids, n, w, scales, zeros, group_size, vocab, out, hidden); return FL_OK;
    default: break;
    }
    return FL_ERR_INVALID_ARGUMENT;
}

extern "C" fl_status fl_gemv_dequantize_host(fl_gemv_format format, const void *w,
                                             const void *scales, const void *zeros,
                                             int32_t group_size, float *out, int64_t n, int64_t k) {
    using namespace fl::gemv;
    const fl_status st = dequant_check(format, w, scales, zeros, group_size, out, n, k);
    if (st != FL_OK || n == 0) return st;
    if (is_kquant(format)) {
        kquant_dequantize_host(format, w, out, n, k);
        return FL_OK;
    }
    switch (format) {
    case FL_GEMV_INT8: dequant_host<I8>(w, scales, zeros, group_size, out, n, k); return FL_OK;
    case FL_GEMV_INT4: dequant_host<I4>(w, scales, zeros, group_size, out, n, k); return FL_OK;
    case FL_GEMV_INT4_ZP: dequant_host<I4Z>(w, scales, zeros, group_size, out, n, k); return FL_OK;
    case FL_GEMV_Q8_0: dequant_host<Q80>(w, scales, zeros, group_size, out, n, k); return FL_OK;
    case FL_GEMV_Q4_0: dequant_host<Q40>(w, scales, zeros, group_size, out, n, k); return FL_OK;
    }
    return FL_ERR_INVALID_ARGUMENT;
}
