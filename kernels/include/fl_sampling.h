/* Launchers of kernels/sampling.cu (included by fl_kernels.h; see its rules).
 *
 * Logits processors (penalties, banned tokens, minimum length), samplers (greedy,
 * multinomial, top-k, top-p, min-p, any combination per row), counter-based Philox
 * randomness and the decoding loop's finished-flag bookkeeping.
 *
 * Conventions shared by every launcher here:
 *  - logits are [batch, vocab] row-major, dtype f32, f16 or bf16 (computed in f32);
 *    1 <= vocab <= FL_SAMPLING_MAX_VOCAB;
 *  - per-row parameters are a device array of `fl_sampling_params` [batch];
 *  - token ids are int32; an id outside [0, vocab) in a history, ban list or end-id list
 *    is skipped (negative ids serve as padding);
 *  - the semantics below are those of the CPU reference in crates/fl-sampling/src/reference.rs,
 *    which every GPU test compares with bit for bit.
 */
#ifndef FL_SAMPLING_H
#define FL_SAMPLING_H
#include "fl_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Largest vocabulary accepted: the fixed-point probability masses (2^40 per token at most)
 * of a whole row must fit in 63 bits. */
#define FL_SAMPLING_MAX_VOCAB (1 << 23)

/* Rows above this batch size are never split over several blocks (bounds the workspace). */
#define FL_SAMPLING_MAX_SPLIT_ROWS 128

/* Per-row sampling parameters (64 bytes, 16 four-byte words; the Rust side packs them).
 *  temperature        >= 0; 0 means greedy (argmax, ties to the lowest index).
 *  top_k              <= 0 or >= vocab: off. Otherwise keep every token whose logit is >= the
 *                     k-th largest logit (ties at the boundary are all kept).
 *  top_p              in (0, 1]; 1: off. Keep the smallest set of most likely tokens (after
 *                     top-k) whose probability mass reaches top_p; ties at the boundary kept.
 *  min_p              in [0, 1]; 0: off. Keep tokens with p >= min_p * p_max.
 *  repetition_penalty > 0; 1: off (HF: logit > 0 ? logit / r : logit * r).
 *  presence_penalty, frequency_penalty: OpenAI: logit -= presence * (count > 0) + frequency * count.
 *  min_new_tokens     end ids are masked (-inf) while lengths[row] < min_new_tokens.
 *  max_new_tokens     bookkeeping: a row finishes once lengths[row] reaches it; <= 0: no limit.
 *  seed, request_id   Philox key and counter words (64-bit each, split lo/hi). */
typedef struct fl_sampling_params {
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
    float repetition_penalty;
    float presence_penalty;
    float frequency_penalty;
    int32_t min_new_tokens;
    int32_t max_new_tokens;
    uint32_t seed_lo;
    uint32_t seed_hi;
    uint32_t request_lo;
    uint32_t request_hi;
    uint32_t reserved[3];
} fl_sampling_params;

/* Bytes of scratch that fl_sample needs for `batch` rows of `vocab` tokens (0 when no row
 * is ever split). The scratch must be zero-filled once when allocated; fl_sample leaves it
 * zero-ready for the next call. Returns -1 for a negative batch or a vocab out of range. */
int64_t fl_sample_workspace_size(int64_t batch, int64_t vocab);

/* Samples one token per row.
 *
 * For each row r (x = logits[r, :] in f32; NaN is treated as -inf, +inf as FLT_MAX, -0 as +0):
 *  - finished != NULL and finished[r] != 0: tokens[r] = pad_id, nothing else is read;
 *  - params == NULL, or temperature == 0, or every logit is -inf: greedy, the lowest index
 *    holding the largest logit;
 *  - otherwise: M = max x, e_i = exp_fl((x_i - M) / temperature) (exp_fl: the portable exp
 *    of the reference, identical on CPU and GPU), mass q_i = trunc(e_i * 2^40) (u64).
 *    Kept set K = { i : key(x_i) >= tau } minus { i : e_i < min_p }, where tau is the
 *    largest of the top-k threshold (k-th largest key) and the top-p threshold (largest key v
 *    with sum{q_i : key >= v, i in top-k set} >= ceil(total * trunc(top_p * 2^32) / 2^32)).
 *    With the 32-bit uniform u = Philox4x32-10(counter = {step, 0, request_lo, request_hi},
 *    key = {seed_lo, seed_hi}).x, step = steps[r] (0 when steps == NULL):
 *    target = floor(sum_K q * u / 2^32); tokens[r] = the lowest index i in K with
 *    sum_{j in K, j <= i} q_j > target (inverse CDF in token order).
 * Sort-free: a max pass, a radix select (11/11/10-bit digits, histograms of counts and
 * fixed-point masses) per threshold, one sampling pass; a row is split over several blocks
 * when the batch is small (they meet at barriers in the workspace: the grid is sized by the
 * occupancy calculator so every block is co-resident; FL_SAMPLING_NO_SPLIT=1 in the
 * environment, read once per device, turns splitting off, e.g. under SM partitioning).
 *
 * logits [batch, vocab] dtype; params [batch] or NULL; steps [batch] int32 or NULL;
 * finished [batch] uint8 or NULL; tokens [batch] int32 (written). workspace: at least
 * fl_sample_workspace_size(batch, vocab) bytes (may be NULL when that is 0).
 * Errors: FL_ERR_INVALID_ARGUMENT for sizes out of range, NULL buffers or a workspace too
 * small; FL_ERR_UNSUPPORTED_DTYPE. Parameter values are validated by the caller (Rust). */
