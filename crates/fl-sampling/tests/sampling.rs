//! GPU tests of the sampler, the processors and the bookkeeping against `reference`
//! (bit-for-bit: same tokens, same processed logits), chi-square goodness of fit of GPU
//! draws, batch invariance, errors. Each test skips without a GPU (FL_REQUIRE_GPU=1 makes
//! that a failure).

#![allow(clippy::needless_range_loop)]

mod common;

use common::{chi2_critical_001, chi_square, lm_like, tied};
use fl_kernels::testing::{gpu_or_skip, rng};
use fl_kernels::{bf16, f16, DeviceTensor, FloatDType, Gpu};
use fl_sampling::reference::{self as r, HostProcessInputs};
use fl_sampling::{
    decode_update, greedy, philox_words, process_logits, sample, DecodeState, DeviceParams, Error,
    History, PenaltyWorkspace, Processors, SampleOptions, SampleWorkspace, Sampler, SamplerConfig,
    SamplingParams,
};
use proptest::prelude::*;
use rand::Rng;

/// Runs the sampler (or greedy when `params` is None) on host data; tokens are poisoned
/// before the launch.
fn gpu_sample<T: FloatDType>(
    gpu: &Gpu,
    logits: &[T],
    vocab: usize,
    params: Option<&[SamplingParams]>,
    steps: Option<&[i32]>,
    finished: Option<&[u8]>,
    pad_id: i32,
) -> Vec<i32> {
    let s = gpu.stream();
    let batch = logits.len() / vocab;
    let dl = DeviceTensor::from_host(s, logits, &[batch, vocab]).unwrap();
    let dst = steps.map(|v| DeviceTensor::from_host(s, v, &[batch]).unwrap());
    let dfin = finished.map(|v| DeviceTensor::from_host(s, v, &[batch]).unwrap());
    let opts = SampleOptions {
        steps: dst.as_ref(),
        finished: dfin.as_ref(),
        pad_id,
    };
    let mut tokens = DeviceTensor::filled(s, &[batch], i32::MIN).unwrap();
    let mut ws = SampleWorkspace::new(s, batch, vocab).unwrap();
    match params {
        Some(p) => {
            let dp = DeviceParams::new(s, p).unwrap();
            sample(s, &dl, &dp, &opts, &mut tokens, &mut ws).unwrap();
        }
        None => greedy(s, &dl, &opts, &mut tokens, &mut ws).unwrap(),
    }
    tokens.to_host(s).unwrap()
}

fn cast<T: FloatDType>(v: &[f32]) -> Vec<T> {
    v.iter().map(|&x| T::from_f32(x)).collect()
}

/// Random logits for `batch` rows with some ties, NaN, infinities.
fn batch_logits(g: &mut impl Rng, batch: usize, vocab: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(batch * vocab);
    for b in 0..batch {
        let mut row = match b % 4 {
            0 | 3 => lm_like(g, vocab, 2.0),
            1 => tied(g, vocab, 5),
            _ => lm_like(g, vocab, 0.3),
        };
        if vocab > 8 && g.random_bool(0.3) {
            row[g.random_range(0..vocab)] = f32::NAN;
            row[g.random_range(0..vocab)] = f32::NEG_INFINITY;
        }
        out.extend(row);
    }
    out
}

/// A mix of every kind of row.
fn mixed_params(g: &mut impl Rng, batch: usize) -> Vec<SamplingParams> {
    (0..batch)
        .map(|i| {
            let base = SamplingParams {
                temperature: g.random_range(0.2..1.8),
                seed: g.random(),
                request_id: g.random(),
                ..Default::default()
            };
            match i % 8 {
                0 => SamplingParams::greedy(),
                1 => base,
                2 => SamplingParams { top_k: 50, ..base },
                3 => SamplingParams { top_p: 0.9, ..base },
                4 => SamplingParams {
                    top_k: 40,
                    top_p: 0.8,
                    ..base
                },
                5 => SamplingParams {
                    min_p: 0.05,
                    ..base
                },
                6 => SamplingParams {
                    top_k: g.random_range(1..1500),
                    top_p: g.random_range(0.05..1.0),
                    min_p: 0.01,
                    ..base
                },
                _ => SamplingParams { top_k: 1, ..base },
            }
        })
        .collect()
}

