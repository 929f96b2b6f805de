//! Table cases for `fl_kernels::activation` (torch side: `torch_activation.py`).

use fl_kernels::activation::{self, GeluKind};
use fl_kernels::{bf16, f16, DeviceTensor, FloatDType};

use super::{bench_tensor, Case, Launch};

/// SwiGLU, fused `[gate | up]` input (`fused`) or two inputs: `rows x inter` out, 3 tensors
/// of that size moved.
fn swiglu_case<T: FloatDType>(rows: usize, inter: usize, fused: bool) -> Case {
    Case {
        op: if fused { "swiglu_fused" } else { "swiglu" },
        dtype: T::NAME,
        shape: format!("{rows}x{inter}"),
        bytes: (3 * rows * inter * std::mem::size_of::<T>()) as u64,
        make: Box::new(move |gpu| {
            let s = gpu.stream().clone();
            let mut o = DeviceTensor::<T>::zeros(&s, &[rows, inter])?;
            let l: Launch = if fused {
                let x = bench_tensor::<T>(gpu, &[rows, 2 * inter], 1)?;
                Box::new(move || activation::swiglu_fused(&s, &x, &mut o))
            } else {
                let g = bench_tensor::<T>(gpu, &[rows, inter], 1)?;
                let u = bench_tensor::<T>(gpu, &[rows, inter], 2)?;
                Box::new(move || activation::swiglu(&s, &g, &u, &mut o))
            };
            Ok(l)
        }),
    }
}

/// GELU of `x + bias` (`Some(kind)`) or bias add (`None`), `x` `[rows, cols]`.
fn bias_case<T: FloatDType>(rows: usize, cols: usize, kind: Option<GeluKind>) -> Case {
    Case {
        op: match kind {
            None => "bias_add",
            Some(GeluKind::Tanh) => "gelu_tanh",
            Some(GeluKind::Erf) => "gelu_erf",
        },
        dtype: T::NAME,
        shape: format!("{rows}x{cols}"),
        bytes: ((2 * rows * cols + cols) * std::mem::size_of::<T>()) as u64,
        make: Box::new(move |gpu| {
            let s = gpu.stream().clone();
            let x = bench_tensor::<T>(gpu, &[rows, cols], 1)?;
            let b = bench_tensor::<T>(gpu, &[cols], 2)?;
            let mut o = DeviceTensor::<T>::zeros(&s, &[rows, cols])?;
            let l: Launch = Box::new(move || match kind {
                None => activation::bias_add(&s, &x, &b, &mut o),
                Some(k) => activation::gelu(&s, &x, Some(&b), &mut o, k),
            });
            Ok(l)
        }),
    }
}

/// SwiGLU at 1, 16, 64 and 8192 tokens of LLaMA-2-7B (11008) and LLaMA-3-8B (14336)
/// intermediate sizes, f16 and bf16; GELU (tanh, erf, with bias) and bias add at 1, 64 and
/// 16384 tokens of 4096, f16.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for fused in [true, false] {
        for inter in [11_008usize, 14_336] {
            for rows in [1usize, 16, 64, 8192] {
                v.push(swiglu_case::<f16>(rows, inter, fused));
                v.push(swiglu_case::<bf16>(rows, inter, fused));
            }
        }
    }
    for kind in [Some(GeluKind::Tanh), Some(GeluKind::Erf), None] {
        for rows in [1usize, 64, 16_384] {
            v.push(bias_case::<f16>(rows, 4096, kind));
        }
    }
    v
}
