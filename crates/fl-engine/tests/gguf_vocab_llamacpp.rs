//! The GGUF tokenizer against llama.cpp's own tokenizer tests: llama.cpp ships vocabulary-only
//! GGUF files (`models/ggml-vocab-*.gguf`) with a text corpus (`.gguf.inp`: texts separated by
//! `\n__ggml_vocab_test__\n`) and the ids its tokenizer gives for each text (`.gguf.out`, one
//! line per text; tokenised without BOS / EOS, special tokens not parsed: its
//! test-tokenizer-0). These files are not part of this repository: set `FL_LLAMA_VOCAB_DIR` to
//! a llama.cpp `models/` folder (the llama-cpp-python source distribution carries one under
//! `vendor/llama.cpp/models`). Without it the test prints a notice and passes.
//!
//! The two vocabularies must agree on every text: SentencePiece LLaMA (`llama-spm`)
//! and byte-level BPE LLaMA-3 (`llama-bpe`). Every other `ggml-vocab-*` file with a corpus is
//! also run and its agreement printed.

use std::path::{Path, PathBuf};

use fl_engine::gguf::tokenizer::build;
use fl_engine::gguf::GgufFile;

/// The texts of a `.inp` file and the ids of its `.out` file, paired.
fn corpus(gguf: &Path) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(gguf.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(gguf.with_extension("gguf.out")).unwrap();
    let mut texts: Vec<String> = inp
        .split("\n__ggml_vocab_test__\n")
        .map(str::to_string)
        .collect();
    if texts.last().is_some_and(|t| t.is_empty()) {
        texts.pop(); // the file ends with a separator
    }
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(
        texts.len(),
        ids.len(),
        "{}: texts and id lines",
        gguf.display()
    );
    texts.into_iter().zip(ids).collect()
}

/// (texts that agree, all texts, the first disagreement) for one vocabulary file.
fn agreement(gguf: &Path) -> Result<(usize, usize, Option<String>), String> {
    let f = GgufFile::open(gguf).map_err(|e| format!("open: {e}"))?;
    let spec = f.tokenizer_spec().map_err(|e| format!("spec: {e}"))?;
    let tok = build(&spec).map_err(|e| format!("build: {e}"))?;
    let cases = corpus(gguf);
    let (mut ok, mut first) = (0, None);
    for (text, want) in &cases {
        let got = tok
            .encode(text.as_str(), false)
            .map_err(|e| format!("encode {text:?}: {e}"))?;
        if got.get_ids() == want.as_slice() {
            ok += 1;
        } else if first.is_none() {
            first = Some(format!(
                "{text:?}: got {:?}, llama.cpp {want:?}",
                got.get_ids()
            ));
        }
    }
    Ok((ok, cases.len(), first))
}

#[test]
fn tokenizer_ids_equal_llama_cpp_on_its_vocab_corpora() {
    let Some(dir) = std::env::var_os("FL_LLAMA_VOCAB_DIR").map(PathBuf::from) else {
        eprintln!(
            "skip tokenizer_ids_equal_llama_cpp_on_its_vocab_corpora: FL_LLAMA_VOCAB_DIR is not set"
        );
        return;
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("FL_LLAMA_VOCAB_DIR {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            name.starts_with("ggml-vocab-")
                && name.ends_with(".gguf")
                && p.with_extension("gguf.inp").exists()
                && p.with_extension("gguf.out").exists()
        })
        .collect();
    files.sort();
    let mut failures = vec![];
    for required in ["ggml-vocab-llama-spm.gguf", "ggml-vocab-llama-bpe.gguf"] {
        assert!(
            files.iter().any(|p| p.ends_with(required)),
            "{required} (with .inp / .out) not in {}",
            dir.display()
        );
    }
    for p in &files {
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        let required = name == "ggml-vocab-llama-spm.gguf" || name == "ggml-vocab-llama-bpe.gguf";
        match agreement(p) {
            Ok((ok, all, first)) => {
                eprintln!(
                    "{name}: {ok} of {all} texts identical{}",
                    first
                        .as_deref()
                        .map_or(String::new(), |f| format!("; first difference {f}"))
                );
                if required && ok != all {
                    failures.push(format!("{name}: {ok} of {all}; {}", first.unwrap()));
                }
            }
            Err(e) => {
                eprintln!("{name}: not taken: {e}");
                if required {
                    failures.push(format!("{name}: {e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
