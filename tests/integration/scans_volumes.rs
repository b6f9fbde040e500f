//! Volumes as they lie in the patient: one anatomy written with different orientations (NIfTI
//! sform and qform, DICOM series acquired axially and sagittally) converts to identical slices,
//! and `--spacing` resamples anisotropic volumes, recorded in the manifest and per sample.

use crate::scans_series::{samples, source, write, Slice};
use crate::util::*;
use std::path::Path;

/// The anatomy: voxels along L, P, S (canonical LPS indices) and their sizes in mm.
const N: [usize; 3] = [4, 3, 5];
const MM: [f64; 3] = [0.8, 0.8, 2.5];

/// The value at LPS voxel (a, b, c): distinct everywhere.
fn anatomy(a: usize, b: usize, c: usize) -> i16 {
    (a + 10 * b + 100 * c) as i16 - 200
}

/// A NIfTI-1 int16 file of `dims` whose voxel (i, j, k) holds `value(i, j, k)`, placed by an
/// sform (`cols`: each voxel axis's RAS direction, unit length) or by a qform quaternion.
enum Placement {
    Sform([[f64; 3]; 3]),
    /// (b, c, d, qfac).
    Qform([f64; 4]),
}

fn nifti(
    path: &Path,
    dims: [usize; 3],
    sp: [f64; 3],
    at: Placement,
    value: impl Fn(usize, usize, usize) -> i16,
) {
    nifti4(path, dims, 1, sp, at, |i, j, k, _| value(i, j, k))
}

/// `nifti` with `t` volumes along a 4th axis (time points or channels).
fn nifti4(
    path: &Path,
    dims: [usize; 3],
    t: usize,
    sp: [f64; 3],
    at: Placement,
    value: impl Fn(usize, usize, usize, usize) -> i16,
) {
    let mut h = vec![0u8; 352];
    let put = |h: &mut Vec<u8>, off: usize, b: &[u8]| h[off..off + b.len()].copy_from_slice(b);
    put(&mut h, 0, &348i32.to_le_bytes());
    put(&mut h, 40, &(if t > 1 { 4i16 } else { 3 }).to_le_bytes());
    for (i, d) in dims.iter().chain([&t]).enumerate() {
        put(&mut h, 42 + 2 * i, &(*d as i16).to_le_bytes());
    }
    put(&mut h, 70, &4i16.to_le_bytes());
    put(&mut h, 72, &16i16.to_le_bytes());
    let mut pixdim = [1f32; 8];
    for k in 0..3 {
        pixdim[k + 1] = sp[k] as f32;
    }
    match at {
        Placement::Sform(cols) => {
            put(&mut h, 254, &1i16.to_le_bytes()); // sform_code: scanner
            for (row, off) in [(0usize, 280usize), (1, 296), (2, 312)] {
                for j in 0..3 {
                    let v = (cols[j][row] * sp[j]) as f32;
                    put(&mut h, off + 4 * j, &v.to_le_bytes());
                }
            }
        }
        Placement::Qform([b, c, d, qfac]) => {
            put(&mut h, 252, &1i16.to_le_bytes()); // qform_code
            put(&mut h, 256, &(b as f32).to_le_bytes());
            put(&mut h, 260, &(c as f32).to_le_bytes());
            put(&mut h, 264, &(d as f32).to_le_bytes());
            pixdim[0] = qfac as f32;
        }
    }
    for (i, v) in pixdim.iter().enumerate() {
        put(&mut h, 76 + 4 * i, &v.to_le_bytes());
    }
    put(&mut h, 108, &352f32.to_le_bytes());
    put(&mut h, 112, &1f32.to_le_bytes());
    h[344..348].copy_from_slice(b"n+1\0");
    for v in 0..t {
        for k in 0..dims[2] {
            for j in 0..dims[1] {
                for i in 0..dims[0] {
                    h.extend(value(i, j, k, v).to_le_bytes());
                }
            }
        }
    }
    write(path, &h);
}

