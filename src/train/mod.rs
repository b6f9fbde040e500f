//! `prep train` and `prep eval`: the training loop over the input pipeline, SGD with Nesterov
//! momentum and weight decay, a one-cycle learning rate, on-device augmentation, evaluation every
//! epoch, checkpoints that resume mid-epoch, and the run's outputs.

pub mod checkpoint;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod input;
pub mod plan;
pub mod plot;
pub mod timing;

use crate::format::shard::{Dtype, Shape};
use crate::nn::cpu::Cpu;
use crate::nn::model::init_values;
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

/// Recipes written before `precision` was recorded ran in bfloat16 on a GPU.
fn bf16() -> String {
    "bf16".into()
}

/// Recipes written before `world` was recorded ran in one process.
fn one() -> usize {
    1
}

/// The recipe. Saved as `config.json` in the run folder; `--resume` continues with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recipe {
    pub data: PathBuf,
    pub model: ModelConfig,
    pub epochs: usize,
    pub batch: usize,
    /// Peak learning rate of the one-cycle schedule.
    pub lr: f32,
    pub momentum: f32,
    pub weight_decay: f32,
    pub label_smoothing: f32,
    pub seed: u64,
    /// Padding of the random crop, in pixels (0: no crop).
    pub crop_pad: usize,
    pub flip: bool,
    /// Epochs trained with augmentation; the rest (the last tenth, at least one epoch when there
    /// are two or more) train on clean samples, which settles the weights on the data as it is.
    pub augment_epochs: usize,
    /// Steps between mid-epoch checkpoints (0: only at the end of each epoch).
    pub checkpoint_every: usize,
    pub device: String,
    /// Arithmetic on a GPU: bf16 (float32 master weights) or f32; the CPU computes in float32.
    #[serde(default = "bf16")]
    pub precision: String,
    pub skip_damaged: bool,
    /// Ranks (GPUs) of a data-parallel run, 1 for one process. `--batch` is per rank, and each
    /// rank reads its own share of the block order, so `--resume` needs the same number.
    #[serde(default = "one")]
    pub world: usize,
    /// Batch-norm statistics over all ranks' batches (`--sync-bn`) rather than each rank's own.
    #[serde(default)]
    pub sync_bn: bool,
    /// Per-channel mean and std of the training split, from the manifest (or computed in one
    /// pass over column-major files without one).
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
    pub classes: Vec<String>,
    pub tool: String,
    /// How the data directory stores its samples (runs before this was recorded read shards).
    #[serde(default)]
    pub layout: Layout,
    /// The dtype samples were read as: a column-major directory without a manifest is then not
    /// scanned again by `--resume` and `eval`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_dtype: Option<Dtype>,
    /// What the data trained on holds (`data_identity`), so that `--resume` with a DATA argument
    /// (or data changed in place) is checked to be the same; absent for runs made before it was
    /// recorded and for column-major files without a manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_id: Option<String>,
}

/// A run folder's recipe (`config.json`), read with the caps every run file is read with.
pub fn read_recipe(dir: &Path) -> Result<Recipe> {
    let cfg = dir.join("config.json");
    serde_json::from_slice(&crate::store::local::read_capped(
        &cfg,
        crate::store::local::JSON_CAP,
        "a run's config",
    )?)
    .map_err(|e| Error::manifest(&cfg, e.to_string()))
}

/// What identifies the samples of a dataset wherever it lies and whatever command wrote it: an
/// xxh3 of its sample shape, classes and splits (for shards each shard's footer checksum, which
/// covers every block; for column-major files their counts and statistics). None for
/// column-major files without a manifest, which record nothing to compare.
pub fn data_identity(data: &Data) -> Result<Option<String>> {
    if !data.manifest {
        return Ok(None);
    }
    let v = match data.layout {
        Layout::Shards => {
            let m = crate::format::shard::Manifest::read(&data.dir)?;
            let splits: Vec<_> = m
                .splits
                .iter()
                .map(|(name, s)| {
                    let shards: Vec<_> = s
                        .shards
                        .iter()
                        .map(|sh| (sh.samples, &sh.footer_xxh3))
                        .collect();
                    (name, s.samples, &s.class_counts, shards)
                })
                .collect();
            serde_json::json!({"sample": m.sample, "classes": m.classes, "splits": splits})
        }
        Layout::Colmajor => {
            let m = crate::format::colmajor::ColmajorManifest::read(&data.dir)?;
            let splits: Vec<_> = m
                .splits
                .iter()
                .map(|(name, s)| (name, s.samples, &s.class_counts))
                .collect();
            serde_json::json!({
                "sample": m.sample, "classes": m.classes, "splits": splits,
                "mean": m.mean, "std": m.std,
            })
        }
    };
    Ok(Some(format!(
        "{:016x}",
        xxhash_rust::xxh3::xxh3_64(v.to_string().as_bytes())
    )))
}

