//! [`EncoderConfig`]: a BERT / RoBERTa / XLM-RoBERTa `config.json`, validated.
//!
//! Dispatch is on `model_type` (`bert`, `roberta`, `xlm-roberta`); `architectures` only tells
//! whether the checkpoint carries a sequence-classification head. Absent optional fields take
//! transformers' defaults (`hidden_act` gelu, `type_vocab_size` 2, `layer_norm_eps` 1e-12,
//! `pad_token_id` 0 for BERT and 1 for the RoBERTa family). A field or value we do not
//! implement (another `model_type`, `hidden_act`, `position_embedding_type`, `is_decoder`) is
//! a [`ConfigError`] naming it; fields that do not change the forward (dropouts,
//! `initializer_range`, `use_cache`, ...) are ignored.

use std::fmt;
use std::path::Path;

use fl_kernels::activation::GeluKind;
use serde_json::Value;

use crate::config::{invalid, wrong_type, ConfigError, Fields};

/// Shorthand for results in this module.
pub type Result<T, E = ConfigError> = std::result::Result<T, E>;

/// The encoder family: decides the position ids and the checkpoint's name prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EncoderArch {
    /// `bert`: position ids `0, 1, 2, ...` in each sequence.
    Bert,
    /// `roberta`: position ids start at `pad_token_id + 1`.
    Roberta,
    /// `xlm-roberta`: as RoBERTa.
    XlmRoberta,
}

impl EncoderArch {
    /// The `model_type` string of this family.
    pub fn model_type(self) -> &'static str {
        match self {
            EncoderArch::Bert => "bert",
            EncoderArch::Roberta => "roberta",
            EncoderArch::XlmRoberta => "xlm-roberta",
        }
    }

    /// The attribute under which a task model (`BertForSequenceClassification`, ...) holds the
    /// base model, and so the prefix of its tensor names in such a checkpoint (`bert.` /
    /// `roberta.`; XLM-RoBERTa reuses `roberta`).
    pub fn base_model_prefix(self) -> &'static str {
        match self {
            EncoderArch::Bert => "bert",
            EncoderArch::Roberta | EncoderArch::XlmRoberta => "roberta",
        }
    }

    /// Whether position ids are offset by `pad_token_id + 1` (fairseq's `make_positions`).
    pub fn offset_positions(self) -> bool {
        !matches!(self, EncoderArch::Bert)
    }

    fn from_model_type(s: &str) -> Option<Self> {
        match s {
            "bert" => Some(EncoderArch::Bert),
            "roberta" => Some(EncoderArch::Roberta),
            "xlm-roberta" => Some(EncoderArch::XlmRoberta),
            _ => None,
        }
    }
}

impl fmt::Display for EncoderArch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.model_type())
    }
}

/// A validated encoder configuration.
///
/// Build it with [`EncoderConfig::from_json_str`], [`EncoderConfig::from_file`] or
/// [`EncoderConfig::from_model_dir`]; each runs [`EncoderConfig::validate`], which code that
/// builds or edits a value by hand should call too.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderConfig {
    /// Model family (`model_type`).
    pub arch: EncoderArch,
    /// Rows of the word embedding.
    pub vocab_size: usize,
    /// Model width.
    pub hidden_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads; `hidden_size / num_attention_heads` is the head size.
    pub num_attention_heads: usize,
    /// Width of the feed-forward block.
    pub intermediate_size: usize,
    /// The feed-forward activation: `gelu` is [`GeluKind::Erf`], `gelu_new` and
    /// `gelu_pytorch_tanh` are [`GeluKind::Tanh`].
    pub hidden_act: GeluKind,
    /// Rows of the position embedding (RoBERTa: the longest sequence is this minus
    /// `pad_token_id + 1`).
    pub max_position_embeddings: usize,
    /// Rows of the token-type embedding (2 for BERT pairs, 1 for XLM-RoBERTa).
    pub type_vocab_size: usize,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f64,
    /// The padding id: RoBERTa's position offset; `None` when the config sets it null (BERT
    /// only).
    pub pad_token_id: Option<u32>,
    /// Whether `architectures` names a `*ForSequenceClassification` model (the checkpoint
    /// then holds the classification head; see [`crate::encoder::weights::ClassifierHead`]).
    pub sequence_classification: bool,
    /// Outputs of the classification head (`num_labels`, else the size of `id2label`, else
    /// transformers' default 2).
    pub num_labels: usize,
    /// Label names by index (`id2label`; `LABEL_i` when absent), `num_labels` long.
    pub id2label: Vec<String>,
}

