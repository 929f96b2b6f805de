//! The OpenAI API's shapes: request parsing with errors that name the field, the error
//! object, and the response and chunk objects.
//!
//! Requests are read field by field from a JSON object, so that a wrong type names its field
//! (`max_tokens: expected an integer, got a string`), fields the server does not know are
//! ignored (clients send extras), and fields it knows but cannot honour yet (`tools`, `echo`,
//! ...) are refused with a 400 naming them rather than ignored.
//!
//! `logprobs` (completions: an integer 0-20; chat: `logprobs: true` and `top_logprobs` 0-20)
//! becomes [`GenParams::logprobs`]; [`logprobs_json`] writes each endpoint's shape (`-inf`,
//! an impossible token, as OpenAI's -9999).
//!
//! Beam search takes vLLM's fields ([`BeamSearch`]): `use_beam_search: true`, `best_of` (the
//! beam width, default `n`), `length_penalty`, `early_stopping`; `n` hypotheses come back as
//! the choices, best first. It cannot stream, and `best_of` > 1 without it is refused (the
//! server does not sample best-of).
//!
//! ```
//! use fl_engine::serve::openai::parse_completion;
//! let r = parse_completion(br#"{"prompt": "Hi", "max_tokens": 8, "stop": "\n", "user": "x"}"#)?;
//! assert_eq!(r.params.max_tokens, Some(("max_tokens", 8)));
//! let e = parse_completion(br#"{"prompt": "Hi", "max_tokens": -1}"#).unwrap_err();
//! assert_eq!(e.param.as_deref(), Some("max_tokens"));
//! # Ok::<(), fl_engine::serve::openai::ApiError>(())
//! ```

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use fl_sampling::SamplingParams;
use serde_json::{json, Map, Value};

use crate::beam::EarlyStopping;
use crate::scheduler::{Usage, MAX_TOP_LOGPROBS};

/// An error answered as OpenAI does: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong; starts with the field when one is at fault.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, ...).
    pub kind: &'static str,
    /// The request field at fault.
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, ...).
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header (503).
    pub retry_after: Option<u64>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl std::error::Error for ApiError {}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: String) -> Self {
        ApiError {
            status,
            message,
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400 for field `param`: the message is `"{param}: {reason}"`.
    pub fn invalid(param: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        let param = param.into();
        let mut e = Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("{param}: {reason}"),
        );
        e.param = Some(param);
        e
    }

    /// 400 about the request as a whole (body not JSON, not UTF-8...).
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            message.into(),
        )
    }

    /// 401: no or a wrong bearer token.
    pub fn unauthorized() -> Self {
        let mut e = Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "missing or invalid API key: send `Authorization: Bearer <key>`".into(),
        );
        e.code = Some("invalid_api_key");
        e
    }

    /// 404: the request names a model this server does not serve.
    pub fn model_not_found(model: &str, served: &str) -> Self {
        let mut e = Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("model: `{model}` does not exist; this server serves `{served}`"),
        );
        e.param = Some("model".into());
        e.code = Some("model_not_found");
        e
    }

    /// 404: no such route.
    pub fn no_route(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("no route {method} {path}"),
        )
    }

    /// 503 with `Retry-After`: the server is loading or its queue is full.
    pub fn unavailable(message: impl Into<String>, retry_after: u64) -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            message.into(),
        );
        e.retry_after = Some(retry_after);
        e
    }

    /// 500: the engine failed.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            message.into(),
        )
    }

    /// 413: the body is larger than the server takes.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is larger than {limit} bytes"),
        )
    }

    /// The JSON body.
    pub fn to_json(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            self.to_json().to_string(),
        )
            .into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

/// The sampling and stopping fields both endpoints share.
#[derive(Clone, Debug, PartialEq)]
pub struct GenParams {
    /// `max_tokens` or `max_completion_tokens`, with the field's name; `None`: the rest of
    /// the context.
    pub max_tokens: Option<(&'static str, u64)>,
    /// Temperature, top-k/p, min-p, penalties, `min_tokens` (seed and request id unset).
    /// Under beam search only the penalties and `min_tokens` apply: beams are ranked by
    /// log-probability, so temperature, top-k/p and min-p are ignored.
    pub sampling: SamplingParams,
    /// `seed`; `None`: a random seed per request.
    pub seed: Option<u64>,
    /// `stop` strings (at most 4).
    pub stop: Vec<String>,
    /// `stop_token_ids`.
    pub stop_token_ids: Vec<u32>,
    /// `ignore_eos`.
    pub ignore_eos: bool,
    /// `stream`.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `n`: choices to generate for the prompt, 1 to [`MAX_N`]; under beam search, the
    /// hypotheses returned (at most the beam width).
    pub n: usize,
    /// `use_beam_search: true`: the beam search's fields; `None`: sampling.
    pub beam: Option<BeamSearch>,
    /// Log-probabilities of each generated token and this many alternatives (0 to
    /// [`MAX_TOP_LOGPROBS`]): completions' `logprobs`, chat's `logprobs: true` with
    /// `top_logprobs`; `None`: none.
    pub logprobs: Option<usize>,
}

/// One choice of a whole (not streamed) response.
pub struct Choice<'a> {
    /// Its text.
    pub text: &'a str,
    /// `stop` or `length`.
    pub finish_reason: &'a str,
    /// Its tokens' log-probabilities, when asked for.
    pub logprobs: Option<&'a [TokenLogprob]>,
}

