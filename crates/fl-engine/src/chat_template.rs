//! Chat templates: a model's Jinja `chat_template` rendered as transformers renders it.
//!
//! The template comes from the model directory (`chat_template.jinja`, `chat_template.json` or
//! the `chat_template` field of `tokenizer_config.json`) and is compiled once by minijinja in
//! an environment configured like transformers' `_compile_jinja_template`:
//!
//! - `trim_blocks` and `lstrip_blocks` on, the template's single trailing newline dropped;
//! - undefined values lenient as Jinja2's default `Undefined` (print as nothing, iterate as
//!   empty, are false; an attribute of an undefined value is an error);
//! - `raise_exception(msg)` fails the render with `msg` ([`ChatTemplateError::Raised`]);
//! - `tojson` is transformers' own filter: Python's `json.dumps(x, ensure_ascii=False,
//!   indent=None, separators=None, sort_keys=False)` (no HTML escaping, `", "` and `": "`
//!   separators), with those four arguments;
//! - `strftime_now(fmt)` formats the local time; Python's `str` methods (`.strip()`,
//!   `.startswith()`, `.split()`, `dict.items()`...) come from minijinja-contrib's pycompat;
//!   `{% break %}` / `{% continue %}` work; `{% generation %}` blocks (transformers'
//!   assistant-mask extension) render their body;
//! - printed values look like Python's: `True`, `False`, `None`, `1e-05`, `['a', 1]`.
//!
//! The variables are those transformers passes: `messages`, `tools` and `documents` (both
//! none unless given), `add_generation_prompt`, the special tokens of the tokenizer config
//! (`bos_token`, `eos_token`, `unk_token`, `pad_token`...) and any extra keyword arguments.
//!
//! Known differences from Python that a template can observe: `~` and `|string` spell lists,
//! dicts and floats outside [1e-4, 1e16) as minijinja does (`["x"]`, `100000000000000000000.0`);
//! dict keys are iterated and serialised in the order minijinja and serde_json keep them
//! (sorted unless their `preserve_order` features are on).
//!
//! **Tokenizing the result (no double BOS).** Encode the rendered text with
//! `tokenizer.encode(&text, template.add_special_tokens(&text))`: the flag is false whenever
//! the template already put the BOS text at the start; [`ChatTemplate::add_special_tokens`]
//! states the whole rule.
//!
//! ```
//! use fl_engine::chat_template::ChatTemplate;
//! use serde_json::json;
//! let t = ChatTemplate::new(
//!     "{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}\n{% endfor %}\
//!      {% if add_generation_prompt %}<|assistant|>{% endif %}",
//!     None,
//!     None,
//! )?;
//! let text = t.render(&[json!({"role": "user", "content": " Hi "})], true, None)?;
//! assert_eq!(text, "<|user|>Hi\n<|assistant|>");
//! # Ok::<(), fl_engine::chat_template::ChatTemplateError>(())
//! ```

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};

use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Output, State, UndefinedBehavior, Value};

/// Name of the template used when none is chosen.
const DEFAULT: &str = "default";
/// Name of the template transformers picks when tools are passed and the model has one.
const TOOL_USE: &str = "tool_use";

/// What can go wrong loading or rendering a chat template. Each variant says what was at fault.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    /// A file of the model directory could not be read or does not say what it should.
    #[error("{}: {detail}", path.display())]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// The template does not compile.
    #[error("{origin}: syntax error{}: {detail}", at_line(*.line))]
    Syntax {
        /// Where the template came from: a file (and field), or `chat template` for
        /// [`ChatTemplate::new`].
        origin: String,
        /// Line of the template (1-based), when known.
        line: Option<usize>,
        /// What the compiler said.
        detail: String,
    },
    /// The template called `raise_exception(message)`: the conversation is one the model
    /// does not accept (e.g. roles that do not alternate). The caller's fault.
    #[error("chat template rejected the messages: {message}")]
    Raised {
        /// The template's message.
        message: String,
    },
    /// Rendering failed for another reason (a filter given the wrong type, an attribute of an
    /// undefined value...), usually messages of a shape the template does not expect.
    #[error("chat template {name}: render error{}: {detail}", at_line(*.line))]
    Render {
        /// The template (`default` or `tool_use`).
        name: String,
        /// Line of the template (1-based), when known.
        line: Option<usize>,
        /// What went wrong.
        detail: String,
    },
    /// A message is not an object with a string `role`.
    #[error("messages[{index}]: {reason}")]
    Message {
        /// Index in `messages`.
        index: usize,
        /// Why.
        reason: String,
    },
    /// An extra template argument that cannot be used.
    #[error("chat template argument {key}: {reason}")]
    Argument {
        /// The argument.
        key: String,
        /// Why.
        reason: String,
    },
}

