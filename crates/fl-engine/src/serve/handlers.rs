//! The route handlers and a request's life: prompt -> [`Service`] -> text -> JSON or SSE.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use fl_sampling::SamplingParams;
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::openai::{
    self, ApiError, BeamSearch, Choice, Endpoint, GenParams, Prompt, ResponseMeta, TokenLogprob,
    TokenizeRequest,
};
use super::text::{Decode, IdText, OutputText};
use super::{AppState, ModelInfo, Ready};
use crate::beam::BeamParams;
use crate::chat_template::ChatTemplateError;
use crate::runner::TokenLogprobs;
use crate::scheduler::{FinishReason, RequestError, RequestId, RequestParams, Usage};
use crate::service::{Service, ServiceError, StreamEvent};

type St = State<Arc<AppState>>;
type BodyBytes = Result<Bytes, BytesRejection>;

/// Seconds a client is told to wait before retrying a 503.
const RETRY_AFTER_S: u64 = 1;

fn count(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}

/// The model, or 503 while it loads.
fn ready(st: &AppState) -> Result<&Ready, ApiError> {
    st.ready
        .get()
        .ok_or_else(|| ApiError::unavailable("the model is loading; retry shortly", RETRY_AFTER_S))
}

/// The body bytes, or the error for a body that could not be read.
fn body_bytes(st: &AppState, body: BodyBytes) -> Result<Bytes, ApiError> {
    body.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(st.cfg.max_body_bytes)
        } else {
            ApiError::bad_request(format!("cannot read the request body: {}", r.body_text()))
        }
    })
}

fn check_model(st: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(m) if m != st.cfg.model_name => Err(ApiError::model_not_found(m, &st.cfg.model_name)),
        _ => Ok(()),
    }
}

/// Counts a request that got `e` instead of a normal finish.
fn count_failure(m: &super::metrics::Metrics, e: &ApiError) {
    let f = &m.failures;
    match e.status {
        StatusCode::SERVICE_UNAVAILABLE => count(&f.overloaded),
        s if s.is_client_error() => count(&f.invalid),
        _ => count(&f.error),
    }
}

/// Counts a refused request and answers it.
fn refuse(st: &AppState, e: ApiError) -> Response {
    count_failure(&st.metrics, &e);
    e.into_response()
}

fn json_response(v: &Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

/// Requires the bearer token on the routes it wraps, when an API key is set.
pub(super) async fn auth(State(st): St, req: Request, next: Next) -> Response {
    if let Some(key) = &st.cfg.api_key {
        let token = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if !token.is_some_and(|t| same(t.as_bytes(), key.as_bytes())) {
            return refuse(&st, ApiError::unauthorized());
        }
    }
    next.run(req).await
}

/// Compares in time independent of where the inputs differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub(super) async fn not_found(method: Method, uri: Uri) -> Response {
    ApiError::no_route(method.as_str(), uri.path()).into_response()
}

/// 200 once the model serves, 503 while it loads or after its worker stopped.
pub(super) async fn health(State(st): St) -> Response {
    let (status, what) = match st.ready.get() {
        None => (StatusCode::SERVICE_UNAVAILABLE, "loading"),
        Some(r) if !r.service.is_running() => (StatusCode::SERVICE_UNAVAILABLE, "stopped"),
        Some(_) => (StatusCode::OK, "ready"),
    };
    let mut r = (status, json_response(&json!({ "status": what }))).into_response();
    if status != StatusCode::OK {
        r.headers_mut()
            .insert(header::RETRY_AFTER, RETRY_AFTER_S.into());
    }
    r
}

pub(super) async fn metrics(State(st): St) -> Response {
    let stats = st.ready.get().map(|r| r.service.stats());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        st.metrics.render(stats),
    )
        .into_response()
}

pub(super) async fn models(State(st): St) -> Response {
    let r = match ready(&st) {
        Ok(r) => r,
        Err(e) => return refuse(&st, e),
    };
    json_response(&json!({
        "object": "list",
        "data": [{
            "id": st.cfg.model_name,
            "object": "model",
            "created": st.created,
            "owned_by": "fasterllama",
            "root": st.cfg.model_name,
            "max_model_len": r.model.max_model_len,
        }],
    }))
}

pub(super) async fn completions(State(st): St, body: BodyBytes) -> Response {
    let arrival = Instant::now();
    let result = async {
        let body = body_bytes(&st, body)?;
        let req = openai::parse_completion(&body)?;
        check_model(&st, req.model.as_deref())?;
        let input = Input::Prompt(req.prompt);
        generate(&st, arrival, Endpoint::Completions, input, req.params).await
    }
    .await;
    result.unwrap_or_else(|e| refuse(&st, e))
}

