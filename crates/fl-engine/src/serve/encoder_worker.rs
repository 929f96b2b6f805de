//! [`EncoderService`]: one thread owns an encoder ([`EncoderBackend`]) and runs every queued
//! request's sequences as packed batches.
//!
//! ```text
//!  handlers ──submit(Encoded, Task)──► channel ──► worker thread
//!                                                  take every queued request, FIFO, up to
//!                                                  max_batched_tokens / max_batch_seqs
//!                                                  one forward over the packed batch
//!                                                  pool / classify each request's rows
//!  Pending::wait ◄──────── oneshot ◄────────────── answer the requests it completed
//! ```
//!
//! - A request larger than the budget is split across consecutive batches; a batch always
//!   takes at least one sequence, so a sequence longer than the budget runs alone.
//! - Requests whose client went away before their first sequence ran are dropped unrun.
//! - A failed forward fails the requests of that batch (each gets the error); the worker
//!   keeps serving. A panic in the backend stops the worker: pending requests then get
//!   [`EncodeError::Stopped`] and [`EncoderService::is_running`] turns false.
//! - [`EncoderService::shutdown`] stops taking requests, finishes the queued ones, joins.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use crate::encoder::backend::{EncoderBackend, EncoderHead};
use crate::encoder::{reference, Encoded, EncoderConfig, PackedBatch, Pooling};
use crate::error::{EngineError, Result};

/// What a request wants from its sequences' last hidden states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Task {
    /// One pooled vector per sequence, `[seqs, hidden]` (not normalised).
    Embed(Pooling),
    /// The classification head's logits per sequence, `[seqs, num_labels]`.
    Classify,
}

/// How the worker sizes its batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncoderServiceConfig {
    /// Tokens one forward takes at most (a single longer sequence runs alone).
    pub max_batched_tokens: usize,
    /// Sequences one forward takes at most.
    pub max_batch_seqs: usize,
}

impl Default for EncoderServiceConfig {
    /// 8,192 tokens, 256 sequences (the decoder runner's defaults).
    fn default() -> Self {
        EncoderServiceConfig {
            max_batched_tokens: 8192,
            max_batch_seqs: 256,
        }
    }
}

/// Why a request got no output.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// The request was refused before it was queued (naming the argument).
    #[error(transparent)]
    Invalid(#[from] EngineError),
    /// [`EncoderService::shutdown`] ran: no new requests.
    #[error("the encoder service is shut down")]
    Shutdown,
    /// The forward of the request's batch failed (the error, shared by the batch's requests).
    #[error("the encoder failed: {0}")]
    Failed(Arc<EngineError>),
    /// The worker thread stopped (a panic) before answering.
    #[error("the encoder worker stopped")]
    Stopped,
}

/// Counters of an [`EncoderService`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EncoderStats {
    /// Requests submitted and not yet answered.
    pub waiting: usize,
    /// Requests with sequences in the forward running now.
    pub running: usize,
    /// Requests accepted since the start.
    pub submitted: u64,
    /// Requests answered (with output or an error) or dropped since the start.
    pub ended: u64,
    /// Forwards run.
    pub batches: u64,
    /// Of those, forwards that failed.
    pub failed_batches: u64,
    /// Sequences and tokens the forwards took.
    pub batch_seqs: u64,
    /// Tokens the forwards took.
    pub batch_tokens: u64,
}

#[derive(Default)]
struct Shared {
    running: AtomicBool,
    waiting: AtomicUsize,
    in_batch: AtomicUsize,
    submitted: AtomicU64,
    ended: AtomicU64,
    batches: AtomicU64,
    failed_batches: AtomicU64,
    batch_seqs: AtomicU64,
    batch_tokens: AtomicU64,
}

type Reply = std::result::Result<Vec<f32>, EncodeError>;

/// A request on the worker.
struct Job {
    seqs: Encoded,
    task: Task,
    /// Sequences whose output is in `out`.
    done: usize,
    out: Vec<f32>,
    failed: Option<Arc<EngineError>>,
    reply: oneshot::Sender<Reply>,
}

/// A submitted request's answer, to await ([`Pending::wait`]) or block on
/// ([`Pending::wait_blocking`]).
#[derive(Debug)]
pub struct Pending(oneshot::Receiver<Reply>);

