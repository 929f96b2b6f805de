//! The beam-search step on the device: [`beam_topk`] picks, per request, the best
//! (beam, token) candidates by running log-probability plus log-softmax, over requests of
//! different beam counts in one launch pair. The engine's beam search (`fl_engine::beam`)
//! turns those candidates into running beams and finished hypotheses on the host.
//!
//! Two kernels: blocks over (row, chunk of the vocabulary) each read their chunk once, keeping
//! its max, sum of exp and best logits; one block per request merges them. The CPU
//! reference is [`reference::beam_topk`](crate::reference::beam_topk).

use std::sync::Arc;

use fl_kernels::beam as k;
use fl_kernels::cudarc::driver::CudaStream;
use fl_kernels::{DeviceTensor, FloatDType};

use crate::dev::{expect_shape, launched, matrix};
use crate::{Error, Result};

/// Most candidates kept per request (`FL_BEAM_MAX_KEEP`, 128): the largest `max_keep`
/// (2 x 64 beams, or 3 x 42 beams with two end ids).
pub const BEAM_MAX_KEEP: usize = k::MAX_KEEP;

/// Scratch for [`beam_topk`]: each (row, chunk) block's best logits and its (max, sum of
/// exp). Made for at most `max_rows` rows of `vocab` tokens and `max_keep` candidates per
/// request; any smaller batch (fewer rows, smaller `max_keep`) of the same vocabulary fits.
/// Needs no initialisation; allocate once, reuse every step.
///
/// ```no_run
/// let gpu = fl_kernels::Gpu::new(0)?;
/// let ws = fl_sampling::BeamTopkWorkspace::new(gpu.stream(), 64 * 4, 128_256, 8)?;
/// # Ok::<(), fl_sampling::Error>(())
/// ```
#[derive(Debug)]
pub struct BeamTopkWorkspace {
    buf: DeviceTensor<u8>,
    max_rows: usize,
    vocab: usize,
    max_keep: usize,
}

fn workspace_size(rows: usize, vocab: usize, max_keep: usize) -> Result<usize> {
    // fl-kernels checks the sizes; its refusals stay argument errors of this crate.
    k::beam_topk_workspace_size(rows, vocab, max_keep).map_err(|e| match e {
        fl_kernels::Error::InvalidArgument { arg, reason } => Error::invalid(arg, reason),
        e => e.into(),
    })
}

impl BeamTopkWorkspace {
    /// Scratch for any step of at most `max_rows` rows (beams of every request together) of
    /// `vocab` tokens, keeping at most `max_keep` candidates per request.
    ///
    /// Errors: [`Error::InvalidArgument`] naming `max_keep` (outside `1..=`[`BEAM_MAX_KEEP`]) or
    /// `vocab` (0, or `max_rows * vocab` past `i32::MAX`); allocation errors.
    pub fn new(
        stream: &Arc<CudaStream>,
        max_rows: usize,
        vocab: usize,
        max_keep: usize,
    ) -> Result<Self> {
        let n = workspace_size(max_rows, vocab, max_keep)?;
        Ok(BeamTopkWorkspace {
            buf: DeviceTensor::zeros(stream, &[n.max(1)])?,
            max_rows,
            vocab,
            max_keep,
        })
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.buf.len()
    }

    /// `(max_rows, vocab, max_keep)` it was made for.
    pub fn dims(&self) -> (usize, usize, usize) {
        (self.max_rows, self.vocab, self.max_keep)
    }
}

/// The requests of a [`beam_topk`] step: which rows each owns and how many candidates it
/// wants.
#[derive(Clone, Copy, Debug)]
pub struct BeamRequests<'a> {
    /// `[n_req + 1]` i32: request `r` owns rows `req_start[r] .. req_start[r + 1]` (one row
    /// at a request's first step, its `num_beams` rows later). Read on the device, clamped to
    /// `[0, rows]` and made non-decreasing there; give non-decreasing values from 0 to `rows`.
    pub req_start: &'a DeviceTensor<i32>,
    /// `[n_req]` i32: candidates wanted by each request, `1..=max_keep` (the engine's
    /// `beams_to_keep`). Read on the device: values above `max_keep` or the request's
    /// `rows * vocab` are clamped; values below 1 give no candidates.
    pub keep: &'a DeviceTensor<i32>,
}

