/* Launchers of kernels/norm.cu (included by fl_kernels.h; see its rules). */
#ifndef FL_NORM_H
#define FL_NORM_H
#include "fl_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
