//! Shared by the engine's GPU test binaries (`mod common;`).

use fl_kernels::testing::{rel_l2, to_f64};

/// The largest rel L2 over steps and prompts of `a` against `b` (logits per step per prompt);
/// a NaN error (a non-finite reference) is kept, so that no bound passes it.
pub fn worst(a: &[Vec<Vec<f32>>], b: &[Vec<Vec<f32>>]) -> f64 {
    assert_eq!(a.len(), b.len(), "step counts differ");
    let mut w = 0f64;
    for (sa, sb) in a.iter().zip(b) {
        assert_eq!(sa.len(), sb.len(), "prompt counts differ");
        for (pa, pb) in sa.iter().zip(sb) {
            let e = rel_l2(pa, &to_f64(pb));
            if e.is_nan() || e > w {
                w = e;
            }
        }
    }
    w
}

/// Engine tests run one at a time: a test's decode-step graph capture is invalidated when
/// another thread of the process frees memory or synchronises the device meanwhile (the
/// engine would then decode eagerly, and graph-vs-eager checks would compare eager twice).
/// A test that panicked while holding the lock leaves it usable for the others.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}
