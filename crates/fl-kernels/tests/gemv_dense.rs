//! gemv_dense::{linear, linear_swiglu, linear_add, rms_norm_linear, rms_norm_linear_swiglu,
//! linear_rope_append} on the GPU against reference::gemv_dense (and reference::norm for the
//! fused RMSNorm), and CPU property tests of the references (these run without a GPU).

use fl_kernels::gemv_dense::{self, MAX_M};
use fl_kernels::testing::{gpu_or_skip, random, rel_l2, rng, to_f64};
use fl_kernels::{bf16, f16, reference, DeviceTensor, Error, FloatDType, Gpu, HalfDType};
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

// ---- linear_rope_append: QKV projection + interleaved RoPE + KV-cache append ----

use fl_kernels::gemv_dense::{QkvRopeAppend, RmsNorm};
use fl_kernels::kv_cache::{
    self, CacheLayout, KvCache, QkvSplit, TokenSlots, ERR_BLOCK, ERR_POSITION, ERR_SEQUENCE,
};
use fl_kernels::rope::{RopeParams, RopeStyle, Scaling};

const LLAMA3: Scaling = Scaling::Llama3 {
    factor: 8.0,
    low_freq_factor: 1.0,
    high_freq_factor: 4.0,
    original_max_position_embeddings: 8192,
};

/// Full interleaved rotary of heads of `d`, theta 10⁴.
fn interleaved(d: usize) -> RopeParams {
    RopeParams::new(d, 10_000.0).with_style(RopeStyle::Interleaved)
}

/// One fused problem: head counts, rotation, `k`, whether the RMSNorm and the bias are fused,
/// and the contiguous cache `[batch, kv_heads, max_seq, head_dim]`.
#[derive(Clone, Copy, Debug)]
struct Qkv {
    q_heads: usize,
    kv_heads: usize,
    rope: RopeParams,
    k: usize,
    norm: bool,
    bias: bool,
    batch: usize,
    max_seq: usize,
}

impl Qkv {
    fn heads(&self) -> QkvSplit {
        QkvSplit {
            q_heads: self.q_heads,
            kv_heads: self.kv_heads,
        }
    }
    /// Rows of the QKV weight.
    fn n(&self) -> usize {
        (self.q_heads + 2 * self.kv_heads) * self.rope.head_dim
    }
    fn cache_shape(&self) -> [usize; 4] {
        [self.batch, self.kv_heads, self.max_seq, self.rope.head_dim]
    }
}

/// `m` distinct (sequence, position) pairs in random sequences: the first token at position 0,
/// the last (m > 1) at `max_seq - 1`, the others strictly between (`max_seq >= 3`).
fn decode_slots(
    r: &mut impl rand::Rng,
    m: usize,
    batch: usize,
    max_seq: usize,
) -> (Vec<i32>, Vec<i32>) {
    let mut seen = std::collections::HashSet::new();
    let (mut seq, mut pos) = (vec![], vec![]);
    while seq.len() < m {
        let i = seq.len();
        let s = r.random_range(0..batch as i32);
        let p = if i == 0 {
            0
        } else if i == m - 1 {
            max_seq as i32 - 1
        } else {
            r.random_range(1..max_seq as i32 - 1)
        };
        if seen.insert((s, p)) {
            seq.push(s);
            pos.push(p);
        }
    }
    (seq, pos)
}

/// Which elements of a contiguous cache the tokens' slots cover (NaN: none).
fn written_mask(shape: [usize; 4], seq: &[i32], pos: &[i32]) -> Vec<f32> {
    let mut mask = vec![f32::NAN; shape.iter().product()];
    let ones = vec![1f32; seq.len() * shape[1] * shape[3]];
    reference::kv_cache::append(&mut mask, shape, &ones, seq, pos);
    mask
}

/// `n` values uniform in ±[lo, hi], rounded to `T`, from a SplitMix64 stream seeded by `r`:
/// `testing::random`'s values at a fraction of its cost in an unoptimised test build (the
/// weights and caches here run to millions of values per call).
fn fast_random<T: FloatDType>(r: &mut impl rand::Rng, n: usize, lo: f32, hi: f32) -> Vec<T> {
    let mut state: u64 = r.random();
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            let u = (z >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
            let mag = lo + u * (hi - lo);
            T::from_f32(if z & 1 == 1 { -mag } else { mag })
        })
        .collect()
}

/// h (scale ~3 when normalised: a residual stream), gamma, w and bias in [-1, 1].
struct QkvInputs<T> {
    h: Vec<T>,
    gamma: Vec<T>,
    w: Vec<T>,
    b: Vec<T>,
}

fn qkv_inputs<T: HalfDType>(c: &Qkv, m: usize, r: &mut impl rand::Rng) -> QkvInputs<T> {
    let scale = if c.norm { 3.0 } else { 1.0 };
    QkvInputs {
        h: fast_random(r, m * c.k, 1e-3 * scale, scale),
        gamma: fast_random(r, c.k, 1e-3, 1.0),
        w: fast_random(r, c.n() * c.k, 1e-3, 1.0),
        b: fast_random(r, c.n(), 1e-3, 1.0),
    }
}

const QKV_EPS: f32 = 1e-5;

/// `x` as the kernel forms it: `T(rms_norm(h))` with the norm, else `h` (as `check_norm`).
fn normalised<T: HalfDType>(c: &Qkv, inp: &QkvInputs<T>) -> Vec<T> {
    if c.norm {
        reference::norm::rms_norm(&inp.h, &inp.gamma, c.k, QKV_EPS)
            .iter()
            .map(|v| T::from_f32(*v as f32))
            .collect()
    } else {
        inp.h.clone()
    }
}

/// A cache of one launch: name, what the GPU left, its contents before, the reference.
type CacheCheck<'a, T> = (&'a str, &'a [T], &'a [T], &'a [f64]);

