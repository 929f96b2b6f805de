//! Safetensors loading: files written here (by the safetensors crate and by hand), single
//! and sharded, the tiny preset's full tensor set through `check_all`, conversions, and one
//! test per error kind.

use std::path::{Path, PathBuf};

use fl_engine::checkpoint::{
    llama_tensor_names, Checkpoint, CheckpointError, Dtype, FLOAT_DTYPES, INDEX_FILE, SINGLE_FILE,
};
use fl_engine::config::ModelConfig;
use fl_engine::presets::preset;
use half::{bf16, f16};
use proptest::prelude::*;
use safetensors::tensor::TensorView;
use serde_json::json;

/// One tensor to write: name, dtype, shape, little-endian bytes.
struct T {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

fn values(n: usize, seed: usize) -> Vec<f32> {
    // Non-trivial, non-repeating values with a sign pattern; exact in f32.
    (0..n)
        .map(|i| {
            let k = (i * 7 + seed * 13) % 1001;
            (k as f32 - 500.0) / 64.0
        })
        .collect()
}

fn encode(dtype: Dtype, v: &[f32]) -> Vec<u8> {
    match dtype {
        Dtype::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Dtype::F16 => v
            .iter()
            .flat_map(|x| f16::from_f32(*x).to_le_bytes())
            .collect(),
        Dtype::BF16 => v
            .iter()
            .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
            .collect(),
        Dtype::I32 => v.iter().flat_map(|x| (*x as i32).to_le_bytes()).collect(),
        other => panic!("test helper cannot encode {other:?}"),
    }
}

fn t(name: &str, dtype: Dtype, shape: &[usize], seed: usize) -> T {
    let n = shape.iter().product();
    T {
        name: name.to_string(),
        dtype,
        shape: shape.to_vec(),
        bytes: encode(dtype, &values(n, seed)),
    }
}

fn write_st(path: &Path, tensors: &[T]) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|t| {
            let v = TensorView::new(t.dtype, t.shape.clone(), &t.bytes)
                .unwrap_or_else(|e| panic!("{}: {e:?}", t.name));
            (t.name.clone(), v)
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap_or_else(|e| panic!("{e:?}"));
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"))
}

fn open(p: &Path) -> Checkpoint {
    Checkpoint::open(p).unwrap_or_else(|e| panic!("{e}"))
}

fn open_err(p: &Path) -> CheckpointError {
    match Checkpoint::open(p) {
        Err(e) => e,
        Ok(c) => panic!("should fail to open, opened {c:?}"),
    }
}

fn assert_names(e: &CheckpointError, words: &[&str]) {
    let msg = e.to_string();
    for w in words {
        assert!(msg.contains(w), "error should name `{w}`: {msg}");
    }
}

/// The tiny preset's full tensor set; norms in f32, the rest in `dtype`.
fn tiny_tensors(cfg: &ModelConfig, dtype: Dtype) -> Vec<T> {
    llama_tensor_names(cfg)
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let dt = if e.name.contains("norm") {
                Dtype::F32
            } else {
                dtype
            };
            t(&e.name, dt, &e.shape, i)
        })
        .collect()
}

