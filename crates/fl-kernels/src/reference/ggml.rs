//! References for the ggml block formats ([`crate::ggml`]): dequantisation and ggml's
//! reference quantisers, both bit-exact with llama.cpp, and random valid blocks.
//!
//! [`dequantize_row`] computes what ggml's `dequantize_row_*` (`ggml-quants.c`) computes, in
//! f32 with the same operations in the same order, so every output is bit-identical to
//! llama.cpp's CPU path (checked against ggml's C and gguf-py; see
//! `tests/ggml_reference.rs`). With f16 scales every product of scales and quants is
//! exact in f32 (at most 11 + 8 + 6 significant bits), so the only rounding is the final
//! add of a minimum (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K): a kernel that forms the same products,
//! in any order or as a fused multiply-add, gets the same bits. Q8_K's f32 scale rounds once.
//!
//! [`quantize_row`] is ggml's `quantize_row_*_ref` for every type (the K-quant searches
//! included), operation for operation without fused multiply-adds: its bytes equal those of
//! a ggml build with `-ffp-contract=off`. A `-march=native` build of ggml contracts some of
//! the search's sums into FMAs and picks different levels in a few percent of K-quant
//! super-blocks; both are valid files, and [`dequantize_row`] of either is exact.
//!
//! ```
//! use fl_kernels::ggml::GgmlType;
//! use fl_kernels::reference::ggml::{dequantize_row, quantize_row};
//! let x: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) / 8.0).collect();
//! let q = quantize_row(GgmlType::Q8_0, &x)?;     // 2 blocks of 34 bytes
//! assert_eq!(q.len(), 68);
//! let y = dequantize_row(GgmlType::Q8_0, &q, 64)?;
//! assert!(x.iter().zip(&y).all(|(a, b)| (a - b).abs() <= 4.0 / 254.0));
//! # Ok::<(), fl_kernels::Error>(())
//! ```

use half::{bf16, f16};

use crate::ggml::{GgmlType, QK, QK_K};
use crate::{Error, Result};

/// The `k` values a row of ggml blocks stands for, exactly as ggml's `dequantize_row_*`
/// computes them (bit-identical f32). `bytes` holds `k / ty.block_elems()` blocks.
///
/// Errors: [`Error::InvalidArgument`] naming `k` if it is not a multiple of the block;
/// [`Error::Shape`] naming `bytes` if its length is not `ty.row_bytes(k)`.
pub fn dequantize_row(ty: GgmlType, bytes: &[u8], k: usize) -> Result<Vec<f32>> {
    let want = ty.row_bytes(k)?;
    if bytes.len() != want {
        return Err(Error::Shape {
            arg: "bytes",
            expected: format!("[{want}] ({} row of {k} values)", ty.name()),
            got: vec![bytes.len()],
        });
    }
    let mut y = Vec::with_capacity(k);
    let blocks = bytes.chunks_exact(ty.block_bytes());
    match ty {
        GgmlType::F32 => y.extend(blocks.map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        GgmlType::F16 => y.extend(blocks.map(|b| f16_at(b, 0))),
        GgmlType::BF16 => y.extend(blocks.map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())),
        GgmlType::Q4_0 => blocks.for_each(|b| dequant_q4_0(b, &mut y)),
        GgmlType::Q4_1 => blocks.for_each(|b| dequant_q4_1(b, &mut y)),
        GgmlType::Q5_0 => blocks.for_each(|b| dequant_q5_0(b, &mut y)),
        GgmlType::Q5_1 => blocks.for_each(|b| dequant_q5_1(b, &mut y)),
        GgmlType::Q8_0 => blocks.for_each(|b| dequant_q8_0(b, &mut y)),
        GgmlType::Q2_K => blocks.for_each(|b| dequant_q2_k(b, &mut y)),
        GgmlType::Q3_K => blocks.for_each(|b| dequant_q3_k(b, &mut y)),
        GgmlType::Q4_K => blocks.for_each(|b| dequant_q4_k(b, &mut y)),
        GgmlType::Q5_K => blocks.for_each(|b| dequant_q5_k(b, &mut y)),
        GgmlType::Q6_K => blocks.for_each(|b| dequant_q6_k(b, &mut y)),
        GgmlType::Q8_K => blocks.for_each(|b| dequant_q8_k(b, &mut y)),
    }
    debug_assert_eq!(y.len(), k);
    Ok(y)
}

/// The little-endian f16 at byte `at` of `b`, widened to f32 (exact).
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

