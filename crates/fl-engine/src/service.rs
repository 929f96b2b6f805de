//! A serving front end: the model runs on a worker thread, any number of threads submit
//! requests and stream their tokens.
//!
//! ```text
//!  server threads                          worker thread (owns the Engine and its Runner)
//!  ──────────────                          ──────────────────────────────────────────────
//!  Service::submit ──Submit──┐             idle: block on the command channel
//!       ▲  (waits for the    ├──commands──► busy: drain commands without blocking, then
//!       │   one-shot reply)  │                    Runner::step, send each event to its stream
//!  Service::abort ───Abort───┤
//!  drop(RequestStream) Abort─┘
//!  RequestStream ◄── Token{token, index} … Token, then one Finished{reason, usage} or Error
//!                    (a beam request: no Tokens; Beams(hypotheses) just before its Finished)
//! ```
//!
//! - [`Service::spawn`] creates the [`Engine`] and its [`Runner`] *on* the worker thread (the
//!   engine is not `Send`), and returns once they are ready: a load or configuration error is
//!   returned by `spawn` itself. [`Service::with_backend`] does the same for any [`Backend`]
//!   (tests use a CPU mock); both run the same loop.
//! - [`Service::submit`] assigns the request a unique id, checks its sampling parameters, and
//!   waits for the worker to queue it (at most the end of the step in flight), so a refused
//!   request is an `Err` naming the field ([`RequestError`], [`ServiceError::Invalid`]).
//! - A [`RequestStream`] yields [`StreamEvent::Token`]s (with the token's index in the output),
//!   then exactly one terminal event: [`StreamEvent::Finished`] (reason, usage) or
//!   [`StreamEvent::Error`]. A step that fails ends the requests that step ran with that error;
//!   the other requests continue and the service keeps serving.
//! - Dropping a stream before its terminal event aborts its request.
//! - [`Service::submit_beam`] (and [`Service::submit_beam_with_sink`]) queues a beam search
//!   ([`BeamParams`]): its stream has no [`StreamEvent::Token`] (so no time to first token),
//!   only [`StreamEvent::Beams`] with the hypotheses, best first, just before its
//!   [`StreamEvent::Finished`]. An aborted beam request gets no hypotheses.
//! - [`Service::submit_with_sink`] is the variant for async servers: it does not wait, and
//!   the worker hands each event to a callback (which forwards it to an async channel)
//!   instead of a [`RequestStream`]; a refusal is the callback's first and only event.
//! - [`Service::shutdown`] (or dropping the [`Service`]) ends every request in flight with
//!   [`FinishReason::Abort`] and joins the worker. If the worker panics, every open stream gets
//!   [`ServiceError::WorkerPanicked`] and so does every later call: nothing waits forever.
//! - Timing: each event is stamped on the worker when it is sent (after the step that made
//!   it), so [`RequestStream::first_token_at`] minus [`RequestStream::submitted_at`] is the
//!   time to first token without the consumer's own delays. [`Service::stats`] is a snapshot
//!   for `/metrics`, refreshed by the worker after each step.
//!
//! `Service` is `Send + Sync`: share it between server threads behind an `Arc`.
//!
//! ```no_run
//! use std::sync::Arc;
//! use fl_engine::engine::Engine;
//! use fl_engine::presets::preset;
//! use fl_engine::runner::RunnerConfig;
//! use fl_engine::scheduler::RequestParams;
//! use fl_engine::service::{Service, StreamEvent};
//! use fl_engine::weights::WeightSource;
//! use fl_kernels::f16;
//! use fl_sampling::SamplingParams;
//!
//! let model = preset("tiny")?;
//! let load = move || Engine::<f16>::load(0, model, WeightSource::Dummy { seed: 1 }, None);
//! let service = Arc::new(Service::spawn(load, RunnerConfig::default())?);
//!
//! // A server thread: submit, then stream the tokens as they come.
//! let handler = {
//!     let service = Arc::clone(&service);
//!     std::thread::spawn(move || {
//!         let mut params = RequestParams::<SamplingParams>::new(16);
//!         params.sampling = SamplingParams { temperature: 0.7, top_p: 0.9, ..Default::default() };
//!         params.seed = 42;
//!         let stream = match service.submit(vec![1, 15043, 29892], params) {
//!             Ok(s) => s,
//!             Err(e) => return eprintln!("400 Bad Request: {e}"), // names the field
//!         };
//!         let started = stream.submitted_at();
//!         for event in stream {
//!             match event {
//!                 StreamEvent::Token { token, index, .. } => println!("data: {index} {token}"),
//!                 StreamEvent::Finished { reason, usage } => println!("done: {reason:?} {usage:?}"),
//!                 StreamEvent::Beams(_) => unreachable!("only beam requests get hypotheses"),
//!                 StreamEvent::Error(e) => eprintln!("500: {e}"),
//!             }
//!         }
//!         println!("took {:?}", started.elapsed());
//!     })
//! };
//! handler.join().expect("handler thread");
//! let stats = service.stats();
//! println!("waiting {} running {}", stats.backend.waiting, stats.backend.running);
//! service.shutdown()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fl_sampling::{SamplingParams, BEAM_MAX_KEEP};

use crate::beam::BeamParams;
use crate::dtype::RunDType;
use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::kv::KvStats;
use crate::runner::{Runner, RunnerConfig, TokenLogprobs};
use crate::scheduler::{
    Event, FinishReason, Request, RequestError, RequestId, RequestParams, Usage,
};
use crate::tp::AnyEngine;

