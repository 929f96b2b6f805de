//! An encoder's weights on the host in f32 ([`EncoderWeights`]), read from a safetensors
//! [`Checkpoint`] in any float dtype.
//!
//! Tensor names are transformers' (`embeddings.word_embeddings.weight`,
//! `encoder.layer.{l}.attention.self.query.weight`, ...), found either bare (a `BertModel` /
//! `XLMRobertaModel` file) or under the base-model prefix `bert.` / `roberta.` (a task model's
//! file, e.g. `BertForSequenceClassification`); [`base_prefix`] decides which. The pooler
//! (`pooler.dense`) is read when present; the classification head ([`ClassifierHead`]) when
//! the config names a `*ForSequenceClassification` model. A missing tensor, or one of another
//! shape, is an error naming it.

use crate::checkpoint::{Checkpoint, CheckpointError, FLOAT_DTYPES};
use crate::encoder::config::{EncoderArch, EncoderConfig};
use crate::error::{EngineError, Result};

/// A linear layer `y = x Wᵀ + b`.
#[derive(Debug, Clone, PartialEq)]
pub struct Dense {
    /// `[out_features, in_features]`, row-major (PyTorch's layout).
    pub weight: Vec<f32>,
    /// `[out_features]`.
    pub bias: Vec<f32>,
    /// Output width.
    pub out_features: usize,
    /// Input width.
    pub in_features: usize,
}

/// LayerNorm's affine parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerNorm {
    /// `[hidden]`.
    pub weight: Vec<f32>,
    /// `[hidden]`.
    pub bias: Vec<f32>,
}

/// One post-LayerNorm encoder layer.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderLayerWeights {
    /// `attention.self.query`: `[hidden, hidden]`.
    pub query: Dense,
    /// `attention.self.key`: `[hidden, hidden]`.
    pub key: Dense,
    /// `attention.self.value`: `[hidden, hidden]`.
    pub value: Dense,
    /// `attention.output.dense`: `[hidden, hidden]`.
    pub attn_out: Dense,
    /// `attention.output.LayerNorm`.
    pub attn_norm: LayerNorm,
    /// `intermediate.dense`: `[intermediate, hidden]`.
    pub intermediate: Dense,
    /// `output.dense`: `[hidden, intermediate]`.
    pub output: Dense,
    /// `output.LayerNorm`.
    pub output_norm: LayerNorm,
}

/// A sequence-classification head on the first token's last hidden state.
#[derive(Debug, Clone, PartialEq)]
pub enum ClassifierHead {
    /// `BertForSequenceClassification`: `classifier(pooler(h_cls))`, the pooler being
    /// [`EncoderWeights::pooler`] (required). `classifier`: `[num_labels, hidden]`.
    Bert {
        /// `classifier`.
        classifier: Dense,
    },
    /// `RobertaForSequenceClassification` / `XLMRobertaForSequenceClassification`:
    /// `out_proj(tanh(dense(h_cls)))`.
    Roberta {
        /// `classifier.dense`: `[hidden, hidden]`.
        dense: Dense,
        /// `classifier.out_proj`: `[num_labels, hidden]`.
        out_proj: Dense,
    },
}

/// Every weight of an encoder, f32 on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderWeights {
    /// `embeddings.word_embeddings`: `[vocab_size, hidden]`.
    pub word_embeddings: Vec<f32>,
    /// `embeddings.position_embeddings`: `[max_position_embeddings, hidden]`.
    pub position_embeddings: Vec<f32>,
    /// `embeddings.token_type_embeddings`: `[type_vocab_size, hidden]`.
    pub token_type_embeddings: Vec<f32>,
    /// `embeddings.LayerNorm`.
    pub embeddings_norm: LayerNorm,
    /// The encoder layers, `num_hidden_layers` of them.
    pub layers: Vec<EncoderLayerWeights>,
    /// `pooler.dense` (`[hidden, hidden]`, followed by tanh), when the checkpoint has it.
    pub pooler: Option<Dense>,
    /// The classification head, when the config names a sequence-classification model.
    pub head: Option<ClassifierHead>,
}

