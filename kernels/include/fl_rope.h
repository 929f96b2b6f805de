/* Launchers of kernels/rope.cu (included by fl_kernels.h; see its rules). */
#ifndef FL_ROPE_H
#define FL_ROPE_H
#include "fl_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Largest rotary_dim / 2 (so rotary_dim <= 512). */
#define FL_ROPE_MAX_PAIRS 256

/* Bit set in the error flag when a token's position is invalid (negative, or >= max_pos
 * on the table path). Such a token is left untouched. */
#define FL_ROPE_ERR_POSITION 1

/* Rotary embedding configuration (a plain host struct, read by the launcher).
 *
 * head_dim:    elements per head (> 0).
 * rotary_dim:  even, 2 <= rotary_dim <= head_dim, rotary_dim / 2 <= FL_ROPE_MAX_PAIRS; only the
 *              first rotary_dim elements of each head rotate, the rest are not touched.
 * interleaved: 0 = rotate-half / NeoX pairing (Hugging Face LLaMA): pair i is the elements
 *              (i, i + rotary_dim / 2); 1 = interleaved (Meta / GPT-J): pair i is (2i, 2i + 1).
 * inv_freq:    the first rotary_dim / 2 entries: inverse frequency of pair i, frequency scaling
 *              (linear, LLaMA-3) already applied; typically theta^(-2i / rotary_dim).
 *              (fl-kernels' RopeParams computes these in f64 and rounds to f32.)
 *
 * Angle of pair i at position p: a = (float)p * inv_freq[i], one f32 multiply (as Hugging Face
 * computes it), then cos/sin of that f32 angle with full-range accurate sincosf. */
typedef struct fl_rope_params {
    int32_t head_dim;
    int32_t rotary_dim;
    int32_t interleaved;
    int32_t reserved; /* 0 */
    float inv_freq[FL_ROPE_MAX_PAIRS];
} fl_rope_params;

/* Rotary position embedding of Q and K in place, one launch for both, angles computed on the fly.
 *
 * For every token t, every head h of q ([tokens, q_heads, head_dim] rows, row t starting at
 * q + t * q_stride, head h at + h * head_dim) and of k (likewise with kv_heads, k_stride), and
 * every pair i < rotary_dim / 2 with elements (x0, x1) (see params->interleaved):
 *     x0' = x0 * cos(a) - x1 * sin(a),  x1' = x1 * cos(a) + x0 * sin(a),  a = pos[t] * inv_freq[i]
 * computed in f32, rounded once to dtype. (Rotate-half: q * cos + rotate_half(q) * sin.)
 *
 * dtype: f32, f16 or bf16 (q and k alike). positions: int32 [tokens], on the device; per token,
 * so ragged / packed batches work. Any q_heads and kv_heads >= 0 (k may be NULL when
 * kv_heads == 0; q may be NULL when q_heads == 0). q_stride >= q_heads * head_dim and
 * k_stride >= kv_heads * head_dim (elements): Q and K may be views into one fused QKV buffer, but
 * no two head rows may overlap.
 * Errors: FL_ERR_INVALID_ARGUMENT for bad sizes / params / NULL pointers; on the device a
 * negative position leaves that token's Q and K untouched and ORs FL_ROPE_ERR_POSITION into
 * *err_flag (err_flag may be NULL: the token is still skipped). The flag is never cleared here.
 * 16-byte vector accesses when pointers, strides and dims allow, a scalar path otherwise. */
fl_status fl_rope_apply(fl_dtype dtype, void *q, void *k, const int32_t *positions, int64_t tokens,
                        int32_t q_heads, int32_t kv_heads, int64_t q_stride, int64_t k_stride,
                        const fl_rope_params *params, int32_t *err_flag, fl_stream stream);

/* The cos/sin table (FasterLLaMA's freqs_cis): for p < max_pos and i < rotary_dim / 2,
 *     cos_table[p * (rotary_dim / 2) + i] = cos(a), sin_table[...] = sin(a), a = (float)p * inv_freq[i]
 * f32, [max_pos, rotary_dim / 2] each; the very values fl_rope_apply computes on the fly, so the
 * two paths give bit-identical results. max_pos >= 1 and max_pos <= 2^31. */
fl_status fl_rope_build_table(const fl_rope_params *params, int64_t max_pos, float *cos_table,
                              float *sin_table, fl_stream stream);

/* fl_rope_apply with cos/sin read from a table built by fl_rope_build_table (params->inv_freq is
 * not read; head_dim, rotary_dim and interleaved are). cos_table, sin_table: f32
 * [max_pos, rotary_dim / 2]. A position < 0 or >= max_pos leaves the token untouched and ORs
 * FL_ROPE_ERR_POSITION into *err_flag (if not NULL); nothing is clamped. */
fl_status fl_rope_apply_table(fl_dtype dtype, void *q, void *k, const int32_t *positions,
                              int64_t tokens, int32_t q_heads, int32_t kv_heads, int64_t q_stride,
                              int64_t k_stride, const fl_rope_params *params,
                              const float *cos_table, const float *sin_table, int64_t max_pos,
                              int32_t *err_flag, fl_stream stream);

#ifdef __cplusplus
}
#endif
#endif
