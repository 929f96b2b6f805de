//! The service loop on a CPU mock backend (the real scheduler, a fake model). Every wait is
//! bounded: a hung service fails the test instead of hanging it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::scheduler::{Scheduler, SchedulerConfig};

/// Longest any single wait may take.
const WAIT: Duration = Duration::from_secs(20);
/// A prompt starting with this fails the step that runs it.
const FAIL: u32 = 900;
/// A prompt starting with this panics the step that runs it.
const PANIC: u32 = 901;
const VOCAB: u32 = 1000;

/// The fake model: the next token depends only on the sequence so far (never FAIL or PANIC).
fn next_token(seq: &[u32]) -> u32 {
    seq.iter()
        .fold(7u32, |h, &t| h.wrapping_mul(31).wrapping_add(t))
        % 100
}

fn expected(prompt: &[u32], n: usize) -> Vec<u32> {
    let mut s = prompt.to_vec();
    for _ in 0..n {
        let t = next_token(&s);
        s.push(t);
    }
    s.split_off(prompt.len())
}

/// Test controls shared with the mock on the worker thread.
#[derive(Default)]
struct Ctl {
    /// Steps return nothing (after 1 ms) while set: requests queue up without running.
    hold: AtomicBool,
    /// Sleep per step, in microseconds.
    delay_us: AtomicU64,
    /// Steps called.
    steps: AtomicU64,
}

struct Mock {
    sched: Scheduler<SamplingParams>,
    seqs: HashMap<RequestId, Vec<u32>>,
    /// Beam requests, outside the scheduler: each finishes at the next step.
    beams: HashMap<RequestId, (Vec<u32>, BeamParams)>,
    beam_results: HashMap<RequestId, Vec<(Vec<u32>, f64)>>,
    /// Requests that asked for log-probabilities: `top_logprobs`, tokens so far, and the
    /// log-probabilities not yet taken.
    logprobs: HashMap<RequestId, (usize, usize, std::collections::VecDeque<TokenLogprobs>)>,
    ctl: Arc<Ctl>,
    /// What the last step computed: (prompt tokens, decode tokens).
    last: (usize, usize),
}

/// The mock's log-probabilities of `token` as the `index`-th output: the token itself most
/// likely at `-index / 8`, then `k - 1` others below it.
fn fake_logprobs(token: u32, index: usize, k: usize) -> TokenLogprobs {
    let lp = -(index as f32) / 8.0;
    TokenLogprobs {
        token,
        logprob: lp,
        top: (0..k as u32)
            .map(|j| ((token + j) % VOCAB, lp - j as f32))
            .collect(),
    }
}

/// The mock's beam search: hypothesis `i` is the greedy continuation one token shorter per
/// rank, scored `-i`.
fn hypotheses(prompt: &[u32], beam: &BeamParams) -> Vec<(Vec<u32>, f64)> {
    (0..beam.num_return_sequences)
        .map(|i| {
            let len = beam.max_new_tokens - i.min(beam.max_new_tokens - 1);
            (expected(prompt, len), -(i as f64))
        })
        .collect()
}

impl Mock {
    fn new(max_num_seqs: usize, ctl: Arc<Ctl>) -> Result<Self> {
        let mut cfg = SchedulerConfig::new(4096, 1 << 16);
        cfg.max_num_seqs = max_num_seqs;
        cfg.max_batched_tokens = 64;
        cfg.vocab_size = Some(VOCAB);
        Ok(Mock {
            sched: Scheduler::new(cfg)?,
            seqs: HashMap::new(),
            beams: HashMap::new(),
            beam_results: HashMap::new(),
            logprobs: HashMap::new(),
            ctl,
            last: (0, 0),
        })
    }
}

impl Backend for Mock {
    fn add_request(&mut self, req: Request<SamplingParams>) -> Result<()> {
        let (id, prompt, top) = (req.id, req.prompt.clone(), req.params.top_logprobs);
        self.sched.add_request(req)?;
        if let Some(k) = top {
            self.logprobs.insert(id, (k, 0, Default::default()));
        }
        self.seqs.insert(id, prompt);
        Ok(())
    }

    fn add_beam_request(&mut self, req: Request<SamplingParams>, beam: BeamParams) -> Result<()> {
        beam.validate()?;
        let max_num_seqs = self.sched.config().max_num_seqs;
        if beam.num_beams > max_num_seqs {
            let width = beam.num_beams;
            return Err(RequestError::BeamWidth {
                width,
                max_num_seqs,
            }
            .into());
        }
        self.beams.insert(req.id, (req.prompt, beam));
        Ok(())
    }

