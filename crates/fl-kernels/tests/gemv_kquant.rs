//! gemv::gemv and gemv::dequantize on llama.cpp's K-quants (Q4_K, Q5_K, Q6_K) on the GPU
//! against the references (reference::gemv, delegating to reference::ggml, bit-exact with
//! ggml), and CPU tests that run without a GPU: the reference GEMV against ggml's
//! dequantised rows, the kernels' own per-unit decoding run on the host, GGUF bytes taken as
//! they are, and the errors.

use fl_kernels::gemv::{self, GemvPath, QuantFormat, QuantWeight, QuantizedHost, Scales};
use fl_kernels::ggml::GgmlType;
use fl_kernels::reference::ggml::{dequantize_row, quantize_row, random_blocks};
use fl_kernels::testing::{gpu_or_skip, random, rel_l2, rng, tolerance};
use fl_kernels::{bf16, f16, reference, DeviceTensor, Error, FloatDType, Gpu, HalfDType};
use rand::Rng;

const KQUANTS: [(QuantFormat, GgmlType); 3] = [
    (QuantFormat::Q4_K, GgmlType::Q4_K),
    (QuantFormat::Q5_K, GgmlType::Q5_K),
    (QuantFormat::Q6_K, GgmlType::Q6_K),
];

/// The brief's odd shapes: rows n, row lengths k (1, 3 and 16 super-blocks), tokens m.
const NS: [usize; 4] = [1, 7, 33, 4096];
const KS: [usize; 3] = [256, 768, 4096];
const MS: [usize; 3] = [1, 3, 16];

/// Rel L2 bound, as the Q8_0 / Q4_0 tests: one rounding to T, f32 sums add little.
fn bound<T: HalfDType>() -> f64 {
    tolerance::<T>().min(2.0 * T::EPS)
}

/// Byte offsets of the f16 scales (d, dmin) in a super-block of `ty`.
fn scale_offsets(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q6_K => &[208],
        _ => &[0, 2],
    }
}

/// `random_blocks` of `ty` for an `[n, k]` weight; with `tame`, every f16 super-block scale
/// is replaced by ± a value in [2^-10, 2^-4] (random_blocks spans the whole f16 range, which
/// overflows f16 outputs at k = 4096; bf16 takes both).
fn weight(ty: GgmlType, n: usize, k: usize, r: &mut impl Rng, tame: bool) -> QuantizedHost {
    let mut b = random_blocks(ty, n * k / 256, r.random());
    if tame {
        for blk in b.chunks_exact_mut(ty.block_bytes()) {
            for &at in scale_offsets(ty) {
                let mag = 2f32.powf(r.random_range(-10.0..-4.0));
                let d = f16::from_f32(if r.random_bool(0.5) { mag } else { -mag });
                blk[at..at + 2].copy_from_slice(&d.to_le_bytes());
            }
        }
    }
    QuantizedHost::from_ggml(ty, n, k, b).unwrap()
}

/// One launch on random `x [m, k]` into a NaN-poisoned `y [m, n]` through `path`, checked
/// against reference::gemv::gemv.
fn check_gemv<T: HalfDType>(
    gpu: &Gpu,
    q: &QuantizedHost,
    dw: &QuantWeight,
    m: usize,
    r: &mut impl Rng,
    path: GemvPath,
) {
    let s = gpu.stream();
    let (n, k) = (q.n(), q.k());
    let x: Vec<T> = random(r, m * k);
    let dx = DeviceTensor::from_host(s, &x, &[m, k]).unwrap();
    let mut y = DeviceTensor::filled(s, &[m, n], T::from_f32(f32::NAN)).unwrap();
    gemv::gemv_with_path(s, &dx, dw, &mut y, path).unwrap();
    let got = y.to_host(s).unwrap();
    let want = reference::gemv::gemv(&x, m, q);
    let err = rel_l2(&got, &want);
    assert!(
        err < bound::<T>(),
        "gemv {} <{}> {path:?} m={m} n={n} k={k}: rel L2 {err:e}",
        q.format().name(),
        T::NAME
    );
}

