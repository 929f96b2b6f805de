//! Beam search hypotheses kept as Hugging Face transformers keeps them (`generate(num_beams=..)`,
//! the vectorised `_beam_search` of transformers >= 4.50, which replaced `BeamSearchScorer`).
//!
//! One [`BeamState`] per request. Each step takes the beams' log-probabilities (already
//! log-softmaxed, `[num_beams, vocab]`), adds each beam's running sum, and keeps the
//! `beams_to_keep = max(2, 1 + eos_token_ids.len()) * num_beams` best `(score, beam, token)`
//! candidates over beams x vocab. Of those, a candidate that ends (an end id, or the last
//! allowed token) becomes a finished hypothesis only if it ranks within `num_beams`; the
//! `num_beams` best candidates that do not end become the next running beams. At the first step
//! every beam holds the prompt, so beams `1..` start at a running score of `-1e9` and only beam
//! 0 expands.
//!
//! A finished hypothesis scores `sum_logprobs / generated_len ^ length_penalty`, where
//! `generated_len` counts the generated tokens *including* the end id (transformers divides by
//! `cur_len + 1 - decoder_prompt_len`; the older `BeamSearchScorer` divided by the length
//! before the end id). The prompt is never counted. The `num_beams` best hypotheses are kept.
//!
//! The search stops when ([`EarlyStopping`]):
//! - `True`: `num_beams` hypotheses are finished;
//! - `False`: every slot is finished and the best running sum divided by the *current*
//!   generated length ^ `length_penalty` cannot beat the worst kept hypothesis (a heuristic: a
//!   longer beam may still beat it when `length_penalty > 0`);
//! - `Never`: the same test with the bound taken at `max_new_tokens` when
//!   `length_penalty > 0` (the exact bound: log-probabilities are <= 0);
//! - always when every candidate ends (`max_new_tokens` reached).
//!
//! Scores are summed in f32, as transformers sums them, so that the same ties break the same
//! way; the `-1e9` placeholders are transformers' own masking values.
//!
//! ```
//! use fl_engine::beam::{beam_search, BeamParams, EarlyStopping};
//! let mut params = BeamParams::new(2, 4);
//! params.early_stopping = EarlyStopping::True;
//! params.eos_token_ids = vec![0];
//! // A "model" of vocabulary 3 that prefers token 1, then the end id 0 after two tokens.
//! let out = beam_search(&[2, 2], &params, |beams| {
//!     beams
//!         .iter()
//!         .map(|s| if s.len() >= 4 { vec![2.0, 0.0, 0.0] } else { vec![0.0, 2.0, 1.0] })
//!         .collect()
//! })?;
//! assert_eq!(out[0].0, vec![1, 1, 0]);
//! # Ok::<(), fl_engine::EngineError>(())
//! ```

use crate::{EngineError, Result};

/// transformers' masking value: scores of beams that must not be picked.
const MASK: f32 = -1.0e9;

/// When a request's beam search stops (transformers' `early_stopping`). See the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EarlyStopping {
    /// Stop as soon as `num_beams` hypotheses are finished (`early_stopping=True`).
    True,
    /// Stop when the best running beam, scored at its current length, cannot beat the worst
    /// finished hypothesis (`early_stopping=False`, the default).
    #[default]
    False,
    /// Stop only when no running beam can beat the worst finished hypothesis even at
    /// `max_new_tokens` (`early_stopping="never"`).
    Never,
}

/// A request's beam search parameters, transformers' names and defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct BeamParams {
    /// Beams kept per request, >= 1.
    pub num_beams: usize,
    /// Exponent of the generated length dividing a hypothesis' log-probability sum; > 0 favours
    /// longer sequences, < 0 shorter ones. Default 1.0.
    pub length_penalty: f64,
    /// When to stop. Default [`EarlyStopping::False`].
    pub early_stopping: EarlyStopping,
    /// Hypotheses returned, `1..=num_beams`. Default 1.
    pub num_return_sequences: usize,
    /// Most tokens generated per beam, >= 1.
    pub max_new_tokens: usize,
    /// Tokens that end a hypothesis (distinct); may be empty (hypotheses then end at
    /// `max_new_tokens`).
    pub eos_token_ids: Vec<u32>,
}

