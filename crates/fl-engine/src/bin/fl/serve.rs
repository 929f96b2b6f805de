//! `fl serve`: binds, loads the model while `/health` answers 503, serves until Ctrl-C.

use std::sync::Arc;
use std::time::Duration;

use fl_engine::chat_template::ChatTemplate;
use fl_engine::runner::RunnerConfig;
use fl_engine::serve::{ModelInfo, ServeConfig, Server};
use fl_engine::service::{Service, ServiceError};
use fl_engine::tokenizer::Tokenizer;
use fl_engine::{load, EngineError, Result};

use crate::ModelArgs;

/// How long connections may take to finish after Ctrl-C (their requests are aborted first).
const DRAIN: Duration = Duration::from_secs(10);

/// The HTTP side of `fl serve`.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (0.0.0.0 to accept other machines).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on the /v1 and tokenize routes (/health and
    /// /metrics stay open).
    #[arg(long)]
    api_key: Option<String>,
    /// The model's name in the API (default: --model as given).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Requests that may wait for a slot; beyond, new requests get 503 with Retry-After.
    #[arg(long, default_value_t = 1024)]
    max_waiting: usize,
}

fn service_err(e: ServiceError) -> EngineError {
    match e {
        ServiceError::Engine(e) => {
            Arc::try_unwrap(e).unwrap_or_else(|e| EngineError::invalid("--model", e.to_string()))
        }
        e => EngineError::invalid("--model", e.to_string()),
    }
}

/// A resolved `--model` (config and checkpoint checked) with its tokenizer and template.
struct Resolved {
    loaded: load::Loaded,
    tokenizer: Option<Arc<Tokenizer>>,
    chat_template: Option<Arc<ChatTemplate>>,
}

/// Checks `--model` before anything listens, so a wrong path fails at once.
fn resolve(m: &ModelArgs) -> Result<Resolved> {
    let mut loaded = load::resolve(&m.model, &m.quant)?;
    let tokenizer = loaded.tokenizer.take().map(Arc::new);
    let chat_template = match (&loaded.dir, &loaded.gguf) {
        (Some(dir), _) => ChatTemplate::from_model_dir(dir)
            .map_err(|e| EngineError::invalid("--model", e.to_string()))?
            .map(Arc::new),
        // A GGUF file carries its template as `tokenizer.chat_template`.
        (None, Some(f)) => match f.tokenizer_spec() {
            Ok(spec) => match &spec.chat_template {
                Some(src) => {
                    let text =
                        |id: Option<u32>| id.and_then(|i| spec.tokens.get(i as usize).cloned());
                    let t = ChatTemplate::new(
                        src,
                        text(spec.bos_token_id()),
                        text(spec.eos_token_id()),
                    )
                    .map_err(|e| EngineError::invalid("--model", e.to_string()))?
                    .with_add_bos_token(Some(spec.add_bos_token()));
                    Some(Arc::new(t))
                }
                None => None,
            },
            Err(_) => None,
        },
        (None, None) => None,
    };
    Ok(Resolved {
        loaded,
        tokenizer,
        chat_template,
    })
}

/// Loads the weights on a service worker (blocking until it is ready).
fn load_service(
    r: Resolved,
    dtype: &str,
    graph: bool,
    rcfg: &RunnerConfig,
) -> Result<(Service, ModelInfo)> {
    let cfg = r.loaded.cfg.clone();
    let loaded = r.loaded;
    let service = match dtype {
        "f32" => Service::spawn(move || load::engine::<f32>(&loaded, graph), rcfg.clone()),
        "bf16" => Service::spawn(
            move || load::engine::<fl_kernels::bf16>(&loaded, graph),
            rcfg.clone(),
        ),
        _ => Service::spawn(
            move || load::engine::<fl_kernels::f16>(&loaded, graph),
            rcfg.clone(),
        ),
    }
    .map_err(service_err)?;
    let kv = service.stats().backend.kv;
    let info = ModelInfo {
        max_model_len: rcfg.max_model_len.unwrap_or(cfg.max_position_embeddings),
        vocab_size: cfg.vocab_size,
        eos_token_ids: cfg.eos_token_ids.clone(),
        kv_capacity_tokens: Some(kv.total_blocks * rcfg.block_size),
        tokenizer: r.tokenizer,
        chat_template: r.chat_template,
    };
    Ok((service, info))
}