fn check_sample<T: FloatDType>(gpu: &Gpu, batch: usize, vocab: usize, g: &mut impl Rng) {
    let logits: Vec<T> = cast(&batch_logits(g, batch, vocab));
    let params = mixed_params(g, batch);
    let steps: Vec<i32> = (0..batch).map(|_| g.random_range(0..5000)).collect();
    let got = gpu_sample(gpu, &logits, vocab, Some(&params), Some(&steps), None, -1);
    let want = r::sample(&logits, vocab, Some(&params), Some(&steps), None, -1);
    for row in 0..batch {
        let plan = r::plan_row(&logits[row * vocab..(row + 1) * vocab], Some(&params[row]));
        let t = got[row];
        assert!(
            t >= 0 && (t as usize) < vocab && plan.possible()[t as usize],
            "{} batch {batch} vocab {vocab} row {row}: token {t} not allowed ({:?})",
            T::NAME,
            params[row]
        );
        assert_eq!(
            t,
            want[row],
            "{} batch {batch} vocab {vocab} row {row}: GPU {t} vs CPU {} ({:?})",
            T::NAME,
            want[row],
            params[row]
        );
    }
}

#[test]
fn philox_words_match_the_cpu_stream() {
    let Some(gpu) = gpu_or_skip("philox_words_match_the_cpu_stream") else {
        return;
    };
    let s = gpu.stream();
    let mut g = rng("philox_words");
    let params: Vec<SamplingParams> = (0..37)
        .map(|_| SamplingParams {
            seed: g.random(),
            request_id: g.random(),
            ..Default::default()
        })
        .collect();
    let steps: Vec<i32> = (0..37).map(|_| g.random()).collect();
    let dp = DeviceParams::new(s, &params).unwrap();
    let ds = DeviceTensor::from_host(s, &steps, &[37]).unwrap();
    let mut out = DeviceTensor::filled(s, &[37, 4], 0x5a5a_5a5a).unwrap();
    philox_words(s, &dp, Some(&ds), &mut out).unwrap();
    let got = out.to_host(s).unwrap();
    for i in 0..37 {
        let want = fl_sampling::philox::row_words(&params[i], steps[i]);
        let g4: Vec<u32> = got[i * 4..i * 4 + 4].iter().map(|&v| v as u32).collect();
        assert_eq!(g4, want.to_vec(), "row {i}");
    }
    // no steps: step 0
    philox_words(s, &dp, None, &mut out).unwrap();
    let got = out.to_host(s).unwrap();
    assert_eq!(
        got[0] as u32,
        fl_sampling::philox::uniform_word(&params[0], 0)
    );
}

#[test]
fn greedy_matches_reference_all_dtypes_odd_sizes() {
    let Some(gpu) = gpu_or_skip("greedy_matches_reference_all_dtypes_odd_sizes") else {
        return;
    };
    let mut g = rng("greedy");
    for &(batch, vocab) in &[
        (1, 1),
        (3, 7),
        (17, 255),
        (2, 2049),
        (5, 4097),
        (1, 12_289),
        (130, 1000),
        (3, 32_000),
        (1, 128_256),
        (2, 200_003),
    ] {
        let x = batch_logits(&mut g, batch, vocab);
        let f: Vec<f32> = x.clone();
        assert_eq!(
            gpu_sample(&gpu, &f, vocab, None, None, None, 0),
            r::sample(&f, vocab, None, None, None, 0),
            "f32 {batch}x{vocab}"
        );
        let h: Vec<f16> = cast(&x);
        assert_eq!(
            gpu_sample(&gpu, &h, vocab, None, None, None, 0),
            r::sample(&h, vocab, None, None, None, 0),
            "f16 {batch}x{vocab}"
        );
        let b: Vec<bf16> = cast(&x);
        assert_eq!(
            gpu_sample(&gpu, &b, vocab, None, None, None, 0),
            r::sample(&b, vocab, None, None, None, 0),
            "bf16 {batch}x{vocab}"
        );
    }
}

