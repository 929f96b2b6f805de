//! # The paged KV cache's bookkeeping (CPU side)
//!
//! The GPU holds one pool of `num_blocks` KV blocks of `block_size` token slots each (every
//! layer's K and V for those tokens). This module decides which block holds which token of which
//! sequence; it never touches device memory. What the GPU must do follows from its answers: the
//! block tables it hands out, and the [`CowCopy`] operations it returns.
//!
//! ```text
//!   sequence 7: tokens 0..40, block_size 16       pool (refcount, prefix-cache hash)
//!   block table [3, 9, 4]                  ──►   3: rc 2, hash h(root, t[0..16])
//!      ├ tokens  0..16 -> block 3 ◄─ shared ──┐   9: rc 1, hash h(h3, t[16..32])
//!      ├ tokens 16..32 -> block 9            │   4: rc 1, partial (8 of 16 slots)
//!      └ tokens 32..40 -> block 4            │   free list (refcount 0, no hash)
//!   sequence 8 (same system prompt)          │   LRU list  (refcount 0, hash kept:
//!   block table [3, 12]  ────────────────────┘             reusable until evicted)
//! ```
//!
//! - **Blocks and tables.** [`BlockManager`] owns the pool. Each sequence has a block table
//!   (`Vec<u32>` of block ids): token `p` lives in slot `p % block_size` of block
//!   `table[p / block_size]`.
//! - **Reference counts.** A block's count is the number of block tables that name it;
//!   [`BlockManager::fork`] copies a table and increments every count (beams, `n > 1`).
//! - **Copy-on-write.** Full blocks are never written again, so sharing them is free. Appending
//!   into a *partial* last block that another table shares first moves the appending sequence to
//!   a fresh block and returns a [`CowCopy`] (`src`, `dst`, `n_tokens`) that the runner executes
//!   on the GPU before the step's KV writes.
//! - **Prefix cache** (after vLLM v1 and SGLang). A full, computed block is registered under a
//!   chained hash of (parent block's hash, the block's token ids) ([`block_hash`], fixed and
//!   deterministic across runs); a new prompt looks its full blocks up in order and reuses the
//!   hits. The hit is capped at `prompt_len - 1` tokens, rounded down to whole blocks, so the last
//!   prompt token is always computed (its logits give the first new token). A registered block
//!   whose count drops to 0 keeps its hash on an LRU list; it is revived by a hit, and evicted
//!   (hash removed) only when a fresh block is needed and no never-cached free block is left.
//!   The stored token ids are compared on every hit, so a 64-bit hash collision cannot hand out
//!   the wrong KV.
//! - **Sizing.** [`bytes_per_block`] and [`blocks_for_memory`] turn the free device memory into
//!   `num_blocks` (the runner measures memory; `--kv-memory` is the fraction).
//!
//! Nothing here panics on bad input: every method returns a [`KvError`] naming what was wrong.

mod block_manager;
mod hash;
#[cfg(test)]
mod tests;

pub use block_manager::{Allocation, BlockManager, CowCopy, KvStats};
pub use hash::{block_hash, ROOT_HASH};

/// A block's index in the pool.
pub type BlockId = u32;

/// A sequence's id as the block manager knows it (the scheduler uses the request id).
pub type SeqId = u64;

/// What the block manager refuses, naming the argument or sequence at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// No sequence with this id holds blocks.
    #[error("seq {0}: unknown sequence id")]
    UnknownSequence(SeqId),
    /// A sequence with this id already holds blocks.
    #[error("seq {0}: sequence id already in use")]
    SequenceExists(SeqId),
    /// The pool has too few free blocks; nothing was changed.
    #[error("kv cache: {needed} blocks needed, {free} free")]
    NoSpace {
        /// Blocks the operation needs.
        needed: usize,
        /// Blocks free (never-cached plus evictable cached ones).
        free: usize,
    },
    /// An argument is out of its range.
    #[error("{arg}: {reason}")]
    Invalid {
        /// The argument at fault.
        arg: &'static str,
        /// Why.
        reason: String,
    },
}

fn invalid(arg: &'static str, reason: impl Into<String>) -> KvError {
    KvError::Invalid {
        arg,
        reason: reason.into(),
    }
}

/// Bytes one block takes on the device: K and V, for every layer, `block_size` tokens of
/// `kv_heads * head_dim` elements of `dtype_bytes` each. Saturates at `u64::MAX` instead of
/// overflowing.
pub fn bytes_per_block(
    layers: u64,
    kv_heads: u64,
    head_dim: u64,
    dtype_bytes: u64,
    block_size: u64,
) -> u64 {
    [layers, kv_heads, head_dim, dtype_bytes, block_size]
        .iter()
        .fold(2u64, |acc, &x| acc.saturating_mul(x))
}

/// How many blocks of `bytes_per_block` bytes fit in `fraction` of `bytes_free` (rounded
/// down). `fraction` must be in `(0, 1]` and `bytes_per_block` non-zero; the result is capped at
/// `u32::MAX` (block ids are `u32`).
pub fn blocks_for_memory(
    bytes_free: u64,
    fraction: f64,
    bytes_per_block: u64,
) -> Result<u32, KvError> {
    if !(fraction > 0.0 && fraction <= 1.0) {
        return Err(invalid("fraction", format!("{fraction} is not in (0, 1]")));
    }
    if bytes_per_block == 0 {
        return Err(invalid("bytes_per_block", "must be > 0"));
    }
    let budget = (bytes_free as f64 * fraction).floor() as u64;
    Ok((budget / bytes_per_block).min(u32::MAX as u64) as u32)
}

/// Blocks needed to hold `num_tokens` tokens (`ceil(num_tokens / block_size)`; 0 for a zero
/// `block_size`).
pub fn blocks_needed(num_tokens: usize, block_size: usize) -> usize {
    if block_size == 0 {
        0
    } else {
        num_tokens.div_ceil(block_size)
    }
}
