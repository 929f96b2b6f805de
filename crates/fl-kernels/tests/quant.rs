//! quant::{quantize_per_token, rms_norm_quant, dequant_rope, dequant_add_rms_norm_quant,
//! dequant_silu_mul_quant, dequant_add, dequantize} (LLaMA decoder) and
//! quant::{quantize_calibrated, layer_norm_quant, dequant_bias_add_layer_norm_quant,
//! dequant_bias_gelu_quant} (BERT encoder, per-token or calibrated scales; see "BERT encoder
//! kernels" below) on the GPU against reference::quant; CPU property tests of the quantisers
//! and the W8A8-vs-float accuracy of a whole decoder layer (these run without a GPU).
//!
//! How int8 outputs are compared:
//! - exactly (int8 and scale bit for bit) where the kernel's f32 values equal the
//!   reference's: quantize_per_token (the only reduction is a max);
//! - within ±1 where a sum (RMSNorm) or expf (SiLU) can move an f32 value by an ulp, which
//!   flips a rounding only when `v · inv` lies within that ulp of a half-integer: at most 1% of
//!   the elements may differ (by exactly 1), and the scales agree to 1e-6 relative.
//!
//! Residual outputs (dequant_add, dequant_add_rms_norm_quant) are bit-exact.

use fl_kernels::activation::GeluKind;
use fl_kernels::quant::{self, Dequant, LayerNormParams, QkvHeads, QuantOut};
use fl_kernels::reference::quant as rq;
use fl_kernels::rope::{RopeParams, RopeStyle};
use fl_kernels::testing::{
    gpu_or_skip, normal, random_layer, random_nonzero, rel_l2, rel_l2_f64, rng, strategies, to_f64,
};
use fl_kernels::{bf16, f16, DeviceTensor, Error, FloatDType, Gpu, HalfDType};
use proptest::prelude::*;
use rand::Rng;

/// Row lengths: vector path (multiples of 8 up to 32768, every VPT), scalar path (odd sizes,
/// non-multiples of 8, longer than 32768).
const WIDTHS: &[usize] = &[
    1, 7, 8, 64, 129, 1000, 4095, 4096, 5120, 11008, 16384, 28672, 32768, 32776,
];
const ROWS: &[usize] = &[1, 3, 33];

/// An int8 value the quantiser never writes: unwritten outputs are caught.
const Q_POISON: i8 = i8::MIN;

fn tol<T: FloatDType>() -> f64 {
    2.0 * T::EPS
}

fn random_acc(r: &mut impl Rng, n: usize, mag: i32) -> Vec<i32> {
    (0..n)
        .map(|_| {
            let v = r.random_range(1..=mag);
            if r.random_bool(0.5) {
                v
            } else {
                -v
            }
        })
        .collect()
}

fn random_scales(r: &mut impl Rng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| r.random_range(lo..hi)).collect()
}

/// Compares quantised outputs; `exact`: bit for bit, else ±1 on at most 1% of the elements.
fn assert_quant(what: &str, got: (&[i8], &[f32]), want: (&[i8], &[f32]), exact: bool) {
    let (gq, gs) = got;
    let (wq, ws) = want;
    assert_eq!(gq.len(), wq.len(), "{what}: q length");
    assert_eq!(gs.len(), ws.len(), "{what}: scale length");
    for (t, (&g, &w)) in gs.iter().zip(ws).enumerate() {
        if exact {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{what}: scale[{t}] {g:e} vs {w:e}"
            );
        } else {
            assert!(
                (g - w).abs() <= 1e-6 * w.abs() && g.is_finite(),
                "{what}: scale[{t}] {g:e} vs {w:e}"
            );
        }
    }
    let mut off = 0usize;
    for (i, (&g, &w)) in gq.iter().zip(wq).enumerate() {
        assert!(g != Q_POISON, "{what}: q[{i}] not written");
        if g != w {
            assert!(
                !exact && (g as i32 - w as i32).abs() == 1,
                "{what}: q[{i}] = {g}, want {w}"
            );
            off += 1;
        }
    }
    assert!(
        off <= (gq.len() / 100).max(1),
        "{what}: {off} of {} int8 values differ by 1",
        gq.len()
    );
}

struct QOut {
    q: DeviceTensor<i8>,
    s: DeviceTensor<f32>,
}

impl QOut {
    fn new(gpu: &Gpu, tokens: usize, width: usize) -> Self {
        let st = gpu.stream();
        QOut {
            q: DeviceTensor::filled(st, &[tokens, width], Q_POISON).unwrap(),
            s: DeviceTensor::filled(st, &[tokens], f32::NAN).unwrap(),
        }
    }
    fn host(&self, gpu: &Gpu) -> (Vec<i8>, Vec<f32>) {
        let st = gpu.stream();
        (self.q.to_host(st).unwrap(), self.s.to_host(st).unwrap())
    }
}

/// GEMM output and scales: `acc [tokens, width]`, act `[tokens]`, weight `[width]`, with
/// dequantised values of order 1.
struct Acc {
    acc: Vec<i32>,
    sa: Vec<f32>,
    sw: Vec<f32>,
    d_acc: DeviceTensor<i32>,
    d_sa: DeviceTensor<f32>,
    d_sw: DeviceTensor<f32>,
}

impl Acc {
    fn new(gpu: &Gpu, r: &mut impl Rng, tokens: usize, width: usize) -> Self {
        let st = gpu.stream();
        let acc = random_acc(r, tokens * width, 400_000);
        let sa = random_scales(r, tokens, 1e-3, 1e-2);
        let sw = random_scales(r, width, 1e-4, 1e-3);
        Acc {
            d_acc: DeviceTensor::from_host(st, &acc, &[tokens, width]).unwrap(),
            d_sa: DeviceTensor::from_host(st, &sa, &[tokens]).unwrap(),
            d_sw: DeviceTensor::from_host(st, &sw, &[width]).unwrap(),
            acc,
            sa,
            sw,
        }
    }
    fn deq(&self) -> Dequant<'_> {
        Dequant {
            acc: &self.d_acc,
            act_scale: &self.d_sa,
            weight_scale: &self.d_sw,
        }
    }
}

fn check_quantize<T: HalfDType>(gpu: &Gpu, tokens: usize, width: usize, r: &mut impl Rng) {
    let s = gpu.stream();
    let x: Vec<T> = random_nonzero(r, tokens * width, 1e-3, 8.0);
    let dx = DeviceTensor::from_host(s, &x, &[tokens, width]).unwrap();
    let mut out = QOut::new(gpu, tokens, width);
    quant::quantize_per_token(s, &dx, &mut out.q, &mut out.s).unwrap();
    let (gq, gs) = out.host(gpu);
    let (wq, ws) = rq::quantize_per_token(&x, width);
    let what = format!("quantize_per_token {tokens}x{width} <{}>", T::NAME);
    assert_quant(&what, (&gq, &gs), (&wq, &ws), true);
}

fn check_rms_quant<T: HalfDType>(gpu: &Gpu, tokens: usize, width: usize, r: &mut impl Rng) {
    let s = gpu.stream();
    let x: Vec<T> = random_nonzero(r, tokens * width, 1e-3, 4.0);
    let w: Vec<T> = random_nonzero(r, width, 0.5, 1.5);
    let dx = DeviceTensor::from_host(s, &x, &[tokens, width]).unwrap();
    let dw = DeviceTensor::from_host(s, &w, &[width]).unwrap();
    let mut out = QOut::new(gpu, tokens, width);
    quant::rms_norm_quant(s, &dx, &dw, 1e-5, &mut out.q, &mut out.s).unwrap();
    let (gq, gs) = out.host(gpu);
    let (wq, ws) = rq::rms_norm_quant(&x, &w, 1e-5);
    let what = format!("rms_norm_quant {tokens}x{width} <{}>", T::NAME);
    assert_quant(&what, (&gq, &gs), (&wq, &ws), false);
}

