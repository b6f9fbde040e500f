//! A local cache of the byte ranges read from a store over a network (`prep train --cache DIR
//! --cache-bytes N`): each range read once is kept in a file, until the cache holds N bytes; from
//! then on nothing more is added (an epoch's random order would make any eviction throw out what
//! the next epoch needs as often as not). So the first epoch never exceeds N, and every later one
//! reads what fits from the local disk. Each file ends with the xxh3 of its bytes: one damaged on
//! the local disk is removed and read from the store again. Entries live under a folder per
//! dataset version (its URL and manifest checksum), so a dataset replaced in the store never meets
//! its old blocks.

use crate::util::error::{Error, IoContext, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use twox_hash::XxHash3_64;

pub struct BlockCache {
    dir: PathBuf,
    cap: u64,
    used: AtomicU64,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
}

static CACHE: OnceLock<Arc<BlockCache>> = OnceLock::new();

/// Use `dir` (created if need be) as this process's cache of store reads, holding at most `cap`
/// bytes; what an earlier run left there counts.
pub fn configure(dir: &Path, cap: u64) -> Result<()> {
    std::fs::create_dir_all(dir).at(dir)?;
    let used = folder_bytes(dir);
    let c = Arc::new(BlockCache {
        dir: dir.to_path_buf(),
        cap,
        used: AtomicU64::new(used),
        hits: AtomicU64::new(0),
        misses: AtomicU64::new(0),
    });
    CACHE
        .set(c)
        .map_err(|_| Error::Invalid("the store cache is configured once per process".into()))
}

/// This process's cache, if one is configured.
pub fn get() -> Option<Arc<BlockCache>> {
    CACHE.get().cloned()
}

fn folder_bytes(d: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(d) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => folder_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

impl BlockCache {
    /// The folder of one dataset version's entries.
    pub fn namespace(&self, url: &str, version: &str) -> PathBuf {
        self.dir.join(format!(
            "{:016x}",
            XxHash3_64::oneshot(format!("{url}\n{version}").as_bytes())
        ))
    }

    fn entry(ns: &Path, object: &str, offset: u64, len: usize) -> PathBuf {
        ns.join(object.replace('/', "%2F"))
            .join(format!("{offset}-{len}"))
    }

    /// Fill `buf` with the bytes of `object` at `offset`, if the cache holds them intact.
    pub fn read(&self, ns: &Path, object: &str, offset: u64, buf: &mut [u8]) -> bool {
        let p = Self::entry(ns, object, offset, buf.len());
        let Ok(bytes) = std::fs::read(&p) else {
            self.misses.fetch_add(1, Relaxed);
            return false;
        };
        let n = buf.len();
        let intact =
            bytes.len() == n + 8 && XxHash3_64::oneshot(&bytes[..n]).to_le_bytes() == bytes[n..];
        if !intact {
            // Damaged on the local disk: read from the store again.
            if std::fs::remove_file(&p).is_ok() {
                self.used
                    .fetch_sub((bytes.len() as u64).min(self.used.load(Relaxed)), Relaxed);
            }
            self.misses.fetch_add(1, Relaxed);
            return false;
        }
        buf.copy_from_slice(&bytes[..n]);
        self.hits.fetch_add(1, Relaxed);
        true
    }

    /// Keep `data` (the bytes of `object` at `offset`) if it fits under the cap. A failure to
    /// write only means the bytes are read from the store again.
    pub fn put(&self, ns: &Path, object: &str, offset: u64, data: &[u8]) {
        let size = data.len() as u64 + 8;
        // Reserve the room first: concurrent readers never take the cache past its cap.
        let reserved = self
            .used
            .fetch_update(Relaxed, Relaxed, |u| {
                (u + size <= self.cap).then_some(u + size)
            })
            .is_ok();
        if !reserved {
            return;
        }
        let p = Self::entry(ns, object, offset, data.len());
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        let written = p
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|_| {
                let mut bytes = Vec::with_capacity(data.len() + 8);
                bytes.extend_from_slice(data);
                bytes.extend_from_slice(&XxHash3_64::oneshot(data).to_le_bytes());
                std::fs::write(&tmp, bytes)
            })
            .and_then(|_| std::fs::rename(&tmp, &p));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
            self.used.fetch_sub(size, Relaxed);
        }
    }

    /// Bytes the cache holds (or has reserved).
    pub fn used(&self) -> u64 {
        self.used.load(Relaxed)
    }

    pub fn cap(&self) -> u64 {
        self.cap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_read_back_stop_at_the_cap_and_damage_is_dropped() {
        let d = tempfile::tempdir().unwrap();
        let c = BlockCache {
            dir: d.path().to_path_buf(),
            cap: 100,
            used: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        };
        let ns = c.namespace("s3://b/ds", "v1");
        let mut buf = [0u8; 40];
        assert!(!c.read(&ns, "train/a.shard", 0, &mut buf));
        c.put(&ns, "train/a.shard", 0, &[7u8; 40]);
        c.put(&ns, "train/a.shard", 40, &[8u8; 40]);
        assert_eq!(c.used(), 96);
        // A third entry would pass the cap: not kept.
        c.put(&ns, "train/a.shard", 80, &[9u8; 40]);
        assert_eq!(c.used(), 96);
        assert!(!c.read(&ns, "train/a.shard", 80, &mut buf));
        assert!(c.read(&ns, "train/a.shard", 40, &mut buf));
        assert_eq!(buf, [8u8; 40]);
        // Another version of the dataset has its own entries.
        assert!(!c.read(
            &c.namespace("s3://b/ds", "v2"),
            "train/a.shard",
            40,
            &mut buf
        ));
        // A damaged entry is removed and not used.
        let p = BlockCache::entry(&ns, "train/a.shard", 0, 40);
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[3] ^= 1;
        std::fs::write(&p, bytes).unwrap();
        assert!(!c.read(&ns, "train/a.shard", 0, &mut buf));
        assert!(!p.exists());
        assert_eq!(c.used(), 48);
        assert_eq!(folder_bytes(d.path()), 48);
    }
}
