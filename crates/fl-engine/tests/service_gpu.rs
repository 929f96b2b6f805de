//! The service on the GPU (tiny preset, dummy weights, f32): requests submitted from four
//! threads at once get the greedy tokens each gets alone through `Runner::run_to_completion`;
//! load / configuration errors come back from `spawn`, bad requests from `submit`; beam
//! requests get the hypotheses they get alone.

use std::time::Duration;

use fl_engine::beam::BeamParams;
use fl_engine::engine::Engine;
use fl_engine::presets::preset;
use fl_engine::runner::{Runner, RunnerConfig};
use fl_engine::scheduler::{FinishReason, Request, RequestError, RequestParams};
use fl_engine::service::{Service, ServiceError, StreamEvent};
use fl_engine::weights::WeightSource;
use fl_kernels::testing::gpu_or_skip;
use fl_sampling::SamplingParams;

#[allow(dead_code)] // this binary uses `serial` only
mod common;
use common::serial;

/// Longest wait for one event (the first includes kernel module loading).
const WAIT: Duration = Duration::from_secs(120);

fn engine() -> fl_engine::Result<Engine<f32>> {
    let cfg = preset("tiny").expect("tiny preset");
    Engine::<f32>::load(0, cfg, WeightSource::Dummy { seed: 7 }, None)
}

fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 29 + seed * 131 + 3) % 256)
        .collect()
}

fn greedy(new: usize) -> RequestParams<SamplingParams> {
    let mut p = RequestParams::<SamplingParams>::new(new);
    p.ignore_eos = true;
    p.sampling = SamplingParams::greedy();
    p
}

fn config() -> RunnerConfig {
    RunnerConfig {
        block_size: 16,
        // Small steps and few sequences: prompts are chunked and requests wait their turn.
        max_batched_tokens: 48,
        max_num_seqs: 4,
        max_model_len: Some(256),
        enable_prefix_cache: true,
        num_blocks: Some(48),
        ..Default::default()
    }
}

#[test]
fn service_matches_runner_alone_f32() {
    if gpu_or_skip("service_matches_runner_alone_f32").is_none() {
        return;
    }
    let _serial = serial();
    // Four threads x three requests; threads 0 and 1 share a 33-token prefix.
    let shared = prompt(33, 1);
    let work: Vec<Vec<(Vec<u32>, usize)>> = (0..4u32)
        .map(|t| {
            (0..3u32)
                .map(|k| {
                    let i = t * 3 + k;
                    let mut p = if t < 2 { shared.clone() } else { vec![] };
                    p.extend(prompt(1 + (i as usize * 13) % 70, 10 + i));
                    (p, 5 + (i as usize * 7) % 20)
                })
                .collect()
        })
        .collect();
    let want: Vec<Vec<Vec<u32>>> = {
        let mut e = engine().expect("load tiny");
        work.iter()
            .map(|reqs| {
                reqs.iter()
                    .map(|(p, n)| {
                        let mut r = Runner::new(&mut e, &config()).expect("runner");
                        let req = Request {
                            id: 0,
                            prompt: p.clone(),
                            params: greedy(*n),
                        };
                        r.add_request(req).expect("add");
                        let (mut got, _) = r.run_to_completion().expect("run");
                        got.remove(&0).expect("tokens")
                    })
                    .collect()
            })
            .collect()
    };

    let service = Service::spawn(engine, config()).expect("spawn");
    std::thread::scope(|sc| {
        for (t, (reqs, want)) in work.iter().zip(&want).enumerate() {
            let service = &service;
            sc.spawn(move || {
                let mut streams: Vec<_> = reqs
                    .iter()
                    .map(|(p, n)| service.submit(p.clone(), greedy(*n)).expect("submit"))
                    .collect();
                for (k, s) in streams.iter_mut().enumerate() {
                    let mut tokens = vec![];
                    loop {
                        match s.recv_timeout(WAIT) {
                            Ok(StreamEvent::Token { token, index, .. }) => {
                                assert_eq!(index, tokens.len());
                                tokens.push(token);
                            }
                            Ok(StreamEvent::Finished { reason, usage }) => {
                                assert_eq!(reason, FinishReason::Length);
                                assert_eq!(usage.completion_tokens, reqs[k].1);
                                break;
                            }
                            e => panic!("thread {t} request {k}: {e:?}"),
                        }
                    }
                    assert_eq!(tokens, want[k], "thread {t} request {k}: service vs alone");
                }
            });
        }
    });
    let stats = service.stats();
    eprintln!(
        "service: {} steps, {} preemptions, prefix-cache hit tokens {}",
        stats.steps, stats.backend.preemptions, stats.backend.kv.prefix_hit_tokens
    );
    assert_eq!(stats.failed_steps, 0);
    service.shutdown().expect("shutdown");
}

