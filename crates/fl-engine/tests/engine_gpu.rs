//! The engine on the GPU with the tiny preset's dummy weights: what must hold whatever the
//! weights are. (Agreement with transformers is checked by bench/scripts/check_transformers.py
//! on the GPU machine.)
//! - a ragged batch prefilled together gives each prompt the logits it gets alone;
//! - the decode path (one token over the cache) agrees with the prefill path (the prompt
//!   extended by that token);
//! - the CUDA-graph decode gives the same tokens as eager launches;
//! - bad requests are errors naming the argument, before any work.
//!
//! Each in f16 (and bf16 where cheap) within 1e-2, and in f32 within 1e-4: there the two
//! sides differ only by the order of f32 sums (cuBLASLt may pick another algorithm for
//! another token count, the attention splits differ), ~1e-6 per layer on this tiny model.

use fl_engine::dtype::RunDType;
use fl_engine::engine::{Engine, Request, StepNeeds};
use fl_engine::model::{DEFAULT_FUSE_NORM_MAX_M, DEFAULT_GEMV_MAX_M};
use fl_engine::presets::preset;
use fl_engine::weights::WeightSource;
use fl_kernels::gemv_dense;
use fl_kernels::testing::{gpu_or_skip, rel_l2};
use fl_kernels::{bf16, f16};

mod common;
use common::{serial, worst};
use fl_kernels::testing::to_f64;
use fl_sampling::SamplingParams;

fn engine<T: RunDType>() -> Engine<T> {
    let cfg = preset("tiny").expect("tiny preset");
    Engine::<T>::load(0, cfg, WeightSource::Dummy { seed: 3 }, None).expect("load tiny")
}

fn req(prompts: Vec<Vec<u32>>, new: usize) -> Request {
    Request {
        prompts,
        max_new_tokens: new,
        sampling: vec![SamplingParams::greedy()],
        end_ids: vec![],
        ignore_eos: true,
        forced: None,
    }
}

fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + seed * 101 + 5) % 256)
        .collect()
}

/// (prefill logits per prompt, logits per decode step per prompt, tokens).
type Logits = (Vec<Vec<f32>>, Vec<Vec<Vec<f32>>>, Vec<Vec<u32>>);

fn run<T: RunDType>(e: &mut Engine<T>, r: &Request) -> Logits {
    let vocab = e.model.cfg.vocab_size;
    let mut pre = Vec::new();
    let mut steps = Vec::new();
    let out = e
        .generate(
            r,
            StepNeeds {
                tokens: true,
                logits: true,
            },
            &mut |s| {
                let rows: Vec<Vec<f32>> = s
                    .logits
                    .unwrap()
                    .chunks(vocab)
                    .map(|c| c.to_vec())
                    .collect();
                if s.index == 0 {
                    pre = rows;
                } else {
                    steps.push(rows);
                }
                true
            },
        )
        .expect("generate");
    (pre, steps, out.tokens)
}

/// Bound on the rel L2 between two runs of the same logits in dtype `T`.
fn tol<T: RunDType>() -> f64 {
    if <T as fl_kernels::DType>::NAME == "f32" {
        1e-4
    } else {
        1e-2
    }
}

fn ragged_batch_matches_single<T: RunDType>() {
    let mut e = engine::<T>();
    let lens = [1usize, 7, 33, 129, 2];
    let prompts: Vec<Vec<u32>> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| prompt(n, i as u32))
        .collect();
    let (batched, bsteps, _) = run(&mut e, &req(prompts.clone(), 4));
    for (b, p) in prompts.iter().enumerate() {
        let (alone, asteps, _) = run(&mut e, &req(vec![p.clone()], 4));
        let err = rel_l2(&batched[b], &to_f64(&alone[0]));
        assert!(
            err < tol::<T>(),
            "prompt {b} (len {}): batched vs alone rel L2 {err}",
            p.len()
        );
        for s in 0..asteps.len() {
            let err = rel_l2(&bsteps[s][b], &to_f64(&asteps[s][0]));
            assert!(err < tol::<T>(), "prompt {b} step {s}: rel L2 {err}");
        }
    }
}

