//! `prep synth --task mask|labels|values`: each sample carries a field beside its image and class,
//! computed from what the renderer drew. The images and classes are those of `--task class`; the
//! targets agree with each other and with the pixels; the datasets verify, resume and repeat
//! byte for byte.

use crate::util::*;
use prep::format::fields::{Field, FieldKind};
use prep::format::shard::{Dataset, Dtype};
use prep::synth::{split_id, Generator, Version};
use std::path::{Path, PathBuf};

/// `synth` of 300 train and 50 test samples of 3x16x16 (blocks of 64, shards of 2 blocks), 10
/// classes, seed 5, into `dir/name`, with `extra` arguments.
fn synth(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let mut args = vec![
        "synth",
        "--train",
        "300",
        "--test",
        "50",
        "--shape",
        "3x16x16",
        "--seed",
        "5",
        "--block-samples",
        "64",
        "--shard-blocks",
        "2",
        "--quiet",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    run(&args, 0);
    out
}

/// Every sample of `split`, in order: (pixels, class, the first field's bytes or nothing).
fn samples(dir: &Path, split: &str) -> Vec<(Vec<u8>, u32, Vec<u8>)> {
    let ds = Dataset::open(dir).unwrap();
    let fields = ds.manifest.fields.clone();
    let mut out = Vec::new();
    for sh in &ds.manifest.splits[split].shards {
        let r = ds.open_shard(sh).unwrap();
        for b in 0..r.num_blocks() {
            let block = r.read_block(b).unwrap();
            for i in 0..block.len() {
                let f = if fields.is_empty() {
                    Vec::new()
                } else {
                    block.field(&fields, 0, i).to_vec()
                };
                out.push((block.sample(i).to_vec(), block.label(i), f));
            }
        }
    }
    out
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn class_names() -> Vec<String> {
    let kinds = ["stripes", "checks", "rings", "dots", "zigzag", "plaid"];
    (0..10)
        .map(|k| format!("{k:02}-{}", kinds[k % 6]))
        .collect()
}

/// The field each task declares for 10 classes of 3x16x16.
fn expected_field(task: &str) -> Field {
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    match task {
        "mask" => {
            let mut names = vec!["background".to_string()];
            names.extend(class_names());
            Field::mask("mask", &[3, 16, 16], Dtype::U8, names)
        }
        "labels" => Field::labels(
            "labels",
            s(&["stripes", "checks", "rings", "dots", "zigzag", "plaid"]),
        ),
        _ => Field::values("values", s(&["area", "distractors"])),
    }
}

#[test]
fn every_task_verifies_declares_its_field_and_keeps_the_class_tasks_images() {
    let t = tempfile::tempdir().unwrap();
    let class = synth(t.path(), "class", &[]);
    let m = Dataset::open(&class).unwrap().manifest;
    assert!(m.fields.is_empty() && m.version < 3);
    assert!(
        m.provenance.source.get("task").is_none(),
        "class records no task"
    );
    for task in ["mask", "labels", "values"] {
        let d = synth(t.path(), task, &["--task", task]);
        let o = run(&["verify", d.to_str().unwrap()], 0);
        assert!(stdout(&o).contains("OK"), "{}", stdout(&o));
        let m = Dataset::open(&d).unwrap().manifest;
        assert_eq!(m.version, 3, "{task}");
        assert_eq!(m.fields.0, vec![expected_field(task)], "{task}");
        assert_eq!(m.provenance.source["task"], task);
        for split in ["train", "test"] {
            let (a, b) = (samples(&class, split), samples(&d, split));
            assert_eq!(a.len(), b.len());
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                assert!(x.0 == y.0 && x.1 == y.1, "{task} {split} sample {i}");
                assert_eq!(y.2.len(), m.fields.0[0].bytes());
            }
        }
        // A second run writes the same bytes.
        let again = synth(t.path(), &format!("{task}-again"), &["--task", task]);
        assert!(shard_files(&d) == shard_files(&again), "{task}");
        let o = run(&["inspect", d.to_str().unwrap()], 0);
        let kind = m.fields.0[0].kind.name();
        assert!(
            stdout(&o).contains(&format!("field {task} ({kind}")),
            "{}",
            stdout(&o)
        );
    }
}

/// How far apart the mean colours of `pixels` (3 planes of 16x16) are where `mask` is set and where
/// it is not: the sum over the channels of the difference of the means, in pixel levels.
fn split_colours(pixels: &[u8], mask: &[u8]) -> f64 {
    let mean = |ch: &[u8], inside: bool| {
        let sel: Vec<f64> = ch
            .iter()
            .zip(mask)
            .filter(|(_, &m)| (m != 0) == inside)
            .map(|(&p, _)| p as f64)
            .collect();
        sel.iter().sum::<f64>() / sel.len().max(1) as f64
    };
    pixels
        .chunks(256)
        .map(|ch| (mean(ch, true) - mean(ch, false)).abs())
        .sum()
}

#[test]
fn mask_marks_where_the_class_pattern_shows() {
    let t = tempfile::tempdir().unwrap();
    // Difficulty 1: every sample has a distractor, often over the class's disc.
    let d = synth(t.path(), "mask", &["--task", "mask", "--difficulty", "1"]);
    let g = Generator::with_version(
        "3x16x16".parse().unwrap(),
        10,
        5,
        Version::V2 { difficulty: 1.0 },
    )
    .unwrap();
    let ds = Dataset::open(&d).unwrap();
    for split in ["train", "test"] {
        let mut counts = vec![0u64; 11];
        let (mut gap_true, mut gap_other, mut wins) = (0.0f64, 0.0f64, 0);
        let all = samples(&d, split);
        let (mut scratch, mut px) = (Vec::new(), vec![0u8; 768]);
        for (i, (pixels, class, mask)) in all.iter().enumerate() {
            let want = *class as u8 + 1;
            assert!(mask.iter().all(|&v| v == 0 || v == want), "sample {i}");
            let shown = mask.iter().filter(|&&v| v == want).count();
            assert!(shown > 16, "sample {i}: the class shows on {shown} pixels");
            mask.iter().for_each(|&v| counts[v as usize] += 1);
            // Nothing beyond the radius of the disc the renderer drew is marked.
            let s = g.render_scene(split_id(split), i as u64, &mut px, &mut scratch);
            assert_eq!((&px, s.label), (pixels, *class));
            let r = s.main.radius * 16.0;
            for (p, &v) in mask.iter().enumerate() {
                let (dx, dy) = (
                    (p % 16) as f32 + 0.5 - s.main.cx,
                    (p / 16) as f32 + 0.5 - s.main.cy,
                );
                if dx * dx + dy * dy > r * r {
                    assert_eq!(v, 0, "sample {i}, pixel {p}");
                }
            }
            // The pixels agree: where the mask marks the class, the pattern is drawn between
            // the two colours; elsewhere the pixels are the background colour (and noise), so the
            // colours inside and outside differ, far more than across another sample's mask.
            let other = &all[(i + 1) % all.len()].2;
            let (a, b) = (split_colours(pixels, mask), split_colours(pixels, other));
            gap_true += a;
            gap_other += b;
            wins += (a > b) as usize;
        }
        // The manifest's summary is these pixels' counts.
        assert_eq!(
            ds.manifest.splits[split].fields[0].counts, counts,
            "{split}"
        );
        assert_eq!(counts.iter().sum::<u64>(), all.len() as u64 * 256);
        assert!(
            gap_true > 1.4 * gap_other && wins * 10 > all.len() * 7,
            "{split}: colour gap across the mask {gap_true:.0}, across another sample's \
             {gap_other:.0}; larger in {wins} of {}",
            all.len()
        );
    }
}

#[test]
fn labels_and_values_agree_with_each_other_and_with_the_mask() {
    let t = tempfile::tempdir().unwrap();
    let args = |task| ["--task", task, "--difficulty", "0.7"];
    let (mask, labels, values) = (
        samples(&synth(t.path(), "m", &args("mask")), "train"),
        samples(&synth(t.path(), "l", &args("labels")), "train"),
        synth(t.path(), "v", &args("values")),
    );
    let ds = Dataset::open(&values).unwrap();
    let values = samples(&values, "train");
    let (mut with, mut without) = (0, 0);
    let (mut sum, mut min, mut max) = ([0f64; 2], [f64::MAX; 2], [f64::MIN; 2]);
    let mut label_counts = [0u64; 6];
    for (i, ((m, l), v)) in mask.iter().zip(&labels).zip(&values).enumerate() {
        let class = m.1;
        let v = f32s(&v.2);
        let (area, distractors) = (v[0], v[1]);
        assert!(area > 0.1 && area < 0.8, "sample {i}: area {area}");
        assert!(
            distractors == 0.0 || distractors == 1.0,
            "sample {i}: {distractors}"
        );
        // The class's kind is always drawn; a distractor may add one more.
        assert_eq!(l.2[(class % 6) as usize], 1, "sample {i}: {:?}", l.2);
        let hot = l.2.iter().filter(|&&b| b == 1).count();
        assert!(
            hot >= 1 && hot <= 1 + distractors as usize,
            "sample {i}: {:?}",
            l.2
        );
        l.2.iter()
            .enumerate()
            .for_each(|(k, &b)| label_counts[k] += b as u64);
        // The area is the mask's disc before distractors cover some of it.
        let shown = m.2.iter().filter(|&&p| p != 0).count();
        let covered = (area as f64 * 256.0).round() as usize;
        if distractors == 0.0 {
            assert_eq!(shown, covered, "sample {i}");
            without += 1;
        } else {
            assert!(shown <= covered, "sample {i}: {shown} > {covered}");
            with += 1;
        }
        for k in 0..2 {
            sum[k] += v[k] as f64;
            min[k] = min[k].min(v[k] as f64);
            max[k] = max[k].max(v[k] as f64);
        }
    }
    assert!(
        with > 100 && without > 50,
        "{with} with distractors, {without} without"
    );
    let st = &ds.manifest.splits["train"].fields[0];
    assert_eq!(
        (st.sum.clone(), st.min.clone(), st.max.clone()),
        (sum.to_vec(), min.to_vec(), max.to_vec())
    );
    let lm = Dataset::open(t.path().join("l")).unwrap().manifest;
    assert_eq!(lm.splits["train"].fields[0].counts, label_counts);

    // Without distractors (difficulty 0) the labels are the class's kind alone.
    let l0 = samples(
        &synth(t.path(), "l0", &["--task", "labels", "--difficulty", "0"]),
        "test",
    );
    for (i, (_, class, l)) in l0.iter().enumerate() {
        let mut want = vec![0u8; 6];
        want[(*class % 6) as usize] = 1;
        assert_eq!(l, &want, "sample {i}");
    }
}

#[test]
fn generator_1_has_every_task_too() {
    let t = tempfile::tempdir().unwrap();
    let d = synth(t.path(), "m1", &["--task", "mask", "--generator", "1"]);
    run(&["verify", d.to_str().unwrap()], 0);
    let plain = samples(&synth(t.path(), "c1", &["--generator", "1"]), "train");
    for (i, (a, b)) in samples(&d, "train").iter().zip(&plain).enumerate() {
        assert!(a.0 == b.0 && a.1 == b.1, "sample {i}");
        assert!(a.2.iter().any(|&v| v as u32 == a.1 + 1), "sample {i}");
    }
    let v = synth(t.path(), "v1", &["--task", "values", "--generator", "1"]);
    let st = &Dataset::open(&v).unwrap().manifest.splits["train"].fields[0];
    assert_eq!(st.max[1], 0.0, "version 1 draws no distractors");
}

#[test]
fn class_task_is_the_default_and_unchanged() {
    let t = tempfile::tempdir().unwrap();
    let a = synth(t.path(), "a", &[]);
    let b = synth(t.path(), "b", &["--task", "class"]);
    assert!(shard_files(&a) == shard_files(&b));
    let (ma, mut mb) = (
        Dataset::open(&a).unwrap().manifest,
        Dataset::open(&b).unwrap().manifest,
    );
    mb.provenance.command = ma.provenance.command.clone();
    mb.checksum = ma.checksum.clone();
    assert_eq!(ma, mb);
    // Another task in the same folder is another dataset: refused without --force.
    let o = run(
        &[
            "synth",
            "--train",
            "300",
            "--test",
            "50",
            "--shape",
            "3x16x16",
            "--seed",
            "5",
            "--block-samples",
            "64",
            "--shard-blocks",
            "2",
            "--task",
            "mask",
            "--out",
            a.to_str().unwrap(),
        ],
        2,
    );
    assert!(
        stderr(&o).contains("task: unset there, mask asked"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn colmajor_with_a_task_is_refused() {
    let t = tempfile::tempdir().unwrap();
    for task in ["mask", "labels", "values"] {
        let out = t.path().join(task);
        let o = run(
            &[
                "synth",
                "--train",
                "100",
                "--task",
                task,
                "--format",
                "colmajor",
                "--out",
                out.to_str().unwrap(),
            ],
            2,
        );
        let e = stderr(&o);
        assert!(e.contains("column-major") && e.contains("fields"), "{e}");
        assert!(!out.join("manifest.json").exists());
    }
    // Class datasets still go column-major.
    run(
        &[
            "synth",
            "--train",
            "100",
            "--test",
            "10",
            "--format",
            "colmajor",
            "--quiet",
            "--out",
            t.path().join("cm").to_str().unwrap(),
        ],
        0,
    );
}

#[test]
fn an_interrupted_task_run_resumes_with_the_same_summaries() {
    let t = tempfile::tempdir().unwrap();
    for task in ["mask", "values"] {
        let clean = synth(t.path(), &format!("{task}-clean"), &["--task", task]);
        // What a crash leaves: the marker with the parameters, some shards, no manifest.
        let d = synth(t.path(), task, &["--task", task]);
        let m = Dataset::open(&d).unwrap().manifest;
        std::fs::write(
            d.join(".prep-partial.json"),
            serde_json::to_string_pretty(&m.provenance.source).unwrap(),
        )
        .unwrap();
        std::fs::remove_file(d.join("manifest.json")).unwrap();
        std::fs::remove_file(d.join("train/train-00001.shard")).unwrap();
        let rerun = || {
            let o = run(
                &[
                    "synth",
                    "--train",
                    "300",
                    "--test",
                    "50",
                    "--shape",
                    "3x16x16",
                    "--seed",
                    "5",
                    "--block-samples",
                    "64",
                    "--shard-blocks",
                    "2",
                    "--task",
                    task,
                    "--json",
                    "--out",
                    d.to_str().unwrap(),
                ],
                0,
            );
            serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
        };
        let r = rerun();
        assert_eq!(
            (r["shards_written"].as_u64(), r["shards_reused"].as_u64()),
            (Some(1), Some(3)),
            "{task}"
        );
        assert!(shard_files(&d) == shard_files(&clean), "{task}");
        let (mut a, b) = (
            Dataset::open(&clean).unwrap().manifest,
            Dataset::open(&d).unwrap().manifest,
        );
        a.provenance.command = b.provenance.command.clone();
        a.checksum = b.checksum.clone();
        assert_eq!(
            a, b,
            "{task}: kept shards' summaries are those of a single run"
        );
        assert_eq!(b.splits["train"].fields.len(), 1, "{task}");
        // Once complete, the same command has nothing to do.
        assert_eq!(rerun()["already_complete"], true, "{task}");
    }
}

#[test]
fn parts_of_a_task_are_a_single_runs_shards() {
    let t = tempfile::tempdir().unwrap();
    let single = synth(t.path(), "single", &["--task", "mask"]);
    let whole = shard_files(&single);
    let mut joined = Vec::new();
    for i in 0..2 {
        let p = synth(
            t.path(),
            &format!("p{i}"),
            &["--task", "mask", "--part", &format!("{i}/2")],
        );
        run(&["verify", p.to_str().unwrap()], 0);
        let m = Dataset::open(&p).unwrap().manifest;
        assert_eq!(m.fields.0[0].kind, FieldKind::Mask);
        assert_eq!(m.provenance.source["task"], "mask");
        joined.extend(shard_files(&p));
    }
    joined.sort();
    assert!(joined == whole, "the parts' shards are the single run's");
}

/// `prep merge` keeps the parts' fields: the merged dataset is the single run's.
#[test]
fn merged_parts_of_a_task_are_a_single_run() {
    let t = tempfile::tempdir().unwrap();
    let single = synth(t.path(), "single", &["--task", "mask"]);
    let parts: Vec<PathBuf> = (0..2)
        .map(|i| {
            synth(
                t.path(),
                &format!("p{i}"),
                &["--task", "mask", "--part", &format!("{i}/2")],
            )
        })
        .collect();
    let out = t.path().join("merged");
    run(
        &[
            "merge",
            out.to_str().unwrap(),
            parts[1].to_str().unwrap(),
            parts[0].to_str().unwrap(),
        ],
        0,
    );
    run(&["verify", out.to_str().unwrap()], 0);
    assert!(shard_files(&out) == shard_files(&single));
    let (mut a, b) = (
        Dataset::open(&single).unwrap().manifest,
        Dataset::open(&out).unwrap().manifest,
    );
    a.provenance.command = b.provenance.command.clone();
    a.checksum = b.checksum.clone();
    assert_eq!(a, b);
}
