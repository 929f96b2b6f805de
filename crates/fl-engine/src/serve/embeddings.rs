//! `fl serve` with an encoder model: `POST /v1/embeddings` (OpenAI's shape) and
//! `POST /v1/rerank` (also `/rerank`: the Jina / Cohere shape vLLM and
//! text-embeddings-inference take), on an [`EncoderService`].
//!
//! ```text
//!  clients ──HTTP──► parse + validate (this file)          worker thread (EncoderService)
//!                    tokenize (blocking pool) ──submit───► every queued request, one packed
//!                                                          batch up to max_batched_tokens
//!                    dimensions, L2 norm, JSON ◄─ pending ◄ pooled rows / head logits
//! ```
//!
//! - Embeddings: `input` is a string, an array of strings, an array of token ids, or an array
//!   of arrays of token ids (used as given: no special tokens added); at most
//!   [`EncoderInfo::max_inputs`] of them, none empty. The server's pooling
//!   ([`PoolingConfig`]) makes one vector per input; `dimensions` keeps the first N values
//!   (then L2-normalises again when the server normalises, as Matryoshka models expect);
//!   `encoding_format: "base64"` sends the little-endian f32 bytes, as OpenAI does.
//! - Rerank: `query`, `documents` (strings or `{"text": ...}`), `top_n`, `return_documents`;
//!   each (query, document) pair is scored by the classification head: the sigmoid of the
//!   logit for a one-label head (as vLLM and TEI), else the softmax probability of the last
//!   label; `raw_scores: true` returns the logit (the last label's) instead. Results come
//!   best first. A model without a head answers 400 naming `model`.
//! - Truncation: inputs longer than the model's length ([`EncoderInfo::max_len`]) are cut
//!   to it, as `fl embed` does, unless the server runs with truncation off or the request
//!   sends `truncate: false` (TEI's field): then they are a 400 naming the input.
//! - The decoder's routes answer a 400 saying the model is an encoder (and a decoder server
//!   answers these routes likewise). `/health`, `/metrics` and `/v1/models` work as for a
//!   decoder; `/metrics`' queue gauges are the encoder's.
//!
//! ```
//! use fl_engine::serve::embeddings::{parse_embeddings, EmbeddingInput, EncodingFormat};
//! let r = parse_embeddings(br#"{"input": ["a", "b"], "encoding_format": "base64", "user": "x"}"#, 2048)?;
//! assert_eq!(r.input, EmbeddingInput::Texts(vec!["a".into(), "b".into()]));
//! assert_eq!(r.encoding_format, EncodingFormat::Base64);
//! let e = parse_embeddings(br#"{"input": ""}"#, 2048).unwrap_err();
//! assert_eq!(e.param.as_deref(), Some("input"));
//! # Ok::<(), fl_engine::serve::openai::ApiError>(())
//! ```
//!
//! Serving a model directory (what `fl serve` does with an encoder):
//! ```no_run
//! use std::sync::Arc;
//! use fl_engine::encoder::backend::{EncoderModelDir, GpuEncoder};
//! use fl_engine::encoder::pooling_config::PoolingConfig;
//! use fl_engine::serve::{EncoderInfo, EncoderService, EncoderServiceConfig, ServeConfig, Server};
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = "models/bge-small-en-v1.5";
//! let m = EncoderModelDir::load(dir)?;
//! let pooling = PoolingConfig::resolve(dir, None, None)?;
//! let info = EncoderInfo::new(&m.config, m.tokenizer.as_ref(), m.max_len, pooling)?;
//! let (cfg, weights, head) = (m.config.clone(), m.weights, None);
//! let service = EncoderService::spawn(
//!     move || GpuEncoder::<fl_kernels::f16>::new(0, &cfg, &weights),
//!     head,
//!     EncoderServiceConfig::default(),
//! )?;
//! let server = Server::new_encoder(ServeConfig::new("bge-small"));
//! server.set_encoder_ready(Arc::new(service), info)?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8000").await?;
//! fl_engine::serve::run(listener, server, std::future::pending()).await?;
//! # Ok(()) }
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Serialize;
use serde_json::{json, Map, Value};

use super::encoder_worker::{EncodeError, EncoderService, Task};
use super::openai::{parse_object, ApiError};
use super::{handlers, AppState};
use crate::encoder::backend::{rank, scores_from_logits};
use crate::encoder::pooling_config::PoolingConfig;
use crate::encoder::{reference, Encoded, EncoderConfig, EncoderTokenizer};
use crate::error::{EngineError, Result};
use crate::service::{BackendStats, ServiceStats};
use crate::tokenizer::Tokenizer;

type St = State<Arc<AppState>>;
type BodyBytes = std::result::Result<Bytes, BytesRejection>;

/// Inputs one request may hold by default (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

/// Seconds a client is told to wait before retrying a 503.
const RETRY_AFTER_S: u64 = 1;