#[test]
fn ragged_batch_matches_single_f16() {
    if gpu_or_skip("ragged_batch_matches_single_f16").is_none() {
        return;
    }
    let _serial = serial();
    ragged_batch_matches_single::<f16>();
}

#[test]
fn ragged_batch_matches_single_bf16() {
    if gpu_or_skip("ragged_batch_matches_single_bf16").is_none() {
        return;
    }
    let _serial = serial();
    ragged_batch_matches_single::<bf16>();
}

#[test]
fn ragged_batch_matches_single_f32() {
    if gpu_or_skip("ragged_batch_matches_single_f32").is_none() {
        return;
    }
    let _serial = serial();
    ragged_batch_matches_single::<f32>();
}

#[test]
fn decode_path_matches_prefill_path() {
    if gpu_or_skip("decode_path_matches_prefill_path").is_none() {
        return;
    }
    let _serial = serial();
    decode_path_matches_prefill::<f16>();
}

#[test]
fn decode_path_matches_prefill_path_f32() {
    if gpu_or_skip("decode_path_matches_prefill_path_f32").is_none() {
        return;
    }
    let _serial = serial();
    decode_path_matches_prefill::<f32>();
}

fn decode_path_matches_prefill<T: RunDType>() {
    let mut e = engine::<T>();
    let p = prompt(20, 9);
    let forced: Vec<u32> = prompt(6, 4);
    let mut r = req(vec![p.clone()], 7);
    r.forced = Some(vec![forced.clone()]);
    let (_, steps, _) = run(&mut e, &r);
    assert_eq!(steps.len(), 6);
    for s in 0..6 {
        // Prefill of prompt + forced[..=s] ends with the logits decode step s+1 produced.
        let mut longer = p.clone();
        longer.extend_from_slice(&forced[..=s]);
        let (pre, _, _) = run(&mut e, &req(vec![longer], 2));
        let err = rel_l2(&steps[s][0], &to_f64(&pre[0]));
        assert!(err < tol::<T>(), "step {s}: decode vs prefill rel L2 {err}");
    }
}

#[test]
fn graph_and_eager_decode_agree() {
    if gpu_or_skip("graph_and_eager_decode_agree").is_none() {
        return;
    }
    let _serial = serial();
    graph_and_eager_agree::<f16>();
}

#[test]
fn graph_and_eager_decode_agree_f32() {
    if gpu_or_skip("graph_and_eager_decode_agree_f32").is_none() {
        return;
    }
    let _serial = serial();
    graph_and_eager_agree::<f32>();
}

fn graph_and_eager_agree<T: RunDType>() {
    let mut e = engine::<T>();
    let prompts = vec![prompt(5, 1), prompt(40, 2), prompt(1, 3)];
    e.use_graph = true;
    let g = e
        .generate(
            &req(prompts.clone(), 40),
            StepNeeds {
                tokens: true,
                logits: false,
            },
            &mut |_| true,
        )
        .expect("graph run");
    assert!(g.graph, "the decode step was not captured");
    e.use_graph = false;
    let n = e
        .generate(
            &req(prompts, 40),
            StepNeeds {
                tokens: true,
                logits: false,
            },
            &mut |_| true,
        )
        .expect("eager run");
    assert!(!n.graph);
    assert_eq!(g.tokens, n.tokens);
    assert!(g.tokens.iter().all(|t| t.len() == 40));
}

#[test]
fn bad_requests_are_errors_naming_the_argument() {
    if gpu_or_skip("bad_requests_are_errors_naming_the_argument").is_none() {
        return;
    }
    let _serial = serial();
    let mut e = engine::<f16>();
    let none = StepNeeds::default();
    let msg = |r: Request, e: &mut Engine<f16>| {
        e.generate(&r, none, &mut |_| true)
            .err()
            .map(|x| x.to_string())
            .unwrap_or_default()
    };
    assert!(msg(req(vec![vec![]], 4), &mut e).contains("--prompt"));
    assert!(msg(req(vec![], 4), &mut e).contains("--prompt"));
    assert!(msg(req(vec![vec![300]], 4), &mut e).contains("vocab_size"));
    // 250 + 10 > 256 positions of context.
    assert!(msg(req(vec![prompt(250, 1)], 10), &mut e).contains("context"));
    // Still usable afterwards.
    e.generate(&req(vec![prompt(3, 1)], 3), none, &mut |_| true)
        .expect("valid request");
}

