//! A GGUF file run on its own formats ([`Quant::Gguf`](crate::linear::Quant::Gguf), what `fl
//! --model FILE.gguf` does unless `--quant` says otherwise): which form each projection of the
//! decoder takes, and its bytes on the host.
//!
//! The engine holds four projections per layer: `q|k|v` stacked, `o`, `gate|up` stacked and
//! `down` ([`crate::weights::LayerWeights`]). Each tensor's own form is
//! - its ggml type, when the quantised GEMV runs it ([`QuantFormat::from_ggml`]: Q8_0, Q4_0,
//!   Q4_K, Q5_K, Q6_K): the file's blocks, copied, no requantising;
//! - dense in the run dtype otherwise (F32, F16, BF16; and Q4_1, Q5_0, Q5_1, Q2_K, Q3_K...,
//!   which have no GEMV yet: dequantised exactly as ggml does, with a [notice](notices)).
//!
//! A stacked weight needs one format. Its parts may differ (Q4_K_M stores `v` in Q6_K on some
//! layers, `q` and `k` in Q4_K), so the rule ([`stack_form`]) is: **the most precise of the
//! parts' forms**, on the ladder Q4_0 < Q4_K < Q5_K < Q6_K < Q8_0 < dense. Parts already in
//! that form keep their bytes; the others are requantised into it from their exact dequantised
//! values by ggml's reference quantiser. Requantising into a more precise format adds an error
//! of that format's size to the part's own, independent of it: Q4_K q/k into Q6_K move 1.7%
//! (rel. L2) from the file's values, against Q4_K's own 7.1% from the original weights, so
//! 7.3% in all (N(0, 0.02²) weights, `tests/gguf_native.rs`). Those parts take the wider
//! format's bytes: Q4_K_M's QKV of a LLaMA-2-7B layer is 41.3 MB instead of 32.6 MB. Going
//! the other way (v into Q4_K) would throw away the precision the file chose to keep; a dense
//! stack would read 100.7 MB.
//!
//! Row orders: a llama file's q and k rows are interleaved per head (llama.cpp's converter);
//! they are put back in Hugging Face order, then the stack takes the engine's row order
//! ([`crate::weights::qkv_row_order`]). A row permutation moves whole rows of blocks, so on
//! quantised bytes it is exact.

use fl_kernels::gemv::{self, QuantFormat, QuantizedHost, Scales};
use fl_kernels::ggml::GgmlType as KType;
use fl_kernels::reference::ggml::dequantize_row;

use super::model::{interleaved_to_rotate_half_rows, permute_rows};
use super::{GgmlType, GgufError, GgufFile, TensorInfo};
use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::linear::par_rows;

/// The form of one projection of the decoder on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// Weight-only quantised in this format ([`crate::linear::Linear::WeightOnly`]).
    Native(QuantFormat),
    /// Dense in the run dtype ([`crate::linear::Linear::Dense`]).
    Dense,
}

impl Form {
    /// Rank on the precision ladder Q4_0 < Q4_K < Q5_K < Q6_K < Q8_0 < dense.
    fn precision(self) -> u8 {
        match self {
            Form::Native(QuantFormat::Q4_0) => 0,
            Form::Native(QuantFormat::Q4_K) => 1,
            Form::Native(QuantFormat::Q5_K) => 2,
            Form::Native(QuantFormat::Q6_K) => 3,
            Form::Native(QuantFormat::Q8_0) => 4,
            // int8 / int4 never come from a file.
            Form::Native(_) => 4,
            Form::Dense => 5,
        }
    }

    /// `q4_k`, ..., or `dense`.
    pub fn name(self) -> String {
        match self {
            Form::Native(f) => f.name(),
            Form::Dense => "dense".into(),
        }
    }
}

/// The form one tensor of ggml type `ty` takes on its own: [`Form::Native`] for the types the
/// GEMV runs, else [`Form::Dense`].
///
/// ```
/// use fl_engine::gguf::native::{tensor_form, Form};
/// use fl_engine::gguf::GgmlType;
/// use fl_kernels::gemv::QuantFormat;
/// assert_eq!(tensor_form(GgmlType::Q4_K), Form::Native(QuantFormat::Q4_K));
/// assert_eq!(tensor_form(GgmlType::Q5_0), Form::Dense);
/// assert_eq!(tensor_form(GgmlType::F16), Form::Dense);
/// ```
pub fn tensor_form(ty: GgmlType) -> Form {
    KType::from_id(ty.id())
        .ok()
        .and_then(QuantFormat::from_ggml)
        .map_or(Form::Dense, Form::Native)
}

