//! `fl serve`'s HTTP API in-process: real HTTP/1.1 over loopback against the axum server,
//! the service on a CPU mock backend (the real scheduler; the "model" echoes its prompt),
//! and a character-level tokenizer with byte fallback written to a temp dir. No GPU.
//!
//! Every wait is bounded: a hung server fails the test instead of hanging it.

#![cfg(feature = "serve")]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fl_engine::beam::{BeamParams, EarlyStopping};
use fl_engine::chat_template::ChatTemplate;
use fl_engine::runner::TokenLogprobs;
use fl_engine::scheduler::{
    Event, FinishReason, Request, RequestError, RequestId, Scheduler, SchedulerConfig, Usage,
};
use fl_engine::serve::{ModelInfo, ServeConfig, Server};
use fl_engine::service::{Backend, BackendStats, Service};
use fl_engine::tokenizer::Tokenizer;
use fl_sampling::SamplingParams;
use serde_json::{json, Value};

/// Longest any single wait may take.
mod http_client;
use http_client::{connect, parse_response, raw_request, Resp};

const WAIT: Duration = Duration::from_secs(20);
const BOS: u32 = 1;
const EOS: u32 = 2;
const CONTEXT: usize = 4096;
const MODEL: &str = "echo";

// ---------------------------------------------------------------- the tokenizer

/// `<unk> <s> </s>`, the 256 byte tokens `<0x00>..<0xFF>`, `▁`, then printable ASCII: each
/// character is a token, anything else falls back to its UTF-8 bytes (Llama-2's scheme).
fn tokenizer_json() -> Value {
    let mut vocab = serde_json::Map::new();
    for (i, t) in ["<unk>", "<s>", "</s>"].iter().enumerate() {
        vocab.insert(t.to_string(), json!(i));
    }
    for b in 0..256u32 {
        vocab.insert(format!("<0x{b:02X}>"), json!(3 + b));
    }
    vocab.insert("▁".into(), json!(259));
    for (i, c) in (33u8..127).enumerate() {
        vocab.insert((c as char).to_string(), json!(260 + i));
    }
    let special = |id: u32, s: &str| {
        json!({"id": id, "content": s, "single_word": false, "lstrip": false, "rstrip": false,
               "normalized": false, "special": true})
    };
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
        ]},
        "pre_tokenizer": null,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}
        },
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}
        ]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                  "vocab": vocab, "merges": []}
    })
}

const VOCAB: usize = 260 + 94;

/// The token of a printable ASCII character.
fn char_id(c: char) -> u32 {
    260 + (c as u32 - 33)
}

// ---------------------------------------------------------------- the mock model

/// Test controls shared with the mock on the worker thread.
#[derive(Default)]
struct Ctl {
    /// Steps return nothing (after 1 ms) while set: requests wait without running.
    hold: AtomicBool,
    /// Sleep per step, in microseconds.
    delay_us: AtomicU64,
    /// The last beam request's parameters and sampling, as the engine got them.
    last_beam: Mutex<Option<(BeamParams, SamplingParams)>>,
}

/// The "model" repeats its prompt after the first token: prompt `<s> a b c` generates
/// `a b c a b c ...`, so a test writes the output it wants as the prompt. A `?` echoes as
/// the last decimal digit of the request's seed.
///
/// Beam requests run outside the scheduler and end at the next step with fixed hypotheses
/// ([`hypotheses`]).
struct Echo {
    sched: Scheduler<SamplingParams>,
    seqs: HashMap<RequestId, (Vec<u32>, usize)>,
    beams: HashMap<RequestId, (Vec<u32>, BeamParams)>,
    beam_results: HashMap<RequestId, Vec<(Vec<u32>, f64)>>,
    /// Requests asking for log-probabilities: `top_logprobs`, and those not yet taken.
    logprobs: HashMap<RequestId, (usize, std::collections::VecDeque<TokenLogprobs>)>,
    ctl: Arc<Ctl>,
    /// What the last step computed: (prompt tokens, decode tokens).
    last: (usize, usize),
}

/// The mock's log-probabilities: the token at -0.5, then the next ids at -2, -3, ...
fn fake_logprobs(token: u32, k: usize) -> TokenLogprobs {
    TokenLogprobs {
        token,
        logprob: -0.5,
        top: (0..k as u32)
            .map(|j| {
                let lp = if j == 0 { -0.5 } else { -1.0 - j as f32 };
                ((token + j) % VOCAB as u32, lp)
            })
            .collect(),
    }
}

/// The mock's beam search of prompt `<s> x y ...`: hypothesis `i` (scored `-i`) is the digit
/// `i` then the echo of `x y ...`; an even `i` ends with the first end id after at most the
/// echo once, an odd one runs to `max_new_tokens`.
fn hypotheses(prompt: &[u32], beam: &BeamParams) -> Vec<(Vec<u32>, f64)> {
    let echo = &prompt[1.min(prompt.len() - 1)..];
    (0..beam.num_return_sequences)
        .map(|i| {
            let digit = char_id(char::from(b'0' + (i % 10) as u8));
            let mut t: Vec<u32> = std::iter::once(digit)
                .chain(echo.iter().copied().cycle())
                .take(beam.max_new_tokens)
                .collect();
            if let (0, Some(&end)) = (i % 2, beam.eos_token_ids.first()) {
                t.truncate((1 + echo.len()).min(beam.max_new_tokens - 1));
                t.push(end);
            }
            (t, -(i as f64))
        })
        .collect()
}

impl Backend for Echo {
    fn add_request(&mut self, req: Request<SamplingParams>) -> fl_engine::Result<()> {
        let (id, prompt, seed) = (req.id, req.prompt.clone(), req.params.seed);
        let top = req.params.top_logprobs;
        self.sched.add_request(req)?;
        if let Some(k) = top {
            self.logprobs.insert(id, (k, Default::default()));
        }
        let echo = if prompt.len() > 1 {
            prompt[1..].to_vec()
        } else {
            prompt
        };
        let digit = char_id(char::from(b'0' + (seed % 10) as u8));
        let echo = echo
            .into_iter()
            .map(|t| if t == char_id('?') { digit } else { t })
            .collect();
        self.seqs.insert(id, (echo, 0));
        Ok(())
    }

    fn add_beam_request(
        &mut self,
        req: Request<SamplingParams>,
        beam: BeamParams,
    ) -> fl_engine::Result<()> {
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
        *self.ctl.last_beam.lock().unwrap() = Some((beam.clone(), req.params.sampling));
        self.beams.insert(req.id, (req.prompt, beam));
        Ok(())
    }

    fn take_beams(&mut self, id: RequestId) -> Option<Vec<(Vec<u32>, f64)>> {
        self.beam_results.remove(&id)
    }

    fn next_logprobs(&mut self, id: RequestId) -> Option<TokenLogprobs> {
        self.logprobs.get_mut(&id).and_then(|(_, q)| q.pop_front())
    }

