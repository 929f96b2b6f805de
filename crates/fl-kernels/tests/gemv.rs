//! gemv::gemv (every weight format) on the GPU against reference::gemv, and CPU tests of the
//! quantisers (error bounds, llama.cpp byte layouts, round trips) that run without a GPU.

use fl_kernels::gemv::{
    self, GemvPath, QuantFormat, QuantWeight, QuantizedHost, Scales, MAX_M, Q4_0_BLOCK_BYTES,
    Q8_0_BLOCK_BYTES,
};
use fl_kernels::testing::{
    gpu_or_skip, host_weight_ffi, normal, random, rel_l2, rel_l2_floored, rng, strategies,
    tolerance,
};
use fl_kernels::{bf16, f16, reference, DeviceTensor, Error, Gpu, HalfDType};
use proptest::prelude::*;

const FORMATS: &[QuantFormat] = &[
    QuantFormat::Int8,
    QuantFormat::Int4 {
        group: 32,
        zero_point: false,
    },
    QuantFormat::Int4 {
        group: 64,
        zero_point: true,
    },
    QuantFormat::Int4 {
        group: 128,
        zero_point: false,
    },
    QuantFormat::Int4 {
        group: 128,
        zero_point: true,
    },
    QuantFormat::Int4 {
        group: 32,
        zero_point: true,
    },
    QuantFormat::Q8_0,
    QuantFormat::Q4_0,
];

/// (n, k): odd n; k multiples of 32 and 128 that are not multiples of 256 (GGUF rows then
/// start off 16-byte boundaries), and k = 11008 / 4192 (several tiles per row, a partial one).
const SHAPES: &[(usize, usize)] = &[
    (1, 32),
    (7, 96),
    (1, 128),
    (7, 384),
    (129, 1152),
    (4099, 384),
    (67, 11008),
    (33, 4192),
];

/// Rel L2 bound: the output is rounded once to T (≤ EPS each), f32 sums add little.
fn bound<T: HalfDType>() -> f64 {
    tolerance::<T>().min(2.0 * T::EPS)
}

fn check<T: HalfDType>(
    gpu: &Gpu,
    q: &QuantizedHost,
    dw: &QuantWeight,
    m: usize,
    r: &mut impl rand::Rng,
) {
    check_path::<T>(gpu, q, dw, m, r, GemvPath::Auto);
}

/// Random weights of `n x k` quantised to `f`, on the host and uploaded.
fn random_quantized(
    gpu: &Gpu,
    r: &mut impl rand::Rng,
    n: usize,
    k: usize,
    f: QuantFormat,
) -> (QuantizedHost, QuantWeight) {
    let q = gemv::quantize(&random_weights(r, n, k), n, k, f).unwrap();
    let dw = QuantWeight::upload(gpu.stream(), &q).unwrap();
    (q, dw)
}

/// One launch on random `x [m, k]` into a NaN-poisoned `y [m, n]` with the kernel `path`
/// chooses: (the outputs, the reference's).
fn run_gemv<T: HalfDType>(
    gpu: &Gpu,
    q: &QuantizedHost,
    dw: &QuantWeight,
    m: usize,
    r: &mut impl rand::Rng,
    path: GemvPath,
) -> (Vec<T>, Vec<f64>) {
    let x: Vec<T> = random(r, m * q.k());
    run_gemv_on(gpu, q, dw, &x, m, path)
}

/// `run_gemv` on the given `x [m, k]`.
fn run_gemv_on<T: HalfDType>(
    gpu: &Gpu,
    q: &QuantizedHost,
    dw: &QuantWeight,
    x: &[T],
    m: usize,
    path: GemvPath,
) -> (Vec<T>, Vec<f64>) {
    let s = gpu.stream();
    let (n, k) = (q.n(), q.k());
    let dx = DeviceTensor::from_host(s, x, &[m, k]).unwrap();
    let mut y = DeviceTensor::filled(s, &[m, n], T::from_f32(f32::NAN)).unwrap();
    gemv::gemv_with_path(s, &dx, dw, &mut y, path).unwrap();
    (y.to_host(s).unwrap(), reference::gemv::gemv(x, m, q))
}

/// `check` with the kernel forced (`GemvPath::Auto`: what `gemv::gemv` does).
fn check_path<T: HalfDType>(
    gpu: &Gpu,
    q: &QuantizedHost,
    dw: &QuantWeight,
    m: usize,
    r: &mut impl rand::Rng,
    path: GemvPath,
) {
    let (n, k) = (q.n(), q.k());
    let (got, want) = run_gemv::<T>(gpu, q, dw, m, r, path);
    let err = rel_l2(&got, &want);
    assert!(
        err < bound::<T>(),
        "gemv {} <{}> {path:?} m={m} n={n} k={k}: rel L2 {err:e}",
        q.format().name(),
        T::NAME
    );
}

/// Every format and option: int8, int4 with groups 32 / 64 / 128 with and without a zero
/// point, Q8_0, Q4_0.
fn all_formats() -> Vec<QuantFormat> {
    let mut v = vec![QuantFormat::Int8, QuantFormat::Q8_0, QuantFormat::Q4_0];
    for group in [32, 64, 128] {
        for zero_point in [false, true] {
            v.push(QuantFormat::Int4 { group, zero_point });
        }
    }
    v
}

#[test]
fn gemv_each_path_matches_reference_every_format() {
    // Both sides forced (GemvPath::Mma: the tensor-core kernels; GemvPath::Fma: the CUDA-core
    // kernel), every format, f16 and bf16, token counts on both sides of 8 (the second
    // token-row half of the mma), odd n (partial 8-row tiles; n = 2113 gives the general
    // tensor-core kernel's 2-tile CTAs on up to 132 SMs, at m = 5 and 9..16 with k = 384 where
    // no ring kernel runs), k not a power of two (k = 352 puts GGUF blocks at both 4-byte
    // parities within a row; 4224 = 33 * 128 leaves a partial batch of chunks; at m = 1 int8
    // and int4 run the one-token kernel, and 96 and 352 leave it a partial superchunk).
    let Some(gpu) = gpu_or_skip("gemv_each_path_matches_reference_every_format") else {
        return;
    };
    let mut r = rng("gemv_paths");
    let shapes: &[(usize, usize, &[usize])] = &[
        (37, 96, &[1, 2, 5, 9, 16]),
        (1000, 352, &[1, 2, 5, 9, 16]),
        (37, 4224, &[1, 2, 5, 9, 16]),
        (1, 128, &[1, 16]),
        (2113, 384, &[1, 5, 9, 16]),
        // Past what the one-token kernels stage (x, and int4's scales, in shared memory:
        // 160 KB at most): at m = 1 int8 takes the CUDA-core kernel there (the general
        // tensor-core one when forced), int4 the general tensor-core kernel.
        (5, 67_584, &[1, 2]),
    ];
    for f in all_formats() {
        for &(n, k, ms) in shapes {
            if k % f.k_multiple() != 0 {
                continue;
            }
            let (q, dw) = random_quantized(&gpu, &mut r, n, k, f);
            for &m in ms {
                for path in [GemvPath::Mma, GemvPath::Fma] {
                    check_path::<f16>(&gpu, &q, &dw, m, &mut r, path);
                    check_path::<bf16>(&gpu, &q, &dw, m, &mut r, path);
                }
            }
        }
    }
}

#[test]
fn gemv_one_token_kernel_on_large_int4_and_int8() {
    // The one-token int kernels (gemv_one_token_int_kernel, and on sm_90+ for int8
    // gemv_one_token_int8_tma_kernel, at m = 1) at large sizes: odd n (a partial last tile), k
    // with a whole number of 128-value superchunks (4224) and without (4192 = 131 pieces of
    // 32), every group and zero-point option, both activation types, and the CUDA-core kernel
    // forced for comparison on the same weights. k = 4096 stages the scale rows of g32 / g64
    // (256 / 128 bytes) and the zero rows of g32 (128 bytes) at a padded stride. On a 132-SM
    // H100 every CTA shape runs: 11011 rows (345 CTAs of 32 rows) take Rows32Warps4Raw for
    // int4 (the raw-nibble product) and, for int8, the cp.async rings instead of the TMA one
    // (Rows16Warps8RegStaged at k = 4096, Rows16Warps8 at k = 4224); 8195 rows
    // Rows32Warps8Ring3 for int4 and Rows32Warps4Raw for int4zp; 1000 x 8192 Rows32Warps8Ring3
    // for int4zp (k >= 8192 at <= 2 CTAs per SM) and Rows16Warps4 for int8 without TMA.
    let Some(gpu) = gpu_or_skip("gemv_one_token_kernel_on_large_int4_and_int8") else {
        return;
    };
    let mut r = rng("gemv_one_token_int_large");
    for &(n, k) in &[
        (8195usize, 4224usize),
        (8197, 4192),
        (8195, 4096),
        (11011, 4096),
        (11011, 4224),
        (1000, 8192),
    ] {
        for f in all_formats() {
            if k % f.k_multiple() != 0 || matches!(f, QuantFormat::Q8_0 | QuantFormat::Q4_0) {
                continue;
            }
            let (q, dw) = random_quantized(&gpu, &mut r, n, k, f);
            for path in [GemvPath::Auto, GemvPath::Fma] {
                check_path::<f16>(&gpu, &q, &dw, 1, &mut r, path);
                check_path::<bf16>(&gpu, &q, &dw, 1, &mut r, path);
            }
        }
    }
}

