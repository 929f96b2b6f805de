//! Quantisation on load (`--quant`) and the decoder's linear layers in each form.
//!
//! [`Quant`] is what `--quant` names; [`Linear`] one projection of a decoder layer (the
//! stacked QKV, O, the stacked gate|up, down) as the model holds it:
//!
//! | `--quant`                          | weights                                         | decode (m ≤ 16 tokens)                     | prefill (m > 16)                                      |
//! |------------------------------------|-------------------------------------------------|--------------------------------------------|-------------------------------------------------------|
//! | `none`                             | dense `f16`/`bf16`                              | dense GEMV, SwiGLU / residual add fused    | cuBLASLt                                              |
//! | `int8`                             | int8, one f32 scale per output channel          | `fl_kernels::gemv::gemv` (dequantised in registers) | `gemv::dequantize` into a scratch buffer, then cuBLASLt |
//! | `int4`, `int4-g64`, `int4-g32`     | int4 symmetric, one f16 scale per group of 128 / 64 / 32 along k | as `int8`                 | as `int8`                                             |
//! | `q8_0`, `q4_0`                     | llama.cpp blocks of 32                          | as `int8`                                  | as `int8`                                             |
//! | `q4_k`, `q5_k`, `q6_k`             | llama.cpp K-quant super-blocks of 256           | as `int8`                                  | as `int8`                                             |
//! | `gguf` (a .gguf file's default)    | each projection in its GGUF tensors' own format ([`crate::gguf::native`]) | as `int8` (dense ones as `none`) | as `int8` |
//! | `w8a8`                             | int8 per output channel (`fl_blas::QuantLinear`), activations int8 per token | cuBLASLt IMMA (`Blas::gemm_i8`), (de)quantisation fused into the kernels around it | the same |
//!
//! Weights are quantised on the host from f32 (the checkpoint's values, widened exactly; or
//! the dummy values of a preset; `gguf` copies the file's blocks instead), one tensor at a time, rows split over threads, then
//! uploaded. The embedding table, the LM head and the norm weights stay dense in the run
//! dtype; biases (Qwen2's QKV bias, `o_bias`, `mlp_bias`) stay dense and are added after the
//! quantised product.
//!
//! Weight-only layers skip the dense GEMV's fused SwiGLU and residual add: the separate
//! kernels of the cuBLASLt path ([`activation::swiglu_fused`], [`norm::add_rms_norm`]) follow
//! the GEMV. A W8A8 layer runs FasterLLaMA's int8 chain (see [`fl_kernels::quant`]):
//!
//! ```text
//! x_q, s0   = rms_norm_quant(h, attn_norm)
//! qkv       = T(deq(gemm_i8(x_q, Wqkv)) + bqkv)          then RoPE + cache append as dense
//! a_q, s1   = quantize_per_token(attn)
//! y_q, s0   = dequant_add_rms_norm_quant(gemm_i8(a_q, Wo), h, ffn_norm)      h += o
//! m_q, s1   = dequant_silu_mul_quant(gemm_i8(y_q, Wgate_up))
//! dequant_add(gemm_i8(m_q, Wdown), h)                                          h += down
//! ```
//!
//! (a projection with a bias dequantises to `T` with [`quant::dequantize`] and takes the
//! unfused kernels instead). The next W8A8 layer normalises `h` itself; the last one writes
//! `x = rms_norm(h, final_norm)` for the LM head.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use fl_blas::{Blas, QuantLinear};
use fl_kernels::cudarc::driver::CudaStream;
use fl_kernels::gemv::{self, QuantFormat, QuantWeight, QuantizedHost, Scales};
use fl_kernels::quant::{self, Dequant};
use fl_kernels::{activation, f16, norm, DeviceTensor};

use crate::config::ModelConfig;
use crate::dtype::RunDType;
use crate::error::{EngineError, Result};

/// How the decoder's linear layers are stored and run (`--quant`); see the
/// [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Quant {
    /// Dense weights in the run dtype.
    #[default]
    None,
    /// Weight-only quantisation in a [`QuantFormat`] (`int8`, `int4`, `int4-g64`, `int4-g32`,
    /// `q8_0`, `q4_0`, `q4_k`, `q5_k`, `q6_k`): activations stay in the run dtype.
    WeightOnly(QuantFormat),
    /// A GGUF file's own formats, projection by projection (`gguf`): Q8_0, Q4_0 and K-quant
    /// tensors run weight-only from the file's blocks, the others dense; the rule is
    /// [`crate::gguf::native`]'s. Only for a GGUF [`WeightSource`](crate::weights::WeightSource).
    Gguf,
    /// INT8 weights per output channel and INT8 activations per token, int32 GEMMs
    /// (FasterLLaMA / FasterTransformer 3.0 W8A8).
    W8A8,
}

