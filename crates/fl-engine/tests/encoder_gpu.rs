//! The encoder's GPU forward ([`EncoderModel`]) against the CPU reference
//! ([`reference::forward`], itself checked against transformers by `encoder_reference.rs`).
//!
//! - tiny random encoders built in memory (BERT and XLM-RoBERTa, both GELU forms, head dims
//!   32 / 64 / 128, 2 layers) over a ragged batch with lengths 1, 7, 63, 64, 65 and 129 (across
//!   the attention's 64-token tiles and the wgmma kernel's 128-token boxes), and a batch of
//!   one token: f32 within rel L2 1e-5 of the reference, f16 within 5e-3 and bf16 within 4e-2 (8x f16's: bf16 keeps 3 fewer mantissa bits)
//!   of the f32 reference; CLS / mean / last-token pooling of the read-back states, cosine >=
//!   0.9999 in f16 (0.999 in bf16);
//! - every output buffer is poisoned with NaN before the forward;
//! - the fixtures of `tests/data/encoder/` (transformers' outputs on tiny random models): at
//!   head dims 12 and 7, which the attention kernel does not run, the error names
//!   `hidden_size` and `num_attention_heads` (without a GPU too); at head dims 32 and 64
//!   (`bert_hd32_erf`, `xlmr_cls_hd64_tanh`, a sequence of 65 / 67 tokens each) the last
//!   hidden state, its poolings, BERT's pooler and the logits (host heads on the read-back
//!   states) against transformers within rel L2 1e-5 in f32 and 5e-3 in f16;
//! - INT8 (per-token and calibrated static scales) against f32: pooled cosine >= 0.99, on the
//!   random encoders and on BERT-base's shape;
//! - bad arguments are errors naming them, before any launch.
//!
//! GPU tests print SKIP without a GPU; `FL_REQUIRE_GPU=1` makes that a failure.

use std::path::{Path, PathBuf};

use fl_blas::Blas;
use fl_engine::checkpoint::Checkpoint;
use fl_engine::dtype::RunDType;
use fl_engine::encoder::calibrate::AmaxKind;
use fl_engine::encoder::gpu::EncoderQuant;
use fl_engine::encoder::weights::{Dense, EncoderLayerWeights, LayerNorm};
use fl_engine::encoder::{
    presets, reference, DeviceBatch, EncoderConfig, EncoderModel, EncoderWeights, PackedBatch,
    Pooling,
};
use fl_engine::EngineError;
use fl_kernels::attention_prefill::PREFILL_BIDIRECTIONAL_HEAD_DIMS;
use fl_kernels::testing::{gpu_or_skip, normal, rel_l2, rng, to_f64};
use fl_kernels::{bf16, f16, DeviceTensor, Gpu};
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::{json, Value};

/// Shape of a random encoder.
struct Spec {
    model_type: &'static str,
    hidden: usize,
    heads: usize,
    intermediate: usize,
    act: &'static str,
}

fn config(s: &Spec) -> EncoderConfig {
    let roberta = s.model_type != "bert";
    let v = json!({
        "model_type": s.model_type,
        "vocab_size": 97,
        "hidden_size": s.hidden,
        "num_hidden_layers": 2,
        "num_attention_heads": s.heads,
        "intermediate_size": s.intermediate,
        "hidden_act": s.act,
        // Covers 129 tokens after RoBERTa's offset of pad + 1 = 2.
        "max_position_embeddings": 160,
        "type_vocab_size": if roberta { 1 } else { 2 },
        "layer_norm_eps": if roberta { 1e-5 } else { 1e-12 },
        "pad_token_id": if roberta { 1 } else { 0 },
    });
    EncoderConfig::from_json_value(&v).expect("random encoder config")
}

/// A linear layer with weights ~ N(0, 1/in) (scores and activations of order 1, so softmax
/// and GELU are exercised away from their flat regions) and biases ~ N(0, 0.1²).
fn dense(r: &mut StdRng, out_features: usize, in_features: usize) -> Dense {
    Dense {
        weight: normal(
            r,
            out_features * in_features,
            1.0 / (in_features as f64).sqrt(),
        ),
        bias: normal(r, out_features, 0.1),
        out_features,
        in_features,
    }
}

