//! What-if for the scheduler without a GPU: closed-loop clients driving the real
//! [`Scheduler`] whose steps take the time of a simple cost model, to compare step policies
//! (budget, `--max-prefill-tokens-beside-decodes`) on TTFT and inter-token latency before
//! measuring the chosen ones on the GPU.
//!
//! The cost of a step (defaults fitted to llama-2-7b f16 on one H100, `bench/RESULTS.md`:
//! 5.2 ms per batch-1 decode step, 13.1 ms at 64 x ~640 tokens of context, ~42k prompt tokens/s):
//!
//! ```text
//! step_ms = weights_ms + (context tokens the decode rows read) * kv_bytes / bandwidth
//!         + prompt tokens * prefill_us / 1000
//! ```
//!
//! A model, not a measurement: it has no attention cost for prompt chunks, no host time and
//! no GPU clock effects. Use it to rank policies, then measure the ranking. Before `--pad`
//! (when it priced only the prompt tokens) it predicted ITL p99 / p50 1.93x for a budget of
//! 512 where an H200 measured 3.66x: the runner had run those 575-row steps as 1,024 rows.
//!
//! ```text
//! cargo run --release -p fl-engine --example sched_sim -- --clients 64 --prompt 512 \
//!     --output 256 --chunks none,128,256,512
//! ```

use clap::Parser;
use fl_engine::scheduler::{
    Event, Request, RequestId, RequestParams, Scheduler, SchedulerConfig, StepPlan,
};
use fl_engine::trace::Percentiles;
use std::collections::HashMap;

#[derive(Parser, Debug)]
#[command(about = "Closed-loop clients on the scheduler with a step cost model (no GPU)")]
struct Args {
    /// Concurrent clients; each sends its next request when the last one finishes.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Requests per client.
    #[arg(long, default_value_t = 4)]
    requests: usize,
    /// Prompt tokens of every request.
    #[arg(long, default_value_t = 512)]
    prompt: usize,
    /// Prompt tokens shared by every request (a system prompt), within --prompt.
    #[arg(long, default_value_t = 0)]
    shared_prefix: usize,
    /// Output tokens of every request.
    #[arg(long, default_value_t = 256)]
    output: usize,
    /// Step token budget.
    #[arg(long, default_value_t = 8192)]
    max_batched_tokens: usize,
    /// Policies to compare: `none` or N (--max-prefill-tokens-beside-decodes), comma-separated.
    #[arg(long, default_value = "none,128,256,512,1024")]
    chunks: String,
    /// KV blocks of 16 tokens in the pool.
    #[arg(long, default_value_t = 7500)]
    num_blocks: usize,
    /// A step's fixed time (the weights' read), ms.
    #[arg(long, default_value_t = 5.15)]
    weights_ms: f64,
    /// KV bytes per token of context a decode row reads.
    #[arg(long, default_value_t = 524_288.0)]
    kv_bytes: f64,
    /// Bandwidth of those reads, bytes/s.
    #[arg(long, default_value_t = 2.8e12)]
    bandwidth: f64,
    /// Time per prompt token, us.
    #[arg(long, default_value_t = 23.0)]
    prefill_us: f64,
    /// Each request reaches the scheduler up to this long after its client sent it (uniform,
    /// seeded): HTTP, tokenisation and the engine loop's pick-up. It also spreads the first
    /// wave. 0 sends in lock step, which keeps every wave of requests together.
    #[arg(long, default_value_t = 20.0)]
    jitter_ms: f64,
    /// Rows a step with prompt tokens computes: `pow2` (the runner pads such a step to a
    /// power of two: a 575-row step runs 1,024 rows of GEMM), `64` (rounded up to a multiple
    /// of 64) or `exact`. The padding rows are priced as prompt tokens.
    #[arg(long, default_value = "pow2")]
    pad: String,
}

/// Rows a step of `m` tokens with prompt tokens computes under `--pad`.
fn run_rows(a: &Args, m: usize) -> usize {
    match a.pad.as_str() {
        "pow2" => m.next_power_of_two(),
        "64" if m > 64 => m.div_ceil(64) * 64,
        "64" => m.next_power_of_two(),
        _ => m,
    }
}

fn step_ms(a: &Args, plan: &StepPlan) -> f64 {
    let context: usize = plan
        .seqs
        .iter()
        .filter(|s| !s.is_prefill)
        .map(|s| s.num_computed_tokens + s.token_ids.len())
        .sum();
    let prompt_rows = if plan.num_prefill_tokens == 0 {
        0
    } else {
        run_rows(a, plan.num_scheduled_tokens) - plan.num_decode_tokens
    };
    a.weights_ms
        + context as f64 * a.kv_bytes / a.bandwidth * 1e3
        + prompt_rows as f64 * a.prefill_us * 1e-3
}

struct Outcome {
    ttft: Vec<f64>,
    itl: Vec<f64>,
    tokens: usize,
    seconds: f64,
    prefill_steps: usize,
    steps: usize,
}

