//! A GGUF file as a model of the engine: [`ModelConfig`] from the metadata, GGUF tensor
//! names as the Hugging Face names the engine loads, and the Q/K row order.
//!
//! # Q/K row order
//! llama.cpp's converter (`LlamaModel.permute`, `conversion/llama.py`) reorders the rows of
//! `attn_q` and `attn_k` (weights and biases) of llama-architecture models (Mistral's
//! `MistralForCausalLM` is written as `llama` too) from the Hugging Face rotate-half order to
//! the interleaved (GPT-J) order that llama.cpp's `LLAMA_ROPE_TYPE_NORM` rotates: within each
//! head of `head_dim` rows, new row `2i + t` is old row `t * head_dim / 2 + i` (`t` in
//! {0, 1}); k uses the KV heads. This is exactly
//! [`fl_kernels::rope::rotate_half_to_interleaved_rows`]`(heads, head_dim, head_dim)`, the order the engine itself gives the q and k rows on the device so that RoPE runs in the
//! QKV GEMV's epilogue ([`crate::weights::qkv_row_order`]). So a llama GGUF's q/k rows are
//! already in device order: load them as they are and skip that permutation.
//! [`interleaved_to_rotate_half_rows`] gives the Hugging Face order back (for comparing with
//! a safetensors checkpoint). `qwen2` files are not permuted (llama.cpp rotates them NeoX
//! style) and load like safetensors. A permutation moves whole rows; a quantised row is whole
//! blocks (`ne[0]` is a multiple of the block size), so [`permute_rows`] works on the bytes
//! of any type.

use std::collections::HashSet;

use super::reader::{GgufFile, TensorInfo};
use super::tokenizer::TokenizerSpec;
use super::value::{Array, Value};
use super::{GgmlType, GgufError, Result};
use crate::config::{Architecture, ModelConfig, RopeScaling};

/// Llama 3.1's scaling parameters, the only ones llama.cpp's converter is seen with; a
/// `rope_freqs.weight` is accepted when it equals these factors for its `factor`.
const LLAMA3_LOW_FREQ_FACTOR: f64 = 1.0;
const LLAMA3_HIGH_FREQ_FACTOR: f64 = 4.0;
const LLAMA3_ORIGINAL_CONTEXT: usize = 8192;

