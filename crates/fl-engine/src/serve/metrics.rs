//! `/metrics`: counters and histograms in the Prometheus text format (0.0.4), written by
//! hand. Names follow vLLM's (`fl_` instead of `vllm:`), so its dashboards map over.
//!
//! ```
//! use std::time::Duration;
//! use fl_engine::serve::metrics::Metrics;
//! let m = Metrics::default();
//! m.ttft.observe(Duration::from_millis(30));
//! let text = m.render(None);
//! assert!(text.contains("fl_time_to_first_token_seconds_bucket{le=\"0.04\"} 1\n"));
//! ```

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::service::{ServiceStats, StepTimes, STEP_SECONDS_BUCKETS};

/// Bucket bounds (seconds) of the time to first token.
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0,
];
/// Bucket bounds (seconds) of the time between two tokens of a request.
const ITL_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
    0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
];
/// Bucket bounds (seconds) of a request's whole time.
const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0,
];

/// A Prometheus histogram of durations, updated without locks.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Per bucket (not cumulative); the last one is `+Inf`.
    counts: Vec<AtomicU64>,
    sum_ns: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }

    /// Records one duration.
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = self.bounds.partition_point(|&b| b < s);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        header(out, name, help, "histogram");
        let counts = self.counts.iter().map(load);
        series(out, name, "", self.bounds, counts, load(&self.sum_ns));
    }
}

/// One histogram series: cumulative `_bucket` lines over `bounds` (then `+Inf`) from
/// per-bucket `counts`, `_sum` (from nanoseconds) and `_count`; `label` (`key="value",` or
/// empty) goes before each `le`.
fn series(
    out: &mut String,
    name: &str,
    label: &str,
    bounds: &[f64],
    counts: impl Iterator<Item = u64>,
    sum_ns: u64,
) {
    let mut cum = 0;
    for (i, c) in counts.enumerate() {
        cum += c;
        match bounds.get(i) {
            Some(b) => {
                let _ = writeln!(out, "{name}_bucket{{{label}le=\"{b}\"}} {cum}");
            }
            None => {
                let _ = writeln!(out, "{name}_bucket{{{label}le=\"+Inf\"}} {cum}");
            }
        }
    }
    let sel = label.trim_end_matches(',');
    let sel = if sel.is_empty() {
        String::new()
    } else {
        format!("{{{sel}}}")
    };
    let _ = writeln!(out, "{name}_sum{sel} {}", sum_ns as f64 * 1e-9);
    let _ = writeln!(out, "{name}_count{sel} {cum}");
}

/// A counter per finish reason.
#[derive(Debug, Default)]
pub struct ByReason {
    /// `stop`: an end id, a stop id or a stop string.
    pub stop: AtomicU64,
    /// `length`: `max_tokens` or the context.
    pub length: AtomicU64,
}

/// A counter per reason a request got no normal finish.
#[derive(Debug, Default)]
pub struct Failures {
    /// Refused with a 4xx before it ran (validation, auth, unknown model).
    pub invalid: AtomicU64,
    /// Refused with 503: the queue was full or the model still loading.
    pub overloaded: AtomicU64,
    /// Ended by an engine error or a shutdown.
    pub error: AtomicU64,
    /// The client went away before the end.
    pub disconnected: AtomicU64,
}

/// The server's counters. Engine gauges (queues, KV) come from [`ServiceStats`] at render.
#[derive(Debug)]
pub struct Metrics {
    /// Prompt tokens of requests that ran.
    pub prompt_tokens: AtomicU64,
    /// Tokens generated.
    pub generation_tokens: AtomicU64,
    /// Requests finished normally.
    pub success: ByReason,
    /// Requests that did not.
    pub failures: Failures,
    /// From the request's arrival to its first token.
    pub ttft: Histogram,
    /// Between consecutive tokens of a request.
    pub itl: Histogram,
    /// From arrival to the last token.
    pub e2e: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            success: ByReason::default(),
            failures: Failures::default(),
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(E2E_BUCKETS),
        }
    }
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, help: &str, kind: &str, value: impl std::fmt::Display) {
    header(out, name, help, kind);
    let _ = writeln!(out, "{name} {value}");
}

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// The engine's step times as one histogram with a `kind` label per [`StepTimes`].
fn render_steps(out: &mut String, kinds: [(&str, &StepTimes); 2]) {
    let name = "fl_step_duration_seconds";
    header(
        out,
        name,
        "Engine step time, by kind: decode (decode tokens only) or prefill (prompt tokens, \
         decodes beside them or not).",
        "histogram",
    );
    for (kind, t) in kinds {
        let label = format!("kind=\"{kind}\",");
        let counts = t.buckets.iter().copied();
        series(out, name, &label, &STEP_SECONDS_BUCKETS, counts, t.sum_ns);
    }
}

