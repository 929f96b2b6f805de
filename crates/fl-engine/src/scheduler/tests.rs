use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;

use super::*;

const VOCAB: u32 = 8;

/// The fake model: the next token depends only on the sequence's own tokens.
fn next_token(tokens: &[u32]) -> u32 {
    let h = tokens.iter().fold(0x2545_f491u64, |h, &t| {
        (h ^ t as u64).wrapping_mul(0x100_0000_01b3)
    });
    ((h >> 29) % VOCAB as u64) as u32
}

/// The request run alone, without any scheduler.
fn alone(prompt: &[u32], p: &RequestParams<()>) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    let mut out = Vec::new();
    while out.len() < p.max_new_tokens {
        let t = next_token(&seq);
        seq.push(t);
        out.push(t);
        if p.stop_token_ids.contains(&t) || (!p.ignore_eos && p.eos_token_ids.contains(&t)) {
            break;
        }
    }
    out
}

/// A fake runner over simulated paged memory (the token id held by each slot): it executes
/// the copies, writes every row into its slots, and samples from the context read back
/// through the block table, so a wrong table, hit or copy changes the tokens.
struct Runner {
    block_size: usize,
    mem: Vec<Vec<Option<u32>>>,
    /// Every request's true tokens (prompt + generated), to check the cache against.
    truth: HashMap<RequestId, Vec<u32>>,
    outputs: BTreeMap<RequestId, Vec<u32>>,
    finished: BTreeMap<RequestId, (FinishReason, Usage)>,
}

impl Runner {
    fn new(cfg: &SchedulerConfig) -> Self {
        Self {
            block_size: cfg.block_size,
            mem: vec![vec![None; cfg.block_size]; cfg.num_blocks],
            truth: HashMap::new(),
            outputs: BTreeMap::new(),
            finished: BTreeMap::new(),
        }
    }

    fn add(&mut self, s: &mut Scheduler, id: RequestId, prompt: Vec<u32>, params: RequestParams) {
        self.truth.insert(id, prompt.clone());
        s.add_request(Request { id, prompt, params }).unwrap();
    }

    /// One step: schedule, check the plan, run it, update. Returns the plan.
    fn step(&mut self, s: &mut Scheduler) -> StepPlan {
        let plan = s.schedule().unwrap();
        let cfg = s.config().clone();
        assert!(
            plan.num_scheduled_tokens <= cfg.max_batched_tokens,
            "budget exceeded"
        );
        let rows: usize = plan.seqs.iter().map(|r| r.token_ids.len()).sum();
        assert_eq!(rows, plan.num_scheduled_tokens);
        if let (Some(c), true) = (
            cfg.max_prefill_tokens_beside_decodes,
            plan.num_decode_tokens > 0,
        ) {
            assert!(
                plan.num_prefill_tokens <= c,
                "{} prompt tokens beside decodes",
                plan.num_prefill_tokens
            );
        }
        assert!(plan.seqs.len() <= cfg.max_num_seqs);
        assert!(s.num_running() <= cfg.max_num_seqs);
        let mut seen = std::collections::HashSet::new();
        assert!(
            plan.seqs.iter().all(|r| seen.insert(r.id)),
            "a request twice in one step"
        );
        for c in &plan.copies {
            let src = self.mem[c.src as usize].clone();
            self.mem[c.dst as usize][..c.n_tokens].copy_from_slice(&src[..c.n_tokens]);
        }
        let bs = self.block_size;
        for r in &plan.seqs {
            assert!(!r.token_ids.is_empty());
            assert!(
                r.block_table.len() * bs >= r.positions().end,
                "table too short"
            );
            let truth = &self.truth[&r.id];
            assert_eq!(
                &truth[r.positions()],
                &r.token_ids[..],
                "wrong rows for {}",
                r.id
            );
            assert_eq!(r.needs_logits, r.positions().end == truth.len());
            for (p, &t) in r.positions().zip(&r.token_ids) {
                self.mem[r.block_table[p / bs] as usize][p % bs] = Some(t);
            }
        }
        let sampled: Vec<(RequestId, u32)> = plan
            .seqs
            .iter()
            .filter(|r| r.needs_logits)
            .map(|r| {
                let ctx: Vec<u32> = (0..r.positions().end)
                    .map(|p| self.mem[r.block_table[p / bs] as usize][p % bs].unwrap())
                    .collect();
                assert_eq!(
                    ctx, self.truth[&r.id],
                    "request {} reads a wrong cache",
                    r.id
                );
                (r.id, next_token(&ctx))
            })
            .collect();
        for e in s.update(&plan, &sampled).unwrap() {
            self.event(e);
        }
        s.kv().check_invariants().unwrap();
        plan
    }