/// Compares one launch's outputs with the reference: `q_out` rows the reference wrote (not
/// NaN) within `bound` (rel L2), the others still NaN; each cache within `bound` on the
/// elements `written` marks and bit for bit its initial contents everywhere else; with
/// `all_written = Some(e)`, exactly `e` elements of each cache written.
fn assert_rope_append_outputs<T: HalfDType>(
    what: &str,
    (gq, want_q): (&[T], &[f64]),
    caches: [CacheCheck<'_, T>; 2],
    written: &[bool],
    all_written: Option<usize>,
) {
    let (mut g, mut w) = (vec![], vec![]);
    for (i, (&gv, &wv)) in gq.iter().zip(want_q).enumerate() {
        if wv.is_nan() {
            assert!(
                gv.to_f64().is_nan(),
                "{what}: q_out[{i}] written for a token without a slot"
            );
        } else {
            g.push(gv);
            w.push(wv);
        }
    }
    let err = rel_l2(&g, &w);
    assert!(err < bound::<T>(), "{what}: q_out rel L2 {err:e}");
    for (name, got, init, wc) in caches {
        let (mut g, mut w) = (vec![], vec![]);
        for (i, &wr) in written.iter().enumerate() {
            if wr {
                g.push(got[i]);
                w.push(wc[i]);
            } else {
                assert_eq!(
                    got[i].to_f64().to_bits(),
                    init[i].to_f64().to_bits(),
                    "{what}: {name} cache element {i} changed though no token names its slot"
                );
            }
        }
        let err = rel_l2(&g, &w);
        assert!(err < bound::<T>(), "{what}: {name} cache rel L2 {err:e}");
        if let Some(e) = all_written {
            assert_eq!(g.len(), e, "{what}: {name} cache: slots written");
        }
    }
}

/// Runs `linear_rope_append` once on random inputs, the caches pre-filled with ±[2, 3] and
/// `q_out` with NaN, and compares with `reference::gemv_dense::linear_rope_append`: the error
/// flag exactly (when `with_flag`; else no flag is passed); `q_out` rows of tokens with a slot
/// within `bound` (rel L2), rows of the others still NaN; both caches within `bound` on the
/// slots the reference wrote and bit for bit their initial contents everywhere else. Returns
/// the reference's flag.
fn check_rope_append<T: HalfDType>(
    gpu: &Gpu,
    c: &Qkv,
    seq: &[i32],
    pos: &[i32],
    with_flag: bool,
    r: &mut impl rand::Rng,
) -> i32 {
    let s = gpu.stream();
    let (hq, hkv, d, k, m, n) = (
        c.q_heads,
        c.kv_heads,
        c.rope.head_dim,
        c.k,
        seq.len(),
        c.n(),
    );
    let inp = qkv_inputs::<T>(c, m, r);
    let shape = c.cache_shape();
    let cn: usize = shape.iter().product();
    let kc0: Vec<T> = fast_random(r, cn, 2.0, 3.0);
    let vc0: Vec<T> = fast_random(r, cn, 2.0, 3.0);
    let dh = DeviceTensor::from_host(s, &inp.h, &[m, k]).unwrap();
    let dg = DeviceTensor::from_host(s, &inp.gamma, &[k]).unwrap();
    let dw = DeviceTensor::from_host(s, &inp.w, &[n, k]).unwrap();
    let db = DeviceTensor::from_host(s, &inp.b, &[n]).unwrap();
    let dseq = DeviceTensor::from_host(s, seq, &[m]).unwrap();
    let dpos = DeviceTensor::from_host(s, pos, &[m]).unwrap();
    let mut q_out = DeviceTensor::filled(s, &[m, hq, d], T::from_f32(f32::NAN)).unwrap();
    let mut cache = KvCache::new(
        DeviceTensor::from_host(s, &kc0, &shape).unwrap(),
        DeviceTensor::from_host(s, &vc0, &shape).unwrap(),
    )
    .unwrap();
    let mut flag = DeviceTensor::<i32>::zeros(s, &[1]).unwrap();
    let args = QkvRopeAppend {
        heads: c.heads(),
        rope: &c.rope,
        slots: TokenSlots {
            seq_ids: &dseq,
            positions: &dpos,
        },
        layout: CacheLayout::Contiguous,
    };
    let norm = c.norm.then_some(RmsNorm {
        weight: &dg,
        eps: QKV_EPS,
    });
    gemv_dense::linear_rope_append(
        s,
        &dh,
        norm,
        &dw,
        c.bias.then_some(&db),
        &args,
        &mut q_out,
        &mut cache,
        with_flag.then_some(&mut flag),
    )
    .unwrap();
    let got_flag = flag.to_host(s).unwrap()[0];
    let gq = q_out.to_host(s).unwrap();
    let (gk, gv) = (cache.k().to_host(s).unwrap(), cache.v().to_host(s).unwrap());

    let x = normalised(c, &inp);
    let (mut wk, mut wv) = (to_f64(&kc0), to_f64(&vc0));
    let want = reference::gemv_dense::linear_rope_append(
        &x,
        &inp.w,
        c.bias.then_some(&inp.b[..]),
        m,
        k,
        c.heads(),
        &c.rope,
        seq,
        pos,
        &mut wk,
        &mut wv,
        shape,
    );
    let what = format!(
        "linear_rope_append<{}> heads {hq}/{hkv} d {d} rotary {} {:?} k {k} norm {} bias {} \
         cache {shape:?} seq {seq:?} pos {pos:?}",
        T::NAME,
        c.rope.rotary_dim,
        c.rope.scaling,
        c.norm,
        c.bias
    );
    if with_flag {
        assert_eq!(got_flag, want.flag, "{what}: error flag");
    } else {
        assert_eq!(got_flag, 0, "{what}: a flag not passed was written");
    }
    let mask = written_mask(shape, seq, pos);
    let written: Vec<bool> = mask.iter().map(|v| !v.is_nan()).collect();
    assert_rope_append_outputs(
        &what,
        (&gq, &want.q),
        [("k", &gk, &kc0, &wk), ("v", &gv, &vc0, &wv)],
        &written,
        (want.flag == 0).then_some(m * hkv * d),
    );
    want.flag
}

#[test]
fn gemv_dense_rope_append_matches_reference() {
    let Some(gpu) = gpu_or_skip("gemv_dense_rope_append_matches_reference") else {
        return;
    };
    let mut r = rng("gemv_dense_rope_append");
    let base = |q_heads, kv_heads, rope, batch, max_seq| Qkv {
        q_heads,
        kv_heads,
        rope,
        k: 0,
        norm: false,
        bias: false,
        batch,
        max_seq,
    };
    let configs = [
        // MHA, full rotary
        base(4, 4, interleaved(64), 3, 40),
        // GQA 4:1, head 128, Llama 3 scaling, positions up to 1023
        base(
            8,
            2,
            RopeParams::new(128, 500_000.0)
                .with_scaling(LLAMA3)
                .with_style(RopeStyle::Interleaved),
            2,
            1024,
        ),
        // MQA, partial rotary (the last 32 elements of each head are not rotated)
        base(6, 1, interleaved(64).with_rotary_dim(32), 3, 40),
        // the smallest head: one rotated pair of 8 elements; linear scaling
        base(
            2,
            1,
            interleaved(8)
                .with_rotary_dim(2)
                .with_scaling(Scaling::Linear { factor: 4.0 }),
            4,
            9,
        ),
        // no q heads (k and v only)
        base(0, 2, interleaved(64), 3, 40),
    ];
    // (norm, bias): every dtype meets each combination in every configuration.
    let combos = [(false, false), (true, true), (true, false), (false, true)];
    for (ci, config) in configs.iter().enumerate() {
        for (i, m) in [1usize, 2, 3, 9, 16].into_iter().enumerate() {
            for (j, k) in [264usize, 1000].into_iter().enumerate() {
                let (norm, bias) = combos[(ci + i + 2 * j) % 4];
                let c = Qkv {
                    k,
                    norm,
                    bias,
                    ..*config
                };
                let (seq, pos) = decode_slots(&mut r, m, c.batch, c.max_seq);
                check_rope_append::<f16>(&gpu, &c, &seq, &pos, true, &mut r);
                let (norm, bias) = combos[(ci + i + 2 * j + 1) % 4];
                let c = Qkv { norm, bias, ..c };
                let (seq, pos) = decode_slots(&mut r, m, c.batch, c.max_seq);
                check_rope_append::<bf16>(&gpu, &c, &seq, &pos, true, &mut r);
            }
        }
    }
    // Llama-3-8B's shape (32 q heads, 8 kv heads of 128: 6144 rows, two 8-row tiles per CTA
    // on an H100), short k to keep the f64 reference quick.
    let big = Qkv {
        k: 264,
        ..base(
            32,
            8,
            RopeParams::new(128, 500_000.0)
                .with_scaling(LLAMA3)
                .with_style(RopeStyle::Interleaved),
            3,
            40,
        )
    };
    for (m, norm, bias) in [(1, true, false), (16, false, true), (7, true, true)] {
        let c = Qkv { norm, bias, ..big };
        let (seq, pos) = decode_slots(&mut r, m, c.batch, c.max_seq);
        check_rope_append::<f16>(&gpu, &c, &seq, &pos, true, &mut r);
        check_rope_append::<bf16>(&gpu, &c, &seq, &pos, true, &mut r);
    }
}

#[test]
fn gemv_dense_rope_append_invalid_slots_write_nothing_and_flag() {
    let Some(gpu) = gpu_or_skip("gemv_dense_rope_append_invalid_slots_write_nothing_and_flag")
    else {
        return;
    };
    let mut r = rng("gemv_dense_rope_append_invalid");
    // batch 2, max_seq 16
    let c = Qkv {
        q_heads: 4,
        kv_heads: 2,
        rope: interleaved(64),
        k: 264,
        norm: true,
        bias: true,
        batch: 2,
        max_seq: 16,
    };
    let cases: Vec<(Vec<i32>, Vec<i32>, i32)> = vec![
        // seq = batch, position = max_seq, position = -1 between valid tokens at 0 and max_seq - 1
        (
            vec![0, 2, 1, 0, 1],
            vec![0, 3, 16, -1, 15],
            ERR_SEQUENCE | ERR_POSITION,
        ),
        (vec![1, 2], vec![0, 0], ERR_SEQUENCE),
        (vec![-1, 0], vec![5, 5], ERR_SEQUENCE),
        (vec![0, 1, 1], vec![16, 7, -1], ERR_POSITION),
        // both out of range: the sequence bit only (as kv_cache::append)
        (vec![2, 0], vec![16, 2], ERR_SEQUENCE),
        // a single invalid token: nothing at all is written
        (vec![0], vec![i32::MAX], ERR_POSITION),
        (vec![i32::MIN], vec![0], ERR_SEQUENCE),
        // 16 tokens, invalid ones among the first 8 and the last 8 (both token-row halves)
        (
            vec![0, 0, 5, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1],
            vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, -7, 14, 15],
            ERR_SEQUENCE | ERR_POSITION,
        ),
    ];
    for (seq, pos, bits) in &cases {
        for (norm, bias) in [(true, true), (false, false)] {
            let c = Qkv { norm, bias, ..c };
            assert_eq!(
                check_rope_append::<f16>(&gpu, &c, seq, pos, true, &mut r),
                *bits,
                "seq {seq:?} pos {pos:?}"
            );
            assert_eq!(
                check_rope_append::<bf16>(&gpu, &c, seq, pos, true, &mut r),
                *bits,
                "seq {seq:?} pos {pos:?}"
            );
        }
    }
    // Without a flag the invalid tokens are still skipped.
    let (seq, pos, _) = &cases[0];
    check_rope_append::<f16>(&gpu, &c, seq, pos, false, &mut r);

    // kv_cache::check_error_flag decodes what the launch set.
    let s = gpu.stream();
    let (m, k, d) = (2usize, 64usize, 64usize);
    let heads = QkvSplit {
        q_heads: 1,
        kv_heads: 1,
    };
    let rope = interleaved(d);
    let h = DeviceTensor::<f16>::zeros(s, &[m, k]).unwrap();
    let w = DeviceTensor::<f16>::zeros(s, &[3 * d, k]).unwrap();
    let seq = DeviceTensor::from_host(s, &[0i32, 0], &[m]).unwrap();
    let pos = DeviceTensor::from_host(s, &[0i32, 4], &[m]).unwrap();
    let mut q = DeviceTensor::<f16>::zeros(s, &[m, 1, d]).unwrap();
    let mut cache = KvCache::<f16>::zeros(s, [1, 1, 4, d]).unwrap();
    let mut flag = DeviceTensor::<i32>::zeros(s, &[1]).unwrap();
    let args = QkvRopeAppend {
        heads,
        rope: &rope,
        slots: TokenSlots {
            seq_ids: &seq,
            positions: &pos,
        },
        layout: CacheLayout::Contiguous,
    };
    gemv_dense::linear_rope_append(
        s,
        &h,
        None,
        &w,
        None,
        &args,
        &mut q,
        &mut cache,
        Some(&mut flag),
    )
    .unwrap();
    match kv_cache::check_error_flag(s, &flag) {
        Err(Error::DeviceCheck { reason, .. }) => {
            assert!(
                reason.contains("position") && !reason.contains("sequence"),
                "{reason}"
            )
        }
        other => panic!("expected a device-check error, got {other:?}"),
    }
}