fn at_line(line: Option<usize>) -> String {
    line.map(|l| format!(" at line {l}")).unwrap_or_default()
}

/// A compiled chat template with the special tokens it is rendered with.
///
/// Cheap to share: `Send + Sync`, and [`render`](Self::render) takes `&self`.
pub struct ChatTemplate {
    env: Environment<'static>,
    has_tool_use: bool,
    bos: Option<String>,
    eos: Option<String>,
    add_bos_token: Option<bool>,
    /// Special tokens other than BOS/EOS, passed to the template like transformers does.
    other_tokens: BTreeMap<String, Value>,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("has_tool_use", &self.has_tool_use)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos_token", &self.add_bos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source` with the given BOS and EOS texts (`bos_token` / `eos_token` in the
    /// template; left undefined when `None`).
    ///
    /// Errors: [`ChatTemplateError::Syntax`] with the line when `source` does not compile.
    pub fn new(
        source: &str,
        bos: Option<String>,
        eos: Option<String>,
    ) -> Result<Self, ChatTemplateError> {
        Self::compile(&[(DEFAULT, source, "chat template".to_string())], bos, eos)
    }

    /// The chat template of a model directory, with the special tokens of its
    /// `tokenizer_config.json`; `Ok(None)` when the model has no template.
    ///
    /// The template is the first of: `chat_template.jinja`; `chat_template.json`'s
    /// `chat_template`; `tokenizer_config.json`'s `chat_template`. A `chat_template` is a
    /// string or a list of `{"name", "template"}` where `default` is used (and `tool_use`,
    /// when present, for requests that pass tools, as transformers picks it);
    /// `additional_chat_templates/tool_use.jinja` also provides `tool_use`. Special tokens
    /// may be strings or `{"content": ...}` objects; `add_bos_token` is read when present.
    ///
    /// Errors: [`ChatTemplateError::Config`] for an unreadable or malformed file (or named
    /// templates without a `default`), [`ChatTemplateError::Syntax`] for a template that does
    /// not compile.
    pub fn from_model_dir(dir: &Path) -> Result<Option<Self>, ChatTemplateError> {
        let config_path = dir.join("tokenizer_config.json");
        let config = if config_path.is_file() {
            Some(read_json(&config_path)?)
        } else {
            None
        };

        let mut sources: Vec<(String, String, String)> = Vec::new();
        let jinja_path = dir.join("chat_template.jinja");
        let json_path = dir.join("chat_template.json");
        if jinja_path.is_file() {
            let text = read_text(&jinja_path)?;
            sources.push((DEFAULT.into(), text, jinja_path.display().to_string()));
        } else if json_path.is_file() {
            let json = read_json(&json_path)?;
            sources = templates_from_field(&json_path, json.get("chat_template"))?;
        } else if let Some(config) = &config {
            sources = templates_from_field(&config_path, config.get("chat_template"))?;
        }
        let tool_use_path = dir.join("additional_chat_templates").join("tool_use.jinja");
        if !sources.is_empty()
            && tool_use_path.is_file()
            && !sources.iter().any(|s| s.0 == TOOL_USE)
        {
            let text = read_text(&tool_use_path)?;
            sources.push((TOOL_USE.into(), text, tool_use_path.display().to_string()));
        }
        if sources.is_empty() {
            return Ok(None);
        }

        let token = |key: &str| -> Result<Option<String>, ChatTemplateError> {
            match config.as_ref().and_then(|c| c.get(key)) {
                None => Ok(None),
                Some(v) => token_text(v).map_err(|detail| ChatTemplateError::Config {
                    path: config_path.clone(),
                    detail: format!("{key}: {detail}"),
                }),
            }
        };
        let bos = token("bos_token")?;
        let eos = token("eos_token")?;
        let mut other_tokens = BTreeMap::new();
        for key in [
            "unk_token",
            "pad_token",
            "sep_token",
            "cls_token",
            "mask_token",
        ] {
            if let Some(text) = token(key)? {
                other_tokens.insert(key.to_string(), Value::from(text));
            }
        }
        if let Some(list) = config
            .as_ref()
            .and_then(|c| c.get("additional_special_tokens"))
            .and_then(|v| v.as_array())
        {
            let texts: Vec<String> = list
                .iter()
                .filter_map(|v| token_text(v).ok().flatten())
                .collect();
            other_tokens.insert("additional_special_tokens".into(), Value::from(texts));
        }
        let add_bos_token = match config.as_ref().and_then(|c| c.get("add_bos_token")) {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::Bool(b)) => Some(*b),
            Some(other) => {
                return Err(ChatTemplateError::Config {
                    path: config_path,
                    detail: format!("add_bos_token: expected true or false, got {other}"),
                })
            }
        };

