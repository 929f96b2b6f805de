//! Model configuration read from a Hugging Face `config.json`.
//!
//! Both dialects that users have load (see DESIGN.md, "Model configs as users have them"):
//!
//! * the Hub form: `rope_theta` at the top level, `rope_scaling` holding `rope_type` (or the
//!   older `type`) = `llama3` | `linear` | `default`, and `torch_dtype`;
//! * the transformers-5 form: `rope_parameters` holding `rope_theta` and the scaling fields,
//!   and `dtype`.
//!
//! Architectures: `llama`, `mistral` and `qwen2` (dispatch on `model_type`, else on
//! `architectures`). A field or value we do not support is a [`ConfigError`] that names it;
//! fields that do not change the computation (`attention_dropout`, `initializer_range`,
//! `use_cache`, `pretraining_tp`, ...) are ignored.

use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// Why a `config.json` could not be turned into a [`ModelConfig`]. Every variant names the
/// field (or file) at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read model config {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The text is not JSON, or its top level is not an object.
    #[error("model config is not a JSON object: {detail}")]
    Json {
        /// What the parser said.
        detail: String,
    },
    /// A required field is absent (or null).
    #[error("model config: missing required field `{field}`")]
    MissingField {
        /// The field.
        field: String,
    },
    /// A field has the wrong JSON type.
    #[error("model config: field `{field}` must be {expected}, found {found}")]
    WrongType {
        /// The field.
        field: String,
        /// What was expected ("a non-negative integer", ...).
        expected: &'static str,
        /// The value found, as JSON.
        found: String,
    },
    /// `model_type` / `architectures` name a model family we do not run.
    #[error(
        "model config: unsupported architecture `{name}` in `{field}` (supported: llama, mistral, qwen2)"
    )]
    UnsupportedArchitecture {
        /// `model_type` or `architectures`.
        field: String,
        /// The name found.
        name: String,
    },
    /// A RoPE scaling type we do not implement (`yarn`, `dynamic`, `longrope`, ...).
    #[error(
        "model config: unsupported RoPE scaling type `{rope_type}` in `{field}` (supported: default, linear, llama3)"
    )]
    UnsupportedRopeType {
        /// The field holding the type (`rope_scaling.rope_type`, ...).
        field: String,
        /// The type found.
        rope_type: String,
    },
    /// An option whose value changes the model in a way we do not implement.
    #[error("model config: unsupported option `{field}` = {value}: {reason}")]
    UnsupportedOption {
        /// The field.
        field: String,
        /// Its value, as JSON.
        value: String,
        /// Why it is not supported.
        reason: &'static str,
    },
    /// A value that is well-typed but impossible (zero size, heads not divisible, ...).
    #[error("model config: invalid `{field}` = {value}: {reason}")]
    Invalid {
        /// The field.
        field: String,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: String,
    },
}

/// Shorthand for results in this module.
pub type Result<T, E = ConfigError> = std::result::Result<T, E>;

/// The model family; decides bias defaults and the accepted options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Architecture {
    /// `LlamaForCausalLM` (Llama 1/2/3, and look-alikes).
    Llama,
    /// `MistralForCausalLM` (optionally sliding-window attention).
    Mistral,
    /// `Qwen2ForCausalLM` (bias on the q/k/v projections).
    Qwen2,
}

impl Architecture {
    /// The `model_type` string of this family.
    pub fn model_type(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Mistral => "mistral",
            Architecture::Qwen2 => "qwen2",
        }
    }

    fn from_model_type(s: &str) -> Option<Self> {
        match s {
            "llama" => Some(Architecture::Llama),
            "mistral" => Some(Architecture::Mistral),
            "qwen2" => Some(Architecture::Qwen2),
            _ => None,
        }
    }

    fn from_class(s: &str) -> Option<Self> {
        match s {
            "LlamaForCausalLM" => Some(Architecture::Llama),
            "MistralForCausalLM" => Some(Architecture::Mistral),
            "Qwen2ForCausalLM" => Some(Architecture::Qwen2),
            _ => None,
        }
    }
}