    fn take_beams(&mut self, id: RequestId) -> Option<Vec<(Vec<u32>, f64)>> {
        self.beam_results.remove(&id)
    }

    fn next_logprobs(&mut self, id: RequestId) -> Option<TokenLogprobs> {
        self.logprobs
            .get_mut(&id)
            .and_then(|(_, _, q)| q.pop_front())
    }

    fn abort(&mut self, id: RequestId) -> Result<Event> {
        self.seqs.remove(&id);
        if let Some((prompt, _)) = self.beams.remove(&id) {
            let usage = Usage {
                prompt_tokens: prompt.len(),
                ..Usage::default()
            };
            let reason = FinishReason::Abort;
            return Ok(Event::Finished { id, reason, usage });
        }
        Ok(self.sched.abort(id)?)
    }

    fn step(&mut self) -> Result<Vec<Event>> {
        self.ctl.steps.fetch_add(1, Ordering::Relaxed);
        self.last = (0, 0);
        if self.ctl.hold.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(1));
            return Ok(vec![]);
        }
        let delay = self.ctl.delay_us.load(Ordering::Relaxed);
        if delay > 0 {
            std::thread::sleep(Duration::from_micros(delay));
        }
        let plan = self.sched.schedule()?;
        self.last = (plan.num_prefill_tokens, plan.num_decode_tokens);
        let first = |id: &RequestId| self.seqs[id][0];
        if plan.seqs.iter().any(|s| first(&s.id) == PANIC) {
            panic!("mock step panicked");
        }
        if plan.seqs.iter().any(|s| first(&s.id) == FAIL) {
            // As the runner: the step's requests are dropped, the plan closed.
            for s in &plan.seqs {
                self.abort(s.id)?;
            }
            self.sched.update(&plan, &[])?;
            return Err(EngineError::invalid("mock", "the step failed"));
        }
        let sampled: Vec<(RequestId, u32)> = plan
            .logits_ids()
            .map(|id| (id, next_token(&self.seqs[&id])))
            .collect();
        let mut events = self.sched.update(&plan, &sampled)?;
        for e in &events {
            match *e {
                Event::Token { id, token } => {
                    self.seqs.get_mut(&id).expect("live").push(token);
                    if let Some((k, n, q)) = self.logprobs.get_mut(&id) {
                        q.push_back(fake_logprobs(token, *n, *k));
                        *n += 1;
                    }
                }
                Event::Finished { id, .. } => {
                    self.seqs.remove(&id);
                }
            }
        }
        for (id, (prompt, beam)) in self.beams.drain() {
            let hyps = hypotheses(&prompt, &beam);
            let usage = Usage {
                prompt_tokens: prompt.len(),
                completion_tokens: beam.num_beams * beam.max_new_tokens,
                cached_tokens: 0,
            };
            self.beam_results.insert(id, hyps);
            let reason = FinishReason::Length;
            events.push(Event::Finished { id, reason, usage });
        }
        Ok(events)
    }

    fn has_unfinished(&self) -> bool {
        self.sched.has_unfinished() || !self.beams.is_empty()
    }

    fn contains(&self, id: RequestId) -> bool {
        self.sched.params(id).is_some() || self.beams.contains_key(&id)
    }

    fn stats(&self) -> BackendStats {
        BackendStats {
            waiting: self.sched.num_waiting(),
            running: self.sched.num_running(),
            preemptions: self.sched.num_preemptions(),
            kv: self.sched.kv_stats(),
            last_prefill_tokens: self.last.0,
            last_decode_tokens: self.last.1,
        }
    }
}

fn start(max_num_seqs: usize) -> (Service, Arc<Ctl>) {
    let ctl = Arc::new(Ctl::default());
    let c = Arc::clone(&ctl);
    let s = Service::with_backend(move || Mock::new(max_num_seqs, c)).expect("spawn");
    (s, ctl)
}

fn params(n: usize) -> RequestParams<SamplingParams> {
    let mut p = RequestParams::new(n);
    p.sampling = SamplingParams::greedy();
    p
}

fn prompt(len: usize, seed: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 37 + seed * 11 + 1) % 500)
        .collect()
}

