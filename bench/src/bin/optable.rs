//! `optable`: times every case of the op table on the GPU and prints one JSON line per
//! case (`{"key":..,"us":..,"gbps":..}`) plus the measured copy bandwidth; `compare.py`
//! joins these with PyTorch's times for the same keys.
//!
//! Usage: `optable [FILTERS]` (comma-separated substrings; a key matching any runs). Timing: CUDA events around a batch of
//! launches after a warm-up of >= 25 ms, median of 7 batches; inputs rotate between 2 copies when the
//! working set is under 256 MB so the L2 cache does not serve repeats.

use fl_bench::ops;
use fl_kernels::{time_on_stream, Gpu};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let filter = std::env::args().nth(1).unwrap_or_default();
    let gpu = match Gpu::new(0) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("optable: {e}");
            std::process::exit(2);
        }
    };
    let s = gpu.stream().clone();

    // The floor: a 1 GiB device-to-device copy (2 GiB moved).
    let mut cp = fl_bench::CopyProbe::new(&gpu, 1 << 30).expect("copy probe");
    let copy_us = {
        let _ = time_on_stream(&s, || cp.copy(&s));
        median(
            (0..7)
                .map(|_| {
                    time_on_stream(&s, || {
                        for _ in 0..5 {
                            cp.copy(&s)?;
                        }
                        Ok(())
                    })
                    .expect("copy")
                        * 1e3
                        / 5.0
                })
                .collect(),
        )
    };
    let copy_gbps = cp.bytes_moved() as f64 / copy_us / 1e3;
    println!("{{\"key\":\"copy\",\"us\":{copy_us:.3},\"gbps\":{copy_gbps:.1}}}");
    drop(cp);

    for case in ops::all() {
        let key = case.key();
        if !filter.is_empty() && !filter.split(',').any(|f| !f.is_empty() && key.contains(f)) {
            continue;
        }
        // Two instances when small, so consecutive launches read different buffers.
        let copies = if case.bytes < (256 << 20) { 2 } else { 1 };
        let mut launches = Vec::new();
        for _ in 0..copies {
            match (case.make)(&gpu) {
                Ok(l) => launches.push(l),
                Err(e) => {
                    println!(
                        "{{\"key\":\"{key}\",\"error\":\"{}\"}}",
                        e.to_string().replace('"', "'")
                    );
                    break;
                }
            }
        }
        if launches.len() != copies {
            continue;
        }
        let run = |launches: &mut Vec<fl_bench::ops::Launch>, iters: usize| {
            time_on_stream(&s, || {
                for i in 0..iters {
                    (launches[i % copies])()?;
                }
                Ok(())
            })
        };
        // Warm up, then pick a batch size that runs ~2 ms.
        let probe = match run(&mut launches, 3) {
            Ok(ms) => ms / 3.0,
            Err(e) => {
                println!(
                    "{{\"key\":\"{key}\",\"error\":\"{}\"}}",
                    e.to_string().replace('"', "'")
                );
                continue;
            }
        };
        let iters = ((2.0 / probe.max(1e-4)) as usize).clamp(5, 2000);
        // Run >= 25 ms before measuring: the first case after the inputs' host-to-device
        // copies (the GPU idle meanwhile) measured up to 15% slow with 3 warm-up calls only.
        let mut warm = 0.0;
        while warm < 25.0 {
            match run(&mut launches, iters) {
                Ok(ms) => warm += ms.max(1e-3),
                Err(_) => break,
            }
        }
        let us = median(
            (0..7)
                .map(|_| run(&mut launches, iters).expect("launch") * 1e3 / iters as f64)
                .collect(),
        );
        let gbps = case.bytes as f64 / us / 1e3;
        println!(
            "{{\"key\":\"{key}\",\"us\":{us:.3},\"gbps\":{gbps:.1},\"bytes\":{},\"pct_copy\":{:.1}}}",
            case.bytes,
            100.0 * gbps / copy_gbps
        );
    }
}
