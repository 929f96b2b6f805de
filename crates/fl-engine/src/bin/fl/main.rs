//! The `fl` command.

use std::io::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use fl_engine::beam::{BeamParams, EarlyStopping};
use fl_engine::dtype::RunDType;
use fl_engine::runner::{RequestOptions, RunnerConfig};
use fl_engine::scheduler::{Event, Request, RequestParams};
use fl_engine::tp::AnyEngine;
use fl_engine::{load, EngineError, Loaded, Result};
use fl_sampling::SamplingParams;

mod bench;
mod calibrate;
mod embed;
mod embed_bench;

use fl_engine::serve::text::Detokenizer;

/// A detokenizer's error as the tokenizer's.
fn text_err(e: String) -> EngineError {
    EngineError::invalid("tokenizer", e)
}
mod serve;

/// Loads the model named by a `ModelArgs` in its dtype and runs `$body(engine, loaded)`.
macro_rules! dispatch {
    ($m:expr, |$e:ident, $l:ident| $body:expr) => {{
        let m = $m;
        (|| -> Result<()> {
            let $l = std::sync::Arc::new(load::resolve(&m.model, &m.quant)?);
            match m.dtype.as_str() {
                "f32" => {
                    let mut $e = load::any_engine::<f32>(&$l, m.tp, !m.no_graph)?;
                    let $e = &mut $e;
                    $body
                }
                "bf16" => {
                    let mut $e = load::any_engine::<fl_kernels::bf16>(&$l, m.tp, !m.no_graph)?;
                    let $e = &mut $e;
                    $body
                }
                _ => {
                    let mut $e = load::any_engine::<fl_kernels::f16>(&$l, m.tp, !m.no_graph)?;
                    let $e = &mut $e;
                    $body
                }
            }
        })()
    }};
}

