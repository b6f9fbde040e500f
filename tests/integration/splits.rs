//! Splits you can trust (issue 28): few patients still give both splits, the split that came out
//! is reported and recorded with a warning where the patients cannot give the fraction asked,
//! patient folders are patients and not classes, and modalities are not mixed silently. The
//! DICOM files are written here byte by byte (explicit VR little endian), one slice a file.

use crate::util::*;
use prep::format::shard::Dataset;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// One explicit VR little endian element, value padded to even length.
fn el(out: &mut Vec<u8>, group: u16, elem: u16, vr: &[u8; 2], value: &[u8]) {
    let mut v = value.to_vec();
    if v.len() % 2 == 1 {
        v.push(if vr == b"UI" || vr == b"OW" { 0 } else { b' ' });
    }
    out.extend_from_slice(&group.to_le_bytes());
    out.extend_from_slice(&elem.to_le_bytes());
    out.extend_from_slice(vr);
    if [b"OB", b"OW"].contains(&vr) {
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    } else {
        out.extend_from_slice(&(v.len() as u16).to_le_bytes());
    }
    out.extend_from_slice(&v);
}

/// One 4x4 slice of a series: its patient (None: no PatientID), study, modality and z; pixel 0
/// holds `mark` (the rest 0), so a sample says where it comes from.
struct Slice<'a> {
    patient: Option<&'a str>,
    study: &'a str,
    series: &'a str,
    modality: Option<&'a str>,
    z: usize,
    mark: u16,
}

impl Slice<'_> {
    fn bytes(&self) -> Vec<u8> {
        let sop_class = b"1.2.840.10008.5.1.4.1.1.2";
        let uid = format!("{}.{}", self.series, self.z + 1);
        let mut meta = Vec::new();
        el(&mut meta, 0x0002, 0x0001, b"OB", &[0, 1]);
        el(&mut meta, 0x0002, 0x0002, b"UI", sop_class);
        el(&mut meta, 0x0002, 0x0003, b"UI", uid.as_bytes());
        el(&mut meta, 0x0002, 0x0010, b"UI", b"1.2.840.10008.1.2.1");
        el(&mut meta, 0x0002, 0x0012, b"UI", b"1.2.3.4");
        let mut f = vec![0u8; 128];
        f.extend_from_slice(b"DICM");
        el(
            &mut f,
            0x0002,
            0x0000,
            b"UL",
            &(meta.len() as u32).to_le_bytes(),
        );
        f.extend_from_slice(&meta);
        let us = |v: u16| v.to_le_bytes();
        el(&mut f, 0x0008, 0x0016, b"UI", sop_class);
        el(&mut f, 0x0008, 0x0018, b"UI", uid.as_bytes());
        if let Some(m) = self.modality {
            el(&mut f, 0x0008, 0x0060, b"CS", m.as_bytes());
        }
        if let Some(p) = self.patient {
            el(&mut f, 0x0010, 0x0020, b"LO", p.as_bytes());
        }
        el(&mut f, 0x0020, 0x000D, b"UI", self.study.as_bytes());
        el(&mut f, 0x0020, 0x000E, b"UI", self.series.as_bytes());
        let n = (self.z + 1).to_string();
        el(&mut f, 0x0020, 0x0013, b"IS", n.as_bytes());
        let pos = format!("0\\0\\{}", 2 * self.z);
        el(&mut f, 0x0020, 0x0032, b"DS", pos.as_bytes());
        el(&mut f, 0x0020, 0x0037, b"DS", b"1\\0\\0\\0\\1\\0");
        el(&mut f, 0x0028, 0x0002, b"US", &us(1));
        el(&mut f, 0x0028, 0x0004, b"CS", b"MONOCHROME2");
        el(&mut f, 0x0028, 0x0010, b"US", &us(4));
        el(&mut f, 0x0028, 0x0011, b"US", &us(4));
        el(&mut f, 0x0028, 0x0030, b"DS", b"1\\1");
        el(&mut f, 0x0028, 0x0100, b"US", &us(16));
        el(&mut f, 0x0028, 0x0101, b"US", &us(16));
        el(&mut f, 0x0028, 0x0102, b"US", &us(15));
        el(&mut f, 0x0028, 0x0103, b"US", &us(0));
        let mut px = [0u16; 16];
        px[0] = self.mark;
        let px: Vec<u8> = px.iter().flat_map(|v| v.to_le_bytes()).collect();
        el(&mut f, 0x7FE0, 0x0010, b"OW", &px);
        f
    }
}

