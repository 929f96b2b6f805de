//! GGUF files on the GPU (tiny preset shapes): a llama GGUF written the way llama.cpp's
//! converter writes it (q / k rows interleaved per head) gives the logits the same weights
//! give from safetensors, in f32 and with Q8_0 projections (the safetensors side
//! holding their dequantised values), through `load::resolve` as `fl --model FILE.gguf` does.
//! K-quant files (Q4_K_M's mix; one with Q8_0 and Q5_0 beside) on their own kernels
//! (`--quant auto`) against the same file dequantised to dense (`--quant none`).

use std::path::Path;

use fl_engine::checkpoint::llama_tensor_names;
use fl_engine::engine::{Engine, Request, StepNeeds};
use fl_engine::gguf::model::{gguf_tensor_name, rotate_half_to_interleaved_rows};
use fl_engine::gguf::write::GgufWriter;
use fl_engine::gguf::{Array, GgmlType, Value};
use fl_engine::load;
use fl_engine::presets::preset;
use fl_kernels::ggml::GgmlType as KType;
use fl_kernels::reference::ggml::{dequantize_row, quantize_row};
use fl_kernels::testing::{gpu_or_skip, rel_l2, to_f64};
use fl_sampling::SamplingParams;
use safetensors::tensor::TensorView;

#[allow(dead_code)] // this binary uses `serial` only
mod common;
use common::serial;

mod gguf_file;

/// Deterministic values of tensor `i` (norms near 1, the rest ~0.05).
fn values(n: usize, i: usize, norm: bool) -> Vec<f32> {
    let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let u = (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            if norm {
                1.0 + 0.2 * u
            } else {
                0.1 * u
            }
        })
        .collect()
}

fn is_projection(name: &str) -> bool {
    name.contains("_proj.weight")
}

/// Writes `dir/config.json` + `dir/model.safetensors` (Hugging Face layout) and
/// `dir/model.gguf` (llama.cpp layout, projections in `proj`); returns the GGUF path.
fn write_both(dir: &Path, proj: GgmlType) -> std::path::PathBuf {
    let cfg = preset("tiny").expect("tiny");
    let kproj = KType::from_id(proj as u32).expect("a type with a reference");
    let mut st: Vec<(String, Vec<usize>, Vec<u8>)> = vec![];
    let mut w = GgufWriter::new();
    let a = "llama";
    let u = |v: usize| Value::U32(v as u32);
    w.set("general.architecture", Value::String(a.into()));
    w.set("llama.context_length", u(cfg.max_position_embeddings));
    w.set("llama.embedding_length", u(cfg.hidden_size));
    w.set("llama.block_count", u(cfg.num_hidden_layers));
    w.set("llama.feed_forward_length", u(cfg.intermediate_size));
    w.set("llama.attention.head_count", u(cfg.num_attention_heads));
    w.set("llama.attention.head_count_kv", u(cfg.num_key_value_heads));
    w.set(
        "llama.attention.layer_norm_rms_epsilon",
        Value::F32(cfg.rms_norm_eps as f32),
    );
    w.set("llama.rope.dimension_count", u(cfg.head_dim));
    w.set("llama.rope.freq_base", Value::F32(cfg.rope_theta as f32));
    w.set("tokenizer.ggml.model", Value::String("llama".into()));
    let toks: Vec<String> = (0..cfg.vocab_size).map(|i| format!("t{i}")).collect();
    w.set("tokenizer.ggml.tokens", Value::Array(Array::String(toks)));
    w.set("tokenizer.ggml.bos_token_id", Value::U32(1));
    w.set("tokenizer.ggml.eos_token_id", Value::U32(2));
    for (i, t) in llama_tensor_names(&cfg).iter().enumerate() {
        let n: usize = t.shape.iter().product();
        let mut v = values(n, i, t.shape.len() == 1);
        let k = *t.shape.last().expect("a shape");
        let rows = n / k;
        let (ty, bytes) = if is_projection(&t.name) && proj != GgmlType::F32 {
            let mut b = vec![];
            let mut deq = vec![];
            for r in 0..rows {
                let q = quantize_row(kproj, &v[r * k..(r + 1) * k]).expect("quantize");
                deq.extend(dequantize_row(kproj, &q, k).expect("dequantize"));
                b.extend(q);
            }
            v = deq; // safetensors holds exactly what the GGUF stands for
            (proj, b)
        } else {
            (
                GgmlType::F32,
                v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            )
        };
        st.push((
            t.name.clone(),
            t.shape.clone(),
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ));
        // llama.cpp's converter interleaves the q / k rows of each head.
        let heads = if t.name.ends_with("q_proj.weight") {
            Some(cfg.num_attention_heads)
        } else if t.name.ends_with("k_proj.weight") {
            Some(cfg.num_key_value_heads)
        } else {
            None
        };
        let bytes = match heads {
            Some(h) => {
                let order = rotate_half_to_interleaved_rows(h, cfg.head_dim).expect("order");
                let rb = bytes.len() / rows;
                order
                    .iter()
                    .flat_map(|&r| bytes[r * rb..(r + 1) * rb].to_vec())
                    .collect()
            }
            None => bytes,
        };
        let dims: Vec<u64> = t.shape.iter().rev().map(|&d| d as u64).collect();
        let name = gguf_tensor_name(&t.name).expect("a GGUF name");
        w.add_tensor(&name, &dims, ty, bytes).expect("add");
    }
    let views: Vec<(String, TensorView<'_>)> = st
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                TensorView::new(safetensors::Dtype::F32, s.clone(), b).expect("view"),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).expect("st");
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
        "tie_word_embeddings": false, "torch_dtype": "float32",
        "bos_token_id": 1, "eos_token_id": 2
    });
    std::fs::write(dir.join("config.json"), config.to_string()).expect("config");
    let path = dir.join("model.gguf");
    w.write_file(&path).expect("gguf");
    path
}

