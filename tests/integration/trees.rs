//! `prep convert` on folders as people keep them: flat folders and single files of every kind,
//! labels CSVs, `--label-from`, mixed layouts, and channels decided from every input.

use crate::scans::{dicom, nifti, ramp, write};
use crate::util::*;
use crate::video::{clip, ffmpeg_or_skip};
use image::{GrayImage, Luma, Rgb, RgbImage};
use std::path::{Path, PathBuf};

fn inspect(out: &Path) -> serde_json::Value {
    let o = run(&["inspect", out.to_str().unwrap(), "--json"], 0);
    serde_json::from_slice(&o.stdout).expect("inspect --json prints JSON")
}

/// Samples over all splits, and per class.
fn totals(v: &serde_json::Value) -> (u64, Vec<u64>) {
    let mut total = 0;
    let mut per_class = vec![0u64; v["classes"].as_array().unwrap().len()];
    for s in v["splits"].as_array().unwrap() {
        total += s["samples"].as_u64().unwrap();
        for (k, c) in s["class_counts"].as_array().unwrap().iter().enumerate() {
            per_class[k] += c.as_u64().unwrap();
        }
    }
    (total, per_class)
}

fn rejects(out: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("rejects.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect()
}

fn grey(path: &Path, w: u32, h: u32, v: u8) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    GrayImage::from_fn(w, h, |x, y| Luma([v.wrapping_add((x * 3 + y) as u8)]))
        .save(path)
        .unwrap();
}

fn colour(path: &Path, w: u32, h: u32) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    RgbImage::from_fn(w, h, |x, y| {
        Rgb([(x as u8).wrapping_mul(9), (y as u8).wrapping_mul(7), 200])
    })
    .save(path)
    .unwrap();
}

/// A TIFF stack of `pages` grey 12x10 pages.
fn tiff_stack(path: &Path, pages: u8) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let f = std::fs::File::create(path).unwrap();
    let mut enc = tiff::encoder::TiffEncoder::new(f).unwrap();
    for p in 0..pages {
        enc.write_image::<tiff::encoder::colortype::Gray8>(12, 10, &[p * 40; 120])
            .unwrap();
    }
}

/// A 4 x 5 x 6 volume: 6 axial slices.
fn volume(path: &Path, seed: i16) {
    let vox: Vec<i16> = (0..120).map(|i| (i * 7 + seed) % 113 - 20).collect();
    nifti(path, &[4, 5, 6], &vox);
}

/// Flat folders of every file kind, as `(folder, samples)`: the files stand directly inside.
fn flat_folders(root: &Path) -> Vec<(PathBuf, u64)> {
    let photos = root.join("photos");
    for i in 0..4 {
        grey(&photos.join(format!("p{i}.png")), 16, 16, i * 30);
    }
    let stacks = root.join("stacks");
    tiff_stack(&stacks.join("a.tif"), 3);
    tiff_stack(&stacks.join("b.tiff"), 2);
    let brains = root.join("brains");
    for i in 0..4 {
        volume(&brains.join(format!("sub{i}.nii.gz")), i);
    }
    let ct = root.join("ct");
    write(&ct.join("a.dcm"), &dicom(16, 16, 1, &ramp(256, 1)));
    write(&ct.join("b.dcm"), &dicom(16, 16, 3, &ramp(768, 2)));
    // No extension: found by its DICM marker.
    write(&ct.join("IM0001"), &dicom(16, 16, 1, &ramp(256, 3)));
    vec![(photos, 4), (stacks, 5), (brains, 24), (ct, 5)]
}

#[test]
fn flat_folders_of_every_kind_convert_as_one_class() {
    let t = tempfile::tempdir().unwrap();
    for (dir, samples) in flat_folders(t.path()) {
        let name = dir.file_name().unwrap().to_str().unwrap().to_string();
        let out = t.path().join(format!("out-{name}"));
        let o = run(
            &[
                "convert",
                dir.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ],
            0,
        );
        let e = stderr(&o);
        // Four images may all hash into train, and four volumes give 1 of 4 to test: a
        // warning then says so.
        // (Volumes add a line on their orientation.)
        let lines = e
            .lines()
            .filter(|l| !l.starts_with("warning: ") && !l.starts_with("volumes: "))
            .count();
        assert!(
            e.contains(&format!("one class \"{name}\"")) && lines == 1,
            "{name}: {e}"
        );
        let v = inspect(&out);
        assert_eq!(v["classes"], serde_json::json!([name]), "{v}");
        assert_eq!(totals(&v), (samples, vec![samples]), "{name}: {v}");
        assert!(rejects(&out).is_empty(), "{name}: {:?}", rejects(&out));
        // --quiet says nothing but warnings (here: an empty test split, where the hash of the
        // four paths put none in test).
        let out = t.path().join(format!("quiet-{name}"));
        let o = run(
            &[
                "convert",
                dir.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
                "--quiet",
            ],
            0,
        );
        let e = stderr(&o);
        assert!(e.lines().all(|l| l.starts_with("warning: ")), "{name}: {e}");
    }
}

