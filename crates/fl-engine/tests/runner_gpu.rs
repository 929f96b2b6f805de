//! The continuous-batching runner on the GPU (tiny preset, dummy weights): requests chunked
//! under a small token budget, sharing prompt prefixes and preempted by a small KV pool give
//! each request the greedy tokens it gets alone from the static engine (f32: token-exact); a
//! seeded sampled request gives the same tokens alone and among others.

use std::collections::HashMap;

use fl_engine::dtype::RunDType;
use fl_engine::engine::{Engine, Request as StaticRequest, StepNeeds};
use fl_engine::presets::preset;
use fl_engine::runner::{RequestOptions, Runner, RunnerConfig};
use fl_engine::scheduler::{Event, FinishReason, Request, RequestParams};
use fl_engine::weights::WeightSource;
use fl_kernels::testing::{gpu_or_skip, rel_l2, to_f64};
use fl_kernels::{bf16, f16};
use fl_sampling::SamplingParams;

#[allow(dead_code)] // this binary uses `serial` only
mod common;
use common::serial;

fn engine() -> Engine<f32> {
    engine_of::<f32>()
}

fn engine_of<T: RunDType>() -> Engine<T> {
    let cfg = preset("tiny").expect("tiny preset");
    Engine::<T>::load(0, cfg, WeightSource::Dummy { seed: 7 }, None).expect("load tiny")
}

fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 29 + seed * 131 + 3) % 256)
        .collect()
}

fn static_greedy(e: &mut Engine<f32>, p: &[u32], new: usize) -> Vec<u32> {
    let r = StaticRequest {
        prompts: vec![p.to_vec()],
        max_new_tokens: new,
        sampling: vec![SamplingParams::greedy()],
        end_ids: vec![],
        ignore_eos: true,
        forced: None,
    };
    let needs = StepNeeds {
        logits: false,
        tokens: true,
    };
    e.generate(&r, needs, &mut |_| true)
        .expect("static generate")
        .tokens[0]
        .clone()
}

fn request(
    id: u64,
    prompt: Vec<u32>,
    new: usize,
    sampling: SamplingParams,
    seed: u64,
) -> Request<SamplingParams> {
    let mut params = RequestParams::<SamplingParams>::new(new);
    params.ignore_eos = true;
    params.seed = seed;
    params.sampling = sampling;
    Request { id, prompt, params }
}

/// A runner for a handful of short requests: 32-token steps, 256 positions, 64 blocks of
/// KV, 8 sequences at most.
fn small_runner() -> RunnerConfig {
    RunnerConfig {
        max_batched_tokens: 32,
        max_model_len: Some(256),
        num_blocks: Some(64),
        max_num_seqs: 8,
        ..Default::default()
    }
}

#[test]
fn runner_matches_static_engine_f32() {
    if gpu_or_skip("runner_matches_static_engine_f32").is_none() {
        return;
    }
    let _serial = serial();
    let mut e = engine();
    // Prompts 0-2 share a 40-token prefix (prefix cache), 3 is long (chunked), 4-5 short.
    let shared = prompt(40, 1);
    let mut prompts = vec![];
    for (i, tail) in [3usize, 17, 1].iter().enumerate() {
        let mut p = shared.clone();
        p.extend(prompt(*tail, 10 + i as u32));
        prompts.push(p);
    }
    prompts.push(prompt(150, 4));
    prompts.push(prompt(1, 5));
    prompts.push(prompt(9, 6));
    let news = [12usize, 20, 7, 16, 25, 9];
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .zip(news)
        .map(|(p, n)| static_greedy(&mut e, p, n))
        .collect();
    let cfg = RunnerConfig {
        block_size: 16,
        max_batched_tokens: 48,
        max_num_seqs: 4,
        max_model_len: Some(256),
        enable_prefix_cache: true,
        // The longest request needs 11 blocks: 12 for four running requests forces preemption.
        num_blocks: Some(12),
        ..Default::default()
    };
    let mut r = Runner::new(&mut e, &cfg).expect("runner");
    for (i, (p, &n)) in prompts.iter().zip(&news).enumerate() {
        r.add_request(request(i as u64, p.clone(), n, SamplingParams::greedy(), 0))
            .expect("add");
    }
    let (got, events) = r.run_to_completion().expect("run");
    for (i, w) in want.iter().enumerate() {
        assert_eq!(
            got.get(&(i as u64)),
            Some(w),
            "request {i}: runner vs static tokens"
        );
    }
    let finished: HashMap<u64, FinishReason> = events
        .iter()
        .filter_map(|e| match *e {
            Event::Finished { id, reason, .. } => Some((id, reason)),
            _ => None,
        })
        .collect();
    assert_eq!(finished.len(), prompts.len());
    assert!(finished.values().all(|&r| r == FinishReason::Length));
    let stats = r.scheduler().kv_stats();
    eprintln!(
        "runner: {} preemptions, prefix-cache hit tokens {}",
        r.scheduler().num_preemptions(),
        stats.prefix_hit_tokens
    );
    assert!(
        stats.prefix_hit_tokens > 0,
        "the shared prefix was never reused"
    );
}

