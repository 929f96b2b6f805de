//! softmax::{softmax, softmax_f32} on the GPU against reference::softmax, special values
//! (masked rows, NaN), every path (register, split, generic), and property tests of the
//! reference (these run without a GPU).

use fl_kernels::softmax::{LongPath, SoftmaxWorkspace};
use fl_kernels::testing::{gpu_or_skip, random_nonzero, rel_l2, rng, strategies, tolerance};
use fl_kernels::{bf16, f16, reference, softmax, DeviceTensor, Error, FloatDType, Gpu};
use proptest::prelude::*;

/// Row lengths covering every path: register (multiples of 8 up to 32768 for 2-byte types,
/// of 4 up to 16384 for f32), cluster on sm_90+ (longer multiples, up to 262144 for 2-byte
/// types, 131072 for f32), split (longer, or odd, with few rows; f32 262144 everywhere, the
/// rest before sm_90) and odd sizes.
const N: &[usize] = &[
    1, 7, 8, 129, 1000, 4095, 4096, 4104, 16384, 16388, 32000, 32768, 32776, 50_001, 65_536,
    128_256, 131_072, 262_144,
];
const ROWS: &[usize] = &[1, 3];

/// Output dtype of a call: the input's ([`softmax::softmax`]) or f32 ([`softmax::softmax_f32`]).
#[derive(Clone, Copy, Debug)]
enum Out {
    Same,
    F32,
}

/// Unit roundoff of the output of `out` for input `T`.
fn out_eps<T: FloatDType>(out: Out) -> f64 {
    match out {
        Out::Same => T::EPS,
        Out::F32 => f32::EPS,
    }
}

/// rel L2 tolerance: f32 outputs 1e-5; f16/bf16 outputs DESIGN's 1e-2 (a 256k-long row
/// has most probabilities near 1e-6, where f16 is subnormal and its relative spacing large).
fn tol<T: FloatDType>(out: Out) -> f64 {
    match out {
        Out::F32 => 1e-5,
        Out::Same => tolerance::<T>(),
    }
}

fn logits<T: FloatDType>(r: &mut impl rand::Rng, len: usize) -> Vec<T> {
    random_nonzero(r, len, 1e-3, 8.0)
}

/// Runs the op on x (output poisoned with NaN first); the output widened to f32 (exact).
fn run<T: FloatDType>(
    gpu: &Gpu,
    x: &[T],
    shape: &[usize],
    t: f32,
    out: Out,
    ws: Option<&mut SoftmaxWorkspace>,
) -> Vec<f32> {
    run_path(gpu, x, shape, t, out, ws, LongPath::Auto)
}

/// [`run`] with the long-row path forced (`Auto`: the public functions).
fn run_path<T: FloatDType>(
    gpu: &Gpu,
    x: &[T],
    shape: &[usize],
    t: f32,
    out: Out,
    ws: Option<&mut SoftmaxWorkspace>,
    path: LongPath,
) -> Vec<f32> {
    let s = gpu.stream();
    let dx = DeviceTensor::from_host(s, x, shape).unwrap();
    match out {
        Out::F32 => {
            let mut y = DeviceTensor::<f32>::filled(s, shape, f32::NAN).unwrap();
            if path == LongPath::Auto {
                softmax::softmax_f32(s, &dx, t, &mut y, ws).unwrap();
            } else {
                softmax::softmax_with_path(s, &dx, t, &mut y, ws, path).unwrap();
            }
            y.to_host(s).unwrap()
        }
        Out::Same => {
            let mut y = DeviceTensor::<T>::filled(s, shape, T::from_f32(f32::NAN)).unwrap();
            if path == LongPath::Auto {
                softmax::softmax(s, &dx, t, &mut y, ws).unwrap();
            } else {
                softmax::softmax_with_path(s, &dx, t, &mut y, ws, path).unwrap();
            }
            y.to_host(s).unwrap().iter().map(|v| v.to_f32()).collect()
        }
    }
}

