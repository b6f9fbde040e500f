use super::outln;
use super::thousands;
use crate::cli::InspectArgs;
use anyhow::Context;
use prep::util::error::shown_path;
use prep::util::mem::human;
use std::process::ExitCode;

pub fn run(a: InspectArgs, quiet: bool) -> anyhow::Result<ExitCode> {
    prep::format::lock::check_not_written(&a.dir)?;
    super::paths::expect_dataset(&a.dir, "inspect takes a dataset folder")?;
    let s = prep::format::inspect::summarize(&a.dir)
        .with_context(|| format!("inspecting {}", shown_path(&a.dir)))?;
    if let Some(path) = &a.grid {
        let side = *s.shape.last().unwrap_or(&32);
        let zoom = a.zoom.unwrap_or_else(|| (64 / side.max(1)).clamp(1, 8));
        let img = prep::format::inspect::grid(&a.dir, &a.split, a.per_class.max(1), zoom)?;
        img.save(path)
            .with_context(|| format!("writing {}", shown_path(&path)))?;
        if !quiet && !a.json {
            eprintln!(
                "wrote {} ({}x{} px)",
                shown_path(&path),
                img.width(),
                img.height()
            );
        }
    }
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(ExitCode::SUCCESS);
    }
    let shape: Vec<String> = s.shape.iter().map(|d| d.to_string()).collect();
    outln!("dataset     {} ({})", s.dir, s.format);
    outln!(
        "sample      {} {}, {} classes",
        shape.join("x"),
        s.dtype,
        s.classes.len()
    );
    if let (Some(c), Some(b)) = (&s.codec, s.block_samples) {
        let codec = match c {
            prep::format::shard::Codec::Zstd { level } => format!("zstd level {level}"),
            prep::format::shard::Codec::Pred { level } => {
                format!("pred (a prediction filter, then zstd level {level})")
            }
            prep::format::shard::Codec::Jpeg { quality } => {
                format!("jpeg (lossy, one JPEG per sample) quality {quality}")
            }
            prep::format::shard::Codec::None => "none".into(),
        };
        outln!(
            "storage     {} shard files, {codec}, {b} samples per block",
            s.shards
        );
    }
    outln!(
        "size        {} on disk, {} decoded, ratio {:.2}x",
        human(s.bytes_on_disk),
        human(s.bytes_decoded),
        s.compression_ratio
    );
    let f = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.4}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    if let Some(p) = &s.part {
        let ranges: Vec<String> = p
            .ranges
            .iter()
            .map(|(split, r)| format!("{split} {}..{} of {}", r.start, r.end, r.total))
            .collect();
        outln!(
            "part        {} of job {} ({}: {}); join with prep merge",
            p.spec().describe(),
            p.job,
            p.of,
            ranges.join(", ")
        );
    }
    outln!("mean        {}", f(&s.mean));
    outln!("std         {}", f(&s.std));
    outln!();
    print!("{:<16}", "class");
    for sp in &s.splits {
        print!("{:>14}", sp.name);
    }
    outln!();
    for (k, name) in s.classes.iter().enumerate() {
        print!("{:<16}", name);
        for sp in &s.splits {
            print!("{:>14}", thousands(sp.class_counts[k]));
        }
        outln!();
    }
    print!("{:<16}", "total");
    for sp in &s.splits {
        print!("{:>14}", thousands(sp.samples));
    }
    outln!();
    print!("{:<16}", "on disk");
    for sp in &s.splits {
        print!("{:>14}", human(sp.bytes_on_disk));
    }
    outln!("\n");
    for (i, field) in s.fields.iter().enumerate() {
        print_field(&s, i, field)?;
    }
    if let Some(cmd) = s.provenance["command"].as_array() {
        let words: Vec<&str> = cmd.iter().filter_map(|w| w.as_str()).collect();
        outln!(
            "made by     {}: {}",
            s.provenance["tool"].as_str().unwrap_or("?"),
            words.join(" ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// One field's table: a mask's share of pixels per value, a labels field's samples per label,
/// a values field's range, mean and standard deviation per name, a metadata field's samples per
/// key; a column per split.
fn print_field(
    s: &prep::format::inspect::Summary,
    i: usize,
    f: &prep::format::fields::Field,
) -> anyhow::Result<()> {
    use prep::format::fields::FieldKind;
    let dims: Vec<String> = f.shape.iter().map(|d| d.to_string()).collect();
    let what = match f.kind {
        FieldKind::Mask => "share of pixels",
        FieldKind::Labels => "samples with the label",
        FieldKind::Values => "min .. max, mean +- std",
        FieldKind::Meta => "samples with the key",
    };
    outln!(
        "field {} ({} {} {}): {what}",
        f.name,
        f.kind.name(),
        f.dtype,
        dims.join("x")
    );
    let width = if f.kind == FieldKind::Values { 40 } else { 14 };
    print!("{:<16}", "");
    for sp in &s.splits {
        print!("{:>width$}", sp.name);
    }
    outln!();
    // A mask or labels field of many names lists only the names present somewhere; the rest
    // are counted in one line.
    let present = |k: usize| {
        s.splits.iter().any(|sp| {
            sp.fields
                .get(i)
                .is_none_or(|st| st.counts.get(k).is_none_or(|&c| c > 0))
        })
    };
    let sparse = f.names.len() > 16 && matches!(f.kind, FieldKind::Mask | FieldKind::Labels);
    let mut absent = 0usize;
    for (k, name) in f.names.iter().enumerate() {
        if sparse && !present(k) {
            absent += 1;
            continue;
        }
        print!("{:<16}", name);
        for sp in &s.splits {
            let Some(st) = sp.fields.get(i) else {
                print!("{:>width$}", "-");
                continue;
            };
            let cell = match f.kind {
                FieldKind::Mask => {
                    let all: u64 = st.counts.iter().sum();
                    format!("{:.2}%", 100.0 * st.counts[k] as f64 / all.max(1) as f64)
                }
                FieldKind::Labels | FieldKind::Meta => thousands(st.counts[k]),
                FieldKind::Values => {
                    let n = sp.samples.max(1) as f64;
                    let mean = st.sum[k] / n;
                    let std = (st.sumsq[k] / n - mean * mean).max(0.0).sqrt();
                    format!(
                        "{:.4} .. {:.4}, {mean:.4} +- {std:.4}",
                        st.min[k], st.max[k]
                    )
                }
            };
            print!(" {cell:>w$}", w = width - 1);
        }
        outln!();
    }
    if absent > 0 {
        outln!(
            "({} of the {} names not present in any split)",
            thousands(absent as u64),
            thousands(f.names.len() as u64)
        );
    }
    outln!();
    Ok(())
}
