//! Fashion-MNIST from Debian's `dataset-fashion-mnist` (the CI's real-data tier installs it; set
//! PREP_REQUIRE_FASHION_MNIST=1 to make its absence a failure rather than a skip).

use crate::util::*;
use prep::format::shard::Dataset;
use std::io::Read;
use std::path::Path;

const DIR: &str = "/usr/share/datasets/fashion-mnist";

fn available() -> bool {
    if Path::new(DIR).join("train-images-idx3-ubyte.gz").is_file() {
        return true;
    }
    assert!(
        std::env::var("PREP_REQUIRE_FASHION_MNIST").is_err(),
        "{DIR} is missing: apt-get install dataset-fashion-mnist"
    );
    eprintln!("skipped: {DIR} not installed");
    false
}

fn gunzip(name: &str) -> Vec<u8> {
    let mut v = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(Path::new(DIR).join(name)).unwrap())
        .read_to_end(&mut v)
        .unwrap();
    v
}

#[test]
fn fashion_mnist_is_pixel_exact_in_shards_and_colmajor() {
    if !available() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("fm");
    run(
        &["convert", DIR, "--out", out.to_str().unwrap(), "--quiet"],
        0,
    );
    let ds = Dataset::open(&out).unwrap();
    let m = &ds.manifest;
    assert_eq!(m.splits["train"].samples, 60_000);
    assert_eq!(m.splits["test"].samples, 10_000);
    assert_eq!(m.splits["train"].class_counts, vec![6000; 10]);
    assert_eq!(m.splits["test"].class_counts, vec![1000; 10]);
    for (split, prefix) in [("train", "train"), ("test", "t10k")] {
        let px = gunzip(&format!("{prefix}-images-idx3-ubyte.gz"));
        let lb = gunzip(&format!("{prefix}-labels-idx1-ubyte.gz"));
        let (px, lb) = (&px[16..], &lb[8..]);
        let mut i = 0;
        for info in &m.splits[split].shards {
            let r = ds.open_shard(info).unwrap();
            for b in 0..r.num_blocks() {
                let block = r.read_block(b).unwrap();
                assert_eq!(
                    block.pixels(),
                    &px[i * 784..(i + block.len()) * 784],
                    "{split} block {b}"
                );
                assert!(block
                    .labels()
                    .eq(lb[i..i + block.len()].iter().map(|&l| l as u32)));
                i += block.len();
            }
        }
        assert_eq!(i * 784, px.len());
    }

    let cm = t.path().join("fmc");
    run(
        &[
            "convert",
            DIR,
            "--out",
            cm.to_str().unwrap(),
            "--format",
            "colmajor",
            "--quiet",
        ],
        0,
    );
    let images = std::fs::read(cm.join("images_train.bin")).unwrap();
    let labels = std::fs::read(cm.join("labels_train.bin")).unwrap();
    let px = gunzip("train-images-idx3-ubyte.gz");
    let lb = gunzip("train-labels-idx1-ubyte.gz");
    let n = 60_000;
    assert_eq!(images.len(), n * 784 * 4);
    for f in 0..784 {
        for i in 0..n {
            let o = (f * n + i) * 4;
            let v = f32::from_le_bytes(images[o..o + 4].try_into().unwrap());
            assert_eq!(
                v,
                px[16 + i * 784 + f] as f32 / 255.0,
                "sample {i} feature {f}"
            );
        }
    }
    for i in 0..n {
        assert_eq!(
            i32::from_le_bytes(labels[i * 4..i * 4 + 4].try_into().unwrap()),
            lb[8 + i] as i32
        );
    }
}