/// One projection of a layer, for messages: its name in the checkpoint, output and input
/// features.
struct Proj {
    name: &'static str,
    n: usize,
    k: usize,
}

fn projections(cfg: &ModelConfig) -> [Proj; 4] {
    let (h, q, kv, i) = (
        cfg.hidden_size,
        cfg.q_size(),
        cfg.kv_size(),
        cfg.intermediate_size,
    );
    [
        Proj {
            name: "q_proj|k_proj|v_proj",
            n: q + 2 * kv,
            k: h,
        },
        Proj {
            name: "o_proj",
            n: h,
            k: q,
        },
        Proj {
            name: "gate_proj|up_proj",
            n: 2 * i,
            k: h,
        },
        Proj {
            name: "down_proj",
            n: h,
            k: i,
        },
    ]
}

impl Quant {
    /// Every value `--quant` takes, in the order `fl --help` lists them.
    /// (`gguf` is not among them: it quantises nothing and takes a GGUF file only.)
    pub const NAMES: &'static [&'static str] = &[
        "none", "int8", "int4", "int4-g64", "int4-g32", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k",
        "w8a8",
    ];

    /// Parses a `--quant` value (one of [`Quant::NAMES`], or `gguf`; `int4` is group 128).
    ///
    /// Errors: [`EngineError::Invalid`] naming `--quant` and listing the valid values.
    ///
    /// ```
    /// use fl_engine::linear::Quant;
    /// use fl_kernels::gemv::QuantFormat;
    /// assert_eq!(Quant::parse("w8a8")?, Quant::W8A8);
    /// assert_eq!(
    ///     Quant::parse("int4")?,
    ///     Quant::WeightOnly(QuantFormat::Int4 { group: 128, zero_point: false })
    /// );
    /// assert!(Quant::parse("int3").unwrap_err().to_string().contains("--quant"));
    /// # Ok::<(), fl_engine::EngineError>(())
    /// ```
    pub fn parse(s: &str) -> Result<Self> {
        let int4 = |group| {
            Quant::WeightOnly(QuantFormat::Int4 {
                group,
                zero_point: false,
            })
        };
        Ok(match s {
            "none" => Quant::None,
            "int8" => Quant::WeightOnly(QuantFormat::Int8),
            "int4" => int4(128),
            "int4-g64" => int4(64),
            "int4-g32" => int4(32),
            "q8_0" => Quant::WeightOnly(QuantFormat::Q8_0),
            "q4_0" => Quant::WeightOnly(QuantFormat::Q4_0),
            "q4_k" => Quant::WeightOnly(QuantFormat::Q4_K),
            "q5_k" => Quant::WeightOnly(QuantFormat::Q5_K),
            "q6_k" => Quant::WeightOnly(QuantFormat::Q6_K),
            "w8a8" => Quant::W8A8,
            "gguf" => Quant::Gguf,
            _ => {
                return Err(EngineError::invalid(
                    "--quant",
                    format!("`{s}` is not one of {}", Quant::NAMES.join(", ")),
                ))
            }
        })
    }

    /// The `--quant` value that names this mode (inverse of [`Quant::parse`]); formats that
    /// `--quant` cannot name (int4 with zero points) by [`QuantFormat::name`].
    pub fn name(&self) -> String {
        match *self {
            Quant::None => "none".into(),
            Quant::W8A8 => "w8a8".into(),
            Quant::Gguf => "gguf".into(),
            Quant::WeightOnly(QuantFormat::Int8) => "int8".into(),
            Quant::WeightOnly(QuantFormat::Q8_0) => "q8_0".into(),
            Quant::WeightOnly(QuantFormat::Q4_0) => "q4_0".into(),
            Quant::WeightOnly(QuantFormat::Int4 {
                group: 128,
                zero_point: false,
            }) => "int4".into(),
            Quant::WeightOnly(QuantFormat::Int4 {
                group,
                zero_point: false,
            }) if group == 32 || group == 64 => format!("int4-g{group}"),
            Quant::WeightOnly(f) => f.name(),
        }
    }

    /// Whether the weights are stored dense (`none`).
    pub fn is_dense(&self) -> bool {
        *self == Quant::None
    }

    /// Checks that the run dtype (`f16`, `bf16`, `f32`) can run this mode: the quantised
    /// kernels are 16-bit only.
    ///
    /// Errors: [`EngineError::Invalid`] naming `--quant` for `f32` with any quantisation.
    pub fn check_dtype(&self, dtype: &str) -> Result<()> {
        if !self.is_dense() && dtype == "f32" {
            return Err(EngineError::invalid(
                "--quant",
                format!(
                    "`{}` needs --dtype f16 or bf16 (the quantised kernels are 16-bit only)",
                    self.name()
                ),
            ));
        }
        Ok(())
    }

    /// Checks that every projection of `cfg` fits this mode: weight-only formats need the
    /// input features `k` to be a multiple of the group (int4), of 256 (K-quants) or of 32;
    /// `w8a8` needs `k` and the output features `n` to be multiples of 4 (cuBLASLt IMMA);
    /// `gguf` takes any shape (each tensor's blocks divide its rows, or it runs dense).
    ///
    /// Errors: [`EngineError::Invalid`] naming `--quant`, the projection, its size, and the
    /// modes that would fit.
    ///
    /// ```
    /// use fl_engine::linear::Quant;
    /// let tiny = fl_engine::presets::preset("tiny")?; // intermediate_size 352
    /// assert!(Quant::parse("int4-g32")?.check(&tiny).is_ok());
    /// let e = Quant::parse("int4")?.check(&tiny).unwrap_err().to_string();
    /// assert!(e.contains("down_proj") && e.contains("int4-g32"), "{e}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check(&self, cfg: &ModelConfig) -> Result<()> {
        let bad = |p: &Proj, why: String| {
            let fits: Vec<&str> = Quant::NAMES
                .iter()
                .copied()
                .filter(|n| Quant::parse(n).is_ok_and(|q| q.fits(cfg)))
                .collect();
            EngineError::invalid(
                "--quant",
                format!(
                    "`{}` does not fit {} ({} x {}): {why}; modes that fit this model: {}",
                    self.name(),
                    p.name,
                    p.n,
                    p.k,
                    fits.join(", ")
                ),
            )
        };
        for p in projections(cfg) {
            match *self {
                Quant::None | Quant::Gguf => {}
                Quant::WeightOnly(f) => {
                    let mult = f.k_multiple();
                    if p.k == 0 || p.k % mult != 0 {
                        return Err(bad(
                            &p,
                            format!("its {} input features are not a multiple of {mult}", p.k),
                        ));
                    }
                }
                Quant::W8A8 => {
                    if p.k == 0 || p.k % 4 != 0 || p.n == 0 || p.n % 4 != 0 {
                        return Err(bad(
                            &p,
                            "int8 tensor-core GEMMs need both sizes multiples of 4".into(),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    fn fits(&self, cfg: &ModelConfig) -> bool {
        projections(cfg).iter().all(|p| match *self {
            Quant::None | Quant::Gguf => true,
            Quant::WeightOnly(f) => p.k > 0 && p.k % f.k_multiple() == 0,
            Quant::W8A8 => p.k > 0 && p.k % 4 == 0 && p.n > 0 && p.n % 4 == 0,
        })
    }

    /// Device bytes of one `[n, k]` projection's weight in this mode at `dtype_bytes` per
    /// dense element: `n·k·dtype_bytes` dense; [`QuantFormat::weight_bytes`] (values + scales
    /// + zeros) weight-only; `n·k + 4n` (int8 values + f32 scales) for `w8a8`.
    ///
    /// For `gguf`, a lower bound without the file: 4.5 bits a weight (Q4_0 / Q4_K, the
    /// smallest formats it runs natively); [`crate::gguf::native::weight_bytes`] is exact.
    pub fn linear_bytes(&self, n: usize, k: usize, dtype_bytes: usize) -> u64 {
        match *self {
            Quant::None => (n * k * dtype_bytes) as u64,
            Quant::WeightOnly(f) => f.weight_bytes(n, k) as u64,
            Quant::Gguf => (n * k * 9).div_ceil(16) as u64,
            Quant::W8A8 => (n * k + 4 * n) as u64,
        }
    }

    /// Device bytes of all of `cfg`'s weights in this mode: [`ModelConfig::weight_bytes`]
    /// with each layer's four projections at [`Quant::linear_bytes`] (embedding, LM head,
    /// norms and biases dense). What [`crate::weights::Weights::bytes`] reports once loaded.
    ///
    /// ```
    /// use fl_engine::linear::Quant;
    /// let cfg = fl_engine::presets::preset("llama-2-7b")?;
    /// let dense = Quant::None.weight_bytes(&cfg, 2);
    /// assert_eq!(dense, cfg.weight_bytes(2));
    /// let int4 = Quant::parse("int4")?.weight_bytes(&cfg, 2);
    /// assert!(int4 < dense / 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn weight_bytes(&self, cfg: &ModelConfig, dtype_bytes: usize) -> u64 {
        let mut total = cfg.weight_bytes(dtype_bytes);
        for p in projections(cfg) {
            let dense = Quant::None.linear_bytes(p.n, p.k, dtype_bytes);
            let here = self.linear_bytes(p.n, p.k, dtype_bytes);
            total =
                total - dense * cfg.num_hidden_layers as u64 + here * cfg.num_hidden_layers as u64;
        }
        total
    }

    /// Device bytes of the per-pass scratch a forward pass over `m` tokens needs in this mode
    /// (beyond the dense [`crate::buffers::Buffers`]): weight-only passes past
    /// [`gemv::MAX_M`] tokens hold one dense copy of each distinct projection shape; `w8a8`
    /// passes hold int8 activations, int32 GEMM outputs and per-token scales.
    pub fn buffer_bytes(&self, cfg: &ModelConfig, m: usize, dtype_bytes: usize) -> u64 {
        match *self {
            Quant::None => 0,
            Quant::WeightOnly(_) | Quant::Gguf if m <= gemv::MAX_M => 0,
            Quant::WeightOnly(_) | Quant::Gguf => distinct_shapes(cfg)
                .iter()
                .map(|&(n, k)| (n * k * dtype_bytes) as u64)
                .sum(),
            Quant::W8A8 => {
                let (h, q, kv, i) = (
                    cfg.hidden_size,
                    cfg.q_size(),
                    cfg.kv_size(),
                    cfg.intermediate_size,
                );
                (m * (h + q + i + 8 + 4 * (q + 2 * kv + h + 2 * i))) as u64
            }
        }
    }
}

impl FromStr for Quant {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self> {
        Quant::parse(s)
    }
}

impl fmt::Display for Quant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The distinct `[n, k]` shapes of a layer's projections.
fn distinct_shapes(cfg: &ModelConfig) -> Vec<(usize, usize)> {
    let mut v: Vec<(usize, usize)> = Vec::new();
    for p in projections(cfg) {
        if !v.contains(&(p.n, p.k)) {
            v.push((p.n, p.k));
        }
    }
    v
}

/// One projection `y = x·Wᵀ` of a decoder layer, `W [n, k]` in `nn.Linear` layout, in the
/// form [`Quant`] chose.
pub enum Linear<T: RunDType> {
    /// Dense weight in the run dtype.
    Dense(DeviceTensor<T>),
    /// Weight-only quantised weight ([`fl_kernels::gemv`]).
    WeightOnly(QuantWeight),
    /// W8A8: int8 weight and per-channel scales ([`fl_blas::QuantLinear`]).
    W8A8(QuantLinear),
}

impl<T: RunDType> fmt::Debug for Linear<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, n, k) = match self {
            Linear::Dense(_) => ("Dense".to_string(), self.out_features(), self.in_features()),
            Linear::WeightOnly(w) => (w.format().name(), w.n(), w.k()),
            Linear::W8A8(_) => ("W8A8".into(), self.out_features(), self.in_features()),
        };
        write!(f, "Linear::{kind}[{n}, {k}]")
    }
}

impl<T: RunDType> Linear<T> {
    /// Output features `n`.
    pub fn out_features(&self) -> usize {
        match self {
            Linear::Dense(w) => w.shape()[0],
            Linear::WeightOnly(w) => w.n(),
            Linear::W8A8(w) => w.out_features(),
        }
    }

    /// Input features `k`.
    pub fn in_features(&self) -> usize {
        match self {
            Linear::Dense(w) => w.shape()[1],
            Linear::WeightOnly(w) => w.k(),
            Linear::W8A8(w) => w.in_features(),
        }
    }

    /// Device bytes of the weight (values, scales, zero points): what one pass reads.
    pub fn num_bytes(&self) -> usize {
        match self {
            Linear::Dense(w) => w.num_bytes(),
            Linear::WeightOnly(w) => w.num_bytes(),
            Linear::W8A8(w) => w.weight.num_bytes() + w.scales.num_bytes(),
        }
    }

    /// The dense weight, if this is [`Linear::Dense`].
    pub fn as_dense(&self) -> Option<&DeviceTensor<T>> {
        match self {
            Linear::Dense(w) => Some(w),
            _ => None,
        }
    }

    /// Whether this is [`Linear::W8A8`] (its input must be int8, see [`fl_kernels::quant`]).
    pub fn is_w8a8(&self) -> bool {
        matches!(self, Linear::W8A8(_))
    }

    /// `y = x·Wᵀ (+ bias)` for a dense or weight-only weight, `x [m, k]`, `y [m, n]`,
    /// `bias [n]`:
    /// - dense: cuBLASLt ([`Blas::linear`], the bias in its epilogue);
    /// - weight-only, `m` ≤ [`gemv::MAX_M`]: [`gemv::gemv`] then
    ///   [`activation::bias_add_inplace`];
    /// - weight-only, larger `m`: [`gemv::dequantize`] into `scratch`'s dense buffer of this
    ///   shape, then [`Blas::linear`].
    ///
    /// Queued on `stream` (which must be `blas`'s), never synchronises.
    ///
    /// Errors: [`EngineError::Invalid`] for a W8A8 weight (its activations must be quantised
    /// first) or a `scratch` without a buffer of this shape (not made by
    /// [`QuantBuffers::new`] for this pass); shape errors of the kernels.
    pub fn forward(
        &self,
        stream: &Arc<CudaStream>,
        blas: &mut Blas,
        x: &DeviceTensor<T>,
        bias: Option<&DeviceTensor<T>>,
        y: &mut DeviceTensor<T>,
        scratch: &mut QuantBuffers<T>,
    ) -> Result<()> {
        match self {
            Linear::Dense(w) => blas.linear(x, w, bias, y)?,
            Linear::WeightOnly(w) => {
                let m = x.shape().first().copied().unwrap_or(0);
                if m <= gemv::MAX_M {
                    gemv::gemv(stream, T::half(x)?, w, T::half_mut(y)?)?;
                    if let Some(b) = bias {
                        activation::bias_add_inplace(stream, y, b)?;
                    }
                } else {
                    let dense = scratch.dense_for(w.n(), w.k())?;
                    gemv::dequantize(stream, w, dense)?;
                    blas.linear(x, dense, bias, y)?;
                }
            }
            Linear::W8A8(_) => {
                return Err(EngineError::invalid(
                    "--quant",
                    "a w8a8 projection takes int8 activations (the model's W8A8 path), not Linear::forward",
                ))
            }
        }
        Ok(())
    }
}

/// The int8 activations, per-token scales and int32 GEMM outputs of a W8A8 pass over `m`
/// tokens.
struct W8A8Buffers {
    /// Quantised `rms_norm(h)`: input of the QKV and gate|up GEMMs `[m, hidden]`.
    x_h: DeviceTensor<i8>,
    /// Quantised attention output: input of the O GEMM `[m, q_size]`.
    x_a: DeviceTensor<i8>,
    /// Quantised SwiGLU output: input of the down GEMM `[m, intermediate]`.
    x_i: DeviceTensor<i8>,
    /// Per-token scales, two so a fused kernel can read one and write the other `[m]`.
    s0: DeviceTensor<f32>,
    s1: DeviceTensor<f32>,
    /// QKV GEMM output `[m, q + 2 kv]`.
    acc_qkv: DeviceTensor<i32>,
    /// O and down GEMM outputs `[m, hidden]`.
    acc_h: DeviceTensor<i32>,
    /// Gate|up GEMM output `[m, 2 intermediate]`.
    acc_gu: DeviceTensor<i32>,
}

/// The scratch a forward pass of a quantised model needs besides the dense buffers (see
/// [`Quant::buffer_bytes`]); empty for a dense model. Made by [`QuantBuffers::new`] (through
/// [`crate::model::Model::buffers`]).
pub struct QuantBuffers<T: RunDType> {
    dense: Vec<DeviceTensor<T>>,
    w8a8: Option<W8A8Buffers>,
}

impl<T: RunDType> Default for QuantBuffers<T> {
    /// No scratch (a dense model's).
    fn default() -> Self {
        QuantBuffers {
            dense: Vec::new(),
            w8a8: None,
        }
    }
}

impl<T: RunDType> QuantBuffers<T> {
    /// The scratch of a pass over `m` tokens of `cfg` in mode `quant`: nothing for
    /// [`Quant::None`] and for weight-only passes of at most [`gemv::MAX_M`] tokens.
    pub fn new(
        stream: &Arc<CudaStream>,
        cfg: &ModelConfig,
        quant: Quant,
        m: usize,
    ) -> Result<Self> {
        let mut b = QuantBuffers::default();
        match quant {
            Quant::None => {}
            Quant::WeightOnly(_) | Quant::Gguf => {
                if m > gemv::MAX_M {
                    for (n, k) in distinct_shapes(cfg) {
                        b.dense.push(DeviceTensor::zeros(stream, &[n, k])?);
                    }
                }
            }
            Quant::W8A8 => {
                let (h, q, kv, i) = (
                    cfg.hidden_size,
                    cfg.q_size(),
                    cfg.kv_size(),
                    cfg.intermediate_size,
                );
                b.w8a8 = Some(W8A8Buffers {
                    x_h: DeviceTensor::zeros(stream, &[m, h])?,
                    x_a: DeviceTensor::zeros(stream, &[m, q])?,
                    x_i: DeviceTensor::zeros(stream, &[m, i])?,
                    s0: DeviceTensor::zeros(stream, &[m])?,
                    s1: DeviceTensor::zeros(stream, &[m])?,
                    acc_qkv: DeviceTensor::zeros(stream, &[m, q + 2 * kv])?,
                    acc_h: DeviceTensor::zeros(stream, &[m, h])?,
                    acc_gu: DeviceTensor::zeros(stream, &[m, 2 * i])?,
                });
            }
        }
        Ok(b)
    }

    /// Device bytes held.
    pub fn bytes(&self) -> u64 {
        let mut n: usize = self.dense.iter().map(|t| t.num_bytes()).sum();
        if let Some(q) = &self.w8a8 {
            n += q.x_h.num_bytes()
                + q.x_a.num_bytes()
                + q.x_i.num_bytes()
                + q.s0.num_bytes()
                + q.s1.num_bytes()
                + q.acc_qkv.num_bytes()
                + q.acc_h.num_bytes()
                + q.acc_gu.num_bytes();
        }
        n as u64
    }

    fn dense_for(&mut self, n: usize, k: usize) -> Result<&mut DeviceTensor<T>> {
        self.dense
            .iter_mut()
            .find(|t| t.shape() == [n, k])
            .ok_or_else(|| {
                EngineError::invalid(
                    "--quant",
                    format!(
                        "no dequantisation buffer of [{n}, {k}] for this pass (make the \
                         buffers with Model::buffers)"
                    ),
                )
            })
    }

    fn w8a8(&mut self) -> Result<&mut W8A8Buffers> {
        self.w8a8.as_mut().ok_or_else(|| {
            EngineError::invalid(
                "--quant",
                "no W8A8 buffers for this pass (make the buffers with Model::buffers)",
            )
        })
    }
}

fn deq<'a>(
    acc: &'a DeviceTensor<i32>,
    act: &'a DeviceTensor<f32>,
    w: &'a QuantLinear,
) -> Dequant<'a> {
    Dequant {
        acc,
        act_scale: act,
        weight_scale: &w.scales,
    }
}