    fn abort(&mut self, id: RequestId) -> fl_engine::Result<Event> {
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

    fn step(&mut self) -> fl_engine::Result<Vec<Event>> {
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
        let sampled: Vec<(RequestId, u32)> = plan
            .logits_ids()
            .map(|id| {
                let (echo, n) = self.seqs.get_mut(&id).expect("live request");
                let t = echo[*n % echo.len()];
                *n += 1;
                (id, t)
            })
            .collect();
        let mut events = self.sched.update(&plan, &sampled)?;
        for e in &events {
            match *e {
                Event::Finished { id, .. } => {
                    self.seqs.remove(&id);
                }
                Event::Token { id, token } => {
                    if let Some((k, q)) = self.logprobs.get_mut(&id) {
                        q.push_back(fake_logprobs(token, *k));
                    }
                }
            }
        }
        for (id, (prompt, beam)) in self.beams.drain() {
            let hyps = hypotheses(&prompt, &beam);
            let reason = match hyps[0].0.last() {
                Some(t) if beam.eos_token_ids.contains(t) => FinishReason::Stop,
                _ => FinishReason::Length,
            };
            let usage = Usage {
                prompt_tokens: prompt.len(),
                completion_tokens: beam.num_beams * beam.max_new_tokens,
                cached_tokens: 0,
            };
            self.beam_results.insert(id, hyps);
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

// ---------------------------------------------------------------- the server

struct Opts {
    /// KV blocks of 16 tokens.
    kv_blocks: usize,
    api_key: Option<String>,
    max_waiting: usize,
    max_body_bytes: usize,
    chat_template: bool,
    ready: bool,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            kv_blocks: 1 << 14,
            api_key: None,
            max_waiting: 64,
            max_body_bytes: 1 << 20,
            chat_template: true,
            ready: true,
        }
    }
}

struct TestServer {
    addr: SocketAddr,
    server: Server,
    service: Arc<Service>,
    info: ModelInfo,
    ctl: Arc<Ctl>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

/// Llama-2's shape: BOS from the template, one line per message.
const TEMPLATE: &str = "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}\n\
                        {% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";

fn start(opts: Opts) -> TestServer {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, tokenizer_json().to_string()).expect("write tokenizer.json");
    let tokenizer = Arc::new(Tokenizer::from_file(&path).expect("tokenizer"));
    let ctl = Arc::new(Ctl::default());
    let c = Arc::clone(&ctl);
    let kv_blocks = opts.kv_blocks;
    let service = Arc::new(
        Service::with_backend(move || {
            let mut cfg = SchedulerConfig::new(kv_blocks, CONTEXT);
            cfg.max_num_seqs = 8;
            cfg.max_batched_tokens = 256;
            cfg.vocab_size = Some(VOCAB as u32);
            Ok(Echo {
                sched: Scheduler::new(cfg)?,
                seqs: HashMap::new(),
                beams: HashMap::new(),
                beam_results: HashMap::new(),
                logprobs: HashMap::new(),
                ctl: c,
                last: (0, 0),
            })
        })
        .expect("service"),
    );
    let chat_template = opts.chat_template.then(|| {
        let t = ChatTemplate::new(TEMPLATE, Some("<s>".into()), Some("</s>".into()))
            .expect("template")
            .with_add_bos_token(Some(true));
        Arc::new(t)
    });
    let info = ModelInfo {
        max_model_len: CONTEXT,
        vocab_size: VOCAB,
        eos_token_ids: vec![EOS],
        kv_capacity_tokens: Some(16 * opts.kv_blocks),
        tokenizer: Some(tokenizer),
        chat_template,
    };
    let mut cfg = ServeConfig::new(MODEL);
    cfg.api_key = opts.api_key;
    cfg.max_waiting = opts.max_waiting;
    cfg.max_body_bytes = opts.max_body_bytes;
    let server = Server::new(cfg);
    if opts.ready {
        server
            .set_ready(Arc::clone(&service), info.clone())
            .expect("ready");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    rt.spawn(fl_engine::serve::run(listener, server.clone(), async {
        let _ = stopped.await;
    }));
    TestServer {
        addr,
        server,
        service,
        info,
        ctl,
        stop: Some(stop),
        rt,
        _dir: dir,
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.service.shutdown();
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        // Let the runtime wind down without waiting for open test connections.
        let _ = &self.rt;
    }
}

impl TestServer {
    fn call(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
        http_client::call(self.addr, WAIT, method, path, headers, body)
    }

    fn post(&self, path: &str, body: &Value) -> Resp {
        self.call(
            "POST",
            path,
            &[("Content-Type", "application/json")],
            body.to_string().as_bytes(),
        )
    }

    fn get(&self, path: &str) -> Resp {
        self.call("GET", path, &[], b"")
    }

    fn tokens(&self, text: &str) -> Vec<u32> {
        self.info
            .tokenizer
            .as_ref()
            .expect("tokenizer")
            .encode(text, true)
            .expect("encode")
    }

    fn wait_until(&self, what: &str, mut cond: impl FnMut(&Service) -> bool) {
        let t0 = Instant::now();
        while !cond(&self.service) {
            assert!(t0.elapsed() < WAIT, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// A 4xx error: checks the OpenAI shape and returns (param, message).
fn error_of(r: &Resp, status: u16) -> (String, String) {
    assert_eq!(
        r.status,
        status,
        "body {:?}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(r.header("content-type"), Some("application/json"));
    let j = r.json();
    let e = &j["error"];
    for k in ["message", "type", "param", "code"] {
        assert!(e.get(k).is_some(), "error without {k}: {j}");
    }
    (
        e["param"].as_str().unwrap_or_default().to_string(),
        e["message"].as_str().expect("message").to_string(),
    )
}

/// Text and finish reason of a streamed completion or chat response; checks the framing.
fn streamed(r: &Resp, chat: bool, include_usage: bool) -> (String, String, Option<Value>) {
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let events = r.events();
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("chunk JSON"))
        .collect();
    let object = if chat {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    let id = chunks[0]["id"].clone();
    for c in &chunks {
        assert_eq!(c["object"], object, "{c}");
        assert_eq!(c["id"], id, "one id per response");
        assert_eq!(c["model"], MODEL);
    }
    let (mut body, usage) = match include_usage {
        true => {
            let u = chunks.last().expect("usage chunk");
            assert_eq!(u["choices"], json!([]), "{u}");
            (&chunks[..chunks.len() - 1], Some(u["usage"].clone()))
        }
        false => (&chunks[..], None),
    };
    if chat {
        assert_eq!(
            body[0]["choices"][0]["delta"],
            json!({"role": "assistant", "content": ""}),
            "the first chat chunk carries the role"
        );
        body = &body[1..];
    }
    let last = body.last().expect("a finish chunk");
    let finish = last["choices"][0]["finish_reason"]
        .as_str()
        .expect("finish_reason on the last chunk")
        .to_string();
    if chat {
        assert_eq!(last["choices"][0]["delta"], json!({}), "{last}");
    }
    let mut text = String::new();
    for c in &body[..body.len() - 1] {
        let choice = &c["choices"][0];
        assert!(choice["finish_reason"].is_null(), "{c}");
        let piece = if chat {
            choice["delta"]["content"].as_str()
        } else {
            choice["text"].as_str()
        }
        .expect("text");
        assert!(!piece.is_empty(), "an empty content chunk: {c}");
        assert!(
            !piece.contains('\u{FFFD}'),
            "a partial character went out: {c}"
        );
        if include_usage {
            assert!(c["usage"].is_null(), "{c}");
        }
        text += piece;
    }
    (text, finish, usage)
}

// ---------------------------------------------------------------- tests

#[test]
fn routes_health_models_and_unknown_paths() {
    let t = start(Opts::default());
    let h = t.get("/health");
    assert_eq!(
        (h.status, h.json()["status"].clone()),
        (200, json!("ready"))
    );
    let m = t.get("/v1/models").json();
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], MODEL);
    assert_eq!(m["data"][0]["max_model_len"], CONTEXT);
    let (_, msg) = error_of(&t.get("/v1/nothing"), 404);
    assert!(msg.contains("/v1/nothing"), "{msg}");
    assert_eq!(t.get("/v1/completions").status, 405);
}

#[test]
fn health_is_503_until_the_model_is_ready() {
    let t = start(Opts {
        ready: false,
        ..Opts::default()
    });
    let h = t.get("/health");
    assert_eq!(h.status, 503);
    assert!(h.header("retry-after").is_some());
    let r = t.post("/v1/completions", &json!({"prompt": "a"}));
    error_of(&r, 503);
    assert!(
        t.get("/metrics").status == 200,
        "metrics answer while loading"
    );
    t.server
        .set_ready(Arc::clone(&t.service), t.info.clone())
        .expect("ready");
    assert_eq!(t.get("/health").status, 200);
    let r = t.post("/v1/completions", &json!({"prompt": "ab", "max_tokens": 2}));
    assert_eq!(r.status, 200);
}

#[test]
fn completions_text_and_token_ids() {
    let t = start(Opts::default());
    // Prompt "<s> ▁ a b c": the echo is "▁ a b c ▁ ...", the first space kept (the prompt is
    // the decoder's left context).
    let r = t.post(
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "abc", "max_tokens": 6, "temperature": 0}),
    );
    assert_eq!(r.status, 200);
    let j = r.json();
    assert_eq!(j["object"], "text_completion");
    assert_eq!(j["model"], MODEL);
    assert!(j["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(j["choices"][0]["text"], " abc a");
    assert_eq!(j["choices"][0]["finish_reason"], "length");
    assert_eq!(j["usage"]["prompt_tokens"], 5);
    assert_eq!(j["usage"]["completion_tokens"], 6);
    assert_eq!(j["usage"]["total_tokens"], 11);
    assert_eq!(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    // Token ids (one list, and a list of one list).
    let ids = t.tokens("xyz");
    for prompt in [json!(ids), json!([ids])] {
        let r = t.post(
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 3}),
        );
        assert_eq!(r.json()["choices"][0]["text"], " xy", "{prompt}");
    }
    // The default max_tokens is the rest of the context.
    let r = t.post("/v1/completions", &json!({"prompt": "q", "stop": "q q q"}));
    assert_eq!(r.json()["choices"][0]["finish_reason"], "stop");
    // An end-of-sequence id stops (its text is not sent) unless ignore_eos.
    let mut ids = t.tokens("ab");
    ids.push(EOS);
    let r = t.post("/v1/completions", &json!({"prompt": ids, "max_tokens": 10}));
    let j = r.json();
    assert_eq!(j["choices"][0]["text"], " ab");
    assert_eq!(j["choices"][0]["finish_reason"], "stop");
    assert_eq!(j["usage"]["completion_tokens"], 4);
    let r = t.post(
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 6, "ignore_eos": true}),
    );
    assert_eq!(r.json()["choices"][0]["finish_reason"], "length");
    // stop_token_ids: "b" stops.
    let b = t.tokens("b")[2];
    let r = t.post(
        "/v1/completions",
        &json!({"prompt": "abc", "max_tokens": 10, "stop_token_ids": [b]}),
    );
    let j = r.json();
    assert_eq!(
        (
            j["choices"][0]["text"].clone(),
            j["choices"][0]["finish_reason"].clone()
        ),
        (json!(" a"), json!("stop"))
    );
}

#[test]
fn streaming_completions_and_include_usage() {
    let t = start(Opts::default());
    let body = json!({"prompt": "hello", "max_tokens": 9, "stream": true,
                      "stream_options": {"include_usage": true}});
    let (text, finish, usage) = streamed(&t.post("/v1/completions", &body), false, true);
    assert_eq!(text, " hello he");
    assert_eq!(finish, "length");
    let usage = usage.expect("usage");
    assert_eq!(usage["prompt_tokens"], 7);
    assert_eq!(usage["completion_tokens"], 9);
    assert_eq!(usage["total_tokens"], 16);
    // The same text without streaming, and no usage chunk without include_usage.
    let plain = t.post(
        "/v1/completions",
        &json!({"prompt": "hello", "max_tokens": 9}),
    );
    assert_eq!(plain.json()["choices"][0]["text"], text);
    let body = json!({"prompt": "hello", "max_tokens": 9, "stream": true});
    let (text2, _, usage) = streamed(&t.post("/v1/completions", &body), false, false);
    assert_eq!((text2, usage), (text, None));
}

#[test]
fn logprobs_in_completions_and_chat_streamed_or_not() {
    // The mock gives every token -0.5 and its next ids -2, -3, ... as alternatives: each
    // generated token gets one entry, in each endpoint's shape, streamed or not.
    let t = start(Opts::default());
    let r = t.post(
        "/v1/completions",
        &json!({"prompt": "abc", "max_tokens": 6, "logprobs": 2}),
    );
    let j = r.json();
    let lp = &j["choices"][0]["logprobs"];
    assert_eq!(lp["token_logprobs"], json!(vec![-0.5; 6]), "{j}");
    assert_eq!(lp["tokens"].as_array().map(Vec::len), Some(6));
    let tops = lp["top_logprobs"].as_array().expect("top_logprobs");
    assert_eq!(tops.len(), 6);
    for top in tops {
        let m = top.as_object().expect("a map");
        assert!(!m.is_empty() && m.len() <= 2, "{top}");
        assert!(m.values().any(|v| v == &json!(-0.5)), "{top}");
    }
    let offsets: Vec<u64> = serde_json::from_value(lp["text_offset"].clone()).unwrap();
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{offsets:?}");
    // Without `logprobs`: null.
    let r = t.post(
        "/v1/completions",
        &json!({"prompt": "abc", "max_tokens": 2}),
    );
    assert_eq!(r.json()["choices"][0]["logprobs"], Value::Null);

    let messages = json!([{"role": "user", "content": "hi"}]);
    let r = t.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 12, "logprobs": true, "top_logprobs": 2}),
    );
    let j = r.json();
    let content = j["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("content")
        .clone();
    assert_eq!(content.len(), 12, "{j}");
    for c in &content {
        assert_eq!(c["logprob"], -0.5);
        let token = c["token"].as_str().expect("token");
        assert_eq!(c["bytes"], json!(token.as_bytes()));
        let top = c["top_logprobs"].as_array().expect("top");
        assert_eq!(top.len(), 2);
        assert_eq!(
            (&top[0]["logprob"], &top[1]["logprob"]),
            (&json!(-0.5), &json!(-2.0))
        );
    }
    // Streamed: the chunks' entries add up to one per token, in the same order.
    let body = json!({"messages": messages, "max_tokens": 12, "logprobs": true, "stream": true});
    let r = t.post("/v1/chat/completions", &body);
    let mut streamed_tokens = vec![];
    for e in r.events().iter().filter(|e| e.as_str() != "[DONE]") {
        let c: Value = serde_json::from_str(e).expect("chunk");
        if let Some(list) = c["choices"][0]["logprobs"]["content"].as_array() {
            for x in list {
                assert_eq!(x["top_logprobs"], json!([]));
                streamed_tokens.push(x["token"].clone());
            }
        }
    }
    let want: Vec<Value> = content.iter().map(|c| c["token"].clone()).collect();
    assert_eq!(streamed_tokens, want);
}

#[test]
fn chat_completions_streaming_and_not() {
    let t = start(Opts::default());
    let messages = json!([{"role": "system", "content": "be brief"},
                          {"role": "user", "content": [{"type": "text", "text": "hi"}]}]);
    // The rendered prompt is "<s>system: be brief\nuser: hi\nassistant:", one BOS.
    let tok = t.post("/tokenize", &json!({"messages": messages}));
    let ids: Vec<u64> = serde_json::from_value(tok.json()["tokens"].clone()).unwrap();
    assert_eq!(ids[0], u64::from(BOS));
    assert!(
        ids[1..].iter().all(|&i| i != u64::from(BOS)),
        "a double BOS"
    );
    let r = t.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "max_completion_tokens": 12}),
    );
    let j = r.json();
    assert_eq!(j["object"], "chat.completion");
    assert!(j["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(j["choices"][0]["message"]["role"], "assistant");
    assert_eq!(j["choices"][0]["message"]["content"], " system: be ");
    assert_eq!(j["choices"][0]["finish_reason"], "length");
    assert_eq!(j["usage"]["prompt_tokens"], ids.len());
    let body = json!({"messages": messages, "max_tokens": 12, "stream": true,
                      "stream_options": {"include_usage": true}});
    let (text, finish, usage) = streamed(&t.post("/v1/chat/completions", &body), true, true);
    assert_eq!((text.as_str(), finish.as_str()), (" system: be ", "length"));
    assert_eq!(usage.expect("usage")["completion_tokens"], 12);
}

#[test]
fn a_model_without_a_chat_template_refuses_chat() {
    let t = start(Opts {
        chat_template: false,
        ..Opts::default()
    });
    let r = t.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    );
    let (param, msg) = error_of(&r, 400);
    assert_eq!(param, "messages");
    assert!(msg.contains("no chat template"), "{msg}");
}

