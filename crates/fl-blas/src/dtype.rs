//! Element types the GEMM accepts.

use cudarc::cublaslt::sys::cudaDataType;
use fl_kernels::{bf16, f16, FloatDType};

mod sealed {
    pub trait Sealed {}
}

/// An element type of [`Blas::gemm`](crate::Blas::gemm): `f32`, `f16` or `bf16`.
///
/// Inputs, output and bias share this type; products are accumulated in f32
/// (`CUBLAS_COMPUTE_32F`, scale type f32; f32 may opt into TF32 with
/// [`Blas::set_allow_tf32`](crate::Blas::set_allow_tf32)). Sealed.
pub trait GemmType: FloatDType + sealed::Sealed {
    /// cuBLASLt's tag for this storage type.
    const CUDA: cudaDataType;
    /// This type's [`GemmDType`] (with TF32 off).
    const DTYPE: GemmDType;
}

impl sealed::Sealed for f32 {}
impl sealed::Sealed for f16 {}
impl sealed::Sealed for bf16 {}

impl GemmType for f32 {
    const CUDA: cudaDataType = cudaDataType::CUDA_R_32F;
    const DTYPE: GemmDType = GemmDType::F32;
}
impl GemmType for f16 {
    const CUDA: cudaDataType = cudaDataType::CUDA_R_16F;
    const DTYPE: GemmDType = GemmDType::F16;
}
impl GemmType for bf16 {
    const CUDA: cudaDataType = cudaDataType::CUDA_R_16BF;
    const DTYPE: GemmDType = GemmDType::Bf16;
}

/// Storage type plus compute mode of one GEMM, as the algorithm cache keys it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GemmDType {
    /// f32 storage, f32 compute (`CUBLAS_COMPUTE_32F`).
    F32,
    /// f32 storage, TF32 tensor-core compute (`CUBLAS_COMPUTE_32F_FAST_TF32`).
    Tf32,
    /// f16 storage, f32 accumulation.
    F16,
    /// bf16 storage, f32 accumulation.
    Bf16,
}

impl GemmDType {
    /// Short name, as written in cache files and bench ids (`"f32"`, `"tf32"`, `"f16"`, `"bf16"`).
    pub fn as_str(self) -> &'static str {
        match self {
            GemmDType::F32 => "f32",
            GemmDType::Tf32 => "tf32",
            GemmDType::F16 => "f16",
            GemmDType::Bf16 => "bf16",
        }
    }

    /// The inverse of [`as_str`](Self::as_str); `None` for any other string.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "f32" => Some(GemmDType::F32),
            "tf32" => Some(GemmDType::Tf32),
            "f16" => Some(GemmDType::F16),
            "bf16" => Some(GemmDType::Bf16),
            _ => None,
        }
    }

    /// Bytes per element of the storage type.
    pub fn size_of(self) -> usize {
        match self {
            GemmDType::F32 | GemmDType::Tf32 => 4,
            GemmDType::F16 | GemmDType::Bf16 => 2,
        }
    }
}

impl std::fmt::Display for GemmDType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