/// The form of a weight stacked from tensors of types `types`: the most precise of their
/// [`tensor_form`]s (see the [module docs](self)); [`Form::Dense`] for no parts.
///
/// ```
/// use fl_engine::gguf::native::{stack_form, Form};
/// use fl_engine::gguf::GgmlType::{Q4_K, Q5_0, Q6_K};
/// use fl_kernels::gemv::QuantFormat;
/// assert_eq!(stack_form(&[Q4_K, Q4_K, Q6_K]), Form::Native(QuantFormat::Q6_K));
/// assert_eq!(stack_form(&[Q4_K, Q4_K]), Form::Native(QuantFormat::Q4_K));
/// assert_eq!(stack_form(&[Q4_K, Q5_0]), Form::Dense);
/// ```
pub fn stack_form(types: &[GgmlType]) -> Form {
    types
        .iter()
        .map(|&t| tensor_form(t))
        .max_by_key(|f| f.precision())
        .unwrap_or(Form::Dense)
}

/// One projection of one layer in the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Projection {
    /// The layer.
    pub layer: usize,
    /// The stacked weight's parts in stacking order: (GGUF tensor name, ggml type, rows).
    pub parts: Vec<(String, GgmlType, usize)>,
    /// Input features (every part's row length).
    pub k: usize,
    /// How the stack is held: [`stack_form`] of the parts' types.
    pub form: Form,
}

impl Projection {
    /// Output features (rows of the stack).
    pub fn n(&self) -> usize {
        self.parts.iter().map(|p| p.2).sum()
    }

    /// Device bytes of the weight at `dtype_bytes` per dense element.
    pub fn bytes(&self, dtype_bytes: usize) -> u64 {
        match self.form {
            Form::Native(f) => f.weight_bytes(self.n(), self.k) as u64,
            Form::Dense => (self.n() * self.k * dtype_bytes) as u64,
        }
    }

    /// What happens to the part of type `ty` that is not already held as it is: `None` when
    /// it is (its own blocks, or a dense type going dense).
    fn change(&self, ty: GgmlType) -> Option<String> {
        let own = tensor_form(ty);
        match (own, self.form) {
            (Form::Dense, Form::Dense) if ty.is_quantized() => {
                Some("no quantised kernel for it yet: dequantised to the run dtype".into())
            }
            (a, b) if a == b => None,
            (Form::Native(_), Form::Dense) => {
                Some("stacked with a part that runs dense: dequantised to the run dtype".into())
            }
            // A dense part makes the stack dense (stack_form).
            (Form::Dense, _) => None,
            (Form::Native(_), Form::Native(f)) => Some(format!(
                "stacked with a more precise part: requantised to {} from its exact values",
                f.name()
            )),
        }
    }
}

/// Every projection of every layer of `cfg` as [`Quant::Gguf`](crate::linear::Quant::Gguf)
/// holds it, layer by layer in the order `q|k|v`, `o`, `gate|up`, `down`.
///
/// Errors: [`GgufError::MissingTensor`] naming a projection the file lacks.
///
/// ```no_run
/// use fl_engine::gguf::{native, GgufFile};
/// let f = GgufFile::open("model-Q4_K_M.gguf")?;
/// let plan = native::plan(&f, &f.model_config()?)?;
/// for line in native::notices(&plan) {
///     eprintln!("note: {line}");
/// }
/// # Ok::<(), fl_engine::EngineError>(())
/// ```
pub fn plan(f: &GgufFile, cfg: &ModelConfig) -> Result<Vec<Projection>> {
    let mut out = Vec::with_capacity(4 * cfg.num_hidden_layers);
    for l in 0..cfg.num_hidden_layers {
        for parts in crate::weights::projection_parts(cfg, l) {
            let mut ps = Vec::with_capacity(parts.len());
            for (name, shape) in &parts {
                let t = f.hf_tensor(name)?;
                ps.push((t.name.clone(), t.ggml_type, shape[0]));
            }
            let types: Vec<GgmlType> = ps.iter().map(|p| p.1).collect();
            out.push(Projection {
                layer: l,
                parts: ps,
                k: parts[0].1[1],
                form: stack_form(&types),
            });
        }
    }
    Ok(out)
}

