//! A run's recipe (config.json): what it trains, how, on which data; and what a resumed run checks
//! and extends.

use super::*;

/// Recipes written before `precision` was recorded ran in bfloat16 on a GPU.
pub(super) fn bf16() -> String {
    "bf16".into()
}

/// Recipes written before `world` was recorded ran in one process.
pub(super) fn one() -> usize {
    1
}

/// The recipe. Saved as `config.json` in the run folder; `--resume` continues with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recipe {
    pub data: PathBuf,
    pub model: ModelConfig,
    /// What the model learns (runs made before tasks existed learned classes).
    #[serde(default)]
    pub task: Task,
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
        twox_hash::XxHash3_64::oneshot(v.to_string().as_bytes())
    )))
}

/// `--resume` with `--epochs N` above the run's: the run goes on to N epochs, its one-cycle
/// schedule recomputed for N from the step it is at (every later step gets the rate a run started
/// with `--epochs N` gives it; a finished run's rate so climbs back from 0). Augmentation covers
/// the new first nine tenths as for a new run. The config is rewritten, so that a later
/// `--resume` keeps N.
pub(super) fn extend(
    dir: &Path,
    r: &mut Recipe,
    o: &TrainOptions,
    at: &Cursor,
    writer: bool,
) -> Result<()> {
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
pub(super) fn resume_data(r: &Recipe, given: &Path, dir: &Path) -> Result<Data> {
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

/// Open `path` for a run made with `r`: the run's image shape, and for column-major files
/// without a manifest the dtype and classes the run recorded (when `path` is its data; else
/// read as f32, whose values normalise to the same numbers), so that they are not scanned again.
pub(super) fn open_run_data(r: &Recipe, path: &Path) -> Result<Data> {
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
