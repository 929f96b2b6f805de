//! Text in and out: a Hugging Face `tokenizer.json` through the `tokenizers` crate.

use std::path::{Path, PathBuf};

use crate::error::{EngineError, Result};

/// A loaded `tokenizer.json`.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
    /// The decoder maps GPT-2's byte-level characters back to bytes.
    byte_level: bool,
}

/// Whether `t`'s decoder (or one in its sequence) is byte-level BPE's.
fn has_byte_level_decoder(t: &tokenizers::Tokenizer) -> bool {
    t.get_decoder()
        .and_then(|d| serde_json::to_string(d).ok())
        .is_some_and(|j| j.contains("\"ByteLevel\""))
}

/// GPT-2's byte-level alphabet, inverted: the byte each of its 256 characters stands for.
fn byte_level_byte(c: char) -> Option<u8> {
    let c = c as u32;
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    if c < 256 {
        return printable(c).then_some(c as u8);
    }
    // The other bytes, in order, are characters 256, 257, ...
    (0u32..256)
        .filter(|&b| !printable(b))
        .nth((c - 256) as usize)
        .map(|b| b as u8)
}

impl Tokenizer {
    /// The tokenizer of a model directory: `Ok(None)` when it has no `tokenizer.json`
    /// (then token ids go in and out instead of text).
    ///
    /// Errors: [`EngineError::Tokenizer`] when the file exists but cannot be parsed.
    pub fn from_model_dir(dir: impl AsRef<Path>) -> Result<Option<Self>> {
        let path = dir.as_ref().join("tokenizer.json");
        if !path.is_file() {
            return Ok(None);
        }
        Self::from_file(&path).map(Some)
    }

    /// Loads `path`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| EngineError::Tokenizer {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
        Ok(Tokenizer {
            byte_level: has_byte_level_decoder(&inner),
            inner,
            path: path.to_path_buf(),
        })
    }

    /// Wraps a tokenizer built elsewhere (e.g. from a GGUF file's metadata, named by `origin`
    /// in errors).
    pub fn from_tokenizers(inner: tokenizers::Tokenizer, origin: PathBuf) -> Self {
        Tokenizer {
            byte_level: has_byte_level_decoder(&inner),
            inner,
            path: origin,
        }
    }

    /// The `tokenizers` tokenizer inside (e.g. to clone it with other truncation settings).
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The file it was loaded from (or the origin given to [`Tokenizer::from_tokenizers`]).
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, e: impl std::fmt::Display) -> EngineError {
        EngineError::Tokenizer {
            path: self.path.clone(),
            detail: e.to_string(),
        }
    }

    /// Token ids of `text`, with the tokenizer's special tokens (e.g. BOS) when
    /// `add_special` (what transformers does by default).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, add_special)
            .map_err(|e| self.err(e))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`, special tokens skipped.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, true).map_err(|e| self.err(e))
    }

    /// The bytes token `id` stands for, as the vocabulary holds it: a byte-fallback piece
    /// `<0xHH>` is that byte, a byte-level BPE piece (GPT-2's alphabet, with a `ByteLevel`
    /// decoder) its bytes, any other piece its text with SentencePiece's `▁` as a space (so a
    /// word's leading space is kept, where decoding the token alone drops it); a special
    /// token its text. `None` for an id outside the vocabulary. A token may end inside a
    /// UTF-8 character: its bytes are then not valid text on their own.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        let piece = self.inner.id_to_token(id)?;
        if let Some(hex) = piece.strip_prefix("<0x").and_then(|p| p.strip_suffix('>')) {
            if hex.len() == 2 {
                if let Ok(b) = u8::from_str_radix(hex, 16) {
                    return Some(vec![b]);
                }
            }
        }
        if self.byte_level {
            if let Some(bytes) = piece
                .chars()
                .map(byte_level_byte)
                .collect::<Option<Vec<u8>>>()
            {
                return Some(bytes);
            }
        }
        Some(piece.replace('\u{2581}', " ").into_bytes())
    }
}
