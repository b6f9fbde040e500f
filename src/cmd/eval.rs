use crate::cli::EvalArgs;
use anyhow::Context;
use std::process::ExitCode;

pub fn run(a: EvalArgs) -> anyhow::Result<ExitCode> {
    let (loss, acc, n, confusion) = prep::train::eval(&a.run, &a.data, &a.split)
        .with_context(|| format!("evaluating {} on {}", a.run.display(), a.data.display()))?;
    let recorded: Option<f64> = std::fs::read(a.run.join("summary.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["test_accuracy"].as_f64());
    if a.json {
        let v = serde_json::json!({ "accuracy": acc, "loss": loss, "samples": n, "summary_test_accuracy": recorded, "confusion": confusion });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let note = match recorded {
            Some(r) if r == acc => " (equal to summary.json)".to_string(),
            Some(r) => format!(" (summary.json says {r:.4})"),
            None => String::new(),
        };
        println!(
            "{} on {} {}: accuracy {acc:.4} over {n} samples, loss {loss:.4}{note}",
            a.run.display(),
            a.data.display(),
            a.split
        );
    }
    Ok(ExitCode::SUCCESS)
}
