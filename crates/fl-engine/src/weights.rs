//! The model's weights on the device ([`Weights`], one [`LayerWeights`] per decoder layer) and
//! how they are loaded: from a safetensors [`Checkpoint`] (converted to the run dtype) or
//! from dummy values for a preset ([`WeightSource`]).
//!
//! Loading stacks what one GEMM reads: Q, K and V as `[q + 2 kv, hidden]`, the q and k rows
//! of each head reordered so that every rotate-half pair is adjacent ([`qkv_row_order`]), and
//! gate|up as `[2 * intermediate, hidden]`. With `--quant` the four projections of each layer
//! are quantised on the host from their f32 values ([`Weights::load_quant`],
//! [`crate::linear`]), or, for a GGUF file in [`Quant::Gguf`], take the file's own blocks
//! ([`crate::gguf::native`]); the embedding, the LM head, the norms and the biases stay dense.

use std::sync::Arc;

use fl_kernels::cudarc::driver::CudaStream;
use fl_kernels::gemv::{QuantFormat, QuantWeight};
use fl_kernels::rope;
use fl_kernels::DeviceTensor;

use crate::checkpoint::{Checkpoint, FLOAT_DTYPES};
use crate::config::ModelConfig;
use crate::dtype::RunDType;
use crate::error::Result;
use crate::linear::{self, Linear, Quant};
use crate::tp::Shard;

/// The weights of one decoder layer, on the device: norms and biases in the run dtype, the
/// four projections as [`Linear`]s (dense in the run dtype, or quantised per [`Quant`]; all
/// four in the same form).
pub struct LayerWeights<T: RunDType> {
    /// `input_layernorm` `[hidden]`.
    pub attn_norm: DeviceTensor<T>,
    /// `q_proj`, `k_proj`, `v_proj` stacked: `[(q_heads + 2 kv_heads) * head_dim, hidden]`.
    pub wqkv: Linear<T>,
    /// Their biases stacked (Qwen2), when the config has them.
    pub bqkv: Option<DeviceTensor<T>>,
    /// `o_proj` `[hidden, q_heads * head_dim]`.
    pub wo: Linear<T>,
    /// `o_proj` bias.
    pub bo: Option<DeviceTensor<T>>,
    /// `post_attention_layernorm` `[hidden]`.
    pub ffn_norm: DeviceTensor<T>,
    /// `gate_proj` then `up_proj`, concatenated: `[2 * intermediate, hidden]`.
    pub w_gate_up: Linear<T>,
    /// Gate|up bias `[2 * intermediate]` (`mlp_bias`).
    pub b_gate_up: Option<DeviceTensor<T>>,
    /// `down_proj` `[hidden, intermediate]`.
    pub w_down: Linear<T>,
    /// `down_proj` bias.
    pub b_down: Option<DeviceTensor<T>>,
}

/// Every weight of the model on the device.
pub struct Weights<T: RunDType> {
    /// `embed_tokens` `[vocab, hidden]`.
    pub embed: DeviceTensor<T>,
    /// The decoder layers.
    pub layers: Vec<LayerWeights<T>>,
    /// `model.norm` `[hidden]`.
    pub final_norm: DeviceTensor<T>,
    /// `lm_head` `[vocab, hidden]`; `None` when tied to `embed`.
    pub lm_head: Option<DeviceTensor<T>>,
    /// How the layers' projections are stored.
    pub quant: Quant,
}

impl<T: RunDType> Weights<T> {
    /// Bytes of all weights on the device (quantised projections at their packed size with
    /// their scales: [`Quant::weight_bytes`]).
    pub fn bytes(&self) -> u64 {
        let mut n = self.embed.num_bytes() + self.final_norm.num_bytes();
        n += self.lm_head.as_ref().map_or(0, |t| t.num_bytes());
        for l in &self.layers {
            n += l.attn_norm.num_bytes()
                + l.wqkv.num_bytes()
                + l.wo.num_bytes()
                + l.ffn_norm.num_bytes()
                + l.w_gate_up.num_bytes()
                + l.w_down.num_bytes();
            n += l.bqkv.as_ref().map_or(0, |t| t.num_bytes());
            n += l.bo.as_ref().map_or(0, |t| t.num_bytes());
            n += l.b_gate_up.as_ref().map_or(0, |t| t.num_bytes());
            n += l.b_down.as_ref().map_or(0, |t| t.num_bytes());
        }
        n as u64
    }

