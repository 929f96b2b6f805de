//! rope::{apply, apply_with_table, RopeTable} on the GPU against reference::rope, and property
//! tests of the references, of RopeParams::inv_freq and of rotate_half_to_interleaved_rows
//! (these run without a GPU).

use fl_kernels::rope::{self, RopeParams, RopeStyle, RopeTable, Scaling};
use fl_kernels::testing::{gpu_or_skip, random, rel_l2, rng, to_f64};
use fl_kernels::{bf16, f16, reference, DeviceTensor, Error, FloatDType, Gpu};
use proptest::prelude::*;
use rand::Rng;

/// (head_dim, rotary_dim): the usual head sizes, partial rotary, and sizes that take the
/// scalar path (half not a multiple of the vector width).
const DIMS: &[(usize, usize)] = &[
    (64, 64),
    (80, 80),
    (96, 96),
    (128, 128),
    (256, 256),
    (128, 64),
    (80, 32),
    (130, 130),
    (6, 6),
    (10, 4),
    (2, 2),
];

/// (tokens, q_heads, kv_heads)
const SHAPES: &[(usize, usize, usize)] = &[(1, 32, 8), (7, 5, 3), (129, 7, 1)];

const LLAMA3: Scaling = Scaling::Llama3 {
    factor: 8.0,
    low_freq_factor: 1.0,
    high_freq_factor: 4.0,
    original_max_position_embeddings: 8192,
};

/// One rounding to T (f16/bf16), or f32 arithmetic and sincosf error (f32).
fn tol<T: FloatDType>() -> f64 {
    if T::EPS < 1e-7 {
        1e-6
    } else {
        T::EPS
    }
}

fn random_positions(r: &mut impl Rng, n: usize, max: i32) -> Vec<i32> {
    (0..n).map(|_| r.random_range(0..max)).collect()
}

struct Run<T> {
    q: Vec<T>,
    k: Vec<T>,
    flag: i32,
}

#[allow(clippy::too_many_arguments)]
fn run<T: FloatDType>(
    gpu: &Gpu,
    params: &RopeParams,
    table: Option<&RopeTable>,
    q: &[T],
    k: &[T],
    shape: (usize, usize, usize),
    positions: &[i32],
    with_flag: bool,
) -> Run<T> {
    let s = gpu.stream();
    let (t, hq, hk) = shape;
    let d = params.head_dim;
    let mut dq = DeviceTensor::from_host(s, q, &[t, hq, d]).unwrap();
    let mut dk = DeviceTensor::from_host(s, k, &[t, hk, d]).unwrap();
    let dp = DeviceTensor::from_host(s, positions, &[t]).unwrap();
    let mut flag = DeviceTensor::<i32>::zeros(s, &[1]).unwrap();
    let f = with_flag.then_some(&mut flag);
    match table {
        None => rope::apply(s, &mut dq, &mut dk, &dp, params, f).unwrap(),
        Some(tb) => rope::apply_with_table(s, &mut dq, &mut dk, &dp, tb, f).unwrap(),
    }
    Run {
        q: dq.to_host(s).unwrap(),
        k: dk.to_host(s).unwrap(),
        flag: flag.to_host(s).unwrap()[0],
    }
}

/// Checks one output tensor against the reference: rel L2, exact pass-through of the
/// non-rotated part and of skipped tokens, and that something did rotate.
fn check_one<T: FloatDType>(
    what: &str,
    input: &[T],
    got: &[T],
    heads: usize,
    positions: &[i32],
    params: &RopeParams,
    max_pos: Option<usize>,
) {
    let (want, _) = reference::rope::apply(input, heads, positions, params, max_pos);
    let err = rel_l2(got, &want);
    assert!(
        err < tol::<T>(),
        "{what}<{}> {params:?}: rel L2 {err:e} (tol {:e})",
        T::NAME,
        tol::<T>()
    );
    let d = params.head_dim;
    for (t, &p) in positions.iter().enumerate() {
        let skipped = p < 0 || max_pos.is_some_and(|m| p as usize >= m);
        for h in 0..heads {
            let row = (t * heads + h) * d;
            let from = if skipped { 0 } else { params.rotary_dim };
            for e in from..d {
                assert_eq!(
                    got[row + e].to_f64(),
                    input[row + e].to_f64(),
                    "{what}<{}> token {t} head {h} element {e} (pos {p}) must be untouched",
                    T::NAME
                );
            }
        }
    }
    if positions
        .iter()
        .any(|&p| p > 0 && max_pos.is_none_or(|m| (p as usize) < m))
        && heads > 0
    {
        assert_ne!(to_f64(got), to_f64(input), "{what}: nothing rotated");
    }
}

