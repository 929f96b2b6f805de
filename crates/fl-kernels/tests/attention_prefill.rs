//! attention_prefill::prefill on the GPU against reference::attention_prefill::prefill (f64):
//! GQA ratios 1/4/8/32, single sequences of odd lengths, ragged batches, windows, every
//! instantiated head_dim, f16, bf16 and f32 (rel L2 < 1e-5, the DESIGN.md fp32 bound), the
//! 16-bit cases on both kernels (the automatic choice, which is the wgmma kernel at head_dim
//! 128 on Hopper, and the mma.sync kernel forced); argument errors; reference properties on
//! the CPU.
//!
//! attention_prefill::prefill_paged against reference::attention_prefill::prefill_paged:
//! ragged prefixes (0 to several blocks, not block-aligned), odd block counts, q_len 0 and 1
//! and long chunks, permuted block tables with garbage past each sequence's blocks, unused
//! cache slots and output rows poisoned with NaN, block sizes 16 / 32 / 64 / 128 and 24, the
//! contiguous cache, GQA 32/8 and MHA, every head_dim, f16 / bf16 / f32, windows; two
//! chunks (and a shared-prefix batch) against the one-pass prefill; bad tables and
//! context lengths; argument errors; a proptest over shapes.
use fl_kernels::attention::KvCache;
use fl_kernels::attention_prefill::{
    self, PagedPrefillParams, PrefillKernel, PrefillParams, PREFILL_HEAD_DIMS,
};
use fl_kernels::reference::attention_prefill::PagedKv;
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

// ---- paged prefill ----

/// One paged-prefill case: sequence `b` has `q_lens[b]` new tokens over `prefix[b]` cached
/// ones (ctx = prefix + q_len).
#[derive(Debug, Clone)]
struct PagedCase {
    hq: usize,
    hkv: usize,
    d: usize,
    q_lens: Vec<usize>,
    prefix: Vec<usize>,
    /// Tokens per block; 0: a contiguous cache.
    block: usize,
    window: usize,
}

fn paged(
    hq: usize,
    hkv: usize,
    d: usize,
    q_lens: &[usize],
    prefix: &[usize],
    block: usize,
) -> PagedCase {
    PagedCase {
        hq,
        hkv,
        d,
        q_lens: q_lens.to_vec(),
        prefix: prefix.to_vec(),
        block,
        window: 0,
    }
}

/// A host-side cache holding `k_seq[b]`, `v_seq[b]` (`[ctx_b, hkv, d]` each) at positions
/// `0..ctx_b` of sequence `b`, every other slot NaN; blocks assigned in a random order, table
/// entries past a sequence's blocks hold invalid ids. `block == 0`: contiguous
/// `[batch + 1, hkv, max_ctx + 5, d]`.
struct HostCache<T> {
    k: Vec<T>,
    v: Vec<T>,
    shape: [usize; 4],
    table: Vec<i32>,
    max_blocks: usize,
    contiguous: bool,
}

