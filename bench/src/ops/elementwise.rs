//! Table cases for `fl_kernels::elementwise` (torch side: `torch_elementwise.py`).

use fl_kernels::{bf16, elementwise, f16, DeviceTensor, FloatDType};

use super::{bench_tensor, Case, Launch};

fn add_case<T: FloatDType>(n: usize) -> Case {
    Case {
        op: "add",
        dtype: T::NAME,
        shape: format!("{n}"),
        bytes: (3 * n * std::mem::size_of::<T>()) as u64,
        make: Box::new(move |gpu| {
            let a = bench_tensor::<T>(gpu, &[n], 1)?;
            let b = bench_tensor::<T>(gpu, &[n], 2)?;
            let mut o = DeviceTensor::<T>::zeros(gpu.stream(), &[n])?;
            let s = gpu.stream().clone();
            let l: Launch = Box::new(move || elementwise::add(&s, &a, &b, &mut o));
            Ok(l)
        }),
    }
}

/// add at one decode token (4096), 64 tokens, and past L2 (2^26 elements).
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for n in [4096usize, 64 * 4096, 1 << 26] {
        v.push(add_case::<f32>(n));
        v.push(add_case::<f16>(n));
        v.push(add_case::<bf16>(n));
    }
    v
}
