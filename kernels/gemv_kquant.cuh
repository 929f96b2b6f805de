// Launchers of kernels/gemv_kquant.cu: the llama.cpp K-quants (FL_GEMV_Q4_K / Q5_K / Q6_K) in
// the quantised GEMV (gemv.cu routes them here on every path) and in fl_gemv_dequantize
// (gemv_dequant.cu). Callers have checked the arguments (k % 256 == 0, alignment, pointers).
#pragma once

#include "gemv_common.cuh"

namespace fl {
namespace gemv {

// A row map for the dequantisation kernels: output row r holds W's row rows[r] (an embedding
// lookup straight from quantised blocks: fl_gemv_embedding); rows == nullptr is the identity
// (fl_gemv_dequantize). An id outside [0, vocab) is not read: its output row is zero and, with a
// status, the row's first unit records the failure (FL_CHECK_TOKEN_ID, as fl_embedding_lookup).
struct RowMap {
    const int32_t *rows = nullptr;
    int64_t vocab = 0;
    int32_t *status = nullptr;
    uint32_t nonce = 0;
};
#ifdef __CUDACC__
// W's row for output row r under a non-identity `map`, or -1 for an id outside the table
// (recorded when `first`: the row's first unit).
__device__ __forceinline__ int64_t map_row(const RowMap &map, int64_t r, bool first) {
    const int32_t id = __ldg(map.rows + r);
    if (id >= 0 && id < map.vocab) return id;
    if (first && map.status)
        record_failure(map.status, map.nonce, FL_CHECK_TOKEN_ID, r, id,
                       (int32_t)(map.vocab < INT32_MAX ? map.vocab : INT32_MAX));
    return -1;
}
#endif

// Whether `format` is one of the K-quants this file takes.
inline bool is_kquant(fl_gemv_format format) {
    return format == FL_GEMV_Q4_K || format == FL_GEMV_Q5_K || format == FL_GEMV_Q6_K;
}
// y [m, n] = x [m, k] . W^T, m = 1..FL_GEMV_MAX_M, W in a.format (a K-quant, held as the int
// value of its fl_gemv_format in a.format).
fl_status launch_kquant(const GemvArgs &a);
// out [n, k] = dtype(W) (dtype f32, f16 or bf16); with a row map, out [n, k] = dtype(W[rows]).
fl_status launch_kquant_dequantize(fl_dtype dtype, fl_gemv_format format, const void *w, void *out, int64_t n,
                                   int64_t k, cudaStream_t s, const RowMap &map = RowMap{});
// The same per-unit code on the host, writing the f32 values into out [n, k].
void kquant_dequantize_host(fl_gemv_format format, const void *w, float *out, int64_t n, int64_t k);

}  // namespace gemv
}  // namespace fl
