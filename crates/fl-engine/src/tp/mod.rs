//! Tensor parallelism over NCCL (Megatron-LM's layout): one model split across the GPUs of a
//! host, one rank per GPU.
//!
//! ```text
//!            rank r of N holds                          per layer, every rank
//! wqkv      its q heads, its kv heads (k and v)         qkv = x·Wqkvᵀ (its heads), attention
//! wo        the columns of its q heads                  h += all_reduce(attn·Woᵀ)
//! gate|up   its rows of gate and of up                  act = swiglu(x·[Wg|Wu]ᵀ)
//! down      the columns of its intermediate rows        h += all_reduce(act·Wdownᵀ)
//! lm_head   vocab rows r·V/N .. (r+1)·V/N               logits = all_gather(x·Wlmᵀ)
//! embed     all of it (a lookup reads `m` rows)
//! ```
//!
//! Every rank runs the same program on the same inputs (SPMD): the same scheduler, the same
//! step plans, the same sampling on the same gathered logits. NCCL's all-reduce and
//! all-gather hand every rank bit-identical results, so every rank samples the same token
//! with the same Philox seed and no token has to be exchanged; [`TpRunner`] checks this
//! after every step and stops the group if the ranks ever disagree.
//!
//! - [`Shard`]: which slice of each weight a rank holds, and the per-rank config the layer
//!   code runs on ([`Shard::local_config`]: heads and intermediate width divided by N).
//!   KV heads are split across ranks, or replicated when N > `num_key_value_heads` (each
//!   rank keeps the one KV head its q heads read).
//! - [`TpComm`]: one rank's NCCL communicator (all-reduce, all-gather on the engine's stream;
//!   captured in the runner's CUDA graphs like any other launch).
//! - [`TpEngine`]: N worker threads, one per GPU, each loading its shard
//!   ([`crate::engine::Engine::load_shard`]); [`TpRunner`]: a [`Runner`](crate::runner::Runner)
//!   on every rank driven in lockstep, with the runner's API.
//!
//! A rank that fails (out of memory, an NCCL or CUDA error) stops the whole group: the
//! communicators are aborted so that no other rank stays blocked in a collective, and every
//! call after that returns the first rank's error.
//!
//! ```no_run
//! use fl_engine::engine::Engine;
//! use fl_engine::linear::Quant;
//! use fl_engine::presets::preset;
//! use fl_engine::runner::RunnerConfig;
//! use fl_engine::tp::{TpEngine, TpOptions};
//! use fl_engine::weights::WeightSource;
//! use half::f16;
//!
//! // llama-2-13b over GPUs 0 and 1, dummy weights: each rank loads only its shard.
//! let cfg = preset("llama-2-13b")?;
//! let c = cfg.clone();
//! let mut tp = TpEngine::<f16>::load(cfg, TpOptions::first(2), move |device, comm| {
//!     Engine::load_shard(device, c.clone(), WeightSource::Dummy { seed: 1 }, Quant::None, comm, None)
//! })?;
//! let mut runner = tp.runner(&RunnerConfig::default())?; // then add_request / step as a Runner
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `fl generate / bench / logits / serve --tp N` do this through
//! [`crate::load::any_engine`] and [`AnyEngine`].

mod any;
mod comm;
mod group;
#[cfg(test)]
mod tests;

pub use any::{AnyEngine, AnyRunner};
pub use comm::{nccl_available, AbortHandle, TpComm, ONE_SHOT_MAX_BYTES};
pub use group::{TpEngine, TpOptions, TpRunner};

use std::ops::Range;

use crate::config::ModelConfig;
use crate::error::{EngineError, Result};

/// Which part of the model one rank holds: rank `rank` of `size`. [`Shard::SINGLE`] is the
/// whole model on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shard {
    /// This rank, `0..size`.
    pub rank: usize,
    /// Ranks in the group (the `--tp` degree).
    pub size: usize,
}

impl Shard {
    /// The whole model, no communication.
    pub const SINGLE: Shard = Shard { rank: 0, size: 1 };

    /// Rank `rank` of `size`. Errors: [`EngineError::Invalid`] naming `--tp` for `size == 0`
    /// or `rank >= size`.
    pub fn new(rank: usize, size: usize) -> Result<Self> {
        if size == 0 || rank >= size {
            return Err(EngineError::invalid(
                "--tp",
                format!(
                    "rank {rank} of {size}: the degree must be at least 1 and the rank below it"
                ),
            ));
        }
        Ok(Shard { rank, size })
    }

    /// Whether this is the whole model.
    pub fn is_single(&self) -> bool {
        self.size == 1
    }

    /// Checks that `cfg` splits `size` ways: query heads, intermediate width and key/value
    /// heads divisible by `size` (or `size` a multiple of the key/value heads, which are then
    /// replicated). The vocabulary need not divide: the LM head is then replicated
    /// ([`Shard::vocab`]).
    ///
    /// Errors: [`EngineError::Invalid`] naming `--tp` and the field that does not divide.
    pub fn check(&self, cfg: &ModelConfig) -> Result<()> {
        let n = self.size;
        let bad = |field: &str, v: usize, why: &str| {
            Err(EngineError::invalid(
                "--tp",
                format!("{n} does not split the model: {field} {v} {why}"),
            ))
        };
        if cfg.num_attention_heads % n != 0 {
            return bad(
                "num_attention_heads",
                cfg.num_attention_heads,
                "is not a multiple of it",
            );
        }
        let kv = cfg.num_key_value_heads;
        if kv % n != 0 && n % kv != 0 {
            return bad(
                "num_key_value_heads",
                kv,
                "neither divides it nor is a multiple of it",
            );
        }
        if cfg.intermediate_size % n != 0 {
            return bad(
                "intermediate_size",
                cfg.intermediate_size,
                "is not a multiple of it",
            );
        }
        Ok(())
    }

