//! `fl_loadgen`: a load generator for OpenAI-compatible servers on this machine (`fl serve`,
//! llama.cpp's `llama-server`, vLLM), measured the way vLLM's `bench serve` measures.
//!
//! Requests stream (`"stream": true` with `stream_options.include_usage`) to `/v1/completions`
//! (prompts of token ids, or synthetic words with `--text`) or `/v1/chat/completions`
//! (`--chat`: synthetic words as one user message), each for `max_tokens` tokens with
//! `ignore_eos`. Arrivals and lengths are drawn as `fl_engine::trace::TraceSpec` draws them for
//! `fl bench --trace` (so one seed gives one trace in process and over HTTP): Poisson at
//! `--rate`, or all at once, in either case with at most `--concurrency` requests in flight
//! (closed loop when no rate is given). Targets are loopback only, and `--max-duration` bounds
//! the whole run: after it nothing is sent and requests in flight are cancelled.
//! `--send-duration` stops sending earlier and lets the requests in flight finish (a soak).
//! A request that fails at the connection level before any answer (refused, or closed or reset
//! before the response head) is sent again on a fresh connection, up to 3 attempts in all
//! (after 20 ms, then 100 ms, never past `--max-duration`); its TTFT and E2E count from the
//! first send, and the report counts `retried` requests and `retries`. HTTP errors and
//! failures mid-stream are not retried.
//!
//! Metrics, per vLLM's `benchmarks/serve.py` (percentiles by nearest rank, as
//! `fl_engine::trace::Percentiles` gives them to `fl bench`):
//! - TTFT: request sent -> first chunk carrying content (a role-only chunk does not count);
//! - E2E latency: request sent -> last content chunk;
//! - TPOT: (E2E - TTFT) / (output tokens - 1), one value per request of >= 2 output tokens;
//! - ITL: every gap between consecutive content chunks, pooled over requests;
//! - output tokens: the final usage chunk's `completion_tokens`, else the content chunk count;
//!   throughputs divide by the time from the first request sent to the last one finished.
//!
//! `--embeddings` loads an embedding server instead (`fl serve` with an encoder, or any
//! OpenAI-compatible `/v1/embeddings`): each request carries `--inputs-per-request` token-id
//! inputs of the drawn prompt length, is not streamed, and counts as one latency sample (E2E,
//! also reported as TTFT); the report adds inputs per second (sentences/s). A response must
//! hold one embedding per input, each a non-empty array, or the request counts as failed.
//!
//! `--save-result FILE` also writes, after the run, one JSON line per request sent (planned
//! lengths, send time, outcome, TTFT, ITL gaps, E2E, output tokens, retries); failing exits 1.
//!
//! ```text
//! fl serve --model DIR --port 8000 &
//! fl_loadgen --base-url http://127.0.0.1:8000 --num-prompts 512 --concurrency 64 \
//!     --prompt-lens 512 --output-lens 256
//! fl_loadgen --rate 8 --prompt-lens 64-2048 --output-lens 16-512 --shared-prefix 32 --json
//! fl_loadgen --embeddings --inputs-per-request 32 --prompt-lens 16-128 --concurrency 8 \
//!     --num-prompts 400 --vocab-size 30522
//! ```
//!
//! Against one warm server, change `--seed` between runs: the same seed sends the same prompts,
//! which the prefix cache then serves. Each request in flight holds one connection: for a
//! thousand, raise `ulimit -n` past that first. Exit status: 0 when every request succeeded,
//! 1 when any failed, was cancelled or was never sent, 2 when the run could not start.

use std::collections::BTreeMap;
use std::error::Error as StdError;
use std::fmt;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{header, Method, Request, Response, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::{sleep_until, timeout_at, Instant};

/// An SSE line (or a non-streamed body) longer than this fails the request.
const MAX_LINE_BYTES: usize = 8 << 20;
/// Error bodies and `/v1/models` are read up to this size.
const MAX_SMALL_BODY: usize = 1 << 20;
/// Input `j` of embeddings request `i` draws from stream `i * EMBED_STREAMS + j`.
const EMBED_STREAMS: u64 = 1 << 20;
/// Waits before the retries of a request that failed at the connection level: attempts in
/// all are one more than these.
const RETRY_BACKOFF: [Duration; 2] = [Duration::from_millis(20), Duration::from_millis(100)];
/// Token ids are drawn from `FIRST_ID..vocab`, past llama's `<unk>`, `<s>`, `</s>`.
const FIRST_ID: u32 = 3;
/// Words of `--text` / `--chat` prompts: common English words, one token each in LLaMA
/// tokenizers, so a prompt of N words is close to N tokens (the usage chunk has the count).
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "with", "as", "by", "at", "from",
    "that", "this", "it", "be", "are", "or", "an", "which", "one", "all", "their", "time", "new",
    "first", "people", "work", "water", "city", "house", "music", "light", "river", "world",
    "small", "early", "story", "game", "state", "north", "south", "paper", "line", "road",
    "school", "power", "field", "green", "black", "white", "long", "year", "day", "night", "book",
    "name", "place", "part", "hand", "side", "point",
];

#[derive(Parser, Debug)]
#[command(
    name = "fl_loadgen",
    about = "Streams OpenAI-API requests at a server on this machine and reports throughput, TTFT, TPOT, ITL and E2E latency as vLLM's `bench serve` does"
)]
struct Args {
    /// Server root on this machine: http://127.0.0.1:PORT, http://localhost:PORT, or ::1 in
    /// brackets (a trailing /v1 is accepted).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    base_url: String,
    /// Model name sent with every request; default: the first of GET /v1/models.
    #[arg(long)]
    model: Option<String>,
    /// POST /v1/chat/completions, the prompt as one user message of synthetic words.
    #[arg(long)]
    chat: bool,
    /// /v1/completions prompts of synthetic words instead of token-id lists.
    #[arg(long)]
    text: bool,
    /// POST /v1/embeddings (an embedding server): token-id inputs, not streamed; the output
    /// lengths are not used.
    #[arg(long, conflicts_with_all = ["chat", "text"])]
    embeddings: bool,
    /// With --embeddings: inputs (sentences) per request, each of the request's drawn length.
    #[arg(long, default_value_t = 1)]
    inputs_per_request: usize,
    /// Requests in the run.
    #[arg(long, default_value_t = 200)]
    num_prompts: usize,
    /// Prompt lengths in tokens (words with --text / --chat): `N` or `LO-HI` (uniform).
    #[arg(long, default_value = "512")]
    prompt_lens: String,
    /// max_tokens of each request (ignore_eos on): `N` or `LO-HI` (uniform).
    #[arg(long, default_value = "256")]
    output_lens: String,
    /// Every prompt starts with the same this many tokens (a shared system prompt); prompt
    /// lengths must be longer.
    #[arg(long, default_value_t = 0)]
    shared_prefix: usize,
    /// Poisson arrivals at this many requests per second; default: all at once.
    #[arg(long)]
    rate: Option<f64>,
    /// At most this many requests in flight (without --rate: a closed loop of C clients).
    #[arg(long)]
    concurrency: Option<usize>,
    /// Seed of arrivals, lengths and prompts.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Hard bound on the whole run in seconds: then nothing more is sent and requests in
    /// flight are cancelled.
    #[arg(long, default_value_t = 600.0)]
    max_duration: f64,
    /// Stop sending after this many seconds and let the requests in flight finish (a soak
    /// that ends cleanly); the trace's rest counts as held back, not as a failure. Must be
    /// below --max-duration, which still bounds the run.
    #[arg(long)]
    send_duration: Option<f64>,
    /// Token-id prompts use ids below this (the model's vocabulary size or less).
    #[arg(long, default_value_t = 32_000)]
    vocab_size: u32,
    /// Sampling temperature sent with each request (0: greedy, as `fl bench`).
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Bearer token for `fl serve --api-key`; default: $OPENAI_API_KEY when set.
    #[arg(long)]
    api_key: Option<String>,
    /// Client runtime threads (the server shares the machine).
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Print one JSON line instead of the table.
    #[arg(long)]
    json: bool,
    /// Also write FILE (created or truncated before the run): one JSON line per request sent,
    /// in send order, with its planned lengths, send time, outcome, TTFT, ITL gaps, E2E, output
    /// tokens and retries, written after the run.
    #[arg(long, value_name = "FILE")]
    save_result: Option<PathBuf>,
}

/// Why a run could not start: a bad argument (named) or a server that does not answer.
#[derive(Debug, PartialEq)]
enum LoadgenError {
    Arg { arg: &'static str, msg: String },
    Server(String),
}

impl fmt::Display for LoadgenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadgenError::Arg { arg, msg } => write!(f, "{arg}: {msg}"),
            LoadgenError::Server(msg) => write!(f, "server: {msg}"),
        }
    }
}

fn arg_err(arg: &'static str, msg: impl Into<String>) -> LoadgenError {
    LoadgenError::Arg {
        arg,
        msg: msg.into(),
    }
}

// The trace, lengths and percentiles below are `fl_engine::trace`'s, restated: fl-bench may not
// depend on fl-engine (scripts/check-deps.sh); the tests pin the same traces and ranks.

/// A length distribution: one value, or uniform over an inclusive range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lengths {
    Fixed(usize),
    Uniform { lo: usize, hi: usize },
}

impl Lengths {
    fn draw(self, rng: &mut SplitMix64) -> usize {
        match self {
            Lengths::Fixed(n) => n,
            Lengths::Uniform { lo, hi } => lo + (rng.next() % (hi - lo + 1) as u64) as usize,
        }
    }

    fn min(self) -> usize {
        match self {
            Lengths::Fixed(n) | Lengths::Uniform { lo: n, .. } => n,
        }
    }
}

/// `N` or `LO-HI` (uniform, inclusive), each at least 1, for the flag `arg`, as
/// `fl bench --prompt-lens` reads it.
fn parse_lens(arg: &'static str, s: &str) -> Result<Lengths, LoadgenError> {
    let num = |t: &str| match t.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(arg_err(
            arg,
            format!("`{s}` is not N or LO-HI with counts >= 1"),
        )),
    };
    match s.split_once('-') {
        None => Ok(Lengths::Fixed(num(s)?)),
        Some((a, b)) => {
            let (lo, hi) = (num(a)?, num(b)?);
            if lo > hi {
                return Err(arg_err(arg, format!("`{s}`: {lo} is above {hi}")));
            }
            Ok(Lengths::Uniform { lo, hi })
        }
    }
}

/// One request of the run.
#[derive(Clone, Copy, Debug, PartialEq)]
struct TraceRequest {
    /// Seconds after the start of the run.
    arrival_s: f64,
    prompt_len: usize,
    output_len: usize,
}

