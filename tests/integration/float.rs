//! f16/f32 datasets end to end, on arrays and volumes written here: `--dtype f32|f16` keeps the
//! source's values (read back through the library), non-finite inputs are rejected by name, a
//! float block holding a NaN is damage even with correct checksums, a version-1 header cannot
//! claim a float dtype, and the CPU trains and evaluates on float data.

use crate::util::*;
use prep::format::shard::{Dataset, Dtype, ShardReader};
use std::path::{Path, PathBuf};
use twox_hash::XxHash3_64;

fn le_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn labels_npy(path: &Path, labels: &[i64]) {
    let b: Vec<u8> = labels.iter().flat_map(|l| l.to_le_bytes()).collect();
    write_npy(path, "<i8", &[labels.len()], &b);
}

/// Values from -2000 to 2000 with a fractional part, then the ones conversions get wrong: signed
/// zeros, an f32 subnormal, f16's smallest subnormal and largest value, values between f16 steps.
fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut v: Vec<f32> = (0..n)
        .map(|i| {
            let u = (i as u32 ^ seed).wrapping_mul(2654435761) as f64 / u32::MAX as f64;
            ((u - 0.5) * 4000.0) as f32 + 0.123
        })
        .collect();
    let special = [-0.0, 0.0, 1e-40, 5.96e-8, 65504.0, -1024.5, 2049.0, 0.1];
    v[..special.len()].copy_from_slice(&special);
    v
}

