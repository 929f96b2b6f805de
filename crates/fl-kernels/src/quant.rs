//! INT8 W8A8 (FasterLLaMA v1.0, FasterTransformer 3.0): the fused kernels around the int8
//! GEMMs of a LLaMA decoder layer and of a BERT encoder layer.
//!
//! Weights are quantised once, symmetric per output channel
//! ([`quantize_weights_per_channel`]); activations are quantised per token by the kernel that
//! produces them; the int8 GEMM (`fl_blas::Blas::gemm_i8`) writes int32, which the next kernel
//! dequantises with the token's and the channel's scales. One layer:
//!
//! ```text
//! x_q, x_s    = rms_norm_quant(h, w_attn_norm)                  [tokens, hidden] i8, [tokens] f32
//! acc         = gemm_i8(x_q, Wqkv_q)                             [tokens, (hq + 2 hkv) d] i32
//! qkv         = dequant_rope(acc, x_s, Wqkv_s, positions)        f16/bf16, RoPE on q and k
//! attn        = attention(q, k, v)                               (not here)
//! a_q, a_s    = quantize_per_token(attn)
//! acc         = gemm_i8(a_q, Wo_q)                               [tokens, hidden] i32
//! y_q, y_s    = dequant_add_rms_norm_quant(acc, a_s, Wo_s, h, w_ffn_norm)   (h += o)
//! acc         = gemm_i8(y_q, Wgate_up_q)                         [tokens, 2 inter] i32
//! m_q, m_s    = dequant_silu_mul_quant(acc, y_s, Wgate_up_s)     [tokens, inter] i8
//! acc         = gemm_i8(m_q, Wdown_q)                            [tokens, hidden] i32
//! dequant_add(acc, m_s, Wdown_s, h)                              (h += down)
//! ```
//!
//! A BERT encoder layer (post-LayerNorm, GELU; FasterTransformer 3.0's INT8 path):
//!
//! ```text
//! x_q, x_s = layer_norm_quant(emb, ln_emb, y = h)            (once; h: the hidden state)
//! acc      = gemm_i8(x_q, Wqkv_q);  qkv = dequantize(acc, x_s, Wqkv_s, bqkv)
//! attn     = attention(q, k, v)                              (not here)
//! a_q, a_s = quantize_per_token(attn)  or  quantize_calibrated(attn, amax)
//! acc      = gemm_i8(a_q, Wo_q)
//! y_q, y_s = dequant_bias_add_layer_norm_quant(acc, a_s, Wo_s, bo, h, ln_attn)  (h = LN(h + o))
//! acc      = gemm_i8(y_q, W1_q)
//! m_q, m_s = dequant_bias_gelu_quant(acc, y_s, W1_s, b1, erf)
//! acc      = gemm_i8(m_q, W2_q)
//! x_q, x_s = dequant_bias_add_layer_norm_quant(acc, m_s, W2_s, b2, h, ln_ffn)   (h = LN(h + f))
//! ```
//!
//! ## Quantisation rule
//! For a row of f32 values `v` (a token's activations, or a weight's output channel):
//! `amax = max|v|`, `scale = amax / 127`, `inv = 127 / amax` (0 when `amax` is 0),
//! `q = rint(clamp(v · inv, −127, 127))` with round-half-to-even, each step one rounded f32
//! operation. So `|v − q·scale| ≤ scale/2` (up to f32 rounding) and the largest `|v|` maps to
//! ±127. Dequantisation of a GEMM output: `deq = (f32(acc) · act_scale[t]) · weight_scale[n]`.
//!
//! With a calibrated per-tensor amax `A` ([`ScaleMode::Calibrated`], FasterTransformer 3.0's
//! static scales, from a calibration pass over sample inputs) the same formulas run with
//! `amax = A` for every token: `scale[t] = A / 127`, `inv = 127 / A` (0 when `A` is 0), and
//! values beyond `±A` saturate at ±127. `scale[t]` is still written per token, so every
//! dequantising kernel and GEMM reads both modes alike.
//!
//! Activations are `f16` or `bf16` ([`HalfDType`]); all math is f32. The row kernels keep a
//! token's row in registers (one CTA per row) when its length is a multiple of 8 and at most
//! 32768; other sizes take a scalar path with the same arithmetic.
//!
//! CPU references: [`crate::reference::quant`](mod@crate::reference::quant).

use cudarc::driver::CudaStream;

use crate::activation::GeluKind;
use crate::dtype::HalfDType;
use crate::error::check;
use crate::rope::{RopeParams, RopeStyle};
use crate::tensor::{as_i64, check_eps, expect_shape, opt_ptr, raw_stream};
use crate::{DeviceTensor, Error, Result};

/// The largest quantised magnitude (symmetric int8: −127..=127, −128 is never produced).
pub const QMAX: f32 = 127.0;

/// Quantises one row with the [module's rule](self#quantisation-rule): writes `q` and
/// returns the scale. Host code (weights); mirrors the kernels' f32 arithmetic exactly.
fn quantize_row_into(v: &[f32], q: &mut [i8]) -> f32 {
    let amax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    let scale = amax / QMAX;
    let inv = if amax > 0.0 {
        (QMAX / amax).min(f32::MAX)
    } else {
        0.0
    };
    for (o, &x) in q.iter_mut().zip(v) {
        *o = (x * inv).clamp(-QMAX, QMAX).round_ties_even() as i8;
    }
    scale
}

/// Quantises a weight `w [n, k]` (row-major, `nn.Linear` layout: `n` output channels of `k`
/// inputs) symmetrically per output channel: returns `(q [n, k], scale [n])` with
/// `w[c, i] ≈ q[c, i] · scale[c]`, by the [module's rule](self#quantisation-rule) (the one the
/// activation kernels use). Runs on the host, once per weight.
///
/// Errors: [`Error::InvalidArgument`] naming `w` when `w.len() != n * k`.
///
/// ```
/// use fl_kernels::quant::quantize_weights_per_channel;
/// let w = [0.5f32, -1.0, 0.25, 2.0, 1.0, -0.5];
/// let (q, s) = quantize_weights_per_channel(&w, 2, 3)?;
/// assert_eq!(q, vec![64, -127, 32, 127, 64, -32]);
/// assert_eq!(s, vec![1.0 / 127.0, 2.0 / 127.0]);
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn quantize_weights_per_channel(w: &[f32], n: usize, k: usize) -> Result<(Vec<i8>, Vec<f32>)> {
    if n.checked_mul(k) != Some(w.len()) {
        return Err(Error::invalid(
            "w",
            format!("{} elements given for [n, k] = [{n}, {k}]", w.len()),
        ));
    }
    let mut q = vec![0i8; w.len()];
    let mut s = Vec::with_capacity(n);
    if k > 0 {
        for (row, qrow) in w.chunks(k).zip(q.chunks_mut(k)) {
            s.push(quantize_row_into(row, qrow));
        }
    } else {
        s.resize(n, 0.0);
    }
    Ok((q, s))
}

