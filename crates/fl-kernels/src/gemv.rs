//! Weight-only quantised GEMV / small GEMM for decode: [`gemv`] computes
//! `y[m, n] = x[m, k] · Wᵀ` with `W [n, k]` (output-major, like `nn.Linear.weight`) stored
//! quantised and dequantised in registers, `x`/`y` in f16 or bf16, `m` = 1..=[`MAX_M`]
//! tokens, f32 accumulation.
//!
//! Formats ([`QuantFormat`]):
//! - [`Int8`](QuantFormat::Int8): symmetric per output channel, `w = q · scale[r]`, `q` i8,
//!   `scale` f32.
//! - [`Int4`](QuantFormat::Int4): group-wise along k (group 32, 64 or 128), f16 scale per
//!   group, symmetric (`w = (nib − 8) · scale`, q = nib − 8 in −8..=7) or with a u8 zero point
//!   per group (`w = (nib − zero) · scale`, nib and zero in 0..=15). Two nibbles per byte:
//!   byte `b` of a row holds value `2b` in its **low** nibble and `2b + 1` in its high nibble.
//! - [`Q8_0`](QuantFormat::Q8_0) and [`Q4_0`](QuantFormat::Q4_0): llama.cpp / GGUF blocks,
//!   bit-exact (`{f16 d; i8 qs[32]}` = 34 bytes; `{f16 d; u8 qs[16]}` = 18 bytes with value
//!   `j` in the low nibble of `qs[j]` and value `j + 16` in its high nibble), rows of `k / 32`
//!   blocks, so GGUF tensors upload without repacking.
//! - [`Q4_K`](QuantFormat::Q4_K), [`Q5_K`](QuantFormat::Q5_K) and [`Q6_K`](QuantFormat::Q6_K):
//!   llama.cpp's K-quants, bit-exact (`ggml-common.h`): rows of `k / 256` super-blocks of 144,
//!   176 and 210 bytes (`k` a multiple of 256), dequantised exactly as ggml's
//!   `dequantize_row_*` ([`crate::reference::ggml::dequantize_row`]). Build one from a GGUF
//!   tensor's bytes with [`QuantizedHost::from_ggml`].
//!
//! The host side: [`quantize`] turns f32 weights into a [`QuantizedHost`] (quantise-on-load,
//! tests); [`QuantizedHost::new`] wraps bytes you already have (a GGUF tensor); the CPU
//! reference [`crate::reference::gemv`](mod@crate::reference::gemv) dequantises the same way.
//! [`QuantWeight::upload`] puts one on the device.
//!
//! Past [`MAX_M`] tokens (prefill), [`dequantize`] writes the weight out densely once, for a
//! tensor-core GEMM (`fl_blas::Blas::linear`) to read.
//!
//! ```no_run
//! use fl_kernels::gemv::{self, QuantFormat, QuantWeight};
//! use fl_kernels::{f16, DeviceTensor, Gpu};
//! let gpu = Gpu::new(0)?;
//! let s = gpu.stream();
//! let (n, k) = (4096, 4096);
//! let w: Vec<f32> = (0..n * k).map(|i| ((i % 17) as f32 - 8.0) * 1e-2).collect();
//! let q = gemv::quantize(&w, n, k, QuantFormat::Int4 { group: 128, zero_point: false })?;
//! let dw = QuantWeight::upload(s, &q)?;
//! let x = DeviceTensor::from_host(s, &vec![f16::from_f32(0.5); k], &[1, k])?;
//! let mut y = DeviceTensor::<f16>::zeros(s, &[1, n])?;
//! gemv::gemv(s, &x, &dw, &mut y)?;
//! # Ok::<(), fl_kernels::Error>(())
//! ```

use std::sync::Arc;

use cudarc::driver::{CudaStream, SyncOnDrop};
use fl_kernels_sys::fl_gemv_format;
use half::f16;

use crate::dtype::{FloatDType, HalfDType};
use crate::error::check;
use crate::ggml::{GgmlType, QK_K};
use crate::tensor::{as_i64, expect_shape, raw_stream};
use crate::{DeviceTensor, Error, Result};

/// The largest number of tokens (`m`, rows of `x`) one [`gemv`] call takes.
pub const MAX_M: usize = fl_kernels_sys::FL_GEMV_MAX_M as usize;

/// Values per GGUF block (Q8_0, Q4_0) and the multiple `k` must be of, in every format.
pub const BLOCK: usize = 32;
/// Bytes of one llama.cpp `block_q8_0` (`f16 d; i8 qs[32]`).
pub const Q8_0_BLOCK_BYTES: usize = 34;
/// Bytes of one llama.cpp `block_q4_0` (`f16 d; u8 qs[16]`).
pub const Q4_0_BLOCK_BYTES: usize = 18;

/// How a weight matrix is stored (see the [module docs](self)).
#[allow(non_camel_case_types)] // ggml's names (Q4_K), as in [`GgmlType`]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    /// int8, symmetric, one f32 scale per output row.
    Int8,
    /// int4 in groups of `group` values along k (32, 64 or 128), one f16 scale per group;
    /// with `zero_point`, also one u8 zero (0..=15) per group.
    Int4 {
        /// Values per group: 32, 64 or 128.
        group: usize,
        /// Asymmetric (`w = (nib − zero) · scale`) instead of symmetric (`zero = 8`).
        zero_point: bool,
    },
    /// llama.cpp Q8_0 blocks of 32 values.
    Q8_0,
    /// llama.cpp Q4_0 blocks of 32 values.
    Q4_0,
    /// llama.cpp Q4_K super-blocks of 256 values (144 bytes).
    Q4_K,
    /// llama.cpp Q5_K super-blocks of 256 values (176 bytes).
    Q5_K,
    /// llama.cpp Q6_K super-blocks of 256 values (210 bytes).
    Q6_K,
}

