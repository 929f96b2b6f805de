//! The GEMM handle: [`Blas`], row-major products over cuBLASLt with an algorithm cache.

use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::path::Path;
use std::sync::Arc;

use cudarc::cublaslt::sys;
use cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use fl_kernels::{DeviceTensor, Gpu};

use crate::cache::{AlgoCache, CacheKey, CachedAlgo, GemmShape};
use crate::dtype::{GemmDType, GemmType};
use crate::error::{check, status_name, Error, Result};
use crate::ffi::{Handle, Layout, MatmulDesc, Preference};

/// Bytes of cuBLASLt workspace each [`Blas`] owns (NVIDIA's recommendation for Hopper).
pub const WORKSPACE_BYTES: usize = 32 << 20;

/// Scalars of [`Blas::gemm`]: `C = alpha · A·Bᵀ + bias + beta · C`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GemmParams {
    /// Scale of the product (default 1).
    pub alpha: f32,
    /// Scale of the previous contents of C (default 0: C is write-only and not read).
    pub beta: f32,
}

impl Default for GemmParams {
    fn default() -> Self {
        GemmParams {
            alpha: 1.0,
            beta: 0.0,
        }
    }
}

/// What [`Blas::autotune`] measured for one shape.
#[derive(Debug, Clone, PartialEq)]
pub struct AutotuneResult {
    /// The shape tuned.
    pub shape: GemmShape,
    /// Candidates that ran (those that failed to launch are not counted).
    pub candidates: usize,
    /// Time per call of the heuristic's first choice, in ms.
    pub heuristic_ms: f64,
    /// Time per call of the fastest candidate (the one kept), in ms.
    pub best_ms: f64,
    /// Index of the fastest candidate in the heuristic's list (0: the heuristic was right).
    pub best_index: usize,
}

/// The sizes of one call, after the shape checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dims {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub shared_b: bool,
}

fn shape_err(arg: &'static str, expected: String, got: &[usize]) -> Error {
    Error::Shape {
        arg,
        expected,
        got: got.to_vec(),
    }
}

/// Checks the shapes of a GEMM call (see [`Blas::gemm`]) and returns its sizes.
pub(crate) fn gemm_dims(
    a: &[usize],
    b: &[usize],
    bias: Option<&[usize]>,
    c: &[usize],
) -> Result<Dims> {
    let (batch, m, k) = match *a {
        [m, k] => (1, m, k),
        [batch, m, k] => (batch, m, k),
        _ => return Err(shape_err("a", "[m, k] or [batch, m, k]".into(), a)),
    };
    let (n, shared_b) = match (a.len(), b) {
        (2, &[n, kb]) if kb == k => (n, false),
        (3, &[n, kb]) if kb == k => (n, true),
        (3, &[bb, n, kb]) if bb == batch && kb == k => (n, false),
        (2, _) => return Err(shape_err("b", format!("[n, {k}]"), b)),
        _ => {
            return Err(shape_err(
                "b",
                format!("[{batch}, n, {k}] or [n, {k}] (shared)"),
                b,
            ))
        }
    };
    let want_c: Vec<usize> = if a.len() == 2 {
        vec![m, n]
    } else {
        vec![batch, m, n]
    };
    if c != want_c.as_slice() {
        return Err(shape_err("c", format!("{want_c:?}"), c));
    }
    if let Some(bs) = bias {
        if bs != [n] {
            return Err(shape_err("bias", format!("[{n}]"), bs));
        }
    }
    Ok(Dims {
        m,
        n,
        k,
        batch,
        shared_b: shared_b && batch > 1,
    })
}

fn as_i64(arg: &'static str, v: usize) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::TooLarge {
        arg,
        value: v,
        limit: i64::MAX as usize,
    })
}

fn mul(arg: &'static str, x: usize, y: usize) -> Result<i64> {
    let p = x.checked_mul(y).ok_or(Error::TooLarge {
        arg,
        value: usize::MAX,
        limit: i64::MAX as usize,
    })?;
    as_i64(arg, p)
}

/// The largest power of two (at most 256) dividing every pointer.
pub(crate) fn alignment(ptrs: &[u64]) -> u32 {
    ptrs.iter()
        .map(|&p| {
            if p == 0 {
                256
            } else {
                1u64 << p.trailing_zeros().min(8)
            }
        })
        .min()
        .unwrap_or(256) as u32
}

