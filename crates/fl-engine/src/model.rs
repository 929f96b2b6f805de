//! A LLaMA-family model on the GPU: its weights ([`Weights`]), where they come from
//! ([`WeightSource`]: a safetensors checkpoint or dummy values for a preset), and the
//! decoder stack ([`Model::forward`]) over a batch of tokens.
//!
//! The forward pass is FasterLLaMA's decoder with the residual-add fused into the next
//! RMSNorm:
//!
//! ```text
//! h = embed(ids); x = rms_norm(h, attn_norm[0])
//! for each layer l:
//!     q, k, v = x·Wqᵀ (+bq), x·Wkᵀ (+bk), x·Wvᵀ (+bv)
//!     rope(q, k, positions); cache[l].append(k, v, (seq_ids, positions))
//!     a = attention(q, cache[l] or the packed k, v)        causal, GQA
//!     h += a·Woᵀ;  x = rms_norm(h, ffn_norm[l])             one fused kernel
//!     g = x·[Wgate|Wup]ᵀ;  m = silu(g_gate) * g_up          one GEMM, one fused kernel
//!     h += m·Wdownᵀ; x = rms_norm(h, attn_norm[l+1] or final_norm)
//! logits = x[last token of each sequence]·Wlmᵀ
//! ```
//!
//! Q, K and V projections are stacked on load (`[q + 2 kv, hidden]`, the q and k rows of each
//! head reordered so that every rotate-half pair is adjacent: [`qkv_row_order`], and the
//! rotation run with the interleaved pairing): one GEMM, then one fused kernel splits its
//! output, rotates q and k and appends k and v to the cache ([`kv_cache::rope_append`]).
//! Gate and up are stacked too (`[2 * intermediate, hidden]`).
//! Up to [`Model::gemv_max_m`] tokens (decode), the projections run on the dense GEMV of
//! `fl_kernels::gemv_dense` with the SwiGLU and the residual add fused into them, RoPE and the
//! KV append fused into the QKV GEMV ([`Model::fuse_rope`]), and (when the o/gate/up/down
//! projections have no bias, as in LLaMA, and [`Model::fuse_norm_max_m`] allows it) each
//! RMSNorm fused into the GEMV that reads it, so a decode layer is 5 kernels:
//! norm+QKV+RoPE+append, attention, o+add, norm+gate/up+SwiGLU, down+add. Past it (prefill) on
//! cuBLASLt. The dense
//! GEMV is f16/bf16 only: an f32 model runs every projection on cuBLASLt (f32 compute, no
//! TF32) with the separate SwiGLU and add+RMSNorm kernels, and keeps its KV cache in f32
//! ([`RunDType::DENSE_GEMV`]).
//!
//! With `--quant` ([`Quant`], loaded by [`Weights::load_quant`]) the four projections of each
//! layer are [`Linear`]s in another form: weight-only int8/int4/Q8_0/Q4_0 (the quantised GEMV
//! up to 16 tokens, a dequantised copy and cuBLASLt past it; the SwiGLU and the residual add
//! then run as separate kernels) or W8A8 (int8 GEMMs with the (de)quantisation fused into
//! the kernels around them). The embedding, the LM head and the norms stay dense. See
//! [`crate::linear`]. Buffers for a quantised model come from [`Model::buffers`].

use std::sync::Arc;

use fl_blas::{Blas, GemmType};
use fl_kernels::attention::{self, DecodeParams, DecodeWorkspace};
use fl_kernels::attention_prefill::{self, PrefillParams};
use fl_kernels::cudarc::driver::CudaStream;
use fl_kernels::embedding::{self, DeviceStatus};
use fl_kernels::gemv_dense::{self, QkvRopeAppend, RmsNorm};
use fl_kernels::kv_cache::{self, CacheLayout, KvCache, QkvSplit, RopeAppend, TokenSlots};
use fl_kernels::rope::{self, RopeParams, RopeStyle, Scaling};
use fl_kernels::{activation, norm, DeviceTensor, FloatDType, HalfDType};

use crate::config::{ModelConfig, RopeScaling};
use crate::error::{EngineError, Result};
use crate::linear::{self, Linear, Quant, QuantBuffers};
use crate::weights::Checkpoint;

/// Element types the engine runs in: `f32`, `f16` or `bf16` (weights, activations and the
/// KV cache). Its name is `DType::NAME`.
///
/// Small passes may run their projections on the dense GEMV of `fl_kernels::gemv_dense`,
/// which exists for `f16`/`bf16` only: [`DENSE_GEMV`](Self::DENSE_GEMV) says whether this
/// dtype has it, and the `dense_*` methods call it. For `f32` ([`DENSE_GEMV`](Self::DENSE_GEMV)
/// false, [`Model::gemv_max_m`] 0) they are never called and return an error if they were.
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

