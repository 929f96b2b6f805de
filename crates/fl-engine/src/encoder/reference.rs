//! The encoder's CPU reference in f32: what the GPU path computes, written as plain loops.
//!
//! Values are stored in f32 between steps, as transformers keeps them in an f32 run; dot
//! products, LayerNorm statistics and softmax sums accumulate in f64 so that the reference's
//! own rounding stays far below the 1e-5 the GPU path is held to. A batch is a
//! [`PackedBatch`]: ragged sequences back to back, each attending only to its own tokens, no
//! padded token computed.
//!
//! Per token, with `h` the hidden size (shapes are row-major, one row per packed token):
//! ```text
//! x   = LayerNorm(word[id] + position[pos] + token_type[type])            [tokens, h]
//! per layer:
//!   q, k, v = x Wqᵀ + bq, x Wkᵀ + bk, x Wvᵀ + bv                        [tokens, h]
//!   a   = softmax(q_head k_headᵀ / sqrt(h / heads)) v_head, per sequence, non-causal
//!   x   = LayerNorm(a Woᵀ + bo + x)
//!   x   = LayerNorm(gelu(x Wiᵀ + bi) Wo2ᵀ + bo2 + x)
//! ```
//!
//! # Example
//! ```no_run
//! use fl_engine::checkpoint::Checkpoint;
//! use fl_engine::encoder::{config::EncoderConfig, reference, weights::EncoderWeights};
//! use fl_engine::encoder::{PackedBatch, Pooling};
//! let dir = "models/bge-small-en-v1.5";
//! let cfg = EncoderConfig::from_model_dir(dir)?;
//! let w = EncoderWeights::load(&Checkpoint::open(dir)?, &cfg)?;
//! let batch = PackedBatch::new(&cfg, &[vec![101, 7592, 102], vec![101, 2088, 2003, 102]], None)?;
//! let states = reference::forward(&cfg, &w, &batch)?; // [7, hidden]
//! let mut emb = reference::pool(&states, &batch, cfg.hidden_size, Pooling::Cls)?; // [2, hidden]
//! reference::l2_normalize(&mut emb, cfg.hidden_size)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use fl_kernels::reference::activation::gelu_scalar;

use crate::encoder::batch::{PackedBatch, Pooling};
use crate::encoder::config::EncoderConfig;
use crate::encoder::weights::{
    ClassifierHead, Dense, EncoderLayerWeights, EncoderWeights, LayerNorm,
};
use crate::error::{EngineError, Result};

/// The last hidden state of every token of `batch`: `[batch.num_tokens(), hidden_size]`,
/// sequences in batch order.
///
/// # Errors
/// [`EngineError::Config`] if `cfg` fails [`EncoderConfig::validate`]; [`EngineError::Invalid`]
/// naming `weights` fields that do not match `cfg` ([`EncoderWeights::check`]) or a `batch`
/// field that is inconsistent or out of range for `cfg` (a batch from [`PackedBatch::new`]
/// with the same config always passes).
pub fn forward(cfg: &EncoderConfig, w: &EncoderWeights, batch: &PackedBatch) -> Result<Vec<f32>> {
    cfg.validate()?;
    w.check(cfg)?;
    check_batch(cfg, batch)?;
    let mut x = embed(cfg, w, batch);
    for lw in &w.layers {
        x = layer(cfg, lw, batch, &x);
    }
    Ok(x)
}

/// One vector per sequence from the last hidden states `states` (`[tokens, hidden]`, as
/// [`forward`] returns them): the first token, the mean over the sequence's tokens, or the
/// last token. Returns `[batch.num_seqs(), hidden]`.
///
/// # Errors
/// [`EngineError::Invalid`] naming `hidden` (zero) or `states` (not `[tokens, hidden]`).
pub fn pool(
    states: &[f32],
    batch: &PackedBatch,
    hidden: usize,
    pooling: Pooling,
) -> Result<Vec<f32>> {
    check_states(states, batch, hidden)?;
    let mut out = Vec::with_capacity(batch.num_seqs() * hidden);
    for s in 0..batch.num_seqs() {
        let r = batch.seq_range(s);
        let row = |t: usize| &states[t * hidden..(t + 1) * hidden];
        match pooling {
            Pooling::Cls => out.extend_from_slice(row(r.start)),
            Pooling::LastToken => out.extend_from_slice(row(r.end - 1)),
            Pooling::Mean => {
                let n = r.len() as f64;
                for c in 0..hidden {
                    let sum: f64 = r.clone().map(|t| states[t * hidden + c] as f64).sum();
                    out.push((sum / n) as f32);
                }
            }
        }
    }
    Ok(out)
}

/// Divides each row of `rows` (`[n, dim]`) by its L2 norm, in place; a row of norm below
/// 1e-12 is divided by 1e-12 instead (PyTorch's `F.normalize`), so a zero row stays zero.
///
/// # Errors
/// [`EngineError::Invalid`] naming `dim` (zero) or `rows` (length not a multiple of `dim`).
pub fn l2_normalize(rows: &mut [f32], dim: usize) -> Result<()> {
    if dim == 0 {
        return Err(EngineError::invalid("dim", "must be > 0"));
    }
    if rows.len() % dim != 0 {
        return Err(EngineError::invalid(
            "rows",
            format!("has {} values, not a multiple of dim {dim}", rows.len()),
        ));
    }
    for row in rows.chunks_mut(dim) {
        let norm = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt();
        let d = norm.max(1e-12);
        for v in row {
            *v = (*v as f64 / d) as f32;
        }
    }
    Ok(())
}