fn check_both_paths<T: FloatDType>(
    gpu: &Gpu,
    params: &RopeParams,
    table: &RopeTable,
    shape: (usize, usize, usize),
    positions: &[i32],
    r: &mut impl Rng,
) {
    let (t, hq, hk) = shape;
    let d = params.head_dim;
    let q: Vec<T> = random(r, t * hq * d);
    let k: Vec<T> = random(r, t * hk * d);
    let a = run(gpu, params, None, &q, &k, shape, positions, true);
    check_one("q", &q, &a.q, hq, positions, params, None);
    check_one("k", &k, &a.k, hk, positions, params, None);
    assert_eq!(a.flag, 0, "flag set with valid positions");
    let b = run(gpu, params, Some(table), &q, &k, shape, positions, true);
    check_one(
        "q(table)",
        &q,
        &b.q,
        hq,
        positions,
        params,
        Some(table.max_pos()),
    );
    check_one(
        "k(table)",
        &k,
        &b.k,
        hk,
        positions,
        params,
        Some(table.max_pos()),
    );
    // Same f32 angles, same sincosf: the two paths agree bit for bit.
    assert_eq!(
        to_f64(&a.q),
        to_f64(&b.q),
        "table path differs from computed ({params:?})"
    );
    assert_eq!(
        to_f64(&a.k),
        to_f64(&b.k),
        "table path differs from computed ({params:?})"
    );
}

#[test]
fn rope_matches_reference_all_dtypes_dims_styles_both_paths() {
    let Some(gpu) = gpu_or_skip("rope_matches_reference_all_dtypes_dims_styles_both_paths") else {
        return;
    };
    let mut r = rng("rope_all");
    for &(hd, rd) in DIMS {
        for style in [RopeStyle::NeoX, RopeStyle::Interleaved] {
            let params = RopeParams::new(hd, 10_000.0)
                .with_rotary_dim(rd)
                .with_style(style);
            let table = RopeTable::new(gpu.stream(), &params, 4096).unwrap();
            for &shape in SHAPES {
                let pos = random_positions(&mut r, shape.0, 4096);
                check_both_paths::<f32>(&gpu, &params, &table, shape, &pos, &mut r);
                check_both_paths::<f16>(&gpu, &params, &table, shape, &pos, &mut r);
                check_both_paths::<bf16>(&gpu, &params, &table, shape, &pos, &mut r);
            }
        }
    }
}

#[test]
fn rope_scaling_llama3_and_linear_match_reference() {
    let Some(gpu) = gpu_or_skip("rope_scaling_llama3_and_linear_match_reference") else {
        return;
    };
    let mut r = rng("rope_scaling");
    for scaling in [LLAMA3, Scaling::Linear { factor: 4.0 }] {
        for style in [RopeStyle::NeoX, RopeStyle::Interleaved] {
            let params = RopeParams::new(128, 500_000.0)
                .with_style(style)
                .with_scaling(scaling);
            let table = RopeTable::new(gpu.stream(), &params, 32_768).unwrap();
            let pos = random_positions(&mut r, 100, 32_768);
            check_both_paths::<f32>(&gpu, &params, &table, (100, 32, 8), &pos, &mut r);
            check_both_paths::<bf16>(&gpu, &params, &table, (100, 32, 8), &pos, &mut r);
        }
    }
}

#[test]
fn rope_is_accurate_at_positions_up_to_128k() {
    // Angles up to 131071 rad: sincosf must reduce the argument accurately (no __sincosf).
    let Some(gpu) = gpu_or_skip("rope_is_accurate_at_positions_up_to_128k") else {
        return;
    };
    let mut r = rng("rope_128k");
    let mut pos: Vec<i32> = vec![131_071, 131_070, 120_000, 105_615, 105_616, 100_003, 65_535];
    pos.extend(random_positions(&mut r, 57, 131_072));
    for params in [
        RopeParams::new(128, 500_000.0).with_scaling(LLAMA3),
        RopeParams::new(128, 10_000.0),
        RopeParams::new(64, 10_000.0).with_style(RopeStyle::Interleaved),
    ] {
        let table = RopeTable::new(gpu.stream(), &params, 131_072).unwrap();
        check_both_paths::<f32>(&gpu, &params, &table, (pos.len(), 8, 2), &pos, &mut r);
        check_both_paths::<f16>(&gpu, &params, &table, (pos.len(), 8, 2), &pos, &mut r);
    }
}

