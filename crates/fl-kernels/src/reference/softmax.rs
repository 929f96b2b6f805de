//! References for [`crate::softmax`](mod@crate::softmax).
