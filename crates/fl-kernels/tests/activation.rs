//! activation::{swiglu_fused, swiglu, gelu, gelu_inplace, bias_add, bias_add_inplace} on the
//! GPU against reference::activation, and property tests of the references (these run
//! without a GPU).

use fl_kernels::activation::{self, GeluKind};
use fl_kernels::testing::{
    gpu_or_skip, random, random_nonzero, rel_l2_floored, rng, strategies, to_f64,
};
use fl_kernels::{bf16, f16, reference, DeviceTensor, Error, FloatDType, Gpu};
use proptest::prelude::*;

/// Tolerance on rel L2 for one rounding to `T` plus fast f32 math: f32 1e-5 (DESIGN.md),
/// f16/bf16 2 units of roundoff (tighter than DESIGN.md's 1e-2).
fn tol<T: FloatDType>() -> f64 {
    if T::EPS < 1e-7 {
        1e-5
    } else {
        2.0 * T::EPS
    }
}

/// (rows, inter or cols): odd sizes, every vector width (8, 4, 2, 1 elements for 2-byte
/// types: 4096, 12, 4094 / 11006, odd), decode and LLaMA sizes.
const SHAPES: &[(usize, usize)] = &[
    (1, 1),
    (1, 7),
    (3, 8),
    (2, 129),
    (7, 12),
    (4, 4094),
    (16, 4095),
    (5, 4096),
    (1, 11008),
    (3, 11006),
    (2, 14336),
    (33, 1000),
];

fn poisoned<T: FloatDType>(gpu: &Gpu, shape: &[usize]) -> DeviceTensor<T> {
    DeviceTensor::filled(gpu.stream(), shape, T::from_f32(f32::NAN)).unwrap()
}

// ---------------------------------------------------------------- SwiGLU

/// Runs swiglu_fused and swiglu (on the two halves) for one shape; checks both against the
/// reference and against each other (bit for bit).
fn check_swiglu<T: FloatDType>(gpu: &Gpu, rows: usize, inter: usize, r: &mut impl rand::Rng) {
    let s = gpu.stream();
    // gate over ±[1e-3, 10] (both tails of silu), up over ±[1e-3, 1]
    let gate: Vec<T> = random_nonzero(r, rows * inter, 1e-3, 10.0);
    let up: Vec<T> = random(r, rows * inter);
    let mut fused = Vec::with_capacity(2 * rows * inter);
    for i in 0..rows {
        fused.extend_from_slice(&gate[i * inter..(i + 1) * inter]);
        fused.extend_from_slice(&up[i * inter..(i + 1) * inter]);
    }
    let want = reference::activation::swiglu(&gate, &up);
    assert_eq!(
        want,
        reference::activation::swiglu_fused(&fused, inter),
        "test bug: fused layout"
    );

    let dx = DeviceTensor::from_host(s, &fused, &[rows, 2 * inter]).unwrap();
    let mut out_f = poisoned::<T>(gpu, &[rows, inter]);
    activation::swiglu_fused(s, &dx, &mut out_f).unwrap();
    let got_f = out_f.to_host(s).unwrap();
    let err = rel_l2_floored(&got_f, &want, 1e-2);
    assert!(
        err < tol::<T>(),
        "swiglu_fused<{}> {rows}x{inter}: rel L2 {err:e}",
        T::NAME
    );

    let dg = DeviceTensor::from_host(s, &gate, &[rows, inter]).unwrap();
    let du = DeviceTensor::from_host(s, &up, &[rows, inter]).unwrap();
    let mut out_s = poisoned::<T>(gpu, &[rows, inter]);
    activation::swiglu(s, &dg, &du, &mut out_s).unwrap();
    let got_s = out_s.to_host(s).unwrap();
    let err = rel_l2_floored(&got_s, &want, 1e-2);
    assert!(
        err < tol::<T>(),
        "swiglu<{}> {rows}x{inter}: rel L2 {err:e}",
        T::NAME
    );
    assert_eq!(
        to_f64(&got_f),
        to_f64(&got_s),
        "swiglu<{}> {rows}x{inter}: fused and two-input forms differ",
        T::NAME
    );
}

