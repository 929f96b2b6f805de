//! Request traces for serving benchmarks: when requests arrive and how long they are, and the
//! latency percentiles a run reports (time to first token, time per output token, inter-token
//! latency).
//!
//! A trace is generated from a [`TraceSpec`] (Poisson arrivals at a rate, or all at once;
//! prompt and output lengths fixed or uniform in a range; a seed, so the same spec gives the
//! same trace on every machine) or read from a JSON file ([`parse_trace_json`]).
//!
//! ```
//! use fl_engine::trace::{Lengths, TraceSpec};
//! let spec = TraceSpec {
//!     requests: 1000,
//!     rate: None, // all at once
//!     prompt: Lengths::parse("64-4096").unwrap(),
//!     output: Lengths::parse("16-1024").unwrap(),
//!     seed: 1,
//! };
//! let trace = spec.generate().unwrap();
//! assert_eq!(trace.len(), 1000);
//! assert!(trace.iter().all(|r| r.arrival_s == 0.0 && (64..=4096).contains(&r.prompt_len)));
//! ```

use serde::Deserialize;

use crate::error::{EngineError, Result};

/// A length distribution: one value, or uniform over an inclusive range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lengths {
    /// Always this many tokens.
    Fixed(usize),
    /// Uniform in `lo..=hi`.
    Uniform {
        /// Smallest.
        lo: usize,
        /// Largest.
        hi: usize,
    },
}

impl Lengths {
    /// `"N"` (fixed) or `"LO-HI"` (uniform, inclusive), each at least 1.
    ///
    /// Errors: [`EngineError::Invalid`] naming `lengths` for anything else.
    pub fn parse(s: &str) -> Result<Self> {
        let num = |t: &str| -> Result<usize> {
            match t.trim().parse::<usize>() {
                Ok(n) if n >= 1 => Ok(n),
                _ => Err(EngineError::invalid(
                    "lengths",
                    format!("`{s}` is not N or LO-HI with counts >= 1"),
                )),
            }
        };
        match s.split_once('-') {
            None => Ok(Lengths::Fixed(num(s)?)),
            Some((a, b)) => {
                let (lo, hi) = (num(a)?, num(b)?);
                if lo > hi {
                    return Err(EngineError::invalid(
                        "lengths",
                        format!("`{s}`: {lo} is above {hi}"),
                    ));
                }
                Ok(Lengths::Uniform { lo, hi })
            }
        }
    }

    fn draw(&self, rng: &mut SplitMix64) -> usize {
        match *self {
            Lengths::Fixed(n) => n,
            Lengths::Uniform { lo, hi } => lo + (rng.next() % (hi - lo + 1) as u64) as usize,
        }
    }

    fn min(&self) -> usize {
        match *self {
            Lengths::Fixed(n) => n,
            Lengths::Uniform { lo, .. } => lo,
        }
    }
}

/// How to generate a trace.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TraceSpec {
    /// Number of requests.
    pub requests: usize,
    /// Mean arrivals per second of a Poisson process; `None`: every request at time 0.
    pub rate: Option<f64>,
    /// Prompt lengths.
    pub prompt: Lengths,
    /// Output lengths (`max_new_tokens`, end ids ignored).
    pub output: Lengths,
    /// Seed of the generator.
    pub seed: u64,
}

/// One request of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
pub struct TraceRequest {
    /// Seconds after the start of the run.
    pub arrival_s: f64,
    /// Prompt tokens.
    pub prompt_len: usize,
    /// Tokens to generate.
    pub output_len: usize,
}

