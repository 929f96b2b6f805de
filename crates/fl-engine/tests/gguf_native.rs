//! A GGUF file on its own formats (`--quant auto` / `gguf`), on the CPU: which tensor becomes
//! which `Linear`, the notices, the stacked weights' rule and its cost, and the host bytes
//! (the file's blocks, rows un-permuted exactly).

use fl_engine::gguf::native::{self, stack_form, tensor_form, Form};
use fl_engine::gguf::GgmlType::*;
use fl_engine::gguf::GgufFile;
use fl_engine::linear::Quant;
use fl_engine::load;
use fl_engine::weights::qkv_row_order;
use fl_kernels::gemv::QuantFormat;
use fl_kernels::ggml::GgmlType as KType;
use fl_kernels::reference::ggml::{dequantize_row, quantize_row};
use fl_kernels::testing::{normal, rel_l2_f64, rng};

#[allow(dead_code)] // this binary writes files, it does not encode tensors alone
mod gguf_file;
use gguf_file::{kquant_config, mixed, q4_k_m, write_llama, Tensors};

fn values<'t>(t: &'t Tensors, name: &str) -> &'t [f32] {
    &t.iter().find(|x| x.0 == name).expect("tensor").2
}

#[test]
fn tensor_and_stack_forms() {
    let f = |q| Form::Native(q);
    assert_eq!(tensor_form(Q8_0), f(QuantFormat::Q8_0));
    assert_eq!(tensor_form(Q4_0), f(QuantFormat::Q4_0));
    assert_eq!(tensor_form(Q4_K), f(QuantFormat::Q4_K));
    assert_eq!(tensor_form(Q5_K), f(QuantFormat::Q5_K));
    assert_eq!(tensor_form(Q6_K), f(QuantFormat::Q6_K));
    for dense in [F32, F16, BF16, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q8_K] {
        assert_eq!(tensor_form(dense), Form::Dense, "{dense:?}");
    }
    // The ladder Q4_0 < Q4_K < Q5_K < Q6_K < Q8_0 < dense.
    let ladder = [Q4_0, Q4_K, Q5_K, Q6_K, Q8_0, F16];
    for (i, &a) in ladder.iter().enumerate() {
        for &b in &ladder[i..] {
            assert_eq!(stack_form(&[a, b, a]), tensor_form(b), "{a:?} {b:?}");
            assert_eq!(stack_form(&[b, a]), tensor_form(b), "{a:?} {b:?}");
        }
    }
    assert_eq!(stack_form(&[Q4_K, Q4_K, Q6_K]), f(QuantFormat::Q6_K));
    assert_eq!(stack_form(&[Q8_0, Q5_1]), Form::Dense);
    assert_eq!(stack_form(&[]), Form::Dense);
}

/// `native::plan` of the tiny K-quant model written with projection types `ty`.
fn plan_of(ty: impl Fn(&str) -> fl_engine::gguf::GgmlType) -> Vec<native::Projection> {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("m.gguf");
    write_llama(&path, &kquant_config(), ty);
    let f = GgufFile::open(&path).expect("open");
    native::plan(&f, &kquant_config()).expect("plan")
}

