//! References for [`crate::padding`](mod@crate::padding).

use crate::dtype::FloatDType;

/// The packed layout of a ragged batch, as [`crate::padding::PackedLayout`] holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offsets {
    /// `[batch + 1]`: exclusive prefix sum of the (clamped) lengths.
    pub cu_seqlens: Vec<i32>,
    /// `[total]`: padded row `b * max_len + t` of each packed row.
    pub token_map: Vec<i32>,
    /// Number of packed tokens, `cu_seqlens[batch]`.
    pub total: i32,
    /// `(sequence, length)` of every length outside `0..=max_len`, in order (clamped for
    /// the layout, as the kernel does, and reported).
    pub bad: Vec<(usize, i32)>,
}

/// The layout of sequences of `lengths` padded to `max_len`; a length outside
/// `0..=max_len` is clamped into range and listed in [`Offsets::bad`].
pub fn offsets(lengths: &[i32], max_len: usize) -> Offsets {
    let max = i32::try_from(max_len).unwrap_or(i32::MAX);
    let mut cu_seqlens = Vec::with_capacity(lengths.len() + 1);
    let mut token_map = Vec::new();
    let mut bad = Vec::new();
    let mut total = 0i32;
    cu_seqlens.push(0);
    for (b, &raw) in lengths.iter().enumerate() {
        let len = raw.clamp(0, max);
        if len != raw {
            bad.push((b, raw));
        }
        let row0 = b as i64 * max_len as i64;
        token_map.extend((0..len).map(|t| (row0 + t as i64) as i32));
        total += len;
        cu_seqlens.push(total);
    }
    Offsets {
        cu_seqlens,
        token_map,
        total,
        bad,
    }
}

/// `[batch, max_len, hidden]` -> `[total, hidden]`: the first `len_b` rows of each
/// sequence, in order (lengths clamped as in [`offsets`]). Exact copies.
/// Panics only if `padded.len() != lengths.len() * max_len * hidden` (a test bug).
pub fn remove_padding<T: FloatDType>(
    padded: &[T],
    lengths: &[i32],
    max_len: usize,
    hidden: usize,
) -> Vec<T> {
    assert_eq!(
        padded.len(),
        lengths.len() * max_len * hidden,
        "reference::padding::remove_padding: padded is not [batch, max_len, hidden]"
    );
    let o = offsets(lengths, max_len);
    let mut out = Vec::with_capacity(o.token_map.len() * hidden);
    for &r in &o.token_map {
        let r = r as usize;
        out.extend_from_slice(&padded[r * hidden..(r + 1) * hidden]);
    }
    out
}

/// `[total, hidden]` -> `[batch, max_len, hidden]`: row `t < len_b` of sequence `b` from
/// packed row `cu_seqlens[b] + t`, zeros elsewhere. Exact copies.
/// Panics only if `packed` has fewer than `total * hidden` elements (a test bug).
pub fn rebuild_padding<T: FloatDType>(
    packed: &[T],
    lengths: &[i32],
    max_len: usize,
    hidden: usize,
) -> Vec<T> {
    let o = offsets(lengths, max_len);
    assert!(
        packed.len() >= o.total as usize * hidden,
        "reference::padding::rebuild_padding: packed has fewer than total rows"
    );
    let mut out = vec![T::from_f32(0.0); lengths.len() * max_len * hidden];
    for (k, &r) in o.token_map.iter().enumerate() {
        let r = r as usize;
        out[r * hidden..(r + 1) * hidden].copy_from_slice(&packed[k * hidden..(k + 1) * hidden]);
    }
    out
}

/// The boolean mask `[batch, max_len]` (`t < len_b`) that torch code indexes with
/// (`x[mask]`); lengths clamped as in [`offsets`].
pub fn mask(lengths: &[i32], max_len: usize) -> Vec<bool> {
    lengths
        .iter()
        .flat_map(|&l| {
            let l = l.clamp(0, i32::try_from(max_len).unwrap_or(i32::MAX)) as usize;
            (0..max_len).map(move |t| t < l)
        })
        .collect()
}
