//! `ModelConfig` from real-world `config.json` texts (both dialects), the presets, the
//! parameter counts, and one test per error kind.

use fl_engine::config::{Architecture, ConfigDtype, ConfigError, ModelConfig, RopeScaling};
use fl_engine::presets::{preset, preset_names};
use serde_json::{json, Value};

const LLAMA2_7B: &str = r#"{
  "_name_or_path": "meta-llama/Llama-2-7b-hf",
  "architectures": ["LlamaForCausalLM"],
  "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": null, "tie_word_embeddings": false, "torch_dtype": "float16",
  "transformers_version": "4.31.0.dev0", "use_cache": true, "vocab_size": 32000
}"#;

const LLAMA31_8B_HUB: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256
}"#;

const LLAMA31_8B_TF5: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "dtype": "bfloat16", "eos_token_id": [128001, 128008, 128009],
  "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_parameters": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                      "original_max_position_embeddings": 8192, "rope_theta": 500000.0,
                      "rope_type": "llama3"},
  "tie_word_embeddings": false, "transformers_version": "5.0.0", "use_cache": true,
  "vocab_size": 128256
}"#;

const MISTRAL_7B: &str = r#"{
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0", "use_cache": true, "vocab_size": 32000
}"#;

const QWEN2_7B: &str = r#"{
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584,
  "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 131072,
  "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 28,
  "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.37.2", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 152064
}"#;

fn parse(text: &str) -> ModelConfig {
    match ModelConfig::from_json_str(text) {
        Ok(c) => c,
        Err(e) => panic!("fixture should parse: {e}"),
    }
}

#[test]
fn llama2_7b_hub_form() {
    let c = parse(LLAMA2_7B);
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!(
        (c.hidden_size, c.intermediate_size, c.num_hidden_layers),
        (4096, 11008, 32)
    );
    assert_eq!(
        (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
        (32, 32, 128)
    );
    assert_eq!((c.vocab_size, c.max_position_embeddings), (32000, 4096));
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert_eq!(c.rope_theta, 10_000.0);
    assert_eq!(c.rope_scaling, RopeScaling::None);
    assert!(!c.qkv_bias && !c.o_bias && !c.mlp_bias && !c.tie_word_embeddings);
    assert_eq!(c.bos_token_id, Some(1));
    assert_eq!(c.eos_token_ids, vec![2]);
    assert_eq!(c.sliding_window, None);
    assert_eq!(c.dtype, Some(ConfigDtype::F16));
    assert_eq!((c.group_size(), c.q_size(), c.kv_size()), (1, 4096, 4096));
    assert_eq!(c.param_count(), 6_738_415_616);
    assert_eq!(c, preset("llama-2-7b").unwrap_or_else(|e| panic!("{e}")));
}

fn llama31_expected() -> ModelConfig {
    ModelConfig {
        architecture: Architecture::Llama,
        hidden_size: 4096,
        intermediate_size: 14336,
        num_hidden_layers: 32,
        num_attention_heads: 32,
        num_key_value_heads: 8,
        head_dim: 128,
        vocab_size: 128_256,
        max_position_embeddings: 131_072,
        rms_norm_eps: 1e-5,
        rope_theta: 500_000.0,
        rope_scaling: RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        },
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        tie_word_embeddings: false,
        bos_token_id: Some(128_000),
        eos_token_ids: vec![128_001, 128_008, 128_009],
        sliding_window: None,
        dtype: Some(ConfigDtype::BF16),
    }
}

#[test]
fn llama31_8b_hub_and_transformers5_forms_agree() {
    let hub = parse(LLAMA31_8B_HUB);
    let tf5 = parse(LLAMA31_8B_TF5);
    assert_eq!(hub, llama31_expected());
    assert_eq!(tf5, llama31_expected());
    assert_eq!(
        (hub.group_size(), hub.q_size(), hub.kv_size()),
        (4, 4096, 1024)
    );
    assert_eq!(hub.param_count(), 8_030_261_248);
}

#[test]
fn rope_scaling_older_type_key_and_linear() {
    let mut v: Value = serde_json::from_str(LLAMA2_7B).unwrap_or_else(|e| panic!("{e}"));
    v["rope_scaling"] = json!({"type": "linear", "factor": 4.0});
    let c = ModelConfig::from_json_value(&v).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 4.0 });
    v["rope_scaling"] = json!({"rope_type": "default"});
    let c = ModelConfig::from_json_value(&v).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.rope_scaling, RopeScaling::None);
    // transformers 5 with default rope: theta from rope_parameters, not the default 10000.
    let mut v: Value = serde_json::from_str(LLAMA2_7B).unwrap_or_else(|e| panic!("{e}"));
    v["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 1234.5});
    let c = ModelConfig::from_json_value(&v).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((c.rope_theta, c.rope_scaling), (1234.5, RopeScaling::None));
}

