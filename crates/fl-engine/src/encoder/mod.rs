//! Encoder models (BERT, RoBERTa, XLM-RoBERTa) for embeddings and rerankers (issue 35).
//!
//! - [`config`]: [`EncoderConfig`] from a Hugging Face `config.json`;
//! - [`weights`]: [`EncoderWeights`] from safetensors (base-model or
//!   `*ForSequenceClassification` files), f32 on the host;
//! - [`PackedBatch`]: a ragged batch packed without padding (ids, token types, position ids,
//!   `cu_seqlens`), [`Pooling`]: CLS, mean or last token;
//! - [`reference`](mod@reference): the forward on the CPU in f32, the pooling, L2 normalisation and the
//!   classification heads; the GPU path is checked against it;
//! - [`tokenize`]: [`EncoderTokenizer`], texts and (query, passage) pairs to ids and token
//!   types, truncated to the model's length.
//! - [`gpu`]: [`EncoderModel`], the forward on the GPU (f32 / f16 / bf16, or INT8 projections:
//!   [`gpu::EncoderQuant`]); [`calibrate`]: INT8 activation amax from sample text;
//! - [`backend`]: the model behind a trait (GPU or CPU reference) for `fl serve` and the
//!   commands, the model directory and the classification head; [`pooling_config`]:
//!   sentence-transformers' pooling defaults; [`presets`]: benchmark shapes with random
//!   weights.
//!
//! ```no_run
//! use fl_engine::checkpoint::Checkpoint;
//! use fl_engine::encoder::{reference, EncoderConfig, EncoderWeights, PackedBatch, Pooling};
//! let dir = "models/bge-reranker-base";
//! let cfg = EncoderConfig::from_model_dir(dir)?;
//! let w = EncoderWeights::load(&Checkpoint::open(dir)?, &cfg)?;
//! // Two query/passage pairs, already tokenised.
//! let batch = PackedBatch::new(&cfg, &[vec![0, 581, 2, 2, 9906, 2], vec![0, 581, 2, 2, 4, 2]], None)?;
//! let states = reference::forward(&cfg, &w, &batch)?; // [12, hidden]
//! let scores = reference::classify(&cfg, &w, &states, &batch)?; // [2, num_labels]
//! let mut emb = reference::pool(&states, &batch, cfg.hidden_size, Pooling::Mean)?;
//! reference::l2_normalize(&mut emb, cfg.hidden_size)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod backend;
mod batch;
pub mod calibrate;
pub mod config;
pub mod gpu;
pub mod pooling_config;
pub mod presets;
pub mod reference;
pub mod tokenize;
pub mod weights;

pub use batch::{PackedBatch, Pooling};
pub use config::{EncoderArch, EncoderConfig};
pub use gpu::{DeviceBatch, EncoderModel};
pub use tokenize::{Encoded, EncoderTokenizer};
pub use weights::{ClassifierHead, EncoderWeights};
