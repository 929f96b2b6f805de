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
    /// Most prompt tokens (over all requests) of a step that also decodes (chunked prefill
    /// only): every running request's next token waits for the whole step, so prompt chunks
    /// beside decodes stretch every decoding request's inter-token latency. Steps without
    /// decodes are never limited. `None`: no limit beyond `max_batched_tokens`.
    ///
    /// A budget near one prompt per step also spreads requests that arrive together (a
    /// closed loop's waves): their first tokens, and so their ends and the next arrivals,
    /// come a step apart, after which each step prefills about what arrived since the last.
    pub max_prefill_tokens_beside_decodes: Option<usize>,
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
            max_prefill_tokens_beside_decodes: None,
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
    /// `update_with_beams` got a [`BeamStep`] that does not fit its group.
    #[error("beams: request {id}: {reason}")]
    InvalidBeamStep {
        /// The beam request.
        id: RequestId,
        /// Why.
        reason: String,
    },
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
    /// The beam request this sequence is a beam of.
    group: Option<RequestId>,
}

/// The token id of a [`Scheduler::schedule_ahead`] row: the one its request samples in the
/// outstanding step (not known to the host yet).
pub const PENDING_TOKEN: u32 = u32::MAX;

/// Sequence ids from here up are beams of beam requests (request ids stay below).
pub const BEAM_ID_BASE: RequestId = 1 << 63;

/// A beam request's sequences.
#[derive(Clone, Debug)]
struct Group {
    /// Its beams' sequence ids in beam order: the request's own id until the first token,
    /// then `width` ids from [`BEAM_ID_BASE`] up.
    members: Vec<RequestId>,
    width: usize,
    /// KV blocks the group holds at most: the prompt's full blocks (shared by every beam)
    /// plus each beam's own blocks for the prompt's tail and every generated token.
    worst_blocks: usize,
    prompt_tokens: usize,
    cached_tokens: usize,
    generated: usize,
}

/// One beam request's step, for [`Scheduler::update_with_beams`]: the new beams, each the
/// continuation of one current beam by one token (the runner's beam search decides them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BeamStep {
    /// The beam request (its id at `add_request`).
    pub id: RequestId,
    /// `[beam_width]`: the current beam (index into [`Scheduler::beams`]) each new beam
    /// continues; its KV blocks are shared, not copied (copy-on-write of the partial block).
    pub reorder: Vec<usize>,
    /// `[beam_width]`: the token each new beam appends.
    pub tokens: Vec<u32>,
    /// The search is over: the request finishes with this reason (its beams are freed).
    pub finish: Option<FinishReason>,
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
    /// A lookahead plan scheduled while `outstanding` runs; it is outstanding next.
    ahead: Option<u64>,
    pending_freed: Vec<u32>,
    pending_finished: Vec<RequestId>,
    num_preemptions: u64,
    groups: HashMap<RequestId, Group>,
    next_beam_id: RequestId,
}

