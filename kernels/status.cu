// Library-wide entry points that are not kernels: error strings, version.
#include "common/common.cuh"

extern "C" const char *fl_cuda_error_string(fl_status status) {
    if (status == FL_OK) return "no error";
    if (status == FL_ERR_INVALID_ARGUMENT) return "invalid argument";
    if (status == FL_ERR_UNSUPPORTED_DTYPE) return "unsupported dtype";
    if (status == FL_ERR_MISALIGNED) return "misaligned pointer";
    return cudaGetErrorString((cudaError_t)status);
}

extern "C" int32_t fl_kernels_version(void) { return 100; }
