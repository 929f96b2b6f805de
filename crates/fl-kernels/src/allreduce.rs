//! One-shot all-reduce between the ranks of one process, through peer memory.
//!
//! A tensor-parallel decode step all-reduces a `[batch, hidden]` activation twice per layer:
//! 10 KB to 1 MB, where NCCL's latency (8-12 us on two NVLinked H100s) is the whole cost. Here
//! each rank's kernel copies its tensor into a staging buffer that every rank can address,
//! signals its peers, waits for theirs and reads their staging buffers over the link (one
//! kernel, no host involvement; vLLM's `custom_all_reduce` does the same between processes).
//!
//! ```text
//! t_r[i] = Σ_{q = 0 .. world - 1} t_q[i]     on every rank r, in place
//! ```
//! summed in f32 in rank order and rounded to `T` once, so every rank holds the same bits.
//!
//! A [`PeerGroup`] is made once from the calling thread for all devices (as
//! `ncclCommInitAll`); each [`PeerAllReduce`] it returns goes to the thread that drives that
//! rank (one rank per GPU, its context bound to that thread). Every rank must then call
//! [`PeerAllReduce::all_reduce_sum`] the same number of times, with the same element count and
//! dtype in the same order (a collective), on one stream per rank. The calls queue on the
//! stream and never synchronise, so they can be captured in a CUDA graph. A rank waiting for a
//! peer that never comes waits until [`AbortHandle::abort`].
//!
//! ```no_run
//! use fl_kernels::allreduce::PeerGroup;
//! use fl_kernels::{DeviceTensor, Gpu};
//! let gpus = [Gpu::new(0)?, Gpu::new(1)?];
//! let ranks = PeerGroup::new(&[gpus[0].context().clone(), gpus[1].context().clone()], 1 << 20)?
//!     .into_ranks();
//! std::thread::scope(|s| {
//!     for (gpu, rank) in gpus.iter().zip(ranks) {
//!         s.spawn(move || -> fl_kernels::Result<()> {
//!             gpu.context().bind_to_thread()?;
//!             let st = gpu.stream();
//!             let mut t = DeviceTensor::from_host(st, &[1.0f32; 4096], &[1, 4096])?;
//!             rank.all_reduce_sum(st, &mut t)?;
//!             assert_eq!(t.to_host(st)?, vec![2.0; 4096]);
//!             Ok(())
//!         });
//!     }
//! });
//! # Ok::<(), fl_kernels::Error>(())
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{CudaContext, CudaStream};
use fl_kernels_sys::fl_allreduce_peers;

use crate::dtype::FloatDType;
use crate::error::check;
use crate::tensor::raw_stream;
use crate::{DeviceTensor, Error, Result};

/// Most ranks in one group.
pub const MAX_RANKS: usize = fl_kernels_sys::FL_ALLREDUCE_MAX_RANKS as usize;

/// One rank's buffers on its device.
struct RankMem {
    ctx: Arc<CudaContext>,
    staging: CUdeviceptr,
    flags: CUdeviceptr,
    counter: CUdeviceptr,
    abort_dev: CUdeviceptr,
}

struct Shared {
    ranks: Vec<RankMem>,
    /// The abort word, host memory mapped into every rank's context.
    abort_host: *mut i32,
    aborted: AtomicBool,
    capacity: usize,
    peers: fl_allreduce_peers,
}

// SAFETY: the raw pointers are device / pinned host allocations owned by this struct, freed
// only in Drop; the host word is written with volatile stores and read by kernels.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Drop for Shared {
    fn drop(&mut self) {
        for r in &self.ranks {
            if r.ctx.bind_to_thread().is_ok() {
                for p in [r.staging, r.flags, r.counter] {
                    if p != 0 {
                        // SAFETY: allocated by cuMemAlloc in this context; no rank uses it any
                        // more (every PeerAllReduce holding the Arc is gone).
                        unsafe {
                            let _ = sys::cuMemFree_v2(p);
                        }
                    }
                }
            }
        }
        if !self.abort_host.is_null() {
            // SAFETY: allocated by cuMemHostAlloc below.
            unsafe {
                let _ = sys::cuMemFreeHost(self.abort_host as *mut _);
            }
        }
    }
}

/// The buffers of a group of ranks; [`PeerGroup::into_ranks`] hands out one
/// [`PeerAllReduce`] per rank.
pub struct PeerGroup {
    shared: Arc<Shared>,
}

