//! norm::{rms_norm, add_rms_norm, layer_norm} on the GPU against reference::norm, and
//! property tests of the references (these run without a GPU).

use fl_kernels::testing::{gpu_or_skip, random, random_nonzero, rel_l2, rng, strategies, to_f64};
use fl_kernels::{bf16, f16, norm, reference, DeviceTensor, Error, FloatDType, Gpu};
use proptest::prelude::*;

/// Hidden sizes: every path (warp per row up to 1024 / 512, block per row up to 32768 /
/// 16384, the scalar path for sizes that are not multiples of the vector width or too long).
const HIDDEN: &[usize] = &[
    1, 7, 64, 129, 256, 512, 1000, 1024, 1032, 4095, 4096, 5120, 8192, 11008, 16384, 16388, 32768,
    32776,
];
/// Row counts: 1 and odd counts (the warp kernel packs 4 rows per block), one >= 1024
/// (256-thread blocks).
const ROWS: &[usize] = &[1, 3, 33];

/// Tolerance on rel L2 for outputs rounded once to T: f32 1e-5 (f32 accumulation over up
/// to 32k elements), f16/bf16 two units of roundoff (tighter than DESIGN's 1e-2).
fn tol<T: FloatDType>() -> f64 {
    if T::EPS < 1e-7 {
        1e-5
    } else {
        2.0 * T::EPS
    }
}

/// Largest |got - want| over the rms of `want`; catches a few bad elements that rel L2
/// would average away.
fn max_err<T: FloatDType>(got: &[T], want: &[f64]) -> f64 {
    let rms = (want.iter().map(|v| v * v).sum::<f64>() / want.len().max(1) as f64).sqrt();
    got.iter()
        .zip(want)
        .map(|(g, w)| (g.to_f64() - w).abs())
        .fold(0.0, f64::max)
        / rms.max(f64::MIN_POSITIVE)
}

fn assert_close<T: FloatDType>(what: &str, got: &[T], want: &[f64]) {
    let e = rel_l2(got, want);
    assert!(e < tol::<T>(), "{what} <{}>: rel L2 {e:e}", T::NAME);
    // One element may be off by its own rounding (relative to it), well under 8 units of
    // roundoff of the row's rms.
    let m = max_err(got, want);
    assert!(
        m < 8.0 * T::EPS.max(1e-6),
        "{what} <{}>: max err {m:e}",
        T::NAME
    );
}

struct Inputs<T> {
    x: Vec<T>,
    w: Vec<T>,
    b: Vec<T>,
    res: Vec<T>,
}

fn inputs<T: FloatDType>(r: &mut impl rand::Rng, rows: usize, hidden: usize) -> Inputs<T> {
    Inputs {
        x: random_nonzero(r, rows * hidden, 1e-3, 4.0),
        w: random_nonzero(r, hidden, 0.5, 1.5),
        b: random(r, hidden),
        res: random_nonzero(r, rows * hidden, 1e-3, 4.0),
    }
}

fn check_rms<T: FloatDType>(gpu: &Gpu, rows: usize, hidden: usize, r: &mut impl rand::Rng) {
    let s = gpu.stream();
    let inp = inputs::<T>(r, rows, hidden);
    let eps = 1e-5;
    let dx = DeviceTensor::from_host(s, &inp.x, &[rows, hidden]).unwrap();
    let dw = DeviceTensor::from_host(s, &inp.w, &[hidden]).unwrap();
    let mut dy = DeviceTensor::filled(s, &[rows, hidden], T::from_f32(f32::NAN)).unwrap();
    norm::rms_norm(s, &dx, &dw, eps, &mut dy).unwrap();
    let got = dy.to_host(s).unwrap();
    let want = reference::norm::rms_norm(&inp.x, &inp.w, hidden, eps);
    assert_close(&format!("rms_norm {rows}x{hidden}"), &got, &want);
}