/// What the service loop needs from a model runner. Implemented by [`Runner`]; tests
/// implement it on a CPU mock.
///
/// Contract of [`step`](Backend::step): every request it holds ends with exactly one
/// [`Event::Finished`], except that a failed step drops the requests it ran (without events)
/// and returns the error; the requests it did not run stay queued. A beam request reports no
/// [`Event::Token`]; once its `Finished` (not an abort) has been returned,
/// [`take_beams`](Backend::take_beams) gives its hypotheses.
pub trait Backend {
    /// Queues a request (its id is unique). Errors: [`EngineError::Request`] naming the field.
    fn add_request(&mut self, req: Request<SamplingParams>) -> Result<()>;
    /// Queues a beam search request ([`Runner::add_beam_request`]). The default refuses it.
    ///
    /// Errors: [`EngineError::Invalid`] naming the [`BeamParams`] field at fault, or `beam`
    /// when the backend has no beam search; as [`add_request`](Backend::add_request).
    fn add_beam_request(&mut self, req: Request<SamplingParams>, beam: BeamParams) -> Result<()> {
        let _ = (req, beam);
        Err(EngineError::invalid(
            "beam",
            "beam search is not supported by this backend",
        ))
    }
    /// The hypotheses of finished beam request `id`, best first (generated tokens with the end
    /// id, score); taking them clears them. `None` for any other id. The default has none.
    fn take_beams(&mut self, id: RequestId) -> Option<Vec<(Vec<u32>, f64)>> {
        let _ = id;
        None
    }
    /// The log-probabilities of request `id`'s next token not yet taken, when it asked for
    /// them ([`RequestParams::top_logprobs`]); called once per [`Event::Token`], after the
    /// step. The default has none.
    fn next_logprobs(&mut self, id: RequestId) -> Option<TokenLogprobs> {
        let _ = id;
        None
    }
    /// Ends a queued or running request now; returns its [`Event::Finished`].
    fn abort(&mut self, id: RequestId) -> Result<Event>;
    /// Runs one step; returns its events in order.
    fn step(&mut self) -> Result<Vec<Event>>;
    /// Whether any request is waiting or running.
    fn has_unfinished(&self) -> bool;
    /// Whether request `id` is waiting or running.
    fn contains(&self, id: RequestId) -> bool;
    /// Queue lengths and KV usage (called after every step: keep it cheap).
    fn stats(&self) -> BackendStats;
}

impl<T: RunDType> Backend for Runner<'_, T> {
    fn add_request(&mut self, req: Request<SamplingParams>) -> Result<()> {
        Runner::add_request(self, req)
    }

    fn add_beam_request(&mut self, req: Request<SamplingParams>, beam: BeamParams) -> Result<()> {
        Runner::add_beam_request(self, req, beam)
    }

    fn take_beams(&mut self, id: RequestId) -> Option<Vec<(Vec<u32>, f64)>> {
        Runner::take_beams(self, id)
    }

    fn next_logprobs(&mut self, id: RequestId) -> Option<TokenLogprobs> {
        Runner::next_logprobs(self, id)
    }

    fn abort(&mut self, id: RequestId) -> Result<Event> {
        Runner::abort(self, id)
    }

    fn step(&mut self) -> Result<Vec<Event>> {
        Runner::step(self)
    }

    fn has_unfinished(&self) -> bool {
        Runner::has_unfinished(self)
    }

    fn contains(&self, id: RequestId) -> bool {
        self.scheduler().contains(id)
    }

    fn stats(&self) -> BackendStats {
        let (s, last) = (self.scheduler(), self.last_step());
        BackendStats {
            waiting: s.num_waiting(),
            running: s.num_running(),
            preemptions: s.num_preemptions(),
            kv: s.kv_stats(),
            last_prefill_tokens: last.prefill_tokens,
            last_decode_tokens: last.decode_tokens,
        }
    }
}

/// A [`Backend`]'s queues and KV pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendStats {
    /// Requests waiting for admission (new or preempted).
    pub waiting: usize,
    /// Requests holding KV blocks.
    pub running: usize,
    /// Preemptions since the start.
    pub preemptions: u64,
    /// KV pool usage and prefix-cache counters.
    pub kv: KvStats,
    /// Prompt tokens the last step computed (prefill chunks).
    pub last_prefill_tokens: usize,
    /// Decode tokens the last step computed.
    pub last_decode_tokens: usize,
}

/// Upper bounds (seconds) of [`StepTimes`]' buckets; a last bucket takes the rest.
pub const STEP_SECONDS_BUCKETS: [f64; 16] = [
    0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5,
    1.0,
];

/// A histogram of engine step times: the wall time of each [`Backend::step`], which waits for
/// the step's tokens (with the runner's lookahead, the next step is already queued then, so
/// in the steady state consecutive steps' times add up to the GPU's).
///
/// ```
/// use std::time::Duration;
/// use fl_engine::service::StepTimes;
/// let mut t = StepTimes::default();
/// t.observe(Duration::from_millis(12));
/// assert_eq!((t.count, t.buckets[3]), (1, 1)); // 10 ms < 12 ms <= 12.5 ms
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepTimes {
    /// Steps observed.
    pub count: u64,
    /// Their total time, in nanoseconds.
    pub sum_ns: u64,
    /// Steps per bucket of [`STEP_SECONDS_BUCKETS`] (not cumulative; the last: longer ones).
    pub buckets: [u64; STEP_SECONDS_BUCKETS.len() + 1],
}

impl StepTimes {
    /// Records one step of duration `d`.
    pub fn observe(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        let i = STEP_SECONDS_BUCKETS.partition_point(|&b| b < s);
        self.buckets[i] += 1;
        self.count += 1;
        self.sum_ns = self
            .sum_ns
            .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }
}

