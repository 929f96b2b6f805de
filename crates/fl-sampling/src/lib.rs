//! # fl-sampling: logits processors and samplers on the GPU
//!
//! Everything a decoding loop does between the LM head and the next step, as CUDA kernels
//! that queue on your stream and never synchronise:
//!
//! - **per-request parameters** ([`SamplingParams`] -> [`DeviceParams`]): every row of a
//!   batch has its own temperature, top-k, top-p, min-p, penalties, seed;
//! - **logits processors** ([`process_logits`] and the single-purpose [`apply_penalties`],
//!   [`ban_tokens`], [`mask_end_ids`]): repetition (Hugging Face), presence and frequency
//!   (OpenAI) penalties over each row's history, banned tokens, end ids masked under
//!   `min_new_tokens`;
//! - **samplers** ([`sample`], [`greedy`]): greedy, multinomial, top-k, top-p, min-p in any
//!   combination, sort-free (radix select on the logits' bits with histograms of
//!   fixed-point probability mass), a row split over many blocks when the batch is small;
//! - **randomness** ([`philox`]): counter-based Philox4x32-10 keyed by (seed, request id,
//!   step), the same on CPU and GPU, so a request gets the same tokens whatever it is
//!   batched with;
//! - **beam search** ([`beam_topk`]): per request, the best (beam, token) candidates by
//!   running log-probability plus log-softmax, ragged requests of different beam counts in
//!   one step (the engine's beam search keeps the hypotheses);
//! - **bookkeeping** ([`DecodeState`], [`decode_update`], [`Sampler`]): finished flags,
//!   several end ids, generated lengths, a device-side "all finished" flag.
//!
//! The kernels are launched through `fl_kernels::sampling` (this crate has no FFI and no
//! `unsafe`); this crate adds the parameter checks, the decoding state and the reference.
//!
//! Every op has a CPU reference in [`reference`](mod@crate::reference) that uses the same arithmetic (a portable
//! `exp`, integer masses): GPU tests compare tokens and processed logits for equality.
//!
//! ```no_run
//! use fl_sampling::{Sampler, SamplerConfig, SamplingParams};
//! use fl_kernels::{DeviceTensor, Gpu};
//! let gpu = Gpu::new(0)?;
//! let s = gpu.stream();
//! let vocab = 128_256;
//! let rows = vec![
//!     SamplingParams::greedy(),
//!     SamplingParams { temperature: 0.7, top_k: 50, top_p: 0.9, seed: 7, ..Default::default() },
//!     SamplingParams { temperature: 1.0, min_p: 0.05, repetition_penalty: 1.1, seed: 8, ..Default::default() },
//! ];
//! let cfg = SamplerConfig { end_ids: vec![128_001, 128_009], pad_id: 128_001, max_history: 512 };
//! let mut sampler = Sampler::new(s, &rows, vocab, &cfg)?;
//! let mut logits = DeviceTensor::<f32>::zeros(s, &[rows.len(), vocab])?; // from the LM head
//! let mut tokens = DeviceTensor::<i32>::zeros(s, &[rows.len()])?;
//! sampler.step(s, &mut logits, &mut tokens)?;
//! println!("{:?}, all finished: {}", tokens.to_host(s)?, sampler.all_finished(s)?);
//! # Ok::<(), fl_sampling::Error>(())
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod beam;
mod decode;
mod dev;
mod error;
mod params;
mod processors;
mod sampler;

pub mod philox;
pub mod reference;

pub use beam::{beam_topk, BeamRequests, BeamTopkWorkspace, BEAM_MAX_KEEP};
pub use decode::{decode_update, DecodeState, Sampler, SamplerConfig};
pub use error::{Error, Result};
pub use params::{DeviceParams, SamplingParams, PARAM_WORDS};
pub use processors::{
    apply_penalties, ban_tokens, mask_end_ids, process_logits, History, PenaltyWorkspace,
    Processors,
};
pub use sampler::{greedy, sample, SampleOptions, SampleWorkspace, MAX_VOCAB};

pub use fl_kernels::{DeviceTensor, Gpu};

/// The 32-bit Philox words of each row at its step, computed on the device
/// (`fl_philox_words`): `out[r] = philox::row_words(&params[r], steps[r])`. For tests and for
/// callers that want the sampler's random stream.
///
/// Shapes: `steps` `[batch]` (absent: step 0), `out` `[batch, 4]` (u32 bits in i32).
///
/// Errors: [`Error::Shape`] naming `steps` or `out`.
pub fn philox_words(
    stream: &std::sync::Arc<fl_kernels::cudarc::driver::CudaStream>,
    params: &DeviceParams,
    steps: Option<&DeviceTensor<i32>>,
    out: &mut DeviceTensor<i32>,
) -> Result<()> {
    let batch = params.batch();
    if let Some(st) = steps {
        dev::expect_shape("steps", st, &[batch])?;
    }
    dev::expect_shape("out", out, &[batch, 4])?;
    if batch == 0 {
        return Ok(());
    }
    dev::launched(
        "philox_words",
        fl_kernels::sampling::philox_words(stream, params.words(), steps, out),
    )
}