    fn event(&mut self, e: Event) {
        match e {
            Event::Token { id, token } => {
                assert!(!self.finished.contains_key(&id));
                self.truth.get_mut(&id).unwrap().push(token);
                self.outputs.entry(id).or_default().push(token);
            }
            Event::Finished { id, reason, usage } => {
                assert!(self.finished.insert(id, (reason, usage)).is_none());
                assert_eq!(
                    usage.completion_tokens,
                    self.outputs.get(&id).map_or(0, Vec::len)
                );
            }
        }
    }

    fn run_to_end(&mut self, s: &mut Scheduler) {
        for _ in 0..10_000 {
            if !s.has_unfinished() {
                return;
            }
            self.step(s);
        }
        panic!("requests never finished");
    }
}

fn cfg(num_blocks: usize, block_size: usize, budget: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_batched_tokens: budget,
        max_num_seqs: 16,
        block_size,
        num_blocks,
        max_model_len: 256,
        enable_prefix_cache: true,
        chunked_prefill: true,
        vocab_size: Some(VOCAB),
        max_prefill_tokens_beside_decodes: None,
    }
}

fn params(max_new: usize) -> RequestParams {
    let mut p = RequestParams::new(max_new);
    p.ignore_eos = true;
    p
}

fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 7 + seed) % VOCAB).collect()
}

#[test]
fn validation_errors_name_the_field() {
    let mut s = Scheduler::<()>::new(SchedulerConfig {
        max_model_len: 16,
        ..cfg(3, 4, 64)
    })
    .unwrap();
    let mut add = |prompt: Vec<u32>, max_new| {
        s.add_request(Request {
            id: 1,
            prompt,
            params: params(max_new),
        })
        .unwrap_err()
        .to_string()
    };
    assert!(add(vec![], 1).starts_with("prompt:"));
    assert!(add(vec![0; 17], 1).starts_with("prompt:"));
    assert_eq!(add(vec![0, 9], 1), "prompt[1]: token id 9 >= vocab size 8");
    assert!(add(vec![0], 0).starts_with("max_new_tokens:"));
    assert!(add(vec![0; 10], 7).starts_with("max_new_tokens:"));
    // 12 + 1 tokens fit the context, 12 KV slots = 3 blocks fit; 13 + 1 needs 4 blocks.
    let e = add(vec![0; 13], 1);
    assert!(
        e.starts_with("max_new_tokens:") && e.contains("KV blocks"),
        "{e}"
    );
    s.add_request(Request {
        id: 1,
        prompt: vec![0; 12],
        params: params(1),
    })
    .unwrap();
    let e = s
        .add_request(Request {
            id: 1,
            prompt: vec![0],
            params: params(1),
        })
        .unwrap_err();
    assert_eq!(e, RequestError::DuplicateId(1));
    assert!(e.to_string().starts_with("id:"));
}

#[test]
fn config_errors_name_the_field() {
    let field = |c: SchedulerConfig| match Scheduler::<()>::new(c).unwrap_err() {
        SchedulerError::Config { field, .. } => field,
        e => panic!("{e}"),
    };
    assert_eq!(field(cfg(4, 4, 0)), "max_batched_tokens");
    assert_eq!(field(cfg(4, 0, 8)), "block_size");
    assert_eq!(field(cfg(0, 4, 8)), "num_blocks");
    assert_eq!(
        field(SchedulerConfig {
            max_num_seqs: 0,
            ..cfg(4, 4, 8)
        }),
        "max_num_seqs"
    );
    assert_eq!(
        field(SchedulerConfig {
            max_model_len: 1,
            ..cfg(4, 4, 8)
        }),
        "max_model_len"
    );
    let c = SchedulerConfig {
        chunked_prefill: false,
        ..cfg(4, 4, 8)
    };
    assert_eq!(field(c), "max_batched_tokens");
    for (chunked, chunk) in [(true, 0), (false, 4)] {
        let c = SchedulerConfig {
            chunked_prefill: chunked,
            max_model_len: 8,
            max_prefill_tokens_beside_decodes: Some(chunk),
            ..cfg(4, 4, 8)
        };
        assert_eq!(field(c), "max_prefill_tokens_beside_decodes");
    }
}

