//! Hostile conditions (issue 14): one writer per folder, readers during a rewrite, every numeric
//! flag checked.
//!
//! The writers hold their lock a while with `PREP_TEST_HOLD_LOCK_MS` (src/lock.rs), so that a
//! second process surely meets it whatever the speed of the machine.

mod decoders;
mod paths;
mod signals;
mod special_files;
mod writes;

use crate::util::{prep, run, small_dataset, stderr, stdout, SMALL_SYNTH};
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

const HOLD: &str = "PREP_TEST_HOLD_LOCK_MS";
const LOCK: &str = ".prep.lock";

fn synth_args<'a>(out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = SMALL_SYNTH.to_vec();
    v.extend_from_slice(&["--out", out, "--quiet"]);
    v.extend_from_slice(extra);
    v
}

/// Start prep with `args`, holding the lock on `dir` for `ms` once taken; returns once the lock
/// is held (its file names this process).
fn start_holding(args: &[&str], dir: &Path, ms: u64) -> Child {
    let mut c = prep()
        .args(args)
        .env(HOLD, ms.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("prep starts");
    let want = format!("\"pid\":{}", c.id());
    let t = Instant::now();
    loop {
        if std::fs::read_to_string(dir.join(LOCK)).is_ok_and(|s| s.contains(&want)) {
            return c;
        }
        if let Some(st) = c.try_wait().unwrap() {
            let o = c.wait_with_output().unwrap();
            panic!(
                "prep {args:?} ended ({st}) before taking its lock:\n{}",
                stderr(&o)
            );
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "prep {args:?} took no lock"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn finish(c: Child) -> Output {
    let o = c.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "first writer failed:\n{}\n{}",
        stdout(&o),
        stderr(&o)
    );
    o
}

/// `args` exits 1 at once, naming `dir` and the holder's pid.
fn refused(args: &[&str], dir: &Path, pid: u32) {
    let t = Instant::now();
    let o = run(args, 1);
    let e = stderr(&o);
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t.elapsed()
    );
    assert!(e.contains("is being written by another prep"), "{e}");
    assert!(e.contains(&dir.display().to_string()), "{e}");
    assert!(e.contains(&format!("pid {pid} on host ")), "{e}");
    assert!(e.contains("since "), "{e}");
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn two_synth_writers() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("c1");
    let first = start_holding(&synth_args(s(&out), &[]), &out, 1500);
    let pid = first.id();
    refused(&synth_args(s(&out), &[]), &out, pid);
    // Other parameters and --force are refused alike: the lock comes before any cleanup.
    refused(&synth_args(s(&out), &["--seed", "9", "--force"]), &out, pid);
    finish(first);
    run(&["verify", s(&out), "--quiet"], 0);
    assert!(
        !out.join(LOCK).exists(),
        "the lock file is removed at the end"
    );
    // A rerun after the first finished works (and has nothing to do).
    let o = run(&synth_args(s(&out), &[])[..15], 0);
    assert!(stdout(&o).contains("nothing to do"), "{}", stdout(&o));
}

#[test]
fn two_train_writers() {
    let t = tempfile::tempdir().unwrap();
    let ds = small_dataset(t.path(), &[]);
    let run_dir = t.path().join("run");
    let args = [
        "train",
        s(&ds),
        "--device",
        "cpu",
        "--epochs",
        "1",
        "--batch",
        "256",
        "--out",
        s(&run_dir),
        "--quiet",
    ];
    let first = start_holding(&args, &run_dir, 1500);
    let pid = first.id();
    refused(&args, &run_dir, pid);
    refused(
        &["train", "--resume", s(&run_dir), "--quiet"],
        &run_dir,
        pid,
    );
    finish(first);
    assert!(run_dir.join("config.json").exists());
    assert!(!run_dir.join(LOCK).exists());
    // --resume of the finished run takes the lock again and works.
    run(&["train", "--resume", s(&run_dir), "--quiet"], 0);
}

#[test]
fn two_merge_writers() {
    let t = tempfile::tempdir().unwrap();
    let parts: Vec<PathBuf> = (0..2)
        .map(|i| {
            let p = t.path().join(format!("p{i}"));
            let part = format!("{i}/2");
            run(&synth_args(s(&p), &["--part", &part]), 0);
            p
        })
        .collect();
    let out = t.path().join("merged");
    let args = ["merge", s(&out), s(&parts[0]), s(&parts[1]), "--quiet"];
    let first = start_holding(&args, &out, 1500);
    let pid = first.id();
    refused(&args, &out, pid);
    // Any writer: a synth into the folder being merged into.
    refused(&synth_args(s(&out), &[]), &out, pid);
    finish(first);
    run(&["verify", s(&out), "--quiet"], 0);
    assert!(!out.join(LOCK).exists());
}

#[test]
fn killed_holder_does_not_block() {
    let t = tempfile::tempdir().unwrap();
    // Killed while holding the lock on a folder it created: the lock file stays, locked by no one.
    let out = t.path().join("held");
    let mut first = start_holding(&synth_args(s(&out), &[]), &out, 60_000);
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(out.join(LOCK).exists());
    run(&synth_args(s(&out), &[]), 0);
    run(&["verify", s(&out), "--quiet"], 0);
    assert!(!out.join(LOCK).exists());

    // Killed mid-run, shards written: the rerun resumes and ends as an uninterrupted run.
    let out2 = t.path().join("resumed");
    let args = [
        "synth",
        "--train",
        "400000",
        "--test",
        "1000",
        "--shape",
        "1x16x16",
        "--block-samples",
        "256",
        "--shard-blocks",
        "2",
        "--jobs",
        "1",
        "--out",
        s(&out2),
        "--quiet",
    ];
    let mut c = prep().args(args).spawn().unwrap();
    let t0 = Instant::now();
    while !out2.join("train/train-00001.shard").exists() && c.try_wait().unwrap().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(5));
    }
    c.kill().unwrap();
    c.wait().unwrap();
    let o = run(&args[..args.len() - 1], 0);
    let so = stdout(&o);
    assert!(
        so.contains("resumed") || so.contains("nothing to do"),
        "{so}"
    );
    run(&["verify", s(&out2), "--quiet"], 0);
    assert!(!out2.join(LOCK).exists());

    // A train killed while holding its new run folder: the same command runs again.
    let ds = small_dataset(t.path(), &[]);
    let run_dir = t.path().join("run");
    let args = [
        "train",
        s(&ds),
        "--device",
        "cpu",
        "--epochs",
        "1",
        "--batch",
        "256",
        "--out",
        s(&run_dir),
        "--quiet",
    ];
    let mut first = start_holding(&args, &run_dir, 60_000);
    first.kill().unwrap();
    first.wait().unwrap();
    run(&args, 0);
    assert!(!run_dir.join(LOCK).exists());
}