/// Tokens until the terminal event (checking the indices), then checks the stream is ended.
fn drain(s: &mut RequestStream) -> (Vec<u32>, StreamEvent) {
    drain_from(s, 0)
}

/// [`drain`] after `from` tokens were received.
fn drain_from(s: &mut RequestStream, from: usize) -> (Vec<u32>, StreamEvent) {
    let mut tokens = vec![];
    loop {
        match s.recv_timeout(WAIT) {
            Ok(StreamEvent::Token { token, index, .. }) => {
                assert_eq!(
                    index,
                    from + tokens.len(),
                    "request {}: token index",
                    s.id()
                );
                tokens.push(token);
            }
            Ok(end) => {
                assert!(s.is_ended());
                assert!(matches!(
                    s.try_recv(),
                    Err(std::sync::mpsc::TryRecvError::Disconnected)
                ));
                assert!(s.recv().is_none(), "an event after the terminal one");
                return (tokens, end);
            }
            Err(e) => panic!("request {}: {e:?} after {} tokens", s.id(), tokens.len()),
        }
    }
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < WAIT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn handles_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Service>();
    send_sync::<ServiceError>();
    send::<RequestStream>();
    send::<StreamEvent>();
}

#[test]
fn each_token_carries_its_logprobs_when_asked() {
    // Two requests in the same steps, one asking for 3 alternatives per token: its tokens
    // come with their own log-probabilities in order, the other's with none.
    let (service, _ctl) = start(4);
    let (p1, p2) = (prompt(9, 1), prompt(5, 2));
    let mut asked = params(6);
    asked.top_logprobs = Some(3);
    let mut s1 = service.submit(p1.clone(), asked).expect("submit");
    let mut s2 = service.submit(p2.clone(), params(4)).expect("submit");
    let mut got = vec![];
    while let Ok(ev) = s1.recv_timeout(WAIT) {
        match ev {
            StreamEvent::Token {
                token,
                index,
                logprobs,
            } => got.push((token, index, logprobs)),
            StreamEvent::Finished { .. } => break,
            e => panic!("{e:?}"),
        }
    }
    let want = expected(&p1, 6);
    assert_eq!(got.len(), want.len());
    for (i, ((token, index, lp), &w)) in got.into_iter().zip(&want).enumerate() {
        assert_eq!((token, index), (w, i));
        assert_eq!(lp, Some(fake_logprobs(w, i, 3)), "token {i}");
    }
    loop {
        match s2.recv_timeout(WAIT).expect("event") {
            StreamEvent::Token { logprobs, .. } => assert_eq!(logprobs, None),
            StreamEvent::Finished { .. } => break,
            e => panic!("{e:?}"),
        }
    }
}

