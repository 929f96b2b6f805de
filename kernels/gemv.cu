// Weight-only quantised GEMV / small GEMM for decode (fl_gemv.h): y[m, n] = x[m, k] . W^T, W
// [n, k] stored quantised (int8 per channel, int4 group-wise symmetric or with zero point,
// llama.cpp Q8_0 and Q4_0 blocks), x and y f16 / bf16, m = 1..16, f32 accumulation, weights
// dequantised in registers only. This file holds the C API and the choice of kernel; the
// kernels live beside it:
//   gemv_unpack.cuh        formats and the exact dequantisation (f32 and 16-bit pairs)
//   gemv_common.cuh        call arguments, each file's launchers, ring / staging / TMA helpers
//   gemv_fma.cu            CUDA cores: one warp per row, f32 FMAs (GemvPath::Fma)
//   gemv_mma.cu            tensor cores, general: any k, any m
//   gemv_one_token_int.cu  m = 1, int8 / int4: cp.async rings; int8 on sm_90+: a TMA ring
//   gemv_one_token_gguf.cu m = 1, Q8_0 / Q4_0 with k % 256 == 0: cp.async or TMA rings
//   gemv_multi_token.cu    m = 2..16 with k % 256 == 0: cp.async rings with every token's x
//   gemv_dequant.cu        fl_gemv_dequantize (the prefill path)
//   gemv_kquant.cu         Q4_K / Q5_K / Q6_K on every path (tensor cores), their dequantisation
// What each kernel tried and lost is in kernels/experiments/gemv.md.
//
// The choice (GemvPath::Auto; GemvPath::Mma takes the tensor-core side whatever the shape,
// GemvPath::Fma the CUDA-core kernel). The tensor-core side tries, in order, the first kernel
// whose rule (its file's *_applies) holds and whose shared memory the device grants:
//   int8 / int4, m = 1:  int8 TMA ring -> cp.async rings -> general tensor-core kernel
//   Q8_0 / Q4_0, m = 1:  TMA rings -> cp.async rings -> general tensor-core kernel
//   m = 2..16:           multi-token rings (k % 256 == 0) -> general tensor-core kernel
// and Auto takes that side for m >= 2, for int4, and for int8 / Q8_0 / Q4_0 at m = 1 when one
// of their one-token kernels applies; otherwise (e.g. Q8_0 / Q4_0 at k % 256 != 0, where the
// general tensor-core kernel is slower) the CUDA-core kernel.
#include "gemv_common.cuh"
#include "gemv_kquant.cuh"