#[test]
fn swiglu_matches_reference_all_dtypes_odd_sizes() {
    let Some(gpu) = gpu_or_skip("swiglu_matches_reference_all_dtypes_odd_sizes") else {
        return;
    };
    let mut r = rng("swiglu");
    for &(rows, inter) in SHAPES {
        check_swiglu::<f32>(&gpu, rows, inter, &mut r);
        check_swiglu::<f16>(&gpu, rows, inter, &mut r);
        check_swiglu::<bf16>(&gpu, rows, inter, &mut r);
    }
}

#[test]
fn swiglu_more_rows_than_one_grid_column() {
    // 66000 rows of 129 (one vector per element, 128-thread rows): the grid's y extent is
    // capped at 65535 and the kernel loops over the remaining rows.
    let Some(gpu) = gpu_or_skip("swiglu_more_rows_than_one_grid_column") else {
        return;
    };
    let mut r = rng("swiglu_rows");
    check_swiglu::<bf16>(&gpu, 66_000, 129, &mut r);
}

#[test]
fn silu_is_overflow_safe() {
    let Some(gpu) = gpu_or_skip("silu_is_overflow_safe") else {
        return;
    };
    fn run<T: FloatDType>(gpu: &Gpu, gate: &[f32]) {
        let s = gpu.stream();
        let g: Vec<T> = gate.iter().map(|&v| T::from_f32(v)).collect();
        let u: Vec<T> = vec![T::from_f32(0.5); g.len()];
        let n = g.len();
        let want = reference::activation::swiglu(&g, &u);
        let mut fused = g.clone();
        fused.extend_from_slice(&u);
        let dx = DeviceTensor::from_host(s, &fused, &[1, 2 * n]).unwrap();
        let mut out = poisoned::<T>(gpu, &[1, n]);
        activation::swiglu_fused(s, &dx, &mut out).unwrap();
        let got = out.to_host(s).unwrap();
        for i in 0..n {
            let (o, w) = (got[i].to_f64(), want[i]);
            assert!(
                (o - w).abs() <= 4.0 * T::EPS * w.abs() + 1e-7,
                "silu<{}>({}) * 0.5: got {o}, want {w}",
                T::NAME,
                g[i].to_f64()
            );
        }
    }
    let common = [
        -65504.0f32,
        -1e4,
        -100.0,
        -88.7,
        -20.0,
        -1.0,
        0.0,
        1.0,
        20.0,
        88.7,
        100.0,
        1e4,
        65504.0,
    ];
    run::<f16>(&gpu, &common);
    run::<bf16>(&gpu, &common);
    let mut wide = common.to_vec();
    wide.extend_from_slice(&[-3e38, -1e30, -89.5, 89.5, 1e30, 3e38]);
    run::<bf16>(&gpu, &wide);
    run::<f32>(&gpu, &wide);
}

#[test]
fn swiglu_unaligned_pointers_take_the_narrow_path() {
    // Raw launchers on buffers offset by one element (2 bytes: no vector access possible).
    let Some(gpu) = gpu_or_skip("swiglu_unaligned_pointers_take_the_narrow_path") else {
        return;
    };
    use fl_kernels::cudarc::driver::{DevicePtr, DevicePtrMut};
    let s = gpu.stream();
    let mut r = rng("swiglu_unaligned");
    let (rows, inter) = (5usize, 256usize);
    let x: Vec<f16> = random_nonzero(&mut r, 2 * rows * inter + 1, 1e-3, 6.0);
    let dx = DeviceTensor::from_host(s, &x, &[x.len()]).unwrap();
    let mut out = poisoned::<f16>(&gpu, &[rows * inter + 1]);
    {
        let (px, _g1) = dx.as_slice().device_ptr(s);
        let (po, _g2) = out.as_slice_mut().device_ptr_mut(s);
        // SAFETY: x holds 2 * rows * inter + 1 f16 and out rows * inter + 1; offsetting both
        // by one element leaves the [rows, 2 * inter] and [rows, inter] the launch touches.
        let st = unsafe {
            fl_kernels_sys::fl_swiglu_fused(
                fl_kernels_sys::fl_dtype::FL_DTYPE_F16,
                (px + 2) as _,
                (po + 2) as _,
                rows as i64,
                inter as i64,
                s.cu_stream() as _,
            )
        };
        assert_eq!(st, 0);
    }
    let got = out.to_host(s).unwrap();
    assert!(got[0].is_nan(), "element before the range was written");
    let want = reference::activation::swiglu_fused(&x[1..], inter);
    let err = rel_l2_floored(&got[1..], &want, 1e-2);
    assert!(err < tol::<f16>(), "rel L2 {err:e}");
}

