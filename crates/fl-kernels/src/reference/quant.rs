//! References for [`crate::quant`](mod@crate::quant) (the LLaMA decoder's RMSNorm / SwiGLU
//! kernels and the BERT encoder's LayerNorm / GELU ones, per-token or calibrated scales), and
//! a whole decoder layer in W8A8 and in float math ([`layer`]) for the accuracy of the scheme.
//!
//! The quantisation rule is evaluated with the kernels' f32 operations in the same order
//! ([`quantize_row`]), so a row of identical f32 values gives identical int8 and scale.
//! Where a kernel reduces (sum of squares) or calls a transcendental (expf, sincosf), the f32
//! value it quantises can differ from the reference's in the last bit, and an int8 can then
//! differ by one unit where `v · inv` lies within rounding of a half-integer: tests compare
//! those outputs allowing ±1 (see each function).

use crate::activation::GeluKind;
use crate::dtype::FloatDType;
use crate::quant::{QkvHeads, QMAX};
use crate::rope::RopeParams;

/// The quantisation rule on one row of f32 values: `(q, scale)` with `amax = max|v|`,
/// `scale = amax / 127`, `inv = min(127 / amax, f32::MAX)` (0 when `amax` is 0),
/// `q = rint(clamp(v · inv, ±127))` (round half to even), each step an f32 operation.
pub fn quantize_row(v: &[f32]) -> (Vec<i8>, f32) {
    let amax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    quantize_row_calibrated(v, amax)
}

/// The quantisation rule with a given (calibrated) amax `A` instead of the row's own:
/// `scale = A / 127`, `inv = min(127 / A, f32::MAX)` (0 unless `A > 0`),
/// `q = rint(clamp(v · inv, ±127))`; values beyond `±A` saturate at ±127.
pub fn quantize_row_calibrated(v: &[f32], amax: f32) -> (Vec<i8>, f32) {
    let scale = amax / QMAX;
    let inv = if amax > 0.0 {
        (QMAX / amax).min(f32::MAX)
    } else {
        0.0
    };
    let q = v
        .iter()
        .map(|&x| (x * inv).clamp(-QMAX, QMAX).round_ties_even() as i8)
        .collect();
    (q, scale)
}

/// Quantises each row of `v` (`[rows, width]`): per token ([`quantize_row`]) when `amax` is
/// `None`, else with the calibrated per-tensor amax ([`quantize_row_calibrated`]).
pub fn quantize_rows_with(v: &[f32], width: usize, amax: Option<f32>) -> (Vec<i8>, Vec<f32>) {
    match amax {
        None => quantize_rows(v, width),
        Some(a) => {
            assert!(
                width >= 1 && v.len() % width == 0,
                "reference::quant: len not a multiple of width"
            );
            let mut q = Vec::with_capacity(v.len());
            let mut s = Vec::with_capacity(v.len() / width);
            for row in v.chunks(width) {
                let (qr, sr) = quantize_row_calibrated(row, a);
                q.extend(qr);
                s.push(sr);
            }
            (q, s)
        }
    }
}

/// Quantises each row of `v` (`[rows, width]`) with [`quantize_row`]: `(q [rows, width],
/// scale [rows])`. Panics only if `v.len()` is not a multiple of `width` (a test bug).
pub fn quantize_rows(v: &[f32], width: usize) -> (Vec<i8>, Vec<f32>) {
    assert!(
        width >= 1 && v.len() % width == 0,
        "reference::quant: len not a multiple of width"
    );
    let mut q = Vec::with_capacity(v.len());
    let mut s = Vec::with_capacity(v.len() / width);
    for row in v.chunks(width) {
        let (qr, sr) = quantize_row(row);
        q.extend(qr);
        s.push(sr);
    }
    (q, s)
}

/// `q · scale` per element of `[rows, width]` (f64).
pub fn dequantize_rows(q: &[i8], scale: &[f32], width: usize) -> Vec<f64> {
    q.iter()
        .enumerate()
        .map(|(i, &v)| v as f64 * scale[i / width] as f64)
        .collect()
}

/// The kernels' dequantisation of one GEMM output: `(f32(acc) · act_scale) · weight_scale`,
/// two rounded f32 products.
pub fn deq(acc: i32, act_scale: f32, weight_scale: f32) -> f32 {
    (acc as f32 * act_scale) * weight_scale
}

/// [`deq`] of a whole `[tokens, width]` GEMM output.
pub fn dequantize(acc: &[i32], act_scale: &[f32], weight_scale: &[f32]) -> Vec<f32> {
    let width = weight_scale.len();
    assert_eq!(
        acc.len(),
        act_scale.len() * width,
        "reference::quant::dequantize: acc is not [tokens, width]"
    );
    acc.iter()
        .enumerate()
        .map(|(i, &a)| deq(a, act_scale[i / width], weight_scale[i % width]))
        .collect()
}

