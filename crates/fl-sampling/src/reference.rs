//! CPU references of every processor and sampler, in plain Rust.
//!
//! These are the *definitions* the kernels implement, written the obvious way (sorts,
//! maps), with the same arithmetic where it matters: the same portable [`exp_fl`], the
//! same fixed-point masses (`trunc(e * 2^40)` as `u64`), the same integer top-p target and
//! inverse CDF, the same Philox stream. So for the same logits, parameters and uniform, the
//! GPU and this reference pick the same token, bit for bit, and process logits to the same
//! bits; the GPU tests assert equality, not closeness.
//!
//! [`textbook_probabilities`] is an independent f64 rendering of the Hugging Face recipe
//! (softmax, sort, cumulative sum) used to check that the definitions mean what they say;
//! [`radix`] is a CPU model of the kernel's sort-free select, checked against the sort-based
//! definition in CI (no GPU needed).

use std::collections::BTreeMap;

use fl_kernels::FloatDType;

use crate::philox;
use crate::SamplingParams;

/// `2^40`: the fixed-point scale of a token's mass (`q = trunc(e * 2^40)`, `e <= 1`).
pub const MASS_SCALE: f32 = 1_099_511_627_776.0;

/// NaN -> -inf, +inf -> `f32::MAX`, -0 -> +0 (what the sampler reads).
pub fn sanitize(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else if x == f32::INFINITY {
        f32::MAX
    } else if x == 0.0 {
        0.0
    } else {
        x
    }
}