fn check_add_rms<T: FloatDType>(gpu: &Gpu, rows: usize, hidden: usize, r: &mut impl rand::Rng) {
    let s = gpu.stream();
    let inp = inputs::<T>(r, rows, hidden);
    let eps = 1e-6;
    let dx = DeviceTensor::from_host(s, &inp.x, &[rows, hidden]).unwrap();
    let mut dr = DeviceTensor::from_host(s, &inp.res, &[rows, hidden]).unwrap();
    let dw = DeviceTensor::from_host(s, &inp.w, &[hidden]).unwrap();
    let mut dy = DeviceTensor::filled(s, &[rows, hidden], T::from_f32(f32::NAN)).unwrap();
    norm::add_rms_norm(s, &dx, &mut dr, &dw, eps, &mut dy).unwrap();
    let (want_res, want_y) = reference::norm::add_rms_norm(&inp.x, &inp.res, &inp.w, hidden, eps);
    let got_res = dr.to_host(s).unwrap();
    assert_eq!(
        to_f64(&got_res),
        to_f64(&want_res),
        "add_rms_norm {rows}x{hidden} <{}>: residual not bit-exact",
        T::NAME
    );
    assert_close(
        &format!("add_rms_norm {rows}x{hidden}"),
        &dy.to_host(s).unwrap(),
        &want_y,
    );
}

fn check_layer<T: FloatDType>(
    gpu: &Gpu,
    rows: usize,
    hidden: usize,
    with_bias: bool,
    r: &mut impl rand::Rng,
) {
    let s = gpu.stream();
    let mut inp = inputs::<T>(r, rows, hidden);
    // An offset mean, so that the variance pass matters.
    for v in inp.x.iter_mut() {
        *v = T::from_f32(v.to_f32() + 3.0);
    }
    let eps = 1e-5;
    let dx = DeviceTensor::from_host(s, &inp.x, &[rows, hidden]).unwrap();
    let dw = DeviceTensor::from_host(s, &inp.w, &[hidden]).unwrap();
    let db = DeviceTensor::from_host(s, &inp.b, &[hidden]).unwrap();
    let mut dy = DeviceTensor::filled(s, &[rows, hidden], T::from_f32(f32::NAN)).unwrap();
    let bias = with_bias.then_some(&db);
    norm::layer_norm(s, &dx, &dw, bias, eps, &mut dy).unwrap();
    let want =
        reference::norm::layer_norm(&inp.x, &inp.w, with_bias.then_some(&inp.b[..]), hidden, eps);
    let got = dy.to_host(s).unwrap();
    if hidden == 1 {
        // (x - mean) is exactly 0: y = bias (or 0) exactly.
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.to_f64(), T::from_f32(*w as f32).to_f64());
        }
        return;
    }
    assert_close(
        &format!("layer_norm {rows}x{hidden} bias={with_bias}"),
        &got,
        &want,
    );
}

fn check_add_bias_layer<T: FloatDType>(
    gpu: &Gpu,
    rows: usize,
    hidden: usize,
    biases: bool,
    inplace: bool,
    r: &mut impl rand::Rng,
) {
    let s = gpu.stream();
    let mut inp = inputs::<T>(r, rows, hidden);
    for v in inp.res.iter_mut() {
        *v = T::from_f32(v.to_f32() - 2.0);
    }
    let xb: Vec<T> = random_nonzero(r, hidden, 1e-3, 1.0);
    let eps = 1e-12;
    let dx = DeviceTensor::from_host(s, &inp.x, &[rows, hidden]).unwrap();
    let dxb = DeviceTensor::from_host(s, &xb, &[hidden]).unwrap();
    let mut dr = DeviceTensor::from_host(s, &inp.res, &[rows, hidden]).unwrap();
    let dw = DeviceTensor::from_host(s, &inp.w, &[hidden]).unwrap();
    let db = DeviceTensor::from_host(s, &inp.b, &[hidden]).unwrap();
    let (xbias, bias) = if biases {
        (Some(&dxb), Some(&db))
    } else {
        (None, None)
    };
    let got = if inplace {
        norm::add_bias_layer_norm_inplace(s, &dx, xbias, &mut dr, &dw, bias, eps).unwrap();
        dr.to_host(s).unwrap()
    } else {
        let mut dy = DeviceTensor::filled(s, &[rows, hidden], T::from_f32(f32::NAN)).unwrap();
        norm::add_bias_layer_norm(s, &dx, xbias, &dr, &dw, bias, eps, &mut dy).unwrap();
        assert!(
            to_f64(&dr.to_host(s).unwrap()) == to_f64(&inp.res),
            "residual must stay unchanged"
        );
        dy.to_host(s).unwrap()
    };
    let (_, want) = reference::norm::add_bias_layer_norm(
        &inp.x,
        biases.then_some(&xb[..]),
        &inp.res,
        &inp.w,
        biases.then_some(&inp.b[..]),
        hidden,
        eps,
    );
    if hidden == 1 {
        return; // (h - mean) is exactly 0; layer_norm's own test covers that case.
    }
    assert_close(
        &format!("add_bias_layer_norm {rows}x{hidden} biases={biases} inplace={inplace}"),
        &got,
        &want,
    );
}