#[test]
fn gemv_one_token_gguf_kernel() {
    // The GGUF one-token kernels (Q8_0 / Q4_0 at m = 1 with k % 256 == 0:
    // gemv_one_token_gguf_kernel, and on sm_90+ gemv_one_token_gguf_tma_kernel for Q8_0, Q4_0
    // at k = 11008 and Q4_0 at the small n, with TMA stages of 8-32 blocks, partial at k =
    // 256, 2816, 11008 and 1536, rows past n read as zeros) against the reference and against
    // the CUDA-core kernel on the same weights. Shapes (the cp.async kernel's view): 37 x 256
    // (one 8-block superchunk per row: three of the four warps idle, a partial 16-row tile),
    // 8195 x 4096 (16 superchunks, 4 per warp; partial last tile), 8451 x 4096 (n >= 64 x 132
    // SMs: Q4_0 on 8 warps with one 16-block superchunk each, rings of one slot; partial tile),
    // 17 x 2816 (11: one warp with three, three with two), 4099 x 11008 (43, the 7B MLP shape), 1 x 512, and
    // 16901 x 1536 (n >= 128 x 132 SMs with k % 512 == 0: superchunks of 16 blocks, 3 per row
    // over 4 warps; partial last tile); both activation types. Q4_0 also on x with 100x
    // outliers (every 64th value).
    let Some(gpu) = gpu_or_skip("gemv_one_token_gguf_kernel") else {
        return;
    };
    let mut r = rng("gemv_one_token_gguf");
    for &(n, k) in &[
        (37usize, 256usize),
        (8195, 4096),
        (8451, 4096),
        (17, 2816),
        (4099, 11008),
        (1, 512),
        (16901, 1536),
    ] {
        for f in [QuantFormat::Q8_0, QuantFormat::Q4_0] {
            let (q, dw) = random_quantized(&gpu, &mut r, n, k, f);
            for path in [GemvPath::Auto, GemvPath::Fma] {
                check_path::<f16>(&gpu, &q, &dw, 1, &mut r, path);
                check_path::<bf16>(&gpu, &q, &dw, 1, &mut r, path);
            }
            if f == QuantFormat::Q4_0 {
                check_outliers::<f16>(&gpu, &q, &dw, &mut r);
                check_outliers::<bf16>(&gpu, &q, &dw, &mut r);
            }
        }
    }
}

#[test]
fn gemv_one_token_chain_reads_each_previous_output() {
    // One-token GEMVs launched back to back, each reading the output of the one before: the
    // decode pattern (4096 x 4096, then the MLP's 11008 x 4096 and 4096 x 11008, twice), every
    // format the one-token kernels take, both activation types. Every output is NaN-poisoned
    // before the chain is launched and nothing synchronises until its end, so a kernel that
    // read its x (or wrote its y) before the one before it finished would show: the guard for
    // any early-launch or overlap scheme (programmatic dependent launches were tried under
    // it). Each link is checked against the reference on its downloaded input. Weights
    // are N(0, 1 / k) so values keep their scale along the chain.
    let Some(gpu) = gpu_or_skip("gemv_one_token_chain_reads_each_previous_output") else {
        return;
    };
    let mut r = rng("gemv_chain");
    let shapes = [(4096usize, 4096usize), (11008, 4096), (4096, 11008)];
    for f in [
        QuantFormat::Int8,
        QuantFormat::Int4 {
            group: 128,
            zero_point: false,
        },
        QuantFormat::Int4 {
            group: 64,
            zero_point: true,
        },
        QuantFormat::Q8_0,
        QuantFormat::Q4_0,
    ] {
        let links: Vec<(QuantizedHost, QuantWeight)> = shapes
            .iter()
            .map(|&(n, k)| {
                let w = normal(&mut r, n * k, 1.0 / (k as f64).sqrt());
                let q = gemv::quantize(&w, n, k, f).unwrap();
                let dw = QuantWeight::upload(gpu.stream(), &q).unwrap();
                (q, dw)
            })
            .collect();
        check_chain::<f16>(&gpu, &links, &mut r);
        check_chain::<bf16>(&gpu, &links, &mut r);
    }
}

/// The chain of `gemv_one_token_chain_reads_each_previous_output`: links 0, 1, 2, 0, 1, 2 of
/// `links` (each link's k is the previous link's n), launched with no synchronisation between.
fn check_chain<T: HalfDType>(
    gpu: &Gpu,
    links: &[(QuantizedHost, QuantWeight)],
    r: &mut impl rand::Rng,
) {
    let s = gpu.stream();
    let order: Vec<usize> = (0..2 * links.len()).map(|i| i % links.len()).collect();
    let x: Vec<T> = random(r, links[order[0]].0.k());
    let mut v = vec![DeviceTensor::from_host(s, &x, &[1, x.len()]).unwrap()];
    for &l in &order {
        v.push(DeviceTensor::filled(s, &[1, links[l].0.n()], T::from_f32(f32::NAN)).unwrap());
    }
    for (i, &l) in order.iter().enumerate() {
        let (done, rest) = v.split_at_mut(i + 1);
        gemv::gemv(s, &done[i], &links[l].1, &mut rest[0]).unwrap();
    }
    let host: Vec<Vec<T>> = v.iter().map(|t| t.to_host(s).unwrap()).collect();
    for (i, &l) in order.iter().enumerate() {
        let q = &links[l].0;
        let want = reference::gemv::gemv(&host[i], 1, q);
        let err = rel_l2(&host[i + 1], &want);
        assert!(
            err < bound::<T>(),
            "gemv chain link {i}: {} <{}> n={} k={}: rel L2 {err:e}",
            q.format().name(),
            T::NAME,
            q.n(),
            q.k()
        );
    }
}

#[test]
fn gemv_one_token_gguf_bf16_far_from_one() {
    // bf16 activations far from 1 on the GGUF one-token kernels: x scaled by 2^40 (past f16's
    // range), by 2^-40 (below f16's subnormals), and spread over 2^30 .. 2^-30 within one
    // vector, so a kernel that passed x through f16 anywhere would fail; Q8_0 and Q4_0 on
    // shapes that take the cp.async kernel (37 x 256, 8451 x 4096 for Q4_0) and, on sm_90,
    // the TMA one (4096 x 4096,
    // 4099 x 11008, 8451 x 4096 for Q8_0).
    let Some(gpu) = gpu_or_skip("gemv_one_token_gguf_bf16_far_from_one") else {
        return;
    };
    let mut r = rng("gemv_bf16_far");
    for &(n, k) in &[
        (37usize, 256usize),
        (4096, 4096),
        (8451, 4096),
        (4099, 11008),
    ] {
        for f in [QuantFormat::Q8_0, QuantFormat::Q4_0] {
            let (q, dw) = random_quantized(&gpu, &mut r, n, k, f);
            for spread in 0..3 {
                let x: Vec<bf16> = random::<bf16>(&mut r, k)
                    .into_iter()
                    .enumerate()
                    .map(|(i, v)| {
                        let e = match spread {
                            0 => 40,
                            1 => -40,
                            _ => 30 - 10 * (i % 7) as i32,
                        };
                        bf16::from_f32(v.to_f32() * 2f32.powi(e))
                    })
                    .collect();
                check_on(&gpu, &q, &dw, &x, &format!("spread {spread}"));
            }
        }
    }
}

#[test]
fn gemv_multi_token_gguf_kernel() {
    // The GGUF kernel for 2..16 tokens (gemv_multi_token_gguf_kernel, Q8_0 / Q4_0 with k %
    // 256 == 0) against the reference, every token's row of outputs on its own (a wrong token
    // column would be diluted in one rel L2 over all of them): m = 2, 5, 8 (8-token mma
    // groups; Q4_0 on one warp per ring, Q8_0 on warp pairs), 9, 16 (two groups; 9 leaves 7
    // zero-filled columns), on 37 x 256 (one superchunk per row, idle rings, a partial 16-row
    // tile), 8195 x 4096 (several superchunks per ring, partial last tile), 17 x 2816 (11
    // superchunks: uneven shares), 4099 x 11008 (the 7B MLP shape), 1 x 512 and 16901 x 512
    // (on an H100's 132 SMs n >= 128 x SMs: GgufTiles8WarpPairs at m > 8); both activation
    // types. The general kernel (k % 256 != 0) keeps its coverage in
    // gemv_each_path_every_token_count_and_group.
    let Some(gpu) = gpu_or_skip("gemv_multi_token_gguf_kernel") else {
        return;
    };
    let mut r = rng("gemv_multi_token_gguf");
    for &(n, k) in &[
        (37usize, 256usize),
        (8195, 4096),
        (17, 2816),
        (4099, 11008),
        (1, 512),
        (16901, 512),
    ] {
        for f in [QuantFormat::Q8_0, QuantFormat::Q4_0] {
            let (q, dw) = random_quantized(&gpu, &mut r, n, k, f);
            for m in [2usize, 5, 8, 9, 16] {
                check_tokens::<f16>(&gpu, &q, &dw, m, &mut r);
                check_tokens::<bf16>(&gpu, &q, &dw, m, &mut r);
            }
        }
    }
}