#[test]
fn sample_matches_reference_bit_for_bit() {
    let Some(gpu) = gpu_or_skip("sample_matches_reference_bit_for_bit") else {
        return;
    };
    let mut g = rng("sample");
    // shapes chosen to hit every launch configuration: one block per row (batch > 128 or
    // vocab <= 2048), rows split with the chunk in shared memory, rows split without it
    for &(batch, vocab) in &[
        (1, 1),
        (8, 100),
        (16, 2048),
        (3, 2049),
        (1, 12_288),
        (2, 12_289),
        (64, 32_000),
        (129, 3000),
        (1, 128_256),
        (16, 128_256),
        (64, 128_256),
        (2, 200_003),
    ] {
        check_sample::<f32>(&gpu, batch, vocab, &mut g);
    }
    for &(batch, vocab) in &[(8, 777), (4, 32_000), (1, 128_256), (130, 5000)] {
        check_sample::<f16>(&gpu, batch, vocab, &mut g);
        check_sample::<bf16>(&gpu, batch, vocab, &mut g);
    }
}

#[test]
fn a_request_gets_the_same_tokens_whatever_the_batch() {
    let Some(gpu) = gpu_or_skip("a_request_gets_the_same_tokens_whatever_the_batch") else {
        return;
    };
    let mut g = rng("batch_invariance");
    let vocab = 128_256;
    let row = lm_like(&mut g, vocab, 1.0);
    let me = SamplingParams {
        temperature: 0.9,
        top_k: 200,
        top_p: 0.95,
        seed: 42,
        request_id: 7,
        ..Default::default()
    };
    for step in [0i32, 1, 17] {
        let want = r::sample(&row, vocab, Some(&[me]), Some(&[step]), None, 0)[0];
        // alone, then at several positions of larger batches (different launch splits)
        for &(batch, pos) in &[(1usize, 0usize), (7, 3), (64, 63), (150, 77)] {
            // the other rows: rotations of this one (cheap to make, all different)
            let mut logits = Vec::with_capacity(batch * vocab);
            for b in 0..batch {
                let k = (b * 7919 + 13) % vocab;
                logits.extend_from_slice(&row[k..]);
                logits.extend_from_slice(&row[..k]);
            }
            logits[pos * vocab..(pos + 1) * vocab].copy_from_slice(&row);
            let mut params = mixed_params(&mut g, batch);
            params[pos] = me;
            let mut steps: Vec<i32> = (0..batch).map(|_| g.random_range(0..100)).collect();
            steps[pos] = step;
            let got = gpu_sample(&gpu, &logits, vocab, Some(&params), Some(&steps), None, 0);
            assert_eq!(got[pos], want, "step {step}, batch {batch}, position {pos}");
        }
    }
}

#[test]
fn finished_rows_emit_pad_and_dead_rows_give_token_zero() {
    let Some(gpu) = gpu_or_skip("finished_rows_emit_pad_and_dead_rows_give_token_zero") else {
        return;
    };
    let vocab = 5000;
    let mut g = rng("finished");
    let mut logits = batch_logits(&mut g, 4, vocab);
    for v in &mut logits[2 * vocab..3 * vocab] {
        *v = f32::NAN; // row 2: nothing finite
    }
    let params = vec![
        SamplingParams {
            top_p: 0.5,
            seed: 3,
            ..Default::default()
        };
        4
    ];
    let fin = [0u8, 1, 0, 1];
    let got = gpu_sample(&gpu, &logits, vocab, Some(&params), None, Some(&fin), -7);
    assert_eq!(got[1], -7);
    assert_eq!(got[3], -7);
    assert_eq!(got[2], 0);
    assert_eq!(
        got,
        r::sample(&logits, vocab, Some(&params), None, Some(&fin), -7)
    );
}

