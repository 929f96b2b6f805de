/* Launchers of kernels/gemv*.cu (the C API in gemv.cu, fl_gemv_dequantize in gemv_dequant.cu;
 * included by fl_kernels.h; see its rules).
 *
 * Weight-only quantised GEMV / small GEMM for decode:
 *   y[t, r] = sum_j x[t, j] * W[r, j],   t < m, r < n, j < k,
 * x [m, k] and y [m, n] row-major, f16 or bf16 (the same dtype); W [n, k] (output-major, like
 * nn.Linear.weight) stored in one of the formats below and dequantised in registers only.
 * Products are accumulated in f32; y is rounded once to its dtype. m = 0..FL_GEMV_MAX_M.
 *
 * Formats (all row-major over n, rows of k values; k must be a multiple of 32, and of 256
 * for the K-quants):
 *  FL_GEMV_INT8     w: int8 q [n, k];         scales: f32 [n];  W[r, j] = q[r, j] * scale[r]
 *  FL_GEMV_INT4     w: u8 [n, k / 2] packed:  byte b of row r holds values j = 2b (low nibble)
 *                   and j = 2b + 1 (high nibble), each nibble q + 8 (offset binary, q in -8..7);
 *                   scales: f16 [n, k / group];  W[r, j] = (nib - 8) * scale[r, j / group]
 *  FL_GEMV_INT4_ZP  as FL_GEMV_INT4 with zeros: u8 [n, k / group] (0..15):
 *                   W[r, j] = (nib - zero[r, j / group]) * scale[r, j / group]
 *  FL_GEMV_Q8_0     w: llama.cpp block_q8_0, rows of k / 32 blocks of 34 bytes
 *                   { f16 d; int8 qs[32] }:  value i of a block = d * qs[i]
 *  FL_GEMV_Q4_0     w: llama.cpp block_q4_0, rows of k / 32 blocks of 18 bytes
 *                   { f16 d; uint8 qs[16] }: value i < 16 = d * ((qs[i] & 15) - 8),
 *                   value i + 16 = d * ((qs[i] >> 4) - 8)
 *  FL_GEMV_Q4_K    w: llama.cpp block_q4_K, rows of k / 256 super-blocks of 144 bytes
 *                   { f16 d, dmin; u8 scales[12]; u8 qs[128] }: 8 sub-blocks of 32 values
 *                   with 6-bit scale sc and min m each; value = d * sc * q - dmin * m
 *  FL_GEMV_Q5_K    w: block_q5_K, 176 bytes { f16 d, dmin; u8 scales[12]; u8 qh[32];
 *                   u8 qs[128] }: as Q4_K with a fifth bit per value from qh
 *  FL_GEMV_Q6_K    w: block_q6_K, 210 bytes { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }:
 *                   16 sub-blocks of 16 values, value = d * scale * (q - 32), q 6-bit
 *                   (bit layouts: ggml-common.h; crates/fl-kernels/src/reference/ggml.rs)
 * GGUF blocks are used as stored (no repacking): Q8_0 / Q4_0 / Q6_K blocks are only 2-byte
 * aligned, which the kernels handle (Q4_K / Q5_K super-blocks are 16-byte aligned in a
 * 16-byte aligned w). group_size (int4 only): 32, 64 or 128, dividing k; ignored otherwise.
 * scales is ignored (may be NULL) for Q8_0/Q4_0, zeros for every format but FL_GEMV_INT4_ZP.
 *
 * Alignment: x and w 16-byte aligned, y 2-byte, scales 4-byte (f32) / 2-byte (f16), else
 * FL_ERR_MISALIGNED. No output may overlap an input.
 * Errors: FL_ERR_INVALID_ARGUMENT for m outside 0..FL_GEMV_MAX_M, n < 0, k <= 0 or not a
 * multiple of 32 (256 for the K-quants), a bad group size, sizes whose products overflow
 * int64_t, an unknown format or a NULL pointer with work to do; FL_ERR_UNSUPPORTED_DTYPE for
 * a dtype other than f16/bf16. m == 0 or n == 0 launches nothing and returns FL_OK. */
#ifndef FL_GEMV_H
#define FL_GEMV_H
#include "fl_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif

/* The largest m (tokens) one launch takes. */
#define FL_GEMV_MAX_M 16

/* Weight storage formats (see above). */
typedef enum fl_gemv_format {
    FL_GEMV_INT8 = 0,
    FL_GEMV_INT4 = 1,
    FL_GEMV_INT4_ZP = 2,
    FL_GEMV_Q8_0 = 3,
    FL_GEMV_Q4_0 = 4,
    FL_GEMV_Q4_K = 5,
    FL_GEMV_Q5_K = 6,
    FL_GEMV_Q6_K = 7
} fl_gemv_format;

