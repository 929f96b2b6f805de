//! kv_cache::{append, append_paged} on the GPU against reference::kv_cache, and property
//! tests of the references (these run without a GPU).

use fl_kernels::kv_cache::{self, KvCache, TokenSlots, ERR_BLOCK, ERR_POSITION, ERR_SEQUENCE};
use fl_kernels::testing::{gpu_or_skip, random, random_nonzero, rng, to_f64};
use fl_kernels::{bf16, f16, reference, DeviceTensor, Error, FloatDType, Gpu};
use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::Rng;

/// (kv_heads, head_dim): usual sizes and ones that take the scalar path.
const HEADS: &[(usize, usize)] = &[
    (8, 128),
    (1, 64),
    (3, 80),
    (5, 96),
    (1, 256),
    (2, 7),
    (4, 6),
];

/// A batch of new tokens: where each goes.
#[derive(Clone, Debug)]
struct Batch {
    seq: Vec<i32>,
    pos: Vec<i32>,
}

/// Decode (one token per sequence), prefill (a run of one sequence), and a mixed ragged batch
/// (runs of several sequences, shuffled); unique (sequence, position) pairs, all valid for
/// `batch` sequences of `max_seq` positions.
fn scenarios(r: &mut impl Rng, batch: usize, max_seq: usize) -> Vec<Batch> {
    let decode = Batch {
        seq: (0..batch as i32).collect(),
        pos: (0..batch)
            .map(|_| r.random_range(0..max_seq as i32))
            .collect(),
    };
    let start = r.random_range(0..max_seq / 2);
    let prefill = Batch {
        seq: vec![(batch - 1) as i32; max_seq - start],
        pos: (start as i32..max_seq as i32).collect(),
    };
    let mut pairs: Vec<(i32, i32)> = (0..batch)
        .flat_map(|s| {
            let a = r.random_range(0..max_seq);
            let b = r.random_range(a..=max_seq);
            (a..b).map(move |p| (s as i32, p as i32))
        })
        .collect();
    pairs.shuffle(r);
    let mixed = Batch {
        seq: pairs.iter().map(|p| p.0).collect(),
        pos: pairs.iter().map(|p| p.1).collect(),
    };
    vec![decode, prefill, mixed]
}

/// A block table `[batch, max_blocks]`: a random permutation of `batch * max_blocks` of the
/// `num_blocks` blocks.
fn block_table(r: &mut impl Rng, batch: usize, max_blocks: usize, num_blocks: usize) -> Vec<i32> {
    let mut ids: Vec<i32> = (0..num_blocks as i32).collect();
    ids.shuffle(r);
    ids.truncate(batch * max_blocks);
    ids
}

enum Layout<'a> {
    Contiguous,
    Paged { table: &'a [i32], max_blocks: usize },
}

