//! From a `--model` argument to a running [`Engine`]: a model directory (config.json,
//! safetensors, optional tokenizer.json), a GGUF file (`*.gguf`: config, weights and tokenizer
//! from the file) or a preset name with dummy weights.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};

use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::dtype::RunDType;
use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::linear::Quant;
use crate::presets;
use crate::tokenizer::Tokenizer;
use crate::tp::{AnyEngine, Shard, TpEngine, TpOptions};
use crate::weights::WeightSource;

/// A resolved `--model`: its config, and for a directory its checkpoint and tokenizer.
pub struct Loaded {
    /// The configuration.
    pub cfg: ModelConfig,
    /// The directory, `None` for a preset.
    pub dir: Option<PathBuf>,
    /// The checkpoint, `None` for a preset (dummy weights).
    pub checkpoint: Option<Checkpoint>,
    /// `tokenizer.json` when the directory has one; a GGUF file's tokenizer.
    pub tokenizer: Option<Tokenizer>,
    /// The GGUF file, when `--model` named one.
    pub gguf: Option<crate::gguf::GgufFile>,
    /// How the decoder's projections are loaded (`--quant`).
    pub quant: Quant,
}

/// The `--quant` value that picks the model's own form: [`Quant::Gguf`] for a GGUF file,
/// [`Quant::None`] for the rest.
pub const QUANT_AUTO: &str = "auto";

/// Every value `fl --quant` takes: [`QUANT_AUTO`] (the default), `gguf`, then
/// [`Quant::NAMES`].
pub const QUANT_ARGS: &[&str] = &[
    QUANT_AUTO, "gguf", "none", "int8", "int4", "int4-g64", "int4-g32", "q8_0", "q4_0", "q4_k",
    "q5_k", "q6_k", "w8a8",
];

/// Resolves `model` (a directory, a `.gguf` file, else a preset name) and checks `quant` (one
/// of [`QUANT_ARGS`]) against it. For a GGUF file, [`QUANT_AUTO`] and `gguf` run its
/// projections on their own formats ([`crate::gguf::native`]), `none` dequantises them to the
/// run dtype, and the other modes requantise the dequantised values; elsewhere `auto` is
/// `none`.
///
/// Errors: a path that is neither a directory nor a preset names both possibilities; a
/// config or checkpoint error names the file and field or tensor; every tensor is checked
/// (names, shapes, dtypes, byte ranges) before anything is uploaded; an unknown `--quant`
/// value, `gguf` for a model that is not a GGUF file, or a mode the model's shapes cannot
/// take ([`Quant::check`]), names `--quant`.
///
/// ```
/// use fl_engine::linear::Quant;
/// assert_eq!(fl_engine::load::resolve("tiny", "auto")?.quant, Quant::None);
/// assert!(fl_engine::load::resolve("tiny", "gguf").is_err());
/// # Ok::<(), fl_engine::EngineError>(())
/// ```
pub fn resolve(model: &str, quant: &str) -> Result<Loaded> {
    let path = Path::new(model);
    let is_gguf = path.is_file()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    let quant = match quant {
        QUANT_AUTO if is_gguf => Quant::Gguf,
        QUANT_AUTO => Quant::None,
        q => Quant::parse(q).map_err(|_| {
            EngineError::invalid(
                "--quant",
                format!("`{q}` is not one of {}", QUANT_ARGS.join(", ")),
            )
        })?,
    };
    if quant == Quant::Gguf && !is_gguf {
        return Err(EngineError::invalid(
            "--quant",
            format!("`gguf` runs a GGUF file's own formats; `{model}` is not a .gguf file"),
        ));
    }
    if is_gguf {
        let f = crate::gguf::GgufFile::open(path)?;
        let cfg = f.model_config()?;
        f.check_tensors(&cfg)?;
        quant.check(&cfg)?;
        let tokenizer = match f.tokenizer_spec() {
            Ok(spec) => {
                let t = crate::gguf::tokenizer::build(&spec)
                    .map_err(|e| EngineError::invalid("--model", e.to_string()))?;
                Some(Tokenizer::from_tokenizers(t, path.to_path_buf()))
            }
            // A file without a vocabulary runs on token ids.
            Err(crate::gguf::GgufError::MissingKey { .. }) => None,
            Err(e) => return Err(e.into()),
        };
        return Ok(Loaded {
            cfg,
            dir: None,
            checkpoint: None,
            tokenizer,
            gguf: Some(f),
            quant,
        });
    }
    if path.is_dir() {
        let cfg = ModelConfig::from_model_dir(path)?;
        quant.check(&cfg)?;
        let ck = Checkpoint::open(path)?;
        ck.check_all(&cfg)?;
        let tokenizer = Tokenizer::from_model_dir(path)?;
        return Ok(Loaded {
            cfg,
            dir: Some(path.to_path_buf()),
            checkpoint: Some(ck),
            tokenizer,
            gguf: None,
            quant,
        });
    }
    match presets::preset(model) {
        Ok(cfg) => {
            quant.check(&cfg)?;
            Ok(Loaded {
                cfg,
                dir: None,
                checkpoint: None,
                tokenizer: None,
                gguf: None,
                quant,
            })
        }
        Err(_) => Err(EngineError::invalid(
            "--model",
            format!(
                "`{model}` is neither a model directory, a .gguf file nor a preset ({})",
                presets::preset_names().join(", ")
            ),
        )),
    }
}

