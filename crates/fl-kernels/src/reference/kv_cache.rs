//! References for [`crate::kv_cache`](mod@crate::kv_cache).