/// A snapshot of the service for metrics ([`Service::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceStats {
    /// The backend after the last step.
    pub backend: BackendStats,
    /// Requests accepted and not yet ended.
    pub active: usize,
    /// Requests accepted since the start.
    pub submitted: u64,
    /// Requests ended since the start (finished, aborted or failed).
    pub ended: u64,
    /// Steps run since the start.
    pub steps: u64,
    /// Of those, steps that failed.
    pub failed_steps: u64,
    /// Times of the steps that computed decode tokens only.
    pub decode_steps: StepTimes,
    /// Times of the steps that computed prompt tokens (with decode tokens beside them or
    /// not): a request's inter-token latency is long when such a step runs.
    pub prefill_steps: StepTimes,
}

/// Why the service refused a call or ended a request.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ServiceError {
    /// The scheduler refused the request (the message names the field).
    #[error(transparent)]
    Request(#[from] RequestError),
    /// A request parameter out of range, e.g. a sampling parameter (`arg` names it).
    #[error("{arg}: {reason}")]
    Invalid {
        /// The parameter.
        arg: &'static str,
        /// Why.
        reason: String,
    },
    /// The engine failed: loading, building the runner, or a step (shared by the requests
    /// that step ran).
    #[error(transparent)]
    Engine(Arc<EngineError>),
    /// The service has shut down.
    #[error("service: shut down")]
    Shutdown,
    /// The worker thread panicked; the service is down.
    #[error("service: the worker thread panicked: {0}")]
    WorkerPanicked(String),
    /// The worker thread could not be started.
    #[error("service: cannot start the worker thread: {0}")]
    Thread(String),
}

impl From<EngineError> for ServiceError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Request(r) => ServiceError::Request(r),
            e => ServiceError::Engine(Arc::new(e)),
        }
    }
}

/// One event of one request's [`RequestStream`].
#[derive(Clone, Debug)]
pub enum StreamEvent {
    /// The next generated token.
    Token {
        /// The token id.
        token: u32,
        /// Its index in the output: 0, 1, 2, ...
        index: usize,
        /// Its log-probability and the most likely tokens at its step, when the request asked
        /// for them ([`RequestParams::top_logprobs`]).
        logprobs: Option<TokenLogprobs>,
    },
    /// A beam request's hypotheses, best first: generated tokens (the end id included, if
    /// one ended it) and score (log-probability sum / length ^ `length_penalty`). Sent just
    /// before its [`Finished`](Self::Finished), unless it was aborted; not terminal.
    Beams(Vec<(Vec<u32>, f64)>),
    /// The request is done (terminal).
    Finished {
        /// Stop id, length, or abort ([`Service::abort`], a dropped stream, shutdown).
        reason: FinishReason,
        /// Token counts.
        usage: Usage,
    },
    /// The request was ended by an error: a failed step, or the worker's death (terminal).
    Error(ServiceError),
}

impl StreamEvent {
    /// Whether this is the stream's last event ([`Finished`](Self::Finished) or
    /// [`Error`](Self::Error)).
    pub fn is_terminal(&self) -> bool {
        matches!(self, StreamEvent::Finished { .. } | StreamEvent::Error(_))
    }
}

/// An event and when the worker sent it.
type Stamped = (StreamEvent, Instant);

/// A callback that receives a request's events on the worker thread
/// ([`Service::submit_with_sink`]).
type SinkFn = Box<dyn FnMut(StreamEvent, Instant) -> bool + Send>;

/// Where the worker sends a request's events.
enum Sink {
    /// A [`RequestStream`]'s channel.
    Channel(Sender<Stamped>),
    /// A [`Service::submit_with_sink`] callback.
    Callback(CallbackSink),
}

impl Sink {
    /// Sends `event`; `false` when the receiver is gone.
    fn send(&mut self, event: StreamEvent, at: Instant) -> bool {
        match self {
            Sink::Channel(tx) => tx.send((event, at)).is_ok(),
            Sink::Callback(c) => c.send(event, at),
        }
    }
}

/// A callback sink that gets exactly one terminal event: if it is dropped before one (the
/// worker died, or stopped with the submit still queued), its `Drop` sends why.
struct CallbackSink {
    f: SinkFn,
    shared: Arc<Shared>,
    ended: bool,
}

impl CallbackSink {
    fn send(&mut self, event: StreamEvent, at: Instant) -> bool {
        if self.ended {
            return false;
        }
        self.ended = event.is_terminal();
        (self.f)(event, at)
    }
}

impl Drop for CallbackSink {
    fn drop(&mut self) {
        if !self.ended {
            let e = StreamEvent::Error(self.shared.stop_reason());
            self.send(e, Instant::now());
        }
    }
}

enum Command {
    Submit {
        req: Box<Request<SamplingParams>>,
        /// `Some`: a beam search request.
        beam: Option<BeamParams>,
        events: Sink,
        /// `None` for a callback sink: a refusal is its first (terminal) event instead.
        reply: Option<SyncSender<std::result::Result<(), ServiceError>>>,
    },
    Abort(RequestId),
    Shutdown,
}

/// State the worker shares with every handle.
struct Shared {
    next_id: AtomicU64,
    stats: Mutex<ServiceStats>,
    /// Why the worker stopped, once it has (set before it drops any channel).
    stopped: Mutex<Option<ServiceError>>,
}

/// A lock that a panic elsewhere does not make unusable (the data are plain snapshots).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn stopped(&self) -> Option<ServiceError> {
        lock(&self.stopped).clone()
    }

    fn set_stopped(&self, e: ServiceError) {
        lock(&self.stopped).get_or_insert(e);
    }

    /// Why a channel to the worker is closed.
    fn stop_reason(&self) -> ServiceError {
        self.stopped().unwrap_or_else(|| {
            // Only a worker unwinding from a panic closes a channel before recording why.
            ServiceError::WorkerPanicked("the worker thread stopped without answering".into())
        })
    }
}