const R: [f64; 3] = [1.0, 0.0, 0.0];
const L: [f64; 3] = [-1.0, 0.0, 0.0];
const A: [f64; 3] = [0.0, 1.0, 0.0];
const P: [f64; 3] = [0.0, -1.0, 0.0];
const S: [f64; 3] = [0.0, 0.0, 1.0];
const I: [f64; 3] = [0.0, 0.0, -1.0];

/// The anatomy in every way this test writes it, one folder each.
fn write_all(root: &Path) -> Vec<(&'static str, std::path::PathBuf)> {
    let [nx, ny, nz] = N;
    let [sx, sy, sz] = MM;
    let mut out = Vec::new();
    let mut put = |name: &'static str, f: &dyn Fn(&Path)| {
        let dir = root.join(name);
        f(&dir);
        out.push((name, dir));
    };
    put("ras", &|d| {
        nifti(
            &d.join("v.nii"),
            N,
            MM,
            Placement::Sform([R, A, S]),
            |i, j, k| anatomy(nx - 1 - i, ny - 1 - j, k),
        )
    });
    put("lps", &|d| {
        nifti(
            &d.join("v.nii"),
            N,
            MM,
            Placement::Sform([L, P, S]),
            anatomy,
        )
    });
    put("las", &|d| {
        nifti(
            &d.join("v.nii"),
            N,
            MM,
            Placement::Sform([L, A, S]),
            |i, j, k| anatomy(i, ny - 1 - j, k),
        )
    });
    // LAS again through the qform: a rotation of 180 degrees about y (quaternion c = 1) with
    // qfac -1 reversing the third axis.
    put("las-qform", &|d| {
        nifti(
            &d.join("v.nii"),
            N,
            MM,
            Placement::Qform([0.0, 1.0, 0.0, -1.0]),
            |i, j, k| anatomy(i, ny - 1 - j, k),
        )
    });
    // Stored sagittally: i toward P, j toward I, k toward R.
    put("pir", &|d| {
        nifti(
            &d.join("v.nii"),
            [ny, nz, nx],
            [sy, sz, sx],
            Placement::Sform([P, I, R]),
            |i, j, k| anatomy(nx - 1 - k, i, nz - 1 - j),
        )
    });
    // A DICOM series of axial slices: columns toward L, rows toward P, slices up.
    put("dicom-axial", &|d| {
        for c in (0..nz).rev() {
            let px = (0..ny)
                .flat_map(|r| (0..nx).map(move |q| anatomy(q, r, c) as i32))
                .collect();
            let s = Slice {
                position: Some([0.0, 0.0, c as f64 * sz]),
                orientation: Some([1.0, 0.0, 0.0, 0.0, 1.0, 0.0]),
                spacing: [sy, sx],
                ..Slice::new(ny as u16, nx as u16, px)
            };
            write(&d.join(format!("s{c}.dcm")), &s.bytes());
        }
    });
    // A DICOM series of sagittal slices: columns toward P, rows toward I; its normal points to
    // the right, so slices ascend from left to right.
    put("dicom-sagittal", &|d| {
        for a in 0..nx {
            let px = (0..nz)
                .flat_map(|r| (0..ny).map(move |q| anatomy(a, q, nz - 1 - r) as i32))
                .collect();
            let s = Slice {
                position: Some([a as f64 * sx, 0.0, (nz - 1) as f64 * sz]),
                orientation: Some([0.0, 1.0, 0.0, 0.0, 0.0, -1.0]),
                spacing: [sz, sy],
                ..Slice::new(nz as u16, ny as u16, px)
            };
            write(&d.join(format!("x{a}.dcm")), &s.bytes());
        }
    });
    out
}

fn convert(input: &Path, out: &Path, extra: &[&str], code: i32) -> std::process::Output {
    let mut args = vec![
        "convert",
        input.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--test-fraction",
        "0",
    ];
    args.extend_from_slice(extra);
    if !extra.contains(&"--dtype") {
        args.extend(["--dtype", "f32"]);
    }
    run(&args, code)
}