#[test]
fn rope_build_table_matches_reference() {
    let Some(gpu) = gpu_or_skip("rope_build_table_matches_reference") else {
        return;
    };
    let s = gpu.stream();
    for (params, max_pos) in [
        (
            RopeParams::new(128, 500_000.0).with_scaling(LLAMA3),
            131_072,
        ),
        (RopeParams::new(80, 10_000.0).with_rotary_dim(32), 1000),
        (RopeParams::new(2, 10_000.0), 7),
    ] {
        // Through the raw launcher on NaN-poisoned buffers, so an unwritten entry shows.
        let inv = params.inv_freq().unwrap();
        let mut ffi = fl_kernels_sys::fl_rope_params {
            head_dim: params.head_dim as i32,
            rotary_dim: params.rotary_dim as i32,
            interleaved: 0,
            reserved: 0,
            inv_freq: [0.0; rope::MAX_PAIRS],
        };
        ffi.inv_freq[..inv.len()].copy_from_slice(&inv);
        let half = params.rotary_dim / 2;
        let mut cos = DeviceTensor::filled(s, &[max_pos, half], f32::NAN).unwrap();
        let mut sin = DeviceTensor::filled(s, &[max_pos, half], f32::NAN).unwrap();
        {
            use fl_kernels::cudarc::driver::DevicePtrMut;
            let (pc, _g1) = cos.as_slice_mut().device_ptr_mut(s);
            let (ps, _g2) = sin.as_slice_mut().device_ptr_mut(s);
            // SAFETY: both buffers hold max_pos * half f32; ffi lives across the call.
            let st = unsafe {
                fl_kernels_sys::fl_rope_build_table(
                    &ffi,
                    max_pos as i64,
                    pc as _,
                    ps as _,
                    s.cu_stream() as _,
                )
            };
            assert_eq!(st, 0);
        }
        let (wc, ws) = reference::rope::table(&params, max_pos);
        let (gc, gs) = (cos.to_host(s).unwrap(), sin.to_host(s).unwrap());
        let max_abs = |g: &[f32], w: &[f64]| {
            g.iter()
                .zip(w)
                .map(|(&a, &b)| {
                    if a.is_finite() {
                        (a as f64 - b).abs()
                    } else {
                        f64::INFINITY
                    }
                })
                .fold(0.0, f64::max)
        };
        let (ec, es) = (max_abs(&gc, &wc), max_abs(&gs, &ws));
        assert!(
            ec < 3e-7 && es < 3e-7,
            "{params:?}: max |cos err| {ec:e}, |sin err| {es:e}"
        );
        // And RopeTable::new builds the same table.
        let t = RopeTable::new(s, &params, max_pos).unwrap();
        assert_eq!(t.cos().to_host(s).unwrap(), gc);
        assert_eq!(t.sin().to_host(s).unwrap(), gs);
    }
}

#[test]
fn rope_invalid_positions_are_skipped_and_flagged() {
    let Some(gpu) = gpu_or_skip("rope_invalid_positions_are_skipped_and_flagged") else {
        return;
    };
    let s = gpu.stream();
    let mut r = rng("rope_invalid");
    let params = RopeParams::new(128, 10_000.0);
    let table = RopeTable::new(s, &params, 100).unwrap();
    let shape = (6, 4, 2);
    let q: Vec<bf16> = random(&mut r, 6 * 4 * 128);
    let k: Vec<bf16> = random(&mut r, 6 * 2 * 128);
    // computed path: only negative positions are invalid
    let pos = [5, -1, 99, 100, i32::MIN, 12_345];
    let a = run(&gpu, &params, None, &q, &k, shape, &pos, true);
    check_one("q", &q, &a.q, 4, &pos, &params, None);
    check_one("k", &k, &a.k, 2, &pos, &params, None);
    assert_eq!(a.flag, rope::ERR_POSITION);
    // table path: also positions >= max_pos (not clamped: left untouched)
    let b = run(&gpu, &params, Some(&table), &q, &k, shape, &pos, true);
    check_one("q(table)", &q, &b.q, 4, &pos, &params, Some(100));
    check_one("k(table)", &k, &b.k, 2, &pos, &params, Some(100));
    assert_eq!(b.flag, rope::ERR_POSITION);
    // no flag given: the same tokens are still skipped
    let c = run(&gpu, &params, Some(&table), &q, &k, shape, &pos, false);
    assert_eq!(to_f64(&c.q), to_f64(&b.q));
    assert_eq!(c.flag, 0);
    // check_error_flag
    let mut flag = DeviceTensor::from_host(s, &[rope::ERR_POSITION], &[1]).unwrap();
    assert!(matches!(
        rope::check_error_flag(s, &flag),
        Err(Error::DeviceCheck { op: "rope", .. })
    ));
    flag.copy_from_host(s, &[0]).unwrap();
    rope::check_error_flag(s, &flag).unwrap();
}

