//! The generation loop (FasterLLaMA's Decoding): prefill a ragged batch of prompts packed
//! without padding, then decode one token per sequence per step over the KV cache, the
//! decode step captured once in a CUDA graph and replayed.

use std::sync::Arc;
use std::time::Instant;

use fl_blas::Blas;
use fl_kernels::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use fl_kernels::cudarc::driver::{CudaGraph, CudaStream};
use fl_kernels::{embedding, DeviceTensor, Gpu};
use fl_sampling::{Sampler, SamplerConfig, SamplingParams};

use crate::buffers::Buffers;
use crate::cache::Cache;
use crate::config::ModelConfig;
use crate::dtype::RunDType;
use crate::error::{EngineError, Result};
use crate::linear::Quant;
use crate::model::{AttnMode, Model};
use crate::tp::{Shard, TpComm};
use crate::weights::{Progress, WeightSource, Weights};

/// A model on a GPU with its own stream and cuBLASLt handle.
pub struct Engine<T: RunDType> {
    pub(crate) gpu: Gpu,
    pub(crate) blas: Blas,
    /// The model.
    pub model: Model<T>,
    /// Capture the decode step in a CUDA graph (default on).
    pub use_graph: bool,
}

/// [`EngineError::Invalid`] naming `--quant` for the mode that does not run tensor-parallel
/// yet: W8A8 (its fused norms sit where the all-reduce goes).
pub fn tp_quant_check(quant: Quant) -> Result<()> {
    let why = match quant {
        Quant::W8A8 => "w8a8 does not run tensor-parallel yet (its fused norms sit where the all-reduce goes); use int8, int4, q8_0 or q4_0",
        _ => return Ok(()),
    };
    Err(EngineError::invalid("--quant", why))
}

/// One generation request: prompts (token ids), how many tokens to add, how to sample.
#[derive(Debug, Clone)]
pub struct Request {
    /// One prompt per sequence, each at least one token.
    pub prompts: Vec<Vec<u32>>,
    /// Tokens to generate per sequence at most.
    pub max_new_tokens: usize,
    /// Sampling per sequence (one entry for all, or one per prompt).
    pub sampling: Vec<SamplingParams>,
    /// End ids: a sequence that samples one of them is finished.
    pub end_ids: Vec<u32>,
    /// Keep going after end ids (benchmarks).
    pub ignore_eos: bool,
    /// Teacher forcing: when given, step `s` of sequence `b` is fed `forced[b][s]` instead
    /// of the sampled token (the logits of every step are still produced). Checks use this.
    pub forced: Option<Vec<Vec<u32>>>,
}

/// What a generation produced and how long it took.
#[derive(Debug, Clone, Default)]
pub struct Output {
    /// Generated tokens per sequence (end id included when one was sampled).
    pub tokens: Vec<Vec<u32>>,
    /// Seconds from the prefill's first launch to its first sampled token (GPU waited for).
    pub prefill_s: f64,
    /// Seconds of the decode steps (after the first token), GPU waited for.
    pub decode_s: f64,
    /// Decode steps run after the prefill.
    pub decode_steps: usize,
    /// Whether the decode step ran as a replayed CUDA graph.
    pub graph: bool,
    /// Prompt tokens in the batch.
    pub prompt_tokens: usize,
    /// Sum over decode steps of the KV bytes the attention had to read.
    pub kv_bytes_read: u64,
}

/// What a step hands to the caller's callback.
pub struct Step<'a> {
    /// 0 for the token sampled from the prefill, then 1, 2, ...
    pub index: usize,
    /// This step's token of each sequence (pad id for finished sequences).
    pub tokens: &'a [u32],
    /// This step's logits `[batch, vocab]` as f32, only when asked for.
    pub logits: Option<&'a [f32]>,
}

/// What the callback wants.
#[derive(Debug, Clone, Copy, Default)]
pub struct StepNeeds {
    /// Read this step's tokens back (a sync per step; streaming output needs it).
    pub tokens: bool,
    /// Read this step's logits back too.
    pub logits: bool,
}

impl<T: RunDType> Engine<T> {
    /// Loads `cfg`'s weights from `src` onto device `ordinal` in dtype `T`, dense.
    pub fn load(
        ordinal: usize,
        cfg: ModelConfig,
        src: WeightSource<'_>,
        progress: Option<Progress<'_>>,
    ) -> Result<Self> {
        Self::load_quant(ordinal, cfg, src, Quant::None, progress)
    }

