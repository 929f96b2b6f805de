//! CPU-only tests (they run in CI): Philox known answers, the portable exp, the sampler's
//! definitions against an independent f64 rendering of the Hugging Face recipe, the CPU
//! model of the kernel's radix select and split sampling pass against the sort-based
//! definitions, allowed-set properties, chi-square goodness of fit of seeded draws,
//! processors, bookkeeping and parameter validation.

// index-parallel loops over several per-token vectors read best with an index
#![allow(clippy::needless_range_loop)]

mod common;

use common::{cdf, chi2_critical_001, chi_square, fixed_rng, lm_like, pick_cdf, tied};
use fl_kernels::{bf16, f16, FloatDType};
use fl_sampling::philox::{philox4x32_10, row_words, uniform_word};
use fl_sampling::reference::{self as r, radix, HostProcessInputs};
use fl_sampling::{Error, SamplingParams};
use proptest::prelude::*;
use rand::Rng;

// ---------------------------------------------------------------- Philox

#[test]
fn philox_matches_random123_known_answers() {
    // Random123 kat_vectors, philox4x32 10: counter, key -> output.
    assert_eq!(
        philox4x32_10([0; 4], [0; 2]),
        [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
    );
    assert_eq!(
        philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
        [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
    );
    assert_eq!(
        philox4x32_10(
            [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
            [0xa4093822, 0x299f31d0]
        ),
        [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
    );
}

#[test]
fn philox_stream_depends_on_seed_request_and_step_only() {
    let a = SamplingParams {
        seed: 0x1234_5678_9abc_def0,
        request_id: 77,
        ..Default::default()
    };
    // the layout: counter = [step, 0, req_lo, req_hi], key = [seed_lo, seed_hi]
    assert_eq!(
        row_words(&a, 5),
        philox4x32_10([5, 0, 77, 0], [0x9abc_def0, 0x1234_5678])
    );
    // other parameters do not matter
    let b = SamplingParams {
        temperature: 0.3,
        top_k: 9,
        ..a
    };
    assert_eq!(uniform_word(&a, 5), uniform_word(&b, 5));
    // each key part changes the word
    assert_ne!(uniform_word(&a, 5), uniform_word(&a, 6));
    assert_ne!(
        uniform_word(&a, 5),
        uniform_word(
            &SamplingParams {
                request_id: 78,
                ..a
            },
            5
        )
    );
    assert_ne!(
        uniform_word(&a, 5),
        uniform_word(
            &SamplingParams {
                seed: a.seed ^ (1 << 40),
                ..a
            },
            5
        )
    );
}

#[test]
fn philox_words_are_uniform_enough() {
    // 16 bins over 2^32, 32k words: chi-square at p = 0.001 (df 15, critical ~37.7).
    let p = SamplingParams {
        seed: 99,
        ..Default::default()
    };
    let n = 32_768u64;
    let mut counts = vec![0u64; 16];
    for s in 0..n as i32 {
        counts[(uniform_word(&p, s) >> 28) as usize] += 1;
    }
    let (stat, df) = chi_square(&counts, &[1.0 / 16.0; 16], n);
    assert!(stat < chi2_critical_001(df), "chi2 {stat} df {df}");
}

// ---------------------------------------------------------------- exp_fl, keys

#[test]
fn exp_fl_is_close_to_exp_and_zero_below_minus_30() {
    let mut worst = 0f64;
    let mut x = -30.0f32;
    while x <= 0.0 {
        let got = r::exp_fl(x) as f64;
        let want = (x as f64).exp();
        worst = worst.max(((got - want) / want).abs());
        x += 0.000_731;
    }
    assert!(
        worst < 4.0 * f32::EPSILON as f64,
        "worst relative error {worst:e}"
    );
    assert_eq!(r::exp_fl(0.0), 1.0);
    assert_eq!(r::exp_fl(-0.0), 1.0);
    assert_eq!(r::exp_fl(-30.001), 0.0);
    assert_eq!(r::exp_fl(f32::NEG_INFINITY), 0.0);
    assert_eq!(r::exp_fl(f32::NAN), 0.0);
}

#[test]
fn exp_fl_is_monotone_to_within_an_ulp() {
    // Horner rounding makes it non-monotone at the last bit in places; nothing relies on
    // more (min-p is a per-token test, not a threshold on the logits).
    let mut g = fixed_rng(17);
    for _ in 0..200_000 {
        let x: f32 = g.random_range(-30.0..0.0);
        let y = if g.random_bool(0.5) {
            x.next_up()
        } else {
            g.random_range(x..=0.0)
        };
        let (ex, ey) = (r::exp_fl(x), r::exp_fl(y));
        assert!(
            ex <= ey.next_up(),
            "exp_fl({x}) = {ex} > exp_fl({y}) = {ey}"
        );
    }
}

#[test]
fn keys_preserve_order_and_sanitize() {
    let vals = [
        f32::NEG_INFINITY,
        -f32::MAX,
        -3.5,
        -1e-30,
        0.0,
        1e-40,
        2.0,
        f32::MAX,
    ];
    for w in vals.windows(2) {
        assert!(r::key(w[0]) < r::key(w[1]), "{} vs {}", w[0], w[1]);
    }
    for v in vals {
        assert_eq!(r::float_of_key(r::key(v)), v);
    }
    assert_eq!(r::sanitize(f32::NAN), f32::NEG_INFINITY);
    assert_eq!(r::sanitize(f32::INFINITY), f32::MAX);
    assert_eq!(r::key(r::sanitize(-0.0)), r::key(0.0));
}

// ---------------------------------------------------------------- definitions

fn params_strategy() -> impl Strategy<Value = SamplingParams> {
    (
        prop_oneof![Just(0.0f32), 0.05f32..3.0],
        prop_oneof![Just(0u32), 1u32..8, 1u32..300],
        prop_oneof![Just(1.0f32), 0.01f32..1.0],
        prop_oneof![Just(0.0f32), 0.0f32..0.5],
        any::<u64>(),
    )
        .prop_map(|(t, k, p, m, seed)| SamplingParams {
            temperature: t,
            top_k: k,
            top_p: p,
            min_p: m,
            seed,
            ..Default::default()
        })
}

fn row_strategy(max_vocab: usize) -> impl Strategy<Value = Vec<f32>> {
    (1..=max_vocab, any::<u64>(), 0u8..4).prop_map(|(n, seed, kind)| {
        let mut g = fixed_rng(seed);
        let mut row = match kind {
            0 => lm_like(&mut g, n, 2.0),
            1 => tied(&mut g, n, 6),
            2 => lm_like(&mut g, n, 0.2),
            _ => lm_like(&mut g, n, 8.0),
        };
        // sprinkle specials
        if n > 3 && g.random_bool(0.3) {
            row[g.random_range(0..n)] = f32::NAN;
            row[g.random_range(0..n)] = f32::NEG_INFINITY;
        }
        row
    })
}

/// The textbook f64 kept set, or None when a float boundary makes it ambiguous (the
/// fixed-point definition may then legitimately differ).
fn textbook_if_clear(row: &[f32], p: &SamplingParams) -> Option<Vec<f64>> {
    let base = r::textbook_probabilities(row, p);
    let nudge = |dp: f32, dm: f32| {
        r::textbook_probabilities(
            row,
            &SamplingParams {
                top_p: (p.top_p * dp).min(1.0),
                min_p: p.min_p * dm,
                ..*p
            },
        )
    };
    let support = |v: &[f64]| v.iter().map(|&x| x > 0.0).collect::<Vec<_>>();
    let s = support(&base);
    for (dp, dm) in [
        (1.0 + 1e-5, 1.0),
        (1.0 - 1e-5, 1.0),
        (1.0, 1.0 + 1e-5),
        (1.0, 1.0 - 1e-5),
    ] {
        if (p.top_p < 1.0 || dm != 1.0) && support(&nudge(dp, dm)) != s {
            return None;
        }
    }
    Some(base)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn plan_matches_the_textbook_recipe(row in row_strategy(600), p in params_strategy()) {
        let plan = r::plan_row(&row, Some(&p));
        let Some(want) = textbook_if_clear(&row, &p) else { return Ok(()); };
        let got = plan.probabilities();
        for i in 0..row.len() {
            // same support (tokens with a mass below 2^-40 of the max count as outside)
            let tiny = want[i] > 0.0 && want[i] < 1e-11;
            if !tiny {
                prop_assert_eq!(got[i] > 0.0, want[i] > 0.0, "token {}: {} vs {}", i, got[i], want[i]);
            }
            prop_assert!((got[i] - want[i]).abs() < 1e-6, "token {}: {} vs {}", i, got[i], want[i]);
        }
    }

    #[test]
    fn sampled_token_is_in_the_allowed_set(row in row_strategy(700), p in params_strategy(), word in any::<u32>()) {
        let plan = r::plan_row(&row, Some(&p));
        let tok = plan.pick(word);
        prop_assert!(plan.possible()[tok], "token {} not allowed", tok);
        prop_assert!(plan.kept[tok]);
        // allowed set sizes: top-k keeps >= k tokens (ties), never cuts the max
        let kept = plan.kept.iter().filter(|&&k| k).count();
        prop_assert!(kept >= 1);
        let x = r::sanitized(&row);
        let xmax = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        for i in 0..row.len() {
            if x[i] == xmax { prop_assert!(plan.kept[i], "a maximal token was cut"); }
        }
        if p.temperature > 0.0 && p.top_k > 0 && (p.top_k as usize) < row.len() && p.top_p == 1.0 && p.min_p == 0.0 && xmax > f32::NEG_INFINITY {
            prop_assert!(kept >= p.top_k as usize);
            // exactly the tokens >= the k-th largest
            let mut s = x.clone();
            s.sort_by(|a, b| b.total_cmp(a));
            let vk = s[p.top_k as usize - 1];
            for i in 0..row.len() { prop_assert_eq!(plan.kept[i], x[i] >= vk); }
        }
    }

    #[test]
    fn radix_model_select_matches_sort_definition(row in row_strategy(3000), k in 1u64..400, pp in 0.01f32..1.0, t in 0.1f32..4.0) {
        let x = r::sanitized(&row);
        let keys: Vec<u32> = x.iter().map(|&v| r::key(v)).collect();
        let n = keys.len() as u64;
        prop_assume!(k < n);
        let mut sorted = keys.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let tau_k = sorted[k as usize - 1];
        // the select may stop at a bin's lower edge: compare the kept sets {key >= tau}
        let set = |t: u32| keys.iter().map(|&x| x >= t).collect::<Vec<_>>();
        let sel_k = radix::select(&keys, 0, k, None);
        prop_assert_eq!(set(sel_k), set(tau_k));
        // MASS with the k floor, like the kernel
        let xmax = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        prop_assume!(xmax > f32::NEG_INFINITY);
        let q: Vec<u64> = x.iter().map(|&v| r::fixed_mass(r::relative_prob(v, xmax, t))).collect();
        let got = radix::select(&keys, sel_k, 1, Some((&q, r::top_p_fixed(pp))));
        let p = SamplingParams { temperature: t, top_k: k as u32, top_p: pp, ..Default::default() };
        let plan = r::plan_row(&row, Some(&p));
        prop_assert_eq!(set(got.max(sel_k)), set(plan.tau));
    }

    #[test]
    fn radix_model_of_the_kernel_samples_like_the_reference(
        row in row_strategy(9000), p in params_strategy(), word in any::<u32>(), split in 1usize..70
    ) {
        let want = r::sample_row(&row, Some(&p), word);
        prop_assert_eq!(radix::sample_row(&row, Some(&p), word, split), want);
    }

    #[test]
    fn half_precision_rows_plan_like_their_f32_values(row in row_strategy(300), p in params_strategy(), word in any::<u32>()) {
        let h: Vec<f16> = row.iter().map(|&v| f16::from_f32(v)).collect();
        let hf: Vec<f32> = h.iter().map(|v| v.to_f32()).collect();
        prop_assert_eq!(r::sample_row(&h, Some(&p), word), r::sample_row(&hf, Some(&p), word));
        let b: Vec<bf16> = row.iter().map(|&v| bf16::from_f32(v)).collect();
        let bf: Vec<f32> = b.iter().map(|v| v.to_f32()).collect();
        prop_assert_eq!(r::sample_row(&b, Some(&p), word), r::sample_row(&bf, Some(&p), word));
    }
}

#[test]
fn radix_model_handles_large_rows_and_heavy_ties() {
    let mut g = fixed_rng(11);
    for &(n, split) in &[(128_256usize, 63usize), (200_003, 3)] {
        for kind in 0..3 {
            let row = match kind {
                0 => lm_like(&mut g, n, 2.0),
                1 => tied(&mut g, n, 3),
                _ => vec![1.5f32; n],
            };
            for p in [
                SamplingParams {
                    top_k: 50,
                    top_p: 0.9,
                    temperature: 0.7,
                    ..Default::default()
                },
                SamplingParams {
                    top_p: 0.9,
                    min_p: 0.01,
                    ..Default::default()
                },
                SamplingParams {
                    top_k: 1000,
                    top_p: 0.5,
                    ..Default::default()
                },
            ] {
                let plan = r::plan_row(&row, Some(&p));
                for w in [u32::MAX, g.random()] {
                    assert_eq!(
                        radix::sample_row(&row, Some(&p), w, split) as usize,
                        plan.pick(w),
                        "n {n} split {split} kind {kind} {p:?} word {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn greedy_ties_go_to_the_lowest_index_and_nan_is_minus_infinity() {
    let row = [1.0f32, f32::NAN, 3.0, 3.0, -1.0];
    assert_eq!(r::sample_row(&row, None, 0), 2);
    assert_eq!(r::sample_row(&row, Some(&SamplingParams::greedy()), 0), 2);
    assert_eq!(r::sample_row(&[f32::NAN; 4], None, 0), 0);
    assert_eq!(
        r::sample_row(
            &[f32::NEG_INFINITY, f32::NAN],
            Some(&SamplingParams::default()),
            123
        ),
        0
    );
    // +inf reads as f32::MAX: the largest, taken
    assert_eq!(
        r::sample_row(&[1.0f32, f32::INFINITY, f32::MAX], None, 0),
        1
    );
    // NaN tokens are never sampled
    let mut g = fixed_rng(5);
    let mut row = lm_like(&mut g, 64, 0.5);
    for i in (0..64).step_by(3) {
        row[i] = f32::NAN;
    }
    let p = SamplingParams::default();
    for s in 0..2000 {
        let t = r::sample_row(&row, Some(&p), uniform_word(&p, s)) as usize;
        assert!(!row[t].is_nan());
    }
}

#[test]
fn ties_at_the_top_k_boundary_are_all_kept() {
    let row = [5.0f32, 4.0, 3.0, 3.0, 3.0, 1.0];
    let p = SamplingParams {
        top_k: 3,
        ..Default::default()
    };
    let plan = r::plan_row(&row, Some(&p));
    assert_eq!(plan.kept, vec![true, true, true, true, true, false]);
    // top-p: the boundary group is kept whole
    let row = [2.0f32, 1.0, 1.0, 1.0, 0.0];
    let p = SamplingParams {
        top_p: 0.5,
        ..Default::default()
    };
    let plan = r::plan_row(&row, Some(&p));
    assert_eq!(plan.kept, vec![true, true, true, true, false]);
}

#[test]
fn pick_by_binary_search_agrees_with_the_definition() {
    let mut g = fixed_rng(3);
    let row = lm_like(&mut g, 5000, 1.5);
    let plan = r::plan_row(
        &row,
        Some(&SamplingParams {
            top_p: 0.95,
            ..Default::default()
        }),
    );
    let c = cdf(&plan);
    for _ in 0..300 {
        let w: u32 = g.random();
        assert_eq!(plan.pick(w), pick_cdf(&c, w));
    }
}

// ---------------------------------------------------------------- statistics

/// Draws `n` tokens of the row with the reference sampler (steps 0..n of one request) and
/// returns the chi-square statistic against the plan's distribution and its critical value.
fn cpu_chi_square(row: &[f32], p: &SamplingParams, n: u32, against: Option<&[f64]>) -> (f64, f64) {
    let plan = r::plan_row(row, Some(p));
    let c = cdf(&plan);
    let mut counts = vec![0u64; row.len()];
    for s in 0..n {
        counts[pick_cdf(&c, uniform_word(p, s as i32))] += 1;
    }
    let probs = against.map_or_else(|| plan.probabilities(), |a| a.to_vec());
    let (stat, df) = chi_square(&counts, &probs, n as u64);
    (stat, chi2_critical_001(df.max(1)))
}

#[test]
fn chi_square_critical_values_match_the_table() {
    // exact chi-square 0.999 quantiles (standard tables)
    for (df, exact) in [
        (5, 20.515),
        (10, 29.588),
        (20, 45.315),
        (50, 86.661),
        (100, 149.449),
    ] {
        let c = chi2_critical_001(df);
        assert!((c - exact).abs() / exact < 0.015, "df {df}: {c} vs {exact}");
    }
}

#[test]
fn seeded_draws_follow_the_reference_distribution_chi_square() {
    // 20k draws per case, significance 0.001 (critical value by Wilson-Hilferty, see
    // common::chi2_critical_001). Fixed seeds: the outcome is deterministic.
    let mut g = fixed_rng(2024);
    let row = lm_like(&mut g, 1000, 1.0);
    let cases = [
        SamplingParams {
            seed: 1,
            ..Default::default()
        },
        SamplingParams {
            temperature: 0.7,
            top_k: 50,
            seed: 2,
            ..Default::default()
        },
        SamplingParams {
            top_p: 0.9,
            seed: 3,
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.2,
            top_k: 40,
            top_p: 0.8,
            seed: 4,
            ..Default::default()
        },
        SamplingParams {
            min_p: 0.05,
            seed: 5,
            ..Default::default()
        },
    ];
    for p in cases {
        let (stat, crit) = cpu_chi_square(&row, &p, 20_000, None);
        assert!(stat < crit, "{p:?}: chi2 {stat:.1} >= {crit:.1}");
    }
}

#[test]
fn chi_square_rejects_the_wrong_distribution() {
    // The same draws judged against the untruncated softmax (top-p ignored) or another
    // temperature must fail: the test has power.
    let mut g = fixed_rng(2024);
    let row = lm_like(&mut g, 1000, 1.0);
    let p = SamplingParams {
        top_p: 0.9,
        seed: 3,
        ..Default::default()
    };
    let full = r::plan_row(&row, Some(&SamplingParams { top_p: 1.0, ..p })).probabilities();
    let (stat, crit) = cpu_chi_square(&row, &p, 20_000, Some(&full));
    assert!(stat > crit, "untruncated: chi2 {stat:.1} <= {crit:.1}");
    let hot = r::plan_row(
        &row,
        Some(&SamplingParams {
            temperature: 1.15,
            ..p
        }),
    )
    .probabilities();
    let (stat, crit) = cpu_chi_square(&row, &p, 20_000, Some(&hot));
    assert!(stat > crit, "temperature 1.15: chi2 {stat:.1} <= {crit:.1}");
}

// ---------------------------------------------------------------- processors

#[test]
fn penalties_follow_hf_and_openai_semantics() {
    let mut row = vec![2.0f32, -2.0, 1.0, 0.0, 4.0];
    let p = SamplingParams {
        repetition_penalty: 2.0,
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        ..Default::default()
    };
    // token 0 three times, token 1 once, token 3 twice, 9 and -1 skipped
    r::process_row(&mut row, &p, &[0, 1, 0, 3, 9, -1, 0, 3], &[], 0, &[]);
    assert_eq!(row[0], 2.0 / 2.0 - (0.5 + 0.25 * 3.0));
    assert_eq!(row[1], -2.0 * 2.0 - (0.5 + 0.25));
    assert_eq!(row[2], 1.0); // not in the history
    assert_eq!(row[3], 0.0 * 2.0 - (0.5 + 0.5));
    assert_eq!(row[4], 4.0);
}

#[test]
fn bans_and_min_length_mask_with_minus_infinity() {
    let p = SamplingParams {
        min_new_tokens: 3,
        ..Default::default()
    };
    let mut row = vec![1.0f32; 6];
    r::process_row(&mut row, &p, &[], &[4, -1, 40], 2, &[5, 0]);
    assert_eq!(
        row,
        vec![
            f32::NEG_INFINITY,
            1.0,
            1.0,
            1.0,
            f32::NEG_INFINITY,
            f32::NEG_INFINITY
        ]
    );
    let mut row = vec![1.0f32; 6];
    r::process_row(&mut row, &p, &[], &[], 3, &[5, 0]); // long enough: untouched
    assert_eq!(row, vec![1.0; 6]);
}

proptest! {
    #[test]
    fn penalties_touch_only_history_tokens_and_off_is_identity(
        row in row_strategy(200), hist in proptest::collection::vec(-3i32..220, 0..60),
        rep in 0.5f32..2.0, pres in -1.0f32..1.0, freq in -1.0f32..1.0,
    ) {
        let p = SamplingParams { repetition_penalty: rep, presence_penalty: pres, frequency_penalty: freq, ..Default::default() };
        let mut got: Vec<bf16> = row.iter().map(|&v| bf16::from_f32(v)).collect();
        let orig = got.clone();
        r::process_row(&mut got, &p, &hist, &[], 0, &[]);
        for i in 0..row.len() {
            let c = hist.iter().filter(|&&t| t == i as i32).count();
            if c == 0 {
                prop_assert_eq!(got[i].to_bits(), orig[i].to_bits());
            } else {
                let x = orig[i].to_f32();
                let y = if x > 0.0 { x / rep } else { x * rep } - (pres + freq * c as f32);
                let want = bf16::from_f32(y).to_f32();
                let g = got[i].to_f32();
                prop_assert!(g == want || (g - want).abs() <= 2.0 * bf16::EPS as f32 * want.abs().max(1e-30) || (g.is_nan() && want.is_nan()),
                    "token {}: {} vs {}", i, g, want);
            }
        }
        let off = SamplingParams::default();
        let mut same = orig.clone();
        r::process_row(&mut same, &off, &hist, &[], 0, &[]);
        prop_assert_eq!(same.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), orig.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    }
}

#[test]
fn process_logits_batches_rows_with_their_own_inputs() {
    let vocab = 4;
    let mut logits = vec![1.0f32; 2 * vocab];
    let params = [
        SamplingParams {
            frequency_penalty: 1.0,
            ..Default::default()
        },
        SamplingParams {
            min_new_tokens: 1,
            ..Default::default()
        },
    ];
    let hist = [1, 1, 9, 2, 2, 2];
    let lens = [2, 3];
    let banned = [3, -1, -1, -1];
    let inputs = HostProcessInputs {
        history: Some((&hist, &lens, 3)),
        banned: Some((&banned, 2)),
        lengths: Some(&[0, 0]),
        end_ids: Some(&[0]),
    };
    r::process_logits(&mut logits, vocab, &params, &inputs);
    let ni = f32::NEG_INFINITY;
    assert_eq!(&logits[..4], &[1.0, -1.0, 1.0, ni]);
    // row 1: no penalties configured; end id 0 masked (length 0 < 1)
    assert_eq!(&logits[4..], &[ni, 1.0, 1.0, 1.0]);
}

// ---------------------------------------------------------------- bookkeeping

#[test]
fn decode_update_finishes_on_end_ids_and_length_and_pads_after() {
    let params = [
        SamplingParams::default(),
        SamplingParams {
            max_new_tokens: 2,
            ..Default::default()
        },
        SamplingParams::default(),
        SamplingParams::default(),
    ];
    // row 0 emits an end id, row 1 reaches max_new_tokens, row 2 is already finished,
    // row 3 goes on
    let mut finished = vec![0u8, 0, 1, 0];
    let mut lengths = vec![0i32, 1, 5, 0];
    let mut hist = vec![-1i32; 4 * 2];
    let mut tokens = vec![7, 8, 9, 4];
    let all = r::decode_update(
        &mut tokens,
        &mut finished,
        &mut lengths,
        Some(&params),
        &[2, 7],
        -5,
        Some((&mut hist, 2)),
    );
    assert!(!all);
    assert_eq!(tokens, vec![7, 8, -5, 4]);
    assert_eq!(finished, vec![1, 1, 1, 0]);
    assert_eq!(lengths, vec![1, 2, 5, 1]);
    assert_eq!(hist, vec![7, -1, -1, 8, -1, -1, 4, -1]);
    let mut tokens = vec![1, 1, 1, 2];
    let all = r::decode_update(
        &mut tokens,
        &mut finished,
        &mut lengths,
        Some(&params),
        &[2, 7],
        -5,
        Some((&mut hist, 2)),
    );
    assert!(all);
    assert_eq!(tokens, vec![-5, -5, -5, 2]);
    assert_eq!(lengths, vec![1, 2, 5, 2]);
    assert_eq!(hist, vec![7, -1, -1, 8, -1, -1, 4, 2]);
}

// ---------------------------------------------------------------- parameters

#[test]
fn parameters_out_of_range_are_errors_naming_row_and_parameter() {
    let ok = SamplingParams::default();
    let cases: Vec<(SamplingParams, &str)> = vec![
        (
            SamplingParams {
                temperature: -0.1,
                ..ok
            },
            "temperature",
        ),
        (
            SamplingParams {
                temperature: f32::NAN,
                ..ok
            },
            "temperature",
        ),
        (
            SamplingParams {
                temperature: f32::INFINITY,
                ..ok
            },
            "temperature",
        ),
        (SamplingParams { top_p: 0.0, ..ok }, "top_p"),
        (
            SamplingParams {
                top_p: 1.0001,
                ..ok
            },
            "top_p",
        ),
        (
            SamplingParams {
                top_p: f32::NAN,
                ..ok
            },
            "top_p",
        ),
        (SamplingParams { min_p: -0.01, ..ok }, "min_p"),
        (SamplingParams { min_p: 1.5, ..ok }, "min_p"),
        (
            SamplingParams {
                repetition_penalty: 0.0,
                ..ok
            },
            "repetition_penalty",
        ),
        (
            SamplingParams {
                presence_penalty: f32::NAN,
                ..ok
            },
            "presence_penalty",
        ),
        (
            SamplingParams {
                frequency_penalty: f32::INFINITY,
                ..ok
            },
            "frequency_penalty",
        ),
    ];
    for (p, name) in cases {
        match p.validate(4) {
            Err(Error::Param { row: 4, param, .. }) => assert_eq!(param, name),
            other => panic!("{name}: expected a Param error, got {other:?}"),
        }
    }
    // in range: temperature 0 (greedy), top_p 1, top_k 0 (off), huge top_k, min_p 1
    for p in [
        SamplingParams {
            temperature: 0.0,
            ..ok
        },
        SamplingParams {
            top_k: u32::MAX,
            min_p: 1.0,
            ..ok
        },
        SamplingParams {
            top_p: f32::MIN_POSITIVE,
            ..ok
        },
    ] {
        assert!(p.validate(0).is_ok(), "{p:?}");
    }
    let e = SamplingParams { top_p: 2.0, ..ok }.validate(1).unwrap_err();
    assert!(
        e.to_string().contains("top_p") && e.to_string().contains("row 1"),
        "{e}"
    );
}

#[test]
fn temperature_zero_is_greedy_whatever_the_filters() {
    let mut g = fixed_rng(8);
    let row = lm_like(&mut g, 300, 1.0);
    let am = r::sample_row(&row, None, 0);
    let p = SamplingParams {
        temperature: 0.0,
        top_k: 5,
        top_p: 0.3,
        min_p: 0.2,
        ..Default::default()
    };
    for w in [0u32, 12345, u32::MAX] {
        assert_eq!(r::sample_row(&row, Some(&p), w), am);
    }
}

#[test]
fn words_pack_the_record_layout() {
    let p = SamplingParams {
        temperature: 0.5,
        top_k: u32::MAX,
        top_p: 0.25,
        min_p: 0.125,
        repetition_penalty: 1.5,
        presence_penalty: -1.0,
        frequency_penalty: 2.0,
        min_new_tokens: 3,
        max_new_tokens: 9,
        seed: 0x0102_0304_0506_0708,
        request_id: 0x1112_1314_1516_1718,
    };
    let w = p.to_words();
    assert_eq!(f32::from_bits(w[0] as u32), 0.5);
    assert_eq!(w[1], i32::MAX); // saturated: >= vocab means off
    assert_eq!(f32::from_bits(w[2] as u32), 0.25);
    assert_eq!(w[7], 3);
    assert_eq!(w[8], 9);
    assert_eq!(w[9] as u32, 0x0506_0708);
    assert_eq!(w[10] as u32, 0x0102_0304);
    assert_eq!(w[11] as u32, 0x1516_1718);
    assert_eq!(w[12] as u32, 0x1112_1314);
    assert_eq!(&w[13..], &[0, 0, 0]);
}
