//! Encoder shapes for benchmarks, with random weights: [`preset`] and
//! [`EncoderWeights::random`].
//!
//! | name         | layers | hidden | heads | intermediate | vocab  |
//! |--------------|--------|--------|-------|--------------|--------|
//! | `bert-base`  | 12     | 768    | 12    | 3072         | 30522  |
//! | `bert-large` | 24     | 1024   | 16    | 4096         | 30522  |
//! | `bge-base`   | `bert-base`'s shape (BAAI/bge-base-en-v1.5 is a BERT-base)     |
//! | `bge-small`  | 12     | 384    | 12    | 1536         | 30522  |
//!
//! All are BERT (`model_type` `bert`, erf GELU, 512 positions, 2 token types, eps 1e-12).

use crate::encoder::config::EncoderConfig;
use crate::encoder::weights::{Dense, EncoderLayerWeights, EncoderWeights, LayerNorm};
use crate::error::{EngineError, Result};
use crate::trace::SplitMix64;

/// The preset names [`preset`] knows.
pub const PRESETS: &[&str] = &["bert-base", "bert-large", "bge-base", "bge-small"];

/// The config of a preset (see the [module docs](self)); `None` for another name.
///
/// # Example
/// ```
/// let cfg = fl_engine::encoder::presets::preset("bert-large").unwrap();
/// assert_eq!((cfg.num_hidden_layers, cfg.hidden_size), (24, 1024));
/// assert!(fl_engine::encoder::presets::preset("bert-huge").is_none());
/// ```
pub fn preset(name: &str) -> Option<EncoderConfig> {
    let (layers, hidden, heads, inter) = match name {
        "bert-base" | "bge-base" => (12, 768, 12, 3072),
        "bert-large" => (24, 1024, 16, 4096),
        "bge-small" => (12, 384, 12, 1536),
        _ => return None,
    };
    let json = format!(
        r#"{{"model_type": "bert", "vocab_size": 30522, "hidden_size": {hidden},
            "num_hidden_layers": {layers}, "num_attention_heads": {heads},
            "intermediate_size": {inter}, "max_position_embeddings": 512,
            "type_vocab_size": 2, "hidden_act": "gelu", "layer_norm_eps": 1e-12}}"#
    );
    // The JSON above is fixed and valid; a failure here would be a bug in this table.
    EncoderConfig::from_json_str(&json).ok()
}

/// Uniform in `[-a, a)` from the top 24 bits of the next draw.
fn uniform(rng: &mut SplitMix64, a: f32) -> f32 {
    let u = (rng.next() >> 40) as f32 / (1u64 << 24) as f32;
    (2.0 * u - 1.0) * a
}

fn uniform_vec(rng: &mut SplitMix64, n: usize, a: f32) -> Vec<f32> {
    (0..n).map(|_| uniform(rng, a)).collect()
}

