//! Decoding-loop bookkeeping on the device: finished flags, generated lengths, the token
//! history, an "all finished" flag the loop reads when it wants ([`DecodeState`],
//! [`decode_update`]), and [`Sampler`], which chains processors, sampler and bookkeeping
//! for one decoding step without a host sync.

use std::sync::Arc;

use fl_kernels::cudarc::driver::CudaStream;
use fl_kernels::sampling as k;
use fl_kernels::{DeviceTensor, FloatDType};

use crate::dev::{expect_shape, launched};
use crate::processors::{process_logits, History, PenaltyWorkspace, Processors};
use crate::sampler::{sample, SampleOptions, SampleWorkspace};
use crate::{DeviceParams, Error, Result, SamplingParams};

/// Per-sequence state of a decoding loop, on the device.
///
/// - `finished` `[batch]` u8: a finished row emits the pad id and stays finished;
/// - `lengths` `[batch]` i32: tokens generated so far (also the Philox step and the
///   `min_new_tokens` / `max_new_tokens` counter);
/// - `history` `[batch, max_history]` i32 (when `max_history > 0`): the generated tokens,
///   for the penalties;
/// - `all_finished` `[1]` i32: 1 once every row is finished, updated on the device by
///   every [`decode_update`]; read it when convenient ([`all_finished`](Self::all_finished)
///   copies 4 bytes and waits).
#[derive(Debug)]
pub struct DecodeState {
    finished: DeviceTensor<u8>,
    lengths: DeviceTensor<i32>,
    history: Option<DeviceTensor<i32>>,
    all_finished: DeviceTensor<i32>,
}

impl DecodeState {
    /// A fresh state: nothing finished, lengths 0, history of `max_history` tokens per row
    /// (none when 0).
    pub fn new(stream: &Arc<CudaStream>, batch: usize, max_history: usize) -> Result<Self> {
        Ok(DecodeState {
            finished: DeviceTensor::zeros(stream, &[batch])?,
            lengths: DeviceTensor::zeros(stream, &[batch])?,
            history: if max_history > 0 {
                Some(DeviceTensor::filled(stream, &[batch, max_history], -1)?)
            } else {
                None
            },
            all_finished: DeviceTensor::zeros(stream, &[1])?,
        })
    }

    /// Number of rows.
    pub fn batch(&self) -> usize {
        self.lengths.len()
    }

    /// Finished flags, `[batch]`.
    pub fn finished(&self) -> &DeviceTensor<u8> {
        &self.finished
    }

    /// Finished flags, writable (e.g. to retire a row from the host).
    pub fn finished_mut(&mut self) -> &mut DeviceTensor<u8> {
        &mut self.finished
    }

    /// Generated lengths, `[batch]`.
    pub fn lengths(&self) -> &DeviceTensor<i32> {
        &self.lengths
    }

    /// Generated lengths, writable.
    pub fn lengths_mut(&mut self) -> &mut DeviceTensor<i32> {
        &mut self.lengths
    }

    /// The generated tokens, `[batch, max_history]` (unwritten slots hold -1).
    pub fn history(&self) -> Option<&DeviceTensor<i32>> {
        self.history.as_ref()
    }

    /// The device-side flag, `[1]` i32: 1 when every row is finished.
    pub fn all_finished_flag(&self) -> &DeviceTensor<i32> {
        &self.all_finished
    }

    /// Reads the flag (copies 4 bytes to the host: waits for the stream).
    pub fn all_finished(&self, stream: &Arc<CudaStream>) -> Result<bool> {
        Ok(self
            .all_finished
            .to_host(stream)?
            .first()
            .is_some_and(|&v| v != 0))
    }
}