#[test]
fn sampled_request_ignores_its_batch_mates() {
    if gpu_or_skip("sampled_request_ignores_its_batch_mates").is_none() {
        return;
    }
    let _serial = serial();
    let sp = SamplingParams {
        temperature: 0.9,
        top_k: 40,
        top_p: 0.95,
        ..Default::default()
    };
    let p = prompt(23, 8);
    let cfg = small_runner();
    let mut e = engine();
    let mut alone = Runner::new(&mut e, &cfg).expect("runner");
    alone
        .add_request(request(5, p.clone(), 24, sp, 1234))
        .unwrap();
    let (a, _) = alone.run_to_completion().unwrap();
    drop(alone);
    let mut crowd = Runner::new(&mut e, &cfg).expect("runner");
    for i in 0..6u64 {
        let mate = request(
            100 + i,
            prompt(10 + 7 * i as usize, 20 + i as u32),
            30,
            sp,
            i,
        );
        crowd.add_request(mate).unwrap();
    }
    crowd.add_request(request(5, p, 24, sp, 1234)).unwrap();
    let (b, _) = crowd.run_to_completion().unwrap();
    assert_eq!(a.get(&5), b.get(&5), "same seed, different batch mates");
    assert_eq!(a[&5].len(), 24);
}

/// Teacher-forced logits of each prompt alone from the static engine: `[step][vocab]`.
fn static_forced_logits<T: RunDType>(
    e: &mut Engine<T>,
    p: &[u32],
    forced: &[u32],
) -> Vec<Vec<f32>> {
    let r = StaticRequest {
        prompts: vec![p.to_vec()],
        max_new_tokens: forced.len() + 1,
        sampling: vec![SamplingParams::greedy()],
        end_ids: vec![],
        ignore_eos: true,
        forced: Some(vec![forced.to_vec()]),
    };
    let needs = StepNeeds {
        logits: true,
        tokens: true,
    };
    let mut rows = vec![];
    e.generate(&r, needs, &mut |s| {
        rows.push(s.logits.expect("logits asked").to_vec());
        true
    })
    .expect("static generate");
    rows
}