/// The int32 output of an int8 GEMM with the scales that dequantise it:
/// `deq[t, n] = (f32(acc[t, n]) · act_scale[t]) · weight_scale[n]`.
#[derive(Debug, Clone, Copy)]
pub struct Dequant<'a> {
    /// GEMM output, `i32 [tokens, width]`.
    pub acc: &'a DeviceTensor<i32>,
    /// Per-token scales of the GEMM's activation input, `f32 [tokens]`.
    pub act_scale: &'a DeviceTensor<f32>,
    /// Per-output-channel scales of the GEMM's weight, `f32 [width]`.
    pub weight_scale: &'a DeviceTensor<f32>,
}

/// `(tokens, width)` of a 2-D tensor named `arg`, `width >= 1`.
fn dims2<T: crate::DType>(arg: &'static str, t: &DeviceTensor<T>) -> Result<(usize, usize)> {
    match *t.shape() {
        [tokens, width] if width >= 1 => Ok((tokens, width)),
        _ => Err(Error::Shape {
            arg,
            expected: "[tokens, width] with width >= 1".into(),
            got: t.shape().to_vec(),
        }),
    }
}

/// Checks a [`Dequant`]: returns `(tokens, width)` of `acc`.
fn check_dequant(d: &Dequant<'_>) -> Result<(usize, usize)> {
    let (tokens, width) = dims2("acc", d.acc)?;
    expect_shape("act_scale", d.act_scale, &[tokens])?;
    expect_shape("weight_scale", d.weight_scale, &[width])?;
    Ok((tokens, width))
}

fn check_q(
    q: &DeviceTensor<i8>,
    scale: &DeviceTensor<f32>,
    tokens: usize,
    width: usize,
) -> Result<()> {
    expect_shape("q", q, &[tokens, width])?;
    expect_shape("scale", scale, &[tokens])
}

/// Per-token quantisation: `q[t, i]`, `scale[t]` from `v = f32(x[t, i])` by the
/// [module's rule](self#quantisation-rule) (e.g. the attention output before the O GEMM).
///
/// Shapes: `x [tokens, width]`, `q [tokens, width]`, `scale [tokens]`. Dtypes: `x` `f16` or
/// `bf16`, `q` `i8`, `scale` `f32`.
///
/// Errors: [`Error::Shape`] naming `x` (not 2-D, or width 0), `q` or `scale`.
///
/// ```no_run
/// use fl_kernels::{quant, DeviceTensor, Gpu, f16};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let x = DeviceTensor::from_host(s, &[f16::from_f32(0.5), f16::from_f32(-2.0)], &[1, 2])?;
/// let mut q = DeviceTensor::<i8>::zeros(s, &[1, 2])?;
/// let mut scale = DeviceTensor::<f32>::zeros(s, &[1])?;
/// quant::quantize_per_token(s, &x, &mut q, &mut scale)?;
/// assert_eq!(q.to_host(s)?, vec![32, -127]);
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn quantize_per_token<T: HalfDType>(
    stream: &CudaStream,
    x: &DeviceTensor<T>,
    q: &mut DeviceTensor<i8>,
    scale: &mut DeviceTensor<f32>,
) -> Result<()> {
    let (tokens, width) = dims2("x", x)?;
    check_q(q, scale, tokens, width)?;
    let (t, w) = (as_i64("x", tokens)?, as_i64("x", width)?);
    let (px, _gx) = x.ptr(stream);
    let (pq, _gq) = q.ptr_mut(stream);
    let (ps, _gs) = scale.ptr_mut(stream);
    // SAFETY: x and q hold tokens * width elements, scale tokens (shapes checked above); the
    // guards keep the buffers alive until the launch is queued on `stream`.
    let status = unsafe {
        fl_kernels_sys::fl_quantize_per_token(
            T::ID,
            px as _,
            pq as _,
            ps as _,
            t,
            w,
            raw_stream(stream),
        )
    };
    check("quant::quantize_per_token", status)
}

/// RMSNorm then per-token quantisation (FasterLLaMA `resNormQuantized`), one pass:
/// `v = (f32(x[t, i]) · rstd[t]) · f32(weight[i])` with `rstd[t] = 1 / sqrt(mean_i x² + eps)`
/// (as [`norm::rms_norm`](crate::norm::rms_norm), not rounded to `T`), then `q`, `scale` by
/// the [module's rule](self#quantisation-rule). The input of the QKV GEMM.
///
/// Shapes: `x [tokens, hidden]`, `weight [hidden]`, `q [tokens, hidden]`, `scale [tokens]`.
/// Dtypes: `x`, `weight` `f16` or `bf16`.
///
/// Errors: [`Error::Shape`] naming `x`, `weight`, `q` or `scale`; [`Error::InvalidArgument`]
/// naming `eps` unless finite and `> 0`.
///
/// ```no_run
/// use fl_kernels::{quant, DeviceTensor, Gpu, bf16};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let (tokens, hidden) = (4, 4096);
/// let x = DeviceTensor::<bf16>::filled(s, &[tokens, hidden], bf16::from_f32(0.5))?;
/// let w = DeviceTensor::<bf16>::filled(s, &[hidden], bf16::from_f32(1.0))?;
/// let mut q = DeviceTensor::<i8>::zeros(s, &[tokens, hidden])?;
/// let mut scale = DeviceTensor::<f32>::zeros(s, &[tokens])?;
/// quant::rms_norm_quant(s, &x, &w, 1e-5, &mut q, &mut scale)?;
/// assert!(q.to_host(s)?.iter().all(|&v| v == 127)); // every normalised value is 1
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn rms_norm_quant<T: HalfDType>(
    stream: &CudaStream,
    x: &DeviceTensor<T>,
    weight: &DeviceTensor<T>,
    eps: f32,
    q: &mut DeviceTensor<i8>,
    scale: &mut DeviceTensor<f32>,
) -> Result<()> {
    let (tokens, hidden) = dims2("x", x)?;
    expect_shape("weight", weight, &[hidden])?;
    check_q(q, scale, tokens, hidden)?;
    check_eps(eps)?;
    let (t, h) = (as_i64("x", tokens)?, as_i64("x", hidden)?);
    let (px, _gx) = x.ptr(stream);
    let (pw, _gw) = weight.ptr(stream);
    let (pq, _gq) = q.ptr_mut(stream);
    let (ps, _gs) = scale.ptr_mut(stream);
    // SAFETY: x and q hold tokens * hidden elements, weight hidden, scale tokens (checked
    // above); the guards keep the buffers alive until the launch is queued.
    let status = unsafe {
        fl_kernels_sys::fl_rms_norm_quant(
            T::ID,
            px as _,
            pw as _,
            pq as _,
            ps as _,
            t,
            h,
            eps,
            raw_stream(stream),
        )
    };
    check("quant::rms_norm_quant", status)
}