impl TraceSpec {
    /// The trace, in arrival order.
    ///
    /// Errors: [`EngineError::Invalid`] naming `requests` (0), `rate` (not finite and > 0) or
    /// `lengths` (a zero length).
    pub fn generate(&self) -> Result<Vec<TraceRequest>> {
        if self.requests == 0 {
            return Err(EngineError::invalid("requests", "must be at least 1"));
        }
        if let Some(r) = self.rate {
            if !(r.is_finite() && r > 0.0) {
                return Err(EngineError::invalid(
                    "rate",
                    format!("{r} is not a positive number of requests per second"),
                ));
            }
        }
        if self.prompt.min() == 0 || self.output.min() == 0 {
            return Err(EngineError::invalid(
                "lengths",
                "lengths must be at least 1",
            ));
        }
        let mut rng = SplitMix64(self.seed);
        let mut t = 0.0;
        Ok((0..self.requests)
            .map(|_| {
                if let Some(rate) = self.rate {
                    // Exponential gaps: -ln(U) / rate with U in (0, 1].
                    let u = ((rng.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
                    t += -u.ln() / rate;
                }
                TraceRequest {
                    arrival_s: t,
                    prompt_len: self.prompt.draw(&mut rng),
                    output_len: self.output.draw(&mut rng),
                }
            })
            .collect())
    }
}

/// A trace from JSON: `[{"arrival_s": 0.0, "prompt_len": 512, "output_len": 128}, ...]`,
/// sorted by arrival on return.
///
/// Errors: [`EngineError::Invalid`] naming `trace` (not such a list, a negative or non-finite
/// arrival, a zero length, an empty list).
pub fn parse_trace_json(text: &str) -> Result<Vec<TraceRequest>> {
    let mut v: Vec<TraceRequest> = serde_json::from_str(text)
        .map_err(|e| EngineError::invalid("trace", format!("not a list of requests: {e}")))?;
    if v.is_empty() {
        return Err(EngineError::invalid("trace", "holds no request"));
    }
    for (i, r) in v.iter().enumerate() {
        if !(r.arrival_s.is_finite() && r.arrival_s >= 0.0) {
            return Err(EngineError::invalid(
                "trace",
                format!("request {i}: arrival_s {} is not a time >= 0", r.arrival_s),
            ));
        }
        if r.prompt_len == 0 || r.output_len == 0 {
            return Err(EngineError::invalid(
                "trace",
                format!("request {i}: prompt_len and output_len must be at least 1"),
            ));
        }
    }
    v.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    Ok(v)
}

/// Summary of latency samples (seconds).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Percentiles {
    /// Samples.
    pub count: usize,
    /// Mean.
    pub mean: f64,
    /// Median (nearest rank).
    pub p50: f64,
    /// 90th percentile (nearest rank).
    pub p90: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `samples` (NaNs ignored); `None` when there is none.
    pub fn of(samples: &[f64]) -> Option<Self> {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let rank = |p: f64| v[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
        Some(Percentiles {
            count: n,
            mean: v.iter().sum::<f64>() / n as f64,
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            max: v[n - 1],
        })
    }
}

/// SplitMix64: a small, fixed generator, so a trace (or random weights) is the same on every
/// machine.
pub(crate) struct SplitMix64(pub(crate) u64);

impl SplitMix64 {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rate: Option<f64>) -> TraceSpec {
        TraceSpec {
            requests: 20_000,
            rate,
            prompt: Lengths::Uniform { lo: 64, hi: 4096 },
            output: Lengths::Fixed(32),
            seed: 7,
        }
    }

    #[test]
    fn lengths_parse_and_refuse() {
        assert_eq!(Lengths::parse("128").unwrap(), Lengths::Fixed(128));
        assert_eq!(
            Lengths::parse("16-1024").unwrap(),
            Lengths::Uniform { lo: 16, hi: 1024 }
        );
        for bad in ["", "0", "a", "5-3", "1-", "-4", "0-8"] {
            let e = Lengths::parse(bad).unwrap_err().to_string();
            assert!(e.starts_with("lengths"), "{bad}: {e}");
        }
    }

    #[test]
    fn all_at_once_and_poisson_arrivals() {
        let t = spec(None).generate().unwrap();
        assert!(t.iter().all(|r| r.arrival_s == 0.0));
        let rate = 50.0;
        let t = spec(Some(rate)).generate().unwrap();
        assert!(t.windows(2).all(|w| w[0].arrival_s <= w[1].arrival_s));
        // Mean gap 1/rate within 3% over 20k arrivals (sd of the mean ~0.7%).
        let mean_gap = t.last().unwrap().arrival_s / t.len() as f64;
        assert!((mean_gap * rate - 1.0).abs() < 0.03, "mean gap {mean_gap}");
        // Exponential: the fraction of gaps above the mean is e^-1.
        let gaps: Vec<f64> = std::iter::once(t[0].arrival_s)
            .chain(t.windows(2).map(|w| w[1].arrival_s - w[0].arrival_s))
            .collect();
        let above = gaps.iter().filter(|&&g| g > 1.0 / rate).count() as f64 / gaps.len() as f64;
        assert!(
            (above - (-1f64).exp()).abs() < 0.02,
            "fraction above mean {above}"
        );
    }

    #[test]
    fn lengths_cover_the_range_and_the_seed_fixes_the_trace() {
        let t = spec(None).generate().unwrap();
        let lens: Vec<usize> = t.iter().map(|r| r.prompt_len).collect();
        assert!(lens.iter().all(|l| (64..=4096).contains(l)));
        assert!(lens.contains(&64) || lens.iter().min() < Some(&80));
        assert!(lens.iter().max() > Some(&4000));
        let mean = lens.iter().sum::<usize>() as f64 / lens.len() as f64;
        assert!((mean - 2080.0).abs() < 40.0, "mean prompt {mean}");
        assert!(t.iter().all(|r| r.output_len == 32));
        assert_eq!(t, spec(None).generate().unwrap());
        let mut other = spec(None);
        other.seed = 8;
        assert_ne!(t, other.generate().unwrap());
    }

    #[test]
    fn bad_specs_name_the_field() {
        let mut s = spec(None);
        s.requests = 0;
        assert!(s
            .generate()
            .unwrap_err()
            .to_string()
            .starts_with("requests"));
        for r in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = spec(Some(r)).generate().unwrap_err().to_string();
            assert!(e.starts_with("rate"), "{r}: {e}");
        }
        let mut s = spec(None);
        s.output = Lengths::Fixed(0);
        assert!(s.generate().unwrap_err().to_string().starts_with("lengths"));
    }