/// `n` requests in arrival order: Poisson arrivals at `rate` (exponential gaps) or all at
/// time 0, then each request's prompt and output lengths, all from one generator.
fn make_trace(
    n: usize,
    rate: Option<f64>,
    prompt: Lengths,
    output: Lengths,
    seed: u64,
) -> Vec<TraceRequest> {
    let mut rng = SplitMix64(seed);
    let mut t = 0.0;
    (0..n)
        .map(|_| {
            if let Some(rate) = rate {
                // -ln(U) / rate with U in (0, 1].
                let u = ((rng.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
                t += -u.ln() / rate;
            }
            TraceRequest {
                arrival_s: t,
                prompt_len: prompt.draw(&mut rng),
                output_len: output.draw(&mut rng),
            }
        })
        .collect()
}

/// Samples summarised: mean, nearest-rank p50 / p90 / p99, max.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Percentiles {
    mean: f64,
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `samples` (NaNs ignored); `None` when there is none.
    fn of(samples: &[f64]) -> Option<Self> {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let rank = |p: f64| v[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
        Some(Percentiles {
            mean: v.iter().sum::<f64>() / n as f64,
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            max: v[n - 1],
        })
    }
}

/// The server root (`http://HOST:PORT[/prefix]`, no trailing `/` or `/v1`), refusing any host
/// but this machine's loopback names and any scheme but plain http.
fn loopback_base(s: &str) -> Result<String, LoadgenError> {
    let uri: Uri = s
        .parse()
        .map_err(|e| arg_err("--base-url", format!("`{s}` is not a URL ({e})")))?;
    if uri.scheme_str() != Some("http") {
        return Err(arg_err(
            "--base-url",
            format!("`{s}`: only http:// to a loopback address"),
        ));
    }
    let host = uri.host().unwrap_or("");
    if !matches!(host, "127.0.0.1" | "localhost" | "[::1]" | "::1") {
        return Err(arg_err(
            "--base-url",
            format!("`{s}`: host `{host}` is not 127.0.0.1, ::1 or localhost"),
        ));
    }
    if uri.query().is_some() {
        return Err(arg_err("--base-url", format!("`{s}`: no query string")));
    }
    let authority = uri.authority().map_or("", |a| a.as_str());
    if authority.contains('@') {
        return Err(arg_err("--base-url", format!("`{s}`: no user info")));
    }
    let path = uri.path().trim_end_matches('/');
    let path = path.strip_suffix("/v1").unwrap_or(path);
    Ok(format!("http://{authority}{path}"))
}

/// SplitMix64: a small, fixed generator, so a run is the same on every machine. The trace
/// uses `SplitMix64(seed)`; prompts use one stream per request, apart from the trace's.
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64, stream: u64) -> Self {
        SplitMix64(seed ^ SplitMix64(stream).next() ^ 0xA076_1D64_78BD_642F)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Stream of the shared prefix; request `i`'s own tokens use stream `i`.
const SHARED_STREAM: u64 = u64::MAX;
/// Stream of the warm-up request (shares nothing with the run's prompts).
const WARMUP_STREAM: u64 = u64::MAX - 1;

/// How prompts are sent.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// /v1/completions with `"prompt": [ids]`.
    Ids { vocab: u32 },
    /// /v1/completions with `"prompt": "words"`.
    Text,
    /// /v1/chat/completions with one user message of words.
    Chat,
    /// /v1/embeddings with `"input": [[ids], ...]`, `inputs` lists per request, not streamed.
    Embed { vocab: u32, inputs: usize },
}

impl Mode {
    /// Inputs (prompts) per request: `inputs` for embeddings, else 1.
    fn inputs(self) -> usize {
        match self {
            Mode::Embed { inputs, .. } => inputs,
            _ => 1,
        }
    }

    fn path(self) -> &'static str {
        match self {
            Mode::Chat => "/v1/chat/completions",
            Mode::Embed { .. } => "/v1/embeddings",
            _ => "/v1/completions",
        }
    }
}

/// `len` draws: the first `shared` from the shared stream, the rest from `stream`.
fn draws(seed: u64, stream: u64, len: usize, shared: usize) -> impl Iterator<Item = u64> {
    let shared = shared.min(len);
    let mut s = SplitMix64::new(seed, SHARED_STREAM);
    let mut own = SplitMix64::new(seed, stream);
    (0..len).map(move |k| if k < shared { s.next() } else { own.next() })
}

/// The prompt value of a request: a list of ids, or a string of words.
fn prompt_value(mode: Mode, seed: u64, stream: u64, len: usize, shared: usize) -> Value {
    match mode {
        Mode::Ids { vocab } | Mode::Embed { vocab, .. } => {
            let span = u64::from(vocab - FIRST_ID);
            Value::from(
                draws(seed, stream, len, shared)
                    .map(|r| FIRST_ID + (r % span) as u32)
                    .collect::<Vec<u32>>(),
            )
        }
        Mode::Text | Mode::Chat => {
            let words: Vec<&str> = draws(seed, stream, len, shared)
                .map(|r| WORDS[(r % WORDS.len() as u64) as usize])
                .collect();
            Value::from(words.join(" "))
        }
    }
}

/// What each request shares.
struct Job {
    client: Client<HttpConnector, Full<Bytes>>,
    /// Retries go out on this client: it keeps no idle connection, so each one opens its own.
    fresh: Client<HttpConnector, Full<Bytes>>,
    /// --max-duration: no retry starts at or after it.
    deadline: Instant,
    uri: Uri,
    auth: Option<String>,
    model: String,
    mode: Mode,
    temperature: f64,
    seed: u64,
    shared_prefix: usize,
}

impl Job {
    /// The JSON body of a request on `stream` (`shared` prefix tokens) for `max_tokens`.
    fn body(&self, stream: u64, prompt_len: usize, shared: usize, max_tokens: usize) -> Bytes {
        if let Mode::Embed { inputs, .. } = self.mode {
            // Input j of request `stream` draws from its own stream (the shared prefix too).
            let input: Vec<Value> = (0..inputs as u64)
                .map(|j| {
                    let st = stream.wrapping_mul(EMBED_STREAMS).wrapping_add(j);
                    prompt_value(self.mode, self.seed, st, prompt_len, shared)
                })
                .collect();
            let b = json!({"model": self.model, "input": input});
            return Bytes::from(b.to_string());
        }
        let prompt = prompt_value(self.mode, self.seed, stream, prompt_len, shared);
        let mut b = json!({
            "model": self.model,
            "max_tokens": max_tokens,
            "ignore_eos": true,
            "temperature": self.temperature,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if self.mode == Mode::Chat {
            b["messages"] = json!([{"role": "user", "content": prompt}]);
        } else {
            b["prompt"] = prompt;
        }
        Bytes::from(b.to_string())
    }

    /// POSTs `body`; returns the response head and when the request was first sent. A
    /// connection-level failure before the head ([`retryable`]) is sent again on a fresh
    /// connection after [`RETRY_BACKOFF`], while the backoff ends before the deadline; each
    /// retry adds 1 to `retries`.
    async fn send(
        &self,
        body: Bytes,
        retries: &mut u32,
    ) -> Result<(Response<Incoming>, Instant), String> {
        let sent = Instant::now();
        let mut attempt = 0;
        loop {
            let client = if attempt == 0 {
                &self.client
            } else {
                &self.fresh
            };
            let e = match client.request(self.post(body.clone())?).await {
                Ok(resp) => return Ok((resp, sent)),
                Err(e) => e,
            };
            let again = RETRY_BACKOFF
                .get(attempt)
                .map(|&wait| Instant::now() + wait)
                .filter(|&at| at < self.deadline && retryable(&e));
            let Some(at) = again else {
                let tries = match attempt {
                    0 => String::new(),
                    n => format!(" ({} attempts)", n + 1),
                };
                return Err(format!("connection: {}{tries}", error_chain(&e)));
            };
            sleep_until(at).await;
            attempt += 1;
            *retries += 1;
        }
    }

    fn post(&self, body: Bytes) -> Result<Request<Full<Bytes>>, String> {
        let mut r = Request::builder()
            .method(Method::POST)
            .uri(self.uri.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header(
                header::ACCEPT,
                match self.mode {
                    Mode::Embed { .. } => "application/json",
                    _ => "text/event-stream",
                },
            );
        if let Some(a) = &self.auth {
            r = r.header(header::AUTHORIZATION, a);
        }
        r.body(Full::new(body)).map_err(|e| format!("request: {e}"))
    }
}

/// Whether a request that got no response head failed at the connection level, so that the
/// server never answered it: the connection could not be made, or it was closed or reset
/// before the response began (a pooled keep-alive connection the server had closed). A
/// malformed answer, a timeout or an error of ours is not.
fn retryable(e: &hyper_util::client::legacy::Error) -> bool {
    if e.is_connect() {
        return true;
    }
    let mut cause = e.source();
    while let Some(c) = cause {
        if let Some(h) = c.downcast_ref::<hyper::Error>() {
            if h.is_canceled() || h.is_closed() || h.is_incomplete_message() {
                return true;
            }
        }
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind as K;
            if matches!(
                io.kind(),
                K::ConnectionRefused
                    | K::ConnectionReset
                    | K::ConnectionAborted
                    | K::BrokenPipe
                    | K::NotConnected
                    | K::UnexpectedEof
            ) {
                return true;
            }
        }
        cause = c.source();
    }
    false
}

/// `e` and its causes, joined by `: ` (hyper-util's own text is only `client error (Kind)`).
fn error_chain(e: &dyn StdError) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cause = c.source();
    }
    s
}

/// One SSE event's payload, or the end marker.
#[derive(Debug, PartialEq)]
enum SseEvent {
    Data(String),
    Done,
}

/// Server-sent events from body bytes that arrive in arbitrary pieces: lines end in `\n` or
/// `\r\n`, `data:` lines accumulate until a blank line ends the event, comments (`:`) and
/// other fields are skipped, `data: [DONE]` is [`SseEvent::Done`].
#[derive(Default)]
struct SseParser {
    buf: Vec<u8>,
    data: Option<String>,
}

impl SseParser {
    /// Feeds `bytes`, appending the events they complete to `out`.
    fn push(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) -> Result<(), String> {
        self.buf.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(n) = self.buf[start..].iter().position(|&b| b == b'\n') {
            let line = &self.buf[start..start + n];
            sse_line(
                line.strip_suffix(b"\r").unwrap_or(line),
                &mut self.data,
                out,
            )?;
            start += n + 1;
        }
        self.buf.drain(..start);
        if self.buf.len() > MAX_LINE_BYTES {
            return Err(format!("stream: a line longer than {MAX_LINE_BYTES} bytes"));
        }
        Ok(())
    }

    /// The body ended: a last unterminated line and event count as complete.
    fn finish(&mut self, out: &mut Vec<SseEvent>) -> Result<(), String> {
        let rest = std::mem::take(&mut self.buf);
        if !rest.is_empty() {
            sse_line(
                rest.strip_suffix(b"\r").unwrap_or(&rest),
                &mut self.data,
                out,
            )?;
        }
        sse_line(b"", &mut self.data, out)
    }
}

fn sse_line(line: &[u8], data: &mut Option<String>, out: &mut Vec<SseEvent>) -> Result<(), String> {
    if line.is_empty() {
        if let Some(d) = data.take() {
            out.push(if d.trim() == "[DONE]" {
                SseEvent::Done
            } else {
                SseEvent::Data(d)
            });
        }
        return Ok(());
    }
    let line = std::str::from_utf8(line).map_err(|_| "stream: a line is not UTF-8".to_string())?;
    if line.starts_with(':') {
        return Ok(());
    }
    let (field, value) = match line.split_once(':') {
        Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
        None => (line, ""),
    };
    if field == "data" {
        match data {
            Some(d) => {
                d.push('\n');
                d.push_str(value);
            }
            None => *data = Some(value.to_string()),
        }
    }
    Ok(())
}

/// What one streamed response has shown so far (times in seconds after the request was sent).
#[derive(Debug, Default, PartialEq)]
struct StreamStats {
    first: Option<f64>,
    last: f64,
    itl: Vec<f64>,
    content_chunks: usize,
    usage_completion: Option<usize>,
    usage_prompt: Option<usize>,
    done: bool,
}