/// Per-layer GGUF suffix -> Hugging Face suffix (under `model.layers.N.`).
const LAYER_NAMES: &[(&str, &str)] = &[
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
    ("attn_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
];

/// Global GGUF name -> Hugging Face name.
const GLOBAL_NAMES: &[(&str, &str)] = &[
    ("token_embd", "model.embed_tokens"),
    ("output_norm", "model.norm"),
    ("output", "lm_head"),
];

/// The Hugging Face name of a GGUF tensor (`blk.3.attn_q.weight` ->
/// `model.layers.3.self_attn.q_proj.weight`), or `None` for names the engine does not load
/// (`rope_freqs.weight`, ...).
///
/// ```
/// use fl_engine::gguf::model::hf_tensor_name;
/// assert_eq!(hf_tensor_name("blk.3.ffn_norm.weight").as_deref(),
///            Some("model.layers.3.post_attention_layernorm.weight"));
/// assert_eq!(hf_tensor_name("output.weight").as_deref(), Some("lm_head.weight"));
/// ```
pub fn hf_tensor_name(gguf: &str) -> Option<String> {
    let (base, kind) = gguf.rsplit_once('.')?;
    if kind != "weight" && kind != "bias" {
        return None;
    }
    if let Some(rest) = base.strip_prefix("blk.") {
        let (layer, suffix) = rest.split_once('.')?;
        let layer: usize = layer.parse().ok()?;
        let (_, hf) = LAYER_NAMES.iter().find(|(g, _)| *g == suffix)?;
        return Some(format!("model.layers.{layer}.{hf}.{kind}"));
    }
    let (_, hf) = GLOBAL_NAMES.iter().find(|(g, _)| *g == base)?;
    Some(format!("{hf}.{kind}"))
}

/// The GGUF name of a Hugging Face tensor name: the inverse of [`hf_tensor_name`].
///
/// ```
/// use fl_engine::gguf::model::gguf_tensor_name;
/// assert_eq!(gguf_tensor_name("model.layers.0.self_attn.o_proj.weight").as_deref(),
///            Some("blk.0.attn_output.weight"));
/// ```
pub fn gguf_tensor_name(hf: &str) -> Option<String> {
    let (base, kind) = hf.rsplit_once('.')?;
    if kind != "weight" && kind != "bias" {
        return None;
    }
    if let Some(rest) = base.strip_prefix("model.layers.") {
        let (layer, suffix) = rest.split_once('.')?;
        let layer: usize = layer.parse().ok()?;
        let (g, _) = LAYER_NAMES.iter().find(|(_, h)| *h == suffix)?;
        return Some(format!("blk.{layer}.{g}.{kind}"));
    }
    let (g, _) = GLOBAL_NAMES.iter().find(|(_, h)| *h == base)?;
    Some(format!("{g}.{kind}"))
}

/// The row order of llama.cpp's converter for one q or k weight of `heads` heads: new row
/// `r` is Hugging Face row `order[r]` (rotate-half -> interleaved). Equal to
/// [`fl_kernels::rope::rotate_half_to_interleaved_rows`]`(heads, head_dim, head_dim)`.
///
/// # Errors
/// [`GgufError::Invalid`] naming `head_dim` when it is 0 or odd.
///
/// ```
/// use fl_engine::gguf::model::rotate_half_to_interleaved_rows;
/// assert_eq!(rotate_half_to_interleaved_rows(1, 4)?, vec![0, 2, 1, 3]);
/// # Ok::<(), fl_engine::gguf::GgufError>(())
/// ```
pub fn rotate_half_to_interleaved_rows(heads: usize, head_dim: usize) -> Result<Vec<usize>> {
    if head_dim == 0 || head_dim % 2 != 0 {
        return Err(GgufError::Invalid {
            key: "head_dim".into(),
            value: head_dim.to_string(),
            reason: "must be even and > 0 (RoPE pairs)".into(),
        });
    }
    let half = head_dim / 2;
    Ok((0..heads)
        .flat_map(|h| (0..head_dim).map(move |r| h * head_dim + (r % 2) * half + r / 2))
        .collect())
}

/// The inverse of [`rotate_half_to_interleaved_rows`]: new row `r` (Hugging Face order) is
/// row `order[r]` of a llama GGUF q or k weight.
///
/// # Errors
/// As [`rotate_half_to_interleaved_rows`].
///
/// ```
/// use fl_engine::gguf::model::interleaved_to_rotate_half_rows;
/// assert_eq!(interleaved_to_rotate_half_rows(1, 4)?, vec![0, 2, 1, 3]);
/// assert_eq!(interleaved_to_rotate_half_rows(1, 6)?, vec![0, 2, 4, 1, 3, 5]);
/// # Ok::<(), fl_engine::gguf::GgufError>(())
/// ```
pub fn interleaved_to_rotate_half_rows(heads: usize, head_dim: usize) -> Result<Vec<usize>> {
    let fwd = rotate_half_to_interleaved_rows(heads, head_dim)?;
    let mut inv = vec![0; fwd.len()];
    for (new, &old) in fwd.iter().enumerate() {
        inv[old] = new;
    }
    Ok(inv)
}

/// `data` (rows of `row_bytes` bytes, row-major) with its rows reordered: row `i` of the
/// result is row `order[i]` of `data`. For a quantised tensor `row_bytes` is
/// [`TensorInfo::row_bytes`] (whole blocks).
///
/// # Errors
/// [`GgufError::BadShape`] naming `data` when it is not `order.len()` rows of `row_bytes`, or
/// when `order` is not a permutation.
pub fn permute_rows(data: &[u8], row_bytes: usize, order: &[usize]) -> Result<Vec<u8>> {
    let bad = |reason: String| GgufError::BadShape {
        tensor: "data".into(),
        reason,
    };
    if order.len().checked_mul(row_bytes) != Some(data.len()) {
        return Err(bad(format!(
            "{} bytes are not {} rows of {row_bytes} bytes",
            data.len(),
            order.len()
        )));
    }
    let mut seen = vec![false; order.len()];
    for &r in order {
        if r >= order.len() || std::mem::replace(&mut seen[r], true) {
            return Err(bad(format!("row order {order:?} is not a permutation")));
        }
    }
    let mut out = Vec::with_capacity(data.len());
    for &r in order {
        out.extend_from_slice(&data[r * row_bytes..(r + 1) * row_bytes]);
    }
    Ok(out)
}

/// Typed access to the metadata of one architecture (`{arch}.key`).
struct Keys<'a> {
    file: &'a GgufFile,
    arch: &'a str,
}

