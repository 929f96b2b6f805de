//! The GGUF tokenizer on small synthetic vocabularies: a SentencePiece (`llama`) one with
//! scores and byte fallback, and a byte-level BPE (`gpt2`) one with merges. Expected ids are
//! worked out by hand from llama.cpp's algorithms (see each test).

use fl_engine::gguf::tokenizer::{build, token_type, GgufTokenizerError, TokenizerSpec};
use proptest::prelude::*;

/// ids 0..3 `<unk> <s> </s>`, 3..259 `<0x00>`..`<0xFF>`, then the words of "hello world",
/// and `<tool>` (user-defined) last.
const SPM_WORDS: &[(&str, f32)] = &[
    ("▁", -1.0),       // 259
    ("h", -2.0),       // 260
    ("e", -3.0),       // 261
    ("l", -4.0),       // 262
    ("o", -5.0),       // 263
    ("w", -6.0),       // 264
    ("r", -7.0),       // 265
    ("d", -8.0),       // 266
    ("ll", -9.0),      // 267
    ("▁h", -10.0),     // 268
    ("▁he", -11.0),    // 269
    ("llo", -12.0),    // 270
    ("▁hello", -13.0), // 271
    ("or", -14.0),     // 272
    ("▁w", -15.0),     // 273
    ("▁wor", -16.0),   // 274
    ("ld", -17.0),     // 275
    ("▁world", -18.0), // 276
];
const HELLO: u32 = 271;
const WORLD: u32 = 276;
const TOOL: u32 = 277;

fn byte_id(b: u8) -> u32 {
    3 + b as u32
}

fn spm_spec() -> TokenizerSpec {
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    let mut scores = vec![0.0, 0.0, 0.0];
    let mut types = vec![
        token_type::UNKNOWN,
        token_type::CONTROL,
        token_type::CONTROL,
    ];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        scores.push(0.0);
        types.push(token_type::BYTE);
    }
    for (t, s) in SPM_WORDS {
        tokens.push(t.to_string());
        scores.push(*s);
        types.push(token_type::NORMAL);
    }
    tokens.push("<tool>".into());
    scores.push(0.0);
    types.push(token_type::USER_DEFINED);
    TokenizerSpec {
        model: "llama".into(),
        tokens,
        scores: Some(scores),
        token_types: Some(types),
        bos_id: Some(1),
        eos_id: Some(2),
        unk_id: Some(0),
        add_bos: Some(true),
        chat_template: Some("{{ messages }}".into()),
        ..Default::default()
    }
}

fn ids(tok: &tokenizers::Tokenizer, text: &str, add_special: bool) -> Vec<u32> {
    tok.encode(text, add_special).unwrap().get_ids().to_vec()
}

#[test]
fn spm_merges_by_score() {
    // "▁hello▁world": ll(-9) > ▁h(-10) > ▁he(-11) > llo(-12) > ▁hello(-13) > or > ▁w > ▁wor
    // > ld > ▁world, each the best pair present when it is merged.
    let tok = build(&spm_spec()).unwrap();
    assert_eq!(ids(&tok, "hello world", false), vec![HELLO, WORLD]);
    assert_eq!(ids(&tok, "hello world", true), vec![1, HELLO, WORLD]);
    assert_eq!(tok.decode(&[1, HELLO, WORLD], true).unwrap(), "hello world");
    // A leading space is kept: "▁▁hello".
    assert_eq!(ids(&tok, " hello", false), vec![259, HELLO]);
    assert_eq!(tok.decode(&[259, HELLO], true).unwrap(), " hello");
    assert_eq!(ids(&tok, "", false), Vec::<u32>::new());
}

#[test]
fn spm_higher_score_wins_the_overlap() {
    // "abc" with "ab" and "bc" both tokens: the higher-scored merge is taken first.
    let spec = |ab: f32, bc: f32| TokenizerSpec {
        model: "llama".into(),
        tokens: ["<unk>", "a", "b", "c", "ab", "bc"]
            .map(String::from)
            .to_vec(),
        scores: Some(vec![0.0, -1.0, -1.0, -1.0, ab, bc]),
        add_space_prefix: Some(false),
        add_bos: Some(false),
        ..Default::default()
    };
    let tok = build(&spec(-2.0, -3.0)).unwrap();
    assert_eq!(ids(&tok, "abc", true), vec![4, 3]);
    let tok = build(&spec(-3.0, -2.0)).unwrap();
    assert_eq!(ids(&tok, "abc", true), vec![1, 5]);
    assert_eq!(tok.decode(&[1, 5], true).unwrap(), "abc");
}

