//! gemv::embedding (an embedding lookup straight from a quantised table) on the GPU against
//! reference::gemv::dequantize, every format (int8, int4 with and without zero points, Q8_0,
//! Q4_0 and the K-quants); and CPU tests that run without a GPU: the kernel's own per-unit code
//! run on the host (`fl_gemv_embedding_host`), the launcher's checks.

use fl_kernels::embedding::DeviceStatus;
use fl_kernels::gemv::{self, QuantFormat, QuantWeight, QuantizedHost};
use fl_kernels::ggml::GgmlType;
use fl_kernels::reference::ggml::random_blocks;
use fl_kernels::testing::{gpu_or_skip, host_weight_ffi, normal, rng};
use fl_kernels::{bf16, f16, reference, DeviceTensor, Error, FloatDType, Gpu};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

/// Every format, with a table width it takes: hidden sizes that are multiples of 32 but not of
/// 256 (GGUF rows then start off 16-byte boundaries) where the format allows.
fn tables(r: &mut impl Rng) -> Vec<QuantizedHost> {
    let mut v = vec![];
    let dense = [
        (QuantFormat::Int8, 96),
        (
            QuantFormat::Int4 {
                group: 32,
                zero_point: false,
            },
            160,
        ),
        (
            QuantFormat::Int4 {
                group: 64,
                zero_point: true,
            },
            320,
        ),
        (
            QuantFormat::Int4 {
                group: 128,
                zero_point: false,
            },
            384,
        ),
        (QuantFormat::Q8_0, 224),
        (QuantFormat::Q4_0, 288),
    ];
    for (f, hidden) in dense {
        let vocab = 37;
        let w = normal(r, vocab * hidden, 1.0);
        v.push(gemv::quantize(&w, vocab, hidden, f).unwrap());
    }
    for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
        v.push(kquant_table(ty, 29, 768, r));
    }
    v
}

/// A random `[vocab, hidden]` K-quant table whose f16 super-block scales are tame (in
/// [2^-10, 2^-4]: random_blocks spans the whole f16 range, inf and NaN included).
fn kquant_table(ty: GgmlType, vocab: usize, hidden: usize, r: &mut impl Rng) -> QuantizedHost {
    let mut b = random_blocks(ty, vocab * hidden / 256, r.random());
    let at: &[usize] = if ty == GgmlType::Q6_K {
        &[208]
    } else {
        &[0, 2]
    };
    for blk in b.chunks_exact_mut(ty.block_bytes()) {
        for &o in at {
            let d = f16::from_f32(2f32.powf(r.random_range(-10.0..-4.0)));
            blk[o..o + 2].copy_from_slice(&d.to_le_bytes());
        }
    }
    QuantizedHost::from_ggml(ty, vocab, hidden, b).unwrap()
}

/// Ids of every kind: repeats, the first and last rows, and ids outside the table.
fn ids_for(vocab: usize, r: &mut impl Rng) -> Vec<i32> {
    let mut ids = vec![
        3,
        0,
        vocab as i32 - 1,
        3,
        -1,
        vocab as i32,
        i32::MIN,
        i32::MAX,
    ];
    ids.extend((0..13).map(|_| r.random_range(0..vocab as i32)));
    ids
}

/// The exact table rows (f64), a zero row for an id outside the table.
fn want_rows(q: &QuantizedHost, ids: &[i32]) -> Vec<f64> {
    let (vocab, k) = (q.n(), q.k());
    let all = reference::gemv::dequantize(q);
    let mut out = vec![0f64; ids.len() * k];
    for (i, &id) in ids.iter().enumerate() {
        if id >= 0 && (id as usize) < vocab {
            let r = id as usize;
            out[i * k..(i + 1) * k].copy_from_slice(&all[r * k..(r + 1) * k]);
        }
    }
    out
}

/// `fl_gemv_embedding_host` over `q`'s buffers: the kernel's own per-unit code on the host;
/// `Err(status)` when the launcher's checks refuse.
fn host_embedding(q: &QuantizedHost, ids: &[i32], hidden: i64) -> Result<Vec<f32>, i32> {
    let (f, group, scales, zeros) = host_weight_ffi(q);
    let mut out = vec![f32::NAN; ids.len() * q.k()];
    // SAFETY: a host-only function over host buffers: data, scales and zeros are those of a
    // consistent QuantizedHost of [vocab, k] (a different `hidden` only makes the call refuse),
    // `half::f16` has the layout of `__half`, ids holds ids.len() i32 and out ids.len()·k floats.
    let st = unsafe {
        fl_kernels_sys::fl_gemv_embedding_host(
            f,
            ids.as_ptr(),
            ids.len() as i64,
            q.data().as_ptr() as _,
            scales,
            zeros,
            group,
            q.n() as i64,
            hidden,
            out.as_mut_ptr(),
        )
    };
    if st == fl_kernels_sys::FL_OK as i32 {
        Ok(out)
    } else {
        Err(st)
    }
}

