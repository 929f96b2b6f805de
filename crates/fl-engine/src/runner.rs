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
//! How a step runs:
//! - a step of single tokens (every decode step once the prompts are in) runs the decode
//!   attention over the paged cache, the QKV GEMV rotating and appending to the paged cache in
//!   its epilogue (f16 / bf16), and the LM head over every row; forward + LM head are captured
//!   per power-of-two row bucket (1, 2, 4, ... up to `max_num_seqs`) and attention bound in
//!   a CUDA graph on the pair's second use and replayed after that (the attention's split
//!   layout covers the bound, the next power of two from 256 above the longest context, so a
//!   graph stays valid until a sequence passes its bound);
//! - a step with a longer chunk runs every row through the paged prefill attention (prefix
//!   from the cache, the chunk causal), then gathers the rows that need logits;
//! - copy-on-write block copies of the plan run first ([`fl_kernels::kv_cache::copy_blocks`]);
//! - penalties (over each request's generated tokens) and the end-id ban under
//!   `min_new_tokens` run on the logits when some row has them, then each row is sampled with
//!   its own parameters;
//! - [`RequestOptions`] adds teacher forcing and logits read-back per request (checks
//!   against another implementation: `fl logits`).
//!
//! Not yet: the decode rows of a mixed step run through the prefill attention (correct, slower
//! than the decode kernel for long contexts); the paged prefill attention is the mma.sync
//! kernel (the Hopper wgmma kernel reads packed K/V only).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use fl_kernels::cudarc::driver::{CudaEvent, CudaGraph, CudaStream, PinnedHostSlice};
use fl_kernels::{embedding, kv_cache, DeviceTensor};
use fl_sampling::{
    BeamRequests, BeamTopkWorkspace, DeviceParams, History, PenaltyWorkspace, Processors,
    SampleOptions, SampleWorkspace, SamplingParams, BEAM_MAX_KEEP,
};

use crate::beam::{BeamParams, BeamState};
use crate::buffers::Buffers;
use crate::cache::Cache;
use crate::dtype::RunDType;
use crate::engine::{capture_graph, Engine};
use crate::error::{EngineError, Result};
use crate::kv;
use crate::model::AttnMode;
use crate::scheduler::{
    BeamStep, Event, FinishReason, Request, RequestId, Scheduler, SchedulerConfig, StepPlan,
    MAX_TOP_LOGPROBS,
};

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
    /// Most prompt tokens (all requests together) in a step that also decodes
    /// ([`SchedulerConfig::max_prefill_tokens_beside_decodes`]); `None`: the step's budget.
    pub max_prefill_tokens_beside_decodes: Option<usize>,
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
            max_prefill_tokens_beside_decodes: None,
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
    passes: HashMap<(usize, bool), PassBuffers<T>>,
    /// The LM head's and the sampler's buffers per row bucket.
    heads: HashMap<usize, Head<T>>,
    workspace: SampleWorkspace,
    penalty_ws: Option<PenaltyWorkspace>,
    /// Teacher forcing and logits read-back, per request that asked.
    extras: HashMap<RequestId, Extras>,
    /// Beam requests: the search of each running one, the hypotheses of each finished one
    /// until taken.
    beams: HashMap<RequestId, BeamState>,
    beam_results: HashMap<RequestId, Vec<(Vec<u32>, f64)>>,
    beam_ws: Option<BeamBuffers>,
    /// A lookahead step queued on the GPU behind the one being collected.
    inflight: Option<Launched>,
    /// Which of the two sets of host staging buffers the next launch uses.
    parity: usize,
    /// Per parity: recorded after the launch's token read-back.
    done: [CudaEvent; 2],
    last: StepStats,
}

/// A step queued on the GPU, to be collected.
struct Launched {
    plan: StepPlan,
    heads: Vec<LogitRow>,
    /// Head row of each of `heads`.
    slot: Vec<usize>,
    /// Head rows (bucket) and the pass's key.
    rows: usize,
    key: (usize, bool),
    decode: bool,
    graph: bool,
    chained: bool,
    beam_groups: Vec<(RequestId, usize, usize)>,
    parity: usize,
}

/// The beam step's device buffers, sized for a full row bucket.
struct BeamBuffers {
    ws: BeamTopkWorkspace,
    rows: usize,
    scores: DeviceTensor<f32>,
    req_start: DeviceTensor<i32>,
    keep: DeviceTensor<i32>,
    out_scores: DeviceTensor<f32>,
    out_ids: DeviceTensor<i32>,
}

/// A pass's buffers and, for a decode bucket, the CUDA graphs of its forward + LM head, one
/// per attention bound ([`decode_bound`]).
struct PassBuffers<T: RunDType> {
    buf: Buffers<T>,
    graphs: HashMap<usize, CudaGraph>,
    /// Decode passes: the block table on the device (uploaded again only when it changes;
    /// the sequence rows are `0..m`, uploaded once).
    table: Vec<i32>,
    /// Decode passes: page-locked staging of the ids, positions and visible lengths (a copy
    /// from pageable memory costs a staging copy in the driver on every step), one set per
    /// parity (a step and its lookahead step may be in flight).
    staging: Option<[[PinnedHostSlice<i32>; 3]; 2]>,
    /// Eager runs so far per attention bound (a decode bucket is captured on its second use
    /// under a bound, after module loading and cuBLASLt's first plans).
    runs: HashMap<usize, usize>,
}

/// The rows that get logits and a token, `rows` of them (a power of two; padding rows
/// gather row 0 and are sampled greedily, their tokens dropped).
struct Head<T: RunDType> {
    /// Which activation row each logits row reads (paged passes; decode passes use every row).
    rows: DeviceTensor<i32>,
    x: DeviceTensor<T>,
    logits: DeviceTensor<T>,
    tokens: DeviceTensor<i32>,
    steps: DeviceTensor<i32>,
    params: DeviceParams,
    /// Page-locked staging of `steps` (up) and `tokens` (down), one per parity: a step and
    /// the lookahead step queued behind it use different ones.
    host_steps: [PinnedHostSlice<i32>; 2],
    host_tokens: [PinnedHostSlice<i32>; 2],
}