#[derive(Parser)]
#[command(
    name = "fl",
    version,
    about = "FasterLLaMA-rs: LLaMA-family inference on CUDA"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate text (or token ids) from a prompt, streaming it as it is produced.
    Generate {
        #[command(flatten)]
        model: ModelArgs,
        /// Prompt text (needs tokenizer.json in the model directory).
        #[arg(long, conflicts_with = "prompt_ids")]
        prompt: Option<String>,
        /// Prompt as comma-separated token ids (for models without a tokenizer). With
        /// --num-beams, several prompts separated by `;` run as one ragged batch, and each
        /// hypothesis line starts with its prompt's index.
        #[arg(long)]
        prompt_ids: Option<String>,
        /// Tokens to generate at most.
        #[arg(long, default_value_t = 128)]
        max_new_tokens: usize,
        /// Softmax temperature; 0 means greedy.
        #[arg(long, default_value_t = 0.0)]
        temperature: f32,
        /// Keep the k most likely tokens (0: all).
        #[arg(long, default_value_t = 0)]
        top_k: u32,
        /// Nucleus sampling mass (1: all).
        #[arg(long, default_value_t = 1.0)]
        top_p: f32,
        /// Random seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Print token ids instead of text.
        #[arg(long)]
        print_ids: bool,
        /// Beam search with this many beams (transformers' `generate(num_beams=N)`) instead
        /// of sampling; prints the returned hypotheses, best first, each as
        /// `score<TAB>text` (or ids), after the search.
        #[arg(long, default_value_t = 1)]
        num_beams: usize,
        /// Beam search: a hypothesis scores sum(log-probabilities) / length ^ this.
        #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
        length_penalty: f64,
        /// Beam search: stop when num_beams hypotheses are done (true), when no running beam
        /// can beat them at its current length (false, the heuristic), or at any length (never).
        #[arg(long, default_value = "false", value_parser = ["true", "false", "never"])]
        early_stopping: String,
        /// Beam search: hypotheses printed, 1..=num_beams.
        #[arg(long, default_value_t = 1)]
        num_return_sequences: usize,
        #[command(flatten)]
        runner: RunnerArgs,
    },
    /// Time prefill and decode on a model or a preset with dummy weights.
    Bench {
        #[command(flatten)]
        model: ModelArgs,
        /// Sequences in the batch.
        #[arg(long, default_value_t = 1)]
        batch: usize,
        /// Prompt tokens per sequence.
        #[arg(long, default_value_t = 128)]
        prompt_len: usize,
        /// Tokens generated per sequence (end ids ignored).
        #[arg(long, default_value_t = 128)]
        gen_len: usize,
        /// Print one JSON line instead of the table.
        #[arg(long)]
        json: bool,
        /// Several runs on one load: `BATCH:PROMPT:GEN,...` (overrides the three above).
        #[arg(long)]
        runs: Option<String>,
        /// Also run each shape through the continuous-batching runner (paged KV cache,
        /// every request queued at once, chunked prefill under an 8,192-token budget) on the
        /// same load, and print its figures under the static engine's.
        #[arg(long)]
        runner: bool,
        /// Beam search bench instead: per shape, BATCH requests of this many beams and then
        /// BATCH x beams sampled (greedy) sequences through the runner on the same load;
        /// prints both decode step times and their ratio.
        #[arg(long)]
        num_beams: Option<usize>,
        /// Replay a trace of this many requests through the runner instead of the shapes
        /// above: arrivals per `--rate`, lengths per `--prompt-lens` / `--output-lens`; reports
        /// throughput and TTFT / TPOT / inter-token latency percentiles.
        #[arg(long)]
        trace: Option<usize>,
        /// A trace from a JSON file instead: `[{"arrival_s", "prompt_len", "output_len"}, ...]`.
        #[arg(long)]
        trace_file: Option<PathBuf>,
        /// Trace arrivals per second (Poisson); default: every request at once.
        #[arg(long)]
        rate: Option<f64>,
        /// Trace prompt lengths: `N` or `LO-HI` (uniform).
        #[arg(long, default_value = "64-4096")]
        prompt_lens: String,
        /// Trace output lengths: `N` or `LO-HI` (uniform).
        #[arg(long, default_value = "16-1024")]
        output_lens: String,
        /// Seed of the generated trace.
        #[arg(long, default_value_t = 1)]
        trace_seed: u64,
        /// Trace prompts start with the same this many tokens (a shared system prompt);
        /// trace prompt lengths must be longer.
        #[arg(long, default_value_t = 0)]
        shared_prefix: usize,
        /// Also replay the trace through the static engine, in arrival-order batches of up to
        /// --max-num-seqs requests (fewer when a batch's contiguous cache does not fit),
        /// every request arriving at once; prints both.
        #[arg(long)]
        trace_static: bool,
        /// Only part K of N of --trace-static's batches (`K/N`), and not the runner: a trace
        /// whose static side outlasts one run splits into parts whose output tokens and
        /// seconds add up.
        #[arg(long, value_parser = parse_part)]
        trace_static_part: Option<(usize, usize)>,
        #[command(flatten)]
        runner_args: RunnerArgs,
    },
    /// Logits for checks against another implementation: reads
    /// `{"prompts": [[ids]...], "forced": [[ids]...] (optional), "steps": N}` and writes
    /// `{"prefill": [[f32; vocab] per prompt], "steps": [[[f32; vocab] per prompt] per step],
    /// "tokens": [[ids] per prompt]}`. Sampling is greedy with no end ids: without `forced`,
    /// `tokens` is each prompt's greedy continuation (N + 1 tokens).
    Logits {
        #[command(flatten)]
        model: ModelArgs,
        /// Input JSON file.
        #[arg(long)]
        input: PathBuf,
        /// Output JSON file.
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        runner: RunnerArgs,
    },
    /// Serve the model over HTTP with the OpenAI API (chat and text completions, streaming),
    /// plus /health, /metrics, /tokenize and /detokenize.
    Serve {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        serve: serve::ServeArgs,
        #[command(flatten)]
        runner: RunnerArgs,
    },
    /// Embed texts with an encoder model (BERT, RoBERTa, XLM-RoBERTa): one JSON line
    /// `{"index", "embedding"}` per input line.
    Embed(embed::EmbedArgs),
    /// Score passages against a query with a cross-encoder reranker: JSON lines
    /// `{"index", "score"}`, best first.
    Rerank(embed::RerankArgs),
    /// Time an encoder's forward over ragged batches (a preset shape with random weights, or
    /// a model directory): ms per batch, sentences/s, TFLOP/s.
    EmbedBench(embed_bench::EmbedBenchArgs),
    /// INT8 activation scales of an encoder from sample text (absmax and a percentile of
    /// every GEMM input), for `fl embed --quant int8 --calibration`.
    Calibrate(calibrate::CalibrateArgs),
    /// Run the kernel demo: elementwise kernels checked against the CPU and timed.
    Demo {
        /// Elements per call.
        #[arg(long, default_value_t = 1 << 26)]
        n: usize,
    },
    /// Print the GPU this machine has, or, given a GGUF file, its metadata and tensor types.
    Info {
        /// A .gguf file (any part of a split model): print its metadata (long arrays
        /// shortened) and the count and bytes of its tensors per ggml type; no GPU needed.
        path: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
struct ModelArgs {
    /// A model directory (config.json + safetensors) or a preset name for dummy weights
    /// (llama-2-7b, llama-2-13b, llama-2-70b, llama-3-8b, llama-3.1-8b, llama-3-70b, tiny;
    /// `fl serve` also takes the encoder presets bert-base, bert-large, bge-base, bge-small).
    #[arg(long)]
    model: String,
    /// Run dtype: weights, activations and KV cache (f32 runs every projection on cuBLASLt in
    /// f32, no TF32, for checks against an fp32 reference).
    #[arg(long, default_value = "f16", value_parser = ["f16", "bf16", "f32"])]
    dtype: String,
    /// How the decoder's linear layers are held. auto: a .gguf file's own formats (gguf:
    /// Q8_0/Q4_0/K-quant tensors run from their blocks, other types dense), else none (dense).
    /// Or quantise on load: weight-only int8 (per output channel), int4 (symmetric, groups of
    /// 128 along k; int4-g64, int4-g32), llama.cpp q8_0 / q4_0 / q4_k / q5_k / q6_k, or w8a8
    /// (int8 weights and per-token int8 activations, int8 tensor-core GEMMs). The embedding
    /// and the LM head stay dense. Quantised modes need --dtype f16 or bf16.
    #[arg(long, default_value = load::QUANT_AUTO,
          value_parser = clap::builder::PossibleValuesParser::new(load::QUANT_ARGS))]
    quant: String,
    /// Decode without the CUDA graph (each kernel launched every step).
    #[arg(long)]
    no_graph: bool,
    /// Tensor parallelism: split the model over GPUs 0..N (one rank per GPU, NCCL between
    /// them; CUDA_VISIBLE_DEVICES picks which). Heads, intermediate width and (when it
    /// divides) the vocabulary are split; key/value heads are split or replicated.
    #[arg(long, default_value_t = 1, value_parser = parse_tp)]
    tp: usize,
}

