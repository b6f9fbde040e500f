//! The committed version-1 dataset still reads, verifies, and regenerates identically.

use crate::util::*;
use prep::format::shard::Dataset;
use std::path::Path;

fn fixture() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/synth-v1"))
}

#[test]
fn v1_fixture_reads_and_verifies() {
    let ds = Dataset::open(fixture()).unwrap();
    let m = &ds.manifest;
    assert_eq!(m.sample.shape.0, vec![3, 8, 8]);
    assert_eq!(m.splits["train"].samples, 200);
    assert_eq!(m.splits["test"].samples, 50);
    assert!(ds.verify(&|_| {}).ok());
    let o = run(&["verify", fixture().to_str().unwrap()], 0);
    assert!(stdout(&o).contains("250 samples"), "{}", stdout(&o));
}

#[test]
fn v1_fixture_regenerates_identically() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("again");
    run(
        &[
            "synth",
            "--train",
            "200",
            "--test",
            "50",
            "--shape",
            "3x8x8",
            "--classes",
            "4",
            "--seed",
            "11",
            "--block-samples",
            "64",
            "--shard-blocks",
            "2",
            // The fixture predates generator version 2, the default since.
            "--generator",
            "1",
            "--out",
            out.to_str().unwrap(),
            "--quiet",
        ],
        0,
    );
    let (old, new) = (
        Dataset::open(fixture()).unwrap(),
        Dataset::open(&out).unwrap(),
    );
    // Same samples and labels, block by block (the generator is stable) ...
    for ((_, a), (_, b)) in old.shards().zip(new.shards()) {
        let (ra, rb) = (old.open_shard(a).unwrap(), new.open_shard(b).unwrap());
        for i in 0..ra.num_blocks() {
            assert_eq!(
                ra.read_block(i).unwrap(),
                rb.read_block(i).unwrap(),
                "{} block {i}",
                a.file
            );
        }
    }
    // ... and the same bytes (the writer is stable; a zstd upgrade that changes its output shows here).
    assert!(
        shard_files(fixture()) == shard_files(&out),
        "shard bytes differ from the v1 fixture"
    );
}