    /// Bytes one decode step must read from the weights: all of them except the embedding
    /// table, of which only the batch's rows are read, unless it doubles as the LM head.
    pub fn bytes_per_step(&self) -> u64 {
        match self.lm_head {
            Some(_) => self.bytes() - self.embed.num_bytes() as u64,
            None => self.bytes(),
        }
    }
}

/// Where weight values come from.
pub enum WeightSource<'a> {
    /// A safetensors checkpoint, converted to the run dtype on load.
    Checkpoint(&'a Checkpoint),
    /// A GGUF file. In [`Quant::Gguf`] the projections keep the file's blocks where the GEMV
    /// runs their type ([`crate::gguf::native`]). Every other tensor (and every tensor in the
    /// other modes) is dequantised to f32 on the host exactly as ggml does
    /// ([`fl_kernels::reference::ggml::dequantize_row`]) and, for the `llama` architecture,
    /// its q and k rows put back in the Hugging Face order (llama.cpp's converter interleaves
    /// them), so the rest of the loading is the safetensors path's.
    Gguf(&'a crate::gguf::GgufFile),
    /// Deterministic pseudo-random values (`N(0, 0.02)`-like, norms 1.0): for `fl bench`
    /// on a preset with no download. Values repeat with a long period, which is fine for
    /// timing and keeps loading fast.
    Dummy {
        /// Seed of the value stream.
        seed: u64,
    },
}

/// Called after each tensor is loaded with (bytes loaded so far, total bytes); the total is
/// [`Quant::weight_bytes`] of the mode loaded.
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64);

struct Loader<'a, 'p> {
    stream: &'a Arc<CudaStream>,
    src: WeightSource<'a>,
    /// Which part of each weight this device holds.
    shard: Shard,
    /// Rows per attention head (the GGUF q/k row order is per head).
    head_dim: usize,
    chunk: Vec<f32>,
    done: u64,
    total: u64,
    progress: Option<Progress<'p>>,
}

const DUMMY_CHUNK: usize = (1 << 20) + 7;