impl Keys<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        match self.file.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| GgufError::WrongType {
                key: key.to_string(),
                expected: "a non-negative integer",
                found: v.type_name(),
            }),
        }
    }

    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.opt_u64(key)? {
            None => Ok(None),
            Some(x) => usize::try_from(x)
                .map(Some)
                .map_err(|_| GgufError::Invalid {
                    key: key.to_string(),
                    value: x.to_string(),
                    reason: "too large".into(),
                }),
        }
    }

    fn arch_usize(&self, k: &str) -> Result<usize> {
        let key = self.key(k);
        self.opt_usize(&key)?.ok_or(GgufError::MissingKey { key })
    }

    fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.file.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| GgufError::WrongType {
                key: key.to_string(),
                expected: "a number",
                found: v.type_name(),
            }),
        }
    }

    fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        match self.file.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| GgufError::WrongType {
                key: key.to_string(),
                expected: "a string",
                found: v.type_name(),
            }),
        }
    }

    fn token_id(&self, key: &str) -> Result<Option<u32>> {
        match self.opt_u64(key)? {
            None => Ok(None),
            Some(x) => u32::try_from(x).map(Some).map_err(|_| GgufError::Invalid {
                key: key.to_string(),
                value: x.to_string(),
                reason: "not a token id".into(),
            }),
        }
    }
}

impl GgufFile {
    /// `general.architecture`.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`] / [`GgufError::WrongType`] naming it.
    pub fn architecture(&self) -> Result<&str> {
        let key = "general.architecture";
        match self.get(key) {
            None => Err(GgufError::MissingKey { key: key.into() }),
            Some(v) => v.as_str().ok_or_else(|| GgufError::WrongType {
                key: key.into(),
                expected: "a string",
                found: v.type_name(),
            }),
        }
    }

    /// Whether the q and k rows are stored in llama.cpp's interleaved order (the `llama`
    /// architecture; see the [module docs](self)).
    ///
    /// # Errors
    /// As [`GgufFile::architecture`].
    pub fn qk_rows_interleaved(&self) -> Result<bool> {
        Ok(self.architecture()? == "llama")
    }

