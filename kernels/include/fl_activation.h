/* Launchers of kernels/activation.cu (included by fl_kernels.h; see its rules). */
#ifndef FL_ACTIVATION_H
#define FL_ACTIVATION_H
#include "fl_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
