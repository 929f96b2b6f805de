//! padding::{PackedLayout, remove_padding, rebuild_padding} on the GPU against
//! reference::padding, and property tests of the reference (these run without a GPU).

use fl_kernels::embedding::DeviceStatus;
use fl_kernels::padding::{self, PackedLayout, MAX_BATCH};
use fl_kernels::testing::{gpu_or_skip, random, rel_l2, rng, strategies, to_f64, tolerance};
use fl_kernels::{bf16, f16, reference, DeviceTensor, Error, FloatDType, Gpu};
use proptest::prelude::*;
use rand::Rng;

fn random_lengths(r: &mut impl Rng, batch: usize, max_len: usize) -> Vec<i32> {
    (0..batch)
        .map(|_| match r.random_range(0..8) {
            0 => 0,
            1 => max_len as i32,
            _ => r.random_range(0..=max_len as i32),
        })
        .collect()
}

/// The device layout from device lengths and from host lengths, against the reference.
fn check_offsets(gpu: &Gpu, lengths: &[i32], max_len: usize) {
    let s = gpu.stream();
    let batch = lengths.len();
    let want = reference::padding::offsets(lengths, max_len);
    assert!(want.bad.is_empty());
    let total = want.total as usize;
    let what = format!("batch={batch} max_len={max_len}");

    let dl = DeviceTensor::from_host(s, lengths, &[batch]).unwrap();
    let mut status = DeviceStatus::new(s).unwrap();
    let mut layout = PackedLayout::new(s, batch, max_len).unwrap();
    layout.compute(s, &dl, &mut status).unwrap();
    status.check(s).unwrap();
    assert_eq!(layout.known_total(), None);
    assert_eq!(layout.packed_rows(), batch * max_len);
    assert_eq!(
        layout.cu_seqlens().to_host(s).unwrap(),
        want.cu_seqlens,
        "{what}"
    );
    assert_eq!(
        layout.total().to_host(s).unwrap(),
        vec![want.total],
        "{what}"
    );
    let map = layout.token_map().to_host(s).unwrap();
    assert_eq!(&map[..total], &want.token_map[..], "{what}");
    // A new layout's map is zeroed; the kernel writes nothing past the total.
    assert!(
        map[total..].iter().all(|&m| m == 0),
        "{what}: map written past the total"
    );
    assert_eq!(layout.read_total(s).unwrap(), total);
    assert_eq!(layout.packed_rows(), total);

    let host = PackedLayout::from_host_lengths(s, lengths, max_len).unwrap();
    assert_eq!(host.known_total(), Some(total));
    assert_eq!(
        host.cu_seqlens().to_host(s).unwrap(),
        want.cu_seqlens,
        "{what}"
    );
    assert_eq!(
        host.token_map().to_host(s).unwrap(),
        want.token_map,
        "{what}"
    );
    assert_eq!(host.total().to_host(s).unwrap(), vec![want.total], "{what}");
}

#[test]
fn offsets_match_reference() {
    let Some(gpu) = gpu_or_skip("offsets_match_reference") else {
        return;
    };
    let mut r = rng("offsets");
    for &(batch, max_len) in &[
        (1usize, 1usize),
        (1, 2048),
        (2, 7),
        (7, 5),
        (64, 512),
        (255, 3),
        (256, 9),
        (257, 33),
        (1000, 100),
        (4097, 17),
        (MAX_BATCH, 64),
    ] {
        let lengths = random_lengths(&mut r, batch, max_len);
        check_offsets(&gpu, &lengths, max_len);
    }
    // All full, all empty.
    check_offsets(&gpu, &[16; 300], 16);
    check_offsets(&gpu, &[0; 300], 16);
}

#[test]
fn bad_lengths_are_reported_on_the_device_and_refused_on_the_host() {
    let Some(gpu) = gpu_or_skip("bad_lengths_are_reported_on_the_device_and_refused_on_the_host")
    else {
        return;
    };
    let s = gpu.stream();
    let max_len = 10usize;
    let mut lengths = vec![3i32, 10, 0, 7, 4, 9, 1, 2];
    lengths[2] = -3;
    lengths[5] = 11;
    let dl = DeviceTensor::from_host(s, &lengths, &[8]).unwrap();
    let mut status = DeviceStatus::new(s).unwrap();
    let mut layout = PackedLayout::from_lengths(s, &dl, max_len, &mut status).unwrap();
    match status.check(s) {
        Err(Error::DeviceCheck { op, reason }) => {
            assert_eq!(op, "padding::PackedLayout::compute");
            assert!(reason.contains("lengths[2] = -3"), "{reason}");
            assert!(reason.starts_with("2 sequence length"), "{reason}");
        }
        other => panic!("expected Error::DeviceCheck, got {other:?}"),
    }
    // The layout is that of the clamped lengths (so the gathers stay in bounds).
    let want = reference::padding::offsets(&lengths, max_len);
    assert_eq!(want.bad, vec![(2, -3), (5, 11)]);
    assert_eq!(layout.cu_seqlens().to_host(s).unwrap(), want.cu_seqlens);
    assert_eq!(layout.read_total(s).unwrap(), want.total as usize);

    match PackedLayout::from_host_lengths(s, &lengths, max_len) {
        Err(Error::InvalidArgument {
            arg: "lengths",
            reason,
        }) => {
            assert!(reason.contains("lengths[2] = -3"), "{reason}")
        }
        other => panic!("expected an error on `lengths`, got {other:?}"),
    }
}

