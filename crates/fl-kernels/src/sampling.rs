//! The sampling kernels (`kernels/sampling.cu`), one safe launcher each: the sampler
//! ([`sample`]), the logits processors ([`process_logits`]), the decoding-loop bookkeeping
//! ([`decode_update`]) and the Philox words ([`philox_words`]).
//!
//! This is the kernel layer under `fl-sampling`, which is the API to use: it packs and
//! validates the per-request parameters, owns the decoding state and holds the CPU
//! reference whose semantics `kernels/include/fl_sampling.h` spells out. Each function here
//! checks what its launch needs (shapes, vocabulary range, workspace sizes), queues the
//! kernel on the stream and returns without waiting.
//!
//! Parameter records: `params` is `[batch, PARAM_WORDS]` i32, one `fl_sampling_params` per
//! row, as `fl_sampling::DeviceParams` packs them. The kernels use the values in arithmetic
//! and comparisons only (none is an index or a size), so any bits are memory-safe; values
//! outside the documented ranges give unspecified tokens.
//!
//! ```no_run
//! use fl_kernels::sampling::{self, SampleInputs, SampleWorkspace};
//! use fl_kernels::{DeviceTensor, Gpu};
//! let gpu = Gpu::new(0)?;
//! let s = gpu.stream();
//! let logits = DeviceTensor::from_host(s, &[0.1f32, 2.0, 2.0, -1.0], &[1, 4])?;
//! let mut ws = SampleWorkspace::new(s, 1, 4)?;
//! let mut tokens = DeviceTensor::<i32>::zeros(s, &[1])?;
//! sampling::sample(s, &logits, &SampleInputs::default(), &mut tokens, &mut ws)?; // greedy
//! assert_eq!(tokens.to_host(s)?, vec![1]);
//! # Ok::<(), fl_kernels::Error>(())
//! ```

use std::sync::Arc;

use cudarc::driver::{CudaStream, SyncOnDrop};

use crate::dtype::FloatDType;
use crate::error::check;
use crate::tensor::{as_i64, expect_shape, opt_ptr, raw_stream};
use crate::{DeviceTensor, Error, Result};

/// Largest vocabulary the kernels accept (`FL_SAMPLING_MAX_VOCAB`, 2^23).
pub const MAX_VOCAB: usize = fl_kernels_sys::FL_SAMPLING_MAX_VOCAB as usize;

/// Batch size above which no row is split over several blocks (`FL_SAMPLING_MAX_SPLIT_ROWS`).
pub const MAX_SPLIT_ROWS: usize = fl_kernels_sys::FL_SAMPLING_MAX_SPLIT_ROWS as usize;

/// 32-bit words of one row's parameter record (`fl_sampling_params`, 64 bytes).
pub const PARAM_WORDS: usize = 16;

const _: () = assert!(std::mem::size_of::<fl_kernels_sys::fl_sampling_params>() == PARAM_WORDS * 4);

fn check_vocab(vocab: usize) -> Result<()> {
    if vocab == 0 || vocab > MAX_VOCAB {
        return Err(Error::invalid(
            "vocab",
            format!("{vocab} is outside 1..={MAX_VOCAB}"),
        ));
    }
    Ok(())
}

/// `[rows, cols]` of a 2-D tensor, or [`Error::Shape`] naming `arg`.
fn matrix<T: crate::DType>(
    arg: &'static str,
    t: &DeviceTensor<T>,
    what: &str,
) -> Result<(usize, usize)> {
    match *t.shape() {
        [r, c] => Ok((r, c)),
        _ => Err(Error::Shape {
            arg,
            expected: what.to_string(),
            got: t.shape().to_vec(),
        }),
    }
}

/// `n` of a 1-D tensor, or [`Error::Shape`] naming `arg`.
fn vector<T: crate::DType>(arg: &'static str, t: &DeviceTensor<T>) -> Result<usize> {
    match *t.shape() {
        [n] => Ok(n),
        _ => Err(Error::Shape {
            arg,
            expected: "[n]".into(),
            got: t.shape().to_vec(),
        }),
    }
}

/// Checks a parameter array against `batch` rows.
fn check_params(params: &DeviceTensor<i32>, batch: usize) -> Result<()> {
    expect_shape("params", params, &[batch, PARAM_WORDS])
}

