//! Rotary position embedding (RoPE) of Q and K in place: [`apply`] (angles computed on the
//! fly) and [`apply_with_table`] (cos/sin read from a [`RopeTable`]), configured by
//! [`RopeParams`].
//!
//! Both pairings: [`RopeStyle::NeoX`] (rotate-half, Hugging Face LLaMA) and
//! [`RopeStyle::Interleaved`] (Meta / GPT-J); partial rotary (`rotary_dim < head_dim`);
//! frequency scaling ([`Scaling::Linear`], [`Scaling::Llama3`]). Positions are per token
//! (`i32 [tokens]` on the device), so ragged and packed batches work.
//!
//! Invalid positions (negative, or past the table) cannot be checked on the host: the kernel
//! leaves such a token untouched and sets [`ERR_POSITION`] in an optional error flag (an
//! `i32 [1]` device tensor, see [`check_error_flag`]).
//!
//! CPU references: [`crate::reference::rope`](mod@crate::reference::rope).

use std::sync::Arc;

use cudarc::driver::{CudaStream, SyncOnDrop};

use crate::dtype::FloatDType;
use crate::error::check;
use crate::tensor::{as_i32, as_i64, check_flag_bits, expect_shape, raw_stream};
use crate::{DeviceTensor, Error, Result};

/// Largest `rotary_dim / 2` the kernels take (so `rotary_dim <= 512`).
pub const MAX_PAIRS: usize = fl_kernels_sys::FL_ROPE_MAX_PAIRS as usize;

/// Bit set in the error flag when a token's position was invalid (that token was skipped).
pub const ERR_POSITION: i32 = fl_kernels_sys::FL_ROPE_ERR_POSITION as i32;

/// Which elements of a head form a rotated pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RopeStyle {
    /// Rotate-half (GPT-NeoX, Hugging Face LLaMA): pair `i` is `(x[i], x[i + rotary_dim/2])`;
    /// `out = x * cos + rotate_half(x) * sin`.
    #[default]
    NeoX,
    /// Interleaved (Meta LLaMA, GPT-J): pair `i` is `(x[2i], x[2i + 1])`, i.e. `x` viewed as
    /// complex numbers multiplied by `e^{i·angle}`.
    Interleaved,
}

/// Frequency scaling for context extension (Hugging Face `rope_scaling`).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum Scaling {
    /// `inv_freq[i] = theta^(-2i / rotary_dim)`.
    #[default]
    None,
    /// Linear (position interpolation): angles `pos / factor * inv_freq[i]`, folded into the
    /// frequencies as `inv_freq[i] / factor` (as Hugging Face does).
    Linear {
        /// Scale factor (> 0).
        factor: f64,
    },
    /// LLaMA-3 (`rope_type: "llama3"`, Hugging Face `_compute_llama3_parameters`): with
    /// `wavelen = 2π / inv_freq`, `low = orig / low_freq_factor`, `high = orig /
    /// high_freq_factor`: `wavelen > low` → `inv_freq / factor`; `wavelen < high` →
    /// unchanged; otherwise `smooth = (orig / wavelen - low_freq_factor) / (high_freq_factor -
    /// low_freq_factor)` and `(1 - smooth) * inv_freq / factor + smooth * inv_freq`.
    Llama3 {
        /// `factor` (> 0), e.g. 8 for Llama 3.1.
        factor: f64,
        /// `low_freq_factor`, e.g. 1.
        low_freq_factor: f64,
        /// `high_freq_factor` (> `low_freq_factor`), e.g. 4.
        high_freq_factor: f64,
        /// `original_max_position_embeddings`, e.g. 8192.
        original_max_position_embeddings: usize,
    },
}