/// Every request's logits (prefill and each teacher-forced decode step) from the runner,
/// with requests chunked, sharing a prefix and decoding together in CUDA-graph buckets of
/// 1..8 rows (f16 / bf16: the QKV GEMV's fused RoPE + paged append), match the static
/// engine's for the prompt alone: f32 within 1e-4, f16 within 1e-2, bf16 within 2e-2.
fn forced_logits_match<T: RunDType>(tol: f64) {
    let _serial = serial();
    let mut e = engine_of::<T>();
    let shared = prompt(33, 2);
    let mut prompts: Vec<Vec<u32>> = (0..7u32)
        .map(|i| {
            let mut p = shared.clone();
            p.extend(prompt(1 + 13 * i as usize % 29, 40 + i));
            p
        })
        .collect();
    prompts.push(prompt(1, 9));
    let forced: Vec<Vec<u32>> = (0..prompts.len() as u32)
        .map(|i| prompt(6 + 3 * i as usize, 60 + i))
        .collect();
    let want: Vec<Vec<Vec<f32>>> = prompts
        .iter()
        .zip(&forced)
        .map(|(p, f)| static_forced_logits(&mut e, p, f))
        .collect();
    let cfg = RunnerConfig {
        max_batched_tokens: 40,
        max_num_seqs: 8,
        max_model_len: Some(256),
        num_blocks: Some(96),
        ..Default::default()
    };
    let mut r = Runner::new(&mut e, &cfg).expect("runner");
    for (i, (p, f)) in prompts.iter().zip(&forced).enumerate() {
        let opts = RequestOptions {
            forced: f.clone(),
            logits: true,
        };
        r.add_request_with(
            request(
                i as u64,
                p.clone(),
                f.len() + 1,
                SamplingParams::greedy(),
                0,
            ),
            opts,
        )
        .expect("add");
    }
    let mut graphs = 0;
    let mut got_tokens: HashMap<u64, Vec<u32>> = HashMap::new();
    while r.has_unfinished() {
        for ev in r.step().expect("step") {
            if let Event::Token { id, token } = ev {
                got_tokens.entry(id).or_default().push(token);
            }
        }
        graphs += r.last_step().graph as usize;
    }
    assert!(graphs > 0, "no decode step replayed a CUDA graph");
    for (i, w) in want.iter().enumerate() {
        let got = r.take_logits(i as u64).expect("kept logits");
        assert_eq!(got.len(), w.len(), "request {i}: logits rows");
        for (s, (g, w)) in got.iter().zip(w).enumerate() {
            let err = rel_l2(g, &to_f64(w));
            assert!(
                err < tol,
                "{}: request {i} step {s}: relL2 {err:.2e} >= {tol:.0e}",
                T::NAME
            );
        }
        // The forced ids are what the request generated (its last token is sampled).
        let toks = &got_tokens[&(i as u64)];
        assert_eq!(&toks[..forced[i].len()], forced[i].as_slice());
    }
}

#[test]
fn forced_logits_match_static_f32() {
    if gpu_or_skip("forced_logits_match_static_f32").is_none() {
        return;
    }
    forced_logits_match::<f32>(1e-4);
}

#[test]
fn forced_logits_match_static_f16() {
    if gpu_or_skip("forced_logits_match_static_f16").is_none() {
        return;
    }
    forced_logits_match::<f16>(1e-2);
}

#[test]
fn forced_logits_match_static_bf16() {
    if gpu_or_skip("forced_logits_match_static_bf16").is_none() {
        return;
    }
    forced_logits_match::<bf16>(2e-2);
}

/// Penalties (over each request's generated tokens) and min_new_tokens (its end ids banned
/// until then) give the tokens the static engine's sampler gives the request alone.
#[test]
fn penalties_and_min_new_tokens_match_static() {
    if gpu_or_skip("penalties_and_min_new_tokens_match_static").is_none() {
        return;
    }
    let _serial = serial();
    let mut e = engine();
    let cases = [
        SamplingParams {
            repetition_penalty: 1.8,
            ..SamplingParams::greedy()
        },
        SamplingParams {
            presence_penalty: 0.7,
            frequency_penalty: 0.4,
            ..SamplingParams::greedy()
        },
        SamplingParams::greedy(),
    ];
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| prompt(11 + 5 * i, 70 + i as u32)).collect();
    // The end id: request 2's greedy token 3, banned until 6 tokens are out.
    let free = static_greedy(&mut e, &prompts[2], 8);
    let end = free[3];
    let new = 14;
    let mut want = vec![];
    for (i, p) in prompts.iter().enumerate() {
        let mut sp = cases[i];
        if i == 2 {
            sp.min_new_tokens = 6;
        }
        let r = StaticRequest {
            prompts: vec![p.clone()],
            max_new_tokens: new,
            sampling: vec![sp],
            end_ids: if i == 2 { vec![end] } else { vec![] },
            ignore_eos: i != 2,
            forced: None,
        };
        let needs = StepNeeds {
            logits: false,
            tokens: true,
        };
        let out = e.generate(&r, needs, &mut |_| true).expect("static");
        want.push(out.tokens[0].clone());
    }
    let cfg = RunnerConfig {
        max_batched_tokens: 24,
        max_num_seqs: 4,
        max_model_len: Some(128),
        num_blocks: Some(32),
        ..Default::default()
    };
    let mut r = Runner::new(&mut e, &cfg).expect("runner");
    for (i, p) in prompts.iter().enumerate() {
        let mut sp = cases[i];
        let mut q = request(i as u64, p.clone(), new, sp, 0);
        if i == 2 {
            sp.min_new_tokens = 6;
            q.params.sampling = sp;
            q.params.ignore_eos = false;
            q.params.eos_token_ids = vec![end];
        }
        r.add_request(q).expect("add");
    }
    let (got, _) = r.run_to_completion().expect("run");
    for (i, w) in want.iter().enumerate() {
        assert_eq!(
            got.get(&(i as u64)),
            Some(w),
            "request {i}: runner vs static"
        );
    }
    assert!(
        !got[&2][..5].contains(&end),
        "end id sampled under min_new_tokens"
    );
}