/* Bytes of the quantised values w (not counting scales/zeros) of an [n, k] weight in
 * `format`; -1 for a negative size, k not a multiple of 32 (256 for the K-quants), overflow or
 * an unknown format. */
int64_t fl_gemv_weight_bytes(fl_gemv_format format, int64_t n, int64_t k);

/* y = x . W^T with W quantised as `format` (see above). */
fl_status fl_gemv_quant(fl_dtype dtype, fl_gemv_format format, const void *x, const void *w,
                        const void *scales, const void *zeros, int32_t group_size, void *y,
                        int64_t m, int64_t n, int64_t k, fl_stream stream);

/* Kernels of fl_gemv_quant_path. The K-quants (FL_GEMV_Q4_K / Q5_K / Q6_K) take one kernel per
 * format on every path. Q4_K / Q5_K: tensor cores, 16 output rows per CTA whose warps split the
 * super-blocks, one mma.sync per 16 values of a sub-block on the raw quants (q + 1024 in f16,
 * q + 128 in bf16, exact), a second on all-ones giving the sub-block's sums of x, and each
 * sub-block's scale and min applied to both sums in f32 (s * (D - magic * D1) - min * D1).
 * Q6_K (2-byte aligned super-blocks): from m = 2 the same tensor-core kernel (16-value runs
 * with a signed scale each, one 2-byte aligned word a run per lane); at m = 1 CUDA cores, one
 * warp per output row, f32 FMAs on the exact integer quants, each sub-block's scale applied to
 * its sums. The other formats' kernels (every one gives the same result up to f32 rounding: the
 * summation order, and for int4 at m = 1 in the one-token kernel's 32-row CTAs of 4 warps, a
 * product on raw nibbles whose offsets (M + z) times x's group sums are subtracted per row in
 * f32):
 *   AUTO  the tensor-core side for m >= 2, for FL_GEMV_INT4 / FL_GEMV_INT4_ZP at m = 1, and
 *         for FL_GEMV_INT8 / FL_GEMV_Q8_0 / FL_GEMV_Q4_0 at m = 1 when one of the one-token
 *         kernels below takes the call (f16 and bf16 x); otherwise (e.g. Q8_0 / Q4_0 with
 *         k % 256 != 0) the CUDA-core kernel;
 *   FMA   the CUDA-core kernel (f32 FMAs, one warp per output row);
 *   MMA   the tensor-core side (mma.sync m16n8k16 on exact 16-bit integers (q - z), the
 *         scales applied in f32 outside the mma): at m = 1 kernels of their own for int8 and
 *         int4 (whole 16-byte pieces per lane, a ring of loads per warp, or on sm_90+ for int8
 *         one per CTA that the TMA engine fills) and for Q8_0 / Q4_0 with k % 256 == 0 (a CTA
 *         copies runs of 8-32 blocks of each of its 32 rows at a time, rows 16-byte aligned,
 *         by cp.async or on sm_90+ by TMA); at m = 2..16 with k % 256 == 0 kernels that copy
 *         the weights the same way with every token's x beside them and split each block or
 *         16-byte unit over 4 lanes; a general tensor-core kernel for every other shape (and
 *         where a ring kernel's shared memory does not fit). */
#define FL_GEMV_PATH_AUTO 0
#define FL_GEMV_PATH_FMA 1
#define FL_GEMV_PATH_MMA 2

/* fl_gemv_quant with the kernel chosen by the caller (FL_GEMV_PATH_*; AUTO is fl_gemv_quant
 * itself). Any other path: FL_ERR_INVALID_ARGUMENT; otherwise the same arguments, checks and
 * results. For tests and A/B benchmarks. */
fl_status fl_gemv_quant_path(fl_dtype dtype, fl_gemv_format format, const void *x, const void *w,
                             const void *scales, const void *zeros, int32_t group_size, void *y,
                             int64_t m, int64_t n, int64_t k, int32_t path, fl_stream stream);

/* Dequantise a whole weight into a dense matrix (the prefill path: past FL_GEMV_MAX_M tokens a
 * dense tensor-core GEMM reads the result), every format above:
 *   out[r, j] = dtype(W[r, j]),   r < n, j < k,
 * with W as defined above, computed in f32 ((q - z) * scale: one rounded f32 product for
 * FL_GEMV_INT8, exact for the other formats; the K-quants as ggml's dequantize_row_*, bit for
 * bit) and rounded once to dtype. out: dtype [n, k] row-major; dtype f32, f16 or bf16.
 * w, scales, zeros, group_size as for fl_gemv_quant.
 * Alignment: w and out 16-byte aligned, scales 4-byte (f32) / 2-byte (f16), else
 * FL_ERR_MISALIGNED. out may not overlap an input.
 * Errors: FL_ERR_INVALID_ARGUMENT for n < 0, k <= 0 or not a multiple of 32 (256 for the
 * K-quants), a bad group size, sizes whose products overflow int64_t, an unknown format or a
 * NULL pointer with work to do; FL_ERR_UNSUPPORTED_DTYPE for another dtype. n == 0 launches
 * nothing and returns FL_OK. */
