/* Launchers of kernels/kv_cache.cu (included by fl_kernels.h; see its rules). */
#ifndef FL_KV_CACHE_H
#define FL_KV_CACHE_H
#include "fl_kernels.h"
#include "fl_rope.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Bits ORed into the error flag by the append launchers; the token at fault is not written. */
#define FL_KV_ERR_SEQUENCE 1 /* seq_ids[t] < 0 or >= batch */
#define FL_KV_ERR_POSITION 2 /* positions[t] < 0, or >= max_seq (contiguous), or
                                positions[t] / block_size >= max_blocks_per_seq (paged) */
#define FL_KV_ERR_BLOCK 4    /* paged: block id from the table < 0 or >= num_blocks;
                                fl_kv_copy_blocks: a src or dst outside [0, num_blocks) */

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

/* Fused QKV split + rotary embedding + KV-cache append (contiguous cache), one launch.
 *
 * qkv: in_dtype, token t's row at qkv + t * qkv_stride (elements, qkv_stride >=
 * (q_heads + 2 kv_heads) * head_dim): q_heads q heads, then kv_heads k heads, then kv_heads v
 * heads, head_dim = params->head_dim each (the layout of one GEMM with the stacked
 * [q; k; v] weight). With s = seq_ids[t], p = positions[t] (int32 [tokens] each, on the device)
 * and R(x) = x rotated as fl_rope_apply does with params at position p (computed angles:
 * a = (float)p * params->inv_freq[i], accurate sincosf, y0 = fma(x0, cos, -(x1 * sin)),
 * y1 = fma(x1, cos, x0 * sin), rounded to in_dtype; elements past rotary_dim copied):
 *     q_out[t, h, :]        = R(q[t, h, :])                        h < q_heads
 *     k_cache[s, h, p, :]   = cache_dtype(R(k[t, h, :]))           h < kv_heads
 *     v_cache[s, h, p, :]   = cache_dtype(v[t, h, :])
 *     k_out[t, h, :] = R(k[t, h, :]),  v_out[t, h, :] = v[t, h, :]   (when not NULL)
 * bit for bit what fl_rope_apply on q and k followed by fl_kv_append gives.
 * q_out: in_dtype [tokens, q_heads, head_dim] (may be NULL when q_heads == 0); k_out, v_out:
 * in_dtype [tokens, kv_heads, head_dim] or NULL (each independently); k_cache, v_cache:
 * cache_dtype [batch, kv_heads, max_seq, head_dim]. in_dtype, cache_dtype: f32, f16 or bf16,
 * any pair. No output may overlap qkv or another output.
 * params: as fl_rope_apply (head_dim >= 1; rotary_dim even, 2..head_dim, <= 2 *
 * FL_ROPE_MAX_PAIRS; interleaved 0 or 1). q_heads >= 0, kv_heads >= 1,
 * (q_heads + 2 kv_heads) * head_dim <= INT32_MAX.
 * Errors: FL_ERR_INVALID_ARGUMENT for bad sizes, params or NULL pointers. On the device a token
 * whose slot is invalid (as fl_kv_append: FL_KV_ERR_SEQUENCE, FL_KV_ERR_POSITION, which
 * includes a negative position) writes nothing at all (not q_out, k_out, v_out nor the cache)
 * and ORs the bit into *err_flag (may be NULL; never cleared here).
 * One CTA per (token, group of heads); 16-byte vector accesses (of the wider dtype) when the
 * pointers, qkv_stride, head_dim and the rotary split allow, a scalar path otherwise. */
fl_status fl_kv_rope_append(fl_dtype in_dtype, const void *qkv, int64_t qkv_stride,
                            int64_t tokens, int32_t q_heads, int32_t kv_heads,
                            const fl_rope_params *params, const int32_t *seq_ids,
                            const int32_t *positions, void *q_out, void *k_out, void *v_out,
                            fl_dtype cache_dtype, void *k_cache, void *v_cache, int32_t batch,
                            int64_t max_seq, int32_t *err_flag, fl_stream stream);

/* fl_kv_rope_append into a paged cache [num_blocks, kv_heads, block_size, head_dim] through
 * block_table (int32 [batch, max_blocks_per_seq], on the device), slot rules and error bits as
 * fl_kv_append_paged:
 *     k_cache[b, h, p % block_size, :] = cache_dtype(R(k[t, h, :])),  b = block_table[s, p / block_size]
 * (same for v, unrotated). A token with an invalid slot writes nothing anywhere. */
fl_status fl_kv_rope_append_paged(fl_dtype in_dtype, const void *qkv, int64_t qkv_stride,
                                  int64_t tokens, int32_t q_heads, int32_t kv_heads,
                                  const fl_rope_params *params, const int32_t *seq_ids,
                                  const int32_t *positions, void *q_out, void *k_out,
                                  void *v_out, const int32_t *block_table, int32_t batch,
                                  int32_t max_blocks_per_seq, fl_dtype cache_dtype,
                                  void *k_cache, void *v_cache, int64_t num_blocks,
                                  int32_t block_size, int32_t *err_flag, fl_stream stream);

/* Copies whole blocks of one layer's paged K and V caches (copy-on-write of blocks shared by
 * forked sequences or beams), all pairs in one launch:
 *     k_cache[dst, :, :, :] = k_cache[src, :, :, :],  v_cache[dst] = v_cache[src]
 * for each (src, dst) = (pairs[2 i], pairs[2 i + 1]), i < n (pairs: int32 [n, 2] on the
 * device). k_cache, v_cache: [num_blocks, kv_heads, block_size, head_dim] of dtype, so a block
 * is kv_heads * block_size * head_dim contiguous elements. A raw copy (bit-exact): any fl_dtype,
 * including byte-sized quantised caches.
 * Precondition (the block manager's): the dst ids are distinct and none is also a src in the
 * same call (so src != dst); src ids may repeat (one block copied to several forks). Otherwise
 * the result is unspecified.
 * Errors: FL_ERR_INVALID_ARGUMENT for sizes < 1 (n < 0), a cache past INT64_MAX bytes, a block
 * past the grid (more than 65535 chunks of 1024 words) or NULL pointers (none is read when
 * n == 0, a no-op); FL_ERR_UNSUPPORTED_DTYPE for an unknown dtype.
 * On the device a pair with src or dst outside [0, num_blocks) copies nothing and ORs
 * FL_KV_ERR_BLOCK into *err_flag (may be NULL; never cleared here).
 * One CTA per (pair, chunk of a block, K or V); 16-byte words when both cache pointers and the
 * block size in bytes are multiples of 16 (else the widest of 8/4/2/1 that fits). */
fl_status fl_kv_copy_blocks(fl_dtype dtype, void *k_cache, void *v_cache, int64_t num_blocks,
                            int32_t kv_heads, int32_t block_size, int32_t head_dim,
                            const int32_t *pairs, int32_t n, int32_t *err_flag,
                            fl_stream stream);

#ifdef __cplusplus
}
#endif
#endif