/// Runs one append on the GPU and on the CPU from the same random cache contents; the whole
/// caches must match bit for bit (written slots converted exactly, others untouched), and the
/// flags must agree.
fn check_append<I: FloatDType, C: FloatDType>(
    gpu: &Gpu,
    cache_shape: [usize; 4],
    layout: &Layout<'_>,
    b: &Batch,
    r: &mut impl Rng,
) -> i32 {
    let s = gpu.stream();
    let (kvh, hd) = (cache_shape[1], cache_shape[3]);
    let t = b.seq.len();
    let k: Vec<I> = random(r, t * kvh * hd);
    let v: Vec<I> = random(r, t * kvh * hd);
    let n: usize = cache_shape.iter().product();
    let kc0: Vec<C> = random_nonzero(r, n, 2.0, 3.0);
    let vc0: Vec<C> = random_nonzero(r, n, 2.0, 3.0);
    let dk = DeviceTensor::from_host(s, &k, &[t, kvh, hd]).unwrap();
    let dv = DeviceTensor::from_host(s, &v, &[t, kvh, hd]).unwrap();
    let seq = DeviceTensor::from_host(s, &b.seq, &[t]).unwrap();
    let pos = DeviceTensor::from_host(s, &b.pos, &[t]).unwrap();
    let mut cache = KvCache::new(
        DeviceTensor::from_host(s, &kc0, &cache_shape).unwrap(),
        DeviceTensor::from_host(s, &vc0, &cache_shape).unwrap(),
    )
    .unwrap();
    let mut flag = DeviceTensor::<i32>::zeros(s, &[1]).unwrap();
    let slots = TokenSlots {
        seq_ids: &seq,
        positions: &pos,
    };
    let (mut wk, mut wv) = (kc0.clone(), vc0.clone());
    let want_flag = match layout {
        Layout::Contiguous => {
            kv_cache::append(s, &dk, &dv, &slots, &mut cache, Some(&mut flag)).unwrap();
            reference::kv_cache::append(&mut wk, cache_shape, &k, &b.seq, &b.pos)
                | reference::kv_cache::append(&mut wv, cache_shape, &v, &b.seq, &b.pos)
        }
        Layout::Paged { table, max_blocks } => {
            let dt = DeviceTensor::from_host(s, table, &[table.len() / max_blocks, *max_blocks])
                .unwrap();
            kv_cache::append_paged(s, &dk, &dv, &slots, &dt, &mut cache, Some(&mut flag)).unwrap();
            reference::kv_cache::append_paged(
                &mut wk,
                cache_shape,
                &k,
                &b.seq,
                &b.pos,
                table,
                *max_blocks,
            ) | reference::kv_cache::append_paged(
                &mut wv,
                cache_shape,
                &v,
                &b.seq,
                &b.pos,
                table,
                *max_blocks,
            )
        }
    };
    let got_flag = flag.to_host(s).unwrap()[0];
    let (gk, gv) = (cache.k().to_host(s).unwrap(), cache.v().to_host(s).unwrap());
    let what = format!(
        "{}->{} cache {cache_shape:?} {} tokens",
        I::NAME,
        C::NAME,
        t
    );
    assert_eq!(got_flag, want_flag, "{what}: error flag");
    assert!(
        to_f64(&gk) == to_f64(&wk),
        "{what}: K cache differs from the reference"
    );
    assert!(
        to_f64(&gv) == to_f64(&wv),
        "{what}: V cache differs from the reference"
    );
    if want_flag == 0 && t > 0 {
        assert!(to_f64(&gk) != to_f64(&kc0), "{what}: nothing written");
    }
    got_flag
}

fn all_dtype_pairs(
    gpu: &Gpu,
    cache_shape: [usize; 4],
    layout: &Layout<'_>,
    b: &Batch,
    r: &mut impl Rng,
) {
    check_append::<f16, f16>(gpu, cache_shape, layout, b, r);
    check_append::<bf16, bf16>(gpu, cache_shape, layout, b, r);
    check_append::<f32, f32>(gpu, cache_shape, layout, b, r);
    check_append::<f32, f16>(gpu, cache_shape, layout, b, r);
    check_append::<f32, bf16>(gpu, cache_shape, layout, b, r);
    check_append::<f16, f32>(gpu, cache_shape, layout, b, r);
}

#[test]
fn append_contiguous_matches_reference() {
    let Some(gpu) = gpu_or_skip("append_contiguous_matches_reference") else {
        return;
    };
    let mut r = rng("kv_append");
    let (batch, max_seq) = (5usize, 67usize);
    for &(kvh, hd) in HEADS {
        for b in scenarios(&mut r, batch, max_seq) {
            all_dtype_pairs(
                &gpu,
                [batch, kvh, max_seq, hd],
                &Layout::Contiguous,
                &b,
                &mut r,
            );
        }
    }
}

#[test]
fn append_paged_matches_reference() {
    let Some(gpu) = gpu_or_skip("append_paged_matches_reference") else {
        return;
    };
    let mut r = rng("kv_append_paged");
    let (batch, max_seq) = (4usize, 67usize);
    for block_size in [16usize, 1, 5] {
        let max_blocks = max_seq.div_ceil(block_size);
        let num_blocks = batch * max_blocks + 3;
        let table = block_table(&mut r, batch, max_blocks, num_blocks);
        let layout = Layout::Paged {
            table: &table,
            max_blocks,
        };
        for &(kvh, hd) in HEADS {
            for b in scenarios(&mut r, batch, max_seq) {
                all_dtype_pairs(&gpu, [num_blocks, kvh, block_size, hd], &layout, &b, &mut r);
            }
        }
    }
}