/// One generated token's log-probability and the alternatives asked for, as text
/// ([`ResponseMeta::response`] and [`ResponseMeta::chunk`] shape them per endpoint).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The token's text (bytes that are not valid UTF-8 on their own read as U+FFFD).
    pub token: String,
    /// The bytes it stands for (OpenAI's `bytes`: a token may end inside a character).
    pub bytes: Vec<u8>,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely tokens at its step: text, bytes and log-probability, most likely
    /// first.
    pub top: Vec<(String, Vec<u8>, f32)>,
}

/// The largest `n` (choices per request) served.
pub const MAX_N: usize = 16;

/// The widest beam search served: the beam kernel keeps at most
/// [`BEAM_MAX_KEEP`](fl_sampling::BEAM_MAX_KEEP) candidates a step, two per beam at least.
/// The server's `max_num_seqs` may allow fewer (a wider request is refused naming `best_of`).
pub const MAX_BEAM_WIDTH: usize = fl_sampling::BEAM_MAX_KEEP / 2;

/// A request's beam search (vLLM's fields, transformers' semantics: see [`crate::beam`]).
/// The sampling fields `temperature`, `top_p`, `top_k` and `min_p` are ignored; penalties
/// apply to each beam's own tokens; stop strings cut each hypothesis' text as they cut a
/// sampled choice's.
#[derive(Clone, Debug, PartialEq)]
pub struct BeamSearch {
    /// `best_of`: beams kept, 1 to [`MAX_BEAM_WIDTH`] and at least `n` (default `n`).
    pub width: usize,
    /// `length_penalty`: the exponent of the generated length dividing a hypothesis'
    /// log-probability sum (default 1.0; > 0 favours longer outputs).
    pub length_penalty: f64,
    /// `early_stopping`: `true`, `false` (the default) or `"never"`.
    pub early_stopping: EarlyStopping,
}

/// A prompt given as text or as token ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    /// Text, tokenized with the model's tokenizer (BOS added as it configures).
    Text(String),
    /// Token ids, used as they are.
    Ids(Vec<u32>),
}

/// A `POST /v1/completions` request.
#[derive(Clone, Debug, PartialEq)]
pub struct CompletionRequest {
    /// `model`, if given.
    pub model: Option<String>,
    /// `prompt`.
    pub prompt: Prompt,
    /// Sampling and stopping.
    pub params: GenParams,
}

/// A `POST /v1/chat/completions` request.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest {
    /// `model`, if given.
    pub model: Option<String>,
    /// `messages`, each `{"role", "content"}` with text parts joined into a string.
    pub messages: Vec<Value>,
    /// `add_generation_prompt` (default true).
    pub add_generation_prompt: bool,
    /// `chat_template_kwargs`: extra template variables (e.g. `enable_thinking`).
    pub template_kwargs: Option<Map<String, Value>>,
    /// Sampling and stopping.
    pub params: GenParams,
}

/// A `POST /tokenize` request: text or chat messages.
#[derive(Clone, Debug, PartialEq)]
pub enum TokenizeRequest {
    /// `{"prompt": "...", "add_special_tokens": true}`.
    Text {
        /// The text.
        prompt: String,
        /// Add the tokenizer's special tokens (BOS).
        add_special_tokens: bool,
    },
    /// `{"messages": [...], "add_generation_prompt": true}`: rendered with the chat template.
    Chat {
        /// The messages, normalised as in [`ChatRequest`].
        messages: Vec<Value>,
        /// Append the assistant turn's opening.
        add_generation_prompt: bool,
    },
}

/// The body as a JSON object.
///
/// Errors: 400 for a body that is not UTF-8, not JSON, or not an object.
pub fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let text = std::str::from_utf8(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the request body is not valid UTF-8 (byte {})",
            e.valid_up_to()
        ))
    })?;
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(v) => Err(ApiError::bad_request(format!(
            "the request body must be a JSON object, got {}",
            kind(&v)
        ))),
        Err(e) => Err(ApiError::bad_request(format!(
            "the request body is not valid JSON: {e}"
        ))),
    }
}

/// A JSON value's type in words, for error messages.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a number",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn expected(field: &str, what: &str, v: &Value) -> ApiError {
    ApiError::invalid(field, format!("expected {what}, got {}", kind(v)))
}

/// The token ids of `list` (`field[i]` named for an entry that is not one).
fn token_ids(list: &[Value], field: &str) -> Result<Vec<u32>, ApiError> {
    list.iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| expected(&format!("{field}[{i}]"), "a token id", v))
        })
        .collect()
}

/// Typed access to a request object; a missing field and `null` both read as `None`.
struct Fields<'a>(&'a Map<String, Value>);