/// Loads `m` onto GPU 0 in dtype `T` (projections per `m.quant`) with a progress bar on
/// stderr. A GGUF file in [`Quant::Gguf`] first prints one `note:` line per tensor type that
/// does not run as stored ([`crate::gguf::native::notices`]); in `f32` it loads dense (the
/// quantised kernels are 16-bit only; f32 runs are checks against an fp32 reference).
pub fn engine<T: RunDType>(m: &Loaded, graph: bool) -> Result<Engine<T>> {
    let (quant, total) = load_plan::<T>(m, Shard::SINGLE)?;
    let bar = progress_bar(total);
    let mut tick = |done: u64, _total: u64| bar.set_position(done);
    let mut e = Engine::<T>::load_quant(0, m.cfg.clone(), source(m), quant, Some(&mut tick))?;
    bar.finish_and_clear();
    e.use_graph = graph;
    Ok(e)
}

/// [`engine`] on one GPU (`tp` = 1), or split over GPUs `0..tp` ([`crate::tp`]): each rank
/// reads its shard of the same checkpoint (memory-mapped, shared by the rank threads);
/// rank 0 draws the progress bar.
///
/// Errors: those of [`engine`] and [`TpEngine::load`] (`--tp` naming what does not split,
/// NCCL missing, a rank's load error).
pub fn any_engine<T: RunDType>(m: &Arc<Loaded>, tp: usize, graph: bool) -> Result<AnyEngine<T>> {
    if tp <= 1 {
        return Ok(AnyEngine::One(engine(m, graph)?));
    }
    let rank0 = Shard::new(0, tp)?;
    rank0.check(&m.cfg)?;
    let (quant, total) = load_plan::<T>(m, rank0)?;
    crate::engine::tp_quant_check(quant)?;
    let bar = progress_bar(total);
    let shared = Arc::clone(m);
    let bar_rank0 = bar.clone();
    let opts = TpOptions::first(tp);
    let tpe = TpEngine::<T>::load(m.cfg.clone(), opts, move |dev, comm| {
        let rank0 = comm.rank() == 0;
        let mut tick = |done: u64, _total: u64| {
            if rank0 {
                bar_rank0.set_position(done)
            }
        };
        let mut e = Engine::<T>::load_shard(
            dev,
            shared.cfg.clone(),
            source(&shared),
            quant,
            comm,
            Some(&mut tick),
        )?;
        e.use_graph = graph;
        Ok(e)
    })?;
    bar.finish_and_clear();
    Ok(AnyEngine::Tp(tpe))
}

/// Where `m`'s weights come from.
fn source(m: &Loaded) -> WeightSource<'_> {
    match &m.checkpoint {
        Some(ck) => WeightSource::Checkpoint(ck),
        None => match &m.gguf {
            Some(f) => WeightSource::Gguf(f),
            None => WeightSource::Dummy { seed: 1 },
        },
    }
}

fn progress_bar(total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("loading {bar:40} {bytes}/{total_bytes} ({eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// The mode `m`'s projections load in and the bytes one rank loads (GGUF native blocks only
/// in 16-bit runs; notices about them printed).
fn load_plan<T: RunDType>(m: &Loaded, shard: Shard) -> Result<(Quant, u64)> {
    let dtype_bytes = std::mem::size_of::<T>();
    let f32_run = <T as fl_kernels::DType>::NAME == "f32";
    let plan = match (m.quant, &m.gguf) {
        (Quant::Gguf, Some(f)) if !f32_run => Some(crate::gguf::native::plan(f, &m.cfg)?),
        _ => None,
    };
    Ok(match &plan {
        Some(p) => {
            for line in crate::gguf::native::notices(p)
                .into_iter()
                .chain(crate::gguf::native::shard_notices(p, shard.size))
            {
                eprintln!("note: {line}");
            }
            let mut total = crate::gguf::native::weight_bytes(p, &m.cfg, dtype_bytes);
            if !shard.is_single() {
                // One rank's part, for the progress bar: the whole file's bytes scaled by the
                // rank's share of the parameters.
                let (part, whole) = (
                    shard.local_config(&m.cfg).param_count(),
                    m.cfg.param_count().max(1),
                );
                total = (total as u128 * part as u128 / whole as u128) as u64;
            }
            (Quant::Gguf, total)
        }
        None => {
            let q = if m.quant == Quant::Gguf {
                Quant::None
            } else {
                m.quant
            };
            (q, q.weight_bytes(&shard.local_config(&m.cfg), dtype_bytes))
        }
    })
}