/// Order-preserving map of a sanitized float to `u32` (larger float, larger key).
pub fn key(x: f32) -> u32 {
    let b = x.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// The inverse of [`key`].
pub fn float_of_key(k: u32) -> f32 {
    f32::from_bits(if k & 0x8000_0000 != 0 {
        k & 0x7fff_ffff
    } else {
        !k
    })
}

/// `exp(x)` for `x <= 0` from correctly rounded operations only (round-half-even, fused
/// multiply-add, products), so that the kernel's identical sequence gives identical bits.
/// Returns 0 below -30 (and for -inf or NaN): `e^-30 < 2^-40`, no mass at that scale.
/// Relative error within a few ulp of `exp` on [-30, 0].
pub fn exp_fl(x: f32) -> f32 {
    if x.is_nan() || x < -30.0 {
        return 0.0;
    }
    let c = f32::from_bits;
    let n = (x * c(0x3fb8_aa3b)).round_ties_even(); // log2(e)
    let r = n.mul_add(-c(0x3f31_7200), x); // ln 2, high part
    let r = n.mul_add(-c(0x35bf_be8e), r); // ln 2, low part
    let mut p = c(0x3950_0d01); // 1/7!
    p = p.mul_add(r, c(0x3ab6_0b61)); // 1/6!
    p = p.mul_add(r, c(0x3c08_8889)); // 1/5!
    p = p.mul_add(r, c(0x3d2a_aaab)); // 1/4!
    p = p.mul_add(r, c(0x3e2a_aaab)); // 1/3!
    p = p.mul_add(r, 0.5);
    p = p.mul_add(r, 1.0);
    p = p.mul_add(r, 1.0);
    let s = c((((n as i32) + 127) as u32) << 23); // 2^n, n in [-44, 0]
    p * s
}

/// `e = exp_fl((v - max) / temperature)` of a sanitized logit `v`.
pub fn relative_prob(v: f32, max: f32, temperature: f32) -> f32 {
    exp_fl((v - max) / temperature)
}

/// Fixed-point mass of a relative probability: `trunc(e * 2^40)`.
pub fn fixed_mass(e: f32) -> u64 {
    (e * MASS_SCALE) as u64
}

/// `trunc(top_p * 2^32)` as the kernel computes it (f32 product, truncation).
pub fn top_p_fixed(top_p: f32) -> u64 {
    (top_p * 4_294_967_296.0_f32) as u64
}

/// The top-p mass target: `max(1, ceil(total * p_fx / 2^32))`.
pub fn top_p_target(total: u64, p_fx: u64) -> u64 {
    let prod = total as u128 * p_fx as u128;
    let t = (prod >> 32) as u64 + u64::from(prod & 0xffff_ffff != 0);
    t.max(1)
}

/// `floor(total * word / 2^32)`: the inverse-CDF target for the uniform `word / 2^32`.
pub fn cdf_target(total: u64, word: u32) -> u64 {
    ((total as u128 * word as u128) >> 32) as u64
}

/// What the sampler does with one row.
#[derive(Clone, Debug, PartialEq)]
pub struct RowPlan {
    /// `Some(token)` when the row is decoded greedily (temperature 0, no parameters, or no
    /// finite logit): the lowest index holding the largest logit.
    pub greedy: Option<usize>,
    /// The largest sanitized logit.
    pub max: f32,
    /// The key threshold (every kept token has `key >= tau`); 0 when nothing is cut.
    pub tau: u32,
    /// Per token: in the kept set K (after top-k, top-p and min-p).
    pub kept: Vec<bool>,
    /// Per token: fixed-point mass if kept, else 0 (empty for greedy rows).
    pub mass: Vec<u64>,
}

impl RowPlan {
    /// Sum of the kept masses.
    pub fn total(&self) -> u64 {
        self.mass.iter().sum()
    }

    /// The token picked for the 32-bit uniform `word`: the lowest index whose inclusive
    /// prefix sum of kept masses (in token order) exceeds `cdf_target(total, word)`.
    pub fn pick(&self, word: u32) -> usize {
        if let Some(g) = self.greedy {
            return g;
        }
        let target = cdf_target(self.total(), word);
        let mut cum = 0u64;
        for (i, &q) in self.mass.iter().enumerate() {
            cum += q;
            if cum > target {
                return i;
            }
        }
        // unreachable (total > target); keep it defined like the kernel
        self.kept.iter().position(|&k| k).unwrap_or(0)
    }

    /// The sampler's distribution: `mass / total` (one-hot for greedy rows).
    pub fn probabilities(&self) -> Vec<f64> {
        if let Some(g) = self.greedy {
            let mut p = vec![0.0; self.kept.len()];
            p[g] = 1.0;
            return p;
        }
        let total = self.total() as f64;
        self.mass.iter().map(|&q| q as f64 / total).collect()
    }

    /// Tokens the sampler can return: kept with a non-zero mass (or the greedy token).
    pub fn possible(&self) -> Vec<bool> {
        if let Some(g) = self.greedy {
            let mut p = vec![false; self.kept.len()];
            p[g] = true;
            return p;
        }
        self.mass.iter().map(|&q| q > 0).collect()
    }
}

/// Sanitized f32 values of a row.
pub fn sanitized<T: FloatDType>(row: &[T]) -> Vec<f32> {
    row.iter().map(|v| sanitize(v.to_f32())).collect()
}

/// The plan of one row (sort-based definitions of the thresholds).
///
/// top-k: `tau_k` = the k-th largest key. top-p: over tokens with `key >= tau_k`, `tau_p` =
/// the largest key `v` whose upper set `{key >= v}` holds at least
/// [`top_p_target`]`(total, `[`top_p_fixed`]`(top_p))` of the mass. Kept: `key >= max(tau_k,
/// tau_p)` and, when min-p is on, `e >= min_p`.
pub fn plan_row<T: FloatDType>(row: &[T], params: Option<&SamplingParams>) -> RowPlan {
    let x = sanitized(row);
    let keys: Vec<u32> = x.iter().map(|&v| key(v)).collect();
    let mut kmax = 0u32;
    let mut argmax = 0usize;
    for (i, &k) in keys.iter().enumerate() {
        if k > kmax {
            kmax = k;
            argmax = i;
        }
    }
    let max = float_of_key(kmax);
    let greedy_plan = || RowPlan {
        greedy: Some(argmax),
        max,
        tau: 0,
        kept: keys.iter().map(|&k| k == kmax).collect(),
        mass: Vec::new(),
    };
    let Some(p) = params else {
        return greedy_plan();
    };
    if p.temperature <= 0.0 || max == f32::NEG_INFINITY || x.is_empty() {
        return greedy_plan();
    }
    let t = p.temperature;
    let vocab = x.len();
    let e: Vec<f32> = x.iter().map(|&v| relative_prob(v, max, t)).collect();
    let q: Vec<u64> = e.iter().map(|&e| fixed_mass(e)).collect();

    let mut tau = 0u32;
    let k = p.top_k.min(i32::MAX as u32) as usize;
    if k > 0 && k < vocab {
        let mut sorted = keys.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        tau = sorted[k - 1];
    }
    if p.top_p < 1.0 {
        let mut cand: Vec<usize> = (0..vocab).filter(|&i| keys[i] >= tau).collect();
        cand.sort_by(|&a, &b| keys[b].cmp(&keys[a]).then(a.cmp(&b)));
        let total: u64 = cand.iter().map(|&i| q[i]).sum();
        let target = top_p_target(total, top_p_fixed(p.top_p));
        let mut cum = 0u64;
        let mut j = 0;
        while j < cand.len() {
            let kj = keys[cand[j]];
            while j < cand.len() && keys[cand[j]] == kj {
                cum += q[cand[j]];
                j += 1;
            }
            if cum >= target {
                tau = tau.max(kj);
                break;
            }
        }
    }
    let minp_on = p.min_p > 0.0;
    let kept: Vec<bool> = (0..vocab)
        .map(|i| keys[i] >= tau && !(minp_on && e[i] < p.min_p))
        .collect();
    let mass = (0..vocab).map(|i| if kept[i] { q[i] } else { 0 }).collect();
    RowPlan {
        greedy: None,
        max,
        tau,
        kept,
        mass,
    }
}

/// The token the sampler returns for one row and uniform word.
pub fn sample_row<T: FloatDType>(row: &[T], params: Option<&SamplingParams>, word: u32) -> i32 {
    plan_row(row, params).pick(word) as i32
}

/// The sampler over a batch (`fl_sample`): `logits` is `[batch, vocab]` row-major;
/// `params` one per row (`None`: greedy); `steps` the Philox step per row (`None`: 0);
/// finished rows (`finished[r] != 0`) get `pad_id`.
pub fn sample<T: FloatDType>(
    logits: &[T],
    vocab: usize,
    params: Option<&[SamplingParams]>,
    steps: Option<&[i32]>,
    finished: Option<&[u8]>,
    pad_id: i32,
) -> Vec<i32> {
    let batch = logits.len().checked_div(vocab).unwrap_or(0);
    (0..batch)
        .map(|r| {
            if finished.is_some_and(|f| f[r] != 0) {
                return pad_id;
            }
            let row = &logits[r * vocab..(r + 1) * vocab];
            let p = params.map(|ps| &ps[r]);
            let word = p.map_or(0, |p| philox::uniform_word(p, steps.map_or(0, |s| s[r])));
            sample_row(row, p, word)
        })
        .collect()
}

/// An independent f64 rendering of the Hugging Face recipe for one row (sanitized logits):
/// softmax of `x / T` in f64, top-k keeping ties with the k-th value, top-p by sorting and
/// a cumulative sum (smallest prefix reaching `top_p`, ties with its last value kept), min-p
/// against the largest probability. Returns the renormalized distribution (one-hot when
/// greedy). Used to check [`plan_row`]'s definitions, away from float boundaries.
pub fn textbook_probabilities(row: &[f32], p: &SamplingParams) -> Vec<f64> {
    let x: Vec<f64> = row.iter().map(|&v| sanitize(v) as f64).collect();
    let n = x.len();
    let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    if p.temperature <= 0.0 || m == f64::NEG_INFINITY {
        let g = x.iter().position(|&v| v == m).unwrap_or(0);
        let mut out = vec![0.0; n];
        out[g] = 1.0;
        return out;
    }
    let t = p.temperature as f64;
    let e: Vec<f64> = x.iter().map(|&v| ((v - m) / t).exp()).collect();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| x[b].total_cmp(&x[a]).then(a.cmp(&b)));
    let mut keep = vec![true; n];
    let k = p.top_k as usize;
    if k > 0 && k < n {
        let vk = x[order[k - 1]];
        for i in 0..n {
            keep[i] = x[i] >= vk;
        }
    }
    if p.top_p < 1.0 {
        let total: f64 = (0..n).filter(|&i| keep[i]).map(|i| e[i]).sum();
        let mut cum = 0.0;
        let mut cut = f64::NEG_INFINITY;
        for &i in order.iter().filter(|&&i| keep[i]) {
            cum += e[i];
            if cum >= p.top_p as f64 * total {
                cut = x[i];
                break;
            }
        }
        for i in 0..n {
            keep[i] = keep[i] && x[i] >= cut;
        }
    }
    if p.min_p > 0.0 {
        for i in 0..n {
            keep[i] = keep[i] && e[i] >= p.min_p as f64;
        }
    }
    let z: f64 = (0..n).filter(|&i| keep[i]).map(|i| e[i]).sum();
    (0..n)
        .map(|i| if keep[i] { e[i] / z } else { 0.0 })
        .collect()
}