impl QuantFormat {
    /// Short name for ids and messages: `int8`, `int4_g128`, `int4zp_g128`, `q8_0`, `q4_0`,
    /// `q4_k`, `q5_k`, `q6_k`.
    pub fn name(&self) -> String {
        match *self {
            QuantFormat::Int8 => "int8".into(),
            QuantFormat::Int4 {
                group,
                zero_point: false,
            } => format!("int4_g{group}"),
            QuantFormat::Int4 {
                group,
                zero_point: true,
            } => format!("int4zp_g{group}"),
            QuantFormat::Q8_0 => "q8_0".into(),
            QuantFormat::Q4_0 => "q4_0".into(),
            QuantFormat::Q4_K => "q4_k".into(),
            QuantFormat::Q5_K => "q5_k".into(),
            QuantFormat::Q6_K => "q6_k".into(),
        }
    }

    /// The multiple `k` must be of: the group for int4, 256 for the K-quants, else 32.
    pub fn k_multiple(&self) -> usize {
        match *self {
            QuantFormat::Int4 { group, .. } => group,
            QuantFormat::Q4_K | QuantFormat::Q5_K | QuantFormat::Q6_K => QK_K,
            _ => BLOCK,
        }
    }

    /// The ggml type of the GGUF formats (`Q8_0`, `Q4_0`, the K-quants); `None` for int8 /
    /// int4.
    pub fn ggml_type(&self) -> Option<GgmlType> {
        match self {
            QuantFormat::Q8_0 => Some(GgmlType::Q8_0),
            QuantFormat::Q4_0 => Some(GgmlType::Q4_0),
            QuantFormat::Q4_K => Some(GgmlType::Q4_K),
            QuantFormat::Q5_K => Some(GgmlType::Q5_K),
            QuantFormat::Q6_K => Some(GgmlType::Q6_K),
            QuantFormat::Int8 | QuantFormat::Int4 { .. } => None,
        }
    }

    /// The format that stores ggml type `ty` as it is (no requantising), if the GEMV takes it:
    /// Q8_0, Q4_0, Q4_K, Q5_K, Q6_K.
    pub fn from_ggml(ty: GgmlType) -> Option<QuantFormat> {
        match ty {
            GgmlType::Q8_0 => Some(QuantFormat::Q8_0),
            GgmlType::Q4_0 => Some(QuantFormat::Q4_0),
            GgmlType::Q4_K => Some(QuantFormat::Q4_K),
            GgmlType::Q5_K => Some(QuantFormat::Q5_K),
            GgmlType::Q6_K => Some(QuantFormat::Q6_K),
            _ => None,
        }
    }

    /// Bytes of the packed values (`data`) of an `[n, k]` weight (no overflow check).
    pub fn data_bytes(&self, n: usize, k: usize) -> usize {
        match self {
            QuantFormat::Int8 => n * k,
            QuantFormat::Int4 { .. } => n * k / 2,
            QuantFormat::Q8_0 => n * (k / BLOCK) * Q8_0_BLOCK_BYTES,
            QuantFormat::Q4_0 => n * (k / BLOCK) * Q4_0_BLOCK_BYTES,
            QuantFormat::Q4_K | QuantFormat::Q5_K | QuantFormat::Q6_K => {
                n * (k / QK_K) * self.ggml_type().map_or(0, |t| t.block_bytes())
            }
        }
    }

    /// Bytes one GEMV reads for an `[n, k]` weight: packed values + scales + zeros (what
    /// [`QuantWeight::num_bytes`] reports once uploaded).
    pub fn weight_bytes(&self, n: usize, k: usize) -> usize {
        self.data_bytes(n, k)
            + match *self {
                QuantFormat::Int8 => 4 * n,
                QuantFormat::Int4 { group, zero_point } => {
                    n * (k / group) * if zero_point { 3 } else { 2 }
                }
                _ => 0,
            }
    }

    pub(crate) fn ffi(&self) -> fl_gemv_format {
        match self {
            QuantFormat::Int8 => fl_gemv_format::FL_GEMV_INT8,
            QuantFormat::Int4 {
                zero_point: false, ..
            } => fl_gemv_format::FL_GEMV_INT4,
            QuantFormat::Int4 {
                zero_point: true, ..
            } => fl_gemv_format::FL_GEMV_INT4_ZP,
            QuantFormat::Q8_0 => fl_gemv_format::FL_GEMV_Q8_0,
            QuantFormat::Q4_0 => fl_gemv_format::FL_GEMV_Q4_0,
            QuantFormat::Q4_K => fl_gemv_format::FL_GEMV_Q4_K,
            QuantFormat::Q5_K => fl_gemv_format::FL_GEMV_Q5_K,
            QuantFormat::Q6_K => fl_gemv_format::FL_GEMV_Q6_K,
        }
    }