fn host_cache<T: FloatDType>(
    k_seq: &[Vec<T>],
    v_seq: &[Vec<T>],
    hkv: usize,
    d: usize,
    block: usize,
    r: &mut impl Rng,
) -> HostCache<T> {
    let batch = k_seq.len();
    let ctx: Vec<usize> = k_seq.iter().map(|x| x.len() / (hkv * d)).collect();
    let (shape, table, max_blocks) = if block == 0 {
        let cap = ctx.iter().copied().max().unwrap_or(0) + 5;
        (
            [batch + 1, hkv, cap, d],
            (0..batch as i32).collect::<Vec<_>>(),
            1,
        )
    } else {
        let nb: Vec<usize> = ctx.iter().map(|&c| c.div_ceil(block)).collect();
        let max_blocks = nb.iter().copied().max().unwrap_or(0) + 2;
        let num_blocks = nb.iter().sum::<usize>() + 5;
        let mut ids: Vec<i32> = (0..num_blocks as i32).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, r.random_range(0..=i));
        }
        let mut next = ids.into_iter();
        let mut table = Vec::with_capacity(batch * max_blocks);
        for &n in &nb {
            for j in 0..max_blocks {
                table.push(if j < n {
                    next.next().unwrap()
                } else if j % 2 == 0 {
                    -1
                } else {
                    num_blocks as i32 + 7
                });
            }
        }
        ([num_blocks, hkv, block, d], table, max_blocks)
    };
    let [_, _, bs, _] = shape;
    let n = shape.iter().product();
    let mut k = vec![T::from_f32(f32::NAN); n];
    let mut v = vec![T::from_f32(f32::NAN); n];
    for b in 0..batch {
        for p in 0..ctx[b] {
            let blk = table[b * max_blocks + p / bs] as usize;
            for h in 0..hkv {
                let dst = ((blk * hkv + h) * bs + p % bs) * d;
                let src = (p * hkv + h) * d;
                k[dst..dst + d].copy_from_slice(&k_seq[b][src..src + d]);
                v[dst..dst + d].copy_from_slice(&v_seq[b][src..src + d]);
            }
        }
    }
    HostCache {
        k,
        v,
        shape,
        table,
        max_blocks,
        contiguous: block == 0,
    }
}

/// Runs `prefill_paged` on the cache (`q [total_q, hq, d]`, total_q = covered rows + 3 spare
/// rows that must keep their NaN poison) and returns the output.
#[allow(clippy::too_many_arguments)]
fn launch_paged<T: FloatDType>(
    gpu: &Gpu,
    q: &[T],
    cache: &HostCache<T>,
    cu: &[usize],
    ctx: &[usize],
    hq: usize,
    d: usize,
    window: usize,
) -> Vec<T> {
    let s = gpu.stream();
    let total = q.len() / (hq * d);
    let batch = ctx.len();
    let dq = DeviceTensor::from_host(s, q, &[total, hq, d]).unwrap();
    let dk = DeviceTensor::from_host(s, &cache.k, &cache.shape).unwrap();
    let dv = DeviceTensor::from_host(s, &cache.v, &cache.shape).unwrap();
    let cu32: Vec<i32> = cu.iter().map(|&x| x as i32).collect();
    let ctx32: Vec<i32> = ctx.iter().map(|&x| x as i32).collect();
    let dcu = DeviceTensor::from_host(s, &cu32, &[batch + 1]).unwrap();
    let dctx = DeviceTensor::from_host(s, &ctx32, &[batch]).unwrap();
    let dtable = DeviceTensor::from_host(s, &cache.table, &[batch, cache.max_blocks]).unwrap();
    let kv = if cache.contiguous {
        KvCache::Contiguous { k: &dk, v: &dv }
    } else {
        KvCache::Paged {
            k: &dk,
            v: &dv,
            block_table: &dtable,
        }
    };
    let max_q = cu.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    let params = PagedPrefillParams {
        window: (window > 0).then_some(window),
        ..PagedPrefillParams::new(d, max_q)
    };
    let mut out = DeviceTensor::filled(s, &[total, hq, d], T::from_f32(f32::NAN)).unwrap();
    attention_prefill::prefill_paged(s, &dq, &kv, &dcu, &dctx, &mut out, &params).unwrap();
    out.to_host(s).unwrap()
}

