/* Launchers of kernels/attention_decode.cu (included by fl_kernels.h; see its rules). */
#ifndef FL_ATTENTION_H
#define FL_ATTENTION_H
#include "fl_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Layout of the KV cache read by decode attention (same layouts as kv_cache.cu writes). */
typedef enum fl_kv_layout {
    /* K, V each [batch, kv_heads, max_seq, head_dim]; kv_block_size = max_seq. */
    FL_KV_CONTIGUOUS = 0,
    /* K, V each [num_blocks, kv_heads, block_size, head_dim]; block_table i32
       [batch, max_blocks_per_seq]; position p of sequence b lives in block
       block_table[b * max_blocks_per_seq + p / block_size], slot p % block_size. */
    FL_KV_PAGED = 1
} fl_kv_layout;

/* Decode attention: one query token per sequence against its KV cache.
 *
 *   out[b, h, :] = sum_j softmax_j(scale * q[b, h, :] . K[b, h / group, j, :]) V[b, h / group, j, :]
 *
 * over keys j in [lo, len_b), len_b = seq_lens[b] (the cache already holds the current token),
 * lo = max(0, len_b - window) when window > 0, else 0. group = q_heads / kv_heads (GQA; MHA
 * when 1, MQA when q_heads). A sequence with len_b == 0 gets zeros.
 *
 *   q, out   [batch, q_heads, head_dim], dtype (f32, f16 or bf16), contiguous
 *   k, v     per `layout`, same dtype
 *   seq_lens i32 [batch], each in [0, max_seq_len]; values above capacity are clamped to it
 *   head_dim 64, 80, 96, 128 or 256; q_heads % kv_heads == 0
 *   num_splits: sequence splits (flash-decoding); 0 = choose from the shape and sm_count.
 *   workspace:  fl_attention_decode_workspace_size(...) bytes (may be NULL when that is 0),
 *               16-byte aligned.
 * Math in f32 whatever the dtype: scores, online softmax (base 2), sums. f16/bf16 with
 * q_heads / kv_heads even run the products on tensor cores (P rounded to the dtype for P V),
 * as does MHA at head_dim 128 on sm_90 when batch * kv_heads >= 128 and max_seq_len >= 4096;
 * f32 (any group) and odd groups run on CUDA cores, f32 reading the cache as 4-byte values.
 * Pointers 16-byte aligned (FL_ERR_MISALIGNED).
 * Returns FL_ERR_INVALID_ARGUMENT on a bad size, dtype, layout or a too small workspace. */
typedef struct fl_decode_attention_args {
    fl_dtype dtype;
    int32_t batch, q_heads, kv_heads, head_dim;
    const void *q;
    const void *k;
    const void *v;
    void *out;
    const int32_t *seq_lens;
    int32_t max_seq_len;   /* host-known bound on seq_lens; sizes the split */
    fl_kv_layout layout;
    int32_t kv_block_size; /* paged: tokens per block; contiguous: max_seq (the cache capacity) */
    const int32_t *block_table;      /* paged only */
    int32_t max_blocks_per_seq;      /* paged only */
    int32_t num_blocks;              /* paged only: blocks in the pool (ids checked < it) */
    float scale;
    int32_t window;        /* sliding window in tokens; 0 = unlimited */
    int32_t num_splits;    /* 0 = auto */
    int32_t sm_count;      /* used by auto split; 0 = assume 132 */
} fl_decode_attention_args;

/* Splits that `fl_attention_decode` will use for these args (after auto choice). */
int32_t fl_attention_decode_num_splits(const fl_decode_attention_args *args);

/* Scratch bytes needed for these args (0 when a single split is used). */
int64_t fl_attention_decode_workspace_size(const fl_decode_attention_args *args);

/* `workspace`: 16-byte aligned, at least fl_attention_decode_workspace_size bytes, and
 * zero-filled once when allocated: its first 4 KB hold the split kernel's arrival counters
 * (a small split combine runs in the last CTA of each group), which every call leaves at zero
 * again, so one workspace serves every later call on the same stream whatever its shape. */
fl_status fl_attention_decode(const fl_decode_attention_args *args, void *workspace,
                              int64_t workspace_bytes, fl_stream stream);

#ifdef __cplusplus
}
#endif
#endif