#[test]
fn plan_names_each_projection_form_and_the_notices() {
    let cfg = kquant_config();
    let plan = plan_of(mixed);
    let forms: Vec<(usize, Form)> = plan.iter().map(|p| (p.layer, p.form)).collect();
    let q = Form::Native;
    assert_eq!(
        forms,
        [
            (0, q(QuantFormat::Q6_K)), // q, k Q4_K + v Q6_K
            (0, q(QuantFormat::Q4_K)), // o
            (0, q(QuantFormat::Q4_K)), // gate, up
            (0, q(QuantFormat::Q6_K)), // down
            (1, q(QuantFormat::Q4_K)), // q, k, v all Q4_K: the file's blocks
            (1, q(QuantFormat::Q8_0)), // o
            (1, q(QuantFormat::Q4_K)),
            (1, Form::Dense), // down Q5_0: no GEMV
        ]
    );
    let names: Vec<&str> = plan[0].parts.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "blk.0.attn_q.weight",
            "blk.0.attn_k.weight",
            "blk.0.attn_v.weight"
        ]
    );
    assert_eq!((plan[0].n(), plan[0].k), (256 + 2 * 128, 256));
    assert_eq!((plan[3].n(), plan[3].k), (256, 512));

    let notes = native::notices(&plan);
    assert_eq!(notes.len(), 2, "{notes:#?}");
    assert!(
        notes[0].starts_with("q4_K tensor blk.0.attn_q.weight and 1 more: ")
            && notes[0].contains("requantised to q6_k"),
        "{}",
        notes[0]
    );
    assert!(
        notes[1].starts_with("q5_0 tensor blk.1.ffn_down.weight: ")
            && notes[1].contains("dequantised to the run dtype"),
        "{}",
        notes[1]
    );

    // Bytes: each projection at its form's size, the rest dense.
    let (h, kv, i) = (256usize, 128usize, 512usize);
    let kq = |fmt: QuantFormat, n: usize, k: usize| fmt.weight_bytes(n, k) as u64;
    let layer0 = kq(QuantFormat::Q6_K, h + 2 * kv, h)
        + kq(QuantFormat::Q4_K, h, h)
        + kq(QuantFormat::Q4_K, 2 * i, h)
        + kq(QuantFormat::Q6_K, h, i);
    let layer1 = kq(QuantFormat::Q4_K, h + 2 * kv, h)
        + kq(QuantFormat::Q8_0, h, h)
        + kq(QuantFormat::Q4_K, 2 * i, h)
        + (h * i * 2) as u64;
    let projections_dense = 2 * ((h + 2 * kv) * h + h * h + 2 * i * h + h * i) as u64 * 2;
    assert_eq!(
        native::weight_bytes(&plan, &cfg, 2),
        cfg.weight_bytes(2) - projections_dense + layer0 + layer1
    );
    // Quant::Gguf's estimate without the file is a lower bound.
    assert!(Quant::Gguf.weight_bytes(&cfg, 2) <= native::weight_bytes(&plan, &cfg, 2));

    // A file whose stacks all hold one type says nothing.
    let one_type = plan_of(|n| {
        if n.ends_with("_proj.weight") {
            Q4_K
        } else {
            F32
        }
    });
    assert!(native::notices(&one_type).is_empty());
}

#[test]
fn stacks_hold_the_files_blocks_with_rows_unpermuted() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("m.gguf");
    let cfg = kquant_config();
    let exact = write_llama(&path, &cfg, mixed);
    let f = GgufFile::open(&path).expect("open");
    let order = qkv_row_order(&cfg).expect("order");
    let parts = |l: usize, names: &[&str]| -> Vec<(String, Vec<usize>)> {
        names
            .iter()
            .map(|n| {
                let name = format!("model.layers.{l}.{n}");
                let shape = exact
                    .iter()
                    .find(|t| t.0 == name)
                    .expect("tensor")
                    .1
                    .clone();
                (name, shape)
            })
            .collect()
    };
    let qkv = [
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
    ];
    let deq = |w: &fl_kernels::gemv::QuantizedHost| -> Vec<f32> {
        fl_kernels::reference::gemv::dequantize(w)
            .iter()
            .map(|&v| v as f32)
            .collect()
    };
    let stacked = |l: usize, names: &[&str], order: Option<&[usize]>| -> Vec<f32> {
        let mut v: Vec<f32> = vec![];
        for n in names {
            v.extend(values(&exact, &format!("model.layers.{l}.{n}")));
        }
        match order {
            Some(o) => {
                let row = v.len() / o.len();
                o.iter()
                    .flat_map(|&r| v[r * row..(r + 1) * row].to_vec())
                    .collect()
            }
            None => v,
        }
    };

    // Layer 1: q, k, v all Q4_K: the file's blocks, so the values are exactly the file's
    // (q / k un-permuted, then the engine's order).
    let w = native::stacked_host(&f, &parts(1, &qkv), QuantFormat::Q4_K, Some(&order), 64)
        .expect("stack");
    assert_eq!((w.n(), w.k()), (512, 256));
    assert_eq!(deq(&w), stacked(1, &qkv, Some(&order)));
    // v's rows keep their place at the end: its bytes are the file's.
    let v_bytes = f
        .tensor_data(f.tensor("blk.1.attn_v.weight").expect("v"))
        .expect("bytes");
    assert_eq!(&w.data()[w.data().len() - v_bytes.len()..], v_bytes);
    // Single tensors: o in Q8_0, down (layer 0) in Q6_K.
    let o = native::stacked_host(
        &f,
        &parts(1, &["self_attn.o_proj.weight"]),
        QuantFormat::Q8_0,
        None,
        64,
    )
    .expect("o");
    let o_file = f
        .tensor_data(f.tensor("blk.1.attn_output.weight").expect("o"))
        .expect("bytes");
    assert_eq!(o.data(), o_file);
    let gu = ["mlp.gate_proj.weight", "mlp.up_proj.weight"];
    let g = native::stacked_host(&f, &parts(0, &gu), QuantFormat::Q4_K, None, 64).expect("gu");
    assert_eq!(deq(&g), stacked(0, &gu, None));

    // Layer 0: v Q6_K keeps its bytes; q, k are requantised into Q6_K from their exact values.
    let w = native::stacked_host(&f, &parts(0, &qkv), QuantFormat::Q6_K, Some(&order), 64)
        .expect("stack");
    let v_bytes = f
        .tensor_data(f.tensor("blk.0.attn_v.weight").expect("v"))
        .expect("bytes");
    assert_eq!(&w.data()[w.data().len() - v_bytes.len()..], v_bytes);
    let want = stacked(0, &qkv, Some(&order));
    let got = deq(&w);
    let qk = (256 + 128) * 256;
    let e = rel_l2_f32(&got[..qk], &want[..qk]);
    // Q6_K's error on values already on a Q4_K grid (see below): ~1.7e-2, and not zero.
    assert!(
        e > 1e-4 && e < 3e-2,
        "q/k requantised to Q6_K: rel L2 {e:.2e}"
    );
    assert_eq!(&got[qk..], &want[qk..]);
}

