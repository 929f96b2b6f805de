//! Shared bench helpers: GPU or skip, device-event timing, the measured copy bandwidth.
//!
//! Benches time on the device with CUDA events around `iters` launches (criterion's
//! `iter_custom`), so launch overhead is included as a user would see it but host-side
//! noise is not. Each bench group also measures a device-to-device copy of the same size,
//! the floor every memory-bound op is reported against.

use std::time::Duration;

use fl_kernels::cudarc::driver::CudaStream;
use fl_kernels::{DeviceTensor, Gpu, Result};

/// The GPU, or `None` after printing one line saying the benches are skipped.
pub mod ops;

pub fn gpu_or_skip(bench: &str) -> Option<Gpu> {
    match Gpu::new(0) {
        Ok(g) => Some(g),
        Err(e) => {
            if gpu_required() {
                panic!("{bench}: FL_REQUIRE_GPU=1 but {e}");
            }
            eprintln!("SKIP bench {bench}: {e}");
            None
        }
    }
}

/// Whether `FL_REQUIRE_GPU` asks for a GPU (`1`, `true`, `yes`), as in the tests (this crate
/// does not take `fl_kernels`' `testing` feature, which is for tests only).
fn gpu_required() -> bool {
    std::env::var("FL_REQUIRE_GPU")
        .is_ok_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
}

/// Times `iters` calls of `f` on `stream` with CUDA events; returns the total.
pub fn time_on_device(
    stream: &CudaStream,
    iters: u64,
    mut f: impl FnMut() -> Result<()>,
) -> Duration {
    let r = fl_kernels::time_on_stream(stream, || {
        for _ in 0..iters {
            f()?;
        }
        Ok(())
    });
    match r {
        Ok(ms) => Duration::from_secs_f64(ms / 1e3),
        Err(e) => panic!("bench launch failed: {e}"),
    }
}

/// A device-to-device copy of `bytes` bytes, to measure the copy bandwidth floor in the
/// same run (bytes moved = 2 x `bytes`: read once, written once).
pub struct CopyProbe {
    src: DeviceTensor<u8>,
    dst: DeviceTensor<u8>,
}

impl CopyProbe {
    /// Allocates two buffers of `bytes` bytes.
    pub fn new(gpu: &Gpu, bytes: usize) -> Result<Self> {
        let s = gpu.stream();
        Ok(CopyProbe {
            src: DeviceTensor::filled(s, &[bytes], 0x5a)?,
            dst: DeviceTensor::zeros(s, &[bytes])?,
        })
    }

    /// One copy, queued on `stream`.
    pub fn copy(&mut self, stream: &std::sync::Arc<CudaStream>) -> Result<()> {
        stream.memcpy_dtod(self.src.as_slice(), self.dst.as_slice_mut())?;
        Ok(())
    }

    /// Bytes moved by one copy (read + write).
    pub fn bytes_moved(&self) -> u64 {
        2 * self.src.len() as u64
    }
}
