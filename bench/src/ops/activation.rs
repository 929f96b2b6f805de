//! Table cases for `fl_kernels::activation` (torch side: `torch_activation.py`).

use super::Case;

/// The cases of this family.
pub fn cases() -> Vec<Case> {
    Vec::new()
}