impl<'a> Fields<'a> {
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        self.get(key)
            .map(|v| v.as_bool().ok_or_else(|| expected(key, "true or false", v)))
            .transpose()
    }

    fn str(&self, key: &str) -> Result<Option<&'a str>, ApiError> {
        self.get(key)
            .map(|v| v.as_str().ok_or_else(|| expected(key, "a string", v)))
            .transpose()
    }

    fn f32(&self, key: &str) -> Result<Option<f32>, ApiError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let x = v.as_f64().ok_or_else(|| expected(key, "a number", v))?;
        let f = x as f32;
        if !f.is_finite() {
            return Err(ApiError::invalid(key, format!("{x} is out of range")));
        }
        Ok(Some(f))
    }

    fn i64(&self, key: &str) -> Result<Option<i64>, ApiError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        match v {
            Value::Number(n) => n
                .as_i64()
                .ok_or_else(|| ApiError::invalid(key, format!("expected an integer, got {n}"))),
            _ => Err(expected(key, "an integer", v)),
        }
        .map(Some)
    }

    /// A non-negative integer (negative and too large values named as such).
    fn u64(&self, key: &str) -> Result<Option<u64>, ApiError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        match v {
            Value::Number(n) if n.is_u64() => Ok(n.as_u64()),
            Value::Number(n) if n.is_i64() => Err(ApiError::invalid(
                key,
                format!("must be a non-negative integer, got {n}"),
            )),
            Value::Number(n) => Err(ApiError::invalid(
                key,
                format!("expected an integer, got {n}"),
            )),
            _ => Err(expected(key, "an integer", v)),
        }
    }

    fn u32(&self, key: &str) -> Result<Option<u32>, ApiError> {
        self.u64(key)?
            .map(|x| {
                u32::try_from(x).map_err(|_| ApiError::invalid(key, format!("{x} is too large")))
            })
            .transpose()
    }
}

/// Refuses a field the server knows but does not serve yet, when it asks for something.
fn unsupported(field: &str, what: &str) -> ApiError {
    ApiError::invalid(field, format!("{what} is not supported yet"))
}

fn gen_params(f: &Fields<'_>, max_keys: &[&'static str]) -> Result<GenParams, ApiError> {
    let mut max_tokens = None;
    for &key in max_keys {
        if let Some(v) = f.u64(key)? {
            if v == 0 {
                return Err(ApiError::invalid(key, "must be at least 1, got 0"));
            }
            max_tokens.get_or_insert((key, v));
        }
    }
    let mut s = SamplingParams::default();
    if let Some(t) = f.f32("temperature")? {
        s.temperature = t;
    }
    if let Some(p) = f.f32("top_p")? {
        s.top_p = p;
    }
    if let Some(k) = f.i64("top_k")? {
        // -1 and 0 both turn it off (vLLM uses -1).
        s.top_k = match k {
            -1 | 0 => 0,
            k if k > 0 => u32::try_from(k).unwrap_or(u32::MAX),
            k => {
                return Err(ApiError::invalid(
                    "top_k",
                    format!("must be -1 or 0 (off) or positive, got {k}"),
                ))
            }
        };
    }
    if let Some(m) = f.f32("min_p")? {
        s.min_p = m;
    }
    for (key, slot) in [
        ("presence_penalty", &mut s.presence_penalty),
        ("frequency_penalty", &mut s.frequency_penalty),
    ] {
        if let Some(x) = f.f32(key)? {
            if !(-2.0..=2.0).contains(&x) {
                return Err(ApiError::invalid(
                    key,
                    format!("must be in [-2, 2], got {x}"),
                ));
            }
            *slot = x;
        }
    }
    if let Some(r) = f.f32("repetition_penalty")? {
        s.repetition_penalty = r;
    }
    if let Some(m) = f.u32("min_tokens")? {
        s.min_new_tokens = m;
    }
    if let Err(fl_sampling::Error::Param {
        param,
        value,
        reason,
        ..
    }) = s.validate(0)
    {
        return Err(ApiError::invalid(param, format!("{reason}, got {value}")));
    }
    // Any 64-bit integer (a negative one is taken modulo 2^64).
    let seed = match f.get("seed") {
        None => None,
        Some(Value::Number(n)) => Some(
            n.as_u64()
                .or_else(|| n.as_i64().map(|x| x as u64))
                .ok_or_else(|| {
                    ApiError::invalid("seed", format!("expected an integer, got {n}"))
                })?,
        ),
        Some(v) => return Err(expected("seed", "an integer", v)),
    };
    let stop = match f.get("stop") {
        None => vec![],
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(list)) => {
            if list.len() > 4 {
                return Err(ApiError::invalid(
                    "stop",
                    format!("at most 4 stop strings, got {}", list.len()),
                ));
            }
            list.iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) => Ok(s.clone()),
                    v => Err(expected(&format!("stop[{i}]"), "a string", v)),
                })
                .collect::<Result<_, _>>()?
        }
        Some(v) => return Err(expected("stop", "a string or an array of strings", v)),
    };
    if let Some(i) = stop.iter().position(String::is_empty) {
        return Err(ApiError::invalid(format!("stop[{i}]"), "must not be empty"));
    }
    let stop_token_ids = match f.get("stop_token_ids") {
        None => vec![],
        Some(Value::Array(list)) => token_ids(list, "stop_token_ids")?,
        Some(v) => return Err(expected("stop_token_ids", "an array of token ids", v)),
    };
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => return Err(expected("stream_options.include_usage", "true or false", v)),
        },
        Some(v) => return Err(expected("stream_options", "an object", v)),
    };
    let n = match f.u64("n")? {
        None => 1,
        Some(n) if (1..=MAX_N as u64).contains(&n) => n as usize,
        Some(n) => {
            return Err(ApiError::invalid(
                "n",
                format!("must be in 1..={MAX_N}, got {n}"),
            ))
        }
    };
    let beam = beam_search(f, n, stream)?;
    match f.get("logit_bias") {
        None => {}
        Some(Value::Object(o)) if o.is_empty() => {}
        Some(Value::Object(_)) => return Err(unsupported("logit_bias", "logit_bias")),
        Some(v) => return Err(expected("logit_bias", "an object", v)),
    }
    if let Some(rf) = f.get("response_format") {
        let t = rf.get("type").and_then(Value::as_str);
        if t != Some("text") {
            return Err(unsupported(
                "response_format",
                "a response_format other than {\"type\": \"text\"}",
            ));
        }
    }
    Ok(GenParams {
        max_tokens,
        sampling: s,
        seed,
        stop,
        stop_token_ids,
        ignore_eos: f.bool("ignore_eos")?.unwrap_or(false),
        stream,
        include_usage,
        n,
        beam,
        logprobs: None,
    })
}