/// The prefix of the base model's tensor names in `ckpt`: `""` for a base-model file,
/// `"bert."` / `"roberta."` (per [`EncoderArch::base_model_prefix`]) for a task model's.
///
/// # Errors
/// [`CheckpointError::MissingTensor`] naming `embeddings.word_embeddings.weight` (with the
/// prefixed name) when neither form is present.
pub fn base_prefix(ckpt: &Checkpoint, arch: EncoderArch) -> Result<String> {
    let probe = "embeddings.word_embeddings.weight";
    let prefixed = format!("{}.", arch.base_model_prefix());
    if ckpt.entry(probe).is_some() {
        Ok(String::new())
    } else if ckpt.entry(&format!("{prefixed}{probe}")).is_some() {
        Ok(prefixed)
    } else {
        Err(CheckpointError::MissingTensor {
            tensor: format!("{probe}` or `{prefixed}{probe}"),
            location: ckpt.location().to_path_buf(),
        }
        .into())
    }
}

/// Reads tensors by name, checked for shape, converted to f32.
struct Reader<'a> {
    ckpt: &'a Checkpoint,
}

impl Reader<'_> {
    fn read(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        Ok(self
            .ckpt
            .expect(name, shape, FLOAT_DTYPES)?
            .to_vec::<f32>()?)
    }

    fn dense(&self, name: &str, out_features: usize, in_features: usize) -> Result<Dense> {
        Ok(Dense {
            weight: self.read(&format!("{name}.weight"), &[out_features, in_features])?,
            bias: self.read(&format!("{name}.bias"), &[out_features])?,
            out_features,
            in_features,
        })
    }

    fn norm(&self, name: &str, hidden: usize) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: self.read(&format!("{name}.weight"), &[hidden])?,
            bias: self.read(&format!("{name}.bias"), &[hidden])?,
        })
    }
}

fn check_len(field: &'static str, v: &[f32], want: usize) -> Result<()> {
    if v.len() == want {
        Ok(())
    } else {
        Err(EngineError::invalid(
            field,
            format!("has {} values, the config needs {want}", v.len()),
        ))
    }
}

impl Dense {
    /// `[out_features, in_features]` as given, with arrays of that size (what the reference's
    /// loops index).
    pub(crate) fn check(
        &self,
        field: &'static str,
        out_features: usize,
        in_features: usize,
    ) -> Result<()> {
        if (self.out_features, self.in_features) != (out_features, in_features) {
            return Err(EngineError::invalid(
                field,
                format!(
                    "is [{}, {}], the config needs [{out_features}, {in_features}]",
                    self.out_features, self.in_features
                ),
            ));
        }
        check_len(field, &self.weight, out_features * in_features)?;
        check_len(field, &self.bias, out_features)
    }
}

impl LayerNorm {
    fn check(&self, field: &'static str, hidden: usize) -> Result<()> {
        check_len(field, &self.weight, hidden)?;
        check_len(field, &self.bias, hidden)
    }
}

