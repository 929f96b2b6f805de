//! Embedding lookup ([`lookup`]) and the device-side check status ([`DeviceStatus`]).
//!
//! The lookup is a row gather, `out[i, :] = table[ids[i], :]`: a raw copy (bit-exact for
//! every dtype), memory-bound, in 16-byte words when the buffers allow it. Token ids are
//! checked on the device; a bad id is reported through a [`DeviceStatus`] that the caller
//! reads when it chooses ([`DeviceStatus::check`], the one sync point), so a lookup never
//! waits for the GPU.
//!
//! CPU reference: [`crate::reference::embedding`](mod@crate::reference::embedding).

use std::fmt;
use std::sync::Arc;

use cudarc::driver::{CudaStream, SyncOnDrop};

use crate::dtype::FloatDType;
use crate::error::check;
use crate::tensor::{as_i32, as_i64, expect_shape, raw_stream};
use crate::{DeviceTensor, Error, Result};

/// Number of `i32` words of a device status (`FL_DEVICE_STATUS_WORDS`).
const STATUS_WORDS: usize = fl_kernels_sys::FL_DEVICE_STATUS_WORDS as usize;

/// A small device buffer where kernels record failed data checks (a token id outside the
/// vocabulary, a sequence length above `max_len`, ...), read back only when the caller asks.
///
/// Ops that check their data on the device take `&mut DeviceStatus` and record failures
/// there without synchronising; the status is sticky (it accumulates over any number of
/// launches, of any ops) until [`check`](Self::check) reads it. `check` is the explicit
/// sync point: it waits for the stream, returns `Ok(())` when nothing failed, and otherwise
/// clears the status and returns [`Error::DeviceCheck`] naming the op, the number of
/// failures and the first offending position and value. One status can serve a whole
/// forward pass; check it once at the end (e.g. when the logits are copied back anyway).
///
/// Device layout (`FL_DEVICE_STATUS_WORDS` = 8 `i32`, see `fl_embedding.h`): a failure
/// count, the launch that failed first, its check code, its failure with the smallest
/// index (position, value) and the limit checked against. Only the first failing launch
/// since the last reset is described in detail; the count covers all of them.
///
/// ```no_run
/// use fl_kernels::embedding::{self, DeviceStatus};
/// use fl_kernels::{DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let table = DeviceTensor::from_host(s, &[0.5f32; 4 * 8], &[4, 8])?;
/// let ids = DeviceTensor::from_host(s, &[0i32, 3, 7], &[3])?; // 7 is not in [0, 4)
/// let mut out = DeviceTensor::zeros(s, &[3, 8])?;
/// let mut status = DeviceStatus::new(s)?;
/// embedding::lookup(s, &ids, &table, &mut out, &mut status)?; // queued, not waited for
/// let err = status.check(s).unwrap_err(); // waits: "... position 2 ... id 7 ..."
/// println!("{err}");
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub struct DeviceStatus {
    buf: DeviceTensor<i32>,
    nonce: u32,
}

impl fmt::Debug for DeviceStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceStatus(launches armed: {})", self.nonce)
    }
}

/// The decoded contents of a device status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Failure {
    count: u64,
    code: i32,
    index: u32,
    value: i32,
    limit: i32,
}

impl Failure {
    fn decode(w: &[i32]) -> Option<Failure> {
        let word = |i: usize| w.get(i).copied().unwrap_or(0) as u32 as u64;
        let count = word(0) | (word(1) << 32);
        if count == 0 {
            return None;
        }
        let key = !(word(4) | (word(5) << 32));
        Some(Failure {
            count,
            code: word(3) as i32,
            index: (key >> 32) as u32,
            value: key as u32 as i32,
            limit: word(6) as i32,
        })
    }