#[test]
fn a_stop_string_split_across_tokens_is_not_sent() {
    let t = start(Opts::default());
    // Every character is a token: "STOP" comes as four tokens.
    for stream in [false, true] {
        let body = json!({"prompt": "xy STOP z", "max_tokens": 30, "stop": ["OPQ", "STOP"],
                          "stream": stream, "stream_options": {"include_usage": true}});
        let r = t.post("/v1/completions", &body);
        let (text, finish, usage) = if stream {
            streamed(&r, false, true)
        } else {
            let j = r.json();
            (
                j["choices"][0]["text"].as_str().unwrap().to_string(),
                j["choices"][0]["finish_reason"]
                    .as_str()
                    .unwrap()
                    .to_string(),
                Some(j["usage"].clone()),
            )
        };
        assert_eq!(text, " xy ", "stream {stream}");
        assert_eq!(finish, "stop");
        // "▁ x y ▁ S T O P": the token that completed the stop string is the last counted.
        assert_eq!(usage.expect("usage")["completion_tokens"], 8);
    }
    // The engine's request ended at the stop string.
    t.wait_until("the aborts", |s| s.stats().active == 0);
}

#[test]
fn a_character_split_across_tokens_is_held_back() {
    let t = start(Opts::default());
    // "€" is not in the vocabulary: three byte tokens. "😀" is four.
    let ids = t.tokens("a€b😀");
    assert_eq!(ids.len(), 2 + 1 + 3 + 1 + 4);
    let body = json!({"prompt": "a€b😀", "max_tokens": 20, "stream": true});
    let (text, _, _) = streamed(&t.post("/v1/completions", &body), false, false);
    assert_eq!(text, " a€b😀 a€b😀");
    // A stop string made of a multi-byte character.
    let body = json!({"prompt": "a€b😀", "max_tokens": 20, "stop": "😀 a€", "stream": true});
    let chat = json!({"messages": [{"role": "user", "content": "é"}], "max_tokens": 12,
                      "stream": true});
    let (text, finish, _) = streamed(&t.post("/v1/chat/completions", &chat), true, false);
    assert_eq!((text.as_str(), finish.as_str()), (" user: é\nas", "length"));
    let (text, finish, _) = streamed(&t.post("/v1/completions", &body), false, false);
    assert_eq!((text.as_str(), finish.as_str()), (" a€b", "stop"));
}