fn check_deq_add_rms<T: HalfDType>(gpu: &Gpu, tokens: usize, width: usize, r: &mut impl Rng) {
    let s = gpu.stream();
    let a = Acc::new(gpu, r, tokens, width);
    let res: Vec<T> = random_nonzero(r, tokens * width, 1e-3, 4.0);
    let w: Vec<T> = random_nonzero(r, width, 0.5, 1.5);
    let mut dres = DeviceTensor::from_host(s, &res, &[tokens, width]).unwrap();
    let dw = DeviceTensor::from_host(s, &w, &[width]).unwrap();
    let mut out = QOut::new(gpu, tokens, width);
    quant::dequant_add_rms_norm_quant(s, a.deq(), &mut dres, &dw, 1e-6, &mut out.q, &mut out.s)
        .unwrap();
    let (gq, gs) = out.host(gpu);
    let (wres, wq, ws) = rq::dequant_add_rms_norm_quant(&a.acc, &a.sa, &a.sw, &res, &w, 1e-6);
    let what = format!("dequant_add_rms_norm_quant {tokens}x{width} <{}>", T::NAME);
    assert_eq!(
        to_f64(&dres.to_host(s).unwrap()),
        to_f64(&wres),
        "{what}: residual not bit-exact"
    );
    assert_quant(&what, (&gq, &gs), (&wq, &ws), false);
}

fn check_deq_silu(gpu: &Gpu, tokens: usize, inter: usize, r: &mut impl Rng) {
    let a = Acc::new(gpu, r, tokens, 2 * inter);
    let mut out = QOut::new(gpu, tokens, inter);
    quant::dequant_silu_mul_quant(gpu.stream(), a.deq(), &mut out.q, &mut out.s).unwrap();
    let (gq, gs) = out.host(gpu);
    let (wq, ws) = rq::dequant_silu_mul_quant(&a.acc, &a.sa, &a.sw);
    let what = format!("dequant_silu_mul_quant {tokens}x{inter}");
    assert_quant(&what, (&gq, &gs), (&wq, &ws), false);
}

fn check_deq_add<T: HalfDType>(gpu: &Gpu, tokens: usize, width: usize, r: &mut impl Rng) {
    let s = gpu.stream();
    let a = Acc::new(gpu, r, tokens, width);
    let res: Vec<T> = random_nonzero(r, tokens * width, 1e-3, 4.0);
    let mut dres = DeviceTensor::from_host(s, &res, &[tokens, width]).unwrap();
    quant::dequant_add(s, a.deq(), &mut dres).unwrap();
    let want = rq::dequant_add(&a.acc, &a.sa, &a.sw, &res);
    assert_eq!(
        to_f64(&dres.to_host(s).unwrap()),
        to_f64(&want),
        "dequant_add {tokens}x{width} <{}>: not bit-exact",
        T::NAME
    );
}

fn check_dequantize<T: HalfDType>(
    gpu: &Gpu,
    tokens: usize,
    width: usize,
    with_bias: bool,
    r: &mut impl Rng,
) {
    let s = gpu.stream();
    let a = Acc::new(gpu, r, tokens, width);
    let bias: Vec<T> = random_nonzero(r, width, 1e-3, 2.0);
    let dbias = DeviceTensor::from_host(s, &bias, &[width]).unwrap();
    let mut out = DeviceTensor::<T>::filled(s, &[tokens, width], T::from_f32(f32::NAN)).unwrap();
    let b = with_bias.then_some(&dbias);
    quant::dequantize(s, a.deq(), b, &mut out).unwrap();
    let want = rq::dequantize_to(&a.acc, &a.sa, &a.sw, with_bias.then_some(&bias[..]));
    assert_eq!(
        to_f64(&out.to_host(s).unwrap()),
        to_f64(&want),
        "dequantize {tokens}x{width} bias {with_bias} <{}>: not bit-exact",
        T::NAME
    );
}

fn check_deq_rope<T: HalfDType>(
    gpu: &Gpu,
    tokens: usize,
    heads: QkvHeads,
    rope: &RopeParams,
    r: &mut impl Rng,
) {
    let s = gpu.stream();
    let width = heads.width(rope.head_dim).unwrap();
    let a = Acc::new(gpu, r, tokens, width);
    let pos: Vec<i32> = (0..tokens).map(|_| r.random_range(0..131_072)).collect();
    let dpos = DeviceTensor::from_host(s, &pos, &[tokens]).unwrap();
    let mut out = DeviceTensor::<T>::filled(s, &[tokens, width], T::from_f32(f32::NAN)).unwrap();
    quant::dequant_rope(s, a.deq(), &dpos, heads, rope, &mut out).unwrap();
    let got = out.to_host(s).unwrap();
    let want = rq::dequant_rope(&a.acc, &a.sa, &a.sw, &pos, heads, rope);
    let e = rel_l2(&got, &want);
    assert!(
        e < tol::<T>(),
        "dequant_rope {tokens} tokens {heads:?} d={} rot={} <{}>: rel L2 {e:e}",
        rope.head_dim,
        rope.rotary_dim,
        T::NAME
    );
}

fn all_sizes(gpu: &Gpu, f: &mut dyn FnMut(&Gpu, usize, usize)) {
    for &w in WIDTHS {
        for &rows in ROWS {
            f(gpu, rows, w);
        }
    }
    // Many rows: 256-thread blocks, more chunks per thread.
    f(gpu, 1030, 4096);
    f(gpu, 1027, 11008);
    f(gpu, 2049, 1000);
}

#[test]
fn quantize_per_token_is_bit_exact() {
    let Some(gpu) = gpu_or_skip("quantize_per_token_is_bit_exact") else {
        return;
    };
    let mut r = rng("quantize_per_token");
    all_sizes(&gpu, &mut |g, rows, w| {
        check_quantize::<f16>(g, rows, w, &mut r);
        check_quantize::<bf16>(g, rows, w, &mut r);
    });
}

#[test]
fn rms_norm_quant_matches_reference() {
    let Some(gpu) = gpu_or_skip("rms_norm_quant_matches_reference") else {
        return;
    };
    let mut r = rng("rms_norm_quant");
    all_sizes(&gpu, &mut |g, rows, w| {
        check_rms_quant::<f16>(g, rows, w, &mut r);
        check_rms_quant::<bf16>(g, rows, w, &mut r);
    });
}

#[test]
fn dequant_add_rms_norm_quant_matches_reference() {
    let Some(gpu) = gpu_or_skip("dequant_add_rms_norm_quant_matches_reference") else {
        return;
    };
    let mut r = rng("dequant_add_rms_norm_quant");
    all_sizes(&gpu, &mut |g, rows, w| {
        check_deq_add_rms::<f16>(g, rows, w, &mut r);
        check_deq_add_rms::<bf16>(g, rows, w, &mut r);
    });
}

#[test]
fn dequant_silu_mul_quant_matches_reference() {
    let Some(gpu) = gpu_or_skip("dequant_silu_mul_quant_matches_reference") else {
        return;
    };
    let mut r = rng("dequant_silu_mul_quant");
    for &inter in &[1, 7, 129, 1000, 4095, 4096, 11008, 14336, 28672, 32776] {
        for &rows in ROWS {
            check_deq_silu(&gpu, rows, inter, &mut r);
        }
    }
    check_deq_silu(&gpu, 1030, 11008, &mut r);
}

#[test]
fn dequant_add_is_bit_exact() {
    let Some(gpu) = gpu_or_skip("dequant_add_is_bit_exact") else {
        return;
    };
    let mut r = rng("dequant_add");
    all_sizes(&gpu, &mut |g, rows, w| {
        check_deq_add::<f16>(g, rows, w, &mut r);
        check_deq_add::<bf16>(g, rows, w, &mut r);
    });
}

#[test]
fn dequantize_is_bit_exact() {
    let Some(gpu) = gpu_or_skip("dequantize_is_bit_exact") else {
        return;
    };
    let mut r = rng("dequantize");
    all_sizes(&gpu, &mut |g, rows, w| {
        check_dequantize::<f16>(g, rows, w, rows % 2 == 1, &mut r);
        check_dequantize::<bf16>(g, rows, w, rows % 2 == 0, &mut r);
    });
    // Both bias cases on the vector and the scalar path.
    for w in [4096, 4095] {
        for b in [false, true] {
            check_dequantize::<f16>(&gpu, 5, w, b, &mut r);
        }
    }
}

/// (q_heads, kv_heads, head_dim, rotary_dim): GQA, MHA, MQA, partial rotary; vector path
/// (rotary_dim / 2 and head_dim multiples of 4) and scalar path.
const ROPE_CASES: &[(usize, usize, usize, usize)] = &[
    (32, 8, 128, 128),
    (8, 8, 64, 64),
    (8, 1, 128, 128),
    (6, 2, 128, 64),
    (3, 1, 72, 72),
    (2, 1, 66, 66),
    (2, 1, 10, 6),
    (1, 0, 2, 2),
];

