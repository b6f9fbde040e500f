//! The block codecs end to end: `pred` holds exactly zstd's samples and trains to the same
//! figures, `jpeg` holds samples close to them, a flipped byte in either is caught, and `jpeg`
//! refuses samples it cannot hold.

use crate::util::*;
use prep::format::shard::{Dataset, ShardReader};
use std::path::{Path, PathBuf};

fn synth(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let mut args = SMALL_SYNTH.to_vec();
    args.extend_from_slice(&["--out", out.to_str().unwrap(), "--quiet", "--seed", "3"]);
    args.extend_from_slice(extra);
    run(&args, 0);
    out
}

/// Every sample and label of `split`, in order.
fn samples(d: &Path, split: &str) -> (Vec<u8>, Vec<u32>) {
    let ds = Dataset::open(d).unwrap();
    let (mut px, mut labels) = (Vec::new(), Vec::new());
    for info in &ds.manifest.splits[split].shards {
        let r = ds.open_shard(info).unwrap();
        for i in 0..r.num_blocks() {
            let b = r.read_block(i).unwrap();
            px.extend_from_slice(b.pixels());
            labels.extend(b.labels());
        }
    }
    (px, labels)
}

fn train(d: &Path, run_dir: &Path) -> serde_json::Value {
    let o = run(
        &[
            "train",
            d.to_str().unwrap(),
            "--device",
            "cpu",
            "--epochs",
            "3",
            "--batch",
            "64",
            "--lr",
            "0.2",
            "--out",
            run_dir.to_str().unwrap(),
            "--quiet",
            "--json",
        ],
        0,
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn pred_is_lossless_and_jpeg_is_close_and_both_train() {
    let t = tempfile::tempdir().unwrap();
    let z = synth(t.path(), "zstd", &[]);
    let p = synth(t.path(), "pred", &["--codec", "pred"]);
    let j = synth(t.path(), "jpeg", &["--codec", "jpeg", "--quality", "95"]);
    for d in [&z, &p, &j] {
        run(&["verify", d.to_str().unwrap()], 0);
    }
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(j.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(
        m["codec"],
        serde_json::json!({"name": "jpeg", "quality": 95})
    );
    let o = run(&["inspect", j.to_str().unwrap()], 0);
    assert!(stdout(&o).contains("jpeg (lossy"), "{}", stdout(&o));
    for split in ["train", "test"] {
        let (zp, zl) = samples(&z, split);
        assert_eq!(samples(&p, split), (zp.clone(), zl.clone()), "pred differs");
        let (jp, jl) = samples(&j, split);
        assert_eq!(jl, zl);
        let err = zp
            .iter()
            .zip(&jp)
            .map(|(&a, &b)| (a as f64 - b as f64).abs())
            .sum::<f64>()
            / zp.len() as f64;
        // The synthetic images are noisy: far from JPEG's best case, still close.
        assert!(err < 12.0, "jpeg at quality 95: mean absolute error {err}");
    }
    let (rz, rp) = (
        train(&z, &t.path().join("rz")),
        train(&p, &t.path().join("rp")),
    );
    for k in ["test_accuracy", "test_loss"] {
        assert_eq!(rz[k], rp[k], "{k}: pred must train exactly as zstd");
    }
    let rj = train(&j, &t.path().join("rj"));
    let (az, aj) = (
        rz["test_accuracy"].as_f64().unwrap(),
        rj["test_accuracy"].as_f64().unwrap(),
    );
    assert!(az > 0.5 && aj > az - 0.15, "zstd {az}, jpeg {aj}");
}

#[test]
fn a_flipped_byte_in_a_pred_or_jpeg_block_is_caught() {
    let t = tempfile::tempdir().unwrap();
    for codec in ["pred", "jpeg"] {
        let d = synth(t.path(), codec, &["--codec", codec]);
        let ds = Dataset::open(&d).unwrap();
        let info = ds.manifest.splits["train"].shards[0].clone();
        let path = d.join(&info.file);
        let original = std::fs::read(&path).unwrap();
        let e = *ShardReader::open(&path).unwrap().entry(1);
        // The method byte, the stream lengths, a stream, the labels' frame.
        for at in [0, 2, e.stored_len / 3, e.stored_len - 2] {
            let mut bad = original.clone();
            bad[(e.offset + at) as usize] ^= 0x10;
            std::fs::write(&path, &bad).unwrap();
            let o = run(&["verify", d.to_str().unwrap()], 1);
            assert!(
                stdout(&o).contains(&format!("DAMAGED {}: block 1:", info.file)),
                "{codec}, byte {at}: {}",
                stdout(&o)
            );
        }
        std::fs::write(&path, &original).unwrap();
        run(&["verify", d.to_str().unwrap()], 0);
    }
}

#[test]
fn jpeg_refuses_what_it_cannot_hold_and_quality_needs_it() {
    let t = tempfile::tempdir().unwrap();
    for shape in ["4x16x16", "2x16x16", "1x4x16x16", "3x64"] {
        let out = t.path().join(shape);
        let o = run(
            &[
                "synth",
                "--train",
                "10",
                "--test",
                "0",
                "--shape",
                shape,
                "--codec",
                "jpeg",
                "--out",
                out.to_str().unwrap(),
            ],
            2,
        );
        assert!(
            stderr(&o).contains("--codec jpeg takes u8 images"),
            "{}",
            stderr(&o)
        );
        assert!(!out.exists(), "{shape}: nothing is written");
    }
    let o = run(
        &[
            "synth",
            "--train",
            "10",
            "--test",
            "0",
            "--quality",
            "80",
            "--out",
            t.path().join("q").to_str().unwrap(),
        ],
        2,
    );
    assert!(stderr(&o).contains("--quality"), "{}", stderr(&o));
    // A u16 conversion.
    let src = t.path().join("arrays");
    std::fs::create_dir(&src).unwrap();
    let data: Vec<u8> = (0..2 * 3 * 8 * 8u32)
        .flat_map(|v| (v as u16).to_le_bytes())
        .collect();
    write_npy(&src.join("x_train.npy"), "<u2", &[2, 3, 8, 8], &data);
    let labels: Vec<u8> = [0i64, 1].iter().flat_map(|v| v.to_le_bytes()).collect();
    write_npy(&src.join("y_train.npy"), "<i8", &[2], &labels);
    let o = prep()
        .args([
            "convert",
            src.to_str().unwrap(),
            "--dtype",
            "u16",
            "--codec",
            "jpeg",
        ])
        .arg("--out")
        .arg(t.path().join("u16"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--codec jpeg takes u8 images"),
        "{}",
        stderr(&o)
    );
}