/// remove then rebuild on random data, against the reference; outputs poisoned with NaN.
fn check_gathers<T: FloatDType>(
    gpu: &Gpu,
    lengths: &[i32],
    max_len: usize,
    hidden: usize,
    device_lengths: bool,
    r: &mut impl Rng,
) {
    let s = gpu.stream();
    let batch = lengths.len();
    let what = format!(
        "<{}> batch={batch} max_len={max_len} hidden={hidden} device_lengths={device_lengths}",
        T::NAME
    );
    let x: Vec<T> = random(r, batch * max_len * hidden);
    let dx = DeviceTensor::from_host(s, &x, &[batch, max_len, hidden]).unwrap();
    let mut status = DeviceStatus::new(s).unwrap();
    let layout = if device_lengths {
        let dl = DeviceTensor::from_host(s, lengths, &[batch]).unwrap();
        PackedLayout::from_lengths(s, &dl, max_len, &mut status).unwrap()
    } else {
        PackedLayout::from_host_lengths(s, lengths, max_len).unwrap()
    };
    let rows = layout.packed_rows();
    let nan = T::from_f32(f32::NAN);
    let mut packed = DeviceTensor::filled(s, &[rows, hidden], nan).unwrap();
    padding::remove_padding(s, &dx, &layout, &mut packed).unwrap();
    status.check(s).unwrap();
    let got = packed.to_host(s).unwrap();
    let want = reference::padding::remove_padding(&x, lengths, max_len, hidden);
    let total = want.len() / hidden;
    let err = rel_l2(&got[..total * hidden], &to_f64(&want));
    assert!(err < tolerance::<T>(), "remove{what}: rel L2 {err:e}");
    assert_eq!(
        to_f64(&got[..total * hidden]),
        to_f64(&want),
        "remove{what}"
    );
    assert!(
        got[total * hidden..].iter().all(|v| v.to_f32().is_nan()),
        "remove{what}: rows past the total were written"
    );

    // Rebuild from the packed rows (plus NaN rows past the total, never read).
    let mut back = DeviceTensor::filled(s, &[batch, max_len, hidden], nan).unwrap();
    padding::rebuild_padding(s, &packed, &layout, &mut back).unwrap();
    let got = back.to_host(s).unwrap();
    let want = reference::padding::rebuild_padding(&want, lengths, max_len, hidden);
    let err = rel_l2(&got, &to_f64(&want));
    assert!(err < tolerance::<T>(), "rebuild{what}: rel L2 {err:e}");
    assert_eq!(to_f64(&got), to_f64(&want), "rebuild{what}");
    // rebuild(remove(x)) is x where the mask is set and 0 elsewhere.
    let mask = reference::padding::mask(lengths, max_len);
    for (row, &m) in mask.iter().enumerate() {
        let g = &got[row * hidden..(row + 1) * hidden];
        if m {
            assert_eq!(
                to_f64(g),
                to_f64(&x[row * hidden..(row + 1) * hidden]),
                "{what}"
            );
        } else {
            assert!(
                g.iter().all(|v| v.to_f32() == 0.0),
                "{what}: padding row {row}"
            );
        }
    }
}

#[test]
fn gathers_match_reference_all_dtypes_odd_sizes() {
    let Some(gpu) = gpu_or_skip("gathers_match_reference_all_dtypes_odd_sizes") else {
        return;
    };
    let mut r = rng("padding_gathers");
    for &(batch, max_len, hidden) in &[
        (1usize, 1usize, 1usize),
        (1, 5, 4096),
        (3, 7, 7),
        (4, 16, 8),
        (5, 33, 129),
        (2, 9, 4095),
        (17, 40, 12),
        (64, 64, 64),
    ] {
        for device_lengths in [false, true] {
            let lengths = random_lengths(&mut r, batch, max_len);
            check_gathers::<f32>(&gpu, &lengths, max_len, hidden, device_lengths, &mut r);
            check_gathers::<f16>(&gpu, &lengths, max_len, hidden, device_lengths, &mut r);
            check_gathers::<bf16>(&gpu, &lengths, max_len, hidden, device_lengths, &mut r);
        }
    }
    // Empty sequences everywhere: nothing packed, all padding.
    check_gathers::<f16>(&gpu, &[0, 0, 0], 4, 8, false, &mut r);
    check_gathers::<f16>(&gpu, &[0, 0, 0], 4, 8, true, &mut r);
}

