//! Everything on disk: the shard format (header, blocks, footer) and its manifest, the
//! column-major layout, the lock a writer holds, parts of a fanned-out job, and what `inspect`
//! reads off a dataset. May import `store` and `util` only.

pub mod colmajor;
pub mod fields;
pub mod folder;
pub mod inspect;
pub mod lock;
pub mod part;
pub mod publish;
pub mod shard;

use crate::util::error::{Error, Result};

/// On-disk layout of a dataset directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputFormat {
    /// Checksummed zstd shard files (`formats/shard.md`).
    Shards,
    /// float32 feature-major files for existing trainers (`formats/colmajor.md`).
    Colmajor,
}

impl OutputFormat {
    pub fn name(self) -> &'static str {
        match self {
            OutputFormat::Shards => "shards",
            OutputFormat::Colmajor => "colmajor",
        }
    }
}

/// The `format` member of `dir/manifest.json`, to tell shard datasets from colmajor ones.
pub fn dataset_format(dir: &std::path::Path) -> Result<String> {
    let store = crate::store::open_dir(dir)?;
    let name = shard::manifest::FILE_NAME;
    let path = store.location(name);
    let bytes = store
        .read(name, shard::manifest::MAX_MANIFEST_BYTES, "a manifest")
        .map_err(|e| {
            if crate::store::remote::is_url(dir) {
                shard::dataset::no_dataset_at(dir, e)
            } else {
                e
            }
        })?;
    let v: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| Error::manifest(&path, format!("not valid JSON: {e}")))?;
    v["format"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| Error::manifest(&path, "has no \"format\" member"))
}