#[test]
fn gemv_multi_token_int_kernel() {
    // The int8 / int4 kernel for 2..16 tokens (gemv_multi_token_int_kernel, k % 256 == 0)
    // against the reference, token by token: m = 2, 5, 8, 9, 16 on 37 x 256 (one superchunk
    // per row), 17 x 2816 (11 superchunks over 4 rings) and 1 x 512 with int8 and int4 of every
    // group with and without zero points; 8195 x 4096 (partial last tile) and 4099 x 11008
    // (group 32: 344 groups of staged scales and zeros) and 8451 x 512 (n >= 64 x 132 SMs:
    // IntTiles8WarpPairs at m > 8 on an H100) with int8, int4 g128, int4 g64 and int4zp g32;
    // both activation types.
    let Some(gpu) = gpu_or_skip("gemv_multi_token_int_kernel") else {
        return;
    };
    let mut r = rng("gemv_multi_token_int");
    let int_formats: Vec<QuantFormat> = all_formats()
        .into_iter()
        .filter(|f| !matches!(f, QuantFormat::Q8_0 | QuantFormat::Q4_0))
        .collect();
    let large = [
        QuantFormat::Int8,
        QuantFormat::Int4 {
            group: 128,
            zero_point: false,
        },
        QuantFormat::Int4 {
            group: 64,
            zero_point: false,
        },
        QuantFormat::Int4 {
            group: 32,
            zero_point: true,
        },
    ];
    for &(n, k) in &[
        (37usize, 256usize),
        (17, 2816),
        (1, 512),
        (8195, 4096),
        (4099, 11008),
        (8451, 512),
    ] {
        let fmts: &[QuantFormat] = if n * k > 1 << 20 || n > 8192 {
            &large
        } else {
            &int_formats
        };
        for &f in fmts {
            let (q, dw) = random_quantized(&gpu, &mut r, n, k, f);
            for m in [2usize, 5, 8, 9, 16] {
                check_tokens::<f16>(&gpu, &q, &dw, m, &mut r);
                check_tokens::<bf16>(&gpu, &q, &dw, m, &mut r);
            }
        }
    }
}

/// `check` with every token's row of `n` outputs held to the bound on its own, relative to
/// that row's norm or the tokens' RMS row norm, whichever is larger: with few outputs per
/// token a row's exact value can nearly cancel (seed 1795599915738307379 drew a 1 x 512 int4zp
/// g32 token whose product is 1.3e-4 against sum |w x| = 128, so f32 rounding of 3.8e-7
/// read as a relative error of 3e-3), and a wrong token still misses by its own size.
fn check_tokens<T: HalfDType>(
    gpu: &Gpu,
    q: &QuantizedHost,
    dw: &QuantWeight,
    m: usize,
    r: &mut impl rand::Rng,
) {
    let (n, k) = (q.n(), q.k());
    let (got, want) = run_gemv::<T>(gpu, q, dw, m, r, GemvPath::Auto);
    let rms = (want.iter().map(|v| v * v).sum::<f64>() / want.len().max(1) as f64).sqrt();
    for tok in 0..m {
        let err = rel_l2_floored(
            &got[tok * n..(tok + 1) * n],
            &want[tok * n..(tok + 1) * n],
            rms,
        );
        assert!(
            err < bound::<T>(),
            "gemv {} <{}> m={m} n={n} k={k} token {tok}: rel L2 {err:e}",
            q.format().name(),
            T::NAME
        );
    }
}

#[test]
fn gemv_one_token_kernels_from_several_host_threads() {
    // The one-token kernels' shared-memory opt-in is per function and process-wide. Host
    // threads launching one kernel with different k (different shared-memory sizes, all above
    // the 48 KB default) must not fail each other's launches; when the limit was set to each
    // launch's size, a thread's launch failed with "invalid argument" when another lowered it
    // between its set and its launch. One thread per (format, k), 150
    // launches each on one stream, then the last output against the reference.
    let Some(gpu) = gpu_or_skip("gemv_one_token_kernels_from_several_host_threads") else {
        return;
    };
    let mut r = rng("gemv_threads");
    let formats = [
        QuantFormat::Int8,
        QuantFormat::Int4 {
            group: 128,
            zero_point: false,
        },
        QuantFormat::Q8_0,
        QuantFormat::Q4_0,
    ];
    let n = 2051usize;
    let mut cases = Vec::new();
    for f in formats {
        for k in [2048usize, 8192] {
            let (q, dw) = random_quantized(&gpu, &mut r, n, k, f);
            let x: Vec<f16> = random(&mut r, k);
            cases.push((q, dw, x));
        }
    }
    std::thread::scope(|sc| {
        for (q, dw, x) in &cases {
            let gpu = &gpu;
            sc.spawn(move || {
                let s = gpu.stream();
                let k = q.k();
                let dx = DeviceTensor::from_host(s, x, &[1, k]).unwrap();
                let mut y = DeviceTensor::filled(s, &[1, n], f16::from_f32(f32::NAN)).unwrap();
                for i in 0..150 {
                    if let Err(e) = gemv::gemv(s, &dx, dw, &mut y) {
                        panic!("{} k={k}: launch {i} failed: {e}", q.format().name());
                    }
                }
                let got = y.to_host(s).unwrap();
                let err = rel_l2(&got, &reference::gemv::gemv(x, 1, q));
                assert!(
                    err < bound::<f16>(),
                    "{} k={k}: rel L2 {err:e}",
                    q.format().name()
                );
            });
        }
    });
}

#[test]
fn gemv_one_token_kernel_many_ctas() {
    // 33001 x 1056: several waves of CTAs (1032 of 32 rows: int4 on 8-warp CTAs, int4zp on the
    // 4-warp raw-product ones; int8 on the TMA ring on sm_90+, else 2063 CTAs of 16 rows),
    // k = 1056 is 8.25 superchunks of int4 and 16.5 of int8 (uneven shares over the warps); a
    // partial last tile (33001 = 2062 * 16 + 9 = 1031 * 32 + 9), whose scale run ends inside
    // a 16-byte word (9 rows of 33 groups), staged by element loads.
    let Some(gpu) = gpu_or_skip("gemv_one_token_kernel_many_ctas") else {
        return;
    };
    let mut r = rng("gemv_one_token_int_ctas");
    let (n, k) = (33001usize, 1056usize);
    let formats = [
        QuantFormat::Int8,
        QuantFormat::Int4 {
            group: 32,
            zero_point: false,
        },
        QuantFormat::Int4 {
            group: 32,
            zero_point: true,
        },
    ];
    for f in formats {
        let (q, dw) = random_quantized(&gpu, &mut r, n, k, f);
        check_path::<f16>(&gpu, &q, &dw, 1, &mut r, GemvPath::Auto);
        check_path::<bf16>(&gpu, &q, &dw, 1, &mut r, GemvPath::Auto);
    }
}

#[test]
fn gemv_one_token_int4_raw_pairs() {
    // int4 at one token where the one-token kernel's 4-warp CTAs of 4 tiles (Rows32Warps4Raw)
    // take it (on a 132-SM H100: between 2 and 4 CTAs of 32 rows per SM without zero point, at
    // least 2 with it): there its product multiplies the raw nibbles (1024 + q, 1024 + 16 q)
    // and subtracts the offsets (M + z) times x's group sums per row at the end. 11011 rows (345 CTAs, a partial last tile), k = 2304 (18 superchunks over 4
    // warps: uneven shares), every group size (4, 8 and 16 staged words per group in the
    // sums), with and without zero point, both activation types; x with one large value per 64
    // (the offsets then dwarf the products: the sums must cancel in f32).
    let Some(gpu) = gpu_or_skip("gemv_one_token_int4_raw_pairs") else {
        return;
    };
    let mut r = rng("gemv_one_token_int_raw");
    let (n, k) = (11011usize, 2304usize);
    for group in [32, 64, 128] {
        for zero_point in [false, true] {
            let f = QuantFormat::Int4 { group, zero_point };
            let (q, dw) = random_quantized(&gpu, &mut r, n, k, f);
            check_path::<f16>(&gpu, &q, &dw, 1, &mut r, GemvPath::Auto);
            check_path::<bf16>(&gpu, &q, &dw, 1, &mut r, GemvPath::Auto);
            check_outliers::<f16>(&gpu, &q, &dw, &mut r);
            check_outliers::<bf16>(&gpu, &q, &dw, &mut r);
        }
    }
}

/// One launch at m = 1 on x with every 64th value 100 times the others (activation outliers),
/// against the reference.
fn check_outliers<T: HalfDType>(
    gpu: &Gpu,
    q: &QuantizedHost,
    dw: &QuantWeight,
    r: &mut impl rand::Rng,
) {
    let mut x: Vec<T> = random(r, q.k());
    for v in x.iter_mut().step_by(64) {
        *v = T::from_f32(v.to_f32() * 100.0);
    }
    check_on(gpu, q, dw, &x, "outliers");
}

/// One token on the given `x [k]` (`gemv::gemv`'s choice of kernel) against the reference;
/// `what` names the input in the failure message.
fn check_on<T: HalfDType>(gpu: &Gpu, q: &QuantizedHost, dw: &QuantWeight, x: &[T], what: &str) {
    let (n, k) = (q.n(), q.k());
    let (got, want) = run_gemv_on(gpu, q, dw, x, 1, GemvPath::Auto);
    let err = rel_l2(&got, &want);
    assert!(
        err < bound::<T>(),
        "gemv {} <{}> {what} n={n} k={k}: rel L2 {err:e}",
        q.format().name(),
        T::NAME
    );
}

