//! Fuzz `Manifest::from_bytes` (JSON parse, self-checksum, consistency rules) and the accessors a
//! caller uses on an accepted manifest; then the same bytes as a colmajor `manifest.json`
//! (`ColmajorManifest::read` only takes a directory, so the input goes to one temporary directory
//! per process). See `common/manifest_checks.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "common/manifest_checks.rs"]
mod checks;

fuzz_target!(|data: &[u8]| {
    checks::check(data);
});