/// Rotary embedding configuration: head size, rotated part, base, pairing, scaling.
///
/// ```
/// use fl_kernels::rope::{RopeParams, RopeStyle, Scaling};
/// // Llama 3.1 8B
/// let p = RopeParams::new(128, 500_000.0).with_scaling(Scaling::Llama3 {
///     factor: 8.0,
///     low_freq_factor: 1.0,
///     high_freq_factor: 4.0,
///     original_max_position_embeddings: 8192,
/// });
/// assert_eq!(p.inv_freq()?.len(), 64);
/// assert_eq!(p.inv_freq()?[0], 1.0);
/// // partial rotary, interleaved pairs
/// let q = RopeParams::new(128, 10_000.0).with_rotary_dim(64).with_style(RopeStyle::Interleaved);
/// assert_eq!(q.inv_freq()?.len(), 32);
/// # Ok::<(), fl_kernels::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// Elements per head.
    pub head_dim: usize,
    /// Elements that rotate: the first `rotary_dim` of each head (even, `2..=head_dim`,
    /// at most `2 * MAX_PAIRS`); the rest are left untouched.
    pub rotary_dim: usize,
    /// The base `theta` (Hugging Face `rope_theta`), > 0.
    pub theta: f64,
    /// Pairing of elements.
    pub style: RopeStyle,
    /// Frequency scaling.
    pub scaling: Scaling,
}

impl RopeParams {
    /// Full rotary (`rotary_dim = head_dim`), rotate-half pairing, no scaling.
    pub fn new(head_dim: usize, theta: f64) -> Self {
        RopeParams {
            head_dim,
            rotary_dim: head_dim,
            theta,
            style: RopeStyle::NeoX,
            scaling: Scaling::None,
        }
    }

    /// The same with `rotary_dim` rotated elements (partial rotary).
    pub fn with_rotary_dim(mut self, rotary_dim: usize) -> Self {
        self.rotary_dim = rotary_dim;
        self
    }

    /// The same with another pairing.
    pub fn with_style(mut self, style: RopeStyle) -> Self {
        self.style = style;
        self
    }

    /// The same with frequency scaling.
    pub fn with_scaling(mut self, scaling: Scaling) -> Self {
        self.scaling = scaling;
        self
    }

    /// Checks every field; errors name the field (`head_dim`, `rotary_dim`, `theta`,
    /// `scaling`).
    pub fn validate(&self) -> Result<()> {
        if self.head_dim == 0 || self.head_dim > i32::MAX as usize {
            return Err(Error::invalid(
                "head_dim",
                format!("{} is not in 1..=i32::MAX", self.head_dim),
            ));
        }
        if self.rotary_dim < 2
            || self.rotary_dim % 2 != 0
            || self.rotary_dim > self.head_dim
            || self.rotary_dim / 2 > MAX_PAIRS
        {
            return Err(Error::invalid(
                "rotary_dim",
                format!(
                    "{} must be even, >= 2, <= head_dim ({}) and <= {}",
                    self.rotary_dim,
                    self.head_dim,
                    2 * MAX_PAIRS
                ),
            ));
        }
        if !(self.theta.is_finite() && self.theta > 0.0) {
            return Err(Error::invalid(
                "theta",
                format!("{} is not a positive finite number", self.theta),
            ));
        }
        let positive = |x: f64| x.is_finite() && x > 0.0;
        match self.scaling {
            Scaling::None => {}
            Scaling::Linear { factor } if positive(factor) => {}
            Scaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } if positive(factor)
                && positive(low_freq_factor)
                && high_freq_factor.is_finite()
                && high_freq_factor > low_freq_factor
                && original_max_position_embeddings > 0 => {}
            s => {
                return Err(Error::invalid(
                    "scaling",
                    format!(
                        "{s:?}: factors must be positive and finite, high_freq_factor > \
                         low_freq_factor, original_max_position_embeddings > 0"
                    ),
                ))
            }
        }
        Ok(())
    }

    /// The inverse frequencies the kernels use, `rotary_dim / 2` of them: computed in f64
    /// (`theta^(-2i / rotary_dim)`, then the [`Scaling`] rule) and rounded once to f32.
    ///
    /// Errors: those of [`validate`](Self::validate).
    pub fn inv_freq(&self) -> Result<Vec<f32>> {
        self.validate()?;
        let half = self.rotary_dim / 2;
        Ok((0..half)
            .map(|i| {
                let inv = self.theta.powf(-((2 * i) as f64) / self.rotary_dim as f64);
                scale_inv_freq(inv, &self.scaling) as f32
            })
            .collect())
    }

    /// The C ABI struct (validated, frequencies filled in).
    pub(crate) fn to_ffi(self) -> Result<fl_kernels_sys::fl_rope_params> {
        let inv = self.inv_freq()?;
        let mut p = fl_kernels_sys::fl_rope_params {
            head_dim: self.head_dim as i32,
            rotary_dim: self.rotary_dim as i32,
            interleaved: i32::from(self.style == RopeStyle::Interleaved),
            reserved: 0,
            inv_freq: [0.0; MAX_PAIRS],
        };
        p.inv_freq[..inv.len()].copy_from_slice(&inv);
        Ok(p)
    }
}