fn values(out: &Path) -> Vec<Vec<f32>> {
    samples(out).into_iter().map(|(_, v, _)| v).collect()
}

#[test]
fn one_anatomy_in_every_orientation_gives_the_same_slices() {
    let t = tempfile::tempdir().unwrap();
    let inputs = write_all(&t.path().join("in"));
    let [nx, ny, nz] = N;
    let at = |a: usize, b: usize, c: usize| anatomy(a, b, c) as f32;
    // As viewers show them: axial slices with anterior (b = 0) on top and the patient's right
    // (a = 0... the L axis starts on the right) on the left; coronal and sagittal ones with
    // superior on top.
    let want = |axis: usize| -> Vec<Vec<f32>> {
        match axis {
            2 => (0..nz)
                .map(|c| {
                    (0..ny)
                        .flat_map(|r| (0..nx).map(move |q| at(q, r, c)))
                        .collect()
                })
                .collect(),
            1 => (0..ny)
                .map(|b| {
                    (0..nz)
                        .flat_map(|r| (0..nx).map(move |q| at(q, b, nz - 1 - r)))
                        .collect()
                })
                .collect(),
            _ => (0..nx)
                .map(|a| {
                    (0..nz)
                        .flat_map(|r| (0..ny).map(move |q| at(a, q, nz - 1 - r)))
                        .collect()
                })
                .collect(),
        }
    };
    for axis in ["0", "1", "2"] {
        let expect = want(axis.parse().unwrap());
        for (name, dir) in &inputs {
            let out = t.path().join(format!("{name}-{axis}"));
            let o = convert(dir, &out, &["--axis", axis], 0);
            assert_eq!(
                values(&out),
                expect,
                "{name} along axis {axis}: {}",
                stderr(&o)
            );
            let v = &source(&out)["volumes"];
            assert_eq!(v["orientation"], "LPS", "{v}");
            assert_eq!(v["count"], 1, "{v}");
        }
    }
    let v = source(&t.path().join("pir-2"))["volumes"].clone();
    assert_eq!(
        v["stored_orientations"],
        serde_json::json!({"PIR": 1}),
        "{v}"
    );
    assert_eq!(v["spacing"], serde_json::json!([0.8, 0.8, 2.5]), "{v}");
    // Kept as stored: the sagittal file's own axes, so other slices than the LPS ones.
    let out = t.path().join("pir-stored");
    convert(
        &t.path().join("in/pir"),
        &out,
        &["--orientation", "stored"],
        0,
    );
    let stored = values(&out);
    assert_eq!(stored.len(), nx, "slices along its stored third axis");
    assert_ne!(stored, want(0));
}