    /// Loads `cfg`'s weights from `src` onto device `ordinal` in dtype `T`, the decoder's
    /// projections quantised per `quant` ([`Weights::load_quant`]).
    ///
    /// Errors: those of [`Engine::load`]; [`EngineError::Invalid`] naming `--quant` for a
    /// mode the dtype or the model's shapes cannot take.
    pub fn load_quant(
        ordinal: usize,
        cfg: ModelConfig,
        src: WeightSource<'_>,
        quant: Quant,
        progress: Option<Progress<'_>>,
    ) -> Result<Self> {
        Self::load_inner(ordinal, cfg, src, quant, None, progress)
    }

    /// Rank `comm.rank()`'s engine of a tensor-parallel model ([`crate::tp`]) on device
    /// `ordinal`: its shard of `cfg`'s weights ([`Weights::load_shard`]) and a model that
    /// all-reduces and all-gathers through `comm` ([`Model::new_shard`]). `cfg` is the whole
    /// model's config; [`Model::cfg`] is then the rank's ([`Shard::local_config`]).
    ///
    /// Errors: those of [`Engine::load_quant`] and [`Model::new_shard`].
    ///
    /// [`Shard::local_config`]: crate::tp::Shard::local_config
    pub fn load_shard(
        ordinal: usize,
        cfg: ModelConfig,
        src: WeightSource<'_>,
        quant: Quant,
        comm: TpComm,
        progress: Option<Progress<'_>>,
    ) -> Result<Self> {
        Self::load_inner(ordinal, cfg, src, quant, Some(comm), progress)
    }

    fn load_inner(
        ordinal: usize,
        cfg: ModelConfig,
        src: WeightSource<'_>,
        quant: Quant,
        comm: Option<TpComm>,
        progress: Option<Progress<'_>>,
    ) -> Result<Self> {
        cfg.validate()?;
        let shard = match &comm {
            Some(c) => Shard::new(c.rank(), c.size())?,
            None => Shard::SINGLE,
        };
        shard.check(&cfg)?;
        let local = shard.local_config(&cfg);
        quant.check_dtype(<T as fl_kernels::DType>::NAME)?;
        quant.check(&local)?;
        if !shard.is_single() {
            tp_quant_check(quant)?;
        }
        let base = Gpu::new(ordinal)?;
        // One stream, so cudarc's cross-stream event tracking only costs time, and its
        // event waits are not allowed inside a graph capture.
        // SAFETY: called before any buffer of this context is allocated by the engine; every
        // buffer below is used on the engine's one stream only.
        unsafe { base.context().disable_event_tracking() };
        let gpu = base.with_new_stream()?;
        let need = quant.weight_bytes(&local, std::mem::size_of::<T>());
        let (free, _) = fl_kernels::cudarc::driver::result::mem_get_info()?;
        if need as u128 > free as u128 {
            return Err(EngineError::invalid(
                "--model",
                format!(
                    "the weights need {:.2} GB in {} (--quant {quant}{}), the GPU has {:.2} GB free",
                    need as f64 / 1e9,
                    <T as fl_kernels::DType>::NAME,
                    if shard.is_single() {
                        String::new()
                    } else {
                        format!(", rank {} of --tp {}", shard.rank, shard.size)
                    },
                    free as f64 / 1e9
                ),
            ));
        }
        let weights = Weights::<T>::load_shard(gpu.stream(), &cfg, src, quant, shard, progress)?;
        let model = match comm {
            Some(c) => Model::new_shard(&cfg, weights, shard, c)?,
            None => Model::new(cfg, weights)?,
        };
        let blas = Blas::new(&gpu)?;
        gpu.synchronize()?;
        Ok(Engine {
            gpu,
            blas,
            model,
            use_graph: true,
        })
    }

    /// The GPU handle (the engine's stream).
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    fn stream(&self) -> &Arc<CudaStream> {
        self.gpu.stream()
    }