    /// Checks the format itself and that `[n, k]` fits it.
    fn check_shape(&self, n: usize, k: usize) -> Result<()> {
        if let QuantFormat::Int4 { group, .. } = *self {
            if ![32, 64, 128].contains(&group) {
                return Err(Error::invalid(
                    "format",
                    format!("int4 group size {group}: must be 32, 64 or 128"),
                ));
            }
        }
        let mult = self.k_multiple();
        if k == 0 || k % mult != 0 {
            return Err(Error::invalid(
                "k",
                format!(
                    "k = {k} must be a positive multiple of {mult} for {}",
                    self.name()
                ),
            ));
        }
        if n.checked_mul(k).is_none_or(|nk| nk > i64::MAX as usize) {
            return Err(Error::TooLarge {
                arg: "n",
                value: n,
                limit: i64::MAX as usize / k,
            });
        }
        Ok(())
    }
}

/// A quantised `[n, k]` weight on the host, in one of the [`QuantFormat`]s.
///
/// Build one with [`quantize`] (from f32) or [`QuantizedHost::new`] (from bytes already in a
/// format, e.g. a GGUF tensor); the lengths are checked there, so a value of this type is
/// always consistent. Upload it with [`QuantWeight::upload`].
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedHost {
    format: QuantFormat,
    n: usize,
    k: usize,
    data: Vec<u8>,
    scales_f32: Vec<f32>,
    scales_f16: Vec<f16>,
    zeros: Vec<u8>,
}

/// The scales of a [`QuantizedHost`], by format.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scales<'a> {
    /// Q8_0 / Q4_0: the scales are inside the blocks.
    None,
    /// Int8: one per output row, `[n]`.
    F32(&'a [f32]),
    /// Int4: one per group, `[n, k / group]`.
    F16(&'a [f16]),
}

impl QuantizedHost {
    /// Wraps quantised data you already have.
    ///
    /// - `Int8`: `data` = the i8 values as bytes `[n, k]`, `scales` = `Scales::F32` of `[n]`,
    ///   `zeros` empty.
    /// - `Int4`: `data` = `[n, k / 2]` packed (low nibble = even k), `scales` =
    ///   `Scales::F16` of `[n, k / group]`, `zeros` = `[n, k / group]` values 0..=15 with a
    ///   zero point, else empty.
    /// - `Q8_0` / `Q4_0`: `data` = the GGUF blocks, `n · k / 32` of them, row-major;
    ///   `scales` = `Scales::None`, `zeros` empty.
    /// - `Q4_K` / `Q5_K` / `Q6_K`: `data` = the GGUF super-blocks, `n · k / 256` of them,
    ///   row-major; `scales` = `Scales::None`, `zeros` empty (see also
    ///   [`QuantizedHost::from_ggml`]).
    ///
    /// Errors: [`Error::InvalidArgument`] naming `k`/`format` (see [`quantize`]), `data`,
    /// `scales` or `zeros` when a length or kind does not match, or a zero is above 15.
    pub fn new(
        format: QuantFormat,
        n: usize,
        k: usize,
        data: Vec<u8>,
        scales: Scales<'_>,
        zeros: Vec<u8>,
    ) -> Result<Self> {
        format.check_shape(n, k)?;
        let want = format.data_bytes(n, k);
        if data.len() != want {
            return Err(Error::invalid(
                "data",
                format!(
                    "{} bytes for a {n} x {k} {} weight ({want} bytes)",
                    data.len(),
                    format.name()
                ),
            ));
        }
        let (mut scales_f32, mut scales_f16) = (Vec::new(), Vec::new());
        match (format, scales) {
            (QuantFormat::Int8, Scales::F32(s)) if s.len() == n => scales_f32 = s.to_vec(),
            (QuantFormat::Int4 { group, .. }, Scales::F16(s)) if s.len() == n * (k / group) => {
                scales_f16 = s.to_vec()
            }
            (
                QuantFormat::Q8_0
                | QuantFormat::Q4_0
                | QuantFormat::Q4_K
                | QuantFormat::Q5_K
                | QuantFormat::Q6_K,
                Scales::None,
            ) => {}
            (f, s) => {
                return Err(Error::invalid(
                    "scales",
                    format!("{} wants {}, got {s:?}", f.name(), scales_kind(f, n, k)),
                ))
            }
        }
        match format {
            QuantFormat::Int4 {
                group,
                zero_point: true,
            } => {
                let g = n * (k / group);
                if zeros.len() != g {
                    return Err(Error::invalid(
                        "zeros",
                        format!("{} zeros, expected {g} (n * k / group)", zeros.len()),
                    ));
                }
                if let Some(z) = zeros.iter().find(|&&z| z > 15) {
                    return Err(Error::invalid("zeros", format!("zero {z} outside 0..=15")));
                }
            }
            _ if !zeros.is_empty() => {
                return Err(Error::invalid(
                    "zeros",
                    format!("{} takes no zeros, got {}", format.name(), zeros.len()),
                ))
            }
            _ => {}
        }
        Ok(QuantizedHost {
            format,
            n,
            k,
            data,
            scales_f32,
            scales_f16,
            zeros,
        })
    }

    /// Wraps the bytes of a ggml tensor of type `ty` holding an `[n, k]` weight (GGUF dims
    /// `[k, n]`: rows of `k` values, row-major), as they are in the file: no requantising.
    /// `ty` is Q8_0, Q4_0, Q4_K, Q5_K or Q6_K.
    ///
    /// Errors: [`Error::InvalidArgument`] naming `ty` (a type the GEMV does not take: convert
    /// it first), `k` (not a positive multiple of the type's block: 32, or 256 for the
    /// K-quants) or `data` (not `n` rows of `ty.row_bytes(k)` bytes); [`Error::TooLarge`]
    /// naming `n` when `n · k` overflows.
    ///
    /// ```
    /// use fl_kernels::ggml::GgmlType;
    /// use fl_kernels::gemv::{QuantFormat, QuantizedHost};
    /// use fl_kernels::reference::ggml::random_blocks;
    /// let (n, k) = (3, 512); // 2 super-blocks of 144 bytes per row
    /// let bytes = random_blocks(GgmlType::Q4_K, n * k / 256, 1);
    /// let w = QuantizedHost::from_ggml(GgmlType::Q4_K, n, k, bytes)?;
    /// assert_eq!(w.format(), QuantFormat::Q4_K);
    /// assert_eq!(w.num_bytes(), 3 * 2 * 144);
    /// # Ok::<(), fl_kernels::Error>(())
    /// ```
    pub fn from_ggml(ty: GgmlType, n: usize, k: usize, data: Vec<u8>) -> Result<Self> {
        let format = QuantFormat::from_ggml(ty).ok_or_else(|| {
            Error::invalid(
                "ty",
                format!("{ty} weights: the GEMV takes q8_0, q4_0, q4_K, q5_K and q6_K"),
            )
        })?;
        QuantizedHost::new(format, n, k, data, Scales::None, Vec::new())
    }

    /// The storage format.
    pub fn format(&self) -> QuantFormat {
        self.format
    }
    /// Output rows.
    pub fn n(&self) -> usize {
        self.n
    }
    /// Input features (row length).
    pub fn k(&self) -> usize {
        self.k
    }
    /// The packed values / GGUF blocks.
    pub fn data(&self) -> &[u8] {
        &self.data
    }
    /// The scales (see [`Scales`]).
    pub fn scales(&self) -> Scales<'_> {
        match self.format {
            QuantFormat::Int8 => Scales::F32(&self.scales_f32),
            QuantFormat::Int4 { .. } => Scales::F16(&self.scales_f16),
            _ => Scales::None,
        }
    }
    /// The zero points (int4 with zero point only; else empty).
    pub fn zeros(&self) -> &[u8] {
        &self.zeros
    }
    /// Bytes a GEMV reads for the weight: data + scales + zeros.
    pub fn num_bytes(&self) -> usize {
        self.data.len() + 4 * self.scales_f32.len() + 2 * self.scales_f16.len() + self.zeros.len()
    }
}