/// Head counts of a fused QKV projection: the GEMM output row of a token is `q_heads` q
/// heads, then `kv_heads` k heads, then `kv_heads` v heads, `head_dim` each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QkvHeads {
    /// Query heads.
    pub q_heads: usize,
    /// Key (and value) heads (GQA/MQA: fewer than `q_heads`).
    pub kv_heads: usize,
}

impl QkvHeads {
    /// Columns of the fused QKV row for heads of `head_dim`: `(q_heads + 2·kv_heads)·head_dim`.
    pub fn width(&self, head_dim: usize) -> Option<usize> {
        self.kv_heads
            .checked_mul(2)?
            .checked_add(self.q_heads)?
            .checked_mul(head_dim)
    }
}

/// Dequantises the fused QKV GEMM output and applies rotary embedding to q and k
/// (FasterLLaMA `QKRoteEmbeddingTranspose` + `DequantizedVTranspose`, without the transposes):
///
/// ```text
/// x          = deq(t, c)                                    (every column)
/// q, k pair (i, i + rotary_dim/2), i < rotary_dim/2:        a = f32(positions[t]) · inv_freq[i]
///     out[i]            = T(x_i · cos a − x_{i+r/2} · sin a)
///     out[i + r/2]      = T(x_{i+r/2} · cos a + x_i · sin a)
/// v, and q/k elements past rotary_dim:  out = T(x)
/// ```
///
/// with the inverse frequencies of [`RopeParams::inv_freq`] (scaling included), cos/sin
/// computed on the fly (no table; any `i32` position), as [`rope::apply`](crate::rope::apply).
/// Rotate-half pairing only.
///
/// One fused output, `out [tokens, (q_heads + 2·kv_heads)·head_dim]` in the layout of the input
/// (per token: q heads, k heads, v heads); split it with strides (e.g. the KV-cache write and
/// attention take row strides).
///
/// Shapes: `d.acc` and `out` `[tokens, width]` with `width = heads.width(head_dim)`,
/// `d.act_scale [tokens]`, `d.weight_scale [width]`, `positions [tokens]`.
///
/// Errors: [`Error::InvalidArgument`] from [`RopeParams::validate`], naming `rope` for an
/// interleaved style, `heads` when there is no head or the counts pass `i32`;
/// [`Error::Shape`] naming `acc`, `act_scale`, `weight_scale`, `positions` or `out`.
///
/// ```no_run
/// use fl_kernels::{quant::{self, Dequant, QkvHeads}, rope::RopeParams, DeviceTensor, Gpu, f16};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let (tokens, heads, d) = (2, QkvHeads { q_heads: 32, kv_heads: 8 }, 128);
/// let w = heads.width(d).unwrap();
/// let acc = DeviceTensor::<i32>::zeros(s, &[tokens, w])?;      // from Blas::gemm_i8
/// let act_scale = DeviceTensor::<f32>::filled(s, &[tokens], 0.01)?;
/// let weight_scale = DeviceTensor::<f32>::filled(s, &[w], 0.001)?;
/// let pos = DeviceTensor::from_host(s, &[7i32, 8], &[tokens])?;
/// let mut qkv = DeviceTensor::<f16>::zeros(s, &[tokens, w])?;
/// let deq = Dequant { acc: &acc, act_scale: &act_scale, weight_scale: &weight_scale };
/// quant::dequant_rope(s, deq, &pos, heads, &RopeParams::new(d, 500_000.0), &mut qkv)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn dequant_rope<T: HalfDType>(
    stream: &CudaStream,
    d: Dequant<'_>,
    positions: &DeviceTensor<i32>,
    heads: QkvHeads,
    rope: &RopeParams,
    out: &mut DeviceTensor<T>,
) -> Result<()> {
    // Validates the parameters and computes the frequencies.
    let p = rope.to_ffi()?;
    if rope.style != RopeStyle::NeoX {
        return Err(Error::invalid(
            "rope",
            "dequant_rope supports the rotate-half (NeoX) pairing only",
        ));
    }
    let rotated = heads.q_heads.checked_add(heads.kv_heads);
    if !rotated.is_some_and(|h| h >= 1 && h <= i32::MAX as usize) {
        return Err(Error::invalid(
            "heads",
            format!("{heads:?}: need at least one head, and q_heads + kv_heads <= i32::MAX"),
        ));
    }
    let width = heads
        .width(rope.head_dim)
        .ok_or_else(|| Error::invalid("heads", format!("{heads:?}: width overflows usize")))?;
    let (tokens, w) = check_dequant(&d)?;
    if w != width {
        return Err(Error::Shape {
            arg: "acc",
            expected: format!("[tokens, {width}] ((q_heads + 2 kv_heads) * head_dim)"),
            got: d.acc.shape().to_vec(),
        });
    }
    expect_shape("positions", positions, &[tokens])?;
    expect_shape("out", out, &[tokens, width])?;
    let t = as_i64("acc", tokens)?;
    as_i64("acc", width)?;
    let (pa, _ga) = d.acc.ptr(stream);
    let (psa, _gsa) = d.act_scale.ptr(stream);
    let (psw, _gsw) = d.weight_scale.ptr(stream);
    let (pp, _gp) = positions.ptr(stream);
    let (po, _go) = out.ptr_mut(stream);
    // SAFETY: acc and out hold tokens * width elements with width = (q_heads + 2 kv_heads) *
    // head_dim (checked above, head_dim and rotary_dim validated by inv_freq), act_scale and
    // positions `tokens`, weight_scale `width`; `p` lives across the call (the launcher copies
    // the frequencies); the guards keep the buffers alive until the launch is queued.
    let status = unsafe {
        fl_kernels_sys::fl_dequant_rope(
            T::ID,
            pa as _,
            psa as _,
            psw as _,
            pp as _,
            po as _,
            t,
            heads.q_heads as i32,
            heads.kv_heads as i32,
            &p,
            raw_stream(stream),
        )
    };
    check("quant::dequant_rope", status)
}

