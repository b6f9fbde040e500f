//! `prep convert --kind dicom|nifti` end to end, on tiny scans written here byte by byte (so the
//! files do not come from the library that reads them).

use crate::util::*;
use std::io::Write;
use std::path::{Path, PathBuf};

/// One explicit VR little endian element, value padded to even length.
fn el(out: &mut Vec<u8>, group: u16, elem: u16, vr: &[u8; 2], value: &[u8]) {
    let mut v = value.to_vec();
    if v.len() % 2 == 1 {
        v.push(if vr == b"UI" || vr == b"OB" || vr == b"OW" {
            0
        } else {
            b' '
        });
    }
    out.extend_from_slice(&group.to_le_bytes());
    out.extend_from_slice(&elem.to_le_bytes());
    out.extend_from_slice(vr);
    if [b"OB", b"OW", b"SQ", b"UN", b"UT"].contains(&vr) {
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    } else {
        out.extend_from_slice(&(v.len() as u16).to_le_bytes());
    }
    out.extend_from_slice(&v);
}

/// A CT-like DICOM Part 10 file: 16-bit unsigned MONOCHROME2, explicit VR little endian, with
/// Rescale Slope/Intercept and a window; `pixels` holds `frames * rows * cols` stored values.
pub(crate) fn dicom(rows: u16, cols: u16, frames: u32, pixels: &[u16]) -> Vec<u8> {
    dicom_of(b"1.2.840.10008.5.1.4.1.1.2", rows, cols, frames, pixels) // CT Image Storage
}

/// `dicom` of another SOP class.
fn dicom_of(sop_class: &[u8], rows: u16, cols: u16, frames: u32, pixels: &[u16]) -> Vec<u8> {
    assert_eq!(
        pixels.len(),
        frames as usize * rows as usize * cols as usize
    );
    let uid = b"1.2.826.0.1.3680043.2.1125.1";
    let mut meta = Vec::new();
    el(&mut meta, 0x0002, 0x0001, b"OB", &[0, 1]);
    el(&mut meta, 0x0002, 0x0002, b"UI", sop_class);
    el(&mut meta, 0x0002, 0x0003, b"UI", uid);
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
    el(&mut f, 0x0008, 0x0018, b"UI", uid);
    el(&mut f, 0x0028, 0x0002, b"US", &us(1));
    el(&mut f, 0x0028, 0x0004, b"CS", b"MONOCHROME2");
    if frames != 1 {
        el(&mut f, 0x0028, 0x0008, b"IS", frames.to_string().as_bytes());
    }
    el(&mut f, 0x0028, 0x0010, b"US", &us(rows));
    el(&mut f, 0x0028, 0x0011, b"US", &us(cols));
    el(&mut f, 0x0028, 0x0100, b"US", &us(16));
    el(&mut f, 0x0028, 0x0101, b"US", &us(12));
    el(&mut f, 0x0028, 0x0102, b"US", &us(11));
    el(&mut f, 0x0028, 0x0103, b"US", &us(0));
    el(&mut f, 0x0028, 0x1050, b"DS", b"40");
    el(&mut f, 0x0028, 0x1051, b"DS", b"400");
    el(&mut f, 0x0028, 0x1052, b"DS", b"-1024");
    el(&mut f, 0x0028, 0x1053, b"DS", b"1");
    let px: Vec<u8> = pixels.iter().flat_map(|v| v.to_le_bytes()).collect();
    el(&mut f, 0x7FE0, 0x0010, b"OW", &px);
    f
}

/// A NIfTI-1 single file of int16 voxels (x fastest), with `.nii.gz` gzipped.
pub(crate) fn nifti(path: &Path, dims: &[u16], voxels: &[i16]) {
    assert_eq!(
        voxels.len(),
        dims.iter().map(|&d| d as usize).product::<usize>()
    );
    let mut h = vec![0u8; 352];
    h[0..4].copy_from_slice(&348i32.to_le_bytes());
    h[40..42].copy_from_slice(&(dims.len() as i16).to_le_bytes());
    for i in 0..7 {
        let d = *dims.get(i).unwrap_or(&1) as i16;
        h[42 + 2 * i..44 + 2 * i].copy_from_slice(&d.to_le_bytes());
    }
    h[70..72].copy_from_slice(&4i16.to_le_bytes()); // INT16
    h[72..74].copy_from_slice(&16i16.to_le_bytes());
    for i in 0..8 {
        h[76 + 4 * i..80 + 4 * i].copy_from_slice(&1f32.to_le_bytes());
    }
    h[108..112].copy_from_slice(&352f32.to_le_bytes());
    h[112..116].copy_from_slice(&1f32.to_le_bytes());
    h[344..348].copy_from_slice(b"n+1\0");
    h.extend(voxels.iter().flat_map(|v| v.to_le_bytes()));
    let bytes = if path.to_string_lossy().ends_with(".gz") {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(&h).unwrap();
        e.finish().unwrap()
    } else {
        h
    };
    write(path, &bytes);
}

