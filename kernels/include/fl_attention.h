/* Launchers of kernels/attention_decode.cu and attention_prefill.cu (included by fl_kernels.h). */
#ifndef FL_ATTENTION_H
#define FL_ATTENTION_H
#include "fl_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