        let named: Vec<(&str, &str, String)> = sources
            .iter()
            .map(|(name, text, origin)| {
                let origin = if name == DEFAULT {
                    origin.clone()
                } else {
                    format!("{origin} ({name})")
                };
                (name.as_str(), text.as_str(), origin)
            })
            .collect();
        let mut t = Self::compile(&named, bos, eos)?;
        t.add_bos_token = add_bos_token;
        t.other_tokens = other_tokens;
        Ok(Some(t))
    }

    /// Sets whether the tokenizer puts BOS in front of plain text (`add_bos_token` of the
    /// tokenizer config; [`from_model_dir`](Self::from_model_dir) reads it).
    pub fn with_add_bos_token(mut self, add_bos_token: Option<bool>) -> Self {
        self.add_bos_token = add_bos_token;
        self
    }

    /// The BOS text (`bos_token`), if the tokenizer config names one.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos.as_deref()
    }

    /// The EOS text (`eos_token`), if the tokenizer config names one.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos.as_deref()
    }

    /// `add_bos_token` of the tokenizer config, if it says.
    pub fn add_bos_token(&self) -> Option<bool> {
        self.add_bos_token
    }

    /// Whether the model has a separate template for requests with tools.
    pub fn has_tool_use_template(&self) -> bool {
        self.has_tool_use
    }

    /// Renders the conversation.
    ///
    /// `messages` are OpenAI-style message objects (each with a string `role`; `content` and
    /// any other field are passed through as they are). `extra` are further template
    /// variables (transformers' `**kwargs`): e.g. `tools` (a list of tool schemas, which also
    /// selects the `tool_use` template when the model has one), `documents`,
    /// `enable_thinking`; they override the special tokens of the same name.
    ///
    /// Errors: [`ChatTemplateError::Message`] for a message that is not an object with a
    /// string role, [`ChatTemplateError::Argument`] when `extra` sets `messages` or
    /// `add_generation_prompt`, [`ChatTemplateError::Raised`] when the template calls
    /// `raise_exception`, [`ChatTemplateError::Render`] for any other failure.
    pub fn render(
        &self,
        messages: &[serde_json::Value],
        add_generation_prompt: bool,
        extra: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String, ChatTemplateError> {
        for (index, m) in messages.iter().enumerate() {
            let Some(obj) = m.as_object() else {
                return Err(ChatTemplateError::Message {
                    index,
                    reason: format!("expected an object with a role, got {}", json_kind(m)),
                });
            };
            match obj.get("role") {
                Some(serde_json::Value::String(_)) => {}
                None => {
                    return Err(ChatTemplateError::Message {
                        index,
                        reason: "missing field `role`".into(),
                    })
                }
                Some(other) => {
                    return Err(ChatTemplateError::Message {
                        index,
                        reason: format!("role: expected a string, got {}", json_kind(other)),
                    })
                }
            }
        }

        let mut ctx: BTreeMap<String, Value> = self.other_tokens.clone();
        if let Some(bos) = &self.bos {
            ctx.insert("bos_token".into(), Value::from(bos.as_str()));
        }
        if let Some(eos) = &self.eos {
            ctx.insert("eos_token".into(), Value::from(eos.as_str()));
        }
        ctx.insert("tools".into(), Value::from(()));
        ctx.insert("documents".into(), Value::from(()));
        let mut with_tools = false;
        if let Some(extra) = extra {
            for (key, value) in extra {
                if key == "messages" || key == "add_generation_prompt" {
                    return Err(ChatTemplateError::Argument {
                        key: key.clone(),
                        reason: "set by the renderer, not an extra argument".into(),
                    });
                }
                if key == "tools" && !value.is_null() {
                    with_tools = true;
                }
                ctx.insert(key.clone(), Value::from_serialize(value));
            }
        }
        ctx.insert("messages".into(), Value::from_serialize(messages));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        );

        let name = if with_tools && self.has_tool_use {
            TOOL_USE
        } else {
            DEFAULT
        };
        let tmpl = self
            .env
            .get_template(name)
            .map_err(|e| render_error(name, &e))?;
        tmpl.render(ctx).map_err(|e| render_error(name, &e))
    }

    /// Whether `rendered` starts with the BOS text (false when there is none).
    pub fn starts_with_bos(&self, rendered: &str) -> bool {
        matches!(&self.bos, Some(bos) if !bos.is_empty() && rendered.starts_with(bos.as_str()))
    }

    /// The `add_special` flag to tokenize a rendered prompt with
    /// ([`Tokenizer::encode`](crate::tokenizer::Tokenizer::encode)).
    ///
    /// The rule: the template owns the special tokens, as in transformers'
    /// `apply_chat_template(tokenize=True)`, so this is false — with one exception: a model
    /// whose tokenizer config says `add_bos_token: true` and whose template did not put the
    /// BOS text at the start gets the tokenizer's BOS (llama.cpp does the same). A template
    /// that starts with `{{ bos_token }}` therefore never yields a double BOS.
    pub fn add_special_tokens(&self, rendered: &str) -> bool {
        self.add_bos_token == Some(true) && self.bos.is_some() && !self.starts_with_bos(rendered)
    }

    /// Compiles `(name, source, origin)` templates into one environment.
    fn compile(
        templates: &[(&str, &str, String)],
        bos: Option<String>,
        eos: Option<String>,
    ) -> Result<Self, ChatTemplateError> {
        let mut env = environment();
        for (name, source, origin) in templates {
            let source = rewrite_generation_tags(source);
            env.add_template_owned(name.to_string(), source)
                .map_err(|e| ChatTemplateError::Syntax {
                    origin: origin.clone(),
                    line: e.line(),
                    detail: e
                        .detail()
                        .map_or_else(|| e.kind().to_string(), str::to_string),
                })?;
        }
        Ok(ChatTemplate {
            has_tool_use: templates.iter().any(|t| t.0 == TOOL_USE),
            env,
            bos,
            eos,
            add_bos_token: None,
            other_tokens: BTreeMap::new(),
        })
    }
}

