//! attention::decode on the GPU against reference::attention::decode (f64), contiguous and
//! paged caches, GQA ratios 1/4/8/32, odd lengths, ragged batches, windows, forced splits;
//! f16/bf16 (rel L2 < 1e-2) and f32 (rel L2 < 1e-5, the DESIGN.md fp32 bound).

use fl_kernels::attention::{self, DecodeParams, DecodeWorkspace, KvCache};
use fl_kernels::testing::{gpu_or_skip, rel_l2, rng, to_f64, tolerance};
use fl_kernels::{bf16, f16, reference, DeviceTensor, Error, FloatDType, Gpu};
use rand::seq::SliceRandom;
use rand::Rng;

struct Case {
    batch: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    lens: Vec<usize>,
    window: usize,
    splits: Option<usize>,
    paged_block: Option<usize>,
    /// Positions the cache holds (default: the longest length).
    cap: Option<usize>,
}

/// The output's rel L2 against the reference, and the workspace the call needed.
fn run_case<T: FloatDType>(gpu: &Gpu, c: &Case, r: &mut impl Rng) -> (f64, usize) {
    let s = gpu.stream();
    let cap = c
        .cap
        .unwrap_or_else(|| c.lens.iter().copied().max().unwrap_or(1).max(1));
    let (b, hq, hkv, d) = (c.batch, c.hq, c.hkv, c.d);
    let q: Vec<T> = fl_kernels::testing::random(r, b * hq * d);
    let k: Vec<T> = fl_kernels::testing::random(r, b * hkv * cap * d);
    let v: Vec<T> = fl_kernels::testing::random(r, b * hkv * cap * d);
    let scale = 1.0 / (d as f32).sqrt();
    let want = reference::attention::decode(
        &to_f64(&q),
        &to_f64(&k),
        &to_f64(&v),
        &c.lens,
        hq,
        hkv,
        d,
        cap,
        scale as f64,
        c.window,
    );
    let dq = DeviceTensor::from_host(s, &q, &[b, hq, d]).unwrap();
    let lens32: Vec<i32> = c.lens.iter().map(|&l| l as i32).collect();
    let dl = DeviceTensor::from_host(s, &lens32, &[b]).unwrap();
    let params = DecodeParams {
        scale,
        max_seq_len: cap,
        window: if c.window > 0 { Some(c.window) } else { None },
        num_splits: c.splits,
    };
    let mut out = DeviceTensor::filled(s, &[b, hq, d], T::from_f32(f32::NAN)).unwrap();
    let ws_bytes = match c.paged_block {
        None => {
            let dk = DeviceTensor::from_host(s, &k, &[b, hkv, cap, d]).unwrap();
            let dv = DeviceTensor::from_host(s, &v, &[b, hkv, cap, d]).unwrap();
            let cache = KvCache::Contiguous { k: &dk, v: &dv };
            let bytes = attention::decode_workspace_bytes(s, &dq, &cache, &dl, &params).unwrap();
            let mut ws = DecodeWorkspace::new(s, bytes).unwrap();
            attention::decode(s, &dq, &cache, &dl, &params, &mut ws, &mut out).unwrap();
            bytes
        }
        Some(bs) => {
            // Scatter the dense cache into randomly permuted blocks of a pool.
            let mbps = cap.div_ceil(bs);
            let nblocks = b * mbps + 3;
            let mut ids: Vec<i32> = (0..nblocks as i32).collect();
            ids.shuffle(r);
            let table: Vec<i32> = ids[..b * mbps].to_vec();
            let mut pk = vec![T::from_f32(f32::NAN); nblocks * hkv * bs * d];
            let mut pv = pk.clone();
            for bi in 0..b {
                for h in 0..hkv {
                    for p in 0..cap {
                        let blk = table[bi * mbps + p / bs] as usize;
                        let dst = ((blk * hkv + h) * bs + p % bs) * d;
                        let src = ((bi * hkv + h) * cap + p) * d;
                        pk[dst..dst + d].copy_from_slice(&k[src..src + d]);
                        pv[dst..dst + d].copy_from_slice(&v[src..src + d]);
                    }
                }
            }
            let dk = DeviceTensor::from_host(s, &pk, &[nblocks, hkv, bs, d]).unwrap();
            let dv = DeviceTensor::from_host(s, &pv, &[nblocks, hkv, bs, d]).unwrap();
            let dt = DeviceTensor::from_host(s, &table, &[b, mbps]).unwrap();
            let cache = KvCache::Paged {
                k: &dk,
                v: &dv,
                block_table: &dt,
            };
            let bytes = attention::decode_workspace_bytes(s, &dq, &cache, &dl, &params).unwrap();
            let mut ws = DecodeWorkspace::new(s, bytes).unwrap();
            attention::decode(s, &dq, &cache, &dl, &params, &mut ws, &mut out).unwrap();
            bytes
        }
    };
    let got = out.to_host(s).unwrap();
    (rel_l2(&got, &want), ws_bytes)
}

