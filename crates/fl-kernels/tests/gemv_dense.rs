//! gemv_dense::{linear, linear_swiglu, linear_add, rms_norm_linear, rms_norm_linear_swiglu}
//! on the GPU against reference::gemv_dense (and reference::norm for the fused RMSNorm), and CPU property tests of the references (these run without a GPU).

use fl_kernels::gemv_dense::{self, MAX_M};
use fl_kernels::testing::{gpu_or_skip, random, rel_l2, rng, to_f64};
use fl_kernels::{bf16, f16, reference, DeviceTensor, Error, Gpu, HalfDType};
use proptest::prelude::*;

/// Rel L2 bound: each output is rounded once to T (<= EPS relative), the f32 sums add little.
fn bound<T: HalfDType>() -> f64 {
    2.0 * T::EPS
}

/// Runs the three epilogues on one random problem (x [m, k], a [2n, k] weight: `linear` and
/// `linear_add` use its first n rows, `linear_swiglu` all of it with I = n) and compares each
/// with the f64 reference. `bias` selects the bias of `linear`.
fn check<T: HalfDType>(
    gpu: &Gpu,
    m: usize,
    n: usize,
    k: usize,
    bias: bool,
    r: &mut impl rand::Rng,
) {
    let s = gpu.stream();
    let x: Vec<T> = random(r, m * k);
    let w2: Vec<T> = random(r, 2 * n * k);
    let b: Vec<T> = random(r, n);
    let res: Vec<T> = random(r, m * n);
    let dx = DeviceTensor::from_host(s, &x, &[m, k]).unwrap();
    let dw2 = DeviceTensor::from_host(s, &w2, &[2 * n, k]).unwrap();
    let dw = DeviceTensor::from_host(s, &w2[..n * k], &[n, k]).unwrap();
    let db = DeviceTensor::from_host(s, &b, &[n]).unwrap();
    let nan = T::from_f32(f32::NAN);
    let id = format!("<{}> m={m} n={n} k={k}", T::NAME);

    // One f64 product over all 2n rows; the three references follow from it.
    let gu = reference::gemv_dense::linear(&x, &w2, None, m, 2 * n, k);
    let acc = |t: usize, c: usize| gu[t * 2 * n + c];

    let mut y = DeviceTensor::filled(s, &[m, n], nan).unwrap();
    gemv_dense::linear(s, &dx, &dw, bias.then_some(&db), &mut y).unwrap();
    let want: Vec<f64> = (0..m * n)
        .map(|e| acc(e / n, e % n) + if bias { b[e % n].to_f64() } else { 0.0 })
        .collect();
    let err = rel_l2(&y.to_host(s).unwrap(), &want);
    assert!(err < bound::<T>(), "linear{id} bias={bias}: rel L2 {err:e}");

    let mut out = DeviceTensor::filled(s, &[m, n], nan).unwrap();
    gemv_dense::linear_swiglu(s, &dx, &dw2, &mut out).unwrap();
    let want: Vec<f64> = (0..m * n)
        .map(|e| reference::gemv_dense::silu(acc(e / n, e % n)) * acc(e / n, n + e % n))
        .collect();
    // silu(g) for g << 0 is tiny (f16-subnormal for g below about -15), where the output's
    // few significant bits make a relative error meaningless; with n = 1 and m = 2 both
    // values can be tiny (seen on the H100: rel L2 2.8e-2 of two subnormals). Measure the
    // error against 1% of the typical |g|·|u| scale instead when the outputs are that small.
    let rms = |off: usize| {
        let v: Vec<f64> = (0..m * n).map(|e| acc(e / n, off + e % n)).collect();
        (v.iter().map(|a| a * a).sum::<f64>() / v.len().max(1) as f64).sqrt()
    };
    let floor = 1e-2 * rms(0) * rms(n);
    let err = fl_kernels::testing::rel_l2_floored(&out.to_host(s).unwrap(), &want, floor);
    assert!(
        err < bound::<T>(),
        "linear_swiglu{id}: rel L2 {err:e} (floor {floor:e})"
    );

    let mut dres = DeviceTensor::from_host(s, &res, &[m, n]).unwrap();
    gemv_dense::linear_add(s, &dx, &dw, &mut dres).unwrap();
    let want: Vec<f64> = (0..m * n)
        .map(|e| res[e].to_f64() + acc(e / n, e % n))
        .collect();
    let err = rel_l2(&dres.to_host(s).unwrap(), &want);
    assert!(err < bound::<T>(), "linear_add{id}: rel L2 {err:e}");
}