#[test]
fn rope_strided_views_of_fused_qkv_and_unaligned_pointers() {
    // Raw launcher: Q and K as views into one [tokens, q_heads + 2 kv_heads, head_dim] buffer
    // (the V part must stay untouched), then the same one element off (scalar path).
    let Some(gpu) = gpu_or_skip("rope_strided_views_of_fused_qkv_and_unaligned_pointers") else {
        return;
    };
    let s = gpu.stream();
    let mut r = rng("rope_fused");
    let (t, hq, hk, d) = (9, 6, 2, 64);
    let params = RopeParams::new(d, 10_000.0);
    let inv = params.inv_freq().unwrap();
    let mut ffi = fl_kernels_sys::fl_rope_params {
        head_dim: d as i32,
        rotary_dim: d as i32,
        interleaved: 0,
        reserved: 0,
        inv_freq: [0.0; rope::MAX_PAIRS],
    };
    ffi.inv_freq[..inv.len()].copy_from_slice(&inv);
    let row = (hq + 2 * hk) * d;
    let pos = random_positions(&mut r, t, 4096);
    let dp = DeviceTensor::from_host(s, &pos, &[t]).unwrap();
    for offset in [0usize, 1] {
        let qkv: Vec<f16> = random(&mut r, t * row + 1);
        let mut buf = DeviceTensor::from_host(s, &qkv, &[t * row + 1]).unwrap();
        {
            use fl_kernels::cudarc::driver::{DevicePtr, DevicePtrMut};
            let (pp, _g1) = dp.as_slice().device_ptr(s);
            let (pb, _g2) = buf.as_slice_mut().device_ptr_mut(s);
            let base = pb + 2 * offset as u64;
            // SAFETY: the buffer holds t * row + 1 f16; with the offset, Q rows (hq heads) and K
            // rows (hk heads after them) lie inside it; positions holds t i32.
            let st = unsafe {
                fl_kernels_sys::fl_rope_apply(
                    fl_kernels_sys::fl_dtype::FL_DTYPE_F16,
                    base as _,
                    (base + 2 * (hq * d) as u64) as _,
                    pp as _,
                    t as i64,
                    hq as i32,
                    hk as i32,
                    row as i64,
                    row as i64,
                    &ffi,
                    std::ptr::null_mut(),
                    s.cu_stream() as _,
                )
            };
            assert_eq!(st, 0);
        }
        let got = buf.to_host(s).unwrap();
        let view = |v: &[f16], from: usize, heads: usize| -> Vec<f16> {
            (0..t)
                .flat_map(|i| v[offset + i * row + from * d..][..heads * d].to_vec())
                .collect()
        };
        for (name, from, heads) in [("q", 0, hq), ("k", hq, hk)] {
            let input = view(&qkv, from, heads);
            check_one(
                name,
                &input,
                &view(&got, from, heads),
                heads,
                &pos,
                &params,
                None,
            );
        }
        assert_eq!(
            to_f64(&view(&got, hq + hk, hk)),
            to_f64(&view(&qkv, hq + hk, hk)),
            "V part written (offset {offset})"
        );
    }
}

