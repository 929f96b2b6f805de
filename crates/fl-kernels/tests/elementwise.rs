//! elementwise::{add, add_assign, cast} on the GPU against reference::elementwise,
//! elementwise::prefetch_l2 (changes nothing, errors name `bytes`), and
//! property tests of the references (these run without a GPU).

use fl_kernels::testing::{gpu_or_skip, random, rel_l2, rng, strategies, to_f64, tolerance};
use fl_kernels::{bf16, elementwise, f16, reference, DeviceTensor, Error, FloatDType, Gpu};
use proptest::prelude::*;

const SIZES: &[usize] = &[1, 2, 7, 8, 9, 31, 1000, 4097, 65_537, (1 << 20) + 3];

fn check_add<T: FloatDType>(gpu: &Gpu, n: usize, r: &mut impl rand::Rng) {
    let s = gpu.stream();
    let a: Vec<T> = random(r, n);
    let b: Vec<T> = random(r, n);
    let da = DeviceTensor::from_host(s, &a, &[n]).unwrap();
    let db = DeviceTensor::from_host(s, &b, &[n]).unwrap();
    let mut out = DeviceTensor::filled(s, &[n], T::from_f32(f32::NAN)).unwrap();
    elementwise::add(s, &da, &db, &mut out).unwrap();
    let got = out.to_host(s).unwrap();
    let want = to_f64(&reference::elementwise::add(&a, &b));
    let err = rel_l2(&got, &want);
    assert!(
        err < tolerance::<T>(),
        "add<{}> n={n}: rel L2 {err:e}",
        T::NAME
    );
    // The kernel rounds exactly like the reference: every element matches bit for bit.
    assert_eq!(to_f64(&got), want, "add<{}> n={n}: not bit-exact", T::NAME);
}

#[test]
fn add_matches_reference_all_dtypes_odd_sizes() {
    let Some(gpu) = gpu_or_skip("add_matches_reference_all_dtypes_odd_sizes") else {
        return;
    };
    let mut r = rng("add");
    for &n in SIZES {
        check_add::<f32>(&gpu, n, &mut r);
        check_add::<f16>(&gpu, n, &mut r);
        check_add::<bf16>(&gpu, n, &mut r);
    }
}

#[test]
fn add_assign_is_in_place_add() {
    let Some(gpu) = gpu_or_skip("add_assign_is_in_place_add") else {
        return;
    };
    let s = gpu.stream();
    let mut r = rng("add_assign");
    for &n in SIZES {
        let a: Vec<f16> = random(&mut r, n);
        let b: Vec<f16> = random(&mut r, n);
        let mut acc = DeviceTensor::from_host(s, &a, &[n]).unwrap();
        let db = DeviceTensor::from_host(s, &b, &[n]).unwrap();
        elementwise::add_assign(s, &mut acc, &db).unwrap();
        assert_eq!(
            acc.to_host(s).unwrap(),
            reference::elementwise::add(&a, &b),
            "n={n}"
        );
    }
}

#[test]
fn add_unaligned_pointers_take_the_scalar_path() {
    // Raw launcher on pointers offset by one element (not 16-byte aligned).
    let Some(gpu) = gpu_or_skip("add_unaligned_pointers_take_the_scalar_path") else {
        return;
    };
    let s = gpu.stream();
    let mut r = rng("add_unaligned");
    let n = 1003;
    let a: Vec<f32> = random(&mut r, n + 1);
    let b: Vec<f32> = random(&mut r, n + 1);
    let da = DeviceTensor::from_host(s, &a, &[n + 1]).unwrap();
    let db = DeviceTensor::from_host(s, &b, &[n + 1]).unwrap();
    let mut out = DeviceTensor::filled(s, &[n + 1], f32::NAN).unwrap();
    {
        use fl_kernels::cudarc::driver::{DevicePtr, DevicePtrMut};
        let (pa, _g1) = da.as_slice().device_ptr(s);
        let (pb, _g2) = db.as_slice().device_ptr(s);
        let (po, _g3) = out.as_slice_mut().device_ptr_mut(s);
        // SAFETY: each buffer holds n + 1 f32; offsetting by one leaves n valid elements.
        let st =
            unsafe { fl_kernels_sys_call(pa + 4, pb + 4, po + 4, n as i64, s.cu_stream() as _) };
        assert_eq!(st, 0);
    }
    let got = out.to_host(s).unwrap();
    assert!(got[0].is_nan(), "element before the range was written");
    let want = reference::elementwise::add(&a[1..], &b[1..]);
    assert_eq!(&got[1..], &want[..]);
}

