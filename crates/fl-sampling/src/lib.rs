//! # fl-sampling: logits processors and samplers on the GPU
//!
//! Planned scope (issue 5, not built yet): greedy, temperature, top-k, top-p, min-p,
//! penalties, seeded Philox randomness and finished-flag bookkeeping.
//!
//! Today the crate only re-exports the shared types so that the layering is in place.

pub use fl_kernels::{DeviceTensor, Error, Gpu, Result};