#[test]
fn rope_shape_errors_name_the_argument() {
    let Some(gpu) = gpu_or_skip("rope_shape_errors_name_the_argument") else {
        return;
    };
    let s = gpu.stream();
    let p = RopeParams::new(64, 10_000.0);
    let z = |shape: &[usize]| DeviceTensor::<f16>::zeros(s, shape).unwrap();
    let pos = DeviceTensor::<i32>::zeros(s, &[3]).unwrap();
    let shape_arg = |e: fl_kernels::Result<()>| match e {
        Err(Error::Shape { arg, .. }) => arg,
        other => panic!("expected a shape error, got {other:?}"),
    };
    assert_eq!(
        shape_arg(rope::apply(
            s,
            &mut z(&[3, 256]),
            &mut z(&[3, 1, 64]),
            &pos,
            &p,
            None
        )),
        "q"
    );
    assert_eq!(
        shape_arg(rope::apply(
            s,
            &mut z(&[3, 4, 32]),
            &mut z(&[3, 1, 64]),
            &pos,
            &p,
            None
        )),
        "q"
    );
    assert_eq!(
        shape_arg(rope::apply(
            s,
            &mut z(&[3, 4, 64]),
            &mut z(&[2, 1, 64]),
            &pos,
            &p,
            None
        )),
        "k"
    );
    assert_eq!(
        shape_arg(rope::apply(
            s,
            &mut z(&[3, 4, 64]),
            &mut z(&[3, 1, 32]),
            &pos,
            &p,
            None
        )),
        "k"
    );
    let pos4 = DeviceTensor::<i32>::zeros(s, &[4]).unwrap();
    assert_eq!(
        shape_arg(rope::apply(
            s,
            &mut z(&[3, 4, 64]),
            &mut z(&[3, 1, 64]),
            &pos4,
            &p,
            None
        )),
        "positions"
    );
    let mut flag2 = DeviceTensor::<i32>::zeros(s, &[2]).unwrap();
    assert_eq!(
        shape_arg(rope::apply(
            s,
            &mut z(&[3, 4, 64]),
            &mut z(&[3, 1, 64]),
            &pos,
            &p,
            Some(&mut flag2)
        )),
        "err_flag"
    );
    let table = RopeTable::new(s, &RopeParams::new(128, 10_000.0), 16).unwrap();
    assert_eq!(
        shape_arg(rope::apply_with_table(
            s,
            &mut z(&[3, 4, 64]),
            &mut z(&[3, 1, 64]),
            &pos,
            &table,
            None
        )),
        "q"
    );
    let invalid_arg = |e: fl_kernels::Result<()>| match e {
        Err(Error::InvalidArgument { arg, .. }) => arg,
        other => panic!("expected an invalid-argument error, got {other:?}"),
    };
    let mut q = z(&[3, 4, 64]);
    let mut k = z(&[3, 1, 64]);
    for (bad, arg) in [
        (p.with_rotary_dim(63), "rotary_dim"),
        (p.with_rotary_dim(66), "rotary_dim"),
        (p.with_rotary_dim(0), "rotary_dim"),
        (RopeParams { theta: 0.0, ..p }, "theta"),
        (p.with_scaling(Scaling::Linear { factor: -1.0 }), "scaling"),
        (
            p.with_scaling(Scaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 4.0,
                high_freq_factor: 1.0,
                original_max_position_embeddings: 8192,
            }),
            "scaling",
        ),
    ] {
        assert_eq!(
            invalid_arg(rope::apply(s, &mut q, &mut k, &pos, &bad, None)),
            arg
        );
    }
    assert!(matches!(
        RopeTable::new(s, &p, 0),
        Err(Error::InvalidArgument { arg: "max_pos", .. })
    ));
    // Empty batches and a missing side are fine.
    let pos0 = DeviceTensor::<i32>::zeros(s, &[0]).unwrap();
    rope::apply(s, &mut z(&[0, 4, 64]), &mut z(&[0, 1, 64]), &pos0, &p, None).unwrap();
    rope::apply(s, &mut z(&[3, 4, 64]), &mut z(&[3, 0, 64]), &pos, &p, None).unwrap();
    rope::apply(s, &mut z(&[3, 0, 64]), &mut z(&[3, 2, 64]), &pos, &p, None).unwrap();
}

#[test]
fn rope_gpu_proptest() {
    let Some(gpu) = gpu_or_skip("rope_gpu_proptest") else {
        return;
    };
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 32,
        ..ProptestConfig::default()
    });
    let strategy = (
        1usize..300,
        0usize..40,
        0usize..10,
        1usize..=130,
        any::<bool>(),
        0u8..3,
        any::<u64>(),
    );
    runner
        .run(
            &strategy,
            |(t, hq, hk, half_hd, interleaved, scaling, seed)| {
                use rand::SeedableRng;
                let mut r = rand::rngs::StdRng::seed_from_u64(seed);
                let hd = 2 * half_hd + r.random_range(0..3usize);
                let rd = 2 * r.random_range(1..=hd / 2);
                let style = if interleaved {
                    RopeStyle::Interleaved
                } else {
                    RopeStyle::NeoX
                };
                let scaling =
                    [Scaling::None, Scaling::Linear { factor: 2.0 }, LLAMA3][scaling as usize];
                let params = RopeParams::new(hd, 10_000.0)
                    .with_rotary_dim(rd)
                    .with_style(style)
                    .with_scaling(scaling);
                let table = RopeTable::new(gpu.stream(), &params, 2048).unwrap();
                let pos = random_positions(&mut r, t, 2048);
                check_both_paths::<f32>(&gpu, &params, &table, (t, hq, hk), &pos, &mut r);
                check_both_paths::<f16>(&gpu, &params, &table, (t, hq, hk), &pos, &mut r);
                check_both_paths::<bf16>(&gpu, &params, &table, (t, hq, hk), &pos, &mut r);
                Ok(())
            },
        )
        .unwrap();
}