/// The number of alternatives `k` read from field `key` (completions' `logprobs`, chat's
/// `top_logprobs`): 0 to [`MAX_TOP_LOGPROBS`], else a 400 naming `key`.
fn top_logprobs(key: &'static str, k: Option<u64>) -> Result<Option<usize>, ApiError> {
    match k {
        Some(k) if k > MAX_TOP_LOGPROBS as u64 => Err(ApiError::invalid(
            key,
            format!("must be at most {MAX_TOP_LOGPROBS}, got {k}"),
        )),
        k => Ok(k.map(|k| k as usize)),
    }
}

/// `logprobs` for sampled choices; a beam search ranks hypotheses by their score instead.
fn with_logprobs(p: &GenParams, logprobs: Option<usize>) -> Result<Option<usize>, ApiError> {
    if logprobs.is_some() && p.beam.is_some() {
        return Err(ApiError::invalid(
            "logprobs",
            "is not served with use_beam_search (beams are ranked by their score)",
        ));
    }
    Ok(logprobs)
}

/// A log-probability as JSON: OpenAI's -9999.0 for an impossible token (JSON has no -inf).
fn logprob_json(lp: f32) -> Value {
    json!(if lp.is_finite() {
        lp.max(-9999.0)
    } else {
        -9999.0
    })
}

