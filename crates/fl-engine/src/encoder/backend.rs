//! Running an encoder for a batch job or a server: a model directory loaded
//! ([`EncoderModelDir`]), the forward behind one trait ([`EncoderBackend`]) on the GPU
//! ([`GpuEncoder`]) or the CPU reference ([`CpuEncoder`]), and the reranker head on the host
//! ([`EncoderHead`], [`scores_from_logits`], [`rank`]).
//!
//! Everything after the forward (pooling, normalisation, the classification head) runs on the
//! host from the f32 states the backend returns, so code written against
//! [`EncoderBackend`] computes the same thing on either implementation; tests run it on the
//! CPU reference.
//!
//! ```no_run
//! use fl_engine::encoder::backend::{EncoderBackend, EncoderModelDir, GpuEncoder};
//! use fl_engine::encoder::{reference, Pooling};
//! let m = EncoderModelDir::load("models/bge-small-en-v1.5")?;
//! let tok = m.encoder_tokenizer()?.expect("tokenizer.json");
//! let batch = tok.encode_texts(&["a query", "a passage"])?.pack(&m.config)?;
//! let mut gpu = GpuEncoder::<fl_kernels::f16>::new(0, &m.config, &m.weights)?;
//! let states = gpu.hidden_states(&batch)?; // [tokens, hidden]
//! let emb = reference::pool(&states, &batch, m.config.hidden_size, Pooling::Cls)?; // [2, hidden]
//! # Ok::<(), fl_engine::EngineError>(())
//! ```

use std::path::{Path, PathBuf};

use fl_blas::Blas;
use fl_kernels::Gpu;
use serde_json::Value;

use crate::checkpoint::Checkpoint;
use crate::dtype::RunDType;
use crate::encoder::batch::PackedBatch;
use crate::encoder::config::{EncoderArch, EncoderConfig};
use crate::encoder::gpu::{open_gpu, EncoderModel, EncoderQuant};
use crate::encoder::pooling_config::sentence_transformers_max_len;
use crate::encoder::reference;
use crate::encoder::tokenize::EncoderTokenizer;
use crate::encoder::weights::{EncoderWeights, LayerNorm};
use crate::error::{EngineError, Result};
use crate::tokenizer::Tokenizer;

/// What runs an encoder's forward: a packed batch in, the last hidden state of every token out
/// (`[batch.num_tokens(), hidden_size]`, f32 on the host, sequences in batch order).
///
/// Not `Send`: a server builds its backend on the thread that runs it (GPU handles stay on
/// one thread).
pub trait EncoderBackend {
    /// The model's configuration.
    fn config(&self) -> &EncoderConfig;

    /// The last hidden states of `batch`.
    ///
    /// # Errors
    /// The implementation's: a batch that does not fit the model (naming the `batch` field),
    /// device errors.
    fn hidden_states(&mut self, batch: &PackedBatch) -> Result<Vec<f32>>;
}

/// The CPU reference ([`reference::forward`], f32) as a backend: slow, exact, no device.
#[derive(Debug, Clone)]
pub struct CpuEncoder {
    cfg: EncoderConfig,
    weights: EncoderWeights,
}

impl CpuEncoder {
    /// A backend over `weights` (checked against `cfg`).
    ///
    /// # Errors
    /// [`EngineError::Config`] if `cfg` fails [`EncoderConfig::validate`];
    /// [`EngineError::Invalid`] naming the `weights` field that does not match `cfg`.
    pub fn new(cfg: EncoderConfig, weights: EncoderWeights) -> Result<Self> {
        cfg.validate()?;
        weights.check(&cfg)?;
        Ok(CpuEncoder { cfg, weights })
    }

    /// The weights.
    pub fn weights(&self) -> &EncoderWeights {
        &self.weights
    }
}

impl EncoderBackend for CpuEncoder {
    fn config(&self) -> &EncoderConfig {
        &self.cfg
    }

    fn hidden_states(&mut self, batch: &PackedBatch) -> Result<Vec<f32>> {
        reference::forward(&self.cfg, &self.weights, batch)
    }
}