/// The environment transformers' `_compile_jinja_template` builds, in minijinja.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.set_debug(false);
    // Jinja2 builtins minijinja keeps in contrib (truncate, striptags, cycler, joiner...).
    minijinja_contrib::add_to_environment(&mut env);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(python_formatter);
    env.add_filter("tojson", tojson);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env
}

/// The message of a `raise_exception` call, kept as the error's source to tell it apart.
#[derive(Debug)]
struct Raised(String);

impl fmt::Display for Raised {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

fn raise_exception(message: Value) -> Result<Value, Error> {
    let message = match message.as_str() {
        Some(s) => s.to_string(),
        None => message.to_string(),
    };
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

fn strftime_now(format: String) -> Result<Value, Error> {
    let mut out = String::new();
    // chrono reports an unknown specifier as a formatting error (to_string would panic).
    write!(out, "{}", chrono::Local::now().format(&format)).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: invalid format {format:?}"),
        )
    })?;
    Ok(Value::from(out))
}

fn render_error(name: &str, e: &Error) -> ChatTemplateError {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(raised) = err.downcast_ref::<Raised>() {
            return ChatTemplateError::Raised {
                message: raised.0.clone(),
            };
        }
        cur = err.source();
    }
    ChatTemplateError::Render {
        name: name.to_string(),
        line: e.line(),
        detail: e
            .detail()
            .map_or_else(|| e.kind().to_string(), str::to_string),
    }
}

