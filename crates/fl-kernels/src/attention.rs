//! Attention kernels: [`decode`] (one query token per sequence, over the KV cache).
//!
//! CPU reference: [`crate::reference::attention`](mod@crate::reference::attention).

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaStream, DevicePtr};
use fl_kernels_sys::{fl_decode_attention_args, fl_kv_layout};
use std::sync::Arc;

use crate::dtype::FloatDType;
use crate::error::check;
use crate::tensor::{as_i32, expect_shape, raw_stream};
use crate::{DeviceTensor, Error, Result};

/// Head sizes the decode kernel is instantiated for.
pub const DECODE_HEAD_DIMS: [usize; 5] = [64, 80, 96, 128, 256];

/// The KV cache that [`decode`] reads, in one of the two layouts the cache-append kernels
/// write, in the dtype of the queries (`f32`, `f16` or `bf16`).
#[derive(Debug, Clone, Copy)]
pub enum KvCache<'a, T: FloatDType> {
    /// `k`, `v`: `[batch, kv_heads, max_seq, head_dim]` each.
    Contiguous {
        /// Keys.
        k: &'a DeviceTensor<T>,
        /// Values.
        v: &'a DeviceTensor<T>,
    },
    /// vLLM-style pages: `k`, `v`: `[num_blocks, kv_heads, block_size, head_dim]` each;
    /// `block_table`: `[batch, max_blocks_per_seq]` block ids. Position `p` of sequence `b`
    /// is slot `p % block_size` of block `block_table[b][p / block_size]`. A block id outside
    /// `0..num_blocks` is never read: its keys are skipped.
    Paged {
        /// Keys.
        k: &'a DeviceTensor<T>,
        /// Values.
        v: &'a DeviceTensor<T>,
        /// Block ids per sequence.
        block_table: &'a DeviceTensor<i32>,
    },
}

/// Knobs of [`decode`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeParams {
    /// Softmax scale, usually `1 / sqrt(head_dim)`.
    pub scale: f32,
    /// Host-known upper bound on `seq_lens` (e.g. the longest sequence in the batch); sizes
    /// the sequence split. Must not exceed the cache capacity.
    pub max_seq_len: usize,
    /// Sliding window (Mistral): attend to the last `w` positions only. `None`: all.
    pub window: Option<usize>,
    /// Number of sequence splits (flash-decoding); `None` chooses from the shape and the
    /// number of SMs so that small batches of long sequences still fill the GPU.
    pub num_splits: Option<usize>,
}

impl DecodeParams {
    /// `scale = 1/sqrt(head_dim)`, no window, automatic split.
    pub fn new(head_dim: usize, max_seq_len: usize) -> Self {
        DecodeParams {
            scale: 1.0 / (head_dim as f32).sqrt(),
            max_seq_len,
            window: None,
            num_splits: None,
        }
    }
}

/// Scratch memory for [`decode`]'s split reduction; allocate once, reuse every step (calls on
/// one stream; it is zero-filled when made, and its first 4 KB hold arrival counters that every
/// call leaves at zero).
///
/// Size it with [`decode_workspace_bytes`] for the largest shape you will run; [`decode`]
/// never allocates and returns an error naming `workspace` when it is too small.
pub struct DecodeWorkspace {
    buf: Option<DeviceTensor<u8>>,
}

impl DecodeWorkspace {
    /// A workspace of `bytes` bytes (none allocated when 0).
    pub fn new(stream: &Arc<CudaStream>, bytes: usize) -> Result<Self> {
        let buf = if bytes == 0 {
            None
        } else {
            Some(DeviceTensor::zeros(stream, &[bytes])?)
        };
        Ok(DecodeWorkspace { buf })
    }

    /// Capacity in bytes.
    pub fn bytes(&self) -> usize {
        self.buf.as_ref().map_or(0, |b| b.len())
    }
}

struct Checked {
    args: fl_decode_attention_args,
}

fn sm_count(stream: &CudaStream) -> i32 {
    stream
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .unwrap_or(0)
}