impl<S: Clone> Scheduler<S> {
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
        if cfg.max_prefill_tokens_beside_decodes == Some(0) {
            return bad("max_prefill_tokens_beside_decodes", "must be > 0 (or None)");
        }
        if !cfg.chunked_prefill && cfg.max_prefill_tokens_beside_decodes.is_some() {
            return bad(
                "max_prefill_tokens_beside_decodes",
                "limits prefill chunks: needs chunked_prefill",
            );
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
            ahead: None,
            pending_freed: Vec::new(),
            pending_finished: Vec::new(),
            num_preemptions: 0,
            groups: HashMap::new(),
            next_beam_id: BEAM_ID_BASE,
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

    /// Whether request `id` (a sampled request or a beam request, by the id it was added
    /// with) is waiting or running.
    pub fn contains(&self, id: RequestId) -> bool {
        self.groups.contains_key(&id) || self.seqs.get(&id).is_some_and(|s| s.group.is_none())
    }

    /// The current beams of beam request `id`, in beam order (sequence ids of the plan's rows):
    /// the request's own id until its first token, then `beam_width` beam ids.
    pub fn beams(&self, id: RequestId) -> Option<&[RequestId]> {
        self.groups.get(&id).map(|g| &g.members[..])
    }

    /// The beam request that sequence `seq` is a beam of, and its index among
    /// [`beams`](Self::beams); `None` for a sampled request.
    pub fn beam_of(&self, seq: RequestId) -> Option<(RequestId, usize)> {
        let group = self.seqs.get(&seq)?.group?;
        let index = self.groups[&group].members.iter().position(|&m| m == seq)?;
        Some((group, index))
    }

    /// Queues a request after checking it (each error names the field). It runs from the next
    /// [`schedule`](Self::schedule).
    pub fn add_request(&mut self, req: Request<S>) -> Result<(), RequestError> {
        let (len, max_new, ctx) = (
            req.prompt.len(),
            req.params.max_new_tokens,
            self.cfg.max_model_len,
        );
        if req.id >= BEAM_ID_BASE {
            return Err(RequestError::ReservedId(req.id));
        }
        if self.seqs.contains_key(&req.id) || self.groups.contains_key(&req.id) {
            return Err(RequestError::DuplicateId(req.id));
        }
        if let Some(width) = req.params.beam_width {
            // Every beam decodes in the same step: the width must fit one.
            let most = self.cfg.max_num_seqs.min(self.cfg.max_batched_tokens);
            if width == 0 || width > most {
                return Err(RequestError::BeamWidth {
                    width,
                    max_num_seqs: most,
                });
            }
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
        let bs = self.cfg.block_size;
        let needed = match req.params.beam_width {
            None => blocks_needed(len + max_new - 1, bs),
            Some(k) => len / bs + k * blocks_needed(len % bs + max_new - 1, bs),
        };
        if needed > self.cfg.num_blocks {
            return Err(RequestError::ExceedsCache {
                max_new_tokens: max_new,
                needed,
                num_blocks: self.cfg.num_blocks,
            });
        }
        let group = req.params.beam_width.map(|width| {
            self.groups.insert(
                req.id,
                Group {
                    members: vec![req.id],
                    width,
                    worst_blocks: needed,
                    prompt_tokens: len,
                    cached_tokens: 0,
                    generated: 0,
                },
            );
            req.id
        });
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
                group,
            },
        );
        self.waiting.push_back(req.id);
        Ok(())
    }

    /// Finishes request `id` now (waiting or running), releasing its blocks. Returns its
    /// [`Event::Finished`] with [`FinishReason::Abort`]. If the outstanding plan runs it, its
    /// rows are ignored by `update`.
    pub fn abort(&mut self, id: RequestId) -> Result<Event, SchedulerError> {
        if let Some(group) = self.seqs.get(&id).and_then(|s| s.group) {
            return Ok(self.finish_group(group, FinishReason::Abort));
        }
        if self.groups.contains_key(&id) {
            return Ok(self.finish_group(id, FinishReason::Abort));
        }
        if !self.seqs.contains_key(&id) {
            return Err(SchedulerError::UnknownRequest(id));
        }
        Ok(self.finish(id, FinishReason::Abort))
    }

    /// Blocks each running beam request may still take: its worst case less what its beams
    /// hold (shared blocks counted once).
    fn beam_reserves(&self) -> HashMap<RequestId, usize> {
        self.groups
            .iter()
            .filter(|(_, g)| self.seqs.get(&g.members[0]).is_some_and(|s| s.running))
            .map(|(&id, g)| {
                let held: HashSet<u32> = g
                    .members
                    .iter()
                    .flat_map(|&m| self.kv.block_table(m).unwrap_or(&[]).iter().copied())
                    .collect();
                (id, g.worst_blocks.saturating_sub(held.len()))
            })
            .collect()
    }

    /// Plans the next step: decodes of running requests (oldest first), then prefill chunks of
    /// partly prefilled running requests, then of waiting requests (front first), all under
    /// `max_batched_tokens` and `max_num_seqs` (and, once the step decodes, at most
    /// `max_prefill_tokens_beside_decodes` prompt tokens in all). When a running request needs
    /// a block and none is free, the newest running request not yet planned this step is
    /// preempted (possibly the one asking): its blocks are freed and it goes to the front of
    /// the waiting queue, to be recomputed from its prompt and generated tokens. No waiting
    /// request is admitted in a step that preempted. The plan must be passed to
    /// [`update`](Self::update) before the next call.
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

