//! A newcomer's first hour (issue 25, part A): image trees split into train/ and val/ folders,
//! `--resume` with other flags, shapes written HxWxC, output piped into `head`, and counts
//! written 60k or 1e6.

use crate::util::*;
use image::{Rgb, RgbImage};
use std::path::{Path, PathBuf};

pub(crate) fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn png(path: &Path, v: u8) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    RgbImage::from_fn(8, 8, |x, y| {
        Rgb([v.wrapping_add((x * 5) as u8), (y * 9) as u8, 100])
    })
    .save(path)
    .unwrap();
}

/// `root/SPLIT/CLASS/i.png`, `n` images for each (split, class, n).
fn tree(root: &Path, layout: &[(&str, &str, u8)]) -> PathBuf {
    for &(split, class, n) in layout {
        for i in 0..n {
            png(
                &root.join(split).join(class).join(format!("{i}.png")),
                i * 20,
            );
        }
    }
    root.to_path_buf()
}

fn inspect(out: &Path) -> serde_json::Value {
    let o = run(&["inspect", s(out), "--json"], 0);
    serde_json::from_slice(&o.stdout).expect("inspect --json prints JSON")
}

/// (split name, class counts) of every split.
fn splits(v: &serde_json::Value) -> Vec<(String, Vec<u64>)> {
    v["splits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|sp| {
            (
                sp["name"].as_str().unwrap().to_string(),
                serde_json::from_value(sp["class_counts"].clone()).unwrap(),
            )
        })
        .collect()
}

fn classes(v: &serde_json::Value) -> Vec<String> {
    serde_json::from_value(v["classes"].clone()).unwrap()
}

#[test]
fn split_folders_at_the_top_are_the_datasets_own_splits() {
    let t = tempfile::tempdir().unwrap();
    let imgs = tree(
        &t.path().join("imgs"),
        &[
            ("train", "cat", 6),
            ("train", "dog", 5),
            ("val", "cat", 3),
            ("val", "dog", 2),
            // A class seen in one split only.
            ("val", "bird", 1),
        ],
    );
    let out = t.path().join("out");
    let o = run(&["convert", s(&imgs), "-o", s(&out)], 0);
    let line = stdout(&o);
    assert!(
        line.contains("splits from folders: train 11, val/ -> test 6"),
        "{line}"
    );
    assert!(stderr(&o).contains("val/ -> test"), "{}", stderr(&o));
    let v = inspect(&out);
    assert_eq!(classes(&v), ["bird", "cat", "dog"]);
    assert_eq!(
        splits(&v),
        [
            ("test".to_string(), vec![1, 3, 2]),
            ("train".to_string(), vec![0, 6, 5])
        ]
    );
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    let src = &m["provenance"]["source"];
    assert_eq!(src["split_key"], "folders", "{src}");
    assert_eq!(src["split_folders"]["val"], "test", "{src}");

    // Any case; with a test/ folder too, val/ keeps its name and test/ is the test split.
    let three = tree(
        &t.path().join("three"),
        &[
            ("Train", "a", 3),
            ("Train", "b", 3),
            ("VALID", "a", 2),
            ("test", "b", 1),
        ],
    );
    let out3 = t.path().join("out3");
    run(&["convert", s(&three), "-o", s(&out3), "--quiet"], 0);
    let v = inspect(&out3);
    assert_eq!(classes(&v), ["a", "b"]);
    assert_eq!(
        splits(&v),
        [
            ("test".to_string(), vec![0, 1]),
            ("train".to_string(), vec![3, 3]),
            ("val".to_string(), vec![2, 0])
        ]
    );

    // The held-out folder is what `prep train` evaluates on.
    let run_dir = t.path().join("run");
    let o = run(
        &[
            "train",
            s(&out),
            "--device",
            "cpu",
            "--epochs",
            "1",
            "--batch",
            "4",
            "-o",
            s(&run_dir),
            "--json",
        ],
        0,
    );
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let confusion: Vec<Vec<u64>> = serde_json::from_value(summary["confusion"].clone()).unwrap();
    assert_eq!(confusion.iter().flatten().sum::<u64>(), 6, "{summary}");
}