/// rel L2 of the paged kernel against the reference on the covered rows; panics when a row
/// outside every sequence was written.
fn run_paged<T: FloatDType>(gpu: &Gpu, c: &PagedCase, r: &mut impl Rng) -> f64 {
    let (hq, hkv, d) = (c.hq, c.hkv, c.d);
    let cu = cu_of(&c.q_lens);
    let covered = *cu.last().unwrap();
    let total = covered + 3;
    let ctx: Vec<usize> = c.q_lens.iter().zip(&c.prefix).map(|(q, p)| q + p).collect();
    let q: Vec<T> = fl_kernels::testing::random(r, total * hq * d);
    let k_seq: Vec<Vec<T>> = ctx
        .iter()
        .map(|&n| fl_kernels::testing::random(r, n * hkv * d))
        .collect();
    let v_seq: Vec<Vec<T>> = ctx
        .iter()
        .map(|&n| fl_kernels::testing::random(r, n * hkv * d))
        .collect();
    let cache = host_cache(&k_seq, &v_seq, hkv, d, c.block, r);
    let (k64, v64) = (to_f64(&cache.k), to_f64(&cache.v));
    let scale = 1.0 / (d as f32).sqrt();
    let want = reference::attention_prefill::prefill_paged(
        &to_f64(&q),
        &PagedKv {
            k: &k64,
            v: &v64,
            block_size: cache.shape[2],
            block_table: &cache.table,
            max_blocks: cache.max_blocks,
        },
        &cu,
        &ctx,
        hq,
        hkv,
        d,
        scale as f64,
        c.window,
    );
    let got = launch_paged(gpu, &q, &cache, &cu, &ctx, hq, d, c.window);
    let row = hq * d;
    assert!(
        got[covered * row..].iter().all(|x| x.to_f32().is_nan()),
        "{c:?}: rows outside every sequence were written"
    );
    if covered == 0 {
        return 0.0;
    }
    rel_l2(&got[..covered * row], &want[..covered * row])
}

fn check_paged<T: FloatDType>(gpu: &Gpu, c: &PagedCase, r: &mut impl Rng) {
    let err = run_paged::<T>(gpu, c, r);
    let tol = tol::<T>();
    assert!(
        err < tol,
        "prefill_paged<{}> {c:?}: rel L2 {err:e}",
        T::NAME
    );
}

#[test]
fn prefill_paged_ragged_prefixes_and_odd_block_counts() {
    let Some(gpu) = gpu_or_skip("prefill_paged_ragged_prefixes_and_odd_block_counts") else {
        return;
    };
    let mut r = rng("prefill_paged_ragged");
    // (q_len, prefix): decode tokens, a first chunk, chunks after 1..several blocks, not
    // block-aligned, an empty sequence, odd block counts (3, 5, 7 blocks of 16).
    let q_lens = [1usize, 1, 37, 100, 64, 300, 0, 17, 130];
    let prefix = [0usize, 76, 0, 19, 48, 261, 50, 15, 111];
    for &(hq, hkv) in &[(32usize, 8usize), (4, 4)] {
        // 32 heads: without the 300-token chunk, to keep the f64 reference affordable.
        let skip = if hq == 32 { 5 } else { usize::MAX };
        let keep = |x: &[usize]| -> Vec<usize> {
            x.iter()
                .enumerate()
                .filter(|&(i, _)| i != skip)
                .map(|(_, &v)| v)
                .collect()
        };
        for &d in &[64usize, 128] {
            for &block in &[16usize, 32] {
                let c = paged(hq, hkv, d, &keep(&q_lens), &keep(&prefix), block);
                check_paged::<f16>(&gpu, &c, &mut r);
                check_paged::<bf16>(&gpu, &c, &mut r);
            }
        }
    }
}

#[test]
fn prefill_paged_long_chunks_and_block_sizes() {
    let Some(gpu) = gpu_or_skip("prefill_paged_long_chunks_and_block_sizes") else {
        return;
    };
    let mut r = rng("prefill_paged_long");
    // Two heads keep the f64 reference affordable.
    check_paged::<f16>(
        &gpu,
        &paged(2, 1, 128, &[1024, 1], &[2001, 3000], 16),
        &mut r,
    );
    check_paged::<bf16>(&gpu, &paged(2, 2, 64, &[2048], &[0], 32), &mut r);
    for &block in &[24usize, 64, 128] {
        check_paged::<f16>(
            &gpu,
            &paged(8, 2, 128, &[200, 1, 65], &[333, 7, 0], block),
            &mut r,
        );
    }
}

