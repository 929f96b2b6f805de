/* Launchers of kernels/attention_prefill.cu (included by fl_kernels.h; see its rules). */
#ifndef FL_ATTENTION_PREFILL_H
#define FL_ATTENTION_PREFILL_H
#include "fl_kernels.h"
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

#ifdef __cplusplus
}
#endif
#endif
