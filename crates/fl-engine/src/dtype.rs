//! The element types the engine runs in ([`RunDType`]: `f32`, `f16`, `bf16`) and, for the
//! half types, their entry points into the dense GEMV of `fl_kernels::gemv_dense`, so that
//! the layer code is written once for every dtype.

use fl_blas::GemmType;
use fl_kernels::cudarc::driver::CudaStream;
use fl_kernels::gemv_dense::{self, QkvRopeAppend, RmsNorm};
use fl_kernels::kv_cache::KvCache;
use fl_kernels::{DeviceTensor, FloatDType, HalfDType};

use crate::error::{EngineError, Result};

/// Element types the engine runs in: `f32`, `f16` or `bf16` (weights, activations and the
/// KV cache). Its name is `DType::NAME`.
///
/// Small passes may run their projections on the dense GEMV of `fl_kernels::gemv_dense`,
/// which exists for `f16`/`bf16` only: [`DENSE_GEMV`](Self::DENSE_GEMV) says whether this
/// dtype has it, and the `dense_*` methods call it. For `f32` ([`DENSE_GEMV`](Self::DENSE_GEMV)
/// false, [`Model::gemv_max_m`](crate::model::Model::gemv_max_m) 0) they are never called
/// and return an error if they were.
pub trait RunDType: FloatDType + GemmType {
    /// Whether `fl_kernels::gemv_dense` runs this dtype.
    const DENSE_GEMV: bool = false;

    /// The half type the half-only kernels (dense GEMV, quantised paths) see: `Self` for
    /// f16/bf16; for f32 a placeholder that [`RunDType::half`] never yields.
    type Half: HalfDType + RunDType;

    /// `t` as a tensor of [`RunDType::Half`] (the same tensor) for f16/bf16; an error for
    /// f32, whose runs never reach the half-only kernels (refused at load).
    fn half(_t: &DeviceTensor<Self>) -> Result<&DeviceTensor<Self::Half>> {
        Err(no_half::<Self>())
    }

    /// [`RunDType::half`] for a tensor written to.
    fn half_mut(_t: &mut DeviceTensor<Self>) -> Result<&mut DeviceTensor<Self::Half>> {
        Err(no_half::<Self>())
    }

    /// `gemv_dense::linear`: `y = x·Wᵀ (+ bias)`.
    fn dense_linear(
        _stream: &CudaStream,
        _x: &DeviceTensor<Self>,
        _w: &DeviceTensor<Self>,
        _bias: Option<&DeviceTensor<Self>>,
        _y: &mut DeviceTensor<Self>,
    ) -> fl_kernels::Result<()> {
        Err(no_dense_gemv::<Self>())
    }

    /// `gemv_dense::linear_add`: `residual += x·Wᵀ`.
    fn dense_linear_add(
        _stream: &CudaStream,
        _x: &DeviceTensor<Self>,
        _w: &DeviceTensor<Self>,
        _residual: &mut DeviceTensor<Self>,
    ) -> fl_kernels::Result<()> {
        Err(no_dense_gemv::<Self>())
    }

    /// `gemv_dense::linear_swiglu`: `out = silu(x·W_gateᵀ) ⊙ (x·W_upᵀ)`.
    fn dense_linear_swiglu(
        _stream: &CudaStream,
        _x: &DeviceTensor<Self>,
        _w_gate_up: &DeviceTensor<Self>,
        _out: &mut DeviceTensor<Self>,
    ) -> fl_kernels::Result<()> {
        Err(no_dense_gemv::<Self>())
    }

    /// `gemv_dense::rms_norm_linear`: `y = rms_norm(h, gamma, eps)·Wᵀ (+ bias)`.
    fn dense_rms_norm_linear(
        _stream: &CudaStream,
        _h: &DeviceTensor<Self>,
        _gamma: &DeviceTensor<Self>,
        _eps: f32,
        _w: &DeviceTensor<Self>,
        _bias: Option<&DeviceTensor<Self>>,
        _y: &mut DeviceTensor<Self>,
    ) -> fl_kernels::Result<()> {
        Err(no_dense_gemv::<Self>())
    }

    /// `gemv_dense::rms_norm_linear_swiglu`: `out = swiglu(rms_norm(h, gamma, eps)·[Wg|Wu]ᵀ)`.
    fn dense_rms_norm_linear_swiglu(
        _stream: &CudaStream,
        _h: &DeviceTensor<Self>,
        _gamma: &DeviceTensor<Self>,
        _eps: f32,
        _w_gate_up: &DeviceTensor<Self>,
        _out: &mut DeviceTensor<Self>,
    ) -> fl_kernels::Result<()> {
        Err(no_dense_gemv::<Self>())
    }

