//! One GPU or several behind one type: [`AnyEngine`] and the runner it opens, [`AnyRunner`].
//! `fl generate / bench / logits / serve` take either, so `--tp N` changes only how the
//! engine is loaded.

use fl_sampling::SamplingParams;

use super::{TpEngine, TpRunner};
use crate::beam::BeamParams;
use crate::config::ModelConfig;
use crate::dtype::RunDType;
use crate::engine::Engine;
use crate::error::Result;
use crate::runner::{Completion, RequestOptions, Runner, RunnerConfig, StepStats, TokenLogprobs};
use crate::scheduler::{Event, Request, RequestId};
use crate::service::{Backend, BackendStats};

/// A model on one GPU or split over several ([`crate::tp`]).
// One per process: the size difference between the variants costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum AnyEngine<T: RunDType> {
    /// One GPU.
    One(Engine<T>),
    /// Tensor-parallel over several.
    Tp(TpEngine<T>),
}

impl<T: RunDType> From<Engine<T>> for AnyEngine<T> {
    fn from(e: Engine<T>) -> Self {
        AnyEngine::One(e)
    }
}

impl<T: RunDType> From<TpEngine<T>> for AnyEngine<T> {
    fn from(e: TpEngine<T>) -> Self {
        AnyEngine::Tp(e)
    }
}

impl<T: RunDType> AnyEngine<T> {
    /// The whole model's config.
    pub fn config(&self) -> &ModelConfig {
        match self {
            AnyEngine::One(e) => &e.model.cfg,
            AnyEngine::Tp(t) => t.config(),
        }
    }

    /// The config each GPU runs ([`super::Shard::local_config`]: its share of the heads and
    /// of the intermediate width; the whole model's on one GPU).
    pub fn rank_config(&self) -> ModelConfig {
        match self {
            AnyEngine::One(e) => e.model.cfg.clone(),
            AnyEngine::Tp(t) => super::Shard::new(0, t.size())
                .map(|s| s.local_config(t.config()))
                .unwrap_or_else(|_| t.config().clone()),
        }
    }

    /// GPUs the model spans.
    pub fn tp(&self) -> usize {
        match self {
            AnyEngine::One(_) => 1,
            AnyEngine::Tp(t) => t.size(),
        }
    }

    /// Weight bytes a decode step reads (on the busiest GPU).
    pub fn weight_bytes_per_step(&self) -> u64 {
        match self {
            AnyEngine::One(e) => e.model.weights.bytes_per_step(),
            AnyEngine::Tp(t) => t.weight_bytes_per_step(),
        }
    }

    /// Device-to-device copy bandwidth in bytes/s ([`Engine::copy_bandwidth`]; the slowest
    /// GPU's for a group, measured on all at once).
    pub fn copy_bandwidth(&mut self) -> Result<f64> {
        match self {
            AnyEngine::One(e) => e.copy_bandwidth(),
            AnyEngine::Tp(t) => Ok(t
                .on_engines(|e| e.copy_bandwidth())?
                .into_iter()
                .fold(f64::INFINITY, f64::min)),
        }
    }

    /// The single-GPU engine, for what only it runs (the static-batch `generate`).
    pub fn single(&mut self) -> Option<&mut Engine<T>> {
        match self {
            AnyEngine::One(e) => Some(e),
            AnyEngine::Tp(_) => None,
        }
    }

    /// A runner over the model ([`Runner::new`] / [`TpEngine::runner`]).
    pub fn runner(&mut self, cfg: &RunnerConfig) -> Result<AnyRunner<'_, T>> {
        Ok(match self {
            AnyEngine::One(e) => AnyRunner::One(Runner::new(e, cfg)?),
            AnyEngine::Tp(t) => AnyRunner::Tp(t.runner(cfg)?),
        })
    }
}

