//! # Continuous batching: requests in, step plans out
//!
//! Shaped after vLLM v1 (Scheduler -> SchedulerOutput -> GPUModelRunner). The scheduler owns
//! the requests and the [`BlockManager`](crate::kv::BlockManager); it never sees kernels. The
//! runner never sees requests' policies: it executes a [`StepPlan`] and reports the sampled
//! tokens.
//!
//! ```text
//!  add_request / abort                          events: Token, Finished{reason, usage}
//!        │                                                  ▲
//!        ▼                                                  │
//!  ┌───────────── Scheduler ─────────────┐   sampled   ┌────┴─────┐
//!  │ waiting (FCFS, preempted in front)  │◄────────────┤ update() │
//!  │ running (admission order)           │             └──────────┘
//!  │ BlockManager: tables, refcounts,    │                  ▲
//!  │   CoW, prefix cache                 │                  │ (request id, token)
//!  └──────────────┬──────────────────────┘                  │
//!     schedule()  │ StepPlan: rows (ids, positions,    ┌────┴──────────────────────┐
//!                 └─ block tables, needs_logits),  ───►│ runner (GPU): CoW copies, │
//!                    CoW copies, freed blocks          │ one forward, sampling     │
//!                                                      └───────────────────────────┘
//! ```
//!
//! Policy of [`Scheduler::schedule`], every step under `max_batched_tokens` rows:
//! 1. running requests' decode tokens, oldest first;
//! 2. the next chunk of running requests still prefilling (chunked prefill: a long prompt takes
//!    what budget is left, so it never stalls the decodes);
//! 3. waiting requests, front first, up to `max_num_seqs` running: prefix-cache hit attached,
//!    first chunk planned; admission stops at the first one that does not fit.
//!
//! When a running request needs a block and none is free, the newest running request not yet
//! planned this step is preempted: blocks freed, moved to the front of the waiting queue, later
//! recomputed from prompt + generated tokens (its own blocks often come back from the prefix
//! cache). A request alone always fits the pool ([`Scheduler::add_request`] checks), so the
//! oldest request always progresses and every request finishes.
//!
//! A request's tokens do not depend on its batch mates: each row attends to its own block table
//! only, and recomputation replays exactly the same tokens.
//!
//! ```
//! use std::collections::HashMap;
//! use fl_engine::scheduler::{Event, Request, RequestParams, Scheduler, SchedulerConfig};
//!
//! // A fake model: the next token depends only on the sequence so far.
//! fn next_token(tokens: &[u32]) -> u32 {
//!     tokens.iter().fold(7u32, |h, &t| h.wrapping_mul(31).wrapping_add(t)) % 100
//! }
//!
//! let mut cfg = SchedulerConfig::new(64, 256);
//! cfg.max_batched_tokens = 32; // small steps: the 40-token prompt is prefilled in two chunks
//! let mut sched = Scheduler::<()>::new(cfg)?;
//! let prompts = [(1u64, (0..40).collect::<Vec<u32>>()), (2, vec![3, 1, 4])];
//! let mut seqs: HashMap<u64, Vec<u32>> = HashMap::new(); // what the fake model has seen
//! for (id, prompt) in prompts {
//!     seqs.insert(id, prompt.clone());
//!     sched.add_request(Request { id, prompt, params: RequestParams::new(5) })?;
//! }
//!
//! let mut finished = 0;
//! while sched.has_unfinished() {
//!     let plan = sched.schedule()?;
//!     assert!(plan.num_scheduled_tokens <= 32);
//!     // The runner: copies, one forward over every row, a token for each row needing logits.
//!     let sampled: Vec<(u64, u32)> =
//!         plan.logits_ids().map(|id| (id, next_token(&seqs[&id]))).collect();
//!     for event in sched.update(&plan, &sampled)? {
//!         match event {
//!             Event::Token { id, token } => seqs.get_mut(&id).unwrap().push(token),
//!             Event::Finished { .. } => finished += 1,
//!         }
//!     }
//! }
//! assert_eq!(finished, 2);
//! assert_eq!(seqs[&1].len(), 45);
//! assert_eq!(seqs[&2].len(), 8);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#[cfg(test)]
mod beam_tests;
#[cfg(test)]
mod lookahead_tests;
mod plan;
mod policy;
mod request;
#[cfg(test)]
mod tests;

pub use plan::{ScheduledSeq, StepPlan};
pub use policy::{
    BeamStep, Scheduler, SchedulerConfig, SchedulerError, BEAM_ID_BASE, PENDING_TOKEN,
};
pub use request::{
    Event, FinishReason, Request, RequestError, RequestId, RequestParams, Usage, MAX_TOP_LOGPROBS,
};
