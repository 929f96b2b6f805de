//! The algorithm cache: which cuBLASLt algorithm to use for each GEMM shape, and its file
//! format.
//!
//! This module is plain Rust (no CUDA call), so the file handling is tested without a GPU.
//! [`Blas`](crate::Blas) keeps one [`AlgoCache`] per handle; a cache read from a file is
//! only accepted for the same GPU name and cuBLASLt version, and each algorithm read from a
//! file is re-checked with `cublasLtMatmulAlgoCheck` before its first use.
//!
//! File format (JSON, one object):
//!
//! ```json
//! { "format": "fl-blas-algo-cache", "version": 1,
//!   "gpu": "NVIDIA H100 80GB HBM3", "cublaslt_version": 130000,
//!   "entries": [ { "m": 2048, "n": 4096, "k": 4096, "batch": 1, "dtype": "f16",
//!                  "bias": false, "shared_b": false, "align": 256,
//!                  "algo": [1, 2, 3, 4, 5, 6, 7, 8], "workspace": 0, "time_ms": 0.41 } ] }
//! ```
//!
//! `algo` is the `cublasLtMatmulAlgo_t` as its 8 `u64` words.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::dtype::GemmDType;

/// The `format` field of a cache file.
pub const FORMAT: &str = "fl-blas-algo-cache";
/// The `version` field of the cache files this crate writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// One GEMM problem as the algorithm choice sees it (row-major, see
/// [`Blas::gemm`](crate::Blas::gemm)): `C[batch, m, n] = A[batch, m, k] · B[n, k]ᵀ`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GemmShape {
    /// Rows of A and C.
    pub m: usize,
    /// Rows of B (`out_features`), columns of C.
    pub n: usize,
    /// The reduced dimension (`in_features`).
    pub k: usize,
    /// Number of independent products (1 for a plain GEMM).
    pub batch: usize,
    /// Storage type and compute mode.
    pub dtype: GemmDType,
    /// Whether the bias epilogue is fused.
    pub bias: bool,
    /// Whether one B is shared by every batch entry (batch stride 0).
    pub shared_b: bool,
}

impl GemmShape {
    /// A plain (batch 1, no bias) shape.
    pub fn new(m: usize, n: usize, k: usize, dtype: GemmDType) -> Self {
        GemmShape {
            m,
            n,
            k,
            batch: 1,
            dtype,
            bias: false,
            shared_b: false,
        }
    }
}

impl std::fmt::Display for GemmShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} m={} n={} k={} batch={}{}{}",
            self.dtype,
            self.m,
            self.n,
            self.k,
            self.batch,
            if self.bias { " +bias" } else { "" },
            if self.shared_b { " shared-B" } else { "" }
        )
    }
}

/// A cache key: the shape plus the smallest alignment (bytes, a power of two, at most 256)
/// of the device pointers the algorithm was chosen for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CacheKey {
    /// The problem.
    pub shape: GemmShape,
    /// Pointer alignment in bytes.
    pub align: u32,
}

/// One chosen algorithm.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CachedAlgo {
    /// The opaque `cublasLtMatmulAlgo_t`, as its 8 words.
    pub words: [u64; 8],
    /// Workspace bytes the algorithm needs.
    pub workspace: usize,
    /// Measured time per call in milliseconds, when it was autotuned.
    pub time_ms: Option<f64>,
}

/// Algorithms for one GPU and one cuBLASLt version.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AlgoCache {
    /// Device name as the driver reports it.
    pub gpu: String,
    /// `cublasLtGetVersion()`.
    pub cublaslt_version: usize,
    /// The algorithms.
    pub entries: BTreeMap<CacheKey, CachedAlgo>,
}

/// What reading a cache file gave: the entries accepted and a warning for everything
/// ignored (stale file, corrupt file, bad entry).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CacheLoad {
    /// Accepted entries (empty when the whole file was refused).
    pub cache: AlgoCache,
    /// One line per thing ignored.
    pub warnings: Vec<String>,
}

#[derive(Serialize, Deserialize)]
struct FileV1 {
    format: String,
    version: u32,
    gpu: String,
    cublaslt_version: u64,
    entries: Vec<serde_json::Value>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryV1 {
    m: u64,
    n: u64,
    k: u64,
    batch: u64,
    dtype: String,
    bias: bool,
    shared_b: bool,
    align: u32,
    algo: Vec<u64>,
    workspace: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    time_ms: Option<f64>,
}

fn dim(name: &str, v: u64) -> Result<usize, String> {
    match usize::try_from(v) {
        Ok(d) if d >= 1 => Ok(d),
        _ => Err(format!("`{name}` = {v} is not a positive size")),
    }
}

impl EntryV1 {
    fn from_entry(key: &CacheKey, algo: &CachedAlgo) -> Self {
        EntryV1 {
            m: key.shape.m as u64,
            n: key.shape.n as u64,
            k: key.shape.k as u64,
            batch: key.shape.batch as u64,
            dtype: key.shape.dtype.as_str().to_string(),
            bias: key.shape.bias,
            shared_b: key.shape.shared_b,
            align: key.align,
            algo: algo.words.to_vec(),
            workspace: algo.workspace as u64,
            time_ms: algo.time_ms,
        }
    }