/// Descriptors of one problem, built once and kept with its algorithm.
#[derive(Debug)]
struct Plan {
    desc: MatmulDesc,
    /// cuBLASLt's A: our B, `k x n` column-major (transposed by the op).
    la: Layout,
    /// cuBLASLt's B: our A, `k x m` column-major.
    lb: Layout,
    /// C and D: our C, `n x m` column-major.
    lc: Layout,
    algo: sys::cublasLtMatmulAlgo_t,
}

/// Builds the descriptor and layouts of `key` for storage type `cuda`.
fn descriptors(
    key: &CacheKey,
    cuda: sys::cudaDataType,
    bias_ptr: u64,
) -> Result<(MatmulDesc, Layout, Layout, Layout)> {
    use sys::cublasLtMatmulDescAttributes_t as D;
    let s = key.shape;
    let compute = if s.dtype == GemmDType::Tf32 {
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
    } else {
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
    };
    let mut desc = MatmulDesc::new(compute, sys::cudaDataType::CUDA_R_32F)?;
    // Row-major C[m,n] = A[m,k]·B[n,k]ᵀ is column-major Cᵀ[n,m] = B·Aᵀ: cuBLASLt's A is
    // our B read transposed, its B is our A as stored.
    desc.set(D::CUBLASLT_MATMUL_DESC_TRANSA, &1i32)?; // CUBLAS_OP_T
    desc.set(D::CUBLASLT_MATMUL_DESC_TRANSB, &0i32)?; // CUBLAS_OP_N
    if s.bias {
        desc.set(
            D::CUBLASLT_MATMUL_DESC_EPILOGUE,
            &sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
        )?;
        desc.set(D::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &cuda)?;
        desc.set(D::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr)?;
        desc.set(D::CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &0i64)?;
    }
    let (m, n, k) = (s.m as u64, s.n as u64, s.k as u64);
    let mut la = Layout::new(cuda, k, n, as_i64("b", s.k)?)?;
    let mut lb = Layout::new(cuda, k, m, as_i64("a", s.k)?)?;
    let mut lc = Layout::new(cuda, n, m, as_i64("c", s.n)?)?;
    if s.batch > 1 {
        let count = i32::try_from(s.batch).map_err(|_| Error::TooLarge {
            arg: "a",
            value: s.batch,
            limit: i32::MAX as usize,
        })?;
        let stride_b = if s.shared_b { 0 } else { mul("b", s.n, s.k)? };
        la.set_batch(count, stride_b)?;
        lb.set_batch(count, mul("a", s.m, s.k)?)?;
        lc.set_batch(count, mul("c", s.m, s.n)?)?;
    }
    Ok((desc, la, lb, lc))
}

/// Up to `count` algorithms from cuBLASLt's heuristic, best first.
pub(crate) fn heuristic(
    handle: &Handle,
    desc: &MatmulDesc,
    la: &Layout,
    lb: &Layout,
    lc: &Layout,
    align: u32,
    count: usize,
) -> Result<Vec<sys::cublasLtMatmulHeuristicResult_t>> {
    use sys::cublasLtMatmulPreferenceAttributes_t as P;
    let mut pref = Preference::new()?;
    pref.set(
        P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
        &(WORKSPACE_BYTES as u64),
    )?;
    for a in [
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
    ] {
        pref.set(a, &align)?;
    }
    let count = count.clamp(1, 64);
    let mut out: Vec<sys::cublasLtMatmulHeuristicResult_t> = Vec::with_capacity(count);
    let mut returned: i32 = 0;
    // SAFETY: every descriptor is live; `out` has room for `count` results and cuBLASLt
    // writes at most `count` of them, reporting how many in `returned`.
    let st = unsafe {
        sys::cublasLtMatmulAlgoGetHeuristic(
            handle.0,
            desc.0,
            la.0,
            lb.0,
            lc.0,
            lc.0,
            pref.0,
            count as i32,
            out.as_mut_ptr(),
            &mut returned,
        )
    };
    check("cublasLtMatmulAlgoGetHeuristic", st)?;
    let returned = (returned.max(0) as usize).min(count);
    // SAFETY: cuBLASLt initialised the first `returned` elements.
    unsafe { out.set_len(returned) };
    out.retain(|r| {
        r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS && r.workspaceSize <= WORKSPACE_BYTES
    });
    Ok(out)
}