#[test]
fn append_invalid_slots_are_skipped_and_flagged() {
    let Some(gpu) = gpu_or_skip("append_invalid_slots_are_skipped_and_flagged") else {
        return;
    };
    let s = gpu.stream();
    let mut r = rng("kv_invalid");
    // contiguous: batch 3, max_seq 10
    let shape = [3, 2, 10, 64];
    let cases = [
        (vec![0, -1, 1], vec![0, 0, 9], ERR_SEQUENCE),
        (vec![0, 3, 1], vec![0, 0, 9], ERR_SEQUENCE),
        (vec![0, 1, 2], vec![-1, 0, 9], ERR_POSITION),
        (vec![0, 1, 2], vec![10, 0, 9], ERR_POSITION),
        (vec![0, 7, 2], vec![3, 0, 10], ERR_SEQUENCE | ERR_POSITION),
    ];
    for (seq, pos, bits) in cases {
        let b = Batch { seq, pos };
        assert_eq!(
            check_append::<f16, f16>(&gpu, shape, &Layout::Contiguous, &b, &mut r),
            bits
        );
    }
    // paged: batch 2, 3 blocks of 4 per sequence (positions < 12); block 99 and -1 are bad.
    let table = [0, 5, 99, 1, -1, 2];
    let layout = Layout::Paged {
        table: &table,
        max_blocks: 3,
    };
    let shape = [6, 2, 4, 64];
    let cases = [
        (vec![0, 1, 0], vec![0, 1, 11], ERR_BLOCK), // 11 / 4 = 2 -> block 99
        (vec![0, 1], vec![3, 12], ERR_POSITION),
        (vec![0, 1], vec![8, 0], ERR_BLOCK),
        (vec![1, 1], vec![4, 0], ERR_BLOCK),
        (vec![2, 0], vec![0, 0], ERR_SEQUENCE),
    ];
    for (seq, pos, bits) in cases {
        let b = Batch { seq, pos };
        assert_eq!(
            check_append::<bf16, bf16>(&gpu, shape, &layout, &b, &mut r),
            bits
        );
    }
    // check_error_flag decodes the bits
    let flag = DeviceTensor::from_host(s, &[ERR_SEQUENCE | ERR_BLOCK], &[1]).unwrap();
    match kv_cache::check_error_flag(s, &flag) {
        Err(Error::DeviceCheck {
            op: "kv_cache",
            reason,
        }) => {
            assert!(
                reason.contains("sequence") && reason.contains("block"),
                "{reason}"
            )
        }
        other => panic!("expected a device-check error, got {other:?}"),
    }
    let zero = DeviceTensor::<i32>::zeros(s, &[1]).unwrap();
    kv_cache::check_error_flag(s, &zero).unwrap();
}