fn dequant_q4_0(b: &[u8], y: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let qs = &b[2..2 + QK / 2];
    y.extend(qs.iter().map(|&q| ((q & 0x0F) as i32 - 8) as f32 * d));
    y.extend(qs.iter().map(|&q| ((q >> 4) as i32 - 8) as f32 * d));
}

fn dequant_q4_1(b: &[u8], y: &mut Vec<f32>) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qs = &b[4..4 + QK / 2];
    y.extend(qs.iter().map(|&q| (q & 0x0F) as f32 * d + m));
    y.extend(qs.iter().map(|&q| (q >> 4) as f32 * d + m));
}

/// The 32 5-bit values of a Q5_0 / Q5_1 block: low nibbles from `qs`, fifth bits from `qh`.
fn q5_values(qh: &[u8], qs: &[u8]) -> [i32; QK] {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut v = [0i32; QK];
    for j in 0..QK / 2 {
        v[j] = ((qs[j] & 0x0F) as u32 | ((qh >> j) << 4) & 0x10) as i32;
        v[j + QK / 2] = ((qs[j] >> 4) as u32 | (qh >> (j + 12)) & 0x10) as i32;
    }
    v
}

fn dequant_q5_0(b: &[u8], y: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let v = q5_values(&b[2..6], &b[6..6 + QK / 2]);
    y.extend(v.iter().map(|&q| (q - 16) as f32 * d));
}

fn dequant_q5_1(b: &[u8], y: &mut Vec<f32>) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let v = q5_values(&b[4..8], &b[8..8 + QK / 2]);
    y.extend(v.iter().map(|&q| q as f32 * d + m));
}

fn dequant_q8_0(b: &[u8], y: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    y.extend(b[2..2 + QK].iter().map(|&q| (q as i8) as f32 * d));
}

fn dequant_q2_k(b: &[u8], y: &mut Vec<f32>) {
    let (scales, qs) = (&b[..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    let mut is = 0;
    for q in qs.chunks_exact(32) {
        for shift in [0, 2, 4, 6] {
            for half in [&q[..16], &q[16..]] {
                let sc = scales[is];
                is += 1;
                let dl = d * (sc & 0x0F) as f32;
                let ml = dmin * (sc >> 4) as f32;
                y.extend(half.iter().map(|&v| dl * ((v >> shift) & 3) as f32 - ml));
            }
        }
    }
}

/// Q3_K's 16 signed 6-bit scales from their 12-byte packing: low nibbles in bytes 0..8
/// (sub-blocks 0..8 in the low halves, 8..16 in the high halves), the top 2 bits in 8..12.
fn q3_k_scales(s: &[u8]) -> [i32; 16] {
    let mut out = [0i32; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = if j < 8 { s[j] & 0x0F } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = (low | (high << 4)) as i32 - 32;
    }
    out
}

fn dequant_q3_k(b: &[u8], y: &mut Vec<f32>) {
    let (hmask, qs) = (&b[..32], &b[32..96]);
    let scales = q3_k_scales(&b[96..108]);
    let d_all = f16_at(b, 108);
    let (mut is, mut m) = (0, 1u8);
    for q in qs.chunks_exact(32) {
        for shift in [0, 2, 4, 6] {
            for (qh, hm) in [(&q[..16], &hmask[..16]), (&q[16..], &hmask[16..])] {
                let dl = d_all * scales[is] as f32;
                is += 1;
                y.extend(qh.iter().zip(hm).map(|(&v, &h)| {
                    let low = ((v >> shift) & 3) as i32;
                    dl * (low - if h & m != 0 { 0 } else { 4 }) as f32
                }));
            }
            m <<= 1;
        }
    }
}

/// Scale and min of sub-block `j` (0..8) of a Q4_K / Q5_K block from their 12-byte packing
/// (ggml's `get_scale_min_k4`).
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

fn dequant_q4_k(b: &[u8], y: &mut Vec<f32>) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qs) = (&b[4..16], &b[16..144]);
    for (i, q) in qs.chunks_exact(32).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * i, scales);
        let (sc2, m2) = scale_min_k4(2 * i + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        y.extend(q.iter().map(|&v| d1 * (v & 0x0F) as f32 - m1));
        y.extend(q.iter().map(|&v| d2 * (v >> 4) as f32 - m2));
    }
}

fn dequant_q5_k(b: &[u8], y: &mut Vec<f32>) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
    for (i, ql) in qs.chunks_exact(32).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * i, scales);
        let (sc2, m2) = scale_min_k4(2 * i + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        let (u1, u2) = (1u8 << (2 * i), 2u8 << (2 * i));
        let hi = |h: u8, u: u8| if h & u != 0 { 16 } else { 0 };
        y.extend(
            ql.iter()
                .zip(qh)
                .map(|(&v, &h)| d1 * ((v & 0x0F) + hi(h, u1)) as f32 - m1),
        );
        y.extend(
            ql.iter()
                .zip(qh)
                .map(|(&v, &h)| d2 * ((v >> 4) + hi(h, u2)) as f32 - m2),
        );
    }
}

