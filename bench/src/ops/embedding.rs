//! Table cases for `fl_kernels::embedding` (torch side: `torch_embedding.py`).

use super::Case;

/// The cases of this family.
pub fn cases() -> Vec<Case> {
    Vec::new()
}
