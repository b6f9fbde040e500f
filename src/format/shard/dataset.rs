//! A dataset directory: the manifest plus its shards, opened and checked together.

use super::manifest::{Manifest, ShardInfo};
use super::ShardReader;
use crate::store::{local, remote, Store};
use crate::util::error::{Error, Region, Result};
use rayon::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub struct Dataset {
    pub dir: PathBuf,
    pub manifest: Manifest,
    /// Where the manifest and shards are read from.
    store: Arc<dyn Store>,
}

/// One damaged place found by `verify`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Damage {
    pub file: String,
    pub region: String,
    pub what: String,
}

#[derive(Debug, Default, serde::Serialize)]
pub struct VerifyReport {
    pub shards: usize,
    pub blocks: u64,
    pub samples: u64,
    pub bytes: u64,
    pub damage: Vec<Damage>,
}

impl VerifyReport {
    pub fn ok(&self) -> bool {
        self.damage.is_empty()
    }
}

impl Dataset {
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        if remote::is_url(&dir) {
            return Self::open_remote(&dir);
        }
        let store: Arc<dyn Store> = Arc::new(local::Dir::new(&dir));
        let manifest = match Manifest::read_from(&*store) {
            Ok(m) => m,
            // A manifest removed or not yet written by a writer at work: say so.
            Err(e) => {
                crate::format::lock::check_not_written(&dir)?;
                return Err(e);
            }
        };
        Ok(Dataset {
            dir,
            manifest,
            store,
        })
    }

    /// A dataset in an object store or on an HTTP server. Its manifest is the commit point of
    /// its writer: without it there is no dataset, whatever shards are there.
    fn open_remote(url: &Path) -> Result<Self> {
        let mut r = remote::Remote::open_url(url.to_str().unwrap_or_default())?;
        let dir = PathBuf::from(&r.url().shown);
        let manifest = Manifest::read_from(&r).map_err(|e| no_dataset_at(&dir, e))?;
        r.use_cache(&manifest.checksum);
        let store: Arc<dyn Store> = Arc::new(r);
        Ok(Dataset {
            dir,
            manifest,
            store,
        })
    }

    /// Check that every listed shard is there with its listed size, without reading any: a stat
    /// (or HEAD request) each. The error names each one missing or of another size.
    pub fn check_present(&self) -> Result<()> {
        let listed: Vec<(&str, u64)> = self
            .shards()
            .map(|(_, sh)| (sh.file.as_str(), sh.bytes))
            .collect();
        crate::store::check_present(
            &*self.store,
            &self.store.location(super::manifest::FILE_NAME),
            &listed,
        )
    }

    /// Whether the dataset is read from an object store or HTTP server.
    pub fn is_remote(&self) -> bool {
        remote::is_url(&self.dir)
    }

    pub fn shard_path(&self, info: &ShardInfo) -> PathBuf {
        self.dir.join(&info.file)
    }

    /// Open a shard and check that it is the one the manifest describes.
    pub fn open_shard(&self, info: &ShardInfo) -> Result<ShardReader> {
        let r = self.open_shard_checked(info);
        if r.is_err() && !self.is_remote() {
            // A shard replaced or removed by a writer at work (`--force`): say so, rather than
            // calling the dataset damaged. Either way the old and new data are never mixed.
            crate::format::lock::check_not_written(&self.dir)?;
        }
        r
    }

    fn open_shard_checked(&self, info: &ShardInfo) -> Result<ShardReader> {
        let path = self.store.location(&info.file);
        let r =
            ShardReader::from_object(path.clone(), self.store.open_sized(&info.file, info.bytes)?)?;
        let m = &self.manifest;
        let bad = |what: String| Error::corrupt(&path, Region::File, what);
        if r.header.spec != m.sample {
            return Err(bad(format!(
                "holds {} {} samples, the manifest says {} {}",
                r.header.spec.shape, r.header.spec.dtype, m.sample.shape, m.sample.dtype
            )));
        }
        if r.header.codec != m.codec.code() {
            return Err(bad("codec differs from the manifest".into()));
        }
        if r.header.num_classes != m.num_classes() {
            return Err(bad(format!(
                "has {} classes, the manifest says {}",
                r.header.num_classes,
                m.num_classes()
            )));
        }
        let (fb, nf) = (m.fields.bytes() as u64, m.fields.0.len());
        if r.header.field_bytes as u64 != fb || r.header.num_fields as usize != nf {
            return Err(bad(format!(
                "holds {} fields of {} bytes a sample, the manifest declares {nf} of {fb}",
                r.header.num_fields, r.header.field_bytes
            )));
        }
        let footer_sum = format!("{:016x}", r.trailer.footer_xxh3);
        if r.file_len != info.bytes
            || r.header.num_samples != info.samples
            || r.header.num_blocks != info.blocks
            || footer_sum != info.footer_xxh3
        {
            return Err(bad(format!(
                "is not the shard the manifest lists ({} bytes, {} samples, {} blocks, footer {footer_sum}; \
                 manifest: {} bytes, {} samples, {} blocks, footer {})",
                r.file_len, r.header.num_samples, r.header.num_blocks, info.bytes, info.samples, info.blocks, info.footer_xxh3
            )));
        }
        Ok(r.with_fields(m.fields.clone()))
    }

    /// Open `infos` (`open_shard` each), in their order. From a store over a network many are
    /// opened at once: each is three round trips (header, trailer, footer).
    pub fn open_shards(&self, infos: &[&ShardInfo]) -> Result<Vec<ShardReader>> {
        if !self.store.remote() || infos.len() < 2 {
            return infos.iter().map(|i| self.open_shard(i)).collect();
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        let opened: Vec<std::sync::Mutex<Option<Result<ShardReader>>>> =
            infos.iter().map(|_| std::sync::Mutex::new(None)).collect();
        std::thread::scope(|s| {
            for _ in 0..infos.len().min(OPENS_IN_FLIGHT) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= infos.len() {
                        return;
                    }
                    *opened[i].lock().unwrap() = Some(self.open_shard(infos[i]));
                });
            }
        });
        opened
            .into_iter()
            .map(|m| m.into_inner().unwrap().expect("every shard was opened"))
            .collect()
    }

    /// Whether the dataset's objects come over a network (`Store::remote`).
    pub fn remote_store(&self) -> bool {
        self.store.remote()
    }

    /// Every shard of every split, in manifest order.
    pub fn shards(&self) -> impl Iterator<Item = (&str, &ShardInfo)> {
        self.manifest
            .splits
            .iter()
            .flat_map(|(name, s)| s.shards.iter().map(move |sh| (name.as_str(), sh)))
    }

    /// Read and check every block of every shard. Keeps going past damage so that the report names
    /// every damaged shard and block. `progress` is told the stored bytes of each block checked.
    /// Stops early, with a partial report, once `crate::util::interrupt` is set: the caller checks it.
    pub fn verify(&self, progress: &(dyn Fn(u64) + Sync)) -> VerifyReport {
        let mut report = VerifyReport::default();
        let stopped = || crate::util::interrupt::requested().is_some();
        for (_, info) in self.shards() {
            if stopped() {
                break;
            }
            report.shards += 1;
            let r = match self.open_shard(info) {
                Ok(r) => r,
                Err(e) => {
                    report.damage.push(damage(&info.file, &e));
                    progress(info.bytes);
                    continue;
                }
            };
            report.bytes += r.file_len;
            let results: Vec<(u64, Option<Damage>)> = (0..r.num_blocks())
                .into_par_iter()
                .map(|i| {
                    if stopped() {
                        return (0, None);
                    }
                    let res = r.read_block(i);
                    progress(r.entry(i).stored_len);
                    (
                        r.entry(i).num_samples as u64,
                        res.err().map(|e| damage(&info.file, &e)),
                    )
                })
                .collect();
            for (n, d) in results {
                report.blocks += 1;
                report.samples += n;
                report.damage.extend(d);
            }
        }
        report
    }
}

