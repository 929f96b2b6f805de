//! One rank's NCCL communicator ([`TpComm`]) and the handle that aborts it from another
//! thread ([`AbortHandle`]).
//!
//! cudarc's `nccl::Comm` cannot be aborted from outside its thread, and a group whose rank
//! failed needs exactly that (the other ranks sit in a collective that will never complete),
//! so this wraps NCCL's C calls directly: the communicator lives behind a mutex that the rank
//! holds only while it enqueues a collective, and that [`AbortHandle::abort`] empties
//! (`ncclCommAbort`), after which every call errors.
//!
//! Messages up to [`ONE_SHOT_MAX_BYTES`] (a decode step's `[batch, hidden]`) take the one-shot
//! all-reduce over peer memory ([`fl_kernels::allreduce`]) where every pair of the group's
//! devices has peer access: one kernel, no NCCL, 0.65x NCCL's latency at one token.
//! Larger ones (prefill chunks) take NCCL's ring. Both sum in a fixed order, so every rank
//! holds the same bits either way.

use std::sync::{Arc, Mutex};

use fl_kernels::allreduce::{self, PeerAllReduce, PeerGroup};
use fl_kernels::cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut};
use fl_kernels::cudarc::nccl::{result, sys};
use fl_kernels::DeviceTensor;

use crate::dtype::RunDType;
use crate::error::{EngineError, Result};

/// Whether the NCCL library can be loaded (`libnccl.so`, as cudarc looks for it). Where only
/// `libnccl.so.2` is installed, a symlink named `libnccl.so` on `LD_LIBRARY_PATH` serves.
pub fn nccl_available() -> bool {
    // SAFETY: only tries to open the library.
    unsafe { sys::is_culib_present() }
}

fn nccl_err(op: &'static str, e: result::NcclError) -> EngineError {
    EngineError::Nccl {
        op,
        detail: format!("{:?}", e.0),
    }
}

struct Raw(sys::ncclComm_t);
// SAFETY: an NCCL communicator may be used from any thread, one call at a time; the mutex
// around it serialises the rank's calls and the abort.
unsafe impl Send for Raw {}

/// The largest message that takes the one-shot all-reduce over peer memory: `[16, 8192]` in
/// f16. Measured on two NVLinked H200s (bench/benches/allreduce.rs, 2026-11-28): one-shot /
/// NCCL 6.5 / 10.1 us at 10 KB, 8.3 / 9.0 us at 256 KB, 12.8 / 12.1 us at 640 KB and 17.2 /
/// 14.2 us at 1 MB (one peer read per element beats NCCL's ring only while latency dominates).
pub const ONE_SHOT_MAX_BYTES: usize = 256 << 10;

/// Aborts a rank's communicator from any thread (a rank blocked in a collective then returns).
#[derive(Clone)]
pub struct AbortHandle(Arc<Mutex<Option<Raw>>>, Option<allreduce::AbortHandle>);

impl AbortHandle {
    /// `ncclCommAbort`, and the group's one-shot all-reduce released: a collective the rank is
    /// blocked in returns, and every later call of the rank's [`TpComm`] is an
    /// [`EngineError::Nccl`]. Idempotent.
    pub fn abort(&self) {
        if let Some(p) = &self.1 {
            p.abort();
        }
        let raw = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(Raw(c)) = raw {
            // SAFETY: `c` is a live communicator, taken out of the slot so no other call uses
            // it after this.
            unsafe {
                let _ = result::comm_abort(c);
            }
        }
    }
}

/// One rank's communicator: rank `rank` of `size`. Its collectives queue on the stream they
/// are given and never synchronise, so they can be captured in a CUDA graph.
pub struct TpComm {
    slot: Arc<Mutex<Option<Raw>>>,
    peer: Option<PeerAllReduce>,
    rank: usize,
    size: usize,
}

