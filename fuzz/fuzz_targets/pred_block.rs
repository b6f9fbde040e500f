//! Fuzz the `pred` codec's decoder (formats/shard.md, "Codec pred") through `Block::decode`, the
//! function every reader calls.
//!
//! The first 6 bytes pick a block: dtype (u8, u16, f16, f32), channels (1 to 4), samples of 1 to
//! 8 rows and 1 to 40 columns, 1 to 20 samples, and the method byte. The rest,
//! repeated or cut to the block's decoded size, is its filtered payload: it is zstd-compressed and
//! the checksums are made to match, so every input reaches the method check and the filter rather
//! than stopping at a checksum. The input is also decoded as stored bytes as they are (a damaged
//! frame). Errors are expected (a method the samples cannot have, a label over the classes, a
//! decoded block whose checksum differs); a panic, an overflow or a huge allocation is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prep::format::fields::Fields;
use prep::format::shard::block::BlockLayout;
use prep::format::shard::format::{BlockEntry, LABEL_BYTES};
use prep::format::shard::{Block, Codec, Dtype, SampleSpec, Shape};
use std::path::Path;
use xxhash_rust::xxh3::xxh3_64;

fuzz_target!(|data: &[u8]| {
    if data.len() < 6 {
        return;
    }
    let dtype = [Dtype::U8, Dtype::U16, Dtype::F16, Dtype::F32][data[0] as usize % 4];
    let channels = 1 + data[1] as u32 % 4;
    let (rows, cols) = (1 + data[2] as u32 % 8, 1 + data[3] as u32 % 40);
    let n = 1 + data[4] as usize % 20;
    let method = data[5];
    let Ok(shape) = Shape::new(vec![channels, rows, cols]) else {
        return;
    };
    let spec = SampleSpec { shape, dtype };
    let raw_len = n * (spec.bytes() + LABEL_BYTES);
    let body = &data[6..];
    let payload: Vec<u8> = if body.is_empty() {
        vec![0; raw_len]
    } else {
        body.iter().copied().cycle().take(raw_len).collect()
    };
    let mut stored = vec![method];
    stored.extend(zstd::bulk::compress(&payload, 1).expect("zstd compresses"));
    let fields = Fields::default();
    let layout = BlockLayout {
        spec: &spec,
        codec: Codec::Pred { level: 1 }.code(),
        num_classes: 256,
        field_bytes: 0,
        fields: &fields,
    };
    let entry = |stored: &[u8], raw_xxh3: u64| BlockEntry {
        offset: 0,
        stored_len: stored.len() as u64,
        num_samples: n as u32,
        stored_xxh3: xxh3_64(stored),
        raw_xxh3,
    };
    // With the checksum of the payload as it decodes: of the filtered bytes for method 0, else
    // unknown (the decoded pixels differ from the payload), so only method 0 can succeed here.
    let e = entry(&stored, xxh3_64(&payload));
    let _ = Block::decode(Path::new("f.shard"), 0, &e, &stored, &layout, Vec::new());
    // The input itself as a block's stored bytes.
    let e = entry(&data[5..], 0);
    let _ = Block::decode(Path::new("f.shard"), 0, &e, &data[5..], &layout, Vec::new());
});