fn layer_norm(r: &mut StdRng, hidden: usize) -> LayerNorm {
    LayerNorm {
        weight: normal(r, hidden, 0.1).iter().map(|v| 1.0 + v).collect(),
        bias: normal(r, hidden, 0.1),
    }
}

fn weights(r: &mut StdRng, cfg: &EncoderConfig) -> EncoderWeights {
    let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
    let layers = (0..cfg.num_hidden_layers)
        .map(|_| EncoderLayerWeights {
            query: dense(r, h, h),
            key: dense(r, h, h),
            value: dense(r, h, h),
            attn_out: dense(r, h, h),
            attn_norm: layer_norm(r, h),
            intermediate: dense(r, i, h),
            output: dense(r, h, i),
            output_norm: layer_norm(r, h),
        })
        .collect();
    let w = EncoderWeights {
        word_embeddings: normal(r, cfg.vocab_size * h, 0.5),
        position_embeddings: normal(r, cfg.max_position_embeddings * h, 0.5),
        token_type_embeddings: normal(r, cfg.type_vocab_size * h, 0.5),
        embeddings_norm: layer_norm(r, h),
        layers,
        pooler: None,
        head: None,
    };
    w.check(cfg).expect("random weights match their config");
    w
}

/// Random sequences of the given lengths (ids anywhere in the vocabulary, token types random
/// where the config has two).
fn batch(r: &mut StdRng, cfg: &EncoderConfig, lens: &[usize]) -> PackedBatch {
    let seqs: Vec<Vec<u32>> = lens
        .iter()
        .map(|&n| {
            (0..n)
                .map(|_| r.random_range(0..cfg.vocab_size as u32))
                .collect()
        })
        .collect();
    let types: Vec<Vec<u32>> = lens
        .iter()
        .map(|&n| {
            (0..n)
                .map(|_| r.random_range(0..cfg.type_vocab_size as u32))
                .collect()
        })
        .collect();
    PackedBatch::new(cfg, &seqs, Some(&types)).expect("random batch")
}