#[test]
fn concurrent_submitters_get_exactly_their_tokens() {
    // Few sequences per step: requests wait, run in mixed batches, and finish at different times.
    let (service, ctl) = start(3);
    let ids: Vec<Vec<RequestId>> = std::thread::scope(|sc| {
        let threads: Vec<_> = (0..4u32)
            .map(|t| {
                let service = &service;
                sc.spawn(move || {
                    let mut streams = vec![];
                    for k in 0..5u32 {
                        let (p, n) = (
                            prompt(1 + (t * 5 + k) as usize * 7, t * 5 + k),
                            3 + k as usize * 4,
                        );
                        let s = service.submit(p.clone(), params(n)).expect("submit");
                        streams.push((s, p, n));
                    }
                    let mut ids = vec![];
                    for (mut s, p, n) in streams {
                        let (tokens, end) = drain(&mut s);
                        assert_eq!(tokens, expected(&p, n), "request {}", s.id());
                        match end {
                            StreamEvent::Finished { reason, usage } => {
                                assert_eq!(reason, FinishReason::Length);
                                assert_eq!(usage.prompt_tokens, p.len());
                                assert_eq!(usage.completion_tokens, n);
                            }
                            e => panic!("request {}: {e:?}", s.id()),
                        }
                        assert!(s.first_token_at().expect("first token") >= s.submitted_at());
                        ids.push(s.id());
                    }
                    ids
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("submitter"))
            .collect()
    });
    let all: HashSet<RequestId> = ids.iter().flatten().copied().collect();
    assert_eq!(all.len(), 20, "ids are unique");
    wait_until("stats", || service.stats().ended == 20);
    let st = service.stats();
    assert_eq!((st.submitted, st.active, st.failed_steps), (20, 0, 0));
    assert_eq!((st.backend.waiting, st.backend.running), (0, 0));
    // Steps are timed by what they computed: prompt tokens (maybe with decodes), or decodes.
    let (p, d) = (st.prefill_steps, st.decode_steps);
    assert!(p.count >= 1 && d.count >= 1, "{p:?} {d:?}");
    assert!(p.count + d.count <= st.steps, "{} steps", st.steps);
    for t in [p, d] {
        assert_eq!(t.buckets.iter().sum::<u64>(), t.count);
        assert!(t.sum_ns > 0);
    }
    // Idle: the worker blocks instead of stepping.
    let steps = ctl.steps.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        ctl.steps.load(Ordering::Relaxed),
        steps,
        "the idle worker steps"
    );
    service.shutdown().expect("shutdown");
}

#[test]
fn abort_mid_stream() {
    let (service, ctl) = start(4);
    ctl.delay_us.store(200, Ordering::Relaxed);
    let p = prompt(5, 1);
    let want = expected(&p, 10_000);
    for by_stream in [false, true] {
        let mut s = service.submit(p.clone(), params(10_000)).expect("submit");
        for i in 0..3 {
            match s.recv_timeout(WAIT) {
                Ok(StreamEvent::Token { index, .. }) => assert_eq!(index, i),
                e => panic!("{e:?}"),
            }
        }
        if by_stream {
            s.abort();
        } else {
            service.abort(s.id()).expect("abort");
        }
        let (tokens, end) = drain_from(&mut s, 3);
        let got = 3 + tokens.len();
        assert!(got < 10_000, "the abort came too late to test anything");
        assert_eq!(tokens, want[3..got]);
        match end {
            StreamEvent::Finished { reason, usage } => {
                assert_eq!(reason, FinishReason::Abort);
                assert_eq!(usage.completion_tokens, got);
            }
            e => panic!("{e:?}"),
        }
    }
    // An id that has ended is ignored.
    service.abort(0).expect("abort of an ended request");
    wait_until("stats", || service.stats().ended == 2);
}

#[test]
fn dropping_a_stream_aborts_its_request() {
    let (service, ctl) = start(4);
    ctl.delay_us.store(200, Ordering::Relaxed);
    let mut s = service
        .submit(prompt(9, 2), params(10_000))
        .expect("submit");
    assert!(matches!(
        s.recv_timeout(WAIT),
        Ok(StreamEvent::Token { .. })
    ));
    drop(s);
    wait_until("the abort", || {
        let st = service.stats();
        st.active == 0 && st.backend.running + st.backend.waiting == 0
    });
    // A stream that ended sends nothing on drop; the service keeps serving.
    let p = prompt(4, 3);
    let mut s = service.submit(p.clone(), params(6)).expect("submit");
    assert_eq!(drain(&mut s).0, expected(&p, 6));
    drop(s);
    wait_until("stats", || service.stats().ended == 2);
}

#[test]
fn submit_returns_validation_errors_naming_the_field() {
    let (service, _ctl) = start(4);
    let err = |p: Vec<u32>, params| service.submit(p, params).expect_err("refused");
    assert!(matches!(
        err(vec![], params(4)),
        ServiceError::Request(RequestError::EmptyPrompt)
    ));
    let e = err(vec![1, 2, VOCAB + 5], params(4));
    assert!(matches!(
        e,
        ServiceError::Request(RequestError::TokenOutOfRange { index: 2, .. })
    ));
    assert!(e.to_string().starts_with("prompt[2]"), "{e}");
    assert!(matches!(
        err(vec![1], params(0)),
        ServiceError::Request(RequestError::ZeroMaxNewTokens)
    ));
    assert!(matches!(
        err(vec![1], params(1 << 16)),
        ServiceError::Request(RequestError::ExceedsContext { .. })
    ));
    let mut bad = params(4);
    bad.sampling.top_p = 0.0;
    let e = err(vec![1], bad);
    assert!(
        matches!(e, ServiceError::Invalid { arg: "top_p", .. }),
        "{e:?}"
    );
    assert!(e.to_string().starts_with("top_p: "), "{e}");
    // Nothing was queued, and the service still serves.
    assert_eq!(service.stats().submitted, 0);
    let mut s = service.submit(vec![3, 4], params(2)).expect("submit");
    assert_eq!(drain(&mut s).0, expected(&[3, 4], 2));
}

#[test]
fn a_failed_step_ends_its_requests_and_the_service_keeps_serving() {
    // Two sequences per step: X and P run in the failing step, W waits and is not in it.
    let (service, ctl) = start(2);
    ctl.hold.store(true, Ordering::Relaxed);
    let mut x = service.submit(prompt(6, 4), params(5)).expect("x");
    let mut p = service.submit(vec![FAIL, 1, 2], params(5)).expect("p");
    let w_prompt = prompt(3, 5);
    let mut w = service.submit(w_prompt.clone(), params(7)).expect("w");
    ctl.hold.store(false, Ordering::Relaxed);
    for s in [&mut x, &mut p] {
        let (tokens, end) = drain(s);
        assert!(tokens.is_empty());
        match end {
            StreamEvent::Error(ServiceError::Engine(e)) => {
                assert!(e.to_string().contains("the step failed"), "{e}")
            }
            e => panic!("request {}: {e:?}", s.id()),
        }
    }
    let (tokens, end) = drain(&mut w);
    assert_eq!(tokens, expected(&w_prompt, 7));
    assert!(matches!(
        end,
        StreamEvent::Finished {
            reason: FinishReason::Length,
            ..
        }
    ));
    let z_prompt = prompt(12, 6);
    let mut z = service.submit(z_prompt.clone(), params(4)).expect("z");
    assert_eq!(drain(&mut z).0, expected(&z_prompt, 4));
    wait_until("stats", || service.stats().ended == 4);
    assert_eq!(service.stats().failed_steps, 1);
    assert!(service.is_running());
}

#[test]
fn shutdown_aborts_requests_in_flight() {
    let (service, ctl) = start(4);
    ctl.hold.store(true, Ordering::Relaxed);
    let mut streams: Vec<_> = (0..3)
        .map(|i| service.submit(prompt(4 + i, 7), params(5)).expect("submit"))
        .collect();
    service.shutdown().expect("shutdown");
    assert!(!service.is_running());
    for (i, s) in streams.iter_mut().enumerate() {
        let (tokens, end) = drain(s);
        assert!(tokens.is_empty());
        match end {
            StreamEvent::Finished { reason, usage } => {
                assert_eq!(reason, FinishReason::Abort);
                assert_eq!(usage.prompt_tokens, 4 + i);
            }
            e => panic!("{e:?}"),
        }
    }
    assert!(matches!(
        service.submit(vec![1], params(1)),
        Err(ServiceError::Shutdown)
    ));
    assert!(matches!(service.abort(0), Err(ServiceError::Shutdown)));
    service.shutdown().expect("a second shutdown");
    // Dropping a running service shuts it down too (joins within the test's time).
    let (service, _ctl) = start(4);
    let _s = service.submit(vec![1], params(1000)).expect("submit");
    drop(service);
}

#[test]
fn a_worker_panic_is_an_error_for_everyone() {
    let (service, ctl) = start(4);
    ctl.hold.store(true, Ordering::Relaxed);
    let mut a = service.submit(prompt(5, 8), params(1000)).expect("a");
    let mut p = service.submit(vec![PANIC], params(3)).expect("p");
    ctl.hold.store(false, Ordering::Relaxed);
    for s in [&mut a, &mut p] {
        match drain(s).1 {
            StreamEvent::Error(ServiceError::WorkerPanicked(m)) => {
                assert!(m.contains("mock step panicked"), "{m}")
            }
            e => panic!("{e:?}"),
        }
    }
    assert!(!service.is_running());
    assert!(matches!(
        service.submit(vec![1], params(1)),
        Err(ServiceError::WorkerPanicked(_))
    ));
    assert!(matches!(
        service.shutdown(),
        Err(ServiceError::WorkerPanicked(_))
    ));
}

#[test]
fn init_errors_are_returned_by_spawn() {
    let e = Service::with_backend(|| -> Result<Mock> {
        Err(EngineError::invalid("max_model_len", "0 outside 1..=2048"))
    })
    .expect_err("refused");
    assert!(e.to_string().starts_with("max_model_len: "), "{e}");
    let e =
        Service::with_backend(|| -> Result<Mock> { panic!("no weights") }).expect_err("refused");
    assert!(
        matches!(&e, ServiceError::WorkerPanicked(m) if m.contains("no weights")),
        "{e:?}"
    );
}

#[test]
fn the_stream_is_an_iterator_with_timestamps() {
    let (service, _ctl) = start(4);
    let p = prompt(7, 9);
    let mut s = service.submit(p.clone(), params(5)).expect("submit");
    let events: Vec<StreamEvent> = (&mut s).collect();
    let tokens: Vec<u32> = events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::Token { token, .. } => Some(*token),
            _ => None,
        })
        .collect();
    assert_eq!(tokens, expected(&p, 5));
    assert_eq!(events.len(), 6);
    assert!(events[5].is_terminal());
    let (first, last) = (s.first_token_at().unwrap(), s.last_event_at().unwrap());
    assert!(s.submitted_at() <= first && first <= last);
    // Nothing queued: the non-blocking calls say so.
    let mut idle = service.submit(vec![1], params(1)).expect("submit");
    let _ = drain(&mut idle);
    assert!(matches!(
        idle.recv_timeout(Duration::from_millis(1)),
        Err(RecvTimeoutError::Disconnected)
    ));
}