#[test]
fn validation_errors_name_the_field() {
    let t = start(Opts::default());
    let long: Vec<u32> = vec![300; CONTEXT];
    let cases: Vec<(Value, &str)> = vec![
        (json!({"prompt": "a", "max_tokens": -1}), "max_tokens"),
        (json!({"prompt": "a", "max_tokens": "5"}), "max_tokens"),
        (
            json!({"prompt": "a", "max_tokens": 1u64 << 40}),
            "max_tokens",
        ),
        (json!({"prompt": "a", "max_tokens": CONTEXT}), "max_tokens"),
        (json!({"prompt": "a", "temperature": -0.5}), "temperature"),
        (json!({"prompt": "a", "top_p": 1.5}), "top_p"),
        (json!({"prompt": "a", "n": 0}), "n"),
        (json!({"prompt": "a", "n": 17}), "n"),
        (json!({"prompt": "a", "logprobs": 21}), "logprobs"),
        (
            json!({"prompt": "a", "stop": ["1", "2", "3", "4", "5"]}),
            "stop",
        ),
        (
            json!({"prompt": "a", "stop_token_ids": [VOCAB]}),
            "stop_token_ids[0]",
        ),
        (
            json!({"prompt": "a", "min_tokens": 9, "max_tokens": 4}),
            "min_tokens",
        ),
        (json!({"prompt": [5, VOCAB + 1]}), "prompt[1]"),
        (json!({"prompt": []}), "prompt"),
        (json!({"prompt": long}), "prompt"),
        (json!({"prompt": ["a", "b"]}), "prompt"),
        (json!({"max_tokens": 1}), "prompt"),
    ];
    for (body, field) in cases {
        let (param, msg) = error_of(&t.post("/v1/completions", &body), 400);
        assert_eq!(param, field, "{body}: {msg}");
        assert!(msg.starts_with(field), "{body}: {msg}");
    }
    let chat = vec![
        (json!({"messages": "hi"}), "messages"),
        (
            json!({"messages": [{"role": "user", "content": "a"}], "logprobs": "yes"}),
            "logprobs",
        ),
        (
            json!({"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2}),
            "top_logprobs",
        ),
        (json!({"messages": [{"role": 1}]}), "messages[0].role"),
    ];
    for (body, field) in chat {
        let (param, msg) = error_of(&t.post("/v1/chat/completions", &body), 400);
        assert_eq!(param, field, "{body}: {msg}");
    }
    // Not JSON, not UTF-8, not an object; the wrong model.
    for raw in [&b"{\"prompt\": "[..], b"\xff\xfe{}", b"[1, 2]"] {
        let r = t.call("POST", "/v1/completions", &[], raw);
        error_of(&r, 400);
    }
    let (param, _) = error_of(
        &t.post("/v1/completions", &json!({"model": "gpt-4", "prompt": "a"})),
        404,
    );
    assert_eq!(param, "model");
    // Unknown fields are ignored, and after all that the server still serves.
    let r = t.post(
        "/v1/completions",
        &json!({"prompt": "ok", "max_tokens": 2, "user": "u", "some_extension": {"x": 1}}),
    );
    assert_eq!(r.json()["choices"][0]["text"], " o");
    assert_eq!(
        t.service.stats().submitted,
        1,
        "a refused request reached the engine"
    );
}

#[test]
fn a_body_over_the_limit_is_413() {
    let t = start(Opts {
        max_body_bytes: 4096,
        ..Opts::default()
    });
    let big = "a".repeat(8192);
    let r = t.post("/v1/completions", &json!({ "prompt": big }));
    error_of(&r, 413);
    // A 1 MB prompt that fits the body limit but not the context names the prompt.
    let t = start(Opts {
        max_body_bytes: 2 << 20,
        ..Opts::default()
    });
    let r = t.post(
        "/v1/completions",
        &json!({ "prompt": "b ".repeat(500_000) }),
    );
    let (param, msg) = error_of(&r, 400);
    assert_eq!(param, "prompt");
    assert!(msg.contains("context"), "{msg}");
}

#[test]
fn the_api_key_is_required_where_it_should_be() {
    let t = start(Opts {
        api_key: Some("sekret".into()),
        ..Opts::default()
    });
    let body = json!({"prompt": "a", "max_tokens": 1}).to_string();
    for headers in [
        vec![],
        vec![("Authorization", "Bearer wrong")],
        vec![("Authorization", "sekret")],
    ] {
        for path in ["/v1/completions", "/tokenize"] {
            let r = t.call("POST", path, &headers, body.as_bytes());
            let (_, msg) = error_of(&r, 401);
            assert!(msg.contains("API key"), "{msg}");
        }
        let r = t.call("GET", "/v1/models", &headers, b"");
        error_of(&r, 401);
    }
    let ok = [("Authorization", "Bearer sekret")];
    let r = t.call("POST", "/v1/completions", &ok, body.as_bytes());
    assert_eq!(r.status, 200);
    assert_eq!(t.call("GET", "/v1/models", &ok, b"").status, 200);
    // Probes and scrapers need no key.
    assert_eq!(t.get("/health").status, 200);
    assert_eq!(t.get("/metrics").status, 200);
}

#[test]
fn a_client_that_goes_away_aborts_its_request() {
    let t = start(Opts::default());
    t.ctl.delay_us.store(2000, Ordering::Relaxed);
    // Streaming: read the first content chunk, then hang up.
    let body = json!({"prompt": "abcdef", "max_tokens": 3000, "stream": true}).to_string();
    let mut s = connect(t.addr, WAIT);
    s.write_all(&raw_request(
        "POST",
        "/v1/completions",
        &[],
        body.as_bytes(),
    ))
    .expect("send");
    let mut seen = vec![];
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\"text\"") {
        let n = s.read(&mut buf).expect("read");
        assert!(n > 0, "closed early");
        seen.extend_from_slice(&buf[..n]);
    }
    // The stats snapshot is refreshed after the step that sent the chunk.
    t.wait_until("the request counted active", |s| s.stats().active == 1);
    drop(s);
    t.wait_until("the streaming abort", |s| s.stats().active == 0);
    let st = t.service.stats();
    assert_eq!(st.ended, 1);
    assert_eq!(st.backend.running + st.backend.waiting, 0);
    // Not streaming, still waiting in the queue: hanging up aborts it too.
    t.ctl.hold.store(true, Ordering::Relaxed);
    let body = json!({"prompt": "abcdef", "max_tokens": 3000}).to_string();
    let mut s = connect(t.addr, WAIT);
    s.write_all(&raw_request(
        "POST",
        "/v1/completions",
        &[],
        body.as_bytes(),
    ))
    .expect("send");
    t.wait_until("the request to queue", |s| s.stats().active == 1);
    drop(s);
    t.wait_until("the queued abort", |s| s.stats().active == 0);
    t.ctl.hold.store(false, Ordering::Relaxed);
    let m = t.get("/metrics").text();
    assert!(
        m.contains("fl_request_failure_total{reason=\"disconnected\"} 2"),
        "{m}"
    );
}

#[test]
fn a_full_queue_answers_503_with_retry_after() {
    let t = start(Opts {
        max_waiting: 2,
        ..Opts::default()
    });
    t.ctl.hold.store(true, Ordering::Relaxed);
    let body = json!({"prompt": "abc", "max_tokens": 4, "stream": true}).to_string();
    let mut waiting: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = connect(t.addr, WAIT);
            s.write_all(&raw_request(
                "POST",
                "/v1/completions",
                &[],
                body.as_bytes(),
            ))
            .expect("send");
            s
        })
        .collect();
    t.wait_until("two queued requests", |s| s.stats().active == 2);
    let r = t.post(
        "/v1/completions",
        &json!({"prompt": "abc", "max_tokens": 4}),
    );
    let (_, msg) = error_of(&r, 503);
    assert!(msg.contains("capacity"), "{msg}");
    assert_eq!(r.header("retry-after"), Some("1"));
    // Once they run, the two waiting ones complete normally.
    t.ctl.hold.store(false, Ordering::Relaxed);
    for s in &mut waiting {
        let mut raw = vec![];
        s.read_to_end(&mut raw).expect("read");
        let (text, _, _) = streamed(&parse_response(&raw), false, false);
        assert_eq!(text, " abc");
    }
    let ok = t.post(
        "/v1/completions",
        &json!({"prompt": "abc", "max_tokens": 4}),
    );
    assert_eq!(ok.status, 200);
}