/// A 1,024-position context, a 281-token sequence decoding beside a short one in CUDA graphs:
/// the logits match the static engine's.
#[test]
fn long_context_decode_matches_static_f16() {
    if gpu_or_skip("long_context_decode_matches_static_f16").is_none() {
        return;
    }
    let _serial = serial();
    let mut cfg = preset("tiny").expect("tiny preset");
    cfg.max_position_embeddings = 1024;
    let mut e = Engine::<f16>::load(0, cfg, WeightSource::Dummy { seed: 7 }, None).expect("load");
    let prompts = [prompt(240, 3), prompt(30, 4)];
    let forced: Vec<Vec<u32>> = vec![prompt(40, 5), prompt(40, 6)];
    let want: Vec<Vec<Vec<f32>>> = prompts
        .iter()
        .zip(&forced)
        .map(|(p, f)| static_forced_logits(&mut e, p, f))
        .collect();
    let rcfg = RunnerConfig {
        max_num_seqs: 2,
        num_blocks: Some(64),
        ..Default::default()
    };
    let mut r = Runner::new(&mut e, &rcfg).expect("runner");
    for (i, (p, f)) in prompts.iter().zip(&forced).enumerate() {
        let opts = RequestOptions {
            forced: f.clone(),
            logits: true,
        };
        let q = request(
            i as u64,
            p.clone(),
            f.len() + 1,
            SamplingParams::greedy(),
            0,
        );
        r.add_request_with(q, opts).expect("add");
    }
    let mut graphs = 0;
    while r.has_unfinished() {
        r.step().expect("step");
        graphs += r.last_step().graph as usize;
    }
    assert!(graphs > 0, "no decode step replayed a CUDA graph");
    for (i, w) in want.iter().enumerate() {
        let got = r.take_logits(i as u64).expect("kept logits");
        assert_eq!(got.len(), w.len());
        for (s, (g, w)) in got.iter().zip(w).enumerate() {
            let err = rel_l2(g, &to_f64(w));
            assert!(err < 1e-2, "request {i} step {s}: relL2 {err:.2e}");
        }
    }
}

/// Decode buckets of 8, 5 and 3 sequences over a 4,096-position paged cache at LLaMA-2-7B's
/// attention shape (32 heads of 128, one layer): every step's split layout fits the bucket's
/// workspace (a layout that varied with the context once needed more than was sized).
#[test]
fn decode_buckets_at_7b_attention_shape() {
    if gpu_or_skip("decode_buckets_at_7b_attention_shape").is_none() {
        return;
    }
    let _serial = serial();
    let mut cfg = preset("llama-2-7b").expect("preset");
    cfg.num_hidden_layers = 1;
    cfg.intermediate_size = 256;
    cfg.vocab_size = 256;
    let mut e = Engine::<f16>::load(0, cfg, WeightSource::Dummy { seed: 3 }, None).expect("load");
    let rcfg = RunnerConfig {
        max_num_seqs: 8,
        num_blocks: Some(8 * 24),
        ..Default::default()
    };
    let mut r = Runner::new(&mut e, &rcfg).expect("runner");
    for (batch, len) in [(8usize, 300usize), (5, 200), (3, 40)] {
        for i in 0..batch {
            let q = request(
                (100 * batch + i) as u64,
                prompt(len + i, i as u32),
                24,
                SamplingParams::greedy(),
                0,
            );
            r.add_request(q).expect("add");
        }
        let (got, _) = r.run_to_completion().expect("decode");
        assert_eq!(got.len(), batch);
        assert!(got.values().all(|t| t.len() == 24));
    }
}