#[test]
fn flat_folder_of_videos_is_one_class() {
    let Some(ff) = ffmpeg_or_skip() else { return };
    let t = tempfile::tempdir().unwrap();
    let clips = t.path().join("clips");
    clip(&ff, &clips.join("a.mp4"), "1", &[]);
    clip(&ff, &clips.join("b.avi"), "1", &["-c:v", "mpeg4"]);
    // A grey stream (its pixel format says so), decoded to RGB like any other.
    clip(
        &ff,
        &clips.join("g.mkv"),
        "1",
        &["-pix_fmt", "gray", "-c:v", "ffv1"],
    );
    let out = t.path().join("out");
    let o = run(
        &[
            "convert",
            clips.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--size",
            "24x32",
        ],
        0,
    );
    let e = stderr(&o);
    assert!(e.contains("one class \"clips\""), "{e}");
    assert!(e.contains("channels: 3 (2 colour inputs, 1 grey)"), "{e}");
    let v = inspect(&out);
    assert_eq!(v["classes"], serde_json::json!(["clips"]));
    assert_eq!(v["shape"], serde_json::json!([3, 24, 32]));
    assert_eq!(totals(&v), (30, vec![30]));

    // A labels CSV labels videos too.
    let csv = t.path().join("labels.csv");
    std::fs::write(&csv, "path,label\na.mp4,walk\nb.avi,run\n").unwrap();
    let out = t.path().join("csv");
    run(
        &[
            "convert",
            clips.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--size",
            "24x32",
            "--labels",
            csv.to_str().unwrap(),
            "--quiet",
        ],
        0,
    );
    let v = inspect(&out);
    assert_eq!(v["classes"], serde_json::json!(["run", "walk"]));
    assert_eq!(totals(&v), (20, vec![10, 10]));
}