impl fmt::Display for Architecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.model_type())
    }
}

/// RoPE frequency scaling, as `rope_scaling` / `rope_parameters` describe it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE (`rope_type` absent, null or `default`).
    None,
    /// Position interpolation: every frequency divided by `factor`.
    Linear {
        /// Divisor of every frequency (> 0).
        factor: f64,
    },
    /// Llama 3.1 scaling: long wavelengths divided by `factor`, short ones kept, a smooth
    /// blend between `low_freq_factor` and `high_freq_factor`.
    Llama3 {
        /// Divisor of the low frequencies (> 0).
        factor: f64,
        /// Wavelengths longer than `original_max_position_embeddings / low_freq_factor` are
        /// fully scaled.
        low_freq_factor: f64,
        /// Wavelengths shorter than `original_max_position_embeddings / high_freq_factor`
        /// are kept (> `low_freq_factor`).
        high_freq_factor: f64,
        /// The context length the model was trained at before the extension.
        original_max_position_embeddings: usize,
    },
}

/// The storage type named by `torch_dtype` / `dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConfigDtype {
    /// `float32`.
    F32,
    /// `float16`.
    F16,
    /// `bfloat16`.
    BF16,
}

impl ConfigDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            ConfigDtype::F32 => 4,
            ConfigDtype::F16 | ConfigDtype::BF16 => 2,
        }
    }
}

/// A validated LLaMA-family model configuration.
///
/// Build it with [`ModelConfig::from_json_str`], [`ModelConfig::from_file`],
/// [`ModelConfig::from_model_dir`], or take a preset from [`crate::presets`]. Every
/// constructor that parses also runs [`ModelConfig::validate`]; code that builds a value by
/// hand should call it too.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Model family.
    pub architecture: Architecture,
    /// Width of the residual stream (`hidden_size`).
    pub hidden_size: usize,
    /// Width of the MLP (`intermediate_size`).
    pub intermediate_size: usize,
    /// Number of decoder layers (`num_hidden_layers`).
    pub num_hidden_layers: usize,
    /// Query heads (`num_attention_heads`).
    pub num_attention_heads: usize,
    /// Key/value heads (`num_key_value_heads`; defaults to the query heads).
    pub num_key_value_heads: usize,
    /// Per-head width (`head_dim`; defaults to `hidden_size / num_attention_heads`).
    pub head_dim: usize,
    /// Vocabulary size (`vocab_size`).
    pub vocab_size: usize,
    /// Longest context the model supports (`max_position_embeddings`).
    pub max_position_embeddings: usize,
    /// RMSNorm epsilon (`rms_norm_eps`).
    pub rms_norm_eps: f64,
    /// RoPE base (`rope_theta`, top level or in `rope_parameters`; default 10000).
    pub rope_theta: f64,
    /// RoPE scaling.
    pub rope_scaling: RopeScaling,
    /// Bias on the q, k and v projections (Llama/Mistral: `attention_bias`; Qwen2: always).
    pub qkv_bias: bool,
    /// Bias on the output projection (Llama: `attention_bias`; Qwen2/Mistral: never).
    pub o_bias: bool,
    /// Bias on the gate/up/down projections (`mlp_bias`).
    pub mlp_bias: bool,
    /// The LM head shares the embedding matrix (`tie_word_embeddings`).
    pub tie_word_embeddings: bool,
    /// Beginning-of-sequence token (`bos_token_id`).
    pub bos_token_id: Option<u32>,
    /// End-of-sequence tokens (`eos_token_id`, an integer or a list).
    pub eos_token_ids: Vec<u32>,
    /// Sliding attention window in tokens (Mistral `sliding_window`; `None` = full).
    pub sliding_window: Option<usize>,
    /// Storage type of the checkpoint (`dtype` / `torch_dtype`), when given.
    pub dtype: Option<ConfigDtype>,
}

