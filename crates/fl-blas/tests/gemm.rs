//! GPU tests of `Blas::gemm` against the f64 reference. Without a GPU each test prints
//! SKIP and passes (FL_REQUIRE_GPU=1 makes that a failure).

use fl_blas::reference::{self, RefGemm};
use fl_blas::{Blas, Error, GemmDType, GemmParams, GemmShape, GemmType};
use fl_kernels::testing::{gpu_or_skip, random, rel_l2, rng, tolerance};
use fl_kernels::{bf16, f16, DeviceTensor, Gpu};
use rand::Rng;

/// One test case.
#[derive(Debug, Clone, Copy)]
struct Case {
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    /// `Some(false)`: `a` is 3-D with a per-batch `b`; `Some(true)`: shared `b`;
    /// `None`: plain 2-D call.
    batched: Option<bool>,
    bias: bool,
    alpha: f32,
    beta: f32,
}

impl Case {
    fn plain(m: usize, n: usize, k: usize) -> Self {
        Case {
            m,
            n,
            k,
            batch: 1,
            batched: None,
            bias: false,
            alpha: 1.0,
            beta: 0.0,
        }
    }
}

/// Runs `case` on the GPU and returns the rel L2 error against the reference.
fn run_case<T: GemmType>(gpu: &Gpu, blas: &mut Blas, case: Case, r: &mut impl Rng) -> f64 {
    let s = gpu.stream();
    let Case {
        m,
        n,
        k,
        batch,
        batched,
        bias,
        alpha,
        beta,
    } = case;
    let shared = batched == Some(true);
    let b_batches = if shared { 1 } else { batch };
    let (a_shape, b_shape, c_shape) = match batched {
        None => (vec![m, k], vec![n, k], vec![m, n]),
        Some(true) => (vec![batch, m, k], vec![n, k], vec![batch, m, n]),
        Some(false) => (vec![batch, m, k], vec![batch, n, k], vec![batch, m, n]),
    };
    let a: Vec<T> = random(r, batch * m * k);
    let b: Vec<T> = random(r, b_batches * n * k);
    let bias_h: Vec<T> = random(r, n);
    let c0: Vec<T> = random(r, batch * m * n);
    let da = DeviceTensor::from_host(s, &a, &a_shape).unwrap();
    let db = DeviceTensor::from_host(s, &b, &b_shape).unwrap();
    let dbias = DeviceTensor::from_host(s, &bias_h, &[n]).unwrap();
    // beta = 0: the output is poisoned with NaN, which must not leak into the result.
    let mut dc = if beta == 0.0 {
        DeviceTensor::filled(s, &c_shape, T::from_f32(f32::NAN)).unwrap()
    } else {
        DeviceTensor::from_host(s, &c0, &c_shape).unwrap()
    };
    blas.gemm(
        &da,
        &db,
        bias.then_some(&dbias),
        &mut dc,
        GemmParams { alpha, beta },
    )
    .unwrap_or_else(|e| panic!("{case:?} {}: {e}", T::NAME));
    let got = dc.to_host(s).unwrap();
    let g = RefGemm {
        m,
        n,
        k,
        batch,
        shared_b: shared,
        alpha: alpha as f64,
        beta: beta as f64,
    };
    let want = reference::gemm(
        &g,
        &a,
        &b,
        bias.then_some(&bias_h[..]),
        (beta != 0.0).then_some(&c0[..]),
    );
    rel_l2(&got, &want)
}

/// Odd sizes from {1, 7, 33, 129, 4095}; at most one large size each so the f64
/// reference stays fast.
const SHAPES: &[(usize, usize, usize)] = &[
    (1, 1, 1),
    (1, 7, 33),
    (7, 33, 129),
    (33, 129, 7),
    (129, 1, 4095),
    (1, 4095, 129),
    (4095, 7, 33),
    (7, 4095, 33),
    (33, 7, 4095),
    (129, 129, 129),
    (4095, 33, 1),
];