namespace fl {
namespace gemv {
namespace {

// The tensor-core side: the ring kernels that apply, in order, else the general kernel.
fl_status launch_tensor_cores(const GemvArgs &a) {
    fl_status st = FL_OK;
    if (a.format == I8 || a.format == I4 || a.format == I4Z) {
        if (a.format == I8 && one_token_int8_tma_applies(a.m, a.n, a.k) && launch_one_token_int8_tma(a, st)) return st;
        if (one_token_int_applies(a.format, a.m, a.n, a.k, a.group) && launch_one_token_int(a, st)) return st;
        if (multi_token_int_applies(a.format, a.m, a.n, a.k, a.group) && launch_multi_token_int(a, st)) return st;
    } else {
        if (one_token_gguf_tma_applies(a.format, a.m, a.n, a.k) && launch_one_token_gguf_tma(a, st)) return st;
        if (one_token_gguf_applies(a.format, a.m, a.n, a.k) && launch_one_token_gguf(a, st)) return st;
        if (multi_token_gguf_applies(a.m, a.k) && launch_multi_token_gguf(a, st)) return st;
    }
    return launch_mma(a);
}

// Whether a launch takes the tensor-core side: forced by `path`, else for m >= 2 (the CUDA-core
// kernel is compute-bound there), for int4 at m = 1, and for int8 / Q8_0 / Q4_0 at m = 1 when
// a one-token kernel takes the call (elsewhere the general tensor-core kernel is slower than
// the CUDA-core one at one token for them).
bool use_tensor_cores(int path, fl_gemv_format format, int64_t m, int64_t n, int64_t k) {
    if (path == FL_GEMV_PATH_MMA) return true;
    if (path == FL_GEMV_PATH_FMA) return false;
    const int mi = (int)m;
    return m >= 2 || format == FL_GEMV_INT4 || format == FL_GEMV_INT4_ZP ||
           (format == FL_GEMV_INT8 &&
            (one_token_int8_tma_applies(mi, n, k) || one_token_int_applies(I8, mi, n, k, 32))) ||
           (format == FL_GEMV_Q8_0 &&
            (one_token_gguf_tma_applies(Q80, mi, n, k) || one_token_gguf_applies(Q80, mi, n, k))) ||
           (format == FL_GEMV_Q4_0 &&
            (one_token_gguf_tma_applies(Q40, mi, n, k) || one_token_gguf_applies(Q40, mi, n, k)));
}

// Host run of the nibble unpacking of one unit (see fl_gemv_unpack_unit_host).
template <int F> void unpack_unit_host(const uint8_t *quants, float z, float *out) {
    uint32_t q[4];
    std::memcpy(q, quants, 16);  // little-endian words, as the kernel reads them
    float f[32];
    deq_nibbles<F>(q, z, f);
    for (int e = 0; e < 32; ++e) out[e] = f[e] * (1.f / (float)(1 << (4 * value_class<F>(e))));
}

// Host run of nib_raw on one word (see fl_gemv_raw_nibbles_host): out[i] = nibble i's 16-bit
// value, times nib_raw_odd_scale for odd nibbles, less nib_raw_even / nib_raw_odd.
template <typename T> void raw_nibbles_host(uint32_t w, float *out) {
    uint32_t b[4];
    nib_raw<T>(w, b);
    auto value = [](uint32_t h) {  // a 16-bit float's bits as f32 (host conversions)
        if constexpr (std::is_same<T, __half>::value) {
            __half_raw r;
            r.x = (unsigned short)h;
            return __half2float(__half(r));
        } else {
            __nv_bfloat16_raw r;
            r.x = (unsigned short)h;
            return __bfloat162float(__nv_bfloat16(r));
        }
    };
    for (int p = 0; p < 4; ++p)  // pair p = (nibble p, nibble p + 4)
        for (int half = 0; half < 2; ++half) {
            const int i = p + 4 * half;
            const bool odd = p & 1;
            const float v = value((b[p] >> (16 * half)) & 0xFFFFu);
            out[i] = odd ? v * nib_raw_odd_scale<T>() - nib_raw_odd<T>() : v - nib_raw_even<T>();
        }
}

}  // namespace
}  // namespace gemv
}  // namespace fl

extern "C" int64_t fl_gemv_weight_bytes(fl_gemv_format format, int64_t n, int64_t k) {
    if (n < 0 || k < 0 || k % 32 != 0) return -1;
    if (fl::gemv::is_kquant(format) && k % 256 != 0) return -1;
    int64_t per_row;
    switch (format) {
    case FL_GEMV_INT8: per_row = k; break;
    case FL_GEMV_INT4:
    case FL_GEMV_INT4_ZP: per_row = k / 2; break;
    case FL_GEMV_Q8_0: per_row = k / 32 * 34; break;
    case FL_GEMV_Q4_0: per_row = k / 32 * 18; break;
    case FL_GEMV_Q4_K: per_row = k / 256 * 144; break;
    case FL_GEMV_Q5_K: per_row = k / 256 * 176; break;
    case FL_GEMV_Q6_K: per_row = k / 256 * 210; break;
    default: return -1;
    }
    if (per_row > 0 && n > INT64_MAX / per_row) return -1;
    return n * per_row;
}

extern "C" fl_status fl_gemv_quant(fl_dtype dtype, fl_gemv_format format, const void *x,
                                   const void *w, const void *scales, const void *zeros,
                                   int32_t group_size, void *y, int64_t m, int64_t n, int64_t k,
                                   fl_stream stream) {
    return fl_gemv_quant_path(dtype, format, x, w, scales, zeros, group_size, y, m, n, k,
                              FL_GEMV_PATH_AUTO, stream);
}