pub(super) async fn chat(State(st): St, body: BodyBytes) -> Response {
    let arrival = Instant::now();
    let result = async {
        let body = body_bytes(&st, body)?;
        let req = openai::parse_chat(&body)?;
        check_model(&st, req.model.as_deref())?;
        let input = Input::Chat {
            messages: req.messages,
            add_generation_prompt: req.add_generation_prompt,
            kwargs: req.template_kwargs,
        };
        generate(&st, arrival, Endpoint::Chat, input, req.params).await
    }
    .await;
    result.unwrap_or_else(|e| refuse(&st, e))
}

pub(super) async fn tokenize(State(st): St, body: BodyBytes) -> Response {
    let result = async {
        let body = body_bytes(&st, body)?;
        let (model, req) = openai::parse_tokenize(&body)?;
        check_model(&st, model.as_deref())?;
        let r = ready(&st)?;
        let input = match req {
            TokenizeRequest::Text {
                prompt,
                add_special_tokens,
            } => Input::Text {
                text: prompt,
                add_special: add_special_tokens,
            },
            TokenizeRequest::Chat {
                messages,
                add_generation_prompt,
            } => Input::Chat {
                messages,
                add_generation_prompt,
                kwargs: None,
            },
        };
        let (ids, _) = prompt_ids(&r.model, input).await?;
        Ok::<_, ApiError>(json_response(&json!({
            "count": ids.len(),
            "max_model_len": r.model.max_model_len,
            "tokens": ids,
        })))
    }
    .await;
    result.unwrap_or_else(|e| refuse(&st, e))
}

pub(super) async fn detokenize(State(st): St, body: BodyBytes) -> Response {
    let result = async {
        let body = body_bytes(&st, body)?;
        let (model, ids) = openai::parse_detokenize(&body)?;
        check_model(&st, model.as_deref())?;
        let r = ready(&st)?;
        check_ids(&r.model, &ids, "tokens")?;
        let dec = decoder(&r.model);
        let text = tokio::task::spawn_blocking(move || dec.decode(&ids))
            .await
            .map_err(|e| ApiError::internal(format!("detokenize: {e}")))?
            .map_err(|e| ApiError::internal(format!("detokenize: {e}")))?;
        Ok::<_, ApiError>(json_response(&json!({ "prompt": text })))
    }
    .await;
    result.unwrap_or_else(|e| refuse(&st, e))
}

/// What a request gives to make its prompt from.
enum Input {
    /// `/v1/completions`: text or ids.
    Prompt(Prompt),
    /// `/tokenize` text.
    Text { text: String, add_special: bool },
    /// Chat messages, rendered by the template.
    Chat {
        messages: Vec<Value>,
        add_generation_prompt: bool,
        kwargs: Option<serde_json::Map<String, Value>>,
    },
}

fn decoder(m: &ModelInfo) -> Box<dyn Decode> {
    match &m.tokenizer {
        Some(t) => Box::new(Arc::clone(t)),
        None => Box::new(IdText),
    }
}

fn check_ids(m: &ModelInfo, ids: &[u32], field: &str) -> Result<(), ApiError> {
    match ids.iter().position(|&t| t as usize >= m.vocab_size) {
        Some(i) => Err(ApiError::invalid(
            format!("{field}[{i}]"),
            format!(
                "token id {} >= the vocabulary size {}",
                ids[i], m.vocab_size
            ),
        )),
        None => Ok(()),
    }
}

/// The prompt's token ids and the field they came from (`prompt` or `messages`). Template
/// rendering and tokenization run on the blocking pool (a 1 MB prompt takes a while).
async fn prompt_ids(m: &ModelInfo, input: Input) -> Result<(Vec<u32>, &'static str), ApiError> {
    let no_tokenizer = |field: &'static str| {
        ApiError::invalid(
            field,
            "this model has no tokenizer.json: send the prompt as token ids to /v1/completions",
        )
    };
    let (field, text, add_special) = match input {
        Input::Prompt(Prompt::Ids(ids)) => {
            if ids.is_empty() {
                return Err(ApiError::invalid("prompt", "is empty"));
            }
            check_ids(m, &ids, "prompt")?;
            return Ok((ids, "prompt"));
        }
        Input::Prompt(Prompt::Text(t)) => ("prompt", t, true),
        Input::Text { text, add_special } => ("prompt", text, add_special),
        Input::Chat {
            messages,
            add_generation_prompt,
            kwargs,
        } => {
            let Some(tmpl) = m.chat_template.clone() else {
                return Err(ApiError::invalid(
                    "messages",
                    "this model has no chat template (no chat_template in tokenizer_config.json \
                     or chat_template.jinja): use /v1/completions with a prompt",
                ));
            };
            let tok = m
                .tokenizer
                .clone()
                .ok_or_else(|| no_tokenizer("messages"))?;
            let ids = tokio::task::spawn_blocking(move || {
                let text = tmpl
                    .render(&messages, add_generation_prompt, kwargs.as_ref())
                    .map_err(|e| match e {
                        ChatTemplateError::Argument { .. } => {
                            ApiError::invalid("chat_template_kwargs", e)
                        }
                        e => ApiError::invalid("messages", e),
                    })?;
                let add_special = tmpl.add_special_tokens(&text);
                tok.encode(&text, add_special)
                    .map_err(|e| ApiError::invalid("messages", e))
            })
            .await
            .map_err(|e| ApiError::internal(format!("chat template: {e}")))??;
            return Ok((ids, "messages"));
        }
    };
    let tok = m.tokenizer.clone().ok_or_else(|| no_tokenizer(field))?;
    let ids = tokio::task::spawn_blocking(move || tok.encode(&text, add_special))
        .await
        .map_err(|e| ApiError::internal(format!("tokenize: {e}")))?
        .map_err(|e| ApiError::invalid(field, e))?;
    Ok((ids, field))
}