/// Shards `open_shards` opens at once from a store over a network.
const OPENS_IN_FLIGHT: usize = 32;

/// A store's missing manifest said as what it means: there is no dataset at that URL.
pub fn no_dataset_at(url: &Path, e: Error) -> Error {
    match e {
        Error::Io { cause, .. } if cause.kind() == std::io::ErrorKind::NotFound => {
            Error::Invalid(format!(
                "{}: no dataset there: it has no {} (a wrong URL, or an upload that stopped \
                 before its manifest, the last object a writer puts)",
                url.display(),
                super::manifest::FILE_NAME
            ))
        }
        e => e,
    }
}

fn damage(file: &str, e: &Error) -> Damage {
    match e {
        Error::Corrupt { region, what, .. } => Damage {
            file: file.to_string(),
            region: region.to_string(),
            what: what.clone(),
        },
        other => Damage {
            file: file.to_string(),
            region: Region::File.to_string(),
            what: match other {
                Error::Io { cause, .. } => cause.to_string(),
                o => o.to_string(),
            },
        },
    }
}

/// Largest stored size of the shards in a dataset: what `verify` reads, for a progress bar.
pub fn total_bytes(ds: &Dataset) -> u64 {
    ds.shards().map(|(_, s)| s.bytes).sum()
}
