use super::outln;
use crate::cli::EvalArgs;
use anyhow::Context;
use prep::error::shown_path;
use std::process::ExitCode;

pub fn run(a: EvalArgs) -> anyhow::Result<ExitCode> {
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
    let recorded: Option<f64> = prep::files::read_capped(
        &a.run.join("summary.json"),
        prep::files::JSON_CAP,
        "a summary",
    )
    .ok()
    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
    .and_then(|v| v["test_accuracy"].as_f64());
    if a.json {
        let v = serde_json::json!({ "accuracy": e.accuracy, "loss": e.loss, "samples": e.samples, "device": e.device, "summary_test_accuracy": recorded, "confusion": e.confusion });
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let note = match recorded {
            Some(r) if r == e.accuracy => " (equal to summary.json)".to_string(),
            Some(r) => format!(" (summary.json says {r:.4})"),
            None => String::new(),
        };
        outln!(
            "{} on {} {}: accuracy {:.4} over {} samples, loss {:.4}, on {}{note}",
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
