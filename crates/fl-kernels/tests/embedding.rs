//! embedding::lookup and DeviceStatus on the GPU against reference::embedding, and property
//! tests of the reference (these run without a GPU).

use fl_kernels::embedding::{self, DeviceStatus};
use fl_kernels::testing::{gpu_or_skip, random, rel_l2, rng, strategies, to_f64, tolerance};
use fl_kernels::{bf16, f16, reference, DeviceTensor, Error, FloatDType, Gpu};
use proptest::prelude::*;
use rand::Rng;

/// (tokens, vocab, hidden): odd and vector-width sizes, one token to many.
const SHAPES: &[(usize, usize, usize)] = &[
    (1, 1, 1),
    (1, 32000, 4096),
    (7, 100, 7),
    (3, 10, 8),
    (129, 1000, 129),
    (64, 513, 4095),
    (2, 50, 12),
    (33, 257, 4097),
    (4096, 2048, 64),
];

/// Larger layouts (f16 words of 16 bytes): 4096 rows of 512 words (the bench's mid size);
/// 640-word rows; one-word rows; rows longer than a block's chunk of 1024 words (several
/// chunks per row); a row count just past a power of two.
const LARGE_SHAPES: &[(usize, usize, usize)] = &[
    (4096, 2048, 4096),
    (1000, 300, 5120),
    (5000, 50, 8),
    (3, 10, 40_000),
    (700, 64, 16_392),
    (4097, 100, 4096),
];

/// Runs one lookup of random in-range ids into a NaN-poisoned output and compares it with
/// the reference: bit-exact (it is a copy) and within the dtype's tolerance.
fn check_lookup<T: FloatDType>(gpu: &Gpu, n: usize, vocab: usize, hidden: usize, r: &mut impl Rng) {
    let s = gpu.stream();
    let ids: Vec<i32> = (0..n).map(|_| r.random_range(0..vocab as i32)).collect();
    let table: Vec<T> = random(r, vocab * hidden);
    let d_ids = DeviceTensor::from_host(s, &ids, &[n]).unwrap();
    let d_table = DeviceTensor::from_host(s, &table, &[vocab, hidden]).unwrap();
    let mut out = DeviceTensor::filled(s, &[n, hidden], T::from_f32(f32::NAN)).unwrap();
    let mut status = DeviceStatus::new(s).unwrap();
    embedding::lookup(s, &d_ids, &d_table, &mut out, &mut status).unwrap();
    status.check(s).unwrap();
    let got = out.to_host(s).unwrap();
    let want = reference::embedding::lookup(&ids, &table, hidden);
    assert!(want.bad.is_empty());
    let want = to_f64(&want.out);
    let err = rel_l2(&got, &want);
    let what = format!("lookup<{}> n={n} vocab={vocab} hidden={hidden}", T::NAME);
    assert!(err < tolerance::<T>(), "{what}: rel L2 {err:e}");
    assert_eq!(to_f64(&got), want, "{what}: not bit-exact");
}

#[test]
fn lookup_matches_reference_all_dtypes_odd_sizes() {
    let Some(gpu) = gpu_or_skip("lookup_matches_reference_all_dtypes_odd_sizes") else {
        return;
    };
    let mut r = rng("lookup");
    for &(n, vocab, hidden) in SHAPES {
        check_lookup::<f32>(&gpu, n, vocab, hidden, &mut r);
        check_lookup::<f16>(&gpu, n, vocab, hidden, &mut r);
        check_lookup::<bf16>(&gpu, n, vocab, hidden, &mut r);
    }
}

/// Many rows, long rows split into several chunks, one-word rows, all dtypes.
#[test]
fn lookup_large_and_multi_chunk_rows_match_reference() {
    let Some(gpu) = gpu_or_skip("lookup_large_and_multi_chunk_rows_match_reference") else {
        return;
    };
    let mut r = rng("lookup_large");
    for &(n, vocab, hidden) in LARGE_SHAPES {
        check_lookup::<f16>(&gpu, n, vocab, hidden, &mut r);
        check_lookup::<bf16>(&gpu, n, vocab, hidden, &mut r);
        check_lookup::<f32>(&gpu, n, vocab, hidden, &mut r);
    }
}

