//! References for [`crate::gemv_dense`]: the three epilogues and the fused QKV projection with
//! RoPE and KV-cache append ([`linear_rope_append`]), in f64, unrounded.
//!
//! `x` is `[m, k]` and weights `[rows, k]`, row-major, as slices of the storage type; every
//! function panics when a length does not match its shape (a test bug). The fused RMSNorm of
//! `rms_norm_linear*` has no reference of its own: pass `x = T(reference::norm::rms_norm(h))`
//! (rounded to `T` as the kernel rounds it) to these.

use crate::dtype::FloatDType;
use crate::kv_cache::QkvSplit;
use crate::reference::kv_cache::{contiguous_slot, RopeAppendOut};
use crate::reference::rope;
use crate::rope::RopeParams;

/// `acc[t, r] = Σ_j x[t, j] · w[r, j]` in f64 for rows `r < rows` of `w`, `[m, rows]`.
fn matmul_t<T: FloatDType>(x: &[T], w: &[T], m: usize, rows: usize, k: usize) -> Vec<f64> {
    assert_eq!(x.len(), m * k, "reference::gemv_dense: x is not [m, k]");
    assert_eq!(
        w.len(),
        rows * k,
        "reference::gemv_dense: w is not [rows, k]"
    );
    let xd: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    let wd: Vec<f64> = w.iter().map(|v| v.to_f64()).collect();
    let mut y = vec![0f64; m * rows];
    for t in 0..m {
        let xr = &xd[t * k..(t + 1) * k];
        for r in 0..rows {
            y[t * rows + r] = wd[r * k..(r + 1) * k]
                .iter()
                .zip(xr)
                .map(|(a, b)| a * b)
                .sum();
        }
    }
    y
}

/// `y[t, r] = Σ_j x[t, j] · w[r, j] (+ bias[r])`, `w [n, k]`, `bias [n]`; returns `[m, n]`.
pub fn linear<T: FloatDType>(
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    m: usize,
    n: usize,
    k: usize,
) -> Vec<f64> {
    let mut y = matmul_t(x, w, m, n, k);
    if let Some(b) = bias {
        assert_eq!(b.len(), n, "reference::gemv_dense::linear: bias is not [n]");
        for row in y.chunks_exact_mut(n.max(1)) {
            for (v, b) in row.iter_mut().zip(b) {
                *v += b.to_f64();
            }
        }
    }
    y
}

/// `silu(g) = g / (1 + e^(−g))` in f64.
pub fn silu(g: f64) -> f64 {
    g / (1.0 + (-g).exp())
}

/// `out[t, r] = silu(x[t] · w[r]) · (x[t] · w[I + r])` with `w_gate_up [2I, k]` (gate rows
/// then up rows); returns `[m, I]`.
pub fn linear_swiglu<T: FloatDType>(
    x: &[T],
    w_gate_up: &[T],
    m: usize,
    i: usize,
    k: usize,
) -> Vec<f64> {
    let gu = matmul_t(x, w_gate_up, m, 2 * i, k);
    let mut out = vec![0f64; m * i];
    for t in 0..m {
        for r in 0..i {
            out[t * i + r] = silu(gu[t * 2 * i + r]) * gu[t * 2 * i + i + r];
        }
    }
    out
}

/// `residual[t, r] + Σ_j x[t, j] · w[r, j]` (the value `linear_add` writes, unrounded),
/// `residual [m, n]`; returns `[m, n]`.
pub fn linear_add<T: FloatDType>(
    x: &[T],
    w: &[T],
    residual: &[T],
    m: usize,
    n: usize,
    k: usize,
) -> Vec<f64> {
    assert_eq!(
        residual.len(),
        m * n,
        "reference::gemv_dense: residual is not [m, n]"
    );
    let mut y = matmul_t(x, w, m, n, k);
    for (v, r) in y.iter_mut().zip(residual) {
        *v += r.to_f64();
    }
    y
}