#[test]
fn prompt_tokens_beside_decodes_are_capped_per_step_and_alone_are_not() {
    let c = SchedulerConfig {
        max_prefill_tokens_beside_decodes: Some(8),
        ..cfg(64, 4, 32)
    };
    let mut s = Scheduler::new(c.clone()).unwrap();
    let mut r = Runner::new(&c);
    // Alone, a prompt takes the whole budget.
    r.add(&mut s, 1, prompt(40, 1), params(30));
    assert_eq!(r.step(&mut s).num_prefill_tokens, 32);
    // Its last 8 tokens, then it decodes.
    assert_eq!(r.step(&mut s).num_prefill_tokens, 8);
    // Beside its decode, the arriving prompts share 8 prompt tokens a step, front first.
    r.add(&mut s, 2, prompt(10, 2), params(2));
    r.add(&mut s, 3, prompt(5, 3), params(2));
    let chunks = |p: &StepPlan| -> Vec<(RequestId, usize)> {
        p.seqs
            .iter()
            .filter(|q| q.is_prefill)
            .map(|q| (q.id, q.token_ids.len()))
            .collect()
    };
    let p = r.step(&mut s);
    assert_eq!(p.num_decode_tokens, 1);
    assert_eq!(chunks(&p), vec![(2, 8)]);
    // The partial prefill goes first, the next prompt takes what is left.
    let p = r.step(&mut s);
    assert_eq!(chunks(&p), vec![(2, 2), (3, 5)]);
    r.run_to_end(&mut s);
    for (id, n, max) in [(1, 40, 30), (2, 10, 2), (3, 5, 2)] {
        assert_eq!(r.outputs[&id], alone(&prompt(n, id as u32), &params(max)));
    }
}

#[test]
fn long_prompt_is_chunked_under_the_budget_and_decodes_go_first() {
    let c = cfg(64, 4, 32);
    let mut s = Scheduler::new(c.clone()).unwrap();
    let mut r = Runner::new(&c);
    r.add(&mut s, 1, prompt(3, 1), params(20));
    let p = r.step(&mut s);
    assert_eq!(p.num_prefill_tokens, 3);
    r.add(&mut s, 2, prompt(100, 2), params(2));
    let mut chunks = Vec::new();
    for _ in 0..4 {
        let p = r.step(&mut s);
        assert_eq!(p.seqs[0].id, 1, "the decode comes first");
        assert!(!p.seqs[0].is_prefill && p.seqs[0].token_ids.len() == 1);
        assert_eq!(
            p.num_scheduled_tokens,
            p.num_decode_tokens + p.num_prefill_tokens
        );
        chunks.push(p.seqs[1].token_ids.len());
        assert_eq!(p.seqs[1].needs_logits, chunks.iter().sum::<usize>() == 100);
    }
    assert_eq!(chunks, vec![31, 31, 31, 7]);
    r.run_to_end(&mut s);
    assert_eq!(r.outputs[&1], alone(&prompt(3, 1), &params(20)));
    assert_eq!(r.outputs[&2], alone(&prompt(100, 2), &params(2)));
}

#[test]
fn without_chunking_a_prompt_waits_for_a_whole_step() {
    let c = SchedulerConfig {
        chunked_prefill: false,
        max_model_len: 40,
        ..cfg(64, 4, 40)
    };
    let mut s = Scheduler::new(c.clone()).unwrap();
    let mut r = Runner::new(&c);
    r.add(&mut s, 1, prompt(2, 1), params(5));
    r.add(&mut s, 2, prompt(2, 2), params(5));
    r.step(&mut s);
    r.add(&mut s, 3, prompt(39, 3), params(1));
    let p = r.step(&mut s);
    assert_eq!(p.seqs.len(), 2, "39 rows do not fit beside two decodes");
    r.run_to_end(&mut s);
    assert_eq!(r.outputs[&3], alone(&prompt(39, 3), &params(1)));
}