/// How embeddings are sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncodingFormat {
    /// JSON numbers.
    Float,
    /// Base64 of the little-endian f32 bytes.
    Base64,
}

/// The `input` of an embeddings request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EmbeddingInput {
    /// Texts, tokenized with the model's tokenizer (special tokens added).
    Texts(Vec<String>),
    /// Token id sequences, used as they are.
    Ids(Vec<Vec<u32>>),
}

impl EmbeddingInput {
    /// Number of inputs.
    pub fn len(&self) -> usize {
        match self {
            EmbeddingInput::Texts(t) => t.len(),
            EmbeddingInput::Ids(s) => s.len(),
        }
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A `POST /v1/embeddings` request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmbeddingsRequest {
    /// `model`, if given.
    pub model: Option<String>,
    /// `input`.
    pub input: EmbeddingInput,
    /// Whether `input` was one string or one flat array of ids (errors then name `input`,
    /// not `input[0]`).
    pub single: bool,
    /// `encoding_format` (default float).
    pub encoding_format: EncodingFormat,
    /// `dimensions`: values kept per embedding (checked against the model by the server).
    pub dimensions: Option<usize>,
    /// `truncate`; `None`: the server's setting.
    pub truncate: Option<bool>,
}

/// A `POST /v1/rerank` request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RerankRequest {
    /// `model`, if given.
    pub model: Option<String>,
    /// `query`.
    pub query: String,
    /// `documents`, as texts.
    pub documents: Vec<String>,
    /// `top_n`: results returned (default all; more than the documents means all).
    pub top_n: Option<usize>,
    /// `return_documents` (default false): each result carries `{"document": {"text"}}`.
    pub return_documents: bool,
    /// `raw_scores` (default false): the logit instead of a probability.
    pub raw_scores: bool,
    /// `truncate`; `None`: the server's setting.
    pub truncate: Option<bool>,
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn expected(field: &str, what: &str, v: &Value) -> ApiError {
    ApiError::invalid(field, format!("expected {what}, got {}", kind(v)))
}

/// A field; `null` reads as absent.
fn field<'a>(m: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    m.get(key).filter(|v| !v.is_null())
}

fn opt_bool(m: &Map<String, Value>, key: &str) -> std::result::Result<Option<bool>, ApiError> {
    field(m, key)
        .map(|v| v.as_bool().ok_or_else(|| expected(key, "true or false", v)))
        .transpose()
}

fn opt_str(m: &Map<String, Value>, key: &str) -> std::result::Result<Option<String>, ApiError> {
    field(m, key)
        .map(|v| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| expected(key, "a string", v))
        })
        .transpose()
}

/// A positive integer field.
fn opt_count(m: &Map<String, Value>, key: &str) -> std::result::Result<Option<usize>, ApiError> {
    let Some(v) = field(m, key) else {
        return Ok(None);
    };
    match v.as_u64() {
        Some(0) => Err(ApiError::invalid(key, "must be at least 1, got 0")),
        Some(n) => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
        None if v.is_number() => Err(ApiError::invalid(
            key,
            format!("must be a positive integer, got {v}"),
        )),
        None => Err(expected(key, "a positive integer", v)),
    }
}

fn ids_of(list: &[Value], field: &str) -> std::result::Result<Vec<u32>, ApiError> {
    if list.is_empty() {
        return Err(ApiError::invalid(field, "must not be empty"));
    }
    list.iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| expected(&format!("{field}[{i}]"), "a token id", v))
        })
        .collect()
}

fn too_many(field: &str, n: usize, max: usize) -> std::result::Result<(), ApiError> {
    if n > max {
        return Err(ApiError::invalid(
            field,
            format!("{n} inputs; at most {max} per request"),
        ));
    }
    Ok(())
}

