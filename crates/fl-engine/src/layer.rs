//! One decoder layer, written once: [`forward`] runs it for every dtype, weight form and
//! pass size, the choices fixed per pass in a [`Pass`] by [`crate::model::Model::forward`].
//!
//! ```text
//! qkv = x·Wqkvᵀ (+ bqkv);  rope(q, k, positions);  cache.append(k, v, (seq_ids, positions))
//! attn = attention(q, cache or this pass's packed k, v)     causal, GQA
//! h += attn·Woᵀ (+ bo);                x = rms_norm(h, ffn_norm)
//! act = silu(gu_gate) * gu_up,  gu = x·[Wg|Wu]ᵀ (+ b)
//! h += act·Wdownᵀ (+ b);               x = rms_norm(h, next layer's attn_norm or final_norm)
//! ```
//!
//! How each line runs:
//! - dense projections of a small pass ([`Pass::gemv`]) on the dense GEMV with the SwiGLU and
//!   the residual add fused in; other dense passes on cuBLASLt with the separate SwiGLU and
//!   add+RMSNorm kernels; quantised projections per [`Linear::forward`]; W8A8 through the
//!   `linear::w8a8_*` steps, which fuse the (de)quantisation into the kernels around the GEMMs;
//! - [`Pass::fuse_norm`]: no `x` is written; each GEMV normalises `h` itself;
//! - [`Pass::fuse_rope`]: the QKV GEMV rotates q and k and appends k and v to the cache in its
//!   epilogue; otherwise [`kv_cache::rope_append`] does it from `qkv`.

use std::sync::Arc;

use fl_blas::Blas;
use fl_kernels::attention::{self, DecodeParams};
use fl_kernels::attention_prefill::{self, PagedPrefillParams, PrefillParams};
use fl_kernels::cudarc::driver::CudaStream;
use fl_kernels::gemv_dense::QkvRopeAppend;
use fl_kernels::kv_cache::{self, CacheLayout, KvCache, QkvSplit, RopeAppend, TokenSlots};
use fl_kernels::rope::RopeParams;
use fl_kernels::{activation, norm, DeviceTensor};

use crate::buffers::Buffers;
use crate::config::ModelConfig;
use crate::dtype::RunDType;
use crate::error::Result;
use crate::linear::{self, Linear};
use crate::model::AttnMode;
use crate::tp::TpComm;
use crate::weights::LayerWeights;

/// What every layer of one forward pass shares: the model's constants and the choices made
/// once for the pass.
pub(crate) struct Pass<'a> {
    pub stream: &'a Arc<CudaStream>,
    pub cfg: &'a ModelConfig,
    pub rope: &'a RopeParams,
    pub eps: f32,
    pub mode: AttnMode,
    /// The decode kernel's parameters over the cache.
    pub decode: DecodeParams,
    /// Dense projections run on the dense GEMV (`m <= Model::gemv_max_m`); o, gate/up and
    /// down only without a bias.
    pub gemv: bool,
    /// Every RMSNorm runs inside the dense GEMV that reads it. Only with `gemv` and layers
    /// for which [`fuses_norms`] holds.
    pub fuse_norm: bool,
    /// RoPE and the KV append run in the dense QKV GEMV's epilogue: decode passes with `gemv`
    /// (contiguous or paged cache).
    pub fuse_rope: bool,
    /// The cache is paged (`buf.block_table` maps each sequence's positions to blocks).
    pub paged: bool,
    /// Tensor parallelism: this rank's communicator. The o and down projections are
    /// row-parallel: their partial sums are all-reduced before the residual add.
    pub tp: Option<&'a TpComm>,
}

/// Whether a layer's RMSNorms can run inside its GEMVs: every projection dense and no
/// o/gate/up/down bias (a biased projection runs on cuBLASLt, which reads a normalised `x`).
pub(crate) fn fuses_norms<T: RunDType>(lw: &LayerWeights<T>) -> bool {
    lw.bo.is_none()
        && lw.b_gate_up.is_none()
        && lw.b_down.is_none()
        && [&lw.wqkv, &lw.wo, &lw.w_gate_up, &lw.w_down]
            .iter()
            .all(|p| p.as_dense().is_some())
}