impl<'a> Loader<'a, '_> {
    fn host<T: RunDType>(&mut self, name: &str, shape: &[usize], norm: bool) -> Result<Vec<T>> {
        let n: usize = shape.iter().product();
        let v = match &self.src {
            WeightSource::Checkpoint(ck) => {
                let dtypes = [
                    safetensors::Dtype::F32,
                    safetensors::Dtype::F16,
                    safetensors::Dtype::BF16,
                ];
                ck.expect(name, shape, &dtypes)?.to_vec::<T>()?
            }
            WeightSource::Gguf(f) => {
                crate::gguf::native::tensor_f32(f, name, shape, self.head_dim)?
                    .into_iter()
                    .map(T::from_f32)
                    .collect()
            }
            WeightSource::Dummy { .. } if norm => vec![T::from_f32(1.0); n],
            WeightSource::Dummy { .. } => {
                self.dummy(name, n).into_iter().map(T::from_f32).collect()
            }
        };
        Ok(v)
    }

    /// The dummy values of tensor `name` (`n` of them), copied out of the repeating chunk
    /// a slice at a time.
    fn dummy(&self, name: &str, n: usize) -> Vec<f32> {
        let c = &self.chunk;
        let mut v = Vec::with_capacity(n);
        let mut off = (name.len() * 7919) % c.len();
        while v.len() < n {
            let take = (c.len() - off).min(n - v.len());
            v.extend_from_slice(&c[off..off + take]);
            off = 0;
        }
        v
    }

    /// A linear weight's values in f32 (the checkpoint's widened exactly), for quantisation.
    fn host_f32(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let n: usize = shape.iter().product();
        Ok(match &self.src {
            WeightSource::Checkpoint(ck) => {
                ck.expect(name, shape, FLOAT_DTYPES)?.to_vec::<f32>()?
            }
            WeightSource::Gguf(f) => {
                crate::gguf::native::tensor_f32(f, name, shape, self.head_dim)?
            }
            WeightSource::Dummy { .. } => self.dummy(name, n),
        })
    }

    /// Weights of shapes `[rows_i, k]` stacked along the first dimension, as a [`Linear`] in
    /// mode `quant` (dense: exactly [`Loader::stacked`]; quantised: from the f32 values of
    /// this device's part, so a shard's quantisation groups start at its own first column).
    /// `sel`: the rows (in the device's order, [`qkv_row_order`]) and columns kept.
    fn linear<T: RunDType>(
        &mut self,
        parts: &[(String, Vec<usize>)],
        quant: Quant,
        sel: &Select,
    ) -> Result<Linear<T>> {
        if quant == Quant::Gguf {
            return self.gguf_linear(parts, sel);
        }
        if quant.is_dense() {
            return Ok(Linear::Dense(self.stacked(parts, sel)?));
        }
        let (v, rows, k) = self.selected(parts, sel, |ld, name, shape| ld.host_f32(name, shape))?;
        let lin = linear::quantize_linear(self.stream, &v, rows, k, quant)?;
        self.tick(lin.num_bytes());
        Ok(lin)
    }

    /// The stack of `parts` (each `[rows_i, k]`, or `[rows_i]`), read by `read`, with `sel`
    /// applied: `(values, rows, columns)`. Dummy values are drawn at the selected size
    /// directly (a shard of a 70B preset never makes the whole tensor).
    #[allow(clippy::type_complexity)]
    fn selected<E: Copy>(
        &mut self,
        parts: &[(String, Vec<usize>)],
        sel: &Select,
        read: impl Fn(&mut Self, &str, &[usize]) -> Result<Vec<E>>,
    ) -> Result<(Vec<E>, usize, usize)> {
        let total: usize = parts.iter().map(|(_, s)| s[0]).sum();
        let k = parts[0].1.get(1).copied().unwrap_or(1);
        let rows = sel.rows.map_or(total, |r| r.len());
        let cols = sel.cols.clone().unwrap_or(0..k);
        if matches!(self.src, WeightSource::Dummy { .. }) && !self.shard.is_single() {
            let shape = [rows, cols.len()];
            return Ok((read(self, &parts[0].0, &shape)?, rows, cols.len()));
        }
        let mut v = Vec::new();
        for (name, shape) in parts {
            v.extend(read(self, name, shape)?);
        }
        Ok((sel.apply(v, k), rows, cols.len()))
    }

    /// [`Loader::linear`] in [`Quant::Gguf`]: the stack in
    /// [`stack_form`](crate::gguf::native::stack_form) of its parts' types.
    fn gguf_linear<T: RunDType>(
        &mut self,
        parts: &[(String, Vec<usize>)],
        sel: &Select,
    ) -> Result<Linear<T>> {
        use crate::gguf::native::{self, Form};
        let WeightSource::Gguf(f) = &self.src else {
            return Err(crate::EngineError::invalid(
                "--quant",
                "`gguf` runs a GGUF file's own formats: --model must name a .gguf file",
            ));
        };
        let mut types = Vec::with_capacity(parts.len());
        for (name, _) in parts {
            types.push(f.hf_tensor(name)?.ggml_type);
        }
        let q8 = QuantFormat::Q8_0;
        match native::stack_form(&types) {
            // The file's blocks: on one GPU the stack in `sel.rows`' order; on one rank of
            // several its rows (whole rows of blocks) and, for o and down, its columns, which
            // here fall on whole blocks.
            Form::Native(format) if native::cols_on_blocks(format, sel.cols.as_ref()) => {
                let q = if self.shard.is_single() {
                    native::stacked_host(f, parts, format, sel.rows, self.head_dim)?
                } else {
                    let whole = native::stacked_host(f, parts, format, None, self.head_dim)?;
                    native::select_host(&whole, sel.rows, sel.cols.clone())?
                };
                let w = QuantWeight::upload(self.stream, &q)?;
                self.tick(w.num_bytes());
                Ok(Linear::WeightOnly(w))
            }
            // A rank's columns that cut the file's blocks: its exact values requantised to Q8_0
            // (32-value blocks), or dense (native::shard_notices says which).
            Form::Native(_) if native::cols_on_blocks(q8, sel.cols.as_ref()) => {
                self.linear(parts, Quant::WeightOnly(q8), sel)
            }
            Form::Native(_) | Form::Dense => Ok(Linear::Dense(self.stacked(parts, sel)?)),
        }
    }

    fn tensor<T: RunDType>(
        &mut self,
        name: &str,
        shape: &[usize],
        norm: bool,
    ) -> Result<DeviceTensor<T>> {
        let v = self.host::<T>(name, shape, norm)?;
        let t = DeviceTensor::from_host(self.stream, &v, shape)?;
        self.tick(t.num_bytes());
        Ok(t)
    }

    fn tick(&mut self, bytes: usize) {
        self.done += bytes as u64;
        if let Some(p) = self.progress.as_mut() {
            p(self.done, self.total);
        }
    }

    /// Tensors of shapes `[rows_i, k]` (or `[rows_i]`) stacked along the first dimension,
    /// then `sel` applied ([`Loader::selected`]), in dtype `T`.
    fn stacked<T: RunDType>(
        &mut self,
        parts: &[(String, Vec<usize>)],
        sel: &Select,
    ) -> Result<DeviceTensor<T>> {
        let (v, rows, cols) = self.selected(parts, sel, |ld, name, shape| {
            ld.host::<T>(name, shape, false)
        })?;
        let shape = if parts[0].1.len() == 1 {
            vec![rows]
        } else {
            vec![rows, cols]
        };
        let t = DeviceTensor::from_host(self.stream, &v, &shape)?;
        self.tick(t.num_bytes());
        Ok(t)
    }

    /// A `[n]` bias that only rank 0 of a row-parallel projection adds (the others hold
    /// zeros, so the all-reduce adds it once and every rank runs the same kernels).
    fn row_parallel_bias<T: RunDType>(&mut self, name: &str, n: usize) -> Result<DeviceTensor<T>> {
        if self.shard.rank == 0 {
            self.tensor(name, &[n], false)
        } else {
            let t = DeviceTensor::zeros(self.stream, &[n])?;
            self.tick(t.num_bytes());
            Ok(t)
        }
    }
}