#[test]
fn bad_ids_are_reported_with_position_and_id_and_read_nothing() {
    let Some(gpu) = gpu_or_skip("bad_ids_are_reported_with_position_and_id_and_read_nothing")
    else {
        return;
    };
    let s = gpu.stream();
    let mut r = rng("lookup_bad_ids");
    // hidden 24 f16: 48-byte rows (16-byte words); 4100: 8200-byte rows (8-byte words, two
    // chunks per row).
    for (hidden, bad) in [24usize, 4100]
        .into_iter()
        .flat_map(|h| [-1, 37, i32::MAX, i32::MIN, 37 + 1000].map(move |b| (h, b)))
    {
        let vocab = 37usize;
        let mut ids: Vec<i32> = (0..50).map(|_| r.random_range(0..vocab as i32)).collect();
        ids[13] = bad;
        ids[40] = -7; // a second bad id, later: the report names the first
        let table: Vec<f16> = random(&mut r, vocab * hidden);
        let d_ids = DeviceTensor::from_host(s, &ids, &[50]).unwrap();
        let d_table = DeviceTensor::from_host(s, &table, &[vocab, hidden]).unwrap();
        let mut out = DeviceTensor::filled(s, &[50, hidden], f16::NAN).unwrap();
        let mut status = DeviceStatus::new(s).unwrap();
        // The launch itself succeeds: the check happens on the device.
        embedding::lookup(s, &d_ids, &d_table, &mut out, &mut status).unwrap();
        let what = format!("bad={bad} hidden={hidden}");
        match status.check(s) {
            Err(Error::DeviceCheck { op, reason }) => {
                assert_eq!(op, "embedding::lookup");
                assert!(reason.contains("position 13"), "{what}: {reason}");
                assert!(reason.contains(&format!("id {bad}")), "{what}: {reason}");
                assert!(reason.starts_with("2 token id"), "{what}: {reason}");
                assert!(reason.contains(&format!("[0, {vocab})")), "{reason}");
            }
            other => panic!("{what}: expected Error::DeviceCheck, got {other:?}"),
        }
        // The bad rows are zero (nothing read), the good rows are the table's.
        let got = out.to_host(s).unwrap();
        let want = reference::embedding::lookup(&ids, &table, hidden);
        assert_eq!(want.bad, vec![(13, bad), (40, -7)]);
        assert_eq!(to_f64(&got), to_f64(&want.out), "{what}");
        assert!(got[13 * hidden..14 * hidden]
            .iter()
            .all(|x| x.to_bits() == 0));
        // check() cleared the status.
        status.check(s).unwrap();
    }
}

#[test]
fn status_is_sticky_across_launches_until_checked() {
    let Some(gpu) = gpu_or_skip("status_is_sticky_across_launches_until_checked") else {
        return;
    };
    let s = gpu.stream();
    let (vocab, hidden) = (10usize, 16usize);
    let table = DeviceTensor::filled(s, &[vocab, hidden], 1.5f32).unwrap();
    let mut out = DeviceTensor::<f32>::zeros(s, &[4, hidden]).unwrap();
    let good = DeviceTensor::from_host(s, &[0i32, 1, 2, 9], &[4]).unwrap();
    let bad_a = DeviceTensor::from_host(s, &[0i32, 10, 2, 11], &[4]).unwrap();
    let bad_b = DeviceTensor::from_host(s, &[-2i32, 1, 2, 3], &[4]).unwrap();
    let mut status = DeviceStatus::new(s).unwrap();
    embedding::lookup(s, &good, &table, &mut out, &mut status).unwrap();
    embedding::lookup(s, &bad_a, &table, &mut out, &mut status).unwrap();
    embedding::lookup(s, &good, &table, &mut out, &mut status).unwrap();
    embedding::lookup(s, &bad_b, &table, &mut out, &mut status).unwrap();
    let err = status.check(s).unwrap_err().to_string();
    // Three failures in all; the details are those of the first failing launch (bad_a),
    // its smallest position.
    assert!(err.contains("3 token id"), "{err}");
    assert!(err.contains("position 1 is id 10"), "{err}");
    status.check(s).unwrap();
    // After the reset a new failure is described afresh.
    embedding::lookup(s, &bad_b, &table, &mut out, &mut status).unwrap();
    let err = status.check(s).unwrap_err().to_string();
    assert!(err.contains("1 token id"), "{err}");
    assert!(err.contains("position 0 is id -2"), "{err}");
}

