//! Where `prep synth` spends its time, stage by stage, on one thread:
//! `cargo bench --bench synth`. Figures go to BENCHMARKS.md.

use prep::format::shard::{Codec, Stats};
use prep::synth::{Generator, Version, DEFAULT_DIFFICULTY};
use std::time::Instant;

fn main() {
    let shape = std::env::var("SHAPE").unwrap_or_else(|_| "3x32x32".into());
    // GENERATOR=1 for the first generator; DIFFICULTY for version 2's.
    let version = match std::env::var("GENERATOR").as_deref() {
        Ok("1") => Version::V1,
        _ => Version::V2 {
            difficulty: std::env::var("DIFFICULTY")
                .map_or(DEFAULT_DIFFICULTY, |v| v.parse().unwrap()),
        },
    };
    println!("generator {version:?}, {shape}");
    let g = Generator::with_version(shape.parse().unwrap(), 10, 0, version).unwrap();
    let n = 1024;
    let reps: usize = std::env::var("REPS").map_or(20, |v| v.parse().unwrap());
    let time = |name: &str, f: &mut dyn FnMut()| {
        f();
        let t = Instant::now();
        for _ in 0..reps {
            f();
        }
        let s = t.elapsed().as_secs_f64() / reps as f64;
        println!(
            "{name:<24} {:>10.0} samples/s/core  ({:.0} MB/s)",
            n as f64 / s,
            n as f64 * g.spec.bytes() as f64 / s / 1e6
        );
    };
    let block = g.render_block(0, 0, n);
    time("render", &mut || {
        std::hint::black_box(g.render_block(0, 0, n));
    });
    time("stats", &mut || {
        std::hint::black_box(Stats::of_block(&block, &g.spec, 10));
    });
    for level in [-5, -3, -1, 1, 3] {
        let mut size = 0;
        time(&format!("zstd level {level}"), &mut || {
            size = zstd::bulk::compress(block.raw(), level).unwrap().len();
        });
        println!(
            "{:<24} ratio {:.3}",
            "",
            size as f64 / block.raw().len() as f64
        );
    }
    time("encode (stats+zstd 1)", &mut || {
        std::hint::black_box(block.encode(&g.spec, 10, Codec::Zstd { level: 1 }).unwrap());
    });
    let enc = block.encode(&g.spec, 10, Codec::Zstd { level: 1 }).unwrap();
    time("decompress", &mut || {
        std::hint::black_box(zstd::bulk::decompress(&enc.bytes, block.raw().len()).unwrap());
    });
}
