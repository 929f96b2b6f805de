//! allreduce::PeerAllReduce against reference::elementwise::sum_ranks on two GPUs (skipped
//! with one; `FL_REQUIRE_TP=1` makes a missing second GPU a failure): bit-exact sums at odd
//! sizes in every dtype, calls queued back to back without a host wait (the staging halves'
//! reuse), a CUDA graph replayed with new inputs, the abort of a rank whose peer never comes;
//! one rank alone (any GPU), and the argument errors.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fl_kernels::allreduce::{PeerAllReduce, PeerGroup};
use fl_kernels::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use fl_kernels::cudarc::driver::{CudaContext, CudaStream};
use fl_kernels::testing::{gpu_or_skip, random, rng, to_f64};
use fl_kernels::{bf16, f16, reference, DeviceTensor, Error, FloatDType};
use rand::SeedableRng;

const CAPACITY: usize = 1 << 20;

/// Element counts: 1, a partial 16-byte unit, a 13b / 70b decode row, odd, a batch of 64 rows,
/// and the capacity in f32.
const SIZES: &[usize] = &[1, 7, 8, 5120, 5121, 8192, 64 * 5120 + 3, CAPACITY / 4];

fn require_tp() -> bool {
    matches!(
        std::env::var("FL_REQUIRE_TP").as_deref(),
        Ok("1") | Ok("true")
    )
}

/// Devices 0 and 1, with cudarc's cross-stream event tracking off (as the engine runs: its
/// event waits are not allowed inside a graph capture).
fn two_gpus(test: &str) -> Option<Vec<Arc<CudaContext>>> {
    let gpu = gpu_or_skip(test)?;
    let n = CudaContext::device_count().unwrap_or(0);
    if n < 2 {
        assert!(
            !require_tp(),
            "{test}: FL_REQUIRE_TP=1 but {n} GPU(s) present"
        );
        eprintln!("SKIP {test}: needs two GPUs, {n} present (FL_REQUIRE_TP=1 makes it a failure)");
        return None;
    }
    let ctxs = vec![gpu.context().clone(), CudaContext::new(1).unwrap()];
    for c in &ctxs {
        // SAFETY: each tensor of these tests is used on the one stream it was made on.
        unsafe { c.disable_event_tracking() };
    }
    Some(ctxs)
}

