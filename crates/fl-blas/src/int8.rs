//! INT8 W8A8 GEMM on cuBLASLt tensor cores (IMMA): [`Blas::gemm_i8`] and [`QuantLinear`].
//!
//! `C_i32[m, n] = A_i8[m, k] · B_i8[n, k]ᵀ`, row-major, exact integer arithmetic
//! (`CUBLAS_COMPUTE_32I`, `CUDA_R_8I` inputs, `CUDA_R_32I` output and scale type). As for
//! [`Blas::gemm`], cuBLASLt computes the column-major `Cᵀ[n, m] = B · Aᵀ` on the data as
//! stored: its A is our `B` (`k × n`, op T), its B our `A` (`k × m`, op N), so both operands
//! are K-major: the "TN" form that cuBLASLt's IMMA kernels take in the ordinary column-major
//! order (no COL32 / COL4_4R2_8C repacking; those orders are for Turing/Ampere only, not
//! Hopper). cuBLASLt's requirements for that form (cuBLAS docs, `cublasLtMatmul`, "To use IMMA
//! kernels", regular data ordering): its `m` (our `n`) and `k` multiples of 4, leading
//! dimensions (our `k`, `k`, `n`) multiples of 4, pointers 4-byte aligned (16 for speed).
//! So here: `k % 4 == 0`, `n % 4 == 0`, any `m`.
//!
//! The activations' per-token scales and the weights' per-channel scales are applied by the
//! kernel that reads C (`fl_kernels::quant`), not here.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublaslt::sys;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use fl_kernels::DeviceTensor;

use crate::error::{check, Error, Result};
use crate::ffi::{Layout, MatmulDesc};
use crate::gemm::{alignment, heuristic, Blas, WORKSPACE_BYTES};

/// One int8 problem as the algorithm choice sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct I8Key {
    m: usize,
    n: usize,
    k: usize,
    /// Largest power of two (<= 256) dividing every pointer.
    align: u32,
}

/// Descriptors and algorithm of one int8 problem (built once, reused).
#[derive(Debug)]
pub(crate) struct I8Plan {
    desc: MatmulDesc,
    la: Layout,
    lb: Layout,
    lc: Layout,
    algo: sys::cublasLtMatmulAlgo_t,
}

/// The int8 plan cache a [`Blas`] owns.
pub(crate) type I8Plans = HashMap<I8Key, I8Plan>;

/// Checks the shapes of [`Blas::gemm_i8`]: returns `(m, n, k)`.
pub(crate) fn i8_dims(a: &[usize], b: &[usize], c: &[usize]) -> Result<(usize, usize, usize)> {
    let shape = |arg, expected: String, got: &[usize]| Error::Shape {
        arg,
        expected,
        got: got.to_vec(),
    };
    let &[m, k] = a else {
        return Err(shape("a", "[m, k]".into(), a));
    };
    let n = match *b {
        [n, kb] if kb == k => n,
        _ => return Err(shape("b", format!("[n, {k}]"), b)),
    };
    if c != [m, n] {
        return Err(shape("c", format!("[{m}, {n}]"), c));
    }
    if m == 0 || n == 0 {
        return Ok((m, n, k));
    }
    if k == 0 || k % 4 != 0 {
        return Err(Error::invalid(
            "a",
            format!("k = {k} must be a positive multiple of 4 (cuBLASLt IMMA)"),
        ));
    }
    if n % 4 != 0 {
        return Err(Error::invalid(
            "b",
            format!("n = {n} (rows of b) must be a multiple of 4 (cuBLASLt IMMA)"),
        ));
    }
    for (arg, v) in [("a", m), ("b", n), ("a", k)] {
        if i64::try_from(v).is_err() || v > i32::MAX as usize {
            return Err(Error::TooLarge {
                arg,
                value: v,
                limit: i32::MAX as usize,
            });
        }
    }
    Ok((m, n, k))
}

fn build_plan(blas: &Blas, key: &I8Key) -> Result<I8Plan> {
    use sys::cublasLtMatmulDescAttributes_t as D;
    let mut desc = MatmulDesc::new(
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32I,
        sys::cudaDataType::CUDA_R_32I,
    )?;
    desc.set(D::CUBLASLT_MATMUL_DESC_TRANSA, &1i32)?; // CUBLAS_OP_T
    desc.set(D::CUBLASLT_MATMUL_DESC_TRANSB, &0i32)?; // CUBLAS_OP_N
    let (m, n, k) = (key.m as u64, key.n as u64, key.k as u64);
    let la = Layout::new(sys::cudaDataType::CUDA_R_8I, k, n, key.k as i64)?;
    let lb = Layout::new(sys::cudaDataType::CUDA_R_8I, k, m, key.k as i64)?;
    let lc = Layout::new(sys::cudaDataType::CUDA_R_32I, n, m, key.n as i64)?;
    let found = heuristic(&blas.handle, &desc, &la, &lb, &lc, key.align, 1)?;
    let first = found.first().ok_or_else(|| {
        Error::NoAlgorithm(format!(
            "i8 m={} n={} k={} (align {})",
            key.m, key.n, key.k, key.align
        ))
    })?;
    Ok(I8Plan {
        desc,
        la,
        lb,
        lc,
        algo: first.algo,
    })
}

