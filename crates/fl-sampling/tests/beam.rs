//! The beam-search step: the CPU reference against a naive full sort and an f64 log-softmax
//! (CPU, run in CI), then the GPU kernel against the reference (f32, f16, bf16; one row and
//! several; odd vocabularies; ragged requests with different beam counts and keeps; banned
//! tokens; exact ties; keeps past 32 and 64), with outputs poisoned before the launch, and
//! the argument errors. GPU tests skip without a GPU (FL_REQUIRE_GPU=1 makes that a failure).
//!
//! GPU and CPU sum the exponentials in different orders (a tree of partial sums against one
//! running sum over up to 128,256 terms), so scores agree to within 1e-4 (relative, floored
//! at 1; 3.1e-5 seen on the H100 at vocab 128,256) and ids exactly on inputs whose best scores are not nearly tied:
//! the generators separate the top logits and every case checks that the reference's ranking
//! has no near ties (drawing again if it has).

use fl_kernels::testing::{gpu_or_skip, rng};
use fl_kernels::{bf16, f16, DeviceTensor, FloatDType, Gpu};
use fl_sampling::reference as r;
use fl_sampling::{beam_topk, BeamRequests, BeamTopkWorkspace, Error, BEAM_MAX_KEEP};
use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// Score tolerance: relative 1e-4, floored at 1 (scores near 0 are compared absolutely).
const TOL: f32 = 1e-4;

fn close(got: f32, want: f32) -> bool {
    if want.is_infinite() || got.is_infinite() {
        return got == want;
    }
    (got - want).abs() <= TOL * want.abs().max(1.0)
}

fn cast<T: FloatDType>(v: &[f32]) -> Vec<T> {
    v.iter().map(|&x| T::from_f32(x)).collect()
}

/// `req_start` of requests owning `rows[r]` rows each.
fn starts(rows: &[usize]) -> Vec<i32> {
    let mut v = vec![0i32];
    for &n in rows {
        v.push(v.last().unwrap() + n as i32);
    }
    v
}

// ---------------------------------------------------------------- CPU: the reference

/// The definition written the slow way: every score of the request, a full sort.
fn naive(
    logits: &[f32],
    vocab: usize,
    beam_scores: &[f32],
    req_start: &[i32],
    keep: &[i32],
    max_keep: usize,
) -> (Vec<f32>, Vec<i32>) {
    let rows = logits.len() / vocab;
    let n_req = keep.len();
    let mut scores = vec![f32::NEG_INFINITY; n_req * max_keep];
    let mut ids = vec![-1; n_req * max_keep];
    for q in 0..n_req {
        let a = (req_start[q].max(0) as usize).min(rows);
        let b = (req_start[q + 1].max(0) as usize).clamp(a, rows);
        let mut all: Vec<(f32, usize)> = Vec::new();
        for row in a..b {
            let x = &logits[row * vocab..(row + 1) * vocab];
            let mut m = f32::NEG_INFINITY;
            for &v in x {
                m = m.max(v);
            }
            let mut sum = 0f32;
            for &v in x {
                sum += (v - m).exp();
            }
            let lse = sum.ln();
            for (t, &v) in x.iter().enumerate() {
                let s = beam_scores[row] + ((v - m) - lse);
                all.push((
                    if s.is_nan() { f32::NEG_INFINITY } else { s },
                    (row - a) * vocab + t,
                ));
            }
        }
        all.sort_by(|p, q| q.0.total_cmp(&p.0).then(p.1.cmp(&q.1)));
        let k = (keep[q].max(0) as usize).min(max_keep).min(all.len());
        for (i, &(s, id)) in all.iter().take(k).enumerate() {
            scores[q * max_keep + i] = s;
            ids[q * max_keep + i] = id as i32;
        }
    }
    (scores, ids)
}

#[test]
fn reference_picks_the_documented_example() {
    let logits = [0.0f32, 1.0, 2.0, 2.0, 1.0, 0.0];
    let (s, ids) = r::beam_topk(&logits, 3, &[0.0, -0.5], &[0, 2], &[2], 3);
    assert_eq!(ids, vec![2, 3, -1]);
    let lse = (1.0f64 + (-1f64).exp() + (-2f64).exp()).ln();
    assert!((s[0] as f64 + lse).abs() < 1e-6 && (s[1] as f64 + 0.5 + lse).abs() < 1e-6);
    assert_eq!(s[2], f32::NEG_INFINITY);
}

