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

// ---- rope_append: fused QKV split + RoPE + append ----

use fl_kernels::kv_cache::{CacheLayout, QkvSplit, RopeAppend};
use fl_kernels::rope::{self, RopeParams, RopeStyle, Scaling};
use fl_kernels::testing::{rel_l2, tolerance};

/// The rotary configurations every fused case runs: full rotate-half; partial interleaved;
/// LLaMA-3 scaling; linear scaling with partial rotate-half.
fn ropes(d: usize) -> Vec<RopeParams> {
    let part = (d / 2) & !1;
    vec![
        RopeParams::new(d, 10_000.0),
        RopeParams::new(d, 10_000.0)
            .with_rotary_dim(part.max(2))
            .with_style(RopeStyle::Interleaved),
        RopeParams::new(d, 500_000.0).with_scaling(Scaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        }),
        RopeParams::new(d, 1_000_000.0)
            .with_rotary_dim(part.max(2))
            .with_scaling(Scaling::Linear { factor: 4.0 }),
    ]
}

/// `t` distinct (sequence, position) pairs of `batch` sequences, positions below `max_pos`,
/// in random order.
fn distinct_slots(r: &mut impl Rng, t: usize, batch: usize, max_pos: usize) -> Batch {
    let mut seen = std::collections::HashSet::new();
    let (mut seq, mut pos) = (vec![], vec![]);
    while seq.len() < t {
        let s = r.random_range(0..batch as i32);
        let p = r.random_range(0..max_pos as i32);
        if seen.insert((s, p)) {
            seq.push(s);
            pos.push(p);
        }
    }
    Batch { seq, pos }
}

/// A paged layout holding exactly the blocks the tokens need (distinct random ids), other
/// table entries -1: `(table, max_blocks, num_blocks)`.
fn sparse_table(
    r: &mut impl Rng,
    b: &Batch,
    batch: usize,
    max_pos: usize,
    block: usize,
) -> (Vec<i32>, usize, usize) {
    let max_blocks = max_pos.div_ceil(block);
    let mut table = vec![-1i32; batch * max_blocks];
    let mut need: Vec<usize> = b
        .seq
        .iter()
        .zip(&b.pos)
        .filter(|(s, p)| **s >= 0 && (0..batch as i32).contains(s) && **p >= 0)
        .map(|(&s, &p)| s as usize * max_blocks + (p as usize / block).min(max_blocks - 1))
        .collect();
    need.sort_unstable();
    need.dedup();
    let num_blocks = need.len() + 2;
    let mut ids: Vec<i32> = (0..num_blocks as i32).collect();
    ids.shuffle(r);
    for (i, e) in need.into_iter().enumerate() {
        table[e] = ids[i];
    }
    (table, max_blocks, num_blocks)
}

struct Fused<'a> {
    q_heads: usize,
    kv_heads: usize,
    rope: RopeParams,
    cache_shape: [usize; 4],
    layout: Layout<'a>,
    kv_out: bool,
}

