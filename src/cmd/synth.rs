use super::outln;
use super::{thousands, UsageError};
use crate::cli::SynthArgs;
use anyhow::Context;
use prep::synth::{synthesize_task, SynthOptions, Version, DEFAULT_DIFFICULTY};
use prep::util::mem::human;
use std::process::ExitCode;

pub fn run(a: SynthArgs, quiet: bool) -> anyhow::Result<ExitCode> {
    let generator = match (a.generator, a.difficulty) {
        (Some(1), Some(_)) => {
            return Err(UsageError(
                "--difficulty applies to --generator 2 only (version 1 has none)".into(),
            )
            .into())
        }
        (Some(1), None) => Version::V1,
        (_, d) => Version::V2 {
            difficulty: d.unwrap_or(DEFAULT_DIFFICULTY),
        },
    };
    // Refuse a dataset whose size does not fit in 64 bits (the product of --train/--test and the
    // sample size) before anything is written.
    let spec = prep::format::shard::SampleSpec {
        shape: a.shape.clone(),
        dtype: prep::format::shard::Dtype::U8,
    };
    let widest = (spec.bytes() as u64).max(a.shape.elems() as u64 * 4) + 4;
    super::dataset_bytes(a.train, a.test, widest, &a.shape)?;
    let codec = a.store.codec()?;
    if let Err(why) = codec.fits(&spec) {
        anyhow::bail!(super::UsageError(why));
    }
    let opts = SynthOptions {
        out: a.out.clone(),
        splits: vec![("train".into(), a.train), ("test".into(), a.test)],
        shape: a.shape.clone(),
        classes: a.classes,
        seed: a.seed,
        generator,
        format: a.store.format(),
        codec,
        block_samples: a.store.block_samples,
        shard_blocks: a.store.shard_blocks,
        force: a.force,
        part: a.part,
        quiet,
        uploader: None,
    };
    let task = a.task.task();
    // Run again into a store: nothing to do where it holds this very dataset, as locally.
    use prep::store::remote;
    let to_store = remote::is_url(&a.out);
    let writable = to_store
        && remote::parse(&a.out.to_string_lossy()).is_ok_and(|u| u.scheme != remote::Scheme::Http);
    let held = if writable && !a.force {
        prep::synth::held_by_store(&opts, task)
            .with_context(|| format!("prep synth into {}", a.out.display()))?
    } else {
        None
    };
    let (r, published) = match held {
        Some(r) => (r, None),
        None => super::remote_out::write_to(&a.out, a.force, quiet, |out, uploader| {
            let opts = SynthOptions {
                out: out.to_path_buf(),
                uploader,
                ..opts
            };
            Ok(synthesize_task(&opts, task)?)
        })
        .with_context(|| format!("prep synth into {}", a.out.display()))?,
    };
    if a.json {
        outln!("{}", super::with_upload(&r, &published)?);
    } else if !quiet {
        if r.already_complete {
            outln!(
                "{} already holds this dataset ({} samples, {} {}); nothing to do",
                a.out.display(),
                thousands(r.samples),
                human(r.bytes_on_disk),
                if to_store { "in the store" } else { "on disk" }
            );
        } else {
            let reused = if r.shards_reused > 0 {
                format!(
                    " (resumed: {} shards kept, {} written)",
                    r.shards_reused, r.shards_written
                )
            } else {
                String::new()
            };
            outln!(
                "wrote {} samples to {} in {:.1} s: {} samples/s, {} {}, peak RSS {}{reused}",
                thousands(r.samples_generated),
                a.out.display(),
                r.seconds,
                thousands(r.samples_per_sec as u64),
                human(r.bytes_on_disk),
                if to_store { "stored" } else { "on disk" },
                human(r.peak_rss_bytes)
            );
        }
        super::print_upload(&published)?;
    }
    Ok(ExitCode::SUCCESS)
}
