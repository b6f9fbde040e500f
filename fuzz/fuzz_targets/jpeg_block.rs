//! Fuzz the `jpeg` codec's decoder (formats/shard.md, "Codec jpeg") through `Block::decode`, the
//! function every reader calls.
//!
//! The first 4 bytes pick a block: grey or RGB, samples of 1 to 64 rows and 1 to 64 columns, 1 to
//! 4 samples. The rest is cut into that many JPEG streams, behind the method byte and their
//! lengths, with the labels' zstd frame after them and the stored checksum made to match, so every
//! input reaches the JPEG decoder rather than stopping at a checksum. The input is also decoded as
//! stored bytes as they are. Errors are expected (a stream of another size, bad entropy data, a
//! decoded block whose checksum differs); a panic, an overflow or a huge allocation is a bug.
//! A panic inside zune-jpeg is caught by `jpeg::decode_sample` and becomes the block's damage
//! (prep builds with `panic = "unwind"`); libfuzzer-sys's hook would abort on it first, so the
//! hook is replaced by a quiet one: a panic nothing catches still ends the run as a crash.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prep::format::fields::Fields;
use prep::format::shard::block::BlockLayout;
use prep::format::shard::format::{BlockEntry, LABEL_BYTES};
use prep::format::shard::{Block, Codec, Dtype, SampleSpec, Shape};
use std::path::Path;
use xxhash_rust::xxh3::xxh3_64;

fuzz_target!(|data: &[u8]| {
    static QUIET: std::sync::Once = std::sync::Once::new();
    QUIET.call_once(|| std::panic::set_hook(Box::new(|_| {})));
    if data.len() < 4 {
        return;
    }
    let channels = if data[0] % 2 == 0 { 1 } else { 3 };
    let (rows, cols) = (1 + data[1] as u32 % 64, 1 + data[2] as u32 % 64);
    let n = 1 + data[3] as usize % 4;
    let Ok(shape) = Shape::new(vec![channels, rows, cols]) else {
        return;
    };
    let spec = SampleSpec {
        shape,
        dtype: Dtype::U8,
    };
    let body = &data[4..];
    let each = body.len() / n;
    let mut stored = vec![1u8];
    for i in 0..n {
        let len = if i + 1 == n { body.len() - each * i } else { each };
        stored.extend((len as u32).to_le_bytes());
    }
    stored.extend_from_slice(body);
    stored.extend(zstd::bulk::compress(&vec![0u8; n * LABEL_BYTES], 1).expect("zstd compresses"));
    let fields = Fields::default();
    let layout = BlockLayout {
        spec: &spec,
        codec: Codec::Jpeg { quality: 90 }.code(),
        num_classes: 256,
        field_bytes: 0,
        fields: &fields,
    };
    let entry = |stored: &[u8]| BlockEntry {
        offset: 0,
        stored_len: stored.len() as u64,
        num_samples: n as u32,
        stored_xxh3: xxh3_64(stored),
        raw_xxh3: 0,
    };
    let _ = Block::decode(Path::new("f.shard"), 0, &entry(&stored), &stored, &layout, Vec::new());
    let _ = Block::decode(Path::new("f.shard"), 0, &entry(data), data, &layout, Vec::new());
});