fn simulate(a: &Args, chunk: Option<usize>) -> Outcome {
    let mut cfg = SchedulerConfig::new(a.num_blocks, a.prompt + a.output + 16);
    cfg.max_batched_tokens = a.max_batched_tokens;
    cfg.max_prefill_tokens_beside_decodes = chunk;
    let mut s = Scheduler::<()>::new(cfg).expect("scheduler config");
    let prompt = |id: u64| -> Vec<u32> {
        (0..a.prompt)
            .map(|i| {
                if i < a.shared_prefix {
                    3 + i as u32 % 1000
                } else {
                    3 + ((id as usize * 7919 + i * 104_729) % 30_000) as u32
                }
            })
            .collect()
    };
    let mut params = RequestParams::<()>::new(a.output);
    params.ignore_eos = true;
    // Per request: (client, sent at, last token at, tokens so far).
    let mut live: HashMap<RequestId, (usize, f64, f64, usize)> = HashMap::new();
    let mut sent = vec![0usize; a.clients];
    let mut next_id: u64 = 0;
    let mut now = 0.0f64;
    let mut out = Outcome {
        ttft: vec![],
        itl: vec![],
        tokens: 0,
        seconds: 0.0,
        prefill_steps: 0,
        steps: 0,
    };
    // Requests sent and not yet arrived: (arrival time, client, sent at).
    let mut pending: Vec<(f64, usize, f64)> = Vec::new();
    let mut rng: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut jitter = || {
        // xorshift64*: a fixed, seeded spread.
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        let u = (rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64;
        u * a.jitter_ms * 1e-3
    };
    for (c, n) in sent.iter_mut().enumerate() {
        pending.push((jitter(), c, 0.0));
        *n += 1;
    }
    loop {
        // Arrivals up to now join the queue; an idle engine waits for the next one.
        if !s.has_unfinished() {
            match pending.iter().map(|p| p.0).min_by(f64::total_cmp) {
                Some(t) => now = now.max(t),
                None => break,
            }
        }
        pending.sort_by(|x, y| x.0.total_cmp(&y.0));
        while pending.first().is_some_and(|p| p.0 <= now) {
            let (_, client, at) = pending.remove(0);
            let id = next_id;
            next_id += 1;
            s.add_request(Request {
                id,
                prompt: prompt(id),
                params: params.clone(),
            })
            .expect("request fits");
            live.insert(id, (client, at, at, 0));
        }
        let plan = s.schedule().expect("schedule");
        now += step_ms(a, &plan) * 1e-3;
        out.steps += 1;
        if plan.num_prefill_tokens > 0 {
            out.prefill_steps += 1;
        }
        let sampled: Vec<(RequestId, u32)> = plan.logits_ids().map(|id| (id, 7)).collect();
        for e in s.update(&plan, &sampled).expect("update") {
            match e {
                Event::Token { id, .. } => {
                    let r = live.get_mut(&id).expect("live request");
                    if r.3 == 0 {
                        out.ttft.push((now - r.1) * 1e3);
                    } else {
                        out.itl.push((now - r.2) * 1e3);
                    }
                    r.2 = now;
                    r.3 += 1;
                    out.tokens += 1;
                }
                Event::Finished { id, .. } => {
                    let (client, ..) = live.remove(&id).expect("live request");
                    if sent[client] < a.requests {
                        sent[client] += 1;
                        pending.push((now + jitter(), client, now));
                    }
                }
            }
        }
    }
    out.seconds = now;
    out
}

fn main() {
    let a = Args::parse();
    println!(
        "{} clients x {} requests, {} + {} tokens ({} shared), budget {}, arrivals spread over \
         {} ms; step = {:.2} ms + KV reads at {:.1} TB/s + {:.1} us per prompt row (rows: {}; a model)",
        a.clients,
        a.requests,
        a.prompt,
        a.output,
        a.shared_prefix,
        a.max_batched_tokens,
        a.jitter_ms,
        a.weights_ms,
        a.bandwidth / 1e12,
        a.prefill_us,
        a.pad
    );
    println!(
        "| prompt tokens beside decodes (a step) | output tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | p99 / p50 | steps (with prompt tokens) |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for c in a.chunks.split(',') {
        let chunk = match c.trim() {
            "none" => None,
            n => Some(n.parse::<usize>().expect("--chunks: none or token counts")),
        };
        let o = simulate(&a, chunk);
        // Nearest rank, as fl_loadgen and fl bench report them (NaN without samples).
        let p50_p99 =
            |v: &[f64]| Percentiles::of(v).map_or((f64::NAN, f64::NAN), |p| (p.p50, p.p99));
        let (ttft, itl) = (p50_p99(&o.ttft), p50_p99(&o.itl));
        println!(
            "| {} | {:.0} | {:.1} / {:.1} | {:.2} / {:.2} | {:.2}x | {} ({}) |",
            c.trim(),
            o.tokens as f64 / o.seconds,
            ttft.0,
            ttft.1,
            itl.0,
            itl.1,
            itl.1 / itl.0,
            o.steps,
            o.prefill_steps
        );
    }
}
