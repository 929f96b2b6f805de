//! The model runner: executes the scheduler's step plans on the GPU.
//!
//! ```text
//! add_request ──> Scheduler ──schedule()──> StepPlan ──> Runner::step ──> forward (AttnMode::Paged)
//!                     ^                                        │           lm_head (rows with logits)
//!                     └────────── update(plan, tokens) <───────┘           sample (per-row params)
//! ```
//! One [`Runner::step`] runs every scheduled chunk (prefill chunks and decode tokens of any
//! number of requests) as one forward pass over the paged KV cache, samples a token for each
//! row that needs logits with that request's own [`SamplingParams`] (Philox keyed by the
//! request's seed and its token index, so a request's tokens do not depend on its batch
//! mates), and returns the scheduler's [`Event`]s.
//!
//! A step of single tokens (every decode step once the prompts are in) runs the decode
//! attention over the paged cache; a step with a longer chunk runs every row through the paged
//! prefill attention.
//!
//! What this first runner does not do yet (issue 31): CUDA graphs per batch bucket (decode
//! steps run eagerly), the fused RoPE + append in the QKV GEMV on the paged path, decode rows
//! of mixed steps on the decode kernel, logits processors (penalties), copy-on-write copies
//! (no scheduler API forks yet: a plan with copies is an error).

use std::collections::HashMap;

use fl_kernels::embedding;
use fl_kernels::DeviceTensor;
use fl_sampling::{DeviceParams, SampleOptions, SampleWorkspace, SamplingParams};

use crate::buffers::Buffers;
use crate::cache::Cache;
use crate::dtype::RunDType;
use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::kv;
use crate::model::AttnMode;
use crate::scheduler::{Event, Request, Scheduler, SchedulerConfig, StepPlan};

/// How a [`Runner`] sizes its KV pool and its steps.
#[derive(Clone, Debug)]
pub struct RunnerConfig {
    /// Fraction of the GPU memory free after the weights (and a reserve for activations)
    /// that the KV pool takes, in `(0, 1]`.
    pub kv_memory: f64,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Token budget of one step.
    pub max_batched_tokens: usize,
    /// Sequences per step.
    pub max_num_seqs: usize,
    /// Longest sequence (prompt + generated); `None`: the model's context length.
    pub max_model_len: Option<usize>,
    /// Reuse the KV blocks of shared prompt prefixes.
    pub enable_prefix_cache: bool,
    /// KV blocks in the pool, overriding `kv_memory` (tests, or a fixed budget).
    pub num_blocks: Option<usize>,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig {
            kv_memory: 0.9,
            block_size: 16,
            max_batched_tokens: 8192,
            max_num_seqs: 256,
            max_model_len: None,
            enable_prefix_cache: true,
            num_blocks: None,
        }
    }
}

/// What [`Runner::run_to_completion`] returns: each request's generated tokens, and every
/// event in order.
pub type Completion = (HashMap<u64, Vec<u32>>, Vec<Event>);

/// A model with a paged KV cache and a scheduler: requests in, events out.
pub struct Runner<'e, T: RunDType> {
    engine: &'e mut Engine<T>,
    sched: Scheduler<SamplingParams>,
    cache: Cache<T>,
    /// Activation buffers per (token-count bucket, decode-only pass): a step's tokens are
    /// padded up to a power of two with rows that write nothing.
    buffers: HashMap<(usize, bool), Buffers<T>>,
    workspace: SampleWorkspace,
    last: StepStats,
}

/// What the last [`Runner::step`] ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepStats {
    /// Prompt tokens computed (prefill chunks).
    pub prefill_tokens: usize,
    /// Decode tokens computed.
    pub decode_tokens: usize,
    /// Sequences in the step.
    pub seqs: usize,
}

/// Activation rows of a step of `m` tokens: the next power of two.
fn bucket(m: usize) -> usize {
    m.next_power_of_two()
}