/// What [`quant::dequantize`](crate::quant::dequantize) writes: `T(deq + f32(bias[i]))` per
/// element of the `[tokens, width]` GEMM output (`T(deq)` without bias), one f32 add and one
/// rounding (bit-exact with the kernel).
pub fn dequantize_to<T: FloatDType>(
    acc: &[i32],
    act_scale: &[f32],
    weight_scale: &[f32],
    bias: Option<&[T]>,
) -> Vec<T> {
    let width = weight_scale.len();
    if let Some(b) = bias {
        assert_eq!(b.len(), width, "reference::quant::dequantize_to: bias");
    }
    dequantize(acc, act_scale, weight_scale)
        .iter()
        .enumerate()
        .map(|(i, &d)| match bias {
            Some(b) => T::from_f32(d + b[i % width].to_f32()),
            None => T::from_f32(d),
        })
        .collect()
}

/// Per-token quantisation of `x [tokens, width]` (values widened to f32 exactly): the kernel
/// matches this bit for bit (no reduction other than a max).
pub fn quantize_per_token<T: FloatDType>(x: &[T], width: usize) -> (Vec<i8>, Vec<f32>) {
    let v: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    quantize_rows(&v, width)
}

/// Calibrated quantisation of `x [tokens, width]` with the per-tensor `amax`, as
/// [`quant::quantize_calibrated`](crate::quant::quantize_calibrated) computes it: bit-exact
/// with the kernel (no reduction).
pub fn quantize_calibrated<T: FloatDType>(x: &[T], width: usize, amax: f32) -> (Vec<i8>, Vec<f32>) {
    let v: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    quantize_rows_with(&v, width, Some(amax))
}

/// `1 / sqrt(mean(v²) + eps)` of one row, in f64, rounded to f32 (the kernel: f32 block sum,
/// rsqrtf).
fn rstd(row: impl Iterator<Item = f32>, n: usize, eps: f32) -> f32 {
    let ms = row.map(|v| v as f64 * v as f64).sum::<f64>() / n as f64;
    (1.0 / (ms + eps as f64).sqrt()) as f32
}

/// The values [`rms_norm_quant`] quantises: `(x · rstd) · weight` in f32, with
/// `rstd = 1 / sqrt(mean(x²) + eps)` computed in f64 and rounded to f32.
pub fn rms_norm_values<T: FloatDType>(x: &[T], weight: &[T], eps: f32) -> Vec<f32> {
    let hidden = weight.len();
    assert!(
        hidden >= 1 && x.len() % hidden == 0,
        "reference::quant: x is not [tokens, hidden]"
    );
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(hidden) {
        let r = rstd(row.iter().map(|v| v.to_f32()), hidden, eps);
        out.extend(
            row.iter()
                .zip(weight)
                .map(|(v, w)| (v.to_f32() * r) * w.to_f32()),
        );
    }
    out
}

/// RMSNorm + per-token quantisation: `(q [tokens, hidden], scale [tokens])`. The kernel's
/// int8 may differ by ±1 (sum order, rsqrtf), its scale by a few f32 ulps.
pub fn rms_norm_quant<T: FloatDType>(x: &[T], weight: &[T], eps: f32) -> (Vec<i8>, Vec<f32>) {
    quantize_rows(&rms_norm_values(x, weight, eps), weight.len())
}

/// Dequantise + residual add + RMSNorm + quantise: `(new_residual, q, scale)` with
/// `new_residual = T(residual + deq)` (bit-exact with the kernel) and `q`, `scale` as
/// [`rms_norm_quant`] of the new residual (the kernel's int8 within ±1).
pub fn dequant_add_rms_norm_quant<T: FloatDType>(
    acc: &[i32],
    act_scale: &[f32],
    weight_scale: &[f32],
    residual: &[T],
    weight: &[T],
    eps: f32,
) -> (Vec<T>, Vec<i8>, Vec<f32>) {
    let res = dequant_add(acc, act_scale, weight_scale, residual);
    let (q, s) = rms_norm_quant(&res, weight, eps);
    (res, q, s)
}

/// `silu(g) · u` in f32 as the kernel writes it: `(g / (1 + e^−g)) · u`.
pub fn silu_mul(g: f32, u: f32) -> f32 {
    (g / (1.0 + (-g).exp())) * u
}

/// The values [`dequant_silu_mul_quant`] quantises, `[tokens, inter]` f32.
pub fn dequant_silu_mul_values(acc: &[i32], act_scale: &[f32], weight_scale: &[f32]) -> Vec<f32> {
    let d = dequantize(acc, act_scale, weight_scale);
    let w = weight_scale.len();
    let inter = w / 2;
    assert_eq!(w % 2, 0, "reference::quant: gate|up width is odd");
    let mut out = Vec::with_capacity(d.len() / 2);
    for row in d.chunks(w) {
        out.extend((0..inter).map(|i| silu_mul(row[i], row[inter + i])));
    }
    out
}