/// Parses a `/v1/embeddings` body; `max_inputs` bounds the number of inputs. `user` and
/// unknown fields are ignored.
///
/// # Errors
/// 400 naming the field: `input` missing, empty, an empty string or sequence, more than
/// `max_inputs` entries, or a mix of strings and ids (`input[i]`); `encoding_format` other
/// than `float` / `base64`; `dimensions` not a positive integer; `truncate` not a boolean.
pub fn parse_embeddings(
    body: &[u8],
    max_inputs: usize,
) -> std::result::Result<EmbeddingsRequest, ApiError> {
    let m = parse_object(body)?;
    let model = opt_str(&m, "model")?;
    let (input, single) = match field(&m, "input") {
        None => return Err(ApiError::invalid("input", "is required")),
        Some(Value::String(s)) if s.is_empty() => {
            return Err(ApiError::invalid("input", "must not be an empty string"))
        }
        Some(Value::String(s)) => (EmbeddingInput::Texts(vec![s.clone()]), true),
        Some(Value::Array(list)) => match list.first() {
            None => return Err(ApiError::invalid("input", "must not be empty")),
            Some(Value::Number(_)) => (EmbeddingInput::Ids(vec![ids_of(list, "input")?]), true),
            Some(Value::String(_)) => {
                too_many("input", list.len(), max_inputs)?;
                let texts = list
                    .iter()
                    .enumerate()
                    .map(|(i, v)| match v {
                        Value::String(s) if s.is_empty() => Err(ApiError::invalid(
                            format!("input[{i}]"),
                            "must not be an empty string",
                        )),
                        Value::String(s) => Ok(s.clone()),
                        v => Err(expected(&format!("input[{i}]"), "a string", v)),
                    })
                    .collect::<std::result::Result<_, _>>()?;
                (EmbeddingInput::Texts(texts), false)
            }
            Some(Value::Array(_)) => {
                too_many("input", list.len(), max_inputs)?;
                let seqs = list
                    .iter()
                    .enumerate()
                    .map(|(i, v)| match v {
                        Value::Array(ids) => ids_of(ids, &format!("input[{i}]")),
                        v => Err(expected(&format!("input[{i}]"), "an array of token ids", v)),
                    })
                    .collect::<std::result::Result<_, _>>()?;
                (EmbeddingInput::Ids(seqs), false)
            }
            Some(v) => {
                return Err(expected(
                    "input[0]",
                    "a string, a token id or an array of token ids",
                    v,
                ))
            }
        },
        Some(v) => {
            return Err(expected(
                "input",
                "a string, an array of strings, an array of token ids or an array of arrays \
                 of token ids",
                v,
            ))
        }
    };
    let encoding_format = match opt_str(&m, "encoding_format")?.as_deref() {
        None | Some("float") => EncodingFormat::Float,
        Some("base64") => EncodingFormat::Base64,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("`{other}`: expected \"float\" or \"base64\""),
            ))
        }
    };
    Ok(EmbeddingsRequest {
        model,
        input,
        single,
        encoding_format,
        dimensions: opt_count(&m, "dimensions")?,
        truncate: opt_bool(&m, "truncate")?,
    })
}

/// Parses a `/v1/rerank` body; `max_inputs` bounds the number of documents.
///
/// # Errors
/// 400 naming the field: `query` missing, not a string or empty; `documents` missing, empty,
/// more than `max_inputs`, or an entry neither a string nor `{"text": string}`
/// (`documents[i]`); `top_n` not a positive integer; a flag not a boolean.
pub fn parse_rerank(
    body: &[u8],
    max_inputs: usize,
) -> std::result::Result<RerankRequest, ApiError> {
    let m = parse_object(body)?;
    let query = match opt_str(&m, "query")? {
        None => return Err(ApiError::invalid("query", "is required")),
        Some(q) if q.is_empty() => return Err(ApiError::invalid("query", "must not be empty")),
        Some(q) => q,
    };
    let documents = match field(&m, "documents") {
        None => return Err(ApiError::invalid("documents", "is required")),
        Some(Value::Array(l)) if l.is_empty() => {
            return Err(ApiError::invalid("documents", "must not be empty"))
        }
        Some(Value::Array(l)) => {
            too_many("documents", l.len(), max_inputs)?;
            l.iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) => Ok(s.clone()),
                    Value::Object(o) => match o.get("text") {
                        Some(Value::String(s)) => Ok(s.clone()),
                        _ => Err(ApiError::invalid(
                            format!("documents[{i}]"),
                            "an object document needs a string `text`",
                        )),
                    },
                    v => Err(expected(&format!("documents[{i}]"), "a string", v)),
                })
                .collect::<std::result::Result<_, _>>()?
        }
        Some(v) => return Err(expected("documents", "an array of strings", v)),
    };
    Ok(RerankRequest {
        model: opt_str(&m, "model")?,
        query,
        documents,
        top_n: opt_count(&m, "top_n")?,
        return_documents: opt_bool(&m, "return_documents")?.unwrap_or(false),
        raw_scores: opt_bool(&m, "raw_scores")?.unwrap_or(false),
        truncate: opt_bool(&m, "truncate")?,
    })
}