fn json_str(v: &Value) -> String {
    v.to_string()
}

pub(crate) fn invalid(
    field: &str,
    value: impl fmt::Display,
    reason: impl Into<String>,
) -> ConfigError {
    ConfigError::Invalid {
        field: field.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// `field` holds `v`, not what was expected.
pub(crate) fn wrong_type(field: String, expected: &'static str, v: &Value) -> ConfigError {
    ConfigError::WrongType {
        field,
        expected,
        found: json_str(v),
    }
}

/// Typed access to one JSON object, naming fields as `prefix.key` in errors (also the
/// encoder's config).
pub(crate) struct Fields<'a> {
    map: &'a Map<String, Value>,
    prefix: &'a str,
}

impl<'a> Fields<'a> {
    /// The top-level object: fields named by their key alone.
    pub(crate) fn top(map: &'a Map<String, Value>) -> Self {
        Fields { map, prefix: "" }
    }

    fn name(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}.{}", self.prefix, key)
        }
    }

    /// The value, or `None` when absent or null.
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub(crate) fn wrong(&self, key: &str, expected: &'static str, v: &Value) -> ConfigError {
        wrong_type(self.name(key), expected, v)
    }

    fn missing(&self, key: &str) -> ConfigError {
        ConfigError::MissingField {
            field: self.name(key),
        }
    }

    pub(crate) fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| self.wrong(key, "a non-negative integer", v)),
        }
    }

    pub(crate) fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?.ok_or_else(|| self.missing(key))
    }

    pub(crate) fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.wrong(key, "a number", v)),
        }
    }

    fn f64(&self, key: &str) -> Result<f64> {
        self.opt_f64(key)?.ok_or_else(|| self.missing(key))
    }

    pub(crate) fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.wrong(key, "true or false", v)),
        }
    }

    pub(crate) fn opt_str(&self, key: &str) -> Result<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.wrong(key, "a string", v)),
        }
    }

    fn token_id(&self, key: &str, v: &Value) -> Result<u32> {
        v.as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .ok_or_else(|| self.wrong(key, "a token id (integer in 0..2^32)", v))
    }

    /// An integer, a list of integers, or absent/null.
    fn token_ids(&self, key: &str) -> Result<Vec<u32>> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items.iter().map(|v| self.token_id(key, v)).collect(),
            Some(v) => Ok(vec![self.token_id(key, v)?]),
        }
    }
}

fn parse_dtype(field: &str, s: &str) -> Result<ConfigDtype> {
    match s {
        "float32" | "float" => Ok(ConfigDtype::F32),
        "float16" | "half" => Ok(ConfigDtype::F16),
        "bfloat16" => Ok(ConfigDtype::BF16),
        other => Err(ConfigError::UnsupportedOption {
            field: field.to_string(),
            value: format!("\"{other}\""),
            reason: "supported dtypes are float32, float16 and bfloat16",
        }),
    }
}

/// Reads the scaling fields of a `rope_scaling` or `rope_parameters` object.
fn parse_rope(obj: &Fields<'_>) -> Result<RopeScaling> {
    let (key, ty) = match obj.opt_str("rope_type")? {
        Some(t) => ("rope_type", Some(t)),
        None => ("type", obj.opt_str("type")?),
    };
    match ty {
        None | Some("default") => Ok(RopeScaling::None),
        Some("linear") => {
            let factor = obj.f64("factor")?;
            if !(factor.is_finite() && factor > 0.0) {
                return Err(invalid(
                    &obj.name("factor"),
                    factor,
                    "must be finite and > 0",
                ));
            }
            Ok(RopeScaling::Linear { factor })
        }
        Some("llama3") => {
            let factor = obj.f64("factor")?;
            let low = obj.f64("low_freq_factor")?;
            let high = obj.f64("high_freq_factor")?;
            let orig = obj.usize("original_max_position_embeddings")?;
            for (k, v) in [
                ("factor", factor),
                ("low_freq_factor", low),
                ("high_freq_factor", high),
            ] {
                if !(v.is_finite() && v > 0.0) {
                    return Err(invalid(&obj.name(k), v, "must be finite and > 0"));
                }
            }
            if high <= low {
                return Err(invalid(
                    &obj.name("high_freq_factor"),
                    high,
                    format!("must be greater than low_freq_factor ({low})"),
                ));
            }
            if orig == 0 {
                return Err(invalid(
                    &obj.name("original_max_position_embeddings"),
                    orig,
                    "must be > 0",
                ));
            }
            Ok(RopeScaling::Llama3 {
                factor,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: orig,
            })
        }
        Some(other) => Err(ConfigError::UnsupportedRopeType {
            field: obj.name(key),
            rope_type: other.to_string(),
        }),
    }
}