#[test]
fn append_strided_views_of_fused_qkv_and_unaligned_pointers() {
    // Raw launcher: K and V as views into one [tokens, q_heads + 2 kv_heads, head_dim] buffer,
    // then the same one element off (scalar path).
    let Some(gpu) = gpu_or_skip("append_strided_views_of_fused_qkv_and_unaligned_pointers") else {
        return;
    };
    let s = gpu.stream();
    let mut r = rng("kv_fused");
    let (t, hq, kvh, hd, batch, max_seq) = (11usize, 4usize, 2usize, 64usize, 2usize, 16usize);
    let row = (hq + 2 * kvh) * hd;
    let seq: Vec<i32> = (0..t as i32).map(|i| i % 2).collect();
    let pos: Vec<i32> = (0..t as i32).map(|i| i / 2 + 3).collect();
    let dseq = DeviceTensor::from_host(s, &seq, &[t]).unwrap();
    let dpos = DeviceTensor::from_host(s, &pos, &[t]).unwrap();
    let shape = [batch, kvh, max_seq, hd];
    let n: usize = shape.iter().product();
    for offset in [0usize, 1] {
        let qkv: Vec<bf16> = random(&mut r, t * row + 1);
        let dqkv = DeviceTensor::from_host(s, &qkv, &[t * row + 1]).unwrap();
        // One element more than a cache, so the offset view is a whole cache.
        let kc0: Vec<bf16> = random_nonzero(&mut r, n + 1, 2.0, 3.0);
        let mut kc = DeviceTensor::from_host(s, &kc0, &[n + 1]).unwrap();
        let mut vc = DeviceTensor::from_host(s, &kc0, &[n + 1]).unwrap();
        {
            use fl_kernels::cudarc::driver::{DevicePtr, DevicePtrMut};
            let (pq, _g1) = dqkv.as_slice().device_ptr(s);
            let (ps, _g2) = dseq.as_slice().device_ptr(s);
            let (pp, _g3) = dpos.as_slice().device_ptr(s);
            let (pk, _g4) = kc.as_slice_mut().device_ptr_mut(s);
            let (pv, _g5) = vc.as_slice_mut().device_ptr_mut(s);
            let base = pq + 2 * offset as u64;
            // SAFETY: K rows start hq heads into each row, V rows kvh heads later; with the
            // one-element offset every row still lies inside the t * row + 1 buffer. The caches
            // hold n + 1 bf16 each (a whole cache past the offset); seq/pos t i32 each, valid slots.
            let st = unsafe {
                fl_kernels_sys::fl_kv_append(
                    fl_kernels_sys::fl_dtype::FL_DTYPE_BF16,
                    (base + 2 * (hq * hd) as u64) as _,
                    (base + 2 * ((hq + kvh) * hd) as u64) as _,
                    row as i64,
                    row as i64,
                    t as i64,
                    kvh as i32,
                    hd as i32,
                    ps as _,
                    pp as _,
                    fl_kernels_sys::fl_dtype::FL_DTYPE_BF16,
                    (pk + 2 * offset as u64) as _,
                    (pv + 2 * offset as u64) as _,
                    batch as i32,
                    max_seq as i64,
                    std::ptr::null_mut(),
                    s.cu_stream() as _,
                )
            };
            assert_eq!(st, 0);
        }
        let view = |from: usize| -> Vec<bf16> {
            (0..t)
                .flat_map(|i| qkv[offset + i * row + from * hd..][..kvh * hd].to_vec())
                .collect()
        };
        for (name, got, from) in [("k", &kc, hq), ("v", &vc, hq + kvh)] {
            let mut want = kc0.clone();
            let flag = reference::kv_cache::append(
                &mut want[offset..offset + n],
                shape,
                &view(from),
                &seq,
                &pos,
            );
            assert_eq!(flag, 0);
            let got = got.to_host(s).unwrap();
            assert!(
                to_f64(&got) == to_f64(&want),
                "{name} (offset {offset}) differs from the reference"
            );
        }
    }
}