/// The last hidden states on the GPU, read back as f32; `out` poisoned with NaN first.
fn gpu_states<T: RunDType>(
    gpu: &Gpu,
    blas: &mut Blas,
    model: &EncoderModel<T>,
    b: &PackedBatch,
) -> Vec<f32> {
    let s = gpu.stream();
    let h = model.config().hidden_size;
    let mut dev = DeviceBatch::upload(s, model.config(), b).expect("upload batch");
    assert_eq!(dev.num_tokens(), b.num_tokens());
    assert_eq!(dev.num_seqs(), b.num_seqs());
    assert_eq!(dev.max_seqlen(), b.max_seqlen());
    let mut out = DeviceTensor::<T>::filled(s, &[b.num_tokens(), h], T::from_f32(f32::NAN))
        .expect("poisoned out");
    model.forward(s, blas, &mut dev, &mut out).expect("forward");
    dev.check(s).expect("device status");
    let v: Vec<f32> = out
        .to_host(s)
        .expect("read back")
        .into_iter()
        .map(|x| x.to_f32())
        .collect();
    assert!(
        v.iter().all(|x| x.is_finite()),
        "{}: non-finite states (an unwritten row?)",
        T::NAME
    );
    v
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let na: f64 = a.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// The worst per-sequence cosine of `got`'s pooled rows against `want`'s.
fn worst_cosine(got: &[f32], want: &[f32], hidden: usize) -> f64 {
    got.chunks(hidden)
        .zip(want.chunks(hidden))
        .map(|(a, b)| cosine(a, b))
        .fold(f64::INFINITY, f64::min)
}

const POOLINGS: [Pooling; 3] = [Pooling::Cls, Pooling::Mean, Pooling::LastToken];

/// `T`'s states of `b` against the f32 reference `want`: rel L2 within `tol`, each pooling's
/// rows within `tol` and of cosine at least `min_cos`.
#[allow(clippy::too_many_arguments)]
fn check_dtype<T: RunDType>(
    gpu: &Gpu,
    blas: &mut Blas,
    cfg: &EncoderConfig,
    w: &EncoderWeights,
    b: &PackedBatch,
    want: &[f32],
    tol: f64,
    min_cos: f64,
    what: &str,
) {
    let h = cfg.hidden_size;
    let model = EncoderModel::<T>::new(gpu.stream(), cfg, w).expect("upload model");
    let got = gpu_states(gpu, blas, &model, b);
    let e = rel_l2(&got, &to_f64(want));
    println!("{what} {:>4}: last_hidden_state rel L2 {e:.2e}", T::NAME);
    assert!(e <= tol, "{what} {}: rel L2 {e:.3e} > {tol:e}", T::NAME);
    for p in POOLINGS {
        let g = reference::pool(&got, b, h, p).unwrap();
        let r = reference::pool(want, b, h, p).unwrap();
        let e = rel_l2(&g, &to_f64(&r));
        let c = worst_cosine(&g, &r, h);
        println!(
            "{what} {:>4}: {:<4} pooled rel L2 {e:.2e}, worst cosine {c:.7}",
            T::NAME,
            p.name()
        );
        assert!(e <= tol, "{what} {} {}: rel L2 {e:.3e}", T::NAME, p.name());
        assert!(c >= min_cos, "{what} {} {}: cosine {c}", T::NAME, p.name());
    }
}

/// The random encoders: head dims 32, 64 (two and four heads) and 128, both families, both
/// GELU forms, odd intermediate sizes.
const SPECS: [(&str, Spec); 4] = [
    (
        "bert_head_dim_32_erf",
        Spec {
            model_type: "bert",
            hidden: 64,
            heads: 2,
            intermediate: 136,
            act: "gelu",
        },
    ),
    (
        "xlmr_head_dim_64_tanh",
        Spec {
            model_type: "xlm-roberta",
            hidden: 128,
            heads: 2,
            intermediate: 200,
            act: "gelu_new",
        },
    ),
    (
        // Head dim 128 in f16 / bf16 runs the wgmma + TMA kernel on Hopper.
        "roberta_head_dim_128_erf",
        Spec {
            model_type: "roberta",
            hidden: 256,
            heads: 2,
            intermediate: 328,
            act: "gelu",
        },
    ),
    (
        "bert_head_dim_64_tanh_four_heads",
        Spec {
            model_type: "bert",
            hidden: 256,
            heads: 4,
            intermediate: 96,
            act: "gelu_pytorch_tanh",
        },
    ),
];

type Setup = (
    EncoderConfig,
    EncoderWeights,
    Vec<(&'static str, PackedBatch)>,
);

/// Config, random weights and the batches of random encoder `i` of [`SPECS`].
fn setup(i: usize) -> Setup {
    let (test, spec) = &SPECS[i];
    let mut r = rng(test);
    let cfg = config(spec);
    let w = weights(&mut r, &cfg);
    // Short before long and long before short; 63/64/65 and 129 straddle the kernels' tiles.
    let batches = vec![
        ("ragged", batch(&mut r, &cfg, &[1, 65, 7, 129, 64, 63])),
        ("one-token", batch(&mut r, &cfg, &[1])),
    ];
    (cfg, w, batches)
}

/// Random encoder `i` of [`SPECS`] on each batch, in f32, f16 and bf16 against the f32
/// reference.
fn random_encoder(i: usize) {
    let test = SPECS[i].0;
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let mut blas = Blas::new(&gpu).expect("cuBLASLt");
    let (cfg, w, batches) = setup(i);
    for (name, b) in &batches {
        let want = reference::forward(&cfg, &w, b).expect("reference");
        let what = format!("{test} {name}");
        check_dtype::<f32>(&gpu, &mut blas, &cfg, &w, b, &want, 1e-5, 0.99999, &what);
        check_dtype::<f16>(&gpu, &mut blas, &cfg, &w, b, &want, 5e-3, 0.9999, &what);
        check_dtype::<bf16>(&gpu, &mut blas, &cfg, &w, b, &want, 4e-2, 0.999, &what);
    }
}

#[test]
fn bert_head_dim_32_erf() {
    random_encoder(0);
}

#[test]
fn xlmr_head_dim_64_tanh() {
    random_encoder(1);
}

#[test]
fn roberta_head_dim_128_erf() {
    random_encoder(2);
}

#[test]
fn bert_head_dim_64_tanh_four_heads() {
    random_encoder(3);
}

/// The random encoders' configs, weights and batches are what the GPU tests expect (checked
/// without a GPU, so that a skip here does not hide a broken setup).
#[test]
fn random_setups_are_valid() {
    for (i, (test, spec)) in SPECS.iter().enumerate() {
        let (cfg, _w, batches) = setup(i);
        assert_eq!(cfg.head_dim(), spec.hidden / spec.heads);
        EncoderModel::<f32>::supports(&cfg).unwrap_or_else(|e| panic!("{test}: {e}"));
        assert_eq!(batches[0].1.max_seqlen(), 129, "{test}");
        assert_eq!(batches[0].1.num_seqs(), 6, "{test}");
        assert_eq!(batches[1].1.num_tokens(), 1, "{test}");
    }
}

fn fixture_dirs() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/encoder");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/data/encoder")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.join("expected.json").is_file())
        .collect();
    v.sort();
    assert!(v.len() >= 4, "fixtures missing: {v:?}");
    v
}