#[test]
fn gemv_kquant_matches_reference_odd_shapes_both_dtypes() {
    let Some(gpu) = gpu_or_skip("gemv_kquant_matches_reference_odd_shapes_both_dtypes") else {
        return;
    };
    let mut r = rng("gemv_kquant");
    for (_, ty) in KQUANTS {
        for n in NS {
            for k in KS {
                let q = weight(ty, n, k, &mut r, true);
                let dw = QuantWeight::upload(gpu.stream(), &q).unwrap();
                for m in MS {
                    // The f64 reference is the cost: 4096 x 4096 at one token only.
                    if n * k > 4096 * 768 && m > 1 {
                        continue;
                    }
                    check_gemv::<f16>(&gpu, &q, &dw, m, &mut r, GemvPath::Auto);
                    check_gemv::<bf16>(&gpu, &q, &dw, m, &mut r, GemvPath::Auto);
                }
            }
        }
    }
}

#[test]
fn gemv_kquant_every_path_and_full_range_scales() {
    let Some(gpu) = gpu_or_skip("gemv_kquant_every_path_and_full_range_scales") else {
        return;
    };
    let mut r = rng("gemv_kquant_paths");
    for (_, ty) in KQUANTS {
        // Every path takes the K-quant kernel: the same results.
        let q = weight(ty, 33, 768, &mut r, true);
        let dw = QuantWeight::upload(gpu.stream(), &q).unwrap();
        for path in [GemvPath::Auto, GemvPath::Fma, GemvPath::Mma] {
            for m in [1, 2, 5, 9, 16] {
                check_gemv::<f16>(&gpu, &q, &dw, m, &mut r, path);
                check_gemv::<bf16>(&gpu, &q, &dw, m, &mut r, path);
            }
        }
        // Scales over the whole f16 range (subnormal to 65504, either sign): bf16 outputs.
        let q = weight(ty, 7, 4096, &mut r, false);
        let dw = QuantWeight::upload(gpu.stream(), &q).unwrap();
        for m in MS {
            check_gemv::<bf16>(&gpu, &q, &dw, m, &mut r, GemvPath::Auto);
        }
    }
}

/// gemv::dequantize of `q` to `T`: each value is ggml's f32 value rounded once to `T`.
fn check_dequantize<T: FloatDType>(gpu: &Gpu, q: &QuantizedHost, dw: &QuantWeight) {
    let s = gpu.stream();
    let (n, k) = (q.n(), q.k());
    let mut out = DeviceTensor::filled(s, &[n, k], T::from_f32(f32::NAN)).unwrap();
    gemv::dequantize(s, dw, &mut out).unwrap();
    let got = out.to_host(s).unwrap();
    let want = reference::gemv::dequantize(q);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let w = T::from_f32(*w as f32);
        assert!(
            g.to_f64() == w.to_f64() || (g.to_f64().is_nan() && w.to_f64().is_nan()),
            "dequantize {} <{}> [{n}, {k}] element ({}, {}): {} vs {}",
            q.format().name(),
            T::NAME,
            i / k,
            i % k,
            g.to_f64(),
            w.to_f64()
        );
    }
}

#[test]
fn dequantize_kquant_is_ggml_rounded_once() {
    let Some(gpu) = gpu_or_skip("dequantize_kquant_is_ggml_rounded_once") else {
        return;
    };
    let mut r = rng("dequantize_kquant");
    for (_, ty) in KQUANTS {
        for (n, k) in [(1, 256), (7, 768), (33, 4096)] {
            for tame in [true, false] {
                let q = weight(ty, n, k, &mut r, tame);
                let dw = QuantWeight::upload(gpu.stream(), &q).unwrap();
                check_dequantize::<f32>(&gpu, &q, &dw);
                check_dequantize::<bf16>(&gpu, &q, &dw);
                if tame {
                    check_dequantize::<f16>(&gpu, &q, &dw);
                }
            }
        }
    }
}