/// The dense weight of a projection on the fused path (which is taken only when all are dense).
fn dense<T: RunDType>(p: &Linear<T>) -> Result<&DeviceTensor<T>> {
    p.as_dense()
        .ok_or_else(|| EngineError::invalid("quant", "the fused path needs dense weights"))
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

/// The weights of one decoder layer, on the device: norms and biases in the run dtype, the
/// four projections as [`Linear`]s (dense in the run dtype, or quantised per [`Quant`]; all
/// four in the same form).
pub struct LayerWeights<T: RunDType> {
    /// `input_layernorm` `[hidden]`.
    pub attn_norm: DeviceTensor<T>,
    /// `q_proj`, `k_proj`, `v_proj` stacked: `[(q_heads + 2 kv_heads) * head_dim, hidden]`.
    pub wqkv: Linear<T>,
    /// Their biases stacked (Qwen2), when the config has them.
    pub bqkv: Option<DeviceTensor<T>>,
    /// `o_proj` `[hidden, q_heads * head_dim]`.
    pub wo: Linear<T>,
    /// `o_proj` bias.
    pub bo: Option<DeviceTensor<T>>,
    /// `post_attention_layernorm` `[hidden]`.
    pub ffn_norm: DeviceTensor<T>,
    /// `gate_proj` then `up_proj`, concatenated: `[2 * intermediate, hidden]`.
    pub w_gate_up: Linear<T>,
    /// Gate|up bias `[2 * intermediate]` (`mlp_bias`).
    pub b_gate_up: Option<DeviceTensor<T>>,
    /// `down_proj` `[hidden, intermediate]`.
    pub w_down: Linear<T>,
    /// `down_proj` bias.
    pub b_down: Option<DeviceTensor<T>>,
}

/// Every weight of the model on the device.
pub struct Weights<T: RunDType> {
    /// `embed_tokens` `[vocab, hidden]`.
    pub embed: DeviceTensor<T>,
    /// The decoder layers.
    pub layers: Vec<LayerWeights<T>>,
    /// `model.norm` `[hidden]`.
    pub final_norm: DeviceTensor<T>,
    /// `lm_head` `[vocab, hidden]`; `None` when tied to `embed`.
    pub lm_head: Option<DeviceTensor<T>>,
    /// How the layers' projections are stored.
    pub quant: Quant,
}

impl<T: RunDType> Weights<T> {
    /// Bytes of all weights on the device (quantised projections at their packed size with
    /// their scales: [`Quant::weight_bytes`]).
    pub fn bytes(&self) -> u64 {
        let mut n = self.embed.num_bytes() + self.final_norm.num_bytes();
        n += self.lm_head.as_ref().map_or(0, |t| t.num_bytes());
        for l in &self.layers {
            n += l.attn_norm.num_bytes()
                + l.wqkv.num_bytes()
                + l.wo.num_bytes()
                + l.ffn_norm.num_bytes()
                + l.w_gate_up.num_bytes()
                + l.w_down.num_bytes();
            n += l.bqkv.as_ref().map_or(0, |t| t.num_bytes());
            n += l.bo.as_ref().map_or(0, |t| t.num_bytes());
            n += l.b_gate_up.as_ref().map_or(0, |t| t.num_bytes());
            n += l.b_down.as_ref().map_or(0, |t| t.num_bytes());
        }
        n as u64
    }

    /// Bytes one decode step must read from the weights: all of them except the embedding
    /// table, of which only the batch's rows are read, unless it doubles as the LM head.
    pub fn bytes_per_step(&self) -> u64 {
        match self.lm_head {
            Some(_) => self.bytes() - self.embed.num_bytes() as u64,
            None => self.bytes(),
        }
    }
}

/// Where weight values come from.
pub enum WeightSource<'a> {
    /// A safetensors checkpoint, converted to the run dtype on load.
    Checkpoint(&'a Checkpoint),
    /// Deterministic pseudo-random values (`N(0, 0.02)`-like, norms 1.0): for `fl bench`
    /// on a preset with no download. Values repeat with a long period, which is fine for
    /// timing and keeps loading fast.
    Dummy {
        /// Seed of the value stream.
        seed: u64,
    },
}

/// Called after each tensor is loaded with (bytes loaded so far, total bytes); the total is
/// [`Quant::weight_bytes`] of the mode loaded.
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64);

struct Loader<'a, 'p> {
    stream: &'a Arc<CudaStream>,
    src: WeightSource<'a>,
    chunk: Vec<f32>,
    done: u64,
    total: u64,
    progress: Option<Progress<'p>>,
}

const DUMMY_CHUNK: usize = (1 << 20) + 7;

impl<'a> Loader<'a, '_> {
    fn host<T: RunDType>(&mut self, name: &str, shape: &[usize], norm: bool) -> Result<Vec<T>> {
        let n: usize = shape.iter().product();
        let v = match &self.src {
            WeightSource::Checkpoint(ck) => {
                let dtypes = [
                    safetensors::Dtype::F32,
                    safetensors::Dtype::F16,
                    safetensors::Dtype::BF16,
                ];
                ck.expect(name, shape, &dtypes)?.to_vec::<T>()?
            }
            WeightSource::Dummy { .. } if norm => vec![T::from_f32(1.0); n],
            WeightSource::Dummy { .. } => self.dummy(name, n).map(T::from_f32).collect(),
        };
        Ok(v)
    }

    /// The dummy values of tensor `name` (`n` of them).
    fn dummy(&self, name: &str, n: usize) -> impl Iterator<Item = f32> + '_ {
        let c = &self.chunk;
        let off = (name.len() * 7919) % c.len();
        (0..n).map(move |i| c[(off + i) % c.len()])
    }

    /// A linear weight's values in f32 (the checkpoint's widened exactly), for quantisation.
    fn host_f32(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let n: usize = shape.iter().product();
        Ok(match &self.src {
            WeightSource::Checkpoint(ck) => ck
                .expect(name, shape, crate::weights::FLOAT_DTYPES)?
                .to_vec::<f32>()?,
            WeightSource::Dummy { .. } => self.dummy(name, n).collect(),
        })
    }

    /// Weights of shapes `[rows_i, k]` stacked along the first dimension, as a [`Linear`] in
    /// mode `quant` (dense: exactly [`Loader::stacked`]; quantised: from the f32 values).
    /// `order`: the row order on the device ([`qkv_row_order`]), `None` to keep the stacking's.
    fn linear<T: RunDType>(
        &mut self,
        parts: &[(String, Vec<usize>)],
        quant: Quant,
        order: Option<&[usize]>,
    ) -> Result<Linear<T>> {
        if quant.is_dense() {
            return Ok(Linear::Dense(self.stacked(parts, order)?));
        }
        let mut v = Vec::new();
        let mut rows = 0;
        for (name, shape) in parts {
            v.extend(self.host_f32(name, shape)?);
            rows += shape[0];
        }
        if let Some(o) = order {
            v = reorder_rows(&v, o);
        }
        let k = parts[0].1[1];
        let lin = linear::quantize_linear(self.stream, &v, rows, k, quant)?;
        self.tick(lin.num_bytes());
        Ok(lin)
    }

    fn tensor<T: RunDType>(
        &mut self,
        name: &str,
        shape: &[usize],
        norm: bool,
    ) -> Result<DeviceTensor<T>> {
        let v = self.host::<T>(name, shape, norm)?;
        let t = DeviceTensor::from_host(self.stream, &v, shape)?;
        self.tick(t.num_bytes());
        Ok(t)
    }

    fn tick(&mut self, bytes: usize) {
        self.done += bytes as u64;
        if let Some(p) = self.progress.as_mut() {
            p(self.done, self.total);
        }
    }

    /// Tensors of shapes `[rows_i, cols...]` stacked along the first dimension, then (with
    /// `order`) their rows reordered as [`reorder_rows`] does.
    fn stacked<T: RunDType>(
        &mut self,
        parts: &[(String, Vec<usize>)],
        order: Option<&[usize]>,
    ) -> Result<DeviceTensor<T>> {
        let mut v = Vec::new();
        let mut rows = 0;
        for (name, shape) in parts {
            v.extend(self.host::<T>(name, shape, false)?);
            rows += shape[0];
        }
        if let Some(o) = order {
            v = reorder_rows(&v, o);
        }
        let mut s = parts[0].1.clone();
        s[0] = rows;
        let t = DeviceTensor::from_host(self.stream, &v, &s)?;
        self.tick(t.num_bytes());
        Ok(t)
    }
}