#[test]
fn single_file_is_a_tree_of_one() {
    let t = tempfile::tempdir().unwrap();
    let brain = t.path().join("scans/brain.nii.gz");
    volume(&brain, 0);
    let out = t.path().join("out");
    let o = run(
        &[
            "convert",
            brain.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
        0,
    );
    assert!(stderr(&o).contains("one class \"brain\""), "{}", stderr(&o));
    let v = inspect(&out);
    assert_eq!(v["classes"], serde_json::json!(["brain"]));
    assert_eq!(v["shape"], serde_json::json!([1, 5, 4]));
    assert_eq!(totals(&v).0, 6);

    // A bad single file is named by its own path, and --labels paths are relative to its folder.
    let bad = t.path().join("scans/bad.png");
    std::fs::write(&bad, b"not a png").unwrap();
    let o = run(
        &[
            "convert",
            bad.to_str().unwrap(),
            "--out",
            t.path().join("out2").to_str().unwrap(),
            "--on-error",
            "fail",
            "--quiet",
        ],
        1,
    );
    assert!(
        stderr(&o).contains(bad.to_str().unwrap()) && !stderr(&o).contains("bad.png/bad.png"),
        "{}",
        stderr(&o)
    );
    let csv = t.path().join("labels.csv");
    std::fs::write(&csv, "brain.nii.gz,tumour\n").unwrap();
    let out = t.path().join("out3");
    run(
        &[
            "convert",
            brain.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--labels",
            csv.to_str().unwrap(),
            "--quiet",
        ],
        0,
    );
    assert_eq!(inspect(&out)["classes"], serde_json::json!(["tumour"]));
    assert!(rejects(&out).is_empty(), "{:?}", rejects(&out));
}

#[test]
fn labels_csv_labels_every_kind_of_file() {
    let t = tempfile::tempdir().unwrap();
    for (dir, samples) in flat_folders(t.path()) {
        let name = dir.file_name().unwrap().to_str().unwrap().to_string();
        // Alternate files into classes "a" and "b"; one file moved into a sub-folder to show
        // that CSV paths reach into the tree.
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        let last = files.pop().unwrap();
        std::fs::create_dir(dir.join("sub")).unwrap();
        std::fs::rename(dir.join(&last), dir.join("sub").join(&last)).unwrap();
        files.push(format!("sub/{last}"));
        let mut csv = String::from("path,label\n");
        for (i, f) in files.iter().enumerate() {
            csv.push_str(&format!("{f},{}\n", if i % 2 == 0 { "a" } else { "b" }));
        }
        let csv_path = t.path().join(format!("{name}.csv"));
        std::fs::write(&csv_path, csv).unwrap();
        let out = t.path().join(format!("out-{name}"));
        run(
            &[
                "convert",
                dir.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
                "--labels",
                csv_path.to_str().unwrap(),
                "--quiet",
            ],
            0,
        );
        let v = inspect(&out);
        assert_eq!(v["classes"], serde_json::json!(["a", "b"]), "{name}: {v}");
        let (total, per_class) = totals(&v);
        assert_eq!(total, samples, "{name}: {v}");
        assert!(per_class.iter().all(|&c| c > 0), "{name}: {v}");
        assert!(rejects(&out).is_empty(), "{name}: {:?}", rejects(&out));
    }
}

#[test]
fn mixed_layout_is_refused_naming_both() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("photos");
    grey(&root.join("loose.png"), 8, 8, 0);
    grey(&root.join("cats/a.png"), 8, 8, 1);
    grey(&root.join("dogs/b.png"), 8, 8, 2);
    let out = t.path().join("out");
    let o = run(
        &[
            "convert",
            root.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
        2,
    );
    let e = stderr(&o);
    assert!(
        e.contains("loose.png") && e.contains("cats/") && e.contains("--label-from"),
        "{e}"
    );
    assert!(!out.join("manifest.json").exists());

    // Labelled by a regex, the same folder converts (the loose file does not match: rejected).
    let o = run(
        &[
            "convert",
            root.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--label-from",
            "^([^/]+)/",
            "--test-fraction",
            "0",
        ],
        0,
    );
    assert_eq!(
        inspect(&out)["classes"],
        serde_json::json!(["cats", "dogs"])
    );
    let r = rejects(&out);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0]["path"], "loose.png");
    assert!(stderr(&o).contains("loose.png"), "{}", stderr(&o));

    // A stray non-image file beside class sub-folders is no mixed layout, only a reject.
    std::fs::remove_file(root.join("loose.png")).unwrap();
    std::fs::write(root.join("README.txt"), "notes").unwrap();
    let out = t.path().join("out2");
    run(
        &[
            "convert",
            root.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--quiet",
        ],
        0,
    );
    assert_eq!(
        inspect(&out)["classes"],
        serde_json::json!(["cats", "dogs"])
    );
    assert_eq!(rejects(&out)[0]["path"], "README.txt");
}