fn dequant_q6_k(b: &[u8], y: &mut Vec<f32>) {
    let (ql, qh, sc) = (&b[..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    for n in 0..2 {
        let (ql, qh, sc) = (&ql[64 * n..], &qh[32 * n..], &sc[8 * n..]);
        let mut out = [0f32; 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | (qh[l] & 3) << 4) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | ((qh[l] >> 2) & 3) << 4) as i32 - 32;
            let q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) as i32 - 32;
            // ggml: `d * sc[is] * q`, left to right (exact: 11 + 8 + 6 bits).
            let scale = |s: u8| d * (s as i8) as f32;
            out[l] = scale(sc[is]) * q1 as f32;
            out[l + 32] = scale(sc[is + 2]) * q2 as f32;
            out[l + 64] = scale(sc[is + 4]) * q3 as f32;
            out[l + 96] = scale(sc[is + 6]) * q4 as f32;
        }
        y.extend_from_slice(&out);
    }
}

fn dequant_q8_k(b: &[u8], y: &mut Vec<f32>) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    y.extend(b[4..4 + QK_K].iter().map(|&q| d * (q as i8) as f32));
}

/// `x` quantised to a row of `ty` blocks with ggml's reference quantiser
/// (`quantize_row_*_ref`, what `llama-quantize` runs without an importance matrix); F32 /
/// F16 / BF16 round to nearest even (ggml's `GGML_FP32_TO_FP16`, `GGML_FP32_TO_BF16`).
/// Every f32 operation is done as written in ggml, one rounding each (no fused
/// multiply-add), so the bytes equal those of a ggml build without FP contraction. A scale
/// beyond f16 range is stored as ±inf, as ggml stores it; the K-quant searches expect
/// finite inputs of magnitude below about 4·10^6 times the block's step (ggml asserts it).
///
/// Errors: [`Error::InvalidArgument`] naming `x` if its length is not a multiple of the
/// block.
pub fn quantize_row(ty: GgmlType, x: &[f32]) -> Result<Vec<u8>> {
    let want = ty.row_bytes(x.len()).map_err(|_| {
        Error::invalid(
            "x",
            format!(
                "length {} is not a multiple of the {ty} block of {}",
                x.len(),
                ty.block_elems()
            ),
        )
    })?;
    let mut out = Vec::with_capacity(want);
    match ty {
        GgmlType::F32 => x.iter().for_each(|v| out.extend(v.to_le_bytes())),
        GgmlType::F16 => x
            .iter()
            .for_each(|&v| out.extend(f16::from_f32(v).to_le_bytes())),
        GgmlType::BF16 => x
            .iter()
            .for_each(|&v| out.extend(f32_to_bf16_bits(v).to_le_bytes())),
        GgmlType::Q4_0 => x.chunks_exact(QK).for_each(|b| quant_q4_0(b, &mut out)),
        GgmlType::Q4_1 => x.chunks_exact(QK).for_each(|b| quant_q4_1(b, &mut out)),
        GgmlType::Q5_0 => x.chunks_exact(QK).for_each(|b| quant_q5_0(b, &mut out)),
        GgmlType::Q5_1 => x.chunks_exact(QK).for_each(|b| quant_q5_1(b, &mut out)),
        GgmlType::Q8_0 => x.chunks_exact(QK).for_each(|b| quant_q8_0(b, &mut out)),
        GgmlType::Q2_K => x.chunks_exact(QK_K).for_each(|b| quant_q2_k(b, &mut out)),
        GgmlType::Q3_K => x.chunks_exact(QK_K).for_each(|b| quant_q3_k(b, &mut out)),
        GgmlType::Q4_K => x
            .chunks_exact(QK_K)
            .for_each(|b| quant_q45_k(b, 15, &mut out)),
        GgmlType::Q5_K => x
            .chunks_exact(QK_K)
            .for_each(|b| quant_q45_k(b, 31, &mut out)),
        GgmlType::Q6_K => x.chunks_exact(QK_K).for_each(|b| quant_q6_k(b, &mut out)),
        GgmlType::Q8_K => x.chunks_exact(QK_K).for_each(|b| quant_q8_k(b, &mut out)),
    }
    debug_assert_eq!(out.len(), want);
    Ok(out)
}

