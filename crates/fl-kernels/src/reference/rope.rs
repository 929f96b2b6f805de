//! References for [`crate::rope`](mod@crate::rope).
//!
//! The angle of pair `i` at position `p` is the f32 product `(p as f32) * inv_freq[i]` with
//! `inv_freq` from [`RopeParams::inv_freq`] (the kernels' inputs, exactly as the kernels form
//! it); cos, sin and the rotation are then computed in f64 and not rounded.

use crate::dtype::FloatDType;
use crate::rope::{RopeParams, RopeStyle, Scaling};

/// The f32 angle of every pair at position `pos`: `(pos as f32) * inv_freq[i]`.
pub fn angles(inv_freq: &[f32], pos: i32) -> Vec<f32> {
    inv_freq.iter().map(|&f| pos as f32 * f).collect()
}

/// `(cos, sin)` tables `[max_pos, rotary_dim / 2]` in f64 of the f32 angles.
/// Panics on invalid params (a test bug).
pub fn table(params: &RopeParams, max_pos: usize) -> (Vec<f64>, Vec<f64>) {
    let inv = params
        .inv_freq()
        .expect("reference::rope::table: invalid params");
    let mut c = Vec::with_capacity(max_pos * inv.len());
    let mut s = Vec::with_capacity(max_pos * inv.len());
    for p in 0..max_pos {
        for a in angles(&inv, p as i32) {
            c.push((a as f64).cos());
            s.push((a as f64).sin());
        }
    }
    (c, s)
}

/// The indices `(i0, i1)` of pair `i` within a head.
pub fn pair(style: RopeStyle, rotary_dim: usize, i: usize) -> (usize, usize) {
    match style {
        RopeStyle::NeoX => (i, i + rotary_dim / 2),
        RopeStyle::Interleaved => (2 * i, 2 * i + 1),
    }
}

/// RoPE of one tensor `x [tokens, heads, head_dim]` (row-major), in f64.
///
/// A token whose position is negative, or `>= max_pos` when `max_pos` is given (the table
/// path), is returned unchanged, as are the elements past `rotary_dim`. Also returns whether
/// any position was invalid (the kernels' error flag). Panics on inconsistent lengths or
/// invalid params (a test bug).
pub fn apply<T: FloatDType>(
    x: &[T],
    heads: usize,
    positions: &[i32],
    params: &RopeParams,
    max_pos: Option<usize>,
) -> (Vec<f64>, bool) {
    let d = params.head_dim;
    let tokens = positions.len();
    assert_eq!(
        x.len(),
        tokens * heads * d,
        "reference::rope::apply: x has {} elements, not tokens * heads * head_dim",
        x.len()
    );
    let inv = params
        .inv_freq()
        .expect("reference::rope::apply: invalid params");
    let mut out: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    let mut flagged = false;
    for (t, &p) in positions.iter().enumerate() {
        if p < 0 || max_pos.is_some_and(|m| p as i64 >= m as i64) {
            flagged = true;
            continue;
        }
        let ang = angles(&inv, p);
        for h in 0..heads {
            let row = &mut out[(t * heads + h) * d..(t * heads + h + 1) * d];
            for (i, &a) in ang.iter().enumerate() {
                let (c, s) = ((a as f64).cos(), (a as f64).sin());
                let (i0, i1) = pair(params.style, params.rotary_dim, i);
                let (x0, x1) = (row[i0], row[i1]);
                row[i0] = x0 * c - x1 * s;
                row[i1] = x1 * c + x0 * s;
            }
        }
    }
    (out, flagged)
}

/// The inverse frequencies of the Hugging Face rule computed independently of
/// [`RopeParams::inv_freq`], in f64 and unrounded, transcribed from `transformers`'
/// `_compute_default_rope_parameters` / `_compute_linear_scaling_rope_parameters` /
/// `_compute_llama3_parameters` (with `torch.where` spelled out): for checking `inv_freq`.
pub fn hf_inv_freq(params: &RopeParams) -> Vec<f64> {
    let dim = params.rotary_dim;
    let base: Vec<f64> = (0..dim)
        .step_by(2)
        .map(|j| 1.0 / params.theta.powf(j as f64 / dim as f64))
        .collect();
    match params.scaling {
        Scaling::None => base,
        Scaling::Linear { factor } => base.iter().map(|f| f / factor).collect(),
        Scaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let old = original_max_position_embeddings as f64;
            let low_freq_wavelen = old / low_freq_factor;
            let high_freq_wavelen = old / high_freq_factor;
            base.iter()
                .map(|&inv| {
                    let wavelen = 2.0 * std::f64::consts::PI / inv;
                    let llama = if wavelen > low_freq_wavelen {
                        inv / factor
                    } else {
                        inv
                    };
                    let smooth =
                        (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                    let smoothed = (1.0 - smooth) * llama / factor + smooth * llama;
                    // HF: ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
                    let medium = wavelen >= high_freq_wavelen && wavelen <= low_freq_wavelen;
                    if medium {
                        smoothed
                    } else {
                        llama
                    }
                })
                .collect()
        }
    }
}
