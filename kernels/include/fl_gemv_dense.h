/* Launchers of kernels/gemv_dense.cu (included by fl_kernels.h; see its rules).
 *
 * Dense (f16 / bf16) GEMV / small GEMM for decode, m = 1..FL_GEMV_DENSE_MAX_M tokens:
 *   acc[t, r] = sum_j x[t, j] * W[r, j]   (f32 accumulation, t < m, j < k),
 * x [m, k] row-major, W row-major (output-major, like nn.Linear.weight), x, W, bias and the
 * output all of `dtype` (f16 or bf16). The epilogue is fused; each output is rounded once:
 *  FL_GEMV_DENSE_LINEAR  W [n, k]; y [m, n]:  y[t, r] = acc[t, r] (+ bias[r] if bias != NULL)
 *  FL_GEMV_DENSE_SWIGLU  W [2n, k]: gate rows 0..n, then up rows n..2n; y [m, n]:
 *                        y[t, r] = silu(acc[t, r]) * acc[t, n + r],  silu(g) = g / (1 + e^-g)
 *                        (never materialises the [m, 2n] product); bias must be NULL.
 *  FL_GEMV_DENSE_ADD     W [n, k]; y [m, n] is read and written in place (a residual):
 *                        y[t, r] = f32(y[t, r]) + acc[t, r]; bias must be NULL.
 *
 * Alignment: x and W 16-byte aligned and k a multiple of 8 (16-byte rows; there is no scalar
 * path), y and bias 2-byte aligned, else FL_ERR_MISALIGNED / FL_ERR_INVALID_ARGUMENT.
 * y must not overlap x, W or bias.
 * Errors: FL_ERR_INVALID_ARGUMENT for m outside 0..FL_GEMV_DENSE_MAX_M, n < 0, k <= 0 or not
 * a multiple of 8, sizes whose products overflow int64_t, an unknown epilogue, a bias with
 * SWIGLU / ADD, or a NULL x / W / y with work to do; FL_ERR_UNSUPPORTED_DTYPE for a dtype
 * other than f16 / bf16. m == 0 or n == 0 launches nothing and returns FL_OK.
 * Tuning (bench sweeps only; read once per process, results unchanged): the environment
 * variables FL_GEMV_DENSE_WARPS (1, 2, 4, 8, 16 warps per CTA) and FL_GEMV_DENSE_NT (1 or 2
 * tiles of 8 rows per CTA, LINEAR / ADD) override the launch heuristic. */
#ifndef FL_GEMV_DENSE_H
#define FL_GEMV_DENSE_H
#include "fl_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif

/* The largest m (tokens) one launch takes (callers use a GEMM above it). */
#define FL_GEMV_DENSE_MAX_M 16

/* The fused epilogue (see above). */
typedef enum fl_gemv_dense_epilogue {
    FL_GEMV_DENSE_LINEAR = 0,
    FL_GEMV_DENSE_SWIGLU = 1,
    FL_GEMV_DENSE_ADD = 2
} fl_gemv_dense_epilogue;

/* y = epilogue(x . W^T) (see above); n = output columns (for SWIGLU: W has 2n rows). */
fl_status fl_gemv_dense(fl_dtype dtype, fl_gemv_dense_epilogue epilogue, const void *x,
                        const void *w, const void *bias, void *y, int64_t m, int64_t n,
                        int64_t k, fl_stream stream);

/* The same with the RMSNorm of the input fused in front: x is computed from h [m, k] as
 *   x[t, j] = T(h[t, j] * rstd[t] * gamma[j]),  rstd[t] = 1 / sqrt(sum_j h[t, j]^2 / k + eps)
 * (f32 math, one rounding to T: the values fl_rms_norm writes), then y = epilogue(x . W^T)
 * as above; x is never written to memory. gamma [k] of `dtype`, 16-byte aligned; eps > 0 and
 * finite. y must not overlap h (ADD: the residual read here is y, not h).
 * Errors: as fl_gemv_dense, plus FL_ERR_INVALID_ARGUMENT for a NULL gamma or a bad eps. */
fl_status fl_gemv_dense_rms_norm(fl_dtype dtype, fl_gemv_dense_epilogue epilogue, const void *h,
                                 const void *gamma, float eps, const void *w, const void *bias,
                                 void *y, int64_t m, int64_t n, int64_t k, fl_stream stream);

#ifdef __cplusplus
}
#endif
#endif
