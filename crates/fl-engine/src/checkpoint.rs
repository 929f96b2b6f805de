//! Safetensors checkpoints, memory-mapped.
//!
//! A model directory holds either one `model.safetensors` or shards listed by
//! `model.safetensors.index.json` (its `weight_map`: tensor name -> shard file name).
//! [`Checkpoint::open`] maps every file, parses every header and checks every tensor's byte
//! range against its file, so a truncated or malformed file fails at open, naming the file
//! and the tensor. Tensor bytes are then borrowed straight from the maps ([`Checkpoint::expect`])
//! and converted to a host float type only on demand ([`TensorRef::to_vec`]).
//!
//! [`llama_tensor_names`] lists the tensors a [`ModelConfig`] needs, with their shapes, and
//! [`Checkpoint::check_all`] validates a whole checkpoint against it before anything is
//! uploaded.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use fl_kernels::FloatDType;
use half::{bf16, f16};
use memmap2::Mmap;
use serde_json::Value;

use crate::config::ModelConfig;

pub use safetensors::Dtype;

/// File name of a single-file checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// File name of the shard index of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// Largest header we accept (the safetensors format's own limit).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The float storage types [`TensorRef::to_vec`] can convert from.
pub const FLOAT_DTYPES: &[Dtype] = &[Dtype::F32, Dtype::F16, Dtype::BF16];

/// What can go wrong opening or reading a checkpoint. Every variant names the file and,
/// where there is one, the tensor.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file could not be opened, sized or mapped.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The directory holds neither `model.safetensors` nor `model.safetensors.index.json`.
    #[error("no checkpoint in {dir}: expected {SINGLE_FILE} or {INDEX_FILE}")]
    NoCheckpoint {
        /// The directory.
        dir: PathBuf,
    },
    /// The shard index is not the expected JSON.
    #[error("bad shard index {path}: {detail}")]
    BadIndex {
        /// The index file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A shard named by the index does not exist.
    #[error("shard {shard} (holding tensor `{tensor}` per {index}) does not exist")]
    ShardMissing {
        /// The index file.
        index: PathBuf,
        /// The missing shard's path.
        shard: PathBuf,
        /// One tensor the index places in it.
        tensor: String,
    },
    /// The index places a tensor in a shard whose header does not list it.
    #[error("tensor `{tensor}` is not in shard {shard}, where {index} places it")]
    NotInShard {
        /// The index file.
        index: PathBuf,
        /// The shard.
        shard: PathBuf,
        /// The tensor.
        tensor: String,
    },
    /// A safetensors header is malformed (not JSON, bad entry, byte range not matching
    /// shape and dtype).
    #[error("bad safetensors header in {file}{}: {detail}", tensor_suffix(.tensor))]
    BadHeader {
        /// The file.
        file: PathBuf,
        /// The tensor whose entry is bad, if the fault is in one entry.
        tensor: Option<String>,
        /// What is wrong.
        detail: String,
    },
    /// The header promises more bytes than the file holds.
    #[error(
        "truncated safetensors file {file}{}: needs {needed} bytes, the file has {len}",
        tensor_suffix(.tensor)
    )]
    Truncated {
        /// The file.
        file: PathBuf,
        /// The first tensor that does not fit (`None`: the header itself does not fit).
        tensor: Option<String>,
        /// Bytes the file would need.
        needed: u64,
        /// Bytes it has.
        len: u64,
    },
    /// Two files hold a tensor of the same name.
    #[error("tensor `{tensor}` is in both {first} and {second}")]
    DuplicateTensor {
        /// The tensor.
        tensor: String,
        /// The file seen first.
        first: PathBuf,
        /// The other file.
        second: PathBuf,
    },
    /// A tensor the model needs is absent.
    #[error("tensor `{tensor}` is missing from the checkpoint in {location}")]
    MissingTensor {
        /// The tensor.
        tensor: String,
        /// The checkpoint's directory or file.
        location: PathBuf,
    },
    /// A tensor has another shape than the model needs.
    #[error("tensor `{tensor}` in {file} has shape {found:?}, expected {expected:?}")]
    Shape {
        /// The tensor.
        tensor: String,
        /// Its file.
        file: PathBuf,
        /// The shape needed.
        expected: Vec<usize>,
        /// The shape stored.
        found: Vec<usize>,
    },
    /// A tensor's dtype is not one the caller accepts, or cannot be converted.
    #[error(
        "tensor `{tensor}` in {file} has unsupported dtype {found:?} (accepted: {accepted:?})"
    )]
    UnsupportedDtype {
        /// The tensor.
        tensor: String,
        /// Its file.
        file: PathBuf,
        /// The dtype stored.
        found: Dtype,
        /// The dtypes accepted.
        accepted: Vec<Dtype>,
    },
    /// [`TensorRef::convert_into`] was given a buffer of the wrong length.
    #[error("tensor `{tensor}` has {expected} elements, output buffer holds {found}")]
    OutputLength {
        /// The tensor.
        tensor: String,
        /// Its element count.
        expected: usize,
        /// The buffer's length.
        found: usize,
    },
    /// [`Checkpoint::check_all`] found several problems (each listed).
    #[error("{} problems in checkpoint {location}:\n  {}", .problems.len(), list(.problems))]
    Many {
        /// The checkpoint's directory or file.
        location: PathBuf,
        /// Every problem found.
        problems: Vec<CheckpointError>,
    },
}

