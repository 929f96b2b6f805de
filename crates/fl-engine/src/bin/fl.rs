//! The `fl` command.

use std::io::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use fl_engine::dtype::RunDType;
use fl_engine::engine::{Engine, Request, Step, StepNeeds};
use fl_engine::linear::Quant;
use fl_engine::{load, EngineError, Loaded, Result};
use fl_sampling::SamplingParams;

/// Loads the model named by a `ModelArgs` in its dtype and runs `$body(engine, loaded)`.
macro_rules! dispatch {
    ($m:expr, |$e:ident, $l:ident| $body:expr) => {{
        let m = $m;
        (|| -> Result<()> {
            let $l = load::resolve(&m.model, &m.quant)?;
            match m.dtype.as_str() {
                "f32" => {
                    let mut $e = load::engine::<f32>(&$l, !m.no_graph)?;
                    let $e = &mut $e;
                    $body
                }
                "bf16" => {
                    let mut $e = load::engine::<fl_kernels::bf16>(&$l, !m.no_graph)?;
                    let $e = &mut $e;
                    $body
                }
                _ => {
                    let mut $e = load::engine::<fl_kernels::f16>(&$l, !m.no_graph)?;
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
        /// Prompt as comma-separated token ids (for models without a tokenizer).
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
    },
    /// Run the kernel demo: elementwise kernels checked against the CPU and timed.
    Demo {
        /// Elements per call.
        #[arg(long, default_value_t = 1 << 26)]
        n: usize,
    },
    /// Print the GPU this machine has.
    Info,
}

#[derive(clap::Args)]
struct ModelArgs {
    /// A model directory (config.json + safetensors) or a preset name for dummy weights
    /// (llama-2-7b, llama-2-13b, llama-3-8b, tiny).
    #[arg(long)]
    model: String,
    /// Run dtype: weights, activations and KV cache (f32 runs every projection on cuBLASLt in
    /// f32, no TF32, for checks against an fp32 reference).
    #[arg(long, default_value = "f16", value_parser = ["f16", "bf16", "f32"])]
    dtype: String,
    /// Quantise the decoder's linear layers on load: weight-only int8 (per output channel),
    /// int4 (symmetric, groups of 128 along k; int4-g64, int4-g32), llama.cpp q8_0 / q4_0, or
    /// w8a8 (int8 weights and per-token int8 activations, int8 tensor-core GEMMs). The
    /// embedding and the LM head stay dense. Needs --dtype f16 or bf16.
    #[arg(long, default_value = "none",
          value_parser = clap::builder::PossibleValuesParser::new(Quant::NAMES))]
    quant: String,
    /// Decode without the CUDA graph (each kernel launched every step).
    #[arg(long)]
    no_graph: bool,
}

fn main() {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Info => with_gpu(info),
        Cmd::Demo { n } => with_gpu(|g| demo(g, n)),
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
        } => {
            let g = GenArgs {
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
            dispatch!(model, |e, m| generate(e, &m, &g))
        }
        Cmd::Bench {
            model,
            batch,
            prompt_len,
            gen_len,
            json,
            runs,
            runner,
            trace,
            trace_file,
            rate,
            prompt_lens,
            output_lens,
            trace_seed,
        } => dispatch!(model, |e, _m| {
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
                return trace_bench(e, &requests, json);
            }
            let list = match &runs {
                Some(r) => parse_runs(r)?,
                None => vec![(batch, prompt_len, gen_len)],
            };
            for (b, p, g) in list {
                let mut results = vec![bench(e, b, p, g, json)];
                if runner {
                    results.push(runner_bench(e, b, p, g, json));
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
        Cmd::Logits { model, input, out } => dispatch!(model, |e, _m| logits(e, &input, &out)),
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

fn generate<T: RunDType>(e: &mut Engine<T>, m: &Loaded, g: &GenArgs) -> Result<()> {
    let tok = m.tokenizer.as_ref();
    let prompt = match (&g.prompt, &g.prompt_ids) {
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
    let req = Request {
        prompts: vec![prompt],
        max_new_tokens: g.max_new_tokens,
        sampling: vec![g.sampling],
        end_ids: e.model.cfg.eos_token_ids.clone(),
        ignore_eos: false,
        forced: None,
    };
    let mut stream = match (tok, g.print_ids) {
        (Some(t), false) => Some(fl_engine::tokenizer::TextStream::new(t)),
        _ => None,
    };
    let mut err: Option<EngineError> = None;
    let out = e.generate(
        &req,
        StepNeeds {
            tokens: true,
            logits: false,
        },
        &mut |s: Step<'_>| {
            let id = s.tokens[0];
            match stream.as_mut() {
                Some(ts) => match ts.push(id) {
                    Ok(text) => print!("{text}"),
                    Err(x) => {
                        err = Some(x);
                        return false;
                    }
                },
                None => print!("{}{id}", if s.index == 0 { "" } else { "," }),
            }
            let _ = std::io::stdout().flush();
            true
        },
    )?;
    if let Some(x) = err {
        return Err(x);
    }
    println!();
    let n = out.tokens[0].len();
    eprintln!(
        "fl: {} prompt tokens in {:.1} ms, {n} new tokens, decode {:.1} tokens/s{}",
        out.prompt_tokens,
        out.prefill_s * 1e3,
        out.decode_steps as f64 / out.decode_s.max(1e-9),
        if out.graph { " (CUDA graph)" } else { "" }
    );
    Ok(())
}

fn parse_runs(s: &str) -> Result<Vec<(usize, usize, usize)>> {
    s.split(',')
        .map(|r| {
            let v: Vec<usize> = r
                .split(':')
                .map(|x| x.trim().parse::<usize>())
                .collect::<std::result::Result<_, _>>()
                .map_err(|_| {
                    EngineError::invalid("--runs", format!("`{r}` is not BATCH:PROMPT:GEN"))
                })?;
            match v[..] {
                [b, p, g] => Ok((b, p, g)),
                _ => Err(EngineError::invalid(
                    "--runs",
                    format!("`{r}` is not BATCH:PROMPT:GEN"),
                )),
            }
        })
        .collect()
}

fn bench<T: RunDType>(
    e: &mut Engine<T>,
    batch: usize,
    prompt_len: usize,
    gen_len: usize,
    json: bool,
) -> Result<()> {
    if batch == 0 {
        return Err(EngineError::invalid("--batch", "must be at least 1"));
    }
    if prompt_len == 0 {
        return Err(EngineError::invalid("--prompt-len", "must be at least 1"));
    }
    if gen_len < 2 {
        return Err(EngineError::invalid("--gen-len", "must be at least 2"));
    }
    let vocab = e.model.cfg.vocab_size as u32;
    let prompts: Vec<Vec<u32>> = (0..batch)
        .map(|b| dummy_prompt(b, prompt_len, vocab))
        .collect();
    let req = Request {
        prompts,
        max_new_tokens: gen_len,
        sampling: vec![SamplingParams::greedy()],
        end_ids: Vec::new(),
        ignore_eos: true,
        forced: None,
    };
    e.check(&req)?;
    let bw = e.copy_bandwidth()?;
    // Warm-up (cuBLASLt plans, module loading), then the measured run.
    let warm = Request {
        max_new_tokens: 3,
        ..req.clone()
    };
    e.generate(&warm, StepNeeds::default(), &mut |_| true)?;
    let out = e.generate(&req, StepNeeds::default(), &mut |_| true)?;
    let steps = out.decode_steps.max(1) as f64;
    let ms_per_step = out.decode_s * 1e3 / steps;
    let decode_tps = batch as f64 * steps / out.decode_s;
    let prefill_tps = out.prompt_tokens as f64 / out.prefill_s;
    let weight_bytes = e.model.weights.bytes_per_step() as f64;
    let kv_per_step = out.kv_bytes_read as f64 / steps;
    let floor_ms = (weight_bytes + kv_per_step) / bw * 1e3;
    let pct = 100.0 * floor_ms / ms_per_step;
    if json {
        println!(
            "{{\"batch\":{batch},\"prompt_len\":{prompt_len},\"gen_len\":{gen_len},\"dtype\":\"{}\",\"quant\":\"{}\",\"prefill_tokens_per_s\":{prefill_tps:.1},\"prefill_ms\":{:.3},\"decode_tokens_per_s\":{decode_tps:.1},\"ms_per_step\":{ms_per_step:.4},\"floor_ms\":{floor_ms:.4},\"pct_of_floor\":{pct:.1},\"copy_gbps\":{:.1},\"graph\":{}}}",
            <T as fl_kernels::DType>::NAME,
            e.model.weights.quant,
            out.prefill_s * 1e3,
            bw / 1e9,
            out.graph
        );
    } else {
        println!(
            "model {} ({}, --quant {}, {:.2} GB of weights read per step), copy bandwidth {:.0} GB/s",
            e.model.cfg.architecture.model_type(),
            <T as fl_kernels::DType>::NAME,
            e.model.weights.quant,
            weight_bytes / 1e9,
            bw / 1e9
        );
        println!(
            "batch {batch}, prompt {prompt_len}, generate {gen_len}{}",
            if out.graph {
                ", decode step in a CUDA graph"
            } else {
                ""
            }
        );
        println!(
            "prefill: {:.1} ms, {prefill_tps:.0} tokens/s",
            out.prefill_s * 1e3
        );
        println!(
            "decode:  {ms_per_step:.3} ms/step, {decode_tps:.1} tokens/s; floor {floor_ms:.3} ms/step (weights {:.2} GB + KV {:.3} GB) = {pct:.1}% of the bandwidth floor",
            weight_bytes / 1e9,
            kv_per_step / 1e9
        );
    }
    Ok(())
}

fn logits<T: RunDType>(e: &mut Engine<T>, input: &PathBuf, out_path: &PathBuf) -> Result<()> {
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
    let forced = ids("forced")?;
    let steps = v.get("steps").and_then(|s| s.as_u64()).unwrap_or(0) as usize;
    let req = Request {
        prompts,
        max_new_tokens: steps + 1,
        sampling: vec![SamplingParams::greedy()],
        end_ids: Vec::new(),
        ignore_eos: true,
        forced,
    };
    let vocab = e.model.cfg.vocab_size;
    let mut prefill: Vec<Vec<f32>> = Vec::new();
    let mut per_step: Vec<Vec<Vec<f32>>> = Vec::new();
    let out = e.generate(
        &req,
        StepNeeds {
            tokens: true,
            logits: true,
        },
        &mut |s: Step<'_>| {
            let rows: Vec<Vec<f32>> = s
                .logits
                .unwrap_or(&[])
                .chunks(vocab)
                .map(|r| r.to_vec())
                .collect();
            if s.index == 0 {
                prefill = rows;
            } else {
                per_step.push(rows);
            }
            true
        },
    )?;
    let j = serde_json::json!({
        "prefill": prefill,
        "steps": per_step,
        "tokens": out.tokens,
        "dtype": <T as fl_kernels::DType>::NAME,
        "graph": out.graph,
    });
    std::fs::write(out_path, j.to_string()).map_err(|x| file_err(out_path, x.to_string()))?;
    Ok(())
}

/// `fl bench --runner`: the same shape through [`fl_engine::runner::Runner`]: `batch` requests of `prompt_len`
/// dummy tokens queued at once, `gen_len` tokens each (end ids ignored), greedy.
fn runner_bench<T: RunDType>(
    e: &mut Engine<T>,
    batch: usize,
    prompt_len: usize,
    gen_len: usize,
    json: bool,
) -> Result<()> {
    use fl_engine::runner::{Runner, RunnerConfig};
    use fl_engine::scheduler::Event;
    let vocab = e.model.cfg.vocab_size as u32;
    let cfg = RunnerConfig {
        max_num_seqs: batch.max(1),
        ..Default::default()
    };
    let mut r = Runner::new(e, &cfg)?;
    // Request b gets the static run's prompt b.
    let request = |id: u64, new: usize| {
        greedy_request(
            id,
            dummy_prompt(id as usize % batch.max(1), prompt_len, vocab),
            new,
        )
    };
    // Warm-up: one short request (module loading, cuBLASLt plans, buffer buckets).
    r.add_request(request(u64::MAX, 2))?;
    r.run_to_completion()?;
    for b in 0..batch {
        r.add_request(request(b as u64, gen_len))?;
    }
    let t0 = std::time::Instant::now();
    let (mut tokens, mut steps) = (0usize, 0usize);
    let (mut decode_s, mut decode_tokens, mut decode_steps) = (0f64, 0usize, 0usize);
    let mut started = std::collections::HashSet::new();
    let mut all_first = None;
    while r.has_unfinished() {
        let ts = std::time::Instant::now();
        let events = r.step()?; // waits for the step's tokens
        let dt = ts.elapsed().as_secs_f64();
        let st = r.last_step();
        if st.prefill_tokens == 0 && st.decode_tokens > 0 {
            decode_s += dt;
            decode_tokens += st.decode_tokens;
            decode_steps += 1;
        }
        for ev in events {
            if let Event::Token { id, .. } = ev {
                tokens += 1;
                started.insert(id);
            }
        }
        steps += 1;
        if all_first.is_none() && started.len() == batch {
            all_first = Some(t0.elapsed().as_secs_f64());
        }
    }
    let total = t0.elapsed().as_secs_f64();
    let ttft_all = all_first.unwrap_or(total);
    let out_tps = tokens as f64 / total;
    // Steps with decode tokens only (the steady state; steps mixing prefill chunks aside).
    let decode_tps = decode_tokens as f64 / decode_s.max(1e-9);
    let ms_per_step = 1e3 * decode_s / decode_steps.max(1) as f64;
    let preempt = r.scheduler().num_preemptions();
    if json {
        println!(
            "{{\"runner\":true,\"batch\":{batch},\"prompt_len\":{prompt_len},\"gen_len\":{gen_len},\"all_first_tokens_ms\":{:.3},\"output_tokens_per_s\":{out_tps:.1},\"decode_tokens_per_s\":{decode_tps:.1},\"decode_ms_per_step\":{ms_per_step:.4},\"decode_steps\":{decode_steps},\"steps\":{steps},\"preemptions\":{preempt}}}",
            ttft_all * 1e3
        );
    } else {
        println!(
            "runner: every first token after {:.1} ms; {out_tps:.1} output tokens/s overall; decode-only steps {ms_per_step:.3} ms/step, {decode_tps:.1} tokens/s ({decode_steps} of {steps} steps); {preempt} preemptions",
            ttft_all * 1e3
        );
    }
    Ok(())
}

/// `fl bench --trace`: replays `trace` through [`fl_engine::runner::Runner`] (requests join when
/// their arrival time has passed; dummy prompt ids, greedy, end ids ignored) and prints
/// throughput and latency percentiles. Requests that cannot fit the model's context are
/// counted and skipped.
fn trace_bench<T: RunDType>(
    e: &mut Engine<T>,
    trace: &[fl_engine::trace::TraceRequest],
    json: bool,
) -> Result<()> {
    use fl_engine::runner::{Runner, RunnerConfig};
    use fl_engine::scheduler::Event;
    use fl_engine::trace::Percentiles;
    use std::time::{Duration, Instant};
    let vocab = e.model.cfg.vocab_size as u32;
    let mut r = Runner::new(e, &RunnerConfig::default())?;
    let request = |id: u64, prompt_len: usize, new: usize| {
        greedy_request(id, dummy_prompt(id as usize, prompt_len, vocab), new)
    };
    // Warm-up: one short request (module loading, cuBLASLt plans).
    r.add_request(request(u64::MAX, 16, 2))?;
    r.run_to_completion()?;
    let n = trace.len();
    let (mut first, mut last) = (vec![None::<f64>; n], vec![0f64; n]);
    let (mut ttft, mut tpot, mut itl) = (vec![], vec![], vec![]);
    let (mut next, mut tokens, mut refused, mut steps) = (0usize, 0usize, 0usize, 0usize);
    let t0 = Instant::now();
    while next < n || r.has_unfinished() {
        let now = t0.elapsed().as_secs_f64();
        while next < n && trace[next].arrival_s <= now {
            let q = &trace[next];
            match r.add_request(request(next as u64, q.prompt_len, q.output_len)) {
                Ok(()) => {}
                Err(EngineError::Request(_)) => refused += 1,
                Err(x) => return Err(x),
            }
            next += 1;
        }
        if !r.has_unfinished() {
            if next < n {
                let wait = trace[next].arrival_s - t0.elapsed().as_secs_f64();
                std::thread::sleep(Duration::from_secs_f64(wait.max(0.0)));
            }
            continue;
        }
        let events = r.step()?; // waits for the step's tokens
        steps += 1;
        let t = t0.elapsed().as_secs_f64();
        for ev in events {
            match ev {
                Event::Token { id, .. } => {
                    let i = id as usize;
                    tokens += 1;
                    match first[i] {
                        None => {
                            first[i] = Some(t);
                            ttft.push(t - trace[i].arrival_s);
                        }
                        Some(_) => itl.push(t - last[i]),
                    }
                    last[i] = t;
                }
                Event::Finished { id, usage, .. } => {
                    let i = id as usize;
                    if let (Some(f), true) = (first[i], usage.completion_tokens > 1) {
                        tpot.push((last[i] - f) / (usage.completion_tokens - 1) as f64);
                    }
                }
            }
        }
    }
    let total = t0.elapsed().as_secs_f64();
    let served = n - refused;
    let ms = |p: Option<Percentiles>| {
        p.map_or([f64::NAN; 3], |p| [p.p50 * 1e3, p.p90 * 1e3, p.p99 * 1e3])
    };
    let (a, b, c) = (
        ms(Percentiles::of(&ttft)),
        ms(Percentiles::of(&tpot)),
        ms(Percentiles::of(&itl)),
    );
    let preempt = r.scheduler().num_preemptions();
    let hits = r.scheduler().kv_stats().prefix_hit_tokens;
    if json {
        println!(
            "{{\"trace\":true,\"requests\":{n},\"refused\":{refused},\"seconds\":{total:.3},\"output_tokens\":{tokens},\"output_tokens_per_s\":{:.1},\"requests_per_s\":{:.2},\"ttft_ms\":[{:.2},{:.2},{:.2}],\"tpot_ms\":[{:.3},{:.3},{:.3}],\"itl_ms\":[{:.3},{:.3},{:.3}],\"steps\":{steps},\"preemptions\":{preempt},\"prefix_hit_tokens\":{hits}}}",
            tokens as f64 / total, served as f64 / total, a[0], a[1], a[2], b[0], b[1], b[2], c[0], c[1], c[2]
        );
    } else {
        println!(
            "trace: {served} of {n} requests ({refused} refused: longer than the context) in {total:.2} s; {:.1} output tokens/s, {:.2} requests/s; {steps} steps, {preempt} preemptions, {hits} prefix-cache hit tokens",
            tokens as f64 / total,
            served as f64 / total
        );
        println!(
            "  TTFT ms p50 / p90 / p99: {:.1} / {:.1} / {:.1}",
            a[0], a[1], a[2]
        );
        println!(
            "  TPOT ms p50 / p90 / p99: {:.2} / {:.2} / {:.2}",
            b[0], b[1], b[2]
        );
        println!(
            "  inter-token ms p50 / p90 / p99: {:.2} / {:.2} / {:.2}",
            c[0], c[1], c[2]
        );
    }
    Ok(())
}

/// The benches' dummy prompt `seq`: `prompt_len` ids spread over the vocabulary.
fn dummy_prompt(seq: usize, prompt_len: usize, vocab: u32) -> Vec<u32> {
    (0..prompt_len)
        .map(|i| (seq.wrapping_mul(7919).wrapping_add(i * 104_729 + 1) as u32) % vocab)
        .collect()
}

/// A runner request of `prompt` for `new` greedy tokens, end ids ignored (the benches).
fn greedy_request(
    id: u64,
    prompt: Vec<u32>,
    new: usize,
) -> fl_engine::scheduler::Request<SamplingParams> {
    let mut params = fl_engine::scheduler::RequestParams::<SamplingParams>::new(new);
    params.ignore_eos = true;
    params.sampling = SamplingParams::greedy();
    fl_engine::scheduler::Request { id, prompt, params }
}