/// `--tp`: a GPU count, 1 to 64.
fn parse_tp(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n @ 1..=64) => Ok(n),
        _ => Err(format!("`{s}` is not a GPU count from 1 to 64")),
    }
}

/// A token count of at least 1.
fn parse_tokens(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("`{s}` is not a token count of at least 1")),
    }
}

/// `K/N` with 1 <= K <= N.
fn parse_part(s: &str) -> std::result::Result<(usize, usize), String> {
    let bad = || format!("`{s}` is not K/N with 1 <= K <= N");
    let (k, n) = s.split_once('/').ok_or_else(bad)?;
    match (k.trim().parse::<usize>(), n.trim().parse::<usize>()) {
        (Ok(k), Ok(n)) if 1 <= k && k <= n => Ok((k, n)),
        _ => Err(bad()),
    }
}

/// How the continuous-batching runner sizes its KV pool and its steps.
#[derive(clap::Args, Clone)]
struct RunnerArgs {
    /// Fraction of the GPU memory left after the weights and a full step's activations that
    /// the paged KV cache takes.
    #[arg(long, default_value_t = 0.9)]
    kv_memory: f64,
    /// Tokens one step computes at most: running decodes first, then prompt chunks.
    #[arg(long, default_value_t = 8192)]
    max_batched_tokens: usize,
    /// Sequences one step runs at most.
    #[arg(long, default_value_t = 256)]
    max_num_seqs: usize,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Do not reuse the KV blocks of shared prompt prefixes.
    #[arg(long)]
    no_prefix_cache: bool,
    /// Longest sequence (prompt + generated) the runner accepts; default the model's context.
    /// Smaller values shrink each step's block table.
    #[arg(long)]
    max_model_len: Option<usize>,
    /// Most prompt tokens (all requests together) in a step that also decodes running
    /// requests (default: up to --max-batched-tokens). A small budget keeps the running
    /// requests' inter-token latency even while prompts arrive, and spreads prompts that
    /// arrive together over steps.
    #[arg(long, value_parser = parse_tokens)]
    max_prefill_tokens_beside_decodes: Option<usize>,
}