/// [`EncoderModel`] on one GPU in the run dtype `T` (f16, bf16, f32) with its stream and
/// cuBLASLt handle, as a backend.
pub struct GpuEncoder<T: RunDType> {
    gpu: Gpu,
    blas: Blas,
    model: EncoderModel<T>,
}

impl<T: RunDType> std::fmt::Debug for GpuEncoder<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuEncoder")
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

impl<T: RunDType> GpuEncoder<T> {
    /// Opens GPU `ordinal` and uploads `weights` ([`EncoderModel::new`]); the host copy can
    /// be dropped afterwards.
    ///
    /// # Errors
    /// No GPU; those of [`EncoderModel::new`] (an unsupported head dim names
    /// `hidden_size / num_attention_heads`).
    pub fn new(ordinal: usize, cfg: &EncoderConfig, weights: &EncoderWeights) -> Result<Self> {
        Self::new_quant(ordinal, cfg, weights, EncoderQuant::None)
    }

    /// [`GpuEncoder::new`] with the projections run as `quant` says
    /// ([`EncoderModel::new_quant`]).
    ///
    /// # Errors
    /// Those of [`GpuEncoder::new`] and [`EncoderModel::new_quant`].
    pub fn new_quant(
        ordinal: usize,
        cfg: &EncoderConfig,
        weights: &EncoderWeights,
        quant: EncoderQuant,
    ) -> Result<Self> {
        EncoderModel::<T>::supports(cfg)?;
        let gpu = open_gpu(ordinal)?;
        let blas = Blas::new(&gpu)?;
        let model = EncoderModel::<T>::new_quant(gpu.stream(), cfg, weights, quant)?;
        Ok(GpuEncoder { gpu, blas, model })
    }
}

impl<T: RunDType> EncoderBackend for GpuEncoder<T> {
    fn config(&self) -> &EncoderConfig {
        self.model.config()
    }

    fn hidden_states(&mut self, batch: &PackedBatch) -> Result<Vec<f32>> {
        self.model.run(self.gpu.stream(), &mut self.blas, batch)
    }
}

/// A sequence-classification head (and the BERT pooler it reads) on the host: logits from
/// a backend's states, without keeping the rest of the weights.
#[derive(Debug, Clone)]
pub struct EncoderHead {
    cfg: EncoderConfig,
    /// Only `pooler` and `head` are set: [`reference::classify`] reads nothing else.
    weights: EncoderWeights,
}

impl EncoderHead {
    /// The head of `weights`; `None` for a model without one (config.json names no
    /// `*ForSequenceClassification`).
    pub fn from_weights(cfg: &EncoderConfig, weights: &EncoderWeights) -> Option<Self> {
        let head = weights.head.clone()?;
        let empty = LayerNorm {
            weight: Vec::new(),
            bias: Vec::new(),
        };
        Some(EncoderHead {
            cfg: cfg.clone(),
            weights: EncoderWeights {
                word_embeddings: Vec::new(),
                position_embeddings: Vec::new(),
                token_type_embeddings: Vec::new(),
                embeddings_norm: empty,
                layers: Vec::new(),
                pooler: weights.pooler.clone(),
                head: Some(head),
            },
        })
    }

    /// Outputs per sequence (`num_labels`).
    pub fn num_labels(&self) -> usize {
        self.cfg.num_labels
    }

    /// The logits of every sequence of `batch`, `[batch.num_seqs(), num_labels]`, from its
    /// last hidden `states` (`[tokens, hidden]`).
    ///
    /// # Errors
    /// Those of [`reference::classify`] (`states` of another shape).
    pub fn logits(&self, states: &[f32], batch: &PackedBatch) -> Result<Vec<f32>> {
        reference::classify(&self.cfg, &self.weights, states, batch)
    }
}