/// Page-locked host memory for `n` i32.
fn pinned(stream: &Arc<CudaStream>, n: usize) -> Result<PinnedHostSlice<i32>> {
    // SAFETY: the memory is uninitialised; every user writes it (or a device copy fills it)
    // before reading it.
    Ok(unsafe { stream.context().alloc_pinned::<i32>(n)? })
}

/// Queues `data` (`dst.len()` values) to `dst` through the page-locked `host` (as long),
/// which no queued copy still reads: the caller alternates two buffers, and the step that
/// used this one last was waited for.
fn stage(
    stream: &Arc<CudaStream>,
    host: &mut PinnedHostSlice<i32>,
    data: &[i32],
    dst: &mut DeviceTensor<i32>,
) -> Result<()> {
    host.as_mut_slice()?.copy_from_slice(data);
    stream.memcpy_htod(host, dst.as_slice_mut())?;
    Ok(())
}

impl<T: RunDType> Head<T> {
    fn new(stream: &Arc<CudaStream>, rows: usize, hidden: usize, vocab: usize) -> Result<Self> {
        Ok(Head {
            host_steps: [pinned(stream, rows)?, pinned(stream, rows)?],
            host_tokens: [pinned(stream, rows)?, pinned(stream, rows)?],
            rows: DeviceTensor::zeros(stream, &[rows])?,
            x: DeviceTensor::zeros(stream, &[rows, hidden])?,
            logits: DeviceTensor::zeros(stream, &[rows, vocab])?,
            tokens: DeviceTensor::zeros(stream, &[rows])?,
            steps: DeviceTensor::zeros(stream, &[rows])?,
            params: DeviceParams::new(stream, &vec![SamplingParams::greedy(); rows])?,
        })
    }
}

/// What a request asked for beyond sampling ([`Runner::add_request_with`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestOptions {
    /// Teacher forcing: generated token `i` is `forced[i]` (for `i < forced.len()`) instead
    /// of the sampled one; the logits are still those the model produced.
    pub forced: Vec<u32>,
    /// Keep the logits (as f32) from which each token is sampled, for
    /// [`Runner::take_logits`]. Costs a read-back of `[vocab]` floats per token.
    pub logits: bool,
}

#[derive(Default)]
struct Extras {
    forced: Vec<u32>,
    logits: Option<Vec<Vec<f32>>>,
    /// `top_logprobs` asked for, and the tokens' log-probabilities not yet taken.
    logprobs: Option<(usize, VecDeque<TokenLogprobs>)>,
}

impl Extras {
    /// Nothing left to hand out once the request has ended.
    fn drained(&self) -> bool {
        self.logits.is_none() && self.logprobs.as_ref().is_none_or(|(_, q)| q.is_empty())
    }
}

/// A generated token's log-probability and the most likely tokens at its step
/// ([`RequestParams::top_logprobs`](crate::scheduler::RequestParams::top_logprobs)): the
/// log-softmax of the logits the sampler saw (after repetition / presence / frequency
/// penalties and bans, before temperature and truncation), as vLLM's and OpenAI's `logprobs`.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// The generated token.
    pub token: u32,
    /// Its log-probability (`-inf` for a banned token).
    pub logprob: f32,
    /// The `top_logprobs` most likely tokens and their log-probabilities, most likely first
    /// (ties: the lower id first).
    pub top: Vec<(u32, f32)>,
}

/// [`TokenLogprobs`] of `token` from one row of logits (NaN counts as `-inf`); `k` top
/// tokens. On the host: a request that asks for them reads its logits back every step.
pub fn token_logprobs(logits: &[f32], token: u32, k: usize) -> TokenLogprobs {
    let val = |x: f32| if x.is_nan() { f32::NEG_INFINITY } else { x };
    let max = logits
        .iter()
        .copied()
        .map(val)
        .fold(f32::NEG_INFINITY, f32::max);
    let lse = if max == f32::NEG_INFINITY {
        f32::NEG_INFINITY
    } else {
        let sum: f64 = logits.iter().map(|&x| ((val(x) - max) as f64).exp()).sum();
        max + sum.ln() as f32
    };
    let lp = |x: f32| {
        if lse == f32::NEG_INFINITY {
            f32::NEG_INFINITY
        } else {
            val(x) - lse
        }
    };
    // The k best (value descending, id ascending), kept sorted.
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    if k > 0 {
        for (i, &x) in logits.iter().enumerate() {
            let x = val(x);
            if top.len() == k && x <= top[k - 1].1 {
                continue;
            }
            let at = top.partition_point(|&(_, y)| y >= x);
            top.insert(at, (i as u32, x));
            top.truncate(k);
        }
    }
    TokenLogprobs {
        token,
        logprob: logits
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&x| lp(x)),
        top: top.into_iter().map(|(i, x)| (i, lp(x))).collect(),
    }
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
    /// The step replayed a captured CUDA graph.
    pub graph: bool,
    /// The step was queued on the GPU before the previous one was collected (lookahead).
    pub ahead: bool,
}

/// Activation rows of a step of `m` tokens: the next power of two.
fn bucket(m: usize) -> usize {
    m.next_power_of_two()
}

/// The smallest attention bound of a decode pass.
const MIN_DECODE_BOUND: usize = 256;

/// The decode attention's bound for a step whose longest visible length is `longest`, in a
/// cache of `capacity` positions: the next power of two from [`MIN_DECODE_BOUND`], at most
/// `capacity` (never below `longest`, which the capacity bounds). The split layout follows
/// the bound, so a short context does not pay for the capacity's splits, and a few graphs
/// per row bucket cover every length.
fn decode_bound(longest: usize, capacity: usize) -> usize {
    longest
        .max(MIN_DECODE_BOUND)
        .next_power_of_two()
        .min(capacity)
        .max(longest)
}

/// What a step's execution hands the scheduler: sampled `(request, token)`s and beam steps.
type Executed = (Vec<(u64, u32)>, Vec<BeamStep>);