fn tiny() -> ModelConfig {
    preset("tiny").unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn single_file_values_and_conversions() {
    let dir = tmp();
    let tensors = vec![
        t("a.f32", Dtype::F32, &[3, 5], 1),
        t("b.f16", Dtype::F16, &[7], 2),
        t("c.bf16", Dtype::BF16, &[2, 2, 3], 3),
        t("d.scalar", Dtype::F32, &[], 4),
    ];
    write_st(&dir.path().join(SINGLE_FILE), &tensors);
    let ck = open(dir.path());
    assert_eq!(ck.len(), 4);
    assert_eq!(ck.files().count(), 1);

    let a = ck
        .expect("a.f32", &[3, 5], &[Dtype::F32])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(a.dtype, Dtype::F32);
    assert_eq!(a.bytes, tensors[0].bytes.as_slice());
    let a32: Vec<f32> = a.to_vec().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(a32, values(15, 1));
    // f32 -> f16 / bf16 rounds to nearest even, as half does.
    let a16: Vec<f16> = a.to_vec().unwrap_or_else(|e| panic!("{e}"));
    let want16: Vec<f16> = values(15, 1).into_iter().map(f16::from_f32).collect();
    assert_eq!(a16, want16);
    let ab: Vec<bf16> = a.to_vec().unwrap_or_else(|e| panic!("{e}"));
    let wantb: Vec<bf16> = values(15, 1).into_iter().map(bf16::from_f32).collect();
    assert_eq!(ab, wantb);

    // f16 and bf16 -> f32 are exact (the test values are exact in both).
    let b = ck
        .expect("b.f16", &[7], FLOAT_DTYPES)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        b.to_vec::<f32>().unwrap_or_else(|e| panic!("{e}")),
        values(7, 2)
    );
    let c = ck
        .expect("c.bf16", &[2, 2, 3], FLOAT_DTYPES)
        .unwrap_or_else(|e| panic!("{e}"));
    let want_c: Vec<f32> = values(12, 3)
        .into_iter()
        .map(|x| bf16::from_f32(x).to_f32())
        .collect();
    assert_eq!(c.to_vec::<f32>().unwrap_or_else(|e| panic!("{e}")), want_c);
    // bf16 -> f16 through f32.
    let c16: Vec<f16> = c.to_vec().unwrap_or_else(|e| panic!("{e}"));
    let want_c16: Vec<f16> = want_c.iter().map(|&x| f16::from_f32(x)).collect();
    assert_eq!(c16, want_c16);

    let d = ck
        .expect("d.scalar", &[], FLOAT_DTYPES)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        d.to_vec::<f32>().unwrap_or_else(|e| panic!("{e}")),
        values(1, 4)
    );

    // convert_into a caller's buffer; the wrong length is an error naming the tensor.
    let mut out = vec![f32::NAN; 7];
    b.convert_into(&mut out).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out, values(7, 2));
    let mut short = vec![0f32; 6];
    let e = match b.convert_into(&mut short) {
        Err(e) => e,
        Ok(()) => panic!("short buffer accepted"),
    };
    assert!(matches!(e, CheckpointError::OutputLength { .. }), "{e:?}");
    assert_names(&e, &["b.f16", "7", "6"]);

    // Opening the file itself works too.
    let ck2 = open(&dir.path().join(SINGLE_FILE));
    assert_eq!(ck2.len(), 4);
}

/// The format written by hand: u64 header length, JSON header (with `__metadata__`),
/// data. Checks offsets are taken relative to the end of the header.
#[test]
fn hand_written_file() {
    let dir = tmp();
    let first: Vec<u8> = [1.5f32, -2.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let second: Vec<u8> = [0.25f32, 8.0, -0.5]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let header = json!({
        "__metadata__": {"format": "pt"},
        "x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "y": {"dtype": "F32", "shape": [3, 1], "data_offsets": [8, 20]},
    })
    .to_string();
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&first);
    bytes.extend_from_slice(&second);
    let path = dir.path().join("w.safetensors");
    std::fs::write(&path, &bytes).unwrap_or_else(|e| panic!("{e}"));
    let ck = open(&path);
    assert_eq!(ck.len(), 2, "__metadata__ is not a tensor");
    let y = ck
        .expect("y", &[3, 1], &[Dtype::F32])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        y.to_vec::<f32>().unwrap_or_else(|e| panic!("{e}")),
        [0.25, 8.0, -0.5]
    );
    let entry = ck.entry("y").unwrap_or_else(|| panic!("no y"));
    assert_eq!(entry.range, 8 + header.len() + 8..8 + header.len() + 20);
    assert_eq!(entry.numel(), 3);
}