#[test]
fn dequant_rope_matches_reference() {
    let Some(gpu) = gpu_or_skip("dequant_rope_matches_reference") else {
        return;
    };
    let mut r = rng("dequant_rope");
    for &(hq, hkv, d, rot) in ROPE_CASES {
        let heads = QkvHeads {
            q_heads: hq,
            kv_heads: hkv,
        };
        for theta in [10_000.0, 500_000.0] {
            let rope = RopeParams::new(d, theta).with_rotary_dim(rot);
            for tokens in [1, 5, 67] {
                check_deq_rope::<f16>(&gpu, tokens, heads, &rope, &mut r);
                check_deq_rope::<bf16>(&gpu, tokens, heads, &rope, &mut r);
            }
        }
    }
}

#[test]
fn errors_name_the_argument() {
    let Some(gpu) = gpu_or_skip("errors_name_the_argument") else {
        return;
    };
    let s = gpu.stream();
    let x = DeviceTensor::<f16>::zeros(s, &[2, 8]).unwrap();
    let w = DeviceTensor::<f16>::zeros(s, &[8]).unwrap();
    let mut q = DeviceTensor::<i8>::zeros(s, &[2, 8]).unwrap();
    let mut sc = DeviceTensor::<f32>::zeros(s, &[2]).unwrap();
    let mut q_bad = DeviceTensor::<i8>::zeros(s, &[2, 9]).unwrap();
    let mut sc_bad = DeviceTensor::<f32>::zeros(s, &[3]).unwrap();
    let arg = |e: Error| match e {
        Error::Shape { arg, .. } | Error::InvalidArgument { arg, .. } => arg,
        other => panic!("expected an argument error, got {other}"),
    };
    let x1 = DeviceTensor::<f16>::zeros(s, &[16]).unwrap();
    assert_eq!(
        arg(quant::quantize_per_token(s, &x1, &mut q, &mut sc).unwrap_err()),
        "x"
    );
    assert_eq!(
        arg(quant::quantize_per_token(s, &x, &mut q_bad, &mut sc).unwrap_err()),
        "q"
    );
    assert_eq!(
        arg(quant::quantize_per_token(s, &x, &mut q, &mut sc_bad).unwrap_err()),
        "scale"
    );
    let w_bad = DeviceTensor::<f16>::zeros(s, &[7]).unwrap();
    assert_eq!(
        arg(quant::rms_norm_quant(s, &x, &w_bad, 1e-5, &mut q, &mut sc).unwrap_err()),
        "weight"
    );
    assert_eq!(
        arg(quant::rms_norm_quant(s, &x, &w, 0.0, &mut q, &mut sc).unwrap_err()),
        "eps"
    );
    let acc = DeviceTensor::<i32>::zeros(s, &[2, 8]).unwrap();
    let sa = DeviceTensor::<f32>::zeros(s, &[2]).unwrap();
    let sw = DeviceTensor::<f32>::zeros(s, &[8]).unwrap();
    let sa_bad = DeviceTensor::<f32>::zeros(s, &[1]).unwrap();
    let sw_bad = DeviceTensor::<f32>::zeros(s, &[4]).unwrap();
    let good = Dequant {
        acc: &acc,
        act_scale: &sa,
        weight_scale: &sw,
    };
    let mut res = DeviceTensor::<f16>::zeros(s, &[2, 8]).unwrap();
    let bad_sa = Dequant {
        act_scale: &sa_bad,
        ..good
    };
    let bad_sw = Dequant {
        weight_scale: &sw_bad,
        ..good
    };
    assert_eq!(
        arg(quant::dequant_add(s, bad_sa, &mut res).unwrap_err()),
        "act_scale"
    );
    assert_eq!(
        arg(quant::dequant_add(s, bad_sw, &mut res).unwrap_err()),
        "weight_scale"
    );
    let bias_bad = DeviceTensor::<f16>::zeros(s, &[7]).unwrap();
    let mut out_bad = DeviceTensor::<f16>::zeros(s, &[2, 7]).unwrap();
    assert_eq!(
        arg(quant::dequantize(s, good, Some(&bias_bad), &mut res).unwrap_err()),
        "bias"
    );
    assert_eq!(
        arg(quant::dequantize(s, good, None, &mut out_bad).unwrap_err()),
        "out"
    );
    assert_eq!(
        arg(quant::dequantize(s, bad_sw, None, &mut res).unwrap_err()),
        "weight_scale"
    );
    let mut res_bad = DeviceTensor::<f16>::zeros(s, &[2, 4]).unwrap();
    assert_eq!(
        arg(quant::dequant_add(s, good, &mut res_bad).unwrap_err()),
        "residual"
    );
    assert_eq!(
        arg(
            quant::dequant_add_rms_norm_quant(s, good, &mut res, &w, 1e-5, &mut q_bad, &mut sc)
                .unwrap_err()
        ),
        "q"
    );
    // SwiGLU: odd gate|up width; q must be [tokens, inter].
    let acc_odd = DeviceTensor::<i32>::zeros(s, &[2, 7]).unwrap();
    let sw7 = DeviceTensor::<f32>::zeros(s, &[7]).unwrap();
    let odd = Dequant {
        acc: &acc_odd,
        act_scale: &sa,
        weight_scale: &sw7,
    };
    assert_eq!(
        arg(quant::dequant_silu_mul_quant(s, odd, &mut q, &mut sc).unwrap_err()),
        "acc"
    );
    assert_eq!(
        arg(quant::dequant_silu_mul_quant(s, good, &mut q, &mut sc).unwrap_err()),
        "q"
    );
    // RoPE: rotate-half only, at least one head, width = (hq + 2 hkv) * d.
    let pos = DeviceTensor::<i32>::zeros(s, &[2]).unwrap();
    let mut out = DeviceTensor::<f16>::zeros(s, &[2, 8]).unwrap();
    let heads = QkvHeads {
        q_heads: 2,
        kv_heads: 1,
    };
    let rope2 = RopeParams::new(2, 10_000.0);
    let inter = rope2.with_style(RopeStyle::Interleaved);
    assert_eq!(
        arg(quant::dequant_rope(s, good, &pos, heads, &inter, &mut out).unwrap_err()),
        "rope"
    );
    let none = QkvHeads {
        q_heads: 0,
        kv_heads: 0,
    };
    assert_eq!(
        arg(quant::dequant_rope(s, good, &pos, none, &rope2, &mut out).unwrap_err()),
        "heads"
    );
    // (3 + 2) * 2 = 10 columns, but acc has 8.
    let heads10 = QkvHeads {
        q_heads: 3,
        kv_heads: 1,
    };
    assert_eq!(
        arg(quant::dequant_rope(s, good, &pos, heads10, &rope2, &mut out).unwrap_err()),
        "acc"
    );
    let pos_bad = DeviceTensor::<i32>::zeros(s, &[3]).unwrap();
    let heads_ok = QkvHeads {
        q_heads: 2,
        kv_heads: 1,
    };
    let rope_ok = RopeParams::new(2, 10_000.0);
    // (2 + 2) * 2 = 8 columns: valid geometry, bad positions / out.
    assert_eq!(
        arg(quant::dequant_rope(s, good, &pos_bad, heads_ok, &rope_ok, &mut out).unwrap_err()),
        "positions"
    );
    let mut out_bad = DeviceTensor::<f16>::zeros(s, &[2, 9]).unwrap();
    assert_eq!(
        arg(quant::dequant_rope(s, good, &pos, heads_ok, &rope_ok, &mut out_bad).unwrap_err()),
        "out"
    );
    // Empty token counts launch nothing.
    let e = DeviceTensor::<f16>::zeros(s, &[0, 8]).unwrap();
    let mut eq = DeviceTensor::<i8>::zeros(s, &[0, 8]).unwrap();
    let mut es = DeviceTensor::<f32>::zeros(s, &[0]).unwrap();
    quant::quantize_per_token(s, &e, &mut eq, &mut es).unwrap();
}

#[test]
fn quant_gpu_proptest() {
    let Some(gpu) = gpu_or_skip("quant_gpu_proptest") else {
        return;
    };
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &(strategies::matrix(40, 20_000), any::<u64>()),
            |((rows, w), seed)| {
                use rand::SeedableRng;
                let mut r = rand::rngs::StdRng::seed_from_u64(seed);
                check_quantize::<bf16>(&gpu, rows, w, &mut r);
                check_rms_quant::<f16>(&gpu, rows, w, &mut r);
                check_deq_add_rms::<bf16>(&gpu, rows, w, &mut r);
                check_deq_add::<f16>(&gpu, rows, w, &mut r);
                check_deq_silu(&gpu, rows, w, &mut r);
                check_dequantize::<bf16>(&gpu, rows, w, seed % 2 == 0, &mut r);
                Ok(())
            },
        )
        .unwrap();
}

