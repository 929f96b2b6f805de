//! Placeholder: CPU references of the quant family.
