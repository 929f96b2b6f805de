//! attention_prefill::prefill_bidirectional (non-causal, packed ragged sequences) on the GPU
//! against reference::attention_prefill::prefill_bidirectional (f64): every instantiated
//! head_dim (32, 64, 128), ragged batches with lengths 1, odd ones, tile edges (63 / 64 / 65,
//! 127 / 128 / 129) and a long one, BERT shapes (12 heads of 64, MiniLM's 12 of 32), GQA and
//! MQA, f16 / bf16 / f32 (rel L2 < 1e-5), the 16-bit cases on both kernels (the automatic
//! choice: wgmma at head_dim 128 on Hopper; mma.sync forced), outputs poisoned with NaN
//! first; the last token of each sequence equal to the causal prefill's (it sees every key
//! in both); rows outside every sequence never written; argument errors; a proptest over
//! shapes. On the CPU: the reference against a naive per-row formula, key-order invariance,
//! no leak across sequences, and the FLOP count.
use fl_kernels::attention_prefill::{
    self, BidirectionalPrefillParams, PrefillKernel, PrefillParams, PREFILL_BIDIRECTIONAL_HEAD_DIMS,
};
use fl_kernels::testing::{gpu_or_skip, rel_l2, rng, to_f64};
use fl_kernels::{bf16, f16, reference, DeviceTensor, Error, FloatDType, Gpu};
use rand::Rng;

struct Case {
    hq: usize,
    hkv: usize,
    d: usize,
    lens: Vec<usize>,
    kernel: PrefillKernel,
}

fn case(hq: usize, hkv: usize, d: usize, lens: Vec<usize>, kernel: PrefillKernel) -> Case {
    Case {
        hq,
        hkv,
        d,
        lens,
        kernel,
    }
}

fn cu_of(lens: &[usize]) -> Vec<usize> {
    let mut cu = vec![0usize];
    for &l in lens {
        cu.push(cu.last().copied().unwrap_or(0) + l);
    }
    cu
}

/// Runs `c` on the GPU (output poisoned with NaN first); returns the output and the f64
/// reference.
fn run_case<T: FloatDType>(gpu: &Gpu, c: &Case, r: &mut impl Rng) -> (Vec<T>, Vec<f64>) {
    let s = gpu.stream();
    let cu = cu_of(&c.lens);
    let total = *cu.last().unwrap();
    let (hq, hkv, d) = (c.hq, c.hkv, c.d);
    let q: Vec<T> = fl_kernels::testing::random(r, total * hq * d);
    let k: Vec<T> = fl_kernels::testing::random(r, total * hkv * d);
    let v: Vec<T> = fl_kernels::testing::random(r, total * hkv * d);
    let scale = 1.0 / (d as f32).sqrt();
    let want = reference::attention_prefill::prefill_bidirectional(
        &to_f64(&q),
        &to_f64(&k),
        &to_f64(&v),
        &cu,
        hq,
        hkv,
        d,
        scale as f64,
    );
    let dq = DeviceTensor::from_host(s, &q, &[total, hq, d]).unwrap();
    let dk = DeviceTensor::from_host(s, &k, &[total, hkv, d]).unwrap();
    let dv = DeviceTensor::from_host(s, &v, &[total, hkv, d]).unwrap();
    let cu32: Vec<i32> = cu.iter().map(|&x| x as i32).collect();
    let dcu = DeviceTensor::from_host(s, &cu32, &[cu.len()]).unwrap();
    let params = BidirectionalPrefillParams {
        scale,
        max_seq_len: c.lens.iter().copied().max().unwrap_or(1).max(1),
    };
    let mut out = DeviceTensor::filled(s, &[total, hq, d], T::from_f32(f32::NAN)).unwrap();
    attention_prefill::prefill_bidirectional_with_kernel(
        s, &dq, &dk, &dv, &dcu, &mut out, &params, c.kernel,
    )
    .unwrap();
    (out.to_host(s).unwrap(), want)
}

