//! Tensor parallelism on two GPUs against one GPU: random LLaMA-shaped checkpoints (GQA with
//! key/value heads split, key/value heads replicated, Qwen2 biases, a vocabulary that does not
//! split), teacher-forced logits of several requests chunked and decoded together (CUDA
//! graphs with the NCCL calls captured), greedy and seeded sampled tokens, quantised shards, a
//! GGUF file's own blocks split, and a rank that fails mid-collective stopping the group
//! without a hang.
//!
//! Needs two GPUs: skipped with a notice otherwise, a failure with `FL_REQUIRE_TP=1`.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fl_engine::dtype::RunDType;
use fl_engine::runner::{RequestOptions, RunnerConfig};
use fl_engine::scheduler::{Event, Request, RequestParams};
use fl_engine::tp::{AnyEngine, TpEngine, TpOptions};
use fl_engine::{load, EngineError};
use fl_kernels::cudarc::driver::CudaContext;
use fl_kernels::f16;
use fl_kernels::testing::{rel_l2, to_f64};
use fl_sampling::SamplingParams;
use safetensors::tensor::TensorView;
use safetensors::Dtype;

#[allow(dead_code)] // this binary uses `serial` only
mod common;
use common::serial;

#[allow(dead_code)] // this binary writes one K-quant file
mod gguf_file;

/// Whether two GPUs and NCCL are here; `FL_REQUIRE_TP=1` makes their absence a failure.
fn two_gpus(test: &str) -> bool {
    let count = if fl_kernels::gpu_available() {
        CudaContext::device_count().unwrap_or(0)
    } else {
        0
    };
    let nccl = fl_engine::tp::nccl_available();
    if count >= 2 && nccl {
        return true;
    }
    let why = format!("{count} GPU(s), NCCL library found: {nccl}");
    if std::env::var("FL_REQUIRE_TP").is_ok_and(|v| v == "1") {
        panic!("{test}: FL_REQUIRE_TP=1 but {why}");
    }
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "SKIP {test}: needs 2 GPUs and NCCL ({why}; set FL_REQUIRE_TP=1 to make this a failure)"
    );
    false
}

/// A random checkpoint: `model_type` llama (or qwen2, with q/k/v biases), head_dim 64.
struct Spec {
    model_type: &'static str,
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    intermediate: usize,
    vocab: usize,
    layers: usize,
    tie: bool,
}

fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale
        })
        .collect()
}

fn write_checkpoint(dir: &Path, s: &Spec) {
    let d = 64;
    let cfg = serde_json::json!({
        "architectures": [if s.model_type == "qwen2" { "Qwen2ForCausalLM" } else { "LlamaForCausalLM" }],
        "model_type": s.model_type,
        "hidden_size": s.hidden,
        "intermediate_size": s.intermediate,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": d,
        "vocab_size": s.vocab,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": s.tie,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2
    });
    std::fs::write(dir.join("config.json"), cfg.to_string()).expect("config.json");
    let (h, q, kv, i) = (s.hidden, s.heads * d, s.kv_heads * d, s.intermediate);
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut seed = 11u64;
    let mut add = |name: String, shape: Vec<usize>, norm: bool| {
        seed += 1;
        let n: usize = shape.iter().product();
        let v = if norm {
            values(n, seed, 0.2).into_iter().map(|x| 1.0 + x).collect()
        } else {
            let fan_in = *shape.last().unwrap_or(&1) as f32;
            values(n, seed, 1.7 / fan_in.sqrt())
        };
        let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        tensors.push((name, shape, bytes));
    };
    add("model.embed_tokens.weight".into(), vec![s.vocab, h], false);
    for l in 0..s.layers {
        let p = format!("model.layers.{l}");
        add(format!("{p}.input_layernorm.weight"), vec![h], true);
        add(
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
            true,
        );
        for (n, rows) in [("q", q), ("k", kv), ("v", kv)] {
            add(
                format!("{p}.self_attn.{n}_proj.weight"),
                vec![rows, h],
                false,
            );
            if s.model_type == "qwen2" {
                add(format!("{p}.self_attn.{n}_proj.bias"), vec![rows], false);
            }
        }
        add(format!("{p}.self_attn.o_proj.weight"), vec![h, q], false);
        add(format!("{p}.mlp.gate_proj.weight"), vec![i, h], false);
        add(format!("{p}.mlp.up_proj.weight"), vec![i, h], false);
        add(format!("{p}.mlp.down_proj.weight"), vec![h, i], false);
    }
    add("model.norm.weight".into(), vec![h], true);
    if !s.tie {
        add("lm_head.weight".into(), vec![s.vocab, h], false);
    }
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, shape, b)| {
            let v = TensorView::new(Dtype::F32, shape.clone(), b).expect("view");
            (n.clone(), v)
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors"))
        .expect("model.safetensors");
}

