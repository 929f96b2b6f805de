//! References for [`crate::embedding`](mod@crate::embedding).
