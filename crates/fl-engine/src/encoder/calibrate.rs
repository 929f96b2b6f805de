//! INT8 calibration of an encoder (FasterTransformer 3.0's static activation scales): the
//! amax of every GEMM input over sample text, [`Calibrator`] collecting them and
//! [`Calibration`] (saved as JSON beside the model, `fl calibrate`) giving them to the INT8
//! forward ([`EncoderQuant::Int8Calibrated`](crate::encoder::gpu::EncoderQuant)).
//!
//! Four tensors per layer are quantised ([`Site`]): the QKV GEMMs' input (the hidden state),
//! the attention output projection's input (the attention context), the intermediate GEMM's
//! input (the hidden state after the attention block) and the output GEMM's input (the GELU
//! output). For each, the absolute maximum and a percentile of `|v|` over every element seen
//! are kept: the percentile from a histogram of 64 log-spaced bins per octave over
//! `2^-24 .. 2^24` (the upper edge of the bin that reaches it: at most 1.1 % above the exact
//! value, never below it).

use std::path::Path;

use serde_json::{json, Value};

use crate::error::{EngineError, Result};

/// A quantised GEMM input of an encoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Site {
    /// The hidden state entering the layer (the Q, K and V projections' input).
    QkvIn = 0,
    /// The attention context (the attention output projection's input).
    AttnOutIn = 1,
    /// The hidden state after the attention block (the intermediate projection's input).
    InterIn = 2,
    /// The GELU output (the output projection's input).
    OutputIn = 3,
}

impl Site {
    /// Every site, in index order.
    pub const ALL: [Site; 4] = [Site::QkvIn, Site::AttnOutIn, Site::InterIn, Site::OutputIn];

    /// The JSON key of the site.
    pub fn name(self) -> &'static str {
        match self {
            Site::QkvIn => "qkv_in",
            Site::AttnOutIn => "attn_out_in",
            Site::InterIn => "intermediate_in",
            Site::OutputIn => "output_in",
        }
    }
}

/// Which calibrated amax the INT8 forward quantises with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AmaxKind {
    /// The largest `|v|` seen: nothing saturates on the calibration text.
    Absmax,
    /// The [`Calibration::percentile`] of `|v|`: outliers saturate, the rest keep more
    /// resolution.
    #[default]
    Percentile,
}

impl std::str::FromStr for AmaxKind {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "absmax" => Ok(AmaxKind::Absmax),
            "percentile" => Ok(AmaxKind::Percentile),
            _ => Err(EngineError::invalid(
                "amax",
                format!("`{s}`; expected absmax or percentile"),
            )),
        }
    }
}

/// The amax figures of one tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TensorAmax {
    /// Largest `|v|` seen.
    pub absmax: f32,
    /// The calibration's percentile of `|v|` (never above `absmax`).
    pub percentile: f32,
}

impl TensorAmax {
    /// The figure `kind` names.
    pub fn get(&self, kind: AmaxKind) -> f32 {
        match kind {
            AmaxKind::Absmax => self.absmax,
            AmaxKind::Percentile => self.percentile,
        }
    }
}

/// Calibrated amax of every quantised tensor of an encoder: `layers[l][site as usize]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    /// The percentile (in `(0, 100]`) behind [`TensorAmax::percentile`].
    pub percentile: f64,
    /// Tokens seen.
    pub tokens: u64,
    /// Per layer, per [`Site`].
    pub layers: Vec<[TensorAmax; 4]>,
}

const FORMAT: &str = "fl-encoder-int8-calibration/1";
/// The file name `fl calibrate` writes into the model directory by default.
pub const DEFAULT_FILE: &str = "fl_int8_calibration.json";