    fn into_entry(self) -> Result<(CacheKey, CachedAlgo), String> {
        let dtype = GemmDType::parse(&self.dtype)
            .ok_or_else(|| format!("unknown dtype {:?}", self.dtype))?;
        if !self.align.is_power_of_two() || self.align > 256 {
            return Err(format!(
                "`align` = {} is not a power of two up to 256",
                self.align
            ));
        }
        let words: [u64; 8] = self.algo.as_slice().try_into().map_err(|_| {
            format!(
                "`algo` has {} words, a cublasLtMatmulAlgo_t has 8",
                self.algo.len()
            )
        })?;
        let workspace = usize::try_from(self.workspace)
            .map_err(|_| format!("`workspace` = {} does not fit usize", self.workspace))?;
        if let Some(t) = self.time_ms {
            if !(t.is_finite() && t >= 0.0) {
                return Err(format!("`time_ms` = {t} is not a time"));
            }
        }
        let shape = GemmShape {
            m: dim("m", self.m)?,
            n: dim("n", self.n)?,
            k: dim("k", self.k)?,
            batch: dim("batch", self.batch)?,
            dtype,
            bias: self.bias,
            shared_b: self.shared_b,
        };
        Ok((
            CacheKey {
                shape,
                align: self.align,
            },
            CachedAlgo {
                words,
                workspace,
                time_ms: self.time_ms,
            },
        ))
    }
}

impl AlgoCache {
    /// An empty cache for `gpu` and `cublaslt_version`.
    pub fn new(gpu: impl Into<String>, cublaslt_version: usize) -> Self {
        AlgoCache {
            gpu: gpu.into(),
            cublaslt_version,
            entries: BTreeMap::new(),
        }
    }

    /// The cache as a JSON document (the format in the [module docs](self)).
    pub fn to_json(&self) -> String {
        let file = FileV1 {
            format: FORMAT.to_string(),
            version: FORMAT_VERSION,
            gpu: self.gpu.clone(),
            cublaslt_version: self.cublaslt_version as u64,
            entries: self
                .entries
                .iter()
                .filter_map(|(k, a)| serde_json::to_value(EntryV1::from_entry(k, a)).ok())
                .collect(),
        };
        // Serialising plain structs of numbers, strings and bools cannot fail.
        serde_json::to_string_pretty(&file).unwrap_or_default()
    }

    /// Parses a cache file written for `gpu` / `cublaslt_version`.
    ///
    /// Never fails: a file that is not JSON, has another format or version, or was written
    /// for another GPU or cuBLASLt version gives an empty cache and one warning; a bad entry
    /// (unknown dtype, zero size, an `algo` not of 8 words, ...) is skipped with a warning
    /// and the others are kept. The algorithms accepted are still only candidates: the
    /// caller re-checks each with the library before use.
    pub fn from_json(text: &str, gpu: &str, cublaslt_version: usize) -> CacheLoad {
        let mut out = CacheLoad {
            cache: AlgoCache::new(gpu, cublaslt_version),
            warnings: Vec::new(),
        };
        let file: FileV1 = match serde_json::from_str(text) {
            Ok(f) => f,
            Err(e) => {
                out.warnings
                    .push(format!("not an fl-blas algorithm cache ({e}); ignored"));
                return out;
            }
        };
        if file.format != FORMAT || file.version != FORMAT_VERSION {
            out.warnings.push(format!(
                "format {:?} version {} (expected {FORMAT:?} version {FORMAT_VERSION}); ignored",
                file.format, file.version
            ));
            return out;
        }
        if file.gpu != gpu {
            out.warnings.push(format!(
                "written for GPU {:?}, this is {gpu:?}; ignored (stale)",
                file.gpu
            ));
            return out;
        }
        if file.cublaslt_version != cublaslt_version as u64 {
            out.warnings.push(format!(
                "written for cuBLASLt {}, this is {cublaslt_version}; ignored (stale)",
                file.cublaslt_version
            ));
            return out;
        }
        for (i, v) in file.entries.into_iter().enumerate() {
            let parsed = serde_json::from_value::<EntryV1>(v)
                .map_err(|e| e.to_string())
                .and_then(EntryV1::into_entry);
            match parsed {
                Ok((key, algo)) => {
                    if out.cache.entries.insert(key, algo).is_some() {
                        out.warnings.push(format!(
                            "entry {i}: duplicate of an earlier entry for {}; the later one is kept",
                            key.shape
                        ));
                    }
                }
                Err(e) => out.warnings.push(format!("entry {i}: {e}; skipped")),
            }
        }
        out
    }
}