#[test]
fn ids_of_any_shape_and_empty_input() {
    let Some(gpu) = gpu_or_skip("ids_of_any_shape_and_empty_input") else {
        return;
    };
    let s = gpu.stream();
    let mut r = rng("lookup_shapes");
    let (vocab, hidden) = (20usize, 40usize);
    let table: Vec<bf16> = random(&mut r, vocab * hidden);
    let d_table = DeviceTensor::from_host(s, &table, &[vocab, hidden]).unwrap();
    let ids: Vec<i32> = (0..6).map(|_| r.random_range(0..vocab as i32)).collect();
    let d_ids = DeviceTensor::from_host(s, &ids, &[2, 3]).unwrap();
    let mut out = DeviceTensor::filled(s, &[2, 3, hidden], bf16::NAN).unwrap();
    let mut status = DeviceStatus::new(s).unwrap();
    embedding::lookup(s, &d_ids, &d_table, &mut out, &mut status).unwrap();
    status.check(s).unwrap();
    let want = reference::embedding::lookup(&ids, &table, hidden).out;
    assert_eq!(to_f64(&out.to_host(s).unwrap()), to_f64(&want));
    // Empty ids launch nothing.
    let e = DeviceTensor::<i32>::zeros(s, &[0]).unwrap();
    let mut eo = DeviceTensor::<bf16>::zeros(s, &[0, hidden]).unwrap();
    embedding::lookup(s, &e, &d_table, &mut eo, &mut status).unwrap();
    status.check(s).unwrap();
}

#[test]
fn shape_errors_name_the_argument() {
    let Some(gpu) = gpu_or_skip("embedding_shape_errors_name_the_argument") else {
        return;
    };
    let s = gpu.stream();
    let ids = DeviceTensor::from_host(s, &[0i32, 1], &[2]).unwrap();
    let table = DeviceTensor::<f32>::zeros(s, &[4, 8]).unwrap();
    let mut status = DeviceStatus::new(s).unwrap();
    let mut out = DeviceTensor::<f32>::zeros(s, &[2, 7]).unwrap();
    assert!(matches!(
        embedding::lookup(s, &ids, &table, &mut out, &mut status),
        Err(Error::Shape { arg: "out", .. })
    ));
    let mut out = DeviceTensor::<f32>::zeros(s, &[3, 8]).unwrap();
    assert!(matches!(
        embedding::lookup(s, &ids, &table, &mut out, &mut status),
        Err(Error::Shape { arg: "out", .. })
    ));
    let flat = DeviceTensor::<f32>::zeros(s, &[32]).unwrap();
    let mut out = DeviceTensor::<f32>::zeros(s, &[2, 8]).unwrap();
    assert!(matches!(
        embedding::lookup(s, &ids, &flat, &mut out, &mut status),
        Err(Error::Shape { arg: "table", .. })
    ));
    let thin = DeviceTensor::<f32>::zeros(s, &[4, 0]).unwrap();
    let mut out = DeviceTensor::<f32>::zeros(s, &[2, 0]).unwrap();
    assert!(matches!(
        embedding::lookup(s, &ids, &thin, &mut out, &mut status),
        Err(Error::InvalidArgument { arg: "table", .. })
    ));
    status.check(s).unwrap();
}

#[test]
fn unaligned_table_takes_the_narrow_word_path() {
    // Raw launcher with the table one f16 past a 16-byte boundary: 2-byte words.
    let Some(gpu) = gpu_or_skip("unaligned_table_takes_the_narrow_word_path") else {
        return;
    };
    let s = gpu.stream();
    let mut r = rng("lookup_unaligned");
    let (n, vocab, hidden) = (9usize, 11usize, 64usize);
    let table: Vec<f16> = random(&mut r, vocab * hidden + 1);
    let ids: Vec<i32> = (0..n).map(|_| r.random_range(0..vocab as i32)).collect();
    let d_table = DeviceTensor::from_host(s, &table, &[vocab * hidden + 1]).unwrap();
    let d_ids = DeviceTensor::from_host(s, &ids, &[n]).unwrap();
    let mut out = DeviceTensor::filled(s, &[n * hidden + 1], f16::NAN).unwrap();
    {
        use fl_kernels::cudarc::driver::{DevicePtr, DevicePtrMut};
        let (pt, _g1) = d_table.as_slice().device_ptr(s);
        let (pi, _g2) = d_ids.as_slice().device_ptr(s);
        let (po, _g3) = out.as_slice_mut().device_ptr_mut(s);
        // SAFETY: table holds vocab * hidden + 1 f16, so offsetting by one leaves
        // vocab * hidden; out likewise for n * hidden; no status (NULL).
        let st = unsafe {
            fl_kernels_sys::fl_embedding_lookup(
                fl_kernels_sys::fl_dtype::FL_DTYPE_F16,
                pi as _,
                n as i64,
                (pt + 2) as _,
                vocab as i64,
                hidden as i64,
                (po + 2) as _,
                std::ptr::null_mut(),
                0,
                s.cu_stream() as _,
            )
        };
        assert_eq!(st, 0);
    }
    let got = out.to_host(s).unwrap();
    assert!(got[0].is_nan(), "element before the output was written");
    let want = reference::embedding::lookup(&ids, &table[1..], hidden).out;
    assert_eq!(to_f64(&got[1..]), to_f64(&want));
}