#[test]
fn gpu_draws_follow_the_reference_distribution_chi_square() {
    // 20k GPU draws per case (distinct Philox steps), chi-square against the reference
    // distribution at significance 0.001 (Wilson-Hilferty critical value), and each draw
    // equal to the CPU's for the same uniform. Fixed seeds.
    let Some(gpu) = gpu_or_skip("gpu_draws_follow_the_reference_distribution_chi_square") else {
        return;
    };
    let s = gpu.stream();
    let mut g = common::fixed_rng(77);
    let cases = [
        SamplingParams {
            temperature: 0.8,
            top_k: 50,
            seed: 11,
            ..Default::default()
        },
        SamplingParams {
            top_p: 0.9,
            seed: 12,
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.1,
            top_k: 40,
            top_p: 0.8,
            seed: 13,
            ..Default::default()
        },
        SamplingParams {
            min_p: 0.05,
            seed: 14,
            ..Default::default()
        },
        SamplingParams {
            seed: 15,
            ..Default::default()
        },
    ];
    // (batch per launch, vocab): one block per row; split rows in shared memory; split rows
    // read from global memory
    for &(batch, vocab) in &[(2000usize, 1000usize), (4, 128_256), (128, 32_000)] {
        let row = lm_like(&mut g, vocab, 1.0);
        let logits: Vec<f32> = row.iter().cycle().take(batch * vocab).cloned().collect();
        let dl = DeviceTensor::from_host(s, &logits, &[batch, vocab]).unwrap();
        let mut ws = SampleWorkspace::new(s, batch, vocab).unwrap();
        for p in cases {
            let n = 20_000usize;
            let plan = r::plan_row(&row, Some(&p));
            let c = common::cdf(&plan);
            let dp = DeviceParams::new(s, &vec![p; batch]).unwrap();
            let mut counts = vec![0u64; vocab];
            let mut mismatches = 0;
            let mut tokens = DeviceTensor::filled(s, &[batch], -1).unwrap();
            let mut done = 0;
            while done < n {
                let steps: Vec<i32> = (0..batch as i32).map(|i| done as i32 + i).collect();
                let ds = DeviceTensor::from_host(s, &steps, &[batch]).unwrap();
                let opts = SampleOptions {
                    steps: Some(&ds),
                    ..Default::default()
                };
                sample(s, &dl, &dp, &opts, &mut tokens, &mut ws).unwrap();
                for (i, &t) in tokens.to_host(s).unwrap().iter().enumerate() {
                    if done + i >= n {
                        break;
                    }
                    counts[t as usize] += 1;
                    let want =
                        common::pick_cdf(&c, fl_sampling::philox::uniform_word(&p, steps[i]));
                    mismatches += usize::from(t as usize != want);
                }
                done += batch;
            }
            assert_eq!(
                mismatches, 0,
                "{batch}x{vocab} {p:?}: draws differ from the CPU's"
            );
            let (stat, df) = chi_square(&counts, &plan.probabilities(), n as u64);
            let crit = chi2_critical_001(df.max(1));
            assert!(
                stat < crit,
                "{batch}x{vocab} {p:?}: chi2 {stat:.1} >= {crit:.1} (df {df})"
            );
        }
    }
}

// ---------------------------------------------------------------- processors

fn check_process<T: FloatDType>(gpu: &Gpu, batch: usize, vocab: usize, g: &mut impl Rng) {
    let s = gpu.stream();
    let logits: Vec<T> = cast(&batch_logits(g, batch, vocab));
    let params: Vec<SamplingParams> = (0..batch)
        .map(|i| SamplingParams {
            repetition_penalty: if i % 3 == 0 {
                1.0
            } else {
                g.random_range(0.5..2.0)
            },
            presence_penalty: if i % 2 == 0 {
                0.0
            } else {
                g.random_range(-1.0..1.0)
            },
            frequency_penalty: if i % 4 == 1 {
                0.0
            } else {
                g.random_range(-0.5..0.5)
            },
            min_new_tokens: g.random_range(0..4),
            ..Default::default()
        })
        .collect();
    let max_history = 1 + g.random_range(0..300);
    // histories with repeats (a small pool of ids), out-of-range ids and lengths past the end
    let hist: Vec<i32> = (0..batch * max_history)
        .map(|_| match g.random_range(0..10) {
            0 => -1,
            1 => vocab as i32 + 3,
            _ => g.random_range(0..(vocab.min(50) as i32)),
        })
        .collect();
    let lens: Vec<i32> = (0..batch)
        .map(|_| g.random_range(-2..(max_history as i32 + 5)))
        .collect();
    let max_banned = 3;
    let banned: Vec<i32> = (0..batch * max_banned)
        .map(|_| g.random_range(-1..vocab as i32))
        .collect();
    let lengths: Vec<i32> = (0..batch).map(|_| g.random_range(0..5)).collect();
    let end_ids = vec![0, (vocab as i32) - 1, 9_999_999];

    let mut want = logits.clone();
    let host = HostProcessInputs {
        history: Some((&hist, &lens, max_history)),
        banned: Some((&banned, max_banned)),
        lengths: Some(&lengths),
        end_ids: Some(&end_ids),
    };
    r::process_logits(&mut want, vocab, &params, &host);

    let mut dl = DeviceTensor::from_host(s, &logits, &[batch, vocab]).unwrap();
    let dp = DeviceParams::new(s, &params).unwrap();
    let dh = DeviceTensor::from_host(s, &hist, &[batch, max_history]).unwrap();
    let dlens = DeviceTensor::from_host(s, &lens, &[batch]).unwrap();
    let db = DeviceTensor::from_host(s, &banned, &[batch, max_banned]).unwrap();
    let dlen = DeviceTensor::from_host(s, &lengths, &[batch]).unwrap();
    let de = DeviceTensor::from_host(s, &end_ids, &[end_ids.len()]).unwrap();
    let mut ws = PenaltyWorkspace::new(s, vocab).unwrap();
    let inputs = Processors {
        history: Some(History {
            tokens: &dh,
            lens: &dlens,
        }),
        banned: Some(&db),
        end_ids: Some(&de),
        lengths: Some(&dlen),
    };
    process_logits(s, &mut dl, &dp, &inputs, Some(&mut ws)).unwrap();
    let got = dl.to_host(s).unwrap();
    let bits = |v: &[T]| v.iter().map(|x| x.to_f32().to_bits()).collect::<Vec<_>>();
    let (gb, wb) = (bits(&got), bits(&want));
    for i in 0..gb.len() {
        let (a, b) = (f32::from_bits(gb[i]), f32::from_bits(wb[i]));
        assert!(
            gb[i] == wb[i] || (a.is_nan() && b.is_nan()),
            "{} {batch}x{vocab} at {i}: {a} vs {b}",
            T::NAME
        );
    }
    // the workspace is left zeroed: a second call applies the same again
    r::process_logits(&mut want, vocab, &params, &host);
    process_logits(s, &mut dl, &dp, &inputs, Some(&mut ws)).unwrap();
    let got = dl.to_host(s).unwrap();
    let (gb, wb) = (bits(&got), bits(&want));
    for i in 0..gb.len() {
        let (a, b) = (f32::from_bits(gb[i]), f32::from_bits(wb[i]));
        assert!(
            gb[i] == wb[i] || (a.is_nan() && b.is_nan()),
            "second call {} at {i}: {a} vs {b}",
            T::NAME
        );
    }
}