impl RunnerArgs {
    fn config(&self) -> RunnerConfig {
        RunnerConfig {
            kv_memory: self.kv_memory,
            block_size: self.block_size,
            max_batched_tokens: self.max_batched_tokens,
            max_num_seqs: self.max_num_seqs,
            max_model_len: self.max_model_len,
            enable_prefix_cache: !self.no_prefix_cache,
            num_blocks: None,
            max_prefill_tokens_beside_decodes: self.max_prefill_tokens_beside_decodes,
        }
    }
}

fn main() {
    // Tensor parallelism (`--tp`): NCCL connects every channel at init rather than at a
    // collective's first use, which may sit inside a CUDA graph capture. Set here, while the
    // process has one thread (TpEngine::load sets it too, if nobody has).
    if std::env::var_os("NCCL_RUNTIME_CONNECT").is_none() {
        std::env::set_var("NCCL_RUNTIME_CONNECT", "0");
    }
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Info { path: None } => with_gpu(info),
        Cmd::Info { path: Some(p) } => gguf_info(&p),
        Cmd::Demo { n } => with_gpu(|g| demo(g, n)),
        Cmd::Embed(a) => embed::embed(&a),
        Cmd::Rerank(a) => embed::rerank(&a),
        Cmd::EmbedBench(a) => embed_bench::embed_bench(&a),
        Cmd::Calibrate(a) => calibrate::calibrate(&a),
        Cmd::Generate {
            model,
            prompt,
            prompt_ids,
            max_new_tokens,
            temperature,
            top_k,
            top_p,
            seed,
            print_ids,
            num_beams,
            length_penalty,
            early_stopping,
            num_return_sequences,
            runner,
        } => {
            let beam = (num_beams > 1).then(|| {
                let mut b = BeamParams::new(num_beams, max_new_tokens);
                b.length_penalty = length_penalty;
                b.num_return_sequences = num_return_sequences;
                b.early_stopping = match early_stopping.as_str() {
                    "true" => EarlyStopping::True,
                    "never" => EarlyStopping::Never,
                    _ => EarlyStopping::False,
                };
                b
            });
            let g = GenArgs {
                beam,
                prompt,
                prompt_ids,
                max_new_tokens,
                sampling: SamplingParams {
                    temperature,
                    top_k,
                    top_p,
                    seed,
                    ..Default::default()
                },
                print_ids,
            };
            dispatch!(model, |e, m| generate(e, &m, &g, &runner.config()))
        }
        Cmd::Bench {
            model,
            batch,
            prompt_len,
            gen_len,
            json,
            runs,
            runner,
            num_beams,
            trace,
            trace_file,
            rate,
            prompt_lens,
            output_lens,
            trace_seed,
            shared_prefix,
            trace_static,
            trace_static_part,
            runner_args,
        } => dispatch!(model, |e, _m| {
            let rcfg = runner_args.config();
            if trace.is_some() || trace_file.is_some() {
                let requests = match &trace_file {
                    Some(f) => {
                        let text = std::fs::read_to_string(f).map_err(|x| {
                            EngineError::invalid("--trace-file", format!("{}: {x}", f.display()))
                        })?;
                        fl_engine::trace::parse_trace_json(&text)?
                    }
                    None => fl_engine::trace::TraceSpec {
                        requests: trace.unwrap_or(0),
                        rate,
                        prompt: fl_engine::trace::Lengths::parse(&prompt_lens)?,
                        output: fl_engine::trace::Lengths::parse(&output_lens)?,
                        seed: trace_seed,
                    }
                    .generate()?,
                };
                let t = bench::TraceRun {
                    requests: &requests,
                    shared_prefix,
                    json,
                };
                if trace_static || trace_static_part.is_some() {
                    let one = e.single().ok_or_else(|| {
                        EngineError::invalid(
                            "--trace-static",
                            "the static engine runs on one GPU: drop --tp",
                        )
                    })?;
                    bench::trace_static(one, &t, rcfg.max_num_seqs, trace_static_part)?;
                    if trace_static_part.is_some() {
                        return Ok(());
                    }
                }
                return bench::trace(e, &t, &rcfg);
            }
            let list = match &runs {
                Some(r) => bench::parse_runs(r)?,
                None => vec![(batch, prompt_len, gen_len)],
            };
            if let Some(k) = num_beams {
                for (b, p, g) in list {
                    bench::beams(e, b, k, p, g, json, &rcfg)?;
                }
                return Ok(());
            }
            if e.tp() > 1 && !runner {
                eprintln!("fl bench: with --tp the shapes run through the runner (the static engine runs on one GPU)");
            }
            for (b, p, g) in list {
                // The static engine runs on one GPU; tensor-parallel runs go through the runner.
                let mut results = match e.single() {
                    Some(one) => vec![bench::fixed(one, b, p, g, json)],
                    None => vec![],
                };
                if runner || e.tp() > 1 {
                    results.push(bench::runner(e, b, p, g, json, &rcfg));
                }
                for res in results {
                    match res {
                        Ok(()) => {}
                        // A shape that does not fit is reported and the next one runs.
                        Err(x @ EngineError::Invalid { .. }) if runs.is_some() || runner => {
                            println!("batch {b}, prompt {p}, generate {g}: {x}")
                        }
                        Err(x) => return Err(x),
                    }
                }
            }
            Ok(())
        }),
        Cmd::Logits {
            model,
            input,
            out,
            runner,
        } => dispatch!(model, |e, _m| logits(e, &input, &out, &runner.config())),
        Cmd::Serve {
            model,
            serve,
            runner,
        } => serve::run(model, serve, runner.config()),
    };
    if let Err(e) = res {
        eprintln!("fl: {e}");
        std::process::exit(match e {
            EngineError::Kernels(fl_kernels::Error::NoGpu(_)) => 2,
            _ => 1,
        });
    }
}