fn build_args<T: FloatDType>(
    stream: &CudaStream,
    q: &DeviceTensor<T>,
    cache: &KvCache<'_, T>,
    seq_lens: &DeviceTensor<i32>,
    params: &DecodeParams,
) -> Result<Checked> {
    let qs = q.shape();
    if qs.len() != 3 {
        return Err(Error::Shape {
            arg: "q",
            expected: "[batch, q_heads, head_dim]".into(),
            got: qs.to_vec(),
        });
    }
    let (batch, q_heads, head_dim) = (qs[0], qs[1], qs[2]);
    if !DECODE_HEAD_DIMS.contains(&head_dim) {
        return Err(Error::invalid(
            "q",
            format!("head_dim {head_dim} is not one of {DECODE_HEAD_DIMS:?}"),
        ));
    }
    expect_shape("seq_lens", seq_lens, &[batch])?;
    if !(params.scale.is_finite()) {
        return Err(Error::invalid(
            "params.scale",
            format!("{} is not finite", params.scale),
        ));
    }
    let (k, v, layout, block, max_blocks, num_blocks, table) = match *cache {
        KvCache::Contiguous { k, v } => {
            let ks = k.shape();
            if ks.len() != 4 || ks[0] != batch || ks[3] != head_dim {
                return Err(Error::Shape {
                    arg: "cache.k",
                    expected: format!("[{batch}, kv_heads, max_seq, {head_dim}]"),
                    got: ks.to_vec(),
                });
            }
            (k, v, fl_kv_layout::FL_KV_CONTIGUOUS, ks[2], 0, 0, None)
        }
        KvCache::Paged { k, v, block_table } => {
            let ks = k.shape();
            if ks.len() != 4 || ks[3] != head_dim {
                return Err(Error::Shape {
                    arg: "cache.k",
                    expected: format!("[num_blocks, kv_heads, block_size, {head_dim}]"),
                    got: ks.to_vec(),
                });
            }
            let bt = block_table.shape();
            if bt.len() != 2 || bt[0] != batch || bt[1] == 0 {
                return Err(Error::Shape {
                    arg: "cache.block_table",
                    expected: format!("[{batch}, max_blocks_per_seq >= 1]"),
                    got: bt.to_vec(),
                });
            }
            (
                k,
                v,
                fl_kv_layout::FL_KV_PAGED,
                ks[2],
                bt[1],
                ks[0],
                Some(block_table),
            )
        }
    };
    expect_shape("cache.v", v, k.shape())?;
    let kv_heads = k.shape()[1];
    if kv_heads == 0 || q_heads == 0 || q_heads % kv_heads != 0 {
        return Err(Error::invalid(
            "q",
            format!("q_heads {q_heads} is not a positive multiple of kv_heads {kv_heads}"),
        ));
    }
    let capacity = if table.is_some() {
        block * max_blocks
    } else {
        block
    };
    if params.max_seq_len > capacity {
        return Err(Error::invalid(
            "params.max_seq_len",
            format!(
                "{} exceeds the cache capacity {capacity}",
                params.max_seq_len
            ),
        ));
    }
    if params.num_splits == Some(0) {
        return Err(Error::invalid(
            "params.num_splits",
            "must be at least 1 (or None)",
        ));
    }
    let args = fl_decode_attention_args {
        dtype: T::ID,
        batch: as_i32("q", batch)?,
        q_heads: as_i32("q", q_heads)?,
        kv_heads: as_i32("cache.k", kv_heads)?,
        head_dim: head_dim as i32,
        q: std::ptr::null(),
        k: std::ptr::null(),
        v: std::ptr::null(),
        out: std::ptr::null_mut(),
        seq_lens: std::ptr::null(),
        max_seq_len: as_i32("params.max_seq_len", params.max_seq_len)?,
        layout,
        kv_block_size: as_i32("cache.k", block)?,
        block_table: std::ptr::null(),
        max_blocks_per_seq: as_i32("cache.block_table", max_blocks)?,
        num_blocks: as_i32("cache.k", num_blocks)?,
        scale: params.scale,
        window: as_i32("params.window", params.window.unwrap_or(0))?,
        num_splits: as_i32("params.num_splits", params.num_splits.unwrap_or(0))?,
        sm_count: sm_count(stream),
    };
    Ok(Checked { args })
}

/// Scratch bytes [`decode`] needs for these inputs (0 when it runs in one split).
pub fn decode_workspace_bytes<T: FloatDType>(
    stream: &CudaStream,
    q: &DeviceTensor<T>,
    cache: &KvCache<'_, T>,
    seq_lens: &DeviceTensor<i32>,
    params: &DecodeParams,
) -> Result<usize> {
    let c = build_args(stream, q, cache, seq_lens, params)?;
    // SAFETY: reads the args struct only.
    let n = unsafe { fl_kernels_sys::fl_attention_decode_workspace_size(&c.args) };
    usize::try_from(n).map_err(|_| Error::invalid("q", "the kernel refused these arguments"))
}