#[test]
fn spacing_resamples_warns_and_is_recorded() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("in");
    nifti(
        &dir.join("v.nii"),
        N,
        MM,
        Placement::Sform([L, P, S]),
        anatomy,
    );
    // Sagittal slices of 0.8 mm x 2.5 mm pixels: warned about without --spacing.
    let out = t.path().join("plain");
    let o = convert(&dir, &out, &["--axis", "0"], 0);
    let err = stderr(&o);
    assert!(
        err.contains("not square")
            && err.contains("0.8 mm wide x 2.5 mm high")
            && err.contains("--spacing 0.8"),
        "{err}"
    );
    let shape = |out: &Path| {
        let v: serde_json::Value =
            serde_json::from_slice(&run(&["inspect", out.to_str().unwrap(), "--json"], 0).stdout)
                .unwrap();
        v["shape"].clone()
    };
    assert_eq!(shape(&out), serde_json::json!([1, 5, 3]));
    // Resampled to 0.8 mm: 5 slices of 2.5 mm become round(12.5 / 0.8) = 16 of 0.8 mm.
    let out = t.path().join("iso");
    let o = convert(
        &dir,
        &out,
        &["--axis", "0", "--spacing", "0.8", "--meta"],
        0,
    );
    assert!(!stderr(&o).contains("not square"), "{}", stderr(&o));
    assert_eq!(shape(&out), serde_json::json!([1, 16, 3]));
    let v = &source(&out)["volumes"];
    assert_eq!(v["spacing"], serde_json::json!([0.8, 0.8, 0.8]), "{v}");
    assert_eq!(v["resampled_to"], serde_json::json!([0.8, 0.8, 0.8]), "{v}");
    let got = values(&out);
    assert_eq!(got.len(), N[0]);
    // Trilinear along z only (x and y keep their spacing): the top row is the highest slice
    // position, 15 x 0.8 = 12 mm > 10 mm (the last source slice), so the edge value.
    let top: Vec<f32> = (0..N[1]).map(|b| anatomy(1, b, N[2] - 1) as f32).collect();
    assert_eq!(got[1][..3], top[..]);
    // Row 16 - 1 - 2 (z = 2 x 0.8 = 1.6 mm = 0.64 of the first 2.5 mm gap).
    let z0 = anatomy(1, 0, 0) as f32;
    let z1 = anatomy(1, 0, 1) as f32;
    let mid = got[1][(16 - 1 - 2) * 3];
    assert!((mid - (z0 + 0.64 * (z1 - z0))).abs() < 1e-3, "{mid}");
    // Per sample: the spacing it was cut at.
    let ds = prep::format::shard::Dataset::open(&out).unwrap();
    let fields = &ds.manifest.fields;
    let k = fields.find("meta").expect("a meta field");
    let f = fields.iter().nth(k).unwrap();
    let info = &ds.manifest.splits["train"];
    let r = ds.open_shard(&info.shards[0]).unwrap();
    let block = r.read_block(0).unwrap();
    let m = f.decode_meta(block.field(fields, k, 0)).unwrap();
    assert_eq!(m["spacing_z"], 0.8, "{m:?}");
    assert_eq!(m["spacing_x"], 0.8, "{m:?}");
}

#[test]
fn u16_and_f32_keep_every_hounsfield_value_of_a_ct_series() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("ct");
    // 4 slices of 32 x 32: stored 0..4095, intercept -1024: every HU from -1024 (air) to
    // 3071 (dense bone) once, under a soft-tissue window (40/400) that u16 must not apply.
    for k in 0..4 {
        let px: Vec<i32> = (0..1024).map(|i| k * 1024 + i).collect();
        let s = Slice {
            position: Some([0.0, 0.0, k as f64 * 2.0]),
            intercept: -1024.0,
            window: Some((40.0, 400.0)),
            ..Slice::new(32, 32, px)
        };
        write(&dir.join(format!("s{k}.dcm")), &s.bytes());
    }
    let want: std::collections::BTreeSet<i32> = (-1024..3072).collect();
    for (dtype, shift) in [("f32", 0.0), ("u16", 32768.0)] {
        let out = t.path().join(dtype);
        convert(&dir, &out, &["--dtype", dtype], 0);
        let got: std::collections::BTreeSet<i32> = values(&out)
            .into_iter()
            .flatten()
            .map(|v| (v - shift) as i32)
            .collect();
        assert_eq!(got, want, "{dtype}: every HU value, each as itself");
        if dtype == "u16" {
            assert_eq!(source(&out)["u16_values"], "modality value + 32768");
        }
    }
    // Resampled (trilinear between slices) into u16: whole values still, rounded.
    let out = t.path().join("u16-resampled");
    convert(&dir, &out, &["--dtype", "u16", "--spacing", "0.7x0.7x1"], 0);
    let got = values(&out);
    assert_eq!(
        got.len(),
        8,
        "4 slices of 2 mm become 8 of 1 mm (the same extent)"
    );
    assert!(got.iter().flatten().all(|v| v.fract() == 0.0));
    // u8 still shows the series' window: air and bone are both clipped.
    let out = t.path().join("u8");
    convert(&dir, &out, &["--dtype", "u8"], 0);
    let got: std::collections::BTreeSet<i32> = values(&out)
        .into_iter()
        .flatten()
        .map(|v| v as i32)
        .collect();
    assert!(got.len() <= 256 && got.contains(&0) && got.contains(&255));
}

