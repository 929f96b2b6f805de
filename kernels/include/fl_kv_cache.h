/* Launchers of kernels/kv_cache.cu (included by fl_kernels.h; see its rules). */
#ifndef FL_KV_CACHE_H
#define FL_KV_CACHE_H
#include "fl_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Bits ORed into the error flag by the append launchers; the token at fault is not written. */
#define FL_KV_ERR_SEQUENCE 1 /* seq_ids[t] < 0 or >= batch */
#define FL_KV_ERR_POSITION 2 /* positions[t] < 0, or >= max_seq (contiguous), or
                                positions[t] / block_size >= max_blocks_per_seq (paged) */
#define FL_KV_ERR_BLOCK 4    /* paged: block id from the table < 0 or >= num_blocks */

/* Appends this step's K and V (after RoPE) to a contiguous cache.
 *
 * New tokens are packed: k, v [tokens, kv_heads, head_dim] of in_dtype, row t at
 * k + t * k_stride (v + t * v_stride), k_stride, v_stride >= kv_heads * head_dim (elements; K and
 * V may be views into one fused QKV buffer). Token t belongs to sequence seq_ids[t] at position
 * positions[t] (int32 [tokens] each, on the device; the same positions RoPE uses):
 *     k_cache[s, h, p, :] = k[t, h, :],  v_cache[s, h, p, :] = v[t, h, :],  s = seq_ids[t], p = positions[t]
 * k_cache, v_cache: [batch, kv_heads, max_seq, head_dim] of cache_dtype, converted through f32
 * (round to nearest even). in_dtype and cache_dtype: f32, f16 or bf16, any pair (the usual ones:
 * equal, or f32 -> f16 / bf16). Slots not named by a token are not touched; a (sequence,
 * position) named twice in one call is written by one of them, unspecified which.
 * Errors: FL_ERR_INVALID_ARGUMENT for bad sizes or NULL pointers; on the device a token with an
 * invalid sequence or position is not written and FL_KV_ERR_* is ORed into *err_flag (may be NULL;
 * never cleared here). 16-byte vector accesses when pointers, strides and head_dim allow. */
fl_status fl_kv_append(fl_dtype in_dtype, const void *k, const void *v, int64_t k_stride,
                       int64_t v_stride, int64_t tokens, int32_t kv_heads, int32_t head_dim,
                       const int32_t *seq_ids, const int32_t *positions, fl_dtype cache_dtype,
                       void *k_cache, void *v_cache, int32_t batch, int64_t max_seq,
                       int32_t *err_flag, fl_stream stream);

/* Appends this step's K and V to a paged cache (vLLM layout). As fl_kv_append, except that the
 * caches are [num_blocks, kv_heads, block_size, head_dim] and the token of sequence s at
 * position p goes to block b = block_table[s * max_blocks_per_seq + p / block_size], slot
 * p % block_size:
 *     k_cache[b, h, p % block_size, :] = k[t, h, :]   (same for v)
 * block_table: int32 [batch, max_blocks_per_seq] on the device. A position past the table
 * (p / block_size >= max_blocks_per_seq) sets FL_KV_ERR_POSITION, a block id outside
 * [0, num_blocks) FL_KV_ERR_BLOCK; the token is not written. */
fl_status fl_kv_append_paged(fl_dtype in_dtype, const void *k, const void *v, int64_t k_stride,
                             int64_t v_stride, int64_t tokens, int32_t kv_heads, int32_t head_dim,
                             const int32_t *seq_ids, const int32_t *positions,
                             const int32_t *block_table, int32_t batch,
                             int32_t max_blocks_per_seq, fl_dtype cache_dtype, void *k_cache,
                             void *v_cache, int64_t num_blocks, int32_t block_size,
                             int32_t *err_flag, fl_stream stream);

#ifdef __cplusplus
}
#endif
#endif