#[test]
fn spm_byte_fallback() {
    let tok = build(&spm_spec()).unwrap();
    // 'é' (C3 A9) is no token: its UTF-8 bytes are.
    let got = ids(&tok, "hé", false);
    assert_eq!(got, vec![268, byte_id(0xC3), byte_id(0xA9)]);
    assert_eq!(tok.decode(&got, true).unwrap(), "hé");
    let got = ids(&tok, "🦙\n", false);
    assert_eq!(
        got,
        vec![
            259,
            byte_id(0xF0),
            byte_id(0x9F),
            byte_id(0xA6),
            byte_id(0x99),
            byte_id(b'\n')
        ]
    );
    assert_eq!(tok.decode(&got, true).unwrap(), "🦙\n");
}

#[test]
fn spm_special_and_user_defined_tokens() {
    let mut tok = build(&spm_spec()).unwrap();
    // Control tokens are matched in text; the text after one gets its own space prefix,
    // as llama.cpp's SPM session does.
    assert_eq!(ids(&tok, "<s>hello</s>", false), vec![1, HELLO, 2]);
    assert_eq!(tok.decode(&[1, HELLO, 2], true).unwrap(), "hello");
    assert_eq!(tok.decode(&[1, HELLO, 2], false).unwrap(), "<s> hello</s>");
    // User-defined tokens are matched, and stay in decoded text.
    assert_eq!(
        ids(&tok, "hello<tool>world", false),
        vec![HELLO, TOOL, WORLD]
    );
    assert_eq!(
        tok.decode(&[HELLO, TOOL, WORLD], true).unwrap(),
        "hello<tool> world"
    );
    // llama.cpp's parse_special = false: control text is plain text, user-defined still
    // matched.
    tok.set_encode_special_tokens(true);
    let got = ids(&tok, "<s>hello", false);
    assert!(!got.contains(&1), "{got:?}");
    assert_eq!(tok.decode(&got, true).unwrap(), "<s>hello");
    assert_eq!(
        ids(&tok, "hello<tool>world", false),
        vec![HELLO, TOOL, WORLD]
    );
}

#[test]
fn spm_add_bos_add_eos_and_stop_ids() {
    let spec = spm_spec();
    assert!(spec.add_bos_token());
    assert_eq!(spec.stop_ids(), vec![2]);
    let tok = build(&TokenizerSpec {
        add_bos: Some(false),
        ..spec.clone()
    })
    .unwrap();
    assert_eq!(ids(&tok, "hello", true), vec![HELLO]);
    let tok = build(&TokenizerSpec {
        add_eos: Some(true),
        eot_id: Some(HELLO),
        ..spec.clone()
    })
    .unwrap();
    assert_eq!(ids(&tok, "hello", true), vec![1, HELLO, 2]);
    assert_eq!(ids(&tok, "hello", false), vec![HELLO]);
    // llama.cpp's defaults for a llama model: add BOS, BOS 1, EOS 2.
    let defaults = TokenizerSpec {
        add_bos: None,
        bos_id: None,
        eos_id: None,
        eot_id: Some(3),
        ..spec
    };
    assert!(defaults.add_bos_token());
    assert_eq!(defaults.bos_token_id(), Some(1));
    assert_eq!(defaults.stop_ids(), vec![2, 3]);
    let tok = build(&defaults).unwrap();
    assert_eq!(ids(&tok, "hello", true), vec![1, HELLO]);
}

#[test]
fn spm_without_space_prefix() {
    let tok = build(&TokenizerSpec {
        add_space_prefix: Some(false),
        ..spm_spec()
    })
    .unwrap();
    // "hello" alone: h e ll o -> no "▁": llo merges, "he" is no token.
    assert_eq!(ids(&tok, "hello", false), vec![260, 261, 270]);
    assert_eq!(ids(&tok, " hello", false), vec![HELLO]);
    assert_eq!(tok.decode(&[HELLO], true).unwrap(), " hello");
}

/// GPT-2's byte -> printable character map.
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut extra = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + extra);
            extra += 1;
        }
    }
    let mut map = vec!['\0'; 256];
    for (b, c) in printable.into_iter().zip(chars) {
        map[b as usize] = char::from_u32(c).unwrap();
    }
    map
}

const BPE_MERGES: &[&str] = &[
    "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "3 4",
];
const BPE_HELLO: u32 = 259;
const BPE_WORLD: u32 = 264;
const BPE_34: u32 = 265;
const BPE_EOT: u32 = 266;
const BPE_TOOL: u32 = 267;