/// One fused launch against (a) the unfused rope::apply + append on the GPU, bit for bit (caches
/// whole; q_out / k_out / v_out on the tokens whose slot exists), and (b) the CPU reference
/// (flag exact; q, k under tolerance; v exact; rows of invalid tokens still NaN; untouched
/// cache slots exact). Returns the flag.
fn check_rope_append<I: FloatDType, C: FloatDType>(
    gpu: &Gpu,
    f: &Fused<'_>,
    b: &Batch,
    r: &mut impl Rng,
) -> i32 {
    let s = gpu.stream();
    let (hq, hkv, d) = (f.q_heads, f.kv_heads, f.rope.head_dim);
    let t = b.seq.len();
    let row = (hq + 2 * hkv) * d;
    let qkv: Vec<I> = random(r, t * row);
    let n: usize = f.cache_shape.iter().product();
    let kc0: Vec<C> = random_nonzero(r, n, 2.0, 3.0);
    let vc0: Vec<C> = random_nonzero(r, n, 2.0, 3.0);
    let nan = I::from_f32(f32::NAN);
    let dqkv = DeviceTensor::from_host(s, &qkv, &[t, row]).unwrap();
    let seq = DeviceTensor::from_host(s, &b.seq, &[t]).unwrap();
    let pos = DeviceTensor::from_host(s, &b.pos, &[t]).unwrap();
    let slots = TokenSlots {
        seq_ids: &seq,
        positions: &pos,
    };
    let new_cache = || {
        KvCache::new(
            DeviceTensor::from_host(s, &kc0, &f.cache_shape).unwrap(),
            DeviceTensor::from_host(s, &vc0, &f.cache_shape).unwrap(),
        )
        .unwrap()
    };
    let (dtable, ref_layout) = match f.layout {
        Layout::Contiguous => (None, reference::kv_cache::Layout::Contiguous),
        Layout::Paged { table, max_blocks } => (
            Some(
                DeviceTensor::from_host(s, table, &[table.len() / max_blocks, max_blocks]).unwrap(),
            ),
            reference::kv_cache::Layout::Paged {
                block_table: table,
                max_blocks,
            },
        ),
    };
    let layout = match &dtable {
        None => CacheLayout::Contiguous,
        Some(t) => CacheLayout::Paged { block_table: t },
    };
    // fused
    let mut cache = new_cache();
    let mut q_out = DeviceTensor::filled(s, &[t, hq, d], nan).unwrap();
    let mut k_out = DeviceTensor::filled(s, &[t, hkv, d], nan).unwrap();
    let mut v_out = DeviceTensor::filled(s, &[t, hkv, d], nan).unwrap();
    let mut flag = DeviceTensor::<i32>::zeros(s, &[1]).unwrap();
    let args = RopeAppend {
        qkv: &dqkv,
        heads: QkvSplit {
            q_heads: hq,
            kv_heads: hkv,
        },
        slots,
        rope: &f.rope,
        layout,
    };
    let kv_out = f.kv_out.then_some((&mut k_out, &mut v_out));
    kv_cache::rope_append(s, &args, &mut q_out, kv_out, &mut cache, Some(&mut flag)).unwrap();
    let got_flag = flag.to_host(s).unwrap()[0];
    let gq = q_out.to_host(s).unwrap();
    let gk = k_out.to_host(s).unwrap();
    let gv = v_out.to_host(s).unwrap();
    let (gkc, gvc) = (cache.k().to_host(s).unwrap(), cache.v().to_host(s).unwrap());
    // unfused on the GPU
    let part = |from: usize, heads: usize| -> Vec<I> {
        (0..t)
            .flat_map(|i| qkv[i * row + from * d..][..heads * d].to_vec())
            .collect()
    };
    let mut uq = DeviceTensor::from_host(s, &part(0, hq), &[t, hq, d]).unwrap();
    let mut uk = DeviceTensor::from_host(s, &part(hq, hkv), &[t, hkv, d]).unwrap();
    let uv = DeviceTensor::from_host(s, &part(hq + hkv, hkv), &[t, hkv, d]).unwrap();
    rope::apply(s, &mut uq, &mut uk, &pos, &f.rope, None).unwrap();
    let mut ucache = new_cache();
    match &dtable {
        None => kv_cache::append(s, &uk, &uv, &slots, &mut ucache, None).unwrap(),
        Some(tb) => kv_cache::append_paged(s, &uk, &uv, &slots, tb, &mut ucache, None).unwrap(),
    }
    let (uq, uk, uv) = (
        uq.to_host(s).unwrap(),
        uk.to_host(s).unwrap(),
        uv.to_host(s).unwrap(),
    );
    // reference
    let (mut wk, mut wv) = (kc0.clone(), vc0.clone());
    let want = reference::kv_cache::rope_append(
        &qkv,
        hq,
        hkv,
        &f.rope,
        &b.seq,
        &b.pos,
        &mut wk,
        &mut wv,
        f.cache_shape,
        ref_layout,
    );
    // which cache elements the reference wrote
    let mut mask = vec![f32::NAN; n];
    let ones = vec![1f32; t * hkv * d];
    match ref_layout {
        reference::kv_cache::Layout::Contiguous => {
            reference::kv_cache::append(&mut mask, f.cache_shape, &ones, &b.seq, &b.pos);
        }
        reference::kv_cache::Layout::Paged {
            block_table,
            max_blocks,
        } => {
            reference::kv_cache::append_paged(
                &mut mask,
                f.cache_shape,
                &ones,
                &b.seq,
                &b.pos,
                block_table,
                max_blocks,
            );
        }
    }
    let what = format!(
        "{}->{} heads {hq}/{hkv} d {d} rotary {} {:?} {:?} cache {:?} {} tokens kv_out {}",
        I::NAME,
        C::NAME,
        f.rope.rotary_dim,
        f.rope.style,
        f.rope.scaling,
        f.cache_shape,
        t,
        f.kv_out
    );
    assert_eq!(got_flag, want.flag, "{what}: error flag");
    // (a) unfused, bit for bit
    assert!(
        to_f64(&gkc) == to_f64(&to_vec(ucache.k(), s)),
        "{what}: K cache differs from rope::apply + append"
    );
    assert!(
        to_f64(&gvc) == to_f64(&to_vec(ucache.v(), s)),
        "{what}: V cache differs from append"
    );
    let rows_match = |got: &[I], unfused: &[I], want: &[f64], name: &str| {
        for (i, ((g, u), w)) in got.iter().zip(unfused).zip(want).enumerate() {
            if w.is_nan() {
                assert!(
                    g.to_f64().is_nan(),
                    "{what}: {name}[{i}] written for an invalid slot"
                );
            } else {
                assert_eq!(
                    g.to_f64().to_bits(),
                    u.to_f64().to_bits(),
                    "{what}: {name}[{i}] differs from the unfused path"
                );
            }
        }
    };
    rows_match(&gq, &uq, &want.q, "q_out");
    if f.kv_out {
        rows_match(&gk, &uk, &want.k, "k_out");
        rows_match(&gv, &uv, &want.v, "v_out");
    } else {
        assert!(
            gk.iter().chain(&gv).all(|x| x.to_f64().is_nan()),
            "{what}: k_out / v_out written though not passed"
        );
    }
    // (b) reference
    let valid = |got: &[I], want: &[f64]| -> (Vec<I>, Vec<f64>) {
        got.iter()
            .zip(want)
            .filter(|(_, w)| !w.is_nan())
            .map(|(g, w)| (*g, *w))
            .unzip()
    };
    let (g, w) = valid(&gq, &want.q);
    let e = rel_l2(&g, &w);
    assert!(e < tolerance::<I>(), "{what}: q_out rel L2 {e}");
    if f.kv_out {
        let (g, w) = valid(&gk, &want.k);
        let e = rel_l2(&g, &w);
        assert!(e < tolerance::<I>(), "{what}: k_out rel L2 {e}");
        let (g, w) = valid(&gv, &want.v);
        assert!(to_f64(&g) == w, "{what}: v_out differs from v");
    }
    assert!(
        to_f64(&gvc) == to_f64(&wv),
        "{what}: V cache differs from the reference"
    );
    let (mut gw, mut ww) = (vec![], vec![]);
    for i in 0..n {
        if mask[i].is_nan() {
            assert_eq!(
                gkc[i].to_f64().to_bits(),
                kc0[i].to_f64().to_bits(),
                "{what}: K cache element {i} written though no token names it"
            );
        } else {
            gw.push(gkc[i]);
            ww.push(wk[i].to_f64());
        }
    }
    let tol = tolerance::<I>().max(tolerance::<C>());
    let e = rel_l2(&gw, &ww);
    assert!(e < tol, "{what}: K cache rel L2 {e}");
    if want.flag == 0 && t > 0 {
        assert!(!gw.is_empty(), "{what}: nothing written");
    }
    got_flag
}