fn tol<T: FloatDType>() -> f64 {
    // As the causal prefill's tests: P is rounded to 16 bits for the PV product; f32 is all
    // f32 (DESIGN.md's bound).
    match T::NAME {
        "f32" => 1e-5,
        "f16" => 2e-3,
        _ => 1e-2,
    }
}

fn check<T: FloatDType>(gpu: &Gpu, c: &Case, r: &mut impl Rng) {
    let (got, want) = run_case::<T>(gpu, c, r);
    let err = rel_l2(&got, &want);
    assert!(
        err < tol::<T>(),
        "prefill_bidirectional<{}> hq={} hkv={} d={} lens={:?} {:?}: rel L2 {err:e}",
        T::NAME,
        c.hq,
        c.hkv,
        c.d,
        c.lens,
        c.kernel
    );
}

#[test]
fn bidirectional_ragged_batch_every_head_dim() {
    let Some(gpu) = gpu_or_skip("bidirectional_ragged_batch_every_head_dim") else {
        return;
    };
    let mut r = rng("bidirectional_ragged");
    for kernel in PrefillKernel::ALL {
        for &d in &PREFILL_BIDIRECTIONAL_HEAD_DIMS {
            let lens = vec![1, 7, 129, 300, 64, 1];
            check::<f16>(&gpu, &case(8, 2, d, lens, kernel), &mut r);
            check::<bf16>(&gpu, &case(4, 4, d, vec![64, 1, 257], kernel), &mut r);
            // key-tile edges of both kernels (64-key tiles; 128-key wgmma tiles)
            let edges = vec![63, 64, 65, 127, 128, 129, 2];
            check::<f16>(&gpu, &case(2, 1, d, edges, kernel), &mut r);
        }
        // BERT-base (12 x 64) and MiniLM (12 x 32) over a ragged batch; GQA 32/8 and MQA at 128.
        let bert = vec![128, 77, 5, 1, 100, 33];
        check::<f16>(&gpu, &case(12, 12, 64, bert.clone(), kernel), &mut r);
        check::<bf16>(&gpu, &case(12, 12, 32, bert, kernel), &mut r);
        check::<f16>(
            &gpu,
            &case(32, 8, 128, vec![1, 7, 129, 300], kernel),
            &mut r,
        );
        check::<bf16>(&gpu, &case(16, 1, 128, vec![200, 3], kernel), &mut r);
        // one long sequence; two heads keep the f64 reference affordable
        check::<f16>(&gpu, &case(2, 1, 64, vec![2049], kernel), &mut r);
    }
}

#[test]
fn bidirectional_f32_every_head_dim() {
    let Some(gpu) = gpu_or_skip("bidirectional_f32_every_head_dim") else {
        return;
    };
    let mut r = rng("bidirectional_f32");
    let auto = PrefillKernel::Auto;
    for &d in &PREFILL_BIDIRECTIONAL_HEAD_DIMS {
        check::<f32>(&gpu, &case(8, 2, d, vec![1, 7, 129, 300, 64], auto), &mut r);
        check::<f32>(&gpu, &case(4, 4, d, vec![31, 32, 33, 1], auto), &mut r);
        check::<f32>(&gpu, &case(12, 12, d, vec![128, 77, 5], auto), &mut r);
    }
    check::<f32>(&gpu, &case(2, 1, 128, vec![2049], auto), &mut r);
}