    /// Checks a request against the model before any work: empty prompts, ids outside the
    /// vocabulary, prompt + new tokens past the context, a batch whose cache and buffers do
    /// not fit in free GPU memory. Returns the cache capacity (positions per sequence).
    pub fn check(&self, req: &Request) -> Result<usize> {
        let cfg = &self.model.cfg;
        if req.prompts.is_empty() {
            return Err(EngineError::invalid("--prompt", "no prompts"));
        }
        for (b, p) in req.prompts.iter().enumerate() {
            if p.is_empty() {
                return Err(EngineError::invalid(
                    "--prompt",
                    format!("prompt {b} is empty (needs at least one token)"),
                ));
            }
            if let Some(&id) = p.iter().find(|&&id| id as usize >= cfg.vocab_size) {
                return Err(EngineError::invalid(
                    "--prompt",
                    format!(
                        "prompt {b} has token id {id} >= vocab_size {}",
                        cfg.vocab_size
                    ),
                ));
            }
        }
        let n = req.sampling.len();
        if n != 1 && n != req.prompts.len() {
            return Err(EngineError::invalid(
                "sampling",
                format!(
                    "{n} entries for {} prompts (give 1 or one each)",
                    req.prompts.len()
                ),
            ));
        }
        if let Some(f) = &req.forced {
            if f.len() != req.prompts.len()
                || f.iter()
                    .any(|s| s.len() < req.max_new_tokens.saturating_sub(1))
            {
                return Err(EngineError::invalid(
                    "forced",
                    "needs one list per prompt of at least max_new_tokens - 1 ids",
                ));
            }
        }
        let longest = req.prompts.iter().map(Vec::len).max().unwrap_or(0);
        let capacity = longest + req.max_new_tokens;
        if capacity > cfg.max_position_embeddings {
            return Err(EngineError::invalid(
                "--prompt-len",
                format!(
                    "prompt of {longest} tokens + {} new tokens = {capacity} is longer than the \
                     model's context ({} positions)",
                    req.max_new_tokens, cfg.max_position_embeddings
                ),
            ));
        }
        let batch = req.prompts.len();
        let total: usize = req.prompts.iter().map(Vec::len).sum();
        let tsize = std::mem::size_of::<T>() as u64;
        let kv = cfg.kv_cache_bytes_per_token(tsize as usize) * (batch * capacity) as u64;
        let per_token = (4 * cfg.hidden_size
            + 3 * cfg.q_size()
            + 2 * cfg.kv_size()
            + 3 * cfg.intermediate_size) as u64
            * tsize
            + 32;
        let quant = self.model.weights.quant;
        let bufs = per_token * (total + batch) as u64
            + 2 * (batch * cfg.vocab_size) as u64 * 4
            + quant.buffer_bytes(cfg, total, tsize as usize)
            + quant.buffer_bytes(cfg, batch, tsize as usize);
        // Memory freed by an earlier run goes back to the driver at a synchronisation; wait
        // so the free figure is the real one.
        self.gpu.synchronize()?;
        let (free, _) = fl_kernels::cudarc::driver::result::mem_get_info()?;
        let need = kv + bufs + (64 << 20);
        if need > free as u64 {
            return Err(EngineError::invalid(
                "--batch",
                format!(
                    "batch {batch} x {capacity} positions needs {:.2} GB (KV cache {:.2} GB), \
                     the GPU has {:.2} GB free",
                    need as f64 / 1e9,
                    kv as f64 / 1e9,
                    free as f64 / 1e9
                ),
            ));
        }
        Ok(capacity)
    }