        // Running requests: decodes first, then partial prefills, each pass oldest first. A
        // sampled request's blocks may not dip into what the beam requests reserved.
        let mut reserves = self.beam_reserves();
        let mut reserve: usize = reserves.values().sum();
        for decode_pass in [true, false] {
            for id in self.running.clone() {
                if budget == 0 {
                    break;
                }
                let Some(s) = self.seqs.get(&id).filter(|s| s.running) else {
                    continue; // preempted while planning this pass
                };
                if s.prefilled != decode_pass || planned.contains(&id) {
                    continue;
                }
                let remaining = s.len() - s.num_computed;
                if let Some(group) = s.group {
                    // Every beam of a group in the same step, or none.
                    let members = self.groups[&group].members.clone();
                    let n: Vec<usize> = if decode_pass {
                        members
                            .iter()
                            .map(|m| self.seqs[m].len() - self.seqs[m].num_computed)
                            .collect()
                    } else {
                        vec![remaining.min(budget).min(self.prefill_left(&plan))]
                    };
                    if n[0] == 0 {
                        continue; // the step's prompt tokens beside decodes are spent
                    }
                    let total: usize = n.iter().sum();
                    let whole = decode_pass || self.cfg.chunked_prefill || n[0] == remaining;
                    let appends: Vec<(RequestId, usize)> =
                        members.iter().copied().zip(n.iter().copied()).collect();
                    let need = self.kv.append_need_all(&appends)?;
                    planned.extend(members.iter().copied());
                    if total > budget || !whole || !self.make_room(need, &planned, &mut plan) {
                        continue; // waits for a step with room; never preempted
                    }
                    for (&m, &k) in members.iter().zip(&n) {
                        plan.copies.extend(self.kv.append_slots(m, k)?);
                        self.plan_rows(&mut plan, m, k);
                        budget -= k;
                    }
                    // Its beams now hold exactly the `need` blocks they took.
                    if let Some(r) = reserves.get_mut(&group) {
                        *r = r.saturating_sub(need);
                    }
                    reserve = reserves.values().sum();
                    continue;
                }
                let n = if decode_pass {
                    remaining.min(budget)
                } else {
                    remaining.min(budget).min(self.prefill_left(&plan))
                };
                if !decode_pass && !self.cfg.chunked_prefill && n < remaining {
                    break;
                }
                if n == 0 {
                    continue; // the step's prompt tokens beside decodes are spent
                }
                loop {
                    let need = self.kv.append_need(id, n)?;
                    if self.kv.num_free_blocks() >= need + reserve {
                        plan.copies.extend(self.kv.append_slots(id, n)?);
                        self.plan_rows(&mut plan, id, n);
                        planned.insert(id);
                        budget -= n;
                        break;
                    }
                    // The newest unplanned sampled request (possibly this one) gives way.
                    let victim = *self
                        .running
                        .iter()
                        .rev()
                        .find(|v| !planned.contains(v) && self.seqs[v].group.is_none())
                        .expect("the asking request is an unplanned sampled request");
                    self.preempt(victim, &mut plan);
                    if victim == id {
                        break;
                    }
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
                if s.prefilled || s.group.is_some() {
                    0
                } else {
                    s.len().div_ceil(bs).saturating_sub(have)
                }
            })
            .sum::<usize>()
            + reserve;
        debug_assert_eq!(reserve, self.beam_reserves().values().sum::<usize>());
        // Sequence slots: a beam request takes its width from admission on.
        let mut slots: usize = self
            .running
            .iter()
            .map(|id| match self.seqs[id].group {
                Some(g) if self.groups[&g].members.len() == 1 => self.groups[&g].width,
                _ => 1,
            })
            .sum();
        let watermark = self.cfg.num_blocks.div_ceil(100);
        while plan.preempted_ids.is_empty() && budget > 0 && self.prefill_left(&plan) > 0 {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let group = self.seqs[&id].group.map(|g| &self.groups[&g]);
            let width = group.map_or(1, |g| g.width);
            if slots + width > self.cfg.max_num_seqs {
                break;
            }
            let tokens = self.seqs[&id].tokens();
            let cached = self.kv.cached_prefix_len(&tokens);
            if !self.cfg.chunked_prefill && tokens.len() - cached > budget {
                break;
            }
            let need = match group {
                None => tokens.len().div_ceil(bs) - cached / bs,
                Some(g) => g.worst_blocks - cached / bs,
            };
            if !self.running.is_empty() && self.kv.num_free_blocks() < reserved + need + watermark {
                break;
            }
            let most = budget.min(self.prefill_left(&plan));
            let alloc = match self.kv.allocate_prompt(id, &tokens, most) {
                Ok(a) => a,
                Err(KvError::NoSpace { .. }) => break,
                Err(e) => return Err(e.into()),
            };
            let have = self.kv.block_table(id).map_or(0, <[_]>::len);
            reserved += need.saturating_sub(have);
            slots += width;
            self.waiting.pop_front();
            self.running.push(id);
            let s = self.seqs.get_mut(&id).expect("queued ids exist");
            s.running = true;
            s.num_computed = alloc.num_cached_tokens;
            s.cached_tokens.get_or_insert(alloc.num_cached_tokens);
            if let Some(g) = s.group {
                self.groups
                    .get_mut(&g)
                    .expect("a group per beam request")
                    .cached_tokens = alloc.num_cached_tokens;
            }
            self.plan_rows(&mut plan, id, alloc.num_new_tokens);
            budget -= alloc.num_new_tokens;
        }

        plan.freed_blocks = std::mem::take(&mut self.pending_freed);
        plan.finished_ids = std::mem::take(&mut self.pending_finished);
        plan.num_scheduled_tokens = plan.num_prefill_tokens + plan.num_decode_tokens;
        self.outstanding = Some(self.step);
        Ok(plan)
    }

