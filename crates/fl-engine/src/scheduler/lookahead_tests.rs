//! Lookahead plans ([`Scheduler::schedule_ahead`]): a fake runner over simulated paged memory
//! that queues step N+1 before updating step N (its pending tokens copied from step N's
//! samples, as the GPU runner copies them on the device) must give every request the tokens
//! it gets alone, with aborts, arrivals and preemptions mixed in.

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;

use super::*;

const VOCAB: u32 = 13;

fn next_token(tokens: &[u32]) -> u32 {
    let h = tokens.iter().fold(0x51_7cc1_b727u64, |h, &t| {
        (h ^ t as u64).wrapping_mul(0x100_0000_01b3)
    });
    ((h >> 31) % VOCAB as u64) as u32
}

fn alone(prompt: &[u32], max_new: usize, eos: Option<u32>) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    let mut out = vec![];
    while out.len() < max_new {
        let t = next_token(&seq);
        seq.push(t);
        out.push(t);
        if Some(t) == eos {
            break;
        }
    }
    out
}

struct Fake {
    bs: usize,
    mem: Vec<Vec<Option<u32>>>,
    outputs: BTreeMap<RequestId, Vec<u32>>,
    finished: BTreeMap<RequestId, FinishReason>,
    ahead_steps: usize,
}

impl Fake {
    /// Executes `plan`: copies, KV writes (a pending row writes the token `prev` sampled for
    /// it), then samples each row that needs logits from the context read back.
    fn run(&mut self, plan: &StepPlan, prev: &HashMap<RequestId, u32>) -> Vec<(RequestId, u32)> {
        let bs = self.bs;
        for c in &plan.copies {
            let src = self.mem[c.src as usize].clone();
            self.mem[c.dst as usize][..c.n_tokens].copy_from_slice(&src[..c.n_tokens]);
        }
        let mut out = vec![];
        for r in &plan.seqs {
            for (p, &t) in r.positions().zip(&r.token_ids) {
                let t = if t == PENDING_TOKEN {
                    // A finished request's pending row still runs; any id will do.
                    prev.get(&r.id).copied().unwrap_or(0)
                } else {
                    t
                };
                self.mem[r.block_table[p / bs] as usize][p % bs] = Some(t);
            }
            if r.needs_logits {
                let ctx: Vec<u32> = (0..r.positions().end)
                    .map(|p| self.mem[r.block_table[p / bs] as usize][p % bs].unwrap())
                    .collect();
                out.push((r.id, next_token(&ctx)));
            }
        }
        out
    }