#[test]
fn split_folders_that_do_not_add_up_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let base = [
        ("train", "cat", 2),
        ("train", "dog", 2),
        ("val", "cat", 1),
        ("val", "dog", 1),
    ];
    let case = |name: &str, extra: &dyn Fn(&Path), args: &[&str], want: &[&str]| {
        let imgs = tree(&t.path().join(name), &base);
        extra(&imgs);
        let out = t.path().join(format!("{name}-out"));
        let mut a = vec!["convert", s(&imgs), "-o", s(&out)];
        a.extend_from_slice(args);
        let o = run(&a, 2);
        for w in want {
            assert!(stderr(&o).contains(w), "{name}: {w}\n{}", stderr(&o));
        }
        assert!(!out.join("manifest.json").exists(), "{name}");
    };
    // The dataset says its split: no fraction drawn by hash.
    case(
        "fraction",
        &|_| {},
        &["--test-fraction", "0.2"],
        &["--test-fraction 0.2", "train/", "val/"],
    );
    // A loose file next to the split folders, as next to class folders.
    case(
        "loose",
        &|p| png(&p.join("stray.png"), 1),
        &[],
        &["stray.png", "classes are unclear"],
    );
    // A file in a split folder but in no class folder.
    case(
        "direct",
        &|p| png(&p.join("val/stray.png"), 1),
        &[],
        &["val/stray.png", "split folder val/"],
    );
    // Two held-out folders of one kind.
    case(
        "twice",
        &|p| png(&p.join("validation/cat/0.png"), 1),
        &[],
        &["val/ and validation/"],
    );
}

#[test]
fn labels_and_label_from_keep_the_split_folders() {
    let t = tempfile::tempdir().unwrap();
    let imgs = tree(
        &t.path().join("imgs"),
        &[
            ("train", "cat", 4),
            ("train", "dog", 3),
            ("val", "cat", 2),
            ("val", "dog", 1),
        ],
    );
    let out = t.path().join("re");
    run(
        &[
            "convert",
            s(&imgs),
            "-o",
            s(&out),
            "--label-from",
            "^[^/]+/([^/]+)/",
            "--quiet",
        ],
        0,
    );
    let v = inspect(&out);
    assert_eq!(classes(&v), ["cat", "dog"]);
    assert_eq!(
        splits(&v),
        [
            ("test".to_string(), vec![2, 1]),
            ("train".to_string(), vec![4, 3])
        ]
    );

    // A CSV naming other classes: its labels, the folders' splits.
    let mut csv = String::from("path,label\n");
    for (split, class, n) in [("train", "cat", 4), ("train", "dog", 3), ("val", "cat", 2)] {
        for i in 0..n {
            let label = if class == "cat" { "small" } else { "big" };
            csv.push_str(&format!("{split}/{class}/{i}.png,{label}\n"));
        }
    }
    let labels = t.path().join("labels.csv");
    std::fs::write(&labels, csv).unwrap();
    let out = t.path().join("csv");
    run(
        &[
            "convert",
            s(&imgs),
            "-o",
            s(&out),
            "--labels",
            s(&labels),
            "--quiet",
        ],
        0,
    );
    let v = inspect(&out);
    assert_eq!(classes(&v), ["big", "small"]);
    assert_eq!(
        splits(&v),
        [
            ("test".to_string(), vec![0, 2]),
            ("train".to_string(), vec![3, 4])
        ]
    );
}

#[test]
fn a_lone_train_folder_gives_its_classes_and_a_hashed_test_split() {
    let t = tempfile::tempdir().unwrap();
    let imgs = tree(
        &t.path().join("imgs"),
        &[("train", "cat", 10), ("train", "dog", 10)],
    );
    let out = t.path().join("out");
    let o = run(
        &["convert", s(&imgs), "-o", s(&out), "--test-fraction", "0.5"],
        0,
    );
    assert!(
        stderr(&o).contains("train/ is the only folder"),
        "{}",
        stderr(&o)
    );
    let v = inspect(&out);
    assert_eq!(classes(&v), ["cat", "dog"]);
    let sp = splits(&v);
    assert_eq!(sp.len(), 2, "{sp:?}");
    let total: u64 = sp.iter().flat_map(|(_, c)| c).sum();
    assert_eq!(total, 20);
}

/// A one-epoch CPU run of a small dataset, at batch 128.
pub(crate) fn trained(dir: &Path) -> (PathBuf, PathBuf) {
    let ds = dir.join("ds");
    run(
        &[
            "synth",
            "--train",
            "1000",
            "--test",
            "200",
            "--shape",
            "1x8x8",
            "--classes",
            "3",
            "-o",
            s(&ds),
            "--quiet",
        ],
        0,
    );
    let r = dir.join("run");
    run(
        &[
            "train",
            s(&ds),
            "--epochs",
            "1",
            "--batch",
            "128",
            "--device",
            "cpu",
            "-o",
            s(&r),
            "--quiet",
        ],
        0,
    );
    (ds, r)
}