// ---------------------------------------------------------------- GELU, bias add

fn check_gelu<T: FloatDType>(
    gpu: &Gpu,
    rows: usize,
    cols: usize,
    kind: GeluKind,
    with_bias: bool,
    r: &mut impl rand::Rng,
) {
    let s = gpu.stream();
    let x: Vec<T> = random_nonzero(r, rows * cols, 1e-3, 6.0);
    let b: Vec<T> = random(r, cols);
    let dx = DeviceTensor::from_host(s, &x, &[rows, cols]).unwrap();
    let db = DeviceTensor::from_host(s, &b, &[cols]).unwrap();
    let bias = with_bias.then_some(&db);
    let want = reference::activation::gelu(&x, with_bias.then_some(&b[..]), kind);

    let mut out = poisoned::<T>(gpu, &[rows, cols]);
    activation::gelu(s, &dx, bias, &mut out, kind).unwrap();
    let got = out.to_host(s).unwrap();
    let err = rel_l2_floored(&got, &want, 1e-2);
    assert!(
        err < tol::<T>(),
        "gelu_{}<{}> {rows}x{cols} bias={with_bias}: rel L2 {err:e}",
        kind.name(),
        T::NAME
    );

    let mut dy = DeviceTensor::from_host(s, &x, &[rows, cols]).unwrap();
    activation::gelu_inplace(s, &mut dy, bias, kind).unwrap();
    assert_eq!(
        to_f64(&dy.to_host(s).unwrap()),
        to_f64(&got),
        "gelu_{}_inplace<{}> {rows}x{cols} bias={with_bias}: differs from out of place",
        kind.name(),
        T::NAME
    );
}

#[test]
fn gelu_matches_reference_all_dtypes_odd_sizes() {
    let Some(gpu) = gpu_or_skip("gelu_matches_reference_all_dtypes_odd_sizes") else {
        return;
    };
    let mut r = rng("gelu");
    for &(rows, cols) in SHAPES {
        for kind in [GeluKind::Tanh, GeluKind::Erf] {
            for with_bias in [true, false] {
                check_gelu::<f32>(&gpu, rows, cols, kind, with_bias, &mut r);
                check_gelu::<f16>(&gpu, rows, cols, kind, with_bias, &mut r);
                check_gelu::<bf16>(&gpu, rows, cols, kind, with_bias, &mut r);
            }
        }
    }
}

