//! DICOM series end to end: folders of single-slice files become volumes, ordered, checked and
//! split by patient. The files are written here byte by byte, as in `scans.rs`.

use crate::util::*;
use prep::format::shard::Dataset;
use std::collections::{BTreeMap, BTreeSet};
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

/// One slice of a CT-like series.
#[derive(Clone)]
pub(crate) struct Slice {
    pub(crate) rows: u16,
    pub(crate) cols: u16,
    /// 16 (signed) or 8 (unsigned) bits.
    pub(crate) bits: u16,
    pub(crate) patient: Option<String>,
    pub(crate) study: Option<String>,
    pub(crate) series: Option<String>,
    pub(crate) instance: Option<i32>,
    pub(crate) position: Option<[f64; 3]>,
    pub(crate) orientation: Option<[f64; 6]>,
    pub(crate) spacing: [f64; 2],
    pub(crate) slope: f64,
    pub(crate) intercept: f64,
    pub(crate) window: Option<(f64, f64)>,
    /// Stored values, row by row.
    pub(crate) pixels: Vec<i32>,
}

impl Slice {
    pub(crate) fn new(rows: u16, cols: u16, pixels: Vec<i32>) -> Self {
        assert_eq!(pixels.len(), rows as usize * cols as usize);
        Slice {
            rows,
            cols,
            bits: 16,
            patient: None,
            study: None,
            series: Some("1.2.826.0.1.3680043.99.1".into()),
            instance: None,
            position: None,
            orientation: Some([1.0, 0.0, 0.0, 0.0, 1.0, 0.0]),
            spacing: [0.7, 0.7],
            slope: 1.0,
            intercept: 0.0,
            window: None,
            pixels,
        }
    }

    /// A Part 10 file of this slice (elements in tag order).
    pub(crate) fn bytes(&self) -> Vec<u8> {
        let sop_class = b"1.2.840.10008.5.1.4.1.1.2"; // CT Image Storage
        let uid = format!(
            "1.2.826.0.1.3680043.99.2.{}",
            xxhash(format!("{:?}{:?}", self.position, self.instance).as_bytes()) % 1_000_000
        );
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
        let ds = |v: &[f64]| {
            v.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join("\\")
        };
        let us = |v: u16| v.to_le_bytes();
        el(&mut f, 0x0008, 0x0016, b"UI", sop_class);
        el(&mut f, 0x0008, 0x0018, b"UI", uid.as_bytes());
        if let Some(p) = &self.patient {
            el(&mut f, 0x0010, 0x0020, b"LO", p.as_bytes());
        }
        if let Some(s) = &self.study {
            el(&mut f, 0x0020, 0x000D, b"UI", s.as_bytes());
        }
        if let Some(s) = &self.series {
            el(&mut f, 0x0020, 0x000E, b"UI", s.as_bytes());
        }
        if let Some(n) = self.instance {
            el(&mut f, 0x0020, 0x0013, b"IS", n.to_string().as_bytes());
        }
        if let Some(p) = self.position {
            el(&mut f, 0x0020, 0x0032, b"DS", ds(&p).as_bytes());
        }
        if let Some(o) = self.orientation {
            el(&mut f, 0x0020, 0x0037, b"DS", ds(&o).as_bytes());
        }
        el(&mut f, 0x0028, 0x0002, b"US", &us(1));
        el(&mut f, 0x0028, 0x0004, b"CS", b"MONOCHROME2");
        el(&mut f, 0x0028, 0x0010, b"US", &us(self.rows));
        el(&mut f, 0x0028, 0x0011, b"US", &us(self.cols));
        el(&mut f, 0x0028, 0x0030, b"DS", ds(&self.spacing).as_bytes());
        el(&mut f, 0x0028, 0x0100, b"US", &us(self.bits));
        el(&mut f, 0x0028, 0x0101, b"US", &us(self.bits));
        el(&mut f, 0x0028, 0x0102, b"US", &us(self.bits - 1));
        el(&mut f, 0x0028, 0x0103, b"US", &us((self.bits == 16) as u16));
        if let Some((c, w)) = self.window {
            el(&mut f, 0x0028, 0x1050, b"DS", c.to_string().as_bytes());
            el(&mut f, 0x0028, 0x1051, b"DS", w.to_string().as_bytes());
        }
        el(
            &mut f,
            0x0028,
            0x1052,
            b"DS",
            self.intercept.to_string().as_bytes(),
        );
        el(
            &mut f,
            0x0028,
            0x1053,
            b"DS",
            self.slope.to_string().as_bytes(),
        );
        let px: Vec<u8> = if self.bits == 8 {
            self.pixels.iter().map(|&v| v as u8).collect()
        } else {
            self.pixels
                .iter()
                .flat_map(|&v| (v as i16).to_le_bytes())
                .collect()
        };
        el(
            &mut f,
            0x7FE0,
            0x0010,
            if self.bits == 8 { b"OB" } else { b"OW" },
            &px,
        );
        f
    }