/// W8A8 QKV: `x_q = quant(rms_norm(h, attn_norm))`, `qkv = T(deq(x_q·Wqkvᵀ) + bqkv)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn w8a8_qkv<T: RunDType>(
    stream: &Arc<CudaStream>,
    blas: &mut Blas,
    scratch: &mut QuantBuffers<T>,
    h: &DeviceTensor<T>,
    attn_norm: &DeviceTensor<T>,
    eps: f32,
    w: &QuantLinear,
    bias: Option<&DeviceTensor<T>>,
    qkv: &mut DeviceTensor<T>,
) -> Result<()> {
    let b = scratch.w8a8()?;
    let (h, attn_norm, qkv) = (T::half(h)?, T::half(attn_norm)?, T::half_mut(qkv)?);
    let bias = bias.map(T::half).transpose()?;
    quant::rms_norm_quant(stream, h, attn_norm, eps, &mut b.x_h, &mut b.s0)?;
    w.forward(blas, &b.x_h, &mut b.acc_qkv)?;
    quant::dequantize(stream, deq(&b.acc_qkv, &b.s0, w), bias, qkv)?;
    Ok(())
}

/// W8A8 O projection: `h += deq(quant(attn)·Woᵀ) (+ bo)`, then the gate|up GEMM's input
/// `quant(rms_norm(h, ffn_norm))` (in the scratch; `x` is written only on the bias path).
#[allow(clippy::too_many_arguments)]
pub(crate) fn w8a8_o<T: RunDType>(
    stream: &Arc<CudaStream>,
    blas: &mut Blas,
    scratch: &mut QuantBuffers<T>,
    attn: &DeviceTensor<T>,
    w: &QuantLinear,
    bias: Option<&DeviceTensor<T>>,
    h: &mut DeviceTensor<T>,
    ffn_norm: &DeviceTensor<T>,
    eps: f32,
    tmp: &mut DeviceTensor<T>,
    x: &mut DeviceTensor<T>,
) -> Result<()> {
    let b = scratch.w8a8()?;
    let (attn, h, ffn_norm) = (T::half(attn)?, T::half_mut(h)?, T::half(ffn_norm)?);
    let (tmp, x) = (T::half_mut(tmp)?, T::half_mut(x)?);
    let bias = bias.map(T::half).transpose()?;
    quant::quantize_per_token(stream, attn, &mut b.x_a, &mut b.s1)?;
    w.forward(blas, &b.x_a, &mut b.acc_h)?;
    match bias {
        None => quant::dequant_add_rms_norm_quant(
            stream,
            deq(&b.acc_h, &b.s1, w),
            h,
            ffn_norm,
            eps,
            &mut b.x_h,
            &mut b.s0,
        )?,
        Some(bo) => {
            quant::dequantize(stream, deq(&b.acc_h, &b.s1, w), Some(bo), tmp)?;
            norm::add_rms_norm(stream, tmp, h, ffn_norm, eps, x)?;
            quant::quantize_per_token(stream, x, &mut b.x_h, &mut b.s0)?;
        }
    }
    Ok(())
}

