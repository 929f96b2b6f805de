//! [`Scheduler`]: the waiting queue, the running set, and the step policy.

use std::collections::{HashMap, HashSet, VecDeque};

use super::plan::{ScheduledSeq, StepPlan};
use super::request::{Event, FinishReason, Request, RequestError, RequestId, RequestParams, Usage};
use crate::kv::{blocks_needed, BlockManager, KvError, KvStats};

/// The scheduler's limits. See [`SchedulerConfig::new`] for typical values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Token budget of one step (prefill rows + decode rows), e.g. 8192.
    pub max_batched_tokens: usize,
    /// Most requests running at once, e.g. 256.
    pub max_num_seqs: usize,
    /// Token slots per KV block, e.g. 16.
    pub block_size: usize,
    /// KV blocks in the pool (from [`crate::kv::blocks_for_memory`]).
    pub num_blocks: usize,
    /// The model's context length.
    pub max_model_len: usize,
    /// Reuse the KV of cached prompt prefixes.
    pub enable_prefix_cache: bool,
    /// Split prompts longer than the step's remaining budget across steps. When off, a prompt
    /// runs whole in one step, so `max_batched_tokens` must be at least `max_model_len`.
    pub chunked_prefill: bool,
    /// Vocabulary size, to reject out-of-range prompt ids (`None`: unchecked).
    pub vocab_size: Option<u32>,
}

impl SchedulerConfig {
    /// 8192-token steps, 256 sequences, 16-token blocks, prefix cache and chunked prefill on.
    pub fn new(num_blocks: usize, max_model_len: usize) -> Self {
        Self {
            max_batched_tokens: 8192,
            max_num_seqs: 256,
            block_size: 16,
            num_blocks,
            max_model_len,
            enable_prefix_cache: true,
            chunked_prefill: true,
            vocab_size: None,
        }
    }
}

/// Why [`Scheduler::new`], [`Scheduler::schedule`], [`Scheduler::update`] or
/// [`Scheduler::abort`] refused; nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SchedulerError {
    /// A configuration field is out of range.
    #[error("{field}: {reason}")]
    Config {
        /// The [`SchedulerConfig`] field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// No unfinished request has this id.
    #[error("id: no unfinished request {0}")]
    UnknownRequest(RequestId),
    /// `schedule` was called while the previous plan had not been passed to `update`.
    #[error("plan: step {0} has not been passed to update yet")]
    PlanOutstanding(u64),
    /// `update` got a plan that is not the latest one scheduled.
    #[error("plan: step {got} is not the outstanding step {expected:?}")]
    StalePlan {
        /// The plan's step.
        got: u64,
        /// The step waiting for its update, if any.
        expected: Option<u64>,
    },
    /// `update` got no sampled token for a sequence that needs one.
    #[error("sampled: no token for request {0}")]
    MissingToken(RequestId),
    /// `update` got a token for a request that needs none this step, or two for one request.
    #[error("sampled: unexpected token for request {0}")]
    UnexpectedToken(RequestId),
    /// The block manager refused an operation the scheduler believed valid (a bug).
    #[error(transparent)]
    Kv(#[from] KvError),
}

#[derive(Clone, Debug)]
struct Seq<S> {
    prompt: Vec<u32>,
    output: Vec<u32>,
    params: RequestParams<S>,
    /// Tokens (of prompt ++ output) whose KV is in the cache.
    num_computed: usize,
    /// The whole token list has been computed once since (re)admission: now decoding.
    prefilled: bool,
    /// Prefix-cache hit at first admission.
    cached_tokens: Option<usize>,
    running: bool,
}

impl<S> Seq<S> {
    fn len(&self) -> usize {
        self.prompt.len() + self.output.len()
    }

    fn token(&self, i: usize) -> u32 {
        match i.checked_sub(self.prompt.len()) {
            None => self.prompt[i],
            Some(j) => self.output[j],
        }
    }

    fn tokens(&self) -> Vec<u32> {
        let mut t = Vec::with_capacity(self.len());
        t.extend_from_slice(&self.prompt);
        t.extend_from_slice(&self.output);
        t
    }

    fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt.len(),
            completion_tokens: self.output.len(),
            cached_tokens: self.cached_tokens.unwrap_or(0),
        }
    }
}

/// Continuous batching over a paged KV cache: requests in, [`StepPlan`]s out, sampled tokens
/// back in, [`Event`]s out. `S` is the runner's sampling-parameter type, carried untouched.
/// See the [module docs](super) for the policy and an example.
#[derive(Debug)]
pub struct Scheduler<S = ()> {
    cfg: SchedulerConfig,
    kv: BlockManager,
    seqs: HashMap<RequestId, Seq<S>>,
    /// Front first; preempted requests go to the front.
    waiting: VecDeque<RequestId>,
    /// Admission order, oldest first.
    running: Vec<RequestId>,
    step: u64,
    outstanding: Option<u64>,
    pending_freed: Vec<u32>,
    pending_finished: Vec<RequestId>,
    num_preemptions: u64,
}

