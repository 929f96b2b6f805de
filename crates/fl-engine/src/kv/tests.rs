use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

fn toks(n: usize, base: u32) -> Vec<u32> {
    (0..n as u32).map(|i| base + i).collect()
}

#[test]
fn sizing_helpers() {
    // llama-3-8b f16: 32 layers, 8 kv heads, head_dim 128, 16-token blocks = 2 MiB a block.
    let bpb = bytes_per_block(32, 8, 128, 2, 16);
    assert_eq!(bpb, 2 << 20);
    assert_eq!(blocks_for_memory(10 << 30, 0.5, bpb).unwrap(), 2560);
    assert_eq!(bytes_per_block(u64::MAX, 2, 1, 1, 1), u64::MAX);
    for bad in [0.0, -0.1, 1.5, f64::NAN] {
        let e = blocks_for_memory(1 << 30, bad, bpb).unwrap_err();
        assert!(
            matches!(
                e,
                KvError::Invalid {
                    arg: "fraction",
                    ..
                }
            ),
            "{e}"
        );
    }
    let e = blocks_for_memory(1 << 30, 0.9, 0).unwrap_err();
    assert!(e.to_string().starts_with("bytes_per_block"), "{e}");
    assert_eq!(blocks_needed(0, 16), 0);
    assert_eq!(blocks_needed(17, 16), 2);
}

#[test]
fn new_rejects_zero_sizes() {
    assert!(matches!(
        BlockManager::new(4, 0, true),
        Err(KvError::Invalid {
            arg: "block_size",
            ..
        })
    ));
    assert!(matches!(
        BlockManager::new(0, 16, true),
        Err(KvError::Invalid {
            arg: "num_blocks",
            ..
        })
    ));
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let mut m = BlockManager::new(4, 4, true).unwrap();
    assert_eq!(m.block_table(9), Err(KvError::UnknownSequence(9)));
    assert_eq!(m.append_slots(9, 1), Err(KvError::UnknownSequence(9)));
    assert_eq!(m.free(9), Err(KvError::UnknownSequence(9)));
    assert_eq!(m.fork(9, 10), Err(KvError::UnknownSequence(9)));
    assert!(matches!(
        m.allocate_prompt(1, &[], 4),
        Err(KvError::Invalid { arg: "prompt", .. })
    ));
    assert!(matches!(
        m.allocate_prompt(1, &[1], 0),
        Err(KvError::Invalid { arg: "budget", .. })
    ));
    m.allocate_prompt(1, &[1, 2, 3], 8).unwrap();
    assert_eq!(
        m.allocate_prompt(1, &[1], 8),
        Err(KvError::SequenceExists(1))
    );
    assert_eq!(m.fork(1, 1), Err(KvError::SequenceExists(1)));
    assert!(matches!(
        m.cache_full_blocks(1, &[1, 2, 3], 4),
        Err(KvError::Invalid {
            arg: "num_computed",
            ..
        })
    ));
    assert!(matches!(
        m.cache_full_blocks(1, &[1], 3),
        Err(KvError::Invalid { arg: "tokens", .. })
    ));
    // 3 tokens + 14 more = 17 tokens = 5 blocks > 4.
    let before = m.stats();
    assert_eq!(
        m.append_slots(1, 14),
        Err(KvError::NoSpace { needed: 4, free: 3 })
    );
    assert_eq!(m.stats(), before);
    assert_eq!(m.num_tokens(1), Ok(3));
    m.check_invariants().unwrap();
}

#[test]
fn allocate_append_free_counts_blocks() {
    let mut m = BlockManager::new(8, 4, false).unwrap();
    let a = m.allocate_prompt(1, &toks(10, 0), 6).unwrap();
    assert_eq!(
        a,
        Allocation {
            num_cached_tokens: 0,
            num_new_tokens: 6
        }
    );
    assert_eq!(m.block_table(1).unwrap(), &[0, 1]);
    assert!(m.append_slots(1, 4).unwrap().is_empty());
    assert_eq!(m.block_table(1).unwrap(), &[0, 1, 2]);
    assert_eq!(m.num_free_blocks(), 5);
    assert!(m.can_allocate(5) && !m.can_allocate(6));
    assert_eq!(m.free(1).unwrap(), vec![2, 1, 0]);
    assert_eq!(m.num_free_blocks(), 8);
    m.check_invariants().unwrap();
}

