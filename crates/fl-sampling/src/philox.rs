//! Counter-based randomness: Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random
//! numbers: as easy as 1, 2, 3", SC 2011), the same function the kernels run.
//!
//! The sampler draws one 32-bit word per (row, step): word 0 of
//! `philox4x32_10([step, 0, request_lo, request_hi], [seed_lo, seed_hi])`. It depends only on
//! the request's seed and id and on the step, never on the row's position in the batch, so
//! a request replays the same tokens whatever else is batched with it.

use crate::SamplingParams;

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// Philox4x32 with 10 rounds on a 128-bit counter and a 64-bit key.
///
/// Matches the Random123 known-answer vectors:
/// ```
/// use fl_sampling::philox::philox4x32_10;
/// assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
/// ```
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let [mut k0, mut k1] = key;
    let mut c = counter;
    for round in 0..10 {
        if round > 0 {
            k0 = k0.wrapping_add(W0);
            k1 = k1.wrapping_add(W1);
        }
        let p0 = M0 as u64 * c[0] as u64;
        let p1 = M1 as u64 * c[2] as u64;
        c = [
            (p1 >> 32) as u32 ^ c[1] ^ k0,
            p1 as u32,
            (p0 >> 32) as u32 ^ c[3] ^ k1,
            p0 as u32,
        ];
    }
    c
}

/// The four Philox words of a row at `step` (what `fl_philox_words` writes on the device).
pub fn row_words(params: &SamplingParams, step: i32) -> [u32; 4] {
    philox4x32_10(
        [
            step as u32,
            0,
            params.request_id as u32,
            (params.request_id >> 32) as u32,
        ],
        [params.seed as u32, (params.seed >> 32) as u32],
    )
}

/// The 32-bit uniform the sampler uses for a row at `step`: `u = word / 2^32` in [0, 1).
pub fn uniform_word(params: &SamplingParams, step: i32) -> u32 {
    row_words(params, step)[0]
}
