//! Like `shard_reader`, but first repairs every checksum the input's own layout lets it find, so
//! that mutations of sizes, offsets, shapes, counts and block bytes get past the xxh3 checks and
//! reach the footer, block and zstd logic. The repair trusts nothing: it only hashes regions that
//! lie inside the input, and never decodes more than FIXUP_RAW_CAP bytes.
//!
//! Repaired, in order: header_xxh3; for each footer entry whose block lies inside the file,
//! stored_xxh3 and (codec none, or a zstd frame that decodes within the cap) raw_xxh3; then the
//! trailer's footer_xxh3.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use std::sync::OnceLock;
use xxhash_rust::xxh3::xxh3_64;

const FIXUP_RAW_CAP: usize = 1 << 20;

fn temp_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        std::env::temp_dir().join(format!("prep-fuzz-fixup-{}.shard", std::process::id()))
    })
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}
fn put_u64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}

fn fixup(d: &mut [u8]) {
    let len = d.len();
    if len < 96 {
        return;
    }
    let h = xxh3_64(&d[..56]);
    put_u64(d, 56, h);
    let codec = d[11];
    let num_blocks = u32_at(d, 40) as usize;
    let t = len - 32;
    let footer_offset = u64_at(d, t);
    let footer_len = u64_at(d, t + 8);
    let Some(fend) = footer_offset.checked_add(footer_len) else { return };
    if footer_offset < 64 || fend > t as u64 {
        return;
    }
    let (fo, fl) = (footer_offset as usize, footer_len as usize);
    let entries = num_blocks.min(fl / 40);
    for i in 0..entries {
        let e = fo + 40 * i;
        let off = u64_at(d, e);
        let stored_len = u64_at(d, e + 8);
        let Some(end) = off.checked_add(stored_len) else { continue };
        if off < 64 || end > footer_offset {
            continue;
        }
        let (bs, be) = (off as usize, end as usize);
        let stored_h = xxh3_64(&d[bs..be]);
        let raw_h = if codec == 1 {
            zstd::bulk::decompress(&d[bs..be], FIXUP_RAW_CAP)
                .ok()
                .map(|r| xxh3_64(&r))
        } else {
            Some(stored_h)
        };
        put_u64(d, e + 24, stored_h);
        if let Some(r) = raw_h {
            put_u64(d, e + 32, r);
        }
    }
    let fh = xxh3_64(&d[fo..fo + fl]);
    put_u64(d, t + 16, fh);
}

fuzz_target!(|data: &[u8]| {
    let mut d = data.to_vec();
    fixup(&mut d);
    let path = temp_path();
    std::fs::write(path, &d).expect("write fuzz input to the temp file");
    if let Ok(reader) = prep::format::shard::ShardReader::open(path) {
        for i in 0..reader.num_blocks() {
            let _ = reader.read_block(i);
        }
    }
});