/// One decoder layer over the pass's tokens in `buf`: reads `buf.x` (or `buf.h` with
/// [`Pass::fuse_norm`]), writes this pass's K/V into `kvc`, adds the layer's output to
/// `buf.h` and leaves `buf.x = rms_norm(h)` with `next`'s input norm (`final_norm` after the
/// last layer), unless the next reader normalises `h` itself: with [`Pass::fuse_norm`] (the
/// next layer's GEMVs, or `Model::forward`'s final norm) or a W8A8 next layer. Queues work on
/// the pass's stream only.
pub(crate) fn forward<T: RunDType>(
    pass: &Pass<'_>,
    blas: &mut Blas,
    lw: &LayerWeights<T>,
    next: Option<&LayerWeights<T>>,
    final_norm: &DeviceTensor<T>,
    buf: &mut Buffers<T>,
    kvc: &mut KvCache<T>,
) -> Result<()> {
    let (stream, eps) = (pass.stream, pass.eps);
    let fuse_norm = pass.fuse_norm;

    // qkv = rms_norm(h)·Wqkvᵀ (+ bqkv); with fuse_rope the GEMV also rotates and appends.
    let rope_fused = pass.fuse_rope && lw.wqkv.as_dense().is_some();
    match (&lw.wqkv, pass.gemv) {
        (Linear::Dense(w), true) if rope_fused => {
            let (x, norm) = if fuse_norm {
                (&buf.h, Some((&lw.attn_norm, eps)))
            } else {
                (&buf.x, None)
            };
            let args = QkvRopeAppend {
                heads: qkv_split(pass.cfg),
                rope: pass.rope,
                slots: TokenSlots {
                    seq_ids: &buf.seq_ids,
                    positions: &buf.positions,
                },
                layout: if pass.paged {
                    CacheLayout::Paged {
                        block_table: &buf.block_table,
                    }
                } else {
                    CacheLayout::Contiguous
                },
            };
            T::dense_linear_rope_append(
                stream,
                x,
                norm,
                w,
                lw.bqkv.as_ref(),
                &args,
                &mut buf.q,
                kvc,
            )?
        }
        (Linear::Dense(w), true) if fuse_norm => T::dense_rms_norm_linear(
            stream,
            &buf.h,
            &lw.attn_norm,
            eps,
            w,
            lw.bqkv.as_ref(),
            &mut buf.qkv,
        )?,
        (Linear::Dense(w), true) => {
            T::dense_linear(stream, &buf.x, w, lw.bqkv.as_ref(), &mut buf.qkv)?
        }
        // Normalises (and quantises) h itself.
        (Linear::W8A8(w), _) => linear::w8a8_qkv(
            stream,
            blas,
            &mut buf.quant,
            &buf.h,
            &lw.attn_norm,
            eps,
            w,
            lw.bqkv.as_ref(),
            &mut buf.qkv,
        )?,
        (w, _) => w.forward(
            stream,
            blas,
            &buf.x,
            lw.bqkv.as_ref(),
            &mut buf.qkv,
            &mut buf.quant,
        )?,
    }
    attention(pass, buf, kvc, rope_fused)?;

    // h += attn·Woᵀ (+ bo); x = rms_norm(h, ffn_norm).
    match (&lw.wo, pass.gemv && lw.bo.is_none()) {
        (Linear::Dense(w), true) => {
            row_parallel_add(
                pass,
                &mut buf.h,
                |h| T::dense_linear_add(stream, &buf.attn, w, h),
                |h| T::dense_linear(stream, &buf.attn, w, None, h),
            )?;
            if !fuse_norm {
                norm::rms_norm(stream, &buf.h, &lw.ffn_norm, eps, &mut buf.x)?;
            }
        }
        // Leaves x quantised in the scratch (in buf.x too only with a bias).
        (Linear::W8A8(w), _) => linear::w8a8_o(
            stream,
            blas,
            &mut buf.quant,
            &buf.attn,
            w,
            lw.bo.as_ref(),
            &mut buf.h,
            &lw.ffn_norm,
            eps,
            &mut buf.tmp,
            &mut buf.x,
        )?,
        (w, _) => {
            w.forward(
                stream,
                blas,
                &buf.attn,
                lw.bo.as_ref(),
                &mut buf.tmp,
                &mut buf.quant,
            )?;
            if let Some(c) = pass.tp {
                c.all_reduce_sum(stream, &mut buf.tmp)?;
            }
            norm::add_rms_norm(stream, &buf.tmp, &mut buf.h, &lw.ffn_norm, eps, &mut buf.x)?;
        }
    }

    // act = silu(x·Wgᵀ) * (x·Wuᵀ).
    match (&lw.w_gate_up, pass.gemv && lw.b_gate_up.is_none()) {
        (Linear::Dense(w), true) if fuse_norm => {
            T::dense_rms_norm_linear_swiglu(stream, &buf.h, &lw.ffn_norm, eps, w, &mut buf.act)?
        }
        (Linear::Dense(w), true) => T::dense_linear_swiglu(stream, &buf.x, w, &mut buf.act)?,
        // Leaves act quantised in the scratch.
        (Linear::W8A8(w), _) => linear::w8a8_gate_up(
            stream,
            blas,
            &mut buf.quant,
            w,
            lw.b_gate_up.as_ref(),
            &mut buf.gate_up,
            &mut buf.act,
        )?,
        (w, _) => {
            w.forward(
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

    // h += act·Wdownᵀ (+ b_down); x = rms_norm(h) with the next layer's (or the final) weight.
    let next_norm = next.map_or(final_norm, |n| &n.attn_norm);
    match (&lw.w_down, pass.gemv && lw.b_down.is_none()) {
        (Linear::Dense(w), true) => {
            row_parallel_add(
                pass,
                &mut buf.h,
                |h| T::dense_linear_add(stream, &buf.act, w, h),
                |h| T::dense_linear(stream, &buf.act, w, None, h),
            )?;
            if !fuse_norm {
                norm::rms_norm(stream, &buf.h, next_norm, eps, &mut buf.x)?;
            }
        }
        (Linear::W8A8(w), _) => {
            // A next W8A8 layer normalises h itself.
            let need_x = !next.is_some_and(|n| n.wqkv.is_w8a8());
            linear::w8a8_down(
                stream,
                blas,
                &mut buf.quant,
                w,
                lw.b_down.as_ref(),
                &mut buf.h,
                next_norm,
                eps,
                need_x,
                &mut buf.tmp,
                &mut buf.x,
            )?;
        }
        (w, _) => {
            w.forward(
                stream,
                blas,
                &buf.act,
                lw.b_down.as_ref(),
                &mut buf.tmp,
                &mut buf.quant,
            )?;
            if let Some(c) = pass.tp {
                c.all_reduce_sum(stream, &mut buf.tmp)?;
            }
            norm::add_rms_norm(stream, &buf.tmp, &mut buf.h, next_norm, eps, &mut buf.x)?;
        }
    }
    Ok(())
}

/// `h += x·Wᵀ` for a row-parallel projection whose kernel adds into `h` (`add`): alone, just
/// that. Tensor-parallel, rank 0 adds its partial product to its `h` (which carries the
/// residual), every other rank writes its partial product over its `h` (`write`: no zeroing
/// pass), and the all-reduce sums the ranks' `h` into `h + Σ partials` on every rank: the
/// fused GEMV + add stays one kernel.
fn row_parallel_add<T: RunDType>(
    pass: &Pass<'_>,
    h: &mut DeviceTensor<T>,
    add: impl FnOnce(&mut DeviceTensor<T>) -> fl_kernels::Result<()>,
    write: impl FnOnce(&mut DeviceTensor<T>) -> fl_kernels::Result<()>,
) -> Result<()> {
    let Some(c) = pass.tp else {
        return Ok(add(h)?);
    };
    if c.rank() == 0 {
        add(h)?;
    } else {
        write(h)?;
    }
    c.all_reduce_sum(pass.stream, h)
}

/// The head counts of the model's QKV rows.
fn qkv_split(cfg: &ModelConfig) -> QkvSplit {
    QkvSplit {
        q_heads: cfg.num_attention_heads,
        kv_heads: cfg.num_key_value_heads,
    }
}

/// Split + RoPE + KV append of this pass's `qkv` (unless `appended`: the QKV GEMV already
/// wrote `buf.q` and the cache), then attention into `buf.attn` (`[m, q_heads * head_dim]`).
fn attention<T: RunDType>(
    pass: &Pass<'_>,
    buf: &mut Buffers<T>,
    kvc: &mut KvCache<T>,
    appended: bool,
) -> Result<()> {
    let (stream, cfg) = (pass.stream, pass.cfg);
    let m = buf.m;
    let (hq, d) = (cfg.num_attention_heads, cfg.head_dim);
    let args = RopeAppend {
        qkv: &buf.qkv,
        heads: qkv_split(cfg),
        slots: TokenSlots {
            seq_ids: &buf.seq_ids,
            positions: &buf.positions,
        },
        rope: pass.rope,
        layout: if pass.paged {
            CacheLayout::Paged {
                block_table: &buf.block_table,
            }
        } else {
            CacheLayout::Contiguous
        },
    };
    let packed = match pass.mode {
        AttnMode::Decode | AttnMode::Paged { .. } => None,
        AttnMode::Prefill { .. } => Some((&mut buf.k, &mut buf.v)),
    };
    if !appended {
        kv_cache::rope_append(stream, &args, &mut buf.q, packed, kvc, None)?;
    }
    buf.attn.set_shape(&[m, hq, d])?;
    match pass.mode {
        AttnMode::Decode => {
            let c = if pass.paged {
                attention::KvCache::Paged {
                    k: kvc.k(),
                    v: kvc.v(),
                    block_table: &buf.block_table,
                }
            } else {
                attention::KvCache::Contiguous {
                    k: kvc.k(),
                    v: kvc.v(),
                }
            };
            attention::decode(
                stream,
                &buf.q,
                &c,
                &buf.visible,
                &pass.decode,
                &mut buf.attn_ws,
                &mut buf.attn,
            )?;
        }
        AttnMode::Prefill { max_len } => {
            let p = PrefillParams {
                scale: pass.decode.scale,
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
        AttnMode::Paged { max_q_len } => {
            let c = attention::KvCache::Paged {
                k: kvc.k(),
                v: kvc.v(),
                block_table: &buf.block_table,
            };
            let mut p = PagedPrefillParams::new(d, max_q_len);
            p.scale = pass.decode.scale;
            p.window = cfg.sliding_window;
            attention_prefill::prefill_paged(
                stream,
                &buf.q,
                &c,
                &buf.cu_seqlens,
                &buf.ctx_lens,
                &mut buf.attn,
                &p,
            )?;
        }
    }
    buf.attn.set_shape(&[m, hq * d])?;
    Ok(())
}