fn to_vec<C: FloatDType>(
    x: &DeviceTensor<C>,
    s: &std::sync::Arc<fl_kernels::cudarc::driver::CudaStream>,
) -> Vec<C> {
    x.to_host(s).unwrap()
}

fn rope_append_dtypes(gpu: &Gpu, f: &Fused<'_>, b: &Batch, r: &mut impl Rng) {
    check_rope_append::<f16, f16>(gpu, f, b, r);
    check_rope_append::<bf16, bf16>(gpu, f, b, r);
    check_rope_append::<f32, f32>(gpu, f, b, r);
    check_rope_append::<f32, f16>(gpu, f, b, r);
    check_rope_append::<f32, bf16>(gpu, f, b, r);
    check_rope_append::<f16, f32>(gpu, f, b, r);
}

/// (q_heads, kv_heads, head_dim): GQA, MHA, MQA, head_dim 80, and sizes of the scalar path.
const FUSED_HEADS: &[(usize, usize, usize)] = &[
    (32, 8, 128),
    (4, 4, 64),
    (8, 1, 128),
    (3, 1, 80),
    (2, 1, 6),
    (3, 2, 10),
];

#[test]
fn rope_append_contiguous_matches_unfused_and_reference() {
    let Some(gpu) = gpu_or_skip("rope_append_contiguous_matches_unfused_and_reference") else {
        return;
    };
    let mut r = rng("rope_append_contiguous");
    let (batch, max_seq) = (3usize, 67usize);
    for &(hq, hkv, d) in FUSED_HEADS {
        for rope in ropes(d) {
            for (i, t) in [1usize, 7, 129].into_iter().enumerate() {
                let b = distinct_slots(&mut r, t, batch, max_seq);
                let f = Fused {
                    q_heads: hq,
                    kv_heads: hkv,
                    rope,
                    cache_shape: [batch, hkv, max_seq, d],
                    layout: Layout::Contiguous,
                    kv_out: i != 0,
                };
                rope_append_dtypes(&gpu, &f, &b, &mut r);
            }
        }
    }
}

#[test]
fn rope_append_paged_matches_unfused_and_reference() {
    let Some(gpu) = gpu_or_skip("rope_append_paged_matches_unfused_and_reference") else {
        return;
    };
    let mut r = rng("rope_append_paged");
    // positions up to 131072 (angles far from zero: sincos's slow path), few blocks used
    let (batch, max_pos) = (4usize, 131_072usize);
    for &(hq, hkv, d) in FUSED_HEADS {
        for rope in ropes(d) {
            for (i, t) in [1usize, 7, 129].into_iter().enumerate() {
                for block in [16usize, 5] {
                    let b = distinct_slots(&mut r, t, batch, max_pos);
                    let (table, max_blocks, num_blocks) =
                        sparse_table(&mut r, &b, batch, max_pos, block);
                    let f = Fused {
                        q_heads: hq,
                        kv_heads: hkv,
                        rope,
                        cache_shape: [num_blocks, hkv, block, d],
                        layout: Layout::Paged {
                            table: &table,
                            max_blocks,
                        },
                        kv_out: i != 1,
                    };
                    rope_append_dtypes(&gpu, &f, &b, &mut r);
                }
            }
        }
    }
}

#[test]
fn rope_append_invalid_slots_write_nothing_and_flag() {
    let Some(gpu) = gpu_or_skip("rope_append_invalid_slots_write_nothing_and_flag") else {
        return;
    };
    let mut r = rng("rope_append_invalid");
    let rope = RopeParams::new(64, 10_000.0);
    let contiguous = Fused {
        q_heads: 4,
        kv_heads: 2,
        rope,
        cache_shape: [3, 2, 10, 64],
        layout: Layout::Contiguous,
        kv_out: true,
    };
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
            check_rope_append::<f16, f16>(&gpu, &contiguous, &b, &mut r),
            bits
        );
        assert_eq!(
            check_rope_append::<f32, bf16>(&gpu, &contiguous, &b, &mut r),
            bits
        );
    }
    let table = [0, 5, 99, 1, -1, 2];
    let paged = Fused {
        q_heads: 4,
        kv_heads: 2,
        rope: rope.with_style(RopeStyle::Interleaved),
        cache_shape: [6, 2, 4, 64],
        layout: Layout::Paged {
            table: &table,
            max_blocks: 3,
        },
        kv_out: true,
    };
    let cases = [
        (vec![0, 1, 0], vec![0, 1, 11], ERR_BLOCK),
        (vec![0, 1], vec![3, 12], ERR_POSITION),
        (vec![0, 1], vec![8, 0], ERR_BLOCK),
        (vec![1, 1], vec![4, 0], ERR_BLOCK),
        (vec![2, 0], vec![0, 0], ERR_SEQUENCE),
        (vec![0, 0], vec![-5, 0], ERR_POSITION),
    ];
    for (seq, pos, bits) in cases {
        let b = Batch { seq, pos };
        assert_eq!(
            check_rope_append::<bf16, bf16>(&gpu, &paged, &b, &mut r),
            bits
        );
    }
}

