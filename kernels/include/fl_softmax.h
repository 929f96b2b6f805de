/* Launchers of kernels/softmax.cu (included by fl_kernels.h; see its rules). */
#ifndef FL_SOFTMAX_H
#define FL_SOFTMAX_H
#include "fl_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
