//! All-reduce of a tensor-parallel decode step's message over two GPUs: the one-shot kernel
//! over peer memory (`fl_kernels::allreduce`, what the engine's `TpComm::all_reduce_sum` takes
//! up to `ONE_SHOT_MAX_BYTES`; here with room for 2 MiB, to show where NCCL overtakes it)
//! beside NCCL's all-reduce (cudarc's `nccl::Comm`, as the engine calls it), f16, in place. Rank 0 is timed with events on its stream; rank 1 runs the same calls on its own
//! thread. Needs two GPUs and NCCL (`libnccl.so` on LD_LIBRARY_PATH); skips otherwise.
//! Throughput = the message's bytes.

use std::sync::mpsc;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fl_bench::{gpu_or_skip, time_on_device};
use fl_kernels::allreduce::{PeerAllReduce, PeerGroup};
use fl_kernels::cudarc::driver::{CudaContext, CudaStream};
use fl_kernels::cudarc::nccl::{Comm, ReduceOp};
use fl_kernels::{f16, DeviceTensor, Gpu};

/// (rows, hidden): decode steps of 13b (5120) and 70b (8192) at batch 1, 16, 64 and 256.
const SHAPES: &[(usize, usize)] = &[
    (1, 5120),
    (1, 8192),
    (16, 8192),
    (64, 5120),
    (32, 8192),
    (64, 8192),
    (128, 8192),
    (256, 8192),
];

/// The one-shot group's room: [128, 8192] f16.
const ONE_SHOT_BYTES: usize = 2 << 20;

/// One rank's two ways to all-reduce.
struct Rank {
    nccl: Comm,
    one_shot: Option<PeerAllReduce>,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time; each Rank is
// used by one thread only.
unsafe impl Send for Rank {}

impl Rank {
    /// `t` lives on the stream the rank's communicator was made with.
    fn call(&self, s: &Arc<CudaStream>, t: &mut DeviceTensor<f16>, nccl: bool) {
        match (&self.one_shot, nccl) {
            (Some(p), false) => p.all_reduce_sum(s, t).expect("one-shot all-reduce"),
            _ => {
                self.nccl
                    .all_reduce_in_place(t.as_slice_mut(), &ReduceOp::Sum)
                    .expect("NCCL all-reduce");
            }
        }
    }
}

fn benches(c: &mut Criterion) {
    let Some(gpu0) = gpu_or_skip("allreduce") else {
        return;
    };
    if CudaContext::device_count().unwrap_or(0) < 2 {
        eprintln!("SKIP allreduce: needs two GPUs");
        return;
    }
    // SAFETY: only checks whether libnccl.so can be opened.
    if !unsafe { fl_kernels::cudarc::nccl::sys::is_culib_present() } {
        eprintln!("SKIP allreduce: libnccl.so not found (a symlink to libnccl.so.2 on LD_LIBRARY_PATH serves)");
        return;
    }
    let gpu1 = Gpu::new(1).unwrap();
    let comms = match Comm::from_devices(vec![gpu0.stream().clone(), gpu1.stream().clone()]) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("SKIP allreduce: NCCL init: {e:?}");
            return;
        }
    };
    let mut comms = comms.into_iter();
    let ctxs = [gpu0.context().clone(), gpu1.context().clone()];
    let mut peers = match PeerGroup::new(&ctxs, ONE_SHOT_BYTES) {
        Ok(g) => g.into_ranks().into_iter().map(Some).collect(),
        Err(e) => {
            eprintln!("allreduce: no one-shot group ({e}): NCCL rows only");
            vec![None, None]
        }
    }
    .into_iter();
    let rank0 = Rank {
        nccl: comms.next().unwrap(),
        one_shot: peers.next().unwrap(),
    };
    let rank1 = Rank {
        nccl: comms.next().unwrap(),
        one_shot: peers.next().unwrap(),
    };
    // Rank 1: runs (elems, iters, nccl) batches of calls as rank 0 asks.
    let (tx, rx) = mpsc::channel::<Option<(usize, u64, bool)>>();
    let worker = std::thread::spawn(move || {
        gpu1.context().bind_to_thread().unwrap();
        let s = gpu1.stream().clone();
        let mut bufs: std::collections::HashMap<usize, DeviceTensor<f16>> = Default::default();
        while let Ok(Some((n, iters, nccl))) = rx.recv() {
            let t = bufs
                .entry(n)
                .or_insert_with(|| DeviceTensor::zeros(&s, &[n]).unwrap());
            for _ in 0..iters {
                rank1.call(&s, t, nccl);
            }
            s.synchronize().unwrap();
        }
    });
    gpu0.context().bind_to_thread().unwrap();
    let s = gpu0.stream().clone();
    let mut g = c.benchmark_group("allreduce_f16_2gpus");
    for &(rows, hidden) in SHAPES {
        let n = rows * hidden;
        let mut t = DeviceTensor::<f16>::zeros(&s, &[n]).unwrap();
        g.throughput(Throughput::Bytes((n * 2) as u64));
        for nccl in [false, true] {
            if !nccl && (rank0.one_shot.is_none() || n * 2 > ONE_SHOT_BYTES) {
                continue;
            }
            let name = if nccl { "nccl" } else { "one_shot" };
            g.bench_with_input(
                BenchmarkId::new(name, format!("{rows}x{hidden}")),
                &n,
                |b, _| {
                    b.iter_custom(|iters| {
                        tx.send(Some((n, iters, nccl))).unwrap();
                        time_on_device(&s, iters, || {
                            rank0.call(&s, &mut t, nccl);
                            Ok(())
                        })
                    })
                },
            );
        }
    }
    g.finish();
    tx.send(None).unwrap();
    worker.join().unwrap();
}

criterion_group! {
    name = group;
    config = Criterion::default().sample_size(20).warm_up_time(std::time::Duration::from_millis(300))
        .measurement_time(std::time::Duration::from_millis(800));
    targets = benches
}
criterion_main!(group);
