//! `prep`: generate, convert, verify and stream image datasets as compact checksummed shards, and
//! train a CNN on them. The binary's subcommands are thin layers over this library.

pub mod colmajor;
pub mod convert;
pub mod dist;
pub mod error;
pub mod files;
pub mod font;
pub mod inspect;
pub mod interrupt;
pub mod lock;
pub mod mem;
pub mod merge;
pub mod nn;
pub mod output;
pub mod part;
pub mod paths;
pub mod pipeline;
pub mod plan;
pub mod progress;
pub mod shard;
pub mod source;
pub mod synth;
pub mod train;

pub use error::{Error, Result};

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
    let path = dir.join(shard::manifest::FILE_NAME);
    let bytes = shard::manifest::read_capped(&path)?;
    let v: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| Error::manifest(&path, format!("not valid JSON: {e}")))?;
    v["format"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| Error::manifest(&path, "has no \"format\" member"))
}

/// This process's command line as text, for a manifest's `provenance.command` and a lock file:
/// an argument that is not UTF-8 (a path: Linux allows any bytes) has its bad bytes replaced by
/// U+FFFD rather than stopping the run (`std::env::args` would panic on it).
pub fn command_args() -> Vec<String> {
    std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}
