/* Launchers of kernels/rope.cu (included by fl_kernels.h; see its rules). */
#ifndef FL_ROPE_H
#define FL_ROPE_H
#include "fl_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