/// W8A8 gate|up: `m_q = quant(silu(g)·u)` with `g|u = deq(x_q·Wguᵀ) (+ b)` (in the scratch).
pub(crate) fn w8a8_gate_up<T: RunDType>(
    stream: &Arc<CudaStream>,
    blas: &mut Blas,
    scratch: &mut QuantBuffers<T>,
    w: &QuantLinear,
    bias: Option<&DeviceTensor<T>>,
    gate_up: &mut DeviceTensor<T>,
    act: &mut DeviceTensor<T>,
) -> Result<()> {
    let b = scratch.w8a8()?;
    let (gate_up, act) = (T::half_mut(gate_up)?, T::half_mut(act)?);
    let bias = bias.map(T::half).transpose()?;
    w.forward(blas, &b.x_h, &mut b.acc_gu)?;
    match bias {
        None => {
            quant::dequant_silu_mul_quant(stream, deq(&b.acc_gu, &b.s0, w), &mut b.x_i, &mut b.s1)?
        }
        Some(bgu) => {
            quant::dequantize(stream, deq(&b.acc_gu, &b.s0, w), Some(bgu), gate_up)?;
            activation::swiglu_fused(stream, gate_up, act)?;
            quant::quantize_per_token(stream, act, &mut b.x_i, &mut b.s1)?;
        }
    }
    Ok(())
}