#[test]
fn rope_append_errors_name_the_argument() {
    let Some(gpu) = gpu_or_skip("rope_append_errors_name_the_argument") else {
        return;
    };
    let s = gpu.stream();
    let z = |shape: &[usize]| DeviceTensor::<f16>::zeros(s, shape).unwrap();
    let zi = |shape: &[usize]| DeviceTensor::<i32>::zeros(s, shape).unwrap();
    let (t, hq, hkv, d) = (3usize, 4usize, 2usize, 64usize);
    let rope = RopeParams::new(d, 10_000.0);
    let (seq, pos) = (zi(&[t]), zi(&[t]));
    let qkv = z(&[t, (hq + 2 * hkv) * d]);
    let heads = QkvSplit {
        q_heads: hq,
        kv_heads: hkv,
    };
    fn mk<'a>(
        qkv: &'a DeviceTensor<f16>,
        heads: QkvSplit,
        seq_ids: &'a DeviceTensor<i32>,
        positions: &'a DeviceTensor<i32>,
        rope: &'a RopeParams,
        layout: CacheLayout<'a>,
    ) -> RopeAppend<'a, f16> {
        RopeAppend {
            qkv,
            heads,
            slots: TokenSlots { seq_ids, positions },
            rope,
            layout,
        }
    }
    let mut cache = KvCache::<f16>::zeros(s, [2, hkv, 16, d]).unwrap();
    let mut q = z(&[t, hq, d]);
    let run = |a: &RopeAppend<'_, f16>,
               q: &mut DeviceTensor<f16>,
               kv: Option<(&mut DeviceTensor<f16>, &mut DeviceTensor<f16>)>,
               cache: &mut KvCache<f16>,
               flag: Option<&mut DeviceTensor<i32>>| {
        match kv_cache::rope_append(s, a, q, kv, cache, flag) {
            Err(Error::Shape { arg, .. }) | Err(Error::InvalidArgument { arg, .. }) => arg,
            other => panic!("expected a shape or argument error, got {other:?}"),
        }
    };
    let good = mk(&qkv, heads, &seq, &pos, &rope, CacheLayout::Contiguous);
    // the good call works
    kv_cache::rope_append(s, &good, &mut q, None, &mut cache, None).unwrap();
    let bad_qkv = z(&[t, (hq + 2 * hkv) * d + 1]);
    let a = mk(&bad_qkv, heads, &seq, &pos, &rope, CacheLayout::Contiguous);
    assert_eq!(run(&a, &mut q, None, &mut cache, None), "qkv");
    let qkv3 = z(&[t, hq + 2 * hkv, d]);
    let a = mk(&qkv3, heads, &seq, &pos, &rope, CacheLayout::Contiguous);
    kv_cache::rope_append(s, &a, &mut q, None, &mut cache, None).unwrap();
    let short = zi(&[t - 1]);
    let a = mk(&qkv, heads, &short, &pos, &rope, CacheLayout::Contiguous);
    assert_eq!(run(&a, &mut q, None, &mut cache, None), "seq_ids");
    let a = mk(&qkv, heads, &seq, &short, &rope, CacheLayout::Contiguous);
    assert_eq!(run(&a, &mut q, None, &mut cache, None), "positions");
    assert_eq!(
        run(&good, &mut z(&[t, hq + 1, d]), None, &mut cache, None),
        "q_out"
    );
    let (mut ko, mut vo) = (z(&[t, hkv, d]), z(&[t, hkv, d]));
    kv_cache::rope_append(s, &good, &mut q, Some((&mut ko, &mut vo)), &mut cache, None).unwrap();
    assert_eq!(
        run(
            &good,
            &mut q,
            Some((&mut z(&[t, hkv, d + 1]), &mut vo)),
            &mut cache,
            None
        ),
        "k_out"
    );
    assert_eq!(
        run(
            &good,
            &mut q,
            Some((&mut ko, &mut z(&[t + 1, hkv, d]))),
            &mut cache,
            None
        ),
        "v_out"
    );
    let mut wrong_cache = KvCache::<f16>::zeros(s, [2, hkv + 1, 16, d]).unwrap();
    assert_eq!(run(&good, &mut q, None, &mut wrong_cache, None), "cache");
    let mut empty = KvCache::<f16>::zeros(s, [2, hkv, 0, d]).unwrap();
    assert_eq!(run(&good, &mut q, None, &mut empty, None), "cache");
    let mut flag2 = zi(&[2]);
    assert_eq!(
        run(&good, &mut q, None, &mut cache, Some(&mut flag2)),
        "err_flag"
    );
    let no_kv = QkvSplit {
        q_heads: hq + 2 * hkv,
        kv_heads: 0,
    };
    let a = mk(&qkv, no_kv, &seq, &pos, &rope, CacheLayout::Contiguous);
    assert_eq!(run(&a, &mut q, None, &mut cache, None), "heads");
    let bad_rope = rope.with_rotary_dim(3);
    let a = mk(&qkv, heads, &seq, &pos, &bad_rope, CacheLayout::Contiguous);
    assert_eq!(run(&a, &mut q, None, &mut cache, None), "rotary_dim");
    for shape in [&[4usize][..], &[2, 0]] {
        let tb = zi(shape);
        let a = mk(
            &qkv,
            heads,
            &seq,
            &pos,
            &rope,
            CacheLayout::Paged { block_table: &tb },
        );
        assert_eq!(run(&a, &mut q, None, &mut cache, None), "block_table");
    }
    // no tokens: nothing to do
    let (s0, p0, qkv0) = (zi(&[0]), zi(&[0]), z(&[0, (hq + 2 * hkv) * d]));
    let a = mk(&qkv0, heads, &s0, &p0, &rope, CacheLayout::Contiguous);
    kv_cache::rope_append(s, &a, &mut z(&[0, hq, d]), None, &mut cache, None).unwrap();
}