fn seqs(v: &Value) -> Vec<Vec<u32>> {
    v.as_array()
        .expect("list of sequences")
        .iter()
        .map(|s| {
            s.as_array()
                .expect("sequence")
                .iter()
                .map(|x| x.as_u64().expect("id") as u32)
                .collect()
        })
        .collect()
}

/// Nested JSON arrays of numbers, flattened in order.
fn flat(v: &Value) -> Vec<f64> {
    match v {
        Value::Array(items) => items.iter().flat_map(flat).collect(),
        Value::Number(n) => vec![n.as_f64().expect("number")],
        other => panic!("not a number array: {other}"),
    }
}

/// `T`'s forward of a fixture against transformers' outputs in `expected`: the last hidden
/// state, CLS / mean / last-token pooling, the normalised mean, and where the fixture has
/// them BERT's pooler and the logits (the host heads on the read-back states), each within
/// rel L2 `tol`.
#[allow(clippy::too_many_arguments)]
fn check_fixture<T: RunDType>(
    gpu: &Gpu,
    blas: &mut Blas,
    cfg: &EncoderConfig,
    w: &EncoderWeights,
    b: &PackedBatch,
    expected: &Value,
    tol: f64,
    name: &str,
) {
    let h = cfg.hidden_size;
    let model = EncoderModel::<T>::new(gpu.stream(), cfg, w).expect("upload model");
    let states = gpu_states(gpu, blas, &model, b);
    let mut outputs = vec![("last_hidden_state", states.clone())];
    for (key, p) in [
        ("cls", Pooling::Cls),
        ("mean", Pooling::Mean),
        ("last", Pooling::LastToken),
    ] {
        outputs.push((key, reference::pool(&states, b, h, p).unwrap()));
    }
    let mut mean = reference::pool(&states, b, h, Pooling::Mean).unwrap();
    reference::l2_normalize(&mut mean, h).unwrap();
    outputs.push(("mean_normalized", mean));
    if expected.get("pooler").is_some() {
        let p = reference::pooler_output(cfg, w, &states, b).expect("pooler");
        outputs.push(("pooler", p));
    }
    if expected.get("logits").is_some() {
        let l = reference::classify(cfg, w, &states, b).expect("logits");
        outputs.push(("logits", l));
    }
    for (key, got) in outputs {
        let want = flat(&expected[key]);
        assert_eq!(got.len(), want.len(), "{name} {key}: lengths differ");
        let e = rel_l2(&got, &want);
        println!("{name} {:>4}: {key:<18} rel L2 {e:.2e}", T::NAME);
        assert!(
            e <= tol,
            "{name} {} {key}: rel L2 {e:.3e} > {tol:e}",
            T::NAME
        );
    }
}

fn names_head_fields(e: &EngineError) {
    let msg = e.to_string();
    assert!(
        matches!(e, EngineError::Invalid { .. })
            && msg.contains("hidden_size")
            && msg.contains("num_attention_heads"),
        "{msg}"
    );
}