fn write_sharded(dir: &Path, tensors: Vec<T>, shards: usize) -> Vec<PathBuf> {
    let n = tensors.len();
    let mut map = serde_json::Map::new();
    let mut paths = Vec::new();
    let mut groups: Vec<Vec<T>> = (0..shards).map(|_| Vec::new()).collect();
    for (i, t) in tensors.into_iter().enumerate() {
        groups[i * shards / n].push(t);
    }
    for (s, group) in groups.iter().enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", s + 1, shards);
        for t in group {
            map.insert(t.name.clone(), json!(file));
        }
        let p = dir.join(&file);
        write_st(&p, group);
        paths.push(p);
    }
    let index = json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(dir.join(INDEX_FILE), index.to_string()).unwrap_or_else(|e| panic!("{e}"));
    paths
}

#[test]
fn sharded_tiny_checkpoint_passes_check_all() {
    let cfg = tiny();
    let dir = tmp();
    let want = tiny_tensors(&cfg, Dtype::BF16);
    let expected_bytes: Vec<(String, Vec<u8>)> = want
        .iter()
        .map(|t| (t.name.clone(), t.bytes.clone()))
        .collect();
    let shards = write_sharded(dir.path(), want, 3);
    let ck = open(dir.path());
    assert_eq!(ck.files().count(), 3);
    assert_eq!(ck.len(), llama_tensor_names(&cfg).len());
    let report = ck.check_all(&cfg).unwrap_or_else(|e| panic!("{e}"));
    let n = llama_tensor_names(&cfg).len();
    let norms = 2 * cfg.num_hidden_layers + 1;
    let norm_bytes = norms as u64 * cfg.hidden_size as u64 * 4;
    assert_eq!(report.tensors, n);
    assert_eq!(
        report.bytes,
        (cfg.param_count() - norm_bytes / 4) * 2 + norm_bytes
    );
    assert_eq!(
        report.dtypes,
        vec![(Dtype::BF16, n - norms), (Dtype::F32, norms)]
    );
    // Every tensor's bytes come back from the right shard.
    for (name, bytes) in &expected_bytes {
        let r = ck.tensor(name).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.bytes, bytes.as_slice(), "{name}");
    }
    assert_eq!(
        ck.entry("lm_head.weight").map(|e| e.file.clone()),
        Some(shards[2].clone())
    );
    // Parameter count agrees with the tensor list.
    let numel: u64 = ck.entries().map(|(_, e)| e.numel() as u64).sum();
    assert_eq!(numel, cfg.param_count());
}

#[test]
fn single_file_tiny_checkpoint_variants() {
    // Tied embeddings + qkv bias (qwen2-like): no lm_head, bias tensors present.
    let mut cfg = tiny();
    cfg.tie_word_embeddings = true;
    cfg.qkv_bias = true;
    let names = llama_tensor_names(&cfg);
    assert!(names.iter().all(|e| e.name != "lm_head.weight"));
    assert!(names
        .iter()
        .any(|e| e.name == "model.layers.1.self_attn.k_proj.bias" && e.shape == [cfg.kv_size()]));
    assert!(names
        .iter()
        .all(|e| e.name != "model.layers.0.self_attn.o_proj.bias"));
    let dir = tmp();
    let mut tensors = tiny_tensors(&cfg, Dtype::F16);
    // An extra buffer that old checkpoints carry is ignored.
    tensors.push(t(
        "model.layers.0.self_attn.rotary_emb.inv_freq",
        Dtype::F32,
        &[8],
        0,
    ));
    write_st(&dir.path().join(SINGLE_FILE), &tensors);
    let ck = open(dir.path());
    ck.check_all(&cfg).unwrap_or_else(|e| panic!("{e}"));
    let numel: u64 = names
        .iter()
        .map(|e| e.shape.iter().product::<usize>() as u64)
        .sum();
    assert_eq!(numel, cfg.param_count());
    // The untied config needs lm_head, which is absent.
    cfg.tie_word_embeddings = false;
    let e = match ck.check_all(&cfg) {
        Err(e) => e,
        Ok(_) => panic!("missing lm_head accepted"),
    };
    assert!(matches!(e, CheckpointError::MissingTensor { .. }), "{e:?}");
    assert_names(&e, &["lm_head.weight"]);
}