#[test]
fn processors_match_reference_bit_for_bit() {
    let Some(gpu) = gpu_or_skip("processors_match_reference_bit_for_bit") else {
        return;
    };
    let mut g = rng("processors");
    for &(batch, vocab) in &[(1, 7), (5, 1000), (40, 333), (3, 32_000), (70, 50)] {
        check_process::<f32>(&gpu, batch, vocab, &mut g);
        check_process::<f16>(&gpu, batch, vocab, &mut g);
        check_process::<bf16>(&gpu, batch, vocab, &mut g);
    }
}

// ---------------------------------------------------------------- bookkeeping and the loop

#[test]
fn decode_update_matches_reference_over_steps() {
    let Some(gpu) = gpu_or_skip("decode_update_matches_reference_over_steps") else {
        return;
    };
    let s = gpu.stream();
    let mut g = rng("decode_update");
    let batch = 1500; // more rows than threads in the block
    let max_history = 6;
    let params: Vec<SamplingParams> = (0..batch)
        .map(|i| SamplingParams {
            max_new_tokens: (i % 9) as u32,
            ..Default::default()
        })
        .collect();
    let dp = DeviceParams::new(s, &params).unwrap();
    let end_ids = [3, 5];
    let de = DeviceTensor::from_host(s, &end_ids, &[2]).unwrap();
    let mut state = DecodeState::new(s, batch, max_history).unwrap();
    let (mut fin, mut len, mut hist) = (
        vec![0u8; batch],
        vec![0i32; batch],
        vec![-1i32; batch * max_history],
    );
    for step in 0..12 {
        let toks: Vec<i32> = (0..batch).map(|_| g.random_range(0..40)).collect();
        let mut dt = DeviceTensor::from_host(s, &toks, &[batch]).unwrap();
        decode_update(s, &mut dt, &mut state, Some(&dp), &de, -2).unwrap();
        let mut want = toks.clone();
        let all = r::decode_update(
            &mut want,
            &mut fin,
            &mut len,
            Some(&params),
            &end_ids,
            -2,
            Some((&mut hist, max_history)),
        );
        assert_eq!(dt.to_host(s).unwrap(), want, "tokens, step {step}");
        assert_eq!(
            state.finished().to_host(s).unwrap(),
            fin,
            "finished, step {step}"
        );
        assert_eq!(
            state.lengths().to_host(s).unwrap(),
            len,
            "lengths, step {step}"
        );
        assert_eq!(
            state.history().unwrap().to_host(s).unwrap(),
            hist,
            "history, step {step}"
        );
        assert_eq!(
            state.all_finished(s).unwrap(),
            all,
            "all_finished, step {step}"
        );
    }
}

