//! Ragged batches without padding (Effective Transformer, FasterTransformer v2.1):
//! [`PackedLayout`] (built on the device from the sequence lengths), [`remove_padding`]
//! (`[batch, max_len, hidden]` -> `[total, hidden]`) and [`rebuild_padding`] (back, with
//! zeros in the padding).
//!
//! Layout of a batch with lengths `len_b <= max_len`: token `t` of sequence `b` is row
//! `b * max_len + t` of the padded tensor and row `cu_seqlens[b] + t` of the packed one,
//! where `cu_seqlens` is the exclusive prefix sum of the lengths (`cu_seqlens[0] = 0`,
//! `cu_seqlens[batch] = total`). The token map holds the padded row of each packed row.
//!
//! Sizing the packed tensor: the total is computed on the device, so
//! - with lengths known on the host ([`PackedLayout::from_host_lengths`]) the total is
//!   known and `[total, hidden]` is exact;
//! - with lengths on the device ([`PackedLayout::from_lengths`]) size it with the upper
//!   bound `[batch * max_len, hidden]` ([`PackedLayout::packed_rows`]; rows past the total
//!   are not touched), or read the total first ([`PackedLayout::read_total`], a sync point)
//!   and then size it exactly.
//!
//! The gathers are raw row copies (bit-exact), memory-bound, in 16-byte words when the
//! buffers allow it. CPU references: [`crate::reference::padding`](mod@crate::reference::padding).

use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::dtype::FloatDType;
use crate::embedding::DeviceStatus;
use crate::error::check;
use crate::tensor::{as_i64, expect_shape, raw_stream};
use crate::{DeviceTensor, Error, Result};

/// Largest batch a [`PackedLayout`] supports (`FL_PADDING_MAX_BATCH`): the prefix sum runs
/// in one thread block with all `batch + 1` sums in shared memory.
pub const MAX_BATCH: usize = fl_kernels_sys::FL_PADDING_MAX_BATCH as usize;

/// Where each token of a ragged batch lives, padded and packed; built on the device.
///
/// Holds, on the device: `cu_seqlens` `i32 [batch + 1]`, the token map `i32 [capacity]`
/// (padded row `b * max_len + t` of packed row `cu_seqlens[b] + t`) and the total `i32 [1]`.
/// Every map entry is always a valid padded row (entries past the total are zero or stale),
/// so the gathers can never read outside their input.
///
/// ```no_run
/// use fl_kernels::embedding::DeviceStatus;
/// use fl_kernels::padding::{self, PackedLayout};
/// use fl_kernels::{f16, DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let (max_len, hidden) = (4, 8);
/// // Lengths on the host: validated there, exact sizes.
/// let layout = PackedLayout::from_host_lengths(s, &[3, 1], max_len)?;
/// assert_eq!(layout.known_total(), Some(4));
/// let x = DeviceTensor::<f16>::zeros(s, &[2, max_len, hidden])?;
/// let mut packed = DeviceTensor::<f16>::zeros(s, &[layout.packed_rows(), hidden])?;
/// padding::remove_padding(s, &x, &layout, &mut packed)?;
/// // Lengths on the device: checked there, upper-bound sizes, total read when needed.
/// let lengths = DeviceTensor::from_host(s, &[3i32, 1], &[2])?;
/// let mut status = DeviceStatus::new(s)?;
/// let mut layout = PackedLayout::from_lengths(s, &lengths, max_len, &mut status)?;
/// assert_eq!(layout.packed_rows(), 2 * max_len);
/// assert_eq!(layout.read_total(s)?, 4); // waits
/// status.check(s)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
#[derive(Debug)]
pub struct PackedLayout {
    batch: usize,
    max_len: usize,
    cu_seqlens: DeviceTensor<i32>,
    token_map: DeviceTensor<i32>,
    total: DeviceTensor<i32>,
    known_total: Option<usize>,
}

fn check_dims(batch: usize, max_len: usize) -> Result<()> {
    if batch > MAX_BATCH {
        return Err(Error::TooLarge {
            arg: "lengths",
            value: batch,
            limit: MAX_BATCH,
        });
    }
    if max_len > i32::MAX as usize || batch * max_len > i32::MAX as usize {
        return Err(Error::invalid(
            "max_len",
            format!(
                "batch * max_len = {batch} * {max_len} exceeds i32::MAX (the padded row index is i32)"
            ),
        ));
    }
    Ok(())
}

