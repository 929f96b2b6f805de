//! The encoder on the GPU: [`EncoderModel`] (the weights on the device in a run dtype) and
//! [`DeviceBatch`] (a [`PackedBatch`] uploaded), checked against
//! [`reference::forward`](crate::encoder::reference::forward).
//!
//! The forward over a packed ragged batch, every step an existing op (no padded token is
//! computed; rows are tokens, sequences back to back):
//! ```text
//! x   = LayerNorm(word[id] + position[pos] + token_type[type])   3 gathers, add, add + LayerNorm
//! per layer:
//!   q, k, v = x Wqᵀ + bq, x Wkᵀ + bk, x Wvᵀ + bv                 3 cuBLASLt GEMMs, bias epilogue
//!   a   = attention(q, k, v) per sequence, non-causal             prefill_bidirectional
//!   x   = LayerNorm(a Woᵀ + bo + x)                               GEMM; add-bias + residual + LayerNorm
//!   x   = LayerNorm(gelu(x Wiᵀ + bi) Wo2ᵀ + bo2 + x)              GEMM; bias + GELU; GEMM; add-bias + residual + LayerNorm
//! ```
//! FasterTransformer's fusions: the sublayers' bias and residual add are fused with the
//! LayerNorm ([`norm::add_bias_layer_norm_inplace`]), the intermediate bias with the GELU
//! ([`activation::gelu_inplace`]), the QKV biases into the GEMMs' epilogue. Pooling and the
//! heads run on the host from the states read back
//! ([`EncoderModel::run`] then [`reference::pool`](crate::encoder::reference::pool),
//! [`reference::classify`](crate::encoder::reference::classify)).
//!
//! The attention kernel runs head dims 32, 64 and 128
//! ([`PREFILL_BIDIRECTIONAL_HEAD_DIMS`]): every BERT-base / large, RoBERTa, XLM-R, MiniLM,
//! BGE, E5 and GTE shape; another `hidden_size / num_attention_heads` is an error naming both
//! fields ([`EncoderModel::supports`]).
//!
//! ```no_run
//! use fl_blas::{Blas, QuantLinear};
//! use fl_engine::checkpoint::Checkpoint;
//! use fl_engine::encoder::{reference, EncoderConfig, EncoderModel, EncoderWeights};
//! use fl_engine::encoder::{PackedBatch, Pooling};
//! use fl_kernels::{f16, Gpu};
//! let dir = "models/bge-small-en-v1.5";
//! let cfg = EncoderConfig::from_model_dir(dir)?;
//! let w = EncoderWeights::load(&Checkpoint::open(dir)?, &cfg)?;
//! let gpu = Gpu::new(0)?;
//! let mut blas = Blas::new(&gpu)?;
//! let model = EncoderModel::<f16>::new(gpu.stream(), &cfg, &w)?;
//! let batch = PackedBatch::new(&cfg, &[vec![101, 7592, 102], vec![101, 2088, 2003, 102]], None)?;
//! let states = model.run(gpu.stream(), &mut blas, &batch)?; // [7, hidden], f32 on the host
//! let mut emb = reference::pool(&states, &batch, cfg.hidden_size, Pooling::Cls)?; // [2, hidden]
//! reference::l2_normalize(&mut emb, cfg.hidden_size)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::Arc;

use fl_blas::{Blas, QuantLinear};
use fl_kernels::activation::{self, GeluKind};
use fl_kernels::attention_prefill::{
    self, BidirectionalPrefillParams, PREFILL_BIDIRECTIONAL_HEAD_DIMS,
};
use fl_kernels::cudarc::driver::CudaStream;
use fl_kernels::embedding::{self, DeviceStatus};
use fl_kernels::quant::{self, Dequant, LayerNormParams, QuantOut};
use fl_kernels::{elementwise, norm, DeviceTensor, Gpu};

use crate::dtype::RunDType;
use crate::encoder::batch::PackedBatch;
use crate::encoder::calibrate::{check_percentile, AmaxKind, Calibration, Calibrator, Site};
use crate::encoder::config::EncoderConfig;
use crate::encoder::weights::{Dense, EncoderWeights, LayerNorm};
use crate::error::{EngineError, Result};

/// A linear layer on the device: `weight` `[out, in]` in the run dtype or INT8 (per output
/// channel), `bias` `[out]`.
struct DeviceDense<T: RunDType> {
    weight: Proj<T>,
    bias: DeviceTensor<T>,
}

/// A projection's weight.
enum Proj<T: RunDType> {
    Float(DeviceTensor<T>),
    Int8(QuantLinear),
}

impl<T: RunDType> DeviceDense<T> {
    fn float(&self) -> Result<&DeviceTensor<T>> {
        match &self.weight {
            Proj::Float(w) => Ok(w),
            Proj::Int8(_) => Err(EngineError::invalid(
                "quant",
                "an INT8 weight in the float forward",
            )),
        }
    }