/// Patient `p`'s series of `slices` files in `dir` (`PAT007` unless `id` names it otherwise,
/// None for no PatientID), pixel 0 of slice z being 100 * p + z.
fn patient(dir: &Path, p: usize, id: Option<&str>, modality: Option<&str>, slices: usize) {
    let name = format!("PAT{p:03}");
    let study = format!("1.2.826.0.1.3680043.77.{p}");
    let series = format!("{study}.1");
    for z in 0..slices {
        let s = Slice {
            patient: id.or(Some(&name)).filter(|i| !i.is_empty()),
            study: &study,
            series: &series,
            modality,
            z,
            mark: (100 * p + z) as u16,
        };
        write(&dir.join(format!("p{p:03}_{z}.dcm")), &s.bytes());
    }
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// `prep convert IN --out OUT --dtype f32 EXTRA`, its exit code checked.
fn convert(input: &Path, out: &Path, extra: &[&str], code: i32) -> std::process::Output {
    let mut args = vec![
        "convert",
        input.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--dtype",
        "f32",
    ];
    args.extend_from_slice(extra);
    run(&args, code)
}

fn source(out: &Path) -> serde_json::Value {
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    m["provenance"]["source"].clone()
}

/// The splits each patient's samples are in (pixel 0 / 100), and the samples of each split.
fn splits_of(out: &Path) -> (BTreeMap<usize, BTreeSet<String>>, BTreeMap<String, usize>) {
    let ds = Dataset::open(out).unwrap();
    let (mut of, mut n) = (BTreeMap::new(), BTreeMap::new());
    for (split, info) in &ds.manifest.splits {
        for sh in &info.shards {
            let r = ds.open_shard(sh).unwrap();
            for b in 0..r.num_blocks() {
                let block = r.read_block(b).unwrap();
                for i in 0..block.len() {
                    let v = ds.manifest.sample.dtype.get(block.sample(i), 0);
                    of.entry(v as usize / 100)
                        .or_insert_with(BTreeSet::new)
                        .insert(split.clone());
                    *n.entry(split.clone()).or_insert(0) += 1;
                }
            }
        }
    }
    (of, n)
}

fn warnings(o: &std::process::Output) -> Vec<String> {
    stderr(o)
        .lines()
        .filter(|l| l.starts_with("warning:"))
        .map(String::from)
        .collect()
}

#[test]
fn three_five_and_twenty_patients_give_both_splits_said_and_recorded() {
    let t = tempfile::tempdir().unwrap();
    // (patients, test patients at the default 0.1, the warning)
    for (n, test, warn) in [
        (
            3,
            1,
            Some("warning: 3 patients cannot give a test fraction of 0.1: 1 of 3 (0.33) in test, 2 in train"),
        ),
        (
            5,
            1,
            Some("warning: 5 patients cannot give a test fraction of 0.1: 1 of 5 (0.20) in test, 4 in train"),
        ),
        (20, 2, None),
    ] {
        let input = t.path().join(format!("in{n}"));
        for p in 0..n {
            patient(&input, p, None, Some("CT"), 4);
        }
        let out = t.path().join(format!("out{n}"));
        let o = convert(&input, &out, &[], 0);
        let (of, samples) = splits_of(&out);
        assert_eq!(of.len(), n);
        assert!(of.values().all(|s| s.len() == 1), "{n}: {of:?}");
        let in_test = of.values().filter(|s| s.contains("test")).count();
        assert_eq!(in_test, test, "{n} patients: {of:?}");
        let w = warnings(&o);
        match warn {
            Some(want) => assert_eq!(w, vec![want.to_string()], "{}", stderr(&o)),
            None => assert!(w.is_empty(), "{w:?}"),
        }
        // The summary's line, and the manifest's record.
        let line = format!(
            "split by PatientID: train {} patients, {} samples; test {test} patient{}, {} samples ({:.2} of the samples, {:.2} of the patients; --test-fraction 0.1)",
            n - test,
            samples["train"],
            if test == 1 { "" } else { "s" },
            samples["test"],
            samples["test"] as f64 / (4 * n) as f64,
            test as f64 / n as f64,
        );
        assert!(stdout(&o).contains(&line), "{}", stdout(&o));
        let s = &source(&out)["split"];
        assert_eq!(s["by"], "PatientID", "{s}");
        assert_eq!(s["test_fraction"], 0.1);
        assert_eq!(
            s["groups"],
            serde_json::json!({"test": test, "train": n - test})
        );
        // The samples are the manifest's splits (the same for every part of a job).
        assert!(s.get("samples").is_none(), "{s}");
        assert_eq!(
            samples,
            BTreeMap::from([("test".into(), 4 * test), ("train".into(), 4 * (n - test))])
        );
        assert_eq!(s["groups_test_fraction"], test as f64 / n as f64);
        assert_eq!(
            s["warnings"],
            serde_json::json!(warn.into_iter().collect::<Vec<_>>())
        );
    }
}

#[test]
fn one_patient_and_the_edge_fractions() {
    let t = tempfile::tempdir().unwrap();
    let one = t.path().join("one");
    patient(&one, 0, None, None, 3);
    // One patient: all in train, with a warning even under --quiet.
    let out = t.path().join("o1");
    let o = convert(&one, &out, &["--quiet"], 0);
    assert_eq!(
        warnings(&o),
        vec!["warning: 1 patient: no test split (--test-fraction 0.1 asks for one): all of it is in train; a held-out set needs at least 2"]
    );
    assert_eq!(splits_of(&out).1, BTreeMap::from([("train".into(), 3)]));
    // Five patients at 0.5: 3 in test, 2 in train; 0 and 1 put everything in one split, as
    // asked, with no warning.
    let five = t.path().join("five");
    for p in 0..5 {
        patient(&five, p, None, None, 2);
    }
    for (f, train, test) in [("0.5", 2, 3), ("0", 5, 0), ("1", 0, 5)] {
        let out = t.path().join(format!("o5-{f}"));
        let o = convert(&five, &out, &["--test-fraction", f], 0);
        assert!(warnings(&o).is_empty(), "{f}: {}", stderr(&o));
        let (of, _) = splits_of(&out);
        let count = |s: &str| of.values().filter(|v| v.contains(s)).count();
        assert_eq!((count("train"), count("test")), (train, test), "{f}");
    }
}

#[test]
fn without_patient_id_studies_are_the_groups() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    for p in 0..4 {
        patient(&input, p, Some(""), None, 2);
    }
    let out = t.path().join("out");
    let o = convert(&input, &out, &["--test-fraction", "0.25"], 0);
    let (of, _) = splits_of(&out);
    assert_eq!(of.values().filter(|s| s.contains("test")).count(), 1);
    assert!(warnings(&o).is_empty(), "{}", stderr(&o));
    let s = source(&out);
    assert_eq!(s["split_key"], "StudyInstanceUID");
    assert_eq!(s["split"]["by"], "StudyInstanceUID");
    assert!(
        stdout(&o).contains(
            "split by StudyInstanceUID: train 3 studies, 6 samples; test 1 study, 2 samples"
        ),
        "{}",
        stdout(&o)
    );
    // --json's report holds the split with its samples.
    let o = convert(
        &input,
        &out,
        &["--test-fraction", "0.25", "--force", "--json"],
        0,
    );
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        r["split"]["samples"],
        serde_json::json!({"test": 2, "train": 6})
    );
    assert_eq!(r["split"]["samples_test_fraction"], 0.25);
    assert_eq!(
        r["split"]["groups"],
        serde_json::json!({"test": 1, "train": 3})
    );
}