#[test]
fn service_reports_bad_config_and_bad_requests() {
    if gpu_or_skip("service_reports_bad_config_and_bad_requests").is_none() {
        return;
    }
    let _serial = serial();
    let bad = RunnerConfig {
        max_model_len: Some(0),
        ..config()
    };
    let e = Service::spawn(engine, bad).expect_err("max_model_len 0");
    assert!(e.to_string().starts_with("max_model_len"), "{e}");

    let service = Service::spawn(engine, config()).expect("spawn");
    let vocab = preset("tiny").expect("tiny").vocab_size as u32;
    let e = service
        .submit(vec![1, vocab], greedy(4))
        .expect_err("token out of range");
    assert!(
        matches!(
            e,
            ServiceError::Request(RequestError::TokenOutOfRange { index: 1, .. })
        ),
        "{e:?}"
    );
    let e = service
        .submit(prompt(250, 2), greedy(10))
        .expect_err("beyond the context");
    assert!(e.to_string().starts_with("max_new_tokens"), "{e}");
    // The service still serves.
    let mut s = service.submit(prompt(5, 3), greedy(3)).expect("submit");
    let n = std::iter::from_fn(|| s.recv_timeout(WAIT).ok())
        .filter(|e| matches!(e, StreamEvent::Token { .. }))
        .count();
    assert_eq!(n, 3);
    service.shutdown().expect("shutdown");
}

#[test]
fn service_beams_match_runner_alone_f32() {
    if gpu_or_skip("service_beams_match_runner_alone_f32").is_none() {
        return;
    }
    let _serial = serial();
    let beam = |k: usize, ret: usize, new: usize| {
        let mut b = BeamParams::new(k, new);
        b.num_return_sequences = ret;
        b.eos_token_ids = vec![2];
        b
    };
    let work = [
        (prompt(19, 4), beam(3, 2, 12)),
        (prompt(40, 5), beam(2, 2, 9)),
    ];
    let want: Vec<Vec<(Vec<u32>, f64)>> = {
        let mut e = engine().expect("load tiny");
        work.iter()
            .map(|(p, b)| {
                let mut r = Runner::new(&mut e, &config()).expect("runner");
                let req = Request {
                    id: 0,
                    prompt: p.clone(),
                    params: RequestParams::new(1),
                };
                r.add_beam_request(req, b.clone()).expect("add");
                r.run_to_completion().expect("run");
                r.take_beams(0).expect("hypotheses")
            })
            .collect()
    };

    let service = Service::spawn(engine, config()).expect("spawn");
    // Beside a sampled request, from two threads at once.
    let mut sampled = service.submit(prompt(7, 6), greedy(15)).expect("submit");
    std::thread::scope(|sc| {
        for ((p, b), want) in work.iter().zip(&want) {
            let service = &service;
            sc.spawn(move || {
                let s = service
                    .submit_beam(p.clone(), RequestParams::new(1), b.clone())
                    .expect("submit_beam");
                let events: Vec<StreamEvent> = s.collect();
                let StreamEvent::Beams(got) = &events[0] else {
                    panic!("{events:?}");
                };
                assert!(
                    matches!(events[1], StreamEvent::Finished { reason, .. } if reason != FinishReason::Abort),
                    "{events:?}"
                );
                assert_eq!(events.len(), 2, "{events:?}");
                assert_eq!(got.len(), want.len());
                for ((gt, gs), (wt, ws)) in got.iter().zip(want) {
                    assert_eq!(gt, wt, "service vs alone");
                    assert!((gs - ws).abs() < 1e-3, "score {gs} vs {ws}");
                }
            });
        }
    });
    let n = std::iter::from_fn(|| sampled.recv_timeout(WAIT).ok())
        .filter(|e| matches!(e, StreamEvent::Token { .. }))
        .count();
    assert_eq!(n, 15);
    // More beams than the runner's max_num_seqs (4).
    let e = service
        .submit_beam(prompt(5, 7), RequestParams::new(1), beam(5, 1, 4))
        .expect_err("too wide");
    assert!(
        matches!(e, ServiceError::Request(RequestError::BeamWidth { .. })),
        "{e:?}"
    );
    service.shutdown().expect("shutdown");
}
