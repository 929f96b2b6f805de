//! The rank threads of a tensor-parallel model ([`TpEngine`]) and the runner that drives them
//! in lockstep ([`TpRunner`]).
//!
//! Each rank is a thread that owns its [`Engine`] (and, while one is open, its [`Runner`]).
//! The controller (the caller's thread) sends every rank the same call and collects the
//! replies on one channel, in whatever order they come. The first error stops the group;
//! when the other ranks have not answered [`ERROR_GRACE`] after it, the communicators are
//! aborted so that a rank blocked in a collective returns instead of waiting forever. A rank
//! that has not answered long after the others ([`STRAGGLE_FACTOR`], [`MIN_STRAGGLE`]) is
//! treated as failed the same way, and after an abort the controller waits at most
//! [`ABORT_WAIT`]: no call hangs.

use std::any::Any;
use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fl_sampling::SamplingParams;

use super::comm::AbortHandle;
use super::{Shard, TpComm};
use crate::beam::BeamParams;
use crate::config::ModelConfig;
use crate::dtype::RunDType;
use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::runner::{Completion, RequestOptions, Runner, RunnerConfig, StepStats, TokenLogprobs};
use crate::scheduler::{Event, Request, RequestId};
use crate::service::{Backend, BackendStats};

type Reply = Result<Box<dyn Any + Send>>;
type EngineJob<T> = Box<dyn FnOnce(&mut Engine<T>) -> Reply + Send>;
type RunnerJob<T> = Box<dyn for<'r, 'e> FnOnce(&'r mut Runner<'e, T>) -> Reply + Send>;

enum Msg<T: RunDType> {
    Engine(EngineJob<T>),
    Open(RunnerConfig),
    Runner(RunnerJob<T>),
    Close,
}

/// How long the other ranks may take to answer a call after the first rank answered, as a
/// multiple of the time that first answer took (and at least [`MIN_STRAGGLE`]): past it the
/// group is stopped as if the late rank had failed.
const STRAGGLE_FACTOR: u32 = 20;
const MIN_STRAGGLE: Duration = Duration::from_secs(30);
/// How long the other ranks may take to answer after one rank failed, before the
/// communicators are aborted.
const ERROR_GRACE: Duration = Duration::from_secs(5);
/// How long the ranks may take to answer once their communicators were aborted.
const ABORT_WAIT: Duration = Duration::from_secs(30);

/// Which GPUs a [`TpEngine`] spans.
#[derive(Debug, Clone)]
pub struct TpOptions {
    /// Device ordinals, one per rank, rank 0 first (`CUDA_VISIBLE_DEVICES` applies, as for
    /// any CUDA program). Distinct; `--tp N` uses `0..N`.
    pub devices: Vec<usize>,
}

impl TpOptions {
    /// Devices `0..n`.
    pub fn first(n: usize) -> Self {
        TpOptions {
            devices: (0..n).collect(),
        }
    }
}

struct Rank<T: RunDType> {
    tx: Sender<Msg<T>>,
    device: usize,
    thread: Option<JoinHandle<()>>,
}

/// A model split over several GPUs, one rank thread per GPU; see the [module docs](super).
pub struct TpEngine<T: RunDType> {
    cfg: ModelConfig,
    ranks: Vec<Rank<T>>,
    replies: Receiver<(usize, Reply)>,
    aborts: Vec<AbortHandle>,
    /// The first failure, once the group is stopped: (rank, device, message).
    failed: Option<(usize, usize, String)>,
    /// The communicators were aborted (a rank may then never return from a CUDA call).
    aborted: bool,
    weight_bytes_per_step: u64,
}