    /// Runs `req`: prefill, then decode until every sequence has finished or produced
    /// `max_new_tokens`. `on_step` sees each step (tokens and logits only when `needs`
    /// asks); returning `false` stops early.
    pub fn generate(
        &mut self,
        req: &Request,
        needs: StepNeeds,
        on_step: &mut dyn FnMut(Step<'_>) -> bool,
    ) -> Result<Output> {
        let capacity = self.check(req)?;
        let cfg = self.model.cfg.clone();
        let stream = self.stream().clone();
        let batch = req.prompts.len();
        let lens: Vec<usize> = req.prompts.iter().map(Vec::len).collect();
        let total: usize = lens.iter().sum();
        let mut cache = Cache::<T>::new(&stream, &cfg, batch, capacity)?;
        let sampling: Vec<SamplingParams> = if req.sampling.len() == 1 {
            vec![req.sampling[0]; batch]
        } else {
            req.sampling.clone()
        };
        let pad = req.end_ids.first().copied().unwrap_or(0) as i32;
        let scfg = SamplerConfig {
            end_ids: if req.ignore_eos {
                Vec::new()
            } else {
                req.end_ids.iter().map(|&e| e as i32).collect()
            },
            pad_id: pad,
            max_history: if sampling.iter().any(|p| p.has_penalties()) {
                capacity
            } else {
                0
            },
        };
        let mut sampler = Sampler::new(&stream, &sampling, cfg.vocab_size, &scfg)?;
        let mut logits = DeviceTensor::<T>::zeros(&stream, &[batch, cfg.vocab_size])?;
        let mut out = Output {
            tokens: vec![Vec::new(); batch],
            prompt_tokens: total,
            ..Default::default()
        };
        let mut finished = vec![false; batch];
        let mut host_tokens = vec![0u32; batch];
        let mut host_logits: Vec<f32> = Vec::new();
        let is_end = |t: u32| !req.ignore_eos && req.end_ids.contains(&t);

        // ---- prefill: all prompts packed, no padding.
        self.gpu.synchronize()?;
        let t0 = Instant::now();
        let mut dbuf = self
            .model
            .buffers(&stream, batch, &cache, AttnMode::Decode)?;
        {
            let mode = AttnMode::Prefill {
                max_len: *lens.iter().max().unwrap_or(&1),
            };
            let mut pbuf = self.model.buffers(&stream, total, &cache, mode)?;
            let mut ids = Vec::with_capacity(total);
            let mut pos = Vec::with_capacity(total);
            let mut seq = Vec::with_capacity(total);
            let mut last = Vec::with_capacity(batch);
            for (b, p) in req.prompts.iter().enumerate() {
                ids.extend(p.iter().map(|&t| t as i32));
                pos.extend(0..p.len() as i32);
                seq.extend(std::iter::repeat_n(b as i32, p.len()));
                last.push(ids.len() as i32 - 1);
            }
            pbuf.upload(&stream, Some(&ids), &pos, Some(&seq))?;
            let mut cu = vec![0i32];
            for &l in &lens {
                cu.push(cu[cu.len() - 1] + l as i32);
            }
            pbuf.cu_seqlens.copy_from_host(&stream, &cu)?;
            self.model
                .forward(&stream, &mut self.blas, &mut pbuf, &mut cache, mode)?;
            // The last token of each sequence: a gather of rows of the normed states.
            let last_ids = DeviceTensor::from_host(&stream, &last, &[batch])?;
            embedding::lookup(&stream, &last_ids, &pbuf.x, &mut dbuf.x, &mut dbuf.status)?;
            self.model
                .lm_head(&stream, &mut self.blas, &dbuf.x, &mut logits)?;
            pbuf.status.check(&stream)?;
        }
        if needs.logits {
            read_logits(&stream, &logits, &mut host_logits)?;
        }
        // Step 0 is always sampled; teacher forcing starts with step 1's input.
        sampler.step(&stream, &mut logits, &mut dbuf.ids)?;
        self.gpu.synchronize()?;
        out.prefill_s = t0.elapsed().as_secs_f64();
        let mut keep = self.deliver(
            0,
            &stream,
            &dbuf.ids,
            needs,
            &mut host_tokens,
            &host_logits,
            &mut finished,
            &mut out,
            &is_end,
            on_step,
        )?;

        // ---- decode.
        let steps = req.max_new_tokens.saturating_sub(1);
        let seq_rows: Vec<i32> = (0..batch as i32).collect();
        let mut graph: Option<CudaGraph> = None;
        let kv_token = cfg.kv_cache_bytes_per_token(std::mem::size_of::<T>());
        let t1 = Instant::now();
        for s in 1..=steps {
            if !keep || (!req.ignore_eos && finished.iter().all(|&f| f)) {
                break;
            }
            let pos: Vec<i32> = lens.iter().map(|&l| (l + s - 1) as i32).collect();
            let forced: Option<Vec<i32>> = req
                .forced
                .as_ref()
                .map(|f| f.iter().map(|seq| seq[s - 1] as i32).collect());
            let rows = (s == 1).then_some(seq_rows.as_slice());
            dbuf.upload(&stream, forced.as_deref(), &pos, rows)?;
            out.kv_bytes_read += pos.iter().map(|&p| (p as u64 + 1) * kv_token).sum::<u64>();
            if self.use_graph && s >= 2 && graph.is_none() {
                graph = self.capture(&mut dbuf, &mut cache, &mut logits)?;
                out.graph = graph.is_some();
            }
            match &graph {
                Some(g) => g.launch()?,
                None => {
                    self.model.forward(
                        &stream,
                        &mut self.blas,
                        &mut dbuf,
                        &mut cache,
                        AttnMode::Decode,
                    )?;
                    self.model
                        .lm_head(&stream, &mut self.blas, &dbuf.x, &mut logits)?;
                }
            }
            if needs.logits {
                read_logits(&stream, &logits, &mut host_logits)?;
            }
            sampler.step(&stream, &mut logits, &mut dbuf.ids)?;
            out.decode_steps += 1;
            keep = self.deliver(
                s,
                &stream,
                &dbuf.ids,
                needs,
                &mut host_tokens,
                &host_logits,
                &mut finished,
                &mut out,
                &is_end,
                on_step,
            )?;
        }
        self.gpu.synchronize()?;
        out.decode_s = t1.elapsed().as_secs_f64();
        dbuf.status.check(&stream)?;
        Ok(out)
    }

    /// Captures one decode step (forward + LM head) on the engine's stream. `Ok(None)` when
    /// the driver refuses the capture (the loop then runs eagerly).
    fn capture(
        &mut self,
        dbuf: &mut Buffers<T>,
        cache: &mut Cache<T>,
        logits: &mut DeviceTensor<T>,
    ) -> Result<Option<CudaGraph>> {
        let stream = self.stream().clone();
        let (model, blas) = (&self.model, &mut self.blas);
        capture_graph(&stream, |s| {
            model.forward(s, blas, dbuf, cache, AttnMode::Decode)?;
            model.lm_head(s, blas, &dbuf.x, logits)
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn deliver(
        &self,
        index: usize,
        stream: &Arc<CudaStream>,
        ids: &DeviceTensor<i32>,
        needs: StepNeeds,
        host_tokens: &mut [u32],
        host_logits: &[f32],
        finished: &mut [bool],
        out: &mut Output,
        is_end: &dyn Fn(u32) -> bool,
        on_step: &mut dyn FnMut(Step<'_>) -> bool,
    ) -> Result<bool> {
        if !(needs.tokens || needs.logits) {
            return Ok(true);
        }
        let t = ids.to_host(stream)?;
        for (b, &id) in t.iter().enumerate() {
            host_tokens[b] = id as u32;
            if !finished[b] {
                out.tokens[b].push(id as u32);
                finished[b] = is_end(id as u32);
            }
        }
        Ok(on_step(Step {
            index,
            tokens: host_tokens,
            logits: if needs.logits {
                Some(host_logits)
            } else {
                None
            },
        }))
    }

    /// Device-to-device copy bandwidth in bytes/s (a 1 GiB copy, best of 5): the floor's
    /// denominator, measured on the same GPU in the same run.
    pub fn copy_bandwidth(&self) -> Result<f64> {
        let stream = self.stream();
        let n = 1usize << 30;
        let src = DeviceTensor::<u8>::filled(stream, &[n], 1)?;
        let mut dst = DeviceTensor::<u8>::zeros(stream, &[n])?;
        let mut best = f64::MAX;
        for _ in 0..5 {
            let ms = fl_kernels::time_on_stream(stream, || {
                stream.memcpy_dtod(src.as_slice(), dst.as_slice_mut())?;
                Ok(())
            })?;
            best = best.min(ms);
        }
        // A copy reads and writes every byte.
        Ok(2.0 * n as f64 / (best * 1e-3))
    }
}

fn read_logits<T: RunDType>(
    stream: &Arc<CudaStream>,
    logits: &DeviceTensor<T>,
    host: &mut Vec<f32>,
) -> Result<()> {
    let v = logits.to_host(stream)?;
    host.clear();
    host.extend(v.into_iter().map(|x| x.to_f32()));
    Ok(())
}

/// Captures `body` on `stream` into a CUDA graph (nothing runs) and uploads it. `Ok(None)`
/// when the driver refuses the capture: the caller then runs the step eagerly.
pub(crate) fn capture_graph(
    stream: &Arc<CudaStream>,
    body: impl FnOnce(&Arc<CudaStream>) -> Result<()>,
) -> Result<Option<CudaGraph>> {
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let res = body(stream);
    let g = stream.end_capture(CUgraphInstantiate_flags(0));
    match (res, g) {
        (Ok(()), Ok(Some(g))) => {
            g.upload()?;
            Ok(Some(g))
        }
        // The capture was invalidated under the body (e.g. another thread of the process
        // synchronised the device or freed memory while it ran: CUDA 901, "operation failed
        // due to a previous error during capture"); nothing was executed, so the step runs
        // eagerly, where a genuine argument error shows again.
        (Err(e), Err(c)) => {
            eprintln!("fl: CUDA graph capture invalidated ({e}; {c}); running without a graph");
            Ok(None)
        }
        (Err(e), _) => Err(e),
        (Ok(()), Ok(None)) => Ok(None),
        (Ok(()), Err(e)) => {
            eprintln!("fl: CUDA graph capture failed ({e}); running without a graph");
            Ok(None)
        }
    }
}