/// Prefill + 6 teacher-forced decode steps of three ragged prompts: logits per step.
fn logits(model: &str) -> Vec<Vec<f32>> {
    let m = load::resolve(model, "none").expect("resolve");
    let mut e: Engine<f32> = load::engine(&m, true).expect("load");
    run(&mut e)
}

/// The requests of [`logits`] on `e`: prompts of 17, 1 and 5 tokens (a prefill past 16 tokens
/// runs a quantised weight dequantised into cuBLASLt; the decode of 3 tokens, the GEMV).
fn run<T: fl_engine::dtype::RunDType>(e: &mut Engine<T>) -> Vec<Vec<f32>> {
    let prompts: Vec<Vec<u32>> = vec![(3..20).collect(), vec![7], (40..45).collect()];
    let forced: Vec<Vec<u32>> = (0..3)
        .map(|b| (0..6).map(|s| 10 + b + 3 * s).collect())
        .collect();
    let req = Request {
        prompts,
        max_new_tokens: 7,
        sampling: vec![SamplingParams::greedy()],
        end_ids: vec![],
        ignore_eos: true,
        forced: Some(forced),
    };
    let mut out = vec![];
    let needs = StepNeeds {
        tokens: true,
        logits: true,
    };
    e.generate(&req, needs, &mut |s| {
        out.push(s.logits.expect("asked").to_vec());
        true
    })
    .expect("generate");
    out
}

fn same_logits(proj: GgmlType) {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tmp");
    let gguf = write_both(dir.path(), proj);
    let a = logits(gguf.to_str().expect("utf-8 path"));
    let b = logits(dir.path().to_str().expect("utf-8 path"));
    assert_eq!(a.len(), b.len());
    for (s, (x, y)) in a.iter().zip(&b).enumerate() {
        let err = rel_l2(x, &to_f64(y));
        assert!(
            err < 1e-6,
            "{proj:?} step {s}: GGUF vs safetensors relL2 {err:.2e}"
        );
    }
}