// ---- BERT encoder kernels: LayerNorm / GELU, per-token or calibrated scales ----
//
// How they are compared: the f32 values the kernel quantises differ from the reference's by
// the rounding of the LayerNorm statistics (f32 block sums, rsqrtf) or by the fast GELU
// (__expf, __fdividef): int8 within ±1 on at most 1% of the elements; per-token scales to
// 1e-6 relative (LayerNorm) or 1e-5 (GELU); calibrated scales (A / 127) bit for bit; the dtype
// outputs (y, the new residual) within one ulp of T (or 1e-5 absolute near 0, where the
// statistics' rounding dominates). quantize_calibrated is bit-exact.

/// Row lengths of the encoder ops: BERT-base / BERT-large hidden and FFN widths and other
/// multiples of 8 (register path), odd sizes and one past 32768 (scalar path).
const ENC_WIDTHS: &[usize] = &[1, 7, 8, 129, 768, 1000, 1024, 3072, 4095, 4096, 32776];

/// Many rows (256-thread blocks, several chunks per thread) on both paths.
const ENC_MANY: &[(usize, usize)] = &[(1030, 768), (1027, 1024), (1029, 3072), (2049, 1001)];

/// Per-token or calibrated scales.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    PerToken,
    Calibrated,
}
const MODES: [Mode; 2] = [Mode::PerToken, Mode::Calibrated];

/// A calibrated amax for values `v`: 80% of their absmax (so that the largest values
/// saturate), or 0.5 for an all-zero tensor.
fn calibrated_amax(v: &[f32]) -> f32 {
    let m = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    if m > 0.0 {
        0.8 * m
    } else {
        0.5
    }
}

fn quant_out<'a>(out: &'a mut QOut, amax: Option<&'a DeviceTensor<f32>>) -> QuantOut<'a> {
    match amax {
        None => QuantOut::per_token(&mut out.q, &mut out.s),
        Some(a) => QuantOut::calibrated(&mut out.q, &mut out.s, a),
    }
}

/// The device amax of `mode` (`None` per token) and its host value.
fn amax_for(gpu: &Gpu, mode: Mode, v: &[f32]) -> (Option<f32>, Option<DeviceTensor<f32>>) {
    match mode {
        Mode::PerToken => (None, None),
        Mode::Calibrated => {
            let a = calibrated_amax(v);
            let d = DeviceTensor::from_host(gpu.stream(), &[a], &[1]).unwrap();
            (Some(a), Some(d))
        }
    }
}

/// Int8 within ±1 on at most 1% of the elements (never the poison); scales bit for bit
/// (calibrated) or within `scale_rel` relative.
fn assert_quant_close(
    what: &str,
    got: (&[i8], &[f32]),
    want: (&[i8], &[f32]),
    mode: Mode,
    scale_rel: f32,
) {
    let (gq, gs) = got;
    let (wq, ws) = want;
    assert_eq!(gq.len(), wq.len(), "{what}: q length");
    assert_eq!(gs.len(), ws.len(), "{what}: scale length");
    for (t, (&g, &w)) in gs.iter().zip(ws).enumerate() {
        match mode {
            Mode::Calibrated => assert_eq!(g.to_bits(), w.to_bits(), "{what}: scale[{t}]"),
            Mode::PerToken => assert!(
                g.is_finite() && (g - w).abs() <= scale_rel * w.abs(),
                "{what}: scale[{t}] {g:e} vs {w:e}"
            ),
        }
    }
    let mut off = 0usize;
    for (i, (&g, &w)) in gq.iter().zip(wq).enumerate() {
        assert!(g != Q_POISON, "{what}: q[{i}] not written");
        if g != w {
            assert!(
                (g as i32 - w as i32).abs() == 1,
                "{what}: q[{i}] = {g}, want {w}"
            );
            off += 1;
        }
    }
    assert!(
        off <= (gq.len() / 100).max(1),
        "{what}: {off} of {} int8 values differ by 1",
        gq.len()
    );
}

/// Each element of `got` within one ulp of T of `want` (or 1e-5 absolute), never NaN.
fn assert_ulp_close<T: FloatDType>(what: &str, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let (g, w) = (g.to_f64(), w.to_f64());
        let tol = 2.0 * T::EPS * g.abs().max(w.abs()) + 1e-5;
        assert!((g - w).abs() <= tol, "{what}: [{i}] {g:e} vs {w:e}");
    }
}

/// `[tokens, width]` values in ±[1e-3, 4] plus a per-row offset in [-2, 2] (LayerNorm rows
/// with a non-zero mean), rounded to T.
fn offset_rows<T: FloatDType>(r: &mut impl Rng, tokens: usize, width: usize) -> Vec<T> {
    let v: Vec<f32> = random_nonzero(r, tokens * width, 1e-3, 4.0);
    let mut out = Vec::with_capacity(v.len());
    for row in v.chunks(width) {
        let off: f32 = r.random_range(-2.0..2.0);
        out.extend(row.iter().map(|&x| T::from_f32(x + off)));
    }
    out
}

fn check_quant_calibrated<T: HalfDType>(gpu: &Gpu, tokens: usize, width: usize, r: &mut impl Rng) {
    let s = gpu.stream();
    let x: Vec<T> = random_nonzero(r, tokens * width, 1e-3, 8.0);
    // Some values beyond A (saturated); A = 0 once in a while.
    let a: f32 = if r.random_bool(0.1) {
        0.0
    } else {
        r.random_range(0.5..6.0)
    };
    let dx = DeviceTensor::from_host(s, &x, &[tokens, width]).unwrap();
    let da = DeviceTensor::from_host(s, &[a], &[1]).unwrap();
    let mut out = QOut::new(gpu, tokens, width);
    quant::quantize_calibrated(s, &dx, &da, &mut out.q, &mut out.s).unwrap();
    let (gq, gs) = out.host(gpu);
    let (wq, ws) = rq::quantize_calibrated(&x, width, a);
    let what = format!("quantize_calibrated {tokens}x{width} A={a} <{}>", T::NAME);
    assert_quant(&what, (&gq, &gs), (&wq, &ws), true);
}

#[allow(clippy::too_many_arguments)]
fn check_ln_quant<T: HalfDType>(
    gpu: &Gpu,
    tokens: usize,
    width: usize,
    with_bias: bool,
    with_y: bool,
    mode: Mode,
    eps: f32,
    r: &mut impl Rng,
) {
    let s = gpu.stream();
    let x: Vec<T> = offset_rows(r, tokens, width);
    let w: Vec<T> = random_nonzero(r, width, 0.5, 1.5);
    let b: Vec<T> = random_nonzero(r, width, 1e-3, 1.0);
    let ln_ref = rq::LayerNormRef {
        weight: &w,
        bias: with_bias.then_some(&b[..]),
        eps,
    };
    let h: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    let (amax, damax) = amax_for(gpu, mode, &rq::layer_norm_values(&h, ln_ref));
    let (wy, wq, ws) = rq::layer_norm_quant(&x, ln_ref, amax);

    let dx = DeviceTensor::from_host(s, &x, &[tokens, width]).unwrap();
    let dw = DeviceTensor::from_host(s, &w, &[width]).unwrap();
    let db = DeviceTensor::from_host(s, &b, &[width]).unwrap();
    let mut dy = DeviceTensor::<T>::filled(s, &[tokens, width], T::from_f32(f32::NAN)).unwrap();
    let mut out = QOut::new(gpu, tokens, width);
    let ln = LayerNormParams {
        weight: &dw,
        bias: with_bias.then_some(&db),
        eps,
    };
    let y = if with_y { Some(&mut dy) } else { None };
    quant::layer_norm_quant(s, &dx, ln, y, quant_out(&mut out, damax.as_ref())).unwrap();
    let (gq, gs) = out.host(gpu);
    let what = format!(
        "layer_norm_quant {tokens}x{width} bias {with_bias} y {with_y} {mode:?} <{}>",
        T::NAME
    );
    assert_quant_close(&what, (&gq, &gs), (&wq, &ws), mode, 1e-6);
    let gy = dy.to_host(s).unwrap();
    if with_y {
        assert_ulp_close(&what, &gy, &wy);
    } else {
        assert!(
            gy.iter().all(|v| v.to_f32().is_nan()),
            "{what}: y written without y"
        );
    }
}