/// Which rows (in the device's order) and columns of a stacked weight one device keeps.
#[derive(Default)]
pub(crate) struct Select<'a> {
    pub rows: Option<&'a [usize]>,
    pub cols: Option<std::ops::Range<usize>>,
}

impl Select<'_> {
    /// `v` (rows of `k` values) with the rows `self.rows` in that order, then the columns
    /// `self.cols` of each.
    pub fn apply<E: Copy>(&self, v: Vec<E>, k: usize) -> Vec<E> {
        let v = match self.rows {
            Some(o) => reorder_rows(&v, k, o),
            None => v,
        };
        match &self.cols {
            Some(c) if c.len() != k => v
                .chunks_exact(k)
                .flat_map(|row| row[c.clone()].iter().copied())
                .collect(),
            _ => v,
        }
    }
}

/// What one rank keeps of each stacked weight ([`Weights::load_shard`]): the QKV rows (the
/// whole model's device order, [`qkv_row_order`], restricted to the rank's heads), the
/// gate|up rows, the o and down columns, the LM head's vocabulary rows.
pub(crate) struct ShardPlan {
    pub qkv_rows: Vec<usize>,
    pub gate_up_rows: Option<Vec<usize>>,
    pub o_cols: Option<std::ops::Range<usize>>,
    pub down_cols: Option<std::ops::Range<usize>>,
    pub vocab_rows: Option<Vec<usize>>,
}