// f32: every step in f32 against the f64 reference. The largest term is the sum of up to
// ~4k weighted values per worker: each add rounds by <= 2^-24 of a partial sum, which grows
// like sqrt(j) for random signs, so the error of the sum is ~0.4 * 2^-24 * sqrt(n) of its
// value (~1.5e-6 at n = 4095; ~1e-7 for the dot products and exp2), inside 1e-5.
fn check<T: FloatDType>(gpu: &Gpu, c: &Case, r: &mut impl Rng) {
    let (err, _) = run_case::<T>(gpu, c, r);
    assert!(
        err < tolerance::<T>(),
        "decode<{}> b={} hq={} hkv={} d={} lens={:?} window={} splits={:?} paged={:?}: rel L2 {err:e}",
        T::NAME, c.batch, c.hq, c.hkv, c.d, c.lens, c.window, c.splits, c.paged_block
    );
}

fn case(batch: usize, hq: usize, hkv: usize, d: usize, lens: Vec<usize>) -> Case {
    Case {
        batch,
        hq,
        hkv,
        d,
        lens,
        window: 0,
        splits: None,
        paged_block: None,
        cap: None,
    }
}

#[test]
fn decode_gqa_ratios_and_odd_lengths() {
    let Some(gpu) = gpu_or_skip("decode_gqa_ratios_and_odd_lengths") else {
        return;
    };
    let mut r = rng("decode_gqa");
    for &(hq, hkv) in &[(4usize, 4usize), (8, 2), (16, 2), (32, 1)] {
        for &len in &[1usize, 7, 129, 4095] {
            check::<f16>(
                &gpu,
                &case(2, hq, hkv, 128, vec![len, len.div_ceil(2)]),
                &mut r,
            );
            check::<bf16>(&gpu, &case(1, hq, hkv, 128, vec![len]), &mut r);
        }
    }
}

#[test]
fn decode_every_head_dim() {
    let Some(gpu) = gpu_or_skip("decode_every_head_dim") else {
        return;
    };
    let mut r = rng("decode_head_dims");
    for &d in &attention::DECODE_HEAD_DIMS {
        check::<f16>(&gpu, &case(3, 8, 2, d, vec![33, 1, 300]), &mut r);
        check::<bf16>(&gpu, &case(2, 6, 3, d, vec![517, 64]), &mut r);
    }
}

#[test]
fn decode_ragged_batch_with_empty_sequence() {
    let Some(gpu) = gpu_or_skip("decode_ragged_batch_with_empty_sequence") else {
        return;
    };
    let mut r = rng("decode_ragged");
    let c = case(5, 8, 8, 64, vec![0, 1, 1000, 17, 2048]);
    check::<f16>(&gpu, &c, &mut r);
}