#[test]
fn gguf_f32_matches_safetensors() {
    if gpu_or_skip("gguf_f32_matches_safetensors").is_none() {
        return;
    }
    same_logits(GgmlType::F32);
}

#[test]
fn gguf_q8_0_matches_its_dequantised_weights() {
    if gpu_or_skip("gguf_q8_0_matches_its_dequantised_weights").is_none() {
        return;
    }
    same_logits(GgmlType::Q8_0);
}

/// What loading the GGUF at `path` in f16 with `--quant quant` gives: logits of [`run`], the
/// mode, and each layer's projections as `Linear`'s Debug prints them (`Linear::q6_k[512, 256]`).
fn f16_run(path: &Path, quant: &str) -> (Vec<Vec<f32>>, fl_engine::linear::Quant, Vec<String>) {
    let m = load::resolve(path.to_str().expect("utf-8 path"), quant).expect("resolve");
    let mut e: Engine<fl_kernels::f16> = load::engine(&m, true).expect("load");
    let linears = e
        .model
        .weights
        .layers
        .iter()
        .flat_map(|l| [&l.wqkv, &l.wo, &l.w_gate_up, &l.w_down])
        .map(|w| format!("{w:?}"))
        .collect();
    (run(&mut e), e.model.weights.quant, linears)
}

/// Writes a GGUF of `cfg` with projections in `ty(name)`, runs it on its own kernels
/// (`--quant auto`) and dense (`--quant none`), both in f16, and checks the logits.
///
/// - vs the twin (bound 1e-2): a file of F32 tensors holding exactly what the auto model
///   holds (the parts requantised by the stacked weights' rule, as `gguf::native::plan`
///   says); what differs is only the arithmetic (GEMV: f32 accumulation over exact
///   dequantised blocks, vs cuBLASLt on weights rounded to f16; f16 activations rounded at
///   every layer): quant_gpu.rs's bound for a quantised model vs the dense one on its
///   dequantised weights.
/// - vs `--quant none` on the file itself (bound 3e-2): the same plus the requantisation
///   (Q4_K q and k into Q6_K: 1.7e-2 relative on those weights, tests/gguf_native.rs).
///
/// Returns the projections as loaded.
fn auto_vs_dense(ty: impl Fn(&str) -> fl_engine::gguf::GgmlType, file: &str) -> Vec<String> {
    use fl_engine::gguf::model::hf_tensor_name;
    use fl_engine::gguf::native::{self, Form};
    use fl_engine::linear::Quant;
    let dir = tempfile::tempdir().expect("tmp");
    let cfg = gguf_file::kquant_config();
    let path = dir.path().join(file);
    let exact = gguf_file::write_llama(&path, &cfg, ty);
    // The twin: the values the auto model holds, every tensor F32.
    let mut held: std::collections::HashMap<String, Vec<f32>> = exact
        .iter()
        .map(|(name, _, v)| (name.clone(), v.clone()))
        .collect();
    let f = fl_engine::gguf::GgufFile::open(&path).expect("open");
    for p in native::plan(&f, &cfg).expect("plan") {
        let Form::Native(fmt) = p.form else { continue };
        let to = fmt.ggml_type().expect("a ggml format").id();
        for (name, t, _) in &p.parts {
            if native::tensor_form(*t) != p.form {
                let hf = hf_tensor_name(name).expect("an HF name");
                let v = &held[&hf];
                let to = GgmlType::from_id(to).expect("type");
                let requantised = gguf_file::encode(to, v, p.k).1;
                held.insert(hf, requantised);
            }
        }
    }
    drop(f);
    let twin = dir.path().join("twin.gguf");
    gguf_file::write_llama(&twin, &cfg, |_| GgmlType::F32);
    write_values(&twin, &cfg, &held);

    let (auto, q, linears) = f16_run(&path, "auto");
    assert_eq!(q, Quant::Gguf);
    let (dense, q, dense_linears) = f16_run(&path, "none");
    assert_eq!(q, Quant::None);
    assert!(dense_linears.iter().all(|l| l.starts_with("Linear::Dense")));
    let (twin_dense, _, _) = f16_run(&twin, "none");
    assert_eq!(auto.len(), dense.len());
    for (s, ((a, d), t)) in auto.iter().zip(&dense).zip(&twin_dense).enumerate() {
        let e_twin = rel_l2(a, &to_f64(t));
        let e_file = rel_l2(a, &to_f64(d));
        println!("{file} step {s}: vs twin {e_twin:.2e}, vs --quant none {e_file:.2e}");
        assert!(e_twin < 1e-2, "{file} step {s}: vs twin relL2 {e_twin:.2e}");
        assert!(
            e_file < 3e-2,
            "{file} step {s}: vs --quant none relL2 {e_file:.2e}"
        );
        assert!(
            a.iter().all(|v| v.is_finite()),
            "{file} step {s}: non-finite logits"
        );
    }
    linears
}

