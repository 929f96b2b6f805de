//! # fl-engine: LLaMA-family models end to end
//!
//! - [`config`]: Hugging Face config.json (both dialects), [`presets`]: named model shapes
//!   for dummy weights, [`checkpoint`]: memory-mapped safetensors (single or sharded), checked
//!   before any upload;
//! - [`model`]: the decoder stack over a packed batch of tokens (prefill) or one token per
//!   sequence (decode), built from [`weights`] (the weights on the device and their
//!   loading), [`buffers`] (the activations), [`cache`] (the KV cache) and one decoder layer
//!   written once (`layer`); [`dtype`]: the run dtypes; [`linear`]: the projections dense or
//!   quantised on load (`--quant` int8, int4, q8_0, q4_0, w8a8);
//! - [`engine`]: the generation loop (prefill, sampling with fl-sampling, decode steps
//!   replayed from a CUDA graph), [`tokenizer`]: tokenizer.json, [`load`]: `--model`
//!   resolution; [`gguf`]: llama.cpp's GGUF model files (reader, writer, config from
//!   metadata);
//! - [`kv`], [`scheduler`], [`runner`]: the paged KV block manager, continuous batching
//!   (chunked prefill, preemption, beam groups, lookahead plans) and the model runner;
//! - [`beam`]: beam search hypotheses as transformers keeps them (per-request state machine);
//! - [`encoder`]: BERT / RoBERTa / XLM-RoBERTa encoders (config, weights, the CPU reference,
//!   a first GPU forward from unfused ops);
//! - [`service`]: the model on a worker thread, driven from any thread (submit requests,
//!   stream each one's tokens and finish reason, abort, metrics);
//! - [`chat_template`] (feature `serve`): a model's Jinja chat template rendered as
//!   transformers renders it; [`serve`] (feature `serve`): the OpenAI-compatible HTTP
//!   server of `fl serve`;
//! - the `fl` binary: `fl generate`, `fl bench`, `fl logits` (for checks), `fl serve`, `fl demo`.
//!
//! ```no_run
//! use fl_engine::engine::{Engine, Request, StepNeeds};
//! use fl_engine::weights::WeightSource;
//! use fl_engine::presets::preset;
//! use fl_kernels::f16;
//! let cfg = preset("tiny").unwrap();
//! let mut e = Engine::<f16>::load(0, cfg, WeightSource::Dummy { seed: 1 }, None)?;
//! let req = Request {
//!     prompts: vec![vec![1, 2, 3], vec![4, 5]],
//!     max_new_tokens: 8,
//!     sampling: vec![fl_sampling::SamplingParams::greedy()],
//!     end_ids: vec![],
//!     ignore_eos: true,
//!     forced: None,
//! };
//! let out = e.generate(&req, StepNeeds { tokens: true, logits: false }, &mut |_| true)?;
//! println!("{:?}", out.tokens);
//! # Ok::<(), fl_engine::EngineError>(())
//! ```

pub mod beam;
pub mod buffers;
pub mod cache;
#[cfg(feature = "serve")]
pub mod chat_template;
pub mod checkpoint;
pub mod config;
pub mod demo;
pub mod dtype;
pub mod encoder;
pub mod engine;
mod error;
pub mod gguf;
pub mod kv;
mod layer;
pub mod linear;
pub mod load;
pub mod model;
pub mod presets;
pub mod runner;
pub mod scheduler;
#[cfg(feature = "serve")]
pub mod serve;
pub mod service;
pub mod tokenizer;
pub mod tp;
pub mod trace;
pub mod weights;

pub use error::{EngineError, Result};
pub use load::Loaded;