// ---------------------------------------------------------------- processors

/// Penalties, banned tokens and end-id masking on one row, in place (`fl_process_logits`):
/// `history` is the row's valid history (already cut to its length), `banned` its ban list,
/// `length` the number of tokens generated so far, `end_ids` the end tokens. Ids outside
/// `[0, vocab)` are skipped.
///
/// 1. when [`SamplingParams::has_penalties`]: for each distinct token `t` of `history` with
///    count `c`: `x = x > 0 ? x / rep : x * rep; x = x - fma(frequency, c, presence)` in f32,
///    rounded once to `T`;
/// 2. banned tokens -> -inf;
/// 3. when `length < min_new_tokens`: end ids -> -inf.
pub fn process_row<T: FloatDType>(
    row: &mut [T],
    params: &SamplingParams,
    history: &[i32],
    banned: &[i32],
    length: i32,
    end_ids: &[i32],
) {
    let vocab = row.len();
    let valid = |t: i32| t >= 0 && (t as usize) < vocab;
    if params.has_penalties() {
        let mut counts: BTreeMap<usize, u32> = BTreeMap::new();
        for &t in history.iter().filter(|&&t| valid(t)) {
            *counts.entry(t as usize).or_insert(0) += 1;
        }
        for (&t, &c) in &counts {
            let mut x = row[t].to_f32();
            x = if x > 0.0 {
                x / params.repetition_penalty
            } else {
                x * params.repetition_penalty
            };
            x -= params
                .frequency_penalty
                .mul_add(c as f32, params.presence_penalty);
            row[t] = T::from_f32(x);
        }
    }
    for &t in banned.iter().filter(|&&t| valid(t)) {
        row[t as usize] = T::from_f32(f32::NEG_INFINITY);
    }
    let min_new = params.min_new_tokens.min(i32::MAX as u32) as i32;
    if length < min_new {
        for &t in end_ids.iter().filter(|&&t| valid(t)) {
            row[t as usize] = T::from_f32(f32::NEG_INFINITY);
        }
    }
}