/// Dequantise gate|up + SwiGLU + quantise: `(q [tokens, inter], scale [tokens])`. The
/// kernel's int8 within ±1 (expf differs from Rust's `exp` by an ulp or two).
pub fn dequant_silu_mul_quant(
    acc: &[i32],
    act_scale: &[f32],
    weight_scale: &[f32],
) -> (Vec<i8>, Vec<f32>) {
    let v = dequant_silu_mul_values(acc, act_scale, weight_scale);
    quantize_rows(&v, weight_scale.len() / 2)
}

/// Dequantise + residual add: `T(residual + deq)` in f32, rounded once (bit-exact with the
/// kernel).
pub fn dequant_add<T: FloatDType>(
    acc: &[i32],
    act_scale: &[f32],
    weight_scale: &[f32],
    residual: &[T],
) -> Vec<T> {
    assert_eq!(
        acc.len(),
        residual.len(),
        "reference::quant: lengths differ"
    );
    dequantize(acc, act_scale, weight_scale)
        .iter()
        .zip(residual)
        .map(|(&d, r)| T::from_f32(r.to_f32() + d))
        .collect()
}

/// LayerNorm parameters of the encoder references: `weight [hidden]`, optional `bias
/// [hidden]`, `eps`.
#[derive(Debug, Clone, Copy)]
pub struct LayerNormRef<'a, T> {
    /// Scale.
    pub weight: &'a [T],
    /// Shift (`None`: 0).
    pub bias: Option<&'a [T]>,
    /// Added to the variance.
    pub eps: f32,
}

/// LayerNorm of each row of f32 values `h [rows, hidden]` as the quant kernels compute it
/// (fl_quant.h, "LayerNorm"): `mean` and `rstd = 1 / sqrt(var + eps)` from f64 sums rounded
/// to f32 (the kernel: f32 block sums, rsqrtf), the deviations `h - mean` as f32
/// subtractions, then `v = fma((h - mean) · rstd, w, b)` in f32 (`b = 0` without a bias).
/// The kernel's values differ by the rounding of its statistics (a few f32 ulps).
pub fn layer_norm_values<T: FloatDType>(h: &[f32], ln: LayerNormRef<'_, T>) -> Vec<f32> {
    let hidden = ln.weight.len();
    assert!(
        hidden >= 1 && h.len() % hidden == 0,
        "reference::quant: h is not [tokens, hidden]"
    );
    if let Some(b) = ln.bias {
        assert_eq!(b.len(), hidden, "reference::quant: LayerNorm bias length");
    }
    let mut out = Vec::with_capacity(h.len());
    for row in h.chunks(hidden) {
        let mean = (row.iter().map(|&v| v as f64).sum::<f64>() / hidden as f64) as f32;
        let var = row
            .iter()
            .map(|&v| {
                let d = (v - mean) as f64;
                d * d
            })
            .sum::<f64>()
            / hidden as f64;
        let rstd = (1.0 / (var + ln.eps as f64).sqrt()) as f32;
        out.extend(row.iter().enumerate().map(|(i, &v)| {
            let b = ln.bias.map_or(0.0, |b| b[i].to_f32());
            ((v - mean) * rstd).mul_add(ln.weight[i].to_f32(), b)
        }));
    }
    out
}

/// LayerNorm + quantisation ([`quant::layer_norm_quant`](crate::quant::layer_norm_quant)):
/// `(y, q, scale)` with `v = layer_norm_values(f32(x))`, `y = T(v)` and `q`, `scale` from the
/// unrounded `v` (per token, or with the calibrated `amax`). The kernel's `y` within one ulp
/// of `T`, its int8 within ±1, its per-token scales to a few f32 ulps (calibrated: exact).
pub fn layer_norm_quant<T: FloatDType>(
    x: &[T],
    ln: LayerNormRef<'_, T>,
    amax: Option<f32>,
) -> (Vec<T>, Vec<i8>, Vec<f32>) {
    let h: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    let v = layer_norm_values(&h, ln);
    let (q, s) = quantize_rows_with(&v, ln.weight.len(), amax);
    (v.iter().map(|&x| T::from_f32(x)).collect(), q, s)
}