    #[test]
    fn trace_json_reads_sorts_and_refuses() {
        let t = parse_trace_json(
            r#"[{"arrival_s": 1.5, "prompt_len": 10, "output_len": 3},
                {"arrival_s": 0.25, "prompt_len": 7, "output_len": 9}]"#,
        )
        .unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].prompt_len, 7);
        assert_eq!(t[1].arrival_s, 1.5);
        for bad in [
            "",
            "{}",
            "[]",
            r#"[{"arrival_s": -1, "prompt_len": 1, "output_len": 1}]"#,
            r#"[{"arrival_s": 0, "prompt_len": 0, "output_len": 1}]"#,
            r#"[{"arrival_s": 0, "prompt_len": 4}]"#,
        ] {
            let e = parse_trace_json(bad).unwrap_err().to_string();
            assert!(e.starts_with("trace"), "{bad}: {e}");
        }
    }

    #[test]
    fn percentiles_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = Percentiles::of(&v).unwrap();
        assert_eq!((p.p50, p.p90, p.p99, p.max), (50.0, 90.0, 99.0, 100.0));
        assert_eq!(p.mean, 50.5);
        assert_eq!(p.count, 100);
        let p = Percentiles::of(&[3.0, f64::NAN]).unwrap();
        assert_eq!((p.p50, p.p99, p.count), (3.0, 3.0, 1));
        assert_eq!(Percentiles::of(&[]), None);
        assert_eq!(Percentiles::of(&[f64::NAN]), None);
    }
}