#[derive(Debug, Clone)]
pub struct TrainOptions {
    pub data: PathBuf,
    /// Sample shape of column-major files without a manifest (which do not say it).
    pub shape: Option<Shape>,
    pub out: Option<PathBuf>,
    pub resume: Option<PathBuf>,
    /// `small` or `resnet18` (`nn::model::MODELS`).
    pub model: String,
    /// Epochs of a new run. With `resume`: more than the run's extends it to this many (`extend`);
    /// as many or fewer keeps the run's own.
    pub epochs: usize,
    pub batch: usize,
    pub lr: f32,
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

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EpochMetrics {
    pub epoch: usize,
    pub train_loss: f64,
    pub train_accuracy: f64,
    pub test_loss: f64,
    pub test_accuracy: f64,
    pub lr: f32,
    pub samples_per_sec: f64,
    pub seconds: f64,
    pub host_rss_bytes: u64,
    pub gpu_mem_bytes: u64,
    pub damaged_blocks_skipped: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    pub test_accuracy: f64,
    pub test_loss: f64,
    pub epochs: usize,
    pub samples_per_sec: f64,
    pub seconds: f64,
    pub peak_rss_bytes: u64,
    pub peak_gpu_mem_bytes: u64,
    pub device: String,
    /// The layout of the data trained on: shards or colmajor.
    pub layout: Layout,
    pub confusion: Vec<Vec<u64>>,
    pub classes: Vec<String>,
    /// Seconds from the process's start to its first training step (issue 24: what a run costs
    /// before it trains; 0 in files written before this field).
    #[serde(default)]
    pub startup_s: f64,
}

/// One-cycle: linear warm-up from lr/25 over the first 25% of steps, then linear decay to 0.
pub fn one_cycle(step: usize, total: usize, lr: f32) -> f32 {
    let total = total.max(1) as f32;
    let warm = (0.25 * total).max(1.0);
    let s = step as f32;
    if s < warm {
        lr * (0.04 + 0.96 * s / warm)
    } else {
        lr * (1.0 - (s - warm) / (total - warm).max(1.0)).max(0.0)
    }
}

fn next_run_dir() -> Result<PathBuf> {
    let root = Path::new("runs");
    std::fs::create_dir_all(root).at(root)?;
    for i in 1.. {
        let p = root.join(format!("{i:03}"));
        if !p.exists() {
            return Ok(p);
        }
    }
    unreachable!()
}

/// Per-sample augmentation for sample `i` of batch `b` of `epoch`: a pure function of the seed.
pub(crate) fn augmentation(r: &Recipe, epoch: usize, b: usize, n: usize) -> Vec<Aug> {
    (0..n)
        .map(|i| {
            let h = mix(r.seed ^ mix((epoch as u64) << 40 ^ (b as u64) << 16 ^ i as u64 ^ 0x5151));
            let span = 2 * r.crop_pad as u64 + 1;
            Aug {
                dy: (h % span) as u8,
                dx: ((h >> 16) % span) as u8,
                flip: r.flip && (h >> 32) & 1 == 1,
            }
        })
        .collect()
}

/// GPUs the CUDA driver sees, or why it cannot count them (no driver; a build without CUDA).
///
/// Test-only: `PREP_TEST_FAKE_GPUS=N` says N, so that a machine without a GPU can check what
/// `--gpus` does with them up to the first use of a device (the ranks it starts fail there).
pub fn gpu_count() -> std::result::Result<usize, String> {
    if let Ok(n) = std::env::var("PREP_TEST_FAKE_GPUS") {
        return n
            .parse()
            .map_err(|_| format!("PREP_TEST_FAKE_GPUS={n} is not a count"));
    }
    #[cfg(feature = "cuda")]
    {
        crate::nn::cuda::device_count()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err("this build of prep has no CUDA backend (built without the `cuda` feature)".into())
    }
}

/// The backend named by `--device`: `cpu`, `cuda[:N]`, or `auto` (the first GPU when a driver
/// and a device are there, else the CPU with a one-line notice).
pub fn pick_device(device: &str, quiet: bool) -> Result<String> {
    let cuda = |ordinal: usize| -> std::result::Result<String, String> {
        #[cfg(feature = "cuda")]
        {
            crate::nn::cuda::probe(ordinal)
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = ordinal;
            Err("this build of prep has no CUDA backend (built without the `cuda` feature)".into())
        }
    };
    match device {
        "cpu" => Ok("cpu".into()),
        "auto" => match cuda(0) {
            Ok(name) => {
                if !quiet {
                    eprintln!("device: cuda:0 ({name})");
                }
                Ok("cuda:0".into())
            }
            Err(why) => {
                if !quiet {
                    eprintln!("device: no usable GPU ({why}); training on the CPU");
                }
                Ok("cpu".into())
            }
        },
        d if d == "cuda" || d.starts_with("cuda:") => {
            let ordinal = match d.strip_prefix("cuda:") {
                None => 0,
                Some(i) => i.parse::<usize>().map_err(|_| {
                    Error::Invalid(format!("--device {d}: expected cuda or cuda:N"))
                })?,
            };
            match cuda(ordinal) {
                Ok(name) => {
                    if !quiet {
                        eprintln!("device: cuda:{ordinal} ({name})");
                    }
                    Ok(format!("cuda:{ordinal}"))
                }
                Err(why) => Err(Error::Device(format!(
                    "--device {d}: {why}; use --device cpu (or auto) to run on the CPU"
                ))),
            }
        }
        d => Err(Error::Invalid(format!(
            "--device {d}: expected auto, cpu or cuda[:N]"
        ))),
    }
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
    let lock: Option<crate::format::lock::DirLock>;
    let (dir, recipe, resume_state, data) = match &o.resume {
        Some(dir) => {
            if !dir.is_dir() {
                return Err(Error::Invalid(format!(
                    "--resume {}: no such run folder",
                    shown_path(&dir)
                )));
            }
            // One writer per run folder (rank 0 of several); held until this function returns.
            lock = if writer {
                Some(crate::format::lock::lock_dir(dir)?)
            } else {
                None
            };
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
            if !dir.join(checkpoint::FILE).exists() {
                return Err(Error::Invalid(format!(
                    "--resume {}: the run stopped before its first checkpoint (killed?), so there is nothing to continue; start it afresh with prep train {} --out {} --force",
                    shown_path(dir),
                    shown_path(&recipe.data),
                    shown_path(dir)
                )));
            }
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
            (dir.clone(), recipe, Some(state), data)
        }
        None => {
            let data = Data::open(&o.data, o.shape.as_ref(), None)?;
            timing::mark("data opened");
            if !o.quiet {
                for n in &data.notes {
                    eprintln!("input: {n}");
                }
            }
            let dims = &data.spec.shape.0;
            if dims.len() != 3 {
                return Err(Error::Invalid(format!(
                    "model `{}` takes CxHxW images; this dataset's samples are {}",
                    o.model, data.spec.shape
                )));
            }
            let (c, h, w) = (dims[0] as usize, dims[1] as usize, dims[2] as usize);
            let model = ModelConfig::new(&o.model, c, h, w, data.classes.len())
                .map_err(|e| Error::Invalid(format!("{}: {e}", shown_path(&o.data))))?;
            let device = pick_device(&o.device, o.quiet)?;
            timing::mark("device probed");
            let recipe = Recipe {
                data: o.data.clone(),
                model,
                epochs: o.epochs,
                batch: o.batch,
                lr: o.lr,
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
                data_id: data_identity(&data)?,
            };
            if !writer {
                let dir = o.out.clone().unwrap_or_default();
                return run(o, &dir, &recipe, None, data);
            }
            // One writer per run folder, taken before the folder is looked at; released (and the
            // folder removed if this run created it and left it empty) when this returns.
            let (dir, lock) = match &o.out {
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
            };
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
            return r.map_err(|e| e.when_interrupted(|| interrupted_note(&dir)));
        }
    };
    let r = run(o, &dir, &recipe, resume_state, data);
    drop(lock);
    r.map_err(|e| e.when_interrupted(|| interrupted_note(&dir)))
}

/// Refuse before the first step a CPU batch whose activations cannot fit in the memory left
/// (the kernel would kill the run without a word), naming a batch that fits, as the GPU does.
fn check_cpu_memory(r: &Recipe, sample_bytes: usize) -> Result<()> {
    let Some(avail) = crate::util::mem::available_bytes() else {
        return Ok(());
    };
    // Float32 activations and their gradients (measured: 630 KB a sample for `small` at 1x28x28
    // against 712 KB estimated), the weights, and the batch's input several times over.
    let need = |b: usize| {
        r.model.parameter_bytes()
            + r.model.activation_bytes(b, 4)
            + 4 * (b * sample_bytes.max(1) * 4) as u64
    };
    // A tenth kept for the readers, the allocator and everything else on the machine.
    let budget = avail - avail / 10;
    if need(r.batch) <= budget {
        return Ok(());
    }
    // The need grows with the batch: the largest that fits, by bisection.
    let fits = (need(1) <= budget).then(|| {
        let (mut lo, mut hi) = (1, r.batch);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if need(mid) <= budget {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    });
    Err(Error::Invalid(format!(
        "model `{}` on {}x{}x{} images at batch {} needs about {} of memory on the CPU, more than the {} this machine has free; {}",
        r.model.name,
        r.model.channels,
        r.model.height,
        r.model.width,
        r.batch,
        crate::util::mem::human(need(r.batch)),
        crate::util::mem::human(avail),
        match fits {
            Some(b) => format!("use --batch {b} or less"),
            None => "no batch size fits: use smaller images (prep convert --size)".into(),
        }
    )))
}

/// The files a run writes in its folder.
pub const RUN_FILES: [&str; 8] = [
    "config.json",
    checkpoint::FILE,
    "metrics.jsonl",
    "summary.json",
    "curves.png",
    "confusion.png",
    "confusion.csv",
    "cudnn-algos.tsv",
];

/// `train --force`: remove the run files of `dir` (nothing else in it), so that a new run can
/// start there. Refused while another prep writes the folder.
pub fn clear_run(dir: &Path) -> Result<()> {
    if !dir.is_dir() {
        return Ok(());
    }
    let _lock = crate::format::lock::lock_dir(dir)?;
    for f in RUN_FILES {
        match std::fs::remove_file(dir.join(f)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::io(dir.join(f), e))
            }
            _ => {}
        }
    }
    Ok(())
}

