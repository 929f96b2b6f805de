//! A decoding loop with fl-sampling, random logits standing in for a model: three requests
//! (greedy; top-k + top-p; min-p with a repetition penalty), two end ids, a pad id, and
//! the "all finished" flag read every 8 steps.
//!
//!     cargo run --release -p fl-sampling --example decode

use fl_kernels::{DeviceTensor, Gpu};
use fl_sampling::{Sampler, SamplerConfig, SamplingParams};

fn main() -> Result<(), fl_sampling::Error> {
    let gpu = Gpu::new(0)?;
    let s = gpu.stream();
    let vocab = 32_000;
    let rows = vec![
        SamplingParams {
            max_new_tokens: 20,
            ..SamplingParams::greedy()
        },
        SamplingParams {
            temperature: 0.7,
            top_k: 50,
            top_p: 0.9,
            seed: 7,
            max_new_tokens: 30,
            ..Default::default()
        },
        SamplingParams {
            min_p: 0.05,
            repetition_penalty: 1.3,
            seed: 8,
            max_new_tokens: 40,
            ..Default::default()
        },
    ];
    let cfg = SamplerConfig {
        end_ids: vec![1, 2],
        pad_id: 0,
        max_history: 64,
    };
    let mut sampler = Sampler::new(s, &rows, vocab, &cfg)?;
    let mut tokens = DeviceTensor::<i32>::zeros(s, &[rows.len()])?;
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut out: Vec<Vec<i32>> = vec![Vec::new(); rows.len()];
    for step in 0.. {
        // stand-in for the LM head: peaked random logits
        let host: Vec<f32> = (0..rows.len() * vocab)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 12.0
            })
            .collect();
        let mut logits = DeviceTensor::from_host(s, &host, &[rows.len(), vocab])?;
        sampler.step(s, &mut logits, &mut tokens)?;
        for (r, t) in tokens.to_host(s)?.into_iter().enumerate() {
            out[r].push(t);
        }
        if step % 8 == 7 && sampler.all_finished(s)? {
            break;
        }
    }
    for (r, toks) in out.iter().enumerate() {
        println!("request {r}: {toks:?}");
    }
    println!("lengths: {:?}", sampler.state().lengths().to_host(s)?);
    Ok(())
}
