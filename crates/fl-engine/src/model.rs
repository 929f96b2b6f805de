//! A LLaMA-family model on the GPU ([`Model`]): its config, its [`Weights`] and the decoder
//! stack over a batch of tokens ([`Model::forward`]), with the residual add fused into the
//! next RMSNorm:
//!
//! ```text
//! h = embed(ids); x = rms_norm(h, attn_norm[0])
//! for each layer l: layer::forward               (qkv, rope + append, attention, o, ffn)
//! logits = x[last token of each sequence]·Wlmᵀ    Model::lm_head
//! ```
//!
//! The pieces: [`crate::weights`] (loading), [`crate::buffers`] (activations),
//! [`crate::cache`] (the KV cache), `layer.rs` (one layer, written once).
//!
//! Up to [`Model::gemv_max_m`] tokens (decode) the projections run on the dense GEMV of
//! `fl_kernels::gemv_dense` with the SwiGLU and the residual add fused into them, RoPE and the
//! KV append fused into the QKV GEMV in decode passes, and (when the o/gate/up/down
//! projections have no bias, as in LLaMA, and [`Model::fuse_norm_max_m`] allows it) each
//! RMSNorm fused into the GEMV that reads it, so a decode layer is 5 kernels:
//! norm+QKV+RoPE+append, attention, o+add, norm+gate/up+SwiGLU, down+add. Past it (prefill)
//! on cuBLASLt. The dense GEMV is f16/bf16 only: an f32 model runs every projection on
//! cuBLASLt (f32 compute, no TF32) with the separate SwiGLU and add+RMSNorm kernels, and
//! keeps its KV cache in f32 ([`RunDType::DENSE_GEMV`]).
//!
//! With `--quant` ([`crate::linear::Quant`], loaded by [`Weights::load_quant`]) the four
//! projections of each layer are [`crate::linear::Linear`]s in another form: weight-only
//! int8/int4/Q8_0/Q4_0 (the quantised GEMV up to 16 tokens, a dequantised copy and cuBLASLt
//! past it; the SwiGLU and the residual add then run as separate kernels) or W8A8 (int8 GEMMs
//! with the (de)quantisation fused into the kernels around them). The embedding, the LM head
//! and the norms stay dense. Buffers for a quantised model come from [`Model::buffers`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use fl_blas::Blas;
use fl_kernels::attention;
use fl_kernels::cudarc::driver::CudaStream;
use fl_kernels::embedding;
use fl_kernels::gemv_dense;
use fl_kernels::norm;
use fl_kernels::rope::{RopeParams, RopeStyle, Scaling};
use fl_kernels::DeviceTensor;

use crate::buffers::Buffers;
use crate::cache::Cache;
use crate::config::{ModelConfig, RopeScaling};
use crate::dtype::RunDType;
use crate::error::{EngineError, Result};
use crate::layer::{self, Pass};
use crate::linear::QuantBuffers;
use crate::tp::{Shard, TpComm};
use crate::weights::Weights;

/// How the attention of a forward pass reads its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnMode {
    /// One new token per sequence (`m == batch`, token `b` is sequence `b`): the decode
    /// kernel over the cache (contiguous, or paged through `buf.block_table`, a row per
    /// token).
    Decode,
    /// Packed prompt tokens of several sequences starting at position 0 (offsets in
    /// `cu_seqlens`): causal flash attention over this pass's own K/V
    /// ([`fl_kernels::attention_prefill::prefill`]); the cache is written for the decode
    /// steps.
    Prefill {
        /// The longest sequence in the batch.
        max_len: usize,
    },
    /// Packed chunks of several sequences over a paged cache ([`Cache::new_paged`]): sequence
    /// `b` (row `b` of `buf.block_table`, tokens `cu_seqlens[b]..cu_seqlens[b + 1]` at
    /// positions `ctx_lens[b] - q_len ..= ctx_lens[b] - 1`) appends its chunk's K/V through
    /// the block table, then attends causally to every key of its context
    /// ([`fl_kernels::attention_prefill::prefill_paged`]). A chunk may be a whole prompt, the
    /// rest of one whose prefix is cached, or one decode token: one pass mixes them.
    Paged {
        /// The longest chunk in the pass.
        max_q_len: usize,
    },
}