impl BeamParams {
    /// `num_beams` beams, at most `max_new_tokens` new tokens, transformers' defaults for the
    /// rest (length penalty 1.0, `early_stopping=False`, one sequence returned, no end id).
    pub fn new(num_beams: usize, max_new_tokens: usize) -> Self {
        BeamParams {
            num_beams,
            length_penalty: 1.0,
            early_stopping: EarlyStopping::False,
            num_return_sequences: 1,
            max_new_tokens,
            eos_token_ids: Vec::new(),
        }
    }

    /// Checks every field; the error names the field at fault.
    pub fn validate(&self) -> Result<()> {
        if self.num_beams == 0 {
            return Err(EngineError::invalid("num_beams", "must be >= 1"));
        }
        if self.num_return_sequences == 0 || self.num_return_sequences > self.num_beams {
            return Err(EngineError::invalid(
                "num_return_sequences",
                format!(
                    "{} must be in 1..={} (num_beams)",
                    self.num_return_sequences, self.num_beams
                ),
            ));
        }
        if self.max_new_tokens == 0 {
            return Err(EngineError::invalid("max_new_tokens", "must be >= 1"));
        }
        if !self.length_penalty.is_finite() {
            return Err(EngineError::invalid(
                "length_penalty",
                format!("{} is not finite", self.length_penalty),
            ));
        }
        for (i, id) in self.eos_token_ids.iter().enumerate() {
            if self.eos_token_ids[..i].contains(id) {
                return Err(EngineError::invalid(
                    "eos_token_ids",
                    format!("{id} appears twice"),
                ));
            }
        }
        Ok(())
    }

    /// Candidates kept per step: enough that `num_beams` of them do not end even when every
    /// beam's best tokens are end ids.
    pub fn beams_to_keep(&self) -> usize {
        (1 + self.eos_token_ids.len()).max(2) * self.num_beams
    }
}

/// What one [`BeamState::step`] decided, for the engine to apply to its beams.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepResult {
    /// `[num_beams]`: the beam (row of the step's input) each new beam continues; the engine
    /// forks block tables by it.
    pub reorder: Vec<usize>,
    /// `[num_beams]`: the token each new beam appends.
    pub tokens: Vec<u32>,
    /// The request is finished: call [`BeamState::finish`], not `step`.
    pub done: bool,
}

/// One of the `num_beams` finished-hypothesis slots (transformers' `sequences`/`beam_scores`).
#[derive(Clone, Debug)]
struct Slot {
    score: f32,
    finished: bool,
    tokens: Vec<u32>,
}

/// A request's beam search between steps: running beams and finished hypotheses.
#[derive(Clone, Debug)]
pub struct BeamState {
    params: BeamParams,
    vocab: usize,
    /// `[num_beams]` generated tokens of each running beam.
    running: Vec<Vec<u32>>,
    /// `[num_beams]` running log-probability sums.
    running_scores: Vec<f32>,
    /// `[num_beams]`, best first.
    slots: Vec<Slot>,
    generated: usize,
    improvement_possible: bool,
    done: bool,
}

/// The `k` best of `scores` (descending, the lower index first among equals), as indices.
fn top_k(scores: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    let by_score = |a: &usize, b: &usize| scores[*b].total_cmp(&scores[*a]).then(a.cmp(b));
    if k < idx.len() {
        idx.select_nth_unstable_by(k, by_score);
        idx.truncate(k);
    }
    idx.sort_by(by_score);
    idx
}