impl TpComm {
    /// One communicator per device of `devices` (rank `i` on `devices[i]`), created together
    /// from the calling thread (`ncclCommInitAll`); hand each to the thread that drives its
    /// device.
    ///
    /// With peer access between every pair of `devices`, the group also gets the one-shot
    /// all-reduce for messages up to [`ONE_SHOT_MAX_BYTES`]; without, NCCL carries them all.
    ///
    /// Errors: [`EngineError::Nccl`] naming `init` (no NCCL library, or NCCL failed). A
    /// one-shot group that cannot be made (peer access refused, no memory) is reported on
    /// stderr and left out.
    pub fn init_all(devices: &[usize]) -> Result<Vec<TpComm>> {
        if !nccl_available() {
            return Err(EngineError::Nccl {
                op: "init",
                detail: "the NCCL library (libnccl.so) was not found: install NCCL, or put a \
                         libnccl.so symlink to libnccl.so.2 on LD_LIBRARY_PATH"
                    .into(),
            });
        }
        let n = devices.len();
        let ords: Vec<i32> = devices.iter().map(|&d| d as i32).collect();
        let mut raw: Vec<sys::ncclComm_t> = vec![std::ptr::null_mut(); n];
        // SAFETY: `raw` has room for `n` communicators, `ords` holds `n` device ordinals.
        unsafe { result::comm_init_all(raw.as_mut_ptr(), n as i32, ords.as_ptr()) }
            .map_err(|e| nccl_err("init", e))?;
        let mut comms: Vec<TpComm> = raw
            .into_iter()
            .enumerate()
            .map(|(rank, c)| TpComm {
                slot: Arc::new(Mutex::new(Some(Raw(c)))),
                peer: None,
                rank,
                size: n,
            })
            .collect();
        // An error here drops `comms`, which aborts their NCCL communicators.
        if let Some(peers) = one_shot_group(devices)? {
            for (c, p) in comms.iter_mut().zip(peers) {
                c.peer = Some(p);
            }
        }
        Ok(comms)
    }

    /// Whether [`all_reduce_sum`](Self::all_reduce_sum) of `n` elements of `T` takes the
    /// one-shot all-reduce (the group has it and the message fits [`ONE_SHOT_MAX_BYTES`]).
    pub fn takes_one_shot<T: RunDType>(&self, n: usize) -> bool {
        self.peer.as_ref().is_some_and(|p| p.fits::<T>(n))
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the group.
    pub fn size(&self) -> usize {
        self.size
    }

    /// A handle that aborts this communicator from another thread.
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle(
            Arc::clone(&self.slot),
            self.peer.as_ref().map(PeerAllReduce::abort_handle),
        )
    }

    fn with<R>(
        &self,
        op: &'static str,
        f: impl FnOnce(sys::ncclComm_t) -> std::result::Result<R, result::NcclError>,
    ) -> Result<R> {
        let g = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        match g.as_ref() {
            Some(Raw(c)) => f(*c).map_err(|e| nccl_err(op, e)),
            None => Err(aborted(op)),
        }
    }

    /// `t = Σ_ranks t`, in place, on `stream`: the one-shot all-reduce up to
    /// [`ONE_SHOT_MAX_BYTES`] where the group has it, NCCL otherwise.
    pub fn all_reduce_sum<T: RunDType>(
        &self,
        stream: &Arc<CudaStream>,
        t: &mut DeviceTensor<T>,
    ) -> Result<()> {
        match &self.peer {
            Some(p) if self.takes_one_shot::<T>(t.len()) => {
                if self
                    .slot
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .is_none()
                {
                    return Err(aborted("all_reduce"));
                }
                p.all_reduce_sum(stream, t).map_err(|e| EngineError::Nccl {
                    op: "all_reduce",
                    detail: format!("one-shot all-reduce: {e}"),
                })
            }
            _ => self.all_reduce_sum_nccl(stream, t),
        }
    }

