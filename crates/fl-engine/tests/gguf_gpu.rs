//! GGUF files on the GPU (tiny preset shapes): a llama GGUF written the way llama.cpp's
//! converter writes it (q / k rows interleaved per head) gives the logits the same weights
//! give from safetensors, in f32 and with Q8_0 projections (the safetensors side
//! holding their dequantised values), through `load::resolve` as `fl --model FILE.gguf` does.

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