fl_status fl_gemv_dequantize(fl_dtype dtype, fl_gemv_format format, const void *w,
                             const void *scales, const void *zeros, int32_t group_size, void *out,
                             int64_t n, int64_t k, fl_stream stream);

/* Embedding lookup straight from a quantised table (a GGUF file's token_embd in its own blocks,
 * or any weight of the formats above): out[i, :] = dtype(W[ids[i], :]) for i < n, with W the
 * [vocab, hidden] table that w, scales, zeros and group_size stand for (as fl_gemv_quant's
 * weight, n = vocab rows of k = hidden), each value exactly as fl_gemv_dequantize gives it.
 *   ids  int32 [n] (device); out [n, hidden] of dtype (f32, f16 or bf16), 16-byte aligned,
 *   overlapping no input.
 * Reads only the rows it looks up. An id outside [0, vocab) is never read: its row of out is
 * zero and, when `status` is not NULL, the failure is recorded there as fl_embedding_lookup
 * records it (FL_CHECK_TOKEN_ID, index i, value ids[i], limit min(vocab, INT32_MAX)).
 * Errors: those of fl_gemv_dequantize for the table ([vocab, hidden]: hidden a multiple of 32,
 * of 256 for the K-quants, of the group size for int4), and FL_ERR_INVALID_ARGUMENT for
 * n < 0, n > INT32_MAX, vocab < 0, n * hidden overflowing int64_t, a NULL ids / out / table
 * pointer with work to do, or status_nonce == 0 with a status; FL_ERR_MISALIGNED as
 * fl_gemv_dequantize, or for a status that is not 8-byte aligned. n == 0 launches nothing. */
fl_status fl_gemv_embedding(fl_dtype dtype, fl_gemv_format format, const int32_t *ids, int64_t n,
                            const void *w, const void *scales, const void *zeros,
                            int32_t group_size, int64_t vocab, int64_t hidden, void *out,
                            int32_t *status, uint32_t status_nonce, fl_stream stream);

/* Test hook, runs on the HOST (no GPU, no stream): fl_gemv_embedding's own per-unit code over
 * host buffers (ids on the host too), writing the f32 values before the rounding to dtype into
 * out [n, hidden]; rows of ids outside [0, vocab) are zero. Same argument checks (no alignment
 * requirement, no status). */
fl_status fl_gemv_embedding_host(fl_gemv_format format, const int32_t *ids, int64_t n,
                                 const void *w, const void *scales, const void *zeros,
                                 int32_t group_size, int64_t vocab, int64_t hidden, float *out);

/* Test hook, runs on the HOST (no GPU, no stream): fl_gemv_dequantize's own per-unit code over
 * host buffers, writing the f32 values before the rounding to dtype into out [n, k]. Same
 * argument checks (no alignment requirement). */
fl_status fl_gemv_dequantize_host(fl_gemv_format format, const void *w, const void *scales,
                                  const void *zeros, int32_t group_size, float *out, int64_t n,
                                  int64_t k);

/* Test hook, runs on the HOST (no GPU, no stream): the kernel's own unpacking code for one
 * 16-byte unit of 4-bit quants (32 values), so that CPU tests check it against the format
 * definitions above. `quants`: 16 bytes, an int4 unit (values j = 2b, 2b + 1 of byte b) or
 * the qs[16] of a Q4_0 block (value i = low nibble of qs[i], value i + 16 = high nibble).
 * out[e] = nib_e - z for e < 32 in value order, where z = 8 (FL_GEMV_INT4, FL_GEMV_Q4_0) or
 * `zero` (FL_GEMV_INT4_ZP, 0..15). FL_ERR_INVALID_ARGUMENT for another format, a zero outside
 * 0..15 or a NULL pointer. */
fl_status fl_gemv_unpack_unit_host(fl_gemv_format format, const uint8_t *quants, int32_t zero,
                                   float *out);

/* Test hook, runs on the HOST: the one-token kernel's raw-nibble unpacking (int4 at m = 1 in
 * its 4-warp CTAs of 4 tiles) of one 32-bit word of 8 nibbles (nibble i = bits 4i..4i+3), for
 * dtype FL_DTYPE_F16 or FL_DTYPE_BF16 activations: out[i] (8 floats) = the 16-bit value the
 * kernel feeds the mma for nibble i, times the odd chain's scale for odd i, less the offset
 * that the kernel subtracts per row (through x's group sums); so out[i] = nibble i exactly
 * when the offsets are right. FL_ERR_INVALID_ARGUMENT for another dtype or a NULL out. */
fl_status fl_gemv_raw_nibbles_host(fl_dtype dtype, uint32_t word, float *out);

#ifdef __cplusplus
}
#endif
#endif
