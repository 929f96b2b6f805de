/* Launchers of kernels/attention_prefill.cu (included by fl_kernels.h; see its rules). Placeholder. */
#ifndef FL_ATTENTION_PREFILL_H
#define FL_ATTENTION_PREFILL_H
#include "fl_kernels.h"
#endif
