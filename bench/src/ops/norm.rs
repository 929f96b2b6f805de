//! Table cases for `fl_kernels::norm` (torch side: `torch_norm.py`).

use fl_kernels::{bf16, f16, norm, DeviceTensor, FloatDType};

use super::{bench_tensor, Case, Launch};

/// rows x hidden for f16 and bf16: decode sizes and one past L2.
const SIZES: &[(usize, usize)] = &[
    (1, 4096),
    (16, 4096),
    (64, 4096),
    (1, 8192),
    (64, 8192),
    (65536, 8192),
];

fn rms_case<T: FloatDType>(rows: usize, h: usize) -> Case {
    let es = std::mem::size_of::<T>();
    Case {
        op: "rms_norm",
        dtype: T::NAME,
        shape: format!("{rows}x{h}"),
        bytes: (2 * rows * h * es + h * es) as u64,
        make: Box::new(move |gpu| {
            let x = bench_tensor::<T>(gpu, &[rows, h], 1)?;
            let w = bench_tensor::<T>(gpu, &[h], 2)?;
            let mut y = DeviceTensor::<T>::zeros(gpu.stream(), &[rows, h])?;
            let s = gpu.stream().clone();
            let l: Launch = Box::new(move || norm::rms_norm(&s, &x, &w, 1e-5, &mut y));
            Ok(l)
        }),
    }
}

fn add_rms_case<T: FloatDType>(rows: usize, h: usize) -> Case {
    let es = std::mem::size_of::<T>();
    Case {
        op: "add_rms_norm",
        dtype: T::NAME,
        shape: format!("{rows}x{h}"),
        // x and residual read, residual and y written, weight read.
        bytes: (4 * rows * h * es + h * es) as u64,
        make: Box::new(move |gpu| {
            let x = bench_tensor::<T>(gpu, &[rows, h], 1)?;
            let mut res = bench_tensor::<T>(gpu, &[rows, h], 3)?;
            let w = bench_tensor::<T>(gpu, &[h], 2)?;
            let mut y = DeviceTensor::<T>::zeros(gpu.stream(), &[rows, h])?;
            let s = gpu.stream().clone();
            let l: Launch =
                Box::new(move || norm::add_rms_norm(&s, &x, &mut res, &w, 1e-5, &mut y));
            Ok(l)
        }),
    }
}

fn layer_case<T: FloatDType>(rows: usize, h: usize) -> Case {
    let es = std::mem::size_of::<T>();
    Case {
        op: "layer_norm",
        dtype: T::NAME,
        shape: format!("{rows}x{h}"),
        bytes: (2 * rows * h * es + 2 * h * es) as u64,
        make: Box::new(move |gpu| {
            let x = bench_tensor::<T>(gpu, &[rows, h], 1)?;
            let w = bench_tensor::<T>(gpu, &[h], 2)?;
            let b = bench_tensor::<T>(gpu, &[h], 4)?;
            let mut y = DeviceTensor::<T>::zeros(gpu.stream(), &[rows, h])?;
            let s = gpu.stream().clone();
            let l: Launch = Box::new(move || norm::layer_norm(&s, &x, &w, Some(&b), 1e-5, &mut y));
            Ok(l)
        }),
    }
}

/// rms_norm, add_rms_norm and layer_norm at the decode sizes and 65536 x 8192 in f16 and
/// bf16, and in f32 at 65536 x 4096.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for &(rows, h) in SIZES {
        v.push(rms_case::<f16>(rows, h));
        v.push(rms_case::<bf16>(rows, h));
    }
    v.push(rms_case::<f32>(65536, 4096));
    for &(rows, h) in SIZES {
        v.push(add_rms_case::<f16>(rows, h));
        v.push(add_rms_case::<bf16>(rows, h));
    }
    v.push(add_rms_case::<f32>(65536, 4096));
    for &(rows, h) in SIZES {
        v.push(layer_case::<f16>(rows, h));
        v.push(layer_case::<bf16>(rows, h));
    }
    v.push(layer_case::<f32>(65536, 4096));
    v
}