#[test]
fn sampler_loop_matches_a_cpu_simulation() {
    let Some(gpu) = gpu_or_skip("sampler_loop_matches_a_cpu_simulation") else {
        return;
    };
    let s = gpu.stream();
    let mut g = rng("sampler_loop");
    let (batch, vocab) = (6, 3000);
    let params: Vec<SamplingParams> = (0..batch)
        .map(|i| SamplingParams {
            temperature: if i == 0 { 0.0 } else { 0.9 },
            top_k: 100,
            top_p: 0.9,
            repetition_penalty: 1.3,
            frequency_penalty: 0.2,
            min_new_tokens: 2,
            max_new_tokens: 5 + i as u32,
            seed: 1000 + i as u64,
            request_id: i as u64,
            ..Default::default()
        })
        .collect();
    let cfg = SamplerConfig {
        end_ids: vec![1, 2],
        pad_id: 0,
        max_history: 16,
    };
    let mut sampler = Sampler::new(s, &params, vocab, &cfg).unwrap();
    let (mut fin, mut len, mut hist) =
        (vec![0u8; batch], vec![0i32; batch], vec![-1i32; batch * 16]);
    let mut tokens = DeviceTensor::filled(s, &[batch], -1).unwrap();
    for step in 0..12 {
        let mut x = batch_logits(&mut g, batch, vocab);
        for row in 0..batch {
            x[row * vocab + 1] = 3.0; // end ids likely, masked under min_new_tokens
        }
        let mut dl = DeviceTensor::from_host(s, &x, &[batch, vocab]).unwrap();
        sampler.step(s, &mut dl, &mut tokens).unwrap();
        // CPU: processors over the generated history, sample with step = length, update
        let host = HostProcessInputs {
            history: Some((&hist, &len, 16)),
            banned: None,
            lengths: Some(&len),
            end_ids: Some(&cfg.end_ids),
        };
        r::process_logits(&mut x, vocab, &params, &host);
        let mut want = r::sample(&x, vocab, Some(&params), Some(&len), Some(&fin), 0);
        let all = r::decode_update(
            &mut want,
            &mut fin,
            &mut len,
            Some(&params),
            &cfg.end_ids,
            0,
            Some((&mut hist, 16)),
        );
        assert_eq!(tokens.to_host(s).unwrap(), want, "step {step}");
        assert_eq!(sampler.all_finished(s).unwrap(), all, "step {step}");
        if step < 2 {
            assert!(
                want.iter().all(|&t| t != 1 && t != 2),
                "end id under min_new_tokens"
            );
        }
    }
    assert!(
        sampler.all_finished(s).unwrap(),
        "every row hits max_new_tokens by step 11"
    );
}

// ---------------------------------------------------------------- errors