    /// `gemv_dense::linear_rope_append`: the QKV projection of a decode pass (of `h`, or of
    /// `rms_norm(h, gamma, eps)` when `norm` is given) with RoPE and the KV append fused:
    /// writes `q_out` and this pass's K/V into `cache`.
    #[allow(clippy::too_many_arguments)]
    fn dense_linear_rope_append(
        _stream: &CudaStream,
        _h: &DeviceTensor<Self>,
        _norm: Option<(&DeviceTensor<Self>, f32)>,
        _w: &DeviceTensor<Self>,
        _bias: Option<&DeviceTensor<Self>>,
        _args: &QkvRopeAppend<'_>,
        _q_out: &mut DeviceTensor<Self>,
        _cache: &mut KvCache<Self>,
    ) -> fl_kernels::Result<()> {
        Err(no_dense_gemv::<Self>())
    }
}

fn no_half<T: FloatDType>() -> EngineError {
    EngineError::invalid(
        "dtype",
        format!(
            "{} has no half-precision kernels (quantised paths need f16/bf16)",
            T::NAME
        ),
    )
}

fn no_dense_gemv<T: FloatDType>() -> fl_kernels::Error {
    fl_kernels::Error::invalid(
        "x",
        format!(
            "the dense GEMV has no {} kernel (use cuBLASLt: gemv_max_m = 0)",
            T::NAME
        ),
    )
}

impl RunDType for f32 {
    type Half = fl_kernels::f16;
}

macro_rules! half_run_dtype {
    ($t:ty) => {
        impl RunDType for $t {
            const DENSE_GEMV: bool = true;
            type Half = $t;
            fn half(t: &DeviceTensor<Self>) -> Result<&DeviceTensor<Self>> {
                Ok(t)
            }
            fn half_mut(t: &mut DeviceTensor<Self>) -> Result<&mut DeviceTensor<Self>> {
                Ok(t)
            }
            fn dense_linear(
                stream: &CudaStream,
                x: &DeviceTensor<Self>,
                w: &DeviceTensor<Self>,
                bias: Option<&DeviceTensor<Self>>,
                y: &mut DeviceTensor<Self>,
            ) -> fl_kernels::Result<()> {
                gemv_dense::linear(stream, x, w, bias, y)
            }
            fn dense_linear_add(
                stream: &CudaStream,
                x: &DeviceTensor<Self>,
                w: &DeviceTensor<Self>,
                residual: &mut DeviceTensor<Self>,
            ) -> fl_kernels::Result<()> {
                gemv_dense::linear_add(stream, x, w, residual)
            }
            fn dense_linear_swiglu(
                stream: &CudaStream,
                x: &DeviceTensor<Self>,
                w_gate_up: &DeviceTensor<Self>,
                out: &mut DeviceTensor<Self>,
            ) -> fl_kernels::Result<()> {
                gemv_dense::linear_swiglu(stream, x, w_gate_up, out)
            }
            fn dense_rms_norm_linear(
                stream: &CudaStream,
                h: &DeviceTensor<Self>,
                gamma: &DeviceTensor<Self>,
                eps: f32,
                w: &DeviceTensor<Self>,
                bias: Option<&DeviceTensor<Self>>,
                y: &mut DeviceTensor<Self>,
            ) -> fl_kernels::Result<()> {
                let norm = RmsNorm { weight: gamma, eps };
                gemv_dense::rms_norm_linear(stream, h, norm, w, bias, y)
            }
            fn dense_rms_norm_linear_swiglu(
                stream: &CudaStream,
                h: &DeviceTensor<Self>,
                gamma: &DeviceTensor<Self>,
                eps: f32,
                w_gate_up: &DeviceTensor<Self>,
                out: &mut DeviceTensor<Self>,
            ) -> fl_kernels::Result<()> {
                let norm = RmsNorm { weight: gamma, eps };
                gemv_dense::rms_norm_linear_swiglu(stream, h, norm, w_gate_up, out)
            }
            fn dense_linear_rope_append(
                stream: &CudaStream,
                h: &DeviceTensor<Self>,
                norm: Option<(&DeviceTensor<Self>, f32)>,
                w: &DeviceTensor<Self>,
                bias: Option<&DeviceTensor<Self>>,
                args: &QkvRopeAppend<'_>,
                q_out: &mut DeviceTensor<Self>,
                cache: &mut KvCache<Self>,
            ) -> fl_kernels::Result<()> {
                let norm = norm.map(|(weight, eps)| RmsNorm { weight, eps });
                gemv_dense::linear_rope_append(stream, h, norm, w, bias, args, q_out, cache, None)
            }
        }
    };
}
half_run_dtype!(fl_kernels::f16);
half_run_dtype!(fl_kernels::bf16);
