//! CPU tests of the algorithm-cache file: round trip, stale and corrupt files, bad entries
//! (run in CI, no GPU needed).

use fl_blas::{AlgoCache, CacheKey, CachedAlgo, GemmDType, GemmShape};

const GPU: &str = "NVIDIA H100 80GB HBM3";
const VER: usize = 130_001;

fn sample() -> AlgoCache {
    let mut c = AlgoCache::new(GPU, VER);
    c.entries.insert(
        CacheKey {
            shape: GemmShape::new(2048, 11008, 4096, GemmDType::Bf16),
            align: 256,
        },
        CachedAlgo {
            // Large words survive (u64 above 2^53 would be corrupted by an f64 round trip).
            words: [u64::MAX, 1, 2, 3, 1 << 60, 5, 6, 0x8000_0000_0000_0001],
            workspace: 4 << 20,
            time_ms: Some(0.731),
        },
    );
    c.entries.insert(
        CacheKey {
            shape: GemmShape {
                batch: 32,
                bias: true,
                shared_b: true,
                ..GemmShape::new(7, 33, 129, GemmDType::Tf32)
            },
            align: 16,
        },
        CachedAlgo {
            words: [9, 8, 7, 6, 5, 4, 3, 2],
            workspace: 0,
            time_ms: None,
        },
    );
    c
}

#[test]
fn round_trip_keeps_every_entry_exactly() {
    let c = sample();
    let json = c.to_json();
    let load = AlgoCache::from_json(&json, GPU, VER);
    assert!(load.warnings.is_empty(), "{:?}", load.warnings);
    assert_eq!(load.cache, c);
    assert_eq!(load.cache.entries.len(), 2);
}

#[test]
fn other_gpu_is_stale_and_ignored() {
    let json = sample().to_json();
    let load = AlgoCache::from_json(&json, "NVIDIA A100-SXM4-80GB", VER);
    assert!(load.cache.entries.is_empty());
    assert_eq!(load.cache.gpu, "NVIDIA A100-SXM4-80GB");
    assert_eq!(load.warnings.len(), 1);
    assert!(load.warnings[0].contains("stale"), "{:?}", load.warnings);
}

#[test]
fn other_cublaslt_version_is_stale_and_ignored() {
    let json = sample().to_json();
    let load = AlgoCache::from_json(&json, GPU, VER + 1);
    assert!(load.cache.entries.is_empty());
    assert_eq!(load.warnings.len(), 1);
    assert!(load.warnings[0].contains("cuBLASLt"), "{:?}", load.warnings);
}

#[test]
fn corrupt_files_are_ignored_with_a_warning() {
    let good = sample().to_json();
    let truncated = &good[..good.len() / 2];
    for text in [
        "",
        "not json",
        truncated,
        "[]",
        "{\"format\": \"fl-blas-algo-cache\"}",
        &good.replace("fl-blas-algo-cache", "something-else"),
        &good.replace("\"version\": 1", "\"version\": 2"),
    ] {
        let load = AlgoCache::from_json(text, GPU, VER);
        assert!(load.cache.entries.is_empty(), "accepted {text:?}");
        assert_eq!(load.warnings.len(), 1, "{text:?}: {:?}", load.warnings);
    }
}

fn file_with_entries(entries: &[&str]) -> String {
    format!(
        r#"{{"format": "fl-blas-algo-cache", "version": 1, "gpu": "{GPU}", "cublaslt_version": {VER}, "entries": [{}]}}"#,
        entries.join(",")
    )
}

const GOOD: &str = r#"{"m": 4, "n": 5, "k": 6, "batch": 1, "dtype": "f16", "bias": false,
    "shared_b": false, "align": 256, "algo": [1,2,3,4,5,6,7,8], "workspace": 0}"#;

#[test]
fn bad_entries_are_skipped_and_good_ones_kept() {
    let bad = [
        // 7 words
        r#"{"m": 1, "n": 1, "k": 1, "batch": 1, "dtype": "f16", "bias": false, "shared_b": false, "align": 256, "algo": [1,2,3,4,5,6,7], "workspace": 0}"#,
        // unknown dtype
        r#"{"m": 1, "n": 1, "k": 1, "batch": 1, "dtype": "f8", "bias": false, "shared_b": false, "align": 256, "algo": [1,2,3,4,5,6,7,8], "workspace": 0}"#,
        // zero size
        r#"{"m": 0, "n": 1, "k": 1, "batch": 1, "dtype": "f16", "bias": false, "shared_b": false, "align": 256, "algo": [1,2,3,4,5,6,7,8], "workspace": 0}"#,
        // alignment not a power of two
        r#"{"m": 1, "n": 1, "k": 1, "batch": 1, "dtype": "f16", "bias": false, "shared_b": false, "align": 24, "algo": [1,2,3,4,5,6,7,8], "workspace": 0}"#,
        // negative word
        r#"{"m": 1, "n": 1, "k": 1, "batch": 1, "dtype": "f16", "bias": false, "shared_b": false, "align": 256, "algo": [-1,2,3,4,5,6,7,8], "workspace": 0}"#,
        // missing field
        r#"{"m": 1, "n": 1, "k": 1, "batch": 1, "dtype": "f16", "bias": false, "align": 256, "algo": [1,2,3,4,5,6,7,8], "workspace": 0}"#,
        // unknown field
        r#"{"m": 1, "n": 1, "k": 1, "batch": 1, "dtype": "f16", "bias": false, "shared_b": false, "align": 256, "algo": [1,2,3,4,5,6,7,8], "workspace": 0, "extra": 1}"#,
        // not an object
        r#"17"#,
    ];
    let mut all = vec![GOOD];
    all.extend_from_slice(&bad);
    let load = AlgoCache::from_json(&file_with_entries(&all), GPU, VER);
    assert_eq!(load.cache.entries.len(), 1, "{:?}", load.cache.entries);
    assert_eq!(load.warnings.len(), bad.len(), "{:?}", load.warnings);
    for (i, w) in load.warnings.iter().enumerate() {
        assert!(w.starts_with(&format!("entry {}:", i + 1)), "{w}");
    }
    let (key, algo) = load.cache.entries.iter().next().unwrap();
    assert_eq!(
        (key.shape.m, key.shape.n, key.shape.k),
        (4, 5, 6),
        "wrong entry kept"
    );
    assert_eq!(key.shape.dtype, GemmDType::F16);
    assert_eq!(algo.words, [1, 2, 3, 4, 5, 6, 7, 8]);
}

#[test]
fn duplicate_entries_warn_and_keep_the_later() {
    let later = GOOD.replace("[1,2,3,4,5,6,7,8]", "[8,7,6,5,4,3,2,1]");
    let load = AlgoCache::from_json(&file_with_entries(&[GOOD, &later]), GPU, VER);
    assert_eq!(load.cache.entries.len(), 1);
    assert_eq!(load.warnings.len(), 1, "{:?}", load.warnings);
    let algo = load.cache.entries.values().next().unwrap();
    assert_eq!(algo.words, [8, 7, 6, 5, 4, 3, 2, 1]);
}

#[test]
fn dtype_names_round_trip() {
    for d in [
        GemmDType::F32,
        GemmDType::Tf32,
        GemmDType::F16,
        GemmDType::Bf16,
    ] {
        assert_eq!(GemmDType::parse(d.as_str()), Some(d));
    }
    assert_eq!(GemmDType::parse("F16"), None);
}