#[test]
fn rope_append_gpu_proptest() {
    let Some(gpu) = gpu_or_skip("rope_append_gpu_proptest") else {
        return;
    };
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    });
    let strategy = (
        0usize..6,
        1usize..5,
        1usize..=80,
        1usize..40,
        1usize..20,
        any::<bool>(),
        any::<u64>(),
    );
    runner
        .run(
            &strategy,
            |(hq, hkv, half, t, block_size, interleaved, seed)| {
                use rand::SeedableRng;
                let mut r = rand::rngs::StdRng::seed_from_u64(seed);
                let rotary = 2 * half;
                let d = rotary + r.random_range(0..8usize);
                let style = if interleaved {
                    RopeStyle::Interleaved
                } else {
                    RopeStyle::NeoX
                };
                let rope = RopeParams::new(d, 10_000.0)
                    .with_rotary_dim(rotary)
                    .with_style(style);
                let (batch, max_seq) = (3usize, 50usize);
                let b = distinct_slots(&mut r, t, batch, max_seq);
                let f = Fused {
                    q_heads: hq,
                    kv_heads: hkv,
                    rope,
                    cache_shape: [batch, hkv, max_seq, d],
                    layout: Layout::Contiguous,
                    kv_out: seed % 2 == 0,
                };
                check_rope_append::<bf16, bf16>(&gpu, &f, &b, &mut r);
                check_rope_append::<f32, f16>(&gpu, &f, &b, &mut r);
                let (table, max_blocks, num_blocks) =
                    sparse_table(&mut r, &b, batch, max_seq, block_size);
                let f = Fused {
                    cache_shape: [num_blocks, hkv, block_size, d],
                    layout: Layout::Paged {
                        table: &table,
                        max_blocks,
                    },
                    ..f
                };
                check_rope_append::<f16, f16>(&gpu, &f, &b, &mut r);
                Ok(())
            },
        )
        .unwrap();
}

proptest! {
    #[test]
    fn reference_rope_append_is_rope_then_append(
        hq in 0usize..4, hkv in 1usize..3, half in 1usize..6, extra in 0usize..3,
        interleaved in any::<bool>(), seed in any::<u64>()
    ) {
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let d = 2 * half + extra;
        let style = if interleaved { RopeStyle::Interleaved } else { RopeStyle::NeoX };
        let rope = RopeParams::new(d, 10_000.0).with_rotary_dim(2 * half).with_style(style);
        let (batch, max_seq) = (3usize, 9usize);
        let t = r.random_range(1..12usize);
        let mut b = distinct_slots(&mut r, t, batch, max_seq);
        // one token with an invalid slot, sometimes
        let bad = seed % 3 == 0;
        if bad {
            b.seq[0] = batch as i32;
        }
        let row = (hq + 2 * hkv) * d;
        let qkv: Vec<f32> = random(&mut r, t * row);
        let shape = [batch, hkv, max_seq, d];
        let n = batch * hkv * max_seq * d;
        let (mut kc, mut vc) = (vec![f32::NAN; n], vec![f32::NAN; n]);
        let out = reference::kv_cache::rope_append(
            &qkv, hq, hkv, &rope, &b.seq, &b.pos, &mut kc, &mut vc, shape,
            reference::kv_cache::Layout::Contiguous,
        );
        prop_assert_eq!(out.flag, if bad { ERR_SEQUENCE } else { 0 });
        let inv = rope.inv_freq().unwrap();
        for tk in 0..t {
            let valid = !(bad && tk == 0);
            for h in 0..hq + 2 * hkv {
                let x = &qkv[tk * row + h * d..][..d];
                let (got, cache): (&[f64], Option<&[f32]>) = if h < hq {
                    (&out.q[(tk * hq + h) * d..][..d], None)
                } else {
                    let (kh, is_k) = if h < hq + hkv { (h - hq, true) } else { (h - hq - hkv, false) };
                    let src = if is_k { &out.k } else { &out.v };
                    let c = if is_k { &kc } else { &vc };
                    let dst = ((b.seq[tk].max(0) as usize % batch * hkv + kh) * max_seq
                        + b.pos[tk] as usize) * d;
                    (&src[(tk * hkv + kh) * d..][..d], valid.then(|| &c[dst..][..d]))
                };
                if !valid {
                    prop_assert!(got.iter().all(|g| g.is_nan()));
                    continue;
                }
                let rotates = h < hq + hkv;
                // pairs rotate by the f32 angle; the norm of each pair is kept; the rest copied
                let mut done = vec![false; d];
                if rotates {
                    for (i, &f) in inv.iter().enumerate() {
                        let (i0, i1) = reference::rope::pair(style, 2 * half, i);
                        let a = (b.pos[tk] as f32 * f) as f64;
                        let (x0, x1) = (x[i0] as f64, x[i1] as f64);
                        prop_assert!((got[i0] - (x0 * a.cos() - x1 * a.sin())).abs() < 1e-12);
                        prop_assert!((got[i1] - (x1 * a.cos() + x0 * a.sin())).abs() < 1e-12);
                        done[i0] = true;
                        done[i1] = true;
                    }
                }
                for e in 0..d {
                    if !done[e] {
                        prop_assert_eq!(got[e], x[e] as f64);
                    }
                }
                if let Some(c) = cache {
                    for e in 0..d {
                        prop_assert_eq!(c[e], got[e] as f32);
                    }
                }
            }
        }
        // the invalid token wrote nothing: exactly (t - bad) * hkv * d cache elements each
        let written = kc.iter().filter(|x| !x.is_nan()).count();
        prop_assert_eq!(written, (t - usize::from(bad)) * hkv * d);
        prop_assert_eq!(vc.iter().filter(|x| !x.is_nan()).count(), written);
    }
}