fn with_gpu(f: impl FnOnce(&fl_kernels::Gpu) -> Result<()>) -> Result<()> {
    let gpu = match fl_kernels::Gpu::new(0) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("fl: {e}; this command needs an NVIDIA GPU (compute capability 8.0+)");
            std::process::exit(2);
        }
    };
    f(&gpu)
}

fn info(gpu: &fl_kernels::Gpu) -> Result<()> {
    let (maj, min) = gpu.compute_capability();
    println!(
        "{}: compute capability {maj}.{min}, {} SMs",
        gpu.name()?,
        gpu.sm_count()
    );
    Ok(())
}

fn gguf_info(path: &std::path::Path) -> Result<()> {
    let f = fl_engine::gguf::GgufFile::open(path)
        .map_err(|e| EngineError::invalid("PATH", e.to_string()))?;
    print!("{}", f.summary());
    Ok(())
}

fn demo(gpu: &fl_kernels::Gpu, n: usize) -> Result<()> {
    info(gpu)?;
    if n == 0 {
        return Err(EngineError::invalid("--n", "must be at least 1"));
    }
    println!(
        "{:<10} {:>12} {:>10} {:>10} {:>9}",
        "op", "elements", "rel err", "us", "GB/s"
    );
    let mut ok = true;
    for l in fl_engine::demo::run(gpu, n)? {
        println!(
            "{:<10} {:>12} {:>10.2e} {:>10.1} {:>9.0}",
            l.what, l.n, l.rel_err, l.us, l.gbps
        );
        ok &= l.rel_err < 1e-5;
    }
    if !ok {
        return Err(EngineError::invalid(
            "demo",
            "a kernel disagreed with its reference",
        ));
    }
    Ok(())
}

