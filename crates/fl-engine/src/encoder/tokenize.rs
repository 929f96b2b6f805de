//! Text to encoder inputs: [`EncoderTokenizer`] encodes single texts (embeddings) and
//! (query, passage) pairs (rerankers) as transformers' fast tokenizers do with
//! `truncation=True, max_length=N`: special tokens and token type ids from the
//! `tokenizer.json`'s post-processor, longest-first truncation to the model's length, no
//! padding. [`Encoded`] then packs into a [`PackedBatch`].

use std::path::PathBuf;

use tokenizers::utils::truncation::{TruncationDirection, TruncationParams, TruncationStrategy};
use tokenizers::{EncodeInput, PostProcessor};

use crate::encoder::batch::PackedBatch;
use crate::encoder::config::EncoderConfig;
use crate::error::{EngineError, Result};
use crate::tokenizer::Tokenizer;

/// Token ids and token type ids of a batch of sequences, special tokens included, each
/// sequence at most [`EncoderTokenizer::max_len`] tokens: what [`PackedBatch::new`] takes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Encoded {
    /// Token ids, one `Vec` per sequence.
    pub ids: Vec<Vec<u32>>,
    /// Token type ids (0 for the first text, 1 for a pair's second with BERT's template), same
    /// shape as `ids`.
    pub token_types: Vec<Vec<u32>>,
}

impl Encoded {
    /// Number of sequences.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether it holds no sequence.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Packs the sequences for `cfg` ([`PackedBatch::new`] with the token types).
    ///
    /// # Errors
    /// Those of [`PackedBatch::new`] (e.g. an id `>= vocab_size`: a tokenizer of another model).
    pub fn pack(&self, cfg: &EncoderConfig) -> Result<PackedBatch> {
        PackedBatch::new(cfg, &self.ids, Some(&self.token_types))
    }
}

/// A tokenizer set up for an encoder: truncation to `max_len` tokens (special tokens
/// included; longest-first for pairs, from the right), padding off whatever the
/// `tokenizer.json` says (sequences are packed, never padded).
///
/// # Example
/// ```no_run
/// use fl_engine::encoder::{tokenize::EncoderTokenizer, EncoderConfig};
/// use fl_engine::tokenizer::Tokenizer;
/// let dir = "models/bge-reranker-base";
/// let cfg = EncoderConfig::from_model_dir(dir)?;
/// let tok = Tokenizer::from_model_dir(dir)?.expect("tokenizer.json");
/// let enc = EncoderTokenizer::new(&tok, &cfg)?;
/// let pairs = enc.encode_pairs("what is panda?", &["The giant panda is a bear.", "hi"])?;
/// let batch = pairs.pack(&cfg)?; // 2 sequences, each <= cfg.max_sequence_len() tokens
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct EncoderTokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
    max_len: usize,
}

impl std::fmt::Debug for EncoderTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncoderTokenizer")
            .field("path", &self.path)
            .field("max_len", &self.max_len)
            .finish_non_exhaustive()
    }
}

impl EncoderTokenizer {
    /// `tok` truncating to the model's length, [`EncoderConfig::max_sequence_len`].
    ///
    /// # Errors
    /// Those of [`EncoderTokenizer::with_max_len`].
    pub fn new(tok: &Tokenizer, cfg: &EncoderConfig) -> Result<Self> {
        Self::with_max_len(tok, cfg.max_sequence_len())
    }