// ---------------------------------------------------------------------------------------------
// copy_blocks: copy-on-write block copies of a paged cache.

/// `n` copy-on-write pairs over `num_blocks` blocks (row-major `[n, 2]`): distinct dst blocks,
/// src blocks drawn (with repeats, as forks of one block) from the others.
fn cow_pairs(r: &mut impl Rng, num_blocks: usize, n: usize) -> Vec<i32> {
    assert!(n < num_blocks);
    let mut ids: Vec<i32> = (0..num_blocks as i32).collect();
    ids.shuffle(r);
    let (dst, src) = ids.split_at(n);
    dst.iter()
        .flat_map(|&d| [src[r.random_range(0..src.len())], d])
        .collect()
}

/// Pair sets for `num_blocks` (>= 7) blocks: one pair between the first and last block, one
/// block forked into several, pairs between neighbouring ids that look chained but are not
/// (0 -> 1, 2 -> 3, ...: no dst is a src), and random ones.
fn cow_scenarios(r: &mut impl Rng, num_blocks: usize) -> Vec<Vec<i32>> {
    let last = num_blocks as i32 - 1;
    let neighbours: Vec<i32> = (0..num_blocks as i32 / 2)
        .flat_map(|i| [2 * i, 2 * i + 1])
        .collect();
    vec![
        vec![0, last],
        vec![last, 0],
        vec![3, 1, 3, 5, 3, last, 3, 0],
        neighbours,
        vec![5, 4, 3, 2, 1, 0],
        cow_pairs(r, num_blocks, num_blocks / 2),
        cow_pairs(r, num_blocks, num_blocks - 1),
    ]
}

/// Runs copy_blocks on the GPU and the reference on the CPU from the same random caches; both
/// caches must match bit for bit, every block that is no dst must be unchanged, and the flags
/// must agree. Returns the flag.
fn check_copy_blocks<C: FloatDType>(
    gpu: &Gpu,
    cache_shape: [usize; 4],
    pairs: &[i32],
    r: &mut impl Rng,
) -> i32 {
    let s = gpu.stream();
    let n_elems: usize = cache_shape.iter().product();
    let block = n_elems / cache_shape[0];
    let kc0: Vec<C> = random_nonzero(r, n_elems, 2.0, 3.0);
    let vc0: Vec<C> = random_nonzero(r, n_elems, 2.0, 3.0);
    let mut cache = KvCache::new(
        DeviceTensor::from_host(s, &kc0, &cache_shape).unwrap(),
        DeviceTensor::from_host(s, &vc0, &cache_shape).unwrap(),
    )
    .unwrap();
    let n = pairs.len() / 2;
    let dp = DeviceTensor::from_host(s, pairs, &[n, 2]).unwrap();
    let mut flag = DeviceTensor::<i32>::zeros(s, &[1]).unwrap();
    kv_cache::copy_blocks(s, &dp, &mut cache, Some(&mut flag)).unwrap();
    let (mut wk, mut wv) = (kc0.clone(), vc0.clone());
    let want_flag = reference::kv_cache::copy_blocks(&mut wk, cache_shape, pairs)
        | reference::kv_cache::copy_blocks(&mut wv, cache_shape, pairs);
    let got_flag = flag.to_host(s).unwrap()[0];
    let (gk, gv) = (cache.k().to_host(s).unwrap(), cache.v().to_host(s).unwrap());
    let what = format!("{} cache {cache_shape:?} pairs {pairs:?}", C::NAME);
    assert_eq!(got_flag, want_flag, "{what}: error flag");
    for (name, got, want, before) in [("K", &gk, &wk, &kc0), ("V", &gv, &wv, &vc0)] {
        let (got, want, before) = (to_f64(got), to_f64(want), to_f64(before));
        for b in 0..cache_shape[0] {
            let blk = |x: &[f64]| x[b * block..][..block].to_vec();
            assert!(
                blk(&got) == blk(&want),
                "{what}: {name} block {b} differs from the reference"
            );
            let in_pool = |id: i32| id >= 0 && (id as usize) < cache_shape[0];
            let is_dst = pairs
                .chunks(2)
                .any(|p| p[1] == b as i32 && in_pool(p[0]) && in_pool(p[1]));
            if !is_dst {
                assert!(
                    blk(&got) == blk(&before),
                    "{what}: {name} block {b} was written"
                );
            }
        }
    }
    got_flag
}