/// Device bytes of every weight of `cfg` loaded per `plan` at `dtype_bytes` per dense
/// element: [`ModelConfig::weight_bytes`] with each projection at [`Projection::bytes`] (what
/// [`crate::weights::Weights::bytes`] reports once loaded).
pub fn weight_bytes(plan: &[Projection], cfg: &ModelConfig, dtype_bytes: usize) -> u64 {
    let dense: u64 = plan
        .iter()
        .map(|p| (p.n() * p.k * dtype_bytes) as u64)
        .sum();
    let held: u64 = plan.iter().map(|p| p.bytes(dtype_bytes)).sum();
    cfg.weight_bytes(dtype_bytes) - dense + held
}

/// One line per (tensor type, what happens to it) for the tensors of `plan` that do not run
/// as they are stored: the count, the first tensor's name and why (no GEMV for the type;
/// stacked with a more precise part; stacked with a dense part). Empty when every projection
/// runs its file's bytes (or a dense type densely).
///
/// ```
/// use fl_engine::gguf::native::{notices, Form, Projection};
/// use fl_engine::gguf::GgmlType::{Q4_K, Q5_0};
/// let p = Projection {
///     layer: 0,
///     parts: vec![("blk.0.ffn_down.weight".into(), Q5_0, 64)],
///     k: 256,
///     form: Form::Dense,
/// };
/// let n = notices(&[p]);
/// assert_eq!(n.len(), 1);
/// assert!(n[0].contains("q5_0") && n[0].contains("blk.0.ffn_down.weight"), "{}", n[0]);
/// # let _ = Q4_K;
/// ```
pub fn notices(plan: &[Projection]) -> Vec<String> {
    tally(plan.iter().flat_map(|p| {
        p.parts.iter().filter_map(|(name, ty, _)| {
            p.change(*ty)
                .map(|why| (ty.name().to_string(), why, name.clone()))
        })
    }))
}

/// One line per distinct (type name, why), in first-seen order: "{type} tensor {first}[ and N
/// more]: {why}", from (type name, why, tensor name) items.
fn tally(items: impl Iterator<Item = (String, String, String)>) -> Vec<String> {
    // (type, why) -> (count, first tensor).
    let mut seen: Vec<((String, String), (usize, String))> = Vec::new();
    for (ty, why, name) in items {
        let key = (ty, why);
        match seen.iter_mut().find(|(k, _)| *k == key) {
            Some((_, (n, _))) => *n += 1,
            None => seen.push((key, (1, name))),
        }
    }
    seen.into_iter()
        .map(|((ty, why), (n, first))| {
            let more = if n > 1 {
                format!(" and {} more", n - 1)
            } else {
                String::new()
            };
            format!("{ty} tensor {first}{more}: {why}")
        })
        .collect()
}

/// What changes when `plan` runs on `tp` GPUs: o and down are split by columns (each rank
/// keeps `k / tp` of them), and a rank keeps the file's blocks only where its columns fall on
/// whole blocks ([`cols_on_blocks`]); otherwise the rank's exact values are requantised to Q8_0
/// (32-value blocks), or held dense when even those do not fit. One line per (type, columns,
/// outcome), as [`notices`]; empty for `tp <= 1` or when every split falls on blocks.
///
/// ```
/// use fl_engine::gguf::native::{shard_notices, Form, Projection};
/// use fl_engine::gguf::GgmlType::Q4_K;
/// use fl_kernels::gemv::QuantFormat;
/// // llama-2-7b's down projection: 11,008 columns, 5,504 per GPU at --tp 2 (not 256-aligned).
/// let down = Projection {
///     layer: 0,
///     parts: vec![("blk.0.ffn_down.weight".into(), Q4_K, 4096)],
///     k: 11008,
///     form: Form::Native(QuantFormat::Q4_K),
/// };
/// let n = shard_notices(&[down], 2);
/// assert_eq!(n.len(), 1);
/// assert!(n[0].contains("q8_0") && n[0].contains("5504"), "{}", n[0]);
/// ```
pub fn shard_notices(plan: &[Projection], tp: usize) -> Vec<String> {
    if tp <= 1 {
        return Vec::new();
    }
    tally(plan.iter().filter_map(|p| {
        let Form::Native(format) = p.form else {
            return None;
        };
        let row_parallel = p.parts.len() == 1
            && (p.parts[0].0.ends_with("attn_output.weight")
                || p.parts[0].0.ends_with("ffn_down.weight"));
        let cols = p.k / tp;
        if !row_parallel || cols_on_blocks(format, Some(&(0..cols))) {
            return None;
        }
        let to = if cols_on_blocks(QuantFormat::Q8_0, Some(&(0..cols))) {
            "requantised to q8_0 from its exact values"
        } else {
            "dense"
        };
        let why = format!(
            "{cols} columns per GPU at --tp {tp} are not whole {}-value blocks: each rank's \
             part {to}",
            format.k_multiple()
        );
        Some((format.name(), why, p.parts[0].0.clone()))
    }))
}