/// Whether `algo` is usable for these descriptors (`cublasLtMatmulAlgoCheck`), and the
/// workspace it needs.
fn algo_check(
    handle: &Handle,
    desc: &MatmulDesc,
    la: &Layout,
    lb: &Layout,
    lc: &Layout,
    algo: &sys::cublasLtMatmulAlgo_t,
) -> std::result::Result<usize, String> {
    let mut res = MaybeUninit::<sys::cublasLtMatmulHeuristicResult_t>::uninit();
    // SAFETY: all descriptors are live; `res` is written on success.
    let st = unsafe {
        sys::cublasLtMatmulAlgoCheck(
            handle.0,
            desc.0,
            la.0,
            lb.0,
            lc.0,
            lc.0,
            algo,
            res.as_mut_ptr(),
        )
    };
    if st != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Err(status_name(st));
    }
    // SAFETY: initialised by the successful call above.
    let res = unsafe { res.assume_init() };
    if res.state != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Err(status_name(res.state));
    }
    if res.workspaceSize > WORKSPACE_BYTES {
        return Err(format!(
            "needs {} bytes of workspace, the handle has {WORKSPACE_BYTES}",
            res.workspaceSize
        ));
    }
    Ok(res.workspaceSize)
}

/// Raw pointers of one call.
#[derive(Clone, Copy)]
struct Ptrs {
    a: u64,
    b: u64,
    bias: u64,
    c: u64,
}

/// A cuBLASLt handle with its workspace and algorithm cache: row-major GEMMs on one stream.
///
/// Created on a [`Gpu`]'s stream with [`Blas::new`]; every product is queued on that stream
/// and returns without waiting. The handle owns a 32 MiB workspace ([`WORKSPACE_BYTES`],
/// allocated once) and, per problem (sizes, batch, dtype, bias, pointer alignment), the
/// cuBLASLt descriptors and chosen algorithm, so a repeated shape costs one
/// `cublasLtMatmul` call. Algorithms come from cuBLASLt's heuristic by default, from
/// [`autotune`](Self::autotune) when run, or from a file ([`load_algo_cache`](Self::load_algo_cache)).
///
/// ```no_run
/// use fl_blas::{Blas, GemmParams};
/// use fl_kernels::{f16, DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let mut blas = Blas::new(&gpu)?;
/// // y[4, 1024] = x[4, 512] · w[1024, 512]ᵀ + b[1024]   (an nn.Linear)
/// let x = DeviceTensor::<f16>::filled(s, &[4, 512], f16::from_f32(0.5))?;
/// let w = DeviceTensor::<f16>::filled(s, &[1024, 512], f16::from_f32(0.25))?;
/// let b = DeviceTensor::<f16>::filled(s, &[1024], f16::from_f32(1.0))?;
/// let mut y = DeviceTensor::<f16>::zeros(s, &[4, 1024])?;
/// blas.gemm(&x, &w, Some(&b), &mut y, GemmParams::default())?;
/// assert!(y.to_host(s)?.iter().all(|v| v.to_f32() == 65.0));
/// # Ok::<(), fl_blas::Error>(())
/// ```
pub struct Blas {
    plans: HashMap<CacheKey, Plan>,
    cache: AlgoCache,
    /// Entries read from a file that have not yet passed `cublasLtMatmulAlgoCheck`.
    unchecked: HashSet<CacheKey>,
    allow_tf32: bool,
    /// INT8 (IMMA) plans of [`gemm_i8`](Self::gemm_i8), per shape (int8.rs).
    pub(crate) i8_plans: crate::int8::I8Plans,
    pub(crate) workspace: CudaSlice<u8>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) gpu: Gpu,
    // Declared last: dropped after the plans that were used with it.
    pub(crate) handle: Handle,
}

// SAFETY: a cuBLASLt handle and its descriptors may be used from any thread as long as
// calls do not overlap; every method that uses them takes `&mut self` or owns them.
unsafe impl Send for Blas {}

impl std::fmt::Debug for Blas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Blas")
            .field("gpu", &self.cache.gpu)
            .field("cublaslt_version", &self.cache.cublaslt_version)
            .field("allow_tf32", &self.allow_tf32)
            .field("algorithms", &self.cache.entries.len())
            .finish()
    }
}

