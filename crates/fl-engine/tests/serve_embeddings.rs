//! `fl serve` with an encoder, in-process: real HTTP/1.1 over loopback against the axum server,
//! the [`EncoderService`] worker on the CPU reference backend (the real math) over the tiny
//! random fixtures of `tests/data/encoder/` (expected outputs from transformers), with the
//! fixture tokenizer copied beside a model where text is needed. No GPU.
//!
//! Every wait is bounded: a hung server fails the test instead of hanging it.

#![cfg(feature = "serve")]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use fl_engine::encoder::backend::{
    scores_from_logits, CpuEncoder, EncoderBackend, EncoderModelDir,
};
use fl_engine::encoder::pooling_config::PoolingConfig;
use fl_engine::encoder::{
    reference, EncoderConfig, EncoderTokenizer, EncoderWeights, PackedBatch, Pooling,
};
use fl_engine::serve::{EncoderInfo, EncoderService, EncoderServiceConfig, ServeConfig, Server};
use fl_engine::Result;
use fl_kernels::testing::rel_l2;
use serde_json::{json, Value};

/// Longest any single wait may take.
mod http_client;
use http_client::Resp;

/// [`http_client::call`] with this file's timeout.
fn call(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    http_client::call(addr, WAIT, method, path, headers, body)
}

const WAIT: Duration = Duration::from_secs(20);
const MODEL: &str = "enc";
/// transformers vs the reference, as tests/encoder_reference.rs holds it.
const TOL: f64 = 1e-5;

// ---------------------------------------------------------------- fixtures

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/encoder")
}

/// What transformers gave for a fixture's batch.
struct Expected(Value);

impl Expected {
    fn load(fixture: &str) -> Self {
        let text = std::fs::read_to_string(data_dir().join(fixture).join("expected.json"))
            .expect("expected.json");
        Expected(serde_json::from_str(&text).expect("JSON"))
    }

    fn ids(&self) -> Vec<Vec<u32>> {
        self.0["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|s| {
                s.as_array()
                    .expect("sequence")
                    .iter()
                    .map(|x| x.as_u64().expect("id") as u32)
                    .collect()
            })
            .collect()
    }

    /// Rows of output `key` (`cls`, `mean`, `last`, `mean_normalized`).
    fn rows(&self, key: &str) -> Vec<Vec<f64>> {
        self.0[key]
            .as_array()
            .expect(key)
            .iter()
            .map(|r| {
                r.as_array()
                    .expect("row")
                    .iter()
                    .map(|x| x.as_f64().expect("number"))
                    .collect()
            })
            .collect()
    }
}

/// A copy of fixture `name` in a temp dir, with the fixture tokenizer beside it when
/// `tokenizer`; `zero_pair_types` makes its pair template give type 0 to both texts (as
/// RoBERTa's does).
fn model_dir(name: &str, tokenizer: bool, zero_pair_types: bool) -> tempfile::TempDir {
    let src = data_dir().join(name);
    let dir = tempfile::tempdir().expect("temp dir");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), dir.path().join(f)).expect("copy");
    }
    if tokenizer {
        let text = std::fs::read_to_string(data_dir().join("tokenizer/tokenizer.json"))
            .expect("tokenizer.json");
        let mut t: Value = serde_json::from_str(&text).expect("JSON");
        if zero_pair_types {
            for piece in t["post_processor"]["pair"].as_array_mut().expect("pair") {
                for kind in ["SpecialToken", "Sequence"] {
                    if let Some(p) = piece.get_mut(kind) {
                        p["type_id"] = json!(0);
                    }
                }
            }
        }
        std::fs::write(dir.path().join("tokenizer.json"), t.to_string()).expect("write");
    }
    dir
}

// ---------------------------------------------------------------- the backend

/// Holds forwards back while set (bounded by [`WAIT`]).
#[derive(Default)]
struct Gate {
    held: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    fn set(&self, held: bool) {
        *self.held.lock().unwrap() = held;
        self.cv.notify_all();
    }