#[test]
fn label_from_takes_the_first_group_and_rejects_misses() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("pets");
    for f in ["cat_01.png", "cat_02.png", "dog_01.png", "dog_7.png"] {
        grey(&root.join(f), 8, 8, 10);
    }
    grey(&root.join("notes-x.png"), 8, 8, 10);
    grey(&root.join("old/cat_03.png"), 8, 8, 10);
    let out = t.path().join("out");
    run(
        &[
            "convert",
            root.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--label-from",
            r"^(\w+)_\d+\.png$",
            "--quiet",
        ],
        0,
    );
    let v = inspect(&out);
    assert_eq!(v["classes"], serde_json::json!(["cat", "dog"]));
    assert_eq!(totals(&v), (4, vec![2, 2]));
    let r = rejects(&out);
    let paths: Vec<&str> = r.iter().map(|x| x["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["notes-x.png", "old/cat_03.png"], "{r:?}");
    assert!(
        r.iter().all(|x| x["reason"]
            .as_str()
            .unwrap()
            .contains("does not match --label-from")),
        "{r:?}"
    );

    // A directory component, deeper than the first.
    let scans = t.path().join("scans");
    write(
        &scans.join("p1/tumour/a.dcm"),
        &dicom(16, 16, 1, &ramp(256, 1)),
    );
    write(
        &scans.join("p2/normal/b.dcm"),
        &dicom(16, 16, 1, &ramp(256, 2)),
    );
    write(
        &scans.join("p2/tumour/c.dcm"),
        &dicom(16, 16, 1, &ramp(256, 3)),
    );
    let out = t.path().join("out2");
    run(
        &[
            "convert",
            scans.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--label-from",
            "^[^/]+/([^/]+)/",
            "--quiet",
        ],
        0,
    );
    let v = inspect(&out);
    assert_eq!(v["classes"], serde_json::json!(["normal", "tumour"]));
    assert_eq!(totals(&v), (3, vec![1, 2]));
}

#[test]
fn bad_label_flags_are_usage_errors_before_any_work() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("pets");
    grey(&root.join("cat_1.png"), 8, 8, 0);
    let csv = t.path().join("labels.csv");
    std::fs::write(&csv, "cat_1.png,cat\n").unwrap();
    let out = t.path().join("out");
    let (r, o) = (root.to_str().unwrap(), out.to_str().unwrap());
    for (args, says) in [
        (vec!["--label-from", r"^(\w+_\d+\.png$"], "--label-from"),
        (vec!["--label-from", r"^\w+_\d+\.png$"], "no capture group"),
        (
            vec!["--label-from", "^(x)", "--labels", csv.to_str().unwrap()],
            "--labels",
        ),
    ] {
        let mut a = vec!["convert", r, "--out", o];
        a.extend(args.iter().copied());
        let e = stderr(&run(&a, 2));
        assert!(e.contains(says), "{args:?}: {e}");
        assert!(!out.exists(), "{args:?}: the output folder was made");
    }
}

#[test]
fn any_colour_input_makes_three_channels() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("photos");
    // The first file (by name) is grey and the largest; one of four is colour.
    grey(&root.join("a.png"), 64, 48, 0);
    grey(&root.join("b.jpg"), 20, 10, 50);
    colour(&root.join("c.png"), 40, 30);
    grey(&root.join("d.png"), 32, 32, 90);
    let out = t.path().join("out");
    let o = run(
        &[
            "convert",
            root.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--test-fraction",
            "0",
        ],
        0,
    );
    let e = stderr(&o);
    assert!(
        e.contains("channels: 3 (1 colour inputs, 3 grey); --channels 1 to keep grey"),
        "{e}"
    );
    assert!(
        e.contains("size: 48x64, the first input's (inputs range from 10x20 to 48x64)"),
        "{e}"
    );
    let v = inspect(&out);
    assert_eq!(v["shape"], serde_json::json!([3, 48, 64]));
    assert_eq!(totals(&v).0, 4);

    // --channels and --size decide: no lines about them.
    let out = t.path().join("grey");
    let o = run(
        &[
            "convert",
            root.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--channels",
            "1",
            "--size",
            "16x16",
        ],
        0,
    );
    let e = stderr(&o);
    assert!(!e.contains("channels:") && !e.contains("size:"), "{e}");
    assert_eq!(inspect(&out)["shape"], serde_json::json!([1, 16, 16]));

    // All grey stays grey, without a channels line; a colour TIFF stack counts as colour.
    std::fs::remove_file(root.join("c.png")).unwrap();
    let out = t.path().join("allgrey");
    let o = run(
        &[
            "convert",
            root.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--size",
            "16x16",
        ],
        0,
    );
    assert!(!stderr(&o).contains("channels:"), "{}", stderr(&o));
    assert_eq!(inspect(&out)["shape"], serde_json::json!([1, 16, 16]));
    {
        let f = std::fs::File::create(root.join("e.tif")).unwrap();
        let mut enc = tiff::encoder::TiffEncoder::new(f).unwrap();
        enc.write_image::<tiff::encoder::colortype::RGB8>(4, 4, &[7u8; 48])
            .unwrap();
    }
    let out = t.path().join("tiff");
    let o = run(
        &[
            "convert",
            root.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--size",
            "16x16",
        ],
        0,
    );
    assert!(
        stderr(&o).contains("channels: 3 (1 colour inputs, 3 grey)"),
        "{}",
        stderr(&o)
    );
    assert_eq!(inspect(&out)["shape"], serde_json::json!([3, 16, 16]));
}
