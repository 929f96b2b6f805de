//! attention_prefill::prefill on the GPU against reference::attention_prefill::prefill (f64):
//! GQA ratios 1/4/8/32, single sequences of odd lengths, ragged batches, windows, every
//! instantiated head_dim, f16, bf16 and f32 (rel L2 < 1e-5, the DESIGN.md fp32 bound), the
//! 16-bit cases on both kernels (the automatic choice, which is the wgmma kernel at head_dim
//! 128 on Hopper, and the mma.sync kernel forced); argument errors; reference properties on
//! the CPU.

use fl_kernels::attention_prefill::{self, PrefillKernel, PrefillParams, PREFILL_HEAD_DIMS};
use fl_kernels::testing::{gpu_or_skip, rel_l2, rng, to_f64};
use fl_kernels::{bf16, f16, reference, DeviceTensor, Error, FloatDType, Gpu};
use rand::Rng;

struct Case {
    hq: usize,
    hkv: usize,
    d: usize,
    lens: Vec<usize>,
    window: usize,
    kernel: PrefillKernel,
}

fn cu_of(lens: &[usize]) -> Vec<usize> {
    let mut cu = vec![0usize];
    for &l in lens {
        cu.push(cu.last().copied().unwrap_or(0) + l);
    }
    cu
}

fn run_case<T: FloatDType>(gpu: &Gpu, c: &Case, r: &mut impl Rng) -> f64 {
    let s = gpu.stream();
    let cu = cu_of(&c.lens);
    let total = *cu.last().unwrap();
    let (hq, hkv, d) = (c.hq, c.hkv, c.d);
    let q: Vec<T> = fl_kernels::testing::random(r, total * hq * d);
    let k: Vec<T> = fl_kernels::testing::random(r, total * hkv * d);
    let v: Vec<T> = fl_kernels::testing::random(r, total * hkv * d);
    let scale = 1.0 / (d as f32).sqrt();
    let want = reference::attention_prefill::prefill(
        &to_f64(&q),
        &to_f64(&k),
        &to_f64(&v),
        &cu,
        hq,
        hkv,
        d,
        scale as f64,
        c.window,
    );
    let dq = DeviceTensor::from_host(s, &q, &[total, hq, d]).unwrap();
    let dk = DeviceTensor::from_host(s, &k, &[total, hkv, d]).unwrap();
    let dv = DeviceTensor::from_host(s, &v, &[total, hkv, d]).unwrap();
    let cu32: Vec<i32> = cu.iter().map(|&x| x as i32).collect();
    let dcu = DeviceTensor::from_host(s, &cu32, &[cu.len()]).unwrap();
    let params = PrefillParams {
        scale,
        max_seq_len: c.lens.iter().copied().max().unwrap_or(1).max(1),
        window: if c.window > 0 { Some(c.window) } else { None },
    };
    let mut out = DeviceTensor::filled(s, &[total, hq, d], T::from_f32(f32::NAN)).unwrap();
    attention_prefill::prefill_with_kernel(s, &dq, &dk, &dv, &dcu, &mut out, &params, c.kernel)
        .unwrap();
    let got = out.to_host(s).unwrap();
    rel_l2(&got, &want)
}

fn tol<T: FloatDType>() -> f64 {
    // Expected ~2e-4 (f16) / ~2e-3 (bf16): P is rounded to 16 bits for the PV product.
    // f32: all in f32; the largest term is the running sum of up to 4k weighted values per
    // output, ~0.4 * 2^-24 * sqrt(n) of its value for random signs (~1.5e-6 at n = 4095).
    match T::NAME {
        "f32" => 1e-5,
        "f16" => 2e-3,
        _ => 1e-2,
    }
}

fn check<T: FloatDType>(gpu: &Gpu, c: &Case, r: &mut impl Rng) {
    let err = run_case::<T>(gpu, c, r);
    let tol = tol::<T>();
    assert!(
        err < tol,
        "prefill<{}> hq={} hkv={} d={} lens={:?} window={} {:?}: rel L2 {err:e}",
        T::NAME,
        c.hq,
        c.hkv,
        c.d,
        c.lens,
        c.window,
        c.kernel
    );
}