/// Standard base64 (with padding) of `bytes`.
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16
            | (c.get(1).copied().unwrap_or(0) as u32) << 8
            | c.get(2).copied().unwrap_or(0) as u32;
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= c.len() {
                out.push(ABC[(n >> shift) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The two tokenizers a request may need: truncating to the model's length, and one that
/// cuts one token later (a sequence that reaches it was too long).
struct Tokenizers {
    cut: EncoderTokenizer,
    check: EncoderTokenizer,
}

/// What the encoder handlers know of the model besides the service.
#[derive(Clone)]
pub struct EncoderInfo {
    /// The pooling each embedding gets, and whether it is L2-normalised.
    pub pooling: PoolingConfig,
    /// Whether inputs longer than [`max_len`](Self::max_len) are cut (`true`) or refused,
    /// for requests that do not send `truncate`.
    pub truncate: bool,
    /// Inputs (or documents) one request may hold.
    pub max_inputs: usize,
    max_len: usize,
    vocab_size: usize,
    num_labels: usize,
    tokenizers: Option<Arc<Tokenizers>>,
}

impl std::fmt::Debug for EncoderInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncoderInfo")
            .field("pooling", &self.pooling)
            .field("truncate", &self.truncate)
            .field("max_inputs", &self.max_inputs)
            .field("max_len", &self.max_len)
            .field("tokenizer", &self.tokenizers.is_some())
            .finish()
    }
}

impl EncoderInfo {
    /// For a model of `cfg` whose sequences keep `max_len` tokens (special tokens included;
    /// see [`EncoderModelDir::max_len`](crate::encoder::backend::EncoderModelDir::max_len)),
    /// with its tokenizer (`None`: token-id inputs only). Truncation on, [`MAX_INPUTS`].
    ///
    /// # Errors
    /// [`EngineError::Invalid`] naming `max_len` (0, beyond the model's positions, or too
    /// short for a pair beside the special tokens); [`EngineError::Tokenizer`].
    pub fn new(
        cfg: &EncoderConfig,
        tokenizer: Option<&Tokenizer>,
        max_len: usize,
        pooling: PoolingConfig,
    ) -> Result<Self> {
        if max_len == 0 || max_len > cfg.max_sequence_len() {
            return Err(EngineError::invalid(
                "max_len",
                format!(
                    "{max_len}: must be in 1..={} (the model's positions)",
                    cfg.max_sequence_len()
                ),
            ));
        }
        let tokenizers = tokenizer
            .map(|t| {
                Ok::<_, EngineError>(Arc::new(Tokenizers {
                    cut: EncoderTokenizer::with_max_len(t, max_len)?,
                    check: EncoderTokenizer::with_max_len(t, max_len + 1)?,
                }))
            })
            .transpose()?;
        Ok(EncoderInfo {
            pooling,
            truncate: true,
            max_inputs: MAX_INPUTS,
            max_len,
            vocab_size: cfg.vocab_size,
            num_labels: cfg.num_labels,
            tokenizers,
        })
    }

    /// Tokens a sequence keeps, special tokens included.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Whether text inputs are served (the model has a `tokenizer.json`).
    pub fn has_tokenizer(&self) -> bool {
        self.tokenizers.is_some()
    }

    fn tokenizer(
        &self,
        field: &str,
        truncate: bool,
    ) -> std::result::Result<&EncoderTokenizer, ApiError> {
        let t = self.tokenizers.as_ref().ok_or_else(|| {
            ApiError::invalid(
                field,
                "this model has no tokenizer.json: send the input as token ids",
            )
        })?;
        Ok(if truncate { &t.cut } else { &t.check })
    }

    fn too_long(&self, field: String, len: usize) -> ApiError {
        ApiError::invalid(
            field,
            format!(
                "is {len} tokens; this model takes at most {} (send truncate: true to cut it)",
                self.max_len
            ),
        )
    }

    /// An embeddings request's inputs as sequences (on the blocking pool: tokenizing is slow).
    fn encode_inputs(
        &self,
        req: &EmbeddingsRequest,
        truncate: bool,
    ) -> std::result::Result<Encoded, ApiError> {
        let name = |i: usize| {
            if req.single {
                "input".to_string()
            } else {
                format!("input[{i}]")
            }
        };
        let enc = match &req.input {
            EmbeddingInput::Texts(texts) => self
                .tokenizer("input", truncate)?
                .encode_texts(texts)
                .map_err(|e| ApiError::invalid("input", e))?,
            EmbeddingInput::Ids(seqs) => {
                let mut e = Encoded::default();
                for (i, ids) in seqs.iter().enumerate() {
                    if let Some(j) = ids.iter().position(|&t| t as usize >= self.vocab_size) {
                        let at = if req.single {
                            format!("input[{j}]")
                        } else {
                            format!("input[{i}][{j}]")
                        };
                        return Err(ApiError::invalid(
                            at,
                            format!(
                                "token id {} >= the vocabulary size {}",
                                ids[j], self.vocab_size
                            ),
                        ));
                    }
                    let keep = if truncate {
                        ids.len().min(self.max_len)
                    } else {
                        ids.len()
                    };
                    e.ids.push(ids[..keep].to_vec());
                    e.token_types.push(vec![0; keep]);
                }
                e
            }
        };
        if let Some(i) = enc.ids.iter().position(|s| s.len() > self.max_len) {
            return Err(self.too_long(name(i), enc.ids[i].len()));
        }
        Ok(enc)
    }

    /// A rerank request's (query, document) pairs.
    fn encode_pairs(
        &self,
        req: &RerankRequest,
        truncate: bool,
    ) -> std::result::Result<Encoded, ApiError> {
        let enc = self
            .tokenizer("query", truncate)?
            .encode_pairs(&req.query, &req.documents)
            .map_err(|e| ApiError::invalid("documents", e))?;
        if let Some(i) = enc.ids.iter().position(|s| s.len() > self.max_len) {
            return Err(ApiError::invalid(
                format!("documents[{i}]"),
                format!(
                    "with the query is more than {} tokens, what this model takes (send \
                     truncate: true to cut it)",
                    self.max_len
                ),
            ));
        }
        Ok(enc)
    }
}

/// The encoder once loaded.
pub(super) struct EncoderReady {
    pub(super) service: Arc<EncoderService>,
    pub(super) info: EncoderInfo,
}

fn json_response(v: &impl Serialize) -> Response {
    match serde_json::to_string(v) {
        Ok(s) => ([(header::CONTENT_TYPE, "application/json")], s).into_response(),
        Err(e) => ApiError::internal(format!("cannot write the response: {e}")).into_response(),
    }
}

/// Counts a refused request and answers it (as the decoder's handlers do).
fn refuse(st: &AppState, e: ApiError) -> Response {
    let f = &st.metrics.failures;
    let counter = match e.status {
        StatusCode::SERVICE_UNAVAILABLE => &f.overloaded,
        s if s.is_client_error() => &f.invalid,
        _ => &f.error,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    e.into_response()
}

fn ready(st: &AppState) -> std::result::Result<&EncoderReady, ApiError> {
    st.encoder
        .as_ref()
        .and_then(|slot| slot.get())
        .ok_or_else(|| ApiError::unavailable("the model is loading; retry shortly", RETRY_AFTER_S))
}

fn body_bytes(st: &AppState, body: BodyBytes) -> std::result::Result<Bytes, ApiError> {
    body.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(st.cfg.max_body_bytes)
        } else {
            ApiError::bad_request(format!("cannot read the request body: {}", r.body_text()))
        }
    })
}