fn all_sizes(gpu: &Gpu, f: &mut dyn FnMut(&Gpu, usize, usize)) {
    for &h in HIDDEN {
        for &rows in ROWS {
            f(gpu, rows, h);
        }
    }
    // Many rows: 256-thread blocks, a grid that loops, the warp kernel's last partial block.
    f(gpu, 1030, 4096);
    f(gpu, 1027, 128);
    f(gpu, 2049, 1000);
}

#[test]
fn rms_norm_matches_reference_all_dtypes_and_paths() {
    let Some(gpu) = gpu_or_skip("rms_norm_matches_reference_all_dtypes_and_paths") else {
        return;
    };
    let mut r = rng("rms_norm");
    all_sizes(&gpu, &mut |g, rows, h| {
        check_rms::<f32>(g, rows, h, &mut r);
        check_rms::<f16>(g, rows, h, &mut r);
        check_rms::<bf16>(g, rows, h, &mut r);
    });
}

#[test]
fn add_rms_norm_matches_reference_all_dtypes_and_paths() {
    let Some(gpu) = gpu_or_skip("add_rms_norm_matches_reference_all_dtypes_and_paths") else {
        return;
    };
    let mut r = rng("add_rms_norm");
    all_sizes(&gpu, &mut |g, rows, h| {
        check_add_rms::<f32>(g, rows, h, &mut r);
        check_add_rms::<f16>(g, rows, h, &mut r);
        check_add_rms::<bf16>(g, rows, h, &mut r);
    });
}

#[test]
fn layer_norm_matches_reference_with_and_without_bias() {
    let Some(gpu) = gpu_or_skip("layer_norm_matches_reference_with_and_without_bias") else {
        return;
    };
    let mut r = rng("layer_norm");
    all_sizes(&gpu, &mut |g, rows, h| {
        check_layer::<f32>(g, rows, h, true, &mut r);
        check_layer::<f16>(g, rows, h, false, &mut r);
        check_layer::<bf16>(g, rows, h, true, &mut r);
    });
}

#[test]
fn add_bias_layer_norm_matches_reference_in_and_out_of_place() {
    let Some(gpu) = gpu_or_skip("add_bias_layer_norm_matches_reference_in_and_out_of_place") else {
        return;
    };
    let mut r = rng("add_bias_layer_norm");
    all_sizes(&gpu, &mut |g, rows, h| {
        check_add_bias_layer::<f32>(g, rows, h, true, false, &mut r);
        check_add_bias_layer::<f16>(g, rows, h, true, true, &mut r);
        check_add_bias_layer::<bf16>(g, rows, h, false, true, &mut r);
        check_add_bias_layer::<f16>(g, rows, h, false, false, &mut r);
    });
}

