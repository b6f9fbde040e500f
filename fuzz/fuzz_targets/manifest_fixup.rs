//! Like `manifest`, but first re-seals the input: the 16 bytes after the last `"checksum": "` are
//! replaced by the xxh3 of the input with those bytes set to '0' (formats/shard.md, "Self-checksum").
//! Without this almost every mutation fails the self-checksum, and the consistency rules and
//! accessors behind it are barely exercised.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xxhash_rust::xxh3::xxh3_64;

#[path = "common/manifest_checks.rs"]
mod checks;

const KEY: &[u8] = b"\"checksum\": \"";

fn reseal(d: &mut [u8]) {
    let Some(k) = d.windows(KEY.len()).rposition(|w| w == KEY) else { return };
    let at = k + KEY.len();
    if at + 16 > d.len() {
        return;
    }
    d[at..at + 16].copy_from_slice(b"0000000000000000");
    let sum = format!("{:016x}", xxh3_64(d));
    d[at..at + 16].copy_from_slice(sum.as_bytes());
}

fuzz_target!(|data: &[u8]| {
    let mut d = data.to_vec();
    reseal(&mut d);
    checks::check(&d);
});
