//! Datasets in object stores and over HTTP: a [`Store`] on the `object_store` crate. Objects are
//! read by byte range (the manifest whole, then each shard's header, trailer and footer, then
//! blocks), each request retried with backoff on transient errors. Credentials come from each
//! cloud's usual environment (`from_env`), never from the URL, and never reach a message: every
//! error is passed through [`url::redact`].

mod build;
pub mod url;

use super::{Object, Store};
use crate::util::error::{Error, Result};
use object_store::{path::Path as ObjPath, ObjectStore, ObjectStoreExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
pub use url::{is_url, parse, redact, DataUrl, Scheme};

/// What this process has read from stores so far: (ranged reads requested, bytes received, reads
/// the cache answered).
pub fn traffic() -> (u64, u64, u64) {
    let hits = super::cache::get().map_or(0, |c| c.hits.load(Relaxed));
    (REQUESTS.load(Relaxed), BYTES.load(Relaxed), hits)
}

/// The runtime every request runs on: a few threads, as requests wait on the network, not the CPU.
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .thread_name("prep-io")
            .enable_all()
            .build()
            .expect("starting the I/O runtime")
    })
}

/// A dataset's folder in an object store or on an HTTP server.
#[derive(Clone)]
pub struct Remote {
    store: Arc<dyn ObjectStore>,
    url: DataUrl,
    /// The process's cache of reads, and this dataset version's folder in it (`use_cache`).
    cache: Option<(Arc<super::cache::BlockCache>, PathBuf)>,
}

/// Requests made and bytes received from stores by this process (ranged reads, HEADs aside).
pub static REQUESTS: AtomicU64 = AtomicU64::new(0);
pub static BYTES: AtomicU64 = AtomicU64::new(0);

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Remote({})", self.url.shown)
    }
}

impl Remote {
    /// The store of `url`, configured from the environment. Nothing is requested yet.
    pub fn new(url: &DataUrl) -> Result<Remote> {
        Ok(Remote {
            store: build::store(url)?,
            url: url.clone(),
            cache: None,
        })
    }

    /// Open the dataset folder at URL `s` (`s3://bucket/ds`, ...).
    pub fn open_url(s: &str) -> Result<Remote> {
        Remote::new(&parse(s)?)
    }

    /// Read objects through the process's cache (`cache::configure`), if there is one, under
    /// the folder of this dataset `version` (its manifest's checksum).
    pub fn use_cache(&mut self, version: &str) {
        self.cache = super::cache::get().map(|c| {
            let ns = c.namespace(&self.url.shown, version);
            (c, ns)
        });
    }

    fn object(&self, name: &str, len: u64) -> RemoteObject {
        RemoteObject {
            store: self.store.clone(),
            key: self.key(name),
            len,
            shown: self.location(name),
            name: name.to_string(),
            cache: self.cache.clone(),
        }
    }

    pub fn url(&self) -> &DataUrl {
        &self.url
    }

    /// Object `name`'s key in the store.
    pub fn key(&self, name: &str) -> ObjPath {
        if self.url.prefix.is_empty() {
            ObjPath::from(name)
        } else {
            ObjPath::from(format!("{}/{name}", self.url.prefix))
        }
    }

    /// The size of object `name` (a HEAD request).
    pub fn size(&self, name: &str) -> Result<u64> {
        let key = self.key(name);
        let m = runtime()
            .block_on(self.store.head(&key))
            .map_err(|e| store_error(&self.location(name), e))?;
        Ok(m.size)
    }

    /// The store itself, for writers and listings.
    pub fn inner(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }
}

impl Store for Remote {
    fn location(&self, name: &str) -> PathBuf {
        PathBuf::from(format!("{}/{name}", self.url.shown))
    }

    fn open(&self, name: &str) -> Result<Box<dyn Object>> {
        let len = self.size(name)?;
        Ok(Box::new(self.object(name, len)))
    }

    fn open_sized(&self, name: &str, len: u64) -> Result<Box<dyn Object>> {
        Ok(Box::new(self.object(name, len)))
    }