/// ids 0..256 the byte characters (id = byte), then the merge results in order, then
/// `<|endoftext|>` (control) and `<|tool|>` (user-defined).
fn bpe_spec(pre: &str) -> TokenizerSpec {
    let mut tokens: Vec<String> = byte_chars().iter().map(|c| c.to_string()).collect();
    for m in BPE_MERGES {
        tokens.push(m.replace(' ', ""));
    }
    tokens.push("<|endoftext|>".into());
    tokens.push("<|tool|>".into());
    let mut types = vec![token_type::NORMAL; tokens.len()];
    types[BPE_EOT as usize] = token_type::CONTROL;
    types[BPE_TOOL as usize] = token_type::USER_DEFINED;
    TokenizerSpec {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens,
        token_types: Some(types),
        merges: Some(BPE_MERGES.iter().map(|m| m.to_string()).collect()),
        bos_id: Some(BPE_EOT),
        eos_id: Some(BPE_EOT),
        ..Default::default()
    }
}

#[test]
fn bpe_merges_by_rank() {
    // "hello" | " world": h e -> he, l l -> ll, he ll -> hell, hell o -> hello;
    // Ġ w, o r, Ġw or, l d, Ġwor ld.
    let spec = bpe_spec("gpt-2");
    assert!(!spec.add_bos_token());
    let tok = build(&spec).unwrap();
    assert_eq!(ids(&tok, "hello world", true), vec![BPE_HELLO, BPE_WORLD]);
    assert_eq!(
        tok.decode(&[BPE_HELLO, BPE_WORLD], true).unwrap(),
        "hello world"
    );
    // Bytes of characters no merge covers.
    assert_eq!(ids(&tok, "é!", false), vec![0xC3, 0xA9, b'!' as u32]);
    assert_eq!(tok.decode(&[0xC3, 0xA9], true).unwrap(), "é");
}

#[test]
fn bpe_pre_tokenizer_selects_the_split() {
    // GPT-2 keeps "12345" one piece (" ?\p{N}+"), so "3 4" merges; llama3 splits digits in
    // threes ("123" | "45"), so it cannot.
    let tok = build(&bpe_spec("gpt-2")).unwrap();
    assert_eq!(ids(&tok, "12345", false), vec![49, 50, BPE_34, 53]);
    let tok = build(&bpe_spec("llama-bpe")).unwrap();
    assert_eq!(ids(&tok, "12345", false), vec![49, 50, 51, 52, 53]);
    // qwen2 splits every digit.
    let tok = build(&bpe_spec("qwen2")).unwrap();
    assert_eq!(ids(&tok, "34", false), vec![51, 52]);
    // An absent pre-tokenizer is llama.cpp's "default".
    let tok = build(&TokenizerSpec {
        pre: None,
        ..bpe_spec("x")
    })
    .unwrap();
    assert_eq!(ids(&tok, "hello world", false), vec![BPE_HELLO, BPE_WORLD]);
}

#[test]
fn bpe_special_tokens_and_bos() {
    let mut tok = build(&bpe_spec("llama-bpe")).unwrap();
    // llama3's default adds BOS.
    assert_eq!(
        ids(&tok, "hello<|endoftext|>", true),
        vec![BPE_EOT, BPE_HELLO, BPE_EOT]
    );
    assert_eq!(
        ids(&tok, "hello<|tool|> world", false),
        vec![BPE_HELLO, BPE_TOOL, BPE_WORLD]
    );
    assert_eq!(
        tok.decode(&[BPE_EOT, BPE_HELLO, BPE_TOOL, BPE_WORLD], true)
            .unwrap(),
        "hello<|tool|> world"
    );
    tok.set_encode_special_tokens(true);
    let got = ids(&tok, "<|endoftext|>", false);
    assert!(!got.contains(&BPE_EOT), "{got:?}");
    assert_eq!(tok.decode(&got, true).unwrap(), "<|endoftext|>");
    // No BOS token and no add_bos key: nothing is added.
    let tok = build(&TokenizerSpec {
        bos_id: None,
        ..bpe_spec("llama-bpe")
    })
    .unwrap();
    assert_eq!(ids(&tok, "hello", true), vec![BPE_HELLO]);
}

