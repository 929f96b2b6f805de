/* Launchers of kernels/sampling.cu (included by fl_kernels.h; see its rules). */
#ifndef FL_SAMPLING_H
#define FL_SAMPLING_H
#include "fl_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
