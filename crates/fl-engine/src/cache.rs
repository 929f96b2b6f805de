//! The KV cache ([`Cache`]): one K and V per layer, written by each pass and read by the
//! attention: contiguous, `[batch, kv_heads, capacity, head_dim]` (the static engine), or
//! paged, `[num_blocks, kv_heads, block_size, head_dim]` blocks that sequences reach through a
//! block table (the block manager, [`crate::kv`], decides which).

use std::sync::Arc;

use fl_kernels::attention::DecodeParams;
use fl_kernels::cudarc::driver::CudaStream;
use fl_kernels::kv_cache::KvCache;

use crate::config::ModelConfig;
use crate::dtype::RunDType;
use crate::error::{EngineError, Result};

/// The KV cache of every layer: contiguous `[batch, kv_heads, capacity, head_dim]` K and V,
/// or paged `[num_blocks, kv_heads, block_size, head_dim]`.
pub struct Cache<T: RunDType> {
    /// One per layer.
    pub layers: Vec<KvCache<T>>,
    /// Positions per sequence (paged: `block_size * max_blocks_per_seq`).
    pub capacity: usize,
    /// Sequences (paged: rows of a pass's block table).
    pub batch: usize,
    /// Tokens per block of a paged cache; `None` for a contiguous one.
    pub block_size: Option<usize>,
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
            block_size: None,
        })
    }

    /// Allocates (zeroed) a paged cache of `num_blocks` blocks of `block_size` tokens per
    /// layer, for passes of up to `max_seqs` sequences (block-table rows) of up to
    /// `max_blocks_per_seq` blocks each.
    ///
    /// Errors: [`EngineError::Invalid`] naming `block_size` or `max_blocks_per_seq`
    /// (zero), or the allocation's.
    pub fn new_paged(
        stream: &Arc<CudaStream>,
        cfg: &ModelConfig,
        num_blocks: usize,
        block_size: usize,
        max_seqs: usize,
        max_blocks_per_seq: usize,
    ) -> Result<Self> {
        for (arg, v) in [
            ("block_size", block_size),
            ("max_blocks_per_seq", max_blocks_per_seq),
        ] {
            if v == 0 {
                return Err(EngineError::invalid(arg, "must be at least 1"));
            }
        }
        let shape = [
            num_blocks,
            cfg.num_key_value_heads,
            block_size,
            cfg.head_dim,
        ];
        let layers = (0..cfg.num_hidden_layers)
            .map(|_| KvCache::zeros(stream, shape))
            .collect::<fl_kernels::Result<Vec<_>>>()?;
        Ok(Cache {
            layers,
            capacity: block_size * max_blocks_per_seq,
            batch: max_seqs,
            block_size: Some(block_size),
        })
    }

    /// Whether this is a paged cache ([`Cache::new_paged`]).
    pub fn is_paged(&self) -> bool {
        self.block_size.is_some()
    }

    /// Columns of a pass's block table: `capacity / block_size` (1 for a contiguous cache).
    pub fn max_blocks_per_seq(&self) -> usize {
        self.block_size.map_or(1, |b| self.capacity / b)
    }

    /// Device bytes of the whole cache.
    pub fn bytes(&self) -> u64 {
        self.layers
            .iter()
            .map(|c| 2 * c.k().num_bytes() as u64)
            .sum()
    }

    /// The decode kernel's parameters for `cfg` over this cache. They cover the whole
    /// capacity, so the split layout does not depend on the step (a captured graph stays
    /// valid as sequences grow); a pass may narrow them (`Buffers::decode_bound`).
    pub(crate) fn decode_params(&self, cfg: &ModelConfig) -> DecodeParams {
        let mut p = DecodeParams::new(cfg.head_dim, self.capacity);
        p.scale = cfg.attention_scale() as f32;
        p.window = cfg.sliding_window;
        p
    }
}