impl Calibration {
    /// The amax of `site` in layer `layer` of kind `kind`.
    ///
    /// # Errors
    /// [`EngineError::Invalid`] naming `layer` past the calibrated layers.
    pub fn amax(&self, layer: usize, site: Site, kind: AmaxKind) -> Result<f32> {
        let l = self.layers.get(layer).ok_or_else(|| {
            EngineError::invalid(
                "layer",
                format!("{layer}; the calibration has {} layers", self.layers.len()),
            )
        })?;
        Ok(l[site as usize].get(kind))
    }

    /// The calibration as JSON: `{"format", "percentile", "tokens", "layers": [{"qkv_in":
    /// {"absmax", "percentile"}, ...}, ...]}`.
    pub fn to_json(&self) -> Value {
        let layers: Vec<Value> = self
            .layers
            .iter()
            .map(|l| {
                let mut m = serde_json::Map::new();
                for s in Site::ALL {
                    let a = l[s as usize];
                    m.insert(
                        s.name().into(),
                        json!({"absmax": a.absmax, "percentile": a.percentile}),
                    );
                }
                Value::Object(m)
            })
            .collect();
        json!({"format": FORMAT, "percentile": self.percentile, "tokens": self.tokens,
               "layers": layers})
    }

    /// Reads [`Calibration::to_json`]'s form.
    ///
    /// # Errors
    /// [`EngineError::Invalid`] naming `calibration` and the field that is missing or wrong.
    pub fn from_json(v: &Value) -> Result<Self> {
        let bad = |what: String| EngineError::invalid("calibration", what);
        if v.get("format").and_then(Value::as_str) != Some(FORMAT) {
            return Err(bad(format!("`format` is not \"{FORMAT}\"")));
        }
        let percentile = v
            .get("percentile")
            .and_then(Value::as_f64)
            .filter(|p| *p > 0.0 && *p <= 100.0)
            .ok_or_else(|| bad("`percentile` is not a number in (0, 100]".into()))?;
        let tokens = v
            .get("tokens")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad("`tokens` is not a non-negative integer".into()))?;
        let layers = v
            .get("layers")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("`layers` is not an array".into()))?;
        let mut out = Vec::with_capacity(layers.len());
        for (l, layer) in layers.iter().enumerate() {
            let mut a = [TensorAmax {
                absmax: 0.0,
                percentile: 0.0,
            }; 4];
            for s in Site::ALL {
                let get = |k: &str| {
                    layer
                        .get(s.name())
                        .and_then(|t| t.get(k))
                        .and_then(Value::as_f64)
                        .filter(|x| x.is_finite() && *x >= 0.0)
                        .map(|x| x as f32)
                        .ok_or_else(|| {
                            bad(format!(
                                "`layers[{l}].{}.{k}` is not a finite number >= 0",
                                s.name()
                            ))
                        })
                };
                a[s as usize] = TensorAmax {
                    absmax: get("absmax")?,
                    percentile: get("percentile")?,
                };
            }
            out.push(a);
        }
        Ok(Calibration {
            percentile,
            tokens,
            layers: out,
        })
    }

    /// Writes the JSON to `path`.
    ///
    /// # Errors
    /// [`EngineError::Invalid`] naming `path` when it cannot be written.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let p = path.as_ref();
        let text = serde_json::to_string_pretty(&self.to_json())
            .map_err(|e| EngineError::invalid("calibration", e.to_string()))?;
        std::fs::write(p, text + "\n")
            .map_err(|e| EngineError::invalid("path", format!("{}: {e}", p.display())))
    }

    /// Reads a file [`Calibration::save`] wrote.
    ///
    /// # Errors
    /// [`EngineError::Invalid`] naming `path` (unreadable, not JSON) or `calibration`.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let p = path.as_ref();
        let text = std::fs::read_to_string(p)
            .map_err(|e| EngineError::invalid("path", format!("{}: {e}", p.display())))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| EngineError::invalid("path", format!("{}: {e}", p.display())))?;
        Self::from_json(&v)
    }
}

