//! Every file prep writes goes through here, so that a failed write (a full disk, a quota, a
//! read-only folder) ends the same way everywhere: the error names the file and the OS's reason,
//! and the temporary file it was written under is removed, so that what was complete before (a
//! shard, a manifest, a checkpoint) is all a reader ever sees.
//!
//! Test-only: `PREP_TEST_FAIL_WRITE=STAGE:BYTES` lets the files of one stage take `BYTES` bytes
//! in all in this process and then fails their next write with ENOSPC ("No space left on
//! device"), as a full disk would: a test of every stage without a small file system to fill.
//! Stages, by file name: `shard`, `manifest`, `colmajor` (images and labels files), `checkpoint`,
//! `metrics`, `plot` (PNG files), `rejects`.

use crate::util::error::{IoContext, Result};
use std::fs::File;
use std::io::{self, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

pub const FAIL_WRITE_ENV: &str = "PREP_TEST_FAIL_WRITE";

/// The stage `path` belongs to, by its name (a `.tmp` suffix aside). The names are those of the
/// rooms above (`format::shard::manifest::FILE_NAME`, `train::checkpoint::FILE`,
/// `convert::REJECTS`), written out here so that this room imports none of them; each of those
/// rooms tests that its name maps to its stage.
pub fn stage(path: &Path) -> &'static str {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = name.strip_suffix(".tmp").unwrap_or(&name);
    if name.ends_with(".shard") {
        "shard"
    } else if name == "manifest.json" {
        "manifest"
    } else if (name.starts_with("images_") || name.starts_with("labels_")) && name.ends_with(".bin")
    {
        "colmajor"
    } else if name == "checkpoint.safetensors" {
        "checkpoint"
    } else if name == "metrics.jsonl" {
        "metrics"
    } else if name.ends_with(".png") {
        "plot"
    } else if name == "rejects.jsonl" {
        "rejects"
    } else {
        "other"
    }
}

/// The bytes left to the stage named by `PREP_TEST_FAIL_WRITE`, when `path` is of that stage.
fn budget(path: &Path) -> Option<&'static AtomicU64> {
    static INJECTED: OnceLock<Option<(String, AtomicU64)>> = OnceLock::new();
    let (stage_name, left) = INJECTED
        .get_or_init(|| {
            let v = std::env::var(FAIL_WRITE_ENV).ok()?;
            let (s, n) = v.split_once(':')?;
            Some((s.to_string(), AtomicU64::new(n.parse().ok()?)))
        })
        .as_ref()?;
    (stage_name == stage(path)).then_some(left)
}

/// Take up to `want` bytes from `budget`; returns how many it gave.
fn take(budget: &AtomicU64, want: u64) -> u64 {
    let mut got = 0;
    let _ = budget.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
        got = left.min(want);
        Some(left - got)
    });
    got
}

fn no_space() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOSPC)
}

/// A file being written (created, or truncated).
pub struct OutFile {
    file: File,
    budget: Option<&'static AtomicU64>,
}

impl OutFile {
    pub fn create(path: &Path) -> io::Result<Self> {
        Ok(OutFile {
            file: File::create(path)?,
            budget: budget(path),
        })
    }

    pub fn file(&self) -> &File {
        &self.file
    }
}

impl Write for OutFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = match self.budget {
            None => buf.len(),
            Some(b) => take(b, buf.len() as u64) as usize,
        };
        if n == 0 && !buf.is_empty() {
            return Err(no_space());
        }
        self.file.write(&buf[..n])
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl Seek for OutFile {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.file.seek(pos)
    }
}