#[test]
fn errors_name_the_argument() {
    let Some(gpu) = gpu_or_skip("errors_name_the_argument") else {
        return;
    };
    let s = gpu.stream();
    let logits = DeviceTensor::<f32>::zeros(s, &[4, 100]).unwrap();
    let params = DeviceParams::new(s, &[SamplingParams::default(); 4]).unwrap();
    let mut ws = SampleWorkspace::new(s, 4, 100).unwrap();
    let mut tokens = DeviceTensor::<i32>::zeros(s, &[4]).unwrap();
    let opts = SampleOptions::default();
    let mut bad_tokens = DeviceTensor::<i32>::zeros(s, &[5]).unwrap();
    assert!(matches!(
        sample(s, &logits, &params, &opts, &mut bad_tokens, &mut ws),
        Err(Error::Shape { arg: "tokens", .. })
    ));
    let p3 = DeviceParams::new(s, &[SamplingParams::default(); 3]).unwrap();
    assert!(matches!(
        sample(s, &logits, &p3, &opts, &mut tokens, &mut ws),
        Err(Error::Shape { arg: "params", .. })
    ));
    let flat = DeviceTensor::<f32>::zeros(s, &[400]).unwrap();
    assert!(matches!(
        greedy(s, &flat, &opts, &mut tokens, &mut ws),
        Err(Error::Shape { arg: "logits", .. })
    ));
    let steps = DeviceTensor::<i32>::zeros(s, &[3]).unwrap();
    let o2 = SampleOptions {
        steps: Some(&steps),
        ..Default::default()
    };
    assert!(matches!(
        sample(s, &logits, &params, &o2, &mut tokens, &mut ws),
        Err(Error::Shape { arg: "steps", .. })
    ));
    // a workspace made for a smaller batch of a large vocabulary
    let big = DeviceTensor::<f32>::zeros(s, &[8, 50_000]).unwrap();
    let p8 = DeviceParams::new(s, &[SamplingParams::default(); 8]).unwrap();
    let mut small = SampleWorkspace::new(s, 2, 50_000).unwrap();
    let mut t8 = DeviceTensor::<i32>::zeros(s, &[8]).unwrap();
    assert!(matches!(
        sample(s, &big, &p8, &opts, &mut t8, &mut small),
        Err(Error::InvalidArgument {
            arg: "workspace",
            ..
        })
    ));
    // invalid parameters never reach the device
    match DeviceParams::new(
        s,
        &[
            SamplingParams::default(),
            SamplingParams {
                top_p: 1.5,
                ..Default::default()
            },
        ],
    ) {
        Err(Error::Param {
            row: 1,
            param: "top_p",
            ..
        }) => {}
        other => panic!("expected a top_p error on row 1, got {other:?}"),
    }
    assert!(matches!(
        SampleWorkspace::new(s, 1, 0),
        Err(Error::InvalidArgument { arg: "vocab", .. })
    ));
    // penalties without a workspace
    let mut l2 = DeviceTensor::<f32>::zeros(s, &[4, 100]).unwrap();
    let h = DeviceTensor::<i32>::zeros(s, &[4, 3]).unwrap();
    let hl = DeviceTensor::<i32>::zeros(s, &[4]).unwrap();
    let inputs = Processors {
        history: Some(History {
            tokens: &h,
            lens: &hl,
        }),
        ..Default::default()
    };
    assert!(matches!(
        process_logits(s, &mut l2, &params, &inputs, None),
        Err(Error::InvalidArgument {
            arg: "workspace",
            ..
        })
    ));
    let hb = DeviceTensor::<i32>::zeros(s, &[3, 3]).unwrap();
    let inputs = Processors {
        history: Some(History {
            tokens: &hb,
            lens: &hl,
        }),
        ..Default::default()
    };
    let mut pw = PenaltyWorkspace::new(s, 100).unwrap();
    assert!(matches!(
        process_logits(s, &mut l2, &params, &inputs, Some(&mut pw)),
        Err(Error::Shape {
            arg: "history.tokens",
            ..
        })
    ));
    // a sampler with penalties needs a history
    let pen = [SamplingParams {
        repetition_penalty: 1.2,
        ..Default::default()
    }];
    assert!(matches!(
        Sampler::new(s, &pen, 100, &SamplerConfig::default()),
        Err(Error::InvalidArgument {
            arg: "config.max_history",
            ..
        })
    ));
    // empty batches launch nothing
    let e = DeviceTensor::<f32>::zeros(s, &[0, 100]).unwrap();
    let mut et = DeviceTensor::<i32>::zeros(s, &[0]).unwrap();
    greedy(s, &e, &opts, &mut et, &mut ws).unwrap();
}

#[test]
fn sample_gpu_proptest() {
    let Some(gpu) = gpu_or_skip("sample_gpu_proptest") else {
        return;
    };
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 32,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &(
                1usize..=40,
                fl_kernels::testing::strategies::length(140_000),
                any::<u64>(),
                0u8..3,
            ),
            |(batch, vocab, seed, dt)| {
                use rand::SeedableRng;
                let mut g = rand::rngs::StdRng::seed_from_u64(seed);
                let batch = if vocab > 20_000 { batch.min(6) } else { batch };
                match dt {
                    0 => check_sample::<f32>(&gpu, batch, vocab, &mut g),
                    1 => check_sample::<f16>(&gpu, batch, vocab, &mut g),
                    _ => check_sample::<bf16>(&gpu, batch, vocab, &mut g),
                }
                Ok(())
            },
        )
        .unwrap();
}