pub(crate) fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// A ramp of stored values (CT numbers -1024 + v after rescale).
pub(crate) fn ramp(n: usize, seed: u16) -> Vec<u16> {
    (0..n)
        .map(|i| ((i as u16).wrapping_mul(37).wrapping_add(seed * 101)) % 4096)
        .collect()
}

/// Two classes of 16 x 16 DICOMs: `ct` holds two single frames and one 3-frame file (5 images),
/// `mr` three single frames.
fn dicom_tree(root: &Path) -> PathBuf {
    let input = root.join("in");
    for i in 0..2u16 {
        write(
            &input.join(format!("ct/ct{i}.dcm")),
            &dicom(16, 16, 1, &ramp(256, i)),
        );
    }
    write(
        &input.join("ct/multi.dcm"),
        &dicom(16, 16, 3, &ramp(768, 7)),
    );
    for i in 0..3u16 {
        // No extension: found by its DICM marker.
        write(
            &input.join(format!("mr/mr{i}")),
            &dicom(16, 16, 1, &ramp(256, 10 + i)),
        );
    }
    input
}

fn inspect(out: &Path) -> serde_json::Value {
    let o = run(&["inspect", out.to_str().unwrap(), "--json"], 0);
    serde_json::from_slice(&o.stdout).expect("inspect --json prints JSON")
}

/// Samples over all splits (which files go to test is decided by a hash of their paths), and the
/// same per class.
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
    let text = std::fs::read_to_string(out.join("rejects.jsonl")).unwrap_or_default();
    text.lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect()
}

#[test]
fn dicom_tree_converts_every_frame_by_class() {
    let t = tempfile::tempdir().unwrap();
    let input = dicom_tree(t.path());
    let out = t.path().join("out");
    run(
        &[
            "convert",
            input.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--kind",
            "dicom",
            "--quiet",
        ],
        0,
    );
    let v = inspect(&out);
    assert_eq!(v["shape"], serde_json::json!([1, 16, 16]));
    assert_eq!(v["classes"], serde_json::json!(["ct", "mr"]));
    assert_eq!(totals(&v), (8, vec![5, 3]));
    assert!(rejects(&out).is_empty());

    // 16-bit output, a window from the command line (negative low), a forced size.
    let out16 = t.path().join("out16");
    run(
        &[
            "convert",
            input.to_str().unwrap(),
            "--out",
            out16.to_str().unwrap(),
            "--kind",
            "dicom",
            "--dtype",
            "u16",
            "--window",
            "-1000:400",
            "--size",
            "8x8",
            "--quiet",
        ],
        0,
    );
    let v = inspect(&out16);
    assert_eq!(v["shape"], serde_json::json!([1, 8, 8]));
    assert_eq!(v["dtype"], "u16");
    assert_eq!(totals(&v).0, 8);

    // The 3-frame file cut across its frames: 16 images of 16 x 3 along x.
    let outx = t.path().join("outx");
    run(
        &[
            "convert",
            input.join("ct").to_str().unwrap(),
            "--out",
            outx.to_str().unwrap(),
            "--kind",
            "dicom",
            "--axis",
            "0",
            "--size",
            "3x16",
            "--labels",
            write_labels(t.path(), &["ct0.dcm", "ct1.dcm", "multi.dcm"])
                .to_str()
                .unwrap(),
            "--quiet",
        ],
        0,
    );
    assert_eq!(totals(&inspect(&outx)).0, 1 + 1 + 16);
}