fn unsupported(field: &str, value: &str, reason: &'static str) -> ConfigError {
    ConfigError::UnsupportedOption {
        field: field.to_string(),
        value: format!("\"{value}\""),
        reason,
    }
}

fn parse_act(s: &str) -> Result<GeluKind> {
    match s {
        "gelu" => Ok(GeluKind::Erf),
        "gelu_new" | "gelu_pytorch_tanh" => Ok(GeluKind::Tanh),
        other => Err(unsupported(
            "hidden_act",
            other,
            "supported: gelu (erf), gelu_new and gelu_pytorch_tanh (tanh)",
        )),
    }
}

/// `id2label` as a list indexed by label: its keys must be exactly `"0".."n-1"`.
fn parse_labels(v: &Value) -> Result<Vec<String>> {
    let map = v
        .as_object()
        .ok_or_else(|| wrong_type("id2label".into(), "an object from label index to name", v))?;
    let mut labels = vec![None; map.len()];
    for (k, name) in map {
        let i = k
            .parse::<usize>()
            .ok()
            .filter(|&i| i < labels.len())
            .ok_or_else(|| {
                invalid(
                    "id2label",
                    v,
                    format!("key \"{k}\" is not an index in 0..{}", map.len()),
                )
            })?;
        let name = name.as_str().ok_or_else(|| {
            wrong_type("id2label".into(), "an object from label index to name", v)
        })?;
        labels[i] = Some(name.to_string());
    }
    // Keys are distinct and all below len, so every slot is filled.
    Ok(labels.into_iter().flatten().collect())
}

impl EncoderConfig {
    /// Parses and validates a `config.json` text.
    ///
    /// # Errors
    /// [`ConfigError`] naming the field: not JSON, a missing or mistyped field, an unsupported
    /// `model_type` / `hidden_act` / `position_embedding_type`, `is_decoder: true`, or a value
    /// [`EncoderConfig::validate`] rejects.
    ///
    /// # Example
    /// ```
    /// use fl_engine::encoder::config::{EncoderArch, EncoderConfig};
    /// use fl_kernels::activation::GeluKind;
    /// let cfg = EncoderConfig::from_json_str(r#"{
    ///     "model_type": "xlm-roberta", "vocab_size": 250002, "hidden_size": 768,
    ///     "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
    ///     "max_position_embeddings": 514, "type_vocab_size": 1, "pad_token_id": 1,
    ///     "layer_norm_eps": 1e-05, "hidden_act": "gelu",
    ///     "architectures": ["XLMRobertaForSequenceClassification"],
    ///     "id2label": {"0": "LABEL_0"}
    /// }"#)?;
    /// assert_eq!(cfg.arch, EncoderArch::XlmRoberta);
    /// assert_eq!(cfg.hidden_act, GeluKind::Erf);
    /// assert_eq!(cfg.head_dim(), 64);
    /// assert!(cfg.sequence_classification);
    /// assert_eq!(cfg.num_labels, 1);
    /// assert_eq!(cfg.max_sequence_len(), 512);
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
    /// [`ConfigError::Io`] naming the path, or any error of [`EncoderConfig::from_json_str`].
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
    /// As [`EncoderConfig::from_file`].
    pub fn from_model_dir(dir: impl AsRef<Path>) -> Result<Self> {
        Self::from_file(dir.as_ref().join("config.json"))
    }