#[test]
fn a_modality_stack_gives_multi_channel_samples() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("brats");
    // Two cases of 4 modalities, each modality on its own scale (as T1, T1c, T2 and FLAIR are).
    for case in 0..2 {
        nifti4(
            &dir.join(format!("case{case}.nii")),
            N,
            4,
            MM,
            Placement::Sform([L, P, S]),
            |i, j, k, m| (anatomy(i, j, k) + 300) * (m as i16 + 1) + case,
        );
    }
    let out = t.path().join("f32");
    let o = convert(&dir, &out, &[], 0);
    let v: serde_json::Value =
        serde_json::from_slice(&run(&["inspect", out.to_str().unwrap(), "--json"], 0).stdout)
            .unwrap();
    assert_eq!(v["shape"], serde_json::json!([4, 3, 4]), "{}", stderr(&o));
    let got = values(&out);
    assert_eq!(got.len(), 2 * N[2], "one sample per axial slice");
    // Sample = slice c of a case: 4 planes, plane m the modality's values.
    let one = got
        .iter()
        .find(|s| s[0] == (anatomy(0, 0, 2) + 300) as f32)
        .expect("slice 2 of case 0");
    for m in 0..4 {
        let plane: Vec<f32> = (0..N[1])
            .flat_map(|b| (0..N[0]).map(move |a| ((anatomy(a, b, 2) + 300) * (m + 1)) as f32))
            .collect();
        assert_eq!(one[m as usize * 12..][..12], plane[..], "modality {m}");
    }
    // u8: every modality windowed on its own, so each plane spans the same 0..255.
    let out = t.path().join("u8");
    convert(&dir, &out, &["--dtype", "u8"], 0);
    let got = values(&out);
    assert_eq!(got[0].len(), 4 * 12);
    let top = |m: usize| {
        got.iter()
            .map(|s| s[m * 12..][..12].iter().cloned().fold(0.0, f32::max))
            .fold(0.0, f32::max)
    };
    assert!(
        (0..4).all(|m| top(m) == 255.0),
        "{:?}",
        (0..4).map(top).collect::<Vec<_>>()
    );
    // Taken as time points instead: 4 x 5 grey slices a case.
    let out = t.path().join("time");
    convert(&dir, &out, &["--fourth-axis", "time"], 0);
    assert_eq!(values(&out).len(), 2 * 4 * N[2]);
}

#[test]
fn a_time_series_keeps_its_signal_and_records_t() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("fmri");
    // 8 time points: the signal rises by 1% a step over a baseline of 1000.
    let tp = 8;
    nifti4(
        &dir.join("run.nii"),
        N,
        tp,
        MM,
        Placement::Sform([L, P, S]),
        |i, j, k, v| 1000 + (anatomy(i, j, k) + 200) / 4 + 10 * v as i16,
    );
    for dtype in ["u8", "u16"] {
        let out = t.path().join(dtype);
        convert(
            &dir,
            &out,
            &["--dtype", dtype, "--window=900:1200", "--meta"],
            0,
        );
        let by_t = slice_means(&out);
        assert_eq!(by_t.len(), tp * N[2]);
        // Slice 2 at every t: its mean rises with t as in the source.
        let means: Vec<f64> = (0..tp).map(|v| by_t[&(v, 2)]).collect();
        assert!(means.windows(2).all(|w| w[1] > w[0]), "{dtype}: {means:?}");
    }
    // No window given: one percentile window over the whole series, not one per time point
    // (which would make every time point's slice look the same).
    let out = t.path().join("auto");
    convert(&dir, &out, &["--dtype", "u8", "--meta"], 0);
    let by_t = slice_means(&out);
    let means: Vec<f64> = (0..tp).map(|v| by_t[&(v, 2)]).collect();
    assert!(means.windows(2).all(|w| w[1] > w[0]), "{means:?}");
    assert!(means[tp - 1] - means[0] > 20.0, "{means:?}");
    // --every 3 keeps time points 0, 3 and 6, named so, through the same window.
    let out = t.path().join("every");
    convert(&dir, &out, &["--dtype", "u8", "--meta", "--every", "3"], 0);
    let picked = slice_means(&out);
    let ts: std::collections::BTreeSet<usize> = picked.keys().map(|k| k.0).collect();
    assert_eq!(ts, [0, 3, 6].into());
    assert_eq!(picked[&(3, 2)], by_t[&(3, 2)]);
}