#[test]
fn gelu_is_accurate_in_the_tails() {
    let Some(gpu) = gpu_or_skip("gelu_is_accurate_in_the_tails") else {
        return;
    };
    fn run<T: FloatDType>(gpu: &Gpu, xs: &[f32], kind: GeluKind) {
        let s = gpu.stream();
        let x: Vec<T> = xs.iter().map(|&v| T::from_f32(v)).collect();
        let want = reference::activation::gelu(&x, None, kind);
        let dx = DeviceTensor::from_host(s, &x, &[x.len()]).unwrap();
        let mut out = poisoned::<T>(gpu, &[x.len()]);
        activation::gelu(s, &dx, None, &mut out, kind).unwrap();
        let got = out.to_host(s).unwrap();
        for i in 0..x.len() {
            let (o, w) = (got[i].to_f64(), want[i]);
            // Relative 1e-4 in f32 (the fast exp of a large argument deep in the tail), 4
            // roundoffs otherwise; plus about f16's smallest subnormal, absolute.
            let rel = (4.0 * T::EPS).max(1e-4);
            assert!(
                (o - w).abs() <= rel * w.abs() + 1e-7,
                "gelu_{}<{}>({}): got {o:e}, want {w:e}",
                kind.name(),
                T::NAME,
                x[i].to_f64()
            );
        }
    }
    let common = [
        -65504.0f32,
        -1e4,
        -100.0,
        -12.0,
        -8.0,
        -5.0,
        -3.0,
        -1.0,
        -0.01,
        0.0,
        0.01,
        1.0,
        3.0,
        5.0,
        100.0,
        1e4,
        65504.0,
    ];
    for kind in [GeluKind::Tanh, GeluKind::Erf] {
        run::<f16>(&gpu, &common, kind);
        run::<bf16>(&gpu, &common, kind);
        let mut wide = common.to_vec();
        wide.extend_from_slice(&[-3e38, -1e30, -10.0, -7.0, 1e30, 3e38]);
        run::<f32>(&gpu, &wide, kind);
    }
}

fn check_bias_add<T: FloatDType>(gpu: &Gpu, rows: usize, cols: usize, r: &mut impl rand::Rng) {
    let s = gpu.stream();
    let x: Vec<T> = random(r, rows * cols);
    let b: Vec<T> = random(r, cols);
    let dx = DeviceTensor::from_host(s, &x, &[rows, cols]).unwrap();
    let db = DeviceTensor::from_host(s, &b, &[cols]).unwrap();
    let want = to_f64(&reference::activation::bias_add(&x, &b));
    let mut out = poisoned::<T>(gpu, &[rows, cols]);
    activation::bias_add(s, &dx, &db, &mut out).unwrap();
    // One f32 add, rounded to T: bit for bit the reference.
    assert_eq!(
        to_f64(&out.to_host(s).unwrap()),
        want,
        "bias_add<{}> {rows}x{cols}",
        T::NAME
    );
    let mut dy = DeviceTensor::from_host(s, &x, &[rows, cols]).unwrap();
    activation::bias_add_inplace(s, &mut dy, &db).unwrap();
    assert_eq!(
        to_f64(&dy.to_host(s).unwrap()),
        want,
        "bias_add_inplace<{}> {rows}x{cols}",
        T::NAME
    );
}

#[test]
fn bias_add_matches_reference_all_dtypes_odd_sizes() {
    let Some(gpu) = gpu_or_skip("bias_add_matches_reference_all_dtypes_odd_sizes") else {
        return;
    };
    let mut r = rng("bias_add");
    for &(rows, cols) in SHAPES {
        check_bias_add::<f32>(&gpu, rows, cols, &mut r);
        check_bias_add::<f16>(&gpu, rows, cols, &mut r);
        check_bias_add::<bf16>(&gpu, rows, cols, &mut r);
    }
}

#[test]
fn bias_and_gelu_with_more_rows_than_one_grid_column() {
    // 66000 rows of 129: the kernel loops over rows past the 65535 grid rows, reusing the
    // bias it loaded once.
    let Some(gpu) = gpu_or_skip("bias_and_gelu_with_more_rows_than_one_grid_column") else {
        return;
    };
    let mut r = rng("bias_rows");
    check_bias_add::<f16>(&gpu, 66_000, 129, &mut r);
    check_gelu::<f16>(&gpu, 66_000, 129, GeluKind::Erf, true, &mut r);
}