    fn int8(&self) -> Result<&QuantLinear> {
        match &self.weight {
            Proj::Int8(w) => Ok(w),
            Proj::Float(_) => Err(EngineError::invalid(
                "quant",
                "a float weight in the INT8 forward",
            )),
        }
    }
}

/// How an [`EncoderModel`]'s six projections per layer run.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum EncoderQuant {
    /// In the run dtype on cuBLASLt (f32 accumulation).
    #[default]
    None,
    /// FasterTransformer 3.0's INT8 path (f16 / bf16 runs): weights INT8 per output channel,
    /// each GEMM input quantised per token by the kernel that produces it (dynamic scales,
    /// no calibration), INT8 GEMMs with INT32 accumulation; the attention, the embeddings
    /// and every LayerNorm stay in the run dtype.
    Int8,
    /// [`EncoderQuant::Int8`] with static per-tensor activation scales from a
    /// [`Calibration`] (its `kind` amax of each GEMM input).
    Int8Calibrated {
        /// The amax of every GEMM input.
        calibration: Calibration,
        /// Which of its figures.
        kind: AmaxKind,
    },
}

/// LayerNorm's affine parameters on the device, each `[hidden]`.
struct DeviceNorm<T: RunDType> {
    weight: DeviceTensor<T>,
    bias: DeviceTensor<T>,
}

/// One encoder layer's weights on the device.
struct DeviceLayer<T: RunDType> {
    query: DeviceDense<T>,
    key: DeviceDense<T>,
    value: DeviceDense<T>,
    attn_out: DeviceDense<T>,
    attn_norm: DeviceNorm<T>,
    intermediate: DeviceDense<T>,
    output: DeviceDense<T>,
    output_norm: DeviceNorm<T>,
}

fn upload<T: RunDType>(
    stream: &Arc<CudaStream>,
    v: &[f32],
    shape: &[usize],
) -> Result<DeviceTensor<T>> {
    let host: Vec<T> = v.iter().map(|&x| T::from_f32(x)).collect();
    Ok(DeviceTensor::from_host(stream, &host, shape)?)
}

impl<T: RunDType> DeviceDense<T> {
    fn upload(stream: &Arc<CudaStream>, d: &Dense, int8: bool) -> Result<Self> {
        let weight = if int8 {
            Proj::Int8(QuantLinear::from_f32_host(
                stream,
                &d.weight,
                d.out_features,
                d.in_features,
            )?)
        } else {
            Proj::Float(upload(stream, &d.weight, &[d.out_features, d.in_features])?)
        };
        Ok(DeviceDense {
            weight,
            bias: upload(stream, &d.bias, &[d.out_features])?,
        })
    }
}

impl<T: RunDType> DeviceNorm<T> {
    fn upload(stream: &Arc<CudaStream>, n: &LayerNorm, hidden: usize) -> Result<Self> {
        Ok(DeviceNorm {
            weight: upload(stream, &n.weight, &[hidden])?,
            bias: upload(stream, &n.bias, &[hidden])?,
        })
    }
}

/// A [`PackedBatch`] on the device: `ids`, `token_types`, `positions` (`[tokens]` i32) and
/// `cu_seqlens` (`[seqs + 1]` i32), with the host-known sizes the launches need, and the
/// status where the embedding gathers record an out-of-range index.
///
/// Built by [`DeviceBatch::upload`], which checks the batch against the model's config on
/// the host first, so every index the forward reads is in range.
pub struct DeviceBatch {
    ids: DeviceTensor<i32>,
    token_types: DeviceTensor<i32>,
    positions: DeviceTensor<i32>,
    cu_seqlens: DeviceTensor<i32>,
    tokens: usize,
    seqs: usize,
    max_seqlen: usize,
    status: DeviceStatus,
}

impl std::fmt::Debug for DeviceBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBatch")
            .field("tokens", &self.tokens)
            .field("seqs", &self.seqs)
            .field("max_seqlen", &self.max_seqlen)
            .finish_non_exhaustive()
    }
}

fn to_i32(v: &[u32]) -> Vec<i32> {
    // In range: upload checked every value against a config limit that fits in i32.
    v.iter().map(|&x| x as i32).collect()
}

