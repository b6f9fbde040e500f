//! A newcomer's first hour (issue 25, part C): class names where the files (or the user) say
//! them, a `--grid` that reads without the manifest, the CPU's memory checked and its run time
//! told, a killed run that `--force` starts afresh, and a `--help` where every flag means
//! something.

use crate::newcomer::{s, trained};
use crate::util::*;
use std::io::{BufRead, BufReader};
use std::path::Path;

fn write_idx(path: &Path, dims: &[u32], data: &[u8]) {
    let mut bytes = vec![0, 0, 8, dims.len() as u8];
    for d in dims {
        bytes.extend_from_slice(&d.to_be_bytes());
    }
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes).unwrap();
}

/// Fashion-MNIST's four files (tiny) in `dir`.
fn idx_dataset(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for (split, n) in [("train", 40u32), ("t10k", 10)] {
        let px: Vec<u8> = (0..n * 28 * 28).map(|i| (i % 251) as u8).collect();
        let labels: Vec<u8> = (0..n).map(|i| (i % 10) as u8).collect();
        write_idx(
            &dir.join(format!("{split}-images-idx3-ubyte")),
            &[n, 28, 28],
            &px,
        );
        write_idx(
            &dir.join(format!("{split}-labels-idx1-ubyte")),
            &[n],
            &labels,
        );
    }
}

fn classes(ds: &Path) -> Vec<String> {
    let v: serde_json::Value =
        serde_json::from_slice(&run(&["inspect", s(ds), "--json"], 0).stdout).unwrap();
    serde_json::from_value(v["classes"].clone()).unwrap()
}

#[test]
fn fashion_mnist_gets_its_class_names_and_any_dataset_takes_class_names() {
    let t = tempfile::tempdir().unwrap();
    let fm = t.path().join("fashion-mnist");
    idx_dataset(&fm);
    let out = t.path().join("fm");
    run(&["convert", s(&fm), "--out", s(&out), "--quiet"], 0);
    let c = classes(&out);
    assert_eq!(c[0], "T-shirt/top");
    assert_eq!(c[9], "Ankle boot");
    // Plain MNIST says nothing of names: digits stay digits.
    let mnist = t.path().join("mnist");
    idx_dataset(&mnist);
    let out = t.path().join("m");
    run(&["convert", s(&mnist), "--out", s(&out), "--quiet"], 0);
    assert_eq!(classes(&out)[3], "3");
    // --class-names, as a list and from a file.
    let names: Vec<String> = (0..10).map(|i| format!("digit {i}")).collect();
    let out = t.path().join("named");
    run(
        &[
            "convert",
            s(&mnist),
            "--out",
            s(&out),
            "--quiet",
            "--class-names",
            &names.join(","),
        ],
        0,
    );
    assert_eq!(classes(&out), names);
    let file = t.path().join("names.txt");
    std::fs::write(&file, format!("{}\n", names.join("\n"))).unwrap();
    let out = t.path().join("named-file");
    let at = format!("@{}", s(&file));
    run(
        &[
            "convert",
            s(&mnist),
            "--out",
            s(&out),
            "--quiet",
            "--class-names",
            &at,
        ],
        0,
    );
    assert_eq!(classes(&out), names);
    // The wrong number, or a name twice: refused before any work.
    let e = stderr(&run(
        &[
            "convert",
            s(&mnist),
            "--out",
            s(&t.path().join("x")),
            "--class-names",
            "a,b",
        ],
        2,
    ));
    assert!(
        e.contains("gives 2 names") && e.contains("10 classes"),
        "{e}"
    );
    let e = stderr(&run(
        &[
            "convert",
            s(&mnist),
            "--out",
            s(&t.path().join("y")),
            "--class-names",
            "a,a",
        ],
        2,
    ));
    assert!(e.contains("a is named twice"), "{e}");
}