#[test]
fn decode_sliding_window_and_forced_splits() {
    let Some(gpu) = gpu_or_skip("decode_sliding_window_and_forced_splits") else {
        return;
    };
    let mut r = rng("decode_window");
    for &w in &[1usize, 5, 100, 5000] {
        let mut c = case(2, 8, 2, 128, vec![1000, 77]);
        c.window = w;
        check::<bf16>(&gpu, &c, &mut r);
    }
    for &sp in &[1usize, 2, 3, 17, 64] {
        let mut c = case(2, 4, 4, 128, vec![1500, 3]);
        c.splits = Some(sp);
        check::<f16>(&gpu, &c, &mut r);
    }
}

#[test]
fn decode_paged_matches_dense() {
    let Some(gpu) = gpu_or_skip("decode_paged_matches_dense") else {
        return;
    };
    let mut r = rng("decode_paged");
    for &bs in &[1usize, 16, 64] {
        let mut c = case(3, 32, 8, 128, vec![129, 1, 700]);
        c.paged_block = Some(bs);
        check::<f16>(&gpu, &c, &mut r);
        let mut c = case(2, 8, 1, 64, vec![4095, 33]);
        c.paged_block = Some(bs);
        check::<bf16>(&gpu, &c, &mut r);
    }
}

#[test]
fn decode_gqa_one_split_wraps_the_copy_ring() {
    // One split over thousands of keys: the per-thread cp.async ring wraps hundreds of
    // times; paged block sizes that do not divide the 16- or 32-key tile.
    let Some(gpu) = gpu_or_skip("decode_gqa_one_split_wraps_the_copy_ring") else {
        return;
    };
    let mut r = rng("decode_ring");
    for &paged in &[None, Some(16usize), Some(24), Some(5)] {
        for &(hq, hkv) in &[(32usize, 8usize), (8, 8), (16, 2)] {
            let mut c = case(2, hq, hkv, 128, vec![3001, 250]);
            c.splits = Some(1);
            c.paged_block = paged;
            check::<f16>(&gpu, &c, &mut r);
        }
    }
}

#[test]
fn decode_mha_wide_batch_on_the_tensor_core_kernel() {
    // MHA at head_dim 128 with batch x kv heads >= 128 and max_seq_len >= 4096 runs the
    // tensor-core kernel (G = 1) on sm_90 (other shapes the CUDA-core one): the first case,
    // ragged with one sequence past 4096, then the same bound at batch 4 x 32 kv heads, paged
    // and with a window and forced splits. The shorter cases run the CUDA-core kernel at the
    // same batch, paged and with a window and forced splits.
    let Some(gpu) = gpu_or_skip("decode_mha_wide_batch_on_the_tensor_core_kernel") else {
        return;
    };
    let mut r = rng("decode_mha_wide");
    let mut long: Vec<usize> = (0..16)
        .map(|i| [1usize, 7, 129, 300, 1000, 16][i % 6] + i)
        .collect();
    long[5] = 4100;
    check::<f16>(&gpu, &case(16, 32, 32, 128, long), &mut r);
    let long4 = vec![4100usize, 1, 300, 2049];
    let mut c = case(4, 32, 32, 128, long4.clone());
    c.paged_block = Some(16);
    check::<bf16>(&gpu, &c, &mut r);
    let mut c = case(4, 32, 32, 128, long4);
    c.window = 100;
    c.splits = Some(3);
    check::<f16>(&gpu, &c, &mut r);
    let lens: Vec<usize> = (0..16)
        .map(|i| [1usize, 7, 129, 300, 1000, 16][i % 6] + i)
        .collect();
    let mut c = case(16, 32, 32, 128, lens.clone());
    c.paged_block = Some(16);
    check::<bf16>(&gpu, &c, &mut r);
    let mut c = case(16, 32, 32, 128, lens);
    c.window = 100;
    c.splits = Some(3);
    check::<f16>(&gpu, &c, &mut r);
}