fn tensor_suffix(t: &Option<String>) -> String {
    t.as_ref()
        .map(|t| format!(" (tensor `{t}`)"))
        .unwrap_or_default()
}

fn list(problems: &[CheckpointError]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n  ")
}

/// Shorthand for results in this module.
pub type Result<T, E = CheckpointError> = std::result::Result<T, E>;

/// Where one tensor lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    /// The file holding it.
    pub file: PathBuf,
    /// Its storage type.
    pub dtype: Dtype,
    /// Its shape (row-major).
    pub shape: Vec<usize>,
    /// Its bytes, as offsets from the start of the file.
    pub range: Range<usize>,
    file_index: usize,
}

impl TensorEntry {
    /// Number of elements (product of the shape; 1 for a scalar).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

struct MappedFile {
    path: PathBuf,
    map: Mmap,
}

/// An opened checkpoint: the memory maps of its files and an index of its tensors.
pub struct Checkpoint {
    location: PathBuf,
    files: Vec<MappedFile>,
    tensors: BTreeMap<String, TensorEntry>,
}

impl fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpoint")
            .field("location", &self.location)
            .field(
                "files",
                &self.files.iter().map(|m| &m.path).collect::<Vec<_>>(),
            )
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// One tensor's bytes, borrowed from the memory map, with its dtype and shape.
#[derive(Debug, Clone, Copy)]
pub struct TensorRef<'a> {
    /// The tensor's name.
    pub name: &'a str,
    /// The file holding it.
    pub file: &'a Path,
    /// Its storage type.
    pub dtype: Dtype,
    /// Its shape.
    pub shape: &'a [usize],
    /// Its raw little-endian bytes (no alignment guaranteed).
    pub bytes: &'a [u8],
}

impl TensorRef<'_> {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The elements converted to `T` (`f32`, `f16` or `bf16`): widening is exact,
    /// narrowing rounds to nearest even.
    ///
    /// # Errors
    /// [`CheckpointError::UnsupportedDtype`] when the stored dtype is not F32/F16/BF16.
    pub fn to_vec<T: FloatDType>(&self) -> Result<Vec<T>> {
        let mut out = vec![T::default(); self.numel()];
        self.convert_into(&mut out)?;
        Ok(out)
    }

    /// As [`TensorRef::to_vec`], into a caller's buffer of exactly [`TensorRef::numel`]
    /// elements.
    ///
    /// # Errors
    /// [`CheckpointError::OutputLength`] for a buffer of another length;
    /// [`CheckpointError::UnsupportedDtype`] as for `to_vec`.
    pub fn convert_into<T: FloatDType>(&self, out: &mut [T]) -> Result<()> {
        if out.len() != self.numel() {
            return Err(CheckpointError::OutputLength {
                tensor: self.name.to_string(),
                expected: self.numel(),
                found: out.len(),
            });
        }
        match self.dtype {
            Dtype::F32 => {
                for (o, c) in out.iter_mut().zip(self.bytes.chunks_exact(4)) {
                    *o = T::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                }
            }
            Dtype::F16 => {
                for (o, c) in out.iter_mut().zip(self.bytes.chunks_exact(2)) {
                    *o = T::from_f32(f16::from_le_bytes([c[0], c[1]]).to_f32());
                }
            }
            Dtype::BF16 => {
                for (o, c) in out.iter_mut().zip(self.bytes.chunks_exact(2)) {
                    *o = T::from_f32(bf16::from_le_bytes([c[0], c[1]]).to_f32());
                }
            }
            other => {
                return Err(CheckpointError::UnsupportedDtype {
                    tensor: self.name.to_string(),
                    file: self.file.to_path_buf(),
                    found: other,
                    accepted: FLOAT_DTYPES.to_vec(),
                })
            }
        }
        Ok(())
    }
}

