/* Launchers of kernels/softmax.cu (included by fl_kernels.h; see its rules). */
#ifndef FL_SOFTMAX_H
#define FL_SOFTMAX_H
#include "fl_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of workspace fl_softmax can use for [rows, n] (0: it never needs any). Nonzero only
 * when rows < 128 and n > 4096 (long rows split over several blocks); exactly
 * rows * ceil(n / 2048) * 8 bytes then. Depends on nothing but rows and n (not the device).
 * On sm_90+ most such shapes (n a multiple of 16 bytes' worth of elements, n <= 262144
 * f16/bf16 or 131072 f32, aligned pointers) run on thread-block clusters and use none of it. */
int64_t fl_softmax_workspace_size(int64_t rows, int64_t n);

/* Softmax over the last dimension with temperature:
 *   y[r, i] = exp((x[r, i] - m_r) / t) / sum_j exp((x[r, j] - m_r) / t),  m_r = max_j x[r, j]
 * computed in f32 and rounded once to y_dtype.
 * x: [rows, n] of x_dtype (f32, f16, bf16); y: [rows, n] of y_dtype, which is x_dtype or
 * FL_DTYPE_F32 (logits in bf16 -> probabilities in f32); any other pair:
 * FL_ERR_UNSUPPORTED_DTYPE.
 * Special values, per row: all -inf (fully masked) -> all 0; -inf elements -> 0; any NaN or
 * +inf in the row -> the whole row NaN.
 * temperature: finite and >= FLT_MIN (a normal positive f32), else FL_ERR_INVALID_ARGUMENT.
 * rows >= 0 (0 launches nothing), n >= 1, x and y non-null when rows > 0.
 * workspace: device scratch of workspace_bytes bytes (8-byte aligned), or NULL / 0. With
 * fewer bytes than fl_softmax_workspace_size(rows, n) the result is the same but few long
 * rows run on one block each (slower). The workspace must not be used by anything else
 * until the launch has completed. On sm_90+ (compute capability >= 9) long rows with
 * 4096 < n / (16 / sizeof(x)) <= 32768 vectors (aligned x, y; n a multiple of 8 for f16/bf16,
 * of 4 for f32) are done by clusters of 8 blocks per row, reading x once; the result is the
 * same either way (up to f32 summation order).
 * y may alias x when y_dtype == x_dtype (in place); no other overlap is allowed. */
fl_status fl_softmax(fl_dtype x_dtype, const void *x, fl_dtype y_dtype, void *y, int64_t rows,
                     int64_t n, float temperature, void *workspace, int64_t workspace_bytes,
                     fl_stream stream);

/* Long-row paths of fl_softmax_path (rows the register path does not take: n / vector width
 * > 4096, or n not a multiple of the vector width, or unaligned x / y):
 *   AUTO      what fl_softmax does: cluster (sm_90+, 16-byte vectors, n <= 32768 vectors),
 *             else split (with a workspace, few rows) or generic;
 *   PORTABLE  split or generic only: what runs before sm_90 (lets tests reach it on sm_90).
 * Both give the same result up to f32 summation order; only speed differs. */
#define FL_SOFTMAX_AUTO 0
#define FL_SOFTMAX_PORTABLE 1

/* fl_softmax with the long-row path chosen by the caller (FL_SOFTMAX_AUTO is fl_softmax
 * itself, FL_SOFTMAX_PORTABLE see above); any other long_path: FL_ERR_INVALID_ARGUMENT. For
 * tests. */
fl_status fl_softmax_path(fl_dtype x_dtype, const void *x, fl_dtype y_dtype, void *y,
                          int64_t rows, int64_t n, float temperature, void *workspace,
                          int64_t workspace_bytes, int32_t long_path, fl_stream stream);

#ifdef __cplusplus
}
#endif
#endif
