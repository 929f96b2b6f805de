/* Launchers of kernels/norm.cu (included by fl_kernels.h; see its rules). */
#ifndef FL_NORM_H
#define FL_NORM_H
#include "fl_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Row norms over the last dimension of row-major [rows, hidden] tensors.
 *
 * Common rules of the three launchers:
 *  - dtype: f32, f16 or bf16, the same for every tensor argument; statistics and the
 *    normalisation are computed in f32, each output element is rounded to dtype once.
 *  - rows >= 0 (0 launches nothing), hidden >= 1, eps > 0 and finite; a null pointer where
 *    rows > 0 needs one: FL_ERR_INVALID_ARGUMENT. Indices are 64-bit (rows * hidden may
 *    exceed 2^31).
 *  - 16-byte vector accesses when hidden is a multiple of 16 / sizeof(dtype) and every
 *    pointer is 16-byte aligned; a scalar path (same results) otherwise.
 *  - y may alias x exactly (in place); no other overlap is allowed.
 */

/* RMSNorm (LLaMA): y[r, i] = x[r, i] * rstd[r] * weight[i],
 *   rstd[r] = 1 / sqrt(mean_i(x[r, i]^2) + eps).
 * x, y: [rows, hidden]; weight: [hidden].
 * Rounding: y = dtype(f32(x) * rstd * f32(weight)), one rounding. (HF's LlamaRMSNorm rounds
 * x * rstd to dtype before multiplying by the weight in dtype; the two agree to within one
 * rounding of dtype.) */
fl_status fl_rms_norm(fl_dtype dtype, const void *x, const void *weight, void *y, int64_t rows,
                      int64_t hidden, float eps, fl_stream stream);

/* Fused residual add + RMSNorm (FasterLLaMA):
 *   residual[r, i] = dtype(residual[r, i] + x[r, i])      (updated in place)
 *   y[r, i]        = rmsnorm(residual[r, :])[i] * weight[i]  (as fl_rms_norm, on the
 *                                                           rounded new residual)
 * x, residual, y: [rows, hidden]; weight: [hidden]. residual must not alias x or y
 * (FL_ERR_INVALID_ARGUMENT when it equals either); y may alias x. */
fl_status fl_add_rms_norm(fl_dtype dtype, const void *x, void *residual, const void *weight,
                          void *y, int64_t rows, int64_t hidden, float eps, fl_stream stream);

/* LayerNorm: y[r, i] = (x[r, i] - mean[r]) * rstd[r] * weight[i] + bias[i],
 *   mean[r] = mean_i x[r, i], var[r] = mean_i (x[r, i] - mean[r])^2 (biased, two-pass),
 *   rstd[r] = 1 / sqrt(var[r] + eps).
 * x, y: [rows, hidden]; weight: [hidden]; bias: [hidden] or NULL (no bias).
 * Rounding: one rounding of the f32 result to dtype (as torch's layer_norm). */
fl_status fl_layer_norm(fl_dtype dtype, const void *x, const void *weight, const void *bias,
                        void *y, int64_t rows, int64_t hidden, float eps, fl_stream stream);

/* Fused add-bias + residual + LayerNorm (BERT's post-LN sublayer end; FasterTransformer's
 * addBiasInputLayernorm): with x the sublayer's GEMM output before its bias,
 *   h[r, i] = dtype((f32(x[r, i]) + f32(x_bias[i])) + f32(residual[r, i]))   (one rounding, as
 *             torch's residual add in dtype; x_bias NULL: no bias term)
 *   y[r, i] = LayerNorm(h[r, :])[i] as fl_layer_norm (weight, bias NULL: none)
 * x, residual, y: [rows, hidden]; x_bias, weight, bias: [hidden]. y may alias x or residual
 * (BERT writes the new hidden state over the residual stream); nothing else may overlap. */
fl_status fl_add_bias_layer_norm(fl_dtype dtype, const void *x, const void *x_bias,
                                 const void *residual, const void *weight, const void *bias,
                                 void *y, int64_t rows, int64_t hidden, float eps,
                                 fl_stream stream);

#ifdef __cplusplus
}
#endif
#endif
