//! The sampler: [`sample`] (per-row greedy, multinomial, top-k, top-p, min-p, with
//! temperature) and [`greedy`], on `[batch, vocab]` logits.
//!
//! Sort-free: a max pass, a radix select per threshold (histograms of counts and of
//! fixed-point masses over 11/11/10-bit digits of the logits' order-preserving keys), one
//! sampling pass. Small batches split each row over many blocks. The CPU reference is
//! [`reference::plan_row`](crate::reference::plan_row) /
//! [`reference::sample`](crate::reference::sample); GPU and CPU agree bit for bit.

use std::sync::Arc;

use fl_kernels::cudarc::driver::CudaStream;
use fl_kernels::sampling as k;
use fl_kernels::{DeviceTensor, FloatDType};

use crate::dev::{expect_shape, launched, matrix};
use crate::{DeviceParams, Error, Result};

/// Largest vocabulary the sampler accepts (`FL_SAMPLING_MAX_VOCAB`, 2^23).
pub const MAX_VOCAB: usize = k::MAX_VOCAB;

/// Scratch for [`sample`] and [`greedy`]: barrier counters and histograms of rows split
/// over several blocks (about 73 KiB per row, only for batches of at most 128 rows; none
/// otherwise). Allocate once per batch size and vocabulary, reuse every step.
///
/// ```no_run
/// let gpu = fl_kernels::Gpu::new(0)?;
/// let ws = fl_sampling::SampleWorkspace::new(gpu.stream(), 64, 128_256)?;
/// # Ok::<(), fl_sampling::Error>(())
/// ```
#[derive(Debug)]
pub struct SampleWorkspace {
    inner: k::SampleWorkspace,
}

fn workspace_size(batch: usize, vocab: usize) -> Result<usize> {
    check_vocab(vocab)?;
    Ok(k::sample_workspace_size(batch, vocab)?)
}

fn check_vocab(vocab: usize) -> Result<()> {
    if vocab == 0 || vocab > MAX_VOCAB {
        return Err(Error::invalid(
            "vocab",
            format!("{vocab} is outside 1..={MAX_VOCAB}"),
        ));
    }
    Ok(())
}

impl SampleWorkspace {
    /// Scratch for any batch of at most `max_batch` rows of `vocab` tokens (zero-filled,
    /// as the kernel requires).
    ///
    /// Errors: [`Error::InvalidArgument`] naming `vocab` when it is 0 or above
    /// [`MAX_VOCAB`]; allocation errors.
    pub fn new(stream: &Arc<CudaStream>, max_batch: usize, vocab: usize) -> Result<Self> {
        check_vocab(vocab)?;
        Ok(SampleWorkspace {
            inner: k::SampleWorkspace::new(stream, max_batch, vocab)?,
        })
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.inner.bytes()
    }
}

/// Optional inputs of [`sample`] and [`greedy`].
#[derive(Clone, Copy, Debug, Default)]
pub struct SampleOptions<'a> {
    /// Philox step per row, `[batch]` (absent: 0). In a decoding loop: the number of tokens
    /// the row has generated (`DecodeState::lengths`).
    pub steps: Option<&'a DeviceTensor<i32>>,
    /// Finished flags, `[batch]`; finished rows are not sampled and get `pad_id`.
    pub finished: Option<&'a DeviceTensor<u8>>,
    /// Token written for finished rows.
    pub pad_id: i32,
}