    /// The model configuration from the metadata, checked against the tensors.
    ///
    /// | field | from |
    /// |---|---|
    /// | architecture | `general.architecture`: `llama` (Llama, Mistral), `qwen2` |
    /// | hidden_size | `{arch}.embedding_length` |
    /// | intermediate_size | `{arch}.feed_forward_length` |
    /// | num_hidden_layers | `{arch}.block_count` |
    /// | num_attention_heads / num_key_value_heads | `{arch}.attention.head_count` / `head_count_kv` (default: head_count) |
    /// | head_dim | `{arch}.attention.key_length` (default hidden / heads); `rope.dimension_count` must equal it |
    /// | vocab_size | rows of `token_embd.weight` (`{arch}.vocab_size` and the token list must agree) |
    /// | max_position_embeddings | `{arch}.context_length` |
    /// | rms_norm_eps | `{arch}.attention.layer_norm_rms_epsilon` |
    /// | rope_theta | `{arch}.rope.freq_base` (default 10000) |
    /// | rope_scaling | `{arch}.rope.scaling.type` linear + `.factor`; `rope_freqs.weight` -> `Llama3` |
    /// | biases | presence of `blk.0.attn_q.bias`, `attn_output.bias`, `ffn_up.bias` |
    /// | tie_word_embeddings | `output.weight` absent |
    /// | bos / eos | `tokenizer.ggml.bos_token_id`; `eos_token_id`, `eot_token_id`, `eom_token_id` |
    ///
    /// `rope_freqs.weight` (how llama.cpp stores Llama 3.1 scaling: one f32 factor per
    /// frequency) becomes [`RopeScaling::Llama3`] with the `factor` its longest-wavelength
    /// entry implies, low/high frequency factors 1 and 4 and 8192 original positions (or
    /// `{arch}.rope.scaling.original_context_length`) when the tensor equals those factors;
    /// any other table is [`GgufError::Unsupported`] naming it.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`] naming a required key, [`GgufError::WrongType`],
    /// [`GgufError::Unsupported`] (architecture, RoPE scaling type, partial rotary, per-layer
    /// sizes), [`GgufError::MissingTensor`] / [`GgufError::TensorMismatch`] for a tensor
    /// absent or shaped unlike the config, [`GgufError::Config`] when the result fails
    /// [`ModelConfig::validate`].
    pub fn model_config(&self) -> Result<ModelConfig> {
        let arch_name = self.architecture()?;
        let architecture = match arch_name {
            // llama.cpp writes Mistral models as `llama` (full attention, as it runs them);
            // it has no `mistral` architecture.
            "llama" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            other => {
                return Err(GgufError::Unsupported {
                    what: "general.architecture".into(),
                    reason: format!("`{other}` (supported: llama, qwen2)"),
                })
            }
        };
        let k = Keys {
            file: self,
            arch: arch_name,
        };
        let ff_key = k.key("feed_forward_length");
        if let Some(Value::Array(_)) = self.get(&ff_key) {
            return Err(GgufError::Unsupported {
                what: ff_key,
                reason: "per-layer MLP widths are not implemented".into(),
            });
        }
        let hidden_size = k.arch_usize("embedding_length")?;
        let intermediate_size = k.arch_usize("feed_forward_length")?;
        let num_hidden_layers = k.arch_usize("block_count")?;
        let heads = k.arch_usize("attention.head_count")?;
        let kv_heads = k
            .opt_usize(&k.key("attention.head_count_kv"))?
            .unwrap_or(heads);
        let head_dim = match k.opt_usize(&k.key("attention.key_length"))? {
            Some(d) => d,
            None if heads > 0 && hidden_size % heads == 0 => hidden_size / heads,
            None => {
                return Err(GgufError::Invalid {
                    key: k.key("embedding_length"),
                    value: hidden_size.to_string(),
                    reason: format!(
                    "no attention.key_length and not divisible by attention.head_count ({heads})"
                ),
                })
            }
        };
        let vkey = k.key("attention.value_length");
        if let Some(v) = k.opt_usize(&vkey)?.filter(|&v| v != head_dim) {
            return Err(GgufError::Unsupported {
                what: vkey,
                reason: format!("value heads of {v} differ from key heads of {head_dim}"),
            });
        }
        let rkey = k.key("rope.dimension_count");
        if let Some(r) = k.opt_usize(&rkey)?.filter(|&r| r != head_dim) {
            return Err(GgufError::Unsupported {
                what: rkey,
                reason: format!("partial RoPE ({r} of {head_dim} dims) is not implemented"),
            });
        }
        let eps_key = k.key("attention.layer_norm_rms_epsilon");
        let rms_norm_eps = k
            .opt_f64(&eps_key)?
            .ok_or(GgufError::MissingKey { key: eps_key })?;
        let rope_theta = k.opt_f64(&k.key("rope.freq_base"))?.unwrap_or(10_000.0);

        let embd = self.tensor("token_embd.weight")?;
        let vocab_size = match embd.shape().as_slice() {
            [v, h] if *h == hidden_size as u64 => *v as usize,
            s => {
                return Err(GgufError::TensorMismatch {
                    tensor: embd.name.clone(),
                    reason: format!("shape {s:?}, expected [vocab, {hidden_size}]"),
                })
            }
        };
        let vkey = k.key("vocab_size");
        if let Some(v) = k.opt_usize(&vkey)?.filter(|&v| v != vocab_size) {
            return Err(GgufError::Invalid {
                key: vkey,
                value: v.to_string(),
                reason: format!("token_embd.weight has {vocab_size} rows"),
            });
        }
        if let Some(Value::Array(tokens)) = self.get("tokenizer.ggml.tokens") {
            if tokens.len() > vocab_size {
                return Err(GgufError::Invalid {
                    key: "tokenizer.ggml.tokens".into(),
                    value: format!("{} tokens", tokens.len()),
                    reason: format!("token_embd.weight has only {vocab_size} rows"),
                });
            }
        }

        let rope_scaling = self.rope_scaling(&k, rope_theta, head_dim)?;

        let has = |n: &str| self.find_tensor(n).is_some();
        let qkv_bias = has("blk.0.attn_q.bias");
        let o_bias = has("blk.0.attn_output.bias");
        let mlp_bias = has("blk.0.ffn_up.bias");
        match architecture {
            Architecture::Llama if qkv_bias != o_bias => {
                return Err(GgufError::Unsupported {
                    what: "blk.0.attn_q.bias".into(),
                    reason: format!(
                        "{arch_name}: q/k/v biases ({qkv_bias}) and output bias ({o_bias}) must come together"
                    ),
                })
            }
            Architecture::Qwen2 if !qkv_bias || o_bias => {
                return Err(GgufError::Unsupported {
                    what: "blk.0.attn_q.bias".into(),
                    reason: "qwen2 has q/k/v biases and no output bias".into(),
                })
            }
            _ => {}
        }
        if mlp_bias && architecture != Architecture::Llama {
            return Err(GgufError::Unsupported {
                what: "blk.0.ffn_up.bias".into(),
                reason: "only llama models have MLP biases".into(),
            });
        }

        let bos_token_id = k.token_id("tokenizer.ggml.bos_token_id")?;
        let mut eos_token_ids = Vec::new();
        for key in [
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
        ] {
            if let Some(id) = k.token_id(key)? {
                if !eos_token_ids.contains(&id) {
                    eos_token_ids.push(id);
                }
            }
        }

        let cfg = ModelConfig {
            architecture,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            vocab_size,
            max_position_embeddings: k.arch_usize("context_length")?,
            rms_norm_eps,
            rope_theta,
            rope_scaling,
            qkv_bias,
            o_bias,
            mlp_bias,
            tie_word_embeddings: !has("output.weight"),
            bos_token_id,
            eos_token_ids,
            sliding_window: None,
            dtype: None,
        };
        cfg.validate()?;
        self.check_tensors(&cfg)?;
        Ok(cfg)
    }