#[test]
fn gemv_one_token_kernel_with_unaligned_scales() {
    // The C ABI takes int4 scales 2-byte and zeros 1-byte aligned; the one-token kernel stages
    // them 16 bytes at a time by cp.async when they are 16-byte aligned, else by element loads.
    // Scales at +2 bytes and zeros at +1 byte of their buffers, against the reference: group
    // 64 at k = 2048 (rows staged as one run) and group 32 at k = 4096 (rows of 256 / 128
    // bytes staged at a padded stride).
    let Some(gpu) = gpu_or_skip("gemv_one_token_kernel_with_unaligned_scales") else {
        return;
    };
    let mut r = rng("gemv_one_token_int_unaligned");
    for (n, k, group) in [(16411usize, 2048usize, 64usize), (4103, 4096, 32)] {
        check_unaligned_scales(&gpu, &mut r, n, k, group);
    }
}

/// One int4-with-zero-point launch at m = 1 through the C ABI with the scales at +2 bytes
/// and the zeros at +1 byte of their buffers, against the reference.
fn check_unaligned_scales(gpu: &Gpu, r: &mut impl rand::Rng, n: usize, k: usize, group: usize) {
    use fl_kernels::cudarc::driver::{DevicePtr, DevicePtrMut};
    use fl_kernels_sys::{fl_dtype, fl_gemv_format, fl_gemv_quant};
    let s = gpu.stream();
    let f = QuantFormat::Int4 {
        group,
        zero_point: true,
    };
    let q = gemv::quantize(&random_weights(r, n, k), n, k, f).unwrap();
    let Scales::F16(sc) = q.scales() else {
        unreachable!()
    };
    let mut sc1 = vec![f16::from_f32(0.0)];
    sc1.extend_from_slice(sc);
    let mut z1 = vec![0u8];
    z1.extend_from_slice(q.zeros());
    let dw = DeviceTensor::from_host(s, q.data(), &[q.data().len()]).unwrap();
    let ds = DeviceTensor::from_host(s, &sc1, &[sc1.len()]).unwrap();
    let dz = DeviceTensor::from_host(s, &z1, &[z1.len()]).unwrap();
    let x: Vec<f16> = random(r, k);
    let dx = DeviceTensor::from_host(s, &x, &[1, k]).unwrap();
    let mut y = DeviceTensor::filled(s, &[1, n], f16::from_f32(f32::NAN)).unwrap();
    {
        let (pw, _g1) = dw.as_slice().device_ptr(s);
        let (ps, _g2) = ds.as_slice().device_ptr(s);
        let (pz, _g3) = dz.as_slice().device_ptr(s);
        let (px, _g4) = dx.as_slice().device_ptr(s);
        let (py, _g5) = y.as_slice_mut().device_ptr_mut(s);
        // SAFETY: w holds n * k / 2 bytes, the scales n * k / group halves after the first,
        // the zeros n * k / group bytes after the first, x k and y n halves; all live until
        // the guards drop, after the launch is queued on `s`.
        let st = unsafe {
            fl_gemv_quant(
                fl_dtype::FL_DTYPE_F16,
                fl_gemv_format::FL_GEMV_INT4_ZP,
                px as _,
                pw as _,
                (ps + 2) as _,
                (pz + 1) as _,
                group as i32,
                py as _,
                1,
                n as i64,
                k as i64,
                s.cu_stream() as _,
            )
        };
        assert_eq!(st, 0);
    }
    let got = y.to_host(s).unwrap();
    let want = reference::gemv::gemv(&x, 1, &q);
    let err = rel_l2(&got, &want);
    assert!(
        err < bound::<f16>(),
        "unaligned scales, {n} x {k} group {group}: rel L2 {err:e}"
    );
}

#[test]
fn gemv_each_path_every_token_count_and_group() {
    // Both sides at each m in 1..=16 for every format (k = 640 = 5 groups of 128, 10 of 64, 20
    // of 32: scale runs of 4, 2 and 1 chunks in the general tensor-core kernel, which takes
    // m >= 2 here since k % 256 != 0; and every token-count instance of the CUDA-core kernel,
    // rounded up to 1, 2, 4, 8, 16).
    let Some(gpu) = gpu_or_skip("gemv_each_path_every_token_count_and_group") else {
        return;
    };
    let mut r = rng("gemv_mma_m");
    for f in all_formats() {
        let (n, k) = (45, 640);
        let (q, dw) = random_quantized(&gpu, &mut r, n, k, f);
        for m in 1..=MAX_M {
            for path in [GemvPath::Mma, GemvPath::Fma] {
                check_path::<f16>(&gpu, &q, &dw, m, &mut r, path);
                check_path::<bf16>(&gpu, &q, &dw, m, &mut r, path);
            }
        }
    }
}

#[test]
fn gemv_mma_path_extreme_quants_are_exact() {
    // Every quant at its extremes (int8 -128 / 127 from hand-made bytes, nibbles 0 / 15,
    // zero points 0 / 15) with x = powers of two: each product and partial sum is exact in
    // f32, so y must equal the f64 reference up to the one rounding to T.
    let Some(gpu) = gpu_or_skip("gemv_mma_path_extreme_quants_are_exact") else {
        return;
    };
    let s = gpu.stream();
    let (n, k) = (24, 256);
    let mut r = rng("gemv_mma_extreme");
    use rand::Rng;
    let int8: Vec<u8> = (0..n * k)
        .map(|i| [0x80u8, 0x7F, 0xFF, 0x01][(i * 7 + i / 5) % 4])
        .collect();
    let q8 = QuantizedHost::new(
        QuantFormat::Int8,
        n,
        k,
        int8,
        Scales::F32(&vec![0.5; n]),
        vec![],
    )
    .unwrap();
    let fmt4 = QuantFormat::Int4 {
        group: 64,
        zero_point: true,
    };
    let nib: Vec<u8> = (0..n * k / 2)
        .map(|i| [0x0Fu8, 0xF0, 0xFF, 0x00][i % 4])
        .collect();
    let zeros: Vec<u8> = (0..n * k / 64)
        .map(|i| if i % 2 == 0 { 0 } else { 15 })
        .collect();
    let sc = vec![f16::from_f32(0.25); n * k / 64];
    let q4 = QuantizedHost::new(fmt4, n, k, nib, Scales::F16(&sc), zeros).unwrap();
    for q in [q8, q4] {
        let dw = QuantWeight::upload(s, &q).unwrap();
        for m in [1, 16] {
            let x: Vec<bf16> = (0..m * k)
                .map(|_| bf16::from_f32(if r.random_bool(0.5) { 0.5 } else { -0.25 }))
                .collect();
            let dx = DeviceTensor::from_host(s, &x, &[m, k]).unwrap();
            let mut y = DeviceTensor::filled(s, &[m, n], bf16::NAN).unwrap();
            gemv::gemv_with_path(s, &dx, &dw, &mut y, GemvPath::Mma).unwrap();
            let got = y.to_host(s).unwrap();
            let want = reference::gemv::gemv(&x, m, &q);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_f32(),
                    bf16::from_f64(*w).to_f32(),
                    "{} m={m} element {i}",
                    q.format().name()
                );
            }
        }
    }
}

#[test]
fn gemv_mma_path_gpu_proptest() {
    let Some(gpu) = gpu_or_skip("gemv_mma_path_gpu_proptest") else {
        return;
    };
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    });
    let formats = all_formats();
    runner
        .run(
            &(
                0..formats.len(),
                strategies::length(600),
                1usize..=40,
                1..=MAX_M,
                any::<u64>(),
            ),
            |(fi, n, kb, m, seed)| {
                use rand::SeedableRng;
                let mut r = rand::rngs::StdRng::seed_from_u64(seed);
                let f = formats[fi];
                let k = kb * f.k_multiple();
                let (q, dw) = random_quantized(&gpu, &mut r, n, k, f);
                check_path::<f16>(&gpu, &q, &dw, m, &mut r, GemvPath::Mma);
                check_path::<bf16>(&gpu, &q, &dw, m, &mut r, GemvPath::Mma);
                Ok(())
            },
        )
        .unwrap();
}

#[test]
fn gemv_path_launcher_rejects_an_unknown_path_without_a_gpu() {
    // Checked before anything touches the device, so this runs on the CPU too.
    use fl_kernels_sys::{
        fl_dtype, fl_gemv_format, fl_gemv_quant_path, FL_ERR_INVALID_ARGUMENT, FL_GEMV_PATH_MMA,
    };
    let call = |path: i32, m: i64| {
        // SAFETY: n = 0 or an invalid path: the launcher returns before reading any pointer
        // or touching the (null) stream.
        unsafe {
            fl_gemv_quant_path(
                fl_dtype::FL_DTYPE_F16,
                fl_gemv_format::FL_GEMV_INT8,
                std::ptr::null(),
                std::ptr::null(),
                std::ptr::null(),
                std::ptr::null(),
                0,
                std::ptr::null_mut(),
                m,
                0,
                64,
                path,
                std::ptr::null_mut(),
            )
        }
    };
    assert_eq!(call(3, 1), FL_ERR_INVALID_ARGUMENT);
    assert_eq!(call(-1, 1), FL_ERR_INVALID_ARGUMENT);
    assert_eq!(
        call(FL_GEMV_PATH_MMA as i32, 1),
        0,
        "n = 0 launches nothing"
    );
    assert_eq!(
        call(FL_GEMV_PATH_MMA as i32, 17),
        FL_ERR_INVALID_ARGUMENT,
        "m > 16"
    );
}

