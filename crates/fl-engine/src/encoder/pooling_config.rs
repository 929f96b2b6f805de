//! [`PoolingConfig`]: how one embedding is taken from an encoder's last hidden states, as a
//! model directory's sentence-transformers files ask for it.
//!
//! A sentence-transformers model lists its modules in `modules.json`: the `Transformer`, then
//! a `Pooling` module whose `config.json` (usually `1_Pooling/config.json`) sets one of
//! `pooling_mode_cls_token` / `pooling_mode_mean_tokens` / `pooling_mode_lasttoken`, then
//! optionally `Normalize` (L2). [`PoolingConfig::from_sentence_transformers`] reads exactly
//! that; a model without `modules.json` gets [`PoolingConfig::default`] (CLS, normalised: the
//! BGE recipe). `sentence_bert_config.json`'s `max_seq_length`
//! ([`sentence_transformers_max_len`]) is the length sentence-transformers truncates to,
//! often shorter than the position table (all-MiniLM-L6-v2: 256 of 512).
//!
//! ```no_run
//! use fl_engine::encoder::pooling_config::PoolingConfig;
//! use fl_engine::encoder::Pooling;
//! // Flags not given: the model directory decides.
//! let p = PoolingConfig::resolve("models/all-MiniLM-L6-v2", None, None)?;
//! assert_eq!((p.pooling, p.normalize), (Pooling::Mean, true));
//! // Both given: the directory is not read.
//! let p = PoolingConfig::resolve("models/x", Some(Pooling::Cls), Some(false))?;
//! assert!(!p.normalize);
//! # Ok::<(), fl_engine::EngineError>(())
//! ```

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::encoder::batch::Pooling;
use crate::error::{EngineError, Result};

/// Pooling and L2 normalisation of an embedding model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolingConfig {
    /// Which tokens make the vector.
    pub pooling: Pooling,
    /// Whether each vector is divided by its L2 norm.
    pub normalize: bool,
}

impl Default for PoolingConfig {
    /// CLS pooling, normalised: what BGE and E5-style retrieval models without
    /// sentence-transformers files expect.
    fn default() -> Self {
        PoolingConfig {
            pooling: Pooling::Cls,
            normalize: true,
        }
    }
}

