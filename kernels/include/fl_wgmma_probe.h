/* Launchers of kernels/wgmma_probe.cu (included by fl_kernels.h; see its rules).
 *
 * Building blocks of the Hopper wgmma prefill attention (64 queries x 128 keys per tile,
 * head_dim 128), checked one at a time by crates/fl-kernels/tests/wgmma_probe.rs (not an op:
 * test support). One CTA of one warpgroup each; all matrices row-major, contiguous; q, k, v
 * f16, p and the outputs f32.
 *   fl_wgmma_probe_qk: s [64, 128] = q [64, 128] . k [128, 128]^T
 *   fl_wgmma_probe_pv: o [64, 128] = half(p [64, 128]) . v [128, 128]
 * fl_wgmma_probe_qk uses 49 KB of dynamic shared memory (opted in here with
 * cudaFuncSetAttribute, which does not synchronise). On a device without sm_90a code (no
 * wgmma) the outputs are all NaN.
 * Errors: FL_ERR_INVALID_ARGUMENT (a NULL pointer), FL_ERR_MISALIGNED (q, k, v not 16-byte
 * aligned), or the CUDA error of the shared-memory opt-in or the launch. */
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