fn random_weights(r: &mut impl rand::Rng, n: usize, k: usize) -> Vec<f32> {
    random::<f32>(r, n * k)
}

#[test]
fn gemv_matches_reference_every_format_dtype_and_shape() {
    let Some(gpu) = gpu_or_skip("gemv_matches_reference_every_format_dtype_and_shape") else {
        return;
    };
    let mut r = rng("gemv");
    for &f in FORMATS {
        for &(n, k) in SHAPES {
            if k % f.k_multiple() != 0 {
                continue;
            }
            let (q, dw) = random_quantized(&gpu, &mut r, n, k, f);
            for m in [1, 3, 16] {
                check::<f16>(&gpu, &q, &dw, m, &mut r);
                check::<bf16>(&gpu, &q, &dw, m, &mut r);
            }
        }
    }
}

#[test]
fn gemv_every_token_count() {
    // Each m in 1..=16 (every compiled token tile, partly filled).
    let Some(gpu) = gpu_or_skip("gemv_every_token_count") else {
        return;
    };
    let mut r = rng("gemv_m");
    for &f in FORMATS {
        let (n, k) = (37, 640);
        let (q, dw) = random_quantized(&gpu, &mut r, n, k, f);
        for m in 1..=MAX_M {
            check::<bf16>(&gpu, &q, &dw, m, &mut r);
        }
    }
}

#[test]
fn gemv_on_hand_made_gguf_blocks() {
    // A Q4_0 and a Q8_0 row built byte by byte (as read from a GGUF file), x = ones: y is the
    // row sum, known exactly.
    let Some(gpu) = gpu_or_skip("gemv_on_hand_made_gguf_blocks") else {
        return;
    };
    let s = gpu.stream();
    // Q4_0, 2 rows x 64: d = 0.5 (f16 0x3800), every nibble 0xB (value +3 after -8):
    // row sum = 64 * 3 * 0.5 = 96; second row d = -0.25 (0xB400), nibbles 0x2 (-6): 64*1.5 = 96.
    let mut b = Vec::new();
    for (d, nib) in [([0x00u8, 0x38u8], 0xBBu8), ([0x00, 0xB4], 0x22)] {
        for _ in 0..2 {
            b.extend_from_slice(&d);
            b.extend_from_slice(&[nib; 16]);
        }
    }
    let q4 = QuantizedHost::new(QuantFormat::Q4_0, 2, 64, b, Scales::None, vec![]).unwrap();
    // Q8_0, 1 row x 32: d = 2.0 (0x4000), qs = -16..16 except 0: sum(qs) = -16 → y = -32.
    let mut b = vec![0x00u8, 0x40];
    b.extend((-16i8..16).map(|v| v as u8));
    let q8 = QuantizedHost::new(QuantFormat::Q8_0, 1, 32, b, Scales::None, vec![]).unwrap();
    // The same blocks in rows of k = 256 (8 blocks: what the one-token GGUF kernel takes),
    // block b's d scaled by 2^(b - 3) (exact in f16; the 2^(b - 3) sum to 31.875): Q4_0 row
    // sums 32 * 3 * 0.5 * 31.875 = 1530 and 32 * (-6) * (-0.25) * 31.875 = 1530; Q8_0
    // -16 * 2 * 31.875 = -1020.
    let pow = |b: i32| 2f32.powi(b - 3);
    let mut b = Vec::new();
    for (d, nib) in [(0.5f32, 0xBBu8), (-0.25, 0x22)] {
        for blk in 0..8 {
            b.extend_from_slice(&f16::from_f32(d * pow(blk)).to_le_bytes());
            b.extend_from_slice(&[nib; 16]);
        }
    }
    let q4k = QuantizedHost::new(QuantFormat::Q4_0, 2, 256, b, Scales::None, vec![]).unwrap();
    let mut b = Vec::new();
    for blk in 0..8 {
        b.extend_from_slice(&f16::from_f32(2.0 * pow(blk)).to_le_bytes());
        b.extend((-16i8..16).map(|v| v as u8));
    }
    let q8k = QuantizedHost::new(QuantFormat::Q8_0, 1, 256, b, Scales::None, vec![]).unwrap();
    for (q, want) in [
        (q4, vec![96.0f32, 96.0]),
        (q8, vec![-32.0]),
        (q4k, vec![1530.0, 1530.0]),
        (q8k, vec![-1020.0]),
    ] {
        let dw = QuantWeight::upload(s, &q).unwrap();
        let x = DeviceTensor::filled(s, &[1, q.k()], f16::ONE).unwrap();
        for path in [GemvPath::Auto, GemvPath::Fma, GemvPath::Mma] {
            let mut y = DeviceTensor::filled(s, &[1, q.n()], f16::NAN).unwrap();
            gemv::gemv_with_path(s, &x, &dw, &mut y, path).unwrap();
            let got: Vec<f32> = y.to_host(s).unwrap().iter().map(|v| v.to_f32()).collect();
            assert_eq!(got, want, "{} {path:?}", q.format().name());
        }
    }
}

/// Element-wise bound of `gemv::dequantize` against the exact (f64) reference value: one
/// rounding to `T` (`T::EPS` relative), after at most one f32 rounding (int8's q · scale).
fn check_dequantize<T: fl_kernels::FloatDType>(gpu: &Gpu, q: &QuantizedHost, dw: &QuantWeight) {
    let s = gpu.stream();
    let (n, k) = (q.n(), q.k());
    let mut out = DeviceTensor::filled(s, &[n, k], T::from_f32(f32::NAN)).unwrap();
    gemv::dequantize(s, dw, &mut out).unwrap();
    let got = out.to_host(s).unwrap();
    let want = reference::gemv::dequantize(q);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let err = (g.to_f64() - w).abs();
        assert!(
            err <= w.abs() * (T::EPS + 6e-8),
            "dequantize {} <{}> [{n}, {k}] element ({}, {}): {} vs {w}",
            q.format().name(),
            T::NAME,
            i / k,
            i % k,
            g.to_f64()
        );
    }
}

#[test]
fn dequantize_matches_reference_every_format_dtype_and_shape() {
    let Some(gpu) = gpu_or_skip("dequantize_matches_reference_every_format_dtype_and_shape") else {
        return;
    };
    let mut r = rng("gemv_dequantize");
    for &f in FORMATS {
        for &(n, k) in SHAPES {
            if k % f.k_multiple() != 0 {
                continue;
            }
            let (q, dw) = random_quantized(&gpu, &mut r, n, k, f);
            check_dequantize::<f16>(&gpu, &q, &dw);
            check_dequantize::<bf16>(&gpu, &q, &dw);
            check_dequantize::<f32>(&gpu, &q, &dw);
        }
    }
}

#[test]
fn dequantize_then_dense_product_is_the_gemv() {
    // The two paths of a weight-only layer agree: y = x · dequantize(W)ᵀ computed on the host
    // from the GPU's dense weight equals gemv(x, W) within the GEMV's rounding.
    let Some(gpu) = gpu_or_skip("dequantize_then_dense_product_is_the_gemv") else {
        return;
    };
    let s = gpu.stream();
    let mut r = rng("gemv_dequantize_product");
    let (m, n, k) = (3, 67, 384);
    for &f in FORMATS {
        let q = gemv::quantize(&random_weights(&mut r, n, k), n, k, f).unwrap();
        let dw = QuantWeight::upload(s, &q).unwrap();
        let mut dense = DeviceTensor::<f32>::zeros(s, &[n, k]).unwrap();
        gemv::dequantize(s, &dw, &mut dense).unwrap();
        let wd = dense.to_host(s).unwrap();
        let x: Vec<f16> = random(&mut r, m * k);
        let dx = DeviceTensor::from_host(s, &x, &[m, k]).unwrap();
        let mut y = DeviceTensor::filled(s, &[m, n], f16::NAN).unwrap();
        gemv::gemv(s, &dx, &dw, &mut y).unwrap();
        let want: Vec<f64> = (0..m * n)
            .map(|i| {
                let (t, c) = (i / n, i % n);
                (0..k)
                    .map(|j| x[t * k + j].to_f64() * wd[c * k + j] as f64)
                    .sum()
            })
            .collect();
        let err = rel_l2(&y.to_host(s).unwrap(), &want);
        assert!(err < bound::<f16>(), "{}: rel L2 {err:e}", f.name());
    }
}

