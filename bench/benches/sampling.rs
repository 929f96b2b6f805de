//! fl-sampling: greedy, top-k (k = 50), top-p (p = 0.9) and top-k + top-p on f32 logits of
//! batch 1, 16, 64, 256 x vocab 32000 and 128256. Throughput: the logits' bytes (read once
//! at least). Two input sets alternate so that repeats are not served from L2 more than a
//! decoding loop would be. The PyTorch side is bench/scripts/torch_sampling.py (same cases).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fl_bench::{gpu_or_skip, time_on_device};
use fl_kernels::{DeviceTensor, Gpu};
use fl_sampling::{greedy, sample, DeviceParams, SampleOptions, SampleWorkspace, SamplingParams};

fn logits(gpu: &Gpu, batch: usize, vocab: usize, seed: u64) -> DeviceTensor<f32> {
    fl_bench::ops::sampling::logits(gpu, batch, vocab, seed).expect("allocate logits")
}

fn benches(c: &mut Criterion) {
    let Some(gpu) = gpu_or_skip("sampling") else {
        return;
    };
    let s = gpu.stream().clone();
    let ops: [(&str, Option<SamplingParams>); 4] = [
        ("greedy", None),
        (
            "top_k50",
            Some(SamplingParams {
                top_k: 50,
                seed: 1,
                ..Default::default()
            }),
        ),
        (
            "top_p0.9",
            Some(SamplingParams {
                top_p: 0.9,
                seed: 2,
                ..Default::default()
            }),
        ),
        (
            "top_k50_top_p0.9",
            Some(SamplingParams {
                top_k: 50,
                top_p: 0.9,
                seed: 3,
                ..Default::default()
            }),
        ),
    ];
    for (name, p) in ops {
        let mut g = c.benchmark_group(format!("sampling_{name}_f32"));
        for &vocab in &[32_000usize, 128_256] {
            for &batch in &[1usize, 16, 64, 256] {
                let inputs = [logits(&gpu, batch, vocab, 1), logits(&gpu, batch, vocab, 2)];
                let params = p.map(|p| {
                    let rows: Vec<SamplingParams> = (0..batch)
                        .map(|i| SamplingParams {
                            request_id: i as u64,
                            ..p
                        })
                        .collect();
                    DeviceParams::new(&s, &rows).unwrap()
                });
                let mut ws = SampleWorkspace::new(&s, batch, vocab).unwrap();
                let mut tokens = DeviceTensor::<i32>::zeros(&s, &[batch]).unwrap();
                let opts = SampleOptions::default();
                g.throughput(Throughput::Bytes((batch * vocab * 4) as u64));
                let mut k = 0usize;
                g.bench_with_input(
                    BenchmarkId::new("fl", format!("{batch}x{vocab}")),
                    &batch,
                    |b, _| {
                        b.iter_custom(|it| {
                            time_on_device(&s, it, || {
                                k += 1;
                                let x = &inputs[k & 1];
                                match &params {
                                    Some(dp) => sample(&s, x, dp, &opts, &mut tokens, &mut ws),
                                    None => greedy(&s, x, &opts, &mut tokens, &mut ws),
                                }
                                .map_err(|e| fl_kernels::Error::invalid("sampling", e.to_string()))
                            })
                        })
                    },
                );
            }
        }
        g.finish();
    }
}

criterion_group! {
    name = group;
    config = Criterion::default().sample_size(10).warm_up_time(std::time::Duration::from_millis(200))
        .measurement_time(std::time::Duration::from_millis(600));
    targets = benches
}
criterion_main!(group);
