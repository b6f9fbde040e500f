//! A newcomer's first hour (issue 25, part B): errors that name the mistake (a typo, a file for
//! its folder, arguments swapped, OUT forgotten) with one exit code for usage (2), a rerun of
//! `convert` that has nothing to do, a synth that says what differs, and no NaN anywhere.

use crate::newcomer::{s, trained};
use crate::util::*;
use std::path::Path;

fn tiny(dir: &Path, name: &str, extra: &[&str]) -> std::path::PathBuf {
    let out = dir.join(name);
    let mut args = vec![
        "synth",
        "--train",
        "300",
        "--test",
        "60",
        "--shape",
        "1x8x8",
        "--classes",
        "3",
        "-o",
    ];
    args.push(s(&out));
    args.push("--quiet");
    args.extend_from_slice(extra);
    run(&args, 0);
    out
}

#[test]
fn a_mistyped_dataset_is_said_not_to_exist_with_the_name_meant() {
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path(), "fmnist", &[]);
    let typo = t.path().join("fmist");
    for cmd in ["inspect", "verify"] {
        let e = stderr(&run(&[cmd, s(&typo)], 2));
        assert!(
            e.contains("fmist/ does not exist")
                && e.contains("did you mean")
                && e.contains("fmnist/?"),
            "{cmd}: {e}"
        );
        assert!(
            !e.contains("DAMAGED") && !e.contains("No such file"),
            "{cmd}: {e}"
        );
    }
    let e = stderr(&run(&["train", s(&typo), "--device", "cpu"], 2));
    assert!(e.contains("fmist/ does not exist"), "{e}");
    // The manifest given for its folder.
    let e = stderr(&run(&["inspect", s(&ds.join("manifest.json"))], 2));
    assert!(
        e.contains("is a dataset's manifest; give the dataset's folder"),
        "{e}"
    );
    assert!(!e.contains("manifest.json/manifest.json"), "{e}");
    // A folder that is no dataset.
    std::fs::create_dir(t.path().join("empty")).unwrap();
    let e = stderr(&run(&["verify", s(&t.path().join("empty"))], 2));
    assert!(e.contains("is not a prep dataset"), "{e}");
}

#[test]
fn eval_with_its_arguments_swapped_says_so() {
    let t = tempfile::tempdir().unwrap();
    let (ds, r) = trained(t.path());
    let e = stderr(&run(&["eval", s(&ds), s(&r)], 2));
    assert!(e.contains("eval takes RUN then DATA"), "{e}");
    assert!(!e.contains("config.json"), "{e}");
    // A dataset where the run goes, the data right: the same hint.
    let e = stderr(&run(&["eval", s(&ds), s(&ds)], 2));
    assert!(e.contains("is a dataset, not a run folder"), "{e}");
    // A run folder given to train as its data.
    let e = stderr(&run(&["train", s(&r), "--device", "cpu"], 2));
    assert!(e.contains("is a run folder, not a dataset"), "{e}");
    // Missing inputs are usage errors (2) everywhere.
    let gone = t.path().join("gone");
    run(&["eval", s(&r), s(&gone)], 2);
    run(&["eval", s(&gone), s(&ds)], 2);
    run(&["convert", s(&gone), "--out", s(&t.path().join("o"))], 2);
    run(&["merge", s(&t.path().join("m")), s(&gone), s(&gone)], 2);
}

#[test]
fn eval_names_the_split_and_compares_only_the_test_split() {
    let t = tempfile::tempdir().unwrap();
    let (ds, r) = trained(t.path());
    let o = stdout(&run(&["eval", s(&r), s(&ds), "--split", "train"], 0));
    assert!(o.contains("split train: accuracy"), "{o}");
    assert!(!o.contains("summary.json"), "{o}");
    let o = stdout(&run(&["eval", s(&r), s(&ds)], 0));
    assert!(o.contains("split test: accuracy"), "{o}");
    assert!(o.contains("summary.json's test accuracy"), "{o}");
    let j: serde_json::Value = serde_json::from_slice(
        &run(&["eval", s(&r), s(&ds), "--split", "train", "--json"], 0).stdout,
    )
    .unwrap();
    assert_eq!(j["split"], "train");
}