fn scales_kind(f: QuantFormat, n: usize, k: usize) -> String {
    match f {
        QuantFormat::Int8 => format!("Scales::F32 of {n}"),
        QuantFormat::Int4 { group, .. } => format!("Scales::F16 of {}", n * (k / group)),
        _ => "Scales::None".into(),
    }
}

/// Rounds a positive finite `s` to the smallest f16 >= `s` (so that the stored scale never
/// shrinks the quantisation range).
fn f16_round_up(s: f32) -> f16 {
    let h = f16::from_f32(s);
    if h.to_f32() >= s {
        h
    } else {
        f16::from_bits(h.to_bits() + 1)
    }
}

/// Quantises f32 weights `[n, k]` (row-major, output-major) into `format`.
///
/// - `Int8`: `scale[r] = max|w[r, :]| / 127` (1 for an all-zero row),
///   `q = round(w / scale)` (ties away from zero).
/// - `Int4` symmetric: per group `scale = max|w| / 7` rounded **up** to f16,
///   `q = clamp(round(w / scale), −8, 7)`, stored as `q + 8`.
/// - `Int4` with zero point: per group `lo = min(min w, 0)`, `hi = max(max w, 0)`,
///   `scale = (hi − lo) / 15` rounded up to f16, `zero = clamp(round(−lo / scale), 0, 15)`,
///   `nib = clamp(round(w / scale) + zero, 0, 15)`.
/// - `Q8_0`, `Q4_0`: llama.cpp's reference quantisers (`quantize_row_q8_0_ref`,
///   `quantize_row_q4_0_ref`): `d = amax / 127`, `q = round(w / d)`; and `d = m / −8` with
///   `m` the value of largest magnitude, `nib = min(15, trunc(w / d + 8.5))`; `d` stored f16.
/// - `Q4_K`, `Q5_K`, `Q6_K`: ggml's reference quantisers (`quantize_row_q4_K_ref` ..., the
///   K-quant searches), [`crate::reference::ggml::quantize_row`]; their error is not bounded
///   by half a step as above (the searches trade it over a sub-block).
///
/// So `|w − dequantised| <= scale / 2` for every value (up to f32 rounding and, for the
/// GGUF formats, the f16 rounding of `d`, as in llama.cpp). An all-zero group gets scale 0.
///
/// Errors: [`Error::InvalidArgument`] naming `weights` (length not `n · k`, or a non-finite
/// value, or a value so large that its f16 scale overflows), `k` (not a positive multiple of
/// the group / 32 / 256) or `format` (int4 group not 32/64/128).
pub fn quantize(weights: &[f32], n: usize, k: usize, format: QuantFormat) -> Result<QuantizedHost> {
    format.check_shape(n, k)?;
    if weights.len() != n * k {
        return Err(Error::invalid(
            "weights",
            format!("{} values for [{n}, {k}]", weights.len()),
        ));
    }
    if let Some(i) = weights.iter().position(|w| !w.is_finite()) {
        return Err(Error::invalid(
            "weights",
            format!("non-finite value {} at index {i}", weights[i]),
        ));
    }
    let f16_max = f16::MAX.to_f32();
    let too_big = |what: &str, s: f32| {
        Error::invalid(
            "weights",
            format!("{what} {s:e} overflows f16 (values too large for this format)"),
        )
    };
    let mut data = vec![0u8; format.data_bytes(n, k)];
    let (mut sf32, mut sf16, mut zeros) = (Vec::new(), Vec::new(), Vec::new());
    match format {
        QuantFormat::Int8 => {
            sf32.reserve(n);
            for (r, row) in weights.chunks_exact(k).enumerate() {
                let amax = row.iter().fold(0f32, |a, w| a.max(w.abs()));
                let s = if amax > 0.0 { amax / 127.0 } else { 1.0 };
                sf32.push(s);
                for (j, w) in row.iter().enumerate() {
                    let q = (w / s).round().clamp(-127.0, 127.0) as i8;
                    data[r * k + j] = q as u8;
                }
            }
        }
        QuantFormat::Int4 { group, zero_point } => {
            let g = k / group;
            sf16.reserve(n * g);
            for (gi, grp) in weights.chunks_exact(group).enumerate() {
                let (r, gj) = (gi / g, gi % g);
                let (scale, zero) = if zero_point {
                    let lo = grp.iter().fold(0f32, |a, &w| a.min(w));
                    let hi = grp.iter().fold(0f32, |a, &w| a.max(w));
                    let s = (hi - lo) / 15.0;
                    if s > f16_max {
                        return Err(too_big("int4 scale", s));
                    }
                    let s = if s > 0.0 { f16_round_up(s) } else { f16::ZERO };
                    let sf = s.to_f32();
                    let z = if sf > 0.0 {
                        (-lo / sf).round().clamp(0.0, 15.0)
                    } else {
                        8.0
                    };
                    (s, z)
                } else {
                    let amax = grp.iter().fold(0f32, |a, w| a.max(w.abs()));
                    let s = amax / 7.0;
                    if s > f16_max {
                        return Err(too_big("int4 scale", s));
                    }
                    let s = if s > 0.0 { f16_round_up(s) } else { f16::ZERO };
                    (s, 8.0)
                };
                sf16.push(scale);
                if zero_point {
                    zeros.push(zero as u8);
                }
                let sf = scale.to_f32();
                let base = r * k + gj * group;
                for (j, &w) in grp.iter().enumerate() {
                    let nib = if sf > 0.0 {
                        ((w / sf).round() + zero).clamp(0.0, 15.0) as u8
                    } else {
                        zero as u8
                    };
                    let idx = base + j;
                    data[idx / 2] |= nib << (4 * (idx % 2));
                }
            }
        }
        QuantFormat::Q8_0 => {
            for (b, blk) in weights.chunks_exact(BLOCK).enumerate() {
                let amax = blk.iter().fold(0f32, |a, w| a.max(w.abs()));
                let d = amax / 127.0;
                if d > f16_max {
                    return Err(too_big("Q8_0 scale", d));
                }
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                let out = &mut data[b * Q8_0_BLOCK_BYTES..(b + 1) * Q8_0_BLOCK_BYTES];
                out[..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
                for (j, w) in blk.iter().enumerate() {
                    out[2 + j] = ((w * id).round() as i8) as u8;
                }
            }
        }
        QuantFormat::Q4_0 => {
            for (b, blk) in weights.chunks_exact(BLOCK).enumerate() {
                let (mut amax, mut max) = (0f32, 0f32);
                for &w in blk {
                    if amax < w.abs() {
                        amax = w.abs();
                        max = w;
                    }
                }
                let d = max / -8.0;
                if d.abs() > f16_max {
                    return Err(too_big("Q4_0 scale", d));
                }
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                let out = &mut data[b * Q4_0_BLOCK_BYTES..(b + 1) * Q4_0_BLOCK_BYTES];
                out[..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
                let nib = |w: f32| ((w * id + 8.5) as i8).min(15) as u8;
                for j in 0..16 {
                    out[2 + j] = nib(blk[j]) | (nib(blk[j + 16]) << 4);
                }
            }
        }
        QuantFormat::Q4_K | QuantFormat::Q5_K | QuantFormat::Q6_K => {
            let ty = format
                .ggml_type()
                .ok_or_else(|| Error::invalid("format", "no ggml type"))?;
            // Where each super-block keeps its f16 scales (d, dmin / d).
            let scale_at: &[usize] = if format == QuantFormat::Q6_K {
                &[208]
            } else {
                &[0, 2]
            };
            let bb = ty.block_bytes();
            data.clear();
            for row in weights.chunks_exact(k) {
                let q = crate::reference::ggml::quantize_row(ty, row)?;
                for blk in q.chunks_exact(bb) {
                    for &at in scale_at {
                        let d = f16::from_le_bytes([blk[at], blk[at + 1]]);
                        if !d.is_finite() {
                            return Err(too_big(&format!("{} scale", format.name()), d.to_f32()));
                        }
                    }
                }
                data.extend_from_slice(&q);
            }
        }
    }
    let scales = match format {
        QuantFormat::Int8 => Scales::F32(&sf32),
        QuantFormat::Int4 { .. } => Scales::F16(&sf16),
        _ => Scales::None,
    };
    QuantizedHost::new(format, n, k, data, scales, zeros)
}

/// A quantised `[n, k]` weight on the device: packed values (`DeviceTensor<u8>`), scales
/// and zero points as its format needs. Made by [`QuantWeight::upload`]; read by [`gemv`].
#[derive(Debug)]
pub struct QuantWeight {
    format: QuantFormat,
    n: usize,
    k: usize,
    data: DeviceTensor<u8>,
    scales_f32: Option<DeviceTensor<f32>>,
    scales_f16: Option<DeviceTensor<f16>>,
    zeros: Option<DeviceTensor<u8>>,
}

impl QuantWeight {
    /// The device pointer of the scales (f32 for int8, f16 for int4; 0 for the self-contained
    /// GGUF blocks) for a launch on `stream`, with the guard that keeps them in use.
    fn scales_ptr<'a>(&'a self, stream: &'a CudaStream) -> (u64, Option<SyncOnDrop<'a>>) {
        match (&self.scales_f32, &self.scales_f16) {
            (Some(s), _) => {
                let (p, g) = s.ptr(stream);
                (p, Some(g))
            }
            (None, Some(s)) => {
                let (p, g) = s.ptr(stream);
                (p, Some(g))
            }
            _ => (0, None),
        }
    }

    /// Copies a host-quantised weight to the device (queued on `stream`).
    ///
    /// Errors: a driver error from the allocation or the copy.
    pub fn upload(stream: &Arc<CudaStream>, w: &QuantizedHost) -> Result<Self> {
        let data = DeviceTensor::from_host(stream, &w.data, &[w.data.len()])?;
        let scales_f32 = match w.format {
            QuantFormat::Int8 => Some(DeviceTensor::from_host(stream, &w.scales_f32, &[w.n])?),
            _ => None,
        };
        let scales_f16 = match w.format {
            QuantFormat::Int4 { group, .. } => Some(DeviceTensor::from_host(
                stream,
                &w.scales_f16,
                &[w.n, w.k / group],
            )?),
            _ => None,
        };
        let zeros = match w.format {
            QuantFormat::Int4 {
                group,
                zero_point: true,
            } => Some(DeviceTensor::from_host(
                stream,
                &w.zeros,
                &[w.n, w.k / group],
            )?),
            _ => None,
        };
        Ok(QuantWeight {
            format: w.format,
            n: w.n,
            k: w.k,
            data,
            scales_f32,
            scales_f16,
            zeros,
        })
    }

    /// The storage format.
    pub fn format(&self) -> QuantFormat {
        self.format
    }
    /// Output rows.
    pub fn n(&self) -> usize {
        self.n
    }
    /// Input features.
    pub fn k(&self) -> usize {
        self.k
    }
    /// Bytes one [`gemv`] reads for the weight: packed values + scales + zeros.
    pub fn num_bytes(&self) -> usize {
        self.data.num_bytes()
            + self.scales_f32.as_ref().map_or(0, |t| t.num_bytes())
            + self.scales_f16.as_ref().map_or(0, |t| t.num_bytes())
            + self.zeros.as_ref().map_or(0, |t| t.num_bytes())
    }
}

/// `y[t, r] = Σ_j x[t, j] · W[r, j]`: the linear layer `y = x · Wᵀ` with a quantised weight.
///
/// Shapes: `x [m, k]`, `y [m, n]` with `[n, k]` the weight's shape and `m` in
/// 1..=[`MAX_M`] (`m = 0` does nothing). Dtypes: `x`, `y` f16 or bf16; the weight in any
/// [`QuantFormat`]. Accumulation in f32, one rounding to `T` at the output; weights are
/// dequantised in registers (never written out). Memory-bound at small `m`: one pass over
/// the weight bytes, shared by all `m` tokens. The K-quants take one kernel per format on every
/// path, reading the super-blocks straight from global memory: on tensor cores (16 output rows
/// per CTA, an mma per 16 values of a sub-block), except `Q6_K` at one token on CUDA cores (one
/// warp per output row), where each measured faster. With `k % 256 == 0` (every LLaMA shape) every
/// format streams its weight through a shared-memory ring (filled by the TMA engine for the
/// GGUF formats and int8 at one token on sm_90+ where that measured faster; `bench/RESULTS.md`
/// has the current figures). Other `k` take general kernels, which are slower (most for the
/// GGUF formats at 2..=16 tokens).
///
/// Errors: [`Error::Shape`] naming `x` (not 2-D, or `k` differs from the weight's) or `y`
/// (not `[m, n]`); [`Error::TooLarge`] naming `x` when `m` > [`MAX_M`].
///
/// ```no_run
/// use fl_kernels::gemv::{self, QuantFormat, QuantWeight};
/// use fl_kernels::{bf16, DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let (m, n, k) = (4, 11008, 4096);
/// let q = gemv::quantize(&vec![0.01f32; n * k], n, k, QuantFormat::Q4_0)?;
/// let w = QuantWeight::upload(s, &q)?;
/// let x = DeviceTensor::from_host(s, &vec![bf16::from_f32(1.0); m * k], &[m, k])?;
/// let mut y = DeviceTensor::<bf16>::zeros(s, &[m, n])?;
/// gemv::gemv(s, &x, &w, &mut y)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn gemv<T: HalfDType>(
    stream: &CudaStream,
    x: &DeviceTensor<T>,
    w: &QuantWeight,
    y: &mut DeviceTensor<T>,
) -> Result<()> {
    gemv_with_path(stream, x, w, y, GemvPath::Auto)
}