#[test]
fn gemv_dense_rope_append_errors_name_the_argument() {
    let Some(gpu) = gpu_or_skip("gemv_dense_rope_append_errors_name_the_argument") else {
        return;
    };
    let s = gpu.stream();
    let z = |shape: &[usize]| DeviceTensor::<f16>::zeros(s, shape).unwrap();
    let zi = |shape: &[usize]| DeviceTensor::<i32>::zeros(s, shape).unwrap();
    let (m, k, hq, hkv, d) = (2usize, 64usize, 4usize, 2usize, 64usize);
    let n = (hq + 2 * hkv) * d;
    let heads = QkvSplit {
        q_heads: hq,
        kv_heads: hkv,
    };
    let rope = interleaved(d);
    let (h, w, b, g) = (z(&[m, k]), z(&[n, k]), z(&[n]), z(&[k]));
    let (seq, pos) = (zi(&[m]), zi(&[m]));
    let mut q = z(&[m, hq, d]);
    let mut cache = KvCache::<f16>::zeros(s, [2, hkv, 16, d]).unwrap();
    let slots = TokenSlots {
        seq_ids: &seq,
        positions: &pos,
    };
    fn args<'a>(heads: QkvSplit, rope: &'a RopeParams, slots: TokenSlots<'a>) -> QkvRopeAppend<'a> {
        QkvRopeAppend {
            heads,
            rope,
            slots,
            layout: CacheLayout::Contiguous,
        }
    }
    let good = args(heads, &rope, slots);
    let norm = RmsNorm {
        weight: &g,
        eps: 1e-5,
    };
    // The argument an error names (any of the three argument-error kinds).
    let arg = |res: fl_kernels::Result<()>| match res {
        Err(Error::Shape { arg, .. })
        | Err(Error::InvalidArgument { arg, .. })
        | Err(Error::TooLarge { arg, .. }) => arg,
        other => panic!("expected an argument error, got {other:?}"),
    };
    // the good calls work (with and without norm, bias and flag)
    let mut flag = zi(&[1]);
    gemv_dense::linear_rope_append(s, &h, None, &w, None, &good, &mut q, &mut cache, None).unwrap();
    gemv_dense::linear_rope_append(
        s,
        &h,
        Some(norm),
        &w,
        Some(&b),
        &good,
        &mut q,
        &mut cache,
        Some(&mut flag),
    )
    .unwrap();
    kv_cache::check_error_flag(s, &flag).unwrap();

    // rope: rotate-half pairing; head_dim not a multiple of 8 (12, valid for RopeParams);
    // invalid params name their field.
    let neox = RopeParams::new(d, 10_000.0);
    assert_eq!(
        arg(gemv_dense::linear_rope_append(
            s,
            &h,
            None,
            &w,
            None,
            &args(heads, &neox, slots),
            &mut q,
            &mut cache,
            None
        )),
        "rope"
    );
    let d12 = interleaved(12);
    let (w12, mut q12) = (z(&[(hq + 2 * hkv) * 12, k]), z(&[m, hq, 12]));
    let mut cache12 = KvCache::<f16>::zeros(s, [2, hkv, 16, 12]).unwrap();
    assert_eq!(
        arg(gemv_dense::linear_rope_append(
            s,
            &h,
            None,
            &w12,
            None,
            &args(heads, &d12, slots),
            &mut q12,
            &mut cache12,
            None
        )),
        "rope"
    );
    for (bad, name) in [
        (rope.with_rotary_dim(3), "rotary_dim"),
        (rope.with_rotary_dim(2 * d), "rotary_dim"),
        (RopeParams { theta: 0.0, ..rope }, "theta"),
    ] {
        assert_eq!(
            arg(gemv_dense::linear_rope_append(
                s,
                &h,
                None,
                &w,
                None,
                &args(heads, &bad, slots),
                &mut q,
                &mut cache,
                None
            )),
            name
        );
    }
    // heads: no kv head; a row count that overflows.
    for bad in [
        QkvSplit {
            q_heads: hq + 2 * hkv,
            kv_heads: 0,
        },
        QkvSplit {
            q_heads: usize::MAX / 4,
            kv_heads: 1,
        },
    ] {
        assert_eq!(
            arg(gemv_dense::linear_rope_append(
                s,
                &h,
                None,
                &w,
                None,
                &args(bad, &rope, slots),
                &mut q,
                &mut cache,
                None
            )),
            "heads"
        );
    }
    // w: rows not (q_heads + 2 kv_heads) * head_dim (one head too many or too few), k of x.
    for bad in [z(&[n + d, k]), z(&[n - d, k]), z(&[n, k + 8]), z(&[n * k])] {
        assert_eq!(
            arg(gemv_dense::linear_rope_append(
                s, &h, None, &bad, None, &good, &mut q, &mut cache, None
            )),
            "w"
        );
    }
    for bad in [z(&[n - 1]), z(&[1, n])] {
        assert_eq!(
            arg(gemv_dense::linear_rope_append(
                s,
                &h,
                None,
                &w,
                Some(&bad),
                &good,
                &mut q,
                &mut cache,
                None
            )),
            "bias"
        );
    }
    let g_bad = z(&[k + 8]);
    for (bad, name) in [
        (
            RmsNorm {
                weight: &g_bad,
                eps: 1e-5,
            },
            "norm.weight",
        ),
        (
            RmsNorm {
                weight: &g,
                eps: 0.0,
            },
            "eps",
        ),
    ] {
        assert_eq!(
            arg(gemv_dense::linear_rope_append(
                s,
                &h,
                Some(bad),
                &w,
                None,
                &good,
                &mut q,
                &mut cache,
                None
            )),
            name
        );
    }
    for bad in [
        z(&[m, hq + 1, d]),
        z(&[m, hq, d + 8]),
        z(&[m + 1, hq, d]),
        z(&[m, hq * d]),
    ] {
        let mut bad = bad;
        assert_eq!(
            arg(gemv_dense::linear_rope_append(
                s, &h, None, &w, None, &good, &mut bad, &mut cache, None
            )),
            "q_out"
        );
    }
    for shape in [[2, hkv + 1, 16, d], [2, hkv, 16, 32], [2, hkv - 1, 16, d]] {
        let mut bad = KvCache::<f16>::zeros(s, shape).unwrap();
        assert_eq!(
            arg(gemv_dense::linear_rope_append(
                s, &h, None, &w, None, &good, &mut q, &mut bad, None
            )),
            "cache"
        );
    }
    // a cache with no slot while there are tokens
    for shape in [[0, hkv, 16, d], [2, hkv, 0, d]] {
        let mut empty = KvCache::<f16>::zeros(s, shape).unwrap();
        assert_eq!(
            arg(gemv_dense::linear_rope_append(
                s, &h, None, &w, None, &good, &mut q, &mut empty, None
            )),
            "cache"
        );
    }
    let (short, long) = (zi(&[m - 1]), zi(&[m + 1]));
    for (bad_slots, name) in [
        (
            TokenSlots {
                seq_ids: &short,
                positions: &pos,
            },
            "seq_ids",
        ),
        (
            TokenSlots {
                seq_ids: &long,
                positions: &pos,
            },
            "seq_ids",
        ),
        (
            TokenSlots {
                seq_ids: &seq,
                positions: &short,
            },
            "positions",
        ),
    ] {
        assert_eq!(
            arg(gemv_dense::linear_rope_append(
                s,
                &h,
                None,
                &w,
                None,
                &args(heads, &rope, bad_slots),
                &mut q,
                &mut cache,
                None
            )),
            name
        );
    }
    assert_eq!(
        arg(gemv_dense::linear_rope_append(
            s,
            &h,
            None,
            &w,
            None,
            &good,
            &mut q,
            &mut cache,
            Some(&mut zi(&[2]))
        )),
        "err_flag"
    );
    // x: m > MAX_M (TooLarge), k not a multiple of 8, not 2-D.
    let (h17, s17, p17, mut q17) = (
        z(&[MAX_M + 1, k]),
        zi(&[MAX_M + 1]),
        zi(&[MAX_M + 1]),
        z(&[MAX_M + 1, hq, d]),
    );
    let r17 = gemv_dense::linear_rope_append(
        s,
        &h17,
        None,
        &w,
        None,
        &args(
            heads,
            &rope,
            TokenSlots {
                seq_ids: &s17,
                positions: &p17,
            },
        ),
        &mut q17,
        &mut cache,
        None,
    );
    assert!(
        matches!(r17, Err(Error::TooLarge { arg: "x", .. })),
        "{r17:?}"
    );
    let (h12, w12) = (z(&[m, 12]), z(&[n, 12]));
    let r12 =
        gemv_dense::linear_rope_append(s, &h12, None, &w12, None, &good, &mut q, &mut cache, None);
    assert!(
        matches!(r12, Err(Error::InvalidArgument { arg: "x", .. })),
        "{r12:?}"
    );
    assert_eq!(
        arg(gemv_dense::linear_rope_append(
            s,
            &z(&[m * k]),
            None,
            &w,
            None,
            &good,
            &mut q,
            &mut cache,
            None
        )),
        "x"
    );
    // m = 0: nothing to do (even with a cache that holds no slot)
    let (h0, s0, p0, mut q0) = (z(&[0, k]), zi(&[0]), zi(&[0]), z(&[0, hq, d]));
    let mut empty = KvCache::<f16>::zeros(s, [0, hkv, 16, d]).unwrap();
    gemv_dense::linear_rope_append(
        s,
        &h0,
        None,
        &w,
        None,
        &args(
            heads,
            &rope,
            TokenSlots {
                seq_ids: &s0,
                positions: &p0,
            },
        ),
        &mut q0,
        &mut empty,
        None,
    )
    .unwrap();
    s.synchronize().unwrap();
}