/// Prints values as Jinja2 does (Python's `str`): `1e-05`, `['a', None]`, `{'k': True}`
/// (minijinja already spells `True` and `None` that way).
fn python_formatter(out: &mut Output, state: &State, value: &Value) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Seq | ValueKind::Map => {
            let mut s = String::new();
            py_repr(&mut s, value);
            out.write_str(&s).map_err(Error::from)
        }
        ValueKind::Number if !value.is_integer() => {
            let f = f64::try_from(value.clone())?;
            out.write_str(&py_float(f, false)).map_err(Error::from)
        }
        _ => minijinja::escape_formatter(out, state, value),
    }
}

/// Python's `repr` of a value (strings quoted as Python quotes them).
fn py_repr(out: &mut String, value: &Value) {
    match value.kind() {
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::None => out.push_str("None"),
        ValueKind::Undefined => {}
        ValueKind::String => py_str_repr(out, value.as_str().unwrap_or_default()),
        ValueKind::Number if !value.is_integer() => match f64::try_from(value.clone()) {
            Ok(f) => out.push_str(&py_float(f, false)),
            Err(_) => out.push_str(&value.to_string()),
        },
        ValueKind::Seq => {
            out.push('[');
            if let Ok(iter) = value.try_iter() {
                for (i, item) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(out, &item);
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(iter) = value.try_iter() {
                for (i, key) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(out, &key);
                    out.push_str(": ");
                    py_repr(out, &value.get_item(&key).unwrap_or_default());
                }
            }
            out.push('}');
        }
        _ => out.push_str(&value.to_string()),
    }
}

fn py_str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_control() => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `repr(float)`: shortest round-trip digits, positional for exponents in
/// [-4, 16), else `d.ddde+XX`. `json` spells the non-finite values as `json.dumps` does.
fn py_float(f: f64, json: bool) -> String {
    if f.is_nan() {
        return if json { "NaN" } else { "nan" }.into();
    }
    if f.is_infinite() {
        let s = match (json, f > 0.0) {
            (true, true) => "Infinity",
            (true, false) => "-Infinity",
            (false, true) => "inf",
            (false, false) => "-inf",
        };
        return s.into();
    }
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        if exp >= 0 {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                format!("{sign}{digits}{}.0", "0".repeat(int_len - digits.len()))
            } else {
                format!("{sign}{}.{}", &digits[..int_len], &digits[int_len..])
            }
        } else {
            format!("{sign}0.{}{digits}", "0".repeat((-exp - 1) as usize))
        }
    } else {
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exp_sign}{:02}", exp.unsigned_abs())
    }
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, the four options positional or by keyword.
fn tojson(value: Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > NAMES.len() {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            "tojson takes at most 4 arguments (ensure_ascii, indent, separators, sort_keys)",
        ));
    }
    let mut opts: [Value; 4] = Default::default();
    for (i, name) in NAMES.iter().enumerate() {
        let by_name: Option<Value> = kwargs.get(name)?;
        match (args.get(i).cloned(), by_name) {
            (Some(_), Some(_)) => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson got multiple values for argument '{name}'"),
                ))
            }
            (Some(v), None) | (None, Some(v)) => opts[i] = v,
            (None, None) => {}
        }
    }
    kwargs.assert_all_used()?;
    let [ensure_ascii, indent, separators, sort_keys] = opts;

    let indent = match indent.kind() {
        ValueKind::Undefined | ValueKind::None => None,
        ValueKind::String => Some(indent.as_str().unwrap_or_default().to_string()),
        ValueKind::Bool => Some(if indent.is_true() { " " } else { "" }.to_string()),
        ValueKind::Number if indent.is_integer() => {
            let n = indent.as_i64().unwrap_or(0).clamp(0, 1 << 16);
            Some(" ".repeat(n as usize))
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: indent must be an integer or a string, got {indent}"),
            ))
        }
    };
    let (item_sep, key_sep) = match separators.kind() {
        ValueKind::Undefined | ValueKind::None => {
            let item = if indent.is_some() { "," } else { ", " };
            (item.to_string(), ": ".to_string())
        }
        _ => {
            let parts: Vec<Value> = separators
                .try_iter()
                .map(|it| it.collect())
                .unwrap_or_default();
            match (parts.first(), parts.get(1), parts.len()) {
                (Some(a), Some(b), 2) if a.as_str().is_some() && b.as_str().is_some() => (
                    a.as_str().unwrap_or_default().to_string(),
                    b.as_str().unwrap_or_default().to_string(),
                ),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        format!("tojson: separators must be two strings, got {separators}"),
                    ))
                }
            }
        }
    };
    let json = JsonStyle {
        ensure_ascii: ensure_ascii.is_true(),
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.is_true(),
    };
    let mut out = String::new();
    json.write(&mut out, &value, 0)?;
    Ok(Value::from(out))
}