#[test]
fn add_rms_norm_equals_add_then_rms_norm() {
    // The fused op and the two unfused ops agree bit for bit (same rounding points).
    let Some(gpu) = gpu_or_skip("add_rms_norm_equals_add_then_rms_norm") else {
        return;
    };
    let s = gpu.stream();
    let mut r = rng("add_rms_norm_fused");
    for &(rows, h) in &[(5usize, 4096usize), (2, 4095), (7, 256)] {
        let inp = inputs::<bf16>(&mut r, rows, h);
        let dx = DeviceTensor::from_host(s, &inp.x, &[rows, h]).unwrap();
        let dw = DeviceTensor::from_host(s, &inp.w, &[h]).unwrap();
        let mut dr = DeviceTensor::from_host(s, &inp.res, &[rows, h]).unwrap();
        let mut y1 = DeviceTensor::filled(s, &[rows, h], bf16::NAN).unwrap();
        norm::add_rms_norm(s, &dx, &mut dr, &dw, 1e-5, &mut y1).unwrap();
        let dr0 = DeviceTensor::from_host(s, &inp.res, &[rows, h]).unwrap();
        let mut sum = DeviceTensor::filled(s, &[rows, h], bf16::NAN).unwrap();
        fl_kernels::elementwise::add(s, &dr0, &dx, &mut sum).unwrap();
        let mut y2 = DeviceTensor::filled(s, &[rows, h], bf16::NAN).unwrap();
        norm::rms_norm(s, &sum, &dw, 1e-5, &mut y2).unwrap();
        assert_eq!(
            dr.to_host(s).unwrap(),
            sum.to_host(s).unwrap(),
            "{rows}x{h}"
        );
        assert_eq!(
            to_f64(&y1.to_host(s).unwrap()),
            to_f64(&y2.to_host(s).unwrap()),
            "{rows}x{h}"
        );
    }
}

// ---- raw launcher: in place (y == x) and unaligned pointers (the scalar path) ----

fn raw_rms(
    x: u64,
    w: u64,
    y: u64,
    rows: i64,
    hidden: i64,
    s: &fl_kernels::cudarc::driver::CudaStream,
) -> i32 {
    // SAFETY: callers pass device pointers to rows * hidden (x, y) and hidden (w) f16.
    unsafe {
        fl_kernels_sys::fl_rms_norm(
            fl_kernels_sys::fl_dtype::FL_DTYPE_F16,
            x as _,
            w as _,
            y as _,
            rows,
            hidden,
            1e-5,
            s.cu_stream() as _,
        )
    }
}

#[test]
fn rms_norm_in_place_and_unaligned() {
    let Some(gpu) = gpu_or_skip("rms_norm_in_place_and_unaligned") else {
        return;
    };
    use fl_kernels::cudarc::driver::{DevicePtr, DevicePtrMut};
    let s = gpu.stream();
    let mut r = rng("rms_norm_raw");
    for &(rows, h) in &[(3usize, 4096usize), (2, 256), (5, 4095)] {
        let x: Vec<f16> = random_nonzero(&mut r, rows * h + 1, 1e-3, 4.0);
        let w: Vec<f16> = random_nonzero(&mut r, h + 1, 0.5, 1.5);
        let want_inplace = reference::norm::rms_norm(&x[..rows * h], &w[..h], h, 1e-5);
        let want_off = reference::norm::rms_norm(&x[1..], &w[1..], h, 1e-5);
        let dw = DeviceTensor::from_host(s, &w, &[h + 1]).unwrap();
        // In place: y == x.
        let mut dx = DeviceTensor::from_host(s, &x, &[rows * h + 1]).unwrap();
        {
            let (pw, _g1) = dw.as_slice().device_ptr(s);
            let (px, _g2) = dx.as_slice_mut().device_ptr_mut(s);
            assert_eq!(raw_rms(px, pw, px, rows as i64, h as i64, s), 0);
        }
        let got = dx.to_host(s).unwrap();
        assert_close("rms_norm in place", &got[..rows * h], &want_inplace);
        // Offset by one element: no pointer is 16-byte aligned.
        let dx = DeviceTensor::from_host(s, &x, &[rows * h + 1]).unwrap();
        let mut dy = DeviceTensor::filled(s, &[rows * h + 1], f16::NAN).unwrap();
        {
            let (pw, _g1) = dw.as_slice().device_ptr(s);
            let (px, _g2) = dx.as_slice().device_ptr(s);
            let (py, _g3) = dy.as_slice_mut().device_ptr_mut(s);
            assert_eq!(raw_rms(px + 2, pw + 2, py + 2, rows as i64, h as i64, s), 0);
        }
        let got = dy.to_host(s).unwrap();
        assert!(got[0].is_nan(), "element before the range was written");
        assert_close("rms_norm unaligned", &got[1..], &want_off);
    }
}