/// BERT's pooler output: `tanh(pooler(h_cls))` per sequence, `[batch.num_seqs(), hidden]`.
///
/// # Errors
/// [`EngineError::Invalid`] naming `weights` (no pooler) or `states` (not `[tokens, hidden]`).
pub fn pooler_output(
    cfg: &EncoderConfig,
    w: &EncoderWeights,
    states: &[f32],
    batch: &PackedBatch,
) -> Result<Vec<f32>> {
    let pooler = w
        .pooler
        .as_ref()
        .ok_or_else(|| EngineError::invalid("weights", "the checkpoint has no pooler"))?;
    // Pool first: it rejects a zero hidden size, which `linear` cannot take.
    let cls = pool(states, batch, cfg.hidden_size, Pooling::Cls)?;
    pooler.check("weights.pooler", cfg.hidden_size, cfg.hidden_size)?;
    Ok(tanh(linear(&cls, pooler)))
}

/// The classification head's logits, `[batch.num_seqs(), num_labels]`: BERT
/// `classifier(tanh(pooler(h_cls)))`, RoBERTa / XLM-R `out_proj(tanh(dense(h_cls)))`.
///
/// # Errors
/// [`EngineError::Invalid`] naming `weights` (no head, or a head that does not match `cfg`)
/// or `states` (not `[tokens, hidden]`).
pub fn classify(
    cfg: &EncoderConfig,
    w: &EncoderWeights,
    states: &[f32],
    batch: &PackedBatch,
) -> Result<Vec<f32>> {
    let h = cfg.hidden_size;
    // Pool first: it rejects a zero hidden size, which `linear` cannot take.
    let cls = pool(states, batch, h, Pooling::Cls)?;
    match &w.head {
        None => Err(EngineError::invalid(
            "weights",
            "have no classification head (config.json names no *ForSequenceClassification)",
        )),
        Some(ClassifierHead::Bert { classifier }) => {
            classifier.check("weights.head.classifier", cfg.num_labels, h)?;
            let pooled = pooler_output(cfg, w, states, batch)?;
            Ok(linear(&pooled, classifier))
        }
        Some(ClassifierHead::Roberta { dense, out_proj }) => {
            dense.check("weights.head.dense", h, h)?;
            out_proj.check("weights.head.out_proj", cfg.num_labels, h)?;
            Ok(linear(&tanh(linear(&cls, dense)), out_proj))
        }
    }
}

fn check_states(states: &[f32], batch: &PackedBatch, hidden: usize) -> Result<()> {
    if hidden == 0 {
        return Err(EngineError::invalid("hidden", "must be > 0"));
    }
    check_cu_seqlens(batch)?;
    if states.len() != batch.num_tokens() * hidden {
        return Err(EngineError::invalid(
            "states",
            format!(
                "has {} values, expected [{} tokens, {hidden}]",
                states.len(),
                batch.num_tokens()
            ),
        ));
    }
    Ok(())
}

fn check_cu_seqlens(batch: &PackedBatch) -> Result<()> {
    let cu = &batch.cu_seqlens;
    let ok = cu.first() == Some(&0)
        && cu.windows(2).all(|p| p[0] < p[1])
        && cu.last().map(|&n| n as usize) == Some(batch.ids.len());
    if ok {
        Ok(())
    } else {
        Err(EngineError::invalid(
            "batch.cu_seqlens",
            format!(
                "must start at 0, increase strictly and end at the token count {}",
                batch.ids.len()
            ),
        ))
    }
}

/// The batch's invariants ([`PackedBatch::new`] establishes them), checked again because the
/// fields are public.
fn check_batch(cfg: &EncoderConfig, b: &PackedBatch) -> Result<()> {
    check_cu_seqlens(b)?;
    let n = b.ids.len();
    for (arg, v, limit, limit_name) in [
        ("batch.ids", &b.ids, cfg.vocab_size, "vocab_size"),
        (
            "batch.token_types",
            &b.token_types,
            cfg.type_vocab_size,
            "type_vocab_size",
        ),
        (
            "batch.positions",
            &b.positions,
            cfg.max_position_embeddings,
            "max_position_embeddings",
        ),
    ] {
        if v.len() != n {
            return Err(EngineError::invalid(
                arg,
                format!("has {} values for {n} tokens", v.len()),
            ));
        }
        if let Some((i, x)) = v.iter().enumerate().find(|(_, &x)| x as usize >= limit) {
            return Err(EngineError::invalid(
                arg,
                format!("token {i}: {x} >= {limit_name} {limit}"),
            ));
        }
    }
    Ok(())
}

