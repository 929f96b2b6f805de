// Host side of TMA tensor copies: cuTensorMapEncodeTiled, looked up once from the driver
// through the runtime (the kernels link cudart statically and never the driver library).
// Used by the Hopper prefill attention and the one-token TMA GEMVs (gemv_one_token_int.cu,
// gemv_one_token_gguf.cu).
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

namespace fl {

// cuTensorMapEncodeTiled from the driver (looked up once; null when the driver lacks it).
inline PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void *f = nullptr;
        cudaDriverEntryPointQueryResult q;
#if CUDART_VERSION >= 12050
        const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
#else  // toolkits 12.0-12.4 have only the unversioned lookup
        const cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault, &q);
#endif
        if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
            (void)cudaGetLastError();
            f = nullptr;
        }
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
    }();
    return fn;
}

}  // namespace fl