#[test]
fn patient_folders_are_patients_not_classes() {
    let t = tempfile::tempdir().unwrap();
    // PAT000/ ... PAT004/, each holding one patient whose PatientID is the folder's name.
    let named = t.path().join("named");
    for p in 0..5 {
        patient(&named.join(format!("PAT{p:03}")), p, None, Some("CT"), 3);
    }
    // Folders named otherwise, one distinct PatientID each: they stay classes (ct/ and mr/ of
    // one scan each are classes), with a warning that each class is one patient.
    let other = t.path().join("other");
    for p in 0..5 {
        patient(&other.join(format!("scan{p}")), p, None, Some("CT"), 3);
    }
    let out = other.with_extension("out");
    let o = convert(&other, &out, &[], 0);
    let ds = Dataset::open(&out).unwrap();
    assert_eq!(ds.manifest.classes.len(), 5);
    assert!(
        stderr(&o).contains("warning: every class folder holds the files of one patient"),
        "{}",
        stderr(&o)
    );
    for input in [&named] {
        let out = input.with_extension("out");
        let o = convert(input, &out, &[], 0);
        let ds = Dataset::open(&out).unwrap();
        let own = input.file_name().unwrap().to_str().unwrap();
        assert_eq!(ds.manifest.classes, vec![own.to_string()]);
        assert!(
            stderr(&o).contains("dicom: the folders are patients, not classes (")
                && stderr(&o).contains(&format!(": one class \"{own}\", split by patient")),
            "{}",
            stderr(&o)
        );
        let (of, _) = splits_of(&out);
        assert!(of.values().all(|s| s.len() == 1), "{of:?}");
        assert_eq!(of.values().filter(|s| s.contains("test")).count(), 1);
        assert_eq!(source(&out)["split"]["by"], "PatientID");
    }
    let o = run(&["convert", "--help"], 0);
    assert!(stdout(&o).contains("--classes"), "{}", stdout(&o));
    // --classes folders keeps them as classes, with a warning.
    let out = t.path().join("kept");
    let o = convert(&named, &out, &["--classes", "folders"], 0);
    assert_eq!(Dataset::open(&out).unwrap().manifest.classes.len(), 5);
    let w = warnings(&o);
    assert_eq!(w.len(), 2, "{w:?}"); // and 5 patients at 0.1
    assert!(
        w[0].contains("the class folders are patients")
            && w[0].contains("every class is wholly in one split"),
        "{w:?}"
    );
    // With --labels or --label-from it says nothing: refused.
    let o = convert(
        &named,
        &t.path().join("x"),
        &["--classes", "folders", "--label-from", "^(P)"],
        2,
    );
    assert!(stderr(&o).contains("--classes folders"), "{}", stderr(&o));
    // Folders of two patients each are classes, as are folders that share a patient.
    let classes = t.path().join("classes");
    for p in 0..4 {
        patient(
            &classes.join(if p % 2 == 0 { "a" } else { "b" }),
            p,
            None,
            None,
            2,
        );
    }
    let shared = t.path().join("shared");
    patient(&shared.join("a"), 0, Some("P"), None, 2);
    patient(&shared.join("b"), 1, Some("P"), None, 2);
    for input in [&classes, &shared] {
        let out = input.with_extension("out");
        let o = convert(input, &out, &["--test-fraction", "0.5"], 0);
        assert_eq!(
            Dataset::open(&out).unwrap().manifest.classes,
            vec!["a".to_string(), "b".to_string()]
        );
        assert!(!stderr(&o).contains("are patients"), "{}", stderr(&o));
    }
}

