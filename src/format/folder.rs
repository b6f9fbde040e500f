//! A dataset folder's housekeeping: the marker of an unfinished generation, removing what a
//! writer left before it writes again, and the bytes a folder holds.

use crate::format::shard::manifest;
use crate::util::error::{IoContext, Result};
use std::path::Path;

/// Present while `prep synth` writes a dataset (its parameters inside), removed when it is whole.
pub const PARTIAL_MARKER: &str = ".prep-partial.json";

/// Remove what a writer of `out` wrote (manifest, marker, shards, column-major files and their
/// temporaries), and nothing else.
pub fn clean(out: &Path) -> Result<()> {
    for e in std::fs::read_dir(out).at(out)? {
        let e = e.at(out)?;
        let p = e.path();
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with(".prep-staging") {
            continue;
        }
        if p.is_dir() {
            for f in std::fs::read_dir(&p).at(&p)? {
                let f = f.at(&p)?.path();
                let n = f
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .to_string();
                if n.ends_with(".shard") || n.ends_with(".tmp") {
                    std::fs::remove_file(&f).at(&f)?;
                }
            }
        } else if name == manifest::FILE_NAME
            || name == PARTIAL_MARKER
            || name.ends_with(".json.tmp")
            || (name.starts_with("images_") || name.starts_with("labels_"))
                && (name.ends_with(".bin") || name.ends_with(".bin.tmp"))
        {
            std::fs::remove_file(&p).at(&p)?;
        }
    }
    Ok(())
}

/// Bytes of the files under `dir`, the lock file aside.
pub fn dir_bytes(dir: &Path) -> u64 {
    walk_bytes(dir)
}

fn walk_bytes(p: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(p) else {
        return 0;
    };
    rd.flatten()
        .filter(|e| e.file_name() != super::lock::LOCK_FILE)
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => walk_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}
