//! # fl-engine: LLaMA-family models end to end
//!
//! Planned scope (issue 7, not built yet): config and safetensors loading, the decoder
//! layer, KV cache, prefill and decode loop, tokenizer, and the `fl` command.
//!
//! Today it holds the `fl demo` job: a kernel run on the GPU, checked against the CPU
//! reference, timed, so the build and the GPU path can be checked end to end.

pub mod config;
pub mod demo;
pub mod presets;
pub mod weights;
