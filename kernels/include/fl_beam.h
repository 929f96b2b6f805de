/* Launchers of kernels/beam.cu (included by fl_kernels.h; see its rules).
 *
 * One beam-search step on the device: per request, the best candidates (beam, token) over all
 * of its beams, scored by the beam's running log-probability plus the token's log-softmax.
 * The semantics are those of beam_topk in crates/fl-sampling/src/reference.rs (and of
 * fl_engine::beam's CPU step, which this step feeds).
 */
#ifndef FL_BEAM_H
#define FL_BEAM_H
#include "fl_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Most candidates kept per request (the largest max_keep): 128 covers 64 beams with the
 * 2 x num_beams candidates transformers keeps, or 42 beams with two end ids (3 x num_beams). */
#define FL_BEAM_MAX_KEEP 128

/* Bytes of scratch fl_beam_topk needs for any batch of at most `rows` rows of `vocab` tokens
 * with candidates kept up to `max_keep` per request. Depends on nothing but its arguments
 * (not the device). No initialisation needed. Returns -1 for rows < 0, vocab < 1, rows * vocab
 * > INT32_MAX or max_keep outside 1..=FL_BEAM_MAX_KEEP. */
int64_t fl_beam_topk_workspace_size(int64_t rows, int64_t vocab, int64_t max_keep);

/* One beam-search step over ragged requests.
 *
 * Request r owns the rows b in [req_start[r], req_start[r + 1]) (local beam j = b -
 * req_start[r]; bounds are clamped to [0, rows] and made non-decreasing, so any values are
 * memory-safe). For every such row and token v, in f32, with x = float(logits[b, v]):
 *   m_b     = max_v x                          (NaN ignored)
 *   lse_b   = log(sum_v exp(x - m_b))
 *   score   = beam_scores[b] + ((x - m_b) - lse_b)   (a NaN score counts as -inf)
 * i.e. torch's log_softmax of the row plus the beam's running sum. The k_r = min(keep[r],
 * max_keep, rows_r * vocab) best (score descending, ties to the smaller flat index
 * j * vocab + v) are written, best first, to
 *   out_scores[r, i] (f32) and out_ids[r, i] = j * vocab + v (int32), i < k_r;
 * entries k_r <= i < max_keep get -INFINITY and -1 (k_r = 0 when keep[r] < 1).
 * -inf logits (banned tokens) score -inf and are only chosen after every finite score, in flat
 * index order. Rows whose scores are NaN for finite logits (NaN or +inf logits, a -inf beam
 * score) give -inf scores and valid ids of the request, in an unspecified order; ids are always
 * inside the request's rows.
 *
 * Two kernels on `stream`: each (row, chunk of the vocabulary) block keeps its chunk's
 * max_keep best logits and (max, sum of exp); one block per request merges them. A candidate
 * set is chosen by logit within a row, so where two distinct logits of a row round to the
 * same score, the boundary of the kept set follows the logits (the order among kept
 * candidates is still the one above).
 *
 * logits [rows, vocab] dtype (f32, f16, bf16); beam_scores [rows] f32; req_start [n_req + 1]
 * int32; keep [n_req] int32; out_scores, out_ids [n_req, max_keep]. workspace: at least
 * fl_beam_topk_workspace_size(rows, vocab, max_keep) bytes, 8-byte aligned, not used by
 * anything else until the launch completes.
 * Errors: FL_ERR_INVALID_ARGUMENT (sizes out of range, NULL buffers, workspace too small or
 * misaligned), FL_ERR_UNSUPPORTED_DTYPE. */
fl_status fl_beam_topk(fl_dtype dtype, const void *logits, int64_t rows, int64_t vocab,
                       const float *beam_scores, const int32_t *req_start, const int32_t *keep,
                       int64_t n_req, int64_t max_keep, float *out_scores, int32_t *out_ids,
                       void *workspace, int64_t workspace_bytes, fl_stream stream);

#ifdef __cplusplus
}
#endif
#endif
