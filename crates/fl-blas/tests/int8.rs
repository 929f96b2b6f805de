//! `Blas::gemm_i8` (cuBLASLt IMMA) on the GPU: bit-exact against an i64 CPU product, argument
//! errors; `QuantLinear`; and a whole W8A8 decoder layer composed from the fl-kernels quant
//! kernels and `gemm_i8`, against the CPU W8A8 reference of the same chain
//! (`fl_kernels::reference::quant::layer`).

use fl_blas::{Blas, Error, QuantLinear};
use fl_kernels::quant::{self, Dequant};
use fl_kernels::reference::quant as rq;
use fl_kernels::testing::{gpu_or_skip, normal, random_layer, rel_l2, rel_l2_f64, rng, to_f64};
use fl_kernels::{bf16, f16, DeviceTensor, Gpu, HalfDType};
use rand::Rng;

fn random_i8(r: &mut impl Rng, n: usize) -> Vec<i8> {
    (0..n).map(|_| r.random_range(-127..=127)).collect()
}

fn check_gemm(gpu: &Gpu, blas: &mut Blas, m: usize, n: usize, k: usize, r: &mut impl Rng) {
    let s = gpu.stream();
    let a = random_i8(r, m * k);
    let b = random_i8(r, n * k);
    let da = DeviceTensor::from_host(s, &a, &[m, k]).unwrap();
    let db = DeviceTensor::from_host(s, &b, &[n, k]).unwrap();
    let mut dc = DeviceTensor::<i32>::filled(s, &[m, n], i32::MIN).unwrap();
    blas.gemm_i8(&da, &db, &mut dc).unwrap();
    let got = dc.to_host(s).unwrap();
    let want = rq::gemm_i8(&a, &b, m, n, k);
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!(
            "gemm_i8 m={m} n={n} k={k}: c[{}, {}] = {}, want {}",
            i / n,
            i % n,
            got[i],
            want[i]
        );
    }
}

/// Odd m (any m is allowed), n and k multiples of 4; decode (m = 1), small and prefill-like.
const SHAPES: &[(usize, usize, usize)] = &[
    (1, 4, 4),
    (3, 8, 8),
    (7, 12, 64),
    (17, 100, 36),
    (1, 4096, 4096),
    (5, 11008, 256),
    (33, 256, 1000),
    (65, 1028, 132),
    (129, 512, 4096),
    (256, 384, 2048),
];

#[test]
fn gemm_i8_is_exact() {
    let Some(gpu) = gpu_or_skip("gemm_i8_is_exact") else {
        return;
    };
    let mut blas = Blas::new(&gpu).unwrap();
    let mut r = rng("gemm_i8");
    for &(m, n, k) in SHAPES {
        check_gemm(&gpu, &mut blas, m, n, k, &mut r);
    }
    // The same shapes again: cached plans.
    for &(m, n, k) in &SHAPES[..4] {
        check_gemm(&gpu, &mut blas, m, n, k, &mut r);
    }
}

#[test]
fn gemm_i8_extreme_values() {
    // Every product at ±127², k = 8192: sums of ±132 M, far from i32 limits but past f32's
    // exact integers (2^24): catches a float accumulator.
    let Some(gpu) = gpu_or_skip("gemm_i8_extreme_values") else {
        return;
    };
    let s = gpu.stream();
    let mut blas = Blas::new(&gpu).unwrap();
    let (m, n, k) = (3, 8, 8192);
    let a: Vec<i8> = (0..m * k)
        .map(|i| if i % 3 == 0 { -127 } else { 127 })
        .collect();
    let mut b = vec![127i8; n * k];
    b[5] = 1; // one odd product: the exact sum is not a multiple of 127²
    let da = DeviceTensor::from_host(s, &a, &[m, k]).unwrap();
    let db = DeviceTensor::from_host(s, &b, &[n, k]).unwrap();
    let mut dc = DeviceTensor::<i32>::zeros(s, &[m, n]).unwrap();
    blas.gemm_i8(&da, &db, &mut dc).unwrap();
    assert_eq!(dc.to_host(s).unwrap(), rq::gemm_i8(&a, &b, m, n, k));
}