/// Host-side inputs of [`process_logits`], all optional, with the layouts of the kernel's.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostProcessInputs<'a> {
    /// `(tokens [batch * max_history], lens [batch], max_history)`.
    pub history: Option<(&'a [i32], &'a [i32], usize)>,
    /// `(ids [batch * max_banned], max_banned)`.
    pub banned: Option<(&'a [i32], usize)>,
    /// Generated lengths `[batch]` (absent: 0).
    pub lengths: Option<&'a [i32]>,
    /// End ids.
    pub end_ids: Option<&'a [i32]>,
}

/// [`process_row`] over a `[batch, vocab]` batch.
pub fn process_logits<T: FloatDType>(
    logits: &mut [T],
    vocab: usize,
    params: &[SamplingParams],
    inputs: &HostProcessInputs<'_>,
) {
    for (r, row) in logits
        .chunks_mut(vocab.max(1))
        .enumerate()
        .take(params.len())
    {
        let history: &[i32] = match inputs.history {
            Some((toks, lens, mh)) => {
                let n = lens[r].clamp(0, mh as i32) as usize;
                &toks[r * mh..r * mh + n]
            }
            None => &[],
        };
        let banned: &[i32] = match inputs.banned {
            Some((ids, mb)) => &ids[r * mb..(r + 1) * mb],
            None => &[],
        };
        let length = inputs.lengths.map_or(0, |l| l[r]);
        let end_ids = inputs.end_ids.unwrap_or(&[]);
        process_row(row, &params[r], history, banned, length, end_ids);
    }
}

