//! Table cases for `fl_kernels::padding` (torch side: `torch_padding.py`).

use super::Case;

/// The cases of this family.
pub fn cases() -> Vec<Case> {
    Vec::new()
}