impl StreamStats {
    /// One `data:` payload received at `t`: content chunks (non-empty `text`, or
    /// `delta.content` for chat) set TTFT and ITL; a `usage` object sets the counts; an `error`
    /// object fails the request.
    fn on_data(&mut self, data: &str, t: f64, chat: bool) -> Result<(), String> {
        let v: Value =
            serde_json::from_str(data).map_err(|e| format!("stream: a chunk is not JSON ({e})"))?;
        if let Some(err) = v.get("error") {
            return Err(format!("stream error: {}", error_message(err)));
        }
        let choice = v
            .get("choices")
            .and_then(Value::as_array)
            .and_then(|c| c.first());
        let content = choice.and_then(|c| {
            if chat {
                c.get("delta").and_then(|d| d.get("content"))
            } else {
                c.get("text")
            }
        });
        if content
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
        {
            match self.first {
                None => self.first = Some(t),
                Some(_) => self.itl.push(t - self.last),
            }
            self.last = t;
            self.content_chunks += 1;
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            let count = |k: &str| u.get(k).and_then(Value::as_u64).map(|x| x as usize);
            self.usage_completion = count("completion_tokens");
            self.usage_prompt = count("prompt_tokens");
        }
        Ok(())
    }

    /// The request's figures once the stream has ended.
    fn finish(self) -> Result<Sample, String> {
        if !self.done {
            return Err("stream: ended before data: [DONE]".into());
        }
        let Some(ttft) = self.first else {
            return Err("stream: no content chunk".into());
        };
        let output_tokens = self.usage_completion.unwrap_or(self.content_chunks);
        let tpot = (output_tokens > 1).then(|| (self.last - ttft) / (output_tokens - 1) as f64);
        Ok(Sample {
            ttft,
            e2e: self.last,
            tpot,
            itl: self.itl,
            output_tokens,
            prompt_tokens: self.usage_prompt,
            usage_counted: self.usage_completion.is_some(),
        })
    }
}

/// One successful request.
#[derive(Debug, PartialEq)]
struct Sample {
    ttft: f64,
    e2e: f64,
    tpot: Option<f64>,
    itl: Vec<f64>,
    output_tokens: usize,
    prompt_tokens: Option<usize>,
    /// Output tokens from the usage chunk (else from the content chunk count).
    usage_counted: bool,
}

/// How one request ended.
#[derive(Debug)]
enum Outcome {
    Ok(Sample),
    /// Failed: the HTTP status and OpenAI error message, or what went wrong.
    Failed(String),
    /// Still in flight at --max-duration.
    Cancelled,
}

/// `{"message": ..}`, a string, or the JSON text.
fn error_message(err: &Value) -> String {
    err.get("message")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| err.as_str().map(str::to_string))
        .unwrap_or_else(|| err.to_string())
}

/// The reason for a non-200 answer: the status and the OpenAI error message.
fn http_failure(status: u16, body: &[u8]) -> String {
    let msg = match serde_json::from_slice::<Value>(body) {
        Ok(v) => v.get("error").map_or_else(|| v.to_string(), error_message),
        Err(_) => String::from_utf8_lossy(body).trim().to_string(),
    };
    let msg: String = msg.chars().take(160).collect();
    format!("HTTP {status}: {msg}")
}

/// The whole body of `resp`, refused past `limit` bytes.
async fn body_bytes(resp: Response<Incoming>, limit: usize) -> Result<Bytes, String> {
    Limited::new(resp.into_body(), limit)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| format!("reading the body: {e}"))
}

/// Sends one request (streamed, or for `/v1/embeddings` not) and measures it from its first
/// send; connection-level retries ([`Job::send`]) add to `retries`.
async fn send(job: &Job, body: Bytes, retries: &mut u32) -> Result<Sample, String> {
    match job.mode {
        Mode::Embed { inputs, .. } => embed_request(job, body, inputs, retries).await,
        _ => stream_request(job, body, retries).await,
    }
}

/// Sends one `/v1/embeddings` request and checks its answer ([`embed_sample`]).
async fn embed_request(
    job: &Job,
    body: Bytes,
    inputs: usize,
    retries: &mut u32,
) -> Result<Sample, String> {
    let (resp, sent) = job.send(body, retries).await?;
    let status = resp.status().as_u16();
    let body = body_bytes(resp, MAX_LINE_BYTES).await?;
    if status != 200 {
        return Err(http_failure(status, &body));
    }
    embed_sample(&body, sent.elapsed().as_secs_f64(), inputs)
}

/// The sample of an embeddings answer received `e2e` seconds after it was sent: `data` must
/// hold `inputs` entries, each with a non-empty `embedding` array (or a base64 string);
/// `usage.prompt_tokens` counts the input tokens.
fn embed_sample(body: &[u8], e2e: f64, inputs: usize) -> Result<Sample, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("answer is not JSON: {e}"))?;
    let data = v["data"]
        .as_array()
        .ok_or_else(|| "answer has no `data` array".to_string())?;
    if data.len() != inputs {
        return Err(format!("{} embeddings for {inputs} inputs", data.len()));
    }
    for (i, d) in data.iter().enumerate() {
        let ok = match &d["embedding"] {
            Value::Array(a) => !a.is_empty(),
            Value::String(b64) => !b64.is_empty(),
            _ => false,
        };
        if !ok {
            return Err(format!("data[{i}] has no embedding"));
        }
    }
    Ok(Sample {
        ttft: e2e,
        e2e,
        tpot: None,
        itl: Vec::new(),
        output_tokens: 0,
        prompt_tokens: v["usage"]["prompt_tokens"].as_u64().map(|n| n as usize),
        usage_counted: true,
    })
}

/// Sends one streaming request and reads its events to the end.
async fn stream_request(job: &Job, body: Bytes, retries: &mut u32) -> Result<Sample, String> {
    let (resp, sent) = job.send(body, retries).await?;
    let status = resp.status().as_u16();
    if status != 200 {
        let body = body_bytes(resp, MAX_SMALL_BODY).await.unwrap_or_default();
        return Err(http_failure(status, &body));
    }
    let chat = job.mode == Mode::Chat;
    let mut body = resp.into_body();
    let (mut parser, mut stats, mut events) =
        (SseParser::default(), StreamStats::default(), vec![]);
    // Bounded by the caller's deadline; the body ends at [DONE] or when the server closes.
    while !stats.done {
        let Some(frame) = body.frame().await else {
            parser.finish(&mut events)?;
            stats.take(&mut events, sent.elapsed().as_secs_f64(), chat)?;
            break;
        };
        let frame = frame.map_err(|e| format!("stream: {e}"))?;
        if let Some(d) = frame.data_ref() {
            parser.push(d, &mut events)?;
            stats.take(&mut events, sent.elapsed().as_secs_f64(), chat)?;
        }
    }
    stats.finish()
}

impl StreamStats {
    /// Applies `events` (arrived at `t`) up to `[DONE]`, emptying the list.
    fn take(&mut self, events: &mut Vec<SseEvent>, t: f64, chat: bool) -> Result<(), String> {
        for ev in events.drain(..) {
            match ev {
                SseEvent::Done => {
                    self.done = true;
                    break;
                }
                SseEvent::Data(d) if !self.done => self.on_data(&d, t, chat)?,
                SseEvent::Data(_) => {}
            }
        }
        Ok(())
    }
}

/// The first model id of GET /v1/models.
async fn first_model(job: &Job, base: &str) -> Result<String, String> {
    let uri: Uri = format!("{base}/v1/models")
        .parse()
        .map_err(|e| format!("models URL: {e}"))?;
    let mut r = Request::builder().method(Method::GET).uri(uri);
    if let Some(a) = &job.auth {
        r = r.header(header::AUTHORIZATION, a);
    }
    let req = r
        .body(Full::new(Bytes::new()))
        .map_err(|e| format!("request: {e}"))?;
    let resp = job
        .client
        .request(req)
        .await
        .map_err(|e| format!("GET /v1/models: {e}"))?;
    let status = resp.status().as_u16();
    let body = body_bytes(resp, MAX_SMALL_BODY).await?;
    if status != 200 {
        return Err(format!("GET /v1/models: {}", http_failure(status, &body)));
    }
    let v: Value = serde_json::from_slice(&body).map_err(|e| format!("GET /v1/models: {e}"))?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| "GET /v1/models lists no model; pass --model".to_string())
}

/// The run's inputs, checked.
struct Plan {
    base: String,
    mode: Mode,
    trace: Vec<TraceRequest>,
    concurrency: Option<usize>,
    /// --save-result: its path and the file, created (empty) before the run.
    save: Option<(PathBuf, File)>,
}

fn plan(a: &Args) -> Result<Plan, LoadgenError> {
    let base = loopback_base(&a.base_url)?;
    let prompt = parse_lens("--prompt-lens", &a.prompt_lens)?;
    let output = parse_lens("--output-lens", &a.output_lens)?;
    if a.shared_prefix > 0 && prompt.min() <= a.shared_prefix {
        return Err(arg_err(
            "--shared-prefix",
            format!(
                "{} tokens: every prompt must be longer (--prompt-lens {})",
                a.shared_prefix, a.prompt_lens
            ),
        ));
    }
    if a.num_prompts == 0 {
        return Err(arg_err("--num-prompts", "must be at least 1"));
    }
    if a.concurrency == Some(0) {
        return Err(arg_err("--concurrency", "must be at least 1"));
    }
    if !(a.max_duration.is_finite() && a.max_duration > 0.0) {
        return Err(arg_err(
            "--max-duration",
            format!("{} is not a positive number of seconds", a.max_duration),
        ));
    }
    if let Some(d) = a.send_duration {
        if !(d.is_finite() && d > 0.0 && d < a.max_duration) {
            return Err(arg_err(
                "--send-duration",
                format!(
                    "{d} is not a number of seconds above 0 and below --max-duration ({})",
                    a.max_duration
                ),
            ));
        }
    }
    if a.vocab_size <= FIRST_ID {
        return Err(arg_err(
            "--vocab-size",
            format!("{} leaves no id above {FIRST_ID}", a.vocab_size),
        ));
    }
    if !(a.temperature.is_finite() && a.temperature >= 0.0) {
        return Err(arg_err("--temperature", "must be a number >= 0"));
    }
    if a.threads == 0 {
        return Err(arg_err("--threads", "must be at least 1"));
    }
    if a.inputs_per_request == 0 {
        return Err(arg_err("--inputs-per-request", "must be at least 1"));
    }
    let mode = match (a.chat, a.text, a.embeddings) {
        (_, _, true) => Mode::Embed {
            vocab: a.vocab_size,
            inputs: a.inputs_per_request,
        },
        (true, _, _) => Mode::Chat,
        (false, true, _) => Mode::Text,
        (false, false, false) => Mode::Ids {
            vocab: a.vocab_size,
        },
    };
    if let Some(r) = a.rate {
        if !(r.is_finite() && r > 0.0) {
            return Err(arg_err(
                "--rate",
                format!("{r} is not a positive number of requests per second"),
            ));
        }
    }
    let trace = make_trace(a.num_prompts, a.rate, prompt, output, a.seed);
    // Last, so that a run refused for another argument leaves the file alone.
    let save = match &a.save_result {
        Some(path) => {
            let file = File::create(path).map_err(|e| {
                arg_err(
                    "--save-result",
                    format!("cannot create `{}`: {e}", path.display()),
                )
            })?;
            Some((path.clone(), file))
        }
        None => None,
    };
    Ok(Plan {
        base,
        mode,
        trace,
        concurrency: a.concurrency,
        save,
    })
}

/// The run's figures.
struct Report {
    outcomes: Vec<Outcome>,
    /// Connection-level retries of each request sent (as `outcomes`).
    retries: Vec<u32>,
    /// Seconds from the run's start to each request's first send (as `outcomes`).
    send_s: Vec<f64>,
    not_sent: usize,
    /// Requests of the trace not sent because --send-duration had passed.
    held_back: usize,
    duration_s: f64,
}

/// Seconds as milliseconds, rounded to microseconds (the report's and --save-result's unit).
fn ms(x: f64) -> f64 {
    (x * 1e6).round() / 1e3
}

