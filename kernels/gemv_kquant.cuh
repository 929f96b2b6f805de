// Launchers of kernels/gemv_kquant.cu: the llama.cpp K-quants (FL_GEMV_Q4_K / Q5_K / Q6_K) in
// the quantised GEMV (gemv.cu routes them here on every path) and in fl_gemv_dequantize
// (gemv_dequant.cu). Callers have checked the arguments (k % 256 == 0, alignment, pointers).
#pragma once

#include "gemv_common.cuh"

namespace fl {
namespace gemv {

// Whether `format` is one of the K-quants this file takes.
inline bool is_kquant(fl_gemv_format format) {
    return format == FL_GEMV_Q4_K || format == FL_GEMV_Q5_K || format == FL_GEMV_Q6_K;
}
// y [m, n] = x [m, k] . W^T, m = 1..FL_GEMV_MAX_M, W in a.format (a K-quant, held as the int
// value of its fl_gemv_format in a.format).
fl_status launch_kquant(const GemvArgs &a);
// out [n, k] = dtype(W) (dtype f32, f16 or bf16).
fl_status launch_kquant_dequantize(fl_dtype dtype, fl_gemv_format format, const void *w, void *out, int64_t n,
                                   int64_t k, cudaStream_t s);
// The same per-unit code on the host, writing the f32 values into out [n, k].
void kquant_dequantize_host(fl_gemv_format format, const void *w, float *out, int64_t n, int64_t k);

}  // namespace gemv
}  // namespace fl
