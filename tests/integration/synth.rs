use crate::util::*;
use prep::shard::Dataset;
use std::time::{Duration, Instant};

#[test]
fn same_arguments_give_byte_identical_shards() {
    let t = tempfile::tempdir().unwrap();
    let a = small_dataset(&t.path().join("a"), &[]);
    let b = small_dataset(&t.path().join("b"), &[]);
    let (fa, fb) = (shard_files(&a), shard_files(&b));
    // 3000 train samples in shards of 4 x 256 -> 3 shards; 500 test samples -> 1.
    assert_eq!(
        fa.len(),
        4,
        "{:?}",
        fa.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    assert!(fa == fb, "shards differ between two identical runs");
    // The manifests differ only in the recorded command line (the output path).
    let ma = Dataset::open(&a).unwrap().manifest;
    let mut mb = Dataset::open(&b).unwrap().manifest;
    mb.provenance.command = ma.provenance.command.clone();
    mb.checksum = ma.checksum.clone();
    assert_eq!(ma, mb);
    // Another seed gives other data.
    let c = small_dataset(&t.path().join("c"), &["--seed", "4"]);
    assert!(shard_files(&c) != fa);
}

#[test]
fn manifest_counts_and_verify() {
    let t = tempfile::tempdir().unwrap();
    let d = small_dataset(t.path(), &[]);
    let m = Dataset::open(&d).unwrap().manifest;
    assert_eq!(m.splits["train"].samples, 3000);
    assert_eq!(m.splits["test"].samples, 500);
    assert_eq!(m.splits["train"].class_counts.iter().sum::<u64>(), 3000);
    assert!(
        m.splits["train"].class_counts.iter().all(|&c| c > 450),
        "{:?}",
        m.splits["train"].class_counts
    );
    assert_eq!(m.splits["train"].shards.len(), 3);
    let o = run(&["verify", d.to_str().unwrap()], 0);
    assert!(stdout(&o).contains("OK"), "{}", stdout(&o));
    assert!(stdout(&o).contains("3,500 samples"), "{}", stdout(&o));
}

#[test]
fn rerun_of_a_complete_dataset_does_nothing_and_other_parameters_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let d = small_dataset(t.path(), &[]);
    let before = files(&d);
    let o = run(
        &[
            "synth",
            "--train",
            "3000",
            "--test",
            "500",
            "--shape",
            "3x12x12",
            "--classes",
            "5",
            "--seed",
            "3",
            "--block-samples",
            "256",
            "--shard-blocks",
            "4",
            "--out",
            d.to_str().unwrap(),
        ],
        0,
    );
    assert!(
        stdout(&o).contains("already holds this dataset"),
        "{}",
        stdout(&o)
    );
    assert!(files(&d) == before);
    let o = run(
        &[
            "synth",
            "--train",
            "100",
            "--out",
            d.to_str().unwrap(),
            "--quiet",
        ],
        2,
    );
    assert!(
        stderr(&o).contains("different dataset") && stderr(&o).contains("--force"),
        "{}",
        stderr(&o)
    );
    assert!(
        files(&d) == before,
        "a refused run must not touch the dataset"
    );
    run(
        &[
            "synth",
            "--train",
            "100",
            "--test",
            "0",
            "--out",
            d.to_str().unwrap(),
            "--quiet",
            "--force",
        ],
        0,
    );
    let m = Dataset::open(&d).unwrap().manifest;
    assert_eq!(m.splits["train"].samples, 100);
    assert_eq!(
        shard_files(&d).len(),
        1,
        "old shards are removed by --force"
    );
}

#[test]
fn killed_run_resumes_to_byte_identical_output() {
    let t = tempfile::tempdir().unwrap();
    let args = |out: &str| -> Vec<String> {
        [
            "synth",
            "--train",
            "60000",
            "--test",
            "2000",
            "--shape",
            "3x16x16",
            "--block-samples",
            "512",
            "--shard-blocks",
            "2",
            "--jobs",
            "1",
            "--quiet",
            "--out",
            out,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let clean = t.path().join("clean");
    run(
        &args(clean.to_str().unwrap())
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>(),
        0,
    );
    let total_shards = shard_files(&clean).len();
    assert!(total_shards > 30);

    let killed = t.path().join("killed");
    // Kill part-way: once a few shards are complete but not all.
    let mut child = prep().args(args(killed.to_str().unwrap())).spawn().unwrap();
    let t0 = Instant::now();
    loop {
        let n = std::fs::read_dir(killed.join("train"))
            .map(|d| {
                d.filter(|e| {
                    e.as_ref()
                        .unwrap()
                        .file_name()
                        .to_string_lossy()
                        .ends_with(".shard")
                })
                .count()
            })
            .unwrap_or(0);
        if n >= 5 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "no shards appeared");
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let partial = shard_files(&killed).len();
    assert!(
        partial < total_shards,
        "the run finished before it could be killed ({partial} shards)"
    );
    assert!(
        !killed.join("manifest.json").exists(),
        "an unfinished run must not have a manifest"
    );

    run(
        &args(killed.to_str().unwrap())
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>(),
        0,
    );
    assert!(
        shard_files(&killed) == shard_files(&clean),
        "resumed output differs from a clean run"
    );
    let leftovers: Vec<_> = files(&killed)
        .into_iter()
        .filter(|(n, _)| n.ends_with(".tmp") || n.starts_with(".prep"))
        .map(|f| f.0)
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let mut a = Dataset::open(&clean).unwrap().manifest;
    let b = Dataset::open(&killed).unwrap().manifest;
    a.provenance.command = b.provenance.command.clone();
    a.checksum = b.checksum.clone();
    assert_eq!(a, b);
}

#[test]
fn usage_errors_exit_2() {
    let o = run(&["synth", "--train", "10", "--shape", "3x0x4"], 2);
    assert!(stderr(&o).contains("shape"), "{}", stderr(&o));
    run(&["synth"], 2);
    run(&["nonsense"], 2);
    let o = run(
        &[
            "synth",
            "--train",
            "10",
            "--classes",
            "0",
            "--out",
            "/nonexistent/x",
        ],
        2,
    );
    assert!(stderr(&o).contains("classes"), "{}", stderr(&o));
}

#[test]
fn plan_prints_every_mode() {
    let o = run(&["plan", "--train", "10000000", "--shape", "3x32x32"], 0);
    let s = stdout(&o);
    for w in [
        "shards",
        "colmajor",
        "--memory device",
        "--memory stream",
        "--memory managed",
        "prep synth",
    ] {
        assert!(s.contains(w), "missing {w}:\n{s}");
    }
    let o = run(&["plan", "--train", "10000000", "--json"], 0);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // 10M x 3072 bytes of u8 pixels, plus labels, for train + 10k test.
    assert_eq!(v["disk"][0]["bytes"], 10_010_000u64 * 3076);
    // Device mode needs the whole dataset on the GPU; stream mode does not grow with it.
    let dev = v["gpu_memory"][0]["bytes"].as_u64().unwrap();
    let stream = v["gpu_memory"][1]["bytes"].as_u64().unwrap();
    assert!(
        dev > 30_000_000_000 && stream < 2_000_000_000,
        "{dev} {stream}"
    );
}