/// The pre-norm values of [`dequant_bias_add_layer_norm_quant`]:
/// `h = f32(residual) + (deq + f32(bias))` (no bias: `f32(residual) + deq`), f32 adds in that
/// order (bit-exact with the kernel).
pub fn dequant_bias_add<T: FloatDType>(
    acc: &[i32],
    act_scale: &[f32],
    weight_scale: &[f32],
    bias: Option<&[T]>,
    residual: &[T],
) -> Vec<f32> {
    let width = weight_scale.len();
    assert_eq!(
        acc.len(),
        residual.len(),
        "reference::quant: lengths differ"
    );
    if let Some(b) = bias {
        assert_eq!(b.len(), width, "reference::quant: bias length");
    }
    dequantize(acc, act_scale, weight_scale)
        .iter()
        .zip(residual)
        .enumerate()
        .map(|(i, (&d, r))| {
            let s = match bias {
                Some(b) => d + b[i % width].to_f32(),
                None => d,
            };
            r.to_f32() + s
        })
        .collect()
}

/// Dequantise + bias + residual + LayerNorm + quantise (BERT's post-LN sublayer end,
/// [`quant::dequant_bias_add_layer_norm_quant`](crate::quant::dequant_bias_add_layer_norm_quant)):
/// `(new_residual, q, scale)` with `v = layer_norm_values(dequant_bias_add(..))`,
/// `new_residual = T(v)` and `q`, `scale` from `v`. Tolerances as [`layer_norm_quant`].
pub fn dequant_bias_add_layer_norm_quant<T: FloatDType>(
    acc: &[i32],
    act_scale: &[f32],
    weight_scale: &[f32],
    bias: Option<&[T]>,
    residual: &[T],
    ln: LayerNormRef<'_, T>,
    amax: Option<f32>,
) -> (Vec<T>, Vec<i8>, Vec<f32>) {
    let h = dequant_bias_add(acc, act_scale, weight_scale, bias, residual);
    let v = layer_norm_values(&h, ln);
    let (q, s) = quantize_rows_with(&v, ln.weight.len(), amax);
    (v.iter().map(|&x| T::from_f32(x)).collect(), q, s)
}

/// The values [`dequant_bias_gelu_quant`] quantises: `gelu(deq + f32(bias))` with the sum in
/// f32 (as the kernel) and the GELU in f64
/// ([`reference::activation::gelu_scalar`](crate::reference::activation::gelu_scalar)),
/// rounded to f32. The kernel's fast GELU differs by about 1e-6 relative (1e-5 in the far
/// negative tail).
pub fn dequant_bias_gelu_values<T: FloatDType>(
    acc: &[i32],
    act_scale: &[f32],
    weight_scale: &[f32],
    bias: Option<&[T]>,
    kind: GeluKind,
) -> Vec<f32> {
    let width = weight_scale.len();
    if let Some(b) = bias {
        assert_eq!(b.len(), width, "reference::quant: bias length");
    }
    dequantize(acc, act_scale, weight_scale)
        .iter()
        .enumerate()
        .map(|(i, &d)| {
            let x = match bias {
                Some(b) => d + b[i % width].to_f32(),
                None => d,
            };
            super::activation::gelu_scalar(x as f64, kind) as f32
        })
        .collect()
}

/// Dequantise + bias + GELU + quantise: `(q, scale)` of [`dequant_bias_gelu_values`], per token
/// or with the calibrated `amax`. The kernel's int8 within ±1.
pub fn dequant_bias_gelu_quant<T: FloatDType>(
    acc: &[i32],
    act_scale: &[f32],
    weight_scale: &[f32],
    bias: Option<&[T]>,
    kind: GeluKind,
    amax: Option<f32>,
) -> (Vec<i8>, Vec<f32>) {
    let v = dequant_bias_gelu_values(acc, act_scale, weight_scale, bias, kind);
    quantize_rows_with(&v, weight_scale.len(), amax)
}

/// Dequantise the fused QKV output and apply rotate-half RoPE to the q and k heads: f64,
/// unrounded, the layout of the input (`[tokens, (q_heads + 2 kv_heads) · head_dim]`). The
/// angle is the f32 product `f32(pos) · inv_freq[i]` (as the kernel), cos/sin in f64.
pub fn dequant_rope(
    acc: &[i32],
    act_scale: &[f32],
    weight_scale: &[f32],
    positions: &[i32],
    heads: QkvHeads,
    rope: &RopeParams,
) -> Vec<f64> {
    let d = rope.head_dim;
    let width = heads
        .width(d)
        .expect("reference::quant::dequant_rope: width");
    assert_eq!(weight_scale.len(), width, "reference::quant: weight_scale");
    let inv = rope
        .inv_freq()
        .expect("reference::quant::dequant_rope: invalid params");
    let half = rope.rotary_dim / 2;
    let x = dequantize(acc, act_scale, weight_scale);
    let mut out: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    for (t, &p) in positions.iter().enumerate() {
        for h in 0..heads.q_heads + heads.kv_heads {
            let row = &mut out[t * width + h * d..t * width + (h + 1) * d];
            for (i, &f) in inv.iter().enumerate() {
                let a = (p as f32 * f) as f64;
                let (c, s) = (a.cos(), a.sin());
                let (x0, x1) = (row[i], row[i + half]);
                row[i] = x0 * c - x1 * s;
                row[i + half] = x1 * c + x0 * s;
            }
        }
    }
    out
}

