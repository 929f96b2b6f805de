//! Shared test helpers: row generators and the chi-square goodness-of-fit test.
#![allow(dead_code)]

use fl_sampling::reference::RowPlan;
use rand::{Rng, SeedableRng};

/// Upper 0.1% point of the standard normal (P(Z > z) = 0.001).
pub const Z_999: f64 = 3.090_232_306;

/// Critical value of the chi-square distribution with `df` degrees of freedom at
/// significance 0.001 (P(X > c) = 0.001), by the Wilson-Hilferty approximation
/// `df * (1 - 2/(9 df) + z sqrt(2/(9 df)))^3`, slightly above the exact value (within 1.5%
/// for df >= 5: df = 5: 20.75 vs 20.52 exact; df = 10: 29.76 vs 29.59; df = 50: 86.8 vs
/// 86.66), so the test is a hair more lenient than p = 0.001.
pub fn chi2_critical_001(df: usize) -> f64 {
    let d = df as f64;
    let a = 2.0 / (9.0 * d);
    d * (1.0 - a + Z_999 * a.sqrt()).powi(3)
}

/// Pearson's chi-square of `counts` against `probs` (same length) over `n` draws. Bins
/// with an expected count below 5 are pooled into one bin (pooled into the smallest
/// regular bin if that pool is itself below 5). Returns (statistic, degrees of freedom).
/// A draw in a bin of probability 0 gives an infinite statistic.
pub fn chi_square(counts: &[u64], probs: &[f64], n: u64) -> (f64, usize) {
    let nf = n as f64;
    let mut bins: Vec<(f64, f64)> = Vec::new(); // (observed, expected)
    let mut pool = (0.0, 0.0);
    for (&c, &p) in counts.iter().zip(probs) {
        if p == 0.0 {
            if c > 0 {
                return (f64::INFINITY, 1);
            }
            continue;
        }
        let e = p * nf;
        if e < 5.0 {
            pool.0 += c as f64;
            pool.1 += e;
        } else {
            bins.push((c as f64, e));
        }
    }
    if pool.1 >= 5.0 {
        bins.push(pool);
    } else if pool.1 > 0.0 {
        if let Some(b) = bins.iter_mut().min_by(|a, b| a.1.total_cmp(&b.1)) {
            b.0 += pool.0;
            b.1 += pool.1;
        } else {
            bins.push(pool);
        }
    }
    let stat = bins.iter().map(|(o, e)| (o - e) * (o - e) / e).sum();
    (stat, bins.len().saturating_sub(1))
}

/// Cumulative kept masses of a plan (for fast picks by binary search; `RowPlan::pick` is
/// the linear definition, compared with this on a sample of words).
pub fn cdf(plan: &RowPlan) -> Vec<u64> {
    let mut acc = 0u64;
    plan.mass
        .iter()
        .map(|&q| {
            acc += q;
            acc
        })
        .collect()
}

/// The token for `word` given the cumulative masses (same rule as `RowPlan::pick`).
pub fn pick_cdf(cdf: &[u64], word: u32) -> usize {
    let total = *cdf.last().unwrap();
    let target = fl_sampling::reference::cdf_target(total, word);
    cdf.partition_point(|&c| c <= target)
}

/// Logits that look like an LM's: a few large values over a normal-ish bulk.
pub fn lm_like(rng: &mut impl Rng, vocab: usize, spread: f32) -> Vec<f32> {
    (0..vocab)
        .map(|_| {
            let u: f32 = rng.random_range(-1.0..1.0);
            let v: f32 = rng.random_range(-1.0..1.0);
            let w: f32 = rng.random_range(0.0..1.0);
            let base = (u + v) * spread;
            if w < 0.01 {
                base + 3.0 * spread
            } else {
                base
            }
        })
        .collect()
}

/// Logits with many exact ties: values from a small grid.
pub fn tied(rng: &mut impl Rng, vocab: usize, levels: i32) -> Vec<f32> {
    (0..vocab)
        .map(|_| rng.random_range(-levels..=levels) as f32 * 0.25)
        .collect()
}

/// A seeded RNG for a fixed-outcome test.
pub fn fixed_rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}
