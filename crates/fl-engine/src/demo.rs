//! `fl demo`: runs the elementwise kernels on the GPU, checks them against the CPU
//! references and reports the achieved bandwidth.

use fl_kernels::cudarc::driver::CudaStream;
use fl_kernels::{elementwise, reference, DeviceTensor, FloatDType, Gpu, Result};

/// One line of the demo's report.
#[derive(Debug, Clone)]
pub struct DemoLine {
    /// Op and dtype.
    pub what: String,
    /// Elements per call.
    pub n: usize,
    /// Relative L2 error against the reference.
    pub rel_err: f64,
    /// Median time per call in microseconds.
    pub us: f64,
    /// Bytes moved per call / time, in GB/s.
    pub gbps: f64,
}

fn time_us(gpu: &Gpu, iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?; // warm-up
    let ms = fl_kernels::time_on_stream(gpu.stream(), || {
        for _ in 0..iters {
            f()?;
        }
        Ok(())
    })?;
    Ok(ms * 1000.0 / iters as f64)
}

fn pseudo_random<T: FloatDType>(n: usize, seed: u64) -> Vec<T> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let u = (x >> 11) as f64 / (1u64 << 53) as f64;
            T::from_f32((u * 2.0 - 1.0) as f32 + 1e-3)
        })
        .collect()
}

/// Relative L2 error `|got - want| / |want|` in f64; NaN or infinity in `got` gives
/// infinity, an all-zero `want` gives `|got|`.
fn rel_l2<T: FloatDType>(got: &[T], want: &[f64]) -> f64 {
    if got.len() != want.len() || got.iter().any(|g| !g.to_f64().is_finite()) {
        return f64::INFINITY;
    }
    let (num, den) = got.iter().zip(want).fold((0f64, 0f64), |(n, d), (g, w)| {
        let e = g.to_f64() - w;
        (n + e * e, d + w * w)
    });
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

fn add_line<T: FloatDType>(
    gpu: &Gpu,
    s: &std::sync::Arc<CudaStream>,
    n: usize,
) -> Result<DemoLine> {
    let a = pseudo_random::<T>(n, 1);
    let b = pseudo_random::<T>(n, 2);
    let da = DeviceTensor::from_host(s, &a, &[n])?;
    let db = DeviceTensor::from_host(s, &b, &[n])?;
    let mut out = DeviceTensor::filled(s, &[n], T::from_f32(f32::NAN))?;
    elementwise::add(s, &da, &db, &mut out)?;
    let got = out.to_host(s)?;
    let want: Vec<f64> = reference::elementwise::add(&a, &b)
        .iter()
        .map(|x| x.to_f64())
        .collect();
    let rel_err = rel_l2(&got, &want);
    let us = time_us(gpu, 20, || elementwise::add(s, &da, &db, &mut out))?;
    let bytes = 3 * n * std::mem::size_of::<T>();
    Ok(DemoLine {
        what: format!("add {}", T::NAME),
        n,
        rel_err,
        us,
        gbps: bytes as f64 / us / 1e3,
    })
}

/// Runs the demo on `gpu`.
pub fn run(gpu: &Gpu, n: usize) -> Result<Vec<DemoLine>> {
    let s = gpu.stream().clone();
    Ok(vec![
        add_line::<f32>(gpu, &s, n)?,
        add_line::<fl_kernels::f16>(gpu, &s, n)?,
        add_line::<fl_kernels::bf16>(gpu, &s, n)?,
    ])
}