/// Applies a [`Scaling`] rule to one inverse frequency, in f64.
fn scale_inv_freq(inv: f64, scaling: &Scaling) -> f64 {
    match *scaling {
        Scaling::None => inv,
        Scaling::Linear { factor } => inv / factor,
        Scaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let orig = original_max_position_embeddings as f64;
            let low_freq_wavelen = orig / low_freq_factor;
            let high_freq_wavelen = orig / high_freq_factor;
            let wavelen = 2.0 * std::f64::consts::PI / inv;
            if wavelen > low_freq_wavelen {
                inv / factor
            } else if wavelen < high_freq_wavelen {
                inv
            } else {
                let smooth =
                    (orig / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                (1.0 - smooth) * inv / factor + smooth * inv
            }
        }
    }
}

/// Device pointer of an optional error flag (`i32 [1]`), null when absent.
fn flag_ptr<'a>(
    stream: &'a CudaStream,
    flag: Option<&'a mut DeviceTensor<i32>>,
) -> Result<(u64, Option<SyncOnDrop<'a>>)> {
    match flag {
        None => Ok((0, None)),
        Some(f) => {
            expect_shape("err_flag", f, &[1])?;
            let (p, g) = f.ptr_mut(stream);
            Ok((p, Some(g)))
        }
    }
}

/// Q, K and positions checked against each other and the params: (tokens, q_heads, kv_heads).
fn check_qk<T: FloatDType>(
    q: &DeviceTensor<T>,
    k: &DeviceTensor<T>,
    positions: &DeviceTensor<i32>,
    head_dim: usize,
) -> Result<(usize, usize, usize)> {
    let &[tokens, q_heads, d] = q.shape() else {
        return Err(Error::Shape {
            arg: "q",
            expected: format!("[tokens, q_heads, {head_dim}]"),
            got: q.shape().to_vec(),
        });
    };
    if d != head_dim {
        return Err(Error::Shape {
            arg: "q",
            expected: format!("[tokens, q_heads, {head_dim}] (head_dim of the params)"),
            got: q.shape().to_vec(),
        });
    }
    let kv_heads = match k.shape() {
        &[t, h, d] if t == tokens && d == head_dim => h,
        _ => {
            return Err(Error::Shape {
                arg: "k",
                expected: format!("[{tokens}, kv_heads, {head_dim}]"),
                got: k.shape().to_vec(),
            })
        }
    };
    expect_shape("positions", positions, &[tokens])?;
    for (arg, h) in [("q", q_heads), ("k", kv_heads)] {
        as_i32(arg, h)?;
    }
    Ok((tokens, q_heads, kv_heads))
}

