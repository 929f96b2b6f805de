//! Table cases for `fl_sampling` (torch side: `torch_sampling.py`, keys
//! `sampling_<op>|f32|<batch>x<vocab>`): greedy, top-k 50, top-p 0.9, top-k 50 + top-p 0.9
//! on LM-like f32 logits. Bytes: the logits read once.

use fl_kernels::{DeviceTensor, Gpu};
use fl_sampling::{greedy, sample, DeviceParams, SampleOptions, SampleWorkspace, SamplingParams};

use super::{Case, Launch};

/// LM-like logits: roughly normal (std ~2.3) with one token in 500 raised by 8 (the same
/// recipe as the criterion bench and the torch script).
pub fn logits(
    gpu: &Gpu,
    batch: usize,
    vocab: usize,
    seed: u64,
) -> fl_kernels::Result<DeviceTensor<f32>> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 40) as f32 / (1u64 << 24) as f32
    };
    let host: Vec<f32> = (0..batch * vocab)
        .map(|_| {
            let z = (next() + next() + next() + next() - 2.0) * 4.0;
            if next() < 0.002 {
                z + 8.0
            } else {
                z
            }
        })
        .collect();
    DeviceTensor::from_host(gpu.stream(), &host, &[batch, vocab])
}

fn case(op: &'static str, p: Option<SamplingParams>, batch: usize, vocab: usize) -> Case {
    Case {
        op,
        dtype: "f32",
        shape: format!("{batch}x{vocab}"),
        bytes: (batch * vocab * 4) as u64,
        make: Box::new(move |gpu| {
            let s = gpu.stream().clone();
            let inputs = [logits(gpu, batch, vocab, 1)?, logits(gpu, batch, vocab, 2)?];
            let wrap =
                |e: fl_sampling::Error| fl_kernels::Error::invalid("sampling", e.to_string());
            let params = match p {
                Some(p) => {
                    let rows: Vec<SamplingParams> = (0..batch)
                        .map(|i| SamplingParams {
                            request_id: i as u64,
                            ..p
                        })
                        .collect();
                    Some(DeviceParams::new(&s, &rows).map_err(wrap)?)
                }
                None => None,
            };
            let mut ws = SampleWorkspace::new(&s, batch, vocab).map_err(wrap)?;
            let mut tokens = DeviceTensor::<i32>::zeros(&s, &[batch])?;
            let opts = SampleOptions::default();
            let mut k = 0usize;
            let l: Launch = Box::new(move || {
                k += 1;
                let x = &inputs[k & 1];
                match &params {
                    Some(dp) => sample(&s, x, dp, &opts, &mut tokens, &mut ws),
                    None => greedy(&s, x, &opts, &mut tokens, &mut ws),
                }
                .map_err(wrap)
            });
            Ok(l)
        }),
    }
}

/// Every op at batch 1, 16, 64, 256 x vocab 32000 and 128256.
pub fn cases() -> Vec<Case> {
    let ops: [(&'static str, Option<SamplingParams>); 4] = [
        ("sampling_greedy", None),
        (
            "sampling_top_k50",
            Some(SamplingParams {
                top_k: 50,
                seed: 1,
                ..Default::default()
            }),
        ),
        (
            "sampling_top_p0.9",
            Some(SamplingParams {
                top_p: 0.9,
                seed: 2,
                ..Default::default()
            }),
        ),
        (
            "sampling_top_k50_top_p0.9",
            Some(SamplingParams {
                top_k: 50,
                top_p: 0.9,
                seed: 3,
                ..Default::default()
            }),
        ),
    ];
    let mut v = Vec::new();
    for (op, p) in ops {
        for vocab in [32_000usize, 128_256] {
            for batch in [1usize, 16, 64, 256] {
                v.push(case(op, p, batch, vocab));
            }
        }
    }
    v
}