impl<T: RunDType> TpEngine<T> {
    /// Starts one thread per device of `opts.devices`, creates the group's communicators and
    /// has every rank load its shard: `load(device, comm)` runs on rank `comm.rank()`'s thread
    /// and returns its engine, normally [`Engine::load_shard`]`(device, cfg, source, quant,
    /// comm, progress)` with a source it opens itself (a checkpoint is memory-mapped, so each
    /// rank reads only its part of it).
    ///
    /// Errors: [`EngineError::Invalid`] naming `--tp` (no devices, a repeated or missing
    /// device, a degree that does not split `cfg`: [`Shard::check`]); [`EngineError::Nccl`]
    /// (no NCCL library, init); [`EngineError::Rank`] with the first rank's load error.
    pub fn load<F>(cfg: ModelConfig, opts: TpOptions, load: F) -> Result<Self>
    where
        F: Fn(usize, TpComm) -> Result<Engine<T>> + Send + Sync + 'static,
    {
        let n = opts.devices.len();
        Shard::new(0, n)?.check(&cfg)?;
        let mut seen = HashSet::new();
        if let Some(d) = opts.devices.iter().find(|&&d| !seen.insert(d)) {
            return Err(EngineError::invalid(
                "--tp",
                format!("device {d} is listed twice"),
            ));
        }
        if !fl_kernels::gpu_available() {
            return Err(EngineError::invalid("--tp", "no CUDA GPU is available"));
        }
        let count = fl_kernels::cudarc::driver::CudaContext::device_count()? as usize;
        if let Some(d) = opts.devices.iter().find(|&&d| d >= count) {
            return Err(EngineError::invalid(
                "--tp",
                format!("{n} GPUs asked for, device {d} does not exist ({count} visible)"),
            ));
        }
        // Connect every NCCL channel at init, not at a collective's first use: the first
        // use may be inside a CUDA graph capture. Only if the user has not chosen. (Setting
        // the environment races with other threads reading it: a multi-threaded program
        // should set NCCL_RUNTIME_CONNECT itself at startup, as `fl` does.)
        if std::env::var_os("NCCL_RUNTIME_CONNECT").is_none() {
            std::env::set_var("NCCL_RUNTIME_CONNECT", "0");
        }
        let comms = TpComm::init_all(&opts.devices)?;
        let aborts: Vec<AbortHandle> = comms.iter().map(TpComm::abort_handle).collect();
        let load = std::sync::Arc::new(load);
        let (reply_tx, replies) = mpsc::channel();
        let mut ranks = Vec::with_capacity(n);
        for (rank, comm) in comms.into_iter().enumerate() {
            let device = opts.devices[rank];
            let (tx, rx) = mpsc::channel();
            let reply = reply_tx.clone();
            let load = std::sync::Arc::clone(&load);
            let thread = std::thread::Builder::new()
                .name(format!("fl-tp-rank{rank}"))
                .spawn(move || rank_main(rank, device, comm, &*load, rx, reply))
                .map_err(|e| {
                    EngineError::invalid("--tp", format!("cannot start rank {rank}'s thread: {e}"))
                })?;
            ranks.push(Rank {
                tx,
                device,
                thread: Some(thread),
            });
        }
        let mut tp = TpEngine {
            cfg,
            ranks,
            replies,
            aborts,
            failed: None,
            aborted: false,
            weight_bytes_per_step: 0,
        };
        // The load replies: each rank's weight bytes read per step.
        let bytes = tp.collect::<u64>()?;
        tp.weight_bytes_per_step = bytes.into_iter().max().unwrap_or(0);
        Ok(tp)
    }

    /// The whole model's config (each rank runs [`Shard::local_config`] of it).
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Ranks in the group.
    pub fn size(&self) -> usize {
        self.ranks.len()
    }

    /// The device ordinal of each rank.
    pub fn devices(&self) -> Vec<usize> {
        self.ranks.iter().map(|r| r.device).collect()
    }

    /// Weight bytes one decode step reads on the busiest rank ([`crate::weights::Weights::bytes_per_step`]).
    pub fn weight_bytes_per_step(&self) -> u64 {
        self.weight_bytes_per_step
    }