#[test]
fn append_shape_errors_name_the_argument() {
    let Some(gpu) = gpu_or_skip("append_shape_errors_name_the_argument") else {
        return;
    };
    let s = gpu.stream();
    let z = |shape: &[usize]| DeviceTensor::<f16>::zeros(s, shape).unwrap();
    let zi = |shape: &[usize]| DeviceTensor::<i32>::zeros(s, shape).unwrap();
    let mut cache = KvCache::<f16>::zeros(s, [2, 4, 16, 64]).unwrap();
    let (seq, pos) = (zi(&[3]), zi(&[3]));
    let slots = TokenSlots {
        seq_ids: &seq,
        positions: &pos,
    };
    let arg = |e: fl_kernels::Result<()>| match e {
        Err(Error::Shape { arg, .. }) => arg,
        other => panic!("expected a shape error, got {other:?}"),
    };
    let (k, v) = (z(&[3, 4, 64]), z(&[3, 4, 64]));
    assert_eq!(
        arg(kv_cache::append(
            s,
            &z(&[3, 2, 64]),
            &v,
            &slots,
            &mut cache,
            None
        )),
        "k"
    );
    assert_eq!(
        arg(kv_cache::append(
            s,
            &z(&[3, 4, 32]),
            &v,
            &slots,
            &mut cache,
            None
        )),
        "k"
    );
    assert_eq!(
        arg(kv_cache::append(
            s,
            &z(&[3, 256]),
            &v,
            &slots,
            &mut cache,
            None
        )),
        "k"
    );
    assert_eq!(
        arg(kv_cache::append(
            s,
            &k,
            &z(&[2, 4, 64]),
            &slots,
            &mut cache,
            None
        )),
        "v"
    );
    let short = zi(&[2]);
    let bad_seq = TokenSlots {
        seq_ids: &short,
        positions: &pos,
    };
    assert_eq!(
        arg(kv_cache::append(s, &k, &v, &bad_seq, &mut cache, None)),
        "seq_ids"
    );
    let bad_pos = TokenSlots {
        seq_ids: &seq,
        positions: &short,
    };
    assert_eq!(
        arg(kv_cache::append(s, &k, &v, &bad_pos, &mut cache, None)),
        "positions"
    );
    let mut flag2 = zi(&[2]);
    assert_eq!(
        arg(kv_cache::append(
            s,
            &k,
            &v,
            &slots,
            &mut cache,
            Some(&mut flag2)
        )),
        "err_flag"
    );
    assert_eq!(
        arg(kv_cache::append_paged(
            s,
            &k,
            &v,
            &slots,
            &zi(&[4]),
            &mut cache,
            None
        )),
        "block_table"
    );
    assert_eq!(
        arg(kv_cache::append_paged(
            s,
            &k,
            &v,
            &slots,
            &zi(&[2, 0]),
            &mut cache,
            None
        )),
        "block_table"
    );
    // KvCache::new
    assert!(matches!(
        KvCache::new(z(&[2, 4, 64]), z(&[2, 4, 64])),
        Err(Error::Shape { arg: "k", .. })
    ));
    assert!(matches!(
        KvCache::new(z(&[2, 4, 16, 64]), z(&[2, 4, 8, 64])),
        Err(Error::Shape { arg: "v", .. })
    ));
    // An empty cache with tokens to write is refused on the host.
    let mut empty = KvCache::<f16>::zeros(s, [2, 4, 0, 64]).unwrap();
    assert!(matches!(
        kv_cache::append(s, &k, &v, &slots, &mut empty, None),
        Err(Error::InvalidArgument { arg: "cache", .. })
    ));
    // No tokens: nothing to do.
    let (s0, p0) = (zi(&[0]), zi(&[0]));
    let none = TokenSlots {
        seq_ids: &s0,
        positions: &p0,
    };
    kv_cache::append(s, &z(&[0, 4, 64]), &z(&[0, 4, 64]), &none, &mut cache, None).unwrap();
}

#[test]
fn append_gpu_proptest() {
    let Some(gpu) = gpu_or_skip("append_gpu_proptest") else {
        return;
    };
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    });
    let strategy = (
        1usize..6,
        1usize..9,
        1usize..=160,
        1usize..80,
        1usize..20,
        any::<u64>(),
    );
    runner
        .run(&strategy, |(batch, kvh, hd, max_seq, block_size, seed)| {
            use rand::SeedableRng;
            let mut r = rand::rngs::StdRng::seed_from_u64(seed);
            let max_seq = max_seq.max(2);
            for b in scenarios(&mut r, batch, max_seq) {
                check_append::<bf16, bf16>(
                    &gpu,
                    [batch, kvh, max_seq, hd],
                    &Layout::Contiguous,
                    &b,
                    &mut r,
                );
                check_append::<f32, f16>(
                    &gpu,
                    [batch, kvh, max_seq, hd],
                    &Layout::Contiguous,
                    &b,
                    &mut r,
                );
                let max_blocks = max_seq.div_ceil(block_size);
                let num_blocks = batch * max_blocks + 1;
                let table = block_table(&mut r, batch, max_blocks, num_blocks);
                let layout = Layout::Paged {
                    table: &table,
                    max_blocks,
                };
                check_append::<f16, f16>(
                    &gpu,
                    [num_blocks, kvh, block_size, hd],
                    &layout,
                    &b,
                    &mut r,
                );
            }
            Ok(())
        })
        .unwrap();
}