impl<'e, T: RunDType> Runner<'e, T> {
    /// Borrows a loaded engine (its model, stream and cuBLASLt handle) for as long as the
    /// runner lives: sizes the KV pool (`cfg.num_blocks`, else `cfg.kv_memory` of
    /// the free memory after reserving the activations of a full step) and the scheduler.
    ///
    /// Errors: [`EngineError::Invalid`] naming `kv_memory`, `block_size`, `max_batched_tokens`
    /// or `max_model_len`; the scheduler's configuration errors; allocation errors.
    pub fn new(engine: &'e mut Engine<T>, cfg: &RunnerConfig) -> Result<Self> {
        let mcfg = engine.model.cfg.clone();
        let max_model_len = cfg.max_model_len.unwrap_or(mcfg.max_position_embeddings);
        if max_model_len == 0 || max_model_len > mcfg.max_position_embeddings {
            return Err(EngineError::invalid(
                "max_model_len",
                format!(
                    "{max_model_len} outside 1..={} (the model's context)",
                    mcfg.max_position_embeddings
                ),
            ));
        }
        if cfg.block_size == 0 || cfg.max_batched_tokens == 0 || cfg.max_num_seqs == 0 {
            return Err(EngineError::invalid(
                "block_size",
                "block_size, max_batched_tokens and max_num_seqs must be at least 1",
            ));
        }
        let stream = engine.gpu.stream().clone();
        let max_blocks_per_seq = max_model_len.div_ceil(cfg.block_size);
        let num_blocks = match cfg.num_blocks {
            Some(n) => n,
            None => {
                // Reserve the activations of the largest step by allocating its buffers first.
                let probe = Cache::<T>::new_paged(
                    &stream,
                    &mcfg,
                    1,
                    cfg.block_size,
                    cfg.max_num_seqs,
                    max_blocks_per_seq,
                )?;
                let mode = AttnMode::Paged { max_q_len: 1 };
                let m = bucket(cfg.max_batched_tokens);
                let reserve = engine.model.buffers(&stream, m, &probe, mode)?;
                let (free, _) = fl_kernels::cudarc::driver::result::mem_get_info()?;
                drop(reserve);
                let per_block = kv::bytes_per_block(
                    mcfg.num_hidden_layers as u64,
                    mcfg.num_key_value_heads as u64,
                    mcfg.head_dim as u64,
                    std::mem::size_of::<T>() as u64,
                    cfg.block_size as u64,
                );
                kv::blocks_for_memory(free as u64, cfg.kv_memory, per_block)
                    .map_err(|e| EngineError::invalid("kv_memory", e.to_string()))?
                    as usize
            }
        };
        let cache = Cache::<T>::new_paged(
            &stream,
            &mcfg,
            num_blocks,
            cfg.block_size,
            cfg.max_num_seqs,
            max_blocks_per_seq,
        )?;
        let sched = Scheduler::new(SchedulerConfig {
            max_batched_tokens: cfg.max_batched_tokens,
            max_num_seqs: cfg.max_num_seqs,
            block_size: cfg.block_size,
            num_blocks,
            max_model_len,
            enable_prefix_cache: cfg.enable_prefix_cache,
            chunked_prefill: true,
            vocab_size: Some(mcfg.vocab_size as u32),
        })?;
        let workspace = SampleWorkspace::new(&stream, cfg.max_num_seqs, mcfg.vocab_size)?;
        Ok(Runner {
            engine,
            sched,
            cache,
            buffers: HashMap::new(),
            workspace,
            last: StepStats::default(),
        })
    }

    /// The scheduler (queue lengths, KV statistics, preemptions).
    pub fn scheduler(&self) -> &Scheduler<SamplingParams> {
        &self.sched
    }

    /// The engine (model, GPU).
    pub fn engine(&self) -> &Engine<T> {
        self.engine
    }

    /// Queues a request; its `params.sampling.seed` and `request_id` are set from the
    /// request's `seed` and `id`. Errors name the field ([`crate::scheduler::RequestError`]).
    pub fn add_request(&mut self, mut req: Request<SamplingParams>) -> Result<()> {
        req.params.sampling.seed = req.params.seed;
        req.params.sampling.request_id = req.id;
        self.sched.add_request(req)?;
        Ok(())
    }

    /// Aborts a request: its blocks are freed; returns its [`Event::Finished`].
    pub fn abort(&mut self, id: u64) -> Result<Event> {
        Ok(self.sched.abort(id)?)
    }

    /// What the last [`Runner::step`] ran.
    pub fn last_step(&self) -> StepStats {
        self.last
    }

    /// Whether any request is waiting or running.
    pub fn has_unfinished(&self) -> bool {
        self.sched.has_unfinished()
    }

    /// Schedules and runs one step; returns its events (empty when nothing is queued).
    /// Waits for the GPU once, to read the sampled tokens.
    pub fn step(&mut self) -> Result<Vec<Event>> {
        let plan = self.sched.schedule()?;
        self.last = StepStats {
            prefill_tokens: plan.num_prefill_tokens,
            decode_tokens: plan.num_decode_tokens,
            seqs: plan.seqs.len(),
        };
        if plan.seqs.is_empty() {
            return Ok(self.sched.update(&plan, &[])?);
        }
        let sampled = match self.execute(&plan) {
            Ok(s) => s,
            Err(e) => {
                // Leave the scheduler consistent: abort every request of the failed step.
                let ids: Vec<u64> = plan.seqs.iter().map(|s| s.id).collect();
                for id in ids {
                    let _ = self.sched.abort(id);
                }
                return Err(e);
            }
        };
        Ok(self.sched.update(&plan, &sampled)?)
    }