/// CPU test of the embedding kernel's own per-unit code and row mapping (each id's row, the
/// scale and zero rows that go with it, zero rows for ids outside the table): every value is
/// exact in f32 except int8's one rounded product, so the host code must equal the reference
/// rounded to f32, bit for bit. Runs without a GPU.
#[test]
fn kernel_embedding_code_matches_the_reference_on_the_host() {
    let mut r = rng("gemv_embedding_host");
    for q in tables(&mut r) {
        let ids = ids_for(q.n(), &mut r);
        let got = host_embedding(&q, &ids, q.k() as i64).unwrap();
        let want = want_rows(&q, &ids);
        let k = q.k();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                (*w as f32).to_bits(),
                "{} id {} element {}: {g} vs {w}",
                q.format().name(),
                ids[i / k],
                i % k
            );
        }
        // A width the format does not take is refused.
        assert!(host_embedding(&q, &ids, q.k() as i64 + 16).is_err());
        // No ids: nothing to do.
        assert_eq!(host_embedding(&q, &[], q.k() as i64), Ok(vec![]));
    }
}

/// Every format the op takes, for the proptest.
const PROP_FORMATS: [QuantFormat; 9] = [
    QuantFormat::Int8,
    QuantFormat::Int4 {
        group: 32,
        zero_point: true,
    },
    QuantFormat::Int4 {
        group: 64,
        zero_point: false,
    },
    QuantFormat::Int4 {
        group: 128,
        zero_point: true,
    },
    QuantFormat::Q8_0,
    QuantFormat::Q4_0,
    QuantFormat::Q4_K,
    QuantFormat::Q5_K,
    QuantFormat::Q6_K,
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The kernel's host twin on random tables (any format, 1-40 rows of 256 or 512) and
    /// random ids, a few outside the table: each row exactly the reference's, zero rows for
    /// the others. Runs without a GPU.
    #[test]
    fn host_embedding_proptest(
        fi in 0usize..PROP_FORMATS.len(),
        vocab in 1usize..40,
        wide in any::<bool>(),
        seed in any::<u64>(),
        ids in proptest::collection::vec(-3i32..43, 0..24),
    ) {
        let f = PROP_FORMATS[fi];
        let hidden = if wide { 512 } else { 256 };
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let q = match (f, f.ggml_type()) {
            (QuantFormat::Q4_K | QuantFormat::Q5_K | QuantFormat::Q6_K, Some(ty)) => {
                kquant_table(ty, vocab, hidden, &mut r)
            }
            _ => gemv::quantize(&normal(&mut r, vocab * hidden, 1.0), vocab, hidden, f).unwrap(),
        };
        let got = host_embedding(&q, &ids, hidden as i64).unwrap();
        let want = want_rows(&q, &ids);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            prop_assert_eq!(g.to_bits(), (*w as f32).to_bits(), "{} id {} element {}", f.name(), ids[i / hidden], i % hidden);
        }
    }
}

/// Without a GPU (CI): `fl_gemv_embedding` gets past its host-side checks to the launch for
/// every format and dtype and returns the launch's CUDA error (no driver), and refuses bad
/// arguments first. With a GPU this is skipped: the GPU tests take the same paths.
#[test]
fn embedding_launcher_checks_and_reaches_the_launch_without_a_gpu() {
    use fl_kernels_sys::{fl_dtype, fl_gemv_format as F};
    if fl_kernels::gpu_available() {
        return;
    }
    let p = |i: usize| (0x10_0000 + 0x1000 * i) as *mut std::ffi::c_void;
    let call = |dt, f, group, n: i64, vocab: i64, hidden: i64, status: *mut i32, nonce| {
        // SAFETY: host-side checks and a failing launch only (no GPU): the fake device
        // addresses are never dereferenced on the host.
        unsafe {
            fl_kernels_sys::fl_gemv_embedding(
                dt,
                f,
                p(0) as _,
                n,
                p(1),
                p(2),
                p(3),
                group,
                vocab,
                hidden,
                p(4),
                status,
                nonce,
                std::ptr::null_mut(),
            )
        }
    };
    let invalid = fl_kernels_sys::FL_ERR_INVALID_ARGUMENT;
    for (f, group, hidden) in [
        (F::FL_GEMV_INT8, 0, 256),
        (F::FL_GEMV_INT4, 128, 256),
        (F::FL_GEMV_INT4_ZP, 32, 256),
        (F::FL_GEMV_Q8_0, 0, 256),
        (F::FL_GEMV_Q4_0, 0, 256),
        (F::FL_GEMV_Q4_K, 0, 512),
        (F::FL_GEMV_Q6_K, 0, 512),
    ] {
        for dt in [
            fl_dtype::FL_DTYPE_F32,
            fl_dtype::FL_DTYPE_F16,
            fl_dtype::FL_DTYPE_BF16,
        ] {
            let st = call(dt, f, group, 5, 11, hidden, p(5) as _, 7);
            assert!(st > 0, "{f:?} {dt:?}: status {st}, expected a CUDA error");
        }
        let dt = fl_dtype::FL_DTYPE_F16;
        assert_eq!(
            call(dt, f, group, -1, 11, hidden, p(5) as _, 7),
            invalid,
            "n < 0"
        );
        assert_eq!(
            call(dt, f, group, 5, -1, hidden, p(5) as _, 7),
            invalid,
            "vocab < 0"
        );
        assert_eq!(
            call(dt, f, group, 5, 11, hidden + 16, p(5) as _, 7),
            invalid,
            "hidden"
        );
        assert_eq!(
            call(dt, f, group, 5, 11, hidden, p(5) as _, 0),
            invalid,
            "nonce 0"
        );
        assert_eq!(
            call(dt, f, group, 0, 11, hidden, p(5) as _, 7),
            0,
            "no ids: OK"
        );
    }
}