// ---------------------------------------------------------------- bookkeeping

/// The bookkeeping step (`fl_decode_update`); returns `all_finished`.
///
/// Finished rows get `pad_id`; others append their token to `history` (when given and
/// there is room), count it in `lengths`, and finish on an end id or on reaching
/// `max_new_tokens`.
#[allow(clippy::too_many_arguments)]
pub fn decode_update(
    tokens: &mut [i32],
    finished: &mut [u8],
    lengths: &mut [i32],
    params: Option<&[SamplingParams]>,
    end_ids: &[i32],
    pad_id: i32,
    mut history: Option<(&mut [i32], usize)>,
) -> bool {
    let mut all = true;
    for r in 0..tokens.len() {
        if finished[r] != 0 {
            tokens[r] = pad_id;
            continue;
        }
        let tok = tokens[r];
        let len = lengths[r];
        if let Some((h, mh)) = history.as_mut() {
            if len >= 0 && (len as usize) < *mh {
                h[r * *mh + len as usize] = tok;
            }
        }
        let len = len.wrapping_add(1);
        lengths[r] = len;
        let max_new = params.map_or(0, |p| p[r].max_new_tokens.min(i32::MAX as u32) as i32);
        if end_ids.contains(&tok) || (max_new > 0 && len >= max_new) {
            finished[r] = 1;
        } else {
            all = false;
        }
    }
    all
}

// ---------------------------------------------------------------- model of the kernel

/// A CPU model of the kernel's sort-free algorithm: the radix select with its digits
/// (11, 11, 10 bits) and early exits, and the split sampling pass (chunks per block,
/// segments of tiles, in-segment scan). Property tests check it against [`plan_row`] and
/// [`RowPlan::pick`]; it is not used by the GPU path.
pub mod radix {
    use super::*;

    const DIGITS: [u32; 3] = [11, 11, 10];
    const TILE: usize = 256;
    const BINS: usize = 2048;

    /// First position in `order` where the running sum reaches `target`: (position's
    /// index, sum before it).
    fn crossing(
        w: &[u64],
        order: impl Iterator<Item = usize>,
        target: u64,
    ) -> Option<(usize, u64)> {
        let mut cum = 0u64;
        for i in order {
            if cum + w[i] >= target {
                return Some((i, cum));
            }
            cum += w[i];
        }
        None
    }

