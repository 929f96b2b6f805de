//! The `FL_SAMPLING_NO_SPLIT=1` escape hatch (never split a row over several blocks, for GPUs
//! whose SMs are shared between processes): the sampler still matches `reference` bit for
//! bit at the shapes that split by default (few rows, long vocabularies). The variable is
//! read once per device at the first launch, so this file is its own test binary with a
//! single test that sets it before any launch; `tests/sampling.rs` covers the default.

mod common;

use common::{lm_like, tied};
use fl_kernels::testing::{gpu_or_skip, rng};
use fl_kernels::{bf16, DeviceTensor};
use fl_sampling::reference as r;
use fl_sampling::{greedy, sample, DeviceParams, SampleOptions, SampleWorkspace, SamplingParams};
use rand::Rng;

#[test]
fn no_split_matches_reference_where_rows_would_split() {
    // Before the first launch in this process (read once per device).
    std::env::set_var("FL_SAMPLING_NO_SPLIT", "1");
    let Some(gpu) = gpu_or_skip("no_split_matches_reference_where_rows_would_split") else {
        return;
    };
    let s = gpu.stream();
    let mut g = rng("sampling_no_split");
    for &(batch, vocab) in &[
        (1usize, 128_256usize),
        (3, 32_000),
        (16, 128_256),
        (2, 200_003),
    ] {
        let mut x = Vec::with_capacity(batch * vocab);
        for b in 0..batch {
            x.extend(if b % 2 == 0 {
                lm_like(&mut g, vocab, 2.0)
            } else {
                tied(&mut g, vocab, 5)
            });
        }
        let params: Vec<SamplingParams> = (0..batch)
            .map(|i| {
                let base = SamplingParams {
                    temperature: g.random_range(0.3..1.5),
                    seed: g.random(),
                    request_id: g.random(),
                    ..Default::default()
                };
                match i % 4 {
                    0 => SamplingParams { top_k: 50, ..base },
                    1 => SamplingParams { top_p: 0.9, ..base },
                    2 => SamplingParams {
                        min_p: 0.05,
                        ..base
                    },
                    _ => base,
                }
            })
            .collect();
        let steps: Vec<i32> = (0..batch).map(|_| g.random_range(0..5000)).collect();
        for logits in [
            x.clone(),
            x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(),
        ] {
            let dl = DeviceTensor::from_host(s, &logits, &[batch, vocab]).unwrap();
            let dst = DeviceTensor::from_host(s, &steps, &[batch]).unwrap();
            let opts = SampleOptions {
                steps: Some(&dst),
                finished: None,
                pad_id: -1,
            };
            let dp = DeviceParams::new(s, &params).unwrap();
            let mut ws = SampleWorkspace::new(s, batch, vocab).unwrap();
            let mut tokens = DeviceTensor::filled(s, &[batch], i32::MIN).unwrap();
            sample(s, &dl, &dp, &opts, &mut tokens, &mut ws).unwrap();
            let want = r::sample(&logits, vocab, Some(&params), Some(&steps), None, -1);
            assert_eq!(tokens.to_host(s).unwrap(), want, "sample {batch}x{vocab}");
            let plain = SampleOptions::default();
            greedy(s, &dl, &plain, &mut tokens, &mut ws).unwrap();
            let want = r::sample(&logits, vocab, None, None, None, 0);
            assert_eq!(tokens.to_host(s).unwrap(), want, "greedy {batch}x{vocab}");
        }
    }
    // bf16 logits as such (the kernels' 16-bit load path).
    let vocab = 128_256;
    let xb: Vec<bf16> = lm_like(&mut g, vocab, 2.0)
        .iter()
        .map(|&v| bf16::from_f32(v))
        .collect();
    let dl = DeviceTensor::from_host(s, &xb, &[1, vocab]).unwrap();
    let mut ws = SampleWorkspace::new(s, 1, vocab).unwrap();
    let mut tokens = DeviceTensor::filled(s, &[1], i32::MIN).unwrap();
    greedy(s, &dl, &SampleOptions::default(), &mut tokens, &mut ws).unwrap();
    assert_eq!(
        tokens.to_host(s).unwrap(),
        r::sample(&xb, vocab, None, None, None, 0),
        "greedy bf16 1x{vocab}"
    );
}
