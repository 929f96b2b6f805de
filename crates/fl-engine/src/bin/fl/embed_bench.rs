//! `fl embed-bench`: times an encoder's forward (embedding models and rerankers) over ragged
//! batches, on a preset shape with random weights or a model directory.

use std::path::Path;
use std::time::Instant;

use fl_blas::Blas;
use fl_engine::checkpoint::Checkpoint;
use fl_engine::dtype::RunDType;
use fl_engine::encoder::presets::{self, bench_lengths};
use fl_engine::encoder::{DeviceBatch, EncoderConfig, EncoderModel, EncoderWeights, PackedBatch};
use fl_engine::{EngineError, Result};
use fl_kernels::DeviceTensor;

/// `fl embed-bench`'s options.
#[derive(clap::Args)]
pub struct EmbedBenchArgs {
    /// A preset shape with random weights (bert-base, bert-large, bge-base, bge-small) or a
    /// model directory (config.json + safetensors).
    #[arg(long)]
    model: String,
    /// Run dtype.
    #[arg(long, default_value = "f16", value_parser = ["f16", "bf16", "f32"])]
    dtype: String,
    /// Batch sizes, comma-separated.
    #[arg(long, default_value = "1,32,256")]
    batches: String,
    /// Longest sequence of each batch, comma-separated. Sequence 0 has this length, the
    /// others spread uniformly over 25-100 % of it (see --full).
    #[arg(long, default_value = "128,384")]
    seqs: String,
    /// Every sequence at the full length instead of the ragged spread.
    #[arg(long)]
    full: bool,
    /// Timed forwards per shape (after 3 untimed).
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// One JSON line per shape instead of the table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    quant: crate::embed::EncoderQuantArgs,
}

fn list(arg: &'static str, s: &str) -> Result<Vec<usize>> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<usize>()
                .ok()
                .filter(|&v| v > 0)
                .ok_or_else(|| {
                    EngineError::invalid(arg, format!("`{x}` is not a positive integer"))
                })
        })
        .collect()
}

/// GEMM and attention FLOPs of one forward over sequences of `lens` tokens.
fn flops(cfg: &EncoderConfig, lens: &[usize]) -> f64 {
    let (h, i) = (cfg.hidden_size as f64, cfg.intermediate_size as f64);
    let tokens: f64 = lens.iter().sum::<usize>() as f64;
    let pairs: f64 = lens.iter().map(|&l| (l * l) as f64).sum();
    let per_layer = 2.0 * tokens * (4.0 * h * h + 2.0 * h * i) + 4.0 * h * pairs;
    per_layer * cfg.num_hidden_layers as f64
}

fn run<T: RunDType>(a: &EmbedBenchArgs, cfg: &EncoderConfig, w: &EncoderWeights) -> Result<()> {
    let batches = list("--batches", &a.batches)?;
    let seqs = list("--seqs", &a.seqs)?;
    if a.iters == 0 {
        return Err(EngineError::invalid("--iters", "must be at least 1"));
    }
    let max = cfg.max_sequence_len();
    if let Some(&s) = seqs.iter().find(|&&s| s > max) {
        return Err(EngineError::invalid(
            "--seqs",
            format!("{s} is longer than the model's {max} tokens"),
        ));
    }
    let gpu = fl_engine::encoder::gpu::open_gpu(0)?;
    let stream = gpu.stream();
    let mut blas = Blas::new(&gpu)?;
    let model = EncoderModel::<T>::new_quant(stream, cfg, w, a.quant.resolve()?)?;
    if !a.json {
        println!(
            "{:<12} {:>5} {:>5} {:>5} {:>7} {:>9} {:>10} {:>12} {:>9}",
            "model",
            "dtype",
            "quant",
            "batch",
            "max_len",
            "tokens",
            "ms/batch",
            "sentences/s",
            "TFLOP/s"
        );
    }
    for &s in &seqs {
        for &b in &batches {
            let lens = bench_lengths(b, s, !a.full)?;
            // Ids from a fixed spread over the vocabulary; the first is CLS-like.
            let ids: Vec<Vec<u32>> = lens
                .iter()
                .enumerate()
                .map(|(q, &l)| {
                    (0..l)
                        .map(|j| ((q * 7919 + j * 104_729 + 101) % cfg.vocab_size) as u32)
                        .collect()
                })
                .collect();
            let batch = PackedBatch::new(cfg, &ids, None)?;
            let mut dev = DeviceBatch::upload(stream, cfg, &batch)?;
            let mut out = DeviceTensor::<T>::zeros(stream, &[dev.num_tokens(), cfg.hidden_size])?;
            for _ in 0..3 {
                model.forward(stream, &mut blas, &mut dev, &mut out)?;
            }
            dev.check(stream)?;
            let t0 = Instant::now();
            for _ in 0..a.iters {
                model.forward(stream, &mut blas, &mut dev, &mut out)?;
            }
            gpu.synchronize()?;
            let sec = t0.elapsed().as_secs_f64() / a.iters as f64;
            dev.check(stream)?;
            let tokens = dev.num_tokens();
            let tf = flops(cfg, &lens) / sec / 1e12;
            if a.json {
                println!(
                    "{}",
                    serde_json::json!({"model": a.model, "dtype": T::NAME, "quant": a.quant.quant, "batch": b,
                        "max_len": s, "tokens": tokens, "ragged": !a.full, "ms": sec * 1e3,
                        "sentences_per_s": b as f64 / sec, "tflops": tf})
                );
            } else {
                println!(
                    "{:<12} {:>5} {:>5} {:>5} {:>7} {:>9} {:>10.3} {:>12.0} {:>9.1}",
                    a.model,
                    T::NAME,
                    a.quant.quant,
                    b,
                    s,
                    tokens,
                    sec * 1e3,
                    b as f64 / sec,
                    tf
                );
            }
        }
    }
    Ok(())
}

/// `fl embed-bench`.
pub fn embed_bench(a: &EmbedBenchArgs) -> Result<()> {
    let (cfg, w) = match presets::preset(&a.model) {
        Some(cfg) => {
            let w = EncoderWeights::random(&cfg, 1)?;
            (cfg, w)
        }
        None if Path::new(&a.model).is_dir() => {
            let cfg = EncoderConfig::from_model_dir(&a.model)?;
            let w = EncoderWeights::load(&Checkpoint::open(&a.model)?, &cfg)?;
            (cfg, w)
        }
        None => {
            return Err(EngineError::invalid(
                "--model",
                format!(
                    "`{}` is neither a preset ({}) nor a model directory",
                    a.model,
                    presets::PRESETS.join(", ")
                ),
            ))
        }
    };
    match a.dtype.as_str() {
        "f32" => run::<f32>(a, &cfg, &w),
        "bf16" => run::<fl_kernels::bf16>(a, &cfg, &w),
        _ => run::<fl_kernels::f16>(a, &cfg, &w),
    }
}