/// One row of a step that gets logits.
struct LogitRow {
    id: RequestId,
    /// Row of the pass's activations.
    row: i32,
    params: SamplingParams,
    /// Tokens the request has generated (the Philox step).
    generated: usize,
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
            None => Self::pool_blocks(engine, cfg)?,
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
            max_prefill_tokens_beside_decodes: cfg.max_prefill_tokens_beside_decodes,
        })?;
        let workspace = SampleWorkspace::new(&stream, cfg.max_num_seqs, mcfg.vocab_size)?;
        Ok(Runner {
            engine,
            sched,
            cache,
            passes: HashMap::new(),
            heads: HashMap::new(),
            workspace,
            penalty_ws: None,
            extras: HashMap::new(),
            beams: HashMap::new(),
            beam_results: HashMap::new(),
            beam_ws: None,
            inflight: None,
            parity: 0,
            done: [
                stream.context().new_event(None)?,
                stream.context().new_event(None)?,
            ],
            last: StepStats::default(),
        })
    }

    /// The KV blocks [`Runner::new`] gives the pool when `cfg.num_blocks` is `None`:
    /// `cfg.kv_memory` of the memory free after reserving the activations of a full step
    /// (`cfg.max_batched_tokens` tokens). A tensor-parallel group takes the smallest of its
    /// ranks' counts, so that every rank schedules alike.
    ///
    /// Errors: [`EngineError::Invalid`] naming `kv_memory` (no block fits, or outside
    /// `(0, 1]`) or `max_model_len`; allocation errors.
    pub fn pool_blocks(engine: &Engine<T>, cfg: &RunnerConfig) -> Result<usize> {
        let mcfg = &engine.model.cfg;
        let max_model_len = cfg.max_model_len.unwrap_or(mcfg.max_position_embeddings);
        if max_model_len == 0 || cfg.block_size == 0 {
            return Err(EngineError::invalid(
                "max_model_len",
                "max_model_len and block_size must be at least 1",
            ));
        }
        let stream = engine.gpu.stream().clone();
        let max_blocks_per_seq = max_model_len.div_ceil(cfg.block_size);
        // Reserve the activations of the largest step by allocating its buffers first.
        let probe = Cache::<T>::new_paged(
            &stream,
            mcfg,
            1,
            cfg.block_size,
            cfg.max_num_seqs,
            max_blocks_per_seq,
        )?;
        let mode = AttnMode::Paged { max_q_len: 1 };
        let m = bucket(cfg.max_batched_tokens);
        let reserve = engine.model.buffers(&stream, m, &probe, mode)?;
        // A sync first: memory freed by an earlier runner's drop goes back to the driver
        // only at a synchronisation, and would not count as free otherwise.
        stream.synchronize()?;
        let (free, _) = fl_kernels::cudarc::driver::result::mem_get_info()?;
        drop(reserve);
        let per_block = kv::bytes_per_block(
            mcfg.num_hidden_layers as u64,
            mcfg.num_key_value_heads as u64,
            mcfg.head_dim as u64,
            std::mem::size_of::<T>() as u64,
            cfg.block_size as u64,
        );
        Ok(kv::blocks_for_memory(free as u64, cfg.kv_memory, per_block)
            .map_err(|e| EngineError::invalid("kv_memory", e.to_string()))? as usize)
    }

    /// The scheduler (queue lengths, KV statistics, preemptions).
    pub fn scheduler(&self) -> &Scheduler<SamplingParams> {
        &self.sched
    }

    /// The engine (model, GPU).
    pub fn engine(&self) -> &Engine<T> {
        self.engine
    }

    /// Queues a request; its `params.sampling.seed` is set from the request's `seed`, and its
    /// `params.sampling.request_id` is kept as given: the Philox stream is keyed by (seed,
    /// request_id, token index), so one seed gives the same tokens whatever the request's id
    /// and batch mates (give distinct `request_id`s to requests that share a seed but should
    /// not share samples). Errors name the field ([`crate::scheduler::RequestError`]).
    pub fn add_request(&mut self, req: Request<SamplingParams>) -> Result<()> {
        self.add_request_with(req, RequestOptions::default())
    }

    /// [`Runner::add_request`] with teacher forcing and/or logits read-back.
    ///
    /// Errors: as [`Runner::add_request`]; [`EngineError::Invalid`] naming `forced` for an
    /// id outside the vocabulary.
    pub fn add_request_with(
        &mut self,
        mut req: Request<SamplingParams>,
        opts: RequestOptions,
    ) -> Result<()> {
        let vocab = self.engine.model.cfg.vocab_size;
        if let Some(&t) = opts.forced.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::invalid(
                "forced",
                format!("token id {t} >= vocab_size {vocab}"),
            ));
        }
        let top = req.params.top_logprobs;
        if let Some(k) = top.filter(|&k| k > MAX_TOP_LOGPROBS) {
            return Err(EngineError::invalid(
                "top_logprobs",
                format!("{k} is more than {MAX_TOP_LOGPROBS}"),
            ));
        }
        req.params.sampling.seed = req.params.seed;
        let id = req.id;
        self.sched.add_request(req)?;
        if opts != RequestOptions::default() || top.is_some() {
            self.extras.insert(
                id,
                Extras {
                    forced: opts.forced,
                    logits: opts.logits.then(Vec::new),
                    logprobs: top.map(|k| (k, VecDeque::new())),
                },
            );
        }
        Ok(())
    }

    /// Queues a beam search request (transformers' `generate(num_beams=..)` semantics, see
    /// [`crate::beam`]): `beam.num_beams` sequences that share the prompt's KV blocks and fork
    /// them copy-on-write as beams are reordered. `req.params.max_new_tokens` and
    /// `eos_token_ids` are taken from `beam`; `req.params.sampling`'s penalties apply to
    /// each beam's own tokens, its temperature and truncation do not (beams are scored by
    /// log-probability). The request reports no [`Event::Token`]s, only its
    /// [`Event::Finished`]; then [`Runner::take_beams`] gives its hypotheses.
    ///
    /// Errors: `beam`'s field errors ([`BeamParams::validate`]); `num_beams` above the
    /// runner's `max_num_seqs` or more candidates per step (`beams_to_keep`) than
    /// [`BEAM_MAX_KEEP`]; as [`Runner::add_request`].
    pub fn add_beam_request(
        &mut self,
        mut req: Request<SamplingParams>,
        beam: BeamParams,
    ) -> Result<()> {
        let vocab = self.engine.model.cfg.vocab_size;
        // Before anything multiplies num_beams (an absurd width must not overflow).
        if beam.num_beams > BEAM_MAX_KEEP || beam.eos_token_ids.len() > BEAM_MAX_KEEP {
            return Err(EngineError::invalid(
                "num_beams",
                format!(
                    "{} beams with {} end ids: at most {BEAM_MAX_KEEP} candidates a step",
                    beam.num_beams,
                    beam.eos_token_ids.len()
                ),
            ));
        }
        let state = BeamState::new(beam.clone(), vocab)?;
        if beam.beams_to_keep() > BEAM_MAX_KEEP {
            return Err(EngineError::invalid(
                "num_beams",
                format!(
                    "{} beams with {} end ids keep {} candidates a step, the kernel at most {BEAM_MAX_KEEP}",
                    beam.num_beams,
                    beam.eos_token_ids.len(),
                    beam.beams_to_keep()
                ),
            ));
        }
        if req.params.top_logprobs.is_some() {
            return Err(EngineError::invalid(
                "top_logprobs",
                "a beam search reports hypothesis scores, not per-token log-probabilities",
            ));
        }
        req.params.max_new_tokens = beam.max_new_tokens;
        req.params.eos_token_ids = beam.eos_token_ids.clone();
        req.params.stop_token_ids.clear();
        req.params.beam_width = Some(beam.num_beams);
        req.params.sampling.seed = req.params.seed;
        let id = req.id;
        self.sched.add_request(req)?;
        self.beams.insert(id, state);
        Ok(())
    }

    /// The hypotheses of finished beam request `id`, best first: generated tokens (the end id
    /// included) and score (`sum of log-probabilities / length ^ length_penalty`); taking them
    /// clears them. `None` while it runs, or for an unknown id. An aborted request has none.
    pub fn take_beams(&mut self, id: RequestId) -> Option<Vec<(Vec<u32>, f64)>> {
        self.beam_results.remove(&id)
    }

    /// The logits kept for request `id` so far (one `[vocab]` row per generated token, in
    /// order), when it was added with [`RequestOptions::logits`]; taking them clears them.
    pub fn take_logits(&mut self, id: RequestId) -> Option<Vec<Vec<f32>>> {
        let logits = self.extras.get_mut(&id).and_then(|e| e.logits.take());
        self.forget_ended(id);
        logits
    }

    /// The log-probabilities of request `id`'s next generated token not yet taken (one per
    /// [`Event::Token`], in order), when it asked for them
    /// ([`RequestParams::top_logprobs`](crate::scheduler::RequestParams::top_logprobs));
    /// those of a finished request stay until taken.
    pub fn next_logprobs(&mut self, id: RequestId) -> Option<TokenLogprobs> {
        let next = self
            .extras
            .get_mut(&id)
            .and_then(|e| e.logprobs.as_mut())
            .and_then(|(_, q)| q.pop_front());
        self.forget_ended(id);
        next
    }

    /// Drops what the runner keeps for `id` once the request has ended and all of it was taken.
    fn forget_ended(&mut self, id: RequestId) {
        if !self.sched.contains(id) && self.extras.get(&id).is_some_and(Extras::drained) {
            self.extras.remove(&id);
        }
    }

    /// Aborts a request: its blocks are freed; returns its [`Event::Finished`].
    pub fn abort(&mut self, id: u64) -> Result<Event> {
        self.extras.remove(&id);
        self.beams.remove(&id);
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
    /// Waits for the GPU once, to read the sampled tokens. In the steady state (every running
    /// request decoding, nothing waiting, no beams, penalties, bans, forcing or logits
    /// read-back) the next step is queued on the GPU before this one is waited for, its token
    /// ids copied on the device from this step's samples
    /// ([`Scheduler::schedule_ahead`](crate::scheduler::Scheduler::schedule_ahead)), so the
    /// GPU never idles while the host updates and schedules.
    pub fn step(&mut self) -> Result<Vec<Event>> {
        let cur = match self.inflight.take() {
            Some(l) => l,
            None => {
                let plan = self.sched.schedule()?;
                if plan.seqs.is_empty() {
                    self.last = StepStats::default();
                    return Ok(self.sched.update(&plan, &[])?);
                }
                match self.launch(plan.clone(), false) {
                    Ok(l) => l,
                    Err(e) => return Err(self.fail(&[&plan], e)),
                }
            }
        };
        self.last = StepStats {
            prefill_tokens: cur.plan.num_prefill_tokens,
            decode_tokens: cur.plan.num_decode_tokens,
            seqs: cur.plan.seqs.len(),
            graph: cur.graph,
            ahead: cur.chained,
        };
        if self.can_chain(&cur) {
            let ids: Vec<RequestId> = cur.plan.seqs.iter().map(|s| s.id).collect();
            match self.sched.schedule_ahead(&ids) {
                Ok(Some(next)) => match self.launch(next.clone(), true) {
                    Ok(l) => self.inflight = Some(l),
                    Err(e) => return Err(self.fail(&[&cur.plan, &next], e)),
                },
                Ok(None) => {}
                Err(e) => return Err(self.fail(&[&cur.plan], e.into())),
            }
        }
        let (sampled, beam_steps) = match self.collect(&cur) {
            Ok(s) => s,
            Err(e) => {
                let next = self.inflight.take().map(|l| l.plan);
                let plans: Vec<&StepPlan> = std::iter::once(&cur.plan).chain(&next).collect();
                return Err(self.fail(&plans, e));
            }
        };
        let mut events = self
            .sched
            .update_with_beams(&cur.plan, &sampled, &beam_steps)?;
        if !self.sched.has_unfinished() {
            // Every request ended: the lookahead step's rows are all wasted; close it.
            if let Some(l) = self.inflight.take() {
                self.collect(&l)?;
                events.extend(self.sched.update(&l.plan, &[])?);
            }
        }
        for e in &events {
            if let Event::Finished { id, reason, .. } = e {
                if let Some(state) = self.beams.remove(id) {
                    if *reason != FinishReason::Abort {
                        self.beam_results.insert(*id, state.finish());
                    }
                }
                // Kept logits and log-probabilities stay until taken; forcing ends with the
                // request.
                if self.extras.get(id).is_some_and(Extras::drained) {
                    self.extras.remove(id);
                }
            }
        }
        Ok(events)
    }

    /// Leaves the scheduler consistent after a failed step: aborts every request of `plans`
    /// and closes them in order (their aborted rows are ignored). Returns `e`.
    fn fail(&mut self, plans: &[&StepPlan], e: EngineError) -> EngineError {
        for plan in plans {
            for s in &plan.seqs {
                let id = self.sched.beam_of(s.id).map_or(s.id, |(g, _)| g);
                if self.sched.contains(id) {
                    let _ = self.abort(id);
                }
            }
        }
        for plan in plans {
            let _ = self.sched.update(plan, &[]);
        }
        e
    }

    /// Whether the step after `l` may be queued before `l` is collected: `l` decodes every
    /// row through the decode graph and no row needs host work between steps.
    fn can_chain(&self, l: &Launched) -> bool {
        l.decode
            && l.beam_groups.is_empty()
            && l.heads.len() == l.plan.seqs.len()
            && l.heads.iter().all(|h| {
                !h.params.has_penalties()
                    && h.generated as u32 + 1 >= h.params.min_new_tokens
                    && !self.extras.contains_key(&h.id)
                    && self.sched.beam_of(h.id).is_none()
            })
    }

    /// Executes the plan's copy-on-write block copies on every layer.
    fn copy_blocks(&mut self, plan: &StepPlan) -> Result<()> {
        if plan.copies.is_empty() {
            return Ok(());
        }
        let stream = self.engine.gpu.stream().clone();
        let pairs: Vec<i32> = plan
            .copies
            .iter()
            .flat_map(|c| [c.src as i32, c.dst as i32])
            .collect();
        let pairs = DeviceTensor::from_host(&stream, &pairs, &[plan.copies.len(), 2])?;
        for kvc in &mut self.cache.layers {
            kv_cache::copy_blocks(&stream, &pairs, kvc, None)?;
        }
        Ok(())
    }

    /// Queues `plan` on the GPU: one paged forward pass, the LM head on the rows that need
    /// logits, sampling, the tokens' read-back. `chained`: the plan is a lookahead plan whose
    /// rows decode the sequences of the step queued just before, in the same order: their
    /// token ids are that step's samples, copied on the device.
    fn launch(&mut self, plan: StepPlan, chained: bool) -> Result<Launched> {
        // Host staging alternates between two sets: the set of the step before the previous
        // one is free (that step was waited for).
        let parity = self.parity;
        self.parity ^= 1;
        self.copy_blocks(&plan)?;
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
        let mut heads: Vec<LogitRow> = vec![];
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
                let p = self.sched.params(s.id).ok_or_else(|| {
                    EngineError::invalid("plan.seqs", format!("request {} is unknown", s.id))
                })?;
                heads.push(LogitRow {
                    id: s.id,
                    row: ids.len() as i32 - 1,
                    params: p.sampling,
                    generated: s.num_generated,
                });
            }
        }
        // Padding rows: token 0 at position -1 of sequence 0, which writes no K/V, is in no
        // sequence's range and sees no key.
        ids.resize(padded, 0);
        pos.resize(padded, -1);
        row.resize(padded, 0);
        // A step of single tokens (decodes, one-token prompts or chunks) runs the decode
        // attention over the paged cache, token b being sequence b, and its LM head reads
        // every row (so forward + head replay as one CUDA graph); others the paged prefill
        // attention and a gather of the rows that need logits.
        let decode = max_q_len == 1;
        let mode = if decode {
            AttnMode::Decode
        } else {
            AttnMode::Paged { max_q_len }
        };
        let rows = if decode {
            padded
        } else {
            bucket(heads.len().max(1))
        };
        let key = (padded, decode);
        if !self.passes.contains_key(&key) {
            let mut buf = self
                .engine
                .model
                .buffers(&stream, padded, &self.cache, mode)?;
            if decode {
                let rows: Vec<i32> = (0..padded as i32).collect();
                buf.seq_ids.copy_from_host(&stream, &rows)?;
            }
            self.passes.insert(
                key,
                PassBuffers {
                    buf,
                    graphs: HashMap::new(),
                    table: vec![],
                    staging: if decode {
                        let set = || -> Result<[PinnedHostSlice<i32>; 3]> {
                            Ok([
                                pinned(&stream, padded)?,
                                pinned(&stream, padded)?,
                                pinned(&stream, padded)?,
                            ])
                        };
                        Some([set()?, set()?])
                    } else {
                        None
                    },
                    runs: HashMap::new(),
                },
            );
        }
        if let std::collections::hash_map::Entry::Vacant(v) = self.heads.entry(rows) {
            v.insert(Head::new(&stream, rows, hidden, vocab)?);
        }
        let pass = self.passes.get_mut(&key).expect("inserted above");
        let head = self.heads.get_mut(&rows).expect("inserted above");
        let buf = &mut pass.buf;
        if decode {
            // Token b is sequence b: the rows never change, the table rarely (a new block
            // every block_size steps); padding rows keep block 0 and write nothing.
            let [hi, hp, hv] = &mut pass.staging.as_mut().expect("decode passes stage")[parity];
            let vis: Vec<i32> = pos.iter().map(|p| p + 1).collect();
            if chained {
                // The previous step's samples, in this head (same rows); padding rows get a
                // sampled id too: still at position -1, they write nothing.
                stream.memcpy_dtod(head.tokens.as_slice(), buf.ids.as_slice_mut())?;
            } else {
                stage(&stream, hi, &ids, &mut buf.ids)?;
            }
            stage(&stream, hp, &pos, &mut buf.positions)?;
            stage(&stream, hv, &vis, &mut buf.visible)?;
            table.resize(padded * width, 0);
            if pass.table != table {
                buf.block_table.copy_from_host(&stream, &table)?;
                pass.table = table;
            }
        } else {
            buf.upload(&stream, Some(&ids), &pos, Some(&row))?;
            buf.upload_paged(&stream, &cu, &ctx, &table)?;
        }

        // Sampling rows: row i of the head is request heads[i] (decode: the activation row
        // of every sequence, so a row without logits is sampled and dropped).
        let mut params = vec![SamplingParams::greedy(); rows];
        let mut steps = vec![0i32; rows];
        let mut slot = Vec::with_capacity(heads.len());
        for (i, h) in heads.iter().enumerate() {
            let r = if decode { h.row as usize } else { i };
            params[r] = h.params;
            steps[r] = h.generated as i32;
            slot.push(r);
        }
        if head.params.host() != params.as_slice() {
            head.params.update(&stream, &params)?;
        }
        stage(
            &stream,
            &mut head.host_steps[parity],
            &steps,
            &mut head.steps,
        )?;

        let engine = &mut *self.engine;
        let model = &engine.model;
        let mut graph = false;
        let bound = if decode {
            let longest = ctx.iter().copied().max().unwrap_or(1).max(1) as usize;
            decode_bound(longest, self.cache.capacity)
        } else {
            0
        };
        let runs = pass.runs.get(&bound).copied().unwrap_or(0);
        if decode {
            buf.decode_bound = bound;
            if !pass.graphs.contains_key(&bound) && engine.use_graph && runs >= 1 {
                let g = capture_graph(&stream, |s| {
                    model.forward(s, &mut engine.blas, buf, &mut self.cache, mode)?;
                    model.lm_head(s, &mut engine.blas, &buf.x, &mut head.logits)
                })?;
                if let Some(g) = g {
                    pass.graphs.insert(bound, g);
                }
            }
            match pass.graphs.get(&bound) {
                Some(g) => {
                    g.launch()?;
                    graph = true;
                }
                None => {
                    model.forward(&stream, &mut engine.blas, buf, &mut self.cache, mode)?;
                    model.lm_head(&stream, &mut engine.blas, &buf.x, &mut head.logits)?;
                }
            }
        } else {
            model.forward(&stream, &mut engine.blas, buf, &mut self.cache, mode)?;
        }
        if !decode && !heads.is_empty() {
            let mut gather: Vec<i32> = heads.iter().map(|h| h.row).collect();
            gather.resize(rows, 0);
            head.rows.copy_from_host(&stream, &gather)?;
            embedding::lookup(&stream, &head.rows, &buf.x, &mut head.x, &mut buf.status)?;
            model.lm_head(&stream, &mut engine.blas, &head.x, &mut head.logits)?;
        }
        pass.runs.insert(bound, runs + 1);
        let mut launched = Launched {
            plan,
            heads: vec![],
            slot: vec![],
            rows,
            key,
            decode,
            graph,
            chained,
            beam_groups: vec![],
            parity,
        };
        if heads.is_empty() {
            // Nothing to read back: the step is over once the stream is (the status read).
            buf.status.check(&stream)?;
            return Ok(launched);
        }
        self.process_logits(&stream, &heads, &slot, rows)?;
        launched.beam_groups = self.launch_beams(&stream, &heads, &slot, rows)?;
        let head = self.heads.get_mut(&rows).expect("inserted above");
        let opts = SampleOptions {
            steps: Some(&head.steps),
            ..Default::default()
        };
        fl_sampling::sample(
            &stream,
            &head.logits,
            &head.params,
            &opts,
            &mut head.tokens,
            &mut self.workspace,
        )?;
        stream.memcpy_dtoh(head.tokens.as_slice(), &mut head.host_tokens[parity])?;
        self.done[parity].record(&stream)?;
        launched.heads = heads;
        launched.slot = slot;
        Ok(launched)
    }

    /// Waits for launched step `l` and returns its `(request, token)`s and beam steps.
    fn collect(&mut self, l: &Launched) -> Result<Executed> {
        if l.heads.is_empty() {
            return Ok((vec![], vec![]));
        }
        let stream = self.engine.gpu.stream().clone();
        let vocab = self.engine.model.cfg.vocab_size;
        let head = self.heads.get(&l.rows).expect("launched");
        let want_logits = l.heads.iter().any(|h| {
            self.extras
                .get(&h.id)
                .is_some_and(|x| x.logits.is_some() || x.logprobs.is_some())
        });
        // (No lookahead step runs behind a step whose logits are read.)
        let host_logits = if want_logits {
            Some(head.logits.to_host(&stream)?)
        } else {
            None
        };
        // The engine's context does not track events (one stream), so wait explicitly.
        self.done[l.parity].synchronize()?;
        let host = head.host_tokens[l.parity].as_slice()?;
        let mut out = Vec::with_capacity(l.heads.len());
        for (h, &r) in l.heads.iter().zip(&l.slot) {
            if self.sched.beam_of(h.id).is_some() {
                continue;
            }
            let mut token = host[r] as u32;
            if let Some(x) = self.extras.get_mut(&h.id) {
                if let Some(&f) = x.forced.get(h.generated) {
                    token = f;
                }
                let wants_row = x.logits.is_some() || x.logprobs.is_some();
                if let (true, Some(l)) = (wants_row, host_logits.as_ref()) {
                    // The row as f32 once, for the log-probabilities and the kept logits.
                    let row: Vec<f32> = l[r * vocab..(r + 1) * vocab]
                        .iter()
                        .map(|v| v.to_f32())
                        .collect();
                    if let Some((k, q)) = x.logprobs.as_mut() {
                        q.push_back(token_logprobs(&row, token, *k));
                    }
                    if let Some(kept) = x.logits.as_mut() {
                        kept.push(row);
                    }
                }
            }
            out.push((h.id, token));
        }
        // The embedding's out-of-vocabulary flag: read when nothing is queued behind (a read
        // waits for the whole stream); ids of a lookahead step are sampled, so in range.
        if self.inflight.is_none() {
            let buf = &mut self.passes.get_mut(&l.key).expect("launched").buf;
            buf.status.check(&stream)?;
        }
        let beam_steps = self.finish_beams(&stream, &l.beam_groups)?;
        Ok((out, beam_steps))
    }

    /// Queues the beam step of every beam request with logits rows in this step: the rows of
    /// a request are consecutive head rows in beam order (the scheduler plans a request's
    /// beams together, in order). Returns `(request, keep, index in the kernel's requests)`.
    fn launch_beams(
        &mut self,
        stream: &Arc<CudaStream>,
        heads: &[LogitRow],
        slot: &[usize],
        rows: usize,
    ) -> Result<Vec<(RequestId, usize, usize)>> {
        // (request, first head row, rows)
        let mut groups: Vec<(RequestId, usize, usize)> = vec![];
        for (h, &r) in heads.iter().zip(slot) {
            let Some((g, i)) = self.sched.beam_of(h.id) else {
                continue;
            };
            let seen = groups.iter().any(|x| x.0 == g);
            match groups.last_mut() {
                Some(last) if last.0 == g && r == last.1 + last.2 && i == last.2 => last.2 += 1,
                _ if i == 0 && !seen => groups.push((g, r, 1)),
                _ => {
                    return Err(EngineError::invalid(
                        "plan.seqs",
                        format!("the beams of request {g} are not consecutive rows in order"),
                    ))
                }
            }
        }
        if groups.is_empty() {
            return Ok(vec![]);
        }
        let vocab = self.engine.model.cfg.vocab_size;
        let mut scores = vec![0f32; rows];
        let (mut starts, mut keep, mut out) = (vec![], vec![], vec![]);
        let mut cursor = 0;
        for &(g, r0, n) in &groups {
            let state = &self.beams[&g];
            if n != state.running_scores().len() && !(n == 1 && state.generated_len() == 0) {
                return Err(EngineError::invalid(
                    "plan.seqs",
                    format!("request {g} has {n} beam rows this step"),
                ));
            }
            scores[r0..r0 + n].copy_from_slice(&state.running_scores()[..n]);
            if r0 > cursor {
                // Rows of other requests between two beam requests: a request of no candidates.
                starts.push(cursor as i32);
                keep.push(0);
            }
            let k = state.params().beams_to_keep();
            out.push((g, k, keep.len()));
            starts.push(r0 as i32);
            keep.push(k as i32);
            cursor = r0 + n;
        }
        starts.push(cursor as i32);
        let max_keep = out.iter().map(|o| o.1).max().unwrap_or(1);
        if self.beam_ws.as_ref().is_none_or(|b| b.rows < rows) {
            self.beam_ws = None; // free the old workspace first
            self.beam_ws = Some(BeamBuffers {
                ws: BeamTopkWorkspace::new(stream, rows, vocab, BEAM_MAX_KEEP)?,
                rows,
                scores: DeviceTensor::zeros(stream, &[1])?,
                req_start: DeviceTensor::zeros(stream, &[1])?,
                keep: DeviceTensor::zeros(stream, &[1])?,
                out_scores: DeviceTensor::zeros(stream, &[1, 1])?,
                out_ids: DeviceTensor::zeros(stream, &[1, 1])?,
            });
        }
        let b = self.beam_ws.as_mut().expect("allocated above");
        b.scores = DeviceTensor::from_host(stream, &scores, &[rows])?;
        b.req_start = DeviceTensor::from_host(stream, &starts, &[starts.len()])?;
        b.keep = DeviceTensor::from_host(stream, &keep, &[keep.len()])?;
        b.out_scores = DeviceTensor::zeros(stream, &[keep.len(), max_keep])?;
        b.out_ids = DeviceTensor::zeros(stream, &[keep.len(), max_keep])?;
        let head = self.heads.get(&rows).expect("allocated by execute");
        fl_sampling::beam_topk(
            stream,
            &head.logits,
            &b.scores,
            &BeamRequests {
                req_start: &b.req_start,
                keep: &b.keep,
            },
            &mut b.ws,
            &mut b.out_scores,
            &mut b.out_ids,
        )?;
        Ok(out)
    }

    /// Reads the candidates of [`launch_beams`](Self::launch_beams) (the step has finished)
    /// and advances each beam search.
    fn finish_beams(
        &mut self,
        stream: &Arc<CudaStream>,
        groups: &[(RequestId, usize, usize)],
    ) -> Result<Vec<BeamStep>> {
        if groups.is_empty() {
            return Ok(vec![]);
        }
        let b = self.beam_ws.as_ref().expect("launched");
        let max_keep = b.out_scores.shape()[1];
        let (scores, ids) = (b.out_scores.to_host(stream)?, b.out_ids.to_host(stream)?);
        let mut steps = Vec::with_capacity(groups.len());
        for &(g, k, q) in groups {
            let cands: Vec<(f32, usize)> = (q * max_keep..q * max_keep + k)
                .map(|i| (scores[i], ids[i].max(0) as usize))
                .collect();
            let state = self.beams.get_mut(&g).expect("a state per beam request");
            let r = state.step_candidates(&cands)?;
            let finish = r.done.then(|| {
                let eos = &state.params().eos_token_ids;
                let stopped = state
                    .finish()
                    .first()
                    .and_then(|(t, _)| t.last())
                    .is_some_and(|t| eos.contains(t));
                if stopped {
                    FinishReason::Stop
                } else {
                    FinishReason::Length
                }
            });
            steps.push(BeamStep {
                id: g,
                reorder: r.reorder,
                tokens: r.tokens,
                finish,
            });
        }
        Ok(steps)
    }

    /// Penalties over each request's generated tokens and the end-id ban under
    /// `min_new_tokens`, in place on the head's logits, when some row needs them.
    fn process_logits(
        &mut self,
        stream: &Arc<CudaStream>,
        heads: &[LogitRow],
        slot: &[usize],
        rows: usize,
    ) -> Result<()> {
        let penalties = heads.iter().any(|h| h.params.has_penalties());
        let min_new = heads
            .iter()
            .any(|h| (h.generated as u32) < h.params.min_new_tokens);
        if !penalties && !min_new {
            return Ok(());
        }
        let vocab = self.engine.model.cfg.vocab_size;
        let mut hist_tokens: Vec<i32> = vec![];
        let mut hist_lens = vec![0i32; rows];
        let width = heads.iter().map(|h| h.generated).max().unwrap_or(0).max(1);
        if penalties {
            hist_tokens = vec![-1; rows * width];
            for (h, &r) in heads.iter().zip(slot) {
                if let Some(out) = self.sched.output_tokens(h.id) {
                    for (j, &t) in out.iter().take(width).enumerate() {
                        hist_tokens[r * width + j] = t as i32;
                    }
                    hist_lens[r] = out.len().min(width) as i32;
                }
            }
        }
        // Per-row bans: a request's own end ids while it is under its min_new_tokens.
        let mut bans: Vec<Vec<i32>> = vec![vec![]; rows];
        for (h, &r) in heads.iter().zip(slot) {
            if (h.generated as u32) < h.params.min_new_tokens {
                if let Some(p) = self.sched.params(h.id) {
                    if !p.ignore_eos {
                        bans[r].extend(p.eos_token_ids.iter().map(|&t| t as i32));
                    }
                    bans[r].extend(p.stop_token_ids.iter().map(|&t| t as i32));
                }
            }
        }
        let ban_width = bans.iter().map(Vec::len).max().unwrap_or(0);
        let banned = if ban_width > 0 {
            let mut flat = vec![-1i32; rows * ban_width];
            for (r, b) in bans.iter().enumerate() {
                flat[r * ban_width..r * ban_width + b.len()].copy_from_slice(b);
            }
            Some(DeviceTensor::from_host(stream, &flat, &[rows, ban_width])?)
        } else {
            None
        };
        let history = if penalties {
            Some((
                DeviceTensor::from_host(stream, &hist_tokens, &[rows, width])?,
                DeviceTensor::from_host(stream, &hist_lens, &[rows])?,
            ))
        } else {
            None
        };
        if penalties && self.penalty_ws.is_none() {
            self.penalty_ws = Some(PenaltyWorkspace::new(stream, vocab)?);
        }
        let head = self.heads.get_mut(&rows).expect("allocated by execute");
        let inputs = Processors {
            history: history
                .as_ref()
                .map(|(tokens, lens)| History { tokens, lens }),
            banned: banned.as_ref(),
            end_ids: None,
            lengths: None,
        };
        fl_sampling::process_logits(
            stream,
            &mut head.logits,
            &head.params,
            &inputs,
            self.penalty_ws.as_mut(),
        )?;
        Ok(())
    }

    /// Steps until every queued request is finished; returns each request's generated tokens
    /// (in the order they finished) and all events.
    pub fn run_to_completion(&mut self) -> Result<Completion> {
        run_to_completion(self)
    }
}