fn architecture(top: &Fields<'_>) -> Result<Architecture> {
    let from_type = match top.opt_str("model_type")? {
        Some(t) => Some(Architecture::from_model_type(t).ok_or_else(|| {
            ConfigError::UnsupportedArchitecture {
                field: "model_type".into(),
                name: t.to_string(),
            }
        })?),
        None => None,
    };
    let mut from_classes = None;
    if let Some(v) = top.get("architectures") {
        let items = v
            .as_array()
            .ok_or_else(|| top.wrong("architectures", "a list of class names", v))?;
        for item in items {
            let name = item
                .as_str()
                .ok_or_else(|| top.wrong("architectures", "a list of class names", v))?;
            let arch = Architecture::from_class(name).ok_or_else(|| {
                ConfigError::UnsupportedArchitecture {
                    field: "architectures".into(),
                    name: name.to_string(),
                }
            })?;
            if let Some(t) = from_type.filter(|&t| t != arch) {
                return Err(invalid(
                    "architectures",
                    json_str(v),
                    format!("disagrees with model_type \"{t}\""),
                ));
            }
            from_classes.get_or_insert(arch);
        }
    }
    from_type
        .or(from_classes)
        .ok_or_else(|| top.missing("model_type"))
}

impl ModelConfig {
    /// Parses and validates a `config.json` text.
    ///
    /// # Errors
    /// [`ConfigError`] naming the field: not JSON, missing or mistyped field, unsupported
    /// architecture / RoPE type / option, or a value [`ModelConfig::validate`] rejects.
    ///
    /// # Example
    /// ```
    /// use fl_engine::config::ModelConfig;
    /// let cfg = ModelConfig::from_json_str(r#"{
    ///     "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    ///     "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
    ///     "max_position_embeddings": 64, "rms_norm_eps": 1e-5
    /// }"#)?;
    /// assert_eq!(cfg.head_dim, 16);
    /// # Ok::<(), fl_engine::config::ConfigError>(())
    /// ```
    pub fn from_json_str(text: &str) -> Result<Self> {
        let value: Value = serde_json::from_str(text).map_err(|e| ConfigError::Json {
            detail: e.to_string(),
        })?;
        Self::from_json_value(&value)
    }