/// The bookkeeping step after sampling, on the device, in one launch.
///
/// For each row: a row finished on entry gets `tokens[r] = pad_id`; otherwise its token is
/// appended to the history (when there is room), `lengths[r] += 1`, and the row finishes if
/// the token is one of `end_ids` or `lengths[r]` reached the row's `max_new_tokens` (when
/// `params` are given and it is > 0). Then `all_finished = 1` if every row is finished.
/// The end token itself is emitted and counted.
///
/// Shapes: `tokens` `[batch]`; `params` `batch` rows; `end_ids` `[n]` (may be empty).
///
/// Errors: [`Error::Shape`] naming `tokens`, `params` or `end_ids`.
///
/// ```no_run
/// use fl_sampling::{decode_update, DecodeState};
/// use fl_kernels::{DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let mut state = DecodeState::new(s, 2, 0)?;
/// let end_ids = DeviceTensor::from_host(s, &[2i32], &[1])?;
/// let mut tokens = DeviceTensor::from_host(s, &[2i32, 7], &[2])?;
/// decode_update(s, &mut tokens, &mut state, None, &end_ids, 0)?;
/// assert_eq!(state.finished().to_host(s)?, vec![1, 0]);
/// assert!(!state.all_finished(s)?);
/// # Ok::<(), fl_sampling::Error>(())
/// ```
pub fn decode_update(
    stream: &Arc<CudaStream>,
    tokens: &mut DeviceTensor<i32>,
    state: &mut DecodeState,
    params: Option<&DeviceParams>,
    end_ids: &DeviceTensor<i32>,
    pad_id: i32,
) -> Result<()> {
    let batch = state.batch();
    expect_shape("tokens", tokens, &[batch])?;
    if let Some(p) = params {
        if p.batch() != batch {
            return Err(Error::Shape {
                arg: "params",
                expected: format!("{batch} rows"),
                got: vec![p.batch()],
            });
        }
    }
    if end_ids.shape().len() != 1 {
        return Err(Error::Shape {
            arg: "end_ids",
            expected: "[n]".into(),
            got: end_ids.shape().to_vec(),
        });
    }
    let bufs = k::DecodeBuffers {
        finished: &mut state.finished,
        lengths: &mut state.lengths,
        history: state.history.as_mut(),
        all_finished: Some(&mut state.all_finished),
    };
    launched(
        "decode_update",
        k::decode_update(
            stream,
            tokens,
            bufs,
            params.map(DeviceParams::words),
            Some(end_ids),
            pad_id,
        ),
    )
}

/// Settings of a [`Sampler`] that are not per request.
#[derive(Clone, Debug, Default)]
pub struct SamplerConfig {
    /// End-of-sequence ids (several allowed; may be empty).
    pub end_ids: Vec<i32>,
    /// Token emitted by finished rows.
    pub pad_id: i32,
    /// Tokens of history kept per row for the penalties (0: none; required > 0 when a
    /// row has penalties).
    pub max_history: usize,
}

/// One decoding step on the device, with no host sync: processors (penalties over the
/// generated tokens, end-id masking under `min_new_tokens`), [`sample`] (Philox step = the
/// row's generated length; finished rows skipped) and [`decode_update`].
///
/// ```no_run
/// use fl_sampling::{Sampler, SamplerConfig, SamplingParams};
/// use fl_kernels::{DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let vocab = 32_000;
/// let rows = vec![SamplingParams { temperature: 0.7, top_p: 0.9, max_new_tokens: 16, seed: 1, ..Default::default() }; 4];
/// let cfg = SamplerConfig { end_ids: vec![2], pad_id: 0, max_history: 0 };
/// let mut sampler = Sampler::new(s, &rows, vocab, &cfg)?;
/// let mut logits = DeviceTensor::<f32>::zeros(s, &[4, vocab])?;
/// let mut tokens = DeviceTensor::<i32>::zeros(s, &[4])?;
/// for step in 0.. {
///     // ... the model writes `logits` for the last tokens ...
///     sampler.step(s, &mut logits, &mut tokens)?; // queued: no sync
///     if step % 8 == 7 && sampler.all_finished(s)? {  // a 4-byte read now and then
///         break;
///     }
/// }
/// # Ok::<(), fl_sampling::Error>(())
/// ```
#[derive(Debug)]
pub struct Sampler {
    params: DeviceParams,
    state: DecodeState,
    end_ids: DeviceTensor<i32>,
    pad_id: i32,
    vocab: usize,
    sample_ws: SampleWorkspace,
    penalty_ws: Option<PenaltyWorkspace>,
    penalties: bool,
    min_new: bool,
}