#[test]
fn lookup_gpu_proptest() {
    let Some(gpu) = gpu_or_skip("lookup_gpu_proptest") else {
        return;
    };
    let s = gpu.stream().clone();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 32,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &(
                strategies::length(3000),
                strategies::length(5000),
                strategies::length(5000),
                any::<u64>(),
                0u32..3,
            ),
            |(n, vocab, hidden, seed, bad_every)| {
                use rand::SeedableRng;
                let mut r = rand::rngs::StdRng::seed_from_u64(seed);
                // Keep each case small: table and output under 2^22 elements.
                let hidden = hidden.min((1 << 22) / n).min((1 << 22) / vocab).max(1);
                // bad_every 0: all ids valid; else some ids out of range on either side.
                let ids: Vec<i32> = (0..n)
                    .map(|_| {
                        if bad_every > 0 && r.random_ratio(1, 4 * bad_every) {
                            if r.random_bool(0.5) {
                                -r.random_range(1..1000)
                            } else {
                                vocab as i32 + r.random_range(0..1000)
                            }
                        } else {
                            r.random_range(0..vocab as i32)
                        }
                    })
                    .collect();
                let table: Vec<bf16> = random(&mut r, vocab * hidden);
                let d_ids = DeviceTensor::from_host(&s, &ids, &[n]).unwrap();
                let d_table = DeviceTensor::from_host(&s, &table, &[vocab, hidden]).unwrap();
                let mut out = DeviceTensor::filled(&s, &[n, hidden], bf16::NAN).unwrap();
                let mut status = DeviceStatus::new(&s).unwrap();
                embedding::lookup(&s, &d_ids, &d_table, &mut out, &mut status).unwrap();
                let want = reference::embedding::lookup(&ids, &table, hidden);
                let checked = status.check(&s);
                match want.bad.first() {
                    None => prop_assert!(checked.is_ok(), "{checked:?}"),
                    Some(&(pos, id)) => {
                        let msg = checked.unwrap_err().to_string();
                        let expect = format!(
                            "{} token id(s) outside the vocabulary [0, {vocab}); the first at position {pos} is id {id}",
                            want.bad.len()
                        );
                        prop_assert!(msg.contains(&expect), "{msg} (expected {expect})");
                    }
                }
                prop_assert_eq!(to_f64(&out.to_host(&s).unwrap()), to_f64(&want.out));
                Ok(())
            },
        )
        .unwrap();
}

// ---- reference properties (CPU only, run in CI) ----
proptest! {
    #[test]
    fn reference_lookup_copies_rows_and_lists_bad_ids(
        n in strategies::length(200),
        vocab in strategies::length(300),
        hidden in strategies::length(64),
        seed in any::<u64>(),
    ) {
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let table: Vec<f32> = random(&mut r, vocab * hidden);
        let ids: Vec<i32> = (0..n).map(|_| r.random_range(-3..vocab as i32 + 3)).collect();
        let got = reference::embedding::lookup(&ids, &table, hidden);
        prop_assert_eq!(got.out.len(), n * hidden);
        let mut bad = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let row = &got.out[i * hidden..(i + 1) * hidden];
            if id >= 0 && (id as usize) < vocab {
                let k = id as usize;
                prop_assert_eq!(row, &table[k * hidden..(k + 1) * hidden]);
            } else {
                prop_assert!(row.iter().all(|&x| x == 0.0));
                bad.push((i, id));
            }
        }
        prop_assert_eq!(got.bad, bad);
    }

    #[test]
    fn reference_lookup_of_identity_ids_is_the_table(vocab in strategies::length(100), hidden in strategies::length(50)) {
        let table: Vec<f16> = (0..vocab * hidden).map(|i| f16::from_f32(i as f32 * 0.25 + 1.0)).collect();
        let ids: Vec<i32> = (0..vocab as i32).collect();
        let got = reference::embedding::lookup(&ids, &table, hidden);
        prop_assert!(got.bad.is_empty());
        prop_assert_eq!(got.out, table);
    }
}