#[test]
fn metrics_are_prometheus_text() {
    let t = start(Opts::default());
    for _ in 0..3 {
        let r = t.post(
            "/v1/completions",
            &json!({"prompt": "abc", "max_tokens": 5, "stream": true}),
        );
        assert_eq!(r.status, 200);
    }
    error_of(&t.post("/v1/completions", &json!({"prompt": 5})), 400);
    let r = t.get("/metrics");
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    let text = r.text();
    let mut types = HashMap::new();
    let mut values: HashMap<String, f64> = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            types.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("series value");
        let name = series.split('{').next().unwrap();
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{line}"
        );
        if let Some(labels) = series.strip_prefix(name) {
            if !labels.is_empty() {
                assert!(labels.starts_with('{') && labels.ends_with('}'), "{line}");
            }
        }
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|b| types.contains_key(*b)))
            .unwrap_or(name);
        assert!(types.contains_key(base), "no TYPE before {line}");
        values.insert(series.to_string(), value.parse().expect("a number"));
    }
    assert_eq!(values["fl_generation_tokens_total"], 15.0);
    assert_eq!(values["fl_prompt_tokens_total"], 15.0);
    assert_eq!(
        values["fl_request_success_total{finished_reason=\"length\"}"],
        3.0
    );
    assert_eq!(values["fl_request_failure_total{reason=\"invalid\"}"], 1.0);
    assert_eq!(values["fl_time_to_first_token_seconds_count"], 3.0);
    assert_eq!(values["fl_inter_token_latency_seconds_count"], 12.0);
    assert_eq!(
        values["fl_time_to_first_token_seconds_bucket{le=\"+Inf\"}"],
        3.0
    );
    // Each request's prompt ran in a prefill step, its other 4 tokens in steps of either
    // kind; the mock answers in far less than 5 s.
    let steps = |kind: &str, what: &str| {
        values[&format!("fl_step_duration_seconds_{what}{{kind=\"{kind}\"}}")]
    };
    assert!(steps("prefill", "count") >= 1.0);
    assert!(
        steps("prefill", "count") + steps("decode", "count") <= values["fl_engine_steps_total"]
    );
    for kind in ["decode", "prefill"] {
        assert_eq!(
            values[&format!("fl_step_duration_seconds_bucket{{kind=\"{kind}\",le=\"1\"}}")],
            steps(kind, "count")
        );
    }
    for g in [
        "fl_num_requests_running",
        "fl_num_requests_waiting",
        "fl_kv_cache_usage_perc",
    ] {
        assert!(values.contains_key(g), "{g}");
    }
}