/// The [`EncoderQuant`](crate::encoder::gpu::EncoderQuant) that command-line flags name:
/// `quant` `none` or `int8`; with `int8`, `calibration` (a file [`Calibration::save`] wrote)
/// selects static scales of kind `amax` (`absmax` or `percentile`), its absence per-token
/// scales.
///
/// # Errors
/// [`EngineError::Invalid`] naming `--quant` (another value), `--calibration` (given
/// without INT8; unreadable or malformed) or `--amax`.
pub fn encoder_quant(
    quant: &str,
    calibration: Option<&Path>,
    amax: &str,
) -> Result<crate::encoder::gpu::EncoderQuant> {
    use crate::encoder::gpu::EncoderQuant;
    let kind: AmaxKind = amax.parse().map_err(|_| {
        EngineError::invalid("--amax", format!("`{amax}`; expected absmax or percentile"))
    })?;
    match (quant, calibration) {
        ("none", None) => Ok(EncoderQuant::None),
        ("none", Some(_)) => Err(EngineError::invalid(
            "--calibration",
            "scales INT8 activations; it needs --quant int8",
        )),
        ("int8", None) => Ok(EncoderQuant::Int8),
        ("int8", Some(p)) => {
            let calibration = Calibration::load(p).map_err(|e| {
                EngineError::invalid("--calibration", format!("{}: {e}", p.display()))
            })?;
            Ok(EncoderQuant::Int8Calibrated { calibration, kind })
        }
        (q, _) => Err(EngineError::invalid(
            "--quant",
            format!("`{q}`; an encoder runs none or int8"),
        )),
    }
}

/// `percentile` is in `(0, 100]`.
///
/// # Errors
/// [`EngineError::Invalid`] naming `percentile`.
pub fn check_percentile(percentile: f64) -> Result<()> {
    if percentile > 0.0 && percentile <= 100.0 {
        Ok(())
    } else {
        Err(EngineError::invalid(
            "percentile",
            format!("{percentile} is not in (0, 100]"),
        ))
    }
}

const BINS_PER_OCTAVE: f64 = 64.0;
const MIN_LOG2: f64 = -24.0;
const OCTAVES: usize = 48;
const BINS: usize = OCTAVES * 64 + 1;

/// The histogram bin of `a = |v|` (bin 0: below `2^-24`, including 0).
fn bin(a: f32) -> usize {
    if a.is_nan() || a <= 0.0 {
        return 0;
    }
    let b = ((a as f64).log2() - MIN_LOG2) * BINS_PER_OCTAVE;
    if b < 0.0 {
        0
    } else {
        (b.floor() as usize + 1).min(BINS - 1)
    }
}

/// The upper edge of bin `b`.
fn bin_top(b: usize) -> f64 {
    (MIN_LOG2 + b as f64 / BINS_PER_OCTAVE).exp2()
}

/// Collects amax statistics over calibration batches.
#[derive(Debug, Clone)]
pub struct Calibrator {
    hist: Vec<[Vec<u64>; 4]>,
    absmax: Vec<[f32; 4]>,
    tokens: u64,
}

impl Calibrator {
    /// A calibrator for `layers` layers.
    pub fn new(layers: usize) -> Self {
        Calibrator {
            hist: (0..layers)
                .map(|_| std::array::from_fn(|_| vec![0u64; BINS]))
                .collect(),
            absmax: vec![[0.0; 4]; layers],
            tokens: 0,
        }
    }

    /// Counts `tokens` more tokens (call once per batch).
    pub fn add_tokens(&mut self, tokens: usize) {
        self.tokens += tokens as u64;
    }

    /// Adds the values of `site` in layer `layer`.
    ///
    /// # Errors
    /// [`EngineError::Invalid`] naming `layer` (out of range) or `values` (a NaN or infinity:
    /// the forward overflowed, and no scale would be right).
    pub fn observe(&mut self, layer: usize, site: Site, values: &[f32]) -> Result<()> {
        let layers = self.hist.len();
        let h = self
            .hist
            .get_mut(layer)
            .ok_or_else(|| EngineError::invalid("layer", format!("{layer} of {layers}")))?;
        let h = &mut h[site as usize];
        let m = &mut self.absmax[layer][site as usize];
        for &v in values {
            if !v.is_finite() {
                return Err(EngineError::invalid(
                    "values",
                    format!("layer {layer} {}: a non-finite value", site.name()),
                ));
            }
            let a = v.abs();
            *m = m.max(a);
            h[bin(a)] += 1;
        }
        Ok(())
    }

