//! The column-major layout as input (`formats/colmajor.md`): `prep convert` reads it (with prep's
//! manifest, or bare `images_<split>.bin` + `labels_<split>.bin` with `--shape`) and prep
//! datasets; the round trips shards -> colmajor -> shards and colmajor -> shards -> colmajor;
//! `prep train` and `prep eval` on a column-major directory, against its shards; bad input.

use crate::util::*;
use prep::format::shard::{Dataset, Dtype, Manifest};
use std::path::{Path, PathBuf};
use std::process::Output;

fn convert(input: &Path, out: &Path, extra: &[&str], code: i32) -> Output {
    let mut args = vec![
        "convert",
        input.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    run(&args, code)
}

/// Every (sample bytes, label) of a shard dataset's split, in order, read through the library.
fn samples(d: &Path, split: &str) -> Vec<(Vec<u8>, u32)> {
    let ds = Dataset::open(d).unwrap();
    let mut out = Vec::new();
    for info in &ds.manifest.splits[split].shards {
        let r = ds.open_shard(info).unwrap();
        for b in 0..r.num_blocks() {
            let block = r.read_block(b).unwrap();
            for i in 0..block.len() {
                out.push((block.sample(i).to_vec(), block.label(i)));
            }
        }
    }
    out
}

fn manifest(d: &Path) -> Manifest {
    Dataset::open(d).unwrap().manifest
}

/// The data files of a column-major directory (not the manifest, whose provenance differs).
fn colmajor_files(d: &Path) -> Vec<(String, Vec<u8>)> {
    files(d)
        .into_iter()
        .filter(|(n, _)| n.ends_with(".bin"))
        .collect()
}

/// Write bare column-major files of one split: `samples[i]` is sample i's features.
fn write_colmajor(dir: &Path, split: &str, samples: &[Vec<f32>], labels: &[i32]) {
    std::fs::create_dir_all(dir).unwrap();
    let f = samples[0].len();
    let mut bytes = Vec::with_capacity(samples.len() * f * 4);
    for k in 0..f {
        for s in samples {
            bytes.extend_from_slice(&s[k].to_le_bytes());
        }
    }
    std::fs::write(dir.join(format!("images_{split}.bin")), bytes).unwrap();
    let l: Vec<u8> = labels.iter().flat_map(|l| l.to_le_bytes()).collect();
    std::fs::write(dir.join(format!("labels_{split}.bin")), l).unwrap();
}

/// Float values with negatives, signed zeros, a subnormal and values that are not k / 255.
fn float_samples(n: usize, f: usize) -> Vec<Vec<f32>> {
    let mut v: Vec<Vec<f32>> = (0..n)
        .map(|i| {
            (0..f)
                .map(|k| {
                    let u = ((i * f + k) as u32).wrapping_mul(2654435761) as f64 / u32::MAX as f64;
                    ((u - 0.4) * 300.0) as f32 + 0.017
                })
                .collect()
        })
        .collect();
    v[0][..4].copy_from_slice(&[-0.0, 0.0, 1e-40, -1.5]);
    v
}

/// Copy the data files of a column-major directory into `to`, without its manifest.
fn bare_copy(from: &Path, to: &Path) -> PathBuf {
    std::fs::create_dir_all(to).unwrap();
    for (name, bytes) in colmajor_files(from) {
        std::fs::write(to.join(name), bytes).unwrap();
    }
    to.to_path_buf()
}

#[test]
fn shards_to_colmajor_to_shards_gives_the_same_samples() {
    let t = tempfile::tempdir().unwrap();
    // 3000 + 500 samples of 3x12x12, 5 classes, blocks of 256, 4 blocks per shard.
    let shards = small_dataset(&t.path().join("s"), &[]);
    let cm = t.path().join("cm");
    convert(&shards, &cm, &["--format", "colmajor", "--quiet"], 0);
    // Back with the defaults (other blocks) and with the original's block settings.
    let back = t.path().join("back");
    let o = convert(&cm, &back, &[], 0);
    assert!(stdout(&o).contains("(Colmajor)"), "{}", stdout(&o));
    let same_blocks = t.path().join("same-blocks");
    convert(
        &cm,
        &same_blocks,
        &["--block-samples", "256", "--shard-blocks", "4", "--quiet"],
        0,
    );
    let (a, b) = (manifest(&shards), manifest(&back));
    assert_eq!(a.sample, b.sample);
    assert_eq!(a.classes, b.classes);
    assert_eq!(a.mean, b.mean);
    assert_eq!(a.std, b.std);
    for split in ["train", "test"] {
        assert_eq!(
            a.splits[split].class_counts, b.splits[split].class_counts,
            "{split}"
        );
        let s = samples(&shards, split);
        assert_eq!(s.len(), a.splits[split].samples as usize);
        assert!(s == samples(&back, split), "{split}: samples differ");
    }
    // With the same block settings the shard files themselves come back byte for byte.
    assert!(shard_files(&shards) == shard_files(&same_blocks));
    assert_eq!(manifest(&same_blocks).splits, a.splits);
    run(&["verify", back.to_str().unwrap()], 0);
}

#[test]
fn colmajor_to_shards_to_colmajor_is_byte_identical() {
    let t = tempfile::tempdir().unwrap();
    // u8 data with prep's manifest.
    let cm = small_dataset(&t.path().join("c"), &["--format", "colmajor"]);
    let shards = t.path().join("shards");
    convert(&cm, &shards, &["--quiet"], 0);
    assert_eq!(manifest(&shards).sample.dtype, Dtype::U8);
    let again = t.path().join("again");
    convert(&shards, &again, &["--format", "colmajor", "--quiet"], 0);
    let want = colmajor_files(&cm);
    assert_eq!(want.len(), 4);
    assert!(want == colmajor_files(&again), "colmajor files differ");
    let (m0, m1) = (
        prep::format::colmajor::ColmajorManifest::read(&cm).unwrap(),
        prep::format::colmajor::ColmajorManifest::read(&again).unwrap(),
    );
    assert_eq!(
        (&m0.sample, &m0.classes, &m0.mean, &m0.std, &m0.splits),
        (&m1.sample, &m1.classes, &m1.mean, &m1.std, &m1.splits)
    );

    // The same files without a manifest: u8 found from the values.
    let bare = bare_copy(&cm, &t.path().join("bare"));
    let s2 = t.path().join("s2");
    let o = convert(&bare, &s2, &["--shape", "3x12x12"], 0);
    let e = stderr(&o);
    assert!(
        e.contains("no manifest.json: 3x12x12 samples from --shape, 5 classes"),
        "{e}"
    );
    assert!(e.contains("dtype: u8"), "{e}");
    let c2 = t.path().join("c2");
    convert(&s2, &c2, &["--format", "colmajor", "--quiet"], 0);
    assert!(
        want == colmajor_files(&c2),
        "colmajor files differ (bare u8)"
    );

    // Float values (negative, signed zeros, a subnormal): f32 shards, and back bit for bit.
    let fl = t.path().join("float");
    let vals = float_samples(300, 2 * 5 * 4);
    let labels: Vec<i32> = (0..300).map(|i| i * 7 % 3).collect();
    write_colmajor(&fl, "train", &vals, &labels);
    write_colmajor(&fl, "test", &vals[..40], &labels[..40]);
    let fs = t.path().join("fs");
    let o = convert(&fl, &fs, &["--shape", "2x5x4"], 0);
    assert!(stderr(&o).contains("dtype: f32"), "{}", stderr(&o));
    let m = manifest(&fs);
    assert_eq!(m.sample.dtype, Dtype::F32);
    assert_eq!(m.sample.shape.0, vec![2, 5, 4]);
    assert_eq!(m.classes, vec!["0", "1", "2"]);
    let got = samples(&fs, "train");
    assert_eq!(got.len(), 300);
    for (i, ((px, l), v)) in got.iter().zip(&vals).enumerate() {
        assert_eq!(*l as i32, labels[i]);
        let back: Vec<u32> = px
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let bits: Vec<u32> = v.iter().map(|x| x.to_bits()).collect();
        assert_eq!(back, bits, "sample {i}");
    }
    let fc = t.path().join("fc");
    convert(&fs, &fc, &["--format", "colmajor", "--quiet"], 0);
    assert!(
        colmajor_files(&fl) == colmajor_files(&fc),
        "float files differ"
    );
    run(&["verify", fc.to_str().unwrap()], 0);
}

#[test]
fn bare_files_take_u8_when_every_value_is_k_over_255_else_f32_or_dtype() {
    let t = tempfile::tempdir().unwrap();
    let shards = small_dataset(&t.path().join("s"), &[]);
    let cm = small_dataset(&t.path().join("c"), &["--format", "colmajor"]);
    let bare = bare_copy(&cm, &t.path().join("bare"));
    // u8 when every value is k / 255: the very pixels of the shards of the same seed.
    let u = t.path().join("u8");
    convert(&bare, &u, &["--shape", "3x12x12", "--quiet"], 0);
    let m = manifest(&u);
    assert_eq!(m.sample.dtype, Dtype::U8);
    assert_eq!(m.classes, vec!["0", "1", "2", "3", "4"]);
    assert_eq!(m.mean, manifest(&shards).mean);
    assert_eq!(m.std, manifest(&shards).std);
    for split in ["train", "test"] {
        assert!(samples(&u, split) == samples(&shards, split), "{split}");
    }
    // --dtype f32 keeps the values k / 255 as they are.
    let f = t.path().join("f32");
    convert(
        &bare,
        &f,
        &["--shape", "3x12x12", "--dtype", "f32", "--quiet"],
        0,
    );
    assert_eq!(manifest(&f).sample.dtype, Dtype::F32);
    for ((a, la), (b, lb)) in samples(&f, "test").iter().zip(samples(&shards, "test")) {
        assert_eq!(*la, lb);
        for (v, &p) in a.chunks_exact(4).zip(&b) {
            assert_eq!(f32::from_le_bytes(v.try_into().unwrap()), p as f32 / 255.0);
        }
    }
    // --dtype u16: pixel k / 255 becomes k * 257.
    let w = t.path().join("u16");
    convert(
        &bare,
        &w,
        &["--shape", "3x12x12", "--dtype", "u16", "--quiet"],
        0,
    );
    for ((a, _), (b, _)) in samples(&w, "test").iter().zip(samples(&shards, "test")) {
        for (v, &p) in a.chunks_exact(2).zip(&b) {
            assert_eq!(u16::from_le_bytes(v.try_into().unwrap()), p as u16 * 257);
        }
    }

    // One value that is not k / 255: the whole dataset becomes f32, and stderr says where.
    let odd = bare_copy(&cm, &t.path().join("odd"));
    let n = manifest(&shards).splits["train"].samples as usize;
    let mut img = std::fs::read(odd.join("images_train.bin")).unwrap();
    // Sample 17, feature 100.
    let at = 4 * (100 * n + 17);
    img[at..at + 4].copy_from_slice(&0.3f32.to_le_bytes());
    std::fs::write(odd.join("images_train.bin"), img).unwrap();
    let f2 = t.path().join("odd-f32");
    let o = convert(&odd, &f2, &["--shape", "3x12x12"], 0);
    let e = stderr(&o);
    assert!(
        e.contains("dtype: f32 (images_train.bin[17] feature 100 holds 0.3, not a u8 pixel / 255)"),
        "{e}"
    );
    assert_eq!(manifest(&f2).sample.dtype, Dtype::F32);
    let s17 = &samples(&f2, "train")[17].0;
    assert_eq!(f32::from_le_bytes(s17[400..404].try_into().unwrap()), 0.3);
    // Asked for u8 instead, 0.3 rounds to a pixel.
    let u2 = t.path().join("odd-u8");
    convert(
        &odd,
        &u2,
        &["--shape", "3x12x12", "--dtype", "u8", "--quiet"],
        0,
    );
    assert_eq!(
        samples(&u2, "train")[17].0[100],
        (0.3f32 * 255.0).round() as u8
    );

    // Floats to f16 round to nearest; a value beyond f16's range leaves its sample out, by name.
    let fl = t.path().join("float");
    let mut vals = float_samples(50, 16);
    vals[9][3] = 1e6;
    write_colmajor(&fl, "train", &vals, &[0; 50]);
    let h = t.path().join("f16");
    let o = convert(&fl, &h, &["--shape", "1x4x4", "--dtype", "f16"], 0);
    let e = stderr(&o);
    assert!(e.contains("images_train.bin[9]"), "{e}");
    assert!(e.contains("beyond f16's range"), "{e}");
    let got = samples(&h, "train");
    assert_eq!(got.len(), 49);
    assert_eq!(manifest(&h).classes, vec!["0"]);
    for ((px, _), v) in got
        .iter()
        .zip(vals.iter().enumerate().filter(|(i, _)| *i != 9))
    {
        for (b, x) in px.chunks_exact(2).zip(v.1) {
            let h = half::f16::from_le_bytes(b.try_into().unwrap());
            assert_eq!(h, half::f16::from_f32(*x));
        }
    }
    // Float values outside [0, 1] cannot be u8 pixels: each sample is rejected with the reason.
    let o = convert(
        &fl,
        &t.path().join("fl-u8"),
        &["--shape", "1x4x4", "--dtype", "u8"],
        1,
    );
    assert!(
        stderr(&o).contains("no input could be decoded"),
        "{}",
        stderr(&o)
    );
}

/// A failed command: its stderr, checked to name `names` and to hold no panic.
fn refused(args: &[&str], code: i32, names: &[&str]) -> String {
    let o = run(args, code);
    let e = stderr(&o);
    assert!(!e.contains("panicked"), "{args:?}: {e}");
    for n in names {
        assert!(e.contains(n), "{args:?}: stderr lacks {n:?}:\n{e}");
    }
    // Nothing is left behind in --out.
    if let Some(i) = args.iter().position(|a| *a == "--out") {
        let out = Path::new(args[i + 1]);
        if args[1] != args[i + 1] {
            assert!(!out.exists(), "{args:?} left {} behind", out.display());
        }
    }
    e
}

#[test]
fn bad_column_major_input_is_refused_naming_the_file() {
    let t = tempfile::tempdir().unwrap();
    let cm = small_dataset(&t.path().join("c"), &["--format", "colmajor"]);
    let out = t.path().join("out");
    let o = out.to_str().unwrap();
    let fresh = |name: &str| {
        let d = t.path().join(name);
        bare_copy(&cm, &d);
        d
    };
    let s = |p: &Path| p.to_str().unwrap().to_string();

    // No --shape for files without a manifest: a usage error, for convert and train.
    let d = fresh("noshape");
    let e = refused(&["convert", &s(&d), "--out", o], 2, &["--shape CxHxW"]);
    assert!(e.contains(&s(&d)), "{e}");
    refused(
        &["train", &s(&d), "--device", "cpu", "--out", o],
        2,
        &["--shape CxHxW"],
    );
    // A shape whose sample size does not divide the file: both numbers, exit 2.
    refused(
        &["convert", &s(&d), "--shape", "3x12x13", "--out", o],
        2,
        &[
            "images_test.bin: its size, 864000 bytes, is not a multiple of 1872 bytes",
            "check --shape",
        ],
    );
    // A shape that divides the images but not into as many samples as there are labels.
    refused(
        &["convert", &s(&d), "--shape", "1x12x12", "--out", o],
        2,
        &[
            "labels_test.bin: 500 int32 labels (2000 bytes), but",
            "images_test.bin holds 1500 samples of 1x12x12",
            "432 float32 values per sample",
        ],
    );
    refused(
        &[
            "train",
            &s(&d),
            "--shape",
            "3x10x10",
            "--device",
            "cpu",
            "--out",
            o,
        ],
        2,
        &["labels_test.bin", "check --shape"],
    );
    // --shape on a dataset whose manifest says another shape, and on shards.
    refused(
        &["convert", &s(&cm), "--shape", "3x10x10", "--out", o],
        2,
        &["--shape 3x10x10, but the manifest says 3x12x12"],
    );
    let shards = small_dataset(&t.path().join("s"), &[]);
    refused(
        &["convert", &s(&shards), "--shape", "3x12x12", "--out", o],
        2,
        &["prep shard dataset"],
    );
    // --out the input itself.
    refused(
        &["convert", &s(&cm), "--out", &s(&cm), "--force"],
        2,
        &["another directory"],
    );

    // A truncated images file (labels intact): exit 1, naming it and the size expected.
    let d = fresh("trunc-images");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(d.join("images_train.bin"))
        .unwrap();
    f.set_len(3000 * 1728 - 100).unwrap();
    refused(
        &["convert", &s(&d), "--shape", "3x12x12", "--out", o],
        1,
        &[
            "images_train.bin: its size, 5183900 bytes, is not a multiple of 1728 bytes",
            "short of the 5184000 bytes",
            "truncated",
        ],
    );
    // Truncated labels: a whole label short, then part of one.
    let d = fresh("trunc-labels");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(d.join("labels_train.bin"))
        .unwrap();
    f.set_len(11992).unwrap();
    refused(
        &["convert", &s(&d), "--shape", "3x12x12", "--out", o],
        1,
        &[
            "labels_train.bin: 2998 int32 labels (11992 bytes), but",
            "truncated",
        ],
    );
    f.set_len(11991).unwrap();
    refused(
        &["convert", &s(&d), "--shape", "3x12x12", "--out", o],
        1,
        &["labels_train.bin: its size, 11991 bytes, is not a multiple of 4"],
    );
    // With a manifest, a file of another size than it says: exit 1 for convert, train and eval.
    let d = t.path().join("trunc-manifest");
    std::fs::create_dir_all(&d).unwrap();
    for (name, bytes) in files(&cm) {
        std::fs::write(d.join(name), bytes).unwrap();
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(d.join("images_test.bin"))
        .unwrap()
        .set_len(864000 - 1728)
        .unwrap();
    let want = [
        "images_test.bin: is 862272 bytes, but the manifest's 500 samples of 3x12x12 float32 make 864000 bytes (truncated?)",
    ];
    refused(&["convert", &s(&d), "--out", o], 1, &want);
    refused(&["train", &s(&d), "--device", "cpu", "--out", o], 1, &want);

    // A labels file without its images file, and the reverse.
    let d = fresh("no-labels");
    std::fs::remove_file(d.join("labels_test.bin")).unwrap();
    refused(
        &["convert", &s(&d), "--shape", "3x12x12", "--out", o],
        1,
        &["images_test.bin: no labels_test.bin beside it"],
    );
    let d = fresh("no-images");
    std::fs::remove_file(d.join("images_test.bin")).unwrap();
    refused(
        &["convert", &s(&d), "--shape", "3x12x12", "--out", o],
        1,
        &["labels_test.bin: no images_test.bin beside it"],
    );
    // Empty files.
    let d = t.path().join("empty");
    write_colmajor(&d, "train", &[vec![0.5; 4]], &[0]);
    std::fs::write(d.join("images_train.bin"), b"").unwrap();
    std::fs::write(d.join("labels_train.bin"), b"").unwrap();
    refused(
        &["convert", &s(&d), "--shape", "1x2x2", "--out", o],
        1,
        &["images_train.bin: is empty"],
    );
    // A negative label, named with its index.
    let d = fresh("neg-label");
    let mut l = std::fs::read(d.join("labels_train.bin")).unwrap();
    l[4 * 2999..].copy_from_slice(&(-4i32).to_le_bytes());
    std::fs::write(d.join("labels_train.bin"), l).unwrap();
    refused(
        &["convert", &s(&d), "--shape", "3x12x12", "--out", o],
        1,
        &["labels_train.bin: label -4 at index 2999 is negative"],
    );
    refused(
        &[
            "train",
            &s(&d),
            "--shape",
            "3x12x12",
            "--device",
            "cpu",
            "--out",
            o,
        ],
        1,
        &["labels_train.bin: label -4 at index 2999 is negative"],
    );

    // NaN: the sample is left out by name (--on-error skip), or stops the run (fail, or train).
    let d = t.path().join("nan");
    let mut vals: Vec<Vec<f32>> = (0..64)
        .map(|i| (0..16).map(|k| ((i + k) % 256) as f32 / 255.0).collect())
        .collect();
    vals[17][5] = f32::NAN;
    write_colmajor(&d, "train", &vals, &vec![1; 64]);
    let o2 = t.path().join("nan-out");
    let ok = run(
        &["convert", &s(&d), "--shape", "1x4x4", "--out", &s(&o2)],
        0,
    );
    let e = stderr(&ok);
    assert!(
        e.contains("images_train.bin[17]: feature 5: value NaN: float samples must be finite"),
        "{e}"
    );
    // The other values are all k / 255: the NaN does not make the dataset f32.
    assert_eq!(manifest(&o2).sample.dtype, Dtype::U8);
    assert_eq!(manifest(&o2).splits["train"].samples, 63);
    let rejects = std::fs::read_to_string(o2.join("rejects.jsonl")).unwrap();
    assert!(rejects.contains("images_train.bin[17]"), "{rejects}");
    refused(
        &[
            "convert",
            &s(&d),
            "--shape",
            "1x4x4",
            "--dtype",
            "f32",
            "--on-error",
            "fail",
            "--out",
            o,
        ],
        1,
        &["images_train.bin[17]: feature 5: value NaN"],
    );
    refused(
        &[
            "train",
            &s(&d),
            "--shape",
            "1x4x4",
            "--device",
            "cpu",
            "--out",
            o,
        ],
        1,
        &["images_train.bin: sample 17, feature 5: value NaN is not finite"],
    );
}

fn tensors(run: &Path) -> Vec<(String, Vec<u32>)> {
    prep::train::checkpoint::load(&run.join("checkpoint.safetensors"))
        .unwrap()
        .0
        .into_iter()
        .map(|(n, v)| (n, v.iter().map(|x| x.to_bits()).collect()))
        .collect()
}

fn train_json(data: &Path, out: &Path, extra: &[&str]) -> (serde_json::Value, String) {
    let mut args = vec![
        "train",
        data.to_str().unwrap(),
        "--device",
        "cpu",
        "--batch",
        "64",
        "--lr",
        "0.2",
        "--seed",
        "7",
        "--out",
        out.to_str().unwrap(),
        "--json",
    ];
    if !extra.contains(&"--epochs") {
        args.extend_from_slice(&["--epochs", "2"]);
    }
    args.extend_from_slice(extra);
    let o = run(&args, 0);
    (serde_json::from_slice(&o.stdout).unwrap(), stderr(&o))
}

fn eval_accuracy(run_dir: &Path, data: &Path) -> f64 {
    let o = run(
        &[
            "eval",
            run_dir.to_str().unwrap(),
            data.to_str().unwrap(),
            "--json",
        ],
        0,
    );
    let e: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    e["accuracy"].as_f64().unwrap()
}

#[test]
fn training_on_colmajor_equals_training_on_its_shards() {
    let t = tempfile::tempdir().unwrap();
    let cm = t.path().join("cm");
    run(
        &[
            "synth",
            "--train",
            "2048",
            "--test",
            "256",
            "--shape",
            "3x12x12",
            "--classes",
            "4",
            "--seed",
            "5",
            "--format",
            "colmajor",
            "--out",
            cm.to_str().unwrap(),
            "--quiet",
        ],
        0,
    );
    // Its shards, with the default blocks (those a column-major split is read in).
    let shards = t.path().join("shards");
    convert(&cm, &shards, &["--quiet"], 0);
    let bare = bare_copy(&cm, &t.path().join("bare"));

    let (s_sh, _) = train_json(&shards, &t.path().join("run-shards"), &[]);
    let (s_cm, e_cm) = train_json(&cm, &t.path().join("run-cm"), &[]);
    let (s_bare, e_bare) = train_json(&bare, &t.path().join("run-bare"), &["--shape", "3x12x12"]);
    assert_eq!(s_sh["layout"], "shards");
    assert_eq!(s_cm["layout"], "colmajor");
    assert_eq!(s_bare["layout"], "colmajor");
    assert!(
        e_cm.contains("input: column-major files, memory-mapped"),
        "{e_cm}"
    );
    assert!(
        e_bare.contains("input: column-major files without manifest.json, memory-mapped"),
        "{e_bare}"
    );
    assert!(e_bare.contains("read as u8"), "{e_bare}");
    let acc = s_sh["test_accuracy"].as_f64().unwrap();
    assert!(acc > 0.5, "4 learnable classes: {acc}");
    assert_eq!(s_cm["test_accuracy"].as_f64().unwrap(), acc);
    assert_eq!(s_bare["test_accuracy"].as_f64().unwrap(), acc);
    assert_eq!(s_cm["confusion"], s_sh["confusion"]);
    // The same batches in the same order: the same weights, bit for bit.
    let w = tensors(&t.path().join("run-shards"));
    assert!(
        w == tensors(&t.path().join("run-cm")),
        "colmajor weights differ"
    );
    assert!(
        w == tensors(&t.path().join("run-bare")),
        "bare colmajor weights differ"
    );
    // eval repeats the figure on every layout of the same data, from a run of either.
    for run_dir in ["run-shards", "run-cm", "run-bare"] {
        for data in [&shards, &cm, &bare] {
            assert_eq!(
                eval_accuracy(&t.path().join(run_dir), data),
                acc,
                "{run_dir} on {}",
                data.display()
            );
        }
    }

    // A run on bare files stopped mid-epoch and resumed ends with the same weights.
    let stopped = t.path().join("stopped");
    prep::train::train(&prep::train::TrainOptions {
        data: bare.clone(),
        shape: Some("3x12x12".parse().unwrap()),
        out: Some(stopped.clone()),
        resume: None,
        model: Some("small".into()),
        width: None,
        task: None,
        loss: None,
        epochs: 2,
        batch: 64,
        lr: Some(0.2),
        momentum: 0.9,
        weight_decay: 5e-4,
        label_smoothing: 0.1,
        seed: 7,
        augment: true,
        checkpoint_every: 0,
        device: "cpu".into(),
        memory: "auto".into(),
        precision: "bf16".into(),
        skip_damaged: false,
        quiet: true,
        stop_after: Some(13),
        world: None,
        sync_bn: false,
    })
    .unwrap();
    let cur = prep::train::checkpoint::load(&stopped.join("checkpoint.safetensors"))
        .unwrap()
        .1;
    assert_eq!((cur.epoch, cur.batch), (0, 13));
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(stopped.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["layout"], "colmajor");
    assert_eq!(cfg["input_dtype"], "u8");
    let o = run(
        &["train", "--resume", stopped.to_str().unwrap(), "--json"],
        0,
    );
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["test_accuracy"].as_f64().unwrap(), acc);
    assert!(w == tensors(&stopped), "resumed weights differ");

    // Float values: bare files read as f32 train as their f32 shards do (the one pass over the
    // files gives the mean and std the shard writer computes).
    let fl = t.path().join("float");
    let labels: Vec<i32> = (0..1100).map(|i| i * 7 % 3).collect();
    let vals: Vec<Vec<f32>> = float_samples(1100, 64)
        .into_iter()
        .zip(&labels)
        .map(|(v, &l)| v.iter().map(|x| x + 50.0 * l as f32).collect())
        .collect();
    write_colmajor(&fl, "train", &vals[..1000], &labels[..1000]);
    write_colmajor(&fl, "test", &vals[1000..], &labels[1000..]);
    let fs = t.path().join("float-shards");
    convert(&fl, &fs, &["--shape", "1x8x8", "--quiet"], 0);
    assert_eq!(manifest(&fs).sample.dtype, Dtype::F32);
    let (a, _) = train_json(&fs, &t.path().join("run-fs"), &["--epochs", "1"]);
    let (b, e) = train_json(
        &fl,
        &t.path().join("run-fl"),
        &["--epochs", "1", "--shape", "1x8x8"],
    );
    assert!(e.contains("input: read as f32"), "{e}");
    assert_eq!(a["test_accuracy"], b["test_accuracy"]);
    assert!(
        tensors(&t.path().join("run-fs")) == tensors(&t.path().join("run-fl")),
        "float colmajor weights differ"
    );
}

#[test]
fn convert_reads_a_prep_dataset_to_change_dtype_size_and_blocks() {
    let t = tempfile::tempdir().unwrap();
    let shards = small_dataset(&t.path().join("s"), &[]);
    let orig = samples(&shards, "train");
    // Blocks: 100 samples a block, 3 blocks a shard; the samples stay.
    let b = t.path().join("blocks");
    let o = convert(
        &shards,
        &b,
        &["--block-samples", "100", "--shard-blocks", "3"],
        0,
    );
    assert!(stdout(&o).contains("(Shards)"), "{}", stdout(&o));
    let m = manifest(&b);
    assert_eq!(m.block_samples, 100);
    assert_eq!(m.splits["train"].shards.len(), 10);
    assert_eq!(m.mean, manifest(&shards).mean);
    assert!(samples(&b, "train") == orig);
    assert!(samples(&b, "test") == samples(&shards, "test"));
    // dtype: u8 -> f32 (k / 255) -> u8 gives back the pixels.
    let f = t.path().join("f32");
    convert(&shards, &f, &["--dtype", "f32", "--quiet"], 0);
    let m = manifest(&f);
    assert_eq!(m.sample.dtype, Dtype::F32);
    assert_eq!(m.classes, manifest(&shards).classes);
    for ((a, la), (b, lb)) in samples(&f, "train").iter().zip(&orig) {
        assert_eq!(la, lb);
        for (v, &p) in a.chunks_exact(4).zip(b) {
            assert_eq!(f32::from_le_bytes(v.try_into().unwrap()), p as f32 / 255.0);
        }
    }
    let u = t.path().join("u8-again");
    convert(&f, &u, &["--dtype", "u8", "--quiet"], 0);
    assert!(samples(&u, "train") == orig);
    // f16 from the f32 dataset, and to column-major as f16 (format version 2).
    let h = t.path().join("f16-cm");
    convert(
        &f,
        &h,
        &["--dtype", "f16", "--format", "colmajor", "--quiet"],
        0,
    );
    let hm = prep::format::colmajor::ColmajorManifest::read(&h).unwrap();
    assert_eq!((hm.sample.dtype, hm.version), (Dtype::F16, 2));
    run(&["verify", h.to_str().unwrap()], 0);
    // Size: 12x12 -> 6x6, channels kept, every sample converted.
    let z = t.path().join("small");
    convert(&shards, &z, &["--size", "6x6", "--quiet"], 0);
    let m = manifest(&z);
    assert_eq!(m.sample.shape.0, vec![3, 6, 6]);
    assert_eq!(m.sample.dtype, Dtype::U8);
    assert_eq!(m.splits["train"].samples, 3000);
    assert_eq!(
        m.splits["train"].class_counts,
        manifest(&shards).splits["train"].class_counts
    );
    // And of float data, through float planes.
    let zf = t.path().join("small-f32");
    convert(&f, &zf, &["--size", "6x6", "--quiet"], 0);
    assert_eq!(manifest(&zf).sample.shape.0, vec![3, 6, 6]);
    assert_eq!(manifest(&zf).sample.dtype, Dtype::F32);
    run(&["verify", zf.to_str().unwrap()], 0);
    // The colmajor dataset itself, resized and re-blocked, straight to shards.
    let cm = t.path().join("cm");
    convert(&shards, &cm, &["--format", "colmajor", "--quiet"], 0);
    let zc = t.path().join("small-from-cm");
    convert(&cm, &zc, &["--size", "6x6", "--quiet"], 0);
    assert!(samples(&zc, "train") == samples(&z, "train"));
    // What convert cannot change: the channel count.
    let o = convert(&shards, &t.path().join("grey"), &["--channels", "1"], 2);
    assert!(
        stderr(&o).contains("keeps the samples' 3 channels"),
        "{}",
        stderr(&o)
    );
}