impl ShardPlan {
    /// The plan of `shard` over `cfg` (the whole model's config; [`Shard::check`] first).
    pub fn new(cfg: &ModelConfig, shard: Shard) -> Result<Self> {
        let order = qkv_row_order(cfg)?;
        if shard.is_single() {
            return Ok(ShardPlan {
                qkv_rows: order,
                gate_up_rows: None,
                o_cols: None,
                down_cols: None,
                vocab_rows: None,
            });
        }
        let d = cfg.head_dim;
        let q = shard.q_heads(cfg);
        Ok(ShardPlan {
            qkv_rows: shard.qkv_rows(cfg, &order),
            gate_up_rows: Some(shard.gate_up_rows(cfg)),
            o_cols: Some(q.start * d..q.end * d),
            down_cols: Some(shard.intermediate(cfg)),
            vocab_rows: shard.vocab(cfg).map(|r| r.collect()),
        })
    }

    pub fn qkv(&self) -> Select<'_> {
        Select {
            rows: Some(&self.qkv_rows),
            cols: None,
        }
    }

    pub fn gate_up(&self) -> Select<'_> {
        Select {
            rows: self.gate_up_rows.as_deref(),
            cols: None,
        }
    }

    pub fn o(&self) -> Select<'_> {
        Select {
            rows: None,
            cols: self.o_cols.clone(),
        }
    }

    pub fn down(&self) -> Select<'_> {
        Select {
            rows: None,
            cols: self.down_cols.clone(),
        }
    }
}

fn dummy_chunk(seed: u64) -> Vec<f32> {
    // Sum of four uniforms: roughly normal, std 0.02 after scaling.
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..DUMMY_CHUNK)
        .map(|_| {
            let s = next() + next() + next() + next() - 2.0; // var 4/12
            s * 0.02 / (1.0f32 / 3.0).sqrt()
        })
        .collect()
}

impl<T: RunDType> Weights<T> {
    /// Loads every weight of `cfg` from `src` onto `stream`'s device in dtype `T`, dense
    /// ([`Weights::load_quant`] with [`Quant::None`]).
    ///
    /// Errors: a missing tensor or one of the wrong shape or dtype names the tensor and the
    /// file ([`crate::checkpoint::CheckpointError`]); device allocation failures.
    pub fn load(
        stream: &Arc<CudaStream>,
        cfg: &ModelConfig,
        src: WeightSource<'_>,
        progress: Option<Progress<'_>>,
    ) -> Result<Self> {
        Self::load_quant(stream, cfg, src, Quant::None, progress)
    }

    /// Loads every weight of `cfg` from `src` onto `stream`'s device: the embedding, the LM
    /// head, norms and biases in dtype `T`, each layer's four projections in mode `quant`
    /// (quantised on the host from their f32 values, one stacked weight at a time, rows
    /// split over threads; see [`crate::linear`]).
    ///
    /// [`Quant::Gguf`] takes the file's blocks instead, projection by projection
    /// ([`crate::gguf::native`]).
    ///
    /// Errors: those of [`Weights::load`]; [`EngineError::Invalid`](crate::EngineError::Invalid)
    /// naming `--quant` when the dtype cannot run the mode ([`Quant::check_dtype`]), a
    /// projection's shape does not fit it ([`Quant::check`]), or for [`Quant::Gguf`] from a
    /// source other than a GGUF file.
    pub fn load_quant(
        stream: &Arc<CudaStream>,
        cfg: &ModelConfig,
        src: WeightSource<'_>,
        quant: Quant,
        progress: Option<Progress<'_>>,
    ) -> Result<Self> {
        Self::load_shard(stream, cfg, src, quant, Shard::SINGLE, progress)
    }