/// Whether a kernel on `a`'s device can read and write `b`'s memory (true for the same
/// device, which a [`PeerGroup`] nevertheless refuses). Errors: the driver's.
pub fn peer_access_possible(a: &CudaContext, b: &CudaContext) -> Result<bool> {
    if a.ordinal() == b.ordinal() {
        return Ok(true);
    }
    let mut can = 0i32;
    // SAFETY: both handles are live devices; `can` is written by the call.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, a.cu_device(), b.cu_device()) }.result()?;
    Ok(can != 0)
}

fn alloc_zeroed(bytes: usize) -> Result<CUdeviceptr> {
    let mut p: CUdeviceptr = 0;
    // SAFETY: the caller bound the context; `p` receives the allocation.
    unsafe {
        sys::cuMemAlloc_v2(&mut p, bytes).result()?;
        if let Err(e) = sys::cuMemsetD8_v2(p, 0, bytes).result() {
            let _ = sys::cuMemFree_v2(p);
            return Err(e.into());
        }
    }
    Ok(p)
}

impl PeerGroup {
    /// Buffers for `contexts.len()` ranks (rank `i` on `contexts[i]`, one rank per device) and
    /// messages of up to `capacity_bytes`: per rank two staging halves of that size, 1 KB of
    /// flags and a counter, on its device; peer access is enabled between every pair.
    ///
    /// Two ranks may not share a device: a rank's kernel waits for its peers' kernels, and two
    /// streams of one GPU may share a hardware queue (`CUDA_DEVICE_MAX_CONNECTIONS`), so the
    /// peer's kernel could sit behind the waiting one forever.
    ///
    /// Errors: [`Error::InvalidArgument`] naming `contexts` (empty, more than [`MAX_RANKS`], a
    /// device twice, or two devices without peer access: check [`peer_access_possible`]
    /// first) or `capacity_bytes` (zero); the driver's (allocation).
    pub fn new(contexts: &[Arc<CudaContext>], capacity_bytes: usize) -> Result<PeerGroup> {
        let world = contexts.len();
        if world == 0 || world > MAX_RANKS {
            return Err(Error::invalid(
                "contexts",
                format!("{world} ranks; a group holds 1 to {MAX_RANKS}"),
            ));
        }
        if capacity_bytes == 0 {
            return Err(Error::invalid("capacity_bytes", "must be > 0"));
        }
        for (i, a) in contexts.iter().enumerate() {
            for b in &contexts[i + 1..] {
                if a.ordinal() == b.ordinal() {
                    return Err(Error::invalid(
                        "contexts",
                        format!(
                            "device {} holds two ranks; one rank per device",
                            a.ordinal()
                        ),
                    ));
                }
                if !peer_access_possible(a, b)? {
                    return Err(Error::invalid(
                        "contexts",
                        format!(
                            "devices {} and {} cannot access each other's memory (no peer \
                             access between them)",
                            a.ordinal(),
                            b.ordinal()
                        ),
                    ));
                }
            }
        }
        let half = capacity_bytes.div_ceil(16) * 16;
        let mut shared = Shared {
            ranks: Vec::with_capacity(world),
            abort_host: std::ptr::null_mut(),
            aborted: AtomicBool::new(false),
            capacity: capacity_bytes,
            // SAFETY: a plain C struct of pointers; all NULL is a valid value.
            peers: unsafe { std::mem::zeroed() },
        };
        contexts[0].bind_to_thread()?;
        let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: a context is bound; `host` receives 4 bytes of pinned, mapped, portable memory.
        unsafe {
            sys::cuMemHostAlloc(
                &mut host,
                4,
                sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP,
            )
            .result()?;
            std::ptr::write_volatile(host as *mut i32, 0);
        }
        shared.abort_host = host as *mut i32;
        for ctx in contexts {
            ctx.bind_to_thread()?;
            // Pushed first so Drop frees whatever was allocated if a later step fails.
            shared.ranks.push(RankMem {
                ctx: Arc::clone(ctx),
                staging: 0,
                flags: 0,
                counter: 0,
                abort_dev: 0,
            });
            let mem = shared.ranks.last_mut().expect("pushed above");
            mem.staging = alloc_zeroed(2 * half)?;
            mem.flags = alloc_zeroed(fl_kernels_sys::FL_ALLREDUCE_FLAGS_BYTES as usize)?;
            mem.counter = alloc_zeroed(fl_kernels_sys::FL_ALLREDUCE_COUNTER_BYTES as usize)?;
            // SAFETY: `host` is mapped (DEVICEMAP, PORTABLE) into every context.
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut mem.abort_dev, host, 0) }.result()?;
            for other in contexts.iter().filter(|o| o.ordinal() != ctx.ordinal()) {
                // SAFETY: both contexts are live; enabling twice is reported and ignored.
                let r = unsafe { sys::cuCtxEnablePeerAccess(other.cu_ctx(), 0) };
                if r != sys::CUresult::CUDA_SUCCESS
                    && r != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
                {
                    r.result()?;
                }
            }
        }
        for (i, m) in shared.ranks.iter().enumerate() {
            shared.peers.staging[i] = m.staging as *mut _;
            shared.peers.flags[i] = m.flags as *mut _;
        }
        Ok(PeerGroup {
            shared: Arc::new(shared),
        })
    }

    /// One handle per rank, in rank order.
    pub fn into_ranks(self) -> Vec<PeerAllReduce> {
        (0..self.shared.ranks.len())
            .map(|rank| PeerAllReduce {
                shared: Arc::clone(&self.shared),
                rank,
            })
            .collect()
    }
}

