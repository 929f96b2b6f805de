//! Helpers for testing ops against their references, on the GPU or skipping without one.
//!
//! GPU test policy: [`gpu_or_skip`] returns the GPU; with none it prints a skip notice and
//! the test passes, unless `FL_REQUIRE_GPU=1`, where a missing GPU fails the test.

use proptest::prelude::*;
use rand::{Rng, SeedableRng};

use crate::dtype::FloatDType;
use crate::Gpu;

/// Whether `FL_REQUIRE_GPU` asks for a GPU (`1`, `true`, `yes`).
pub fn gpu_required() -> bool {
    matches!(
        std::env::var("FL_REQUIRE_GPU")
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref(),
        Ok("1") | Ok("true") | Ok("yes")
    )
}

/// The GPU for a GPU test, or `None` after printing `SKIP <test>: no GPU (...)`.
///
/// Panics (failing the test) when there is no GPU and `FL_REQUIRE_GPU=1`.
pub fn gpu_or_skip(test: &str) -> Option<Gpu> {
    match Gpu::new(0) {
        Ok(g) => Some(g),
        Err(e) if gpu_required() => panic!("{test}: FL_REQUIRE_GPU=1 but {e}"),
        Err(e) => {
            // Written to stderr directly, not through eprintln!, so that the test harness's
            // output capture does not hide the notice.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "SKIP {test}: {e} (set FL_REQUIRE_GPU=1 to make this a failure)"
            );
            None
        }
    }
}

/// Relative L2 error ‖out − ref‖ / ‖ref‖ in f64. NaN or ∞ anywhere in `out` gives ∞;
/// an all-zero reference gives ‖out‖.
pub fn rel_l2<T: FloatDType>(out: &[T], reference: &[f64]) -> f64 {
    assert_eq!(out.len(), reference.len(), "rel_l2: lengths differ");
    let (mut num, mut den) = (0f64, 0f64);
    for (&o, &r) in out.iter().zip(reference) {
        let o = o.to_f64();
        if !o.is_finite() {
            return f64::INFINITY;
        }
        num += (o - r) * (o - r);
        den += r * r;
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// [`rel_l2`] with the denominator floored at `floor · √n`: for outputs that can be tiny
/// (a single GELU or SiLU value near zero, where a 16-bit float has few significant bits
/// left), the error is then measured against `floor` as an absolute scale instead.
pub fn rel_l2_floored<T: FloatDType>(out: &[T], reference: &[f64], floor: f64) -> f64 {
    let n = reference.len().max(1) as f64;
    let den = reference
        .iter()
        .map(|r| r * r)
        .sum::<f64>()
        .sqrt()
        .max(floor * n.sqrt());
    let r = rel_l2(out, reference);
    if !r.is_finite() {
        return r;
    }
    let num: f64 = out
        .iter()
        .zip(reference)
        .map(|(o, r)| (o.to_f64() - r).powi(2))
        .sum();
    num.sqrt() / den
}

/// The tolerance on [`rel_l2`] for outputs stored as `T` (DESIGN.md): f32 1e-5, f16/bf16 1e-2.
pub fn tolerance<T: FloatDType>() -> f64 {
    if T::EPS < 1e-7 {
        1e-5
    } else {
        1e-2
    }
}

/// A seeded RNG; the seed comes from `FL_TEST_SEED` or the clock and is printed, so a
/// failure can be replayed.
pub fn rng(test: &str) -> rand::rngs::StdRng {
    let seed = std::env::var("FL_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0x5eed)
        });
    eprintln!("{test}: FL_TEST_SEED={seed}");
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// `n` values uniform in ±[lo, hi] (never zero: `lo` > 0), rounded to `T`.
pub fn random_nonzero<T: FloatDType>(rng: &mut impl Rng, n: usize, lo: f32, hi: f32) -> Vec<T> {
    (0..n)
        .map(|_| {
            let m: f32 = rng.random_range(lo..hi);
            let s = if rng.random_bool(0.5) { 1.0 } else { -1.0 };
            T::from_f32(s * m)
        })
        .collect()
}

/// `n` values uniform in [-1, 1] with no zero, rounded to `T`.
pub fn random<T: FloatDType>(rng: &mut impl Rng, n: usize) -> Vec<T> {
    random_nonzero(rng, n, 1e-3, 1.0)
}

/// `n` samples of N(0, std²) (Box-Muller), for weights of realistic scale.
pub fn normal(rng: &mut impl Rng, n: usize, std: f64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let u1: f64 = rng.random_range(1e-12..1.0);
            let u2: f64 = rng.random_range(0.0..1.0);
            ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos() * std) as f32
        })
        .collect()
}