    /// Builds a config from parsed JSON (see [`EncoderConfig::from_json_str`]).
    ///
    /// # Errors
    /// As [`EncoderConfig::from_json_str`].
    pub fn from_json_value(value: &Value) -> Result<Self> {
        let map = value.as_object().ok_or_else(|| ConfigError::Json {
            detail: format!("top level is {value}, not an object"),
        })?;
        let f = Fields::top(map);
        let model_type = f
            .opt_str("model_type")?
            .ok_or_else(|| ConfigError::MissingField {
                field: "model_type".into(),
            })?;
        let arch = EncoderArch::from_model_type(model_type).ok_or_else(|| {
            unsupported(
                "model_type",
                model_type,
                "encoders supported: bert, roberta, xlm-roberta",
            )
        })?;
        let hidden_act = parse_act(f.opt_str("hidden_act")?.unwrap_or("gelu"))?;
        if let Some(p) = f.opt_str("position_embedding_type")? {
            if p != "absolute" {
                return Err(unsupported(
                    "position_embedding_type",
                    p,
                    "only absolute position embeddings are implemented",
                ));
            }
        }
        if f.opt_bool("is_decoder")? == Some(true) {
            return Err(ConfigError::UnsupportedOption {
                field: "is_decoder".into(),
                value: "true".into(),
                reason: "the encoder runs non-causal attention only",
            });
        }
        let pad_token_id = match map.get("pad_token_id") {
            // Explicitly null: no padding id (fine for BERT; validate rejects it for RoBERTa).
            Some(Value::Null) => None,
            None => Some(if arch.offset_positions() { 1 } else { 0 }),
            Some(v) => Some(
                v.as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .ok_or_else(|| wrong_type("pad_token_id".into(), "a token id", v))?,
            ),
        };
        let sequence_classification = match f.get("architectures") {
            None => false,
            Some(v) => {
                let items = v.as_array().ok_or_else(|| {
                    wrong_type("architectures".into(), "a list of class names", v)
                })?;
                let mut any = false;
                for item in items {
                    let name = item.as_str().ok_or_else(|| {
                        wrong_type("architectures".into(), "a list of class names", v)
                    })?;
                    any |= name.ends_with("ForSequenceClassification");
                }
                any
            }
        };
        let labels = f.get("id2label").map(parse_labels).transpose()?;
        let num_labels = match (f.opt_usize("num_labels")?, &labels) {
            (Some(n), Some(l)) if n != l.len() => {
                return Err(invalid(
                    "num_labels",
                    n,
                    format!("disagrees with id2label, which names {} labels", l.len()),
                ))
            }
            (Some(n), _) => n,
            (None, Some(l)) => l.len(),
            (None, None) => 2,
        };
        let id2label =
            labels.unwrap_or_else(|| (0..num_labels).map(|i| format!("LABEL_{i}")).collect());
        let cfg = EncoderConfig {
            arch,
            vocab_size: f.usize("vocab_size")?,
            hidden_size: f.usize("hidden_size")?,
            num_hidden_layers: f.usize("num_hidden_layers")?,
            num_attention_heads: f.usize("num_attention_heads")?,
            intermediate_size: f.usize("intermediate_size")?,
            hidden_act,
            max_position_embeddings: f.usize("max_position_embeddings")?,
            type_vocab_size: f.opt_usize("type_vocab_size")?.unwrap_or(2),
            layer_norm_eps: f.opt_f64("layer_norm_eps")?.unwrap_or(1e-12),
            pad_token_id,
            sequence_classification,
            num_labels,
            id2label,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks the invariants every constructor guarantees: sizes > 0, `hidden_size` divisible
    /// by `num_attention_heads`, `layer_norm_eps` finite and > 0, `pad_token_id` below
    /// `vocab_size`, a RoBERTa-family `pad_token_id` present with room for at least one
    /// position after it, `num_labels` >= 1 for a classifier, `id2label` `num_labels` long.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the field.
    pub fn validate(&self) -> Result<()> {
        for (field, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_position_embeddings),
            ("type_vocab_size", self.type_vocab_size),
        ] {
            if v == 0 {
                return Err(invalid(field, v, "must be > 0"));
            }
        }
        if self.hidden_size % self.num_attention_heads != 0 {
            return Err(invalid(
                "hidden_size",
                self.hidden_size,
                format!(
                    "must be divisible by num_attention_heads ({})",
                    self.num_attention_heads
                ),
            ));
        }
        if !(self.layer_norm_eps.is_finite() && self.layer_norm_eps > 0.0) {
            return Err(invalid(
                "layer_norm_eps",
                self.layer_norm_eps,
                "must be finite and > 0",
            ));
        }
        if let Some(p) = self.pad_token_id {
            if p as usize >= self.vocab_size {
                return Err(invalid(
                    "pad_token_id",
                    p,
                    format!("must be below vocab_size ({})", self.vocab_size),
                ));
            }
        }
        if self.arch.offset_positions() {
            let Some(p) = self.pad_token_id else {
                return Err(invalid(
                    "pad_token_id",
                    "null",
                    format!("{} position ids start at pad_token_id + 1", self.arch),
                ));
            };
            if p as usize + 1 >= self.max_position_embeddings {
                return Err(invalid(
                    "max_position_embeddings",
                    self.max_position_embeddings,
                    format!("leaves no position after pad_token_id + 1 ({})", p + 1),
                ));
            }
        }
        if self.sequence_classification && self.num_labels == 0 {
            return Err(invalid("num_labels", 0, "a classifier needs >= 1 label"));
        }
        if self.id2label.len() != self.num_labels {
            return Err(invalid(
                "id2label",
                format!("{:?}", self.id2label),
                format!(
                    "names {} labels, num_labels is {}",
                    self.id2label.len(),
                    self.num_labels
                ),
            ));
        }
        Ok(())
    }

    /// Size of one attention head: `hidden_size / num_attention_heads`.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// The softmax scale `1 / sqrt(head_dim)`.
    pub fn attention_scale(&self) -> f64 {
        1.0 / (self.head_dim() as f64).sqrt()
    }

    /// The position id of the first token: 0 for BERT, `pad_token_id + 1` for the RoBERTa
    /// family.
    pub fn first_position(&self) -> usize {
        match (self.arch.offset_positions(), self.pad_token_id) {
            (true, Some(p)) => p as usize + 1,
            _ => 0,
        }
    }

    /// The longest sequence the position embedding covers: `max_position_embeddings` minus
    /// [`EncoderConfig::first_position`] (512 for BERT-base, 512 for XLM-R's 514).
    pub fn max_sequence_len(&self) -> usize {
        self.max_position_embeddings
            .saturating_sub(self.first_position())
    }

    /// The position ids of one sequence (its ids without padding), as transformers computes
    /// them: BERT `0..n`; RoBERTa / XLM-R `create_position_ids_from_input_ids`, i.e.
    /// `pad + 1 + (non-pad tokens before this one)` for a non-pad token and `pad` for a pad
    /// token. Shape: `[ids.len()]`. Ids are not range-checked here
    /// ([`crate::encoder::PackedBatch::new`] checks them).
    ///
    /// ```
    /// # use fl_engine::encoder::config::EncoderConfig;
    /// let cfg = EncoderConfig::from_json_str(r#"{"model_type": "roberta",
    ///     "vocab_size": 50, "hidden_size": 8, "num_hidden_layers": 1,
    ///     "num_attention_heads": 2, "intermediate_size": 16,
    ///     "max_position_embeddings": 20, "pad_token_id": 1}"#)?;
    /// assert_eq!(cfg.position_ids(&[0, 7, 1, 9]), [2, 3, 1, 4]);
    /// # Ok::<(), fl_engine::config::ConfigError>(())
    /// ```
    pub fn position_ids(&self, ids: &[u32]) -> Vec<usize> {
        match (self.arch.offset_positions(), self.pad_token_id) {
            (true, Some(pad)) => {
                let mut seen = 0usize;
                ids.iter()
                    .map(|&id| {
                        if id == pad {
                            pad as usize
                        } else {
                            seen += 1;
                            pad as usize + seen
                        }
                    })
                    .collect()
            }
            _ => (0..ids.len()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bert() -> Value {
        json!({
            "model_type": "bert", "vocab_size": 100, "hidden_size": 36, "num_hidden_layers": 2,
            "num_attention_heads": 3, "intermediate_size": 52, "max_position_embeddings": 40
        })
    }

    fn with(mut v: Value, key: &str, x: Value) -> Value {
        v[key] = x;
        v
    }

    fn field_of(e: ConfigError) -> String {
        match e {
            ConfigError::MissingField { field }
            | ConfigError::WrongType { field, .. }
            | ConfigError::UnsupportedOption { field, .. }
            | ConfigError::Invalid { field, .. } => field,
            other => panic!("unexpected error {other}"),
        }
    }

    #[test]
    fn defaults_follow_transformers() {
        let c = EncoderConfig::from_json_value(&bert()).unwrap();
        assert_eq!(c.arch, EncoderArch::Bert);
        assert_eq!(c.hidden_act, GeluKind::Erf);
        assert_eq!(c.type_vocab_size, 2);
        assert_eq!(c.layer_norm_eps, 1e-12);
        assert_eq!(c.pad_token_id, Some(0));
        assert!(!c.sequence_classification);
        assert_eq!(c.num_labels, 2);
        assert_eq!(c.id2label, ["LABEL_0", "LABEL_1"]);
        assert_eq!(c.head_dim(), 12);
        assert_eq!(c.max_sequence_len(), 40);
        assert_eq!(c.position_ids(&[5, 0, 7]), [0, 1, 2]);
        let r = EncoderConfig::from_json_value(&with(bert(), "model_type", json!("roberta")));
        let r = r.unwrap();
        assert_eq!(r.pad_token_id, Some(1));
        assert_eq!(r.first_position(), 2);
        assert_eq!(r.max_sequence_len(), 38);
    }

    #[test]
    fn activations_and_labels() {
        for (act, kind) in [
            ("gelu", GeluKind::Erf),
            ("gelu_new", GeluKind::Tanh),
            ("gelu_pytorch_tanh", GeluKind::Tanh),
        ] {
            let c = EncoderConfig::from_json_value(&with(bert(), "hidden_act", json!(act)));
            assert_eq!(c.unwrap().hidden_act, kind);
        }
        let v = with(
            with(
                bert(),
                "architectures",
                json!(["BertForSequenceClassification"]),
            ),
            "id2label",
            json!({"1": "pos", "0": "neg", "2": "neutral"}),
        );
        let c = EncoderConfig::from_json_value(&v).unwrap();
        assert!(c.sequence_classification);
        assert_eq!(c.num_labels, 3);
        assert_eq!(c.id2label, ["neg", "pos", "neutral"]);
        let c = EncoderConfig::from_json_value(&with(v, "num_labels", json!(2)));
        assert_eq!(field_of(c.unwrap_err()), "num_labels");
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (with(bert(), "model_type", json!("gpt2")), "model_type"),
            (with(bert(), "hidden_act", json!("relu")), "hidden_act"),
            (
                with(bert(), "position_embedding_type", json!("relative_key")),
                "position_embedding_type",
            ),
            (with(bert(), "is_decoder", json!(true)), "is_decoder"),
            (with(bert(), "hidden_size", json!(37)), "hidden_size"),
            (with(bert(), "hidden_size", json!("36")), "hidden_size"),
            (with(bert(), "vocab_size", json!(0)), "vocab_size"),
            (with(bert(), "vocab_size", Value::Null), "vocab_size"),
            (
                with(bert(), "layer_norm_eps", json!(-1.0)),
                "layer_norm_eps",
            ),
            (with(bert(), "pad_token_id", json!(100)), "pad_token_id"),
            (
                with(bert(), "id2label", json!({"0": "a", "2": "b"})),
                "id2label",
            ),
            (
                with(
                    with(bert(), "model_type", json!("xlm-roberta")),
                    "pad_token_id",
                    Value::Null,
                ),
                "pad_token_id",
            ),
            (
                with(
                    with(bert(), "model_type", json!("roberta")),
                    "max_position_embeddings",
                    json!(2),
                ),
                "max_position_embeddings",
            ),
        ];
        for (v, field) in cases {
            let e = EncoderConfig::from_json_value(&v).unwrap_err();
            let msg = e.to_string();
            assert_eq!(field_of(e), field, "{msg}");
            assert!(msg.contains(field), "{msg}");
        }
        let mut missing = bert();
        missing.as_object_mut().unwrap().remove("model_type");
        let e = EncoderConfig::from_json_value(&missing).unwrap_err();
        assert_eq!(field_of(e), "model_type");
    }

    #[test]
    fn roberta_positions_skip_pads() {
        let c = EncoderConfig::from_json_value(&with(
            with(bert(), "model_type", json!("xlm-roberta")),
            "pad_token_id",
            json!(1),
        ))
        .unwrap();
        // transformers: mask = ids != pad; cumsum(mask) * mask + pad.
        assert_eq!(c.position_ids(&[0, 5, 6, 2]), [2, 3, 4, 5]);
        assert_eq!(c.position_ids(&[0, 1, 6, 1]), [2, 1, 3, 1]);
        assert!(c.position_ids(&[]).is_empty());
    }
}