#[allow(clippy::too_many_arguments)]
fn check_deq_bias_add_ln<T: HalfDType>(
    gpu: &Gpu,
    tokens: usize,
    width: usize,
    with_bias: bool,
    with_ln_bias: bool,
    mode: Mode,
    eps: f32,
    r: &mut impl Rng,
) {
    let s = gpu.stream();
    let a = Acc::new(gpu, r, tokens, width);
    let res: Vec<T> = offset_rows(r, tokens, width);
    let bias: Vec<T> = random_nonzero(r, width, 1e-3, 1.0);
    let w: Vec<T> = random_nonzero(r, width, 0.5, 1.5);
    let lb: Vec<T> = random_nonzero(r, width, 1e-3, 1.0);
    let bias_ref = with_bias.then_some(&bias[..]);
    let ln_ref = rq::LayerNormRef {
        weight: &w,
        bias: with_ln_bias.then_some(&lb[..]),
        eps,
    };
    let h = rq::dequant_bias_add(&a.acc, &a.sa, &a.sw, bias_ref, &res);
    let (amax, damax) = amax_for(gpu, mode, &rq::layer_norm_values(&h, ln_ref));
    let (wres, wq, ws) =
        rq::dequant_bias_add_layer_norm_quant(&a.acc, &a.sa, &a.sw, bias_ref, &res, ln_ref, amax);

    let dbias = DeviceTensor::from_host(s, &bias, &[width]).unwrap();
    let mut dres = DeviceTensor::from_host(s, &res, &[tokens, width]).unwrap();
    let dw = DeviceTensor::from_host(s, &w, &[width]).unwrap();
    let dlb = DeviceTensor::from_host(s, &lb, &[width]).unwrap();
    let mut out = QOut::new(gpu, tokens, width);
    let ln = LayerNormParams {
        weight: &dw,
        bias: with_ln_bias.then_some(&dlb),
        eps,
    };
    quant::dequant_bias_add_layer_norm_quant(
        s,
        a.deq(),
        with_bias.then_some(&dbias),
        &mut dres,
        ln,
        quant_out(&mut out, damax.as_ref()),
    )
    .unwrap();
    let (gq, gs) = out.host(gpu);
    let what = format!(
        "dequant_bias_add_layer_norm_quant {tokens}x{width} bias {with_bias} ln_bias \
         {with_ln_bias} {mode:?} <{}>",
        T::NAME
    );
    assert_quant_close(&what, (&gq, &gs), (&wq, &ws), mode, 1e-6);
    assert_ulp_close(&what, &dres.to_host(s).unwrap(), &wres);
}

#[allow(clippy::too_many_arguments)]
fn check_deq_bias_gelu<T: HalfDType>(
    gpu: &Gpu,
    tokens: usize,
    width: usize,
    with_bias: bool,
    kind: GeluKind,
    mode: Mode,
    r: &mut impl Rng,
) {
    let s = gpu.stream();
    let a = Acc::new(gpu, r, tokens, width);
    let bias: Vec<T> = random_nonzero(r, width, 1e-3, 1.0);
    let bias_ref = with_bias.then_some(&bias[..]);
    let v = rq::dequant_bias_gelu_values(&a.acc, &a.sa, &a.sw, bias_ref, kind);
    let (amax, damax) = amax_for(gpu, mode, &v);
    let (wq, ws) = rq::dequant_bias_gelu_quant(&a.acc, &a.sa, &a.sw, bias_ref, kind, amax);
    let dbias = DeviceTensor::from_host(s, &bias, &[width]).unwrap();
    let mut out = QOut::new(gpu, tokens, width);
    quant::dequant_bias_gelu_quant(
        s,
        a.deq(),
        with_bias.then_some(&dbias),
        kind,
        quant_out(&mut out, damax.as_ref()),
    )
    .unwrap();
    let (gq, gs) = out.host(gpu);
    let what = format!(
        "dequant_bias_gelu_quant {tokens}x{width} bias {with_bias} {kind:?} {mode:?} <{}>",
        T::NAME
    );
    assert_quant_close(&what, (&gq, &gs), (&wq, &ws), mode, 1e-5);
}

/// Every (tokens, width) of the encoder tests: ENC_WIDTHS x ROWS, then ENC_MANY; `i` counts
/// the calls (to vary the optional arguments).
fn enc_sizes(f: &mut dyn FnMut(usize, usize, usize)) {
    let mut i = 0;
    for &w in ENC_WIDTHS {
        for &rows in ROWS {
            f(i, rows, w);
            i += 1;
        }
    }
    for &(rows, w) in ENC_MANY {
        f(i, rows, w);
        i += 1;
    }
}

#[test]
fn quantize_calibrated_is_bit_exact() {
    let Some(gpu) = gpu_or_skip("quantize_calibrated_is_bit_exact") else {
        return;
    };
    let mut r = rng("quantize_calibrated");
    enc_sizes(&mut |_, rows, w| {
        check_quant_calibrated::<f16>(&gpu, rows, w, &mut r);
        check_quant_calibrated::<bf16>(&gpu, rows, w, &mut r);
    });
}

#[test]
fn layer_norm_quant_matches_reference() {
    let Some(gpu) = gpu_or_skip("layer_norm_quant_matches_reference") else {
        return;
    };
    let mut r = rng("layer_norm_quant");
    enc_sizes(&mut |i, rows, w| {
        for mode in MODES {
            let eps = if i % 2 == 0 { 1e-12 } else { 1e-5 };
            check_ln_quant::<f16>(&gpu, rows, w, i % 2 == 0, i % 3 != 0, mode, eps, &mut r);
            check_ln_quant::<bf16>(&gpu, rows, w, i % 2 == 1, i % 3 != 1, mode, eps, &mut r);
        }
    });
    // Every optional-argument combination on both paths.
    for w in [768, 767] {
        for (bias, y) in [(false, false), (false, true), (true, false), (true, true)] {
            for mode in MODES {
                check_ln_quant::<bf16>(&gpu, 5, w, bias, y, mode, 1e-12, &mut r);
            }
        }
    }
}

#[test]
fn dequant_bias_add_layer_norm_quant_matches_reference() {
    let Some(gpu) = gpu_or_skip("dequant_bias_add_layer_norm_quant_matches_reference") else {
        return;
    };
    let mut r = rng("dequant_bias_add_layer_norm_quant");
    enc_sizes(&mut |i, rows, w| {
        for mode in MODES {
            let eps = if i % 2 == 0 { 1e-12 } else { 1e-5 };
            check_deq_bias_add_ln::<f16>(&gpu, rows, w, i % 2 == 0, i % 3 != 0, mode, eps, &mut r);
            check_deq_bias_add_ln::<bf16>(&gpu, rows, w, i % 2 == 1, i % 3 != 1, mode, eps, &mut r);
        }
    });
    for w in [1024, 1023] {
        for (bias, ln_bias) in [(false, false), (false, true), (true, false), (true, true)] {
            for mode in MODES {
                check_deq_bias_add_ln::<f16>(&gpu, 5, w, bias, ln_bias, mode, 1e-12, &mut r);
            }
        }
    }
}

#[test]
fn dequant_bias_gelu_quant_matches_reference() {
    let Some(gpu) = gpu_or_skip("dequant_bias_gelu_quant_matches_reference") else {
        return;
    };
    let mut r = rng("dequant_bias_gelu_quant");
    enc_sizes(&mut |i, rows, w| {
        for kind in [GeluKind::Erf, GeluKind::Tanh] {
            for mode in MODES {
                check_deq_bias_gelu::<f16>(&gpu, rows, w, i % 2 == 0, kind, mode, &mut r);
                check_deq_bias_gelu::<bf16>(&gpu, rows, w, i % 2 == 1, kind, mode, &mut r);
            }
        }
    });
}

