//! `fl embed` and `fl rerank`: an encoder model (BERT, RoBERTa, XLM-RoBERTa) over a JSONL file
//! of texts, in batches through a [`GpuEncoder`], pooled / scored on the host.

use std::io::Write;
use std::path::{Path, PathBuf};

use fl_engine::dtype::RunDType;
use fl_engine::encoder::backend::{
    rank, scores_from_logits, EncoderBackend, EncoderHead, EncoderModelDir, GpuEncoder,
};
use fl_engine::encoder::calibrate::encoder_quant;
use fl_engine::encoder::gpu::EncoderQuant;
use fl_engine::encoder::pooling_config::PoolingConfig;
use fl_engine::encoder::{reference, EncoderConfig, EncoderTokenizer, EncoderWeights};
use fl_engine::encoder::{Encoded, PackedBatch, Pooling};
use fl_engine::{EngineError, Result};
use serde_json::Value;

/// What `fl embed` and `fl rerank` share.
#[derive(clap::Args)]
pub struct EncoderArgs {
    /// A model directory: config.json, safetensors and tokenizer.json.
    #[arg(long)]
    model: PathBuf,
    /// A JSONL file: one text a line, `{"text": "..."}` or a bare JSON string (blank lines
    /// skipped).
    #[arg(long)]
    input: PathBuf,
    /// Run dtype of the weights and activations.
    #[arg(long, default_value = "f16", value_parser = ["f16", "bf16", "f32"])]
    dtype: String,
    /// Where the JSONL results go (default: stdout).
    #[arg(long)]
    output: Option<PathBuf>,
    /// Texts (or pairs) one forward takes at most.
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    #[command(flatten)]
    quant: EncoderQuantArgs,
}

/// INT8 flags of the encoder commands.
#[derive(clap::Args)]
pub struct EncoderQuantArgs {
    /// Projections in the run dtype (none) or INT8 (FasterTransformer 3.0: per-channel
    /// weights, INT8 GEMMs; f16 / bf16 only).
    #[arg(long, default_value = "none", value_parser = ["none", "int8"])]
    pub quant: String,
    /// With --quant int8: static activation scales from this file (`fl calibrate`); without
    /// it, per-token scales.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Which calibrated amax: the percentile `fl calibrate` took, or the absolute maximum.
    #[arg(long, default_value = "percentile", value_parser = ["percentile", "absmax"])]
    pub amax: String,
}

impl EncoderQuantArgs {
    /// The encoder quantisation these flags name.
    pub fn resolve(&self) -> Result<EncoderQuant> {
        encoder_quant(&self.quant, self.calibration.as_deref(), &self.amax)
    }
}

/// `fl embed`'s options.
#[derive(clap::Args)]
pub struct EmbedArgs {
    #[command(flatten)]
    common: EncoderArgs,
    /// One vector per text from its last hidden states: the first token, the mean, or the
    /// last token (default: the model's sentence-transformers Pooling module, else cls).
    #[arg(long, value_parser = ["cls", "mean", "last"])]
    pooling: Option<String>,
    /// Divide each embedding by its L2 norm; `--normalize=false` not (default: whether the
    /// model lists a sentence-transformers Normalize module, else true).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    normalize: Option<bool>,
}

/// `fl rerank`'s options.
#[derive(clap::Args)]
pub struct RerankArgs {
    #[command(flatten)]
    common: EncoderArgs,
    /// The query every passage of --input is scored against.
    #[arg(long)]
    query: String,
}

/// The texts of a JSONL file's content, in order: each non-blank line a JSON string or an
/// object with a string `"text"`.
///
/// Errors name `--input` and the 1-based line.
pub fn parse_inputs(content: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for (n, line) in content.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |why: String| EngineError::invalid("--input", format!("line {}: {why}", n + 1));
        let v: Value = serde_json::from_str(line).map_err(|e| bad(format!("not JSON: {e}")))?;
        let text = match &v {
            Value::String(s) => s.clone(),
            Value::Object(o) => match o.get("text") {
                Some(Value::String(s)) => s.clone(),
                Some(_) => return Err(bad("`text` is not a string".into())),
                None => return Err(bad("the object has no `text`".into())),
            },
            _ => return Err(bad("expected a JSON string or {\"text\": ...}".into())),
        };
        out.push(text);
    }
    if out.is_empty() {
        return Err(EngineError::invalid("--input", "holds no text"));
    }
    Ok(out)
}