/// Every (sample bytes, label) of a split, in order, read back through the library.
fn samples(d: &Path, split: &str) -> Vec<(Vec<u8>, u32)> {
    let ds = Dataset::open(d).unwrap();
    let mut out = Vec::new();
    for info in &ds.manifest.splits[split].shards {
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

fn convert(input: &Path, out: &Path, extra: &[&str], code: i32) -> std::process::Output {
    let mut args = vec![
        "convert",
        input.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ];
    args.extend_from_slice(extra);
    run(&args, code)
}

fn rejects(out: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("rejects.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn float_npy_keeps_every_value() {
    let t = tempfile::tempdir().unwrap();
    let (n, h, w) = (40, 6, 5);
    let vals = values(n * h * w, 1);
    let src = t.path().join("f4");
    write_npy(&src.join("x_train.npy"), "<f4", &[n, h, w], &le_f32(&vals));
    let labels: Vec<i64> = (0..n as i64).map(|i| i % 3).collect();
    labels_npy(&src.join("y_train.npy"), &labels);

    // f32: bit for bit, negative values, signed zeros and subnormals included.
    let out = t.path().join("f32");
    convert(&src, &out, &["--dtype", "f32", "--block-samples", "16"], 0);
    let s = samples(&out, "train");
    assert_eq!(s.len(), n);
    for (i, (px, l)) in s.iter().enumerate() {
        assert_eq!(px, &le_f32(&vals[i * h * w..(i + 1) * h * w]), "sample {i}");
        assert_eq!(*l as i64, labels[i]);
    }
    // Version 2 files (u8/u16 ones stay version 1), statistics on the raw values.
    let ds = Dataset::open(&out).unwrap();
    let m = &ds.manifest;
    assert_eq!((m.version, m.sample.dtype), (2, Dtype::F32));
    let shard = std::fs::read(out.join(&m.splits["train"].shards[0].file)).unwrap();
    assert_eq!(u16::from_le_bytes([shard[8], shard[9]]), 2);
    assert_eq!(shard[10], 4, "dtype code of f32");
    let mean = vals.iter().map(|&v| v as f64).sum::<f64>() / vals.len() as f64;
    let var =
        vals.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / vals.len() as f64 - mean * mean;
    assert!((m.mean[0] - mean).abs() < 1e-9 * var.sqrt(), "{m:?}");
    assert!((m.std[0] - var.sqrt()).abs() < 1e-9 * var.sqrt(), "{m:?}");
    let o = run(&["verify", out.to_str().unwrap()], 0);
    assert!(stdout(&o).contains("40 samples"), "{}", stdout(&o));
    // The grid windows float data (mean ± 3 std): it draws, with more than one grey level.
    let png = t.path().join("grid.png");
    run(
        &[
            "inspect",
            out.to_str().unwrap(),
            "--grid",
            png.to_str().unwrap(),
        ],
        0,
    );
    let img = image::open(&png).unwrap().into_rgb8();
    let greys: std::collections::BTreeSet<u8> = img.pixels().map(|p| p[0]).collect();
    assert!(greys.len() > 20, "{greys:?}");

    // f16: each value rounded to the nearest f16.
    let out = t.path().join("f16");
    convert(&src, &out, &["--dtype", "f16"], 0);
    let s = samples(&out, "train");
    for (i, (px, _)) in s.iter().enumerate() {
        let want: Vec<u8> = vals[i * h * w..(i + 1) * h * w]
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect();
        assert_eq!(px, &want, "sample {i}");
    }
    assert_eq!(
        Dataset::open(&out).unwrap().manifest.sample.dtype,
        Dtype::F16
    );

    // Grey to 3 channels repeats the plane.
    let out = t.path().join("rgb");
    convert(&src, &out, &["--dtype", "f32", "--channels", "3"], 0);
    let s = samples(&out, "train");
    let plane = le_f32(&vals[5 * h * w..6 * h * w]);
    assert_eq!(s[5].0, [plane.clone(), plane.clone(), plane].concat());

    // float64 is rounded to the nearest float32; float16 kept exactly as f16.
    let src8 = t.path().join("f8");
    let v64: Vec<f64> = (0..n * h * w).map(|i| (i as f64 - 600.0) / 7.0).collect();
    let b64: Vec<u8> = v64.iter().flat_map(|v| v.to_le_bytes()).collect();
    write_npy(&src8.join("x_train.npy"), "<f8", &[n, h, w], &b64);
    labels_npy(&src8.join("y_train.npy"), &labels);
    let out = t.path().join("from-f8");
    convert(&src8, &out, &["--dtype", "f32"], 0);
    let s = samples(&out, "train");
    let want: Vec<f32> = v64.iter().map(|&v| v as f32).collect();
    assert_eq!(s[7].0, le_f32(&want[7 * h * w..8 * h * w]));
    let src2 = t.path().join("f2");
    let b16: Vec<u8> = vals
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    write_npy(&src2.join("x_train.npy"), "<f2", &[n, h, w], &b16);
    labels_npy(&src2.join("y_train.npy"), &labels);
    let out = t.path().join("from-f2");
    convert(&src2, &out, &["--dtype", "f16"], 0);
    let s = samples(&out, "train");
    assert_eq!(s[9].0, b16[9 * h * w * 2..10 * h * w * 2]);

    // --window is for windowed (u8/u16) output only.
    let o = convert(
        &src,
        &t.path().join("w"),
        &["--dtype", "f32", "--window", "0:1"],
        2,
    );
    assert!(stderr(&o).contains("--window"), "{}", stderr(&o));
}

#[test]
fn non_finite_float_inputs_are_rejected_by_name() {
    let t = tempfile::tempdir().unwrap();
    let (n, h, w) = (10, 4, 4);
    let mut vals = values(n * h * w, 2);
    vals[3 * 16 + 7] = f32::NAN;
    vals[5 * 16] = f32::NEG_INFINITY;
    let src = t.path().join("np");
    write_npy(&src.join("x_train.npy"), "<f4", &[n, h, w], &le_f32(&vals));
    labels_npy(&src.join("y_train.npy"), &(0..n as i64).collect::<Vec<_>>());

    let out = t.path().join("skip");
    convert(&src, &out, &["--dtype", "f32"], 0);
    let r = rejects(&out);
    assert_eq!(r.len(), 2, "{r:?}");
    assert_eq!(r[0]["path"], "x_train.npy[3]");
    let why = r[0]["reason"].as_str().unwrap();
    assert!(why.contains("NaN") && why.contains("finite"), "{why}");
    assert_eq!(r[1]["path"], "x_train.npy[5]");
    assert!(r[1]["reason"].as_str().unwrap().contains("inf"), "{r:?}");
    let labels: Vec<u32> = samples(&out, "train").iter().map(|s| s.1).collect();
    assert_eq!(labels, vec![0, 1, 2, 4, 6, 7, 8, 9]);
    // f16 as well, and a value beyond f16's range.
    vals[3 * 16 + 7] = 0.5;
    vals[5 * 16] = 1e6;
    write_npy(&src.join("x_train.npy"), "<f4", &[n, h, w], &le_f32(&vals));
    let out = t.path().join("f16");
    convert(&src, &out, &["--dtype", "f16"], 0);
    let r = rejects(&out);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0]["path"], "x_train.npy[5]");
    assert!(r[0]["reason"].as_str().unwrap().contains("f16"), "{r:?}");

    // --on-error fail stops the run, naming the sample, and leaves no dataset.
    vals[5 * 16] = f32::NAN;
    write_npy(&src.join("x_train.npy"), "<f4", &[n, h, w], &le_f32(&vals));
    let out = t.path().join("fail");
    let o = convert(&src, &out, &["--dtype", "f32", "--on-error", "fail"], 1);
    assert!(
        stderr(&o).contains("x_train.npy[5]") && stderr(&o).contains("NaN"),
        "{}",
        stderr(&o)
    );
    assert!(!out.join("manifest.json").exists());

    // A NaN voxel rejects its NIfTI volume by file name; the other volume converts.
    let input = t.path().join("nii");
    let good: Vec<f32> = (0..24).map(|i| i as f32 - 10.0).collect();
    let mut bad = good.clone();
    bad[1 + 4 * 2 + 12] = f32::NAN;
    nifti(
        &input.join("a/good.nii"),
        &[4, 3, 2],
        NIFTI_FLOAT32,
        &le_f32(&good),
        1.0,
        0.0,
    );
    nifti(
        &input.join("b/nan.nii"),
        &[4, 3, 2],
        NIFTI_FLOAT32,
        &le_f32(&bad),
        1.0,
        0.0,
    );
    let out = t.path().join("nii-out");
    convert(&input, &out, &["--kind", "nifti", "--dtype", "f32"], 0);
    let r = rejects(&out);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0]["path"], "b/nan.nii");
    assert!(r[0]["reason"].as_str().unwrap().contains("NaN"), "{r:?}");
    let o = convert(
        &input,
        &t.path().join("nii-fail"),
        &["--kind", "nifti", "--dtype", "f32", "--on-error", "fail"],
        1,
    );
    assert!(stderr(&o).contains("nan.nii"), "{}", stderr(&o));
}