impl PackedLayout {
    /// Allocates a layout for `batch` sequences of at most `max_len` tokens, with the token
    /// map at its upper bound `batch * max_len`; fill it with [`compute`](Self::compute).
    ///
    /// Errors: [`Error::TooLarge`] naming `lengths` when `batch` > [`MAX_BATCH`];
    /// [`Error::InvalidArgument`] naming `max_len` when `batch * max_len` exceeds `i32::MAX`.
    pub fn new(stream: &Arc<CudaStream>, batch: usize, max_len: usize) -> Result<Self> {
        check_dims(batch, max_len)?;
        Ok(PackedLayout {
            batch,
            max_len,
            cu_seqlens: DeviceTensor::zeros(stream, &[batch + 1])?,
            token_map: DeviceTensor::zeros(stream, &[batch * max_len])?,
            total: DeviceTensor::zeros(stream, &[1])?,
            known_total: None,
        })
    }

    /// [`new`](Self::new) with `batch = lengths.len()`, then [`compute`](Self::compute).
    pub fn from_lengths(
        stream: &Arc<CudaStream>,
        lengths: &DeviceTensor<i32>,
        max_len: usize,
        status: &mut DeviceStatus,
    ) -> Result<Self> {
        if lengths.shape().len() != 1 {
            return Err(Error::Shape {
                arg: "lengths",
                expected: "[batch]".into(),
                got: lengths.shape().to_vec(),
            });
        }
        let mut layout = Self::new(stream, lengths.len(), max_len)?;
        layout.compute(stream, lengths, status)?;
        Ok(layout)
    }

    /// Rebuilds the layout on the device from `lengths` `i32 [batch]` (device), in one
    /// launch and without waiting:
    /// `cu_seqlens[b] = sum_{j<b} len_j`, `total = cu_seqlens[batch]`,
    /// `token_map[cu_seqlens[b] + t] = b * max_len + t` for `t < len_b`.
    ///
    /// A length outside `0..=max_len` is clamped into range (so the layout stays valid) and
    /// recorded in `status`; [`DeviceStatus::check`] then reports it as
    /// [`Error::DeviceCheck`] naming the first bad sequence and its length. The total is
    /// only on the device afterwards ([`known_total`](Self::known_total) is `None`).
    ///
    /// Errors: [`Error::Shape`] naming `lengths` unless it is `[batch]`;
    /// [`Error::InvalidArgument`] naming `self` when the layout was built with an exact
    /// (smaller) token map by [`from_host_lengths`](Self::from_host_lengths).
    pub fn compute(
        &mut self,
        stream: &CudaStream,
        lengths: &DeviceTensor<i32>,
        status: &mut DeviceStatus,
    ) -> Result<()> {
        expect_shape("lengths", lengths, &[self.batch])?;
        if self.token_map.len() < self.batch * self.max_len {
            return Err(Error::invalid(
                "self",
                "this layout's token map has the exact size of other lengths; \
                 build one with PackedLayout::new for device lengths",
            ));
        }
        let (ps, nonce, _gs) = status.arm(stream);
        self.known_total = None;
        self.launch(stream, lengths, ps, nonce)
    }

    /// Builds the layout from lengths known on the host, validated there: the token map
    /// and the total are exact ([`known_total`](Self::known_total) is `Some`). The lengths
    /// are copied to the device and the layout is computed there (one launch, no wait).
    ///
    /// Errors: [`Error::InvalidArgument`] naming `lengths` with the first length outside
    /// `0..=max_len`; the errors of [`new`](Self::new).
    pub fn from_host_lengths(
        stream: &Arc<CudaStream>,
        lengths: &[i32],
        max_len: usize,
    ) -> Result<Self> {
        let batch = lengths.len();
        check_dims(batch, max_len)?;
        let mut total = 0usize;
        for (b, &len) in lengths.iter().enumerate() {
            match usize::try_from(len) {
                Ok(l) if l <= max_len => total += l,
                _ => {
                    return Err(Error::invalid(
                        "lengths",
                        format!("lengths[{b}] = {len} is outside 0..={max_len} (max_len)"),
                    ))
                }
            }
        }
        let mut layout = PackedLayout {
            batch,
            max_len,
            cu_seqlens: DeviceTensor::zeros(stream, &[batch + 1])?,
            token_map: DeviceTensor::zeros(stream, &[total])?,
            total: DeviceTensor::zeros(stream, &[1])?,
            known_total: Some(total),
        };
        let dl = DeviceTensor::from_host(stream, lengths, &[batch])?;
        // Validated above: the device check cannot fail, so no status is needed.
        layout.launch(stream, &dl, 0, 0)?;
        Ok(layout)
    }

