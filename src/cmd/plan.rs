use super::outln;
use super::{thousands, UsageError};
use crate::cli::PlanArgs;
use prep::format::shard::Dtype;
use prep::nn::ModelConfig;
use prep::util::mem::human;
use std::process::ExitCode;

pub fn run(a: PlanArgs) -> anyhow::Result<ExitCode> {
    let dtype = Dtype::from(a.dtype);
    let cores = rayon::current_num_threads();
    // The sizes below are products of these: refuse what does not fit in 64 bits.
    let spec = prep::format::shard::SampleSpec {
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
    let p = prep::train::plan::plan(
        a.train,
        a.test,
        a.shape.clone(),
        dtype,
        a.batch,
        cores,
        &model,
        a.gpus,
    );
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&p)?);
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "plan for {} train + {} test samples of {} {} (batch {}{}, {} cores)\n",
        thousands(a.train),
        thousands(a.test),
        a.shape,
        dtype,
        a.batch,
        if a.gpus > 1 { " per GPU" } else { "" },
        cores
    );
    for (title, rows) in [
        ("disk", &p.disk),
        ("host RAM for training", &p.host_ram),
        (
            if a.gpus > 1 {
                "GPU memory for training, on each GPU"
            } else {
                "GPU memory for training"
            },
            &p.gpu_memory,
        ),
    ] {
        outln!("{title}");
        for r in rows {
            outln!("  {:<48} {:>12}", r.what, human(r.bytes));
        }
        outln!();
    }
    let s = p.generation_seconds;
    outln!(
        "time\n  {:<48} {:>12}\n",
        "prep synth (estimate)",
        if s < 120.0 {
            format!("{s:.0} s")
        } else {
            format!("{:.1} min", s / 60.0)
        }
    );
    if let Some(g) = &p.scaling {
        let ms = |s: f64| format!("{:.2} ms", s * 1e3);
        outln!(
            "{} GPUs (data-parallel, gradients averaged through NCCL after each backward pass)",
            g.gpus
        );
        outln!(
            "  {:<48} {:>12}",
            "gradients all-reduced per step",
            human(g.gradient_bytes)
        );
        for (link, bw, t, t95) in [
            (
                "NVLink",
                prep::train::plan::NVLINK_BUS_BYTES_PER_SEC,
                g.allreduce_seconds_nvlink,
                g.step_seconds_for_95_percent_nvlink,
            ),
            (
                "PCIe",
                prep::train::plan::PCIE_BUS_BYTES_PER_SEC,
                g.allreduce_seconds_pcie,
                g.step_seconds_for_95_percent_pcie,
            ),
        ] {
            outln!(
                "  {:<48} {:>12}",
                format!("all-reduce per step, {link} (assumed {:.0} GB/s)", bw / 1e9),
                ms(t)
            );
            outln!(
                "  {:<48} {:>12}",
                format!(
                    "speed-up >= {:.2}x where one GPU's step takes",
                    0.95 * g.gpus as f64
                ),
                format!(">= {}", ms(t95))
            );
        }
        outln!(
            "  speed-up = {n} x step / (step + all-reduce), at most {n}x: the all-reduce is not overlapped with the backward pass; the step time is one GPU's (batch / the samples/s of `prep train` on one GPU). The bandwidths are assumptions (NCCL's ring all-reduce moves 2(N-1)/N of the gradient bytes), not measurements of this host.\n",
            n = g.gpus
        );
        outln!(
            "note: every GPU holds what one GPU holds above (--batch is per GPU), --memory device the whole training split on each; host RAM is per rank process\n"
        );
    }
    for n in &p.notes {
        outln!("note: {n}");
    }
    Ok(ExitCode::SUCCESS)
}
