//! `fl bench`: the static engine's shapes, the runner on the same shapes, trace replays.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use fl_engine::dtype::RunDType;
use fl_engine::engine::{Engine, Request, StepNeeds};
use fl_engine::runner::RunnerConfig;
use fl_engine::scheduler::Event;
use fl_engine::tp::{AnyEngine, AnyRunner};
use fl_engine::trace::{Percentiles, TraceRequest};
use fl_engine::{EngineError, Result};
use fl_sampling::SamplingParams;

/// `--runs BATCH:PROMPT:GEN,...`.
pub fn parse_runs(s: &str) -> Result<Vec<(usize, usize, usize)>> {
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

/// Ids of the benches' warm-up requests (from here up, one per sequence of a batch): above
/// any measured request's id, below the beams' range (which the scheduler refuses).
const WARMUP_ID: u64 = 1 << 62;
const _: () = assert!(WARMUP_ID + (1 << 32) < fl_engine::scheduler::BEAM_ID_BASE);

/// The static engine on one shape: prefill, then decode against the bandwidth floor.
pub fn fixed<T: RunDType>(
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

/// `fl bench --runner`: the same shape through [`fl_engine::runner::Runner`]: `batch` requests
/// of `prompt_len` dummy tokens queued at once (`max_num_seqs` = `batch`), `gen_len` tokens
/// each (end ids ignored), greedy. Decode-only steps are timed against the bandwidth floor
/// (weights + the KV the step's attention reads, over the device copy bandwidth).
pub fn runner<T: RunDType>(
    e: &mut AnyEngine<T>,
    batch: usize,
    prompt_len: usize,
    gen_len: usize,
    json: bool,
    rcfg: &RunnerConfig,
) -> Result<()> {
    let vocab = e.config().vocab_size as u32;
    // Per GPU: a rank holds its share of the KV heads and of the weights.
    let kv_token = e
        .rank_config()
        .kv_cache_bytes_per_token(std::mem::size_of::<T>()) as f64;
    let weight_bytes = e.weight_bytes_per_step() as f64;
    let bw = e.copy_bandwidth()?;
    // Tensor-parallel: the all-reduces of a decode step (two per layer over [batch, hidden])
    // join the floor, timed on this group.
    let tp = e.tp();
    let layers = e.config().num_hidden_layers;
    let hidden = e.config().hidden_size;
    let (all_reduce_s, nccl_s, one_shot) = match e {
        AnyEngine::Tp(t) => {
            let elems = batch.max(1) * hidden;
            (
                t.time_all_reduce(elems, 50, false)?,
                t.time_all_reduce(elems, 50, true)?,
                t.takes_one_shot(elems)?,
            )
        }
        AnyEngine::One(_) => (0.0, 0.0, false),
    };
    let step_comm_s = 2.0 * layers as f64 * all_reduce_s;
    if tp > 1 && !json {
        let bytes = (batch.max(1) * hidden * std::mem::size_of::<T>()) as f64;
        let bus = |s: f64| 2.0 * (tp - 1) as f64 / tp as f64 * bytes / s.max(1e-12) / 1e9;
        let path = if one_shot {
            "one-shot over peer memory"
        } else {
            "NCCL"
        };
        println!(
            "tensor-parallel over {tp} GPUs: all-reduce of [{batch}, {hidden}] ({:.1} KB) {:.1} us ({path}), bus bandwidth {:.1} GB/s; NCCL {:.1} us ({:.1} GB/s); {} per decode step = {:.3} ms",
            bytes / 1e3,
            all_reduce_s * 1e6,
            bus(all_reduce_s),
            nccl_s * 1e6,
            bus(nccl_s),
            2 * layers,
            step_comm_s * 1e3
        );
    }
    let cfg = RunnerConfig {
        max_num_seqs: batch.max(1),
        ..rcfg.clone()
    };
    let mut r = e.runner(&cfg)?;
    // Request b gets the static run's prompt b.
    let request = |id: u64, new: usize| {
        greedy_request(
            id,
            dummy_prompt(id as usize % batch.max(1), prompt_len, vocab),
            new,
        )
    };
    // Warm-up: `batch` short requests (module loading, buffers, the CUDA graph of the
    // decode bucket), prompts unlike the measured ones so nothing is served from the prefix
    // cache.
    for b in 0..batch {
        let id = WARMUP_ID + b as u64;
        r.add_request(greedy_request(
            id,
            dummy_prompt(usize::MAX - b, 8, vocab),
            3,
        ))?;
    }
    r.run_to_completion()?;
    for b in 0..batch {
        r.add_request(request(b as u64, gen_len))?;
    }
    let t0 = Instant::now();
    let (mut tokens, mut steps) = (0usize, 0usize);
    let (mut decode_s, mut decode_tokens, mut decode_steps) = (0f64, 0usize, 0usize);
    let (mut floor_s, mut graphs, mut aheads) = (0f64, 0usize, 0usize);
    // Decode-only steps with every request in: (seconds, floor seconds, steps).
    let mut full = (0f64, 0f64, 0usize);
    let mut ctx = vec![prompt_len; batch];
    let mut started = HashSet::new();
    let mut all_first = None;
    while r.has_unfinished() {
        let ts = Instant::now();
        let events = r.step()?; // waits for the step's tokens
        let dt = ts.elapsed().as_secs_f64();
        let st = r.last_step();
        if st.prefill_tokens == 0 && st.decode_tokens > 0 {
            decode_s += dt;
            decode_tokens += st.decode_tokens;
            decode_steps += 1;
            graphs += st.graph as usize;
            aheads += st.ahead as usize;
            let kv: usize = ctx.iter().take(st.decode_tokens).sum();
            let floor = (weight_bytes + kv as f64 * kv_token) / bw + step_comm_s;
            floor_s += floor;
            if st.decode_tokens == batch {
                full.0 += dt;
                full.1 += floor;
                full.2 += 1;
            }
        }
        for ev in events {
            if let Event::Token { id, .. } = ev {
                tokens += 1;
                started.insert(id);
                if let Some(c) = ctx.get_mut(id as usize) {
                    *c += 1;
                }
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
    let pct = 100.0 * floor_s / decode_s.max(1e-12);
    let full_ms = 1e3 * full.0 / full.2.max(1) as f64;
    let full_pct = 100.0 * full.1 / full.0.max(1e-12);
    let preempt = r.stats().preemptions;
    if json {
        println!(
            "{{\"runner\":true,\"tp\":{tp},\"all_reduce_us\":{:.2},\"nccl_all_reduce_us\":{:.2},\"batch\":{batch},\"prompt_len\":{prompt_len},\"gen_len\":{gen_len},\"all_first_tokens_ms\":{:.3},\"output_tokens_per_s\":{out_tps:.1},\"decode_tokens_per_s\":{decode_tps:.1},\"decode_ms_per_step\":{ms_per_step:.4},\"pct_of_floor\":{pct:.1},\"full_batch_steps\":{},\"full_batch_ms_per_step\":{full_ms:.4},\"full_batch_pct_of_floor\":{full_pct:.1},\"decode_steps\":{decode_steps},\"graph_steps\":{graphs},\"lookahead_steps\":{aheads},\"steps\":{steps},\"preemptions\":{preempt}}}",
            all_reduce_s * 1e6,
            nccl_s * 1e6,
            ttft_all * 1e3,
            full.2
        );
    } else {
        println!(
            "runner: every first token after {:.1} ms; {out_tps:.1} output tokens/s overall; decode-only steps {ms_per_step:.3} ms/step, {decode_tps:.1} tokens/s = {pct:.1}% of the bandwidth floor ({decode_steps} of {steps} steps, {graphs} from CUDA graphs, {aheads} queued ahead); those with all {batch} requests {full_ms:.3} ms/step = {full_pct:.1}% of the floor ({} steps); {preempt} preemptions",
            ttft_all * 1e3,
            full.2
        );
    }
    Ok(())
}

/// `fl bench --num-beams K`: `requests` beam requests of `k` beams (`prompt_len` dummy
/// tokens, exactly `gen_len` new tokens: no end id), then `requests * k` greedy sequences of
/// the same lengths, on one runner. Reports each side's decode-only step time (steps without
/// prefill rows) and the ratio beams / sampled: what beam search costs over the same number of
/// sequences (the beam step kernel, block forks, the host search).
pub fn beams<T: RunDType>(
    e: &mut AnyEngine<T>,
    requests: usize,
    k: usize,
    prompt_len: usize,
    gen_len: usize,
    json: bool,
    rcfg: &RunnerConfig,
) -> Result<()> {
    let vocab = e.config().vocab_size as u32;
    let seqs = requests * k;
    let cfg = RunnerConfig {
        max_num_seqs: seqs.max(1),
        ..rcfg.clone()
    };
    let mut r = e.runner(&cfg)?;
    let beam_req = |r: &mut AnyRunner<'_, T>, id: u64, prompt: Vec<u32>, new: usize| {
        let req = greedy_request(id, prompt, new);
        r.add_beam_request(req, fl_engine::beam::BeamParams::new(k, new))
    };
    // Warm-up of both kinds (module loading, buffers, the decode buckets' CUDA graphs), with
    // prompts the measured runs do not share.
    for i in 0..requests {
        beam_req(
            &mut r,
            1_000_000 + i as u64,
            dummy_prompt(usize::MAX - i, 8, vocab),
            4,
        )?;
    }
    r.run_to_completion()?;
    for i in 0..seqs {
        let p = dummy_prompt(usize::MAX / 2 - i, 8, vocab);
        r.add_request(greedy_request(2_000_000 + i as u64, p, 4))?;
    }
    r.run_to_completion()?;
    // (decode-only seconds, steps) of one run.
    let measure = |r: &mut AnyRunner<'_, T>| -> Result<(f64, usize, f64)> {
        let (mut s, mut n) = (0f64, 0usize);
        let t0 = Instant::now();
        while r.has_unfinished() {
            let ts = Instant::now();
            r.step()?;
            let st = r.last_step();
            if st.prefill_tokens == 0 && st.decode_tokens > 0 {
                s += ts.elapsed().as_secs_f64();
                n += 1;
            }
        }
        Ok((s, n, t0.elapsed().as_secs_f64()))
    };
    for i in 0..requests {
        beam_req(
            &mut r,
            i as u64,
            dummy_prompt(i, prompt_len, vocab),
            gen_len,
        )?;
    }
    let (bs, bn, bt) = measure(&mut r)?;
    for i in 0..requests {
        let _ = r.take_beams(i as u64);
    }
    for i in 0..seqs {
        let p = dummy_prompt(10_000 + i, prompt_len, vocab);
        r.add_request(greedy_request(100 + i as u64, p, gen_len))?;
    }
    let (ss, sn, st) = measure(&mut r)?;
    let (bms, sms) = (1e3 * bs / bn.max(1) as f64, 1e3 * ss / sn.max(1) as f64);
    if json {
        println!(
            "{{\"beams\":{k},\"requests\":{requests},\"prompt_len\":{prompt_len},\"gen_len\":{gen_len},\"beam_ms_per_step\":{bms:.4},\"beam_decode_steps\":{bn},\"beam_total_s\":{bt:.3},\"sampled_ms_per_step\":{sms:.4},\"sampled_decode_steps\":{sn},\"sampled_total_s\":{st:.3},\"ratio\":{:.4}}}",
            bms / sms
        );
    } else {
        println!(
            "beams: {requests} request(s) x {k} beams, prompt {prompt_len}, {gen_len} new: decode {bms:.3} ms/step ({bn} steps, {bt:.2} s in all); {seqs} sampled sequences: {sms:.3} ms/step ({sn} steps, {st:.2} s); beams / sampled = {:.3}",
            bms / sms
        );
    }
    Ok(())
}

/// A trace replay's inputs.
pub struct TraceRun<'a> {
    /// The requests, by arrival.
    pub requests: &'a [TraceRequest],
    /// Every prompt starts with the same this many tokens.
    pub shared_prefix: usize,
    /// One JSON line instead of the table.
    pub json: bool,
}

impl TraceRun<'_> {
    /// Request `i`'s prompt: `shared_prefix` common ids, then its own.
    fn prompt(&self, i: usize, vocab: u32) -> Vec<u32> {
        let len = self.requests[i].prompt_len;
        let shared = self.shared_prefix.min(len);
        let mut p = dummy_prompt(usize::MAX, shared, vocab);
        p.extend(dummy_prompt(i, len - shared, vocab));
        p
    }
}

/// `fl bench --trace`: replays the trace through [`fl_engine::runner::Runner`] (requests join
/// when their arrival time has passed; dummy prompt ids, greedy, end ids ignored) and prints
/// throughput and latency percentiles. Requests the runner refuses (longer than the context)
/// are counted and skipped.
pub fn trace<T: RunDType>(
    e: &mut AnyEngine<T>,
    t: &TraceRun<'_>,
    rcfg: &RunnerConfig,
) -> Result<()> {
    let vocab = e.config().vocab_size as u32;
    let trace = t.requests;
    if t.shared_prefix > 0 && trace.iter().any(|q| q.prompt_len <= t.shared_prefix) {
        return Err(EngineError::invalid(
            "--shared-prefix",
            format!(
                "{} tokens: every trace prompt must be longer",
                t.shared_prefix
            ),
        ));
    }
    let mut r = e.runner(rcfg)?;
    // Warm-up: one short request (module loading, cuBLASLt plans), then its blocks freed
    // (its prompt shares nothing with the trace's).
    r.add_request(greedy_request(
        WARMUP_ID,
        dummy_prompt(usize::MAX - 1, 16, vocab),
        3,
    ))?;
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
            match r.add_request(greedy_request(
                next as u64,
                t.prompt(next, vocab),
                q.output_len,
            )) {
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
        let now = t0.elapsed().as_secs_f64();
        for ev in events {
            match ev {
                Event::Token { id, .. } => {
                    let i = id as usize;
                    tokens += 1;
                    match first[i] {
                        None => {
                            first[i] = Some(now);
                            ttft.push(now - trace[i].arrival_s);
                        }
                        Some(_) => itl.push(now - last[i]),
                    }
                    last[i] = now;
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
        p.map_or([f64::NAN; 4], |p| {
            [p.p50 * 1e3, p.p90 * 1e3, p.p99 * 1e3, p.max * 1e3]
        })
    };
    let (a, b, c) = (
        ms(Percentiles::of(&ttft)),
        ms(Percentiles::of(&tpot)),
        ms(Percentiles::of(&itl)),
    );
    let ttft_mean = 1e3 * ttft.iter().sum::<f64>() / ttft.len().max(1) as f64;
    let preempt = r.stats().preemptions;
    let hits = r.stats().kv.prefix_hit_tokens;
    if t.json {
        println!(
            "{{\"trace\":true,\"requests\":{n},\"refused\":{refused},\"seconds\":{total:.3},\"output_tokens\":{tokens},\"output_tokens_per_s\":{:.1},\"requests_per_s\":{:.2},\"ttft_mean_ms\":{ttft_mean:.2},\"ttft_ms\":[{:.2},{:.2},{:.2},{:.2}],\"tpot_ms\":[{:.3},{:.3},{:.3},{:.3}],\"itl_ms\":[{:.3},{:.3},{:.3},{:.3}],\"steps\":{steps},\"preemptions\":{preempt},\"prefix_hit_tokens\":{hits}}}",
            tokens as f64 / total, served as f64 / total, a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3], c[0], c[1], c[2], c[3]
        );
    } else {
        println!(
            "trace (runner): {served} of {n} requests ({refused} refused) in {total:.2} s; {:.1} output tokens/s, {:.2} requests/s; {steps} steps, {preempt} preemptions, {hits} prefix-cache hit tokens",
            tokens as f64 / total,
            served as f64 / total
        );
        println!(
            "  TTFT ms mean {ttft_mean:.1}, p50 / p90 / p99 / max: {:.1} / {:.1} / {:.1} / {:.1}",
            a[0], a[1], a[2], a[3]
        );
        println!(
            "  TPOT ms p50 / p90 / p99 / max: {:.2} / {:.2} / {:.2} / {:.2}",
            b[0], b[1], b[2], b[3]
        );
        println!(
            "  inter-token ms p50 / p90 / p99 / max: {:.2} / {:.2} / {:.2} / {:.2}",
            c[0], c[1], c[2], c[3]
        );
    }
    Ok(())
}

/// `fl bench --trace-static`: the trace's requests (all at once, arrival order) through the
/// static engine in batches of up to `max_batch`, a batch shrunk until its contiguous cache
/// fits; each batch generates its longest output for every sequence and only each request's
/// own output length counts. Prints output tokens/s.
pub fn trace_static<T: RunDType>(
    e: &mut Engine<T>,
    t: &TraceRun<'_>,
    max_batch: usize,
    part: Option<(usize, usize)>,
) -> Result<()> {
    let vocab = e.model.cfg.vocab_size as u32;
    let trace = t.requests;
    let ctx = e.model.cfg.max_position_embeddings;
    let fits = |i: usize| trace[i].prompt_len + trace[i].output_len <= ctx;
    let idx: Vec<usize> = (0..trace.len()).filter(|&i| fits(i)).collect();
    let make = |ids: &[usize]| Request {
        prompts: ids.iter().map(|&i| t.prompt(i, vocab)).collect(),
        max_new_tokens: ids.iter().map(|&i| trace[i].output_len).max().unwrap_or(1),
        sampling: vec![SamplingParams::greedy()],
        end_ids: Vec::new(),
        ignore_eos: true,
        forced: None,
    };
    // The batches, formed on the host (the fit check allocates nothing): arrival order, each
    // shrunk until its contiguous cache fits.
    let mut bounds = vec![];
    let mut at = 0usize;
    while at < idx.len() {
        let mut n = max_batch.max(1).min(idx.len() - at);
        loop {
            match e.check(&make(&idx[at..at + n])) {
                Ok(_) => break,
                Err(EngineError::Invalid { .. }) if n > 1 => n = (n * 3 / 4).max(1),
                Err(x) => return Err(x),
            }
        }
        bounds.push(at..at + n);
        at += n;
    }
    let all = bounds.len();
    let (k, parts) = part.unwrap_or((1, 1));
    let first = all * (k - 1) / parts;
    let run = &bounds[first..all * k / parts];
    // Warm-up.
    e.generate(
        &make(&idx[..1.min(idx.len())]),
        StepNeeds::default(),
        &mut |_| true,
    )?;
    let t0 = Instant::now();
    let (mut useful, mut widest) = (0usize, 0usize);
    for (j, b) in run.iter().enumerate() {
        let req = make(&idx[b.clone()]);
        e.generate(&req, StepNeeds::default(), &mut |_| true)?;
        useful += idx[b.clone()]
            .iter()
            .map(|&i| trace[i].output_len)
            .sum::<usize>();
        widest = widest.max(b.len());
        // Progress on stderr, so that a run stopped by a time limit still tells how far it
        // got: batch, its width and generated length, and the running totals.
        eprintln!(
            "static batch {} of {all}: {} requests x {} steps; so far {useful} output tokens in {:.2} s",
            first + j + 1,
            b.len(),
            req.max_new_tokens,
            t0.elapsed().as_secs_f64()
        );
    }
    let total = t0.elapsed().as_secs_f64();
    let skipped = trace.len() - idx.len();
    let requests: usize = run.iter().map(|b| b.len()).sum();
    let batches = run.len();
    if t.json {
        println!(
            "{{\"trace_static\":true,\"part\":{k},\"parts\":{parts},\"requests\":{requests},\"skipped\":{skipped},\"seconds\":{total:.3},\"output_tokens\":{useful},\"output_tokens_per_s\":{:.1},\"batches\":{batches},\"all_batches\":{all},\"widest_batch\":{widest}}}",
            useful as f64 / total
        );
    } else {
        let of = if parts > 1 {
            format!(" (part {k} of {parts}: batches {} of {all})", batches)
        } else {
            String::new()
        };
        println!(
            "trace (static batches of up to {max_batch}){of}: {requests} requests ({skipped} of the trace skipped) in {total:.2} s; {useful} output tokens, {:.1} output tokens/s; {batches} batches, the widest {widest}",
            useful as f64 / total
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
