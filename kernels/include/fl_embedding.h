/* Launchers of kernels/embedding.cu (included by fl_kernels.h; see its rules). */
#ifndef FL_EMBEDDING_H
#define FL_EMBEDDING_H
#include "fl_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
