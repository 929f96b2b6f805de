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
    let mut out = vec![0f64; w.n() * w.k()];
    dequantize_rows(w, 0, &mut out);
    out
}

/// Rows `r0 .. r0 + out.len() / k` of [`dequantize`]`(w)` into `out` (whole rows).
fn dequantize_rows(w: &QuantizedHost, r0: usize, out: &mut [f64]) {
    let (k, data) = (w.k(), w.data());
    let base = r0 * k; // the first value's index in the whole weight
    match (w.format(), w.scales()) {
        (QuantFormat::Int8, Scales::F32(s)) => {
            for (j, o) in out.iter_mut().enumerate() {
                let i = base + j;
                *o = (data[i] as i8) as f64 * s[i / k] as f64;
            }
        }
        (QuantFormat::Int4 { group, zero_point }, Scales::F16(s)) => {
            for (j, o) in out.iter_mut().enumerate() {
                let i = base + j;
                let nib = (data[i / 2] >> (4 * (i % 2))) & 15;
                let g = i / group; // row-major groups: (i / k) * (k / group) + (i % k) / group
                let zero = if zero_point { w.zeros()[g] } else { 8 };
                *o = (nib as f64 - zero as f64) * s[g].to_f64();
            }
        }
        // Rows are whole blocks (k % 32 == 0): block b of these rows is block base / 32 + b.
        (QuantFormat::Q8_0, _) => {
            let blocks = &data[base / BLOCK * Q8_0_BLOCK_BYTES..];
            for (blk, o) in blocks
                .chunks_exact(Q8_0_BLOCK_BYTES)
                .zip(out.chunks_exact_mut(BLOCK))
            {
                let d = f16::from_le_bytes([blk[0], blk[1]]).to_f64();
                for j in 0..BLOCK {
                    o[j] = d * (blk[2 + j] as i8) as f64;
                }
            }
        }
        (QuantFormat::Q4_0, _) => {
            let blocks = &data[base / BLOCK * Q4_0_BLOCK_BYTES..];
            for (blk, o) in blocks
                .chunks_exact(Q4_0_BLOCK_BYTES)
                .zip(out.chunks_exact_mut(BLOCK))
            {
                let d = f16::from_le_bytes([blk[0], blk[1]]).to_f64();
                for j in 0..16 {
                    let q = blk[2 + j];
                    o[j] = d * ((q & 15) as f64 - 8.0);
                    o[j + 16] = d * ((q >> 4) as f64 - 8.0);
                }
            }
        }
        (QuantFormat::Q4_K | QuantFormat::Q5_K | QuantFormat::Q6_K, _) => {
            if let Some(ty) = w.format().ggml_type() {
                let rb = data.len() / w.n().max(1);
                let rows = data[r0 * rb..].chunks_exact(rb.max(1));
                for (row, o) in rows.zip(out.chunks_exact_mut(k)) {
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
}

/// `y[t, r] = Σ_j x[t, j] · W[r, j]` in f64 with `W` = [`dequantize`]`(w)`, `x` `[m, k]`
/// row-major; returns `y` `[m, n]` unrounded. Panics if `x.len() != m · k` (a test bug).
///
/// The rows are split over the host's threads (a large weight's reference is most of a GPU
/// test's time); each row's sum is taken in the same order whatever the split.
pub fn gemv<T: FloatDType>(x: &[T], m: usize, w: &QuantizedHost) -> Vec<f64> {
    let (n, k) = (w.n(), w.k());
    assert_eq!(x.len(), m * k, "reference::gemv: x is not [m, k]");
    let xd: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    // Row-major [n, m] (each thread owns whole rows), transposed at the end.
    let mut yt = vec![0f64; n * m];
    if n == 0 || k == 0 || m == 0 {
        return yt;
    }
    let threads = std::thread::available_parallelism()
        .map_or(1, |t| t.get())
        .min(16);
    // Rows per task: an even share, at least 64, at most ~4 MB of dequantised f64.
    let cap = ((1 << 19) / k).max(1);
    let rows = n.div_ceil(threads).max(64).min(cap).min(n);
    let tasks: Vec<(usize, &mut [f64])> = yt
        .chunks_mut(rows * m)
        .enumerate()
        .map(|(i, c)| (i * rows, c))
        .collect();
    let next = std::sync::Mutex::new(tasks.into_iter());
    std::thread::scope(|sc| {
        for _ in 0..threads {
            sc.spawn(|| {
                let mut wd = Vec::new();
                loop {
                    let Some((r0, out)) = next.lock().unwrap_or_else(|e| e.into_inner()).next()
                    else {
                        return;
                    };
                    let nr = out.len() / m;
                    wd.resize(nr * k, 0f64);
                    dequantize_rows(w, r0, &mut wd);
                    for (r, yr) in out.chunks_exact_mut(m).enumerate() {
                        let wr = &wd[r * k..(r + 1) * k];
                        for (t, y) in yr.iter_mut().enumerate() {
                            let xr = &xd[t * k..(t + 1) * k];
                            *y = wr.iter().zip(xr).map(|(a, b)| a * b).sum();
                        }
                    }
                }
            });
        }
    });
    let mut y = vec![0f64; m * n];
    for (r, yr) in yt.chunks_exact(m).enumerate() {
        for (t, &v) in yr.iter().enumerate() {
            y[t * n + r] = v;
        }
    }
    y
}