#[test]
fn mistral_7b_sliding_window() {
    let c = parse(MISTRAL_7B);
    assert_eq!(c.architecture, Architecture::Mistral);
    assert_eq!(c.sliding_window, Some(4096));
    assert_eq!((c.num_key_value_heads, c.group_size()), (8, 4));
    assert!(!c.qkv_bias && !c.o_bias);
    assert_eq!(c.param_count(), 7_241_732_096);
    // Mistral v0.2+: sliding_window null = full attention.
    let mut v: Value = serde_json::from_str(MISTRAL_7B).unwrap_or_else(|e| panic!("{e}"));
    v["sliding_window"] = Value::Null;
    let c = ModelConfig::from_json_value(&v).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.sliding_window, None);
}

#[test]
fn qwen2_7b_qkv_bias() {
    let c = parse(QWEN2_7B);
    assert_eq!(c.architecture, Architecture::Qwen2);
    assert!(c.qkv_bias, "qwen2 has q/k/v biases by default");
    assert!(!c.o_bias && !c.mlp_bias);
    assert_eq!(c.sliding_window, None, "use_sliding_window is false");
    assert_eq!((c.head_dim, c.group_size(), c.kv_size()), (128, 7, 512));
    assert_eq!(c.rms_norm_eps, 1e-6);
    assert_eq!(c.rope_theta, 1e6);
    assert_eq!(c.param_count(), 7_615_616_512);
}

#[test]
fn explicit_head_dim_differs_from_hidden_over_heads() {
    let text = r#"{"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 2, "num_attention_heads": 16, "num_key_value_heads": 4,
        "head_dim": 256, "vocab_size": 1000, "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6, "attention_bias": true, "mlp_bias": true,
        "tie_word_embeddings": true}"#;
    let c = parse(text);
    assert_eq!(c.head_dim, 256);
    assert_ne!(c.head_dim, c.hidden_size / c.num_attention_heads);
    assert_eq!((c.q_size(), c.kv_size(), c.group_size()), (4096, 1024, 4));
    assert!(c.qkv_bias && c.o_bias && c.mlp_bias && c.tie_word_embeddings);
    // Per layer: q 2048*4096 + k,v 2*2048*1024 + o 4096*2048 + mlp 3*2048*8192 + norms
    // + biases (4096 + 2*1024 + 2048) + mlp biases (2*8192 + 2048).
    let layer: u64 = 2048 * 4096
        + 2 * 2048 * 1024
        + 4096 * 2048
        + 3 * 2048 * 8192
        + 2 * 2048
        + (4096 + 2 * 1024 + 2048)
        + (2 * 8192 + 2048);
    assert_eq!(c.layer_param_count(), layer);
    assert_eq!(c.param_count(), 1000 * 2048 + 2 * layer + 2048);
    assert_eq!(c.weight_bytes(2), 2 * c.param_count());
}

#[test]
fn architectures_alone_dispatch() {
    let mut v: Value = serde_json::from_str(MISTRAL_7B).unwrap_or_else(|e| panic!("{e}"));
    if let Some(m) = v.as_object_mut() {
        m.remove("model_type");
    }
    let c = ModelConfig::from_json_value(&v).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.architecture, Architecture::Mistral);
}

