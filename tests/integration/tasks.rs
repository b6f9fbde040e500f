//! `prep train` on every target (issue 29), on the CPU reference backend: segmentation with the
//! U-Net, multi-label and regression on `prep synth --task` data, the task chosen by the data,
//! scores in metrics.jsonl, summary.json and `prep eval`, and resuming bit-exact.

use crate::util::*;
use std::path::{Path, PathBuf};

/// `synth --task TASK` of `train` + 256 test samples of `shape`, 3 classes, blocks of 128, with
/// `extra` flags.
fn synth_with(
    dir: &Path,
    name: &str,
    task: &str,
    shape: &str,
    train: &str,
    extra: &[&str],
) -> PathBuf {
    let out = dir.join(name);
    let mut args = vec![
        "synth",
        "--task",
        task,
        "--train",
        train,
        "--test",
        "256",
        "--shape",
        shape,
        "--classes",
        "3",
        "--seed",
        "3",
        "--block-samples",
        "128",
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ];
    args.extend_from_slice(extra);
    run(&args, 0);
    out
}

fn synth(dir: &Path, name: &str, task: &str, shape: &str, train: &str) -> PathBuf {
    synth_with(dir, name, task, shape, train, &[])
}

fn train(ds: &Path, out: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "train",
        ds.to_str().unwrap(),
        "--device",
        "cpu",
        "--out",
        out.to_str().unwrap(),
        "--quiet",
        "--json",
    ];
    args.extend_from_slice(extra);
    let o = run(&args, 0);
    serde_json::from_slice(&o.stdout).unwrap()
}

