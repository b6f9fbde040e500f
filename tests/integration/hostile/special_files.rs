//! Special files where prep expects a regular one (issue 24): a manifest, a shard, a run's config
//! or checkpoint, a convert input or a labels CSV that is a symbolic link to `/dev/zero` or
//! `/dev/urandom` (reads that never end), a FIFO (an open that waits for a writer), a socket, a
//! directory, or a device. Every command must end at once with exit 1 naming the path, never
//! hang. A command that runs past `HANG` is killed and the test fails, naming it.
//!
//! Each case prints its time; `cargo test special_files -- --nocapture` shows the table.

use crate::util::{prep, stderr};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

/// Far above what any case takes (milliseconds): past this a command is taken to hang.
const HANG: Duration = Duration::from_secs(20);

/// The kinds of thing put where a file belongs.
#[derive(Clone, Copy, Debug)]
enum Kind {
    DevZero,
    DevUrandom,
    DevNull,
    Fifo,
    LinkToFifo,
    Socket,
    Directory,
}

const KINDS: [Kind; 7] = [
    Kind::DevZero,
    Kind::DevUrandom,
    Kind::DevNull,
    Kind::Fifo,
    Kind::LinkToFifo,
    Kind::Socket,
    Kind::Directory,
];

impl Kind {
    /// The words the error must hold for this kind.
    fn word(self) -> &'static str {
        match self {
            Kind::DevZero | Kind::DevUrandom | Kind::DevNull => "character device",
            Kind::Fifo | Kind::LinkToFifo => "FIFO",
            Kind::Socket => "socket",
            Kind::Directory => "directory",
        }
    }
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o644) },
        0,
        "mkfifo {p:?}"
    );
}

/// Replace the file at `p` (if any) with a thing of `kind`.
fn plant(p: &Path, kind: Kind) {
    if p.is_dir() {
        std::fs::remove_dir_all(p).unwrap();
    } else if p.symlink_metadata().is_ok() {
        std::fs::remove_file(p).unwrap();
    }
    match kind {
        Kind::DevZero => symlink("/dev/zero", p).unwrap(),
        Kind::DevUrandom => symlink("/dev/urandom", p).unwrap(),
        Kind::DevNull => symlink("/dev/null", p).unwrap(),
        Kind::Fifo => mkfifo(p),
        Kind::LinkToFifo => {
            // Outside every tree a test walks, so that only the link is met.
            static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let target =
                std::env::temp_dir().join(format!("prep-test-fifo-{}-{n}", std::process::id()));
            let _ = std::fs::remove_file(&target);
            mkfifo(&target);
            symlink(&target, p).unwrap();
        }
        Kind::Socket => {
            // The socket file stays once the listener is gone: nothing answers on it.
            drop(std::os::unix::net::UnixListener::bind(p).unwrap());
        }
        Kind::Directory => std::fs::create_dir(p).unwrap(),
    }
}

/// Run prep with `args`, killing it past `HANG`; (output, seconds).
fn run_bounded(args: &[&str]) -> (Output, f64) {
    let t = Instant::now();
    let mut child = prep()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("prep runs");
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if t.elapsed() > HANG {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "prep {args:?} hung (killed after {HANG:?})\nstderr:\n{}",
                stderr(&o)
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let secs = t.elapsed().as_secs_f64();
    (child.wait_with_output().unwrap(), secs)
}

/// `args` ends with exit 1 and an error naming `path` and what it is.
fn refused(case: &str, args: &[&str], path: &Path, kind: Kind) {
    refused_with(1, case, args, path, kind)
}

/// `args` ends with exit `code` and an error naming `path` and what it is.
fn refused_with(code: i32, case: &str, args: &[&str], path: &Path, kind: Kind) {
    let (o, secs) = run_bounded(args);
    let err = stderr(&o) + &String::from_utf8_lossy(&o.stdout);
    println!(
        "special_files | {case} | {kind:?} | exit {:?} | {secs:.3} s",
        o.status.code()
    );
    assert_eq!(
        o.status.code(),
        Some(code),
        "{case} {kind:?}: prep {args:?}\n{err}"
    );
    let shown = path.to_str().unwrap();
    let name = path.file_name().unwrap().to_str().unwrap();
    assert!(
        err.contains(shown) || err.contains(name),
        "{case} {kind:?}: the error does not name {shown}:\n{err}"
    );
    assert!(
        err.contains(kind.word()),
        "{case} {kind:?}: the error does not say it is a {}:\n{err}",
        kind.word()
    );
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A tiny dataset (two shards a split), and a one-epoch CPU run trained on it.
struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
}

impl Fixture {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let ds = root.join("ds");
        run(&synth(&ds, None), 0);
        let runs = root.join("run");
        run(
            &[
                "train",
                s(&ds),
                "--device",
                "cpu",
                "--epochs",
                "1",
                "--batch",
                "32",
                "--out",
                s(&runs),
                "--quiet",
            ],
            0,
        );
        for i in 0..2 {
            let p = root.join(format!("part{i}"));
            let part = format!("{i}/2");
            run(&synth(&p, Some(&part)), 0);
        }
        Fixture { _tmp: tmp, root }
    }
    /// A fresh copy of the named folder, to damage.
    fn copy(&self, name: &str, to: &str) -> PathBuf {
        let from = self.root.join(name);
        let to = self.root.join(to);
        let _ = std::fs::remove_dir_all(&to);
        copy_dir(&from, &to);
        to
    }
}