fn check_model(st: &AppState, model: Option<&str>) -> std::result::Result<(), ApiError> {
    match model {
        Some(m) if m != st.cfg.model_name => Err(ApiError::model_not_found(m, &st.cfg.model_name)),
        _ => Ok(()),
    }
}

fn check_capacity(st: &AppState, r: &EncoderReady) -> std::result::Result<(), ApiError> {
    let waiting = r.service.stats().waiting;
    if waiting >= st.cfg.max_waiting {
        return Err(ApiError::unavailable(
            format!("the server is at capacity ({waiting} requests waiting); retry shortly"),
            RETRY_AFTER_S,
        ));
    }
    Ok(())
}

/// A service refusal or failure as the client's error; `field` is the input's name.
fn encode_error(e: EncodeError, field: &str) -> ApiError {
    match e {
        EncodeError::Invalid(EngineError::Invalid { reason, .. }) => {
            ApiError::invalid(field, reason)
        }
        EncodeError::Invalid(e) => ApiError::invalid(field, e),
        EncodeError::Shutdown => {
            ApiError::unavailable("the server is shutting down", RETRY_AFTER_S)
        }
        e @ (EncodeError::Failed(_) | EncodeError::Stopped) => ApiError::internal(e.to_string()),
    }
}

/// Tokenizes on the blocking pool, then queues on the worker; the pending answer and the
/// tokens it holds.
async fn submit(
    r: &EncoderReady,
    field: &'static str,
    task: Task,
    encode: impl FnOnce(&EncoderInfo) -> std::result::Result<Encoded, ApiError> + Send + 'static,
) -> std::result::Result<(Vec<f32>, usize), ApiError> {
    let info = r.info.clone();
    let service = Arc::clone(&r.service);
    let (pending, tokens) = tokio::task::spawn_blocking(move || {
        let enc = encode(&info)?;
        let tokens: usize = enc.ids.iter().map(Vec::len).sum();
        let p = service
            .submit(enc, task)
            .map_err(|e| encode_error(e, field))?;
        Ok::<_, ApiError>((p, tokens))
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenize: {e}")))??;
    let out = pending.wait().await.map_err(|e| encode_error(e, field))?;
    Ok((out, tokens))
}

fn count_success(st: &AppState, arrival: Instant, tokens: usize) {
    let m = &st.metrics;
    m.prompt_tokens.fetch_add(tokens as u64, Ordering::Relaxed);
    m.success.stop.fetch_add(1, Ordering::Relaxed);
    m.e2e.observe(arrival.elapsed());
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: usize,
    total_tokens: usize,
}

impl Usage {
    fn new(tokens: usize) -> Self {
        Usage {
            prompt_tokens: tokens,
            total_tokens: tokens,
        }
    }
}

#[derive(Serialize)]
#[serde(untagged)]
enum Vector<'a> {
    Float(&'a [f32]),
    Base64(String),
}

#[derive(Serialize)]
struct Embedding<'a> {
    object: &'static str,
    index: usize,
    embedding: Vector<'a>,
}

#[derive(Serialize)]
struct EmbeddingsResponse<'a> {
    object: &'static str,
    data: Vec<Embedding<'a>>,
    model: &'a str,
    usage: Usage,
}