/// A [`Runner`] or a [`TpRunner`], with their common API.
#[allow(clippy::large_enum_variant)] // one per engine, as AnyEngine
pub enum AnyRunner<'e, T: RunDType> {
    /// One GPU.
    One(Runner<'e, T>),
    /// Tensor-parallel.
    Tp(TpRunner<'e, T>),
}

macro_rules! both {
    ($s:expr, $r:ident => $body:expr) => {
        match $s {
            AnyRunner::One($r) => $body,
            AnyRunner::Tp($r) => $body,
        }
    };
}

impl<T: RunDType> AnyRunner<'_, T> {
    /// [`Runner::add_request`].
    pub fn add_request(&mut self, req: Request<SamplingParams>) -> Result<()> {
        both!(self, r => r.add_request(req))
    }

    /// [`Runner::add_request_with`].
    pub fn add_request_with(
        &mut self,
        req: Request<SamplingParams>,
        opts: RequestOptions,
    ) -> Result<()> {
        both!(self, r => r.add_request_with(req, opts))
    }

    /// [`Runner::add_beam_request`].
    pub fn add_beam_request(
        &mut self,
        req: Request<SamplingParams>,
        beam: BeamParams,
    ) -> Result<()> {
        both!(self, r => r.add_beam_request(req, beam))
    }

    /// [`Runner::take_beams`].
    pub fn take_beams(&mut self, id: RequestId) -> Option<Vec<(Vec<u32>, f64)>> {
        both!(self, r => r.take_beams(id))
    }

    /// [`Runner::take_logits`].
    pub fn take_logits(&mut self, id: RequestId) -> Option<Vec<Vec<f32>>> {
        both!(self, r => r.take_logits(id))
    }

    /// [`Runner::next_logprobs`].
    pub fn next_logprobs(&mut self, id: RequestId) -> Option<TokenLogprobs> {
        both!(self, r => r.next_logprobs(id))
    }

    /// [`Runner::abort`].
    pub fn abort(&mut self, id: RequestId) -> Result<Event> {
        both!(self, r => r.abort(id))
    }

    /// [`Runner::step`].
    pub fn step(&mut self) -> Result<Vec<Event>> {
        both!(self, r => r.step())
    }

    /// [`Runner::has_unfinished`].
    pub fn has_unfinished(&self) -> bool {
        both!(self, r => r.has_unfinished())
    }

    /// [`Runner::last_step`].
    pub fn last_step(&self) -> StepStats {
        both!(self, r => r.last_step())
    }

    /// [`Runner::run_to_completion`].
    pub fn run_to_completion(&mut self) -> Result<Completion> {
        both!(self, r => r.run_to_completion())
    }

    /// Queue lengths and KV usage ([`Backend::stats`]).
    pub fn stats(&self) -> BackendStats {
        both!(self, r => Backend::stats(r))
    }
}

impl<T: RunDType> Backend for AnyRunner<'_, T> {
    fn add_request(&mut self, req: Request<SamplingParams>) -> Result<()> {
        AnyRunner::add_request(self, req)
    }

    fn add_beam_request(&mut self, req: Request<SamplingParams>, beam: BeamParams) -> Result<()> {
        AnyRunner::add_beam_request(self, req, beam)
    }

    fn take_beams(&mut self, id: RequestId) -> Option<Vec<(Vec<u32>, f64)>> {
        AnyRunner::take_beams(self, id)
    }

    fn next_logprobs(&mut self, id: RequestId) -> Option<TokenLogprobs> {
        AnyRunner::next_logprobs(self, id)
    }

    fn abort(&mut self, id: RequestId) -> Result<Event> {
        AnyRunner::abort(self, id)
    }

    fn step(&mut self) -> Result<Vec<Event>> {
        AnyRunner::step(self)
    }

    fn has_unfinished(&self) -> bool {
        AnyRunner::has_unfinished(self)
    }

    fn contains(&self, id: RequestId) -> bool {
        both!(self, r => Backend::contains(r, id))
    }

    fn stats(&self) -> BackendStats {
        AnyRunner::stats(self)
    }
}