/// "45 s", "14 min", "2.5 h".
fn human_secs(s: f64) -> String {
    if s < 90.0 {
        format!("{s:.0} s")
    } else if s < 5400.0 {
        format!("{:.0} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

/// `--resume` with `--epochs N` above the run's: the run goes on to N epochs, its one-cycle
/// schedule recomputed for N from the step it is at (every later step gets the rate a run started
/// with `--epochs N` gives it; a finished run's rate so climbs back from 0). Augmentation covers
/// the new first nine tenths as for a new run. The config is rewritten, so that a later
/// `--resume` keeps N.
fn extend(dir: &Path, r: &mut Recipe, o: &TrainOptions, at: &Cursor, writer: bool) -> Result<()> {
    let from = r.epochs;
    r.epochs = o.epochs;
    if r.augment_epochs > 0 {
        r.augment_epochs = o.epochs.saturating_sub(o.epochs.div_ceil(10)).max(1);
    }
    if !o.quiet {
        eprintln!(
            "extending {} from {from} to {} epochs (at epoch {}, step {}): the one-cycle schedule is recomputed for {} epochs from this step",
            shown_path(dir),
            r.epochs,
            at.epoch.min(from),
            at.step,
            r.epochs
        );
    }
    if writer {
        write_atomic(
            &dir.join("config.json"),
            serde_json::to_string_pretty(&r).unwrap().as_bytes(),
        )?;
    }
    Ok(())
}

/// The data a resumed run reads: DATA when given (checked to hold what the run was trained on),
/// else the folder the run recorded (checked not to have changed).
fn resume_data(r: &Recipe, given: &Path, dir: &Path) -> Result<Data> {
    let path = if given.as_os_str().is_empty() {
        &r.data
    } else {
        given
    };
    let data = open_run_data(r, path)?;
    let same_path = match (path.canonicalize(), r.data.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => path == r.data,
    };
    match (&r.data_id, data_identity(&data)?) {
        (Some(was), Some(now)) if *was == now => {}
        (None, _) if same_path => {}
        (Some(_), _) if same_path => {
            return Err(Error::Invalid(format!(
                "{}: the dataset is not the one {} was trained on (its shards, classes or shape changed since); a resumed run keeps its data",
                shown_path(path),
                shown_path(dir)
            )))
        }
        (Some(_), _) => {
            return Err(Error::Invalid(format!(
                "{} is not the dataset {} was trained on ({}): their shards, classes or shape differ; a resumed run keeps its data",
                shown_path(path),
                shown_path(dir),
                shown_path(&r.data)
            )))
        }
        (None, _) => {
            return Err(Error::Invalid(format!(
                "{} is not the folder {} was trained on ({}), and the run recorded nothing to tell whether they hold the same data; resume without DATA",
                shown_path(path),
                shown_path(dir),
                shown_path(&r.data)
            )))
        }
    }
    Ok(data)
}

/// What an interrupted run kept, and how to go on.
fn interrupted_note(dir: &Path) -> String {
    if dir.join(checkpoint::FILE).exists() {
        format!(
            "its last checkpoint is kept: `prep train --resume {}` continues from it",
            shown_path(&dir)
        )
    } else {
        "it had no checkpoint yet, and nothing is kept: the same command starts again".into()
    }
}

/// Open `path` for a run made with `r`: the run's image shape, and for column-major files
/// without a manifest the dtype and classes the run recorded (when `path` is its data; else
/// read as f32, whose values normalise to the same numbers), so that they are not scanned again.
fn open_run_data(r: &Recipe, path: &Path) -> Result<Data> {
    let shape = Shape::new(
        [r.model.channels, r.model.height, r.model.width]
            .iter()
            .map(|&d| d as u32)
            .collect(),
    )?;
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    };
    let dtype = r
        .input_dtype
        .filter(|_| same(path, &r.data))
        .unwrap_or(Dtype::F32);
    Data::open(
        path,
        Some(&shape),
        Some(Known {
            dtype,
            classes: r.classes.clone(),
        }),
    )
}

/// Where training batches come from and how they reach the backend: the host pipeline
/// (`HostFeed`, every backend) or, on CUDA, a dataset cached in GPU memory.
pub trait Feed<B: Backend> {
    /// Begin `epoch` at batch `start`.
    fn start(&mut self, be: &mut B, epoch: usize, start: usize) -> Result<()>;
    /// Put the next batch into the model's input and labels: `Some((batch index, samples))`, or
    /// `None` at the end of the epoch.
    fn next(&mut self, be: &mut B, model: &mut Model<B>) -> Result<Option<(usize, usize)>>;
    /// Damaged blocks skipped so far in this epoch.
    fn damaged(&self) -> usize;
}

/// Batches from the host pipeline (`input::epoch`), normalised and augmented by the backend.
pub struct HostFeed {
    src: Arc<Source>,
    recipe: Recipe,
    on_damage: OnDamage,
    workers: usize,
    per_epoch: usize,
    epoch: usize,
    loader: Option<input::Loader>,
    damaged: Arc<Mutex<Vec<String>>>,
    share: Share,
}

impl HostFeed {
    pub fn new(src: Arc<Source>, r: &Recipe, workers: usize) -> Self {
        HostFeed {
            share: Share::ALL,
            per_epoch: input::batches_per_epoch(src.samples, r.batch),
            src,
            recipe: r.clone(),
            on_damage: if r.skip_damaged {
                OnDamage::Skip
            } else {
                OnDamage::Stop
            },
            workers,
            epoch: 0,
            loader: None,
            damaged: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Read only share `share` of each epoch (a data-parallel rank): `input::rank_batches` of it.
    pub fn for_rank(mut self, share: Share) -> Self {
        self.per_epoch =
            input::rank_batches(&self.src.block_sizes(), share.count, self.recipe.batch);
        self.share = share;
        self
    }
}

impl<B: Backend> Feed<B> for HostFeed {
    fn start(&mut self, _be: &mut B, epoch: usize, start: usize) -> Result<()> {
        self.loader = None;
        self.epoch = epoch;
        self.damaged = Arc::new(Mutex::new(Vec::new()));
        self.loader = Some(input::epoch_share(
            self.src.clone(),
            EpochPlan {
                batch: self.recipe.batch,
                seed: self.recipe.seed,
                epoch,
                start,
                shuffle: true,
                keep_partial: false,
                share: self.share,
            },
            self.on_damage,
            self.workers,
            None,
            self.damaged.clone(),
        ));
        Ok(())
    }

    fn next(&mut self, be: &mut B, model: &mut Model<B>) -> Result<Option<(usize, usize)>> {
        let Some(loader) = &self.loader else {
            return Ok(None);
        };
        let batch = match loader.rx.recv() {
            Ok(b) => b?,
            Err(_) => return Ok(None),
        };
        if batch.index >= self.per_epoch {
            self.loader = None;
            return Ok(None);
        }
        let r = &self.recipe;
        let n = batch.labels.len();
        let raw = RawBatch {
            pixels: &batch.pixels,
            dtype: self.src.spec.dtype,
            n,
            c: r.model.channels,
            h: r.model.height,
            w: r.model.width,
            labels: &batch.labels,
        };
        let (aug, pad) = if self.epoch < r.augment_epochs {
            (
                augmentation(r, self.epoch, self.share.batch_key(batch.index), n),
                r.crop_pad,
            )
        } else {
            (Vec::new(), 0)
        };
        model.load(be, &raw, &r.mean, &r.std, pad, &aug);
        loader.give_back(batch.pixels);
        Ok(Some((batch.index, n)))
    }

    fn damaged(&self) -> usize {
        self.damaged.lock().unwrap().len()
    }
}

/// The standard deviation a channel is divided by. u8/u16 statistics are of pixels in [0, 1]: a
/// floor of 1e-3 keeps a near-constant channel from blowing up. f16/f32 ones are in the data's own
/// units, where no fixed floor fits: only a zero (constant channel) or an f32 overflow becomes 1.
fn norm_std(std: f64, dtype: Dtype) -> f32 {
    let s = std as f32;
    if !dtype.is_float() {
        s.max(1e-3)
    } else if s > 0.0 && s.is_finite() {
        s
    } else {
        1.0
    }
}

/// What a training run needs besides the backend and its feed.
pub struct RunCtx<'a> {
    pub opts: &'a TrainOptions,
    pub dir: &'a Path,
    pub recipe: &'a Recipe,
    pub resume: Option<(Vec<(String, Vec<f32>)>, Cursor)>,
    pub train_src: Arc<Source>,
    pub test_src: Option<Arc<Source>>,
    pub per_epoch: usize,
    pub workers: usize,
    /// What the device and the input pipeline are, for the log and summary.json.
    pub device_desc: String,
    /// This rank's share of each epoch (`Share::ALL` for one process); rank 0 writes the run.
    pub share: Share,
}

fn run(
    o: &TrainOptions,
    dir: &Path,
    r: &Recipe,
    resume: Option<(Vec<(String, Vec<f32>)>, Cursor)>,
    data: Data,
) -> Result<Trained> {
    let train_src = data.source("train")?;
    let test_src = if data.has_split("test") {
        Some(data.source("test")?)
    } else {
        if !o.quiet && o.world.as_ref().is_none_or(|w| w.rank == 0) {
            eprintln!(
                "{} has no test split: training without a test accuracy (prep convert --test-fraction F draws one)",
                crate::util::error::shown_path(&data.dir)
            );
        }
        None
    };
    if train_src
        .spec
        .shape
        .0
        .iter()
        .map(|&d| d as usize)
        .collect::<Vec<_>>()
        != [r.model.channels, r.model.height, r.model.width]
    {
        return Err(Error::Invalid(format!(
            "{}: its samples are {}, the run was made for {}x{}x{}",
            shown_path(&r.data),
            train_src.spec.shape,
            r.model.channels,
            r.model.height,
            r.model.width
        )));
    }
    let share = match &o.world {
        Some(w) => Share::new(w.rank, w.size)?,
        None => Share::ALL,
    };
    if share.count > 1 && r.device == "cpu" {
        return Err(Error::Invalid(format!(
            "the CPU backend trains in one process; a world of {} ranks needs a GPU for each (--device cuda)",
            share.count
        )));
    }
    let per_epoch = input::rank_batches(&train_src.block_sizes(), share.count, r.batch);
    if per_epoch == 0 {
        return Err(Error::Invalid(if share.count > 1 {
            format!(
                "the training split has {} samples in {} blocks, too few for {} ranks at --batch {} (per GPU): each rank needs at least one batch from its share of the blocks",
                train_src.samples,
                train_src.num_blocks(),
                share.count,
                r.batch
            )
        } else {
            format!(
                "the training split has {} samples, fewer than one batch of {}",
                train_src.samples, r.batch
            )
        }));
    }
    // Threads decoding blocks ahead: on the CPU two outpace any training step, and more would
    // only hold more blocks (the lookahead grows with them) as the thread count grows.
    let workers = if r.device == "cpu" {
        rayon::current_num_threads().min(2)
    } else {
        rayon::current_num_threads()
    };
    let ctx = RunCtx {
        opts: o,
        dir,
        recipe: r,
        resume,
        train_src: train_src.clone(),
        test_src,
        per_epoch,
        workers,
        device_desc: "cpu".into(),
        share,
    };
    if r.device == "cpu" {
        check_cpu_memory(r, train_src.spec.bytes())?;
        let feed = HostFeed::new(train_src, r, workers).for_rank(share);
        return run_on(Cpu::default(), Box::new(feed), ctx);
    }
    #[cfg(feature = "cuda")]
    {
        cuda::run(ctx)
    }
    #[cfg(not(feature = "cuda"))]
    Err(Error::Invalid(format!(
        "--device {}: this build of prep has no CUDA backend",
        r.device
    )))
}

/// The training loop, the same for every backend.
pub fn run_on<B: Backend>(be: B, feed: Box<dyn Feed<B>>, ctx: RunCtx) -> Result<Trained> {
    let t_start = Instant::now();
    let mut startup_s = f64::NAN;
    // Locals drop in reverse order: the model and the feed's buffers before the backend.
    let mut be = be;
    let mut feed = feed;
    let RunCtx {
        opts: o,
        dir,
        recipe: r,
        resume,
        train_src: _,
        test_src,
        per_epoch,
        workers,
        device_desc,
        share,
    } = ctx;
    let writer = share.index == 0;
    // Rank 0 alone evaluates (its figures are the ones written); the others go on to the next
    // step, where NCCL holds them until rank 0 joins.
    let test_src = test_src.filter(|_| writer);
    let total_steps = per_epoch * r.epochs;
    let (mut model, mut cur) = match resume {
        Some((state, cur)) => {
            let mut m = Model::new(&mut be, r.model.clone(), &state);
            m.set_momentum(&mut be, &state);
            (m, cur)
        }
        None => (
            Model::new(&mut be, r.model.clone(), &init_values(&r.model, r.seed)),
            Cursor::default(),
        ),
    };
    timing::mark("model built");
    // metrics.jsonl keeps exactly the finished epochs (a killed run may have written no more).
    let metrics_path = dir.join("metrics.jsonl");
    let mut history: Vec<EpochMetrics> = match crate::store::local::read_capped(
        &metrics_path,
        crate::store::local::JSON_CAP,
        "a metrics log",
    ) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        // A run killed before its first epoch has none.
        Err(_) if !metrics_path.exists() => String::new(),
        Err(e) => return Err(e),
    }
    .lines()
    .filter_map(|l| serde_json::from_str(l).ok())
    .take(cur.epoch)
    .collect();
    if writer {
        rewrite_metrics(&metrics_path, &history)?;
    }
    let ckpt = dir.join(checkpoint::FILE);
    let mut steps_here = 0;
    let mut peak_gpu = history.iter().map(|m| m.gpu_mem_bytes).max().unwrap_or(0);
    let mut last_eval: Option<(f64, f64, Vec<Vec<u64>>)> = None;
    // On the CPU a run can take many minutes: after a few seconds of steps, say how long it will
    // take and how to make it shorter (printed once).
    let mut cpu_clock: Option<(Instant, u64)> =
        (device_desc == "cpu" && !o.quiet && writer).then(|| (Instant::now(), 0));
    let mut seen_here = 0u64;
    // Loss figures stay on the device between these points, so that no step waits for one.
    let flush = |be: &mut B, cur: &mut Cursor, t_seg: Instant| -> Result<()> {
        let (loss, correct) = be.take_loss_stats();
        be.status().map_err(Error::Device)?;
        cur.train_seconds += t_seg.elapsed().as_secs_f64();
        cur.loss_sum += loss;
        cur.correct += correct;
        if !cur.loss_sum.is_finite() {
            return Err(Error::Invalid(format!(
                "the loss became {} at epoch {} step {}: lower --lr",
                cur.loss_sum,
                cur.epoch + 1,
                cur.step
            )));
        }
        Ok(())
    };
    while cur.epoch < r.epochs {
        let epoch = cur.epoch;
        let t_epoch = Instant::now();
        let pb = crate::util::progress::bar(
            ((per_epoch - cur.batch) * r.batch) as u64,
            &format!("epoch {}", epoch + 1),
            "samples",
            o.quiet,
        );
        feed.start(&mut be, epoch, cur.batch)?;
        let mut lr = one_cycle(cur.step, total_steps, r.lr);
        let mut t_seg = Instant::now();
        // Host time waiting for batches and issuing the steps (PREP_PROFILE=1).
        let (mut t_feed, mut t_issue) = (0.0f64, 0.0f64);
        let mut t0 = Instant::now();
        if steps_here == 0 {
            startup_s = timing::since_start();
            timing::mark("first step begins");
        }
        loop {
            // An interruption (here, or seen by the input's threads) stops the run like
            // `stop_after`: a checkpoint of the steps done so far, then the error.
            let next = match crate::util::interrupt::check()
                .and_then(|()| feed.next(&mut be, &mut model))
            {
                Err(e) if e.is_interrupted() => {
                    if steps_here > 0 {
                        flush(&mut be, &mut cur, t_seg)?;
                        save_state(writer, &ckpt, &model, &mut be, &cur)?;
                    }
                    return Err(e);
                }
                r => r?,
            };
            let Some((index, n)) = next else { break };
            let t1 = Instant::now();
            t_feed += (t1 - t0).as_secs_f64();
            lr = one_cycle(cur.step, total_steps, r.lr);
            // The first step of a process runs directly (it sizes the buffers and picks the
            // convolution algorithms); the backend may record the next one as a graph and replay
            // it for every later step of this batch size.
            let full = n == r.batch;
            if !(full && steps_here > 0 && be.replay(lr)) {
                let recording = full && steps_here > 0 && be.begin_capture();
                let (sm, mo, wd) = (r.label_smoothing, r.momentum, r.weight_decay);
                model.train_step(&mut be, n, sm, lr, mo, wd);
                if recording {
                    if be.end_capture() {
                        be.replay(lr);
                    } else {
                        model.train_step(&mut be, n, sm, lr, mo, wd);
                    }
                }
            }
            t0 = Instant::now();
            t_issue += (t0 - t1).as_secs_f64();
            if steps_here == 0 && timing::enabled() {
                // Waits for the GPU (only with PREP_TIMING), so the mark says when it finished.
                be.gpu_mem_bytes();
                timing::mark("first step done");
            }
            cur.step += 1;
            cur.batch = index + 1;
            cur.seen += n as u64;
            pb.inc(n as u64);
            steps_here += 1;
            seen_here += n as u64;
            if let Some((since, from)) = cpu_clock {
                if steps_here == 1 {
                    // The first step sizes buffers: time from after it.
                    cpu_clock = Some((Instant::now(), seen_here));
                } else if since.elapsed().as_secs_f64() >= 3.0 {
                    let rate = (seen_here - from) as f64 / since.elapsed().as_secs_f64();
                    let left_this = (per_epoch - cur.batch) * r.batch;
                    let left = left_this + (r.epochs - epoch - 1) * per_epoch * r.batch;
                    let test = test_src.as_ref().map_or(0, |t| t.samples);
                    // Testing runs forward only: about a third of a training step's time.
                    let secs = |train: usize, epochs: usize| {
                        (train as f64 + (epochs * test) as f64 / 3.0) / rate.max(1e-9)
                    };
                    let total = secs(left, r.epochs - epoch);
                    if total >= 60.0 {
                        let one = secs(per_epoch * r.batch, 1);
                        let fewer = if r.epochs - epoch > 2 {
                            format!("--epochs 2 (about {}), or ", human_secs(2.0 * one))
                        } else {
                            String::new()
                        };
                        let line = format!(
                            "on the CPU at {:.0} samples/s this run needs about {} more ({} epochs); for a quicker one: {fewer}a machine with a GPU",
                            rate,
                            human_secs(total),
                            r.epochs - epoch,
                        );
                        pb.suspend(|| eprintln!("{line}"));
                    }
                    cpu_clock = None;
                }
            }
            let stop = o.stop_after == Some(steps_here);
            if stop
                || (r.checkpoint_every > 0
                    && cur.step % r.checkpoint_every == 0
                    && cur.batch < per_epoch)
            {
                flush(&mut be, &mut cur, t_seg)?;
                save_state(writer, &ckpt, &model, &mut be, &cur)?;
                t_seg = Instant::now();
            }
            if stop {
                return Ok(Trained {
                    dir: dir.to_path_buf(),
                    summary: None,
                });
            }
        }
        flush(&mut be, &mut cur, t_seg)?;
        if share.count > 1 && cur.batch < per_epoch {
            // The others would wait for this rank's next step for ever.
            return Err(Error::Source(format!(
                "rank {}: its share of epoch {} ran out after {} of its {per_epoch} batches (damaged blocks were skipped); with several GPUs every rank must take the same steps: repair the data (prep verify names the blocks)",
                share.index,
                epoch + 1,
                cur.batch
            )));
        }
        if std::env::var("PREP_PROFILE").as_deref() == Ok("1") {
            eprintln!(
                "host time this epoch: {t_feed:.3} s getting batches, {t_issue:.3} s issuing steps, {:.3} s training in all",
                cur.train_seconds
            );
        }
        let skipped = feed.damaged();
        pb.finish_and_clear();
        let gpu_mem = be.gpu_mem_bytes();
        peak_gpu = peak_gpu.max(gpu_mem);
        let (test_loss, test_acc, confusion) = match &test_src {
            Some(t) => match evaluate(&mut be, &mut model, r, t.clone(), workers) {
                // The epoch's training is done: keep it, and test again on --resume.
                Err(e) if e.is_interrupted() => {
                    save_state(writer, &ckpt, &model, &mut be, &cur)?;
                    return Err(e);
                }
                r => r?,
            },
            None => (f64::NAN, f64::NAN, vec![]),
        };
        let m = EpochMetrics {
            epoch: epoch + 1,
            train_loss: cur.loss_sum / cur.seen.max(1) as f64,
            train_accuracy: cur.correct as f64 / cur.seen.max(1) as f64,
            test_loss,
            test_accuracy: test_acc,
            lr,
            // The world's rate: the ranks step together, each on its own batch.
            samples_per_sec: (cur.seen * share.count as u64) as f64 / cur.train_seconds.max(1e-9),
            seconds: t_epoch.elapsed().as_secs_f64(),
            host_rss_bytes: crate::util::mem::rss_bytes(),
            gpu_mem_bytes: gpu_mem,
            damaged_blocks_skipped: skipped,
        };
        if !o.quiet {
            let gpu = if gpu_mem > 0 {
                format!(" | GPU {}", crate::util::mem::human(gpu_mem))
            } else {
                String::new()
            };
            let test = if m.test_accuracy.is_nan() {
                "no test split".to_string()
            } else {
                format!("test loss {:.4} acc {:.4}", m.test_loss, m.test_accuracy)
            };
            eprintln!(
                "epoch {:>3}/{}: train loss {:.4} acc {:.4} | {test} | {:.0} samples/s | {:.1} s | RSS {}{gpu}",
                m.epoch, r.epochs, m.train_loss, m.train_accuracy, m.samples_per_sec, m.seconds, crate::util::mem::human(m.host_rss_bytes)
            );
        }
        history.push(m);
        if writer {
            rewrite_metrics(&metrics_path, &history)?;
        }
        cur = Cursor {
            epoch: epoch + 1,
            batch: 0,
            step: cur.step,
            ..Default::default()
        };
        save_state(writer, &ckpt, &model, &mut be, &cur)?;
        timing::mark(&format!("epoch {} done", epoch + 1));
        last_eval = Some((test_loss, test_acc, confusion));
    }
    if !writer {
        return Ok(Trained {
            dir: dir.to_path_buf(),
            summary: None,
        });
    }
    let (test_loss, test_accuracy, confusion) = match last_eval {
        Some(e) => e,
        None => match &test_src {
            Some(t) => evaluate(&mut be, &mut model, r, t.clone(), workers)?,
            None => (f64::NAN, f64::NAN, vec![]),
        },
    };
    let train_secs: f64 = history.iter().map(|m| m.seconds).sum();
    let sps = history.iter().map(|m| m.samples_per_sec).sum::<f64>() / history.len().max(1) as f64;
    let summary = Summary {
        test_accuracy,
        test_loss,
        epochs: r.epochs,
        samples_per_sec: sps,
        seconds: train_secs.max(t_start.elapsed().as_secs_f64()),
        peak_rss_bytes: crate::util::mem::peak_rss_bytes(),
        peak_gpu_mem_bytes: peak_gpu,
        device: device_desc,
        layout: r.layout,
        confusion: confusion.clone(),
        classes: r.classes.clone(),
        startup_s,
    };
    write_atomic(
        &dir.join("summary.json"),
        serde_json::to_string_pretty(&summary).unwrap().as_bytes(),
    )?;
    let points: Vec<plot::EpochPoint> = history
        .iter()
        .map(|m| plot::EpochPoint {
            epoch: m.epoch,
            train_loss: m.train_loss,
            test_loss: m.test_loss,
            train_accuracy: m.train_accuracy,
            test_accuracy: m.test_accuracy,
        })
        .collect();
    timing::mark("summary written");
    plot::curves_png(&points, &dir.join("curves.png"))?;
    if !confusion.is_empty() {
        plot::confusion_png(&confusion, &r.classes, &dir.join("confusion.png"))?;
        let mut csv = format!("true\\predicted,{}\n", r.classes.join(","));
        for (k, row) in confusion.iter().enumerate() {
            csv.push_str(&format!(
                "{},{}\n",
                r.classes[k],
                row.iter()
                    .map(|v| v.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ));
        }
        write_atomic(&dir.join("confusion.csv"), csv.as_bytes())?;
    }
    timing::mark("plots written");
    Ok(Trained {
        dir: dir.to_path_buf(),
        summary: Some(summary),
    })
}

/// A checkpoint, written by the writing rank only (rank 0; the one process of a plain run).
fn save_state<B: Backend>(
    writer: bool,
    path: &Path,
    model: &Model<B>,
    be: &mut B,
    cur: &Cursor,
) -> Result<()> {
    if writer {
        checkpoint::save(path, &model.state(be), cur)
    } else {
        Ok(())
    }
}

fn rewrite_metrics(path: &Path, history: &[EpochMetrics]) -> Result<()> {
    let mut text = Vec::new();
    for m in history {
        writeln!(text, "{}", serde_json::to_string(m).unwrap()).unwrap();
    }
    write_atomic(path, &text)
}

/// Test loss, accuracy and confusion matrix (rows: true class) in evaluation mode.
fn evaluate<B: Backend>(
    be: &mut B,
    model: &mut Model<B>,
    r: &Recipe,
    src: Arc<Source>,
    workers: usize,
) -> Result<(f64, f64, Vec<Vec<u64>>)> {
    let k = r.model.classes;
    let mut confusion = vec![vec![0u64; k]; k];
    let mut n_all = 0usize;
    let dtype = src.spec.dtype;
    // Batches of the training size: evaluation then needs no more memory than a training step.
    let loader = input::epoch(
        src,
        r.batch,
        0,
        0,
        0,
        false,
        OnDamage::Stop,
        workers,
        Arc::new(Mutex::new(Vec::new())),
    );
    for batch in loader.rx.iter() {
        crate::util::interrupt::check()?;
        let batch = batch?;
        let n = batch.labels.len();
        let raw = RawBatch {
            pixels: &batch.pixels,
            dtype,
            n,
            c: r.model.channels,
            h: r.model.height,
            w: r.model.width,
            labels: &batch.labels,
        };
        model.load(be, &raw, &r.mean, &r.std, 0, &[]);
        let logits = model.forward(be, n, false);
        let pred = be.argmax(logits, n, k);
        for (p, &y) in pred.iter().zip(&batch.labels) {
            confusion[y as usize][*p as usize] += 1;
        }
        model.loss(be, n, 0.0);
        n_all += n;
    }
    // The training loop took its own figures before evaluating, so these are the test split's.
    let loss_sum = be.take_loss_stats().0;
    let correct: u64 = (0..k).map(|i| confusion[i][i]).sum();
    Ok((
        loss_sum / n_all.max(1) as f64,
        correct as f64 / n_all.max(1) as f64,
        confusion,
    ))
}

/// `prep eval`: the accuracy of a run's checkpoint on a dataset's split, on `device` (as for
/// training; default: the CPU for a CPU run, else `auto`) in `precision` on a GPU (default: the
/// run's own), so that by default it reproduces the run's own evaluation.
pub fn eval(
    run: &Path,
    data: &Path,
    split: &str,
    device: Option<&str>,
    precision: Option<&str>,
) -> Result<Evaluation> {
    let cfg = run.join("config.json");
    let r: Recipe = serde_json::from_slice(&crate::store::local::read_capped(
        &cfg,
        crate::store::local::JSON_CAP,
        "a run's config",
    )?)
    .map_err(|e| Error::manifest(&cfg, e.to_string()))?;
    let (state, _) = checkpoint::load(&run.join(checkpoint::FILE))?;
    let d = open_run_data(&r, data)?;
    let src = d.source(split)?;
    if d.classes.len() != r.model.classes {
        return Err(Error::Invalid(format!(
            "{}: {} classes, the model has {}",
            shown_path(&data),
            d.classes.len(),
            r.model.classes
        )));
    }
    let n = src.samples;
    let workers = rayon::current_num_threads();
    let device = device.unwrap_or(if r.device == "cpu" { "cpu" } else { "auto" });
    let device = pick_device(device, true)?;
    let ((loss, accuracy, confusion), device) = if device == "cpu" {
        let out = eval_on(Cpu::default(), &r, &state, src, workers)?;
        (out, "cpu".to_string())
    } else {
        #[cfg(feature = "cuda")]
        {
            use crate::nn::cuda::{staging::Kind, Cuda, Precision};
            let ordinal = device.trim_start_matches("cuda:").parse().unwrap_or(0);
            let p = precision.unwrap_or(&r.precision);
            let prec = if p == "f32" {
                Precision::F32
            } else {
                Precision::Bf16
            };
            let mut be = Cuda::new(ordinal, prec, Kind::Pinned).map_err(Error::Device)?;
            // The run's own convolution algorithms: the run's arithmetic, repeated.
            be.use_run_algorithms(run, false);
            let out = eval_on(be, &r, &state, src, workers)?;
            (out, format!("{device}, {p}"))
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = precision; // only a GPU has a precision to choose
            unreachable!("pick_device gives cpu in a build without CUDA")
        }
    };
    Ok(Evaluation {
        loss,
        accuracy,
        samples: n,
        confusion,
        device,
    })
}

/// What `prep eval` measured.
pub struct Evaluation {
    pub loss: f64,
    pub accuracy: f64,
    pub samples: usize,
    /// Rows: true class; columns: predicted.
    pub confusion: Vec<Vec<u64>>,
    /// `cpu`, or `cuda:N, bf16|f32`.
    pub device: String,
}

fn eval_on<B: Backend>(
    mut be: B,
    r: &Recipe,
    state: &[(String, Vec<f32>)],
    src: Arc<Source>,
    workers: usize,
) -> Result<(f64, f64, Vec<Vec<u64>>)> {
    let mut model = Model::new(&mut be, r.model.clone(), state);
    let out = evaluate(&mut be, &mut model, r, src, workers);
    be.status().map_err(Error::Device)?;
    drop(model); // its buffers before the backend
    out
}