#[test]
fn gemv_dense_rope_append_launcher_rejects_bad_arguments() {
    let Some(gpu) = gpu_or_skip("gemv_dense_rope_append_launcher_rejects_bad_arguments") else {
        return;
    };
    use fl_kernels::cudarc::driver::{DevicePtr, DevicePtrMut};
    use fl_kernels_sys::{fl_dtype, fl_rope_params, FL_ERR_MISALIGNED};
    let s = gpu.stream();
    let (m, k, d) = (1usize, 64usize, 64usize);
    let n = 3 * d; // one q, one k and one v head
    let hbuf = DeviceTensor::<f16>::zeros(s, &[k + 8]).unwrap();
    let wbuf = DeviceTensor::<f16>::zeros(s, &[n * k + 8]).unwrap();
    let sbuf = DeviceTensor::<i32>::zeros(s, &[m]).unwrap();
    let mut qbuf = DeviceTensor::<f16>::zeros(s, &[d + 8]).unwrap();
    let mut kbuf = DeviceTensor::<f16>::zeros(s, &[4 * d + 8]).unwrap();
    let mut vbuf = DeviceTensor::<f16>::zeros(s, &[4 * d + 8]).unwrap();
    let (ph, _g1) = hbuf.as_slice().device_ptr(s);
    let (pw, _g2) = wbuf.as_slice().device_ptr(s);
    let (ps, _g3) = sbuf.as_slice().device_ptr(s);
    let (pq, _g4) = qbuf.as_slice_mut().device_ptr_mut(s);
    let (pk, _g5) = kbuf.as_slice_mut().device_ptr_mut(s);
    let (pv, _g6) = vbuf.as_slice_mut().device_ptr_mut(s);
    let params = |head_dim: i32, rotary_dim: i32, interleaved: i32| {
        let mut p = fl_rope_params {
            head_dim,
            rotary_dim,
            interleaved,
            reserved: 0,
            inv_freq: [0.0; 256],
        };
        for (i, f) in p
            .inv_freq
            .iter_mut()
            .take(rotary_dim.max(0) as usize / 2)
            .enumerate()
        {
            *f = 10_000f32.powf(-2.0 * i as f32 / rotary_dim as f32);
        }
        p
    };
    let ok = params(d as i32, d as i32, 1);
    // (dtype, h, q_out, k_cache, m, kv_heads, batch, params)
    let call = |dt: fl_dtype,
                h: u64,
                q: u64,
                kc: u64,
                m: i64,
                kvh: i32,
                batch: i32,
                p: &fl_rope_params| {
        // SAFETY: the buffers hold more than any accepted call reads or writes: h one row of
        // k = 64 (+ 8), w 3 heads of 64 rows (+ 8), one seq/pos i32 (0, 0), q_out one head,
        // each cache [1, 1, 4, 64] (+ 8); calls with more tokens or heads are refused first.
        unsafe {
            fl_kernels_sys::fl_gemv_dense_rope_append(
                dt,
                h as _,
                std::ptr::null(),
                0.0,
                pw as _,
                std::ptr::null(),
                m,
                k as i64,
                1,
                kvh,
                p,
                ps as _,
                ps as _,
                q as _,
                kc as _,
                pv as _,
                batch,
                4,
                std::ptr::null_mut(),
                s.cu_stream() as _,
            )
        }
    };
    let f16t = fl_dtype::FL_DTYPE_F16;
    assert_eq!(call(f16t, ph, pq, pk, 1, 1, 1, &ok), 0);
    assert_eq!(call(f16t, ph, pq, pk, 0, 1, 1, &ok), 0, "m = 0");
    assert!(
        call(f16t, ph, pq, pk, 1, 1, 1, &params(64, 64, 0)) < 0,
        "rotate-half"
    );
    assert!(
        call(f16t, ph, pq, pk, 1, 1, 1, &params(12, 12, 1)) < 0,
        "head_dim 12"
    );
    assert!(
        call(f16t, ph, pq, pk, 1, 1, 1, &params(64, 3, 1)) < 0,
        "odd rotary_dim"
    );
    assert!(
        call(f16t, ph, pq, pk, 1, 1, 1, &params(64, 66, 1)) < 0,
        "rotary_dim > head_dim"
    );
    assert!(call(f16t, ph, pq, pk, 1, 0, 1, &ok) < 0, "kv_heads 0");
    assert!(call(f16t, ph, pq, pk, 1, 1, 0, &ok) < 0, "batch 0");
    assert!(call(f16t, ph, pq, pk, 17, 1, 1, &ok) < 0, "m > 16");
    assert!(call(f16t, ph, 0, pk, 1, 1, 1, &ok) < 0, "null q_out");
    assert!(call(f16t, ph, pq, 0, 1, 1, 1, &ok) < 0, "null k_cache");
    assert!(
        call(fl_dtype::FL_DTYPE_F32, ph, pq, pk, 1, 1, 1, &ok) < 0,
        "f32"
    );
    assert_eq!(call(f16t, ph + 2, pq, pk, 1, 1, 1, &ok), FL_ERR_MISALIGNED);
    assert_eq!(call(f16t, ph, pq + 1, pk, 1, 1, 1, &ok), FL_ERR_MISALIGNED);
    assert_eq!(call(f16t, ph, pq, pk + 1, 1, 1, 1, &ok), FL_ERR_MISALIGNED);
    s.synchronize().unwrap();
}