#[test]
fn gemv_shape_errors_name_the_argument() {
    let Some(gpu) = gpu_or_skip("gemv_shape_errors_name_the_argument") else {
        return;
    };
    let s = gpu.stream();
    let q = gemv::quantize(&vec![0.5f32; 8 * 64], 8, 64, QuantFormat::Q8_0).unwrap();
    let w = QuantWeight::upload(s, &q).unwrap();
    let x = DeviceTensor::<f16>::zeros(s, &[2, 64]).unwrap();
    let mut y = DeviceTensor::<f16>::zeros(s, &[2, 8]).unwrap();
    gemv::gemv(s, &x, &w, &mut y).unwrap();
    let bad_k = DeviceTensor::<f16>::zeros(s, &[2, 32]).unwrap();
    assert!(matches!(
        gemv::gemv(s, &bad_k, &w, &mut y),
        Err(Error::Shape { arg: "x", .. })
    ));
    let flat = DeviceTensor::<f16>::zeros(s, &[64]).unwrap();
    assert!(matches!(
        gemv::gemv(s, &flat, &w, &mut y),
        Err(Error::Shape { arg: "x", .. })
    ));
    let mut bad_y = DeviceTensor::<f16>::zeros(s, &[2, 9]).unwrap();
    assert!(matches!(
        gemv::gemv(s, &x, &w, &mut bad_y),
        Err(Error::Shape { arg: "y", .. })
    ));
    let x17 = DeviceTensor::<f16>::zeros(s, &[17, 64]).unwrap();
    let mut y17 = DeviceTensor::<f16>::zeros(s, &[17, 8]).unwrap();
    assert!(matches!(
        gemv::gemv(s, &x17, &w, &mut y17),
        Err(Error::TooLarge { arg: "x", .. })
    ));
    // m = 0 launches nothing.
    let x0 = DeviceTensor::<f16>::zeros(s, &[0, 64]).unwrap();
    let mut y0 = DeviceTensor::<f16>::zeros(s, &[0, 8]).unwrap();
    gemv::gemv(s, &x0, &w, &mut y0).unwrap();
    // dequantize: out must be the weight's [n, k].
    let mut dense = DeviceTensor::<f16>::zeros(s, &[8, 64]).unwrap();
    gemv::dequantize(s, &w, &mut dense).unwrap();
    let mut bad = DeviceTensor::<f16>::zeros(s, &[64, 8]).unwrap();
    assert!(matches!(
        gemv::dequantize(s, &w, &mut bad),
        Err(Error::Shape { arg: "out", .. })
    ));
}

#[test]
fn gemv_launcher_rejects_misaligned_and_bad_arguments() {
    let Some(gpu) = gpu_or_skip("gemv_launcher_rejects_misaligned_and_bad_arguments") else {
        return;
    };
    use fl_kernels::cudarc::driver::{DevicePtr, DevicePtrMut};
    use fl_kernels_sys::{fl_dtype, fl_gemv_format, fl_gemv_quant, FL_ERR_MISALIGNED};
    let s = gpu.stream();
    let wbuf = DeviceTensor::<u8>::zeros(s, &[64 * 34]).unwrap();
    let xbuf = DeviceTensor::<f16>::zeros(s, &[2 * 64 + 8]).unwrap();
    let mut ybuf = DeviceTensor::<f16>::zeros(s, &[64]).unwrap();
    let (pw, _g1) = wbuf.as_slice().device_ptr(s);
    let (px, _g2) = xbuf.as_slice().device_ptr(s);
    let (py, _g3) = ybuf.as_slice_mut().device_ptr_mut(s);
    let call = |x: u64, w: u64, m: i64, k: i64, dt: fl_dtype| {
        // SAFETY: the buffers hold more than any call below reads or writes (n = 32 rows of
        // k <= 64 Q8_0 values: 32 * 2 * 34 bytes; x 2 * 64 + 8 halves; y 64 halves).
        unsafe {
            fl_gemv_quant(
                dt,
                fl_gemv_format::FL_GEMV_Q8_0,
                x as _,
                w as _,
                std::ptr::null(),
                std::ptr::null(),
                0,
                py as _,
                m,
                32,
                k,
                s.cu_stream() as _,
            )
        }
    };
    let f16t = fl_dtype::FL_DTYPE_F16;
    assert_eq!(call(px, pw, 1, 64, f16t), 0);
    assert_eq!(call(px + 2, pw, 1, 64, f16t), FL_ERR_MISALIGNED);
    assert_eq!(call(px, pw + 2, 1, 64, f16t), FL_ERR_MISALIGNED);
    assert!(call(px, pw, 17, 64, f16t) < 0, "m > 16");
    assert!(call(px, pw, 1, 48, f16t) < 0, "k not a multiple of 32");
    assert!(call(px, pw, 1, 64, fl_dtype::FL_DTYPE_F32) < 0, "f32 x");
    s.synchronize().unwrap();
}

#[test]
fn gemv_gpu_proptest() {
    let Some(gpu) = gpu_or_skip("gemv_gpu_proptest") else {
        return;
    };
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &(
                0..FORMATS.len(),
                strategies::length(600),
                1usize..=24,
                1..=MAX_M,
                any::<u64>(),
            ),
            |(fi, n, kb, m, seed)| {
                use rand::SeedableRng;
                let mut r = rand::rngs::StdRng::seed_from_u64(seed);
                let f = FORMATS[fi];
                let k = kb * 128;
                let (q, dw) = random_quantized(&gpu, &mut r, n, k, f);
                check::<f16>(&gpu, &q, &dw, m, &mut r);
                check::<bf16>(&gpu, &q, &dw, m, &mut r);
                Ok(())
            },
        )
        .unwrap();
}

// ---- quantisers and references (CPU only, run in CI) ----

/// Per value: |w − deq| within half a step (plus the f16 rounding of GGUF `d`; Q4_0 maps the
/// largest magnitude to −8, so values near the opposite end, w/d in (7.5, 8], get up to d).
fn check_bound(w: &[f32], q: &QuantizedHost) -> std::result::Result<(), TestCaseError> {
    let deq = reference::gemv::dequantize(q);
    let (n, k) = (q.n(), q.k());
    for (i, (&wi, &di)) in w.iter().zip(&deq).enumerate() {
        let err = (wi as f64 - di).abs();
        let (r, j) = (i / k, i % k);
        let lim = match (q.format(), q.scales()) {
            // Plus the f32 rounding of w / scale (a few ulps of |w|): the quantiser divides
            // in f32, so a value within an ulp of a half step may round either way.
            (QuantFormat::Int8, Scales::F32(s)) => {
                0.5 * s[r] as f64 * (1.0 + 1e-6) + (wi as f64).abs() * 2f64.powi(-21)
            }
            (QuantFormat::Int4 { group, .. }, Scales::F16(s)) => {
                0.5 * s[r * (k / group) + j / group].to_f64() * (1.0 + 1e-6)
                    + (wi as f64).abs() * 2f64.powi(-21)
            }
            (f, _) => {
                let bb = if f == QuantFormat::Q8_0 {
                    Q8_0_BLOCK_BYTES
                } else {
                    Q4_0_BLOCK_BYTES
                };
                let b = i / 32;
                let blk = &q.data()[b * bb..b * bb + 2];
                let d = f16::from_le_bytes([blk[0], blk[1]]).to_f64().abs();
                let amax = w[b * 32..b * 32 + 32]
                    .iter()
                    .fold(0f64, |a, v| a.max(v.abs() as f64));
                let step = if f == QuantFormat::Q4_0 && (wi as f64).abs() > 7.4 * d {
                    1.0
                } else {
                    0.5
                };
                step * d * (1.0 + 1e-3) + amax * 2f64.powi(-10)
            }
        };
        prop_assert!(
            err <= lim,
            "{} n={n} k={k} i={i}: w={wi} deq={di} err={err:e} > {lim:e}",
            q.format().name()
        );
    }
    Ok(())
}

fn format_strategy() -> impl Strategy<Value = QuantFormat> {
    (0..FORMATS.len()).prop_map(|i| FORMATS[i])
}

proptest! {
    #[test]
    fn quantize_error_is_within_half_a_step(
        f in format_strategy(), n in 1usize..6, kb in 1usize..5, seed in any::<u64>(),
        scale in prop_oneof![Just(1.0f32), Just(1e-2f32), Just(300.0f32)],
    ) {
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let k = kb * 128;
        let w: Vec<f32> = random::<f32>(&mut r, n * k).iter().map(|v| v * scale).collect();
        let q = gemv::quantize(&w, n, k, f).unwrap();
        prop_assert_eq!(q.data().len(), f.data_bytes(n, k));
        check_bound(&w, &q)?;
    }

    #[test]
    fn quantize_of_dequantized_reproduces_the_bytes(
        fi in prop_oneof![Just(1usize), Just(3), Just(6), Just(7)],
        n in 1usize..5, kb in 1usize..4, seed in any::<u64>(),
    ) {
        // Symmetric int4 (scale rounded up to f16), Q8_0 and Q4_0 are idempotent: their
        // dequantised values quantise to the same bytes.
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let f = FORMATS[fi];
        let k = kb * 128;
        let q = gemv::quantize(&random::<f32>(&mut r, n * k), n, k, f).unwrap();
        let deq: Vec<f32> = reference::gemv::dequantize(&q).iter().map(|&v| v as f32).collect();
        let q2 = gemv::quantize(&deq, n, k, f).unwrap();
        prop_assert_eq!(q2, q);
    }

    #[test]
    fn reference_gemv_with_one_hot_x_reads_a_column(
        f in format_strategy(), n in 1usize..9, seed in any::<u64>(), j in 0usize..256,
    ) {
        use rand::SeedableRng;
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let k = 256;
        let q = gemv::quantize(&random::<f32>(&mut r, n * k), n, k, f).unwrap();
        let deq = reference::gemv::dequantize(&q);
        let mut x = vec![f16::ZERO; 2 * k];
        x[j] = f16::ONE;
        x[k + j] = f16::from_f32(-2.0);
        let y = reference::gemv::gemv(&x, 2, &q);
        for row in 0..n {
            prop_assert_eq!(y[row], deq[row * k + j]);
            prop_assert_eq!(y[n + row], -2.0 * deq[row * k + j]);
        }
    }
}