/// The kernels' ggml type of a file tensor.
fn ktype(t: &TensorInfo) -> Result<KType> {
    KType::from_id(t.ggml_type.id()).map_err(|_| {
        EngineError::invalid(
            "--model",
            format!(
                "tensor `{}` is {}: this type cannot be read yet (F32, F16, BF16, Q4_0, Q4_1, \
                 Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K can)",
                t.name,
                t.ggml_type.name()
            ),
        )
    })
}

/// The file tensor of Hugging Face name `name`, checked to have row-major `shape`.
fn checked<'f>(f: &'f GgufFile, name: &str, shape: &[usize]) -> Result<&'f TensorInfo> {
    let t = f.hf_tensor(name)?;
    let got: Vec<usize> = t.shape().iter().map(|&d| d as usize).collect();
    if got != shape {
        return Err(GgufError::TensorMismatch {
            tensor: t.name.clone(),
            reason: format!("shape {got:?}, expected {shape:?}"),
        }
        .into());
    }
    Ok(t)
}

/// For a q or k weight or bias (Hugging Face `name`) of a file whose q / k rows are
/// interleaved, the row order that puts them back in Hugging Face order; `None` otherwise.
fn qk_order(f: &GgufFile, name: &str, rows: usize, head_dim: usize) -> Result<Option<Vec<usize>>> {
    let qk = name.ends_with("self_attn.q_proj.weight")
        || name.ends_with("self_attn.k_proj.weight")
        || name.ends_with("self_attn.q_proj.bias")
        || name.ends_with("self_attn.k_proj.bias");
    if !qk || !f.qk_rows_interleaved()? {
        return Ok(None);
    }
    Ok(Some(interleaved_to_rotate_half_rows(
        rows / head_dim.max(1),
        head_dim,
    )?))
}

/// GGUF tensor `name` (its Hugging Face name) of row-major `shape`, dequantised to f32 row by
/// row exactly as ggml does; a llama file's q / k weights and biases are put back in the
/// Hugging Face (rotate-half) row order per head of `head_dim` rows.
///
/// Errors: [`GgufError::MissingTensor`] / [`GgufError::TensorMismatch`] naming the tensor;
/// [`EngineError::Invalid`] naming `--model` for a type with no dequantiser.
pub fn tensor_f32(f: &GgufFile, name: &str, shape: &[usize], head_dim: usize) -> Result<Vec<f32>> {
    let t = checked(f, name, shape)?;
    let ty = ktype(t)?;
    let k = *shape.last().unwrap_or(&1);
    // A bias is one value per row.
    let rows = shape.iter().product::<usize>() / k.max(1);
    let data = f.tensor_data(t)?;
    let row_bytes = ty.row_bytes(k)?;
    let mut out = Vec::with_capacity(rows * k);
    for r in 0..rows {
        out.extend(dequantize_row(
            ty,
            &data[r * row_bytes..(r + 1) * row_bytes],
            k,
        )?);
    }
    let n_rows = if shape.len() == 1 { shape[0] } else { rows };
    if let Some(order) = qk_order(f, name, n_rows, head_dim)? {
        let per = out.len() / n_rows.max(1);
        out = order
            .iter()
            .flat_map(|&r| out[r * per..(r + 1) * per].iter().copied())
            .collect();
    }
    Ok(out)
}

/// Whether one rank's columns `cols` of a `[_, k]` weight in `format` start and end on whole
/// blocks (32 values for Q8_0 / Q4_0, 256 for the K-quants), so that the rank can keep the
/// file's blocks ([`select_host`]); `None` (every column) always does.
pub fn cols_on_blocks(format: QuantFormat, cols: Option<&std::ops::Range<usize>>) -> bool {
    let b = format.k_multiple();
    cols.is_none_or(|c| c.start % b == 0 && c.end % b == 0)
}