    /// The kernel's select. `mass = None`: COUNT (the `target`-th largest key among keys
    /// `>= floor`). `mass = Some((q, p_fx))`: MASS (target from the first pass's total).
    pub fn select(keys: &[u32], floor: u32, mut target: u64, mass: Option<(&[u64], u64)>) -> u32 {
        let mut prefix = 0u32;
        let mut known = 0u32;
        for (d, &bits) in DIGITS.iter().enumerate() {
            let shift = 32 - known - bits;
            let mut hc = vec![0u64; BINS];
            let mut hm = vec![0u64; BINS];
            for (i, &k) in keys.iter().enumerate() {
                let inside = k >= floor && (known == 0 || (k >> (32 - known)) == prefix);
                if inside {
                    let b = ((k >> shift) & ((1 << bits) - 1)) as usize;
                    hc[b] += 1;
                    if let Some((q, _)) = mass {
                        hm[b] += q[i];
                    }
                }
            }
            if let (Some((_, p_fx)), 0) = (mass, d) {
                target = top_p_target(hm.iter().sum(), p_fx);
            }
            let w = if mass.is_some() { &hm } else { &hc };
            let Some((bin, before)) = crossing(w, (0..BINS).rev(), target) else {
                return prefix << (32 - known);
            };
            target -= before;
            prefix = (prefix << bits) | bin as u32;
            known += bits;
            let cnt = hc[bin];
            if cnt == 1 || (mass.is_none() && cnt == target) || known == 32 {
                break;
            }
        }
        if known == 32 {
            prefix
        } else {
            prefix << (32 - known)
        }
    }

    /// The whole row as the kernel computes it, with the row split over `split` blocks
    /// (chunks of `round_up(ceil(vocab / split), 256)` tokens).
    pub fn sample_row<T: FloatDType>(
        row: &[T],
        params: Option<&SamplingParams>,
        word: u32,
        split: usize,
    ) -> i32 {
        let x = sanitized(row);
        let vocab = x.len();
        let keys: Vec<u32> = x.iter().map(|&v| key(v)).collect();
        // pass 0: best = max over (key << 32 | !index)
        let best = keys
            .iter()
            .enumerate()
            .map(|(i, &k)| ((k as u64) << 32) | (0xffff_ffff - i as u32) as u64)
            .max()
            .unwrap_or(0);
        let kmax = (best >> 32) as u32;
        let argmax = (0xffff_ffff - best as u32) as i32;
        let max = float_of_key(kmax);
        let Some(p) = params else { return argmax };
        if p.temperature <= 0.0 || max == f32::NEG_INFINITY {
            return argmax;
        }
        let t = p.temperature;
        let e: Vec<f32> = x.iter().map(|&v| relative_prob(v, max, t)).collect();
        let q: Vec<u64> = e.iter().map(|&e| fixed_mass(e)).collect();
        let mut tau = 0u32;
        if p.top_k > 0 && (p.top_k as usize) < vocab {
            tau = select(&keys, 0, p.top_k as u64, None);
        }
        if p.top_p < 1.0 {
            tau = tau.max(select(&keys, tau, 1, Some((&q, top_p_fixed(p.top_p)))));
        }
        let qk: Vec<u64> = (0..vocab)
            .map(|i| {
                if keys[i] < tau || (p.min_p > 0.0 && e[i] < p.min_p) {
                    0
                } else {
                    q[i]
                }
            })
            .collect();
        // sampling pass, split like the kernel
        let chunk = vocab.div_ceil(split.max(1)).div_ceil(TILE) * TILE;
        let split = vocab.div_ceil(chunk);
        let block_mass: Vec<u64> = (0..split)
            .map(|c| qk[c * chunk..((c + 1) * chunk).min(vocab)].iter().sum())
            .collect();
        let total: u64 = block_mass.iter().sum();
        let target = cdf_target(total, word);
        let mut before = 0u64;
        for (c, &bm) in block_mass.iter().enumerate() {
            if target >= before && target < before + bm {
                let beg = c * chunk;
                let end = ((c + 1) * chunk).min(vocab);
                let ntiles = (end - beg).div_ceil(TILE);
                let tps = ntiles.div_ceil(BINS);
                let nseg = ntiles.div_ceil(tps);
                let seg: Vec<u64> = (0..nseg)
                    .map(|s| {
                        let a = beg + s * tps * TILE;
                        let b = (beg + (s + 1) * tps * TILE).min(end);
                        qk[a..b].iter().sum()
                    })
                    .collect();
                let t_local = target - before;
                let Some((s, sb)) = crossing(&seg, 0..nseg, t_local + 1) else {
                    return argmax;
                };
                let t_seg = t_local - sb;
                let a = beg + s * tps * TILE;
                let b = (beg + (s + 1) * tps * TILE).min(end);
                let mut cum = 0u64;
                for (i, &qi) in qk.iter().enumerate().take(b).skip(a) {
                    cum += qi;
                    if cum > t_seg {
                        return i as i32;
                    }
                }
                return argmax;
            }
            before += bm;
        }
        argmax
    }
}

