//! ggml block formats on the CPU: [`reference::ggml`] checked bit for bit against frozen
//! vectors, round trips through ggml's reference quantisers, and proptests over random
//! blocks.
//!
//! Frozen dequantisation vectors: random valid blocks (seeded numpy; f16 scales over the
//! whole finite range, subnormals and negatives included, and realistic ones) dequantised
//! by llama.cpp's gguf-py 0.19.0 (`gguf.quants.dequantize`; Q8_K, which gguf-py lacks, by
//! numpy). On 1,024 to 4,096 such blocks per type and on every non-NaN F16 / BF16 value,
//! [`dequantize_row`], gguf-py and ggml's own C `dequantize_row_*` (llama.cpp vendored in
//! llama-cpp-python 0.3.36) agreed bit for bit.
//!
//! Frozen quantisation vectors: ggml's C `quantize_row_*_ref` from the same source, built
//! with `-O2 -ffp-contract=off`; [`quantize_row`] matched it on all 362,496 test values
//! (11,328 blocks of 32, 1,416 super-blocks). A `-march=native` build (FMA contraction)
//! picks different K-quant levels in 0.2-5% of super-blocks; the two rows after the first
//! are such blocks.

use fl_kernels::ggml::GgmlType;
use fl_kernels::reference::ggml::{dequantize_row, quantize_row, random_blocks};
use fl_kernels::{bf16, f16, Error};
use proptest::prelude::*;

/// One frozen row: the block bytes and the f32 bit patterns ggml gives (8 hex digits each).
struct Vector {
    ty: GgmlType,
    bytes: &'static str,
    want: &'static str,
}

/// One frozen quantisation: 256 input values (f32 bit patterns, 8 hex digits each) and the
/// row ggml's reference quantiser makes of them in each format.
struct QuantVector {
    x: &'static str,
    want: &'static [(GgmlType, &'static str)],
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn frozen_vectors_are_bit_exact() {
    let mut seen = std::collections::HashSet::new();
    for (n, v) in VECTORS.iter().enumerate() {
        let bytes = unhex(v.bytes);
        let want: Vec<u32> = (0..v.want.len())
            .step_by(8)
            .map(|i| u32::from_str_radix(&v.want[i..i + 8], 16).unwrap())
            .collect();
        let got = dequantize_row(v.ty, &bytes, want.len()).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                *w,
                "vector {n} ({}), value {i}: got {g:e}, ggml {:e}",
                v.ty,
                f32::from_bits(*w)
            );
        }
        seen.insert(v.ty);
    }
    assert_eq!(
        seen.len(),
        GgmlType::ALL.len(),
        "a type has no frozen vector"
    );
}

#[test]
fn frozen_quantisations_are_bit_exact() {
    for (n, v) in QUANT_VECTORS.iter().enumerate() {
        let x: Vec<f32> = (0..v.x.len())
            .step_by(8)
            .map(|i| f32::from_bits(u32::from_str_radix(&v.x[i..i + 8], 16).unwrap()))
            .collect();
        assert_eq!(x.len(), 256);
        for (ty, want) in v.want {
            let got = quantize_row(*ty, &x).unwrap();
            let want = unhex(want);
            let bb = ty.block_bytes();
            for (b, (g, w)) in got.chunks(bb).zip(want.chunks(bb)).enumerate() {
                assert_eq!(g, w, "row {n}, {ty} block {b}");
            }
            assert_eq!(got.len(), want.len(), "row {n}, {ty}");
        }
    }
}

/// Largest error a round trip through `ty` may make on `block` (from ggml's formulas:
/// half a step, a whole step at the clamped end of the symmetric formats, plus the f16
/// rounding of the stored scale and minimum).
fn bound(ty: GgmlType, block: &[f32]) -> f32 {
    let amax = block.iter().fold(0f32, |a, v| a.max(v.abs()));
    let (min, max) = block
        .iter()
        .fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let f16_eps = 2f32.powi(-11);
    // Half the f16 subnormal spacing: the absolute rounding error of a tiny stored scale.
    let ulp0 = 2f32.powi(-25);
    match ty {
        GgmlType::Q4_0 => amax / 8.0 * (1.0 + 9.0 * f16_eps) + 8.0 * ulp0,
        GgmlType::Q5_0 => amax / 16.0 * (1.0 + 17.0 * f16_eps) + 16.0 * ulp0,
        GgmlType::Q8_0 => amax / 127.0 * (0.5 + 128.0 * f16_eps) + 128.0 * ulp0,
        GgmlType::Q4_1 => {
            (max - min) / 15.0 * (0.5 + 16.0 * f16_eps) + min.abs() * f16_eps + 16.0 * ulp0
        }
        GgmlType::Q5_1 => {
            (max - min) / 31.0 * (0.5 + 32.0 * f16_eps) + min.abs() * f16_eps + 32.0 * ulp0
        }
        GgmlType::F16 => amax * f16_eps + ulp0,
        GgmlType::BF16 => amax * 2f32.powi(-8),
        _ => 0.0,
    }
}

/// Largest relative RMS error of a K-quant round trip over a row: about three times what
/// ggml's reference quantisers make on Gaussian rows (0.38, 0.10, 0.065, 0.041, 0.016,
/// 0.011), for rows whose 32-value groups differ in scale.
fn k_rel_rms_bound(ty: GgmlType) -> f64 {
    match ty {
        GgmlType::Q2_K => 1.0,
        GgmlType::Q3_K => 0.35,
        GgmlType::Q4_K => 0.2,
        GgmlType::Q5_K => 0.12,
        GgmlType::Q6_K => 0.06,
        _ => 0.04,
    }
}

fn check_round_trip(ty: GgmlType, x: &[f32]) -> Result<(), TestCaseError> {
    let q = quantize_row(ty, x).unwrap();
    prop_assert_eq!(q.len(), ty.row_bytes(x.len()).unwrap());
    let y = dequantize_row(ty, &q, x.len()).unwrap();
    prop_assert!(y.iter().all(|v| v.is_finite()), "{}", ty);
    if ty.block_elems() == 256 {
        let err: f64 = x
            .iter()
            .zip(&y)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum();
        let sig: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
        let rel = if sig > 0.0 { (err / sig).sqrt() } else { err };
        prop_assert!(
            rel <= k_rel_rms_bound(ty),
            "{}: relative RMS error {}",
            ty,
            rel
        );
        return Ok(());
    }
    let be = ty.block_elems().max(32);
    for (xb, yb) in x.chunks(be).zip(y.chunks(be)) {
        let b = bound(ty, xb);
        for (a, r) in xb.iter().zip(yb) {
            prop_assert!((a - r).abs() <= b, "{}: {} -> {}, bound {}", ty, a, r, b);
        }
    }
    Ok(())
}

#[test]
fn round_trip_edge_rows() {
    let rows: [Vec<f32>; 5] = [
        vec![0.0; 512],
        (0..512).map(|i| (i % 64) as f32).collect(),
        (0..512).map(|i| -((i % 64) as f32) * 1e-3).collect(),
        (0..512)
            .map(|i| if i % 2 == 0 { 3.0 } else { -3.0 })
            .collect(),
        (0..512).map(|i| 1e-3 * ((i % 64) as f32 - 30.0)).collect(),
    ];
    for ty in GgmlType::ALL {
        for x in &rows {
            check_round_trip(ty, x).unwrap();
        }
    }
    // All-equal block: every format reproduces a constant exactly up to f16 rounding.
    let q = quantize_row(GgmlType::Q4_1, &[0.75; 32]).unwrap();
    assert!(dequantize_row(GgmlType::Q4_1, &q, 32)
        .unwrap()
        .iter()
        .all(|&v| v == 0.75));
}

#[test]
fn quantisers_store_ggml_scales() {
    // Q4_0 keeps the sign of the largest magnitude: d = max / -8, so max maps to q = 0.
    let mut x = vec![0.5f32; 32];
    x[7] = -4.0;
    let q = quantize_row(GgmlType::Q4_0, &x).unwrap();
    assert_eq!(f16::from_le_bytes([q[0], q[1]]).to_f32(), 0.5);
    assert_eq!(q[2 + 7] & 0x0F, 0);
    // Q8_0: d = amax / 127, stored as f16.
    let q = quantize_row(GgmlType::Q8_0, &x).unwrap();
    assert_eq!(f16::from_le_bytes([q[0], q[1]]), f16::from_f32(4.0 / 127.0));
    assert_eq!(q[2 + 7] as i8, -127);
    // A scale beyond f16 range is stored as inf, as ggml stores it.
    let q = quantize_row(GgmlType::Q8_0, &[1e7; 32]).unwrap();
    assert_eq!(f16::from_le_bytes([q[0], q[1]]), f16::INFINITY);
    // BF16 rounds to nearest even and keeps NaN quiet.
    let q = quantize_row(GgmlType::BF16, &[1.0 + 2f32.powi(-8), f32::NAN]).unwrap();
    assert_eq!(bf16::from_le_bytes([q[0], q[1]]), bf16::ONE);
    assert!(bf16::from_le_bytes([q[2], q[3]]).is_nan());
}

#[test]
fn argument_errors_name_the_argument() {
    for ty in GgmlType::ALL {
        let be = ty.block_elems();
        let good = random_blocks(ty, 2, 1);
        if be > 1 {
            let e = dequantize_row(ty, &good, 2 * be - 1).unwrap_err();
            assert!(
                matches!(e, Error::InvalidArgument { arg: "k", .. }),
                "{ty}: {e}"
            );
        }
        let e = dequantize_row(ty, &good[1..], 2 * be).unwrap_err();
        assert!(matches!(e, Error::Shape { arg: "bytes", .. }), "{ty}: {e}");
        let e = dequantize_row(ty, &good, be).unwrap_err();
        assert!(matches!(e, Error::Shape { arg: "bytes", .. }), "{ty}: {e}");
        assert!(dequantize_row(ty, &[], 0).unwrap().is_empty());
    }
    let e = quantize_row(GgmlType::Q5_0, &[1.0; 48]).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { arg: "x", .. }), "{e}");
}

fn any_type() -> impl Strategy<Value = GgmlType> {
    proptest::sample::select(GgmlType::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any valid block (finite scales, arbitrary quants) dequantises to finite values.
    #[test]
    fn random_valid_blocks_are_finite(ty in any_type(), n in 1usize..5, seed in any::<u64>()) {
        let b = random_blocks(ty, n, seed);
        let y = dequantize_row(ty, &b, n * ty.block_elems()).unwrap();
        prop_assert!(y.iter().all(|v| v.is_finite()), "{}", ty);
    }

    /// Arbitrary bytes (NaN / inf scales included) never panic, whatever k is.
    #[test]
    fn arbitrary_bytes_never_panic(
        ty in any_type(),
        bytes in proptest::collection::vec(any::<u8>(), 0..700),
        k in 0usize..800,
    ) {
        let fits = k % ty.block_elems() == 0 && bytes.len() == k / ty.block_elems() * ty.block_bytes();
        match dequantize_row(ty, &bytes, k) {
            Ok(y) => prop_assert!(fits && y.len() == k),
            Err(_) => prop_assert!(!fits),
        }
    }

    /// Any f32 input, NaN and infinities included, quantises without a panic.
    #[test]
    fn quantize_never_panics(
        ty in any_type(),
        bits in proptest::collection::vec(any::<u32>(), 256..=256),
    ) {
        let x: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
        let q = quantize_row(ty, &x).unwrap();
        prop_assert_eq!(q.len(), ty.block_bytes() * 256 / ty.block_elems());
    }

    /// Quantise then dequantise stays within the format's error bound.
    #[test]
    fn round_trip_within_bound(
        ty in any_type(),
        v in proptest::collection::vec(-1f32..1.0, 8..17),
        exp in -20i32..15, // up to 2^15: f16 scales stay finite
        seed in any::<u64>(),
    ) {
        let n = v.len() / 8 * 256;
        // The super-block scales of the K-quants sit 2^7 to 2^12 below the data: keep them
        // out of f16's subnormals (ggml loses the precision there too).
        let exp = if ty.block_elems() == 256 { exp.max(0) } else { exp };
        let vmax = v.iter().fold(0f32, |a, b| a.max(b.abs()));
        let v: Vec<f32> = v.iter().map(|b| if vmax > 0.0 { b / vmax } else { 0.0 }).collect();
        let mut s = seed | 1;
        let x: Vec<f32> = (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * v[i / 32] * 2f32.powi(exp)
            })
            .collect();
        check_round_trip(ty, &x)?;
    }
}

