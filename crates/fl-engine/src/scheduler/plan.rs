//! [`StepPlan`]: one forward step, as the runner executes it.

use std::ops::Range;

use super::RequestId;
use crate::kv::{BlockId, CowCopy};

/// One sequence's rows in a step: a prefill chunk or one decode token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledSeq {
    /// The request.
    pub id: RequestId,
    /// Token ids to run, at positions [`positions`](Self::positions).
    pub token_ids: Vec<u32>,
    /// Tokens whose KV is already in the cache: the first position of this step. The rows
    /// attend to positions `0..num_computed_tokens` in the paged cache plus their own (causal).
    pub num_computed_tokens: usize,
    /// The sequence's block table, covering at least every position of this step.
    pub block_table: Vec<BlockId>,
    /// Whether the last row's logits are sampled (the last prefill chunk, or a decode token).
    pub needs_logits: bool,
    /// Whether these rows are prompt (or recompute) rows rather than one decode token.
    pub is_prefill: bool,
    /// Tokens the request has generated so far (the sampler's step index for this row).
    pub num_generated: usize,
}

impl ScheduledSeq {
    /// Positions of [`token_ids`](Self::token_ids).
    pub fn positions(&self) -> Range<usize> {
        self.num_computed_tokens..self.num_computed_tokens + self.token_ids.len()
    }
}

/// One step for the runner (vLLM's SchedulerOutput). The runner first performs `copies`, then
/// one forward over every row of `seqs`, writing each row's K/V into its slot, then samples
/// one token per sequence with `needs_logits`, and hands them to
/// [`Scheduler::update`](super::Scheduler::update) with this plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepPlan {
    /// Step number (checked by `update`).
    pub step: u64,
    /// Decodes first (oldest first), then prefill chunks.
    pub seqs: Vec<ScheduledSeq>,
    /// Copy-on-write block copies to perform before the forward.
    pub copies: Vec<CowCopy>,
    /// Blocks released since the previous plan (their contents are no longer needed; cached
    /// ones may still be reused through the prefix cache).
    pub freed_blocks: Vec<BlockId>,
    /// Requests that left the running set since the previous plan (finished, aborted or
    /// preempted): the runner drops any per-request state it keeps.
    pub finished_ids: Vec<RequestId>,
    /// Requests preempted while planning this step (also in `finished_ids`).
    pub preempted_ids: Vec<RequestId>,
    /// Rows in the step (never above `max_batched_tokens`).
    pub num_scheduled_tokens: usize,
    /// Of those, prefill rows.
    pub num_prefill_tokens: usize,
    /// Of those, decode rows.
    pub num_decode_tokens: usize,
}

impl StepPlan {
    /// Whether the step has no rows.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Sequences whose logits must be sampled, in row order.
    pub fn logits_ids(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.seqs.iter().filter(|s| s.needs_logits).map(|s| s.id)
    }
}