/// Steps `b` until nothing is left: each request's generated tokens, and every event in
/// order ([`Runner::run_to_completion`], and the tensor-parallel runner's).
pub(crate) fn run_to_completion<B: crate::service::Backend + ?Sized>(
    b: &mut B,
) -> Result<Completion> {
    let mut out: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut events = Vec::new();
    while b.has_unfinished() {
        for e in b.step()? {
            if let Event::Token { id, token } = e {
                out.entry(id).or_default().push(token);
            }
            events.push(e);
        }
    }
    Ok((out, events))
}

#[cfg(test)]
mod tests {
    use super::{decode_bound, token_logprobs, MIN_DECODE_BOUND};

    #[test]
    fn decode_bounds_are_powers_of_two_within_the_capacity() {
        assert_eq!(decode_bound(1, 4096), MIN_DECODE_BOUND);
        assert_eq!(decode_bound(256, 4096), 256);
        assert_eq!(decode_bound(257, 4096), 512);
        assert_eq!(decode_bound(1100, 4096), 2048);
        assert_eq!(decode_bound(4096, 4096), 4096);
        // A capacity that is no power of two, or below the smallest bound.
        assert_eq!(decode_bound(3000, 3008), 3008);
        assert_eq!(decode_bound(100, 128), 128);
        for cap in [16, 128, 1000, 4096, 32768] {
            for longest in 1..=cap {
                let b = decode_bound(longest, cap);
                assert!(
                    b >= longest && b <= cap,
                    "longest {longest}, capacity {cap}: {b}"
                );
            }
        }
    }