#[test]
fn exact_sizes_after_reading_the_total() {
    let Some(gpu) = gpu_or_skip("exact_sizes_after_reading_the_total") else {
        return;
    };
    let s = gpu.stream();
    let mut r = rng("padding_read_total");
    let (max_len, hidden) = (12usize, 24usize);
    let lengths = random_lengths(&mut r, 9, max_len);
    let x: Vec<f32> = random(&mut r, 9 * max_len * hidden);
    let dx = DeviceTensor::from_host(s, &x, &[9, max_len, hidden]).unwrap();
    let dl = DeviceTensor::from_host(s, &lengths, &[9]).unwrap();
    let mut status = DeviceStatus::new(s).unwrap();
    let mut layout = PackedLayout::from_lengths(s, &dl, max_len, &mut status).unwrap();
    let total = layout.read_total(s).unwrap();
    let mut packed = DeviceTensor::filled(s, &[total, hidden], f32::NAN).unwrap();
    padding::remove_padding(s, &dx, &layout, &mut packed).unwrap();
    status.check(s).unwrap();
    let want = reference::padding::remove_padding(&x, &lengths, max_len, hidden);
    assert_eq!(packed.to_host(s).unwrap(), want);
    // Recomputing on the device forgets the host total: upper-bound sizes again.
    layout.compute(s, &dl, &mut status).unwrap();
    assert_eq!(layout.known_total(), None);
    if total < 9 * max_len {
        assert!(matches!(
            padding::remove_padding(s, &dx, &layout, &mut packed),
            Err(Error::Shape { arg: "packed", .. })
        ));
    }
}

#[test]
fn shape_errors_name_the_argument() {
    let Some(gpu) = gpu_or_skip("padding_shape_errors_name_the_argument") else {
        return;
    };
    let s = gpu.stream();
    let layout = PackedLayout::from_host_lengths(s, &[3, 1], 4).unwrap();
    let x = DeviceTensor::<f16>::zeros(s, &[2, 4, 8]).unwrap();
    let mut p = DeviceTensor::<f16>::zeros(s, &[3, 8]).unwrap(); // total is 4
    assert!(matches!(
        padding::remove_padding(s, &x, &layout, &mut p),
        Err(Error::Shape { arg: "packed", .. })
    ));
    let mut p = DeviceTensor::<f16>::zeros(s, &[4, 7]).unwrap();
    assert!(matches!(
        padding::remove_padding(s, &x, &layout, &mut p),
        Err(Error::Shape { arg: "packed", .. })
    ));
    let bad_x = DeviceTensor::<f16>::zeros(s, &[2, 5, 8]).unwrap();
    let mut p = DeviceTensor::<f16>::zeros(s, &[4, 8]).unwrap();
    assert!(matches!(
        padding::remove_padding(s, &bad_x, &layout, &mut p),
        Err(Error::Shape { arg: "padded", .. })
    ));
    let mut bad_x = DeviceTensor::<f16>::zeros(s, &[8, 8]).unwrap();
    assert!(matches!(
        padding::rebuild_padding(s, &p, &layout, &mut bad_x),
        Err(Error::Shape { arg: "padded", .. })
    ));
    let short = DeviceTensor::<f16>::zeros(s, &[2, 8]).unwrap();
    let mut x2 = DeviceTensor::<f16>::zeros(s, &[2, 4, 8]).unwrap();
    assert!(matches!(
        padding::rebuild_padding(s, &short, &layout, &mut x2),
        Err(Error::Shape { arg: "packed", .. })
    ));
    assert!(matches!(
        PackedLayout::new(s, MAX_BATCH + 1, 4),
        Err(Error::TooLarge { arg: "lengths", .. })
    ));
    assert!(matches!(
        PackedLayout::new(s, 4096, 1 << 20),
        Err(Error::InvalidArgument { arg: "max_len", .. })
    ));
    let l2 = DeviceTensor::from_host(s, &[1i32, 2, 3], &[3]).unwrap();
    let mut status = DeviceStatus::new(s).unwrap();
    let mut two = PackedLayout::new(s, 2, 4).unwrap();
    assert!(matches!(
        two.compute(s, &l2, &mut status),
        Err(Error::Shape { arg: "lengths", .. })
    ));
    // An exact (host) layout cannot be recomputed from device lengths.
    let mut exact = PackedLayout::from_host_lengths(s, &[1, 2], 4).unwrap();
    let l = DeviceTensor::from_host(s, &[1i32, 2], &[2]).unwrap();
    assert!(matches!(
        exact.compute(s, &l, &mut status),
        Err(Error::InvalidArgument { arg: "self", .. })
    ));
    // An empty batch is fine.
    let empty = PackedLayout::from_host_lengths(s, &[], 4).unwrap();
    assert_eq!(empty.known_total(), Some(0));
    assert_eq!(empty.cu_seqlens().to_host(s).unwrap(), vec![0]);
    status.check(s).unwrap();
}

