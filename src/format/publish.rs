//! A dataset written locally, published to an object store: its shards first, then its manifest,
//! the commit point (before it is there a reader finds no dataset, never part of one). A shard
//! already in the store with the listed size and footer checksum is kept, so a killed upload
//! resumes where it stopped. One writer at a time holds the folder's lease, an object created
//! with a conditional write (`PutMode::Create`).

use crate::format::shard::manifest::{self, Manifest};
use crate::format::shard::ShardReader;
use crate::store::remote::{runtime, store_error, Remote};
use crate::store::Store;
use crate::util::error::{Error, Result};
use object_store::{ObjectStoreExt, PutMode, PutPayload, WriteMultipart};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;

/// The lease object of a dataset folder in a store.
pub const LEASE: &str = ".prep-lease.json";

/// Parts of a multipart upload (S3's smallest part but the last is 5 MiB).
const PART_BYTES: usize = 16 << 20;
/// Shards uploaded at once, and parts in flight per shard.
const SHARDS_AT_ONCE: usize = 4;
const PARTS_IN_FLIGHT: usize = 4;
/// Finished shards an [`Uploader`] lets wait beside those it is uploading: with them, what the
/// staging folder holds at most.
const SHARDS_WAITING: usize = 4;

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Published {
    pub shards_uploaded: usize,
    /// Shards found in the store already, complete (a resumed upload).
    pub shards_kept: usize,
    pub bytes_uploaded: u64,
}

/// One writer's hold on a dataset folder in a store, released (deleted) when dropped.
pub struct Lease<'a> {
    remote: &'a Remote,
    /// Whether the store made the lease by a conditional write (else nothing was written).
    held: bool,
}

impl<'a> Lease<'a> {
    /// Take the lease of `remote`'s folder, or say who holds it. Where the store cannot write
    /// conditionally, `warn` is told so (nothing then keeps two writers apart).
    pub fn take(remote: &'a Remote, warn: &dyn Fn(&str)) -> Result<Lease<'a>> {
        let who = serde_json::json!({
            "host": crate::format::lock::host_name(),
            "pid": std::process::id(),
            "since_unix": std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            "command": crate::util::command_args(),
        });
        let key = remote.key(LEASE);
        let body = serde_json::to_vec_pretty(&who).unwrap_or_default();
        let put = |mode: PutMode| {
            let body = PutPayload::from(body.clone());
            runtime().block_on(remote.inner().put_opts(&key, body, mode.into()))
        };
        match put(PutMode::Create) {
            Ok(_) => Ok(Lease { remote, held: true }),
            Err(object_store::Error::AlreadyExists { .. }) => {
                let lease = remote
                    .read(LEASE, 64 << 10, "a lease")
                    .ok()
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
                if lease.as_ref().is_some_and(left_by_a_dead_process_here) {
                    // Its writer was killed on this host: the lease is this job's to take over.
                    put(PutMode::Overwrite).map_err(|e| store_error(&remote.location(LEASE), e))?;
                    return Ok(Lease { remote, held: true });
                }
                let holder = lease
                    .map(|v| describe_holder(&v))
                    .unwrap_or_else(|| "its lease cannot be read".into());
                Err(Error::Busy(format!(
                    "{} is being written by another prep ({holder}); wait for it to finish, or if \
                     that writer is gone, delete {} and run again",
                    remote.url().shown,
                    remote.location(LEASE).display()
                )))
            }
            Err(object_store::Error::NotImplemented { .. })
            | Err(object_store::Error::NotSupported { .. }) => {
                warn(&format!(
                    "{} cannot make a conditional write, so prep cannot keep two writers of {} apart: \
                     make sure only one job writes there at a time",
                    remote.url().scheme.name(),
                    remote.url().shown
                ));
                Ok(Lease {
                    remote,
                    held: false,
                })
            }
            // A write that finds nothing there: the bucket (container) itself is missing.
            Err(object_store::Error::NotFound { .. }) => Err(Error::Invalid(format!(
                "{}: the store has no such bucket (or container); create it first",
                remote.url().shown
            ))),
            Err(e) => Err(store_error(&remote.location(LEASE), e)),
        }
    }
}

/// Whether a lease names a process of this host that is no longer running (a writer killed
/// before it could remove its lease).
fn left_by_a_dead_process_here(v: &serde_json::Value) -> bool {
    let here = v["host"].as_str() == Some(crate::format::lock::host_name().as_str());
    let pid = v["pid"]
        .as_u64()
        .and_then(|p| i32::try_from(p).ok())
        .filter(|&p| p > 0);
    match (here, pid) {
        // SAFETY: signal 0 only asks whether the process exists.
        (true, Some(p)) => {
            let alive = unsafe { libc::kill(p, 0) } == 0;
            !alive && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        }
        _ => false,
    }
}

/// "process 12 on host h, for 40 s" from a lease's contents.
fn describe_holder(v: &serde_json::Value) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!(
        "process {} on host {}, for {} s",
        v["pid"].as_u64().map_or("?".into(), |p| p.to_string()),
        v["host"].as_str().unwrap_or("?"),
        v["since_unix"]
            .as_u64()
            .map_or("?".into(), |t| now.saturating_sub(t).to_string())
    )
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if self.held {
            let key = self.remote.key(LEASE);
            let _ = runtime().block_on(self.remote.inner().delete(&key));
        }
    }
}