impl BeamState {
    /// A new request's state over a vocabulary of `vocab` tokens; the prompt is the engine's
    /// business.
    ///
    /// Errors: invalid `params`; `vocab` too small to give `beams_to_keep` candidates
    /// (`num_beams * vocab < beams_to_keep`).
    pub fn new(params: BeamParams, vocab: usize) -> Result<Self> {
        params.validate()?;
        let k = params.num_beams;
        if k * vocab < params.beams_to_keep() {
            return Err(EngineError::invalid(
                "vocab",
                format!(
                    "{vocab} tokens give fewer than the {} candidates kept per step",
                    params.beams_to_keep()
                ),
            ));
        }
        let mut running_scores = vec![MASK; k];
        running_scores[0] = 0.0;
        Ok(BeamState {
            vocab,
            running: vec![Vec::new(); k],
            running_scores,
            slots: vec![
                Slot {
                    score: MASK,
                    finished: false,
                    tokens: Vec::new(),
                };
                k
            ],
            generated: 0,
            improvement_possible: true,
            done: false,
            params,
        })
    }

    /// The parameters.
    pub fn params(&self) -> &BeamParams {
        &self.params
    }

    /// Tokens generated so far by each running beam.
    pub fn generated_len(&self) -> usize {
        self.generated
    }

    /// Whether the search has stopped.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The running beams' generated tokens, `[num_beams]`.
    pub fn running(&self) -> &[Vec<u32>] {
        &self.running
    }

    /// One step. `logprobs`: `[num_beams, vocab]` row-major log-softmaxed log-probabilities
    /// of each running beam's next token (logits processors already applied); at the first
    /// step it may be `[1, vocab]`, the prompt's row, since every beam holds the prompt then.
    ///
    /// Errors: `step` after the search is done; `logprobs` of the wrong shape.
    pub fn step(&mut self, logprobs: &[f32]) -> Result<StepResult> {
        if self.done {
            return Err(EngineError::invalid(
                "step",
                "the beam search is already done",
            ));
        }
        let (k, vocab) = (self.params.num_beams, self.vocab);
        let keep = self.params.beams_to_keep();
        let rows = logprobs.len() / vocab;
        let first_row_only = self.generated == 0 && rows == 1;
        if logprobs.len() != rows * vocab || !(rows == k || first_row_only) {
            return Err(EngineError::invalid(
                "logprobs",
                format!(
                    "{} values, expected {k} beams x {vocab}{}",
                    logprobs.len(),
                    if self.generated == 0 {
                        " (or 1 x vocab at the first step)"
                    } else {
                        ""
                    }
                ),
            ));
        }

        // Running sums over beams x vocab; with one row, every beam reads the prompt's row.
        let sums: Vec<f32> = (0..k * vocab)
            .map(|i| {
                let (b, v) = (i / vocab, i % vocab);
                self.running_scores[b] + logprobs[if first_row_only { v } else { i }]
            })
            .collect();
        let cand: Vec<(f32, usize)> = top_k(&sums, keep)
            .into_iter()
            .map(|i| (sums[i], i))
            .collect();
        self.apply(&cand)
    }

    /// One step from the candidates already selected (on the GPU: `fl_sampling::beam_topk`):
    /// the `beams_to_keep()` best `(running sum + log-probability, beam * vocab + token)` over
    /// the step's rows, best first, the lower index first among equal scores. `beam` is the
    /// row of the step's input: `0..num_beams`, only `0` at the first step when the prompt's
    /// row alone was computed.
    ///
    /// Errors: `step` after the search is done; the wrong number of candidates, an index
    /// outside `num_beams x vocab`, or candidates out of order.
    pub fn step_candidates(&mut self, candidates: &[(f32, usize)]) -> Result<StepResult> {
        if self.done {
            return Err(EngineError::invalid(
                "step",
                "the beam search is already done",
            ));
        }
        let (keep, n) = (
            self.params.beams_to_keep(),
            self.params.num_beams * self.vocab,
        );
        if candidates.len() != keep {
            return Err(EngineError::invalid(
                "candidates",
                format!(
                    "{} candidates, expected beams_to_keep() = {keep}",
                    candidates.len()
                ),
            ));
        }
        if let Some(&(_, i)) = candidates.iter().find(|c| c.1 >= n) {
            return Err(EngineError::invalid(
                "candidates",
                format!("index {i} outside num_beams x vocab = {n}"),
            ));
        }
        if candidates
            .windows(2)
            .any(|w| w[0].0.total_cmp(&w[1].0).then(w[1].1.cmp(&w[0].1)).is_lt())
        {
            return Err(EngineError::invalid(
                "candidates",
                "not sorted best first (lower index first among equal scores)",
            ));
        }
        self.apply(candidates)
    }

