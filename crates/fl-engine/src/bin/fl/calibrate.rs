//! `fl calibrate`: INT8 activation scales of an encoder from sample text (FasterTransformer
//! 3.0's calibration), saved beside the model for `fl embed --quant int8 --calibration`.

use std::path::PathBuf;

use fl_blas::Blas;
use fl_engine::encoder::backend::EncoderModelDir;
use fl_engine::encoder::calibrate::{Site, DEFAULT_FILE};
use fl_engine::encoder::gpu::open_gpu;
use fl_engine::encoder::{EncoderModel, PackedBatch};
use fl_engine::{EngineError, Result};

/// `fl calibrate`'s options.
#[derive(clap::Args)]
pub struct CalibrateArgs {
    /// A model directory: config.json, safetensors and tokenizer.json.
    #[arg(long)]
    model: PathBuf,
    /// A JSONL file of sample texts, as `fl embed --input` reads.
    #[arg(long)]
    input: PathBuf,
    /// The percentile of |activation| kept beside the absolute maximum.
    #[arg(long, default_value_t = 99.99)]
    percentile: f64,
    /// Where the JSON goes (default: fl_int8_calibration.json in the model directory).
    #[arg(long)]
    output: Option<PathBuf>,
    /// Texts one forward takes at most.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
}

/// `fl calibrate`.
pub fn calibrate(a: &CalibrateArgs) -> Result<()> {
    if a.batch_size == 0 {
        return Err(EngineError::invalid("--batch-size", "must be at least 1"));
    }
    if !(a.percentile > 0.0 && a.percentile <= 100.0) {
        return Err(EngineError::invalid(
            "--percentile",
            format!("{} is not in (0, 100]", a.percentile),
        ));
    }
    let content = std::fs::read_to_string(&a.input)
        .map_err(|e| EngineError::invalid("--input", format!("{}: {e}", a.input.display())))?;
    let texts = crate::embed::parse_inputs(&content)?;
    let m = EncoderModelDir::load(&a.model)?;
    let tok = m.encoder_tokenizer()?.ok_or_else(|| {
        EngineError::invalid(
            "--model",
            format!("{} has no tokenizer.json", a.model.display()),
        )
    })?;
    let enc = tok.encode_texts(&texts)?;
    let batches = enc
        .ids
        .chunks(a.batch_size)
        .zip(enc.token_types.chunks(a.batch_size))
        .map(|(ids, types)| PackedBatch::new(&m.config, ids, Some(types)))
        .collect::<Result<Vec<_>>>()?;
    let gpu = open_gpu(0)?;
    let mut blas = Blas::new(&gpu)?;
    // The float model the INT8 one replaces: its activations are what INT8 will see.
    let model = EncoderModel::<fl_kernels::f16>::new(gpu.stream(), &m.config, &m.weights)?;
    let cal = model.calibrate(gpu.stream(), &mut blas, &batches, a.percentile)?;
    let out = a
        .output
        .clone()
        .unwrap_or_else(|| a.model.join(DEFAULT_FILE));
    cal.save(&out)?;
    eprintln!(
        "fl calibrate: {} texts, {} tokens, {} layers -> {}",
        texts.len(),
        cal.tokens,
        cal.layers.len(),
        out.display()
    );
    for (l, layer) in cal.layers.iter().enumerate() {
        let row: Vec<String> = Site::ALL
            .iter()
            .map(|&s| {
                let t = layer[s as usize];
                format!("{} {:.3}/{:.3}", s.name(), t.percentile, t.absmax)
            })
            .collect();
        eprintln!("  layer {l:>2}: {}", row.join("  "));
    }
    Ok(())
}