    fn launch(
        &mut self,
        stream: &CudaStream,
        lengths: &DeviceTensor<i32>,
        status: u64,
        nonce: u32,
    ) -> Result<()> {
        let capacity = as_i64("token_map", self.token_map.len())?;
        let (pl, _gl) = lengths.ptr(stream);
        let (pc, _gc) = self.cu_seqlens.ptr_mut(stream);
        let (pm, _gm) = self.token_map.ptr_mut(stream);
        let (pt, _gt) = self.total.ptr_mut(stream);
        // SAFETY: lengths holds batch i32, cu_seqlens batch + 1, token_map `capacity`
        // (the kernel writes no entry at or past it), total 1; batch <= MAX_BATCH and
        // batch * max_len <= i32::MAX were checked when the layout was made; status is
        // null or a live device status with a nonzero nonce; guards live until the launch
        // is queued on `stream`.
        let st = unsafe {
            fl_kernels_sys::fl_padding_offsets(
                pl as _,
                self.batch as i32,
                self.max_len as i32,
                pc as _,
                pm as _,
                capacity,
                pt as _,
                status as _,
                nonce,
                raw_stream(stream),
            )
        };
        check("padding::PackedLayout::compute", st)
    }

    /// Number of sequences.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Padded length of every sequence.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// The packed token count when known on the host (from host lengths, or after
    /// [`read_total`](Self::read_total)); `None` after a device [`compute`](Self::compute).
    pub fn known_total(&self) -> Option<usize> {
        self.known_total
    }

    /// Rows a packed tensor must have (at least) for [`remove_padding`] and
    /// [`rebuild_padding`]: the known total, else the bound `batch * max_len`.
    pub fn packed_rows(&self) -> usize {
        self.known_total.unwrap_or(self.batch * self.max_len)
    }

    /// Copies the total to the host (waits for `stream`: a sync point) and remembers it,
    /// so that [`packed_rows`](Self::packed_rows) becomes exact.
    pub fn read_total(&mut self, stream: &Arc<CudaStream>) -> Result<usize> {
        let t = self.total.to_host(stream)?;
        let total = t.first().copied().unwrap_or(0);
        let total = usize::try_from(total)
            .map_err(|_| Error::invalid("total", format!("device total {total} < 0")))?;
        self.known_total = Some(total);
        Ok(total)
    }

    /// `cu_seqlens` `i32 [batch + 1]` (device): exclusive prefix sum of the lengths.
    pub fn cu_seqlens(&self) -> &DeviceTensor<i32> {
        &self.cu_seqlens
    }

    /// The token map `i32 [capacity]` (device): padded row of each packed row; entries
    /// at or past the total are not meaningful.
    pub fn token_map(&self) -> &DeviceTensor<i32> {
        &self.token_map
    }

    /// The packed token count `i32 [1]` (device).
    pub fn total(&self) -> &DeviceTensor<i32> {
        &self.total
    }