fn prompt(n: usize, seed: u32, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 29 + seed * 131 + 3) % vocab as u32)
        .collect()
}

fn request(
    id: u64,
    prompt: Vec<u32>,
    new: usize,
    sampling: SamplingParams,
) -> Request<SamplingParams> {
    let mut params = RequestParams::<SamplingParams>::new(new);
    params.ignore_eos = true;
    params.seed = 1000 + id;
    params.sampling = sampling;
    Request { id, prompt, params }
}

/// Per request: its tokens and (for forced requests) its logits rows.
type Run = Vec<(Vec<u32>, Vec<Vec<f32>>)>;

/// Forced-logits requests (chunked under a small budget, sharing a prefix) plus seeded
/// sampled requests, on one runner over `e`; also counts the steps replayed from graphs.
fn run<T: RunDType>(e: &mut AnyEngine<T>, vocab: usize) -> (Run, usize) {
    let cfg = RunnerConfig {
        max_batched_tokens: 48,
        max_num_seqs: 8,
        max_model_len: Some(256),
        num_blocks: Some(128),
        ..Default::default()
    };
    let mut r = e.runner(&cfg).expect("runner");
    let shared = prompt(21, 2, vocab);
    let n_forced = 5u64;
    for i in 0..n_forced {
        let mut p = shared.clone();
        p.extend(prompt(1 + 11 * i as usize % 17, 40 + i as u32, vocab));
        let forced = prompt(5 + 2 * i as usize, 60 + i as u32, vocab);
        let opts = RequestOptions {
            forced: forced.clone(),
            logits: true,
        };
        r.add_request_with(
            request(i, p, forced.len() + 1, SamplingParams::greedy()),
            opts,
        )
        .expect("add forced");
    }
    let sampled = SamplingParams {
        temperature: 1.0,
        top_k: 40,
        top_p: 0.95,
        ..Default::default()
    };
    for i in n_forced..n_forced + 3 {
        let p = prompt(9 + i as usize, 80 + i as u32, vocab);
        r.add_request(request(i, p, 12, sampled))
            .expect("add sampled");
    }
    let mut tokens = vec![Vec::new(); (n_forced + 3) as usize];
    let mut graphs = 0;
    while r.has_unfinished() {
        for ev in r.step().expect("step") {
            if let Event::Token { id, token } = ev {
                tokens[id as usize].push(token);
            }
        }
        graphs += r.last_step().graph as usize;
    }
    let out = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let logits = if (i as u64) < n_forced {
                r.take_logits(i as u64).expect("kept logits")
            } else {
                Vec::new()
            };
            (t, logits)
        })
        .collect();
    (out, graphs)
}

fn compare<T: RunDType>(spec: &Spec, quant: &str, tol: f64, exact_tokens: bool) {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    write_checkpoint(dir.path(), spec);
    let label = format!("{quant} ({}, kv heads {})", spec.model_type, spec.kv_heads);
    compare_model::<T>(dir.path(), spec.vocab, quant, &label, tol, exact_tokens);
}