fn check<T: FloatDType>(
    gpu: &Gpu,
    rows: usize,
    n: usize,
    t: f32,
    out: Out,
    ws: Option<&mut SoftmaxWorkspace>,
    r: &mut impl rand::Rng,
) {
    check_path::<T>(gpu, rows, n, t, out, ws, LongPath::Auto, r)
}

#[allow(clippy::too_many_arguments)]
fn check_path<T: FloatDType>(
    gpu: &Gpu,
    rows: usize,
    n: usize,
    t: f32,
    out: Out,
    ws: Option<&mut SoftmaxWorkspace>,
    path: LongPath,
    r: &mut impl rand::Rng,
) {
    let x: Vec<T> = logits(r, rows * n);
    let got = run_path(gpu, &x, &[rows, n], t, out, ws, path);
    let want = reference::softmax::softmax(&x, n, t);
    let e = rel_l2(&got, &want);
    assert!(
        e < tol::<T>(out),
        "softmax {rows}x{n} {} {out:?} t={t} {path:?}: rel L2 {e:e}",
        T::NAME
    );
    // Each row sums to 1 (to the output's rounding).
    let eps = out_eps::<T>(out);
    let slack = if eps < 1e-7 { 1e-5 } else { 4.0 * eps };
    for (i, row) in got.chunks(n).enumerate() {
        let sum: f64 = row.iter().map(|&v| v as f64).sum();
        assert!(
            (sum - 1.0).abs() < slack,
            "softmax {rows}x{n} {} {out:?} {path:?}: row {i} sums to {sum}",
            T::NAME
        );
    }
}

#[test]
fn softmax_matches_reference_all_dtypes_and_paths() {
    let Some(gpu) = gpu_or_skip("softmax_matches_reference_all_dtypes_and_paths") else {
        return;
    };
    let mut r = rng("softmax");
    let mut ws = SoftmaxWorkspace::new();
    for &n in N {
        for &rows in ROWS {
            check::<f32>(&gpu, rows, n, 1.0, Out::Same, Some(&mut ws), &mut r);
            check::<f16>(&gpu, rows, n, 0.7, Out::Same, Some(&mut ws), &mut r);
            check::<bf16>(&gpu, rows, n, 1.0, Out::Same, None, &mut r);
            check::<f16>(&gpu, rows, n, 1.3, Out::F32, None, &mut r);
            check::<bf16>(&gpu, rows, n, 0.5, Out::F32, Some(&mut ws), &mut r);
        }
    }
    // Many rows: 256-thread register blocks; the generic path with a capped grid (>= 128
    // rows of long rows: no split); odd lengths with many rows.
    check::<f32>(&gpu, 1030, 4096, 1.0, Out::Same, None, &mut r);
    check::<bf16>(&gpu, 130, 40_000, 1.0, Out::F32, None, &mut r);
    check::<f16>(&gpu, 300, 70_001, 2.0, Out::Same, None, &mut r);
    check::<bf16>(&gpu, 2000, 129, 1.0, Out::Same, None, &mut r);
}