/// Every fixture: refused with an error naming both fields when its head dim is one the
/// attention kernel does not run (12 and 7), else run in f32 (within rel L2 1e-5) and f16
/// (5e-3) against transformers' outputs. The refusal, and that two fixtures run, need no GPU.
#[test]
fn fixtures() {
    let gpu = gpu_or_skip("fixtures");
    let mut blas = gpu.as_ref().map(|g| Blas::new(g).expect("cuBLASLt"));
    let mut running = Vec::new();
    for dir in fixture_dirs() {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let cfg = EncoderConfig::from_model_dir(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        let runs = PREFILL_BIDIRECTIONAL_HEAD_DIMS.contains(&cfg.head_dim());
        match EncoderModel::<f32>::supports(&cfg) {
            Ok(()) => {
                assert!(runs, "{name}: head dim {} accepted", cfg.head_dim());
                running.push(name.clone());
            }
            Err(e) => {
                assert!(!runs, "{name}: {e}");
                names_head_fields(&e);
                println!("{name}: refused as expected: {e}");
            }
        }
        let (Some(gpu), Some(blas)) = (&gpu, &mut blas) else {
            continue;
        };
        let ckpt = Checkpoint::open(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        let w = EncoderWeights::load(&ckpt, &cfg).unwrap_or_else(|e| panic!("{name}: {e}"));
        if !runs {
            let e = EncoderModel::<f32>::new(gpu.stream(), &cfg, &w).unwrap_err();
            names_head_fields(&e);
            continue;
        }
        let text = std::fs::read_to_string(dir.join("expected.json")).expect("expected.json");
        let expected: Value = serde_json::from_str(&text).expect("expected.json is JSON");
        let ids = seqs(&expected["ids"]);
        let types = (!expected["token_types"].is_null()).then(|| seqs(&expected["token_types"]));
        let b = PackedBatch::new(&cfg, &ids, types.as_deref()).expect("fixture batch");
        check_fixture::<f32>(gpu, blas, &cfg, &w, &b, &expected, 1e-5, &name);
        check_fixture::<f16>(gpu, blas, &cfg, &w, &b, &expected, 5e-3, &name);
    }
    assert_eq!(
        running,
        ["bert_hd32_erf", "xlmr_cls_hd64_tanh"],
        "the fixtures the GPU path runs"
    );
}

/// `run` (upload, forward, read back) gives what `forward` gives; bad arguments are errors
/// naming them.
#[test]
fn run_and_errors() {
    let Some(gpu) = gpu_or_skip("run_and_errors") else {
        return;
    };
    let s = gpu.stream();
    let mut blas = Blas::new(&gpu).expect("cuBLASLt");
    let mut r = rng("run_and_errors");
    let cfg = config(&Spec {
        model_type: "bert",
        hidden: 64,
        heads: 2,
        intermediate: 72,
        act: "gelu",
    });
    let w = weights(&mut r, &cfg);
    let model = EncoderModel::<f32>::new(s, &cfg, &w).expect("model");
    let b = batch(&mut r, &cfg, &[5, 3]);
    let via_run = model.run(s, &mut blas, &b).expect("run");
    let via_forward = gpu_states(&gpu, &mut blas, &model, &b);
    let e = rel_l2(&via_run, &to_f64(&via_forward));
    assert!(e <= 1e-6, "run vs forward: {e:.3e}");

    let arg_of = |e: EngineError| match e {
        EngineError::Invalid { arg, .. } => arg,
        other => panic!("expected Invalid, got {other}"),
    };
    // Out of another shape.
    let mut dev = DeviceBatch::upload(s, &cfg, &b).expect("upload");
    let mut out = DeviceTensor::<f32>::zeros(s, &[b.num_tokens() + 1, 64]).unwrap();
    let e = model.forward(s, &mut blas, &mut dev, &mut out).unwrap_err();
    assert_eq!(arg_of(e), "out");
    // Batches the config cannot take, or inconsistent ones.
    let mut bad = b.clone();
    bad.ids[2] = cfg.vocab_size as u32;
    assert_eq!(
        arg_of(DeviceBatch::upload(s, &cfg, &bad).unwrap_err()),
        "batch.ids"
    );
    let mut bad = b.clone();
    bad.token_types[7] = 2;
    assert_eq!(
        arg_of(DeviceBatch::upload(s, &cfg, &bad).unwrap_err()),
        "batch.token_types"
    );
    let mut bad = b.clone();
    bad.positions.pop();
    assert_eq!(
        arg_of(DeviceBatch::upload(s, &cfg, &bad).unwrap_err()),
        "batch.positions"
    );
    let mut bad = b.clone();
    bad.cu_seqlens = vec![0, 9, 8];
    assert_eq!(
        arg_of(DeviceBatch::upload(s, &cfg, &bad).unwrap_err()),
        "batch.cu_seqlens"
    );
    let mut bad = b.clone();
    bad.cu_seqlens = vec![0];
    assert_eq!(
        arg_of(DeviceBatch::upload(s, &cfg, &bad).unwrap_err()),
        "batch"
    );
    // Weights that do not match the config.
    let mut bad = w.clone();
    bad.layers[1].intermediate.bias.pop();
    let e = EncoderModel::<f32>::new(s, &cfg, &bad).unwrap_err();
    assert_eq!(arg_of(e), "layers[].intermediate");
}

/// INT8 pooled embeddings of `model` on `b` against `want` (f32 states): every pooling's
/// worst cosine at least `min_cos`. Returns the worst cosine.
#[allow(clippy::too_many_arguments)]
fn check_int8<T: RunDType>(
    gpu: &Gpu,
    blas: &mut Blas,
    model: &EncoderModel<T>,
    b: &PackedBatch,
    want: &[f32],
    min_cos: f64,
    what: &str,
) -> f64 {
    let h = model.config().hidden_size;
    let got = gpu_states(gpu, blas, model, b);
    let e = rel_l2(&got, &to_f64(want));
    let mut worst = f64::INFINITY;
    for p in POOLINGS {
        let g = reference::pool(&got, b, h, p).unwrap();
        let r = reference::pool(want, b, h, p).unwrap();
        let c = worst_cosine(&g, &r, h);
        worst = worst.min(c);
        println!(
            "{what} {:>4}: states rel L2 {e:.2e}, {:<4} pooled worst cosine {c:.6}",
            T::NAME,
            p.name()
        );
        assert!(
            c >= min_cos,
            "{what} {} {}: cosine {c} < {min_cos}",
            T::NAME,
            p.name()
        );
    }
    worst
}

/// INT8 (per-token scales, and static scales calibrated on the batch itself at absmax and
/// at the 99.99th percentile) against the f32 reference on every random encoder: pooled
/// cosine >= 0.99 (the bound), in f16 and (per-token) bf16.
#[test]
fn int8_random_encoders_against_f32() {
    let Some(gpu) = gpu_or_skip("int8_random_encoders_against_f32") else {
        return;
    };
    let mut blas = Blas::new(&gpu).expect("cuBLASLt");
    let s = gpu.stream();
    for (i, (test, _)) in SPECS.iter().enumerate() {
        let (cfg, w, batches) = setup(i);
        let (name, b) = &batches[0];
        let want = reference::forward(&cfg, &w, b).expect("reference");
        let what = format!("int8 {test} {name}");
        let m = EncoderModel::<f16>::new_quant(s, &cfg, &w, EncoderQuant::Int8).unwrap();
        check_int8(
            &gpu,
            &mut blas,
            &m,
            b,
            &want,
            0.99,
            &format!("{what} per-token"),
        );
        let m = EncoderModel::<bf16>::new_quant(s, &cfg, &w, EncoderQuant::Int8).unwrap();
        check_int8(
            &gpu,
            &mut blas,
            &m,
            b,
            &want,
            0.99,
            &format!("{what} per-token"),
        );
        let float = EncoderModel::<f16>::new(s, &cfg, &w).unwrap();
        let calibration = float
            .calibrate(s, &mut blas, std::slice::from_ref(b), 99.99)
            .expect("calibrate");
        assert_eq!(calibration.layers.len(), cfg.num_hidden_layers);
        assert_eq!(calibration.tokens, b.num_tokens() as u64);
        for kind in [AmaxKind::Absmax, AmaxKind::Percentile] {
            let q = EncoderQuant::Int8Calibrated {
                calibration: calibration.clone(),
                kind,
            };
            let m = EncoderModel::<f16>::new_quant(s, &cfg, &w, q).unwrap();
            check_int8(
                &gpu,
                &mut blas,
                &m,
                b,
                &want,
                0.99,
                &format!("{what} {kind:?}"),
            );
        }
    }
}

/// BERT-base's shape (12 layers, 768, 3072) with random weights: INT8 against the same model
/// in f16 (itself within 5e-3 of f32, above) on a ragged batch of 16 sequences; prints the
/// figures, requires cosine >= 0.99.
#[test]
fn int8_bert_base_shape_against_f16() {
    let Some(gpu) = gpu_or_skip("int8_bert_base_shape_against_f16") else {
        return;
    };
    let mut blas = Blas::new(&gpu).expect("cuBLASLt");
    let s = gpu.stream();
    let cfg = presets::preset("bert-base").unwrap();
    let w = EncoderWeights::random(&cfg, 3).unwrap();
    let lens = presets::bench_lengths(16, 128, true).unwrap();
    let mut r = rng("int8_bert_base_shape");
    let b = batch(&mut r, &cfg, &lens);
    let float = EncoderModel::<f16>::new(s, &cfg, &w).unwrap();
    let want = gpu_states(&gpu, &mut blas, &float, &b);
    let calibration = float
        .calibrate(s, &mut blas, std::slice::from_ref(&b), 99.99)
        .unwrap();
    drop(float);
    let m = EncoderModel::<f16>::new_quant(s, &cfg, &w, EncoderQuant::Int8).unwrap();
    check_int8(
        &gpu,
        &mut blas,
        &m,
        &b,
        &want,
        0.99,
        "bert-base int8 per-token",
    );
    let q = EncoderQuant::Int8Calibrated {
        calibration,
        kind: AmaxKind::Percentile,
    };
    let m = EncoderModel::<f16>::new_quant(s, &cfg, &w, q).unwrap();
    check_int8(
        &gpu,
        &mut blas,
        &m,
        &b,
        &want,
        0.99,
        "bert-base int8 calibrated p99.99",
    );
}

#[test]
fn int8_refusals_name_the_argument() {
    let Some(gpu) = gpu_or_skip("int8_refusals_name_the_argument") else {
        return;
    };
    let s = gpu.stream();
    let (cfg, w, _) = setup(0);
    let e = EncoderModel::<f32>::new_quant(s, &cfg, &w, EncoderQuant::Int8).unwrap_err();
    assert!(e.to_string().contains("quant"), "{e}");
    // An intermediate size cuBLASLt's INT8 GEMMs do not take.
    let spec = Spec {
        model_type: "bert",
        hidden: 64,
        heads: 2,
        intermediate: 130,
        act: "gelu",
    };
    let cfg2 = config(&spec);
    let w2 = weights(&mut rng("int8_refusals"), &cfg2);
    let e = EncoderModel::<f16>::new_quant(s, &cfg2, &w2, EncoderQuant::Int8).unwrap_err();
    assert!(e.to_string().contains("intermediate_size"), "{e}");
    // A calibration of another depth.
    let mut blas = Blas::new(&gpu).unwrap();
    let float = EncoderModel::<f16>::new(s, &cfg, &w).unwrap();
    let b = batch(&mut rng("int8_refusals_batch"), &cfg, &[5, 9]);
    let mut calibration = float.calibrate(s, &mut blas, &[b], 99.0).unwrap();
    calibration.layers.pop();
    let q = EncoderQuant::Int8Calibrated {
        calibration,
        kind: AmaxKind::Absmax,
    };
    let e = EncoderModel::<f16>::new_quant(s, &cfg, &w, q).unwrap_err();
    assert!(e.to_string().contains("layers"), "{e}");
    assert!(float
        .calibrate(s, &mut blas, &[], 99.0)
        .unwrap_err()
        .to_string()
        .contains("batches"));
}