impl DeviceBatch {
    /// Checks `batch` against `cfg` (what [`PackedBatch::new`] establishes; the fields are
    /// public, so they are checked again) and copies it to the device on `stream`.
    ///
    /// # Errors
    /// [`EngineError::Invalid`] naming `batch` (no sequence), `batch.cu_seqlens` (not `0`,
    /// strictly increasing, ending at the token count), `batch.ids` / `batch.token_types` /
    /// `batch.positions` (another length than the ids, a value `>=` its table's rows:
    /// `vocab_size`, `type_vocab_size`, `max_position_embeddings`), or `cfg` (a table too
    /// large for i32 indices); copy errors.
    ///
    /// # Example
    /// ```no_run
    /// # use fl_engine::encoder::{DeviceBatch, EncoderConfig, PackedBatch};
    /// # use fl_kernels::Gpu;
    /// # let cfg = EncoderConfig::from_model_dir("models/bge-small-en-v1.5")?;
    /// let gpu = Gpu::new(0)?;
    /// let batch = PackedBatch::new(&cfg, &[vec![101, 7592, 102]], None)?;
    /// let dev = DeviceBatch::upload(gpu.stream(), &cfg, &batch)?;
    /// assert_eq!((dev.num_tokens(), dev.num_seqs(), dev.max_seqlen()), (3, 1, 3));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn upload(
        stream: &Arc<CudaStream>,
        cfg: &EncoderConfig,
        batch: &PackedBatch,
    ) -> Result<Self> {
        let tokens = batch.ids.len();
        let cu = &batch.cu_seqlens;
        if cu.len() < 2 {
            return Err(EngineError::invalid("batch", "holds no sequence"));
        }
        let ok = cu[0] == 0
            && cu.windows(2).all(|p| p[0] < p[1])
            && cu.last().map(|&n| n as usize) == Some(tokens);
        if !ok || i32::try_from(tokens).is_err() {
            return Err(EngineError::invalid(
                "batch.cu_seqlens",
                format!(
                    "must start at 0, increase strictly and end at the token count {tokens} (<= i32::MAX)"
                ),
            ));
        }
        for (arg, v, limit, limit_name) in [
            ("batch.ids", &batch.ids, cfg.vocab_size, "vocab_size"),
            (
                "batch.token_types",
                &batch.token_types,
                cfg.type_vocab_size,
                "type_vocab_size",
            ),
            (
                "batch.positions",
                &batch.positions,
                cfg.max_position_embeddings,
                "max_position_embeddings",
            ),
        ] {
            if i32::try_from(limit).is_err() {
                return Err(EngineError::invalid(
                    "cfg",
                    format!("{limit_name} {limit} is past i32 indices"),
                ));
            }
            if v.len() != tokens {
                return Err(EngineError::invalid(
                    arg,
                    format!("has {} values for {tokens} tokens", v.len()),
                ));
            }
            if let Some((i, x)) = v.iter().enumerate().find(|(_, &x)| x as usize >= limit) {
                return Err(EngineError::invalid(
                    arg,
                    format!("token {i}: {x} >= {limit_name} {limit}"),
                ));
            }
        }
        let seqs = cu.len() - 1;
        let max_seqlen = cu.windows(2).map(|p| (p[1] - p[0]) as usize).max();
        Ok(DeviceBatch {
            ids: DeviceTensor::from_host(stream, &to_i32(&batch.ids), &[tokens])?,
            token_types: DeviceTensor::from_host(stream, &to_i32(&batch.token_types), &[tokens])?,
            positions: DeviceTensor::from_host(stream, &to_i32(&batch.positions), &[tokens])?,
            cu_seqlens: DeviceTensor::from_host(stream, &to_i32(cu), &[seqs + 1])?,
            tokens,
            seqs,
            max_seqlen: max_seqlen.unwrap_or(0),
            status: DeviceStatus::new(stream)?,
        })
    }

    /// Tokens in all sequences.
    pub fn num_tokens(&self) -> usize {
        self.tokens
    }

    /// Sequences.
    pub fn num_seqs(&self) -> usize {
        self.seqs
    }

    /// The longest sequence's length.
    pub fn max_seqlen(&self) -> usize {
        self.max_seqlen
    }

    /// Waits for `stream` and reports an index the embedding gathers found out of range
    /// since the last check ([`DeviceStatus::check`]); [`DeviceBatch::upload`]'s checks
    /// make that impossible, so this is a guard, not a validation step.
    ///
    /// # Errors
    /// [`EngineError::Kernels`] naming the gather, the token and the index.
    pub fn check(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        Ok(self.status.check(stream)?)
    }
}

/// Opens GPU `ordinal` for encoder work: [`Gpu::new`] with cudarc's cross-stream event
/// tracking off. An encoder queues everything on one stream, where that tracking only records
/// an event per buffer access (microseconds of host time each, most of a small batch's time).
///
/// # Errors
/// Those of [`Gpu::new`] (no driver, no such device, compute capability below 8.0).
pub fn open_gpu(ordinal: usize) -> Result<Gpu> {
    let gpu = Gpu::new(ordinal)?;
    // SAFETY: the context was just opened by this handle and no buffer exists yet; every
    // buffer of an encoder is used on its model's one stream.
    unsafe { gpu.context().disable_event_tracking() };
    Ok(gpu)
}

/// A calibration tap: `(layer, site, tensor)` for each quantisable GEMM input.
pub type Tap<'a, T> = dyn FnMut(usize, Site, &DeviceTensor<T>) -> Result<()> + 'a;

/// The quantised output of a kernel: per-token scales, or the calibrated amax when given.
fn quant_out<'a>(
    q: &'a mut DeviceTensor<i8>,
    scale: &'a mut DeviceTensor<f32>,
    amax: Option<&'a DeviceTensor<f32>>,
) -> QuantOut<'a> {
    match amax {
        Some(a) => QuantOut::calibrated(q, scale, a),
        None => QuantOut::per_token(q, scale),
    }
}

