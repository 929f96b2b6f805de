//! GGUF reader, writer, config and names: round trips, every malformed-file error, split
//! files, and a proptest over corrupted files.

use proptest::prelude::*;

use super::model::{
    gguf_tensor_name, hf_tensor_name, interleaved_to_rotate_half_rows, permute_rows,
    rotate_half_to_interleaved_rows,
};
use super::reader::split_path;
use super::write::GgufWriter;
use super::*;
use crate::config::{Architecture, RopeScaling};

fn every_value() -> Vec<(&'static str, Value)> {
    vec![
        ("u8", Value::U8(200)),
        ("i8", Value::I8(-100)),
        ("u16", Value::U16(60_000)),
        ("i16", Value::I16(-30_000)),
        ("u32", Value::U32(4_000_000_000)),
        ("i32", Value::I32(-2_000_000_000)),
        ("u64", Value::U64(u64::MAX - 1)),
        ("i64", Value::I64(i64::MIN + 1)),
        ("f32", Value::F32(1.5e-5)),
        ("f64", Value::F64(-2.25e300)),
        ("bool", Value::Bool(true)),
        ("string", Value::String("héllo ▁ world".into())),
        ("empty", Value::String(String::new())),
        ("a.u8", Value::Array(Array::U8(vec![1, 2, 255]))),
        ("a.i8", Value::Array(Array::I8(vec![-1, 2]))),
        ("a.u16", Value::Array(Array::U16(vec![7, 65535]))),
        ("a.i16", Value::Array(Array::I16(vec![-7]))),
        ("a.u32", Value::Array(Array::U32(vec![1, 2, 3]))),
        ("a.i32", Value::Array(Array::I32(vec![-3, 1, 6]))),
        ("a.u64", Value::Array(Array::U64(vec![u64::MAX]))),
        ("a.i64", Value::Array(Array::I64(vec![i64::MIN]))),
        ("a.f32", Value::Array(Array::F32(vec![0.0, -1.0, 3.5]))),
        ("a.f64", Value::Array(Array::F64(vec![1e-300]))),
        ("a.bool", Value::Array(Array::Bool(vec![true, false, true]))),
        (
            "a.str",
            Value::Array(Array::String(vec!["<s>".into(), "".into(), "▁a".into()])),
        ),
        ("a.empty", Value::Array(Array::F32(vec![]))),
        (
            "a.nested",
            Value::Array(Array::Array(vec![
                Array::U32(vec![1, 2]),
                Array::String(vec!["x".into()]),
                Array::Array(vec![Array::Bool(vec![false])]),
            ])),
        ),
    ]
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Deterministic bytes.
fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A file with a few metadata keys and tensors of mixed types.
fn small_file() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()));
    w.set("general.name", Value::String("tiny".into()));
    w.set(
        "tokenizer.ggml.tokens",
        Value::Array(Array::String(vec!["a".into(), "b".into()])),
    );
    w.add_tensor("t.f32", &[3, 2], GgmlType::F32, pattern(24, 1))
        .unwrap();
    w.add_tensor("t.q4_0", &[64, 3], GgmlType::Q4_0, pattern(6 * 18, 2))
        .unwrap();
    w.add_tensor("t.q6_k", &[256, 1], GgmlType::Q6_K, pattern(210, 3))
        .unwrap();
    w.add_tensor("t.f16", &[5], GgmlType::F16, pattern(10, 4))
        .unwrap();
    w
}

#[test]
fn type_table_matches_ggml() {
    use GgmlType::*;
    let want = [
        (F32, 0, 1, 4),
        (F16, 1, 1, 2),
        (Q4_0, 2, 32, 18),
        (Q4_1, 3, 32, 20),
        (Q5_0, 6, 32, 22),
        (Q5_1, 7, 32, 24),
        (Q8_0, 8, 32, 34),
        (Q8_1, 9, 32, 36),
        (Q2_K, 10, 256, 84),
        (Q3_K, 11, 256, 110),
        (Q4_K, 12, 256, 144),
        (Q5_K, 13, 256, 176),
        (Q6_K, 14, 256, 210),
        (Q8_K, 15, 256, 292),
        (IQ2_XXS, 16, 256, 66),
        (IQ2_XS, 17, 256, 74),
        (IQ3_XXS, 18, 256, 98),
        (IQ1_S, 19, 256, 50),
        (IQ4_NL, 20, 32, 18),
        (IQ3_S, 21, 256, 110),
        (IQ2_S, 22, 256, 82),
        (IQ4_XS, 23, 256, 136),
        (I8, 24, 1, 1),
        (I16, 25, 1, 2),
        (I32, 26, 1, 4),
        (I64, 27, 1, 8),
        (F64, 28, 1, 8),
        (IQ1_M, 29, 256, 56),
        (BF16, 30, 1, 2),
        (TQ1_0, 34, 256, 54),
        (TQ2_0, 35, 256, 66),
        (MXFP4, 39, 32, 17),
        (NVFP4, 40, 64, 36),
        (Q1_0, 41, 128, 18),
        (Q2_0, 42, 64, 18),
    ];
    assert_eq!(want.len(), GgmlType::ALL.len());
    for (ty, id, block, bytes) in want {
        assert_eq!(ty.id(), id, "{ty}");
        assert_eq!(GgmlType::from_id(id), Some(ty));
        assert_eq!((ty.block_size(), ty.type_size()), (block, bytes), "{ty}");
    }
    for id in [4, 5, 31, 32, 33, 36, 37, 38, 43, u32::MAX] {
        assert_eq!(GgmlType::from_id(id), None, "{id}");
    }
    assert_eq!(GgmlType::Q4_K.bytes_for(512), Some(288));
    assert_eq!(GgmlType::Q4_K.bytes_for(100), None);
}

