//! Table cases for `fl_kernels::rope` (torch side: `torch_rope.py`).

use super::Case;

/// The cases of this family.
pub fn cases() -> Vec<Case> {
    Vec::new()
}