struct GenArgs {
    /// Beam search instead of sampling (`--num-beams` > 1).
    beam: Option<BeamParams>,
    prompt: Option<String>,
    prompt_ids: Option<String>,
    max_new_tokens: usize,
    sampling: SamplingParams,
    print_ids: bool,
}

fn parse_ids(arg: &'static str, s: &str) -> Result<Vec<u32>> {
    s.split(',')
        .map(|t| t.trim())
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<u32>()
                .map_err(|_| EngineError::invalid(arg, format!("`{t}` is not a token id")))
        })
        .collect()
}

fn generate<T: RunDType>(
    e: &mut AnyEngine<T>,
    m: &Loaded,
    g: &GenArgs,
    rcfg: &RunnerConfig,
) -> Result<()> {
    let tok = m.tokenizer.as_ref();
    if let (Some(ids), Some(b)) = (&g.prompt_ids, &g.beam) {
        if ids.contains(';') {
            let prompts = ids
                .split(';')
                .map(|p| parse_ids("--prompt-ids", p))
                .collect::<Result<Vec<_>>>()?;
            let mut b = b.clone();
            b.eos_token_ids = e.config().eos_token_ids.clone();
            return generate_beams(e, tok, prompts, b, g, rcfg);
        }
    }
    let prompt = match (&g.prompt, &g.prompt_ids) {
        (_, Some(ids)) if ids.contains(';') => {
            return Err(EngineError::invalid(
                "--prompt-ids",
                "several prompts (`;`) need --num-beams",
            ))
        }
        (_, Some(ids)) => parse_ids("--prompt-ids", ids)?,
        (Some(text), None) => match tok {
            Some(t) => t.encode(text, true)?,
            None => {
                return Err(EngineError::invalid(
                    "--prompt",
                    "this model has no tokenizer.json; pass --prompt-ids",
                ))
            }
        },
        (None, None) => {
            return Err(EngineError::invalid(
                "--prompt",
                "give --prompt TEXT or --prompt-ids IDS",
            ))
        }
    };
    let eos = e.config().eos_token_ids.clone();
    let n_prompt = prompt.len();
    if let Some(b) = &g.beam {
        let mut b = b.clone();
        b.eos_token_ids = eos;
        return generate_beams(e, tok, vec![prompt], b, g, rcfg);
    }
    // One request: a pool just large enough for it (prompt + new tokens).
    let cfg = RunnerConfig {
        max_num_seqs: 1,
        num_blocks: Some((n_prompt + g.max_new_tokens).div_ceil(rcfg.block_size.max(1))),
        ..rcfg.clone()
    };
    let mut r = e.runner(&cfg)?;
    let mut params = RequestParams::<SamplingParams>::new(g.max_new_tokens);
    params.eos_token_ids = eos;
    params.seed = g.sampling.seed;
    params.sampling = g.sampling;
    // Text out through the server's windowed detokenizer (the prompt's tail as context).
    let mut stream = match (tok, g.print_ids) {
        (Some(t), false) => Some((t, Detokenizer::new(&prompt))),
        _ => None,
    };
    r.add_request(Request {
        id: 0,
        prompt,
        params,
    })?;
    let t0 = std::time::Instant::now();
    let (mut first, mut n, mut graph) = (None, 0usize, false);
    while r.has_unfinished() {
        let events = r.step()?;
        graph |= r.last_step().graph;
        for ev in events {
            if let Event::Token { token, .. } = ev {
                first.get_or_insert_with(|| t0.elapsed().as_secs_f64());
                match stream.as_mut() {
                    Some((t, d)) => print!("{}", d.push(*t, token).map_err(text_err)?),
                    None => print!("{}{token}", if n == 0 { "" } else { "," }),
                }
                n += 1;
                let _ = std::io::stdout().flush();
            }
        }
    }
    if let Some((t, d)) = stream.as_mut() {
        print!("{}", d.finish(*t).map_err(text_err)?);
    }
    println!();
    let total = t0.elapsed().as_secs_f64();
    let first = first.unwrap_or(total);
    eprintln!(
        "fl: {n_prompt} prompt tokens, first token after {:.1} ms, {n} new tokens, decode {:.1} tokens/s{}",
        first * 1e3,
        n.saturating_sub(1) as f64 / (total - first).max(1e-9),
        if graph { " (CUDA graph)" } else { "" }
    );
    Ok(())
}

