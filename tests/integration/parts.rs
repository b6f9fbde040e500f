//! Fan-out: `synth` and `convert` with `--part I/N`, and `prep merge` of the parts, against a
//! single run of the same command; and the errors of parts that do not go together.

use crate::util::*;
use image::{Rgb, RgbImage};
use prep::format::shard::Dataset;
use std::path::{Path, PathBuf};

const SYNTH: [&str; 14] = [
    "synth",
    "--train",
    "3000",
    "--test",
    "500",
    "--shape",
    "3x12x12",
    "--classes",
    "5",
    "--block-samples",
    "256",
    "--shard-blocks",
    "2",
    "--quiet",
];

/// Run `base` with `--out dir` and more arguments.
fn run_into(base: &[&str], dir: &Path, extra: &[&str], code: i32) -> std::process::Output {
    let mut args: Vec<&str> = base.to_vec();
    args.extend_from_slice(&["--out", dir.to_str().unwrap()]);
    args.extend_from_slice(extra);
    run(&args, code)
}

/// Parts 0..n of `base` in `root/p{i}`.
fn parts(base: &[&str], root: &Path, n: u32, extra: &[&str]) -> Vec<PathBuf> {
    (0..n)
        .map(|i| {
            let dir = root.join(format!("p{i}"));
            let part = format!("{i}/{n}");
            let mut e = extra.to_vec();
            e.extend_from_slice(&["--part", &part]);
            run_into(base, &dir, &e, 0);
            dir
        })
        .collect()
}

fn merge(out: &Path, parts: &[&Path], code: i32) -> std::process::Output {
    let mut args = vec!["merge", out.to_str().unwrap(), "--quiet"];
    args.extend(parts.iter().map(|p| p.to_str().unwrap()));
    run(&args, code)
}

fn manifest(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap()
}

/// A manifest without what depends on how it was made: the command line and the checksum that
/// covers it.
/// A manifest without what records how its command was run: the command line, and for a
/// conversion the digest of its request (a single run has one; a merge of parts, whose requests
/// each name a part, has none).
fn without_command(mut m: serde_json::Value) -> serde_json::Value {
    let o = m.as_object_mut().unwrap();
    o.remove("checksum");
    let p = o["provenance"].as_object_mut().unwrap();
    p.remove("command");
    if let Some(src) = p.get_mut("source").and_then(|s| s.as_object_mut()) {
        src.remove("request");
    }
    m
}