    /// Runs `f` on every rank's engine at once and returns the results, rank 0 first.
    ///
    /// Errors: the first failing rank's error as [`EngineError::Rank`]; the group is stopped.
    pub fn on_engines<R, F>(&mut self, f: F) -> Result<Vec<R>>
    where
        R: Send + 'static,
        F: Fn(&mut Engine<T>) -> Result<R> + Clone + Send + 'static,
    {
        self.send(|| {
            let f = f.clone();
            Msg::Engine(Box::new(move |e| {
                f(e).map(|r| Box::new(r) as Box<dyn Any + Send>)
            }))
        })?;
        self.collect()
    }

    /// Seconds one in-place sum all-reduce of `elems` elements of `T` takes on this group
    /// (the mean of `iters` back-to-back calls after a warm-up, timed with events on every
    /// rank's stream; the slowest rank's time). The communication cost of one row-parallel
    /// projection of `elems / hidden` tokens. `nccl`: through NCCL even where the engine's
    /// own calls take the one-shot all-reduce (to compare the two).
    ///
    /// Errors: [`EngineError::Invalid`] naming `elems` or `iters` when 0; the ranks' errors.
    pub fn time_all_reduce(&mut self, elems: usize, iters: usize, nccl: bool) -> Result<f64> {
        if elems == 0 || iters == 0 {
            return Err(EngineError::invalid(
                "elems",
                "elems and iters must be at least 1",
            ));
        }
        let times = self.on_engines(move |e| {
            let comm = &e
                .model
                .tp
                .as_ref()
                .ok_or_else(|| EngineError::invalid("--tp", "the engine has no communicator"))?
                .comm;
            let stream = e.gpu().stream().clone();
            let mut buf = fl_kernels::DeviceTensor::<T>::zeros(&stream, &[elems])?;
            let call = |buf: &mut fl_kernels::DeviceTensor<T>| {
                if nccl {
                    comm.all_reduce_sum_nccl(&stream, buf)
                } else {
                    comm.all_reduce_sum(&stream, buf)
                }
            };
            for _ in 0..5 {
                call(&mut buf)?;
            }
            let ms = fl_kernels::time_on_stream(&stream, || {
                for _ in 0..iters {
                    call(&mut buf)
                        .map_err(|e| fl_kernels::Error::invalid("comm", e.to_string()))?;
                }
                Ok(())
            })?;
            Ok(ms as f64 / 1e3 / iters as f64)
        })?;
        Ok(times.into_iter().fold(0.0, f64::max))
    }

    /// Whether an all-reduce of `elems` elements of `T` takes the one-shot kernel over peer
    /// memory on every rank ([`TpComm::takes_one_shot`]).
    pub fn takes_one_shot(&mut self, elems: usize) -> Result<bool> {
        let v = self.on_engines(move |e| {
            Ok(e.model
                .tp
                .as_ref()
                .is_some_and(|t| t.comm.takes_one_shot::<T>(elems)))
        })?;
        Ok(v.into_iter().all(|x| x))
    }

