//! How fast the host input pipeline of `prep train --memory stream` delivers batches, without a
//! GPU: `DATA=shards/ cargo bench --bench input` (or SHAPE=3x224x224 N=4096 to make a dataset
//! first). Prints samples/s and GB/s of three stages on all cores: decoding every block (the
//! ceiling), the loader's batches, and the batches copied once more into a reused buffer, as the
//! pinned ring copies them. Figures go to BENCHMARKS.md.

use prep::format::shard::Dataset;
use prep::train::input::{epoch, OnDamage, Source};
use std::sync::{Arc, Mutex};
use std::time::Instant;

// As in the prep binary.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // As `prep train` sets it (PURGE=0 to compare with the allocator's default).
    if std::env::var("PURGE").as_deref() != Ok("0") {
        prep::util::mem::purge_freed_memory_at_once();
    }
    let tmp;
    let dir = match std::env::var("DATA") {
        Ok(d) => std::path::PathBuf::from(d),
        Err(_) => {
            let shape = std::env::var("SHAPE").unwrap_or_else(|_| "3x224x224".into());
            let n: u64 = std::env::var("N").map_or(2048, |v| v.parse().unwrap());
            tmp = std::env::temp_dir().join(format!("prep-bench-input-{shape}-{n}"));
            if !tmp.join("manifest.json").exists() {
                let _ = std::fs::remove_dir_all(&tmp);
                prep::synth::synthesize(&prep::synth::SynthOptions {
                    out: tmp.clone(),
                    splits: vec![("train".into(), n)],
                    shape: shape.parse().unwrap(),
                    classes: 10,
                    seed: 0,
                    // The data BENCHMARKS.md's input figures were measured on.
                    generator: prep::synth::Version::V1,
                    format: prep::OutputFormat::Shards,
                    codec: prep::format::shard::Codec::Zstd { level: 3 },
                    block_samples: None,
                    shard_blocks: None,
                    force: false,
                    part: None,
                    quiet: true,
                    uploader: None,
                })
                .unwrap();
            }
            tmp.clone()
        }
    };
    let batch: usize = std::env::var("BATCH").map_or(256, |v| v.parse().unwrap());
    let ds = Dataset::open(&dir).unwrap();
    let src = Source::open(&ds, "train").unwrap();
    let workers = rayon::current_num_threads();
    let sb = src.spec.bytes();
    println!(
        "{}: {} samples of {sb} bytes, {} blocks, {workers} threads, batch {batch}",
        dir.display(),
        src.samples,
        src.num_blocks()
    );
    let report = |name: &str, samples: usize, secs: f64| {
        println!(
            "{name:<28} {:>10.0} samples/s {:>7.2} GB/s",
            samples as f64 / secs,
            (samples * sb) as f64 / secs / 1e9
        );
    };
    for _ in 0..2 {
        let t = Instant::now();
        use rayon::prelude::*;
        let n: usize = (0..src.num_blocks())
            .into_par_iter()
            .map(|b| src.read(b).unwrap().len())
            .sum();
        report("decode every block", n, t.elapsed().as_secs_f64());
        for copy in [false, true] {
            let t = Instant::now();
            let l = epoch(
                src.clone(),
                batch,
                1,
                0,
                0,
                true,
                OnDamage::Stop,
                workers,
                Arc::new(Mutex::new(Vec::new())),
            );
            let mut ring = vec![0u8; batch * sb];
            let mut n = 0;
            for b in l.rx.iter() {
                let b = b.unwrap();
                if copy {
                    prep::util::pipeline::copy_parallel(&mut ring[..b.pixels.len()], &b.pixels);
                    std::hint::black_box(&ring);
                }
                n += b.labels.len();
                l.give_back(b.pixels);
            }
            let name = if copy {
                "batches + ring copy"
            } else {
                "batches"
            };
            report(name, n, t.elapsed().as_secs_f64());
        }
    }
}