async fn embeddings(State(st): St, body: BodyBytes) -> Response {
    let arrival = Instant::now();
    let result = async {
        let body = body_bytes(&st, body)?;
        let r = ready(&st)?;
        let req = parse_embeddings(&body, r.info.max_inputs)?;
        check_model(&st, req.model.as_deref())?;
        let hidden = r.service.config().hidden_size;
        let dim = match req.dimensions {
            Some(d) if d > hidden => {
                return Err(ApiError::invalid(
                    "dimensions",
                    format!("{d} is more than the model's {hidden} dimensions"),
                ))
            }
            d => d.unwrap_or(hidden),
        };
        check_capacity(&st, r)?;
        let truncate = req.truncate.unwrap_or(r.info.truncate);
        let format = req.encoding_format;
        let task = Task::Embed(r.info.pooling.pooling);
        let (rows, tokens) = submit(r, "input", task, move |info| {
            info.encode_inputs(&req, truncate)
        })
        .await?;
        let mut out: Vec<f32> = rows
            .chunks(hidden)
            .flat_map(|v| &v[..dim])
            .copied()
            .collect();
        if r.info.pooling.normalize {
            reference::l2_normalize(&mut out, dim)
                .map_err(|e| ApiError::internal(e.to_string()))?;
        }
        let data = out
            .chunks(dim)
            .enumerate()
            .map(|(index, v)| Embedding {
                object: "embedding",
                index,
                embedding: match format {
                    EncodingFormat::Float => Vector::Float(v),
                    EncodingFormat::Base64 => {
                        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                        Vector::Base64(base64(&bytes))
                    }
                },
            })
            .collect();
        let resp = json_response(&EmbeddingsResponse {
            object: "list",
            data,
            model: &st.cfg.model_name,
            usage: Usage::new(tokens),
        });
        count_success(&st, arrival, tokens);
        Ok::<_, ApiError>(resp)
    }
    .await;
    result.unwrap_or_else(|e| refuse(&st, e))
}

#[derive(Serialize)]
struct Document<'a> {
    text: &'a str,
}

#[derive(Serialize)]
struct RerankResult<'a> {
    index: usize,
    relevance_score: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    document: Option<Document<'a>>,
}

#[derive(Serialize)]
struct RerankResponse<'a> {
    id: String,
    model: &'a str,
    results: Vec<RerankResult<'a>>,
    usage: Usage,
}

/// One relevance score per pair from the head's logits (see the [module docs](self)).
fn relevance(
    logits: &[f32],
    num_labels: usize,
    raw: bool,
) -> std::result::Result<Vec<f32>, ApiError> {
    let bad = |e: EngineError| ApiError::internal(e.to_string());
    if num_labels == 0 || logits.len() % num_labels != 0 {
        return Err(bad(EngineError::invalid(
            "num_labels",
            format!("{num_labels} does not divide the {} logits", logits.len()),
        )));
    }
    Ok(match (raw, num_labels) {
        (true, n) => logits.chunks(n).map(|row| row[n - 1]).collect(),
        (false, 1) => logits.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect(),
        (false, n) => scores_from_logits(logits, n).map_err(bad)?,
    })
}

fn response_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("rerank-{:016x}{n:08x}", now.as_nanos() as u64)
}

async fn rerank(State(st): St, body: BodyBytes) -> Response {
    let arrival = Instant::now();
    let result = async {
        let body = body_bytes(&st, body)?;
        let r = ready(&st)?;
        let req = parse_rerank(&body, r.info.max_inputs)?;
        check_model(&st, req.model.as_deref())?;
        if !r.service.has_head() {
            return Err(ApiError::invalid(
                "model",
                format!(
                    "`{}` has no sequence-classification head (its config.json names no \
                     *ForSequenceClassification architecture): /v1/rerank needs a \
                     cross-encoder reranker; use /v1/embeddings with this model",
                    st.cfg.model_name
                ),
            ));
        }
        if !r.info.has_tokenizer() {
            return Err(ApiError::invalid(
                "query",
                "this model has no tokenizer.json, which reranking needs",
            ));
        }
        check_capacity(&st, r)?;
        let truncate = req.truncate.unwrap_or(r.info.truncate);
        let req = Arc::new(req);
        let pairs = Arc::clone(&req);
        let (logits, tokens) = submit(r, "documents", Task::Classify, move |info| {
            info.encode_pairs(&pairs, truncate)
        })
        .await?;
        let scores = relevance(&logits, r.info.num_labels, req.raw_scores)?;
        let top = req.top_n.unwrap_or(scores.len());
        let results = rank(&scores)
            .into_iter()
            .take(top)
            .map(|(index, relevance_score)| RerankResult {
                index,
                relevance_score,
                document: req.return_documents.then(|| Document {
                    text: &req.documents[index],
                }),
            })
            .collect();
        let resp = json_response(&RerankResponse {
            id: response_id(),
            model: &st.cfg.model_name,
            results,
            usage: Usage::new(tokens),
        });
        count_success(&st, arrival, tokens);
        Ok::<_, ApiError>(resp)
    }
    .await;
    result.unwrap_or_else(|e| refuse(&st, e))
}