// ---- RopeParams and reference properties (CPU only, run in CI) ----

fn scaling_strategy() -> impl Strategy<Value = Scaling> {
    prop_oneof![
        Just(Scaling::None),
        (1.0f64..16.0).prop_map(|factor| Scaling::Linear { factor }),
        (1.0f64..16.0, 0.5f64..2.0, 1.0f64..8.0, 1024usize..32768).prop_map(|(f, lo, d, orig)| {
            Scaling::Llama3 {
                factor: f,
                low_freq_factor: lo,
                high_freq_factor: lo + d,
                original_max_position_embeddings: orig,
            }
        }),
    ]
}

fn params_strategy() -> impl Strategy<Value = RopeParams> {
    (
        1usize..=128,
        0usize..4,
        100.0f64..2e6,
        any::<bool>(),
        scaling_strategy(),
    )
        .prop_map(|(half, extra, theta, inter, scaling)| {
            RopeParams::new(2 * half + extra, theta)
                .with_rotary_dim(2 * half)
                .with_style(if inter {
                    RopeStyle::Interleaved
                } else {
                    RopeStyle::NeoX
                })
                .with_scaling(scaling)
        })
}

#[test]
fn inv_freq_llama31_known_values() {
    // Llama 3.1: theta 500000, head_dim 128, llama3 scaling (factor 8, low 1, high 4, 8192).
    // Values computed independently (Python, f64) from the Hugging Face rule.
    let p = RopeParams::new(128, 500_000.0).with_scaling(LLAMA3);
    let inv = p.inv_freq().unwrap();
    for (i, want) in [
        (0usize, 1.0f64),             // high frequency: unchanged
        (20, 0.016560440080994446),   // high frequency: unchanged
        (28, 0.0032114459947525913),  // last unchanged
        (29, 0.002166570763503359),   // smoothed
        (31, 0.0008567514129196321),  // smoothed
        (34, 0.00017850781276799638), // smoothed
        (35, 9.556212353964683e-05),  // low frequency: / factor
        (63, 3.068925988914511e-07),  // low frequency: / factor
    ] {
        assert_eq!(inv[i], want as f32, "inv_freq[{i}]");
    }
    // Linear: inv / factor; plain: theta^(-2i/d).
    let lin = RopeParams::new(64, 10_000.0).with_scaling(Scaling::Linear { factor: 4.0 });
    let plain = RopeParams::new(64, 10_000.0);
    let (a, b) = (lin.inv_freq().unwrap(), plain.inv_freq().unwrap());
    assert_eq!(b[0], 1.0);
    assert_eq!(b[16], (10_000f64.powf(-0.5)) as f32);
    for i in 0..32 {
        assert!(
            ((a[i] * 4.0 - b[i]) / b[i]).abs() < 2e-7,
            "linear inv_freq[{i}]"
        );
    }
}