#[test]
fn round_trip_every_value_type_v2_v3_and_alignments() {
    for version in [2, 3] {
        for align in [None, Some(1u32), Some(8), Some(64), Some(4096)] {
            let mut w = GgufWriter::new();
            w.version(version);
            if let Some(a) = align {
                w.alignment(a).unwrap();
            }
            for (k, v) in every_value() {
                w.set(k, v);
            }
            w.add_tensor("x", &[7], GgmlType::I8, pattern(7, 9))
                .unwrap();
            w.add_tensor("y", &[32, 2], GgmlType::Q8_0, pattern(68, 5))
                .unwrap();
            let bytes = w.to_bytes();
            let h = GgufHeader::parse(&bytes).unwrap();
            assert_eq!(h.version, version);
            let a = u64::from(align.unwrap_or(32));
            assert_eq!(h.alignment, a);
            assert_eq!(h.data_start % a, 0);
            let vals: Vec<_> = h
                .metadata
                .iter()
                .filter(|(k, _)| k != "general.alignment")
                .cloned()
                .collect();
            let want: Vec<_> = every_value()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
            assert_eq!(vals, want);
            assert_eq!(h.tensors.len(), 2);
            assert_eq!(h.tensors[1].dims, vec![32, 2]);
            assert_eq!(h.tensors[1].shape(), vec![2, 32]);
            assert_eq!(h.tensors[1].n_bytes, 68);
            assert_eq!(h.tensors[1].offset % a, 0);
            let s = (h.data_start + h.tensors[1].offset) as usize;
            assert_eq!(&bytes[s..s + 68], &pattern(68, 5)[..]);
        }
    }
}

#[test]
fn open_maps_tensors_without_copy_and_summarises() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    small_file().write_file(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.architecture().unwrap(), "llama");
    assert_eq!(f.tokens().unwrap(), &["a".to_string(), "b".to_string()]);
    let q = f.tensor("t.q4_0").unwrap();
    assert_eq!(q.shape(), vec![3, 64]);
    assert_eq!(q.row_bytes(), 36);
    assert_eq!(f.tensor_data(q).unwrap(), &pattern(108, 2)[..]);
    assert_eq!(
        f.tensor_data(f.tensor("t.f16").unwrap()).unwrap(),
        &pattern(10, 4)[..]
    );
    assert!(matches!(
        f.tensor("nope"),
        Err(GgufError::MissingTensor { tensor }) if tensor == "nope"
    ));
    let h = f.type_histogram();
    assert_eq!(h[&GgmlType::Q4_0].count, 1);
    assert_eq!(h[&GgmlType::Q4_0].bytes, 108);
    assert_eq!(h[&GgmlType::Q6_K].elements, 256);
    let s = f.summary();
    assert!(s.contains("general.name: string = \"tiny\""), "{s}");
    assert!(
        s.contains("tokenizer.ggml.tokens: array of string = [string; 2] = [\"a\", \"b\"]"),
        "{s}"
    );
    assert!(s.contains("q6_K"), "{s}");
}

#[test]
fn long_arrays_and_strings_are_shortened_in_display() {
    let v = Value::Array(Array::U32((0..100_000).collect()));
    assert_eq!(v.to_string(), "[u32; 100000] = [0, 1, 2, 3, 4, 5, ...]");
    let long = Value::String("x".repeat(1000));
    assert!(long.to_string().ends_with("... (1000 bytes)"));
}

fn expect_err(bytes: &[u8]) -> GgufError {
    match GgufHeader::parse(bytes) {
        Ok(_) => panic!("parsed a malformed file"),
        Err(e) => e,
    }
}

/// Byte position of the first occurrence of `needle`.
fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("needle")
}

