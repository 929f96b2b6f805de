/* Launchers of kernels/quant.cu (included by fl_kernels.h; see its rules). Placeholder. */
#ifndef FL_QUANT_H
#define FL_QUANT_H
#include "fl_kernels.h"
#endif
