//! Shared by the GPU test files: one GEMM case run on the GPU and compared with the
//! f64 reference.
#![allow(dead_code)]

use fl_blas::reference::{self, RefGemm};
use fl_blas::{Blas, GemmParams, GemmType};
use fl_kernels::testing::{random, rel_l2};
use fl_kernels::{DeviceTensor, Gpu};
use rand::Rng;

/// One test case.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    /// `Some(false)`: `a` is 3-D with a per-batch `b`; `Some(true)`: shared `b`;
    /// `None`: plain 2-D call.
    pub batched: Option<bool>,
    pub bias: bool,
    pub alpha: f32,
    pub beta: f32,
}

impl Case {
    pub fn plain(m: usize, n: usize, k: usize) -> Self {
        Case {
            m,
            n,
            k,
            batch: 1,
            batched: None,
            bias: false,
            alpha: 1.0,
            beta: 0.0,
        }
    }
}

/// Runs `case` on the GPU and returns the rel L2 error against the reference.
pub fn run_case<T: GemmType>(gpu: &Gpu, blas: &mut Blas, case: Case, r: &mut impl Rng) -> f64 {
    let s = gpu.stream();
    let Case {
        m,
        n,
        k,
        batch,
        batched,
        bias,
        alpha,
        beta,
    } = case;
    let shared = batched == Some(true);
    let b_batches = if shared { 1 } else { batch };
    let (a_shape, b_shape, c_shape) = match batched {
        None => (vec![m, k], vec![n, k], vec![m, n]),
        Some(true) => (vec![batch, m, k], vec![n, k], vec![batch, m, n]),
        Some(false) => (vec![batch, m, k], vec![batch, n, k], vec![batch, m, n]),
    };
    let a: Vec<T> = random(r, batch * m * k);
    let b: Vec<T> = random(r, b_batches * n * k);
    let bias_h: Vec<T> = random(r, n);
    let c0: Vec<T> = random(r, batch * m * n);
    let da = DeviceTensor::from_host(s, &a, &a_shape).unwrap();
    let db = DeviceTensor::from_host(s, &b, &b_shape).unwrap();
    let dbias = DeviceTensor::from_host(s, &bias_h, &[n]).unwrap();
    // beta = 0: the output is poisoned with NaN, which must not leak into the result.
    let mut dc = if beta == 0.0 {
        DeviceTensor::filled(s, &c_shape, T::from_f32(f32::NAN)).unwrap()
    } else {
        DeviceTensor::from_host(s, &c0, &c_shape).unwrap()
    };
    blas.gemm(
        &da,
        &db,
        bias.then_some(&dbias),
        &mut dc,
        GemmParams { alpha, beta },
    )
    .unwrap_or_else(|e| panic!("{case:?} {}: {e}", T::NAME));
    let got = dc.to_host(s).unwrap();
    let g = RefGemm {
        m,
        n,
        k,
        batch,
        shared_b: shared,
        alpha: alpha as f64,
        beta: beta as f64,
    };
    let want = reference::gemm(
        &g,
        &a,
        &b,
        bias.then_some(&bias_h[..]),
        (beta != 0.0).then_some(&c0[..]),
    );
    rel_l2(&got, &want)
}