/// A sink that records its events on a channel; `keep` says how many tokens it accepts
/// before reporting its receiver gone.
fn recording_sink(
    keep: usize,
) -> (
    impl FnMut(StreamEvent, Instant) -> bool + Send + 'static,
    std::sync::mpsc::Receiver<(StreamEvent, Instant)>,
) {
    let (tx, rx) = std::sync::mpsc::channel();
    let mut tokens = 0;
    let sink = move |e: StreamEvent, at: Instant| {
        if matches!(e, StreamEvent::Token { .. }) {
            tokens += 1;
        }
        let _ = tx.send((e, at));
        tokens <= keep
    };
    (sink, rx)
}

/// Events until the terminal one, with a bound on the wait; checks nothing follows it.
fn sink_events(rx: &std::sync::mpsc::Receiver<(StreamEvent, Instant)>) -> Vec<StreamEvent> {
    let mut out = vec![];
    let mut last = None;
    loop {
        let (e, at) = rx.recv_timeout(WAIT).expect("an event in time");
        assert!(last.is_none_or(|l| l <= at), "stamps go forward");
        last = Some(at);
        let end = e.is_terminal();
        out.push(e);
        if end {
            break;
        }
    }
    std::thread::sleep(Duration::from_millis(5));
    assert!(rx.try_recv().is_err(), "an event after the terminal one");
    out
}