extern "C" fl_status fl_gemv_quant_path(fl_dtype dtype, fl_gemv_format format, const void *x,
                                        const void *w, const void *scales, const void *zeros,
                                        int32_t group_size, void *y, int64_t m, int64_t n,
                                        int64_t k, int32_t path, fl_stream stream) {
    using namespace fl;
    if (path < FL_GEMV_PATH_AUTO || path > FL_GEMV_PATH_MMA) return FL_ERR_INVALID_ARGUMENT;
    if (m < 0 || m > FL_GEMV_MAX_M || n < 0 || k <= 0 || k % 32 != 0)
        return FL_ERR_INVALID_ARGUMENT;
    const bool kquant = gemv::is_kquant(format);
    if (kquant && k % 256 != 0) return FL_ERR_INVALID_ARGUMENT;
    const bool int4 = format == FL_GEMV_INT4 || format == FL_GEMV_INT4_ZP;
    if (int4 && ((group_size != 32 && group_size != 64 && group_size != 128) || k % group_size != 0))
        return FL_ERR_INVALID_ARGUMENT;
    const int64_t wbytes = fl_gemv_weight_bytes(format, n, k);
    if (wbytes < 0 || (n > 0 && k > INT64_MAX / n)) return FL_ERR_INVALID_ARGUMENT;
    if (ceil_div(n, gemv::kFmaRowsPerCta) > 0x7fffffffLL) return FL_ERR_INVALID_ARGUMENT;
    if (dtype != FL_DTYPE_F16 && dtype != FL_DTYPE_BF16) return FL_ERR_UNSUPPORTED_DTYPE;
    if (m == 0 || n == 0) return FL_OK;
    const bool need_scales = format == FL_GEMV_INT8 || int4;
    if (!x || !w || !y || (need_scales && !scales) || (format == FL_GEMV_INT4_ZP && !zeros))
        return FL_ERR_INVALID_ARGUMENT;
    if (!aligned16(x) || !aligned16(w)) return FL_ERR_MISALIGNED;
    if ((reinterpret_cast<uintptr_t>(y) & 1u) != 0) return FL_ERR_MISALIGNED;
    if (format == FL_GEMV_INT8 && (reinterpret_cast<uintptr_t>(scales) & 3u) != 0) return FL_ERR_MISALIGNED;
    if (int4 && (reinterpret_cast<uintptr_t>(scales) & 1u) != 0) return FL_ERR_MISALIGNED;
    const gemv::GemvArgs a{static_cast<gemv::Fmt>(format),
                           dtype == FL_DTYPE_BF16,
                           x,
                           w,
                           scales,
                           static_cast<const uint8_t *>(zeros),
                           y,
                           (int)m,
                           n,
                           k,
                           group_size,
                           as_stream(stream)};
    if (kquant) return gemv::launch_kquant(a);  // one kernel on every path (gemv_kquant.cu)
    if (gemv::use_tensor_cores(path, format, m, n, k)) return gemv::launch_tensor_cores(a);
    return gemv::launch_fma(a);
}

extern "C" fl_status fl_gemv_raw_nibbles_host(fl_dtype dtype, uint32_t word, float *out) {
    if (!out) return FL_ERR_INVALID_ARGUMENT;
    switch (dtype) {
    case FL_DTYPE_F16: fl::gemv::raw_nibbles_host<__half>(word, out); return FL_OK;
    case FL_DTYPE_BF16: fl::gemv::raw_nibbles_host<__nv_bfloat16>(word, out); return FL_OK;
    default: return FL_ERR_INVALID_ARGUMENT;
    }
}

extern "C" fl_status fl_gemv_unpack_unit_host(fl_gemv_format format, const uint8_t *quants,
                                              int32_t zero, float *out) {
    using namespace fl::gemv;
    if (!quants || !out) return FL_ERR_INVALID_ARGUMENT;
    switch (format) {
    case FL_GEMV_INT4: unpack_unit_host<I4>(quants, 8.f, out); return FL_OK;
    case FL_GEMV_INT4_ZP:
        if (zero < 0 || zero > 15) return FL_ERR_INVALID_ARGUMENT;
        unpack_unit_host<I4Z>(quants, (float)zero, out);
        return FL_OK;
    case FL_GEMV_Q4_0: unpack_unit_host<Q40>(quants, 8.f, out); return FL_OK;
    default: return FL_ERR_INVALID_ARGUMENT;
    }
}
