//! The beam-search step kernel (`kernels/beam.cu`): [`beam_topk`], per request the best
//! (beam, token) candidates by running log-probability plus log-softmax.
//!
//! This is the kernel layer under `fl_sampling::beam_topk`, which is the API to use (it
//! owns the workspace type and the CPU reference); the semantics are spelled out in
//! `kernels/include/fl_beam.h`. This function checks what the launch needs (shapes, sizes, the
//! workspace's size), queues two kernels on the stream and returns without waiting.
//!
//! ```no_run
//! use fl_kernels::beam::{self, BeamInputs};
//! use fl_kernels::{DeviceTensor, Gpu};
//! let gpu = Gpu::new(0)?;
//! let s = gpu.stream();
//! // One request of two beams over a vocabulary of 3; keep the 2 best.
//! let logits = DeviceTensor::from_host(s, &[0.0f32, 1.0, 2.0, 2.0, 1.0, 0.0], &[2, 3])?;
//! let beam_scores = DeviceTensor::from_host(s, &[0.0f32, -0.5], &[2])?;
//! let req_start = DeviceTensor::from_host(s, &[0i32, 2], &[2])?;
//! let keep = DeviceTensor::from_host(s, &[2i32], &[1])?;
//! let mut ws = DeviceTensor::<u8>::zeros(s, &[beam::beam_topk_workspace_size(2, 3, 2)?])?;
//! let mut scores = DeviceTensor::<f32>::zeros(s, &[1, 2])?;
//! let mut ids = DeviceTensor::<i32>::zeros(s, &[1, 2])?;
//! let inputs = BeamInputs { beam_scores: &beam_scores, req_start: &req_start, keep: &keep };
//! beam::beam_topk(s, &logits, &inputs, &mut ws, &mut scores, &mut ids)?;
//! assert_eq!(ids.to_host(s)?, vec![2, 3]); // beam 0 token 2, then beam 1 token 0
//! # Ok::<(), fl_kernels::Error>(())
//! ```

use cudarc::driver::CudaStream;

use crate::dtype::FloatDType;
use crate::error::check;
use crate::tensor::{as_i64, expect_shape, raw_stream};
use crate::{DeviceTensor, Error, Result};

/// Most candidates kept per request (`FL_BEAM_MAX_KEEP`): the largest `max_keep`.
pub const MAX_KEEP: usize = fl_kernels_sys::FL_BEAM_MAX_KEEP as usize;

/// Bytes of scratch [`beam_topk`] needs for any batch of at most `rows` rows of `vocab`
/// tokens with up to `max_keep` candidates per request (no initialisation needed).
///
/// Errors: [`Error::InvalidArgument`] naming `vocab` (0, or `rows * vocab` past `i32::MAX`:
/// ids are i32) or `max_keep` (outside `1..=`[`MAX_KEEP`]).
pub fn beam_topk_workspace_size(rows: usize, vocab: usize, max_keep: usize) -> Result<usize> {
    check_sizes(rows, vocab, max_keep)?;
    // SAFETY: a pure function of its three integers.
    let n = unsafe {
        fl_kernels_sys::fl_beam_topk_workspace_size(rows as i64, vocab as i64, max_keep as i64)
    };
    usize::try_from(n).map_err(|_| Error::invalid("vocab", format!("{vocab} is out of range")))
}

fn check_sizes(rows: usize, vocab: usize, max_keep: usize) -> Result<()> {
    if max_keep == 0 || max_keep > MAX_KEEP {
        return Err(Error::invalid(
            "max_keep",
            format!("{max_keep} is outside 1..={MAX_KEEP}"),
        ));
    }
    if vocab == 0
        || rows
            .checked_mul(vocab)
            .is_none_or(|n| n > i32::MAX as usize)
    {
        return Err(Error::invalid(
            "vocab",
            format!("{rows} rows x {vocab} tokens: need 1 <= vocab and rows * vocab <= i32::MAX"),
        ));
    }
    Ok(())
}

/// The per-row and per-request inputs of [`beam_topk`].
#[derive(Clone, Copy, Debug)]
pub struct BeamInputs<'a> {
    /// Running log-probability sum of each row (beam), `[rows]`.
    pub beam_scores: &'a DeviceTensor<f32>,
    /// Request r owns rows `req_start[r] .. req_start[r + 1]`, `[n_req + 1]` (values are
    /// clamped on the device).
    pub req_start: &'a DeviceTensor<i32>,
    /// Candidates wanted per request, `[n_req]` (clamped on the device to `0..=max_keep` and
    /// to the request's `rows * vocab`).
    pub keep: &'a DeviceTensor<i32>,
}