#[test]
fn check_all_lists_every_problem() {
    let cfg = tiny();
    let dir = tmp();
    let mut tensors = tiny_tensors(&cfg, Dtype::BF16);
    tensors.retain(|t| t.name != "model.layers.1.mlp.up_proj.weight");
    for t in tensors.iter_mut() {
        if t.name == "model.norm.weight" {
            *t = self::t("model.norm.weight", Dtype::F32, &[cfg.hidden_size + 1], 0);
        }
        if t.name == "model.layers.0.input_layernorm.weight" {
            *t = self::t(&t.name.clone(), Dtype::I32, &[cfg.hidden_size], 0);
        }
    }
    write_st(&dir.path().join(SINGLE_FILE), &tensors);
    let e = match open(dir.path()).check_all(&cfg) {
        Err(e) => e,
        Ok(_) => panic!("bad checkpoint accepted"),
    };
    match &e {
        CheckpointError::Many { problems, .. } => assert_eq!(problems.len(), 3, "{e}"),
        other => panic!("expected Many, got {other:?}"),
    }
    assert_names(
        &e,
        &[
            "model.layers.1.mlp.up_proj.weight",
            "model.norm.weight",
            "model.layers.0.input_layernorm.weight",
            "I32",
        ],
    );
}

// ---- errors: one per kind, naming the tensor and the file ----

fn one_file(dir: &Path) -> PathBuf {
    let p = dir.join(SINGLE_FILE);
    write_st(
        &p,
        &[
            t("w", Dtype::F16, &[4, 8], 1),
            t("ids", Dtype::I32, &[5], 2),
            t("z", Dtype::BF16, &[16], 3),
        ],
    );
    p
}

#[test]
fn error_missing_tensor() {
    let dir = tmp();
    one_file(dir.path());
    let ck = open(dir.path());
    let e = match ck.expect("nope.weight", &[1], FLOAT_DTYPES) {
        Err(e) => e,
        Ok(_) => panic!("missing tensor found"),
    };
    assert!(matches!(e, CheckpointError::MissingTensor { .. }), "{e:?}");
    assert_names(&e, &["nope.weight", &dir.path().display().to_string()]);
}

#[test]
fn error_wrong_shape() {
    let dir = tmp();
    let p = one_file(dir.path());
    let e = match open(dir.path()).expect("w", &[8, 4], FLOAT_DTYPES) {
        Err(e) => e,
        Ok(_) => panic!("transposed shape accepted"),
    };
    assert!(matches!(e, CheckpointError::Shape { .. }), "{e:?}");
    assert_names(&e, &["`w`", "[4, 8]", "[8, 4]", &p.display().to_string()]);
}

#[test]
fn error_unsupported_dtype() {
    let dir = tmp();
    let p = one_file(dir.path());
    let ck = open(dir.path());
    let e = match ck.expect("ids", &[5], FLOAT_DTYPES) {
        Err(e) => e,
        Ok(_) => panic!("i32 accepted as float"),
    };
    assert!(
        matches!(e, CheckpointError::UnsupportedDtype { .. }),
        "{e:?}"
    );
    assert_names(&e, &["ids", "I32", &p.display().to_string()]);
    // Accepted by the caller, but not convertible to a float.
    let r = ck
        .expect("ids", &[5], &[Dtype::I32])
        .unwrap_or_else(|e| panic!("{e}"));
    let e = match r.to_vec::<f32>() {
        Err(e) => e,
        Ok(_) => panic!("i32 converted"),
    };
    assert!(
        matches!(e, CheckpointError::UnsupportedDtype { .. }),
        "{e:?}"
    );
    assert_names(&e, &["ids", "I32"]);
    // A dtype outside the caller's list (f16 when only bf16 is wanted).
    let e = match ck.expect("w", &[4, 8], &[Dtype::BF16]) {
        Err(e) => e,
        Ok(_) => panic!("f16 accepted as bf16"),
    };
    assert_names(&e, &["`w`", "F16", "BF16"]);
}