impl Blas {
    /// Creates a cuBLASLt handle for `gpu`, queuing work on `gpu.stream()`, and allocates
    /// its 32 MiB workspace.
    ///
    /// Errors: [`Error::NoCublasLt`] when `libcublasLt` cannot be loaded; cuBLASLt and
    /// allocation errors.
    pub fn new(gpu: &Gpu) -> Result<Self> {
        // SAFETY: only tries to dlopen the library; calls no cuBLASLt function.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::NoCublasLt);
        }
        gpu.context().bind_to_thread()?;
        let stream = gpu.stream().clone();
        let workspace = stream.alloc_zeros::<u8>(WORKSPACE_BYTES)?;
        let handle = Handle::new()?;
        // SAFETY: a plain query with no arguments.
        let version = unsafe { sys::cublasLtGetVersion() };
        Ok(Blas {
            plans: HashMap::new(),
            cache: AlgoCache::new(gpu.name()?, version),
            unchecked: HashSet::new(),
            allow_tf32: false,
            i8_plans: Default::default(),
            workspace,
            stream,
            gpu: gpu.clone(),
            handle,
        })
    }

    /// The stream products are queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// `cublasLtGetVersion()` of the loaded library (e.g. 130000 for 13.0.0).
    pub fn cublaslt_version(&self) -> usize {
        self.cache.cublaslt_version
    }

    /// Lets f32 products use TF32 tensor cores (`CUBLAS_COMPUTE_32F_FAST_TF32`: inputs
    /// rounded to 10 mantissa bits, about 1e-3 relative error). Off by default.
    pub fn set_allow_tf32(&mut self, allow: bool) {
        self.allow_tf32 = allow;
    }

    /// Whether f32 products may use TF32.
    pub fn allow_tf32(&self) -> bool {
        self.allow_tf32
    }

    /// The algorithms chosen so far (heuristic, autotuned or loaded).
    pub fn algo_cache(&self) -> &AlgoCache {
        &self.cache
    }

    /// `C = alpha · A·Bᵀ + bias + beta · C`, row-major, on the handle's stream.
    ///
    /// Shapes (B is an `nn.Linear` weight `[out_features, in_features]`):
    /// - `a`: `[m, k]`, or `[batch, m, k]` for a strided batch;
    /// - `b`: `[n, k]`, or `[batch, n, k]`; with a batched `a`, a `[n, k]` `b` is shared by
    ///   every batch entry (batch stride 0);
    /// - `bias`: `[n]`, added to every row (cuBLASLt's `EPILOGUE_BIAS`; not scaled by
    ///   alpha);
    /// - `c`: `[m, n]` or `[batch, m, n]`, the output; read only when `beta != 0`.
    ///
    /// Dtypes: `f32`, `f16`, `bf16` for every tensor, accumulated in f32 (f32 may use TF32,
    /// see [`set_allow_tf32`](Self::set_allow_tf32)). `m`, `n` or `batch` = 0 is a no-op;
    /// `k` = 0 is refused. The first call for a shape picks an algorithm (heuristic, or a
    /// cached one re-checked with cuBLASLt) and builds its descriptors; later calls reuse
    /// them.
    ///
    /// Errors: [`Error::Shape`] naming `a`, `b`, `c` or `bias`; [`Error::InvalidArgument`]
    /// for `k` = 0; [`Error::TooLarge`] for sizes past cuBLASLt's index types;
    /// [`Error::NoAlgorithm`] / [`Error::Cublas`] from the library.
    ///
    /// ```no_run
    /// # use fl_blas::{Blas, GemmParams};
    /// # use fl_kernels::{DeviceTensor, Gpu};
    /// # let gpu = Gpu::new(0)?; let s = gpu.stream(); let mut blas = Blas::new(&gpu)?;
    /// // 8 heads: scores[8, 16, 16] = q[8, 16, 64] · k[8, 16, 64]ᵀ / 8
    /// let q = DeviceTensor::<f32>::filled(s, &[8, 16, 64], 1.0)?;
    /// let k = DeviceTensor::<f32>::filled(s, &[8, 16, 64], 1.0)?;
    /// let mut scores = DeviceTensor::<f32>::zeros(s, &[8, 16, 16])?;
    /// blas.gemm(&q, &k, None, &mut scores, GemmParams { alpha: 0.125, beta: 0.0 })?;
    /// # Ok::<(), fl_blas::Error>(())
    /// ```
    pub fn gemm<T: GemmType>(
        &mut self,
        a: &DeviceTensor<T>,
        b: &DeviceTensor<T>,
        bias: Option<&DeviceTensor<T>>,
        c: &mut DeviceTensor<T>,
        params: GemmParams,
    ) -> Result<()> {
        let d = gemm_dims(a.shape(), b.shape(), bias.map(|t| t.shape()), c.shape())?;
        if d.m == 0 || d.n == 0 || d.batch == 0 {
            return Ok(());
        }
        if d.k == 0 {
            return Err(Error::invalid(
                "a",
                "k = 0 (an empty reduction) is not supported",
            ));
        }
        if !params.alpha.is_finite() || !params.beta.is_finite() {
            return Err(Error::invalid(
                "params",
                format!(
                    "alpha = {}, beta = {} must be finite",
                    params.alpha, params.beta
                ),
            ));
        }
        self.gpu.context().bind_to_thread()?;
        let stream = self.stream.clone();
        let (pa, _ga) = a.as_slice().device_ptr(&stream);
        let (pb, _gb) = b.as_slice().device_ptr(&stream);
        let bias_guard = bias.map(|t| t.as_slice().device_ptr(&stream));
        let pbias = bias_guard.as_ref().map_or(0, |g| g.0);
        let (pc, _gc) = c.as_slice_mut().device_ptr_mut(&stream);
        let ptrs = Ptrs {
            a: pa,
            b: pb,
            bias: pbias,
            c: pc,
        };
        let key = self.key::<T>(&d, bias.is_some(), &ptrs);
        self.ensure_plan::<T>(&key, ptrs.bias)?;
        self.run_plan(&key, &ptrs, params)
    }

    /// [`gemm`](Self::gemm) with `alpha` = 1, `beta` = 0: `y = x·wᵀ (+ bias)`, PyTorch's
    /// `nn.functional.linear`.
    pub fn linear<T: GemmType>(
        &mut self,
        x: &DeviceTensor<T>,
        w: &DeviceTensor<T>,
        bias: Option<&DeviceTensor<T>>,
        y: &mut DeviceTensor<T>,
    ) -> Result<()> {
        self.gemm(x, w, bias, y, GemmParams::default())
    }

    fn key<T: GemmType>(&self, d: &Dims, bias: bool, p: &Ptrs) -> CacheKey {
        let dtype = if T::DTYPE == GemmDType::F32 && self.allow_tf32 {
            GemmDType::Tf32
        } else {
            T::DTYPE
        };
        let mut ptrs = vec![p.a, p.b, p.c];
        if bias {
            ptrs.push(p.bias);
        }
        CacheKey {
            shape: GemmShape {
                m: d.m,
                n: d.n,
                k: d.k,
                batch: d.batch,
                dtype,
                bias,
                shared_b: d.shared_b,
            },
            align: alignment(&ptrs),
        }
    }

    /// Builds the plan of `key` unless it exists: a cached algorithm if one passes
    /// `cublasLtMatmulAlgoCheck`, else the heuristic's first choice.
    fn ensure_plan<T: GemmType>(&mut self, key: &CacheKey, bias_ptr: u64) -> Result<()> {
        if self.plans.contains_key(key) {
            return Ok(());
        }
        let (desc, la, lb, lc) = descriptors(key, T::CUDA, bias_ptr)?;
        let mut algo = None;
        if let Some(cached) = self.cache.entries.get(key).copied() {
            let candidate = sys::cublasLtMatmulAlgo_t { data: cached.words };
            if self.unchecked.contains(key) {
                match algo_check(&self.handle, &desc, &la, &lb, &lc, &candidate) {
                    Ok(_) => {
                        self.unchecked.remove(key);
                        algo = Some(candidate);
                    }
                    Err(why) => {
                        eprintln!(
                            "fl-blas: cached algorithm for {} refused by cublasLtMatmulAlgoCheck ({why}); using the heuristic",
                            key.shape
                        );
                        self.unchecked.remove(key);
                        self.cache.entries.remove(key);
                    }
                }
            } else {
                algo = Some(candidate);
            }
        }
        let algo = match algo {
            Some(a) => a,
            None => {
                let found = heuristic(&self.handle, &desc, &la, &lb, &lc, key.align, 1)?;
                let first = found
                    .first()
                    .ok_or_else(|| Error::NoAlgorithm(format!("{}", key.shape)))?;
                self.cache.entries.insert(
                    *key,
                    CachedAlgo {
                        words: first.algo.data,
                        workspace: first.workspaceSize,
                        time_ms: None,
                    },
                );
                first.algo
            }
        };
        self.plans.insert(
            *key,
            Plan {
                desc,
                la,
                lb,
                lc,
                algo,
            },
        );
        Ok(())
    }

    fn run_plan(&mut self, key: &CacheKey, p: &Ptrs, params: GemmParams) -> Result<()> {
        let plan = self
            .plans
            .get_mut(key)
            .ok_or_else(|| Error::NoAlgorithm(format!("{}", key.shape)))?;
        let algo = plan.algo;
        matmul(
            &self.handle,
            plan,
            &algo,
            p,
            params,
            &mut self.workspace,
            &self.stream,
        )
    }

    /// Times up to `max_candidates` of cuBLASLt's heuristic candidates for each shape
    /// (CUDA events, 2 warm-up and 10 timed calls each, on scratch tensors of the shape)
    /// and keeps the fastest in the cache, for every later [`gemm`](Self::gemm) of that
    /// shape on 256-byte-aligned tensors (as allocated). Waits for the device.
    ///
    /// `GemmDType::Tf32` shapes are used by f32 calls when
    /// [`set_allow_tf32`](Self::set_allow_tf32) is on.
    ///
    /// Errors: [`Error::InvalidArgument`] for a zero size in a shape or
    /// `max_candidates` = 0; [`Error::NoAlgorithm`] when no candidate runs; allocation and
    /// cuBLASLt errors.
    pub fn autotune(
        &mut self,
        shapes: &[GemmShape],
        max_candidates: usize,
    ) -> Result<Vec<AutotuneResult>> {
        if max_candidates == 0 {
            return Err(Error::invalid("max_candidates", "must be at least 1"));
        }
        self.gpu.context().bind_to_thread()?;
        let mut out = Vec::with_capacity(shapes.len());
        for s in shapes {
            if s.m == 0 || s.n == 0 || s.k == 0 || s.batch == 0 {
                return Err(Error::invalid(
                    "shapes",
                    format!("{s}: every size must be at least 1"),
                ));
            }
            let r = match s.dtype {
                GemmDType::F32 | GemmDType::Tf32 => self.autotune_one::<f32>(s, max_candidates)?,
                GemmDType::F16 => self.autotune_one::<fl_kernels::f16>(s, max_candidates)?,
                GemmDType::Bf16 => self.autotune_one::<fl_kernels::bf16>(s, max_candidates)?,
            };
            out.push(r);
        }
        Ok(out)
    }

    fn autotune_one<T: GemmType>(
        &mut self,
        s: &GemmShape,
        n_cand: usize,
    ) -> Result<AutotuneResult> {
        let stream = self.stream.clone();
        let shared = s.shared_b && s.batch > 1;
        let shape = GemmShape {
            shared_b: shared,
            ..*s
        };
        let (a_shape, b_shape, c_shape) = if s.batch > 1 {
            (
                vec![s.batch, s.m, s.k],
                if shared {
                    vec![s.n, s.k]
                } else {
                    vec![s.batch, s.n, s.k]
                },
                vec![s.batch, s.m, s.n],
            )
        } else {
            (vec![s.m, s.k], vec![s.n, s.k], vec![s.m, s.n])
        };
        let a = DeviceTensor::<T>::filled(&stream, &a_shape, T::from_f32(0.01))?;
        let b = DeviceTensor::<T>::filled(&stream, &b_shape, T::from_f32(0.02))?;
        let bias = DeviceTensor::<T>::filled(&stream, &[s.n], T::from_f32(0.5))?;
        let mut c = DeviceTensor::<T>::zeros(&stream, &c_shape)?;
        let (pa, _ga) = a.as_slice().device_ptr(&stream);
        let (pb, _gb) = b.as_slice().device_ptr(&stream);
        let (pbias, _gbias) = bias.as_slice().device_ptr(&stream);
        let (pc, _gc) = c.as_slice_mut().device_ptr_mut(&stream);
        let ptrs = Ptrs {
            a: pa,
            b: pb,
            bias: if s.bias { pbias } else { 0 },
            c: pc,
        };
        let mut aligned = vec![pa, pb, pc];
        if s.bias {
            aligned.push(pbias);
        }
        let key = CacheKey {
            shape,
            align: alignment(&aligned),
        };
        let (desc, la, lb, lc) = descriptors(&key, T::CUDA, ptrs.bias)?;
        let found = heuristic(&self.handle, &desc, &la, &lb, &lc, key.align, n_cand)?;
        let mut plan = Plan {
            desc,
            la,
            lb,
            lc,
            algo: sys::cublasLtMatmulAlgo_t { data: [0; 8] },
        };
        let params = GemmParams::default();
        let mut best: Option<(usize, f64)> = None;
        let mut heuristic_ms = f64::NAN;
        let mut ran = 0;
        for (i, cand) in found.iter().enumerate() {
            let run = |plan: &mut Plan, ws: &mut CudaSlice<u8>| {
                matmul(&self.handle, plan, &cand.algo, &ptrs, params, ws, &stream)
            };
            // Warm-up; a candidate that cannot launch is skipped.
            if run(&mut plan, &mut self.workspace)
                .and_then(|_| run(&mut plan, &mut self.workspace))
                .is_err()
            {
                continue;
            }
            let start = stream.record_event(Some(CU_EVENT_DEFAULT))?;
            let mut ok = true;
            for _ in 0..10 {
                if run(&mut plan, &mut self.workspace).is_err() {
                    ok = false;
                    break;
                }
            }
            let end = stream.record_event(Some(CU_EVENT_DEFAULT))?;
            end.synchronize()?;
            if !ok {
                continue;
            }
            let ms = start.elapsed_ms(&end)? as f64 / 10.0;
            ran += 1;
            if i == 0 {
                heuristic_ms = ms;
            }
            if best.is_none_or(|(_, t)| ms < t) {
                best = Some((i, ms));
            }
        }
        let (best_index, best_ms) =
            best.ok_or_else(|| Error::NoAlgorithm(format!("{shape} (no candidate ran)")))?;
        let chosen = &found[best_index];
        plan.algo = chosen.algo;
        self.cache.entries.insert(
            key,
            CachedAlgo {
                words: chosen.algo.data,
                workspace: chosen.workspaceSize,
                time_ms: Some(best_ms),
            },
        );
        self.unchecked.remove(&key);
        self.plans.insert(key, plan);
        Ok(AutotuneResult {
            shape,
            candidates: ran,
            heuristic_ms,
            best_ms,
            best_index,
        })
    }

    /// Writes the algorithm cache (every algorithm chosen so far) to `path` as JSON, keyed
    /// by this GPU's name and the cuBLASLt version (format: [`cache`](crate::cache)).
    ///
    /// Errors: [`Error::Io`] naming the path.
    pub fn save_algo_cache(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.cache.to_json()).map_err(|source| Error::Io {
            path: path.display().to_string(),
            source,
        })
    }

    /// Reads algorithms saved by [`save_algo_cache`](Self::save_algo_cache) and adds them
    /// to the cache (replacing entries of the same key). Returns the warnings, also printed
    /// to stderr: a missing, corrupt or stale file (other GPU or cuBLASLt version) is
    /// ignored; bad entries are skipped. Each loaded algorithm is re-checked with
    /// `cublasLtMatmulAlgoCheck` on its first use and replaced by the heuristic's choice if
    /// refused.
    ///
    /// Errors: [`Error::Io`] when the file exists but cannot be read.
    pub fn load_algo_cache(&mut self, path: impl AsRef<Path>) -> Result<Vec<String>> {
        let path = path.as_ref();
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let w = format!("{}: not found; no algorithm loaded", path.display());
                eprintln!("fl-blas: algorithm cache {w}");
                return Ok(vec![w]);
            }
            Err(source) => {
                return Err(Error::Io {
                    path: path.display().to_string(),
                    source,
                })
            }
        };
        let load = AlgoCache::from_json(&text, &self.cache.gpu, self.cache.cublaslt_version);
        for (key, algo) in load.cache.entries {
            self.plans.remove(&key);
            self.unchecked.insert(key);
            self.cache.entries.insert(key, algo);
        }
        let warnings: Vec<String> = load
            .warnings
            .into_iter()
            .map(|w| format!("{}: {w}", path.display()))
            .collect();
        for w in &warnings {
            eprintln!("fl-blas: algorithm cache {w}");
        }
        Ok(warnings)
    }
}