#[test]
fn max_num_seqs_limits_admission() {
    let c = SchedulerConfig {
        max_num_seqs: 2,
        ..cfg(64, 4, 64)
    };
    let mut s = Scheduler::new(c.clone()).unwrap();
    let mut r = Runner::new(&c);
    for id in 1..=3 {
        r.add(&mut s, id, prompt(4, id as u32), params(3));
    }
    let p = r.step(&mut s);
    assert_eq!(p.seqs.iter().map(|r| r.id).collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(s.num_waiting(), 1);
    r.run_to_end(&mut s);
    assert_eq!(r.finished.len(), 3);
}

#[test]
fn admission_waits_until_the_whole_prompt_fits() {
    // 20 blocks of 4 (watermark 1): request 1's 40-token prompt (10 blocks, 11 with its
    // output) is chunked 12 at a time; its last chunk (4) leaves budget for request 2, whose
    // 40 tokens (10 blocks) do not fit beside it (10 + 10 + 1 > 20): admitting its first chunk
    // anyway would preempt later. It starts once request 1 is done.
    let c = cfg(20, 4, 12);
    let mut s = Scheduler::new(c.clone()).unwrap();
    let mut r = Runner::new(&c);
    r.add(&mut s, 1, prompt(40, 1), params(2));
    r.add(&mut s, 2, prompt(40, 2), params(2));
    let mut steps_before_2 = 0;
    loop {
        let p = r.step(&mut s);
        if p.seqs.iter().any(|q| q.id == 2) {
            break;
        }
        steps_before_2 += 1;
        assert!(steps_before_2 < 20, "request 2 never admitted");
    }
    assert!(steps_before_2 >= 5, "admitted after {steps_before_2} steps");
    r.run_to_end(&mut s);
    assert_eq!(s.num_preemptions(), 0, "admission should have left room");
    for (id, seed) in [(1, 1), (2, 2)] {
        assert_eq!(r.outputs[&id], alone(&prompt(40, seed), &params(2)));
    }
}

#[test]
fn preemption_picks_the_newest_and_recomputes_the_same_tokens() {
    // 6 blocks of 2: two requests of 4 prompt + 6 new tokens (9 KV slots = 5 blocks each).
    let c = cfg(6, 2, 64);
    let mut s = Scheduler::new(c.clone()).unwrap();
    let mut r = Runner::new(&c);
    r.add(&mut s, 1, prompt(4, 1), params(6));
    r.add(&mut s, 2, prompt(4, 3), params(6));
    let mut preempted = Vec::new();
    for _ in 0..40 {
        if !s.has_unfinished() {
            break;
        }
        let p = r.step(&mut s);
        preempted.extend(p.preempted_ids.iter().copied());
        for id in &p.preempted_ids {
            assert!(p.finished_ids.contains(id));
        }
    }
    assert!(!s.has_unfinished());
    assert_eq!(preempted, vec![2], "the newest request is the victim, once");
    assert_eq!(s.num_preemptions(), 1);
    for (id, seed) in [(1, 1), (2, 3)] {
        assert_eq!(r.outputs[&id], alone(&prompt(4, seed), &params(6)));
        assert_eq!(r.finished[&id].0, FinishReason::Length);
    }
    assert_eq!(s.kv_stats().free_blocks, 6);
}

#[test]
fn prefix_cache_hit_is_reported_and_capped() {
    let c = cfg(64, 4, 64);
    let mut s = Scheduler::new(c.clone()).unwrap();
    let mut r = Runner::new(&c);
    let shared = prompt(12, 5);
    r.add(&mut s, 1, shared.clone(), params(2));
    r.run_to_end(&mut s);
    let mut longer = shared.clone();
    longer.extend([1, 2, 3]);
    r.add(&mut s, 2, shared.clone(), params(2));
    r.add(&mut s, 3, longer.clone(), params(2));
    let p = r.step(&mut s);
    // Same 12-token prompt: 8 tokens hit (11 capped to whole blocks); 15 tokens: 12 hit.
    assert_eq!(p.seqs[0].num_computed_tokens, 8);
    assert_eq!(p.seqs[1].num_computed_tokens, 12);
    r.run_to_end(&mut s);
    assert_eq!(r.finished[&1].1.cached_tokens, 0);
    assert_eq!(r.finished[&2].1.cached_tokens, 8);
    assert_eq!(r.finished[&3].1.cached_tokens, 12);
    assert_eq!(r.outputs[&2], r.outputs[&1]);
    assert_eq!(r.outputs[&3], alone(&longer, &params(2)));
}

#[test]
fn stop_eos_and_length() {
    let c = cfg(64, 4, 64);
    let p = prompt(5, 0);
    let reference = alone(&p, &params(50));
    let first = reference[0];
    let run = |params: RequestParams| {
        let mut s = Scheduler::new(c.clone()).unwrap();
        let mut r = Runner::new(&c);
        r.add(&mut s, 1, p.clone(), params);
        r.run_to_end(&mut s);
        (r.outputs[&1].clone(), r.finished[&1].0)
    };
    let mut stop = params(50);
    stop.stop_token_ids = vec![first];
    assert_eq!(run(stop), (vec![first], FinishReason::Stop));
    let mut eos = RequestParams::new(50);
    eos.eos_token_ids = vec![first];
    assert_eq!(run(eos.clone()), (vec![first], FinishReason::Stop));
    eos.ignore_eos = true;
    assert_eq!(run(eos), (reference.clone(), FinishReason::Length));
}

#[test]
fn abort_frees_blocks_everywhere() {
    let c = cfg(16, 4, 64);
    let mut s = Scheduler::new(c.clone()).unwrap();
    let mut r = Runner::new(&c);
    r.add(&mut s, 1, prompt(10, 1), params(20));
    r.add(&mut s, 2, prompt(10, 2), params(20));
    r.step(&mut s);
    r.add(&mut s, 3, prompt(10, 3), params(20));
    // Waiting.
    let e = s.abort(3).unwrap();
    assert!(matches!(
        e,
        Event::Finished {
            id: 3,
            reason: FinishReason::Abort,
            ..
        }
    ));
    assert_eq!(s.num_waiting(), 0);
    // Running, between steps.
    let used = s.kv_stats().used_blocks;
    s.abort(1).unwrap();
    assert!(s.kv_stats().used_blocks < used);
    s.kv().check_invariants().unwrap();
    // Running, while its plan is out: update ignores its rows and token.
    let plan = s.schedule().unwrap();
    assert_eq!(plan.finished_ids, vec![1]);
    assert!(!plan.freed_blocks.is_empty());
    let Event::Finished { usage, .. } = s.abort(2).unwrap() else {
        panic!()
    };
    assert_eq!(usage.completion_tokens, 1);
    assert_eq!(s.update(&plan, &[(2, 0)]).unwrap(), vec![]);
    assert_eq!(s.kv_stats().used_blocks, 0);
    assert_eq!(s.abort(2), Err(SchedulerError::UnknownRequest(2)));
    assert!(!s.has_unfinished());
}

#[test]
fn update_rejects_wrong_plans_and_tokens() {
    let c = cfg(16, 4, 64);
    let mut s = Scheduler::<()>::new(c).unwrap();
    s.add_request(Request {
        id: 1,
        prompt: vec![1, 2],
        params: params(3),
    })
    .unwrap();
    s.add_request(Request {
        id: 2,
        prompt: vec![1, 2, 3, 4, 5, 6],
        params: params(3),
    })
    .unwrap();
    let plan = s.schedule().unwrap();
    assert_eq!(
        s.schedule(),
        Err(SchedulerError::PlanOutstanding(plan.step))
    );
    let mut stale = plan.clone();
    stale.step += 1;
    assert!(matches!(
        s.update(&stale, &[]),
        Err(SchedulerError::StalePlan { .. })
    ));
    assert_eq!(
        s.update(&plan, &[(1, 0)]),
        Err(SchedulerError::MissingToken(2))
    );
    assert_eq!(
        s.update(&plan, &[(1, 0), (2, 0), (1, 1)]),
        Err(SchedulerError::UnexpectedToken(1))
    );
    assert_eq!(
        s.update(&plan, &[(1, 0), (2, 0), (7, 1)]),
        Err(SchedulerError::UnexpectedToken(7))
    );
    assert_eq!(s.update(&plan, &[(1, 3), (2, 4)]).unwrap().len(), 2);
    assert!(matches!(
        s.update(&plan, &[]),
        Err(SchedulerError::StalePlan { .. })
    ));
}

#[derive(Clone, Debug)]
struct Arrival {
    step: usize,
    base: usize,
    prefix_len: usize,
    suffix: Vec<u32>,
    max_new: usize,
    stop: bool,
}

fn arrival() -> impl Strategy<Value = Arrival> {
    (
        0usize..30,
        0usize..3,
        0usize..24,
        prop::collection::vec(0u32..VOCAB, 1..12),
        1usize..12,
        any::<bool>(),
    )
        .prop_map(|(step, base, prefix_len, suffix, max_new, stop)| Arrival {
            step,
            base,
            prefix_len,
            suffix,
            max_new,
            stop,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random arrivals, shared prefixes, aborts and tiny pools (preemption): after every step
    /// the pool's invariants hold and the budget is kept; every request finishes, with exactly
    /// the tokens it generates alone (or a prefix of them when aborted).
    #[test]
    fn random_traffic_matches_running_alone(
        block_size in 1usize..5,
        extra_blocks in 0usize..8,
        budget in 1usize..40,
        max_num_seqs in 1usize..6,
        prefix in any::<bool>(),
        chunked in prop::bool::weighted(0.8),
        chunk in proptest::option::of(1usize..12),
        arrivals in prop::collection::vec(arrival(), 1..10),
        aborts in prop::collection::vec((0usize..40, 0u64..10), 0..3),
    ) {
        let bases: Vec<Vec<u32>> = (0..3).map(|b| prompt(24, b as u32 * 3 + 1)).collect();
        let reqs: Vec<(Vec<u32>, RequestParams)> = arrivals
            .iter()
            .map(|a| {
                let mut p = bases[a.base][..a.prefix_len].to_vec();
                p.extend(&a.suffix);
                let mut params = params(a.max_new);
                if a.stop {
                    params.stop_token_ids = vec![VOCAB - 1];
                }
                (p, params)
            })
            .collect();
        // The longest request alone must fit the pool; more blocks than that is slack.
        let max_kv = reqs.iter().map(|(p, q)| p.len() + q.max_new_tokens - 1).max().unwrap();
        let max_model_len = 64;
        let c = SchedulerConfig {
            max_batched_tokens: if chunked { budget } else { max_model_len },
            max_num_seqs,
            block_size,
            num_blocks: max_kv.div_ceil(block_size) + extra_blocks,
            max_model_len,
            enable_prefix_cache: prefix,
            chunked_prefill: chunked,
            vocab_size: Some(VOCAB),
            max_prefill_tokens_beside_decodes: chunk.filter(|_| chunked),
        };
        let mut s = Scheduler::new(c.clone()).unwrap();
        let mut r = Runner::new(&c);
        let mut aborted = Vec::new();
        let mut step = 0;
        while step < 40 || s.has_unfinished() {
            prop_assert!(step < 5_000, "requests never finished");
            for (id, (a, (p, q))) in arrivals.iter().zip(&reqs).enumerate() {
                if a.step == step {
                    r.add(&mut s, id as u64, p.clone(), q.clone());
                }
            }
            for &(at, id) in &aborts {
                if at == step {
                    if let Ok(e) = s.abort(id) {
                        r.event(e);
                        aborted.push(id);
                    }
                }
            }
            r.step(&mut s);
            step += 1;
        }
        prop_assert_eq!(r.finished.len(), reqs.len());
        prop_assert_eq!(s.kv_stats().used_blocks, 0);
        prop_assert_eq!(s.kv_stats().free_blocks, c.num_blocks);
        for (id, (p, q)) in reqs.iter().enumerate() {
            let id = id as u64;
            let want = alone(p, q);
            let got = r.outputs.get(&id).cloned().unwrap_or_default();
            let (reason, usage) = r.finished[&id];
            prop_assert_eq!(usage.prompt_tokens, p.len());
            prop_assert_eq!(usage.completion_tokens, got.len());
            if aborted.contains(&id) {
                prop_assert_eq!(reason, FinishReason::Abort);
                prop_assert_eq!(&want[..got.len()], &got[..]);
            } else {
                prop_assert_eq!(&got, &want);
                let stopped = q.stop_token_ids.contains(got.last().unwrap());
                let expected = if stopped { FinishReason::Stop } else { FinishReason::Length };
                prop_assert_eq!(reason, expected);
                if !stopped {
                    prop_assert_eq!(got.len(), q.max_new_tokens);
                }
            }
        }
    }
}
