//! One kernel used alone: add two bf16 vectors on the GPU and check against the CPU.
//!
//!     cargo run --release -p fl-kernels --example add
//!
//! Prints one line and exits 2 on a machine without a GPU.

use fl_kernels::{bf16, elementwise, reference, DeviceTensor, Gpu};

fn main() -> Result<(), fl_kernels::Error> {
    let gpu = match Gpu::new(0) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("example add: {e}");
            std::process::exit(2);
        }
    };
    let s = gpu.stream();
    let n = 1_000_003;
    let a: Vec<bf16> = (0..n)
        .map(|i| bf16::from_f32((i % 97) as f32 * 0.25 - 3.0))
        .collect();
    let b: Vec<bf16> = (0..n)
        .map(|i| bf16::from_f32((i % 13) as f32 * 0.5 + 0.5))
        .collect();
    let da = DeviceTensor::from_host(s, &a, &[n])?;
    let db = DeviceTensor::from_host(s, &b, &[n])?;
    let mut out = DeviceTensor::filled(s, &[n], bf16::NAN)?;
    elementwise::add(s, &da, &db, &mut out)?; // queued on the stream; returns at once
    let got = out.to_host(s)?; // waits for the stream
    let want = reference::elementwise::add(&a, &b);
    let mismatches = got
        .iter()
        .zip(&want)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    println!(
        "{}: added {n} bf16 pairs, {mismatches} mismatches vs the CPU",
        gpu.name()?
    );
    Ok(())
}
