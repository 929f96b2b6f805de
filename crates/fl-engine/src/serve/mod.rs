//! `fl serve`: an OpenAI-compatible HTTP server (axum + tokio) on a [`Service`].
//!
//! ```text
//!  clients ──HTTP──► axum handlers (tokio tasks)              worker thread (Service)
//!                    parse + validate (openai.rs)             ───────────────────────
//!                    template + tokenize (blocking pool)      continuous batching:
//!                    Service::submit_with_sink ──command────► Runner::step, one event
//!                    ◄── tokio channel ◄── sink callback ◄─── per token per request
//!                    detokenize + stop strings (text.rs)
//!                    JSON or SSE chunks ──► client
//! ```
//!
//! - The server never sees the GPU: the engine runs on the service's worker thread, and
//!   handlers never block the runtime (the worker hands events to a callback that forwards
//!   them to an unbounded tokio channel, so a slow client never stalls the engine; template
//!   rendering and tokenization run on tokio's blocking pool).
//! - Endpoints: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`,
//!   `POST /tokenize`, `POST /detokenize` (these need the bearer token when an API key is
//!   set), `GET /health` (503 while the model loads, 200 once ready) and `GET /metrics`
//!   (Prometheus text), which stay open for probes and scrapers.
//! - `n` > 1 runs each choice as its own engine request (seed `s + i` for choice `i`),
//!   sharing the prompt's KV blocks through the prefix cache; see `handlers::generate`.
//! - `use_beam_search: true` (vLLM's field; `best_of` the width, `length_penalty`,
//!   `early_stopping`) runs one beam search request ([`Service::submit_beam_with_sink`]) whose
//!   `n` best hypotheses are the choices, best first; it is answered whole, never streamed.
//! - With an encoder model ([`Server::new_encoder`]) the server answers `POST /v1/embeddings`
//!   and `POST /v1/rerank` instead of the completion routes, on an [`EncoderService`]
//!   (see [`embeddings`]).
//! - Every request is validated before it is queued; errors are OpenAI's JSON
//!   (`{"error": {"message", "type", "param", "code"}}`) naming the field.
//! - A client that goes away aborts its request (the handler's future or the SSE body is
//!   dropped, and with it a guard that aborts the request). Beyond
//!   [`ServeConfig::max_waiting`] requests waiting, new ones get 503 with `Retry-After`.
//!
//! ```no_run
//! use std::sync::Arc;
//! use fl_engine::serve::{ModelInfo, ServeConfig, Server};
//! use fl_engine::service::Service;
//! # fn service() -> Service { unimplemented!() }
//! # async fn demo() -> std::io::Result<()> {
//! let server = Server::new(ServeConfig::new("my-model"));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8000").await?;
//! // Bind first: /health answers 503 while the weights load.
//! let http = tokio::spawn(fl_engine::serve::run(listener, server.clone(), async {
//!     let _ = tokio::signal::ctrl_c().await;
//! }));
//! let service = Arc::new(service()); // Service::spawn(...) on the blocking pool
//! let info = ModelInfo::new(4096, 32000, vec![2]);
//! server.set_ready(service, info).expect("once");
//! http.await.expect("server task")?;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;

use crate::chat_template::ChatTemplate;
use crate::service::Service;
use crate::tokenizer::Tokenizer;

pub mod embeddings;
pub mod encoder_worker;
mod handlers;
pub mod metrics;
pub mod openai;
pub mod text;

pub use embeddings::EncoderInfo;
pub use encoder_worker::{EncoderService, EncoderServiceConfig};
use metrics::Metrics;

/// How the server answers, independent of the model.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The model's name in `/v1/models` and responses; a request naming another model gets 404.
    pub model_name: String,
    /// When set, the `/v1` and tokenize routes need `Authorization: Bearer <key>` (401).
    pub api_key: Option<String>,
    /// Requests that may wait for a slot at once; beyond, 503 with `Retry-After`.
    pub max_waiting: usize,
    /// Largest request body accepted (413 beyond).
    pub max_body_bytes: usize,
}

impl ServeConfig {
    /// No API key, 1,024 waiting requests, 16 MiB bodies.
    pub fn new(model_name: impl Into<String>) -> Self {
        ServeConfig {
            model_name: model_name.into(),
            api_key: None,
            max_waiting: 1024,
            max_body_bytes: 16 << 20,
        }
    }
}

/// What the server knows of the model once it is loaded.
#[derive(Clone)]
pub struct ModelInfo {
    /// Longest sequence (prompt + output) the runner accepts.
    pub max_model_len: usize,
    /// Token ids must be below this.
    pub vocab_size: usize,
    /// End-of-sequence ids (they stop a request unless `ignore_eos`).
    pub eos_token_ids: Vec<u32>,
    /// Tokens the KV pool holds (`None`: no limit beyond `max_model_len`); a request's
    /// default `max_tokens` fits in it.
    pub kv_capacity_tokens: Option<usize>,
    /// The tokenizer; without one, prompts must be token ids and output text is the ids
    /// ([`text::IdText`]).
    pub tokenizer: Option<Arc<Tokenizer>>,
    /// The chat template; without one, `/v1/chat/completions` answers 400.
    pub chat_template: Option<Arc<ChatTemplate>>,
}

impl ModelInfo {
    /// A model without tokenizer, chat template or KV limit.
    pub fn new(max_model_len: usize, vocab_size: usize, eos_token_ids: Vec<u32>) -> Self {
        ModelInfo {
            max_model_len,
            vocab_size,
            eos_token_ids,
            kv_capacity_tokens: None,
            tokenizer: None,
            chat_template: None,
        }
    }
}