    /// A runner over every rank ([`Runner::new`] on each, with the same KV pool: `cfg`'s
    /// `num_blocks`, else the smallest of the ranks' [`Runner::pool_blocks`]).
    ///
    /// Errors: those of [`Runner::new`] on any rank, as [`EngineError::Rank`].
    pub fn runner(&mut self, cfg: &RunnerConfig) -> Result<TpRunner<'_, T>> {
        let mut cfg = cfg.clone();
        if cfg.num_blocks.is_none() {
            let c = cfg.clone();
            let blocks = self.on_engines(move |e| Runner::pool_blocks(e, &c))?;
            cfg.num_blocks = blocks.into_iter().min();
        }
        self.send(|| Msg::Open(cfg.clone()))?;
        self.collect::<()>()?;
        let mut r = TpRunner {
            tp: self,
            live: HashSet::new(),
            snap: Snapshot::default(),
        };
        r.refresh()?;
        Ok(r)
    }

    fn stopped_error(&self) -> Option<EngineError> {
        self.failed
            .as_ref()
            .map(|(rank, device, msg)| EngineError::Rank {
                rank: *rank,
                device: *device,
                source: Box::new(EngineError::invalid(
                    "--tp",
                    format!("the tensor-parallel group was stopped by an earlier error: {msg}"),
                )),
            })
    }

    fn send(&mut self, msg: impl Fn() -> Msg<T>) -> Result<()> {
        if let Some(e) = self.stopped_error() {
            return Err(e);
        }
        for r in 0..self.ranks.len() {
            if self.ranks[r].tx.send(msg()).is_err() {
                let e = EngineError::invalid("--tp", "the rank's thread has exited");
                return Err(self.stop(r, e, true));
            }
        }
        Ok(())
    }

    /// Records the failure (later calls are refused) and returns the error to report; with
    /// `abort`, aborts every communicator too (ranks whose queued collectives may never be
    /// matched).
    fn stop(&mut self, rank: usize, e: EngineError, abort: bool) -> EngineError {
        if abort {
            self.abort_all();
        }
        let device = self.ranks.get(rank).map_or(0, |r| r.device);
        self.failed.get_or_insert((rank, device, e.to_string()));
        EngineError::Rank {
            rank,
            device,
            source: Box::new(e),
        }
    }

    /// One reply from every rank, rank 0 first; the first error stops the group (and the
    /// remaining replies are still drained, so no reply is left for the next call).
    fn collect<R: 'static>(&mut self) -> Result<Vec<R>> {
        let n = self.ranks.len();
        let mut out: Vec<Option<R>> = (0..n).map(|_| None).collect();
        let mut first_err: Option<(usize, EngineError)> = None;
        let t0 = Instant::now();
        let mut first_at: Option<Duration> = None;
        let mut got = 0;
        let mut grace: Option<Instant> = None;
        let mut aborted_at: Option<Instant> = None;
        while got < n {
            let wait = match first_at {
                None => Duration::MAX,
                Some(t) => (t * STRAGGLE_FACTOR).max(MIN_STRAGGLE),
            };
            let mut deadline =
                wait.saturating_sub(t0.elapsed().saturating_sub(first_at.unwrap_or_default()));
            if let Some(g) = grace {
                deadline = deadline.min(ERROR_GRACE.saturating_sub(g.elapsed()));
            }
            if let Some(a) = aborted_at {
                deadline = ABORT_WAIT.saturating_sub(a.elapsed());
            }
            let msg = if wait == Duration::MAX && grace.is_none() && aborted_at.is_none() {
                self.replies
                    .recv()
                    .map_err(|_| RecvTimeoutError::Disconnected)
            } else {
                self.replies.recv_timeout(deadline)
            };
            match msg {
                Ok((rank, reply)) => {
                    got += 1;
                    first_at.get_or_insert_with(|| t0.elapsed());
                    match reply {
                        Ok(b) => match b.downcast::<R>() {
                            Ok(v) => out[rank] = Some(*v),
                            Err(_) => {
                                let e =
                                    EngineError::invalid("--tp", "a rank answered the wrong type");
                                first_err.get_or_insert((rank, e));
                            }
                        },
                        Err(e) => {
                            // No abort yet: a failure every rank meets at the same point (a
                            // shape the kernels refuse) leaves every rank's collectives paired,
                            // and their queues drain. A rank left blocked in a collective
                            // answers nothing; the grace below ends that.
                            if first_err.is_none() {
                                first_err = Some((rank, e));
                                grace = Some(Instant::now());
                            }
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) if aborted_at.is_some() => {
                    // Even the abort did not bring the rank back: give up on it (its thread is
                    // left detached) rather than hang.
                    let late = (0..n).find(|&r| out[r].is_none()).unwrap_or(0);
                    let e = EngineError::invalid(
                        "--tp",
                        format!(
                            "rank {late} did not return {} s after its communicator was aborted",
                            ABORT_WAIT.as_secs()
                        ),
                    );
                    let (rank, e) = first_err.unwrap_or((late, e));
                    return Err(self.stop(rank, e, true));
                }
                Err(RecvTimeoutError::Timeout) if first_err.is_some() => {
                    // A rank failed and another is still busy, likely blocked in a collective
                    // the failed rank never joined: abort the communicators so it returns.
                    self.abort_all();
                    grace = None;
                    aborted_at = Some(Instant::now());
                }
                Err(RecvTimeoutError::Timeout) => {
                    let late = (0..n).find(|&r| out[r].is_none()).unwrap_or(0);
                    let e = EngineError::invalid(
                        "--tp",
                        format!(
                            "rank {late} did not answer within {:.0} s of the first rank; the group was stopped",
                            wait.as_secs_f64()
                        ),
                    );
                    self.abort_all();
                    first_err.get_or_insert((late, e));
                    // The aborted ranks answer now (within ABORT_WAIT).
                    aborted_at = Some(Instant::now());
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let e = EngineError::invalid("--tp", "every rank thread has exited");
                    return Err(self.stop(0, e, true));
                }
            }
        }
        if let Some((rank, e)) = first_err {
            return Err(self.stop(rank, e, false));
        }
        Ok(out
            .into_iter()
            .map(|o| o.expect("every rank answered"))
            .collect())
    }
}