fn dummy_chunk(seed: u64) -> Vec<f32> {
    // Sum of four uniforms: roughly normal, std 0.02 after scaling.
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..DUMMY_CHUNK)
        .map(|_| {
            let s = next() + next() + next() + next() - 2.0; // var 4/12
            s * 0.02 / (1.0f32 / 3.0).sqrt()
        })
        .collect()
}

impl<T: RunDType> Weights<T> {
    /// Loads every weight of `cfg` from `src` onto `stream`'s device in dtype `T`, dense
    /// ([`Weights::load_quant`] with [`Quant::None`]).
    ///
    /// Errors: a missing tensor or one of the wrong shape or dtype names the tensor and the
    /// file ([`crate::weights::WeightsError`]); device allocation failures.
    pub fn load(
        stream: &Arc<CudaStream>,
        cfg: &ModelConfig,
        src: WeightSource<'_>,
        progress: Option<Progress<'_>>,
    ) -> Result<Self> {
        Self::load_quant(stream, cfg, src, Quant::None, progress)
    }

    /// Loads every weight of `cfg` from `src` onto `stream`'s device: the embedding, the LM
    /// head, norms and biases in dtype `T`, each layer's four projections in mode `quant`
    /// (quantised on the host from their f32 values, one stacked weight at a time, rows
    /// split over threads; see [`crate::linear`]).
    ///
    /// Errors: those of [`Weights::load`]; [`EngineError::Invalid`] naming `--quant` when the
    /// dtype cannot run the mode ([`Quant::check_dtype`]) or a projection's shape does not
    /// fit it ([`Quant::check`]).
    pub fn load_quant(
        stream: &Arc<CudaStream>,
        cfg: &ModelConfig,
        src: WeightSource<'_>,
        quant: Quant,
        progress: Option<Progress<'_>>,
    ) -> Result<Self> {
        quant.check_dtype(<T as fl_kernels::DType>::NAME)?;
        quant.check(cfg)?;
        let chunk = match src {
            WeightSource::Dummy { seed } => dummy_chunk(seed),
            WeightSource::Checkpoint(_) => Vec::new(),
        };
        let total = quant.weight_bytes(cfg, std::mem::size_of::<T>());
        let mut ld = Loader {
            stream,
            src,
            chunk,
            done: 0,
            total,
            progress,
        };
        let (h, q, kv, i, v) = (
            cfg.hidden_size,
            cfg.q_size(),
            cfg.kv_size(),
            cfg.intermediate_size,
            cfg.vocab_size,
        );
        let qkv_order = qkv_row_order(cfg)?;
        let embed = ld.tensor("model.embed_tokens.weight", &[v, h], false)?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let a = format!("{p}.self_attn");
            let m = format!("{p}.mlp");
            let part = |what: &str, rows: usize, weight: bool| {
                if weight {
                    (format!("{a}.{what}_proj.weight"), vec![rows, h])
                } else {
                    (format!("{a}.{what}_proj.bias"), vec![rows])
                }
            };
            let wqkv = ld.linear(
                &[part("q", q, true), part("k", kv, true), part("v", kv, true)],
                quant,
                Some(&qkv_order),
            )?;
            let bqkv = if cfg.qkv_bias {
                Some(ld.stacked(
                    &[
                        part("q", q, false),
                        part("k", kv, false),
                        part("v", kv, false),
                    ],
                    Some(&qkv_order),
                )?)
            } else {
                None
            };
            layers.push(LayerWeights {
                attn_norm: ld.tensor(&format!("{p}.input_layernorm.weight"), &[h], true)?,
                wqkv,
                bqkv,
                wo: ld.linear(&[(format!("{a}.o_proj.weight"), vec![h, q])], quant, None)?,
                bo: if cfg.o_bias {
                    Some(ld.tensor(&format!("{a}.o_proj.bias"), &[h], false)?)
                } else {
                    None
                },
                ffn_norm: ld.tensor(&format!("{p}.post_attention_layernorm.weight"), &[h], true)?,
                w_gate_up: ld.linear(
                    &[
                        (format!("{m}.gate_proj.weight"), vec![i, h]),
                        (format!("{m}.up_proj.weight"), vec![i, h]),
                    ],
                    quant,
                    None,
                )?,
                b_gate_up: if cfg.mlp_bias {
                    Some(ld.stacked(
                        &[
                            (format!("{m}.gate_proj.bias"), vec![i]),
                            (format!("{m}.up_proj.bias"), vec![i]),
                        ],
                        None,
                    )?)
                } else {
                    None
                },
                w_down: ld.linear(
                    &[(format!("{m}.down_proj.weight"), vec![h, i])],
                    quant,
                    None,
                )?,
                b_down: if cfg.mlp_bias {
                    Some(ld.tensor(&format!("{m}.down_proj.bias"), &[h], false)?)
                } else {
                    None
                },
            });
        }
        let final_norm = ld.tensor("model.norm.weight", &[h], true)?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(ld.tensor("lm_head.weight", &[v, h], false)?)
        };
        Ok(Weights {
            embed,
            layers,
            final_norm,
            lm_head,
            quant,
        })
    }
}