    fn pass(&self) {
        let g = self.held.lock().unwrap();
        let (_g, t) = self.cv.wait_timeout_while(g, WAIT, |h| *h).unwrap();
        assert!(!t.timed_out(), "the gate was never opened");
    }
}

/// The CPU reference, recording each forward's sequence count and waiting at the gate.
struct Recording {
    inner: CpuEncoder,
    batches: Arc<Mutex<Vec<usize>>>,
    gate: Arc<Gate>,
}

impl EncoderBackend for Recording {
    fn config(&self) -> &EncoderConfig {
        self.inner.config()
    }

    fn hidden_states(&mut self, batch: &PackedBatch) -> Result<Vec<f32>> {
        self.batches.lock().unwrap().push(batch.num_seqs());
        self.gate.pass();
        self.inner.hidden_states(batch)
    }
}

// ---------------------------------------------------------------- the server

struct Opts {
    fixture: &'static str,
    tokenizer: bool,
    zero_pair_types: bool,
    pooling: PoolingConfig,
    truncate: bool,
    max_inputs: usize,
    max_batched_tokens: usize,
    ready: bool,
    api_key: Option<String>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            fixture: "bert_small_f32",
            tokenizer: true,
            zero_pair_types: false,
            pooling: PoolingConfig {
                pooling: Pooling::Mean,
                normalize: true,
            },
            truncate: true,
            max_inputs: 2048,
            max_batched_tokens: 8192,
            ready: true,
            api_key: None,
        }
    }
}