/// Bytes of scratch [`sample`] needs for `batch` rows of `vocab` tokens (0 when no row is
/// split).
///
/// Errors: [`Error::InvalidArgument`] naming `vocab` (0 or above [`MAX_VOCAB`]);
/// [`Error::TooLarge`] naming `batch`.
pub fn sample_workspace_size(batch: usize, vocab: usize) -> Result<usize> {
    check_vocab(vocab)?;
    let b = as_i64("batch", batch)?;
    // SAFETY: a pure function of its two integers.
    let n = unsafe { fl_kernels_sys::fl_sample_workspace_size(b, vocab as i64) };
    usize::try_from(n).map_err(|_| Error::invalid("vocab", format!("{vocab} is out of range")))
}

/// Bytes of scratch [`process_logits`] needs for penalties over a vocabulary of `vocab`.
///
/// Errors: [`Error::InvalidArgument`] naming `vocab` (0 or above [`MAX_VOCAB`]).
pub fn penalty_workspace_size(vocab: usize) -> Result<usize> {
    check_vocab(vocab)?;
    // SAFETY: a pure function of its integer argument.
    let n = unsafe { fl_kernels_sys::fl_penalty_workspace_size(vocab as i64) };
    usize::try_from(n).map_err(|_| Error::invalid("vocab", format!("{vocab} is out of range")))
}

/// Scratch for [`sample`]: barrier counters and histograms of rows split over several
/// blocks. Zero-filled when made; the kernel leaves it zero-ready after every call, which is
/// why the buffer is private.
#[derive(Debug)]
pub struct SampleWorkspace {
    buf: Option<DeviceTensor<u8>>,
}

impl SampleWorkspace {
    /// Scratch for any batch of at most `max_batch` rows of `vocab` tokens.
    ///
    /// Errors: [`Error::InvalidArgument`] naming `vocab`; allocation errors.
    pub fn new(stream: &Arc<CudaStream>, max_batch: usize, vocab: usize) -> Result<Self> {
        let n = sample_workspace_size(max_batch.min(MAX_SPLIT_ROWS), vocab)?;
        let buf = if n > 0 {
            Some(DeviceTensor::zeros(stream, &[n])?)
        } else {
            None
        };
        Ok(SampleWorkspace { buf })
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.buf.as_ref().map_or(0, |b| b.len())
    }

    /// Pointer and byte count for a launch (NULL and 0 when empty).
    fn arm<'a>(&'a mut self, s: &'a CudaStream) -> Result<(u64, i64, Option<SyncOnDrop<'a>>)> {
        match self.buf.as_mut() {
            Some(b) => {
                let n = as_i64("workspace", b.len())?;
                let (p, g) = b.ptr_mut(s);
                Ok((p, n, Some(g)))
            }
            None => Ok((0, 0, None)),
        }
    }
}

/// Scratch for the penalties of [`process_logits`]: one i32 count per token for
/// `FL_PENALTY_ROWS` rows at a time. Zero-filled when made; the kernel leaves it zeroed.
#[derive(Debug)]
pub struct PenaltyWorkspace {
    buf: DeviceTensor<u8>,
    vocab: usize,
}

impl PenaltyWorkspace {
    /// Scratch for a vocabulary of `vocab` tokens.
    ///
    /// Errors: [`Error::InvalidArgument`] naming `vocab`; allocation errors.
    pub fn new(stream: &Arc<CudaStream>, vocab: usize) -> Result<Self> {
        let n = penalty_workspace_size(vocab)?;
        Ok(PenaltyWorkspace {
            buf: DeviceTensor::zeros(stream, &[n])?,
            vocab,
        })
    }

    /// The vocabulary size it was made for.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.buf.len()
    }
}

/// The optional inputs of [`sample`].
#[derive(Clone, Copy, Debug, Default)]
pub struct SampleInputs<'a> {
    /// Parameter records, `[batch, PARAM_WORDS]` (absent: every row greedy).
    pub params: Option<&'a DeviceTensor<i32>>,
    /// Philox step per row, `[batch]` (absent: 0).
    pub steps: Option<&'a DeviceTensor<i32>>,
    /// Finished flags, `[batch]`; finished rows get `pad_id` and are not sampled.
    pub finished: Option<&'a DeviceTensor<u8>>,
    /// Token written for finished rows.
    pub pad_id: i32,
}