/// The RoPE parameters of a config, in the kernel's terms. The pairing is **interleaved**:
/// Hugging Face LLaMA checkpoints are laid out for rotate-half, and the loader permutes the q
/// and k rows of every QKV weight (and bias) by [`qkv_row_order`] so that each rotate-half
/// pair is adjacent; attention is unchanged (q and k are permuted alike), and the decode
/// step can rotate in the QKV GEMV's epilogue, where a lane holds adjacent outputs.
pub fn rope_params(cfg: &ModelConfig) -> RopeParams {
    let scaling = match cfg.rope_scaling {
        RopeScaling::None => Scaling::None,
        RopeScaling::Linear { factor } => Scaling::Linear { factor },
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => Scaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        },
    };
    RopeParams::new(cfg.head_dim, cfg.rope_theta)
        .with_style(RopeStyle::Interleaved)
        .with_scaling(scaling)
}

/// The row order of a layer's stacked QKV weight (and bias) on the device: new row `i` is row
/// `order[i]` of the checkpoint's `[q; k; v]`. Within every q and k head the rotate-half pairs
/// `(e, e + head_dim / 2)` become adjacent rows `(2e, 2e + 1)`
/// ([`rope::rotate_half_to_interleaved_rows`]); v rows keep their place. With
/// [`rope_params`]' interleaved pairing this computes exactly the checkpoint's attention.
pub fn qkv_row_order(cfg: &ModelConfig) -> Result<Vec<usize>> {
    let d = cfg.head_dim;
    let (hq, hkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let mut order = rope::rotate_half_to_interleaved_rows(hq, d, d)?;
    order.extend(
        rope::rotate_half_to_interleaved_rows(hkv, d, d)?
            .into_iter()
            .map(|r| r + hq * d),
    );
    order.extend((0..hkv * d).map(|r| r + (hq + hkv) * d));
    Ok(order)
}

/// `v` (`rows` rows of equal length) with its rows reordered: row `i` of the result is row
/// `order[i]` of `v`.
fn reorder_rows<E: Copy>(v: &[E], order: &[usize]) -> Vec<E> {
    let row = v.len() / order.len().max(1);
    let mut out = Vec::with_capacity(v.len());
    for &r in order {
        out.extend_from_slice(&v[r * row..(r + 1) * row]);
    }
    out
}

/// Per-token scratch of a forward pass over `m` tokens: every intermediate tensor,
/// allocated once and reused (the decode step's buffers are what its CUDA graph reads).
pub struct Buffers<T: RunDType> {
    m: usize,
    /// Residual stream `[m, hidden]`.
    pub h: DeviceTensor<T>,
    /// Normalised input of the next GEMM `[m, hidden]`.
    pub x: DeviceTensor<T>,
    qkv: DeviceTensor<T>,
    q: DeviceTensor<T>,
    k: DeviceTensor<T>,
    v: DeviceTensor<T>,
    attn: DeviceTensor<T>,
    tmp: DeviceTensor<T>,
    gate_up: DeviceTensor<T>,
    act: DeviceTensor<T>,
    /// Token ids `[m]`.
    pub ids: DeviceTensor<i32>,
    /// Position of each token in its sequence `[m]`.
    pub positions: DeviceTensor<i32>,
    /// Sequence (cache row) of each token `[m]`.
    pub seq_ids: DeviceTensor<i32>,
    /// Keys visible to each token for the attention kernel `[m]` (position + 1).
    pub visible: DeviceTensor<i32>,
    /// Prefill: prefix offsets of the packed sequences `[batch + 1]`.
    pub cu_seqlens: DeviceTensor<i32>,
    attn_ws: DecodeWorkspace,
    /// Embedding-lookup status (an out-of-vocabulary id).
    pub status: DeviceStatus,
    /// The quantised projections' scratch ([`Model::buffers`]; empty from [`Buffers::new`]).
    quant: QuantBuffers<T>,
}

impl<T: RunDType> Buffers<T> {
    /// Buffers for `m` tokens of `cfg` running attention in `mode` over `cache` (whose
    /// shapes size the attention workspace), for a dense model; a quantised model's come from
    /// [`Model::buffers`].
    pub fn new(
        stream: &Arc<CudaStream>,
        cfg: &ModelConfig,
        m: usize,
        cache: &Cache<T>,
        mode: AttnMode,
    ) -> Result<Self> {
        let (h, q, kv, i) = (
            cfg.hidden_size,
            cfg.q_size(),
            cfg.kv_size(),
            cfg.intermediate_size,
        );
        let z = |shape: &[usize]| DeviceTensor::<T>::zeros(stream, shape);
        let zi = |shape: &[usize]| DeviceTensor::<i32>::zeros(stream, shape);
        let lens = zi(&[m])?;
        let ws_bytes = match (cache.layers.first(), mode) {
            (Some(kvc), AttnMode::Decode) => {
                let qt = z(&[m, cfg.num_attention_heads, cfg.head_dim])?;
                let params = decode_params(cfg, cache.capacity);
                let c = attention::KvCache::Contiguous {
                    k: kvc.k(),
                    v: kvc.v(),
                };
                attention::decode_workspace_bytes(stream, &qt, &c, &lens, &params)?
            }
            _ => 0,
        };
        Ok(Buffers {
            m,
            h: z(&[m, h])?,
            x: z(&[m, h])?,
            qkv: z(&[m, q + 2 * kv])?,
            q: z(&[m, cfg.num_attention_heads, cfg.head_dim])?,
            k: z(&[m, cfg.num_key_value_heads, cfg.head_dim])?,
            v: z(&[m, cfg.num_key_value_heads, cfg.head_dim])?,
            attn: z(&[m, q])?,
            tmp: z(&[m, h])?,
            gate_up: z(&[m, 2 * i])?,
            act: z(&[m, i])?,
            ids: zi(&[m])?,
            positions: zi(&[m])?,
            seq_ids: zi(&[m])?,
            visible: lens,
            cu_seqlens: zi(&[cache.batch + 1])?,
            attn_ws: DecodeWorkspace::new(stream, ws_bytes)?,
            status: DeviceStatus::new(stream)?,
            quant: QuantBuffers::default(),
        })
    }

    /// Tokens these buffers hold.
    pub fn tokens(&self) -> usize {
        self.m
    }

    /// Uploads a step's token metadata (each `[m]`): ids and sequence rows when given (the
    /// decode loop's rows never change, so it sends them once), positions, and
    /// `visible = positions + 1`.
    pub fn upload(
        &mut self,
        stream: &Arc<CudaStream>,
        ids: Option<&[i32]>,
        positions: &[i32],
        seq_ids: Option<&[i32]>,
    ) -> Result<()> {
        if let Some(ids) = ids {
            self.ids.copy_from_host(stream, ids)?;
        }
        if let Some(seq_ids) = seq_ids {
            self.seq_ids.copy_from_host(stream, seq_ids)?;
        }
        self.positions.copy_from_host(stream, positions)?;
        let vis: Vec<i32> = positions.iter().map(|p| p + 1).collect();
        self.visible.copy_from_host(stream, &vis)?;
        Ok(())
    }
}

/// The KV cache of every layer: contiguous `[batch, kv_heads, capacity, head_dim]` K and V.
pub struct Cache<T: RunDType> {
    /// One per layer.
    pub layers: Vec<KvCache<T>>,
    /// Positions per sequence.
    pub capacity: usize,
    /// Sequences.
    pub batch: usize,
}

impl<T: RunDType> Cache<T> {
    /// Allocates (zeroed) caches for `batch` sequences of up to `capacity` positions.
    pub fn new(
        stream: &Arc<CudaStream>,
        cfg: &ModelConfig,
        batch: usize,
        capacity: usize,
    ) -> Result<Self> {
        let shape = [batch, cfg.num_key_value_heads, capacity, cfg.head_dim];
        let layers = (0..cfg.num_hidden_layers)
            .map(|_| KvCache::zeros(stream, shape))
            .collect::<fl_kernels::Result<Vec<_>>>()?;
        Ok(Cache {
            layers,
            capacity,
            batch,
        })
    }

    /// Device bytes of the whole cache.
    pub fn bytes(&self) -> u64 {
        self.layers
            .iter()
            .map(|c| 2 * c.k().num_bytes() as u64)
            .sum()
    }
}

/// How the attention of a forward pass reads its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnMode {
    /// One new token per sequence (`m == batch`, token `b` is sequence `b`): the decode
    /// kernel over the cache.
    Decode,
    /// Packed prompt tokens of several sequences starting at position 0 (offsets in
    /// `cu_seqlens`): causal flash attention over this pass's own K/V
    /// ([`attention_prefill::prefill`]); the cache is written for the decode steps.
    Prefill {
        /// The longest sequence in the batch.
        max_len: usize,
    },
}