/// One output line of `fl embed`: `{"index": i, "embedding": [...]}` (no newline).
pub fn embedding_line(index: usize, embedding: &[f32]) -> String {
    serde_json::json!({ "index": index, "embedding": embedding }).to_string()
}

/// One output line of `fl rerank`: `{"index": i, "score": s}` (no newline).
pub fn score_line(index: usize, score: f32) -> String {
    serde_json::json!({ "index": index, "score": score }).to_string()
}

/// The model, tokenizer and texts a command needs, checked before the GPU is touched.
struct Loaded {
    cfg: EncoderConfig,
    weights: EncoderWeights,
    head: Option<EncoderHead>,
    tokenizer: EncoderTokenizer,
    texts: Vec<String>,
}

fn load(a: &EncoderArgs) -> Result<Loaded> {
    if a.batch_size == 0 {
        return Err(EngineError::invalid("--batch-size", "must be at least 1"));
    }
    let content = std::fs::read_to_string(&a.input)
        .map_err(|e| EngineError::invalid("--input", format!("{}: {e}", a.input.display())))?;
    let texts = parse_inputs(&content)?;
    let m = EncoderModelDir::load(&a.model)?;
    // Truncates to sentence-transformers' max_seq_length when the model sets a shorter one.
    let tokenizer = m.encoder_tokenizer()?.ok_or_else(|| {
        EngineError::invalid(
            "--model",
            format!("{} has no tokenizer.json", a.model.display()),
        )
    })?;
    Ok(Loaded {
        head: m.head(),
        cfg: m.config,
        weights: m.weights,
        tokenizer,
        texts,
    })
}

fn writer(output: &Option<PathBuf>) -> Result<Box<dyn Write>> {
    Ok(match output {
        Some(p) => Box::new(std::io::BufWriter::new(std::fs::File::create(p).map_err(
            |e| EngineError::invalid("--output", format!("{}: {e}", p.display())),
        )?)),
        None => Box::new(std::io::stdout().lock()),
    })
}

fn write_lines(output: &Option<PathBuf>, lines: impl Iterator<Item = String>) -> Result<()> {
    let path = output.as_deref().unwrap_or(Path::new("stdout"));
    let io =
        |e: std::io::Error| EngineError::invalid("--output", format!("{}: {e}", path.display()));
    let mut w = writer(output)?;
    for l in lines {
        writeln!(w, "{l}").map_err(io)?;
    }
    w.flush().map_err(io)
}

/// Runs `enc` (all inputs, tokenised up front so a bad text fails before the GPU starts and
/// errors carry its index) in batches of `batch_size`, handing `f` each batch's states.
fn run_batches<T: RunDType>(
    m: &Loaded,
    quant: EncoderQuant,
    batch_size: usize,
    enc: &Encoded,
    mut f: impl FnMut(&[f32], &PackedBatch) -> Result<()>,
) -> Result<()> {
    let mut model = GpuEncoder::<T>::new_quant(0, &m.cfg, &m.weights, quant)?;
    for (ids, types) in enc
        .ids
        .chunks(batch_size)
        .zip(enc.token_types.chunks(batch_size))
    {
        let batch = PackedBatch::new(&m.cfg, ids, Some(types))?;
        let states = model.hidden_states(&batch)?;
        f(&states, &batch)?;
    }
    Ok(())
}