#[test]
fn presets_known_counts_and_unknown_name() {
    assert_eq!(
        preset_names(),
        [
            "llama-2-7b",
            "llama-2-13b",
            "llama-2-70b",
            "llama-3-8b",
            "llama-3.1-8b",
            "llama-3-70b",
            "tiny"
        ]
    );
    for name in preset_names() {
        let c = preset(name).unwrap_or_else(|e| panic!("{e}"));
        c.validate()
            .unwrap_or_else(|e| panic!("preset {name}: {e}"));
    }
    let p = |n: &str| preset(n).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p("llama-2-7b").param_count(), 6_738_415_616);
    assert_eq!(p("llama-2-13b").param_count(), 13_015_864_320);
    assert_eq!(p("llama-3-8b").param_count(), 8_030_261_248);
    assert_eq!(p("llama-3-8b").weight_bytes(2), 16_060_522_496);
    assert_eq!(p("llama-3.1-8b").param_count(), 8_030_261_248);
    assert_eq!(p("llama-3.1-8b").max_position_embeddings, 131_072);
    // The published counts of the 70B checkpoints.
    assert_eq!(p("llama-2-70b").param_count(), 68_976_648_192);
    assert_eq!(p("llama-3-70b").param_count(), 70_553_706_496);
    assert_eq!(p("llama-3-70b").group_size(), 8);
    let tiny = p("tiny");
    assert!(tiny.num_key_value_heads < tiny.num_attention_heads);
    assert!(tiny.param_count() < 1_000_000);
    let err = match preset("llama-9") {
        Err(e) => e.to_string(),
        Ok(_) => panic!("unknown preset accepted"),
    };
    assert!(err.contains("llama-9"), "{err}");
    for name in preset_names() {
        assert!(err.contains(name), "error should list `{name}`: {err}");
    }
}

// ---- errors: one per kind, each naming the field ----

fn base() -> Value {
    serde_json::from_str(LLAMA2_7B).unwrap_or_else(|e| panic!("{e}"))
}

fn err_of(v: &Value) -> ConfigError {
    match ModelConfig::from_json_value(v) {
        Err(e) => e,
        Ok(_) => panic!("config should be rejected: {v}"),
    }
}

fn with(key: &str, val: Value) -> Value {
    let mut v = base();
    v[key] = val;
    v
}

fn without(key: &str) -> Value {
    let mut v = base();
    if let Some(m) = v.as_object_mut() {
        m.remove(key);
    }
    v
}

fn assert_names(e: &ConfigError, words: &[&str]) {
    let msg = e.to_string();
    for w in words {
        assert!(msg.contains(w), "error should name `{w}`: {msg}");
    }
}

#[test]
fn error_not_json() {
    let e = match ModelConfig::from_json_str("{not json") {
        Err(e) => e,
        Ok(_) => panic!("accepted"),
    };
    assert!(matches!(e, ConfigError::Json { .. }), "{e:?}");
    let e = err_of(&json!([1, 2]));
    assert!(matches!(e, ConfigError::Json { .. }), "{e:?}");
}

#[test]
fn error_missing_field() {
    for key in [
        "hidden_size",
        "num_attention_heads",
        "vocab_size",
        "intermediate_size",
    ] {
        let e = err_of(&without(key));
        assert!(matches!(e, ConfigError::MissingField { .. }), "{e:?}");
        assert_names(&e, &[key]);
    }
    let mut v = without("model_type");
    if let Some(m) = v.as_object_mut() {
        m.remove("architectures");
    }
    assert_names(&err_of(&v), &["model_type"]);
}

#[test]
fn error_wrong_type() {
    let e = err_of(&with("hidden_size", json!("4096")));
    assert!(matches!(e, ConfigError::WrongType { .. }), "{e:?}");
    assert_names(&e, &["hidden_size", "\"4096\""]);
    assert_names(
        &err_of(&with("eos_token_id", json!([2, "x"]))),
        &["eos_token_id"],
    );
    assert_names(
        &err_of(&with("rms_norm_eps", json!(true))),
        &["rms_norm_eps"],
    );
    assert_names(
        &err_of(&with("num_key_value_heads", json!(-1))),
        &["num_key_value_heads"],
    );
    assert_names(&err_of(&with("rope_scaling", json!(8))), &["rope_scaling"]);
}

#[test]
fn error_unsupported_architecture() {
    let e = err_of(&with("model_type", json!("gemma")));
    assert!(
        matches!(e, ConfigError::UnsupportedArchitecture { .. }),
        "{e:?}"
    );
    assert_names(&e, &["model_type", "gemma"]);
    let mut v = without("model_type");
    v["architectures"] = json!(["GPT2LMHeadModel"]);
    assert_names(&err_of(&v), &["architectures", "GPT2LMHeadModel"]);
    // model_type and architectures disagreeing.
    let e = err_of(&with("architectures", json!(["Qwen2ForCausalLM"])));
    assert!(matches!(e, ConfigError::Invalid { .. }), "{e:?}");
    assert_names(&e, &["architectures", "llama"]);
}