    fn rope_scaling(&self, k: &Keys<'_>, theta: f64, head_dim: usize) -> Result<RopeScaling> {
        let tkey = k.key("rope.scaling.type");
        let scaling = match k.opt_str(&tkey)? {
            None | Some("none") => RopeScaling::None,
            Some("linear") => {
                let fkey = k.key("rope.scaling.factor");
                let factor = k
                    .opt_f64(&fkey)?
                    .ok_or(GgufError::MissingKey { key: fkey.clone() })?;
                if !(factor.is_finite() && factor > 0.0) {
                    return Err(GgufError::Invalid {
                        key: fkey,
                        value: factor.to_string(),
                        reason: "must be finite and > 0".into(),
                    });
                }
                RopeScaling::Linear { factor }
            }
            Some(other) => {
                return Err(GgufError::Unsupported {
                    what: tkey,
                    reason: format!("RoPE scaling `{other}` (supported: none, linear)"),
                })
            }
        };
        let Some(t) = self.find_tensor("rope_freqs.weight") else {
            return Ok(scaling);
        };
        let unsupported = |reason: String| GgufError::Unsupported {
            what: "rope_freqs.weight".into(),
            reason,
        };
        if scaling != RopeScaling::None {
            return Err(unsupported(format!("together with {tkey}")));
        }
        if t.ggml_type != GgmlType::F32 || t.n_elements() != head_dim as u64 / 2 {
            return Err(unsupported(format!(
                "{} of {:?}, expected f32 of [{}]",
                t.ggml_type,
                t.shape(),
                head_dim / 2
            )));
        }
        let factors: Vec<f32> = self
            .tensor_data(t)?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let orig = k
            .opt_usize(&k.key("rope.scaling.original_context_length"))?
            .unwrap_or(LLAMA3_ORIGINAL_CONTEXT);
        // The longest wavelength carries `factor` itself (or, inside the blend band, a
        // value that gives it back); every other entry is then checked against it.
        let Some(factor) = llama3_factor(&factors, theta, head_dim, orig) else {
            return Err(unsupported(format!(
                "factors {factors:?} do not give a Llama 3.1 scaling factor"
            )));
        };
        if let Some(i) = llama3_factor_mismatch(&factors, factor, theta, head_dim, orig) {
            return Err(unsupported(format!(
                "factor {i} is {}, not Llama 3.1 scaling (factor {factor}, low 1, high 4, \
                 original context {orig})",
                factors[i]
            )));
        }
        let llama3 = RopeScaling::Llama3 {
            factor,
            low_freq_factor: LLAMA3_LOW_FREQ_FACTOR,
            high_freq_factor: LLAMA3_HIGH_FREQ_FACTOR,
            original_max_position_embeddings: orig,
        };
        Ok(llama3)
    }