/// Long rows on the cluster path (sm_90+; elsewhere the split and generic paths): every
/// vectors-per-thread instantiation (4, 8, 16 for 2-byte types; 4, 8, 16 for f32 up to
/// 131072), one to many rows (300 rows: clusters loop over rows), all dtypes, f32 out.
#[test]
fn softmax_cluster_path_rows_and_lengths() {
    let Some(gpu) = gpu_or_skip("softmax_cluster_path_rows_and_lengths") else {
        return;
    };
    let mut r = rng("softmax_cluster");
    // n / vec: bf16 32776 -> 4097 vectors (VPT 4), 65536 -> VPT 4 (full), 128256 -> VPT 8,
    // 131072 -> VPT 8 (full), 262144 -> VPT 16 (full); f32 32776 -> VPT 4, 65536 -> VPT 8,
    // 128256 -> VPT 16, 131072 -> VPT 16 (full), 262144 -> not on the cluster path.
    for &n in &[32_776usize, 65_536, 128_256, 131_072, 262_144] {
        for &rows in &[1usize, 3, 64] {
            check::<bf16>(&gpu, rows, n, 1.0, Out::Same, None, &mut r);
            check::<bf16>(&gpu, rows, n, 0.8, Out::F32, None, &mut r);
            check::<f16>(&gpu, rows, n, 1.2, Out::Same, None, &mut r);
            check::<f32>(&gpu, rows, n, 1.0, Out::Same, None, &mut r);
        }
    }
    // Many rows (more than 2 clusters per SM on any GPU up to 150 SMs: clusters loop).
    for &n in &[65_536usize, 128_256] {
        check::<bf16>(&gpu, 300, n, 1.0, Out::Same, None, &mut r);
        check::<bf16>(&gpu, 300, n, 1.0, Out::F32, None, &mut r);
        check::<f32>(&gpu, 300, n, 0.9, Out::Same, None, &mut r);
    }
    check::<f16>(&gpu, 300, 131_072, 1.0, Out::Same, None, &mut r);
}

/// Both long-row paths (automatic: cluster on sm_90+; portable: split / generic, what runs
/// before sm_90): all dtypes, f32 out, odd and vector lengths (odd lengths take each path's
/// scalar fallback), one to many rows (300 rows: clusters loop over rows).
#[test]
fn softmax_every_long_path_matches_reference() {
    let Some(gpu) = gpu_or_skip("softmax_every_long_path_matches_reference") else {
        return;
    };
    let mut r = rng("softmax_paths");
    let mut ws = SoftmaxWorkspace::new();
    for path in LongPath::ALL {
        for &n in &[
            1usize, 7, 4095, 4104, 16_388, 32_776, 40_001, 65_536, 128_256, 128_257, 131_072,
            262_144,
        ] {
            for &rows in &[1usize, 3] {
                check_path::<f32>(&gpu, rows, n, 1.0, Out::Same, Some(&mut ws), path, &mut r);
                check_path::<f16>(&gpu, rows, n, 0.7, Out::Same, None, path, &mut r);
                check_path::<bf16>(&gpu, rows, n, 1.0, Out::Same, Some(&mut ws), path, &mut r);
                check_path::<bf16>(&gpu, rows, n, 0.5, Out::F32, None, path, &mut r);
            }
        }
        // Many rows: more than 2 clusters per SM on any GPU up to 150 SMs; the generic
        // path's grid capped at one block per SM.
        check_path::<bf16>(&gpu, 300, 128_256, 1.0, Out::Same, None, path, &mut r);
        check_path::<bf16>(&gpu, 300, 128_256, 1.0, Out::F32, None, path, &mut r);
        check_path::<f32>(&gpu, 300, 131_072, 0.9, Out::Same, None, path, &mut r);
        check_path::<f16>(&gpu, 300, 32_776, 1.1, Out::Same, None, path, &mut r);
        check_path::<f16>(&gpu, 170, 40_003, 1.0, Out::F32, None, path, &mut r);
    }
}