#[test]
fn merge_with_out_forgotten_says_which_argument_was_taken_for_out() {
    let t = tempfile::tempdir().unwrap();
    let a = tiny(t.path(), "s", &[]);
    let b = tiny(t.path(), "s1", &["--seed", "2"]);
    let e = stderr(&run(&["merge", s(&a), s(&b)], 2));
    assert!(
        e.contains("already holds a dataset, and merge writes into its first argument"),
        "{e}"
    );
    assert!(!e.contains("missing part"), "{e}");
}

#[test]
fn synth_into_another_dataset_says_what_differs() {
    let t = tempfile::tempdir().unwrap();
    let out = tiny(t.path(), "s", &[]);
    let mut args = vec![
        "synth",
        "--train",
        "500",
        "--test",
        "60",
        "--shape",
        "1x8x8",
        "--classes",
        "3",
        "-o",
    ];
    args.push(s(&out));
    args.extend_from_slice(&["--seed", "9"]);
    let e = stderr(&run(&args, 2));
    assert!(
        e.contains("train: 300 there, 500 asked") && e.contains("seed:"),
        "{e}"
    );
}

#[test]
fn convert_rerun_into_its_own_output_has_nothing_to_do() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("imgs");
    for c in ["cat", "dog"] {
        for i in 0..6u8 {
            let p = src.join(c).join(format!("{i}.png"));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            image::GrayImage::from_pixel(6, 6, image::Luma([i * 30]))
                .save(&p)
                .unwrap();
        }
    }
    let out = t.path().join("out");
    let args = ["convert", s(&src), "--out", s(&out)];
    run(&args, 0);
    let before = files(&out);
    let stamp = std::fs::metadata(out.join("manifest.json"))
        .unwrap()
        .modified()
        .unwrap();
    let o = stdout(&run(&args, 0));
    assert!(o.contains("nothing to do"), "{o}");
    assert_eq!(files(&out), before);
    assert_eq!(
        std::fs::metadata(out.join("manifest.json"))
            .unwrap()
            .modified()
            .unwrap(),
        stamp
    );
    // --json says so too.
    let j: serde_json::Value =
        serde_json::from_slice(&run(&[&args[..], &["--json"]].concat(), 0).stdout).unwrap();
    assert_eq!(j["already_complete"], true);
    // Other settings, or a changed input, are not a rerun: refused without --force.
    let e = stderr(&run(&[&args[..], &["--size", "4"]].concat(), 2));
    assert!(e.contains("not empty"), "{e}");
    image::GrayImage::from_pixel(6, 6, image::Luma([7]))
        .save(src.join("cat").join("new.png"))
        .unwrap();
    let e = stderr(&run(&args, 2));
    assert!(e.contains("not empty"), "{e}");
    // A damaged output is not "nothing to do" either.
    run(&[&args[..], &["--force"]].concat(), 0);
    let shard = files(&out)
        .into_iter()
        .find(|(n, _)| n.ends_with(".shard"))
        .unwrap()
        .0;
    std::fs::remove_file(out.join(shard)).unwrap();
    let e = stderr(&run(&args, 2));
    assert!(e.contains("not empty"), "{e}");
}

#[test]
fn a_dataset_without_a_test_split_trains_without_nan() {
    let t = tempfile::tempdir().unwrap();
    let ds = t.path().join("notest");
    run(
        &[
            "synth",
            "--train",
            "300",
            "--test",
            "0",
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
    let r = t.path().join("run");
    let o = run(
        &[
            "train",
            s(&ds),
            "--epochs",
            "1",
            "--batch",
            "64",
            "--device",
            "cpu",
            "-o",
            s(&r),
        ],
        0,
    );
    let all = format!("{}{}", stdout(&o), stderr(&o));
    assert!(!all.contains("NaN"), "{all}");
    assert!(all.contains("has no test split"), "{all}");
    assert!(all.contains("no test split after 1 epochs"), "{all}");
    let summary = std::fs::read_to_string(r.join("summary.json")).unwrap();
    assert!(!summary.contains("NaN"), "{summary}");
}
