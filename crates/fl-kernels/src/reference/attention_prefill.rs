//! Placeholder: CPU references of the attention_prefill family.