    /// Checks every tensor the engine loads against `cfg`: present, and of the row-major
    /// shape `[out, in]` (vectors `[n]`).
    ///
    /// # Errors
    /// [`GgufError::MissingTensor`] / [`GgufError::TensorMismatch`] naming the tensor.
    pub fn check_tensors(&self, cfg: &ModelConfig) -> Result<()> {
        let h = cfg.hidden_size as u64;
        let (q, kv, i) = (
            cfg.q_size() as u64,
            cfg.kv_size() as u64,
            cfg.intermediate_size as u64,
        );
        let v = cfg.vocab_size as u64;
        let mut want: Vec<(String, Vec<u64>)> = vec![
            ("token_embd.weight".into(), vec![v, h]),
            ("output_norm.weight".into(), vec![h]),
        ];
        if !cfg.tie_word_embeddings {
            want.push(("output.weight".into(), vec![v, h]));
        }
        for l in 0..cfg.num_hidden_layers {
            let mut w = |s: &str, shape: Vec<u64>| want.push((format!("blk.{l}.{s}"), shape));
            w("attn_norm.weight", vec![h]);
            w("ffn_norm.weight", vec![h]);
            w("attn_q.weight", vec![q, h]);
            w("attn_k.weight", vec![kv, h]);
            w("attn_v.weight", vec![kv, h]);
            w("attn_output.weight", vec![h, q]);
            w("ffn_gate.weight", vec![i, h]);
            w("ffn_up.weight", vec![i, h]);
            w("ffn_down.weight", vec![h, i]);
            if cfg.qkv_bias {
                w("attn_q.bias", vec![q]);
                w("attn_k.bias", vec![kv]);
                w("attn_v.bias", vec![kv]);
            }
            if cfg.o_bias {
                w("attn_output.bias", vec![h]);
            }
            if cfg.mlp_bias {
                w("ffn_gate.bias", vec![i]);
                w("ffn_up.bias", vec![i]);
                w("ffn_down.bias", vec![h]);
            }
        }
        let expected: HashSet<&str> = want.iter().map(|(n, _)| n.as_str()).collect();
        for (name, shape) in &want {
            let t = self.tensor(name)?;
            if &t.shape() != shape {
                return Err(GgufError::TensorMismatch {
                    tensor: name.clone(),
                    reason: format!("shape {:?}, expected {shape:?}", t.shape()),
                });
            }
        }
        // A bias or layer the config does not expect means the metadata and tensors disagree.
        for t in self.tensors() {
            if hf_tensor_name(&t.name).is_some() && !expected.contains(t.name.as_str()) {
                return Err(GgufError::TensorMismatch {
                    tensor: t.name.clone(),
                    reason: "not expected by the config (extra layer or bias)".into(),
                });
            }
        }
        Ok(())
    }

