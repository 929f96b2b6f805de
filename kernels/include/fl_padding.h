/* Launchers of kernels/padding.cu (included by fl_kernels.h; see its rules). */
#ifndef FL_PADDING_H
#define FL_PADDING_H
#include "fl_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
