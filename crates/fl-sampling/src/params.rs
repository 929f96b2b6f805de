//! Per-request sampling parameters: [`SamplingParams`] on the host, [`DeviceParams`] (the
//! device array the kernels read, one 64-byte record per row).

use std::sync::Arc;

use fl_kernels::cudarc::driver::CudaStream;
use fl_kernels::DeviceTensor;

use crate::{Error, Result};

/// Number of 32-bit words of one row's record on the device (`fl_sampling_params`).
pub const PARAM_WORDS: usize = fl_kernels::sampling::PARAM_WORDS;

/// The sampling parameters of one request (one row of the batch).
///
/// Every row of a batch has its own; a batch may mix greedy and sampled rows and any
/// combination of top-k, top-p and min-p. Defaults: temperature 1, every filter and penalty
/// off, seed 0, request id 0.
///
/// | field | range | meaning |
/// |---|---|---|
/// | `temperature` | `>= 0`, finite | `0`: greedy (argmax, ties to the lowest index) |
/// | `top_k` | any | `0` or `>= vocab`: off; else keep the tokens whose logit is `>=` the k-th largest (ties kept) |
/// | `top_p` | `(0, 1]` | `1`: off; keep the smallest set of most likely tokens (after top-k) with mass `>= top_p` (ties kept) |
/// | `min_p` | `[0, 1]` | `0`: off; keep tokens with `p >= min_p * p_max` |
/// | `repetition_penalty` | `> 0`, finite | `1`: off; HF: `logit > 0 ? logit / r : logit * r` on tokens of the history |
/// | `presence_penalty`, `frequency_penalty` | finite | OpenAI: `logit -= presence * (count > 0) + frequency * count` |
/// | `min_new_tokens` | any | end ids are masked while fewer tokens have been generated |
/// | `max_new_tokens` | any | `0`: no limit; the row finishes once this many tokens are generated |
/// | `seed`, `request_id` | any | Philox key and counter: same seed and request id, same tokens |
///
/// Filters apply in the order of Hugging Face's warpers (temperature, top-k, top-p, min-p);
/// since each keeps an upper set of the tokens ordered by logit, the kept set is the smallest
/// of the three (top-p's mass is measured over the top-k set).
///
/// ```
/// use fl_sampling::SamplingParams;
/// let p = SamplingParams { temperature: 0.7, top_k: 50, top_p: 0.9, seed: 42, ..Default::default() };
/// assert!(p.validate(0).is_ok());
/// assert!(SamplingParams { top_p: 0.0, ..p }.validate(3).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 selects greedy decoding.
    pub temperature: f32,
    /// Top-k filter; 0 is off.
    pub top_k: u32,
    /// Nucleus (top-p) filter; 1 is off.
    pub top_p: f32,
    /// Min-p filter; 0 is off.
    pub min_p: f32,
    /// Hugging Face repetition penalty; 1 is off.
    pub repetition_penalty: f32,
    /// OpenAI presence penalty; 0 is off.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty; 0 is off.
    pub frequency_penalty: f32,
    /// End ids are masked while fewer than this many tokens have been generated.
    pub min_new_tokens: u32,
    /// The row finishes after this many generated tokens; 0 is no limit.
    pub max_new_tokens: u32,
    /// Philox key.
    pub seed: u64,
    /// Philox counter words: tells apart requests that share a seed.
    pub request_id: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            min_new_tokens: 0,
            max_new_tokens: 0,
            seed: 0,
            request_id: 0,
        }
    }
}

fn bad(row: usize, param: &'static str, value: f32, reason: &'static str) -> Error {
    Error::Param {
        row,
        param,
        value: format!("{value}"),
        reason,
    }
}

impl SamplingParams {
    /// Greedy decoding (temperature 0), everything else at its default.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    }