#[test]
fn gemm_i8_errors_name_the_argument() {
    let Some(gpu) = gpu_or_skip("gemm_i8_errors_name_the_argument") else {
        return;
    };
    let s = gpu.stream();
    let mut blas = Blas::new(&gpu).unwrap();
    let t = |shape: &[usize]| DeviceTensor::<i8>::zeros(s, shape).unwrap();
    let arg = |e: Error| match e {
        Error::Shape { arg, .. } | Error::InvalidArgument { arg, .. } => arg,
        other => panic!("expected an argument error, got {other}"),
    };
    let mut c = DeviceTensor::<i32>::zeros(s, &[3, 8]).unwrap();
    // k = 6 is not a multiple of 4.
    assert_eq!(
        arg(blas.gemm_i8(&t(&[3, 6]), &t(&[8, 6]), &mut c).unwrap_err()),
        "a"
    );
    // n = 6 is not a multiple of 4.
    let mut c6 = DeviceTensor::<i32>::zeros(s, &[3, 6]).unwrap();
    assert_eq!(
        arg(blas.gemm_i8(&t(&[3, 8]), &t(&[6, 8]), &mut c6).unwrap_err()),
        "b"
    );
    assert_eq!(
        arg(blas.gemm_i8(&t(&[3, 8]), &t(&[8, 4]), &mut c).unwrap_err()),
        "b"
    );
    assert_eq!(
        arg(blas
            .gemm_i8(&t(&[3, 8, 1]), &t(&[8, 8]), &mut c)
            .unwrap_err()),
        "a"
    );
    let mut c_bad = DeviceTensor::<i32>::zeros(s, &[8, 3]).unwrap();
    assert_eq!(
        arg(blas
            .gemm_i8(&t(&[3, 8]), &t(&[8, 8]), &mut c_bad)
            .unwrap_err()),
        "c"
    );
    // m = 0: nothing to do.
    let mut c0 = DeviceTensor::<i32>::zeros(s, &[0, 8]).unwrap();
    blas.gemm_i8(&t(&[0, 8]), &t(&[8, 8]), &mut c0).unwrap();
    // QuantLinear refuses what gemm_i8 would.
    assert!(matches!(
        QuantLinear::from_f32_host(s, &[0.1; 24], 4, 6),
        Err(Error::InvalidArgument { arg: "k", .. })
    ));
    assert!(matches!(
        QuantLinear::from_f32_host(s, &[0.1; 24], 6, 4),
        Err(Error::InvalidArgument { arg: "n", .. })
    ));
    assert!(QuantLinear::from_f32_host(s, &[0.1; 20], 4, 4).is_err());
}

#[test]
fn quant_linear_matches_reference() {
    let Some(gpu) = gpu_or_skip("quant_linear_matches_reference") else {
        return;
    };
    let s = gpu.stream();
    let mut blas = Blas::new(&gpu).unwrap();
    let mut r = rng("quant_linear");
    let (m, n, k) = (9, 96, 320);
    let w: Vec<f32> = (0..n * k).map(|_| r.random_range(-0.05..0.05)).collect();
    let lin = QuantLinear::from_f32_host(s, &w, n, k).unwrap();
    assert_eq!((lin.out_features(), lin.in_features()), (n, k));
    let (wq, ws) = rq::quantize_rows(&w, k);
    assert_eq!(lin.weight.to_host(s).unwrap(), wq);
    assert_eq!(lin.scales.to_host(s).unwrap(), ws);
    let x = random_i8(&mut r, m * k);
    let dx = DeviceTensor::from_host(s, &x, &[m, k]).unwrap();
    let mut acc = DeviceTensor::<i32>::zeros(s, &[m, n]).unwrap();
    lin.forward(&mut blas, &dx, &mut acc).unwrap();
    assert_eq!(acc.to_host(s).unwrap(), rq::gemm_i8(&x, &wq, m, n, k));
}

// ---- a whole W8A8 decoder layer on the GPU ----