#[test]
fn malformed_headers_are_errors_naming_the_field() {
    let good = small_file().to_bytes();

    let mut b = good.clone();
    b[0] = b'X';
    assert!(matches!(expect_err(&b), GgufError::BadMagic { .. }));
    for v in [0u32, 1, 4, u32::MAX] {
        let mut b = good.clone();
        b[4..8].copy_from_slice(&v.to_le_bytes());
        assert!(matches!(expect_err(&b), GgufError::BadVersion { found } if found == v));
    }
    // Absurd counts are refused before any allocation.
    for (at, what) in [(8, "tensor count"), (16, "metadata count")] {
        let mut b = good.clone();
        b[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        match expect_err(&b) {
            GgufError::TooMany { what: w, .. } => assert_eq!(w, what),
            e => panic!("{e}"),
        }
    }
    // The string length of the first key past the end of the file.
    let mut b = good.clone();
    b[24..32].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(
        matches!(expect_err(&b), GgufError::Truncated { what, .. } if what == "metadata key 0")
    );
    // An array count past the end names its key.
    let key = b"tokenizer.ggml.tokens";
    let at = find(&good, key) + key.len() + 4 + 4;
    let mut b = good.clone();
    b[at..at + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    match expect_err(&b) {
        GgufError::TooMany { what, .. } => {
            assert!(what.contains("tokenizer.ggml.tokens"), "{what}")
        }
        e => panic!("{e}"),
    }
    // An unknown value type names its key.
    let at = find(&good, b"general.name") + b"general.name".len();
    let mut b = good.clone();
    b[at..at + 4].copy_from_slice(&13u32.to_le_bytes());
    assert!(
        matches!(expect_err(&b), GgufError::BadValueType { key, id: 13 } if key == "general.name")
    );
    // A truncated header is an error at every cut.
    let h = GgufHeader::parse(&good).unwrap();
    for cut in 0..h.data_start as usize {
        assert!(GgufHeader::parse(&good[..cut]).is_err(), "cut at {cut}");
    }
}

/// The position of a tensor's (n_dims, dims, type, offset) fields.
fn tensor_fields(bytes: &[u8], name: &str) -> usize {
    let mut needle = (name.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(name.as_bytes());
    find(bytes, &needle) + needle.len()
}

#[test]
fn malformed_tensors_are_errors_naming_the_tensor() {
    let good = small_file().to_bytes();
    let at = tensor_fields(&good, "t.q4_0"); // n_dims 2, dims [64, 3], type, offset
    let (dims_at, type_at, off_at) = (at + 4, at + 4 + 16, at + 4 + 16 + 4);
    let named = |e: GgufError| e.to_string().contains("t.q4_0");

    let mut b = good.clone();
    b[type_at..type_at + 4].copy_from_slice(&4u32.to_le_bytes());
    let e = expect_err(&b);
    assert!(matches!(e, GgufError::UnknownType { id: 4, .. }) && named(e));

    let mut b = good.clone();
    b[dims_at..dims_at + 8].copy_from_slice(&48u64.to_le_bytes()); // not whole blocks
    let e = expect_err(&b);
    assert!(matches!(e, GgufError::BadShape { .. }) && named(e));

    let mut b = good.clone();
    b[dims_at + 8..dims_at + 16].copy_from_slice(&(u64::MAX / 3).to_le_bytes());
    let e = expect_err(&b);
    assert!(matches!(e, GgufError::BadShape { .. }) && named(e));

    let mut b = good.clone();
    b[at..at + 4].copy_from_slice(&5u32.to_le_bytes());
    let e = expect_err(&b);
    assert!(matches!(e, GgufError::BadShape { .. }) && named(e));

    let mut b = good.clone();
    b[off_at..off_at + 8].copy_from_slice(&1u64.to_le_bytes());
    let e = expect_err(&b);
    assert!(matches!(e, GgufError::Misaligned { offset: 1, .. }) && named(e));

    let mut b = good.clone();
    b[off_at..off_at + 8].copy_from_slice(&(1u64 << 20).to_le_bytes());
    let e = expect_err(&b);
    assert!(matches!(e, GgufError::OutOfFile { .. }) && named(e));

    let mut b = good.clone();
    b[off_at..off_at + 8].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
    assert!(matches!(expect_err(&b), GgufError::OutOfFile { .. }));

    // Pointing t.q4_0 at t.f32's bytes.
    let mut b = good.clone();
    b[off_at..off_at + 8].copy_from_slice(&0u64.to_le_bytes());
    assert!(matches!(expect_err(&b), GgufError::Overlap { .. }));

    // A truncated data section: the last tensor no longer fits.
    let e = expect_err(&good[..good.len() - 1]);
    assert!(
        matches!(e, GgufError::OutOfFile { ref tensor, .. } if tensor == "t.f16"),
        "{e}"
    );
}

#[test]
fn duplicates_alignment_and_nesting_are_checked() {
    // The writer replaces a key, so build a duplicate by renaming one.
    let mut w = GgufWriter::new();
    w.set("k.aa", Value::U8(1)).set("k.bb", Value::U8(2));
    let mut b = w.to_bytes();
    let at = find(&b, b"k.bb");
    b[at..at + 4].copy_from_slice(b"k.aa");
    assert!(matches!(expect_err(&b), GgufError::DuplicateKey { key } if key == "k.aa"));

    let mut w = GgufWriter::new();
    w.add_tensor("ta", &[1], GgmlType::F32, vec![0; 4]).unwrap();
    w.add_tensor("tb", &[1], GgmlType::F32, vec![0; 4]).unwrap();
    let mut b = w.to_bytes();
    let at = find(&b, b"tb");
    b[at..at + 2].copy_from_slice(b"ta");
    assert!(matches!(expect_err(&b), GgufError::DuplicateTensor { tensor } if tensor == "ta"));

    let mut w = GgufWriter::new();
    w.set("general.alignment", Value::U32(24));
    assert!(
        matches!(expect_err(&w.to_bytes()), GgufError::Invalid { key, .. } if key == "general.alignment")
    );
    w.set("general.alignment", Value::U64(32));
    assert!(
        matches!(expect_err(&w.to_bytes()), GgufError::WrongType { key, .. } if key == "general.alignment")
    );

    let mut a = Array::U8(vec![1]);
    for _ in 0..MAX_ARRAY_DEPTH {
        a = Array::Array(vec![a]);
    }
    let mut w = GgufWriter::new();
    w.set("deep", Value::Array(a.clone()));
    assert!(GgufHeader::parse(&w.to_bytes()).is_err());
    w.set(
        "deep",
        Value::Array(match a {
            Array::Array(mut v) => v.pop().unwrap(),
            _ => unreachable!(),
        }),
    );
    assert!(GgufHeader::parse(&w.to_bytes()).is_ok());

    let mut w = GgufWriter::new();
    w.set("s", Value::String("ok".into()));
    let mut b = w.to_bytes();
    let at = find(&b, b"ok");
    b[at] = 0xff;
    assert!(matches!(expect_err(&b), GgufError::Utf8 { what } if what.contains('s')));

    assert!(w.alignment(48).is_err());
    assert!(w
        .add_tensor("bad", &[16], GgmlType::Q4_0, vec![0; 9])
        .is_err());
}

#[test]
fn wrong_magic_file_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.gguf");
    std::fs::write(&path, b"GGML\x03\0\0\0").unwrap();
    let e = GgufFile::open(&path).unwrap_err();
    assert!(
        e.to_string().contains("x.gguf") && e.to_string().contains("magic"),
        "{e}"
    );
    let e = GgufFile::open(dir.path().join("none.gguf")).unwrap_err();
    assert!(matches!(e, GgufError::Io { .. }));
}

fn write_split(dir: &std::path::Path, count: usize, tamper: Option<usize>) -> std::path::PathBuf {
    let prefix = dir.join("model");
    for no in 0..count {
        let mut w = GgufWriter::new();
        if no == 0 {
            w.set("general.architecture", Value::String("llama".into()));
        }
        w.set(
            "split.no",
            Value::U16(if tamper == Some(no) { 7 } else { no as u16 }),
        );
        w.set("split.count", Value::U16(count as u16));
        w.set("split.tensors.count", Value::I32(2 * count as i32));
        for j in 0..2 {
            w.add_tensor(
                &format!("t{no}.{j}"),
                &[32],
                GgmlType::Q8_0,
                pattern(34, (no * 2 + j) as u8),
            )
            .unwrap();
        }
        w.write_file(split_path(&prefix, no, count)).unwrap();
    }
    split_path(&prefix, 1, count)
}

#[test]
fn split_files_are_merged() {
    let dir = tempfile::tempdir().unwrap();
    let second = write_split(dir.path(), 3, None);
    assert!(second.ends_with("model-00002-of-00003.gguf"));
    let f = GgufFile::open(&second).unwrap();
    assert_eq!(f.paths().len(), 3);
    assert!(f.paths()[0].ends_with("model-00001-of-00003.gguf"));
    assert_eq!(f.architecture().unwrap(), "llama");
    assert_eq!(f.tensors().len(), 6);
    for no in 0..3 {
        for j in 0..2 {
            let t = f.tensor(&format!("t{no}.{j}")).unwrap();
            assert_eq!(t.split, no);
            assert_eq!(
                f.tensor_data(t).unwrap(),
                &pattern(34, (no * 2 + j) as u8)[..]
            );
        }
    }
    assert_eq!(f.type_histogram()[&GgmlType::Q8_0].count, 6);

    std::fs::remove_file(dir.path().join("model-00003-of-00003.gguf")).unwrap();
    let e = GgufFile::open(&second).unwrap_err();
    assert!(e.to_string().contains("model-00003-of-00003.gguf"), "{e}");

    let dir = tempfile::tempdir().unwrap();
    let p = write_split(dir.path(), 2, Some(0));
    assert!(matches!(
        GgufFile::open(p).unwrap_err(),
        GgufError::Split { .. }
    ));

    // split.count > 1 under a name that is not a split name.
    let dir = tempfile::tempdir().unwrap();
    let p = write_split(dir.path(), 2, None);
    let renamed = dir.path().join("renamed.gguf");
    std::fs::rename(&p, &renamed).unwrap();
    assert!(matches!(
        GgufFile::open(renamed).unwrap_err(),
        GgufError::Split { .. }
    ));
}

/// What a tiny model file carries.
struct Tiny {
    arch: &'static str,
    tied: bool,
    qkv_bias: bool,
    rope_freqs: Option<Vec<f32>>,
}

const H: u64 = 8;
const HEADS: u64 = 2;
const KV: u64 = 1;
const HD: u64 = 4;
const FF: u64 = 12;
const VOCAB: u64 = 10;
const LAYERS: u64 = 2;

fn tiny(m: &Tiny) -> GgufWriter {
    let mut w = GgufWriter::new();
    let a = m.arch;
    w.set("general.architecture", Value::String(a.into()));
    w.set(&format!("{a}.context_length"), Value::U32(2048));
    w.set(&format!("{a}.embedding_length"), Value::U32(H as u32));
    w.set(&format!("{a}.block_count"), Value::U32(LAYERS as u32));
    w.set(&format!("{a}.feed_forward_length"), Value::U32(FF as u32));
    w.set(
        &format!("{a}.attention.head_count"),
        Value::U32(HEADS as u32),
    );
    w.set(
        &format!("{a}.attention.head_count_kv"),
        Value::U32(KV as u32),
    );
    w.set(
        &format!("{a}.attention.layer_norm_rms_epsilon"),
        Value::F32(1e-5),
    );
    w.set(&format!("{a}.rope.dimension_count"), Value::U32(HD as u32));
    w.set(&format!("{a}.rope.freq_base"), Value::F32(500_000.0));
    w.set("tokenizer.ggml.model", Value::String("llama".into()));
    w.set(
        "tokenizer.ggml.tokens",
        Value::Array(Array::String((0..VOCAB).map(|i| format!("t{i}")).collect())),
    );
    w.set(
        "tokenizer.ggml.scores",
        Value::Array(Array::F32(vec![0.0; VOCAB as usize])),
    );
    w.set(
        "tokenizer.ggml.token_type",
        Value::Array(Array::I32(vec![1; VOCAB as usize])),
    );
    w.set("tokenizer.ggml.bos_token_id", Value::U32(1));
    w.set("tokenizer.ggml.eos_token_id", Value::U32(2));
    w.set("tokenizer.ggml.eot_token_id", Value::U32(9));
    w.set("tokenizer.ggml.add_bos_token", Value::Bool(true));
    w.set("tokenizer.chat_template", Value::String("{{ x }}".into()));
    let mut add = |name: &str, shape: &[u64]| {
        let n: u64 = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|i| i as f32 * 0.01).collect();
        w.add_f32(name, shape, &v).unwrap();
    };
    add("token_embd.weight", &[VOCAB, H]);
    add("output_norm.weight", &[H]);
    if !m.tied {
        add("output.weight", &[VOCAB, H]);
    }
    for l in 0..LAYERS {
        add(&format!("blk.{l}.attn_norm.weight"), &[H]);
        add(&format!("blk.{l}.ffn_norm.weight"), &[H]);
        add(&format!("blk.{l}.attn_q.weight"), &[HEADS * HD, H]);
        add(&format!("blk.{l}.attn_k.weight"), &[KV * HD, H]);
        add(&format!("blk.{l}.attn_v.weight"), &[KV * HD, H]);
        add(&format!("blk.{l}.attn_output.weight"), &[H, HEADS * HD]);
        add(&format!("blk.{l}.ffn_gate.weight"), &[FF, H]);
        add(&format!("blk.{l}.ffn_up.weight"), &[FF, H]);
        add(&format!("blk.{l}.ffn_down.weight"), &[H, FF]);
        if m.qkv_bias {
            add(&format!("blk.{l}.attn_q.bias"), &[HEADS * HD]);
            add(&format!("blk.{l}.attn_k.bias"), &[KV * HD]);
            add(&format!("blk.{l}.attn_v.bias"), &[KV * HD]);
        }
    }
    if let Some(f) = &m.rope_freqs {
        w.add_f32("rope_freqs.weight", &[f.len() as u64], f)
            .unwrap();
    }
    w
}

fn open(w: &GgufWriter) -> (tempfile::TempDir, GgufFile) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    w.write_file(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    (dir, f)
}

const LLAMA: Tiny = Tiny {
    arch: "llama",
    tied: false,
    qkv_bias: false,
    rope_freqs: None,
};

#[test]
fn llama_config_from_metadata() {
    let (_d, f) = open(&tiny(&LLAMA));
    let c = f.model_config().unwrap();
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!(
        (c.hidden_size, c.intermediate_size, c.num_hidden_layers),
        (8, 12, 2)
    );
    assert_eq!(
        (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
        (2, 1, 4)
    );
    assert_eq!((c.vocab_size, c.max_position_embeddings), (10, 2048));
    assert_eq!(c.rms_norm_eps, f64::from(1e-5f32));
    assert_eq!(c.rope_theta, 500_000.0);
    assert_eq!(c.rope_scaling, RopeScaling::None);
    assert!(!c.tie_word_embeddings && !c.qkv_bias && !c.o_bias && !c.mlp_bias);
    assert_eq!(c.bos_token_id, Some(1));
    assert_eq!(c.eos_token_ids, vec![2, 9]);
    assert!(f.qk_rows_interleaved().unwrap());

    let (_d, f) = open(&tiny(&Tiny {
        tied: true,
        ..LLAMA
    }));
    assert!(f.model_config().unwrap().tie_word_embeddings);
}

#[test]
fn qwen2_config_needs_its_biases() {
    let (_d, f) = open(&tiny(&Tiny {
        arch: "qwen2",
        qkv_bias: true,
        ..LLAMA
    }));
    let c = f.model_config().unwrap();
    assert_eq!(c.architecture, Architecture::Qwen2);
    assert!(c.qkv_bias && !c.o_bias);
    assert!(!f.qk_rows_interleaved().unwrap());

    let (_d, f) = open(&tiny(&Tiny {
        arch: "qwen2",
        ..LLAMA
    }));
    assert!(matches!(
        f.model_config(),
        Err(GgufError::Unsupported { .. })
    ));
    // Llama with q/k/v biases but no output bias disagrees with ModelConfig's llama.
    let (_d, f) = open(&tiny(&Tiny {
        qkv_bias: true,
        ..LLAMA
    }));
    assert!(matches!(
        f.model_config(),
        Err(GgufError::Unsupported { .. })
    ));
}

#[test]
fn config_errors_name_the_key_or_tensor() {
    for key in [
        "llama.embedding_length",
        "llama.block_count",
        "llama.feed_forward_length",
        "llama.attention.head_count",
        "llama.attention.layer_norm_rms_epsilon",
        "llama.context_length",
    ] {
        let w = tiny(&LLAMA);
        let mut b = w.to_bytes();
        // Rename the key so it is absent.
        let at = find(&b, key.as_bytes());
        b[at] = b'X';
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.gguf");
        std::fs::write(&p, b).unwrap();
        let e = GgufFile::open(&p).unwrap().model_config().unwrap_err();
        assert!(
            matches!(&e, GgufError::MissingKey { key: k } if k == key),
            "{key}: {e}"
        );
    }
    let mut w = tiny(&LLAMA);
    w.set("general.architecture", Value::String("gpt2".into()));
    let (_d, f) = open(&w);
    assert!(
        matches!(f.model_config(), Err(GgufError::Unsupported { what, .. }) if what == "general.architecture")
    );

    let mut w = tiny(&LLAMA);
    w.set("llama.rope.dimension_count", Value::U32(2));
    let (_d, f) = open(&w);
    assert!(
        matches!(f.model_config(), Err(GgufError::Unsupported { what, .. }) if what == "llama.rope.dimension_count")
    );

    let mut w = tiny(&LLAMA);
    w.set("llama.block_count", Value::String("2".into()));
    let (_d, f) = open(&w);
    assert!(
        matches!(f.model_config(), Err(GgufError::WrongType { key, .. }) if key == "llama.block_count")
    );

    let mut w = tiny(&LLAMA);
    w.set("llama.rope.scaling.type", Value::String("yarn".into()));
    let (_d, f) = open(&w);
    assert!(
        matches!(f.model_config(), Err(GgufError::Unsupported { what, .. }) if what == "llama.rope.scaling.type")
    );

    let mut w = tiny(&LLAMA);
    w.set("llama.rope.scaling.type", Value::String("linear".into()));
    w.set("llama.rope.scaling.factor", Value::F32(4.0));
    let (_d, f) = open(&w);
    assert_eq!(
        f.model_config().unwrap().rope_scaling,
        RopeScaling::Linear { factor: 4.0 }
    );

    // More layers in the metadata than tensors.
    let mut w = tiny(&LLAMA);
    w.set("llama.block_count", Value::U32(3));
    let (_d, f) = open(&w);
    assert!(
        matches!(f.model_config(), Err(GgufError::MissingTensor { tensor }) if tensor == "blk.2.attn_norm.weight")
    );
    // Fewer.
    let mut w = tiny(&LLAMA);
    w.set("llama.block_count", Value::U32(1));
    let (_d, f) = open(&w);
    assert!(
        matches!(f.model_config(), Err(GgufError::TensorMismatch { tensor, .. }) if tensor.starts_with("blk.1."))
    );
    // A width that disagrees with the tensors.
    let mut w = tiny(&LLAMA);
    w.set("llama.feed_forward_length", Value::U32(16));
    let (_d, f) = open(&w);
    assert!(
        matches!(f.model_config(), Err(GgufError::TensorMismatch { tensor, .. }) if tensor == "blk.0.ffn_gate.weight")
    );
    // More tokens than embedding rows.
    let mut w = tiny(&LLAMA);
    w.set(
        "tokenizer.ggml.tokens",
        Value::Array(Array::String(vec![String::new(); 11])),
    );
    let (_d, f) = open(&w);
    assert!(
        matches!(f.model_config(), Err(GgufError::Invalid { key, .. }) if key == "tokenizer.ggml.tokens")
    );
}

/// llama.cpp's converter's factors for Llama 3.1 scaling (in f32, as it computes them).
fn llama31_factors(theta: f64, dim: usize, factor: f64) -> Vec<f32> {
    (0..dim / 2)
        .map(|i| {
            let freq = (1.0 / theta.powf((2 * i) as f64 / dim as f64)) as f32;
            let wavelen = 2.0 * std::f32::consts::PI / freq;
            let (old, low, high) = (8192.0f32, 1.0f32, 4.0f32);
            if wavelen < old / high {
                1.0
            } else if wavelen > old / low {
                factor as f32
            } else {
                let smooth = (old / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor as f32 + smooth)
            }
        })
        .collect()
}

#[test]
fn rope_freqs_tensor_is_llama31_scaling_or_an_error() {
    // head_dim 4 is too narrow to reach the blend band; test the detector at 128 too.
    let hd128 = llama31_factors(500_000.0, 128, 8.0);
    assert!(hd128.iter().any(|&f| f > 1.0 && f < 8.0));
    assert_eq!(
        super::model::llama3_factor_mismatch(&hd128, 8.0, 500_000.0, 128, 8192),
        None
    );
    let mut off = hd128.clone();
    off[40] *= 1.01;
    assert_eq!(
        super::model::llama3_factor_mismatch(&off, 8.0, 500_000.0, 128, 8192),
        Some(40)
    );

    let (_d, f) = open(&tiny(&Tiny {
        rope_freqs: Some(llama31_factors(500_000.0, 4, 8.0)),
        ..LLAMA
    }));
    assert_eq!(
        f.model_config().unwrap().rope_scaling,
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192
        }
    );
    let (_d, f) = open(&tiny(&Tiny {
        rope_freqs: Some(vec![1.5, 3.0]),
        ..LLAMA
    }));
    let e = f.model_config().unwrap_err();
    assert!(
        matches!(&e, GgufError::Unsupported { what, .. } if what == "rope_freqs.weight"),
        "{e}"
    );
    let (_d, f) = open(&tiny(&Tiny {
        rope_freqs: Some(vec![1.0; 3]),
        ..LLAMA
    }));
    assert!(matches!(
        f.model_config(),
        Err(GgufError::Unsupported { .. })
    ));
}

#[test]
fn tokenizer_spec_from_metadata() {
    let (_d, f) = open(&tiny(&LLAMA));
    let s = f.tokenizer_spec().unwrap();
    assert_eq!(s.model, "llama");
    assert_eq!(s.tokens.len(), 10);
    assert_eq!(s.scores.as_deref(), Some(&[0.0f32; 10][..]));
    assert_eq!(s.token_types.as_deref(), Some(&[1i32; 10][..]));
    assert_eq!((s.bos_id, s.eos_id, s.eot_id), (Some(1), Some(2), Some(9)));
    assert_eq!(s.add_bos, Some(true));
    assert_eq!(s.merges, None);
    assert_eq!(s.chat_template.as_deref(), Some("{{ x }}"));
    let mut w = tiny(&LLAMA);
    w.set("tokenizer.ggml.scores", Value::String("x".into()));
    let (_d, f) = open(&w);
    assert!(
        matches!(f.tokenizer_spec(), Err(GgufError::WrongType { key, .. }) if key == "tokenizer.ggml.scores")
    );
}

#[test]
fn tensor_names_map_both_ways() {
    let pairs = [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.weight", "lm_head.weight"),
        (
            "blk.0.attn_q.weight",
            "model.layers.0.self_attn.q_proj.weight",
        ),
        (
            "blk.1.attn_k.weight",
            "model.layers.1.self_attn.k_proj.weight",
        ),
        (
            "blk.2.attn_v.weight",
            "model.layers.2.self_attn.v_proj.weight",
        ),
        (
            "blk.31.attn_output.weight",
            "model.layers.31.self_attn.o_proj.weight",
        ),
        (
            "blk.0.ffn_gate.weight",
            "model.layers.0.mlp.gate_proj.weight",
        ),
        ("blk.0.ffn_up.weight", "model.layers.0.mlp.up_proj.weight"),
        (
            "blk.0.ffn_down.weight",
            "model.layers.0.mlp.down_proj.weight",
        ),
        (
            "blk.7.attn_norm.weight",
            "model.layers.7.input_layernorm.weight",
        ),
        (
            "blk.7.ffn_norm.weight",
            "model.layers.7.post_attention_layernorm.weight",
        ),
        ("blk.0.attn_q.bias", "model.layers.0.self_attn.q_proj.bias"),
        (
            "blk.0.attn_output.bias",
            "model.layers.0.self_attn.o_proj.bias",
        ),
    ];
    for (g, h) in pairs {
        assert_eq!(hf_tensor_name(g).as_deref(), Some(h), "{g}");
        assert_eq!(gguf_tensor_name(h).as_deref(), Some(g), "{h}");
    }
    for g in [
        "rope_freqs.weight",
        "blk.x.attn_q.weight",
        "blk.0.attn_q.scale",
        "blk.0.foo.weight",
    ] {
        assert_eq!(hf_tensor_name(g), None, "{g}");
    }
    let (_d, f) = open(&tiny(&LLAMA));
    assert_eq!(
        f.hf_tensor("model.layers.1.mlp.down_proj.weight")
            .unwrap()
            .name,
        "blk.1.ffn_down.weight"
    );
}

#[test]
fn qk_permutation_hand_example_inverse_and_kernels_agree() {
    // One head of 8 rows: HF rows (0..4 | 4..8) are the rotate-half halves.
    assert_eq!(
        rotate_half_to_interleaved_rows(1, 8).unwrap(),
        vec![0, 4, 1, 5, 2, 6, 3, 7]
    );
    assert_eq!(
        interleaved_to_rotate_half_rows(1, 8).unwrap(),
        vec![0, 2, 4, 6, 1, 3, 5, 7]
    );
    assert_eq!(
        rotate_half_to_interleaved_rows(2, 4).unwrap(),
        vec![0, 2, 1, 3, 4, 6, 5, 7]
    );
    assert!(rotate_half_to_interleaved_rows(2, 3).is_err());
    for (heads, hd) in [(1, 2), (3, 8), (32, 128), (8, 64)] {
        let fwd = rotate_half_to_interleaved_rows(heads, hd).unwrap();
        let inv = interleaved_to_rotate_half_rows(heads, hd).unwrap();
        for r in 0..fwd.len() {
            assert_eq!(fwd[inv[r]], r);
            assert_eq!(inv[fwd[r]], r);
        }
        // The order the engine puts q/k in on the device is llama.cpp's order.
        assert_eq!(
            fwd,
            fl_kernels::rope::rotate_half_to_interleaved_rows(heads, hd, hd).unwrap()
        );
    }
    // Whole rows of Q8_0 blocks (34 bytes) move together and come back.
    let rows = 2 * 6;
    let data = pattern(rows * 34, 7);
    let order = rotate_half_to_interleaved_rows(2, 6).unwrap();
    let p = permute_rows(&data, 34, &order).unwrap();
    assert_eq!(&p[34..68], &data[3 * 34..4 * 34]);
    let back = permute_rows(&p, 34, &interleaved_to_rotate_half_rows(2, 6).unwrap()).unwrap();
    assert_eq!(back, data);
    assert!(permute_rows(&data, 33, &order).is_err());
    assert!(permute_rows(&data[..34 * 2], 34, &[0, 0]).is_err());
}

/// The converter's permutation makes interleaved RoPE on the permuted q/k compute the same
/// scores as rotate-half RoPE on the Hugging Face rows.
#[test]
fn permuted_rows_with_interleaved_rope_give_the_same_scores() {
    let hd = 8;
    let theta = 10_000f64;
    let pos = [3.0, 11.0];
    let q: Vec<f64> = (0..hd).map(|i| (i as f64 * 0.7).sin()).collect();
    let k: Vec<f64> = (0..hd).map(|i| (i as f64 * 1.3).cos()).collect();
    let freq = |i: usize| theta.powf(-((2 * i) as f64) / hd as f64);
    let rot_half = |x: &[f64], p: f64| -> Vec<f64> {
        let h = hd / 2;
        let mut y = x.to_vec();
        for i in 0..h {
            let (c, s) = ((p * freq(i)).cos(), (p * freq(i)).sin());
            y[i] = x[i] * c - x[i + h] * s;
            y[i + h] = x[i + h] * c + x[i] * s;
        }
        y
    };
    let interleaved = |x: &[f64], p: f64| -> Vec<f64> {
        let mut y = x.to_vec();
        for i in 0..hd / 2 {
            let (c, s) = ((p * freq(i)).cos(), (p * freq(i)).sin());
            y[2 * i] = x[2 * i] * c - x[2 * i + 1] * s;
            y[2 * i + 1] = x[2 * i + 1] * c + x[2 * i] * s;
        }
        y
    };
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let order = rotate_half_to_interleaved_rows(1, hd).unwrap();
    let perm = |x: &[f64]| order.iter().map(|&r| x[r]).collect::<Vec<_>>();
    let hf = dot(&rot_half(&q, pos[0]), &rot_half(&k, pos[1]));
    let gg = dot(
        &interleaved(&perm(&q), pos[0]),
        &interleaved(&perm(&k), pos[1]),
    );
    assert!((hf - gg).abs() < 1e-12, "{hf} {gg}");
}

/// Bytes a parsed header holds on the heap (structs and their contents).
fn heap_estimate(h: &GgufHeader) -> usize {
    fn array(a: &Array) -> usize {
        let elems = match a {
            Array::String(v) => v.iter().map(|s| 24 + s.len()).sum(),
            Array::Array(v) => v
                .iter()
                .map(|x| std::mem::size_of::<Array>() + array(x))
                .sum(),
            Array::U8(_) | Array::I8(_) | Array::Bool(_) => a.len(),
            Array::U16(_) | Array::I16(_) => 2 * a.len(),
            Array::U32(_) | Array::I32(_) | Array::F32(_) => 4 * a.len(),
            _ => 8 * a.len(),
        };
        elems
    }
    let meta: usize = h
        .metadata
        .iter()
        .map(|(k, v)| {
            std::mem::size_of::<(String, Value)>()
                + k.len()
                + match v {
                    Value::String(s) => s.len(),
                    Value::Array(a) => array(a),
                    _ => 0,
                }
        })
        .sum();
    let tensors: usize = h
        .tensors
        .iter()
        .map(|t| std::mem::size_of::<TensorInfo>() + t.name.len() + 8 * t.dims.len())
        .sum();
    meta + tensors
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Truncating, flipping header bytes or writing huge counts anywhere in the header gives
    /// `Err` or a header whose tensors lie inside the file, never a panic.
    #[test]
    fn corrupted_files_never_panic(
        cut in any::<prop::sample::Index>(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        huge in prop::option::of((any::<prop::sample::Index>(), prop::sample::select(vec![
            u64::MAX, u64::MAX / 2, 1u64 << 40, 1u64 << 32, 0xffff_ffff, 4096,
        ]))),
        truncate in any::<bool>(),
        model in any::<bool>(),
    ) {
        let good = if model { tiny(&LLAMA).to_bytes() } else { small_file().to_bytes() };
        let header_len = GgufHeader::parse(&good).unwrap().data_start as usize;
        let mut b = good.clone();
        for (i, x) in &flips {
            b[i.index(header_len)] ^= x | 1;
        }
        if let Some((i, v)) = huge {
            let at = i.index(header_len - 8);
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        if truncate {
            b.truncate(cut.index(b.len() + 1));
        }
        if let Ok(h) = GgufHeader::parse(&b) {
            for t in &h.tensors {
                prop_assert!(h.data_start + t.offset + t.n_bytes <= b.len() as u64);
                prop_assert_eq!(t.offset % h.alignment, 0);
            }
            // What the parse holds stays within a small multiple of the file.
            prop_assert!(heap_estimate(&h) <= 16 * b.len() + 4096);
        }
    }

    /// Any writer-built file of random metadata and tensors reads back exactly.
    #[test]
    fn random_files_round_trip(
        vals in prop::collection::vec((0usize..27, any::<u32>()), 0..12),
        tensors in prop::collection::vec((0usize..4, 1u64..4, 1u64..3), 0..6),
        align_pow in 0u32..8,
    ) {
        let all = every_value();
        let mut w = GgufWriter::new();
        w.alignment(1 << align_pow).unwrap();
        let mut want = vec![("general.alignment".to_string(), Value::U32(1 << align_pow))];
        for (i, (pick, salt)) in vals.iter().enumerate() {
            let k = format!("k{i}.{salt}");
            let v = all[*pick].1.clone();
            w.set(&k, v.clone());
            want.push((k, v));
        }
        let types = [GgmlType::F32, GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::BF16];
        let mut datas = Vec::new();
        for (i, (ti, blocks, rows)) in tensors.iter().enumerate() {
            let ty = types[*ti];
            let dims = [ty.block_size() * blocks, *rows];
            let n = (ty.type_size() * blocks * rows) as usize;
            let d = pattern(n, i as u8);
            w.add_tensor(&format!("t{i}"), &dims, ty, d.clone()).unwrap();
            datas.push((dims, ty, d));
        }
        let bytes = w.to_bytes();
        let h = GgufHeader::parse(&bytes).unwrap();
        prop_assert_eq!(&h.metadata, &want);
        prop_assert_eq!(h.tensors.len(), datas.len());
        for (t, (dims, ty, d)) in h.tensors.iter().zip(&datas) {
            prop_assert_eq!(&t.dims[..], &dims[..]);
            prop_assert_eq!(t.ggml_type, *ty);
            let s = (h.data_start + t.offset) as usize;
            prop_assert_eq!(&bytes[s..s + d.len()], &d[..]);
        }
    }
}

#[test]
fn writer_f32_helper_matches_shape() {
    let mut w = GgufWriter::new();
    assert!(w.add_f32("x", &[2, 3], &[0.0; 5]).is_err());
    w.add_f32("x", &[2, 3], &[1.0; 6]).unwrap();
    let bytes = w.to_bytes();
    let h = GgufHeader::parse(&bytes).unwrap();
    assert_eq!(h.tensors[0].dims, vec![3, 2]);
    let s = h.data_start as usize;
    assert_eq!(&bytes[s..s + 24], &f32_bytes(&[1.0; 6])[..]);
}

/// The reader's type table (every ggml id, to size any tensor of a file) and fl-kernels'
/// (the formats with kernels and CPU references) are two tables of one fact: they must agree
/// on every type both know.
#[test]
fn type_table_agrees_with_fl_kernels() {
    use fl_kernels::ggml::GgmlType as K;
    for k in K::ALL {
        let t = GgmlType::from_id(k.id()).unwrap_or_else(|| panic!("id {} unknown here", k.id()));
        assert_eq!(t.name(), k.name(), "id {}", k.id());
        assert_eq!(t.block_size(), k.block_elems() as u64, "{}", k.name());
        assert_eq!(t.type_size(), k.block_bytes() as u64, "{}", k.name());
    }
}
