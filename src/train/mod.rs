//! `prep train` and `prep eval`: the training loop over the input pipeline, SGD with Nesterov
//! momentum and weight decay, a one-cycle learning rate, on-device augmentation, evaluation every
//! epoch, checkpoints that resume mid-epoch, and the run's outputs.

pub mod checkpoint;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod input;
pub mod plan;
pub mod plot;
pub mod plot_masks;
pub mod scores;
pub mod timing;

mod device;
mod epochs;
mod eval;
mod feed;
mod folder;
mod metrics;
mod recipe;
mod schedule;
pub mod task;

pub use device::{gpu_count, pick_device};
use epochs::run;
pub use epochs::{run_on, RunCtx};
pub use eval::{eval, Evaluation, TaskScores, Tested};
use feed::norm_std;
pub use feed::{Feed, HostFeed};
pub use folder::{clear_run, RUN_FILES};
use folder::{interrupted_note, next_run_dir};
pub use metrics::{EpochMetrics, Summary};
pub use recipe::{data_identity, read_recipe, Recipe};
use recipe::{extend, resume_data};
pub(crate) use schedule::augmentation;
pub use schedule::one_cycle;
pub use task::{Task, TaskKind};

use crate::format::shard::{Dtype, Shape};
use crate::nn::architecture::init_values;
use crate::nn::cpu::Cpu;
use crate::nn::{Aug, Backend, Model, ModelConfig, RawBatch};
use crate::store::output::write_atomic;
use crate::util::error::shown_path;
use crate::util::error::{Error, IoContext, Result};
use checkpoint::Cursor;
use input::{mix, Data, EpochPlan, Known, Layout, OnDamage, Share, Source};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

#[derive(Debug, Clone)]
pub struct TrainOptions {
    pub data: PathBuf,
    /// Sample shape of column-major files without a manifest (which do not say it).
    pub shape: Option<Shape>,
    pub out: Option<PathBuf>,
    pub resume: Option<PathBuf>,
    /// A model of `nn::architecture::MODELS`; none: the task's (`TaskKind::default_model`).
    pub model: Option<String>,
    /// U-Net base width (channels of its first level); none: 32.
    pub width: Option<usize>,
    /// `class`, `mask`, `labels`, `values` or a field's name; none: what the data holds.
    pub task: Option<String>,
    /// Loss of a values task: `mse` (default) or `smooth-l1`.
    pub loss: Option<String>,
    /// Epochs of a new run. With `resume`: more than the run's extends it to this many (`extend`);
    /// as many or fewer keeps the run's own.
    pub epochs: usize,
    pub batch: usize,
    /// Peak learning rate; none: the model's (`nn::architecture::default_lr`).
    pub lr: Option<f32>,
    pub momentum: f32,
    pub weight_decay: f32,
    pub label_smoothing: f32,
    pub seed: u64,
    pub augment: bool,
    pub checkpoint_every: usize,
    pub device: String,
    /// GPU input pipeline: auto, device, stream or managed.
    pub memory: String,
    /// GPU arithmetic: bf16 (mixed precision, float32 master weights) or f32.
    pub precision: String,
    pub skip_damaged: bool,
    pub quiet: bool,
    /// Stop after this many optimiser steps in this process (for tests of resuming).
    pub stop_after: Option<usize>,
    /// This process's place in a data-parallel world (`dist::from_env`); `None` for one process.
    /// `device` is then this rank's GPU.
    pub world: Option<crate::dist::World>,
    /// Synchronised batch norm across the ranks (`--sync-bn`).
    pub sync_bn: bool,
}

pub struct Trained {
    pub dir: PathBuf,
    pub summary: Option<Summary>,
}

pub fn train(o: &TrainOptions) -> Result<Trained> {
    timing::mark("training begins");
    crate::util::mem::purge_freed_memory_at_once();
    let world = o.world.as_ref().map_or(1, |w| w.size);
    // Rank 0 alone writes the run folder; the other ranks only read (a checkpoint to resume).
    let writer = o.world.as_ref().is_none_or(|w| w.rank == 0);
    let Some(dir) = &o.resume else {
        return train_new(o, world, writer);
    };
    let Resumed {
        lock,
        recipe,
        state,
        data,
    } = open_resumed(o, dir, world, writer)?;
    let r = run(o, dir, &recipe, Some(state), data);
    drop(lock);
    r.map_err(|e| e.when_interrupted(|| interrupted_note(dir)))
}

/// A run to resume, as read from its folder.
struct Resumed {
    /// The run folder's lock (rank 0 only).
    lock: Option<crate::format::lock::DirLock>,
    recipe: Recipe,
    state: (Vec<(String, Vec<f32>)>, Cursor),
    data: Data,
}