    /// [`Weights::load_quant`] for one rank of a tensor-parallel model ([`crate::tp`]): only
    /// `shard`'s part of each weight reaches the device. QKV keeps the rank's q heads and kv
    /// heads, gate|up its intermediate rows, o and down the matching columns (with the biases
    /// of o and down on rank 0 only), the LM head its vocabulary rows when `shard` splits the
    /// vocabulary ([`Shard::vocab`]; the whole LM head otherwise); the embedding and the norms
    /// are whole on every rank. Quantised modes quantise each rank's part, so a group never
    /// straddles two ranks (`quant` is checked against the rank's shapes). `cfg` is the whole
    /// model's config.
    ///
    /// In [`Quant::Gguf`] a rank keeps the file's blocks of its rows and, for o and down, of its
    /// columns where they fall on whole blocks (else its exact values requantised to Q8_0, or
    /// dense: [`crate::gguf::native::shard_notices`]).
    ///
    /// Errors: those of [`Weights::load_quant`]; [`EngineError::Invalid`](crate::EngineError::Invalid)
    /// naming `--tp` when `shard` does not split `cfg` ([`Shard::check`]).
    pub fn load_shard(
        stream: &Arc<CudaStream>,
        cfg: &ModelConfig,
        src: WeightSource<'_>,
        quant: Quant,
        shard: Shard,
        progress: Option<Progress<'_>>,
    ) -> Result<Self> {
        shard.check(cfg)?;
        let local = shard.local_config(cfg);
        quant.check_dtype(<T as fl_kernels::DType>::NAME)?;
        quant.check(&local)?;
        if quant == Quant::Gguf && !matches!(src, WeightSource::Gguf(_)) {
            return Err(crate::EngineError::invalid(
                "--quant",
                "`gguf` runs a GGUF file's own formats: --model must name a .gguf file",
            ));
        }
        let chunk = match src {
            WeightSource::Dummy { seed } => dummy_chunk(seed),
            WeightSource::Checkpoint(_) | WeightSource::Gguf(_) => Vec::new(),
        };
        let total = match (&src, quant) {
            (WeightSource::Gguf(f), Quant::Gguf) => crate::gguf::native::weight_bytes(
                &crate::gguf::native::plan(f, cfg)?,
                cfg,
                std::mem::size_of::<T>(),
            ),
            _ => quant.weight_bytes(&local, std::mem::size_of::<T>()),
        };
        let mut ld = Loader {
            stream,
            src,
            shard,
            head_dim: cfg.head_dim,
            chunk,
            done: 0,
            total,
            progress,
        };
        let (h, q, kv, i, v) = (
            cfg.hidden_size,
            cfg.q_size(),
            cfg.kv_size(),
            cfg.intermediate_size,
            cfg.vocab_size,
        );
        let plan = ShardPlan::new(cfg, shard)?;
        let (qkv_sel, gate_up_sel, o_sel, down_sel) =
            (plan.qkv(), plan.gate_up(), plan.o(), plan.down());
        let embed = ld.tensor("model.embed_tokens.weight", &[v, h], false)?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let a = format!("{p}.self_attn");
            let m = format!("{p}.mlp");
            let part = |what: &str, rows: usize| (format!("{a}.{what}_proj.bias"), vec![rows]);
            let [qkv, o, gate_up, down] = projection_parts(cfg, l);
            let wqkv = ld.linear(&qkv, quant, &qkv_sel)?;
            let bqkv = if cfg.qkv_bias {
                Some(ld.stacked(&[part("q", q), part("k", kv), part("v", kv)], &qkv_sel)?)
            } else {
                None
            };
            layers.push(LayerWeights {
                attn_norm: ld.tensor(&format!("{p}.input_layernorm.weight"), &[h], true)?,
                wqkv,
                bqkv,
                wo: ld.linear(&o, quant, &o_sel)?,
                bo: if cfg.o_bias {
                    Some(ld.row_parallel_bias(&format!("{a}.o_proj.bias"), h)?)
                } else {
                    None
                },
                ffn_norm: ld.tensor(&format!("{p}.post_attention_layernorm.weight"), &[h], true)?,
                w_gate_up: ld.linear(&gate_up, quant, &gate_up_sel)?,
                b_gate_up: if cfg.mlp_bias {
                    Some(ld.stacked(
                        &[
                            (format!("{m}.gate_proj.bias"), vec![i]),
                            (format!("{m}.up_proj.bias"), vec![i]),
                        ],
                        &gate_up_sel,
                    )?)
                } else {
                    None
                },
                w_down: ld.linear(&down, quant, &down_sel)?,
                b_down: if cfg.mlp_bias {
                    Some(ld.row_parallel_bias(&format!("{m}.down_proj.bias"), h)?)
                } else {
                    None
                },
            });
        }
        let final_norm = ld.tensor("model.norm.weight", &[h], true)?;
        let head_name = if cfg.tie_word_embeddings {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        };
        let lm_head = match &plan.vocab_rows {
            // A vocabulary slice: its own tensor, also when tied to the embedding.
            Some(r) => {
                let sel = Select {
                    rows: Some(r),
                    cols: None,
                };
                Some(ld.stacked(&[(head_name.to_string(), vec![v, h])], &sel)?)
            }
            None if cfg.tie_word_embeddings => None,
            None => Some(ld.tensor("lm_head.weight", &[v, h], false)?),
        };
        Ok(Weights {
            embed,
            layers,
            final_norm,
            lm_head,
            quant,
        })
    }
}