    /// log-softmax in f64, the reference.
    fn log_softmax(x: &[f32]) -> Vec<f64> {
        let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = m + x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
        x.iter().map(|&v| v as f64 - lse).collect()
    }

    #[test]
    fn logprobs_are_the_log_softmax_and_the_top_k_in_order() {
        let x: Vec<f32> = (0..1000u32)
            .map(|i| ((i.wrapping_mul(2_654_435_761) >> 7) % 2000) as f32 / 97.0 - 9.0)
            .collect();
        let want = log_softmax(&x);
        let t = token_logprobs(&x, 123, 5);
        assert_eq!(t.token, 123);
        assert!((t.logprob as f64 - want[123]).abs() < 1e-5, "{}", t.logprob);
        let mut order: Vec<usize> = (0..x.len()).collect();
        order.sort_by(|&a, &b| x[b].total_cmp(&x[a]).then(a.cmp(&b)));
        assert_eq!(t.top.len(), 5);
        for (&(id, lp), &w) in t.top.iter().zip(&order) {
            assert_eq!(id as usize, w);
            assert!((lp as f64 - want[w]).abs() < 1e-5);
        }
        assert!(token_logprobs(&x, 7, 0).top.is_empty());
    }

    #[test]
    fn logprobs_break_ties_by_id_and_read_nan_and_bans_as_impossible() {
        let x = [1.0, 3.0, f32::NAN, 3.0, f32::NEG_INFINITY, 2.0];
        let t = token_logprobs(&x, 4, 6);
        assert_eq!(t.logprob, f32::NEG_INFINITY);
        let ids: Vec<u32> = t.top.iter().map(|&(i, _)| i).collect();
        assert_eq!(ids, [1, 3, 5, 0, 2, 4]);
        let lse = (3f64.exp() * 2.0 + 2f64.exp() + 1f64.exp()).ln();
        assert!((t.top[0].1 as f64 - (3.0 - lse)).abs() < 1e-6);
        assert_eq!(t.top[4].1, f32::NEG_INFINITY);
        // A token outside the row, and a row with nothing possible.
        assert_eq!(token_logprobs(&x, 99, 1).logprob, f32::NEG_INFINITY);
        let none = token_logprobs(&[f32::NEG_INFINITY; 3], 0, 2);
        assert_eq!(none.logprob, f32::NEG_INFINITY);
        assert_eq!(none.top, [(0, f32::NEG_INFINITY), (1, f32::NEG_INFINITY)]);
    }
}