#[test]
fn prefill_paged_every_head_dim_f32_and_contiguous_cache() {
    let Some(gpu) = gpu_or_skip("prefill_paged_every_head_dim_f32_and_contiguous_cache") else {
        return;
    };
    let mut r = rng("prefill_paged_dims");
    for &d in &PREFILL_HEAD_DIMS {
        for &block in &[16usize, 0] {
            let c = paged(8, 2, d, &[1, 70, 129], &[40, 0, 77], block);
            check_paged::<f16>(&gpu, &c, &mut r);
            check_paged::<bf16>(&gpu, &c, &mut r);
            check_paged::<f32>(&gpu, &c, &mut r);
        }
    }
}

#[test]
fn prefill_paged_sliding_window() {
    let Some(gpu) = gpu_or_skip("prefill_paged_sliding_window") else {
        return;
    };
    let mut r = rng("prefill_paged_window");
    for &w in &[1usize, 5, 64, 100, 5000] {
        let mut c = paged(8, 2, 128, &[200, 1, 77], &[300, 150, 0], 16);
        c.window = w;
        check_paged::<bf16>(&gpu, &c, &mut r);
        let mut c = paged(4, 4, 64, &[90], &[211], 32);
        c.window = w;
        check_paged::<f16>(&gpu, &c, &mut r);
        check_paged::<f32>(&gpu, &c, &mut r);
    }
}

/// A sequence prefilled in two chunks through the paged cache (two launches, and one launch
/// where both chunks are sequences sharing the same blocks) equals the one-pass prefill of
/// the packed sequence.
#[test]
fn prefill_paged_two_chunks_equal_one_pass() {
    let Some(gpu) = gpu_or_skip("prefill_paged_two_chunks_equal_one_pass") else {
        return;
    };
    let mut r = rng("prefill_paged_chunks");
    for &(hq, hkv, d, len, split, block) in &[
        (32usize, 8usize, 128usize, 700usize, 333usize, 16usize),
        (4, 4, 64, 1000, 512, 32),
        (8, 2, 128, 130, 1, 16),
    ] {
        two_chunks::<f16>(&gpu, [hq, hkv, d], len, split, block, &mut r);
        two_chunks::<bf16>(&gpu, [hq, hkv, d], len, split, block, &mut r);
    }
}

fn two_chunks<T: FloatDType>(
    gpu: &Gpu,
    [hq, hkv, d]: [usize; 3],
    len: usize,
    split: usize,
    block: usize,
    r: &mut impl Rng,
) {
    let s = gpu.stream();
    let q: Vec<T> = fl_kernels::testing::random(r, len * hq * d);
    let k: Vec<T> = fl_kernels::testing::random(r, len * hkv * d);
    let v: Vec<T> = fl_kernels::testing::random(r, len * hkv * d);
    // One pass over the packed sequence (the existing kernel).
    let dq = DeviceTensor::from_host(s, &q, &[len, hq, d]).unwrap();
    let dk = DeviceTensor::from_host(s, &k, &[len, hkv, d]).unwrap();
    let dv = DeviceTensor::from_host(s, &v, &[len, hkv, d]).unwrap();
    let dcu = DeviceTensor::from_host(s, &[0i32, len as i32], &[2]).unwrap();
    let mut full = DeviceTensor::<T>::zeros(s, &[len, hq, d]).unwrap();
    attention_prefill::prefill(
        s,
        &dq,
        &dk,
        &dv,
        &dcu,
        &mut full,
        &PrefillParams::new(d, len),
    )
    .unwrap();
    let full = to_f64(&full.to_host(s).unwrap());
    let row = hq * d;
    let what = format!(
        "{} h{hq}/{hkv} d{d} len {len} split {split} block {block}",
        T::NAME
    );
    // Two launches: rows 0..split over ctx split, then split..len over ctx len.
    let cache = host_cache(&[k], &[v], hkv, d, block, r);
    let mut got: Vec<T> = Vec::with_capacity(len * row);
    for (lo, hi) in [(0, split), (split, len)] {
        let mut qc = q[lo * row..hi * row].to_vec();
        qc.extend(std::iter::repeat_n(T::from_f32(0.5), 3 * row));
        let out = launch_paged(gpu, &qc, &cache, &[0, hi - lo], &[hi], hq, d, 0);
        got.extend_from_slice(&out[..(hi - lo) * row]);
    }
    let err = rel_l2(&got, &full);
    assert!(err < 1e-2, "{what}, two launches: rel L2 {err:e}");
    // One launch: both chunks as sequences of one batch over the same blocks.
    let mut shared = cache;
    shared.table = shared.table.repeat(2);
    let mut qc = q.clone();
    qc.extend(std::iter::repeat_n(T::from_f32(0.5), 3 * row));
    let out = launch_paged(gpu, &qc, &shared, &[0, split, len], &[split, len], hq, d, 0);
    let err = rel_l2(&out[..len * row], &full);
    assert!(err < 1e-2, "{what}, one launch: rel L2 {err:e}");
}