/// In place (y aliases x, allowed when the dtypes agree) on every long-row path, through the
/// raw launcher: each element is written by the thread that read it, after the row's
/// statistics are complete.
#[test]
fn softmax_in_place_on_every_long_path() {
    let Some(gpu) = gpu_or_skip("softmax_in_place_on_every_long_path") else {
        return;
    };
    use fl_kernels::cudarc::driver::DevicePtrMut;
    let s = gpu.stream();
    let mut r = rng("softmax_in_place");
    for (path, code) in [
        (LongPath::Auto, fl_kernels_sys::FL_SOFTMAX_AUTO),
        (LongPath::Portable, fl_kernels_sys::FL_SOFTMAX_PORTABLE),
    ] {
        for &(rows, n) in &[(300usize, 65_536usize), (3, 128_256), (140, 40_001)] {
            let x: Vec<bf16> = logits(&mut r, rows * n);
            let mut d = DeviceTensor::from_host(s, &x, &[rows, n]).unwrap();
            {
                let (p, _g) = d.as_slice_mut().device_ptr_mut(s);
                // SAFETY: d holds rows * n bf16, read and written in place (same dtype);
                // no workspace.
                let st = unsafe {
                    fl_kernels_sys::fl_softmax_path(
                        fl_kernels_sys::fl_dtype::FL_DTYPE_BF16,
                        p as _,
                        fl_kernels_sys::fl_dtype::FL_DTYPE_BF16,
                        p as _,
                        rows as i64,
                        n as i64,
                        1.0,
                        std::ptr::null_mut(),
                        0,
                        code as i32,
                        s.cu_stream() as _,
                    )
                };
                assert_eq!(st, 0, "{path:?}");
            }
            let got: Vec<f32> = d.to_host(s).unwrap().iter().map(|v| v.to_f32()).collect();
            let want = reference::softmax::softmax(&x, n, 1.0);
            let e = rel_l2(&got, &want);
            assert!(e < 1e-2, "in place {rows}x{n} {path:?}: rel L2 {e:e}");
        }
    }
    // An unknown path is an argument error.
    let x = DeviceTensor::<f32>::zeros(s, &[1, 8]).unwrap();
    let mut y = DeviceTensor::<f32>::zeros(s, &[1, 8]).unwrap();
    {
        use fl_kernels::cudarc::driver::DevicePtr;
        let (px, _g1) = x.as_slice().device_ptr(s);
        let (py, _g2) = y.as_slice_mut().device_ptr_mut(s);
        let past_last = fl_kernels_sys::FL_SOFTMAX_PORTABLE as i32 + 1;
        for bad in [-1i32, past_last, 100] {
            // SAFETY: rejected before any launch.
            let st = unsafe {
                fl_kernels_sys::fl_softmax_path(
                    fl_kernels_sys::fl_dtype::FL_DTYPE_F32,
                    px as _,
                    fl_kernels_sys::fl_dtype::FL_DTYPE_F32,
                    py as _,
                    1,
                    8,
                    1.0,
                    std::ptr::null_mut(),
                    0,
                    bad,
                    s.cu_stream() as _,
                )
            };
            assert_eq!(st, fl_kernels_sys::FL_ERR_INVALID_ARGUMENT, "path {bad}");
        }
    }
}

/// The raw launcher with no workspace: few long rows take the one-block-per-row path.
#[test]
fn softmax_without_workspace_takes_the_generic_path() {
    let Some(gpu) = gpu_or_skip("softmax_without_workspace_takes_the_generic_path") else {
        return;
    };
    use fl_kernels::cudarc::driver::{DevicePtr, DevicePtrMut};
    let s = gpu.stream();
    let mut r = rng("softmax_no_ws");
    for &(rows, n) in &[(1usize, 128_256usize), (3, 40_001), (2, 262_144)] {
        let x: Vec<bf16> = logits(&mut r, rows * n);
        let dx = DeviceTensor::from_host(s, &x, &[rows, n]).unwrap();
        let mut dy = DeviceTensor::<f32>::filled(s, &[rows, n], f32::NAN).unwrap();
        {
            let (px, _g1) = dx.as_slice().device_ptr(s);
            let (py, _g2) = dy.as_slice_mut().device_ptr_mut(s);
            // SAFETY: x holds rows * n bf16, y rows * n f32; no workspace.
            let st = unsafe {
                fl_kernels_sys::fl_softmax(
                    fl_kernels_sys::fl_dtype::FL_DTYPE_BF16,
                    px as _,
                    fl_kernels_sys::fl_dtype::FL_DTYPE_F32,
                    py as _,
                    rows as i64,
                    n as i64,
                    1.0,
                    std::ptr::null_mut(),
                    0,
                    s.cu_stream() as _,
                )
            };
            assert_eq!(st, 0);
        }
        let got = dy.to_host(s).unwrap();
        let want = reference::softmax::softmax(&x, n, 1.0);
        let e = rel_l2(&got, &want);
        assert!(e < 1e-5, "no workspace {rows}x{n}: rel L2 {e:e}");
    }
}

