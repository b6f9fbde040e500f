//! Evaluation: a split through a model, during a run and from a run folder (`prep eval`).

use super::device::pick_device;
use super::recipe::{open_run_data, Recipe};
use super::*;

/// What testing a model on a split gives.
#[derive(Debug, Clone, Default)]
pub struct Tested {
    /// Mean loss per sample.
    pub loss: f64,
    /// Classes: accuracy; masks: pixel accuracy; labels: exact-match ratio; values: NaN.
    pub accuracy: f64,
    /// Classes: the confusion matrix (rows: true class).
    pub confusion: Vec<Vec<u64>>,
    /// The task's scores (none for classes).
    pub scores: Option<TaskScores>,
    /// Masks: a few samples as tested, for the grid of predictions.
    pub shown: Vec<Shown>,
}

/// The scores of a task other than classes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TaskScores {
    Mask(scores::SegScores),
    Labels(scores::LabelScores),
    Values(scores::RegScores),
}

impl TaskScores {
    /// The one figure a task is judged by: mean foreground Dice, mAP or mean R2.
    pub fn headline(&self) -> (&'static str, f64) {
        match self {
            TaskScores::Mask(s) => ("mean Dice", s.mean_dice.unwrap_or(f64::NAN)),
            TaskScores::Labels(s) => ("mAP", s.map.unwrap_or(f64::NAN)),
            TaskScores::Values(s) => ("R2", s.mean_r2.unwrap_or(f64::NAN)),
        }
    }

    pub fn summary(&self) -> String {
        match self {
            TaskScores::Mask(s) => s.summary(),
            TaskScores::Labels(s) => s.summary(),
            TaskScores::Values(s) => s.summary(),
        }
    }
}

/// A sample shown in the grid of predicted masks: its image (CHW, as stored, as f32), true
/// and predicted masks (HW).
#[derive(Debug, Clone)]
pub struct Shown {
    pub image: Vec<f32>,
    pub truth: Vec<u32>,
    pub predicted: Vec<u32>,
}

/// Samples of the first test batch shown in the grid of predicted masks.
pub const SHOWN: usize = 6;

/// The test figures of `src` in evaluation mode, in batches of the training size (evaluation
/// then needs no more memory than a training step).
pub(super) fn evaluate<B: Backend>(
    be: &mut B,
    model: &mut Model<B>,
    r: &Recipe,
    src: Arc<Source>,
    workers: usize,
) -> Result<Tested> {
    let k = r.model.classes;
    let task = &r.task;
    let field = super::feed::target_field(&src, r)?;
    let mut confusion = vec![vec![0u64; if task.kind == TaskKind::Class { k } else { 0 }]; k];
    let mut labels_seen = scores::LabelAccum::new(k, scores::ScoreKind::Logits);
    let mut values_seen = scores::RegAccum::new(k);
    let mut shown = Vec::new();
    let mut n_all = 0usize;
    let dtype = src.spec.dtype;
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
    // Figures of training taken before this; these are the split's.
    be.take_seg_counts(k);
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
        let target = field.map(|(f, wide)| (&batch.fields[f][..], wide));
        task.load(
            be,
            model,
            target.map(|t| t.0),
            target.is_some_and(|t| t.1),
            n,
            0,
            &[],
        );
        model.forward(be, n, false);
        let out = model.last_output();
        match task.kind {
            TaskKind::Class => {
                let pred = be.argmax(out, n, k);
                for (p, &y) in pred.iter().zip(&batch.labels) {
                    confusion[y as usize][*p as usize] += 1;
                }
            }
            TaskKind::Mask => {
                let hw = r.model.height * r.model.width;
                be.seg_score(out, &model.targets, n, k, hw);
                if shown.is_empty() {
                    shown = shown_samples(be, model, &raw, target.map(|t| t.0), n);
                }
            }
            TaskKind::Labels => {
                let logits = be.download(out);
                labels_seen.add(&logits, &target.map_or(&[][..], |t| t.0)[..n * k])?;
            }
            TaskKind::Values => {
                // In the values' own units.
                let mut pred = be.download(out);
                let mut truth = task.host_targets(target.map_or(&[][..], |t| t.0), n);
                for (i, (p, t)) in pred.iter_mut().zip(truth.iter_mut()).enumerate() {
                    let j = i % k;
                    *p = *p * task.value_std[j] + task.value_mean[j];
                    *t = *t * task.value_std[j] + task.value_mean[j];
                }
                values_seen.add(&pred, &truth)?;
            }
        }
        model.loss(be, n, 0.0);
        n_all += n;
    }
    let loss_sum = be.take_loss_stats().0;
    let loss = loss_sum / n_all.max(1) as f64;
    let names = task.output_names(&r.classes);
    let (accuracy, scores) = match task.kind {
        TaskKind::Class => {
            let correct: u64 = (0..k).map(|i| confusion[i][i]).sum();
            (correct as f64 / n_all.max(1) as f64, None)
        }
        TaskKind::Mask => {
            let mut counts: Vec<[u64; 3]> = be
                .take_seg_counts(k)
                .chunks_exact(3)
                .map(|c| [c[0], c[1], c[2]])
                .collect();
            // The ignored value is never a target: its predictions are not scored either.
            if let Some(c) = task.ignore.and_then(|i| counts.get_mut(i as usize)) {
                *c = [0; 3];
            }
            let s = scores::SegScores::from_counts(&counts, names, Some(0))?;
            (
                s.pixel_accuracy.unwrap_or(f64::NAN),
                Some(TaskScores::Mask(s)),
            )
        }
        TaskKind::Labels => {
            let s = labels_seen.finish(names)?;
            (
                s.exact_match.unwrap_or(f64::NAN),
                Some(TaskScores::Labels(s)),
            )
        }
        TaskKind::Values => (
            f64::NAN,
            Some(TaskScores::Values(values_seen.finish(names)?)),
        ),
    };
    Ok(Tested {
        loss,
        accuracy,
        confusion: if task.kind == TaskKind::Class {
            confusion
        } else {
            Vec::new()
        },
        scores,
        shown,
    })
}