/// Bad device data never reads or writes out of bounds: block ids outside the pool (keys
/// read as zeros), a context above the table's capacity (clamped), a context shorter than
/// the new tokens (rows before position 0 get zeros); rows outside every sequence keep their
/// poison.
#[test]
fn prefill_paged_survives_bad_tables_and_context_lengths() {
    let Some(gpu) = gpu_or_skip("prefill_paged_survives_bad_tables_and_context_lengths") else {
        return;
    };
    let s = gpu.stream();
    let mut r = rng("prefill_paged_bad");
    let (hq, hkv, d, bs, nb, mb) = (4usize, 2usize, 128usize, 16usize, 6usize, 4usize);
    let total = 40usize;
    let q: Vec<f16> = fl_kernels::testing::random(&mut r, total * hq * d);
    let k: Vec<f16> = fl_kernels::testing::random(&mut r, nb * hkv * bs * d);
    let dq = DeviceTensor::from_host(s, &q, &[total, hq, d]).unwrap();
    let dk = DeviceTensor::from_host(s, &k, &[nb, hkv, bs, d]).unwrap();
    // seq 0: ids out of the pool; seq 1: ctx 1000 > capacity 64; seq 2: ctx 3 < q_len 10.
    let table = [-5i32, 99, 1, 2, 3, 4, 5, 0, 2, 3, i32::MAX, i32::MIN];
    let dt = DeviceTensor::from_host(s, &table, &[3, mb]).unwrap();
    let dcu = DeviceTensor::from_host(s, &[0i32, 10, 20, 30], &[4]).unwrap();
    let dctx = DeviceTensor::from_host(s, &[40i32, 1000, 3], &[3]).unwrap();
    let cache = KvCache::Paged {
        k: &dk,
        v: &dk,
        block_table: &dt,
    };
    let mut out = DeviceTensor::filled(s, &[total, hq, d], f16::from_f32(f32::NAN)).unwrap();
    let p = PagedPrefillParams::new(d, 10);
    attention_prefill::prefill_paged(s, &dq, &cache, &dcu, &dctx, &mut out, &p).unwrap();
    let got = out.to_host(s).unwrap();
    let row = hq * d;
    assert!(got[..30 * row].iter().all(|x| x.to_f32().is_finite()));
    assert!(got[30 * row..].iter().all(|x| x.to_f32().is_nan()));
    // seq 2: rows 20..27 sit before position 0 (zeros); rows 27..30 see positions 0..=2.
    assert!(got[20 * row..27 * row].iter().all(|x| x.to_f32() == 0.0));
    // max_q_len 0: nothing to do, nothing written.
    let mut out = DeviceTensor::filled(s, &[total, hq, d], f16::from_f32(f32::NAN)).unwrap();
    let p0 = PagedPrefillParams::new(d, 0);
    attention_prefill::prefill_paged(s, &dq, &cache, &dcu, &dctx, &mut out, &p0).unwrap();
    assert!(out.to_host(s).unwrap().iter().all(|x| x.to_f32().is_nan()));
}

