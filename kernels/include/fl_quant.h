/* Launchers of kernels/quant.cu (included by fl_kernels.h; see its rules): INT8 W8A8.
 *
 * The int8 GEMMs between these kernels (fl-blas `Blas::gemm_i8`) compute
 *   acc[t, n] = sum_k q_act[t, k] * q_w[n, k]   (int32)
 * with weights quantised once, symmetric per output channel n (weight_scale[n]), and
 * activations quantised per token t by the kernel that produces them (act_scale[t]).
 *
 * Quantisation rule (every launcher that writes int8 `q` and f32 `scale`), per token row of
 * f32 values v (computed as each launcher says, never rounded to dtype):
 *   amax     = max_i |v_i|
 *   scale[t] = amax / 127                                  (f32 division)
 *   inv      = amax > 0 ? min(127 / amax, FLT_MAX) : 0     (f32 division)
 *   q[t, i]  = rint(clamp(v_i * inv, -127, 127))           (f32 product; round half to even)
 * so that v_i ~= q[t, i] * scale[t], |v_i - q * scale| <= scale / 2 (up to f32 rounding), and
 * the largest |v_i| maps to +-127. A row of zeros gives scale 0 and q = 0. Non-finite inputs
 * give unspecified q and a non-finite scale.
 *
 * Calibrated (static) scales: the launchers that take `amax` (a device pointer to one f32,
 * nullable) quantise as above when it is NULL (per-token dynamic scales). When it is not
 * NULL, A = *amax is a per-tensor amax from a calibration pass (FasterTransformer 3.0's static
 * activation scales) and, for every token t, the rule runs with amax = A instead of max|v_i|:
 *   scale[t] = A / 127,  inv = A > 0 ? min(127 / A, FLT_MAX) : 0,
 *   q[t, i]  = rint(clamp(v_i * inv, -127, 127))   (values beyond +-A saturate at +-127)
 * and no absmax is computed. A must be finite and >= 0 (A = 0 gives q = 0, scale 0); other
 * values give unspecified q and scale. scale[t] is still written per token, so the kernels
 * and GEMM epilogues that dequantise (fl_dequantize, the fl_dequant_* launchers, fl-blas
 * gemm_i8) read both modes alike.
 *
 * Dequantisation of a GEMM output (every launcher that reads `acc`):
 *   deq(t, n) = (f32(acc[t, n]) * act_scale[t]) * weight_scale[n]   (two rounded f32 products)
 *
 * Common rules:
 *  - dtype (the activations: x, residual, weight, out): FL_DTYPE_F16 or FL_DTYPE_BF16
 *    (else FL_ERR_UNSUPPORTED_DTYPE); all math in f32.
 *  - tokens >= 0 (0 launches nothing), widths >= 1, eps > 0 and finite; NULL pointers where
 *    tokens > 0 needs them: FL_ERR_INVALID_ARGUMENT. Indices are 64-bit.
 *  - Row kernels (the *_quant launchers) run one CTA per token row and keep the row in
 *    registers when the row length is a multiple of 8, <= 32768, and every pointer is
 *    16-byte aligned (q: 8-byte); any other size or alignment takes a scalar path that
 *    re-reads the row, with identical arithmetic.
 *  - LayerNorm (fl_layer_norm_quant, fl_dequant_bias_add_layer_norm_quant), over a row of f32
 *    values h_i as fl_layer_norm (fl_norm.h) computes it: two passes in f32,
 *      mean = (sum_i h_i) * (1 / hidden),  var = (sum_i (h_i - mean)^2) * (1 / hidden),
 *      rstd = rsqrtf(var + eps)            (f32 block sums in an unspecified order),
 *      v_i  = fmaf((h_i - mean) * rstd, f32(ln_weight[i]), b_i)
 *    with b_i = f32(ln_bias[i]), or 0 when ln_bias is NULL: one f32 subtraction, one f32
 *    product, one fused multiply-add (v is what fl_layer_norm rounds to dtype).
 *  - No argument may overlap another, except as stated.
 */
#ifndef FL_QUANT_H
#define FL_QUANT_H
#include "fl_kernels.h"
#include "fl_activation.h"
#include "fl_rope.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Per-token quantisation: v = f32(x[t, i]).
 * x: dtype [tokens, width]; q: int8 [tokens, width]; scale: f32 [tokens]. */
fl_status fl_quantize_per_token(fl_dtype dtype, const void *x, int8_t *q, float *scale,
                                int64_t tokens, int64_t width, fl_stream stream);

/* Quantisation with a calibrated per-tensor amax (the static counterpart of
 * fl_quantize_per_token): v = f32(x[t, i]), scale[t] = *amax / 127 for every t (see
 * "Calibrated (static) scales"). x: dtype [tokens, width]; amax: f32 [1], not NULL;
 * q: int8 [tokens, width]; scale: f32 [tokens]. */
fl_status fl_quantize_calibrated(fl_dtype dtype, const void *x, const float *amax, int8_t *q,
                                 float *scale, int64_t tokens, int64_t width, fl_stream stream);

