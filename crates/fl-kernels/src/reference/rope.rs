//! References for [`crate::rope`](mod@crate::rope).