/// A labels CSV naming `files` as class "x".
fn write_labels(dir: &Path, files: &[&str]) -> PathBuf {
    let p = dir.join("labels.csv");
    let text: String = files.iter().map(|f| format!("{f},x\n")).collect();
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn truncated_dicom_is_a_reject_or_stops_the_run() {
    let t = tempfile::tempdir().unwrap();
    let input = dicom_tree(t.path());
    let good = std::fs::read(input.join("ct/ct0.dcm")).unwrap();
    write(&input.join("ct/cut.dcm"), &good[..good.len() - 100]);
    write(
        &input.join("mr/garbage.dcm"),
        b"this is not a DICOM file at all",
    );

    let out = t.path().join("out");
    let o = run(
        &[
            "convert",
            input.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--kind",
            "dicom",
            "--quiet",
        ],
        0,
    );
    let r = rejects(&out);
    assert_eq!(r.len(), 2, "{r:?}\n{}", stderr(&o));
    let find = |p: &str| {
        r.iter()
            .find(|x| x["path"] == p)
            .unwrap_or_else(|| panic!("{p} not in {r:?}"))
    };
    assert!(
        find("ct/cut.dcm")["reason"]
            .as_str()
            .unwrap()
            .contains("truncated"),
        "{r:?}"
    );
    assert!(
        find("mr/garbage.dcm")["reason"]
            .as_str()
            .unwrap()
            .contains("not a DICOM"),
        "{r:?}"
    );
    assert_eq!(totals(&inspect(&out)), (8, vec![5, 3]));

    let out2 = t.path().join("out2");
    let o = run(
        &[
            "convert",
            input.to_str().unwrap(),
            "--out",
            out2.to_str().unwrap(),
            "--kind",
            "dicom",
            "--on-error",
            "fail",
            "--quiet",
        ],
        1,
    );
    let e = stderr(&o);
    assert!(e.contains("cut.dcm") || e.contains("garbage.dcm"), "{e}");
}

#[test]
fn nifti_volumes_are_sliced_along_the_axis() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("nii");
    // brain: a 3-D 4 x 5 x 6 volume (.nii.gz); fmri: a 4-D 4 x 5 x 6 x 2 series (.nii).
    let vol: Vec<i16> = (0..120).map(|i| (i * 7 % 113) as i16 - 20).collect();
    nifti(&input.join("brain/a.nii.gz"), &[4, 5, 6], &vol);
    let series: Vec<i16> = (0..240).map(|i| (i * 13 % 97) as i16).collect();
    nifti(&input.join("fmri/b.nii"), &[4, 5, 6, 2], &series);

    let out = t.path().join("z");
    run(
        &[
            "convert",
            input.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--kind",
            "nifti",
            "--axis",
            "2",
            "--fourth-axis",
            "time",
            "--quiet",
        ],
        0,
    );
    let v = inspect(&out);
    assert_eq!(
        v["shape"],
        serde_json::json!([1, 5, 4]),
        "axis 2 slices are dim y high, dim x wide"
    );
    assert_eq!(totals(&v), (6 + 2 * 6, vec![6, 12]));

    let out = t.path().join("x");
    run(
        &[
            "convert",
            input.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--kind",
            "nifti",
            "--axis",
            "0",
            "--fourth-axis",
            "time",
            "--quiet",
        ],
        0,
    );
    let v = inspect(&out);
    assert_eq!(
        v["shape"],
        serde_json::json!([1, 6, 5]),
        "axis 0 slices are dim z high, dim y wide"
    );
    assert_eq!(totals(&v), (4 + 2 * 4, vec![4, 8]));

    // A truncated volume is a reject with a reason; the other still converts.
    let good = std::fs::read(input.join("fmri/b.nii")).unwrap();
    write(&input.join("fmri/b.nii"), &good[..good.len() - 10]);
    let out = t.path().join("cut");
    run(
        &[
            "convert",
            input.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--kind",
            "nifti",
            "--fourth-axis",
            "time",
            "--quiet",
        ],
        0,
    );
    let r = rejects(&out);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0]["path"], "fmri/b.nii");
    assert!(
        r[0]["reason"].as_str().unwrap().contains("truncated"),
        "{r:?}"
    );
    assert_eq!(totals(&inspect(&out)).0, 6);
}

/// A DICOM Segmentation object is refused by name, alone or in a series folder, never read as
/// an image.
#[test]
fn dicom_seg_is_refused_by_name() {
    let t = tempfile::tempdir().unwrap();
    let seg = dicom_of(b"1.2.840.10008.5.1.4.1.1.66.4", 4, 4, 2, &[1; 32]);
    write(&t.path().join("in/scan/seg.dcm"), &seg);
    write(
        &t.path().join("in/scan/ct.dcm"),
        &dicom(4, 4, 1, &ramp(16, 3)),
    );
    let out = t.path().join("out");
    let o = run(
        &[
            "convert",
            t.path().join("in").to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--test-fraction",
            "0",
            "--quiet",
        ],
        0,
    );
    let r = rejects(&out);
    assert_eq!(r.len(), 1, "{r:?} {}", stderr(&o));
    assert!(r[0]["path"].as_str().unwrap().ends_with("seg.dcm"), "{r:?}");
    assert!(
        r[0]["reason"]
            .as_str()
            .unwrap()
            .contains("DICOM Segmentation (SEG)"),
        "{r:?}"
    );
    let o = run(
        &[
            "convert",
            t.path().join("in/scan/seg.dcm").to_str().unwrap(),
            "--out",
            t.path().join("o2").to_str().unwrap(),
            "--on-error",
            "fail",
        ],
        1,
    );
    assert!(
        stderr(&o).contains("prep does not read DICOM SEG"),
        "{}",
        stderr(&o)
    );
}