/// Samples one token per row of `logits` (`fl_sample`): greedy where a row's temperature
/// is 0 or `params` is absent, else temperature, top-k, top-p and min-p as the row's record
/// says, drawn with the row's Philox stream at its step.
///
/// Shapes: `logits` `[batch, vocab]` (`f32`, `f16`, `bf16`); `tokens` `[batch]` (written);
/// the inputs as [`SampleInputs`] says.
///
/// Errors: [`Error::Shape`] naming `logits`, `params`, `steps`, `finished` or `tokens`;
/// [`Error::InvalidArgument`] naming `vocab` or `workspace` (made for a smaller batch);
/// [`Error::Cuda`] for `sample`.
pub fn sample<T: FloatDType>(
    stream: &CudaStream,
    logits: &DeviceTensor<T>,
    inputs: &SampleInputs<'_>,
    tokens: &mut DeviceTensor<i32>,
    ws: &mut SampleWorkspace,
) -> Result<()> {
    let (batch, vocab) = matrix("logits", logits, "[batch, vocab]")?;
    check_vocab(vocab)?;
    if let Some(p) = inputs.params {
        check_params(p, batch)?;
    }
    if let Some(st) = inputs.steps {
        expect_shape("steps", st, &[batch])?;
    }
    if let Some(f) = inputs.finished {
        expect_shape("finished", f, &[batch])?;
    }
    expect_shape("tokens", tokens, &[batch])?;
    let need = sample_workspace_size(batch, vocab)?;
    if ws.bytes() < need {
        return Err(Error::invalid(
            "workspace",
            format!(
                "{} bytes, {need} needed for {batch} rows of {vocab}",
                ws.bytes()
            ),
        ));
    }
    if batch == 0 {
        return Ok(());
    }
    let (b, v) = (as_i64("logits", batch)?, as_i64("logits", vocab)?);
    let (pl, _gl) = logits.ptr(stream);
    let (pp, _gp) = opt_ptr(inputs.params, stream);
    let (pst, _gst) = opt_ptr(inputs.steps, stream);
    let (pf, _gf) = opt_ptr(inputs.finished, stream);
    let (pw, wsb, _gw) = ws.arm(stream)?;
    let (pt, _gt) = tokens.ptr_mut(stream);
    // SAFETY: logits hold batch * vocab elements of T; params (when present) batch records;
    // steps, finished and tokens batch elements; the workspace holds at least the bytes the
    // launcher needs for this batch and vocab and is zero-ready (shapes and size checked
    // above). The guards keep every buffer alive until the launch is queued.
    let status = unsafe {
        fl_kernels_sys::fl_sample(
            T::ID,
            pl as _,
            b,
            v,
            pp as _,
            pst as _,
            pf as _,
            inputs.pad_id,
            pt as _,
            pw as _,
            wsb,
            raw_stream(stream),
        )
    };
    check("sample", status)
}

/// The optional inputs of [`process_logits`]; each processor runs only when its input is
/// present.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessInputs<'a> {
    /// Token history for the penalties, `[batch, max_history]` (needs `history_lens` and a
    /// [`PenaltyWorkspace`]).
    pub history: Option<&'a DeviceTensor<i32>>,
    /// Valid length of each history row, `[batch]`.
    pub history_lens: Option<&'a DeviceTensor<i32>>,
    /// Banned ids per row, `[batch, max_banned]` (negative ids are padding).
    pub banned: Option<&'a DeviceTensor<i32>>,
    /// End ids, `[n]`, masked while a row is under its `min_new_tokens`.
    pub end_ids: Option<&'a DeviceTensor<i32>>,
    /// Tokens generated so far per row, `[batch]` (absent: 0), for the end-id mask.
    pub lengths: Option<&'a DeviceTensor<i32>>,
}