#[test]
fn prefix_hit_is_capped_at_len_minus_one() {
    let mut m = BlockManager::new(16, 4, true).unwrap();
    let p = toks(8, 100);
    m.allocate_prompt(1, &p, 8).unwrap();
    m.cache_full_blocks(1, &p, 8).unwrap();
    assert_eq!(m.stats().cached_blocks, 2);
    // The same 8-token prompt: only the first block may be reused (7 tokens -> 1 block).
    assert_eq!(m.cached_prefix_len(&p), 4);
    let a = m.allocate_prompt(2, &p, 100).unwrap();
    assert_eq!(
        a,
        Allocation {
            num_cached_tokens: 4,
            num_new_tokens: 4
        }
    );
    assert_eq!(m.block_table(2).unwrap()[0], m.block_table(1).unwrap()[0]);
    assert_ne!(m.block_table(2).unwrap()[1], m.block_table(1).unwrap()[1]);
    // One more token: both blocks hit.
    let mut q = p.clone();
    q.push(7);
    assert_eq!(m.allocate_prompt(3, &q, 100).unwrap().num_cached_tokens, 8);
    // A prompt diverging in block 1 hits block 0 only; in block 0, nothing.
    let mut r = p.clone();
    r[5] = 0;
    r.push(1);
    assert_eq!(m.cached_prefix_len(&r), 4);
    r[0] = 0;
    assert_eq!(m.cached_prefix_len(&r), 0);
    let s = m.stats();
    assert_eq!(
        (s.prefix_query_tokens, s.prefix_hit_tokens),
        (8 + 8 + 9, 4 + 8)
    );
    m.check_invariants().unwrap();
}

#[test]
fn prefix_cache_off_never_hits() {
    let mut m = BlockManager::new(16, 4, false).unwrap();
    let p = toks(9, 1);
    m.allocate_prompt(1, &p, 9).unwrap();
    m.cache_full_blocks(1, &p, 9).unwrap();
    assert_eq!(m.stats().cached_blocks, 0);
    assert_eq!(m.allocate_prompt(2, &p, 9).unwrap().num_cached_tokens, 0);
}

#[test]
fn unreferenced_cached_blocks_stay_until_evicted_lru_first() {
    let mut m = BlockManager::new(4, 2, true).unwrap();
    let a = [1, 2, 3, 4, 9];
    let b = [5, 6, 7, 8, 9];
    for (seq, p) in [(1, &a), (2, &b)] {
        m.allocate_prompt(seq, p, 4).unwrap();
        m.cache_full_blocks(seq, p, 4).unwrap();
    }
    // Free a, then b: LRU order is a's tail, a's head, b's tail, b's head.
    assert_eq!(m.free(1).unwrap(), vec![1, 0]);
    assert_eq!(m.free(2).unwrap(), vec![3, 2]);
    let s = m.stats();
    assert_eq!(
        (s.free_blocks, s.cached_blocks, s.cached_free_blocks),
        (4, 4, 4)
    );
    // A hit revives b's cached blocks; the slot for b's last token takes a fresh block,
    // evicting the least recently freed: block 1 (a's tail). a's head stays cached.
    assert_eq!(m.allocate_prompt(3, &b, 4).unwrap().num_cached_tokens, 4);
    assert_eq!(m.block_table(3).unwrap(), &[2, 3, 1]);
    assert_eq!(m.stats().evictions, 1);
    assert_eq!(m.cached_prefix_len(&a), 2, "a's head is still cached");
    // The next fresh block evicts block 0 (a's head).
    m.append_slots(3, 2).unwrap();
    assert_eq!(m.block_table(3).unwrap(), &[2, 3, 1, 0]);
    assert_eq!(m.cached_prefix_len(&a), 0);
    assert_eq!(m.stats().evictions, 2);
    assert_eq!(
        m.allocate_prompt(4, &[1], 1),
        Err(KvError::NoSpace { needed: 1, free: 0 })
    );
    m.check_invariants().unwrap();
}

#[test]
fn never_cached_free_blocks_are_used_before_evicting() {
    let mut m = BlockManager::new(4, 2, true).unwrap();
    m.allocate_prompt(1, &[1, 2, 3], 3).unwrap();
    m.cache_full_blocks(1, &[1, 2, 3], 3).unwrap();
    m.free(1).unwrap();
    // Block 0 is cached and free, block 1 plain free, blocks 2, 3 untouched.
    m.allocate_prompt(2, &[7, 7, 7, 7, 7], 5).unwrap();
    assert_eq!(m.stats().evictions, 0);
    assert_eq!(m.cached_prefix_len(&[1, 2, 3]), 2);
}

