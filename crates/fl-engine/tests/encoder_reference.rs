//! The encoder's CPU reference against transformers, on the frozen fixtures of
//! `tests/data/encoder/` (written by `bench/scripts/make_encoder_fixtures.py`: tiny random
//! BERT / XLM-RoBERTa models, base and sequence-classification, both GELU forms, f32 / f16 /
//! bf16 storage, ragged batches of 3 with token types in the BERT pairs, head dims 12 and 7
//! and, with a sequence past 64 tokens, 32 and 64). Every output is
//! held to relative L2 <= 1e-5; the loader's and the batch's errors name the tensor / field.

use std::path::{Path, PathBuf};

use fl_engine::checkpoint::{Checkpoint, CheckpointError};
use fl_engine::encoder::{
    reference, ClassifierHead, EncoderArch, EncoderConfig, EncoderWeights, PackedBatch, Pooling,
};
use fl_engine::EngineError;
use fl_kernels::testing::rel_l2;
use serde_json::Value;

const TOL: f64 = 1e-5;

/// The fixtures the generator writes (any further directory with an `expected.json` is
/// checked too); the last two have head dims 32 and 64, which the GPU path runs.
const FIXTURES: [&str; 7] = [
    "bert_cls_tanh",
    "bert_erf",
    "bert_small_f32",
    "xlmr_cls_erf",
    "xlmr_tanh",
    "bert_hd32_erf",
    "xlmr_cls_hd64_tanh",
];

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/encoder")
}

fn cases() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(data_dir())
        .expect("tests/data/encoder")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.join("expected.json").is_file())
        .collect();
    v.sort();
    let names: Vec<_> = v.iter().filter_map(|p| p.file_name()?.to_str()).collect();
    for want in FIXTURES {
        assert!(names.contains(&want), "fixture {want} missing: {names:?}");
    }
    v
}