/// A random 64-bit value (seeds, response ids) without a dependency.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    h.write_u128(now.as_nanos());
    h.finish()
}

/// The engine's parameters for a request, after checking lengths against the context.
fn request_params(
    m: &ModelInfo,
    prompt_len: usize,
    prompt_field: &'static str,
    p: &GenParams,
) -> Result<RequestParams<SamplingParams>, ApiError> {
    let ctx = m.max_model_len;
    let room = |limit: usize| limit.saturating_sub(prompt_len);
    let kv_room = m.kv_capacity_tokens.map(room);
    if prompt_len >= ctx {
        return Err(ApiError::invalid(
            prompt_field,
            format!(
                "the prompt is {prompt_len} tokens; this model's context is {ctx} tokens, so \
                 the prompt can be at most {} tokens",
                ctx.saturating_sub(1)
            ),
        ));
    }
    if kv_room == Some(0) {
        return Err(ApiError::invalid(
            prompt_field,
            format!(
                "the prompt is {prompt_len} tokens; the KV cache holds {} tokens",
                m.kv_capacity_tokens.unwrap_or(0)
            ),
        ));
    }
    let limit = kv_room.map_or(room(ctx), |k| k.min(room(ctx)));
    let max_new = match p.max_tokens {
        None => limit,
        Some((field, n)) => {
            if n > room(ctx) as u64 {
                return Err(ApiError::invalid(
                    field,
                    format!(
                        "{n} new tokens after a {prompt_len}-token prompt exceed this model's \
                         context of {ctx} tokens (at most {})",
                        room(ctx)
                    ),
                ));
            }
            if n > limit as u64 {
                return Err(ApiError::invalid(
                    field,
                    format!(
                        "{n} new tokens after a {prompt_len}-token prompt exceed the KV cache \
                         (at most {limit})"
                    ),
                ));
            }
            n as usize
        }
    };
    if p.sampling.min_new_tokens as usize > max_new {
        return Err(ApiError::invalid(
            "min_tokens",
            format!(
                "{} is more than the {max_new} tokens max_tokens allows",
                p.sampling.min_new_tokens
            ),
        ));
    }
    check_ids(m, &p.stop_token_ids, "stop_token_ids")?;
    let mut params = RequestParams::<SamplingParams>::new(max_new);
    params.stop_token_ids = p.stop_token_ids.clone();
    params.eos_token_ids = m.eos_token_ids.clone();
    params.ignore_eos = p.ignore_eos;
    params.top_logprobs = p.logprobs;
    // The runner keys its random stream by (seed, request_id, token index): a given seed
    // gives the same tokens whatever else runs, a missing one a fresh stream.
    params.seed = p.seed.unwrap_or_else(random_u64);
    params.sampling = SamplingParams {
        seed: params.seed,
        request_id: 0,
        ..p.sampling
    };
    Ok(params)
}

/// A refusal from the service as the client's error, with the engine's field names mapped
/// to the request's.
fn service_error(e: ServiceError, prompt_field: &str, max_field: &str) -> ApiError {
    match e {
        ServiceError::Request(r) => {
            let field = match r {
                RequestError::EmptyPrompt
                | RequestError::PromptTooLong { .. }
                | RequestError::TokenOutOfRange { .. } => prompt_field,
                RequestError::BeamWidth { .. } => "best_of",
                _ => max_field,
            };
            let msg = r.to_string();
            let reason = msg.split_once(": ").map_or(msg.as_str(), |(_, r)| r);
            ApiError::invalid(field, reason)
        }
        ServiceError::Invalid { arg, reason } => {
            // The engine's beam search names as the request's.
            let field = match arg {
                "num_beams" | "vocab" => "best_of",
                "num_return_sequences" => "n",
                "eos_token_ids" => "stop_token_ids",
                "max_new_tokens" => max_field,
                "beam" => "use_beam_search",
                arg => arg,
            };
            ApiError::invalid(field, reason)
        }
        ServiceError::Shutdown => {
            ApiError::unavailable("the server is shutting down", RETRY_AFTER_S)
        }
        e => ApiError::internal(e.to_string()),
    }
}