impl<S> Scheduler<S> {
    /// A scheduler over a fresh pool. Errors name the [`SchedulerConfig`] field.
    pub fn new(cfg: SchedulerConfig) -> Result<Self, SchedulerError> {
        let bad = |field, reason: &str| {
            Err(SchedulerError::Config {
                field,
                reason: reason.into(),
            })
        };
        if cfg.max_batched_tokens == 0 {
            return bad("max_batched_tokens", "must be > 0");
        }
        if cfg.max_num_seqs == 0 {
            return bad("max_num_seqs", "must be > 0");
        }
        if cfg.max_model_len < 2 {
            return bad("max_model_len", "must be at least 2");
        }
        if !cfg.chunked_prefill && cfg.max_batched_tokens < cfg.max_model_len {
            return bad(
                "max_batched_tokens",
                "must be at least max_model_len when chunked_prefill is off",
            );
        }
        let kv = BlockManager::new(cfg.num_blocks, cfg.block_size, cfg.enable_prefix_cache)
            .map_err(|e| match e {
                KvError::Invalid { arg, reason } => SchedulerError::Config { field: arg, reason },
                e => SchedulerError::Kv(e),
            })?;
        Ok(Self {
            cfg,
            kv,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            step: 0,
            outstanding: None,
            pending_freed: Vec::new(),
            pending_finished: Vec::new(),
            num_preemptions: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// The block manager (read-only: tables, stats, invariant checks).
    pub fn kv(&self) -> &BlockManager {
        &self.kv
    }

    /// KV pool usage.
    pub fn kv_stats(&self) -> KvStats {
        self.kv.stats()
    }

    /// Requests waiting for admission (new or preempted).
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Requests holding KV blocks.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Whether any request is unfinished.
    pub fn has_unfinished(&self) -> bool {
        !self.seqs.is_empty()
    }

    /// Preemptions since the start.
    pub fn num_preemptions(&self) -> u64 {
        self.num_preemptions
    }

    /// Parameters of unfinished request `id`.
    pub fn params(&self, id: RequestId) -> Option<&RequestParams<S>> {
        self.seqs.get(&id).map(|s| &s.params)
    }

    /// Tokens generated so far by unfinished request `id`.
    pub fn output_tokens(&self, id: RequestId) -> Option<&[u32]> {
        self.seqs.get(&id).map(|s| &s.output[..])
    }

    /// Queues a request after checking it (each error names the field). It runs from the next
    /// [`schedule`](Self::schedule).
    pub fn add_request(&mut self, req: Request<S>) -> Result<(), RequestError> {
        let (len, max_new, ctx) = (
            req.prompt.len(),
            req.params.max_new_tokens,
            self.cfg.max_model_len,
        );
        if self.seqs.contains_key(&req.id) {
            return Err(RequestError::DuplicateId(req.id));
        }
        if len == 0 {
            return Err(RequestError::EmptyPrompt);
        }
        if len > ctx {
            return Err(RequestError::PromptTooLong {
                len,
                max_model_len: ctx,
            });
        }
        if let Some(vocab_size) = self.cfg.vocab_size {
            if let Some((index, &token)) = req
                .prompt
                .iter()
                .enumerate()
                .find(|(_, &t)| t >= vocab_size)
            {
                return Err(RequestError::TokenOutOfRange {
                    index,
                    token,
                    vocab_size,
                });
            }
        }
        if max_new == 0 {
            return Err(RequestError::ZeroMaxNewTokens);
        }
        if max_new > ctx - len {
            return Err(RequestError::ExceedsContext {
                prompt_len: len,
                max_new_tokens: max_new,
                max_model_len: ctx,
            });
        }
        // The last sampled token never needs KV.
        let needed = blocks_needed(len + max_new - 1, self.cfg.block_size);
        if needed > self.cfg.num_blocks {
            return Err(RequestError::ExceedsCache {
                max_new_tokens: max_new,
                needed,
                num_blocks: self.cfg.num_blocks,
            });
        }
        self.seqs.insert(
            req.id,
            Seq {
                prompt: req.prompt,
                output: Vec::new(),
                params: req.params,
                num_computed: 0,
                prefilled: false,
                cached_tokens: None,
                running: false,
            },
        );
        self.waiting.push_back(req.id);
        Ok(())
    }

    /// Finishes request `id` now (waiting or running), releasing its blocks. Returns its
    /// [`Event::Finished`] with [`FinishReason::Abort`]. If the outstanding plan runs it, its
    /// rows are ignored by `update`.
    pub fn abort(&mut self, id: RequestId) -> Result<Event, SchedulerError> {
        if !self.seqs.contains_key(&id) {
            return Err(SchedulerError::UnknownRequest(id));
        }
        Ok(self.finish(id, FinishReason::Abort))
    }

    /// Plans the next step: decodes of running requests (oldest first), then prefill chunks of
    /// partly prefilled running requests, then of waiting requests (front first), all under
    /// `max_batched_tokens` and `max_num_seqs`. When a running request needs a block and none is
    /// free, the newest running request not yet planned this step is preempted (possibly the
    /// one asking): its blocks are freed and it goes to the front of the waiting queue, to be
    /// recomputed from its prompt and generated tokens. No waiting request is admitted in a
    /// step that preempted. The plan must be passed to [`update`](Self::update) before the
    /// next call.
    pub fn schedule(&mut self) -> Result<StepPlan, SchedulerError> {
        if let Some(step) = self.outstanding {
            return Err(SchedulerError::PlanOutstanding(step));
        }
        self.step += 1;
        let mut plan = StepPlan {
            step: self.step,
            ..StepPlan::default()
        };
        let mut budget = self.cfg.max_batched_tokens;
        let mut planned: HashSet<RequestId> = HashSet::new();

        // Running requests: decodes first, then partial prefills, each pass oldest first.
        for decode_pass in [true, false] {
            let mut i = 0;
            while i < self.running.len() && budget > 0 {
                let id = self.running[i];
                let s = &self.seqs[&id];
                let remaining = s.len() - s.num_computed;
                if s.prefilled != decode_pass || planned.contains(&id) {
                    i += 1;
                    continue;
                }
                let n = remaining.min(budget);
                if !decode_pass && !self.cfg.chunked_prefill && n < remaining {
                    break;
                }
                match self.kv.append_slots(id, n) {
                    Ok(copies) => {
                        plan.copies.extend(copies);
                        self.plan_rows(&mut plan, id, n);
                        planned.insert(id);
                        budget -= n;
                        i += 1;
                    }
                    Err(KvError::NoSpace { .. }) => {
                        let victim = *self
                            .running
                            .iter()
                            .rev()
                            .find(|v| !planned.contains(v))
                            .expect("the asking request is unplanned");
                        self.preempt(victim, &mut plan);
                        // Retry the same request unless it was the victim.
                        if victim == id {
                            continue;
                        }
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }

        // Waiting requests, front first, while nothing was preempted. A request is admitted
        // only while the free blocks cover the rest of every running prompt, its own whole
        // prompt and a watermark (1% of the pool) for the decodes' growth: admitting on the
        // first chunk alone fills the pool with half-prefilled prompts and preempts later.
        let bs = self.cfg.block_size;
        let mut reserved: usize = self
            .running
            .iter()
            .map(|id| {
                let s = &self.seqs[id];
                let have = self.kv.block_table(*id).map_or(0, <[_]>::len);
                if s.prefilled {
                    0
                } else {
                    s.len().div_ceil(bs).saturating_sub(have)
                }
            })
            .sum();
        let watermark = self.cfg.num_blocks.div_ceil(100);
        while plan.preempted_ids.is_empty()
            && budget > 0
            && self.running.len() < self.cfg.max_num_seqs
        {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let tokens = self.seqs[&id].tokens();
            let cached = self.kv.cached_prefix_len(&tokens);
            if !self.cfg.chunked_prefill && tokens.len() - cached > budget {
                break;
            }
            let need = tokens.len().div_ceil(bs) - cached / bs;
            if !self.running.is_empty() && self.kv.num_free_blocks() < reserved + need + watermark {
                break;
            }
            let alloc = match self.kv.allocate_prompt(id, &tokens, budget) {
                Ok(a) => a,
                Err(KvError::NoSpace { .. }) => break,
                Err(e) => return Err(e.into()),
            };
            let have = self.kv.block_table(id).map_or(0, <[_]>::len);
            reserved += tokens.len().div_ceil(bs).saturating_sub(have);
            self.waiting.pop_front();
            self.running.push(id);
            let s = self.seqs.get_mut(&id).expect("queued ids exist");
            s.running = true;
            s.num_computed = alloc.num_cached_tokens;
            s.cached_tokens.get_or_insert(alloc.num_cached_tokens);
            self.plan_rows(&mut plan, id, alloc.num_new_tokens);
            budget -= alloc.num_new_tokens;
        }

        plan.freed_blocks = std::mem::take(&mut self.pending_freed);
        plan.finished_ids = std::mem::take(&mut self.pending_finished);
        plan.num_scheduled_tokens = plan.num_prefill_tokens + plan.num_decode_tokens;
        self.outstanding = Some(self.step);
        Ok(plan)
    }

    /// Applies a step's results: `sampled` holds one `(request id, token)` per sequence of
    /// `plan` with `needs_logits` (rows of requests aborted since are ignored). Advances the
    /// computed tokens, registers newly full blocks in the prefix cache, appends the tokens, and
    /// finishes requests on a stop id, `max_new_tokens` or `max_model_len`. Returns, in row
    /// order, a [`Event::Token`] per sampled token and an [`Event::Finished`] per finished
    /// request. On error nothing changes (except for [`SchedulerError::Kv`], which is a bug).
    pub fn update(
        &mut self,
        plan: &StepPlan,
        sampled: &[(RequestId, u32)],
    ) -> Result<Vec<Event>, SchedulerError> {
        if self.outstanding != Some(plan.step) {
            return Err(SchedulerError::StalePlan {
                got: plan.step,
                expected: self.outstanding,
            });
        }
        let mut tokens: HashMap<RequestId, u32> = HashMap::with_capacity(sampled.len());
        for &(id, t) in sampled {
            if tokens.insert(id, t).is_some() {
                return Err(SchedulerError::UnexpectedToken(id));
            }
        }
        let live = |id: &RequestId| self.seqs.get(id).is_some_and(|s| s.running);
        for row in plan.seqs.iter().filter(|r| live(&r.id)) {
            if row.needs_logits != tokens.contains_key(&row.id) {
                return Err(if row.needs_logits {
                    SchedulerError::MissingToken(row.id)
                } else {
                    SchedulerError::UnexpectedToken(row.id)
                });
            }
        }
        let in_plan: HashSet<RequestId> = plan.seqs.iter().map(|r| r.id).collect();
        if let Some(&id) = tokens.keys().find(|id| !in_plan.contains(id)) {
            return Err(SchedulerError::UnexpectedToken(id));
        }
        self.outstanding = None;

        let mut events = Vec::new();
        for row in &plan.seqs {
            let Some(s) = self.seqs.get_mut(&row.id).filter(|s| s.running) else {
                continue;
            };
            let bs = self.cfg.block_size;
            let before = s.num_computed / bs;
            s.num_computed += row.token_ids.len();
            // Only a step that fills a block gives the prefix cache something new.
            if self.kv.prefix_cache_enabled() && s.num_computed / bs > before {
                let all = s.tokens();
                self.kv.cache_full_blocks(row.id, &all, s.num_computed)?;
            }
            let Some(&token) = tokens.get(&row.id) else {
                continue;
            };
            s.prefilled = true;
            s.output.push(token);
            events.push(Event::Token { id: row.id, token });
            let p = &s.params;
            let reason = if p.stop_token_ids.contains(&token)
                || (!p.ignore_eos && p.eos_token_ids.contains(&token))
            {
                Some(FinishReason::Stop)
            } else if s.output.len() >= p.max_new_tokens || s.len() >= self.cfg.max_model_len {
                Some(FinishReason::Length)
            } else {
                None
            };
            if let Some(reason) = reason {
                events.push(self.finish(row.id, reason));
            }
        }
        Ok(events)
    }

    fn plan_rows(&mut self, plan: &mut StepPlan, id: RequestId, n: usize) {
        let s = &self.seqs[&id];
        let start = s.num_computed;
        let is_prefill = !s.prefilled;
        plan.seqs.push(ScheduledSeq {
            id,
            token_ids: (start..start + n).map(|i| s.token(i)).collect(),
            num_computed_tokens: start,
            block_table: self
                .kv
                .block_table(id)
                .map(<[u32]>::to_vec)
                .unwrap_or_default(),
            needs_logits: start + n == s.len(),
            is_prefill,
            num_generated: s.output.len(),
        });
        if is_prefill {
            plan.num_prefill_tokens += n;
        } else {
            plan.num_decode_tokens += n;
        }
    }

    fn release(&mut self, id: RequestId) {
        if let Ok(freed) = self.kv.free(id) {
            self.pending_freed.extend(freed);
        }
        self.running.retain(|&r| r != id);
        self.pending_finished.push(id);
    }

    fn preempt(&mut self, id: RequestId, plan: &mut StepPlan) {
        self.release(id);
        let s = self.seqs.get_mut(&id).expect("running ids exist");
        s.running = false;
        s.prefilled = false;
        s.num_computed = 0;
        self.waiting.push_front(id);
        plan.preempted_ids.push(id);
        self.num_preemptions += 1;
    }

    fn finish(&mut self, id: RequestId, reason: FinishReason) -> Event {
        let s = self.seqs.remove(&id).expect("caller checked");
        if s.running {
            self.release(id);
        } else {
            self.waiting.retain(|&w| w != id);
        }
        Event::Finished {
            id,
            reason,
            usage: s.usage(),
        }
    }
}