    /// The tensor named by its Hugging Face name, with its GGUF info.
    ///
    /// # Errors
    /// [`GgufError::MissingTensor`] naming the GGUF (or, if unmapped, the given) name.
    pub fn hf_tensor(&self, hf: &str) -> Result<&TensorInfo> {
        match gguf_tensor_name(hf) {
            Some(g) => self.tensor(&g),
            None => Err(GgufError::MissingTensor {
                tensor: hf.to_string(),
            }),
        }
    }

    /// The token list (`tokenizer.ggml.tokens`), if present.
    pub fn tokens(&self) -> Option<&[String]> {
        match self.get("tokenizer.ggml.tokens")? {
            Value::Array(Array::String(v)) => Some(v),
            _ => None,
        }
    }
}

/// The Llama 3.1 `factor` that the last (longest-wavelength) entry of `factors` implies,
/// or `None` when it implies none (not finite, below 1, or in the unscaled band).
fn llama3_factor(factors: &[f32], theta: f64, head_dim: usize, orig: usize) -> Option<f64> {
    let (low, high) = (LLAMA3_LOW_FREQ_FACTOR, LLAMA3_HIGH_FREQ_FACTOR);
    let i = factors.len().checked_sub(1)?;
    let f = f64::from(factors[i]);
    let inv_freq = 1.0 / theta.powf((2 * i) as f64 / head_dim as f64);
    let wavelen = 2.0 * std::f64::consts::PI / inv_freq;
    let old = orig as f64;
    let factor = if wavelen > old / low {
        f
    } else if wavelen >= old / high {
        let smooth = (old / wavelen - low) / (high - low);
        (1.0 - smooth) / (1.0 / f - smooth)
    } else {
        return None;
    };
    // The f32 table gives the factor back to ~1e-6; Llama's factors (8, 32) are integers.
    let factor = if (factor - factor.round()).abs() < 1e-4 * factor {
        factor.round()
    } else {
        factor
    };
    (factor.is_finite() && factor >= 1.0).then_some(factor)
}

/// The index of the first factor that differs from Llama 3.1 scaling (`factor`, low/high
/// frequency factors 1 and 4, `orig` positions) by more than a relative 1e-4 (the converter
/// computes in f32), or `None` when all agree. The factor of frequency `i` is
/// `base_inv_freq[i] / scaled_inv_freq[i]`, as `LlamaModel.generate_extra_tensors` writes it.
pub(crate) fn llama3_factor_mismatch(
    factors: &[f32],
    factor: f64,
    theta: f64,
    head_dim: usize,
    orig: usize,
) -> Option<usize> {
    let (low, high) = (LLAMA3_LOW_FREQ_FACTOR, LLAMA3_HIGH_FREQ_FACTOR);
    let old = orig as f64;
    let d = head_dim as f64;
    (0..factors.len()).find(|&i| {
        let inv_freq = 1.0 / theta.powf((2 * i) as f64 / d);
        let wavelen = 2.0 * std::f64::consts::PI / inv_freq;
        let want = if wavelen < old / high {
            1.0
        } else if wavelen > old / low {
            factor
        } else {
            let smooth = (old / wavelen - low) / (high - low);
            1.0 / ((1.0 - smooth) / factor + smooth)
        };
        let err = (f64::from(factors[i]) - want).abs();
        // NaN counts as a mismatch.
        err.is_nan() || err > 1e-4 * want
    })
}