#[test]
fn encoder_errors_name_the_argument() {
    let Some(gpu) = gpu_or_skip("encoder_errors_name_the_argument") else {
        return;
    };
    let s = gpu.stream();
    let arg = |e: Error| match e {
        Error::Shape { arg, .. } | Error::InvalidArgument { arg, .. } => arg,
        other => panic!("expected an argument error, got {other}"),
    };
    let x = DeviceTensor::<f16>::zeros(s, &[2, 8]).unwrap();
    let w = DeviceTensor::<f16>::zeros(s, &[8]).unwrap();
    let w7 = DeviceTensor::<f16>::zeros(s, &[7]).unwrap();
    let amax = DeviceTensor::<f32>::zeros(s, &[1]).unwrap();
    let amax2 = DeviceTensor::<f32>::zeros(s, &[2]).unwrap();
    let mut q = DeviceTensor::<i8>::zeros(s, &[2, 8]).unwrap();
    let mut sc = DeviceTensor::<f32>::zeros(s, &[2]).unwrap();
    let mut q_bad = DeviceTensor::<i8>::zeros(s, &[2, 9]).unwrap();
    let mut sc_bad = DeviceTensor::<f32>::zeros(s, &[3]).unwrap();
    let mut y_bad = DeviceTensor::<f16>::zeros(s, &[2, 9]).unwrap();
    let ln = |weight, bias, eps| LayerNormParams { weight, bias, eps };

    // quantize_calibrated
    let x1 = DeviceTensor::<f16>::zeros(s, &[16]).unwrap();
    assert_eq!(
        arg(quant::quantize_calibrated(s, &x1, &amax, &mut q, &mut sc).unwrap_err()),
        "x"
    );
    assert_eq!(
        arg(quant::quantize_calibrated(s, &x, &amax2, &mut q, &mut sc).unwrap_err()),
        "amax"
    );
    assert_eq!(
        arg(quant::quantize_calibrated(s, &x, &amax, &mut q_bad, &mut sc).unwrap_err()),
        "q"
    );
    assert_eq!(
        arg(quant::quantize_calibrated(s, &x, &amax, &mut q, &mut sc_bad).unwrap_err()),
        "scale"
    );

    // layer_norm_quant
    let good = ln(&w, None, 1e-5);
    let e = quant::layer_norm_quant(s, &x1, good, None, QuantOut::per_token(&mut q, &mut sc));
    assert_eq!(arg(e.unwrap_err()), "x");
    let e = quant::layer_norm_quant(
        s,
        &x,
        ln(&w7, None, 1e-5),
        None,
        QuantOut::per_token(&mut q, &mut sc),
    );
    assert_eq!(arg(e.unwrap_err()), "weight");
    let e = quant::layer_norm_quant(
        s,
        &x,
        ln(&w, Some(&w7), 1e-5),
        None,
        QuantOut::per_token(&mut q, &mut sc),
    );
    assert_eq!(arg(e.unwrap_err()), "bias");
    let e = quant::layer_norm_quant(
        s,
        &x,
        ln(&w, None, f32::NAN),
        None,
        QuantOut::per_token(&mut q, &mut sc),
    );
    assert_eq!(arg(e.unwrap_err()), "eps");
    let e = quant::layer_norm_quant(
        s,
        &x,
        good,
        Some(&mut y_bad),
        QuantOut::per_token(&mut q, &mut sc),
    );
    assert_eq!(arg(e.unwrap_err()), "y");
    let e = quant::layer_norm_quant(s, &x, good, None, QuantOut::per_token(&mut q_bad, &mut sc));
    assert_eq!(arg(e.unwrap_err()), "q");
    let e = quant::layer_norm_quant(
        s,
        &x,
        good,
        None,
        QuantOut::calibrated(&mut q, &mut sc, &amax2),
    );
    assert_eq!(arg(e.unwrap_err()), "amax");

    // dequant_bias_add_layer_norm_quant and dequant_bias_gelu_quant
    let acc = DeviceTensor::<i32>::zeros(s, &[2, 8]).unwrap();
    let sa = DeviceTensor::<f32>::zeros(s, &[2]).unwrap();
    let sw = DeviceTensor::<f32>::zeros(s, &[8]).unwrap();
    let sa_bad = DeviceTensor::<f32>::zeros(s, &[1]).unwrap();
    let d = Dequant {
        acc: &acc,
        act_scale: &sa,
        weight_scale: &sw,
    };
    let d_bad = Dequant {
        act_scale: &sa_bad,
        ..d
    };
    let mut res = DeviceTensor::<f16>::zeros(s, &[2, 8]).unwrap();
    let mut res_bad = DeviceTensor::<f16>::zeros(s, &[2, 7]).unwrap();
    let e = quant::dequant_bias_add_layer_norm_quant(
        s,
        d_bad,
        None,
        &mut res,
        good,
        QuantOut::per_token(&mut q, &mut sc),
    );
    assert_eq!(arg(e.unwrap_err()), "act_scale");
    let e = quant::dequant_bias_add_layer_norm_quant(
        s,
        d,
        Some(&w7),
        &mut res,
        good,
        QuantOut::per_token(&mut q, &mut sc),
    );
    assert_eq!(arg(e.unwrap_err()), "bias");
    let e = quant::dequant_bias_add_layer_norm_quant(
        s,
        d,
        Some(&w),
        &mut res_bad,
        good,
        QuantOut::per_token(&mut q, &mut sc),
    );
    assert_eq!(arg(e.unwrap_err()), "residual");
    let e = quant::dequant_bias_add_layer_norm_quant(
        s,
        d,
        Some(&w),
        &mut res,
        ln(&w, None, 0.0),
        QuantOut::per_token(&mut q, &mut sc),
    );
    assert_eq!(arg(e.unwrap_err()), "eps");
    let e = quant::dequant_bias_add_layer_norm_quant(
        s,
        d,
        Some(&w),
        &mut res,
        good,
        QuantOut::per_token(&mut q, &mut sc_bad),
    );
    assert_eq!(arg(e.unwrap_err()), "scale");
    let e = quant::dequant_bias_gelu_quant(
        s,
        d,
        Some(&w7),
        GeluKind::Erf,
        QuantOut::per_token(&mut q, &mut sc),
    );
    assert_eq!(arg(e.unwrap_err()), "bias");
    let e = quant::dequant_bias_gelu_quant::<f16>(
        s,
        d,
        None,
        GeluKind::Tanh,
        QuantOut::calibrated(&mut q, &mut sc, &amax2),
    );
    assert_eq!(arg(e.unwrap_err()), "amax");
    let e = quant::dequant_bias_gelu_quant::<f16>(
        s,
        d,
        None,
        GeluKind::Tanh,
        QuantOut::per_token(&mut q_bad, &mut sc),
    );
    assert_eq!(arg(e.unwrap_err()), "q");
    // Empty token counts launch nothing (no amax needed on the C side either).
    let e = DeviceTensor::<f16>::zeros(s, &[0, 8]).unwrap();
    let mut eq = DeviceTensor::<i8>::zeros(s, &[0, 8]).unwrap();
    let mut es = DeviceTensor::<f32>::zeros(s, &[0]).unwrap();
    quant::quantize_calibrated(s, &e, &amax, &mut eq, &mut es).unwrap();
    quant::layer_norm_quant(s, &e, good, None, QuantOut::per_token(&mut eq, &mut es)).unwrap();
}

#[test]
fn encoder_quant_gpu_proptest() {
    let Some(gpu) = gpu_or_skip("encoder_quant_gpu_proptest") else {
        return;
    };
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &(strategies::matrix(40, 20_000), any::<u64>()),
            |((rows, w), seed)| {
                use rand::SeedableRng;
                let mut r = rand::rngs::StdRng::seed_from_u64(seed);
                let mode = MODES[(seed % 2) as usize];
                let (b1, b2) = (seed & 4 != 0, seed & 8 != 0);
                check_quant_calibrated::<bf16>(&gpu, rows, w, &mut r);
                check_ln_quant::<f16>(&gpu, rows, w, b1, b2, mode, 1e-12, &mut r);
                check_deq_bias_add_ln::<bf16>(&gpu, rows, w, b1, b2, mode, 1e-5, &mut r);
                check_deq_bias_gelu::<f16>(&gpu, rows, w, b2, GeluKind::Erf, mode, &mut r);
                Ok(())
            },
        )
        .unwrap();
}

