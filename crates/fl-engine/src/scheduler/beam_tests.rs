//! Beam requests in the scheduler: a fake runner over simulated paged memory runs
//! `beam::BeamState` on hashed logits read through each beam's block table, beside sampled
//! requests, under memory pressure; every beam request must return what `beam::beam_search`
//! returns alone, and every sampled request what it samples alone.

use std::collections::{BTreeMap, HashMap, HashSet};

use proptest::prelude::*;

use super::*;
use crate::beam::{beam_search, log_softmax, BeamParams, BeamState, EarlyStopping};

const VOCAB: u32 = 11;

/// The fake model's logits: a hash of the context and the token.
fn logits(ctx: &[u32]) -> Vec<f32> {
    let h = ctx.iter().fold(0x9e37_79b9u64, |h, &t| {
        (h ^ t as u64).wrapping_mul(0x100_0000_01b3)
    });
    (0..VOCAB as u64)
        .map(|v| {
            let x = (h ^ v.wrapping_mul(0xff51_afd7_ed55_8ccd)).wrapping_mul(0xc4ce_b9fe_1a85_ec53);
            ((x >> 40) % 8000) as f32 / 1000.0 - 4.0
        })
        .collect()
}

/// A sampled request's next token: the argmax of the same logits.
fn greedy(ctx: &[u32]) -> u32 {
    let l = logits(ctx);
    (0..VOCAB).fold(0, |b, v| if l[v as usize] > l[b as usize] { v } else { b })
}

struct Fake {
    bs: usize,
    mem: Vec<Vec<Option<u32>>>,
    prompts: HashMap<RequestId, Vec<u32>>,
    /// Sampled requests' tokens so far.
    sampled: HashMap<RequestId, Vec<u32>>,
    states: HashMap<RequestId, BeamState>,
    done: BTreeMap<RequestId, Vec<(Vec<u32>, f64)>>,
    finished: HashSet<RequestId>,
    max_beam_seqs: usize,
}

impl Fake {
    fn new(cfg: &SchedulerConfig) -> Self {
        Fake {
            bs: cfg.block_size,
            mem: vec![vec![None; cfg.block_size]; cfg.num_blocks],
            prompts: HashMap::new(),
            sampled: HashMap::new(),
            states: HashMap::new(),
            done: BTreeMap::new(),
            finished: HashSet::new(),
            max_beam_seqs: 0,
        }
    }

    fn add_beam(&mut self, s: &mut Scheduler, id: RequestId, prompt: Vec<u32>, bp: BeamParams) {
        let mut p = RequestParams::new(bp.max_new_tokens);
        p.beam_width = Some(bp.num_beams);
        s.add_request(Request {
            id,
            prompt: prompt.clone(),
            params: p,
        })
        .unwrap();
        self.prompts.insert(id, prompt);
        self.states
            .insert(id, BeamState::new(bp, VOCAB as usize).unwrap());
    }

    fn add_sampled(&mut self, s: &mut Scheduler, id: RequestId, prompt: Vec<u32>, max_new: usize) {
        let mut p = RequestParams::new(max_new);
        p.ignore_eos = true;
        s.add_request(Request {
            id,
            prompt: prompt.clone(),
            params: p,
        })
        .unwrap();
        self.prompts.insert(id, prompt);
        self.sampled.insert(id, vec![]);
    }

    /// The tokens sequence `seq` must hold.
    fn truth(&self, s: &Scheduler, seq: RequestId) -> Vec<u32> {
        match s.beam_of(seq) {
            Some((g, i)) => {
                let st = &self.states[&g];
                let mut t = self.prompts[&g].clone();
                if st.generated_len() > 0 {
                    t.extend(&st.running()[i]);
                }
                t
            }
            None => {
                let mut t = self.prompts[&seq].clone();
                t.extend(&self.sampled[&seq]);
                t
            }
        }
    }