    /// `tok` truncating to `max_len` tokens (special tokens included).
    ///
    /// # Errors
    /// [`EngineError::Invalid`] naming `max_len` when it leaves no room for a pair's text
    /// beside the special tokens the post-processor adds; [`EngineError::Tokenizer`] when
    /// the tokenizer refuses the truncation settings.
    ///
    /// # Example
    /// ```no_run
    /// use fl_engine::encoder::tokenize::EncoderTokenizer;
    /// use fl_engine::tokenizer::Tokenizer;
    /// let tok = Tokenizer::from_file("models/bge-small-en-v1.5/tokenizer.json".as_ref())?;
    /// let enc = EncoderTokenizer::with_max_len(&tok, 8)?;
    /// let e = enc.encode_texts(&["a long sentence of more than six words, surely"])?;
    /// assert_eq!(e.ids[0].len(), 8); // [CLS] + 6 words + [SEP]
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_max_len(tok: &Tokenizer, max_len: usize) -> Result<Self> {
        let mut inner = tok.inner().clone();
        let added = inner
            .get_post_processor()
            .map_or(0, |p| p.added_tokens(true).max(p.added_tokens(false)));
        // A pair needs one token of each text beside the special ones.
        if max_len < added + 2 {
            return Err(EngineError::invalid(
                "max_len",
                format!(
                    "{max_len} tokens leave no room for a pair's texts beside the {added} special tokens"
                ),
            ));
        }
        let err = |e: tokenizers::Error| EngineError::Tokenizer {
            path: tok.path().to_path_buf(),
            detail: e.to_string(),
        };
        inner
            .with_truncation(Some(TruncationParams {
                direction: TruncationDirection::Right,
                max_length: max_len,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .map_err(err)?;
        inner.with_padding(None);
        Ok(EncoderTokenizer {
            inner,
            path: tok.path().to_path_buf(),
            max_len,
        })
    }

    /// The most tokens a sequence gets, special tokens included.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    fn encode(
        &self,
        arg: &'static str,
        i: usize,
        input: EncodeInput<'_>,
    ) -> Result<(Vec<u32>, Vec<u32>)> {
        let enc = self
            .inner
            .encode(input, true)
            .map_err(|e| EngineError::Tokenizer {
                path: self.path.clone(),
                detail: format!("{arg}[{i}]: {e}"),
            })?;
        if enc.get_ids().is_empty() {
            // Only a tokenizer without special tokens gives nothing (for an empty text).
            return Err(EngineError::invalid(
                arg,
                format!("text {i} gives no tokens"),
            ));
        }
        Ok((enc.get_ids().to_vec(), enc.get_type_ids().to_vec()))
    }

    /// Each of `texts` alone, as the embedding models take them.
    ///
    /// # Errors
    /// [`EngineError::Tokenizer`] naming `texts[i]`; [`EngineError::Invalid`] naming `texts`
    /// for a text that gives no token at all.
    pub fn encode_texts<S: AsRef<str>>(&self, texts: &[S]) -> Result<Encoded> {
        let mut out = Encoded::default();
        for (i, t) in texts.iter().enumerate() {
            let (ids, types) = self.encode("texts", i, EncodeInput::Single(t.as_ref().into()))?;
            out.ids.push(ids);
            out.token_types.push(types);
        }
        Ok(out)
    }

    /// `(query, passage)` for each of `passages`, as cross-encoder rerankers take them: both
    /// texts in one sequence per the post-processor's pair template (BERT:
    /// `[CLS] q [SEP] p [SEP]`, types 0 then 1), the longer text cut first when too long.
    ///
    /// # Errors
    /// [`EngineError::Tokenizer`] naming `passages[i]`; [`EngineError::Invalid`] naming
    /// `passages` for a pair that gives no token at all.
    pub fn encode_pairs<S: AsRef<str>>(&self, query: &str, passages: &[S]) -> Result<Encoded> {
        let mut out = Encoded::default();
        for (i, p) in passages.iter().enumerate() {
            let input = EncodeInput::Dual(query.into(), p.as_ref().into());
            let (ids, types) = self.encode("passages", i, input)?;
            out.ids.push(ids);
            out.token_types.push(types);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/encoder/tokenizer")
    }

    fn tokenizer() -> Tokenizer {
        Tokenizer::from_file(&dir().join("tokenizer.json")).unwrap()
    }

    fn u32s(v: &Value) -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    }

    /// A BERT config over the fixture's vocabulary whose positions cover `max_len`.
    fn cfg(vocab: usize, max_len: usize) -> EncoderConfig {
        EncoderConfig::from_json_str(&format!(
            r#"{{"model_type": "bert", "vocab_size": {vocab}, "hidden_size": 8,
            "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16,
            "max_position_embeddings": {max_len}}}"#
        ))
        .unwrap()
    }