/// The last token of a sequence sees every key in both modes: its rows equal the causal
/// prefill's on the same kernel (same tiles, same order of key tiles).
#[test]
fn bidirectional_last_token_equals_causal() {
    let Some(gpu) = gpu_or_skip("bidirectional_last_token_equals_causal") else {
        return;
    };
    let s = gpu.stream();
    let mut r = rng("bidirectional_last_token");
    let lens = [1usize, 70, 129, 5];
    let cu = cu_of(&lens);
    let total = *cu.last().unwrap();
    for kernel in PrefillKernel::ALL {
        for &d in &[64usize, 128] {
            let (hq, hkv) = (8usize, 2usize);
            let q: Vec<f16> = fl_kernels::testing::random(&mut r, total * hq * d);
            let k: Vec<f16> = fl_kernels::testing::random(&mut r, total * hkv * d);
            let v: Vec<f16> = fl_kernels::testing::random(&mut r, total * hkv * d);
            let dq = DeviceTensor::from_host(s, &q, &[total, hq, d]).unwrap();
            let dk = DeviceTensor::from_host(s, &k, &[total, hkv, d]).unwrap();
            let dv = DeviceTensor::from_host(s, &v, &[total, hkv, d]).unwrap();
            let cu32: Vec<i32> = cu.iter().map(|&x| x as i32).collect();
            let dcu = DeviceTensor::from_host(s, &cu32, &[cu.len()]).unwrap();
            let nan = f16::from_f32(f32::NAN);
            let mut bi = DeviceTensor::filled(s, &[total, hq, d], nan).unwrap();
            let mut ca = DeviceTensor::filled(s, &[total, hq, d], nan).unwrap();
            let pb = BidirectionalPrefillParams::new(d, 129);
            let pc = PrefillParams::new(d, 129);
            attention_prefill::prefill_bidirectional_with_kernel(
                s, &dq, &dk, &dv, &dcu, &mut bi, &pb, kernel,
            )
            .unwrap();
            attention_prefill::prefill_with_kernel(s, &dq, &dk, &dv, &dcu, &mut ca, &pc, kernel)
                .unwrap();
            let (bi, ca) = (bi.to_host(s).unwrap(), ca.to_host(s).unwrap());
            let row = hq * d;
            for &end in &cu[1..] {
                let want = to_f64(&ca[(end - 1) * row..end * row]);
                let err = rel_l2(&bi[(end - 1) * row..end * row], &want);
                assert!(
                    err < 2e-3,
                    "d={d} {kernel:?} token {}: rel L2 {err:e}",
                    end - 1
                );
            }
        }
    }
}

#[test]
fn bidirectional_never_writes_outside_sequences() {
    let Some(gpu) = gpu_or_skip("bidirectional_never_writes_outside_sequences") else {
        return;
    };
    for kernel in PrefillKernel::ALL {
        for d in PREFILL_BIDIRECTIONAL_HEAD_DIMS {
            never_writes_outside::<f16>(&gpu, d, kernel);
        }
    }
    never_writes_outside::<f32>(&gpu, 32, PrefillKernel::Auto);
}