/// Pixels as stored, as f32 (the grid scales each image to its own range).
fn stored_values(px: &[u8], dtype: crate::format::shard::Dtype) -> Vec<f32> {
    use crate::format::shard::Dtype;
    match dtype {
        Dtype::U8 => px.iter().map(|&v| v as f32).collect(),
        Dtype::U16 => px
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as f32)
            .collect(),
        Dtype::F16 => px
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::F32 => px
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect(),
    }
}

/// The first samples of a mask batch as tested: images as stored, true masks, predictions.
fn shown_samples<B: Backend>(
    be: &mut B,
    model: &Model<B>,
    raw: &RawBatch,
    masks: Option<&[u8]>,
    n: usize,
) -> Vec<Shown> {
    let (k, h, w) = model.out_dims();
    let (c, hw) = (raw.c, h * w);
    let logits = be.download(model.last_output());
    let sb = c * hw * raw.dtype.size();
    let wide = masks.is_some_and(|m| m.len() >= 2 * n * hw);
    (0..n.min(SHOWN))
        .map(|i| {
            let px = &raw.pixels[i * sb..(i + 1) * sb];
            let image = stored_values(px, raw.dtype);
            let truth = masks.map_or(vec![0; hw], |m| {
                (0..hw)
                    .map(|p| {
                        if wide {
                            u16::from_le_bytes([m[2 * (i * hw + p)], m[2 * (i * hw + p) + 1]])
                                as u32
                        } else {
                            m[i * hw + p] as u32
                        }
                    })
                    .collect()
            });
            let l = &logits[i * k * hw..(i + 1) * k * hw];
            let predicted = (0..hw)
                .map(|p| {
                    (0..k)
                        .max_by(|&a, &b| l[a * hw + p].total_cmp(&l[b * hw + p]))
                        .unwrap_or(0) as u32
                })
                .collect();
            Shown {
                image,
                truth,
                predicted,
            }
        })
        .collect()
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
    let src = d.source_for(split, r.task.kind != TaskKind::Class)?;
    if r.task.kind == TaskKind::Class && d.classes.len() != r.model.classes {
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
    let (tested, device) = if device == "cpu" {
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
        loss: tested.loss,
        accuracy: tested.accuracy,
        samples: n,
        confusion: tested.confusion,
        scores: tested.scores,
        device,
    })
}

/// What `prep eval` measured.
pub struct Evaluation {
    pub loss: f64,
    pub accuracy: f64,
    pub samples: usize,
    /// Rows: true class; columns: predicted (classes only).
    pub confusion: Vec<Vec<u64>>,
    /// The scores of a task other than classes.
    pub scores: Option<TaskScores>,
    /// `cpu`, or `cuda:N, bf16|f32`.
    pub device: String,
}

pub(super) fn eval_on<B: Backend>(
    mut be: B,
    r: &Recipe,
    state: &[(String, Vec<f32>)],
    src: Arc<Source>,
    workers: usize,
) -> Result<Tested> {
    let mut model = Model::new(&mut be, r.model.clone(), state);
    model.objective = r.task.objective();
    let out = evaluate(&mut be, &mut model, r, src, workers);
    be.status().map_err(Error::Device)?;
    drop(model); // its buffers before the backend
    out
}