impl Pending {
    /// The output: `[seqs, hidden]` for [`Task::Embed`], `[seqs, num_labels]` for
    /// [`Task::Classify`].
    ///
    /// # Errors
    /// [`EncodeError::Failed`] (the forward failed), [`EncodeError::Stopped`].
    pub async fn wait(self) -> Reply {
        self.0.await.unwrap_or(Err(EncodeError::Stopped))
    }

    /// [`Pending::wait`] from a thread outside an async runtime.
    ///
    /// # Errors
    /// As [`Pending::wait`].
    pub fn wait_blocking(self) -> Reply {
        self.0.blocking_recv().unwrap_or(Err(EncodeError::Stopped))
    }
}

/// The encoder's worker thread and its queue. See the [module docs](self).
///
/// ```no_run
/// use fl_engine::encoder::backend::{EncoderModelDir, GpuEncoder};
/// use fl_engine::encoder::Pooling;
/// use fl_engine::serve::encoder_worker::{EncoderService, EncoderServiceConfig, Task};
/// let m = EncoderModelDir::load("models/bge-small-en-v1.5")?;
/// let (cfg, weights, head) = (m.config.clone(), m.weights, None);
/// let svc = EncoderService::spawn(
///     move || GpuEncoder::<fl_kernels::f16>::new(0, &cfg, &weights),
///     head,
///     EncoderServiceConfig::default(),
/// )?;
/// let ids = vec![vec![101, 7592, 102]];
/// let seqs = fl_engine::encoder::Encoded { token_types: vec![vec![0; 3]], ids };
/// let emb = svc.submit(seqs, Task::Embed(Pooling::Cls))?.wait_blocking()?; // [1, hidden]
/// svc.shutdown()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct EncoderService {
    cfg: EncoderConfig,
    has_head: bool,
    tx: Mutex<Option<Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for EncoderService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncoderService")
            .field("arch", &self.cfg.arch)
            .field("has_head", &self.has_head)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// Sets `running` to false when the worker ends, panics included.
struct RunningGuard(Arc<Shared>);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.running.store(false, Ordering::Release);
    }
}