/// The options of Python's `json.dumps` that `tojson` exposes.
struct JsonStyle {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl JsonStyle {
    fn newline(&self, out: &mut String, level: usize) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(indent);
            }
        }
    }

    fn write(&self, out: &mut String, value: &Value, level: usize) -> Result<(), Error> {
        match value.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number if value.is_integer() => out.push_str(&value.to_string()),
            ValueKind::Number => out.push_str(&py_float(f64::try_from(value.clone())?, true)),
            ValueKind::String => self.string(out, value.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(out, level + 1);
                    self.write(out, item, level + 1)?;
                }
                self.newline(out, level);
                out.push(']');
            }
            ValueKind::Map => {
                let mut entries: Vec<(String, Value)> = Vec::new();
                for key in value.try_iter()? {
                    let item = value.get_item(&key)?;
                    entries.push((self.key(&key)?, item));
                }
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                if entries.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                out.push('{');
                for (i, (key, item)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(out, level + 1);
                    self.string(out, key);
                    out.push_str(&self.key_sep);
                    self.write(out, item, level + 1)?;
                }
                self.newline(out, level);
                out.push('}');
            }
            kind => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: a value of type {kind} is not JSON serializable"),
                ))
            }
        }
        Ok(())
    }

    /// A dict key as `json.dumps` converts it.
    fn key(&self, key: &Value) -> Result<String, Error> {
        Ok(match key.kind() {
            ValueKind::String => key.as_str().unwrap_or_default().to_string(),
            ValueKind::None => "null".into(),
            ValueKind::Bool => if key.is_true() { "true" } else { "false" }.into(),
            ValueKind::Number if key.is_integer() => key.to_string(),
            ValueKind::Number => py_float(f64::try_from(key.clone())?, true),
            kind => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: keys must be str, int, float, bool or None, not {kind}"),
                ))
            }
        })
    }

    fn string(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c if self.ensure_ascii && !(' '..='~').contains(&c) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// Turns transformers' `{% generation %}` / `{% endgeneration %}` (which only mark the
/// assistant's tokens) into `{% if true %}` / `{% endif %}`, keeping the whitespace markers.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (open, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, close) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[b.len()..]),
            None => (body, ""),
        };
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => {
                let _ = write!(out, "{{%{open} {r} {close}%}}");
            }
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

fn read_text(path: &Path) -> Result<String, ChatTemplateError> {
    std::fs::read_to_string(path).map_err(|e| ChatTemplateError::Config {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })
}