impl EncoderWeights {
    /// Random weights for `cfg` (no pooler, no head): uniform values scaled as a trained
    /// BERT's are (embeddings and projections of standard deviation ~0.02 · sqrt(3) range,
    /// LayerNorm weights near 1), so activations stay in f16's range through every layer.
    /// The same `seed` gives the same weights everywhere.
    ///
    /// # Errors
    /// [`EngineError::Config`] when `cfg` does not validate.
    ///
    /// # Example
    /// ```
    /// use fl_engine::encoder::{presets, EncoderWeights};
    /// let cfg = presets::preset("bge-small").unwrap();
    /// let w = EncoderWeights::random(&cfg, 7)?;
    /// w.check(&cfg)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn random(cfg: &EncoderConfig, seed: u64) -> Result<Self> {
        cfg.validate()?;
        let mut rng = SplitMix64(seed);
        let h = cfg.hidden_size;
        let a = 0.02 * 3f32.sqrt();
        let mut dense = |out: usize, inp: usize| Dense {
            weight: uniform_vec(&mut rng, out * inp, a),
            bias: uniform_vec(&mut rng, out, a),
            out_features: out,
            in_features: inp,
        };
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for _ in 0..cfg.num_hidden_layers {
            layers.push(EncoderLayerWeights {
                query: dense(h, h),
                key: dense(h, h),
                value: dense(h, h),
                attn_out: dense(h, h),
                attn_norm: LayerNorm {
                    weight: vec![0.0; h],
                    bias: vec![0.0; h],
                },
                intermediate: dense(cfg.intermediate_size, h),
                output: dense(h, cfg.intermediate_size),
                output_norm: LayerNorm {
                    weight: vec![0.0; h],
                    bias: vec![0.0; h],
                },
            });
        }
        let norm = |rng: &mut SplitMix64| LayerNorm {
            weight: (0..h).map(|_| 1.0 + uniform(rng, 0.1)).collect(),
            bias: uniform_vec(rng, h, 0.05),
        };
        for l in &mut layers {
            l.attn_norm = norm(&mut rng);
            l.output_norm = norm(&mut rng);
        }
        let embeddings_norm = norm(&mut rng);
        Ok(EncoderWeights {
            word_embeddings: uniform_vec(&mut rng, cfg.vocab_size * h, a),
            position_embeddings: uniform_vec(&mut rng, cfg.max_position_embeddings * h, a),
            token_type_embeddings: uniform_vec(&mut rng, cfg.type_vocab_size * h, a),
            embeddings_norm,
            layers,
            pooler: None,
            head: None,
        })
    }
}

/// Benchmark sequence lengths for `batch` sequences of at most `max_len` tokens: the first is
/// `max_len` (so a padded framework pads to it), sequence `i >= 1` is
/// `ceil(max_len · (0.25 + 0.75 · frac(i · φ⁻¹)))` (a low-discrepancy spread, uniform over
/// 25-100 % of `max_len`, reproducible in any language). `ragged == false`: all `max_len`.
///
/// # Errors
/// [`EngineError::Invalid`] naming `max_len` (0) or `batch` (0).
///
/// # Example
/// ```
/// let l = fl_engine::encoder::presets::bench_lengths(4, 128, true)?;
/// assert_eq!(l, [128, 92, 55, 114]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn bench_lengths(batch: usize, max_len: usize, ragged: bool) -> Result<Vec<usize>> {
    if batch == 0 {
        return Err(EngineError::invalid("batch", "is 0; at least one sequence"));
    }
    if max_len == 0 {
        return Err(EngineError::invalid("max_len", "is 0; at least one token"));
    }
    const INV_PHI: f64 = 0.618_033_988_749_894_9;
    Ok((0..batch)
        .map(|i| {
            if i == 0 || !ragged {
                return max_len;
            }
            let f = (i as f64 * INV_PHI).fract();
            ((max_len as f64 * (0.25 + 0.75 * f)).ceil() as usize).clamp(1, max_len)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_validates_and_random_weights_check() {
        for name in PRESETS {
            let cfg = preset(name).unwrap();
            cfg.validate().unwrap();
            assert_eq!(cfg.hidden_size % cfg.num_attention_heads, 0, "{name}");
        }
        let cfg = preset("bge-small").unwrap();
        let a = EncoderWeights::random(&cfg, 1).unwrap();
        a.check(&cfg).unwrap();
        assert_eq!(a, EncoderWeights::random(&cfg, 1).unwrap());
        assert_ne!(
            a.layers[0].query,
            EncoderWeights::random(&cfg, 2).unwrap().layers[0].query
        );
    }

    #[test]
    fn bench_lengths_spread_over_a_quarter_to_all() {
        let l = bench_lengths(256, 128, true).unwrap();
        assert_eq!(l[0], 128);
        assert!(l.iter().all(|&x| (32..=128).contains(&x)), "{l:?}");
        let mean = l.iter().sum::<usize>() as f64 / l.len() as f64;
        assert!((mean - 80.0).abs() < 3.0, "mean {mean}");
        assert_eq!(bench_lengths(3, 9, false).unwrap(), [9, 9, 9]);
        assert!(bench_lengths(0, 9, true)
            .unwrap_err()
            .to_string()
            .contains("batch"));
        assert!(bench_lengths(2, 0, true)
            .unwrap_err()
            .to_string()
            .contains("max_len"));
    }
}