impl Blas {
    /// `C = A · Bᵀ` in int8 × int8 → int32 on tensor cores (cuBLASLt IMMA), row-major, exact:
    /// `c[i, j] = Σ_l a[i, l] · b[j, l]` (no overflow for `k < 2^17`: |a·b| ≤ 127²).
    ///
    /// Shapes: `a [m, k]` (activations, e.g. from
    /// [`fl_kernels::quant::rms_norm_quant`](fl_kernels::quant::rms_norm_quant)), `b [n, k]`
    /// (a weight in `nn.Linear` layout, e.g. [`QuantLinear::weight`]), `c [m, n]` (written,
    /// never read). `m` or `n` = 0 is a no-op. Requirements of cuBLASLt's IMMA kernels: `k` and
    /// `n` multiples of 4 (any `m`); the tensors' allocations are 256-byte aligned. Queued on
    /// the handle's stream; the first call for a shape picks cuBLASLt's heuristic algorithm
    /// and keeps it (with its descriptors) for later calls.
    ///
    /// Errors: [`Error::Shape`] naming `a`, `b` or `c`; [`Error::InvalidArgument`] naming `a`
    /// (`k` = 0 or not a multiple of 4, or a pointer not 4-byte aligned), `b` (`n` not a
    /// multiple of 4) or `c`; [`Error::TooLarge`] past `i32` sizes; [`Error::NoAlgorithm`] /
    /// [`Error::Cublas`] from the library.
    ///
    /// ```no_run
    /// use fl_blas::Blas;
    /// use fl_kernels::{DeviceTensor, Gpu};
    /// let gpu = Gpu::new(0)?;
    /// let s = gpu.stream();
    /// let mut blas = Blas::new(&gpu)?;
    /// let a = DeviceTensor::<i8>::filled(s, &[3, 64], 2)?;
    /// let b = DeviceTensor::<i8>::filled(s, &[8, 64], -3)?;
    /// let mut c = DeviceTensor::<i32>::zeros(s, &[3, 8])?;
    /// blas.gemm_i8(&a, &b, &mut c)?;
    /// assert!(c.to_host(s)?.iter().all(|&v| v == -384));
    /// # Ok::<(), fl_blas::Error>(())
    /// ```
    pub fn gemm_i8(
        &mut self,
        a: &DeviceTensor<i8>,
        b: &DeviceTensor<i8>,
        c: &mut DeviceTensor<i32>,
    ) -> Result<()> {
        let (m, n, k) = i8_dims(a.shape(), b.shape(), c.shape())?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        self.gpu.context().bind_to_thread()?;
        let stream = self.stream.clone();
        let (pa, _ga) = a.as_slice().device_ptr(&stream);
        let (pb, _gb) = b.as_slice().device_ptr(&stream);
        let (pc, _gc) = c.as_slice_mut().device_ptr_mut(&stream);
        for (arg, p) in [("a", pa), ("b", pb), ("c", pc)] {
            if p % 4 != 0 {
                return Err(Error::invalid(
                    arg,
                    format!("device pointer {p:#x} is not 4-byte aligned (cuBLASLt IMMA)"),
                ));
            }
        }
        let key = I8Key {
            m,
            n,
            k,
            align: alignment(&[pa, pb, pc]),
        };
        if !self.i8_plans.contains_key(&key) {
            let plan = build_plan(self, &key)?;
            self.i8_plans.insert(key, plan);
        }
        let plan = self
            .i8_plans
            .get(&key)
            .ok_or_else(|| Error::NoAlgorithm(format!("i8 m={m} n={n} k={k}")))?;
        let (ws, _gw) = self.workspace.device_ptr_mut(&stream);
        let (alpha, beta) = (1i32, 0i32);
        // SAFETY: the layouts describe the buffers checked above (a: k x m, b: k x n int8,
        // K-major; c: n x m int32, column-major views of the row-major tensors), kept alive
        // by the guards until the call has queued the work; C and D are the same buffer with
        // the same layout (allowed; beta = 0 so it is not read); alpha and beta are host i32
        // (scale type CUDA_R_32I, default host pointer mode); the workspace holds
        // WORKSPACE_BYTES, at least what the heuristic's algorithm was filtered to need.
        let st = unsafe {
            sys::cublasLtMatmul(
                self.handle.0,
                plan.desc.0,
                &alpha as *const i32 as *const c_void,
                pb as *const c_void,
                plan.la.0,
                pa as *const c_void,
                plan.lb.0,
                &beta as *const i32 as *const c_void,
                pc as *const c_void,
                plan.lc.0,
                pc as *mut c_void,
                plan.lc.0,
                &plan.algo,
                ws as *mut c_void,
                WORKSPACE_BYTES,
                stream.cu_stream() as sys::cudaStream_t,
            )
        };
        check("cublasLtMatmul (int8)", st)
    }
}

