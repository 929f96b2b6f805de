//! Logits processors, in place on `[batch, vocab]` logits: repetition / presence /
//! frequency penalties over each row's token history, banned tokens, and end-id masking
//! while a row is under its `min_new_tokens`. All of them run in one launch
//! ([`process_logits`]); [`apply_penalties`], [`ban_tokens`] and [`mask_end_ids`] run one
//! each. Temperature is not here: the sampler applies it on the fly.
//!
//! CPU reference: [`reference::process_logits`](crate::reference::process_logits); the
//! kernel gives the same bits.

use std::sync::Arc;

use fl_kernels::cudarc::driver::CudaStream;
use fl_kernels::sampling as k;
use fl_kernels::{DeviceTensor, FloatDType};

use crate::dev::{expect_shape, launched, matrix};
use crate::sampler::MAX_VOCAB;
use crate::{DeviceParams, Error, Result};

/// Scratch for the penalties: one int32 count per token for 32 rows at a time
/// (`32 * vocab * 4` bytes, 16 MiB for a vocabulary of 128k), zero-filled once; the kernel
/// leaves it zeroed after every call.
#[derive(Debug)]
pub struct PenaltyWorkspace {
    inner: k::PenaltyWorkspace,
}

impl PenaltyWorkspace {
    /// Scratch for a vocabulary of `vocab` tokens.
    ///
    /// Errors: [`Error::InvalidArgument`] naming `vocab` (0 or above the sampler's limit).
    pub fn new(stream: &Arc<CudaStream>, vocab: usize) -> Result<Self> {
        if vocab == 0 || vocab > MAX_VOCAB {
            return Err(Error::invalid(
                "vocab",
                format!("{vocab} is outside 1..={MAX_VOCAB}"),
            ));
        }
        Ok(PenaltyWorkspace {
            inner: k::PenaltyWorkspace::new(stream, vocab)?,
        })
    }

    /// The vocabulary size it was made for.
    pub fn vocab(&self) -> usize {
        self.inner.vocab()
    }
}

/// The tokens each row has seen: `tokens` `[batch, max_history]` int32 and `lens` `[batch]`
/// (the valid prefix of each row; clamped to `[0, max_history]`). Ids outside `[0, vocab)`
/// are skipped.
#[derive(Clone, Copy, Debug)]
pub struct History<'a> {
    /// Token ids, `[batch, max_history]`.
    pub tokens: &'a DeviceTensor<i32>,
    /// Valid length of each row, `[batch]`.
    pub lens: &'a DeviceTensor<i32>,
}

/// The optional inputs of [`process_logits`]; each part runs only when present.
#[derive(Clone, Copy, Debug, Default)]
pub struct Processors<'a> {
    /// Penalties over this history (rows whose penalties are all off are untouched).
    pub history: Option<History<'a>>,
    /// Banned ids per row, `[batch, max_banned]`, negative entries as padding: set to -inf.
    pub banned: Option<&'a DeviceTensor<i32>>,
    /// End ids, `[n]`: set to -inf in rows with `lengths[r] < min_new_tokens`.
    pub end_ids: Option<&'a DeviceTensor<i32>>,
    /// Tokens generated so far per row, `[batch]` (absent: 0), for the end-id mask.
    pub lengths: Option<&'a DeviceTensor<i32>>,
}