#[test]
fn shape_and_eps_errors_name_the_argument() {
    let Some(gpu) = gpu_or_skip("shape_and_eps_errors_name_the_argument") else {
        return;
    };
    let s = gpu.stream();
    let x = DeviceTensor::<f16>::zeros(s, &[4, 64]).unwrap();
    let w = DeviceTensor::<f16>::zeros(s, &[64]).unwrap();
    let w_bad = DeviceTensor::<f16>::zeros(s, &[65]).unwrap();
    let mut y = DeviceTensor::<f16>::zeros(s, &[4, 64]).unwrap();
    let mut y_bad = DeviceTensor::<f16>::zeros(s, &[64, 4]).unwrap();
    let mut res = DeviceTensor::<f16>::zeros(s, &[4, 64]).unwrap();
    let mut res_bad = DeviceTensor::<f16>::zeros(s, &[4, 63]).unwrap();
    let shape_arg = |e: Result<(), Error>| match e {
        Err(Error::Shape { arg, .. }) => arg,
        other => panic!("expected a shape error, got {other:?}"),
    };
    assert_eq!(
        shape_arg(norm::rms_norm(s, &x, &w_bad, 1e-5, &mut y)),
        "weight"
    );
    assert_eq!(
        shape_arg(norm::rms_norm(s, &x, &w, 1e-5, &mut y_bad)),
        "out"
    );
    assert_eq!(
        shape_arg(norm::add_rms_norm(s, &x, &mut res_bad, &w, 1e-5, &mut y)),
        "residual"
    );
    assert_eq!(
        shape_arg(norm::add_rms_norm(s, &x, &mut res, &w_bad, 1e-5, &mut y)),
        "weight"
    );
    assert_eq!(
        shape_arg(norm::layer_norm(s, &x, &w, Some(&w_bad), 1e-5, &mut y)),
        "bias"
    );
    let res_bad = DeviceTensor::<f16>::zeros(s, &[3, 8]).unwrap();
    assert_eq!(
        shape_arg(norm::add_bias_layer_norm(
            s, &x, None, &res_bad, &w, None, 1e-5, &mut y
        )),
        "residual"
    );
    assert_eq!(
        shape_arg(norm::add_bias_layer_norm(
            s,
            &x,
            Some(&w_bad),
            &x,
            &w,
            None,
            1e-5,
            &mut y
        )),
        "x_bias"
    );
    assert_eq!(
        shape_arg(norm::add_bias_layer_norm_inplace(
            s,
            &x,
            None,
            &mut y,
            &w,
            Some(&w_bad),
            1e-5
        )),
        "bias"
    );
    let scalar = DeviceTensor::<f16>::zeros(s, &[]).unwrap();
    let mut scalar_out = DeviceTensor::<f16>::zeros(s, &[]).unwrap();
    assert_eq!(
        shape_arg(norm::rms_norm(s, &scalar, &w, 1e-5, &mut scalar_out)),
        "x"
    );
    let empty_hidden = DeviceTensor::<f16>::zeros(s, &[3, 0]).unwrap();
    let mut eo = DeviceTensor::<f16>::zeros(s, &[3, 0]).unwrap();
    assert_eq!(
        shape_arg(norm::rms_norm(s, &empty_hidden, &w, 1e-5, &mut eo)),
        "x"
    );
    for eps in [0.0f32, -1e-5, f32::NAN, f32::INFINITY] {
        for e in [
            norm::rms_norm(s, &x, &w, eps, &mut y),
            norm::add_rms_norm(s, &x, &mut res, &w, eps, &mut y),
            norm::layer_norm(s, &x, &w, None, eps, &mut y),
        ] {
            assert!(
                matches!(e, Err(Error::InvalidArgument { arg: "eps", .. })),
                "eps={eps}: {e:?}"
            );
        }
    }
    // Zero rows: fine, nothing launched.
    let x0 = DeviceTensor::<f16>::zeros(s, &[0, 64]).unwrap();
    let mut y0 = DeviceTensor::<f16>::zeros(s, &[0, 64]).unwrap();
    norm::rms_norm(s, &x0, &w, 1e-5, &mut y0).unwrap();
    // Residual aliasing y through the raw launcher is refused.
    use fl_kernels::cudarc::driver::DevicePtr;
    let (px, _g) = x.as_slice().device_ptr(s);
    let (pw, _g2) = w.as_slice().device_ptr(s);
    let (pr, _g3) = res.as_slice().device_ptr(s);
    // SAFETY: valid device buffers; the launcher rejects the call before launching.
    let st = unsafe {
        fl_kernels_sys::fl_add_rms_norm(
            fl_kernels_sys::fl_dtype::FL_DTYPE_F16,
            px as _,
            pr as _,
            pw as _,
            pr as _,
            4,
            64,
            1e-5,
            s.cu_stream() as _,
        )
    };
    assert_eq!(st, fl_kernels_sys::FL_ERR_INVALID_ARGUMENT);
}