/// Checks what the scheduler does not: the sampling parameters (a bad one would otherwise
/// fail the step of every request batched with it).
fn check_sampling(p: &SamplingParams) -> std::result::Result<(), ServiceError> {
    p.validate(0).map_err(|e| match e {
        fl_sampling::Error::Param {
            param,
            value,
            reason,
            ..
        } => ServiceError::Invalid {
            arg: param,
            reason: format!("{value} {reason}"),
        },
        e => ServiceError::Invalid {
            arg: "sampling",
            reason: e.to_string(),
        },
    })
}

/// [`check_sampling`] and the beam parameters, so that the worker never sees a width whose
/// candidate count overflows.
fn check_beam(p: &SamplingParams, beam: &BeamParams) -> std::result::Result<(), ServiceError> {
    check_sampling(p)?;
    beam.validate().map_err(refusal)?;
    if beam.num_beams > BEAM_MAX_KEEP {
        return Err(ServiceError::Invalid {
            arg: "num_beams",
            reason: format!("{} must be at most {BEAM_MAX_KEEP}", beam.num_beams),
        });
    }
    Ok(())
}

/// A request the backend refused: an [`EngineError::Invalid`] names a request field, so it is
/// the client's error, not the engine's.
fn refusal(e: EngineError) -> ServiceError {
    match e {
        EngineError::Invalid { arg, reason } => ServiceError::Invalid { arg, reason },
        e => ServiceError::from(e),
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".into()
    }
}