fn odd_shapes<T: GemmType>(gpu: &Gpu, tol: f64) {
    let mut blas = Blas::new(gpu).unwrap();
    let mut r = rng(&format!("gemm_odd_shapes_{}", T::NAME));
    for (i, &(m, n, k)) in SHAPES.iter().enumerate() {
        // bias and beta each on for half the shapes, in every combination
        for (bias, beta, alpha) in [
            (false, 0.0, 1.0),
            (true, 0.0, 1.0),
            (false, 0.5, 1.5),
            (true, -1.0, 0.75),
        ]
        .into_iter()
        .skip(i % 2)
        .step_by(2)
        {
            let case = Case {
                bias,
                beta,
                alpha,
                ..Case::plain(m, n, k)
            };
            let err = run_case::<T>(gpu, &mut blas, case, &mut r);
            assert!(err <= tol, "{} {case:?}: rel L2 {err:e} > {tol:e}", T::NAME);
        }
    }
}

#[test]
fn gemm_f32_odd_shapes() {
    let Some(gpu) = gpu_or_skip("gemm_f32_odd_shapes") else {
        return;
    };
    odd_shapes::<f32>(&gpu, tolerance::<f32>());
}

#[test]
fn gemm_f16_odd_shapes() {
    let Some(gpu) = gpu_or_skip("gemm_f16_odd_shapes") else {
        return;
    };
    odd_shapes::<f16>(&gpu, tolerance::<f16>());
}

#[test]
fn gemm_bf16_odd_shapes() {
    let Some(gpu) = gpu_or_skip("gemm_bf16_odd_shapes") else {
        return;
    };
    odd_shapes::<bf16>(&gpu, tolerance::<bf16>());
}

#[test]
fn gemm_tf32_is_close_but_allowed_to_round() {
    let Some(gpu) = gpu_or_skip("gemm_tf32_is_close_but_allowed_to_round") else {
        return;
    };
    let mut blas = Blas::new(&gpu).unwrap();
    blas.set_allow_tf32(true);
    let mut r = rng("gemm_tf32");
    for &(m, n, k) in &[(129, 129, 129), (33, 7, 4095), (256, 512, 1024)] {
        let case = Case {
            bias: true,
            ..Case::plain(m, n, k)
        };
        // TF32 rounds inputs to 10 mantissa bits (unit roundoff 2^-11).
        let err = run_case::<f32>(&gpu, &mut blas, case, &mut r);
        assert!(err <= 2e-3, "tf32 {case:?}: rel L2 {err:e}");
    }
    assert!(blas
        .algo_cache()
        .entries
        .keys()
        .all(|k| k.shape.dtype == GemmDType::Tf32));
}

fn batched<T: GemmType>(gpu: &Gpu) {
    let mut blas = Blas::new(gpu).unwrap();
    let mut r = rng(&format!("gemm_batched_{}", T::NAME));
    for shared in [false, true] {
        for (bias, beta) in [(false, 0.0), (true, 0.0), (true, 0.5)] {
            for &(batch, m, n, k) in &[(3, 7, 33, 129), (5, 1, 129, 33), (2, 129, 7, 4095)] {
                let case = Case {
                    m,
                    n,
                    k,
                    batch,
                    batched: Some(shared),
                    bias,
                    alpha: 1.0,
                    beta,
                };
                let err = run_case::<T>(gpu, &mut blas, case, &mut r);
                let tol = tolerance::<T>();
                assert!(err <= tol, "{} {case:?}: rel L2 {err:e} > {tol:e}", T::NAME);
            }
        }
    }
}

#[test]
fn gemm_batched_per_batch_and_shared_b() {
    let Some(gpu) = gpu_or_skip("gemm_batched_per_batch_and_shared_b") else {
        return;
    };
    batched::<f32>(&gpu);
    batched::<f16>(&gpu);
    batched::<bf16>(&gpu);
}

#[test]
fn gemm_batch_one_3d_equals_plain() {
    let Some(gpu) = gpu_or_skip("gemm_batch_one_3d_equals_plain") else {
        return;
    };
    let mut blas = Blas::new(&gpu).unwrap();
    let mut r = rng("gemm_batch_one");
    for shared in [false, true] {
        let case = Case {
            batch: 1,
            batched: Some(shared),
            bias: true,
            ..Case::plain(7, 33, 129)
        };
        let err = run_case::<bf16>(&gpu, &mut blas, case, &mut r);
        assert!(err <= tolerance::<bf16>(), "{case:?}: {err:e}");
    }
}

