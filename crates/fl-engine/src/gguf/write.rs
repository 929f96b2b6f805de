//! Writing GGUF files: [`GgufWriter`] builds metadata and tensors into bytes, as llama.cpp
//! lays them out (tensors in order, each at an aligned offset). Tests and tools use it to
//! make model files without llama.cpp.
//!
//! ```
//! use fl_engine::gguf::{write::GgufWriter, GgmlType, GgufHeader, Value};
//! let mut w = GgufWriter::new();
//! w.set("general.architecture", Value::String("llama".into()));
//! w.add_tensor("output_norm.weight", &[4], GgmlType::F32, vec![0u8; 16])?;
//! let bytes = w.to_bytes();
//! let h = GgufHeader::parse(&bytes)?;
//! assert_eq!(h.tensors[0].shape(), vec![4]);
//! # Ok::<(), fl_engine::gguf::GgufError>(())
//! ```

use std::path::Path;

use super::value::{Array, Value};
use super::{GgmlType, GgufError, Result, DEFAULT_ALIGNMENT};

/// One tensor to write.
#[derive(Debug, Clone)]
struct Tensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    data: Vec<u8>,
}

/// Builds a GGUF file in memory.
#[derive(Debug, Clone)]
pub struct GgufWriter {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<Tensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    /// An empty GGUF v3 file with the default alignment (32).
    pub fn new() -> Self {
        GgufWriter {
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Sets the version written (the reader takes 2 and 3; tests write others).
    pub fn version(&mut self, version: u32) -> &mut Self {
        self.version = version;
        self
    }

    /// Sets the alignment and writes it as `general.alignment` (u32).
    ///
    /// # Errors
    /// [`GgufError::Invalid`] unless it is a power of two that fits in u32.
    pub fn alignment(&mut self, alignment: u32) -> Result<&mut Self> {
        if !alignment.is_power_of_two() {
            return Err(GgufError::Invalid {
                key: "general.alignment".into(),
                value: alignment.to_string(),
                reason: "must be a power of two".into(),
            });
        }
        self.alignment = u64::from(alignment);
        self.set("general.alignment", Value::U32(alignment));
        Ok(self)
    }

    /// Sets metadata `key` (replacing an earlier value, keeping its place).
    pub fn set(&mut self, key: &str, value: Value) -> &mut Self {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(kv) => kv.1 = value,
            None => self.metadata.push((key.to_string(), value)),
        }
        self
    }

    /// Adds a tensor of ggml dims `dims` (innermost first) whose bytes are `data`.
    ///
    /// # Errors
    /// [`GgufError::BadShape`] when `data` is not exactly the bytes of `dims` in `ty`.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> Result<&mut Self> {
        let n: u64 = dims.iter().product();
        let want = ty
            .bytes_for(n)
            .filter(|_| dims.first().is_none_or(|&d| d % ty.block_size() == 0));
        if want != Some(data.len() as u64) {
            return Err(GgufError::BadShape {
                tensor: name.to_string(),
                reason: format!(
                    "{} bytes given for dims {dims:?} of {ty} (expected {want:?})",
                    data.len()
                ),
            });
        }
        self.tensors.push(Tensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            ty,
            data,
        });
        Ok(self)
    }

    /// Adds an f32 tensor with row-major `shape` (written as reversed dims).
    ///
    /// # Errors
    /// [`GgufError::BadShape`] when `values` does not hold `shape`'s elements.
    pub fn add_f32(&mut self, name: &str, shape: &[u64], values: &[f32]) -> Result<&mut Self> {
        let dims: Vec<u64> = shape.iter().rev().copied().collect();
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add_tensor(name, &dims, GgmlType::F32, data)
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&super::MAGIC);
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut b, k);
            b.extend_from_slice(&v.value_type().id().to_le_bytes());
            put_value(&mut b, v);
        }
        let a = self.alignment;
        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            put_str(&mut b, &t.name);
            b.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&t.ty.id().to_le_bytes());
            b.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + t.data.len() as u64).div_ceil(a) * a;
        }
        if !self.tensors.is_empty() {
            pad(&mut b, a);
        }
        let start = b.len();
        for (t, off) in self.tensors.iter().zip(offsets) {
            b.resize(start + off as usize, 0);
            b.extend_from_slice(&t.data);
        }
        b
    }

    /// Writes the file to `path`.
    ///
    /// # Errors
    /// [`GgufError::Io`] naming the path.
    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.to_bytes()).map_err(|source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}

fn pad(b: &mut Vec<u8>, a: u64) {
    let len = (b.len() as u64).div_ceil(a) * a;
    b.resize(len as usize, 0);
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

fn put_value(b: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => b.push(*x),
        Value::I8(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => b.push(u8::from(*x)),
        Value::String(s) => put_str(b, s),
        Value::Array(a) => put_array(b, a),
    }
}

fn put_array(b: &mut Vec<u8>, a: &Array) {
    b.extend_from_slice(&a.element_type().id().to_le_bytes());
    b.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr) => {
            for x in $v {
                b.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        Array::U8(v) => b.extend_from_slice(v),
        Array::I8(v) => each!(v),
        Array::U16(v) => each!(v),
        Array::I16(v) => each!(v),
        Array::U32(v) => each!(v),
        Array::I32(v) => each!(v),
        Array::U64(v) => each!(v),
        Array::I64(v) => each!(v),
        Array::F32(v) => each!(v),
        Array::F64(v) => each!(v),
        Array::Bool(v) => b.extend(v.iter().map(|&x| u8::from(x))),
        Array::String(v) => v.iter().for_each(|s| put_str(b, s)),
        Array::Array(v) => v.iter().for_each(|x| put_array(b, x)),
    }
}