/// The fused launch on a rotate-half checkpoint whose q and k rows (and bias) were permuted
/// with `rope::rotate_half_to_interleaved_rows`, run with the interleaved pairing, against the
/// unfused `(rms_norm_)linear` + `kv_cache::rope_append` with the rotate-half params on the
/// original weight. After un-permuting each q head and each written k row the values agree
/// within `bound` (the unfused path rounds qkv before rotating: one rounding of T apart), v
/// too, and cache slots no token names are untouched by both.
#[allow(clippy::too_many_arguments)]
fn check_unfused_equivalence<T: HalfDType>(
    gpu: &Gpu,
    q_heads: usize,
    kv_heads: usize,
    neox: RopeParams,
    m: usize,
    k: usize,
    norm: bool,
    bias: bool,
    r: &mut impl rand::Rng,
) {
    assert_eq!(neox.style, RopeStyle::NeoX);
    let s = gpu.stream();
    let (d, rot) = (neox.head_dim, neox.rotary_dim);
    let inter = RopeParams {
        style: RopeStyle::Interleaved,
        ..neox
    };
    let c = Qkv {
        q_heads,
        kv_heads,
        rope: inter,
        k,
        norm,
        bias,
        batch: 3,
        max_seq: 40,
    };
    let n = c.n();
    let inp = qkv_inputs::<T>(&c, m, r);
    let shape = c.cache_shape();
    let cn: usize = shape.iter().product();
    let kc0: Vec<T> = fast_random(r, cn, 2.0, 3.0);
    let vc0: Vec<T> = fast_random(r, cn, 2.0, 3.0);
    let (seq, pos) = decode_slots(r, m, c.batch, c.max_seq);

    // Row order of the permuted weight: q heads, then k heads permuted; v rows kept.
    let pq = fl_kernels::rope::rotate_half_to_interleaved_rows(q_heads, d, rot).unwrap();
    let pk = fl_kernels::rope::rotate_half_to_interleaved_rows(kv_heads, d, rot).unwrap();
    let rows: Vec<usize> = pq
        .iter()
        .copied()
        .chain(pk.iter().map(|&i| q_heads * d + i))
        .chain((q_heads + kv_heads) * d..n)
        .collect();
    assert_eq!(rows.len(), n);
    let wp: Vec<T> = rows
        .iter()
        .flat_map(|&i| inp.w[i * k..(i + 1) * k].to_vec())
        .collect();
    let bp: Vec<T> = rows.iter().map(|&i| inp.b[i]).collect();

    let nan = T::from_f32(f32::NAN);
    let dh = DeviceTensor::from_host(s, &inp.h, &[m, k]).unwrap();
    let dg = DeviceTensor::from_host(s, &inp.gamma, &[k]).unwrap();
    let dseq = DeviceTensor::from_host(s, &seq, &[m]).unwrap();
    let dpos = DeviceTensor::from_host(s, &pos, &[m]).unwrap();
    let slots = TokenSlots {
        seq_ids: &dseq,
        positions: &dpos,
    };
    let new_cache = || {
        KvCache::new(
            DeviceTensor::from_host(s, &kc0, &shape).unwrap(),
            DeviceTensor::from_host(s, &vc0, &shape).unwrap(),
        )
        .unwrap()
    };
    let rms = norm.then_some(RmsNorm {
        weight: &dg,
        eps: QKV_EPS,
    });

    // fused, permuted weight, interleaved pairing
    let dwp = DeviceTensor::from_host(s, &wp, &[n, k]).unwrap();
    let dbp = DeviceTensor::from_host(s, &bp, &[n]).unwrap();
    let mut fq = DeviceTensor::filled(s, &[m, q_heads, d], nan).unwrap();
    let mut fcache = new_cache();
    let args = QkvRopeAppend {
        heads: c.heads(),
        rope: &inter,
        slots,
        layout: CacheLayout::Contiguous,
    };
    gemv_dense::linear_rope_append(
        s,
        &dh,
        rms,
        &dwp,
        bias.then_some(&dbp),
        &args,
        &mut fq,
        &mut fcache,
        None,
    )
    .unwrap();

    // unfused, original weight, rotate-half pairing
    let dw = DeviceTensor::from_host(s, &inp.w, &[n, k]).unwrap();
    let db = DeviceTensor::from_host(s, &inp.b, &[n]).unwrap();
    let mut qkv = DeviceTensor::filled(s, &[m, n], nan).unwrap();
    match rms {
        Some(nm) => gemv_dense::rms_norm_linear(s, &dh, nm, &dw, bias.then_some(&db), &mut qkv),
        None => gemv_dense::linear(s, &dh, &dw, bias.then_some(&db), &mut qkv),
    }
    .unwrap();
    let mut uq = DeviceTensor::filled(s, &[m, q_heads, d], nan).unwrap();
    let mut ucache = new_cache();
    let uargs = kv_cache::RopeAppend {
        qkv: &qkv,
        heads: c.heads(),
        slots,
        rope: &neox,
        layout: kv_cache::CacheLayout::Contiguous,
    };
    kv_cache::rope_append(s, &uargs, &mut uq, None, &mut ucache, None).unwrap();

    let what = format!(
        "<{}> heads {q_heads}/{kv_heads} d {d} rotary {rot} {:?} m {m} k {k} norm {norm} \
         bias {bias} seq {seq:?} pos {pos:?}",
        T::NAME,
        neox.scaling
    );
    // Element i of a permuted head is element head_perm[i] of the original one.
    let head_perm = fl_kernels::rope::rotate_half_to_interleaved_rows(1, d, rot).unwrap();
    let unpermute = |rows: &[T]| -> Vec<T> {
        let mut out = rows.to_vec();
        for (o, i) in out.chunks_mut(d).zip(rows.chunks(d)) {
            for (e, &from) in head_perm.iter().enumerate() {
                o[from] = i[e];
            }
        }
        out
    };
    let fq = unpermute(&fq.to_host(s).unwrap());
    let uq = uq.to_host(s).unwrap();
    let err = rel_l2(&fq, &to_f64(&uq));
    assert!(
        err < bound::<T>(),
        "{what}: q rel L2 {err:e} vs the unfused path"
    );

    let mask = written_mask(shape, &seq, &pos);
    let (fk, fv) = (
        fcache.k().to_host(s).unwrap(),
        fcache.v().to_host(s).unwrap(),
    );
    let (uk, uv) = (
        ucache.k().to_host(s).unwrap(),
        ucache.v().to_host(s).unwrap(),
    );
    for (name, f, u, init, permuted) in [("k", &fk, &uk, &kc0, true), ("v", &fv, &uv, &vc0, false)]
    {
        let (mut gf, mut gu) = (vec![], vec![]);
        for row in 0..cn / d {
            let (fr, ur) = (&f[row * d..][..d], &u[row * d..][..d]);
            if mask[row * d].is_nan() {
                let ir = to_f64(&init[row * d..][..d]);
                assert!(
                    to_f64(fr) == ir && to_f64(ur) == ir,
                    "{what}: {name} cache row {row} changed though no token names it"
                );
            } else {
                gf.extend(if permuted { unpermute(fr) } else { fr.to_vec() });
                gu.extend_from_slice(ur);
            }
        }
        assert_eq!(gf.len(), m * kv_heads * d, "{what}: {name} rows written");
        let err = rel_l2(&gf, &to_f64(&gu));
        assert!(
            err < bound::<T>(),
            "{what}: {name} cache rel L2 {err:e} vs the unfused path"
        );
    }
}

#[test]
fn gemv_dense_rope_append_on_permuted_rotate_half_weights_matches_unfused() {
    let Some(gpu) =
        gpu_or_skip("gemv_dense_rope_append_on_permuted_rotate_half_weights_matches_unfused")
    else {
        return;
    };
    let mut r = rng("gemv_dense_rope_append_unfused");
    let configs = [
        (4, 2, RopeParams::new(64, 10_000.0)),
        (8, 2, RopeParams::new(128, 500_000.0).with_scaling(LLAMA3)),
        (6, 1, RopeParams::new(64, 10_000.0).with_rotary_dim(32)),
        (
            3,
            3,
            RopeParams::new(64, 1_000_000.0)
                .with_rotary_dim(16)
                .with_scaling(Scaling::Linear { factor: 4.0 }),
        ),
    ];
    for (ci, &(hq, hkv, neox)) in configs.iter().enumerate() {
        for (i, m) in [1usize, 5, 16].into_iter().enumerate() {
            let (norm, bias) = ((ci + i) % 2 == 0, (ci + i) % 3 != 1);
            check_unfused_equivalence::<f16>(&gpu, hq, hkv, neox, m, 264, norm, bias, &mut r);
            check_unfused_equivalence::<bf16>(&gpu, hq, hkv, neox, m, 1000, !norm, !bias, &mut r);
        }
    }
}

// ---- linear_rope_append into a paged cache ----

/// A paged cache `[num_blocks, kv_heads, block_size, head_dim]` and its block table
/// `[batch, max_blocks]` (row-major).
#[derive(Clone, Debug)]
struct Paged {
    num_blocks: usize,
    block_size: usize,
    max_blocks: usize,
    table: Vec<i32>,
}

impl Paged {
    /// `batch` rows of `max_blocks` distinct blocks drawn from a shuffled pool of `num_blocks`
    /// (`>= batch * max_blocks`; the rest stay unowned), as a block manager hands them out.
    fn shuffled(
        r: &mut impl rand::Rng,
        batch: usize,
        max_blocks: usize,
        num_blocks: usize,
        block_size: usize,
    ) -> Paged {
        use rand::seq::SliceRandom;
        assert!(
            num_blocks >= batch * max_blocks,
            "Paged::shuffled: pool too small"
        );
        let mut pool: Vec<i32> = (0..num_blocks as i32).collect();
        pool.shuffle(r);
        pool.truncate(batch * max_blocks);
        Paged {
            num_blocks,
            block_size,
            max_blocks,
            table: pool,
        }
    }
    fn batch(&self) -> usize {
        self.table.len() / self.max_blocks
    }
    fn cache_shape(&self, c: &Qkv) -> [usize; 4] {
        [
            self.num_blocks,
            c.kv_heads,
            self.block_size,
            c.rope.head_dim,
        ]
    }
}

/// `m` distinct (sequence, position) pairs that have a slot in `pg`'s table.
fn paged_slots(r: &mut impl rand::Rng, m: usize, pg: &Paged) -> (Vec<i32>, Vec<i32>) {
    let span = (pg.max_blocks * pg.block_size) as i32;
    assert!(
        m <= pg.batch() * span as usize,
        "paged_slots: too few slots"
    );
    let mut seen = std::collections::HashSet::new();
    let (mut seq, mut pos) = (vec![], vec![]);
    while seq.len() < m {
        let s = r.random_range(0..pg.batch() as i32);
        let p = r.random_range(0..span);
        if seen.insert((s, p)) {
            seq.push(s);
            pos.push(p);
        }
    }
    (seq, pos)
}