/// `C[m, n] = A[m, k] · B[n, k]ᵀ` in int8 × int8 → int32, accumulated in i64 (exact).
/// Panics on inconsistent lengths or when a sum does not fit i32 (test bugs).
pub fn gemm_i8(a: &[i8], b: &[i8], m: usize, n: usize, k: usize) -> Vec<i32> {
    assert_eq!(a.len(), m * k, "reference::quant::gemm_i8: a is not [m, k]");
    assert_eq!(b.len(), n * k, "reference::quant::gemm_i8: b is not [n, k]");
    let mut c = Vec::with_capacity(m * n);
    for i in 0..m {
        let ar = &a[i * k..(i + 1) * k];
        for j in 0..n {
            let br = &b[j * k..(j + 1) * k];
            let s: i64 = ar.iter().zip(br).map(|(&x, &y)| x as i64 * y as i64).sum();
            c.push(i32::try_from(s).expect("reference::quant::gemm_i8: overflows i32"));
        }
    }
    c
}

/// One LLaMA decoder layer (pre-norm, GQA, rotate-half RoPE, SwiGLU, causal attention over a
/// single sequence of `tokens` tokens) in float math and in W8A8 with the kernels' arithmetic,
/// to measure what the int8 scheme costs.
pub mod layer {
    use super::*;

    /// Sizes of the layer.
    #[derive(Debug, Clone, Copy)]
    pub struct Config {
        /// Model width.
        pub hidden: usize,
        /// Query and key/value heads.
        pub heads: QkvHeads,
        /// Elements per head.
        pub head_dim: usize,
        /// MLP width.
        pub inter: usize,
        /// RMSNorm epsilon.
        pub eps: f32,
        /// Rotary embedding (rotate-half).
        pub rope: RopeParams,
    }

    impl Config {
        /// Width of the fused QKV projection.
        pub fn qkv_width(&self) -> usize {
            (self.heads.q_heads + 2 * self.heads.kv_heads) * self.head_dim
        }
        /// Width of the attention output (`q_heads · head_dim`).
        pub fn attn_width(&self) -> usize {
            self.heads.q_heads * self.head_dim
        }
    }

    /// Float weights, `nn.Linear` layout `[out, in]`, row-major.
    #[derive(Debug, Clone)]
    pub struct Weights {
        /// `[qkv_width, hidden]`: q rows, then k rows, then v rows.
        pub wqkv: Vec<f32>,
        /// `[hidden, attn_width]`.
        pub wo: Vec<f32>,
        /// `[2 · inter, hidden]`: gate rows, then up rows.
        pub w_gate_up: Vec<f32>,
        /// `[hidden, inter]`.
        pub w_down: Vec<f32>,
        /// `[hidden]`.
        pub attn_norm: Vec<f32>,
        /// `[hidden]`.
        pub ffn_norm: Vec<f32>,
    }

    /// One quantised projection: `q [n, k]` and per-channel `scale [n]`.
    #[derive(Debug, Clone)]
    pub struct QWeight {
        /// Int8 weight.
        pub q: Vec<i8>,
        /// Per-output-channel scales.
        pub scale: Vec<f32>,
    }

    impl QWeight {
        /// Quantises `w [n, k]` per output channel.
        pub fn new(w: &[f32], n: usize, k: usize) -> Self {
            let (q, scale) = crate::quant::quantize_weights_per_channel(w, n, k)
                .expect("reference::quant::layer: weight shape");
            QWeight { q, scale }
        }
    }

    /// The W8A8 weights: four quantised projections and the norm weights in `T`.
    #[derive(Debug, Clone)]
    pub struct QWeights<T> {
        /// Fused QKV.
        pub wqkv: QWeight,
        /// O projection.
        pub wo: QWeight,
        /// Fused gate|up.
        pub w_gate_up: QWeight,
        /// Down projection.
        pub w_down: QWeight,
        /// Attention RMSNorm weight.
        pub attn_norm: Vec<T>,
        /// MLP RMSNorm weight.
        pub ffn_norm: Vec<T>,
    }

    impl<T: FloatDType> QWeights<T> {
        /// Quantises every projection of `w`.
        pub fn new(c: &Config, w: &Weights) -> Self {
            QWeights {
                wqkv: QWeight::new(&w.wqkv, c.qkv_width(), c.hidden),
                wo: QWeight::new(&w.wo, c.hidden, c.attn_width()),
                w_gate_up: QWeight::new(&w.w_gate_up, 2 * c.inter, c.hidden),
                w_down: QWeight::new(&w.w_down, c.hidden, c.inter),
                attn_norm: w.attn_norm.iter().map(|&v| T::from_f32(v)).collect(),
                ffn_norm: w.ffn_norm.iter().map(|&v| T::from_f32(v)).collect(),
            }
        }
    }

