//! Named model configurations, for runs without a checkpoint (benchmarks, random weights,
//! tests).
//!
//! The values match the published `config.json` of each model; `tiny` is a small model for
//! tests (2 layers, grouped-query attention 2:1, `head_dim` 64, the smallest size the
//! attention kernels run).

use crate::config::{Architecture, ConfigDtype, ModelConfig, RopeScaling};

/// A preset name that is not one of [`preset_names`]. Its message lists the known names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown model preset `{name}` (known: {})", preset_names().join(", "))]
pub struct UnknownPreset {
    /// The name asked for.
    pub name: String,
}

/// The names [`preset`] knows, in a fixed order.
pub fn preset_names() -> &'static [&'static str] {
    &[
        "llama-2-7b",
        "llama-2-13b",
        "llama-2-70b",
        "llama-3-8b",
        "llama-3.1-8b",
        "llama-3-70b",
        "tiny",
    ]
}

fn llama2(hidden: usize, inter: usize, layers: usize, heads: usize) -> ModelConfig {
    ModelConfig {
        architecture: Architecture::Llama,
        hidden_size: hidden,
        intermediate_size: inter,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: heads,
        head_dim: hidden / heads,
        vocab_size: 32_000,
        max_position_embeddings: 4096,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        rope_scaling: RopeScaling::None,
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        tie_word_embeddings: false,
        bos_token_id: Some(1),
        eos_token_ids: vec![2],
        sliding_window: None,
        dtype: Some(ConfigDtype::F16),
    }
}

/// The configuration called `name` (one of [`preset_names`]).
///
/// # Errors
/// [`UnknownPreset`] (listing the known names) for any other name.
///
/// # Example
/// ```
/// let cfg = fl_engine::presets::preset("llama-3-8b")?;
/// assert_eq!(cfg.group_size(), 4);
/// assert!(fl_engine::presets::preset("llama-9").is_err());
/// # Ok::<(), fl_engine::presets::UnknownPreset>(())
/// ```
pub fn preset(name: &str) -> Result<ModelConfig, UnknownPreset> {
    Ok(match name {
        "llama-2-7b" => llama2(4096, 11_008, 32, 32),
        "llama-2-13b" => llama2(5120, 13_824, 40, 40),
        // 64 query heads over 8 key/value heads (GQA); 140 GB in f16: `--tp` or `--quant`.
        "llama-2-70b" => ModelConfig {
            num_key_value_heads: 8,
            ..llama2(8192, 28_672, 80, 64)
        },
        "llama-3-8b" => ModelConfig {
            intermediate_size: 14_336,
            num_key_value_heads: 8,
            vocab_size: 128_256,
            max_position_embeddings: 8192,
            rope_theta: 500_000.0,
            bos_token_id: Some(128_000),
            eos_token_ids: vec![128_001],
            dtype: Some(ConfigDtype::BF16),
            ..llama2(4096, 14_336, 32, 32)
        },
        // Llama 3's weights shapes with the 128k context of 3.1 (its RoPE scaling).
        "llama-3.1-8b" => ModelConfig {
            max_position_embeddings: 131_072,
            rope_scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192,
            },
            eos_token_ids: vec![128_001, 128_008, 128_009],
            ..preset("llama-3-8b")?
        },
        "llama-3-70b" => ModelConfig {
            hidden_size: 8192,
            intermediate_size: 28_672,
            num_hidden_layers: 80,
            num_attention_heads: 64,
            num_key_value_heads: 8,
            head_dim: 128,
            ..preset("llama-3-8b")?
        },
        "tiny" => ModelConfig {
            num_key_value_heads: 1,
            vocab_size: 256,
            max_position_embeddings: 256,
            dtype: Some(ConfigDtype::F32),
            ..llama2(128, 352, 2, 2)
        },
        _ => {
            return Err(UnknownPreset {
                name: name.to_string(),
            })
        }
    })
}