/// `check_rope_append` into a paged cache: caches pre-filled with ±[2, 3], `q_out` with NaN,
/// always with an error flag. The expected values are the contiguous reference's (run on a
/// scratch cache with token t in sequence t), scattered through the block table by
/// `reference::kv_cache::paged_slot`, which also gives the expected flag; tokens without a
/// slot must write nothing. Returns the expected flag.
fn check_rope_append_paged<T: HalfDType>(
    gpu: &Gpu,
    c: &Qkv,
    pg: &Paged,
    seq: &[i32],
    pos: &[i32],
    r: &mut impl rand::Rng,
) -> i32 {
    let s = gpu.stream();
    let (hq, hkv, d, k, m, n) = (
        c.q_heads,
        c.kv_heads,
        c.rope.head_dim,
        c.k,
        seq.len(),
        c.n(),
    );
    let inp = qkv_inputs::<T>(c, m, r);
    let shape = pg.cache_shape(c);
    let cn: usize = shape.iter().product();
    let kc0: Vec<T> = fast_random(r, cn, 2.0, 3.0);
    let vc0: Vec<T> = fast_random(r, cn, 2.0, 3.0);
    let dh = DeviceTensor::from_host(s, &inp.h, &[m, k]).unwrap();
    let dg = DeviceTensor::from_host(s, &inp.gamma, &[k]).unwrap();
    let dw = DeviceTensor::from_host(s, &inp.w, &[n, k]).unwrap();
    let db = DeviceTensor::from_host(s, &inp.b, &[n]).unwrap();
    let dseq = DeviceTensor::from_host(s, seq, &[m]).unwrap();
    let dpos = DeviceTensor::from_host(s, pos, &[m]).unwrap();
    let dtable = DeviceTensor::from_host(s, &pg.table, &[pg.batch(), pg.max_blocks]).unwrap();
    let mut q_out = DeviceTensor::filled(s, &[m, hq, d], T::from_f32(f32::NAN)).unwrap();
    let mut cache = KvCache::new(
        DeviceTensor::from_host(s, &kc0, &shape).unwrap(),
        DeviceTensor::from_host(s, &vc0, &shape).unwrap(),
    )
    .unwrap();
    let mut flag = DeviceTensor::<i32>::zeros(s, &[1]).unwrap();
    let args = QkvRopeAppend {
        heads: c.heads(),
        rope: &c.rope,
        slots: TokenSlots {
            seq_ids: &dseq,
            positions: &dpos,
        },
        layout: CacheLayout::Paged {
            block_table: &dtable,
        },
    };
    let norm = c.norm.then_some(RmsNorm {
        weight: &dg,
        eps: QKV_EPS,
    });
    gemv_dense::linear_rope_append(
        s,
        &dh,
        norm,
        &dw,
        c.bias.then_some(&db),
        &args,
        &mut q_out,
        &mut cache,
        Some(&mut flag),
    )
    .unwrap();
    let got_flag = flag.to_host(s).unwrap()[0];
    let gq = q_out.to_host(s).unwrap();
    let (gk, gv) = (cache.k().to_host(s).unwrap(), cache.v().to_host(s).unwrap());

    // The paged slot of each token (or the error bit it sets).
    let slots: Vec<Result<usize, i32>> = (0..m)
        .map(|t| reference::kv_cache::paged_slot(shape, &pg.table, pg.max_blocks, seq[t], pos[t]))
        .collect();
    // The rows of every token with a slot from the contiguous reference: token t at
    // (t, positions[t]) of a scratch cache [m, kv_heads, largest such position + 1, d]; the
    // others get position -1 there (NaN rows).
    let ref_pos: Vec<i32> = (0..m)
        .map(|t| if slots[t].is_ok() { pos[t] } else { -1 })
        .collect();
    let span = ref_pos.iter().copied().max().unwrap_or(0).max(0) as usize + 1;
    let scratch = [m, hkv, span, d];
    let (mut sk, mut sv) = (vec![0.0; m * hkv * span * d], vec![0.0; m * hkv * span * d]);
    let own: Vec<i32> = (0..m as i32).collect();
    let rows = reference::gemv_dense::linear_rope_append(
        &normalised(c, &inp),
        &inp.w,
        c.bias.then_some(&inp.b[..]),
        m,
        k,
        c.heads(),
        &c.rope,
        &own,
        &ref_pos,
        &mut sk,
        &mut sv,
        scratch,
    );
    // Scattered through the table; tokens without a paged slot write nothing, not even q.
    let (mut wk, mut wv) = (to_f64(&kc0), to_f64(&vc0));
    let mut want_q = rows.q.clone();
    let mut written = vec![false; cn];
    let mut want_flag = 0;
    for (t, slot) in slots.iter().enumerate() {
        match *slot {
            Err(bit) => {
                want_flag |= bit;
                want_q[t * hq * d..][..hq * d].fill(f64::NAN);
            }
            Ok(base) => {
                for h in 0..hkv {
                    let (at, from) = (base + h * pg.block_size * d, (t * hkv + h) * d);
                    wk[at..at + d].copy_from_slice(&rows.k[from..from + d]);
                    wv[at..at + d].copy_from_slice(&rows.v[from..from + d]);
                    written[at..at + d].fill(true);
                }
            }
        }
    }
    let what = format!(
        "linear_rope_append paged<{}> heads {hq}/{hkv} d {d} rotary {} {:?} k {k} norm {} \
         bias {} cache {shape:?} table {:?} seq {seq:?} pos {pos:?}",
        T::NAME,
        c.rope.rotary_dim,
        c.rope.scaling,
        c.norm,
        c.bias,
        pg.table
    );
    assert_eq!(got_flag, want_flag, "{what}: error flag");
    assert_rope_append_outputs(
        &what,
        (&gq, &want_q),
        [("k", &gk, &kc0, &wk), ("v", &gv, &vc0, &wv)],
        &written,
        (want_flag == 0).then_some(m * hkv * d),
    );
    want_flag
}

#[test]
fn gemv_dense_rope_append_paged_matches_reference() {
    let Some(gpu) = gpu_or_skip("gemv_dense_rope_append_paged_matches_reference") else {
        return;
    };
    let mut r = rng("gemv_dense_rope_append_paged");
    let base = |q_heads, kv_heads, rope| Qkv {
        q_heads,
        kv_heads,
        rope,
        k: 264,
        norm: false,
        bias: false,
        batch: 0,
        max_seq: 0,
    };
    let configs = [
        // MHA, full rotary
        base(4, 4, interleaved(64)),
        // GQA 4:1, head 128, Llama 3 scaling
        base(
            8,
            2,
            RopeParams::new(128, 500_000.0)
                .with_scaling(LLAMA3)
                .with_style(RopeStyle::Interleaved),
        ),
        // MQA, partial rotary; no q heads
        base(6, 1, interleaved(64).with_rotary_dim(32)),
        base(0, 2, interleaved(64)),
    ];
    // (batch, max_blocks, num_blocks, block_size): odd pools with unowned blocks left over.
    let geometries = [(3, 3, 13, 16), (2, 7, 17, 5), (4, 5, 23, 1)];
    let combos = [(false, false), (true, true), (true, false), (false, true)];
    for (ci, config) in configs.iter().enumerate() {
        for (gi, &(batch, max_blocks, num_blocks, block_size)) in geometries.iter().enumerate() {
            for (i, m) in [1usize, 3, 16].into_iter().enumerate() {
                let (norm, bias) = combos[(ci + gi + i) % 4];
                let c = Qkv {
                    norm,
                    bias,
                    ..*config
                };
                let pg = Paged::shuffled(&mut r, batch, max_blocks, num_blocks, block_size);
                let (seq, pos) = paged_slots(&mut r, m, &pg);
                check_rope_append_paged::<f16>(&gpu, &c, &pg, &seq, &pos, &mut r);
                let (norm, bias) = combos[(ci + gi + i + 1) % 4];
                let c = Qkv { norm, bias, ..c };
                let pg = Paged::shuffled(&mut r, batch, max_blocks, num_blocks, block_size);
                let (seq, pos) = paged_slots(&mut r, m, &pg);
                check_rope_append_paged::<bf16>(&gpu, &c, &pg, &seq, &pos, &mut r);
            }
        }
    }
    // Llama-3-8B's heads (two 8-row tiles per CTA on an H100), blocks of 16, one padding row
    // (position -1) among the decode tokens.
    let big = base(
        32,
        8,
        RopeParams::new(128, 500_000.0)
            .with_scaling(LLAMA3)
            .with_style(RopeStyle::Interleaved),
    );
    for (m, norm, bias) in [(1, true, false), (16, false, true), (7, true, true)] {
        let c = Qkv { norm, bias, ..big };
        let pg = Paged::shuffled(&mut r, 3, 4, 15, 16);
        let (seq, mut pos) = paged_slots(&mut r, m, &pg);
        if m > 1 {
            pos[m / 2] = -1;
        }
        let bits = if m > 1 { ERR_POSITION } else { 0 };
        assert_eq!(
            check_rope_append_paged::<f16>(&gpu, &c, &pg, &seq, &pos, &mut r),
            bits
        );
        assert_eq!(
            check_rope_append_paged::<bf16>(&gpu, &c, &pg, &seq, &pos, &mut r),
            bits
        );
    }
}