/// One beam-search step (`fl_beam_topk`): for each request, the `keep[r]` best
/// `beam_scores[b] + log_softmax(logits[b])[v]` over its rows `b`, sorted descending (ties
/// to the smaller flat index `local_beam * vocab + v`), into `out_scores` / `out_ids`; the
/// entries past `keep[r]` get `-inf` / `-1`.
///
/// Shapes: `logits` `[rows, vocab]` (`f32`, `f16`, `bf16`); inputs as [`BeamInputs`];
/// `out_scores` `[n_req, max_keep]` f32 and `out_ids` `[n_req, max_keep]` i32 (`max_keep` in
/// `1..=`[`MAX_KEEP`]); `workspace` at least [`beam_topk_workspace_size`]`(rows, vocab,
/// max_keep)` bytes.
///
/// Errors: [`Error::Shape`] naming `logits`, `beam_scores`, `req_start`, `keep`, `out_scores`
/// or `out_ids`; [`Error::InvalidArgument`] naming `vocab`, `max_keep` or `workspace`;
/// [`Error::Cuda`] for `beam_topk`.
pub fn beam_topk<T: FloatDType>(
    stream: &CudaStream,
    logits: &DeviceTensor<T>,
    inputs: &BeamInputs<'_>,
    workspace: &mut DeviceTensor<u8>,
    out_scores: &mut DeviceTensor<f32>,
    out_ids: &mut DeviceTensor<i32>,
) -> Result<()> {
    let (rows, vocab) = match *logits.shape() {
        [r, v] => (r, v),
        _ => {
            return Err(Error::Shape {
                arg: "logits",
                expected: "[rows, vocab]".into(),
                got: logits.shape().to_vec(),
            })
        }
    };
    let (n_req, max_keep) = match *out_scores.shape() {
        [n, k] => (n, k),
        _ => {
            return Err(Error::Shape {
                arg: "out_scores",
                expected: "[n_req, max_keep]".into(),
                got: out_scores.shape().to_vec(),
            })
        }
    };
    check_sizes(rows, vocab, max_keep)?;
    expect_shape("beam_scores", inputs.beam_scores, &[rows])?;
    expect_shape("req_start", inputs.req_start, &[n_req + 1])?;
    expect_shape("keep", inputs.keep, &[n_req])?;
    expect_shape("out_ids", out_ids, &[n_req, max_keep])?;
    let need = beam_topk_workspace_size(rows, vocab, max_keep)?;
    if workspace.len() < need {
        return Err(Error::invalid(
            "workspace",
            format!(
                "{} bytes, {need} needed for {rows} rows of {vocab} keeping {max_keep}",
                workspace.len()
            ),
        ));
    }
    if n_req == 0 {
        return Ok(());
    }
    let (r, v) = (as_i64("logits", rows)?, as_i64("logits", vocab)?);
    let (n, k) = (as_i64("keep", n_req)?, as_i64("max_keep", max_keep)?);
    let wsb = as_i64("workspace", workspace.len())?;
    let (pl, _gl) = logits.ptr(stream);
    let (pb, _gb) = inputs.beam_scores.ptr(stream);
    let (pr, _gr) = inputs.req_start.ptr(stream);
    let (pk, _gk) = inputs.keep.ptr(stream);
    let (pw, _gw) = workspace.ptr_mut(stream);
    let (ps, _gs) = out_scores.ptr_mut(stream);
    let (pi, _gi) = out_ids.ptr_mut(stream);
    // SAFETY: logits hold rows * vocab elements of T, beam_scores rows, req_start n_req + 1,
    // keep n_req, out_scores and out_ids n_req * max_keep (all checked above); the workspace
    // holds at least the bytes the launcher needs and is a device allocation (8-byte
    // aligned); the &mut borrows are distinct, so no output aliases another. The guards keep
    // every buffer alive until the launch is queued.
    let status = unsafe {
        fl_kernels_sys::fl_beam_topk(
            T::ID,
            pl as _,
            r,
            v,
            pb as _,
            pr as _,
            pk as _,
            n,
            k,
            ps as _,
            pi as _,
            pw as _,
            wsb,
            raw_stream(stream),
        )
    };
    check("beam_topk", status)
}