    /// Whether this row is decoded greedily (temperature 0).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Whether any of the three penalties is on.
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }

    /// Checks every field's range (table above); `row` is only used in the error.
    ///
    /// Errors: [`Error::Param`] naming the row and the first parameter out of range:
    /// temperature negative or not finite; top-p outside (0, 1] (NaN included); min-p
    /// outside [0, 1]; repetition penalty not finite or <= 0; presence or frequency
    /// penalty not finite.
    pub fn validate(&self, row: usize) -> Result<()> {
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return Err(bad(
                row,
                "temperature",
                t,
                "must be finite and >= 0 (0 is greedy)",
            ));
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return Err(bad(row, "top_p", p, "must be in (0, 1] (1 is off)"));
        }
        let m = self.min_p;
        if !(0.0..=1.0).contains(&m) {
            return Err(bad(row, "min_p", m, "must be in [0, 1] (0 is off)"));
        }
        let r = self.repetition_penalty;
        if !(r.is_finite() && r > 0.0) {
            return Err(bad(
                row,
                "repetition_penalty",
                r,
                "must be finite and > 0 (1 is off)",
            ));
        }
        if !self.presence_penalty.is_finite() {
            return Err(bad(
                row,
                "presence_penalty",
                self.presence_penalty,
                "must be finite",
            ));
        }
        if !self.frequency_penalty.is_finite() {
            return Err(bad(
                row,
                "frequency_penalty",
                self.frequency_penalty,
                "must be finite",
            ));
        }
        Ok(())
    }

    /// The record the kernels read (`fl_sampling_params`), as 16 words.
    pub fn to_words(&self) -> [i32; PARAM_WORDS] {
        let sat = |v: u32| v.min(i32::MAX as u32) as i32;
        let w = |v: u32| v as i32;
        [
            self.temperature.to_bits() as i32,
            sat(self.top_k),
            self.top_p.to_bits() as i32,
            self.min_p.to_bits() as i32,
            self.repetition_penalty.to_bits() as i32,
            self.presence_penalty.to_bits() as i32,
            self.frequency_penalty.to_bits() as i32,
            sat(self.min_new_tokens),
            sat(self.max_new_tokens),
            w(self.seed as u32),
            w((self.seed >> 32) as u32),
            w(self.request_id as u32),
            w((self.request_id >> 32) as u32),
            0,
            0,
            0,
        ]
    }
}

/// The parameters of a batch on the device: `[batch]` records of [`PARAM_WORDS`] words,
/// built from a host `&[SamplingParams]` (validated first). Keeps the host copy, which the
/// wrappers use to skip launches nobody needs (e.g. penalties when every row has them off).
///
/// ```no_run
/// use fl_sampling::{DeviceParams, SamplingParams};
/// let gpu = fl_kernels::Gpu::new(0)?;
/// let rows = vec![SamplingParams::greedy(), SamplingParams { top_p: 0.9, seed: 7, ..Default::default() }];
/// let params = DeviceParams::new(gpu.stream(), &rows)?;
/// assert_eq!(params.batch(), 2);
/// # Ok::<(), fl_sampling::Error>(())
/// ```
#[derive(Debug)]
pub struct DeviceParams {
    words: DeviceTensor<i32>,
    host: Vec<SamplingParams>,
}

fn pack(params: &[SamplingParams]) -> Result<Vec<i32>> {
    let mut words = Vec::with_capacity(params.len() * PARAM_WORDS);
    for (row, p) in params.iter().enumerate() {
        p.validate(row)?;
        words.extend_from_slice(&p.to_words());
    }
    Ok(words)
}

impl DeviceParams {
    /// Validates `params` and copies them to the device (one record per row).
    ///
    /// Errors: [`Error::Param`] for the first row with a parameter out of range.
    pub fn new(stream: &Arc<CudaStream>, params: &[SamplingParams]) -> Result<Self> {
        let words = pack(params)?;
        Ok(DeviceParams {
            words: DeviceTensor::from_host(stream, &words, &[params.len(), PARAM_WORDS])?,
            host: params.to_vec(),
        })
    }

    /// Replaces the parameters (same batch size), e.g. when requests join or leave.
    ///
    /// Errors: [`Error::Param`]; [`Error::Shape`] naming `params` when the batch differs.
    pub fn update(&mut self, stream: &Arc<CudaStream>, params: &[SamplingParams]) -> Result<()> {
        if params.len() != self.host.len() {
            return Err(Error::Shape {
                arg: "params",
                expected: format!("{} rows", self.host.len()),
                got: vec![params.len()],
            });
        }
        let words = pack(params)?;
        self.words.copy_from_host(stream, &words)?;
        self.host = params.to_vec();
        Ok(())
    }

    /// Number of rows.
    pub fn batch(&self) -> usize {
        self.host.len()
    }

    /// The host copy.
    pub fn host(&self) -> &[SamplingParams] {
        &self.host
    }

    /// The device records, `[batch, PARAM_WORDS]` words.
    pub fn words(&self) -> &DeviceTensor<i32> {
        &self.words
    }
}