#[test]
fn reference_log_softmax_matches_f64() {
    let mut g = rng("reference_log_softmax_matches_f64");
    for &vocab in &[1usize, 7, 1000, 32_000] {
        let x: Vec<f32> = (0..vocab).map(|_| g.random_range(-8.0f32..8.0)).collect();
        let got = r::log_softmax_row(&x);
        let m = x
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, |a, b| a.max(b as f64));
        let lse = x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
        for (i, &v) in x.iter().enumerate() {
            let want = v as f64 - m - lse;
            assert!(
                (got[i] as f64 - want).abs() <= 1e-5 * want.abs().max(1.0),
                "vocab {vocab} token {i}: {} vs {want}",
                got[i]
            );
        }
    }
}

#[test]
fn reference_banned_and_dead_rows() {
    // Row 0: two finite tokens; row 1: everything banned (its scores are NaN -> -inf).
    let ni = f32::NEG_INFINITY;
    let logits = [ni, 1.0, ni, 2.0, ni, ni, ni, ni];
    let (s, ids) = r::beam_topk(&logits, 4, &[0.0, 0.0], &[0, 2], &[5], 5);
    assert_eq!(&ids, &[3, 1, 0, 2, 4]);
    assert!(s[0].is_finite() && s[1].is_finite() && s[1] < s[0]);
    assert!(s[2..].iter().all(|&v| v == ni));
    // keep below 1 or past the request's candidates, rows clamped.
    let (s, ids) = r::beam_topk(&logits, 4, &[0.0, 0.0], &[1, 1, 2], &[5, 100], 3);
    assert_eq!(ids, vec![-1, -1, -1, 0, 1, 2]);
    assert!(s.iter().all(|&v| v == ni));
    let (_, ids) = r::beam_topk(&logits, 4, &[0.0, 0.0], &[0, 2], &[0], 2);
    assert_eq!(ids, vec![-1, -1]);
    let (_, ids) = r::beam_topk(&logits, 4, &[0.0, 0.0], &[2, 0], &[4], 2);
    assert_eq!(ids, vec![-1, -1]);
    let (_, ids) = r::beam_topk(&logits, 4, &[0.0, 0.0], &[0, 2], &[100], 20);
    assert_eq!(ids.iter().filter(|&&i| i >= 0).count(), 8);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn reference_matches_a_naive_full_sort(
        rows in proptest::collection::vec(0usize..5, 1..5),
        vocab in 1usize..300,
        max_keep in 1usize..=140,
        seed in any::<u64>(),
        levels in 0i32..6,
    ) {
        let mut g = rand::rngs::StdRng::seed_from_u64(seed);
        let total: usize = rows.iter().sum();
        // Coarse grids give exact ties; level 0 is continuous. Some tokens banned.
        let logits: Vec<f32> = (0..total * vocab)
            .map(|_| {
                if g.random_bool(0.1) {
                    f32::NEG_INFINITY
                } else if levels == 0 {
                    g.random_range(-6.0f32..6.0)
                } else {
                    g.random_range(-levels..=levels) as f32 * 0.5
                }
            })
            .collect();
        let bs: Vec<f32> = (0..total)
            .map(|_| if levels > 0 { -1.0 } else { g.random_range(-5.0f32..0.0) })
            .collect();
        let keep: Vec<i32> = rows.iter().map(|_| g.random_range(-1..=(max_keep as i32 + 3))).collect();
        let rs = starts(&rows);
        let want = naive(&logits, vocab, &bs, &rs, &keep, max_keep);
        let got = r::beam_topk(&logits, vocab, &bs, &rs, &keep, max_keep);
        prop_assert_eq!(&got.1, &want.1);
        prop_assert!(got.0.iter().zip(&want.0).all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}

// ---------------------------------------------------------------- GPU vs reference

/// Runs the kernel; outputs are poisoned (NaN, i32::MIN) before the launch.
fn gpu_beam<T: FloatDType>(
    gpu: &Gpu,
    logits: &[T],
    vocab: usize,
    beam_scores: &[f32],
    req_start: &[i32],
    keep: &[i32],
    max_keep: usize,
) -> (Vec<f32>, Vec<i32>) {
    let s = gpu.stream();
    let rows = beam_scores.len();
    let n_req = keep.len();
    let dl = DeviceTensor::from_host(s, logits, &[rows, vocab]).unwrap();
    let db = DeviceTensor::from_host(s, beam_scores, &[rows]).unwrap();
    let dr = DeviceTensor::from_host(s, req_start, &[n_req + 1]).unwrap();
    let dk = DeviceTensor::from_host(s, keep, &[n_req]).unwrap();
    let mut ws = BeamTopkWorkspace::new(s, rows, vocab, max_keep).unwrap();
    let mut out_s = DeviceTensor::filled(s, &[n_req, max_keep], f32::NAN).unwrap();
    let mut out_i = DeviceTensor::filled(s, &[n_req, max_keep], i32::MIN).unwrap();
    let req = BeamRequests {
        req_start: &dr,
        keep: &dk,
    };
    beam_topk(s, &dl, &db, &req, &mut ws, &mut out_s, &mut out_i).unwrap();
    (out_s.to_host(s).unwrap(), out_i.to_host(s).unwrap())
}

/// Whether the reference ranking of every request (one past its output width) is free of
/// near ties: neighbours differ by more than twice the tolerance (a few ulp within a row), or
/// are both -inf, or are the same logit of the same row (an exact tie, ranked by index on both
/// sides).
fn no_near_ties<T: FloatDType>(
    logits: &[T],
    vocab: usize,
    bs: &[f32],
    rs: &[i32],
    keep: &[i32],
    max_keep: usize,
) -> bool {
    let wide = max_keep + 1;
    let plus: Vec<i32> = keep
        .iter()
        .map(|&k| k.clamp(0, max_keep as i32) + 1)
        .collect();
    let (s, ids) = r::beam_topk(logits, vocab, bs, rs, &plus, wide);
    for q in 0..keep.len() {
        let first = rs[q].max(0) as usize;
        for i in 1..wide {
            let (a, b) = (s[q * wide + i - 1], s[q * wide + i]);
            let (ia, ib) = (ids[q * wide + i - 1], ids[q * wide + i]);
            if ib < 0 {
                break;
            }
            // Within a row both sides subtract the same log-sum-exp: only scores a few ulp
            // apart can come out in another order.
            let same_row = ia as usize / vocab == ib as usize / vocab;
            let same_logit = same_row
                && logits[first * vocab + ia as usize].to_f32()
                    == logits[first * vocab + ib as usize].to_f32();
            let margin = if same_row { 1e-6 } else { 2.0 * TOL };
            let apart = (a - b).abs() > margin * a.abs().max(1.0);
            if !(apart || same_logit || (a == f32::NEG_INFINITY && b == a)) {
                return false;
            }
        }
    }
    true
}

/// A case: requests of `rows[r]` rows keeping `keep[r]`, outputs `max_keep` wide; each row's
/// `top` best logits on a lattice, the bulk below them with a fraction `banned` at -inf.
struct Case<'a> {
    vocab: usize,
    rows: &'a [usize],
    keep: &'a [i32],
    max_keep: usize,
    banned: f64,
    top: usize,
}

impl<'a> Case<'a> {
    /// `top` = the largest keep + 4, nothing banned.
    fn new(vocab: usize, rows: &'a [usize], keep: &'a [i32], max_keep: usize) -> Self {
        let top = keep
            .iter()
            .map(|&k| k.clamp(1, max_keep as i32))
            .max()
            .unwrap_or(1) as usize
            + 4;
        Case {
            vocab,
            rows,
            keep,
            max_keep,
            banned: 0.0,
            top,
        }
    }
}

/// Logits whose best scores are apart: each row's `top` best logits are on the lattice
/// 2.5 + k / 16 (exact in bf16; the bulk is in [-4, 2)), and each beam score is chosen so that
/// local row j's scores sit at (x - max) - j / (16 * 17) - 3: rows of a request interleave
/// without near ties. Returns (logits, beam scores).
fn draw<T: FloatDType>(g: &mut impl Rng, c: &Case<'_>) -> (Vec<T>, Vec<f32>) {
    let vocab = c.vocab;
    let mut logits = Vec::new();
    let mut bs = Vec::new();
    let mut pos: Vec<usize> = (0..vocab).collect();
    for &n in c.rows {
        for j in 0..n {
            let mut row: Vec<f32> = (0..vocab)
                .map(|_| {
                    if g.random_bool(c.banned) {
                        f32::NEG_INFINITY
                    } else {
                        g.random_range(-4.0f32..2.0)
                    }
                })
                .collect();
            pos.shuffle(g);
            for (i, &p) in pos.iter().take(c.top.min(vocab)).enumerate() {
                row[p] = 2.5 + i as f32 / 16.0;
            }
            let row: Vec<T> = cast(&row);
            let lse = -r::log_softmax_row(&row)
                .into_iter()
                .fold(f32::NEG_INFINITY, f32::max);
            let lse = if lse.is_finite() { lse } else { 0.0 };
            bs.push(lse - (j % 17) as f32 / (16.0 * 17.0) - 3.0);
            logits.extend(row);
        }
    }
    (logits, bs)
}

/// Runs one case on the GPU and compares with the reference: ids exactly, scores within TOL.
fn check_case<T: FloatDType>(gpu: &Gpu, g: &mut impl Rng, c: &Case<'_>) {
    let rs = starts(c.rows);
    for attempt in 0..20 {
        let (logits, bs) = draw::<T>(g, c);
        if !no_near_ties(&logits, c.vocab, &bs, &rs, c.keep, c.max_keep) {
            continue;
        }
        let want = r::beam_topk(&logits, c.vocab, &bs, &rs, c.keep, c.max_keep);
        let got = gpu_beam(gpu, &logits, c.vocab, &bs, &rs, c.keep, c.max_keep);
        let what = format!(
            "{} vocab {} rows {:?} keep {:?} max_keep {} banned {} (attempt {attempt})",
            T::NAME,
            c.vocab,
            c.rows,
            c.keep,
            c.max_keep,
            c.banned
        );
        assert_eq!(got.1, want.1, "ids: {what}");
        for (i, (&a, &b)) in got.0.iter().zip(&want.0).enumerate() {
            assert!(close(a, b), "score {i}: GPU {a} vs CPU {b}: {what}");
        }
        return;
    }
    panic!(
        "no draw without near ties in 20 attempts (vocab {}, rows {:?})",
        c.vocab, c.rows
    );
}

fn all_dtypes(gpu: &Gpu, g: &mut impl Rng, c: &Case<'_>) {
    check_case::<f32>(gpu, g, c);
    check_case::<f16>(gpu, g, c);
    check_case::<bf16>(gpu, g, c);
}

#[test]
fn beam_topk_matches_reference_single_requests() {
    let Some(gpu) = gpu_or_skip("beam_topk_matches_reference_single_requests") else {
        return;
    };
    let mut g = rng("beam_topk_matches_reference_single_requests");
    for &vocab in &[7usize, 2048, 2049, 32_000, 50_257, 128_256] {
        for &rows in &[1usize, 4] {
            all_dtypes(&gpu, &mut g, &Case::new(vocab, &[rows], &[8], 8));
            all_dtypes(
                &gpu,
                &mut g,
                &Case::new(vocab, &[rows], &[3 * rows as i32], 12),
            );
        }
    }
    // One step of a batch of 64 requests of 4 beams (the benchmarked shape).
    check_case::<f16>(&gpu, &mut g, &Case::new(128_256, &[4; 64], &[8; 64], 8));
}

#[test]
fn beam_topk_matches_reference_ragged_requests() {
    let Some(gpu) = gpu_or_skip("beam_topk_matches_reference_ragged_requests") else {
        return;
    };
    let mut g = rng("beam_topk_matches_reference_ragged_requests");
    // First step (1 row), 4 beams, 2 beams, 3 beams; keeps of 2-3 x beams; a request with no
    // rows; keep 0 and keep past max_keep (clamped on the device).
    let rows = [1usize, 4, 2, 3, 0, 5, 1];
    let keep = [8i32, 8, 4, 9, 6, 0, 1000];
    for &vocab in &[7usize, 32_000, 50_257, 128_256] {
        all_dtypes(&gpu, &mut g, &Case::new(vocab, &rows, &keep, 12));
    }
    // Many requests of 1..=8 beams.
    let rows: Vec<usize> = (0..40).map(|_| g.random_range(1..=8)).collect();
    let keep: Vec<i32> = rows.iter().map(|&r| 2 * r as i32).collect();
    check_case::<bf16>(&gpu, &mut g, &Case::new(32_000, &rows, &keep, 16));
}

#[test]
fn beam_topk_wide_keeps() {
    let Some(gpu) = gpu_or_skip("beam_topk_wide_keeps") else {
        return;
    };
    let mut g = rng("beam_topk_wide_keeps");
    // Lists of 32, 64 and 128 keys per warp; keeps larger than a chunk's share.
    for &(k, max_keep) in &[(32i32, 32usize), (33, 40), (64, 64), (65, 100), (128, 128)] {
        all_dtypes(
            &gpu,
            &mut g,
            &Case::new(50_257, &[4, 1, 16], &[k, k, k], max_keep),
        );
    }
    // rows * vocab below keep: the whole request, in order.
    all_dtypes(&gpu, &mut g, &Case::new(7, &[4, 3], &[128, 100], 128));
}

#[test]
fn beam_topk_banned_tokens() {
    let Some(gpu) = gpu_or_skip("beam_topk_banned_tokens") else {
        return;
    };
    let mut g = rng("beam_topk_banned_tokens");
    for &vocab in &[7usize, 4096, 32_000, 128_256] {
        let c = Case {
            banned: 0.3,
            ..Case::new(vocab, &[4, 1, 3], &[8, 8, 6], 8)
        };
        all_dtypes(&gpu, &mut g, &c);
        // Mostly banned: keeps reach past the finite scores into the -inf ones.
        let c = Case {
            banned: 0.999,
            top: 2,
            ..Case::new(vocab, &[2, 2], &[12, 4], 12)
        };
        all_dtypes(&gpu, &mut g, &c);
    }
    // A row entirely banned (its scores are NaN, written -inf, ranked by index) after a live
    // row; then a request of the dead row alone.
    let vocab = 5000;
    let ni = f32::NEG_INFINITY;
    let c = Case {
        banned: 0.5,
        ..Case::new(vocab, &[2], &[8], 8)
    };
    let (mut x, bs) = draw::<f32>(&mut g, &c);
    x[vocab..].fill(ni);
    for max_keep in [8usize, 40] {
        let keep = [max_keep.min(12) as i32];
        let want = r::beam_topk(&x, vocab, &bs, &[0, 2], &keep, max_keep);
        let got = gpu_beam(&gpu, &x, vocab, &bs, &[0, 2], &keep, max_keep);
        assert_eq!(got.1, want.1);
        assert!(got.0.iter().zip(&want.0).all(|(&a, &b)| close(a, b)));
        let got = gpu_beam(&gpu, &x, vocab, &bs, &[1, 2], &[3], max_keep);
        assert_eq!(&got.1[..3], &[0, 1, 2]);
        assert!(got.0[..3].iter().all(|&v| v == ni));
        assert!(got.1[3..].iter().all(|&v| v == -1));
    }
}

#[test]
fn beam_topk_ties_come_out_in_index_order() {
    let Some(gpu) = gpu_or_skip("beam_topk_ties_come_out_in_index_order") else {
        return;
    };
    let mut g = rng("beam_topk_ties_come_out_in_index_order");
    // Identical rows with equal beam scores: every score appears once per row and per equal
    // logit; the ranking is decided by the flat index alone.
    for &vocab in &[7usize, 5000, 32_000, 128_256] {
        let row: Vec<f32> = (0..vocab)
            .map(|_| g.random_range(-3i32..=3) as f32 * 0.5)
            .collect();
        let x: Vec<f32> = row.iter().cycle().take(4 * vocab).copied().collect();
        let bs = [-1.0f32; 4];
        for &(keep, max_keep) in &[(8i32, 8usize), (100, 128)] {
            let want = r::beam_topk(&x, vocab, &bs, &[0, 4], &[keep], max_keep);
            let got = gpu_beam(&gpu, &x, vocab, &bs, &[0, 4], &[keep], max_keep);
            assert_eq!(got.1, want.1, "f32 vocab {vocab} keep {keep}");
            let xh: Vec<bf16> = cast(&x);
            let want = r::beam_topk(&xh, vocab, &bs, &[0, 4], &[keep], max_keep);
            let got = gpu_beam(&gpu, &xh, vocab, &bs, &[0, 4], &[keep], max_keep);
            assert_eq!(got.1, want.1, "bf16 vocab {vocab} keep {keep}");
            // equal scores in ascending id order
            for w in got.1.windows(2).zip(got.0.windows(2)) {
                if w.0[1] >= 0 && w.1[0] == w.1[1] {
                    assert!(w.0[0] < w.0[1], "tie out of index order: {:?}", w.0);
                }
            }
        }
    }
}

#[test]
fn beam_topk_gpu_proptest() {
    let Some(gpu) = gpu_or_skip("beam_topk_gpu_proptest") else {
        return;
    };
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &(
                proptest::collection::vec(1usize..6, 1..6),
                fl_kernels::testing::strategies::length(70_000),
                1usize..=BEAM_MAX_KEEP,
                any::<u64>(),
                0u8..3,
            ),
            |(rows, vocab, max_keep, seed, dt)| {
                let mut g = rand::rngs::StdRng::seed_from_u64(seed);
                let keep: Vec<i32> = rows
                    .iter()
                    .map(|_| g.random_range(1..=max_keep as i32))
                    .collect();
                let c = Case {
                    banned: 0.05,
                    ..Case::new(vocab, &rows, &keep, max_keep)
                };
                match dt {
                    0 => check_case::<f32>(&gpu, &mut g, &c),
                    1 => check_case::<f16>(&gpu, &mut g, &c),
                    _ => check_case::<bf16>(&gpu, &mut g, &c),
                }
                Ok(())
            },
        )
        .unwrap();
}