    /// Reads and validates a `config.json` file.
    ///
    /// # Errors
    /// [`ConfigError::Io`] naming the path, or any error of [`ModelConfig::from_json_str`].
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json_str(&text)
    }

    /// Reads `config.json` from a model directory.
    ///
    /// # Errors
    /// As [`ModelConfig::from_file`].
    pub fn from_model_dir(dir: impl AsRef<Path>) -> Result<Self> {
        Self::from_file(dir.as_ref().join("config.json"))
    }

    /// Builds a config from parsed JSON (see [`ModelConfig::from_json_str`]).
    ///
    /// # Errors
    /// As [`ModelConfig::from_json_str`].
    pub fn from_json_value(value: &Value) -> Result<Self> {
        let map = value.as_object().ok_or_else(|| ConfigError::Json {
            detail: format!("top level is {}, not an object", json_str(value)),
        })?;
        let top = Fields::top(map);
        let architecture = architecture(&top)?;

        if let Some(act) = top.opt_str("hidden_act")? {
            if act != "silu" {
                return Err(ConfigError::UnsupportedOption {
                    field: "hidden_act".into(),
                    value: format!("\"{act}\""),
                    reason: "only silu (SwiGLU) MLPs are implemented",
                });
            }
        }
        for key in ["quantization_config", "rope_local_base_freq"] {
            if let Some(v) = top.get(key) {
                return Err(ConfigError::UnsupportedOption {
                    field: key.into(),
                    value: json_str(v),
                    reason: "not implemented",
                });
            }
        }
        if let Some(f) = top.opt_f64("partial_rotary_factor")? {
            if f != 1.0 {
                return Err(ConfigError::UnsupportedOption {
                    field: "partial_rotary_factor".into(),
                    value: f.to_string(),
                    reason: "only full-width RoPE is implemented",
                });
            }
        }

        let hidden_size = top.usize("hidden_size")?;
        let num_attention_heads = top.usize("num_attention_heads")?;
        let num_key_value_heads = top
            .opt_usize("num_key_value_heads")?
            .unwrap_or(num_attention_heads);
        let head_dim = match top.opt_usize("head_dim")? {
            Some(d) => d,
            None => {
                if num_attention_heads == 0 || hidden_size % num_attention_heads != 0 {
                    return Err(invalid(
                        "hidden_size",
                        hidden_size,
                        format!(
                            "no head_dim given and not divisible by num_attention_heads ({num_attention_heads})"
                        ),
                    ));
                }
                hidden_size / num_attention_heads
            }
        };

        // RoPE: transformers 5 `rope_parameters` wins over the Hub fields.
        let (rope_theta, rope_scaling) = match top.get("rope_parameters") {
            Some(v) => {
                let obj = v
                    .as_object()
                    .ok_or_else(|| top.wrong("rope_parameters", "an object", v))?;
                if obj.values().any(Value::is_object) {
                    return Err(ConfigError::UnsupportedOption {
                        field: "rope_parameters".into(),
                        value: json_str(v),
                        reason: "per-layer-type RoPE parameters are not implemented",
                    });
                }
                let rp = Fields {
                    map: obj,
                    prefix: "rope_parameters",
                };
                let theta = match rp.opt_f64("rope_theta")? {
                    Some(t) => t,
                    None => top.opt_f64("rope_theta")?.unwrap_or(10_000.0),
                };
                (theta, parse_rope(&rp)?)
            }
            None => {
                let theta = top.opt_f64("rope_theta")?.unwrap_or(10_000.0);
                let scaling = match top.get("rope_scaling") {
                    None => RopeScaling::None,
                    Some(v) => {
                        let obj = v
                            .as_object()
                            .ok_or_else(|| top.wrong("rope_scaling", "an object or null", v))?;
                        parse_rope(&Fields {
                            map: obj,
                            prefix: "rope_scaling",
                        })?
                    }
                };
                (theta, scaling)
            }
        };

        let attention_bias = top.opt_bool("attention_bias")?;
        let mlp_bias = top.opt_bool("mlp_bias")?.unwrap_or(false);
        let (qkv_bias, o_bias) = match architecture {
            Architecture::Llama => {
                let b = attention_bias.unwrap_or(false);
                (b, b)
            }
            Architecture::Mistral | Architecture::Qwen2 => {
                if attention_bias == Some(true) {
                    return Err(ConfigError::UnsupportedOption {
                        field: "attention_bias".into(),
                        value: "true".into(),
                        reason: "mistral and qwen2 models fix their projection biases",
                    });
                }
                (architecture == Architecture::Qwen2, false)
            }
        };
        if mlp_bias && architecture != Architecture::Llama {
            return Err(ConfigError::UnsupportedOption {
                field: "mlp_bias".into(),
                value: "true".into(),
                reason: "only llama models have MLP biases",
            });
        }

        let sliding_window = match architecture {
            Architecture::Llama => None,
            Architecture::Mistral => top.opt_usize("sliding_window")?,
            Architecture::Qwen2 => {
                if top.opt_bool("use_sliding_window")? == Some(true) {
                    return Err(ConfigError::UnsupportedOption {
                        field: "use_sliding_window".into(),
                        value: "true".into(),
                        reason: "qwen2 per-layer sliding windows are not implemented",
                    });
                }
                None
            }
        };

        let dtype = match (top.opt_str("dtype")?, top.opt_str("torch_dtype")?) {
            (Some(s), _) => Some(parse_dtype("dtype", s)?),
            (None, Some(s)) => Some(parse_dtype("torch_dtype", s)?),
            (None, None) => None,
        };

        let bos = top.token_ids("bos_token_id")?;
        if bos.len() > 1 {
            return Err(invalid(
                "bos_token_id",
                format!("{bos:?}"),
                "must be a single token id",
            ));
        }

        let cfg = ModelConfig {
            architecture,
            hidden_size,
            intermediate_size: top.usize("intermediate_size")?,
            num_hidden_layers: top.usize("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            vocab_size: top.usize("vocab_size")?,
            max_position_embeddings: top.usize("max_position_embeddings")?,
            rms_norm_eps: top.opt_f64("rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            qkv_bias,
            o_bias,
            mlp_bias,
            tie_word_embeddings: top.opt_bool("tie_word_embeddings")?.unwrap_or(false),
            bos_token_id: bos.first().copied(),
            eos_token_ids: top.token_ids("eos_token_id")?,
            sliding_window,
            dtype,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks the invariants the engine relies on.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the field: a size of 0; `num_attention_heads` not a
    /// multiple of `num_key_value_heads`; odd `head_dim`; non-finite or non-positive
    /// `rms_norm_eps` / `rope_theta`; a bos/eos id outside the vocabulary; a zero
    /// `sliding_window`.
    pub fn validate(&self) -> Result<()> {
        for (field, v) in [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if v == 0 {
                return Err(invalid(field, v, "must be > 0"));
            }
        }
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return Err(invalid(
                "num_key_value_heads",
                self.num_key_value_heads,
                format!(
                    "must divide num_attention_heads ({})",
                    self.num_attention_heads
                ),
            ));
        }
        if self.head_dim % 2 != 0 {
            return Err(invalid(
                "head_dim",
                self.head_dim,
                "must be even (RoPE pairs)",
            ));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(invalid(
                "rms_norm_eps",
                self.rms_norm_eps,
                "must be finite and > 0",
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(invalid(
                "rope_theta",
                self.rope_theta,
                "must be finite and > 0",
            ));
        }
        let vocab = self.vocab_size as u64;
        if let Some(b) = self.bos_token_id.filter(|&b| u64::from(b) >= vocab) {
            return Err(invalid(
                "bos_token_id",
                b,
                format!("outside the vocabulary (vocab_size {vocab})"),
            ));
        }
        if let Some(e) = self.eos_token_ids.iter().find(|&&e| u64::from(e) >= vocab) {
            return Err(invalid(
                "eos_token_id",
                e,
                format!("outside the vocabulary (vocab_size {vocab})"),
            ));
        }
        if self.sliding_window == Some(0) {
            return Err(invalid("sliding_window", 0, "must be > 0 or null"));
        }
        Ok(())
    }

    /// Query heads per key/value head (1 for multi-head attention).
    pub fn group_size(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads.max(1)
    }

    /// Output width of the q projection: `num_attention_heads * head_dim`.
    pub fn q_size(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// Output width of each of the k and v projections: `num_key_value_heads * head_dim`.
    pub fn kv_size(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// `1 / sqrt(head_dim)`, the softmax scale of attention.
    pub fn attention_scale(&self) -> f64 {
        1.0 / (self.head_dim as f64).sqrt()
    }

    /// Bytes of KV cache one token takes across all layers (keys and values) at
    /// `dtype_bytes` bytes per element: `2 * num_hidden_layers * kv_size * dtype_bytes`.
    ///
    /// ```
    /// let cfg = fl_engine::presets::preset("llama-2-7b")?;
    /// assert_eq!(cfg.kv_cache_bytes_per_token(2), 512 * 1024);
    /// # Ok::<(), fl_engine::presets::UnknownPreset>(())
    /// ```
    pub fn kv_cache_bytes_per_token(&self, dtype_bytes: usize) -> u64 {
        2 * self.num_hidden_layers as u64 * self.kv_size() as u64 * dtype_bytes as u64
    }

    /// RoPE inverse frequencies, `head_dim / 2` of them, in f64, with [`RopeScaling`]
    /// applied exactly as transformers does (`_compute_default_rope_parameters`,
    /// `_compute_linear_scaling_rope_parameters`, `_compute_llama3_parameters`):
    ///
    /// * base: `inv_freq[i] = rope_theta ^ (-2i / head_dim)`;
    /// * `Linear { factor }`: `inv_freq[i] / factor`;
    /// * `Llama3`: with `wavelen = 2 pi / inv_freq[i]`, `lo = original / low_freq_factor`,
    ///   `hi = original / high_freq_factor`: wavelengths above `lo` are divided by
    ///   `factor`, those below `hi` kept, and in between blended with
    ///   `s = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)`
    ///   as `(1 - s) * inv_freq / factor + s * inv_freq`.
    ///
    /// transformers computes these in f32; round with `as f32` to match it.
    ///
    /// ```
    /// let cfg = fl_engine::presets::preset("llama-2-7b")?;
    /// let f = cfg.rope_inv_freq();
    /// assert_eq!(f.len(), 64);
    /// assert_eq!(f[0], 1.0);
    /// # Ok::<(), fl_engine::presets::UnknownPreset>(())
    /// ```
    pub fn rope_inv_freq(&self) -> Vec<f64> {
        let d = self.head_dim as f64;
        let base = (0..self.head_dim / 2).map(|i| 1.0 / self.rope_theta.powf((2 * i) as f64 / d));
        match self.rope_scaling {
            RopeScaling::None => base.collect(),
            RopeScaling::Linear { factor } => base.map(|f| f / factor).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let old = original_max_position_embeddings as f64;
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                base.map(|f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen < high_wavelen {
                        f
                    } else if wavelen > low_wavelen {
                        f / factor
                    } else {
                        let s = (old / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - s) * f / factor + s * f
                    }
                })
                .collect()
            }
        }
    }

    /// Parameters of one decoder layer: attention projections (+ biases), MLP (+ biases)
    /// and the two RMSNorm weights.
    pub fn layer_param_count(&self) -> u64 {
        let h = self.hidden_size as u64;
        let q = self.q_size() as u64;
        let kv = self.kv_size() as u64;
        let i = self.intermediate_size as u64;
        let mut n = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h;
        if self.qkv_bias {
            n += q + 2 * kv;
        }
        if self.o_bias {
            n += h;
        }
        if self.mlp_bias {
            n += 2 * i + h;
        }
        n
    }

    /// Total parameters: embedding + layers + final norm + LM head (unless tied).
    ///
    /// ```
    /// let cfg = fl_engine::presets::preset("llama-2-7b")?;
    /// assert_eq!(cfg.param_count(), 6_738_415_616);
    /// # Ok::<(), fl_engine::presets::UnknownPreset>(())
    /// ```
    pub fn param_count(&self) -> u64 {
        let embed = self.vocab_size as u64 * self.hidden_size as u64;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        embed
            + self.num_hidden_layers as u64 * self.layer_param_count()
            + self.hidden_size as u64
            + head
    }

    /// Bytes of all weights stored at `dtype_bytes` bytes per parameter.
    pub fn weight_bytes(&self, dtype_bytes: usize) -> u64 {
        self.param_count() * dtype_bytes as u64
    }
}
