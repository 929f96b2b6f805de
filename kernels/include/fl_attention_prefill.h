/* Launchers of kernels/attention_prefill.cu (included by fl_kernels.h; see its rules). */
#ifndef FL_ATTENTION_PREFILL_H
#define FL_ATTENTION_PREFILL_H
#include "fl_kernels.h"
#include "fl_attention.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Causal prefill attention over packed, padding-free sequences (FlashAttention-2 style).
 *
 * Sequence b owns the tokens [cu_seqlens[b], cu_seqlens[b + 1]) of the packed tensors; for
 * its query at position i (0-based within the sequence) and q head h:
 *
 *   out[s + i, h, :] = sum_j softmax_j(scale * q[s + i, h, :] . k[s + j, h / group, :]) v[s + j, h / group, :]
 *
 * over the keys j of the same sequence with j <= i (causal) and, when window > 0,
 * j > i - window (the last `window` positions, the query's own included). s = cu_seqlens[b],
 * group = q_heads / kv_heads (GQA; MHA when 1, MQA when q_heads); K/V are read in place
 * for all the q heads of a group, never duplicated. Softmax and accumulation in f32.
 * f16/bf16: products on tensor cores (P rounded to the dtype for P V); f32: everything in
 * f32 on CUDA cores (no TF32), for fp32 runs that must match an fp32 reference.
 *
 *   q, out      [total_tokens, q_heads, head_dim], dtype (f32, f16 or bf16), contiguous
 *   k, v        [total_tokens, kv_heads, head_dim], same dtype and packing
 *   cu_seqlens  i32 [batch + 1] on the device: 0 = cu[0] <= cu[1] <= ... <= cu[batch]
 *   head_dim    64, 80, 96, 128 or 256; q_heads % kv_heads == 0
 *   max_seq_len host-known upper bound on every sequence length, in [1, total_tokens]; it
 *               sizes the grid. PRECONDITION (the caller guarantees it; the kernel cannot
 *               report it): no sequence is longer. Rows past max_seq_len are not written.
 *   scale       softmax scale, finite and > 0 (usually 1 / sqrt(head_dim))
 *   window      sliding window in tokens; 0 = unlimited
 * Whatever cu_seqlens holds, the kernel never reads or writes outside the tensors: each
 * [cu[b], cu[b+1]) is clamped to [0, total_tokens] (an inverted range is empty).
 * Pointers 16-byte aligned (FL_ERR_MISALIGNED); out must not alias q, k or v.
 * Returns FL_ERR_INVALID_ARGUMENT on a bad size, dtype, head_dim, scale or a null pointer;
 * batch == 0 is a no-op. Needs up to 70 KB (f16/bf16) or 100 KB (f32) of dynamic shared
 * memory per CTA (set here with cudaFuncSetAttribute, which does not synchronise). */
typedef struct fl_prefill_attention_args {
    fl_dtype dtype;
    int32_t batch, q_heads, kv_heads, head_dim;
    int32_t total_tokens;
    const void *q;
    const void *k;
    const void *v;
    void *out;
    const int32_t *cu_seqlens;
    int32_t max_seq_len;
    float scale;
    int32_t window;
} fl_prefill_attention_args;

fl_status fl_attention_prefill(const fl_prefill_attention_args *args, fl_stream stream);

/* Kernels of fl_attention_prefill_kernel (the same result up to f32 summation order and the
 * rounding of P; only speed differs):
 *   AUTO      what fl_attention_prefill does: on sm_90 (sm_90a code in the build) with
 *             head_dim 128, f16 / bf16, the wgmma + TMA kernel; every other call the
 *             mma.sync kernel (f32: its CUDA-core version);
 *   MMA_SYNC  the mma.sync kernel always: what runs before sm_90 and at other head sizes,
 *             so that tests reach it at head_dim 128 on sm_90. */
#define FL_PREFILL_KERNEL_AUTO 0
#define FL_PREFILL_KERNEL_MMA_SYNC 1

/* fl_attention_prefill with the kernel chosen by the caller (FL_PREFILL_KERNEL_*); any other
 * value: FL_ERR_INVALID_ARGUMENT. For tests. */
fl_status fl_attention_prefill_kernel(const fl_prefill_attention_args *args, int32_t kernel,
                                      fl_stream stream);

/* Non-causal (bidirectional) prefill attention over packed, padding-free sequences: encoders
 * (BERT, RoBERTa; FasterTransformer's Effective Transformer layout, no padded token computed).
 * fl_attention_prefill with every query attending to every key of its own sequence:
 *
 *   out[s + i, h, :] = sum_j softmax_j(scale * q[s + i, h, :] . k[s + j, h / group, :]) v[s + j, h / group, :]
 *
 * over all j in [0, len_b). Same args, kernels (AUTO: the wgmma kernel on sm_90 at head_dim 128
 * in f16 / bf16, else mma.sync; f32 on CUDA cores), numerics, bounds and errors as
 * fl_attention_prefill, except:
 *   head_dim    32, 64 or 128
 *   window      must be 0 (FL_ERR_INVALID_ARGUMENT otherwise)
 * As there, the wgmma kernel reads K/V in 128-token boxes that may take the next sequence's
 * rows: masked out, but a NaN or Inf in its V rows would reach this sequence (0 * Inf). */
fl_status fl_attention_prefill_bidirectional(const fl_prefill_attention_args *args,
                                             fl_stream stream);

/* fl_attention_prefill_bidirectional with the kernel chosen by the caller (FL_PREFILL_KERNEL_*,
 * as fl_attention_prefill_kernel). For tests. */
fl_status fl_attention_prefill_bidirectional_kernel(const fl_prefill_attention_args *args,
                                                    int32_t kernel, fl_stream stream);

/* Causal prefill attention of new query tokens over a KV cache that already holds them:
 * chunked prefill and mixed prefill + decode steps (FlashInfer's BatchPrefillWithPagedKVCache).
 *
 * Sequence b has q_len_b = cu_seqlens_q[b + 1] - cu_seqlens_q[b] new tokens, rows
 * [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of the packed q / out, at positions
 * ctx_b - q_len_b .. ctx_b - 1 with ctx_b = ctx_lens[b]; the cache holds the K/V of all ctx_b
 * positions (the new tokens' included: append them first, fl_kv_append_paged). For the new
 * token i (position p = ctx_b - q_len_b + i) and q head h:
 *
 *   out[s + i, h, :] = sum_j softmax_j(scale * q[s + i, h, :] . K[b, h / group, j, :]) V[b, h / group, j, :]
 *
 * over the cached positions j <= p (causal) and, when window > 0, j > p - window.
 * s = cu_seqlens_q[b], group = q_heads / kv_heads. K[b, h, j, :] is read per `layout` as
 * fl_attention_decode reads it (FL_KV_PAGED: row j % kv_block_size of block
 * block_table[b * max_blocks_per_seq + j / kv_block_size]; FL_KV_CONTIGUOUS: row j of
 * sequence b, capacity kv_block_size). Same kernel, tiles and numerics as
 * fl_attention_prefill's mma.sync kernel (f32: its CUDA-core version); q_len_b == 1 is a
 * decode token; q_len_b == 0 writes nothing.
 *
 *   q, out        [total_q, q_heads, head_dim], dtype (f32, f16 or bf16), contiguous
 *   k, v          FL_KV_PAGED: [num_blocks, kv_heads, kv_block_size, head_dim];
 *                 FL_KV_CONTIGUOUS: [num_blocks (= the cache's batch), kv_heads, kv_block_size,
 *                 head_dim]; same dtype as q
 *   cu_seqlens_q  i32 [batch + 1] on the device, non-decreasing (clamped to [0, total_q])
 *   ctx_lens      i32 [batch] on the device; ctx_lens[b] >= q_len_b (PRECONDITION: a smaller
 *                 one gives zeros for the rows before position 0), clamped to the capacity
 *                 kv_block_size * max_blocks_per_seq (contiguous: kv_block_size)
 *   block_table   i32 [batch, max_blocks_per_seq] on the device (paged only); any kv_block_size
 *                 >= 1. A block id outside [0, num_blocks) is never read: its keys read as
 *                 zero vectors (score 0, value 0), so pass only valid ids for the blocks a
 *                 sequence uses; entries past ceil(ctx_b / kv_block_size) are never read.
 *   max_q_len     host-known bound on every q_len_b, in [0, total_q] (0: no-op); sizes the
 *                 grid. PRECONDITION: no sequence has more new tokens (their later rows would
 *                 be left unwritten).
 *   scale, window as fl_attention_prefill.
 * Rows of out not covered by a sequence are not written. Pointers 16-byte aligned
 * (FL_ERR_MISALIGNED); out must not alias q or the cache. Returns FL_ERR_INVALID_ARGUMENT on a
 * bad size, dtype, head_dim, layout, scale, a capacity above INT32_MAX or a null pointer;
 * batch == 0 is a no-op. Shared memory as fl_attention_prefill's mma.sync kernel. */
typedef struct fl_prefill_paged_attention_args {
    fl_dtype dtype;
    int32_t batch, q_heads, kv_heads, head_dim;
    int32_t total_q;
    const void *q;
    const void *k;
    const void *v;
    void *out;
    const int32_t *cu_seqlens_q;
    const int32_t *ctx_lens;
    int32_t max_q_len;
    fl_kv_layout layout;
    int32_t kv_block_size;        /* paged: tokens per block; contiguous: the capacity */
    const int32_t *block_table;   /* paged only */
    int32_t max_blocks_per_seq;   /* paged only */
    int32_t num_blocks;           /* paged: blocks in the pool; contiguous: the cache's batch */
    float scale;
    int32_t window;
} fl_prefill_paged_attention_args;

fl_status fl_attention_prefill_paged(const fl_prefill_paged_attention_args *args,
                                     fl_stream stream);

#ifdef __cplusplus
}
#endif
#endif