fn case(hq: usize, hkv: usize, d: usize, lens: Vec<usize>) -> Case {
    Case {
        hq,
        hkv,
        d,
        lens,
        window: 0,
        kernel: PrefillKernel::Auto,
    }
}

/// `c` on the given kernel.
fn on(kernel: PrefillKernel, c: Case) -> Case {
    Case { kernel, ..c }
}

#[test]
fn prefill_gqa_ratios_and_odd_lengths() {
    let Some(gpu) = gpu_or_skip("prefill_gqa_ratios_and_odd_lengths") else {
        return;
    };
    let mut r = rng("prefill_gqa");
    for kernel in PrefillKernel::ALL {
        for &(hq, hkv) in &[(4usize, 4usize), (8, 2), (16, 2), (32, 1)] {
            for &len in &[1usize, 7, 129] {
                check::<f16>(&gpu, &on(kernel, case(hq, hkv, 128, vec![len])), &mut r);
                check::<bf16>(&gpu, &on(kernel, case(hq, hkv, 128, vec![len])), &mut r);
            }
        }
        // One long sequence; two heads keep the f64 reference affordable.
        check::<f16>(&gpu, &on(kernel, case(2, 1, 128, vec![4095])), &mut r);
        check::<bf16>(&gpu, &on(kernel, case(2, 2, 64, vec![4095])), &mut r);
    }
}

#[test]
fn prefill_ragged_batch_every_head_dim() {
    let Some(gpu) = gpu_or_skip("prefill_ragged_batch_every_head_dim") else {
        return;
    };
    let mut r = rng("prefill_ragged");
    for kernel in PrefillKernel::ALL {
        for &d in &PREFILL_HEAD_DIMS {
            check::<f16>(
                &gpu,
                &on(kernel, case(8, 2, d, vec![1, 7, 129, 300, 64])),
                &mut r,
            );
            check::<bf16>(&gpu, &on(kernel, case(4, 4, d, vec![64, 1, 257])), &mut r);
        }
        check::<f16>(
            &gpu,
            &on(kernel, case(32, 8, 128, vec![1, 7, 129, 300, 64])),
            &mut r,
        );
    }
}

#[test]
fn prefill_sliding_window() {
    let Some(gpu) = gpu_or_skip("prefill_sliding_window") else {
        return;
    };
    let mut r = rng("prefill_window");
    for kernel in PrefillKernel::ALL {
        for &w in &[1usize, 5, 64, 100, 5000] {
            let mut c = on(kernel, case(8, 2, 128, vec![500, 77, 1]));
            c.window = w;
            check::<bf16>(&gpu, &c, &mut r);
            let mut c = on(kernel, case(4, 4, 64, vec![300]));
            c.window = w;
            check::<f16>(&gpu, &c, &mut r);
        }
    }
}

#[test]
fn prefill_f32_gqa_ratios_and_odd_lengths() {
    let Some(gpu) = gpu_or_skip("prefill_f32_gqa_ratios_and_odd_lengths") else {
        return;
    };
    let mut r = rng("prefill_f32_gqa");
    for &(hq, hkv) in &[(4usize, 4usize), (12, 4), (16, 4), (16, 2), (32, 1)] {
        for &len in &[1usize, 7, 129] {
            check::<f32>(&gpu, &case(hq, hkv, 128, vec![len]), &mut r);
        }
    }
    check::<f32>(&gpu, &case(2, 1, 128, vec![4095]), &mut r);
    check::<f32>(&gpu, &case(2, 2, 64, vec![4095]), &mut r);
    check::<f32>(&gpu, &case(2, 1, 256, vec![4095]), &mut r);
}

#[test]
fn prefill_f32_ragged_batch_every_head_dim_and_window() {
    let Some(gpu) = gpu_or_skip("prefill_f32_ragged_batch_every_head_dim_and_window") else {
        return;
    };
    let mut r = rng("prefill_f32_ragged");
    for &d in &PREFILL_HEAD_DIMS {
        check::<f32>(&gpu, &case(8, 2, d, vec![1, 7, 129, 300, 64]), &mut r);
        check::<f32>(&gpu, &case(4, 4, d, vec![64, 1, 257]), &mut r);
        check::<f32>(&gpu, &case(16, 2, d, vec![33, 2, 31, 32]), &mut r);
    }
    for &w in &[1usize, 5, 16, 64, 100, 5000] {
        let mut c = case(8, 2, 128, vec![500, 77, 1]);
        c.window = w;
        check::<f32>(&gpu, &c, &mut r);
        let mut c = case(4, 4, 256, vec![300]);
        c.window = w;
        check::<f32>(&gpu, &c, &mut r);
    }
}