#[test]
fn gemv_dense_rope_append_paged_invalid_slots_write_nothing_and_flag() {
    let Some(gpu) =
        gpu_or_skip("gemv_dense_rope_append_paged_invalid_slots_write_nothing_and_flag")
    else {
        return;
    };
    let mut r = rng("gemv_dense_rope_append_paged_invalid");
    let c = Qkv {
        q_heads: 4,
        kv_heads: 2,
        rope: interleaved(64),
        k: 264,
        norm: true,
        bias: true,
        batch: 0,
        max_seq: 0,
    };
    // 3 sequences of up to 3 blocks of 4 slots in a pool of 11; sequence 1's block 1 is not
    // allocated (-1), sequence 2's block 2 is past the pool (11), sequence 0's block 2 is -7.
    let mut pg = Paged::shuffled(&mut r, 3, 3, 11, 4);
    pg.table[3 + 1] = -1;
    pg.table[2 * 3 + 2] = 11;
    pg.table[2] = -7;
    let cases: Vec<(Vec<i32>, Vec<i32>, i32)> = vec![
        // a padding row (position -1) between valid tokens
        (vec![0, 0, 1], vec![0, -1, 3], ERR_POSITION),
        // an unallocated block, a block past the pool, a negative block id
        (vec![1, 1, 0], vec![5, 0, 1], ERR_BLOCK),
        (vec![2, 2], vec![9, 8], ERR_BLOCK),
        (vec![0, 1], vec![11, 2], ERR_BLOCK),
        // past the table (block index 3 of 3), and far past it
        (vec![0, 2], vec![12, 4], ERR_POSITION),
        (vec![1], vec![i32::MAX], ERR_POSITION),
        // sequence = batch, negative, with a bad position too: the sequence bit only
        (vec![3, 0], vec![0, 0], ERR_SEQUENCE),
        (vec![-1, 3, i32::MIN], vec![1, -1, 0], ERR_SEQUENCE),
        // a single token whose block is unallocated: nothing at all is written
        (vec![1], vec![4], ERR_BLOCK),
        // 16 tokens, invalid ones among the first 8 and the last 8 (both token-row halves)
        (
            vec![0, 0, 0, 1, 1, 1, 2, 2, 3, 0, 0, 0, 2, 2, 2, 2],
            vec![0, 1, 9, 0, 1, 2, 0, 1, 0, 3, 4, 5, 4, 5, 6, -1],
            ERR_SEQUENCE | ERR_POSITION | ERR_BLOCK,
        ),
    ];
    for (seq, pos, bits) in &cases {
        for (norm, bias) in [(true, true), (false, false)] {
            let c = Qkv { norm, bias, ..c };
            assert_eq!(
                check_rope_append_paged::<f16>(&gpu, &c, &pg, seq, pos, &mut r),
                *bits,
                "seq {seq:?} pos {pos:?}"
            );
            assert_eq!(
                check_rope_append_paged::<bf16>(&gpu, &c, &pg, seq, pos, &mut r),
                *bits,
                "seq {seq:?} pos {pos:?}"
            );
        }
    }
}

/// With one block per sequence of `max_seq` slots and the identity table, the paged cache has
/// the contiguous cache's layout: both launches must agree bit for bit (one kernel, one
/// rounding), invalid tokens and flags included.
#[test]
fn gemv_dense_rope_append_paged_identity_table_matches_contiguous_bit_for_bit() {
    let Some(gpu) =
        gpu_or_skip("gemv_dense_rope_append_paged_identity_table_matches_contiguous_bit_for_bit")
    else {
        return;
    };
    let s = gpu.stream();
    let mut r = rng("gemv_dense_rope_append_paged_identity");
    let (batch, max_seq) = (3usize, 24usize);
    let c = Qkv {
        q_heads: 8,
        kv_heads: 2,
        rope: RopeParams::new(128, 500_000.0)
            .with_scaling(LLAMA3)
            .with_style(RopeStyle::Interleaved),
        k: 1000,
        norm: true,
        bias: true,
        batch,
        max_seq,
    };
    let (hq, d, k, n) = (c.q_heads, c.rope.head_dim, c.k, c.n());
    let table: Vec<i32> = (0..batch as i32).collect();
    let dtable = DeviceTensor::from_host(s, &table, &[batch, 1]).unwrap();
    for m in [1usize, 5, 16] {
        let (mut seq, mut pos) = decode_slots(&mut r, m, batch, max_seq);
        if m > 1 {
            // a padding row, a position past the cache, a sequence past the batch
            pos[1] = -1;
            pos[m - 1] = max_seq as i32;
            seq[m / 2] = batch as i32;
        }
        let inp = qkv_inputs::<f16>(&c, m, &mut r);
        let shape = c.cache_shape();
        let cn: usize = shape.iter().product();
        let kc0: Vec<f16> = fast_random(&mut r, cn, 2.0, 3.0);
        let vc0: Vec<f16> = fast_random(&mut r, cn, 2.0, 3.0);
        let dh = DeviceTensor::from_host(s, &inp.h, &[m, k]).unwrap();
        let dg = DeviceTensor::from_host(s, &inp.gamma, &[k]).unwrap();
        let dw = DeviceTensor::from_host(s, &inp.w, &[n, k]).unwrap();
        let db = DeviceTensor::from_host(s, &inp.b, &[n]).unwrap();
        let dseq = DeviceTensor::from_host(s, &seq, &[m]).unwrap();
        let dpos = DeviceTensor::from_host(s, &pos, &[m]).unwrap();
        let norm = RmsNorm {
            weight: &dg,
            eps: QKV_EPS,
        };
        let run = |layout: CacheLayout<'_>| {
            let mut q = DeviceTensor::filled(s, &[m, hq, d], f16::from_f32(f32::NAN)).unwrap();
            let mut cache = KvCache::new(
                DeviceTensor::from_host(s, &kc0, &shape).unwrap(),
                DeviceTensor::from_host(s, &vc0, &shape).unwrap(),
            )
            .unwrap();
            let mut flag = DeviceTensor::<i32>::zeros(s, &[1]).unwrap();
            let args = QkvRopeAppend {
                heads: c.heads(),
                rope: &c.rope,
                slots: TokenSlots {
                    seq_ids: &dseq,
                    positions: &dpos,
                },
                layout,
            };
            gemv_dense::linear_rope_append(
                s,
                &dh,
                Some(norm),
                &dw,
                Some(&db),
                &args,
                &mut q,
                &mut cache,
                Some(&mut flag),
            )
            .unwrap();
            let bits = |v: Vec<f16>| v.iter().map(|x| x.to_bits()).collect::<Vec<u16>>();
            (
                bits(q.to_host(s).unwrap()),
                bits(cache.k().to_host(s).unwrap()),
                bits(cache.v().to_host(s).unwrap()),
                flag.to_host(s).unwrap()[0],
            )
        };
        let contiguous = run(CacheLayout::Contiguous);
        let paged = run(CacheLayout::Paged {
            block_table: &dtable,
        });
        let what = format!("m {m} seq {seq:?} pos {pos:?}");
        assert_eq!(paged.3, contiguous.3, "{what}: flag");
        assert!(paged.0 == contiguous.0, "{what}: q_out differs");
        assert!(paged.1 == contiguous.1, "{what}: k cache differs");
        assert!(paged.2 == contiguous.2, "{what}: v cache differs");
    }
}

#[test]
fn gemv_dense_rope_append_paged_errors_name_the_argument() {
    let Some(gpu) = gpu_or_skip("gemv_dense_rope_append_paged_errors_name_the_argument") else {
        return;
    };
    let s = gpu.stream();
    let z = |shape: &[usize]| DeviceTensor::<f16>::zeros(s, shape).unwrap();
    let zi = |shape: &[usize]| DeviceTensor::<i32>::zeros(s, shape).unwrap();
    let (m, k, hq, hkv, d) = (2usize, 64usize, 4usize, 2usize, 64usize);
    let n = (hq + 2 * hkv) * d;
    let heads = QkvSplit {
        q_heads: hq,
        kv_heads: hkv,
    };
    let rope = interleaved(d);
    let (h, w) = (z(&[m, k]), z(&[n, k]));
    let (seq, pos) = (zi(&[m]), zi(&[m]));
    let slots = TokenSlots {
        seq_ids: &seq,
        positions: &pos,
    };
    let mut q = z(&[m, hq, d]);
    let mut cache = KvCache::<f16>::zeros(s, [5, hkv, 16, d]).unwrap();
    let paged = |block_table| QkvRopeAppend {
        heads,
        rope: &rope,
        slots,
        layout: CacheLayout::Paged { block_table },
    };
    let arg = |res: fl_kernels::Result<()>| match res {
        Err(Error::Shape { arg, .. })
        | Err(Error::InvalidArgument { arg, .. })
        | Err(Error::TooLarge { arg, .. }) => arg,
        other => panic!("expected an argument error, got {other:?}"),
    };
    // the good call works and flags nothing (table all zeros: block 0, position 0)
    let table = zi(&[2, 3]);
    let mut flag = zi(&[1]);
    gemv_dense::linear_rope_append(
        s,
        &h,
        None,
        &w,
        None,
        &paged(&table),
        &mut q,
        &mut cache,
        Some(&mut flag),
    )
    .unwrap();
    kv_cache::check_error_flag(s, &flag).unwrap();
    // block_table: not 2-D, no column, no row while there are tokens
    for bad in [zi(&[6]), zi(&[2, 0]), zi(&[0, 3]), zi(&[1, 2, 3])] {
        assert_eq!(
            arg(gemv_dense::linear_rope_append(
                s,
                &h,
                None,
                &w,
                None,
                &QkvRopeAppend {
                    layout: CacheLayout::Paged { block_table: &bad },
                    ..paged(&table)
                },
                &mut q,
                &mut cache,
                None
            )),
            "block_table"
        );
    }
    // cache: kv_heads or head_dim not those of heads / rope; no block or no slot
    for shape in [
        [5, hkv + 1, 16, d],
        [5, hkv, 16, d + 8],
        [0, hkv, 16, d],
        [5, hkv, 0, d],
    ] {
        let mut bad = KvCache::<f16>::zeros(s, shape).unwrap();
        assert_eq!(
            arg(gemv_dense::linear_rope_append(
                s,
                &h,
                None,
                &w,
                None,
                &paged(&table),
                &mut q,
                &mut bad,
                None
            )),
            "cache",
            "{shape:?}"
        );
    }
    // m = 0: nothing to do, even with a table of no row
    let (h0, s0, p0, mut q0) = (z(&[0, k]), zi(&[0]), zi(&[0]), z(&[0, hq, d]));
    let empty_table = zi(&[0, 3]);
    let args0 = QkvRopeAppend {
        heads,
        rope: &rope,
        slots: TokenSlots {
            seq_ids: &s0,
            positions: &p0,
        },
        layout: CacheLayout::Paged {
            block_table: &empty_table,
        },
    };
    gemv_dense::linear_rope_append(s, &h0, None, &w, None, &args0, &mut q0, &mut cache, None)
        .unwrap();
    s.synchronize().unwrap();
}