/// The parts of layer `l`'s four projections as the loader stacks them: Hugging Face tensor
/// names with their row-major shapes, for `q|k|v`, `o`, `gate|up` and `down`.
pub(crate) fn projection_parts(cfg: &ModelConfig, l: usize) -> [Vec<(String, Vec<usize>)>; 4] {
    let (h, q, kv, i) = (
        cfg.hidden_size,
        cfg.q_size(),
        cfg.kv_size(),
        cfg.intermediate_size,
    );
    let a = format!("model.layers.{l}.self_attn");
    let m = format!("model.layers.{l}.mlp");
    let w = |name: String, rows: usize, k: usize| (name, vec![rows, k]);
    [
        vec![
            w(format!("{a}.q_proj.weight"), q, h),
            w(format!("{a}.k_proj.weight"), kv, h),
            w(format!("{a}.v_proj.weight"), kv, h),
        ],
        vec![w(format!("{a}.o_proj.weight"), h, q)],
        vec![
            w(format!("{m}.gate_proj.weight"), i, h),
            w(format!("{m}.up_proj.weight"), i, h),
        ],
        vec![w(format!("{m}.down_proj.weight"), h, i)],
    ]
}

/// The row order of a layer's stacked QKV weight (and bias) on the device: new row `i` is row
/// `order[i]` of the checkpoint's `[q; k; v]`. Within every q and k head the rotate-half pairs
/// `(e, e + head_dim / 2)` become adjacent rows `(2e, 2e + 1)`
/// ([`rope::rotate_half_to_interleaved_rows`]); v rows keep their place. With
/// [`rope_params`](crate::model::rope_params)' interleaved pairing this computes exactly the
/// checkpoint's attention.
pub fn qkv_row_order(cfg: &ModelConfig) -> Result<Vec<usize>> {
    let d = cfg.head_dim;
    let (hq, hkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let mut order = rope::rotate_half_to_interleaved_rows(hq, d, d)?;
    order.extend(
        rope::rotate_half_to_interleaved_rows(hkv, d, d)?
            .into_iter()
            .map(|r| r + hq * d),
    );
    order.extend((0..hkv * d).map(|r| r + (hq + hkv) * d));
    Ok(order)
}

/// The rows `order` of `v` (rows of `row` elements): row `i` of the result is row `order[i]`
/// of `v` (a permutation, or with fewer entries a selection).
fn reorder_rows<E: Copy>(v: &[E], row: usize, order: &[usize]) -> Vec<E> {
    let mut out = Vec::with_capacity(row * order.len());
    for &r in order {
        out.extend_from_slice(&v[r * row..(r + 1) * row]);
    }
    out
}