    fn remote(&self) -> bool {
        true
    }

    fn read(&self, name: &str, cap: u64, what: &str) -> Result<Vec<u8>> {
        let at = self.location(name);
        let len = self.size(name)?;
        let too_large = |n: u64| {
            Error::io(
                &at,
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{n} bytes is larger than the {cap}-byte cap for {what}"),
                ),
            )
        };
        if len > cap {
            return Err(too_large(len));
        }
        // A ranged read of at most cap + 1 bytes: an object that grew since the HEAD cannot make
        // it run on.
        let key = self.key(name);
        let bytes = runtime()
            .block_on(self.store.get_range(&key, 0..len.min(cap + 1)))
            .map_err(|e| store_error(&at, e))?;
        if bytes.len() as u64 > cap {
            return Err(too_large(bytes.len() as u64));
        }
        Ok(bytes.to_vec())
    }

    fn sizes(&self, names: &[&str]) -> Vec<Result<u64>> {
        use futures::stream::{self, StreamExt};
        // HEAD requests, many in flight: a dataset of thousands of shards is checked in the time
        // of a few round trips each.
        let heads = names.iter().map(|n| {
            let key = self.key(n);
            let at = self.location(n);
            async move {
                self.store
                    .head(&key)
                    .await
                    .map(|m| m.size)
                    .map_err(|e| store_error(&at, e))
            }
        });
        runtime().block_on(stream::iter(heads).buffered(IN_FLIGHT).collect())
    }
}

/// Requests a listing or check keeps in flight at once.
const IN_FLIGHT: usize = 64;

/// One object, read by byte ranges.
pub struct RemoteObject {
    store: Arc<dyn ObjectStore>,
    key: ObjPath,
    len: u64,
    shown: PathBuf,
    /// Its name in the dataset, and the cache it is read through.
    name: String,
    cache: Option<(Arc<super::cache::BlockCache>, PathBuf)>,
}

impl std::fmt::Debug for RemoteObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RemoteObject({})", self.shown.display())
    }
}

impl Object for RemoteObject {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.len)
            .ok_or_else(|| short(&self.shown, offset, buf.len(), self.len))?;
        if buf.is_empty() {
            return Ok(());
        }
        if let Some((c, ns)) = &self.cache {
            if c.read(ns, &self.name, offset, buf) {
                return Ok(());
            }
        }
        REQUESTS.fetch_add(1, Relaxed);
        let bytes = runtime()
            .block_on(self.store.get_range(&self.key, offset..end))
            .map_err(|e| store_error(&self.shown, e))?;
        if bytes.len() != buf.len() {
            // The object changed (or the server ignored the range): never read past what was asked.
            return Err(Error::io(
                &self.shown,
                std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "asked for {} bytes at offset {offset}, the store sent {} (was the object replaced?)",
                        buf.len(),
                        bytes.len()
                    ),
                ),
            ));
        }
        BYTES.fetch_add(bytes.len() as u64, Relaxed);
        buf.copy_from_slice(&bytes);
        if let Some((c, ns)) = &self.cache {
            c.put(ns, &self.name, offset, buf);
        }
        Ok(())
    }
}

fn short(at: &std::path::Path, offset: u64, n: usize, len: u64) -> Error {
    Error::io(
        at,
        std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("{n} bytes at offset {offset} run past its end ({len} bytes)"),
        ),
    )
}

/// A store's error as prep's, naming the object (`at`), its secrets removed.
pub(crate) fn store_error(at: &std::path::Path, e: object_store::Error) -> Error {
    use std::io::ErrorKind;
    let (kind, what) = match &e {
        object_store::Error::NotFound { .. } => (ErrorKind::NotFound, "no such object".to_string()),
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => (
            ErrorKind::PermissionDenied,
            format!("access refused: {}", redact(&chain(&e))),
        ),
        _ => (ErrorKind::Other, redact(&chain(&e))),
    };
    Error::io(at, std::io::Error::new(kind, what))
}

/// An error and its causes on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = c.source();
    }
    s
}