/// One `cublasLtMatmul` of `plan` with `algo`, D = C in place.
fn matmul(
    handle: &Handle,
    plan: &mut Plan,
    algo: &sys::cublasLtMatmulAlgo_t,
    p: &Ptrs,
    params: GemmParams,
    workspace: &mut CudaSlice<u8>,
    stream: &CudaStream,
) -> Result<()> {
    if p.bias != 0 {
        plan.desc.set(
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
            &p.bias,
        )?;
    }
    let (ws, _gw) = workspace.device_ptr_mut(stream);
    let alpha = params.alpha;
    let beta = params.beta;
    // SAFETY: the descriptors describe buffers the caller checked (shapes, strides and
    // dtype match the tensors whose pointers are in `p`, kept alive and tracked by the
    // caller's guards until this call has queued the work); C and D are the same buffer
    // with the same layout (allowed by cuBLASLt); alpha/beta are host f32 (the default
    // pointer mode, scale type f32); the workspace holds WORKSPACE_BYTES, at least what the
    // algorithm was checked to need.
    let st = unsafe {
        sys::cublasLtMatmul(
            handle.0,
            plan.desc.0,
            &alpha as *const f32 as *const c_void,
            p.b as *const c_void,
            plan.la.0,
            p.a as *const c_void,
            plan.lb.0,
            &beta as *const f32 as *const c_void,
            p.c as *const c_void,
            plan.lc.0,
            p.c as *mut c_void,
            plan.lc.0,
            algo,
            ws as *mut c_void,
            WORKSPACE_BYTES,
            stream.cu_stream() as sys::cudaStream_t,
        )
    };
    check("cublasLtMatmul", st)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dims_plain_batched_shared() {
        let d = gemm_dims(&[3, 5], &[7, 5], Some(&[7]), &[3, 7]).unwrap();
        assert_eq!((d.m, d.n, d.k, d.batch, d.shared_b), (3, 7, 5, 1, false));
        let d = gemm_dims(&[2, 3, 5], &[2, 7, 5], None, &[2, 3, 7]).unwrap();
        assert_eq!((d.m, d.n, d.k, d.batch, d.shared_b), (3, 7, 5, 2, false));
        let d = gemm_dims(&[2, 3, 5], &[7, 5], None, &[2, 3, 7]).unwrap();
        assert_eq!((d.m, d.n, d.k, d.batch, d.shared_b), (3, 7, 5, 2, true));
        // batch 1 with a shared B is a plain product
        let d = gemm_dims(&[1, 3, 5], &[7, 5], None, &[1, 3, 7]).unwrap();
        assert!(!d.shared_b);
    }

    fn arg_of(e: Error) -> &'static str {
        match e {
            Error::Shape { arg, .. } => arg,
            other => panic!("expected a shape error, got {other}"),
        }
    }

    #[test]
    fn dims_errors_name_the_argument() {
        assert_eq!(
            arg_of(gemm_dims(&[3], &[7, 5], None, &[3, 7]).unwrap_err()),
            "a"
        );
        assert_eq!(
            arg_of(gemm_dims(&[3, 5], &[7, 4], None, &[3, 7]).unwrap_err()),
            "b"
        );
        assert_eq!(
            arg_of(gemm_dims(&[3, 5], &[2, 7, 5], None, &[3, 7]).unwrap_err()),
            "b"
        );
        assert_eq!(
            arg_of(gemm_dims(&[2, 3, 5], &[3, 7, 5], None, &[2, 3, 7]).unwrap_err()),
            "b"
        );
        assert_eq!(
            arg_of(gemm_dims(&[3, 5], &[7, 5], None, &[7, 3]).unwrap_err()),
            "c"
        );
        assert_eq!(
            arg_of(gemm_dims(&[2, 3, 5], &[7, 5], None, &[3, 7]).unwrap_err()),
            "c"
        );
        assert_eq!(
            arg_of(gemm_dims(&[3, 5], &[7, 5], Some(&[3]), &[3, 7]).unwrap_err()),
            "bias"
        );
        assert_eq!(
            arg_of(gemm_dims(&[3, 5], &[7, 5], Some(&[1, 7]), &[3, 7]).unwrap_err()),
            "bias"
        );
    }

    #[test]
    fn alignment_is_the_smallest_power_of_two() {
        assert_eq!(alignment(&[0x1000, 0x2000]), 256);
        assert_eq!(alignment(&[0x1000, 0x1002]), 2);
        assert_eq!(alignment(&[0x1080, 0x1000]), 128);
        assert_eq!(alignment(&[0x1001]), 1);
    }
}