/// One lookup into a NaN-poisoned output, each value within one rounding to T of the exact
/// reference, zero rows for the ids outside the table, and the first of those in `status`.
fn check_lookup<T: FloatDType>(gpu: &Gpu, q: &QuantizedHost, dw: &QuantWeight, ids: &[i32]) {
    let s = gpu.stream();
    let k = q.k();
    let d_ids = DeviceTensor::from_host(s, ids, &[ids.len()]).unwrap();
    let mut out = DeviceTensor::filled(s, &[ids.len(), k], T::from_f32(f32::NAN)).unwrap();
    let mut status = DeviceStatus::new(s).unwrap();
    gemv::embedding(s, &d_ids, dw, &mut out, &mut status).unwrap();
    let got = out.to_host(s).unwrap();
    let want = want_rows(q, ids);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let err = (g.to_f64() - w).abs();
        assert!(
            err <= w.abs() * (T::EPS + 6e-8),
            "embedding {} <{}> id {} element {}: {} vs {w}",
            q.format().name(),
            T::NAME,
            ids[i / k],
            i % k,
            g.to_f64()
        );
    }
    let bad = ids.iter().position(|&id| id < 0 || id as usize >= q.n());
    match (bad, status.check(s)) {
        (None, Ok(())) => {}
        (Some(at), Err(Error::DeviceCheck { reason, .. })) => {
            assert!(
                reason.contains(&format!("position {at} is id {}", ids[at])),
                "{reason}"
            );
        }
        (b, r) => panic!("{}: first bad id at {b:?}, status {r:?}", q.format().name()),
    }
}

#[test]
fn embedding_matches_reference_every_format_and_dtype() {
    let Some(gpu) = gpu_or_skip("embedding_matches_reference_every_format_and_dtype") else {
        return;
    };
    let mut r = rng("gemv_embedding");
    for q in tables(&mut r) {
        let dw = QuantWeight::upload(gpu.stream(), &q).unwrap();
        let ids = ids_for(q.n(), &mut r);
        check_lookup::<f16>(&gpu, &q, &dw, &ids);
        check_lookup::<bf16>(&gpu, &q, &dw, &ids);
        check_lookup::<f32>(&gpu, &q, &dw, &ids);
        // Only ids inside the table: a clean status; one id: one row.
        let good: Vec<i32> = ids
            .iter()
            .copied()
            .filter(|&i| i >= 0 && (i as usize) < q.n())
            .collect();
        check_lookup::<f16>(&gpu, &q, &dw, &good);
        check_lookup::<f16>(&gpu, &q, &dw, &good[..1]);
    }
}

#[test]
fn embedding_shape_errors_name_the_argument() {
    let Some(gpu) = gpu_or_skip("embedding_shape_errors_name_the_argument") else {
        return;
    };
    let s = gpu.stream();
    let mut r = rng("gemv_embedding_shapes");
    let q = tables(&mut r).remove(0);
    let dw = QuantWeight::upload(s, &q).unwrap();
    let ids = DeviceTensor::from_host(s, &[1i32, 2, 3, 4], &[2, 2]).unwrap();
    let mut status = DeviceStatus::new(s).unwrap();
    let mut wrong = DeviceTensor::<f16>::zeros(s, &[4, q.k()]).unwrap();
    match gemv::embedding(s, &ids, &dw, &mut wrong, &mut status) {
        Err(Error::Shape { arg, .. }) => assert_eq!(arg, "out"),
        other => panic!("want a shape error naming out, got {other:?}"),
    }
    // ids [2, 2] -> out [2, 2, hidden].
    let mut out = DeviceTensor::<f16>::zeros(s, &[2, 2, q.k()]).unwrap();
    gemv::embedding(s, &ids, &dw, &mut out, &mut status).unwrap();
    status.check(s).unwrap();
}