#[test]
fn prefill_never_writes_outside_sequences() {
    let Some(gpu) = gpu_or_skip("prefill_never_writes_outside_sequences") else {
        return;
    };
    for kernel in PrefillKernel::ALL {
        for d in [64, 128] {
            never_writes_outside::<f16>(&gpu, d, kernel);
        }
    }
    never_writes_outside::<f32>(&gpu, 64, PrefillKernel::Auto);
}

fn never_writes_outside<T: FloatDType>(gpu: &Gpu, d: usize, kernel: PrefillKernel) {
    // cu_seqlens covers tokens 0..10 only (and holds an inverted and an oversized range):
    // tokens 10.. keep their poison; nothing is read or written out of bounds.
    let s = gpu.stream();
    let (total, hq, hkv) = (40usize, 4usize, 2usize);
    let mut r = rng("prefill_outside");
    let q: Vec<T> = fl_kernels::testing::random(&mut r, total * hq * d);
    let k: Vec<T> = fl_kernels::testing::random(&mut r, total * hkv * d);
    let dq = DeviceTensor::from_host(s, &q, &[total, hq, d]).unwrap();
    let dk = DeviceTensor::from_host(s, &k, &[total, hkv, d]).unwrap();
    let dcu = DeviceTensor::from_host(s, &[0i32, 10, 5, 1000], &[4]).unwrap();
    let mut out = DeviceTensor::filled(s, &[total, hq, d], T::from_f32(f32::NAN)).unwrap();
    let p = PrefillParams::new(d, total);
    attention_prefill::prefill_with_kernel(s, &dq, &dk, &dk, &dcu, &mut out, &p, kernel).unwrap();
    let got = out.to_host(s).unwrap();
    let row = hq * d;
    let what = format!("{} d={d} {kernel:?}", T::NAME);
    assert!(
        got[..10 * row].iter().all(|x| x.to_f32().is_finite()),
        "{what}"
    );
    // [10, 5) is empty; [5, 1000) is clamped to [5, 40): those rows are written too.
    assert!(
        got[10 * row..].iter().all(|x| x.to_f32().is_finite()),
        "{what}"
    );
    let dcu = DeviceTensor::from_host(s, &[0i32, 10], &[2]).unwrap();
    let mut out = DeviceTensor::filled(s, &[total, hq, d], T::from_f32(f32::NAN)).unwrap();
    attention_prefill::prefill_with_kernel(s, &dq, &dk, &dk, &dcu, &mut out, &p, kernel).unwrap();
    let got = out.to_host(s).unwrap();
    assert!(
        got[..10 * row].iter().all(|x| x.to_f32().is_finite()),
        "{what}"
    );
    assert!(
        got[10 * row..].iter().all(|x| x.to_f32().is_nan()),
        "{what}"
    );
}

