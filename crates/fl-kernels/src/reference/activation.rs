//! References for [`crate::activation`](mod@crate::activation).
