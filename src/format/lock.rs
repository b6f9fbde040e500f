//! One writer per output folder (`formats/locking.md`).
//!
//! A writer (`synth`, `convert`, `merge`, `train --out/--resume`) holds an exclusive `flock` on
//! `OUT/.prep.lock` for its whole run. The file says who holds it (pid, host, command, since
//! when) so that a second writer, refused at once, can name the holder. The kernel drops a flock
//! when its process dies, so a killed writer never blocks the next one: a stale lock file with no
//! lock held is simply locked again. The lock file is removed when the run ends (while still
//! locked), and a folder the writer created is removed with it when nothing else is left in it, so
//! a failed run leaves nothing behind.
//!
//! Readers (`train`, `verify`, `inspect`, `eval`, `merge` and `convert` of a dataset) take no
//! lasting lock: they probe the lock with a shared `flock` for an instant when they open a
//! dataset, and stop with an error naming the writer while one holds it. A reader that opened a
//! dataset before a writer started never sees a mix either: shards are replaced by rename (an open
//! shard keeps its old contents) and every shard opened later is checked against the manifest's
//! size and footer checksum.

use crate::util::error::{Error, IoContext, Result};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// The lock file's name inside the folder it guards.
pub const LOCK_FILE: &str = ".prep.lock";

/// An exclusive hold on a folder; released (and its lock file removed) on drop.
#[derive(Debug)]
pub struct DirLock {
    dir: PathBuf,
    file: Option<File>,
    created: bool,
}

impl DirLock {
    /// Whether this writer created the folder (it did not exist before).
    pub fn created(&self) -> bool {
        self.created
    }
}

fn flock(f: &File, op: libc::c_int) -> std::io::Result<bool> {
    loop {
        // SAFETY: flock on a file descriptor this File owns.
        let r = unsafe { libc::flock(f.as_raw_fd(), op | libc::LOCK_NB) };
        if r == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => return Ok(false),
            _ => return Err(e),
        }
    }
}

