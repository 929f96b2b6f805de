/* Launchers of kernels/kv_cache.cu (included by fl_kernels.h; see its rules). */
#ifndef FL_KV_CACHE_H
#define FL_KV_CACHE_H
#include "fl_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