/// Quantises `x` into `q` / `scale`: with the calibrated `amax` when given, else per token.
fn quantize<H: fl_kernels::HalfDType>(
    stream: &CudaStream,
    x: &DeviceTensor<H>,
    amax: Option<&DeviceTensor<f32>>,
    q: &mut DeviceTensor<i8>,
    scale: &mut DeviceTensor<f32>,
) -> Result<()> {
    match amax {
        Some(a) => quant::quantize_calibrated(stream, x, a, q, scale)?,
        None => quant::quantize_per_token(stream, x, q, scale)?,
    }
    Ok(())
}

/// A scratch tensor, uninitialised (stream-ordered): every element is written before it is
/// read.
fn scratch<T: fl_kernels::DType>(
    stream: &Arc<CudaStream>,
    shape: &[usize],
) -> Result<DeviceTensor<T>> {
    let n: usize = shape.iter().product();
    // SAFETY: the forward writes every element of each scratch tensor (a gather, a GEMM or
    // the attention over tokens that the batch's cu_seqlens cover completely) before reading.
    let buf = unsafe { stream.alloc::<T>(n) }.map_err(fl_kernels::Error::from)?;
    Ok(DeviceTensor::from_slice(buf, shape)?)
}

/// An encoder (BERT, RoBERTa, XLM-RoBERTa) on one device in the run dtype `T` (`f32`, `f16`,
/// `bf16`): [`EncoderModel::new`] uploads [`EncoderWeights`] (f32 on the host, rounded to
/// `T`), [`EncoderModel::forward`] runs the stack over a [`DeviceBatch`] (see the
/// [module docs](self) for the steps). The pooler and classification heads are not uploaded:
/// they run on the host from the read-back states.
pub struct EncoderModel<T: RunDType> {
    cfg: EncoderConfig,
    word_embeddings: DeviceTensor<T>,
    position_embeddings: DeviceTensor<T>,
    token_type_embeddings: DeviceTensor<T>,
    embeddings_norm: DeviceNorm<T>,
    layers: Vec<DeviceLayer<T>>,
    eps: f32,
    quant: EncoderQuant,
    /// INT8 calibrated: per layer, per [`Site`], the amax (`f32 [1]` on the device).
    amax: Vec<[DeviceTensor<f32>; 4]>,
}