impl EncoderService {
    /// Starts the worker: `make` builds the backend *on* the worker thread (GPU handles stay
    /// there); returns once it is built. `head` classifies for [`Task::Classify`].
    ///
    /// # Errors
    /// [`EngineError::Invalid`] naming `cfg` (a zero budget); `make`'s error; naming
    /// `encoder` when the thread cannot start or dies while building.
    pub fn spawn<B, F>(
        make: F,
        head: Option<EncoderHead>,
        cfg: EncoderServiceConfig,
    ) -> Result<EncoderService>
    where
        B: EncoderBackend + 'static,
        F: FnOnce() -> Result<B> + Send + 'static,
    {
        if cfg.max_batched_tokens == 0 || cfg.max_batch_seqs == 0 {
            return Err(EngineError::invalid(
                "cfg",
                "max_batched_tokens and max_batch_seqs must be at least 1",
            ));
        }
        let shared = Arc::new(Shared::default());
        shared.running.store(true, Ordering::Release);
        let (tx, rx) = channel::<Job>();
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel::<Result<EncoderConfig>>(1);
        let sh = Arc::clone(&shared);
        let has_head = head.is_some();
        let thread = std::thread::Builder::new()
            .name("fl-encoder".into())
            .spawn(move || {
                let _running = RunningGuard(Arc::clone(&sh));
                let backend = match make() {
                    Ok(b) => b,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(backend.config().clone()));
                Worker {
                    backend,
                    head,
                    rx,
                    shared: sh,
                    cfg,
                    queue: VecDeque::new(),
                }
                .run();
            })
            .map_err(|e| {
                EngineError::invalid("encoder", format!("cannot start its thread: {e}"))
            })?;
        let model_cfg = match ready_rx.recv() {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(EngineError::invalid(
                    "encoder",
                    "the worker thread died while building the backend",
                ));
            }
        };
        Ok(EncoderService {
            cfg: model_cfg,
            has_head,
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            shared,
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &EncoderConfig {
        &self.cfg
    }

    /// Whether [`Task::Classify`] is served (the model has a classification head).
    pub fn has_head(&self) -> bool {
        self.has_head
    }

    /// Whether the worker is alive and taking requests.
    pub fn is_running(&self) -> bool {
        self.shared.running.load(Ordering::Acquire)
            && self.tx.lock().map(|t| t.is_some()).unwrap_or(false)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> EncoderStats {
        let s = &self.shared;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        EncoderStats {
            waiting: s.waiting.load(Ordering::Relaxed),
            running: s.in_batch.load(Ordering::Relaxed),
            submitted: l(&s.submitted),
            ended: l(&s.ended),
            batches: l(&s.batches),
            failed_batches: l(&s.failed_batches),
            batch_seqs: l(&s.batch_seqs),
            batch_tokens: l(&s.batch_tokens),
        }
    }

    /// Queues `seqs` (each with its token types) for `task`, after checking them against
    /// the model (so that a batch of several requests never fails to pack).
    ///
    /// # Errors
    /// [`EncodeError::Invalid`] naming `seqs` (empty, an empty sequence, an id `>=
    /// vocab_size`, longer than the positions cover), `token_types` (a type `>=
    /// type_vocab_size`) or `task` (classify without a head); [`EncodeError::Shutdown`].
    pub fn submit(&self, seqs: Encoded, task: Task) -> std::result::Result<Pending, EncodeError> {
        if seqs.is_empty() {
            return Err(EngineError::invalid("seqs", "holds no sequence").into());
        }
        if task == Task::Classify && !self.has_head {
            return Err(EngineError::invalid(
                "task",
                "the model has no classification head (config.json names no \
                 *ForSequenceClassification)",
            )
            .into());
        }
        PackedBatch::new(&self.cfg, &seqs.ids, Some(&seqs.token_types))?;
        let (reply, rx) = oneshot::channel();
        let job = Job {
            out: Vec::new(),
            seqs,
            task,
            done: 0,
            failed: None,
            reply,
        };
        let guard = self.tx.lock().map_err(|_| EncodeError::Stopped)?;
        let tx = guard.as_ref().ok_or(EncodeError::Shutdown)?;
        self.shared.waiting.fetch_add(1, Ordering::Relaxed);
        if tx.send(job).is_err() {
            self.shared.waiting.fetch_sub(1, Ordering::Relaxed);
            return Err(EncodeError::Stopped);
        }
        self.shared.submitted.fetch_add(1, Ordering::Relaxed);
        Ok(Pending(rx))
    }

    /// Stops taking requests, lets the worker finish the queued ones, and joins it.
    /// Idempotent.
    ///
    /// # Errors
    /// [`EncodeError::Stopped`] when the worker had panicked.
    pub fn shutdown(&self) -> std::result::Result<(), EncodeError> {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        let handle = self.thread.lock().ok().and_then(|mut t| t.take());
        match handle.map(JoinHandle::join) {
            Some(Err(_)) => Err(EncodeError::Stopped),
            _ => Ok(()),
        }
    }
}

impl Drop for EncoderService {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

struct Worker<B: EncoderBackend> {
    backend: B,
    head: Option<EncoderHead>,
    rx: Receiver<Job>,
    shared: Arc<Shared>,
    cfg: EncoderServiceConfig,
    queue: VecDeque<Job>,
}

/// Sequences `range` of the jobs' `job`-th entry in a batch.
struct Part {
    job: usize,
    range: std::ops::Range<usize>,
}

impl<B: EncoderBackend> Worker<B> {
    fn run(mut self) {
        loop {
            if self.queue.is_empty() {
                match self.rx.recv() {
                    Ok(j) => self.queue.push_back(j),
                    // Every sender is gone (shutdown) and the queue is drained.
                    Err(_) => return,
                }
            }
            while let Ok(j) = self.rx.try_recv() {
                self.queue.push_back(j);
            }
            // A request whose client went away is not run (unless it has started).
            let before = self.queue.len();
            self.queue.retain(|j| j.done > 0 || !j.reply.is_closed());
            self.ended(before - self.queue.len());
            if self.queue.is_empty() {
                continue;
            }
            let parts = self.plan();
            self.run_batch(&parts);
            self.answer();
        }
    }

    fn ended(&self, n: usize) {
        self.shared.waiting.fetch_sub(n, Ordering::Relaxed);
        self.shared.ended.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// The next batch: queued sequences in order while they fit the budget (at least one).
    fn plan(&self) -> Vec<Part> {
        let (mut tokens, mut seqs) = (0usize, 0usize);
        let mut parts: Vec<Part> = Vec::new();
        'jobs: for (j, job) in self.queue.iter().enumerate() {
            for s in job.done..job.seqs.len() {
                let len = job.seqs.ids[s].len();
                let fits =
                    tokens + len <= self.cfg.max_batched_tokens && seqs < self.cfg.max_batch_seqs;
                if !fits && seqs > 0 {
                    break 'jobs;
                }
                tokens += len;
                seqs += 1;
                match parts.last_mut() {
                    Some(p) if p.job == j => p.range.end = s + 1,
                    _ => parts.push(Part {
                        job: j,
                        range: s..s + 1,
                    }),
                }
            }
        }
        parts
    }

    fn run_batch(&mut self, parts: &[Part]) {
        let mut ids: Vec<&[u32]> = Vec::new();
        let mut types: Vec<&[u32]> = Vec::new();
        for p in parts {
            let seqs = &self.queue[p.job].seqs;
            ids.extend(seqs.ids[p.range.clone()].iter().map(Vec::as_slice));
            types.extend(seqs.token_types[p.range.clone()].iter().map(Vec::as_slice));
        }
        let sh = &self.shared;
        sh.in_batch.store(parts.len(), Ordering::Relaxed);
        let result = PackedBatch::new(self.backend.config(), &ids, Some(&types)).and_then(|b| {
            sh.batch_seqs
                .fetch_add(b.num_seqs() as u64, Ordering::Relaxed);
            sh.batch_tokens
                .fetch_add(b.num_tokens() as u64, Ordering::Relaxed);
            let states = self.backend.hidden_states(&b)?;
            Ok((b, states))
        });
        sh.in_batch.store(0, Ordering::Relaxed);
        sh.batches.fetch_add(1, Ordering::Relaxed);
        let (batch, states) = match result {
            Ok(r) => r,
            Err(e) => {
                sh.failed_batches.fetch_add(1, Ordering::Relaxed);
                let e = Arc::new(e);
                for p in parts {
                    self.queue[p.job].failed = Some(Arc::clone(&e));
                }
                return;
            }
        };
        let h = self.backend.config().hidden_size;
        let mut first = 0;
        for p in parts {
            let n = p.range.len();
            let (sub, rows) = sub_batch(&batch, &states, first..first + n, h);
            first += n;
            let job = &mut self.queue[p.job];
            let out = match (job.task, &self.head) {
                (Task::Embed(pooling), _) => reference::pool(rows, &sub, h, pooling),
                (Task::Classify, Some(head)) => head.logits(rows, &sub),
                // `submit` refuses it; kept as an error rather than a panic.
                (Task::Classify, None) => Err(EngineError::invalid(
                    "task",
                    "the model has no classification head",
                )),
            };
            match out {
                Ok(v) => {
                    job.out.extend_from_slice(&v);
                    job.done = p.range.end;
                }
                Err(e) => job.failed = Some(Arc::new(e)),
            }
        }
    }

    /// Answers the requests that are complete or failed, and drops them from the queue.
    fn answer(&mut self) {
        let mut i = 0;
        while i < self.queue.len() {
            let j = &self.queue[i];
            if j.failed.is_none() && j.done < j.seqs.len() {
                i += 1;
                continue;
            }
            let Some(job) = self.queue.remove(i) else {
                break;
            };
            let reply = match job.failed {
                Some(e) => Err(EncodeError::Failed(e)),
                None => Ok(job.out),
            };
            // Counted first: a client that has its answer sees the request ended.
            self.ended(1);
            let _ = job.reply.send(reply);
        }
    }
}

/// Sequences `seqs` of `batch` as a batch of their own, with their rows of `states`.
fn sub_batch<'a>(
    batch: &PackedBatch,
    states: &'a [f32],
    seqs: std::ops::Range<usize>,
    hidden: usize,
) -> (PackedBatch, &'a [f32]) {
    let t0 = batch.cu_seqlens[seqs.start] as usize;
    let t1 = batch.cu_seqlens[seqs.end] as usize;
    let sub = PackedBatch {
        ids: batch.ids[t0..t1].to_vec(),
        token_types: batch.token_types[t0..t1].to_vec(),
        positions: batch.positions[t0..t1].to_vec(),
        cu_seqlens: batch.cu_seqlens[seqs.start..=seqs.end]
            .iter()
            .map(|&c| c - t0 as u32)
            .collect(),
    };
    (sub, &states[t0 * hidden..t1 * hidden])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encoder::backend::CpuEncoder;
    use crate::encoder::backend::EncoderModelDir;
    use std::path::Path;

    fn fixture(name: &str) -> EncoderModelDir {
        EncoderModelDir::load(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/data/encoder")
                .join(name),
        )
        .unwrap()
    }

    fn encoded(seqs: &[Vec<u32>]) -> Encoded {
        Encoded {
            ids: seqs.to_vec(),
            token_types: seqs.iter().map(|s| vec![0; s.len()]).collect(),
        }
    }

    fn service(m: &EncoderModelDir, cfg: EncoderServiceConfig) -> EncoderService {
        let (c, w) = (m.config.clone(), m.weights.clone());
        EncoderService::spawn(move || CpuEncoder::new(c, w), m.head(), cfg).unwrap()
    }

    #[test]
    fn split_requests_match_the_reference() {
        let m = fixture("xlmr_cls_erf");
        let seqs = vec![
            vec![0, 5, 9, 2],
            vec![0, 7, 2],
            vec![0, 8, 9, 10, 11, 2],
            vec![0, 2],
        ];
        // 6 tokens a batch: each request runs as 4 batches ([4], [3], [6], [2]).
        let svc = service(
            &m,
            EncoderServiceConfig {
                max_batched_tokens: 6,
                max_batch_seqs: 2,
            },
        );
        let emb = svc
            .submit(encoded(&seqs), Task::Embed(Pooling::Mean))
            .unwrap()
            .wait_blocking()
            .unwrap();
        let logits = svc
            .submit(encoded(&seqs), Task::Classify)
            .unwrap()
            .wait_blocking()
            .unwrap();
        let batch = PackedBatch::new(&m.config, &seqs, None).unwrap();
        let states = reference::forward(&m.config, &m.weights, &batch).unwrap();
        let h = m.config.hidden_size;
        assert_eq!(
            emb,
            reference::pool(&states, &batch, h, Pooling::Mean).unwrap()
        );
        let want = reference::classify(&m.config, &m.weights, &states, &batch).unwrap();
        assert_eq!(logits, want);
        let s = svc.stats();
        assert!(s.batches >= 6, "{s:?}");
        assert_eq!((s.submitted, s.ended, s.waiting), (2, 2, 0));
        svc.shutdown().unwrap();
        assert!(!svc.is_running());
        assert!(matches!(
            svc.submit(encoded(&seqs), Task::Classify),
            Err(EncodeError::Shutdown)
        ));
    }

    #[test]
    fn refusals_name_the_argument() {
        let m = fixture("xlmr_tanh");
        let svc = service(&m, EncoderServiceConfig::default());
        let msg = |r: std::result::Result<Pending, EncodeError>| match r {
            Err(EncodeError::Invalid(e)) => e.to_string(),
            other => panic!("expected Invalid, got {other:?}"),
        };
        assert!(msg(svc.submit(encoded(&[]), Task::Embed(Pooling::Cls))).starts_with("seqs"));
        assert!(
            msg(svc.submit(encoded(&[vec![0, 100]]), Task::Embed(Pooling::Cls)))
                .contains("vocab_size")
        );
        assert!(msg(svc.submit(encoded(&[vec![0, 2]]), Task::Classify)).starts_with("task"));
        let (c, w) = (m.config.clone(), m.weights.clone());
        let e = EncoderService::spawn(
            move || CpuEncoder::new(c, w),
            None,
            EncoderServiceConfig {
                max_batched_tokens: 0,
                max_batch_seqs: 1,
            },
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("cfg"), "{e}");
    }

    struct Failing(EncoderConfig);

    impl EncoderBackend for Failing {
        fn config(&self) -> &EncoderConfig {
            &self.0
        }
        fn hidden_states(&mut self, _: &PackedBatch) -> Result<Vec<f32>> {
            Err(EngineError::invalid("batch", "the device is on fire"))
        }
    }

    #[test]
    fn a_failed_forward_fails_its_requests_and_the_worker_goes_on() {
        let m = fixture("xlmr_tanh");
        let c = m.config.clone();
        let svc = EncoderService::spawn(
            move || Ok(Failing(c)),
            None,
            EncoderServiceConfig::default(),
        )
        .unwrap();
        for _ in 0..2 {
            let r = svc
                .submit(encoded(&[vec![0, 2]]), Task::Embed(Pooling::Cls))
                .unwrap()
                .wait_blocking();
            match r {
                Err(EncodeError::Failed(e)) => assert!(e.to_string().contains("on fire")),
                other => panic!("expected Failed, got {other:?}"),
            }
        }
        assert!(svc.is_running());
        assert_eq!(svc.stats().failed_batches, 2);
        let e = EncoderService::spawn(
            || -> Result<Failing> { Err(EngineError::invalid("--model", "no such model")) },
            None,
            EncoderServiceConfig::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("no such model"), "{e}");
    }
}
