//! [`PackedBatch`]: a ragged batch of sequences packed back to back (no padding), and
//! [`Pooling`]: how one vector per sequence is taken from its tokens.

use std::ops::Range;
use std::str::FromStr;

use crate::encoder::config::EncoderConfig;
use crate::error::{EngineError, Result};

/// A ragged batch, packed as FasterTransformer's Effective Transformer packs it: the tokens of
/// every sequence back to back, `cu_seqlens` marking where each starts, no padded token
/// anywhere. Built (and checked against the model) by [`PackedBatch::new`]; every field then
/// holds in-range values, so the forward can index the embeddings without further checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedBatch {
    /// Token ids, `[tokens]`, each `< vocab_size`.
    pub ids: Vec<u32>,
    /// Token types, `[tokens]`, each `< type_vocab_size` (0 where none were given).
    pub token_types: Vec<u32>,
    /// Position ids, `[tokens]`, each `< max_position_embeddings`
    /// ([`EncoderConfig::position_ids`] of each sequence).
    pub positions: Vec<u32>,
    /// Sequence boundaries, `[seqs + 1]`: sequence `s` is tokens
    /// `cu_seqlens[s]..cu_seqlens[s + 1]`; starts at 0, strictly increasing.
    pub cu_seqlens: Vec<u32>,
}

impl PackedBatch {
    /// Packs `seqs` (each a sequence's ids, no padding) with their `token_types` (same
    /// lengths; `None`: all 0) for `cfg`.
    ///
    /// # Errors
    /// [`EngineError::Invalid`] naming `seqs` (an empty sequence, an id `>= vocab_size`, a
    /// sequence longer than [`EncoderConfig::max_sequence_len`], more than `u32::MAX` tokens)
    /// or `token_types` (another number of sequences or tokens, a type `>= type_vocab_size`).
    ///
    /// # Example
    /// ```
    /// use fl_engine::encoder::{config::EncoderConfig, PackedBatch};
    /// let cfg = EncoderConfig::from_json_str(r#"{"model_type": "bert", "vocab_size": 100,
    ///     "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
    ///     "intermediate_size": 16, "max_position_embeddings": 16}"#)?;
    /// let b = PackedBatch::new(&cfg, &[vec![2, 7, 9], vec![2, 5]], Some(&[vec![0, 0, 1], vec![0, 1]]))?;
    /// assert_eq!(b.cu_seqlens, [0, 3, 5]);
    /// assert_eq!(b.positions, [0, 1, 2, 0, 1]);
    /// assert_eq!(b.seq_range(1), 3..5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new<S: AsRef<[u32]>>(
        cfg: &EncoderConfig,
        seqs: &[S],
        token_types: Option<&[S]>,
    ) -> Result<Self> {
        if let Some(t) = token_types {
            if t.len() != seqs.len() {
                return Err(EngineError::invalid(
                    "token_types",
                    format!("has {} sequences, seqs has {}", t.len(), seqs.len()),
                ));
            }
        }
        let total: usize = seqs.iter().map(|s| s.as_ref().len()).sum();
        if u32::try_from(total).is_err() {
            return Err(EngineError::invalid(
                "seqs",
                format!("{total} tokens in all, more than u32::MAX"),
            ));
        }
        let mut b = PackedBatch {
            ids: Vec::with_capacity(total),
            token_types: Vec::with_capacity(total),
            positions: Vec::with_capacity(total),
            cu_seqlens: Vec::with_capacity(seqs.len() + 1),
        };
        b.cu_seqlens.push(0);
        for (s, ids) in seqs.iter().enumerate() {
            let ids = ids.as_ref();
            if ids.is_empty() {
                return Err(EngineError::invalid(
                    "seqs",
                    format!("sequence {s} is empty"),
                ));
            }
            if ids.len() > cfg.max_sequence_len() {
                return Err(EngineError::invalid(
                    "seqs",
                    format!(
                        "sequence {s} has {} tokens, the model's positions cover {} (max_position_embeddings {})",
                        ids.len(),
                        cfg.max_sequence_len(),
                        cfg.max_position_embeddings
                    ),
                ));
            }
            if let Some((i, id)) = ids
                .iter()
                .enumerate()
                .find(|(_, &id)| id as usize >= cfg.vocab_size)
            {
                return Err(EngineError::invalid(
                    "seqs",
                    format!(
                        "sequence {s} token {i}: id {id} >= vocab_size {}",
                        cfg.vocab_size
                    ),
                ));
            }
            match token_types.map(|t| t[s].as_ref()) {
                Some(types) => {
                    if types.len() != ids.len() {
                        return Err(EngineError::invalid(
                            "token_types",
                            format!(
                                "sequence {s} has {} types for {} ids",
                                types.len(),
                                ids.len()
                            ),
                        ));
                    }
                    if let Some((i, t)) = types
                        .iter()
                        .enumerate()
                        .find(|(_, &t)| t as usize >= cfg.type_vocab_size)
                    {
                        return Err(EngineError::invalid(
                            "token_types",
                            format!(
                                "sequence {s} token {i}: type {t} >= type_vocab_size {}",
                                cfg.type_vocab_size
                            ),
                        ));
                    }
                    b.token_types.extend_from_slice(types);
                }
                None => b.token_types.extend(std::iter::repeat_n(0, ids.len())),
            }
            // In range: position ids are at most first_position + len - 1 < max_position_embeddings.
            b.positions
                .extend(cfg.position_ids(ids).into_iter().map(|p| p as u32));
            b.ids.extend_from_slice(ids);
            b.cu_seqlens.push(b.ids.len() as u32);
        }
        Ok(b)
    }

    /// Number of sequences.
    pub fn num_seqs(&self) -> usize {
        self.cu_seqlens.len().saturating_sub(1)
    }

    /// Number of tokens in all sequences.
    pub fn num_tokens(&self) -> usize {
        self.ids.len()
    }

    /// The tokens of sequence `s` as a range of packed rows (empty when `s` is out of range).
    pub fn seq_range(&self, s: usize) -> Range<usize> {
        match (self.cu_seqlens.get(s), self.cu_seqlens.get(s + 1)) {
            (Some(&a), Some(&b)) => a as usize..b as usize,
            _ => 0..0,
        }
    }

    /// The longest sequence's length.
    pub fn max_seqlen(&self) -> usize {
        (0..self.num_seqs())
            .map(|s| self.seq_range(s).len())
            .max()
            .unwrap_or(0)
    }
}

/// How one embedding per sequence is taken from its last hidden states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pooling {
    /// The first token's state (`[CLS]` / `<s>`).
    Cls,
    /// The mean over the sequence's tokens (no padding is ever counted).
    Mean,
    /// The last token's state.
    LastToken,
}

impl Pooling {
    /// The name `--pooling` takes: `cls`, `mean`, `last`.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Cls => "cls",
            Pooling::Mean => "mean",
            Pooling::LastToken => "last",
        }
    }
}

impl FromStr for Pooling {
    type Err = EngineError;

    /// `cls`, `mean` or `last` (also `last_token`).
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "cls" => Ok(Pooling::Cls),
            "mean" => Ok(Pooling::Mean),
            "last" | "last_token" => Ok(Pooling::LastToken),
            other => Err(EngineError::invalid(
                "pooling",
                format!("`{other}`: expected cls, mean or last"),
            )),
        }
    }
}