#[test]
fn copy_blocks_matches_reference() {
    let Some(gpu) = gpu_or_skip("copy_blocks_matches_reference") else {
        return;
    };
    let mut r = rng("kv_copy_blocks");
    // (kv_heads, block_size, head_dim): 16-byte words, odd block sizes, and blocks whose byte
    // size takes 8-, 4- or 2-byte words (head_dim 4 and 7).
    let geoms = [
        (8, 16, 128),
        (1, 16, 64),
        (3, 5, 64),
        (2, 7, 128),
        (1, 5, 7),
        (1, 3, 4),
    ];
    for num_blocks in [7usize, 37] {
        for &(kvh, bs, hd) in &geoms {
            let shape = [num_blocks, kvh, bs, hd];
            for pairs in cow_scenarios(&mut r, num_blocks) {
                assert_eq!(check_copy_blocks::<f32>(&gpu, shape, &pairs, &mut r), 0);
                assert_eq!(check_copy_blocks::<f16>(&gpu, shape, &pairs, &mut r), 0);
                assert_eq!(check_copy_blocks::<bf16>(&gpu, shape, &pairs, &mut r), 0);
            }
        }
    }
}

#[test]
fn copy_blocks_out_of_range_pairs_copy_nothing_and_flag() {
    let Some(gpu) = gpu_or_skip("copy_blocks_out_of_range_pairs_copy_nothing_and_flag") else {
        return;
    };
    let s = gpu.stream();
    let mut r = rng("kv_copy_blocks_invalid");
    let shape = [7, 2, 16, 64];
    // Mixed with valid pairs (those still copy), and alone.
    let cases: [&[i32]; 6] = [
        &[0, 3, 7, 4, 1, 6],
        &[-1, 5, 2, 4],
        &[2, 99, 0, 1],
        &[1, -3],
        &[i32::MIN, i32::MAX],
        &[7, 7],
    ];
    for pairs in cases {
        assert_eq!(
            check_copy_blocks::<f16>(&gpu, shape, pairs, &mut r),
            ERR_BLOCK,
            "pairs {pairs:?}"
        );
    }
    let flag = DeviceTensor::from_host(s, &[ERR_BLOCK], &[1]).unwrap();
    match kv_cache::check_error_flag(s, &flag) {
        Err(Error::DeviceCheck { reason, .. }) => assert!(reason.contains("block"), "{reason}"),
        other => panic!("expected a device-check error, got {other:?}"),
    }
}

#[test]
fn copy_blocks_without_pairs_is_a_no_op() {
    let Some(gpu) = gpu_or_skip("copy_blocks_without_pairs_is_a_no_op") else {
        return;
    };
    let s = gpu.stream();
    let mut r = rng("kv_copy_blocks_empty");
    let shape = [37, 2, 5, 128];
    assert_eq!(check_copy_blocks::<bf16>(&gpu, shape, &[], &mut r), 0);
    // A flag already set stays set (never cleared by a launch).
    let mut cache = KvCache::<f32>::zeros(s, shape).unwrap();
    let pairs = DeviceTensor::<i32>::zeros(s, &[0, 2]).unwrap();
    let mut flag = DeviceTensor::from_host(s, &[ERR_SEQUENCE], &[1]).unwrap();
    kv_cache::copy_blocks(s, &pairs, &mut cache, Some(&mut flag)).unwrap();
    assert_eq!(flag.to_host(s).unwrap(), [ERR_SEQUENCE]);
}

#[test]
fn copy_blocks_errors_name_the_argument() {
    let Some(gpu) = gpu_or_skip("copy_blocks_errors_name_the_argument") else {
        return;
    };
    let s = gpu.stream();
    let mut cache = KvCache::<f16>::zeros(s, [7, 2, 16, 64]).unwrap();
    let zi = |shape: &[usize]| DeviceTensor::<i32>::zeros(s, shape).unwrap();
    let arg = |e: fl_kernels::Result<()>| match e {
        Err(Error::Shape { arg, .. }) => arg,
        other => panic!("expected a shape error, got {other:?}"),
    };
    for bad in [&[4][..], &[2, 3], &[2, 1], &[1, 2, 2], &[4, 0]] {
        assert_eq!(
            arg(kv_cache::copy_blocks(s, &zi(bad), &mut cache, None)),
            "pairs",
            "{bad:?}"
        );
    }
    let mut flag = zi(&[2]);
    assert_eq!(
        arg(kv_cache::copy_blocks(
            s,
            &zi(&[1, 2]),
            &mut cache,
            Some(&mut flag)
        )),
        "err_flag"
    );
}