/// W8A8 down: `h += deq(m_q·Wdownᵀ) (+ b)`; then `x = rms_norm(h, next_norm)` when `need_x`
/// (the next layer is not W8A8, or this is the last) or on the bias path.
#[allow(clippy::too_many_arguments)]
pub(crate) fn w8a8_down<T: RunDType>(
    stream: &Arc<CudaStream>,
    blas: &mut Blas,
    scratch: &mut QuantBuffers<T>,
    w: &QuantLinear,
    bias: Option<&DeviceTensor<T>>,
    h: &mut DeviceTensor<T>,
    next_norm: &DeviceTensor<T>,
    eps: f32,
    need_x: bool,
    tmp: &mut DeviceTensor<T>,
    x: &mut DeviceTensor<T>,
) -> Result<()> {
    let b = scratch.w8a8()?;
    let (h, next_norm) = (T::half_mut(h)?, T::half(next_norm)?);
    let (tmp, x) = (T::half_mut(tmp)?, T::half_mut(x)?);
    let bias = bias.map(T::half).transpose()?;
    w.forward(blas, &b.x_i, &mut b.acc_h)?;
    match bias {
        None => {
            quant::dequant_add(stream, deq(&b.acc_h, &b.s1, w), h)?;
            if need_x {
                norm::rms_norm(stream, h, next_norm, eps, x)?;
            }
        }
        Some(bd) => {
            quant::dequantize(stream, deq(&b.acc_h, &b.s1, w), Some(bd), tmp)?;
            norm::add_rms_norm(stream, tmp, h, next_norm, eps, x)?;
        }
    }
    Ok(())
}