#[test]
fn resume_refuses_flags_that_differ_from_the_run_by_name() {
    let t = tempfile::tempdir().unwrap();
    let (ds, r) = trained(t.path());
    let ckpt = std::fs::read(r.join("checkpoint.safetensors")).unwrap();
    let config = std::fs::read(r.join("config.json")).unwrap();
    let o = run(
        &[
            "train",
            s(&ds),
            "--resume",
            s(&r),
            "--batch",
            "64",
            "--lr",
            "0.01",
            "--model",
            "resnet18",
            "--seed",
            "4",
        ],
        2,
    );
    let e = stderr(&o);
    for want in [
        "--batch 64 differs from the run's 128",
        "--lr 0.01 differs from the run's 1.2",
        "--model resnet18 differs from the run's small",
        "--seed 4 differs from the run's 0",
        "a resumed run keeps its settings",
    ] {
        assert!(e.contains(want), "{want}\n{e}");
    }
    // Fewer epochs than the run's is no extension either.
    let o = run(
        &["train", "--resume", s(&r), "--epochs", "3", "--no-augment"],
        2,
    );
    assert!(
        stderr(&o).contains("--no-augment differs"),
        "{}",
        stderr(&o)
    );
    // The run is left as it was.
    assert_eq!(
        std::fs::read(r.join("checkpoint.safetensors")).unwrap(),
        ckpt
    );
    assert_eq!(std::fs::read(r.join("config.json")).unwrap(), config);
    // Flags with the run's own values are no conflict.
    run(
        &[
            "train",
            "--resume",
            s(&r),
            "--batch",
            "128",
            "--epochs",
            "1",
            "--device",
            "cpu",
            "--quiet",
        ],
        0,
    );
}

#[test]
fn resume_with_more_epochs_extends_the_run() {
    let t = tempfile::tempdir().unwrap();
    let (ds, r) = trained(t.path());
    let o = run(
        &[
            "train",
            s(&ds),
            "--resume",
            s(&r),
            "--epochs",
            "3",
            "--json",
        ],
        0,
    );
    assert!(
        stderr(&o).contains(&format!("extending {} from 1 to 3 epochs", s(&r))),
        "{}",
        stderr(&o)
    );
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["epochs"], 3);
    let metrics = std::fs::read_to_string(r.join("metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 3, "{metrics}");
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(r.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["epochs"], 3);
    // Fewer than the run's epochs now is refused; as many is the finished run again.
    let o = run(&["train", "--resume", s(&r), "--epochs", "2"], 2);
    assert!(
        stderr(&o).contains("--epochs 2 is fewer than the run's 3"),
        "{}",
        stderr(&o)
    );
    let o = run(&["train", "--resume", s(&r), "--json"], 0);
    let again: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(again["test_accuracy"], summary["test_accuracy"]);
    assert!(stderr(&o).contains("is finished (3 of 3 epochs)"));
}

#[test]
fn resume_refuses_another_dataset_and_takes_the_same_one_moved() {
    let t = tempfile::tempdir().unwrap();
    let (ds, r) = trained(t.path());
    let other = t.path().join("other");
    run(
        &[
            "synth",
            "--train",
            "1000",
            "--test",
            "200",
            "--shape",
            "1x8x8",
            "--classes",
            "3",
            "--seed",
            "9",
            "-o",
            s(&other),
            "--quiet",
        ],
        0,
    );
    let o = run(&["train", s(&other), "--resume", s(&r), "--epochs", "2"], 2);
    let e = stderr(&o);
    assert!(
        e.contains(&format!(
            "{} is not the dataset {} was trained on ({})",
            s(&other),
            s(&r),
            s(&ds)
        )),
        "{e}"
    );
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(r.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["epochs"], 1, "a refused extension leaves the config");
    // The same dataset in another folder is the same data.
    let moved = t.path().join("moved");
    std::fs::rename(&ds, &moved).unwrap();
    let o = run(
        &[
            "train",
            s(&moved),
            "--resume",
            s(&r),
            "--epochs",
            "2",
            "--quiet",
            "--json",
        ],
        0,
    );
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["epochs"], 2);
}

#[test]
fn shapes_written_channels_last_are_refused_with_the_shape_to_write() {
    let t = tempfile::tempdir().unwrap();
    let ds = small_dataset(t.path(), &[]);
    let out = t.path().join("x");
    for args in [
        vec![
            "synth",
            "--train",
            "10",
            "--shape",
            "32x32x3",
            "-o",
            s(&out),
        ],
        vec!["plan", "--train", "10", "--shape", "32x32x3"],
        vec!["convert", s(&ds), "-o", s(&out), "--shape", "32x32x3"],
        vec!["train", s(&ds), "-o", s(&out), "--shape", "32x32x3"],
    ] {
        let o = run(&args, 2);
        let e = stderr(&o);
        assert!(
            e.contains("--shape") && e.contains("HxWxC") && e.contains("--shape 3x32x32"),
            "{args:?}\n{e}"
        );
        assert!(!out.exists(), "{args:?} wrote something");
    }
    let o = run(&["plan", "--train", "10", "--shape", "28x28x1"], 2);
    assert!(stderr(&o).contains("--shape 1x28x28"), "{}", stderr(&o));
    // Channels first, and shapes that are not clearly channels last, are as before.
    for shape in ["3x32x32", "1x28x28", "4x4x3", "16x8x8"] {
        let d = t.path().join(format!("s{shape}"));
        run(
            &[
                "synth",
                "--train",
                "4",
                "--test",
                "0",
                "--shape",
                shape,
                "-o",
                s(&d),
                "--quiet",
            ],
            0,
        );
    }
}

