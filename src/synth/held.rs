//! `prep synth --out URL` run again: whether the store already holds the dataset these options
//! make, as a local rerun asks of its folder (there the lock and the partial marker answer it).

use super::job::{differences, source_params};
use super::{SynthOptions, SynthReport, Task};
use crate::format::publish::has_manifest;
use crate::format::shard::Dataset;
use crate::store::remote::Remote;
use crate::util::error::{Error, Result};
use std::time::Instant;

/// The report of nothing to do where the store at `opts.out` holds exactly this dataset (its
/// manifest records the same parameters, every shard is there at its listed size); None where
/// it holds no dataset (no manifest: nothing, or an upload that has not finished). A different
/// dataset there is refused, its differences named, as locally.
pub fn held_by_store(opts: &SynthOptions, task: Task) -> Result<Option<SynthReport>> {
    let t0 = Instant::now();
    let asked = source_params(opts, task)?;
    let url = opts.out.to_str().unwrap_or_default();
    if !has_manifest(&Remote::open_url(url)?)? {
        return Ok(None);
    }
    let ds = Dataset::open(&opts.out)?;
    let found = &ds.manifest.provenance.source;
    if found != &asked {
        return Err(Error::Invalid(format!(
            "{} already holds a different dataset ({}); choose another --out, or pass --force to replace it",
            ds.dir.display(),
            differences(Some(found), &asked)
        )));
    }
    ds.check_present()?;
    let bytes = ds.shards().map(|(_, s)| s.bytes).sum();
    Ok(Some(SynthReport {
        out: ds.dir.clone(),
        samples: ds.manifest.splits.values().map(|s| s.samples).sum(),
        samples_generated: 0,
        seconds: t0.elapsed().as_secs_f64(),
        samples_per_sec: 0.0,
        shards_written: 0,
        shards_reused: 0,
        bytes_on_disk: bytes,
        peak_rss_bytes: crate::util::mem::peak_rss_bytes(),
        already_complete: true,
    }))
}