/// A relevance score per pair from the classification logits (`[pairs, num_labels]`): the
/// logit with one label (cross-encoder rerankers), else the softmax probability of the last
/// label (binary relevant / not-relevant heads).
///
/// # Errors
/// [`EngineError::Invalid`] naming `num_labels` when it is 0 or does not divide the logits.
///
/// ```
/// use fl_engine::encoder::backend::scores_from_logits;
/// assert_eq!(scores_from_logits(&[1.5, -2.0], 1)?, [1.5, -2.0]);
/// assert_eq!(scores_from_logits(&[0.0, 0.0], 2)?, [0.5]);
/// # Ok::<(), fl_engine::EngineError>(())
/// ```
pub fn scores_from_logits(logits: &[f32], num_labels: usize) -> Result<Vec<f32>> {
    if num_labels == 0 || logits.len() % num_labels != 0 {
        return Err(EngineError::invalid(
            "num_labels",
            format!("{num_labels} does not divide the {} logits", logits.len()),
        ));
    }
    if num_labels == 1 {
        return Ok(logits.to_vec());
    }
    Ok(logits
        .chunks(num_labels)
        .map(|row| {
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f32 = row.iter().map(|&x| (x - m).exp()).sum();
            (row[num_labels - 1] - m).exp() / sum
        })
        .collect())
}

/// `(index, score)` sorted best first; ties keep input order, NaN scores go last.
///
/// ```
/// use fl_engine::encoder::backend::rank;
/// let order: Vec<usize> = rank(&[0.1, f32::NAN, 2.0]).iter().map(|p| p.0).collect();
/// assert_eq!(order, [2, 0, 1]);
/// ```
pub fn rank(scores: &[f32]) -> Vec<(usize, f32)> {
    let mut r: Vec<(usize, f32)> = scores.iter().copied().enumerate().collect();
    let key = |s: f32| if s.is_nan() { f32::NEG_INFINITY } else { s };
    r.sort_by(|a, b| key(b.1).total_cmp(&key(a.1)));
    r
}

/// An encoder model directory, read and checked on the host: `config.json`, the safetensors
/// weights (f32), `tokenizer.json` when present, and the length inputs are truncated to.
pub struct EncoderModelDir {
    /// The directory.
    pub path: PathBuf,
    /// Its `config.json`.
    pub config: EncoderConfig,
    /// Its weights, f32 on the host.
    pub weights: EncoderWeights,
    /// Its `tokenizer.json` (`None`: inputs must be token ids).
    pub tokenizer: Option<Tokenizer>,
    /// Tokens a sequence keeps, special tokens included: the position table's
    /// [`EncoderConfig::max_sequence_len`], or sentence-transformers' `max_seq_length` when
    /// that is shorter.
    pub max_len: usize,
}

impl std::fmt::Debug for EncoderModelDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncoderModelDir")
            .field("path", &self.path)
            .field("config", &self.config)
            .field("tokenizer", &self.tokenizer.as_ref().map(Tokenizer::path))
            .field("max_len", &self.max_len)
            .finish_non_exhaustive()
    }
}

impl EncoderModelDir {
    /// Whether `dir` holds an encoder: its `config.json`'s `model_type` is one
    /// [`EncoderConfig`] reads (`bert`, `roberta`, `xlm-roberta`). `false` for anything
    /// unreadable (a file, a preset name, a decoder).
    pub fn is_encoder(dir: impl AsRef<Path>) -> bool {
        let Ok(text) = std::fs::read_to_string(dir.as_ref().join("config.json")) else {
            return false;
        };
        let Ok(v) = serde_json::from_str::<Value>(&text) else {
            return false;
        };
        let ty = v.get("model_type").and_then(Value::as_str);
        [
            EncoderArch::Bert,
            EncoderArch::Roberta,
            EncoderArch::XlmRoberta,
        ]
        .iter()
        .any(|a| Some(a.model_type()) == ty)
    }

    /// Reads `dir` without its weights: config, tokenizer and truncation length (fast; to
    /// check a directory before loading it).
    ///
    /// # Errors
    /// As [`EncoderModelDir::load`], weights excepted.
    pub fn inspect(dir: impl AsRef<Path>) -> Result<(EncoderConfig, Option<Tokenizer>, usize)> {
        let dir = dir.as_ref();
        let config = EncoderConfig::from_model_dir(dir)?;
        let tokenizer = Tokenizer::from_model_dir(dir)?;
        let positions = config.max_sequence_len();
        let max_len = sentence_transformers_max_len(dir)?.map_or(positions, |m| m.min(positions));
        Ok((config, tokenizer, max_len))
    }

