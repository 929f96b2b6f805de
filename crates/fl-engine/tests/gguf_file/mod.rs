//! Llama GGUF files for the tests, written the way llama.cpp's converter writes them (q / k
//! rows interleaved per head), each projection in a ggml type of the test's choosing.

use std::path::Path;

use fl_engine::checkpoint::llama_tensor_names;
use fl_engine::config::ModelConfig;
use fl_engine::gguf::model::{gguf_tensor_name, rotate_half_to_interleaved_rows};
use fl_engine::gguf::write::GgufWriter;
use fl_engine::gguf::{Array, GgmlType, Value};
use fl_engine::presets::preset;
use fl_kernels::ggml::GgmlType as KType;
use fl_kernels::reference::ggml::{dequantize_row, quantize_row};

/// Hugging Face name, row-major shape, values.
pub type Tensors = Vec<(String, Vec<usize>, Vec<f32>)>;

/// The tiny preset reshaped so that every projection's rows are whole K-quant super-blocks:
/// 2 layers, hidden 256, 4 query heads and 2 kv heads of 64, intermediate 512, vocabulary 256.
pub fn kquant_config() -> ModelConfig {
    let mut c = preset("tiny").expect("tiny preset");
    c.hidden_size = 256;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 64;
    c.intermediate_size = 512;
    c
}

/// Deterministic values of tensor `i`: norms near 1, the rest roughly normal with std 0.03.
fn values(n: usize, i: usize, norm: bool) -> Vec<f32> {
    let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut u = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    (0..n)
        .map(|_| {
            if norm {
                1.0 + 0.2 * u()
            } else {
                // Sum of four uniforms: var 4/12, so std 0.03 after scaling.
                (u() + u() + u() + u()) * 0.03 / (1.0f32 / 3.0).sqrt()
            }
        })
        .collect()
}

/// `v` (rows of `k` values) in ggml type `ty`, as bytes and as the exact values they stand
/// for.
pub fn encode(ty: GgmlType, v: &[f32], k: usize) -> (Vec<u8>, Vec<f32>) {
    if ty == GgmlType::F32 {
        return (v.iter().flat_map(|x| x.to_le_bytes()).collect(), v.to_vec());
    }
    let kt = KType::from_id(ty.id()).expect("a type with a reference");
    let (mut b, mut deq) = (vec![], vec![]);
    for row in v.chunks(k) {
        let q = quantize_row(kt, row).expect("quantize");
        deq.extend(dequantize_row(kt, &q, k).expect("dequantize"));
        b.extend(q);
    }
    (b, deq)
}

/// Writes a llama GGUF of `cfg` to `path`: tensor `name` (Hugging Face name) in type
/// `ty(name)` (norms always F32). Returns every tensor's exact values in Hugging Face order
/// (what the file stands for).
pub fn write_llama(path: &Path, cfg: &ModelConfig, ty: impl Fn(&str) -> GgmlType) -> Tensors {
    let mut w = GgufWriter::new();
    let u = |v: usize| Value::U32(v as u32);
    w.set("general.architecture", Value::String("llama".into()));
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
    let mut out = vec![];
    for (i, t) in llama_tensor_names(cfg).iter().enumerate() {
        let n: usize = t.shape.iter().product();
        let norm = t.shape.len() == 1;
        let k = *t.shape.last().expect("a shape");
        let rows = n / k;
        let tty = if norm { GgmlType::F32 } else { ty(&t.name) };
        let (bytes, exact) = encode(tty, &values(n, i, norm), k);
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
        w.add_tensor(&name, &dims, tty, bytes).expect("add");
        out.push((t.name.clone(), t.shape.clone(), exact));
    }
    w.write_file(path).expect("gguf");
    out
}

/// llama.cpp's Q4_K_M mix, as far as these shapes go: q, k, o, gate, up in Q4_K; v and down
/// in Q6_K; the rest F32.
pub fn q4_k_m(name: &str) -> GgmlType {
    if name.ends_with("v_proj.weight") || name.ends_with("down_proj.weight") {
        GgmlType::Q6_K
    } else if name.ends_with("_proj.weight") {
        GgmlType::Q4_K
    } else {
        GgmlType::F32
    }
}

/// Layer 0 in the Q4_K_M mix ([`q4_k_m`]); layer 1 all Q4_K but o in Q8_0 and down in Q5_0
/// (a type with no GEMV).
pub fn mixed(name: &str) -> GgmlType {
    if name.starts_with("model.layers.1.") {
        if name.ends_with("o_proj.weight") {
            return GgmlType::Q8_0;
        }
        if name.ends_with("down_proj.weight") {
            return GgmlType::Q5_0;
        }
        if name.ends_with("_proj.weight") {
            return GgmlType::Q4_K;
        }
    }
    q4_k_m(name)
}