/// Nested JSON arrays of numbers, flattened in order.
fn flat(v: &Value) -> Vec<f64> {
    match v {
        Value::Array(items) => items.iter().flat_map(flat).collect(),
        Value::Number(n) => vec![n.as_f64().expect("number")],
        other => panic!("not a number array: {other}"),
    }
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

struct Case {
    name: String,
    cfg: EncoderConfig,
    w: EncoderWeights,
    batch: PackedBatch,
    expected: Value,
}

fn load(dir: &Path) -> Case {
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    let cfg = EncoderConfig::from_model_dir(dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    let ckpt = Checkpoint::open(dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    let w = EncoderWeights::load(&ckpt, &cfg).unwrap_or_else(|e| panic!("{name}: {e}"));
    let text = std::fs::read_to_string(dir.join("expected.json")).expect("expected.json");
    let expected: Value = serde_json::from_str(&text).expect("expected.json is JSON");
    let ids = seqs(&expected["ids"]);
    let types = (!expected["token_types"].is_null()).then(|| seqs(&expected["token_types"]));
    let batch =
        PackedBatch::new(&cfg, &ids, types.as_deref()).unwrap_or_else(|e| panic!("{name}: {e}"));
    Case {
        name,
        cfg,
        w,
        batch,
        expected,
    }
}

fn check(case: &str, what: &str, got: &[f32], want: &Value) -> f64 {
    let want = flat(want);
    assert_eq!(got.len(), want.len(), "{case} {what}: lengths differ");
    let e = rel_l2(got, &want);
    println!("{case:>18} {what:<18} rel L2 {e:.2e}");
    assert!(e <= TOL, "{case} {what}: rel L2 {e:.3e} > {TOL:e}");
    e
}

#[test]
fn matches_transformers() {
    let mut worst = 0f64;
    let mut seen_heads = (false, false);
    for dir in cases() {
        let c = load(&dir);
        let h = c.cfg.hidden_size;
        let states = reference::forward(&c.cfg, &c.w, &c.batch).unwrap();
        assert_eq!(states.len(), c.batch.num_tokens() * h);
        let mut errs = vec![check(
            &c.name,
            "last_hidden_state",
            &states,
            &c.expected["last_hidden_state"],
        )];
        for (key, pooling) in [
            ("cls", Pooling::Cls),
            ("mean", Pooling::Mean),
            ("last", Pooling::LastToken),
        ] {
            let p = reference::pool(&states, &c.batch, h, pooling).unwrap();
            errs.push(check(&c.name, key, &p, &c.expected[key]));
        }
        let mut mean = reference::pool(&states, &c.batch, h, Pooling::Mean).unwrap();
        reference::l2_normalize(&mut mean, h).unwrap();
        for row in mean.chunks(h) {
            let n: f64 = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt();
            assert!((n - 1.0).abs() < 1e-6, "{}: norm {n}", c.name);
        }
        errs.push(check(
            &c.name,
            "mean_normalized",
            &mean,
            &c.expected["mean_normalized"],
        ));
        if let Some(want) = c.expected.get("pooler") {
            let p = reference::pooler_output(&c.cfg, &c.w, &states, &c.batch).unwrap();
            errs.push(check(&c.name, "pooler", &p, want));
        }
        match c.expected.get("logits") {
            Some(want) => {
                let logits = reference::classify(&c.cfg, &c.w, &states, &c.batch).unwrap();
                assert_eq!(logits.len(), c.batch.num_seqs() * c.cfg.num_labels);
                errs.push(check(&c.name, "logits", &logits, want));
                match c.w.head {
                    Some(ClassifierHead::Bert { .. }) => seen_heads.0 = true,
                    Some(ClassifierHead::Roberta { .. }) => seen_heads.1 = true,
                    None => panic!("{}: logits expected but no head loaded", c.name),
                }
            }
            None => assert!(c.w.head.is_none(), "{}: a head without logits", c.name),
        }
        worst = errs.into_iter().fold(worst, f64::max);
    }
    assert!(seen_heads.0 && seen_heads.1, "both head kinds covered");
    println!("worst rel L2 over all cases and outputs: {worst:.2e}");
}

/// The same sequences alone and in one batch give the same states: no sequence sees another.
#[test]
fn sequences_are_independent() {
    let c = load(&data_dir().join("xlmr_tanh"));
    let h = c.cfg.hidden_size;
    let all = reference::forward(&c.cfg, &c.w, &c.batch).unwrap();
    let ids = seqs(&c.expected["ids"]);
    for (s, seq) in ids.iter().enumerate() {
        let one = PackedBatch::new(&c.cfg, std::slice::from_ref(seq), None).unwrap();
        let alone = reference::forward(&c.cfg, &c.w, &one).unwrap();
        let r = c.batch.seq_range(s);
        assert_eq!(alone, all[r.start * h..r.end * h], "sequence {s}");
    }
}

#[test]
fn configs_of_the_fixtures() {
    let c = load(&data_dir().join("xlmr_cls_erf"));
    assert_eq!(c.cfg.arch, EncoderArch::XlmRoberta);
    assert!(c.cfg.sequence_classification);
    assert_eq!(c.cfg.num_labels, 1);
    assert!(
        c.w.pooler.is_none(),
        "XLMRobertaForSequenceClassification has no pooler"
    );
    // <s> at position pad + 1 = 2.
    assert_eq!(&c.batch.positions[..3], [2, 3, 4]);
    let b = load(&data_dir().join("bert_cls_tanh"));
    assert_eq!(b.cfg.arch, EncoderArch::Bert);
    assert_eq!(b.cfg.num_labels, 3);
    assert!(b.w.pooler.is_some());
    assert_eq!(&b.batch.positions[..3], [0, 1, 2]);
    assert!(b.batch.token_types.contains(&1));
    // The two the GPU path runs: head dims 32 and 64, a sequence past the 64-token tile.
    for (name, head_dim) in [("bert_hd32_erf", 32), ("xlmr_cls_hd64_tanh", 64)] {
        let g = load(&data_dir().join(name));
        assert_eq!(g.cfg.head_dim(), head_dim, "{name}");
        assert!(g.batch.max_seqlen() > 64, "{name}");
        assert_eq!(g.batch.num_seqs(), 3, "{name}");
    }
    let x = load(&data_dir().join("xlmr_cls_hd64_tanh"));
    assert_eq!(x.cfg.num_labels, 2);
    assert!(x.w.pooler.is_none());
}

fn copy_case(name: &str, edit: impl FnOnce(&mut Value)) -> tempfile::TempDir {
    let src = data_dir().join(name);
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        src.join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .unwrap();
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    dir
}

/// The fixtures tell the variants apart: the other GELU form (the closest miss: tanh and erf
/// differ by at most ~5e-4) or BERT's position ids on an XLM-R model miss transformers by
/// more than 10x the tolerance.
#[test]
fn fixtures_discriminate_variants() {
    let base = load(&data_dir().join("xlmr_tanh"));
    let want = flat(&base.expected["last_hidden_state"]);
    for (what, edit) in [
        ("erf GELU", ("hidden_act", Value::from("gelu"))),
        ("BERT positions", ("model_type", Value::from("bert"))),
    ] {
        let d = copy_case("xlmr_tanh", |c| c[edit.0] = edit.1);
        let cfg = EncoderConfig::from_model_dir(d.path()).unwrap();
        let ckpt = Checkpoint::open(d.path()).unwrap();
        // A bare (base-model) file loads under either model_type.
        let w = EncoderWeights::load(&ckpt, &cfg).unwrap_or_else(|e| panic!("{what}: {e}"));
        let ids = seqs(&base.expected["ids"]);
        let batch = PackedBatch::new(&cfg, &ids, None).unwrap();
        let states = reference::forward(&cfg, &w, &batch).unwrap();
        let e = rel_l2(&states, &want);
        println!("{what}: rel L2 {e:.2e}");
        assert!(
            e > 10.0 * TOL,
            "{what}: rel L2 {e:.2e} does not tell it apart"
        );
    }
}

fn load_err(dir: &Path) -> EngineError {
    let cfg = EncoderConfig::from_model_dir(dir).unwrap();
    EncoderWeights::load(&Checkpoint::open(dir).unwrap(), &cfg).unwrap_err()
}

fn missing_tensor(e: EngineError) -> String {
    match e {
        EngineError::Checkpoint(CheckpointError::MissingTensor { tensor, .. }) => tensor,
        other => panic!("expected a missing tensor, got {other}"),
    }
}

#[test]
fn loader_errors_name_the_tensor() {
    // One layer more than the file holds.
    let d = copy_case("bert_erf", |c| c["num_hidden_layers"] = 3.into());
    assert_eq!(
        missing_tensor(load_err(d.path())),
        "encoder.layer.2.attention.self.query.weight"
    );
    // A base model presented as a classifier: no head in the file.
    let d = copy_case("xlmr_tanh", |c| {
        c["architectures"] = serde_json::json!(["XLMRobertaForSequenceClassification"])
    });
    assert_eq!(
        missing_tensor(load_err(d.path())),
        "classifier.dense.weight"
    );
    // A model_type whose prefix the file does not use.
    let d = copy_case("bert_cls_tanh", |c| {
        c["model_type"] = "roberta".into();
        c["pad_token_id"] = 1.into();
    });
    let msg = load_err(d.path()).to_string();
    assert!(
        msg.contains("roberta.embeddings.word_embeddings.weight"),
        "{msg}"
    );
    // Another shape than the config says.
    let d = copy_case("bert_erf", |c| c["intermediate_size"] = 50.into());
    match load_err(d.path()) {
        EngineError::Checkpoint(CheckpointError::Shape { tensor, .. }) => {
            assert_eq!(tensor, "encoder.layer.0.intermediate.dense.weight")
        }
        other => panic!("expected a shape error, got {other}"),
    }
}

#[test]
fn batch_errors_name_the_argument() {
    let c = load(&data_dir().join("bert_erf"));
    let cfg = &c.cfg;
    let arg = |r: Result<PackedBatch, EngineError>| match r {
        Err(EngineError::Invalid { arg, reason }) => format!("{arg}: {reason}"),
        other => panic!("expected Invalid, got {other:?}"),
    };
    let e = arg(PackedBatch::new(cfg, &[vec![2, 3], vec![]], None));
    assert!(e.starts_with("seqs: sequence 1 is empty"), "{e}");
    let e = arg(PackedBatch::new(cfg, &[vec![2, 100]], None));
    assert!(e.starts_with("seqs: sequence 0 token 1: id 100"), "{e}");
    let e = arg(PackedBatch::new(cfg, &[vec![2; 41]], None));
    assert!(e.starts_with("seqs: sequence 0 has 41 tokens"), "{e}");
    let e = arg(PackedBatch::new(cfg, &[vec![2, 3]], Some(&[vec![0, 2]])));
    assert!(
        e.starts_with("token_types: sequence 0 token 1: type 2"),
        "{e}"
    );
    let e = arg(PackedBatch::new(cfg, &[vec![2, 3]], Some(&[vec![0]])));
    assert!(e.starts_with("token_types: sequence 0 has 1 types"), "{e}");
    let e = arg(PackedBatch::new(cfg, &[vec![2, 3]], Some(&[])));
    assert!(e.starts_with("token_types: has 0 sequences"), "{e}");
    // The longest sequence fits: positions 0..40 for BERT.
    assert!(PackedBatch::new(cfg, &[vec![2; 40]], None).is_ok());
    let x = load(&data_dir().join("xlmr_tanh"));
    // XLM-R: positions start at pad + 1 = 2, so 40 - 2 = 38 tokens fit.
    assert!(PackedBatch::new(&x.cfg, &[vec![5; 38]], None).is_ok());
    let e = arg(PackedBatch::new(&x.cfg, &[vec![5; 39]], None));
    assert!(e.contains("positions cover 38"), "{e}");
    // A hand-edited batch is refused by the forward, not indexed out of range.
    let mut bad = c.batch.clone();
    bad.positions[0] = 40;
    match reference::forward(cfg, &c.w, &bad) {
        Err(EngineError::Invalid { arg, .. }) => assert_eq!(arg, "batch.positions"),
        other => panic!("expected Invalid, got {:?}", other.map(|v| v.len())),
    }
    let states = reference::forward(cfg, &c.w, &c.batch).unwrap();
    match reference::classify(cfg, &c.w, &states, &c.batch) {
        Err(EngineError::Invalid { arg, .. }) => assert_eq!(arg, "weights"),
        other => panic!("expected Invalid, got {other:?}"),
    }
    match reference::pool(&states[1..], &c.batch, cfg.hidden_size, Pooling::Mean) {
        Err(EngineError::Invalid { arg, .. }) => assert_eq!(arg, "states"),
        other => panic!("expected Invalid, got {other:?}"),
    }
}