#[test]
fn norm_gpu_proptest() {
    let Some(gpu) = gpu_or_skip("norm_gpu_proptest") else {
        return;
    };
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 32,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &(strategies::matrix(80, 20_000), 0u8..3, any::<u64>()),
            |((rows, hidden), op, seed)| {
                use rand::SeedableRng;
                let mut r = rand::rngs::StdRng::seed_from_u64(seed);
                match op {
                    0 => {
                        check_rms::<bf16>(&gpu, rows, hidden, &mut r);
                        check_rms::<f32>(&gpu, rows, hidden, &mut r);
                    }
                    1 => {
                        check_add_rms::<f16>(&gpu, rows, hidden, &mut r);
                        check_add_rms::<f32>(&gpu, rows, hidden, &mut r);
                    }
                    _ => {
                        check_layer::<bf16>(&gpu, rows, hidden, true, &mut r);
                        check_layer::<f32>(&gpu, rows, hidden, false, &mut r);
                    }
                }
                Ok(())
            },
        )
        .unwrap();
}

// ---- reference properties (CPU only, run in CI) ----

fn mean_square(v: &[f64]) -> f64 {
    v.iter().map(|a| a * a).sum::<f64>() / v.len() as f64
}

proptest! {
    #[test]
    fn reference_rms_norm_has_unit_rms_and_is_scale_invariant(
        (rows, hidden) in strategies::matrix(4, 3000),
        c in 0.25f32..4.0,
        seed in any::<u64>(),
    ) {
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let x: Vec<f32> = random_nonzero(&mut r, rows * hidden, 0.1, 2.0);
        let ones = vec![1.0f32; hidden];
        let eps = 1e-12;
        let y = reference::norm::rms_norm(&x, &ones, hidden, eps);
        for row in y.chunks(hidden) {
            prop_assert!((mean_square(row) - 1.0).abs() < 1e-9);
        }
        // Scaling x leaves the result unchanged (eps negligible); c * x is exact in f64.
        let xc: Vec<f32> = x.iter().map(|v| v * c).collect();
        let yc = reference::norm::rms_norm(&xc, &ones, hidden, eps);
        for (a, b) in y.iter().zip(&yc) {
            prop_assert!((a - b).abs() < 1e-5 * (1.0 + a.abs()), "{a} vs {b}");
        }
        // The weight multiplies element-wise.
        let w: Vec<f32> = random_nonzero(&mut r, hidden, 0.5, 1.5);
        let yw = reference::norm::rms_norm(&x, &w, hidden, eps);
        for (i, (a, b)) in y.iter().zip(&yw).enumerate() {
            let wi = w[i % hidden] as f64;
            prop_assert!((a * wi - b).abs() <= 1e-12 * (1.0 + b.abs()));
        }
    }

    #[test]
    fn reference_add_rms_norm_is_add_then_rms_norm(
        (rows, hidden) in strategies::matrix(4, 2000),
        seed in any::<u64>(),
    ) {
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let x: Vec<bf16> = random(&mut r, rows * hidden);
        let res: Vec<bf16> = random(&mut r, rows * hidden);
        let w: Vec<bf16> = random_nonzero(&mut r, hidden, 0.5, 1.5);
        let (new_res, y) = reference::norm::add_rms_norm(&x, &res, &w, hidden, 1e-5);
        for i in 0..x.len() {
            prop_assert_eq!(new_res[i], bf16::from_f32(res[i].to_f32() + x[i].to_f32()));
        }
        prop_assert_eq!(y, reference::norm::rms_norm(&new_res, &w, hidden, 1e-5));
    }

    #[test]
    fn reference_layer_norm_centres_and_scales(
        (rows, hidden) in strategies::matrix(4, 3000),
        shift in -100.0f32..100.0,
        seed in any::<u64>(),
    ) {
        prop_assume!(hidden >= 2);
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let x: Vec<f32> = random_nonzero(&mut r, rows * hidden, 0.1, 2.0);
        let ones = vec![1.0f32; hidden];
        let eps = 1e-12f32;
        let y = reference::norm::layer_norm(&x, &ones, None, hidden, eps);
        // The input rows' own variances: the output variance is v / (v + eps), which is
        // not 1 when a short row happens to hold nearly equal values (hidden = 2 with
        // x0 ~ x1 gives v ~ 1e-8, so eps moves the result by 1e-4).
        let in_var: Vec<f64> = x
            .chunks(hidden)
            .map(|row| {
                let m = row.iter().map(|&v| v as f64).sum::<f64>() / hidden as f64;
                row.iter().map(|&v| (v as f64 - m) * (v as f64 - m)).sum::<f64>() / hidden as f64
            })
            .collect();
        for (row, &v) in y.chunks(hidden).zip(&in_var) {
            let mean = row.iter().sum::<f64>() / hidden as f64;
            prop_assert!(mean.abs() < 1e-9, "mean {mean}");
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / hidden as f64;
            let want = v / (v + eps as f64);
            prop_assert!((var - want).abs() < 1e-9, "var {var}, want {want} (input var {v})");
        }
        // Shift invariance, up to the rounding of x + shift to f32: each element moves by at
        // most half an ulp of |x + shift|, which the normalisation divides by the row's std.
        let xs: Vec<f32> = x.iter().map(|v| v + shift).collect();
        let ys = reference::norm::layer_norm(&xs, &ones, None, hidden, eps);
        for (i, (a, b)) in y.iter().zip(&ys).enumerate() {
            let std = in_var[i / hidden].sqrt();
            let tol = 1e-9 + 4.0 * (shift.abs() as f64 + 2.0) * f32::EPSILON as f64 / std;
            prop_assert!((a - b).abs() < tol, "{a} vs {b} (tolerance {tol})");
        }
        // The bias adds element-wise.
        let b: Vec<f32> = random(&mut r, hidden);
        let yb = reference::norm::layer_norm(&x, &ones, Some(&b), hidden, 1e-12);
        for (i, (a, c)) in y.iter().zip(&yb).enumerate() {
            prop_assert!((a + b[i % hidden] as f64 - c).abs() < 1e-12);
        }
    }
}

#[test]
fn reference_rms_norm_known_values() {
    // x = [3, 4]: mean square 12.5, rstd = 1 / sqrt(12.5) (eps tiny).
    let y = reference::norm::rms_norm(&[3.0f32, 4.0], &[1.0, 2.0], 2, 1e-30);
    let rstd = 1.0 / 12.5f64.sqrt();
    assert!((y[0] - 3.0 * rstd).abs() < 1e-12 && (y[1] - 8.0 * rstd).abs() < 1e-12);
    // x = [1, 3]: mean 2, var 1 -> [-1, 1].
    let z = reference::norm::layer_norm(&[1.0f32, 3.0], &[1.0, 1.0], Some(&[0.5, 0.5]), 2, 1e-30);
    assert!(
        (z[0] + 0.5).abs() < 1e-9 && (z[1] - 1.5).abs() < 1e-9,
        "{z:?}"
    );
}