fn metrics(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Eval of a run on its test split reproduces summary.json's score exactly.
fn eval_matches(run_dir: &Path, ds: &Path, s: &serde_json::Value) {
    let o = run(
        &[
            "eval",
            run_dir.to_str().unwrap(),
            ds.to_str().unwrap(),
            "--json",
        ],
        0,
    );
    let e: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(e["score_name"], s["test_score_name"], "{e}");
    assert_eq!(
        e["score"], s["test_score"],
        "prep eval must reproduce summary.json: {e}"
    );
    assert_eq!(e["loss"], s["test_loss"], "{e}");
}

/// Segmentation on the CPU: synthetic discs (mask = class + 1 where the pattern shows) at 1x32x32,
/// a U-Net of width 8. The bar (mean foreground Dice >= 0.75 after 6 epochs of 1536; 0.843
/// measured) is a CI-sized one: the full-size GPU runs of BENCHMARKS.md reach 0.9.
#[test]
fn segmentation_trains_a_unet_and_scores_dice() {
    let t = tempfile::tempdir().unwrap();
    let ds = synth(t.path(), "m", "mask", "1x32x32", "1536");
    let run_dir = t.path().join("run");
    let s = train(
        &ds,
        &run_dir,
        &["--epochs", "6", "--batch", "32", "--width", "8"],
    );
    assert_eq!(s["task"], "mask", "{s}");
    assert_eq!(s["test_score_name"], "mean Dice");
    let dice = s["test_score"].as_f64().unwrap();
    assert!(dice >= 0.75, "mean foreground Dice {dice}: {s}");
    let names = s["classes"].as_array().unwrap();
    assert_eq!(
        (names.len(), &names[0]),
        (4, &serde_json::json!("background")),
        "{s}"
    );
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(cfg["model"]["name"], "unet", "the task picks the model");
    let m = metrics(&run_dir);
    assert_eq!(m.len(), 6);
    assert!(m.iter().all(|l| l["test_score"].is_number()), "{m:?}");
    assert!(m[5]["test_score"].as_f64() > m[0]["test_score"].as_f64());
    for f in [
        "summary.json",
        "curves.png",
        "masks.png",
        "checkpoint.safetensors",
    ] {
        assert!(run_dir.join(f).is_file(), "{f} missing");
    }
    assert!(!run_dir.join("confusion.png").exists());
    eval_matches(&run_dir, &ds, &s);
}

/// Multi-label: which of 6 pattern kinds are drawn, `small` with a linear head of 6 and BCE.
/// Without distractors (`--difficulty 0`) one label is set, that of the class: mAP over the
/// labels that occur >= 0.8 on the CPU. (With distractors, the kinds drawn only as small
/// distractors need far more training: 0.1 AP after these 4 epochs.)
#[test]
fn multilabel_trains_with_bce_and_scores_map() {
    let t = tempfile::tempdir().unwrap();
    let ds = synth_with(
        t.path(),
        "l",
        "labels",
        "3x16x16",
        "2048",
        &["--difficulty", "0"],
    );
    let run_dir = t.path().join("run");
    let s = train(&ds, &run_dir, &["--epochs", "4", "--batch", "64"]);
    assert_eq!(s["task"], "labels", "{s}");
    assert_eq!(s["test_score_name"], "mAP");
    let map = s["test_score"].as_f64().unwrap();
    assert!(map >= 0.8, "mAP {map}: {s}");
    eval_matches(&run_dir, &ds, &s);
}

/// Regression: the pattern disc's area share (and the number of distractors, constant 0 without
/// them), standardised from the manifest's statistics; R2 on the test split in the values' units
/// (the constant one has none). 0.41 was measured after these 4 epochs: the bar is 0.3.
#[test]
fn regression_trains_and_scores_r2() {
    let t = tempfile::tempdir().unwrap();
    let ds = synth_with(
        t.path(),
        "v",
        "values",
        "1x16x16",
        "2048",
        &["--difficulty", "0"],
    );
    let run_dir = t.path().join("run");
    let s = train(&ds, &run_dir, &["--epochs", "4", "--batch", "64"]);
    assert_eq!(s["task"], "values", "{s}");
    assert_eq!(s["test_score_name"], "R2");
    let r2 = s["test_score"].as_f64().unwrap();
    assert!(r2 >= 0.3, "R2 {r2}: {s}");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(cfg["task"]["value_mean"].as_array().unwrap().len(), 2);
    eval_matches(&run_dir, &ds, &s);
    // smooth L1 trains too.
    let s = train(
        &ds,
        &t.path().join("l1"),
        &["--epochs", "2", "--batch", "64", "--loss", "smooth-l1"],
    );
    assert!(s["test_score"].as_f64().unwrap() > 0.0, "{s}");
}

/// A model that cannot learn the task, a task the data does not have and a loss that does not
/// apply are refused before anything is written, each saying what would work.
#[test]
fn tasks_and_models_that_do_not_fit_are_refused_clearly() {
    let t = tempfile::tempdir().unwrap();
    let ds = synth(t.path(), "m", "mask", "1x16x16", "256");
    let cases: [(&[&str], &str); 5] = [
        (&["--model", "small"], "needs a per-pixel one: --model unet"),
        (
            &["--task", "values"],
            "has no such field to train on; it has: class, mask (mask)",
        ),
        (&["--loss", "mse"], "--loss mse applies to a values task"),
        (
            &["--task", "class", "--model", "small", "--width", "8"],
            "--width sets the U-Net's channels",
        ),
        (
            &["--task", "class", "--model", "unet"],
            "--model unet gives a per-pixel output",
        ),
    ];
    for (i, (extra, want)) in cases.iter().enumerate() {
        let out = t.path().join(format!("r{i}"));
        let mut args = vec![
            "train",
            ds.to_str().unwrap(),
            "--device",
            "cpu",
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let o = run(&args, 2);
        assert!(stderr(&o).contains(want), "{extra:?}: {}", stderr(&o));
        assert!(
            !out.join("config.json").exists(),
            "{extra:?} left a run behind"
        );
    }
    // The class of a mask dataset is still there to learn when asked for.
    let s = train(
        &ds,
        &t.path().join("class"),
        &["--task", "class", "--epochs", "1", "--batch", "64"],
    );
    assert_eq!(s["task"], "class", "{s}");
    assert!(s["test_accuracy"].is_number());
}

/// A U-Net run stopped after some steps and resumed ends with the same weights and figures as
/// one that ran through (masks augmented by the same crops and flips as their images).
#[test]
fn a_stopped_segmentation_run_resumes_bit_exact() {
    let t = tempfile::tempdir().unwrap();
    let ds = synth(t.path(), "m", "mask", "1x16x16", "512");
    let args = |out: &Path| -> Vec<String> {
        [
            "train",
            ds.to_str().unwrap(),
            "--device",
            "cpu",
            "--epochs",
            "2",
            "--batch",
            "32",
            "--width",
            "4",
            "--checkpoint-every",
            "3",
            "--quiet",
            "--out",
            out.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let clean = t.path().join("clean");
    run(
        &args(&clean).iter().map(String::as_str).collect::<Vec<_>>(),
        0,
    );
    let stopped = t.path().join("stopped");
    let mut a = args(&stopped);
    a.extend(["--stop-after".to_string(), "5".to_string()]);
    run(&a.iter().map(String::as_str).collect::<Vec<_>>(), 0);
    assert!(!stopped.join("summary.json").exists());
    run(
        &["train", "--resume", stopped.to_str().unwrap(), "--quiet"],
        0,
    );
    let load = |d: &Path| {
        prep::train::checkpoint::load(&d.join("checkpoint.safetensors"))
            .unwrap()
            .0
    };
    for ((na, va), (nb, vb)) in load(&clean).iter().zip(&load(&stopped)) {
        assert_eq!(na, nb);
        assert!(
            va.iter().zip(vb).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{na} differs after resume"
        );
    }
    let score = |d: &Path| -> Vec<serde_json::Value> {
        metrics(d).iter().map(|l| l["test_score"].clone()).collect()
    };
    assert_eq!(score(&clean), score(&stopped));
}