/// Dequantises the O-projection output, adds it to the residual stream in place, then
/// RMSNorm and per-token quantisation (FasterLLaMA `dequantizedResidualResNormQuantized`):
///
/// ```text
/// residual[t, i] = T(f32(residual[t, i]) + deq(t, i))          (written back)
/// v              = (f32(residual[t, i]) · rstd[t]) · f32(weight[i])
/// q, scale       = quantise(v)                                 (the gate/up GEMM input)
/// ```
///
/// The norm is that of the new residual as rounded to `T` (as
/// [`norm::add_rms_norm`](crate::norm::add_rms_norm)).
///
/// Shapes: `d.acc`, `residual`, `q` `[tokens, hidden]`, `d.act_scale`, `scale` `[tokens]`,
/// `d.weight_scale`, `weight` `[hidden]`. Dtypes: `residual`, `weight` `f16` or `bf16`.
///
/// Errors: [`Error::Shape`] naming `acc`, `act_scale`, `weight_scale`, `residual`, `weight`,
/// `q` or `scale`; [`Error::InvalidArgument`] naming `eps`.
///
/// ```no_run
/// use fl_kernels::{quant::{self, Dequant}, DeviceTensor, Gpu, bf16};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let (tokens, hidden) = (1, 4096);
/// let acc = DeviceTensor::<i32>::zeros(s, &[tokens, hidden])?;    // O projection, int32
/// let a_s = DeviceTensor::<f32>::filled(s, &[tokens], 0.01)?;
/// let w_s = DeviceTensor::<f32>::filled(s, &[hidden], 0.001)?;
/// let mut h = DeviceTensor::<bf16>::filled(s, &[tokens, hidden], bf16::from_f32(0.5))?;
/// let norm_w = DeviceTensor::<bf16>::filled(s, &[hidden], bf16::from_f32(1.0))?;
/// let mut q = DeviceTensor::<i8>::zeros(s, &[tokens, hidden])?;
/// let mut scale = DeviceTensor::<f32>::zeros(s, &[tokens])?;
/// let deq = Dequant { acc: &acc, act_scale: &a_s, weight_scale: &w_s };
/// quant::dequant_add_rms_norm_quant(s, deq, &mut h, &norm_w, 1e-5, &mut q, &mut scale)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn dequant_add_rms_norm_quant<T: HalfDType>(
    stream: &CudaStream,
    d: Dequant<'_>,
    residual: &mut DeviceTensor<T>,
    weight: &DeviceTensor<T>,
    eps: f32,
    q: &mut DeviceTensor<i8>,
    scale: &mut DeviceTensor<f32>,
) -> Result<()> {
    let (tokens, hidden) = check_dequant(&d)?;
    expect_shape("residual", residual, &[tokens, hidden])?;
    expect_shape("weight", weight, &[hidden])?;
    check_q(q, scale, tokens, hidden)?;
    check_eps(eps)?;
    let (t, h) = (as_i64("acc", tokens)?, as_i64("acc", hidden)?);
    let (pa, _ga) = d.acc.ptr(stream);
    let (psa, _gsa) = d.act_scale.ptr(stream);
    let (psw, _gsw) = d.weight_scale.ptr(stream);
    let (pw, _gw) = weight.ptr(stream);
    let (pr, _gr) = residual.ptr_mut(stream);
    let (pq, _gq) = q.ptr_mut(stream);
    let (ps, _gs) = scale.ptr_mut(stream);
    // SAFETY: acc, residual and q hold tokens * hidden elements, act_scale and scale tokens,
    // weight_scale and weight hidden (checked above); residual, q and scale are distinct &mut
    // borrows, so no output aliases another buffer; the guards outlive the launch call.
    let status = unsafe {
        fl_kernels_sys::fl_dequant_add_rms_norm_quant(
            T::ID,
            pa as _,
            psa as _,
            psw as _,
            pr as _,
            pw as _,
            pq as _,
            ps as _,
            t,
            h,
            eps,
            raw_stream(stream),
        )
    };
    check("quant::dequant_add_rms_norm_quant", status)
}

/// Dequantises the fused gate|up GEMM output, SwiGLU, per-token quantisation (FasterLLaMA
/// `dequantizedSiluMultiplyQuantized`): with `g = deq(t, i)` and `u = deq(t, inter + i)`,
/// `v = g / (1 + e^−g) · u` in f32, then `q`, `scale` by the
/// [module's rule](self#quantisation-rule) (the down GEMM input).
///
/// Shapes: `d.acc [tokens, 2·inter]` (gate columns first, then up), `d.act_scale [tokens]`,
/// `d.weight_scale [2·inter]`, `q [tokens, inter]`, `scale [tokens]`.
///
/// Errors: [`Error::Shape`] naming `acc` (odd width), `act_scale`, `weight_scale`, `q` or
/// `scale`.
///
/// ```no_run
/// use fl_kernels::{quant::{self, Dequant}, DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let (tokens, inter) = (16, 11008);
/// let acc = DeviceTensor::<i32>::zeros(s, &[tokens, 2 * inter])?;
/// let a_s = DeviceTensor::<f32>::filled(s, &[tokens], 0.01)?;
/// let w_s = DeviceTensor::<f32>::filled(s, &[2 * inter], 0.001)?;
/// let mut q = DeviceTensor::<i8>::zeros(s, &[tokens, inter])?;
/// let mut scale = DeviceTensor::<f32>::zeros(s, &[tokens])?;
/// let deq = Dequant { acc: &acc, act_scale: &a_s, weight_scale: &w_s };
/// quant::dequant_silu_mul_quant(s, deq, &mut q, &mut scale)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn dequant_silu_mul_quant(
    stream: &CudaStream,
    d: Dequant<'_>,
    q: &mut DeviceTensor<i8>,
    scale: &mut DeviceTensor<f32>,
) -> Result<()> {
    let (tokens, width) = check_dequant(&d)?;
    if width % 2 != 0 {
        return Err(Error::Shape {
            arg: "acc",
            expected: "[tokens, 2 * inter] (gate | up)".into(),
            got: d.acc.shape().to_vec(),
        });
    }
    let inter = width / 2;
    check_q(q, scale, tokens, inter)?;
    let (t, i) = (as_i64("acc", tokens)?, as_i64("acc", inter)?);
    let (pa, _ga) = d.acc.ptr(stream);
    let (psa, _gsa) = d.act_scale.ptr(stream);
    let (psw, _gsw) = d.weight_scale.ptr(stream);
    let (pq, _gq) = q.ptr_mut(stream);
    let (ps, _gs) = scale.ptr_mut(stream);
    // SAFETY: acc holds tokens * 2 * inter int32, weight_scale 2 * inter, act_scale and scale
    // tokens, q tokens * inter (checked above); the guards outlive the launch call.
    let status = unsafe {
        fl_kernels_sys::fl_dequant_silu_mul_quant(
            pa as _,
            psa as _,
            psw as _,
            pq as _,
            ps as _,
            t,
            i,
            raw_stream(stream),
        )
    };
    check("quant::dequant_silu_mul_quant", status)
}