/// (n, k): odd n (4097: one 8-row tile per CTA on an H100; 8193: two), k from one 16-byte
/// piece (8) to several warps' worth of 32-wide chunks with a partial last chunk (1000, 4104).
fn shapes() -> Vec<(usize, usize)> {
    let mut v = Vec::new();
    for n in [1, 7, 129, 4097] {
        for k in [8, 64, 4104, 11008] {
            v.push((n, k));
        }
    }
    v.extend([(8193, 8), (8193, 64), (8193, 1000)]);
    v
}

#[test]
fn gemv_dense_matches_reference_every_epilogue_dtype_and_shape() {
    let Some(gpu) = gpu_or_skip("gemv_dense_matches_reference_every_epilogue_dtype_and_shape")
    else {
        return;
    };
    let mut r = rng("gemv_dense");
    for (n, k) in shapes() {
        for m in [1, 2, 5, 16] {
            // The f64 reference runs unoptimised in test builds: the two largest weights
            // get m = 1 (and 4097 x 4104 also m = 16, the second x-row tile).
            if n * k > 2_000_000 && m != 1 && !(m == 16 && k == 4104) {
                continue;
            }
            let bias = (m + n + k) % 2 == 0;
            check::<f16>(&gpu, m, n, k, bias, &mut r);
            check::<bf16>(&gpu, m, n, k, !bias, &mut r);
        }
    }
}

#[test]
fn gemv_dense_every_token_count() {
    // Each m in 1..=16 (both x-row tiles, partly filled), two warps' worth of k.
    let Some(gpu) = gpu_or_skip("gemv_dense_every_token_count") else {
        return;
    };
    let mut r = rng("gemv_dense_m");
    for m in 1..=MAX_M {
        check::<bf16>(&gpu, m, 37, 1040, m % 2 == 0, &mut r);
        check::<f16>(&gpu, m, 37, 1040, m % 2 == 1, &mut r);
    }
}

