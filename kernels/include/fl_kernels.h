/*
 * fl_kernels.h: the C ABI of every FasterLLaMA-rs CUDA launcher.
 *
 * Rules (DESIGN.md, "The C ABI"):
 *  - plain C types only: device pointers, int64_t sizes, a cudaStream_t passed as void*;
 *  - a launcher never allocates and never synchronises;
 *  - every launcher returns an fl_status: FL_OK, a negative fl error (bad argument or
 *    dtype, checked before launch) or a positive cudaError_t from the launch;
 *  - scratch needs are queried with *_workspace_size and passed in by the caller.
 *
 * bindgen reads this file; only names starting with fl_ / FL_ are exported to Rust.
 */
#ifndef FL_KERNELS_H
#define FL_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status of a launcher: 0 ok, < 0 an fl error, > 0 a cudaError_t value. */
typedef int32_t fl_status;
#define FL_OK 0
#define FL_ERR_INVALID_ARGUMENT (-1)
#define FL_ERR_UNSUPPORTED_DTYPE (-2)
#define FL_ERR_MISALIGNED (-3)

/* Element types; Rust's DType trait maps each type to one of these. */
typedef enum fl_dtype {
    FL_DTYPE_F32 = 0,
    FL_DTYPE_F16 = 1,
    FL_DTYPE_BF16 = 2,
    FL_DTYPE_I8 = 3,
    FL_DTYPE_I32 = 4,
    FL_DTYPE_U8 = 5
} fl_dtype;

/* cudaStream_t as an opaque pointer (the driver's CUstream is the same handle). */
typedef void *fl_stream;

/* The message for a positive fl_status (a cudaError_t); a static string, never NULL. */
const char *fl_cuda_error_string(fl_status status);

/* Version of the compiled kernel library: major * 10000 + minor * 100 + patch. */
int32_t fl_kernels_version(void);

/* ---------------------------------------------------------------- elementwise.cu */

/* out[i] = a[i] + b[i] for i < n; dtype f32, f16 or bf16 (computed in f32).
 * out may alias a or b. */
fl_status fl_add(fl_dtype dtype, const void *a, const void *b, void *out, int64_t n,
                 fl_stream stream);

/* dst[i] = (dst_dtype) src[i] for i < n, between f32, f16 and bf16 (round to nearest even). */
fl_status fl_cast(fl_dtype src_dtype, const void *src, fl_dtype dst_dtype, void *dst, int64_t n,
                  fl_stream stream);

/* Asks the L2 cache to fetch bytes [p, p + bytes) ahead of a kernel that will read them (e.g. the
 * next projection's weights, issued before a short kernel that leaves DRAM idle). A hint: the
 * kernel issues the requests (cp.async.bulk.prefetch.L2 on sm_90+, prefetch.global.L2 before)
 * and ends without waiting for them; nothing is written; bytes past the last whole 16-byte unit
 * are not requested. p must be 16-byte aligned (FL_ERR_MISALIGNED); bytes >= 0. */
fl_status fl_prefetch_l2(const void *p, int64_t bytes, fl_stream stream);

#ifdef __cplusplus
}
#endif

/* ---------------------------------------------------------------- op families */
#include "fl_norm.h"
#include "fl_softmax.h"
#include "fl_rope.h"
#include "fl_kv_cache.h"
#include "fl_embedding.h"
#include "fl_activation.h"
#include "fl_padding.h"
#include "fl_sampling.h"
#include "fl_beam.h"
#include "fl_attention.h"
#include "fl_attention_prefill.h"
#include "fl_wgmma_probe.h"
#include "fl_gemv.h"
#include "fl_gemv_dense.h"
#include "fl_quant.h"
#include "fl_allreduce.h"

#endif /* FL_KERNELS_H */
