//! The activation buffers of a forward pass ([`Buffers`]): every intermediate tensor of a
//! pass over `m` tokens, allocated once and reused, and the step's token metadata.

use std::sync::Arc;

use fl_kernels::attention::{self, DecodeWorkspace};
use fl_kernels::cudarc::driver::CudaStream;
use fl_kernels::embedding::DeviceStatus;
use fl_kernels::DeviceTensor;

use crate::cache::Cache;
use crate::config::ModelConfig;
use crate::dtype::RunDType;
use crate::error::{EngineError, Result};
use crate::linear::QuantBuffers;
use crate::model::AttnMode;

/// Per-token scratch of a forward pass over `m` tokens: every intermediate tensor,
/// allocated once and reused (the decode step's buffers are what its CUDA graph reads).
pub struct Buffers<T: RunDType> {
    pub(crate) m: usize,
    /// Residual stream `[m, hidden]`.
    pub h: DeviceTensor<T>,
    /// Normalised input of the next GEMM `[m, hidden]`.
    pub x: DeviceTensor<T>,
    /// QKV projection output `[m, q + 2 kv]` (unless the decode GEMV splits it itself).
    pub(crate) qkv: DeviceTensor<T>,
    /// Rotated queries `[m, q_heads, head_dim]`.
    pub(crate) q: DeviceTensor<T>,
    /// Prefill: this pass's rotated keys, packed `[m, kv_heads, head_dim]`.
    pub(crate) k: DeviceTensor<T>,
    /// Prefill: this pass's values, packed `[m, kv_heads, head_dim]`.
    pub(crate) v: DeviceTensor<T>,
    /// Attention output `[m, q]`.
    pub(crate) attn: DeviceTensor<T>,
    /// A projection's output before the residual add `[m, hidden]`.
    pub(crate) tmp: DeviceTensor<T>,
    /// Gate|up projection output `[m, 2 intermediate]`.
    pub(crate) gate_up: DeviceTensor<T>,
    /// SwiGLU output `[m, intermediate]`.
    pub(crate) act: DeviceTensor<T>,
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
    /// Paged caches: each sequence's block ids, `[cache.batch, cache.max_blocks_per_seq()]`
    /// (`[m, ..]` in a decode pass, token `b` being sequence `b`; `[1, 1]` for a contiguous
    /// cache).
    pub block_table: DeviceTensor<i32>,
    /// Paged passes: each sequence's context length after this pass, `[cache.batch]`.
    pub ctx_lens: DeviceTensor<i32>,
    /// The decode attention's split workspace.
    pub(crate) attn_ws: DecodeWorkspace,
    /// Decode passes: an upper bound on every token's visible keys that sizes the attention's
    /// split layout instead of the cache's whole capacity (0: the capacity). A CUDA graph
    /// captured under one bound stays valid while no sequence passes it; the runner keeps a
    /// graph per power-of-two bound, so short contexts do not pay for a long capacity's
    /// splits.
    pub(crate) decode_bound: usize,
    /// Embedding-lookup status (an out-of-vocabulary id).
    pub status: DeviceStatus,
    /// The quantised projections' scratch ([`Model::buffers`](crate::model::Model::buffers);
    /// empty from [`Buffers::new`]).
    pub(crate) quant: QuantBuffers<T>,
}

impl<T: RunDType> Buffers<T> {
    /// Buffers for `m` tokens of `cfg` running attention in `mode` over `cache` (whose
    /// shapes size the attention workspace), for a dense model; a quantised model's come from
    /// [`Model::buffers`](crate::model::Model::buffers).
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
        // Paged caches: a block-table row per sequence; a decode pass has one per token.
        let block_table = match (cache.is_paged(), mode) {
            (false, _) => zi(&[1, 1])?,
            (true, AttnMode::Decode) => zi(&[m, cache.max_blocks_per_seq()])?,
            (true, _) => zi(&[cache.batch, cache.max_blocks_per_seq()])?,
        };
        let ws_bytes = match (cache.layers.first(), mode) {
            (Some(kvc), AttnMode::Decode) => {
                let qt = z(&[m, cfg.num_attention_heads, cfg.head_dim])?;
                let params = cache.decode_params(cfg);
                let c = if cache.is_paged() {
                    attention::KvCache::Paged {
                        k: kvc.k(),
                        v: kvc.v(),
                        block_table: &block_table,
                    }
                } else {
                    attention::KvCache::Contiguous {
                        k: kvc.k(),
                        v: kvc.v(),
                    }
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
            block_table,
            ctx_lens: zi(&[cache.batch])?,
            attn_ws: DecodeWorkspace::new(stream, ws_bytes)?,
            decode_bound: 0,
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

    /// Uploads the sequence metadata of a pass over a paged cache (after [`Buffers::upload`]
    /// of its tokens; a decode pass reads only the block table, one row per token):
    /// `cu_seqlens` (`[seqs + 1]`, the chunk offsets in the packed tokens), `ctx_lens`
    /// (`[seqs]`, each sequence's context after this pass) and `block_table` (`seqs` rows of
    /// [`crate::cache::Cache::max_blocks_per_seq`] block ids, row-major; entries past a
    /// sequence's blocks are never read). Queued on `stream`, no sync.
    ///
    /// Errors: [`EngineError::Invalid`] naming the argument whose length does not match
    /// `seqs` (more than the cache's `batch`, or a table of another width).
    pub fn upload_paged(
        &mut self,
        stream: &Arc<CudaStream>,
        cu_seqlens: &[i32],
        ctx_lens: &[i32],
        block_table: &[i32],
    ) -> Result<()> {
        let seqs = ctx_lens.len();
        let rows = self.ctx_lens.shape()[0];
        let (table_rows, width) = (self.block_table.shape()[0], self.block_table.shape()[1]);
        if seqs == 0 || seqs > rows.min(table_rows) {
            return Err(EngineError::invalid(
                "ctx_lens",
                format!(
                    "{seqs} sequences, the buffers hold 1..={}",
                    rows.min(table_rows)
                ),
            ));
        }
        if cu_seqlens.len() != seqs + 1 {
            return Err(EngineError::invalid(
                "cu_seqlens",
                format!(
                    "{} offsets for {seqs} sequences (needs {})",
                    cu_seqlens.len(),
                    seqs + 1
                ),
            ));
        }
        if block_table.len() != seqs * width {
            return Err(EngineError::invalid(
                "block_table",
                format!("{} ids for {seqs} rows of {width}", block_table.len()),
            ));
        }
        // Unused rows: empty chunks, no context (the kernels skip them).
        let mut cu = cu_seqlens.to_vec();
        cu.resize(rows + 1, *cu_seqlens.last().unwrap_or(&0));
        let mut ctx = ctx_lens.to_vec();
        ctx.resize(rows, 0);
        let mut table = block_table.to_vec();
        table.resize(table_rows * width, 0);
        self.cu_seqlens.copy_from_host(stream, &cu)?;
        self.ctx_lens.copy_from_host(stream, &ctx)?;
        self.block_table.copy_from_host(stream, &table)?;
        Ok(())
    }
}