    fn events(&mut self, events: Vec<Event>) {
        for e in events {
            match e {
                Event::Token { id, token } => self.outputs.entry(id).or_default().push(token),
                Event::Finished { id, reason, .. } => {
                    assert!(self.finished.insert(id, reason).is_none());
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn lookahead_gives_the_tokens_of_running_alone(
        reqs in proptest::collection::vec((1usize..40, 1usize..30, 0usize..40), 1..8),
        num_blocks in 12usize..60,
        budget in 4usize..48,
        abort_at in proptest::option::of((0usize..60, 0usize..8)),
    ) {
        let cfg = SchedulerConfig {
            max_batched_tokens: budget,
            max_num_seqs: 6,
            block_size: 4,
            num_blocks,
            max_model_len: 128,
            enable_prefix_cache: true,
            chunked_prefill: true,
            vocab_size: Some(VOCAB),
            max_prefill_tokens_beside_decodes: None,
        };
        let mut s = Scheduler::<()>::new(cfg.clone()).unwrap();
        let mut f = Fake {
            bs: 4,
            mem: vec![vec![None; 4]; num_blocks],
            outputs: BTreeMap::new(),
            finished: BTreeMap::new(),
            ahead_steps: 0,
        };
        let eos = 5;
        let mut want = HashMap::new();
        // Requests arrive at the step given, then run; a pending lookahead plan goes on.
        let mut arrivals: Vec<(usize, u64, Vec<u32>, usize)> = reqs
            .iter()
            .enumerate()
            .map(|(i, &(plen, max_new, at))| {
                let p: Vec<u32> = (0..plen as u32).map(|j| (j * 3 + i as u32) % VOCAB).collect();
                (at, i as u64, p, max_new)
            })
            .collect();
        arrivals.sort();
        let mut ahead: Option<StepPlan> = None;
        let mut prev: HashMap<RequestId, u32> = HashMap::new();
        for step in 0..2000 {
            while arrivals.first().is_some_and(|a| a.0 <= step) {
                let (_, id, p, max_new) = arrivals.remove(0);
                let mut params = RequestParams::new(max_new);
                params.eos_token_ids = vec![eos];
                if s.add_request(Request { id, prompt: p.clone(), params }).is_ok() {
                    want.insert(id, alone(&p, max_new, Some(eos)));
                }
            }
            if let Some((at, i)) = abort_at {
                if at == step && s.contains(i as u64) {
                    f.events(vec![s.abort(i as u64).unwrap()]);
                    want.remove(&(i as u64));
                }
            }
            if !s.has_unfinished() && arrivals.is_empty() && ahead.is_none() {
                break;
            }
            let plan = match ahead.take() {
                Some(p) => p,
                None => s.schedule().unwrap(),
            };
            let sampled = f.run(&plan, &prev);
            // Lookahead: the next plan is scheduled before this one's update.
            let decode_all = plan.num_prefill_tokens == 0 && plan.seqs.iter().all(|r| r.needs_logits);
            if decode_all && !plan.seqs.is_empty() {
                let ids: Vec<RequestId> = plan.seqs.iter().map(|r| r.id).collect();
                ahead = s.schedule_ahead(&ids).unwrap();
                if let Some(a) = &ahead {
                    f.ahead_steps += 1;
                    prop_assert!(a.seqs.iter().all(|r| r.token_ids == [PENDING_TOKEN]));
                    prop_assert!(s.schedule().is_err());
                }
            }
            prev = sampled.iter().copied().collect();
            let events = s.update(&plan, &sampled).unwrap();
            f.events(events);
            s.kv().check_invariants().unwrap();
        }
        prop_assert!(!s.has_unfinished());
        for (id, w) in &want {
            prop_assert_eq!(f.outputs.get(id).cloned().unwrap_or_default(), w.clone(), "request {}", id);
            prop_assert_ne!(f.finished.get(id), Some(&FinishReason::Abort));
        }
        prop_assert_eq!(s.kv().stats().used_blocks, 0);
    }
}

#[test]
fn lookahead_runs_in_the_steady_state_only() {
    let mut cfg = SchedulerConfig::new(64, 128);
    cfg.block_size = 4;
    let mut s = Scheduler::<()>::new(cfg).unwrap();
    assert!(s.schedule_ahead(&[]).is_err(), "no plan outstanding");
    for id in 0..2 {
        let mut p = RequestParams::new(6);
        p.ignore_eos = true;
        s.add_request(Request {
            id,
            prompt: vec![1, 2, 3],
            params: p,
        })
        .unwrap();
    }
    let plan = s.schedule().unwrap(); // the prompts: no lookahead after a prefill step
    let sampled: Vec<_> = plan.seqs.iter().map(|r| (r.id, 1)).collect();
    s.update(&plan, &sampled).unwrap();
    let plan = s.schedule().unwrap();
    assert_eq!(s.schedule_ahead(&[1, 0]).unwrap(), None, "another order");
    let ahead = s.schedule_ahead(&[0, 1]).unwrap().expect("steady state");
    assert_eq!(ahead.step, plan.step + 1);
    assert!(
        s.schedule_ahead(&[0, 1]).is_err(),
        "one lookahead at a time"
    );
    assert_eq!(
        s.update(&ahead, &[(0, 2), (1, 2)]),
        Err(SchedulerError::StalePlan {
            got: ahead.step,
            expected: Some(plan.step)
        })
    );
    s.update(&plan, &[(0, 2), (1, 2)]).unwrap();
    let events = s.update(&ahead, &[(0, 3), (1, 3)]).unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(s.output_tokens(0).unwrap(), &[1, 2, 3]);
}