/// Percentiles in milliseconds, rounded to microseconds; `null` without samples.
fn ms_summary(samples: &[f64]) -> Value {
    match Percentiles::of(samples) {
        Some(p) => json!({
            "mean": ms(p.mean), "p50": ms(p.p50), "p90": ms(p.p90), "p99": ms(p.p99),
            "max": ms(p.max),
        }),
        None => Value::Null,
    }
}

/// The report as one JSON object (also the source of the table).
fn summarize(r: &Report, plan: &Plan, args: &Args) -> Value {
    let (mut ttft, mut tpot, mut itl, mut e2e) = (vec![], vec![], vec![], vec![]);
    let (mut input, mut output, mut ok, mut cancelled) = (0usize, 0usize, 0usize, 0usize);
    let (mut chunk_counted, mut short_outputs, mut prompt_mismatch) = (0usize, 0usize, 0usize);
    let mut errors: BTreeMap<&str, usize> = BTreeMap::new();
    for (q, o) in plan.trace.iter().zip(&r.outcomes) {
        match o {
            Outcome::Ok(s) => {
                ok += 1;
                ttft.push(s.ttft);
                e2e.push(s.e2e);
                tpot.extend(s.tpot);
                itl.extend_from_slice(&s.itl);
                output += s.output_tokens;
                let per = plan.mode.inputs();
                input += s.prompt_tokens.unwrap_or(q.prompt_len * per);
                chunk_counted += usize::from(!s.usage_counted);
                let embed = matches!(plan.mode, Mode::Embed { .. });
                short_outputs +=
                    usize::from(!embed && s.usage_counted && s.output_tokens != q.output_len);
                if matches!(plan.mode, Mode::Ids { .. } | Mode::Embed { .. }) {
                    prompt_mismatch +=
                        usize::from(s.prompt_tokens.is_some_and(|p| p != q.prompt_len * per));
                }
            }
            Outcome::Failed(why) => *errors.entry(why.as_str()).or_default() += 1,
            Outcome::Cancelled => cancelled += 1,
        }
    }
    let failed: usize = errors.values().sum();
    let retried = r.retries.iter().filter(|&&k| k > 0).count();
    let retries: u64 = r.retries.iter().map(|&k| u64::from(k)).sum();
    let d = r.duration_s.max(f64::MIN_POSITIVE);
    let round = |x: f64, k: f64| (x * k).round() / k;
    json!({
        "base_url": plan.base,
        "endpoint": plan.mode.path(),
        "prompts": match plan.mode { Mode::Ids { .. } | Mode::Embed { .. } => "token_ids", _ => "words" },
        "num_prompts": plan.trace.len(),
        "prompt_lens": args.prompt_lens,
        "output_lens": args.output_lens,
        "shared_prefix": args.shared_prefix,
        "rate": args.rate,
        "concurrency": plan.concurrency,
        "seed": args.seed,
        "completed": ok,
        "failed": failed,
        "retried": retried,
        "retries": retries,
        "cancelled": cancelled,
        "not_sent": r.not_sent,
        "held_back": r.held_back,
        "errors": errors,
        "duration_s": round(r.duration_s, 1e3),
        "input_tokens": input,
        "output_tokens": output,
        "request_throughput": round(ok as f64 / d, 1e3),
        "output_throughput": round(output as f64 / d, 1e2),
        "total_token_throughput": round((input + output) as f64 / d, 1e2),
        "inputs_per_request": plan.mode.inputs(),
        "input_throughput": round((ok * plan.mode.inputs()) as f64 / d, 1e2),
        "ttft_ms": ms_summary(&ttft),
        "tpot_ms": ms_summary(&tpot),
        "itl_ms": ms_summary(&itl),
        "e2e_ms": ms_summary(&e2e),
        "outputs_counted_from_chunks": chunk_counted,
        "outputs_not_max_tokens": short_outputs,
        "prompt_tokens_mismatch": prompt_mismatch,
    })
}

/// The --save-result line of each request sent, in the plan's order (the order they were
/// sent): [`request_line`].
fn request_lines<'a>(r: &'a Report, plan: &'a Plan) -> impl Iterator<Item = String> + 'a {
    let sent = plan.trace.iter().zip(&r.outcomes);
    sent.zip(r.retries.iter().zip(&r.send_s))
        .enumerate()
        .map(|(i, ((q, o), (&retries, &send_s)))| request_line(plan.mode, i, q, o, retries, send_s))
}

/// Request `i`'s line, its fields in a fixed order: `index`, planned `prompt_tokens` (all
/// inputs of an embeddings request) and `max_tokens` (null for embeddings, which send none),
/// `send_s`, `ok`, `error` (null, the failure as the report's `errors` keys it, or
/// "cancelled"), then as the report counts them `ttft_ms`, `itl_ms` (the request's ITL
/// samples), `e2e_ms` (both null unless ok), `output_tokens` (0 unless ok) and `retries`.
fn request_line(
    mode: Mode,
    i: usize,
    q: &TraceRequest,
    o: &Outcome,
    retries: u32,
    send_s: f64,
) -> String {
    let (error, s) = match o {
        Outcome::Ok(s) => (None, Some(s)),
        Outcome::Failed(why) => (Some(why.as_str()), None),
        Outcome::Cancelled => (Some("cancelled"), None),
    };
    let embed = matches!(mode, Mode::Embed { .. });
    let itl: Vec<f64> = s.map_or_else(Vec::new, |s| s.itl.iter().map(|&x| ms(x)).collect());
    let fields = [
        ("index", json!(i)),
        ("prompt_tokens", json!(q.prompt_len * mode.inputs())),
        ("max_tokens", json!((!embed).then_some(q.output_len))),
        ("send_s", json!((send_s * 1e6).round() / 1e6)),
        ("ok", json!(s.is_some())),
        ("error", json!(error)),
        ("ttft_ms", json!(s.map(|s| ms(s.ttft)))),
        ("itl_ms", json!(itl)),
        ("e2e_ms", json!(s.map(|s| ms(s.e2e)))),
        ("output_tokens", json!(s.map_or(0, |s| s.output_tokens))),
        ("retries", json!(retries)),
    ];
    let body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
    format!("{{{}}}", body.join(","))
}

/// Writes the --save-result file (when asked for) after the run.
fn save_result(r: &Report, plan: &Plan) -> Result<(), String> {
    let Some((path, file)) = &plan.save else {
        return Ok(());
    };
    let mut w = BufWriter::new(file);
    request_lines(r, plan)
        .try_for_each(|line| writeln!(w, "{line}"))
        .and_then(|()| w.flush())
        .map_err(|e| format!("--save-result: writing `{}`: {e}", path.display()))
}

fn print_table(v: &Value) {
    let line = |k: &str, x: &Value| println!("{k:<34}{x}");
    println!(
        "============ fl_loadgen: {}{} ============",
        v["base_url"].as_str().unwrap_or(""),
        v["endpoint"].as_str().unwrap_or("")
    );
    println!(
        "{} prompts ({}) of {} tokens, outputs {}, shared prefix {}, rate {}, concurrency {}, seed {}",
        v["num_prompts"],
        v["prompts"].as_str().unwrap_or(""),
        v["prompt_lens"].as_str().unwrap_or(""),
        v["output_lens"].as_str().unwrap_or(""),
        v["shared_prefix"],
        v["rate"].as_f64().map_or("inf".to_string(), |r| r.to_string()),
        v["concurrency"].as_u64().map_or("unbounded".to_string(), |c| c.to_string()),
        v["seed"],
    );
    for (k, label) in [
        ("completed", "Successful requests:"),
        ("failed", "Failed requests:"),
        ("retried", "Retried (connection failures):"),
        ("retries", "Retries (extra attempts):"),
        ("cancelled", "Cancelled at --max-duration:"),
        ("not_sent", "Not sent (--max-duration):"),
        ("held_back", "Not sent (--send-duration):"),
        ("duration_s", "Benchmark duration (s):"),
        ("input_tokens", "Total input tokens:"),
        ("output_tokens", "Total generated tokens:"),
        ("request_throughput", "Request throughput (req/s):"),
        ("output_throughput", "Output token throughput (tok/s):"),
        ("total_token_throughput", "Total token throughput (tok/s):"),
    ] {
        line(label, &v[k]);
    }
    if v["endpoint"] == "/v1/embeddings" {
        line("Inputs per request:", &v["inputs_per_request"]);
        line("Input throughput (inputs/s):", &v["input_throughput"]);
    }
    if let Some(errs) = v["errors"].as_object() {
        for (why, n) in errs.iter().take(10) {
            println!("  {n} x {why}");
        }
        if errs.len() > 10 {
            println!("  ... and {} more kinds of failure", errs.len() - 10);
        }
    }
    println!(
        "{:<10}{:>12}{:>12}{:>12}{:>12}{:>12}",
        "(ms)", "mean", "p50", "p90", "p99", "max"
    );
    for (k, label) in [
        ("ttft_ms", "TTFT"),
        ("tpot_ms", "TPOT"),
        ("itl_ms", "ITL"),
        ("e2e_ms", "E2E"),
    ] {
        let p = &v[k];
        let f = |q: &str| p[q].as_f64().map_or("-".to_string(), |x| format!("{x:.2}"));
        println!(
            "{label:<10}{:>12}{:>12}{:>12}{:>12}{:>12}",
            f("mean"),
            f("p50"),
            f("p90"),
            f("p99"),
            f("max")
        );
    }
    for (k, label) in [
        (
            "outputs_counted_from_chunks",
            "Outputs counted from chunks:",
        ),
        ("outputs_not_max_tokens", "Outputs != max_tokens:"),
        ("prompt_tokens_mismatch", "Prompt tokens != sent ids:"),
    ] {
        if v[k].as_u64().is_some_and(|n| n > 0) {
            line(label, &v[k]);
        }
    }
}

/// The run's client, which keeps connections alive, and the retries' one, which opens a
/// fresh connection for each request.
fn clients(
    conn: HttpConnector,
) -> (
    Client<HttpConnector, Full<Bytes>>,
    Client<HttpConnector, Full<Bytes>>,
) {
    let pooled = Client::builder(TokioExecutor::new()).build(conn.clone());
    let fresh = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(conn);
    (pooled, fresh)
}