/// Masked rows, masked chunks, NaN and +inf, on every path.
#[test]
fn softmax_special_values_on_every_path() {
    let Some(gpu) = gpu_or_skip("softmax_special_values_on_every_path") else {
        return;
    };
    let mut r = rng("softmax_special");
    // (n, dtype path): 100 register, 40_000 split (vectors) or cluster (sm_90+), 40_001
    // split (scalar), 131_072 and 262_144 cluster (sm_90+; f32 262_144 split); and each of
    // them forced onto every long-row path.
    for &n in &[100usize, 4096, 40_000, 40_001, 131_072, 262_144] {
        let rows = 5;
        let mut x: Vec<f32> = logits(&mut r, rows * n);
        // row 0: fully masked; row 1: all but the last masked (a one-hot result);
        // row 2: the first 3/4 masked (whole chunks masked on the split path, whole
        // blocks of the cluster on the cluster path);
        // row 3: one NaN; row 4: one +inf.
        for v in &mut x[..n] {
            *v = f32::NEG_INFINITY;
        }
        for v in &mut x[n..2 * n - 1] {
            *v = f32::NEG_INFINITY;
        }
        for v in &mut x[2 * n..2 * n + 3 * n / 4] {
            *v = f32::NEG_INFINITY;
        }
        x[3 * n + n / 2] = f32::NAN;
        x[4 * n + n / 3] = f32::INFINITY;
        let want = reference::softmax::softmax(&x, n, 1.0);
        let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
        let want_b = reference::softmax::softmax(&xb, n, 1.0);
        let mut ws = SoftmaxWorkspace::new();
        for path in LongPath::ALL {
            let got = run_path(&gpu, &x, &[rows, n], 1.0, Out::Same, Some(&mut ws), path);
            let got_b = run_path(&gpu, &xb, &[rows, n], 1.0, Out::F32, None, path);
            let got_h = run_path(&gpu, &xb, &[rows, n], 1.0, Out::Same, None, path);
            // (name, output, reference, rel L2 bound of the partly masked row)
            for (name, got, want, bound) in [
                ("f32", &got, &want, 1e-5),
                ("bf16->f32", &got_b, &want_b, 1e-5),
                ("bf16", &got_h, &want_b, 1e-2),
            ] {
                let name = format!("{name} {path:?}");
                assert!(
                    got[..n].iter().all(|&v| v == 0.0),
                    "{name} n={n}: masked row not 0"
                );
                assert!(
                    got[n..2 * n - 1].iter().all(|&v| v == 0.0) && got[2 * n - 1] == 1.0,
                    "{name} n={n}: one-hot row wrong"
                );
                let row2 = &got[2 * n..3 * n];
                assert!(
                    row2[..3 * n / 4].iter().all(|&v| v == 0.0),
                    "{name} n={n}: masked part"
                );
                let e = rel_l2(row2, &want[2 * n..3 * n]);
                assert!(e < bound, "{name} n={n}: partly masked row rel L2 {e:e}");
                assert!(
                    got[3 * n..].iter().all(|v| v.is_nan()),
                    "{name} n={n}: NaN/+inf rows"
                );
            }
        }
        // The reference agrees on the special rows.
        assert!(want[..n].iter().all(|&v| v == 0.0) && want[3 * n..].iter().all(|v| v.is_nan()));
    }
}