fn never_writes_outside<T: FloatDType>(gpu: &Gpu, d: usize, kernel: PrefillKernel) {
    // cu_seqlens covers tokens 0..10 only (and then holds an inverted and an oversized
    // range, clamped to the tensor): nothing is read or written out of bounds, and with only
    // 0..10 covered the rows after it keep their poison.
    let s = gpu.stream();
    let (total, hq, hkv) = (40usize, 4usize, 2usize);
    let mut r = rng("bidirectional_outside");
    let q: Vec<T> = fl_kernels::testing::random(&mut r, total * hq * d);
    let k: Vec<T> = fl_kernels::testing::random(&mut r, total * hkv * d);
    let dq = DeviceTensor::from_host(s, &q, &[total, hq, d]).unwrap();
    let dk = DeviceTensor::from_host(s, &k, &[total, hkv, d]).unwrap();
    let p = BidirectionalPrefillParams::new(d, total);
    let row = hq * d;
    let what = format!("{} d={d} {kernel:?}", T::NAME);
    let dcu = DeviceTensor::from_host(s, &[0i32, 10, 5, 1000], &[4]).unwrap();
    let mut out = DeviceTensor::filled(s, &[total, hq, d], T::from_f32(f32::NAN)).unwrap();
    attention_prefill::prefill_bidirectional_with_kernel(
        s, &dq, &dk, &dk, &dcu, &mut out, &p, kernel,
    )
    .unwrap();
    let got = out.to_host(s).unwrap();
    // [10, 5) is empty; [5, 1000) is clamped to [5, 40): every row is written.
    assert!(got.iter().all(|x| x.to_f32().is_finite()), "{what}");
    let dcu = DeviceTensor::from_host(s, &[0i32, 10], &[2]).unwrap();
    let mut out = DeviceTensor::filled(s, &[total, hq, d], T::from_f32(f32::NAN)).unwrap();
    attention_prefill::prefill_bidirectional_with_kernel(
        s, &dq, &dk, &dk, &dcu, &mut out, &p, kernel,
    )
    .unwrap();
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
fn bidirectional_bad_arguments_are_named() {
    let Some(gpu) = gpu_or_skip("bidirectional_bad_arguments_are_named") else {
        return;
    };
    let s = gpu.stream();
    let q = DeviceTensor::<f16>::zeros(s, &[16, 8, 64]).unwrap();
    let k3 = DeviceTensor::<f16>::zeros(s, &[16, 3, 64]).unwrap();
    let k = DeviceTensor::<f16>::zeros(s, &[16, 2, 64]).unwrap();
    let v = DeviceTensor::<f16>::zeros(s, &[16, 2, 64]).unwrap();
    let cu = DeviceTensor::from_host(s, &[0i32, 16], &[2]).unwrap();
    let mut out = DeviceTensor::<f16>::zeros(s, &[16, 8, 64]).unwrap();
    let p = BidirectionalPrefillParams::new(64, 16);
    let named = |e: Error, want: &str| match &e {
        Error::Shape { arg, .. } | Error::InvalidArgument { arg, .. } => {
            assert_eq!(*arg, want, "{e}")
        }
        _ => panic!("unexpected {e}"),
    };
    let run = |q: &DeviceTensor<f16>,
               k: &DeviceTensor<f16>,
               v: &DeviceTensor<f16>,
               cu: &DeviceTensor<i32>,
               out: &mut DeviceTensor<f16>,
               p: &BidirectionalPrefillParams| {
        attention_prefill::prefill_bidirectional(s, q, k, v, cu, out, p).unwrap_err()
    };
    named(run(&q, &k3, &k3, &cu, &mut out, &p), "k");
    let v1 = DeviceTensor::<f16>::zeros(s, &[16, 1, 64]).unwrap();
    named(run(&q, &k, &v1, &cu, &mut out, &p), "v");
    // 80 and 256 are causal-only head sizes
    for bad_d in [80usize, 256, 16] {
        let qd = DeviceTensor::<f16>::zeros(s, &[16, 8, bad_d]).unwrap();
        let kd = DeviceTensor::<f16>::zeros(s, &[16, 2, bad_d]).unwrap();
        let mut od = DeviceTensor::<f16>::zeros(s, &[16, 8, bad_d]).unwrap();
        let pd = BidirectionalPrefillParams::new(bad_d, 16);
        named(run(&qd, &kd, &kd, &cu, &mut od, &pd), "q");
    }
    let mut out2 = DeviceTensor::<f16>::zeros(s, &[16, 4, 64]).unwrap();
    named(run(&q, &k, &v, &cu, &mut out2, &p), "out");
    let cu1 = DeviceTensor::from_host(s, &[0i32], &[1]).unwrap();
    named(run(&q, &k, &v, &cu1, &mut out, &p), "cu_seqlens");
    for bad in [0usize, 17] {
        let pb = BidirectionalPrefillParams {
            max_seq_len: bad,
            ..p
        };
        named(run(&q, &k, &v, &cu, &mut out, &pb), "params.max_seq_len");
    }
    for scale in [0.0f32, -1.0, f32::NAN, f32::INFINITY] {
        let pb = BidirectionalPrefillParams { scale, ..p };
        named(run(&q, &k, &v, &cu, &mut out, &pb), "params.scale");
    }
}

#[test]
fn bidirectional_gpu_proptest() {
    let Some(gpu) = gpu_or_skip("bidirectional_gpu_proptest") else {
        return;
    };
    use proptest::prelude::*;
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    });
    let strat = (
        prop::sample::select(vec![(1usize, 1usize), (4, 1), (12, 12), (12, 4), (32, 8)]),
        prop::sample::select(PREFILL_BIDIRECTIONAL_HEAD_DIMS.to_vec()),
        proptest::collection::vec(1usize..400, 1..6),
        0u8..3,
        any::<bool>(),
        any::<u64>(),
    );
    runner
        .run(&strat, |((hq, hkv), d, lens, dtype, mma_sync, seed)| {
            use rand::SeedableRng;
            let mut r = rand::rngs::StdRng::seed_from_u64(seed);
            let kernel = if mma_sync {
                PrefillKernel::MmaSync
            } else {
                PrefillKernel::Auto
            };
            let c = case(hq, hkv, d, lens, kernel);
            let err = match dtype {
                0 => {
                    let (g, w) = run_case::<f16>(&gpu, &c, &mut r);
                    rel_l2(&g, &w)
                }
                1 => {
                    let (g, w) = run_case::<bf16>(&gpu, &c, &mut r);
                    rel_l2(&g, &w)
                }
                _ => {
                    let (g, w) = run_case::<f32>(&gpu, &c, &mut r);
                    rel_l2(&g, &w)
                }
            };
            let tol = if dtype == 2 { tol::<f32>() } else { 1e-2 };
            prop_assert!(err < tol, "dtype {dtype} {kernel:?}: rel L2 {err:e}");
            Ok(())
        })
        .unwrap();
}