/// A model served on its own thread. See the [module docs](self).
pub struct Service {
    cmd: Sender<Command>,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Service {
    /// Starts a worker thread that calls `load` to create the engine, builds a [`Runner`]
    /// over it with `cfg`, and serves requests until [`shutdown`](Self::shutdown). Returns
    /// once the runner is ready.
    ///
    /// Errors: `load`'s error or the runner's ([`EngineError::Invalid`] naming a
    /// [`RunnerConfig`] field, allocation) as [`ServiceError::Engine`];
    /// [`ServiceError::WorkerPanicked`] if either panicked; [`ServiceError::Thread`].
    pub fn spawn<T, F>(load: F, cfg: RunnerConfig) -> std::result::Result<Service, ServiceError>
    where
        T: RunDType,
        F: FnOnce() -> Result<Engine<T>> + Send + 'static,
    {
        Self::spawn_any(move || load().map(AnyEngine::One), cfg)
    }

    /// [`spawn`](Self::spawn) for a model on one GPU or split over several
    /// ([`crate::tp::AnyEngine`]): `load` runs on the worker thread (a tensor-parallel engine
    /// starts its rank threads from there), and the runner is [`AnyEngine::runner`].
    ///
    /// Errors: as [`spawn`](Self::spawn).
    pub fn spawn_any<T, F>(load: F, cfg: RunnerConfig) -> std::result::Result<Service, ServiceError>
    where
        T: RunDType,
        F: FnOnce() -> Result<AnyEngine<T>> + Send + 'static,
    {
        Self::start(move |w: &mut Worker| {
            let mut engine = match load() {
                Ok(e) => e,
                Err(e) => return w.init_failed(e),
            };
            let opened = engine.runner(&cfg);
            match opened {
                Ok(mut runner) => w.serve(&mut runner),
                Err(e) => w.init_failed(e),
            };
        })
    }

    /// [`spawn`](Self::spawn) for any [`Backend`], which `make` builds on the worker thread.
    ///
    /// Errors: `make`'s error as [`ServiceError::Engine`] (or [`ServiceError::Request`]);
    /// [`ServiceError::WorkerPanicked`] if it panicked; [`ServiceError::Thread`].
    pub fn with_backend<B, F>(make: F) -> std::result::Result<Service, ServiceError>
    where
        B: Backend,
        F: FnOnce() -> Result<B> + Send + 'static,
    {
        Self::start(move |w: &mut Worker| match make() {
            Ok(mut b) => w.serve(&mut b),
            Err(e) => w.init_failed(e),
        })
    }

    fn start<F>(body: F) -> std::result::Result<Service, ServiceError>
    where
        F: FnOnce(&mut Worker) + Send + 'static,
    {
        let (cmd, rx) = mpsc::channel();
        let (init_tx, init_rx) = mpsc::sync_channel(1);
        let shared = Arc::new(Shared {
            next_id: AtomicU64::new(0),
            stats: Mutex::new(ServiceStats::default()),
            stopped: Mutex::new(None),
        });
        let mut worker = Worker {
            rx,
            shared: Arc::clone(&shared),
            init: Some(init_tx),
            active: HashMap::new(),
            stats: ServiceStats::default(),
            stepped: None,
        };
        let thread = std::thread::Builder::new()
            .name("fl-service".into())
            .spawn(move || {
                // The worker lives outside the unwinding closure, so that after a panic it can
                // still tell every waiting submitter and stream why.
                if let Err(p) = catch_unwind(AssertUnwindSafe(|| body(&mut worker))) {
                    worker.died(panic_message(&*p));
                }
            })
            .map_err(|e| ServiceError::Thread(e.to_string()))?;
        let service = Service {
            cmd,
            shared,
            thread: Mutex::new(Some(thread)),
        };
        match init_rx.recv() {
            Ok(Ok(())) => Ok(service),
            Ok(Err(e)) => {
                let _ = service.shutdown();
                Err(e)
            }
            Err(_) => {
                let _ = service.shutdown();
                Err(service.shared.stop_reason())
            }
        }
    }

    /// Queues a request for `prompt` and returns the stream of its events. The service assigns
    /// the id ([`RequestStream::id`]); `params.seed` seeds its sampling. Waits for the worker
    /// to accept the request, which it does between steps.
    ///
    /// Errors: [`ServiceError::Invalid`] naming a sampling parameter out of range;
    /// [`ServiceError::Request`] naming the field the scheduler refused (empty prompt, prompt
    /// or `max_new_tokens` beyond the context or the KV pool, token id outside the vocabulary);
    /// [`ServiceError::Shutdown`] or [`ServiceError::WorkerPanicked`] once the service is down.
    pub fn submit(
        &self,
        prompt: Vec<u32>,
        params: RequestParams<SamplingParams>,
    ) -> std::result::Result<RequestStream, ServiceError> {
        check_sampling(&params.sampling)?;
        self.submit_stream(prompt, params, None)
    }

    /// Queues a beam search request for `prompt` ([`Runner::add_beam_request`]: `beam` sets
    /// its width, `max_new_tokens` and end ids; `params.sampling`'s penalties apply, its
    /// temperature and truncation do not). The stream has no [`StreamEvent::Token`]: it ends
    /// with [`StreamEvent::Beams`] (the `beam.num_return_sequences` best hypotheses, best
    /// first) and then [`StreamEvent::Finished`] (its usage as the backend counts it).
    ///
    /// Errors: as [`submit`](Self::submit); [`ServiceError::Invalid`] naming the
    /// [`BeamParams`] field at fault (`num_beams` beyond what the backend keeps, ...), or
    /// `beam` for a backend without beam search; [`ServiceError::Request`] with
    /// [`RequestError::BeamWidth`] for more beams than the backend runs in one step.
    ///
    /// ```no_run
    /// # fn demo(service: &fl_engine::service::Service) -> Result<(), fl_engine::service::ServiceError> {
    /// use fl_engine::beam::BeamParams;
    /// use fl_engine::scheduler::RequestParams;
    /// use fl_engine::service::StreamEvent;
    /// let mut beam = BeamParams::new(4, 32); // 4 beams, at most 32 new tokens
    /// beam.num_return_sequences = 2;
    /// beam.eos_token_ids = vec![2];
    /// let stream = service.submit_beam(vec![1, 15043], RequestParams::new(32), beam)?;
    /// for event in stream {
    ///     if let StreamEvent::Beams(hyps) = event {
    ///         for (tokens, score) in hyps {
    ///             println!("{score:.3}: {tokens:?}");
    ///         }
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn submit_beam(
        &self,
        prompt: Vec<u32>,
        params: RequestParams<SamplingParams>,
        beam: BeamParams,
    ) -> std::result::Result<RequestStream, ServiceError> {
        check_beam(&params.sampling, &beam)?;
        self.submit_stream(prompt, params, Some(beam))
    }

    fn submit_stream(
        &self,
        prompt: Vec<u32>,
        params: RequestParams<SamplingParams>,
        beam: Option<BeamParams>,
    ) -> std::result::Result<RequestStream, ServiceError> {
        if let Some(e) = self.shared.stopped() {
            return Err(e);
        }
        let submitted_at = Instant::now();
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (events, rx) = mpsc::channel();
        let (reply, reply_rx) = mpsc::sync_channel(1);
        let req = Box::new(Request { id, prompt, params });
        let (events, reply) = (Sink::Channel(events), Some(reply));
        self.cmd
            .send(Command::Submit {
                req,
                beam,
                events,
                reply,
            })
            .map_err(|_| self.shared.stop_reason())?;
        match reply_rx.recv() {
            Ok(Ok(())) => Ok(RequestStream {
                id,
                rx,
                cmd: self.cmd.clone(),
                shared: Arc::clone(&self.shared),
                submitted_at,
                first_token_at: None,
                last_event_at: None,
                ended: false,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(self.shared.stop_reason()),
        }
    }

    /// Queues a request for `prompt` without waiting: its events go to `sink`, which the
    /// worker calls in order (tokens, then exactly one terminal event, each with the instant
    /// it was sent) and which returns `false` once its receiver is gone (the request is then
    /// aborted at its next token). For async servers: the sink forwards to an async channel,
    /// and no thread waits per request. Returns the request's id (for [`abort`](Self::abort)).
    ///
    /// A request the scheduler refuses gets one [`StreamEvent::Error`] with
    /// [`ServiceError::Request`] naming the field, as its first and only event. The sink runs
    /// on the worker thread between steps: it must be quick and must not panic (a panic there
    /// takes the service down).
    ///
    /// Errors (the sink is then never called): [`ServiceError::Invalid`] naming a sampling
    /// parameter out of range; [`ServiceError::Shutdown`] or [`ServiceError::WorkerPanicked`]
    /// once the service is down.
    ///
    /// ```no_run
    /// # fn demo(service: &fl_engine::service::Service) -> Result<(), fl_engine::service::ServiceError> {
    /// use fl_engine::scheduler::RequestParams;
    /// use fl_engine::service::StreamEvent;
    /// let (tx, rx) = std::sync::mpsc::channel();
    /// let id = service.submit_with_sink(vec![1, 2, 3], RequestParams::new(8), move |e, _at| {
    ///     tx.send(e).is_ok()
    /// })?;
    /// for event in rx {
    ///     if let StreamEvent::Token { token, .. } = event {
    ///         println!("request {id}: {token}");
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn submit_with_sink<F>(
        &self,
        prompt: Vec<u32>,
        params: RequestParams<SamplingParams>,
        sink: F,
    ) -> std::result::Result<RequestId, ServiceError>
    where
        F: FnMut(StreamEvent, Instant) -> bool + Send + 'static,
    {
        check_sampling(&params.sampling)?;
        self.submit_sink(prompt, params, None, Box::new(sink))
    }

    /// [`submit_beam`](Self::submit_beam) without waiting, its events going to `sink` as
    /// in [`submit_with_sink`](Self::submit_with_sink): [`StreamEvent::Beams`] then
    /// [`StreamEvent::Finished`], or a refusal as the only event.
    ///
    /// Errors (the sink is then never called): [`ServiceError::Invalid`] naming a sampling or
    /// [`BeamParams`] field out of range; [`ServiceError::Shutdown`] or
    /// [`ServiceError::WorkerPanicked`] once the service is down.
    pub fn submit_beam_with_sink<F>(
        &self,
        prompt: Vec<u32>,
        params: RequestParams<SamplingParams>,
        beam: BeamParams,
        sink: F,
    ) -> std::result::Result<RequestId, ServiceError>
    where
        F: FnMut(StreamEvent, Instant) -> bool + Send + 'static,
    {
        check_beam(&params.sampling, &beam)?;
        self.submit_sink(prompt, params, Some(beam), Box::new(sink))
    }

    fn submit_sink(
        &self,
        prompt: Vec<u32>,
        params: RequestParams<SamplingParams>,
        beam: Option<BeamParams>,
        sink: SinkFn,
    ) -> std::result::Result<RequestId, ServiceError> {
        if let Some(e) = self.shared.stopped() {
            return Err(e);
        }
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let events = Sink::Callback(CallbackSink {
            f: sink,
            shared: Arc::clone(&self.shared),
            ended: false,
        });
        let req = Box::new(Request { id, prompt, params });
        let cmd = Command::Submit {
            req,
            beam,
            events,
            reply: None,
        };
        if let Err(mpsc::SendError(cmd)) = self.cmd.send(cmd) {
            // The error is returned here: the sink must not report it too.
            if let Command::Submit {
                events: Sink::Callback(mut c),
                ..
            } = cmd
            {
                c.ended = true;
            }
            return Err(self.shared.stop_reason());
        }
        Ok(id)
    }

    /// Aborts request `id` (from any thread): its stream gets [`StreamEvent::Finished`] with
    /// [`FinishReason::Abort`]. An id that has already ended is ignored.
    ///
    /// Errors: [`ServiceError::Shutdown`] or [`ServiceError::WorkerPanicked`] once the service
    /// is down.
    pub fn abort(&self, id: RequestId) -> std::result::Result<(), ServiceError> {
        self.cmd
            .send(Command::Abort(id))
            .map_err(|_| self.shared.stop_reason())
    }

    /// The worker's latest snapshot (refreshed after every step and command batch).
    pub fn stats(&self) -> ServiceStats {
        *lock(&self.shared.stats)
    }

    /// Whether the worker is serving (not shut down, not dead).
    pub fn is_running(&self) -> bool {
        self.shared.stopped().is_none()
    }

    /// Stops the worker: requests in flight end with [`FinishReason::Abort`], later calls
    /// get [`ServiceError::Shutdown`]; waits for the thread (and the step it is running). Also
    /// done by `Drop`. Calling it again does nothing.
    ///
    /// Errors: [`ServiceError::WorkerPanicked`] if the worker had died of a panic.
    pub fn shutdown(&self) -> std::result::Result<(), ServiceError> {
        let _ = self.cmd.send(Command::Shutdown);
        let handle = lock(&self.thread).take();
        if let Some(h) = handle {
            if let Err(p) = h.join() {
                self.shared
                    .set_stopped(ServiceError::WorkerPanicked(panic_message(&*p)));
            }
        }
        match self.shared.stopped() {
            Some(e @ ServiceError::WorkerPanicked(_)) => Err(e),
            _ => Ok(()),
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// The events of one request, in order: tokens, then one terminal event
/// ([`StreamEvent::is_terminal`]), after which the stream is ended (`recv` gives `None`,
/// `recv_timeout` / `try_recv` give `Disconnected`). Also an iterator (blocking). Dropping it
/// before the terminal event aborts the request.
pub struct RequestStream {
    id: RequestId,
    rx: Receiver<Stamped>,
    cmd: Sender<Command>,
    shared: Arc<Shared>,
    submitted_at: Instant,
    first_token_at: Option<Instant>,
    last_event_at: Option<Instant>,
    ended: bool,
}

impl RequestStream {
    /// The request's id (for [`Service::abort`], logs).
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// When [`Service::submit`] was called.
    pub fn submitted_at(&self) -> Instant {
        self.submitted_at
    }

    /// When the worker sent the first token, once it has been received.
    pub fn first_token_at(&self) -> Option<Instant> {
        self.first_token_at
    }

    /// When the worker sent the last event received (inter-token latency: the difference
    /// between two tokens' values).
    pub fn last_event_at(&self) -> Option<Instant> {
        self.last_event_at
    }

    /// Whether the terminal event has been received.
    pub fn is_ended(&self) -> bool {
        self.ended
    }

    /// The next event, waiting for it; `None` once the stream has ended.
    pub fn recv(&mut self) -> Option<StreamEvent> {
        if self.ended {
            return None;
        }
        Some(match self.rx.recv() {
            Ok(e) => self.note(e),
            Err(_) => self.lost(),
        })
    }

    /// The next event, waiting at most `timeout`. `Err(Timeout)`: none yet;
    /// `Err(Disconnected)`: the stream has ended.
    pub fn recv_timeout(
        &mut self,
        timeout: Duration,
    ) -> std::result::Result<StreamEvent, RecvTimeoutError> {
        if self.ended {
            return Err(RecvTimeoutError::Disconnected);
        }
        match self.rx.recv_timeout(timeout) {
            Ok(e) => Ok(self.note(e)),
            Err(RecvTimeoutError::Timeout) => Err(RecvTimeoutError::Timeout),
            Err(RecvTimeoutError::Disconnected) => Ok(self.lost()),
        }
    }

    /// The next event if one is ready. `Err(Empty)`: none yet; `Err(Disconnected)`: the
    /// stream has ended.
    pub fn try_recv(&mut self) -> std::result::Result<StreamEvent, TryRecvError> {
        if self.ended {
            return Err(TryRecvError::Disconnected);
        }
        match self.rx.try_recv() {
            Ok(e) => Ok(self.note(e)),
            Err(TryRecvError::Empty) => Err(TryRecvError::Empty),
            Err(TryRecvError::Disconnected) => Ok(self.lost()),
        }
    }

    /// Aborts the request ([`Service::abort`]); its `Finished` event still arrives.
    pub fn abort(&self) {
        let _ = self.cmd.send(Command::Abort(self.id));
    }

    fn note(&mut self, (event, at): Stamped) -> StreamEvent {
        if matches!(event, StreamEvent::Token { .. }) && self.first_token_at.is_none() {
            self.first_token_at = Some(at);
        }
        self.last_event_at = Some(at);
        self.ended = event.is_terminal();
        event
    }

    /// The worker dropped this stream without a terminal event: it is down.
    fn lost(&mut self) -> StreamEvent {
        self.ended = true;
        StreamEvent::Error(self.shared.stop_reason())
    }
}

impl Iterator for RequestStream {
    type Item = StreamEvent;

    fn next(&mut self) -> Option<StreamEvent> {
        self.recv()
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.ended {
            self.abort();
        }
    }
}

impl std::fmt::Debug for RequestStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestStream")
            .field("id", &self.id)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("running", &self.is_running())
            .finish_non_exhaustive()
    }
}

/// A request the worker is serving.
struct Active {
    events: Sink,
    prompt_len: usize,
    generated: usize,
    /// A beam request: its hypotheses go out before its `Finished`.
    beam: bool,
    /// It asked for log-probabilities: each token's goes out with it.
    logprobs: bool,
}

/// The worker thread's state; the loop is [`Worker::serve`], generic over the backend.
struct Worker {
    rx: Receiver<Command>,
    shared: Arc<Shared>,
    /// Answered once the backend is built (or failed to be).
    init: Option<SyncSender<std::result::Result<(), ServiceError>>>,
    active: HashMap<RequestId, Active>,
    stats: ServiceStats,
    /// How long the step since the last publish took (a step that succeeded).
    stepped: Option<Duration>,
}

impl Worker {
    fn init_failed(&mut self, e: EngineError) {
        let e = ServiceError::from(e);
        self.shared.set_stopped(e.clone());
        if let Some(init) = self.init.take() {
            let _ = init.send(Err(e));
        }
    }

    /// The loop: block for a command when idle; when busy take every queued command without
    /// blocking, then step. Returns after a shutdown, having ended every request.
    fn serve<B: Backend + ?Sized>(&mut self, b: &mut B) {
        self.publish(b);
        if let Some(init) = self.init.take() {
            let _ = init.send(Ok(()));
        }
        'serve: loop {
            if self.active.is_empty() {
                // Every handle gone (recv error) also stops the loop.
                match self.rx.recv() {
                    Ok(cmd) => {
                        if self.handle(b, cmd).is_break() {
                            break 'serve;
                        }
                    }
                    Err(_) => break 'serve,
                }
            }
            loop {
                match self.rx.try_recv() {
                    Ok(cmd) => {
                        if self.handle(b, cmd).is_break() {
                            break 'serve;
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => break 'serve,
                }
            }
            if !self.active.is_empty() {
                self.step(b);
            }
            self.publish(b);
        }
        self.shutdown(b);
    }

    fn handle<B: Backend + ?Sized>(&mut self, b: &mut B, cmd: Command) -> ControlFlow<()> {
        match cmd {
            Command::Submit {
                req,
                beam,
                mut events,
                reply,
            } => {
                let (id, prompt_len, is_beam) = (req.id, req.prompt.len(), beam.is_some());
                let logprobs = req.params.top_logprobs.is_some();
                let answer = match beam {
                    Some(beam) => b.add_beam_request(*req, beam).map_err(refusal),
                    None => b.add_request(*req).map_err(ServiceError::from),
                };
                let Some(reply) = reply else {
                    // A callback sink: a refusal is its only event.
                    match answer {
                        Ok(()) => {
                            let generated = 0;
                            self.active.insert(
                                id,
                                Active {
                                    events,
                                    prompt_len,
                                    generated,
                                    beam: is_beam,
                                    logprobs,
                                },
                            );
                            self.stats.submitted += 1;
                        }
                        Err(e) => {
                            events.send(StreamEvent::Error(e), Instant::now());
                        }
                    }
                    return ControlFlow::Continue(());
                };
                if answer.is_ok() {
                    self.active.insert(
                        id,
                        Active {
                            events,
                            prompt_len,
                            generated: 0,
                            beam: is_beam,
                            logprobs,
                        },
                    );
                    self.stats.submitted += 1;
                }
                // A submitter that is gone leaves a stream nobody holds: its Drop never
                // comes, so the request is aborted here.
                if reply.send(answer).is_err() {
                    self.abort(b, id);
                }
            }
            Command::Abort(id) => self.abort(b, id),
            Command::Shutdown => return ControlFlow::Break(()),
        }
        ControlFlow::Continue(())
    }

    fn step<B: Backend + ?Sized>(&mut self, b: &mut B) {
        let t0 = Instant::now();
        let result = b.step();
        let now = Instant::now();
        self.stats.steps += 1;
        match result {
            Ok(events) => {
                self.stepped = Some(now - t0);
                for e in events {
                    self.dispatch(b, e, now);
                }
                if !self.active.is_empty() && !b.has_unfinished() {
                    // A backend that dropped requests silently would leave them waiting forever.
                    let e = ServiceError::Engine(Arc::new(EngineError::invalid(
                        "backend",
                        "requests ended without a Finished event",
                    )));
                    self.end_all(&e, now);
                }
            }
            Err(e) => {
                self.stats.failed_steps += 1;
                let e = ServiceError::Engine(Arc::new(e));
                let mut lost: Vec<RequestId> = self
                    .active
                    .keys()
                    .copied()
                    .filter(|&id| !b.contains(id))
                    .collect();
                if lost.is_empty() {
                    // It failed before running any request: without this it would fail again
                    // on every step.
                    lost = self.active.keys().copied().collect();
                    for &id in &lost {
                        let _ = b.abort(id);
                    }
                }
                for id in lost {
                    self.end(id, StreamEvent::Error(e.clone()), now);
                }
            }
        }
    }

    fn dispatch<B: Backend + ?Sized>(&mut self, b: &mut B, e: Event, now: Instant) {
        match e {
            Event::Token { id, token } => {
                let Some(a) = self.active.get_mut(&id) else {
                    return;
                };
                let index = a.generated;
                a.generated += 1;
                let logprobs = if a.logprobs {
                    b.next_logprobs(id)
                } else {
                    None
                };
                let ev = StreamEvent::Token {
                    token,
                    index,
                    logprobs,
                };
                if !a.events.send(ev, now) {
                    // The stream is gone; its Abort command may still be queued.
                    self.abort(b, id);
                }
            }
            Event::Finished { id, reason, usage } => {
                let Some(a) = self.active.get_mut(&id) else {
                    return;
                };
                if a.beam && reason != FinishReason::Abort {
                    let Some(hyps) = b.take_beams(id) else {
                        let e = EngineError::invalid(
                            "backend",
                            format!("beam request {id} finished without hypotheses"),
                        );
                        self.end(
                            id,
                            StreamEvent::Error(ServiceError::Engine(Arc::new(e))),
                            now,
                        );
                        return;
                    };
                    // A gone receiver is noticed by the Finished that follows.
                    a.events.send(StreamEvent::Beams(hyps), now);
                }
                self.end(id, StreamEvent::Finished { reason, usage }, now);
            }
        }
    }

    /// Aborts an active request in the backend and ends its stream with `Finished(Abort)`.
    fn abort<B: Backend + ?Sized>(&mut self, b: &mut B, id: RequestId) {
        let Some(a) = self.active.get(&id) else {
            return;
        };
        let usage = match b.abort(id) {
            Ok(Event::Finished { usage, .. }) => usage,
            // Not in the backend any more: report what the stream saw.
            _ => Usage {
                prompt_tokens: a.prompt_len,
                completion_tokens: a.generated,
                cached_tokens: 0,
            },
        };
        let reason = FinishReason::Abort;
        self.end(id, StreamEvent::Finished { reason, usage }, Instant::now());
    }

    fn end(&mut self, id: RequestId, event: StreamEvent, now: Instant) {
        if let Some(mut a) = self.active.remove(&id) {
            a.events.send(event, now);
            self.stats.ended += 1;
        }
    }

    fn end_all(&mut self, e: &ServiceError, now: Instant) {
        let ids: Vec<RequestId> = self.active.keys().copied().collect();
        for id in ids {
            self.end(id, StreamEvent::Error(e.clone()), now);
        }
    }

    fn publish<B: Backend + ?Sized>(&mut self, b: &B) {
        self.stats.backend = b.stats();
        // The step just run, by what it computed.
        if let Some(d) = self.stepped.take() {
            let ran = &self.stats.backend;
            if ran.last_prefill_tokens > 0 {
                self.stats.prefill_steps.observe(d);
            } else if ran.last_decode_tokens > 0 {
                self.stats.decode_steps.observe(d);
            }
        }
        self.stats.active = self.active.len();
        *lock(&self.shared.stats) = self.stats;
    }

    /// Ends every request with `Finished(Abort)` and refuses the submits still queued.
    fn shutdown<B: Backend + ?Sized>(&mut self, b: &mut B) {
        self.shared.set_stopped(ServiceError::Shutdown);
        let ids: Vec<RequestId> = self.active.keys().copied().collect();
        for id in ids {
            self.abort(b, id);
        }
        self.refuse_queued(&ServiceError::Shutdown);
        self.publish(b);
    }

    /// After a panic (the backend is gone): every stream and waiting caller learns why.
    fn died(&mut self, message: String) {
        let e = ServiceError::WorkerPanicked(message);
        self.shared.set_stopped(e.clone());
        if let Some(init) = self.init.take() {
            let _ = init.send(Err(e.clone()));
        }
        self.end_all(&e, Instant::now());
        self.refuse_queued(&e);
        self.stats.active = 0;
        *lock(&self.shared.stats) = self.stats;
    }

    fn refuse_queued(&mut self, e: &ServiceError) {
        while let Ok(cmd) = self.rx.try_recv() {
            if let Command::Submit {
                reply, mut events, ..
            } = cmd
            {
                match reply {
                    Some(reply) => {
                        let _ = reply.send(Err(e.clone()));
                    }
                    None => {
                        events.send(StreamEvent::Error(e.clone()), Instant::now());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