    /// The config one rank's layers run on: `num_attention_heads / size` query heads,
    /// `max(num_key_value_heads / size, 1)` key/value heads and `intermediate_size / size`;
    /// everything else (hidden size, vocabulary, context) unchanged. Call [`Shard::check`]
    /// first.
    pub fn local_config(&self, cfg: &ModelConfig) -> ModelConfig {
        let n = self.size;
        ModelConfig {
            num_attention_heads: cfg.num_attention_heads / n,
            num_key_value_heads: (cfg.num_key_value_heads / n).max(1),
            intermediate_size: cfg.intermediate_size / n,
            ..cfg.clone()
        }
    }

    /// The query heads of this rank (global indices).
    pub fn q_heads(&self, cfg: &ModelConfig) -> Range<usize> {
        let per = cfg.num_attention_heads / self.size;
        self.rank * per..(self.rank + 1) * per
    }

    /// The key/value heads of this rank (global indices): its share, or with more ranks than
    /// key/value heads the one head its query heads read.
    pub fn kv_heads(&self, cfg: &ModelConfig) -> Range<usize> {
        let (kv, n) = (cfg.num_key_value_heads, self.size);
        if kv >= n {
            let per = kv / n;
            self.rank * per..(self.rank + 1) * per
        } else {
            let h = self.rank * kv / n;
            h..h + 1
        }
    }

    /// The intermediate (gate / up / down) rows of this rank.
    pub fn intermediate(&self, cfg: &ModelConfig) -> Range<usize> {
        let per = cfg.intermediate_size / self.size;
        self.rank * per..(self.rank + 1) * per
    }

    /// The vocabulary rows of the LM head this rank holds, or `None` when the LM head is
    /// replicated (a single rank, or a vocabulary that `size` does not divide).
    pub fn vocab(&self, cfg: &ModelConfig) -> Option<Range<usize>> {
        let (v, n) = (cfg.vocab_size, self.size);
        if n == 1 || v % n != 0 {
            return None;
        }
        let per = v / n;
        Some(self.rank * per..(self.rank + 1) * per)
    }

    /// Row indices of this rank's part of a stacked QKV weight, in the device's row order
    /// `order` ([`crate::weights::qkv_row_order`] of the whole model): its q heads' rows,
    /// then its kv heads' k rows, then their v rows.
    pub fn qkv_rows(&self, cfg: &ModelConfig, order: &[usize]) -> Vec<usize> {
        let d = cfg.head_dim;
        let (hq, hkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        let q = self.q_heads(cfg);
        let kv = self.kv_heads(cfg);
        let mut rows = Vec::with_capacity((q.len() + 2 * kv.len()) * d);
        rows.extend_from_slice(&order[q.start * d..q.end * d]);
        rows.extend_from_slice(&order[(hq + kv.start) * d..(hq + kv.end) * d]);
        rows.extend_from_slice(&order[(hq + hkv + kv.start) * d..(hq + hkv + kv.end) * d]);
        rows
    }

    /// Row indices of this rank's part of the stacked gate|up weight (`[2 I, hidden]`).
    pub fn gate_up_rows(&self, cfg: &ModelConfig) -> Vec<usize> {
        let i = cfg.intermediate_size;
        let r = self.intermediate(cfg);
        r.clone().chain(r.start + i..r.end + i).collect()
    }
}

/// Copies `height` rows of `width` elements from `src` (starting at element `src_off`, rows
/// `src_pitch` elements apart) to `dst` (from `dst_off`, rows `dst_pitch` apart) on `stream`
/// (`cuMemcpy2DAsync`: one copy node in a captured graph).
///
/// Errors: [`EngineError::Invalid`] naming `src` or `dst` when the rows run past its end.
#[allow(clippy::too_many_arguments)]
pub(crate) fn copy_2d<T: crate::dtype::RunDType>(
    stream: &std::sync::Arc<fl_kernels::cudarc::driver::CudaStream>,
    src: &fl_kernels::DeviceTensor<T>,
    src_off: usize,
    src_pitch: usize,
    dst: &mut fl_kernels::DeviceTensor<T>,
    dst_off: usize,
    dst_pitch: usize,
    width: usize,
    height: usize,
) -> Result<()> {
    use fl_kernels::cudarc::driver::{sys, DevicePtr, DevicePtrMut};
    if height == 0 || width == 0 {
        return Ok(());
    }
    let end = |off: usize, pitch: usize| off + (height - 1) * pitch + width;
    for (arg, off, pitch, len) in [
        ("src", src_off, src_pitch, src.len()),
        ("dst", dst_off, dst_pitch, dst.len()),
    ] {
        if pitch < width || end(off, pitch) > len {
            return Err(EngineError::invalid(
                arg,
                format!(
                    "{height} rows of {width} from element {off}, {pitch} apart, past its {len} elements"
                ),
            ));
        }
    }
    let sz = std::mem::size_of::<T>();
    let (sp, _gs) = src.as_slice().device_ptr(stream);
    let (dp, _gd) = dst.as_slice_mut().device_ptr_mut(stream);
    let c = sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: sp + (src_off * sz) as u64,
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch * sz,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dp + (dst_off * sz) as u64,
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch * sz,
        WidthInBytes: width * sz,
        Height: height,
    };
    // SAFETY: both ranges were checked to lie inside their tensors, on the stream's device.
    unsafe { sys::cuMemcpy2DAsync_v2(&c, stream.cu_stream()) }
        .result()
        .map_err(fl_kernels::Error::from)?;
    Ok(())
}