/// ggml's `quantize_row_*_ref` (C, built without FP contraction) on three 256-value rows:
/// Gaussian, and two where an FMA build of ggml rounds differently (see the module docs).
const QUANT_VECTORS: &[QuantVector] = &[
    QuantVector {
        x: concat!(
            "3aa13d193e98f52dbe8c5bccbf63fdd4bee8ca9cbf7ddc8c3d7659233fab8c2cbefc027ebf1ed7713efacc943eb6b9e5",
            "3dd7e36dbf6e3327bcefa1853f31ff64bfac0f39beea4c9dbff35b44bfa50f93bfebbdf9be70bbbbbfa23bb03e8ae329",
            "3e20835bbe3f6ad3c0211297bf09e7c7bd46a8ed3de80e8bbfc3db7dbef49c14bf7a803abf4f0ff53f87cb87bf4eba98",
            "bd05357b3f626760bf1566d7bde4c3fe3de23b063d82a005bf9ccea13d9bef693fadededbfc608d63f5c00813df46fe2",
            "bf243767400006d33f432374bf99824c3d989bf73f13a1eebe41501a3f2ed335bd883a3c3f2ad0bc3fb82182bf2cf834",
            "3e500391beed36a73e0252a7bf97f5febf144d1cbe48e7993f6615643f9296a2bfa9695cbf4b6daf3f259b76bfff079d",
            "beed249abdc73e5e3fa0e5de3f307cc6bea78884bebcb5fbbe80199d3fc30303bedb2616be9b7bff3eb4868ebdf7567f",
            "be4a04e0bf8e99c1bc3cc48abee31d143f9543ad3f2730cfbcc5c8d43f2b1b05beae03623f86ac14bbb0eecc3f15588c",
            "bfa53bfd3eb1800cbfd81713c00242d4be9be465bf6661a83e27fd75400faa18bf54ebcfbf1fbac43e5255693efc6c3d",
            "be34a3cbbe52df673f33d49d3f0518abbf844f7dbda229d13d1088f1bf86f95a3e8509a1bf5ba3093f78d95d3e455f2f",
            "3db6e652bf174da2bdf2e9b5bfffb627bf90d1f63eb9c623c0083a713f58bb56bfdf80173f41b99dbf58727e3f476bf6",
            "3e061813bfc4b7023f9fe41b3fb889dcbd86c4b9be8c3ec1be23b42abf79a3953f8c9e7ebf0afaf7bd51ad0abf4b1579",
            "bf204654bfa38c7f3fa0e7a6be1dc9223f7746a43c5a4f69bf31c46ebea7434abf0f6b4d3c0266e2bec022fabe998f57",
            "bfb07523bf4e8d743fd3b828bf2bd5f1bf86ec8c3eacb6093fb4217fbfba1d78be5586c0bf21ce32bfe169163f3c2428",
            "bcc00d763d92501abf40977c3ee8d978bf0a0f64be125538bf8ddb7dbf9ba9413faaf2b5bf01d19d3e955721bd0a67d7",
            "bee1ddc9bf0209bb3f214d18be9a8e64be1b140b3cb609fc3f9697d33f2e35f83ec3e42fbf104637bfb0e45a3f731465",
            "3f776914be1015dd3f0ab8e63f480ca73f54c8813f6bdfcabee946b73fc1eaa2bf9f905d3f5c99e23efce4aa3f5fa581",
            "3ff083583fbe024fbf929528bfd826643f511fa4bf81ebedbc4b3ff93f56f861bfd267f4c00709eb3e84c2d73d35cdfb",
            "be7bb3cd3d1dd6a1bf5c4ac0bfc1ba2fbe2aa792bf78c1e7bfd25d993f017451bd7b7d213ed02482bf7d426fbf28768a",
            "bf7fc149bf62faf63e481903bf4871063eb64e523eadf47d40019c3dbfb246e93f634d92bdb74577bc65dcf4bfb99523",
            "beeb9e863f3e422dbda8ea6c3da5ffd5be94d8d13f93c8f1bcafe73dc00cd39cbf312babbffc0187c0501791bf07b5a4",
            "3faab2173d4100cdbf9615fabf70d1b5",
        ),
        want: &[
            (
                GgmlType::Q4_0,
                concat!(
                    "0935487927452775489c86760a698885386a00b4bc0b54db88649a5888582db873ae75d8f83366779c8d73458b60d6b8",
                    "8dbb77c787ae7db4cd878ecf79bb57708baa87f6c979f556fc32502be47cc9815e7f588767742d46f8540b33e36a9e81",
                    "6765b07b7888d5baa65723c23834bc478abb2b0b968e738b5a2b7f4e24a2813678a9868676b6883669390d75ba885864",
                ),
            ),
            (
                GgmlType::Q4_1,
                concat!(
                    "1d3409c15a8b295638965abfa8970c8baaa64a8c913330be42f3ab13769a64966797d1477c507a278033f8bf7678ac8d",
                    "83458b70d7b88ebb77d787bfaa3442c0437872408644b88f8455780937970aa94133fcbe502bd47bc8815d6e57866763",
                    "2d45f754c2320bbff36aaf816765b07c8889e5caa66823d3413438c0bc478abb2b0b968e738b5a2b7f4e24a2a13581c2",
                    "89ba969786d79a377a4a0f85dc996975",
                ),
            ),
            (
                GgmlType::Q5_0,
                concat!(
                    "0931c3dc803170d24e8a4dfa80291dfc03d2011a60d400b0db2449a95806a8a6f0b925b11fbf4a5fe54cf99ff82f4c8c",
                    "44efdbee37f9e57a05c09c5f0a56dd8d0e5c7db03d332f5e791e0c8fe2669ff0f6441fec81d1fbacfc2eda503442a047",
                    "c8f79102abddbf0ddfd73a9bf0a90b2f860b4d9ec6b33d03ceba60d7f001b9643bbf36953830bd3ecd82678f04664607",
                    "2d0be7079457fe9b4743813243776e30e0420b0dfb6c015cd2620ad97400a0b9",
                ),
            ),
            (
                GgmlType::Q5_1,
                concat!(
                    "f62f09c1d7dda2bb941752ad512ca56f503f0807455d840a532f30be2450a60685f64736ed35c83dde3ea38ef990f53f",
                    "422ff8bf4e8e5cefecf0591c068b17e0cd711d78ffbe2f7f843042c0c2ccd0a186f2f3811d99600f09bbe1137e2e0453",
                    "052ffcbeda103442a047b8f79102abddbf0dced73a9bffa98a2e0bbf862b4d9fe7c54f13dfcb70e80112da865cc046b5",
                    "1e3038c0bd3ecd82789f057647082d1ce717a457ff9c4743723181c243777f3803753d4f1dae346ff5850f0bb833c3eb",
                ),
            ),
            (
                GgmlType::Q8_0,
                concat!(
                    "1325000ff2d3e9ce0344e7e1191205d1ff23bce9a0bfa3f4c00e08f781e5fe06b3e80824c2cd43cdfe38dbf90704b205",
                    "569e3708d77f30b40525f42bfc2a5bd50de308b50424dbf33949accd2981e2fa502cebe9f061e5ed16f8f3b9ffe44a2a",
                    "fe2bea4300258624b714a08defcd097fd1dd0c1cf6f4281dc6fc02c40fcf370b05dff98fc01588300a238137c3390a90",
                    "5b69fbecf4b950d9fcc6d2a35bf54601cde8d701e5ea9cc578cf1923b4186597f1d28135fe05ca21d9f6b0a860db15fe",
                    "e0db2deaf50255311cd79c4441243af8212f3237e55bb5341e357159bb9a31c3ff339d811003f102cca5f6c69d1e8e26",
                    "fe10d9e6d9dd08e10e0d4fca23fdffc7ee1dfd03f52dffaae5b381eb3402d2db",
                ),
            ),
            (
                GgmlType::Q2_K,
                concat!(
                    "48b7796a9b589f9b7a6a8b696b895bff55a63d34595cb5cb6968b2ba6d60adba569fa952994bd69bb76b9c275bb719e3",
                    "645a2d222a24533b4a69e529b7794605bdd4abb986c5a965a5691d89e89583bd282e5333",
                ),
            ),
            (
                GgmlType::Q3_K,
                concat!(
                    "8974af9dbb8bddb27b2f1ca61ba9d3c6769ce8f68e95fe5d7b713c32f79b067ab8cbedeb51ab1c00714237d33c33f8f2",
                    "9613398a51bc821c00ec0427905402ab28c6be66a0ac139bf0e338e68f1328f6ed6f05201e4c0a4dc1802dd9872ed0de",
                    "fd17e0143dbc370cc238cd1378a6",
                ),
            ),
            (
                GgmlType::Q4_K,
                concat!(
                    "c51d922aada9eaf2b19da7e72925a0ff2a3bb93668a64a6f78771c7bca06aa7d45f8a2157399659b6b99d0487a4a7418",
                    "36881c0d63458bf047588e9b6767a79f37777a388844b8877d5b780b378d08ab30abf41b78510dce879657b36c853734",
                    "f562ad876c68b5768588e6c6a2642fd59ca76a7b6b7ba67ea3abfa5bcf9d94528bb4989b82c0993877480582d794626a",
                ),
            ),
            (
                GgmlType::Q5_K,
                concat!(
                    "8319822aaeabeaf4b19ea8ea2925b0ffc1fd675451429d79a1e4cd6dd3e08f0de083fee49c93ec4b2d7726a5e18d146d",
                    "5467626dd05c85cfe0ef38e7950d54ea89e0453ae522ca36d533a070f495e8306d203a1cd69b08f09eb11d38efef403f",
                    "8eff05811098621e0cb8e2187f2b02577057f837f1b20b9d1f2dae67ca0b6f58fac44b1ed8c089ed0b20dc8d53c83fba",
                    "3850d5f7d7e84ded5758f5b88f2c38a40779213714a13361ff710a05b039c4d5",
                ),
            ),
            (
                GgmlType::Q6_K,
                concat!(
                    "70d9e725bb48af109cef44b7bda6c18fcf8a683059fd00c302ee10d99f310d0a2cbf86df4fd2e40ec291d7923c306292",
                    "0af014034f37f3351175e92bfd570ed3002e713e2214877a5f2b8d2e14763fc2cc1808d37e004d16cb103796da1f718d",
                    "1da609a60ce5d0cda0b10268261d0c7acf74f71fd6b40fb99dd11bb0d9035076d251eef3869f65049a9a71699d935e78",
                    "6861946da475a9a68a456009258a249d906add92d694638b795915d84785b1f16e9768a64486aa26562a1e4e9b96406e",
                    "339fc54cb22c56afbd41bccb4aaf4d80b492",
                ),
            ),
            (
                GgmlType::Q8_K,
                concat!(
                    "07bbd13c000cf5ddeed90234ede8130e04dcff1bcbeeb6ceb8f7ce0b06f99eebfe04c4eddae029e0ff23e9fc0402d003",
                    "35c42205e74e1ed10317f91bfd1a38e608ee05d2e9f8232dcce119b2eefc311bf3f2f63ceff40efbf8d400ef2e1aff1a",
                    "f3290017ce0ebeb1f4dd0658e0e80813f9f81b14d8fd01d70ade260803e9fbb2d40ead21bc1edf1e05c43138fdf5fada",
                    "2bebfee1e8ce31fa2601e5f3ea00f1f4cae041e6d70d37c7f8e7bb1dff03e312ebfad5d034ec0bffefec19f4fa012e1b",
                    "0feaca2526fb151f2024ee3bcf221322493ad3be20d80021c0ae0a02f602dec5f9dac014fe10d9e6d9dd08e10e0d4fca",
                    "23fdffc7ee1dfd03f52dffaae5b381eb3402d2dbcbff00fec3ff5400f6ff3b007dff0cffc4ff80ff1aff3e00fc00d5fe",
                    "86ffbdfe",
                ),
            ),
        ],
    },
    QuantVector {
        x: concat!(
            "3df465443740974e35bfdee6bd37e847411c1ab13b9ba063386b8b5d3bbc14ca3d05f941bc48daa0370630e7c189af7b",
            "bbb197cbb91df54d38d95d044082b3e23477f6b9bfe0bd203ea77ea1bc51b142399d0f36b81186e7b79f5e34c1e49596",
            "b9b09da83d4ff6063d855a3f384fdd5fbba86c92b66435333e81fa3ab76e76e4baed28a8b58f37c5bfca9b31bbb05922",
            "b9a515143d8fc9b839c2a4183900665d3e965128b537fd1d3ee5d93bc0e8b568bb1d81303554ddb63d0b8ed1c0aed3b0",
            "3eb755de35e7e09a3c11a49f368862fc3bdce5853e439d35bea0e2e1b89a40db40f6a25543138356b9742223c08bd3c6",
            "b8efbe6239f2e845ba67924cbb4b61e5405e8ab8b8c00a07c0c60b30c14e5db73df1f646368f67b339f7cc00bd253fda",
            "39f60c20be8f8c3f38271b7f3e3ff6babc6586a13d8339963e1a5cae3ae74429c351488235af58e9bf8d521d400d9462",
            "3b393e5f40863445ba5c8e76baae2977426a44313c97ed693c055d16be807c273a936bd9bf48741040978ac9bebc3511",
            "bc80235c38990311b7c73f223ecfcab5353cbb4cb79618aab8d881aab678c58c3d030abc3d6d2fa23c7f3b5b3e72f6e2",
            "c07e3dd53852b0673c2cfec5b732d22f400317dbb8b5f6de3eabaa213992cbbe3c6371923a33976d3494a60d3a054454",
            "3627a6e8b9ad93d0b8956959b830e808363649efc208b1033a1afc28392e8172c025a5323bade37b3f68e9cc3938be3a",
            "43265d803e2fda453c4ddf723aae122eb8d0d629bfc345e8be1c4107bd35ab4fbd141163388d67823a7c6b6b3d778dc3",
            "b9c3b9783b90202dc0eaabfac3135f58b8b27e1a3fa74ac6bcd2dde53a80bd5f3ca8ea4e351bd89bb756ccf44121cfc5",
            "bca86742395825753baf248c3d55b3b03cb817c2bb954e073aa846c6b53c7c0c3799ac6640b64c553613c7e840513433",
            "4127bb56c2c7bebd3d873a3037ffa30441015dab357be30fb9036f5bbc1256efb7ab9d8cb6819209ba3d6ade3ea903b0",
            "b858ed4fc1a53a99c0f66ad23c091e25c21ef33e391ae0c5bc204743b4443b5dba93f35a412fa97b3bc663cbb5cc15a9",
            "354811b3c3167fe4b76eaee4bac753a93dead8a3416fc3b8b9c55a59c1c38279b5c11720be797befc269192f4014433f",
            "3cd33fa836b0378f3af84293bc3725103d34cc7bb8dae387b73bad2bb4a51f8cba69376b36ec81b538315da94280c248",
            "3b4fb29c360ff598bca736a7b7b1dcf6b898cc7fbb3ffc2a37db8ff4b72dd157b89ecb1838a95b00394b0f2235c62853",
            "bac24280bfe116c9b80838b8c01a0a21bb492a5e3c0ea002b74dfdd93fcc326dbfd13ce2432ee08fbd712fccb6d8afcd",
            "3715beacb7d7245c35f317edb61faf3c37b8c3b23ae406e2b84a36fcc0a8dc6b35e826bf3b4d8b03378c7f813cba9c89",
            "be5f1410baf67e6c3de2d05abbc9cb08",
        ),
        want: &[
            (
                GgmlType::Q4_0,
                concat!(
                    "2543888888888b88880888888883888888899ccc888888888888888888088888888888888a4e0888888888888888a888",
                    "88888888888846448888888888888888888888888708888833cd888888f88088888888888888888888883e4a88888888",
                    "886878885980888889988888b44c88808888888988b7888885888888888877cd88888888888888888888888888808888",
                ),
            ),
            (
                GgmlType::Q4_1,
                concat!(
                    "1c4125cfbbabbbbbbfbbbb0bbbbbbbb4bbbbbbbd294946c7111111111111111111f1110011111110774c8ada0ccccbcb",
                    "ccccccccfcccccccccccccccd44046d0feeeeeeeeeeeeeeeeeeeeeeeed0eeeee3b4d9bd8777777077f77777777777787",
                    "7777777764473ed6eeeeeeeeeebeceee8fe0eeeeeffeeeee2a4bb4d8bbb0bbbbbbbcbbf9bbbab6bbbbbbbbbb014a47c5",
                    "000000000000000000000001000f0000",
                ),
            ),
            (
                GgmlType::Q5_0,
                concat!(
                    "253ffff77dff00f000000500000000000006000000029cc8fffffffc0000000000000000f0000001000000018a4af7ff",
                    "feff0000000f0000000040000000000000004640ffefffdf1000000000000000000000000e00000033c9effffff70000",
                    "10e000000000000000f0000000003e46fffd9ffe0000000000d1f001a200000001200000b4487dfbffff000000000002",
                    "007d00000a000000000077c9ffdfffff00000000000000000000000000000000",
                ),
            ),
            (
                GgmlType::Q5_1,
                concat!(
                    "f23c25cffff77fff776777777f777707777777797777777afe4446c700000002211111111111111132f1121011111110",
                    "52488adafffffeff0988888788988888f888888888889888ac3c46d0ffffffdffdddeddeddddddddddddddddda0ddddd",
                    "0f499bd810000008feffef0ffffffffffffeff0fffffffff27433ed6fffdffffcccccccccc6eaccd1fc0cccccefccccc",
                    "ee46b4d8fdfbffff66606666666866f266666d6666666666d04547c500200000111111111111110011111111111f1111",
                ),
            ),
            (
                GgmlType::Q8_0,
                concat!(
                    "3333010000002b000000000000b40000001200f80100000000810000000000000100a53c0000ff0000000000000000fa",
                    "000000fb0000000000000000077f00fc00000000973e0200fcf80000000000000000000000008100ff01000300002400",
                    "0000000003004e34000000020000000000000001f1000000080001000000000000000000008100003d3dfe0001007f00",
                    "000000ff0000000000000000fa8f0001000000000008000000004b3a00000000000700040d8100000a00000000000000",
                    "00e6f600cd000000000e0000bd3c00810000000d00eb0000cf020000000000000000000000360000000000000000823d",
                    "0000000000ff00fe00000001ff7f000000000000000000fc0000000000000000",
                ),
            ),
            (
                GgmlType::Q2_K,
                concat!(
                    "1222100c11ff00220eb97633b8050a00fdedddcdeeedededededede02dedede6c2a2a2a2a2a2a2a0b2aaa2a2a222a2a2",
                    "3c0c3c3c3e3c3c3c3c302c3c3cfc3c3c8b8b8b888b878b2b838b8b8b8b8f8b8bf445fa4a",
                ),
            ),
            (
                GgmlType::Q3_K,
                concat!(
                    "ffbff9fbefffffbfffdfbffcf77ffffdfbffffefffdfdf3edffdfffffff7ffff10002c00020000000000000080000005",
                    "00000000000000001000000000000000000000000000003000002000000000000000000000080c400000000000040000",
                    "9d9c1fa79ea0bffb3581d5578bbe",
                ),
            ),
            (
                GgmlType::Q4_K,
                concat!(
                    "4e35a542c860ba878843bf0acfe7de031a1a1a1a1e1a1a1a1a1a1a041a1a1a0c1a191a1a1a1a1a102afa1a1a1a1a1a1a",
                    "ebebebeaebebebebebebebebdbebebebf0ebebebebebebebeeebebebeb0bebebd7d7d7d7dfe7d7d7e707d7d7e7d7d7d7",
                    "d7d7d7d0d7a7c7d787d7d7d7d7f7d7d70a000a0a0a0b0a080a0a060a0afa0a0a0a0a0a0a0a0a0a0e0a0a0a0a0a0a0a0a",
                ),
            ),
            (
                GgmlType::Q5_K,
                concat!(
                    "4f31a342c75eb4878942bf0acfe5db236d2d6d6d7d6d6d6d6d4d2d6c6ded6d6d696d6d6d6d6d6d6c6d6f6d6d6d656d6d",
                    "1a1a1a1a1f1a1a1a1a1a1a0b1a1a1a0d1a181a1a1a1a1a113afa1a0a1a1a1a1ad9d8d8d7d8d8d8d8d8d8d8d898d8d8d8",
                    "e0d8d8d8d8d9d8d8dfd8d8d8d808d9d8dededededeeedeeefe0ededefededededededdd0de7eaede1edededfdefedede",
                    "151015151517151215151d1515f51515151515151515150e1515151515151515",
                ),
            ),
            (
                GgmlType::Q6_K,
                concat!(
                    "900010000100000000f0000100000007000e000000100000900000000000100000000830000000000100022060000005",
                    "20000000000000000e0000010020000000100000003000b0000040000000000000000e00000000000000000200000000",
                    "000000000002000103010000030000000000000000000a0001000000f0091000aaaa968aabaaaaaaaa9aaaa02aaaaaa2",
                    "8aa9aaaaaaaaaaa8a6a2aaaaaa2aaaaaaa8aaaaaa8aaaa9aaaa29aaaaa2aaaaaaaaaa9a8aaa6a60aa2aaaaaa6aaaaaaa",
                    "f5effc5af880fdea66a6c1e7a1276bfd8aaa",
                ),
            ),
            (
                GgmlType::Q8_K,
                concat!(
                    "5eeed23f0000000006000000000000f60000000200ff0000000000ef00000000000000000000ff0000000000000000fc",
                    "000000fd0000000000000000055a00fd000000000200fcf80000000000000000000000008100ff010003000024000000",
                    "00000300000000000000000000000000fe00000001000000000000000000000000eb0000fe0001006500000000ff0000",
                    "000000000000fca7000100000000000600000000000000000003000206c30000050000000000000000f3fb00e8000000",
                    "0007000000a50000000900f10000dd0100000000000000000000002700000000000000000000000000ff00ff00000001",
                    "ff6a000000000000000000fd0000000000000000feffeefff8ff5c00f6ffabfffeffecff6300aaffd3ffddff7dff2700",
                    "6800fdff",
                ),
            ),
        ],
    },
    QuantVector {
        x: concat!(
            "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
            "0000000000000000000000000000000000000000beef805e000000000000000000000000000000000000000000000000",
            "0000000000000000be38163b000000000000000000000000000000000000000000000000000000000000000000000000",
            "000000000000000000000000000000003f5b026500000000000000000000000000000000000000000000000000000000",
            "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
            "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
            "00000000000000000000000000000000000000003f691c4f000000000000000000000000000000000000000000000000",
            "000000000000000000000000000000003fe79d953e4fb9c5000000000000000000000000000000000000000000000000",
            "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
            "00000000000000000000000000000000000000000000000000000000000000003e948c0e000000000000000000000000",
            "00000000bd601bc400000000000000000000000000000000000000000000000000000000000000000000000000000000",
            "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
            "000000000000000000000000000000003f02b3260000000000000000beeb2ac43f086f40000000000000000000000000",
            "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
            "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
            "00000000000000000000000000000000beff43990000000000000000000000000000000000000000000000003fa1f0db",
            "3f2b22ec0000000000000000000000000000000000000000000000003ea6722b00000000000000000000000000000000",
            "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
            "000000000000000000000000bf53f1e900000000000000000000000000000000be9cad7b000000000000000000000000",
            "0000000000000000000000000000000000000000bfc438bf000000000000000000000000000000000000000000000000",
            "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
            "000000003db1ba660000000000000000",
        ),
        want: &[
            (
                GgmlType::Q4_0,
                concat!(
                    "7c2b88088888888888888888588888888888d8ae888888888888888880888888888888883db388888888888888880878",
                    "888888848888a4a8888888880888888888a888888888888843ac88888888088888f8088888888888888810b188888888",
                    "88888888b888888888888808a02e8e8888888888888b8888880888888888223286888888888888888880888888888888",
                ),
            ),
            (
                GgmlType::Q4_1,
                concat!(
                    "fc277cb7ff0fffffffffffffffff9fffffffffff4d2b000000000000000000000f00000000000000b82f000000000000",
                    "00000000f020000000080000e32501ab22222222f222222222022222222222223c2c59b777777777f7777707f7777777",
                    "77777777862ffab7444444444444444404444444444444f4622ea0ba8f8888888888888c8888880888888888e92e22be",
                    "ebeeeeeeeeeeeeeeeee0eeeeeefeeeee",
                ),
            ),
            (
                GgmlType::Q5_0,
                concat!(
                    "7c27fffffdfb00000000000000000000a00000000000d8aafffeffff000000000000000000000000000000003dafffdf",
                    "fffc000000000000000000e0000000080000a4a4ffffefff0000000000000000003000000000000043a8ffffeffe0000",
                    "0000100000e0000000000000000010adffffff7f00000000000000006000000000000000a02afffffff70d0000000000",
                    "00060000000000000000222efefdffff0d000000000000000000000000100000",
                ),
            ),
            (
                GgmlType::Q5_1,
                concat!(
                    "ba237cb7fffffdffff0fffffffffffffffff3fffffffffff112700000001000000000000000000000f00000000000000",
                    "792b0000002000010000000000000000f030000000000000b22101ab0000100055555555f55555555505555555555555",
                    "192859b700001001eeeeeeeeeeeeee0efeeeeeeeeeeeeeee482bfab700000080999999999999999909999999999999f9",
                    "2e2aa0bafffffff71f111111111111181111110111111111b02a22befffdffffd7ddddddddddddddddd0ddddddfddddd",
                ),
            ),
            (
                GgmlType::Q8_0,
                concat!(
                    "8b1b0000000000000000000000000000000000810000000000000000cf0000000000e61e00000000000000007f000000",
                    "00000000000000000000000000000000000000004c230000000000000000000000000040000000000000000000007f0e",
                    "000000000000ae1800000000000000000000000000000000000000007f00000000e80000000000004c1c000000000000",
                    "00000000000000000000000000007a0000937f000000000000001a210000000000000000000000000000000000000000",
                    "00000000ce0000000000007fad1e67000000000000320000000000000000000000000000000000000081000000002e22",
                    "e700000000000000008100000000000000000000000000000000000000070000",
                ),
            ),
            (
                GgmlType::Q2_K,
                concat!(
                    "00540700070f00140048005e0887ff0100000000000000000c0000000030000043404343834343437303424343434343",
                    "a080808080808090800080808080808035353535373535343335350535b5353d3c298a2e",
                ),
            ),
            (
                GgmlType::Q3_K,
                concat!(
                    "06c6c6c6c6c6c686c446c6c6c6c2c6c6fdfcfdfde5fdfdfde9fdfcbdfd7dfddd00000000000000000000000000000000",
                    "00000000000000000040020000000000c000000000000020000000000000000000000000000000030800000000400000",
                    "006801a040f0b0eb6692e9463d23",
                ),
            ),
            (
                GgmlType::Q4_K,
                concat!(
                    "351839268fdcffcc534080c2305d34f50f0f0f0f0f0f0f0fff0f0f0f0f0f0f0f0f000f0f0f0f0f0f0f0f090f0f0f0f0f",
                    "2020202020202020202020202027202020202020e02020202e0220202020202047474747474747474747474747474747",
                    "474747474f4747400f474747474747e7bee8e8e8e8e8e8ebe808e8e8e8e8e8e8e8e8e8e8e8e8e8e8e8e8e8e0e8f8e8e8",
                ),
            ),
            (
                GgmlType::Q5_K,
                concat!(
                    "da133a2690deffcc534080c2315c22f7c1c1c1c1c1c1c1c1c341c1c1c1c1c1c1c1c0c1c1d9c1c1c1d5c1c181c1c1c1e1",
                    "0e0e0e0e0e0e0e0eee0e0e0e0e0e0e0e0e000e0e0e0e0e0e0e0e020e0e0e0e0e404040404040404040404040404f4040",
                    "40404040d04040404e034040404040409f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f900f9f9f9f9f9f9fff",
                    "7fd1d1d1d1d1d1d8d101d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d0d1f1d1d1",
                ),
            ),
            (
                GgmlType::Q6_K,
                concat!(
                    "00000000000000000000000000000000000100000000000000c004000000000000000000000000000100000000000000",
                    "0000000010000000006000000000000010000000000000100000000000000000000000000200000b0100000000000000",
                    "a000000000000000001000000000000000000000000000000c0000000000000128282828282828282028282828082828",
                    "a2a0a2a222a2a2a28292a1a2a2a2a2a240a0a0a0a0a0a090a020a0a0a0a0a0a0aaaaaaaaa8aaaaaba8aaaa8aaa2aaaa2",
                    "0022c200c08000eb00d900a4cf3b70fa3d0f",
                ),
            ),
            (
                GgmlType::Q8_K,
                concat!(
                    "757069bc00000000000000000000000000000000002100000000000000000d00000000000000000000000000c4000000",
                    "000000000000000000000000000000000000000000000000000000000000000000c00000000000000000000081f20000",
                    "000000000000000000000000000000000000000000000000ec0000000004000000000000000000000000000000000000",
                    "0000000000000000dc000020db0000000000000000000000000000000000000000000000000000000000000023000000",
                    "000000a7d1000000000000e9000000000000000000000000000000000000003a000000001500000000000000006c0000",
                    "0000000000000000000000000000000000fa000000002e00c4ff0000c0ff73ff0000f0ff0000d7ff0000caffbaff3a00",
                    "8100faff",
                ),
            ),
        ],
    },
];

