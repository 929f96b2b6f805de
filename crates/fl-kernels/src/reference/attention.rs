//! References for [`crate::attention`](mod@crate::attention), in f64.

/// Decode attention over a dense cache, in f64.
///
/// `q`: `[batch, q_heads, d]`; `k`, `v`: `[batch, kv_heads, cap, d]`; `seq_lens`: `[batch]`.
/// Returns `[batch, q_heads, d]`: for each (b, h) the softmax over positions
/// `max(0, len − window)..len` (window 0 = all) of `scale · q·k`, applied to `v`; zeros for
/// an empty range.
#[allow(clippy::too_many_arguments)]
pub fn decode(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    seq_lens: &[usize],
    q_heads: usize,
    kv_heads: usize,
    d: usize,
    cap: usize,
    scale: f64,
    window: usize,
) -> Vec<f64> {
    let batch = seq_lens.len();
    let g = q_heads / kv_heads;
    let mut out = vec![0f64; batch * q_heads * d];
    for b in 0..batch {
        let len = seq_lens[b].min(cap);
        let lo = if window > 0 {
            len.saturating_sub(window)
        } else {
            0
        };
        for h in 0..q_heads {
            let kvh = h / g;
            let qrow = &q[(b * q_heads + h) * d..][..d];
            let base = (b * kv_heads + kvh) * cap;
            let scores: Vec<f64> = (lo..len)
                .map(|j| {
                    let krow = &k[(base + j) * d..][..d];
                    scale * qrow.iter().zip(krow).map(|(a, b)| a * b).sum::<f64>()
                })
                .collect();
            if scores.is_empty() {
                continue;
            }
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let sum: f64 = w.iter().sum();
            let o = &mut out[(b * q_heads + h) * d..][..d];
            for (jj, wj) in w.iter().enumerate() {
                let vrow = &v[(base + lo + jj) * d..][..d];
                for e in 0..d {
                    o[e] += wj / sum * vrow[e];
                }
            }
        }
    }
    out
}
