//! `prep train` and `prep eval` on the CPU reference backend.

use crate::util::*;
use prep::format::shard::{Dataset, ShardReader};
use std::path::Path;
use std::time::{Duration, Instant};

fn dataset(dir: &Path, train: &str) -> String {
    let out = dir.join("ds");
    run(
        &[
            "synth",
            "--train",
            train,
            "--test",
            "512",
            "--shape",
            "3x16x16",
            "--classes",
            "4",
            "--seed",
            "1",
            "--block-samples",
            "256",
            "--out",
            out.to_str().unwrap(),
            "--quiet",
        ],
        0,
    );
    out.to_str().unwrap().to_string()
}

fn tensors(run: &Path) -> Vec<(String, Vec<f32>)> {
    prep::train::checkpoint::load(&run.join("checkpoint.safetensors"))
        .unwrap()
        .0
}

#[test]
fn trains_writes_every_output_and_eval_reproduces_the_accuracy() {
    let t = tempfile::tempdir().unwrap();
    let ds = dataset(t.path(), "3072");
    let run_dir = t.path().join("run");
    let o = run(
        &[
            "train",
            &ds,
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
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let acc = s["test_accuracy"].as_f64().unwrap();
    assert!(acc > 0.6, "4 learnable classes: test accuracy {acc}");
    for f in [
        "checkpoint.safetensors",
        "config.json",
        "metrics.jsonl",
        "summary.json",
        "curves.png",
        "confusion.png",
        "confusion.csv",
    ] {
        assert!(run_dir.join(f).is_file(), "{f} missing");
    }
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    for k in [
        "epoch",
        "train_loss",
        "train_accuracy",
        "test_accuracy",
        "samples_per_sec",
        "seconds",
        "host_rss_bytes",
    ] {
        assert!(lines[2][k].is_number(), "metrics.jsonl lacks {k}");
    }
    assert!(lines[2]["train_loss"].as_f64() < lines[0]["train_loss"].as_f64());
    for k in [
        "test_accuracy",
        "samples_per_sec",
        "seconds",
        "peak_rss_bytes",
    ] {
        assert!(s[k].is_number(), "summary.json lacks {k}");
    }
    let confusion: Vec<Vec<u64>> = serde_json::from_value(s["confusion"].clone()).unwrap();
    assert_eq!(confusion.iter().flatten().sum::<u64>(), 512);
    let o = run(&["eval", run_dir.to_str().unwrap(), &ds, "--json"], 0);
    let e: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        e["accuracy"].as_f64().unwrap(),
        acc,
        "prep eval must reproduce summary.json exactly"
    );
    // A finished run is not overwritten.
    let o = run(
        &[
            "train",
            &ds,
            "--device",
            "cpu",
            "--out",
            run_dir.to_str().unwrap(),
        ],
        2,
    );
    assert!(stderr(&o).contains("--resume"), "{}", stderr(&o));
}

#[test]
fn killed_mid_epoch_and_resumed_gives_bit_identical_weights() {
    let t = tempfile::tempdir().unwrap();
    let ds = dataset(t.path(), "4096");
    let args = |out: &Path| -> Vec<String> {
        [
            "train",
            &ds,
            "--device",
            "cpu",
            "--epochs",
            "2",
            "--batch",
            "64",
            "--lr",
            "0.2",
            "--checkpoint-every",
            "4",
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

    let killed = t.path().join("killed");
    let mut child = prep().args(args(&killed)).spawn().unwrap();
    let t0 = Instant::now();
    // Kill once a mid-epoch checkpoint of the first epoch exists (cursor: epoch 0, batch >= 12).
    loop {
        let cur = prep::train::checkpoint::load(&killed.join("checkpoint.safetensors"))
            .ok()
            .map(|c| c.1);
        if let Some(c) = cur {
            if c.epoch == 0 && c.batch >= 12 {
                break;
            }
            assert!(
                c.epoch == 0,
                "the run got past epoch 1 before it could be killed: {c:?}"
            );
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no checkpoint appeared"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(!killed.join("summary.json").exists());
    run(
        &["train", "--resume", killed.to_str().unwrap(), "--quiet"],
        0,
    );
    let (a, b) = (tensors(&clean), tensors(&killed));
    assert_eq!(a.len(), b.len());
    for ((na, va), (nb, vb)) in a.iter().zip(&b) {
        assert_eq!(na, nb);
        assert!(
            va.iter().zip(vb).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{na} differs after resume"
        );
    }
    let ma = std::fs::read_to_string(clean.join("metrics.jsonl")).unwrap();
    let mb = std::fs::read_to_string(killed.join("metrics.jsonl")).unwrap();
    let acc = |m: &str| {
        m.lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["test_accuracy"]
                    .as_f64()
                    .unwrap()
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(acc(&ma), acc(&mb));
}

#[test]
fn a_damaged_block_stops_training_naming_shard_and_block() {
    let t = tempfile::tempdir().unwrap();
    let ds = dataset(t.path(), "2048");
    let m = Dataset::open(&ds).unwrap().manifest;
    let shard = &m.splits["train"].shards[0].file;
    let p = Path::new(&ds).join(shard);
    let e = *ShardReader::open(&p).unwrap().entry(3);
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[(e.offset + e.stored_len / 3) as usize] ^= 0x10;
    std::fs::write(&p, bytes).unwrap();
    let run_dir = t.path().join("run");
    let o = run(
        &[
            "train",
            &ds,
            "--device",
            "cpu",
            "--epochs",
            "1",
            "--batch",
            "64",
            "--out",
            run_dir.to_str().unwrap(),
            "--quiet",
        ],
        1,
    );
    let err = stderr(&o);
    assert!(
        err.contains(shard.as_str()) && err.contains("block 3") && err.contains("checksum"),
        "{err}"
    );
    // With --skip-damaged the run completes and says what it skipped.
    let run2 = t.path().join("run2");
    let o = run(
        &[
            "train",
            &ds,
            "--device",
            "cpu",
            "--epochs",
            "1",
            "--batch",
            "64",
            "--skip-damaged",
            "--out",
            run2.to_str().unwrap(),
            "--quiet",
        ],
        0,
    );
    assert!(
        stderr(&o).contains("skipping damaged block") && stderr(&o).contains("block 3"),
        "{}",
        stderr(&o)
    );
    let line: serde_json::Value = serde_json::from_str(
        std::fs::read_to_string(run2.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(line["damaged_blocks_skipped"], 1);
}

#[test]
fn device_choice_on_a_machine_without_cuda() {
    let t = tempfile::tempdir().unwrap();
    let ds = dataset(t.path(), "512");
    let args = |dev: &'static str, out: &str| {
        vec![
            "train".to_string(),
            ds.clone(),
            "--device".into(),
            dev.into(),
            "--epochs".into(),
            "1".into(),
            "--batch".into(),
            "64".into(),
            "--out".into(),
            t.path().join(out).to_str().unwrap().into(),
        ]
    };
    let a = args("auto", "r1");
    let o = run(&a.iter().map(|s| s.as_str()).collect::<Vec<_>>(), 0);
    let err = stderr(&o);
    if !err.contains("training on the CPU") {
        // A machine with a GPU: auto took it; the GPU tests cover that case.
        assert!(err.contains("device: cuda:0"), "{err}");
        return;
    }
    assert_eq!(
        err.lines().filter(|l| l.starts_with("device:")).count(),
        1,
        "the fallback is one line: {err}"
    );
    let a = args("cuda", "r2");
    let o = run(&a.iter().map(|s| s.as_str()).collect::<Vec<_>>(), 1);
    let err = stderr(&o);
    assert!(
        err.contains("--device cuda") && err.contains("--device cpu"),
        "{err}"
    );
    assert!(
        !t.path().join("r2").join("config.json").exists(),
        "nothing is written when the device is missing"
    );
    // prep eval takes the same choice: auto evaluates on the CPU, cuda is a clear error.
    let r1 = t.path().join("r1");
    let r1 = r1.to_str().unwrap();
    let o = run(&["eval", r1, &ds, "--device", "auto", "--json"], 0);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["device"], "cpu");
    let o = run(&["eval", r1, &ds, "--device", "cuda"], 1);
    assert!(stderr(&o).contains("--device cuda"), "{}", stderr(&o));
}

/// Both models train one epoch on a tiny odd-sized, non-square dataset; config.json names the
/// model, and `prep eval` (which builds the model from config.json) repeats the run's accuracy.
#[test]
fn each_model_trains_odd_sized_images_and_eval_reproduces_it() {
    let t = tempfile::tempdir().unwrap();
    let ds = t.path().join("ds97");
    run(
        &[
            "synth",
            "--train",
            "96",
            "--test",
            "40",
            "--shape",
            "3x97x131",
            "--classes",
            "3",
            "--out",
            ds.to_str().unwrap(),
            "--quiet",
        ],
        0,
    );
    for model in ["small", "resnet18"] {
        let run_dir = t.path().join(model);
        let o = run(
            &[
                "train",
                ds.to_str().unwrap(),
                "--model",
                model,
                "--device",
                "cpu",
                "--epochs",
                "1",
                "--batch",
                "16",
                "--lr",
                "0.05",
                "--out",
                run_dir.to_str().unwrap(),
                "--quiet",
                "--json",
            ],
            0,
        );
        let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let acc = s["test_accuracy"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&acc), "{model}: accuracy {acc}");
        let cfg: serde_json::Value =
            serde_json::from_slice(&std::fs::read(run_dir.join("config.json")).unwrap()).unwrap();
        assert_eq!(cfg["model"]["name"], model);
        let names: Vec<String> = tensors(&run_dir).into_iter().map(|t| t.0).collect();
        let expect = if model == "small" {
            "conv3.weight"
        } else {
            "layer4.1.bn2.running_var"
        };
        assert!(names.iter().any(|n| n == expect), "{model}: {names:?}");
        let e = run(
            &[
                "eval",
                run_dir.to_str().unwrap(),
                ds.to_str().unwrap(),
                "--json",
            ],
            0,
        );
        let ev: serde_json::Value = serde_json::from_slice(&e.stdout).unwrap();
        assert_eq!(ev["accuracy"].as_f64().unwrap(), acc, "{model}: eval");
    }
}

/// Shapes a user may bring train on the CPU with either model (channels 1 to 16, odd and tiny
/// sides, u16), and a model that cannot take a shape says so before anything is written.
#[test]
fn models_take_any_shape_that_fits_and_name_the_limit_otherwise() {
    let t = tempfile::tempdir().unwrap();
    // 16-bit grey images, kept as u16.
    let pngs = t.path().join("pngs");
    for (class, level) in [("dark", 9000u16), ("light", 50000)] {
        std::fs::create_dir_all(pngs.join(class)).unwrap();
        for i in 0..20u16 {
            image::ImageBuffer::from_fn(19, 16, |x, y| {
                image::Luma([level.wrapping_add(i * 97 + (x * y) as u16 * 13)])
            })
            .save(pngs.join(class).join(format!("{i}.png")))
            .unwrap();
        }
    }
    let u16_ds = t.path().join("ds-u16");
    let (pngs, u16_out) = (pngs.to_str().unwrap(), u16_ds.to_str().unwrap());
    run(
        &[
            "convert", pngs, "--dtype", "u16", "--out", u16_out, "--quiet",
        ],
        0,
    );
    for shape in ["16x17x23", "2x5x40", "u16"] {
        let ds = t.path().join(format!("ds-{shape}"));
        if shape != "u16" {
            let out = ds.to_str().unwrap();
            let args = ["synth", "--train", "32", "--test", "8", "--shape", shape];
            run(
                &[&args[..], &["--classes", "2", "--out", out, "--quiet"]].concat(),
                0,
            );
        }
        for model in ["small", "resnet18"] {
            let out = t.path().join(format!("run-{shape}-{model}"));
            run(
                &[
                    "train",
                    ds.to_str().unwrap(),
                    "--model",
                    model,
                    "--device",
                    "cpu",
                    "--epochs",
                    "1",
                    "--batch",
                    "8",
                    "--out",
                    out.to_str().unwrap(),
                    "--quiet",
                ],
                0,
            );
        }
    }
    // `small` pools twice: 3 pixels cannot take that.
    let ds = t.path().join("tiny");
    run(
        &[
            "synth",
            "--train",
            "16",
            "--test",
            "0",
            "--shape",
            "1x3x8",
            "--classes",
            "2",
            "--out",
            ds.to_str().unwrap(),
            "--quiet",
        ],
        0,
    );
    let out = t.path().join("tiny-run");
    let o = run(
        &[
            "train",
            ds.to_str().unwrap(),
            "--device",
            "cpu",
            "--out",
            out.to_str().unwrap(),
        ],
        2,
    );
    let err = stderr(&o);
    assert!(
        err.contains("model `small` needs images of at least 4x4"),
        "{err}"
    );
    assert!(!out.exists(), "nothing written for a model that cannot run");
    // A run that fails before its first step leaves no run folder behind to block a rerun.
    let big = t.path().join("big-batch");
    let dsb = t.path().join("ds-16x17x23");
    let args = [
        "train",
        dsb.to_str().unwrap(),
        "--device",
        "cpu",
        "--batch",
        "64",
    ];
    let o = run(&[&args[..], &["--out", big.to_str().unwrap()]].concat(), 2);
    assert!(
        stderr(&o).contains("fewer than one batch of 64"),
        "{}",
        stderr(&o)
    );
    assert!(!big.exists(), "a run that never started leaves no folder");
    let o = run(&["train", ds.to_str().unwrap(), "--model", "vgg"], 2);
    assert!(stderr(&o).contains("resnet18"), "{}", stderr(&o));
}