#[test]
fn tokenize_and_detokenize_round_trip() {
    let t = start(Opts::default());
    let text = "héllo wörld € 😀!";
    let r = t.post("/tokenize", &json!({"prompt": text}));
    let j = r.json();
    let ids: Vec<u32> = serde_json::from_value(j["tokens"].clone()).expect("ids");
    assert_eq!(ids, t.tokens(text));
    assert_eq!(j["count"], ids.len());
    assert_eq!(j["max_model_len"], CONTEXT);
    let back = t.post("/detokenize", &json!({ "tokens": ids }));
    assert_eq!(back.json()["prompt"], text);
    let r = t.post(
        "/tokenize",
        &json!({"prompt": text, "add_special_tokens": false}),
    );
    assert_eq!(r.json()["tokens"][0], json!(ids[1]));
    let (param, _) = error_of(&t.post("/detokenize", &json!({"tokens": [1, 99999]})), 400);
    assert_eq!(param, "tokens[1]");
    let (param, _) = error_of(&t.post("/tokenize", &json!({})), 400);
    assert_eq!(param, "prompt");
}

#[test]
fn many_concurrent_streams_each_get_their_own_text() {
    let t = start(Opts::default());
    t.ctl.delay_us.store(200, Ordering::Relaxed);
    let words = [
        "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
    ];
    std::thread::scope(|sc| {
        let handles: Vec<_> = (0..32)
            .map(|i| {
                let t = &t;
                let w = words[i % words.len()];
                sc.spawn(move || {
                    let body =
                        json!({"prompt": w, "max_tokens": w.len() + 1, "stream": i % 2 == 0});
                    let r = t.post("/v1/completions", &body);
                    let text = if i % 2 == 0 {
                        streamed(&r, false, false).0
                    } else {
                        r.json()["choices"][0]["text"].as_str().unwrap().to_string()
                    };
                    assert_eq!(text, format!(" {w}"), "request {i}");
                })
            })
            .collect();
        for h in handles {
            h.join().expect("client thread");
        }
    });
    t.wait_until("every request ended", |s| s.stats().ended == 32);
}

#[test]
fn a_shutdown_ends_open_streams_with_an_error_event() {
    let t = start(Opts::default());
    t.ctl.delay_us.store(2000, Ordering::Relaxed);
    let body = json!({"prompt": "abc", "max_tokens": 3000, "stream": true}).to_string();
    let mut s = connect(t.addr, WAIT);
    s.write_all(&raw_request(
        "POST",
        "/v1/completions",
        &[],
        body.as_bytes(),
    ))
    .expect("send");
    t.wait_until("the request to run", |s| s.stats().backend.running == 1);
    t.service.shutdown().expect("shutdown");
    let mut raw = vec![];
    s.read_to_end(&mut raw).expect("read");
    let r = parse_response(&raw);
    assert_eq!(r.status, 200);
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let err: Value = serde_json::from_str(&events[events.len() - 2]).expect("JSON");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("shutting down"),
        "{err}"
    );
    // New requests are refused with 503, and /health says so.
    error_of(&t.post("/v1/completions", &json!({"prompt": "a"})), 503);
    assert_eq!(t.get("/health").status, 503);
}

#[test]
fn idle_connections_do_not_block_others() {
    let t = start(Opts::default());
    // Connections that never send a request hold no thread and no engine slot.
    let idle: Vec<TcpStream> = (0..256).map(|_| connect(t.addr, WAIT)).collect();
    let r = t.post(
        "/v1/completions",
        &json!({"prompt": "abc", "max_tokens": 3}),
    );
    assert_eq!(r.json()["choices"][0]["text"], " ab");
    drop(idle);
}

/// The per-choice pieces of a streamed response with `n` choices: each choice's text and
/// finish reason, and the usage chunk; checks the framing (chat: one role chunk per choice
/// first; one finish chunk per choice, nothing after it; usage once after all; `[DONE]`
/// once, last).
fn streamed_n(r: &Resp, chat: bool, n: usize) -> (Vec<(String, String)>, Value) {
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    let events = r.events();
    assert_eq!(events.iter().filter(|e| *e == "[DONE]").count(), 1);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("chunk JSON"))
        .collect();
    let (usage, body) = chunks.split_last().expect("a usage chunk");
    assert_eq!(usage["choices"], json!([]), "usage comes last: {usage}");
    let mut out = vec![(String::new(), String::new()); n];
    let mut role = vec![false; n];
    for c in body {
        assert_eq!(c["choices"].as_array().map(Vec::len), Some(1), "{c}");
        assert!(c["usage"].is_null(), "{c}");
        let choice = &c["choices"][0];
        let i = choice["index"].as_u64().expect("index") as usize;
        assert!(i < n, "{c}");
        assert!(
            out[i].1.is_empty(),
            "a chunk after choice {i} finished: {c}"
        );
        if chat && !role[i] {
            assert_eq!(
                choice["delta"],
                json!({"role": "assistant", "content": ""}),
                "choice {i}'s first chunk carries the role"
            );
            role[i] = true;
            continue;
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            out[i].1 = f.to_string();
            continue;
        }
        let piece = if chat {
            choice["delta"]["content"].as_str()
        } else {
            choice["text"].as_str()
        };
        out[i].0 += piece.expect("text");
    }
    for (i, (_, f)) in out.iter().enumerate() {
        assert!(!f.is_empty(), "choice {i} has no finish chunk");
    }
    (out, usage["usage"].clone())
}