/// Lookahead (the next decode step queued before this one is read back, its ids copied on the
/// device): greedy requests give the static engine's tokens, and a seeded sampled request the
/// same tokens as when its logits are read back (which keeps the runner synchronous), so the
/// lookahead rows carry the right positions, ids and sampler step indices.
#[test]
fn lookahead_decode_matches_synchronous_runs() {
    if gpu_or_skip("lookahead_decode_matches_synchronous_runs").is_none() {
        return;
    }
    let _serial = serial();
    let mut e = engine();
    let prompts: Vec<Vec<u32>> = [5usize, 23, 1]
        .iter()
        .map(|&n| prompt(n, n as u32))
        .collect();
    let news = [30usize, 17, 41];
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .zip(news)
        .map(|(p, n)| static_greedy(&mut e, p, n))
        .collect();
    let sampling = SamplingParams {
        temperature: 0.9,
        top_k: 40,
        ..Default::default()
    };
    let mut sampled = vec![];
    for sync in [true, false] {
        let cfg = RunnerConfig {
            max_num_seqs: 8,
            num_blocks: Some(64),
            ..Default::default()
        };
        let mut r = Runner::new(&mut e, &cfg).expect("runner");
        for (i, (p, &n)) in prompts.iter().zip(&news).enumerate() {
            r.add_request(request(i as u64, p.clone(), n, SamplingParams::greedy(), 0))
                .expect("add");
        }
        let opts = RequestOptions {
            logits: sync,
            ..Default::default()
        };
        r.add_request_with(request(9, prompt(12, 9), 45, sampling, 77), opts)
            .expect("add sampled");
        let mut got: HashMap<u64, Vec<u32>> = HashMap::new();
        let mut ahead = 0;
        while r.has_unfinished() {
            for ev in r.step().expect("step") {
                if let Event::Token { id, token } = ev {
                    got.entry(id).or_default().push(token);
                }
            }
            ahead += r.last_step().ahead as usize;
        }
        if sync {
            assert_eq!(
                ahead, 0,
                "a request reading its logits keeps every step synchronous"
            );
        } else {
            assert!(ahead >= 20, "only {ahead} lookahead steps");
        }
        for (i, w) in want.iter().enumerate() {
            assert_eq!(got.get(&(i as u64)), Some(w), "request {i} (sync {sync})");
        }
        sampled.push(got.remove(&9).expect("sampled tokens"));
        assert_eq!(r.scheduler().kv_stats().used_blocks, 0);
    }
    assert_eq!(
        sampled[0], sampled[1],
        "the sampled request with and without lookahead"
    );
}

#[test]
fn logprobs_are_the_log_softmax_of_each_sampled_step() {
    // A sampled request asking for 4 alternatives, among greedy mates that ask for none: one
    // entry per generated token, in order, for the token it got; the values are the log-softmax
    // of the logits it was sampled from (kept too, for the check).
    if gpu_or_skip("logprobs_are_the_log_softmax_of_each_sampled_step").is_none() {
        return;
    }
    let _serial = serial();
    let cfg = small_runner();
    let mut e = engine();
    let mut r = Runner::new(&mut e, &cfg).expect("runner");
    let sp = SamplingParams {
        temperature: 0.8,
        top_k: 50,
        ..Default::default()
    };
    let mut req = request(9, prompt(21, 3), 12, sp, 77);
    req.params.top_logprobs = Some(4);
    let opts = RequestOptions {
        logits: true,
        ..Default::default()
    };
    r.add_request_with(req, opts).unwrap();
    for i in 0..3u64 {
        let mate = request(
            20 + i,
            prompt(9 + 5 * i as usize, 40 + i as u32),
            10,
            SamplingParams::greedy(),
            i,
        );
        r.add_request(mate).unwrap();
    }
    let (tokens, _) = r.run_to_completion().unwrap();
    let logits = r.take_logits(9).expect("kept logits");
    let mut got = vec![];
    while let Some(lp) = r.next_logprobs(9) {
        got.push(lp);
    }
    assert_eq!(got.len(), tokens[&9].len());
    assert_eq!(logits.len(), got.len());
    for (i, (lp, row)) in got.iter().zip(&logits).enumerate() {
        assert_eq!(lp.token, tokens[&9][i], "step {i}");
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
        assert!(
            (lp.logprob as f64 - (row[lp.token as usize] as f64 - lse)).abs() < 1e-4,
            "step {i}"
        );
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        let ids: Vec<usize> = lp.top.iter().map(|&(t, _)| t as usize).collect();
        assert_eq!(ids, order[..4], "step {i}");
    }
    for i in 0..3u64 {
        assert_eq!(r.next_logprobs(20 + i), None, "a mate that asked for none");
    }
}