#[test]
fn softmax_temperature_scales_the_logits() {
    let Some(gpu) = gpu_or_skip("softmax_temperature_scales_the_logits") else {
        return;
    };
    let mut r = rng("softmax_temperature");
    let n = 32000;
    let x: Vec<f32> = logits(&mut r, n);
    for t in [0.25f32, 0.7, 1.0, 3.0] {
        let got = run(&gpu, &x, &[1, n], t, Out::Same, None);
        let scaled: Vec<f32> = x.iter().map(|v| v / t).collect();
        let via_scaled = run(&gpu, &scaled, &[1, n], 1.0, Out::Same, None);
        let want = reference::softmax::softmax(&x, n, t);
        assert!(rel_l2(&got, &want) < 1e-5, "t={t}");
        let want2: Vec<f64> = via_scaled.iter().map(|&v| v as f64).collect();
        assert!(
            rel_l2(&got, &want2) < 1e-5,
            "t={t}: softmax(x, t) != softmax(x / t, 1)"
        );
    }
}

#[test]
fn softmax_errors_name_the_argument() {
    let Some(gpu) = gpu_or_skip("softmax_errors_name_the_argument") else {
        return;
    };
    let s = gpu.stream();
    let x = DeviceTensor::<bf16>::zeros(s, &[2, 64]).unwrap();
    let mut y = DeviceTensor::<bf16>::zeros(s, &[2, 64]).unwrap();
    let mut y_bad = DeviceTensor::<bf16>::zeros(s, &[2, 65]).unwrap();
    let mut y32_bad = DeviceTensor::<f32>::zeros(s, &[128]).unwrap();
    assert!(matches!(
        softmax::softmax(s, &x, 1.0, &mut y_bad, None),
        Err(Error::Shape { arg: "out", .. })
    ));
    assert!(matches!(
        softmax::softmax_f32(s, &x, 1.0, &mut y32_bad, None),
        Err(Error::Shape { arg: "out", .. })
    ));
    let scalar = DeviceTensor::<bf16>::zeros(s, &[]).unwrap();
    let mut so = DeviceTensor::<bf16>::zeros(s, &[]).unwrap();
    assert!(matches!(
        softmax::softmax(s, &scalar, 1.0, &mut so, None),
        Err(Error::Shape { arg: "x", .. })
    ));
    let e0 = DeviceTensor::<bf16>::zeros(s, &[2, 0]).unwrap();
    let mut eo = DeviceTensor::<bf16>::zeros(s, &[2, 0]).unwrap();
    assert!(matches!(
        softmax::softmax(s, &e0, 1.0, &mut eo, None),
        Err(Error::Shape { arg: "x", .. })
    ));
    for t in [0.0f32, -1.0, f32::NAN, f32::INFINITY, 1e-40] {
        let e = softmax::softmax(s, &x, t, &mut y, None);
        assert!(
            matches!(
                e,
                Err(Error::InvalidArgument {
                    arg: "temperature",
                    ..
                })
            ),
            "t={t}: {e:?}"
        );
    }
    // Zero rows: nothing launched.
    let x0 = DeviceTensor::<bf16>::zeros(s, &[0, 64]).unwrap();
    let mut y0 = DeviceTensor::<bf16>::zeros(s, &[0, 64]).unwrap();
    softmax::softmax(s, &x0, 1.0, &mut y0, None).unwrap();
    // The workspace grows once and is then reused.
    let mut ws = SoftmaxWorkspace::new();
    ws.reserve(s, 4, 128_256).unwrap();
    let cap = ws.capacity_bytes();
    assert_eq!(cap, SoftmaxWorkspace::bytes_needed(4, 128_256));
    assert!(cap > 0);
    ws.reserve(s, 1, 32_000).unwrap();
    assert_eq!(ws.capacity_bytes(), cap);
}