    #[test]
    fn matches_transformers_bert_tokenizer_fast() {
        let text = std::fs::read_to_string(dir().join("encodings.json")).unwrap();
        let expected: Value = serde_json::from_str(&text).unwrap();
        let vocab = expected["vocab_size"].as_u64().unwrap() as usize;
        let tok = tokenizer();
        let cases = expected["cases"].as_array().unwrap();
        assert!(cases.len() >= 20);
        let mut truncated = 0;
        for (n, c) in cases.iter().enumerate() {
            // Untruncated cases run at a length no case reaches.
            let max_len = c["max_length"].as_u64().map_or(64, |m| m as usize);
            let cfg = cfg(vocab, max_len);
            let enc = EncoderTokenizer::new(&tok, &cfg).unwrap();
            assert_eq!(enc.max_len(), max_len);
            let a = c["text"].as_str().unwrap();
            let got = match c["pair"].as_str() {
                Some(p) => enc.encode_pairs(a, &[p]).unwrap(),
                None => enc.encode_texts(&[a]).unwrap(),
            };
            let (ids, types) = (u32s(&c["ids"]), u32s(&c["token_types"]));
            assert_eq!(got.ids, std::slice::from_ref(&ids), "case {n}: {c}");
            assert_eq!(got.token_types, [types], "case {n}: {c}");
            truncated += usize::from(ids.len() == max_len);
            let b = got.pack(&cfg).unwrap();
            assert_eq!(b.ids, ids, "case {n}");
        }
        assert!(truncated >= 10, "{truncated} cases reach max_length");
    }

    #[test]
    fn batches_keep_order_and_pack() {
        let tok = tokenizer();
        let cfg = cfg(61, 16);
        let enc = EncoderTokenizer::new(&tok, &cfg).unwrap();
        let texts = ["the cat sat", "", "what is the capital of france?"];
        let e = enc.encode_texts(&texts).unwrap();
        assert_eq!(e.len(), 3);
        for (i, t) in texts.iter().enumerate() {
            let one = enc.encode_texts(&[t]).unwrap();
            assert_eq!(one.ids[0], e.ids[i]);
        }
        assert_eq!(e.ids[1], [2, 3]); // [CLS] [SEP]
        let b = e.pack(&cfg).unwrap();
        assert_eq!(b.num_seqs(), 3);
        assert_eq!(b.cu_seqlens, [0, 5, 7, 16]);

        let p = enc
            .encode_pairs("the capital?", &["paris", "berlin is a city"])
            .unwrap();
        assert_eq!(p.token_types[0], [0, 0, 0, 0, 0, 1, 1]);
        assert_eq!(p.token_types[1], [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]);
        assert!(!p.is_empty() && Encoded::default().is_empty());
    }

    #[test]
    fn errors_name_the_argument() {
        let tok = tokenizer();
        // BERT's pair template adds 3 special tokens: 4 leaves no room for both texts.
        let e = EncoderTokenizer::with_max_len(&tok, 4)
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_len"), "{e}");
        EncoderTokenizer::with_max_len(&tok, 5).unwrap();
        // A model whose vocabulary is smaller than the tokenizer's.
        let enc = EncoderTokenizer::with_max_len(&tok, 16).unwrap();
        let e = enc.encode_texts(&["the dog"]).unwrap();
        let err = e.pack(&cfg(10, 16)).unwrap_err().to_string();
        assert!(err.contains("seqs") && err.contains("vocab_size"), "{err}");
    }
}