proptest! {
    #[test]
    fn inv_freq_follows_the_hf_rule_within_f32_rounding(p in params_strategy()) {
        let got = p.inv_freq().unwrap();
        let want = reference::rope::hf_inv_freq(&p);
        prop_assert_eq!(got.len(), p.rotary_dim / 2);
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            prop_assert!(((g as f64 - w) / w).abs() <= 6.0e-8, "inv_freq[{}] = {} vs {}", i, g, w);
        }
    }

    #[test]
    fn reference_rotation_preserves_pair_norms_and_rest(
        p in params_strategy(), t in 1usize..6, heads in 1usize..4, seed in any::<u64>()
    ) {
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let x: Vec<f32> = random(&mut r, t * heads * p.head_dim);
        let pos = random_positions(&mut r, t, 200_000);
        let (y, flagged) = reference::rope::apply(&x, heads, &pos, &p, None);
        prop_assert!(!flagged);
        for row in 0..t * heads {
            let (xr, yr) = (&x[row * p.head_dim..][..p.head_dim], &y[row * p.head_dim..][..p.head_dim]);
            for i in 0..p.rotary_dim / 2 {
                let (a, b) = reference::rope::pair(p.style, p.rotary_dim, i);
                let n0 = (xr[a] as f64).hypot(xr[b] as f64);
                let n1 = yr[a].hypot(yr[b]);
                prop_assert!((n0 - n1).abs() <= 1e-12 * n0, "pair {} norm {} -> {}", i, n0, n1);
            }
            for e in p.rotary_dim..p.head_dim {
                prop_assert_eq!(yr[e], xr[e] as f64);
            }
        }
    }

    #[test]
    fn reference_position_zero_is_identity_and_negative_is_skipped(
        p in params_strategy(), seed in any::<u64>()
    ) {
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let x: Vec<f32> = random(&mut r, 3 * p.head_dim);
        let (y, flagged) = reference::rope::apply(&x, 1, &[0, -5, 3], &p, Some(3));
        prop_assert!(flagged);
        prop_assert_eq!(&y[..2 * p.head_dim], &to_f64(&x[..2 * p.head_dim])[..]);
        prop_assert_eq!(&y[2 * p.head_dim..], &to_f64(&x[2 * p.head_dim..])[..], "pos 3 >= max_pos 3");
    }

    #[test]
    fn reference_neox_is_interleaved_under_the_pair_permutation(
        p in params_strategy(), t in 1usize..5, seed in any::<u64>()
    ) {
        // Moving element i + half to 2i + 1 and i to 2i turns rotate-half pairs into
        // interleaved pairs: both styles must then agree exactly.
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let (d, half) = (p.head_dim, p.rotary_dim / 2);
        let x: Vec<f32> = random(&mut r, t * d);
        let pos = random_positions(&mut r, t, 100_000);
        let perm = |row: &[f32]| -> Vec<f32> {
            let mut o = row.to_vec();
            for i in 0..half { o[2 * i] = row[i]; o[2 * i + 1] = row[i + half]; }
            o
        };
        let xi: Vec<f32> = x.chunks(d).flat_map(perm).collect();
        let neox = RopeParams { style: RopeStyle::NeoX, ..p };
        let inter = RopeParams { style: RopeStyle::Interleaved, ..p };
        let (yn, _) = reference::rope::apply(&x, 1, &pos, &neox, None);
        let (yi, _) = reference::rope::apply(&xi, 1, &pos, &inter, None);
        for tok in 0..t {
            for i in 0..half {
                prop_assert_eq!(yn[tok * d + i], yi[tok * d + 2 * i]);
                prop_assert_eq!(yn[tok * d + i + half], yi[tok * d + 2 * i + 1]);
            }
        }
    }

    #[test]
    fn reference_rotations_compose(p in params_strategy(), p1 in 0i32..64, p2 in 0i32..64, seed in any::<u64>()) {
        // Rotating by p1 then p2 is rotating by p1 + p2, up to the f32 rounding of the angles.
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let x: Vec<f32> = random(&mut r, p.head_dim);
        let (y1, _) = reference::rope::apply(&x, 1, &[p1], &p, None);
        let y1: Vec<f32> = y1.iter().map(|&v| v as f32).collect();
        let (y2, _) = reference::rope::apply(&y1, 1, &[p2], &p, None);
        let (y12, _) = reference::rope::apply(&x, 1, &[p1 + p2], &p, None);
        let y2: Vec<f32> = y2.iter().map(|&v| v as f32).collect();
        prop_assert!(rel_l2(&y2, &y12) < 1e-5, "rel L2 {}", rel_l2(&y2, &y12));
    }
}

// ---- rotate_half_to_interleaved_rows (CPU only, run in CI) ----

