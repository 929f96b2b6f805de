//! The tokenizer of a GGUF file, built from its `tokenizer.*` metadata as a `tokenizers`
//! [`Tokenizer`] that gives llama.cpp's token ids.
//!
//! The GGUF reader fills a [`TokenizerSpec`] from the metadata (field docs name the keys);
//! [`build`] turns it into a tokenizer:
//!
//! - `tokenizer.ggml.model = "llama"` (SentencePiece, llama.cpp's SPM): the text gets a
//!   leading space (unless `add_space_prefix` is false), spaces become `▁`, and the whole text
//!   is merged greedily, always the adjacent pair whose concatenation is the vocabulary entry
//!   with the highest score. That is BPE with one merge per (token, split into two vocabulary
//!   entries), ranked by the token's score, which is how it is built here; characters that no
//!   token covers fall back to the byte tokens `<0xNN>` (then `unk`).
//! - `tokenizer.ggml.model = "gpt2"` (byte-level BPE): the text is split by the regexes of
//!   the pre-tokenizer named by `tokenizer.ggml.pre` (as llama.cpp's `llm_tokenizer_bpe`),
//!   mapped to GPT-2's byte alphabet, and merged by `tokenizer.ggml.merges` rank.
//!
//! Token types (`tokenizer.ggml.token_type`): control (3) and unknown (2) tokens become special
//! added tokens (matched in text unless `encode_special_tokens` is set, and skipped when
//! decoding with `skip_special_tokens`); user-defined (4) tokens are always matched in text,
//! as llama.cpp does; normal (1), unused (5) and byte (6) tokens are plain vocabulary.
//! `add_bos` / `add_eos` become a post-processor, so `encode(text, true)` adds them.
//!
//! Matching llama.cpp's `parse_special = false` (its tokenizer tests) is
//! `tokenizer.set_encode_special_tokens(true)` with `encode(text, false)`. On llama.cpp's own
//! vocabularies (`models/ggml-vocab-*.gguf`, every `.inp` case) the ids are llama.cpp's.
//!
//! Not covered, as llama.cpp does otherwise: other tokenizer models (`bert`, `t5`, `rwkv`,
//! `gemma4`) and an unknown `tokenizer.ggml.pre` are errors; the lstrip / rstrip llama.cpp
//! gives some special tokens of a few models is not applied; two overlapping SentencePiece
//! merges of equal score are taken in token-id order where llama.cpp takes the leftmost.
//!
//! ```
//! use fl_engine::gguf::tokenizer::{build, TokenizerSpec};
//! let tokens = ["<unk>", "<s>", "</s>", "▁", "a", "b", "▁a", "ab", "▁ab"];
//! let spec = TokenizerSpec {
//!     model: "llama".into(),
//!     tokens: tokens.iter().map(|t| t.to_string()).collect(),
//!     scores: Some(vec![0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0]),
//!     token_types: Some(vec![2, 3, 3, 1, 1, 1, 1, 1, 1]),
//!     bos_id: Some(1),
//!     eos_id: Some(2),
//!     ..Default::default()
//! };
//! let tok = build(&spec)?;
//! assert_eq!(tok.encode("ab", true).unwrap().get_ids(), &[1, 8]);
//! assert_eq!(tok.decode(&[1, 8], true).unwrap(), "ab");
//! # Ok::<(), fl_engine::gguf::tokenizer::GgufTokenizerError>(())
//! ```

use std::collections::HashSet;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::{SpecialToken, TemplateProcessing};
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior,
    Tokenizer,
};

/// `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
pub mod token_type {
    /// An ordinary vocabulary entry.
    pub const NORMAL: i32 = 1;
    /// The unknown token: special.
    pub const UNKNOWN: i32 = 2;
    /// Control tokens (`<s>`, `<|eot_id|>`): special.
    pub const CONTROL: i32 = 3;
    /// Tokens added by the model's authors: always matched in text, not special.
    pub const USER_DEFINED: i32 = 4;
    /// Reserved entries: plain vocabulary.
    pub const UNUSED: i32 = 5;
    /// SentencePiece byte-fallback tokens `<0xNN>`.
    pub const BYTE: i32 = 6;
}