fl_status fl_sample(fl_dtype dtype, const void *logits, int64_t batch, int64_t vocab,
                    const fl_sampling_params *params, const int32_t *steps,
                    const uint8_t *finished, int32_t pad_id, int32_t *tokens, void *workspace,
                    int64_t workspace_bytes, fl_stream stream);

/* Bytes of scratch that fl_process_logits needs for penalties over a vocab of `vocab`:
 * int32 counts for FL_PENALTY_ROWS rows at a time. Zero-fill it once when allocated; the
 * kernel leaves it zeroed. Returns -1 for a vocab out of range. */
#define FL_PENALTY_ROWS 32
int64_t fl_penalty_workspace_size(int64_t vocab);

/* Logits processors, in place, one launch, in this order per row r:
 *  1. penalties (when history != NULL and the row's penalties are not all off): for every
 *     distinct token t in history[r, 0 .. clamp(history_lens[r], 0, max_history)) with count c:
 *       x = logits[r, t]; x = x > 0 ? x / rep : x * rep;
 *       x = x - fma(frequency, (float)c, presence); logits[r, t] = x (rounded once to dtype);
 *  2. banned != NULL: logits[r, banned[r, j]] = -inf for j < max_banned;
 *  3. end_ids != NULL and params[r].min_new_tokens > lengths[r] (lengths NULL reads as 0):
 *     logits[r, end_ids[j]] = -inf for j < n_end_ids.
 * logits [batch, vocab]; params [batch] (required); history [batch, max_history] int32;
 * history_lens [batch] int32 (required with history); banned [batch, max_banned] int32;
 * lengths [batch] int32; end_ids [n_end_ids] int32; workspace: fl_penalty_workspace_size(vocab)
 * bytes, zero-filled once (required with history).
 * Errors: FL_ERR_INVALID_ARGUMENT (sizes, NULL buffers), FL_ERR_UNSUPPORTED_DTYPE. */
fl_status fl_process_logits(fl_dtype dtype, void *logits, int64_t batch, int64_t vocab,
                            const fl_sampling_params *params, const int32_t *history,
                            const int32_t *history_lens, int64_t max_history,
                            const int32_t *banned, int64_t max_banned, const int32_t *lengths,
                            const int32_t *end_ids, int64_t n_end_ids, void *workspace,
                            int64_t workspace_bytes, fl_stream stream);

/* Bookkeeping after a sampling step, one launch, for each row r:
 *  - finished[r] != 0 on entry: tokens[r] = pad_id; lengths unchanged;
 *  - else: if history != NULL and lengths[r] < max_history, history[r, lengths[r]] = tokens[r];
 *    lengths[r] += 1; finished[r] = 1 when tokens[r] is one of end_ids[0 .. n_end_ids) or
 *    (params != NULL and params[r].max_new_tokens > 0 and lengths[r] >= max_new_tokens);
 *  - all_finished[0] = 1 when every row is finished afterwards, else 0 (no host sync).
 * tokens, lengths [batch] int32; finished [batch] uint8; params [batch] or NULL;
 * end_ids [n_end_ids] or NULL; history [batch, max_history] or NULL; all_finished [1] int32
 * or NULL. Errors: FL_ERR_INVALID_ARGUMENT. */
fl_status fl_decode_update(int32_t *tokens, uint8_t *finished, int32_t *lengths, int64_t batch,
                           const fl_sampling_params *params, const int32_t *end_ids,
                           int64_t n_end_ids, int32_t pad_id, int32_t *history,
                           int64_t max_history, int32_t *all_finished, fl_stream stream);

/* out[r * 4 + j] = word j of Philox4x32-10(counter = {steps[r], 0, request_lo, request_hi},
 * key = {seed_lo, seed_hi}) of params[r] (steps NULL reads as 0); fl_sample uses word 0.
 * For tests and for callers that want the same stream. out [batch, 4] uint32.
 * Errors: FL_ERR_INVALID_ARGUMENT. */
fl_status fl_philox_words(const fl_sampling_params *params, const int32_t *steps,
                          int64_t batch, uint32_t *out, fl_stream stream);

#ifdef __cplusplus
}
#endif
#endif