/// The RMSNorm-fused launches against rms_norm (f64, rounded to T as the kernel rounds x)
/// followed by the plain references, and against the unfused GPU pair rms_norm + linear.
fn check_norm<T: HalfDType>(gpu: &Gpu, m: usize, n: usize, k: usize, r: &mut impl rand::Rng) {
    let s = gpu.stream();
    // h of scale ~3 (a residual stream, not unit RMS), gamma in [-1, 1] with no zeros.
    let h: Vec<T> = random::<T>(r, m * k)
        .iter()
        .map(|v| T::from_f32(3.0 * v.to_f32()))
        .collect();
    let gamma: Vec<T> = random(r, k);
    let w2: Vec<T> = random(r, 2 * n * k);
    let b: Vec<T> = random(r, n);
    let eps = 1e-5f32;
    let dh = DeviceTensor::from_host(s, &h, &[m, k]).unwrap();
    let dg = DeviceTensor::from_host(s, &gamma, &[k]).unwrap();
    let dw2 = DeviceTensor::from_host(s, &w2, &[2 * n, k]).unwrap();
    let dw = DeviceTensor::from_host(s, &w2[..n * k], &[n, k]).unwrap();
    let db = DeviceTensor::from_host(s, &b, &[n]).unwrap();
    let nan = T::from_f32(f32::NAN);
    let id = format!("<{}> m={m} n={n} k={k}", T::NAME);
    let norm = gemv_dense::RmsNorm { weight: &dg, eps };

    let x: Vec<T> = reference::norm::rms_norm(&h, &gamma, k, eps)
        .iter()
        .map(|v| T::from_f32(*v as f32))
        .collect();
    let gu = reference::gemv_dense::linear(&x, &w2, None, m, 2 * n, k);
    let acc = |t: usize, c: usize| gu[t * 2 * n + c];

    let bias = (m + n) % 2 == 0;
    let mut y = DeviceTensor::filled(s, &[m, n], nan).unwrap();
    gemv_dense::rms_norm_linear(s, &dh, norm, &dw, bias.then_some(&db), &mut y).unwrap();
    let got = y.to_host(s).unwrap();
    let want: Vec<f64> = (0..m * n)
        .map(|e| acc(e / n, e % n) + if bias { b[e % n].to_f64() } else { 0.0 })
        .collect();
    let err = rel_l2(&got, &want);
    assert!(err < bound::<T>(), "rms_norm_linear{id}: rel L2 {err:e}");

    // The unfused pair on the GPU: same x up to rstd's summation order.
    let mut dx = DeviceTensor::filled(s, &[m, k], nan).unwrap();
    fl_kernels::norm::rms_norm(s, &dh, &dg, eps, &mut dx).unwrap();
    let mut y2 = DeviceTensor::filled(s, &[m, n], nan).unwrap();
    gemv_dense::linear(s, &dx, &dw, bias.then_some(&db), &mut y2).unwrap();
    let err = rel_l2(&got, &to_f64(&y2.to_host(s).unwrap()));
    assert!(
        err < bound::<T>(),
        "rms_norm_linear{id} vs rms_norm + linear: rel L2 {err:e}"
    );

    let mut out = DeviceTensor::filled(s, &[m, n], nan).unwrap();
    gemv_dense::rms_norm_linear_swiglu(s, &dh, norm, &dw2, &mut out).unwrap();
    let want: Vec<f64> = (0..m * n)
        .map(|e| reference::gemv_dense::silu(acc(e / n, e % n)) * acc(e / n, n + e % n))
        .collect();
    let rms = |off: usize| {
        let v: Vec<f64> = (0..m * n).map(|e| acc(e / n, off + e % n)).collect();
        (v.iter().map(|a| a * a).sum::<f64>() / v.len().max(1) as f64).sqrt()
    };
    let floor = 1e-2 * rms(0) * rms(n);
    let err = fl_kernels::testing::rel_l2_floored(&out.to_host(s).unwrap(), &want, floor);
    assert!(
        err < bound::<T>(),
        "rms_norm_linear_swiglu{id}: rel L2 {err:e}"
    );
}

#[test]
fn gemv_dense_rms_norm_fused_matches_reference() {
    let Some(gpu) = gpu_or_skip("gemv_dense_rms_norm_fused_matches_reference") else {
        return;
    };
    let mut r = rng("gemv_dense_norm");
    // k from one 16-byte piece to a partial last chunk over several warps; every token-row
    // tile (m = 1, 3, 8, 9, 16); the engine's shape (4096 -> 12288 at m = 1, 4).
    for (n, k) in [(1, 8), (7, 64), (129, 1000), (37, 4104), (4097, 64)] {
        for m in [1, 3, 8, 9, 16] {
            check_norm::<f16>(&gpu, m, n, k, &mut r);
            check_norm::<bf16>(&gpu, m, n, k, &mut r);
        }
    }
    check_norm::<f16>(&gpu, 1, 12288, 4096, &mut r);
    check_norm::<bf16>(&gpu, 4, 1031, 4096, &mut r);
}