impl<T: RunDType> Drop for TpEngine<T> {
    fn drop(&mut self) {
        // Closing the channels ends each rank's loop.
        for r in &mut self.ranks {
            let (tx, _) = mpsc::channel();
            drop(std::mem::replace(&mut r.tx, tx));
        }
        // After an abort a rank may never return from a CUDA call on its communicator: its
        // thread is left detached rather than joined, so that dropping never hangs.
        if !self.aborted {
            for r in &mut self.ranks {
                if let Some(t) = r.thread.take() {
                    let _ = t.join();
                }
            }
        }
    }
}

impl<T: RunDType> TpEngine<T> {
    fn abort_all(&mut self) {
        for a in &self.aborts {
            a.abort();
        }
        self.aborted = true;
    }
}

fn panic_error(p: Box<dyn Any + Send>) -> EngineError {
    let msg = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    EngineError::invalid("--tp", format!("the rank panicked: {msg}"))
}

fn run<F: FnOnce() -> Reply>(f: F) -> Reply {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| Err(panic_error(p)))
}

/// A rank's thread: load, then serve calls until the controller hangs up.
fn rank_main<T: RunDType, F>(
    rank: usize,
    device: usize,
    comm: TpComm,
    load: &F,
    rx: Receiver<Msg<T>>,
    reply: Sender<(usize, Reply)>,
) where
    F: Fn(usize, TpComm) -> Result<Engine<T>>,
{
    let loaded = catch_unwind(AssertUnwindSafe(|| load(device, comm)))
        .unwrap_or_else(|p| Err(panic_error(p)));
    let mut engine = match loaded {
        Ok(e) => {
            let bytes = e.model.weights.bytes_per_step();
            let _ = reply.send((rank, Ok(Box::new(bytes))));
            e
        }
        Err(e) => {
            let _ = reply.send((rank, Err(e)));
            return;
        }
    };
    while let Ok(msg) = rx.recv() {
        match msg {
            Msg::Engine(f) => {
                let r = run(|| f(&mut engine));
                let _ = reply.send((rank, r));
            }
            Msg::Close => {
                let _ = reply.send((rank, Ok(Box::new(()))));
            }
            Msg::Runner(_) => {
                let e = EngineError::invalid("--tp", "no runner is open");
                let _ = reply.send((rank, Err(e)));
            }
            Msg::Open(cfg) => {
                let mut runner = match Runner::new(&mut engine, &cfg) {
                    Ok(r) => {
                        let _ = reply.send((rank, Ok(Box::new(()))));
                        r
                    }
                    Err(e) => {
                        let _ = reply.send((rank, Err(e)));
                        continue;
                    }
                };
                loop {
                    match rx.recv() {
                        Err(_) => return,
                        Ok(Msg::Runner(f)) => {
                            let r = run(|| f(&mut runner));
                            let _ = reply.send((rank, r));
                        }
                        Ok(Msg::Close) => {
                            let _ = reply.send((rank, Ok(Box::new(()))));
                            break;
                        }
                        Ok(Msg::Open(_)) | Ok(Msg::Engine(_)) => {
                            let e = EngineError::invalid(
                                "--tp",
                                "a runner is open: drop it before opening another or using the engines",
                            );
                            let _ = reply.send((rank, Err(e)));
                        }
                    }
                }
            }
        }
    }
}