/// Which kernel [`gemv_with_path`] runs (testing and A/B benchmarking only). Every path gives
/// the same result up to f32 rounding: the summation order, and for int4 at `m = 1` in the
/// one-token kernel's 32-row CTAs of 4 warps, a product on raw nibbles whose offsets, x's group
/// sums times `M + z`, are subtracted per row in f32.
///
/// [`GemvPath::Auto`] is what [`gemv`] does: the tensor-core side for `m >= 2`, for int4 at
/// `m = 1`, and for int8 / Q8_0 / Q4_0 at `m = 1` when a one-token kernel takes the call (int8:
/// its shared memory fits, `k` up to ~64k values; Q8_0 / Q4_0: `k % 256 == 0`, whole rows on
/// 16-byte boundaries); otherwise the CUDA-core kernel (see `fl_gemv.h` and the top of
/// `kernels/gemv.cu`); f16 and bf16 activations alike. The tensor-core side picks, by format,
/// `m`, `n`, `k` and the GPU, among kernels of its own for one token (whole 16-byte pieces or
/// GGUF blocks per lane, rings of loads several steps ahead, on sm_90+ some filled by the TMA
/// engine), for 2..=16 tokens with `k % 256 == 0` (every token's x copied beside the weights),
/// and a general kernel for every other shape.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemvPath {
    /// What [`gemv`] does (see above).
    Auto,
    /// The CUDA-core kernel: f32 FMAs, one warp per output row.
    Fma,
    /// The tensor-core kernel: `mma.sync` m16n8k16 on the exact integers `q − zero` in
    /// f16 / bf16 (the activations' type), scales applied in f32 outside the mma (int4 at
    /// `m = 1`: on raw nibbles in some CTA shapes, see above), with the ring kernels where
    /// they apply.
    Mma,
}