/// Runs the server until Ctrl-C.
pub fn run(m: ModelArgs, args: ServeArgs, rcfg: RunnerConfig) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("fl-serve")
        .build()
        .map_err(|e| EngineError::invalid("serve", format!("cannot start tokio: {e}")))?;
    rt.block_on(serve(m, args, rcfg))
}

async fn serve(m: ModelArgs, args: ServeArgs, rcfg: RunnerConfig) -> Result<()> {
    let resolved = resolve(&m)?;
    let addr = format!("{}:{}", args.host, args.port);
    let listener = tokio::net::TcpListener::bind(&addr).await.map_err(|e| {
        EngineError::invalid("--host/--port", format!("cannot listen on {addr}: {e}"))
    })?;
    let mut cfg = ServeConfig::new(args.served_model_name.unwrap_or_else(|| m.model.clone()));
    cfg.api_key = args.api_key.filter(|k| !k.is_empty());
    cfg.max_waiting = args.max_waiting;
    let auth = if cfg.api_key.is_some() {
        ", API key required"
    } else {
        ""
    };
    let server = Server::new(cfg);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let http = tokio::spawn(fl_engine::serve::run(listener, server.clone(), async {
        let _ = stopped.await;
    }));
    eprintln!("fl serve: listening on http://{addr}{auth}; loading {} (/health answers 503 until it is ready)", m.model);

    let (dtype, graph) = (m.dtype.clone(), !m.no_graph);
    let loading = tokio::task::spawn_blocking(move || load_service(resolved, &dtype, graph, &rcfg));
    let (service, info) = tokio::select! {
        r = loading => r.map_err(|e| EngineError::invalid("--model", format!("the loading thread failed: {e}")))??,
        _ = tokio::signal::ctrl_c() => {
            // The load cannot be interrupted midway; the process exit frees the GPU.
            eprintln!("fl serve: interrupted while loading");
            std::process::exit(130);
        }
    };
    eprintln!(
        "fl serve: ready: context {} tokens, KV cache {} tokens, {}{}",
        info.max_model_len,
        info.kv_capacity_tokens.unwrap_or(0),
        if info.tokenizer.is_some() {
            "tokenizer"
        } else {
            "no tokenizer (token-id prompts only)"
        },
        if info.chat_template.is_some() {
            ", chat template"
        } else {
            ", no chat template"
        },
    );
    let service = Arc::new(service);
    if server.set_ready(Arc::clone(&service), info).is_err() {
        return Err(EngineError::invalid("serve", "the model was set twice"));
    }

    let _ = tokio::signal::ctrl_c().await;
    eprintln!("fl serve: shutting down (Ctrl-C again to exit at once)");
    tokio::spawn(async {
        let _ = tokio::signal::ctrl_c().await;
        std::process::exit(130);
    });
    // Ending the requests first lets their connections finish; then the listener closes.
    let shutdown = tokio::task::spawn_blocking(move || service.shutdown()).await;
    let _ = stop.send(());
    match tokio::time::timeout(DRAIN, http).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => eprintln!("fl serve: {e}"),
        Ok(Err(e)) => eprintln!("fl serve: the HTTP task failed: {e}"),
        Err(_) => eprintln!("fl serve: connections still open after {DRAIN:?}; closing"),
    }
    match shutdown {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(service_err(e)),
        Err(e) => Err(EngineError::invalid(
            "serve",
            format!("shutdown failed: {e}"),
        )),
    }
}
