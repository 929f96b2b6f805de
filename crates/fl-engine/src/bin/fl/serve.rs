//! `fl serve`: binds, loads the model while `/health` answers 503, serves until Ctrl-C. A
//! directory holding an encoder (config.json `model_type` bert / roberta / xlm-roberta) is
//! served on `/v1/embeddings` and `/v1/rerank` instead of the completion routes.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fl_engine::chat_template::ChatTemplate;
use fl_engine::encoder::backend::{EncoderModelDir, GpuEncoder};
use fl_engine::encoder::gpu::EncoderQuant;
use fl_engine::encoder::pooling_config::PoolingConfig;
use fl_engine::encoder::presets as encoder_presets;
use fl_engine::encoder::{EncoderConfig, EncoderModel, EncoderWeights, Pooling};
use fl_engine::runner::RunnerConfig;
use fl_engine::serve::{
    EncoderInfo, EncoderService, EncoderServiceConfig, ModelInfo, ServeConfig, Server,
};
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
    /// Encoder models: how /v1/embeddings pools the last hidden states (default: the model's
    /// sentence-transformers Pooling module, else cls).
    #[arg(long, value_parser = ["cls", "mean", "last"])]
    pooling: Option<String>,
    /// Encoder models: L2-normalise embeddings; `--normalize=false` not (default: whether the
    /// model lists a sentence-transformers Normalize module, else true).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    normalize: Option<bool>,
    /// Encoder models: cut inputs longer than the model's length (`--truncate=false`: refuse
    /// them with a 400; a request's `truncate` field overrides). The length is
    /// --max-model-len, else sentence-transformers' max_seq_length, else the position table.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    truncate: Option<bool>,
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
    tp: usize,
    graph: bool,
    rcfg: &RunnerConfig,
) -> Result<(Service, ModelInfo)> {
    let cfg = r.loaded.cfg.clone();
    let loaded = Arc::new(r.loaded);
    let service = match dtype {
        "f32" => Service::spawn_any(
            move || load::any_engine::<f32>(&loaded, tp, graph),
            rcfg.clone(),
        ),
        "bf16" => Service::spawn_any(
            move || load::any_engine::<fl_kernels::bf16>(&loaded, tp, graph),
            rcfg.clone(),
        ),
        _ => Service::spawn_any(
            move || load::any_engine::<fl_kernels::f16>(&loaded, tp, graph),
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

/// Binds `--host:--port`; the address and the server's configuration.
async fn listen(
    m: &ModelArgs,
    args: &ServeArgs,
) -> Result<(tokio::net::TcpListener, String, ServeConfig)> {
    let addr = format!("{}:{}", args.host, args.port);
    let listener = tokio::net::TcpListener::bind(&addr).await.map_err(|e| {
        EngineError::invalid("--host/--port", format!("cannot listen on {addr}: {e}"))
    })?;
    let name = args.served_model_name.clone();
    let mut cfg = ServeConfig::new(name.unwrap_or_else(|| m.model.clone()));
    cfg.api_key = args.api_key.clone().filter(|k| !k.is_empty());
    cfg.max_waiting = args.max_waiting;
    Ok((listener, addr, cfg))
}

async fn serve(m: ModelArgs, args: ServeArgs, rcfg: RunnerConfig) -> Result<()> {
    if EncoderModelDir::is_encoder(&m.model) || encoder_presets::preset(&m.model).is_some() {
        return serve_encoder(m, args, rcfg).await;
    }
    for (flag, given) in [
        ("--pooling", args.pooling.is_some()),
        ("--normalize", args.normalize.is_some()),
        ("--truncate", args.truncate.is_some()),
    ] {
        if given {
            return Err(EngineError::invalid(
                flag,
                "applies to encoder models (BERT, RoBERTa, XLM-RoBERTa) only",
            ));
        }
    }
    let resolved = resolve(&m)?;
    let (listener, addr, cfg) = listen(&m, &args).await?;
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
    let tp = m.tp;
    let loading =
        tokio::task::spawn_blocking(move || load_service(resolved, &dtype, tp, graph, &rcfg));
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

/// Where an encoder's weights come from: a model directory, or a preset's random weights
/// (`bert-base`, `bert-large`, `bge-base`, `bge-small`: no tokenizer, token-id inputs; for
/// load tests without a download).
enum EncoderSource {
    Dir(PathBuf),
    Preset(EncoderConfig),
}

/// What `fl serve` checks of an encoder directory before it listens.
struct EncoderPlan {
    source: EncoderSource,
    info: EncoderInfo,
    service: EncoderServiceConfig,
    quant: EncoderQuant,
}

/// Checks the encoder directory and the flags (no weights read): a wrong path, an unsupported
/// head dim or a malformed sentence-transformers file fails at once.
fn plan_encoder(m: &ModelArgs, args: &ServeArgs, rcfg: &RunnerConfig) -> Result<EncoderPlan> {
    let quant = match m.quant.as_str() {
        q if q == load::QUANT_AUTO || q == "none" => EncoderQuant::None,
        // Per-token activation scales: a server sees text no calibration saw.
        "int8" => EncoderQuant::Int8,
        q => {
            return Err(EngineError::invalid(
                "--quant",
                format!("`{q}`: encoder models run dense or int8"),
            ))
        }
    };
    if m.tp > 1 {
        return Err(EngineError::invalid(
            "--tp",
            "encoder models run on one GPU (tensor parallelism is for decoders)",
        ));
    }
    let (source, cfg, tokenizer, max_len) = match encoder_presets::preset(&m.model) {
        Some(cfg) => {
            let len = cfg.max_sequence_len();
            (EncoderSource::Preset(cfg.clone()), cfg, None, len)
        }
        None => {
            let dir = PathBuf::from(&m.model);
            let (cfg, tokenizer, max_len) = EncoderModelDir::inspect(&dir)?;
            (EncoderSource::Dir(dir), cfg, tokenizer, max_len)
        }
    };
    EncoderModel::<f32>::supports(&cfg)?;
    let max_len = match rcfg.max_model_len {
        Some(l) if l == 0 || l > cfg.max_sequence_len() => {
            return Err(EngineError::invalid(
                "--max-model-len",
                format!(
                    "{l}: this encoder's positions cover 1..={} tokens",
                    cfg.max_sequence_len()
                ),
            ))
        }
        Some(l) => l,
        None => max_len,
    };
    let pooling = args
        .pooling
        .as_deref()
        .map(str::parse::<Pooling>)
        .transpose()?;
    let pooling = match &source {
        EncoderSource::Dir(dir) => PoolingConfig::resolve(dir, pooling, args.normalize)?,
        EncoderSource::Preset(_) => PoolingConfig::default().overridden(pooling, args.normalize),
    };
    let mut info = EncoderInfo::new(&cfg, tokenizer.as_ref(), max_len, pooling)?;
    info.truncate = args.truncate.unwrap_or(true);
    let service = EncoderServiceConfig {
        max_batched_tokens: rcfg.max_batched_tokens,
        max_batch_seqs: rcfg.max_num_seqs,
    };
    if service.max_batched_tokens == 0 || service.max_batch_seqs == 0 {
        return Err(EngineError::invalid(
            "--max-batched-tokens/--max-num-seqs",
            "must be at least 1",
        ));
    }
    Ok(EncoderPlan {
        source,
        info,
        service,
        quant,
    })
}

/// Reads the weights (or draws a preset's) and starts the encoder's worker on GPU 0 (blocking
/// until uploaded).
fn load_encoder(
    source: &EncoderSource,
    dtype: &str,
    quant: EncoderQuant,
    scfg: EncoderServiceConfig,
) -> Result<EncoderService> {
    let (cfg, weights, head) = match source {
        EncoderSource::Dir(dir) => {
            let m = EncoderModelDir::load(dir)?;
            let head = m.head();
            (m.config, m.weights, head)
        }
        // No pooler, no classifier: /v1/embeddings only.
        EncoderSource::Preset(cfg) => (cfg.clone(), EncoderWeights::random(cfg, 1)?, None),
    };
    // The host weights move into the worker and are freed once uploaded.
    match dtype {
        "f32" => EncoderService::spawn(
            move || GpuEncoder::<f32>::new_quant(0, &cfg, &weights, quant),
            head,
            scfg,
        ),
        "bf16" => EncoderService::spawn(
            move || GpuEncoder::<fl_kernels::bf16>::new_quant(0, &cfg, &weights, quant),
            head,
            scfg,
        ),
        _ => EncoderService::spawn(
            move || GpuEncoder::<fl_kernels::f16>::new_quant(0, &cfg, &weights, quant),
            head,
            scfg,
        ),
    }
}

/// `fl serve` with an encoder: `/v1/embeddings` and `/v1/rerank` until Ctrl-C.
async fn serve_encoder(m: ModelArgs, args: ServeArgs, rcfg: RunnerConfig) -> Result<()> {
    let plan = plan_encoder(&m, &args, &rcfg)?;
    let (listener, addr, cfg) = listen(&m, &args).await?;
    let server = Server::new_encoder(cfg);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let http = tokio::spawn(fl_engine::serve::run(listener, server.clone(), async {
        let _ = stopped.await;
    }));
    eprintln!(
        "fl serve: listening on http://{addr}; loading the encoder {} (/health answers 503 until it is ready)",
        m.model
    );
    let (source, dtype, scfg, quant) = (plan.source, m.dtype.clone(), plan.service, plan.quant);
    let loading = tokio::task::spawn_blocking(move || load_encoder(&source, &dtype, quant, scfg));
    let service = tokio::select! {
        r = loading => r.map_err(|e| EngineError::invalid("--model", format!("the loading thread failed: {e}")))??,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("fl serve: interrupted while loading");
            std::process::exit(130);
        }
    };
    let info = plan.info;
    let c = service.config();
    eprintln!(
        "fl serve: ready: {} encoder, {} layers, hidden {}; /v1/embeddings ({} pooling{}, inputs \
         up to {} tokens, {}){}",
        c.arch,
        c.num_hidden_layers,
        c.hidden_size,
        info.pooling.pooling.name(),
        if info.pooling.normalize {
            ", normalised"
        } else {
            ""
        },
        info.max_len(),
        if info.truncate {
            "longer ones cut"
        } else {
            "longer ones refused"
        },
        if service.has_head() {
            format!("; /v1/rerank ({} labels)", c.num_labels)
        } else {
            String::new()
        },
    );
    if !info.has_tokenizer() {
        eprintln!("fl serve: the model has no tokenizer.json: inputs must be token ids");
    }
    let service = Arc::new(service);
    if server
        .set_encoder_ready(Arc::clone(&service), info)
        .is_err()
    {
        return Err(EngineError::invalid("serve", "the model was set twice"));
    }

    let _ = tokio::signal::ctrl_c().await;
    eprintln!("fl serve: shutting down (Ctrl-C again to exit at once)");
    tokio::spawn(async {
        let _ = tokio::signal::ctrl_c().await;
        std::process::exit(130);
    });
    // Queued requests finish first; then the listener closes.
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
        Ok(Err(e)) => Err(EngineError::invalid("serve", e.to_string())),
        Err(e) => Err(EngineError::invalid(
            "serve",
            format!("shutdown failed: {e}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// `plan_encoder` of `fl serve ARGS...` (no weights read, no GPU).
    fn plan_of(args: &[&str]) -> Result<EncoderPlan> {
        let cli = crate::Cli::try_parse_from(std::iter::once("fl").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{e}"));
        match cli.cmd {
            crate::Cmd::Serve {
                model,
                serve,
                runner,
            } => plan_encoder(&model, &serve, &runner.config()),
            _ => panic!("not a serve command"),
        }
    }

    #[test]
    fn an_encoder_preset_serves_random_weights_on_token_ids() {
        let p = plan_of(&["serve", "--model", "bge-small"]).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(&p.source, EncoderSource::Preset(c) if c.hidden_size == 384));
        assert!(!p.info.has_tokenizer(), "a preset has no tokenizer");
        assert_eq!(p.info.max_len(), 512);
        // CLS and normalised unless told otherwise.
        assert_eq!(p.info.pooling.pooling.name(), "cls");
        assert!(p.info.pooling.normalize);
        let p = plan_of(&[
            "serve",
            "--model",
            "bert-base",
            "--pooling",
            "mean",
            "--normalize=false",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.info.pooling.pooling.name(), "mean");
        assert!(!p.info.pooling.normalize);
    }

    #[test]
    fn encoders_refuse_tp_and_other_quant_modes() {
        let e = plan_of(&["serve", "--model", "bert-base", "--tp", "2"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.starts_with("--tp"), "{e}");
        let e = plan_of(&["serve", "--model", "bert-base", "--quant", "int4"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.starts_with("--quant"), "{e}");
    }
}