#[test]
fn error_unsupported_rope_type() {
    let e = err_of(&with(
        "rope_scaling",
        json!({"rope_type": "yarn", "factor": 4.0}),
    ));
    assert!(
        matches!(e, ConfigError::UnsupportedRopeType { .. }),
        "{e:?}"
    );
    assert_names(&e, &["rope_scaling.rope_type", "yarn"]);
    let e = err_of(&with(
        "rope_scaling",
        json!({"type": "dynamic", "factor": 2.0}),
    ));
    assert_names(&e, &["rope_scaling.type", "dynamic"]);
    let e = err_of(&with(
        "rope_parameters",
        json!({"rope_type": "longrope", "rope_theta": 1e4}),
    ));
    assert_names(&e, &["rope_parameters.rope_type", "longrope"]);
}

#[test]
fn error_unsupported_option() {
    let cases = [
        with("hidden_act", json!("gelu")),
        with("quantization_config", json!({"quant_method": "awq"})),
        with("torch_dtype", json!("float8_e4m3fn")),
        with("partial_rotary_factor", json!(0.5)),
        with(
            "rope_parameters",
            json!({"full_attention": {"rope_type": "default", "rope_theta": 1e4}}),
        ),
    ];
    let fields = [
        "hidden_act",
        "quantization_config",
        "torch_dtype",
        "partial_rotary_factor",
        "rope_parameters",
    ];
    for (v, field) in cases.iter().zip(fields) {
        let e = err_of(v);
        assert!(
            matches!(e, ConfigError::UnsupportedOption { .. }),
            "{field}: {e:?}"
        );
        assert_names(&e, &[field]);
    }
    let mut q: Value = serde_json::from_str(QWEN2_7B).unwrap_or_else(|e| panic!("{e}"));
    q["use_sliding_window"] = json!(true);
    assert_names(&err_of(&q), &["use_sliding_window"]);
    let mut m: Value = serde_json::from_str(MISTRAL_7B).unwrap_or_else(|e| panic!("{e}"));
    m["mlp_bias"] = json!(true);
    assert_names(&err_of(&m), &["mlp_bias"]);
}

#[test]
fn error_invalid_values() {
    let cases: Vec<(Value, &str)> = vec![
        (with("hidden_size", json!(0)), "hidden_size"),
        (with("num_hidden_layers", json!(0)), "num_hidden_layers"),
        (with("vocab_size", json!(0)), "vocab_size"),
        (with("num_key_value_heads", json!(5)), "num_key_value_heads"),
        (with("head_dim", json!(127)), "head_dim"),
        (with("hidden_size", json!(4095)), "hidden_size"),
        (with("rms_norm_eps", json!(0.0)), "rms_norm_eps"),
        (with("rope_theta", json!(-1.0)), "rope_theta"),
        (with("eos_token_id", json!([2, 32000])), "eos_token_id"),
        (with("bos_token_id", json!(99999)), "bos_token_id"),
        (
            with(
                "rope_scaling",
                json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                       "high_freq_factor": 1.0, "original_max_position_embeddings": 8192}),
            ),
            "rope_scaling.high_freq_factor",
        ),
        (
            with(
                "rope_scaling",
                json!({"rope_type": "linear", "factor": 0.0}),
            ),
            "rope_scaling.factor",
        ),
    ];
    for (v, field) in &cases {
        let e = err_of(v);
        assert!(matches!(e, ConfigError::Invalid { .. }), "{field}: {e:?}");
        assert_names(&e, &[field]);
    }
    let mut m: Value = serde_json::from_str(MISTRAL_7B).unwrap_or_else(|e| panic!("{e}"));
    m["sliding_window"] = json!(0);
    assert_names(&err_of(&m), &["sliding_window"]);
    // Missing llama3 field is named with its object.
    let e = err_of(&with(
        "rope_scaling",
        json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
    ));
    assert!(matches!(e, ConfigError::MissingField { .. }), "{e:?}");
    assert_names(&e, &["rope_scaling.original_max_position_embeddings"]);
}

#[test]
fn error_io_names_path() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let e = match ModelConfig::from_model_dir(dir.path()) {
        Err(e) => e,
        Ok(_) => panic!("no config.json, yet loaded"),
    };
    assert!(matches!(e, ConfigError::Io { .. }), "{e:?}");
    assert_names(&e, &["config.json"]);
    std::fs::write(dir.path().join("config.json"), QWEN2_7B).unwrap_or_else(|e| panic!("{e}"));
    let c = ModelConfig::from_model_dir(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c, parse(QWEN2_7B));
}

fn rel(a: f64, b: f64) -> f64 {
    ((a - b) / b).abs()
}