fn rel_l2_f32(a: &[f32], b: &[f32]) -> f64 {
    let a: Vec<f64> = a.iter().map(|&x| x as f64).collect();
    let b: Vec<f64> = b.iter().map(|&x| x as f64).collect();
    rel_l2_f64(&a, &b)
}

/// What the mixed-stack rule costs: Q4_K weights (Q4_K_M's q and k) requantised into Q6_K
/// (the v part's format) from their exact values, on N(0, 0.02²) weights, rows of 4096.
/// Prints the figures the module docs of `gguf::native` quote.
#[test]
fn cost_of_requantising_q4_k_into_q6_k() {
    let mut r = rng("q4_k_into_q6_k");
    let k = 4096;
    let w = normal(&mut r, 64 * k, 0.02);
    let round = |ty: KType, v: &[f32]| -> Vec<f32> {
        v.chunks(k)
            .flat_map(|row| {
                dequantize_row(ty, &quantize_row(ty, row).expect("quantize"), k).expect("deq")
            })
            .collect()
    };
    let file = round(KType::Q4_K, &w); // what a Q4_K tensor stands for
    let held = round(KType::Q6_K, &file); // what the Q6_K stack holds for it
    let own = rel_l2_f32(&file, &w); // the file's own quantisation error
    let added = rel_l2_f32(&held, &file); // what the rule adds, vs the file's values
    let total = rel_l2_f32(&held, &w);
    let q6 = rel_l2_f32(&round(KType::Q6_K, &w), &w);
    println!(
        "Q4_K vs f32 {own:.4}; Q6_K(Q4_K) vs Q4_K {added:.4} ({:.0}% of Q4_K's own); \
         Q6_K(Q4_K) vs f32 {total:.4}; Q6_K vs f32 {q6:.4}",
        100.0 * added / own
    );
    assert!(own > 0.02 && own < 0.08, "Q4_K error {own}");
    assert!(added < 0.35 * own, "requantising adds {added} to {own}");
    // Errors add in quadrature (independent): the total barely moves.
    assert!(total < 1.06 * own, "{total} vs {own}");
}

#[test]
fn quant_values_resolve_per_model_kind() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("m.gguf");
    let cfg = kquant_config();
    write_llama(&path, &cfg, q4_k_m);
    let p = path.to_str().expect("utf-8");
    let q = |model: &str, quant: &str| load::resolve(model, quant).map(|l| l.quant);
    assert_eq!(q(p, "auto").expect("auto"), Quant::Gguf);
    assert_eq!(q(p, "gguf").expect("gguf"), Quant::Gguf);
    assert_eq!(q(p, "none").expect("none"), Quant::None);
    assert_eq!(
        q(p, "q4_k").expect("q4_k"),
        Quant::WeightOnly(QuantFormat::Q4_K)
    );
    assert_eq!(q("tiny", "auto").expect("tiny"), Quant::None);
    let e = q("tiny", "gguf").expect_err("gguf on a preset");
    assert!(
        matches!(&e, fl_engine::EngineError::Invalid { arg: "--quant", .. }),
        "{e}"
    );
    let e = q(p, "q3_k").expect_err("q3_k").to_string();
    assert!(e.contains("auto") && e.contains("q6_k"), "{e}");
    // Every --quant value of fl: auto, gguf, then the quantise-on-load modes.
    assert_eq!(&load::QUANT_ARGS[..2], ["auto", "gguf"]);
    assert_eq!(&load::QUANT_ARGS[2..], Quant::NAMES);
    // The K-quants through the parser, on a preset of real shapes.
    for name in ["q4_k", "q5_k", "q6_k"] {
        let l = load::resolve("llama-2-7b", name).expect(name);
        assert_eq!(l.quant.name(), name);
    }
    // ... and refused where the rows are not whole super-blocks (tiny: hidden 128).
    let e = load::resolve("tiny", "q4_k")
        .err()
        .expect("q4_k on tiny")
        .to_string();
    assert!(e.contains("256"), "{e}");
}