/// The mean of every sample by its (t, slice) metadata.
fn slice_means(out: &Path) -> std::collections::BTreeMap<(usize, usize), f64> {
    let ds = prep::format::shard::Dataset::open(out).unwrap();
    let fields = &ds.manifest.fields;
    let k = fields.find("meta").expect("a meta field");
    let f = fields.iter().nth(k).unwrap();
    let dtype = ds.manifest.sample.dtype;
    let mut by = std::collections::BTreeMap::new();
    for info in ds.manifest.splits.values() {
        for sh in &info.shards {
            let r = ds.open_shard(sh).unwrap();
            for b in 0..r.num_blocks() {
                let block = r.read_block(b).unwrap();
                for i in 0..block.len() {
                    let m = f.decode_meta(block.field(fields, k, i)).unwrap();
                    let s = block.sample(i);
                    let n = s.len() / dtype.size();
                    let mean = (0..n).map(|q| dtype.get(s, q) as f64).sum::<f64>() / n as f64;
                    let key = (
                        m["t"].as_u64().unwrap() as usize,
                        m["slice"].as_u64().unwrap() as usize,
                    );
                    by.insert(key, mean);
                }
            }
        }
    }
    by
}

/// The label of LPS voxel (a, b, c).
fn organ(a: usize, b: usize, c: usize) -> u8 {
    ((a + 2 * b + c) % 3) as u8
}

/// An axial DICOM series of the anatomy (plus `1000 * p`) for patient `p`, in `dir`.
fn axial_series(dir: &Path, p: usize) {
    let [nx, ny, nz] = N;
    for c in 0..nz {
        let px = (0..ny)
            .flat_map(|r| (0..nx).map(move |q| anatomy(q, r, c) as i32 + 1000 * p as i32))
            .collect();
        let s = Slice {
            patient: Some(format!("P{p}")),
            series: Some(format!("1.2.826.0.1.3680043.99.7.{p}")),
            position: Some([0.0, 0.0, c as f64 * MM[2]]),
            orientation: Some([1.0, 0.0, 0.0, 0.0, 1.0, 0.0]),
            spacing: [MM[1], MM[0]],
            ..Slice::new(ny as u16, nx as u16, px)
        };
        write(&dir.join(format!("s{c}.dcm")), &s.bytes());
    }
}

/// Every sample's (patient, slice) from its first pixel, with its mask.
fn masks_by_slice(out: &Path) -> std::collections::BTreeMap<(usize, usize), Vec<u8>> {
    let ds = prep::format::shard::Dataset::open(out).unwrap();
    let fields = &ds.manifest.fields;
    let k = fields.find("mask").expect("a mask field");
    let mut by = std::collections::BTreeMap::new();
    for info in ds.manifest.splits.values() {
        for sh in &info.shards {
            let r = ds.open_shard(sh).unwrap();
            for b in 0..r.num_blocks() {
                let block = r.read_block(b).unwrap();
                for i in 0..block.len() {
                    let first = f32::from_le_bytes(block.sample(i)[..4].try_into().unwrap());
                    let v = first as i32 + 200;
                    let (p, c) = (v / 1000, (v % 1000) / 100);
                    by.insert((p as usize, c as usize), block.field(fields, k, i).to_vec());
                }
            }
        }
    }
    by
}

