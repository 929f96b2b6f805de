//! The Hopper wgmma building blocks of kernels/wgmma_probe.cu against f64 products, at the
//! prefill kernel's tile shapes (64 queries x 128 keys, head_dim 128): the shared-memory
//! descriptors and 128-byte swizzle of K-major (Q [64, 128], K [128, 128]) and MN-major
//! (V [128, 128]) tiles, the accumulator layout of wgmma.m64n128k16 (S [64, 128]), and the
//! register-A form fed from it (P [64, 128] in registers times V). A wrong descriptor field or
//! layout guess gives errors of order 1; f32 accumulation of exact f16 products stays within
//! 1e-5.
//! Skipped (with a notice) on a GPU other than sm_90 (the kernels are sm_90a only).

use fl_kernels::cudarc::driver::{DevicePtr, DevicePtrMut};
use fl_kernels::testing::{gpu_or_skip, rel_l2};
use fl_kernels::{f16, DeviceTensor, Gpu};
use rand::{Rng, SeedableRng};

fn hopper(gpu: &Gpu, name: &str) -> bool {
    let (major, _) = gpu.compute_capability();
    if major != 9 {
        eprintln!("SKIP {name}: wgmma needs an sm_90 GPU (this one is sm_{major}x)");
        return false;
    }
    true
}

fn halves(r: &mut impl Rng, n: usize) -> Vec<f16> {
    (0..n)
        .map(|_| f16::from_f32(r.random_range(-1.0f32..1.0)))
        .collect()
}

/// Asserts a [64, 128] row-major result within rel L2 1e-5 of its f64 reference, naming the
/// first wrong element (to tell a layout error, a permutation, from noise).
fn check_64x128(what: &str, got: &[f32], want: &[f64]) {
    let got64: Vec<f64> = got.iter().map(|&x| x as f64).collect();
    let err = rel_l2(got, want);
    let bad = (0..64 * 128).find(|&i| (got64[i] - want[i]).abs() > 1e-3 * (1.0 + want[i].abs()));
    assert!(
        err < 1e-5,
        "{what} rel L2 {err}; first bad (row, col) {:?}: got {:?} want {:?}",
        bad.map(|i| (i / 128, i % 128)),
        bad.map(|i| got64[i]),
        bad.map(|i| want[i])
    );
}

#[test]
fn wgmma_qk_matches_f64() {
    let Some(gpu) = gpu_or_skip("wgmma_qk_matches_f64") else {
        return;
    };
    if !hopper(&gpu, "wgmma_qk_matches_f64") {
        return;
    }
    let s = gpu.stream();
    let mut r = rand::rngs::StdRng::seed_from_u64(7);
    for case in 0..3 {
        let (q, k) = (halves(&mut r, 64 * 128), halves(&mut r, 128 * 128));
        let qd = DeviceTensor::from_host(s, &q, &[64, 128]).unwrap();
        let kd = DeviceTensor::from_host(s, &k, &[128, 128]).unwrap();
        let mut sd = DeviceTensor::<f32>::filled(s, &[64, 128], f32::NAN).unwrap();
        {
            let (pq, _g1) = qd.as_slice().device_ptr(s);
            let (pk, _g2) = kd.as_slice().device_ptr(s);
            let (ps, _g3) = sd.as_slice_mut().device_ptr_mut(s);
            // SAFETY: q holds 64 x 128 f16, k 128 x 128 f16, s 64 x 128 f32, the sizes the probe
            // reads and writes; the guards keep them alive until the launch is queued.
            let st = unsafe {
                fl_kernels_sys::fl_wgmma_probe_qk(pq as _, pk as _, ps as _, s.cu_stream() as _)
            };
            assert_eq!(st, fl_kernels_sys::FL_OK as i32, "launch");
        }
        let got = sd.to_host(s).unwrap();
        let mut want = vec![0f64; 64 * 128];
        for i in 0..64 {
            for j in 0..128 {
                want[i * 128 + j] = (0..128)
                    .map(|e| q[i * 128 + e].to_f64() * k[j * 128 + e].to_f64())
                    .sum();
            }
        }
        check_64x128(&format!("case {case}: S = Q K^T"), &got, &want);
    }
}

#[test]
fn wgmma_pv_matches_f64() {
    let Some(gpu) = gpu_or_skip("wgmma_pv_matches_f64") else {
        return;
    };
    if !hopper(&gpu, "wgmma_pv_matches_f64") {
        return;
    }
    let s = gpu.stream();
    let mut r = rand::rngs::StdRng::seed_from_u64(11);
    for case in 0..3 {
        let p: Vec<f32> = (0..64 * 128).map(|_| r.random_range(0.0f32..1.0)).collect();
        let v = halves(&mut r, 128 * 128);
        let pd = DeviceTensor::from_host(s, &p, &[64, 128]).unwrap();
        let vd = DeviceTensor::from_host(s, &v, &[128, 128]).unwrap();
        let mut od = DeviceTensor::<f32>::filled(s, &[64, 128], f32::NAN).unwrap();
        {
            let (pp, _g1) = pd.as_slice().device_ptr(s);
            let (pv, _g2) = vd.as_slice().device_ptr(s);
            let (po, _g3) = od.as_slice_mut().device_ptr_mut(s);
            // SAFETY: p holds 64 x 128 f32, v 128 x 128 f16, o 64 x 128 f32, what the probe
            // reads and writes; the guards keep them alive until the launch is queued.
            let st = unsafe {
                fl_kernels_sys::fl_wgmma_probe_pv(pp as _, pv as _, po as _, s.cu_stream() as _)
            };
            assert_eq!(st, fl_kernels_sys::FL_OK as i32, "launch");
        }
        let got = od.to_host(s).unwrap();
        // P is rounded to f16 in the kernel (the A operand), as the reference does.
        let ph: Vec<f64> = p.iter().map(|&x| f16::from_f32(x).to_f64()).collect();
        let mut want = vec![0f64; 64 * 128];
        for i in 0..64 {
            for j in 0..128 {
                want[i * 128 + j] = (0..128)
                    .map(|e| ph[i * 128 + e] * v[e * 128 + j].to_f64())
                    .sum();
            }
        }
        check_64x128(&format!("case {case}: O = P V"), &got, &want);
    }
}
