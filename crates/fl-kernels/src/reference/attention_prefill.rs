//! References for [`crate::attention_prefill`](mod@crate::attention_prefill), in f64.

/// Causal prefill attention over a packed batch, in f64.
///
/// `q`: `[total, q_heads, d]`; `k`, `v`: `[total, kv_heads, d]`; `cu_seqlens`: `[batch + 1]`
/// prefix offsets. Returns `[total, q_heads, d]`: for the query at position `i` of sequence
/// `b` (token `s = cu[b] + i`) and head `h`, the softmax over keys `j` of the same sequence
/// with `max(0, i + 1 − window) ≤ j ≤ i` (window 0 = all) of `scale · q·k`, applied to `v`,
/// with kv head `h / (q_heads / kv_heads)`. Tokens outside every sequence stay 0.
#[allow(clippy::too_many_arguments)]
pub fn prefill(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    cu_seqlens: &[usize],
    q_heads: usize,
    kv_heads: usize,
    d: usize,
    scale: f64,
    window: usize,
) -> Vec<f64> {
    packed(
        q,
        k,
        v,
        cu_seqlens,
        [q_heads, kv_heads, d],
        scale,
        Mask::Causal { window },
    )
}

/// Non-causal (bidirectional) prefill attention over a packed batch, in f64: the reference of
/// [`attention_prefill::prefill_bidirectional`](crate::attention_prefill::prefill_bidirectional).
///
/// Shapes as [`prefill`]. For the query at position `i` of sequence `b` (token `s = cu[b] + i`)
/// and head `h`, the softmax over every key `j` of the same sequence (`0 ≤ j < L_b`) of
/// `scale · q·k`, applied to `v`, with kv head `h / (q_heads / kv_heads)`. Tokens outside every
/// sequence stay 0.
#[allow(clippy::too_many_arguments)]
pub fn prefill_bidirectional(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    cu_seqlens: &[usize],
    q_heads: usize,
    kv_heads: usize,
    d: usize,
    scale: f64,
) -> Vec<f64> {
    packed(
        q,
        k,
        v,
        cu_seqlens,
        [q_heads, kv_heads, d],
        scale,
        Mask::Bidirectional,
    )
}

/// Which keys a query at position `p` sees.
#[derive(Clone, Copy)]
enum Mask {
    /// `max(0, p + 1 − window) ≤ j ≤ p` (window 0 = all earlier keys).
    Causal { window: usize },
    /// Every key.
    Bidirectional,
}

/// [`prefill`] / [`prefill_bidirectional`] with the mask given.
fn packed(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    cu_seqlens: &[usize],
    [q_heads, kv_heads, d]: [usize; 3],
    scale: f64,
    mask: Mask,
) -> Vec<f64> {
    let total = q.len() / (q_heads * d).max(1);
    let mut out = vec![0f64; total * q_heads * d];
    for w in cu_seqlens.windows(2) {
        let (s0, s1) = (w[0].min(total), w[1].min(total));
        let n = s1.saturating_sub(s0);
        let kv = s0 * kv_heads * d..s1.max(s0) * kv_heads * d;
        let rows = &q[s0 * q_heads * d..][..n * q_heads * d];
        let o = &mut out[s0 * q_heads * d..][..n * q_heads * d];
        attend_chunk(
            rows,
            &k[kv.clone()],
            &v[kv],
            0,
            [q_heads, kv_heads, d],
            scale,
            mask,
            o,
        );
    }
    out
}