/// `fl generate --num-beams N`: one beam request per prompt, run together; the hypotheses
/// printed after the search (prefixed by the prompt's index when there are several).
fn generate_beams<T: RunDType>(
    e: &mut AnyEngine<T>,
    tok: Option<&fl_engine::tokenizer::Tokenizer>,
    prompts: Vec<Vec<u32>>,
    beam: BeamParams,
    g: &GenArgs,
    rcfg: &RunnerConfig,
) -> Result<()> {
    beam.validate()?;
    let (k, bs) = (beam.num_beams, rcfg.block_size.max(1));
    // A pool for each prompt's shared blocks and its beams' own.
    let blocks: usize = prompts
        .iter()
        .map(|p| p.len() / bs + k * (p.len() % bs + beam.max_new_tokens).div_ceil(bs))
        .sum();
    let cfg = RunnerConfig {
        max_num_seqs: k * prompts.len(),
        num_blocks: Some(blocks),
        ..rcfg.clone()
    };
    let mut r = e.runner(&cfg)?;
    for (i, prompt) in prompts.iter().enumerate() {
        let mut params = RequestParams::<SamplingParams>::new(beam.max_new_tokens);
        params.sampling = g.sampling;
        let req = Request {
            id: i as u64,
            prompt: prompt.clone(),
            params,
        };
        r.add_beam_request(req, beam.clone())?;
    }
    let t0 = std::time::Instant::now();
    let mut steps = 0usize;
    while r.has_unfinished() {
        r.step()?;
        steps += 1;
    }
    let total = t0.elapsed().as_secs_f64();
    let mut n = 0;
    for i in 0..prompts.len() {
        let hyps = r.take_beams(i as u64).unwrap_or_default();
        n += hyps.len();
        for (ids, score) in &hyps {
            let text = match (tok, g.print_ids) {
                (Some(t), false) => t.decode(ids)?,
                _ => ids.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
            };
            if prompts.len() > 1 {
                print!("{i}\t");
            }
            println!("{score:.6}\t{text}");
        }
    }
    let n_prompt: usize = prompts.iter().map(Vec::len).sum();
    eprintln!(
        "fl: {} prompt(s), {n_prompt} prompt tokens, {k} beams, {steps} steps in {:.1} ms, {n} hypotheses",
        prompts.len(),
        total * 1e3,
    );
    Ok(())
}

