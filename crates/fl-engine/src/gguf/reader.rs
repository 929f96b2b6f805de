//! Reading GGUF files: [`GgufHeader`] parses one file's bytes, [`GgufFile`] maps a file (or
//! every part of a split model) and hands out tensor bytes without copying.
//!
//! Every count read from the file is checked against the bytes left before anything is
//! allocated from it, so a corrupt or hostile file costs at most a small multiple of its own
//! size in memory, and every failure is a [`GgufError`] naming the key or tensor.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::value::{Array, Value, ValueType};
use super::{GgmlType, GgufError, Result, DEFAULT_ALIGNMENT, MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS};

/// One tensor's entry in the tensor table.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// The GGUF name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is the innermost (contiguous) one.
    pub dims: Vec<u64>,
    /// The storage type.
    pub ggml_type: GgmlType,
    /// Byte offset in its file's data section (a multiple of the alignment).
    pub offset: u64,
    /// Bytes of data (whole blocks of `ggml_type`).
    pub n_bytes: u64,
    /// Which part of a split model holds it (0 for a single file).
    pub split: usize,
}

impl TensorInfo {
    /// The row-major shape: `dims` reversed (`[rows, cols]` for a matrix).
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }

    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Bytes of one row (`dims[0]` elements), the unit a row permutation moves.
    pub fn row_bytes(&self) -> u64 {
        let cols = self.dims.first().copied().unwrap_or(1);
        (cols / self.ggml_type.block_size()) * self.ggml_type.type_size()
    }
}

/// The parsed header of one GGUF file: version, metadata, tensor table and where the data
/// section starts. Parsing checks every tensor against the file length, so a
/// [`TensorInfo`] from here always addresses bytes inside the file.
#[derive(Debug, Clone)]
pub struct GgufHeader {
    /// 2 or 3.
    pub version: u32,
    /// `general.alignment` (default 32): the data section and every tensor offset are
    /// multiples of it.
    pub alignment: u64,
    /// Metadata in file order.
    pub metadata: Vec<(String, Value)>,
    /// Tensors in file order.
    pub tensors: Vec<TensorInfo>,
    /// Byte offset of the data section in the file.
    pub data_start: u64,
    /// Length of the file.
    pub file_len: u64,
}

/// Reads little-endian fields, naming the field in every error.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos as u64,
                need: n,
                len: self.buf.len() as u64,
            });
        }
        let n = n as usize; // <= remaining, so it fits
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N as u64, what)?);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count of items of at least `min_size` bytes each, checked against the bytes left.
    fn count(&mut self, min_size: u64, what: &dyn Fn() -> String) -> Result<usize> {
        let n = self.u64(what)?;
        let remaining = self.remaining();
        if n > remaining / min_size.max(1) {
            return Err(GgufError::TooMany {
                what: what(),
                count: n,
                remaining,
            });
        }
        Ok(n as usize) // <= remaining, so it fits
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let n = self.u64(what)?;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::Utf8 { what: what() })
    }

    /// `n` fixed-size elements decoded by `f`.
    fn fixed<T, const N: usize>(
        &mut self,
        n: usize,
        what: &dyn Fn() -> String,
        f: fn([u8; N]) -> T,
    ) -> Result<Vec<T>> {
        let bytes = self.take(n as u64 * N as u64, what)?;
        Ok(bytes
            .chunks_exact(N)
            .map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                f(a)
            })
            .collect())
    }

    fn value_type(&mut self, key: &str, what: &dyn Fn() -> String) -> Result<ValueType> {
        let id = self.u32(what)?;
        ValueType::from_id(id).ok_or_else(|| GgufError::BadValueType {
            key: key.to_string(),
            id,
        })
    }

    fn value(&mut self, ty: ValueType, key: &str, depth: usize) -> Result<Value> {
        let what = || format!("metadata `{key}`");
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(&what)?[0]),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(&what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(&what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(&what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(&what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(&what)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(&what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(&what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(&what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(&what)?)),
            ValueType::Bool => Value::Bool(self.array::<1>(&what)?[0] != 0),
            ValueType::String => Value::String(self.string(&what)?),
            ValueType::Array => Value::Array(self.array_value(key, depth + 1)?),
        })
    }

    fn array_value(&mut self, key: &str, depth: usize) -> Result<Array> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(GgufError::TooDeep {
                key: key.to_string(),
                max: MAX_ARRAY_DEPTH,
            });
        }
        let what = || format!("metadata `{key}` array");
        let ty = self.value_type(key, &what)?;
        let n = self.count(ty.min_size(), &what)?;
        Ok(match ty {
            ValueType::U8 => Array::U8(self.fixed(n, &what, |[b]: [u8; 1]| b)?),
            ValueType::I8 => Array::I8(self.fixed(n, &what, i8::from_le_bytes)?),
            ValueType::U16 => Array::U16(self.fixed(n, &what, u16::from_le_bytes)?),
            ValueType::I16 => Array::I16(self.fixed(n, &what, i16::from_le_bytes)?),
            ValueType::U32 => Array::U32(self.fixed(n, &what, u32::from_le_bytes)?),
            ValueType::I32 => Array::I32(self.fixed(n, &what, i32::from_le_bytes)?),
            ValueType::U64 => Array::U64(self.fixed(n, &what, u64::from_le_bytes)?),
            ValueType::I64 => Array::I64(self.fixed(n, &what, i64::from_le_bytes)?),
            ValueType::F32 => Array::F32(self.fixed(n, &what, f32::from_le_bytes)?),
            ValueType::F64 => Array::F64(self.fixed(n, &what, f64::from_le_bytes)?),
            ValueType::Bool => Array::Bool(self.fixed(n, &what, |[b]: [u8; 1]| b != 0)?),
            ValueType::String => {
                let mut v = Vec::with_capacity(n);
                for i in 0..n {
                    v.push(self.string(&|| format!("metadata `{key}` element {i}"))?);
                }
                Array::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.array_value(key, depth + 1)?);
                }
                Array::Array(v)
            }
        })
    }
}