/// `--tp 2` against `--tp 1` on the model at `path` loaded in mode `quant` ([`compare`]).
fn compare_model<T: RunDType>(
    path: &Path,
    vocab: usize,
    quant: &str,
    label: &str,
    tol: f64,
    exact_tokens: bool,
) {
    let loaded =
        Arc::new(load::resolve(path.to_str().expect("utf-8 path"), quant).expect("resolve"));
    let (one, _) = {
        let mut e = load::any_engine::<T>(&loaded, 1, true).expect("tp 1");
        run(&mut e, vocab)
    };
    let (two, graphs) = {
        let mut e = load::any_engine::<T>(&loaded, 2, true).expect("tp 2");
        assert_eq!(e.tp(), 2);
        run(&mut e, vocab)
    };
    assert!(graphs > 0, "no tensor-parallel step replayed a CUDA graph");
    let mut worst = 0f64;
    for (i, ((t1, l1), (t2, l2))) in one.iter().zip(&two).enumerate() {
        assert_eq!(l1.len(), l2.len(), "request {i}: logits rows");
        for (a, b) in l1.iter().zip(l2) {
            worst = worst.max(rel_l2(b, &to_f64(a)));
        }
        {
            // Forced requests: the forced ids then the greedy last token; with exact_tokens
            // (f32) the sampled requests too.
            if exact_tokens {
                assert_eq!(
                    t1, t2,
                    "request {i}: tokens differ between --tp 1 and --tp 2"
                );
            }
        }
    }
    assert!(
        worst <= tol,
        "{} {label}: logits rel L2 --tp 2 vs --tp 1 {worst:.2e} > {tol:.0e}",
        T::NAME
    );
    eprintln!(
        "{} {label}: worst rel L2 {worst:.2e} (bound {tol:.0e})",
        T::NAME
    );
}

fn gqa() -> Spec {
    Spec {
        model_type: "llama",
        hidden: 256,
        heads: 4,
        kv_heads: 2,
        intermediate: 344,
        vocab: 1000,
        layers: 2,
        tie: false,
    }
}

#[test]
fn tp2_matches_tp1_f32_gqa() {
    if !two_gpus("tp2_matches_tp1_f32_gqa") {
        return;
    }
    compare::<f32>(&gqa(), "none", 1e-5, true);
}

#[test]
fn tp2_matches_tp1_f32_replicated_kv_odd_vocab_qwen2_tied() {
    if !two_gpus("tp2_matches_tp1_f32_replicated_kv_odd_vocab_qwen2_tied") {
        return;
    }
    let spec = Spec {
        model_type: "qwen2",
        hidden: 192,
        heads: 2,
        kv_heads: 1,
        intermediate: 250,
        vocab: 999,
        layers: 3,
        tie: true,
    };
    compare::<f32>(&spec, "none", 1e-5, true);
}

#[test]
fn tp2_matches_tp1_f16() {
    if !two_gpus("tp2_matches_tp1_f16") {
        return;
    }
    // Intermediate 344: 172 a rank, which the dense GEMV cannot read (k % 8), so the shards
    // decode on cuBLASLt; 512: 256 a rank, decode on the dense GEMV with the residual add
    // fused (rank 0 keeps h, the others zero it, the all-reduce sums).
    compare::<f16>(&gqa(), "none", 1e-2, false);
    let gemv = Spec {
        intermediate: 512,
        ..gqa()
    };
    compare::<f16>(&gemv, "none", 1e-2, false);
}

#[test]
fn tp2_quantised_shards_match_tp1() {
    if !two_gpus("tp2_quantised_shards_match_tp1") {
        return;
    }
    // Each rank quantises its own part: o/down's per-channel scales (int8) and groups (int4,
    // q4_0) cover the rank's columns only, so the two runs quantise differently.
    let spec = Spec {
        intermediate: 512,
        ..gqa()
    };
    for (q, tol) in [
        ("int8", 3e-2),
        ("int4-g64", 8e-2),
        ("q8_0", 3e-2),
        ("q4_0", 8e-2),
    ] {
        compare::<f16>(&spec, q, tol, false);
    }
}

/// A GGUF file's own blocks split over two GPUs (`--quant auto` = gguf): Q4_K_M's mix on the
/// tiny K-quant shape. Each rank keeps its rows' blocks; down's 256 columns per rank keep their
/// Q6_K blocks, o's 128 cut its Q4_K blocks and are requantised to Q8_0 per rank (the bound of
/// the q8_0 shards above).
#[test]
fn tp2_gguf_blocks_match_tp1() {
    if !two_gpus("tp2_gguf_blocks_match_tp1") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("q4_k_m.gguf");
    let cfg = gguf_file::kquant_config();
    gguf_file::write_llama(&path, &cfg, gguf_file::q4_k_m);
    compare_model::<f16>(&path, cfg.vocab_size, "auto", "gguf q4_k_m", 3e-2, false);
}