/// Rotary position embedding of `q` and `k` in place, one launch for both, cos/sin computed
/// on the fly.
///
/// For token `t` at position `p = positions[t]`, each head of `q` and `k` and each pair
/// `i < rotary_dim / 2` with elements `(x0, x1)` (see [`RopeStyle`]):
/// `x0' = x0·cos(a) − x1·sin(a)`, `x1' = x1·cos(a) + x0·sin(a)`, where `a = p · inv_freq[i]`
/// is one f32 multiply (as Hugging Face computes it) and cos/sin are accurate for any f32 angle
/// (positions up to 128k and beyond). Computed in f32, rounded once to `T`. Elements past
/// `rotary_dim` are not touched.
///
/// Shapes: `q [tokens, q_heads, head_dim]`, `k [tokens, kv_heads, head_dim]` (any head counts),
/// `positions [tokens]`, `err_flag [1]`. Dtypes: `f32`, `f16`, `bf16`.
///
/// Errors: [`Error::InvalidArgument`] from [`RopeParams::validate`]; [`Error::Shape`] naming `q`
/// (not 3-D, or head size differs from `params.head_dim`), `k`, `positions` or `err_flag`. On
/// the device a negative position leaves that token untouched and ORs [`ERR_POSITION`] into
/// `err_flag` when given (see [`check_error_flag`]).
///
/// ```no_run
/// use fl_kernels::{rope::{self, RopeParams}, DeviceTensor, Gpu, f16};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let (tokens, q_heads, kv_heads, d) = (3, 32, 8, 128);
/// let mut q = DeviceTensor::<f16>::zeros(s, &[tokens, q_heads, d])?;
/// let mut k = DeviceTensor::<f16>::zeros(s, &[tokens, kv_heads, d])?;
/// let pos = DeviceTensor::from_host(s, &[0i32, 1, 2], &[tokens])?;
/// let mut flag = DeviceTensor::<i32>::zeros(s, &[1])?;
/// rope::apply(s, &mut q, &mut k, &pos, &RopeParams::new(d, 500_000.0), Some(&mut flag))?;
/// rope::check_error_flag(s, &flag)?; // waits; Err if a position was invalid
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn apply<T: FloatDType>(
    stream: &CudaStream,
    q: &mut DeviceTensor<T>,
    k: &mut DeviceTensor<T>,
    positions: &DeviceTensor<i32>,
    params: &RopeParams,
    err_flag: Option<&mut DeviceTensor<i32>>,
) -> Result<()> {
    let p = params.to_ffi()?;
    let (tokens, q_heads, kv_heads) = check_qk(q, k, positions, params.head_dim)?;
    let t = as_i64("q", tokens)?;
    let (pf, _gf) = flag_ptr(stream, err_flag)?;
    let (pp, _gp) = positions.ptr(stream);
    let (pq, _gq) = q.ptr_mut(stream);
    let (pk, _gk) = k.ptr_mut(stream);
    // SAFETY: q holds tokens * q_heads * head_dim elements of T, k tokens * kv_heads * head_dim,
    // positions `tokens` i32, the flag one i32 (or null); shapes checked above, so the row
    // strides below stay inside the buffers. `p` lives across the call (the launcher copies it).
    // The buffers live until the guards drop, after the launch is queued on `stream`.
    let status = unsafe {
        fl_kernels_sys::fl_rope_apply(
            T::ID,
            pq as _,
            pk as _,
            pp as _,
            t,
            q_heads as i32,
            kv_heads as i32,
            (q_heads * params.head_dim) as i64,
            (kv_heads * params.head_dim) as i64,
            &p,
            pf as _,
            raw_stream(stream),
        )
    };
    check("rope::apply", status)
}

/// A cos/sin table for [`apply_with_table`] (FasterLLaMA's `freqs_cis`): `cos[p, i]`,
/// `sin[p, i]` for positions `p < max_pos` and pairs `i < rotary_dim / 2`, f32, built on the
/// device with the same f32 angles and sincos as [`apply`], so both paths give bit-identical
/// results.
///
/// ```no_run
/// use fl_kernels::{rope::{RopeParams, RopeTable}, Gpu};
/// let gpu = Gpu::new(0)?;
/// let table = RopeTable::new(gpu.stream(), &RopeParams::new(128, 500_000.0), 131_072)?;
/// assert_eq!(table.cos().shape(), &[131_072, 64]);
/// # Ok::<(), fl_kernels::Error>(())
/// ```
#[derive(Debug)]
pub struct RopeTable {
    cos: DeviceTensor<f32>,
    sin: DeviceTensor<f32>,
    params: RopeParams,
    ffi: fl_kernels_sys::fl_rope_params,
}

