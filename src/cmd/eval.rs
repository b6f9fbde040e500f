use super::outln;
use crate::cli::EvalArgs;
use anyhow::Context;
use prep::util::error::shown_path;
use std::process::ExitCode;

pub fn run(a: EvalArgs) -> anyhow::Result<ExitCode> {
    use super::paths::{expect_dataset, expect_run, what, What};
    if what(&a.run) == What::Dataset && what(&a.data) == What::Run {
        return Err(super::UsageError(format!(
            "{} is a dataset and {} a run folder: eval takes RUN then DATA (prep eval {} {})",
            shown_path(&a.run),
            shown_path(&a.data),
            shown_path(&a.data),
            shown_path(&a.run)
        ))
        .into());
    }
    expect_run(&a.run, "eval takes RUN then DATA", true)?;
    expect_dataset(&a.data, "eval takes RUN then DATA")?;
    let e = prep::train::eval(
        &a.run,
        &a.data,
        &a.split,
        a.device.as_deref(),
        a.precision.as_deref(),
    )
    .with_context(|| {
        format!(
            "evaluating {} on {}",
            shown_path(&a.run),
            shown_path(&a.data)
        )
    })?;
    let recorded: Option<f64> = prep::store::local::read_capped(
        &a.run.join("summary.json"),
        prep::store::local::JSON_CAP,
        "a summary",
    )
    .ok()
    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
    .and_then(|v| v["test_accuracy"].as_f64());
    if a.json {
        let mut v = serde_json::json!({ "split": a.split, "accuracy": e.accuracy, "loss": e.loss, "samples": e.samples, "device": e.device, "summary_test_accuracy": recorded, "confusion": e.confusion });
        if let Some(s) = &e.scores {
            let (name, value) = s.headline();
            v["score_name"] = name.into();
            v["score"] = value.into();
            v["scores"] = serde_json::to_value(s)?;
        }
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else if let Some(s) = &e.scores {
        outln!(
            "{} on {} split {}: {} over {} samples, loss {:.4}, on {}",
            shown_path(&a.run),
            shown_path(&a.data),
            a.split,
            s.summary(),
            e.samples,
            e.loss,
            e.device
        );
    } else {
        // summary.json holds the test split's figure: compared only with the same split.
        let note = match recorded {
            _ if a.split != "test" => String::new(),
            Some(r) if r == e.accuracy => " (equal to summary.json's test accuracy)".to_string(),
            Some(r) => format!(" (summary.json's test accuracy is {r:.4})"),
            // No summary: the checkpoint is of a run still going, stopped or killed.
            None if !a.run.join("summary.json").exists() => format!(
                " (the run is unfinished, this is its last checkpoint; prep train --resume {} finishes it)",
                shown_path(&a.run)
            ),
            None => String::new(),
        };
        outln!(
            "{} on {} split {}: accuracy {:.4} over {} samples, loss {:.4}, on {}{note}",
            shown_path(&a.run),
            shown_path(&a.data),
            a.split,
            e.accuracy,
            e.samples,
            e.loss,
            e.device
        );
    }
    Ok(ExitCode::SUCCESS)
}