#[test]
fn the_grid_picture_starts_each_row_with_its_class_name() {
    let t = tempfile::tempdir().unwrap();
    let fm = t.path().join("fashion-mnist");
    idx_dataset(&fm);
    let out = t.path().join("fm");
    run(&["convert", s(&fm), "--out", s(&out), "--quiet"], 0);
    let png = t.path().join("grid.png");
    run(
        &[
            "inspect",
            s(&out),
            "--grid",
            s(&png),
            "--per-class",
            "2",
            "--zoom",
            "1",
        ],
        0,
    );
    let img = image::open(&png).unwrap().to_rgb8();
    // Two 28-pixel cells a row, and a label column before them as wide as "T-shirt/top".
    let cells = 2 * 29 + 1;
    let label = img.width() - cells;
    assert!(label >= 11 * 6, "label column of {label} px");
    // Light text in the label column of every row (samples are drawn only right of it).
    for row in 0..10u32 {
        let (y0, y1) = (1 + row * 29, (row + 1) * 29);
        let lit = (0..label)
            .flat_map(|x| (y0..y1).map(move |y| (x, y)))
            .filter(|&(x, y)| img.get_pixel(x, y).0 == [235, 235, 235])
            .count();
        assert!(lit > 10, "row {row}: {lit} text pixels");
    }
}

#[test]
fn a_cpu_batch_too_large_for_memory_is_refused_before_the_first_step() {
    let t = tempfile::tempdir().unwrap();
    let ds = t.path().join("ds");
    run(
        &[
            "synth",
            "--train",
            "8192",
            "--test",
            "0",
            "--shape",
            "1x64x64",
            "-o",
            s(&ds),
            "--quiet",
        ],
        0,
    );
    let r = t.path().join("run");
    // resnet18 keeps about 25 MB a 64x64 sample: 8192 of them are far beyond any test machine.
    let e = stderr(&run(
        &[
            "train",
            s(&ds),
            "--device",
            "cpu",
            "--model",
            "resnet18",
            "--batch",
            "8192",
            "-o",
            s(&r),
        ],
        2,
    ));
    assert!(
        e.contains("of memory on the CPU") && e.contains("use --batch"),
        "{e}"
    );
    // Nothing is left that a rerun would stumble on.
    assert!(!r.join("config.json").exists());
}

#[test]
fn a_run_killed_before_its_first_checkpoint_is_started_afresh_with_force() {
    let t = tempfile::tempdir().unwrap();
    let (ds, r) = trained(t.path());
    // As the OOM killer leaves it: the config written, no checkpoint yet.
    std::fs::remove_file(r.join("checkpoint.safetensors")).unwrap();
    std::fs::remove_file(r.join("summary.json")).unwrap();
    let train = |extra: &[&str], code| {
        let mut a = vec![
            "train",
            s(&ds),
            "--device",
            "cpu",
            "--epochs",
            "1",
            "-o",
            s(&r),
        ];
        a.extend_from_slice(extra);
        stderr(&run(&a, code))
    };
    let e = train(&[], 2);
    assert!(
        e.contains("stopped before its first checkpoint") && e.contains("--force"),
        "{e}"
    );
    let e = stderr(&run(&["train", "--resume", s(&r)], 2));
    assert!(
        e.contains("nothing to continue") && e.contains("--force"),
        "{e}"
    );
    train(&["--force", "--quiet"], 0);
    assert!(r.join("summary.json").exists() && r.join("checkpoint.safetensors").exists());
    // --force over a finished run starts afresh too; without it the run is kept.
    let e = train(&[], 2);
    assert!(
        e.contains("already holds a run") && e.contains("--force"),
        "{e}"
    );
    train(&["--force", "--quiet"], 0);
    // Files that are not the run's stay.
    std::fs::write(r.join("notes.txt"), "mine").unwrap();
    train(&["--force", "--quiet"], 0);
    assert_eq!(
        std::fs::read_to_string(r.join("notes.txt")).unwrap(),
        "mine"
    );
}