/// Dequantises the down-projection output and adds it to the residual stream in place:
/// `residual[t, i] = T(f32(residual[t, i]) + deq(t, i))`.
///
/// Shapes: `d.acc` and `residual` `[tokens, width]`, `d.act_scale [tokens]`,
/// `d.weight_scale [width]`. Dtypes: `residual` `f16` or `bf16`.
///
/// Errors: [`Error::Shape`] naming `acc`, `act_scale`, `weight_scale` or `residual`.
///
/// ```no_run
/// use fl_kernels::{quant::{self, Dequant}, DeviceTensor, Gpu, f16};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let acc = DeviceTensor::from_host(s, &[100i32, -200], &[1, 2])?;
/// let a_s = DeviceTensor::from_host(s, &[0.5f32], &[1])?;
/// let w_s = DeviceTensor::from_host(s, &[0.01f32, 0.01], &[2])?;
/// let mut h = DeviceTensor::from_host(s, &[f16::from_f32(1.0); 2], &[1, 2])?;
/// let deq = Dequant { acc: &acc, act_scale: &a_s, weight_scale: &w_s };
/// quant::dequant_add(s, deq, &mut h)?;
/// assert_eq!(h.to_host(s)?, vec![f16::from_f32(1.5), f16::from_f32(0.0)]);
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn dequant_add<T: HalfDType>(
    stream: &CudaStream,
    d: Dequant<'_>,
    residual: &mut DeviceTensor<T>,
) -> Result<()> {
    let (tokens, width) = check_dequant(&d)?;
    expect_shape("residual", residual, &[tokens, width])?;
    let (t, w) = (as_i64("acc", tokens)?, as_i64("acc", width)?);
    let (pa, _ga) = d.acc.ptr(stream);
    let (psa, _gsa) = d.act_scale.ptr(stream);
    let (psw, _gsw) = d.weight_scale.ptr(stream);
    let (pr, _gr) = residual.ptr_mut(stream);
    // SAFETY: acc and residual hold tokens * width elements, act_scale tokens, weight_scale
    // width (checked above); the guards outlive the launch call.
    let status = unsafe {
        fl_kernels_sys::fl_dequant_add(
            T::ID,
            pa as _,
            psa as _,
            psw as _,
            pr as _,
            t,
            w,
            raw_stream(stream),
        )
    };
    check("quant::dequant_add", status)
}

/// Dequantises a GEMM output to `T`, with an optional bias:
/// `out[t, i] = T(deq(t, i) + f32(bias[i]))` (without bias `T(deq(t, i))`), one f32 add and one
/// rounding, bit for bit [`reference::quant::dequantize_to`](crate::reference::quant::dequantize_to).
///
/// For a projection whose consumer is not one of the fused kernels above: the QKV projection
/// before `kv_cache::rope_append` (which rotates, splits and writes the cache from a `T`
/// tensor), or any projection with a bias (the fused kernels take none).
///
/// Shapes: `d.acc` and `out` `[tokens, width]`, `d.act_scale [tokens]`, `d.weight_scale
/// [width]`, `bias [width]`. Dtypes: `out`, `bias` `f16` or `bf16`.
///
/// Errors: [`Error::Shape`] naming `acc`, `act_scale`, `weight_scale`, `bias` or `out`.
///
/// ```no_run
/// use fl_kernels::{quant::{self, Dequant}, DeviceTensor, Gpu, f16};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let acc = DeviceTensor::from_host(s, &[100i32, -200], &[1, 2])?;
/// let a_s = DeviceTensor::from_host(s, &[0.5f32], &[1])?;
/// let w_s = DeviceTensor::from_host(s, &[0.01f32, 0.01], &[2])?;
/// let bias = DeviceTensor::from_host(s, &[f16::from_f32(1.0); 2], &[2])?;
/// let mut out = DeviceTensor::<f16>::zeros(s, &[1, 2])?;
/// let deq = Dequant { acc: &acc, act_scale: &a_s, weight_scale: &w_s };
/// quant::dequantize(s, deq, Some(&bias), &mut out)?;
/// assert_eq!(out.to_host(s)?, vec![f16::from_f32(1.5), f16::from_f32(0.0)]);
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn dequantize<T: HalfDType>(
    stream: &CudaStream,
    d: Dequant<'_>,
    bias: Option<&DeviceTensor<T>>,
    out: &mut DeviceTensor<T>,
) -> Result<()> {
    let (tokens, width) = check_dequant(&d)?;
    if let Some(b) = bias {
        expect_shape("bias", b, &[width])?;
    }
    expect_shape("out", out, &[tokens, width])?;
    let (t, w) = (as_i64("acc", tokens)?, as_i64("acc", width)?);
    let (pa, _ga) = d.acc.ptr(stream);
    let (psa, _gsa) = d.act_scale.ptr(stream);
    let (psw, _gsw) = d.weight_scale.ptr(stream);
    let (pb, _gb) = opt_ptr(bias, stream);
    let (po, _go) = out.ptr_mut(stream);
    // SAFETY: acc and out hold tokens * width elements, act_scale tokens, weight_scale and bias
    // (when given; NULL otherwise) width (checked above); out is a distinct &mut borrow, so it
    // overlaps no input; the guards outlive the launch call.
    let status = unsafe {
        fl_kernels_sys::fl_dequantize(
            T::ID,
            pa as _,
            psa as _,
            psw as _,
            pb as _,
            po as _,
            t,
            w,
            raw_stream(stream),
        )
    };
    check("quant::dequantize", status)
}

/// How a quantising kernel chooses its per-token scales (see the
/// [module's rule](self#quantisation-rule)).
#[derive(Debug, Clone, Copy, Default)]
pub enum ScaleMode<'a> {
    /// Dynamic: `scale[t] = max_i |v[t, i]| / 127`, each token's own absmax.
    #[default]
    PerToken,
    /// Static: a calibrated per-tensor amax `A`, `f32 [1]` on the device (FasterTransformer
    /// 3.0): `scale[t] = A / 127` for every token and values beyond `±A` saturate at ±127.
    /// `A` must be finite and `>= 0` (0 gives `q = 0`, `scale = 0`).
    Calibrated(&'a DeviceTensor<f32>),
}