/* RMSNorm then per-token quantisation (FasterLLaMA resNormQuantized):
 *   rstd[t] = 1 / sqrt(mean_i(x[t, i]^2) + eps)   (f32 block sum, rsqrtf, as fl_rms_norm)
 *   v       = (f32(x[t, i]) * rstd[t]) * f32(weight[i])   (not rounded to dtype)
 * x: dtype [tokens, hidden]; weight: dtype [hidden]; q: int8 [tokens, hidden]; scale: f32 [tokens]. */
fl_status fl_rms_norm_quant(fl_dtype dtype, const void *x, const void *weight, int8_t *q,
                            float *scale, int64_t tokens, int64_t hidden, float eps,
                            fl_stream stream);

/* Dequantise the fused QKV GEMM output and apply rotary embedding (rotate-half pairing) to q
 * and k; v is only dequantised.
 *   acc: int32 [tokens, (q_heads + 2 kv_heads) * head_dim], per token the q heads, then the k
 *   heads, then the v heads, head_dim each; act_scale: f32 [tokens]; weight_scale: f32
 *   [(q_heads + 2 kv_heads) * head_dim]; positions: int32 [tokens] (any value: the angle is
 *   computed, no table); out: dtype, the same shape and layout as acc (one fused output).
 * With x = deq(t, c) and, in a q or k head, the pair (i, i + rotary_dim / 2) for
 * i < rotary_dim / 2, a = f32(positions[t]) * params->inv_freq[i] (one rounded product) and
 * accurate sincosf(a):
 *   out0 = dtype(fma(x0, cos a, -(x1 * sin a))),  out1 = dtype(fma(x1, cos a, x0 * sin a))
 * (as fl_rope_apply); elements past rotary_dim and all of v: out = dtype(x).
 * params: head_dim >= 1, rotary_dim even in [2, head_dim] and <= 2 * FL_ROPE_MAX_PAIRS,
 * interleaved == 0 (rotate-half only); q_heads, kv_heads >= 0 with q_heads + 2 kv_heads >= 1.
 * Vector path (4 elements per access) when rotary_dim / 2 and head_dim are multiples of 4, acc
 * and weight_scale are 16-byte aligned and out 8-byte aligned; scalar path otherwise. */
fl_status fl_dequant_rope(fl_dtype dtype, const int32_t *acc, const float *act_scale,
                          const float *weight_scale, const int32_t *positions, void *out,
                          int64_t tokens, int32_t q_heads, int32_t kv_heads,
                          const fl_rope_params *params, fl_stream stream);

/* Dequantise the O-projection GEMM output, add it to the residual stream (in place), RMSNorm
 * and quantise per token (FasterLLaMA dequantizedResidualResNormQuantized):
 *   residual[t, i] = dtype(f32(residual[t, i]) + deq(t, i))       (written back)
 *   v = (f32(residual[t, i]) * rstd[t]) * f32(weight[i])   (norm of the rounded new residual,
 *        as fl_add_rms_norm; v not rounded to dtype)
 * acc: int32 [tokens, hidden]; act_scale: f32 [tokens]; weight_scale: f32 [hidden];
 * residual: dtype [tokens, hidden]; weight: dtype [hidden]; q: int8 [tokens, hidden];
 * scale: f32 [tokens]. */
fl_status fl_dequant_add_rms_norm_quant(fl_dtype dtype, const int32_t *acc,
                                        const float *act_scale, const float *weight_scale,
                                        void *residual, const void *weight, int8_t *q,
                                        float *scale, int64_t tokens, int64_t hidden, float eps,
                                        fl_stream stream);

/* Dequantise the fused gate|up GEMM output, SwiGLU, quantise per token
 * (FasterLLaMA dequantizedSiluMultiplyQuantized):
 *   g = deq(t, i), u = deq(t, inter + i),  v = (g / (1 + expf(-g))) * u   (f32)
 * acc: int32 [tokens, 2 * inter] (gate columns first, then up); act_scale: f32 [tokens];
 * weight_scale: f32 [2 * inter]; q: int8 [tokens, inter]; scale: f32 [tokens]. No dtype
 * argument: no 16-bit tensor is read or written. */
fl_status fl_dequant_silu_mul_quant(const int32_t *acc, const float *act_scale,
                                    const float *weight_scale, int8_t *q, float *scale,
                                    int64_t tokens, int64_t inter, fl_stream stream);

/* Dequantise the down-projection GEMM output and add it to the residual (in place):
 *   residual[t, i] = dtype(f32(residual[t, i]) + deq(t, i))
 * acc: int32 [tokens, width]; act_scale: f32 [tokens]; weight_scale: f32 [width];
 * residual: dtype [tokens, width]. Elementwise; 8 elements per access when width is a
 * multiple of 8 and acc, weight_scale, residual are 16-byte aligned. */
fl_status fl_dequant_add(fl_dtype dtype, const int32_t *acc, const float *act_scale,
                         const float *weight_scale, void *residual, int64_t tokens, int64_t width,
                         fl_stream stream);