/// Decrements the in-flight count, and aborts the request unless it ended: dropping a
/// handler's future or its SSE body (the client went away) drops this.
struct Guard {
    st: Arc<AppState>,
    service: Arc<Service>,
    id: RequestId,
    ended: bool,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.ended {
            let _ = self.service.abort(self.id);
            count(&self.st.metrics.failures.disconnected);
        }
        self.st.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a running request produces next.
enum Out {
    /// Text to send, and the log-probabilities of the tokens that made it (when asked for;
    /// a token whose text is held back goes with the next text sent).
    Text(String, Vec<TokenLogprob>),
    /// The end (terminal).
    Done {
        finish_reason: &'static str,
        usage: Usage,
    },
    /// An error after the request started (terminal).
    Failed(ApiError),
}

/// A request on the engine: its events turned into text pieces and one end.
struct Generation {
    guard: Guard,
    rx: UnboundedReceiver<(StreamEvent, Instant)>,
    /// The first event, received before answering (a refusal is a plain 4xx).
    first: Option<(StreamEvent, Instant)>,
    text: OutputText,
    arrival: Instant,
    last_token_at: Option<Instant>,
    tokens: usize,
    /// Tokens received when a stop string matched.
    stopped_at: Option<usize>,
    queued: VecDeque<Out>,
    /// Asked for log-probabilities: each token's text for them.
    lp_decoder: Option<Box<dyn Decode>>,
    /// Log-probabilities of tokens whose text is not sent yet.
    lp_pending: Vec<TokenLogprob>,
}

/// Submits one choice's request (a beam search with `beam`); its events come through the
/// returned generation.
#[allow(clippy::too_many_arguments)]
fn submit(
    st: &Arc<AppState>,
    r: &Ready,
    arrival: Instant,
    prompt: Vec<u32>,
    fields: (&'static str, &'static str),
    params: RequestParams<SamplingParams>,
    beam: Option<BeamParams>,
    stops: Vec<String>,
) -> Result<Generation, ApiError> {
    let text = OutputText::new(decoder(&r.model), &prompt, stops, end_ids(&params));
    let lp_decoder = params.top_logprobs.map(|_| decoder(&r.model));
    let (tx, rx) = unbounded_channel();
    let sink = move |e: StreamEvent, at: Instant| tx.send((e, at)).is_ok();
    let id = match beam {
        None => r.service.submit_with_sink(prompt, params, sink),
        Some(b) => r.service.submit_beam_with_sink(prompt, params, b, sink),
    }
    .map_err(|e| service_error(e, fields.0, fields.1))?;
    st.in_flight.fetch_add(1, Ordering::Relaxed);
    let guard = Guard {
        st: Arc::clone(st),
        service: Arc::clone(&r.service),
        id,
        ended: false,
    };
    Ok(Generation {
        guard,
        rx,
        first: None,
        text,
        arrival,
        last_token_at: None,
        tokens: 0,
        stopped_at: None,
        queued: VecDeque::new(),
        lp_decoder,
        lp_pending: Vec::new(),
    })
}

/// A token's log-probabilities with the tokens as text and bytes: what each stands for on
/// its own (a word's leading space kept), or its decoded text where the decoder has no bytes.
fn token_logprob(d: &dyn Decode, lp: TokenLogprobs) -> TokenLogprob {
    let text = |id: u32| match d.token_bytes(id) {
        Some(b) => (String::from_utf8_lossy(&b).into_owned(), b),
        None => {
            let t = d.decode(&[id]).unwrap_or_default();
            let b = t.as_bytes().to_vec();
            (t, b)
        }
    };
    let (token, bytes) = text(lp.token);
    TokenLogprob {
        token,
        bytes,
        logprob: lp.logprob,
        top: lp
            .top
            .into_iter()
            .map(|(id, l)| {
                let (t, b) = text(id);
                (t, b, l)
            })
            .collect(),
    }
}

/// The ids that end a request (stop ids, then end-of-sequence ids unless ignored), each once.
fn end_ids(params: &RequestParams<SamplingParams>) -> Vec<u32> {
    let mut ids: Vec<u32> = vec![];
    let eos: &[u32] = if params.ignore_eos {
        &[]
    } else {
        &params.eos_token_ids
    };
    for &t in params.stop_token_ids.iter().chain(eos) {
        if !ids.contains(&t) {
            ids.push(t);
        }
    }
    ids
}

/// Submits the request and waits for its first event (so a refusal is a plain 4xx; a beam
/// request's first event comes at its end).
#[allow(clippy::too_many_arguments)]
async fn start(
    st: &Arc<AppState>,
    r: &Ready,
    arrival: Instant,
    prompt: Vec<u32>,
    fields: (&'static str, &'static str),
    params: RequestParams<SamplingParams>,
    beam: Option<BeamParams>,
    stops: Vec<String>,
) -> Result<Generation, ApiError> {
    let mut gen = submit(st, r, arrival, prompt, fields, params, beam, stops)?;
    match gen.rx.recv().await {
        Some((StreamEvent::Error(e), _)) => {
            gen.guard.ended = true;
            Err(service_error(e, fields.0, fields.1))
        }
        Some(ev) => {
            gen.first = Some(ev);
            Ok(gen)
        }
        None => {
            gen.guard.ended = true;
            Err(ApiError::internal("the engine dropped the request"))
        }
    }
}

/// The `n` choices of one request, each its own engine request, their outputs interleaved
/// as they come. A failed choice ends them all (the response ends with its error).
struct Choices {
    gens: Vec<Generation>,
    /// Whether each choice has ended (finished or failed).
    ended: Vec<bool>,
    /// Each finished choice's usage.
    usage: Vec<Usage>,
    /// The choice polled first next time, so that a busy choice does not starve the rest.
    turn: usize,
}

impl Choices {
    fn new(gens: Vec<Generation>) -> Self {
        let n = gens.len();
        Choices {
            gens,
            ended: vec![false; n],
            usage: vec![Usage::default(); n],
            turn: 0,
        }
    }

