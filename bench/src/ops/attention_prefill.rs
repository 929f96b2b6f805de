//! Op-table cases of the attention_prefill family (placeholder).
use super::Case;

/// The cases of this family.
pub fn cases() -> Vec<Case> {
    Vec::new()
}
