use super::outln;
use super::thousands;
use crate::cli::VerifyArgs;
use prep::format::colmajor::{ColmajorManifest, ColmajorSplitReader};
use prep::format::shard::dataset::total_bytes;
use prep::format::shard::{Damage, Dataset, VerifyReport};
use prep::util::error::shown_path;
use prep::util::mem::human;
use std::process::ExitCode;
use std::time::Instant;

pub fn run(a: VerifyArgs, quiet: bool) -> anyhow::Result<ExitCode> {
    let t0 = Instant::now();
    // A dataset being written is not damaged: say who writes it (exit 1), and check nothing.
    prep::format::lock::check_not_written(&a.dir)?;
    super::paths::expect_dataset(&a.dir, "verify takes a dataset folder")?;
    let report = match verify(&a, quiet) {
        Ok(r) => r,
        Err(e) if e.is_interrupted() => {
            return Err(anyhow::Error::new(e).context(format!("verifying {}", shown_path(&a.dir))))
        }
        // A store that cannot be reached, or holds no dataset there, is not a damaged dataset.
        Err(e @ (prep::Error::Io { .. } | prep::Error::Invalid(_)))
            if prep::store::remote::is_url(&a.dir) =>
        {
            return Err(anyhow::Error::new(e).context(format!("verifying {}", shown_path(&a.dir))))
        }
        Err(e) => {
            // The manifest itself is unreadable or damaged: that is a verification failure (exit 1),
            // reported like any other damage.
            VerifyReport {
                damage: vec![Damage {
                    file: "manifest.json".into(),
                    region: "file".into(),
                    what: e.to_string(),
                }],
                ..Default::default()
            }
        }
    };
    let secs = t0.elapsed().as_secs_f64();
    if a.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({ "ok": report.ok(), "seconds": secs, "report": report })
            )?
        );
    } else {
        for d in &report.damage {
            outln!("DAMAGED {}: {}: {}", d.file, d.region, d.what);
        }
        if report.ok() {
            if !quiet {
                outln!(
                    "OK {}: {} shards, {} blocks, {} samples, {} checked in {:.1} s ({}/s)",
                    shown_path(&a.dir),
                    report.shards,
                    thousands(report.blocks),
                    thousands(report.samples),
                    human(report.bytes),
                    secs,
                    human((report.bytes as f64 / secs.max(1e-9)) as u64)
                );
            }
        } else {
            eprintln!(
                "error: {} is damaged: {} problem(s) found, listed above",
                shown_path(&a.dir),
                report.damage.len()
            );
        }
    }
    Ok(if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn verify(a: &VerifyArgs, quiet: bool) -> prep::Result<VerifyReport> {
    if prep::dataset_format(&a.dir)? == prep::format::colmajor::FORMAT {
        return verify_colmajor(a);
    }
    let ds = Dataset::open(&a.dir)?;
    let pb = prep::util::progress::bytes_bar(total_bytes(&ds), "verify", quiet);
    let report = ds.verify(&|n| pb.inc(n));
    pb.finish_and_clear();
    // A report cut short by a signal says nothing.
    prep::util::interrupt::check()?;
    Ok(report)
}

/// The colmajor layout has no block checksums: check the manifest seal, file sizes and labels.
fn verify_colmajor(a: &VerifyArgs) -> prep::Result<VerifyReport> {
    let m = ColmajorManifest::read(&a.dir)?;
    let mut report = VerifyReport::default();
    for (name, s) in &m.splits {
        prep::util::interrupt::check()?;
        match ColmajorSplitReader::open(&a.dir, &m, name) {
            Ok(r) => {
                let k = m.classes.len() as i32;
                let mut counts = vec![0u64; m.classes.len()];
                for i in 0..r.samples {
                    let l = r.label(i);
                    if l < 0 || l >= k {
                        report.damage.push(Damage {
                            file: s.labels.clone(),
                            region: format!("sample {i}"),
                            what: format!("label {l} is not a class"),
                        });
                    } else {
                        counts[l as usize] += 1;
                    }
                }
                if counts != s.class_counts {
                    report.damage.push(Damage {
                        file: s.labels.clone(),
                        region: "file".into(),
                        what: "class counts differ from the manifest".into(),
                    });
                }
                report.samples += s.samples;
                report.bytes += s.samples * (r.features as u64 * 4 + 4);
            }
            Err(e) => report.damage.push(Damage {
                file: s.images.clone(),
                region: "file".into(),
                what: e.to_string(),
            }),
        }
    }
    Ok(report)
}
