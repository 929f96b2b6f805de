/* Launchers of kernels/gemv.cu (included by fl_kernels.h; see its rules). Placeholder. */
#ifndef FL_GEMV_H
#define FL_GEMV_H
#include "fl_kernels.h"
#endif
