use crate::util::*;
use prep::format::colmajor::{ColmajorManifest, ColmajorSplitReader};
use prep::format::shard::Dataset;

/// The colmajor output of a seed holds exactly the samples of the shard output of the same seed.
#[test]
fn colmajor_matches_shards_sample_for_sample() {
    let t = tempfile::tempdir().unwrap();
    let shards = small_dataset(&t.path().join("s"), &[]);
    let cm = small_dataset(&t.path().join("c"), &["--format", "colmajor"]);
    let ds = Dataset::open(&shards).unwrap();
    let m = ColmajorManifest::read(&cm).unwrap();
    assert_eq!(m.sample, ds.manifest.sample);
    for split in ["train", "test"] {
        let r = ColmajorSplitReader::open(&cm, &m, split).unwrap();
        let s = &ds.manifest.splits[split];
        assert_eq!(r.samples as u64, s.samples);
        assert_eq!(m.splits[split].class_counts, s.class_counts);
        let mut i = 0;
        for info in &s.shards {
            let sr = ds.open_shard(info).unwrap();
            for b in 0..sr.num_blocks() {
                let block = sr.read_block(b).unwrap();
                for j in 0..block.len() {
                    assert_eq!(r.label(i), block.label(j) as i32, "{split} sample {i}");
                    for (f, &p) in block.sample(j).iter().enumerate() {
                        assert_eq!(
                            r.get(i, f),
                            p as f32 / 255.0,
                            "{split} sample {i} feature {f}"
                        );
                    }
                    i += 1;
                }
            }
        }
        assert_eq!(i, r.samples);
    }
    // Raw file layout: feature-major float32, int32 labels.
    let n = m.splits["train"].samples as usize;
    let bytes = std::fs::read(cm.join("images_train.bin")).unwrap();
    assert_eq!(bytes.len(), n * 3 * 12 * 12 * 4);
    let labels = std::fs::read(cm.join("labels_train.bin")).unwrap();
    assert_eq!(labels.len(), n * 4);
    run(&["verify", cm.to_str().unwrap()], 0);
    run(&["inspect", cm.to_str().unwrap()], 0);
}