#[test]
fn a_long_cpu_run_says_how_long_it_will_take() {
    let t = tempfile::tempdir().unwrap();
    let ds = t.path().join("ds");
    run(
        &[
            "synth",
            "--train",
            "4000",
            "--test",
            "400",
            "--shape",
            "1x28x28",
            "-o",
            s(&ds),
            "--quiet",
        ],
        0,
    );
    // 500 epochs of 4000 samples: minutes on any CPU, so the estimate is printed.
    let mut child = prep()
        .args([
            "train",
            s(&ds),
            "--device",
            "cpu",
            "--epochs",
            "500",
            "-o",
            s(&t.path().join("run")),
        ])
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let err = child.stderr.take().unwrap();
    let mut found = None;
    for line in BufReader::new(err).split(b'\n').map_while(Result::ok) {
        let line = String::from_utf8_lossy(&line).into_owned();
        if line.contains("on the CPU at") {
            found = Some(line);
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let line = found.expect("a line telling the CPU run's length");
    assert!(
        line.contains("samples/s this run needs about") && line.contains("--epochs 2"),
        "{line}"
    );
}

/// Every flag of every command says what it does in `--help` (not only a default).
#[test]
fn every_flag_in_help_has_a_meaning() {
    for cmd in [
        "synth", "convert", "train", "eval", "inspect", "verify", "plan", "merge",
    ] {
        let help = stdout(&run(&[cmd, "--help"], 0));
        let lines: Vec<&str> = help.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            let t = l.trim_start();
            if !(t.starts_with("--") || (t.starts_with('-') && t.chars().nth(2) == Some(',')))
                || l.starts_with("          ")
            {
                continue;
            }
            // Short help: the meaning follows the flag on its line, after two spaces; long
            // help: on the next line, indented further.
            let same = t.split_once("  ").map(|(_, m)| m.trim()).unwrap_or("");
            let next = lines.get(i + 1).copied().unwrap_or("");
            let meaning = if same.is_empty() {
                if next.starts_with("          ") {
                    next.trim_start()
                } else {
                    ""
                }
            } else {
                same
            };
            assert!(
                !meaning.is_empty() && !meaning.starts_with('[') && !meaning.starts_with('-'),
                "prep {cmd} --help: {t} has no meaning"
            );
        }
    }
}

/// The README's synopsis lists every flag each command has (`--help` being the reference).
#[test]
fn the_readme_synopsis_lists_every_flag() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let start = readme.find("## Commands").unwrap();
    let block = &readme[start..];
    let block = &block[block.find("```").unwrap() + 3..];
    let synopsis = &block[..block.find("```").unwrap()];
    let after = &block[block.find("```").unwrap()..];
    let globals = &after[..after.find("\n\n").unwrap_or(after.len())];
    for cmd in [
        "synth", "convert", "train", "eval", "inspect", "verify", "plan", "merge",
    ] {
        // The command's lines: from `prep CMD` to the next `prep `.
        let at = synopsis
            .find(&format!("prep {cmd}"))
            .unwrap_or_else(|| panic!("prep {cmd} is not in the synopsis"));
        let rest = &synopsis[at + 5..];
        let lines = &rest[..rest.find("prep ").unwrap_or(rest.len())];
        let help = stdout(&run(&[cmd, "--help"], 0));
        for l in help.lines() {
            let t = l.trim_start();
            let flag = t
                .split(|c: char| c == ' ' || c == ',' || c == '=')
                .find(|w| w.starts_with("--"));
            let Some(flag) = flag else { continue };
            if !(t.starts_with("--") || t.starts_with('-')) || flag == "--help" {
                continue;
            }
            let listed = |text: &str| {
                text.match_indices(flag).any(|(i, _)| {
                    !text[i + flag.len()..]
                        .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-')
                })
            };
            assert!(
                listed(lines) || listed(globals),
                "README synopsis of prep {cmd} leaves out {flag}"
            );
        }
    }
}
