//! References for [`crate::embedding`](mod@crate::embedding).

use crate::dtype::FloatDType;

/// The result of a reference lookup: the output rows and the bad tokens found.
#[derive(Clone, Debug, PartialEq)]
pub struct Lookup<T> {
    /// `[n, hidden]` row-major: `table[ids[i]]`, or zeros where `ids[i]` is out of range.
    pub out: Vec<T>,
    /// `(position, id)` of every id outside `[0, vocab)`, in position order.
    pub bad: Vec<(usize, i32)>,
}

/// `out[i, :] = table[ids[i], :]` for a row-major `table` of `vocab = table.len() / hidden`
/// rows; an id outside `[0, vocab)` gives a zero row and is listed in [`Lookup::bad`]
/// (what the kernel writes and records). Exact copies: no rounding.
/// Panics only if `hidden` is 0 or does not divide `table.len()` (a test bug).
pub fn lookup<T: FloatDType>(ids: &[i32], table: &[T], hidden: usize) -> Lookup<T> {
    assert!(
        hidden > 0 && table.len() % hidden == 0,
        "reference::embedding::lookup: table is not [vocab, hidden]"
    );
    let vocab = table.len() / hidden;
    let mut out = Vec::with_capacity(ids.len() * hidden);
    let mut bad = Vec::new();
    for (i, &id) in ids.iter().enumerate() {
        match usize::try_from(id).ok().filter(|&r| r < vocab) {
            Some(r) => out.extend_from_slice(&table[r * hidden..(r + 1) * hidden]),
            None => {
                out.extend(std::iter::repeat_n(T::from_f32(0.0), hidden));
                bad.push((i, id));
            }
        }
    }
    Lookup { out, bad }
}
