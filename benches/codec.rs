//! Block codecs on one core: `DATA=dataset/ cargo bench --bench codec`. The blocks of the first
//! shard of `train` (SPLIT=..., BLOCKS=N for N blocks spread evenly over all the split's shards,
//! so that a folder sorted by class gives blocks of many classes) are decoded once, then encoded
//! with each codec
//! (zstd and pred at LEVEL, default 1; jpeg at QUALITY, default 90, for u8 grey and RGB images)
//! and decoded again on this thread: size against raw pixels and against zstd, encode and decode
//! speed in GB/s of decoded bytes, and for jpeg samples/s decoded and the mean absolute error.
//! Decoding is `Block::decode`, every check a reader makes included. Figures go to BENCHMARKS.md.

use prep::format::shard::format::BlockEntry;
use prep::format::shard::{block::BlockLayout, Block, Codec, Dataset};
use std::path::Path;
use std::time::Instant;

fn main() {
    let dir = std::env::var("DATA").expect("DATA=dataset folder");
    let split = std::env::var("SPLIT").unwrap_or_else(|_| "train".into());
    let level: i32 = std::env::var("LEVEL").map_or(1, |v| v.parse().unwrap());
    let quality: u8 = std::env::var("QUALITY").map_or(90, |v| v.parse().unwrap());
    let ds = Dataset::open(&dir).unwrap();
    let shards: Vec<_> = ds.manifest.splits[&split]
        .shards
        .iter()
        .map(|info| ds.open_shard(info).unwrap())
        .collect();
    let r = &shards[0];
    let blocks: Vec<Block> = match std::env::var("BLOCKS") {
        Err(_) => (0..r.num_blocks())
            .map(|i| r.read_block(i).unwrap())
            .collect(),
        Ok(v) => {
            let all: Vec<(usize, usize)> = (shards.iter().enumerate())
                .flat_map(|(s, r)| (0..r.num_blocks()).map(move |b| (s, b)))
                .collect();
            let want = v.parse::<usize>().unwrap().clamp(1, all.len());
            (0..want)
                .map(|k| all[k * all.len() / want])
                .map(|(s, b)| shards[s].read_block(b).unwrap())
                .collect()
        }
    };
    let spec = r.spec().clone();
    let (classes, fields) = (ds.manifest.classes.len() as u32, r.fields().clone());
    let raw: usize = blocks.iter().map(|b| b.raw().len()).sum();
    println!(
        "{dir}: {} blocks of {} samples {}, {:.1} MB decoded, one thread",
        blocks.len(),
        blocks[0].len(),
        spec.shape,
        raw as f64 / 1e6
    );
    let mut zstd_bytes = 0;
    let only = std::env::var("ONLY").unwrap_or_default();
    let samples: usize = blocks.iter().map(|b| b.len()).sum();
    for codec in [
        Codec::Zstd { level },
        Codec::Pred { level },
        Codec::Jpeg { quality },
    ] {
        if !only.is_empty() && !format!("{codec:?}").to_lowercase().starts_with(&only) {
            continue;
        }
        if codec.fits(&spec).is_err() {
            continue;
        }
        let lossy = matches!(codec, Codec::Jpeg { .. });
        let mut err = (0.0f64, 0usize);
        let t = Instant::now();
        let enc: Vec<_> = blocks
            .iter()
            .map(|b| b.encode_fields(&spec, classes, codec, &fields).unwrap())
            .collect();
        let encode_s = t.elapsed().as_secs_f64();
        let stored: usize = enc.iter().map(|e| e.bytes.len()).sum();
        if zstd_bytes == 0 {
            zstd_bytes = stored;
        }
        let layout = BlockLayout {
            spec: &spec,
            codec: codec.code(),
            num_classes: classes,
            field_bytes: fields.bytes(),
            fields: &fields,
        };
        let mut buf = Vec::new();
        let mut best = f64::MAX;
        let reps: usize = std::env::var("REPS").map_or(3, |v| v.parse().unwrap());
        for rep in 0..reps {
            let t = Instant::now();
            for (i, e) in enc.iter().enumerate() {
                let entry = BlockEntry {
                    offset: 0,
                    stored_len: e.bytes.len() as u64,
                    num_samples: e.num_samples,
                    stored_xxh3: e.stored_xxh3,
                    raw_xxh3: e.raw_xxh3,
                };
                let b = Block::decode(Path::new("bench"), i as u32, &entry, &e.bytes, &layout, buf)
                    .unwrap();
                if rep == 0 && lossy {
                    let px = blocks[i].pixels().iter().zip(b.pixels());
                    err.0 += px.map(|(&a, &b)| (a as f64 - b as f64).abs()).sum::<f64>();
                    err.1 += b.pixels().len();
                    assert_eq!(
                        b.labels().collect::<Vec<_>>(),
                        blocks[i].labels().collect::<Vec<_>>()
                    );
                } else if rep == 0 {
                    assert_eq!(b.raw(), blocks[i].raw());
                }
                buf = b.into_data();
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "{:<10} {:>8.1} MB  {:.3} of raw  {:.3} of zstd  encode {:.2} GB/s  decode {:.2} GB/s",
            format!("{codec:?}").split(' ').next().unwrap_or(""),
            stored as f64 / 1e6,
            stored as f64 / raw as f64,
            stored as f64 / zstd_bytes as f64,
            raw as f64 / encode_s / 1e9,
            raw as f64 / best / 1e9,
        );
        if lossy {
            println!(
                "{:<10} quality {quality}: {:.0} samples/s decoded, mean absolute error {:.2} of 255",
                "",
                samples as f64 / best,
                err.0 / err.1.max(1) as f64
            );
        }
    }
}