#[test]
fn error_truncated_file() {
    let dir = tmp();
    let p = one_file(dir.path());
    let len = std::fs::metadata(&p)
        .unwrap_or_else(|e| panic!("{e}"))
        .len();
    // Cut 3 bytes: the last tensor in the file no longer fits.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap_or_else(|e| panic!("{e}"));
    f.set_len(len - 3).unwrap_or_else(|e| panic!("{e}"));
    drop(f);
    let e = open_err(dir.path());
    match &e {
        CheckpointError::Truncated {
            tensor,
            needed,
            len: l,
            ..
        } => {
            assert!(tensor.is_some(), "{e}");
            assert_eq!((*needed, *l), (len, len - 3));
        }
        other => panic!("expected Truncated, got {other:?}"),
    }
    assert_names(&e, &[&p.display().to_string(), &(len - 3).to_string()]);
    // Cut into the header.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap_or_else(|e| panic!("{e}"));
    f.set_len(20).unwrap_or_else(|e| panic!("{e}"));
    drop(f);
    let e = open_err(dir.path());
    assert!(
        matches!(e, CheckpointError::Truncated { tensor: None, .. }),
        "{e:?}"
    );
    // Shorter than the length prefix.
    std::fs::write(&p, [1u8, 2, 3]).unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(
        open_err(dir.path()),
        CheckpointError::Truncated { .. }
    ));
}

#[test]
fn error_bad_header() {
    let dir = tmp();
    let p = dir.path().join(SINGLE_FILE);
    let write = |header: &str, data: usize| {
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        b.extend(std::iter::repeat_n(0u8, data));
        std::fs::write(&p, b).unwrap_or_else(|e| panic!("{e}"));
    };
    write("{not json", 0);
    let e = open_err(dir.path());
    assert!(
        matches!(e, CheckpointError::BadHeader { tensor: None, .. }),
        "{e:?}"
    );
    assert_names(&e, &[&p.display().to_string()]);
    // Byte range not matching shape x dtype.
    write(
        r#"{"q": {"dtype": "F16", "shape": [4], "data_offsets": [0, 6]}}"#,
        6,
    );
    let e = open_err(dir.path());
    assert!(
        matches!(
            e,
            CheckpointError::BadHeader {
                tensor: Some(_),
                ..
            }
        ),
        "{e:?}"
    );
    assert_names(&e, &["`q`", "[4]"]);
    // Unknown dtype names the tensor.
    write(
        r#"{"q": {"dtype": "F9", "shape": [1], "data_offsets": [0, 2]}}"#,
        2,
    );
    assert_names(&open_err(dir.path()), &["`q`"]);
    // Header length absurd.
    std::fs::write(&p, u64::MAX.to_le_bytes()).unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(
        open_err(dir.path()),
        CheckpointError::BadHeader { .. }
    ));
}

#[test]
fn error_bad_index_json() {
    let dir = tmp();
    write_st(
        &dir.path().join("a.safetensors"),
        &[t("x", Dtype::F32, &[2], 0)],
    );
    let idx = dir.path().join(INDEX_FILE);
    let cases = [
        ("{oops".to_string(), "not JSON"),
        (json!({"metadata": {}}).to_string(), "weight_map"),
        (json!({"weight_map": {}}).to_string(), "empty"),
        (json!({"weight_map": {"x": 3}}).to_string(), "`x`"),
        (
            json!({"weight_map": {"x": "../a.safetensors"}}).to_string(),
            "../a.safetensors",
        ),
        (
            json!({"weight_map": {"x": "/etc/passwd"}}).to_string(),
            "/etc/passwd",
        ),
    ];
    for (text, word) in cases {
        std::fs::write(&idx, &text).unwrap_or_else(|e| panic!("{e}"));
        let e = open_err(dir.path());
        assert!(
            matches!(e, CheckpointError::BadIndex { .. }),
            "{text}: {e:?}"
        );
        assert_names(&e, &[word, INDEX_FILE]);
    }
}