fn align_up(x: u64, a: u64) -> Option<u64> {
    x.checked_add(a - 1).map(|y| y / a * a)
}

impl GgufHeader {
    /// Parses and checks the header of a file whose bytes are `bytes` (the whole file).
    ///
    /// # Errors
    /// [`GgufError`]: bad magic or version, truncation, counts the file cannot hold, unknown
    /// value or ggml types, duplicate keys or tensors, a bad `general.alignment`, shapes
    /// that are not whole blocks or overflow, tensors misaligned, overlapping or outside the
    /// data section.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let mut c = Cursor { buf: bytes, pos: 0 };
        let magic: [u8; 4] = c.array(&|| "magic".into())?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic {
                found: magic.to_vec(),
            });
        }
        let version = c.u32(&|| "version".into())?;
        if version != 2 && version != 3 {
            return Err(GgufError::BadVersion { found: version });
        }
        let n_tensors_raw = c.u64(&|| "tensor count".into())?;
        // A tensor entry is at least a name length, n_dims, type and offset.
        let min_tensor = 8 + 4 + 4 + 8;
        let n_kv = c.count(8 + 4 + 1, &|| "metadata count".into())?;
        if n_tensors_raw > c.remaining() / min_tensor {
            return Err(GgufError::TooMany {
                what: "tensor count".into(),
                count: n_tensors_raw,
                remaining: c.remaining(),
            });
        }
        let n_tensors = n_tensors_raw as usize;

        let mut metadata = Vec::with_capacity(n_kv);
        let mut seen = HashSet::with_capacity(n_kv);
        for i in 0..n_kv {
            let key = c.string(&|| format!("metadata key {i}"))?;
            let ty = c.value_type(&key, &|| format!("metadata `{key}` type"))?;
            let value = c.value(ty, &key, 0)?;
            if !seen.insert(key.clone()) {
                return Err(GgufError::DuplicateKey { key });
            }
            metadata.push((key, value));
        }
        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some((k, v)) => {
                let a = match v {
                    Value::U32(a) => u64::from(*a),
                    other => {
                        return Err(GgufError::WrongType {
                            key: k.clone(),
                            expected: "u32",
                            found: other.type_name(),
                        })
                    }
                };
                if !a.is_power_of_two() {
                    return Err(GgufError::Invalid {
                        key: k.clone(),
                        value: a.to_string(),
                        reason: "must be a power of two".into(),
                    });
                }
                a
            }
        };

        let mut tensors = Vec::with_capacity(n_tensors);
        let mut names = HashSet::with_capacity(n_tensors);
        for i in 0..n_tensors {
            let name = c.string(&|| format!("tensor {i} name"))?;
            let what = || format!("tensor `{name}`");
            let n_dims = c.u32(&what)?;
            if n_dims as usize > MAX_DIMS {
                return Err(GgufError::BadShape {
                    tensor: name,
                    reason: format!("{n_dims} dimensions (at most {MAX_DIMS})"),
                });
            }
            let dims = c.fixed(n_dims as usize, &what, u64::from_le_bytes)?;
            let id = c.u32(&what)?;
            let offset = c.u64(&what)?;
            let ggml_type = GgmlType::from_id(id).ok_or_else(|| GgufError::UnknownType {
                tensor: name.clone(),
                id,
            })?;
            let n_bytes = tensor_bytes(&name, &dims, ggml_type)?;
            if offset % alignment != 0 {
                return Err(GgufError::Misaligned {
                    tensor: name,
                    offset,
                    alignment,
                });
            }
            if !names.insert(name.clone()) {
                return Err(GgufError::DuplicateTensor { tensor: name });
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
                n_bytes,
                split: 0,
            });
        }

        let file_len = bytes.len() as u64;
        // With no tensors a file may end right after its header, without padding.
        let data_start = match align_up(c.pos as u64, alignment) {
            Some(d) if d <= file_len => d,
            _ if tensors.is_empty() => file_len,
            _ => {
                return Err(GgufError::Truncated {
                    what: "padding before the data section".into(),
                    offset: c.pos as u64,
                    need: alignment,
                    len: file_len,
                })
            }
        };
        let data_len = file_len - data_start;
        for t in &tensors {
            if t.offset.checked_add(t.n_bytes).is_none_or(|e| e > data_len) {
                return Err(GgufError::OutOfFile {
                    tensor: t.name.clone(),
                    offset: t.offset,
                    size: t.n_bytes,
                    data_len,
                });
            }
        }
        let mut by_offset: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
        by_offset.sort_by_key(|t| t.offset);
        for w in by_offset.windows(2) {
            if w[0].offset + w[0].n_bytes > w[1].offset {
                return Err(GgufError::Overlap {
                    tensor: w[1].name.clone(),
                    other: w[0].name.clone(),
                });
            }
        }
        Ok(GgufHeader {
            version,
            alignment,
            metadata,
            tensors,
            data_start,
            file_len,
        })
    }
}