#[test]
fn failed_writer_leaves_nothing() {
    let t = tempfile::tempdir().unwrap();
    let empty = t.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = t.path().join("out");
    let o = prep()
        .args(["convert", s(&empty), "--out", s(&out), "--quiet"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(!out.exists(), "a failed convert left {}", out.display());
}

#[test]
fn readers_during_force_rewrite_see_old_or_error() {
    let t = tempfile::tempdir().unwrap();
    let ds = small_dataset(t.path(), &[]);
    let old = crate::util::shard_files(&ds);
    let writer = start_holding(&synth_args(s(&ds), &["--seed", "4", "--force"]), &ds, 2000);
    let pid = writer.id();
    for args in [
        vec!["verify", s(&ds)],
        vec!["inspect", s(&ds)],
        vec!["train", s(&ds), "--device", "cpu", "--epochs", "1", "--out"],
    ] {
        let mut args = args.clone();
        let r = t.path().join("r");
        if args.last() == Some(&"--out") {
            args.push(s(&r));
        }
        let o = run(&args, 1);
        let e = stderr(&o);
        assert!(
            e.contains("is being written by another prep"),
            "{args:?}: {e}"
        );
        assert!(e.contains(&format!("pid {pid}")), "{e}");
        assert!(!r.exists());
    }
    finish(writer);
    run(&["verify", s(&ds), "--quiet"], 0);
    assert_ne!(
        crate::util::shard_files(&ds),
        old,
        "the dataset was rewritten"
    );

    // A real rewrite (no hold), read over and over meanwhile: every verify sees a whole dataset
    // (old or new: exit 0) or stops with the writer named, never a mix.
    let mut w = prep()
        .args(synth_args(s(&ds), &["--seed", "5", "--force"]))
        .spawn()
        .unwrap();
    while w.try_wait().unwrap().is_none() {
        let o = prep().args(["verify", s(&ds), "--json"]).output().unwrap();
        let all = format!("{}{}", stdout(&o), stderr(&o));
        assert!(
            o.status.success()
                || all.contains("is being written by another prep")
                || all.contains("manifest.json"),
            "{all}"
        );
        assert!(
            !all.contains("is not the shard the manifest lists"),
            "{all}"
        );
    }
    assert!(w.wait().unwrap().success());
    run(&["verify", s(&ds), "--quiet"], 0);
}

#[test]
fn numeric_flags_checked() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("out");
    let o = s(&out);
    let input = t.path().join("in");
    std::fs::create_dir(&input).unwrap();
    let i = s(&input);
    let grid = t.path().join("grid.png");
    let g = s(&grid);
    let synth = |extra: &[&'static str]| {
        let mut v = vec!["synth", "--train", "10"];
        v.extend_from_slice(extra);
        v
    };
    // (arguments, the flag named, the allowed range named)
    let table: Vec<(Vec<&str>, &str, &str)> = vec![
        (
            vec!["synth", "--train", "0", "--test", "0"],
            "--train",
            "both 0",
        ),
        (
            vec!["synth", "--train", "18446744073709551615"],
            "--train",
            "0..=1000000000000",
        ),
        (
            synth(&["--test", "1000000000001"]),
            "--test",
            "0..=1000000000000",
        ),
        (
            synth(&["--shape", "65535x65535x65535"]),
            "--shape",
            "cap of 4096",
        ),
        (synth(&["--shape", "4x65535x65535"]), "--shape", "2^28"),
        (synth(&["--shape", "0x32x32"]), "--shape", "zero"),
        (synth(&["--classes", "0"]), "--classes", "1..=65536"),
        (synth(&["--classes", "65537"]), "--classes", "1..=65536"),
        (synth(&["--level", "0"]), "--level", "1..=22"),
        (synth(&["--level", "23"]), "--level", "1..=22"),
        (
            synth(&["--block-samples", "0"]),
            "--block-samples",
            "1..=1048576",
        ),
        (
            synth(&["--shard-blocks", "0"]),
            "--shard-blocks",
            "1..=1048576",
        ),
        (synth(&["--difficulty", "NaN"]), "--difficulty", "[0, 1]"),
        (synth(&["--difficulty", "inf"]), "--difficulty", "[0, 1]"),
        (synth(&["--difficulty", "-0.5"]), "--difficulty", "[0, 1]"),
        (synth(&["--part", "3/3"]), "--part", "0 <= I < N"),
        (synth(&["--part", "0/0"]), "--part", "0 <= I < N"),
        (synth(&["--jobs", "0"]), "--jobs", "1..=4096"),
        (synth(&["--jobs", "100000"]), "--jobs", "1..=4096"),
        (
            vec![
                "synth",
                "--train",
                "1000000000000",
                "--shape",
                "1x16384x16384",
            ],
            "--train",
            "2^64",
        ),
        (
            vec!["convert", i, "--test-fraction", "NaN"],
            "--test-fraction",
            "[0, 1]",
        ),
        (
            vec!["convert", i, "--test-fraction", "-0.1"],
            "--test-fraction",
            "[0, 1]",
        ),
        (
            vec!["convert", i, "--test-fraction", "1.5"],
            "--test-fraction",
            "[0, 1]",
        ),
        (vec!["convert", i, "--size", "0x32"], "--size", "at least 1"),
        (
            vec!["convert", i, "--size", "65535x65535"],
            "--size",
            "2^28",
        ),
        (vec!["convert", i, "--channels", "0"], "--channels", "1..=3"),
        (vec!["convert", i, "--fps", "0"], "--fps", "(0, 1000]"),
        (vec!["convert", i, "--fps", "inf"], "--fps", "(0, 1000]"),
        (vec!["convert", i, "--every", "0"], "--every", "1..=1000000"),
        (
            vec!["convert", i, "--window", "nan:1"],
            "--window",
            "finite",
        ),
        (
            vec!["convert", i, "--window", "5:1"],
            "--window",
            "LOW < HIGH",
        ),
        (vec!["convert", i, "--axis", "3"], "--axis", "0..=2"),
        (vec!["convert", i, "--level", "0"], "--level", "1..=22"),
        (vec!["convert", i, "--part", "1/0"], "--part", "0 <= I < N"),
        (vec!["train", i, "--epochs", "0"], "--epochs", "1..=1000000"),
        (vec!["train", i, "--batch", "0"], "--batch", "1..=65536"),
        (
            vec!["train", i, "--batch", "100000"],
            "--batch",
            "1..=65536",
        ),
        (vec!["train", i, "--lr", "0"], "--lr", "(0, 100]"),
        (vec!["train", i, "--lr", "NaN"], "--lr", "(0, 100]"),
        (vec!["train", i, "--lr", "-1"], "--lr", "(0, 100]"),
        (vec!["train", i, "--momentum", "1"], "--momentum", "[0, 1)"),
        (
            vec!["train", i, "--weight-decay", "NaN"],
            "--weight-decay",
            "[0, 1]",
        ),
        (
            vec!["train", i, "--label-smoothing", "-0.1"],
            "--label-smoothing",
            "[0, 1)",
        ),
        (
            vec!["train", i, "--checkpoint-every", "10000000000"],
            "--checkpoint-every",
            "0..=1000000000",
        ),
        (
            vec!["inspect", i, "--per-class", "0"],
            "--per-class",
            "1..=1000",
        ),
        (vec!["inspect", i, "--zoom", "0"], "--zoom", "1..=64"),
        (vec!["inspect", i, "--zoom", "1000"], "--zoom", "1..=64"),
        (
            vec!["plan", "--train", "18446744073709551615"],
            "--train",
            "0..=1000000000000",
        ),
        (
            vec!["plan", "--train", "10", "--batch", "0"],
            "--batch",
            "1..=65536",
        ),
        (
            vec![
                "plan",
                "--train",
                "1000000000000",
                "--shape",
                "1x16384x16384",
            ],
            "--train",
            "2^64",
        ),
    ];
    for (args, flag, range) in table {
        let mut args = args.clone();
        match args[0] {
            "synth" | "convert" | "train" => args.extend_from_slice(&["--out", o]),
            "inspect" => args.extend_from_slice(&["--grid", g]),
            _ => {}
        }
        let r = run(&args, 2);
        let e = stderr(&r);
        assert!(e.contains(flag), "{args:?}: no {flag} in: {e}");
        assert!(e.contains(range), "{args:?}: no {range} in: {e}");
        assert!(!out.exists(), "{args:?} created {o}");
        assert!(!grid.exists(), "{args:?} created {g}");
    }
    // Flags whose product is too large: a grid picture too wide to draw.
    let ds = small_dataset(t.path(), &[]);
    let args = [
        "inspect",
        s(&ds),
        "--grid",
        g,
        "--per-class",
        "1000",
        "--zoom",
        "64",
    ];
    let e = stderr(&run(&args, 2));
    assert!(e.contains("--per-class") && e.contains("32768"), "{e}");
    assert!(!grid.exists());
}

/// What a job that ended (finished, failed or stopped by a signal) must not leave under `dir`:
/// temporary files, a staging folder, a lock file.
fn leftovers(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return found;
    };
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".tmp") || name == ".prep-staging" || name == LOCK {
            found.push(p.display().to_string());
        }
        if p.is_dir() {
            found.extend(leftovers(&p));
        }
    }
    found
}

/// stderr of `o`, which must be exactly one line holding each of `parts`, with at most one OS
/// message ("(os error N)").
fn one_line(o: &Output, parts: &[&str]) -> String {
    let e = stderr(o);
    let lines: Vec<&str> = e.lines().collect();
    assert_eq!(lines.len(), 1, "not one line:\n{e}");
    for p in parts {
        assert!(e.contains(p), "no {p:?} in: {e}");
    }
    assert!(
        e.matches("(os error").count() <= 1,
        "OS message repeated: {e}"
    );
    e
}