/// `fl_gemv_dequantize_host`: the GPU kernels' own per-unit decoding run on the host.
fn host_dequantize(format: QuantFormat, data: &[u8], n: usize, k: i64) -> Result<Vec<f32>, i32> {
    use fl_kernels_sys::fl_gemv_format as F;
    let f = match format {
        QuantFormat::Q4_K => F::FL_GEMV_Q4_K,
        QuantFormat::Q5_K => F::FL_GEMV_Q5_K,
        _ => F::FL_GEMV_Q6_K,
    };
    let mut out = vec![f32::NAN; n * k.max(0) as usize];
    // SAFETY: a host-only function over host buffers: `data` holds the n rows of k values
    // (or the call refuses k), `out` n·k floats.
    let st = unsafe {
        fl_kernels_sys::fl_gemv_dequantize_host(
            f,
            data.as_ptr() as _,
            std::ptr::null(),
            std::ptr::null(),
            0,
            out.as_mut_ptr(),
            n as i64,
            k,
        )
    };
    if st == fl_kernels_sys::FL_OK as i32 {
        Ok(out)
    } else {
        Err(st)
    }
}

#[test]
fn kernel_decoding_is_bit_exact_with_ggml_on_the_host() {
    let mut r = rng("kquant_host_decoding");
    for (f, ty) in KQUANTS {
        for (n, k) in [(1, 256), (7, 768), (3, 4096)] {
            for tame in [true, false] {
                let q = weight(ty, n, k, &mut r, tame);
                let got = host_dequantize(f, q.data(), n, k as i64).unwrap();
                let rb = ty.row_bytes(k).unwrap();
                for (row, g) in q.data().chunks_exact(rb).zip(got.chunks_exact(k)) {
                    let want = dequantize_row(ty, row, k).unwrap();
                    for (j, (a, b)) in g.iter().zip(&want).enumerate() {
                        assert_eq!(
                            a.to_bits(),
                            b.to_bits(),
                            "{ty} [{n}, {k}] value {j}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn reference_gemv_is_the_sum_of_ggml_dequantised_products() {
    let mut r = rng("kquant_reference_gemv");
    for (f, ty) in KQUANTS {
        let (n, k, m) = (5, 512, 3);
        let q = weight(ty, n, k, &mut r, false);
        assert_eq!(q.format(), f);
        let rows: Vec<Vec<f32>> = q
            .data()
            .chunks_exact(ty.row_bytes(k).unwrap())
            .map(|b| dequantize_row(ty, b, k).unwrap())
            .collect();
        let deq = reference::gemv::dequantize(&q);
        for (i, row) in rows.iter().enumerate() {
            for (j, v) in row.iter().enumerate() {
                assert_eq!(deq[i * k + j], *v as f64, "{ty} ({i}, {j})");
            }
        }
        let x: Vec<bf16> = random(&mut r, m * k);
        let y = reference::gemv::gemv(&x, m, &q);
        for t in 0..m {
            for (i, row) in rows.iter().enumerate() {
                let want: f64 = row
                    .iter()
                    .zip(&x[t * k..(t + 1) * k])
                    .map(|(w, x)| *w as f64 * x.to_f64())
                    .sum();
                assert_eq!(y[t * n + i], want, "{ty} y[{t}, {i}]");
            }
        }
    }
}

#[test]
fn quantize_kquant_is_ggml_reference_quantiser_per_row() {
    let mut r = rng("kquant_quantize");
    for (f, ty) in KQUANTS {
        let (n, k) = (3, 512);
        let w: Vec<f32> = (0..n * k).map(|_| r.random_range(-1.0f32..1.0)).collect();
        let q = gemv::quantize(&w, n, k, f).unwrap();
        let want: Vec<u8> = w
            .chunks_exact(k)
            .flat_map(|row| quantize_row(ty, row).unwrap())
            .collect();
        assert_eq!(q.data(), &want[..], "{ty}");
        assert_eq!(q.num_bytes(), f.weight_bytes(n, k));
        assert_eq!(q.num_bytes(), n * ty.row_bytes(k).unwrap());
        assert_eq!(q.scales(), Scales::None);
        let back = reference::gemv::dequantize(&q);
        let err = back
            .iter()
            .zip(&w)
            .map(|(a, b)| (a - *b as f64).abs())
            .fold(0f64, f64::max);
        assert!(err < 0.15, "{ty}: max |w - deq| {err}");
    }
}

#[test]
fn formats_map_to_ggml_types_and_back() {
    for (f, ty) in KQUANTS {
        assert_eq!(f.ggml_type(), Some(ty));
        assert_eq!(QuantFormat::from_ggml(ty), Some(f));
        assert_eq!(f.k_multiple(), 256);
        assert_eq!(f.data_bytes(3, 512), 3 * 2 * ty.block_bytes());
    }
    assert_eq!(QuantFormat::from_ggml(GgmlType::Q4_1), None);
    assert_eq!(QuantFormat::Int8.ggml_type(), None);
    assert_eq!(QuantFormat::Q4_K.name(), "q4_k");
}

#[test]
fn kquant_errors_name_the_argument_and_k() {
    let invalid = |r: fl_kernels::Result<QuantizedHost>, a: &str, has: &str| match r {
        Err(Error::InvalidArgument { arg, reason }) => {
            assert_eq!(arg, a);
            assert!(reason.contains(has), "{reason:?} lacks {has:?}");
        }
        other => panic!("expected an error on `{a}`, got {other:?}"),
    };
    for (f, ty) in KQUANTS {
        // k not a multiple of 256 (but of 32): named with its value.
        invalid(
            QuantizedHost::from_ggml(ty, 2, 288, vec![0; 1000]),
            "k",
            "288",
        );
        invalid(gemv::quantize(&[0.5; 2 * 288], 2, 288, f), "k", "288");
        invalid(
            QuantizedHost::new(f, 1, 96, vec![0; 1000], Scales::None, vec![]),
            "k",
            "96",
        );
        invalid(QuantizedHost::from_ggml(ty, 2, 0, vec![]), "k", "0");
        // Wrong byte count.
        let bb = ty.block_bytes();
        invalid(
            QuantizedHost::from_ggml(ty, 2, 512, vec![0; 4 * bb - 2]),
            "data",
            &format!("{}", 4 * bb - 2),
        );
        // Scales or zeros where the blocks hold them.
        invalid(
            QuantizedHost::new(f, 1, 256, vec![0; bb], Scales::F32(&[1.0]), vec![]),
            "scales",
            "Scales::None",
        );
        invalid(
            QuantizedHost::new(f, 1, 256, vec![0; bb], Scales::None, vec![1]),
            "zeros",
            "",
        );
        // The launchers refuse k % 256 != 0 before touching any pointer.
        assert!(host_dequantize(f, &[], 1, 288).is_err());
        // SAFETY: every pointer is null and the arguments are refused before any use.
        let st = unsafe {
            fl_kernels_sys::fl_gemv_quant_path(
                fl_kernels_sys::fl_dtype::FL_DTYPE_F16,
                match f {
                    QuantFormat::Q4_K => fl_kernels_sys::fl_gemv_format::FL_GEMV_Q4_K,
                    QuantFormat::Q5_K => fl_kernels_sys::fl_gemv_format::FL_GEMV_Q5_K,
                    _ => fl_kernels_sys::fl_gemv_format::FL_GEMV_Q6_K,
                },
                std::ptr::null(),
                std::ptr::null(),
                std::ptr::null(),
                std::ptr::null(),
                0,
                std::ptr::null_mut(),
                1,
                1,
                288,
                0,
                std::ptr::null_mut(),
            )
        };
        assert_eq!(st, fl_kernels_sys::FL_ERR_INVALID_ARGUMENT);
        // SAFETY: pure arithmetic on sizes.
        let wb = unsafe {
            fl_kernels_sys::fl_gemv_weight_bytes(
                match f {
                    QuantFormat::Q4_K => fl_kernels_sys::fl_gemv_format::FL_GEMV_Q4_K,
                    QuantFormat::Q5_K => fl_kernels_sys::fl_gemv_format::FL_GEMV_Q5_K,
                    _ => fl_kernels_sys::fl_gemv_format::FL_GEMV_Q6_K,
                },
                3,
                512,
            )
        };
        assert_eq!(wb, (3 * 2 * bb) as i64);
    }
    // A type the GEMV does not take is named.
    invalid(
        QuantizedHost::from_ggml(GgmlType::Q4_1, 1, 32, vec![0; 20]),
        "ty",
        "q4_1",
    );
}