fn file_err(path: &Path, detail: impl Into<String>) -> EngineError {
    EngineError::File {
        path: path.to_path_buf(),
        detail: detail.into(),
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| file_err(path, e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| file_err(path, format!("not JSON: {e}")))
}

/// The module kind of a `modules.json` `type` (`sentence_transformers.models.Pooling` ->
/// `Pooling`).
fn module_kind(ty: &str) -> &str {
    ty.rsplit('.').next().unwrap_or(ty)
}

impl PoolingConfig {
    /// The pooling `dir`'s sentence-transformers files ask for; `Ok(None)` when `dir` has no
    /// `modules.json`.
    ///
    /// # Errors
    /// [`EngineError::File`] naming the file and field: unreadable or malformed JSON, no
    /// `Pooling` module, a module other than `Transformer` / `Pooling` / `Normalize` (a
    /// `Dense` projection, ...: the embedding would not be the model's), a pooling mode we do
    /// not compute (`max`, `mean_sqrt_len`, `weightedmean`) or several modes at once
    /// (sentence-transformers concatenates them).
    pub fn from_sentence_transformers(dir: impl AsRef<Path>) -> Result<Option<Self>> {
        let dir = dir.as_ref();
        let path = dir.join("modules.json");
        if !path.is_file() {
            return Ok(None);
        }
        let modules = read_json(&path)?;
        let list = modules
            .as_array()
            .ok_or_else(|| file_err(&path, "expected a list of modules"))?;
        let mut pooling_dir: Option<PathBuf> = None;
        let mut normalize = false;
        for (i, m) in list.iter().enumerate() {
            let ty = m
                .get("type")
                .and_then(Value::as_str)
                .ok_or_else(|| file_err(&path, format!("module {i}: no string `type`")))?;
            match module_kind(ty) {
                "Transformer" => {}
                "Pooling" => {
                    let sub = m.get("path").and_then(Value::as_str).unwrap_or("1_Pooling");
                    pooling_dir = Some(dir.join(sub));
                }
                "Normalize" => normalize = true,
                _ => {
                    return Err(file_err(
                        &path,
                        format!(
                            "module {i} is `{ty}`: only Transformer, Pooling and Normalize are \
                             computed; give the pooling and normalisation explicitly to use \
                             the model without it"
                        ),
                    ))
                }
            }
        }
        let pooling_dir = pooling_dir.ok_or_else(|| {
            file_err(
                &path,
                "has no Pooling module (the model's output would be per-token states)",
            )
        })?;
        let pooling = pooling_mode(&pooling_dir.join("config.json"))?;
        Ok(Some(PoolingConfig { pooling, normalize }))
    }

    /// `pooling` and `normalize` where given; what is not given comes from
    /// [`from_sentence_transformers`](Self::from_sentence_transformers), else
    /// [`PoolingConfig::default`]. `dir` is read only when one of them is `None`.
    ///
    /// # Errors
    /// Those of [`from_sentence_transformers`](Self::from_sentence_transformers).
    pub fn resolve(
        dir: impl AsRef<Path>,
        pooling: Option<Pooling>,
        normalize: Option<bool>,
    ) -> Result<Self> {
        let base = match (pooling, normalize) {
            (Some(_), Some(_)) => PoolingConfig::default(),
            _ => Self::from_sentence_transformers(dir)?.unwrap_or_default(),
        };
        Ok(base.overridden(pooling, normalize))
    }

    /// `self` with the given flags in place of its own (`None` keeps the field).
    pub fn overridden(self, pooling: Option<Pooling>, normalize: Option<bool>) -> Self {
        PoolingConfig {
            pooling: pooling.unwrap_or(self.pooling),
            normalize: normalize.unwrap_or(self.normalize),
        }
    }
}

/// The one pooling mode a sentence-transformers `Pooling` `config.json` sets: the booleans
/// `pooling_mode_*`, or (newer files) a `pooling_mode` string.
fn pooling_mode(path: &Path) -> Result<Pooling> {
    let v = read_json(path)?;
    let obj = v
        .as_object()
        .ok_or_else(|| file_err(path, "expected a JSON object"))?;
    if let Some(mode) = obj.get("pooling_mode").filter(|m| !m.is_null()) {
        return match mode.as_str() {
            Some("cls") => Ok(Pooling::Cls),
            Some("mean") => Ok(Pooling::Mean),
            Some("lasttoken") => Ok(Pooling::LastToken),
            _ => Err(file_err(
                path,
                format!("pooling_mode {mode} is not computed (cls, mean and lasttoken are)"),
            )),
        };
    }
    const MODES: [(&str, Option<Pooling>); 6] = [
        ("pooling_mode_cls_token", Some(Pooling::Cls)),
        ("pooling_mode_mean_tokens", Some(Pooling::Mean)),
        ("pooling_mode_lasttoken", Some(Pooling::LastToken)),
        ("pooling_mode_max_tokens", None),
        ("pooling_mode_mean_sqrt_len_tokens", None),
        ("pooling_mode_weightedmean_tokens", None),
    ];
    let mut set = Vec::new();
    for (field, pooling) in MODES {
        let on = match obj.get(field) {
            None | Some(Value::Null) | Some(Value::Bool(false)) => false,
            Some(Value::Bool(true)) => true,
            Some(other) => {
                return Err(file_err(
                    path,
                    format!("{field}: expected true or false, got {other}"),
                ))
            }
        };
        if on {
            let p = pooling.ok_or_else(|| {
                file_err(
                    path,
                    format!("{field} is not computed (cls, mean and lasttoken pooling are)"),
                )
            })?;
            set.push((field, p));
        }
    }
    match set.as_slice() {
        [(_, p)] => Ok(*p),
        [] => Err(file_err(path, "sets no pooling_mode_* to true")),
        several => Err(file_err(
            path,
            format!(
                "sets {} pooling modes ({}); one is computed, not their concatenation",
                several.len(),
                several.iter().map(|s| s.0).collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}

/// `max_seq_length` of `dir`'s `sentence_bert_config.json`: the token count
/// sentence-transformers truncates inputs to; `Ok(None)` without the file or the field.
///
/// # Errors
/// [`EngineError::File`] naming the file: unreadable, not JSON, or `max_seq_length` not a
/// positive integer.
pub fn sentence_transformers_max_len(dir: impl AsRef<Path>) -> Result<Option<usize>> {
    let path = dir.as_ref().join("sentence_bert_config.json");
    if !path.is_file() {
        return Ok(None);
    }
    match read_json(&path)?.get("max_seq_length") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|&n| n > 0)
            .map(|n| Some(n as usize))
            .ok_or_else(|| {
                file_err(
                    &path,
                    format!("max_seq_length: expected a positive integer, got {v}"),
                )
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn st_dir(modules: Value, pooling: Option<Value>) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("modules.json"), modules.to_string()).unwrap();
        if let Some(p) = pooling {
            std::fs::create_dir(d.path().join("1_Pooling")).unwrap();
            std::fs::write(d.path().join("1_Pooling/config.json"), p.to_string()).unwrap();
        }
        d
    }

    fn modules(normalize: bool) -> Value {
        let mut m = vec![
            json!({"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}),
            json!({"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}),
        ];
        if normalize {
            m.push(json!({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}));
        }
        Value::Array(m)
    }

    fn modes(on: &[&str]) -> Value {
        let mut v = json!({
            "word_embedding_dimension": 384, "pooling_mode_cls_token": false,
            "pooling_mode_mean_tokens": false, "pooling_mode_max_tokens": false,
            "pooling_mode_mean_sqrt_len_tokens": false, "pooling_mode_weightedmean_tokens": false,
            "pooling_mode_lasttoken": false, "include_prompt": true
        });
        for k in on {
            v[*k] = json!(true);
        }
        v
    }

    #[test]
    fn reads_each_mode_and_normalize() {
        for (field, want) in [
            ("pooling_mode_cls_token", Pooling::Cls),
            ("pooling_mode_mean_tokens", Pooling::Mean),
            ("pooling_mode_lasttoken", Pooling::LastToken),
        ] {
            for normalize in [false, true] {
                let d = st_dir(modules(normalize), Some(modes(&[field])));
                let got = PoolingConfig::from_sentence_transformers(d.path()).unwrap();
                assert_eq!(
                    got,
                    Some(PoolingConfig {
                        pooling: want,
                        normalize
                    })
                );
            }
        }
        let d = st_dir(modules(false), Some(json!({"pooling_mode": "lasttoken"})));
        let got = PoolingConfig::from_sentence_transformers(d.path()).unwrap();
        assert_eq!(got.map(|p| p.pooling), Some(Pooling::LastToken));
    }

    #[test]
    fn no_modules_json_means_the_default() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(
            PoolingConfig::from_sentence_transformers(d.path()).unwrap(),
            None
        );
        let p = PoolingConfig::resolve(d.path(), None, None).unwrap();
        assert_eq!(p, PoolingConfig::default());
        assert_eq!((p.pooling, p.normalize), (Pooling::Cls, true));
        let p = PoolingConfig::resolve(d.path(), Some(Pooling::Mean), None).unwrap();
        assert_eq!((p.pooling, p.normalize), (Pooling::Mean, true));
    }

    #[test]
    fn flags_override_the_files() {
        let d = st_dir(modules(true), Some(modes(&["pooling_mode_mean_tokens"])));
        let p = PoolingConfig::resolve(d.path(), None, Some(false)).unwrap();
        assert_eq!((p.pooling, p.normalize), (Pooling::Mean, false));
        let p = PoolingConfig::resolve(d.path(), Some(Pooling::LastToken), None).unwrap();
        assert_eq!((p.pooling, p.normalize), (Pooling::LastToken, true));
        // Both given: a broken directory is never read.
        let bad = st_dir(json!("not a list"), None);
        let p = PoolingConfig::resolve(bad.path(), Some(Pooling::Cls), Some(false)).unwrap();
        assert_eq!((p.pooling, p.normalize), (Pooling::Cls, false));
        assert!(PoolingConfig::resolve(bad.path(), None, Some(false)).is_err());
    }

    #[test]
    fn errors_name_the_file_and_field() {
        let dense = {
            let mut m = modules(false);
            m.as_array_mut()
                .unwrap()
                .push(json!({"idx": 2, "name": "2", "path": "2_Dense",
                "type": "sentence_transformers.models.Dense"}));
            m
        };
        let cases = [
            (
                st_dir(modules(false), Some(modes(&["pooling_mode_max_tokens"]))),
                "pooling_mode_max_tokens",
            ),
            (
                st_dir(
                    modules(false),
                    Some(modes(&[
                        "pooling_mode_cls_token",
                        "pooling_mode_mean_tokens",
                    ])),
                ),
                "2 pooling modes",
            ),
            (st_dir(modules(false), Some(modes(&[]))), "no pooling_mode"),
            (
                st_dir(
                    modules(false),
                    Some(json!({"pooling_mode_cls_token": "yes"})),
                ),
                "pooling_mode_cls_token: expected true or false",
            ),
            (
                st_dir(dense, Some(modes(&["pooling_mode_cls_token"]))),
                "sentence_transformers.models.Dense",
            ),
            (
                st_dir(Value::Array(vec![modules(false)[0].clone()]), None),
                "no Pooling module",
            ),
            (st_dir(json!([{"idx": 0}]), None), "no string `type`"),
            (st_dir(modules(false), None), "1_Pooling"),
        ];
        for (d, want) in cases {
            let e = PoolingConfig::from_sentence_transformers(d.path())
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{e} (wanted {want})");
            assert!(e.contains(".json"), "names the file: {e}");
        }
    }

    #[test]
    fn max_seq_length() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(sentence_transformers_max_len(d.path()).unwrap(), None);
        let f = d.path().join("sentence_bert_config.json");
        std::fs::write(&f, r#"{"max_seq_length": 256, "do_lower_case": false}"#).unwrap();
        assert_eq!(sentence_transformers_max_len(d.path()).unwrap(), Some(256));
        std::fs::write(&f, r#"{"do_lower_case": false}"#).unwrap();
        assert_eq!(sentence_transformers_max_len(d.path()).unwrap(), None);
        std::fs::write(&f, r#"{"max_seq_length": 0}"#).unwrap();
        let e = sentence_transformers_max_len(d.path())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("max_seq_length") && e.contains("sentence_bert_config.json"),
            "{e}"
        );
    }
}