#[test]
fn n_choices_non_streaming() {
    let t = start(Opts::default());
    // Choice i samples with seed 40 + i; the mock echoes `?` as the seed's last digit. A stop
    // string per choice: only choice 1's text ("1") contains it.
    let body = json!({"prompt": "a?b", "max_tokens": 6, "n": 3, "seed": 40, "stop": "a1"});
    let j = t.post("/v1/completions", &body).json();
    let choices = j["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3, "{j}");
    let got: Vec<(u64, &str, &str)> = choices
        .iter()
        .map(|c| {
            (
                c["index"].as_u64().unwrap(),
                c["text"].as_str().unwrap(),
                c["finish_reason"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (0, " a0b a", "length"),
            (1, " ", "stop"),
            (2, " a2b a", "length")
        ]
    );
    // The prompt once, completion tokens summed over choices (choice 1's up to its stop).
    let u = &j["usage"];
    assert_eq!(u["prompt_tokens"], 5);
    let stopped = u["completion_tokens"].as_u64().unwrap() - 12;
    assert!((2..=6).contains(&stopped), "{u}");
    assert_eq!(u["total_tokens"], 5 + 12 + stopped);
    assert!(
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            <= 5
    );
    // Chat: the same shape; greedy choices are identical.
    let body = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "n": 2,
                      "temperature": 0});
    let j = t.post("/v1/chat/completions", &body).json();
    let choices = j["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 2, "{j}");
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["message"]["role"], "assistant");
        assert_eq!(c["finish_reason"], "length");
        assert_eq!(c["message"]["content"], choices[0]["message"]["content"]);
    }
    assert_eq!(j["usage"]["completion_tokens"], 8);
    // Each choice is a request in the counters.
    let m = t.get("/metrics").text();
    assert!(
        m.contains("fl_request_success_total{finished_reason=\"length\"} 4"),
        "{m}"
    );
    assert!(
        m.contains("fl_request_success_total{finished_reason=\"stop\"} 1"),
        "{m}"
    );
}

#[test]
fn n_choices_streaming() {
    let t = start(Opts::default());
    let body = json!({"prompt": "a?b", "max_tokens": 6, "n": 3, "seed": 7, "stream": true,
                      "stream_options": {"include_usage": true}});
    let (out, usage) = streamed_n(&t.post("/v1/completions", &body), false, 3);
    let want = [" a7b a", " a8b a", " a9b a"];
    for (i, (text, finish)) in out.iter().enumerate() {
        assert_eq!((text.as_str(), finish.as_str()), (want[i], "length"));
    }
    assert_eq!(usage["prompt_tokens"], 5);
    assert_eq!(usage["completion_tokens"], 18);
    assert_eq!(usage["total_tokens"], 23);
    let body = json!({"messages": [{"role": "user", "content": "?"}], "max_tokens": 8, "n": 3,
                      "seed": 20, "stream": true, "stream_options": {"include_usage": true}});
    let (out, usage) = streamed_n(&t.post("/v1/chat/completions", &body), true, 3);
    for (i, (text, finish)) in out.iter().enumerate() {
        assert_eq!(finish, "length");
        // The echo of "user: ?": the seed's digit differs per choice.
        assert_eq!(text, &format!(" user: {i}"), "choice {i}");
    }
    assert_eq!(usage["completion_tokens"], 24);
}

#[test]
fn a_client_that_goes_away_aborts_all_its_choices() {
    let t = start(Opts::default());
    t.ctl.delay_us.store(2000, Ordering::Relaxed);
    let body = json!({"prompt": "abcdef", "max_tokens": 3000, "n": 2, "stream": true}).to_string();
    let mut s = connect(t.addr, WAIT);
    s.write_all(&raw_request(
        "POST",
        "/v1/completions",
        &[],
        body.as_bytes(),
    ))
    .expect("send");
    let mut seen = vec![];
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\"index\":1") {
        let n = s.read(&mut buf).expect("read");
        assert!(n > 0, "closed early");
        seen.extend_from_slice(&buf[..n]);
    }
    t.wait_until("both choices active", |s| s.stats().active == 2);
    drop(s);
    t.wait_until("the abort of both", |s| s.stats().active == 0);
    let st = t.service.stats();
    assert_eq!(st.ended, 2);
    assert_eq!(st.backend.running + st.backend.waiting, 0);
    let m = t.get("/metrics").text();
    assert!(
        m.contains("fl_request_failure_total{reason=\"disconnected\"} 2"),
        "{m}"
    );
}

// ---------------------------------------------------------------- beam search

/// (index, text, finish reason) of each choice of a non-streaming response.
fn choices_of(j: &Value, chat: bool) -> Vec<(u64, String, String)> {
    j["choices"]
        .as_array()
        .unwrap_or_else(|| panic!("no choices: {j}"))
        .iter()
        .map(|c| {
            let text = if chat {
                &c["message"]["content"]
            } else {
                &c["text"]
            };
            (
                c["index"].as_u64().expect("index"),
                text.as_str().expect("text").to_string(),
                c["finish_reason"]
                    .as_str()
                    .expect("finish_reason")
                    .to_string(),
            )
        })
        .collect()
}

#[test]
fn beam_search_returns_n_hypotheses_best_first() {
    let t = start(Opts::default());
    // Prompt "<s> ▁ a b": hypothesis i is "i ▁ a b" (+ EOS for even i) or "i ▁ a b ▁ a".
    let body = json!({"prompt": "ab", "max_tokens": 6, "use_beam_search": true, "n": 3,
                      "best_of": 4, "length_penalty": 0.5, "early_stopping": "never",
                      "temperature": 0.7, "top_k": 5, "repetition_penalty": 1.2});
    let r = t.post("/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let j = r.json();
    assert_eq!(j["object"], "text_completion");
    let s = |x: &str| x.to_string();
    assert_eq!(
        choices_of(&j, false),
        vec![
            (0, s("0 ab"), s("stop")),
            (1, s("1 ab a"), s("length")),
            (2, s("2 ab"), s("stop")),
        ]
    );
    // Completion tokens: the returned choices' lengths (end ids included), as vLLM counts.
    assert_eq!(j["usage"]["prompt_tokens"], 4);
    assert_eq!(j["usage"]["completion_tokens"], 5 + 6 + 5);
    assert_eq!(j["usage"]["total_tokens"], 4 + 16);
    // The engine got the beam fields; sampling's penalties go through, temperature is moot.
    let (beam, sampling) = t
        .ctl
        .last_beam
        .lock()
        .unwrap()
        .clone()
        .expect("a beam request");
    let want = BeamParams {
        num_beams: 4,
        length_penalty: 0.5,
        early_stopping: EarlyStopping::Never,
        num_return_sequences: 3,
        max_new_tokens: 6,
        eos_token_ids: vec![EOS],
    };
    assert_eq!(beam, want);
    assert_eq!(sampling.repetition_penalty, 1.2);
    // Defaults: n = 1, best_of = n; stop ids end hypotheses (EOS too unless ignore_eos); a
    // stop string cuts a hypothesis' text.
    let b = t.tokens("b")[2];
    let body = json!({"prompt": "ab", "max_tokens": 5, "use_beam_search": true,
                      "stop_token_ids": [b, b], "ignore_eos": true});
    let j = t.post("/v1/completions", &body).json();
    assert_eq!(choices_of(&j, false), vec![(0, s("0 a"), s("stop"))]);
    let (beam, _) = t.ctl.last_beam.lock().unwrap().clone().unwrap();
    assert_eq!(
        (
            beam.num_beams,
            beam.num_return_sequences,
            beam.eos_token_ids
        ),
        (1, 1, vec![b])
    );
    assert_eq!(beam.early_stopping, EarlyStopping::False);
    let body = json!({"prompt": "ab", "max_tokens": 6, "use_beam_search": true, "n": 2,
                      "stop": "b a"});
    let j = t.post("/v1/completions", &body).json();
    assert_eq!(
        choices_of(&j, false),
        vec![(0, s("0 ab"), s("stop")), (1, s("1 a"), s("stop"))]
    );
    // Chat: n choices with the assistant role.
    let body = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                      "use_beam_search": true, "n": 2, "early_stopping": true});
    let j = t.post("/v1/chat/completions", &body).json();
    assert_eq!(j["object"], "chat.completion");
    let got = choices_of(&j, true);
    assert_eq!(got.len(), 2, "{j}");
    assert_eq!((got[0].2.as_str(), got[1].2.as_str()), ("stop", "length"));
    assert!(
        got[0].1.starts_with('0') && got[1].1.starts_with('1'),
        "{got:?}"
    );
    for c in j["choices"].as_array().unwrap() {
        assert_eq!(c["message"]["role"], "assistant");
    }
    let (beam, _) = t.ctl.last_beam.lock().unwrap().clone().unwrap();
    assert_eq!(beam.early_stopping, EarlyStopping::True);
    // One request each in the counters, and no token latencies.
    let m = t.get("/metrics").text();
    assert!(
        m.contains("fl_request_success_total{finished_reason=\"stop\"} 4"),
        "{m}"
    );
    assert!(m.contains("fl_time_to_first_token_seconds_count 0"), "{m}");
    assert!(m.contains("fl_inter_token_latency_seconds_count 0"), "{m}");
    assert!(m.contains("fl_e2e_request_latency_seconds_count 4"), "{m}");
}