/// The decode kernel's parameters. They always cover the whole capacity, so the split
/// layout does not depend on the step (a captured graph stays valid as sequences grow).
fn decode_params(cfg: &ModelConfig, capacity: usize) -> DecodeParams {
    let mut p = DecodeParams::new(cfg.head_dim, capacity);
    p.scale = cfg.attention_scale() as f32;
    p.window = cfg.sliding_window;
    p
}

/// Default of [`Model::gemv_max_m`].
pub const DEFAULT_GEMV_MAX_M: usize = 4;

/// Default of [`Model::fuse_norm_max_m`].
pub const DEFAULT_FUSE_NORM_MAX_M: usize = 1;

/// The environment variable `name` as a count, `default` when unset or empty; a value that
/// is not a number also gives `default`, with a notice on stderr (a misspelt knob must not
/// pass for a measurement of the setting it meant).
fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v.trim().parse::<usize>().unwrap_or_else(|_| {
            eprintln!("fl: {name}={v} is not a count; using {default}");
            default
        }),
        _ => default,
    }
}

/// A model ready to run: config, weights and the cuBLASLt handle, on one stream.
pub struct Model<T: RunDType> {
    /// The configuration.
    pub cfg: ModelConfig,
    /// The weights.
    pub weights: Weights<T>,
    rope: RopeParams,
    eps: f32,
    /// Passes of at most this many tokens run their projections on the dense GEMV
    /// (`fl_kernels::gemv_dense`, fused SwiGLU and residual add); larger ones on cuBLASLt.
    /// 0 turns the GEMV off. Default 4: on the H100 the GEMV beats cuBLASLt at 1 token
    /// (1.02-1.10x, 2.6x on small matrices) but not at 16 (0.83x on 4096 x 11008; decode at
    /// batch 16 ran at 82% of the floor with it and 87% without). `FL_GEMV_MAX_M` overrides
    /// it (at most 16, the kernel's limit). Always 0 for a dtype without the dense GEMV
    /// (f32: [`RunDType::DENSE_GEMV`]).
    pub gemv_max_m: usize,
    /// On the dense-GEMV path, fuse each RMSNorm into the projection that reads it
    /// ([`gemv_dense::rms_norm_linear`], [`gemv_dense::rms_norm_linear_swiglu`]) for passes of
    /// at most this many tokens (0: never): two kernels fewer per layer. Used when no layer
    /// has an o/gate/up/down bias and every projection is dense. Default **1**: measured on
    /// the H100 at one token the fused 12288 x 4096 projection takes 40.9 us against 42.0 us
    /// for norm + GEMV; at 16 tokens it takes 64.7 us against 44.0 us (every CTA recomputes
    /// the 16 rows' rstd from L2). `FL_GEMV_NORM=N` sets it (`0` turns it off).
    pub fuse_norm_max_m: usize,
    /// In decode passes on the dense-GEMV path (`m <= gemv_max_m`), ask the L2 for the first
    /// this many bytes of each layer's o projection weight right before its RoPE + attention
    /// ([`fl_kernels::elementwise::prefetch_l2`]): at small batch and context those two
    /// kernels leave DRAM mostly idle, and the o GEMV that follows them then finds its weight
    /// (32 MB on a 7B layer; H100's L2 holds 50 MB) partly in L2. Dense weights only. Default
    /// 0 (off): measured on an H100 (llama-2-7b f16), 8-32 MB made decode 0.2-0.3 ms per step
    /// slower at batch 1 and 4 (bench/RESULTS.md, session 6). `FL_PREFETCH_O_MB=N` sets N MB.
    pub prefetch_o_bytes: usize,
    /// In decode passes on the dense-GEMV path, run RoPE and the KV-cache append in the QKV
    /// GEMV's epilogue ([`gemv_dense::linear_rope_append`]) instead of a separate
    /// [`kv_cache::rope_append`] kernel: one kernel fewer per layer. Default on;
    /// `FL_FUSE_ROPE=0` turns it off (for A/B runs; results agree to one rounding).
    pub fuse_rope: bool,
}