impl GgufFile {
    /// The `tokenizer.*` metadata as a [`TokenizerSpec`] for
    /// [`super::tokenizer::build`]; each key the file lacks is `None` (an absent
    /// `tokenizer.ggml.model` or token list is empty and fails there, naming it).
    ///
    /// # Errors
    /// [`GgufError::WrongType`] naming a key of the wrong type (token types may be any
    /// integer type, scores f32 or f64).
    pub fn tokenizer_spec(&self) -> Result<TokenizerSpec> {
        let wrong = |key: &str, expected: &'static str, v: &Value| GgufError::WrongType {
            key: key.to_string(),
            expected,
            found: v.type_name(),
        };
        let string = |key: &str| -> Result<Option<String>> {
            match self.get(key) {
                None => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(v) => Err(wrong(key, "a string", v)),
            }
        };
        let strings = |key: &str| -> Result<Option<Vec<String>>> {
            match self.get(key) {
                None => Ok(None),
                Some(Value::Array(Array::String(v))) => Ok(Some(v.clone())),
                Some(v) => Err(wrong(key, "an array of strings", v)),
            }
        };
        let flag = |key: &str| -> Result<Option<bool>> {
            match self.get(key) {
                None => Ok(None),
                Some(v) => v.as_bool().map(Some).ok_or_else(|| wrong(key, "a bool", v)),
            }
        };
        let id = |key: &str| -> Result<Option<u32>> {
            match self.get(key) {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .map(Some)
                    .ok_or_else(|| wrong(key, "a token id", v)),
            }
        };
        let key = "tokenizer.ggml.scores";
        let scores = match self.get(key) {
            None => None,
            Some(Value::Array(Array::F32(v))) => Some(v.clone()),
            Some(Value::Array(Array::F64(v))) => Some(v.iter().map(|&x| x as f32).collect()),
            Some(v) => return Err(wrong(key, "an array of f32", v)),
        };
        let key = "tokenizer.ggml.token_type";
        let token_types = match self.get(key) {
            None => None,
            Some(Value::Array(a)) => {
                let ints: Option<Vec<i32>> = (0..a.len())
                    .map(|i| match a.get(i)? {
                        Value::U8(x) => Some(i32::from(x)),
                        Value::I8(x) => Some(i32::from(x)),
                        Value::U16(x) => Some(i32::from(x)),
                        Value::I16(x) => Some(i32::from(x)),
                        Value::U32(x) => i32::try_from(x).ok(),
                        Value::I32(x) => Some(x),
                        Value::U64(x) => i32::try_from(x).ok(),
                        Value::I64(x) => i32::try_from(x).ok(),
                        _ => None,
                    })
                    .collect();
                Some(ints.ok_or_else(|| GgufError::WrongType {
                    key: key.to_string(),
                    expected: "an array of integers in i32",
                    found: format!("array of {}", a.element_type().name()),
                })?)
            }
            Some(v) => return Err(wrong(key, "an array of i32", v)),
        };
        Ok(TokenizerSpec {
            model: string("tokenizer.ggml.model")?.unwrap_or_default(),
            pre: string("tokenizer.ggml.pre")?,
            tokens: strings("tokenizer.ggml.tokens")?.unwrap_or_default(),
            scores,
            token_types,
            merges: strings("tokenizer.ggml.merges")?,
            bos_id: id("tokenizer.ggml.bos_token_id")?,
            eos_id: id("tokenizer.ggml.eos_token_id")?,
            eot_id: id("tokenizer.ggml.eot_token_id")?,
            unk_id: id("tokenizer.ggml.unknown_token_id")?,
            pad_id: id("tokenizer.ggml.padding_token_id")?,
            add_bos: flag("tokenizer.ggml.add_bos_token")?,
            add_eos: flag("tokenizer.ggml.add_eos_token")?,
            add_space_prefix: flag("tokenizer.ggml.add_space_prefix")?,
            chat_template: string("tokenizer.chat_template")?,
        })
    }
}
