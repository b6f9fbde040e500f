use crate::util::*;
use prep::format::shard::Dataset;
use std::path::Path;
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

/// Kill a generation once a few shards are complete, rerun it, and compare with a clean run.
fn killed_run_resumes_identically(extra: &[&str]) {
    let t = tempfile::tempdir().unwrap();
    let args = |out: &Path| -> Vec<String> {
        let mut a = vec![
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
            out.to_str().unwrap(),
        ];
        a.extend_from_slice(extra);
        a.iter().map(|s| s.to_string()).collect()
    };
    let run_args = |out: &Path| {
        let a = args(out);
        run(&a.iter().map(|s| s.as_str()).collect::<Vec<_>>(), 0);
    };
    let clean = t.path().join("clean");
    run_args(&clean);
    let total_shards = shard_files(&clean).len();
    assert!(total_shards > 30);

    let killed = t.path().join("killed");
    let mut child = prep().args(args(&killed)).spawn().unwrap();
    let t0 = Instant::now();
    while std::fs::read_dir(killed.join("train"))
        .map(|d| {
            d.filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_string_lossy().ends_with(".shard")
            })
            .count()
        })
        .unwrap_or(0)
        < 5
    {
        assert!(t0.elapsed() < Duration::from_secs(60), "no shards appeared");
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let partial = shard_files(&killed).len();
    assert!(
        partial < total_shards,
        "{extra:?}: the run finished before it could be killed ({partial} shards)"
    );
    assert!(killed.join(".prep-partial.json").exists());
    assert!(!killed.join("manifest.json").exists());

    run_args(&killed);
    assert!(
        shard_files(&killed) == shard_files(&clean),
        "{extra:?}: resumed output differs from a clean run"
    );
    let mut a = Dataset::open(&clean).unwrap().manifest;
    let b = Dataset::open(&killed).unwrap().manifest;
    a.provenance.command = b.provenance.command.clone();
    a.checksum = b.checksum.clone();
    assert_eq!(a, b);
}

#[test]
fn killed_run_resumes_to_byte_identical_output_with_either_generator() {
    killed_run_resumes_identically(&["--generator", "1"]);
    killed_run_resumes_identically(&["--generator", "2", "--difficulty", "0.8"]);
}

#[test]
fn generator_and_difficulty_are_recorded_and_a_change_needs_force() {
    let t = tempfile::tempdir().unwrap();
    let source = |d: &Path| Dataset::open(d).unwrap().manifest.provenance.source;
    // New datasets are version 2 at the default difficulty.
    let d = small_dataset(&t.path().join("default"), &[]);
    assert_eq!(source(&d)["generator"], "prep-synth/2");
    assert_eq!(source(&d)["difficulty"], 0.5);
    let explicit = small_dataset(
        &t.path().join("explicit"),
        &["--generator", "2", "--difficulty", "0.5"],
    );
    assert!(shard_files(&explicit) == shard_files(&d));
    // Version 1 records exactly what it recorded before version 2 existed: no difficulty.
    let v1 = small_dataset(&t.path().join("v1"), &["--generator", "1"]);
    assert_eq!(source(&v1)["generator"], "prep-synth/1");
    assert!(source(&v1).get("difficulty").is_none());
    assert!(shard_files(&v1) != shard_files(&d));
    let hard = small_dataset(&t.path().join("hard"), &["--difficulty", "0.9"]);
    assert!(shard_files(&hard) != shard_files(&d));

    // Another difficulty or version into an existing dataset is refused and leaves it alone.
    let before = files(&d);
    let again = |extra: &[&str], code: i32| {
        let mut a = vec![
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
            "--quiet",
            "--out",
            d.to_str().unwrap(),
        ];
        a.extend_from_slice(extra);
        run(&a, code)
    };
    for extra in [&["--difficulty", "0.6"][..], &["--generator", "1"]] {
        let o = again(extra, 2);
        assert!(stderr(&o).contains("different dataset"), "{}", stderr(&o));
        assert!(
            files(&d) == before,
            "{extra:?}: a refused run touched the dataset"
        );
    }
    again(&["--difficulty", "0.9", "--force"], 0);
    assert!(shard_files(&d) == shard_files(&hard));
    assert_eq!(source(&d)["difficulty"], 0.9);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let dst = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_dir(&p, &dst);
        } else {
            std::fs::copy(&p, &dst).unwrap();
        }
    }
}

/// A dataset made before generator version 2 existed (the committed fixture, made by prep 0.1.0)
/// is recognised as version 1: complete, and resumed when partial.
#[test]
fn a_dataset_from_before_version_2_is_version_1() {
    let t = tempfile::tempdir().unwrap();
    let fixture = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/synth-v1"));
    let d = t.path().join("old");
    copy_dir(fixture, &d);
    let args = |extra: &[&str]| -> Vec<String> {
        let mut a = vec![
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
            "--out",
            d.to_str().unwrap(),
        ];
        a.extend_from_slice(extra);
        a.iter().map(|s| s.to_string()).collect()
    };
    let go = |extra: &[&str], code: i32| {
        let a = args(extra);
        run(&a.iter().map(|s| s.as_str()).collect::<Vec<_>>(), code)
    };
    let before = files(&d);
    let o = go(&["--generator", "1"], 0);
    assert!(
        stdout(&o).contains("already holds this dataset"),
        "{}",
        stdout(&o)
    );
    assert!(files(&d) == before);
    // The same command line without --generator now means version 2: refused, with the way out.
    let o = go(&["--quiet"], 2);
    assert!(
        stderr(&o).contains("generator version 1") && stderr(&o).contains("--generator 1"),
        "{}",
        stderr(&o)
    );
    assert!(files(&d) == before);

    // Interrupted as an old prep would have left it: the marker holds the old parameters, the
    // manifest is gone and one shard is missing. Version 1 resumes it to the fixture's bytes.
    let source = Dataset::open(&d).unwrap().manifest.provenance.source;
    std::fs::write(
        d.join(".prep-partial.json"),
        serde_json::to_string_pretty(&source).unwrap(),
    )
    .unwrap();
    std::fs::remove_file(d.join("manifest.json")).unwrap();
    let last = shard_files(&d).last().unwrap().0.clone();
    std::fs::remove_file(d.join(&last)).unwrap();
    let o = go(&["--quiet"], 2);
    assert!(stderr(&o).contains("--generator 1"), "{}", stderr(&o));
    go(&["--generator", "1", "--quiet"], 0);
    assert!(shard_files(&d) == shard_files(fixture));
    assert!(!d.join(".prep-partial.json").exists());
}

#[test]
fn generator_usage_errors_exit_2() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("x");
    let o = out.to_str().unwrap();
    let base = ["synth", "--train", "10", "--quiet", "--out", o];
    let with = |extra: &[&'static str]| [&base[..], extra].concat();
    let e = run(&with(&["--generator", "1", "--difficulty", "0.3"]), 2);
    assert!(stderr(&e).contains("--difficulty"), "{}", stderr(&e));
    for d in ["1.5", "-0.1", "nan"] {
        let e = run(&with(&["--difficulty", d]), 2);
        assert!(stderr(&e).contains("difficulty"), "{d}: {}", stderr(&e));
    }
    run(&with(&["--generator", "3"]), 2);
    assert!(!out.join("manifest.json").exists());
}

#[test]
fn killed_run_resumes_to_byte_identical_output_with_a_task() {
    // The kept shards' field summaries come from reading them again (the manifest that held
    // them is gone): the resumed manifest equals a clean run's.
    killed_run_resumes_identically(&["--task", "mask"]);
}