    /// `t = Σ_ranks t` through NCCL whatever the size (what [`all_reduce_sum`] does past
    /// [`ONE_SHOT_MAX_BYTES`]; public to time the two side by side).
    ///
    /// [`all_reduce_sum`]: Self::all_reduce_sum
    pub fn all_reduce_sum_nccl<T: RunDType>(
        &self,
        stream: &Arc<CudaStream>,
        t: &mut DeviceTensor<T>,
    ) -> Result<()> {
        let n = t.len();
        let (p, _g) = t.as_slice_mut().device_ptr_mut(stream);
        let s = stream.cu_stream();
        self.with("all_reduce", |c| unsafe {
            // SAFETY: `p` holds `n` elements of T on this rank's device; `s` is its stream.
            result::all_reduce(
                p as *const _,
                p as *mut _,
                n,
                nccl_type::<T>(),
                sys::ncclRedOp_t::ncclSum,
                c,
                s as _,
            )
        })?;
        Ok(())
    }

    /// `dst = [src of rank 0, src of rank 1, ...]` on `stream` (`dst` holds `size` times
    /// `src`'s elements). Errors: [`EngineError::Invalid`] naming `dst` when its length is not
    /// that; NCCL's.
    pub fn all_gather<T: RunDType>(
        &self,
        stream: &Arc<CudaStream>,
        src: &DeviceTensor<T>,
        dst: &mut DeviceTensor<T>,
    ) -> Result<()> {
        let n = src.len();
        if dst.len() != n * self.size {
            return Err(EngineError::invalid(
                "dst",
                format!(
                    "{} elements, the gather of {n} from {} ranks needs {}",
                    dst.len(),
                    self.size,
                    n * self.size
                ),
            ));
        }
        let (sp, _gs) = src.as_slice().device_ptr(stream);
        let (dp, _gd) = dst.as_slice_mut().device_ptr_mut(stream);
        let s = stream.cu_stream();
        self.with("all_gather", |c| unsafe {
            // SAFETY: sizes checked above; both on this rank's device.
            result::all_gather(sp as *const _, dp as *mut _, n, nccl_type::<T>(), c, s as _)
        })?;
        Ok(())
    }
}

impl Drop for TpComm {
    fn drop(&mut self) {
        self.abort_handle().abort();
    }
}

fn aborted(op: &'static str) -> EngineError {
    EngineError::Nccl {
        op,
        detail: "the communicator was aborted (another rank failed)".into(),
    }
}

/// The one-shot group of `devices`, or `None` where two of them lack peer access.
fn one_shot_group(devices: &[usize]) -> Result<Option<Vec<PeerAllReduce>>> {
    let err = |e: fl_kernels::Error| EngineError::Nccl {
        op: "init",
        detail: format!("one-shot all-reduce: {e}"),
    };
    let ctxs = devices
        .iter()
        .map(|&d| CudaContext::new(d))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| err(e.into()))?;
    for (i, a) in ctxs.iter().enumerate() {
        for b in &ctxs[i + 1..] {
            if !allreduce::peer_access_possible(a, b).map_err(err)? {
                return Ok(None);
            }
        }
    }
    match PeerGroup::new(&ctxs, ONE_SHOT_MAX_BYTES) {
        Ok(group) => Ok(Some(group.into_ranks())),
        // E.g. peer access refused by the driver: NCCL still carries every all-reduce.
        Err(e) => {
            eprintln!(
                "fl: the one-shot all-reduce is unavailable ({e}); NCCL carries every all-reduce"
            );
            Ok(None)
        }
    }
}

/// NCCL's type for a run dtype.
fn nccl_type<T: RunDType>() -> sys::ncclDataType_t {
    match <T as fl_kernels::DType>::NAME {
        "f16" => sys::ncclDataType_t::ncclFloat16,
        "bf16" => sys::ncclDataType_t::ncclBfloat16,
        _ => sys::ncclDataType_t::ncclFloat32,
    }
}
