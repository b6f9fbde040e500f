//! `--out URL` for the commands that write datasets (synth, convert, merge): the dataset is
//! written into a local staging folder by the command's own writer, as for any local output, then
//! published (`prep::format::publish`): shards, then the manifest last. A writer that takes the
//! uploader (synth) hands each shard over as it is finished, and the staging folder holds a few
//! shards at a time. The staging folder is named by the URL, so a killed job run again resumes
//! there and the upload keeps the shards the store holds whole already.

use prep::format::publish::{self, Lease, Published, Uploader};
use prep::store::remote::{self, Remote, Scheme};
use prep::util::error::shown_path;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Run `write` into `out`: directly where it is a local path, else into a staging folder that is
/// then published to the store, with an uploader `write` may hand finished shards to. `force`
/// replaces a dataset already at the URL.
pub fn write_to<T>(
    out: &Path,
    force: bool,
    quiet: bool,
    write: impl FnOnce(&Path, Option<Arc<Uploader>>) -> anyhow::Result<T>,
) -> anyhow::Result<(T, Option<Published>)> {
    if !remote::is_url(out) {
        refuse_url_typo(out)?;
        return Ok((write(out, None)?, None));
    }
    let url = remote::parse(out.to_str().unwrap_or_default())?;
    if url.scheme == Scheme::Http {
        return Err(super::UsageError(format!(
            "{}: prep reads datasets over HTTP but cannot write them there; write to s3://, gs:// or az://, or a local folder the server serves",
            url.shown
        ))
        .into());
    }
    let store = Remote::new(&url)?;
    let warn = |w: &str| eprintln!("warning: {w}");
    let lease = Lease::take(&store, &warn)?;
    if publish::has_manifest(&store)? {
        if !force {
            return Err(super::UsageError(format!(
                "{} already holds a dataset (its manifest.json); --force replaces it",
                url.shown
            ))
            .into());
        }
        // Readers find no dataset from here until the new manifest, never old and new mixed.
        publish::withdraw(&store)?;
    }
    let staging = staging_dir(&url.shown)?;
    let uploader = Arc::new(Uploader::start(&store));
    let written = write(&staging, Some(uploader.clone()));
    let uploader = Arc::try_unwrap(uploader).expect("the writer let go of the uploader");
    let kept = || {
        format!(
            "the dataset is kept in {} and is not in the store yet (no manifest there): the same command uploads what is missing",
            shown_path(&staging)
        )
    };
    let t = match written {
        Ok(t) => t,
        Err(e) => {
            // A failed upload stops the writer: then the upload's error is the one to tell.
            return Err(match uploader.finish(true) {
                Err(up) => anyhow::Error::from(up.when_interrupted(kept)),
                Ok(_) => e,
            });
        }
    };
    let streamed = uploader
        .finish(false)
        .map_err(|e| e.when_interrupted(kept))?;
    let total = prep::format::shard::Manifest::read(&staging)
        .map(|m| {
            m.splits
                .values()
                .flat_map(|s| &s.shards)
                .map(|s| s.bytes)
                .sum()
        })
        .unwrap_or(0);
    let pb = prep::util::progress::bytes_bar(total, "upload", quiet);
    let published = publish::publish(&staging, &store, &|n| pb.inc(n), streamed)
        .map_err(|e| e.when_interrupted(kept))?;
    pb.finish_and_clear();
    drop(lease);
    let _ = std::fs::remove_dir_all(&staging);
    Ok((t, Some(published)))
}

/// Refuse a local path that is a store URL with a slash missing (`s3:/bucket/ds`, `s3:bucket`):
/// written as it stands it would make a local folder named `s3:`.
fn refuse_url_typo(out: &Path) -> anyhow::Result<()> {
    let first = out
        .components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .unwrap_or_default();
    let scheme = first
        .split(':')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    let stores = [
        "s3", "s3a", "gs", "az", "azure", "abfs", "abfss", "http", "https",
    ];
    if first.contains(':') && stores.contains(&scheme.as_str()) {
        return Err(super::UsageError(format!(
            "{}: a store URL is written {scheme}://BUCKET/PATH (with two slashes); as it stands this would be a local folder named `{first}`",
            out.display()
        ))
        .into());
    }
    Ok(())
}

/// The local folder a dataset bound for `url` is written in first: under PREP_STAGING, else the
/// system's temporary folder, named by the URL (the same URL, the same folder: a rerun resumes).
fn staging_dir(url: &str) -> anyhow::Result<PathBuf> {
    let root = std::env::var_os("PREP_STAGING")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("prep-staging"));
    let name = format!("{:016x}", twox_hash::XxHash3_64::oneshot(url.as_bytes()));
    let dir = root.join(name);
    std::fs::create_dir_all(&dir)
        .map_err(|e| anyhow::anyhow!("creating the staging folder {}: {e}", dir.display()))?;
    Ok(dir)
}