    fn step(&mut self, s: &mut Scheduler) {
        let plan = s.schedule().unwrap();
        let bs = self.bs;
        for c in &plan.copies {
            let src = self.mem[c.src as usize].clone();
            self.mem[c.dst as usize][..c.n_tokens].copy_from_slice(&src[..c.n_tokens]);
        }
        for r in &plan.seqs {
            let truth = self.truth(s, r.id);
            assert_eq!(&truth[r.positions()], &r.token_ids[..], "rows of {}", r.id);
            for (p, &t) in r.positions().zip(&r.token_ids) {
                self.mem[r.block_table[p / bs] as usize][p % bs] = Some(t);
            }
        }
        let read = |r: &ScheduledSeq, mem: &Vec<Vec<Option<u32>>>| -> Vec<u32> {
            (0..r.positions().end)
                .map(|p| mem[r.block_table[p / bs] as usize][p % bs].unwrap())
                .collect()
        };
        let mut sampled = vec![];
        let mut rows: BTreeMap<RequestId, Vec<(usize, Vec<f32>)>> = BTreeMap::new();
        for r in plan.seqs.iter().filter(|r| r.needs_logits) {
            let ctx = read(r, &self.mem);
            assert_eq!(ctx, self.truth(s, r.id), "{} reads a wrong cache", r.id);
            match s.beam_of(r.id) {
                Some((g, i)) => rows.entry(g).or_default().push((i, logits(&ctx))),
                None => sampled.push((r.id, greedy(&ctx))),
            }
        }
        let mut steps = vec![];
        for (g, mut rs) in rows {
            rs.sort_by_key(|r| r.0);
            assert_eq!(
                rs.len(),
                s.beams(g).unwrap().len(),
                "a group split across steps"
            );
            let lp: Vec<f32> = rs.iter().flat_map(|r| log_softmax(&r.1)).collect();
            let st = self.states.get_mut(&g).unwrap();
            let out = st.step(&lp).unwrap();
            steps.push(BeamStep {
                id: g,
                reorder: out.reorder,
                tokens: out.tokens,
                finish: out.done.then_some(FinishReason::Stop),
            });
        }
        for e in s.update_with_beams(&plan, &sampled, &steps).unwrap() {
            match e {
                Event::Token { id, token } => self.sampled.get_mut(&id).unwrap().push(token),
                Event::Finished { id, reason, usage } => {
                    assert_ne!(reason, FinishReason::Abort);
                    assert!(self.finished.insert(id));
                    if let Some(st) = self.states.get(&id) {
                        assert!(st.is_done());
                        assert_eq!(usage.completion_tokens, st.generated_len());
                        self.done.insert(id, st.finish());
                    }
                }
            }
        }
        s.kv().check_invariants().unwrap();
        let beam_seqs = s.num_running();
        self.max_beam_seqs = self.max_beam_seqs.max(beam_seqs);
        assert!(beam_seqs <= s.config().max_num_seqs);
    }

    fn run(&mut self, s: &mut Scheduler) {
        for _ in 0..20_000 {
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
        max_num_seqs: 24,
        block_size,
        num_blocks,
        max_model_len: 256,
        enable_prefix_cache: true,
        chunked_prefill: true,
        vocab_size: Some(VOCAB),
        max_prefill_tokens_beside_decodes: None,
    }
}

fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 5 + seed) % VOCAB).collect()
}

fn alone_sampled(prompt: &[u32], max_new: usize) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    for _ in 0..max_new {
        seq.push(greedy(&seq));
    }
    seq[prompt.len()..].to_vec()
}

#[test]
fn beams_share_blocks_and_match_the_search_alone() {
    let c = cfg(64, 4, 64);
    let mut s = Scheduler::<()>::new(c.clone()).unwrap();
    let mut f = Fake::new(&c);
    let mut bp = BeamParams::new(3, 9);
    bp.eos_token_ids = vec![2];
    bp.num_return_sequences = 2;
    let p = prompt(10, 1);
    f.add_beam(&mut s, 1, p.clone(), bp.clone());
    // After the prompt's step, the request forks into 3 beams sharing its two full blocks.
    f.step(&mut s);
    let beams = s.beams(1).unwrap().to_vec();
    assert_eq!(beams.len(), 3);
    assert!(s.contains(1) && !s.contains(beams[0]));
    assert!(beams.iter().all(|&b| b >= BEAM_ID_BASE));
    let first = s.kv().block_table(beams[0]).unwrap()[0];
    assert_eq!(s.kv().ref_count(first), 3);
    // The next step copies the shared partial block for all but one beam.
    let plan = s.schedule().unwrap();
    assert!(!plan.copies.is_empty());
    assert_eq!(plan.seqs.len(), 3);
    s.update(&plan, &[]).unwrap_err(); // beams need a BeamStep
    let mut f2 = Fake::new(&c);
    let mut s2 = Scheduler::<()>::new(c.clone()).unwrap();
    f2.add_beam(&mut s2, 1, p.clone(), bp.clone());
    f2.run(&mut s2);
    let want = beam_search(&p, &bp, |beams| beams.iter().map(|b| logits(b)).collect()).unwrap();
    assert_eq!(f2.done[&1], want);
    assert_eq!(s2.kv().stats().used_blocks, 0);
}

/// A pool of exactly the group's worst case (what `fl generate --num-beams` sizes): the beams'
/// copies of the shared partial block are counted once each, not once per sharer.
#[test]
fn a_pool_of_exactly_the_worst_case_suffices() {
    for (plen, k, max_new) in [(9usize, 4usize, 6usize), (17, 4, 12), (8, 3, 5), (1, 5, 9)] {
        let bs = 4usize;
        let worst = plen / bs + k * (plen % bs + max_new - 1).div_ceil(bs);
        let c = cfg(worst, bs, 64);
        let mut s = Scheduler::<()>::new(c.clone()).unwrap();
        let mut f = Fake::new(&c);
        let p = prompt(plen, 3);
        let bp = BeamParams::new(k, max_new);
        f.add_beam(&mut s, 1, p.clone(), bp.clone());
        f.run(&mut s);
        let want = beam_search(&p, &bp, |beams| beams.iter().map(|b| logits(b)).collect()).unwrap();
        assert_eq!(f.done[&1], want, "prompt {plen}, {k} beams, {max_new} new");
    }
}