/// Runs `body(rank handle, its own stream)` on one thread per rank; panics of any rank fail
/// the test.
fn on_ranks(ctxs: &[Arc<CudaContext>], body: impl Fn(&PeerAllReduce, &Arc<CudaStream>) + Sync) {
    let ranks = PeerGroup::new(ctxs, CAPACITY).unwrap().into_ranks();
    std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .zip(ctxs)
            .map(|(rank, ctx)| {
                let body = &body;
                s.spawn(move || {
                    ctx.bind_to_thread().unwrap();
                    let st = ctx.new_stream().unwrap();
                    body(rank, &st);
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    });
}

/// Rank `r`'s input of call `call` (every rank can draw every rank's).
fn input<T: FloatDType>(rank: usize, call: usize, n: usize) -> Vec<T> {
    let mut r = rand::rngs::StdRng::seed_from_u64((rank * 1_000_003 + call) as u64 ^ 0xa11);
    random(&mut r, n)
}

fn want<T: FloatDType>(world: usize, call: usize, n: usize) -> Vec<T> {
    let parts: Vec<Vec<T>> = (0..world).map(|r| input(r, call, n)).collect();
    let refs: Vec<&[T]> = parts.iter().map(|p| p.as_slice()).collect();
    reference::elementwise::sum_ranks(&refs)
}

/// Each size once with a host wait after each call, then all sizes queued back to back
/// (three rounds) and checked after one wait.
fn sums_match<T: FloatDType>(ctxs: &[Arc<CudaContext>]) {
    let world = ctxs.len();
    on_ranks(ctxs, |rank, st| {
        let sizes: Vec<usize> = SIZES
            .iter()
            .copied()
            .filter(|&n| rank.fits::<T>(n))
            .collect();
        for (call, &n) in sizes.iter().enumerate() {
            let mut t =
                DeviceTensor::from_host(st, &input::<T>(rank.rank(), call, n), &[n]).unwrap();
            rank.all_reduce_sum(st, &mut t).unwrap();
            assert_eq!(
                to_f64(&t.to_host(st).unwrap()),
                to_f64(&want::<T>(world, call, n)),
                "{} n={n} rank {}",
                T::NAME,
                rank.rank()
            );
        }
        let calls: Vec<(usize, usize)> = (0..3 * sizes.len())
            .map(|i| (100 + i, sizes[(i * 5) % sizes.len()]))
            .collect();
        let mut ts: Vec<DeviceTensor<T>> = calls
            .iter()
            .map(|&(call, n)| {
                DeviceTensor::from_host(st, &input::<T>(rank.rank(), call, n), &[n]).unwrap()
            })
            .collect();
        for t in &mut ts {
            rank.all_reduce_sum(st, t).unwrap();
        }
        for (t, &(call, n)) in ts.iter().zip(&calls) {
            assert_eq!(
                to_f64(&t.to_host(st).unwrap()),
                to_f64(&want::<T>(world, call, n)),
                "{} back to back, call {call} n={n} rank {}",
                T::NAME,
                rank.rank()
            );
        }
    });
}

#[test]
fn two_gpus_sum_exactly() {
    let Some(ctxs) = two_gpus("two_gpus_sum_exactly") else {
        return;
    };
    sums_match::<f32>(&ctxs);
    sums_match::<f16>(&ctxs);
    sums_match::<bf16>(&ctxs);
}

#[test]
fn one_rank_is_the_identity() {
    let Some(gpu) = gpu_or_skip("one_rank_is_the_identity") else {
        return;
    };
    on_ranks(&[gpu.context().clone()], |rank, st| {
        let x: Vec<f16> = random(&mut rng("one_rank"), 5121);
        let mut t = DeviceTensor::from_host(st, &x, &[5121]).unwrap();
        rank.all_reduce_sum(st, &mut t).unwrap();
        assert_eq!(t.to_host(st).unwrap(), x);
    });
}

/// Two all-reduces captured once per rank, the graph replayed with new inputs copied in
/// between: the epoch lives on the device, so each replay is a new call.
fn graph_replays(ctxs: &[Arc<CudaContext>]) {
    let world = ctxs.len();
    on_ranks(ctxs, |rank, st| {
        let (na, nb) = (5120usize, 64 * 8192usize);
        let mut a = DeviceTensor::<f16>::zeros(st, &[na]).unwrap();
        let mut b = DeviceTensor::<f16>::zeros(st, &[nb]).unwrap();
        st.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .unwrap();
        rank.all_reduce_sum(st, &mut a).unwrap();
        rank.all_reduce_sum(st, &mut b).unwrap();
        let g = st
            .end_capture(CUgraphInstantiate_flags(0))
            .unwrap()
            .expect("a graph");
        for replay in 0..5 {
            a.copy_from_host(st, &input(rank.rank(), 2 * replay, na))
                .unwrap();
            b.copy_from_host(st, &input(rank.rank(), 2 * replay + 1, nb))
                .unwrap();
            g.launch().unwrap();
            assert_eq!(a.to_host(st).unwrap(), want::<f16>(world, 2 * replay, na));
            assert_eq!(
                b.to_host(st).unwrap(),
                want::<f16>(world, 2 * replay + 1, nb)
            );
        }
    });
}

#[test]
fn graph_replays_on_two_gpus() {
    let Some(ctxs) = two_gpus("graph_replays_on_two_gpus") else {
        return;
    };
    graph_replays(&ctxs);
}

/// Rank 0 calls, rank 1 never does: the abort releases rank 0's kernel (no hang) and later
/// calls are errors naming the group.
#[test]
fn abort_releases_a_rank_whose_peer_never_comes() {
    let Some(ctxs) = two_gpus("abort_releases_a_rank_whose_peer_never_comes") else {
        return;
    };
    let ranks = PeerGroup::new(&ctxs, CAPACITY).unwrap().into_ranks();
    let abort = ranks[1].abort_handle();
    let ctx = &ctxs[0];
    ctx.bind_to_thread().unwrap();
    let st = ctx.new_stream().unwrap();
    let mut t = DeviceTensor::<f32>::zeros(&st, &[4096]).unwrap();
    ranks[0].all_reduce_sum(&st, &mut t).unwrap();
    let t0 = Instant::now();
    let aborter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        abort.abort();
    });
    st.synchronize().unwrap();
    let waited = t0.elapsed();
    aborter.join().unwrap();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(5),
        "the waiting kernel ended after {waited:?}"
    );
    match ranks[0].all_reduce_sum(&st, &mut t) {
        Err(Error::InvalidArgument { arg: "group", .. }) => {}
        other => panic!("expected an error naming `group`, got {other:?}"),
    }
}

#[test]
fn bad_arguments_are_named() {
    // Without a GPU: an empty group.
    match PeerGroup::new(&[], CAPACITY) {
        Err(Error::InvalidArgument {
            arg: "contexts", ..
        }) => {}
        Err(e) => panic!("expected an error naming `contexts`, got {e}"),
        Ok(_) => panic!("an empty group was accepted"),
    }
    let Some(gpu) = gpu_or_skip("bad_arguments_are_named") else {
        return;
    };
    let ctx = gpu.context().clone();
    match PeerGroup::new(std::slice::from_ref(&ctx), 0) {
        Err(Error::InvalidArgument {
            arg: "capacity_bytes",
            ..
        }) => {}
        Err(e) => panic!("expected an error naming `capacity_bytes`, got {e}"),
        Ok(_) => panic!("a zero capacity was accepted"),
    }
    match PeerGroup::new(&[ctx.clone(), ctx.clone()], 1024) {
        Err(Error::InvalidArgument {
            arg: "contexts",
            reason,
        }) => {
            assert!(reason.contains("two ranks"), "{reason}")
        }
        Err(e) => panic!("expected an error naming `contexts`, got {e}"),
        Ok(_) => panic!("two ranks on one device were accepted"),
    }
    match PeerGroup::new(&vec![ctx.clone(); 9], 1024) {
        Err(Error::InvalidArgument {
            arg: "contexts", ..
        }) => {}
        Err(e) => panic!("expected an error naming `contexts`, got {e}"),
        Ok(_) => panic!("9 ranks were accepted"),
    }
    let rank = PeerGroup::new(std::slice::from_ref(&ctx), 1024)
        .unwrap()
        .into_ranks()
        .pop()
        .unwrap();
    let st = gpu.stream();
    let mut big = DeviceTensor::<f32>::zeros(st, &[257]).unwrap();
    match rank.all_reduce_sum(st, &mut big) {
        Err(Error::TooLarge { arg: "t", .. }) => {}
        other => panic!("expected TooLarge naming `t`, got {other:?}"),
    }
    assert!(rank.fits::<f32>(256) && !rank.fits::<f32>(257) && rank.fits::<f16>(512));
}