    /// Prompt tokens the step planned so far as `plan` may still take:
    /// [`SchedulerConfig::max_prefill_tokens_beside_decodes`] less those planned, once the
    /// step decodes; else no limit beyond the budget.
    fn prefill_left(&self, plan: &StepPlan) -> usize {
        match self.cfg.max_prefill_tokens_beside_decodes {
            Some(c) if plan.num_decode_tokens > 0 => c.saturating_sub(plan.num_prefill_tokens),
            _ => usize::MAX,
        }
    }

    /// Plans the step after the outstanding one before its tokens are known (asynchronous
    /// scheduling, so that the runner can queue step N+1 on the GPU while step N runs): only
    /// in the steady state where the outstanding plan decodes exactly `expected` (every
    /// running request, in order), nothing waits, no beam request runs, and the next token of
    /// each fits the pool and the budget without preempting. Then every running request gets
    /// one decode row whose token is [`PENDING_TOKEN`]: the token the outstanding step
    /// samples for it, which the runner copies on the device. `None` when the state is not
    /// that one (then update the outstanding plan and [`schedule`](Self::schedule)).
    ///
    /// A request that finishes when the outstanding plan is updated wastes its lookahead row
    /// (its KV write lands in its own freed block, and the row is ignored by `update`). Plans
    /// are updated in order: the outstanding one, then this one.
    ///
    /// Errors: [`SchedulerError::PlanOutstanding`] when no plan is outstanding or a lookahead
    /// plan already is.
    pub fn schedule_ahead(
        &mut self,
        expected: &[RequestId],
    ) -> Result<Option<StepPlan>, SchedulerError> {
        let (Some(_), None) = (self.outstanding, self.ahead) else {
            return Err(SchedulerError::PlanOutstanding(
                self.ahead.or(self.outstanding).unwrap_or(self.step),
            ));
        };
        if !self.waiting.is_empty()
            || !self.groups.is_empty()
            || self.running != expected
            || self.running.len() > self.cfg.max_batched_tokens
        {
            return Ok(None);
        }
        let mut need = 0;
        for id in &self.running {
            let s = &self.seqs[id];
            if !s.prefilled || s.num_computed + 1 != s.len() || s.len() >= self.cfg.max_model_len {
                return Ok(None);
            }
            need += self.kv.append_need(*id, 1)?;
        }
        if need > self.kv.num_free_blocks() {
            return Ok(None);
        }
        self.step += 1;
        let mut plan = StepPlan {
            step: self.step,
            ..StepPlan::default()
        };
        for id in self.running.clone() {
            plan.copies.extend(self.kv.append_slots(id, 1)?);
            let s = &self.seqs[&id];
            plan.seqs.push(ScheduledSeq {
                id,
                token_ids: vec![PENDING_TOKEN],
                num_computed_tokens: s.len(),
                block_table: self.kv.block_table(id)?.to_vec(),
                needs_logits: true,
                is_prefill: false,
                num_generated: s.output.len() + 1,
            });
        }
        plan.num_decode_tokens = plan.seqs.len();
        plan.num_scheduled_tokens = plan.seqs.len();
        plan.freed_blocks = std::mem::take(&mut self.pending_freed);
        plan.finished_ids = std::mem::take(&mut self.pending_finished);
        self.ahead = Some(self.step);
        Ok(Some(plan))
    }