    fn metrics(&self) -> &super::metrics::Metrics {
        self.gens[0].metrics()
    }

    /// The next output of any running choice with the choice's index; `None` once all
    /// ended.
    async fn next(&mut self) -> Option<(usize, Out)> {
        let n = self.gens.len();
        let ended = &self.ended;
        let mut running: Vec<(usize, &mut Generation)> = self
            .gens
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| !ended[*i])
            .collect();
        if running.is_empty() {
            return None;
        }
        let k = running.iter().position(|(i, _)| *i >= self.turn);
        running.rotate_left(k.unwrap_or(0));
        // `Generation::next` only awaits its channel, so dropping the others loses nothing.
        let polls = running
            .into_iter()
            .map(|(i, g)| Box::pin(async move { (i, g.next().await) }));
        let ((i, out), _, rest) = futures_util::future::select_all(polls).await;
        drop(rest);
        self.turn = (i + 1) % n;
        match &out {
            Out::Text(..) => {}
            Out::Done { usage, .. } => {
                self.ended[i] = true;
                self.usage[i] = *usage;
            }
            Out::Failed(e) => {
                self.ended[i] = true;
                self.fail_rest(e);
            }
        }
        Some((i, out))
    }

    /// Aborts the choices still running after one failed, each counted as failed with it.
    fn fail_rest(&mut self, e: &ApiError) {
        for (g, ended) in self.gens.iter_mut().zip(&mut self.ended) {
            if !*ended {
                *ended = true;
                let _ = g.guard.service.abort(g.guard.id);
                g.guard.ended = true;
                count_failure(&g.guard.st.metrics, e);
            }
        }
    }

    /// The request's usage: completion tokens summed over choices, the prompt counted once
    /// with choice 0's cached tokens (the siblings' cache hits are the prompt shared, not
    /// more of it).
    fn total_usage(&self) -> Usage {
        Usage {
            completion_tokens: self.usage.iter().map(|u| u.completion_tokens).sum(),
            ..self.usage[0]
        }
    }
}

impl Generation {
    fn metrics(&self) -> &super::metrics::Metrics {
        &self.guard.st.metrics
    }

    /// The next piece of text or the end.
    async fn next(&mut self) -> Out {
        loop {
            if let Some(out) = self.queued.pop_front() {
                return out;
            }
            let (event, at) = match self.first.take() {
                Some(ev) => ev,
                None => match self.rx.recv().await {
                    Some(ev) => ev,
                    None => {
                        self.guard.ended = true;
                        return Out::Failed(ApiError::internal("the engine dropped the request"));
                    }
                },
            };
            match event {
                StreamEvent::Token {
                    token, logprobs, ..
                } => {
                    if let Some(text) = self.token(token, logprobs, at) {
                        return text;
                    }
                }
                StreamEvent::Finished { reason, usage } => return self.finished(reason, usage),
                // Only beam requests get hypotheses; they are read by `beams`.
                StreamEvent::Beams(_) => {}
                StreamEvent::Error(e) => {
                    self.guard.ended = true;
                    return Out::Failed(ApiError::internal(e.to_string()));
                }
            }
        }
    }