/// Sends the warm-up request, then the trace; every wait ends at `deadline`.
async fn run(args: &Args, plan: &Plan, deadline: Instant) -> Result<Report, LoadgenError> {
    let mut conn = HttpConnector::new();
    // Each streamed chunk is a small write: Nagle would add its delay to ITL.
    conn.set_nodelay(true);
    let (client, fresh) = clients(conn);
    let auth = args
        .api_key
        .clone()
        .or_else(|| std::env::var("OPENAI_API_KEY").ok())
        .map(|k| format!("Bearer {k}"));
    let uri: Uri = format!("{}{}", plan.base, plan.mode.path())
        .parse()
        .map_err(|e| arg_err("--base-url", format!("{e}")))?;
    let mut job = Job {
        client,
        fresh,
        deadline,
        uri,
        auth,
        model: String::new(),
        mode: plan.mode,
        temperature: args.temperature,
        seed: args.seed,
        shared_prefix: args.shared_prefix,
    };
    let timed_out = || LoadgenError::Server("no answer before --max-duration".into());
    job.model = match &args.model {
        Some(m) => m.clone(),
        None => timeout_at(deadline, first_model(&job, &plan.base))
            .await
            .map_err(|_| timed_out())?
            .map_err(LoadgenError::Server)?,
    };
    // Warm-up (connection, first-use costs on the server): a short prompt of its own.
    let body = job.body(WARMUP_STREAM, 16, 0, 4);
    timeout_at(deadline, send(&job, body, &mut 0))
        .await
        .map_err(|_| timed_out())?
        .map_err(|e| LoadgenError::Server(format!("warm-up request failed: {e}")))?;

    let job = Arc::new(job);
    let slots = plan.concurrency.map(|c| Arc::new(Semaphore::new(c)));
    let n = plan.trace.len();
    let mut tasks = JoinSet::new();
    let mut not_sent = 0;
    let mut held_back = 0;
    let start = Instant::now();
    let send_until = args
        .send_duration
        .map_or(deadline, |d| start + Duration::from_secs_f64(d));
    for (i, q) in plan.trace.iter().enumerate() {
        let at = start + Duration::from_secs_f64(q.arrival_s);
        if at >= send_until.min(deadline) {
            if at >= deadline {
                not_sent = n - i;
            } else {
                held_back = n - i;
            }
            break;
        }
        sleep_until(at).await;
        let permit = match &slots {
            Some(s) => match timeout_at(deadline, s.clone().acquire_owned()).await {
                Ok(Ok(p)) => Some(p),
                _ => {
                    not_sent = n - i;
                    break;
                }
            },
            None => None,
        };
        // A slot freed by a request cancelled at the deadline sends nothing more.
        if Instant::now() >= deadline {
            not_sent = n - i;
            break;
        }
        if Instant::now() >= send_until {
            held_back = n - i;
            break;
        }
        let job = job.clone();
        let shared = job.shared_prefix;
        let body = job.body(i as u64, q.prompt_len, shared, q.output_len);
        tasks.spawn(async move {
            let _slot = permit;
            let mut retries = 0;
            // The send below takes its own first-send instant at once (no await before it).
            let send_s = start.elapsed().as_secs_f64();
            let out = match timeout_at(deadline, send(&job, body, &mut retries)).await {
                Ok(Ok(s)) => Outcome::Ok(s),
                Ok(Err(why)) => Outcome::Failed(why),
                Err(_) => Outcome::Cancelled,
            };
            (i, out, retries, send_s)
        });
    }
    let mut outcomes: Vec<Option<Outcome>> = (0..n).map(|_| None).collect();
    let mut retries = vec![0; n];
    let mut send_s = vec![0.0; n];
    // Each task ends by `deadline` (its timeout), so this loop does too.
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((i, o, k, t)) => {
                outcomes[i] = Some(o);
                retries[i] = k;
                send_s[i] = t;
            }
            Err(e) => return Err(LoadgenError::Server(format!("a request task failed: {e}"))),
        }
    }
    let duration_s = start.elapsed().as_secs_f64();
    let sent = n - not_sent - held_back;
    retries.truncate(sent);
    send_s.truncate(sent);
    Ok(Report {
        outcomes: outcomes
            .into_iter()
            .take(sent)
            .map(|o| o.unwrap_or(Outcome::Cancelled))
            .collect(),
        retries,
        send_s,
        not_sent,
        held_back,
        duration_s,
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    let go = || -> Result<(Value, bool), LoadgenError> {
        let plan = plan(&args)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()
            .map_err(|e| LoadgenError::Server(format!("tokio runtime: {e}")))?;
        let report = rt.block_on(async {
            let deadline = Instant::now() + Duration::from_secs_f64(args.max_duration);
            run(&args, &plan, deadline).await
        })?;
        let mut all_ok =
            report.not_sent == 0 && report.outcomes.iter().all(|o| matches!(o, Outcome::Ok(_)));
        // Before the report is printed, so that its line stays the last of the output.
        if let Err(e) = save_result(&report, &plan) {
            eprintln!("fl_loadgen: {e}");
            all_ok = false;
        }
        Ok((summarize(&report, &plan, &args), all_ok))
    };
    match go() {
        Ok((v, all_ok)) => {
            if args.json {
                println!("{v}");
            } else {
                print_table(&v);
            }
            if all_ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("fl_loadgen: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_parse_and_name_the_flag() {
        assert_eq!(
            parse_lens("--prompt-lens", "512").unwrap(),
            Lengths::Fixed(512)
        );
        assert_eq!(
            parse_lens("--output-lens", "16-1024").unwrap(),
            Lengths::Uniform { lo: 16, hi: 1024 }
        );
        for bad in ["", "0", "x", "9-3", "4-", "-4", "0-8"] {
            let e = parse_lens("--output-lens", bad).unwrap_err().to_string();
            assert!(e.starts_with("--output-lens: "), "{bad}: {e}");
        }
    }

    #[test]
    fn percentiles_are_nearest_rank_in_ms() {
        // 1..=100 ms: nearest rank gives the sample itself, no interpolation.
        let v: Vec<f64> = (1..=100).map(|x| f64::from(x) / 1e3).collect();
        let s = ms_summary(&v);
        assert_eq!(s["p50"], 50.0);
        assert_eq!(s["p90"], 90.0);
        assert_eq!(s["p99"], 99.0);
        assert_eq!(s["max"], 100.0);
        assert_eq!(s["mean"], 50.5);
        // Ten samples: p99 is the largest, p50 the fifth.
        let v: Vec<f64> = (1..=10).rev().map(|x| f64::from(x) / 1e3).collect();
        let s = ms_summary(&v);
        assert_eq!(
            (s["p50"].as_f64(), s["p99"].as_f64()),
            (Some(5.0), Some(10.0))
        );
        assert_eq!(ms_summary(&[]), Value::Null);
        // NaNs are left out, as fl_engine::trace::Percentiles leaves them.
        let p = Percentiles::of(&[3.0, f64::NAN]).unwrap();
        assert_eq!((p.p50, p.p99, p.max), (3.0, 3.0, 3.0));
        assert_eq!(Percentiles::of(&[f64::NAN]), None);
    }

    #[test]
    fn traces_match_fl_bench() {
        // fl_engine::trace::TraceSpec { requests: 4, prompt: 64-4096, output: 16-1024, .. }
        // with rate 2 / seed 7, then all at once / seed 1.
        let (p, o) = (
            Lengths::Uniform { lo: 64, hi: 4096 },
            Lengths::Uniform { lo: 16, hi: 1024 },
        );
        let want = [
            (0.4710225888786913, 2455, 600),
            (0.7408664217635922, 94, 925),
            (1.1205601249805628, 1263, 549),
            (1.5625428139736526, 1367, 495),
        ];
        let got: Vec<_> = make_trace(4, Some(2.0), p, o, 7)
            .iter()
            .map(|r| (r.arrival_s, r.prompt_len, r.output_len))
            .collect();
        assert_eq!(got, want);
        let got: Vec<_> = make_trace(4, None, p, o, 1)
            .iter()
            .map(|r| (r.arrival_s, r.prompt_len, r.output_len))
            .collect();
        assert_eq!(
            got,
            [
                (0.0, 2718, 403),
                (0.0, 3106, 829),
                (0.0, 524, 735),
                (0.0, 1234, 525)
            ]
        );
        // Poisson: the mean gap is 1 / rate (within 3% over 20k arrivals).
        let t = make_trace(20_000, Some(50.0), Lengths::Fixed(1), Lengths::Fixed(1), 3);
        let mean_gap = t.last().unwrap().arrival_s / t.len() as f64;
        assert!((mean_gap * 50.0 - 1.0).abs() < 0.03, "mean gap {mean_gap}");
    }

    #[test]
    fn sse_events_lines_done_and_comments() {
        let mut p = SseParser::default();
        let mut ev = vec![];
        p.push(
            b": ping\n\ndata: {\"a\":1}\n\nevent: x\ndata:{\"b\":2}\r\n\r\ndata: [DONE]\n\n",
            &mut ev,
        )
        .unwrap();
        assert_eq!(
            ev,
            vec![
                SseEvent::Data("{\"a\":1}".into()),
                SseEvent::Data("{\"b\":2}".into()),
                SseEvent::Done
            ]
        );
        // Two data lines make one event, joined by a newline.
        let mut ev = vec![];
        p.push(b"data: 1\ndata: 2\n\n", &mut ev).unwrap();
        assert_eq!(ev, vec![SseEvent::Data("1\n2".into())]);
    }

    #[test]
    fn sse_events_split_across_reads() {
        let stream =
            "data: {\"t\":\"h\u{e9}\"}\r\n\r\ndata: {\"t\":\"\u{4e16}\"}\n\ndata: [DONE]\n\n";
        let bytes = stream.as_bytes();
        let want = vec![
            SseEvent::Data("{\"t\":\"h\u{e9}\"}".into()),
            SseEvent::Data("{\"t\":\"\u{4e16}\"}".into()),
            SseEvent::Done,
        ];
        // Every split point (mid-line, mid-CRLF, mid-character), and one byte at a time.
        for cut in 0..=bytes.len() {
            let (mut p, mut ev) = (SseParser::default(), vec![]);
            p.push(&bytes[..cut], &mut ev).unwrap();
            p.push(&bytes[cut..], &mut ev).unwrap();
            p.finish(&mut ev).unwrap();
            assert_eq!(ev, want, "cut at {cut}");
        }
        let (mut p, mut ev) = (SseParser::default(), vec![]);
        for b in bytes {
            p.push(std::slice::from_ref(b), &mut ev).unwrap();
        }
        assert_eq!(ev, want);
        // A last event without its blank line counts when the body ends.
        let (mut p, mut ev) = (SseParser::default(), vec![]);
        p.push(b"data: [DONE]", &mut ev).unwrap();
        assert!(ev.is_empty());
        p.finish(&mut ev).unwrap();
        assert_eq!(ev, vec![SseEvent::Done]);
        // Not UTF-8.
        let mut p = SseParser::default();
        assert!(p.push(b"data: \xff\n", &mut vec![]).is_err());
    }

    #[test]
    fn completions_stream_metrics() {
        let mut s = StreamStats::default();
        let chunk =
            |t: &str| format!(r#"{{"choices":[{{"index":0,"text":"{t}","finish_reason":null}}]}}"#);
        s.on_data(&chunk("a"), 0.10, false).unwrap();
        s.on_data(&chunk(""), 0.12, false).unwrap(); // held back: not a content chunk
        s.on_data(&chunk("b"), 0.15, false).unwrap();
        s.on_data(&chunk("c"), 0.30, false).unwrap();
        s.on_data(
            r#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":4,"total_tokens":11}}"#,
            0.31,
            false,
        )
        .unwrap();
        s.done = true;
        let r = s.finish().unwrap();
        assert_eq!(r.ttft, 0.10);
        assert_eq!(r.e2e, 0.30);
        assert_eq!(r.itl.len(), 2);
        assert!((r.itl[0] - 0.05).abs() < 1e-12 && (r.itl[1] - 0.15).abs() < 1e-12);
        // Usage counts 4 tokens (one was held back and sent with the next chunk).
        assert_eq!(
            (r.output_tokens, r.prompt_tokens, r.usage_counted),
            (4, Some(7), true)
        );
        assert!((r.tpot.unwrap() - 0.20 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn chat_stream_ttft_skips_the_role_chunk_and_falls_back_to_chunks() {
        let mut s = StreamStats::default();
        s.on_data(
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
            0.01,
            true,
        )
        .unwrap();
        assert_eq!(s.first, None);
        s.on_data(
            r#"{"choices":[{"index":0,"delta":{"content":"Hi"}}],"usage":null}"#,
            0.2,
            true,
        )
        .unwrap();
        s.on_data(
            r#"{"choices":[{"index":0,"delta":{"content":"!"}}]}"#,
            0.3,
            true,
        )
        .unwrap();
        s.on_data(
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#,
            0.4,
            true,
        )
        .unwrap();
        s.done = true;
        let r = s.finish().unwrap();
        assert_eq!(
            (r.ttft, r.e2e, r.output_tokens, r.usage_counted),
            (0.2, 0.3, 2, false)
        );
        // A mid-stream error, a missing [DONE] and a stream without content all fail.
        let mut s = StreamStats::default();
        let e = s
            .on_data(r#"{"error":{"message":"boom","type":"x"}}"#, 0.1, true)
            .unwrap_err();
        assert_eq!(e, "stream error: boom");
        assert!(StreamStats::default()
            .finish()
            .unwrap_err()
            .contains("[DONE]"));
        let s = StreamStats {
            done: true,
            ..Default::default()
        };
        assert!(s.finish().unwrap_err().contains("no content"));
    }

    #[test]
    fn events_after_done_are_ignored() {
        let mut s = StreamStats::default();
        let mut ev = vec![
            SseEvent::Data(r#"{"choices":[{"text":"x"}]}"#.into()),
            SseEvent::Done,
            SseEvent::Data(r#"{"choices":[{"text":"y"}]}"#.into()),
        ];
        s.take(&mut ev, 0.5, false).unwrap();
        assert!(ev.is_empty());
        assert_eq!((s.content_chunks, s.done), (1, true));
    }

    #[test]
    fn http_failures_carry_status_and_openai_message() {
        let body = br#"{"error":{"message":"max_tokens must be at least 1","type":"invalid_request_error","param":"max_tokens","code":null}}"#;
        assert_eq!(
            http_failure(400, body),
            "HTTP 400: max_tokens must be at least 1"
        );
        assert_eq!(http_failure(503, b"busy\n"), "HTTP 503: busy");
    }

    #[test]
    fn only_loopback_targets() {
        for (url, want) in [
            ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
            ("http://localhost:8080/", "http://localhost:8080"),
            ("http://[::1]:8000/v1", "http://[::1]:8000"),
            ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000"),
        ] {
            assert_eq!(loopback_base(url).unwrap(), want, "{url}");
        }
        for bad in [
            "http://0.0.0.0:8000",
            "http://10.0.0.1:8000",
            "http://example.com",
            "http://127.0.0.1.example.com:80",
            "https://127.0.0.1:8000",
            "127.0.0.1:8000",
            "http://user@127.0.0.1:8000",
            "http://127.0.0.1:8000/?x=1",
            "not a url",
        ] {
            let e = loopback_base(bad).unwrap_err().to_string();
            assert!(e.starts_with("--base-url: "), "{bad}: {e}");
        }
    }

    #[test]
    fn prompts_are_seeded_and_share_exactly_the_prefix() {
        let ids = |stream, len, shared| -> Vec<u64> {
            prompt_value(Mode::Ids { vocab: 100 }, 7, stream, len, shared)
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect()
        };
        let (a, b) = (ids(0, 40, 16), ids(1, 30, 16));
        assert_eq!((a.len(), b.len()), (40, 30));
        assert!(a.iter().chain(&b).all(|&x| (3..100).contains(&x)));
        assert_eq!(a[..16], b[..16]);
        assert_ne!(a[16..26], b[16..26]);
        assert_eq!(a, ids(0, 40, 16));
        assert_ne!(ids(0, 40, 0)[..16], a[..16]);
        let text = prompt_value(Mode::Text, 7, 3, 12, 4);
        assert_eq!(text.as_str().unwrap().split(' ').count(), 12);
    }

    #[test]
    fn request_bodies() {
        let (client, fresh) = clients(HttpConnector::new());
        let job = Job {
            client,
            fresh,
            deadline: Instant::now() + Duration::from_secs(20),
            uri: Uri::from_static("http://127.0.0.1:1/v1/completions"),
            auth: None,
            model: "m".into(),
            mode: Mode::Ids { vocab: 50 },
            temperature: 0.0,
            seed: 1,
            shared_prefix: 0,
        };
        let v: Value = serde_json::from_slice(&job.body(2, 5, 0, 9)).unwrap();
        assert_eq!(v["prompt"].as_array().unwrap().len(), 5);
        assert_eq!(
            (v["max_tokens"].as_u64(), v["ignore_eos"].as_bool()),
            (Some(9), Some(true))
        );
        assert_eq!(v["stream_options"]["include_usage"], true);
        let chat = Job {
            mode: Mode::Chat,
            ..job
        };
        let v: Value = serde_json::from_slice(&chat.body(2, 5, 0, 9)).unwrap();
        assert_eq!(v["messages"][0]["role"], "user");
        assert_eq!(
            v["messages"][0]["content"]
                .as_str()
                .unwrap()
                .split(' ')
                .count(),
            5
        );
        assert!(v.get("prompt").is_none());
    }

    fn embed_job() -> Job {
        let (client, fresh) = clients(HttpConnector::new());
        Job {
            client,
            fresh,
            deadline: Instant::now() + Duration::from_secs(20),
            uri: Uri::from_static("http://127.0.0.1:1/v1/embeddings"),
            auth: None,
            model: "m".into(),
            mode: Mode::Embed {
                vocab: 100,
                inputs: 3,
            },
            temperature: 0.0,
            seed: 1,
            shared_prefix: 0,
        }
    }

    #[test]
    fn embeddings_bodies_carry_one_id_list_per_input() {
        let job = embed_job();
        let v: Value = serde_json::from_slice(&job.body(4, 7, 0, 99)).unwrap();
        let input = v["input"].as_array().unwrap();
        assert_eq!(input.len(), 3);
        assert!(input.iter().all(|x| x.as_array().unwrap().len() == 7));
        assert_ne!(input[0], input[1], "inputs of one request draw apart");
        assert!(v.get("max_tokens").is_none() && v.get("stream").is_none());
        let again: Value = serde_json::from_slice(&job.body(4, 7, 0, 99)).unwrap();
        assert_eq!(v, again, "seeded");
        assert_eq!(job.mode.path(), "/v1/embeddings");
    }

    #[test]
    fn embeddings_answers_are_checked() {
        let ok = br#"{"data":[{"embedding":[0.1,0.2]},{"embedding":"AAAA"}],"usage":{"prompt_tokens":14}}"#;
        let s = embed_sample(ok, 0.25, 2).unwrap();
        assert_eq!((s.e2e, s.ttft, s.prompt_tokens), (0.25, 0.25, Some(14)));
        assert_eq!((s.output_tokens, s.tpot), (0, None));
        let e = embed_sample(ok, 0.1, 3).unwrap_err();
        assert!(e.contains("2 embeddings for 3 inputs"), "{e}");
        let empty = br#"{"data":[{"embedding":[]}]}"#;
        assert!(embed_sample(empty, 0.1, 1).unwrap_err().contains("data[0]"));
        assert!(embed_sample(b"{}", 0.1, 1).is_err());
        assert!(embed_sample(b"not json", 0.1, 1).is_err());
    }

    /// A loopback embeddings server: HTTP/1.1 keep-alive, one embedding of 4 floats per input,
    /// `usage.prompt_tokens` = the ids sent. Answers until the test ends.
    async fn fake_embedding_server() -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        // Headers, then Content-Length bytes of body.
                        let end = loop {
                            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                break p + 4;
                            }
                            let mut chunk = [0u8; 4096];
                            match sock.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        };
                        let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse().unwrap_or(0));
                        while buf.len() < end + len {
                            let mut chunk = [0u8; 4096];
                            match sock.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        let body: Value =
                            serde_json::from_slice(&buf[end..end + len]).unwrap_or_default();
                        buf.drain(..end + len);
                        let inputs = body["input"].as_array().cloned().unwrap_or_default();
                        let tokens: usize = inputs
                            .iter()
                            .map(|i| i.as_array().map_or(0, Vec::len))
                            .sum();
                        let data: Vec<Value> = (0..inputs.len())
                            .map(|i| json!({"object": "embedding", "index": i, "embedding": [0.5, 0.5, 0.5, 0.5]}))
                            .collect();
                        let answer = json!({"object": "list", "data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}).to_string();
                        let resp = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
                            answer.len()
                        );
                        if sock.write_all(resp.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        format!("http://{addr}")
    }

    /// `fl_loadgen --embeddings --base-url URL --model m ARGS` against a fresh loopback
    /// embedding server (bounded at 20 s): the plan, the report's JSON and the run's time.
    fn run_against_fake_embeddings(args: &[&str]) -> (Plan, Value, Duration) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let url = rt.block_on(fake_embedding_server());
        let base = [
            "fl_loadgen",
            "--embeddings",
            "--base-url",
            &url,
            "--model",
            "m",
        ];
        let a = Args::parse_from(base.iter().chain(args));
        let p = plan(&a).unwrap();
        let t0 = Instant::now();
        let report = rt
            .block_on(run(&a, &p, Instant::now() + Duration::from_secs(20)))
            .unwrap();
        let v = summarize(&report, &p, &a);
        (p, v, t0.elapsed())
    }

    #[test]
    fn an_embeddings_run_against_a_loopback_server() {
        let (p, v, _) = run_against_fake_embeddings(&[
            "--num-prompts",
            "24",
            "--inputs-per-request",
            "3",
            "--prompt-lens",
            "5-9",
            "--concurrency",
            "4",
            "--max-duration",
            "20",
        ]);
        assert_eq!(v["completed"], 24, "{v}");
        assert_eq!(
            (v["failed"].as_u64(), v["not_sent"].as_u64()),
            (Some(0), Some(0))
        );
        let want: usize = p.trace.iter().map(|q| 3 * q.prompt_len).sum();
        assert_eq!(v["input_tokens"].as_u64(), Some(want as u64));
        assert_eq!(v["prompt_tokens_mismatch"], 0);
        assert!(v["input_throughput"].as_f64().unwrap() > 0.0);
        assert!(v["e2e_ms"]["p50"].as_f64().unwrap() > 0.0);
    }

    #[test]
    fn send_duration_holds_back_the_rest_and_lets_requests_in_flight_finish() {
        // 400 arrivals at 40/s span ~10 s; sending stops after 0.5 s.
        let (_, v, took) = run_against_fake_embeddings(&[
            "--num-prompts",
            "400",
            "--rate",
            "40",
            "--prompt-lens",
            "5",
            "--send-duration",
            "0.5",
            "--max-duration",
            "20",
        ]);
        assert!(took < Duration::from_secs(10), "did not stop sending");
        let (done, held) = (
            v["completed"].as_u64().unwrap(),
            v["held_back"].as_u64().unwrap(),
        );
        assert!(done > 0 && held > 0 && done + held == 400, "{v}");
        assert_eq!(
            (
                v["failed"].as_u64(),
                v["cancelled"].as_u64(),
                v["not_sent"].as_u64()
            ),
            (Some(0), Some(0), Some(0)),
            "{v}"
        );
    }

    #[test]
    fn plan_checks_arguments() {
        let base = Args::parse_from(["fl_loadgen"]);
        assert!(plan(&base).is_ok());
        let bad = |extra: &[&str], arg: &str| {
            let a = Args::parse_from(std::iter::once("fl_loadgen").chain(extra.iter().copied()));
            let e = plan(&a).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.starts_with(arg), "{extra:?}: {e}");
        };
        bad(&["--shared-prefix", "512"], "--shared-prefix");
        bad(
            &["--prompt-lens", "600-900", "--shared-prefix", "600"],
            "--shared-prefix",
        );
        bad(&["--rate", "0"], "--rate");
        bad(&["--num-prompts", "0"], "--num-prompts");
        bad(&["--concurrency", "0"], "--concurrency");
        bad(&["--max-duration", "0"], "--max-duration");
        bad(&["--send-duration", "0"], "--send-duration");
        bad(
            &["--send-duration", "60", "--max-duration", "60"],
            "--send-duration",
        );
        bad(&["--vocab-size", "3"], "--vocab-size");
        bad(&["--base-url", "http://192.168.1.2:8000"], "--base-url");
        bad(
            &["--embeddings", "--inputs-per-request", "0"],
            "--inputs-per-request",
        );
        assert!(Args::try_parse_from(["fl_loadgen", "--embeddings", "--chat"]).is_err());
        let a = Args::parse_from([
            "fl_loadgen",
            "--rate",
            "4",
            "--num-prompts",
            "50",
            "--seed",
            "3",
        ]);
        let p = plan(&a).unwrap();
        assert_eq!(p.trace.len(), 50);
        assert!(p.trace.windows(2).all(|w| w[0].arrival_s <= w[1].arrival_s));
        assert!(p.trace[49].arrival_s > 0.0);
    }

    /// What the scripted server does with one request.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Reply {
        /// A streamed completion of 2 tokens ("a", "b", usage, [DONE]); the connection stays.
        Stream,
        /// Closes the connection without answering (as a server closing a keep-alive one).
        Close,
        /// HTTP 500 with an OpenAI error body.
        Error500,
        /// A 200 head and one chunk of a longer body, then the connection closes.
        Truncated,
        /// A 200 head and one chunk of a longer body, then nothing for 5 s (the connection
        /// stays open).
        Stall,
    }

    /// Counts of the scripted server: connections accepted, requests read.
    #[derive(Default)]
    struct Seen {
        conns: std::sync::atomic::AtomicUsize,
        requests: std::sync::atomic::AtomicUsize,
    }

    impl Seen {
        fn get(&self) -> (usize, usize) {
            use std::sync::atomic::Ordering::SeqCst;
            (self.conns.load(SeqCst), self.requests.load(SeqCst))
        }
    }

    /// Reads one request (head, then Content-Length bytes of body) from `sock` into `buf`,
    /// leaving what follows it; its body, or `None` when the peer closes, errs or is silent
    /// for 5 s.
    async fn read_request(sock: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
        use tokio::io::AsyncReadExt;
        let give_up = Instant::now() + Duration::from_secs(5);
        let mut read_more = async |buf: &mut Vec<u8>| -> Option<()> {
            let mut chunk = [0u8; 4096];
            match timeout_at(give_up, sock.read(&mut chunk)).await {
                Ok(Ok(n)) if n > 0 => {
                    buf.extend_from_slice(&chunk[..n]);
                    Some(())
                }
                _ => None,
            }
        };
        // Each read adds at least a byte and a request here is well under 1 MiB.
        let end = loop {
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
            if buf.len() > MAX_SMALL_BODY {
                return None;
            }
            read_more(buf).await?;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap_or(0));
        if len > MAX_SMALL_BODY {
            return None;
        }
        while buf.len() < end + len {
            read_more(buf).await?;
        }
        let body = buf[end..end + len].to_vec();
        buf.drain(..end + len);
        Some(body)
    }

    /// A loopback /v1/completions server that closes the first `drop_on_accept` connections
    /// as soon as it accepts them, then answers request `k` (counting every request it read,
    /// from 0) as `script(k)` says. It accepts at most 32 connections and reads at most 64
    /// requests on each, every accept bounded by 20 s and every read by 5 s.
    async fn scripted_server(
        drop_on_accept: usize,
        script: fn(usize) -> Reply,
    ) -> (String, Arc<Seen>) {
        use std::sync::atomic::Ordering::SeqCst;
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Seen::default());
        let counts = seen.clone();
        tokio::spawn(async move {
            for c in 0..32 {
                let accepted =
                    timeout_at(Instant::now() + Duration::from_secs(20), listener.accept());
                let Ok(Ok((mut sock, _))) = accepted.await else {
                    return;
                };
                counts.conns.fetch_add(1, SeqCst);
                if c < drop_on_accept {
                    drop(sock);
                    continue;
                }
                let counts = counts.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    for _ in 0..64 {
                        if read_request(&mut sock, &mut buf).await.is_none() {
                            return;
                        }
                        let k = counts.requests.fetch_add(1, SeqCst);
                        let answer = match script(k) {
                            Reply::Close => return,
                            Reply::Stream => {
                                let body = concat!(
                                    "data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n",
                                    "data: {\"choices\":[{\"index\":0,\"text\":\"b\"}]}\n\n",
                                    "data: {\"choices\":[],\"usage\":{\"completion_tokens\":2}}\n\n",
                                    "data: [DONE]\n\n",
                                );
                                format!(
                                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{body}",
                                    body.len()
                                )
                            }
                            Reply::Error500 => {
                                let body = r#"{"error":{"message":"kaput","type":"server_error"}}"#;
                                format!(
                                    "HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                                    body.len()
                                )
                            }
                            Reply::Truncated => {
                                let _ = sock
                                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 4096\r\n\r\ndata: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n")
                                    .await;
                                return;
                            }
                            Reply::Stall => {
                                let _ = sock
                                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 4096\r\n\r\ndata: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n")
                                    .await;
                                tokio::time::sleep(Duration::from_secs(5)).await;
                                return;
                            }
                        };
                        if sock.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (format!("http://{addr}"), seen)
    }

    /// `fl_loadgen --base-url URL --model m --concurrency 1 --prompt-lens 4 --output-lens 2
    /// ARGS` against a fresh scripted server (bounded at 20 s): the report's JSON and what the
    /// server saw. The warm-up is the server's request 0.
    fn run_against_script(script: fn(usize) -> Reply, args: &[&str]) -> (Value, (usize, usize)) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (url, seen) = rt.block_on(scripted_server(0, script));
        let base = [
            "fl_loadgen",
            "--base-url",
            &url,
            "--model",
            "m",
            "--concurrency",
            "1",
            "--prompt-lens",
            "4",
            "--output-lens",
            "2",
            "--max-duration",
            "20",
        ];
        let a = Args::parse_from(base.iter().chain(args));
        let p = plan(&a).unwrap();
        let report = rt
            .block_on(run(&a, &p, Instant::now() + Duration::from_secs(20)))
            .unwrap();
        (summarize(&report, &p, &a), seen.get())
    }

    /// One 4-token prompt for 2 tokens to `url`, retries ending `deadline` from now (the whole
    /// call bounded by 20 s): its sample or error, and its retries.
    async fn send_one(url: &str, deadline: Duration) -> (Result<Sample, String>, u32) {
        let job = job_for(url, Instant::now() + deadline);
        let mut retries = 0;
        let r = timeout_at(
            Instant::now() + Duration::from_secs(20),
            send(&job, job.body(0, 4, 0, 2), &mut retries),
        )
        .await
        .expect("a bounded send");
        (r, retries)
    }

    /// The report's completed, failed, retried and retries counts.
    fn outcome(v: &Value) -> [u64; 4] {
        ["completed", "failed", "retried", "retries"].map(|k| v[k].as_u64().unwrap_or(u64::MAX))
    }

    /// A completions job for `url` whose retries end at `deadline`.
    fn job_for(url: &str, deadline: Instant) -> Job {
        let (client, fresh) = clients(HttpConnector::new());
        Job {
            client,
            fresh,
            deadline,
            uri: format!("{url}/v1/completions").parse().unwrap(),
            auth: None,
            model: "m".into(),
            mode: Mode::Ids { vocab: 100 },
            temperature: 0.0,
            seed: 1,
            shared_prefix: 0,
        }
    }

    #[test]
    fn a_connection_closed_before_the_answer_is_retried_and_timed_from_the_first_send() {
        // Request 1 (the trace's first, after the warm-up) is read and its connection closed.
        let (v, (_, requests)) = run_against_script(
            |k| if k == 1 { Reply::Close } else { Reply::Stream },
            &["--num-prompts", "3"],
        );
        assert_eq!(outcome(&v), [3, 0, 1, 1], "{v}");
        assert_eq!(requests, 5, "warm-up, 3 requests and 1 retry");
        assert_eq!(v["errors"], json!({}));
        // The retried request waited 20 ms before its second send: TTFT and E2E include it.
        for k in ["ttft_ms", "e2e_ms"] {
            assert!(v[k]["max"].as_f64().unwrap() >= 20.0, "{k}: {v}");
        }
    }

    #[test]
    fn connections_dropped_on_accept_are_retried_on_fresh_ones() {
        runtime().block_on(async {
            let (url, seen) = scripted_server(2, |_| Reply::Stream).await;
            let (s, retries) = send_one(&url, Duration::from_secs(20)).await;
            let s = s.unwrap();
            assert_eq!((s.output_tokens, retries), (2, 2));
            assert_eq!(seen.get(), (3, 1), "3 connections, 1 request answered");
            assert!(s.e2e >= 0.12, "timed from the first send: {}", s.e2e);
        });
    }

    #[test]
    fn a_server_that_always_closes_fails_after_three_attempts() {
        let (v, (_, requests)) = run_against_script(
            |k| if k == 0 { Reply::Stream } else { Reply::Close },
            &["--num-prompts", "1"],
        );
        assert_eq!(outcome(&v), [0, 1, 1, 2], "{v}");
        assert_eq!(requests, 4, "warm-up and 3 attempts");
        let errors = v["errors"].as_object().unwrap();
        assert_eq!(errors.len(), 1, "{v}");
        let (why, n) = errors.iter().next().unwrap();
        assert_eq!(n, 1);
        assert!(
            why.starts_with("connection: ") && why.ends_with(" (3 attempts)"),
            "{why}"
        );
    }

    #[test]
    fn http_errors_and_failures_mid_stream_are_not_retried() {
        let (v, (_, requests)) = run_against_script(
            |k| match k {
                1 => Reply::Error500,
                2 => Reply::Truncated,
                _ => Reply::Stream,
            },
            &["--num-prompts", "3"],
        );
        assert_eq!(outcome(&v), [1, 2, 0, 0], "{v}");
        assert_eq!(requests, 4, "warm-up and 3 requests, none sent again");
        assert_eq!(v["errors"]["HTTP 500: kaput"], 1, "{v}");
        let errors = v["errors"].as_object().unwrap();
        assert!(errors.keys().any(|k| k.starts_with("stream: ")), "{v}");
    }

    #[test]
    fn no_retry_starts_past_the_deadline() {
        runtime().block_on(async {
            let (url, seen) = scripted_server(0, |_| Reply::Close).await;
            // The first retry (20 ms after a failure within 90 ms) starts before the deadline;
            // the second (100 ms later still) would not.
            let (e, retries) = send_one(&url, Duration::from_millis(110)).await;
            let e = e.unwrap_err();
            assert_eq!(retries, 1, "{e}");
            assert!(
                e.starts_with("connection: ") && e.ends_with(" (2 attempts)"),
                "{e}"
            );
            assert_eq!(seen.get().1, 2);
            // A refused connection (nothing listens) is retried the same way.
            let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}", closed.local_addr().unwrap());
            drop(closed);
            let (e, retries) = send_one(&url, Duration::from_secs(20)).await;
            let e = e.unwrap_err();
            assert_eq!(retries, 2, "{e}");
            assert!(e.ends_with(" (3 attempts)"), "{e}");
        });
    }

    /// A loopback /v1/completions server that streams each request's `max_tokens` (at most 64)
    /// one-token chunks 1 to 3 ms apart, then a usage chunk (the prompt's ids and the chunks
    /// sent) and [DONE]. HTTP/1.1 keep-alive; it accepts at most 32 connections and answers at
    /// most 64 requests on each, every accept bounded by 20 s and every read by 5 s.
    async fn paced_server() -> String {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            for _ in 0..32 {
                let accepted =
                    timeout_at(Instant::now() + Duration::from_secs(20), listener.accept());
                let Ok(Ok((mut sock, _))) = accepted.await else {
                    return;
                };
                // Each chunk goes out as it is written, as a streaming server's do.
                sock.set_nodelay(true).unwrap();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    for _ in 0..64 {
                        let Some(body) = read_request(&mut sock, &mut buf).await else {
                            return;
                        };
                        let req: Value = serde_json::from_slice(&body).unwrap_or_default();
                        let n = req["max_tokens"].as_u64().unwrap_or(1).clamp(1, 64) as usize;
                        let prompt = req["prompt"].as_array().map_or(0, Vec::len);
                        let mut events: Vec<String> = (0..n)
                            .map(|j| {
                                format!(
                                    "data: {{\"choices\":[{{\"index\":0,\"text\":\"t{j}\"}}]}}\n\n"
                                )
                            })
                            .collect();
                        events.push(format!(
                            "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt},\"completion_tokens\":{n}}}}}\n\n"
                        ));
                        events.push("data: [DONE]\n\n".into());
                        let len: usize = events.iter().map(String::len).sum();
                        let head = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {len}\r\n\r\n"
                        );
                        if sock.write_all(head.as_bytes()).await.is_err() {
                            return;
                        }
                        for (j, ev) in events.iter().enumerate() {
                            if (1..=n).contains(&j) {
                                let gap = 1 + j as u64 % 3;
                                tokio::time::sleep(Duration::from_millis(gap)).await;
                            }
                            if sock.write_all(ev.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        format!("http://{addr}")
    }

    /// A path in the temp directory named for this process and `name`, removed when dropped.
    struct TempPath(PathBuf);

    impl TempPath {
        fn new(name: &str) -> Self {
            let file = format!("fl_loadgen-test-{}-{name}", std::process::id());
            TempPath(std::env::temp_dir().join(file))
        }

        fn arg(&self) -> &str {
            self.0.to_str().unwrap()
        }
    }

    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// `fl_loadgen --base-url URL --model m --max-duration SECS ARGS --save-result FILE` on
    /// `rt`, the run bounded at `secs`, then the file written as `main` writes it: the plan,
    /// the report's JSON and the file's lines, parsed.
    fn run_saving(
        rt: &tokio::runtime::Runtime,
        url: &str,
        secs: &str,
        args: &[&str],
        name: &str,
    ) -> (Plan, Value, Vec<Value>) {
        let file = TempPath::new(name);
        let base = [
            "fl_loadgen",
            "--base-url",
            url,
            "--model",
            "m",
            "--max-duration",
            secs,
            "--save-result",
            file.arg(),
        ];
        let a = Args::parse_from(base.iter().chain(args));
        let p = plan(&a).unwrap();
        // Created (empty) before the run.
        assert_eq!(std::fs::metadata(&file.0).unwrap().len(), 0);
        let deadline = Instant::now() + Duration::from_secs_f64(a.max_duration);
        let report = rt.block_on(run(&a, &p, deadline)).unwrap();
        let v = summarize(&report, &p, &a);
        save_result(&report, &p).unwrap();
        let text = std::fs::read_to_string(&file.0).unwrap();
        assert!(text.is_empty() || text.ends_with('\n'));
        let lines = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (p, v, lines)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    /// Nearest-rank p50 / p90 / p99 / max of saved ms values, as the report gives them.
    fn saved_summary(ms_values: &[f64]) -> [f64; 4] {
        let p = Percentiles::of(ms_values).unwrap();
        [p.p50, p.p90, p.p99, p.max]
    }

    fn report_summary(v: &Value) -> [f64; 4] {
        ["p50", "p90", "p99", "max"].map(|k| v[k].as_f64().unwrap())
    }

    #[test]
    fn save_result_keeps_each_requests_itl_gaps_as_the_report_pools_them() {
        let rt = runtime();
        let url = rt.block_on(paced_server());
        let (p, v, lines) = run_saving(
            &rt,
            &url,
            "20",
            &[
                "--num-prompts",
                "12",
                "--concurrency",
                "4",
                "--prompt-lens",
                "4",
                "--output-lens",
                "1-9",
            ],
            "paced.jsonl",
        );
        assert_eq!(
            (v["completed"].as_u64(), v["failed"].as_u64()),
            (Some(12), Some(0)),
            "{v}"
        );
        assert_eq!(lines.len(), 12);
        for l in &lines {
            let keys: Vec<&str> = l.as_object().unwrap().keys().map(String::as_str).collect();
            let mut want = [
                "index",
                "prompt_tokens",
                "max_tokens",
                "send_s",
                "ok",
                "error",
                "ttft_ms",
                "itl_ms",
                "e2e_ms",
                "output_tokens",
                "retries",
            ];
            want.sort_unstable();
            let mut keys = keys;
            keys.sort_unstable();
            assert_eq!(keys, want, "{l}");
        }
        let (mut itl, mut ttft, mut e2e, mut output) = (vec![], vec![], vec![], 0);
        for (i, (l, q)) in lines.iter().zip(&p.trace).enumerate() {
            assert_eq!(l["index"], i, "{l}");
            assert_eq!(l["prompt_tokens"], 4, "{l}");
            assert_eq!(l["max_tokens"], q.output_len, "{l}");
            assert_eq!(
                (l["ok"].as_bool(), l["error"].is_null()),
                (Some(true), true),
                "{l}"
            );
            assert_eq!(l["retries"], 0, "{l}");
            let n = l["output_tokens"].as_u64().unwrap() as usize;
            assert_eq!(n, q.output_len, "{l}");
            let gaps: Vec<f64> = l["itl_ms"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            assert_eq!(gaps.len(), n - 1, "{l}");
            assert!(gaps.iter().all(|&g| g >= 0.0), "{l}");
            let (t, e) = (
                l["ttft_ms"].as_f64().unwrap(),
                l["e2e_ms"].as_f64().unwrap(),
            );
            assert!(t > 0.0 && e >= t, "{l}");
            // E2E is TTFT plus the gaps (each rounded to the microsecond).
            let sum = t + gaps.iter().sum::<f64>();
            assert!((sum - e).abs() < 0.001 * (n + 1) as f64, "{l}");
            let s = l["send_s"].as_f64().unwrap();
            assert!((0.0..20.0).contains(&s), "{l}");
            itl.extend(gaps);
            ttft.push(t);
            e2e.push(e);
            output += n;
        }
        assert!(
            p.trace.iter().any(|q| q.output_len == 1),
            "a one-token request"
        );
        assert_eq!(v["output_tokens"], output);
        // The server waits 1 to 3 ms before each content chunk after the first.
        assert!(itl.iter().any(|&g| g > 0.0), "{itl:?}");
        // Nearest-rank percentiles of the saved values are the report's, to the microsecond.
        assert_eq!(saved_summary(&itl), report_summary(&v["itl_ms"]));
        assert_eq!(saved_summary(&ttft), report_summary(&v["ttft_ms"]));
        assert_eq!(saved_summary(&e2e), report_summary(&v["e2e_ms"]));
        let mean = itl.iter().sum::<f64>() / itl.len() as f64;
        assert!((mean - v["itl_ms"]["mean"].as_f64().unwrap()).abs() < 0.001);
        // Four clients: the last request waited for a slot.
        let send = |i: usize| lines[i]["send_s"].as_f64().unwrap();
        assert!(send(11) > send(0));
    }

    #[test]
    fn save_result_keeps_failed_and_cancelled_requests_but_not_unsent_ones() {
        let rt = runtime();
        // Server request 0 is the warm-up; the trace's requests are 1, 2, 3, ...
        let (url, _) = rt.block_on(scripted_server(0, |k| match k {
            2 => Reply::Error500,
            3 => Reply::Stall,
            _ => Reply::Stream,
        }));
        let (_, v, lines) = run_saving(
            &rt,
            &url,
            "1.5",
            &[
                "--num-prompts",
                "5",
                "--concurrency",
                "1",
                "--prompt-lens",
                "4",
                "--output-lens",
                "2",
            ],
            "failures.jsonl",
        );
        assert_eq!(
            (
                v["completed"].as_u64(),
                v["failed"].as_u64(),
                v["cancelled"].as_u64(),
                v["not_sent"].as_u64()
            ),
            (Some(1), Some(1), Some(1), Some(2)),
            "{v}"
        );
        assert_eq!(lines.len(), 3, "the 2 requests never sent are not written");
        let (ok, failed, cancelled) = (&lines[0], &lines[1], &lines[2]);
        assert_eq!(
            (ok["ok"].as_bool(), ok["output_tokens"].as_u64()),
            (Some(true), Some(2))
        );
        assert_eq!(ok["itl_ms"].as_array().unwrap().len(), 1, "{ok}");
        assert_eq!(failed["error"], "HTTP 500: kaput", "{failed}");
        assert_eq!(cancelled["error"], "cancelled", "{cancelled}");
        for (i, l) in [(1, failed), (2, cancelled)] {
            assert_eq!(l["index"], i, "{l}");
            assert_eq!(l["ok"], false, "{l}");
            assert!(l["ttft_ms"].is_null() && l["e2e_ms"].is_null(), "{l}");
            assert_eq!(l["itl_ms"], json!([]), "{l}");
            assert_eq!(
                (l["output_tokens"].as_u64(), l["retries"].as_u64()),
                (Some(0), Some(0)),
                "{l}"
            );
            assert_eq!(l["max_tokens"], 2, "{l}");
        }
        // Concurrency 1: each was sent once the one before it had ended.
        let send = |l: &Value| l["send_s"].as_f64().unwrap();
        assert!(send(ok) <= send(failed) && send(failed) <= send(cancelled));
        assert!(send(cancelled) < 1.5);
    }

    #[test]
    fn save_result_of_an_embeddings_run_has_no_itl_gaps() {
        let rt = runtime();
        let url = rt.block_on(fake_embedding_server());
        let (p, v, lines) = run_saving(
            &rt,
            &url,
            "20",
            &[
                "--embeddings",
                "--num-prompts",
                "6",
                "--inputs-per-request",
                "3",
                "--prompt-lens",
                "5-9",
                "--concurrency",
                "2",
            ],
            "embed.jsonl",
        );
        assert_eq!(v["completed"], 6, "{v}");
        assert_eq!(lines.len(), 6);
        let mut e2e = vec![];
        for (l, q) in lines.iter().zip(&p.trace) {
            assert_eq!(l["ok"], true, "{l}");
            assert_eq!(l["prompt_tokens"], 3 * q.prompt_len, "{l}");
            assert!(l["max_tokens"].is_null(), "{l}");
            assert_eq!(l["itl_ms"], json!([]), "{l}");
            assert_eq!(l["output_tokens"], 0, "{l}");
            assert_eq!(l["ttft_ms"], l["e2e_ms"], "{l}");
            e2e.push(l["e2e_ms"].as_f64().unwrap());
        }
        assert_eq!(saved_summary(&e2e), report_summary(&v["e2e_ms"]));
    }

    #[test]
    fn save_result_refuses_a_path_it_cannot_create_before_the_run() {
        let dir = std::env::temp_dir();
        let missing = TempPath::new("no-such-dir");
        let inside = missing.0.join("requests.jsonl");
        for path in [dir.as_path(), inside.as_path()] {
            let path = path.to_str().unwrap();
            let a = Args::parse_from(["fl_loadgen", "--save-result", path]);
            let e = plan(&a).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(
                e.starts_with("--save-result: cannot create `"),
                "{path}: {e}"
            );
            assert!(e.contains(path), "{e}");
        }
        // A file that can be made is made (empty) by the argument check, and only when every
        // other argument is good.
        let file = TempPath::new("early.jsonl");
        std::fs::write(&file.0, "old\n").unwrap();
        let a = Args::parse_from(["fl_loadgen", "--rate", "0", "--save-result", file.arg()]);
        assert!(plan(&a).is_err());
        assert_eq!(std::fs::read_to_string(&file.0).unwrap(), "old\n");
        let a = Args::parse_from(["fl_loadgen", "--save-result", file.arg()]);
        assert!(plan(&a).unwrap().save.is_some());
        assert_eq!(std::fs::metadata(&file.0).unwrap().len(), 0);
    }
}