#[test]
fn a_dicom_series_takes_its_label_volume_or_mask_images() {
    let t = tempfile::tempdir().unwrap();
    let (input, masks) = (t.path().join("in"), t.path().join("masks"));
    let [nx, ny, nz] = N;
    for p in 0..3 {
        axial_series(&input.join(format!("p{p}/ct")), p);
    }
    // p0: a label volume stored LPS; p1: the same labels stored RAS (as ITK-SNAP or 3D Slicer
    // may write them); p2: a mask image for every slice file.
    nifti(
        &masks.join("p0/ct.nii.gz"),
        N,
        MM,
        Placement::Sform([L, P, S]),
        |i, j, k| organ(i, j, k) as i16,
    );
    nifti(
        &masks.join("p1/ct.nii"),
        N,
        MM,
        Placement::Sform([R, A, S]),
        |i, j, k| organ(nx - 1 - i, ny - 1 - j, k) as i16,
    );
    for c in 0..nz {
        let img = image::GrayImage::from_fn(nx as u32, ny as u32, |q, r| {
            image::Luma([organ(q as usize, r as usize, c)])
        });
        let path = masks.join(format!("p2/ct/s{c}.png"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        img.save(&path).unwrap();
    }
    let out = t.path().join("out");
    let m = masks.to_str().unwrap();
    let o = convert(&input, &out, &["--masks", m], 0);
    assert!(
        rejects_of(&out).is_empty(),
        "{:?} {}",
        rejects_of(&out),
        stderr(&o)
    );
    let by = masks_by_slice(&out);
    assert_eq!(by.len(), 3 * nz, "{by:?}");
    for p in 0..3 {
        for c in 0..nz {
            let want: Vec<u8> = (0..ny)
                .flat_map(|r| (0..nx).map(move |q| organ(q, r, c)))
                .collect();
            assert_eq!(by[&(p, c)], want, "patient {p} slice {c}");
        }
    }
    // Along x (sagittal slices): the masks are cut as the images are.
    let out = t.path().join("sag");
    convert(&input, &out, &["--masks", m, "--axis", "0"], 0);
    let ds = prep::format::shard::Dataset::open(&out).unwrap();
    assert_eq!(
        ds.manifest.fields.iter().next().unwrap().shape,
        vec![nz as u32, ny as u32]
    );

    // A label volume on another grid is refused by name, the series left out whole.
    nifti(
        &masks.join("p0/ct.nii.gz"),
        [nx, ny, nz + 1],
        MM,
        Placement::Sform([L, P, S]),
        |_, _, _| 0,
    );
    let out = t.path().join("bad");
    convert(&input, &out, &["--masks", m], 0);
    let r = rejects_of(&out);
    assert_eq!(r.len(), nz, "{r:?}");
    assert!(
        r.iter().all(|(p, why)| p.starts_with("p0/")
            && why.contains("p0/ct.nii.gz")
            && why.contains("grid")),
        "{r:?}"
    );
    // A label volume with no series beside it.
    nifti(
        &masks.join("p9/ct.nii"),
        N,
        MM,
        Placement::Sform([L, P, S]),
        |_, _, _| 0,
    );
    let out = t.path().join("orphan");
    let o = convert(&input, &out, &["--masks", m], 0);
    let all = std::fs::read_to_string(out.join("rejects.jsonl")).unwrap_or_default() + &stderr(&o);
    assert!(
        all.contains("p9/ct.nii") && all.contains("without a DICOM series"),
        "{all}"
    );
}

fn rejects_of(out: &Path) -> Vec<(String, String)> {
    crate::scans_series::rejects(out)
}