/// 200 once the encoder serves, 503 while it loads or after its worker stopped.
async fn health(State(st): St) -> Response {
    let (status, what) = match st.encoder.as_ref().and_then(|s| s.get()) {
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

/// The decoder's exposition with the encoder's queue as its gauges, plus the batch counters.
async fn metrics(State(st): St) -> Response {
    let s = st
        .encoder
        .as_ref()
        .and_then(|s| s.get())
        .map(|r| r.service.stats())
        .unwrap_or_default();
    let stats = ServiceStats {
        backend: BackendStats {
            waiting: s.waiting.saturating_sub(s.running),
            running: s.running,
            ..BackendStats::default()
        },
        active: s.waiting,
        submitted: s.submitted,
        ended: s.ended,
        steps: s.batches,
        failed_steps: s.failed_batches,
        ..ServiceStats::default()
    };
    let mut text = st.metrics.render(Some(stats));
    for (name, help, v) in [
        (
            "fl_encoder_batch_sequences_total",
            "Sequences the encoder's forwards took.",
            s.batch_seqs,
        ),
        (
            "fl_encoder_batch_tokens_total",
            "Tokens the encoder's forwards took.",
            s.batch_tokens,
        ),
    ] {
        text += &format!("# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}\n");
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn models(State(st): St) -> Response {
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
            "max_model_len": r.info.max_len,
        }],
    }))
}

/// A decoder route on an encoder server.
async fn decoder_route(State(st): St, uri: Uri) -> Response {
    let e = ApiError::invalid(
        "model",
        format!(
            "`{}` is an encoder model (embeddings, reranking): {} needs a text-generation \
             model; this server answers POST /v1/embeddings and POST /v1/rerank",
            st.cfg.model_name,
            uri.path()
        ),
    );
    refuse(&st, e)
}

/// An encoder route on a decoder server.
pub(super) async fn encoder_route(State(st): St, uri: Uri) -> Response {
    let e = ApiError::invalid(
        "model",
        format!(
            "`{}` is a decoder (text-generation) model: {} needs an encoder model (BERT, \
             RoBERTa, XLM-RoBERTa); serve one with `fl serve --model DIR`",
            st.cfg.model_name,
            uri.path()
        ),
    );
    refuse(&st, e)
}