#[test]
fn decode_short_sequences_in_a_long_cache() {
    // A cache far longer than its sequences (the automatic split count is chosen for the
    // capacity, as for a CUDA graph replayed at every length), into an output poisoned with
    // NaN: few splits combine in the split kernel's last CTA, many in the combine kernel.
    // Batch 1 MHA runs the CUDA-core kernel, GQA the tensor-core kernel, batch 4 x 32 kv heads
    // at 4,096 positions the tensor-core kernel for MHA, f32 the CUDA-core kernel.
    let Some(gpu) = gpu_or_skip("decode_short_sequences_in_a_long_cache") else {
        return;
    };
    let mut r = rng("decode_long_cache");
    let mut cases: Vec<Case> = vec![];
    for &paged in &[None, Some(16usize)] {
        for &l in &[129usize, 300, 600, 4000] {
            let mut c = case(1, 32, 32, 128, vec![l]);
            (c.cap, c.paged_block) = (Some(4096), paged);
            cases.push(c);
            let mut c = case(1, 32, 8, 128, vec![l]);
            (c.cap, c.paged_block) = (Some(8192), paged);
            cases.push(c);
        }
        let mut c = case(
            9,
            32,
            8,
            128,
            vec![1, 7, 255, 256, 257, 1000, 5000, 8192, 0],
        );
        (c.cap, c.paged_block) = (Some(8192), paged);
        cases.push(c);
        let mut c = case(4, 32, 32, 128, vec![1, 300, 2049, 4096]);
        (c.cap, c.paged_block) = (Some(4096), paged);
        cases.push(c);
        let mut c = case(4, 8, 2, 64, vec![3, 700, 4100, 260]);
        (c.cap, c.paged_block, c.window) = (Some(8192), paged, 300);
        cases.push(c);
    }
    for (i, c) in cases.iter().enumerate() {
        let (err, tol) = match i % 3 {
            0 => (run_case::<f16>(&gpu, c, &mut r).0, tolerance::<f16>()),
            1 => (run_case::<bf16>(&gpu, c, &mut r).0, tolerance::<bf16>()),
            _ => (run_case::<f32>(&gpu, c, &mut r).0, tolerance::<f32>()),
        };
        assert!(
            err < tol,
            "case {i}: b={} hq={} hkv={} lens={:?} cap={:?} window={} paged={:?}: rel L2 {err:e}",
            c.batch,
            c.hq,
            c.hkv,
            c.lens,
            c.cap,
            c.window,
            c.paged_block
        );
    }
}