#[test]
fn error_shard_missing_not_in_shard_duplicate() {
    let cfg = tiny();
    let dir = tmp();
    let shards = write_sharded(dir.path(), tiny_tensors(&cfg, Dtype::F16), 2);
    open(dir.path())
        .check_all(&cfg)
        .unwrap_or_else(|e| panic!("{e}"));

    // Shard missing: names the shard, the index and a tensor placed in it.
    let moved = dir.path().join("moved.bin");
    std::fs::rename(&shards[1], &moved).unwrap_or_else(|e| panic!("{e}"));
    let e = open_err(dir.path());
    assert!(matches!(e, CheckpointError::ShardMissing { .. }), "{e:?}");
    assert_names(
        &e,
        &[
            "model-00002-of-00002.safetensors",
            INDEX_FILE,
            "lm_head.weight",
        ],
    );
    std::fs::rename(&moved, &shards[1]).unwrap_or_else(|e| panic!("{e}"));

    // Index places a tensor in the wrong shard.
    let idx = dir.path().join(INDEX_FILE);
    let text = std::fs::read_to_string(&idx).unwrap_or_else(|e| panic!("{e}"));
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
    v["weight_map"]["lm_head.weight"] = json!("model-00001-of-00002.safetensors");
    std::fs::write(&idx, v.to_string()).unwrap_or_else(|e| panic!("{e}"));
    let e = open_err(dir.path());
    assert!(matches!(e, CheckpointError::NotInShard { .. }), "{e:?}");
    assert_names(&e, &["lm_head.weight", "model-00001-of-00002.safetensors"]);

    // The same tensor in two shards.
    std::fs::write(&idx, text).unwrap_or_else(|e| panic!("{e}"));
    write_st(
        &shards[1],
        &[
            t(
                "lm_head.weight",
                Dtype::F16,
                &[cfg.vocab_size, cfg.hidden_size],
                0,
            ),
            t(
                "model.embed_tokens.weight",
                Dtype::F16,
                &[cfg.vocab_size, cfg.hidden_size],
                0,
            ),
        ],
    );
    let e = open_err(dir.path());
    assert!(
        matches!(e, CheckpointError::DuplicateTensor { .. }),
        "{e:?}"
    );
    assert_names(&e, &["model.embed_tokens.weight", "00001", "00002"]);
}

#[test]
fn error_no_checkpoint() {
    let dir = tmp();
    let e = open_err(dir.path());
    assert!(matches!(e, CheckpointError::NoCheckpoint { .. }), "{e:?}");
    assert_names(&e, &[SINGLE_FILE, INDEX_FILE]);
}