/// Every (pixels, label) of a split, in order.
fn samples(d: &Path, split: &str) -> Vec<(Vec<u8>, u32)> {
    let ds = Dataset::open(d).unwrap();
    let mut out = Vec::new();
    for info in ds
        .manifest
        .splits
        .get(split)
        .map_or(&[][..], |s| &s.shards[..])
    {
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

#[test]
fn synth_parts_merged_in_any_order_are_a_single_run_byte_for_byte() {
    let t = tempfile::tempdir().unwrap();
    let single = t.path().join("single");
    run_into(&SYNTH, &single, &[], 0);
    // 6 train shards of 512 samples (the last short) and 1 test shard: parts of 2 train shards
    // each, the test shard in part 2 only.
    let p = parts(&SYNTH, t.path(), 3, &[]);
    let m0 = manifest(&p[0]);
    assert_eq!(m0["part"]["index"], 0);
    assert_eq!(m0["part"]["count"], 3);
    assert_eq!(m0["part"]["of"], "samples");
    assert_eq!(
        m0["part"]["ranges"]["train"],
        serde_json::json!({"start": 0, "end": 1024, "total": 3000})
    );
    assert!(m0["splits"].get("test").is_none());
    assert_eq!(manifest(&p[2])["part"]["ranges"]["test"]["end"], 500);
    // A part is a dataset of its own, and resumes like one.
    run(&["verify", p[1].to_str().unwrap(), "--quiet"], 0);
    let o = run(&["inspect", p[1].to_str().unwrap()], 0);
    assert!(stdout(&o).contains("part 1 of 3 of job"), "{}", stdout(&o));
    let o = run_into(&SYNTH[..13], &p[1], &["--part", "1/3"], 0);
    assert!(stdout(&o).contains("nothing to do"), "{}", stdout(&o));
    // Killed mid-way: the manifest not yet written, a shard missing.
    std::fs::remove_file(p[1].join("train/train-00003.shard")).unwrap();
    std::fs::write(
        p[1].join(".prep-partial.json"),
        manifest(&p[1])["provenance"]["source"].to_string(),
    )
    .unwrap();
    std::fs::remove_file(p[1].join("manifest.json")).unwrap();
    run_into(&SYNTH, &p[1], &["--part", "1/3"], 0);

    let merged = t.path().join("merged");
    merge(&merged, &[&p[2], &p[0], &p[1]], 0);
    assert_eq!(shard_files(&merged), shard_files(&single));
    let (a, b) = (manifest(&merged), manifest(&single));
    assert!(a.get("part").is_none());
    assert_eq!(a["provenance"]["command"][1], "merge");
    assert_eq!(without_command(a), without_command(b));
    run(&["verify", merged.to_str().unwrap(), "--quiet"], 0);
    // The single run's command sees its own dataset in the merge.
    let o = run_into(&SYNTH[..13], &merged, &[], 0);
    assert!(stdout(&o).contains("nothing to do"), "{}", stdout(&o));
    // The parts are left whole: a second merge gives the same dataset.
    let again = t.path().join("again");
    merge(&again, &[&p[1], &p[2], &p[0]], 0);
    assert_eq!(shard_files(&again), shard_files(&single));
}

/// Three classes of small colour PNGs, each image different.
fn tree(root: &Path) {
    for (c, class) in ["cats", "dogs", "owls"].iter().enumerate() {
        for i in 0..9u32 {
            let path = root.join(class).join(format!("{class}{i:02}.png"));
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            RgbImage::from_fn(8, 8, |x, y| {
                Rgb([
                    (x * 29 + i * 7) as u8,
                    (y * 31 + c as u32 * 50) as u8,
                    (x ^ y) as u8 * 16,
                ])
            })
            .save(path)
            .unwrap();
        }
    }
    // Rejected by every part, listed once after the merge.
    std::fs::write(root.join("cats/notes.txt"), "not an image").unwrap();
}

#[test]
fn convert_parts_of_a_tree_merged_in_any_order_have_a_single_runs_samples() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("pets");
    tree(&src);
    let s = src.to_str().unwrap();
    let base = [
        "convert",
        s,
        "--test-fraction",
        "0.3",
        "--block-samples",
        "4",
        "--shard-blocks",
        "2",
        "--quiet",
    ];
    let single = t.path().join("single");
    run_into(&base, &single, &[], 0);
    let p = parts(&base, t.path(), 3, &[]);
    let m1 = manifest(&p[1]);
    assert_eq!(m1["part"]["of"], "inputs");
    assert_eq!(m1["classes"], manifest(&single)["classes"]);
    // The same part again has nothing to do; another part is refused where one already is, and
    // replaces it with --force.
    run_into(&base, &p[1], &["--part", "1/3"], 0);
    run_into(&base, &p[1], &["--part", "2/3"], 2);
    run_into(&base, &p[1], &["--part", "1/3", "--force"], 0);
    for order in [[0, 1, 2], [2, 0, 1]] {
        let merged = t.path().join(format!("merged{}", order[0]));
        merge(&merged, &order.map(|i| p[i].as_path()), 0);
        run(&["verify", merged.to_str().unwrap(), "--quiet"], 0);
        let m = manifest(&merged);
        assert!(m.get("part").is_none());
        assert_eq!(m["splits"].as_object().unwrap().len(), 2);
        for split in ["train", "test"] {
            let (a, b) = (samples(&merged, split), samples(&single, split));
            assert!(!b.is_empty());
            // The same samples in the same order: parts are ranges of the single run's inputs.
            assert_eq!(a, b, "{split}");
        }
        let (mut a, mut b) = (without_command(m), without_command(manifest(&single)));
        // Shards break at other samples, with the same statistics.
        for m in [&mut a, &mut b] {
            for s in m["splits"].as_object_mut().unwrap().values_mut() {
                s.as_object_mut().unwrap().remove("shards");
            }
        }
        assert_eq!(a, b);
        assert_eq!(
            std::fs::read_to_string(merged.join("rejects.jsonl")).unwrap(),
            std::fs::read_to_string(single.join("rejects.jsonl")).unwrap()
        );
    }
    // The same file names with one file changed are another job.
    let other = t.path().join("pets2");
    for (rel, bytes) in files(&src) {
        std::fs::create_dir_all(other.join(&rel).parent().unwrap()).unwrap();
        std::fs::write(other.join(rel), bytes).unwrap();
    }
    RgbImage::new(8, 8)
        .save(other.join("dogs/dogs03.png"))
        .unwrap();
    let mut args = base.to_vec();
    args[1] = other.to_str().unwrap();
    let changed = t.path().join("changed");
    run_into(&args, &changed, &["--part", "1/3"], 0);
    let o = merge(&t.path().join("no"), &[&p[0], &changed, &p[2]], 2);
    assert!(
        stderr(&o).contains(&format!(
            "{}: part 1 of 3 of another job",
            changed.display()
        )),
        "{}",
        stderr(&o)
    );
    // The merged dataset trains.
    let runs = t.path().join("run");
    let merged = t.path().join("merged0");
    let args = [
        "train",
        merged.to_str().unwrap(),
        "--device",
        "cpu",
        "--epochs",
        "1",
    ];
    let mut args = args.to_vec();
    args.extend_from_slice(&["--batch", "8", "--quiet", "--out", runs.to_str().unwrap()]);
    run(&args, 0);
}

fn write_idx(path: &Path, dims: &[u32], data: &[u8]) {
    let mut bytes = vec![0, 0, 8, dims.len() as u8];
    for d in dims {
        bytes.extend_from_slice(&d.to_be_bytes());
    }
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn convert_parts_of_idx_files_split_their_samples() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("digits");
    std::fs::create_dir(&src).unwrap();
    for (split, n) in [("train", 700u32), ("t10k", 100)] {
        let px: Vec<u8> = (0..n * 100)
            .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
            .collect();
        let lb: Vec<u8> = (0..n).map(|i| (i * 7 % 10) as u8).collect();
        write_idx(
            &src.join(format!("{split}-images-idx3-ubyte")),
            &[n, 10, 10],
            &px,
        );
        write_idx(&src.join(format!("{split}-labels-idx1-ubyte")), &[n], &lb);
    }
    let base = [
        "convert",
        src.to_str().unwrap(),
        "--block-samples",
        "64",
        "--quiet",
    ];
    let single = t.path().join("single");
    run_into(&base, &single, &[], 0);
    let p = parts(&base, t.path(), 3, &[]);
    let m = manifest(&p[1]);
    assert_eq!(m["part"]["of"], "samples");
    assert_eq!(
        m["part"]["ranges"]["train"],
        serde_json::json!({"start": 233, "end": 466, "total": 700})
    );
    assert_eq!(m["splits"]["train"]["samples"], 233);
    let merged = t.path().join("merged");
    merge(&merged, &[&p[1], &p[2], &p[0]], 0);
    run(&["verify", merged.to_str().unwrap(), "--quiet"], 0);
    for split in ["train", "test"] {
        assert_eq!(samples(&merged, split), samples(&single, split), "{split}");
    }
}

const SMALL: [&str; 12] = [
    "synth",
    "--train",
    "600",
    "--test",
    "100",
    "--shape",
    "1x8x8",
    "--block-samples",
    "64",
    "--shard-blocks",
    "2",
    "--quiet",
];

/// Merge `parts` into a new folder, expecting `code` and `want` in the message; nothing may be
/// left where OUT was to be.
fn refused(root: &Path, parts: &[&Path], code: i32, want: &[&str]) {
    let out = root.join("out");
    let o = merge(&out, parts, code);
    let e = stderr(&o);
    for w in want {
        assert!(e.contains(w), "wanted {w:?} in: {e}");
    }
    assert!(!out.exists(), "{} was left", out.display());
}

#[test]
fn parts_that_do_not_go_together_are_refused_by_name() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    let p = parts(&SMALL, root, 3, &[]);
    let name = |p: &Path| p.display().to_string();
    // Missing, duplicated.
    refused(root, &[&p[2], &p[0]], 2, &["missing part 1 of 3"]);
    refused(
        root,
        &[&p[0], &p[1], &p[2], &p[1]],
        2,
        &[&format!(
            "{} and {} are both part 1 of 3",
            name(&p[1]),
            name(&p[1])
        )],
    );
    // From another job (another seed), and from a job cut in another number of parts.
    let other = root.join("other");
    run_into(&SMALL, &other, &["--seed", "9", "--part", "1/3"], 0);
    refused(
        root,
        &[&p[0], &other, &p[2]],
        2,
        &[&name(&other), "part 1 of 3 of another job"],
    );
    let four = root.join("four");
    run_into(&SMALL, &four, &["--part", "3/4"], 0);
    refused(
        root,
        &[&p[0], &p[1], &p[2], &four],
        2,
        &[&name(&four), "part 3 of 4", "part 0 of 3"],
    );
    // Not a part at all.
    let whole = root.join("whole");
    run_into(&SMALL, &whole, &[], 0);
    refused(
        root,
        &[&p[0], &p[1], &whole],
        2,
        &[&name(&whole), "not a part"],
    );

    // Incomplete: a shard gone, a shard cut short, a generation not finished.
    let broken = root.join("broken");
    std::fs::create_dir(&broken).unwrap();
    let copy = |from: &Path| {
        let to = broken.join(from.file_name().unwrap());
        for (rel, bytes) in files(from) {
            std::fs::create_dir_all(to.join(&rel).parent().unwrap()).unwrap();
            std::fs::write(to.join(rel), bytes).unwrap();
        }
        to
    };
    let gone = copy(&p[1]);
    std::fs::remove_file(gone.join("train/train-00002.shard")).unwrap();
    refused(
        root,
        &[&p[0], &gone, &p[2]],
        1,
        &[&name(&gone), "incomplete", "train-00002.shard"],
    );
    std::fs::remove_dir_all(&gone).unwrap();
    let short = copy(&p[1]);
    let f = short.join("train/train-00001.shard");
    let len = std::fs::metadata(&f).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(len - 1)
        .unwrap();
    refused(
        root,
        &[&p[0], &short, &p[2]],
        1,
        &[&name(&short), "train-00001.shard"],
    );
    std::fs::remove_dir_all(&short).unwrap();
    let unfinished = copy(&p[2]);
    std::fs::write(unfinished.join(".prep-partial.json"), "{}").unwrap();
    refused(
        root,
        &[&p[0], &p[1], &unfinished],
        1,
        &[&name(&unfinished), "incomplete part", "not finished"],
    );

    // OUT must be new or empty; then it merges.
    let out = root.join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("x"), "").unwrap();
    let o = merge(&out, &[&p[0], &p[1], &p[2]], 2);
    assert!(stderr(&o).contains("not empty"), "{}", stderr(&o));
    std::fs::remove_file(out.join("x")).unwrap();
    merge(&out, &[&p[0], &p[1], &p[2]], 0);
    run(&["verify", out.to_str().unwrap(), "--quiet"], 0);
}

#[test]
fn bad_part_arguments_are_usage_errors() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("x");
    for (bad, want) in [
        ("3/3", "below the count 3"),
        ("0/0", "at least 1"),
        ("a/b", "'a' is not a whole number"),
        ("1", "no '/'"),
    ] {
        let o = run_into(&SMALL, &out, &["--part", bad], 2);
        assert!(stderr(&o).contains(want), "{bad}: {}", stderr(&o));
        let src = t.path().to_str().unwrap();
        let o = run(
            &[
                "convert",
                src,
                "--out",
                out.to_str().unwrap(),
                "--part",
                bad,
            ],
            2,
        );
        assert!(stderr(&o).contains(want), "{bad}: {}", stderr(&o));
        assert!(!out.exists());
    }
    // Column-major files cannot be appended: parts are shards.
    let o = run_into(&SMALL, &out, &["--part", "0/2", "--format", "colmajor"], 2);
    let e = stderr(&o);
    assert!(
        e.contains("--part writes shards") && !e.contains("  "),
        "{e}"
    );
}