#[test]
fn padding_gpu_proptest() {
    let Some(gpu) = gpu_or_skip("padding_gpu_proptest") else {
        return;
    };
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 32,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &(
                strategies::length(300),
                strategies::length(300),
                strategies::length(3000),
                any::<u64>(),
                any::<bool>(),
            ),
            |(batch, max_len, hidden, seed, device_lengths)| {
                use rand::SeedableRng;
                let mut r = rand::rngs::StdRng::seed_from_u64(seed);
                let hidden = hidden.min((1 << 22) / (batch * max_len)).max(1);
                let lengths = random_lengths(&mut r, batch, max_len);
                check_offsets(&gpu, &lengths, max_len);
                check_gathers::<bf16>(&gpu, &lengths, max_len, hidden, device_lengths, &mut r);
                Ok(())
            },
        )
        .unwrap();
}

// ---- reference properties (CPU only, run in CI) ----
proptest! {
    #[test]
    fn reference_offsets_are_a_consistent_prefix_sum(
        batch in 0usize..300,
        max_len in 0usize..64,
        seed in any::<u64>(),
    ) {
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let lengths: Vec<i32> = (0..batch).map(|_| r.random_range(-2..=max_len as i32 + 2)).collect();
        let o = reference::padding::offsets(&lengths, max_len);
        prop_assert_eq!(o.cu_seqlens.len(), batch + 1);
        prop_assert_eq!(o.cu_seqlens[0], 0);
        prop_assert_eq!(o.cu_seqlens[batch], o.total);
        prop_assert_eq!(o.token_map.len(), o.total as usize);
        let mut bad = Vec::new();
        for (b, &l) in lengths.iter().enumerate() {
            let len = o.cu_seqlens[b + 1] - o.cu_seqlens[b];
            prop_assert_eq!(len, l.clamp(0, max_len as i32));
            if len != l { bad.push((b, l)); }
            for t in 0..len {
                let k = (o.cu_seqlens[b] + t) as usize;
                prop_assert_eq!(o.token_map[k], (b * max_len) as i32 + t);
            }
        }
        prop_assert_eq!(o.bad, bad);
        // The map is strictly increasing and inside the padded tensor.
        prop_assert!(o.token_map.windows(2).all(|w| w[0] < w[1]));
        prop_assert!(o.token_map.iter().all(|&m| (m as usize) < batch * max_len));
    }

    #[test]
    fn reference_remove_is_mask_indexing_and_rebuild_inverts_it(
        batch in 1usize..20,
        max_len in 1usize..20,
        hidden in strategies::length(16),
        seed in any::<u64>(),
    ) {
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let lengths = random_lengths(&mut r, batch, max_len);
        let x: Vec<f32> = random(&mut r, batch * max_len * hidden);
        let packed = reference::padding::remove_padding(&x, &lengths, max_len, hidden);
        // torch: x[mask]
        let mask = reference::padding::mask(&lengths, max_len);
        let by_mask: Vec<f32> = mask
            .iter()
            .enumerate()
            .filter(|(_, &m)| m)
            .flat_map(|(row, _)| x[row * hidden..(row + 1) * hidden].iter().copied())
            .collect();
        prop_assert_eq!(&packed, &by_mask);
        // torch: out = zeros; out[mask] = packed
        let back = reference::padding::rebuild_padding(&packed, &lengths, max_len, hidden);
        for (row, &m) in mask.iter().enumerate() {
            for j in 0..hidden {
                let i = row * hidden + j;
                prop_assert_eq!(back[i], if m { x[i] } else { 0.0 });
            }
        }
        // remove(rebuild(p)) == p
        prop_assert_eq!(reference::padding::remove_padding(&back, &lengths, max_len, hidden), packed);
    }
}