/// Samples one token per row of `logits` with each row's parameters.
///
/// Per row (logits in f32; NaN reads as -inf, +inf as `f32::MAX`): temperature 0 means
/// greedy (lowest index of the largest logit); otherwise, with `M` the largest logit and
/// `e_i = exp((x_i - M) / T)`, the kept set is the intersection of top-k (logit `>=` the
/// k-th largest), top-p (smallest upper set of the top-k set with mass `>= top_p`) and
/// min-p (`e_i >= min_p`), ties at a boundary always kept; the token is drawn from the
/// kept tokens in proportion to `e_i` (fixed point, `trunc(e_i * 2^40)`) by inverse CDF in
/// token order with the uniform of [`philox::uniform_word`](crate::philox::uniform_word)
/// at the row's step. A row whose logits are all -inf/NaN returns token 0.
///
/// Shapes: `logits` `[batch, vocab]` (`f32`, `f16`, `bf16`), `params` `batch` rows,
/// `tokens` `[batch]` (written), `opts.steps` and `opts.finished` `[batch]`.
///
/// Errors: [`Error::Shape`] naming `logits`, `params`, `tokens`, `steps` or `finished`;
/// [`Error::InvalidArgument`] naming `vocab` (0 or above [`MAX_VOCAB`]) or `workspace`
/// (made for a smaller batch).
///
/// ```no_run
/// use fl_sampling::{sample, DeviceParams, SampleOptions, SampleWorkspace, SamplingParams};
/// use fl_kernels::{DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let (batch, vocab) = (2, 32_000);
/// let logits = DeviceTensor::from_host(s, &vec![0.5f32; batch * vocab], &[batch, vocab])?;
/// let rows = [SamplingParams::greedy(),
///             SamplingParams { temperature: 0.8, top_k: 50, top_p: 0.9, seed: 1, ..Default::default() }];
/// let params = DeviceParams::new(s, &rows)?;
/// let mut ws = SampleWorkspace::new(s, batch, vocab)?;
/// let mut tokens = DeviceTensor::<i32>::zeros(s, &[batch])?;
/// sample(s, &logits, &params, &SampleOptions::default(), &mut tokens, &mut ws)?;
/// println!("{:?}", tokens.to_host(s)?);
/// # Ok::<(), fl_sampling::Error>(())
/// ```
pub fn sample<T: FloatDType>(
    stream: &Arc<CudaStream>,
    logits: &DeviceTensor<T>,
    params: &DeviceParams,
    opts: &SampleOptions<'_>,
    tokens: &mut DeviceTensor<i32>,
    ws: &mut SampleWorkspace,
) -> Result<()> {
    let (batch, _) = matrix("logits", logits, "[batch, vocab]")?;
    if params.batch() != batch {
        return Err(Error::Shape {
            arg: "params",
            expected: format!("{batch} rows (logits' batch)"),
            got: vec![params.batch()],
        });
    }
    launch(stream, logits, Some(params), opts, tokens, ws, "sample")
}

/// Greedy decoding of every row: the lowest index holding the largest logit (NaN reads as
/// -inf), as [`sample`] with temperature 0 everywhere, without parameters.
///
/// Shapes and errors as [`sample`] (no `params`).
///
/// ```no_run
/// use fl_sampling::{greedy, SampleOptions, SampleWorkspace};
/// use fl_kernels::{DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let logits = DeviceTensor::from_host(s, &[0.1f32, 2.0, 2.0, -1.0], &[1, 4])?;
/// let mut ws = SampleWorkspace::new(s, 1, 4)?;
/// let mut tokens = DeviceTensor::<i32>::zeros(s, &[1])?;
/// greedy(s, &logits, &SampleOptions::default(), &mut tokens, &mut ws)?;
/// assert_eq!(tokens.to_host(s)?, vec![1]);
/// # Ok::<(), fl_sampling::Error>(())
/// ```
pub fn greedy<T: FloatDType>(
    stream: &Arc<CudaStream>,
    logits: &DeviceTensor<T>,
    opts: &SampleOptions<'_>,
    tokens: &mut DeviceTensor<i32>,
    ws: &mut SampleWorkspace,
) -> Result<()> {
    launch(stream, logits, None, opts, tokens, ws, "greedy")
}

fn launch<T: FloatDType>(
    stream: &Arc<CudaStream>,
    logits: &DeviceTensor<T>,
    params: Option<&DeviceParams>,
    opts: &SampleOptions<'_>,
    tokens: &mut DeviceTensor<i32>,
    ws: &mut SampleWorkspace,
    op: &'static str,
) -> Result<()> {
    let (batch, vocab) = matrix("logits", logits, "[batch, vocab]")?;
    check_vocab(vocab)?;
    expect_shape("tokens", tokens, &[batch])?;
    if let Some(st) = opts.steps {
        expect_shape("steps", st, &[batch])?;
    }
    if let Some(f) = opts.finished {
        expect_shape("finished", f, &[batch])?;
    }
    let need = workspace_size(batch, vocab)?;
    if ws.bytes() < need {
        return Err(Error::invalid(
            "workspace",
            format!(
                "{} bytes, {need} needed for {batch} rows of {vocab} (make it with a larger max_batch)",
                ws.bytes()
            ),
        ));
    }
    let inputs = k::SampleInputs {
        params: params.map(DeviceParams::words),
        steps: opts.steps,
        finished: opts.finished,
        pad_id: opts.pad_id,
    };
    launched(
        op,
        k::sample(stream, logits, &inputs, tokens, &mut ws.inner),
    )
}