    /// Checks `padded` is `[batch, max_len, hidden]` and `packed` `[rows, hidden]` with
    /// enough rows; returns `hidden`.
    fn check_pair<T: FloatDType>(
        &self,
        padded: (&'static str, &DeviceTensor<T>),
        packed: (&'static str, &DeviceTensor<T>),
    ) -> Result<usize> {
        let (pname, p) = padded;
        let &[b, l, hidden] = p.shape() else {
            return Err(Error::Shape {
                arg: pname,
                expected: format!(
                    "[batch = {}, max_len = {}, hidden]",
                    self.batch, self.max_len
                ),
                got: p.shape().to_vec(),
            });
        };
        if (b, l) != (self.batch, self.max_len) || hidden == 0 {
            return Err(Error::Shape {
                arg: pname,
                expected: format!(
                    "[batch = {}, max_len = {}, hidden >= 1]",
                    self.batch, self.max_len
                ),
                got: p.shape().to_vec(),
            });
        }
        let (kname, k) = packed;
        let need = self.packed_rows();
        match *k.shape() {
            [rows, h] if h == hidden && rows >= need && rows <= i32::MAX as usize => Ok(hidden),
            _ => Err(Error::Shape {
                arg: kname,
                expected: format!(
                    "[rows, {hidden}] with rows >= {need} ({})",
                    if self.known_total.is_some() {
                        "the total"
                    } else {
                        "batch * max_len: the total is known only on the device"
                    }
                ),
                got: k.shape().to_vec(),
            }),
        }
    }
}

/// Remove padding: `packed[i, :] = padded[token_map[i], :]` for every packed token
/// `i < total`, i.e. `packed[cu_seqlens[b] + t] = padded[b, t]` for `t < len_b`.
///
/// Shapes: `padded` `[batch, max_len, hidden]`; `packed` `[rows, hidden]` with
/// `rows >= layout.packed_rows()` (rows past the device total are not written).
/// Dtypes: `f32`, `f16`, `bf16` (a raw copy, bit-exact).
///
/// Errors: [`Error::Shape`] naming `padded` or `packed`.
///
/// ```no_run
/// use fl_kernels::padding::{self, PackedLayout};
/// use fl_kernels::{bf16, DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let layout = PackedLayout::from_host_lengths(s, &[5, 2, 7], 8)?;
/// let x = DeviceTensor::<bf16>::zeros(s, &[3, 8, 64])?;
/// let mut packed = DeviceTensor::<bf16>::zeros(s, &[14, 64])?;
/// padding::remove_padding(s, &x, &layout, &mut packed)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn remove_padding<T: FloatDType>(
    stream: &CudaStream,
    padded: &DeviceTensor<T>,
    layout: &PackedLayout,
    packed: &mut DeviceTensor<T>,
) -> Result<()> {
    let hidden = layout.check_pair(("padded", padded), ("packed", packed))?;
    let rows = packed.shape()[0];
    if rows == 0 {
        return Ok(());
    }
    // Only the first `total` rows are copied, and the map holds >= total entries.
    let map_rows = rows.min(layout.token_map.len());
    let hidden = as_i64("packed", hidden)?;
    let (pp, _gp) = padded.ptr(stream);
    let (pm, _gm) = layout.token_map.ptr(stream);
    let (pt, _gt) = layout.total.ptr(stream);
    let (pk, _gk) = packed.ptr_mut(stream);
    // SAFETY: padded holds batch * max_len * hidden elements of T and packed >= map_rows
    // rows of hidden (shapes checked above); the kernel reads map entries < map_rows
    // (map_rows <= token_map.len()) and only rows < total <= map_rows (the layout's total
    // is at most its map capacity); every map entry is a padded row index, and the kernel
    // zero-fills on an out-of-range one; guards live until the launch is queued.
    let st = unsafe {
        fl_kernels_sys::fl_remove_padding(
            T::ID,
            pp as _,
            layout.batch as i32,
            layout.max_len as i32,
            hidden,
            pm as _,
            pt as _,
            map_rows as i64,
            pk as _,
            raw_stream(stream),
        )
    };
    check("padding::remove_padding", st)
}

/// Rebuild padding: `padded[b, t, :] = packed[cu_seqlens[b] + t, :]` for `t < len_b`, and
/// `0` for the padding `len_b <= t < max_len`; every element of `padded` is written.
///
/// Shapes: `packed` `[rows, hidden]` with `rows >= layout.packed_rows()`; `padded`
/// `[batch, max_len, hidden]`. Dtypes: `f32`, `f16`, `bf16` (a raw copy, bit-exact).
///
/// Errors: [`Error::Shape`] naming `packed` or `padded`.
///
/// ```no_run
/// use fl_kernels::padding::{self, PackedLayout};
/// use fl_kernels::{DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let layout = PackedLayout::from_host_lengths(s, &[2, 0, 3], 4)?;
/// let packed = DeviceTensor::from_host(s, &[1.0f32, 2.0, 3.0, 4.0, 5.0], &[5, 1])?;
/// let mut x = DeviceTensor::<f32>::zeros(s, &[3, 4, 1])?;
/// padding::rebuild_padding(s, &packed, &layout, &mut x)?;
/// assert_eq!(x.to_host(s)?, [1., 2., 0., 0., 0., 0., 0., 0., 3., 4., 5., 0.]);
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn rebuild_padding<T: FloatDType>(
    stream: &CudaStream,
    packed: &DeviceTensor<T>,
    layout: &PackedLayout,
    padded: &mut DeviceTensor<T>,
) -> Result<()> {
    let hidden = layout.check_pair(("padded", padded), ("packed", packed))?;
    if padded.is_empty() {
        return Ok(());
    }
    let rows = as_i64("packed", packed.shape()[0])?;
    let hidden = as_i64("padded", hidden)?;
    let (pk, _gk) = packed.ptr(stream);
    let (pc, _gc) = layout.cu_seqlens.ptr(stream);
    let (pp, _gp) = padded.ptr_mut(stream);
    // SAFETY: packed holds rows * hidden and padded batch * max_len * hidden elements of T
    // (shapes checked above); cu_seqlens holds batch + 1 i32; the kernel reads no packed
    // row outside [0, rows) (it zero-fills instead); guards live until the launch is queued.
    let st = unsafe {
        fl_kernels_sys::fl_rebuild_padding(
            T::ID,
            pk as _,
            rows,
            pc as _,
            layout.batch as i32,
            layout.max_len as i32,
            hidden,
            pp as _,
            raw_stream(stream),
        )
    };
    check("padding::rebuild_padding", st)
}