/// The `logprobs` object of a choice (or of a chunk) over `tokens`; completions' `text_offset`
/// starts at `offset` (the bytes of the choice's text before these tokens).
pub fn logprobs_json(endpoint: Endpoint, tokens: &[TokenLogprob], offset: usize) -> Value {
    match endpoint {
        Endpoint::Chat => json!({
            "content": tokens.iter().map(|t| json!({
                "token": t.token,
                "logprob": logprob_json(t.logprob),
                "bytes": t.bytes,
                "top_logprobs": t.top.iter().map(|(s, b, lp)| json!({
                    "token": s,
                    "logprob": logprob_json(*lp),
                    "bytes": b,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        }),
        Endpoint::Completions => {
            let mut at = offset;
            let mut offsets = Vec::with_capacity(tokens.len());
            for t in tokens {
                offsets.push(at);
                at += t.token.len();
            }
            json!({
                "tokens": tokens.iter().map(|t| t.token.as_str()).collect::<Vec<_>>(),
                "token_logprobs": tokens.iter().map(|t| logprob_json(t.logprob)).collect::<Vec<_>>(),
                "top_logprobs": tokens.iter().map(|t| {
                    let mut m = Map::new();
                    for (s, _, lp) in &t.top {
                        m.entry(s.clone()).or_insert_with(|| logprob_json(*lp));
                    }
                    Value::Object(m)
                }).collect::<Vec<_>>(),
                "text_offset": offsets,
            })
        }
    }
}

/// vLLM's beam search fields; `None` without `use_beam_search: true`.
fn beam_search(f: &Fields<'_>, n: usize, stream: bool) -> Result<Option<BeamSearch>, ApiError> {
    let on = f.bool("use_beam_search")?.unwrap_or(false);
    let best_of = f.u64("best_of")?;
    let length_penalty = match f.get("length_penalty") {
        None => 1.0,
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite())
            .ok_or_else(|| expected("length_penalty", "a number", v))?,
    };
    let early_stopping = match f.get("early_stopping") {
        None | Some(Value::Bool(false)) => EarlyStopping::False,
        Some(Value::Bool(true)) => EarlyStopping::True,
        Some(Value::String(s)) if s == "never" => EarlyStopping::Never,
        Some(v) => return Err(expected("early_stopping", "true, false or \"never\"", v)),
    };
    if let Some(b) = best_of {
        if b == 0 {
            return Err(ApiError::invalid("best_of", "must be at least 1, got 0"));
        }
        if (n as u64) > b {
            return Err(ApiError::invalid(
                "n",
                format!("{n} is more than best_of ({b})"),
            ));
        }
    }
    if !on {
        if best_of.is_some_and(|b| b > 1) {
            return Err(ApiError::invalid(
                "best_of",
                "best_of > 1 is served only with use_beam_search: true (best-of sampling is \
                 not supported)",
            ));
        }
        return Ok(None);
    }
    if stream {
        return Err(ApiError::invalid(
            "stream",
            "use_beam_search cannot stream: the hypotheses are known only at the end",
        ));
    }
    let width = best_of.unwrap_or(n as u64);
    if width > MAX_BEAM_WIDTH as u64 {
        return Err(ApiError::invalid(
            "best_of",
            format!("at most {MAX_BEAM_WIDTH} beams, got {width}"),
        ));
    }
    Ok(Some(BeamSearch {
        width: width as usize,
        length_penalty,
        early_stopping,
    }))
}

/// Parses a `/v1/completions` body.
///
/// Errors: 400 naming the field: a wrong type, a value out of range (`logprobs` above 20, or
/// with beam search), a batch of prompts, or a field asking for something not served yet
/// (`echo`, `suffix`, `logit_bias`, `best_of` > 1 without `use_beam_search`, `stream` with
/// it).
pub fn parse_completion(body: &[u8]) -> Result<CompletionRequest, ApiError> {
    let m = parse_object(body)?;
    let f = Fields(&m);
    let model = f.str("model")?.map(str::to_string);
    let prompt = match f.get("prompt") {
        None => return Err(ApiError::invalid("prompt", "is required")),
        Some(v) => prompt(v)?,
    };
    let logprobs = top_logprobs("logprobs", f.u64("logprobs")?)?;
    if f.bool("echo")? == Some(true) {
        return Err(unsupported("echo", "echo"));
    }
    if f.str("suffix")?.is_some() {
        return Err(unsupported("suffix", "suffix"));
    }
    let mut params = gen_params(&f, &["max_tokens"])?;
    params.logprobs = with_logprobs(&params, logprobs)?;
    Ok(CompletionRequest {
        model,
        prompt,
        params,
    })
}

/// A `prompt`: a string, a list of one string, token ids, or a list of one list of ids.
fn prompt(v: &Value) -> Result<Prompt, ApiError> {
    let ids = token_ids;
    match v {
        Value::String(s) => Ok(Prompt::Text(s.clone())),
        Value::Array(list) => match list.first() {
            None => Err(ApiError::invalid("prompt", "is empty")),
            Some(Value::Number(_)) => Ok(Prompt::Ids(ids(list, "prompt")?)),
            Some(_) if list.len() > 1 => Err(ApiError::invalid(
                "prompt",
                format!(
                    "a batch of {} prompts is not supported; send one prompt per request",
                    list.len()
                ),
            )),
            Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
            Some(Value::Array(inner)) => Ok(Prompt::Ids(ids(inner, "prompt[0]")?)),
            Some(v) => Err(expected(
                "prompt[0]",
                "a string, a token id or a list of ids",
                v,
            )),
        },
        v => Err(expected(
            "prompt",
            "a string, a list of token ids, or a list of one of those",
            v,
        )),
    }
}

/// `messages`: a non-empty array of objects with a string `role`; a `content` given as parts
/// becomes the string of its text parts (joined by newlines, as vLLM does).
fn messages(v: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    let list = match v {
        None => return Err(ApiError::invalid("messages", "is required")),
        Some(Value::Array(l)) if l.is_empty() => {
            return Err(ApiError::invalid("messages", "must not be empty"))
        }
        Some(Value::Array(l)) => l,
        Some(v) => return Err(expected("messages", "an array of messages", v)),
    };
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let Value::Object(obj) = m else {
                return Err(expected(&format!("messages[{i}]"), "an object", m));
            };
            match obj.get("role") {
                Some(Value::String(_)) => {}
                None => {
                    return Err(ApiError::invalid(
                        format!("messages[{i}].role"),
                        "is required",
                    ))
                }
                Some(v) => return Err(expected(&format!("messages[{i}].role"), "a string", v)),
            }
            let mut obj = obj.clone();
            match obj.get("content") {
                None | Some(Value::Null) | Some(Value::String(_)) => {}
                Some(Value::Array(parts)) => {
                    let text = parts
                        .iter()
                        .enumerate()
                        .map(|(j, p)| {
                            let field = format!("messages[{i}].content[{j}]");
                            match (p.get("type").and_then(Value::as_str), p.get("text")) {
                                (Some("text"), Some(Value::String(t))) => Ok(t.clone()),
                                (Some("text"), Some(v)) => {
                                    Err(expected(&format!("{field}.text"), "a string", v))
                                }
                                (Some("text"), None) => {
                                    Err(ApiError::invalid(format!("{field}.text"), "is required"))
                                }
                                (Some(t), _) => Err(ApiError::invalid(
                                    format!("{field}.type"),
                                    format!("only text parts are supported, got `{t}`"),
                                )),
                                (None, _) => {
                                    Err(ApiError::invalid(format!("{field}.type"), "is required"))
                                }
                            }
                        })
                        .collect::<Result<Vec<_>, _>>()?
                        .join("\n");
                    obj.insert("content".into(), Value::String(text));
                }
                Some(v) => {
                    return Err(expected(
                        &format!("messages[{i}].content"),
                        "a string or an array of parts",
                        v,
                    ))
                }
            }
            Ok(Value::Object(obj))
        })
        .collect()
}

/// Parses a `/v1/chat/completions` body.
///
/// Errors: 400 naming the field, as [`parse_completion`] (beam search included); also
/// `top_logprobs` above 20 or without `logprobs: true`; `tools` and non-text content parts
/// are refused as not served yet.
pub fn parse_chat(body: &[u8]) -> Result<ChatRequest, ApiError> {
    let m = parse_object(body)?;
    let f = Fields(&m);
    let model = f.str("model")?.map(str::to_string);
    let messages = messages(m.get("messages"))?;
    let top = f.u64("top_logprobs")?;
    let on = f.bool("logprobs")?.unwrap_or(false);
    let logprobs = match (on, top_logprobs("top_logprobs", top)?) {
        (false, Some(k)) if k > 0 => {
            return Err(ApiError::invalid("top_logprobs", "needs `logprobs: true`"))
        }
        (true, k) => Some(k.unwrap_or(0)),
        (false, _) => None,
    };
    match f.get("tools") {
        None => {}
        Some(Value::Array(t)) if t.is_empty() => {}
        Some(Value::Array(_)) => return Err(unsupported("tools", "tool calling")),
        Some(v) => return Err(expected("tools", "an array", v)),
    }
    let template_kwargs = match f.get("chat_template_kwargs") {
        None => None,
        Some(Value::Object(o)) => Some(o.clone()),
        Some(v) => return Err(expected("chat_template_kwargs", "an object", v)),
    };
    let mut params = gen_params(&f, &["max_completion_tokens", "max_tokens"])?;
    params.logprobs = with_logprobs(&params, logprobs)?;
    Ok(ChatRequest {
        model,
        messages,
        add_generation_prompt: f.bool("add_generation_prompt")?.unwrap_or(true),
        template_kwargs,
        params,
    })
}

/// Parses a `/tokenize` body (vLLM's shape).
///
/// Errors: 400 naming the field.
pub fn parse_tokenize(body: &[u8]) -> Result<(Option<String>, TokenizeRequest), ApiError> {
    let m = parse_object(body)?;
    let f = Fields(&m);
    let model = f.str("model")?.map(str::to_string);
    let req = if m.contains_key("messages") {
        TokenizeRequest::Chat {
            messages: messages(m.get("messages"))?,
            add_generation_prompt: f.bool("add_generation_prompt")?.unwrap_or(true),
        }
    } else {
        TokenizeRequest::Text {
            prompt: f
                .str("prompt")?
                .ok_or_else(|| ApiError::invalid("prompt", "is required (or give messages)"))?
                .to_string(),
            add_special_tokens: f.bool("add_special_tokens")?.unwrap_or(true),
        }
    };
    Ok((model, req))
}

/// Parses a `/detokenize` body: `{"tokens": [ids]}`.
///
/// Errors: 400 naming the field.
pub fn parse_detokenize(body: &[u8]) -> Result<(Option<String>, Vec<u32>), ApiError> {
    let m = parse_object(body)?;
    let f = Fields(&m);
    let model = f.str("model")?.map(str::to_string);
    let tokens = match f.get("tokens") {
        None => return Err(ApiError::invalid("tokens", "is required")),
        Some(Value::Array(list)) => token_ids(list, "tokens")?,
        Some(v) => return Err(expected("tokens", "an array of token ids", v)),
    };
    Ok((model, tokens))
}

/// The `usage` object.
pub fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

/// Which endpoint a response belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
}

/// What every response object of one request repeats.
#[derive(Clone, Debug)]
pub struct ResponseMeta {
    /// `chatcmpl-...` or `cmpl-...`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// The endpoint.
    pub endpoint: Endpoint,
}

impl ResponseMeta {
    /// A full (non-streaming) response: `choices` holds each choice's (text, finish
    /// reason), its index its position.
    pub fn response(&self, choices: &[Choice<'_>], usage: &Usage) -> Value {
        let choice = |(index, c): (usize, &Choice<'_>)| {
            let lp = c
                .logprobs
                .map_or(Value::Null, |t| logprobs_json(self.endpoint, t, 0));
            match self.endpoint {
                Endpoint::Chat => json!({
                    "index": index,
                    "message": {"role": "assistant", "content": c.text},
                    "logprobs": lp,
                    "finish_reason": c.finish_reason,
                }),
                Endpoint::Completions => json!({
                    "index": index,
                    "text": c.text,
                    "logprobs": lp,
                    "finish_reason": c.finish_reason,
                }),
            }
        };
        let choices: Vec<Value> = choices.iter().enumerate().map(choice).collect();
        json!({
            "id": self.id,
            "object": match self.endpoint {
                Endpoint::Chat => "chat.completion",
                Endpoint::Completions => "text_completion",
            },
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage_json(usage),
        })
    }

    /// A streamed chunk of choice `index`: `text` (chat: the delta's content; `role` adds
    /// the role, as each choice's first chat chunk does) and a finish reason on its last one;
    /// `logprobs`: its tokens' (completions' `text_offset` from their byte offset in the
    /// choice's text).
    pub fn chunk(
        &self,
        index: usize,
        text: Option<&str>,
        role: bool,
        finish_reason: Option<&str>,
        with_usage_field: bool,
        logprobs: Option<(&[TokenLogprob], usize)>,
    ) -> Value {
        let lp = logprobs.map_or(Value::Null, |(t, at)| logprobs_json(self.endpoint, t, at));
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let mut delta = Map::new();
                if role {
                    delta.insert("role".into(), "assistant".into());
                }
                if let Some(t) = text {
                    delta.insert("content".into(), t.into());
                }
                json!({"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish_reason})
            }
            Endpoint::Completions => json!({
                "index": index,
                "text": text.unwrap_or(""),
                "logprobs": lp,
                "finish_reason": finish_reason,
            }),
        };
        let mut c = self.chunk_base();
        c["choices"] = json!([choice]);
        if with_usage_field {
            c["usage"] = Value::Null;
        }
        c
    }

    /// The usage chunk of `stream_options.include_usage`: no choices.
    pub fn usage_chunk(&self, usage: &Usage) -> Value {
        let mut c = self.chunk_base();
        c["choices"] = json!([]);
        c["usage"] = usage_json(usage);
        c
    }

    fn chunk_base(&self) -> Value {
        json!({
            "id": self.id,
            "object": match self.endpoint {
                Endpoint::Chat => "chat.completion.chunk",
                Endpoint::Completions => "text_completion",
            },
            "created": self.created,
            "model": self.model,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err_param(r: Result<impl std::fmt::Debug, ApiError>) -> (String, String) {
        let e = r.expect_err("an error");
        assert_eq!(e.status, StatusCode::BAD_REQUEST, "{e:?}");
        (e.param.unwrap_or_default(), e.message)
    }

    #[test]
    fn wrong_types_and_ranges_name_the_field() {
        let cases: &[(&str, &str)] = &[
            (r#"{"prompt": "a", "max_tokens": "8"}"#, "max_tokens"),
            (r#"{"prompt": "a", "max_tokens": -3}"#, "max_tokens"),
            (r#"{"prompt": "a", "max_tokens": 0}"#, "max_tokens"),
            (r#"{"prompt": "a", "max_tokens": 1.5}"#, "max_tokens"),
            (r#"{"prompt": "a", "temperature": "hot"}"#, "temperature"),
            (r#"{"prompt": "a", "temperature": -1}"#, "temperature"),
            (r#"{"prompt": "a", "top_p": 0}"#, "top_p"),
            (r#"{"prompt": "a", "top_k": -2}"#, "top_k"),
            (
                r#"{"prompt": "a", "presence_penalty": 3}"#,
                "presence_penalty",
            ),
            (r#"{"prompt": "a", "stop": 5}"#, "stop"),
            (r#"{"prompt": "a", "stop": ["a", 1]}"#, "stop[1]"),
            (r#"{"prompt": "a", "stop": ["a","b","c","d","e"]}"#, "stop"),
            (
                r#"{"prompt": "a", "stop_token_ids": [1, -1]}"#,
                "stop_token_ids[1]",
            ),
            (r#"{"prompt": "a", "n": 0}"#, "n"),
            (r#"{"prompt": "a", "n": 17}"#, "n"),
            (r#"{"prompt": "a", "logprobs": 21}"#, "logprobs"),
            (r#"{"prompt": "a", "logprobs": -1}"#, "logprobs"),
            (
                r#"{"prompt": "a", "logprobs": 2, "use_beam_search": true}"#,
                "logprobs",
            ),
            (r#"{"prompt": "a", "stream": "yes"}"#, "stream"),
            (r#"{"prompt": "a", "echo": true}"#, "echo"),
            (r#"{"prompt": ["a", "b"]}"#, "prompt"),
            (r#"{"prompt": [1, "b"]}"#, "prompt[1]"),
            (r#"{"prompt": {}}"#, "prompt"),
            (r#"{"max_tokens": 3}"#, "prompt"),
            (r#"{"prompt": "a", "best_of": 2}"#, "best_of"),
            (r#"{"prompt": "a", "best_of": 0}"#, "best_of"),
            (r#"{"prompt": "a", "n": 2, "best_of": 1}"#, "n"),
            (
                r#"{"prompt": "a", "use_beam_search": "yes"}"#,
                "use_beam_search",
            ),
            (
                r#"{"prompt": "a", "use_beam_search": true, "stream": true}"#,
                "stream",
            ),
            (
                r#"{"prompt": "a", "use_beam_search": true, "n": 3, "best_of": 2}"#,
                "n",
            ),
            (
                r#"{"prompt": "a", "use_beam_search": true, "best_of": 65}"#,
                "best_of",
            ),
            (
                r#"{"prompt": "a", "use_beam_search": true, "early_stopping": "sometimes"}"#,
                "early_stopping",
            ),
            (
                r#"{"prompt": "a", "length_penalty": "long"}"#,
                "length_penalty",
            ),
        ];
        for (body, field) in cases {
            let (param, message) = err_param(parse_completion(body.as_bytes()));
            assert_eq!(&param, field, "{body}: {message}");
            assert!(message.starts_with(field), "{body}: {message}");
        }
        let chat: &[(&str, &str)] = &[
            (r#"{"messages": []}"#, "messages"),
            (r#"{"messages": [{"content": "x"}]}"#, "messages[0].role"),
            (
                r#"{"messages": [{"role": "user", "content": 3}]}"#,
                "messages[0].content",
            ),
            (
                r#"{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#,
                "messages[0].content[0].type",
            ),
            (
                r#"{"messages": [{"role": "user"}], "logprobs": "yes"}"#,
                "logprobs",
            ),
            (
                r#"{"messages": [{"role": "user"}], "top_logprobs": 3}"#,
                "top_logprobs",
            ),
            (
                r#"{"messages": [{"role": "user"}], "logprobs": true, "top_logprobs": 21}"#,
                "top_logprobs",
            ),
            (
                r#"{"messages": [{"role": "user"}], "max_completion_tokens": -1}"#,
                "max_completion_tokens",
            ),
            (
                r#"{"messages": [{"role": "user"}], "tools": [{"type": "function"}]}"#,
                "tools",
            ),
        ];
        for (body, field) in chat {
            let (param, message) = err_param(parse_chat(body.as_bytes()));
            assert_eq!(&param, field, "{body}: {message}");
        }
    }

    #[test]
    fn bodies_that_are_not_json_objects() {
        for body in [&b"{"[..], b"[1]", b"\xff\xfe", b""] {
            let e = parse_completion(body).expect_err("refused");
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert_eq!(e.param, None);
        }
    }

    #[test]
    fn fields_are_read_and_unknown_ones_ignored() {
        let r = parse_chat(
            br#"{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
                 "max_tokens": 5, "max_completion_tokens": 7, "temperature": 0, "top_k": -1, "seed": -5,
                 "stop": "x", "stop_token_ids": [3], "ignore_eos": true, "stream": true,
                 "stream_options": {"include_usage": true}, "n": 1, "logprobs": false,
                 "user": "u", "metadata": {"a": 1}, "parallel_tool_calls": true}"#,
        )
        .expect("parsed");
        assert_eq!(r.model.as_deref(), Some("m"));
        assert_eq!(r.messages[0]["content"], "a\nb");
        let p = &r.params;
        assert_eq!(p.max_tokens, Some(("max_completion_tokens", 7)));
        assert_eq!(p.sampling.temperature, 0.0);
        assert_eq!(p.sampling.top_k, 0);
        assert_eq!(p.seed, Some(-5i64 as u64));
        assert_eq!(p.stop, vec!["x".to_string()]);
        assert_eq!(p.stop_token_ids, vec![3]);
        assert!(p.ignore_eos && p.stream && p.include_usage);
        assert_eq!(p.n, 1);
        let c = parse_completion(br#"{"prompt": "a", "n": 16}"#).unwrap();
        assert_eq!(c.params.n, 16);
        let c = parse_completion(br#"{"prompt": [[1, 2, 3]], "max_tokens": null}"#).unwrap();
        assert_eq!(c.prompt, Prompt::Ids(vec![1, 2, 3]));
        assert_eq!(c.params.max_tokens, None);
        let c = parse_completion(br#"{"prompt": ["one"]}"#).unwrap();
        assert_eq!(c.prompt, Prompt::Text("one".into()));
    }

    #[test]
    fn beam_search_fields() {
        let c = parse_completion(br#"{"prompt": "a", "best_of": 1}"#).unwrap();
        assert_eq!(c.params.beam, None);
        let c = parse_completion(br#"{"prompt": "a", "use_beam_search": true}"#).unwrap();
        let want = BeamSearch {
            width: 1,
            length_penalty: 1.0,
            early_stopping: EarlyStopping::False,
        };
        assert_eq!(c.params.beam, Some(want));
        let c = parse_completion(
            br#"{"prompt": "a", "use_beam_search": true, "n": 2, "best_of": 4,
                 "length_penalty": 0.5, "early_stopping": "never", "temperature": 0.3}"#,
        )
        .unwrap();
        let want = BeamSearch {
            width: 4,
            length_penalty: 0.5,
            early_stopping: EarlyStopping::Never,
        };
        assert_eq!((c.params.n, c.params.beam), (2, Some(want)));
        // The width defaults to n; chat takes the same fields.
        let r = parse_chat(
            br#"{"messages": [{"role": "user", "content": "x"}], "use_beam_search": true,
                 "n": 3, "early_stopping": true}"#,
        )
        .unwrap();
        let want = BeamSearch {
            width: 3,
            length_penalty: 1.0,
            early_stopping: EarlyStopping::True,
        };
        assert_eq!(r.params.beam, Some(want));
    }

    #[test]
    fn error_json_has_the_openai_shape() {
        let e = ApiError::invalid("max_tokens", "must be at least 1");
        let j = e.to_json();
        assert_eq!(j["error"]["message"], "max_tokens: must be at least 1");
        assert_eq!(j["error"]["type"], "invalid_request_error");
        assert_eq!(j["error"]["param"], "max_tokens");
        assert!(j["error"]["code"].is_null());
    }

    #[test]
    fn logprobs_are_parsed_per_endpoint() {
        let c = |b: &str| parse_completion(b.as_bytes()).expect(b).params.logprobs;
        assert_eq!(c(r#"{"prompt": "a"}"#), None);
        assert_eq!(c(r#"{"prompt": "a", "logprobs": null}"#), None);
        assert_eq!(c(r#"{"prompt": "a", "logprobs": 0}"#), Some(0));
        assert_eq!(c(r#"{"prompt": "a", "logprobs": 20}"#), Some(20));
        let m = r#""messages": [{"role": "user", "content": "hi"}]"#;
        let chat = |rest: &str| {
            let b = format!("{{{m}{rest}}}");
            parse_chat(b.as_bytes()).expect(&b).params.logprobs
        };
        assert_eq!(chat(""), None);
        assert_eq!(chat(r#", "logprobs": false"#), None);
        assert_eq!(chat(r#", "logprobs": false, "top_logprobs": 0"#), None);
        assert_eq!(chat(r#", "logprobs": true"#), Some(0));
        assert_eq!(chat(r#", "logprobs": true, "top_logprobs": 3"#), Some(3));
    }

    #[test]
    fn logprobs_take_each_endpoints_shape() {
        let toks = [
            TokenLogprob {
                token: "Hi".into(),
                bytes: b"Hi".to_vec(),
                logprob: -0.25,
                top: vec![
                    ("Hi".into(), b"Hi".to_vec(), -0.25),
                    ("Yo".into(), b"Yo".to_vec(), -1.5),
                ],
            },
            TokenLogprob {
                token: "!".into(),
                bytes: b"!".to_vec(),
                logprob: f32::NEG_INFINITY,
                top: vec![],
            },
        ];
        let c = logprobs_json(Endpoint::Completions, &toks, 5);
        assert_eq!(
            c,
            json!({
                "tokens": ["Hi", "!"],
                "token_logprobs": [-0.25, -9999.0],
                "top_logprobs": [{"Hi": -0.25, "Yo": -1.5}, {}],
                "text_offset": [5, 7],
            })
        );
        let ch = logprobs_json(Endpoint::Chat, &toks[..1], 0);
        assert_eq!(
            ch,
            json!({"content": [{
                "token": "Hi", "logprob": -0.25, "bytes": [72, 105],
                "top_logprobs": [
                    {"token": "Hi", "logprob": -0.25, "bytes": [72, 105]},
                    {"token": "Yo", "logprob": -1.5, "bytes": [89, 111]},
                ],
            }]})
        );
    }
}