#[test]
fn gemm_shape_errors_name_the_argument() {
    let Some(gpu) = gpu_or_skip("gemm_shape_errors_name_the_argument") else {
        return;
    };
    let s = gpu.stream();
    let mut blas = Blas::new(&gpu).unwrap();
    let t = |shape: &[usize]| DeviceTensor::<f16>::zeros(s, shape).unwrap();
    let p = GemmParams::default();
    let arg = |e: Error| match e {
        Error::Shape { arg, .. } | Error::InvalidArgument { arg, .. } => arg,
        other => panic!("unexpected error {other}"),
    };
    let (a, b, mut c, bias) = (t(&[3, 5]), t(&[7, 5]), t(&[3, 7]), t(&[7]));
    assert_eq!(
        arg(blas.gemm(&t(&[15]), &b, None, &mut c, p).unwrap_err()),
        "a"
    );
    assert_eq!(
        arg(blas.gemm(&a, &t(&[7, 4]), None, &mut c, p).unwrap_err()),
        "b"
    );
    assert_eq!(
        arg(blas.gemm(&a, &b, None, &mut t(&[7, 3]), p).unwrap_err()),
        "c"
    );
    assert_eq!(
        arg(blas.gemm(&a, &b, Some(&t(&[5])), &mut c, p).unwrap_err()),
        "bias"
    );
    assert_eq!(
        arg(blas
            .gemm(&t(&[2, 3, 5]), &t(&[3, 7, 5]), None, &mut t(&[2, 3, 7]), p)
            .unwrap_err()),
        "b"
    );
    assert_eq!(
        arg(blas
            .gemm(&t(&[3, 0]), &t(&[7, 0]), None, &mut c, p)
            .unwrap_err()),
        "a"
    );
    let nan = GemmParams {
        alpha: f32::NAN,
        beta: 0.0,
    };
    assert_eq!(
        arg(blas.gemm(&a, &b, Some(&bias), &mut c, nan).unwrap_err()),
        "params"
    );
    // the good call still works after the refusals
    blas.gemm(&a, &b, Some(&bias), &mut c, p).unwrap();
}

#[test]
fn gemm_empty_m_is_a_noop() {
    let Some(gpu) = gpu_or_skip("gemm_empty_m_is_a_noop") else {
        return;
    };
    let s = gpu.stream();
    let mut blas = Blas::new(&gpu).unwrap();
    let a = DeviceTensor::<f32>::zeros(s, &[0, 5]).unwrap();
    let b = DeviceTensor::<f32>::filled(s, &[7, 5], 1.0).unwrap();
    let mut c = DeviceTensor::<f32>::zeros(s, &[0, 7]).unwrap();
    blas.gemm(&a, &b, None, &mut c, GemmParams::default())
        .unwrap();
    assert!(blas.algo_cache().entries.is_empty());
}

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

#[test]
fn gemm_gpu_proptest() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let Some(gpu) = gpu_or_skip("gemm_gpu_proptest") else {
        return;
    };
    // TestRunner takes an Fn closure: the handle is borrowed mutably through a RefCell.
    let blas = std::cell::RefCell::new(Blas::new(&gpu).unwrap());
    let mut runner = TestRunner::new(Config {
        cases: 48,
        ..Config::default()
    });
    let len = fl_kernels::testing::strategies::length;
    let strat = (
        len(300),
        len(300),
        len(600),
        1usize..4,
        prop_oneof![Just(None), Just(Some(false)), Just(Some(true))],
        any::<bool>(),
        prop_oneof![Just(0.0f32), Just(1.0f32), Just(-0.5f32)],
        any::<u64>(),
    );
    runner
        .run(&strat, |(m, n, k, batch, batched, bias, beta, seed)| {
            use rand::SeedableRng;
            let mut r = rand::rngs::StdRng::seed_from_u64(seed);
            let case = Case {
                m,
                n,
                k,
                batch: if batched.is_some() { batch } else { 1 },
                batched,
                bias,
                alpha: 1.0,
                beta,
            };
            let err = run_case::<f16>(&gpu, &mut blas.borrow_mut(), case, &mut r);
            prop_assert!(err <= tolerance::<f16>(), "{:?}: rel L2 {:e}", case, err);
            Ok(())
        })
        .unwrap();
}