struct TestServer {
    addr: SocketAddr,
    server: Server,
    service: Arc<EncoderService>,
    info: EncoderInfo,
    cfg: EncoderConfig,
    weights: EncoderWeights,
    /// The tokenizer as the server truncates.
    tokenizer: Option<EncoderTokenizer>,
    batches: Arc<Mutex<Vec<usize>>>,
    gate: Arc<Gate>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

fn start(opts: Opts) -> TestServer {
    let dir = model_dir(opts.fixture, opts.tokenizer, opts.zero_pair_types);
    let m = EncoderModelDir::load(dir.path()).expect("model dir");
    let batches = Arc::new(Mutex::new(Vec::new()));
    let gate = Arc::new(Gate::default());
    let (cfg, weights) = (m.config.clone(), m.weights.clone());
    let (b, g) = (Arc::clone(&batches), Arc::clone(&gate));
    let service = Arc::new(
        EncoderService::spawn(
            move || {
                Ok(Recording {
                    inner: CpuEncoder::new(cfg, weights)?,
                    batches: b,
                    gate: g,
                })
            },
            m.head(),
            EncoderServiceConfig {
                max_batched_tokens: opts.max_batched_tokens,
                max_batch_seqs: 256,
            },
        )
        .expect("service"),
    );
    let mut info =
        EncoderInfo::new(&m.config, m.tokenizer.as_ref(), m.max_len, opts.pooling).expect("info");
    info.truncate = opts.truncate;
    info.max_inputs = opts.max_inputs;
    let mut scfg = ServeConfig::new(MODEL);
    scfg.api_key = opts.api_key;
    let server = Server::new_encoder(scfg);
    if opts.ready {
        server
            .set_encoder_ready(Arc::clone(&service), info.clone())
            .expect("ready");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    rt.spawn(fl_engine::serve::run(listener, server.clone(), async {
        let _ = stopped.await;
    }));
    let tokenizer = m.encoder_tokenizer().expect("tokenizer");
    TestServer {
        addr,
        server,
        service,
        info,
        cfg: m.config,
        weights: m.weights,
        tokenizer,
        batches,
        gate,
        stop: Some(stop),
        rt,
        _dir: dir,
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.gate.set(false);
        let _ = self.service.shutdown();
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = &self.rt;
    }
}

impl TestServer {
    fn post(&self, path: &str, body: &Value) -> Resp {
        call(
            self.addr,
            "POST",
            path,
            &[("Content-Type", "application/json")],
            body.to_string().as_bytes(),
        )
    }

    fn get(&self, path: &str) -> Resp {
        call(self.addr, "GET", path, &[], b"")
    }

    fn embed(&self, body: &Value) -> Vec<Vec<f32>> {
        let j = self.post("/v1/embeddings", body).ok();
        embeddings_of(&j)
    }

    /// Pooled (then normalised per the server) rows of `seqs` by the reference, alone.
    fn reference_rows(&self, seqs: &[Vec<u32>], types: Option<&[Vec<u32>]>) -> Vec<Vec<f32>> {
        let h = self.cfg.hidden_size;
        let batch = PackedBatch::new(&self.cfg, seqs, types).expect("batch");
        let states = reference::forward(&self.cfg, &self.weights, &batch).expect("forward");
        let mut rows =
            reference::pool(&states, &batch, h, self.info.pooling.pooling).expect("pool");
        if self.info.pooling.normalize {
            reference::l2_normalize(&mut rows, h).expect("normalize");
        }
        rows.chunks(h).map(<[f32]>::to_vec).collect()
    }

    fn wait_until(&self, what: &str, mut cond: impl FnMut(&TestServer) -> bool) {
        let t0 = Instant::now();
        while !cond(self) {
            assert!(t0.elapsed() < WAIT, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// The float embeddings of a response, in `index` order; checks the OpenAI shape.
fn embeddings_of(j: &Value) -> Vec<Vec<f32>> {
    assert_eq!(j["object"], "list", "{j}");
    assert_eq!(j["model"], MODEL);
    let u = &j["usage"];
    assert_eq!(u["prompt_tokens"], u["total_tokens"], "{j}");
    let data = j["data"].as_array().expect("data");
    data.iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["object"], "embedding");
            assert_eq!(d["index"], i);
            d["embedding"]
                .as_array()
                .expect("a float embedding")
                .iter()
                .map(|x| x.as_f64().expect("number") as f32)
                .collect()
        })
        .collect()
}

fn decode_base64(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a' + 26) as u32,
            b'0'..=b'9' => (c - b'0' + 52) as u32,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    assert_eq!(s.len() % 4, 0, "padded base64");
    let mut out = vec![];
    for q in s.as_bytes().chunks(4) {
        let pad = q.iter().filter(|&&c| c == b'=').count();
        let n = q[..4 - pad]
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &c)| acc | val(c) << (18 - 6 * i));
        out.extend_from_slice(&n.to_be_bytes()[1..4 - pad]);
    }
    out
}

fn floats_of_base64(s: &str) -> Vec<f32> {
    decode_base64(s)
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
        .collect()
}

/// A 4xx error: checks the OpenAI shape and returns (param, message).
fn error_of(r: &Resp, status: u16) -> (String, String) {
    assert_eq!(
        r.status,
        status,
        "body {:?}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(r.header("content-type"), Some("application/json"));
    let j = r.json();
    let e = &j["error"];
    for k in ["message", "type", "param", "code"] {
        assert!(e.get(k).is_some(), "error without {k}: {j}");
    }
    (
        e["param"].as_str().unwrap_or_default().to_string(),
        e["message"].as_str().expect("message").to_string(),
    )
}

fn norm(v: &[f32]) -> f64 {
    v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt()
}

// ---------------------------------------------------------------- tests

#[test]
fn token_id_embeddings_match_transformers() {
    for fixture in ["xlmr_tanh", "bert_small_f32"] {
        let exp = Expected::load(fixture);
        let ids = exp.ids();
        for (key, pooling, normalize) in [
            ("cls", Pooling::Cls, false),
            ("mean", Pooling::Mean, false),
            ("last", Pooling::LastToken, false),
            ("mean_normalized", Pooling::Mean, true),
        ] {
            let t = start(Opts {
                fixture,
                tokenizer: false,
                pooling: PoolingConfig { pooling, normalize },
                ..Opts::default()
            });
            let j = t
                .post("/v1/embeddings", &json!({"model": MODEL, "input": ids}))
                .ok();
            let got = embeddings_of(&j);
            let want = exp.rows(key);
            assert_eq!(got.len(), ids.len());
            for (g, w) in got.iter().zip(&want) {
                let e = rel_l2(g, w);
                assert!(e <= TOL, "{fixture} {key}: rel L2 {e:.2e}");
            }
            let tokens: usize = ids.iter().map(Vec::len).sum();
            assert_eq!(j["usage"]["prompt_tokens"], tokens);
            // One flat array of ids is one input.
            let one = t.embed(&json!({"input": ids[1]}));
            assert_eq!(one.len(), 1);
            assert_eq!(one[0], got[1], "{fixture} {key}");
        }
    }
}

#[test]
fn text_embeddings_are_the_reference_on_their_tokens() {
    let t = start(Opts::default());
    let texts = [
        "What is the capital of France?",
        "the cat sat on the mat",
        "a",
        "why is the longest river long",
    ];
    let j = t.post("/v1/embeddings", &json!({"input": texts})).ok();
    let got = embeddings_of(&j);
    let enc = t
        .tokenizer
        .as_ref()
        .expect("tokenizer")
        .encode_texts(&texts)
        .expect("encode");
    let want = t.reference_rows(&enc.ids, Some(&enc.token_types));
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let e = rel_l2(g, &w.iter().map(|&x| x as f64).collect::<Vec<_>>());
        assert!(e <= 1e-6, "text {i}: rel L2 {e:.2e}");
        assert!((norm(g) - 1.0).abs() < 1e-5, "normalised");
    }
    let tokens: usize = enc.ids.iter().map(Vec::len).sum();
    assert_eq!(j["usage"]["prompt_tokens"], tokens);
    assert_eq!(j["usage"]["total_tokens"], tokens);
    // A string is one input; its ids give the same vector.
    let one = t.embed(&json!({"input": texts[0]}));
    assert_eq!(one, got[..1]);
    let by_ids = t.embed(&json!({"input": [enc.ids[0], enc.ids[2]]}));
    assert_eq!(by_ids, [got[0].clone(), got[2].clone()]);
}

#[test]
fn base64_is_the_little_endian_floats() {
    let t = start(Opts::default());
    let input = json!(["the cat sat", "paris is the capital of france"]);
    let floats = t.embed(&json!({"input": input}));
    let j = t
        .post(
            "/v1/embeddings",
            &json!({"input": input, "encoding_format": "base64"}),
        )
        .ok();
    let data = j["data"].as_array().expect("data");
    assert_eq!(data.len(), 2);
    let enc = t
        .tokenizer
        .as_ref()
        .expect("tokenizer")
        .encode_texts(&["the cat sat", "paris is the capital of france"])
        .expect("encode");
    let exact = t.reference_rows(&enc.ids, Some(&enc.token_types));
    for (i, d) in data.iter().enumerate() {
        let b = floats_of_base64(d["embedding"].as_str().expect("a base64 string"));
        assert_eq!(b.len(), t.cfg.hidden_size);
        // Bit for bit what the worker computed; the JSON floats round-trip to it.
        assert_eq!(b, exact[i], "input {i}");
        assert_eq!(b, floats[i], "input {i}");
    }
}

#[test]
fn dimensions_cut_then_renormalise() {
    let exp = Expected::load("xlmr_tanh");
    let ids = exp.ids();
    let mean = exp.rows("mean");
    for normalize in [true, false] {
        let t = start(Opts {
            fixture: "xlmr_tanh",
            tokenizer: false,
            pooling: PoolingConfig {
                pooling: Pooling::Mean,
                normalize,
            },
            ..Opts::default()
        });
        let got = t.embed(&json!({"input": ids, "dimensions": 5}));
        for (g, full) in got.iter().zip(&mean) {
            assert_eq!(g.len(), 5);
            let mut want: Vec<f64> = full[..5].to_vec();
            if normalize {
                let n = want.iter().map(|x| x * x).sum::<f64>().sqrt();
                want.iter_mut().for_each(|x| *x /= n);
                assert!((norm(g) - 1.0).abs() < 1e-5);
            }
            let e = rel_l2(g, &want);
            assert!(e <= TOL, "normalize {normalize}: rel L2 {e:.2e}");
        }
        let h = t.cfg.hidden_size;
        assert_eq!(t.embed(&json!({"input": ids, "dimensions": h}))[0].len(), h);
        for d in [json!(h + 1), json!(0)] {
            let r = t.post("/v1/embeddings", &json!({"input": ids, "dimensions": d}));
            let (param, msg) = error_of(&r, 400);
            assert_eq!(param, "dimensions", "{msg}");
        }
    }
}

#[test]
fn concurrent_requests_run_as_one_batch_and_match_one_by_one() {
    let t = start(Opts::default());
    let groups: Vec<Vec<&str>> = vec![
        vec!["the cat"],
        vec!["what is the capital of france?", "paris"],
        vec!["the dog sat on the mat", "berlin", "a river flows"],
        vec!["how long is the longest river"],
    ];
    // Alone, one request at a time.
    let alone: Vec<Vec<Vec<f32>>> = groups
        .iter()
        .map(|g| t.embed(&json!({"input": g})))
        .collect();
    t.batches.lock().unwrap().clear();

    // The first request holds the worker in its forward while the others queue.
    t.gate.set(true);
    let addr = t.addr;
    let send = |g: Vec<&str>| {
        let body = json!({"input": g}).to_string();
        std::thread::spawn(move || {
            let r = call(
                addr,
                "POST",
                "/v1/embeddings",
                &[("Content-Type", "application/json")],
                body.as_bytes(),
            );
            embeddings_of(&r.ok())
        })
    };
    let first = send(groups[0].clone());
    t.wait_until("the first forward", |t| {
        t.batches.lock().unwrap().len() == 1
    });
    let rest: Vec<_> = groups[1..].iter().map(|g| send(g.clone())).collect();
    t.wait_until("three queued requests", |t| t.service.stats().waiting == 4);
    t.gate.set(false);
    let mut together = vec![first.join().expect("request 0")];
    together.extend(rest.into_iter().map(|h| h.join().expect("request")));
    assert_eq!(together, alone, "batched results differ from one-by-one");
    let batches = t.batches.lock().unwrap().clone();
    // One forward for the first request, one for the 6 sequences of the other three.
    assert_eq!(batches, [1, 6], "forwards' sequence counts");
    let s = t.service.stats();
    assert_eq!((s.waiting, s.submitted, s.ended), (0, 8, 8), "{s:?}");
}

#[test]
fn a_token_budget_splits_batches_without_changing_results() {
    let exp = Expected::load("xlmr_tanh");
    let ids = exp.ids(); // 8, 21 and 3 tokens
    let opts = || Opts {
        fixture: "xlmr_tanh",
        tokenizer: false,
        ..Opts::default()
    };
    let whole = start(opts()).embed(&json!({"input": ids}));
    let t = start(Opts {
        max_batched_tokens: 10,
        ..opts()
    });
    assert_eq!(t.embed(&json!({"input": ids})), whole);
    // 8 | 21 (alone: longer than the budget) | 3.
    assert_eq!(*t.batches.lock().unwrap(), [1, 1, 1]);
}

#[test]
fn long_inputs_are_cut_or_refused() {
    let t = start(Opts::default());
    let max = t.info.max_len();
    let long = "the cat sat on the mat ".repeat(10);
    let j = t
        .post("/v1/embeddings", &json!({"input": [long, "a"]}))
        .ok();
    assert_eq!(j["usage"]["prompt_tokens"], max + 3);
    let ids: Vec<u32> = (0..max as u32 + 5).map(|i| 5 + i % 50).collect();
    let cut = t.embed(&json!({"input": [ids]}));
    assert_eq!(cut, t.embed(&json!({"input": [ids[..max].to_vec()]})));
    for body in [
        json!({"input": [long.clone(), "a"], "truncate": false}),
        json!({"input": [[2, 3], ids], "truncate": false}),
    ] {
        let r = t.post("/v1/embeddings", &body);
        let (param, msg) = error_of(&r, 400);
        assert!(param == "input[0]" || param == "input[1]", "{param}: {msg}");
        assert!(msg.contains(&format!("at most {max}")), "{msg}");
    }
    // The server's default off: refused unless the request asks.
    let t = start(Opts {
        truncate: false,
        ..Opts::default()
    });
    let (param, _) = error_of(&t.post("/v1/embeddings", &json!({"input": long})), 400);
    assert_eq!(param, "input");
    let j = t
        .post("/v1/embeddings", &json!({"input": long, "truncate": true}))
        .ok();
    assert_eq!(j["usage"]["prompt_tokens"], max);
}

#[test]
fn errors_name_the_field() {
    let t = start(Opts {
        max_inputs: 4,
        ..Opts::default()
    });
    let vocab = t.cfg.vocab_size;
    for (body, field) in [
        (json!({"input": ""}), "input"),
        (json!({"input": []}), "input"),
        (json!({"input": [[]]}), "input[0]"),
        (json!({"input": ["a", ""]}), "input[1]"),
        (json!({"input": ["a", "b", "c", "d", "e"]}), "input"),
        (json!({"input": [[2, 3], [2, vocab]]}), "input[1][1]"),
        (json!({"input": [2, vocab, 3]}), "input[1]"),
        (
            json!({"input": "a", "encoding_format": "int8"}),
            "encoding_format",
        ),
        (json!({"input": "a", "dimensions": "8"}), "dimensions"),
        (json!({"inputs": "a"}), "input"),
    ] {
        let r = t.post("/v1/embeddings", &body);
        let (param, msg) = error_of(&r, 400);
        assert_eq!(param, field, "{body}: {msg}");
        assert!(msg.starts_with(field), "{msg}");
    }
    let r = t.post("/v1/embeddings", &json!({"input": "a", "model": "other"}));
    let (param, msg) = error_of(&r, 404);
    assert_eq!(param, "model", "{msg}");
    let r = call(t.addr, "POST", "/v1/embeddings", &[], b"{not json");
    error_of(&r, 400);
    // No tokenizer: text is refused, ids are served.
    let t = start(Opts {
        tokenizer: false,
        ..Opts::default()
    });
    let (param, msg) = error_of(&t.post("/v1/embeddings", &json!({"input": "a"})), 400);
    assert_eq!(param, "input");
    assert!(msg.contains("token ids"), "{msg}");
    assert_eq!(t.embed(&json!({"input": [2, 5, 3]})).len(), 1);
}

/// (index, score) of a rerank response, best first; checks the shape.
fn results_of(j: &Value, n: usize) -> Vec<(usize, f32)> {
    let r = j["results"].as_array().expect("results");
    assert_eq!(r.len(), n, "{j}");
    assert_eq!(j["model"], MODEL);
    assert!(j["id"].as_str().expect("id").starts_with("rerank-"));
    r.iter()
        .map(|x| {
            (
                x["index"].as_u64().expect("index") as usize,
                x["relevance_score"].as_f64().expect("score") as f32,
            )
        })
        .collect()
}

#[test]
fn rerank_ranks_by_the_reference_head() {
    let query = "what is the capital of france?";
    let docs = [
        "paris is the capital of france",
        "the cat sat on the mat",
        "berlin is the capital of germany",
        "rivers flow",
        "",
    ];
    // A 3-label BERT head (probability of the last label) and a 1-label XLM-R one (sigmoid).
    for (fixture, zero_types) in [("bert_cls_tanh", false), ("xlmr_cls_erf", true)] {
        let t = start(Opts {
            fixture,
            zero_pair_types: zero_types,
            ..Opts::default()
        });
        let enc = t
            .tokenizer
            .as_ref()
            .expect("tokenizer")
            .encode_pairs(query, &docs)
            .expect("pairs");
        let batch = enc.pack(&t.cfg).expect("pack");
        let states = reference::forward(&t.cfg, &t.weights, &batch).expect("forward");
        let logits = reference::classify(&t.cfg, &t.weights, &states, &batch).expect("head");
        let labels = t.cfg.num_labels;
        let want: Vec<f32> = match labels {
            1 => logits.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect(),
            n => scores_from_logits(&logits, n).expect("scores"),
        };
        let j = t
            .post(
                "/v1/rerank",
                &json!({"model": MODEL, "query": query, "documents": docs}),
            )
            .ok();
        let got = results_of(&j, docs.len());
        let tokens: usize = enc.ids.iter().map(Vec::len).sum();
        assert_eq!(j["usage"]["total_tokens"], tokens);
        for (k, &(i, s)) in got.iter().enumerate() {
            assert!(
                (s - want[i]).abs() <= 1e-6,
                "{fixture} doc {i}: {s} vs {}",
                want[i]
            );
            if k > 0 {
                assert!(got[k - 1].1 >= s, "{fixture}: not best first: {got:?}");
            }
            assert!(j["results"][k].get("document").is_none());
        }
        let mut indices: Vec<usize> = got.iter().map(|r| r.0).collect();
        indices.sort_unstable();
        assert_eq!(indices, [0, 1, 2, 3, 4]);

        // top_n, documents as objects, return_documents, raw scores.
        let j = t
            .post(
                "/v1/rerank",
                &json!({"query": query, "documents": docs.map(|d| json!({"text": d})),
                        "top_n": 2, "return_documents": true, "raw_scores": true}),
            )
            .ok();
        let top = results_of(&j, 2);
        // Ranked by the returned score: the (last) logit.
        let raw: Vec<f32> = logits.chunks(labels).map(|l| l[labels - 1]).collect();
        let order = fl_engine::encoder::backend::rank(&raw);
        for (k, &(i, s)) in top.iter().enumerate() {
            assert_eq!(i, order[k].0, "{fixture}: ranked by the raw score");
            assert!(
                (s - raw[i]).abs() <= 1e-6,
                "{fixture}: raw {s} vs {}",
                raw[i]
            );
            assert_eq!(j["results"][k]["document"]["text"], docs[i]);
        }
        assert_eq!(
            results_of(
                &t.post(
                    "/v1/rerank",
                    &json!({"query": query, "documents": docs, "top_n": 50})
                )
                .ok(),
                docs.len()
            ),
            got
        );
    }
}

#[test]
fn rerank_refusals() {
    // No classification head.
    let t = start(Opts {
        fixture: "xlmr_tanh",
        ..Opts::default()
    });
    let r = t.post("/v1/rerank", &json!({"query": "q", "documents": ["a"]}));
    let (param, msg) = error_of(&r, 400);
    assert_eq!(param, "model");
    assert!(msg.contains("classification head"), "{msg}");
    // A tokenizer whose pair template gives type 1 to a model with one token type.
    let t = start(Opts {
        fixture: "xlmr_cls_erf",
        ..Opts::default()
    });
    let r = t.post("/v1/rerank", &json!({"query": "q", "documents": ["a"]}));
    let (param, msg) = error_of(&r, 400);
    assert_eq!(param, "documents");
    assert!(msg.contains("type_vocab_size"), "{msg}");
    // Fields.
    let t = start(Opts {
        fixture: "bert_cls_tanh",
        max_inputs: 2,
        ..Opts::default()
    });
    for (body, field) in [
        (json!({"documents": ["a"]}), "query"),
        (json!({"query": "q", "documents": []}), "documents"),
        (
            json!({"query": "q", "documents": ["a", "b", "c"]}),
            "documents",
        ),
        (json!({"query": "q", "documents": ["a", 3]}), "documents[1]"),
        (
            json!({"query": "q", "documents": ["a"], "top_n": 0}),
            "top_n",
        ),
    ] {
        let (param, msg) = error_of(&t.post("/v1/rerank", &body), 400);
        assert_eq!(param, field, "{body}: {msg}");
    }
    let long = "the cat sat on the mat ".repeat(10);
    let r = t.post(
        "/v1/rerank",
        &json!({"query": "q", "documents": ["a", long], "truncate": false}),
    );
    let (param, _) = error_of(&r, 400);
    assert_eq!(param, "documents[1]");
    let j = t
        .post(
            "/v1/rerank",
            &json!({"query": "q", "documents": ["a", long]}),
        )
        .ok();
    assert_eq!(results_of(&j, 2).len(), 2);
}

#[test]
fn routes_health_models_metrics_and_decoder_refusals() {
    let t = start(Opts::default());
    let h = t.get("/health");
    assert_eq!(
        (h.status, h.json()["status"].clone()),
        (200, json!("ready"))
    );
    let m = t.get("/v1/models").ok();
    assert_eq!(m["data"][0]["id"], MODEL);
    assert_eq!(m["data"][0]["max_model_len"], t.info.max_len());
    for path in [
        "/v1/chat/completions",
        "/v1/completions",
        "/tokenize",
        "/detokenize",
    ] {
        let r = t.post(path, &json!({"prompt": "a", "messages": []}));
        let (param, msg) = error_of(&r, 400);
        assert_eq!(param, "model", "{path}");
        assert!(msg.contains("encoder") && msg.contains(path), "{msg}");
    }
    error_of(&t.get("/v1/nothing"), 404);
    assert_eq!(t.get("/v1/embeddings").status, 405);
    t.embed(&json!({"input": ["a", "b"]}));
    let text = String::from_utf8(t.get("/metrics").body).expect("UTF-8");
    for line in [
        "fl_request_success_total{finished_reason=\"stop\"} 1",
        "fl_engine_steps_total 1",
        "fl_encoder_batch_sequences_total 2",
        "fl_num_requests_waiting 0",
    ] {
        assert!(text.contains(line), "{line} missing:\n{text}");
    }
    assert!(
        text.contains("fl_request_failure_total{reason=\"invalid\"} 4"),
        "{text}"
    );

    // While loading.
    let t = start(Opts {
        ready: false,
        ..Opts::default()
    });
    let h = t.get("/health");
    assert_eq!(h.status, 503);
    assert!(h.header("retry-after").is_some());
    error_of(&t.post("/v1/embeddings", &json!({"input": "a"})), 503);
    assert_eq!(t.get("/metrics").status, 200);
    t.server
        .set_encoder_ready(Arc::clone(&t.service), t.info.clone())
        .expect("ready");
    assert_eq!(t.get("/health").status, 200);
    assert!(t
        .server
        .set_encoder_ready(Arc::clone(&t.service), t.info.clone())
        .is_err());
    // After the worker stops.
    t.service.shutdown().expect("shutdown");
    assert_eq!(t.get("/health").status, 503);
    error_of(&t.post("/v1/embeddings", &json!({"input": "a"})), 503);
}

#[test]
fn a_decoder_server_refuses_the_encoder_routes() {
    let server = Server::new(ServeConfig::new("llama"));
    let t = start(Opts::default());
    assert!(server
        .set_encoder_ready(Arc::clone(&t.service), t.info.clone())
        .is_err());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let http = std::thread::spawn(move || {
        rt.block_on(fl_engine::serve::run(listener, server, async {
            let _ = stopped.await;
        }))
    });
    for path in ["/v1/embeddings", "/v1/rerank"] {
        let r = call(addr, "POST", path, &[], br#"{"input": "a"}"#);
        let (param, msg) = error_of(&r, 400);
        assert_eq!(param, "model");
        assert!(msg.contains("decoder") && msg.contains(path), "{msg}");
    }
    let _ = stop.send(());
    http.join().expect("server thread").expect("server");
}

#[test]
fn the_api_key_guards_the_encoder_routes() {
    let t = start(Opts {
        api_key: Some("k3y".into()),
        ..Opts::default()
    });
    let body = json!({"input": "a"}).to_string();
    let r = call(t.addr, "POST", "/v1/embeddings", &[], body.as_bytes());
    error_of(&r, 401);
    let r = call(
        t.addr,
        "POST",
        "/v1/embeddings",
        &[("Authorization", "Bearer k3y")],
        body.as_bytes(),
    );
    assert_eq!(embeddings_of(&r.ok()).len(), 1);
    assert_eq!(t.get("/health").status, 200);
    assert_eq!(t.get("/metrics").status, 200);
}
