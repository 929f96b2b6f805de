//! fl-sampling's beam-search step (`beam_topk`): 4 beams x vocab 128256, keeping 2 x 4
//! candidates per request (transformers' `beams_to_keep` with one end id), at batch 1 and 64
//! requests, f32 and f16 logits. Throughput: the logits' bytes (read once), next to a device
//! copy of the same traffic in the same run (the floor of every memory-bound bench). Two
//! input sets alternate so that repeats are not served from L2 more than a decoding loop
//! would be. One summary line per case goes to stderr: us, GB/s on the logits, % of the copy.
//! The PyTorch side is bench/scripts/torch_beam.py (same cases).

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fl_bench::{gpu_or_skip, time_on_device, CopyProbe};
use fl_kernels::{f16, DeviceTensor, FloatDType, Gpu};
use fl_sampling::{beam_topk, BeamRequests, BeamTopkWorkspace};

const BEAMS: usize = 4;
const VOCAB: usize = 128_256;
const KEEP: usize = 2 * BEAMS;
const ITERS: u64 = 200;

/// LM-like logits (the recipe of the sampling bench and torch_beam.py): roughly normal
/// (std ~2.3) with one token in 500 raised by 8.
fn logits<T: FloatDType>(gpu: &Gpu, rows: usize, seed: u64) -> DeviceTensor<T> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 40) as f32 / (1u64 << 24) as f32
    };
    let host: Vec<T> = (0..rows * VOCAB)
        .map(|_| {
            let z = (next() + next() + next() + next() - 2.0) * 4.0;
            T::from_f32(if next() < 0.002 { z + 8.0 } else { z })
        })
        .collect();
    DeviceTensor::from_host(gpu.stream(), &host, &[rows, VOCAB]).expect("allocate logits")
}

fn gbps(bytes: usize, t: Duration, iters: u64) -> f64 {
    bytes as f64 * iters as f64 / t.as_secs_f64() / 1e9
}

fn group<T: FloatDType>(c: &mut Criterion, gpu: &Gpu) {
    let s = gpu.stream().clone();
    let mut g = c.benchmark_group(format!("beam_topk_{}", T::NAME));
    for batch in [1usize, 64] {
        let rows = batch * BEAMS;
        let id = format!("{batch}x{BEAMS}x{VOCAB}");
        let inputs = [logits::<T>(gpu, rows, 1), logits::<T>(gpu, rows, 2)];
        let scores: Vec<f32> = (0..rows).map(|i| -0.25 * (i % BEAMS) as f32).collect();
        let bs = DeviceTensor::from_host(&s, &scores, &[rows]).unwrap();
        let starts: Vec<i32> = (0..=batch).map(|r| (r * BEAMS) as i32).collect();
        let req_start = DeviceTensor::from_host(&s, &starts, &[batch + 1]).unwrap();
        let keep = DeviceTensor::from_host(&s, &vec![KEEP as i32; batch], &[batch]).unwrap();
        let req = BeamRequests {
            req_start: &req_start,
            keep: &keep,
        };
        let mut ws = BeamTopkWorkspace::new(&s, rows, VOCAB, KEEP).unwrap();
        let mut out_s = DeviceTensor::<f32>::zeros(&s, &[batch, KEEP]).unwrap();
        let mut out_i = DeviceTensor::<i32>::zeros(&s, &[batch, KEEP]).unwrap();
        let bytes = rows * VOCAB * std::mem::size_of::<T>();
        let mut k = 0usize;
        let mut run = || {
            k += 1;
            beam_topk(
                &s,
                &inputs[k & 1],
                &bs,
                &req,
                &mut ws,
                &mut out_s,
                &mut out_i,
            )
            .map_err(|e| fl_kernels::Error::invalid("beam_topk", e.to_string()))
        };
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_with_input(BenchmarkId::new("fl", &id), &id, |b, _| {
            b.iter_custom(|it| time_on_device(&s, it, &mut run))
        });
        // The copy moves `bytes` in all (read + write of half), the logits' traffic.
        let mut cp = CopyProbe::new(gpu, bytes / 2).unwrap();
        let mut copy = || cp.copy(&s);
        g.bench_with_input(BenchmarkId::new("copy", &id), &id, |b, _| {
            b.iter_custom(|it| time_on_device(&s, it, &mut copy))
        });
        let t = time_on_device(&s, ITERS, &mut run);
        let tc = time_on_device(&s, ITERS, &mut copy);
        let (bw, bwc) = (gbps(bytes, t, ITERS), gbps(bytes, tc, ITERS));
        eprintln!(
            "beam_topk {} batch {batch:<2} x {BEAMS} beams x {VOCAB} keep {KEEP}: {:8.2} us \
             {bw:7.0} GB/s on logits = {:5.1}% of copy ({bwc:.0} GB/s, {:.2} us)",
            T::NAME,
            t.as_secs_f64() * 1e6 / ITERS as f64,
            100.0 * bw / bwc,
            tc.as_secs_f64() * 1e6 / ITERS as f64,
        );
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    let Some(gpu) = gpu_or_skip("beam") else {
        return;
    };
    group::<f32>(c, &gpu);
    group::<f16>(c, &gpu);
}

criterion_group! {
    name = group_beam;
    config = Criterion::default().sample_size(10).warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(600));
    targets = benches
}
criterion_main!(group_beam);