// ---- reference properties (CPU) ----

mod reference_props {
    use super::{cu_of, reference};
    use fl_kernels::attention_prefill::{prefill_bidirectional_flops, prefill_flops};
    use proptest::prelude::{any, prop_assert, prop_assert_eq, proptest, ProptestConfig};
    use rand::{Rng, SeedableRng};

    fn random(r: &mut impl Rng, n: usize) -> Vec<f64> {
        (0..n).map(|_| r.random_range(-1.0..1.0)).collect()
    }

    /// out[t, h] = Σ_j exp(scale q·k_j) v_j / Σ_j exp(scale q·k_j) over the keys j of t's
    /// sequence, written out per row with no max subtraction (the scores here are small).
    #[allow(clippy::too_many_arguments)]
    fn naive(
        q: &[f64],
        k: &[f64],
        v: &[f64],
        cu: &[usize],
        hq: usize,
        hkv: usize,
        d: usize,
        scale: f64,
    ) -> Vec<f64> {
        let mut out = vec![0f64; q.len()];
        for w in cu.windows(2) {
            for t in w[0]..w[1] {
                for h in 0..hq {
                    let kvh = h / (hq / hkv);
                    let (mut num, mut den) = (vec![0f64; d], 0f64);
                    for j in w[0]..w[1] {
                        let dot: f64 = (0..d)
                            .map(|e| q[(t * hq + h) * d + e] * k[(j * hkv + kvh) * d + e])
                            .sum();
                        let wt = (scale * dot).exp();
                        den += wt;
                        for (e, n) in num.iter_mut().enumerate() {
                            *n += wt * v[(j * hkv + kvh) * d + e];
                        }
                    }
                    for e in 0..d {
                        out[(t * hq + h) * d + e] = num[e] / den;
                    }
                }
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        // The reference equals the naive formula on ragged batches, MHA / GQA / MQA.
        #[test]
        fn reference_matches_naive_formula(
            lens in proptest::collection::vec(1usize..9, 1..5),
            heads in proptest::sample::select(vec![(1usize, 1usize), (4, 2), (4, 1), (3, 3)]),
            d in 1usize..6, seed in any::<u64>(),
        ) {
            let mut r = rand::rngs::StdRng::seed_from_u64(seed);
            let (hq, hkv) = heads;
            let cu = cu_of(&lens);
            let total = *cu.last().unwrap();
            let q = random(&mut r, total * hq * d);
            let k = random(&mut r, total * hkv * d);
            let v = random(&mut r, total * hkv * d);
            let got = reference::attention_prefill::prefill_bidirectional(
                &q, &k, &v, &cu, hq, hkv, d, 0.8);
            let want = naive(&q, &k, &v, &cu, hq, hkv, d, 0.8);
            for (x, y) in got.iter().zip(&want) {
                prop_assert!((x - y).abs() < 1e-12, "{x} vs {y}");
            }
            // The last token of each sequence sees every key in the causal reference too.
            let causal = reference::attention_prefill::prefill(&q, &k, &v, &cu, hq, hkv, d, 0.8, 0);
            for &end in &cu[1..] {
                let rows = (end - 1) * hq * d..end * hq * d;
                for (x, y) in got[rows.clone()].iter().zip(&causal[rows]) {
                    prop_assert!((x - y).abs() < 1e-12);
                }
            }
        }

        // Non-causal attention does not see key order: permuting the keys (with their
        // values) of a sequence leaves every output of the batch unchanged; changing another
        // sequence's keys and values leaves this one's outputs unchanged.
        #[test]
        fn key_order_and_other_sequences_do_not_matter(
            len in 2usize..10, other in 1usize..6, seed in any::<u64>(),
        ) {
            let mut r = rand::rngs::StdRng::seed_from_u64(seed);
            let (hq, hkv, d) = (2usize, 1usize, 4usize);
            let cu = [0, len, len + other];
            let total = len + other;
            let q = random(&mut r, total * hq * d);
            let k = random(&mut r, total * hkv * d);
            let v = random(&mut r, total * hkv * d);
            let bi = |k: &[f64], v: &[f64]| reference::attention_prefill::prefill_bidirectional(
                &q, k, v, &cu, hq, hkv, d, 0.5);
            let a = bi(&k, &v);
            // reverse the keys and values of sequence 0
            let (mut k2, mut v2) = (k.clone(), v.clone());
            let row = hkv * d;
            for j in 0..len {
                let (dst, src) = (j * row, (len - 1 - j) * row);
                k2[dst..dst + row].copy_from_slice(&k[src..src + row]);
                v2[dst..dst + row].copy_from_slice(&v[src..src + row]);
            }
            let b = bi(&k2, &v2);
            for (x, y) in a.iter().zip(&b) {
                prop_assert!((x - y).abs() < 1e-12);
            }
            // change everything of sequence 1
            let (mut k3, mut v3) = (k.clone(), v.clone());
            for x in k3[len * row..].iter_mut() { *x = -*x * 3.0 + 0.25; }
            for x in v3[len * row..].iter_mut() { *x += 1.0; }
            let c = bi(&k3, &v3);
            let n = len * hq * d;
            prop_assert_eq!(&a[..n], &c[..n]);
            prop_assert!(a[n..] != c[n..]);
        }

        // Every (query, key) pair of a sequence counted once: L² pairs, which is the causal
        // count L (L + 1) / 2 twice less the diagonal.
        #[test]
        fn flops_count_every_pair(
            lens in proptest::collection::vec(0usize..5000, 1..8),
            hq in 1usize..64, d in proptest::sample::select(vec![32usize, 64, 128]),
        ) {
            let diag: u64 = lens.iter().map(|&l| l as u64).sum::<u64>() * 4 * (hq * d) as u64;
            prop_assert_eq!(
                prefill_bidirectional_flops(&lens, hq, d),
                2 * prefill_flops(&lens, hq, d) - diag
            );
            let l = lens[0] as u64;
            prop_assert_eq!(prefill_bidirectional_flops(&lens[..1], hq, d), 4 * (hq * d) as u64 * l * l);
        }
    }
}
