//! GPU tests of autotuning and of algorithm-cache files (save, load, stale, garbage
//! algorithms refused by cublasLtMatmulAlgoCheck). A separate test binary from
//! `gemm.rs`, so that a library fault on a garbage algorithm cannot take the GEMM tests
//! down with it.

mod common;

use common::{run_case, Case};
use fl_blas::{Blas, GemmDType, GemmShape};
use fl_kernels::f16;
use fl_kernels::testing::{gpu_or_skip, rng, tolerance};

fn temp_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("fl-blas-{}-{name}.json", std::process::id()))
}

#[test]
fn autotune_save_load_and_refuse_bad_algorithms() {
    let Some(gpu) = gpu_or_skip("autotune_save_load_and_refuse_bad_algorithms") else {
        return;
    };
    let mut r = rng("autotune");
    let shape = GemmShape {
        bias: true,
        ..GemmShape::new(33, 129, 257, GemmDType::F16)
    };
    let case = Case {
        bias: true,
        ..Case::plain(33, 129, 257)
    };
    let path = temp_path("autotune");
    {
        let mut blas = Blas::new(&gpu).unwrap();
        let res = blas.autotune(&[shape], 8).unwrap();
        assert_eq!(res.len(), 1);
        assert!(res[0].candidates >= 1, "{res:?}");
        // heuristic_ms is NaN when the heuristic's first choice failed to launch
        assert!(res[0].best_ms > 0.0, "{res:?}");
        assert!(
            res[0].heuristic_ms.is_nan() || res[0].best_ms <= res[0].heuristic_ms,
            "{res:?}"
        );
        assert!(blas.algo_cache().entries.keys().any(|k| k.shape == shape));
        // the tuned algorithm is used and correct
        let err = run_case::<f16>(&gpu, &mut blas, case, &mut r);
        assert!(err <= tolerance::<f16>(), "autotuned: {err:e}");
        blas.save_algo_cache(&path).unwrap();
    }
    let text = std::fs::read_to_string(&path).unwrap();
    // A fresh handle loads it without warnings and uses it.
    let mut blas = Blas::new(&gpu).unwrap();
    let warnings = blas.load_algo_cache(&path).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    let loaded = *blas
        .algo_cache()
        .entries
        .iter()
        .find(|(k, _)| k.shape == shape)
        .expect("entry loaded")
        .1;
    let err = run_case::<f16>(&gpu, &mut blas, case, &mut r);
    assert!(err <= tolerance::<f16>(), "loaded: {err:e}");
    let after = blas
        .algo_cache()
        .entries
        .values()
        .copied()
        .collect::<Vec<_>>();
    assert!(
        after.contains(&loaded),
        "a valid loaded algorithm was replaced"
    );

    // A stale file (other GPU) adds nothing and warns.
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut stale = doc.clone();
    stale["gpu"] = serde_json::Value::from("Some Other GPU");
    let stale_path = temp_path("stale");
    std::fs::write(&stale_path, stale.to_string()).unwrap();
    let mut fresh = Blas::new(&gpu).unwrap();
    let w = fresh.load_algo_cache(&stale_path).unwrap();
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(fresh.algo_cache().entries.is_empty());

    // A well-formed file whose algorithm is garbage (one entry per possible pointer
    // alignment, so the call below meets one whatever its alignment): accepted by the
    // parser, refused by cublasLtMatmulAlgoCheck on first use and replaced by the
    // heuristic's choice; the result is correct.
    let garbage = [u64::MAX; 8];
    let mut bad = doc.clone();
    let entry = doc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["m"] == 33 && e["n"] == 129 && e["k"] == 257)
        .expect("tuned entry in the file")
        .clone();
    let mut entries = Vec::new();
    for shift in 0..=8 {
        let mut e = entry.clone();
        e["align"] = serde_json::Value::from(1u32 << shift);
        e["algo"] = serde_json::Value::from(garbage.to_vec());
        entries.push(e);
    }
    bad["entries"] = serde_json::Value::from(entries);
    let bad_path = temp_path("garbage");
    std::fs::write(&bad_path, bad.to_string()).unwrap();
    let mut fresh = Blas::new(&gpu).unwrap();
    let w = fresh.load_algo_cache(&bad_path).unwrap();
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(fresh.algo_cache().entries.len(), 9);
    let err = run_case::<f16>(&gpu, &mut fresh, case, &mut r);
    assert!(
        err <= tolerance::<f16>(),
        "after a refused algorithm: {err:e}"
    );
    let replaced = fresh
        .algo_cache()
        .entries
        .iter()
        .filter(|(k, a)| k.shape == shape && a.words != garbage)
        .count();
    assert_eq!(
        replaced, 1,
        "the garbage algorithm was not replaced by the heuristic"
    );

    // A missing file warns; a corrupt one warns and adds nothing.
    let w = fresh.load_algo_cache(temp_path("does-not-exist")).unwrap();
    assert_eq!(w.len(), 1);
    std::fs::write(&bad_path, "{ not json").unwrap();
    let before = fresh.algo_cache().entries.len();
    let w = fresh.load_algo_cache(&bad_path).unwrap();
    assert_eq!(w.len(), 1);
    assert_eq!(fresh.algo_cache().entries.len(), before);
    for p in [&path, &stale_path, &bad_path] {
        let _ = std::fs::remove_file(p);
    }
}