#[test]
fn rope_inv_freq_llama3_matches_transformers_formula() {
    let c = parse(LLAMA31_8B_HUB);
    let f = c.rope_inv_freq();
    assert_eq!(f.len(), 64);
    // Reference values: the transformers `_compute_llama3_parameters` formula evaluated in
    // f64 outside this crate. 0 and 20: high frequency, kept; 30: blended; 40 and 63:
    // low frequency, divided by 8.
    let want = [
        (0, 1.0),
        (1, 0.814_617_233_856_544_7),
        (20, 0.016_560_440_080_994_446),
        (30, 0.001_371_893_567_761_138_1),
        (40, 3.428_102_195_952_591e-5),
        (63, 3.068_925_988_914_511e-7),
    ];
    for (i, w) in want {
        assert!(rel(f[i], w) < 1e-12, "inv_freq[{i}] = {}, want {w}", f[i]);
    }
    // Non-increasing, and never above the unscaled frequencies.
    let base = parse(&LLAMA31_8B_HUB.replace("\"llama3\"", "\"default\"")).rope_inv_freq();
    for i in 0..64 {
        assert!(f[i] <= base[i] * (1.0 + 1e-15), "{i}");
        assert!(f[i] >= base[i] / 8.0 * (1.0 - 1e-15), "{i}");
        if i > 0 {
            assert!(f[i] < f[i - 1], "{i}");
        }
    }
    assert_eq!(base[30], 500_000f64.powf(-60.0 / 128.0));
}

#[test]
fn rope_inv_freq_default_and_linear() {
    let c = parse(LLAMA2_7B);
    let f = c.rope_inv_freq();
    assert_eq!(f.len(), 64);
    assert!(
        rel(f[32], 1e-2) < 1e-12,
        "10000^(-64/128) = 0.01, got {}",
        f[32]
    );
    let mut v = base();
    v["rope_scaling"] = json!({"type": "linear", "factor": 4.0});
    let lin = ModelConfig::from_json_value(&v)
        .unwrap_or_else(|e| panic!("{e}"))
        .rope_inv_freq();
    for i in 0..64 {
        assert!(rel(lin[i], f[i] / 4.0) < 1e-15, "{i}");
    }
}

#[test]
fn derived_sizes() {
    let l2 = parse(LLAMA2_7B);
    assert_eq!(l2.kv_cache_bytes_per_token(2), 524_288);
    assert!(rel(l2.attention_scale(), 1.0 / 128f64.sqrt()) < 1e-15);
    let l3 = parse(LLAMA31_8B_HUB);
    assert_eq!(l3.kv_cache_bytes_per_token(2), 131_072);
    assert_eq!(l3.kv_cache_bytes_per_token(4), 262_144);
    assert_eq!(
        parse(QWEN2_7B).kv_cache_bytes_per_token(2),
        2 * 28 * 512 * 2
    );
}

#[test]
fn qkv_row_order_makes_rotate_half_pairs_adjacent() {
    // The loader's QKV row order (weights::qkv_row_order): a permutation of the stacked rows;
    // within each q and k head, rows 2e and 2e + 1 are the checkpoint's rotate-half pair
    // (e, e + d/2); v rows stay. Checked on a GQA preset (llama-3-8b: 32 q heads, 8 kv heads).
    use fl_engine::model::rope_params;
    use fl_engine::weights::qkv_row_order;
    use fl_kernels::rope::RopeStyle;
    let c = preset("llama-3-8b").unwrap_or_else(|e| panic!("{e}"));
    let (d, hq, hkv) = (c.head_dim, c.num_attention_heads, c.num_key_value_heads);
    let order = qkv_row_order(&c).unwrap_or_else(|e| panic!("{e}"));
    let rows = (hq + 2 * hkv) * d;
    assert_eq!(order.len(), rows);
    let mut seen = vec![false; rows];
    for &r in &order {
        assert!(r < rows && !seen[r], "row {r} twice or out of range");
        seen[r] = true;
    }
    for h in 0..hq + hkv {
        for e in 0..d / 2 {
            assert_eq!(order[h * d + 2 * e], h * d + e, "head {h} pair {e}");
            assert_eq!(
                order[h * d + 2 * e + 1],
                h * d + e + d / 2,
                "head {h} pair {e}"
            );
        }
    }
    for (r, &o) in order.iter().enumerate().skip((hq + hkv) * d) {
        assert_eq!(o, r, "v row {r} moved");
    }
    // The kernels then rotate interleaved pairs.
    assert_eq!(rope_params(&c).style, RopeStyle::Interleaved);
}