/* Dequantise a GEMM output to dtype, with an optional bias (a projection whose consumer is not
 * one of the fused kernels above, e.g. the QKV projection before fl_rope_append, or a projection
 * with a bias):
 *   out[t, i] = dtype(deq(t, i) + f32(bias[i]))      (bias NULL: out[t, i] = dtype(deq(t, i)))
 * one f32 add, one rounding. acc: int32 [tokens, width]; act_scale: f32 [tokens]; weight_scale:
 * f32 [width]; bias: dtype [width] or NULL; out: dtype [tokens, width]. Elementwise; 8 elements
 * per access when width is a multiple of 8 and acc, weight_scale, bias and out are 16-byte
 * aligned, else one per thread. */
fl_status fl_dequantize(fl_dtype dtype, const int32_t *acc, const float *act_scale,
                        const float *weight_scale, const void *bias, void *out, int64_t tokens,
                        int64_t width, fl_stream stream);

/* ---- BERT encoder (post-LayerNorm, GELU; FasterTransformer 3.0's INT8 path) ----
 * One layer: x_q = quant(LN_emb(x)); acc = gemm_i8(x_q, Wqkv) -> fl_dequantize (+ QKV bias) ->
 * attention -> a_q = quant(attn) -> acc = gemm_i8(a_q, Wo) ->
 * fl_dequant_bias_add_layer_norm_quant (x = LN(x + o + bo), quantised for the FFN) ->
 * acc = gemm_i8(x_q, W1) -> fl_dequant_bias_gelu_quant -> acc = gemm_i8(m_q, W2) ->
 * fl_dequant_bias_add_layer_norm_quant (x = LN(x + f + b2), quantised for the next QKV). */

/* LayerNorm then quantisation:
 *   v = LayerNorm(f32(x[t, :]))_i  (see "LayerNorm" above; v not rounded to dtype)
 *   y[t, i] = dtype(v)             (only when y is not NULL)
 *   q, scale: the quantisation rule on v (per token when amax is NULL, else calibrated).
 * x, y: dtype [tokens, hidden]; weight: dtype [hidden]; bias: dtype [hidden] or NULL;
 * q: int8 [tokens, hidden]; scale: f32 [tokens]; amax: f32 [1] or NULL. y NULL: no dtype
 * output (only q and scale are written). */
fl_status fl_layer_norm_quant(fl_dtype dtype, const void *x, const void *weight,
                              const void *bias, void *y, int8_t *q, float *scale,
                              const float *amax, int64_t tokens, int64_t hidden, float eps,
                              fl_stream stream);

/* The end of a post-LN sublayer (BERT's x = LayerNorm(sublayer(x) + x)): dequantise the
 * output projection, add its bias and the residual, LayerNorm, write the new hidden state
 * and quantise it for the next GEMM:
 *   s = deq(t, i) + f32(bias[i])     (one f32 add; bias NULL: s = deq(t, i))
 *   h = f32(residual[t, i]) + s      (one f32 add; h is not rounded to dtype)
 *   v = LayerNorm(h[t, :])_i         (see "LayerNorm" above, ln_weight / ln_bias)
 *   residual[t, i] = dtype(v)        (overwritten with the new hidden state)
 *   q, scale: the quantisation rule on v (f32, not the rounded residual).
 * acc: int32 [tokens, hidden]; act_scale: f32 [tokens]; weight_scale: f32 [hidden];
 * bias: dtype [hidden] or NULL; residual: dtype [tokens, hidden], read and written;
 * ln_weight: dtype [hidden]; ln_bias: dtype [hidden] or NULL; q: int8 [tokens, hidden];
 * scale: f32 [tokens]; amax: f32 [1] or NULL. */
fl_status fl_dequant_bias_add_layer_norm_quant(fl_dtype dtype, const int32_t *acc,
                                               const float *act_scale, const float *weight_scale,
                                               const void *bias, void *residual,
                                               const void *ln_weight, const void *ln_bias,
                                               int8_t *q, float *scale, const float *amax,
                                               int64_t tokens, int64_t hidden, float eps,
                                               fl_stream stream);

/* Dequantise the FFN's first GEMM output, add its bias, GELU and quantise (the input of the
 * second FFN GEMM):
 *   v = gelu(deq(t, i) + f32(bias[i]))   (bias NULL: gelu(deq(t, i))), all in f32
 * with gelu the function fl_gelu computes for `kind` (FL_GELU_TANH or FL_GELU_ERF, else
 * FL_ERR_INVALID_ARGUMENT; the same device code), then the quantisation rule on v.
 * acc: int32 [tokens, width]; act_scale: f32 [tokens]; weight_scale: f32 [width]; bias: dtype
 * [width] or NULL; q: int8 [tokens, width]; scale: f32 [tokens]; amax: f32 [1] or NULL.
 * dtype is that of bias (and must be valid when bias is NULL). */
fl_status fl_dequant_bias_gelu_quant(fl_dtype dtype, const int32_t *acc, const float *act_scale,
                                     const float *weight_scale, const void *bias,
                                     fl_gelu_kind kind, int8_t *q, float *scale,
                                     const float *amax, int64_t tokens, int64_t width,
                                     fl_stream stream);

#ifdef __cplusplus
}
#endif
#endif