#[test]
fn prefill_paged_bad_arguments_are_named() {
    let Some(gpu) = gpu_or_skip("prefill_paged_bad_arguments_are_named") else {
        return;
    };
    let s = gpu.stream();
    let q = DeviceTensor::<f16>::zeros(s, &[16, 8, 128]).unwrap();
    let k = DeviceTensor::<f16>::zeros(s, &[4, 2, 16, 128]).unwrap();
    let v = DeviceTensor::<f16>::zeros(s, &[4, 2, 16, 128]).unwrap();
    let bt = DeviceTensor::from_host(s, &[0i32, 1, 2, 3], &[1, 4]).unwrap();
    let cu = DeviceTensor::from_host(s, &[0i32, 16], &[2]).unwrap();
    let ctx = DeviceTensor::from_host(s, &[40i32], &[1]).unwrap();
    let mut out = DeviceTensor::<f16>::zeros(s, &[16, 8, 128]).unwrap();
    let p = PagedPrefillParams::new(128, 16);
    let named = |e: Error, want: &str| match &e {
        Error::Shape { arg, .. }
        | Error::InvalidArgument { arg, .. }
        | Error::TooLarge { arg, .. } => {
            assert_eq!(*arg, want, "{e}")
        }
        _ => panic!("unexpected {e}"),
    };
    fn cache<'a>(
        k: &'a DeviceTensor<f16>,
        v: &'a DeviceTensor<f16>,
        block_table: &'a DeviceTensor<i32>,
    ) -> KvCache<'a, f16> {
        KvCache::Paged { k, v, block_table }
    }
    let ok = cache(&k, &v, &bt);
    attention_prefill::prefill_paged(s, &q, &ok, &cu, &ctx, &mut out, &p).unwrap();
    let q100 = DeviceTensor::<f16>::zeros(s, &[16, 8, 100]).unwrap();
    named(
        attention_prefill::prefill_paged(s, &q100, &ok, &cu, &ctx, &mut out, &p).unwrap_err(),
        "q",
    );
    let k3 = DeviceTensor::<f16>::zeros(s, &[4, 3, 16, 128]).unwrap();
    named(
        attention_prefill::prefill_paged(s, &q, &cache(&k3, &k3, &bt), &cu, &ctx, &mut out, &p)
            .unwrap_err(),
        "q",
    );
    let k64 = DeviceTensor::<f16>::zeros(s, &[4, 2, 16, 64]).unwrap();
    named(
        attention_prefill::prefill_paged(s, &q, &cache(&k64, &v, &bt), &cu, &ctx, &mut out, &p)
            .unwrap_err(),
        "cache.k",
    );
    let v1 = DeviceTensor::<f16>::zeros(s, &[4, 1, 16, 128]).unwrap();
    named(
        attention_prefill::prefill_paged(s, &q, &cache(&k, &v1, &bt), &cu, &ctx, &mut out, &p)
            .unwrap_err(),
        "cache.v",
    );
    let bt2 = DeviceTensor::from_host(s, &[0i32, 1], &[2, 1]).unwrap();
    named(
        attention_prefill::prefill_paged(s, &q, &cache(&k, &v, &bt2), &cu, &ctx, &mut out, &p)
            .unwrap_err(),
        "cache.block_table",
    );
    let kc = DeviceTensor::<f16>::zeros(s, &[1, 2, 64, 128]).unwrap();
    let cu2 = DeviceTensor::from_host(s, &[0i32, 8, 16], &[3]).unwrap();
    let ctx2 = DeviceTensor::from_host(s, &[8i32, 8], &[2]).unwrap();
    named(
        attention_prefill::prefill_paged(
            s,
            &q,
            &KvCache::Contiguous { k: &kc, v: &kc },
            &cu2,
            &ctx2,
            &mut out,
            &p,
        )
        .unwrap_err(),
        "cache.k",
    );
    let cu1 = DeviceTensor::from_host(s, &[0i32], &[1]).unwrap();
    named(
        attention_prefill::prefill_paged(s, &q, &ok, &cu1, &ctx, &mut out, &p).unwrap_err(),
        "cu_seqlens_q",
    );
    named(
        attention_prefill::prefill_paged(s, &q, &ok, &cu, &ctx2, &mut out, &p).unwrap_err(),
        "ctx_lens",
    );
    let mut out2 = DeviceTensor::<f16>::zeros(s, &[16, 4, 128]).unwrap();
    named(
        attention_prefill::prefill_paged(s, &q, &ok, &cu, &ctx, &mut out2, &p).unwrap_err(),
        "out",
    );
    let pb = PagedPrefillParams { max_q_len: 17, ..p };
    named(
        attention_prefill::prefill_paged(s, &q, &ok, &cu, &ctx, &mut out, &pb).unwrap_err(),
        "params.max_q_len",
    );
    for scale in [0.0f32, -1.0, f32::NAN, f32::INFINITY] {
        let pb = PagedPrefillParams { scale, ..p };
        named(
            attention_prefill::prefill_paged(s, &q, &ok, &cu, &ctx, &mut out, &pb).unwrap_err(),
            "params.scale",
        );
    }
    let pb = PagedPrefillParams {
        window: Some(0),
        ..p
    };
    named(
        attention_prefill::prefill_paged(s, &q, &ok, &cu, &ctx, &mut out, &pb).unwrap_err(),
        "params.window",
    );
}