/// True when `f` is still the file at `path` (it was not removed and replaced meanwhile).
fn same_file(f: &File, path: &Path) -> bool {
    match (f.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

pub(crate) fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates on success (we also
    // stop at the buffer's end).
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return "?".into();
    }
    let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn command_line() -> String {
    let mut args = crate::util::command_args();
    if let Some(a) = args.first_mut() {
        if let Some(name) = Path::new(a.as_str()).file_name() {
            *a = name.to_string_lossy().into_owned();
        }
    }
    args.iter()
        .map(|a| {
            if a.is_empty() || a.contains(|c: char| c.is_whitespace() || c == '\'') {
                format!("'{}'", a.replace('\'', "'\\''"))
            } else {
                a.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Local time of the Unix time `secs`, "YYYY-MM-DD HH:MM:SS".
fn local_time(secs: i64) -> String {
    // SAFETY: localtime_r writes the zeroed tm it is given; both pointers are valid.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let t: libc::time_t = secs as libc::time_t;
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return format!("unix time {secs}");
    }
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// "pid 1234 on host h, `prep synth --out c1`, since 2026-01-01 12:00:03", from a lock file's
/// contents (as much of it as was written).
fn holder(f: &mut File) -> String {
    let mut s = String::new();
    // A few hundred bytes when prep wrote it; whatever else is there is not read whole.
    let _ = f.take(1 << 16).read_to_string(&mut s);
    let v: serde_json::Value = serde_json::from_str(&s).unwrap_or_default();
    let pid = v["pid"].as_u64().map_or("?".into(), |p| p.to_string());
    let host = v["host"].as_str().unwrap_or("?");
    let cmd = v["command"].as_str().unwrap_or("?");
    let since = v["since"]
        .as_i64()
        .map_or("an unknown time".into(), local_time);
    format!("pid {pid} on host {host}, `{cmd}`, since {since}")
}

fn busy(dir: &Path, f: &mut File) -> Error {
    Error::Busy(format!(
        "{} is being written by another prep ({}); wait for it or use another --out",
        dir.display(),
        holder(f)
    ))
}

/// Take the exclusive lock on `dir`, creating the folder (and its parents) where it does not
/// exist. Refuses at once, naming the holder, when another process holds it.
pub fn lock_dir(dir: &Path) -> Result<DirLock> {
    let path = dir.join(LOCK_FILE);
    let mut created = false;
    // A few rounds: the folder or the lock file can be removed by a writer that is just ending.
    for _ in 0..100 {
        if !dir.is_dir() {
            match std::fs::create_dir_all(dir) {
                Ok(()) => created = true,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => {}
                Err(e) => return Err(Error::io(dir, e)),
            }
        }
        let mut f = match OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io(&path, e)),
        };
        // Something other than a lock file in its place (a FIFO, a folder): never write to it.
        let ft = f.metadata().at(&path)?.file_type();
        if !ft.is_file() {
            return Err(crate::store::local::not_a_file(&path, &ft));
        }
        // A reader probing the lock holds it shared for an instant: wait that out, but refuse a
        // writer (which holds it exclusively) at once.
        let mut got = false;
        for _ in 0..200 {
            if flock(&f, libc::LOCK_EX).at(&path)? {
                got = true;
                break;
            }
            if flock(&f, libc::LOCK_SH).at(&path)? {
                // Only readers: let go and try again shortly.
                flock(&f, libc::LOCK_UN).at(&path)?;
                std::thread::sleep(std::time::Duration::from_millis(5));
                continue;
            }
            return Err(busy(dir, &mut f));
        }
        if !got {
            return Err(Error::Busy(format!(
                "{} is being read by other processes that do not let go of it; try again",
                dir.display()
            )));
        }
        if !same_file(&f, &path) {
            // The holder removed this file as it ended; lock the one now there.
            continue;
        }
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let info = serde_json::json!({
            "pid": std::process::id(),
            "host": host_name(),
            "command": command_line(),
            "since": since,
        });
        f.set_len(0).at(&path)?;
        f.write_all(format!("{info}\n").as_bytes()).at(&path)?;
        // For the tests of this module's guarantees (tests/integration/hostile/): hold the lock
        // this long before going on, so that a second process surely meets it; a signal ends
        // the wait (the job then stops at its first check).
        if let Some(ms) = std::env::var("PREP_TEST_HOLD_LOCK_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
        {
            let until =
                std::time::Instant::now() + std::time::Duration::from_millis(ms.min(60_000));
            while std::time::Instant::now() < until && crate::util::interrupt::requested().is_none()
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        return Ok(DirLock {
            dir: dir.to_path_buf(),
            file: Some(f),
            created,
        });
    }
    Err(Error::Busy(format!(
        "{}: could not take its lock file {LOCK_FILE} (it keeps being removed)",
        dir.display()
    )))
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // Remove the file while still holding the lock (a writer waiting on this file sees it was
        // removed and locks the new one), then let go.
        let _ = std::fs::remove_file(self.dir.join(LOCK_FILE));
        drop(self.file.take());
        if self.created {
            // Only an empty folder: a failed run leaves nothing, a finished one its output.
            let _ = std::fs::remove_dir(&self.dir);
        }
    }
}

/// A reader's check that no writer holds `dir`: an error naming the writer while one does.
/// Takes no lasting lock and creates nothing (datasets may be read-only).
pub fn check_not_written(dir: &Path) -> Result<()> {
    if crate::store::remote::is_url(dir) {
        // A store's dataset appears whole with its manifest: nothing half-written can be read.
        return Ok(());
    }
    let path = dir.join(LOCK_FILE);
    // Not there (or not a regular file, which no writer made): nothing holds the folder.
    let Ok(mut f) = crate::store::local::open(&path) else {
        return Ok(());
    };
    match flock(&f, libc::LOCK_SH) {
        Ok(true) => {
            let _ = flock(&f, libc::LOCK_UN);
            Ok(())
        }
        Ok(false) => Err(Error::Busy(format!(
            "{} is being written by another prep ({}); wait for it to finish",
            dir.display(),
            holder(&mut f)
        ))),
        // A file system without flock: nothing to check.
        Err(_) => Ok(()),
    }
}