#[test]
fn tp_refuses_shapes_that_do_not_split() {
    if !two_gpus("tp_refuses_shapes_that_do_not_split") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = Spec {
        heads: 3,
        kv_heads: 3,
        hidden: 192,
        ..gqa()
    };
    write_checkpoint(dir.path(), &spec);
    let loaded =
        Arc::new(load::resolve(dir.path().to_str().expect("utf-8"), "none").expect("resolve"));
    match load::any_engine::<f16>(&loaded, 2, true) {
        Ok(_) => panic!("3 heads split over 2 GPUs"),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains("--tp") && msg.contains("num_attention_heads"),
                "{msg}"
            );
        }
    }
}

/// Rank 1 fails while rank 0 waits in an all-reduce that needs it: the call returns rank 1's
/// error within seconds (the communicators are aborted), and the group refuses later calls.
/// A 256 KiB message takes the one-shot all-reduce (where the GPUs have peer access), 4 MiB
/// NCCL's.
#[test]
fn failing_rank_stops_the_group_without_a_hang() {
    if !two_gpus("failing_rank_stops_the_group_without_a_hang") {
        return;
    }
    let _serial = serial();
    for elems in [1 << 17, 1 << 21] {
        failing_rank_in_all_reduce(elems);
    }
}

fn failing_rank_in_all_reduce(elems: usize) {
    let cfg = fl_engine::presets::preset("tiny").expect("tiny");
    let c = cfg.clone();
    let mut tp = TpEngine::<f16>::load(cfg, TpOptions::first(2), move |dev, comm| {
        fl_engine::engine::Engine::load_shard(
            dev,
            c.clone(),
            fl_engine::weights::WeightSource::Dummy { seed: 3 },
            fl_engine::linear::Quant::None,
            comm,
            None,
        )
    })
    .expect("tp load");
    let t0 = Instant::now();
    let res = tp.on_engines(move |e| {
        if e.model.shard().rank == 1 {
            return Err(EngineError::invalid("test", "rank 1 fails on purpose"));
        }
        let comm = e.model.comm().expect("a communicator");
        let stream = e.gpu().stream().clone();
        let mut t = fl_kernels::DeviceTensor::<f16>::zeros(&stream, &[elems])?;
        comm.all_reduce_sum(&stream, &mut t)?;
        stream.synchronize()?;
        Ok(())
    });
    let took = t0.elapsed();
    match res {
        Ok(_) => panic!("rank 1's error was lost"),
        Err(EngineError::Rank { rank, .. }) => assert_eq!(rank, 1),
        Err(e) => panic!("not a rank error: {e}"),
    }
    assert!(
        took < Duration::from_secs(20),
        "the failure took {took:?} to surface"
    );
    eprintln!("rank 1's failure surfaced after {took:?} ({elems} elements)");
    let again = tp.on_engines(|_| Ok(()));
    assert!(
        matches!(&again, Err(e) if e.to_string().contains("stopped")),
        "a stopped group accepted a call"
    );
}

/// A rank whose load fails (here: rank 1 only) fails `TpEngine::load` with that rank's error.
#[test]
fn failing_load_names_the_rank() {
    if !two_gpus("failing_load_names_the_rank") {
        return;
    }
    let _serial = serial();
    let cfg = fl_engine::presets::preset("tiny").expect("tiny");
    let c = cfg.clone();
    let res = TpEngine::<f16>::load(cfg, TpOptions::first(2), move |dev, comm| {
        if comm.rank() == 1 {
            return Err(EngineError::invalid("--model", "rank 1 cannot load"));
        }
        fl_engine::engine::Engine::load_shard(
            dev,
            c.clone(),
            fl_engine::weights::WeightSource::Dummy { seed: 3 },
            fl_engine::linear::Quant::None,
            comm,
            None,
        )
    });
    match res {
        Err(EngineError::Rank {
            rank: 1, source, ..
        }) => {
            assert!(source.to_string().contains("rank 1 cannot load"))
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a failed rank load was accepted"),
    }
}