/// Rank 0's state after the last call, for the `&self` queries.
#[derive(Default, Clone, Copy)]
struct Snapshot {
    unfinished: bool,
    last: StepStats,
    stats: BackendStats,
}

/// A [`Runner`] on every rank of a [`TpEngine`], driven in lockstep: each call runs on every
/// rank and answers with rank 0's result. After each step the ranks' events are compared;
/// ranks that disagree stop the group with an error instead of going on apart.
pub struct TpRunner<'a, T: RunDType> {
    tp: &'a mut TpEngine<T>,
    live: HashSet<RequestId>,
    snap: Snapshot,
}

impl<T: RunDType> TpRunner<'_, T> {
    /// Runs `f` on every rank's runner, returns rank 0's result, and refreshes the snapshot.
    fn call<R, F>(&mut self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: Fn(&mut Runner<'_, T>) -> Result<R> + Clone + Send + 'static,
    {
        Ok(self.call_all(f)?.swap_remove(0))
    }

    fn call_all<R, F>(&mut self, f: F) -> Result<Vec<R>>
    where
        R: Send + 'static,
        F: Fn(&mut Runner<'_, T>) -> Result<R> + Clone + Send + 'static,
    {
        self.tp.send(|| {
            let f = f.clone();
            Msg::Runner(Box::new(move |r: &mut Runner<'_, T>| {
                let out = f(r)?;
                let snap = Snapshot {
                    unfinished: r.has_unfinished(),
                    last: r.last_step(),
                    stats: Backend::stats(r),
                };
                Ok(Box::new((out, snap)) as Box<dyn Any + Send>)
            }))
        })?;
        let mut v = self.tp.collect::<(R, Snapshot)>()?;
        self.snap = v[0].1;
        Ok(v.drain(..).map(|(r, _)| r).collect())
    }

    fn refresh(&mut self) -> Result<()> {
        self.call(|_| Ok(()))
    }

    /// [`Runner::add_request`] on every rank.
    pub fn add_request(&mut self, req: Request<SamplingParams>) -> Result<()> {
        let id = req.id;
        self.call(move |r| r.add_request(req.clone()))?;
        self.live.insert(id);
        Ok(())
    }

    /// [`Runner::add_request_with`] on every rank.
    pub fn add_request_with(
        &mut self,
        req: Request<SamplingParams>,
        opts: RequestOptions,
    ) -> Result<()> {
        let id = req.id;
        self.call(move |r| r.add_request_with(req.clone(), opts.clone()))?;
        self.live.insert(id);
        Ok(())
    }

    /// [`Runner::add_beam_request`] on every rank.
    pub fn add_beam_request(
        &mut self,
        req: Request<SamplingParams>,
        beam: BeamParams,
    ) -> Result<()> {
        let id = req.id;
        self.call(move |r| r.add_beam_request(req.clone(), beam.clone()))?;
        self.live.insert(id);
        Ok(())
    }

    /// [`Runner::take_beams`] (from every rank; rank 0's returned).
    pub fn take_beams(&mut self, id: RequestId) -> Option<Vec<(Vec<u32>, f64)>> {
        self.call(move |r| Ok(r.take_beams(id))).ok().flatten()
    }

    /// [`Runner::take_logits`] (from every rank; rank 0's returned).
    pub fn take_logits(&mut self, id: RequestId) -> Option<Vec<Vec<f32>>> {
        self.call(move |r| Ok(r.take_logits(id))).ok().flatten()
    }

    /// [`Runner::next_logprobs`] (from every rank, so they stay in step; rank 0's returned).
    pub fn next_logprobs(&mut self, id: RequestId) -> Option<TokenLogprobs> {
        self.call(move |r| Ok(r.next_logprobs(id))).ok().flatten()
    }

    /// [`Runner::abort`] on every rank.
    pub fn abort(&mut self, id: RequestId) -> Result<Event> {
        let ev = self.call(move |r| r.abort(id))?;
        self.live.remove(&id);
        Ok(ev)
    }

    /// [`Runner::last_step`] of rank 0.
    pub fn last_step(&self) -> StepStats {
        self.snap.last
    }

    /// [`Runner::has_unfinished`].
    pub fn has_unfinished(&self) -> bool {
        self.snap.unfinished
    }

    /// Whether request `id` is waiting or running.
    pub fn contains(&self, id: RequestId) -> bool {
        self.live.contains(&id)
    }

    /// Queue lengths and KV usage of rank 0 (every rank's are the same).
    pub fn stats(&self) -> BackendStats {
        self.snap.stats
    }

    /// [`Runner::step`] on every rank; rank 0's events.
    ///
    /// Errors: any rank's error (the group is then stopped), or [`EngineError::Rank`] when a
    /// rank's events differ from rank 0's.
    pub fn step(&mut self) -> Result<Vec<Event>> {
        let mut all = self.call_all(|r| r.step())?;
        if let Some(r) = (1..all.len()).find(|&r| all[r] != all[0]) {
            let e = EngineError::invalid(
                "--tp",
                format!(
                    "rank {r}'s step produced other events than rank 0's ({:?} vs {:?})",
                    all[r], all[0]
                ),
            );
            return Err(self.tp.stop(r, e, true));
        }
        let events = all.swap_remove(0);
        for ev in &events {
            if let Event::Finished { id, .. } = ev {
                self.live.remove(id);
            }
        }
        Ok(events)
    }

    /// [`Runner::run_to_completion`]: steps until nothing is left.
    pub fn run_to_completion(&mut self) -> Result<Completion> {
        crate::runner::run_to_completion(self)
    }
}

impl<T: RunDType> Drop for TpRunner<'_, T> {
    fn drop(&mut self) {
        if self.tp.failed.is_none() && self.tp.send(|| Msg::Close).is_ok() {
            let _ = self.tp.collect::<()>();
        }
    }
}

