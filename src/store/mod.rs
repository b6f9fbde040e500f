//! Where bytes live. `Store` names the objects of one dataset (`manifest.json`, the shards) and
//! opens them; an `Object` is read at any offset. Local files (`local::Dir`, `local::LocalFile`:
//! opened only when regular, read with caps) and object stores or HTTP servers (`remote`) are its
//! implementations; the format's readers take these traits. Durable writes are `output`. Imports
//! `util` only.

pub mod cache;
pub mod local;
pub mod output;
pub mod remote;

use crate::util::error::Result;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The store holding the dataset at `dir`: an object store or HTTP server where `dir` is a URL
/// (`remote::is_url`), else the local folder.
pub fn open_dir(dir: &Path) -> Result<Arc<dyn Store>> {
    if remote::is_url(dir) {
        let s = dir.to_str().unwrap_or_default();
        Ok(Arc::new(remote::Remote::open_url(s)?))
    } else {
        Ok(Arc::new(local::Dir::new(dir)))
    }
}

/// One stored object, read at any offset: what the shard reader reads blocks through.
pub trait Object: Send + Sync + std::fmt::Debug {
    /// Its length in bytes when it was opened.
    fn len(&self) -> u64;
    /// Fill `buf` from `offset`; an object shorter than that is an error naming it.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()>;
}

/// The objects of one dataset, by name relative to it.
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Where object `name` is, as messages show it.
    fn location(&self, name: &str) -> PathBuf;
    /// Open object `name` for reads at any offset.
    fn open(&self, name: &str) -> Result<Box<dyn Object>>;
    /// Open object `name` that a manifest lists as `len` bytes: a store over a network trusts
    /// the listing (saving a round trip) and lets the reads find out otherwise.
    fn open_sized(&self, name: &str, len: u64) -> Result<Box<dyn Object>> {
        let _ = len;
        self.open(name)
    }
    /// Whether objects come over a network (each read a round trip): readers then keep many
    /// reads in flight.
    fn remote(&self) -> bool {
        false
    }
    /// The whole of object `name`, refused when over `cap` bytes (`what` names it: "a manifest").
    fn read(&self, name: &str, cap: u64, what: &str) -> Result<Vec<u8>>;
    /// The size of each of `names`, without reading them (an error where one is missing, or is
    /// not a regular file); a store over a network asks for them all at once.
    fn sizes(&self, names: &[&str]) -> Vec<Result<u64>>;
}

/// Check that each of `files` (name, size) is in `store` with its size, naming every one that is
/// missing or of another size; `listed_in` is the file that lists them.
pub fn check_present(store: &dyn Store, listed_in: &Path, files: &[(&str, u64)]) -> Result<()> {
    let names: Vec<&str> = files.iter().map(|(n, _)| *n).collect();
    let mut wrong = Vec::new();
    for ((name, want), got) in files.iter().zip(store.sizes(&names)) {
        let shown = crate::util::error::shown_path(&store.location(name));
        match got {
            Err(crate::Error::Io { cause, .. }) if cause.kind() == std::io::ErrorKind::NotFound => {
                wrong.push(format!("{shown} is missing"))
            }
            Err(e) => wrong.push(e.to_string()),
            Ok(n) if n != *want => wrong.push(format!(
                "{shown} is {n} bytes, the manifest lists {want}{}",
                if n < *want { " (truncated)" } else { "" }
            )),
            Ok(_) => {}
        }
    }
    if wrong.is_empty() {
        return Ok(());
    }
    Err(crate::Error::manifest(
        listed_in,
        format!(
            "{} of the {} files it lists {} not as listed: {}",
            wrong.len(),
            files.len(),
            if wrong.len() == 1 { "is" } else { "are" },
            wrong.join("; ")
        ),
    ))
}