/// `LayerNorm(word[id] + position[pos] + token_type[type])` per token.
fn embed(cfg: &EncoderConfig, w: &EncoderWeights, b: &PackedBatch) -> Vec<f32> {
    let h = cfg.hidden_size;
    let mut out = Vec::with_capacity(b.num_tokens() * h);
    let mut row = vec![0f64; h];
    for t in 0..b.num_tokens() {
        let word = &w.word_embeddings[b.ids[t] as usize * h..][..h];
        let pos = &w.position_embeddings[b.positions[t] as usize * h..][..h];
        let typ = &w.token_type_embeddings[b.token_types[t] as usize * h..][..h];
        for c in 0..h {
            row[c] = word[c] as f64 + typ[c] as f64 + pos[c] as f64;
        }
        layer_norm_into(&row, &w.embeddings_norm, cfg.layer_norm_eps, &mut out);
    }
    out
}

/// One encoder layer over the packed tokens `x` (`[tokens, hidden]`).
fn layer(cfg: &EncoderConfig, lw: &EncoderLayerWeights, b: &PackedBatch, x: &[f32]) -> Vec<f32> {
    let q = linear(x, &lw.query);
    let k = linear(x, &lw.key);
    let v = linear(x, &lw.value);
    let ctx = attention(cfg, b, &q, &k, &v);
    let attn = linear(&ctx, &lw.attn_out);
    let x1 = add_layer_norm(&attn, x, &lw.attn_norm, cfg.layer_norm_eps);
    let mut inter = linear(&x1, &lw.intermediate);
    for val in &mut inter {
        *val = gelu_scalar(*val as f64, cfg.hidden_act) as f32;
    }
    let out = linear(&inter, &lw.output);
    add_layer_norm(&out, &x1, &lw.output_norm, cfg.layer_norm_eps)
}

/// `x Wᵀ + b` for every row of `x` (`[rows, in]` -> `[rows, out]`), accumulated in f64.
fn linear(x: &[f32], d: &Dense) -> Vec<f32> {
    let mut y = Vec::with_capacity(x.len() / d.in_features * d.out_features);
    for row in x.chunks_exact(d.in_features) {
        for (w, &bias) in d.weight.chunks_exact(d.in_features).zip(&d.bias) {
            let dot: f64 = row.iter().zip(w).map(|(&a, &b)| a as f64 * b as f64).sum();
            y.push((dot + bias as f64) as f32);
        }
    }
    y
}

fn tanh(mut x: Vec<f32>) -> Vec<f32> {
    for v in &mut x {
        *v = v.tanh();
    }
    x
}

/// LayerNorm of one row (two-pass biased variance, f64), appended to `out` in f32.
fn layer_norm_into(row: &[f64], norm: &LayerNorm, eps: f64, out: &mut Vec<f32>) {
    let n = row.len() as f64;
    let mean = row.iter().sum::<f64>() / n;
    let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    let rstd = 1.0 / (var + eps).sqrt();
    for ((v, &g), &b) in row.iter().zip(&norm.weight).zip(&norm.bias) {
        out.push(((v - mean) * rstd * g as f64 + b as f64) as f32);
    }
}

/// `LayerNorm(x + residual)` row by row (the sum in f32, as transformers adds them).
fn add_layer_norm(x: &[f32], residual: &[f32], norm: &LayerNorm, eps: f64) -> Vec<f32> {
    let h = norm.weight.len();
    let mut out = Vec::with_capacity(x.len());
    let mut row = vec![0f64; h];
    for (xr, rr) in x.chunks_exact(h).zip(residual.chunks_exact(h)) {
        for c in 0..h {
            row[c] = (xr[c] + rr[c]) as f64;
        }
        layer_norm_into(&row, norm, eps, &mut out);
    }
    out
}

/// Non-causal multi-head attention of each sequence over its own tokens: for query token `i`
/// and head `hd`, `sum_j softmax_j(q_i·k_j * scale) v_j` over the tokens `j` of `i`'s sequence.
fn attention(cfg: &EncoderConfig, b: &PackedBatch, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
    let h = cfg.hidden_size;
    let d = cfg.head_dim();
    let scale = cfg.attention_scale();
    let mut out = vec![0f32; q.len()];
    let mut p = Vec::with_capacity(b.max_seqlen());
    for s in 0..b.num_seqs() {
        let r = b.seq_range(s);
        for head in 0..cfg.num_attention_heads {
            let cols = head * d..(head + 1) * d;
            for i in r.clone() {
                let qi = &q[i * h..][cols.clone()];
                p.clear();
                for j in r.clone() {
                    let kj = &k[j * h..][cols.clone()];
                    let dot: f64 = qi.iter().zip(kj).map(|(&a, &b)| a as f64 * b as f64).sum();
                    p.push(dot * scale);
                }
                let max = p.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let mut sum = 0f64;
                for x in &mut p {
                    *x = (*x - max).exp();
                    sum += *x;
                }
                for c in 0..d {
                    let acc: f64 = r
                        .clone()
                        .zip(&p)
                        .map(|(j, &pj)| pj * v[j * h + head * d + c] as f64)
                        .sum();
                    out[i * h + head * d + c] = (acc / sum) as f32;
                }
            }
        }
    }
    out
}
