//! Evaluation: a split through a model, during a run and from a run folder (`prep eval`).

use super::device::pick_device;
use super::recipe::{open_run_data, Recipe};
use super::*;

/// Test loss, accuracy and confusion matrix (rows: true class) in evaluation mode.
pub(super) fn evaluate<B: Backend>(
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

pub(super) fn eval_on<B: Backend>(
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
