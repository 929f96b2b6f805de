//! GPU tests of `Blas::gemm` against the f64 reference. Without a GPU each test prints
//! SKIP and passes (FL_REQUIRE_GPU=1 makes that a failure).

mod common;

use common::{run_case, Case};
use fl_blas::{Blas, Error, GemmDType, GemmParams, GemmType};
use fl_kernels::testing::{gpu_or_skip, rng, tolerance};
use fl_kernels::{bf16, f16, DeviceTensor, Gpu};

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