fn synth(out: &Path, part: Option<&str>) -> Vec<String> {
    let mut a: Vec<String> = [
        "synth",
        "--train",
        "256",
        "--test",
        "64",
        "--shape",
        "1x8x8",
        "--classes",
        "4",
        "--block-samples",
        "32",
        "--shard-blocks",
        "4",
        "--quiet",
        "--out",
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    a.push(s(out).into());
    if let Some(p) = part {
        a.extend(["--part".into(), p.into()]);
    }
    a
}

fn run(args: &[impl AsRef<str>], code: i32) {
    let v: Vec<&str> = args.iter().map(|a| a.as_ref()).collect();
    crate::util::run(&v, code);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let t = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &t);
        } else {
            std::fs::copy(e.path(), t).unwrap();
        }
    }
}

fn first_shard(ds: &Path) -> PathBuf {
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ds.join("manifest.json")).unwrap()).unwrap();
    ds.join(m["splits"]["train"]["shards"][0]["file"].as_str().unwrap())
}

/// The commands that read a dataset, each given `ds` (and what else it needs).
fn readers<'a>(f: &Fixture, ds: &'a str, out: &'a str) -> Vec<(&'static str, Vec<String>)> {
    let run_dir = f.root.join("run");
    let other = f.root.join("part1");
    vec![
        ("verify", vec!["verify".into(), ds.into()]),
        ("inspect", vec!["inspect".into(), ds.into()]),
        (
            "train",
            vec![
                "train".into(),
                ds.into(),
                "--device".into(),
                "cpu".into(),
                "--epochs".into(),
                "1".into(),
                "--out".into(),
                out.into(),
                "--quiet".into(),
            ],
        ),
        (
            "eval",
            vec![
                "eval".into(),
                s(&run_dir).into(),
                ds.into(),
                "--device".into(),
                "cpu".into(),
                "--split".into(),
                "train".into(),
            ],
        ),
        (
            "merge",
            vec![
                "merge".into(),
                format!("{out}-merged"),
                ds.into(),
                s(&other).into(),
            ],
        ),
    ]
}

#[test]
fn special_files_in_a_dataset_are_refused_by_every_reader() {
    let f = Fixture::new();
    for kind in KINDS {
        for what in ["manifest", "shard"] {
            // A part of a job, so that merge reads it as one; the other readers take it too.
            let ds = f.copy("part0", "victim");
            let path = match what {
                "manifest" => ds.join("manifest.json"),
                _ => first_shard(&ds),
            };
            plant(&path, kind);
            let out = f.root.join("out");
            for (cmd, args) in readers(&f, s(&ds), s(&out)) {
                let _ = std::fs::remove_dir_all(&out);
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                refused(&format!("{cmd} {what}"), &args, &path, kind);
            }
        }
    }
}

#[test]
fn special_files_in_a_run_folder_are_refused() {
    let f = Fixture::new();
    let ds = f.root.join("ds");
    for kind in KINDS {
        for file in ["config.json", "checkpoint.safetensors", "metrics.jsonl"] {
            let run_dir = f.copy("run", "victim-run");
            let path = run_dir.join(file);
            plant(&path, kind);
            if file != "metrics.jsonl" {
                refused(
                    &format!("eval {file}"),
                    &["eval", s(&run_dir), s(&ds), "--device", "cpu"],
                    &path,
                    kind,
                );
            }
            refused(
                &format!("train --resume, {file}"),
                &[
                    "train",
                    s(&ds),
                    "--resume",
                    s(&run_dir),
                    "--epochs",
                    "2",
                    "--device",
                    "cpu",
                ],
                &path,
                kind,
            );
        }
    }
}

