/* Launchers of kernels/padding.cu (included by fl_kernels.h; see its rules). */
#ifndef FL_PADDING_H
#define FL_PADDING_H
#include "fl_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Largest batch fl_padding_offsets accepts: the scan runs in each block, with the
 * batch + 1 prefix sums held in shared memory (32 KiB). */
#define FL_PADDING_MAX_BATCH 8192

/* Packed-token layout of a ragged batch (Effective Transformer, FasterTransformer v2.1),
 * built on the device in one launch from lengths int32 [batch] (device):
 *   len_b         = clamp(lengths[b], 0, max_len)
 *   cu_seqlens[b] = sum_{j < b} len_j  for b <= batch   (int32 [batch + 1], cu[0] = 0)
 *   total[0]      = cu_seqlens[batch]                    (int32 [1]: the packed token count)
 *   token_map[cu_seqlens[b] + t] = b * max_len + t  for t < len_b  (int32 [map_capacity];
 *                   the padded row of each packed token; entries >= total are left as
 *                   they were, and entries at >= map_capacity are not written)
 * Sizing: with lengths known on the host, map_capacity = total is exact; otherwise use the
 * bound batch * max_len (total <= batch * max_len always) and read total when needed.
 * A length outside [0, max_len] is clamped as above and, when `status` is not NULL,
 * recorded there (FL_CHECK_SEQ_LEN, index b, value lengths[b], limit max_len; device status
 * layout in fl_embedding.h); the launch that follows sees only in-range indices.
 * Errors: FL_ERR_INVALID_ARGUMENT for batch < 0, batch > FL_PADDING_MAX_BATCH, max_len < 0,
 * batch * max_len > INT32_MAX, map_capacity < 0, a NULL pointer that is needed, or
 * status_nonce == 0 with a status; FL_ERR_MISALIGNED for a status not 8-byte aligned. */
fl_status fl_padding_offsets(const int32_t *lengths, int32_t batch, int32_t max_len,
                             int32_t *cu_seqlens, int32_t *token_map, int64_t map_capacity,
                             int32_t *total, int32_t *status, uint32_t status_nonce,
                             fl_stream stream);

/* Remove padding: packed[i, :] = padded[token_map[i], :] for i < min(packed_rows, total[0]);
 * rows i >= total[0] of packed are not written.
 *   padded     [batch, max_len, hidden] of dtype (f32, f16, bf16)
 *   token_map  int32 [>= packed_rows] (from fl_padding_offsets)
 *   total      int32 [1] (device, from fl_padding_offsets), or NULL to copy all packed_rows
 *   packed     [packed_rows, hidden] of dtype; must not overlap padded
 * A raw row copy (bit-exact), 16-byte words when pointers and the row size allow. A map
 * entry outside [0, batch * max_len) is never read from: that packed row is set to zero.
 * Errors: FL_ERR_INVALID_ARGUMENT for negative sizes, hidden < 1, batch * max_len > INT32_MAX,
 * packed_rows > INT32_MAX, NULL pointers with packed_rows > 0, or a row too long for the
 * grid; FL_ERR_UNSUPPORTED_DTYPE. packed_rows == 0 launches nothing. */
fl_status fl_remove_padding(fl_dtype dtype, const void *padded, int32_t batch, int32_t max_len,
                            int64_t hidden, const int32_t *token_map, const int32_t *total,
                            int64_t packed_rows, void *packed, fl_stream stream);

/* Rebuild padding: for b < batch, t < max_len, with len_b = cu_seqlens[b+1] - cu_seqlens[b]:
 *   padded[b, t, :] = packed[cu_seqlens[b] + t, :]  if t < len_b
 *                   = 0                             otherwise (padding)
 * Every padded row is written exactly once (no separate memset).
 *   packed      [packed_rows, hidden] of dtype (f32, f16, bf16)
 *   cu_seqlens  int32 [batch + 1] (from fl_padding_offsets)
 *   padded      [batch, max_len, hidden] of dtype; must not overlap packed
 * A packed row index outside [0, packed_rows) is never read from: that row is zero.
 * Errors: FL_ERR_INVALID_ARGUMENT for negative sizes, hidden < 1, batch * max_len > INT32_MAX,
 * NULL pointers where rows are written, or a row too long for the grid;
 * FL_ERR_UNSUPPORTED_DTYPE. batch * max_len == 0 launches nothing. */
fl_status fl_rebuild_padding(fl_dtype dtype, const void *packed, int64_t packed_rows,
                             const int32_t *cu_seqlens, int32_t batch, int32_t max_len,
                             int64_t hidden, void *padded, fl_stream stream);

#ifdef __cplusplus
}
#endif
#endif