#[test]
fn encoder_launchers_refuse_bad_arguments() {
    // Checked on the host before any launch: runs without a GPU.
    use fl_kernels_sys::*;
    let p = |i: usize| (0x10_0000 + 0x1000 * i) as *mut std::ffi::c_void;
    let null = std::ptr::null_mut::<std::ffi::c_void>();
    let s: fl_stream = std::ptr::null_mut();
    let f16_ = fl_dtype::FL_DTYPE_F16;
    let (inv, bad_dtype) = (FL_ERR_INVALID_ARGUMENT, FL_ERR_UNSUPPORTED_DTYPE);
    let erf = fl_gelu_kind::FL_GELU_ERF;
    // SAFETY: every call is refused (or empty) before any pointer is used.
    unsafe {
        // quantize_calibrated: amax is required; nothing is needed for 0 tokens.
        assert_eq!(
            fl_quantize_calibrated(f16_, p(0), null as _, p(2) as _, p(3) as _, 3, 8, s),
            inv
        );
        assert_eq!(
            fl_quantize_calibrated(f16_, null, null as _, null as _, null as _, 0, 8, s),
            0
        );
        assert_eq!(
            fl_quantize_calibrated(f16_, p(0), p(1) as _, p(2) as _, p(3) as _, 3, 0, s),
            inv
        );
        assert_eq!(
            fl_quantize_calibrated(f16_, p(0), p(1) as _, p(2) as _, p(3) as _, -1, 8, s),
            inv
        );
        // layer_norm_quant: eps, weight, x, q, scale; the dtype.
        let ln = |dt: fl_dtype, x, w, q, eps| {
            fl_layer_norm_quant(dt, x, w, null, null, q, p(5) as _, null as _, 3, 8, eps, s)
        };
        assert_eq!(ln(f16_, p(0), p(1), p(4) as _, 0.0), inv);
        assert_eq!(ln(f16_, p(0), p(1), p(4) as _, f32::INFINITY), inv);
        assert_eq!(ln(f16_, p(0), null, p(4) as _, 1e-5), inv);
        assert_eq!(ln(f16_, null, p(1), p(4) as _, 1e-5), inv);
        assert_eq!(ln(f16_, p(0), p(1), null as _, 1e-5), inv);
        assert_eq!(
            ln(fl_dtype::FL_DTYPE_F32, p(0), p(1), p(4) as _, 1e-5),
            bad_dtype
        );
        // dequant_bias_add_layer_norm_quant: residual, ln_weight and the dequant inputs.
        let dln = |acc, res, w| {
            fl_dequant_bias_add_layer_norm_quant(
                f16_,
                acc,
                p(1) as _,
                p(2) as _,
                null,
                res,
                w,
                null,
                p(7) as _,
                p(8) as _,
                null as _,
                3,
                8,
                1e-5,
                s,
            )
        };
        assert_eq!(dln(p(0) as _, null, p(6)), inv);
        assert_eq!(dln(p(0) as _, p(5), null), inv);
        assert_eq!(dln(null as _, p(5), p(6)), inv);
        // dequant_bias_gelu_quant: the dequant inputs, overflowing sizes.
        assert_eq!(
            fl_dequant_bias_gelu_quant(
                f16_,
                p(0) as _,
                null as _,
                p(2) as _,
                null,
                erf,
                p(4) as _,
                p(5) as _,
                null as _,
                3,
                8,
                s,
            ),
            inv
        );
        assert_eq!(
            fl_dequant_bias_gelu_quant(
                f16_,
                p(0) as _,
                p(1) as _,
                p(2) as _,
                null,
                erf,
                p(4) as _,
                p(5) as _,
                null as _,
                i64::MAX,
                8,
                s,
            ),
            inv
        );
        assert_eq!(
            fl_dequant_bias_gelu_quant(
                fl_dtype::FL_DTYPE_I8,
                p(0) as _,
                p(1) as _,
                p(2) as _,
                null,
                erf,
                p(4) as _,
                p(5) as _,
                null as _,
                3,
                8,
                s,
            ),
            bad_dtype
        );
    }
}

/// Without a GPU (CI): every launcher, given arguments that take its vector path, must get as
/// far as the launch and return its CUDA error (no driver / no device), never end the process.
/// A `__device__`-only helper called from a launcher compiles, on the host, to `exit(1)`: the
/// vector-path checks once did that (the GPU run died silently, exit status 1, at the first
/// row of width 8). With a GPU this is skipped: the GPU tests above take the same paths.
#[test]
fn launchers_reach_the_launch_on_every_path_without_a_gpu() {
    use fl_kernels_sys as sys;
    if fl_kernels::gpu_available() {
        return;
    }
    // Fake, 256-byte aligned device addresses: the launch fails before any is dereferenced.
    let p = |i: usize| (0x10_0000 + 0x1000 * i) as *mut std::ffi::c_void;
    let s: sys::fl_stream = std::ptr::null_mut();
    let (f16, bf16) = (sys::fl_dtype::FL_DTYPE_F16, sys::fl_dtype::FL_DTYPE_BF16);
    let mut rope = sys::fl_rope_params {
        head_dim: 8,
        rotary_dim: 8,
        interleaved: 0,
        reserved: 0,
        inv_freq: [0.0; fl_kernels::rope::MAX_PAIRS],
    };
    rope.inv_freq[..4].copy_from_slice(&[1.0, 0.1, 0.01, 0.001]);
    for width in [8i64, 7] {
        for dtype in [f16, bf16] {
            // SAFETY: host-side argument checks and a failing launch only (no GPU): no pointer
            // is dereferenced on the host; `rope` lives across the call.
            let st = unsafe {
                [
                    sys::fl_quantize_per_token(dtype, p(0), p(1) as _, p(2) as _, 3, width, s),
                    sys::fl_rms_norm_quant(
                        dtype,
                        p(0),
                        p(1),
                        p(2) as _,
                        p(3) as _,
                        3,
                        width,
                        1e-5,
                        s,
                    ),
                    sys::fl_dequant_add_rms_norm_quant(
                        dtype,
                        p(0) as _,
                        p(1) as _,
                        p(2) as _,
                        p(3),
                        p(4),
                        p(5) as _,
                        p(6) as _,
                        3,
                        width,
                        1e-5,
                        s,
                    ),
                    sys::fl_dequant_silu_mul_quant(
                        p(0) as _,
                        p(1) as _,
                        p(2) as _,
                        p(3) as _,
                        p(4) as _,
                        3,
                        width,
                        s,
                    ),
                    sys::fl_dequant_add(dtype, p(0) as _, p(1) as _, p(2) as _, p(3), 3, width, s),
                    sys::fl_dequantize(
                        dtype,
                        p(0) as _,
                        p(1) as _,
                        p(2) as _,
                        p(3),
                        p(4),
                        3,
                        width,
                        s,
                    ),
                    sys::fl_dequantize(
                        dtype,
                        p(0) as _,
                        p(1) as _,
                        p(2) as _,
                        std::ptr::null(),
                        p(4),
                        3,
                        width,
                        s,
                    ),
                    sys::fl_dequant_rope(
                        dtype,
                        p(0) as _,
                        p(1) as _,
                        p(2) as _,
                        p(3) as _,
                        p(4),
                        3,
                        2,
                        1,
                        &rope,
                        s,
                    ),
                    sys::fl_quantize_calibrated(
                        dtype,
                        p(0),
                        p(1) as _,
                        p(2) as _,
                        p(3) as _,
                        3,
                        width,
                        s,
                    ),
                    sys::fl_layer_norm_quant(
                        dtype,
                        p(0),
                        p(1),
                        p(2),
                        p(3),
                        p(4) as _,
                        p(5) as _,
                        std::ptr::null(),
                        3,
                        width,
                        1e-5,
                        s,
                    ),
                    sys::fl_layer_norm_quant(
                        dtype,
                        p(0),
                        p(1),
                        std::ptr::null(),
                        std::ptr::null_mut(),
                        p(4) as _,
                        p(5) as _,
                        p(6) as _,
                        3,
                        width,
                        1e-5,
                        s,
                    ),
                    sys::fl_dequant_bias_add_layer_norm_quant(
                        dtype,
                        p(0) as _,
                        p(1) as _,
                        p(2) as _,
                        p(3),
                        p(4),
                        p(5),
                        p(6),
                        p(7) as _,
                        p(8) as _,
                        p(9) as _,
                        3,
                        width,
                        1e-5,
                        s,
                    ),
                    sys::fl_dequant_bias_add_layer_norm_quant(
                        dtype,
                        p(0) as _,
                        p(1) as _,
                        p(2) as _,
                        std::ptr::null(),
                        p(4),
                        p(5),
                        std::ptr::null(),
                        p(7) as _,
                        p(8) as _,
                        std::ptr::null(),
                        3,
                        width,
                        1e-5,
                        s,
                    ),
                    sys::fl_dequant_bias_gelu_quant(
                        dtype,
                        p(0) as _,
                        p(1) as _,
                        p(2) as _,
                        p(3),
                        sys::fl_gelu_kind::FL_GELU_ERF,
                        p(4) as _,
                        p(5) as _,
                        std::ptr::null(),
                        3,
                        width,
                        s,
                    ),
                    sys::fl_dequant_bias_gelu_quant(
                        dtype,
                        p(0) as _,
                        p(1) as _,
                        p(2) as _,
                        std::ptr::null(),
                        sys::fl_gelu_kind::FL_GELU_TANH,
                        p(4) as _,
                        p(5) as _,
                        p(6) as _,
                        3,
                        width,
                        s,
                    ),
                ]
            };
            for (i, &code) in st.iter().enumerate() {
                assert!(
                    code > 0,
                    "launcher {i} (width {width}, {dtype:?}): status {code}, expected a CUDA \
                     error from the launch (no GPU here)"
                );
            }
        }
    }
}