/// The routes of an encoder server (see the [module docs](self)).
pub(super) fn router(st: Arc<AppState>) -> Router {
    let api = Router::new()
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/rerank", post(rerank))
        .route("/rerank", post(rerank))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(decoder_route))
        .route("/v1/completions", post(decoder_route))
        .route("/tokenize", post(decoder_route))
        .route("/detokenize", post(decoder_route))
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&st),
            handlers::auth,
        ));
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .merge(api)
        .fallback(handlers::not_found)
        .layer(DefaultBodyLimit::max(st.cfg.max_body_bytes))
        .with_state(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(r: std::result::Result<impl std::fmt::Debug, ApiError>) -> (String, String) {
        let e = r.expect_err("an error");
        assert_eq!(e.status, StatusCode::BAD_REQUEST, "{e:?}");
        (e.param.unwrap_or_default(), e.message)
    }

    #[test]
    fn embedding_inputs_of_every_shape() {
        let p = |b: &str| parse_embeddings(b.as_bytes(), 4).unwrap();
        let r = p(r#"{"input": "hi", "model": "m", "user": 7}"#);
        assert_eq!(r.input, EmbeddingInput::Texts(vec!["hi".into()]));
        assert!(r.single);
        assert_eq!(r.model.as_deref(), Some("m"));
        assert_eq!(
            (r.encoding_format, r.dimensions, r.truncate),
            (EncodingFormat::Float, None, None)
        );
        let r = p(r#"{"input": [1, 2, 3], "dimensions": 8, "truncate": false}"#);
        assert_eq!(r.input, EmbeddingInput::Ids(vec![vec![1, 2, 3]]));
        assert!(r.single);
        assert_eq!((r.dimensions, r.truncate), (Some(8), Some(false)));
        let r = p(r#"{"input": [[1], [2, 3]], "encoding_format": "base64"}"#);
        assert_eq!(r.input, EmbeddingInput::Ids(vec![vec![1], vec![2, 3]]));
        assert!(!r.single);
        assert_eq!(r.encoding_format, EncodingFormat::Base64);
        let r = p(r#"{"input": ["a", "b", "c", "d"]}"#);
        assert_eq!(r.input.len(), 4);
        assert!(!r.single);
    }

    #[test]
    fn embedding_errors_name_the_field() {
        for (body, field) in [
            (r#"{}"#, "input"),
            (r#"{"input": null}"#, "input"),
            (r#"{"input": ""}"#, "input"),
            (r#"{"input": []}"#, "input"),
            (r#"{"input": 5}"#, "input"),
            (r#"{"input": ["a", ""]}"#, "input[1]"),
            (r#"{"input": ["a", 3]}"#, "input[1]"),
            (r#"{"input": [1, "a"]}"#, "input[1]"),
            (r#"{"input": [1, -1]}"#, "input[1]"),
            (r#"{"input": [[1], []]}"#, "input[1]"),
            (r#"{"input": [[1], [2, 5000000000]]}"#, "input[1][1]"),
            (r#"{"input": [[1], "a"]}"#, "input[1]"),
            (r#"{"input": [{}]}"#, "input[0]"),
            (r#"{"input": ["a", "b", "c", "d", "e"]}"#, "input"),
            (r#"{"input": [[1], [1], [1], [1], [1]]}"#, "input"),
            (
                r#"{"input": "a", "encoding_format": "int8"}"#,
                "encoding_format",
            ),
            (r#"{"input": "a", "encoding_format": 1}"#, "encoding_format"),
            (r#"{"input": "a", "dimensions": 0}"#, "dimensions"),
            (r#"{"input": "a", "dimensions": -3}"#, "dimensions"),
            (r#"{"input": "a", "dimensions": 2.5}"#, "dimensions"),
            (r#"{"input": "a", "dimensions": "8"}"#, "dimensions"),
            (r#"{"input": "a", "truncate": "no"}"#, "truncate"),
            (r#"{"input": "a", "model": 3}"#, "model"),
        ] {
            let (param, msg) = err(parse_embeddings(body.as_bytes(), 4));
            assert_eq!(param, field, "{body}: {msg}");
            assert!(msg.starts_with(field), "{msg}");
        }
        let e = parse_embeddings(b"[1]", 4).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn rerank_requests() {
        let r = parse_rerank(
            br#"{"query": "q", "documents": ["a", {"text": "b"}], "top_n": 1,
                 "return_documents": true, "model": "m"}"#,
            4,
        )
        .unwrap();
        assert_eq!(r.documents, ["a", "b"]);
        assert_eq!(
            (r.top_n, r.return_documents, r.raw_scores),
            (Some(1), true, false)
        );
        for (body, field) in [
            (r#"{"documents": ["a"]}"#, "query"),
            (r#"{"query": "", "documents": ["a"]}"#, "query"),
            (r#"{"query": 1, "documents": ["a"]}"#, "query"),
            (r#"{"query": "q"}"#, "documents"),
            (r#"{"query": "q", "documents": []}"#, "documents"),
            (r#"{"query": "q", "documents": "a"}"#, "documents"),
            (r#"{"query": "q", "documents": ["a", 1]}"#, "documents[1]"),
            (
                r#"{"query": "q", "documents": [{"txt": "a"}]}"#,
                "documents[0]",
            ),
            (
                r#"{"query": "q", "documents": ["a","b","c","d","e"]}"#,
                "documents",
            ),
            (r#"{"query": "q", "documents": ["a"], "top_n": 0}"#, "top_n"),
            (
                r#"{"query": "q", "documents": ["a"], "return_documents": 1}"#,
                "return_documents",
            ),
        ] {
            let (param, msg) = err(parse_rerank(body.as_bytes(), 4));
            assert_eq!(param, field, "{body}: {msg}");
        }
    }

    #[test]
    fn base64_matches_the_rfc_vectors() {
        for (raw, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(raw.as_bytes()), enc);
        }
        assert_eq!(base64(&[0xff, 0xfe, 0x00]), "//4A");
    }

    #[test]
    fn relevance_scores() {
        let s = relevance(&[0.0, 2.0], 1, false).unwrap();
        assert!((s[0] - 0.5).abs() < 1e-7 && (s[1] - 0.880_797_1).abs() < 1e-6);
        assert_eq!(relevance(&[0.0, 2.0], 1, true).unwrap(), [0.0, 2.0]);
        assert_eq!(
            relevance(&[1.0, 3.0, 0.5, -1.0], 2, true).unwrap(),
            [3.0, -1.0]
        );
        let s = relevance(&[1.0, 1.0], 2, false).unwrap();
        assert!((s[0] - 0.5).abs() < 1e-7);
        assert_eq!(
            relevance(&[1.0, 2.0, 3.0], 2, false).unwrap_err().status,
            500
        );
    }
}