/// A linear layer quantised for W8A8: an int8 weight `[n, k]` (`nn.Linear` layout) and its
/// per-output-channel scales `[n]`, with `w ≈ weight · scales` row by row (the rule of
/// [`fl_kernels::quant::quantize_weights_per_channel`]).
///
/// ```no_run
/// use fl_blas::{int8::QuantLinear, Blas};
/// use fl_kernels::{DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let (n, k) = (11008, 4096);
/// let w = vec![0.01f32; n * k];                       // f32 weight, [out, in]
/// let lin = QuantLinear::from_f32_host(s, &w, n, k)?;
/// let mut blas = Blas::new(&gpu)?;
/// let x_q = DeviceTensor::<i8>::filled(s, &[16, k], 1)?; // quantised activations
/// let mut acc = DeviceTensor::<i32>::zeros(s, &[16, n])?;
/// lin.forward(&mut blas, &x_q, &mut acc)?;             // dequantise with lin.scales
/// # Ok::<(), fl_blas::Error>(())
/// ```
#[derive(Debug)]
pub struct QuantLinear {
    /// Int8 weight `[n, k]`.
    pub weight: DeviceTensor<i8>,
    /// Per-output-channel scales `[n]` (f32).
    pub scales: DeviceTensor<f32>,
}

impl QuantLinear {
    /// Quantises the host weight `w [n, k]` (row-major f32) per output channel and uploads
    /// it on `stream`.
    ///
    /// Errors: [`Error::InvalidArgument`] naming `w` when `w.len() != n · k`, or `k` / `n` when
    /// not a positive multiple of 4 ([`Blas::gemm_i8`]'s requirements); allocation errors.
    pub fn from_f32_host(stream: &Arc<CudaStream>, w: &[f32], n: usize, k: usize) -> Result<Self> {
        if k == 0 || k % 4 != 0 {
            return Err(Error::invalid(
                "k",
                format!("{k} must be a positive multiple of 4"),
            ));
        }
        if n == 0 || n % 4 != 0 {
            return Err(Error::invalid(
                "n",
                format!("{n} must be a positive multiple of 4"),
            ));
        }
        let (q, s) = fl_kernels::quant::quantize_weights_per_channel(w, n, k)?;
        Ok(QuantLinear {
            weight: DeviceTensor::from_host(stream, &q, &[n, k])?,
            scales: DeviceTensor::from_host(stream, &s, &[n])?,
        })
    }

    /// Output features `n`.
    pub fn out_features(&self) -> usize {
        self.weight.shape()[0]
    }

    /// Input features `k`.
    pub fn in_features(&self) -> usize {
        self.weight.shape()[1]
    }

    /// `acc = x_q · weightᵀ` ([`Blas::gemm_i8`]): `x_q [m, k]` int8, `acc [m, n]` int32.
    pub fn forward(
        &self,
        blas: &mut Blas,
        x_q: &DeviceTensor<i8>,
        acc: &mut DeviceTensor<i32>,
    ) -> Result<()> {
        blas.gemm_i8(x_q, &self.weight, acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arg_of(e: Error) -> &'static str {
        match e {
            Error::Shape { arg, .. } | Error::InvalidArgument { arg, .. } => arg,
            other => panic!("expected an argument error, got {other}"),
        }
    }

    #[test]
    fn dims_ok_and_odd_m() {
        assert_eq!(i8_dims(&[7, 64], &[12, 64], &[7, 12]).unwrap(), (7, 12, 64));
        assert_eq!(i8_dims(&[0, 6], &[12, 6], &[0, 12]).unwrap(), (0, 12, 6));
    }

    #[test]
    fn dims_errors_name_the_argument() {
        assert_eq!(arg_of(i8_dims(&[7], &[12, 64], &[7, 12]).unwrap_err()), "a");
        assert_eq!(
            arg_of(i8_dims(&[7, 64], &[12, 60], &[7, 12]).unwrap_err()),
            "b"
        );
        assert_eq!(
            arg_of(i8_dims(&[7, 64], &[12, 64], &[12, 7]).unwrap_err()),
            "c"
        );
        assert_eq!(
            arg_of(i8_dims(&[7, 66], &[12, 66], &[7, 12]).unwrap_err()),
            "a"
        );
        assert_eq!(
            arg_of(i8_dims(&[7, 64], &[10, 64], &[7, 10]).unwrap_err()),
            "b"
        );
        assert_eq!(
            arg_of(i8_dims(&[7, 0], &[12, 0], &[7, 12]).unwrap_err()),
            "a"
        );
    }
}