    /// Modality values (stored x slope + intercept), as float32 keeps them.
    fn values(&self) -> Vec<f32> {
        self.pixels
            .iter()
            .map(|&v| (v as f64 * self.slope + self.intercept) as f32)
            .collect()
    }
}

fn xxhash(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf29ce484222325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100000001b3)
    })
}

pub(crate) fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// `n` axial slices of `rows` x `cols`, 2.5 mm apart from z = -40, with instance numbers 1..=n in
/// position order; slice k holds stored values k * 100 + i - 50 and intercept -1000 + k (so that
/// each slice has its own rescale).
fn series(n: usize, rows: u16, cols: u16) -> Vec<Slice> {
    (0..n)
        .map(|k| {
            let px = (0..rows as i32 * cols as i32)
                .map(|i| k as i32 * 100 + i - 50)
                .collect();
            Slice {
                instance: Some(k as i32 + 1),
                position: Some([-10.0, 20.0, -40.0 + 2.5 * k as f64]),
                intercept: -1000.0 + k as f64,
                ..Slice::new(rows, cols, px)
            }
        })
        .collect()
}

/// A fixed shuffle of 0..n (no element in place for n > 1).
fn shuffled(n: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    v.rotate_left(n / 2 + 1);
    v.swap(0, n - 1);
    v
}

fn convert(input: &Path, out: &Path, extra: &[&str], code: i32) -> std::process::Output {
    let mut args = vec![
        "convert",
        input.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--kind",
        "dicom",
        "--quiet",
    ];
    args.extend_from_slice(extra);
    run(&args, code)
}

/// Every sample of every split, in order: (split, values as f32 (f32 data) or u16/u8 widened, label).
pub(crate) fn samples(d: &Path) -> Vec<(String, Vec<f32>, u32)> {
    let ds = Dataset::open(d).unwrap();
    let dtype = ds.manifest.sample.dtype;
    let mut out = Vec::new();
    for (split, info) in &ds.manifest.splits {
        for sh in &info.shards {
            let r = ds.open_shard(sh).unwrap();
            for b in 0..r.num_blocks() {
                let block = r.read_block(b).unwrap();
                for i in 0..block.len() {
                    let s = block.sample(i);
                    let n = s.len() / dtype.size();
                    let v = (0..n).map(|k| dtype.get(s, k)).collect();
                    out.push((split.clone(), v, block.label(i)));
                }
            }
        }
    }
    out
}