impl RopeTable {
    /// Allocates and fills the table for positions `0..max_pos` (queued on `stream`).
    ///
    /// Errors: those of [`RopeParams::validate`]; [`Error::InvalidArgument`] naming `max_pos`
    /// when it is 0 or above 2^31.
    pub fn new(stream: &Arc<CudaStream>, params: &RopeParams, max_pos: usize) -> Result<Self> {
        let ffi = params.to_ffi()?;
        if max_pos == 0 || max_pos > 1 << 31 {
            return Err(Error::invalid(
                "max_pos",
                format!("{max_pos} is not in 1..=2^31"),
            ));
        }
        let half = params.rotary_dim / 2;
        let mut cos = DeviceTensor::<f32>::zeros(stream, &[max_pos, half])?;
        let mut sin = DeviceTensor::<f32>::zeros(stream, &[max_pos, half])?;
        {
            let (pc, _gc) = cos.ptr_mut(stream);
            let (ps, _gs) = sin.ptr_mut(stream);
            // SAFETY: cos and sin hold max_pos * rotary_dim / 2 f32 each; ffi is a valid
            // params struct living across the call.
            let status = unsafe {
                fl_kernels_sys::fl_rope_build_table(
                    &ffi,
                    max_pos as i64,
                    pc as _,
                    ps as _,
                    raw_stream(stream),
                )
            };
            check("rope::RopeTable::new", status)?;
        }
        Ok(RopeTable {
            cos,
            sin,
            params: *params,
            ffi,
        })
    }

    /// Positions covered: `0..max_pos`.
    pub fn max_pos(&self) -> usize {
        self.cos.shape()[0]
    }

    /// The params the table was built for.
    pub fn params(&self) -> &RopeParams {
        &self.params
    }

    /// cos table, f32 `[max_pos, rotary_dim / 2]`.
    pub fn cos(&self) -> &DeviceTensor<f32> {
        &self.cos
    }

    /// sin table, f32 `[max_pos, rotary_dim / 2]`.
    pub fn sin(&self) -> &DeviceTensor<f32> {
        &self.sin
    }
}

/// [`apply`] with cos/sin read from `table` (built for the params used here).
///
/// Shapes as [`apply`], with `head_dim = table.params().head_dim`. A position `< 0` or
/// `>= table.max_pos()` leaves that token untouched (nothing is clamped) and ORs
/// [`ERR_POSITION`] into `err_flag` when given.
///
/// Errors: [`Error::Shape`] naming `q`, `k`, `positions` or `err_flag`.
///
/// ```no_run
/// use fl_kernels::{rope::{self, RopeParams, RopeTable}, DeviceTensor, Gpu, bf16};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let params = RopeParams::new(128, 10_000.0);
/// let table = RopeTable::new(s, &params, 4096)?;
/// let mut q = DeviceTensor::<bf16>::zeros(s, &[2, 32, 128])?;
/// let mut k = DeviceTensor::<bf16>::zeros(s, &[2, 8, 128])?;
/// let pos = DeviceTensor::from_host(s, &[17i32, 4095], &[2])?;
/// rope::apply_with_table(s, &mut q, &mut k, &pos, &table, None)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn apply_with_table<T: FloatDType>(
    stream: &CudaStream,
    q: &mut DeviceTensor<T>,
    k: &mut DeviceTensor<T>,
    positions: &DeviceTensor<i32>,
    table: &RopeTable,
    err_flag: Option<&mut DeviceTensor<i32>>,
) -> Result<()> {
    let head_dim = table.params.head_dim;
    let (tokens, q_heads, kv_heads) = check_qk(q, k, positions, head_dim)?;
    let t = as_i64("q", tokens)?;
    let (pf, _gf) = flag_ptr(stream, err_flag)?;
    let (pp, _gp) = positions.ptr(stream);
    let (pc, _gc) = table.cos.ptr(stream);
    let (ps, _gs) = table.sin.ptr(stream);
    let (pq, _gq) = q.ptr_mut(stream);
    let (pk, _gk) = k.ptr_mut(stream);
    // SAFETY: as in `apply`; the tables hold max_pos * rotary_dim / 2 f32 each and the kernel
    // reads only rows < max_pos.
    let status = unsafe {
        fl_kernels_sys::fl_rope_apply_table(
            T::ID,
            pq as _,
            pk as _,
            pp as _,
            t,
            q_heads as i32,
            kv_heads as i32,
            (q_heads * head_dim) as i64,
            (kv_heads * head_dim) as i64,
            &table.ffi,
            pc as _,
            ps as _,
            table.max_pos() as i64,
            pf as _,
            raw_stream(stream),
        )
    };
    check("rope::apply_with_table", status)
}