#[test]
fn split_folders_keep_their_split_and_patient_folders_below_them() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    patient(&input.join("train/PAT000"), 0, None, None, 3);
    patient(&input.join("train/PAT001"), 1, None, None, 3);
    patient(&input.join("test/PAT002"), 2, None, None, 2);
    let out = t.path().join("out");
    let o = convert(&input, &out, &[], 0);
    let (of, n) = splits_of(&out);
    assert_eq!(n, BTreeMap::from([("test".into(), 2), ("train".into(), 6)]));
    assert_eq!(of[&2], BTreeSet::from(["test".to_string()]));
    assert_eq!(Dataset::open(&out).unwrap().manifest.classes, vec!["in"]);
    let s = source(&out);
    assert_eq!(s["split_key"], "folders");
    assert!(s.get("split").is_none(), "nothing drawn: {s}");
    assert!(warnings(&o).is_empty(), "{}", stderr(&o));
}

#[test]
fn mixed_modalities_are_refused_unless_asked() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    for p in 0..3 {
        patient(&input, p, None, Some("CT"), 2);
    }
    patient(&input, 3, None, Some("MR"), 2);
    let out = t.path().join("out");
    let o = convert(&input, &out, &[], 2);
    let e = stderr(&o);
    assert!(
        e.contains("DICOM files of 2 modalities: CT 6 files (e.g. p000_0.dcm), MR 2 files (e.g. p003_0.dcm)")
            && e.contains("--mixed-modalities"),
        "{e}"
    );
    assert!(!out.exists());
    let o = convert(&input, &out, &["--mixed-modalities"], 0);
    assert!(
        stderr(&o).contains(
            "dicom: modalities mixed in one dataset, as --mixed-modalities asks: CT 6 files"
        ),
        "{}",
        stderr(&o)
    );
    assert_eq!(splits_of(&out).0.len(), 4);
    // Files without a Modality beside one modality are no mix.
    let one = t.path().join("one");
    patient(&one, 0, None, Some("CT"), 2);
    patient(&one, 1, None, None, 2);
    convert(&one, &t.path().join("o1"), &[], 0);
}

