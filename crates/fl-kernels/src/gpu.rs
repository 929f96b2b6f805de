//! Device and stream handling on cudarc.

use std::sync::Arc;

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaStream};

use crate::{Error, Result};

/// Lowest compute capability the kernels are built for (Ampere, sm_80).
pub const MIN_COMPUTE_CAPABILITY: (i32, i32) = (8, 0);

/// One GPU and the stream work is queued on.
///
/// A thin handle over cudarc's [`CudaContext`] and [`CudaStream`]; clone it freely.
/// Every op of this crate takes the stream explicitly (`gpu.stream()`), queues its work
/// there and returns without waiting: nothing here synchronises except the explicit
/// copies to the host ([`DeviceTensor::to_host`](crate::DeviceTensor::to_host)) and
/// [`Gpu::synchronize`].
///
/// ```no_run
/// let gpu = fl_kernels::Gpu::new(0)?;
/// println!("{} (sm_{}{}), {} SMs", gpu.name()?, gpu.compute_capability().0,
///          gpu.compute_capability().1, gpu.sm_count());
/// # Ok::<(), fl_kernels::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    cc: (i32, i32),
    sms: usize,
}

/// Whether the CUDA driver library can be loaded and reports at least one device.
/// Never panics.
pub fn gpu_available() -> bool {
    probe().is_ok()
}

fn probe() -> Result<i32> {
    // SAFETY: only checks whether libcuda can be dlopen'ed; calls no CUDA function.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(Error::NoGpu(
            "the CUDA driver library (libcuda.so) was not found".into(),
        ));
    }
    let n = CudaContext::device_count().map_err(|e| Error::NoGpu(format!("{e}")))?;
    if n < 1 {
        return Err(Error::NoGpu("the CUDA driver reports no device".into()));
    }
    Ok(n)
}

impl Gpu {
    /// Opens device `ordinal` (its primary context) and its default stream.
    ///
    /// Errors: [`Error::NoGpu`] when there is no driver or no such device, or the device's
    /// compute capability is below 8.0.
    pub fn new(ordinal: usize) -> Result<Self> {
        let n = probe()?;
        if ordinal >= n as usize {
            return Err(Error::invalid(
                "ordinal",
                format!("device {ordinal} requested, {n} present"),
            ));
        }
        let ctx = CudaContext::new(ordinal)?;
        let cc = ctx.compute_capability()?;
        if cc < MIN_COMPUTE_CAPABILITY {
            return Err(Error::NoGpu(format!(
                "device {ordinal} has compute capability {}.{}; FasterLLaMA-rs needs 8.0 or newer",
                cc.0, cc.1
            )));
        }
        let sms = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let stream = ctx.default_stream();
        Ok(Gpu {
            ctx,
            stream,
            cc,
            sms: sms.max(1) as usize,
        })
    }

    /// A handle on the same device whose ops go to a new, separate stream.
    pub fn with_new_stream(&self) -> Result<Self> {
        let stream = self.ctx.new_stream()?;
        Ok(Gpu {
            stream,
            ..self.clone()
        })
    }

    /// The stream ops are queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The cudarc context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Device name as the driver reports it.
    pub fn name(&self) -> Result<String> {
        Ok(self.ctx.name()?)
    }

    /// Compute capability (major, minor).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.cc
    }

    /// Number of streaming multiprocessors.
    pub fn sm_count(&self) -> usize {
        self.sms
    }

    /// Waits for all work queued on this handle's stream.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.stream.synchronize()?)
    }
}

/// Device time of the work `f` queues on `stream`, measured with CUDA events around it, in
/// milliseconds. Waits for the end event (a sync point: meant for benches and demos).
pub fn time_on_stream(stream: &CudaStream, f: impl FnOnce() -> Result<()>) -> Result<f64> {
    use cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
    let start = stream.record_event(Some(CU_EVENT_DEFAULT))?;
    f()?;
    let end = stream.record_event(Some(CU_EVENT_DEFAULT))?;
    end.synchronize()?;
    Ok(start.elapsed_ms(&end)? as f64)
}
