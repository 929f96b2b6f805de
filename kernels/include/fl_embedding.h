/* Launchers of kernels/embedding.cu (included by fl_kernels.h; see its rules). */
#ifndef FL_EMBEDDING_H
#define FL_EMBEDDING_H
#include "fl_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- device status
 * A device status is a caller-owned device buffer of FL_DEVICE_STATUS_WORDS int32_t,
 * 8-byte aligned, all zero when clean. Launchers that check their data on the device
 * (token ids, sequence lengths) take one (it may be NULL: then failures are not reported)
 * plus a nonzero `status_nonce` that is unique per launch since the last reset; a failing
 * thread records (device helper fl::record_failure):
 *   words 0-1  uint64  number of failed checks since the last reset (every launch)
 *   word  2    uint32  nonce of the first launch that failed (0: none)
 *   word  3    int32   FL_CHECK_* code of that launch's check
 *   words 4-5  uint64  ~((uint64)index << 32 | (uint32)value) of that launch's failure with
 *                      the smallest index (so the largest stored key wins; 0: none)
 *   word  6    int32   the limit the value was checked against
 *   word  7    reserved (0)
 * Nothing is synchronised: the host reads the buffer when it chooses (after the launch
 * has completed) and clears it (memset 0) to reset. */
#define FL_DEVICE_STATUS_WORDS 8
/* index = token position, value = token id, limit = vocab (valid: 0 <= id < vocab). */
#define FL_CHECK_TOKEN_ID 1
/* index = sequence, value = length, limit = max_len (valid: 0 <= length <= max_len). */
#define FL_CHECK_SEQ_LEN 2

/* ---------------------------------------------------------------- embedding.cu */

/* Embedding lookup: out[i, :] = table[ids[i], :] for i < n.
 *   ids    int32 [n] (device)
 *   table  [vocab, hidden] of dtype (f32, f16 or bf16), row-major
 *   out    [n, hidden] of dtype; must not overlap table or ids
 * A row is a raw copy (bit-exact), moved in 16-byte words when both base pointers are
 * 16-byte aligned and hidden * sizeof(dtype) is a multiple of 16 (else 8/4/2-byte words).
 * An id outside [0, vocab) is never read: out[i, :] is set to zero and, when `status` is
 * not NULL, the failure is recorded there (FL_CHECK_TOKEN_ID, index i, value ids[i],
 * limit min(vocab, INT32_MAX)).
 * Errors: FL_ERR_INVALID_ARGUMENT for n < 0, n > INT32_MAX, vocab < 0, hidden < 1, a NULL
 * pointer with n > 0, status_nonce == 0 with a status, or a row too long for the grid
 * (hidden * sizeof(dtype) > 65535 * 1024 words);
 * FL_ERR_MISALIGNED for a status that is not 8-byte aligned; FL_ERR_UNSUPPORTED_DTYPE.
 * n == 0 launches nothing. */
fl_status fl_embedding_lookup(fl_dtype dtype, const int32_t *ids, int64_t n, const void *table,
                              int64_t vocab, int64_t hidden, void *out, int32_t *status,
                              uint32_t status_nonce, fl_stream stream);

#ifdef __cplusplus
}
#endif
#endif