/// Rows `rows` of `q` (indices into its rows, in that order, any subset; `None`: all) and, of
/// each, the columns `cols` (`None`: all): one tensor-parallel rank's part of a weight in the
/// file's blocks, bytes copied. Exact: a block holds its own scales, so whole blocks of a row
/// dequantise to the same values wherever they sit.
///
/// Errors: [`GgufError::BadShape`] naming the row index or the column range when a row lies
/// outside `q`, or the columns leave `0..k` or do not fall on whole blocks
/// ([`cols_on_blocks`]).
///
/// ```
/// use fl_engine::gguf::native::select_host;
/// use fl_kernels::gemv::{self, QuantFormat};
/// let (n, k) = (4, 64);
/// let w: Vec<f32> = (0..n * k).map(|i| (i % 7) as f32 - 3.0).collect();
/// let q = gemv::quantize(&w, n, k, QuantFormat::Q8_0)?;
/// let part = select_host(&q, Some(&[3, 1]), Some(32..64))?;
/// assert_eq!((part.n(), part.k()), (2, 32));
/// assert_eq!(part.data(), &q.data()[3 * 68 + 34..4 * 68]
///     .iter()
///     .chain(&q.data()[68 + 34..2 * 68])
///     .copied()
///     .collect::<Vec<u8>>()[..]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn select_host(
    q: &QuantizedHost,
    rows: Option<&[usize]>,
    cols: Option<std::ops::Range<usize>>,
) -> Result<QuantizedHost> {
    let (n, k, format) = (q.n(), q.k(), q.format());
    let bad = |reason: String| GgufError::BadShape {
        tensor: "shard".into(),
        reason,
    };
    let cols = cols.unwrap_or(0..k);
    if cols.start > cols.end || cols.end > k || !cols_on_blocks(format, Some(&cols)) {
        return Err(bad(format!(
            "columns {cols:?} of {k}: a {} shard needs whole blocks of {} values",
            format.name(),
            format.k_multiple()
        ))
        .into());
    }
    let row_bytes = format.data_bytes(1, k);
    let (from, to) = (
        format.data_bytes(1, cols.start),
        format.data_bytes(1, cols.end),
    );
    let all: Vec<usize>;
    let rows = match rows {
        Some(r) => r,
        None => {
            all = (0..n).collect();
            &all
        }
    };
    let mut data = Vec::with_capacity(rows.len() * (to - from));
    for &r in rows {
        if r >= n {
            return Err(bad(format!("row {r} of a {n}-row weight")).into());
        }
        data.extend_from_slice(&q.data()[r * row_bytes + from..r * row_bytes + to]);
    }
    Ok(QuantizedHost::new(
        format,
        rows.len(),
        cols.len(),
        data,
        Scales::None,
        Vec::new(),
    )?)
}

/// The weight stacked from `parts` (Hugging Face names, row-major `[rows_i, k]` shapes) in
/// `format`, on the host: parts of that ggml type contribute their file bytes (q / k rows put
/// back in Hugging Face order), the others their exact values requantised by ggml's reference
/// quantiser; then, with `order`, row `i` of the stack is row `order[i]` of the parts'
/// concatenation ([`crate::weights::qkv_row_order`]).
///
/// Errors: those of [`tensor_f32`]; [`fl_kernels::Error`]s naming `k` when the rows do not fit
/// `format`, or `weights` for a non-finite value to requantise; [`GgufError::BadShape`] when
/// `order` is not a permutation of the stack's rows.
pub fn stacked_host(
    f: &GgufFile,
    parts: &[(String, Vec<usize>)],
    format: QuantFormat,
    order: Option<&[usize]>,
    head_dim: usize,
) -> Result<QuantizedHost> {
    let k = parts.first().map_or(0, |p| p.1[1]);
    let mut data = Vec::new();
    let mut rows = 0;
    for (name, shape) in parts {
        let t = checked(f, name, shape)?;
        let n = shape[0];
        if QuantFormat::from_ggml(ktype(t)?) == Some(format) {
            let bytes = f.tensor_data(t)?;
            match qk_order(f, name, n, head_dim)? {
                Some(o) => data.extend(permute_rows(bytes, bytes.len() / n.max(1), &o)?),
                None => data.extend_from_slice(bytes),
            }
        } else {
            let v = tensor_f32(f, name, shape, head_dim)?;
            for q in par_rows(&v, n, k, |w, r| gemv::quantize(w, r, k, format))? {
                data.extend_from_slice(q.data());
            }
        }
        rows += n;
    }
    if let Some(o) = order {
        data = permute_rows(&data, format.data_bytes(1, k), o)?;
    }
    Ok(QuantizedHost::new(
        format,
        rows,
        k,
        data,
        Scales::None,
        Vec::new(),
    )?)
}
