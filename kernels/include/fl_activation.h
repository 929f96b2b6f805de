/* Launchers of kernels/activation.cu (included by fl_kernels.h; see its rules).
 *
 * Every launcher here: dtype f32, f16 or bf16, arithmetic in f32, one rounding to the
 * storage type at the output. Tensors are contiguous and row-major. A size of 0 (rows or
 * columns) launches nothing and returns FL_OK; pointers may then be NULL.
 * Errors: FL_ERR_INVALID_ARGUMENT for a negative size, a NULL pointer with work to do,
 * sizes whose element count overflows int64_t or an unknown fl_gelu_kind;
 * FL_ERR_UNSUPPORTED_DTYPE for a dtype other than the three above.
 * 16-byte vector accesses are used when the row length and every pointer allow it, narrower
 * ones (down to one element) otherwise: any size and any element-aligned pointer works. */
#ifndef FL_ACTIVATION_H
#define FL_ACTIVATION_H
#include "fl_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif

/* SwiGLU on two inputs:
 *   out[r, j] = silu(gate[r, j]) * up[r, j],  silu(x) = x / (1 + exp(-x)),
 * gate, up, out [rows, inter]. silu is overflow-safe: silu(-inf < x << 0) = -0, never NaN
 * for finite x. Accuracy in f32: about 1e-6 relative (fast exp and division).
 * out must not overlap gate or up (gate and up may be the same buffer). */
fl_status fl_swiglu(fl_dtype dtype, const void *gate, const void *up, void *out, int64_t rows,
                    int64_t inter, fl_stream stream);

/* SwiGLU on the fused [gate | up] GEMM output:
 *   out[r, j] = silu(x[r, j]) * x[r, inter + j],
 * x [rows, 2 * inter] (gate = first half of each row, up = second half), out [rows, inter].
 * Same math as fl_swiglu (bit-identical results). out must not overlap x. */
fl_status fl_swiglu_fused(fl_dtype dtype, const void *x, void *out, int64_t rows, int64_t inter,
                          fl_stream stream);

/* Which GELU. */
typedef enum fl_gelu_kind {
    /* 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), computed as the equal
     * x / (1 + exp(-2 sqrt(2 / pi) (x + 0.044715 x^3))) (no cancellation, no overflow NaN). */
    FL_GELU_TANH = 0,
    /* 0.5 x (1 + erf(x / sqrt(2))) = x * Phi(x), Phi computed with normcdff. */
    FL_GELU_ERF = 1
} fl_gelu_kind;

/* GELU with an optional bias added first:
 *   out[r, c] = gelu(x[r, c] + bias[c])   (bias NULL: out[r, c] = gelu(x[r, c])),
 * x, out [rows, cols], bias [cols]; the sum is kept in f32 (not rounded before gelu).
 * out may be x itself (in place); no other overlap is allowed (bias must not overlap out). */
fl_status fl_gelu(fl_dtype dtype, fl_gelu_kind kind, const void *x, const void *bias, void *out,
                  int64_t rows, int64_t cols, fl_stream stream);

/* Bias add: out[r, c] = x[r, c] + bias[c], x, out [rows, cols], bias [cols] (not NULL).
 * out may be x itself (in place); bias must not overlap out. */
fl_status fl_bias_add(fl_dtype dtype, const void *x, const void *bias, void *out, int64_t rows,
                      int64_t cols, fl_stream stream);

#ifdef __cplusplus
}
#endif
#endif
