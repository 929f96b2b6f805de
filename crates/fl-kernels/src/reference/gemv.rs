//! References for [`crate::gemv`]: dequantisation of every [`QuantFormat`] and the GEMV in f64.

use half::f16;

use crate::dtype::FloatDType;
use crate::gemv::{QuantFormat, QuantizedHost, Scales, BLOCK, Q4_0_BLOCK_BYTES, Q8_0_BLOCK_BYTES};

/// The `[n, k]` weight a [`QuantizedHost`] stands for, row-major, exactly (every value is
/// an integer times a scale, computed in f64):
/// int8 `q · scale[r]`; int4 `(nib − zero) · scale[g]` (zero = 8 without zero point, nib =
/// low nibble for even k); Q8_0 `d · qs[i]`; Q4_0 `d · ((qs[i] & 15) − 8)` for `i < 16` and
/// `d · ((qs[i − 16] >> 4) − 8)` above; the K-quants (`Q4_K`, `Q5_K`, `Q6_K`) row by row as
/// [`reference::ggml::dequantize_row`](crate::reference::ggml::dequantize_row) (ggml's f32
/// values, bit for bit, widened).
pub fn dequantize(w: &QuantizedHost) -> Vec<f64> {
    let (n, k, data) = (w.n(), w.k(), w.data());
    let mut out = vec![0f64; n * k];
    match (w.format(), w.scales()) {
        (QuantFormat::Int8, Scales::F32(s)) => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = (data[i] as i8) as f64 * s[i / k] as f64;
            }
        }
        (QuantFormat::Int4 { group, zero_point }, Scales::F16(s)) => {
            for (i, o) in out.iter_mut().enumerate() {
                let nib = (data[i / 2] >> (4 * (i % 2))) & 15;
                let g = i / group; // row-major groups: (i / k) * (k / group) + (i % k) / group
                let zero = if zero_point { w.zeros()[g] } else { 8 };
                *o = (nib as f64 - zero as f64) * s[g].to_f64();
            }
        }
        (QuantFormat::Q8_0, _) => {
            for (b, blk) in data.chunks_exact(Q8_0_BLOCK_BYTES).enumerate() {
                let d = f16::from_le_bytes([blk[0], blk[1]]).to_f64();
                for j in 0..BLOCK {
                    out[b * BLOCK + j] = d * (blk[2 + j] as i8) as f64;
                }
            }
        }
        (QuantFormat::Q4_0, _) => {
            for (b, blk) in data.chunks_exact(Q4_0_BLOCK_BYTES).enumerate() {
                let d = f16::from_le_bytes([blk[0], blk[1]]).to_f64();
                for j in 0..16 {
                    let q = blk[2 + j];
                    out[b * BLOCK + j] = d * ((q & 15) as f64 - 8.0);
                    out[b * BLOCK + j + 16] = d * ((q >> 4) as f64 - 8.0);
                }
            }
        }
        (QuantFormat::Q4_K | QuantFormat::Q5_K | QuantFormat::Q6_K, _) => {
            if let Some(ty) = w.format().ggml_type() {
                let rb = data.len() / n.max(1);
                for (row, o) in data.chunks_exact(rb.max(1)).zip(out.chunks_exact_mut(k)) {
                    // QuantizedHost::new checked the row length, so this cannot fail.
                    if let Ok(v) = crate::reference::ggml::dequantize_row(ty, row, k) {
                        o.iter_mut().zip(v).for_each(|(o, v)| *o = v as f64);
                    }
                }
            }
        }
        // QuantizedHost::new guarantees the scales match the format.
        _ => {}
    }
    out
}

/// `y[t, r] = Σ_j x[t, j] · W[r, j]` in f64 with `W` = [`dequantize`]`(w)`, `x` `[m, k]`
/// row-major; returns `y` `[m, n]` unrounded. Panics if `x.len() != m · k` (a test bug).
pub fn gemv<T: FloatDType>(x: &[T], m: usize, w: &QuantizedHost) -> Vec<f64> {
    let (n, k) = (w.n(), w.k());
    assert_eq!(x.len(), m * k, "reference::gemv: x is not [m, k]");
    let wd = dequantize(w);
    let xd: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    let mut y = vec![0f64; m * n];
    for t in 0..m {
        let xr = &xd[t * k..(t + 1) * k];
        for r in 0..n {
            y[t * n + r] = wd[r * k..(r + 1) * k]
                .iter()
                .zip(xr)
                .map(|(a, b)| a * b)
                .sum();
        }
    }
    y
}