#[test]
fn volumes_and_array_runs_are_groups_too() {
    let t = tempfile::tempdir().unwrap();
    // Three NIfTI volumes of 4 slices: one in test at 0.1, with the warning.
    let vols = t.path().join("vols");
    for i in 0..3 {
        let v: Vec<i16> = (0..4 * 3 * 4).map(|k| (k + 100 * i) as i16).collect();
        crate::scans::nifti(&vols.join(format!("v{i}.nii")), &[4, 3, 4], &v);
    }
    let out = t.path().join("vols.out");
    let o = convert(&vols, &out, &[], 0);
    assert_eq!(
        warnings(&o),
        vec!["warning: 3 files cannot give a test fraction of 0.1: 1 of 3 (0.33) in test, 2 in train"]
    );
    assert_eq!(
        splits_of(&out).1,
        BTreeMap::from([("test".into(), 4), ("train".into(), 8)])
    );
    assert_eq!(source(&out)["split"]["by"], "file");
    // An unsplit .npy pair of 300 samples: runs of 3, 10 of the 100 runs in test.
    let arr = t.path().join("arr");
    let px: Vec<u8> = (0..300 * 4).map(|i| (i / 4) as u8).collect();
    write_npy(&arr.join("images.npy"), "|u1", &[300, 2, 2], &px);
    let labels: Vec<u8> = (0..300).map(|i| (i % 2) as u8).collect();
    write_npy(&arr.join("labels.npy"), "|u1", &[300], &labels);
    let out = t.path().join("arr.out");
    let o = run(
        &[
            "convert",
            arr.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
        0,
    );
    assert!(warnings(&o).is_empty(), "{}", stderr(&o));
    let m = Dataset::open(&out).unwrap().manifest;
    assert_eq!(m.splits["test"].samples, 30);
    assert_eq!(m.splits["train"].samples, 270);
    assert_eq!(source(&out)["split"]["by"], "chunk");
}

#[test]
fn plain_images_keep_the_split_by_path() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    for i in 0..40 {
        let img = image::GrayImage::from_pixel(2, 2, image::Luma([i as u8]));
        std::fs::create_dir_all(input.join("c")).unwrap();
        img.save(input.join(format!("c/{i}.png"))).unwrap();
    }
    let out = t.path().join("out");
    let o = convert(&input, &out, &["--test-fraction", "0.3"], 0);
    let s = source(&out)["split"].clone();
    assert_eq!(s["by"], "path");
    // Each file is in test where the hash of its path is below 0.3, as before.
    let ds = Dataset::open(&out).unwrap();
    let mut test = 0;
    for (split, info) in &ds.manifest.splits {
        for sh in &info.shards {
            let r = ds.open_shard(sh).unwrap();
            for b in 0..r.num_blocks() {
                let block = r.read_block(b).unwrap();
                for i in 0..block.len() {
                    let v = ds.manifest.sample.dtype.get(block.sample(i), 0) as usize;
                    let want = prep::source::tree::is_test(&format!("c/{v}.png"), 0.3);
                    assert_eq!(split == "test", want, "c/{v}.png in {split}");
                    test += (split == "test") as u64;
                }
            }
        }
    }
    assert!(test > 0);
    assert_eq!(s["groups"]["test"].as_u64().unwrap(), test);
    assert!(
        stdout(&o).contains(&format!("; test {test} files, {test} samples")),
        "{}",
        stdout(&o)
    );
    assert!(
        stdout(&o).contains("split by path: train "),
        "{}",
        stdout(&o)
    );
}
