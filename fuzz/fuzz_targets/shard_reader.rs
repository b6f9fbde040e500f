//! Fuzz `ShardReader::open` and `read_block` on arbitrary file contents.
//!
//! The input is written to one temporary file per process (reused for every run), opened as a
//! shard, and, if the open succeeds, every block is read and decoded. Errors are expected; a panic,
//! an overflow, a huge allocation (libFuzzer's -malloc_limit_mb / -rss_limit_mb) or a hang is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use std::sync::OnceLock;

fn temp_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        std::env::temp_dir().join(format!("prep-fuzz-shard-{}.shard", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    let path = temp_path();
    // Truncates and rewrites the same file every run.
    std::fs::write(path, data).expect("write fuzz input to the temp file");
    if let Ok(reader) = prep::format::shard::ShardReader::open(path) {
        for i in 0..reader.num_blocks() {
            let _ = reader.read_block(i);
        }
    }
});