#[test]
fn prefill_bad_arguments_are_named() {
    let Some(gpu) = gpu_or_skip("prefill_bad_arguments_are_named") else {
        return;
    };
    let s = gpu.stream();
    let q = DeviceTensor::<f16>::zeros(s, &[16, 8, 128]).unwrap();
    let k3 = DeviceTensor::<f16>::zeros(s, &[16, 3, 128]).unwrap();
    let k = DeviceTensor::<f16>::zeros(s, &[16, 2, 128]).unwrap();
    let v = DeviceTensor::<f16>::zeros(s, &[16, 2, 128]).unwrap();
    let cu = DeviceTensor::from_host(s, &[0i32, 16], &[2]).unwrap();
    let mut out = DeviceTensor::<f16>::zeros(s, &[16, 8, 128]).unwrap();
    let p = PrefillParams::new(128, 16);
    let named = |e: Error, want: &str| match &e {
        Error::Shape { arg, .. } | Error::InvalidArgument { arg, .. } => {
            assert_eq!(*arg, want, "{e}")
        }
        _ => panic!("unexpected {e}"),
    };
    // 8 q heads over 3 kv heads
    named(
        attention_prefill::prefill(s, &q, &k3, &k3, &cu, &mut out, &p).unwrap_err(),
        "k",
    );
    let v2 = DeviceTensor::<f16>::zeros(s, &[16, 1, 128]).unwrap();
    named(
        attention_prefill::prefill(s, &q, &k, &v2, &cu, &mut out, &p).unwrap_err(),
        "v",
    );
    let k15 = DeviceTensor::<f16>::zeros(s, &[15, 2, 128]).unwrap();
    named(
        attention_prefill::prefill(s, &q, &k15, &k15, &cu, &mut out, &p).unwrap_err(),
        "k",
    );
    let q100 = DeviceTensor::<f16>::zeros(s, &[16, 8, 100]).unwrap();
    named(
        attention_prefill::prefill(s, &q100, &k, &v, &cu, &mut out, &p).unwrap_err(),
        "q",
    );
    let mut out2 = DeviceTensor::<f16>::zeros(s, &[16, 4, 128]).unwrap();
    named(
        attention_prefill::prefill(s, &q, &k, &v, &cu, &mut out2, &p).unwrap_err(),
        "out",
    );
    let cu1 = DeviceTensor::from_host(s, &[0i32], &[1]).unwrap();
    named(
        attention_prefill::prefill(s, &q, &k, &v, &cu1, &mut out, &p).unwrap_err(),
        "cu_seqlens",
    );
    for bad in [0usize, 17] {
        let pb = PrefillParams {
            max_seq_len: bad,
            ..p
        };
        named(
            attention_prefill::prefill(s, &q, &k, &v, &cu, &mut out, &pb).unwrap_err(),
            "params.max_seq_len",
        );
    }
    for scale in [0.0f32, -1.0, f32::NAN, f32::INFINITY] {
        let pb = PrefillParams { scale, ..p };
        named(
            attention_prefill::prefill(s, &q, &k, &v, &cu, &mut out, &pb).unwrap_err(),
            "params.scale",
        );
    }
    let pb = PrefillParams {
        window: Some(0),
        ..p
    };
    named(
        attention_prefill::prefill(s, &q, &k, &v, &cu, &mut out, &pb).unwrap_err(),
        "params.window",
    );
}

#[test]
fn prefill_gpu_proptest() {
    let Some(gpu) = gpu_or_skip("prefill_gpu_proptest") else {
        return;
    };
    use proptest::prelude::*;
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    });
    let strat = (
        prop::sample::select(vec![(1usize, 1usize), (4, 1), (8, 8), (12, 4), (32, 4)]),
        prop::sample::select(PREFILL_HEAD_DIMS.to_vec()),
        proptest::collection::vec(1usize..400, 1..5),
        prop::option::of(1usize..300),
        0u8..3,
        any::<bool>(),
        any::<u64>(),
    );
    runner
        .run(
            &strat,
            |((hq, hkv), d, lens, window, dtype, mma_sync, seed)| {
                use rand::SeedableRng;
                let mut r = rand::rngs::StdRng::seed_from_u64(seed);
                let c = Case {
                    hq,
                    hkv,
                    d,
                    lens,
                    window: window.unwrap_or(0),
                    kernel: if mma_sync {
                        PrefillKernel::MmaSync
                    } else {
                        PrefillKernel::Auto
                    },
                };
                let (err, tol) = match dtype {
                    0 => (run_case::<f16>(&gpu, &c, &mut r), 1e-2),
                    1 => (run_case::<bf16>(&gpu, &c, &mut r), 1e-2),
                    _ => (run_case::<f32>(&gpu, &c, &mut r), tol::<f32>()),
                };
                prop_assert!(err < tol, "dtype {dtype} {:?}: rel L2 {err:e}", c.kernel);
                Ok(())
            },
        )
        .unwrap();
}

// ---- reference properties (CPU) ----