#[test]
fn special_files_as_convert_inputs() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    for kind in KINDS {
        // A folder of images with one special entry among them: skipped with its reason under
        // --on-error skip (the default), the run stopped naming it under --on-error fail.
        let input = root.join("imgs");
        let _ = std::fs::remove_dir_all(&input);
        std::fs::create_dir_all(input.join("a")).unwrap();
        for i in 0..4u8 {
            image::GrayImage::from_pixel(8, 8, image::Luma([i * 40]))
                .save(input.join(format!("a/{i}.png")))
                .unwrap();
        }
        let bad = input.join("a/9.png");
        plant(&bad, kind);
        let out = root.join("out");
        let _ = std::fs::remove_dir_all(&out);
        let fail = [
            "convert",
            s(&input),
            "--out",
            s(&out),
            "--on-error",
            "fail",
            "--quiet",
        ];
        if matches!(kind, Kind::Directory) {
            // A folder named 9.png is a folder of the tree (empty), not a bad file.
            let (o, _) = run_bounded(&fail);
            assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        } else {
            refused("convert --on-error fail, an input", &fail, &bad, kind);
            let _ = std::fs::remove_dir_all(&out);
            let (o, secs) = run_bounded(&["convert", s(&input), "--out", s(&out), "--quiet"]);
            println!(
                "special_files | convert --on-error skip | {kind:?} | exit {:?} | {secs:.3} s",
                o.status.code()
            );
            assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
            let rejects = std::fs::read_to_string(out.join("rejects.jsonl")).unwrap();
            assert!(
                rejects.contains("9.png") && rejects.contains(kind.word()),
                "{rejects}"
            );
        }

        // The input itself.
        let single = root.join("single.png");
        plant(&single, kind);
        let _ = std::fs::remove_dir_all(&out);
        if !matches!(kind, Kind::Directory) {
            refused(
                "convert INPUT",
                &["convert", s(&single), "--out", s(&out), "--quiet"],
                &single,
                kind,
            );
        }

        // A labels CSV: like every other fault of one, a usage error (exit 2).
        let _ = std::fs::remove_file(input.join("a/9.png"))
            .or_else(|_| std::fs::remove_dir(input.join("a/9.png")));
        let csv = root.join("labels.csv");
        plant(&csv, kind);
        let _ = std::fs::remove_dir_all(&out);
        refused_with(
            2,
            "convert --labels",
            &[
                "convert",
                s(&input),
                "--out",
                s(&out),
                "--labels",
                s(&csv),
                "--quiet",
            ],
            &csv,
            kind,
        );
    }
}

#[test]
fn a_special_lock_file_does_not_stop_readers() {
    let f = Fixture::new();
    for kind in [Kind::Fifo, Kind::DevZero, Kind::Socket] {
        let ds = f.copy("ds", "locked");
        plant(&ds.join(".prep.lock"), kind);
        let (o, secs) = run_bounded(&["verify", s(&ds)]);
        println!(
            "special_files | verify, .prep.lock | {kind:?} | exit {:?} | {secs:.3} s",
            o.status.code()
        );
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        // A writer never writes into it: it refuses, naming it.
        let (o, _) = run_bounded(&["convert", s(&ds), "--out", s(&ds), "--force", "--quiet"]);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(stderr(&o).contains(".prep.lock"), "{}", stderr(&o));
    }
}

#[test]
fn inspect_names_missing_and_truncated_shards() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = tmp.path().join("ds");
    run(&synth(&ds, None), 0);
    let shard = first_shard(&ds);
    let len = std::fs::metadata(&shard).unwrap().len();

    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .unwrap();
    f.set_len(len - 10).unwrap();
    drop(f);
    let (o, _) = run_bounded(&["inspect", s(&ds)]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let want = format!(
        "{} is {} bytes, the manifest lists {len} (truncated)",
        s(&shard),
        len - 10
    );
    assert!(stderr(&o).contains(&want), "{}", stderr(&o));

    std::fs::remove_file(&shard).unwrap();
    let (o, _) = run_bounded(&["inspect", s(&ds), "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("{} is missing", s(&shard))),
        "{}",
        stderr(&o)
    );
    assert!(
        o.stdout.is_empty(),
        "no summary is printed for a dataset with files missing"
    );
}

#[test]
fn special_files_in_a_colmajor_dataset_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let src = root.join("cm");
    let mut args = synth(&src, None);
    args.extend(["--format".into(), "colmajor".into()]);
    run(&args, 0);
    for kind in KINDS {
        for file in ["images_train.bin", "labels_train.bin"] {
            let ds = root.join("victim");
            let _ = std::fs::remove_dir_all(&ds);
            copy_dir(&src, &ds);
            let path = ds.join(file);
            plant(&path, kind);
            let out = root.join("out");
            let _ = std::fs::remove_dir_all(&out);
            for args in [
                vec!["verify", s(&ds)],
                vec!["inspect", s(&ds)],
                vec![
                    "train",
                    s(&ds),
                    "--device",
                    "cpu",
                    "--epochs",
                    "1",
                    "--out",
                    s(&out),
                ],
                vec!["convert", s(&ds), "--out", s(&out)],
            ] {
                refused(&format!("{} colmajor {file}", args[0]), &args, &path, kind);
            }
        }
    }
}