impl Metrics {
    /// The exposition text; `stats` is the engine's snapshot (`None` while loading: its
    /// gauges read 0).
    pub fn render(&self, stats: Option<ServiceStats>) -> String {
        let s = stats.unwrap_or_default();
        let kv = s.backend.kv;
        let usage = if kv.total_blocks == 0 {
            0.0
        } else {
            kv.used_blocks as f64 / kv.total_blocks as f64
        };
        let mut o = String::with_capacity(8192);
        let out = &mut o;
        sample(
            out,
            "fl_num_requests_running",
            "Requests holding KV blocks.",
            "gauge",
            s.backend.running,
        );
        sample(
            out,
            "fl_num_requests_waiting",
            "Requests waiting to be scheduled (new or preempted).",
            "gauge",
            s.backend.waiting,
        );
        sample(
            out,
            "fl_kv_cache_usage_perc",
            "Fraction of the KV blocks in use (1 = full).",
            "gauge",
            usage,
        );
        sample(
            out,
            "fl_kv_cache_blocks",
            "KV blocks in the pool.",
            "gauge",
            kv.total_blocks,
        );
        sample(
            out,
            "fl_num_preemptions_total",
            "Preemptions (a running request's blocks freed to make room).",
            "counter",
            s.backend.preemptions,
        );
        sample(
            out,
            "fl_prompt_tokens_total",
            "Prompt tokens of requests that ran.",
            "counter",
            load(&self.prompt_tokens),
        );
        sample(
            out,
            "fl_generation_tokens_total",
            "Tokens generated.",
            "counter",
            load(&self.generation_tokens),
        );
        sample(
            out,
            "fl_prefix_cache_queries_total",
            "Prompt tokens looked up in the prefix cache.",
            "counter",
            kv.prefix_query_tokens,
        );
        sample(
            out,
            "fl_prefix_cache_hits_total",
            "Prompt tokens found in the prefix cache.",
            "counter",
            kv.prefix_hit_tokens,
        );
        sample(
            out,
            "fl_engine_steps_total",
            "Engine steps run.",
            "counter",
            s.steps,
        );
        header(
            out,
            "fl_request_success_total",
            "Requests finished, by finish reason.",
            "counter",
        );
        let _ = writeln!(
            out,
            "fl_request_success_total{{finished_reason=\"stop\"}} {}",
            load(&self.success.stop)
        );
        let _ = writeln!(
            out,
            "fl_request_success_total{{finished_reason=\"length\"}} {}",
            load(&self.success.length)
        );
        header(
            out,
            "fl_request_failure_total",
            "Requests without a normal finish, by reason.",
            "counter",
        );
        let f = &self.failures;
        for (reason, v) in [
            ("invalid", &f.invalid),
            ("overloaded", &f.overloaded),
            ("error", &f.error),
            ("disconnected", &f.disconnected),
        ] {
            let _ = writeln!(
                out,
                "fl_request_failure_total{{reason=\"{reason}\"}} {}",
                load(v)
            );
        }
        self.ttft.render(
            out,
            "fl_time_to_first_token_seconds",
            "Time from a request's arrival to its first token.",
        );
        self.itl.render(
            out,
            "fl_inter_token_latency_seconds",
            "Time between two consecutive tokens of a request.",
        );
        self.e2e.render(
            out,
            "fl_e2e_request_latency_seconds",
            "Time from a request's arrival to its last token.",
        );
        render_steps(
            out,
            [("decode", &s.decode_steps), ("prefill", &s.prefill_steps)],
        );
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_le_inclusive() {
        let m = Metrics::default();
        for ms in [1, 3, 3, 100_000, 1_000_000] {
            m.ttft.observe(Duration::from_millis(ms));
        }
        let text = m.render(None);
        let line = |prefix: &str| {
            text.lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
                .rsplit(' ')
                .next()
                .unwrap()
                .to_string()
        };
        assert_eq!(
            line("fl_time_to_first_token_seconds_bucket{le=\"0.001\"}"),
            "1"
        );
        assert_eq!(
            line("fl_time_to_first_token_seconds_bucket{le=\"0.005\"}"),
            "3"
        );
        assert_eq!(
            line("fl_time_to_first_token_seconds_bucket{le=\"160\"}"),
            "4"
        );
        assert_eq!(
            line("fl_time_to_first_token_seconds_bucket{le=\"+Inf\"}"),
            "5"
        );
        assert_eq!(line("fl_time_to_first_token_seconds_count"), "5");
        let sum: f64 = line("fl_time_to_first_token_seconds_sum").parse().unwrap();
        assert!((sum - 1100.007).abs() < 1e-6, "{sum}");
        assert_eq!(m.ttft.count(), 5);
    }

    #[test]
    fn step_times_render_per_kind_cumulative() {
        let mut st = ServiceStats::default();
        for ms in [4, 12, 12, 2_000] {
            st.decode_steps.observe(Duration::from_millis(ms));
        }
        st.prefill_steps.observe(Duration::from_millis(40));
        let text = Metrics::default().render(Some(st));
        let value = |prefix: &str| {
            let l = text
                .lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix} in\n{text}"));
            l.rsplit(' ').next().unwrap().to_string()
        };
        let b = |kind: &str, le: &str| {
            value(&format!(
                "fl_step_duration_seconds_bucket{{kind=\"{kind}\",le=\"{le}\"}}"
            ))
        };
        assert_eq!(b("decode", "0.005"), "1");
        assert_eq!(b("decode", "0.0125"), "3");
        assert_eq!(b("decode", "1"), "3");
        assert_eq!(b("decode", "+Inf"), "4");
        assert_eq!(b("prefill", "0.03"), "0");
        assert_eq!(b("prefill", "0.04"), "1");
        assert_eq!(
            value("fl_step_duration_seconds_count{kind=\"decode\"}"),
            "4"
        );
        let sum: f64 = value("fl_step_duration_seconds_sum{kind=\"decode\"}")
            .parse()
            .unwrap();
        assert!((sum - 2.028).abs() < 1e-9, "{sum}");
    }

    #[test]
    fn every_sample_line_has_a_type() {
        let text = Metrics::default().render(Some(ServiceStats::default()));
        let mut typed = std::collections::HashSet::new();
        for l in text.lines() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                typed.insert(rest.split(' ').next().unwrap().to_string());
            } else if !l.starts_with('#') {
                let name = l.split(['{', ' ']).next().unwrap();
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s).filter(|b| typed.contains(*b)))
                    .unwrap_or(name);
                assert!(typed.contains(base), "{l}");
                let v = l.rsplit(' ').next().unwrap();
                assert!(v.parse::<f64>().is_ok(), "{l}");
            }
        }
    }
}