#[test]
fn copy_blocks_raw_launcher_unaligned_and_byte_caches() {
    // Raw launcher: u8 caches (a quantised cache is copied as bytes), one byte off so only
    // 1-byte words fit, and f16 caches one element off (2-byte words).
    let Some(gpu) = gpu_or_skip("copy_blocks_raw_launcher_unaligned_and_byte_caches") else {
        return;
    };
    use fl_kernels::cudarc::driver::{DevicePtr, DevicePtrMut};
    use fl_kernels_sys::fl_dtype;
    let s = gpu.stream();
    let mut r = rng("kv_copy_blocks_raw");
    let shape = [37usize, 2, 5, 64];
    let n: usize = shape.iter().product();
    let block = n / shape[0];
    let pairs = cow_pairs(&mut r, shape[0], 11);
    let dp = DeviceTensor::from_host(s, &pairs, &[11, 2]).unwrap();
    for (dtype, size) in [(fl_dtype::FL_DTYPE_U8, 1usize), (fl_dtype::FL_DTYPE_F16, 2)] {
        for offset in [0usize, 1] {
            // Bytes of one cache plus one element, so the offset view is a whole cache.
            let bytes = (n + 1) * size;
            let k0: Vec<u8> = (0..bytes).map(|_| r.random()).collect();
            let v0: Vec<u8> = (0..bytes).map(|_| r.random()).collect();
            let mut kc = DeviceTensor::from_host(s, &k0, &[bytes]).unwrap();
            let mut vc = DeviceTensor::from_host(s, &v0, &[bytes]).unwrap();
            {
                let (pp, _g1) = dp.as_slice().device_ptr(s);
                let (pk, _g2) = kc.as_slice_mut().device_ptr_mut(s);
                let (pv, _g3) = vc.as_slice_mut().device_ptr_mut(s);
                let off = (offset * size) as u64;
                // SAFETY: each cache buffer holds n + 1 elements of `size` bytes, so the view
                // `offset` elements in holds num_blocks whole blocks; pairs holds 11 * 2 i32 of
                // valid, distinct dst ids.
                let st = unsafe {
                    fl_kernels_sys::fl_kv_copy_blocks(
                        dtype,
                        (pk + off) as _,
                        (pv + off) as _,
                        shape[0] as i64,
                        shape[1] as i32,
                        shape[2] as i32,
                        shape[3] as i32,
                        pp as _,
                        11,
                        std::ptr::null_mut(),
                        s.cu_stream() as _,
                    )
                };
                assert_eq!(st, 0);
            }
            for (name, got, before) in [("k", &kc, &k0), ("v", &vc, &v0)] {
                let mut want = before.clone();
                let bb = block * size;
                let o = offset * size;
                for p in pairs.chunks(2) {
                    let (src, dst) = (p[0] as usize, p[1] as usize);
                    want[o + dst * bb..][..bb].copy_from_slice(&before[o + src * bb..][..bb]);
                }
                assert!(
                    got.to_host(s).unwrap() == want,
                    "{name} ({dtype:?}, offset {offset}) differs from the CPU copy"
                );
            }
        }
    }
}

#[test]
fn copy_blocks_launcher_checks_arguments() {
    // Host-side checks only: nothing is launched, so this runs without a GPU.
    use fl_kernels_sys::{fl_dtype, FL_ERR_INVALID_ARGUMENT};
    let mut word = 0i32;
    let p = &mut word as *mut i32 as *mut std::ffi::c_void;
    let pairs = &word as *const i32;
    let null = std::ptr::null_mut();
    let launch = |dtype, k, v, blocks: i64, geom: [i32; 3], pairs, n| {
        // SAFETY: every call below fails the host checks or has n == 0, so no pointer is read
        // and nothing is launched.
        unsafe {
            fl_kernels_sys::fl_kv_copy_blocks(
                dtype, k, v, blocks, geom[0], geom[1], geom[2], pairs, n, null as _, null,
            )
        }
    };
    let f16 = fl_dtype::FL_DTYPE_F16;
    let g = [2, 16, 64];
    let invalid = FL_ERR_INVALID_ARGUMENT;
    // n == 0 is a no-op, with or without buffers
    assert_eq!(launch(f16, null, null, 7, g, std::ptr::null(), 0), 0);
    assert_eq!(launch(f16, p, p, 7, g, pairs, 0), 0);
    // sizes
    assert_eq!(launch(f16, p, p, 0, g, pairs, 0), invalid);
    assert_eq!(launch(f16, p, p, 7, [0, 16, 64], pairs, 1), invalid);
    assert_eq!(launch(f16, p, p, 7, [2, 0, 64], pairs, 1), invalid);
    assert_eq!(launch(f16, p, p, 7, [2, 16, -1], pairs, 1), invalid);
    assert_eq!(launch(f16, p, p, 7, g, pairs, -1), invalid);
    let huge = [i32::MAX, i32::MAX, i32::MAX];
    assert_eq!(launch(f16, p, p, 7, huge, pairs, 1), invalid);
    assert_eq!(launch(f16, p, p, i64::MAX, g, pairs, 1), invalid);
    // NULL pointers with pairs
    assert_eq!(launch(f16, null, p, 7, g, pairs, 1), invalid);
    assert_eq!(launch(f16, p, null, 7, g, pairs, 1), invalid);
    assert_eq!(launch(f16, p, p, 7, g, std::ptr::null(), 1), invalid);
}

proptest! {
    /// The reference: every dst block equals its src block as it was, every other block is
    /// unchanged, and only out-of-range pairs (which copy nothing) set ERR_BLOCK.
    #[test]
    fn copy_blocks_reference_properties(
        num_blocks in 2usize..40,
        block in 1usize..24,
        frac in 0.0f64..1.0,
        bad in proptest::option::of(0usize..3),
        seed in any::<u64>(),
    ) {
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let n = ((num_blocks - 1) as f64 * frac) as usize;
        let mut pairs = cow_pairs(&mut r, num_blocks, n);
        if let Some(which) = bad {
            let id = [-1, num_blocks as i32, i32::MAX][which];
            pairs.extend([id, 0]);
        }
        let shape = [num_blocks, 1, block, 1];
        let before: Vec<f32> = random_nonzero(&mut r, num_blocks * block, 1.0, 2.0);
        let mut cache = before.clone();
        let flag = reference::kv_cache::copy_blocks(&mut cache, shape, &pairs);
        prop_assert_eq!(flag, if bad.is_some() { ERR_BLOCK } else { 0 });
        for b in 0..num_blocks {
            let got = &cache[b * block..][..block];
            match pairs[..2 * n].chunks(2).find(|p| p[1] == b as i32) {
                Some(p) => prop_assert_eq!(got, &before[p[0] as usize * block..][..block]),
                None => prop_assert_eq!(got, &before[b * block..][..block]),
            }
        }
    }
}