impl std::fmt::Debug for ModelInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelInfo")
            .field("max_model_len", &self.max_model_len)
            .field("vocab_size", &self.vocab_size)
            .field("eos_token_ids", &self.eos_token_ids)
            .field("kv_capacity_tokens", &self.kv_capacity_tokens)
            .field("tokenizer", &self.tokenizer.is_some())
            .field("chat_template", &self.chat_template.is_some())
            .finish()
    }
}

/// The model once loaded.
struct Ready {
    service: Arc<Service>,
    model: ModelInfo,
}

/// State shared by every handler.
struct AppState {
    cfg: ServeConfig,
    ready: OnceLock<Ready>,
    metrics: Metrics,
    /// Requests submitted and not yet ended (for the waiting-queue limit).
    in_flight: AtomicUsize,
    /// Unix seconds at start (`created` of `/v1/models`).
    created: u64,
    /// `Some` for an encoder server ([`Server::new_encoder`]): the encoder once loaded.
    encoder: Option<OnceLock<embeddings::EncoderReady>>,
}

/// The HTTP server: cheap to clone (one shared state). See the [module docs](self).
#[derive(Clone)]
pub struct Server {
    state: Arc<AppState>,
}

/// [`Server::set_ready`] was called twice, or for the other kind of model (a decoder's
/// service on an encoder server or the reverse).
#[derive(Debug, thiserror::Error)]
#[error("serve: the model is already set, or is not the kind this server was made for")]
pub struct AlreadyReady;

impl Server {
    /// A server with no model yet: model routes answer 503 until [`set_ready`](Self::set_ready).
    pub fn new(cfg: ServeConfig) -> Self {
        Self::with_mode(cfg, None)
    }

    /// A server for an encoder model: `/v1/embeddings` and `/v1/rerank` (503 until
    /// [`set_encoder_ready`](Self::set_encoder_ready)); the completion routes answer 400.
    pub fn new_encoder(cfg: ServeConfig) -> Self {
        Self::with_mode(cfg, Some(OnceLock::new()))
    }

    fn with_mode(cfg: ServeConfig, encoder: Option<OnceLock<embeddings::EncoderReady>>) -> Self {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Server {
            state: Arc::new(AppState {
                cfg,
                ready: OnceLock::new(),
                metrics: Metrics::default(),
                in_flight: AtomicUsize::new(0),
                created,
                encoder,
            }),
        }
    }

    /// Serves `model` on `service` from now on.
    ///
    /// Errors: [`AlreadyReady`] if a model was set before.
    pub fn set_ready(&self, service: Arc<Service>, model: ModelInfo) -> Result<(), AlreadyReady> {
        if self.state.encoder.is_some() {
            return Err(AlreadyReady);
        }
        self.state
            .ready
            .set(Ready { service, model })
            .map_err(|_| AlreadyReady)
    }

    /// Serves the encoder on `service` from now on (a server from [`Server::new_encoder`]).
    ///
    /// Errors: [`AlreadyReady`] if a model was set before, or on a decoder server.
    pub fn set_encoder_ready(
        &self,
        service: Arc<EncoderService>,
        info: EncoderInfo,
    ) -> Result<(), AlreadyReady> {
        let slot = self.state.encoder.as_ref().ok_or(AlreadyReady)?;
        slot.set(embeddings::EncoderReady { service, info })
            .map_err(|_| AlreadyReady)
    }

    /// Whether the model is loaded.
    pub fn is_ready(&self) -> bool {
        self.state.ready.get().is_some() || self.encoder_service().is_some()
    }

    /// The encoder service, once ready (to shut it down).
    pub fn encoder_service(&self) -> Option<Arc<EncoderService>> {
        let r = self.state.encoder.as_ref()?.get()?;
        Some(Arc::clone(&r.service))
    }

    /// The service, once ready (to shut it down).
    pub fn service(&self) -> Option<Arc<Service>> {
        self.state.ready.get().map(|r| Arc::clone(&r.service))
    }

    /// The server's counters.
    pub fn metrics(&self) -> &Metrics {
        &self.state.metrics
    }

    /// The routes (see the [module docs](self)).
    pub fn router(&self) -> Router {
        let st = Arc::clone(&self.state);
        if st.encoder.is_some() {
            return embeddings::router(st);
        }
        let api = Router::new()
            .route("/v1/chat/completions", post(handlers::chat))
            .route("/v1/completions", post(handlers::completions))
            .route("/v1/embeddings", post(embeddings::encoder_route))
            .route("/v1/rerank", post(embeddings::encoder_route))
            .route("/v1/models", get(handlers::models))
            .route("/tokenize", post(handlers::tokenize))
            .route("/detokenize", post(handlers::detokenize))
            .route_layer(axum::middleware::from_fn_with_state(
                Arc::clone(&st),
                handlers::auth,
            ));
        Router::new()
            .route("/health", get(handlers::health))
            .route("/metrics", get(handlers::metrics))
            .merge(api)
            .fallback(handlers::not_found)
            .layer(DefaultBodyLimit::max(st.cfg.max_body_bytes))
            .with_state(st)
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("cfg", &self.state.cfg)
            .field("ready", &self.is_ready())
            .finish_non_exhaustive()
    }
}

/// Serves `server` on `listener` until `shutdown` resolves, then waits for the connections
/// in flight to finish (shut the [`Service`] down first so that its streams end).
///
/// Errors: the listener's I/O errors.
pub async fn run<F>(
    listener: tokio::net::TcpListener,
    server: Server,
    shutdown: F,
) -> std::io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    use axum::serve::ListenerExt;
    // Tokens go out as small writes: without TCP_NODELAY, Nagle's algorithm holds each one
    // back until the previous is acknowledged.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, server.router())
        .with_graceful_shutdown(shutdown)
        .await
}