impl<T: RunDType> Model<T> {
    /// Wraps loaded weights.
    pub fn new(cfg: ModelConfig, weights: Weights<T>) -> Result<Self> {
        let rope = rope_params(&cfg);
        rope.validate()?;
        if !attention::DECODE_HEAD_DIMS.contains(&cfg.head_dim) {
            return Err(EngineError::invalid(
                "head_dim",
                format!(
                    "{} is not supported by the attention kernels (supported: {:?})",
                    cfg.head_dim,
                    attention::DECODE_HEAD_DIMS
                ),
            ));
        }
        let eps = cfg.rms_norm_eps as f32;
        let gemv_max_m = env_usize("FL_GEMV_MAX_M", DEFAULT_GEMV_MAX_M).min(if T::DENSE_GEMV {
            gemv_dense::MAX_M
        } else {
            0
        });
        let fuse_norm_max_m = env_usize("FL_GEMV_NORM", DEFAULT_FUSE_NORM_MAX_M);
        let prefetch_o_bytes = env_usize("FL_PREFETCH_O_MB", 0).saturating_mul(1 << 20);
        let fuse_rope = env_usize("FL_FUSE_ROPE", 1) != 0;
        Ok(Model {
            cfg,
            weights,
            rope,
            eps,
            gemv_max_m,
            fuse_norm_max_m,
            prefetch_o_bytes,
            fuse_rope,
        })
    }

    /// [`Buffers::new`] plus the scratch this model's [`Quant`] mode needs for a pass over `m`
    /// tokens ([`Quant::buffer_bytes`]).
    pub fn buffers(
        &self,
        stream: &Arc<CudaStream>,
        m: usize,
        cache: &Cache<T>,
        mode: AttnMode,
    ) -> Result<Buffers<T>> {
        let mut b = Buffers::new(stream, &self.cfg, m, cache, mode)?;
        b.quant = QuantBuffers::new(stream, &self.cfg, self.weights.quant, m)?;
        Ok(b)
    }