impl EncoderWeights {
    /// Reads every weight `cfg` needs from `ckpt` (any float dtype, converted to f32): the
    /// embeddings and layers (bare or under `bert.` / `roberta.`, see [`base_prefix`]), the
    /// pooler if present, and the head if `cfg.sequence_classification` (BERT: `pooler` and
    /// `classifier`; RoBERTa / XLM-R: `classifier.dense` and `classifier.out_proj`).
    ///
    /// # Errors
    /// [`EngineError::Checkpoint`]: [`CheckpointError::MissingTensor`],
    /// [`CheckpointError::Shape`] or [`CheckpointError::UnsupportedDtype`] naming the tensor.
    ///
    /// # Example
    /// ```no_run
    /// use fl_engine::checkpoint::Checkpoint;
    /// use fl_engine::encoder::{config::EncoderConfig, weights::EncoderWeights};
    /// let dir = "models/bge-small-en-v1.5";
    /// let cfg = EncoderConfig::from_model_dir(dir)?;
    /// let w = EncoderWeights::load(&Checkpoint::open(dir)?, &cfg)?;
    /// assert_eq!(w.layers.len(), cfg.num_hidden_layers);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load(ckpt: &Checkpoint, cfg: &EncoderConfig) -> Result<Self> {
        let r = Reader { ckpt };
        let p = base_prefix(ckpt, cfg.arch)?;
        let h = cfg.hidden_size;
        let i = cfg.intermediate_size;
        let e = format!("{p}embeddings");
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let n = format!("{p}encoder.layer.{l}");
            layers.push(EncoderLayerWeights {
                query: r.dense(&format!("{n}.attention.self.query"), h, h)?,
                key: r.dense(&format!("{n}.attention.self.key"), h, h)?,
                value: r.dense(&format!("{n}.attention.self.value"), h, h)?,
                attn_out: r.dense(&format!("{n}.attention.output.dense"), h, h)?,
                attn_norm: r.norm(&format!("{n}.attention.output.LayerNorm"), h)?,
                intermediate: r.dense(&format!("{n}.intermediate.dense"), i, h)?,
                output: r.dense(&format!("{n}.output.dense"), h, i)?,
                output_norm: r.norm(&format!("{n}.output.LayerNorm"), h)?,
            });
        }
        let pooler_name = format!("{p}pooler.dense");
        let bert_head = cfg.sequence_classification && cfg.arch == EncoderArch::Bert;
        // BERT's head reads the pooler: then it is required, and a missing one is named.
        let pooler = if bert_head || ckpt.entry(&format!("{pooler_name}.weight")).is_some() {
            Some(r.dense(&pooler_name, h, h)?)
        } else {
            None
        };
        let labels = cfg.num_labels;
        let head = match (cfg.sequence_classification, cfg.arch) {
            (false, _) => None,
            (true, EncoderArch::Bert) => Some(ClassifierHead::Bert {
                classifier: r.dense("classifier", labels, h)?,
            }),
            (true, EncoderArch::Roberta | EncoderArch::XlmRoberta) => {
                Some(ClassifierHead::Roberta {
                    dense: r.dense("classifier.dense", h, h)?,
                    out_proj: r.dense("classifier.out_proj", labels, h)?,
                })
            }
        };
        Ok(EncoderWeights {
            word_embeddings: r
                .read(&format!("{e}.word_embeddings.weight"), &[cfg.vocab_size, h])?,
            position_embeddings: r.read(
                &format!("{e}.position_embeddings.weight"),
                &[cfg.max_position_embeddings, h],
            )?,
            token_type_embeddings: r.read(
                &format!("{e}.token_type_embeddings.weight"),
                &[cfg.type_vocab_size, h],
            )?,
            embeddings_norm: r.norm(&format!("{e}.LayerNorm"), h)?,
            layers,
            pooler,
            head,
        })
    }

    /// Checks that every array has the size `cfg` implies (weights built or edited by hand;
    /// [`EncoderWeights::load`] guarantees it), and that a BERT head has its pooler.
    ///
    /// # Errors
    /// [`EngineError::Invalid`] naming the field (`layers[].query`, `pooler`, ...).
    pub fn check(&self, cfg: &EncoderConfig) -> Result<()> {
        let h = cfg.hidden_size;
        let i = cfg.intermediate_size;
        check_len("word_embeddings", &self.word_embeddings, cfg.vocab_size * h)?;
        check_len(
            "position_embeddings",
            &self.position_embeddings,
            cfg.max_position_embeddings * h,
        )?;
        check_len(
            "token_type_embeddings",
            &self.token_type_embeddings,
            cfg.type_vocab_size * h,
        )?;
        self.embeddings_norm.check("embeddings_norm", h)?;
        if self.layers.len() != cfg.num_hidden_layers {
            return Err(EngineError::invalid(
                "layers",
                format!(
                    "has {} layers, num_hidden_layers is {}",
                    self.layers.len(),
                    cfg.num_hidden_layers
                ),
            ));
        }
        for l in &self.layers {
            l.query.check("layers[].query", h, h)?;
            l.key.check("layers[].key", h, h)?;
            l.value.check("layers[].value", h, h)?;
            l.attn_out.check("layers[].attn_out", h, h)?;
            l.attn_norm.check("layers[].attn_norm", h)?;
            l.intermediate.check("layers[].intermediate", i, h)?;
            l.output.check("layers[].output", h, i)?;
            l.output_norm.check("layers[].output_norm", h)?;
        }
        if let Some(p) = &self.pooler {
            p.check("pooler", h, h)?;
        }
        match &self.head {
            None => {}
            Some(ClassifierHead::Bert { classifier }) => {
                if self.pooler.is_none() {
                    return Err(EngineError::invalid(
                        "pooler",
                        "is absent, and the BERT classification head reads it",
                    ));
                }
                classifier.check("head.classifier", cfg.num_labels, h)?;
            }
            Some(ClassifierHead::Roberta { dense, out_proj }) => {
                dense.check("head.dense", h, h)?;
                out_proj.check("head.out_proj", cfg.num_labels, h)?;
            }
        }
        Ok(())
    }
}