#[test]
fn q8_0_block_bytes_are_llama_cpp_layout() {
    // amax = 127 -> d = 1.0 (f16 0x3C00, little endian 00 3C); integer values quantise to
    // themselves.
    let w: Vec<f32> = (0..32)
        .map(|j| match j {
            0 => 127.0,
            1 => -127.0,
            _ => (j as f32) - 16.0,
        })
        .collect();
    let q = gemv::quantize(&w, 1, 32, QuantFormat::Q8_0).unwrap();
    let mut want = vec![0x00u8, 0x3C, 0x7F, 0x81];
    want.extend((2..32).map(|j| ((j as i8) - 16) as u8));
    assert_eq!(q.data(), &want[..]);
    assert_eq!(q.data()[2 + 5], 0xF5); // -11
}

#[test]
fn q4_0_block_bytes_are_llama_cpp_layout() {
    // The largest magnitude is -8 (first value) -> d = -8 / -8 = 1.0 (00 3C); value j < 16 is
    // j - 8 (nibble j, low), value j + 16 is 7 - j (nibble 15 - j, high).
    let w: Vec<f32> = (0..32)
        .map(|j| {
            if j < 16 {
                j as f32 - 8.0
            } else {
                7.0 - (j - 16) as f32
            }
        })
        .collect();
    let q = gemv::quantize(&w, 1, 32, QuantFormat::Q4_0).unwrap();
    let want = [
        0x00u8, 0x3C, 0xF0, 0xE1, 0xD2, 0xC3, 0xB4, 0xA5, 0x96, 0x87, 0x78, 0x69, 0x5A, 0x4B, 0x3C,
        0x2D, 0x1E, 0x0F,
    ];
    assert_eq!(q.data(), &want[..]);
    assert_eq!(
        reference::gemv::dequantize(&q),
        w.iter().map(|&v| v as f64).collect::<Vec<_>>()
    );
}

#[test]
fn int4_packs_even_k_in_the_low_nibble() {
    // Group of 32 with max |w| = 7 -> scale 1; value j = (j % 15) - 7.
    let w: Vec<f32> = (0..32).map(|j| (j % 15) as f32 - 7.0).collect();
    let sym = QuantFormat::Int4 {
        group: 32,
        zero_point: false,
    };
    let q = gemv::quantize(&w, 1, 32, sym).unwrap();
    assert_eq!(q.scales(), Scales::F16(&[f16::ONE]));
    // nibble = w + 8 = (j % 15) + 1; byte b = nib(2b) | nib(2b + 1) << 4.
    let nib = |j: usize| ((j % 15) + 1) as u8;
    let want: Vec<u8> = (0..16)
        .map(|b| nib(2 * b) | (nib(2 * b + 1) << 4))
        .collect();
    assert_eq!(q.data(), &want[..]);
    assert_eq!(q.data()[0], 0x21);
    // With a zero point: range [-7, 7] -> scale 14/15 rounded up to f16 (a hair above), so
    // zero = round(7 / scale) = round(7.4998) = 7.
    let zp = QuantFormat::Int4 {
        group: 32,
        zero_point: true,
    };
    let q = gemv::quantize(&w, 1, 32, zp).unwrap();
    assert_eq!(q.zeros(), &[7]);
    let Scales::F16(s) = q.scales() else {
        panic!("int4 has f16 scales")
    };
    assert!(s[0].to_f32() >= 14.0 / 15.0 && s[0].to_f32() < 14.0 / 15.0 * 1.001);
}

#[test]
fn int8_bytes_and_scale() {
    let w: Vec<f32> = (0..64).map(|j| (j as f32 - 32.0) * 0.5).collect(); // amax 16
    let q = gemv::quantize(&w, 2, 32, QuantFormat::Int8).unwrap();
    assert_eq!(q.scales(), Scales::F32(&[16.0 / 127.0, 15.5 / 127.0]));
    assert_eq!(q.data()[0], (-127i8) as u8);
    assert_eq!(q.data()[2], (-119i8) as u8); // w = -15 = -119.06 * 16 / 127
    assert_eq!(q.data()[32], 0); // w = 0 (row 1)
    assert_eq!(q.data()[63], 127);
}

#[test]
fn quantize_and_new_errors_name_the_argument() {
    let w = vec![0.5f32; 4 * 64];
    let is = |r: fl_kernels::Result<QuantizedHost>, a: &str| match r {
        Err(Error::InvalidArgument { arg, .. }) => assert_eq!(arg, a),
        other => panic!("expected an error on `{a}`, got {other:?}"),
    };
    let g = |group, zero_point| QuantFormat::Int4 { group, zero_point };
    is(gemv::quantize(&w, 4, 48, QuantFormat::Q4_0), "k");
    is(gemv::quantize(&w, 4, 0, QuantFormat::Q8_0), "k");
    is(gemv::quantize(&w, 4, 64, g(128, false)), "k");
    is(gemv::quantize(&w, 4, 64, g(16, true)), "format");
    is(
        gemv::quantize(&w[..10], 4, 64, QuantFormat::Int8),
        "weights",
    );
    let mut nan = w.clone();
    nan[77] = f32::NAN;
    is(gemv::quantize(&nan, 4, 64, QuantFormat::Int8), "weights");
    let huge = vec![1e7f32; 4 * 64];
    is(gemv::quantize(&huge, 4, 64, g(32, false)), "weights");
    is(gemv::quantize(&huge, 4, 64, QuantFormat::Q8_0), "weights");
    let new = QuantizedHost::new;
    is(
        new(QuantFormat::Q8_0, 2, 64, vec![0; 135], Scales::None, vec![]),
        "data",
    );
    is(
        new(
            QuantFormat::Q8_0,
            2,
            64,
            vec![0; 136],
            Scales::F32(&[1.0, 1.0]),
            vec![],
        ),
        "scales",
    );
    is(
        new(
            QuantFormat::Int8,
            2,
            32,
            vec![0; 64],
            Scales::F32(&[1.0]),
            vec![],
        ),
        "scales",
    );
    is(
        new(QuantFormat::Q4_0, 2, 64, vec![0; 72], Scales::None, vec![1]),
        "zeros",
    );
    let s = [f16::ONE; 4];
    is(
        new(
            g(32, true),
            2,
            64,
            vec![0; 64],
            Scales::F16(&s),
            vec![0, 1, 16, 2],
        ),
        "zeros",
    );
    is(
        new(
            g(32, true),
            2,
            64,
            vec![0; 64],
            Scales::F16(&s),
            vec![0, 1, 2],
        ),
        "zeros",
    );
    assert!(new(
        g(32, true),
        2,
        64,
        vec![0; 64],
        Scales::F16(&s),
        vec![0, 1, 15, 2]
    )
    .is_ok());
}

/// The kernel's 4-bit unpacking (exact-float tricks), run on the host through
/// `fl_gemv_unpack_unit_host`, on one 16-byte unit; `None` when the launcher refuses.
fn host_unpack(format: QuantFormat, bytes: &[u8; 16], zero: i32) -> Option<Vec<f32>> {
    use fl_kernels_sys::fl_gemv_format as F;
    let f = match format {
        QuantFormat::Int4 {
            zero_point: false, ..
        } => F::FL_GEMV_INT4,
        QuantFormat::Int4 {
            zero_point: true, ..
        } => F::FL_GEMV_INT4_ZP,
        QuantFormat::Q4_0 => F::FL_GEMV_Q4_0,
        QuantFormat::Int8 => F::FL_GEMV_INT8,
        QuantFormat::Q8_0 => F::FL_GEMV_Q8_0,
        QuantFormat::Q4_K => F::FL_GEMV_Q4_K,
        QuantFormat::Q5_K => F::FL_GEMV_Q5_K,
        QuantFormat::Q6_K => F::FL_GEMV_Q6_K,
    };
    let mut out = vec![f32::NAN; 32];
    // SAFETY: a host-only function; `bytes` holds 16 bytes and `out` 32 floats.
    let st = unsafe {
        fl_kernels_sys::fl_gemv_unpack_unit_host(f, bytes.as_ptr(), zero, out.as_mut_ptr())
    };
    (st == fl_kernels_sys::FL_OK as i32).then_some(out)
}

/// The reference's values (scale 1) of one 32-value row whose 16 quant bytes are `bytes`.
fn reference_unit(format: QuantFormat, bytes: &[u8; 16], zero: u8) -> Vec<f64> {
    let q = match format {
        QuantFormat::Int4 { zero_point, .. } => QuantizedHost::new(
            QuantFormat::Int4 {
                group: 32,
                zero_point,
            },
            1,
            32,
            bytes.to_vec(),
            Scales::F16(&[f16::ONE]),
            if zero_point { vec![zero] } else { vec![] },
        ),
        _ => {
            let mut blk = f16::ONE.to_le_bytes().to_vec();
            blk.extend_from_slice(bytes);
            QuantizedHost::new(format, 1, 32, blk, Scales::None, vec![])
        }
    }
    .unwrap();
    reference::gemv::dequantize(&q)
}