// ---- reference properties (CPU only, run in CI) ----
proptest! {
    #[test]
    fn reference_writes_exactly_the_named_slots(
        batch in 1usize..5, kvh in 1usize..4, hd in 1usize..20, max_seq in 2usize..30, seed in any::<u64>()
    ) {
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let shape = [batch, kvh, max_seq, hd];
        let n = batch * kvh * max_seq * hd;
        for b in scenarios(&mut r, batch, max_seq) {
            let t = b.seq.len();
            let x: Vec<f32> = random(&mut r, t * kvh * hd);
            let mut cache = vec![f32::NAN; n];
            prop_assert_eq!(reference::kv_cache::append(&mut cache, shape, &x, &b.seq, &b.pos), 0);
            // Each token's rows hold its values, at [s, h, p, :]; nothing else changed.
            let mut written = vec![false; n];
            for tk in 0..t {
                for h in 0..kvh {
                    let dst = ((b.seq[tk] as usize * kvh + h) * max_seq + b.pos[tk] as usize) * hd;
                    for e in 0..hd {
                        prop_assert_eq!(cache[dst + e], x[(tk * kvh + h) * hd + e]);
                        written[dst + e] = true;
                    }
                }
            }
            for i in 0..n {
                prop_assert_eq!(cache[i].is_nan(), !written[i]);
            }
        }
    }

    #[test]
    fn reference_paged_agrees_with_contiguous_through_the_block_table(
        batch in 1usize..4, kvh in 1usize..4, hd in 1usize..12, max_seq in 2usize..40,
        block_size in 1usize..9, seed in any::<u64>()
    ) {
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let max_blocks = max_seq.div_ceil(block_size);
        let num_blocks = batch * max_blocks + 2;
        let table = block_table(&mut r, batch, max_blocks, num_blocks);
        for b in scenarios(&mut r, batch, max_seq) {
            let t = b.seq.len();
            let x: Vec<f16> = random(&mut r, t * kvh * hd);
            let cshape = [batch, kvh, max_seq, hd];
            let pshape = [num_blocks, kvh, block_size, hd];
            let mut contiguous = vec![f16::ZERO; cshape.iter().product()];
            let mut paged = vec![f16::ZERO; pshape.iter().product()];
            prop_assert_eq!(reference::kv_cache::append(&mut contiguous, cshape, &x, &b.seq, &b.pos), 0);
            prop_assert_eq!(
                reference::kv_cache::append_paged(&mut paged, pshape, &x, &b.seq, &b.pos, &table, max_blocks),
                0
            );
            for s in 0..batch {
                for p in 0..max_seq {
                    let c = reference::kv_cache::contiguous_slot(cshape, s as i32, p as i32).unwrap();
                    let q = reference::kv_cache::paged_slot(pshape, &table, max_blocks, s as i32, p as i32).unwrap();
                    for h in 0..kvh {
                        prop_assert_eq!(
                            &contiguous[c + h * max_seq * hd..][..hd],
                            &paged[q + h * block_size * hd..][..hd]
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn reference_flags_every_invalid_slot(
        seq in -3i32..6, pos in -3i32..40, entry in -2i32..12
    ) {
        // contiguous [4, 1, 32, 1]; paged [10, 1, 8, 1] with 4 blocks per sequence, all `entry`
        let c = reference::kv_cache::contiguous_slot([4, 1, 32, 1], seq, pos);
        let expect_c = if !(0..4).contains(&seq) { Err(ERR_SEQUENCE) }
            else if !(0..32).contains(&pos) { Err(ERR_POSITION) }
            else { Ok((seq * 32 + pos) as usize) };
        prop_assert_eq!(c, expect_c);
        let table = vec![entry; 16];
        let p = reference::kv_cache::paged_slot([10, 1, 8, 1], &table, 4, seq, pos);
        let expect_p = if !(0..4).contains(&seq) { Err(ERR_SEQUENCE) }
            else if !(0..32).contains(&pos) { Err(ERR_POSITION) }
            else if !(0..10).contains(&entry) { Err(ERR_BLOCK) }
            else { Ok((entry * 8 + pos % 8) as usize) };
        prop_assert_eq!(p, expect_p);
    }
}