    fn into_error(self) -> Error {
        let Failure {
            count,
            code,
            index,
            value,
            limit,
        } = self;
        let (op, reason) = match code as u32 {
            fl_kernels_sys::FL_CHECK_TOKEN_ID => (
                "embedding::lookup",
                format!(
                    "{count} token id(s) outside the vocabulary [0, {limit}); the first at \
                     position {index} is id {value} (its output row was set to zero)"
                ),
            ),
            fl_kernels_sys::FL_CHECK_SEQ_LEN => (
                "padding::PackedLayout::compute",
                format!(
                    "{count} sequence length(s) outside [0, {limit}] (max_len); the first is \
                     lengths[{index}] = {value} (clamped into range)"
                ),
            ),
            _ => (
                "device check",
                format!(
                    "{count} failed check(s) (code {code}); the first at index {index}: \
                     value {value}, limit {limit}"
                ),
            ),
        };
        Error::DeviceCheck { op, reason }
    }
}

impl DeviceStatus {
    /// A clean status (8 `i32` on the device, zeroed on `stream`).
    pub fn new(stream: &Arc<CudaStream>) -> Result<Self> {
        Ok(DeviceStatus {
            buf: DeviceTensor::zeros(stream, &[STATUS_WORDS])?,
            nonce: 0,
        })
    }

    /// Waits for `stream`, then reports what the checks recorded since the last reset.
    ///
    /// This is the sync point (one 32-byte copy to the host). Use the stream the checked
    /// ops were queued on. On failure the status is cleared (queued on `stream`) so it can
    /// be reused, and [`Error::DeviceCheck`] names the op, the number of failures and the
    /// first offending position and value of the first launch that failed.
    pub fn check(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        let words = self.buf.to_host(stream)?;
        match Failure::decode(&words) {
            None => Ok(()),
            Some(f) => {
                self.reset(stream)?;
                Err(f.into_error())
            }
        }
    }

    /// Clears the status (queued on `stream`, no wait).
    pub fn reset(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        stream.memset_zeros(self.buf.as_slice_mut())?;
        Ok(())
    }

    /// The raw device buffer (`FL_DEVICE_STATUS_WORDS` `i32`), e.g. to pass to a raw
    /// launcher or to copy into a larger report.
    pub fn as_tensor(&self) -> &DeviceTensor<i32> {
        &self.buf
    }

    /// The device pointer and a fresh nonzero nonce for one launch on `stream`.
    pub(crate) fn arm<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, u32, SyncOnDrop<'a>) {
        self.nonce = self.nonce.wrapping_add(1).max(1);
        let nonce = self.nonce;
        let (p, g) = self.buf.ptr_mut(stream);
        (p, nonce, g)
    }
}

/// A lookup's shapes: `out` must be `ids`' shape plus `hidden`, and the ids at most
/// `i32::MAX`; returns the number of ids.
pub(crate) fn lookup_shapes<T: FloatDType>(
    ids: &DeviceTensor<i32>,
    hidden: usize,
    out: &DeviceTensor<T>,
) -> Result<usize> {
    let mut want = ids.shape().to_vec();
    want.push(hidden);
    expect_shape("out", out, &want)?;
    as_i32("ids", ids.len())?;
    Ok(ids.len())
}