/// The int8 output of a quantising kernel: `q [tokens, width]` and `scale [tokens]`, and how
/// the scales are chosen.
#[derive(Debug)]
pub struct QuantOut<'a> {
    /// Quantised values, `i8 [tokens, width]`.
    pub q: &'a mut DeviceTensor<i8>,
    /// Per-token scales, `f32 [tokens]` (`v ≈ q · scale[t]`).
    pub scale: &'a mut DeviceTensor<f32>,
    /// Dynamic per-token or calibrated scales.
    pub mode: ScaleMode<'a>,
}

impl<'a> QuantOut<'a> {
    /// Dynamic per-token scales ([`ScaleMode::PerToken`]).
    pub fn per_token(q: &'a mut DeviceTensor<i8>, scale: &'a mut DeviceTensor<f32>) -> Self {
        QuantOut {
            q,
            scale,
            mode: ScaleMode::PerToken,
        }
    }

    /// Scales from a calibrated per-tensor amax `f32 [1]` ([`ScaleMode::Calibrated`]).
    pub fn calibrated(
        q: &'a mut DeviceTensor<i8>,
        scale: &'a mut DeviceTensor<f32>,
        amax: &'a DeviceTensor<f32>,
    ) -> Self {
        QuantOut {
            q,
            scale,
            mode: ScaleMode::Calibrated(amax),
        }
    }

    /// Checks `q [tokens, width]`, `scale [tokens]` and a calibrated amax `[1]`; returns the
    /// amax tensor (None: per token).
    fn check(&self, tokens: usize, width: usize) -> Result<Option<&'a DeviceTensor<f32>>> {
        check_q(self.q, self.scale, tokens, width)?;
        match self.mode {
            ScaleMode::PerToken => Ok(None),
            ScaleMode::Calibrated(a) => {
                expect_shape("amax", a, &[1])?;
                Ok(Some(a))
            }
        }
    }
}

/// LayerNorm parameters: `weight [hidden]`, an optional `bias [hidden]` and `eps` (finite,
/// `> 0`).
#[derive(Debug, Clone, Copy)]
pub struct LayerNormParams<'a, T: HalfDType> {
    /// Scale, `T [hidden]`.
    pub weight: &'a DeviceTensor<T>,
    /// Shift, `T [hidden]`, or `None` (no bias).
    pub bias: Option<&'a DeviceTensor<T>>,
    /// Added to the variance.
    pub eps: f32,
}

impl<T: HalfDType> LayerNormParams<'_, T> {
    fn check(&self, hidden: usize) -> Result<()> {
        expect_shape("weight", self.weight, &[hidden])?;
        if let Some(b) = self.bias {
            expect_shape("bias", b, &[hidden])?;
        }
        check_eps(self.eps)
    }
}

/// Quantisation with a calibrated per-tensor amax, the static counterpart of
/// [`quantize_per_token`]: `v = f32(x[t, i])`, `scale[t] = A / 127` for every token,
/// `q = rint(clamp(v · 127 / A, ±127))` (values beyond `±A` saturate), with `A = amax[0]`
/// (see [`ScaleMode::Calibrated`]). E.g. the attention output before the O GEMM of an
/// encoder with static scales.
///
/// Shapes: `x [tokens, width]`, `amax [1]`, `q [tokens, width]`, `scale [tokens]`. Dtypes: `x`
/// `f16` or `bf16`, `amax` and `scale` `f32`, `q` `i8`.
///
/// Errors: [`Error::Shape`] naming `x` (not 2-D, or width 0), `amax`, `q` or `scale`.
///
/// ```no_run
/// use fl_kernels::{quant, DeviceTensor, Gpu, f16};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let x = DeviceTensor::from_host(s, &[f16::from_f32(0.5), f16::from_f32(-2.0)], &[1, 2])?;
/// let amax = DeviceTensor::from_host(s, &[1.0f32], &[1])?; // from a calibration pass
/// let mut q = DeviceTensor::<i8>::zeros(s, &[1, 2])?;
/// let mut scale = DeviceTensor::<f32>::zeros(s, &[1])?;
/// quant::quantize_calibrated(s, &x, &amax, &mut q, &mut scale)?;
/// assert_eq!(q.to_host(s)?, vec![64, -127]); // -2.0 lies beyond amax: saturated
/// assert_eq!(scale.to_host(s)?, vec![1.0 / 127.0]);
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn quantize_calibrated<T: HalfDType>(
    stream: &CudaStream,
    x: &DeviceTensor<T>,
    amax: &DeviceTensor<f32>,
    q: &mut DeviceTensor<i8>,
    scale: &mut DeviceTensor<f32>,
) -> Result<()> {
    let (tokens, width) = dims2("x", x)?;
    expect_shape("amax", amax, &[1])?;
    check_q(q, scale, tokens, width)?;
    let (t, w) = (as_i64("x", tokens)?, as_i64("x", width)?);
    let (px, _gx) = x.ptr(stream);
    let (pa, _ga) = amax.ptr(stream);
    let (pq, _gq) = q.ptr_mut(stream);
    let (ps, _gs) = scale.ptr_mut(stream);
    // SAFETY: x and q hold tokens * width elements, scale tokens, amax one f32 (checked
    // above); the guards keep the buffers alive until the launch is queued on `stream`.
    let status = unsafe {
        fl_kernels_sys::fl_quantize_calibrated(
            T::ID,
            px as _,
            pa as _,
            pq as _,
            ps as _,
            t,
            w,
            raw_stream(stream),
        )
    };
    check("quant::quantize_calibrated", status)
}

