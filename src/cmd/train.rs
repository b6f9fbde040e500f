use crate::cli::TrainArgs;
use anyhow::Context;
use prep::error::shown_path;
use prep::mem::human;
use prep::nn::model::default_lr;
use prep::train::{train, TrainOptions};
use std::process::ExitCode;

pub fn run(a: TrainArgs, quiet: bool) -> anyhow::Result<ExitCode> {
    let lr = a.lr.unwrap_or(default_lr(&a.model));
    // --lr, --momentum, --label-smoothing and --weight-decay are range-checked by clap (cli.rs).
    let opts = TrainOptions {
        data: a.data.clone().unwrap_or_default(),
        shape: a.shape.clone(),
        out: a.out.clone(),
        resume: a.resume.clone(),
        model: a.model.clone(),
        epochs: a.epochs,
        batch: a.batch as usize,
        lr,
        momentum: a.momentum,
        weight_decay: a.weight_decay,
        label_smoothing: a.label_smoothing,
        seed: a.seed,
        augment: !a.no_augment,
        checkpoint_every: a.checkpoint_every,
        device: a.device.clone(),
        memory: a.memory.clone(),
        precision: a.precision.clone(),
        skip_damaged: a.skip_damaged,
        quiet,
        stop_after: None,
    };
    let what = match (&a.resume, &a.data) {
        (Some(r), _) => format!("resuming {}", shown_path(&r)),
        (None, Some(d)) => format!("training on {}", shown_path(&d)),
        _ => "training".into(),
    };
    let t = train(&opts).context(what)?;
    if let Some(s) = &t.summary {
        if a.json {
            println!("{}", serde_json::to_string_pretty(s)?);
        } else if !quiet {
            println!(
                "{}: test accuracy {:.4} after {} epochs on {} data, {:.0} samples/s on {}, {:.1} s, peak RSS {}",
                shown_path(&t.dir),
                s.test_accuracy,
                s.epochs,
                s.layout.name(),
                s.samples_per_sec,
                s.device,
                s.seconds,
                human(s.peak_rss_bytes)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