    /// A beam request's hypotheses and usage, once it has ended.
    async fn beams(&mut self) -> Result<(Vec<(Vec<u32>, f64)>, Usage), ApiError> {
        let mut hyps = None;
        loop {
            let event = match self.first.take() {
                Some((ev, _)) => ev,
                None => match self.rx.recv().await {
                    Some((ev, _)) => ev,
                    None => {
                        self.guard.ended = true;
                        return Err(ApiError::internal("the engine dropped the request"));
                    }
                },
            };
            match event {
                StreamEvent::Beams(h) => hyps = Some(h),
                StreamEvent::Token { .. } => {}
                StreamEvent::Finished { reason, usage } => {
                    self.guard.ended = true;
                    return match (reason, hyps) {
                        (FinishReason::Abort, _) => Err(ApiError::unavailable(
                            "the request was aborted: the server is shutting down",
                            RETRY_AFTER_S,
                        )),
                        (_, Some(h)) => Ok((h, usage)),
                        (_, None) => Err(ApiError::internal("the engine sent no hypotheses")),
                    };
                }
                StreamEvent::Error(e) => {
                    self.guard.ended = true;
                    return Err(ApiError::internal(e.to_string()));
                }
            }
        }
    }

    fn token(&mut self, token: u32, lp: Option<TokenLogprobs>, at: Instant) -> Option<Out> {
        let m = &self.guard.st.metrics;
        count(&m.generation_tokens);
        match self.last_token_at {
            None => m.ttft.observe(at.saturating_duration_since(self.arrival)),
            Some(last) => m.itl.observe(at.saturating_duration_since(last)),
        }
        self.last_token_at = Some(at);
        self.tokens += 1;
        if self.stopped_at.is_some() {
            // Tokens the engine made before the abort reached it.
            return None;
        }
        if let (Some(d), Some(lp)) = (&self.lp_decoder, lp) {
            self.lp_pending.push(token_logprob(d.as_ref(), lp));
        }
        let piece = match self.text.push(token) {
            Ok(p) => p,
            Err(e) => return Some(self.fail_text(e)),
        };
        if piece.stopped {
            self.stopped_at = Some(self.tokens);
            let _ = self.guard.service.abort(self.guard.id);
        }
        (!piece.text.is_empty())
            .then(|| Out::Text(piece.text, std::mem::take(&mut self.lp_pending)))
    }

    fn fail_text(&mut self, e: String) -> Out {
        let _ = self.guard.service.abort(self.guard.id);
        self.guard.ended = true;
        Out::Failed(ApiError::internal(format!("detokenize: {e}")))
    }

    fn finished(&mut self, reason: FinishReason, mut usage: Usage) -> Out {
        self.guard.ended = true;
        // A stop string wins over whatever ended the engine's request after it (the abort
        // may arrive after more tokens, or after the request ran out of tokens).
        let mut finish_reason = match reason {
            _ if self.stopped_at.is_some() => "stop",
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => {
                return Out::Failed(ApiError::unavailable(
                    "the request was aborted: the server is shutting down",
                    RETRY_AFTER_S,
                ));
            }
        };
        if self.stopped_at.is_none() {
            match self.text.finish() {
                Ok(piece) => {
                    if piece.stopped {
                        finish_reason = "stop";
                    }
                    if !piece.text.is_empty() || !self.lp_pending.is_empty() {
                        let lps = std::mem::take(&mut self.lp_pending);
                        self.queued.push_back(Out::Text(piece.text, lps));
                    }
                }
                Err(e) => return self.fail_text(e),
            }
        }
        if let Some(n) = self.stopped_at {
            usage.completion_tokens = n;
        }
        let m = self.metrics();
        count(match finish_reason {
            "stop" => &m.success.stop,
            _ => &m.success.length,
        });
        m.e2e.observe(self.arrival.elapsed());
        self.queued.push_back(Out::Done {
            finish_reason,
            usage,
        });
        self.queued.pop_front().unwrap_or(Out::Done {
            finish_reason,
            usage,
        })
    }
}