    /// Reads and checks everything in `dir`.
    ///
    /// # Errors
    /// [`EngineError::Config`] naming the `config.json` field; checkpoint errors naming the
    /// tensor; [`EngineError::Tokenizer`] for a `tokenizer.json` that does not load;
    /// [`EngineError::File`] for a malformed `sentence_bert_config.json`.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let (config, tokenizer, max_len) = Self::inspect(dir)?;
        let weights = EncoderWeights::load(&Checkpoint::open(dir)?, &config)?;
        Ok(EncoderModelDir {
            path: dir.to_path_buf(),
            config,
            weights,
            tokenizer,
            max_len,
        })
    }

    /// The tokenizer set up to truncate to [`max_len`](Self::max_len); `None` without
    /// `tokenizer.json`.
    ///
    /// # Errors
    /// Those of [`EncoderTokenizer::with_max_len`].
    pub fn encoder_tokenizer(&self) -> Result<Option<EncoderTokenizer>> {
        self.tokenizer
            .as_ref()
            .map(|t| EncoderTokenizer::with_max_len(t, self.max_len))
            .transpose()
    }

    /// The classification head, when the model has one.
    pub fn head(&self) -> Option<EncoderHead> {
        EncoderHead::from_weights(&self.config, &self.weights)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_is_best_first_stable_nan_last() {
        let r = rank(&[0.1, f32::NAN, 2.0, 0.1, -3.0]);
        let order: Vec<usize> = r.iter().map(|p| p.0).collect();
        assert_eq!(order, [2, 0, 3, 4, 1]);
        assert!(rank(&[]).is_empty());
    }

    #[test]
    fn scores_from_one_or_more_labels() {
        assert_eq!(scores_from_logits(&[1.5, -2.0], 1).unwrap(), [1.5, -2.0]);
        let s = scores_from_logits(&[0.0, 0.0, 1.0, 3.0], 2).unwrap();
        assert!((s[0] - 0.5).abs() < 1e-6);
        assert!((s[1] - 1.0 / (1.0 + (-2.0f32).exp())).abs() < 1e-6);
        for (l, n) in [(&[1.0, 2.0, 3.0][..], 2), (&[1.0][..], 0)] {
            let e = scores_from_logits(l, n).unwrap_err().to_string();
            assert!(e.contains("num_labels"), "{e}");
        }
    }

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/encoder")
            .join(name)
    }

    #[test]
    fn detects_encoders_and_loads_the_fixtures() {
        assert!(EncoderModelDir::is_encoder(fixture("bert_erf")));
        assert!(EncoderModelDir::is_encoder(fixture("xlmr_tanh")));
        assert!(!EncoderModelDir::is_encoder(fixture("tokenizer")));
        assert!(!EncoderModelDir::is_encoder("llama-2-7b"));
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
        assert!(!EncoderModelDir::is_encoder(d.path()));

        let m = EncoderModelDir::load(fixture("xlmr_cls_erf")).unwrap();
        assert!(m.tokenizer.is_none());
        assert_eq!(m.max_len, m.config.max_sequence_len());
        assert!(m.encoder_tokenizer().unwrap().is_none());
        let head = m.head().expect("a classifier");
        assert_eq!(head.num_labels(), 1);
        // The head alone gives the full weights' logits.
        let batch = PackedBatch::new(&m.config, &[vec![0, 5, 9, 2], vec![0, 7, 2]], None).unwrap();
        let mut cpu = CpuEncoder::new(m.config.clone(), m.weights.clone()).unwrap();
        let states = cpu.hidden_states(&batch).unwrap();
        let full = reference::classify(&m.config, cpu.weights(), &states, &batch).unwrap();
        assert_eq!(head.logits(&states, &batch).unwrap(), full);
        assert!(EncoderModelDir::load(fixture("xlmr_tanh"))
            .unwrap()
            .head()
            .is_none());
    }
}