/// The RoPE parameters of a config, in the kernel's terms. The pairing is **interleaved**:
/// Hugging Face LLaMA checkpoints are laid out for rotate-half, and the loader permutes the q
/// and k rows of every QKV weight (and bias) by [`crate::weights::qkv_row_order`] so that each
/// rotate-half pair is adjacent; attention is unchanged (q and k are permuted alike), and the
/// decode step can rotate in the QKV GEMV's epilogue, where a lane holds adjacent outputs.
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

/// Default of [`Model::gemv_max_m`].
pub const DEFAULT_GEMV_MAX_M: usize = 4;

/// Default of [`Model::fuse_norm_max_m`].
pub const DEFAULT_FUSE_NORM_MAX_M: usize = 1;

/// A model ready to run: config and weights, on one device.
pub struct Model<T: RunDType> {
    /// The configuration.
    pub cfg: ModelConfig,
    /// The weights.
    pub weights: Weights<T>,
    rope: RopeParams,
    eps: f32,
    /// Passes of at most this many tokens run their projections on the dense GEMV
    /// (`fl_kernels::gemv_dense`, fused SwiGLU and residual add); larger ones on cuBLASLt.
    /// 0 turns the GEMV off; at most [`gemv_dense::MAX_M`], and 0 for a dtype without the
    /// dense GEMV (f32: [`RunDType::DENSE_GEMV`]). Default [`DEFAULT_GEMV_MAX_M`] for
    /// f16/bf16: the GEMV reads the weights faster than cuBLASLt at a few tokens, cuBLASLt
    /// faster at 16.
    pub gemv_max_m: usize,
    /// On the dense-GEMV path, fuse each RMSNorm into the projection that reads it
    /// ([`gemv_dense::rms_norm_linear`], [`gemv_dense::rms_norm_linear_swiglu`]) for passes of
    /// at most this many tokens (0: never): two kernels fewer per layer. Used when no layer
    /// has an o/gate/up/down bias and every projection is dense. Default
    /// [`DEFAULT_FUSE_NORM_MAX_M`]: past one token every CTA recomputes each row's rstd, and
    /// the separate norm kernel is faster.
    pub fuse_norm_max_m: usize,
    /// With tensor parallelism: this rank's communicator and LM-head scratch.
    pub(crate) tp: Option<ModelTp<T>>,
}

/// The vocabulary-parallel LM head's buffers for one row count: this rank's logits and the
/// gather of every rank's.
type LmScratch<T> = (DeviceTensor<T>, DeviceTensor<T>);

/// One rank's part of a tensor-parallel model ([`crate::tp`]).
pub(crate) struct ModelTp<T: RunDType> {
    pub comm: TpComm,
    pub shard: Shard,
    /// Vocabulary rows per rank when the LM head is split (`None`: replicated).
    vocab_per_rank: Option<usize>,
    /// Per row count: this rank's logits `[rows, V / N]` and the gather `[N * rows * V / N]`.
    scratch: Mutex<HashMap<usize, LmScratch<T>>>,
}