#[test]
fn bias_add_unaligned_pointers_take_the_narrow_path() {
    let Some(gpu) = gpu_or_skip("bias_add_unaligned_pointers_take_the_narrow_path") else {
        return;
    };
    use fl_kernels::cudarc::driver::{DevicePtr, DevicePtrMut};
    let s = gpu.stream();
    let mut r = rng("bias_add_unaligned");
    let (rows, cols) = (9usize, 64usize);
    let x: Vec<bf16> = random(&mut r, rows * cols + 1);
    let b: Vec<bf16> = random(&mut r, cols + 1);
    let dx = DeviceTensor::from_host(s, &x, &[x.len()]).unwrap();
    let db = DeviceTensor::from_host(s, &b, &[b.len()]).unwrap();
    let mut out = poisoned::<bf16>(&gpu, &[rows * cols + 1]);
    {
        let (px, _g1) = dx.as_slice().device_ptr(s);
        let (pb, _g2) = db.as_slice().device_ptr(s);
        let (po, _g3) = out.as_slice_mut().device_ptr_mut(s);
        // SAFETY: each buffer holds one element more than the launch touches past the offset.
        let st = unsafe {
            fl_kernels_sys::fl_bias_add(
                fl_kernels_sys::fl_dtype::FL_DTYPE_BF16,
                (px + 2) as _,
                (pb + 2) as _,
                (po + 2) as _,
                rows as i64,
                cols as i64,
                s.cu_stream() as _,
            )
        };
        assert_eq!(st, 0);
    }
    let got = out.to_host(s).unwrap();
    assert!(got[0].is_nan(), "element before the range was written");
    assert_eq!(
        &got[1..],
        &reference::activation::bias_add(&x[1..], &b[1..])[..]
    );
}

#[test]
fn launchers_refuse_bad_scalars() {
    // Checked before anything touches the (null) pointers: no GPU work, no GPU needed for
    // the argument checks, but the library is loaded only with the test binary anyway.
    let null: *mut std::ffi::c_void = std::ptr::null_mut();
    let f16_ = fl_kernels_sys::fl_dtype::FL_DTYPE_F16;
    let i8_ = fl_kernels_sys::fl_dtype::FL_DTYPE_I8;
    let inv = fl_kernels_sys::FL_ERR_INVALID_ARGUMENT;
    let bad_dtype = fl_kernels_sys::FL_ERR_UNSUPPORTED_DTYPE;
    // SAFETY: every call is refused (or is empty) before any pointer is used.
    unsafe {
        use fl_kernels_sys::*;
        assert_eq!(fl_swiglu(f16_, null, null, null, -1, 4, null), inv);
        assert_eq!(fl_swiglu_fused(f16_, null, null, 4, -1, null), inv);
        assert_eq!(fl_swiglu_fused(f16_, null, null, 4, 8, null), inv);
        assert_eq!(fl_swiglu_fused(f16_, null, null, 0, 8, null), 0);
        assert_eq!(fl_swiglu_fused(f16_, null, null, i64::MAX, 8, null), inv);
        let x = 16usize as *const std::ffi::c_void;
        let o = 32usize as *mut std::ffi::c_void;
        assert_eq!(fl_swiglu_fused(i8_, x, o, 1, 8, null), bad_dtype);
        let tanh = fl_gelu_kind::FL_GELU_TANH;
        assert_eq!(fl_gelu(f16_, tanh, null, null, null, 2, -3, null), inv);
        assert_eq!(fl_gelu(f16_, tanh, null, null, null, 2, 3, null), inv);
        assert_eq!(fl_bias_add(f16_, x, null, o, 2, 3, null), inv);
        assert_eq!(fl_bias_add(f16_, null, null, null, 2, 0, null), 0);
    }
}