    /// The calibration at `percentile` (in `(0, 100]`).
    ///
    /// # Errors
    /// [`EngineError::Invalid`] naming `percentile`.
    pub fn finish(&self, percentile: f64) -> Result<Calibration> {
        check_percentile(percentile)?;
        let layers = self
            .hist
            .iter()
            .zip(&self.absmax)
            .map(|(hs, ms)| {
                std::array::from_fn(|s| {
                    let (h, absmax) = (&hs[s], ms[s]);
                    let total: u64 = h.iter().sum();
                    let want = (percentile / 100.0 * total as f64).ceil() as u64;
                    let mut seen = 0u64;
                    let mut p = absmax as f64;
                    for (b, &c) in h.iter().enumerate() {
                        seen += c;
                        if seen >= want && total > 0 {
                            p = bin_top(b);
                            break;
                        }
                    }
                    TensorAmax {
                        absmax,
                        percentile: (p as f32).min(absmax),
                    }
                })
            })
            .collect();
        Ok(Calibration {
            percentile,
            tokens: self.tokens,
            layers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_is_at_or_just_above_the_exact_value() {
        let mut c = Calibrator::new(2);
        // 10,000 values 0.001 .. 10; the 99th percentile of |v| is ~9.9.
        let v: Vec<f32> = (1..=10_000)
            .map(|i| i as f32 * 1e-3 * if i % 2 == 0 { 1.0 } else { -1.0 })
            .collect();
        c.observe(1, Site::OutputIn, &v).unwrap();
        c.add_tokens(100);
        let cal = c.finish(99.0).unwrap();
        let a = cal.layers[1][Site::OutputIn as usize];
        assert_eq!(a.absmax, 10.0);
        assert!(a.percentile >= 9.9 && a.percentile <= 9.9 * 1.011, "{a:?}");
        // A site with nothing seen: zeros (the forward then quantises everything to 0).
        assert_eq!(cal.layers[0][0].absmax, 0.0);
        assert_eq!(cal.amax(1, Site::OutputIn, AmaxKind::Absmax).unwrap(), 10.0);
        assert!(cal.amax(2, Site::QkvIn, AmaxKind::Absmax).is_err());
        assert_eq!(c.finish(100.0).unwrap().layers[1][3].percentile, 10.0);
    }

    #[test]
    fn round_trips_through_json_and_refuses_bad_files() {
        let mut c = Calibrator::new(3);
        for l in 0..3 {
            for s in Site::ALL {
                c.observe(l, s, &[0.5, -(l as f32 + 1.0) * (s as usize as f32 + 1.0)])
                    .unwrap();
            }
        }
        let cal = c.finish(99.99).unwrap();
        let back = Calibration::from_json(&cal.to_json()).unwrap();
        assert_eq!(back, cal);
        let mut v = cal.to_json();
        v["layers"][1]["output_in"]["absmax"] = json!(-1.0);
        let e = Calibration::from_json(&v).unwrap_err().to_string();
        assert!(e.contains("layers[1].output_in.absmax"), "{e}");
        assert!(Calibration::from_json(&json!({"format": "x"})).is_err());
        assert!(c.observe(0, Site::QkvIn, &[f32::NAN]).is_err());
        assert!(c.observe(3, Site::QkvIn, &[1.0]).is_err());
        assert!(c.finish(0.0).is_err());
        assert_eq!("absmax".parse::<AmaxKind>().unwrap(), AmaxKind::Absmax);
        assert!("max".parse::<AmaxKind>().is_err());
    }
}