impl<T: RunDType> Model<T> {
    /// Wraps loaded weights, with the default [`Model::gemv_max_m`] and
    /// [`Model::fuse_norm_max_m`] for `T`.
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
        // The dense GEMV reads rows of whole 16-byte vectors: every projection's input width
        // (hidden, q heads * head_dim, intermediate) a multiple of 8. A tensor-parallel shard
        // of an intermediate width like 344 (172 a rank) is not: cuBLASLt runs it.
        let gemv_fits = [cfg.hidden_size, cfg.q_size(), cfg.intermediate_size]
            .iter()
            .all(|&k| k % gemv_dense::K_MULTIPLE == 0);
        let gemv_max_m = if gemv_fits {
            DEFAULT_GEMV_MAX_M.min(Self::max_gemv_m())
        } else {
            0
        };
        Ok(Model {
            cfg,
            weights,
            rope,
            eps,
            gemv_max_m,
            fuse_norm_max_m: DEFAULT_FUSE_NORM_MAX_M,
            tp: None,
        })
    }

    /// Rank `shard.rank`'s part of a tensor-parallel model: `cfg` is the whole model's config
    /// (the model keeps [`Shard::local_config`] of it as [`Model::cfg`]), `weights` this
    /// rank's shard ([`Weights::load_shard`]), `comm` its communicator. The forward pass then
    /// all-reduces the o and down projections' outputs and all-gathers the LM head's logits.
    ///
    /// Errors: as [`Model::new`]; [`EngineError::Invalid`] naming `--tp` when `comm`'s rank or
    /// size is not `shard`'s, or `shard` does not split `cfg` ([`Shard::check`]), or naming
    /// `--quant` for a mode that does not shard yet ([`crate::engine::tp_quant_check`]).
    pub fn new_shard(
        cfg: &ModelConfig,
        weights: Weights<T>,
        shard: Shard,
        comm: TpComm,
    ) -> Result<Self> {
        shard.check(cfg)?;
        if comm.rank() != shard.rank || comm.size() != shard.size {
            return Err(EngineError::invalid(
                "--tp",
                format!(
                    "communicator of rank {} of {} for shard {} of {}",
                    comm.rank(),
                    comm.size(),
                    shard.rank,
                    shard.size
                ),
            ));
        }
        crate::engine::tp_quant_check(weights.quant)?;
        let vocab_per_rank = shard.vocab(cfg).map(|r| r.len());
        let mut m = Model::new(shard.local_config(cfg), weights)?;
        m.tp = Some(ModelTp {
            comm,
            shard,
            vocab_per_rank,
            scratch: Mutex::new(HashMap::new()),
        });
        Ok(m)
    }

    /// This rank's communicator, with tensor parallelism.
    pub fn comm(&self) -> Option<&TpComm> {
        self.tp.as_ref().map(|t| &t.comm)
    }

    /// Which part of the model this is ([`Shard::SINGLE`] without tensor parallelism).
    pub fn shard(&self) -> Shard {
        self.tp.as_ref().map_or(Shard::SINGLE, |t| t.shard)
    }

    /// The largest [`Model::gemv_max_m`] `T` can run.
    fn max_gemv_m() -> usize {
        if T::DENSE_GEMV {
            gemv_dense::MAX_M
        } else {
            0
        }
    }

    /// [`EngineError::Invalid`] naming `gemv_max_m` when it is above what `T` can run.
    fn check_gemv_max_m(&self) -> Result<()> {
        let max = Self::max_gemv_m();
        if self.gemv_max_m > max {
            return Err(EngineError::invalid(
                "gemv_max_m",
                format!(
                    "{} is above {max}, the most the dense GEMV runs in {}",
                    self.gemv_max_m,
                    T::NAME
                ),
            ));
        }
        Ok(())
    }

    /// [`Buffers::new`] plus the scratch this model's [`crate::linear::Quant`] mode needs for
    /// a pass over `m` tokens ([`crate::linear::Quant::buffer_bytes`]).
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
    ///
    /// Errors: [`EngineError::Invalid`] naming `max_len` (outside `1..=m`), `cache` (another
    /// layer count) or `gemv_max_m` (above what `T` runs), before any launch; the kernels'.
    pub fn forward(
        &self,
        stream: &Arc<CudaStream>,
        blas: &mut Blas,
        buf: &mut Buffers<T>,
        cache: &mut Cache<T>,
        mode: AttnMode,
    ) -> Result<()> {
        let m = buf.m;
        let w = &self.weights;
        let longest = match mode {
            AttnMode::Decode => None,
            AttnMode::Prefill { max_len } => Some(("max_len", max_len)),
            AttnMode::Paged { max_q_len } => Some(("max_q_len", max_q_len)),
        };
        if let Some((arg, n)) = longest.filter(|&(_, n)| n == 0 || n > m) {
            return Err(EngineError::invalid(
                arg,
                format!("{n} outside 1..={m} (tokens in the pass)"),
            ));
        }
        let fits = match mode {
            AttnMode::Decode => true,
            AttnMode::Prefill { .. } => !cache.is_paged(),
            AttnMode::Paged { .. } => cache.is_paged(),
        };
        if !fits {
            return Err(EngineError::invalid(
                "cache",
                format!(
                    "a {} cache for a {mode:?} pass (paged passes need Cache::new_paged, prefill passes Cache::new)",
                    if cache.is_paged() { "paged" } else { "contiguous" }
                ),
            ));
        }
        if cache.layers.len() != w.layers.len() {
            return Err(EngineError::invalid(
                "cache",
                format!(
                    "{} layers, the model has {}",
                    cache.layers.len(),
                    w.layers.len()
                ),
            ));
        }
        self.check_gemv_max_m()?;
        let gemv = m <= self.gemv_max_m;
        let mut decode = cache.decode_params(&self.cfg);
        if buf.decode_bound > 0 {
            decode.max_seq_len = decode.max_seq_len.min(buf.decode_bound);
        }
        let pass = Pass {
            stream,
            cfg: &self.cfg,
            rope: &self.rope,
            eps: self.eps,
            mode,
            decode,
            gemv,
            fuse_norm: gemv
                && m <= self.fuse_norm_max_m
                && w.layers.iter().all(|l| layer::fuses_norms(l)),
            fuse_rope: gemv && mode == AttnMode::Decode,
            paged: cache.is_paged(),
            tp: self.tp.as_ref().map(|t| &t.comm),
        };
        embedding::lookup(stream, &buf.ids, &w.embed, &mut buf.h, &mut buf.status)?;
        // x = rms_norm(h) for the first layer, unless it normalises h itself (in its GEMVs, or
        // W8A8's quantising norm).
        let first = w.layers.first();
        if !pass.fuse_norm && !first.is_some_and(|l| l.wqkv.is_w8a8()) {
            let gamma = first.map_or(&w.final_norm, |l| &l.attn_norm);
            norm::rms_norm(stream, &buf.h, gamma, self.eps, &mut buf.x)?;
        }
        for (l, (lw, kvc)) in w.layers.iter().zip(&mut cache.layers).enumerate() {
            let next = w.layers.get(l + 1);
            layer::forward(&pass, blas, lw, next, &w.final_norm, buf, kvc)?;
        }
        // With fused norms the layers leave only h.
        if pass.fuse_norm {
            norm::rms_norm(stream, &buf.h, &w.final_norm, self.eps, &mut buf.x)?;
        }
        Ok(())
    }

    /// `logits[r] = rows[r]·Wlmᵀ` (`rows` `[r, hidden]`, `logits` `[r, vocab]`): on the dense
    /// GEMV up to [`Model::gemv_max_m`] rows, else on cuBLASLt.
    pub fn lm_head(
        &self,
        stream: &Arc<CudaStream>,
        blas: &mut Blas,
        rows: &DeviceTensor<T>,
        logits: &mut DeviceTensor<T>,
    ) -> Result<()> {
        self.check_gemv_max_m()?;
        let w = self.weights.lm_head.as_ref().unwrap_or(&self.weights.embed);
        let gemv = rows.shape().first().is_some_and(|&r| r <= self.gemv_max_m);
        let mut project = |out: &mut DeviceTensor<T>| -> Result<()> {
            if gemv {
                T::dense_linear(stream, rows, w, None, out)?;
            } else {
                blas.linear(rows, w, None, out)?;
            }
            Ok(())
        };
        let tp = self
            .tp
            .as_ref()
            .and_then(|t| t.vocab_per_rank.map(|v| (t, v)));
        let Some((tp, per)) = tp else {
            return project(logits);
        };
        // Vocabulary-parallel: this rank's [r, V/N] slice, all-gathered as N blocks of
        // [r, V/N], then each block copied into its columns of [r, V].
        let r = rows.shape().first().copied().unwrap_or(0);
        let n = tp.shard.size;
        let want = [r, per * n];
        if logits.shape() != want {
            return Err(EngineError::invalid(
                "logits",
                format!("shape {:?}, the LM head writes {want:?}", logits.shape()),
            ));
        }
        let mut scratch = tp.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let (local, gather) = match scratch.entry(r) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert((
                DeviceTensor::<T>::zeros(stream, &[r, per])?,
                DeviceTensor::<T>::zeros(stream, &[n * r * per])?,
            )),
        };
        project(local)?;
        if r == 1 {
            // One row: the gather is already [1, V].
            return tp.comm.all_gather(stream, local, logits);
        }
        tp.comm.all_gather(stream, local, gather)?;
        for k in 0..n {
            crate::tp::copy_2d(
                stream,
                gather,
                k * r * per,
                per,
                logits,
                k * per,
                n * per,
                per,
                r,
            )?;
        }
        Ok(())
    }
}