/// With `perm = rotate_half_to_interleaved_rows(heads, d, rotary_dim)` and `x [t, heads, d]`
/// (the projection of a rotate-half checkpoint), `xp[t, i] = x[t, perm[i]]` is the projection
/// with the rows permuted: its interleaved rotation must be exactly the permutation of the
/// rotate-half rotation of `x` (same f32 angles, same pairs of values), and q · k of two heads
/// must be unchanged.
fn check_rows_turn_neox_into_interleaved<T: FloatDType>(
    p: &RopeParams,
    heads: usize,
    t: usize,
    r: &mut impl Rng,
) -> Result<(), TestCaseError> {
    let d = p.head_dim;
    let w = heads * d;
    let neox = RopeParams {
        style: RopeStyle::NeoX,
        ..*p
    };
    let inter = RopeParams {
        style: RopeStyle::Interleaved,
        ..*p
    };
    let perm = rope::rotate_half_to_interleaved_rows(heads, d, p.rotary_dim).unwrap();
    let x: Vec<T> = random(r, t * w);
    let pos = random_positions(r, t, 200_000);
    let xp: Vec<T> = x
        .chunks(w)
        .flat_map(|row| perm.iter().map(|&i| row[i]).collect::<Vec<_>>())
        .collect();
    let (yn, _) = reference::rope::apply(&x, heads, &pos, &neox, None);
    let (yi, _) = reference::rope::apply(&xp, heads, &pos, &inter, None);
    for tok in 0..t {
        for (i, &from) in perm.iter().enumerate() {
            prop_assert_eq!(
                yi[tok * w + i],
                yn[tok * w + from],
                "{} token {} row {} (old row {})",
                T::NAME,
                tok,
                i,
                from
            );
        }
    }
    // Attention scores: head a of token 0 (as q) against head b of the last token (as k).
    let dot = |y: &[f64], a: usize, b: usize| -> f64 {
        (0..d)
            .map(|e| y[a * d + e] * y[(t - 1) * w + b * d + e])
            .sum()
    };
    for a in 0..heads {
        for b in 0..heads {
            let (sn, si) = (dot(&yn, a, b), dot(&yi, a, b));
            prop_assert!(
                (sn - si).abs() <= 1e-12 * (1.0 + sn.abs()),
                "q.k changed: {} vs {}",
                sn,
                si
            );
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn rotate_half_to_interleaved_rows_is_a_permutation_within_heads(
        heads in 0usize..5, half in 1usize..=64, extra in 0usize..9,
    ) {
        let (d, rot) = (2 * half + extra, 2 * half);
        let perm = rope::rotate_half_to_interleaved_rows(heads, d, rot).unwrap();
        prop_assert_eq!(perm.len(), heads * d);
        let mut sorted = perm.clone();
        sorted.sort_unstable();
        prop_assert_eq!(sorted, (0..heads * d).collect::<Vec<_>>());
        for (i, &from) in perm.iter().enumerate() {
            prop_assert_eq!(from / d, i / d, "row {} takes row {} of another head", i, from);
            let (e, f) = (i % d, from % d);
            let want = if e >= rot {
                e
            } else if e % 2 == 0 {
                e / 2
            } else {
                e / 2 + half
            };
            prop_assert_eq!(f, want, "row {} of a head", e);
        }
        // The rotate-half pair (j, j + half) lands on the interleaved pair (2j, 2j + 1).
        for h in 0..heads {
            for j in 0..half {
                let (a, b) = reference::rope::pair(RopeStyle::NeoX, rot, j);
                let (c, e) = reference::rope::pair(RopeStyle::Interleaved, rot, j);
                prop_assert_eq!((perm[h * d + c], perm[h * d + e]), (h * d + a, h * d + b));
            }
        }
    }

    #[test]
    fn rotate_half_to_interleaved_rows_turn_neox_rotation_into_interleaved(
        p in params_strategy(), heads in 1usize..4, t in 1usize..4, seed in any::<u64>()
    ) {
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        check_rows_turn_neox_into_interleaved::<f32>(&p, heads, t, &mut r)?;
        check_rows_turn_neox_into_interleaved::<f16>(&p, heads, t, &mut r)?;
        check_rows_turn_neox_into_interleaved::<bf16>(&p, heads, t, &mut r)?;
    }

    #[test]
    fn rotate_half_to_interleaved_rows_rejects_a_bad_rotary_dim(
        heads in 0usize..4, d in 1usize..300, kind in 0usize..3, j in 0usize..300,
    ) {
        // 0, odd, or past head_dim
        let rot = match kind {
            0 => 0,
            1 => 2 * j + 1,
            _ => d + 1 + j,
        };
        let res = rope::rotate_half_to_interleaved_rows(heads, d, rot);
        prop_assert!(
            matches!(res, Err(Error::InvalidArgument { arg: "rotary_dim", .. })),
            "heads {} head_dim {} rotary_dim {}: {:?}", heads, d, rot, res
        );
    }
}

#[test]
fn rotate_half_to_interleaved_rows_known_values() {
    // Two heads of 6 rows, 4 rotary: per head (0, 2, 1, 3, 4, 5).
    assert_eq!(
        rope::rotate_half_to_interleaved_rows(2, 6, 4).unwrap(),
        vec![0, 2, 1, 3, 4, 5, 6, 8, 7, 9, 10, 11]
    );
    // rotary_dim 2: the identity
    assert_eq!(
        rope::rotate_half_to_interleaved_rows(1, 8, 2).unwrap(),
        (0..8).collect::<Vec<_>>()
    );
    assert_eq!(
        rope::rotate_half_to_interleaved_rows(0, 8, 8).unwrap(),
        Vec::<usize>::new()
    );
}