    /// The decoder stack over the tokens in `buf` (metadata already uploaded): reads
    /// `buf.ids`, writes this step's K/V into `cache`, leaves the final-normed hidden states
    /// in `buf.x`. Queues work on `stream` only; never synchronises (so a decode step can
    /// be captured in a CUDA graph).
    pub fn forward(
        &self,
        stream: &Arc<CudaStream>,
        blas: &mut Blas,
        buf: &mut Buffers<T>,
        cache: &mut Cache<T>,
        mode: AttnMode,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let m = buf.m;
        let w = &self.weights;
        if let AttnMode::Prefill { max_len } = mode {
            if max_len == 0 || max_len > m {
                return Err(EngineError::invalid(
                    "max_len",
                    format!("{max_len} outside 1..={m} (tokens in the pass)"),
                ));
            }
        }
        let dparams = decode_params(cfg, cache.capacity);
        embedding::lookup(stream, &buf.ids, &w.embed, &mut buf.h, &mut buf.status)?;
        let small = m <= self.gemv_max_m;
        // Fused: the norms are computed inside the GEMVs that read them, from `h`; only the
        // final one is written to `x`.
        let fused = small
            && m <= self.fuse_norm_max_m
            && w.layers.iter().all(|l| {
                l.bo.is_none()
                    && l.b_gate_up.is_none()
                    && l.b_down.is_none()
                    && [&l.wqkv, &l.wo, &l.w_gate_up, &l.w_down]
                        .iter()
                        .all(|p| p.as_dense().is_some())
            });
        if fused {
            self.forward_fused_layers(stream, buf, cache, mode, &dparams)?;
            norm::rms_norm(stream, &buf.h, &w.final_norm, self.eps, &mut buf.x)?;
            return Ok(());
        }
        let first_norm = match w.layers.first() {
            Some(l) => &l.attn_norm,
            None => &w.final_norm,
        };
        // A W8A8 layer normalises (and quantises) h itself.
        if !w.layers.first().is_some_and(|l| l.wqkv.is_w8a8()) {
            norm::rms_norm(stream, &buf.h, first_norm, self.eps, &mut buf.x)?;
        }
        let small = m <= self.gemv_max_m;
        for (l, lw) in w.layers.iter().enumerate() {
            // qkv = x·Wqkvᵀ (+ bqkv); in a decode pass on the GEMV with RoPE + append fused in.
            let rope_fused = self.rope_fused(m, mode) && lw.wqkv.as_dense().is_some();
            match (&lw.wqkv, small) {
                (Linear::Dense(wqkv), true) if rope_fused => {
                    let args = self.qkv_rope(&buf.seq_ids, &buf.positions);
                    T::dense_linear_rope_append(
                        stream,
                        &buf.x,
                        None,
                        wqkv,
                        lw.bqkv.as_ref(),
                        &args,
                        &mut buf.q,
                        &mut cache.layers[l],
                    )?
                }
                (Linear::Dense(wqkv), true) => {
                    T::dense_linear(stream, &buf.x, wqkv, lw.bqkv.as_ref(), &mut buf.qkv)?
                }
                (Linear::W8A8(wqkv), _) => linear::w8a8_qkv(
                    stream,
                    blas,
                    &mut buf.quant,
                    &buf.h,
                    &lw.attn_norm,
                    self.eps,
                    wqkv,
                    lw.bqkv.as_ref(),
                    &mut buf.qkv,
                )?,
                (wqkv, _) => wqkv.forward(
                    stream,
                    blas,
                    &buf.x,
                    lw.bqkv.as_ref(),
                    &mut buf.qkv,
                    &mut buf.quant,
                )?,
            }
            self.prefetch_o(stream, &lw.wo, m, mode)?;
            let appended = rope_fused && small;
            self.attention(stream, buf, &mut cache.layers[l], mode, &dparams, appended)?;
            // h += attn·Woᵀ; x = rms_norm(h).
            match (&lw.wo, small && lw.bo.is_none()) {
                (Linear::Dense(wo), true) => {
                    T::dense_linear_add(stream, &buf.attn, wo, &mut buf.h)?;
                    norm::rms_norm(stream, &buf.h, &lw.ffn_norm, self.eps, &mut buf.x)?;
                }
                // Leaves x quantised in the scratch (in buf.x too only with a bias).
                (Linear::W8A8(wo), _) => linear::w8a8_o(
                    stream,
                    blas,
                    &mut buf.quant,
                    &buf.attn,
                    wo,
                    lw.bo.as_ref(),
                    &mut buf.h,
                    &lw.ffn_norm,
                    self.eps,
                    &mut buf.tmp,
                    &mut buf.x,
                )?,
                (wo, _) => {
                    wo.forward(
                        stream,
                        blas,
                        &buf.attn,
                        lw.bo.as_ref(),
                        &mut buf.tmp,
                        &mut buf.quant,
                    )?;
                    norm::add_rms_norm(
                        stream,
                        &buf.tmp,
                        &mut buf.h,
                        &lw.ffn_norm,
                        self.eps,
                        &mut buf.x,
                    )?;
                }
            }
            // act = silu(x·Wgᵀ) * (x·Wuᵀ).
            match (&lw.w_gate_up, small && lw.b_gate_up.is_none()) {
                (Linear::Dense(wgu), true) => {
                    T::dense_linear_swiglu(stream, &buf.x, wgu, &mut buf.act)?
                }
                // Leaves act quantised in the scratch.
                (Linear::W8A8(wgu), _) => linear::w8a8_gate_up(
                    stream,
                    blas,
                    &mut buf.quant,
                    wgu,
                    lw.b_gate_up.as_ref(),
                    &mut buf.gate_up,
                    &mut buf.act,
                )?,
                (wgu, _) => {
                    wgu.forward(
                        stream,
                        blas,
                        &buf.x,
                        lw.b_gate_up.as_ref(),
                        &mut buf.gate_up,
                        &mut buf.quant,
                    )?;
                    activation::swiglu_fused(stream, &buf.gate_up, &mut buf.act)?;
                }
            }
            // h += act·Wdownᵀ; x = rms_norm(h) with the next layer's (or the final) weight.
            let next = match w.layers.get(l + 1) {
                Some(n) => &n.attn_norm,
                None => &w.final_norm,
            };
            match (&lw.w_down, small && lw.b_down.is_none()) {
                (Linear::Dense(wd), true) => {
                    T::dense_linear_add(stream, &buf.act, wd, &mut buf.h)?;
                    norm::rms_norm(stream, &buf.h, next, self.eps, &mut buf.x)?;
                }
                (Linear::W8A8(wd), _) => {
                    // A next W8A8 layer normalises h itself.
                    let need_x = !w.layers.get(l + 1).is_some_and(|n| n.wqkv.is_w8a8());
                    linear::w8a8_down(
                        stream,
                        blas,
                        &mut buf.quant,
                        wd,
                        lw.b_down.as_ref(),
                        &mut buf.h,
                        next,
                        self.eps,
                        need_x,
                        &mut buf.tmp,
                        &mut buf.x,
                    )?;
                }
                (wd, _) => {
                    wd.forward(
                        stream,
                        blas,
                        &buf.act,
                        lw.b_down.as_ref(),
                        &mut buf.tmp,
                        &mut buf.quant,
                    )?;
                    norm::add_rms_norm(stream, &buf.tmp, &mut buf.h, next, self.eps, &mut buf.x)?;
                }
            }
        }
        Ok(())
    }

    /// Whether a pass of `m` tokens in `mode` runs its (dense) QKV projection with RoPE and the
    /// KV append fused in ([`Model::fuse_rope`]): decode passes on the dense-GEMV path.
    fn rope_fused(&self, m: usize, mode: AttnMode) -> bool {
        self.fuse_rope && m <= self.gemv_max_m && matches!(mode, AttnMode::Decode)
    }

    /// The head counts of this model's QKV rows.
    fn qkv_split(&self) -> QkvSplit {
        QkvSplit {
            q_heads: self.cfg.num_attention_heads,
            kv_heads: self.cfg.num_key_value_heads,
        }
    }