pub(crate) fn rejects(out: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(out.join("rejects.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["path"].as_str().unwrap().to_string(),
                v["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

pub(crate) fn source(out: &Path) -> serde_json::Value {
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    m["provenance"]["source"].clone()
}

/// Write `slices` into `dir`, slice k as `name(k)`.
fn write_series(dir: &Path, slices: &[Slice], name: impl Fn(usize) -> String) -> PathBuf {
    for (k, s) in slices.iter().enumerate() {
        write(&dir.join(name(k)), &s.bytes());
    }
    dir.to_path_buf()
}

#[test]
fn a_series_in_shuffled_file_order_is_the_same_volume() {
    let t = tempfile::tempdir().unwrap();
    let mut slices = series(7, 6, 5);
    // Per-slice windows: the series uses its first slice's (by position) for every slice.
    for (k, s) in slices.iter_mut().enumerate() {
        s.window = Some((-700.0 + k as f64, 900.0 + 10.0 * k as f64));
    }
    let sorted = write_series(&t.path().join("sorted/head"), &slices, |k| {
        format!("s{k:02}.dcm")
    });
    // The same files under names whose order is not the slices' order.
    let perm = shuffled(7);
    let mixed = write_series(&t.path().join("mixed/head"), &slices, |k| {
        format!("x{:02}.dcm", perm[k])
    });
    let want: Vec<Vec<f32>> = slices.iter().map(Slice::values).collect();
    for dtype in ["f32", "u16", "u8"] {
        let a = t.path().join(format!("a-{dtype}"));
        let b = t.path().join(format!("b-{dtype}"));
        let o = convert(&sorted, &a, &["--dtype", dtype, "--test-fraction", "0"], 0);
        assert!(rejects(&a).is_empty(), "{:?}", rejects(&a));
        convert(&mixed, &b, &["--dtype", dtype, "--test-fraction", "0"], 0);
        assert!(rejects(&b).is_empty(), "{:?}", rejects(&b));
        assert_eq!(shard_files(&a), shard_files(&b), "{dtype}: same shards");
        let got: Vec<Vec<f32>> = samples(&a).into_iter().map(|(_, v, _)| v).collect();
        assert_eq!(got.len(), 7, "{}", stderr(&o));
        if dtype == "f32" {
            // Modality values after each slice's own rescale, slices in position order.
            assert_eq!(got, want);
        } else if dtype == "u16" {
            // No window: every modality value kept, shifted by 32768.
            let shifted: Vec<Vec<f32>> = want
                .iter()
                .map(|s| s.iter().map(|&v| v + 32768.0).collect())
                .collect();
            assert_eq!(got, shifted);
        }
    }
    // With --window, u16 holds the window's 16 bits.
    let (low, high) = (-1150.0f64, -251.0f64);
    let w = t.path().join("u16-window");
    let window = format!("--window={low}:{high}");
    convert(
        &sorted,
        &w,
        &["--dtype", "u16", &window, "--test-fraction", "0"],
        0,
    );
    let got: Vec<Vec<f32>> = samples(&w).into_iter().map(|(_, v, _)| v).collect();
    let win: Vec<Vec<f32>> = want
        .iter()
        .map(|s| {
            s.iter()
                .map(|&v| {
                    let t = ((v as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    (t * 65535.0).round() as f32
                })
                .collect()
        })
        .collect();
    assert_eq!(got, win);
    let src = source(&t.path().join("a-f32"));
    assert_eq!(src["split_key"], "SeriesInstanceUID", "{src}");
}

#[test]
fn positions_order_a_series_whatever_the_instance_numbers() {
    let t = tempfile::tempdir().unwrap();
    let mut slices = series(5, 4, 3);
    // Instance numbers that contradict the positions; an oblique orientation whose normal is
    // (0, -1, 0): positions along -y, so ascending order is descending y.
    let inst = [4, 1, 5, 2, 3];
    for (k, s) in slices.iter_mut().enumerate() {
        s.instance = Some(inst[k]);
        s.orientation = Some([1.0, 0.0, 0.0, 0.0, 0.0, 1.0]);
        s.position = Some([0.0, 30.0 - 1.5 * k as f64, 7.0]);
    }
    let dir = write_series(&t.path().join("in/p"), &slices, |k| {
        format!("f{}.dcm", inst[k])
    });
    // As stored (coronal slices, which LPS would reslice into axial ones).
    let out = t.path().join("out");
    convert(
        &dir,
        &out,
        &[
            "--dtype",
            "f32",
            "--test-fraction",
            "0",
            "--orientation",
            "stored",
        ],
        0,
    );
    let got: Vec<Vec<f32>> = samples(&out).into_iter().map(|(_, v, _)| v).collect();
    let want: Vec<Vec<f32>> = slices.iter().map(Slice::values).collect();
    assert_eq!(
        got, want,
        "by position along the normal, not by instance number"
    );
}

#[test]
fn instance_numbers_order_a_series_without_positions() {
    let t = tempfile::tempdir().unwrap();
    let mut slices = series(5, 4, 3);
    for s in slices.iter_mut() {
        s.position = None;
        s.orientation = None;
    }
    // File names in the reverse of the instance order.
    let dir = write_series(&t.path().join("in/p"), &slices, |k| {
        format!("f{}.dcm", 9 - k)
    });
    let out = t.path().join("out");
    convert(&dir, &out, &["--dtype", "f32", "--test-fraction", "0"], 0);
    let got: Vec<Vec<f32>> = samples(&out).into_iter().map(|(_, v, _)| v).collect();
    let want: Vec<Vec<f32>> = slices.iter().map(Slice::values).collect();
    assert_eq!(got, want);

    // One file without an Instance Number either: it cannot be placed, the rest converts.
    let mut lost = slices[2].clone();
    lost.instance = None;
    lost.pixels = vec![7; 12];
    write(&dir.join("lost.dcm"), &lost.bytes());
    let out = t.path().join("out2");
    convert(&dir, &out, &["--dtype", "f32", "--test-fraction", "0"], 0);
    let r = rejects(&out);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].0, "lost.dcm");
    assert!(r[0].1.contains("no Instance Number"), "{r:?}");
    assert_eq!(samples(&out).len(), 5);
}

#[test]
fn axis_0_and_1_reslice_a_series() {
    let t = tempfile::tempdir().unwrap();
    // 4 slices of 3 rows x 5 columns.
    let slices = series(4, 3, 5);
    let dir = write_series(&t.path().join("in/p"), &slices, |k| format!("s{k}.dcm"));
    let vals: Vec<Vec<f32>> = slices.iter().map(Slice::values).collect();
    let at = |s: usize, r: usize, c: usize| vals[s][r * 5 + c];

    let out = t.path().join("x");
    convert(
        &dir,
        &out,
        &["--dtype", "f32", "--axis", "0", "--test-fraction", "0"],
        0,
    );
    let v: serde_json::Value =
        serde_json::from_slice(&run(&["inspect", out.to_str().unwrap(), "--json"], 0).stdout)
            .unwrap();
    assert_eq!(
        v["shape"],
        serde_json::json!([1, 4, 3]),
        "slices high, rows wide"
    );
    let got: Vec<Vec<f32>> = samples(&out).into_iter().map(|(_, v, _)| v).collect();
    assert_eq!(got.len(), 5, "one image per column");
    for (x, img) in got.iter().enumerate() {
        // Row r of image x is slice 3 - r (superior at the top); column c is row c of that slice.
        let want: Vec<f32> = (0..4)
            .flat_map(|r| (0..3).map(move |c| (3 - r, c)))
            .map(|(s, c)| at(s, c, x))
            .collect();
        assert_eq!(img, &want, "column {x}");
    }

    let out = t.path().join("y");
    convert(
        &dir,
        &out,
        &["--dtype", "f32", "--axis", "1", "--test-fraction", "0"],
        0,
    );
    let got: Vec<Vec<f32>> = samples(&out).into_iter().map(|(_, v, _)| v).collect();
    assert_eq!(got.len(), 3, "one image per row");
    let want: Vec<f32> = (0..4)
        .flat_map(|r| (0..5).map(move |c| (3 - r, c)))
        .map(|(s, c)| at(s, 2, c))
        .collect();
    assert_eq!(got[2], want);

    // A missing slice makes the spacing uneven: refused along axis 0, converted along axis 2.
    std::fs::remove_file(dir.join("s1.dcm")).unwrap();
    let out = t.path().join("gap0");
    let o = convert(&dir, &out, &["--axis", "0", "--test-fraction", "0"], 1);
    assert!(
        stderr(&o).contains("uneven slice spacing") && stderr(&o).contains("--axis 0 needs"),
        "{}",
        stderr(&o)
    );
    let out = t.path().join("gap2");
    let o = run(
        &[
            "convert",
            dir.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--kind",
            "dicom",
            "--test-fraction",
            "0",
        ],
        0,
    );
    assert!(
        stderr(&o).contains("uneven slice spacing"),
        "{}",
        stderr(&o)
    );
    assert_eq!(samples(&out).len(), 3);
}

#[test]
fn slices_that_do_not_fit_their_series_are_rejected_by_name() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    let slices = series(6, 6, 5);
    write_series(&input.join("ct"), &slices, |k| format!("s{k}.dcm"));
    // Another size, another pixel type, the position of s2 again: each left out, by name.
    let mut big = Slice {
        rows: 8,
        cols: 8,
        pixels: vec![1; 64],
        ..slices[0].clone()
    };
    big.position = Some([-10.0, 20.0, 100.0]);
    write(&input.join("ct/big.dcm"), &big.bytes());
    let mut bytes8 = slices[3].clone();
    bytes8.bits = 8;
    bytes8.pixels = vec![3; 30];
    bytes8.position = Some([-10.0, 20.0, 200.0]);
    write(&input.join("ct/eight.dcm"), &bytes8.bytes());
    let mut dup = slices[2].clone();
    dup.pixels = vec![0; 30];
    write(&input.join("ct/s2copy.dcm"), &dup.bytes());
    // A series with files in two classes: all its files are rejected.
    let mut two = series(3, 6, 5);
    for s in two.iter_mut() {
        s.series = Some("1.2.826.0.1.3680043.99.7".into());
    }
    write(&input.join("ct/t0.dcm"), &two[0].bytes());
    write(&input.join("ct/t1.dcm"), &two[1].bytes());
    write(&input.join("mr/t2.dcm"), &two[2].bytes());
    // An MR series of its own in the other class.
    let mut mr = series(2, 6, 5);
    for s in mr.iter_mut() {
        s.series = Some("1.2.826.0.1.3680043.99.8".into());
    }
    write_series(&input.join("mr"), &mr, |k| format!("m{k}.dcm"));

    let out = t.path().join("out");
    convert(&input, &out, &["--dtype", "f32", "--test-fraction", "0"], 0);
    let r: BTreeMap<String, String> = rejects(&out).into_iter().collect();
    let names: Vec<&str> = r.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "ct/big.dcm",
            "ct/eight.dcm",
            "ct/s2copy.dcm",
            "ct/t0.dcm",
            "ct/t1.dcm",
            "mr/t2.dcm"
        ],
        "{r:#?}"
    );
    assert!(
        r["ct/big.dcm"].contains("Rows x Columns 8x8 differ from its series' 6x5"),
        "{r:?}"
    );
    assert!(r["ct/eight.dcm"].contains("pixel type"), "{r:?}");
    assert!(
        r["ct/s2copy.dcm"].contains("same slice position as ct/s2.dcm"),
        "{r:?}"
    );
    assert!(r["mr/t2.dcm"].contains("2 classes"), "{r:?}");
    let got = samples(&out);
    let ct: Vec<Vec<f32>> = got
        .iter()
        .filter(|s| s.2 == 0)
        .map(|s| s.1.clone())
        .collect();
    let want: Vec<Vec<f32>> = slices.iter().map(Slice::values).collect();
    assert_eq!(
        ct, want,
        "the rest of the series converts, s2 from its first file"
    );
    assert_eq!(got.iter().filter(|s| s.2 == 1).count(), 2);

    // --on-error fail stops at the first and names it.
    let o = convert(&input, &t.path().join("fail"), &["--on-error", "fail"], 1);
    assert!(stderr(&o).contains("big.dcm"), "{}", stderr(&o));

    // --labels: every file of a series must carry the same label.
    let csv = t.path().join("labels.csv");
    let mut text = String::from("mr/m0.dcm,c\nmr/m1.dcm,c\n");
    for k in 0..6 {
        text.push_str(&format!("ct/s{k}.dcm,{}\n", if k == 4 { "b" } else { "a" }));
    }
    std::fs::write(&csv, text).unwrap();
    let out = t.path().join("labels");
    convert(&input, &out, &["--labels", csv.to_str().unwrap()], 0);
    let r = rejects(&out);
    assert_eq!(r.len(), 6, "{r:?}");
    assert!(
        r.iter()
            .all(|(_, why)| why.contains("2 classes (a: 5, b: 1)")),
        "{r:?}"
    );
    assert_eq!(samples(&out).len(), 2);
}

#[test]
fn patients_never_share_a_split() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    // 12 patients, classes by parity; each has two series (in two studies for odd patients), of 3
    // slices each. Pixel 0 of every slice names its patient: 1000 * patient + slice.
    for p in 0..12 {
        for s in 0..2 {
            let mut slices = series(3, 4, 4);
            for (k, sl) in slices.iter_mut().enumerate() {
                sl.patient = Some(format!("PAT{p:02}"));
                sl.study = Some(format!("1.2.826.0.1.3680043.99.5.{p}.{}", s * (p % 2)));
                sl.series = Some(format!("1.2.826.0.1.3680043.99.6.{p}.{s}"));
                sl.pixels[0] = 1000 * p + k as i32;
                sl.intercept = 0.0;
            }
            let class = if p % 2 == 0 { "even" } else { "odd" };
            write_series(&input.join(class).join(format!("p{p}s{s}")), &slices, |k| {
                format!("{k}.dcm")
            });
        }
    }
    // A PNG beside them keeps its own per-file split.
    image::GrayImage::from_pixel(4, 4, image::Luma([9u8]))
        .save(input.join("even/photo.png"))
        .unwrap();
    let out = t.path().join("out");
    run(
        &[
            "convert",
            input.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--dtype",
            "f32",
            "--test-fraction",
            "0.5",
            "--quiet",
        ],
        0,
    );
    assert!(rejects(&out).is_empty(), "{:?}", rejects(&out));
    let mut split_of: BTreeMap<i32, BTreeSet<String>> = BTreeMap::new();
    let all = samples(&out);
    assert_eq!(all.len(), 12 * 2 * 3 + 1);
    for (split, v, _) in &all {
        if v[1] == 9.0 {
            continue; // the PNG
        }
        split_of
            .entry((v[0] / 1000.0).floor() as i32)
            .or_default()
            .insert(split.clone());
    }
    assert_eq!(split_of.len(), 12);
    for (p, s) in &split_of {
        assert_eq!(s.len(), 1, "patient {p} is in {s:?}");
    }
    let splits: BTreeSet<&String> = split_of.values().flatten().collect();
    assert_eq!(splits.len(), 2, "both splits have patients");
    let src = source(&out);
    assert_eq!(src["split_key"], "PatientID", "{src}");
    assert_eq!(
        src["split_keys"],
        serde_json::json!({"PatientID": 24, "path": 1}),
        "{src}"
    );
}