impl GemvPath {
    fn to_ffi(self) -> i32 {
        (match self {
            GemvPath::Auto => fl_kernels_sys::FL_GEMV_PATH_AUTO,
            GemvPath::Fma => fl_kernels_sys::FL_GEMV_PATH_FMA,
            GemvPath::Mma => fl_kernels_sys::FL_GEMV_PATH_MMA,
        }) as i32
    }
}

/// [`gemv`] with the kernel forced (see [`GemvPath`]). Same shapes, dtypes and errors as
/// [`gemv`]. For tests and benchmarks.
#[doc(hidden)]
pub fn gemv_with_path<T: HalfDType>(
    stream: &CudaStream,
    x: &DeviceTensor<T>,
    w: &QuantWeight,
    y: &mut DeviceTensor<T>,
    path: GemvPath,
) -> Result<()> {
    let (n, k) = (w.n, w.k);
    if x.shape().len() != 2 || x.shape()[1] != k {
        return Err(Error::Shape {
            arg: "x",
            expected: format!("[m, {k}] (k of the weight)"),
            got: x.shape().to_vec(),
        });
    }
    let m = x.shape()[0];
    if m > MAX_M {
        return Err(Error::TooLarge {
            arg: "x",
            value: m,
            limit: MAX_M,
        });
    }
    expect_shape("y", y, &[m, n])?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let (mi, ni, ki) = (as_i64("x", m)?, as_i64("w", n)?, as_i64("x", k)?);
    let group = match w.format {
        QuantFormat::Int4 { group, .. } => group as i32,
        _ => 0,
    };
    let (px, _gx) = x.ptr(stream);
    let (pw, _gw) = w.data.ptr(stream);
    let (ps, _gs) = w.scales_ptr(stream);
    let (pz, _gz) = crate::tensor::opt_ptr(w.zeros.as_ref(), stream);
    let (py, _gy) = y.ptr_mut(stream);
    // SAFETY: x holds m·k and y m·n elements of T (shapes checked above); the weight's
    // buffers were sized by QuantizedHost::new for its format and [n, k]; every buffer lives
    // until the guards drop, after the launch is queued on `stream`. y is a distinct
    // allocation (&mut), so it overlaps no input.
    let status = unsafe {
        fl_kernels_sys::fl_gemv_quant_path(
            T::ID,
            w.format.ffi(),
            px as _,
            pw as _,
            ps as _,
            pz as _,
            group,
            py as _,
            mi,
            ni,
            ki,
            path.to_ffi(),
            raw_stream(stream),
        )
    };
    check("gemv", status)
}

