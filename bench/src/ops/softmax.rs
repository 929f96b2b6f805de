//! Table cases for `fl_kernels::softmax` (torch side: `torch_softmax.py`).

use super::Case;

/// The cases of this family.
pub fn cases() -> Vec<Case> {
    Vec::new()
}