#[test]
fn beam_errors_name_the_field() {
    let c = cfg(64, 4, 64);
    let mut s = Scheduler::<()>::new(c).unwrap();
    let mut p = RequestParams::<()>::new(4);
    let req = |id, params: &RequestParams<()>| Request {
        id,
        prompt: vec![1, 2, 3],
        params: params.clone(),
    };
    assert_eq!(
        s.add_request(req(BEAM_ID_BASE + 3, &p)),
        Err(RequestError::ReservedId(BEAM_ID_BASE + 3))
    );
    p.beam_width = Some(0);
    assert!(s
        .add_request(req(1, &p))
        .unwrap_err()
        .to_string()
        .starts_with("beam_width"));
    p.beam_width = Some(25);
    assert!(s
        .add_request(req(1, &p))
        .unwrap_err()
        .to_string()
        .starts_with("beam_width"));
    p.beam_width = Some(2);
    s.add_request(req(1, &p)).unwrap();
    let plan = s.schedule().unwrap();
    let bad = |reorder: Vec<usize>, tokens: Vec<u32>| BeamStep {
        id: 1,
        reorder,
        tokens,
        finish: None,
    };
    for (step, msg) in [
        (bad(vec![0], vec![1]), "1 reorder entries"),
        (bad(vec![0, 1], vec![1, 1]), "reorder entry 1"),
        (bad(vec![0, 0], vec![1, 99]), "token 99"),
    ] {
        let e = s.update_with_beams(&plan, &[], &[step]).unwrap_err();
        assert!(e.to_string().contains(msg), "{e}");
    }
    assert_eq!(
        s.update_with_beams(&plan, &[], &[]),
        Err(SchedulerError::MissingToken(1))
    );
    s.update_with_beams(&plan, &[], &[bad(vec![0, 0], vec![1, 2])])
        .unwrap();
    // Aborting by the request id or a beam's id ends the whole group.
    let beam = s.beams(1).unwrap()[1];
    match s.abort(beam).unwrap() {
        Event::Finished { id, reason, .. } => assert_eq!((id, reason), (1, FinishReason::Abort)),
        e => panic!("{e:?}"),
    }
    assert!(!s.has_unfinished());
    assert_eq!(s.kv().stats().used_blocks, 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Beam and sampled requests arriving together in a small pool: sampled requests may be
    /// preempted, beams never; every request returns what it returns alone.
    #[test]
    fn beams_and_sampling_under_memory_pressure(
        reqs in proptest::collection::vec(
            (1usize..30, 1usize..14, prop::option::of((1usize..5, 0usize..3, -1.0f64..2.0))),
            1..7,
        ),
        num_blocks in 24usize..60,
        budget in 3usize..40,
    ) {
        let c = cfg(num_blocks, 4, budget);
        let mut s = Scheduler::<()>::new(c.clone()).unwrap();
        let mut f = Fake::new(&c);
        let mut want_beams = BTreeMap::new();
        let mut want_sampled = HashMap::new();
        for (i, &(plen, max_new, beam)) in reqs.iter().enumerate() {
            let id = i as u64 + 1;
            let p = prompt(plen, i as u32);
            match beam {
                Some((k, es, lp)) => {
                    let mut bp = BeamParams::new(k, max_new);
                    bp.eos_token_ids = vec![3];
                    bp.length_penalty = lp;
                    bp.num_return_sequences = k.min(2);
                    bp.early_stopping =
                        [EarlyStopping::True, EarlyStopping::False, EarlyStopping::Never][es];
                    let w = beam_search(&p, &bp, |b| b.iter().map(|x| logits(x)).collect()).unwrap();
                    // A request the pool can never hold is refused up front.
                    let mut rp = RequestParams::<()>::new(max_new);
                    rp.beam_width = Some(k);
                    if s.add_request(Request { id: 1000 + id, prompt: p.clone(), params: rp }).is_err() {
                        continue;
                    }
                    s.abort(1000 + id).unwrap();
                    f.add_beam(&mut s, id, p, bp);
                    want_beams.insert(id, w);
                }
                None => {
                    want_sampled.insert(id, alone_sampled(&p, max_new));
                    f.add_sampled(&mut s, id, p, max_new);
                }
            }
        }
        f.run(&mut s);
        prop_assert_eq!(&f.done, &want_beams);
        for (id, w) in &want_sampled {
            prop_assert_eq!(&f.sampled[id], w);
        }
        prop_assert_eq!(s.kv().stats().used_blocks, 0);
    }
}