/// Dequantises a whole weight into a dense tensor: `out[r, j] = T(W[r, j])` for the `[n, k]`
/// weight `W` that `w` stands for (exactly [`reference::gemv::dequantize`](crate::reference::gemv::dequantize):
/// `(q − zero) · scale` in f32, one rounded product for [`QuantFormat::Int8`] and exact for
/// the others; the K-quants bit for bit as ggml's `dequantize_row_*`; then one rounding to
/// `T`).
///
/// The prefill path of a weight-only quantised linear layer: past [`MAX_M`] tokens the GEMV
/// stops paying (it is memory-bound, a GEMM is not), so the weight is dequantised into a
/// scratch buffer and a dense tensor-core GEMM reads it (`fl_blas::Blas::linear`). Reads the
/// quantised bytes once and writes `n · k` values of `T`, 16 bytes per store.
///
/// Shapes: `out [n, k]` (the weight's shape). Dtypes: `out` `f32`, `f16` or `bf16`.
///
/// Errors: [`Error::Shape`] naming `out` when it is not `[n, k]`.
///
/// ```no_run
/// use fl_kernels::gemv::{self, QuantFormat, QuantWeight};
/// use fl_kernels::{f16, DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let (n, k) = (11008, 4096);
/// let fmt = QuantFormat::Int4 { group: 128, zero_point: false };
/// let q = gemv::quantize(&vec![0.01f32; n * k], n, k, fmt)?;
/// let w = QuantWeight::upload(s, &q)?;
/// let mut dense = DeviceTensor::<f16>::zeros(s, &[n, k])?;
/// gemv::dequantize(s, &w, &mut dense)?; // then e.g. blas.linear(&x, &dense, None, &mut y)
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn dequantize<T: FloatDType>(
    stream: &CudaStream,
    w: &QuantWeight,
    out: &mut DeviceTensor<T>,
) -> Result<()> {
    let (n, k) = (w.n, w.k);
    expect_shape("out", out, &[n, k])?;
    if n == 0 {
        return Ok(());
    }
    let (ni, ki) = (as_i64("w", n)?, as_i64("w", k)?);
    let group = match w.format {
        QuantFormat::Int4 { group, .. } => group as i32,
        _ => 0,
    };
    let (pw, _gw) = w.data.ptr(stream);
    let (ps, _gs) = w.scales_ptr(stream);
    let (pz, _gz) = crate::tensor::opt_ptr(w.zeros.as_ref(), stream);
    let (po, _go) = out.ptr_mut(stream);
    // SAFETY: out holds n·k elements of T (checked above); the weight's buffers were sized by
    // QuantizedHost::new for its format and [n, k]; every buffer lives until the guards drop,
    // after the launch is queued on `stream`. out is a distinct allocation (&mut).
    let status = unsafe {
        fl_kernels_sys::fl_gemv_dequantize(
            T::ID,
            w.format.ffi(),
            pw as _,
            ps as _,
            pz as _,
            group,
            po as _,
            ni,
            ki,
            raw_stream(stream),
        )
    };
    check("gemv::dequantize", status)
}