// ---------------------------------------------------------------- errors

#[test]
fn errors_name_the_argument() {
    let Some(gpu) = gpu_or_skip("beam errors_name_the_argument") else {
        return;
    };
    let s = gpu.stream();
    let (rows, vocab, n_req, mk) = (5usize, 100usize, 2usize, 8usize);
    let logits = DeviceTensor::<f32>::zeros(s, &[rows, vocab]).unwrap();
    let bs = DeviceTensor::<f32>::zeros(s, &[rows]).unwrap();
    let rs = DeviceTensor::from_host(s, &[0i32, 1, 5], &[n_req + 1]).unwrap();
    let keep = DeviceTensor::from_host(s, &[8i32, 8], &[n_req]).unwrap();
    let req = BeamRequests {
        req_start: &rs,
        keep: &keep,
    };
    let mut ws = BeamTopkWorkspace::new(s, rows, vocab, mk).unwrap();
    let mut os = DeviceTensor::<f32>::zeros(s, &[n_req, mk]).unwrap();
    let mut oi = DeviceTensor::<i32>::zeros(s, &[n_req, mk]).unwrap();
    beam_topk(s, &logits, &bs, &req, &mut ws, &mut os, &mut oi).unwrap();

    let arg = |e: Result<(), Error>| match e {
        Err(Error::Shape { arg, .. }) | Err(Error::InvalidArgument { arg, .. }) => arg,
        other => panic!("expected an argument error, got {other:?}"),
    };
    let flat = DeviceTensor::<f32>::zeros(s, &[rows * vocab]).unwrap();
    assert_eq!(
        arg(beam_topk(s, &flat, &bs, &req, &mut ws, &mut os, &mut oi)),
        "logits"
    );
    let bs4 = DeviceTensor::<f32>::zeros(s, &[4]).unwrap();
    assert_eq!(
        arg(beam_topk(s, &logits, &bs4, &req, &mut ws, &mut os, &mut oi)),
        "beam_scores"
    );
    let rs2 = DeviceTensor::from_host(s, &[0i32, 5], &[2]).unwrap();
    let bad = BeamRequests {
        req_start: &rs2,
        keep: &keep,
    };
    assert_eq!(
        arg(beam_topk(s, &logits, &bs, &bad, &mut ws, &mut os, &mut oi)),
        "req_start"
    );
    let k3 = DeviceTensor::from_host(s, &[8i32, 8, 8], &[3]).unwrap();
    let bad = BeamRequests {
        req_start: &rs,
        keep: &k3,
    };
    assert_eq!(
        arg(beam_topk(s, &logits, &bs, &bad, &mut ws, &mut os, &mut oi)),
        "keep"
    );
    let mut oi2 = DeviceTensor::<i32>::zeros(s, &[n_req, mk + 1]).unwrap();
    assert_eq!(
        arg(beam_topk(s, &logits, &bs, &req, &mut ws, &mut os, &mut oi2)),
        "out_ids"
    );
    let mut os1 = DeviceTensor::<f32>::zeros(s, &[n_req * mk]).unwrap();
    assert_eq!(
        arg(beam_topk(s, &logits, &bs, &req, &mut ws, &mut os1, &mut oi)),
        "out_scores"
    );
    // max_keep 0 and past BEAM_MAX_KEEP (the outputs' width)
    for w in [0, BEAM_MAX_KEEP + 1] {
        let mut osw = DeviceTensor::<f32>::zeros(s, &[n_req, w]).unwrap();
        let mut oiw = DeviceTensor::<i32>::zeros(s, &[n_req, w]).unwrap();
        assert_eq!(
            arg(beam_topk(
                s, &logits, &bs, &req, &mut ws, &mut osw, &mut oiw
            )),
            "max_keep"
        );
    }
    // a workspace made for fewer rows, another vocabulary, or a narrower keep
    let mut small = BeamTopkWorkspace::new(s, rows - 1, vocab, mk).unwrap();
    assert_eq!(
        arg(beam_topk(
            s, &logits, &bs, &req, &mut small, &mut os, &mut oi
        )),
        "workspace"
    );
    let mut other = BeamTopkWorkspace::new(s, rows, vocab + 1, mk).unwrap();
    assert_eq!(
        arg(beam_topk(
            s, &logits, &bs, &req, &mut other, &mut os, &mut oi
        )),
        "workspace"
    );
    let mut narrow = BeamTopkWorkspace::new(s, rows, vocab, mk - 1).unwrap();
    assert_eq!(
        arg(beam_topk(
            s,
            &logits,
            &bs,
            &req,
            &mut narrow,
            &mut os,
            &mut oi
        )),
        "workspace"
    );
    for (r, v, k, name) in [
        (1, 0, 8, "vocab"),
        (1, 100, 0, "max_keep"),
        (1, 100, BEAM_MAX_KEEP + 1, "max_keep"),
        (1 << 20, 1 << 12, 8, "vocab"),
    ] {
        match BeamTopkWorkspace::new(s, r, v, k) {
            Err(Error::InvalidArgument { arg, .. }) => assert_eq!(arg, name),
            other => panic!("workspace ({r}, {v}, {k}): expected {name}, got {other:?}"),
        }
    }
    // no requests: nothing launched
    let rs0 = DeviceTensor::from_host(s, &[0i32], &[1]).unwrap();
    let k0 = DeviceTensor::<i32>::zeros(s, &[0]).unwrap();
    let none = BeamRequests {
        req_start: &rs0,
        keep: &k0,
    };
    let mut os0 = DeviceTensor::<f32>::zeros(s, &[0, mk]).unwrap();
    let mut oi0 = DeviceTensor::<i32>::zeros(s, &[0, mk]).unwrap();
    beam_topk(s, &logits, &bs, &none, &mut ws, &mut os0, &mut oi0).unwrap();
}
