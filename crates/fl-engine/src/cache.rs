//! The KV cache ([`Cache`]): one contiguous K and V per layer, `[batch, kv_heads, capacity,
//! head_dim]`, written by each pass and read by the decode attention.

use std::sync::Arc;

use fl_kernels::attention::DecodeParams;
use fl_kernels::cudarc::driver::CudaStream;
use fl_kernels::kv_cache::KvCache;

use crate::config::ModelConfig;
use crate::dtype::RunDType;
use crate::error::Result;

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

    /// The decode kernel's parameters for `cfg` over this cache. They always cover the whole
    /// capacity, so the split layout does not depend on the step (a captured graph stays
    /// valid as sequences grow).
    pub(crate) fn decode_params(&self, cfg: &ModelConfig) -> DecodeParams {
        let mut p = DecodeParams::new(cfg.head_dim, self.capacity);
        p.scale = cfg.attention_scale() as f32;
        p.window = cfg.sliding_window;
        p
    }
}