#[test]
fn shape_errors_name_the_argument() {
    let Some(gpu) = gpu_or_skip("shape_errors_name_the_argument") else {
        return;
    };
    let s = gpu.stream();
    let z = |shape: &[usize]| DeviceTensor::<f16>::zeros(s, shape).unwrap();
    fn arg(r: Result<(), Error>) -> &'static str {
        match r {
            Err(Error::Shape { arg, .. }) => arg,
            other => panic!("expected a shape error, got {other:?}"),
        }
    }
    let tanh = GeluKind::Tanh;
    // swiglu_fused: odd last dim, rank 0, wrong out
    assert_eq!(
        arg(activation::swiglu_fused(s, &z(&[4, 7]), &mut z(&[4, 3]))),
        "x"
    );
    assert_eq!(arg(activation::swiglu_fused(s, &z(&[]), &mut z(&[]))), "x");
    assert_eq!(
        arg(activation::swiglu_fused(s, &z(&[4, 8]), &mut z(&[4, 8]))),
        "out"
    );
    assert_eq!(
        arg(activation::swiglu_fused(s, &z(&[4, 8]), &mut z(&[2, 4]))),
        "out"
    );
    // swiglu
    assert_eq!(
        arg(activation::swiglu(
            s,
            &z(&[4, 8]),
            &z(&[8, 4]),
            &mut z(&[4, 8])
        )),
        "up"
    );
    assert_eq!(
        arg(activation::swiglu(
            s,
            &z(&[4, 8]),
            &z(&[4, 8]),
            &mut z(&[32])
        )),
        "out"
    );
    // gelu
    assert_eq!(
        arg(activation::gelu(
            s,
            &z(&[4, 8]),
            None,
            &mut z(&[8, 4]),
            tanh
        )),
        "out"
    );
    assert_eq!(
        arg(activation::gelu(
            s,
            &z(&[4, 8]),
            Some(&z(&[4])),
            &mut z(&[4, 8]),
            tanh
        )),
        "bias"
    );
    assert_eq!(
        arg(activation::gelu(
            s,
            &z(&[]),
            Some(&z(&[1])),
            &mut z(&[]),
            tanh
        )),
        "x"
    );
    assert_eq!(
        arg(activation::gelu_inplace(
            s,
            &mut z(&[4, 8]),
            Some(&z(&[8, 1])),
            tanh
        )),
        "bias"
    );
    // bias_add
    assert_eq!(
        arg(activation::bias_add(
            s,
            &z(&[4, 8]),
            &z(&[4]),
            &mut z(&[4, 8])
        )),
        "bias"
    );
    assert_eq!(
        arg(activation::bias_add(
            s,
            &z(&[4, 8]),
            &z(&[8]),
            &mut z(&[4, 9])
        )),
        "out"
    );
    assert_eq!(
        arg(activation::bias_add(s, &z(&[]), &z(&[1]), &mut z(&[]))),
        "x"
    );
    assert_eq!(
        arg(activation::bias_add_inplace(s, &mut z(&[4, 8]), &z(&[9]))),
        "bias"
    );
    // Empty tensors are fine and launch nothing; higher ranks use the last dimension.
    activation::swiglu_fused(s, &z(&[0, 8]), &mut z(&[0, 4])).unwrap();
    activation::swiglu_fused(s, &z(&[3, 0]), &mut z(&[3, 0])).unwrap();
    activation::swiglu(s, &z(&[0]), &z(&[0]), &mut z(&[0])).unwrap();
    activation::gelu(s, &z(&[0, 5]), Some(&z(&[5])), &mut z(&[0, 5]), tanh).unwrap();
    activation::bias_add(s, &z(&[2, 0]), &z(&[0]), &mut z(&[2, 0])).unwrap();
    activation::swiglu_fused(s, &z(&[2, 3, 8]), &mut z(&[2, 3, 4])).unwrap();
    activation::bias_add(s, &z(&[2, 3, 8]), &z(&[8]), &mut z(&[2, 3, 8])).unwrap();
}

#[test]
fn activation_gpu_proptest() {
    let Some(gpu) = gpu_or_skip("activation_gpu_proptest") else {
        return;
    };
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &(strategies::matrix(300, 5000), any::<u64>()),
            |((rows, n), seed)| {
                use rand::SeedableRng;
                let mut r = rand::rngs::StdRng::seed_from_u64(seed);
                check_swiglu::<bf16>(&gpu, rows, n, &mut r);
                check_swiglu::<f32>(&gpu, rows, n, &mut r);
                check_gelu::<f16>(&gpu, rows, n, GeluKind::Erf, true, &mut r);
                check_gelu::<f32>(&gpu, rows, n, GeluKind::Tanh, seed % 2 == 0, &mut r);
                check_bias_add::<bf16>(&gpu, rows, n, &mut r);
                Ok(())
            },
        )
        .unwrap();
}