#[test]
fn beam_search_refusals_name_the_field() {
    let t = start(Opts::default());
    let cases: Vec<(Value, &str)> = vec![
        (json!({"prompt": "a", "best_of": 2}), "best_of"),
        (
            json!({"prompt": "a", "use_beam_search": true, "stream": true}),
            "stream",
        ),
        (
            json!({"prompt": "a", "use_beam_search": true, "n": 3, "best_of": 2}),
            "n",
        ),
        (
            json!({"prompt": "a", "use_beam_search": true, "best_of": 0}),
            "best_of",
        ),
        // Wider than the server's max_num_seqs (8): the engine's refusal.
        (
            json!({"prompt": "a", "use_beam_search": true, "best_of": 9}),
            "best_of",
        ),
        (
            json!({"prompt": "a", "use_beam_search": true, "best_of": 1000}),
            "best_of",
        ),
        (
            json!({"prompt": "a", "use_beam_search": true, "early_stopping": "soon"}),
            "early_stopping",
        ),
        (
            json!({"prompt": "a", "use_beam_search": true, "length_penalty": "x"}),
            "length_penalty",
        ),
    ];
    for (body, field) in cases {
        let (param, msg) = error_of(&t.post("/v1/completions", &body), 400);
        assert_eq!(param, field, "{body}: {msg}");
        assert!(msg.starts_with(field), "{body}: {msg}");
    }
    let chat = json!({"messages": [{"role": "user", "content": "x"}], "use_beam_search": true,
                      "stream": true});
    let (param, _) = error_of(&t.post("/v1/chat/completions", &chat), 400);
    assert_eq!(param, "stream");
    let chat = json!({"messages": [{"role": "user", "content": "x"}], "best_of": 3});
    let (param, _) = error_of(&t.post("/v1/chat/completions", &chat), 400);
    assert_eq!(param, "best_of");
    assert_eq!(
        t.service.stats().submitted,
        0,
        "a refused request reached the engine"
    );
    // After all that the server still serves beams.
    let body = json!({"prompt": "ab", "max_tokens": 3, "use_beam_search": true});
    assert_eq!(t.post("/v1/completions", &body).status, 200);
}

#[test]
fn beam_search_without_max_tokens_fits_the_kv_cache() {
    let t = start(Opts {
        kv_blocks: 64,
        ..Opts::default()
    });
    // "<s> ▁ a b": 4 tokens, one partial 16-token block per beam. 4 beams x 16 blocks of 64:
    // each beam's 4 + 253 - 1 tokens fill 16 blocks exactly.
    let body = json!({"prompt": "ab", "use_beam_search": true, "best_of": 4});
    assert_eq!(t.post("/v1/completions", &body).status, 200);
    let (beam, _) = t.ctl.last_beam.lock().unwrap().clone().unwrap();
    assert_eq!(beam.max_new_tokens, 253);
    // One beam: the single-sequence limit (the pool less the prompt).
    let body = json!({"prompt": "ab", "use_beam_search": true});
    assert_eq!(t.post("/v1/completions", &body).status, 200);
    let (beam, _) = t.ctl.last_beam.lock().unwrap().clone().unwrap();
    assert_eq!(beam.max_new_tokens, 64 * 16 - 4);
    // A prompt that leaves no room for the beams.
    let long = "x".repeat(64 * 16 - 40);
    let body = json!({"prompt": long, "use_beam_search": true, "best_of": 8});
    let (param, msg) = error_of(&t.post("/v1/completions", &body), 400);
    assert_eq!(param, "best_of", "{msg}");
}

/// The interpreter for bench/scripts' Python checks (`FL_PYTHON`, default python3).
fn python() -> String {
    std::env::var("FL_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Runs bench/scripts/`script` with `args` against the test server at `t`: it must exit 0
/// with a summary line and no FAIL (its output is printed, and shown on failure).
fn run_python_check(t: &TestServer, script: &str, args: &[&str]) {
    let path = format!(
        "{}/../../bench/scripts/{script}",
        env!("CARGO_MANIFEST_DIR")
    );
    let out = std::process::Command::new(python())
        .arg(&path)
        .args(["--base-url", &format!("http://{}", t.addr)])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {script}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("summary:") && !text.contains("FAIL"),
        "{text}"
    );
}

#[test]
fn openai_package_checks_pass_against_the_mock_server() {
    // bench/scripts/check_openai_client.py (the official `openai` package and curl) against
    // this mock-backed server: the response shapes as a real client parses them. Skipped
    // where python3 has no `openai` package (CI); the GPU machine runs the same script
    // against `fl serve`.
    let has_openai = std::process::Command::new(python())
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_openai {
        eprintln!(
            "skip openai_package_checks_pass_against_the_mock_server: no `openai` for {}",
            python()
        );
        return;
    }
    let t = start(Opts::default());
    // The mock's beams are not its greedy continuation (`hypotheses`).
    run_python_check(
        &t,
        "check_openai_client.py",
        &["--timeout", "20", "--skip", "one beam = greedy"],
    );
}

#[test]
fn misbehaving_clients_get_4xx_and_the_server_keeps_serving() {
    // bench/scripts/abuse_client.py (standard library only; the GPU machine runs it against
    // `fl serve` under load): malformed and mistyped bodies, a 1 MB prompt, clients that leave
    // mid-stream, 200 idle connections held meanwhile, and a good request after each round.
    if std::process::Command::new(python())
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!(
            "skip misbehaving_clients_get_4xx_and_the_server_keeps_serving: no {}",
            python()
        );
        return;
    }
    let t = start(Opts::default());
    run_python_check(
        &t,
        "abuse_client.py",
        &["--rounds", "2", "--hold", "200", "--max-seconds", "60"],
    );
    // The clients that left had their requests aborted: nothing is left active.
    t.wait_until("the aborts", |s| s.stats().active == 0);
}