#[test]
fn softmax_gpu_proptest() {
    let Some(gpu) = gpu_or_skip("softmax_gpu_proptest") else {
        return;
    };
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 32,
        ..ProptestConfig::default()
    });
    let ws = std::cell::RefCell::new(SoftmaxWorkspace::new());
    runner
        .run(
            &(
                strategies::matrix(160, 70_000),
                0.2f32..4.0,
                any::<bool>(),
                any::<u64>(),
            ),
            |((rows, n), t, f32_out, seed)| {
                use rand::SeedableRng;
                let mut r = rand::rngs::StdRng::seed_from_u64(seed);
                if f32_out {
                    check::<bf16>(
                        &gpu,
                        rows,
                        n,
                        t,
                        Out::F32,
                        Some(&mut ws.borrow_mut()),
                        &mut r,
                    );
                } else {
                    check::<f32>(
                        &gpu,
                        rows,
                        n,
                        t,
                        Out::Same,
                        Some(&mut ws.borrow_mut()),
                        &mut r,
                    );
                    check::<f16>(&gpu, rows, n, t, Out::Same, None, &mut r);
                }
                Ok(())
            },
        )
        .unwrap();
}

// ---- reference properties (CPU only, run in CI) ----
proptest! {
    #[test]
    fn reference_softmax_is_a_distribution_and_shift_invariant(
        (rows, n) in strategies::matrix(4, 5000),
        shift in -50.0f32..50.0,
        t in 0.1f32..5.0,
        seed in any::<u64>(),
    ) {
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let x: Vec<f32> = logits(&mut r, rows * n);
        let y = reference::softmax::softmax(&x, n, t);
        for row in y.chunks(n) {
            prop_assert!(row.iter().all(|&p| (0.0..=1.0).contains(&p)));
            prop_assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        }
        // Adding a constant to a row does not change it (up to rounding x + shift to f32).
        let xs: Vec<f32> = x.iter().map(|v| v + shift).collect();
        let ys = reference::softmax::softmax(&xs, n, t);
        for (a, b) in y.iter().zip(&ys) {
            prop_assert!((a - b).abs() < 1e-4 * (1.0 + 1.0 / t as f64), "{a} vs {b}");
        }
        // The largest logit has the largest probability.
        for (xr, yr) in x.chunks(n).zip(y.chunks(n)) {
            let im = (0..n).max_by(|&i, &j| xr[i].total_cmp(&xr[j])).unwrap();
            prop_assert!(yr.iter().all(|&p| p <= yr[im]));
        }
    }

    #[test]
    fn reference_softmax_masks_and_propagates_nan(n in 1usize..300, k in 0usize..300) {
        let k = k % n;
        // Masking all but one element gives a one-hot row.
        let mut x = vec![f32::NEG_INFINITY; n];
        x[k] = 0.5;
        let y = reference::softmax::softmax(&x, n, 1.0);
        for (i, &p) in y.iter().enumerate() {
            prop_assert_eq!(p, if i == k { 1.0 } else { 0.0 });
        }
        // A fully masked row gives zeros; a NaN anywhere gives NaN everywhere.
        x[k] = f32::NEG_INFINITY;
        prop_assert!(reference::softmax::softmax(&x, n, 1.0).iter().all(|&p| p == 0.0));
        x[k] = f32::NAN;
        prop_assert!(reference::softmax::softmax(&x, n, 1.0).iter().all(|p| p.is_nan()));
    }
}

#[test]
fn reference_softmax_known_values() {
    let y = reference::softmax::softmax(&[0.0f32, 2.0f32.ln()], 2, 1.0);
    assert!(
        (y[0] - 1.0 / 3.0).abs() < 1e-7 && (y[1] - 2.0 / 3.0).abs() < 1e-7,
        "{y:?}"
    );
    // t = 2 halves the logits: [0, ln 4] / 2 = [0, ln 2].
    let z = reference::softmax::softmax(&[0.0f32, 4.0f32.ln()], 2, 2.0);
    assert!((z[0] - 1.0 / 3.0).abs() < 1e-7, "{z:?}");
}