#[test]
fn prefill_paged_gpu_proptest() {
    let Some(gpu) = gpu_or_skip("prefill_paged_gpu_proptest") else {
        return;
    };
    use proptest::prelude::*;
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 32,
        ..ProptestConfig::default()
    });
    let strat = (
        prop::sample::select(vec![(1usize, 1usize), (4, 1), (8, 8), (12, 4), (32, 8)]),
        prop::sample::select(PREFILL_HEAD_DIMS.to_vec()),
        proptest::collection::vec((0usize..200, 0usize..300), 1..5),
        prop::sample::select(vec![0usize, 16, 24, 32, 64, 128]),
        prop::option::of(1usize..300),
        0u8..3,
        any::<u64>(),
    );
    runner
        .run(
            &strat,
            |((hq, hkv), d, seqs, block, window, dtype, seed)| {
                use rand::SeedableRng;
                let mut r = rand::rngs::StdRng::seed_from_u64(seed);
                let c = PagedCase {
                    hq,
                    hkv,
                    d,
                    q_lens: seqs.iter().map(|s| s.0).collect(),
                    prefix: seqs.iter().map(|s| s.1).collect(),
                    block,
                    window: window.unwrap_or(0),
                };
                let (err, tol) = match dtype {
                    0 => (run_paged::<f16>(&gpu, &c, &mut r), 1e-2),
                    1 => (run_paged::<bf16>(&gpu, &c, &mut r), 1e-2),
                    _ => (run_paged::<f32>(&gpu, &c, &mut r), tol::<f32>()),
                };
                prop_assert!(err < tol, "dtype {dtype} {c:?}: rel L2 {err:e}");
                Ok(())
            },
        )
        .unwrap();
}

// ---- reference properties (CPU) ----

mod reference_props {
    use super::{cu_of, reference};
    use fl_kernels::attention_prefill::{prefill_flops, prefill_paged_flops};
    use fl_kernels::reference::attention_prefill::PagedKv;
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