/// Reads an error flag written by [`apply`] / [`apply_with_table`] (waits for `stream`):
/// `Ok` when it is 0, else [`Error::DeviceCheck`] saying what was found. The flag is not
/// cleared; zero it (e.g. `copy_from_host(s, &[0])`) to reuse it.
///
/// Errors: also [`Error::Shape`] naming `err_flag` when it is not `[1]`.
pub fn check_error_flag(stream: &Arc<CudaStream>, err_flag: &DeviceTensor<i32>) -> Result<()> {
    check_flag_bits(
        stream,
        err_flag,
        "rope",
        &[(
            ERR_POSITION,
            "a position was negative or past the cos/sin table",
        )],
        "those tokens were left unrotated",
    )
}

/// The row order under which a checkpoint laid out for the rotate-half pairing
/// ([`RopeStyle::NeoX`], Hugging Face LLaMA) computes the same attention with the
/// interleaved pairing ([`RopeStyle::Interleaved`]): in every head of `head_dim` rows, new row
/// `2i` is old row `i` and new row `2i + 1` is old row `i + rotary_dim / 2` (`i < rotary_dim /
/// 2`); rows past `rotary_dim` keep their place. Returns, for each new row of a `[heads *
/// head_dim, ..]` weight, the old row it takes.
///
/// Applied to the q and k rows of the QKV weight (and bias), the projection then yields q and
/// k with each rotate-half pair side by side, so the interleaved rotation of the permuted
/// vector is the permutation of the rotate-half rotation of the original, and `q · k` is
/// unchanged (both permuted alike); v is not touched. This is what lets the rotation run in the
/// epilogue of the QKV GEMV ([`crate::gemv_dense::linear_rope_append`]), where a lane holds
/// adjacent outputs.
///
/// Errors: [`Error::InvalidArgument`] naming `rotary_dim` (odd, 0, or past `head_dim`).
///
/// ```
/// use fl_kernels::rope::rotate_half_to_interleaved_rows;
/// // one head of 8 rows, all rotary: pairs (0,4) (1,5) (2,6) (3,7) become adjacent
/// assert_eq!(rotate_half_to_interleaved_rows(1, 8, 8)?, vec![0, 4, 1, 5, 2, 6, 3, 7]);
/// // partial rotary: the last 4 rows stay
/// assert_eq!(rotate_half_to_interleaved_rows(1, 8, 4)?, vec![0, 2, 1, 3, 4, 5, 6, 7]);
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn rotate_half_to_interleaved_rows(
    heads: usize,
    head_dim: usize,
    rotary_dim: usize,
) -> Result<Vec<usize>> {
    if rotary_dim == 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim {
        return Err(Error::invalid(
            "rotary_dim",
            format!("{rotary_dim} must be even, >= 2 and <= head_dim ({head_dim})"),
        ));
    }
    let half = rotary_dim / 2;
    let mut rows = Vec::with_capacity(heads * head_dim);
    for h in 0..heads {
        let base = h * head_dim;
        rows.extend((0..head_dim).map(|e| {
            base + if e >= rotary_dim {
                e
            } else if e % 2 == 0 {
                e / 2
            } else {
                e / 2 + half
            }
        }));
    }
    Ok(rows)
}