/// The `tokenizer.*` metadata of a GGUF file, one field per key (a key the file lacks is
/// `None`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenizerSpec {
    /// `tokenizer.ggml.model`: `"llama"` (SentencePiece) or `"gpt2"` (byte-level BPE).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer of a `gpt2` model (see [`PRE_TOKENIZERS`]);
    /// absent means llama.cpp's `"default"`.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: the text of every token id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores`: one per token; a `llama` model merges by them (absent: all 0,
    /// as llama.cpp reads it).
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.token_type`: one per token, values in [`token_type`] (absent: all
    /// normal).
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges`: `"left right"` pairs, highest priority first; required for
    /// `gpt2`.
    pub merges: Option<Vec<String>>,
    /// `tokenizer.ggml.bos_token_id` (a `llama` model defaults to 1, as llama.cpp).
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id` (a `llama` model defaults to 2).
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`: end of a chat turn, a stop token beside EOS.
    pub eot_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id` (a `llama` model defaults to 0).
    pub unk_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token` (absent: llama.cpp's default, see
    /// [`TokenizerSpec::add_bos_token`]).
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token` (absent: false).
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`: a `llama` model prefixes the text with a space
    /// (absent: true).
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template`: the Jinja chat template, carried for the chat front end.
    pub chat_template: Option<String>,
}

/// What [`build`] rejects; each names the metadata key at fault.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GgufTokenizerError {
    /// `tokenizer.ggml.model` is neither `llama` nor `gpt2`.
    #[error("tokenizer.ggml.model: unsupported tokenizer model {model:?} (supported: \"llama\", \"gpt2\")")]
    UnknownModel { model: String },
    /// `tokenizer.ggml.pre` names no pre-tokenizer of [`PRE_TOKENIZERS`].
    #[error("tokenizer.ggml.pre: unknown pre-tokenizer {pre:?} (supported: {})", PRE_TOKENIZERS.join(", "))]
    UnknownPre { pre: String },
    /// A key the model needs is absent.
    #[error("{key}: missing, but tokenizer.ggml.model = {model:?} needs it")]
    Missing { key: &'static str, model: String },
    /// `tokenizer.ggml.tokens` is empty.
    #[error("tokenizer.ggml.tokens: the vocabulary is empty")]
    EmptyVocab,
    /// A per-token array whose length differs from `tokenizer.ggml.tokens`.
    #[error("{key}: {got} entries, but tokenizer.ggml.tokens has {expected}")]
    Length {
        key: &'static str,
        expected: usize,
        got: usize,
    },
    /// A special token id outside the vocabulary.
    #[error("{key}: token id {id} is outside the vocabulary of {vocab_size} tokens")]
    TokenId {
        key: &'static str,
        id: u32,
        vocab_size: usize,
    },
    /// `add_bos` / `add_eos` is set but the token id is absent.
    #[error("{key}: true, but {id_key} is missing")]
    NoTokenToAdd {
        key: &'static str,
        id_key: &'static str,
    },
    /// A merge that is not two non-empty tokens separated by a space.
    #[error("tokenizer.ggml.merges[{index}]: {merge:?} is not \"left right\"")]
    Merge { index: usize, merge: String },
    /// The `tokenizers` crate refused a part built from `key`.
    #[error("{key}: {detail}")]
    Build { key: &'static str, detail: String },
}

type Result<T> = std::result::Result<T, GgufTokenizerError>;

/// The `tokenizer.ggml.pre` names [`build`] knows (llama.cpp's names; each family shares
/// llama.cpp's split regexes).
pub const PRE_TOKENIZERS: &[&str] = &[
    "default",
    "gpt-2",
    "phi-2",
    "mpt",
    "olmo",
    "jais",
    "roberta-bpe",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "pixtral",
    "smaug-bpe",
    "dbrx",
    "qwen2",
    "deepseek-r1-qwen",
    "megrez",
    "stablelm2",
    "qwen35",
    "starcoder",
    "refact",
    "command-r",
    "smollm",
    "codeshell",
    "exaone",
    "minerva-7b",
    "falcon",
    "tekken",
    "gpt-4o",
    "llama4",
    "deepseek-llm",
    "deepseek-coder",
];

// The split regexes of llama.cpp's `llm_tokenizer_bpe`, applied in order (each splits the
// pieces of the one before; matches and the text between them both become pieces).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const CONTRACTIONS: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";
const LLAMA3_REST: &str =
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REST: &str =
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35_REST: &str = r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
// Upper-then-lower letter runs, written with lookaheads as llama.cpp does.
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O_WORDS: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?";
// Cased-letter runs (DeepSeek LLM's tokenizer.json spells the class out).
const DEEPSEEK_LLM_LETTERS: &str = r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+";
const GPT4O_REST: &str = r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How llama.cpp pre-tokenizes one `tokenizer.ggml.pre` family.
struct PreTokenizer {
    regexes: Vec<String>,
    /// A whole piece that is a token is taken as is (`ignore_merges` in both libraries).
    ignore_merges: bool,
    /// llama.cpp's `add_bos` when `tokenizer.ggml.add_bos_token` is absent.
    default_add_bos: bool,
}

fn pre_tokenizer(pre: Option<&str>) -> Result<PreTokenizer> {
    let p = |regexes: &[&str], ignore_merges: bool, default_add_bos: bool| PreTokenizer {
        regexes: regexes.iter().map(|r| r.to_string()).collect(),
        ignore_merges,
        default_add_bos,
    };
    let llama3 = format!("{CONTRACTIONS}{LLAMA3_REST}");
    let qwen2 = format!("{CONTRACTIONS}{QWEN2_REST}");
    let qwen35 = format!("{CONTRACTIONS}{QWEN35_REST}");
    let gpt4o = format!("{GPT4O_WORDS}{GPT4O_REST}");
    Ok(match pre.unwrap_or("default") {
        "default" => p(
            &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
            false,
            false,
        ),
        "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "roberta-bpe" => p(&[GPT2], false, false),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" => p(&[&llama3], true, true),
        "smaug-bpe" | "dbrx" => p(&[&llama3], false, false),
        "qwen2" | "deepseek-r1-qwen" | "megrez" | "stablelm2" => p(&[&qwen2], false, false),
        "qwen35" => p(&[&qwen35], false, false),
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" => {
            p(&[r"\p{N}", GPT2], false, false)
        }
        "falcon" => p(
            &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"],
            false,
            false,
        ),
        "tekken" => p(&[TEKKEN], true, true),
        "gpt-4o" | "llama4" => p(&[&gpt4o], false, false),
        "deepseek-llm" => p(
            &[
                "[\r\n]",
                DEEPSEEK_LLM_LETTERS,
                r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+",
                r"\s+$",
                r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+",
                r"\p{N}+",
            ],
            false,
            false,
        ),
        "deepseek-coder" => p(
            &[
                "[\r\n]",
                r"\s?\p{L}+",
                r"\s?\p{P}+",
                r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+",
                r"\p{N}",
            ],
            false,
            false,
        ),
        other => {
            return Err(GgufTokenizerError::UnknownPre {
                pre: other.to_string(),
            })
        }
    })
}

/// Builds the tokenizer `spec` describes (see the module docs for what each model does).
///
/// Errors: [`GgufTokenizerError`] naming the key: an unknown model or pre-tokenizer, an
/// empty vocabulary, `scores` / `token_type` of another length than `tokens`, missing
/// `merges` for `gpt2`, a malformed merge, a special token id outside the vocabulary, or
/// `add_bos` / `add_eos` without the token.
pub fn build(spec: &TokenizerSpec) -> Result<Tokenizer> {
    let n = spec.tokens.len();
    if n == 0 {
        return Err(GgufTokenizerError::EmptyVocab);
    }
    check_len(
        "tokenizer.ggml.scores",
        spec.scores.as_ref().map(Vec::len),
        n,
    )?;
    check_len(
        "tokenizer.ggml.token_type",
        spec.token_types.as_ref().map(Vec::len),
        n,
    )?;
    for (key, id) in [
        ("tokenizer.ggml.bos_token_id", spec.bos_id),
        ("tokenizer.ggml.eos_token_id", spec.eos_id),
        ("tokenizer.ggml.eot_token_id", spec.eot_id),
        ("tokenizer.ggml.unknown_token_id", spec.unk_id),
        ("tokenizer.ggml.padding_token_id", spec.pad_id),
    ] {
        if let Some(id) = id {
            if id as usize >= n {
                return Err(GgufTokenizerError::TokenId {
                    key,
                    id,
                    vocab_size: n,
                });
            }
        }
    }
    let mut tokenizer = match spec.model.as_str() {
        "llama" => build_spm(spec)?,
        "gpt2" => build_bpe(spec)?,
        other => {
            return Err(GgufTokenizerError::UnknownModel {
                model: other.to_string(),
            })
        }
    };
    add_special_tokens(&mut tokenizer, spec)?;
    if let Some(post) = post_processor(spec)? {
        tokenizer.with_post_processor(Some(post));
    }
    Ok(tokenizer)
}

impl TokenizerSpec {
    /// Whether `encode(text, true)` starts with BOS: `add_bos` when present, else llama.cpp's
    /// default (true for `llama`; for `gpt2`, true for the llama3 and tekken pre-tokenizers).
    pub fn add_bos_token(&self) -> bool {
        self.add_bos.unwrap_or_else(|| match self.model.as_str() {
            "llama" => true,
            "gpt2" => pre_tokenizer(self.pre.as_deref())
                .map(|p| p.default_add_bos)
                .unwrap_or(false),
            _ => false,
        })
    }

    /// BOS, with llama.cpp's default for a `llama` model.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_id.or(self.spm_default(1))
    }

    /// EOS, with llama.cpp's default for a `llama` model.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos_id.or(self.spm_default(2))
    }

    /// The ids that end generation: EOS and EOT, each once.
    pub fn stop_ids(&self) -> Vec<u32> {
        let mut ids = Vec::new();
        for id in [self.eos_token_id(), self.eot_id].into_iter().flatten() {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        ids
    }

    fn unk_token_id(&self) -> Option<u32> {
        self.unk_id.or(self.spm_default(0))
    }

    fn spm_default(&self, id: u32) -> Option<u32> {
        (self.model == "llama" && (id as usize) < self.tokens.len()).then_some(id)
    }

    fn token_type(&self, id: usize) -> i32 {
        self.token_types
            .as_ref()
            .map_or(token_type::NORMAL, |t| t[id])
    }
}

fn check_len(key: &'static str, got: Option<usize>, expected: usize) -> Result<()> {
    match got {
        Some(got) if got != expected => Err(GgufTokenizerError::Length { key, expected, got }),
        _ => Ok(()),
    }
}

fn build_err(key: &'static str) -> impl Fn(tokenizers::Error) -> GgufTokenizerError {
    move |e| GgufTokenizerError::Build {
        key,
        detail: e.to_string(),
    }
}

/// token -> id; a text that occurs twice maps to its last id, as llama.cpp's `token_to_id`.
fn vocab_map(tokens: &[String]) -> Vocab {
    tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect()
}

/// SentencePiece as llama.cpp runs it: merges ranked by the merged token's score.
fn build_spm(spec: &TokenizerSpec) -> Result<Tokenizer> {
    let vocab = vocab_map(&spec.tokens);
    // (score, id, left, right): every way to write a token as two vocabulary entries.
    let mut candidates: Vec<(f32, u32, &str, &str)> = Vec::new();
    for (id, token) in spec.tokens.iter().enumerate() {
        if vocab.get(token) != Some(&(id as u32)) {
            continue; // a duplicate text: llama.cpp merges into the last id
        }
        let score = spec.scores.as_ref().map_or(0.0, |s| s[id]);
        for (split, _) in token.char_indices().skip(1) {
            let (left, right) = token.split_at(split);
            if vocab.contains_key(left) && vocab.contains_key(right) {
                candidates.push((score, id as u32, left, right));
            }
        }
    }
    // Highest score first; ties by id, so the order is deterministic.
    candidates.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let merges = candidates
        .into_iter()
        .map(|(_, _, l, r)| (l.to_string(), r.to_string()))
        .collect();

    let mut bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = spec.unk_token_id() {
        bpe = bpe.unk_token(spec.tokens[unk as usize].clone());
    }
    let bpe = bpe.build().map_err(build_err("tokenizer.ggml.tokens"))?;

    let prefix = spec.add_space_prefix.unwrap_or(true);
    let replace =
        |from: &str, to: &str| Replace::new(from, to).map_err(build_err("tokenizer.ggml.tokens"));
    let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
    if prefix {
        normalizers.push(Prepend::new("▁".into()).into());
    }
    normalizers.push(replace(" ", "▁")?.into());
    let mut decoders: Vec<DecoderWrapper> = vec![
        replace("▁", " ")?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }

    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer
        .with_normalizer(Some(NormalizerSequence::new(normalizers)))
        .map_err(build_err("tokenizer.ggml.tokens"))?;
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tokenizer)
}

/// Byte-level BPE with llama.cpp's pre-tokenizer regexes.
fn build_bpe(spec: &TokenizerSpec) -> Result<Tokenizer> {
    let pre = pre_tokenizer(spec.pre.as_deref())?;
    let Some(merge_strs) = spec.merges.as_ref() else {
        return Err(GgufTokenizerError::Missing {
            key: "tokenizer.ggml.merges",
            model: spec.model.clone(),
        });
    };
    let vocab = vocab_map(&spec.tokens);
    let mut seen = HashSet::new();
    let mut merges = Vec::with_capacity(merge_strs.len());
    for (index, merge) in merge_strs.iter().enumerate() {
        // As llama.cpp: the separator is the first space after the first byte.
        let sep = merge.as_bytes().iter().skip(1).position(|&b| b == b' ');
        let Some(sep) = sep.map(|s| s + 1) else {
            return Err(GgufTokenizerError::Merge {
                index,
                merge: merge.clone(),
            });
        };
        let (left, right) = (&merge[..sep], &merge[sep + 1..]);
        if right.is_empty() {
            return Err(GgufTokenizerError::Merge {
                index,
                merge: merge.clone(),
            });
        }
        // A merge of or into text outside the vocabulary can never yield a token id: skip
        // it (llama.cpp keeps it and spells the result in bytes). The first rank of a
        // repeated pair wins, as llama.cpp's `emplace`.
        let merged = format!("{left}{right}");
        if !vocab.contains_key(left) || !vocab.contains_key(right) || !vocab.contains_key(&merged) {
            continue;
        }
        if seen.insert((left, right)) {
            merges.push((left.to_string(), right.to_string()));
        }
    }

    let mut bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(pre.ignore_merges);
    if let Some(unk) = spec.unk_id {
        bpe = bpe.unk_token(spec.tokens[unk as usize].clone());
    }
    let bpe = bpe.build().map_err(build_err("tokenizer.ggml.merges"))?;

    let mut pre_tokenizers: Vec<PreTokenizerWrapper> = Vec::new();
    for regex in pre.regexes {
        let split = Split::new(
            SplitPattern::Regex(regex),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(build_err("tokenizer.ggml.pre"))?;
        pre_tokenizers.push(split.into());
    }
    pre_tokenizers.push(ByteLevel::new(false, true, false).into());

    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(PreTokenizerSequence::new(pre_tokenizers)));
    tokenizer.with_decoder(Some(ByteLevel::new(false, true, false)));
    Ok(tokenizer)
}

/// Control and unknown tokens as special added tokens, user-defined ones as plain added
/// tokens; all matched on the raw text, as llama.cpp's `tokenizer_st_partition`.
fn add_special_tokens(tokenizer: &mut Tokenizer, spec: &TokenizerSpec) -> Result<()> {
    let mut special = Vec::new();
    let mut user = Vec::new();
    for (id, text) in spec.tokens.iter().enumerate() {
        match spec.token_type(id) {
            token_type::CONTROL | token_type::UNKNOWN => {
                special.push(AddedToken::from(text.clone(), true).normalized(false))
            }
            token_type::USER_DEFINED => {
                user.push(AddedToken::from(text.clone(), false).normalized(false))
            }
            _ => {}
        }
    }
    tokenizer
        .add_special_tokens(special)
        .map_err(build_err("tokenizer.ggml.token_type"))?;
    tokenizer
        .add_tokens(user)
        .map_err(build_err("tokenizer.ggml.token_type"))?;
    Ok(())
}

/// `bos $A eos` (and `bos $A eos bos $B:1 eos` for pairs) as `add_bos` / `add_eos` say.
fn post_processor(spec: &TokenizerSpec) -> Result<Option<TemplateProcessing>> {
    const KEY: &str = "tokenizer.ggml.add_bos_token";
    // BOS wanted by llama.cpp's default but absent from the file: none is added.
    let bos = match (spec.add_bos_token(), spec.bos_token_id()) {
        (true, Some(id)) => Some(id),
        (true, None) if spec.add_bos.is_some() => {
            return Err(GgufTokenizerError::NoTokenToAdd {
                key: KEY,
                id_key: "tokenizer.ggml.bos_token_id",
            })
        }
        _ => None,
    };
    let eos = match (spec.add_eos.unwrap_or(false), spec.eos_token_id()) {
        (true, Some(id)) => Some(id),
        (true, None) => {
            return Err(GgufTokenizerError::NoTokenToAdd {
                key: "tokenizer.ggml.add_eos_token",
                id_key: "tokenizer.ggml.eos_token_id",
            })
        }
        _ => None,
    };
    if bos.is_none() && eos.is_none() {
        return Ok(None);
    }
    let mut specials = Vec::new();
    for (name, id) in [("bos", bos), ("eos", eos)] {
        if let Some(id) = id {
            let text = spec.tokens[id as usize].clone();
            specials.push(
                SpecialToken::new(name.into(), vec![id], vec![text]).map_err(build_err(KEY))?,
            );
        }
    }
    let seq = |s: &str| -> Vec<String> {
        bos.map(|_| "bos".to_string())
            .into_iter()
            .chain(std::iter::once(s.to_string()))
            .chain(eos.map(|_| "eos".to_string()))
            .collect()
    };
    let single = seq("$A");
    let mut pair = single.clone();
    pair.extend(seq("$B:1"));
    let err = |detail: String| GgufTokenizerError::Build { key: KEY, detail };
    TemplateProcessing::builder()
        .try_single(single)
        .map_err(err)?
        .try_pair(pair)
        .map_err(err)?
        .special_tokens(specials)
        .build()
        .map(Some)
        .map_err(|e| err(e.to_string()))
}