        // The paged reference over a permuted block table equals the packed reference on the
        // same rows of the whole sequences, whatever the split into prefix and new tokens.
        #[test]
        fn paged_reference_matches_packed_prefill(
            seqs in proptest::collection::vec((1usize..40, 0.0f64..1.0), 1..4),
            block in 1usize..9, window in 0usize..6, seed in any::<u64>(),
        ) {
            use rand::SeedableRng;
            let mut r = rand::rngs::StdRng::seed_from_u64(seed);
            let (hq, hkv, d) = (4usize, 2usize, 3usize);
            let lens: Vec<usize> = seqs.iter().map(|s| s.0).collect();
            let q_lens: Vec<usize> =
                seqs.iter().map(|&(l, f)| ((l as f64 * f) as usize).min(l)).collect();
            let cu = cu_of(&lens);
            let total = *cu.last().unwrap();
            let q: Vec<f64> = (0..total * hq * d).map(|_| r.random_range(-1.0..1.0)).collect();
            let k: Vec<f64> = (0..total * hkv * d).map(|_| r.random_range(-1.0..1.0)).collect();
            let v: Vec<f64> = (0..total * hkv * d).map(|_| r.random_range(-1.0..1.0)).collect();
            let want = reference::attention_prefill::prefill(&q, &k, &v, &cu, hq, hkv, d, 0.6, window);
            // Scatter every sequence into blocks taken in reverse order, one spare table entry.
            let max_blocks = lens.iter().map(|l| l.div_ceil(block)).max().unwrap() + 1;
            let num_blocks = lens.iter().map(|l| l.div_ceil(block)).sum::<usize>();
            let (mut kc, mut vc) = (vec![f64::NAN; num_blocks * hkv * block * d], vec![f64::NAN; num_blocks * hkv * block * d]);
            let mut table = vec![-1i32; lens.len() * max_blocks];
            let mut next = num_blocks;
            for (b, &l) in lens.iter().enumerate() {
                for p in 0..l {
                    if p % block == 0 {
                        next -= 1;
                        table[b * max_blocks + p / block] = next as i32;
                    }
                    let blk = table[b * max_blocks + p / block] as usize;
                    for h in 0..hkv {
                        let dst = ((blk * hkv + h) * block + p % block) * d;
                        let src = ((cu[b] + p) * hkv + h) * d;
                        kc[dst..dst + d].copy_from_slice(&k[src..src + d]);
                        vc[dst..dst + d].copy_from_slice(&v[src..src + d]);
                    }
                }
            }
            // The new tokens: the last q_lens[b] of each sequence.
            let cu_q = cu_of(&q_lens);
            let mut qn = Vec::new();
            for (b, &n) in q_lens.iter().enumerate() {
                qn.extend_from_slice(&q[(cu[b + 1] - n) * hq * d..cu[b + 1] * hq * d]);
            }
            let cache = PagedKv { k: &kc, v: &vc, block_size: block, block_table: &table, max_blocks };
            let got = reference::attention_prefill::prefill_paged(
                &qn, &cache, &cu_q, &lens, hq, hkv, d, 0.6, window);
            for (b, &n) in q_lens.iter().enumerate() {
                let w = &want[(cu[b + 1] - n) * hq * d..cu[b + 1] * hq * d];
                let g = &got[cu_q[b] * hq * d..cu_q[b + 1] * hq * d];
                for (x, y) in g.iter().zip(w) {
                    prop_assert!((x - y).abs() < 1e-12, "{x} vs {y}");
                }
            }
            // FLOPs: the whole sequence as new tokens counts what prefill counts.
            prop_assert_eq!(
                prefill_paged_flops(&lens, &lens, hq, d),
                prefill_flops(&lens, hq, d)
            );
            prop_assert!(prefill_paged_flops(&q_lens, &lens, hq, d) <= prefill_flops(&lens, hq, d));
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