/// Give `file` (written as `path`) its `len` bytes on disk now, so that a full disk is an error
/// here rather than a SIGBUS when a memory map of the file is written. Where the file system
/// cannot allocate ahead, the file stays sparse as before.
pub fn reserve(file: &File, path: &Path, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    if let Some(b) = budget(path) {
        if take(b, len) < len {
            return Err(no_space());
        }
    }
    let Ok(len) = libc::off_t::try_from(len) else {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    };
    if len == 0 {
        return Ok(());
    }
    loop {
        // SAFETY: fallocate on a descriptor `file` owns; it only changes the file's allocation.
        if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => return Ok(()),
            _ => return Err(e),
        }
    }
}

/// A temporary file, removed when dropped unless `rename_to` put it in place: a write that fails
/// (or is interrupted) leaves no half-written file behind.
pub struct Temp {
    path: PathBuf,
    placed: bool,
}

impl Temp {
    /// The temporary name of `path` (`path.tmp`); nothing is created yet.
    pub fn of(path: &Path) -> Self {
        Temp {
            path: temp_path(path),
            placed: false,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Rename to `to`, durably.
    pub fn rename_to(mut self, to: &Path) -> Result<()> {
        // Once renamed, there is nothing to remove even if the directory sync fails.
        let r = std::fs::rename(&self.path, to).at(to);
        self.placed = r.is_ok();
        r?;
        sync_dir(to)
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        if !self.placed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The temporary name a file has while it is written.
pub fn temp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}

/// Rename, then flush the directory so the new name survives a power loss as well as a crash.
pub fn rename_durably(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).at(to)?;
    sync_dir(to)
}

fn sync_dir(to: &Path) -> Result<()> {
    if let Some(dir) = to.parent() {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        File::open(dir).and_then(|d| d.sync_all()).at(dir)?;
    }
    Ok(())
}

/// Write a file atomically: temporary name, flush to disk, rename. A failure names `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = Temp::of(path);
    let mut f = OutFile::create(tmp.path()).at(path)?;
    f.write_all(bytes).at(path)?;
    f.file().sync_all().at(path)?;
    drop(f);
    tmp.rename_to(path)
}

#[cfg(test)]
mod tests {

    /// The names `stage` writes out are the ones the rooms above use.
    #[test]
    fn stages_know_the_names_of_the_rooms_above() {
        use std::path::Path;
        let of = |n: &str| stage(Path::new(n));
        assert_eq!(of(crate::format::shard::manifest::FILE_NAME), "manifest");
        assert_eq!(of(crate::train::checkpoint::FILE), "checkpoint");
        assert_eq!(of(crate::convert::REJECTS), "rejects");
    }

    use super::*;

    #[test]
    fn stages_by_name() {
        for (name, s) in [
            ("ds/train/train-00003.shard.tmp", "shard"),
            ("ds/manifest.json", "manifest"),
            ("ds/images_test.bin.tmp", "colmajor"),
            ("ds/labels_train.bin", "colmajor"),
            ("run/checkpoint.safetensors.tmp", "checkpoint"),
            ("run/metrics.jsonl", "metrics"),
            ("run/curves.png", "plot"),
            ("ds/rejects.jsonl.tmp", "rejects"),
            ("run/config.json", "other"),
        ] {
            assert_eq!(stage(Path::new(name)), s, "{name}");
        }
    }

    #[test]
    fn failed_write_leaves_no_temporary_file() {
        let t = tempfile::tempdir().unwrap();
        let blocked = t.path().join("sub");
        std::fs::write(&blocked, b"a file where a folder should be").unwrap();
        let e = write_atomic(&blocked.join("manifest.json"), b"{}").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with(&blocked.join("manifest.json").display().to_string()),
            "{msg}"
        );
        assert_eq!(msg.matches("os error").count(), 1, "{msg}");
        // Written, then dropped before the rename: removed.
        let p = t.path().join("x.json");
        let tmp = Temp::of(&p);
        std::fs::write(tmp.path(), b"half").unwrap();
        drop(tmp);
        assert!(!temp_path(&p).exists());
        write_atomic(&p, b"whole").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"whole");
        assert!(!temp_path(&p).exists());
    }
}