#[test]
fn decode_workspace_reused_across_shapes() {
    // One workspace, sized for the largest call, serves calls of other shapes in turn, as a
    // user reuses it every step: combines in the split kernel (few splits: its arrival
    // counters must be back at zero after every call) between combine-kernel calls (many
    // splits: their partial sums must never land where the counters are).
    let Some(gpu) = gpu_or_skip("decode_workspace_reused_across_shapes") else {
        return;
    };
    let s = gpu.stream();
    let mut r = rng("decode_ws_reuse");
    let shape = |b, hq, hkv, d, lens: Vec<usize>, cap, splits| {
        let mut c = case(b, hq, hkv, d, lens);
        (c.cap, c.splits) = (Some(cap), splits);
        c
    };
    let shapes = [
        shape(1, 32, 32, 128, vec![140], 4096, None),
        shape(2, 32, 8, 128, vec![20000, 5], 32768, None),
        shape(4, 8, 2, 64, vec![3, 700, 90, 1], 1024, Some(3)),
        shape(3, 16, 16, 96, vec![33, 1, 2000], 2048, Some(40)),
    ];
    struct Prepared {
        q: DeviceTensor<f16>,
        k: DeviceTensor<f16>,
        v: DeviceTensor<f16>,
        lens: DeviceTensor<i32>,
        params: DecodeParams,
        want: Vec<f64>,
        shape: [usize; 3],
    }
    let prep: Vec<Prepared> = shapes
        .iter()
        .map(|c| {
            let (b, hq, hkv, d, cap) = (c.batch, c.hq, c.hkv, c.d, c.cap.expect("set"));
            let lens = &c.lens;
            let q: Vec<f16> = fl_kernels::testing::random(&mut r, b * hq * d);
            let k: Vec<f16> = fl_kernels::testing::random(&mut r, b * hkv * cap * d);
            let v: Vec<f16> = fl_kernels::testing::random(&mut r, b * hkv * cap * d);
            let scale = 1.0 / (d as f32).sqrt();
            let want = reference::attention::decode(
                &to_f64(&q),
                &to_f64(&k),
                &to_f64(&v),
                lens,
                hq,
                hkv,
                d,
                cap,
                scale as f64,
                0,
            );
            let lens32: Vec<i32> = lens.iter().map(|&l| l as i32).collect();
            Prepared {
                q: DeviceTensor::from_host(s, &q, &[b, hq, d]).unwrap(),
                k: DeviceTensor::from_host(s, &k, &[b, hkv, cap, d]).unwrap(),
                v: DeviceTensor::from_host(s, &v, &[b, hkv, cap, d]).unwrap(),
                lens: DeviceTensor::from_host(s, &lens32, &[b]).unwrap(),
                params: DecodeParams {
                    scale,
                    max_seq_len: cap,
                    window: None,
                    num_splits: c.splits,
                },
                want,
                shape: [b, hq, d],
            }
        })
        .collect();
    let need = |p: &Prepared| {
        let cache = KvCache::Contiguous { k: &p.k, v: &p.v };
        attention::decode_workspace_bytes(s, &p.q, &cache, &p.lens, &p.params).unwrap()
    };
    let bytes = prep.iter().map(need).max().unwrap();
    assert!(prep.iter().all(|p| need(p) > 0), "every shape splits");
    let mut ws = DecodeWorkspace::new(s, bytes).unwrap();
    for round in 0..3 {
        for (i, p) in prep.iter().enumerate() {
            let mut out = DeviceTensor::filled(s, &p.shape, f16::from_f32(f32::NAN)).unwrap();
            let cache = KvCache::Contiguous { k: &p.k, v: &p.v };
            attention::decode(s, &p.q, &cache, &p.lens, &p.params, &mut ws, &mut out).unwrap();
            let err = rel_l2(&out.to_host(s).unwrap(), &p.want);
            assert!(
                err < tolerance::<f16>(),
                "round {round}, shape {i}: rel L2 {err:e}"
            );
        }
    }
}

#[test]
fn decode_long_sequence_many_splits() {
    let Some(gpu) = gpu_or_skip("decode_long_sequence_many_splits") else {
        return;
    };
    let mut r = rng("decode_long");
    check::<f16>(&gpu, &case(1, 32, 8, 128, vec![32768]), &mut r);
}

#[test]
fn decode_f32_gqa_ratios_odd_lengths_contiguous_and_paged() {
    // f32 runs the CUDA-core kernel with G heads per CTA for every group (1, 3, 4, 8, 32).
    let Some(gpu) = gpu_or_skip("decode_f32_gqa_ratios_odd_lengths_contiguous_and_paged") else {
        return;
    };
    let mut r = rng("decode_f32_gqa");
    for &(hq, hkv) in &[(4usize, 4usize), (12, 4), (16, 4), (16, 2), (32, 1)] {
        for &len in &[1usize, 7, 129, 4095] {
            check::<f32>(
                &gpu,
                &case(2, hq, hkv, 128, vec![len, len.div_ceil(2)]),
                &mut r,
            );
            let mut c = case(2, hq, hkv, 64, vec![len.div_ceil(3), len]);
            c.paged_block = Some(16);
            check::<f32>(&gpu, &c, &mut r);
        }
    }
}