/// Decode attention: each sequence's one query token against its KV cache.
///
/// `out[b, h] = Σ_j softmax_j(scale · q[b, h] · K[b, h/g, j]) · V[b, h/g, j]` over
/// positions `j` in `[lo, seq_lens[b])` with `lo = seq_lens[b] − window` (or 0), where
/// `g = q_heads / kv_heads` (grouped-query attention; MHA and MQA are `g = 1` and
/// `g = q_heads`). The cache must already hold the current token. A sequence of length 0
/// gets a zero output. Softmax in f32 with an online max; K/V read once per KV head for all
/// of its query heads; long sequences are split across CTAs (flash-decoding) and reduced
/// in a second pass. For `f16`/`bf16` with `g >= 2` (an even group) the products run on
/// tensor cores (f32 accumulation; the softmax weights are rounded to the input dtype for
/// `P·V`, as in FlashAttention), and so does MHA at `head_dim` 128 on Hopper when
/// `batch · kv_heads >= 128` and `max_seq_len >= 4096` (it reads faster there); `f32` runs
/// on CUDA cores for every `g`, all in f32 (no TF32), so it matches an f64 reference to
/// ~1e-6.
///
/// Shapes: `q`, `out`: `[batch, q_heads, head_dim]`; `seq_lens`: `[batch]` (device, each
/// at most `params.max_seq_len`; larger values are clamped to the cache capacity);
/// cache per [`KvCache`]. `head_dim` in [`DECODE_HEAD_DIMS`]. Dtypes: `f32`, `f16`, `bf16`
/// (one dtype for `q`, the cache and `out`).
///
/// Errors: [`Error::Shape`] / [`Error::InvalidArgument`] naming the argument, before any
/// launch; `workspace` smaller than [`decode_workspace_bytes`].
///
/// ```no_run
/// use fl_kernels::{attention::{self, DecodeParams, DecodeWorkspace, KvCache}, DeviceTensor, Gpu, f16};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let (batch, hq, hkv, d, cap) = (2, 32, 8, 128, 4096);
/// let q = DeviceTensor::<f16>::zeros(s, &[batch, hq, d])?;
/// let k = DeviceTensor::<f16>::zeros(s, &[batch, hkv, cap, d])?;
/// let v = DeviceTensor::<f16>::zeros(s, &[batch, hkv, cap, d])?;
/// let lens = DeviceTensor::from_host(s, &[1000i32, 4096], &[batch])?;
/// let cache = KvCache::Contiguous { k: &k, v: &v };
/// let params = DecodeParams::new(d, cap);
/// let bytes = attention::decode_workspace_bytes(s, &q, &cache, &lens, &params)?;
/// let mut ws = DecodeWorkspace::new(s, bytes)?;
/// let mut out = DeviceTensor::<f16>::zeros(s, &[batch, hq, d])?;
/// attention::decode(s, &q, &cache, &lens, &params, &mut ws, &mut out)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn decode<T: FloatDType>(
    stream: &CudaStream,
    q: &DeviceTensor<T>,
    cache: &KvCache<'_, T>,
    seq_lens: &DeviceTensor<i32>,
    params: &DecodeParams,
    workspace: &mut DecodeWorkspace,
    out: &mut DeviceTensor<T>,
) -> Result<()> {
    let Checked { mut args } = build_args(stream, q, cache, seq_lens, params)?;
    expect_shape("out", out, q.shape())?;
    // SAFETY: reads the args struct only.
    let need = unsafe { fl_kernels_sys::fl_attention_decode_workspace_size(&args) };
    let need = usize::try_from(need)
        .map_err(|_| Error::invalid("q", "the kernel refused these arguments"))?;
    if workspace.bytes() < need {
        return Err(Error::invalid(
            "workspace",
            format!(
                "{} bytes, these inputs need {need} (see decode_workspace_bytes)",
                workspace.bytes()
            ),
        ));
    }
    let (k, v, table) = match *cache {
        KvCache::Contiguous { k, v } => (k, v, None),
        KvCache::Paged { k, v, block_table } => (k, v, Some(block_table)),
    };
    let (pq, _g1) = q.ptr(stream);
    let (pk, _g2) = k.ptr(stream);
    let (pv, _g3) = v.ptr(stream);
    let (pl, _g4) = seq_lens.ptr(stream);
    let table_ptr = table.map(|t| t.as_slice().device_ptr(stream));
    let ws_len = workspace.bytes() as i64;
    let ws_ptr = workspace.buf.as_mut().map(|b| b.ptr_mut(stream));
    let (po, _g5) = out.ptr_mut(stream);
    args.q = pq as _;
    args.k = pk as _;
    args.v = pv as _;
    args.seq_lens = pl as _;
    args.out = po as _;
    args.block_table = table_ptr
        .as_ref()
        .map_or(std::ptr::null(), |(p, _)| *p as _);
    let ws = ws_ptr
        .as_ref()
        .map_or(std::ptr::null_mut(), |(p, _)| *p as _);
    // SAFETY: every pointer refers to a live buffer whose shape was checked against the
    // args above; the guards keep them alive until the launch has been queued.
    let status =
        unsafe { fl_kernels_sys::fl_attention_decode(&args, ws, ws_len, raw_stream(stream)) };
    check("attention::decode", status)
}