mod reference_props {
    use super::{cu_of, reference};
    use proptest::prelude::{any, prop_assert, prop_assert_eq, proptest, ProptestConfig, Strategy};
    use rand::Rng;

    fn vals(n: usize) -> impl Strategy<Value = Vec<f64>> {
        proptest::collection::vec(-2.0f64..2.0, n)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        // The first token of every sequence sees only itself: its output is v of key 0.
        #[test]
        fn first_token_returns_its_value(
            lens in proptest::collection::vec(1usize..6, 1..4),
            seed in any::<u64>(),
        ) {
            use rand::SeedableRng;
            let mut r = rand::rngs::StdRng::seed_from_u64(seed);
            let (hq, hkv, d) = (4usize, 2usize, 3usize);
            let cu = cu_of(&lens);
            let total = *cu.last().unwrap();
            let q: Vec<f64> = (0..total * hq * d).map(|_| r.random_range(-1.0..1.0)).collect();
            let k: Vec<f64> = (0..total * hkv * d).map(|_| r.random_range(-1.0..1.0)).collect();
            let v: Vec<f64> = (0..total * hkv * d).map(|_| r.random_range(-1.0..1.0)).collect();
            let o = reference::attention_prefill::prefill(&q, &k, &v, &cu, hq, hkv, d, 0.7, 0);
            for &s0 in &cu[..lens.len()] {
                for h in 0..hq {
                    for e in 0..d {
                        let got = o[(s0 * hq + h) * d + e];
                        let want = v[(s0 * hkv + h / 2) * d + e];
                        prop_assert!((got - want).abs() < 1e-12);
                    }
                }
            }
        }

        // Equal keys give uniform weights: output i is the mean of v[0..=i] (or of the
        // window), whatever q is.
        #[test]
        fn uniform_scores_average_values(
            len in 1usize..12, window in 0usize..5, q in vals(12 * 2), v in vals(12 * 2),
        ) {
            let d = 2;
            let k = vec![0.5f64; len * d];
            let q = &q[..len * d];
            let v = &v[..len * d];
            let o = reference::attention_prefill::prefill(q, &k, v, &[0, len], 1, 1, d, 1.0, window);
            for i in 0..len {
                let lo = if window > 0 { (i + 1).saturating_sub(window) } else { 0 };
                for e in 0..d {
                    let mean = (lo..=i).map(|j| v[j * d + e]).sum::<f64>() / (i + 1 - lo) as f64;
                    prop_assert!((o[i * d + e] - mean).abs() < 1e-12);
                }
            }
        }

        // Causality: changing the keys and values at positions > p does not change the
        // outputs at positions <= p; nor does another sequence of the batch.
        #[test]
        fn future_and_other_sequences_do_not_leak(
            len in 2usize..10, p_frac in 0.0f64..1.0, seed in any::<u64>(),
        ) {
            use rand::SeedableRng;
            let mut r = rand::rngs::StdRng::seed_from_u64(seed);
            let (hq, hkv, d) = (2usize, 1usize, 4usize);
            let total = 2 * len;
            let cu = [0, len, total];
            let p = ((len - 1) as f64 * p_frac) as usize;
            let q: Vec<f64> = (0..total * hq * d).map(|_| r.random_range(-1.0..1.0)).collect();
            let k: Vec<f64> = (0..total * hkv * d).map(|_| r.random_range(-1.0..1.0)).collect();
            let v: Vec<f64> = (0..total * hkv * d).map(|_| r.random_range(-1.0..1.0)).collect();
            let a = reference::attention_prefill::prefill(&q, &k, &v, &cu, hq, hkv, d, 0.5, 0);
            let (mut k2, mut v2) = (k.clone(), v.clone());
            // future keys of sequence 0 and everything of sequence 1
            for x in k2[(p + 1) * hkv * d..].iter_mut() { *x = -*x * 3.0 + 0.25; }
            for x in v2[(p + 1) * hkv * d..].iter_mut() { *x += 1.0; }
            let b = reference::attention_prefill::prefill(&q, &k2, &v2, &cu, hq, hkv, d, 0.5, 0);
            let n = (p + 1) * hq * d;
            prop_assert_eq!(&a[..n], &b[..n]);
            prop_assert!(a[n..] != b[n..]);
        }
    }
}