/// CPU test of the GPU kernel's own 4-bit unpacking code (the exact-float "magic number"
/// trick, the nibble order, the −8 / zero offsets, the per-power-of-16 accumulator classes):
/// every byte value at every position of a unit, every zero point, against the format
/// definitions (reference::gemv::dequantize). Runs without a GPU.
#[test]
fn kernel_nibble_unpacking_matches_the_formats_on_every_byte() {
    let formats = [
        QuantFormat::Int4 {
            group: 32,
            zero_point: false,
        },
        QuantFormat::Int4 {
            group: 32,
            zero_point: true,
        },
        QuantFormat::Q4_0,
    ];
    for format in formats {
        let zeros: Vec<u8> = match format {
            QuantFormat::Int4 {
                zero_point: true, ..
            } => (0..16).collect(),
            _ => vec![8],
        };
        for &z in &zeros {
            for v in 0..=255u32 {
                // Byte b = v + 37 b (mod 256): each byte value lands on every position.
                let bytes: [u8; 16] = std::array::from_fn(|b| (v + 37 * b as u32) as u8);
                let got = host_unpack(format, &bytes, z as i32).expect("unpack refused");
                let want = reference_unit(format, &bytes, z);
                for (e, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g as f64,
                        w,
                        "{} zero {z}: value {e} of unit {bytes:02x?}",
                        format.name()
                    );
                }
            }
        }
    }
    // Byte formats and bad zeros are refused.
    let b = [0u8; 16];
    assert!(host_unpack(QuantFormat::Int8, &b, 8).is_none());
    assert!(host_unpack(QuantFormat::Q8_0, &b, 8).is_none());
    let zp = QuantFormat::Int4 {
        group: 32,
        zero_point: true,
    };
    assert!(host_unpack(zp, &b, 16).is_none());
    assert!(host_unpack(zp, &b, -1).is_none());
}

/// CPU test of the one-token kernel's raw-nibble unpacking (int4 at m = 1 in its 4-warp CTAs
/// of 4 tiles), run on the host through `fl_gemv_raw_nibbles_host`: for every 16-bit low half
/// of a word (beside a varying high half), each nibble's 16-bit value, scaled and less the
/// offset that the kernel subtracts per row through x's group sums, is the nibble exactly,
/// for f16 and bf16 activations. Runs without a GPU.
#[test]
fn kernel_raw_nibbles_less_their_offsets_are_the_nibbles() {
    use fl_kernels_sys::fl_dtype as D;
    for dtype in [D::FL_DTYPE_F16, D::FL_DTYPE_BF16] {
        for a in 0..=0xFFFFu32 {
            let word = a | ((a.wrapping_mul(0x9E37) ^ 0x5A5A) & 0xFFFF) << 16;
            let mut out = [f32::NAN; 8];
            // SAFETY: a host-only function; `out` holds 8 floats.
            let st =
                unsafe { fl_kernels_sys::fl_gemv_raw_nibbles_host(dtype, word, out.as_mut_ptr()) };
            assert_eq!(st, fl_kernels_sys::FL_OK as i32, "{dtype:?} refused");
            for (i, &v) in out.iter().enumerate() {
                let q = ((word >> (4 * i)) & 15) as f32;
                assert!(
                    v == q,
                    "{dtype:?} word {word:#010x} nibble {i}: {v} (want {q})"
                );
            }
        }
    }
    // Another dtype and a NULL output are refused.
    let mut out = [0f32; 8];
    // SAFETY: as above; the calls only check their arguments.
    unsafe {
        assert_ne!(
            fl_kernels_sys::fl_gemv_raw_nibbles_host(D::FL_DTYPE_F32, 0, out.as_mut_ptr()),
            fl_kernels_sys::FL_OK as i32
        );
        assert_ne!(
            fl_kernels_sys::fl_gemv_raw_nibbles_host(D::FL_DTYPE_F16, 0, std::ptr::null_mut()),
            fl_kernels_sys::FL_OK as i32
        );
    }
}

/// `fl_gemv_dequantize_host`: the GPU dequantisation kernel's own per-unit code, run on the
/// host over `q`'s buffers; `Err(status)` when the launcher's checks refuse.
fn host_dequantize(q: &QuantizedHost, k_override: Option<i64>) -> Result<Vec<f32>, i32> {
    let (f, group, scales, zeros) = host_weight_ffi(q);
    let mut out = vec![f32::NAN; q.n() * q.k()];
    // SAFETY: a host-only function over host buffers: data, scales and zeros are those of a
    // consistent QuantizedHost of [n, k] (k_override only ever makes the call refuse or read
    // less), `half::f16` has the layout of `__half`, and `out` holds n·k floats.
    let st = unsafe {
        fl_kernels_sys::fl_gemv_dequantize_host(
            f,
            q.data().as_ptr() as _,
            scales,
            zeros,
            group,
            out.as_mut_ptr(),
            q.n() as i64,
            k_override.unwrap_or(q.k() as i64),
        )
    };
    if st == fl_kernels_sys::FL_OK as i32 {
        Ok(out)
    } else {
        Err(st)
    }
}

/// CPU test of the GPU dequantisation kernel's own per-unit code (byte and nibble order,
/// scale and zero indexing per row and group, GGUF block offsets): every format, shapes whose
/// rows start off 16-byte boundaries (GGUF) and hold several groups, against
/// reference::gemv::dequantize. Every value is `(q − z) · scale` rounded once to f32 (exact
/// except int8's product), so the kernel's f32 value must equal the reference rounded to f32.
/// Runs without a GPU.
#[test]
fn kernel_dequantize_code_matches_the_reference_on_the_host() {
    let mut r = rng("gemv_dequantize_host");
    for &f in FORMATS {
        for &(n, k) in &[(1, 128), (7, 384), (5, 640), (3, 1152)] {
            if k % f.k_multiple() != 0 {
                continue;
            }
            let q = gemv::quantize(&random_weights(&mut r, n, k), n, k, f).unwrap();
            let got = host_dequantize(&q, None).unwrap();
            let want = reference::gemv::dequantize(&q);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    (*w as f32).to_bits(),
                    "{} [{n}, {k}] element ({}, {}): {g} vs {w}",
                    f.name(),
                    i / k,
                    i % k
                );
            }
        }
    }
    // The launcher's checks, run by the hook too: k not a multiple of 32 (or of the group).
    let q = gemv::quantize(&random_weights(&mut r, 2, 128), 2, 128, FORMATS[3]).unwrap();
    assert!(host_dequantize(&q, Some(96)).is_err(), "k % group != 0");
    assert!(host_dequantize(&q, Some(100)).is_err(), "k % 32 != 0");
}

/// Without a GPU (CI): `fl_gemv_dequantize` must get past its host-side checks to the launch
/// for every format and dtype and return the launch's CUDA error (no driver), never end the
/// process (a `__device__`-only helper reached from a launcher compiles, on the host, to
/// `exit(1)`). With a GPU this is skipped: the GPU tests take the same paths.
#[test]
fn dequantize_launcher_reaches_the_launch_without_a_gpu() {
    use fl_kernels_sys::{fl_dtype, fl_gemv_format as F};
    if fl_kernels::gpu_available() {
        return;
    }
    let p = |i: usize| (0x10_0000 + 0x1000 * i) as *mut std::ffi::c_void;
    for (f, group) in [
        (F::FL_GEMV_INT8, 0),
        (F::FL_GEMV_INT4, 128),
        (F::FL_GEMV_INT4_ZP, 32),
        (F::FL_GEMV_Q8_0, 0),
        (F::FL_GEMV_Q4_0, 0),
    ] {
        for dt in [
            fl_dtype::FL_DTYPE_F32,
            fl_dtype::FL_DTYPE_F16,
            fl_dtype::FL_DTYPE_BF16,
        ] {
            // SAFETY: host-side checks and a failing launch only (no GPU): the fake device
            // addresses are never dereferenced on the host.
            let st = unsafe {
                fl_kernels_sys::fl_gemv_dequantize(
                    dt,
                    f,
                    p(0),
                    p(1),
                    p(2),
                    group,
                    p(3),
                    3,
                    256,
                    std::ptr::null_mut(),
                )
            };
            assert!(
                st > 0,
                "{f:?} {dt:?}: status {st}, expected a CUDA error from the launch"
            );
        }
    }
}

#[test]
fn reference_gemv_split_over_threads_is_the_serial_sum() {
    // reference::gemv splits the rows over threads, tasks of up to ~4 MB of f64 rows: here
    // many tasks (k = 16384: 32 rows each) with a partial last one, and few (k = 64), every
    // format, 1 and 3 tokens; each value equals the serial f64 sum over dequantize's rows,
    // in the same order (bit for bit).
    let mut r = rng("reference_gemv_threads");
    for &(n, k) in &[(203usize, 16384usize), (1001, 64 * 4)] {
        for f in all_formats().into_iter().chain([
            QuantFormat::Q4_K,
            QuantFormat::Q5_K,
            QuantFormat::Q6_K,
        ]) {
            if k % f.k_multiple() != 0 {
                continue;
            }
            let q = gemv::quantize(&random_weights(&mut r, n, k), n, k, f).unwrap();
            let wd = reference::gemv::dequantize(&q);
            for m in [1usize, 3] {
                let x: Vec<f16> = random(&mut r, m * k);
                let got = reference::gemv::gemv(&x, m, &q);
                for t in 0..m {
                    for row in 0..n {
                        let want: f64 = wd[row * k..(row + 1) * k]
                            .iter()
                            .zip(&x[t * k..(t + 1) * k])
                            .map(|(a, b)| a * b.to_f64())
                            .sum();
                        assert_eq!(got[t * n + row], want, "{} m={m} t={t} row={row}", f.name());
                    }
                }
            }
        }
    }
}