impl<T: RunDType> Backend for TpRunner<'_, T> {
    fn add_request(&mut self, req: Request<SamplingParams>) -> Result<()> {
        TpRunner::add_request(self, req)
    }

    fn add_beam_request(&mut self, req: Request<SamplingParams>, beam: BeamParams) -> Result<()> {
        TpRunner::add_beam_request(self, req, beam)
    }

    fn next_logprobs(&mut self, id: RequestId) -> Option<TokenLogprobs> {
        TpRunner::next_logprobs(self, id)
    }

    fn take_beams(&mut self, id: RequestId) -> Option<Vec<(Vec<u32>, f64)>> {
        TpRunner::take_beams(self, id)
    }

    fn abort(&mut self, id: RequestId) -> Result<Event> {
        TpRunner::abort(self, id)
    }

    fn step(&mut self) -> Result<Vec<Event>> {
        TpRunner::step(self)
    }

    fn has_unfinished(&self) -> bool {
        TpRunner::has_unfinished(self)
    }

    fn contains(&self, id: RequestId) -> bool {
        TpRunner::contains(self, id)
    }

    fn stats(&self) -> BackendStats {
        TpRunner::stats(self)
    }
}

#[cfg(test)]
mod tests {
    //! The controller's reply collection without GPUs: fake ranks that answer on the reply
    //! channel after a delay, or fail.
    use super::*;