/// Runs the layer on the GPU: fl-kernels quant kernels + gemm_i8; attention (not part of
/// the quant chain) runs on the host from the GPU's q/k/v with the reference's function.
fn gpu_layer<T: HalfDType>(
    gpu: &Gpu,
    blas: &mut Blas,
    c: &rq::layer::Config,
    w: &rq::layer::QWeights<T>,
    x: &[T],
    pos: &[i32],
) -> Vec<T> {
    let s = gpu.stream();
    let t = pos.len();
    let h = c.hidden;
    let up = |v: &[i8], shape: &[usize]| DeviceTensor::from_host(s, v, shape).unwrap();
    let upf = |v: &[f32], shape: &[usize]| DeviceTensor::from_host(s, v, shape).unwrap();
    let (qkv_w, o_w, gu_w, d_w) = (c.qkv_width(), c.attn_width(), 2 * c.inter, c.inter);
    let wqkv = up(&w.wqkv.q, &[qkv_w, h]);
    let sqkv = upf(&w.wqkv.scale, &[qkv_w]);
    let wo = up(&w.wo.q, &[h, o_w]);
    let so = upf(&w.wo.scale, &[h]);
    let wgu = up(&w.w_gate_up.q, &[gu_w, h]);
    let sgu = upf(&w.w_gate_up.scale, &[gu_w]);
    let wd = up(&w.w_down.q, &[h, d_w]);
    let sd = upf(&w.w_down.scale, &[h]);
    let attn_norm = DeviceTensor::from_host(s, &w.attn_norm, &[h]).unwrap();
    let ffn_norm = DeviceTensor::from_host(s, &w.ffn_norm, &[h]).unwrap();
    let dpos = DeviceTensor::from_host(s, pos, &[t]).unwrap();
    let mut res = DeviceTensor::from_host(s, x, &[t, h]).unwrap();

    let mut xq = DeviceTensor::<i8>::filled(s, &[t, h], i8::MIN).unwrap();
    let mut xs = DeviceTensor::<f32>::filled(s, &[t], f32::NAN).unwrap();
    quant::rms_norm_quant(s, &res, &attn_norm, c.eps, &mut xq, &mut xs).unwrap();
    let mut acc = DeviceTensor::<i32>::zeros(s, &[t, qkv_w]).unwrap();
    blas.gemm_i8(&xq, &wqkv, &mut acc).unwrap();
    let mut qkv = DeviceTensor::<T>::filled(s, &[t, qkv_w], T::from_f32(f32::NAN)).unwrap();
    let deq = Dequant {
        acc: &acc,
        act_scale: &xs,
        weight_scale: &sqkv,
    };
    quant::dequant_rope(s, deq, &dpos, c.heads, &c.rope, &mut qkv).unwrap();
    let attn = rq::layer::attention_t(c, &qkv.to_host(s).unwrap(), t);
    let dattn = DeviceTensor::from_host(s, &attn, &[t, o_w]).unwrap();
    let mut aq = DeviceTensor::<i8>::filled(s, &[t, o_w], i8::MIN).unwrap();
    let mut as_ = DeviceTensor::<f32>::filled(s, &[t], f32::NAN).unwrap();
    quant::quantize_per_token(s, &dattn, &mut aq, &mut as_).unwrap();
    let mut acc_o = DeviceTensor::<i32>::zeros(s, &[t, h]).unwrap();
    blas.gemm_i8(&aq, &wo, &mut acc_o).unwrap();
    let mut yq = DeviceTensor::<i8>::filled(s, &[t, h], i8::MIN).unwrap();
    let mut ys = DeviceTensor::<f32>::filled(s, &[t], f32::NAN).unwrap();
    let deq = Dequant {
        acc: &acc_o,
        act_scale: &as_,
        weight_scale: &so,
    };
    quant::dequant_add_rms_norm_quant(s, deq, &mut res, &ffn_norm, c.eps, &mut yq, &mut ys)
        .unwrap();
    let mut acc_gu = DeviceTensor::<i32>::zeros(s, &[t, gu_w]).unwrap();
    blas.gemm_i8(&yq, &wgu, &mut acc_gu).unwrap();
    let mut mq = DeviceTensor::<i8>::filled(s, &[t, d_w], i8::MIN).unwrap();
    let mut ms = DeviceTensor::<f32>::filled(s, &[t], f32::NAN).unwrap();
    let deq = Dequant {
        acc: &acc_gu,
        act_scale: &ys,
        weight_scale: &sgu,
    };
    quant::dequant_silu_mul_quant(s, deq, &mut mq, &mut ms).unwrap();
    let mut acc_d = DeviceTensor::<i32>::zeros(s, &[t, h]).unwrap();
    blas.gemm_i8(&mq, &wd, &mut acc_d).unwrap();
    let deq = Dequant {
        acc: &acc_d,
        act_scale: &ms,
        weight_scale: &sd,
    };
    quant::dequant_add(s, deq, &mut res).unwrap();
    res.to_host(s).unwrap()
}