#[test]
fn dense_path_is_the_files_exact_values() {
    // `--quant none` (and every tensor the plan keeps dense) reads tensor_f32: exact ggml
    // dequantisation, q / k rows un-permuted.
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("m.gguf");
    let cfg = kquant_config();
    let exact = write_llama(&path, &cfg, mixed);
    let f = GgufFile::open(&path).expect("open");
    for (name, shape, v) in &exact {
        let got = native::tensor_f32(&f, name, shape, cfg.head_dim).expect("tensor_f32");
        assert_eq!(&got, v, "{name}");
    }
}

/// One tensor-parallel rank's part of a weight in the file's blocks (`native::select_host`):
/// any subset of rows in any order and whole-block columns give exactly the same values as
/// the whole weight's dequantisation, selected; columns that cut a block are refused, naming
/// them. Every format the GEMV keeps from a file.
#[test]
fn shard_parts_keep_the_files_blocks_exactly() {
    let mut r = rng("shard_parts");
    let (n, k) = (7, 768);
    let w = normal(&mut r, n * k, 0.03);
    let rows = [6usize, 0, 3, 4];
    for (format, block) in [
        (QuantFormat::Q8_0, 32),
        (QuantFormat::Q4_0, 32),
        (QuantFormat::Q4_K, 256),
        (QuantFormat::Q5_K, 256),
        (QuantFormat::Q6_K, 256),
    ] {
        let q = fl_kernels::gemv::quantize(&w, n, k, format).expect("quantize");
        let whole = fl_kernels::reference::gemv::dequantize(&q);
        for cols in [0..k, block..k, 0..2 * block, block..3 * block] {
            let part = native::select_host(&q, Some(&rows), Some(cols.clone())).expect("select");
            assert_eq!((part.n(), part.k()), (rows.len(), cols.len()));
            let got = fl_kernels::reference::gemv::dequantize(&part);
            let want: Vec<f64> = rows
                .iter()
                .flat_map(|&row| whole[row * k + cols.start..row * k + cols.end].to_vec())
                .collect();
            assert_eq!(got, want, "{} rows {rows:?} cols {cols:?}", format.name());
        }
        // All rows, all columns: the weight itself.
        let all = native::select_host(&q, None, None).expect("all");
        assert_eq!(all.data(), q.data());
        // Columns that cut a block, and a row past the end.
        let cut = block / 2..k;
        let e = native::select_host(&q, None, Some(cut.clone())).expect_err("cut block");
        assert!(
            e.to_string().contains(&format!("{cut:?}")),
            "{}: {e}",
            format.name()
        );
        let e = native::select_host(&q, Some(&[n]), None).expect_err("row past the end");
        assert!(e.to_string().contains("row 7"), "{}: {e}", format.name());
        assert!(native::cols_on_blocks(format, Some(&(block..2 * block))));
        assert!(!native::cols_on_blocks(format, Some(&(0..block + 16))));
    }
}

/// At `--tp 2` the tiny K-quant model's o projection (128 columns per rank) cuts its Q4_K
/// blocks and goes to Q8_0; down (256 per rank) keeps its Q6_K blocks; nothing changes at
/// `--tp 1`.
#[test]
fn shard_notices_name_the_column_splits_that_cut_blocks() {
    let plan = plan_of(q4_k_m);
    assert!(native::shard_notices(&plan, 1).is_empty());
    let n = native::shard_notices(&plan, 2);
    assert_eq!(n.len(), 1, "{n:?}");
    assert!(
        n[0].starts_with("q4_k tensor blk.0.attn_output.weight and 1 more: 128 columns")
            && n[0].contains("q8_0"),
        "{}",
        n[0]
    );
}
