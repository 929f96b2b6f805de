//! The prefix cache's block hash: fixed, documented, the same on every run and machine.

/// The parent hash of a sequence's first block.
pub const ROOT_HASH: u64 = 0x6a09_e667_f3bc_c908;

const K: u64 = 0x9e37_79b9_7f4a_7c15;

/// Hash of one full block: FxHash-style word mixing (`h = (h.rotl(5) ^ w) * K`, `K` the 64-bit
/// golden ratio) over the parent block's hash, the token count and every token id, finished with
/// the SplitMix64 avalanche. Chained through `parent` (use [`ROOT_HASH`] for the first block), so
/// equal hashes mean equal whole prefixes, up to a 64-bit collision, which the block manager
/// rules out by comparing the stored tokens.
pub fn block_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mix = |h: u64, w: u64| (h.rotate_left(5) ^ w).wrapping_mul(K);
    let mut h = mix(mix(0, parent), tokens.len() as u64);
    for &t in tokens {
        h = mix(h, t as u64);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}