// ---- reference properties (CPU only, run in CI) ----

#[test]
fn reference_erf_matches_known_values() {
    use reference::activation::{erf, erfc};
    // (x, erf(x), erfc(x)) to 16 digits
    let known = [
        (0.1, 0.1124629160182849, 0.8875370839817152),
        (0.5, 0.5204998778130465, 0.4795001221869535),
        (1.0, 0.8427007929497149, 0.15729920705028513),
        (2.0, 0.9953222650189527, 0.004677734981047265),
        (2.9, 0.9999589021219005, 4.109787809945886e-05),
        (3.0, 0.9999779095030014, 2.2090496998585438e-05),
        (3.5, 0.9999992569016276, 7.430983723414128e-07),
        (5.0, 0.9999999999984626, 1.5374597944280351e-12),
        (10.0, 1.0, 2.088487583762545e-45),
        (26.0, 1.0, 5.663192408856143e-296),
    ];
    for (x, e, c) in known {
        assert!((erf(x) - e).abs() <= 1e-15, "erf({x}) = {}", erf(x));
        assert!((erf(-x) + e).abs() <= 1e-15, "erf(-{x}) = {}", erf(-x));
        assert!(
            ((erfc(x) - c) / c).abs() <= 1e-14,
            "erfc({x}) = {:e}",
            erfc(x)
        );
        assert!((erfc(-x) - (2.0 - c)).abs() <= 1e-15, "erfc(-{x})");
    }
    assert_eq!(erf(0.0), 0.0);
    assert_eq!(erf(f64::INFINITY), 1.0);
    assert_eq!(erfc(f64::INFINITY), 0.0);
    assert!(erf(f64::NAN).is_nan());
}

/// The constants of `erfc_nonneg` as written in kernels/common/gelu.cuh: the `fmaf(p, t, C)`
/// steps after `float p = C0;`.
fn kernel_erfc_coefficients() -> Vec<f32> {
    let src = include_str!("../../../kernels/common/gelu.cuh");
    let start = src
        .find("float erfc_nonneg(")
        .expect("erfc_nonneg not found in kernels/common/gelu.cuh");
    let body = &src[start..];
    let body = &body[..body.find("\n}\n").expect("end of erfc_nonneg")];
    let mut c = Vec::new();
    for line in body.lines().map(str::trim) {
        let num = if let Some(v) = line.strip_prefix("float p = ") {
            v
        } else if let Some(v) = line.strip_prefix("p = fmaf(p, t, ") {
            v.trim_end_matches(");")
        } else {
            continue;
        };
        c.push(
            num.trim_end_matches(';')
                .trim_end_matches('f')
                .parse()
                .expect("coefficient"),
        );
    }
    c
}

#[test]
fn kernel_erf_gelu_formula_is_accurate_in_f32() {
    // The kernel's Φ(x), emulated in f32 (exp and division exact-rounded here, fast on the
    // GPU: a few ulp more there), against the f64 reference over [-13, 13].
    let c = kernel_erfc_coefficients();
    assert_eq!(c.len(), 10, "expected 10 coefficients, found {c:?}");
    let erfc_nonneg = |a: f32| {
        let t = 1.0 / 0.5f32.mul_add(a, 1.0);
        let p = c.iter().skip(1).fold(c[0], |p, &k| p.mul_add(t, k));
        t * (-a).mul_add(a, p).exp()
    };
    let mut worst = (0.0f64, 0.0f32);
    for i in 0..=26_000 {
        let x = -13.0 + i as f32 * 1e-3;
        let e = 0.5 * erfc_nonneg(x.abs() * std::f32::consts::FRAC_1_SQRT_2);
        let phi = if x < 0.0 { e } else { 1.0 - e };
        let want = 0.5 * reference::activation::erfc(-(x as f64) * std::f64::consts::FRAC_1_SQRT_2);
        let rel = ((phi as f64 - want) / want).abs();
        if rel > worst.0 {
            worst = (rel, x);
        }
        // f32 rounding of the exp argument (-x²/2 + P) dominates: ~1e-6 at x = -5.
        let bound = if x.abs() < 2.0 { 5e-7 } else { 3e-6 };
        if x.abs() < 5.0 {
            assert!(rel < bound, "Φ({x}): {phi:e} vs {want:e} (rel {rel:e})");
        }
    }
    assert!(worst.0 < 5e-5, "worst Φ error {:e} at {}", worst.0, worst.1);
}

