use super::{thousands, UsageError};
use crate::cli::PlanArgs;
use prep::mem::human;
use prep::nn::ModelConfig;
use prep::shard::Dtype;
use std::process::ExitCode;

pub fn run(a: PlanArgs) -> anyhow::Result<ExitCode> {
    let dtype = Dtype::from(a.dtype);
    let cores = rayon::current_num_threads();
    // The sizes below are products of these: refuse what does not fit in 64 bits.
    let spec = prep::shard::SampleSpec {
        shape: a.shape.clone(),
        dtype,
    };
    let widest = (spec.bytes() as u64).max(a.shape.elems() as u64 * 4) + 4;
    super::dataset_bytes(a.train, a.test, widest, &a.shape)?;
    let d = &a.shape.0;
    if d.len() != 3 {
        return Err(UsageError(format!("--shape {}: expected CxHxW", a.shape)).into());
    }
    let model = ModelConfig::new(&a.model, d[0] as usize, d[1] as usize, d[2] as usize, 10)
        .map_err(|e| UsageError(format!("--shape {}: {e}", a.shape)))?;
    let p = prep::plan::plan(
        a.train,
        a.test,
        a.shape.clone(),
        dtype,
        a.batch,
        cores,
        &model,
    );
    if a.json {
        println!("{}", serde_json::to_string_pretty(&p)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "plan for {} train + {} test samples of {} {} (batch {}, {} cores)\n",
        thousands(a.train),
        thousands(a.test),
        a.shape,
        dtype,
        a.batch,
        cores
    );
    for (title, rows) in [
        ("disk", &p.disk),
        ("host RAM for training", &p.host_ram),
        ("GPU memory for training", &p.gpu_memory),
    ] {
        println!("{title}");
        for r in rows {
            println!("  {:<48} {:>12}", r.what, human(r.bytes));
        }
        println!();
    }
    let s = p.generation_seconds;
    println!(
        "time\n  {:<48} {:>12}\n",
        "prep synth (estimate)",
        if s < 120.0 {
            format!("{s:.0} s")
        } else {
            format!("{:.1} min", s / 60.0)
        }
    );
    for n in &p.notes {
        println!("note: {n}");
    }
    Ok(ExitCode::SUCCESS)
}