/// A Q4_K_M-style file (q, k, o, gate, up Q4_K; v, down Q6_K) on its own kernels.
#[test]
fn gguf_q4_k_m_runs_on_its_kernels() {
    if gpu_or_skip("gguf_q4_k_m_runs_on_its_kernels").is_none() {
        return;
    }
    let _serial = serial();
    let linears = auto_vs_dense(gguf_file::q4_k_m, "q4_k_m.gguf");
    let layer = [
        "q6_k[512, 256]",
        "q4_k[256, 256]",
        "q4_k[1024, 256]",
        "q6_k[256, 512]",
    ];
    let want: Vec<String> = (0..2)
        .flat_map(|_| layer.iter().map(|l| format!("Linear::{l}")))
        .collect();
    assert_eq!(linears, want);
}

/// Layer 0 as Q4_K_M, layer 1: q, k, v Q4_K (one stack, the file's blocks), o Q8_0, down
/// Q5_0 (no GEMV: dense beside quantised projections).
#[test]
fn gguf_mixed_types_run_per_projection() {
    if gpu_or_skip("gguf_mixed_types_run_per_projection").is_none() {
        return;
    }
    let _serial = serial();
    let linears = auto_vs_dense(gguf_file::mixed, "mixed.gguf");
    assert_eq!(
        linears[4..],
        [
            "Linear::q4_k[512, 256]",
            "Linear::q8_0[256, 256]",
            "Linear::q4_k[1024, 256]",
            "Linear::Dense[256, 512]",
        ]
    );
}

/// Rewrites the GGUF at `path` (every tensor F32, llama layout) with `values` (Hugging Face
/// order; q / k interleaved again as the converter does).
fn write_values(
    path: &Path,
    cfg: &fl_engine::config::ModelConfig,
    values: &std::collections::HashMap<String, Vec<f32>>,
) {
    let f = fl_engine::gguf::GgufFile::open(path).expect("open");
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata() {
        w.set(k, v.clone());
    }
    for t in llama_tensor_names(cfg) {
        let mut v = values[&t.name].clone();
        let heads = if t.name.ends_with("q_proj.weight") {
            Some(cfg.num_attention_heads)
        } else if t.name.ends_with("k_proj.weight") {
            Some(cfg.num_key_value_heads)
        } else {
            None
        };
        if let Some(h) = heads {
            let k = t.shape[1];
            let order = rotate_half_to_interleaved_rows(h, cfg.head_dim).expect("order");
            v = order
                .iter()
                .flat_map(|&r| v[r * k..(r + 1) * k].to_vec())
                .collect();
        }
        let dims: Vec<u64> = t.shape.iter().rev().map(|&d| d as u64).collect();
        let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let name = gguf_tensor_name(&t.name).expect("a GGUF name");
        w.add_tensor(&name, &dims, GgmlType::F32, bytes)
            .expect("add");
    }
    drop(f);
    w.write_file(path).expect("gguf");
}