/// `prep ARGS` with stdout a pipe nobody reads (its reading end closed before prep starts):
/// every write to it fails with EPIPE.
fn into_closed_pipe(args: &[&str]) -> std::process::Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    prep()
        .args(args)
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn a_closed_stdout_ends_prep_quietly_by_sigpipe() {
    use std::os::unix::process::ExitStatusExt;
    let t = tempfile::tempdir().unwrap();
    let ds = small_dataset(t.path(), &[]);
    let conv = t.path().join("conv");
    for args in [
        vec!["inspect", s(&ds)],
        vec!["inspect", s(&ds), "--json"],
        vec!["plan", "--train", "1000"],
        vec!["verify", s(&ds)],
        vec!["convert", s(&ds), "-o", s(&conv)],
    ] {
        let o = into_closed_pipe(&args);
        assert_eq!(
            o.status.signal(),
            Some(libc::SIGPIPE),
            "{args:?}: {:?}\n{}",
            o.status,
            stderr(&o)
        );
        assert!(!stderr(&o).contains("panicked"), "{args:?}: {}", stderr(&o));
        assert!(
            !stderr(&o).contains("Broken pipe"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    // The conversion was complete before its summary line found the pipe closed.
    run(&["verify", s(&conv), "--quiet"], 0);

    // As a shell pipeline: head takes its lines and prep ends without a word, by SIGPIPE
    // (141) when it still had lines to write, else normally.
    let o = std::process::Command::new("bash")
        .arg("-c")
        .arg(r#""$0" inspect "$1" | head -1; echo "status ${PIPESTATUS[0]}" >&2"#)
        .arg(env!("CARGO_BIN_EXE_prep"))
        .arg(&ds)
        .output()
        .unwrap();
    let e = stderr(&o);
    assert!(!e.contains("panicked"), "{e}");
    assert!(e.contains("status 141") || e.contains("status 0"), "{e}");
    assert_eq!(stdout(&o).lines().count(), 1);
}

#[test]
fn counts_take_suffixes_and_exponents() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("ds");
    run(
        &[
            "synth",
            "--train",
            "2k",
            "--test",
            "1e2",
            "--shape",
            "1x4x4",
            "--block-samples",
            "1k",
            "-o",
            s(&out),
            "--quiet",
        ],
        0,
    );
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["splits"]["train"]["samples"], 2000);
    assert_eq!(m["splits"]["test"]["samples"], 100);
    assert_eq!(m["block_samples"], 1000);
    let o = run(&["plan", "--train", "1.5M", "--test", "10k", "--json"], 0);
    let p = stdout(&o);
    assert!(p.contains("1500000") || p.contains("1,500,000"), "{p}");

    for (flag, value, want) in [
        ("--train", "1.5", "not a whole number"),
        ("--test", "10x", "60k"),
        ("--train", "1Ki", "binary"),
        ("--train", "2T", "is not in 0..=1000000000000"),
    ] {
        let o = run(&["synth", flag, value], 2);
        let e = stderr(&o);
        assert!(e.contains(flag) && e.contains(want), "{flag} {value}\n{e}");
        assert!(!e.contains("invalid digit"), "{e}");
    }
}

#[test]
fn size_of_one_number_is_a_square() {
    let t = tempfile::tempdir().unwrap();
    let one = t.path().join("flowers");
    for i in 0..2 {
        png(&one.join(format!("{i}.png")), i);
    }
    let out = t.path().join("out");
    run(
        &["convert", s(&one), "-o", s(&out), "--size", "4", "--quiet"],
        0,
    );
    assert_eq!(inspect(&out)["shape"], serde_json::json!([3, 4, 4]));
    let o = run(
        &[
            "convert",
            s(&one),
            "-o",
            s(&out),
            "--size",
            "4x4x3",
            "--force",
        ],
        2,
    );
    assert!(stderr(&o).contains("--size 4x4x3"), "{}", stderr(&o));
}
