//! Placeholder: the gemv family is being written on its own branch.
