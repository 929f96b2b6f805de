//! CPU tests of the f64 reference GEMM (run in CI, no GPU needed).

use fl_blas::reference::{gemm, RefGemm};
use proptest::prelude::*;

#[test]
fn hand_computed_2x3x2_with_bias_and_beta() {
    // A[2,2], B[3,2] (nn.Linear weight, out = 3, in = 2)
    let a = [1.0f32, 2.0, 3.0, 4.0];
    let b = [1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0];
    let bias = [10.0f32, 20.0, 30.0];
    let c0 = [1.0f32, 1.0, 1.0, 2.0, 2.0, 2.0];
    // A·Bᵀ = [[1, 2, 3], [3, 4, 7]]
    let g = RefGemm {
        alpha: 2.0,
        beta: 0.5,
        ..RefGemm::new(2, 3, 2)
    };
    let got = gemm(&g, &a, &b, Some(&bias), Some(&c0));
    let want = [
        2.0 + 10.0 + 0.5,
        4.0 + 20.0 + 0.5,
        6.0 + 30.0 + 0.5,
        6.0 + 10.0 + 1.0,
        8.0 + 20.0 + 1.0,
        14.0 + 30.0 + 1.0,
    ];
    assert_eq!(got, want);
}

#[test]
fn beta_zero_does_not_read_c0() {
    let g = RefGemm::new(1, 1, 1);
    let got = gemm(&g, &[3.0f32], &[4.0f32], None, Some(&[f32::NAN]));
    assert_eq!(got, vec![12.0]);
}

#[test]
fn shared_b_and_batched() {
    // batch 2, m 1, n 2, k 2; shared B = identity
    let a = [1.0f32, 2.0, 3.0, 4.0];
    let b = [1.0f32, 0.0, 0.0, 1.0];
    let g = RefGemm {
        batch: 2,
        shared_b: true,
        ..RefGemm::new(1, 2, 2)
    };
    assert_eq!(gemm(&g, &a, &b, None, None), vec![1.0, 2.0, 3.0, 4.0]);
    // per-batch B: second is the swap matrix
    let b2 = [1.0f32, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0];
    let g = RefGemm {
        shared_b: false,
        ..g
    };
    assert_eq!(gemm(&g, &a, &b2, None, None), vec![1.0, 2.0, 4.0, 3.0]);
}

fn small_ints(n: usize) -> impl Strategy<Value = Vec<f32>> {
    // Small integers: every f64 sum is exact, so the properties hold bit for bit.
    proptest::collection::vec((-8i32..=8).prop_map(|v| v as f32), n)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// (A·Bᵀ)ᵀ = B·Aᵀ: swapping the operands transposes the result.
    #[test]
    fn swapping_operands_transposes(
        (m, n, k, a, b) in (1usize..9, 1usize..9, 1usize..9)
            .prop_flat_map(|(m, n, k)| (Just(m), Just(n), Just(k), small_ints(m * k), small_ints(n * k)))
    ) {
        let c = gemm(&RefGemm::new(m, n, k), &a, &b, None, None);
        let ct = gemm(&RefGemm::new(n, m, k), &b, &a, None, None);
        for i in 0..m {
            for j in 0..n {
                prop_assert_eq!(c[i * n + j], ct[j * m + i]);
            }
        }
    }

    /// alpha scales, bias adds a row, beta adds the old C: each matches a separate product.
    #[test]
    fn epilogue_terms_are_additive(
        (m, n, k, a, b, bias, c0) in (1usize..7, 1usize..7, 1usize..7)
            .prop_flat_map(|(m, n, k)| (Just(m), Just(n), Just(k), small_ints(m * k),
                                        small_ints(n * k), small_ints(n), small_ints(m * n))),
        alpha in -3i32..=3,
        beta in -3i32..=3,
    ) {
        let plain = gemm(&RefGemm::new(m, n, k), &a, &b, None, None);
        let g = RefGemm { alpha: alpha as f64, beta: beta as f64, ..RefGemm::new(m, n, k) };
        let full = gemm(&g, &a, &b, Some(&bias), Some(&c0));
        for i in 0..m {
            for (j, &bj) in bias.iter().enumerate() {
                let idx = i * n + j;
                let want = alpha as f64 * plain[idx] + bj as f64 + beta as f64 * c0[idx] as f64;
                prop_assert_eq!(full[idx], want);
            }
        }
    }

    /// A shared B equals the same B repeated for every batch entry, and each batch entry
    /// equals a plain product on its own slice.
    #[test]
    fn batches_are_independent_products(
        (batch, m, n, k, a, b) in (1usize..4, 1usize..6, 1usize..6, 1usize..6)
            .prop_flat_map(|(bt, m, n, k)| (Just(bt), Just(m), Just(n), Just(k),
                                            small_ints(bt * m * k), small_ints(n * k)))
    ) {
        let shared = RefGemm { batch, shared_b: true, ..RefGemm::new(m, n, k) };
        let repeated: Vec<f32> = (0..batch).flat_map(|_| b.iter().copied()).collect();
        let per = RefGemm { shared_b: false, ..shared };
        let c_shared = gemm(&shared, &a, &b, None, None);
        prop_assert_eq!(&c_shared, &gemm(&per, &a, &repeated, None, None));
        for bt in 0..batch {
            let one = gemm(&RefGemm::new(m, n, k), &a[bt * m * k..(bt + 1) * m * k], &b, None, None);
            prop_assert_eq!(&c_shared[bt * m * n..(bt + 1) * m * n], &one[..]);
        }
    }
}