impl Sampler {
    /// A sampler for `params.len()` requests over a vocabulary of `vocab`.
    ///
    /// Errors: [`Error::Param`] for a row's parameter out of range;
    /// [`Error::InvalidArgument`] naming `config.max_history` when a row has penalties and
    /// no history is kept, or `vocab`.
    pub fn new(
        stream: &Arc<CudaStream>,
        params: &[SamplingParams],
        vocab: usize,
        config: &SamplerConfig,
    ) -> Result<Self> {
        let dp = DeviceParams::new(stream, params)?;
        let penalties = params.iter().any(SamplingParams::has_penalties);
        if penalties && config.max_history == 0 {
            return Err(Error::invalid(
                "config.max_history",
                "a row has penalties: keep a history (max_history > 0)",
            ));
        }
        let min_new = !config.end_ids.is_empty() && params.iter().any(|p| p.min_new_tokens > 0);
        let n = config.end_ids.len();
        Ok(Sampler {
            state: DecodeState::new(stream, params.len(), config.max_history)?,
            end_ids: DeviceTensor::from_host(stream, &config.end_ids, &[n])?,
            pad_id: config.pad_id,
            vocab,
            sample_ws: SampleWorkspace::new(stream, params.len(), vocab)?,
            penalty_ws: if penalties {
                Some(PenaltyWorkspace::new(stream, vocab)?)
            } else {
                None
            },
            params: dp,
            penalties,
            min_new,
        })
    }

    /// Processes `logits` in place (when any row needs it), samples into `tokens`
    /// (`[batch]`, finished rows get the pad id) and updates the state.
    ///
    /// Errors: [`Error::Shape`] naming `logits` (not `[batch, vocab]`) or `tokens`.
    pub fn step<T: FloatDType>(
        &mut self,
        stream: &Arc<CudaStream>,
        logits: &mut DeviceTensor<T>,
        tokens: &mut DeviceTensor<i32>,
    ) -> Result<()> {
        expect_shape("logits", logits, &[self.state.batch(), self.vocab])?;
        if self.penalties || self.min_new {
            let history = match (&self.state.history, self.penalties) {
                (Some(h), true) => Some(History {
                    tokens: h,
                    lens: &self.state.lengths,
                }),
                _ => None,
            };
            let inputs = Processors {
                history,
                banned: None,
                end_ids: self.min_new.then_some(&self.end_ids),
                lengths: Some(&self.state.lengths),
            };
            process_logits(
                stream,
                logits,
                &self.params,
                &inputs,
                self.penalty_ws.as_mut(),
            )?;
        }
        let opts = SampleOptions {
            steps: Some(&self.state.lengths),
            finished: Some(&self.state.finished),
            pad_id: self.pad_id,
        };
        sample(
            stream,
            logits,
            &self.params,
            &opts,
            tokens,
            &mut self.sample_ws,
        )?;
        decode_update(
            stream,
            tokens,
            &mut self.state,
            Some(&self.params),
            &self.end_ids,
            self.pad_id,
        )
    }

    /// The decoding state (finished flags, lengths, history).
    pub fn state(&self) -> &DecodeState {
        &self.state
    }

    /// The per-row parameters on the device.
    pub fn params(&self) -> &DeviceParams {
        &self.params
    }

    /// Whether every row is finished (reads the device flag: waits for the stream).
    pub fn all_finished(&self, stream: &Arc<CudaStream>) -> Result<bool> {
        self.state.all_finished(stream)
    }
}