#[test]
fn without_patient_id_the_study_groups_the_split() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    for s in 0..3 {
        let mut slices = series(2, 4, 4);
        for sl in slices.iter_mut() {
            sl.study = Some("1.2.826.0.1.3680043.99.9".into());
            sl.series = Some(format!("1.2.826.0.1.3680043.99.9.{s}"));
        }
        write_series(&input.join(format!("s{s}")), &slices, |k| {
            format!("{k}.dcm")
        });
    }
    let out = t.path().join("out");
    convert(
        &input,
        &out,
        &["--label-from", "^(s\\d)/", "--test-fraction", "0.5"],
        0,
    );
    let splits: BTreeSet<String> = samples(&out).into_iter().map(|s| s.0).collect();
    assert_eq!(splits.len(), 1, "one study, one split: {splits:?}");
    assert_eq!(source(&out)["split_key"], "StudyInstanceUID");
}

/// `--meta`: a series' slices carry its patient, series, pixel spacing and their slice number in
/// volume order (whatever the file order), a NIfTI's slices its voxel size, an image its path;
/// `--meta` on a dataset with labels of its own is refused.
#[test]
fn meta_says_where_each_slice_comes_from() {
    use prep::format::fields::FieldKind;
    let t = tempfile::tempdir().unwrap();
    let mut slices = series(5, 6, 5);
    for s in &mut slices {
        s.patient = Some("PAT-7".into());
        s.study = Some("1.2.826.0.1.3680043.99.5".into());
    }
    let perm = shuffled(5);
    write_series(&t.path().join("in/ct"), &slices, |k| {
        format!("x{:02}.dcm", perm[k])
    });
    crate::scans::nifti(&t.path().join("in/mr/v.nii"), &[5, 6, 3], &[7; 90]);
    let out = t.path().join("out");
    run(
        &[
            "convert",
            t.path().join("in").to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--meta",
            "--test-fraction",
            "0",
            "--quiet",
        ],
        0,
    );
    let d = Dataset::open(&out).unwrap();
    let f = &d.manifest.fields.0[0];
    assert_eq!(f.kind, FieldKind::Meta);
    let mut got = Vec::new();
    for (_, sh) in d.shards() {
        let r = d.open_shard(sh).unwrap();
        for b in 0..r.num_blocks() {
            let blk = r.read_block(b).unwrap();
            for i in 0..blk.len() {
                got.push(serde_json::Value::Object(
                    f.decode_meta(blk.field(&d.manifest.fields, 0, i)).unwrap(),
                ));
            }
        }
    }
    let ct: Vec<&serde_json::Value> = got.iter().filter(|m| m["patient"] == "PAT-7").collect();
    assert_eq!(ct.len(), 5, "{got:?}");
    for (k, m) in ct.iter().enumerate() {
        assert_eq!(m["slice"], k, "{m}");
        assert_eq!(m["series"], "1.2.826.0.1.3680043.99.1");
        assert_eq!(m["study"], "1.2.826.0.1.3680043.99.5");
        assert_eq!(
            (
                m["spacing_x"].as_f64(),
                m["spacing_y"].as_f64(),
                m["spacing_z"].as_f64()
            ),
            (Some(0.7), Some(0.7), Some(2.5))
        );
        assert!(m["source"].as_str().unwrap().starts_with("ct/x"), "{m}");
    }
    let mr: Vec<&serde_json::Value> = got.iter().filter(|m| m["source"] == "mr/v.nii").collect();
    assert_eq!(mr.len(), 3);
    for (k, m) in mr.iter().enumerate() {
        assert_eq!(
            (m["slice"].as_u64(), m["spacing_z"].as_f64()),
            (Some(k as u64), Some(1.0))
        );
    }
    let npy = t.path().join("npy");
    std::fs::create_dir_all(&npy).unwrap();
    crate::util::write_npy(&npy.join("x_train.npy"), "|u1", &[2, 2, 2], &[0; 8]);
    crate::util::write_npy(&npy.join("y_train.npy"), "|u1", &[2], &[0, 1]);
    let o = run(
        &[
            "convert",
            npy.to_str().unwrap(),
            "--out",
            t.path().join("o2").to_str().unwrap(),
            "--meta",
        ],
        2,
    );
    assert!(
        crate::util::stderr(&o).contains("meta_<split>.jsonl"),
        "{}",
        crate::util::stderr(&o)
    );
}
