//! Shared by the engine's GPU test binaries (`mod common;`).

/// Engine tests run one at a time: a test's decode-step graph capture is invalidated when
/// another thread of the process frees memory or synchronises the device meanwhile (the
/// engine would then decode eagerly, and graph-vs-eager checks would compare eager twice).
/// A test that panicked while holding the lock leaves it usable for the others.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}