#[test]
fn gemv_dense_rms_norm_errors_name_the_argument() {
    let Some(gpu) = gpu_or_skip("gemv_dense_rms_norm_errors_name_the_argument") else {
        return;
    };
    let s = gpu.stream();
    let z = |shape: &[usize]| DeviceTensor::<f16>::zeros(s, shape).unwrap();
    let (h, w, w2, g) = (z(&[2, 64]), z(&[8, 64]), z(&[16, 64]), z(&[64]));
    let mut y = z(&[2, 8]);
    let ok = gemv_dense::RmsNorm {
        weight: &g,
        eps: 1e-6,
    };
    gemv_dense::rms_norm_linear(s, &h, ok, &w, None, &mut y).unwrap();
    gemv_dense::rms_norm_linear_swiglu(s, &h, ok, &w2, &mut y).unwrap();
    let g_bad = z(&[32]);
    let bad = gemv_dense::RmsNorm {
        weight: &g_bad,
        eps: 1e-6,
    };
    assert!(matches!(
        gemv_dense::rms_norm_linear(s, &h, bad, &w, None, &mut y),
        Err(Error::Shape {
            arg: "norm.weight",
            ..
        })
    ));
    assert!(matches!(
        gemv_dense::rms_norm_linear_swiglu(s, &h, bad, &w2, &mut y),
        Err(Error::Shape {
            arg: "norm.weight",
            ..
        })
    ));
    for eps in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let e = gemv_dense::RmsNorm { weight: &g, eps };
        assert!(matches!(
            gemv_dense::rms_norm_linear(s, &h, e, &w, None, &mut y),
            Err(Error::InvalidArgument { arg: "eps", .. })
        ));
    }
    assert!(matches!(
        gemv_dense::rms_norm_linear(s, &h, ok, &w, None, &mut z(&[2, 9])),
        Err(Error::Shape { arg: "y", .. })
    ));
    s.synchronize().unwrap();
}

#[test]
fn gemv_dense_exact_small_integers() {
    // Integer inputs small enough that every product, sum and result is exact in f32 and in
    // T: the outputs must match exactly. linear_add adds x · wᵀ exactly once (twice would
    // give residual + 2 acc), and swiglu pairs gate row r with up row I + r.
    let Some(gpu) = gpu_or_skip("gemv_dense_exact_small_integers") else {
        return;
    };
    let s = gpu.stream();
    let (m, n, k) = (3usize, 21usize, 64usize);
    let x: Vec<f16> = (0..m * k)
        .map(|i| f16::from_f32(((i * 7) % 5) as f32 - 2.0))
        .collect();
    let w2: Vec<f16> = (0..2 * n * k)
        .map(|i| f16::from_f32(((i * 3) % 7) as f32 - 3.0))
        .collect();
    let res: Vec<f16> = (0..m * n).map(|i| f16::from_f32(i as f32 - 30.0)).collect();
    let dx = DeviceTensor::from_host(s, &x, &[m, k]).unwrap();
    let dw = DeviceTensor::from_host(s, &w2[..n * k], &[n, k]).unwrap();
    let acc = reference::gemv_dense::linear(&x, &w2[..n * k], None, m, n, k);

    let mut dres = DeviceTensor::from_host(s, &res, &[m, n]).unwrap();
    gemv_dense::linear_add(s, &dx, &dw, &mut dres).unwrap();
    let want: Vec<f64> = res.iter().zip(&acc).map(|(r, a)| r.to_f64() + a).collect();
    assert_eq!(to_f64(&dres.to_host(s).unwrap()), want, "linear_add");
    // A second call adds the product a second time, exactly.
    gemv_dense::linear_add(s, &dx, &dw, &mut dres).unwrap();
    let want2: Vec<f64> = want.iter().zip(&acc).map(|(w, a)| w + a).collect();
    assert_eq!(to_f64(&dres.to_host(s).unwrap()), want2, "linear_add twice");

    let mut y = DeviceTensor::filled(s, &[m, n], f16::NAN).unwrap();
    gemv_dense::linear(s, &dx, &dw, None, &mut y).unwrap();
    assert_eq!(to_f64(&y.to_host(s).unwrap()), acc, "linear");

    // SwiGLU against the reference (gate = rows 0..I, up = rows I..2I), then with an all-zero
    // gate half: silu(0) = 0, so every output is exactly 0.
    let dw2 = DeviceTensor::from_host(s, &w2, &[2 * n, k]).unwrap();
    let mut out = DeviceTensor::filled(s, &[m, n], f16::NAN).unwrap();
    gemv_dense::linear_swiglu(s, &dx, &dw2, &mut out).unwrap();
    let want = reference::gemv_dense::linear_swiglu(&x, &w2, m, n, k);
    let err = rel_l2(&out.to_host(s).unwrap(), &want);
    assert!(err < bound::<f16>(), "swiglu: rel L2 {err:e}");
    let mut zero_gate = w2.clone();
    zero_gate[..n * k].fill(f16::ZERO);
    let dz = DeviceTensor::from_host(s, &zero_gate, &[2 * n, k]).unwrap();
    gemv_dense::linear_swiglu(s, &dx, &dz, &mut out).unwrap();
    assert!(
        out.to_host(s).unwrap().iter().all(|v| v.to_f32() == 0.0),
        "swiglu with a zero gate half"
    );
}

