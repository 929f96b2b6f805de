//! The continuous-batching runner on the GPU (tiny preset, dummy weights): requests chunked
//! under a small token budget, sharing prompt prefixes and preempted by a small KV pool give
//! each request the greedy tokens it gets alone from the static engine (f32: token-exact); a
//! seeded sampled request gives the same tokens alone and among others.

use std::collections::HashMap;

use fl_engine::engine::{Engine, Request as StaticRequest, StepNeeds};
use fl_engine::presets::preset;
use fl_engine::runner::{Runner, RunnerConfig};
use fl_engine::scheduler::{Event, FinishReason, Request, RequestParams};
use fl_engine::weights::WeightSource;
use fl_kernels::testing::gpu_or_skip;
use fl_sampling::SamplingParams;

#[allow(dead_code)] // this binary uses `serial` only
mod common;
use common::serial;

fn engine() -> Engine<f32> {
    let cfg = preset("tiny").expect("tiny preset");
    Engine::<f32>::load(0, cfg, WeightSource::Dummy { seed: 7 }, None).expect("load tiny")
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
    let cfg = RunnerConfig {
        max_batched_tokens: 32,
        max_model_len: Some(256),
        num_blocks: Some(64),
        max_num_seqs: 8,
        ..Default::default()
    };
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