    /// The running log-probability sums of the beams, `[num_beams]` (`-1e9` for beams `1..`
    /// before the first step).
    pub fn running_scores(&self) -> &[f32] {
        &self.running_scores
    }

    fn apply(&mut self, cand: &[(f32, usize)]) -> Result<StepResult> {
        let (k, vocab) = (self.params.num_beams, self.vocab);
        let gen_len = self.generated + 1;
        let at_max = gen_len >= self.params.max_new_tokens;
        let ends: Vec<bool> = cand
            .iter()
            .map(|&(_, i)| at_max || self.params.eos_token_ids.contains(&((i % vocab) as u32)))
            .collect();
        let seq = |i: usize| {
            let mut s = self.running[i / vocab].clone();
            s.push((i % vocab) as u32);
            s
        };

        // Finished hypotheses: candidates that end within the first num_beams ranks, merged
        // with the kept slots (the slots first, as transformers concatenates them).
        let penalty = (gen_len as f64).powf(self.params.length_penalty) as f32;
        let mut merged: Vec<f32> = self.slots.iter().map(|s| s.score).collect();
        for (r, &(sum, _)) in cand.iter().enumerate() {
            let mut score = sum / penalty;
            if !(ends[r] && r < k) {
                score += MASK;
            }
            merged.push(score);
        }
        let best = top_k(&merged, k);
        let slots = best
            .iter()
            .map(|&m| match m.checked_sub(k) {
                None => self.slots[m].clone(),
                Some(r) => Slot {
                    score: merged[m],
                    finished: ends[r] && r < k,
                    tokens: seq(cand[r].1),
                },
            })
            .collect();
        self.slots = slots;

        // Next running beams: the best candidates that do not end.
        let masked: Vec<f32> = cand
            .iter()
            .zip(&ends)
            .map(|(&(sum, _), &e)| sum + if e { MASK } else { 0.0 })
            .collect();
        let next = top_k(&masked, k);
        let reorder: Vec<usize> = next.iter().map(|&r| cand[r].1 / vocab).collect();
        let tokens: Vec<u32> = next.iter().map(|&r| (cand[r].1 % vocab) as u32).collect();
        self.running = next.iter().map(|&r| seq(cand[r].1)).collect();
        self.running_scores = next.iter().map(|&r| masked[r]).collect();
        self.generated = gen_len;

        // Can a running beam still beat the worst kept hypothesis?
        let bound_len = match self.params.early_stopping {
            EarlyStopping::Never if self.params.length_penalty > 0.0 => self.params.max_new_tokens,
            _ => gen_len,
        };
        let best_possible =
            self.running_scores[0] / (bound_len as f64).powf(self.params.length_penalty) as f32;
        let worst = self
            .slots
            .iter()
            .map(|s| s.score)
            .fold(f32::INFINITY, f32::min);
        self.improvement_possible &= self
            .slots
            .iter()
            .any(|s| best_possible > if s.finished { worst } else { MASK });
        let all_finished = self.slots.iter().all(|s| s.finished);
        let open_beam = !(all_finished && self.params.early_stopping == EarlyStopping::True);
        let continuations = !ends.iter().all(|&e| e);
        self.done = !(self.improvement_possible && open_beam && continuations);
        Ok(StepResult {
            reorder,
            tokens,
            done: self.done,
        })
    }

