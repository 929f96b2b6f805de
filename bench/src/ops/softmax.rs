//! Table cases for `fl_kernels::softmax` (torch side: `torch_softmax.py`). Temperature 1.

use fl_kernels::softmax::{self, SoftmaxWorkspace};
use fl_kernels::{bf16, DeviceTensor, FloatDType};

use super::{bench_tensor, Case, Launch};

/// rows x n over the 32000 and 128256 vocabularies (bf16 logits).
const SIZES: &[(usize, usize)] = &[
    (1, 32000),
    (64, 32000),
    (1, 128_256),
    (64, 128_256),
    (256, 128_256),
    (2048, 128_256),
];

fn case<T: FloatDType>(rows: usize, n: usize, f32_out: bool) -> Case {
    let out_size = if f32_out { 4 } else { std::mem::size_of::<T>() };
    Case {
        op: if f32_out { "softmax_f32out" } else { "softmax" },
        dtype: T::NAME,
        shape: format!("{rows}x{n}"),
        bytes: (rows * n * (std::mem::size_of::<T>() + out_size)) as u64,
        make: Box::new(move |gpu| {
            let x = bench_tensor::<T>(gpu, &[rows, n], 1)?;
            let s = gpu.stream().clone();
            let mut ws = SoftmaxWorkspace::new();
            ws.reserve(&s, rows, n)?;
            let l: Launch = if f32_out {
                let mut y = DeviceTensor::<f32>::zeros(&s, &[rows, n])?;
                Box::new(move || softmax::softmax_f32(&s, &x, 1.0, &mut y, Some(&mut ws)))
            } else {
                let mut y = DeviceTensor::<T>::zeros(&s, &[rows, n])?;
                Box::new(move || softmax::softmax(&s, &x, 1.0, &mut y, Some(&mut ws)))
            };
            Ok(l)
        }),
    }
}

/// softmax (bf16 -> bf16) and softmax_f32out (bf16 -> f32) at the vocabulary sizes;
/// f32 at 4096 x 4096 (attention-score sized) and 1 x 128256.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for &(rows, n) in SIZES {
        v.push(case::<bf16>(rows, n, false));
        v.push(case::<bf16>(rows, n, true));
    }
    v.push(case::<f32>(4096, 4096, false));
    v.push(case::<f32>(1, 128_256, false));
    v
}