    /// `x [m, k] · w [n, k]ᵀ` in f64.
    fn linear(x: &[f64], w: &[f32], m: usize, n: usize, k: usize) -> Vec<f64> {
        let mut y = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                y[i * n + j] = (0..k).map(|l| x[i * k + l] * w[j * k + l] as f64).sum();
            }
        }
        y
    }

    fn rms_norm(x: &[f64], w: &[f32], eps: f32) -> Vec<f64> {
        let h = w.len();
        let mut y = Vec::with_capacity(x.len());
        for row in x.chunks(h) {
            let r = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / h as f64 + eps as f64).sqrt();
            y.extend(row.iter().zip(w).map(|(v, &w)| v * r * w as f64));
        }
        y
    }

    /// Causal attention of one sequence over the fused `qkv [tokens, qkv_width]` (q heads, k
    /// heads, v heads), GQA (query head `h` reads kv head `h / (q_heads / kv_heads)`), scale
    /// `1 / sqrt(head_dim)`, in f64: `[tokens, q_heads · head_dim]`.
    pub fn attention(c: &Config, qkv: &[f64], tokens: usize) -> Vec<f64> {
        let (hq, hkv, d) = (c.heads.q_heads, c.heads.kv_heads, c.head_dim);
        let w = c.qkv_width();
        let group = hq / hkv;
        let sc = 1.0 / (d as f64).sqrt();
        let mut out = vec![0f64; tokens * hq * d];
        for t in 0..tokens {
            for h in 0..hq {
                let kvh = h / group;
                let q = &qkv[t * w + h * d..t * w + (h + 1) * d];
                let scores: Vec<f64> = (0..=t)
                    .map(|s| {
                        let k = &qkv[s * w + (hq + kvh) * d..s * w + (hq + kvh + 1) * d];
                        q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() * sc
                    })
                    .collect();
                let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
                let z: f64 = e.iter().sum();
                for (s, p) in e.iter().enumerate() {
                    let v = &qkv[s * w + (hq + hkv + kvh) * d..s * w + (hq + hkv + kvh + 1) * d];
                    for i in 0..d {
                        out[(t * hq + h) * d + i] += p / z * v[i];
                    }
                }
            }
        }
        out
    }

    /// [`attention`] on `T` inputs, rounded to `T` (the W8A8 path's attention in a 16-bit
    /// dtype).
    pub fn attention_t<T: FloatDType>(c: &Config, qkv: &[T], tokens: usize) -> Vec<T> {
        let x: Vec<f64> = qkv.iter().map(|v| v.to_f64()).collect();
        attention(c, &x, tokens)
            .iter()
            .map(|&v| T::from_f32(v as f32))
            .collect()
    }

    /// The layer in float math (f64, unquantised weights): the new residual stream
    /// `[tokens, hidden]`, positions `positions[t]`.
    pub fn float_layer(c: &Config, w: &Weights, x: &[f64], positions: &[i32]) -> Vec<f64> {
        let t = positions.len();
        let h = c.hidden;
        let xn = rms_norm(x, &w.attn_norm, c.eps);
        let qkv = linear(&xn, &w.wqkv, t, c.qkv_width(), h);
        // RoPE in f64 on q and k heads (same angles as the kernels).
        let inv = c.rope.inv_freq().expect("reference::quant::layer: rope");
        let half = c.rope.rotary_dim / 2;
        let mut qkv = qkv;
        let qw = c.qkv_width();
        for (ti, &p) in positions.iter().enumerate() {
            for hh in 0..c.heads.q_heads + c.heads.kv_heads {
                let row = &mut qkv[ti * qw + hh * c.head_dim..ti * qw + (hh + 1) * c.head_dim];
                for (i, &f) in inv.iter().enumerate() {
                    let a = (p as f32 * f) as f64;
                    let (x0, x1) = (row[i], row[i + half]);
                    row[i] = x0 * a.cos() - x1 * a.sin();
                    row[i + half] = x1 * a.cos() + x0 * a.sin();
                }
            }
        }
        let attn = attention(c, &qkv, t);
        let o = linear(&attn, &w.wo, t, h, c.attn_width());
        let h1: Vec<f64> = x.iter().zip(&o).map(|(a, b)| a + b).collect();
        let hn = rms_norm(&h1, &w.ffn_norm, c.eps);
        let gu = linear(&hn, &w.w_gate_up, t, 2 * c.inter, h);
        let mut m = Vec::with_capacity(t * c.inter);
        for row in gu.chunks(2 * c.inter) {
            m.extend((0..c.inter).map(|i| {
                let g = row[i];
                g / (1.0 + (-g).exp()) * row[c.inter + i]
            }));
        }
        let down = linear(&m, &w.w_down, t, h, c.inter);
        h1.iter().zip(&down).map(|(a, b)| a + b).collect()
    }

    /// The layer in W8A8 exactly as the GPU chain computes it (each step the reference of
    /// its kernel, int8 GEMMs exact, attention from [`attention_t`]): the new residual in `T`.
    pub fn w8a8_layer<T: FloatDType>(
        c: &Config,
        w: &QWeights<T>,
        x: &[T],
        positions: &[i32],
    ) -> Vec<T> {
        let t = positions.len();
        let h = c.hidden;
        let (xq, xs) = rms_norm_quant(x, &w.attn_norm, c.eps);
        let acc = gemm_i8(&xq, &w.wqkv.q, t, c.qkv_width(), h);
        let qkv: Vec<T> = dequant_rope(&acc, &xs, &w.wqkv.scale, positions, c.heads, &c.rope)
            .iter()
            .map(|&v| T::from_f32(v as f32))
            .collect();
        let attn = attention_t(c, &qkv, t);
        let (aq, as_) = quantize_per_token(&attn, c.attn_width());
        let acc = gemm_i8(&aq, &w.wo.q, t, h, c.attn_width());
        let (res, yq, ys) =
            dequant_add_rms_norm_quant(&acc, &as_, &w.wo.scale, x, &w.ffn_norm, c.eps);
        let acc = gemm_i8(&yq, &w.w_gate_up.q, t, 2 * c.inter, h);
        let (mq, ms) = dequant_silu_mul_quant(&acc, &ys, &w.w_gate_up.scale);
        let acc = gemm_i8(&mq, &w.w_down.q, t, h, c.inter);
        dequant_add(&acc, &ms, &w.w_down.scale, &res)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{bf16, f16};

    /// Deterministic values in ±[0.1, 4.1] with a per-row offset (a non-zero mean).
    fn values(n: usize, width: usize, seed: u32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2_654_435_761) | 1;
        (0..n)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                let u = (x >> 8) as f32 / (1u32 << 24) as f32; // [0, 1)
                let m = 0.1 + 4.0 * u;
                let off = ((i / width) % 5) as f32 * 0.75 - 1.5;
                off + if x & 1 == 0 { m } else { -m }
            })
            .collect()
    }

    #[test]
    fn layer_norm_matches_the_textbook_formula() {
        for &(tokens, hidden) in &[(1usize, 1usize), (3, 7), (2, 768), (1, 1001)] {
            let h = values(tokens * hidden, hidden, hidden as u32);
            let w: Vec<f32> = (0..hidden).map(|i| 0.5 + (i % 7) as f32 * 0.125).collect();
            let b: Vec<f32> = (0..hidden).map(|i| (i % 5) as f32 * 0.25 - 0.5).collect();
            let eps = 1e-5f32;
            for bias in [None, Some(&b[..])] {
                let ln = LayerNormRef {
                    weight: &w,
                    bias,
                    eps,
                };
                let got = layer_norm_values(&h, ln);
                for (r, row) in h.chunks(hidden).enumerate() {
                    let mean = row.iter().map(|&v| v as f64).sum::<f64>() / hidden as f64;
                    let var =
                        row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / hidden as f64;
                    let rstd = 1.0 / (var + eps as f64).sqrt();
                    for i in 0..hidden {
                        let bi = bias.map_or(0.0, |b| b[i] as f64);
                        let want = (row[i] as f64 - mean) * rstd * w[i] as f64 + bi;
                        let g = got[r * hidden + i] as f64;
                        // A few f32 roundings of values of order |w| * 4 + |b|.
                        assert!(
                            (g - want).abs() <= 2e-6 * (want.abs() + 1.0),
                            "[{r}, {i}] of {tokens}x{hidden}: {g} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn layer_norm_of_unit_weights_has_zero_mean_and_unit_variance() {
        let hidden = 4096;
        let h = values(hidden, hidden, 7);
        let w = vec![bf16::ONE; hidden];
        let v = layer_norm_values(
            &h,
            LayerNormRef {
                weight: &w,
                bias: None,
                eps: 1e-12,
            },
        );
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / hidden as f64;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / hidden as f64;
        assert!(mean.abs() < 1e-5, "mean {mean}");
        assert!((var - 1.0).abs() < 1e-5, "var {var}");
    }

    #[test]
    fn calibrated_amax_saturates_beyond_it() {
        let v = [0.5f32, -1.0, 2.0, -3.0, 0.25, 0.0];
        let (q, s) = quantize_row_calibrated(&v, 1.0);
        assert_eq!(s, 1.0 / 127.0);
        // 0.5 * 127 = 63.5 rounds to even (64); beyond ±1 saturates.
        assert_eq!(q, vec![64, -127, 127, -127, 32, 0]);
        // Inside the range the error is at most half a step.
        for (&x, &qi) in v.iter().zip(&q) {
            if x.abs() <= 1.0 {
                assert!((x as f64 - qi as f64 * s as f64).abs() <= s as f64 * 0.5 + 1e-7);
            }
        }
        // amax = 0: everything quantises to 0 with scale 0.
        assert_eq!(quantize_row_calibrated(&v, 0.0), (vec![0; 6], 0.0));
    }

    #[test]
    fn calibrated_with_the_row_amax_is_the_dynamic_rule() {
        let width = 129;
        let v = values(3 * width, width, 3);
        let (qd, sd) = quantize_rows(&v, width);
        for (r, row) in v.chunks(width).enumerate() {
            let a = row.iter().fold(0f32, |m, x| m.max(x.abs()));
            let (q, s) = quantize_row_calibrated(row, a);
            assert_eq!(s, sd[r]);
            assert_eq!(q, qd[r * width..(r + 1) * width]);
        }
        // One amax for all rows: every scale equals A / 127.
        let (_, s) = quantize_rows_with(&v, width, Some(2.5));
        assert!(s.iter().all(|&x| x == 2.5 / 127.0));
    }

    #[test]
    fn layer_norm_quant_rounds_y_from_the_quantised_values() {
        let (tokens, hidden) = (3, 40);
        let x: Vec<f16> = values(tokens * hidden, hidden, 11)
            .into_iter()
            .map(f16::from_f32)
            .collect();
        let w = vec![f16::from_f32(1.5); hidden];
        let b = vec![f16::from_f32(-0.25); hidden];
        let ln = LayerNormRef {
            weight: &w,
            bias: Some(&b),
            eps: 1e-5,
        };
        let h: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
        let v = layer_norm_values(&h, ln);
        for amax in [None, Some(2.0)] {
            let (y, q, s) = layer_norm_quant(&x, ln, amax);
            assert_eq!(y, v.iter().map(|&t| f16::from_f32(t)).collect::<Vec<_>>());
            let (wq, ws) = quantize_rows_with(&v, hidden, amax);
            assert_eq!((q, s), (wq, ws));
        }
    }

    #[test]
    fn dequant_bias_add_adds_in_the_stated_order() {
        let (acc, sa, sw) = (
            vec![1000, -3000, 7],
            vec![0.003f32],
            vec![0.01f32, 0.02, 0.3],
        );
        let bias = [
            bf16::from_f32(0.5),
            bf16::from_f32(-0.125),
            bf16::from_f32(3.0),
        ];
        let res = [
            bf16::from_f32(1.0),
            bf16::from_f32(2.0),
            bf16::from_f32(-4.0),
        ];
        let h = dequant_bias_add(&acc, &sa, &sw, Some(&bias[..]), &res);
        for i in 0..3 {
            let d = (acc[i] as f32 * sa[0]) * sw[i];
            assert_eq!(h[i], res[i].to_f32() + (d + bias[i].to_f32()));
        }
        let h0 = dequant_bias_add::<bf16>(&acc, &sa, &sw, None, &res);
        for i in 0..3 {
            assert_eq!(h0[i], res[i].to_f32() + deq(acc[i], sa[0], sw[i]));
        }
    }

    #[test]
    fn dequant_bias_gelu_is_gelu_of_the_biased_dequantised_values() {
        let (acc, sa, sw) = (
            vec![100_000, -200_000, 0],
            vec![1e-3f32],
            vec![1e-2f32, 1e-2, 1.0],
        );
        let bias = [f16::from_f32(0.5), f16::from_f32(0.5), f16::ZERO];
        for kind in [GeluKind::Tanh, GeluKind::Erf] {
            let v = dequant_bias_gelu_values(&acc, &sa, &sw, Some(&bias[..]), kind);
            // x = 1.5, -1.5, 0.0 (up to f32 rounding).
            let want = [1.5f64, -1.5, 0.0].map(|x| match kind {
                GeluKind::Tanh => super::super::activation::gelu_scalar(x, kind),
                GeluKind::Erf => 0.5 * x * (1.0 + super::super::activation::erf(x / 2f64.sqrt())),
            });
            for i in 0..3 {
                assert!(
                    (v[i] as f64 - want[i]).abs() < 1e-6,
                    "{kind:?} {i}: {}",
                    v[i]
                );
            }
            let (q, s) = dequant_bias_gelu_quant(&acc, &sa, &sw, Some(&bias[..]), kind, Some(1.0));
            assert_eq!(s, vec![1.0 / 127.0]);
            assert_eq!(q[0], 127); // gelu(1.5) ~ 1.40 saturates at amax 1
        }
    }
}