#[test]
fn decode_f32_every_head_dim_ragged_window_and_splits() {
    let Some(gpu) = gpu_or_skip("decode_f32_every_head_dim_ragged_window_and_splits") else {
        return;
    };
    let mut r = rng("decode_f32_shapes");
    for &d in &attention::DECODE_HEAD_DIMS {
        check::<f32>(&gpu, &case(3, 8, 2, d, vec![33, 1, 300]), &mut r);
        let mut c = case(2, 6, 3, d, vec![517, 64]);
        c.paged_block = Some(24);
        check::<f32>(&gpu, &c, &mut r);
        let mut c = case(2, 8, 8, d, vec![129, 4095]);
        c.paged_block = Some(5);
        check::<f32>(&gpu, &c, &mut r);
    }
    // Ragged, with an empty sequence (zeros out), MHA and GQA.
    check::<f32>(&gpu, &case(5, 8, 8, 64, vec![0, 1, 1000, 17, 2048]), &mut r);
    check::<f32>(
        &gpu,
        &case(5, 32, 4, 128, vec![0, 1, 1000, 17, 2048]),
        &mut r,
    );
    for &w in &[1usize, 5, 100, 5000] {
        let mut c = case(2, 8, 1, 128, vec![1000, 77]);
        c.window = w;
        check::<f32>(&gpu, &c, &mut r);
    }
    for &sp in &[1usize, 2, 3, 17, 64] {
        for &(hq, hkv) in &[(4usize, 4usize), (16, 2)] {
            let mut c = case(2, hq, hkv, 128, vec![1500, 3]);
            c.splits = Some(sp);
            check::<f32>(&gpu, &c, &mut r);
        }
    }
    // One split over thousands of keys: the copy ring wraps many times.
    for &paged in &[None, Some(16usize), Some(5)] {
        let mut c = case(2, 32, 8, 128, vec![3001, 250]);
        c.splits = Some(1);
        c.paged_block = paged;
        check::<f32>(&gpu, &c, &mut r);
    }
    check::<f32>(&gpu, &case(1, 32, 8, 128, vec![32768]), &mut r);
}

#[test]
fn decode_bad_arguments_are_named() {
    let Some(gpu) = gpu_or_skip("decode_bad_arguments_are_named") else {
        return;
    };
    let s = gpu.stream();
    let q = DeviceTensor::<f16>::zeros(s, &[2, 8, 128]).unwrap();
    let k = DeviceTensor::<f16>::zeros(s, &[2, 3, 64, 128]).unwrap();
    let v = DeviceTensor::<f16>::zeros(s, &[2, 3, 64, 128]).unwrap();
    let lens = DeviceTensor::from_host(s, &[1i32, 2], &[2]).unwrap();
    let mut ws = DecodeWorkspace::new(s, 0).unwrap();
    let mut out = DeviceTensor::<f16>::zeros(s, &[2, 8, 128]).unwrap();
    let cache = KvCache::Contiguous { k: &k, v: &v };
    let p = DecodeParams::new(128, 64);
    // 8 q heads over 3 kv heads
    let e = attention::decode(s, &q, &cache, &lens, &p, &mut ws, &mut out).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { arg: "q", .. }), "{e}");
    let k = DeviceTensor::<f16>::zeros(s, &[2, 2, 64, 128]).unwrap();
    let v2 = DeviceTensor::<f16>::zeros(s, &[2, 2, 32, 128]).unwrap();
    let cache = KvCache::Contiguous { k: &k, v: &v2 };
    let e = attention::decode(s, &q, &cache, &lens, &p, &mut ws, &mut out).unwrap_err();
    assert!(matches!(e, Error::Shape { arg: "cache.v", .. }), "{e}");
    let v = DeviceTensor::<f16>::zeros(s, &[2, 2, 64, 128]).unwrap();
    let cache = KvCache::Contiguous { k: &k, v: &v };
    let big = DecodeParams::new(128, 65);
    let e = attention::decode(s, &q, &cache, &lens, &big, &mut ws, &mut out).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidArgument {
                arg: "params.max_seq_len",
                ..
            }
        ),
        "{e}"
    );
    let forced = DecodeParams {
        num_splits: Some(4),
        ..p
    };
    let e = attention::decode(s, &q, &cache, &lens, &forced, &mut ws, &mut out).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidArgument {
                arg: "workspace",
                ..
            }
        ),
        "{e}"
    );
    let q5 = DeviceTensor::<f16>::zeros(s, &[2, 8, 100]).unwrap();
    let e = attention::decode(s, &q5, &cache, &lens, &p, &mut ws, &mut out).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { arg: "q", .. }), "{e}");
    let lens3 = DeviceTensor::from_host(s, &[1i32, 2, 3], &[3]).unwrap();
    let e = attention::decode(s, &q, &cache, &lens3, &p, &mut ws, &mut out).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Shape {
                arg: "seq_lens",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn decode_gpu_proptest() {
    let Some(gpu) = gpu_or_skip("decode_gpu_proptest") else {
        return;
    };
    use proptest::prelude::*;
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    });
    let strat = (
        1usize..4,
        prop::sample::select(vec![(1usize, 1usize), (4, 1), (8, 8), (12, 4), (32, 4)]),
        prop::sample::select(attention::DECODE_HEAD_DIMS.to_vec()),
        proptest::collection::vec(0usize..700, 3),
        prop::option::of(prop::sample::select(vec![1usize, 8, 16])),
        any::<u64>(),
    );
    runner
        .run(&strat, |(batch, (hq, hkv), d, lens, paged, seed)| {
            use rand::SeedableRng;
            let mut r = rand::rngs::StdRng::seed_from_u64(seed);
            let mut c = case(batch, hq, hkv, d, lens[..batch].to_vec());
            c.paged_block = paged;
            let err = run_case::<bf16>(&gpu, &c, &mut r).0;
            prop_assert!(err < 1e-2, "rel L2 {err:e}");
            Ok(())
        })
        .unwrap();
}