#[test]
fn dense_layer_paths_agree() {
    // Every way a dense f16/bf16 layer runs, against cuBLASLt with the separate norm and
    // rope_append kernels (gemv_max_m = 0, also the f32 path): with
    // (gemv_max_m, fuse_norm_max_m) = (4, 1) (the default), (4, 0) and (16, 16) these prompts'
    // passes take the dense GEMV with
    // - separate norms and rope_append: prefill of 3 tokens at (4, 1) and (4, 0);
    // - separate norms and RoPE in the QKV GEMV: decode of 2 and 3 at (4, 1), of 1 at (4, 0);
    // - fused norms and rope_append: prefill of 1 token at (4, 1), of 3 at (16, 16);
    // - fused norms and RoPE in the QKV GEMV: decode of 1 at (4, 1), of 2 and 3 at (16, 16).
    // The same prefill and decode logits within rounding (rstd and the products are summed
    // in another order, the fused RoPE rotates the f32 products instead of their rounding).
    if gpu_or_skip("dense_layer_paths_agree").is_none() {
        return;
    }
    let _serial = serial();
    fn one<T: RunDType>() {
        let mut e = engine::<T>();
        assert_eq!(e.model.gemv_max_m, DEFAULT_GEMV_MAX_M);
        assert_eq!(e.model.fuse_norm_max_m, DEFAULT_FUSE_NORM_MAX_M);
        for prompts in [
            vec![prompt(1, 4)],
            vec![prompt(2, 1), prompt(1, 2)],
            vec![prompt(5, 1), prompt(17, 2), prompt(1, 3)],
        ] {
            // Teacher-forced: random tiny models have near-tied logits, and in bf16 one
            // rounding apart is enough for greedy decoding to take another token (seen on the
            // H100), after which the two runs compare different sequences.
            let mut r = req(prompts.clone(), 8);
            r.forced = Some(
                (0..prompts.len() as u32)
                    .map(|b| prompt(8, 7 + b))
                    .collect(),
            );
            let all = |(pre, mut steps, _): Logits| {
                steps.insert(0, pre);
                steps
            };
            e.model.gemv_max_m = 0;
            let reference = all(run(&mut e, &r));
            for (gemv_max_m, fuse_norm_max_m) in [(4, 1), (4, 0), (16, 16)] {
                e.model.gemv_max_m = gemv_max_m;
                e.model.fuse_norm_max_m = fuse_norm_max_m;
                let err = worst(&all(run(&mut e, &r)), &reference);
                assert!(
                    err < tol::<T>(),
                    "{}: gemv_max_m {gemv_max_m}, fuse_norm_max_m {fuse_norm_max_m}, {} prompts: \
                     worst rel L2 against cuBLASLt {err}",
                    <T as fl_kernels::DType>::NAME,
                    prompts.len()
                );
            }
        }
    }
    one::<f16>();
    one::<bf16>();
}

#[test]
fn gemv_max_m_beyond_the_dtype_is_an_error() {
    // f32 has no dense GEMV (gemv_max_m 0); f16 runs it up to gemv_dense::MAX_M tokens. A
    // setting above is refused naming the option, before any launch; the engine stays usable.
    if gpu_or_skip("gemv_max_m_beyond_the_dtype_is_an_error").is_none() {
        return;
    }
    let _serial = serial();
    fn one<T: RunDType>(default: usize, max: usize) {
        let mut e = engine::<T>();
        assert_eq!(e.model.gemv_max_m, default);
        let r = req(vec![prompt(3, 1)], 3);
        e.model.gemv_max_m = max + 1;
        let err = e
            .generate(&r, StepNeeds::default(), &mut |_| true)
            .err()
            .map(|x| x.to_string())
            .unwrap_or_default();
        assert!(err.contains("gemv_max_m"), "{err}");
        e.model.gemv_max_m = max;
        e.generate(&r, StepNeeds::default(), &mut |_| true)
            .expect("gemv_max_m at its limit");
    }
    one::<f32>(0, 0);
    one::<f16>(DEFAULT_GEMV_MAX_M, gemv_dense::MAX_M);
}
