//! Table cases for `fl_kernels::norm` (torch side: `torch_norm.py`).

use super::Case;

/// The cases of this family.
pub fn cases() -> Vec<Case> {
    Vec::new()
}