    /// A group of `n` fake ranks (no threads, no communicators) and the sender its replies
    /// come on.
    fn fake(n: usize) -> (TpEngine<f32>, Sender<(usize, Reply)>) {
        let (reply_tx, replies) = mpsc::channel();
        let ranks = (0..n)
            .map(|device| Rank {
                tx: mpsc::channel().0,
                device,
                thread: None,
            })
            .collect();
        let tp = TpEngine {
            cfg: crate::presets::preset("tiny").unwrap_or_else(|e| panic!("{e}")),
            ranks,
            replies,
            aborts: Vec::new(),
            failed: None,
            aborted: false,
            weight_bytes_per_step: 0,
        };
        (tp, reply_tx)
    }

    fn answer(tx: &Sender<(usize, Reply)>, rank: usize, after_ms: u64, reply: Reply) {
        let tx = tx.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(after_ms));
            let _ = tx.send((rank, reply));
        });
    }

    #[test]
    fn replies_come_back_in_rank_order() {
        let (mut tp, tx) = fake(3);
        for (rank, ms) in [(2, 0), (0, 30), (1, 10)] {
            answer(&tx, rank, ms, Ok(Box::new(rank * 10)));
        }
        let got = tp.collect::<usize>().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, vec![0, 10, 20]);
        assert!(tp.failed.is_none() && !tp.aborted);
    }

    #[test]
    fn an_error_every_rank_meets_stops_the_group_without_an_abort() {
        let (mut tp, tx) = fake(2);
        answer(&tx, 1, 0, Err(EngineError::invalid("x", "rank 1 fails")));
        answer(
            &tx,
            0,
            300,
            Err(EngineError::invalid("x", "rank 0 fails too")),
        );
        let t0 = Instant::now();
        match tp.collect::<()>() {
            Err(EngineError::Rank { rank: 1, .. }) => {}
            other => panic!("expected rank 1's error, got {other:?}"),
        }
        // Both answered inside the grace: no abort, and the threads may be joined.
        assert!(t0.elapsed() < ERROR_GRACE);
        assert!(!tp.aborted);
        let again = tp.on_engines(|_| Ok(()));
        assert!(
            matches!(&again, Err(e) if e.to_string().contains("stopped")),
            "a stopped group took a call: {again:?}"
        );
    }

    #[test]
    fn a_rank_still_busy_after_another_failed_is_aborted_after_the_grace() {
        let (mut tp, tx) = fake(2);
        answer(&tx, 1, 0, Err(EngineError::invalid("x", "rank 1 fails")));
        // Rank 0 stands for one blocked in a collective: it answers only after the abort.
        let late = ERROR_GRACE.as_millis() as u64 + 800;
        answer(&tx, 0, late, Ok(Box::new(())));
        let t0 = Instant::now();
        match tp.collect::<()>() {
            Err(EngineError::Rank { rank: 1, .. }) => {}
            other => panic!("expected rank 1's error, got {other:?}"),
        }
        let took = t0.elapsed();
        assert!(tp.aborted, "the communicators were not aborted");
        assert!(
            took >= ERROR_GRACE && took < ERROR_GRACE + ABORT_WAIT,
            "{took:?}"
        );
    }

    #[test]
    fn a_reply_of_the_wrong_type_is_an_error_not_a_panic() {
        let (mut tp, tx) = fake(1);
        answer(&tx, 0, 0, Ok(Box::new("text")));
        assert!(tp.collect::<u64>().is_err());
    }
}