/// Open the run in `dir` to resume: its lock, recipe (extended if asked), checkpoint and data.
fn open_resumed(o: &TrainOptions, dir: &Path, world: usize, writer: bool) -> Result<Resumed> {
    if !dir.is_dir() {
        return Err(Error::Invalid(format!(
            "--resume {}: no such run folder",
            shown_path(&dir)
        )));
    }
    // One writer per run folder (rank 0 of several); held until `train` returns.
    let lock = if writer {
        Some(crate::format::lock::lock_dir(dir)?)
    } else {
        None
    };
    let mut recipe = resumed_recipe(o, dir, world)?;
    check_has_checkpoint(dir, &recipe)?;
    let state = checkpoint::load(&dir.join(checkpoint::FILE))?;
    // Checked before an extension rewrites the config.
    let data = resume_data(&recipe, &o.data, dir)?;
    if o.epochs > recipe.epochs {
        extend(dir, &mut recipe, o, &state.1, writer)?;
    } else if state.1.epoch >= recipe.epochs && !o.quiet {
        eprintln!(
            "{} is finished ({} of {} epochs): its test figures are computed again; --epochs N (more than {}) trains it further",
            shown_path(dir),
            state.1.epoch,
            recipe.epochs,
            recipe.epochs
        );
    }
    Ok(Resumed {
        lock,
        recipe,
        state,
        data,
    })
}

/// The recipe of the run in `dir`, checked against this world and moved to this process's GPU.
fn resumed_recipe(o: &TrainOptions, dir: &Path, world: usize) -> Result<Recipe> {
    let mut recipe = read_recipe(dir)?;
    if recipe.world != world {
        return Err(Error::Invalid(format!(
            "--resume {}: the run was trained by {} rank(s) (GPUs), this one has {world}; resume it with {} (each rank's share of the data and its batch depend on the number)",
            shown_path(dir),
            recipe.world,
            recipe.world
        )));
    }
    let cuda = |d: &str| d == "cuda" || d.starts_with("cuda:");
    if o.world.is_some() || (cuda(&o.device) && cuda(&recipe.device)) {
        // Each rank's own GPU, not the one rank 0 recorded; a run of one process may
        // move to another GPU (where it runs, not how).
        recipe.device = pick_device(&o.device, o.quiet)?;
    } else if o.device != "auto" && o.device != recipe.device {
        return Err(Error::Invalid(format!(
            "--device {} differs from the run's {}; a resumed run keeps its settings",
            o.device, recipe.device
        )));
    }
    Ok(recipe)
}

/// Refuse to resume a run that stopped before its first checkpoint.
fn check_has_checkpoint(dir: &Path, recipe: &Recipe) -> Result<()> {
    if !dir.join(checkpoint::FILE).exists() {
        return Err(Error::Invalid(format!(
            "--resume {}: the run stopped before its first checkpoint (killed?), so there is nothing to continue; start it afresh with prep train {} --out {} --force",
            shown_path(dir),
            shown_path(&recipe.data),
            shown_path(dir)
        )));
    }
    Ok(())
}

/// A new run: its recipe, its folder (rank 0), then the training.
fn train_new(o: &TrainOptions, world: usize, writer: bool) -> Result<Trained> {
    let data = open_data(o)?;
    let recipe = new_recipe(o, &data, world)?;
    if !writer {
        let dir = o.out.clone().unwrap_or_default();
        return run(o, &dir, &recipe, None, data);
    }
    // One writer per run folder, taken before the folder is looked at; released (and the
    // folder removed if this run created it and left it empty) when this returns.
    let (dir, lock) = lock_run_dir(o)?;
    check_no_run_in(&dir)?;
    let created = lock.created();
    write_atomic(
        &dir.join("config.json"),
        serde_json::to_string_pretty(&recipe).unwrap().as_bytes(),
    )?;
    let r = run(o, &dir, &recipe, None, data);
    timing::mark("backend closed");
    // A run that failed before its first checkpoint (a batch too large for the GPU, say)
    // leaves nothing behind, so that the same command with the fix can run again.
    if r.is_err() && !dir.join(checkpoint::FILE).exists() {
        for f in ["config.json", "metrics.jsonl", "cudnn-algos.tsv"] {
            let _ = std::fs::remove_file(dir.join(f));
        }
        if created {
            drop(lock);
            let _ = std::fs::remove_dir(&dir);
        }
    }
    r.map_err(|e| e.when_interrupted(|| interrupted_note(&dir)))
}

/// Open the dataset of a new run, telling its notes.
fn open_data(o: &TrainOptions) -> Result<Data> {
    let data = Data::open(&o.data, o.shape.as_ref(), None)?;
    timing::mark("data opened");
    if !o.quiet {
        for n in &data.notes {
            eprintln!("input: {n}");
        }
    }
    Ok(data)
}