/// A completion or chat request from its input to its response.
async fn generate(
    st: &Arc<AppState>,
    arrival: Instant,
    endpoint: Endpoint,
    input: Input,
    p: GenParams,
) -> Result<Response, ApiError> {
    let r = ready(st)?;
    // Refuse early when the queue is full (before tokenizing): requests submitted and not
    // running are waiting.
    let running = r.service.stats().backend.running;
    let waiting = st.in_flight.load(Ordering::Relaxed).saturating_sub(running);
    if waiting >= st.cfg.max_waiting {
        return Err(ApiError::unavailable(
            format!("the server is at capacity ({waiting} requests waiting); retry shortly"),
            RETRY_AFTER_S,
        ));
    }
    let (prompt, prompt_field) = prompt_ids(&r.model, input).await?;
    let params = request_params(&r.model, prompt.len(), prompt_field, &p)?;
    let max_field = p.max_tokens.map_or("max_tokens", |(f, _)| f);
    let prompt_len = prompt.len();
    let fields = (prompt_field, max_field);
    if let Some(b) = &p.beam {
        let meta = response_meta(st, endpoint);
        return beam_search(st, r, arrival, prompt, fields, params, &p, b, meta).await;
    }
    let siblings = (p.n > 1).then(|| (prompt.clone(), params.clone()));
    let first = start(st, r, arrival, prompt, fields, params, None, p.stop.clone()).await?;
    let mut gens = vec![first];
    // Siblings go in once choice 0 has a token: its prompt blocks are then in the prefix
    // cache, so each sibling prefills only the last, uncached block.
    if let Some((prompt, params)) = siblings {
        for i in 1..p.n {
            let mut params = params.clone();
            // Choice i samples its own stream: seed s + i for a client seed s.
            params.seed = p.seed.map_or_else(random_u64, |s| s.wrapping_add(i as u64));
            params.sampling.seed = params.seed;
            let gen = submit(
                st,
                r,
                arrival,
                prompt.clone(),
                fields,
                params,
                None,
                p.stop.clone(),
            );
            match gen {
                Ok(gen) => gens.push(gen),
                Err(e) => {
                    Choices::new(gens).fail_rest(&e);
                    return Err(e);
                }
            }
        }
    }
    let mut choices = Choices::new(gens);
    // Counted once per HTTP request, as `usage.prompt_tokens` counts it; every choice is
    // a request in the other counters (success, failure, TTFT, latency).
    st.metrics
        .prompt_tokens
        .fetch_add(prompt_len as u64, Ordering::Relaxed);
    let meta = response_meta(st, endpoint);
    if p.stream {
        return Ok(sse(choices, meta, p.include_usage));
    }
    let mut texts = vec![String::new(); p.n];
    let mut lps: Vec<Vec<TokenLogprob>> = vec![Vec::new(); p.n];
    let mut finish = vec![""; p.n];
    while let Some((i, out)) = choices.next().await {
        match out {
            Out::Text(t, l) => {
                texts[i].push_str(&t);
                lps[i].extend(l);
            }
            Out::Done { finish_reason, .. } => finish[i] = finish_reason,
            Out::Failed(e) => return Err(e),
        }
    }
    let list: Vec<Choice<'_>> = (0..p.n)
        .map(|i| Choice {
            text: &texts[i],
            finish_reason: finish[i],
            logprobs: p.logprobs.map(|_| lps[i].as_slice()),
        })
        .collect();
    Ok(json_response(&meta.response(&list, &choices.total_usage())))
}

/// A new response id and the fields every object of the response repeats.
fn response_meta(st: &AppState, endpoint: Endpoint) -> ResponseMeta {
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completions => "cmpl",
    };
    ResponseMeta {
        id: format!("{prefix}-{:016x}{:016x}", random_u64(), random_u64()),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        model: st.cfg.model_name.clone(),
        endpoint,
    }
}

/// The most new tokens per beam that `width` beams of a `prompt_len`-token prompt fit in a KV
/// pool of `kv_tokens` tokens in `kv_blocks` blocks, as the scheduler reserves them: the
/// prompt's full blocks shared, each beam with its own copy of the partial one and its own
/// blocks after it. `None`: no KV limit known.
fn beam_kv_room(
    kv_tokens: Option<usize>,
    kv_blocks: usize,
    prompt_len: usize,
    width: usize,
) -> Option<usize> {
    let block = kv_tokens? / kv_blocks.max(1);
    if block == 0 || width == 0 {
        return None;
    }
    let per_beam = kv_blocks.saturating_sub(prompt_len / block) / width;
    // The last token is never written to the KV cache.
    Some((per_beam * block + 1).saturating_sub(prompt_len % block))
}