/// A tensor a model needs: its Hugging Face name and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedTensor {
    /// The name in the checkpoint (`model.layers.0.self_attn.q_proj.weight`, ...).
    pub name: String,
    /// The shape (`[out, in]` for a linear weight).
    pub shape: Vec<usize>,
}

/// Every tensor a LLaMA-family checkpoint for `cfg` must hold, in load order: the
/// embedding, per layer the attention projections (with biases per
/// [`ModelConfig::qkv_bias`] / [`ModelConfig::o_bias`]), the MLP projections (with biases per
/// [`ModelConfig::mlp_bias`]) and the two norms, then the final norm and `lm_head.weight`
/// (unless [`ModelConfig::tie_word_embeddings`]).
///
/// ```
/// let cfg = fl_engine::presets::preset("llama-2-7b")?;
/// let names = fl_engine::checkpoint::llama_tensor_names(&cfg);
/// assert_eq!(names.len(), 1 + 32 * 9 + 2);
/// assert_eq!(names[1].name, "model.layers.0.self_attn.q_proj.weight");
/// assert_eq!(names[1].shape, [4096, 4096]);
/// # Ok::<(), fl_engine::presets::UnknownPreset>(())
/// ```
pub fn llama_tensor_names(cfg: &ModelConfig) -> Vec<ExpectedTensor> {
    let h = cfg.hidden_size;
    let q = cfg.q_size();
    let kv = cfg.kv_size();
    let i = cfg.intermediate_size;
    let mut out = Vec::new();
    let mut push = |name: String, shape: Vec<usize>| out.push(ExpectedTensor { name, shape });
    push("model.embed_tokens.weight".into(), vec![cfg.vocab_size, h]);
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        for (proj, out_dim, in_dim, bias) in [
            ("q_proj", q, h, cfg.qkv_bias),
            ("k_proj", kv, h, cfg.qkv_bias),
            ("v_proj", kv, h, cfg.qkv_bias),
            ("o_proj", h, q, cfg.o_bias),
        ] {
            push(
                format!("{p}.self_attn.{proj}.weight"),
                vec![out_dim, in_dim],
            );
            if bias {
                push(format!("{p}.self_attn.{proj}.bias"), vec![out_dim]);
            }
        }
        for (proj, out_dim, in_dim) in [("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)]
        {
            push(format!("{p}.mlp.{proj}.weight"), vec![out_dim, in_dim]);
            if cfg.mlp_bias {
                push(format!("{p}.mlp.{proj}.bias"), vec![out_dim]);
            }
        }
        push(format!("{p}.input_layernorm.weight"), vec![h]);
        push(format!("{p}.post_attention_layernorm.weight"), vec![h]);
    }
    push("model.norm.weight".into(), vec![h]);
    if !cfg.tie_word_embeddings {
        push("lm_head.weight".into(), vec![cfg.vocab_size, h]);
    }
    out
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One header entry of a file: name, dtype, shape and absolute byte range.
struct RawEntry {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    range: Range<usize>,
}

/// Maps one safetensors file and parses and checks its header.
fn map_file(path: &Path) -> Result<(Mmap, Vec<RawEntry>)> {
    let file = File::open(path).map_err(io_err(path))?;
    let len = file.metadata().map_err(io_err(path))?.len();
    let truncated = |tensor: Option<&str>, needed: u64| CheckpointError::Truncated {
        file: path.to_path_buf(),
        tensor: tensor.map(str::to_string),
        needed,
        len,
    };
    let bad = |tensor: Option<&str>, detail: String| CheckpointError::BadHeader {
        file: path.to_path_buf(),
        tensor: tensor.map(str::to_string),
        detail,
    };
    if len < 8 {
        return Err(truncated(None, 8));
    }
    // SAFETY: the map is read-only and lives as long as the `Checkpoint`. Another process
    // truncating or rewriting the file while it is mapped is outside what we can guard
    // against (the same caveat as every mmap-based loader); we never write through it.
    let map = unsafe { Mmap::map(&file) }.map_err(io_err(path))?;
    let mut n_bytes = [0u8; 8];
    n_bytes.copy_from_slice(&map[..8]);
    let n = u64::from_le_bytes(n_bytes);
    if n > MAX_HEADER_BYTES {
        return Err(bad(
            None,
            format!("header length {n} exceeds the limit of {MAX_HEADER_BYTES} bytes"),
        ));
    }
    let header_end = 8 + n;
    if header_end > len {
        return Err(truncated(None, header_end));
    }
    // Fits in usize: header_end <= len, and the file is mapped.
    let header_end = header_end as usize;
    let header: BTreeMap<String, Value> = serde_json::from_slice(&map[8..header_end])
        .map_err(|e| bad(None, format!("header is not a JSON object: {e}")))?;
    let data_len = len - header_end as u64;
    let mut out = Vec::with_capacity(header.len());
    for (name, entry) in header {
        if name == "__metadata__" {
            continue;
        }
        let info: safetensors::tensor::TensorInfo = serde_json::from_value(entry)
            .map_err(|e| bad(Some(&name), format!("bad entry: {e}")))?;
        let (start, end) = info.data_offsets;
        if end < start {
            return Err(bad(
                Some(&name),
                format!("data_offsets [{start}, {end}] end before they start"),
            ));
        }
        let want_bytes = info
            .shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .and_then(|n| n.checked_mul(info.dtype.bitsize()))
            .map(|bits| bits.div_ceil(8));
        if want_bytes != Some(end - start) {
            return Err(bad(
                Some(&name),
                format!(
                    "data_offsets [{start}, {end}] hold {} bytes, shape {:?} of {:?} needs {}",
                    end - start,
                    info.shape,
                    info.dtype,
                    want_bytes.map_or_else(|| "an overflowing count".into(), |b| b.to_string())
                ),
            ));
        }
        if end as u64 > data_len {
            return Err(truncated(Some(&name), header_end as u64 + end as u64));
        }
        out.push(RawEntry {
            name,
            dtype: info.dtype,
            shape: info.shape,
            range: header_end + start..header_end + end,
        });
    }
    Ok((map, out))
}

fn is_plain_file_name(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && !s.contains('/')
        && !s.contains('\\')
        && Path::new(s).file_name().is_some_and(|f| f == s)
}

impl Checkpoint {
    /// Opens a checkpoint: a directory holding `model.safetensors.index.json` (sharded) or
    /// `model.safetensors`, or a path to a single `.safetensors` file. Maps every file and
    /// validates every header (see the module docs).
    ///
    /// # Errors
    /// [`CheckpointError::NoCheckpoint`], [`CheckpointError::Io`], [`CheckpointError::BadIndex`],
    /// [`CheckpointError::ShardMissing`], [`CheckpointError::NotInShard`],
    /// [`CheckpointError::BadHeader`], [`CheckpointError::Truncated`],
    /// [`CheckpointError::DuplicateTensor`], each naming the file (and tensor).
    ///
    /// # Example
    /// ```no_run
    /// use fl_engine::{config::ModelConfig, checkpoint::Checkpoint};
    /// let dir = "models/llama-2-7b";
    /// let cfg = ModelConfig::from_model_dir(dir)?;
    /// let ckpt = Checkpoint::open(dir)?;
    /// ckpt.check_all(&cfg)?;
    /// let w = ckpt.expect("model.norm.weight", &[cfg.hidden_size], fl_engine::checkpoint::FLOAT_DTYPES)?;
    /// let host: Vec<f32> = w.to_vec()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        if path.is_file() {
            return Self::open_files(path.to_path_buf(), &[path.to_path_buf()]);
        }
        let index = path.join(INDEX_FILE);
        if index.is_file() {
            return Self::open_sharded(path, &index);
        }
        let single = path.join(SINGLE_FILE);
        if single.is_file() {
            return Self::open_files(path.to_path_buf(), &[single]);
        }
        Err(CheckpointError::NoCheckpoint {
            dir: path.to_path_buf(),
        })
    }

    fn open_sharded(dir: &Path, index: &Path) -> Result<Self> {
        let bad = |detail: String| CheckpointError::BadIndex {
            path: index.to_path_buf(),
            detail,
        };
        let text = std::fs::read_to_string(index).map_err(io_err(index))?;
        let json: Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let map = json
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("no `weight_map` object".into()))?;
        // Shards in first-seen order of the weight map sorted by tensor name (whatever order
        // the file lists them in); each with one tensor to name.
        let mut entries: Vec<(&String, &Value)> = map.iter().collect();
        entries.sort_by(|a, b| a.0.cmp(b.0));
        let mut shard_names: Vec<&str> = Vec::new();
        let mut placed: Vec<(&str, &str)> = Vec::with_capacity(map.len());
        for (tensor, v) in entries {
            let shard = v.as_str().ok_or_else(|| {
                bad(format!(
                    "weight_map entry `{tensor}` is {v}, not a file name"
                ))
            })?;
            if !is_plain_file_name(shard) {
                return Err(bad(format!(
                    "weight_map entry `{tensor}` names `{shard}`, not a plain file name in the directory"
                )));
            }
            if !shard_names.contains(&shard) {
                shard_names.push(shard);
            }
            placed.push((tensor, shard));
        }
        if shard_names.is_empty() {
            return Err(bad("`weight_map` is empty".into()));
        }
        let mut files = Vec::with_capacity(shard_names.len());
        for shard in &shard_names {
            let p = dir.join(shard);
            if !p.is_file() {
                let tensor = placed
                    .iter()
                    .find(|(_, s)| s == shard)
                    .map_or("", |(t, _)| t);
                return Err(CheckpointError::ShardMissing {
                    index: index.to_path_buf(),
                    shard: p,
                    tensor: tensor.to_string(),
                });
            }
            files.push(p);
        }
        let ckpt = Self::open_files(dir.to_path_buf(), &files)?;
        for (tensor, shard) in placed {
            let in_shard = ckpt
                .tensors
                .get(tensor)
                .is_some_and(|e| e.file == dir.join(shard));
            if !in_shard {
                return Err(CheckpointError::NotInShard {
                    index: index.to_path_buf(),
                    shard: dir.join(shard),
                    tensor: tensor.to_string(),
                });
            }
        }
        Ok(ckpt)
    }

    fn open_files(location: PathBuf, paths: &[PathBuf]) -> Result<Self> {
        let mut files = Vec::with_capacity(paths.len());
        let mut tensors: BTreeMap<String, TensorEntry> = BTreeMap::new();
        for (file_index, path) in paths.iter().enumerate() {
            let (map, entries) = map_file(path)?;
            for RawEntry {
                name,
                dtype,
                shape,
                range,
            } in entries
            {
                if let Some(prev) = tensors.get(&name) {
                    return Err(CheckpointError::DuplicateTensor {
                        tensor: name,
                        first: prev.file.clone(),
                        second: path.clone(),
                    });
                }
                tensors.insert(
                    name,
                    TensorEntry {
                        file: path.clone(),
                        dtype,
                        shape,
                        range,
                        file_index,
                    },
                );
            }
            files.push(MappedFile {
                path: path.clone(),
                map,
            });
        }
        Ok(Checkpoint {
            location,
            files,
            tensors,
        })
    }

    /// The directory (or single file) this checkpoint was opened from.
    pub fn location(&self) -> &Path {
        &self.location
    }

    /// The files mapped, in open order.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|f| f.path.as_path())
    }

    /// Every tensor, sorted by name.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &TensorEntry)> {
        self.tensors.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether the checkpoint holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Where `name` lives, if present.
    pub fn entry(&self, name: &str) -> Option<&TensorEntry> {
        self.tensors.get(name)
    }

    /// The tensor `name`, whatever its shape and dtype.
    ///
    /// # Errors
    /// [`CheckpointError::MissingTensor`] naming the tensor and the checkpoint.
    pub fn tensor(&self, name: &str) -> Result<TensorRef<'_>> {
        let (key, e) =
            self.tensors
                .get_key_value(name)
                .ok_or_else(|| CheckpointError::MissingTensor {
                    tensor: name.to_string(),
                    location: self.location.clone(),
                })?;
        let bytes = self
            .files
            .get(e.file_index)
            .and_then(|f| f.map.get(e.range.clone()))
            // Unreachable: ranges were checked against the file at open.
            .ok_or_else(|| CheckpointError::Truncated {
                file: e.file.clone(),
                tensor: Some(name.to_string()),
                needed: e.range.end as u64,
                len: 0,
            })?;
        Ok(TensorRef {
            name: key,
            file: &e.file,
            dtype: e.dtype,
            shape: &e.shape,
            bytes,
        })
    }

    /// The tensor `name`, checked to have exactly `shape` and one of `dtypes`.
    ///
    /// # Errors
    /// [`CheckpointError::MissingTensor`], [`CheckpointError::Shape`] or
    /// [`CheckpointError::UnsupportedDtype`], naming the tensor (and its file).
    pub fn expect(&self, name: &str, shape: &[usize], dtypes: &[Dtype]) -> Result<TensorRef<'_>> {
        let t = self.tensor(name)?;
        if t.shape != shape {
            return Err(CheckpointError::Shape {
                tensor: name.to_string(),
                file: t.file.to_path_buf(),
                expected: shape.to_vec(),
                found: t.shape.to_vec(),
            });
        }
        if !dtypes.contains(&t.dtype) {
            return Err(CheckpointError::UnsupportedDtype {
                tensor: name.to_string(),
                file: t.file.to_path_buf(),
                found: t.dtype,
                accepted: dtypes.to_vec(),
            });
        }
        Ok(t)
    }

    /// Checks that every tensor of [`llama_tensor_names`] for `cfg` is present with its
    /// shape and a float dtype ([`FLOAT_DTYPES`]). Extra tensors (e.g. a `rotary_emb.inv_freq`
    /// buffer, or `lm_head.weight` in a tied model) are ignored. Reads headers only.
    ///
    /// # Errors
    /// The single problem found, or [`CheckpointError::Many`] listing all of them.
    pub fn check_all(&self, cfg: &ModelConfig) -> Result<CheckReport> {
        let mut report = CheckReport::default();
        let mut problems = Vec::new();
        for t in llama_tensor_names(cfg) {
            match self.expect(&t.name, &t.shape, FLOAT_DTYPES) {
                Ok(r) => {
                    report.tensors += 1;
                    report.bytes += r.bytes.len() as u64;
                    match report.dtypes.iter_mut().find(|(d, _)| *d == r.dtype) {
                        Some((_, n)) => *n += 1,
                        None => report.dtypes.push((r.dtype, 1)),
                    }
                }
                Err(e) => problems.push(e),
            }
        }
        match problems.len() {
            0 => Ok(report),
            1 => Err(problems.remove(0)),
            _ => Err(CheckpointError::Many {
                location: self.location.clone(),
                problems,
            }),
        }
    }
}

/// What [`Checkpoint::check_all`] found in a valid checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// Tensors the model uses.
    pub tensors: usize,
    /// Their stored bytes (what an upload moves before any conversion).
    pub bytes: u64,
    /// Each stored dtype with the number of tensors in it, in first-seen order.
    pub dtypes: Vec<(Dtype, usize)>,
}
