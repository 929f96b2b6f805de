//! Beam search through the continuous-batching runner (tiny preset, dummy weights) against
//! the CPU beam search (`fl_engine::beam::beam_search`, transformers' semantics) fed with the
//! static engine's logits of every beam: a ragged batch of beam requests with different
//! `num_beams`, length penalties and `early_stopping` modes beside a sampled request, under a
//! small step budget (chunked prompts) and a small KV pool.

use fl_engine::beam::{beam_search, BeamParams, EarlyStopping};
use fl_engine::dtype::RunDType;
use fl_engine::engine::{Engine, Request as StaticRequest, StepNeeds};
use fl_engine::presets::preset;
use fl_engine::runner::{Runner, RunnerConfig};
use fl_engine::scheduler::{Event, FinishReason, Request, RequestParams};
use fl_engine::weights::WeightSource;
use fl_kernels::f16;
use fl_kernels::testing::gpu_or_skip;
use fl_sampling::SamplingParams;

#[allow(dead_code)] // this binary uses `serial` only
mod common;
use common::serial;

fn engine_of<T: RunDType>() -> Engine<T> {
    let cfg = preset("tiny").expect("tiny preset");
    Engine::<T>::load(0, cfg, WeightSource::Dummy { seed: 11 }, None).expect("load tiny")
}

fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + seed * 101 + 5) % 256)
        .collect()
}

/// The static engine's logits for the next token after `seq`.
fn next_logits<T: RunDType>(e: &mut Engine<T>, seq: &[u32]) -> Vec<f32> {
    let r = StaticRequest {
        prompts: vec![seq.to_vec()],
        max_new_tokens: 1,
        sampling: vec![SamplingParams::greedy()],
        end_ids: vec![],
        ignore_eos: true,
        forced: None,
    };
    let needs = StepNeeds {
        logits: true,
        tokens: true,
    };
    let mut row = vec![];
    e.generate(&r, needs, &mut |s| {
        row = s.logits.expect("logits asked").to_vec();
        true
    })
    .expect("static generate");
    row
}

/// A request's returned hypotheses: generated tokens and score, best first.
type Hypotheses = Vec<(Vec<u32>, f64)>;

struct Case {
    prompt: Vec<u32>,
    params: BeamParams,
}

fn cases<T: RunDType>(e: &mut Engine<T>) -> Vec<Case> {
    let mut out = vec![];
    let specs = [
        (13, 4, EarlyStopping::False, 4, 1.0, 9),
        (29, 2, EarlyStopping::True, 1, 0.5, 7),
        (7, 3, EarlyStopping::Never, 2, 2.0, 6),
        (40, 5, EarlyStopping::False, 1, -0.5, 8),
    ];
    for (i, &(len, k, es, nrs, lp, max_new)) in specs.iter().enumerate() {
        let p = prompt(len, i as u32);
        // An end id the search meets: the second-best first token.
        let l = next_logits(e, &p);
        let mut order: Vec<usize> = (0..l.len()).collect();
        order.sort_by(|&a, &b| l[b].total_cmp(&l[a]));
        let mut params = BeamParams::new(k, max_new);
        params.early_stopping = es;
        params.num_return_sequences = nrs;
        params.length_penalty = lp;
        params.eos_token_ids = vec![order[1] as u32];
        out.push(Case { prompt: p, params });
    }
    out
}