proptest! {
    #[test]
    fn reference_gelu_tanh_is_the_textbook_formula(x in -3.0f64..6.0) {
        // 0.5 x (1 + tanh(u)) literally; the cancellation in 1 + tanh(u) (>= 2.4e-3 here)
        // costs at most ~1e-13 relative on this range.
        let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
        let want = 0.5 * x * (1.0 + u.tanh());
        let got = reference::activation::gelu_scalar(x, GeluKind::Tanh);
        prop_assert!((got - want).abs() <= 1e-12 * want.abs(), "{x}: {got:e} vs {want:e}");
    }

    #[test]
    fn reference_silu_odd_part_is_the_identity(x in -200.0f64..200.0) {
        // silu(x) - silu(-x) = x (σ(x) + σ(-x)) = x
        let d = reference::activation::silu(x) - reference::activation::silu(-x);
        prop_assert!((d - x).abs() <= 1e-14 * x.abs().max(1.0), "{x}: {d}");
    }

    #[test]
    fn reference_gelu_odd_part_is_the_identity_and_forms_agree(x in -50.0f64..50.0) {
        use reference::activation::gelu_scalar;
        for kind in [GeluKind::Tanh, GeluKind::Erf] {
            let d = gelu_scalar(x, kind) - gelu_scalar(-x, kind);
            prop_assert!((d - x).abs() <= 1e-14 * x.abs().max(1.0), "{kind:?} {x}: {d}");
        }
        // The tanh form approximates the erf form within 4.8e-4 everywhere.
        let diff = gelu_scalar(x, GeluKind::Tanh) - gelu_scalar(x, GeluKind::Erf);
        prop_assert!(diff.abs() < 5e-4, "{x}: {diff:e}");
    }

    #[test]
    fn reference_erf_is_odd_and_complements_erfc(x in -30.0f64..30.0) {
        use reference::activation::{erf, erfc};
        prop_assert_eq!(erf(-x), -erf(x));
        prop_assert!((erf(x) + erfc(x) - 1.0).abs() <= 1e-15, "{x}");
    }

    #[test]
    fn reference_swiglu_fused_is_swiglu_of_the_halves(
        (rows, inter) in strategies::matrix(8, 300), seed in any::<u64>()
    ) {
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let x: Vec<bf16> = random(&mut r, rows * 2 * inter);
        let (mut g, mut u) = (Vec::new(), Vec::new());
        for row in x.chunks_exact(2 * inter) {
            g.extend_from_slice(&row[..inter]);
            u.extend_from_slice(&row[inter..]);
        }
        prop_assert_eq!(
            reference::activation::swiglu_fused(&x, inter),
            reference::activation::swiglu(&g, &u)
        );
    }

    #[test]
    fn reference_bias_add_adds_per_column((rows, cols) in strategies::matrix(8, 300), seed in any::<u64>()) {
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let x: Vec<f32> = random(&mut r, rows * cols);
        let b: Vec<f32> = random(&mut r, cols);
        let y = reference::activation::bias_add(&x, &b);
        for i in 0..rows * cols {
            prop_assert_eq!(y[i], x[i] + b[i % cols]);
        }
        // gelu with a bias is gelu of the f32 sum
        let g = reference::activation::gelu(&x, Some(&b), GeluKind::Erf);
        prop_assert_eq!(g, reference::activation::gelu(&y, None, GeluKind::Erf));
    }
}