fn read_json(path: &Path) -> Result<serde_json::Value, ChatTemplateError> {
    let text = read_text(path)?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| ChatTemplateError::Config {
            path: path.to_path_buf(),
            detail: format!("invalid JSON: {e}"),
        })?;
    if !json.is_object() {
        return Err(ChatTemplateError::Config {
            path: path.to_path_buf(),
            detail: format!("expected a JSON object, got {}", json_kind(&json)),
        });
    }
    Ok(json)
}

/// `(name, source, origin)` of a `chat_template` field: a string, or named templates of
/// which `default` (and `tool_use`, if any) are kept.
fn templates_from_field(
    path: &Path,
    field: Option<&serde_json::Value>,
) -> Result<Vec<(String, String, String)>, ChatTemplateError> {
    let origin = format!("{} chat_template", path.display());
    let bad = |detail: String| ChatTemplateError::Config {
        path: path.to_path_buf(),
        detail: format!("chat_template: {detail}"),
    };
    match field {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(serde_json::Value::String(s)) => Ok(vec![(DEFAULT.into(), s.clone(), origin)]),
        Some(serde_json::Value::Array(list)) => {
            let mut named = Vec::new();
            for (i, item) in list.iter().enumerate() {
                let name = item.get("name").and_then(|v| v.as_str());
                let template = item.get("template").and_then(|v| v.as_str());
                let (Some(name), Some(template)) = (name, template) else {
                    return Err(bad(format!(
                        "entry {i}: expected {{\"name\": string, \"template\": string}}"
                    )));
                };
                named.push((name.to_string(), template.to_string()));
            }
            if named.is_empty() {
                return Ok(Vec::new());
            }
            if !named.iter().any(|(n, _)| n == DEFAULT) {
                let names: Vec<&str> = named.iter().map(|(n, _)| n.as_str()).collect();
                return Err(bad(format!(
                    "named templates {names:?} but none is named \"default\""
                )));
            }
            Ok(named
                .into_iter()
                .filter(|(n, _)| n == DEFAULT || n == TOOL_USE)
                .map(|(n, t)| (n, t, origin.clone()))
                .collect())
        }
        Some(other) => Err(bad(format!(
            "expected a string or a list of named templates, got {}",
            json_kind(other)
        ))),
    }
}

/// A special token as the tokenizer config writes it: a string, an AddedToken object
/// (`{"content": ...}`) or null.
fn token_text(v: &serde_json::Value) -> Result<Option<String>, String> {
    match v {
        serde_json::Value::Null => Ok(None),
        serde_json::Value::String(s) => Ok(Some(s.clone())),
        serde_json::Value::Object(o) => match o.get("content") {
            Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
            _ => Err("expected {\"content\": string}".into()),
        },
        other => Err(format!(
            "expected a string or {{\"content\": string}}, got {}",
            json_kind(other)
        )),
    }
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_float_repr() {
        let cases = [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (0.1, "0.1"),
            (123.25, "123.25"),
            (1e-4, "0.0001"),
            (1.5e-5, "1.5e-05"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (-2.5e100, "-2.5e+100"),
            (1.0 / 3.0, "0.3333333333333333"),
        ];
        for (f, want) in cases {
            assert_eq!(py_float(f, false), want, "{f:e}");
        }
        assert_eq!(py_float(f64::NAN, true), "NaN");
        assert_eq!(py_float(f64::NEG_INFINITY, true), "-Infinity");
        assert_eq!(py_float(f64::INFINITY, false), "inf");
    }

    #[test]
    fn python_str_repr() {
        let mut s = String::new();
        py_str_repr(&mut s, "it's");
        assert_eq!(s, "\"it's\"");
        s.clear();
        py_str_repr(&mut s, "a\n'\"\\\u{1}");
        assert_eq!(s, r#"'a\n\'"\\\x01'"#);
    }

    #[test]
    fn generation_tags_become_if_true() {
        let src = "a{%- generation %}b{% endgeneration -%}c{% if x %}{% endif %}{%+generation+%}";
        assert_eq!(
            rewrite_generation_tags(src),
            "a{%- if true %}b{% endif -%}c{% if x %}{% endif %}{%+ if true +%}"
        );
        assert_eq!(rewrite_generation_tags("x {% unclosed"), "x {% unclosed");
    }
}