/// Embedding lookup: `out[i, :] = table[ids[i], :]` for every token `i` (a raw row copy).
///
/// Shapes: `ids` any shape with `n` elements (e.g. `[n]` or `[batch, seq]`); `table`
/// `[vocab, hidden]`; `out` `ids.shape() ++ [hidden]`. Dtypes: `table` and `out` `f32`,
/// `f16` or `bf16` (the same); `ids` `i32`.
///
/// Token ids are checked on the device: an id outside `[0, vocab)` is never read, its row
/// of `out` is set to zero, and the failure is recorded in `status` (position and id).
/// This function does not wait; call [`DeviceStatus::check`] when you want to know
/// (it returns [`Error::DeviceCheck`] naming the first bad position and id).
///
/// Errors (before launch): [`Error::Shape`] naming `table` (not rank 2) or `out`;
/// [`Error::InvalidArgument`] naming `table` when `hidden` is 0; [`Error::TooLarge`] naming
/// `ids` when `n` exceeds `i32::MAX`.
///
/// ```no_run
/// use fl_kernels::embedding::{self, DeviceStatus};
/// use fl_kernels::{f16, DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let (vocab, hidden) = (32000, 4096);
/// let table = DeviceTensor::<f16>::zeros(s, &[vocab, hidden])?;
/// let ids = DeviceTensor::from_host(s, &[1i32, 15043, 3186], &[3])?;
/// let mut x = DeviceTensor::<f16>::zeros(s, &[3, hidden])?;
/// let mut status = DeviceStatus::new(s)?;
/// embedding::lookup(s, &ids, &table, &mut x, &mut status)?;
/// // ... queue the rest of the forward pass, then, once:
/// status.check(s)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn lookup<T: FloatDType>(
    stream: &CudaStream,
    ids: &DeviceTensor<i32>,
    table: &DeviceTensor<T>,
    out: &mut DeviceTensor<T>,
    status: &mut DeviceStatus,
) -> Result<()> {
    let &[vocab, hidden] = table.shape() else {
        return Err(Error::Shape {
            arg: "table",
            expected: "[vocab, hidden]".into(),
            got: table.shape().to_vec(),
        });
    };
    if hidden == 0 {
        return Err(Error::invalid("table", "hidden size (dimension 1) is 0"));
    }
    let n = lookup_shapes(ids, hidden, out)?;
    if n == 0 {
        return Ok(());
    }
    let (n, vocab, hidden) = (
        as_i64("ids", n)?,
        as_i64("table", vocab)?,
        as_i64("table", hidden)?,
    );
    let (pi, _gi) = ids.ptr(stream);
    let (pt, _gt) = table.ptr(stream);
    let (po, _go) = out.ptr_mut(stream);
    let (ps, nonce, _gs) = status.arm(stream);
    // SAFETY: ids holds n i32, table vocab * hidden and out n * hidden elements of T (shapes
    // checked above); status holds FL_DEVICE_STATUS_WORDS i32 (allocated 256-byte aligned);
    // every guard lives until the launch is queued on `stream`; the kernel reads no row
    // outside the table.
    let st = unsafe {
        fl_kernels_sys::fl_embedding_lookup(
            T::ID,
            pi as _,
            n,
            pt as _,
            vocab,
            hidden,
            po as _,
            ps as _,
            nonce,
            raw_stream(stream),
        )
    };
    check("embedding::lookup", st)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(count: u64, nonce: u32, code: u32, index: u32, value: i32, limit: i32) -> Vec<i32> {
        let key = !(((index as u64) << 32) | value as u32 as u64);
        vec![
            count as u32 as i32,
            (count >> 32) as u32 as i32,
            nonce as i32,
            code as i32,
            key as u32 as i32,
            (key >> 32) as u32 as i32,
            limit,
            0,
        ]
    }

    #[test]
    fn clean_status_decodes_to_none() {
        assert_eq!(Failure::decode(&[0; 8]), None);
    }

    #[test]
    fn token_id_failure_names_position_and_id() {
        let w = words(3, 7, fl_kernels_sys::FL_CHECK_TOKEN_ID, 41, -5, 32000);
        let f = Failure::decode(&w).unwrap();
        assert_eq!(
            f,
            Failure {
                count: 3,
                code: 1,
                index: 41,
                value: -5,
                limit: 32000
            }
        );
        match f.into_error() {
            Error::DeviceCheck { op, reason } => {
                assert_eq!(op, "embedding::lookup");
                assert!(reason.contains("position 41"), "{reason}");
                assert!(reason.contains("id -5"), "{reason}");
                assert!(reason.contains("3 token id"), "{reason}");
                assert!(reason.contains("[0, 32000)"), "{reason}");
            }
            e => panic!("wrong error {e:?}"),
        }
    }

    #[test]
    fn large_counts_and_lengths_decode() {
        let w = words(
            (1u64 << 33) + 2,
            1,
            fl_kernels_sys::FL_CHECK_SEQ_LEN,
            8191,
            513,
            512,
        );
        let f = Failure::decode(&w).unwrap();
        assert_eq!(f.count, (1u64 << 33) + 2);
        assert_eq!((f.index, f.value, f.limit), (8191, 513, 512));
        let msg = f.into_error().to_string();
        assert!(msg.contains("lengths[8191] = 513"), "{msg}");
    }
}