fn layer_case<T: HalfDType>(
    gpu: &Gpu,
    hidden: usize,
    hq: usize,
    hkv: usize,
    inter: usize,
    tokens: usize,
) {
    use rq::layer::{float_layer, w8a8_layer, QWeights};
    let mut blas = Blas::new(gpu).unwrap();
    let mut r = rng("w8a8_layer_gpu");
    let (c, w) = random_layer(&mut r, hidden, hq, hkv, inter);
    let x: Vec<T> = normal(&mut r, tokens * hidden, 1.0)
        .into_iter()
        .map(T::from_f32)
        .collect();
    let pos: Vec<i32> = (0..tokens as i32).map(|p| 2 * p + 1).collect();
    let qw = QWeights::<T>::new(&c, &w);
    let got = gpu_layer(gpu, &mut blas, &c, &qw, &x, &pos);
    let want = w8a8_layer(&c, &qw, &x, &pos);
    let xf = to_f64(&x);
    let upd = |v: &[T]| -> Vec<f64> { v.iter().zip(&xf).map(|(a, b)| a.to_f64() - b).collect() };
    let e_ref = rel_l2_f64(&upd(&got), &upd(&want));
    let float = float_layer(&c, &w, &xf, &pos);
    let upd_float: Vec<f64> = float.iter().zip(&xf).map(|(a, b)| a - b).collect();
    let e_float = rel_l2_f64(&upd(&got), &upd_float);
    eprintln!(
        "GPU W8A8 layer <{}> hidden {hidden}, heads {hq}/{hkv}, inter {inter}, {tokens} tokens: \
         update (out - x) rel L2 vs CPU W8A8 reference {e_ref:.2e}, vs float layer {e_float:.2e}; \
         output vs CPU W8A8 {:.2e}",
        T::NAME,
        rel_l2(&got, &to_f64(&want))
    );
    // Usually 0 (the reference rounds as the kernels do). A value that lands within an ulp of a
    // rounding boundary of the 16-bit residual or of an int8 code can still round the other
    // way on one side, and the flipped code then moves a whole GEMM row: in bf16 (8 mantissa
    // bits) one such flip gave 1.04e-2 (FL_TEST_SEED=1795480133488959656, H100), so bf16 is
    // held to 2e-2 and f16 to 1e-2.
    let bound = if T::NAME == "bf16" { 2e-2 } else { 1e-2 };
    assert!(
        e_ref < bound,
        "GPU chain vs CPU W8A8 reference: {e_ref} (bound {bound})"
    );
    assert!(e_float < 0.05, "GPU W8A8 vs float layer: {e_float}");
}

#[test]
fn w8a8_layer_on_gpu_matches_cpu_chain() {
    let Some(gpu) = gpu_or_skip("w8a8_layer_on_gpu_matches_cpu_chain") else {
        return;
    };
    layer_case::<f16>(&gpu, 256, 8, 2, 688, 16);
    layer_case::<bf16>(&gpu, 512, 8, 2, 1376, 12);
    // Other sizes: hidden 260 (scalar row path), head_dim 20 (scalar RoPE path, MQA), inter 684.
    layer_case::<f16>(&gpu, 260, 13, 1, 684, 7);
}