#[test]
fn duplicate_content_is_registered_once() {
    let mut m = BlockManager::new(8, 2, true).unwrap();
    let p = [1, 2, 3, 4, 5];
    m.allocate_prompt(1, &p, 5).unwrap();
    m.allocate_prompt(2, &p, 5).unwrap();
    m.cache_full_blocks(1, &p, 5).unwrap();
    m.cache_full_blocks(2, &p, 5).unwrap();
    assert_eq!(m.stats().cached_blocks, 2);
    assert_eq!(m.allocate_prompt(3, &p, 5).unwrap().num_cached_tokens, 4);
    assert_eq!(
        &m.block_table(3).unwrap()[..2],
        &m.block_table(1).unwrap()[..2]
    );
    m.check_invariants().unwrap();
}

#[test]
fn fork_shares_and_copy_on_write_splits_partial_block() {
    let mut m = BlockManager::new(8, 4, true).unwrap();
    m.allocate_prompt(1, &toks(6, 0), 6).unwrap();
    m.fork(1, 2).unwrap();
    assert_eq!(m.block_table(1).unwrap(), m.block_table(2).unwrap());
    assert_eq!((m.ref_count(0), m.ref_count(1)), (2, 2));
    // Parent appends into the shared partial block 1 (2 of 4 slots filled): copy first.
    let cow = m.append_slots(1, 1).unwrap();
    assert_eq!(
        cow,
        vec![CowCopy {
            src: 1,
            dst: 2,
            n_tokens: 2
        }]
    );
    assert_eq!(m.block_table(1).unwrap(), &[0, 2]);
    assert_eq!(m.block_table(2).unwrap(), &[0, 1]);
    assert_eq!((m.ref_count(0), m.ref_count(1), m.ref_count(2)), (2, 1, 1));
    // The child now owns block 1 alone: no copy.
    assert!(m.append_slots(2, 3).unwrap().is_empty());
    assert_eq!(m.block_table(2).unwrap(), &[0, 1, 3]);
    m.check_invariants().unwrap();
    // A full shared last block needs no copy either.
    m.fork(2, 3).unwrap();
    m.append_slots(2, 3).unwrap(); // 9 + 3 = 12: fills block 3 (shared, partial 1/4) -> copy
    m.fork(2, 4).unwrap(); // 12 tokens: last block full
    assert!(m.append_slots(4, 1).unwrap().is_empty());
    for s in 1..=4 {
        m.free(s).unwrap();
    }
    assert_eq!(m.num_free_blocks(), 8);
    m.check_invariants().unwrap();
}

#[test]
fn cow_without_space_changes_nothing() {
    let mut m = BlockManager::new(2, 4, false).unwrap();
    m.allocate_prompt(1, &toks(6, 0), 6).unwrap();
    m.fork(1, 2).unwrap();
    assert_eq!(
        m.append_slots(1, 1),
        Err(KvError::NoSpace { needed: 1, free: 0 })
    );
    assert_eq!(m.block_table(1).unwrap(), &[0, 1]);
    assert_eq!(m.num_tokens(1), Ok(6));
    m.check_invariants().unwrap();
}

#[test]
fn block_hash_is_fixed_and_chained() {
    // Pinned value: the hash must not change across runs, machines or releases.
    assert_eq!(
        block_hash(ROOT_HASH, &[1, 2, 3]),
        block_hash(ROOT_HASH, &[1, 2, 3])
    );
    assert_eq!(block_hash(ROOT_HASH, &[1, 2, 3]), 0x32d8_f661_c1ff_0549);
    assert_ne!(block_hash(ROOT_HASH, &[1, 2, 3]), block_hash(1, &[1, 2, 3]));
    assert_ne!(
        block_hash(ROOT_HASH, &[1, 2]),
        block_hash(ROOT_HASH, &[1, 2, 0])
    );
}

/// Simulated device memory: the token id each slot holds, to check that every table reads
/// back its sequence (prefix hits, copy-on-write and eviction included).
struct Sim {
    m: BlockManager,
    mem: Vec<Vec<Option<u32>>>,
    seqs: BTreeMap<SeqId, Vec<u32>>,
}

impl Sim {
    fn write(&mut self, seq: SeqId, from: usize) {
        let bs = self.m.block_size();
        let table = self.m.block_table(seq).unwrap().to_vec();
        for (p, &t) in self.seqs[&seq].iter().enumerate().skip(from) {
            self.mem[table[p / bs] as usize][p % bs] = Some(t);
        }
    }