    /// The fused QKV epilogue's arguments for a pass whose tokens have these slots.
    fn qkv_rope<'a>(
        &'a self,
        seq_ids: &'a DeviceTensor<i32>,
        positions: &'a DeviceTensor<i32>,
    ) -> QkvRopeAppend<'a> {
        QkvRopeAppend {
            heads: self.qkv_split(),
            rope: &self.rope,
            slots: TokenSlots { seq_ids, positions },
        }
    }

    /// [`Model::prefetch_o_bytes`] of the o projection `wo`, in a decode pass of `m` tokens on
    /// the dense-GEMV path; nothing otherwise.
    fn prefetch_o(
        &self,
        stream: &Arc<CudaStream>,
        wo: &Linear<T>,
        m: usize,
        mode: AttnMode,
    ) -> Result<()> {
        if self.prefetch_o_bytes == 0 || m > self.gemv_max_m || !matches!(mode, AttnMode::Decode) {
            return Ok(());
        }
        if let Some(w) = wo.as_dense() {
            let bytes = self.prefetch_o_bytes.min(w.num_bytes());
            fl_kernels::elementwise::prefetch_l2(stream, w, bytes)?;
        }
        Ok(())
    }

    /// Split + RoPE + KV append of this pass's `qkv` (unless `appended`: the QKV GEMV already
    /// wrote `buf.q` and the cache), then attention into `buf.attn` (`[m, q_heads * head_dim]`).
    fn attention(
        &self,
        stream: &Arc<CudaStream>,
        buf: &mut Buffers<T>,
        kvc: &mut KvCache<T>,
        mode: AttnMode,
        dparams: &DecodeParams,
        appended: bool,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let m = buf.m;
        let (hq, d) = (cfg.num_attention_heads, cfg.head_dim);
        let args = RopeAppend {
            qkv: &buf.qkv,
            heads: self.qkv_split(),
            slots: TokenSlots {
                seq_ids: &buf.seq_ids,
                positions: &buf.positions,
            },
            rope: &self.rope,
            layout: CacheLayout::Contiguous,
        };
        let packed = match mode {
            AttnMode::Decode => None,
            AttnMode::Prefill { .. } => Some((&mut buf.k, &mut buf.v)),
        };
        if !appended {
            kv_cache::rope_append(stream, &args, &mut buf.q, packed, kvc, None)?;
        }
        buf.attn.set_shape(&[m, hq, d])?;
        match mode {
            AttnMode::Decode => {
                let c = attention::KvCache::Contiguous {
                    k: kvc.k(),
                    v: kvc.v(),
                };
                attention::decode(
                    stream,
                    &buf.q,
                    &c,
                    &buf.visible,
                    dparams,
                    &mut buf.attn_ws,
                    &mut buf.attn,
                )?;
            }
            AttnMode::Prefill { max_len } => {
                let p = PrefillParams {
                    scale: dparams.scale,
                    max_seq_len: max_len,
                    window: cfg.sliding_window,
                };
                attention_prefill::prefill(
                    stream,
                    &buf.q,
                    &buf.k,
                    &buf.v,
                    &buf.cu_seqlens,
                    &mut buf.attn,
                    &p,
                )?;
            }
        }
        buf.attn.set_shape(&[m, hq * d])?;
        Ok(())
    }

    /// The decoder layers with every RMSNorm fused into the dense GEMV that reads it (no
    /// biases except QKV's, `m <= gemv_max_m`): per layer, qkv = rms_norm(h)·Wqkvᵀ; attention;
    /// h += attn·Woᵀ; act = swiglu(rms_norm(h)·[Wg|Wu]ᵀ); h += act·Wdownᵀ. Leaves `h`.
    fn forward_fused_layers(
        &self,
        stream: &Arc<CudaStream>,
        buf: &mut Buffers<T>,
        cache: &mut Cache<T>,
        mode: AttnMode,
        dparams: &DecodeParams,
    ) -> Result<()> {
        for (l, lw) in self.weights.layers.iter().enumerate() {
            let eps = self.eps;
            let (wqkv, wo) = (dense(&lw.wqkv)?, dense(&lw.wo)?);
            let (wgu, wd) = (dense(&lw.w_gate_up)?, dense(&lw.w_down)?);
            let rope_fused = self.rope_fused(buf.m, mode);
            if rope_fused {
                let args = self.qkv_rope(&buf.seq_ids, &buf.positions);
                T::dense_linear_rope_append(
                    stream,
                    &buf.h,
                    Some((&lw.attn_norm, eps)),
                    wqkv,
                    lw.bqkv.as_ref(),
                    &args,
                    &mut buf.q,
                    &mut cache.layers[l],
                )?;
            } else {
                T::dense_rms_norm_linear(
                    stream,
                    &buf.h,
                    &lw.attn_norm,
                    eps,
                    wqkv,
                    lw.bqkv.as_ref(),
                    &mut buf.qkv,
                )?;
            }
            self.prefetch_o(stream, &lw.wo, buf.m, mode)?;
            self.attention(stream, buf, &mut cache.layers[l], mode, dparams, rope_fused)?;
            T::dense_linear_add(stream, &buf.attn, wo, &mut buf.h)?;
            T::dense_rms_norm_linear_swiglu(stream, &buf.h, &lw.ffn_norm, eps, wgu, &mut buf.act)?;
            T::dense_linear_add(stream, &buf.act, wd, &mut buf.h)?;
        }
        Ok(())
    }

    /// `logits[r] = rows[r]·Wlmᵀ` (`rows` `[r, hidden]`, `logits` `[r, vocab]`).
    pub fn lm_head(
        &self,
        stream: &Arc<CudaStream>,
        blas: &mut Blas,
        rows: &DeviceTensor<T>,
        logits: &mut DeviceTensor<T>,
    ) -> Result<()> {
        let w = self.weights.lm_head.as_ref().unwrap_or(&self.weights.embed);
        if rows.shape().first().is_some_and(|&r| r <= self.gemv_max_m) {
            T::dense_linear(stream, rows, w, None, logits)?;
        } else {
            blas.linear(rows, w, None, logits)?;
        }
        Ok(())
    }
}