#[test]
fn gemv_dense_shape_errors_name_the_argument() {
    let Some(gpu) = gpu_or_skip("gemv_dense_shape_errors_name_the_argument") else {
        return;
    };
    let s = gpu.stream();
    let z = |shape: &[usize]| DeviceTensor::<f16>::zeros(s, shape).unwrap();
    let (x, w, w2, b) = (z(&[2, 64]), z(&[8, 64]), z(&[16, 64]), z(&[8]));
    let mut y = z(&[2, 8]);
    gemv_dense::linear(s, &x, &w, Some(&b), &mut y).unwrap();
    gemv_dense::linear_swiglu(s, &x, &w2, &mut y).unwrap();
    gemv_dense::linear_add(s, &x, &w, &mut y).unwrap();

    let shape_arg = |r: fl_kernels::Result<()>| match r {
        Err(Error::Shape { arg, .. }) => arg,
        other => panic!("expected a shape error, got {other:?}"),
    };
    assert_eq!(
        shape_arg(gemv_dense::linear(s, &z(&[64]), &w, None, &mut y)),
        "x"
    );
    assert_eq!(
        shape_arg(gemv_dense::linear(s, &x, &z(&[8, 32]), None, &mut y)),
        "w"
    );
    assert_eq!(
        shape_arg(gemv_dense::linear(s, &x, &z(&[512]), None, &mut y)),
        "w"
    );
    assert_eq!(
        shape_arg(gemv_dense::linear(s, &x, &w, Some(&z(&[9])), &mut y)),
        "bias"
    );
    assert_eq!(
        shape_arg(gemv_dense::linear(s, &x, &w, None, &mut z(&[2, 9]))),
        "y"
    );
    assert_eq!(
        shape_arg(gemv_dense::linear_swiglu(s, &x, &z(&[15, 64]), &mut y)),
        "w_gate_up"
    );
    assert_eq!(
        shape_arg(gemv_dense::linear_swiglu(s, &x, &z(&[16, 72]), &mut y)),
        "w_gate_up"
    );
    assert_eq!(
        shape_arg(gemv_dense::linear_swiglu(s, &x, &w2, &mut z(&[2, 16]))),
        "out"
    );
    assert_eq!(
        shape_arg(gemv_dense::linear_add(s, &x, &w, &mut z(&[1, 8]))),
        "residual"
    );
    assert_eq!(
        shape_arg(gemv_dense::linear_add(s, &x, &z(&[8, 72]), &mut y)),
        "w"
    );

    // m > 16: TooLarge naming x; k not a multiple of 8: InvalidArgument naming x.
    let x17 = z(&[17, 64]);
    let mut y17 = z(&[17, 8]);
    assert!(matches!(
        gemv_dense::linear(s, &x17, &w, None, &mut y17),
        Err(Error::TooLarge { arg: "x", .. })
    ));
    assert!(matches!(
        gemv_dense::linear_add(s, &x17, &w, &mut y17),
        Err(Error::TooLarge { arg: "x", .. })
    ));
    let (x12, w12) = (z(&[2, 12]), z(&[8, 12]));
    assert!(matches!(
        gemv_dense::linear(s, &x12, &w12, None, &mut y),
        Err(Error::InvalidArgument { arg: "x", .. })
    ));
    let (x0, w0) = (z(&[2, 0]), z(&[8, 0]));
    assert!(matches!(
        gemv_dense::linear(s, &x0, &w0, None, &mut y),
        Err(Error::InvalidArgument { arg: "x", .. })
    ));
    // m = 0 and n = 0 launch nothing.
    gemv_dense::linear(s, &z(&[0, 64]), &w, None, &mut z(&[0, 8])).unwrap();
    gemv_dense::linear_swiglu(s, &x, &z(&[0, 64]), &mut z(&[2, 0])).unwrap();
    s.synchronize().unwrap();
}