unsafe fn fl_kernels_sys_call(a: u64, b: u64, o: u64, n: i64, s: *mut std::ffi::c_void) -> i32 {
    fl_kernels_sys::fl_add(
        fl_kernels_sys::fl_dtype::FL_DTYPE_F32,
        a as _,
        b as _,
        o as _,
        n,
        s,
    )
}

fn check_cast<S: FloatDType, D: FloatDType>(gpu: &Gpu, n: usize, r: &mut impl rand::Rng) {
    let s = gpu.stream();
    let x: Vec<S> = fl_kernels::testing::random_nonzero(r, n, 1e-4, 300.0);
    let dx = DeviceTensor::from_host(s, &x, &[n]).unwrap();
    let mut dy = DeviceTensor::filled(s, &[n], D::from_f32(f32::NAN)).unwrap();
    elementwise::cast(s, &dx, &mut dy).unwrap();
    let got = dy.to_host(s).unwrap();
    let want = reference::elementwise::cast::<S, D>(&x);
    assert_eq!(
        to_f64(&got),
        to_f64(&want),
        "cast {}->{} n={n}",
        S::NAME,
        D::NAME
    );
}

#[test]
fn cast_matches_reference_every_pair() {
    let Some(gpu) = gpu_or_skip("cast_matches_reference_every_pair") else {
        return;
    };
    let mut r = rng("cast");
    for &n in SIZES {
        check_cast::<f32, f16>(&gpu, n, &mut r);
        check_cast::<f32, bf16>(&gpu, n, &mut r);
        check_cast::<f16, f32>(&gpu, n, &mut r);
        check_cast::<bf16, f32>(&gpu, n, &mut r);
        check_cast::<f16, bf16>(&gpu, n, &mut r);
        check_cast::<bf16, f16>(&gpu, n, &mut r);
        check_cast::<f32, f32>(&gpu, n, &mut r);
    }
}

#[test]
fn prefetch_l2_changes_nothing_and_the_next_kernel_reads_right() {
    // A hint: the buffer's bytes stay what they were, a kernel queued right after it reads
    // them correctly, every size works (partial 16-byte units, several chunks per thread,
    // more chunks than the grid's threads: 64 MB), and too many bytes is an error on `bytes`.
    let Some(gpu) = gpu_or_skip("prefetch_l2_changes_nothing_and_the_next_kernel_reads_right")
    else {
        return;
    };
    let s = gpu.stream();
    let mut r = rng("prefetch");
    for &n in &[1usize, 7, 8, 9, 8193, (1 << 20) + 3, (32 << 20) + 5] {
        let a: Vec<f16> = random(&mut r, n);
        let b: Vec<f16> = random(&mut r, n);
        let da = DeviceTensor::from_host(s, &a, &[n]).unwrap();
        let db = DeviceTensor::from_host(s, &b, &[n]).unwrap();
        // (sizes past a small tensor's end are left out: they are the error case below)
        let sizes = [0, 1, 15, 17, da.num_bytes() / 2, da.num_bytes()];
        for bytes in sizes.into_iter().filter(|&b| b <= da.num_bytes()) {
            elementwise::prefetch_l2(s, &da, bytes).unwrap();
            elementwise::prefetch_l2(s, &db, bytes).unwrap();
        }
        let mut out = DeviceTensor::filled(s, &[n], f16::NAN).unwrap();
        elementwise::add(s, &da, &db, &mut out).unwrap();
        assert_eq!(da.to_host(s).unwrap(), a, "prefetch_l2 changed a (n = {n})");
        assert_eq!(
            to_f64(&out.to_host(s).unwrap()),
            to_f64(&reference::elementwise::add(&a, &b)),
            "add after prefetch_l2, n = {n}"
        );
        match elementwise::prefetch_l2(s, &da, da.num_bytes() + 1) {
            Err(Error::InvalidArgument {
                arg: "bytes",
                reason,
            }) => {
                assert!(reason.contains("exceeds"), "{reason}")
            }
            other => panic!("expected an error on `bytes`, got {other:?}"),
        }
    }
    // Other dtypes (e.g. a quantised layer's raw bytes).
    let q = DeviceTensor::<u8>::filled(s, &[4099], 7).unwrap();
    elementwise::prefetch_l2(s, &q, 4099).unwrap();
    assert!(q.to_host(s).unwrap().iter().all(|&v| v == 7));
    s.synchronize().unwrap();
}