/// ggml's `GGML_FP32_TO_BF16`: round to nearest even, NaN kept quiet.
fn f32_to_bf16_bits(v: f32) -> u16 {
    let u = v.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        ((u >> 16) | 64) as u16
    } else {
        ((u as u64 + (0x7fff + ((u >> 16) & 1)) as u64) >> 16) as u16
    }
}

/// The value of largest magnitude (the first, on ties) and that magnitude.
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    (max, amax)
}

fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        min = if v < min { v } else { min };
        max = if v > max { v } else { max };
    }
    (min, max)
}

fn inv(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

fn quant_q4_0(x: &[f32], out: &mut Vec<u8>) {
    let (max, _) = signed_absmax(x);
    let d = max / -8.0;
    let id = inv(d);
    out.extend(f16::from_f32(d).to_le_bytes());
    let q = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
    out.extend((0..QK / 2).map(|j| q(x[j]) | (q(x[j + QK / 2]) << 4)));
}

fn quant_q4_1(x: &[f32], out: &mut Vec<u8>) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inv(d);
    out.extend(f16::from_f32(d).to_le_bytes());
    out.extend(f16::from_f32(min).to_le_bytes());
    let q = |v: f32| (((v - min) * id + 0.5) as i8).min(15) as u8;
    out.extend((0..QK / 2).map(|j| q(x[j]) | (q(x[j + QK / 2]) << 4)));
}

/// Packs 32 5-bit values as `qh` (fifth bits, u32 little-endian) then `qs` (nibbles).
fn pack_q5(q: &[u8; QK], out: &mut Vec<u8>) {
    let mut qh = 0u32;
    for (j, &v) in q.iter().enumerate() {
        qh |= ((v as u32 & 0x10) >> 4) << j;
    }
    out.extend(qh.to_le_bytes());
    out.extend((0..QK / 2).map(|j| (q[j] & 0x0F) | ((q[j + QK / 2] & 0x0F) << 4)));
}

fn quant_q5_0(x: &[f32], out: &mut Vec<u8>) {
    let (max, _) = signed_absmax(x);
    let d = max / -16.0;
    let id = inv(d);
    out.extend(f16::from_f32(d).to_le_bytes());
    let q: [u8; QK] = std::array::from_fn(|j| ((x[j] * id + 16.5) as i8).min(31) as u8);
    pack_q5(&q, out);
}

fn quant_q5_1(x: &[f32], out: &mut Vec<u8>) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inv(d);
    out.extend(f16::from_f32(d).to_le_bytes());
    out.extend(f16::from_f32(min).to_le_bytes());
    let q: [u8; QK] = std::array::from_fn(|j| ((x[j] - min) * id + 0.5) as u8);
    pack_q5(&q, out);
}

fn quant_q8_0(x: &[f32], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = inv(d);
    out.extend(f16::from_f32(d).to_le_bytes());
    out.extend(x.iter().map(|&v| (v * id).round() as i8 as u8));
}

