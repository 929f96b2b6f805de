//! What goes into the scheduler (requests, their parameters) and what comes out (events).

/// A request's id, unique among the requests the scheduler holds; also its KV sequence id.
pub type RequestId = u64;

/// A request: a prompt and how to continue it.
#[derive(Clone, Debug, PartialEq)]
pub struct Request<S = ()> {
    /// Unique among unfinished requests.
    pub id: RequestId,
    /// Prompt token ids (non-empty).
    pub prompt: Vec<u32>,
    /// Stopping rules and sampling parameters.
    pub params: RequestParams<S>,
}

/// A request's stopping rules, seed, and sampling parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestParams<S = ()> {
    /// The request finishes with [`FinishReason::Length`] after this many tokens (at least 1;
    /// `prompt + max_new_tokens` must fit `max_model_len`).
    pub max_new_tokens: usize,
    /// Sampling one of these finishes the request with [`FinishReason::Stop`].
    pub stop_token_ids: Vec<u32>,
    /// The model's end-of-sequence ids: they stop the request unless `ignore_eos`.
    pub eos_token_ids: Vec<u32>,
    /// Keep going past an end-of-sequence id (benchmarks).
    pub ignore_eos: bool,
    /// Sampling seed (with the request id and the step, it keys the sampler's random stream,
    /// so the tokens do not depend on batch mates).
    pub seed: u64,
    /// Sampling parameters: opaque to the scheduler, read by the runner through
    /// [`Scheduler::params`](super::Scheduler::params).
    pub sampling: S,
    /// `Some(k)`: a beam search of `k` beams. The request's sequence forks into `k` beam
    /// sequences at its first token ([`Scheduler::update_with_beams`](super::Scheduler::update_with_beams)
    /// decides their tokens and order every step); they always run in the same step, are never
    /// preempted (the worst case of `k` beams' KV is reserved at admission) and the request
    /// ends only when the runner says so (the stop rules above do not apply). `None`: one
    /// sampled sequence.
    pub beam_width: Option<usize>,
    /// `Some(k)`: report each generated token's log-probability and the `k` most likely
    /// tokens' (at most [`MAX_TOP_LOGPROBS`]; sampled requests only). Opaque to the
    /// scheduler: the runner computes them ([`Runner::next_logprobs`](crate::runner::Runner::next_logprobs)).
    pub top_logprobs: Option<usize>,
}

/// The most alternatives [`RequestParams::top_logprobs`] asks for (OpenAI's `top_logprobs`
/// bound).
pub const MAX_TOP_LOGPROBS: usize = 20;

impl<S: Default> RequestParams<S> {
    /// `max_new_tokens` tokens, no stop ids, seed 0, default sampling.
    pub fn new(max_new_tokens: usize) -> Self {
        Self {
            max_new_tokens,
            stop_token_ids: Vec::new(),
            eos_token_ids: Vec::new(),
            ignore_eos: false,
            seed: 0,
            sampling: S::default(),
            beam_width: None,
            top_logprobs: None,
        }
    }
}

/// Why [`Scheduler::add_request`](super::Scheduler::add_request) refused a request; the
/// message names the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// `prompt` has no tokens.
    #[error("prompt: is empty")]
    EmptyPrompt,
    /// `prompt` is longer than the model's context.
    #[error("prompt: {len} tokens exceed max_model_len {max_model_len}")]
    PromptTooLong {
        /// Prompt tokens.
        len: usize,
        /// The context.
        max_model_len: usize,
    },
    /// A prompt token id is not in the vocabulary.
    #[error("prompt[{index}]: token id {token} >= vocab size {vocab_size}")]
    TokenOutOfRange {
        /// Position in the prompt.
        index: usize,
        /// The id.
        token: u32,
        /// The vocabulary size.
        vocab_size: u32,
    },
    /// `max_new_tokens` is 0.
    #[error("max_new_tokens: must be at least 1")]
    ZeroMaxNewTokens,
    /// `prompt + max_new_tokens` does not fit the context.
    #[error("max_new_tokens: {max_new_tokens} after a {prompt_len}-token prompt exceed max_model_len {max_model_len}")]
    ExceedsContext {
        /// Prompt tokens.
        prompt_len: usize,
        /// Requested new tokens.
        max_new_tokens: usize,
        /// The context.
        max_model_len: usize,
    },
    /// The request's KV at full length needs more blocks than the whole pool.
    #[error("max_new_tokens: prompt + {max_new_tokens} tokens need {needed} KV blocks, the pool has {num_blocks}")]
    ExceedsCache {
        /// Requested new tokens.
        max_new_tokens: usize,
        /// Blocks the request needs at its longest.
        needed: usize,
        /// Blocks in the pool.
        num_blocks: usize,
    },
    /// Another unfinished request has this id.
    #[error("id: request {0} already exists")]
    DuplicateId(RequestId),
    /// Ids from [`BEAM_ID_BASE`](super::BEAM_ID_BASE) up name beam sequences.
    #[error("id: {0} is reserved for beam sequences (ids must be below 2^63)")]
    ReservedId(RequestId),
    /// `beam_width` is 0 or more beams than one step runs (every beam decodes in the same
    /// step).
    #[error("beam_width: {width} must be in 1..={max_num_seqs} (the beams one step runs: max_num_seqs and max_batched_tokens)")]
    BeamWidth {
        /// The width asked for.
        width: usize,
        /// Beams one step runs at most: `max_num_seqs`, or `max_batched_tokens` if smaller.
        max_num_seqs: usize,
    },
}

/// Why a request finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// It sampled a stop id (or an end-of-sequence id without `ignore_eos`).
    Stop,
    /// It reached `max_new_tokens` (or `max_model_len`).
    Length,
    /// [`Scheduler::abort`](super::Scheduler::abort).
    Abort,
}

/// Token counts of a finished request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens (a stop token included).
    pub completion_tokens: usize,
    /// Prompt tokens found in the prefix cache when the request was first scheduled.
    pub cached_tokens: usize,
}

/// What [`Scheduler::update`](super::Scheduler::update) and
/// [`Scheduler::abort`](super::Scheduler::abort) report, in order, per request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A new token of request `id`.
    Token {
        /// The request.
        id: RequestId,
        /// The sampled token id.
        token: u32,
    },
    /// Request `id` is done; it no longer exists in the scheduler.
    Finished {
        /// The request.
        id: RequestId,
        /// Why.
        reason: FinishReason,
        /// Token counts.
        usage: Usage,
    },
}