/// Reference of [`gemv_dense::linear_rope_append`](crate::gemv_dense::linear_rope_append), in
/// f64 and unrounded: `acc = x · wᵀ (+ bias)` by [`linear`] (`x` already normalised: for the
/// fused RMSNorm pass `T(reference::norm::rms_norm(h))`), split per token into `heads.q_heads`
/// q heads, then `heads.kv_heads` k heads, then `heads.kv_heads` v heads of `rope.head_dim`;
/// q and k rotated in f64 by the pairs of [`rope::pair`] (any [`RopeStyle`], though the kernel
/// takes only the interleaved one) at the f32 angles of [`rope::angles`], elements past
/// `rotary_dim` unchanged; v as is.
///
/// `k_cache` and `v_cache` are f64 copies of a contiguous cache of shape `cache_shape =
/// [batch, kv_heads, max_seq, head_dim]`: for each token whose slot exists
/// ([`contiguous_slot`]) its rotated k and its v are written, unrounded, into
/// `[seq, head, pos, :]`; every other element is left as it was. The returned
/// [`RopeAppendOut`] holds `q [m, q_heads, head_dim]`, `k`, `v [m, kv_heads, head_dim]` (the
/// values written), with every row of a token whose slot does not exist set to NaN (the
/// kernel writes nothing of it, not even `q_out`), and the OR of the error bits
/// ([`ERR_SEQUENCE`](crate::kv_cache::ERR_SEQUENCE) /
/// [`ERR_POSITION`](crate::kv_cache::ERR_POSITION); a sequence outside the batch is reported
/// as such, whatever the position).
///
/// The kernel rounds each of these values once to `T` (after an f32 rotation): compare with a
/// tolerance of one rounding. Panics on inconsistent lengths or invalid params (a test bug).
///
/// [`RopeStyle`]: crate::rope::RopeStyle
#[allow(clippy::too_many_arguments)]
pub fn linear_rope_append<T: FloatDType>(
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    m: usize,
    k: usize,
    heads: QkvSplit,
    rope: &RopeParams,
    seq_ids: &[i32],
    positions: &[i32],
    k_cache: &mut [f64],
    v_cache: &mut [f64],
    cache_shape: [usize; 4],
) -> RopeAppendOut {
    let QkvSplit { q_heads, kv_heads } = heads;
    let d = rope.head_dim;
    let n = (q_heads + 2 * kv_heads) * d;
    let [_, c_heads, max_seq, c_dim] = cache_shape;
    assert_eq!(
        (c_heads, c_dim),
        (kv_heads, d),
        "reference::gemv_dense::linear_rope_append: cache is not [batch, kv_heads, max_seq, head_dim]"
    );
    let cache_len: usize = cache_shape.iter().product();
    assert!(
        k_cache.len() == cache_len && v_cache.len() == cache_len,
        "reference::gemv_dense::linear_rope_append: a cache slice is not cache_shape"
    );
    assert!(
        seq_ids.len() == m && positions.len() == m,
        "reference::gemv_dense::linear_rope_append: seq_ids / positions are not [m]"
    );
    let inv = rope
        .inv_freq()
        .expect("reference::gemv_dense::linear_rope_append: invalid params");
    let acc = linear(x, w, bias, m, n, k);
    let mut q = vec![f64::NAN; m * q_heads * d];
    let mut kk = vec![f64::NAN; m * kv_heads * d];
    let mut vv = vec![f64::NAN; m * kv_heads * d];
    let mut flag = 0;
    for (t, (&s, &p)) in seq_ids.iter().zip(positions).enumerate() {
        let base = match contiguous_slot(cache_shape, s, p) {
            Ok(b) => b,
            Err(bit) => {
                flag |= bit;
                continue;
            }
        };
        let ang = rope::angles(&inv, p);
        // Head `h` of token t's row, rotated (q and k heads) or not (v heads).
        let head = |h: usize, rotate: bool| -> Vec<f64> {
            let mut row = acc[t * n + h * d..][..d].to_vec();
            if rotate {
                for (i, &a) in ang.iter().enumerate() {
                    let (c, sn) = ((a as f64).cos(), (a as f64).sin());
                    let (i0, i1) = rope::pair(rope.style, rope.rotary_dim, i);
                    let (x0, x1) = (row[i0], row[i1]);
                    row[i0] = x0 * c - x1 * sn;
                    row[i1] = x1 * c + x0 * sn;
                }
            }
            row
        };
        for h in 0..q_heads {
            q[(t * q_heads + h) * d..][..d].copy_from_slice(&head(h, true));
        }
        for h in 0..kv_heads {
            let (kr, vr) = (head(q_heads + h, true), head(q_heads + kv_heads + h, false));
            let at = base + h * max_seq * d;
            k_cache[at..at + d].copy_from_slice(&kr);
            v_cache[at..at + d].copy_from_slice(&vr);
            kk[(t * kv_heads + h) * d..][..d].copy_from_slice(&kr);
            vv[(t * kv_heads + h) * d..][..d].copy_from_slice(&vr);
        }
    }
    RopeAppendOut {
        q,
        k: kk,
        v: vv,
        flag,
    }
}