#[test]
fn gemv_dense_launcher_rejects_misaligned_and_bad_arguments() {
    let Some(gpu) = gpu_or_skip("gemv_dense_launcher_rejects_misaligned_and_bad_arguments") else {
        return;
    };
    use fl_kernels::cudarc::driver::{DevicePtr, DevicePtrMut};
    use fl_kernels_sys::{
        fl_dtype, fl_gemv_dense, fl_gemv_dense_epilogue as Epi, FL_ERR_MISALIGNED,
    };
    let s = gpu.stream();
    let wbuf = DeviceTensor::<f16>::zeros(s, &[2 * 32 * 64 + 8]).unwrap();
    let xbuf = DeviceTensor::<f16>::zeros(s, &[2 * 64 + 8]).unwrap();
    let bbuf = DeviceTensor::<f16>::zeros(s, &[64]).unwrap();
    let mut ybuf = DeviceTensor::<f16>::zeros(s, &[2 * 64]).unwrap();
    let (pw, _g1) = wbuf.as_slice().device_ptr(s);
    let (px, _g2) = xbuf.as_slice().device_ptr(s);
    let (pb, _g3) = bbuf.as_slice().device_ptr(s);
    let (py, _g4) = ybuf.as_slice_mut().device_ptr_mut(s);
    let call = |epi: Epi, x: u64, w: u64, b: u64, m: i64, k: i64, dt: fl_dtype| {
        // SAFETY: the buffers hold more than any call below reads or writes (n = 32 outputs,
        // at most 64 weight rows of k <= 64 plus an 8-element offset; x 2 rows of 64 plus 8;
        // y 2 x 32 halves).
        unsafe {
            fl_gemv_dense(
                dt,
                epi,
                x as _,
                w as _,
                b as _,
                py as _,
                m,
                32,
                k,
                s.cu_stream() as _,
            )
        }
    };
    let f16t = fl_dtype::FL_DTYPE_F16;
    let (lin, swi, add) = (
        Epi::FL_GEMV_DENSE_LINEAR,
        Epi::FL_GEMV_DENSE_SWIGLU,
        Epi::FL_GEMV_DENSE_ADD,
    );
    assert_eq!(call(lin, px, pw, pb, 2, 64, f16t), 0);
    assert_eq!(call(swi, px, pw, 0, 2, 64, f16t), 0);
    assert_eq!(call(add, px, pw, 0, 2, 64, f16t), 0);
    assert_eq!(call(lin, px + 2, pw, 0, 1, 64, f16t), FL_ERR_MISALIGNED);
    assert_eq!(call(lin, px, pw + 8, 0, 1, 64, f16t), FL_ERR_MISALIGNED);
    assert_eq!(call(lin, px, pw, pb + 1, 1, 64, f16t), FL_ERR_MISALIGNED);
    assert!(call(swi, px, pw, pb, 1, 64, f16t) < 0, "bias with swiglu");
    assert!(call(add, px, pw, pb, 1, 64, f16t) < 0, "bias with add");
    assert!(call(lin, px, pw, 0, 17, 64, f16t) < 0, "m > 16");
    assert!(
        call(lin, px, pw, 0, 1, 60, f16t) < 0,
        "k not a multiple of 8"
    );
    assert!(call(lin, px, pw, 0, 1, 0, f16t) < 0, "k = 0");
    assert!(
        call(lin, px, pw, 0, 1, 64, fl_dtype::FL_DTYPE_F32) < 0,
        "f32"
    );
    s.synchronize().unwrap();
}

#[test]
fn gemv_dense_gpu_proptest() {
    let Some(gpu) = gpu_or_skip("gemv_dense_gpu_proptest") else {
        return;
    };
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 32,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &(
                1..=MAX_M,
                1usize..300,
                1usize..=160,
                any::<bool>(),
                any::<u64>(),
            ),
            |(m, n, k8, bias, seed)| {
                use rand::SeedableRng;
                let mut r = rand::rngs::StdRng::seed_from_u64(seed);
                check::<f16>(&gpu, m, n, 8 * k8, bias, &mut r);
                check::<bf16>(&gpu, m, n, 8 * k8, !bias, &mut r);
                Ok(())
            },
        )
        .unwrap();
}