/// Bytes of a tensor of `dims` and `ty`, checking the shape.
fn tensor_bytes(name: &str, dims: &[u64], ty: GgmlType) -> Result<u64> {
    let bad = |reason: String| GgufError::BadShape {
        tensor: name.to_string(),
        reason,
    };
    let mut n: u64 = 1;
    for &d in dims {
        n = n
            .checked_mul(d)
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| bad(format!("dims {dims:?}: element count overflows")))?;
    }
    let inner = dims.first().copied().unwrap_or(1);
    if inner % ty.block_size() != 0 {
        return Err(bad(format!(
            "innermost dim {inner} is not a multiple of the {} block size {}",
            ty,
            ty.block_size()
        )));
    }
    ty.bytes_for(n)
        .ok_or_else(|| bad(format!("dims {dims:?}: byte size overflows")))
}

/// Per-type totals of a file's tensors (`fl info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TypeStats {
    /// Tensors of the type.
    pub count: usize,
    /// Their elements.
    pub elements: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// One mapped file of a model.
#[derive(Debug)]
struct Part {
    path: PathBuf,
    map: Mmap,
    data_start: usize,
}

/// A GGUF model: one file, or every part of a split model (`model-00001-of-00003.gguf`),
/// memory-mapped, with the tensor tables merged. Metadata comes from the first part (llama.cpp's
/// splitter writes it there; the other parts carry only `split.*`).
#[derive(Debug)]
pub struct GgufFile {
    parts: Vec<Part>,
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

fn map_file(path: &Path) -> Result<(Mmap, GgufHeader)> {
    let io = |source| GgufError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    // SAFETY: the map is read-only and lives as long as the `GgufFile`. Another process
    // truncating or rewriting the file while it is mapped is outside what we can guard
    // against (the same caveat as every mmap-based loader); we never write through it.
    let map = unsafe { Mmap::map(&file) }.map_err(io)?;
    let header = GgufHeader::parse(&map).map_err(|e| GgufError::InFile {
        path: path.to_path_buf(),
        source: Box::new(e),
    })?;
    Ok((map, header))
}

/// `(prefix, count)` of a split file name `PREFIX-NNNNN-of-MMMMM.gguf`.
fn split_name(path: &Path) -> Option<(String, usize)> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    if no.len() != 5 || count.len() != 5 {
        return None;
    }
    no.parse::<usize>().ok()?;
    Some((prefix.to_string(), count.parse().ok()?))
}

