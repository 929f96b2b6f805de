//! Placeholder: CPU references of the gemv family.