    /// Runs `plan` on the GPU: one paged forward pass, the LM head on the rows that need
    /// logits, sampling. Returns `(request, token)` per such row.
    fn execute(&mut self, plan: &StepPlan) -> Result<Vec<(u64, u32)>> {
        if !plan.copies.is_empty() {
            return Err(EngineError::invalid(
                "plan.copies",
                "copy-on-write block copies are not executed by this runner yet",
            ));
        }
        let stream = self.engine.gpu.stream().clone();
        let cfg = &self.engine.model.cfg;
        let (hidden, vocab) = (cfg.hidden_size, cfg.vocab_size);
        let m = plan.num_scheduled_tokens;
        let width = self.cache.max_blocks_per_seq();
        let padded = bucket(m);
        let (mut ids, mut pos, mut row) = (
            Vec::with_capacity(padded),
            Vec::with_capacity(padded),
            Vec::with_capacity(padded),
        );
        let (mut cu, mut ctx, mut table) = (vec![0i32], vec![], vec![]);
        let (mut last_rows, mut logit_ids, mut params, mut steps) =
            (vec![], vec![], vec![], vec![]);
        let mut max_q_len = 1;
        for (r, s) in plan.seqs.iter().enumerate() {
            let n = s.token_ids.len();
            ids.extend(s.token_ids.iter().map(|&t| t as i32));
            pos.extend(s.positions().map(|p| p as i32));
            row.extend(std::iter::repeat_n(r as i32, n));
            cu.push(ids.len() as i32);
            ctx.push((s.num_computed_tokens + n) as i32);
            if s.block_table.len() > width {
                return Err(EngineError::invalid(
                    "plan.block_table",
                    format!(
                        "{} blocks, the cache holds {width} per sequence",
                        s.block_table.len()
                    ),
                ));
            }
            table.extend(s.block_table.iter().map(|&b| b as i32));
            table.extend(std::iter::repeat_n(-1, width - s.block_table.len()));
            max_q_len = max_q_len.max(n);
            if s.needs_logits {
                last_rows.push(ids.len() as i32 - 1);
                logit_ids.push(s.id);
                let p = self.sched.params(s.id).ok_or_else(|| {
                    EngineError::invalid("plan.seqs", format!("request {} is unknown", s.id))
                })?;
                params.push(p.sampling);
                steps.push(s.num_generated as i32);
            }
        }
        // Padding rows: token 0 at position -1 of sequence 0, which writes no K/V, is in no
        // sequence's range and sees no key.
        ids.resize(padded, 0);
        pos.resize(padded, -1);
        row.resize(padded, 0);
        // A step of single tokens (decodes, one-token prompts) runs the decode attention over
        // the paged cache, token b being sequence b; others the paged prefill attention.
        let decode = max_q_len == 1;
        let mode = if decode {
            AttnMode::Decode
        } else {
            AttnMode::Paged { max_q_len }
        };
        let model = &self.engine.model;
        let key = (padded, decode);
        if !self.buffers.contains_key(&key) {
            let b = model.buffers(&stream, padded, &self.cache, mode)?;
            self.buffers.insert(key, b);
        }
        let buf = self.buffers.get_mut(&key).expect("inserted above");
        buf.upload(&stream, Some(&ids), &pos, Some(&row))?;
        buf.upload_paged(&stream, &cu, &ctx, &table)?;
        model.forward(&stream, &mut self.engine.blas, buf, &mut self.cache, mode)?;
        let r = last_rows.len();
        if r == 0 {
            buf.status.check(&stream)?;
            return Ok(vec![]);
        }
        let rows = DeviceTensor::from_host(&stream, &last_rows, &[r])?;
        let mut x = DeviceTensor::<T>::zeros(&stream, &[r, hidden])?;
        embedding::lookup(&stream, &rows, &buf.x, &mut x, &mut buf.status)?;
        let mut logits = DeviceTensor::<T>::zeros(&stream, &[r, vocab])?;
        model.lm_head(&stream, &mut self.engine.blas, &x, &mut logits)?;
        let dparams = DeviceParams::new(&stream, &params)?;
        let steps = DeviceTensor::from_host(&stream, &steps, &[r])?;
        let opts = SampleOptions {
            steps: Some(&steps),
            ..Default::default()
        };
        let mut tokens = DeviceTensor::<i32>::zeros(&stream, &[r])?;
        fl_sampling::sample(
            &stream,
            &logits,
            &dparams,
            &opts,
            &mut tokens,
            &mut self.workspace,
        )?;
        let host = tokens.to_host(&stream)?;
        buf.status.check(&stream)?;
        Ok(logit_ids
            .into_iter()
            .zip(host)
            .map(|(id, t)| (id, t as u32))
            .collect())
    }

    /// Steps until every queued request is finished; returns each request's generated tokens
    /// (in the order they finished) and all events.
    pub fn run_to_completion(&mut self) -> Result<Completion> {
        let mut out: HashMap<u64, Vec<u32>> = HashMap::new();
        let mut events = Vec::new();
        while self.has_unfinished() {
            for e in self.step()? {
                if let Event::Token { id, token } = e {
                    out.entry(id).or_default().push(token);
                }
                events.push(e);
            }
        }
        Ok((out, events))
    }
}