#[test]
fn gemv_dense_rope_append_paged_launcher_rejects_bad_arguments() {
    let Some(gpu) = gpu_or_skip("gemv_dense_rope_append_paged_launcher_rejects_bad_arguments")
    else {
        return;
    };
    use fl_kernels::cudarc::driver::{DevicePtr, DevicePtrMut};
    use fl_kernels_sys::{fl_dtype, fl_rope_params};
    let s = gpu.stream();
    let (k, d) = (64usize, 64usize);
    let n = 3 * d; // one q, one k and one v head
    let hbuf = DeviceTensor::<f16>::zeros(s, &[k]).unwrap();
    let wbuf = DeviceTensor::<f16>::zeros(s, &[n * k]).unwrap();
    let ibuf = DeviceTensor::<i32>::zeros(s, &[1]).unwrap(); // seq, pos and table: all 0
    let mut qbuf = DeviceTensor::<f16>::zeros(s, &[d]).unwrap();
    let mut kbuf = DeviceTensor::<f16>::zeros(s, &[4 * d]).unwrap();
    let mut vbuf = DeviceTensor::<f16>::zeros(s, &[4 * d]).unwrap();
    let (ph, _g1) = hbuf.as_slice().device_ptr(s);
    let (pw, _g2) = wbuf.as_slice().device_ptr(s);
    let (pi, _g3) = ibuf.as_slice().device_ptr(s);
    let (pq, _g4) = qbuf.as_slice_mut().device_ptr_mut(s);
    let (pk, _g5) = kbuf.as_slice_mut().device_ptr_mut(s);
    let (pv, _g6) = vbuf.as_slice_mut().device_ptr_mut(s);
    let mut p = fl_rope_params {
        head_dim: d as i32,
        rotary_dim: d as i32,
        interleaved: 1,
        reserved: 0,
        inv_freq: [0.0; 256],
    };
    for (i, f) in p.inv_freq.iter_mut().take(d / 2).enumerate() {
        *f = 10_000f32.powf(-2.0 * i as f32 / d as f32);
    }
    // (m, table, batch, max_blocks, num_blocks, block_size); the cache is one block of 4 slots
    let call = |m: i64, table: u64, batch: i32, max_blocks: i32, num_blocks: i64, bs: i32| {
        // SAFETY: the buffers hold what any accepted call reads or writes: h one row of k = 64,
        // w 3 heads of 64 rows, seq / pos / table one i32 (0), q_out one head, each cache one
        // block [1, 1, 4, 64]; calls with more tokens, rows or blocks are refused first.
        unsafe {
            fl_kernels_sys::fl_gemv_dense_rope_append_paged(
                fl_dtype::FL_DTYPE_F16,
                ph as _,
                std::ptr::null(),
                0.0,
                pw as _,
                std::ptr::null(),
                m,
                k as i64,
                1,
                1,
                &p,
                pi as _,
                pi as _,
                pq as _,
                pk as _,
                pv as _,
                table as _,
                batch,
                max_blocks,
                num_blocks,
                bs,
                std::ptr::null_mut(),
                s.cu_stream() as _,
            )
        }
    };
    assert_eq!(call(1, pi, 1, 1, 1, 4), 0);
    assert_eq!(call(0, 0, 1, 1, 1, 4), 0, "m = 0, no table");
    assert!(call(1, 0, 1, 1, 1, 4) < 0, "null block_table");
    assert!(call(1, pi, 0, 1, 1, 4) < 0, "batch 0");
    assert!(call(1, pi, 1, 0, 1, 4) < 0, "max_blocks_per_seq 0");
    assert!(call(1, pi, 1, 1, 0, 4) < 0, "num_blocks 0");
    assert!(call(1, pi, 1, 1, 1, 0) < 0, "block_size 0");
    assert!(call(1, pi, 1, 1, 1, -4) < 0, "negative block_size");
    assert!(call(17, pi, 1, 1, 1, 4) < 0, "m > 16");
    s.synchronize().unwrap();
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

proptest! {
    #[test]
    fn reference_linear_rope_append_is_linear_then_rope_append(
        hq in 0usize..4, hkv in 1usize..3, half in 1usize..5, extra in 0usize..3,
        k8 in 1usize..4, interleaved in any::<bool>(), bias in any::<bool>(), seed in any::<u64>(),
    ) {
        // Small-integer x, w and bias: the product is exact in f32, so the f32 qkv given to
        // reference::kv_cache::rope_append is the f64 product itself, and both references
        // must agree exactly (q, k, v, the flag, and the caches up to f32 rounding).
        use rand::{Rng, SeedableRng};
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let (d, k) = (2 * half + extra, 8 * k8);
        let style = if interleaved { RopeStyle::Interleaved } else { RopeStyle::NeoX };
        let rope = RopeParams::new(d, 10_000.0).with_rotary_dim(2 * half).with_style(style);
        let heads = QkvSplit { q_heads: hq, kv_heads: hkv };
        let n = (hq + 2 * hkv) * d;
        let (batch, max_seq) = (3usize, 9usize);
        let shape = [batch, hkv, max_seq, d];
        let m = r.random_range(1..=8usize);
        let mut seen = std::collections::HashSet::new();
        let (mut seq, mut pos) = (vec![], vec![]);
        while seq.len() < m {
            let (sq, p) = (r.random_range(0..batch as i32), r.random_range(0..max_seq as i32));
            if seen.insert((sq, p)) {
                seq.push(sq);
                pos.push(p);
            }
        }
        // an invalid slot, sometimes
        match seed % 4 {
            0 => seq[0] = batch as i32,
            1 => pos[m - 1] = max_seq as i32,
            2 => pos[0] = -1,
            _ => {}
        }
        let mut ints = |len: usize| -> Vec<f16> {
            (0..len).map(|_| f16::from_f32(r.random_range(-3i32..=3) as f32)).collect()
        };
        let (x, w, b) = (ints(m * k), ints(n * k), ints(n));
        let bias = bias.then_some(&b[..]);
        let cn = shape.iter().product::<usize>();
        let (mut kc, mut vc) = (vec![f64::NAN; cn], vec![f64::NAN; cn]);
        let got = reference::gemv_dense::linear_rope_append(
            &x, &w, bias, m, k, heads, &rope, &seq, &pos, &mut kc, &mut vc, shape,
        );
        let qkv: Vec<f32> = reference::gemv_dense::linear(&x, &w, bias, m, n, k)
            .iter()
            .map(|&v| v as f32)
            .collect();
        let (mut kc2, mut vc2) = (vec![f32::NAN; cn], vec![f32::NAN; cn]);
        let want = reference::kv_cache::rope_append(
            &qkv, hq, hkv, &rope, &seq, &pos, &mut kc2, &mut vc2, shape,
            reference::kv_cache::Layout::Contiguous,
        );
        let same = |a: f64, b: f64| a == b || (a.is_nan() && b.is_nan());
        prop_assert_eq!(got.flag, want.flag);
        for (name, g, w) in [("q", &got.q, &want.q), ("k", &got.k, &want.k), ("v", &got.v, &want.v)] {
            prop_assert_eq!(g.len(), w.len());
            for (i, (&a, &b)) in g.iter().zip(w.iter()).enumerate() {
                prop_assert!(same(a, b), "{}[{}]: {} vs {}", name, i, a, b);
            }
        }
        for (name, g, w) in [("k", &kc, &kc2), ("v", &vc, &vc2)] {
            for (i, (&a, &b)) in g.iter().zip(w.iter()).enumerate() {
                prop_assert!(same(a as f32 as f64, b as f64), "{} cache[{}]: {} vs {}", name, i, a, b);
            }
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