/// Runs the logits processors present in `inputs` on `logits`, in place, in one launch
/// (`fl_process_logits`): penalties over the history, banned tokens, end ids under
/// `min_new_tokens`, in that order per row.
///
/// Shapes: `logits` `[batch, vocab]` (`f32`, `f16`, `bf16`); `params` `[batch, PARAM_WORDS]`;
/// the inputs as [`ProcessInputs`] says. `ws` is required with a history and must be made
/// for `vocab`.
///
/// Errors: [`Error::Shape`] naming the tensor at fault; [`Error::InvalidArgument`] naming
/// `vocab`, `history_lens` (missing with a history) or `workspace` (missing, or made for
/// another vocabulary); [`Error::Cuda`] for `process_logits`.
pub fn process_logits<T: FloatDType>(
    stream: &CudaStream,
    logits: &mut DeviceTensor<T>,
    params: &DeviceTensor<i32>,
    inputs: &ProcessInputs<'_>,
    ws: Option<&mut PenaltyWorkspace>,
) -> Result<()> {
    let (batch, vocab) = matrix("logits", logits, "[batch, vocab]")?;
    check_vocab(vocab)?;
    check_params(params, batch)?;
    let mut max_history = 0usize;
    if let Some(h) = inputs.history {
        let (r, mh) = matrix("history", h, "[batch, max_history]")?;
        if r != batch {
            return Err(Error::Shape {
                arg: "history",
                expected: format!("[{batch}, max_history]"),
                got: h.shape().to_vec(),
            });
        }
        match inputs.history_lens {
            Some(l) => expect_shape("history_lens", l, &[batch])?,
            None => return Err(Error::invalid("history_lens", "required with a history")),
        }
        match ws.as_ref() {
            None => return Err(Error::invalid("workspace", "penalties need a workspace")),
            Some(w) if w.vocab != vocab => {
                return Err(Error::invalid(
                    "workspace",
                    format!("made for a vocabulary of {}, logits have {vocab}", w.vocab),
                ))
            }
            _ => {}
        }
        max_history = mh;
    }
    let mut max_banned = 0usize;
    if let Some(b) = inputs.banned {
        let (r, mb) = matrix("banned", b, "[batch, max_banned]")?;
        if r != batch {
            return Err(Error::Shape {
                arg: "banned",
                expected: format!("[{batch}, max_banned]"),
                got: b.shape().to_vec(),
            });
        }
        max_banned = mb;
    }
    let n_end = inputs.end_ids.map(|e| vector("end_ids", e)).transpose()?;
    if let Some(l) = inputs.lengths {
        expect_shape("lengths", l, &[batch])?;
    }
    if batch == 0 {
        return Ok(());
    }
    let (b, v) = (as_i64("logits", batch)?, as_i64("logits", vocab)?);
    let mh = as_i64("history", max_history)?;
    let mb = as_i64("banned", max_banned)?;
    let ne = as_i64("end_ids", n_end.unwrap_or(0))?;
    let (pp, _gp) = params.ptr(stream);
    let (ph, _gh) = opt_ptr(inputs.history, stream);
    let (phl, _ghl) = opt_ptr(inputs.history.and(inputs.history_lens), stream);
    let (pb, _gb) = opt_ptr(inputs.banned, stream);
    let (pl, _gl) = opt_ptr(inputs.lengths, stream);
    let (pe, _ge) = opt_ptr(inputs.end_ids, stream);
    let (pw, wsb, _gw) = match (inputs.history.is_some(), ws) {
        (true, Some(w)) => {
            let n = as_i64("workspace", w.buf.len())?;
            let (p, g) = w.buf.ptr_mut(stream);
            (p, n, Some(g))
        }
        _ => (0, 0, None),
    };
    let (px, _gx) = logits.ptr_mut(stream);
    // SAFETY: logits hold batch * vocab elements of T; params batch records; history
    // [batch, max_history] and its lengths [batch]; banned [batch, max_banned]; lengths
    // [batch]; end_ids n_end ids (all checked above); the workspace was made for this vocab
    // and is zeroed. Absent inputs are NULL with size 0. The guards keep every buffer alive
    // until the launch is queued.
    let status = unsafe {
        fl_kernels_sys::fl_process_logits(
            T::ID,
            px as _,
            b,
            v,
            pp as _,
            ph as _,
            phl as _,
            mh,
            pb as _,
            mb,
            pl as _,
            pe as _,
            ne,
            pw as _,
            wsb,
            raw_stream(stream),
        )
    };
    check("process_logits", status)
}

/// The per-row state [`decode_update`] reads and writes.
#[derive(Debug)]
pub struct DecodeBuffers<'a> {
    /// Finished flags, `[batch]` u8.
    pub finished: &'a mut DeviceTensor<u8>,
    /// Tokens generated so far, `[batch]`.
    pub lengths: &'a mut DeviceTensor<i32>,
    /// Generated tokens, `[batch, max_history]` (absent: none kept).
    pub history: Option<&'a mut DeviceTensor<i32>>,
    /// Set to 1 when every row is finished afterwards, else 0, `[1]` (absent: not written).
    pub all_finished: Option<&'a mut DeviceTensor<i32>>,
}