/// LayerNorm then quantisation (the input of a BERT encoder's first QKV GEMM, after the
/// embeddings):
///
/// ```text
/// mean, rstd = two-pass f32 statistics of f32(x[t, :])           (as norm::layer_norm)
/// v          = fma((f32(x[t, i]) − mean) · rstd, weight[i], bias[i] or 0)     (f32)
/// y[t, i]    = T(v)                                              (when y is given)
/// q, scale   = quantise(v)                                       (v, not the rounded y)
/// ```
///
/// as [`norm::layer_norm`](crate::norm::layer_norm) computes `v`; `out.mode` picks per-token
/// or calibrated scales.
///
/// Shapes: `x`, `y`, `out.q` `[tokens, hidden]`, `ln.weight`, `ln.bias` `[hidden]`,
/// `out.scale [tokens]`, a calibrated amax `[1]`. Dtypes: `x`, `y`, `ln` `f16` or `bf16`.
///
/// Errors: [`Error::Shape`] naming `x`, `weight`, `bias`, `y`, `q`, `scale` or `amax`;
/// [`Error::InvalidArgument`] naming `eps` unless finite and `> 0`.
///
/// ```no_run
/// use fl_kernels::quant::{self, LayerNormParams, QuantOut};
/// use fl_kernels::{DeviceTensor, Gpu, bf16};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let (tokens, hidden) = (128, 768);
/// let x = DeviceTensor::<bf16>::filled(s, &[tokens, hidden], bf16::from_f32(0.5))?;
/// let w = DeviceTensor::<bf16>::filled(s, &[hidden], bf16::from_f32(1.0))?;
/// let b = DeviceTensor::<bf16>::filled(s, &[hidden], bf16::from_f32(0.25))?;
/// let mut h = DeviceTensor::<bf16>::zeros(s, &[tokens, hidden])?;
/// let mut q = DeviceTensor::<i8>::zeros(s, &[tokens, hidden])?;
/// let mut scale = DeviceTensor::<f32>::zeros(s, &[tokens])?;
/// let ln = LayerNormParams { weight: &w, bias: Some(&b), eps: 1e-12 };
/// quant::layer_norm_quant(s, &x, ln, Some(&mut h), QuantOut::per_token(&mut q, &mut scale))?;
/// assert!(q.to_host(s)?.iter().all(|&v| v == 127)); // a constant row normalises to the bias
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn layer_norm_quant<T: HalfDType>(
    stream: &CudaStream,
    x: &DeviceTensor<T>,
    ln: LayerNormParams<'_, T>,
    y: Option<&mut DeviceTensor<T>>,
    out: QuantOut<'_>,
) -> Result<()> {
    let (tokens, hidden) = dims2("x", x)?;
    ln.check(hidden)?;
    if let Some(y) = &y {
        expect_shape("y", y, &[tokens, hidden])?;
    }
    let amax = out.check(tokens, hidden)?;
    let (t, h) = (as_i64("x", tokens)?, as_i64("x", hidden)?);
    let (px, _gx) = x.ptr(stream);
    let (pw, _gw) = ln.weight.ptr(stream);
    let (pb, _gb) = opt_ptr(ln.bias, stream);
    let gy = y.map(|y| y.ptr_mut(stream));
    let py = gy.as_ref().map_or(0, |g| g.0);
    let (pa, _ga) = opt_ptr(amax, stream);
    let (pq, _gq) = out.q.ptr_mut(stream);
    let (ps, _gs) = out.scale.ptr_mut(stream);
    // SAFETY: x, y (when given) and q hold tokens * hidden elements, weight and bias (when
    // given) hidden, scale tokens, amax (when given) one f32 (checked above); a null pointer
    // means "absent"; y, q and scale are distinct &mut borrows (y never aliases x); the
    // guards keep the buffers alive until the launch is queued.
    let status = unsafe {
        fl_kernels_sys::fl_layer_norm_quant(
            T::ID,
            px as _,
            pw as _,
            pb as _,
            py as _,
            pq as _,
            ps as _,
            pa as _,
            t,
            h,
            ln.eps,
            raw_stream(stream),
        )
    };
    check("quant::layer_norm_quant", status)
}

/// The end of a post-LayerNorm sublayer (BERT's `x = LayerNorm(sublayer(x) + x)`) after an
/// int8 GEMM: dequantise, add the projection's bias and the residual, LayerNorm, write the new
/// hidden state and quantise it for the next GEMM:
///
/// ```text
/// s              = deq(t, i) + f32(bias[i])          (f32 add; no bias: s = deq(t, i))
/// h              = f32(residual[t, i]) + s           (f32 add, not rounded to T)
/// v              = LayerNorm(h[t, :])_i              (as layer_norm_quant, with ln)
/// residual[t, i] = T(v)                              (overwritten: the new hidden state)
/// q, scale       = quantise(v)                       (v, not the rounded residual)
/// ```
///
/// Shapes: `d.acc`, `residual`, `out.q` `[tokens, hidden]`, `d.act_scale`, `out.scale`
/// `[tokens]`, `d.weight_scale`, `bias`, `ln.weight`, `ln.bias` `[hidden]`, a calibrated amax
/// `[1]`. Dtypes: `bias`, `residual`, `ln` `f16` or `bf16`.
///
/// Errors: [`Error::Shape`] naming `acc`, `act_scale`, `weight_scale`, `bias` (the GEMM's, or
/// LayerNorm's), `residual`, `weight`, `q`, `scale` or `amax`; [`Error::InvalidArgument`]
/// naming `eps`.
///
/// ```no_run
/// use fl_kernels::quant::{self, Dequant, LayerNormParams, QuantOut};
/// use fl_kernels::{DeviceTensor, Gpu, f16};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let (tokens, hidden) = (256, 768);
/// let acc = DeviceTensor::<i32>::zeros(s, &[tokens, hidden])?;     // O projection, int32
/// let a_s = DeviceTensor::<f32>::filled(s, &[tokens], 0.01)?;
/// let w_s = DeviceTensor::<f32>::filled(s, &[hidden], 0.001)?;
/// let bo = DeviceTensor::<f16>::zeros(s, &[hidden])?;
/// let mut h = DeviceTensor::<f16>::filled(s, &[tokens, hidden], f16::from_f32(0.5))?;
/// let ln_w = DeviceTensor::<f16>::filled(s, &[hidden], f16::from_f32(1.0))?;
/// let ln_b = DeviceTensor::<f16>::zeros(s, &[hidden])?;
/// let amax = DeviceTensor::from_host(s, &[6.0f32], &[1])?;      // calibrated
/// let mut q = DeviceTensor::<i8>::zeros(s, &[tokens, hidden])?;
/// let mut scale = DeviceTensor::<f32>::zeros(s, &[tokens])?;
/// let deq = Dequant { acc: &acc, act_scale: &a_s, weight_scale: &w_s };
/// let ln = LayerNormParams { weight: &ln_w, bias: Some(&ln_b), eps: 1e-12 };
/// let out = QuantOut::calibrated(&mut q, &mut scale, &amax);
/// quant::dequant_bias_add_layer_norm_quant(s, deq, Some(&bo), &mut h, ln, out)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn dequant_bias_add_layer_norm_quant<T: HalfDType>(
    stream: &CudaStream,
    d: Dequant<'_>,
    bias: Option<&DeviceTensor<T>>,
    residual: &mut DeviceTensor<T>,
    ln: LayerNormParams<'_, T>,
    out: QuantOut<'_>,
) -> Result<()> {
    let (tokens, hidden) = check_dequant(&d)?;
    if let Some(b) = bias {
        expect_shape("bias", b, &[hidden])?;
    }
    expect_shape("residual", residual, &[tokens, hidden])?;
    ln.check(hidden)?;
    let amax = out.check(tokens, hidden)?;
    let (t, h) = (as_i64("acc", tokens)?, as_i64("acc", hidden)?);
    let (pa, _ga) = d.acc.ptr(stream);
    let (psa, _gsa) = d.act_scale.ptr(stream);
    let (psw, _gsw) = d.weight_scale.ptr(stream);
    let (pb, _gb) = opt_ptr(bias, stream);
    let (pr, _gr) = residual.ptr_mut(stream);
    let (plw, _glw) = ln.weight.ptr(stream);
    let (plb, _glb) = opt_ptr(ln.bias, stream);
    let (pam, _gam) = opt_ptr(amax, stream);
    let (pq, _gq) = out.q.ptr_mut(stream);
    let (ps, _gs) = out.scale.ptr_mut(stream);
    // SAFETY: acc, residual and q hold tokens * hidden elements, act_scale and scale tokens,
    // weight_scale, both biases (when given) and the LayerNorm weight hidden, amax (when given)
    // one f32 (checked above); null means "absent"; residual, q and scale are distinct &mut
    // borrows, so no output aliases another buffer; the guards outlive the launch call.
    let status = unsafe {
        fl_kernels_sys::fl_dequant_bias_add_layer_norm_quant(
            T::ID,
            pa as _,
            psa as _,
            psw as _,
            pb as _,
            pr as _,
            plw as _,
            plb as _,
            pq as _,
            ps as _,
            pam as _,
            t,
            h,
            ln.eps,
            raw_stream(stream),
        )
    };
    check("quant::dequant_bias_add_layer_norm_quant", status)
}