const NIFTI_FLOAT32: (i16, i16) = (16, 32);
const NIFTI_INT16: (i16, i16) = (4, 16);

/// A NIfTI-1 single file (x fastest), gzipped for `.nii.gz`.
fn nifti(
    path: &Path,
    dims: &[u16],
    (datatype, bitpix): (i16, i16),
    data: &[u8],
    slope: f32,
    inter: f32,
) {
    let mut h = vec![0u8; 352];
    h[0..4].copy_from_slice(&348i32.to_le_bytes());
    h[40..42].copy_from_slice(&(dims.len() as i16).to_le_bytes());
    for i in 0..7 {
        let d = *dims.get(i).unwrap_or(&1) as i16;
        h[42 + 2 * i..44 + 2 * i].copy_from_slice(&d.to_le_bytes());
    }
    h[70..72].copy_from_slice(&datatype.to_le_bytes());
    h[72..74].copy_from_slice(&bitpix.to_le_bytes());
    for i in 0..8 {
        h[76 + 4 * i..80 + 4 * i].copy_from_slice(&1f32.to_le_bytes());
    }
    h[108..112].copy_from_slice(&352f32.to_le_bytes());
    h[112..116].copy_from_slice(&slope.to_le_bytes());
    h[116..120].copy_from_slice(&inter.to_le_bytes());
    h[344..348].copy_from_slice(b"n+1\0");
    h.extend_from_slice(data);
    let bytes = if path.to_string_lossy().ends_with(".gz") {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(&h).unwrap();
        e.finish().unwrap()
    } else {
        h
    };
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn nifti_volumes_keep_their_voxel_values() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("nii");
    // a: float32 voxels, negative and fractional. b: int16 scaled by 2.5 v - 1000.5.
    let (nx, ny, nz) = (4, 3, 2);
    let fvol: Vec<f32> = (0..24).map(|i| -1000.25 + 37.5 * i as f32).collect();
    nifti(
        &input.join("ct/a.nii"),
        &[4, 3, 2],
        NIFTI_FLOAT32,
        &le_f32(&fvol),
        1.0,
        0.0,
    );
    let ivol: Vec<i16> = (0..24).map(|i| (i * 97 % 61) as i16 - 30).collect();
    let ib: Vec<u8> = ivol.iter().flat_map(|v| v.to_le_bytes()).collect();
    nifti(
        &input.join("ct/b.nii.gz"),
        &[4, 3, 2],
        NIFTI_INT16,
        &ib,
        2.5,
        -1000.5,
    );
    let out = t.path().join("out");
    convert(
        &input,
        &out,
        &["--kind", "nifti", "--dtype", "f32", "--test-fraction", "0"],
        0,
    );
    let s = samples(&out, "train");
    assert_eq!(s.len(), 2 * nz, "the axial slices of each volume");
    // Axial slice z, row r (top row: highest y), column c: voxel (nx - 1 - c, ny - 1 - r, z)
    // (no qform or sform: RAS by the NIfTI rule, brought to LPS).
    let slice = |vol: &dyn Fn(usize) -> f32, z: usize| -> Vec<u8> {
        let v: Vec<f32> = (0..ny)
            .flat_map(|r| (0..nx).map(move |c| (nx - 1 - c, ny - 1 - r)))
            .map(|(x, y)| vol(x + nx * (y + ny * z)))
            .collect();
        le_f32(&v)
    };
    let a = |i: usize| fvol[i];
    let b = |i: usize| (ivol[i] as f64 * 2.5 - 1000.5) as f32;
    assert_eq!(s[0].0, slice(&a, 0));
    assert_eq!(s[1].0, slice(&a, 1));
    assert_eq!(s[2].0, slice(&b, 0));
    assert_eq!(s[3].0, slice(&b, 1));
    // --dtype u16 keeps whole values only (+ 32768): the fractional volumes are refused by
    // name, and --window windows them into u16.
    let out = t.path().join("u16");
    let o = run(
        &[
            "convert",
            input.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--kind",
            "nifti",
            "--dtype",
            "u16",
        ],
        1,
    );
    let e = stderr(&o);
    assert!(
        e.contains("whole modality values") && e.contains("--dtype f32"),
        "{e}"
    );
    let out = t.path().join("u16w");
    convert(
        &input,
        &out,
        &["--kind", "nifti", "--dtype", "u16", "--window=-1000:0"],
        0,
    );
    assert_eq!(
        Dataset::open(&out).unwrap().manifest.sample.dtype,
        Dtype::U16
    );
}