/// Runs the processors present in `inputs` on `logits`, in place, in one launch.
///
/// Per row, in order: (1) penalties: for each distinct token `t` of the row's history
/// with count `c`, `x = x > 0 ? x / repetition : x * repetition` (Hugging Face), then
/// `x -= presence + frequency * c` (OpenAI, as `fma(frequency, c, presence)` in f32),
/// rounded once to the logits' dtype; (2) banned tokens set to -inf; (3) end ids set to
/// -inf while `lengths[r] < min_new_tokens`.
///
/// Shapes: `logits` `[batch, vocab]` (`f32`, `f16`, `bf16`); `params` `batch` rows;
/// `history.tokens` `[batch, max_history]`, `history.lens`, `lengths` `[batch]`;
/// `banned` `[batch, max_banned]`; `end_ids` `[n]`. `ws` is required with a history.
///
/// Errors: [`Error::Shape`] naming the tensor at fault; [`Error::InvalidArgument`] naming
/// `workspace` (missing, or made for another vocabulary) or `vocab`.
///
/// ```no_run
/// use fl_sampling::{process_logits, DeviceParams, History, PenaltyWorkspace, Processors, SamplingParams};
/// use fl_kernels::{DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let mut logits = DeviceTensor::from_host(s, &[1.0f32, -1.0, 2.0, 0.5], &[1, 4])?;
/// let params = DeviceParams::new(s, &[SamplingParams { repetition_penalty: 2.0, ..Default::default() }])?;
/// let toks = DeviceTensor::from_host(s, &[0i32, 1, 0], &[1, 3])?;
/// let lens = DeviceTensor::from_host(s, &[3i32], &[1])?;
/// let mut ws = PenaltyWorkspace::new(s, 4)?;
/// let inputs = Processors { history: Some(History { tokens: &toks, lens: &lens }), ..Default::default() };
/// process_logits(s, &mut logits, &params, &inputs, Some(&mut ws))?;
/// assert_eq!(logits.to_host(s)?, vec![0.5, -2.0, 2.0, 0.5]);
/// # Ok::<(), fl_sampling::Error>(())
/// ```
pub fn process_logits<T: FloatDType>(
    stream: &Arc<CudaStream>,
    logits: &mut DeviceTensor<T>,
    params: &DeviceParams,
    inputs: &Processors<'_>,
    ws: Option<&mut PenaltyWorkspace>,
) -> Result<()> {
    let (batch, vocab) = matrix("logits", logits, "[batch, vocab]")?;
    if vocab == 0 || vocab > MAX_VOCAB {
        return Err(Error::invalid(
            "vocab",
            format!("{vocab} is outside 1..={MAX_VOCAB}"),
        ));
    }
    if params.batch() != batch {
        return Err(Error::Shape {
            arg: "params",
            expected: format!("{batch} rows (logits' batch)"),
            got: vec![params.batch()],
        });
    }
    if let Some(h) = inputs.history {
        let (b, _) = matrix("history.tokens", h.tokens, "[batch, max_history]")?;
        if b != batch {
            return Err(Error::Shape {
                arg: "history.tokens",
                expected: format!("[{batch}, max_history]"),
                got: h.tokens.shape().to_vec(),
            });
        }
        expect_shape("history.lens", h.lens, &[batch])?;
        match ws.as_ref() {
            None => {
                return Err(Error::invalid(
                    "workspace",
                    "penalties need a PenaltyWorkspace",
                ))
            }
            Some(w) if w.vocab() != vocab => {
                return Err(Error::invalid(
                    "workspace",
                    format!(
                        "made for a vocabulary of {}, logits have {vocab}",
                        w.vocab()
                    ),
                ))
            }
            _ => {}
        }
    }
    if let Some(b) = inputs.banned {
        let (r, _) = matrix("banned", b, "[batch, max_banned]")?;
        if r != batch {
            return Err(Error::Shape {
                arg: "banned",
                expected: format!("[{batch}, max_banned]"),
                got: b.shape().to_vec(),
            });
        }
    }
    if let Some(e) = inputs.end_ids {
        if e.shape().len() != 1 {
            return Err(Error::Shape {
                arg: "end_ids",
                expected: "[n]".into(),
                got: e.shape().to_vec(),
            });
        }
    }
    if let Some(l) = inputs.lengths {
        expect_shape("lengths", l, &[batch])?;
    }
    let inputs = k::ProcessInputs {
        history: inputs.history.map(|h| h.tokens),
        history_lens: inputs.history.map(|h| h.lens),
        banned: inputs.banned,
        end_ids: inputs.end_ids,
        lengths: inputs.lengths,
    };
    let ws = ws.map(|w| &mut w.inner);
    launched(
        "process_logits",
        k::process_logits(stream, logits, params.words(), &inputs, ws),
    )
}

/// Penalties only ([`process_logits`] with just a history).
///
/// ```no_run
/// # use fl_sampling::*; use fl_kernels::{DeviceTensor, Gpu};
/// # let gpu = Gpu::new(0)?; let s = gpu.stream();
/// # let mut logits = DeviceTensor::<f32>::zeros(s, &[1, 8])?;
/// # let params = DeviceParams::new(s, &[SamplingParams { frequency_penalty: 0.5, ..Default::default() }])?;
/// let toks = DeviceTensor::from_host(s, &[3i32, 3, 5], &[1, 3])?;
/// let lens = DeviceTensor::from_host(s, &[3i32], &[1])?;
/// let mut ws = PenaltyWorkspace::new(s, 8)?;
/// apply_penalties(s, &mut logits, &params, History { tokens: &toks, lens: &lens }, &mut ws)?;
/// # Ok::<(), fl_sampling::Error>(())
/// ```
pub fn apply_penalties<T: FloatDType>(
    stream: &Arc<CudaStream>,
    logits: &mut DeviceTensor<T>,
    params: &DeviceParams,
    history: History<'_>,
    ws: &mut PenaltyWorkspace,
) -> Result<()> {
    let inputs = Processors {
        history: Some(history),
        ..Default::default()
    };
    process_logits(stream, logits, params, &inputs, Some(ws))
}

/// Banned tokens only: `logits[r, banned[r, j]] = -inf` (negative ids are padding).
///
/// Shapes: `banned` `[batch, max_banned]`. Errors as [`process_logits`].
pub fn ban_tokens<T: FloatDType>(
    stream: &Arc<CudaStream>,
    logits: &mut DeviceTensor<T>,
    params: &DeviceParams,
    banned: &DeviceTensor<i32>,
) -> Result<()> {
    let inputs = Processors {
        banned: Some(banned),
        ..Default::default()
    };
    process_logits(stream, logits, params, &inputs, None)
}

/// End-id masking only: `logits[r, end_ids[j]] = -inf` while `lengths[r] <
/// min_new_tokens` of row `r` (`lengths` absent: 0).
///
/// Shapes: `end_ids` `[n]`, `lengths` `[batch]`. Errors as [`process_logits`].
pub fn mask_end_ids<T: FloatDType>(
    stream: &Arc<CudaStream>,
    logits: &mut DeviceTensor<T>,
    params: &DeviceParams,
    end_ids: &DeviceTensor<i32>,
    lengths: Option<&DeviceTensor<i32>>,
) -> Result<()> {
    let inputs = Processors {
        end_ids: Some(end_ids),
        lengths,
        ..Default::default()
    };
    process_logits(stream, logits, params, &inputs, None)
}