/// Dequantises the FFN's first GEMM output, adds its bias, applies GELU and quantises (the
/// input of the second FFN GEMM): `v = gelu(deq(t, i) + f32(bias[i]))` in f32 (no bias:
/// `gelu(deq(t, i))`), with the GELU of [`activation::gelu`](crate::activation::gelu) (the
/// same device code), then `q`, `scale` by `out.mode`.
///
/// `T` is the dtype of `bias`; without a bias name it: `dequant_bias_gelu_quant::<f16>(..)`.
///
/// Shapes: `d.acc`, `out.q` `[tokens, width]`, `d.act_scale`, `out.scale` `[tokens]`,
/// `d.weight_scale`, `bias` `[width]`, a calibrated amax `[1]`.
///
/// Errors: [`Error::Shape`] naming `acc`, `act_scale`, `weight_scale`, `bias`, `q`, `scale` or
/// `amax`.
///
/// ```no_run
/// use fl_kernels::activation::GeluKind;
/// use fl_kernels::quant::{self, Dequant, QuantOut};
/// use fl_kernels::{DeviceTensor, Gpu, bf16};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let (tokens, inter) = (256, 3072);
/// let acc = DeviceTensor::<i32>::zeros(s, &[tokens, inter])?;     // FFN up projection
/// let a_s = DeviceTensor::<f32>::filled(s, &[tokens], 0.01)?;
/// let w_s = DeviceTensor::<f32>::filled(s, &[inter], 0.001)?;
/// let b1 = DeviceTensor::<bf16>::zeros(s, &[inter])?;
/// let mut q = DeviceTensor::<i8>::zeros(s, &[tokens, inter])?;
/// let mut scale = DeviceTensor::<f32>::zeros(s, &[tokens])?;
/// let deq = Dequant { acc: &acc, act_scale: &a_s, weight_scale: &w_s };
/// let out = QuantOut::per_token(&mut q, &mut scale);
/// quant::dequant_bias_gelu_quant(s, deq, Some(&b1), GeluKind::Erf, out)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn dequant_bias_gelu_quant<T: HalfDType>(
    stream: &CudaStream,
    d: Dequant<'_>,
    bias: Option<&DeviceTensor<T>>,
    kind: GeluKind,
    out: QuantOut<'_>,
) -> Result<()> {
    let (tokens, width) = check_dequant(&d)?;
    if let Some(b) = bias {
        expect_shape("bias", b, &[width])?;
    }
    let amax = out.check(tokens, width)?;
    let (t, w) = (as_i64("acc", tokens)?, as_i64("acc", width)?);
    let kind = match kind {
        GeluKind::Tanh => fl_kernels_sys::fl_gelu_kind::FL_GELU_TANH,
        GeluKind::Erf => fl_kernels_sys::fl_gelu_kind::FL_GELU_ERF,
    };
    let (pa, _ga) = d.acc.ptr(stream);
    let (psa, _gsa) = d.act_scale.ptr(stream);
    let (psw, _gsw) = d.weight_scale.ptr(stream);
    let (pb, _gb) = opt_ptr(bias, stream);
    let (pam, _gam) = opt_ptr(amax, stream);
    let (pq, _gq) = out.q.ptr_mut(stream);
    let (ps, _gs) = out.scale.ptr_mut(stream);
    // SAFETY: acc and q hold tokens * width elements, act_scale and scale tokens, weight_scale
    // and bias (when given) width, amax (when given) one f32 (checked above); null means
    // "absent"; q and scale are distinct &mut borrows; the guards outlive the launch call.
    let status = unsafe {
        fl_kernels_sys::fl_dequant_bias_gelu_quant(
            T::ID,
            pa as _,
            psa as _,
            psw as _,
            pb as _,
            kind,
            pq as _,
            ps as _,
            pam as _,
            t,
            w,
            raw_stream(stream),
        )
    };
    check("quant::dequant_bias_gelu_quant", status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weight_quantisation_errors_name_w() {
        let e = quantize_weights_per_channel(&[1.0; 5], 2, 3).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { arg: "w", .. }), "{e}");
    }

    #[test]
    fn zero_channel_has_zero_scale() {
        let (q, s) = quantize_weights_per_channel(&[0.0, 0.0, 1.0, -1.0], 2, 2).unwrap();
        assert_eq!(q, vec![0, 0, 127, -127]);
        assert_eq!(s, vec![0.0, 1.0 / 127.0]);
    }

    #[test]
    fn qkv_width() {
        let h = QkvHeads {
            q_heads: 32,
            kv_heads: 8,
        };
        assert_eq!(h.width(128), Some(48 * 128));
        let big = QkvHeads {
            q_heads: 1,
            kv_heads: usize::MAX,
        };
        assert_eq!(big.width(1), None);
    }
}