// ---- reference properties (CPU only, run in CI) ----
proptest! {
    #[test]
    fn quantize_row_error_is_at_most_half_a_step(v in proptest::collection::vec(-100f32..100.0, 1..300)) {
        let (q, s) = rq::quantize_row(&v);
        let amax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
        prop_assert_eq!(s, amax / 127.0);
        for (&x, &qi) in v.iter().zip(&q) {
            prop_assert!((-127..=127).contains(&qi));
            let err = (x as f64 - qi as f64 * s as f64).abs();
            // Half a step, plus the f32 roundings of inv and x * inv (a few 2^-24 of 127 steps).
            prop_assert!(err <= s as f64 * (0.5 + 127.0 * 4e-7) + 1e-30, "x {x} q {qi} s {s}");
        }
        if amax > 0.0 {
            let i = v.iter().position(|x| x.abs() == amax).unwrap();
            prop_assert_eq!(q[i] as i32, if v[i] > 0.0 { 127 } else { -127 });
        } else {
            prop_assert!(q.iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn quantize_row_is_odd_and_scale_invariant(v in strategies::values(64)) {
        // q(-v) = -q(v); q(2v) = q(v) (scaling by 2 is exact in f32).
        let (q, s) = rq::quantize_row(&v);
        let neg: Vec<f32> = v.iter().map(|x| -x).collect();
        let (qn, sn) = rq::quantize_row(&neg);
        prop_assert_eq!(s, sn);
        prop_assert_eq!(qn, q.iter().map(|x| -x).collect::<Vec<i8>>());
        let dbl: Vec<f32> = v.iter().map(|x| 2.0 * x).collect();
        let (qd, sd) = rq::quantize_row(&dbl);
        prop_assert_eq!(qd, q);
        prop_assert_eq!(sd, 2.0 * s);
    }

    #[test]
    fn weight_quantisation_is_the_row_rule((n, k) in strategies::matrix(16, 300), seed in any::<u64>()) {
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let w: Vec<f32> = random_nonzero(&mut r, n * k, 1e-4, 0.1);
        let (q, s) = quant::quantize_weights_per_channel(&w, n, k).unwrap();
        let (wq, ws) = rq::quantize_rows(&w, k);
        prop_assert_eq!(q, wq);
        prop_assert_eq!(s, ws);
    }

    #[test]
    fn reference_dequantize_to_is_deq_plus_bias((m, n) in strategies::matrix(8, 300), seed in any::<u64>()) {
        // T(deq + bias) is the exact f64 value up to the one rounding to T and three f32
        // roundings before it; without bias it is T(deq), which equals dequant_add on a zero
        // residual.
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let acc = random_acc(&mut r, m * n, 400_000);
        let sa = random_scales(&mut r, m, 1e-3, 1e-2);
        let sw = random_scales(&mut r, n, 1e-4, 1e-3);
        let bias: Vec<f16> = random_nonzero(&mut r, n, 1e-3, 2.0);
        let got = rq::dequantize_to(&acc, &sa, &sw, Some(&bias[..]));
        for (i, g) in got.iter().enumerate() {
            let d = acc[i] as f64 * sa[i / n] as f64 * sw[i % n] as f64;
            let exact = d + bias[i % n].to_f64();
            let err = (g.to_f64() - exact).abs();
            // One rounding to f16 (EPS relative), three f32 roundings (of deq and the sum), the
            // f16 subnormal spacing near 0.
            let bound = exact.abs() * f16::EPS + (d.abs() + exact.abs()) * 2e-7 + 1e-7;
            prop_assert!(err <= bound, "{i}: {g} vs {exact}");
        }
        let plain = rq::dequantize_to::<bf16>(&acc, &sa, &sw, None);
        let zero = vec![bf16::ZERO; m * n];
        prop_assert_eq!(to_f64(&plain), to_f64(&rq::dequant_add(&acc, &sa, &sw, &zero)));
    }

    #[test]
    fn reference_gemm_i8_is_the_integer_product((m, n) in strategies::matrix(9, 9), k in 1usize..70, seed in any::<u64>()) {
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let a: Vec<i8> = (0..m * k).map(|_| r.random_range(-127..=127)).collect();
        let b: Vec<i8> = (0..n * k).map(|_| r.random_range(-127..=127)).collect();
        let c = rq::gemm_i8(&a, &b, m, n, k);
        for i in 0..m {
            for j in 0..n {
                let f: f64 = (0..k).map(|l| a[i * k + l] as f64 * b[j * k + l] as f64).sum();
                prop_assert_eq!(c[i * n + j] as f64, f);
            }
        }
    }

    #[test]
    fn dequantised_int8_gemm_approximates_the_float_product(seed in any::<u64>()) {
        // W8A8 of one linear: |deq(gemm_i8(q(x), q(w))) - x·wᵀ| / |x·wᵀ| is a few percent at most.
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let (m, n, k) = (4, 16, 256);
        let x: Vec<f32> = random_nonzero(&mut r, m * k, 1e-3, 1.0);
        let w: Vec<f32> = random_nonzero(&mut r, n * k, 1e-3, 0.05);
        let (xq, xs) = rq::quantize_rows(&x, k);
        let (wq, ws) = quant::quantize_weights_per_channel(&w, n, k).unwrap();
        let y = rq::dequantize(&rq::gemm_i8(&xq, &wq, m, n, k), &xs, &ws);
        let want: Vec<f64> = (0..m * n)
            .map(|ij| (0..k).map(|l| x[ij / n * k + l] as f64 * w[ij % n * k + l] as f64).sum())
            .collect();
        let e = rel_l2(&y, &want);
        prop_assert!(e < 0.03, "rel err {e}");
    }
}

// ---- W8A8 accuracy of a whole decoder layer (CPU) ----

fn layer_accuracy<T: HalfDType>(hidden: usize, hq: usize, hkv: usize, inter: usize, tokens: usize) {
    use rq::layer::{float_layer, w8a8_layer, QWeights};
    let mut r = rng("w8a8_layer_accuracy");
    let (c, w) = random_layer(&mut r, hidden, hq, hkv, inter);
    let x: Vec<T> = normal(&mut r, tokens * hidden, 1.0)
        .into_iter()
        .map(T::from_f32)
        .collect();
    let pos: Vec<i32> = (0..tokens as i32).map(|p| p + 3).collect();
    let xf = to_f64(&x);
    let want = float_layer(&c, &w, &xf, &pos);
    let qw = QWeights::<T>::new(&c, &w);
    let got = w8a8_layer(&c, &qw, &x, &pos);
    let e_out = rel_l2(&got, &want);
    // The layer's update (attention + MLP) without the residual it is added to.
    let upd_want: Vec<f64> = want.iter().zip(&xf).map(|(a, b)| a - b).collect();
    let upd_got: Vec<f64> = got.iter().zip(&xf).map(|(a, b)| a.to_f64() - b).collect();
    let e_upd = rel_l2_f64(&upd_got, &upd_want);
    eprintln!(
        "W8A8 layer vs float layer <{}> hidden {hidden}, heads {hq}/{hkv}, inter {inter}, \
         {tokens} tokens: rel L2 of the output {e_out:.2e}, of the update (out - x) {e_upd:.2e}",
        T::NAME
    );
    assert!(e_upd < 0.05, "W8A8 update rel error {e_upd}");
    assert!(e_out < 0.01, "W8A8 output rel error {e_out}");
}

#[test]
fn w8a8_layer_accuracy_f16() {
    layer_accuracy::<f16>(256, 8, 2, 688, 16);
}

#[test]
fn w8a8_layer_accuracy_bf16() {
    layer_accuracy::<bf16>(512, 8, 2, 1376, 12);
}
