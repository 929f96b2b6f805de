/* Launchers of kernels/gemv_dense.cu (included by fl_kernels.h; see its rules).
 *
 * Dense (f16 / bf16) GEMV / small GEMM for decode, m = 1..FL_GEMV_DENSE_MAX_M tokens:
 *   acc[t, r] = sum_j x[t, j] * W[r, j]   (f32 accumulation, t < m, j < k),
 * x [m, k] row-major, W row-major (output-major, like nn.Linear.weight), x, W, bias and the
 * output all of `dtype` (f16 or bf16). The epilogue is fused; each output is rounded once:
 *  FL_GEMV_DENSE_LINEAR  W [n, k]; y [m, n]:  y[t, r] = acc[t, r] (+ bias[r] if bias != NULL)
 *  FL_GEMV_DENSE_SWIGLU  W [2n, k]: gate rows 0..n, then up rows n..2n; y [m, n]:
 *                        y[t, r] = silu(acc[t, r]) * acc[t, n + r],  silu(g) = g / (1 + e^-g)
 *                        (never materialises the [m, 2n] product); bias must be NULL.
 *  FL_GEMV_DENSE_ADD     W [n, k]; y [m, n] is read and written in place (a residual):
 *                        y[t, r] = f32(y[t, r]) + acc[t, r]; bias must be NULL.
 *
 * Alignment: x and W 16-byte aligned and k a multiple of 8 (16-byte rows; there is no scalar
 * path), y and bias 2-byte aligned, else FL_ERR_MISALIGNED / FL_ERR_INVALID_ARGUMENT.
 * y must not overlap x, W or bias.
 * Errors: FL_ERR_INVALID_ARGUMENT for m outside 0..FL_GEMV_DENSE_MAX_M, n < 0, k <= 0 or not
 * a multiple of 8, sizes whose products overflow int64_t, an unknown epilogue, a bias with
 * SWIGLU / ADD, or a NULL x / W / y with work to do; FL_ERR_UNSUPPORTED_DTYPE for a dtype
 * other than f16 / bf16. m == 0 or n == 0 launches nothing and returns FL_OK. */