/// Embedding lookup straight from a quantised table: `out[i, :] = T(W[ids[i], :])`, where `W`
/// is the `[vocab, hidden]` table that `table` holds (`vocab = table.n()`, `hidden =
/// table.k()`), each value exactly as [`dequantize`] gives it. A GGUF file's `token_embd` in
/// its own blocks (Q4_K in a Q4_K_M file) stays that size on the device instead of a dense
/// copy; only the rows looked up are read.
///
/// An id outside `0..vocab` is never read: its row of `out` is zero and the failure is recorded
/// in `status` (as [`embedding::lookup`](crate::embedding::lookup) records it; nothing is
/// synchronised: check `status` when convenient).
///
/// Shapes: `ids [..]` (any shape, `i32`), `out [.., hidden]` (ids' shape plus hidden).
/// Dtypes: `out` `f32`, `f16` or `bf16`.
///
/// Errors: [`Error::Shape`] naming `out`; [`Error::InvalidArgument`] naming `ids` for more
/// than `i32::MAX` ids.
///
/// ```no_run
/// use fl_kernels::embedding::DeviceStatus;
/// use fl_kernels::gemv::{self, QuantFormat, QuantWeight};
/// use fl_kernels::{f16, DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let (vocab, hidden) = (32000, 4096);
/// let q = gemv::quantize(&vec![0.01f32; vocab * hidden], vocab, hidden, QuantFormat::Q8_0)?;
/// let table = QuantWeight::upload(s, &q)?;
/// let ids = DeviceTensor::from_host(s, &[1i32, 15043, 29892], &[3])?;
/// let mut x = DeviceTensor::<f16>::zeros(s, &[3, hidden])?;
/// let mut status = DeviceStatus::new(s)?;
/// gemv::embedding(s, &ids, &table, &mut x, &mut status)?;
/// status.check(s)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn embedding<T: FloatDType>(
    stream: &CudaStream,
    ids: &DeviceTensor<i32>,
    table: &QuantWeight,
    out: &mut DeviceTensor<T>,
    status: &mut crate::embedding::DeviceStatus,
) -> Result<()> {
    let (vocab, hidden) = (table.n, table.k);
    let n = crate::embedding::lookup_shapes(ids, hidden, out)?;
    if n == 0 {
        return Ok(());
    }
    let (ni, vi, hi) = (
        as_i64("ids", n)?,
        as_i64("table", vocab)?,
        as_i64("table", hidden)?,
    );
    let group = match table.format {
        QuantFormat::Int4 { group, .. } => group as i32,
        _ => 0,
    };
    let (pi, _gi) = ids.ptr(stream);
    let (pw, _gw) = table.data.ptr(stream);
    let (ps, _gs) = table.scales_ptr(stream);
    let (pz, _gz) = crate::tensor::opt_ptr(table.zeros.as_ref(), stream);
    let (po, _go) = out.ptr_mut(stream);
    let (pst, nonce, _gst) = status.arm(stream);
    // SAFETY: ids holds n i32 and out n·hidden elements of T (shapes checked above); the
    // table's buffers were sized by QuantizedHost::new for its format and [vocab, hidden];
    // status holds FL_DEVICE_STATUS_WORDS i32, 8-byte aligned; every buffer lives until the
    // guards drop, after the launch is queued on `stream`; out is a distinct allocation (&mut)
    // and the kernel reads no row outside the table.
    let st = unsafe {
        fl_kernels_sys::fl_gemv_embedding(
            T::ID,
            table.format.ffi(),
            pi as _,
            ni,
            pw as _,
            ps as _,
            pz as _,
            group,
            vi,
            hi,
            po as _,
            pst as _,
            nonce,
            raw_stream(stream),
        )
    };
    check("gemv::embedding", st)
}