/// ggml's `nearest_int`: round half to even through the f32 mantissa (for |v| < 2^22).
fn nearest_int(v: f32) -> i32 {
    ((v + 12_582_912.0).to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// ggml's `GROUP_MAX_EPS`: below this a group counts as all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// Stores `v` as a little-endian f16 and returns the value stored, widened.
fn put_f16(out: &mut Vec<u8>, v: f32) -> f32 {
    let h = f16::from_f32(v);
    out.extend(h.to_le_bytes());
    h.to_f32()
}

/// ggml's `make_qx_quants` with `rmse_type = 1` and no importance weights: a symmetric
/// scale for `x` (levels `L − nmax` in `[−nmax, nmax)`), searched around `−nmax / max`.
fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [u8]) -> f32 {
    let (max, amax) = signed_absmax_gt(x);
    if amax < GROUP_MAX_EPS {
        l_out.iter_mut().for_each(|l| *l = 0);
        return 0.0;
    }
    let clamp = |v: f32| nearest_int(v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for &xi in x {
            let l = clamp(iscale * xi) as f32;
            let w = xi * xi;
            sumlx += w * xi * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let mut iscale = -(nmax as f32) / max;
    for (o, &xi) in l_out.iter_mut().zip(x) {
        *o = (clamp(iscale * xi) + nmax) as u8;
    }
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (o, &xi) in l_out.iter_mut().zip(x) {
                *o = (clamp(iscale * xi) + nmax) as u8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_q3_quants` with `do_rmse`: a symmetric scale for `x` (levels `L − nmax`),
/// refined by moving one level at a time while the weighted fit improves.
fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [u8]) -> f32 {
    let (max, amax) = signed_absmax_gt(x);
    if amax < GROUP_MAX_EPS {
        l_out.iter_mut().for_each(|l| *l = 0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let mut l = [0i32; 16];
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (li, &xi) in l.iter_mut().zip(x) {
        *li = nearest_int(iscale * xi).clamp(-nmax, nmax - 1);
        let w = xi * xi;
        sumlx += w * xi * *li as f32;
        suml2 += w * *li as f32 * *li as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (li, &xi) in l.iter_mut().zip(x) {
            let w = xi * xi;
            let mut slx = sumlx - w * xi * *li as f32;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * *li as f32 * *li as f32;
                let new_l = nearest_int(xi * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != *li {
                    slx += w * xi * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *li = new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for (o, li) in l_out.iter_mut().zip(l) {
        *o = (li + nmax) as u8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// ggml's `make_qkx2_quants`: scale and minimum for `x` (levels in `[0, nmax]`, value
/// `scale · L − min`), searched over `nstep + 1` trial scales by weighted least squares.
/// Returns `(scale, min)` with `min ≥ 0`.
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        min = if x[i] < min { x[i] } else { min };
        max = if x[i] > max { x[i] } else { max };
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out.iter_mut().for_each(|l| *l = 0);
        return (0.0, -min);
    }
    let err = |d: f32| if use_mad { d.abs() } else { d * d };
    let level = |iscale: f32, xi: f32, min: f32| nearest_int(iscale * (xi - min)).clamp(0, nmax);
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        l_out[i] = level(iscale, x[i], min) as u8;
        best_error += weights[i] * err(scale * l_out[i] as f32 + min - x[i]);
    }
    let mut laux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let l = level(iscale, x[i], min);
            laux[i] = l as u8;
            let (w, l) = (weights[i], l as f32);
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                cur_error += weights[i] * err(this_scale * laux[i] as f32 + this_min - x[i]);
            }
            if cur_error < best_error {
                l_out.copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// The value of largest magnitude (the first, on ties; ggml's `ax > amax` loop) and that
/// magnitude.
fn signed_absmax_gt(x: &[f32]) -> (f32, f32) {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (max, amax)
}

/// Packs 256 2-bit levels as ggml's Q2_K / Q3_K `qs`: byte `32·h + l` of half `h` holds
/// levels `128·h + l + 32·s` in bits `2s..2s + 2`.
fn pack_2bit(l: &[u8; QK_K], out: &mut Vec<u8>) {
    for h in 0..2 {
        let l = &l[128 * h..];
        out.extend((0..32).map(|i| l[i] | (l[i + 32] << 2) | (l[i + 64] << 4) | (l[i + 96] << 6)));
    }
}

fn quant_q2_k(x: &[f32], out: &mut Vec<u8>) {
    const Q4SCALE: f32 = 15.0;
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins) = ([0f32; 16], [0f32; 16]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..16 {
        let xs = &x[16 * j..16 * (j + 1)];
        let w: [f32; 16] = std::array::from_fn(|i| xs[i].abs());
        let ls = &mut l[16 * j..16 * (j + 1)];
        (scales[j], mins[j]) = make_qkx2_quants(3, xs, &w, ls, -0.5, 0.1, 15, true);
        max_scale = if scales[j] > max_scale {
            scales[j]
        } else {
            max_scale
        };
        max_min = if mins[j] > max_min { mins[j] } else { max_min };
    }
    let mut sc = [0u8; 16];
    let mut block = Vec::with_capacity(84);
    let d = if max_scale > 0.0 {
        let iscale = Q4SCALE / max_scale;
        for j in 0..16 {
            sc[j] = nearest_int(iscale * scales[j]) as u8;
        }
        max_scale / Q4SCALE
    } else {
        0.0
    };
    let dmin = if max_min > 0.0 {
        let iscale = Q4SCALE / max_min;
        for j in 0..16 {
            sc[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
        }
        max_min / Q4SCALE
    } else {
        0.0
    };
    let mut tail = Vec::with_capacity(4);
    let d = put_f16(&mut tail, d);
    let dmin = put_f16(&mut tail, dmin);
    for ((&s, xs), ls) in sc
        .iter()
        .zip(x.chunks_exact(16))
        .zip(l.chunks_exact_mut(16))
    {
        let dl = d * (s & 0x0F) as f32;
        if dl == 0.0 {
            continue;
        }
        let ml = dmin * (s >> 4) as f32;
        for (li, &xi) in ls.iter_mut().zip(xs) {
            *li = nearest_int((xi + ml) / dl).clamp(0, 3) as u8;
        }
    }
    block.extend(sc);
    pack_2bit(&l, &mut block);
    block.extend(tail);
    out.extend(block);
}

fn quant_q3_k(x: &[f32], out: &mut Vec<u8>) {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut amax) = (0f32, 0f32);
    for j in 0..16 {
        scales[j] = make_q3_quants(4, &x[16 * j..16 * (j + 1)], &mut l[16 * j..16 * (j + 1)]);
        if scales[j].abs() > amax {
            amax = scales[j].abs();
            max_scale = scales[j];
        }
    }
    let mut sc = [0u8; 12];
    let mut d_bytes = Vec::with_capacity(2);
    let d = if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for j in 0..16 {
            let lv = (nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) as i32 + 32;
            if j < 8 {
                sc[j] = (lv & 0x0F) as u8;
            } else {
                sc[j - 8] |= ((lv & 0x0F) << 4) as u8;
            }
            sc[8 + j % 4] |= ((lv >> 4) << (2 * (j / 4))) as u8;
        }
        put_f16(&mut d_bytes, 1.0 / iscale)
    } else {
        put_f16(&mut d_bytes, 0.0)
    };
    let signed = q3_k_scales(&sc);
    for ((&s, xs), ls) in signed
        .iter()
        .zip(x.chunks_exact(16))
        .zip(l.chunks_exact_mut(16))
    {
        let dl = d * s as f32;
        if dl == 0.0 {
            continue;
        }
        for (li, &xi) in ls.iter_mut().zip(xs) {
            *li = (nearest_int(xi / dl).clamp(-4, 3) + 4) as u8;
        }
    }
    // High bit of level j goes to bit j / 32 of hmask byte j % 32.
    let mut hmask = [0u8; 32];
    for (j, lj) in l.iter_mut().enumerate() {
        if *lj > 3 {
            hmask[j % 32] |= 1 << (j / 32);
            *lj -= 4;
        }
    }
    out.extend(hmask);
    pack_2bit(&l, out);
    out.extend(sc);
    out.extend(d_bytes);
}

/// Q4_K (`nmax = 15`) and Q5_K (`nmax = 31`): eight sub-blocks of 32 with 6-bit scales and
/// mins.
fn quant_q45_k(x: &[f32], nmax: i32, out: &mut Vec<u8>) {
    let (rmin, nstep) = if nmax == 15 { (-1.0, 20) } else { (-0.5, 15) };
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * (j + 1)];
        let mut sum_x2 = 0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let w: [f32; 32] = std::array::from_fn(|i| av_x + xs[i].abs());
        let ls = &mut l[32 * j..32 * (j + 1)];
        (scales[j], mins[j]) = make_qkx2_quants(nmax, xs, &w, ls, rmin, 0.1, nstep, false);
        max_scale = if scales[j] > max_scale {
            scales[j]
        } else {
            max_scale
        };
        max_min = if mins[j] > max_min { mins[j] } else { max_min };
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut sc = [0u8; 12];
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0x0F) | ((lm & 0x0F) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    let d = put_f16(out, max_scale / 63.0);
    let dmin = put_f16(out, max_min / 63.0);
    out.extend(sc);
    for j in 0..8 {
        let (s, m) = scale_min_k4(j, &sc);
        let dl = d * s as f32;
        if dl == 0.0 {
            continue;
        }
        let dm = dmin * m as f32;
        for i in 32 * j..32 * (j + 1) {
            l[i] = nearest_int((x[i] + dm) / dl).clamp(0, nmax) as u8;
        }
    }
    if nmax == 31 {
        // Fifth bits: level 64·p + i sets bit 2p of qh[i], level 64·p + 32 + i bit 2p + 1.
        let mut qh = [0u8; 32];
        for (j, lj) in l.iter_mut().enumerate() {
            if *lj > 15 {
                qh[j % 32] |= 1 << (j / 32);
                *lj -= 16;
            }
        }
        out.extend(qh);
    }
    for p in 0..4 {
        let l = &l[64 * p..];
        out.extend((0..32).map(|i| l[i] | (l[i + 32] << 4)));
    }
}

fn quant_q6_k(x: &[f32], out: &mut Vec<u8>) {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs) = (0f32, 0f32);
    for j in 0..16 {
        scales[j] = make_qx_quants(32, &x[16 * j..16 * (j + 1)], &mut l[16 * j..16 * (j + 1)]);
        if scales[j].abs() > max_abs {
            max_abs = scales[j].abs();
            max_scale = scales[j];
        }
    }
    if max_abs < GROUP_MAX_EPS {
        out.extend([0u8; 210]);
        return;
    }
    let iscale = -128.0 / max_scale;
    let mut tail = Vec::with_capacity(18);
    let sc: [i8; 16] = std::array::from_fn(|j| nearest_int(iscale * scales[j]).min(127) as i8);
    tail.extend(sc.map(|s| s as u8));
    let d = put_f16(&mut tail, 1.0 / iscale);
    for ((&s, xs), ls) in sc
        .iter()
        .zip(x.chunks_exact(16))
        .zip(l.chunks_exact_mut(16))
    {
        let dl = d * s as f32;
        if dl == 0.0 {
            continue;
        }
        for (li, &xi) in ls.iter_mut().zip(xs) {
            *li = (nearest_int(xi / dl).clamp(-32, 31) + 32) as u8;
        }
    }
    let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
    for h in 0..2 {
        let l = &l[128 * h..];
        for i in 0..32 {
            ql[64 * h + i] = (l[i] & 0x0F) | ((l[i + 64] & 0x0F) << 4);
            ql[64 * h + i + 32] = (l[i + 32] & 0x0F) | ((l[i + 96] & 0x0F) << 4);
            qh[32 * h + i] = (l[i] >> 4)
                | ((l[i + 32] >> 4) << 2)
                | ((l[i + 64] >> 4) << 4)
                | ((l[i + 96] >> 4) << 6);
        }
    }
    out.extend(ql);
    out.extend(qh);
    out.extend(tail);
}

fn quant_q8_k(x: &[f32], out: &mut Vec<u8>) {
    let (max, amax) = signed_absmax_gt(x);
    if amax == 0.0 {
        out.extend([0u8; 292]);
        return;
    }
    let iscale = -127.0 / max;
    let qs: [i8; QK_K] = std::array::from_fn(|j| nearest_int(iscale * x[j]).min(127) as i8);
    out.extend((1.0 / iscale).to_le_bytes());
    out.extend(qs.map(|q| q as u8));
    for g in qs.chunks_exact(16) {
        out.extend(g.iter().map(|&q| q as i16).sum::<i16>().to_le_bytes());
    }
}

/// `n_blocks` random, valid blocks of `ty` (deterministic in `seed`): random quants and
/// packed scales, with every f16 / f32 scale finite (normal, subnormal or zero, of either
/// sign, over the whole f16 range; Q8_K's f32 scale too) and Q8_K's `bsums` consistent with its quants. F32 /
/// F16 / BF16 "blocks" are random finite values. Any such block dequantises to finite
/// values, so it is test data for the kernels of every format.
pub fn random_blocks(ty: GgmlType, n_blocks: usize, seed: u64) -> Vec<u8> {
    let mut rng = SplitMix64(seed);
    let bb = ty.block_bytes();
    let mut out = vec![0u8; n_blocks * bb];
    for blk in out.chunks_exact_mut(bb) {
        blk.iter_mut().for_each(|b| *b = rng.next() as u8);
        let scale_at: &[usize] = match ty {
            GgmlType::F16 | GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
            GgmlType::Q2_K => &[80, 82],
            GgmlType::Q3_K => &[108],
            GgmlType::Q6_K => &[208],
            GgmlType::F32 | GgmlType::BF16 | GgmlType::Q8_K => &[],
        };
        for &at in scale_at {
            let bits = finite_f16_bits(u16::from_le_bytes([blk[at], blk[at + 1]]));
            blk[at..at + 2].copy_from_slice(&bits.to_le_bytes());
        }
        match ty {
            // bf16 and f32 share the exponent field: bits 23..31 of the f32.
            GgmlType::BF16 => {
                let bits = u16::from_le_bytes([blk[0], blk[1]]);
                let bits = if bits & 0x7f80 == 0x7f80 {
                    bits & !0x4000
                } else {
                    bits
                };
                blk.copy_from_slice(&bits.to_le_bytes());
            }
            GgmlType::F32 => {
                let bits = u32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]);
                let bits = if bits & 0x7f80_0000 == 0x7f80_0000 {
                    bits & !0x4000_0000
                } else {
                    bits
                };
                blk.copy_from_slice(&bits.to_le_bytes());
            }
            GgmlType::Q8_K => {
                // An f16-range scale, so that d · 127 stays finite.
                let d = f16::from_bits(finite_f16_bits(rng.next() as u16)).to_f32();
                blk[..4].copy_from_slice(&d.to_le_bytes());
                for g in 0..QK_K / 16 {
                    let s: i16 = blk[4 + 16 * g..4 + 16 * (g + 1)]
                        .iter()
                        .map(|&q| (q as i8) as i16)
                        .sum();
                    let at = 4 + QK_K + 2 * g;
                    blk[at..at + 2].copy_from_slice(&s.to_le_bytes());
                }
            }
            _ => {}
        }
    }
    out
}

/// `bits` with an all-ones exponent (inf / NaN) moved down to a finite one.
fn finite_f16_bits(bits: u16) -> u16 {
    if bits & 0x7c00 == 0x7c00 {
        bits & !0x4000
    } else {
        bits
    }
}

/// A tiny deterministic generator (SplitMix64), so test data needs no `rand` here.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemv::{self, QuantFormat};
    use crate::reference::gemv::dequantize as gemv_dequantize;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        let cases = [
            (0.5, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (2.4999, 2),
            (-7.6, -8),
        ];
        for (v, want) in cases {
            assert_eq!(nearest_int(v), want, "{v}");
        }
    }

    fn ramp(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = SplitMix64(seed);
        (0..n)
            .map(|_| (rng.next() >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0)
            .collect()
    }

    #[test]
    fn random_blocks_are_finite_and_deterministic() {
        for ty in GgmlType::ALL {
            let k = 5 * ty.block_elems();
            let b = random_blocks(ty, 5, 7);
            assert_eq!(b, random_blocks(ty, 5, 7));
            assert_ne!(b, random_blocks(ty, 5, 8), "{ty}");
            let y = dequantize_row(ty, &b, k).unwrap();
            assert_eq!(y.len(), k);
            assert!(y.iter().all(|v| v.is_finite()), "{ty}");
        }
    }

    #[test]
    fn agrees_with_the_gemv_formats() {
        let (n, k) = (3, 96);
        let w = ramp(n * k, 1);
        for (fmt, ty) in [
            (QuantFormat::Q8_0, GgmlType::Q8_0),
            (QuantFormat::Q4_0, GgmlType::Q4_0),
        ] {
            let host = gemv::quantize(&w, n, k, fmt).unwrap();
            let mine = quantize_row(ty, &w).unwrap();
            assert_eq!(host.data(), &mine[..], "{ty} bytes");
            let a = gemv_dequantize(&host);
            let b = dequantize_row(ty, &mine, n * k).unwrap();
            assert!(
                a.iter().zip(&b).all(|(a, b)| *a == *b as f64),
                "{ty} values"
            );
        }
    }

    #[test]
    fn hand_checked_blocks() {
        // Q4_0: d = 0.5, nibbles 0..15 -> (q - 8) / 2.
        let mut b = f16::from_f32(0.5).to_le_bytes().to_vec();
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let y = dequantize_row(GgmlType::Q4_0, &b, 32).unwrap();
        assert_eq!(y[0], -4.0);
        assert_eq!(y[15], 3.5);
        assert_eq!(y[16], 3.5);
        assert_eq!(y[31], -4.0);
        // Q5_1: d = 1, m = -1, qh bit 31 set -> last value 16 + 15 - 1.
        let mut b = f16::ONE.to_le_bytes().to_vec();
        b.extend(f16::from_f32(-1.0).to_le_bytes());
        b.extend(0x8000_0000u32.to_le_bytes());
        b.extend([0xF0u8; 16]);
        let y = dequantize_row(GgmlType::Q5_1, &b, 32).unwrap();
        assert_eq!((y[0], y[16], y[31]), (-1.0, 14.0, 30.0));
        // Q4_K: scale/min packing of sub-block 5 reaches into bytes 1, 5 and 9.
        let mut s = [0u8; 12];
        s[1] = 0b1100_0000;
        s[5] = 0b0100_0000;
        s[9] = 0x21;
        assert_eq!(scale_min_k4(5, &s), (0x31, 0x12));
        // Q3_K: scale 15 takes bits 4..8 of byte 7 and bits 6..8 of byte 11.
        let mut s = [0u8; 12];
        s[7] = 0xA0;
        s[11] = 0b1100_0000;
        assert_eq!(q3_k_scales(&s)[15], 0x3A - 32);
    }

    #[test]
    fn argument_errors() {
        let e = dequantize_row(GgmlType::Q4_K, &[0; 144], 200).unwrap_err();
        assert!(e.to_string().contains("`k`"), "{e}");
        let e = dequantize_row(GgmlType::Q4_K, &[0; 143], 256).unwrap_err();
        assert!(e.to_string().contains("`bytes`"), "{e}");
        let e = quantize_row(GgmlType::Q8_0, &[0.0; 31]).unwrap_err();
        assert!(e.to_string().contains("`x`"), "{e}");
        let e = quantize_row(GgmlType::Q6_K, &[0.0; 255]).unwrap_err();
        assert!(e.to_string().contains("`x`"), "{e}");
    }
}