// ---------------------------------------------------------------- beam search

/// `log_softmax` of one row in f32 as torch computes it (and `fl_engine::beam::log_softmax`):
/// `(x - m) - ln(sum exp(x - m))`, `m` the row's max (NaN ignored), the sum taken in order.
pub fn log_softmax_row<T: FloatDType>(row: &[T]) -> Vec<f32> {
    let max = row
        .iter()
        .map(|x| x.to_f32())
        .fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = row.iter().map(|x| (x.to_f32() - max).exp()).sum();
    let lse = sum.ln();
    row.iter().map(|x| (x.to_f32() - max) - lse).collect()
}

/// The beam-search step (`fl_beam_topk`): for each request `r`, the best
/// `k_r = min(keep[r], max_keep, rows_r * vocab)` (0 when `keep[r] < 1`) candidates over its
/// rows `b` (local beam `j`) and tokens `v`, scored
/// `beam_scores[b] + log_softmax_row(logits[b])[v]` in f32 (a NaN score counts as `-inf`),
/// sorted by score descending with ties to the smaller flat index `j * vocab + v`, as
/// `fl_engine::beam`'s `top_k` orders them.
///
/// `logits` is `[rows, vocab]` row-major, `beam_scores` `[rows]`, `req_start` `[n_req + 1]`
/// (request `r` owns rows `req_start[r] .. req_start[r + 1]`, clamped to `[0, rows]` and made
/// non-decreasing, as the kernel does), `keep` `[n_req]`. Returns `(scores, ids)`, each
/// `[n_req, max_keep]`, ids `j * vocab + v`; entries past `k_r` are `-inf` and `-1`.
pub fn beam_topk<T: FloatDType>(
    logits: &[T],
    vocab: usize,
    beam_scores: &[f32],
    req_start: &[i32],
    keep: &[i32],
    max_keep: usize,
) -> (Vec<f32>, Vec<i32>) {
    let rows = logits.len() / vocab.max(1);
    let n_req = keep.len();
    let mut scores = vec![f32::NEG_INFINITY; n_req * max_keep];
    let mut ids = vec![-1i32; n_req * max_keep];
    for r in 0..n_req {
        let first = (req_start[r].max(0) as usize).min(rows);
        let end = (req_start[r + 1].max(0) as usize).clamp(first, rows);
        let k = (keep[r].max(0) as usize)
            .min(max_keep)
            .min((end - first) * vocab);
        if k == 0 {
            continue;
        }
        let mut all: Vec<f32> = Vec::with_capacity((end - first) * vocab);
        for b in first..end {
            let lp = log_softmax_row(&logits[b * vocab..(b + 1) * vocab]);
            all.extend(lp.iter().map(|&l| {
                let s = beam_scores[b] + l;
                if s.is_nan() {
                    f32::NEG_INFINITY
                } else {
                    s
                }
            }));
        }
        let mut idx: Vec<usize> = (0..all.len()).collect();
        let by_score = |a: &usize, b: &usize| all[*b].total_cmp(&all[*a]).then(a.cmp(b));
        if k < idx.len() {
            idx.select_nth_unstable_by(k, by_score);
            idx.truncate(k);
        }
        idx.sort_by(by_score);
        for (i, &f) in idx.iter().enumerate() {
            scores[r * max_keep + i] = all[f];
            ids[r * max_keep + i] = f as i32;
        }
    }
    (scores, ids)
}