    fn check(&self) {
        self.m.check_invariants().unwrap();
        let bs = self.m.block_size();
        for (&seq, tokens) in &self.seqs {
            let table = self.m.block_table(seq).unwrap();
            assert_eq!(self.m.num_tokens(seq).unwrap(), tokens.len());
            for (p, &t) in tokens.iter().enumerate() {
                assert_eq!(
                    self.mem[table[p / bs] as usize][p % bs],
                    Some(t),
                    "seq {seq} pos {p}"
                );
            }
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    New(Vec<u32>),
    Append(usize, Vec<u32>),
    Fork(usize),
    Free(usize),
}

fn op() -> impl Strategy<Value = Op> {
    // A 2-letter alphabet makes shared prefixes (and hits) common.
    let tokens = |n| prop::collection::vec(0u32..2, 1..n);
    prop_oneof![
        3 => tokens(14).prop_map(Op::New),
        4 => (any::<usize>(), tokens(6)).prop_map(|(i, t)| Op::Append(i, t)),
        2 => any::<usize>().prop_map(Op::Fork),
        2 => any::<usize>().prop_map(Op::Free),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random prompts, appends, forks and frees on a tiny pool: every invariant holds after
    /// every operation, every table reads back its own tokens, and a refused operation changes
    /// nothing.
    #[test]
    fn random_ops_keep_invariants_and_contents(
        num_blocks in 3usize..12,
        block_size in 1usize..5,
        prefix in any::<bool>(),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let m = BlockManager::new(num_blocks, block_size, prefix).unwrap();
        let mut sim = Sim { m, mem: vec![vec![None; block_size]; num_blocks], seqs: BTreeMap::new() };
        let mut next_id = 0;
        for op in ops {
            let ids: Vec<SeqId> = sim.seqs.keys().copied().collect();
            let pick = |i: usize| (!ids.is_empty()).then(|| ids[i % ids.len()]);
            let before = sim.m.stats();
            match op {
                Op::New(p) => {
                    next_id += 1;
                    let cached = sim.m.cached_prefix_len(&p);
                    match sim.m.allocate_prompt(next_id, &p, p.len()) {
                        Ok(a) => {
                            prop_assert_eq!(a.num_cached_tokens, cached);
                            prop_assert!(a.num_cached_tokens < p.len());
                            prop_assert_eq!(a.num_cached_tokens + a.num_new_tokens, p.len());
                            sim.seqs.insert(next_id, p.clone());
                            // The hit must already hold these tokens; compute the rest.
                            sim.write(next_id, a.num_cached_tokens);
                            sim.m.cache_full_blocks(next_id, &p, p.len()).unwrap();
                        }
                        Err(KvError::NoSpace { .. }) => prop_assert_eq!(sim.m.stats(), before),
                        Err(e) => prop_assert!(false, "{e}"),
                    }
                }
                Op::Append(i, t) => if let Some(s) = pick(i) {
                    let old = sim.seqs[&s].len();
                    match sim.m.append_slots(s, t.len()) {
                        Ok(copies) => {
                            for c in copies {
                                let src = sim.mem[c.src as usize].clone();
                                sim.mem[c.dst as usize][..c.n_tokens].copy_from_slice(&src[..c.n_tokens]);
                            }
                            sim.seqs.get_mut(&s).unwrap().extend(&t);
                            sim.write(s, old);
                            let all = sim.seqs[&s].clone();
                            sim.m.cache_full_blocks(s, &all, all.len()).unwrap();
                        }
                        Err(KvError::NoSpace { .. }) => prop_assert_eq!(sim.m.stats(), before),
                        Err(e) => prop_assert!(false, "{e}"),
                    }
                },
                Op::Fork(i) => if let Some(s) = pick(i) {
                    next_id += 1;
                    sim.m.fork(s, next_id).unwrap();
                    let t = sim.seqs[&s].clone();
                    sim.seqs.insert(next_id, t);
                },
                Op::Free(i) => if let Some(s) = pick(i) {
                    sim.m.free(s).unwrap();
                    sim.seqs.remove(&s);
                },
            }
            sim.check();
        }
        for s in sim.seqs.keys().copied().collect::<Vec<_>>() {
            sim.m.free(s).unwrap();
        }
        prop_assert_eq!(sim.m.num_free_blocks(), num_blocks);
        sim.m.check_invariants().unwrap();
    }
}