/// The bookkeeping after a sampling step, in one launch (`fl_decode_update`): a row
/// finished on entry gets `tokens[r] = pad_id`; any other appends its token to the history
/// (when there is room), counts it in `lengths`, and finishes on an end id or on reaching
/// its `max_new_tokens` (when `params` are given); then `all_finished` is updated.
///
/// Shapes: `tokens` `[batch]`; `params` `[batch, PARAM_WORDS]`; `end_ids` `[n]`; the state
/// as [`DecodeBuffers`] says.
///
/// Errors: [`Error::Shape`] naming `tokens`, `params`, `end_ids`, `finished`, `lengths`,
/// `history` or `all_finished`; [`Error::Cuda`] for `decode_update`.
pub fn decode_update(
    stream: &CudaStream,
    tokens: &mut DeviceTensor<i32>,
    state: DecodeBuffers<'_>,
    params: Option<&DeviceTensor<i32>>,
    end_ids: Option<&DeviceTensor<i32>>,
    pad_id: i32,
) -> Result<()> {
    let batch = vector("tokens", tokens)?;
    if let Some(p) = params {
        check_params(p, batch)?;
    }
    let n_end = end_ids.map(|e| vector("end_ids", e)).transpose()?;
    expect_shape("finished", state.finished, &[batch])?;
    expect_shape("lengths", state.lengths, &[batch])?;
    let mut max_history = 0usize;
    if let Some(h) = state.history.as_deref() {
        let (r, mh) = matrix("history", h, "[batch, max_history]")?;
        if r != batch {
            return Err(Error::Shape {
                arg: "history",
                expected: format!("[{batch}, max_history]"),
                got: h.shape().to_vec(),
            });
        }
        max_history = mh;
    }
    if let Some(a) = state.all_finished.as_deref() {
        expect_shape("all_finished", a, &[1])?;
    }
    let b = as_i64("tokens", batch)?;
    let ne = as_i64("end_ids", n_end.unwrap_or(0))?;
    let mh = as_i64("history", max_history)?;
    let (pp, _gp) = opt_ptr(params, stream);
    let (pe, _ge) = opt_ptr(end_ids, stream);
    let (pt, _gt) = tokens.ptr_mut(stream);
    let (pf, _gf) = state.finished.ptr_mut(stream);
    let (pl, _gl) = state.lengths.ptr_mut(stream);
    let (ph, _gh) = match state.history {
        Some(h) => {
            let (p, g) = h.ptr_mut(stream);
            (p, Some(g))
        }
        None => (0, None),
    };
    let (pa, _ga) = match state.all_finished {
        Some(a) => {
            let (p, g) = a.ptr_mut(stream);
            (p, Some(g))
        }
        None => (0, None),
    };
    // SAFETY: tokens, finished and lengths hold batch elements; history [batch,
    // max_history]; params batch records; end_ids n_end ids; all_finished one i32 (all
    // checked above); the &mut borrows are distinct, so no output aliases another. The guards
    // keep every buffer alive until the launch is queued.
    let status = unsafe {
        fl_kernels_sys::fl_decode_update(
            pt as _,
            pf as _,
            pl as _,
            b,
            pp as _,
            pe as _,
            ne,
            pad_id,
            ph as _,
            mh,
            pa as _,
            raw_stream(stream),
        )
    };
    check("decode_update", status)
}

/// The four 32-bit Philox words of each row at its step (`fl_philox_words`):
/// `out[r, j]` = word `j` of Philox4x32-10 keyed by the row's seed, counter
/// `{steps[r], 0, request_lo, request_hi}` (u32 bits in i32); [`sample`] uses word 0.
///
/// Shapes: `params` `[batch, PARAM_WORDS]`, `steps` `[batch]` (absent: step 0), `out`
/// `[batch, 4]`.
///
/// Errors: [`Error::Shape`] naming `params`, `steps` or `out`; [`Error::Cuda`] for
/// `philox_words`.
pub fn philox_words(
    stream: &CudaStream,
    params: &DeviceTensor<i32>,
    steps: Option<&DeviceTensor<i32>>,
    out: &mut DeviceTensor<i32>,
) -> Result<()> {
    let (batch, _) = matrix("params", params, "[batch, PARAM_WORDS]")?;
    check_params(params, batch)?;
    if let Some(st) = steps {
        expect_shape("steps", st, &[batch])?;
    }
    expect_shape("out", out, &[batch, 4])?;
    if batch == 0 {
        return Ok(());
    }
    let b = as_i64("params", batch)?;
    let (pp, _gp) = params.ptr(stream);
    let (ps, _gs) = opt_ptr(steps, stream);
    let (po, _go) = out.ptr_mut(stream);
    // SAFETY: params hold batch records, steps batch i32 and out batch * 4 words (checked
    // above). The guards keep every buffer alive until the launch is queued.
    let status = unsafe {
        fl_kernels_sys::fl_philox_words(pp as _, ps as _, b, po as _, raw_stream(stream))
    };
    check("philox_words", status)
}
