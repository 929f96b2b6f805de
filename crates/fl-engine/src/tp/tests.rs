//! The shard arithmetic, without a GPU: which heads, rows and columns each rank holds.

use super::Shard;
use crate::presets::preset;
use crate::weights::qkv_row_order;

fn cfg(name: &str) -> crate::config::ModelConfig {
    preset(name).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn new_refuses_empty_groups_and_ranks_outside() {
    assert!(Shard::new(0, 0).is_err());
    assert!(Shard::new(2, 2).is_err());
    assert_eq!(Shard::new(1, 2).map(|s| s.rank).ok(), Some(1));
    assert!(Shard::SINGLE.is_single());
}

#[test]
fn check_names_the_field_that_does_not_split() {
    let c = cfg("llama-2-13b"); // 40 heads, 13_824 intermediate
    assert!(Shard::new(0, 2).and_then(|s| s.check(&c)).is_ok());
    assert!(Shard::new(0, 8).and_then(|s| s.check(&c)).is_ok());
    let e = Shard::new(0, 3)
        .and_then(|s| s.check(&c))
        .err()
        .map(|e| e.to_string());
    let e = e.unwrap_or_default();
    assert!(
        e.contains("--tp") && e.contains("num_attention_heads"),
        "{e}"
    );
    // 8 kv heads over 16 ranks replicate; over 12 they neither divide nor replicate evenly.
    let mut g = cfg("llama-2-70b");
    assert!(Shard::new(0, 16).and_then(|s| s.check(&g)).is_ok());
    g.num_attention_heads = 96;
    g.head_dim = 8192 / 96;
    let e = Shard::new(0, 12)
        .and_then(|s| s.check(&g))
        .err()
        .map(|e| e.to_string());
    assert!(e.unwrap_or_default().contains("num_key_value_heads"));
    let mut i = cfg("tiny");
    i.intermediate_size = 351;
    let e = Shard::new(0, 2)
        .and_then(|s| s.check(&i))
        .err()
        .map(|e| e.to_string());
    assert!(e.unwrap_or_default().contains("intermediate_size"));
}

#[test]
fn local_config_divides_heads_and_width() {
    let c = cfg("llama-2-70b");
    let s = Shard::new(1, 2).unwrap_or(Shard::SINGLE);
    let l = s.local_config(&c);
    assert_eq!(l.num_attention_heads, 32);
    assert_eq!(l.num_key_value_heads, 4);
    assert_eq!(l.intermediate_size, 14_336);
    assert_eq!(
        (l.hidden_size, l.vocab_size, l.head_dim),
        (8192, 32_000, 128)
    );
    assert!(l.validate().is_ok());
    // More ranks than kv heads: one (replicated) kv head each.
    let s16 = Shard::new(5, 16).unwrap_or(Shard::SINGLE);
    assert_eq!(s16.local_config(&c).num_key_value_heads, 1);
}

#[test]
fn heads_partition_and_replicated_kv_heads_serve_their_q_heads() {
    let c = cfg("llama-2-70b"); // 64 q heads, 8 kv heads: group 8
    for n in [1, 2, 4, 8, 16, 32, 64] {
        let mut q_seen = vec![0; 64];
        let mut kv_seen = vec![0; 8];
        for r in 0..n {
            let s = Shard::new(r, n).unwrap_or(Shard::SINGLE);
            let q = s.q_heads(&c);
            let kv = s.kv_heads(&c);
            for h in q.clone() {
                q_seen[h] += 1;
                // Every q head of the rank reads a kv head the rank holds.
                assert!(
                    kv.contains(&(h / c.group_size())),
                    "n {n} rank {r} q head {h}"
                );
            }
            for h in kv {
                kv_seen[h] += 1;
            }
        }
        assert!(q_seen.iter().all(|&k| k == 1), "n {n}: q heads {q_seen:?}");
        let copies = (n / 8).max(1);
        assert!(
            kv_seen.iter().all(|&k| k == copies),
            "n {n}: kv heads {kv_seen:?}"
        );
    }
}

#[test]
fn qkv_rows_take_whole_heads_in_the_device_order() {
    let c = cfg("tiny"); // 2 q heads, 1 kv head, head_dim 64
    let order = qkv_row_order(&c).unwrap_or_default();
    let d = c.head_dim;
    let s0 = Shard::new(0, 2).unwrap_or(Shard::SINGLE);
    let s1 = Shard::new(1, 2).unwrap_or(Shard::SINGLE);
    let r0 = s0.qkv_rows(&c, &order);
    let r1 = s1.qkv_rows(&c, &order);
    // q head + the replicated k and v head each.
    assert_eq!(r0.len(), 3 * d);
    assert_eq!(&r0[..d], &order[..d]);
    assert_eq!(&r1[..d], &order[d..2 * d]);
    assert_eq!(&r0[d..], &r1[d..], "both ranks hold the one kv head");
    assert_eq!(&r0[d..], &order[2 * d..]);
    // Split kv heads: the ranks' rows partition the whole.
    let g = cfg("llama-2-70b");
    let order = qkv_row_order(&g).unwrap_or_default();
    let mut all: Vec<usize> = (0..4)
        .flat_map(|r| {
            Shard::new(r, 4)
                .unwrap_or(Shard::SINGLE)
                .qkv_rows(&g, &order)
        })
        .collect();
    all.sort_unstable();
    assert_eq!(all, (0..order.len()).collect::<Vec<_>>());
}

#[test]
fn gate_up_rows_and_vocab_slices() {
    let c = cfg("tiny"); // intermediate 352, vocab 256
    let s = Shard::new(1, 2).unwrap_or(Shard::SINGLE);
    let rows = s.gate_up_rows(&c);
    assert_eq!(rows.len(), 352);
    assert_eq!(rows[0], 176);
    assert_eq!(rows[176], 352 + 176);
    assert_eq!(s.vocab(&c), Some(128..256));
    assert_eq!(Shard::SINGLE.vocab(&c), None);
    let mut odd = c.clone();
    odd.vocab_size = 255;
    assert_eq!(
        s.vocab(&odd),
        None,
        "a vocabulary that does not split is replicated"
    );
}