const VECTORS: &[Vector] = &[
    Vector {
        ty: GgmlType::Q4_0,
        bytes: "c07bd65eda514f2809cb097c80d58852dfc0f37810f4c5347d9117a5e9edc4c1c5ca5c69",
        want: concat!(
            "c7f8000048ba000047f80000c8d9000048d900000000000047780000483a00004778000048780000c8f80000c83a0000",
            "00000000c8ba000048d90000c8f80000489b0000c83a0000489b0000c83a0000c8780000c8ba0000c8f8000048780000",
            "c8f80000c778000000000000489b000000000000c83a0000489b000048780000c89e6000c81e6000c7ed9000c81e6000",
            "4845f800c88a9400c71e6000c7ed9000471e60004845f800c81e6000c88a9400c7ed9000479e6000481e6000471e6000",
            "c88a9400488a9400481e6000c845f800c71e6000471e6000c88a9400479e6000486d9000486d9000481e6000481e6000",
            "481e6000481e6000c7ed9000c79e6000",
        ),
    },
    Vector {
        ty: GgmlType::Q4_0,
        bytes: "891387c1515adc0b25bb3a0fbbeb3e1e99db",
        want: concat!(
            "ba712000bbd2fc00bbd2fc003af120003b7120003b34d800bb34d8003b34d8003af120003bd2fc003b34d8003b34d800",
            "3bb4d8003bb4d8003a7120003b34d800000000003b712000bb34d800bb34d8003b96b400bbf12000bbb4d8003b34d800",
            "bb96b400bbf120003b34d8003bb4d800bb96b400bbd2fc003a7120003b96b400",
        ),
    },
    Vector {
        ty: GgmlType::Q4_1,
        bytes: "26a39079663a47f87885405d5b0af8c451bf01053161b9ec6b58a38970ddcac7178f086b27e20709",
        want: concat!(
            "4731ffeb4731ffdc4731ffe74731ffe34731ffe34731ffee473200004731ffd24731ffd94731ffdc4731ffe34731fff2",
            "4731fffc4731ffca4731fffc4731ffee4731ffeb4731fff54731fff24731ffca4731ffe74731ffe34731fff24731ffee",
            "4731ffee473200004731ffca4731ffd54731ffee4731ffd94732000047320000451a980043f00000c531a800448f1000",
            "c5972000456da80044e22000c3388000c338800045a05c0043f00000451a9800c3388000c55b3000c3388000448f1000",
            "c4544000c4bd300044e2200043f00000c3388000456da8004544200045442000c5825c0043f00000c5972000c4544000",
            "c55b3000458b9800c5972000c5972000",
        ),
    },
    Vector {
        ty: GgmlType::Q4_1,
        bytes: "c681d18025d4d15b07d508c7ad3e5aa54be985ab",
        want: concat!(
            "b91af000b8fd2000b825c000b9a29800b953b000b91af000b9701000b953b000b9bef800b9cd2800b9946800b91af000",
            "b9a29800b9863800b91af000b9a29800b88ba000b9bef800b9bef800b91af000b7510000b9bef800b7510000b9b0c800",
            "b9946800b8c46000b91af000b9946800b8fd2000b9cd2800b9701000b9946800",
        ),
    },
    Vector {
        ty: GgmlType::Q5_0,
        bytes: "330da285edbc37e5f455b32392f6ed3b879d530747c0d31e0597be09633cb3bd0ff69e5233b8160ecd7a566c",
        want: concat!(
            "bb3b2c003acff800bb799000bb64c400bb872e003a799000bb9194003af990003b872e00bacff8003b119400ba799000",
            "bb872e00bb3b2c00bb3b2c00000000003a799000ba2660003b9bfa003acff800bacff8003a2660003b3b2c003b9bfa00",
            "ba266000bb872e003b2660003b3b2c003acff80000000000bb7990003b7990003ca3c800bcda60003ca3c800bca3c800",
            "bbda6000bd887c00bc5a6000bdbf14003ca3c8003d5a60003d23c800bc5a60003db16e00bd23c800bd887c003da3c800",
            "bd887c003ca3c8003d9622003d962200000000003dccba00bd3f14003d087c003ca3c800bd087c00bdccba0000000000",
            "bcda6000bd75ac00bd962200bd887c00",
        ),
    },
    Vector {
        ty: GgmlType::Q5_0,
        bytes: "cc94ef9cbc2a77e18594c81249d6c6679f8d8452ad81",
        want: concat!(
            "bc065000ba998000bbbfe000bb9980003c198000bb198000bc2cb000bbe640003c3fe0003c2cb000bc8fe800bc797000",
            "bb9980003c8650003b664000ba9980003c2cb0003b198000bc198000bc2cb000bc664000ba9980003c664000bc797000",
            "3b998000bbe640003c065000bc1980003c198000bbbfe0003be640003c198000",
        ),
    },
    Vector {
        ty: GgmlType::Q5_1,
        bytes: "7592e615368c43dc1a4dc128b5ca9837e01228cf3e6d93a0584092b6b51a62aefae01a7090f64f3c88f2b9ac339bbcbc",
        want: concat!(
            "bbd31800bcaf7500bc43f200bb9f7000bc779a00bc9c1600bb9f7000bb859c003abcc000b90f0000bc8f2c00bcbc5f00",
            "bc1d3400bc104a00ba726000bc370800bc43f200bc6ab000bc036000b90f0000bbecec00bc036000bc95a100ba726000",
            "bc1d34003a2ae000bc50dc00bca90000bc5dc600bb579000bc95a100bc9c160042603b80bed2400042603b80bed24000",
            "42095b80423d7b804200ab8042719b804187b700421abb804199170042719b8042236b8041bbd70041cd370041cd3700",
            "4200ab8042817dc03fe17000416cae00419917004285d5c0422c1b8040c35c004187b7004285d5c04268eb8042603b80",
            "40c35c0042578b8041bbd7004268eb80",
        ),
    },
    Vector {
        ty: GgmlType::Q5_1,
        bytes: "010dc3b8655c71ab9b6116c0f895f14efa2d99342fd85711",
        want: concat!(
            "bf164394bf184bfcbf16a7a8bf186000bf17bfe0bf16bbacbf170bbcbf1747c8bf1797d8bf175bccbf166b9cbf16cfb0",
            "bf15f384bf17bfe0bf1693a4bf184bfcbf166b9cbf17e7e8bf184bfcbf176fd0bf15f384bf166b9cbf15f384bf180ff0",
            "bf15f384bf16f7b8bf17abdcbf16e3b4bf1837f8bf161b8cbf17fbecbf170bbc",
        ),
    },
    Vector {
        ty: GgmlType::Q8_0,
        bytes: concat!(
            "ab2da269c84e7e731178609a006b0730e9eb84f766b1c6144ea476681a4bcb939e322524f129186d0d9b78900b9c5680",
            "c890c5df119071a23aa91501edbb09e6db7765c3",
        ),
        want: concat!(
            "c10532804114c8c0c09eb40040dd0d0041328a804122f4403fc0b600412a0a0041080800c11088800000000041179e40",
            "3f1eb40040880800c0025d00bfee0e00c12fb500bf4c0c0041108880c0dfe280c0a45f003fe2b80040dd0d00c1025d00",
            "4127348041135e0040135e0040d48c80c0963380c11a73c0c10add80408db300be78ac003f29ed003ec6f0003fe1e080",
            "3e578400bfd14c803ff8ac00bfe818003e365c00bfcf3a003fb23700c004a000bf681800bfe81800bf748700bf08c500",
            "3e8cea00bfe818003fea2a80bfc2cb003f706200bfb449803eae12003c84a000be9d7e00bf8efc803e153400bed78400",
            "bf1959003ff699803fd14c80bf7cd100",
        ),
    },
    Vector {
        ty: GgmlType::Q8_0,
        bytes: "b72a7d48e63ed6332006baf93ae0f543b26245008817bea34d4bb9a0d5897696bc27",
        want: concat!(
            "40d1d6c04071bc00bfae960040502900c00d0300402b3a803fd6e0003ea12800c06b0500bebc04004042bb00bfd6e000",
            "bf13ba004060f280c082f08040a483804067a98000000000c0c972003f9a7100c05d9700c09c1ec0408142c0407bce80",
            "c06e6080c0a12800c0105e80c0c7c44040c61680c0b1f180c0644e004002f080",
        ),
    },
    Vector {
        ty: GgmlType::Q2_K,
        bytes: concat!(
            "dbea4cd6ec1427875894d773ae9f5614dcb6ded75d8df52061ebbe68888fc35fe770f1b77e4388ae3fd4b528d3d6110c",
            "6b77782961e521676379376eee7b34b70ed99604703b803e4e4ab469bb87d6f5db2276c5",
        ),
        want: concat!(
            "428dfc00428e92d2428e92d2428ede3b428e4769428e4769428e4769428dfc00428e4769428ede3b428e92d2428dfc00",
            "428dfc00428ede3b428ede3b428ede3b4299b5aa4298e80042992c8e4299b5aa4299711c4299b5aa4298e8004299711c",
            "4299b5aa4298e80042992c8e4298e8004299b5aa4299711c42992c8e4298e80041b29b3041b0091041b29b3041b00910",
            "41b29b3041b29b3041b0091041aec00041aec00041b1522041b29b3041b1522041b1522041b29b3041aec00041b29b30",
            "428e2522428dfc00428dfc00428e2522428e7766428dfc00428e4e44428e7766428e7766428e2522428e2522428e4e44",
            "428dfc00428e2522428dfc00428e776642993a444299decc42993a4442993a4442993a444298e8004299decc42998c88",
            "42998c8842998c884299decc42998c884298e8004298e8004298e80042993a4440b22d8040b3e44040b3e44040b3e440",
            "40b3e44040aec00040aec00040b22d8040b3e44040b076c040b3e44040b22d8040b076c040b076c040b076c040aec000",
            "41333fb84131bfd041333fb841333fb841303fe84131bfd041333fb8412ec00041303fe841333fb84131bfd041303fe8",
            "4131bfd04131bfd041333fb841303fe8422fdfee422f1ffa422fdfee422f7ff4422f1ffa422f1ffa422f7ff4422f7ff4",
            "422ec000422fdfee422f7ff4422ec000422fdfee422fdfee422ec000422ec00041dd022041dd022041da700041db4b60",
            "41db4b6041db4b6041db4b6041dd022041dd022041db4b6041dd022041dc26c041dc26c041dd022041da700041dd0220",
            "424505b04244ced8424505b0424498004244980042453c8842449800424505b0424505b0424505b0424498004244ced8",
            "42453c8842453c88424505b04244ced8428e5bfa428e2bfd428e5bfa428e5bfa428dfc00428e2bfd428dfc00428e2bfd",
            "428dfc00428e5bfa428e2bfd428e8bf7428e8bf7428e5bfa428e2bfd428e2bfd4219636642193a444219112242191122",
            "4218e80042193a444218e800421963664219636642193a444219112242193a4442193a44421911224219112242191122",
            "425befe8425cafdc425cafdc425befe8425befe8425befe8425befe8425befe8425befe8425cafdc425cafdc425befe8",
            "425befe8425cafdc425cafdc425cafdc42449800424565aa424565aa42449800424700fe424700fe42449800424700fe",
            "4244980042449800424700fe42463354424700fe42449800424565aa424700fe41db148841db148841db148841da7000",
            "41db148841dc5d9841da700041db148841db148841db148841da700041db148841dc5d9841db148841da700041dbb910",
            "40aec00040b3e44040b22d8040aec00040b076c040aec00040b22d8040aec00040b076c040b076c040b22d8040b076c0",
            "40b22d8040b22d8040b3e44040b3e440",
        ),
    },
    Vector {
        ty: GgmlType::Q2_K,
        bytes: concat!(
            "ee6935c22414943c297930cc2a0903fa8a0a1a3c0544ebe0aa053e6aa73a99040cd59af1e5e42544705658526fc3b954",
            "3f5584feb446ef9755cf227dff762d91f3270eadf8b15b7ea9156d3f56d15da231a481ad",
        ),
        want: concat!(
            "3f3edc003f3edc003f3edc003f9a1c003f798a003f9a1c003f042e003f9a1c003f3edc003f798a003f3edc003f3edc00",
            "3f042e003f3edc003f798a003f9a1c003f0418003ebcbe003e6298003ebcbe003ebcbe003f0418003ebcbe003f041800",
            "3f0418003e6298003f0418003e6298003d9768003d9768003ebcbe003f0418003dc110003dc110003dc110003c4b4000",
            "3e345c003e345c003dc110003e8418003dc110003e345c003c4b40003dc110003e345c003dc110003dc110003e345c00",
            "3f6f0a003f7fce003f776c003f8418003f7fce003f7fce003f7fce003f7fce003f8418003f7fce003f776c003f841800",
            "3f6f0a003f8418003f776c003f7fce003e3020003e3020003dda2000bcc880003e3020003e3020003d2800003d280000",
            "3d2800003e302000bcc880003d2800003d280000bcc880003dda20003e3020003db020003ca800003ca80000bde24000",
            "bd384000bd384000bd3840003db02000bde240003ca800003ca800003ca80000bd3840003db02000bde240003ca80000",
            "3f249c003f4624003f4624003f4624003f4624003f3560003f13d8003f13d8003f249c003f4624003f4624003f356000",
            "3f249c003f4624003f249c003f4624003e841800bea9b000be0a3000bea9b000bea9b000bea9b0003e8418003d7c0000",
            "3d7c00003d7c00003d7c00003d7c00003d7c0000bea9b000be0a30003d7c0000be8a46003cc9e0003e302000bdfb5000",
            "3e302000bdfb5000be8a4600be8a46003cc9e000be8a4600bdfb50003cc9e000be8a4600bdfb50003cc9e0003cc9e000",
            "3e23c4003e23c4003e9d54003ee8c6003f1a1c003ee8c6003e23c4003e9d54003ee8c6003ee8c6003ee8c6003e23c400",
            "3e9d54003ee8c6003ee8c6003e9d54003e8418003e8418003e8418003e8418003e8418003e8418003e8418003e841800",
            "3e8418003e8418003e8418003e8418003e8418003e8418003e8418003e8418003f8418003f55e4003ee298003ee29800",
            "3f2398003f8418003f2398003ee298003f2398003f55e4003ee298003ee298003f55e4003f8418003ee298003f841800",
            "bea36c003c0780003e302000bea36c00bea36c003e302000be1f30003c0780003c0780003e302000be1f3000bea36c00",
            "bea36c00bea36c00be1f30003c078000bee25600be96e40000000000be96e400bee25600bee25600be16e400bee25600",
            "be96e400be16e400be96e400bee25600be16e400be16e400be16e400be96e40000000000bd493000bdc93000be16e400",
            "bdc93000bd493000be16e400bdc93000bd493000be16e40000000000bd493000be16e400bd49300000000000bdc93000",
            "3f4c7e003fa51e003fa51e003f7668003f4c7e003f7668003f9029003f9029003f7668003fa51e003f9029003fa51e00",
            "3f9029003f4c7e003f9029003f766800",
        ),
    },
    Vector {
        ty: GgmlType::Q3_K,
        bytes: concat!(
            "28f044fc2830a250e44d6f824acd19a27906b88c13c6c21a969d0fed155e462077d2359c55cc999d7208edf1f2a0d12b",
            "8af65871d2ef05795938df73255b397838b35ec968b772330cc3eaf577db49180c52b1b83c012cb50008b7baff1dbadb",
            "855a26a7dbb14f88ab71a9edb306",
        ),
        want: concat!(
            "bb0caf00bb8caf00bbd30680bc0caf00bbd30680bc0caf00bbd30680bbd30680bb8caf00000000003b0caf00bbd30680",
            "bb8caf00000000003b0caf00bb0caf00baa0c8003aa0c8003b20c8003af12c00baa0c8003a20c8003af12c003af12c00",
            "3af12c0080000000baf12c00baf12c00ba20c8003a20c8003af12c003b20c8003b48fa003b85fc003b48fa003a85fc00",
            "3b48fa003a85fc00bb05fc003a85fc003b85fc003b05fc00bb48fa0080000000800000003b85fc003b85fc00bb05fc00",
            "3af12c00ba712c003af12c003b712c0080000000bb34e100ba712c00baf12c00baf12c003af12c00bb34e1003b712c00",
            "3b34e100baf12c00baf12c003af12c00ba936200bb5d13003b5d13003a936200bb5d1300bb936200bb5d1300bb5d1300",
            "3b5d1300000000003b136200ba936200ba9362003b136200bb5d1300bb1362003c4fad00bc1bc1c03c1bc1c0bc1bc1c0",
            "3c1bc1c0bbcfad003c4fad003b4fad00bb4fad00bc1bc1c0bb4fad00bc1bc1c0bbcfad00bb4fad00bc1bc1c03b4fad00",
            "3ac8fa00bac8fa00bbc8fa003b48fa003ac8fa00bac8fa00bb48fa00bb48fa00bb96bb80000000003b96bb80bac8fa00",
            "3b96bb803b48fa003b96bb80bbc8fa003ba0c800bb20c8003b20c8003b20c800bb20c800bb20c800bc20c8003b20c800",
            "bbf12c00000000003bf12c003b20c800bc20c8003b20c800bc20c800bbf12c00bb5660003b20c800bad660003a566000",
            "bb5660003b20c800bad660003b20c800bb566000ba566000bad66000bb20c800ba566000ba5660003a566000bb566000",
            "00000000bb8caf003b0caf00bc0caf0000000000bbd30680bc0caf003b0caf000000000000000000bb0caf00bb8caf00",
            "3bd306803b0caf00bb8caf00bb0caf0039d6600000000000b956600039d6600039d660003956600000000000ba566000",
            "3a20c800ba56600039d66000ba20c800ba20c800b9d66000b9d6600039d660003b48fa00bb85fc0000000000bb05fc00",
            "ba85fc00bb85fc00ba85fc00bb48fa00bb85fc00bb05fc00bb48fa003b05fc00ba85fc00ba85fc00bb05fc003b05fc00",
            "baae2e003b82a2803aae2e0000000000bb2e2e00baae2e00baae2e003b82a28000000000000000003b2e2e00baae2e00",
            "3b82a2803aae2e00bbae2e00bb82a280800000003ac8fa003a05fc003a05fc003a05fc0080000000ba85fc003a05fc00",
            "3b05fc003b05fc003a05fc00bac8fa003a05fc00ba05fc00bac8fa003ac8fa00bad660003a566000baa0c8003aa0c800",
            "baa0c800ba56600039d66000bad6600000000000b9d66000b9d660003aa0c800baa0c8003aa0c800baa0c80000000000",
            "bc20c800bbf12c003ba0c8003ba0c800bc20c8000000000000000000bba0c8000000000000000000bba0c8003ba0c800",
            "bb20c800bc20c800bba0c800bb20c800",
        ),
    },
    Vector {
        ty: GgmlType::Q3_K,
        bytes: concat!(
            "67aea5074bf0f8c971f450767dd2170f6904002747d8993fb01136c0a3b3c58bfe180be9d6923e2adcdae7162d8f2424",
            "3cb40ebe3abfd1b05758b2bd731f6677699e169e140e110fc4be58f31d83f95e5a4c6dd5511c9e3417218e944a3c0795",
            "e3da132afa98ee0fc4333a754e29",
        ),
        want: concat!(
            "c019d6004099d600c066c100bf99d600c019d6004019d6004019d600c019d600800000004019d6003f99d6004019d600",
            "bf99d6003f99d600800000008000000000000000c089ec00c009ec004009ec004009ec00bf89ec003f89ec0000000000",
            "bf89ec0000000000c009ec00c04ee200404ee200404ee2004009ec00404ee2003ebef8003e7ea000be7ea0003e7ea000",
            "3dfea000befea000bdfea000be7ea000bdfea000be7ea000bebef8003dfea000bdfea0003ebef8003dfea0003dfea000",
            "3e7ea0003f3ef8003e7ea000bf3ef800befea0003e7ea0003f7ea000800000003f3ef8003efea000800000003e7ea000",
            "80000000bf3ef8003f3ef800be7ea000bf3ef800be7ea00080000000befea0003f3ef8003f3ef8003e7ea0003efea000",
            "3f3ef800be7ea0003efea000be7ea000befea0003f7ea000befea000befea0003f7ea000c03ef800407ea000c03ef800",
            "c03ef8003f7ea000403ef800c03ef800403ef800403ef800c03ef8003f7ea0003f7ea000403ef800bffea0003f7ea000",
            "bf14880000000000c0148800bf1488003fdecc00bf9488000000000000000000bf148800bf148800bf148800c0148800",
            "00000000bf948800c014880000000000800000003da9c0003e29c0003da9c0003e29c000bda9c000bdfea000bda9c000",
            "3dfea0003dfea0003da9c0003da9c0003dfea0003e29c0003dfea000bd29c000400f3a003fbef8003fbef8003fbef800",
            "403ef800bfbef800bf3ef8003f3ef80080000000bfbef80080000000c00f3a00bf3ef800c00f3a00bf3ef8003fbef800",
            "c019d600c099d600c066c100c066c100c066c100000000004019d600000000004066c1003f99d6004019d600c099d600",
            "c019d60000000000bf99d600c066c1003fb45c00400745003f345c00bf345c00c00745004007450000000000bf345c00",
            "3f345c0040074500bfb45c000000000040074500c0345c00bfb45c00bf345c003fbef800bf3ef800bf3ef8003f3ef800",
            "c03ef800bf3ef800bf3ef8003f3ef8003f3ef800c03ef800400f3a00c00f3a003fbef800400f3a00c00f3a00c00f3a00",
            "40247200c076ab00c076ab00c076ab003fa47200000000003fa4720000000000000000004076ab003fa472004076ab00",
            "3fa4720000000000bfa47200c076ab00bf740400407404003ff4040040370300bf740400bf740400403703003f740400",
            "403703003ff4040040740400bf740400407404003f7404008000000040370300400f3a00bfbef800800000003fbef800",
            "403ef8008000000080000000800000003f3ef800bfbef800400f3a003f3ef800403ef800bfbef8003f3ef800400f3a00",
            "3ffea0003ffea0003ffea0003f29c0003ffea00080000000bfa9c0004029c000800000004029c0003fa9c000bfa9c000",
            "bf29c0008000000080000000bfa9c000",
        ),
    },
    Vector {
        ty: GgmlType::Q4_K,
        bytes: concat!(
            "9a221446a10f9648339c683a7d0951e1afe4c1c50da46aa23ed489478e490d9112b640aa14a4b8d1da9eb0f389d9b9d3",
            "e15ed3f4e01e01009247ef490fd403a3f6069570d4dc2eeb0b7f17145718c568c1320b7b03b2e6a6d61dffe40a5e65d4",
            "e5b8d170dd744db3a7f8d15f7459121f6dbb30963511edea1c8e92f793d1cbcc294d7756350077c31c2e3c6e00e1c765",
        ),
        want: concat!(
            "c397cd0ec39a2426c39ac78ac399edb0c39839fcc39a2426c398dd5fc39a9113c3980385c39a2426c39913d6c39980c2",
            "c3980385c39913d6c39839fcc39ac78ac39a9113c399b739c39afe00c398dd5fc39a2426c39a2426c3994a4cc39ac78a",
            "c398dd5fc3980385c39afe00c39a5a9cc39913d6c39913d6c39913d6c39a5a9cc32840e2c3277ad6c327dddcc327dddc",
            "c32a3000c32840e2c32906eec32840e2c3299b77c327ac59c328a3e8c32969f4c328a3e8c32969f4c32a3000c3287265",
            "c329fe7dc3280f5fc32969f4c32840e2c329fe7dc32840e2c3280f5fc327ac59c327ac59c3287265c3280f5fc3274953",
            "c328a3e8c327ac59c3280f5fc327ac59c372d762c36f275cc3724626c371fd88c3732000c36f275cc372d762c3732000",
            "c3728ec4c37123aec36edebec3709272c36edebec371fd88c3724626c3724626c3716c4cc3716c4cc371b4eac3732000",
            "c371fd88c36fb898c36f275cc3700136c3700136c36edebec37123aec371fd88c37123aec370db10c371b4eac370db10",
            "c3af8b28c3b001fcc3af985cc3af7df4c3af8b28c3b036ccc3b04400c3b04400c3afcd2cc3b00f30c3af8b28c3b00f30",
            "c3b04400c3af985cc3b04400c3afbff8c3af7df4c3b04400c3afcd2cc3afe794c3af985cc3af985cc3b02998c3af8b28",
            "c3b04400c3afe794c3b036ccc3b036ccc3b001fcc3b036ccc3afa590c3aff4c8c227dddcc2258bb8c210a874c210a874",
            "c2233994c2258bb8c21c4328c21c4328c21c4328c20c042cc2075fe4c220e770c212fa98c209b208c21e954cc220e770",
            "c21e954cc2179ee0c227dddcc22a3000c20c042cc220e770c20c042cc2233994c219f104c2179ee0c227dddcc2075fe4",
            "c220e770c2154cbcc2258bb8c2075fe4c3411b84c34226e1c3428000c341b00dc3428000c3413939c340e01ac34156ee",
            "c340fdcfc342624bc340c265c340e01ac3428000c341eb77c341cdc2c340fdcfc340e01ac3413939c340fdcfc341b00d",
            "c340fdcfc341b00dc342092cc3413939c34156eec340c265c340fdcfc341eb77c341b00dc341eb77c342624bc342624b",
            "c2f437eec2f5eba2c2ff4800c2fa2ce4c2fb06bec2fe6e26c2f437eec2f6c57cc2f511c8c2f35e14c2fd944cc2f9530a",
            "c2fcba72c2fe6e26c2f5eba2c2f511c8c2f79f56c2f437eec2f9530ac2fa2ce4c2fb06bec2ff4800c2f9530ac2fcba72",
            "c2f511c8c2f35e14c2f511c8c2f35e14c2ff4800c2fe6e26c2f9530ac2fb06bec2a78ea4c2a55d82c2a8df52c2a63df6",
            "c2a8df52c2a9bfc6c2a40cd4c2a40cd4c2a9bfc6c2a6ae30c2a63df6c2a39c9ac2a63df6c2a47d0ec2a4ed48c2a4ed48",
            "c2a94f8cc2a86f18c2a71e6ac2a7fedec2a8df52c2aa3000c2a71e6ac2a4ed48c2a9bfc6c2a94f8cc2a8df52c2a78ea4",
            "c2aa3000c2a40cd4c2a4ed48c2a78ea4",
        ),
    },
    Vector {
        ty: GgmlType::Q4_K,
        bytes: concat!(
            "f015e28838b479bb5a83fd8e7be27a829c447aee15def82fc3e917af7f4625c178d734139a40a0d2a783d57cef7e285a",
            "1d2f7c05fe03832a72099cb22d0b4aadd0b45b231f81fe9c5bed5780739a6eed40b4b1ed7540f21265f22e0451761fa3",
            "b865deb1f97421aeea963aca2875d1f33218ffe5fbaeb03367da9f74ea8b6a2a893faf973c75822a57d68b8b4f0c66cc",
        ),
        want: concat!(
            "3f7a5de83ea83bd03f50cde83f91f6f43ed1cbd03f91f6f43f273de83f9c5af43e7d57a03f3c05e83f1275e83f9c5af4",
            "3f9c5af43efb5bd03ed1cbd03dae2f403f273de83f1275e83ea83bd03e7d57a03f50cde83b7de8003b7de8003e2a37a0",
            "3f1275e83e7d57a03ed1cbd03f7a5de83f9c5af43f91f6f43f273de83f50cde83f2dc94c3e9a9a983f07314c3f8722a6",
            "3d9b4a603f7af94c3f90c8a63e1ad5303f67ad4c3f8722a63d9b4a603f41154c3f07314c3e9a9a983e1ad5303f67ad4c",
            "3f07314c3f7af94c3e6805303d9b4a603f2dc94c3e9a9a983f41154c3f7af94c3f41154c3f1a7d4c3f7af94c3f07314c",
            "3f8722a63f07314c3e1ad5303ec132983f8aa75a3f9fce5a3f8013da3ed82d683f953ada3e8391683e8391683f55d9b4",
            "3e3286d03f40b2b43f8013da3e3286d03f8aa75a3f6b00b43f55d9b43f8aa75a3c14ed003eaddf683f6b00b43e839168",
            "3f9fce5a3dbbd5a03f953ada3f8013da3f6b00b43f8aa75a3f1664b43c14ed003e8391683f55d9b43f953ada3f8aa75a",
            "3db36dc03e314ae03f19cbb83b08b8003fa479dc3b08b8003f2fb0b83e314ae03f19cbb83b08b8003f4595b83f715fb8",
            "3e314ae03b08b8003eb039703f5b7ab83f8e94dc3f715fb83edc03703e314ae03db36dc03f2fb0b83fa479dc3f4595b8",
            "3edc03703f99875c3edc03703f2fb0b83f19cbb83f4595b83f03e6b83f99875c3b609c003d89a4e03c9eb3803e57c670",
            "3daa4ce03b609c003d10a9c03d10a9c03daa4ce03d10a9c03e681a703d89a4e03c9eb3803dcaf4e03e786e703d51f9c0",
            "3e0622703daa4ce03e681a703c9eb3803e1676703d89a4e03c9eb3803e681a703e26ca703dcaf4e03e26ca703e26ca70",
            "3e0622703daa4ce03c9eb3803d51f9c03e50e4e03f0c8b383f0c8b383f3265383eb426703e50e4e03f3f03383d65f380",
            "3e9aea703f3f03383dd7e9c03be09c003e81ae703eb426703d65f3803effda703f0c8b383e9aea703f25c7383f0c8b38",
            "3f3f03383eb426703dd7e9c03effda703f3265383ee69e703e1e6ce03f1929383dd7e9c03eb426703f25c7383f3f0338",
            "3dab28e03e9e92383f12d31c3e495c703ed876383f092d1c3c0647003df858e03e8b46383ec52a383f12d31c3e22c470",
            "3ec52a383ed876383ec52a383ec52a383eb1de383f12d31c3f12d31c3e8b46383eebc2383e495c703dab28e03ec52a38",
            "3e8b46383e6ff4703ed876383ed876383f12d31c3eebc2383e6ff4703eebc2383e1d82803d624a003f3ec8a03f322aa0",
            "3f3ec8a03eff65403f0c50a03e1d82803e9a75403f258ca03ee629403eb3b1403f322aa03ecced403e9a75403dd61500",
            "3ecced403e1d82803eff65403ee629403e1d82803eb3b1403ecced403dd615003e8139403f258ca03ecced403ecced40",
            "3e4ffa803bc350003e9a75403f18eea0",
        ),
    },
    Vector {
        ty: GgmlType::Q5_K,
        bytes: concat!(
            "3f90b8da68281cb93e6f0db7dabd7b9d1ec92bd9250512beccafb42c51a0338c13899ec3dc64358b296500c9dd0f3bf5",
            "81b0e5e24bb0321827ae1ec93318408b265af6cb7b9737c2a601259852d6847a8d721c8f00f37dec0ed500eaa0949969",
            "5e6c5cd7d88ff34207ca7b69bef007129a85f1a0afd7f3e385e0a48bb0f337cc8771b12aee0dd17f825c69e3f5f437c1",
            "8aa43717cba5f63f28f10d67cfa537819f0818920437771fd9eb132655557a9b",
        ),
        want: concat!(
            "465047eb465046ac4650464246504682465045c3465046ac465047d6465047564650476b46504583465046d746504741",
            "4650466d46504756465046ac465047164650462d465045d846504781465045c3465047164650476b4650461846504682",
            "4650462d465046974650479646504602465046824650462d46504657465045d8461de202461de316461de183461de2d7",
            "461de3ab461de316461de26d461de297461de3d6461de1d8461de3eb461de301461de3c0461de3eb461de257461de356",
            "461de282461de396461de16e461de1ae461de36b461de341461de3c0461de1ae461de32c461de400461de3d6461de341",
            "461de396461de198461de202461de36b452ea944452eaf89452ead37452eac84452eac49452eab97452eacfb452ea980",
            "452ea909452eab20452eac49452ea9f6452eb000452eaf12452eade9452eaa32452eacc0452ead37452ea980452eae60",
            "452eaa6d452ea8cd452eab97452eaf89452eae60452ea9f6452ead72452eade9452ea909452eac49452eae60452eabd2",
            "4638c12a4638c1484638c1fe4638c12a4638c4004638c23a4638c32c4638c0744638c21c4638c0934638c4004638c074",
            "4638c2d14638c2f04638c2f04638c1664638c3694638c1664638c1854638c2774638c0934638c30e4638c23a4638c1a3",
            "4638c21c4638c2954638c32c4638c1664638c0cf4638c0564638c21c4638c3e2452eaa65452eaeec452eafc9452eac8d",
            "452eacc4452eae7e452eabe7452eabe7452eaeec452eb000452eabb0452eada1452eac8d452eaf5a452eab0a452ead6a",
            "452eab0a452eafc9452eac56452eadd8452ea988452ead32452eac56452eacc4452eaf92452ead6a452eae0f452eaf5a",
            "452eab79452eaf23452eab0a452eac5645b5678445b5679245b5665445b5677645b5669945b5674d45b5673145b56662",
            "45b5679245b5666245b5669945b566b545b5676845b5665445b566fa45b5675a45b5679245b5679f45b5676845b567e4",
            "45b5673f45b5672345b5667045b5679f45b566b545b566de45b567ad45b5673f45b5673145b5673145b566fa45b5667e",
            "44bc1e2d44bc1c5a44bc1eb944bc1bce44bc1dfe44bc1f1644bc1ee844bc1d4344bc1b9f44bc1fd144bc1da144bc1eb9",
            "44bc1a5844bc1f1644bc1eb944bc1fd144bc1d4344bc1e8a44bc1e8a44bc1cb744bc1c5a44bc1bce44bc1eb944bc1d43",
            "44bc1e5c44bc1b1344bc1f7444bc1bfc44bc1c2b44bc1f1644bc1e2d44bc1b134609bb414609b9934609bbb84609ba6a",
            "4609bae14609bb114609ba9a4609ba3a4609ba524609b91c4609ba824609bb714609bae14609b9934609bbb84609b9c3",
            "4609bb294609ba824609ba6a4609b9ab4609ba824609bbb84609bb594609ba6a4609baca4609bab24609bbe84609ba52",
            "4609ba0a4609bb894609bb594609b9ab",
        ),
    },
    Vector {
        ty: GgmlType::Q5_K,
        bytes: concat!(
            "bbb0329f00f94efafc1329d2ae44c982cabdd45387a293492ff07c965c5a1d163871ac7c05b3a2fa8e792879c94d9451",
            "f6f3147cf3421232750b40d280de5ab94d727d91045980407b85292f1acd1b2abdbc2eeb8448122d0eb716eb394aa060",
            "0cb80b347df00a75cf5f00fa4fa092d40df6308d32c57edbad3f254901e1316ed0f78ab188f0172c8a2d1464c88b142b",
            "54db0b0ddf7d65152f70b375e445f00c45968e40690480d247e41da735284cd3",
        ),
        want: concat!(
            "3ed7dc003ed7dc003ed7dc003ed7dc003ed7dc003ed7dc003ed7dc003ed7dc003ed7dc003ed7dc003ed7dc003ed7dc00",
            "3ed7dc003ed7dc003ed7dc003ed7dc003ed7dc003ed7dc003ed7dc003ed7dc003ed7dc003ed7dc003ed7dc003ed7dc00",
            "3ed7dc003ed7dc003ed7dc003ed7dc003ed7dc003ed7dc003ed7dc003ed7dc00c38289ddc2fc8475c104aea8c341aafa",
            "c38289ddc32863b2c30f1c6ac1c928d4c341aafa3e08b600c20648cac374398ac2868d25c374398ac227fd2ac3635f5a",
            "c20648cac26b65eac26b65eac29767553e08b600c330d0cac34a1812c32863b2c341aafac2868d25c185c014c185c014",
            "c104aea8c2c9f5e5c104aea8c185c014c1d4ee7cc266a3fec277327ec1b3d17cc22469fec18225fcc07677e0c1d4ee7c",
            "c277327ec1632ef8c234f87ec25e5cbec24dce3ec1a342fcc2034cfec2034cfec1c45ffcc18225fcc25e5cbec22469fe",
            "c26eeb3e3e938100c1a342fcc120f4f8c27f79bec1f60b7c3e938100c1a342fcc1f60b7cc2034cfec213db7ec0ffaff0",
            "c3675eefc3675eefc1882bf8c2efd17ec288ee3ec208ad7cc10728f0c31a347fc3090e9fc2bc5fdec311a18fc2efd17e",
            "c322c76fc32b5a5fc35ecbffc24d44fcc3090e9fc2bc5fdec3090e9fc322c76fc26f90bcc3007baf3e018400c345132f",
            "c36ff1dfc333ed4fc3090e9fc384d558c32b5a5fc35ecbffc29a141ec2deab9ec1d3f9d8c2347e2cc202d2acc26e70ec",
            "c06ed2c0c11f0bb0c276b82cc1b2dcd8c1d3f9d8c27eff6cc22c36ecc24d53ecc20b19ecc20b19ecc20b19ecc276b82c",
            "c202d2acc23cc56cc1a24e58c20b19ecc1813158c202d2acc16145b0c26629acc1a24e58c26e70ecc0fbdd60c223efac",
            "c1813158c1b2dcd8c223efacc25de26c3ce64000c36e44eec1b84370c275df38c1b84370c357354ec2571fb8c2c7ce5c",
            "c347d58ec312066ec30a568ec1f5c2703ce64000c2d72e1cc1b84370c2386038c35ee52ec36e44eec33875cec34f856e",
            "c275df38c36e44eec302a6aec30a568ec275df38c30a568ec302a6aec329160ec2b86e9cc275df38c0f515c0c17588e0",
            "c293a894c22245c8c2c765e4c2d62e44c25d6748c23fd688c1932710c29b0cc4c25d6748c26c2fa8c28c4464c1932710",
            "c293a894c29b0cc43dacb000c2310e28c1932710c2a270f4c24e9ee8c26c2fa8c204b508c16b2ca03dacb000c284e034",
            "c1ce4890c293a894c23fd688c2a9d524c29b0cc4c2b13954c2310e28c28c4464c31ad334c355f4b4c2ebbc883ec97800",
            "c355f4b4c3299b94c3223764c0dfee80c1663a40c3299b94c2a1d2a8c3299b94c2ce2bc8c1e96020c2dcf4283ec97800",
            "c1e96020c28441e8c330ffc4c1e96020c22fd190c2ebbc88c330ffc4c355f4b4c3136f04c2ce2bc8c0dfee80c2930a48",
            "c30c0ad4c1663a40c3136f04c2bf6368",
        ),
    },
    Vector {
        ty: GgmlType::Q6_K,
        bytes: concat!(
            "274976b1945da66df42784c2f9460062ea0a2a729463796e56948ddd50e1259fad0730f8efac07905a5b2a486f9e45bb",
            "0f0ac0d00fdc86e1bb67d1c406c5e3e031143f71bd3f7f9f8481015905b48bc3148a56d8faf7d822b0da1fa6d63e62fe",
            "7f451cdc0cb0e8381c12831476a157e84aacbb32a6cfdd660efbfb2b4b6a27d1659cab8e093b446310f45fad6c3ff03d",
            "eefda724f0410199004556fa95f3ac3c7b76192cc7fb4db765953e4e0134e19cb8e6a0c596081818ba5f463824134511",
            "822c7bc8caebb4ebe4e336521bacfbb95c6a",
        ),
        want: concat!(
            "4a615c404b0ffaf0cb09b860c8c852004a963d80cb358a504b22c2a0cb358a504b2f47c04b1c8010cafa66804aaf47c0",
            "4b0ffaf0cb09b8604b4852004aaf47c049aee200c951dc004a635900ca832980ca74d600c9e35900c974d600c88be800",
            "ca635900c9d1dc0049e3590049e35900ca0be8004a14a680ca6c1780ca14a680c992a9c04b0c8d58000000004b12a9c0",
            "4ab754304a92a9c0ca5bfea0cb438d00cb0670f0c9f470404b1ee2904b12a9c04b3d70984b375430cb24fef84b24fef8",
            "caac7f80ca90ad004a3210004a3210004a3d31004a5e94004a90ad00c83210004a69b50049c852004a26ef00c9321000",
            "49de94004a963d80ca537300ca321000c8abb4004a00c700c9963d804a615c404a76d2c0ca615c404a6c1780c980c700",
            "482bb400ca412a8049abb400ca00c700ca20f8c0ca56a100ca2bb400ca6c1780c969b500c9858c00c8058c00c8e9b500",
            "c9d0aac049d9038049d0aac04926ef0049e15c4049bff94049058c00c9f20dc04937a080c9fa6680c8058c00c9d0aac0",
            "49b53e0080000000c9353e00ca628d804a87ee804aa623804a71a80049d373004acbe5c0ca9e96404a537300c971a800",
            "4a1709004aadb0c0ca9709004a9e9640c9858c00c9858c00c9485200499e9640c9858c004848520049c85200c969b500",
            "49af47c04926ef0048485200c9e9b50080000000c9e9b500c969b50049963d80c9bd3100c8b2100047b210004a2c7f80",
            "ca215e80ca2c7f8047b21000ca2c7f8049858c0049a6ef00c7b21000c94852004974d6004a1bce0048de94004a215e80",
            "4a215e80c96687004a15d7c049386c00c96687004a1014604a0a51004a2ce54080000000ca15d7c0c9ace5404a15d7c0",
            "4a15d7c0ca2ce54049a15e8048386c004a20f8c0c9ec17804a00c7004a963d80c92bb400000000004a80c700c9abb400",
            "c92bb400ca163d804a4be5c04a56a100ca8b8240ca20f8c0ca8624a04a80c7004a22f580c9825e00caab1b60ca642480",
            "ca22f5804a7470404a53d8c049c38d004a6424804adbfea0c9a2f5804a334140c9a2f580cab34140ca12a9c0cafc9620",
            "49cbe5c049b66f40c98b824049163d80c9e15c4049cbe5c0ca0624a04a0624a0492bb400c92bb40049abb400ca10dfe0",
            "ca2bb4004a10dfe0492bb400c8abb400ca8de4c0ca058c00c9a6ef004a9e964048858c004a8de4c0494852004a69b500",
            "cae15c40494852004b015fa0cad90380ca5903804a5903804ad9038048858c00480f1600483ec80048f66d0048970900",
            "c87e6000c8d6a10046fe6000c73ec800486e7a00c67e600048bec800486e7a0048c6bb0048aee200c8a6ef00c85e9400",
            "c961c200cab76da0ca1b3560ca860b30ca0d19404a8d19404a860b304ab76da0800000004861c2004861c2004ad3a5e0",
            "4ac589c04ab76da04a4589c04a860b30",
        ),
    },
    Vector {
        ty: GgmlType::Q6_K,
        bytes: concat!(
            "0fab768aa9831e68179437b45526c9275b0703c5e67b95065a9a3e4995401547b72dcc28e092d1793a2919744b8d2d74",
            "f490f4d1f209a99c40d8f8caa1666e053ee1acc76f5582e608062deea1fe68d9dec81aab749cddc08b4559927b2e8757",
            "25dc43a06a24538b9300fccc39d1f90f7e4c16316ef7e3d307664d66c93d3387da2cb2ede25fc28b5f35242dec2cc8c9",
            "1dcfa18e4ca4d9ae8eeb45856bc90cac85ef115eaf95715c149c02fa996f2870177058cb5098342167a6f5284c401ecb",
            "bbb0f12d0cd59598321d01adfa735079503a",
        ),
        want: concat!(
            "c44c2b80448eeb40c3a3560043a35600c3f50100c4814ec0c43e8f00c4a35600c49c87c04423560044aa244044235600",
            "44b7c0c044b0f280449c87c043f50100439dd000c4b57c00444d2800c39dd00044cd280044a5b400442d9800c3bd6000",
            "c41dd000c4cd280042fc800043dcf000c4a5b400447c800044d50c0044c54400c2a5b400c3ab9f00436cb800c38e0800",
            "43bd6000c3550c0043b77500c2d50c00c399de0042a5b40042a5b400c36cb800c39fc900c3ab9f00c319de00c23d6000",
            "44318a00440e0800c4788e004416e880441fc900c3788e00439fc90044788e00440e0800438e0800c38e0800c3550c00",
            "420e080043550c0044852780443a6a80c317800042bd60004359c8004297800042bd6000c2978000c392c400c3763000",
            "c30e0800436cb80041e3400042d05000423d600041978000c33d6000c38e080043ba9d004487b800800000004429a600",
            "4418af00c36d8200436d82008000000044650680c398af004475fd80446d8200c398af00446d820044837a40c307b800",
            "c50e79a0451e4e40c47d4a00c4bdf780c51e4e404413c080c5190760c413c080448932c0451e4e40452395204503ebe0",
            "c4d3130044fd4a00c4bdf780c4f2bc4044ae6200c5003900c499de00c4855a0042a4200080000000c5055a00c438a400",
            "c3a42000c514bd0042a42000c476300043f63000c4e1ac0045055a0080000000c29dd0004427ad00c31dd000438a1600",
            "4498e180c3d8fe00c40a1600c4803900c46cb800c480390044003900440a1600c413f3004493f300c46cb800c462db00",
            "442b9f00c4094c00c3fbb600441a7580c4202e00c3e4d400c3d96300c3b71000441a758042e4d400c3202e00c42b9f00",
            "c3f04500c3cdf20043202e0044039380c10ae00041b0c000c1b71000414a000041a42000c1178000c1b7100041aa7000",
            "c1242000414a0000c17c80004117800040e340004156a00040e34000c156a0004302fc0044a3bb00c3c47a00c282fc00",
            "44935b80c3e539004454d98044ed68c044135b804423bb0043447a00c3c47a00c4cca9c0449b8b40c49b8b40c3e53900",
            "43094c00c284900041e3400041978000c1e3400042505000c2e34000411780004297800042978000430e0800c30e0800",
            "41e34000c28e0800c1e34000c3094c00c3881d00451ecc80c4aa2440c4f98a80c44c2b80c41ecc804524786044881d00",
            "44357c0043b57c0044ee32c0444c2b80c50dc8e0c52a2440c4357c00c51920a042fc800044e4d400c4dcf000c3bd6000",
            "43bd600042fc8000c42d9800c3fc8000c4b57c0000000000c486240044dcf000433d6000c33d6000c4862400c47c8000",
            "c5152ea0c48f3700c4b304c044e2c1c0c46eb10044b304c0c4d6d280c4e2c1c0c4bef400440f370044eeb100c51b2640",
            "c3bef400c49b2640c52d0d20450f3700",
        ),
    },
    Vector {
        ty: GgmlType::Q8_K,
        bytes: concat!(
            "c3bd07b3453faaaa2b0857da3b422e7ab9d03e21908aea3291a3e2d223133520110ea1a68384e2d3ae6bf2215c416808",
            "85a184ec7c927af4881f5b25bb7d38b1e33962eba2322d331af205f42b1b11bc46a759c3dfff572f2359950c0a94ec75",
            "98085079452fc132e6ae1de5d818f5ea9c5804fdc60561a3dcfb7ebc906963d1189c631b1a017f1a0685505ba316f043",
            "d297b15713eb7c281ee9e7a7ee98b378151b6dc3006c8c6a48d4acb9d8b299a94f9196c73dc25d573d72923ae19b08c2",
            "e7448cff0053aef62bc2028932bc40bddc37075721fb20b5a0e7e2b71fe60a8c224e07be18bf84ea8eda8fdef839994f",
            "c10016fb131a9c1d1d05c0a1d3b8a8a3930bddfd9d10c97f2c732918fe06cd2a1bd0e3cae4738c80356aca7f08d60a13",
            "4a479a7c",
        ),
        want: concat!(
            "b6125896b6059ecc363666fe363666feb5b666feb487bdc3b63885f535a13158b5fa45e0b60bfbb1b5c320c8b68160de",
            "3616968435cb9ca4b6037fd5b58bfbb1366d8c15367a45e0353aa4ecb5d41881366b6d1e36453fbf357e83ce35c320c8",
            "b594778db5213158b5e0d24bb587bdc3b510399fb4ed8c1536497dad363ee2da36848f5036837fd5357e83ce35bee2da",
            "362deb22b662f14234ed8c15b58bfbb1b64320c8b609dcbab65c945db487bdc33682705936497dad36837fd53529ad34",
            "b6837fd536694e27b68160de34cb9ca4367e83ceb5837fd5b64101d1b59cf36936125896b6848f50b5ed8c1536278e3d",
            "357607f1b5f1ca03b64fda933532291036475eb6b5d41881b5bee2dab5d8566fb55c945d34ed8c15b429ad3434cb9ca4",
            "b5b666feb5651039b510399f3610399fb614778d363cc3e3b63cc3e3360160de358bfbb13307bdc3b63885f5b5c75eb6",
            "b594778db63cc3e33662f142b4cb9ca4b4a9ad34366510393529ad34b67826e8365c945db487bdc3b629ad34b6805162",
            "b6125896b5c75eb636059eccb5d41881355c945d362deb22b57607f13565103935a9ad34b54b9ca434baa4ec353aa4ec",
            "36541881b63aa4ecb407bdc333cb9ca435f607f1b429ad34b64dbb9c36453fbf3598b57b3429ad34b6859ecc3610399f",
            "366d8c15b65eb354b651f98a35c75eb6b54b9ca436541881b651f98ab5651039b55c945db307bdc3b686ae47b55c945d",
            "b44b9ca436827059b629ad34b64101d136453fbfb53aa4ec3507bdc3b60e1aa835c320c8365eb35436278e3db63885f5",
            "b521315835322910b6837fd5b5a9ad34b57e83ce354320c835541881363cc3e33518b57b365c945d3623504fb67e83ce",
            "b5322910b5651039b6672f30360160de80000000b6651039367607f1b660d24bb618b57b35baa4ec3632291036169684",
            "35a9ad3436256f46365a7566363885f5b6278e3d366b6d1e3660d24b35f1ca03b60160de36037fd5b6453fbfb63885f5",
            "b60160deb671ca0336694e27b5f607f135837fd536563778b487bdc336037fd535541881b610399f367607f13307bdc3",
            "80000000b6300a19362deb2234a9ad34b5b666fe36037fd5b387bdc3367c64d7b5d418813610399fb607bdc3360e1aa8",
            "3598b57bb5e94e27b46d8c15b63885f5b58bfbb13429ad34b587bdc3361f1261364b9ca435541881357e83ce361ad472",
            "b5837fd5355c945db4a9ad34367607f1b590399fb6256f46b46d8c15360bfbb1b54b9ca43609dcba36837fd5353aa4ec",
            "3671ca0335a13158366fab0c3590399f3487bdc3b5f1ca03365a7566b6278e3d36059ecc80000000b53aa4ec3429ad34",
            "b5213158b55c945d36541881b57607f1b57607f1b429ad343607bdc336497dad35bee2da3618b57b363aa4ec36453fbf",
            "36672f30b4baa4ec3594778d33cb9ca4",
        ),
    },
    Vector {
        ty: GgmlType::F16,
        bytes: "0000008001000180ff030004003c00bc5535ff7bfffb007c00fc00024842d0c7",
        want: concat!(
            "000000008000000033800000b3800000387fc000388000003f800000bf8000003eaaa000477fe000c77fe0007f800000",
            "ff8000003800000040490000c0fa0000",
        ),
    },
    Vector {
        ty: GgmlType::BF16,
        bytes: "0000008001007f008000803f80bf7f7f7fff807f80ff4940aa3ef7c240005580",
        want: concat!(
            "000000008000000000010000007f0000008000003f800000bf8000007f7f0000ff7f00007f800000ff80000040490000",
            "3eaa0000c2f700000040000080550000",
        ),
    },
    Vector {
        ty: GgmlType::F32,
        bytes: "000000000000008001000000ffff7f7f000080ff0000803fdb0f49c000008000",
        want: "0000000080000000000000017f7fffffff8000003f800000c0490fdb00800000",
    },
];
