//! Table cases for `fl_kernels::kv_cache` (torch side: `torch_kv_cache.py`).

use super::Case;

/// The cases of this family.
pub fn cases() -> Vec<Case> {
    Vec::new()
}