/// Attention of `q_rows [n, q_heads, d]` at positions `pos0 .. pos0 + n` over the keys
/// `k_seq`, `v_seq [L, kv_heads, d]` of one sequence (masked per `mask`), into
/// `out [n, q_heads, d]` (overwritten; a row without keys gets 0).
#[allow(clippy::too_many_arguments)]
fn attend_chunk(
    q_rows: &[f64],
    k_seq: &[f64],
    v_seq: &[f64],
    pos0: usize,
    [q_heads, kv_heads, d]: [usize; 3],
    scale: f64,
    mask: Mask,
    out: &mut [f64],
) {
    let g = q_heads / kv_heads;
    let n_keys = k_seq.len() / (kv_heads * d).max(1);
    let n = q_rows.len() / (q_heads * d).max(1);
    for i in 0..n {
        let p = pos0 + i;
        let (lo, hi) = match mask {
            Mask::Causal { window } if window > 0 => {
                ((p + 1).saturating_sub(window), (p + 1).min(n_keys))
            }
            Mask::Causal { .. } => (0, (p + 1).min(n_keys)),
            Mask::Bidirectional => (0, n_keys),
        };
        for h in 0..q_heads {
            let kvh = h / g;
            let qrow = &q_rows[(i * q_heads + h) * d..][..d];
            let o = &mut out[(i * q_heads + h) * d..][..d];
            o.iter_mut().for_each(|x| *x = 0.0);
            if lo >= hi {
                continue;
            }
            let scores: Vec<f64> = (lo..hi)
                .map(|j| {
                    let krow = &k_seq[(j * kv_heads + kvh) * d..][..d];
                    scale * qrow.iter().zip(krow).map(|(a, b)| a * b).sum::<f64>()
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let wts: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let sum: f64 = wts.iter().sum();
            for (jj, wj) in wts.iter().enumerate() {
                let vrow = &v_seq[((lo + jj) * kv_heads + kvh) * d..][..d];
                for e in 0..d {
                    o[e] += wj / sum * vrow[e];
                }
            }
        }
    }
}

/// A paged KV cache for [`prefill_paged`], the layout of
/// [`attention::KvCache::Paged`](crate::attention::KvCache::Paged): `k`, `v`: `[num_blocks,
/// kv_heads, block_size, d]`; position `p` of sequence `b` is slot `p % block_size` of block
/// `block_table[b * max_blocks + p / block_size]`. A contiguous cache `[batch, kv_heads,
/// max_seq, d]` is the same with `block_size = max_seq`, `max_blocks = 1` and
/// `block_table[b] = b`.
#[derive(Debug, Clone, Copy)]
pub struct PagedKv<'a> {
    /// Keys.
    pub k: &'a [f64],
    /// Values.
    pub v: &'a [f64],
    /// Tokens per block.
    pub block_size: usize,
    /// Block ids, `[batch, max_blocks]` row-major.
    pub block_table: &'a [i32],
    /// Table entries per sequence.
    pub max_blocks: usize,
}

/// The rows of positions `0..len` of sequence `b` (kv heads `kv_heads`, head size `d`)
/// gathered from `cache` (`x` is `cache.k` or `cache.v`) into `[len, kv_heads, d]`.
/// Panics on a block id or position outside the cache (a test bug).
pub fn gather_paged(
    x: &[f64],
    cache: &PagedKv<'_>,
    b: usize,
    len: usize,
    kv_heads: usize,
    d: usize,
) -> Vec<f64> {
    let bs = cache.block_size;
    let mut out = Vec::with_capacity(len * kv_heads * d);
    for p in 0..len {
        let blk = cache.block_table[b * cache.max_blocks + p / bs];
        let blk = usize::try_from(blk).expect("block id >= 0");
        for h in 0..kv_heads {
            out.extend_from_slice(&x[((blk * kv_heads + h) * bs + p % bs) * d..][..d]);
        }
    }
    out
}

/// Reference of [`attention_prefill::prefill_paged`](crate::attention_prefill::prefill_paged),
/// in f64: the K/V of positions `0..ctx_lens[b]` of each sequence gathered through the block
/// table ([`gather_paged`]), then the causal attention of its new tokens, rows
/// `cu_seqlens_q[b]..cu_seqlens_q[b + 1]` of `q [total_q, q_heads, d]` at positions
/// `ctx_b − q_b ..ctx_b` (window 0 = all), as [`prefill`] computes it for those rows of the
/// whole sequence. Returns `[total_q, q_heads, d]`; rows outside every sequence stay 0.
/// Requires `q_b ≤ ctx_b` (panics otherwise: a test bug).
#[allow(clippy::too_many_arguments)]
pub fn prefill_paged(
    q: &[f64],
    cache: &PagedKv<'_>,
    cu_seqlens_q: &[usize],
    ctx_lens: &[usize],
    q_heads: usize,
    kv_heads: usize,
    d: usize,
    scale: f64,
    window: usize,
) -> Vec<f64> {
    let total = q.len() / (q_heads * d).max(1);
    let mut out = vec![0f64; total * q_heads * d];
    for (b, w) in cu_seqlens_q.windows(2).enumerate() {
        let (s0, s1) = (w[0].min(total), w[1].min(total));
        let n = s1.saturating_sub(s0);
        let ctx = ctx_lens[b];
        assert!(
            n <= ctx,
            "sequence {b}: {n} new tokens over a context of {ctx}"
        );
        let k_seq = gather_paged(cache.k, cache, b, ctx, kv_heads, d);
        let v_seq = gather_paged(cache.v, cache, b, ctx, kv_heads, d);
        let rows = &q[s0 * q_heads * d..][..n * q_heads * d];
        let o = &mut out[s0 * q_heads * d..][..n * q_heads * d];
        attend_chunk(
            rows,
            &k_seq,
            &v_seq,
            ctx - n,
            [q_heads, kv_heads, d],
            scale,
            Mask::Causal { window },
            o,
        );
    }
    out
}