/// [`rel_l2`] of two f64 vectors: `‖a − b‖ / ‖b‖`.
pub fn rel_l2_f64(a: &[f64], b: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

/// A random LLaMA layer for the W8A8 checks (`reference::quant::layer`): head size
/// `hidden / q_heads`, RoPE theta 10⁴, eps 1e-5, projections N(0, 0.02²), norm weights
/// 1 + N(0, 0.1²).
pub fn random_layer(
    rng: &mut impl Rng,
    hidden: usize,
    q_heads: usize,
    kv_heads: usize,
    inter: usize,
) -> (
    crate::reference::quant::layer::Config,
    crate::reference::quant::layer::Weights,
) {
    use crate::reference::quant::layer::{Config, Weights};
    let d = hidden / q_heads;
    let c = Config {
        hidden,
        heads: crate::quant::QkvHeads { q_heads, kv_heads },
        head_dim: d,
        inter,
        eps: 1e-5,
        rope: crate::rope::RopeParams::new(d, 10_000.0),
    };
    let w = Weights {
        wqkv: normal(rng, c.qkv_width() * hidden, 0.02),
        wo: normal(rng, hidden * c.attn_width(), 0.02),
        w_gate_up: normal(rng, 2 * inter * hidden, 0.02),
        w_down: normal(rng, hidden * inter, 0.02),
        attn_norm: normal(rng, hidden, 0.1).iter().map(|v| 1.0 + v).collect(),
        ffn_norm: normal(rng, hidden, 0.1).iter().map(|v| 1.0 + v).collect(),
    };
    (c, w)
}

/// Widen to f64 for comparisons.
pub fn to_f64<T: FloatDType>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// Proptest strategies for shapes and values.
pub mod strategies {
    use super::*;

    /// A length from 1 to `max`, biased towards awkward sizes (odd, around powers of two
    /// and vector widths).
    pub fn length(max: usize) -> impl Strategy<Value = usize> {
        let max = max.max(1);
        prop_oneof![
            1..=max.min(64),
            1..=max,
            (1u32..=20).prop_map(move |p| ((1usize << p) - 1).clamp(1, max)),
            (1u32..=20).prop_map(move |p| ((1usize << p) + 1).clamp(1, max)),
        ]
    }

    /// A `[rows, cols]` shape with `rows` in 1..=max_rows and `cols` in 1..=max_cols.
    pub fn matrix(max_rows: usize, max_cols: usize) -> impl Strategy<Value = (usize, usize)> {
        (length(max_rows), length(max_cols))
    }

    /// Finite, non-zero f32 values of moderate magnitude (|x| in [1e-3, 8]).
    pub fn value() -> impl Strategy<Value = f32> {
        (1e-3f32..8.0f32, any::<bool>()).prop_map(|(m, neg)| if neg { -m } else { m })
    }

    /// A vector of `n` values from [`value`].
    pub fn values(n: usize) -> impl Strategy<Value = Vec<f32>> {
        proptest::collection::vec(value(), n)
    }
}

/// The C ABI view of a host-quantised weight, for tests that call the launchers' host twins
/// (`fl_gemv_dequantize_host`, `fl_gemv_embedding_host`) on its buffers: its format, the int4
/// group size (0 for the other formats), and pointers to its scales and zeros (null where the
/// format has none). The pointers borrow `q`'s buffers.
pub fn host_weight_ffi(
    q: &crate::gemv::QuantizedHost,
) -> (
    fl_kernels_sys::fl_gemv_format,
    i32,
    *const std::ffi::c_void,
    *const std::ffi::c_void,
) {
    use crate::gemv::{QuantFormat, Scales};
    let group = match q.format() {
        QuantFormat::Int4 { group, .. } => group as i32,
        _ => 0,
    };
    let scales: *const std::ffi::c_void = match q.scales() {
        Scales::F32(s) => s.as_ptr() as _,
        Scales::F16(s) => s.as_ptr() as _,
        Scales::None => std::ptr::null(),
    };
    let zeros: *const std::ffi::c_void = if q.zeros().is_empty() {
        std::ptr::null()
    } else {
        q.zeros().as_ptr() as _
    };
    (q.format().ffi(), group, scales, zeros)
}
