/* Launchers of kernels/wgmma_probe.cu (included by fl_kernels.h; see its rules).
 *
 * Building blocks of a Hopper wgmma prefill attention, checked one at a time by
 * crates/fl-kernels/tests/wgmma_probe.rs (not an op: test support for the kernel to come).
 * One CTA of one warpgroup each; all matrices row-major, contiguous, f16 inputs, f32 outputs.
 *   fl_wgmma_probe_qk: s [64, 64] = q [64, 128] . k [64, 128]^T
 *   fl_wgmma_probe_pv: o [64, 128] = half(p [64, 64]) . v [64, 128]
 * On a device without sm_90a code (no wgmma) the outputs are all NaN.
 * Errors: FL_ERR_INVALID_ARGUMENT (a NULL pointer), FL_ERR_MISALIGNED (q, k, v not 16-byte
 * aligned). */
#ifndef FL_WGMMA_PROBE_H
#define FL_WGMMA_PROBE_H
#include "fl_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif

fl_status fl_wgmma_probe_qk(const void *q, const void *k, float *s, fl_stream stream);
fl_status fl_wgmma_probe_pv(const float *p, const void *v, float *o, fl_stream stream);

#ifdef __cplusplus
}
#endif
#endif