#[test]
fn decode_f32_gpu_proptest() {
    let Some(gpu) = gpu_or_skip("decode_f32_gpu_proptest") else {
        return;
    };
    use proptest::prelude::*;
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 16,
        ..ProptestConfig::default()
    });
    let strat = (
        1usize..4,
        prop::sample::select(vec![(1usize, 1usize), (4, 1), (8, 8), (12, 4), (32, 4)]),
        prop::sample::select(attention::DECODE_HEAD_DIMS.to_vec()),
        proptest::collection::vec(0usize..700, 3),
        prop::option::of(prop::sample::select(vec![1usize, 8, 16])),
        any::<u64>(),
    );
    runner
        .run(&strat, |(batch, (hq, hkv), d, lens, paged, seed)| {
            use rand::SeedableRng;
            let mut r = rand::rngs::StdRng::seed_from_u64(seed);
            let mut c = case(batch, hq, hkv, d, lens[..batch].to_vec());
            c.paged_block = paged;
            let err = run_case::<f32>(&gpu, &c, &mut r).0;
            prop_assert!(err < tolerance::<f32>(), "rel L2 {err:e}");
            Ok(())
        })
        .unwrap();
}

// ---- reference properties (CPU) ----

#[test]
fn reference_decode_single_key_returns_its_value() {
    // One position: softmax weight 1, output = that value row, whatever the query.
    let d = 4;
    let q = vec![0.3, -1.0, 2.0, 0.5];
    let k = vec![1.0, 2.0, 3.0, 4.0];
    let v = vec![-1.0, 0.5, 0.25, 8.0];
    let o = reference::attention::decode(&q, &k, &v, &[1], 1, 1, d, 1, 0.5, 0);
    assert_eq!(o, v);
}

#[test]
fn reference_decode_equal_scores_average_values_and_window_limits() {
    // Zero query: uniform weights over the window.
    let (d, cap) = (2, 4);
    let q = vec![0.0, 0.0];
    let k = vec![1.0; cap * d];
    let v = vec![1.0, 10.0, 2.0, 20.0, 3.0, 30.0, 4.0, 40.0];
    let o = reference::attention::decode(&q, &k, &v, &[4], 1, 1, d, cap, 1.0, 0);
    assert!((o[0] - 2.5).abs() < 1e-12 && (o[1] - 25.0).abs() < 1e-12);
    let o = reference::attention::decode(&q, &k, &v, &[4], 1, 1, d, cap, 1.0, 2);
    assert!((o[0] - 3.5).abs() < 1e-12 && (o[1] - 35.0).abs() < 1e-12);
    let o = reference::attention::decode(&q, &k, &v, &[0], 1, 1, d, cap, 1.0, 0);
    assert_eq!(o, vec![0.0, 0.0]);
}