/// A u8 dataset's first shard with its header rewritten: `edit` then a fresh header checksum.
fn edited_header(dir: &Path, edit: impl Fn(&mut [u8])) -> PathBuf {
    let ds = small_dataset(dir, &[]);
    let m = Dataset::open(&ds).unwrap().manifest;
    let path = ds.join(&m.splits["train"].shards[0].file);
    let mut b = std::fs::read(&path).unwrap();
    edit(&mut b);
    let h = XxHash3_64::oneshot(&b[..56]);
    b[56..64].copy_from_slice(&h.to_le_bytes());
    std::fs::write(&path, b).unwrap();
    ds
}

#[test]
fn a_version_1_header_cannot_hold_a_float_dtype() {
    let t = tempfile::tempdir().unwrap();
    let ds = edited_header(t.path(), |b| {
        assert_eq!((b[8], b[10]), (1, 1), "synth writes version 1, u8");
        b[10] = 4;
    });
    let shard = ds.join("train/train-00000.shard");
    let e = ShardReader::open(&shard).unwrap_err().to_string();
    assert!(
        e.contains("train-00000.shard") && e.contains("header") && e.contains("version 2"),
        "{e}"
    );
    let o = run(&["verify", ds.to_str().unwrap()], 1);
    assert!(
        stdout(&o).contains("DAMAGED train/train-00000.shard: header: dtype f32"),
        "{}",
        stdout(&o)
    );
    // Version 4 is unknown; version 3 is that of sample fields, and holds at least one.
    for (v, want) in [
        (4, "version 4 is not supported"),
        (
            3,
            "0 fields of 0 bytes a sample: version 3 holds 1 to 64 fields",
        ),
    ] {
        let t = tempfile::tempdir().unwrap();
        let ds = edited_header(t.path(), |b| b[8] = v);
        let e = ShardReader::open(ds.join("train/train-00000.shard"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{e}");
    }
}

#[test]
fn verify_names_a_float_block_holding_nan() {
    let t = tempfile::tempdir().unwrap();
    let (n, h, w) = (40, 4, 4);
    let src = t.path().join("np");
    write_npy(
        &src.join("x_train.npy"),
        "<f4",
        &[n, h, w],
        &le_f32(&values(n * h * w, 3)),
    );
    labels_npy(&src.join("y_train.npy"), &vec![0; n]);
    let out = t.path().join("ds");
    convert(
        &src,
        &out,
        &["--dtype", "f32", "--codec", "none", "--block-samples", "8"],
        0,
    );
    // Value 5 of block 1 becomes NaN; every checksum is made to match: the block's (stored and
    // decoded bytes are the same with codec none), the footer's, and the manifest's seal.
    let mut m = Dataset::open(&out).unwrap().manifest;
    let info = &mut m.splits.get_mut("train").unwrap().shards[0];
    let path = out.join(&info.file);
    let r = ShardReader::open(&path).unwrap();
    let (e, foot) = (*r.entry(1), r.trailer.footer_offset as usize);
    drop(r);
    let mut b = std::fs::read(&path).unwrap();
    let at = e.offset as usize + 4 * 5;
    b[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    let sum = XxHash3_64::oneshot(&b[e.offset as usize..(e.offset + e.stored_len) as usize])
        .to_le_bytes();
    b[foot + 40 + 24..foot + 40 + 32].copy_from_slice(&sum);
    b[foot + 40 + 32..foot + 40 + 40].copy_from_slice(&sum);
    let len = b.len();
    let footer = XxHash3_64::oneshot(&b[foot..len - 32]);
    b[len - 16..len - 8].copy_from_slice(&footer.to_le_bytes());
    std::fs::write(&path, b).unwrap();
    info.footer_xxh3 = format!("{footer:016x}");
    m.write(&out).unwrap();

    let o = run(&["verify", out.to_str().unwrap()], 1);
    let text = stdout(&o);
    assert!(
        text.contains("DAMAGED train/train-00000.shard: block 1: sample 0 holds NaN at value 5"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 1, "only that block: {text}");
}

#[test]
fn cpu_trains_on_float_data_and_eval_repeats_the_accuracy() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("np");
    let (h, w) = (8, 8);
    // Two classes in Hounsfield-like units: a bright square (+400) on -700, or none.
    for (split, n, seed) in [("train", 512, 1u32), ("test", 128, 2)] {
        let noise = values(n * h * w, seed);
        let labels: Vec<i64> = (0..n as i64).map(|i| i % 2).collect();
        let mut px = Vec::with_capacity(n * h * w);
        for (i, &l) in labels.iter().enumerate() {
            for p in 0..h * w {
                let (y, x) = (p / w, p % w);
                let square = l == 1 && (2..6).contains(&y) && (2..6).contains(&x);
                let base = if square { 400.0 } else { -700.0 };
                px.push(base + noise[i * h * w + p].clamp(-2000.0, 2000.0) / 40.0);
            }
        }
        write_npy(
            &src.join(format!("x_{split}.npy")),
            "<f4",
            &[n, h, w],
            &le_f32(&px),
        );
        labels_npy(&src.join(format!("y_{split}.npy")), &labels);
    }
    let ds = t.path().join("ds");
    convert(&src, &ds, &["--dtype", "f32"], 0);
    let dss = ds.to_str().unwrap();
    let run_dir = t.path().join("run");
    run(
        &[
            "train",
            dss,
            "--device",
            "cpu",
            "--epochs",
            "1",
            "--batch",
            "32",
            "--out",
            run_dir.to_str().unwrap(),
            "--quiet",
        ],
        0,
    );
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run_dir.join("config.json")).unwrap()).unwrap();
    // Normalised by the raw values' statistics: mean about 7/8 * -700 + 1/8 * 400 = -562.5.
    let mean = cfg["mean"][0].as_f64().unwrap();
    assert!((-575.0..-550.0).contains(&mean), "{cfg}");
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run_dir.join("summary.json")).unwrap()).unwrap();
    let acc = s["test_accuracy"].as_f64().unwrap();
    assert!(acc > 0.9, "one epoch on separable float data: {acc}");
    let o = run(&["eval", run_dir.to_str().unwrap(), dss, "--json"], 0);
    let e: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(e["accuracy"].as_f64().unwrap(), acc);
}