#[test]
fn tensor_names_match_hf_layout() {
    let cfg = preset("llama-3-8b").unwrap_or_else(|e| panic!("{e}"));
    let names = llama_tensor_names(&cfg);
    assert_eq!(names.len(), 1 + 32 * 9 + 2);
    let find = |n: &str| {
        names
            .iter()
            .find(|e| e.name == n)
            .map(|e| e.shape.clone())
            .unwrap_or_else(|| panic!("no {n}"))
    };
    assert_eq!(find("model.embed_tokens.weight"), [128_256, 4096]);
    assert_eq!(
        find("model.layers.31.self_attn.k_proj.weight"),
        [1024, 4096]
    );
    assert_eq!(
        find("model.layers.31.self_attn.o_proj.weight"),
        [4096, 4096]
    );
    assert_eq!(find("model.layers.0.mlp.down_proj.weight"), [4096, 14_336]);
    assert_eq!(find("model.layers.0.mlp.gate_proj.weight"), [14_336, 4096]);
    assert_eq!(
        find("model.layers.0.post_attention_layernorm.weight"),
        [4096]
    );
    assert_eq!(find("lm_head.weight"), [128_256, 4096]);
    assert!(names.iter().all(|e| !e.name.ends_with(".bias")));
    let total: u64 = names
        .iter()
        .map(|e| e.shape.iter().product::<usize>() as u64)
        .sum();
    assert_eq!(total, cfg.param_count());
    // Llama with attention_bias and mlp_bias: biases on all four projections and the MLP.
    let mut b = cfg.clone();
    b.qkv_bias = true;
    b.o_bias = true;
    b.mlp_bias = true;
    let nb = llama_tensor_names(&b);
    assert_eq!(nb.len(), 1 + 32 * 16 + 2);
    let total: u64 = nb
        .iter()
        .map(|e| e.shape.iter().product::<usize>() as u64)
        .sum();
    assert_eq!(total, b.param_count());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random tensor sets written by the safetensors crate read back byte-exact and
    /// value-exact, whatever the dtypes, shapes (including empty and scalar) and order.
    #[test]
    fn prop_roundtrip(specs in prop::collection::vec(
        (0usize..3, prop::collection::vec(0usize..6, 0..4)), 1..8)) {
        let dir = tmp();
        let dtypes = [Dtype::F32, Dtype::F16, Dtype::BF16];
        let tensors: Vec<T> = specs
            .iter()
            .enumerate()
            .map(|(i, (d, shape))| t(&format!("t{i}"), dtypes[*d], shape, i))
            .collect();
        write_st(&dir.path().join(SINGLE_FILE), &tensors);
        let ck = open(dir.path());
        prop_assert_eq!(ck.len(), tensors.len());
        for x in &tensors {
            let r = ck.expect(&x.name, &x.shape, &[x.dtype]).unwrap_or_else(|e| panic!("{e}"));
            prop_assert_eq!(r.bytes, x.bytes.as_slice());
            let n: usize = x.shape.iter().product();
            let want: Vec<f32> = values(n, x.name[1..].parse().unwrap_or(0))
                .into_iter()
                .map(|v| match x.dtype {
                    Dtype::F16 => f16::from_f32(v).to_f32(),
                    Dtype::BF16 => bf16::from_f32(v).to_f32(),
                    _ => v,
                })
                .collect();
            prop_assert_eq!(r.to_vec::<f32>().unwrap_or_else(|e| panic!("{e}")), want);
        }
    }

    /// Cutting a valid file anywhere short of its end is an error at open (never a
    /// panic, never a silently short tensor).
    #[test]
    fn prop_any_truncation_is_an_error(cut in 0.0f64..1.0) {
        let dir = tmp();
        let p = one_file(dir.path());
        let len = std::fs::metadata(&p).unwrap_or_else(|e| panic!("{e}")).len();
        let keep = ((len as f64) * cut) as u64;
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap_or_else(|e| panic!("{e}"));
        f.set_len(keep.min(len - 1)).unwrap_or_else(|e| panic!("{e}"));
        drop(f);
        let e = open_err(dir.path());
        let is_truncated_or_bad_header = matches!(
            e,
            CheckpointError::Truncated { .. } | CheckpointError::BadHeader { .. }
        );
        prop_assert!(is_truncated_or_bad_header, "{:?}", e);
    }

    /// Random bytes in the header never panic the parser.
    #[test]
    fn prop_garbage_header_never_panics(garbage in prop::collection::vec(any::<u8>(), 0..200)) {
        let dir = tmp();
        let p = dir.path().join(SINGLE_FILE);
        let mut b = (garbage.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(&garbage);
        std::fs::write(&p, b).unwrap_or_else(|e| panic!("{e}"));
        // An empty-object header is valid (no tensors); anything else must be an error.
        match Checkpoint::open(dir.path()) {
            Ok(ck) => prop_assert_eq!(ck.len(), 0),
            Err(e) => prop_assert!(matches!(e, CheckpointError::BadHeader { .. }), "{:?}", e),
        }
    }
}