// ---- references (CPU only, run in CI) ----

fn values(seed: u64, n: usize) -> Vec<f16> {
    use rand::SeedableRng;
    random(&mut rand::rngs::StdRng::seed_from_u64(seed), n)
}

proptest! {
    #[test]
    fn reference_linear_with_identity_weight_copies_x(
        m in 1usize..5, k8 in 1usize..6, seed in any::<u64>(),
    ) {
        let k = 8 * k8;
        let x = values(seed, m * k);
        let eye: Vec<f16> = (0..k * k)
            .map(|i| if i / k == i % k { f16::ONE } else { f16::ZERO })
            .collect();
        prop_assert_eq!(
            reference::gemv_dense::linear(&x, &eye, None, m, k, k),
            to_f64(&x)
        );
    }

    #[test]
    fn reference_linear_is_linear_in_x_and_adds_the_bias(
        m in 1usize..5, n in 1usize..9, k8 in 1usize..5, seed in any::<u64>(),
    ) {
        // Scaling x by 2 is exact in f16 and in f64: y(2x) = 2 y(x) exactly.
        let k = 8 * k8;
        let x = values(seed, m * k);
        let w = values(seed ^ 1, n * k);
        let b = values(seed ^ 2, n);
        let x2: Vec<f16> = x.iter().map(|v| f16::from_f32(2.0 * v.to_f32())).collect();
        let y = reference::gemv_dense::linear(&x, &w, None, m, n, k);
        let y2 = reference::gemv_dense::linear(&x2, &w, None, m, n, k);
        prop_assert_eq!(y2, y.iter().map(|v| 2.0 * v).collect::<Vec<_>>());
        let yb = reference::gemv_dense::linear(&x, &w, Some(&b), m, n, k);
        for (e, (&a, &c)) in yb.iter().zip(&y).enumerate() {
            prop_assert_eq!(a, c + b[e % n].to_f64());
        }
    }

    #[test]
    fn reference_swiglu_pairs_gate_row_r_with_up_row_i_plus_r(
        m in 1usize..4, i in 1usize..7, k8 in 1usize..4, seed in any::<u64>(),
    ) {
        let k = 8 * k8;
        let x = values(seed, m * k);
        let w = values(seed ^ 3, 2 * i * k);
        let gate = reference::gemv_dense::linear(&x, &w[..i * k], None, m, i, k);
        let up = reference::gemv_dense::linear(&x, &w[i * k..], None, m, i, k);
        let out = reference::gemv_dense::linear_swiglu(&x, &w, m, i, k);
        for e in 0..m * i {
            let g = gate[e];
            prop_assert_eq!(out[e], g / (1.0 + (-g).exp()) * up[e]);
        }
    }

    #[test]
    fn reference_linear_add_is_residual_plus_linear(
        m in 1usize..4, n in 1usize..9, k8 in 1usize..4, seed in any::<u64>(),
    ) {
        let k = 8 * k8;
        let x = values(seed, m * k);
        let w = values(seed ^ 4, n * k);
        let res = values(seed ^ 5, m * n);
        let y = reference::gemv_dense::linear(&x, &w, None, m, n, k);
        let out = reference::gemv_dense::linear_add(&x, &w, &res, m, n, k);
        for e in 0..m * n {
            prop_assert_eq!(out[e], res[e].to_f64() + y[e]);
        }
    }
}

#[test]
fn reference_silu_known_values() {
    use reference::gemv_dense::silu;
    assert_eq!(silu(0.0), 0.0);
    assert!((silu(1.0) - 1.0 / (1.0 + (-1f64).exp())).abs() < 1e-15);
    assert!((silu(40.0) - 40.0).abs() < 1e-12);
    assert!(silu(-40.0).abs() < 1e-15 && silu(-40.0) < 0.0);
}