/// Splits the `n` rows of `w [n, k]` over threads and runs `f(rows, row_count)` on each
/// block of rows, in row order.
pub(crate) fn par_rows<R: Send>(
    w: &[f32],
    n: usize,
    k: usize,
    f: impl Fn(&[f32], usize) -> fl_kernels::Result<R> + Sync,
) -> Result<Vec<R>> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |p| p.get())
        .min(32)
        .min(n.max(1));
    if threads <= 1 || n * k < (1 << 18) || k == 0 {
        return Ok(vec![f(w, n)?]);
    }
    let rows = n.div_ceil(threads);
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = w
            .chunks(rows * k)
            .map(|c| s.spawn(move || f(c, c.len() / k)))
            .collect();
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(r) => r.map_err(EngineError::from),
                Err(_) => Err(EngineError::invalid(
                    "--quant",
                    "a quantisation thread panicked",
                )),
            })
            .collect()
    })
}

/// Quantises the host weight `w [n, k]` (row-major f32) for `quant` and uploads it on
/// `stream`; the dense mode rounds it to `T`. Rows are quantised on several threads (every
/// format quantises row by row, so the blocks concatenate into the whole).
///
/// Errors: [`EngineError::Invalid`] naming `--quant` for a shape the mode cannot take
/// (see [`Quant::check`]) or for `gguf` (it copies a file's blocks: see
/// [`crate::gguf::native`]); those of [`gemv::quantize`] (e.g. a non-finite weight) and of
/// the upload.
pub fn quantize_linear<T: RunDType>(
    stream: &Arc<CudaStream>,
    w: &[f32],
    n: usize,
    k: usize,
    quant: Quant,
) -> Result<Linear<T>> {
    if w.len() != n * k {
        return Err(EngineError::invalid(
            "--quant",
            format!("{} weight values for [{n}, {k}]", w.len()),
        ));
    }
    match quant {
        Quant::Gguf => Err(EngineError::invalid(
            "--quant",
            "`gguf` runs a GGUF file's own blocks: there is nothing to quantise",
        )),
        Quant::None => {
            let v: Vec<T> = w.iter().map(|&x| T::from_f32(x)).collect();
            Ok(Linear::Dense(DeviceTensor::from_host(stream, &v, &[n, k])?))
        }
        Quant::WeightOnly(format) => {
            let parts = par_rows(w, n, k, |rows, r| gemv::quantize(rows, r, k, format))?;
            let (mut data, mut s32, mut s16, mut zeros) =
                (Vec::new(), Vec::<f32>::new(), Vec::<f16>::new(), Vec::new());
            for p in &parts {
                data.extend_from_slice(p.data());
                match p.scales() {
                    Scales::F32(s) => s32.extend_from_slice(s),
                    Scales::F16(s) => s16.extend_from_slice(s),
                    Scales::None => {}
                }
                zeros.extend_from_slice(p.zeros());
            }
            drop(parts);
            let scales = match format {
                QuantFormat::Int8 => Scales::F32(&s32),
                QuantFormat::Int4 { .. } => Scales::F16(&s16),
                _ => Scales::None,
            };
            let q = QuantizedHost::new(format, n, k, data, scales, zeros)?;
            Ok(Linear::WeightOnly(QuantWeight::upload(stream, &q)?))
        }
        Quant::W8A8 => {
            if n % 4 != 0 || k % 4 != 0 || n == 0 || k == 0 {
                return Err(EngineError::invalid(
                    "--quant",
                    format!("w8a8 needs both sizes of a weight multiples of 4, got [{n}, {k}]"),
                ));
            }
            let parts = par_rows(w, n, k, |rows, r| {
                fl_kernels::quant::quantize_weights_per_channel(rows, r, k)
            })?;
            let (mut q, mut s) = (Vec::with_capacity(n * k), Vec::with_capacity(n));
            for (pq, ps) in parts {
                q.extend_from_slice(&pq);
                s.extend_from_slice(&ps);
            }
            Ok(Linear::W8A8(QuantLinear {
                weight: DeviceTensor::from_host(stream, &q, &[n, k])?,
                scales: DeviceTensor::from_host(stream, &s, &[n])?,
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for &n in Quant::NAMES {
            let q = Quant::parse(n).unwrap();
            assert_eq!(q.name(), n);
            assert_eq!(n.parse::<Quant>().unwrap(), q);
            assert_eq!(q.to_string(), n);
        }
    }

    #[test]
    fn par_rows_keeps_row_order() {
        let (n, k) = (1000, 512);
        let w: Vec<f32> = (0..n * k).map(|i| (i / k) as f32).collect();
        let parts = par_rows(&w, n, k, |rows, r| Ok((rows[0], r))).unwrap();
        let mut next = 0;
        for (first, r) in parts {
            assert_eq!(first, next as f32);
            next += r;
        }
        assert_eq!(next, n);
    }
}
