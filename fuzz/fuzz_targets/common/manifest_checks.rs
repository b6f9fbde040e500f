//! What the `manifest` and `manifest_fixup` targets do with one input.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn temp_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("prep-fuzz-manifest-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("create the fuzz temp dir");
        d
    })
}

pub fn check(data: &[u8]) {
    if let Ok(m) = prep::format::shard::Manifest::from_bytes(Path::new("manifest.json"), data) {
        let _ = m.num_classes();
        let _ = m.raw_bytes();
        let _ = m.sample.bytes();
        let _ = m.sample.shape.plane();
        let _ = prep::format::shard::manifest::stats_split(m.splits.keys());
        // Re-sealing an accepted manifest must work too.
        let _ = m.to_bytes();
    }
    // The colmajor manifest shares the self-checksum; only bother writing the file when the
    // input could be one (cheap pre-filter keeps the exec rate up).
    if data.windows(13).any(|w| w == b"prep-colmajor") {
        let dir = temp_dir();
        std::fs::write(dir.join("manifest.json"), data).expect("write fuzz input");
        if let Ok(m) = prep::format::colmajor::ColmajorManifest::read(dir) {
            let _ = m.sample.bytes();
            let _ = m.classes.len();
        }
    }
}