impl<T: RunDType> std::fmt::Debug for EncoderModel<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncoderModel")
            .field("dtype", &T::NAME)
            .field("quant", &self.quant)
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl<T: RunDType> EncoderModel<T> {
    /// Whether the GPU path runs `cfg`: it passes [`EncoderConfig::validate`] and its head
    /// dim (`hidden_size / num_attention_heads`) is one the attention kernel runs
    /// ([`PREFILL_BIDIRECTIONAL_HEAD_DIMS`]). No device needed.
    ///
    /// # Errors
    /// [`EngineError::Config`] from `validate`; [`EngineError::Invalid`] naming
    /// `hidden_size / num_attention_heads` for another head dim.
    ///
    /// # Example
    /// ```
    /// use fl_engine::encoder::{EncoderConfig, EncoderModel};
    /// let cfg = EncoderConfig::from_json_str(r#"{"model_type": "bert", "vocab_size": 100,
    ///     "hidden_size": 36, "num_hidden_layers": 1, "num_attention_heads": 3,
    ///     "intermediate_size": 16, "max_position_embeddings": 16}"#)?;
    /// let err = EncoderModel::<f32>::supports(&cfg).unwrap_err().to_string();
    /// assert!(err.contains("hidden_size") && err.contains("num_attention_heads"), "{err}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn supports(cfg: &EncoderConfig) -> Result<()> {
        cfg.validate()?;
        let d = cfg.head_dim();
        if !PREFILL_BIDIRECTIONAL_HEAD_DIMS.contains(&d) {
            return Err(EngineError::invalid(
                "hidden_size / num_attention_heads",
                format!(
                    "{} / {} is a head dim of {d}; the encoder attention kernel runs head dims {:?}",
                    cfg.hidden_size, cfg.num_attention_heads, PREFILL_BIDIRECTIONAL_HEAD_DIMS
                ),
            ));
        }
        Ok(())
    }

    /// Uploads `w` (checked against `cfg`) to the device on `stream`, each value rounded
    /// from f32 to `T`. The pooler and classification head stay on the host (in `w`).
    /// [`EncoderModel::new_quant`] with [`EncoderQuant::None`].
    ///
    /// # Errors
    /// Those of [`EncoderModel::supports`]; [`EngineError::Invalid`] naming the `weights`
    /// field that does not match `cfg` ([`EncoderWeights::check`]); allocation and copy
    /// errors.
    pub fn new(stream: &Arc<CudaStream>, cfg: &EncoderConfig, w: &EncoderWeights) -> Result<Self> {
        Self::new_quant(stream, cfg, w, EncoderQuant::None)
    }

    /// [`EncoderModel::new`] with the projections as `quant` says: INT8 quantises each
    /// projection's weight per output channel on the host while uploading.
    ///
    /// # Errors
    /// Those of [`EncoderModel::new`]; for INT8, [`EngineError::Invalid`] naming `quant` for
    /// an f32 run (INT8 runs f16 / bf16), `hidden_size` or `intermediate_size` not a
    /// multiple of 4 (cuBLASLt's INT8 GEMMs), or a calibration of another number of layers.
    ///
    /// # Example
    /// ```no_run
    /// use fl_engine::encoder::gpu::{open_gpu, EncoderModel, EncoderQuant};
    /// use fl_engine::encoder::{presets, EncoderWeights};
    /// use fl_kernels::f16;
    /// let cfg = presets::preset("bge-small").unwrap();
    /// let w = EncoderWeights::random(&cfg, 1)?;
    /// let gpu = open_gpu(0)?;
    /// let model = EncoderModel::<f16>::new_quant(gpu.stream(), &cfg, &w, EncoderQuant::Int8)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new_quant(
        stream: &Arc<CudaStream>,
        cfg: &EncoderConfig,
        w: &EncoderWeights,
        quant: EncoderQuant,
    ) -> Result<Self> {
        Self::supports(cfg)?;
        w.check(cfg)?;
        let int8 = quant != EncoderQuant::None;
        if int8 {
            if T::NAME == "f32" {
                return Err(EngineError::invalid(
                    "quant",
                    "INT8 runs with f16 or bf16 activations, not f32",
                ));
            }
            for (name, v) in [
                ("hidden_size", cfg.hidden_size),
                ("intermediate_size", cfg.intermediate_size),
            ] {
                if v % 4 != 0 {
                    return Err(EngineError::invalid(
                        name,
                        format!("{v} is not a multiple of 4, which cuBLASLt's INT8 GEMMs need"),
                    ));
                }
            }
        }
        let mut amax = Vec::new();
        if let EncoderQuant::Int8Calibrated { calibration, kind } = &quant {
            if calibration.layers.len() != cfg.num_hidden_layers {
                return Err(EngineError::invalid(
                    "quant",
                    format!(
                        "the calibration has {} layers, the model {}",
                        calibration.layers.len(),
                        cfg.num_hidden_layers
                    ),
                ));
            }
            for l in &calibration.layers {
                let [a, b, c, d] = Site::ALL
                    .map(|s| DeviceTensor::from_host(stream, &[l[s as usize].get(*kind)], &[1]));
                amax.push([a?, b?, c?, d?]);
            }
        }
        let h = cfg.hidden_size;
        let mut layers = Vec::with_capacity(w.layers.len());
        for lw in &w.layers {
            layers.push(DeviceLayer {
                query: DeviceDense::upload(stream, &lw.query, int8)?,
                key: DeviceDense::upload(stream, &lw.key, int8)?,
                value: DeviceDense::upload(stream, &lw.value, int8)?,
                attn_out: DeviceDense::upload(stream, &lw.attn_out, int8)?,
                attn_norm: DeviceNorm::upload(stream, &lw.attn_norm, h)?,
                intermediate: DeviceDense::upload(stream, &lw.intermediate, int8)?,
                output: DeviceDense::upload(stream, &lw.output, int8)?,
                output_norm: DeviceNorm::upload(stream, &lw.output_norm, h)?,
            });
        }
        Ok(EncoderModel {
            cfg: cfg.clone(),
            word_embeddings: upload(stream, &w.word_embeddings, &[cfg.vocab_size, h])?,
            position_embeddings: upload(
                stream,
                &w.position_embeddings,
                &[cfg.max_position_embeddings, h],
            )?,
            token_type_embeddings: upload(
                stream,
                &w.token_type_embeddings,
                &[cfg.type_vocab_size, h],
            )?,
            embeddings_norm: DeviceNorm::upload(stream, &w.embeddings_norm, h)?,
            layers,
            eps: cfg.layer_norm_eps as f32,
            quant,
            amax,
        })
    }

    /// How the projections run.
    pub fn quant(&self) -> &EncoderQuant {
        &self.quant
    }

    /// The configuration.
    pub fn config(&self) -> &EncoderConfig {
        &self.cfg
    }

    /// The last hidden state of every token of `batch` into `out` (`[batch.num_tokens(),
    /// hidden_size]`, sequences in batch order), queued on `stream`. `blas` must queue on
    /// the same stream. Scratch (`[tokens, hidden]` x5 and `[tokens, intermediate_size]`) is
    /// allocated stream-ordered for the batch; nothing waits for the device. Out-of-range
    /// indices (impossible after [`DeviceBatch::upload`]) land in the batch's status,
    /// read by [`DeviceBatch::check`].
    ///
    /// # Errors
    /// [`EngineError::Invalid`] naming `out` (another shape) or `blas` (another stream), before
    /// any launch; the kernels' and cuBLASLt's.
    pub fn forward(
        &self,
        stream: &Arc<CudaStream>,
        blas: &mut Blas,
        batch: &mut DeviceBatch,
        out: &mut DeviceTensor<T>,
    ) -> Result<()> {
        self.check_forward(stream, blas, batch, out)?;
        if self.quant == EncoderQuant::None {
            self.forward_float(stream, blas, batch, out, None)
        } else {
            self.forward_int8(stream, blas, batch, out)
        }
    }

    /// [`EncoderModel::forward`] (float projections only) handing `tap` every quantisable
    /// GEMM input as it is produced: `(layer, site, tensor [tokens, width])`. For
    /// calibration ([`Calibrator`]); the tap may read
    /// the tensor back (and so wait for the device).
    ///
    /// # Errors
    /// Those of [`EncoderModel::forward`]; [`EngineError::Invalid`] naming `quant` on an
    /// INT8 model; the tap's.
    pub fn forward_tapped(
        &self,
        stream: &Arc<CudaStream>,
        blas: &mut Blas,
        batch: &mut DeviceBatch,
        out: &mut DeviceTensor<T>,
        tap: &mut Tap<'_, T>,
    ) -> Result<()> {
        self.check_forward(stream, blas, batch, out)?;
        if self.quant != EncoderQuant::None {
            return Err(EngineError::invalid(
                "quant",
                "calibration taps the float forward; load the model without INT8",
            ));
        }
        self.forward_float(stream, blas, batch, out, Some(tap))
    }

    fn check_forward(
        &self,
        stream: &Arc<CudaStream>,
        blas: &Blas,
        batch: &DeviceBatch,
        out: &DeviceTensor<T>,
    ) -> Result<()> {
        let (t, h) = (batch.tokens, self.cfg.hidden_size);
        if out.shape() != [t, h] {
            return Err(EngineError::invalid(
                "out",
                format!(
                    "is {:?}, expected [{t}, {h}] (tokens, hidden_size)",
                    out.shape()
                ),
            ));
        }
        if blas.stream().cu_stream() != stream.cu_stream() {
            return Err(EngineError::invalid(
                "blas",
                "queues on another stream than `stream`; the forward's launches would race",
            ));
        }
        Ok(())
    }

    /// x = LayerNorm(word[id] + token_type[type] + position[pos]), `a` and `b` scratch
    /// `[tokens, hidden]`.
    fn embeddings(
        &self,
        stream: &Arc<CudaStream>,
        batch: &mut DeviceBatch,
        a: &mut DeviceTensor<T>,
        b: &mut DeviceTensor<T>,
        x: &mut DeviceTensor<T>,
    ) -> Result<()> {
        let s = &mut batch.status;
        embedding::lookup(stream, &batch.ids, &self.word_embeddings, a, s)?;
        embedding::lookup(
            stream,
            &batch.token_types,
            &self.token_type_embeddings,
            b,
            s,
        )?;
        elementwise::add_assign(stream, a, b)?;
        embedding::lookup(stream, &batch.positions, &self.position_embeddings, b, s)?;
        let en = &self.embeddings_norm;
        norm::add_bias_layer_norm(stream, a, None, b, &en.weight, Some(&en.bias), self.eps, x)?;
        Ok(())
    }

    /// The non-causal attention over the packed batch: `ctx` from `q`, `k`, `v` (each
    /// `[tokens, hidden]`, viewed as heads for the call).
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        stream: &Arc<CudaStream>,
        batch: &DeviceBatch,
        q: &mut DeviceTensor<T>,
        k: &mut DeviceTensor<T>,
        v: &mut DeviceTensor<T>,
        ctx: &mut DeviceTensor<T>,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let (t, h) = (batch.tokens, cfg.hidden_size);
        let params = BidirectionalPrefillParams {
            scale: cfg.attention_scale() as f32,
            max_seq_len: batch.max_seqlen,
        };
        let head_shape = [t, cfg.num_attention_heads, cfg.head_dim()];
        for b in [&mut *q, &mut *k, &mut *v, &mut *ctx] {
            b.set_shape(&head_shape)?;
        }
        attention_prefill::prefill_bidirectional(stream, q, k, v, &batch.cu_seqlens, ctx, &params)?;
        for b in [q, k, v, ctx] {
            b.set_shape(&[t, h])?;
        }
        Ok(())
    }

    fn forward_float(
        &self,
        stream: &Arc<CudaStream>,
        blas: &mut Blas,
        batch: &mut DeviceBatch,
        x: &mut DeviceTensor<T>,
        mut tap: Option<&mut Tap<'_, T>>,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let (t, h) = (batch.tokens, cfg.hidden_size);
        let z = |shape: &[usize]| scratch::<T>(stream, shape);
        let mut tmp = z(&[t, h])?;
        let mut q = z(&[t, h])?;
        let mut k = z(&[t, h])?;
        let mut v = z(&[t, h])?;
        let mut ctx = z(&[t, h])?;
        let mut inter = z(&[t, cfg.intermediate_size])?;
        self.embeddings(stream, batch, &mut tmp, &mut q, x)?;
        let act: GeluKind = cfg.hidden_act;
        for (l, lw) in self.layers.iter().enumerate() {
            if let Some(tap) = tap.as_mut() {
                tap(l, Site::QkvIn, x)?;
            }
            // Separate Q, K, V GEMMs (bias in cuBLASLt's epilogue): the attention reads three
            // packed tensors, which one stacked GEMM would only give after a split.
            blas.linear(x, lw.query.float()?, Some(&lw.query.bias), &mut q)?;
            blas.linear(x, lw.key.float()?, Some(&lw.key.bias), &mut k)?;
            blas.linear(x, lw.value.float()?, Some(&lw.value.bias), &mut v)?;
            self.attention(stream, batch, &mut q, &mut k, &mut v, &mut ctx)?;
            if let Some(tap) = tap.as_mut() {
                tap(l, Site::AttnOutIn, &ctx)?;
            }
            // x = LayerNorm(ctx Woᵀ + bo + x): the bias and the residual fused into the norm.
            let (wa, n) = (&lw.attn_out, &lw.attn_norm);
            blas.linear(&ctx, wa.float()?, None, &mut tmp)?;
            norm::add_bias_layer_norm_inplace(
                stream,
                &tmp,
                Some(&wa.bias),
                x,
                &n.weight,
                Some(&n.bias),
                self.eps,
            )?;
            if let Some(tap) = tap.as_mut() {
                tap(l, Site::InterIn, x)?;
            }
            // x = LayerNorm(gelu(x Wiᵀ + bi) Wo2ᵀ + bo2 + x): bias + GELU in one pass.
            let (wi, wo, n) = (&lw.intermediate, &lw.output, &lw.output_norm);
            blas.linear(x, wi.float()?, None, &mut inter)?;
            activation::gelu_inplace(stream, &mut inter, Some(&wi.bias), act)?;
            if let Some(tap) = tap.as_mut() {
                tap(l, Site::OutputIn, &inter)?;
            }
            blas.linear(&inter, wo.float()?, None, &mut tmp)?;
            norm::add_bias_layer_norm_inplace(
                stream,
                &tmp,
                Some(&wo.bias),
                x,
                &n.weight,
                Some(&n.bias),
                self.eps,
            )?;
        }
        Ok(())
    }

    /// Calibrates INT8 activation scales: runs every batch through this (float) model,
    /// collecting the amax figures of each GEMM input ([`Site`]), and returns them at
    /// `percentile`. Waits for the device after each GEMM input (it reads them back).
    ///
    /// # Errors
    /// [`EngineError::Invalid`] naming `batches` (none), `quant` (an INT8 model),
    /// `percentile` (not in `(0, 100]`) or `values` (a non-finite activation); those of
    /// [`EncoderModel::forward`].
    pub fn calibrate(
        &self,
        stream: &Arc<CudaStream>,
        blas: &mut Blas,
        batches: &[PackedBatch],
        percentile: f64,
    ) -> Result<Calibration> {
        if batches.is_empty() {
            return Err(EngineError::invalid(
                "batches",
                "none given; calibration needs text",
            ));
        }
        check_percentile(percentile)?;
        let mut cal = Calibrator::new(self.layers.len());
        for b in batches {
            let mut dev = DeviceBatch::upload(stream, &self.cfg, b)?;
            let mut out = scratch::<T>(stream, &[dev.tokens, self.cfg.hidden_size])?;
            let mut tap = |l: usize, site: Site, t: &DeviceTensor<T>| -> Result<()> {
                let v: Vec<f32> = t.to_host(stream)?.into_iter().map(|x| x.to_f32()).collect();
                cal.observe(l, site, &v)
            };
            self.forward_tapped(stream, blas, &mut dev, &mut out, &mut tap)?;
            dev.check(stream)?;
            cal.add_tokens(dev.tokens);
        }
        cal.finish(percentile)
    }

    /// The amax of `site` in `layer` for a calibrated model; `None` (per-token scales) else.
    fn site_amax(&self, layer: usize, site: Site) -> Option<&DeviceTensor<f32>> {
        self.amax.get(layer).map(|a| &a[site as usize])
    }

    fn forward_int8(
        &self,
        stream: &Arc<CudaStream>,
        blas: &mut Blas,
        batch: &mut DeviceBatch,
        x: &mut DeviceTensor<T>,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let (t, h, ni) = (batch.tokens, cfg.hidden_size, cfg.intermediate_size);
        let z = |shape: &[usize]| scratch::<T>(stream, shape);
        let mut q = z(&[t, h])?;
        let mut k = z(&[t, h])?;
        let mut v = z(&[t, h])?;
        let mut ctx = z(&[t, h])?;
        let mut xq = scratch::<i8>(stream, &[t, h])?;
        let mut xs = scratch::<f32>(stream, &[t])?;
        let mut cq = scratch::<i8>(stream, &[t, h])?;
        let mut cs = scratch::<f32>(stream, &[t])?;
        let mut iq = scratch::<i8>(stream, &[t, ni])?;
        let mut is = scratch::<f32>(stream, &[t])?;
        let mut acc = scratch::<i32>(stream, &[t, h])?;
        let mut acc_i = scratch::<i32>(stream, &[t, ni])?;
        self.embeddings(stream, batch, &mut q, &mut k, x)?;
        quantize(
            stream,
            T::half(x)?,
            self.site_amax(0, Site::QkvIn),
            &mut xq,
            &mut xs,
        )?;
        let act: GeluKind = cfg.hidden_act;
        let nl = self.layers.len();
        for (l, lw) in self.layers.iter().enumerate() {
            for (d, y) in [(&lw.query, &mut q), (&lw.key, &mut k), (&lw.value, &mut v)] {
                let w = d.int8()?;
                blas.gemm_i8(&xq, &w.weight, &mut acc)?;
                let deq = Dequant {
                    acc: &acc,
                    act_scale: &xs,
                    weight_scale: &w.scales,
                };
                quant::dequantize(stream, deq, Some(T::half(&d.bias)?), T::half_mut(y)?)?;
            }
            self.attention(stream, batch, &mut q, &mut k, &mut v, &mut ctx)?;
            // The context is quantised on its own (the attention writes it in the run dtype).
            let amax = self.site_amax(l, Site::AttnOutIn);
            quantize(stream, T::half(&ctx)?, amax, &mut cq, &mut cs)?;
            // x = LayerNorm(deq(ctx_q Woᵀ) + bo + x), quantised for the intermediate GEMM.
            let (wa, n) = (&lw.attn_out, &lw.attn_norm);
            let w = wa.int8()?;
            blas.gemm_i8(&cq, &w.weight, &mut acc)?;
            let deq = Dequant {
                acc: &acc,
                act_scale: &cs,
                weight_scale: &w.scales,
            };
            quant::dequant_bias_add_layer_norm_quant(
                stream,
                deq,
                Some(T::half(&wa.bias)?),
                T::half_mut(x)?,
                LayerNormParams {
                    weight: T::half(&n.weight)?,
                    bias: Some(T::half(&n.bias)?),
                    eps: self.eps,
                },
                quant_out(&mut xq, &mut xs, self.site_amax(l, Site::InterIn)),
            )?;
            // inter = quant(gelu(deq(x_q Wiᵀ) + bi))
            let (wi, wo, n) = (&lw.intermediate, &lw.output, &lw.output_norm);
            let w = wi.int8()?;
            blas.gemm_i8(&xq, &w.weight, &mut acc_i)?;
            let deq = Dequant {
                acc: &acc_i,
                act_scale: &xs,
                weight_scale: &w.scales,
            };
            quant::dequant_bias_gelu_quant(
                stream,
                deq,
                Some(T::half(&wi.bias)?),
                act,
                quant_out(&mut iq, &mut is, self.site_amax(l, Site::OutputIn)),
            )?;
            // x = LayerNorm(deq(inter_q Wo2ᵀ) + bo2 + x), quantised for the next layer's QKV.
            let w = wo.int8()?;
            blas.gemm_i8(&iq, &w.weight, &mut acc)?;
            let deq = Dequant {
                acc: &acc,
                act_scale: &is,
                weight_scale: &w.scales,
            };
            let next = if l + 1 < nl {
                self.site_amax(l + 1, Site::QkvIn)
            } else {
                None
            };
            quant::dequant_bias_add_layer_norm_quant(
                stream,
                deq,
                Some(T::half(&wo.bias)?),
                T::half_mut(x)?,
                LayerNormParams {
                    weight: T::half(&n.weight)?,
                    bias: Some(T::half(&n.bias)?),
                    eps: self.eps,
                },
                quant_out(&mut xq, &mut xs, next),
            )?;
        }
        Ok(())
    }

    /// Uploads `batch`, runs [`EncoderModel::forward`], checks the batch's status and reads
    /// the states back as f32: `[batch.num_tokens(), hidden_size]` on the host, what
    /// [`reference::pool`](crate::encoder::reference::pool) and
    /// [`reference::classify`](crate::encoder::reference::classify) take. Waits for the
    /// device (the read-back).
    ///
    /// # Errors
    /// Those of [`DeviceBatch::upload`], [`EncoderModel::forward`] and
    /// [`DeviceBatch::check`].
    pub fn run(
        &self,
        stream: &Arc<CudaStream>,
        blas: &mut Blas,
        batch: &PackedBatch,
    ) -> Result<Vec<f32>> {
        let mut dev = DeviceBatch::upload(stream, &self.cfg, batch)?;
        let mut out = DeviceTensor::<T>::zeros(stream, &[dev.tokens, self.cfg.hidden_size])?;
        self.forward(stream, blas, &mut dev, &mut out)?;
        dev.check(stream)?;
        Ok(out
            .to_host(stream)?
            .into_iter()
            .map(|v| v.to_f32())
            .collect())
    }
}