fn logits<T: RunDType>(
    e: &mut AnyEngine<T>,
    input: &PathBuf,
    out_path: &PathBuf,
    rcfg: &RunnerConfig,
) -> Result<()> {
    let file_err = |p: &PathBuf, d: String| EngineError::File {
        path: p.clone(),
        detail: d,
    };
    let text = std::fs::read_to_string(input).map_err(|x| file_err(input, x.to_string()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|x| file_err(input, x.to_string()))?;
    let ids = |key: &str| -> Result<Option<Vec<Vec<u32>>>> {
        match v.get(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(x) => serde_json::from_value(x.clone())
                .map(Some)
                .map_err(|x| file_err(input, format!("`{key}`: {x}"))),
        }
    };
    let prompts = ids("prompts")?.ok_or_else(|| file_err(input, "no `prompts`".into()))?;
    let forced = ids("forced")?.unwrap_or_default();
    if !forced.is_empty() && forced.len() != prompts.len() {
        return Err(EngineError::invalid(
            "forced",
            format!("{} lists for {} prompts", forced.len(), prompts.len()),
        ));
    }
    let steps = v.get("steps").and_then(|s| s.as_u64()).unwrap_or(0) as usize;
    // Every prompt is a request of its own in one runner (they share steps); its logits are
    // kept per generated token. A pool just large enough for all of them.
    let bs = rcfg.block_size.max(1);
    let cfg = RunnerConfig {
        max_num_seqs: prompts.len().max(1),
        num_blocks: Some(
            prompts
                .iter()
                .map(|p| (p.len() + steps + 1).div_ceil(bs))
                .sum::<usize>()
                .max(1),
        ),
        ..rcfg.clone()
    };
    let mut r = e.runner(&cfg)?;
    for (b, p) in prompts.iter().enumerate() {
        let mut params = RequestParams::<SamplingParams>::new(steps + 1);
        params.ignore_eos = true;
        params.sampling = SamplingParams::greedy();
        let opts = RequestOptions {
            forced: forced.get(b).cloned().unwrap_or_default(),
            logits: true,
        };
        r.add_request_with(
            Request {
                id: b as u64,
                prompt: p.clone(),
                params,
            },
            opts,
        )
        .map_err(|x| match x {
            EngineError::Request(q) => EngineError::invalid("prompts", format!("prompt {b}: {q}")),
            x => x,
        })?;
    }
    let mut graph = false;
    while r.has_unfinished() {
        r.step()?;
        graph |= r.last_step().graph;
    }
    let mut prefill = Vec::with_capacity(prompts.len());
    let mut per_step = vec![Vec::with_capacity(prompts.len()); steps];
    let mut tokens = Vec::with_capacity(prompts.len());
    for b in 0..prompts.len() {
        let rows = r.take_logits(b as u64).unwrap_or_default();
        // The greedy choice of each row (lowest index of the largest logit), forced or not.
        tokens.push(rows.iter().map(|l| argmax(l)).collect::<Vec<u32>>());
        let mut it = rows.into_iter();
        prefill.push(it.next().unwrap_or_default());
        for (s, row) in it.enumerate().take(steps) {
            per_step[s].push(row);
        }
    }
    let j = serde_json::json!({
        "prefill": prefill,
        "steps": per_step,
        "tokens": tokens,
        "dtype": <T as fl_kernels::DType>::NAME,
        "graph": graph,
    });
    std::fs::write(out_path, j.to_string()).map_err(|x| file_err(out_path, x.to_string()))?;
    Ok(())
}

/// Lowest index of the largest value (NaN reads as -inf), as the greedy sampler picks.
fn argmax(row: &[f32]) -> u32 {
    let mut best = (0u32, f32::NEG_INFINITY);
    for (i, &x) in row.iter().enumerate() {
        if x > best.1 {
            best = (i as u32, x);
        }
    }
    best.0
}

#[cfg(test)]
mod tests {
    use super::{parse_part, parse_tokens, Cli};
    use clap::Parser;

    #[test]
    fn trace_parts_parse_and_refuse_with_the_value() {
        assert_eq!(parse_part("1/2"), Ok((1, 2)));
        assert_eq!(parse_part(" 3 / 3 "), Ok((3, 3)));
        for bad in ["0/2", "3/2", "1", "a/b", "1/0", ""] {
            let e = parse_part(bad).expect_err(bad);
            assert!(e.contains(&format!("`{bad}`")), "{e}");
        }
    }

    #[test]
    fn prefill_chunk_beside_decodes_is_a_positive_token_count() {
        assert_eq!(parse_tokens("256"), Ok(256));
        for bad in ["0", "-1", "x", ""] {
            assert!(parse_tokens(bad)
                .expect_err(bad)
                .contains(&format!("`{bad}`")));
        }
        let args = [
            "fl",
            "serve",
            "--model",
            "m",
            "--max-prefill-tokens-beside-decodes",
            "0",
        ];
        let e = match Cli::try_parse_from(args) {
            Ok(_) => panic!("0 is refused"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("--max-prefill-tokens-beside-decodes"), "{e}");
        let args = [
            "fl",
            "bench",
            "--model",
            "m",
            "--max-prefill-tokens-beside-decodes",
            "128",
        ];
        if let Err(e) = Cli::try_parse_from(args) {
            panic!("{e}");
        }
    }
}