    /// Applies a step's results: `sampled` holds one `(request id, token)` per sequence of
    /// `plan` with `needs_logits` (rows of requests aborted since are ignored). Advances the
    /// computed tokens, registers newly full blocks in the prefix cache, appends the tokens, and
    /// finishes requests on a stop id, `max_new_tokens` or `max_model_len`. Returns, in row
    /// order, a [`Event::Token`] per sampled token and an [`Event::Finished`] per finished
    /// request. On error nothing changes (except for [`SchedulerError::Kv`], which is a bug).
    /// A plan with beam requests' rows needs [`update_with_beams`](Self::update_with_beams).
    pub fn update(
        &mut self,
        plan: &StepPlan,
        sampled: &[(RequestId, u32)],
    ) -> Result<Vec<Event>, SchedulerError> {
        self.update_with_beams(plan, sampled, &[])
    }

    /// [`update`](Self::update) for a plan that also ran beam requests: `beams` holds one
    /// [`BeamStep`] per beam request whose rows needed logits (its beams' rows carry no entry
    /// in `sampled`). Each new beam forks the KV blocks of the beam it continues (shared,
    /// copy-on-write), the old beams are freed. A finished beam request reports one
    /// [`Event::Finished`] (its usage counts the generated length of its beams); beams report
    /// no [`Event::Token`]: the runner reads the hypotheses from its beam search.
    pub fn update_with_beams(
        &mut self,
        plan: &StepPlan,
        sampled: &[(RequestId, u32)],
        beams: &[BeamStep],
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
        let group_of = |id: &RequestId| self.seqs.get(id).and_then(|s| s.group);
        let mut groups_due: Vec<RequestId> = Vec::new();
        for row in plan.seqs.iter().filter(|r| live(&r.id)) {
            if let Some(g) = group_of(&row.id) {
                if tokens.contains_key(&row.id) {
                    return Err(SchedulerError::UnexpectedToken(row.id));
                }
                if row.needs_logits && !groups_due.contains(&g) {
                    groups_due.push(g);
                }
            } else if row.needs_logits != tokens.contains_key(&row.id) {
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
        let vocab = self.cfg.vocab_size;
        for (i, b) in beams.iter().enumerate() {
            let bad = |reason: String| Err(SchedulerError::InvalidBeamStep { id: b.id, reason });
            if beams[..i].iter().any(|o| o.id == b.id) {
                return bad("two steps for one request".into());
            }
            let Some(g) = self.groups.get(&b.id) else {
                // Aborted since the plan: ignored, like its rows.
                continue;
            };
            if !groups_due.contains(&b.id) {
                return bad("its beams needed no logits in this plan".into());
            }
            if b.finish.is_none() && (b.reorder.len() != g.width || b.tokens.len() != g.width) {
                return bad(format!(
                    "{} reorder entries and {} tokens for {} beams",
                    b.reorder.len(),
                    b.tokens.len(),
                    g.width
                ));
            }
            if let Some(&r) = b.reorder.iter().find(|&&r| r >= g.members.len()) {
                return bad(format!(
                    "reorder entry {r} >= {} current beams",
                    g.members.len()
                ));
            }
            if let (Some(v), Some(&t)) = (vocab, b.tokens.iter().find(|&&t| Some(t) >= vocab)) {
                return bad(format!("token {t} >= vocab size {v}"));
            }
        }
        if let Some(&g) = groups_due
            .iter()
            .find(|g| !beams.iter().any(|b| b.id == **g))
        {
            return Err(SchedulerError::MissingToken(g));
        }
        self.outstanding = self.ahead.take();

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
            if s.group.is_some() {
                continue;
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
        for b in beams {
            if !self.groups.contains_key(&b.id) {
                continue;
            }
            if let Some(reason) = b.finish {
                // The finishing step generated a token too.
                self.groups.get_mut(&b.id).expect("checked above").generated += 1;
                events.push(self.finish_group(b.id, reason));
            } else {
                self.reorder_beams(b)?;
            }
        }
        Ok(events)
    }

    /// Replaces a group's beams by `step`'s: new beam i forks old beam `reorder[i]` and
    /// appends `tokens[i]`; then the old beams are freed (blocks still shared stay).
    fn reorder_beams(&mut self, step: &BeamStep) -> Result<(), SchedulerError> {
        let old = self.groups[&step.id].members.clone();
        let mut new = Vec::with_capacity(step.reorder.len());
        for (&r, &token) in step.reorder.iter().zip(&step.tokens) {
            let id = self.next_beam_id;
            self.next_beam_id += 1;
            self.kv.fork(old[r], id)?;
            let mut s = self.seqs[&old[r]].clone();
            s.prefilled = true;
            s.output.push(token);
            self.seqs.insert(id, s);
            new.push(id);
        }
        let at = self
            .running
            .iter()
            .position(|id| *id == old[0])
            .expect("a running group's beams are running");
        self.running.retain(|id| !old.contains(id));
        self.running.splice(at..at, new.iter().copied());
        for id in &old {
            self.pending_freed.extend(self.kv.free(*id)?);
            self.seqs.remove(id);
            if *id != step.id {
                self.pending_finished.push(*id);
            }
        }
        let g = self
            .groups
            .get_mut(&step.id)
            .expect("checked by the caller");
        g.members = new;
        g.generated += 1;
        Ok(())
    }

    /// Frees every beam of group `id` and reports the request finished.
    fn finish_group(&mut self, id: RequestId, reason: FinishReason) -> Event {
        let g = self.groups.remove(&id).expect("caller checked");
        for m in &g.members {
            if let Some(s) = self.seqs.remove(m) {
                if s.running {
                    if let Ok(freed) = self.kv.free(*m) {
                        self.pending_freed.extend(freed);
                    }
                    self.running.retain(|r| r != m);
                    self.pending_finished.push(*m);
                } else {
                    self.waiting.retain(|w| w != m);
                }
            }
        }
        if !self.pending_finished.contains(&id) {
            self.pending_finished.push(id);
        }
        Event::Finished {
            id,
            reason,
            usage: Usage {
                prompt_tokens: g.prompt_tokens,
                completion_tokens: g.generated,
                cached_tokens: g.cached_tokens,
            },
        }
    }

    /// Preempts the newest unplanned sampled requests until `need` blocks are free; false
    /// (nothing more to preempt) when that is not enough.
    fn make_room(
        &mut self,
        need: usize,
        planned: &HashSet<RequestId>,
        plan: &mut StepPlan,
    ) -> bool {
        while self.kv.num_free_blocks() < need {
            let Some(&victim) = self
                .running
                .iter()
                .rev()
                .find(|v| !planned.contains(v) && self.seqs[v].group.is_none())
            else {
                return false;
            };
            self.preempt(victim, plan);
        }
        true
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
