//! References for [`crate::padding`](mod@crate::padding).