#[test]
fn bad_specs_name_the_key() {
    let check = |spec: TokenizerSpec, key: &str| {
        let err = build(&spec).err().unwrap_or_else(|| panic!("{key}: built"));
        assert!(err.to_string().contains(key), "{err} does not name {key}");
        err
    };
    let err = check(
        TokenizerSpec {
            merges: None,
            ..bpe_spec("gpt-2")
        },
        "tokenizer.ggml.merges",
    );
    assert!(matches!(err, GgufTokenizerError::Missing { .. }));
    let mut spec = spm_spec();
    spec.scores.as_mut().unwrap().pop();
    let err = check(spec, "tokenizer.ggml.scores");
    assert!(matches!(
        err,
        GgufTokenizerError::Length {
            expected: 278,
            got: 277,
            ..
        }
    ));
    let mut spec = bpe_spec("gpt-2");
    spec.token_types.as_mut().unwrap().push(1);
    check(spec, "tokenizer.ggml.token_type");
    check(
        TokenizerSpec {
            pre: Some("no-such-pre".into()),
            ..bpe_spec("gpt-2")
        },
        "tokenizer.ggml.pre",
    );
    check(
        TokenizerSpec {
            model: "bert".into(),
            ..spm_spec()
        },
        "tokenizer.ggml.model",
    );
    check(
        TokenizerSpec {
            tokens: Vec::new(),
            scores: None,
            token_types: None,
            ..spm_spec()
        },
        "tokenizer.ggml.tokens",
    );
    check(
        TokenizerSpec {
            eos_id: Some(100_000),
            ..spm_spec()
        },
        "tokenizer.ggml.eos_token_id",
    );
    let mut spec = bpe_spec("gpt-2");
    spec.merges.as_mut().unwrap()[3] = "hello".into();
    let err = check(spec, "tokenizer.ggml.merges[3]");
    assert!(matches!(err, GgufTokenizerError::Merge { index: 3, .. }));
    check(
        TokenizerSpec {
            bos_id: None,
            add_bos: Some(true),
            ..bpe_spec("gpt-2")
        },
        "tokenizer.ggml.bos_token_id",
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn spm_round_trips(text in proptest::collection::vec(any::<char>(), 0..40)) {
        // '▁' is SentencePiece's space: it decodes as one, so it cannot round-trip.
        let text: String = text.into_iter().filter(|&c| c != '▁').collect();
        let mut tok = build(&spm_spec()).unwrap();
        tok.set_encode_special_tokens(true);
        let got = ids(&tok, &text, true);
        prop_assert_eq!(got.first(), Some(&1));
        prop_assert!(!got.contains(&0), "unk in {:?}", got);
        prop_assert_eq!(tok.decode(&got, true).unwrap(), text);
    }

    #[test]
    fn bpe_round_trips(text in proptest::collection::vec(any::<char>(), 0..40)) {
        let text: String = text.into_iter().collect();
        for pre in ["gpt-2", "llama-bpe", "qwen2", "default"] {
            let mut tok = build(&bpe_spec(pre)).unwrap();
            tok.set_encode_special_tokens(true);
            let got = ids(&tok, &text, false);
            prop_assert_eq!(tok.decode(&got, true).unwrap(), text.clone());
        }
    }
}

#[test]
fn token_bytes_of_spm_and_byte_level_vocabularies() {
    // What a token stands for on its own (logprobs' `token` / `bytes`): SentencePiece keeps
    // the word's leading space and byte-fallback pieces are their byte; byte-level BPE maps
    // GPT-2's alphabet back to bytes (all 256 of them); special tokens read as their text.
    use fl_engine::tokenizer::Tokenizer;
    let spm = Tokenizer::from_tokenizers(build(&spm_spec()).unwrap(), "spm".into());
    assert_eq!(spm.token_bytes(HELLO).as_deref(), Some(&b" hello"[..]));
    assert_eq!(spm.token_bytes(byte_id(0xE2)), Some(vec![0xE2]));
    assert_eq!(spm.token_bytes(1).as_deref(), Some(&b"<s>"[..]));
    assert_eq!(spm.token_bytes(TOOL + 1), None);
    let bpe = Tokenizer::from_tokenizers(build(&bpe_spec("gpt-2")).unwrap(), "bpe".into());
    for b in 0..=255u8 {
        assert_eq!(bpe.token_bytes(b as u32), Some(vec![b]), "byte {b}");
    }
    assert_eq!(bpe.token_bytes(BPE_WORLD).as_deref(), Some(&b" world"[..]));
    assert_eq!(
        bpe.token_bytes(BPE_EOT).as_deref(),
        Some(&b"<|endoftext|>"[..])
    );
}
