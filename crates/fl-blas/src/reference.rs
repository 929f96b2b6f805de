//! CPU reference of [`Blas::gemm`](crate::Blas::gemm), in f64.
//!
//! Same semantics and shapes as the GPU call, on host slices: inputs are widened to f64
//! exactly, products are summed in f64 and the result is returned unrounded, for the GPU
//! tests to compare against with a relative L2 error.

use fl_kernels::FloatDType;

/// Sizes of a reference GEMM:
/// `C[batch, m, n] = alpha · A[batch, m, k] · B[n, k]ᵀ + bias[n] + beta · C0`, with B `[batch, n, k]` unless `shared_b` (one `[n, k]` for every batch).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RefGemm {
    /// Rows of A and C.
    pub m: usize,
    /// Rows of B, columns of C.
    pub n: usize,
    /// The reduced dimension.
    pub k: usize,
    /// Number of products (1 for a plain GEMM).
    pub batch: usize,
    /// One B shared by the whole batch.
    pub shared_b: bool,
    /// Scale of the product.
    pub alpha: f64,
    /// Scale of `c0`.
    pub beta: f64,
}

impl RefGemm {
    /// `alpha` = 1, `beta` = 0, batch 1.
    pub fn new(m: usize, n: usize, k: usize) -> Self {
        RefGemm {
            m,
            n,
            k,
            batch: 1,
            shared_b: false,
            alpha: 1.0,
            beta: 0.0,
        }
    }
}

/// The GEMM in f64. `c0` (the previous C, `[batch, m, n]`) is read only when `beta != 0`
/// and may then not be `None`; the result has `batch · m · n` elements.
///
/// Panics when a slice length does not match the sizes (a test helper, not library code).
pub fn gemm<T: FloatDType>(
    g: &RefGemm,
    a: &[T],
    b: &[T],
    bias: Option<&[T]>,
    c0: Option<&[T]>,
) -> Vec<f64> {
    let RefGemm {
        m,
        n,
        k,
        batch,
        shared_b,
        alpha,
        beta,
    } = *g;
    let b_batches = if shared_b { 1 } else { batch };
    assert_eq!(
        a.len(),
        batch * m * k,
        "reference::gemm: a has the wrong length"
    );
    assert_eq!(
        b.len(),
        b_batches * n * k,
        "reference::gemm: b has the wrong length"
    );
    if let Some(bias) = bias {
        assert_eq!(bias.len(), n, "reference::gemm: bias has the wrong length");
    }
    let c0 = if beta != 0.0 {
        let c0 = c0.expect("reference::gemm: beta != 0 needs c0");
        assert_eq!(
            c0.len(),
            batch * m * n,
            "reference::gemm: c0 has the wrong length"
        );
        Some(c0)
    } else {
        None
    };
    let a: Vec<f64> = a.iter().map(|x| x.to_f64()).collect();
    let b: Vec<f64> = b.iter().map(|x| x.to_f64()).collect();
    let mut out = vec![0f64; batch * m * n];
    for bt in 0..batch {
        let ab = &a[bt * m * k..(bt + 1) * m * k];
        let bb = if shared_b {
            &b[..]
        } else {
            &b[bt * n * k..(bt + 1) * n * k]
        };
        for i in 0..m {
            let row = &ab[i * k..(i + 1) * k];
            for j in 0..n {
                let col = &bb[j * k..(j + 1) * k];
                let dot: f64 = row.iter().zip(col).map(|(x, y)| x * y).sum();
                let idx = bt * m * n + i * n + j;
                let mut v = alpha * dot;
                if let Some(bias) = bias {
                    v += bias[j].to_f64();
                }
                if let Some(c0) = c0 {
                    v += beta * c0[idx].to_f64();
                }
                out[idx] = v;
            }
        }
    }
    out
}
