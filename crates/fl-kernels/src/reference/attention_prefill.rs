//! References for [`crate::attention_prefill`](mod@crate::attention_prefill), in f64.

/// Causal prefill attention over a packed batch, in f64.
///
/// `q`: `[total, q_heads, d]`; `k`, `v`: `[total, kv_heads, d]`; `cu_seqlens`: `[batch + 1]`
/// prefix offsets. Returns `[total, q_heads, d]`: for the query at position `i` of sequence
/// `b` (token `s = cu[b] + i`) and head `h`, the softmax over keys `j` of the same sequence
/// with `max(0, i + 1 − window) ≤ j ≤ i` (window 0 = all) of `scale · q·k`, applied to `v`,
/// with kv head `h / (q_heads / kv_heads)`. Tokens outside every sequence stay 0.
#[allow(clippy::too_many_arguments)]
pub fn prefill(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    cu_seqlens: &[usize],
    q_heads: usize,
    kv_heads: usize,
    d: usize,
    scale: f64,
    window: usize,
) -> Vec<f64> {
    let total = q.len() / (q_heads * d).max(1);
    let g = q_heads / kv_heads;
    let mut out = vec![0f64; total * q_heads * d];
    for w in cu_seqlens.windows(2) {
        let (s0, s1) = (w[0].min(total), w[1].min(total));
        for i in 0..s1.saturating_sub(s0) {
            let lo = if window > 0 {
                (i + 1).saturating_sub(window)
            } else {
                0
            };
            for h in 0..q_heads {
                let kvh = h / g;
                let qrow = &q[((s0 + i) * q_heads + h) * d..][..d];
                let scores: Vec<f64> = (lo..=i)
                    .map(|j| {
                        let krow = &k[((s0 + j) * kv_heads + kvh) * d..][..d];
                        scale * qrow.iter().zip(krow).map(|(a, b)| a * b).sum::<f64>()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let wts: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let sum: f64 = wts.iter().sum();
                let o = &mut out[((s0 + i) * q_heads + h) * d..][..d];
                for (jj, wj) in wts.iter().enumerate() {
                    let vrow = &v[((s0 + lo + jj) * kv_heads + kvh) * d..][..d];
                    for e in 0..d {
                        o[e] += wj / sum * vrow[e];
                    }
                }
            }
        }
    }
    out
}
