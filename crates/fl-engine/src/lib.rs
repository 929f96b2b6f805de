//! # fl-engine: LLaMA-family models end to end
//!
//! Built (CPU side of issue 7): [`config`] (Hugging Face config.json, both dialects),
//! [`presets`] (named model shapes for dummy weights), [`weights`] (memory-mapped
//! safetensors, single or sharded, checked before any upload). Not built yet: the decoder
//! layer, KV cache, prefill and decode loop, tokenizer, and `fl generate` / `fl bench`.
//!
//! Today it holds the `fl demo` job: a kernel run on the GPU, checked against the CPU
//! reference, timed, so the build and the GPU path can be checked end to end.

pub mod config;
pub mod demo;
pub mod presets;
pub mod weights;