fn embed_with<T: RunDType>(a: &EmbedArgs, m: &Loaded, p: PoolingConfig) -> Result<Vec<f32>> {
    let h = m.cfg.hidden_size;
    let mut out = Vec::with_capacity(m.texts.len() * h);
    let enc = m.tokenizer.encode_texts(&m.texts)?;
    run_batches::<T>(
        m,
        a.common.quant.resolve()?,
        a.common.batch_size,
        &enc,
        |states, batch| {
            let mut e = reference::pool(states, batch, h, p.pooling)?;
            if p.normalize {
                reference::l2_normalize(&mut e, h)?;
            }
            out.extend_from_slice(&e);
            Ok(())
        },
    )?;
    Ok(out)
}

/// `fl embed`.
pub fn embed(a: &EmbedArgs) -> Result<()> {
    let pooling = a
        .pooling
        .as_deref()
        .map(str::parse::<Pooling>)
        .transpose()?;
    let p = PoolingConfig::resolve(&a.common.model, pooling, a.normalize)?;
    let m = load(&a.common)?;
    let emb = match a.common.dtype.as_str() {
        "f32" => embed_with::<f32>(a, &m, p)?,
        "bf16" => embed_with::<fl_kernels::bf16>(a, &m, p)?,
        _ => embed_with::<fl_kernels::f16>(a, &m, p)?,
    };
    let h = m.cfg.hidden_size;
    let lines = emb.chunks(h).enumerate().map(|(i, e)| embedding_line(i, e));
    write_lines(&a.common.output, lines)
}

fn rerank_with<T: RunDType>(a: &RerankArgs, m: &Loaded) -> Result<Vec<f32>> {
    let mut scores = Vec::with_capacity(m.texts.len());
    let enc = m.tokenizer.encode_pairs(&a.query, &m.texts)?;
    let head = m
        .head
        .as_ref()
        .ok_or_else(|| EngineError::invalid("--model", "has no classification head"))?;
    run_batches::<T>(
        m,
        a.common.quant.resolve()?,
        a.common.batch_size,
        &enc,
        |states, batch| {
            let logits = head.logits(states, batch)?;
            scores.extend(scores_from_logits(&logits, m.cfg.num_labels)?);
            Ok(())
        },
    )?;
    Ok(scores)
}

/// `fl rerank`.
pub fn rerank(a: &RerankArgs) -> Result<()> {
    let m = load(&a.common)?;
    if m.head.is_none() {
        return Err(EngineError::invalid(
            "--model",
            "has no classification head (config.json names no *ForSequenceClassification)",
        ));
    }
    let scores = match a.common.dtype.as_str() {
        "f32" => rerank_with::<f32>(a, &m)?,
        "bf16" => rerank_with::<fl_kernels::bf16>(a, &m)?,
        _ => rerank_with::<fl_kernels::f16>(a, &m)?,
    };
    let lines = rank(&scores).into_iter().map(|(i, s)| score_line(i, s));
    write_lines(&a.common.output, lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_strings_or_text_objects() {
        let t = parse_inputs("\"a b\"\n\n{\"text\": \"c\", \"id\": 3}\n  \n\"\"\n").unwrap();
        assert_eq!(t, ["a b", "c", ""]);
    }

    #[test]
    fn input_errors_name_the_flag_and_line() {
        for (content, line, what) in [
            ("\"a\"\n{\"text\": 1}\n", 2, "not a string"),
            ("\"a\"\n\n{\"txt\": \"b\"}\n", 3, "no `text`"),
            ("[1]\n", 1, "expected"),
            ("\"a\"\n\"b\"\n{oops\n", 3, "not JSON"),
        ] {
            let e = parse_inputs(content).unwrap_err().to_string();
            assert!(
                e.contains("--input") && e.contains(&format!("line {line}:")) && e.contains(what),
                "{e}"
            );
        }
        let e = parse_inputs("\n \n").unwrap_err().to_string();
        assert!(e.contains("--input") && e.contains("no text"), "{e}");
    }

    #[test]
    fn output_lines_are_json() {
        let v: Value = serde_json::from_str(&embedding_line(2, &[0.5, -1.25])).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"index": 2, "embedding": [0.5, -1.25]})
        );
        let v: Value = serde_json::from_str(&score_line(0, 3.5)).unwrap();
        assert_eq!(v, serde_json::json!({"index": 0, "score": 3.5}));
    }
}