#[test]
fn a_sink_gets_the_tokens_then_one_terminal_event() {
    let (service, _ctl) = start(4);
    let p = prompt(6, 10);
    let (sink, rx) = recording_sink(usize::MAX);
    let id = service
        .submit_with_sink(p.clone(), params(7), sink)
        .expect("submit");
    let events = sink_events(&rx);
    let tokens: Vec<u32> = events
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match *e {
            StreamEvent::Token { token, index, .. } => {
                assert_eq!(index, i);
                Some(token)
            }
            _ => None,
        })
        .collect();
    assert_eq!(tokens, expected(&p, 7), "request {id}");
    match events.last() {
        Some(StreamEvent::Finished { reason, usage }) => {
            assert_eq!(*reason, FinishReason::Length);
            assert_eq!((usage.prompt_tokens, usage.completion_tokens), (6, 7));
        }
        e => panic!("{e:?}"),
    }
    // Ids are shared with `submit`.
    let s = service.submit(vec![1], params(1)).expect("submit");
    assert_eq!(s.id(), id + 1);
}

#[test]
fn a_sink_refusal_is_its_only_event_and_bad_sampling_is_an_err() {
    let (service, _ctl) = start(4);
    let (sink, rx) = recording_sink(usize::MAX);
    service
        .submit_with_sink(vec![], params(4), sink)
        .expect("queued");
    let events = sink_events(&rx);
    assert!(
        matches!(
            events[..],
            [StreamEvent::Error(ServiceError::Request(
                RequestError::EmptyPrompt
            ))]
        ),
        "{events:?}"
    );
    let mut bad = params(4);
    bad.sampling.temperature = -1.0;
    let (sink, rx) = recording_sink(usize::MAX);
    let e = service
        .submit_with_sink(vec![1], bad, sink)
        .expect_err("refused");
    assert!(
        matches!(
            e,
            ServiceError::Invalid {
                arg: "temperature",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        rx.recv_timeout(Duration::from_millis(50)).is_err(),
        "the sink was called"
    );
    assert_eq!(service.stats().submitted, 0);
}

#[test]
fn a_sink_whose_receiver_is_gone_aborts_its_request() {
    let (service, ctl) = start(4);
    ctl.delay_us.store(200, Ordering::Relaxed);
    let (sink, rx) = recording_sink(3);
    service
        .submit_with_sink(prompt(5, 11), params(10_000), sink)
        .expect("submit");
    let events = sink_events(&rx);
    // The fourth token found the receiver gone: the request ended right there.
    assert_eq!(events.len(), 5, "{events:?}");
    assert!(matches!(
        events[4],
        StreamEvent::Finished {
            reason: FinishReason::Abort,
            usage: Usage {
                completion_tokens: 4,
                ..
            }
        }
    ));
    wait_until("the abort", || {
        let st = service.stats();
        st.active == 0 && st.backend.running == 0
    });
}

#[test]
fn sinks_end_at_shutdown_and_are_refused_after() {
    let (service, ctl) = start(4);
    ctl.hold.store(true, Ordering::Relaxed);
    let (sink, rx) = recording_sink(usize::MAX);
    service
        .submit_with_sink(prompt(4, 12), params(5), sink)
        .expect("submit");
    wait_until("the request to queue", || service.stats().active == 1);
    service.shutdown().expect("shutdown");
    let events = sink_events(&rx);
    assert!(
        matches!(
            events[..],
            [StreamEvent::Finished {
                reason: FinishReason::Abort,
                ..
            }]
        ),
        "{events:?}"
    );
    let (sink, rx) = recording_sink(usize::MAX);
    assert!(matches!(
        service.submit_with_sink(vec![1], params(1), sink),
        Err(ServiceError::Shutdown)
    ));
    assert!(
        rx.recv_timeout(Duration::from_millis(50)).is_err(),
        "the sink was called"
    );
}

/// A backend without beam search: the [`Mock`] behind the trait's default beam methods.
struct NoBeams(Mock);

impl Backend for NoBeams {
    fn add_request(&mut self, req: Request<SamplingParams>) -> Result<()> {
        self.0.add_request(req)
    }

    fn abort(&mut self, id: RequestId) -> Result<Event> {
        self.0.abort(id)
    }

    fn step(&mut self) -> Result<Vec<Event>> {
        self.0.step()
    }

    fn has_unfinished(&self) -> bool {
        self.0.has_unfinished()
    }

    fn contains(&self, id: RequestId) -> bool {
        self.0.contains(id)
    }

    fn stats(&self) -> BackendStats {
        self.0.stats()
    }
}

fn beam(num_beams: usize, num_return_sequences: usize, max_new: usize) -> BeamParams {
    let mut b = BeamParams::new(num_beams, max_new);
    b.num_return_sequences = num_return_sequences;
    b.eos_token_ids = vec![2];
    b
}

/// Every event of a stream, checking that it ends after the terminal one.
fn all_events(s: &mut RequestStream) -> Vec<StreamEvent> {
    let mut out = vec![];
    loop {
        let e = s.recv_timeout(WAIT).expect("an event in time");
        let end = e.is_terminal();
        out.push(e);
        if end {
            assert!(s.is_ended() && s.recv().is_none());
            return out;
        }
    }
}

#[test]
fn a_beam_request_gets_its_hypotheses_then_finished_and_no_tokens() {
    let (service, _ctl) = start(4);
    let p = prompt(5, 20);
    // A sampled request beside it runs as usual.
    let mut sampled = service.submit(prompt(3, 21), params(4)).expect("submit");
    let mut s = service
        .submit_beam(p.clone(), params(6), beam(3, 2, 6))
        .expect("submit_beam");
    let events = all_events(&mut s);
    match &events[..] {
        [StreamEvent::Beams(h), StreamEvent::Finished { reason, usage }] => {
            assert_eq!(*h, hypotheses(&p, &beam(3, 2, 6)));
            assert_eq!(h[0].0, expected(&p, 6));
            assert_eq!(*reason, FinishReason::Length);
            assert_eq!((usage.prompt_tokens, usage.completion_tokens), (5, 18));
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(
        s.first_token_at(),
        None,
        "a beam request has no first token"
    );
    assert!(s.last_event_at().is_some());
    let (tokens, _) = drain(&mut sampled);
    assert_eq!(tokens.len(), 4);
    wait_until("stats", || service.stats().ended == 2);
    assert_eq!(service.stats().submitted, 2);
    // The callback variant: the same two events.
    let (sink, rx) = recording_sink(usize::MAX);
    service
        .submit_beam_with_sink(p.clone(), params(6), beam(2, 1, 3), sink)
        .expect("submit_beam_with_sink");
    let events = sink_events(&rx);
    assert!(
        matches!(
            &events[..],
            [StreamEvent::Beams(h), StreamEvent::Finished { .. }] if h.len() == 1
        ),
        "{events:?}"
    );
}

#[test]
fn beam_refusals_name_the_field() {
    let (service, _ctl) = start(4);
    let invalid = |b: BeamParams| match service.submit_beam(vec![1, 2], params(4), b) {
        Err(ServiceError::Invalid { arg, .. }) => arg,
        r => panic!("{r:?}"),
    };
    assert_eq!(invalid(beam(2, 3, 4)), "num_return_sequences");
    assert_eq!(invalid(beam(0, 1, 4)), "num_beams");
    assert_eq!(invalid(beam(BEAM_MAX_KEEP + 1, 1, 4)), "num_beams");
    assert_eq!(invalid(beam(2, 1, 0)), "max_new_tokens");
    // More beams than one step runs: the backend's refusal.
    assert!(matches!(
        service.submit_beam(vec![1, 2], params(4), beam(5, 1, 4)),
        Err(ServiceError::Request(RequestError::BeamWidth {
            width: 5,
            max_num_seqs: 4
        }))
    ));
    // A bad penalty is refused as for any request.
    let mut bad = params(4);
    bad.sampling.repetition_penalty = -1.0;
    assert!(matches!(
        service.submit_beam(vec![1, 2], bad, beam(2, 1, 4)),
        Err(ServiceError::Invalid { .. })
    ));
    assert_eq!(service.stats().submitted, 0);
    // A backend without beam search refuses, through the callback too.
    let ctl = Arc::new(Ctl::default());
    let service = Service::with_backend(move || Mock::new(4, ctl).map(NoBeams)).expect("spawn");
    match service.submit_beam(vec![1, 2], params(4), beam(2, 1, 4)) {
        Err(ServiceError::Invalid {
            arg: "beam",
            reason,
        }) => {
            assert!(reason.contains("not supported"), "{reason}")
        }
        r => panic!("{r:?}"),
    }
    let (sink, rx) = recording_sink(usize::MAX);
    service
        .submit_beam_with_sink(vec![1, 2], params(4), beam(2, 1, 4), sink)
        .expect("queued");
    let events = sink_events(&rx);
    assert!(
        matches!(
            events[..],
            [StreamEvent::Error(ServiceError::Invalid {
                arg: "beam",
                ..
            })]
        ),
        "{events:?}"
    );
    // It still serves sampled requests.
    let mut s = service.submit(vec![1, 2], params(3)).expect("submit");
    assert_eq!(drain(&mut s).0, expected(&[1, 2], 3));
}

#[test]
fn an_aborted_beam_request_gets_no_hypotheses() {
    let (service, ctl) = start(4);
    ctl.hold.store(true, Ordering::Relaxed);
    let mut s = service
        .submit_beam(prompt(4, 22), params(5), beam(2, 2, 5))
        .expect("submit_beam");
    wait_until("the request to queue", || service.stats().active == 1);
    s.abort();
    let events = all_events(&mut s);
    assert!(
        matches!(
            events[..],
            [StreamEvent::Finished {
                reason: FinishReason::Abort,
                ..
            }]
        ),
        "{events:?}"
    );
    // Dropping an unfinished beam stream aborts it too.
    let s = service
        .submit_beam(prompt(4, 23), params(5), beam(2, 1, 5))
        .expect("submit_beam");
    wait_until("the request to queue", || service.stats().active == 1);
    drop(s);
    wait_until("the abort", || service.stats().active == 0);
    ctl.hold.store(false, Ordering::Relaxed);
    let mut s = service
        .submit_beam(prompt(4, 24), params(5), beam(2, 1, 5))
        .expect("submit_beam");
    assert!(matches!(
        all_events(&mut s)[..],
        [StreamEvent::Beams(_), StreamEvent::Finished { .. }]
    ));
}