/// Runs every case together through a runner (plus one sampled request) and returns each
/// case's hypotheses and the sampled request's tokens.
fn run_batch<T: RunDType>(e: &mut Engine<T>, cases: &[Case]) -> (Vec<Hypotheses>, Vec<u32>) {
    let cfg = RunnerConfig {
        max_batched_tokens: 24,
        max_num_seqs: 32,
        num_blocks: Some(96),
        block_size: 4,
        ..RunnerConfig::default()
    };
    let mut r = Runner::new(e, &cfg).expect("runner");
    for (i, c) in cases.iter().enumerate() {
        let req = Request {
            id: i as u64,
            prompt: c.prompt.clone(),
            params: RequestParams::<SamplingParams>::new(1),
        };
        r.add_beam_request(req, c.params.clone())
            .expect("add beam request");
    }
    let mut sp = RequestParams::<SamplingParams>::new(12);
    sp.ignore_eos = true;
    sp.sampling = SamplingParams::greedy();
    r.add_request(Request {
        id: 100,
        prompt: prompt(21, 9),
        params: sp,
    })
    .expect("add sampled request");
    let (tokens, events) = r.run_to_completion().expect("run");
    for (i, c) in cases.iter().enumerate() {
        assert!(
            !tokens.contains_key(&(i as u64)),
            "beam requests stream no tokens"
        );
        let fin = events.iter().find_map(|e| match e {
            Event::Finished { id, reason, usage } if *id == i as u64 => Some((*reason, *usage)),
            _ => None,
        });
        let (reason, usage) = fin.expect("a Finished event per beam request");
        assert_ne!(reason, FinishReason::Abort);
        assert_eq!(usage.prompt_tokens, c.prompt.len());
        assert!(usage.completion_tokens <= c.params.max_new_tokens);
    }
    let beams = (0..cases.len())
        .map(|i| r.take_beams(i as u64).expect("hypotheses"))
        .collect();
    assert_eq!(r.scheduler().kv_stats().used_blocks, 0, "blocks leaked");
    (beams, tokens[&100].clone())
}

#[test]
fn runner_beams_match_cpu_search_f32() {
    if gpu_or_skip("runner_beams_match_cpu_search_f32").is_none() {
        return;
    }
    let _serial = serial();
    let mut e = engine_of::<f32>();
    let cases = cases(&mut e);
    let want: Vec<_> = cases
        .iter()
        .map(|c| {
            beam_search(&c.prompt, &c.params, |beams| {
                beams.iter().map(|b| next_logits(&mut e, b)).collect()
            })
            .expect("cpu search")
        })
        .collect();
    let mut greedy = prompt(21, 9);
    for _ in 0..12 {
        let l = next_logits(&mut e, &greedy);
        let best = (0..l.len()).fold(0, |b, v| if l[v] > l[b] { v } else { b });
        greedy.push(best as u32);
    }
    let (got, sampled) = run_batch(&mut e, &cases);
    assert_eq!(
        sampled,
        greedy[21..].to_vec(),
        "the sampled request beside the beams"
    );
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.len(), w.len(), "case {i}: hypotheses");
        assert!(!g.is_empty(), "case {i}: no hypothesis");
        for ((gt, gs), (wt, ws)) in g.iter().zip(w) {
            assert_eq!(gt, wt, "case {i}: tokens");
            assert!(
                (gs - ws).abs() <= 1e-4 * ws.abs().max(1.0),
                "case {i}: score {gs} vs {ws}"
            );
        }
    }
}

/// f16: the same batch runs (the KV's rounding differs from the static engine's, so near ties
/// may flip): every request returns its hypotheses, best first, each within max_new_tokens,
/// and the best score is within 2% of the CPU search's on f16 logits.
#[test]
fn runner_beams_run_f16() {
    if gpu_or_skip("runner_beams_run_f16").is_none() {
        return;
    }
    let _serial = serial();
    let mut e = engine_of::<f16>();
    let cases = cases(&mut e);
    let (got, _) = run_batch(&mut e, &cases);
    for (i, (g, c)) in got.iter().zip(&cases).enumerate() {
        assert!(!g.is_empty() && g.len() <= c.params.num_return_sequences);
        assert!(
            g.windows(2).all(|w| w[0].1 >= w[1].1),
            "case {i}: not best first"
        );
        assert!(g
            .iter()
            .all(|h| h.0.len() <= c.params.max_new_tokens && h.1.is_finite()));
        let w = beam_search(&c.prompt, &c.params, |beams| {
            beams.iter().map(|b| next_logits(&mut e, b)).collect()
        })
        .expect("cpu search");
        assert!(
            (g[0].1 - w[0].1).abs() <= 0.02 * w[0].1.abs().max(1.0),
            "case {i}: best score {} vs {}",
            g[0].1,
            w[0].1
        );
    }
}
