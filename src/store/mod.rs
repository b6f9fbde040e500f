//! Where bytes live. `Store` names the objects of one dataset (`manifest.json`, the shards) and
//! opens them; an `Object` is read at any offset. Local files are the one implementation so far
//! (`local::Dir`, `local::LocalFile`: opened only when regular, read with caps); the format's
//! readers take these traits, so another store slots in under them. Durable writes are
//! `output`. Imports `util` only.

pub mod local;
pub mod output;

use crate::util::error::Result;
use std::path::PathBuf;

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
    /// The whole of object `name`, refused when over `cap` bytes (`what` names it: "a manifest").
    fn read(&self, name: &str, cap: u64, what: &str) -> Result<Vec<u8>>;
}