#[test]
fn shape_errors_name_the_argument() {
    let Some(gpu) = gpu_or_skip("shape_errors_name_the_argument") else {
        return;
    };
    let s = gpu.stream();
    let a = DeviceTensor::<f32>::zeros(s, &[4, 8]).unwrap();
    let b = DeviceTensor::<f32>::zeros(s, &[8, 4]).unwrap();
    let mut o = DeviceTensor::<f32>::zeros(s, &[4, 8]).unwrap();
    match elementwise::add(s, &a, &b, &mut o) {
        Err(Error::Shape { arg: "b", .. }) => {}
        other => panic!("expected a shape error on `b`, got {other:?}"),
    }
    let mut o2 = DeviceTensor::<f32>::zeros(s, &[32]).unwrap();
    match elementwise::add(s, &a, &a, &mut o2) {
        Err(Error::Shape { arg: "out", .. }) => {}
        other => panic!("expected a shape error on `out`, got {other:?}"),
    }
    let mut h = DeviceTensor::<f16>::zeros(s, &[3]).unwrap();
    assert!(matches!(
        elementwise::cast(s, &a, &mut h),
        Err(Error::Shape { arg: "dst", .. })
    ));
    // Empty tensors are fine and launch nothing.
    let e = DeviceTensor::<f32>::zeros(s, &[0]).unwrap();
    let mut eo = DeviceTensor::<f32>::zeros(s, &[0]).unwrap();
    elementwise::add(s, &e, &e, &mut eo).unwrap();
}

#[test]
fn add_gpu_proptest() {
    let Some(gpu) = gpu_or_skip("add_gpu_proptest") else {
        return;
    };
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    });
    runner
        .run(&(strategies::length(300_000), any::<u64>()), |(n, seed)| {
            use rand::SeedableRng;
            let mut r = rand::rngs::StdRng::seed_from_u64(seed);
            check_add::<bf16>(&gpu, n, &mut r);
            check_add::<f32>(&gpu, n, &mut r);
            Ok(())
        })
        .unwrap();
}

// ---- reference properties (CPU only, run in CI) ----
proptest! {
    #[test]
    fn reference_add_is_commutative_and_exact_in_f32(n in strategies::length(2000), seed in any::<u64>()) {
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let a: Vec<f32> = random(&mut r, n);
        let b: Vec<f32> = random(&mut r, n);
        let ab = reference::elementwise::add(&a, &b);
        prop_assert_eq!(&ab, &reference::elementwise::add(&b, &a));
        for i in 0..n { prop_assert_eq!(ab[i], a[i] + b[i]); }
    }

    #[test]
    fn reference_cast_roundtrip_is_within_half_an_ulp(x in strategies::values(64)) {
        let h: Vec<f16> = reference::elementwise::cast(&x);
        let back: Vec<f32> = reference::elementwise::cast(&h);
        for (a, b) in x.iter().zip(&back) {
            prop_assert!(((a - b) / a).abs() <= f16::EPS as f32 * 1.0001, "{a} -> {b}");
        }
        let w: Vec<bf16> = reference::elementwise::cast(&x);
        let back: Vec<f32> = reference::elementwise::cast(&w);
        for (a, b) in x.iter().zip(&back) {
            prop_assert!(((a - b) / a).abs() <= bf16::EPS as f32 * 1.0001, "{a} -> {b}");
        }
    }
}

#[test]
fn rel_l2_flags_nan_and_measures_error() {
    assert_eq!(rel_l2(&[1.0f32, 2.0], &[1.0, 2.0]), 0.0);
    assert!(rel_l2(&[f32::NAN, 2.0], &[1.0, 2.0]).is_infinite());
    let e = rel_l2(&[1.1f32, 2.0], &[1.0, 2.0]);
    assert!((e - 0.1 / 5f64.sqrt()).abs() < 1e-6);
}