    /// The `num_return_sequences` best finished hypotheses, best first: each one's generated
    /// tokens (the end id included, the prompt not) and its score. Fewer if the search was
    /// stopped before that many finished.
    pub fn finish(&self) -> Vec<(Vec<u32>, f64)> {
        self.slots
            .iter()
            .filter(|s| s.finished)
            .take(self.params.num_return_sequences)
            .map(|s| (s.tokens.clone(), f64::from(s.score)))
            .collect()
    }
}

/// `log_softmax` of one row in f32, as torch computes it (max subtracted first).
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|&x| (x - max).exp()).sum();
    let log_sum = sum.ln();
    logits.iter().map(|&x| x - max - log_sum).collect()
}

/// Beam search on the CPU for tests: `logits_fn` is the model, given the beams' full token
/// sequences (prompt + generated; one sequence, the prompt, at the first step) and returning
/// raw logits `[beams][vocab]`. Returns [`BeamState::finish`]'s hypotheses (generated tokens
/// only).
///
/// Errors: invalid `params`; `logits_fn` returning the wrong number of rows or a row of another
/// vocabulary size.
pub fn beam_search(
    prompt: &[u32],
    params: &BeamParams,
    mut logits_fn: impl FnMut(&[Vec<u32>]) -> Vec<Vec<f32>>,
) -> Result<Vec<(Vec<u32>, f64)>> {
    let mut beams = vec![prompt.to_vec()];
    let mut logits = logits_fn(&beams);
    let vocab = logits.first().map_or(0, Vec::len);
    let mut state = BeamState::new(params.clone(), vocab)?;
    loop {
        if logits.len() != beams.len() || logits.iter().any(|r| r.len() != vocab) {
            return Err(EngineError::invalid(
                "logits_fn",
                format!(
                    "returned {} rows for {} beams, or rows of different lengths",
                    logits.len(),
                    beams.len()
                ),
            ));
        }
        let logprobs: Vec<f32> = logits.iter().flat_map(|r| log_softmax(r)).collect();
        if state.step(&logprobs)?.done {
            return Ok(state.finish());
        }
        beams = state
            .running()
            .iter()
            .map(|g| prompt.iter().chain(g).copied().collect())
            .collect();
        logits = logits_fn(&beams);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_names_the_field() {
        let bad = |f: fn(&mut BeamParams), field: &str| {
            let mut p = BeamParams::new(4, 6);
            f(&mut p);
            let e = p.validate().unwrap_err().to_string();
            assert!(e.starts_with(field), "{e}");
        };
        bad(|p| p.num_beams = 0, "num_beams");
        bad(|p| p.num_return_sequences = 5, "num_return_sequences");
        bad(|p| p.num_return_sequences = 0, "num_return_sequences");
        bad(|p| p.max_new_tokens = 0, "max_new_tokens");
        bad(|p| p.length_penalty = f64::NAN, "length_penalty");
        bad(|p| p.eos_token_ids = vec![2, 5, 2], "eos_token_ids");
        assert!(BeamParams::new(4, 6).validate().is_ok());
        assert_eq!(
            BeamParams {
                eos_token_ids: vec![1, 2],
                ..BeamParams::new(4, 6)
            }
            .beams_to_keep(),
            12
        );
    }

    #[test]
    fn step_checks_shapes_and_done() {
        // 2 beams need a vocabulary of at least 2 (4 candidates).
        let e = BeamState::new(BeamParams::new(2, 1), 1).unwrap_err();
        assert!(e.to_string().starts_with("vocab"), "{e}");
        let mut s = BeamState::new(BeamParams::new(2, 1), 3).unwrap();
        for bad in [&[0.0f32; 4][..], &[0.0; 9], &[]] {
            let e = s.clone().step(bad).unwrap_err();
            assert!(e.to_string().starts_with("logprobs"), "{e}");
        }
        let r = s.step(&[-0.1, -2.0, -3.0]).unwrap();
        assert!(r.done);
        assert_eq!(r.reorder, vec![0, 0]);
        assert!(s
            .step(&[0.0; 6])
            .unwrap_err()
            .to_string()
            .starts_with("step"));
        let out = s.finish();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, vec![0]);
        assert!((out[0].1 + 0.1).abs() < 1e-7);
    }

    /// The cross-check "model": logits a hash of the last two tokens, end ids boosted by 1.0
    /// (values k/8192, exact in f32).
    fn hash_logits(seq: &[u32], vocab: u32, eos: &[u32], boost: f64) -> Vec<f32> {
        let (a, b) = (u64::from(seq[seq.len() - 2]), u64::from(seq[seq.len() - 1]));
        (0..vocab)
            .map(|v| {
                let m = 0xFFFF_FFFFu64;
                let mut x = (a * 1_000_003 + b * 10_007 + u64::from(v) * 101 + 12_345) & m;
                x = (x * 2_654_435_761) & m;
                x ^= x >> 13;
                x = (x * 2_246_822_519) & m;
                x ^= x >> 16;
                let b = if eos.contains(&v) { boost } else { 0.0 };
                ((x % 65_536) as f64 / 8192.0 - 4.0 + b) as f32
            })
            .collect()
    }

    fn run_hash(prompt: &[u32], p: &BeamParams, boost: f64) -> Vec<(Vec<u32>, f64)> {
        beam_search(prompt, p, |beams| {
            beams
                .iter()
                .map(|s| hash_logits(s, 11, &p.eos_token_ids, boost))
                .collect()
        })
        .unwrap()
    }

    struct Case {
        beams: usize,
        lp: f64,
        es: EarlyStopping,
        max_new: usize,
        eos: &'static [u32],
        boost: f64,
        prompt: &'static [u32],
        want: &'static [(&'static [u32], f64)],
    }

    /// Cases generated with transformers 5.24.0 `generate(num_beams=.., do_sample=False)` on the
    /// same hash model (logits as in `hash_logits`), a batch of the two prompts left-padded.
    const CASES: &[Case] = &[
        Case {
            beams: 4,
            lp: 1.0,
            es: EarlyStopping::True,
            max_new: 6,
            eos: &[2],
            boost: 1.0,
            prompt: &[5, 3, 7],
            want: &[
                (&[4, 4, 2], -0.5671805739402771),
                (&[4, 4, 1, 0, 2], -0.8143121004104614),
                (&[7, 6, 2], -0.894216001033783),
                (&[2], -2.3837780952453613),
            ],
        },
        Case {
            beams: 4,
            lp: 1.0,
            es: EarlyStopping::True,
            max_new: 6,
            eos: &[2],
            boost: 1.0,
            prompt: &[1, 9],
            want: &[
                (&[2], -0.9064911007881165),
                (&[5, 4, 9, 2], -1.007390022277832),
                (&[9, 3, 0, 2], -1.051466941833496),
                (&[0, 4, 2], -1.080283761024475),
            ],
        },
        Case {
            beams: 4,
            lp: 1.0,
            es: EarlyStopping::False,
            max_new: 6,
            eos: &[2],
            boost: 1.0,
            prompt: &[5, 3, 7],
            want: &[
                (&[4, 4, 2], -0.5671805739402771),
                (&[4, 4, 1, 0, 2], -0.8143121004104614),
                (&[4, 4, 10, 9, 4, 0], -0.8214147686958313),
                (&[4, 4, 10, 9, 9, 3], -0.849822461605072),
            ],
        },
        Case {
            beams: 4,
            lp: 1.0,
            es: EarlyStopping::False,
            max_new: 6,
            eos: &[2],
            boost: 1.0,
            prompt: &[1, 9],
            want: &[
                (&[2], -0.9064911007881165),
                (&[5, 4, 9, 2], -1.007390022277832),
                (&[9, 3, 0, 2], -1.051466941833496),
                (&[0, 4, 2], -1.080283761024475),
            ],
        },
        Case {
            beams: 4,
            lp: 1.0,
            es: EarlyStopping::Never,
            max_new: 6,
            eos: &[2],
            boost: 1.0,
            prompt: &[5, 3, 7],
            want: &[
                (&[4, 4, 2], -0.5671805739402771),
                (&[4, 4, 1, 0, 2], -0.8143121004104614),
                (&[4, 4, 10, 9, 4, 0], -0.8214147686958313),
                (&[4, 4, 10, 9, 9, 3], -0.849822461605072),
            ],
        },
        Case {
            beams: 4,
            lp: 1.0,
            es: EarlyStopping::Never,
            max_new: 6,
            eos: &[2],
            boost: 1.0,
            prompt: &[1, 9],
            want: &[
                (&[9, 3, 0, 6, 0, 2], -0.8654401898384094),
                (&[2], -0.9064911007881165),
                (&[10, 7, 5, 3, 0, 2], -0.9590780138969421),
                (&[10, 7, 5, 3, 0, 6], -0.9852010607719421),
            ],
        },
        Case {
            beams: 4,
            lp: 0.0,
            es: EarlyStopping::False,
            max_new: 6,
            eos: &[2],
            boost: 1.0,
            prompt: &[5, 3, 7],
            want: &[(&[4, 4, 2], -1.7015416622161865)],
        },
        Case {
            beams: 4,
            lp: 0.0,
            es: EarlyStopping::False,
            max_new: 6,
            eos: &[2],
            boost: 1.0,
            prompt: &[1, 9],
            want: &[(&[2], -0.9064911007881165)],
        },
        Case {
            beams: 4,
            lp: 1.0,
            es: EarlyStopping::False,
            max_new: 6,
            eos: &[2, 6],
            boost: 1.0,
            prompt: &[5, 3, 7],
            want: &[
                (&[4, 4, 2], -0.6427538394927979),
                (&[7, 6], -0.8227912187576294),
            ],
        },
        Case {
            beams: 4,
            lp: 1.0,
            es: EarlyStopping::False,
            max_new: 6,
            eos: &[2, 6],
            boost: 1.0,
            prompt: &[1, 9],
            want: &[
                (&[2], -0.9152977466583252),
                (&[9, 3, 0, 6], -0.9812071919441223),
            ],
        },
        Case {
            beams: 3,
            lp: -1.0,
            es: EarlyStopping::True,
            max_new: 7,
            eos: &[4],
            boost: 1.0,
            prompt: &[0, 1],
            want: &[
                (&[5, 2, 4], -7.293647289276123),
                (&[2, 2, 4], -8.442569732666016),
                (&[2, 7, 0, 4], -14.081628799438477),
            ],
        },
        Case {
            beams: 3,
            lp: -1.0,
            es: EarlyStopping::True,
            max_new: 7,
            eos: &[4],
            boost: 1.0,
            prompt: &[8, 8, 2],
            want: &[
                (&[9, 4], -3.696908950805664),
                (&[6, 5, 0, 8, 4], -19.503870010375977),
                (&[6, 5, 1, 5, 2, 4], -22.272920608520508),
            ],
        },
        Case {
            beams: 5,
            lp: 0.5,
            es: EarlyStopping::Never,
            max_new: 9,
            eos: &[3],
            boost: 1.0,
            prompt: &[2, 6, 10, 1],
            want: &[
                (&[3], -0.4957212805747986),
                (&[10, 3], -1.4605815410614014),
                (&[5, 2, 3], -2.0412635803222656),
                (&[10, 4, 7, 5, 3], -2.728356122970581),
                (&[4, 1, 3], -2.7602744102478027),
            ],
        },
        Case {
            beams: 5,
            lp: 0.5,
            es: EarlyStopping::Never,
            max_new: 9,
            eos: &[3],
            boost: 1.0,
            prompt: &[7, 4],
            want: &[
                (&[4, 1, 3], -1.30469810962677),
                (&[4, 10, 9, 9, 3], -1.610572099685669),
                (&[6, 9, 3], -1.6862772703170776),
                (&[4, 1, 7, 5, 3], -1.7027146816253662),
                (&[4, 2, 4, 4, 1, 3], -1.918701410293579),
            ],
        },
        Case {
            beams: 4,
            lp: 2.0,
            es: EarlyStopping::False,
            max_new: 10,
            eos: &[2],
            boost: 0.0,
            prompt: &[3, 1, 4, 1, 5],
            want: &[
                (&[10, 3, 6, 3, 9, 3, 0, 6, 0, 2], -0.08262553811073303),
                (&[10, 3, 6, 3, 9, 3, 0, 6, 10, 6], -0.09796544909477234),
                (&[10, 3, 6, 3, 9, 3, 5, 5, 0, 0], -0.10080760717391968),
                (&[10, 3, 6, 3, 9, 3, 0, 6, 10, 10], -0.10183995962142944),
            ],
        },
        Case {
            beams: 4,
            lp: 2.0,
            es: EarlyStopping::False,
            max_new: 10,
            eos: &[2],
            boost: 0.0,
            prompt: &[9, 2, 6],
            want: &[
                (&[5, 0, 0, 10, 9, 4, 0, 6, 0, 2], -0.07105490565299988),
                (&[5, 0, 0, 10, 9, 9, 3, 0, 6, 0], -0.07989082485437393),
                (&[5, 10, 3, 6, 3, 9, 3, 0, 6, 0], -0.080879345536232),
                (&[5, 0, 0, 10, 9, 4, 0, 6, 10, 6], -0.08639481663703918),
            ],
        },
    ];

    #[test]
    fn matches_transformers_generate() {
        for c in CASES {
            let p = BeamParams {
                num_beams: c.beams,
                length_penalty: c.lp,
                early_stopping: c.es,
                num_return_sequences: c.want.len(),
                max_new_tokens: c.max_new,
                eos_token_ids: c.eos.to_vec(),
            };
            let got = run_hash(c.prompt, &p, c.boost);
            assert_eq!(got.len(), c.want.len(), "{p:?} {:?}", c.prompt);
            for ((gs, gsc), (ws, wsc)) in got.iter().zip(c.want) {
                assert_eq!(gs.as_slice(), *ws, "{p:?} prompt {:?}", c.prompt);
                assert!(((gsc - wsc) / wsc).abs() <= 1e-5, "{p:?}: {gsc} vs {wsc}");
            }
        }
    }

    #[test]
    fn first_step_one_row_equals_replicated_rows() {
        let lp: Vec<f32> = log_softmax(&hash_logits(&[5, 3], 11, &[2], 1.0));
        let mut a = BeamState::new(BeamParams::new(4, 3), 11).unwrap();
        let mut b = a.clone();
        let ra = a.step(&lp).unwrap();
        let rb = b.step(&lp.repeat(4)).unwrap();
        assert_eq!(ra, rb);
        // Only beam 0 expands at the first step.
        assert_eq!(ra.reorder, vec![0; 4]);
    }

    #[test]
    fn end_id_outside_num_beams_is_not_kept() {
        // 2 beams; vocab 3, token 0 ends. Step 1: beam 0 -> tokens 1 (-0.1), 2 (-0.2) run on,
        // the end id ranks third (-3.0), outside num_beams: no hypothesis.
        let mut p = BeamParams::new(2, 5);
        p.eos_token_ids = vec![0];
        p.early_stopping = EarlyStopping::True;
        let mut s = BeamState::new(p, 3).unwrap();
        let r = s.step(&[-3.0, -0.1, -0.2]).unwrap();
        assert_eq!((r.tokens.clone(), r.done), (vec![1, 2], false));
        assert!(s.finish().is_empty());
        // Step 2: beam 1 (sum -0.2) ends at rank 0, beam 0 (sum -0.1) ends at rank 1: both
        // kept, scores divided by the generated length 2 (end id included); done.
        let r = s.step(&[-0.5, -2.0, -2.0, -0.01, -3.0, -3.0]).unwrap();
        assert!(r.done);
        let out = s.finish();
        assert_eq!(out[0].0, vec![2, 0]);
        assert!((out[0].1 - (-0.21 / 2.0)).abs() < 1e-6);
    }
}