/// The path of part `no` (0-based) of `count` next to `path`.
pub fn split_path(prefix: &Path, no: usize, count: usize) -> PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(format!("-{:05}-of-{:05}.gguf", no + 1, count));
    PathBuf::from(s)
}

fn meta_u64(meta: &[(String, Value)], key: &str) -> Result<Option<u64>> {
    match meta.iter().find(|(k, _)| k == key) {
        None => Ok(None),
        Some((_, v)) => v.as_u64().map(Some).ok_or_else(|| GgufError::WrongType {
            key: key.to_string(),
            expected: "a non-negative integer",
            found: v.type_name(),
        }),
    }
}

impl GgufFile {
    /// Opens a GGUF file. When its `split.count` is above 1, `path` must be named
    /// `PREFIX-NNNNN-of-MMMMM.gguf` and every part is opened from the same directory and
    /// merged (any part may be named).
    ///
    /// # Errors
    /// [`GgufError::Io`] for a file that cannot be read; [`GgufError::InFile`] wrapping a
    /// parse error (see [`GgufHeader::parse`]); [`GgufError::Split`] for parts that are
    /// missing or disagree; [`GgufError::DuplicateTensor`] for a tensor in two parts.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let (map, header) = map_file(path)?;
        let count = meta_u64(&header.metadata, "split.count")?.unwrap_or(1);
        if count <= 1 {
            return Self::from_parts(vec![(path.to_path_buf(), map, header)]);
        }
        let split_err = |reason: String| GgufError::Split {
            path: path.to_path_buf(),
            reason,
        };
        let (prefix, name_count) = split_name(path).ok_or_else(|| {
            split_err(format!(
                "split.count is {count} but the name is not PREFIX-NNNNN-of-{count:05}.gguf"
            ))
        })?;
        if name_count as u64 != count {
            return Err(split_err(format!(
                "split.count is {count} but the name says {name_count} parts"
            )));
        }
        let count = name_count;
        let prefix = path.with_file_name(prefix);
        let mut given = Some((map, header));
        let mut parts = Vec::with_capacity(count);
        for no in 0..count {
            let p = split_path(&prefix, no, count);
            let (map, header) = match given.take() {
                Some(g) if p == path => g,
                g => {
                    given = g;
                    map_file(&p)?
                }
            };
            let got_no = meta_u64(&header.metadata, "split.no")?;
            let got_count = meta_u64(&header.metadata, "split.count")?;
            if got_no != Some(no as u64) || got_count != Some(count as u64) {
                return Err(split_err(format!(
                    "{} has split.no {got_no:?} and split.count {got_count:?}, expected {no} and {count}",
                    p.display()
                )));
            }
            parts.push((p, map, header));
        }
        let f = Self::from_parts(parts)?;
        if let Some(total) = meta_u64(&f.metadata, "split.tensors.count")? {
            if total != f.tensors.len() as u64 {
                return Err(split_err(format!(
                    "split.tensors.count is {total} but the parts hold {} tensors",
                    f.tensors.len()
                )));
            }
        }
        Ok(f)
    }

    fn from_parts(parts: Vec<(PathBuf, Mmap, GgufHeader)>) -> Result<Self> {
        let mut out = GgufFile {
            parts: Vec::with_capacity(parts.len()),
            version: 0,
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            meta_index: HashMap::new(),
            tensors: Vec::new(),
            tensor_index: HashMap::new(),
        };
        for (i, (path, map, header)) in parts.into_iter().enumerate() {
            if i == 0 {
                out.version = header.version;
                out.alignment = header.alignment;
                out.metadata = header.metadata;
                out.meta_index = out
                    .metadata
                    .iter()
                    .enumerate()
                    .map(|(j, (k, _))| (k.clone(), j))
                    .collect();
            }
            for mut t in header.tensors {
                t.split = i;
                if out.tensor_index.contains_key(&t.name) {
                    return Err(GgufError::DuplicateTensor { tensor: t.name });
                }
                out.tensor_index.insert(t.name.clone(), out.tensors.len());
                out.tensors.push(t);
            }
            out.parts.push(Part {
                path,
                map,
                data_start: header.data_start as usize, // <= file length
            });
        }
        Ok(out)
    }

    /// GGUF version of the (first) file.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Data alignment of the (first) file.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Paths of the files, in split order.
    pub fn paths(&self) -> Vec<&Path> {
        self.parts.iter().map(|p| p.path.as_path()).collect()
    }

    /// All metadata in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// All tensors: those of the first part in file order, then the next part's.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`, if present.
    pub fn find_tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor named `name`.
    ///
    /// # Errors
    /// [`GgufError::MissingTensor`] naming it.
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.find_tensor(name)
            .ok_or_else(|| GgufError::MissingTensor {
                tensor: name.to_string(),
            })
    }

    /// The bytes of a tensor, borrowed from the map (no copy). The slice starts at an
    /// `alignment`-aligned file offset, but its blocks are only as aligned as the block size
    /// (18-byte Q4_0 blocks: 2 bytes), so read the fields with unaligned loads.
    ///
    /// # Errors
    /// [`GgufError::MissingTensor`] for a `TensorInfo` that is not from this file.
    pub fn tensor_data(&self, t: &TensorInfo) -> Result<&[u8]> {
        let missing = || GgufError::MissingTensor {
            tensor: t.name.clone(),
        };
        if self.find_tensor(&t.name) != Some(t) {
            return Err(missing());
        }
        let part = self.parts.get(t.split).ok_or_else(missing)?;
        // Parsing checked offset + n_bytes against this part's data section.
        let start = part.data_start + t.offset as usize;
        Ok(&part.map[start..start + t.n_bytes as usize])
    }

    /// Tensors, elements and bytes per ggml type, by type id.
    pub fn type_histogram(&self) -> BTreeMap<GgmlType, TypeStats> {
        let mut h: BTreeMap<GgmlType, TypeStats> = BTreeMap::new();
        for t in &self.tensors {
            let s = h.entry(t.ggml_type).or_default();
            s.count += 1;
            s.elements += t.n_elements();
            s.bytes += t.n_bytes;
        }
        h
    }

    /// A human-readable report: files, metadata (long strings and arrays shortened) and the
    /// tensor-type histogram. What `fl info FILE.gguf` prints.
    pub fn summary(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        for p in &self.parts {
            let _ = writeln!(s, "file: {} ({} bytes)", p.path.display(), p.map.len());
        }
        let _ = writeln!(
            s,
            "GGUF v{}, alignment {}, {} metadata keys, {} tensors",
            self.version,
            self.alignment,
            self.metadata.len(),
            self.tensors.len()
        );
        let _ = writeln!(s, "\nmetadata:");
        for (k, v) in &self.metadata {
            let _ = writeln!(s, "  {k}: {} = {v}", v.type_name());
        }
        let _ = writeln!(s, "\ntensor types:");
        let _ = writeln!(
            s,
            "  {:<8} {:>7} {:>16} {:>16}",
            "type", "tensors", "elements", "bytes"
        );
        let (mut n, mut e, mut b) = (0, 0, 0);
        for (ty, st) in self.type_histogram() {
            let _ = writeln!(
                s,
                "  {:<8} {:>7} {:>16} {:>16}",
                ty.name(),
                st.count,
                st.elements,
                st.bytes
            );
            n += st.count;
            e += st.elements;
            b += st.bytes;
        }
        let _ = writeln!(s, "  {:<8} {:>7} {:>16} {:>16}", "total", n, e, b);
        s
    }
}
