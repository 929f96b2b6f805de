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

/// Row-major `[rows, k]` times `x [k]`.
fn matvec(w: &[f64], k: usize, x: &[f64]) -> Vec<f64> {
    w.chunks_exact(k)
        .map(|r| r.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

fn random(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = crate::trace::SplitMix64(seed);
    (0..n)
        .map(|_| (rng.next() >> 11) as f64 / (1u64 << 53) as f64 - 0.5)
        .collect()
}

/// Causal attention without RoPE over `t` tokens of one sequence: `qkv[t]` holds `hq` query
/// heads, then `hkv` key heads, then `hkv` value heads of width `d`; out `[t, hq * d]`.
fn attention(qkv: &[Vec<f64>], hq: usize, hkv: usize, d: usize) -> Vec<Vec<f64>> {
    let g = hq / hkv;
    (0..qkv.len())
        .map(|i| {
            let mut out = vec![0.0; hq * d];
            for h in 0..hq {
                let kv = h / g;
                let q = &qkv[i][h * d..(h + 1) * d];
                let s: Vec<f64> = (0..=i)
                    .map(|j| {
                        let k = &qkv[j][(hq + kv) * d..(hq + kv + 1) * d];
                        q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (d as f64).sqrt()
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for (j, w) in e.iter().enumerate() {
                    let v = &qkv[j][(hq + hkv + kv) * d..(hq + hkv + kv + 1) * d];
                    for (o, vv) in out[h * d..(h + 1) * d].iter_mut().zip(v) {
                        *o += w / z * vv;
                    }
                }
            }
            out
        })
        .collect()
}

/// The loader's shard plans, applied to a layer's weights on the host, compute the layer's
/// attention + o projection and SwiGLU MLP exactly as the whole weights do once the ranks'
/// row-parallel outputs are summed (the all-reduce), and the LM head once its vocabulary
/// slices are concatenated (the all-gather): GQA with kv heads split (2 ranks), replicated (4
/// ranks over 2 kv heads), and multi-head.
#[test]
fn shard_plans_reassemble_the_layer_on_the_host() {
    use crate::weights::ShardPlan;
    for (hq, hkv, n) in [(4, 2, 2), (4, 2, 4), (4, 4, 2), (8, 1, 4)] {
        let mut cfg = cfg("tiny");
        let d = 8;
        cfg.head_dim = d;
        cfg.num_attention_heads = hq;
        cfg.num_key_value_heads = hkv;
        cfg.hidden_size = 32;
        cfg.intermediate_size = 24;
        cfg.vocab_size = 12;
        let (h, i, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
        let rows_qkv = (hq + 2 * hkv) * d;
        let w_qkv = random(rows_qkv * h, 1); // checkpoint order [q; k; v]
        let w_o = random(h * hq * d, 2);
        let w_gu = random(2 * i * h, 3); // [gate; up]
        let w_down = random(h * i, 4);
        let w_lm = random(v * h, 5);
        let xs: Vec<Vec<f64>> = (0..3).map(|t| random(h, 10 + t)).collect();
        // The whole layer.
        let qkv: Vec<Vec<f64>> = xs.iter().map(|x| matvec(&w_qkv, h, x)).collect();
        let attn = attention(&qkv, hq, hkv, d);
        let o_full: Vec<Vec<f64>> = attn.iter().map(|a| matvec(&w_o, hq * d, a)).collect();
        let swiglu = |gu: &[f64]| -> Vec<f64> {
            let half = gu.len() / 2;
            (0..half)
                .map(|j| gu[j] / (1.0 + (-gu[j]).exp()) * gu[half + j])
                .collect()
        };
        let mlp_full: Vec<f64> = matvec(&w_down, i, &swiglu(&matvec(&w_gu, h, &xs[0])));
        let lm_full = matvec(&w_lm, h, &xs[0]);
        // The ranks.
        let (mut o_sum, mut mlp_sum) = (vec![vec![0.0; h]; 3], vec![0.0; h]);
        let mut lm_cat = Vec::new();
        for r in 0..n {
            let shard = Shard::new(r, n).unwrap_or(Shard::SINGLE);
            let local = shard.local_config(&cfg);
            let plan = ShardPlan::new(&cfg, shard).unwrap_or_else(|e| panic!("{e}"));
            let wq = plan.qkv().apply(w_qkv.clone(), h);
            let qkv_r: Vec<Vec<f64>> = xs.iter().map(|x| matvec(&wq, h, x)).collect();
            let attn_r = attention(
                &qkv_r,
                local.num_attention_heads,
                local.num_key_value_heads,
                d,
            );
            let wo = plan.o().apply(w_o.clone(), hq * d);
            for (t, a) in attn_r.iter().enumerate() {
                for (s, y) in o_sum[t].iter_mut().zip(matvec(&wo, local.q_size(), a)) {
                    *s += y;
                }
            }
            let wgu = plan.gate_up().apply(w_gu.clone(), h);
            let wd = plan.down().apply(w_down.clone(), i);
            let act = swiglu(&matvec(&wgu, h, &xs[0]));
            for (s, y) in mlp_sum
                .iter_mut()
                .zip(matvec(&wd, local.intermediate_size, &act))
            {
                *s += y;
            }
            let rows = plan.vocab_rows.clone().unwrap_or_else(|| (0..v).collect());
            let wl = crate::weights::Select {
                rows: Some(&rows),
                cols: None,
            }
            .apply(w_lm.clone(), h);
            lm_cat.extend(matvec(&wl, h, &xs[0]));
        }
        let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12);
        for t in 0..3 {
            assert!(
                close(&o_sum[t], &o_full[t]),
                "hq {hq} kv {hkv} n {n}: o, token {t}"
            );
        }
        assert!(close(&mlp_sum, &mlp_full), "hq {hq} kv {hkv} n {n}: mlp");
        assert!(close(&lm_cat, &lm_full), "hq {hq} kv {hkv} n {n}: lm head");
    }
}