/// A beam search request: one engine request whose `n` best hypotheses are the choices, best
/// first, each decoded as a sampled choice's text is (stop strings cut it). A choice's finish
/// reason is `stop` when it ends with an end id or a stop string, else `length`; usage counts
/// the returned choices' tokens, as vLLM does. In the metrics it is one request, with no
/// token latencies (no token is streamed). Without `max_tokens`, each beam gets the room the
/// KV pool has for `best_of` beams.
#[allow(clippy::too_many_arguments)]
async fn beam_search(
    st: &Arc<AppState>,
    r: &Ready,
    arrival: Instant,
    prompt: Vec<u32>,
    fields: (&'static str, &'static str),
    params: RequestParams<SamplingParams>,
    p: &GenParams,
    b: &BeamSearch,
    meta: ResponseMeta,
) -> Result<Response, ApiError> {
    let mut params = params;
    if p.max_tokens.is_none() {
        let blocks = r.service.stats().backend.kv.total_blocks;
        let room = beam_kv_room(r.model.kv_capacity_tokens, blocks, prompt.len(), b.width);
        match room {
            Some(0) => {
                return Err(ApiError::invalid(
                    "best_of",
                    format!(
                        "{} beams of a {}-token prompt do not fit the KV cache",
                        b.width,
                        prompt.len()
                    ),
                ))
            }
            Some(room) => params.max_new_tokens = params.max_new_tokens.min(room),
            None => {}
        }
        if params.sampling.min_new_tokens as usize > params.max_new_tokens {
            return Err(ApiError::invalid(
                "min_tokens",
                format!(
                    "{} is more than the {} tokens each of {} beams has room for",
                    params.sampling.min_new_tokens, params.max_new_tokens, b.width
                ),
            ));
        }
    }
    let ends = end_ids(&params);
    let beam = BeamParams {
        num_beams: b.width,
        length_penalty: b.length_penalty,
        early_stopping: b.early_stopping,
        num_return_sequences: p.n,
        max_new_tokens: params.max_new_tokens,
        eos_token_ids: ends.clone(),
    };
    let prompt_len = prompt.len();
    let left = prompt.clone();
    let mut gen = start(st, r, arrival, prompt, fields, params, Some(beam), vec![]).await?;
    let (hyps, engine_usage) = gen.beams().await?;
    let mut choices: Vec<(String, &str)> = Vec::with_capacity(hyps.len());
    let mut completion_tokens = 0;
    for (tokens, _score) in &hyps {
        let mut text = OutputText::new(decoder(&r.model), &left, p.stop.clone(), ends.clone());
        let detok = |e: String| ApiError::internal(format!("detokenize: {e}"));
        let (mut out, mut stopped, mut used) = (String::new(), false, 0);
        for &t in tokens {
            used += 1;
            let piece = text.push(t).map_err(detok)?;
            out += &piece.text;
            if piece.stopped {
                stopped = true;
                break;
            }
        }
        if !stopped {
            let piece = text.finish().map_err(detok)?;
            out += &piece.text;
            stopped = piece.stopped;
        }
        let ended = tokens.last().is_some_and(|t| ends.contains(t));
        choices.push((out, if stopped || ended { "stop" } else { "length" }));
        completion_tokens += used;
    }
    let usage = Usage {
        completion_tokens,
        ..engine_usage
    };
    let m = &st.metrics;
    m.prompt_tokens
        .fetch_add(prompt_len as u64, Ordering::Relaxed);
    m.generation_tokens
        .fetch_add(completion_tokens as u64, Ordering::Relaxed);
    count(match choices.first().map(|c| c.1) {
        Some("stop") => &m.success.stop,
        _ => &m.success.length,
    });
    m.e2e.observe(arrival.elapsed());
    let list: Vec<Choice<'_>> = choices
        .iter()
        .map(|(t, f)| Choice {
            text: t,
            finish_reason: f,
            logprobs: None,
        })
        .collect();
    Ok(json_response(&meta.response(&list, &usage)))
}

/// One server-sent event.
fn event(v: &Value) -> String {
    format!("data: {v}\n\n")
}

const DONE: &str = "data: [DONE]\n\n";

/// The SSE body: (chat) a role chunk per choice, then each choice's chunks per piece of
/// text and a last one with its finish reason, interleaved, then a usage chunk when asked
/// and `[DONE]`. An error after the start is an `{"error": ...}` event before `[DONE]`.
fn sse(choices: Choices, meta: ResponseMeta, include_usage: bool) -> Response {
    struct S {
        choices: Choices,
        meta: ResponseMeta,
        include_usage: bool,
        started: bool,
        done: bool,
        /// Bytes of each choice's text sent so far (completions' `text_offset`).
        sent: Vec<usize>,
    }
    let sent = vec![0; choices.gens.len()];
    let s = S {
        choices,
        meta,
        include_usage,
        started: false,
        done: false,
        sent,
    };
    let stream = futures_util::stream::unfold(s, |mut s| async move {
        if s.done {
            return None;
        }
        let iu = s.include_usage;
        if !s.started {
            s.started = true;
            if s.meta.endpoint == Endpoint::Chat {
                let roles: String = (0..s.choices.gens.len())
                    .map(|i| event(&s.meta.chunk(i, Some(""), true, None, iu, None)))
                    .collect();
                return Some((Ok::<_, Infallible>(Bytes::from(roles)), s));
            }
        }
        let out = match s.choices.next().await {
            Some((i, Out::Text(t, l))) => {
                let lp = (!l.is_empty()).then_some((l.as_slice(), s.sent[i]));
                s.sent[i] += t.len();
                event(&s.meta.chunk(i, Some(&t), false, None, iu, lp))
            }
            Some((i, Out::Done { finish_reason, .. })) => {
                let text = match s.meta.endpoint {
                    Endpoint::Chat => None,
                    Endpoint::Completions => Some(""),
                };
                event(&s.meta.chunk(i, text, false, Some(finish_reason), iu, None))
            }
            None => {
                s.done = true;
                let mut out = String::new();
                if iu {
                    out += &event(&s.meta.usage_chunk(&s.choices.total_usage()));
                }
                out + DONE
            }
            Some((_, Out::Failed(e))) => {
                s.done = true;
                count_failure(s.choices.metrics(), &e);
                event(&e.to_json()) + DONE
            }
        };
        Some((Ok(Bytes::from(out)), s))
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}
