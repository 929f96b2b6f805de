//! References for [`crate::norm`](mod@crate::norm).