#ifndef FL_GEMV_DENSE_H
#define FL_GEMV_DENSE_H
#include "fl_kernels.h"
#include "fl_kv_cache.h"
#ifdef __cplusplus
extern "C" {
#endif

/* The largest m (tokens) one launch takes (callers use a GEMM above it). */
#define FL_GEMV_DENSE_MAX_M 16

/* The fused epilogue (see above). */
typedef enum fl_gemv_dense_epilogue {
    FL_GEMV_DENSE_LINEAR = 0,
    FL_GEMV_DENSE_SWIGLU = 1,
    FL_GEMV_DENSE_ADD = 2
} fl_gemv_dense_epilogue;

/* y = epilogue(x . W^T) (see above); n = output columns (for SWIGLU: W has 2n rows). */
fl_status fl_gemv_dense(fl_dtype dtype, fl_gemv_dense_epilogue epilogue, const void *x,
                        const void *w, const void *bias, void *y, int64_t m, int64_t n,
                        int64_t k, fl_stream stream);

/* The same with the RMSNorm of the input fused in front: x is computed from h [m, k] as
 *   x[t, j] = T(h[t, j] * rstd[t] * gamma[j]),  rstd[t] = 1 / sqrt(sum_j h[t, j]^2 / k + eps)
 * (f32 math, one rounding to T: the values fl_rms_norm writes), then y = epilogue(x . W^T)
 * as above; x is never written to memory. gamma [k] of `dtype`, 16-byte aligned; eps > 0 and
 * finite. y must not overlap h (ADD: the residual read here is y, not h).
 * Errors: as fl_gemv_dense, plus FL_ERR_INVALID_ARGUMENT for a NULL gamma or a bad eps. */
fl_status fl_gemv_dense_rms_norm(fl_dtype dtype, fl_gemv_dense_epilogue epilogue, const void *h,
                                 const void *gamma, float eps, const void *w, const void *bias,
                                 void *y, int64_t m, int64_t n, int64_t k, fl_stream stream);

/* The QKV projection of a decode step with the rotary embedding and the KV-cache append
 * fused into its epilogue (in place of fl_gemv_dense(_rms_norm) LINEAR + fl_kv_rope_append).
 *
 * W [(q_heads + 2 kv_heads) * d, k] (d = params->head_dim): per token the q heads, then the k
 * heads, then the v heads, as fl_kv_rope_append's qkv row. With acc[t, r] = x[t, :] . W[r, :]
 * (+ bias[r]) in f32 (x = the RMSNorm of h as in fl_gemv_dense_rms_norm when gamma != NULL,
 * else x = h), s = seq_ids[t], p = positions[t], and R the rotation of fl_rope_apply with the
 * INTERLEAVED pairing (pair i = elements (2i, 2i + 1) of a head, i < rotary_dim / 2, angle
 * (float)p * inv_freq[i], accurate sincosf) applied to the f32 values:
 *     q_out[t, h, :]                 = T(R(acc[t, q head h]))       h < q_heads
 *     k_cache[s, h, p, :]            = T(R(acc[t, k head h]))       h < kv_heads
 *     v_cache[s, h, p, :]            = T(acc[t, v head h])
 * each value rounded once to `dtype` (the unfused pair rounds qkv before rotating: results
 * agree to one rounding). Elements past rotary_dim are not rotated. The cache is contiguous,
 * [batch, kv_heads, max_seq, d], of `dtype`.
 *
 * Only the interleaved pairing can be fused (a lane holds adjacent outputs): a checkpoint laid
 * out for the rotate-half pairing (Hugging Face LLaMA) runs here after its q and k rows are
 * permuted once at load (row 2i of a head = old row i, row 2i + 1 = old row i + rotary_dim / 2;
 * fl-kernels' rope::rotate_half_to_interleaved_rows), which leaves attention unchanged.
 *
 * Shapes: h [m, k] (m 1..FL_GEMV_DENSE_MAX_M), gamma [k], bias [(q_heads + 2 kv_heads) * d] or
 * NULL, seq_ids / positions int32 [m] on the device, q_out [m, q_heads, d]. d a multiple of 8.
 * Errors: as fl_gemv_dense_rms_norm (gamma may be NULL here: no norm, eps ignored), plus
 * FL_ERR_INVALID_ARGUMENT for params that fl_rope_apply refuses, params->interleaved != 1,
 * d not a multiple of 8, q_heads < 0, kv_heads < 1, batch < 1, max_seq < 1, or a NULL
 * seq_ids / positions / q_out (q_heads > 0) / cache. On the device a token whose slot does
 * not exist (s outside 0..batch, p outside 0..max_seq) writes nothing (neither q_out nor the
 * cache) and ORs FL_KV_ERR_SEQUENCE / FL_KV_ERR_POSITION into *err_flag (may be NULL).
 * q_out and the caches must not overlap h, W, bias or each other. */
fl_status fl_gemv_dense_rope_append(fl_dtype dtype, const void *h, const void *gamma, float eps,
                                    const void *w, const void *bias, int64_t m, int64_t k,
                                    int32_t q_heads, int32_t kv_heads,
                                    const fl_rope_params *params, const int32_t *seq_ids,
                                    const int32_t *positions, void *q_out, void *k_cache,
                                    void *v_cache, int32_t batch, int64_t max_seq,
                                    int32_t *err_flag, fl_stream stream);

/* fl_gemv_dense_rope_append into a PAGED cache (the layout of fl_kv_rope_append_paged):
 * k_cache, v_cache [num_blocks, kv_heads, block_size, d] of `dtype`, and the token of sequence
 * s = seq_ids[t] at position p = positions[t] goes to block
 * b = block_table[s * max_blocks_per_seq + p / block_size], slot p % block_size:
 *     k_cache[b, h, p % block_size, :] = T(R(acc[t, k head h]))   h < kv_heads
 *     v_cache[b, h, p % block_size, :] = T(acc[t, v head h])
 * (q_out, the rotation and the rounding exactly as fl_gemv_dense_rope_append).
 * block_table: int32 [batch, max_blocks_per_seq] row-major, on the device; batch is its rows.
 * Same kernel as the contiguous launcher (the block lookup is done once per token and CTA).
 * Errors: as fl_gemv_dense_rope_append, with FL_ERR_INVALID_ARGUMENT for batch < 1,
 * max_blocks_per_seq < 1, num_blocks < 1, block_size < 1 or a NULL block_table (m > 0) in
 * place of the max_seq check. On the device a token whose slot does not exist writes nothing
 * (neither q_out nor the cache) and ORs into *err_flag (may be NULL; never cleared here), as
 * fl_kv_rope_append_paged: FL_KV_ERR_SEQUENCE for s outside 0..batch, FL_KV_ERR_POSITION for
 * p < 0 or p / block_size >= max_blocks_per_seq, FL_KV_ERR_BLOCK for a block id outside
 * 0..num_blocks. q_out and the caches must not overlap h, W, bias, block_table or each
 * other. */
fl_status fl_gemv_dense_rope_append_paged(fl_dtype dtype, const void *h, const void *gamma,
                                          float eps, const void *w, const void *bias, int64_t m,
                                          int64_t k, int32_t q_heads, int32_t kv_heads,
                                          const fl_rope_params *params, const int32_t *seq_ids,
                                          const int32_t *positions, void *q_out, void *k_cache,
                                          void *v_cache, const int32_t *block_table,
                                          int32_t batch, int32_t max_blocks_per_seq,
                                          int64_t num_blocks, int32_t block_size,
                                          int32_t *err_flag, fl_stream stream);

#ifdef __cplusplus
}
#endif
#endif