/// A new run's recipe: the model for the data's images, the device, and the options.
fn new_recipe(o: &TrainOptions, data: &Data, world: usize) -> Result<Recipe> {
    let dims = &data.spec.shape.0;
    if dims.len() != 3 {
        return Err(Error::Invalid(format!(
            "model `{}` takes CxHxW images; this dataset's samples are {}",
            o.model.as_deref().unwrap_or("small"),
            data.spec.shape
        )));
    }
    let (c, h, w) = (dims[0] as usize, dims[1] as usize, dims[2] as usize);
    let manifest = match data.layout {
        Layout::Shards => Some(crate::format::shard::Manifest::read(&o.data)?),
        Layout::Colmajor => None,
    };
    let task = Task::choose(
        o.task.as_deref(),
        manifest.as_ref(),
        &o.data,
        o.loss.as_deref(),
    )?;
    let name = o
        .model
        .clone()
        .unwrap_or_else(|| task.kind.default_model().to_string());
    task.check_model(&name)?;
    if o.width.is_some() && name != "unet" {
        return Err(Error::Invalid(format!(
            "--width sets the U-Net's channels; --model {name} has fixed ones"
        )));
    }
    let outputs = task.outputs(data.classes.len());
    let mut model = ModelConfig::new(&name, c, h, w, outputs)
        .map_err(|e| Error::Invalid(format!("{}: {e}", shown_path(&o.data))))?;
    model.base_width = o.width;
    if !o.quiet && task.kind != TaskKind::Class {
        eprintln!(
            "task: {} (field `{}`: {}) with --model {name}",
            task.kind.name(),
            task.field.as_deref().unwrap_or(""),
            task.names.join(", ")
        );
    }
    let device = pick_device(&o.device, o.quiet)?;
    timing::mark("device probed");
    Ok(Recipe {
        data: o.data.clone(),
        lr: o.lr.unwrap_or_else(|| task.default_lr(&name)),
        model,
        task,
        epochs: o.epochs,
        batch: o.batch,
        momentum: o.momentum,
        weight_decay: o.weight_decay,
        label_smoothing: o.label_smoothing,
        seed: o.seed,
        crop_pad: if o.augment {
            (h.min(w) as f32 / 12.0).round().max(1.0) as usize
        } else {
            0
        },
        flip: o.augment,
        augment_epochs: if o.augment {
            o.epochs.saturating_sub(o.epochs.div_ceil(10)).max(1)
        } else {
            0
        },
        checkpoint_every: o.checkpoint_every,
        precision: if device == "cpu" {
            "f32".into()
        } else {
            o.precision.clone()
        },
        device,
        skip_damaged: o.skip_damaged,
        world,
        sync_bn: o.sync_bn,
        mean: data.mean.iter().map(|&v| v as f32).collect(),
        std: data
            .std
            .iter()
            .map(|&v| norm_std(v, data.spec.dtype))
            .collect(),
        classes: data.classes.clone(),
        tool: format!("prep {}", env!("CARGO_PKG_VERSION")),
        layout: data.layout,
        input_dtype: (data.layout == Layout::Colmajor).then_some(data.spec.dtype),
        data_id: data_identity(data)?,
    })
}

/// The new run's folder (`--out`, or the next free runs/NNN), locked.
fn lock_run_dir(o: &TrainOptions) -> Result<(PathBuf, crate::format::lock::DirLock)> {
    Ok(match &o.out {
        Some(d) => (d.clone(), crate::format::lock::lock_dir(d)?),
        // Two runs started at once may pick the same free runs/NNN: the one that does
        // not get its lock, or finds it already used, takes the next.
        None => {
            let mut tries = 0;
            loop {
                let d = next_run_dir()?;
                match crate::format::lock::lock_dir(&d) {
                    Ok(l) if !d.join("config.json").exists() => break (d, l),
                    Ok(_) | Err(Error::Busy(_)) if tries < 100 => tries += 1,
                    Ok(_) => break (d.clone(), crate::format::lock::lock_dir(&d)?),
                    Err(e) => return Err(e),
                }
            }
        }
    })
}

/// Refuse a folder that already holds a run.
fn check_no_run_in(dir: &Path) -> Result<()> {
    if dir.join("config.json").exists() {
        return Err(Error::Invalid(if dir.join(checkpoint::FILE).exists() {
            format!(
                "{} already holds a run; use --resume {} to continue it, --force to start afresh there, or another --out",
                shown_path(&dir),
                shown_path(&dir)
            )
        } else {
            format!(
                "{} holds a run that stopped before its first checkpoint (killed?); pass --force to start it afresh",
                shown_path(&dir)
            )
        }));
    }
    Ok(())
}