/// Stops every rank's waits from any thread; see [`PeerAllReduce::abort_handle`].
#[derive(Clone)]
pub struct AbortHandle(Arc<Shared>);

impl AbortHandle {
    /// Every kernel of the group waiting for a peer gives up within microseconds (its tensor
    /// is then undefined), later ones do too, and every later
    /// [`PeerAllReduce::all_reduce_sum`] is an error. Idempotent; never blocks.
    pub fn abort(&self) {
        self.0.aborted.store(true, Ordering::SeqCst);
        // SAFETY: the mapped word lives as long as the Arc.
        unsafe { std::ptr::write_volatile(self.0.abort_host, 1) };
    }
}

/// One rank's side of a [`PeerGroup`] (`Send`: give it to the thread that drives the rank).
pub struct PeerAllReduce {
    shared: Arc<Shared>,
    rank: usize,
}

impl PeerAllReduce {
    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the group.
    pub fn world(&self) -> usize {
        self.shared.ranks.len()
    }

    /// The largest message, in bytes.
    pub fn capacity_bytes(&self) -> usize {
        self.shared.capacity
    }

    /// Whether a message of `n` elements of `T` fits.
    pub fn fits<T: FloatDType>(&self, n: usize) -> bool {
        n.checked_mul(std::mem::size_of::<T>())
            .is_some_and(|b| b <= self.shared.capacity)
    }

    /// A handle that aborts the whole group from any thread.
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle(Arc::clone(&self.shared))
    }

    /// `t = Σ_ranks t`, in place, queued on `stream` (a stream of this rank's device).
    ///
    /// Shapes: any; every rank passes the same element count. Dtypes: `f32`, `f16`, `bf16`.
    ///
    /// Errors: [`Error::TooLarge`] naming `t` past [`capacity_bytes`](Self::capacity_bytes);
    /// [`Error::InvalidArgument`] naming `stream` (another device than the rank's) or `group`
    /// (aborted).
    pub fn all_reduce_sum<T: FloatDType>(
        &self,
        stream: &CudaStream,
        t: &mut DeviceTensor<T>,
    ) -> Result<()> {
        let me = &self.shared.ranks[self.rank];
        if stream.context().ordinal() != me.ctx.ordinal() {
            return Err(Error::invalid(
                "stream",
                format!(
                    "a stream of device {}; rank {} is on device {}",
                    stream.context().ordinal(),
                    self.rank,
                    me.ctx.ordinal()
                ),
            ));
        }
        if self.shared.aborted.load(Ordering::SeqCst) {
            return Err(Error::invalid("group", "the all-reduce group was aborted"));
        }
        let n = t.len();
        if !self.fits::<T>(n) {
            return Err(Error::TooLarge {
                arg: "t",
                value: n.saturating_mul(std::mem::size_of::<T>()),
                limit: self.shared.capacity,
            });
        }
        let (p, _g) = t.ptr_mut(stream);
        // SAFETY: `p` holds n elements of T on this rank's device; the peers' buffers hold two
        // halves of `capacity` rounded up to 16 bytes each; counter and abort are this rank's.
        let status = unsafe {
            fl_kernels_sys::fl_allreduce_oneshot(
                T::ID,
                p as _,
                n as i64,
                self.rank as i32,
                self.world() as i32,
                &self.shared.peers,
                self.shared.capacity as i64,
                me.counter as *mut u32,
                me.abort_dev as *const i32,
                raw_stream(stream),
            )
        };
        check("allreduce_oneshot", status)
    }
}