/// Whether the store holds a dataset (its manifest) at `remote`.
pub fn has_manifest(remote: &Remote) -> Result<bool> {
    match remote.size(manifest::FILE_NAME) {
        Ok(_) => Ok(true),
        Err(Error::Io { cause, .. }) if cause.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Remove the manifest at `remote` (before a dataset is replaced: a reader then finds none
/// rather than old and new shards mixed).
pub fn withdraw(remote: &Remote) -> Result<()> {
    let key = remote.key(manifest::FILE_NAME);
    runtime()
        .block_on(remote.inner().delete(&key))
        .map_err(|e| store_error(&remote.location(manifest::FILE_NAME), e))
}

/// Uploads shards while the rest of a dataset is written: each finished shard handed to [`send`]
/// is uploaded in the background (a few at once) and its local file removed once the store holds
/// it, so that a staging folder holds a few shards, not the dataset. `send` waits while
/// `SHARDS_WAITING` shards wait. [`publish`] then uploads what is left and the manifest.
///
/// [`send`]: Uploader::send
pub struct Uploader {
    tx: Option<SyncSender<(PathBuf, manifest::ShardInfo)>>,
    worker: Option<std::thread::JoinHandle<Result<Streamed>>>,
    stop: Arc<AtomicBool>,
}

impl std::fmt::Debug for Uploader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Uploader")
    }
}

impl Uploader {
    pub fn start(remote: &Remote) -> Uploader {
        let (tx, rx) = sync_channel::<(PathBuf, manifest::ShardInfo)>(SHARDS_WAITING);
        let stop = Arc::new(AtomicBool::new(false));
        let (remote, halt) = (remote.clone(), stop.clone());
        let worker = std::thread::Builder::new()
            .name("prep-upload".into())
            .spawn(move || -> Result<Streamed> {
                let mut done = Streamed::default();
                let mut flying = std::collections::VecDeque::new();
                let land = |h: tokio::task::JoinHandle<Result<(String, u64)>>, d: &mut Streamed| {
                    let (name, bytes) = runtime()
                        .block_on(h)
                        .map_err(|e| Error::Invalid(format!("an upload failed: {e}")))??;
                    d.report.shards_uploaded += 1;
                    d.report.bytes_uploaded += bytes;
                    d.names.insert(name);
                    Ok::<_, Error>(())
                };
                for (path, info) in rx {
                    if halt.load(Ordering::Relaxed) {
                        break;
                    }
                    if complete_in_store(&remote, &info) {
                        // A resumed job made this shard again; the store has it whole.
                        let _ = std::fs::remove_file(&path);
                        done.report.shards_kept += 1;
                        done.names.insert(info.file);
                        continue;
                    }
                    if flying.len() == SHARDS_AT_ONCE {
                        land(flying.pop_front().expect("one in flight"), &mut done)?;
                    }
                    let remote = remote.clone();
                    flying.push_back(runtime().spawn(async move {
                        let bytes = upload(&path, &remote, &info.file).await?;
                        let _ = std::fs::remove_file(&path);
                        Ok((info.file, bytes))
                    }));
                }
                for h in flying {
                    land(h, &mut done)?;
                }
                Ok(done)
            })
            .expect("starting the upload thread");
        Uploader {
            tx: Some(tx),
            worker: Some(worker),
            stop,
        }
    }

    /// Hand over the finished shard `info` at `path` (in the staging folder). Waits while the
    /// uploader is behind; an error if it has stopped (`finish` says why).
    pub fn send(&self, path: &Path, info: &manifest::ShardInfo) -> Result<()> {
        let tx = self.tx.as_ref().expect("not finished");
        tx.send((path.to_path_buf(), info.clone()))
            .map_err(|_| Error::Invalid("the upload of finished shards stopped".into()))
    }

    /// Wait for the shards handed over (or, after a failed write, `abandon` the waiting ones) and
    /// say what was uploaded.
    pub fn finish(mut self, abandon: bool) -> Result<Streamed> {
        self.stop.store(abandon, Ordering::Relaxed);
        drop(self.tx.take());
        self.worker
            .take()
            .expect("finished once")
            .join()
            .map_err(|_| Error::Invalid("the upload thread panicked".into()))?
    }
}

/// What an [`Uploader`] did: its counts, and the shards the store holds whole from it.
#[derive(Debug, Default)]
pub struct Streamed {
    pub report: Published,
    pub names: HashSet<String>,
}

/// Upload the dataset in local folder `local` to `remote`: every shard its manifest lists that the
/// store does not hold already (`streamed`: those an [`Uploader`] put there), then the manifest.
/// `progress` is told the bytes of each shard done.
pub fn publish(
    local: &Path,
    remote: &Remote,
    progress: &(dyn Fn(u64) + Sync),
    streamed: Streamed,
) -> Result<Published> {
    let m = Manifest::read(local)?;
    let mbytes = crate::format::shard::manifest::read_capped(&local.join(manifest::FILE_NAME))?;
    let shards: Vec<_> = m.splits.values().flat_map(|s| s.shards.iter()).collect();
    let kept: Vec<bool> = {
        use rayon::prelude::*;
        shards
            .par_iter()
            .map(|info| streamed.names.contains(&info.file) || complete_in_store(remote, info))
            .collect()
    };
    let mut report = streamed.report;
    let todo: Vec<_> = shards
        .iter()
        .zip(&kept)
        .filter_map(|(info, &k)| {
            if k {
                progress(info.bytes);
            }
            (!k).then_some(*info)
        })
        .collect();
    // Held by the store before publishing: those the uploader found there, and the rest.
    report.shards_kept = (shards.len() - todo.len()).saturating_sub(report.shards_uploaded);
    for chunk in todo.chunks(SHARDS_AT_ONCE) {
        crate::util::interrupt::check()?;
        let paths: Vec<_> = chunk.iter().map(|info| local.join(&info.file)).collect();
        let uploads = chunk
            .iter()
            .zip(&paths)
            .map(|(info, p)| upload(p, remote, &info.file));
        let done: Vec<Result<u64>> = runtime().block_on(futures::future::join_all(uploads));
        for (info, r) in chunk.iter().zip(done) {
            report.bytes_uploaded += r?;
            report.shards_uploaded += 1;
            progress(info.bytes);
        }
    }
    crate::util::interrupt::check()?;
    // The commit point.
    let key = remote.key(manifest::FILE_NAME);
    report.bytes_uploaded += mbytes.len() as u64;
    runtime()
        .block_on(remote.inner().put(&key, PutPayload::from(mbytes)))
        .map_err(|e| store_error(&remote.location(manifest::FILE_NAME), e))?;
    Ok(report)
}

/// Whether the store holds shard `info` whole: its size, and its footer's checksum, as listed.
fn complete_in_store(remote: &Remote, info: &manifest::ShardInfo) -> bool {
    if remote.size(&info.file).ok() != Some(info.bytes) {
        return false;
    }
    let Ok(obj) = remote.open(&info.file) else {
        return false;
    };
    ShardReader::from_object(remote.location(&info.file), obj).is_ok_and(|r| {
        r.file_len == info.bytes && format!("{:016x}", r.trailer.footer_xxh3) == info.footer_xxh3
    })
}

/// Upload local file `path` as object `name`: one request when small, else a multipart upload
/// (aborted on error, so no part is left behind). Returns the bytes sent.
async fn upload(path: &Path, remote: &Remote, name: &str) -> Result<u64> {
    use std::io::Read;
    let at = remote.location(name);
    let key = remote.key(name);
    let mut f = crate::store::local::open(path)?;
    let len = f.metadata().map_err(|e| Error::io(path, e))?.len();
    if len <= PART_BYTES as u64 {
        let mut buf = Vec::with_capacity(len as usize);
        f.read_to_end(&mut buf).map_err(|e| Error::io(path, e))?;
        remote
            .inner()
            .put(&key, PutPayload::from(buf))
            .await
            .map_err(|e| store_error(&at, e))?;
        return Ok(len);
    }
    let up = remote
        .inner()
        .put_multipart(&key)
        .await
        .map_err(|e| store_error(&at, e))?;
    let mut w = WriteMultipart::new_with_chunk_size(up, PART_BYTES);
    let mut buf = vec![0u8; PART_BYTES];
    let mut sent = 0u64;
    loop {
        if let Err(e) = w.wait_for_capacity(PARTS_IN_FLIGHT).await {
            let _ = w.abort().await;
            return Err(store_error(&at, e));
        }
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                let _ = w.abort().await;
                return Err(Error::io(path, e));
            }
        };
        w.write(&buf[..n]);
        sent += n as u64;
    }
    w.finish().await.map_err(|e| store_error(&at, e))?;
    Ok(sent)
}