/// One beam-search step: for each request `r`, the `keep[r]` best candidates over its rows
/// `b` (local beam `j = b - req_start[r]`) and tokens `v`,
///
/// `score(b, v) = beam_scores[b] + ((x - m_b) - ln(sum_v' exp(x' - m_b)))`, all in f32,
///
/// with `x = f32(logits[b, v])` and `m_b` the row's max (torch's `log_softmax` plus the beam's
/// running sum), sorted by score descending, ties to the smaller flat index
/// `j * vocab + v` (`fl_engine::beam`'s order). `out_scores[r, i]` gets the score and
/// `out_ids[r, i] = j * vocab + v` (beam `id / vocab`, token `id % vocab`); entries past
/// `keep[r]` get `-inf` and `-1`.
///
/// `-inf` logits (banned tokens) score `-inf` and come only after every finite score, in flat
/// index order. A NaN score counts as `-inf`; a row whose finite logits score NaN (it holds
/// NaN or `+inf`, or its beam score is `-inf`) contributes valid ids in an unspecified order.
/// Where two distinct logits of a row round to the same score, which of them is kept at the
/// `keep[r]` boundary follows the logits (see `fl_beam.h`); the CPU reference
/// [`reference::beam_topk`](crate::reference::beam_topk) agrees otherwise (scores to within
/// f32 rounding of the sum of exponentials).
///
/// Shapes: `logits` `[rows, vocab]` (`f32`, `f16`, `bf16`); `beam_scores` `[rows]`;
/// `requests` as [`BeamRequests`] says; `out_scores` `[n_req, max_keep]` f32 and `out_ids`
/// `[n_req, max_keep]` i32, `max_keep` in `1..=`[`BEAM_MAX_KEEP`]; `ws` made for at least `rows`
/// rows, this `vocab` and at least this `max_keep`.
///
/// Errors: [`Error::Shape`] naming `logits`, `beam_scores`, `req_start`, `keep`,
/// `out_scores` or `out_ids`; [`Error::InvalidArgument`] naming `max_keep`, `vocab` or
/// `workspace`. Nothing is launched after an error; the call never waits for the device.
///
/// ```no_run
/// use fl_sampling::{beam_topk, BeamRequests, BeamTopkWorkspace};
/// use fl_kernels::{DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let vocab = 32_000;
/// // Request 0 at its first step (1 row, keep 2 x 4 beams), request 1 with 4 beams.
/// let rows = 5;
/// let logits = DeviceTensor::<f32>::zeros(s, &[rows, vocab])?; // from the LM head
/// let beam_scores = DeviceTensor::from_host(s, &[0.0f32, -1.2, -1.5, -2.0, -2.1], &[rows])?;
/// let req_start = DeviceTensor::from_host(s, &[0i32, 1, 5], &[3])?;
/// let keep = DeviceTensor::from_host(s, &[8i32, 8], &[2])?;
/// let requests = BeamRequests { req_start: &req_start, keep: &keep };
/// let mut ws = BeamTopkWorkspace::new(s, rows, vocab, 8)?;
/// let mut scores = DeviceTensor::<f32>::zeros(s, &[2, 8])?;
/// let mut ids = DeviceTensor::<i32>::zeros(s, &[2, 8])?;
/// beam_topk(s, &logits, &beam_scores, &requests, &mut ws, &mut scores, &mut ids)?;
/// let ids = ids.to_host(s)?; // request 1's best: beam ids[8] / vocab, token ids[8] % vocab
/// # Ok::<(), fl_sampling::Error>(())
/// ```
pub fn beam_topk<T: FloatDType>(
    stream: &Arc<CudaStream>,
    logits: &DeviceTensor<T>,
    beam_scores: &DeviceTensor<f32>,
    requests: &BeamRequests<'_>,
    ws: &mut BeamTopkWorkspace,
    out_scores: &mut DeviceTensor<f32>,
    out_ids: &mut DeviceTensor<i32>,
) -> Result<()> {
    let (rows, vocab) = matrix("logits", logits, "[rows, vocab]")?;
    let (n_req, max_keep) = matrix("out_scores", out_scores, "[n_req, max_keep]")?;
    workspace_size(rows, vocab, max_keep)?;
    expect_shape("beam_scores", beam_scores, &[rows])?;
    expect_shape("req_start", requests.req_start, &[n_req + 1])?;
    expect_shape("keep", requests.keep, &[n_req])?;
    expect_shape("out_ids", out_ids, &[n_req, max_keep])?;
    if ws.vocab != vocab || ws.max_rows < rows || ws.max_keep < max_keep {
        return Err(Error::invalid(
            "workspace",
            format!(
                "made for {} rows of {} tokens keeping {}; this step has {rows} rows of \
                 {vocab} keeping {max_keep}",
                ws.max_rows, ws.vocab, ws.max_keep
            ),
        ));
    }
    if n_req == 0 {
        return Ok(());
    }
    let inputs = k::BeamInputs {
        beam_scores,
        req_start: requests.req_start,
        keep: requests.keep,
    };
    launched(
        "beam_topk",
        k::beam_topk(stream, logits, &inputs, &mut ws.buf, out_scores, out_ids),
    )
}
