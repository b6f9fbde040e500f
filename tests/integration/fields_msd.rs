//! Medical Segmentation Decathlon and nnU-Net folders: dataset.json, imagesTr/ (one 4-D file per
//! case, or one 3-D file per channel), labelsTr/. Every slice is a sample of C channels with its
//! label slice as the `mask` field, the splits fall by case, and every kind of disagreement
//! between dataset.json and the files is one reject (or one error) naming the file.

use crate::util::{run, stderr};
use prep::format::shard::{Dataset, Dtype};
use prep::source::transform::{fit_mask, Fit, Target};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};

/// x, y, z of every volume; slices along z (the default axis) are Y high and X wide.
const X: usize = 5;
const Y: usize = 4;
const Z: usize = 6;
const CASES: usize = 10;
const LABELS: [&str; 3] = ["background", "edema", "tumour"];

/// Voxels of one 3-D volume, x fastest.
enum Vox {
    I16(Vec<i16>),
    U8(Vec<u8>),
}

/// A NIfTI-1 single file (gzipped for `.gz`) of `dims` (3-D or 4-D).
fn nifti(path: &Path, dims: &[usize], v: &Vox) {
    let (code, bits, data): (i16, i16, Vec<u8>) = match v {
        Vox::I16(v) => (4, 16, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        Vox::U8(v) => (2, 8, v.clone()),
    };
    assert_eq!(
        data.len() * 8 / bits as usize,
        dims.iter().product::<usize>()
    );
    let mut h = vec![0u8; 352];
    h[0..4].copy_from_slice(&348i32.to_le_bytes());
    h[40..42].copy_from_slice(&(dims.len() as i16).to_le_bytes());
    for i in 0..7 {
        let d = *dims.get(i).unwrap_or(&1) as i16;
        h[42 + 2 * i..44 + 2 * i].copy_from_slice(&d.to_le_bytes());
    }
    h[70..72].copy_from_slice(&code.to_le_bytes());
    h[72..74].copy_from_slice(&bits.to_le_bytes());
    for i in 0..8 {
        h[76 + 4 * i..80 + 4 * i].copy_from_slice(&1f32.to_le_bytes());
    }
    h[108..112].copy_from_slice(&352f32.to_le_bytes());
    h[112..116].copy_from_slice(&1f32.to_le_bytes());
    h[344..348].copy_from_slice(b"n+1\0");
    h.extend(data);
    let bytes = if path.to_string_lossy().ends_with(".gz") {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(&h).unwrap();
        e.finish().unwrap()
    } else {
        h
    };
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// Channel `c` of case `i` at (x, y, z): a value no other voxel of any case or channel has.
fn voxel(i: usize, c: usize, x: usize, y: usize, z: usize) -> i16 {
    (i * 1000 + c * 500 + z * 50 + y * 10 + x) as i16 - 3000
}

fn channel(i: usize, c: usize) -> Vec<i16> {
    let mut v = Vec::with_capacity(X * Y * Z);
    for z in 0..Z {
        for y in 0..Y {
            for x in 0..X {
                v.push(voxel(i, c, x, y, z));
            }
        }
    }
    v
}

/// Case `i`'s label: background on slice 0 and where (i + z) % 4 == 0, else 0, 1 and 2.
fn label(i: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(X * Y * Z);
    for z in 0..Z {
        for y in 0..Y {
            for x in 0..X {
                let empty = z == 0 || (i + z) % 4 == 0;
                v.push(if empty { 0 } else { ((x + y + i) % 3) as u8 });
            }
        }
    }
    v
}

/// Slice z of a volume as prep cuts it: no qform or sform, so RAS by the NIfTI rule, brought to
/// LPS: row r is y = Y - 1 - r (anterior at the top), column c is x = X - 1 - c (the patient's
/// right on the left).
fn slice<T: Copy>(vol: &[T], z: usize) -> Vec<T> {
    (0..Y)
        .flat_map(|r| (0..X).map(move |c| (X - 1 - c, Y - 1 - r)))
        .map(|(x, y)| vol[x + X * (y + Y * z)])
        .collect()
}

fn id(i: usize) -> String {
    format!("case_{i:03}")
}

/// The MSD layout: one 4-D file (x, y, z, channel) per case, dataset.json listing them.
fn msd(dir: &Path) {
    let mut training = Vec::new();
    for i in 0..CASES {
        let mut both = channel(i, 0);
        both.extend(channel(i, 1));
        let img = format!("imagesTr/{}.nii.gz", id(i));
        let lab = format!("labelsTr/{}.nii.gz", id(i));
        nifti(&dir.join(&img), &[X, Y, Z, 2], &Vox::I16(both));
        nifti(&dir.join(&lab), &[X, Y, Z], &Vox::U8(label(i)));
        training
            .push(serde_json::json!({"image": format!("./{img}"), "label": format!("./{lab}")}));
    }
    let mut both = channel(50, 0);
    both.extend(channel(50, 1));
    nifti(
        &dir.join("imagesTs/case_050.nii.gz"),
        &[X, Y, Z, 2],
        &Vox::I16(both),
    );
    // A file the list does not name is left out, with a note.
    std::fs::copy(
        dir.join("imagesTr/case_000.nii.gz"),
        dir.join("imagesTr/stray.nii.gz"),
    )
    .unwrap();
    // macOS leaves ._ files in the Decathlon's archives: hidden, never a case.
    std::fs::write(dir.join("imagesTr/._case_000.nii.gz"), b"resource fork").unwrap();
    json(
        dir,
        &serde_json::json!({
            "name": "Test",
            "modality": {"0": "FLAIR", "1": "T1w"},
            "labels": {"0": "background", "1": "edema", "2": "tumour"},
            "numTraining": CASES,
            "numTest": 1,
            "training": training,
            "test": ["./imagesTs/case_050.nii.gz"]
        }),
    );
}

/// nnU-Net v2: one 3-D file per channel (`_0000`, `_0001`), dataset.json listing no files.
fn nnunet(dir: &Path) {
    for i in 0..CASES {
        for c in 0..2 {
            let p = dir.join(format!("imagesTr/{}_{c:04}.nii.gz", id(i)));
            nifti(&p, &[X, Y, Z], &Vox::I16(channel(i, c)));
        }
        let lab = dir.join(format!("labelsTr/{}.nii.gz", id(i)));
        nifti(&lab, &[X, Y, Z], &Vox::U8(label(i)));
    }
    for c in 0..2 {
        let p = dir.join(format!("imagesTs/case_050_{c:04}.nii.gz"));
        nifti(&p, &[X, Y, Z], &Vox::I16(channel(50, c)));
    }
    json(
        dir,
        &serde_json::json!({
            "channel_names": {"0": "FLAIR", "1": "T1w"},
            "labels": {"background": 0, "edema": 1, "tumour": 2},
            "numTraining": CASES,
            "file_ending": ".nii.gz"
        }),
    );
}

/// nnU-Net v1: one file per channel, and dataset.json in MSD's style listing `x.nii.gz` for
/// the files `x_0000.nii.gz`, `x_0001.nii.gz`.
fn nnunet_v1(dir: &Path) {
    nnunet(dir);
    let training: Vec<serde_json::Value> = (0..CASES)
        .map(|i| {
            serde_json::json!({
                "image": format!("./imagesTr/{}.nii.gz", id(i)),
                "label": format!("./labelsTr/{}.nii.gz", id(i))
            })
        })
        .collect();
    json(
        dir,
        &serde_json::json!({
            "modality": {"0": "FLAIR", "1": "T1w"},
            "labels": {"0": "background", "1": "edema", "2": "tumour"},
            "numTraining": CASES,
            "training": training,
            "test": ["./imagesTs/case_050.nii.gz"]
        }),
    );
}

fn json(dir: &Path, v: &serde_json::Value) {
    std::fs::write(
        dir.join("dataset.json"),
        serde_json::to_vec_pretty(v).unwrap(),
    )
    .unwrap();
}

fn convert(input: &Path, out: &Path, extra: &[&str], code: i32) -> std::process::Output {
    let mut args = vec![
        "convert",
        input.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(extra);
    run(&args, code)
}

fn report(o: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).expect("convert --json prints JSON")
}

/// Every sample as (split, pixels, mask bytes), in stored order.
fn samples(out: &Path) -> Vec<(String, Vec<u8>, Vec<u8>)> {
    let d = Dataset::open(out).unwrap();
    let mut v = Vec::new();
    for (split, sh) in d.shards() {
        let r = d.open_shard(sh).unwrap();
        for b in 0..r.num_blocks() {
            let blk = r.read_block(b).unwrap();
            for i in 0..blk.len() {
                let m = blk.field(&d.manifest.fields, 0, i).to_vec();
                v.push((split.to_string(), blk.sample(i).to_vec(), m));
            }
        }
    }
    v
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The case and slice a sample of channel-0 value `v0` (its first pixel) comes from.
fn origin(v0: f32) -> (usize, usize) {
    let v = v0 as i64 + 3000;
    ((v / 1000) as usize, (v % 500 / 50) as usize)
}

fn rejects(out: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(out.join("rejects.jsonl")).unwrap_or_default();
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["path"].as_str().unwrap().to_string(),
                v["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn both_layouts_give_every_slice_with_its_mask_split_by_case() {
    for layout in ["msd", "nnunet", "nnunet-v1"] {
        let t = tempfile::tempdir().unwrap();
        let input = t.path().join("Task01");
        match layout {
            "msd" => msd(&input),
            "nnunet" => nnunet(&input),
            _ => nnunet_v1(&input),
        }
        let out = t.path().join("out");
        let o = convert(
            &input,
            &out,
            &["--dtype", "f32", "--test-fraction", "0.4"],
            0,
        );
        let r = report(&o);
        assert_eq!(r["kind"], "msd", "{layout}: detected");
        assert_eq!(r["shape"], serde_json::json!([2, Y, X]));
        let notes = r["notes"].to_string();
        assert!(
            notes.contains("imagesTs/ (1 case) has no labels and is not converted"),
            "{layout}: {notes}"
        );
        assert!(notes.contains("split by case id"), "{notes}");
        if layout == "msd" {
            assert!(
                notes.contains("1 file in imagesTr/ not in dataset.json's training list, left out (e.g. imagesTr/stray.nii.gz)"),
                "{notes}"
            );
        }
        assert!(rejects(&out).is_empty(), "{layout}: {:?}", rejects(&out));

        // The mask's names are dataset.json's, in value order.
        let v: serde_json::Value =
            serde_json::from_slice(&run(&["inspect", out.to_str().unwrap(), "--json"], 0).stdout)
                .unwrap();
        let f = &v["fields"][0];
        assert_eq!(f["name"], "mask");
        assert_eq!(f["kind"], "mask");
        assert_eq!(f["dtype"], "u8");
        assert_eq!(f["names"], serde_json::json!(LABELS));
        assert_eq!(f["shape"], serde_json::json!([Y, X]));
        let d = Dataset::open(&out).unwrap();
        assert_eq!(d.manifest.classes, vec!["all"]);
        assert_eq!(d.manifest.sample.dtype, Dtype::F32);
        assert_eq!(d.manifest.provenance.source["split_key"], "case");

        // Every slice of every case exactly once, pixels and mask equal to the volumes, the
        // slices of a case together, in order, and in one split.
        let all = samples(&out);
        assert_eq!(all.len(), CASES * Z, "{layout}");
        let mut split_of: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
        let mut seen = BTreeSet::new();
        for (k, (split, px, mask)) in all.iter().enumerate() {
            let px = f32s(px);
            let (i, z) = origin(px[0]);
            assert_eq!(z, k % Z, "{layout}: sample {k} is case {i}'s slice {z}");
            assert!(seen.insert((i, z)));
            for c in 0..2 {
                let want: Vec<f32> = slice(&channel(i, c), z).iter().map(|&v| v as f32).collect();
                assert_eq!(
                    &px[c * X * Y..][..X * Y],
                    &want[..],
                    "{layout} case {i} z {z} c {c}"
                );
            }
            assert_eq!(mask, &slice(&label(i), z), "{layout} case {i} z {z} mask");
            split_of.entry(i).or_default().insert(split.clone());
        }
        assert!(split_of.values().all(|s| s.len() == 1), "{split_of:?}");
        let splits: BTreeSet<&String> = split_of.values().flatten().collect();
        assert_eq!(splits.len(), 2, "both splits drawn: {split_of:?}");
        // The split is the case id's hash, as the report's counts say.
        let per_split = |s: &str| split_of.values().filter(|v| v.contains(s)).count() * Z;
        assert_eq!(r["splits"]["train"], per_split("train") as u64);
        assert_eq!(r["splits"]["test"], per_split("test") as u64);
    }
}

#[test]
fn default_pixels_are_windowed_as_the_nifti_source_windows_each_channel() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("Task02");
    nnunet(&input);
    // Along z (the default) and along x, where slices are Z high and Y wide.
    for (axis, n, plane) in [("2", Z, [Y, X]), ("0", X, [Z, Y])] {
        let out = t.path().join(format!("out{axis}"));
        let r = report(&convert(
            &input,
            &out,
            &["--test-fraction", "0", "--axis", axis],
            0,
        ));
        assert_eq!(r["dtype"], "u8", "the NIfTI source's default");
        assert_eq!(r["shape"], serde_json::json!([2, plane[0], plane[1]]));
        let size = plane[0] * plane[1];
        // Each channel file converted on its own by the NIfTI source gives that channel's
        // planes.
        let all = samples(&out);
        assert_eq!(all.len(), CASES * n);
        for c in 0..2 {
            let single = t.path().join(format!("single{c}-{axis}"));
            let file = input.join(format!("imagesTr/case_003_{c:04}.nii.gz"));
            let (f, s) = (file.to_str().unwrap(), single.to_str().unwrap());
            run(
                &[
                    "convert",
                    f,
                    "--out",
                    s,
                    "--test-fraction",
                    "0",
                    "--axis",
                    axis,
                    "--quiet",
                ],
                0,
            );
            let want = samples_px(&single);
            assert_eq!(want.len(), n);
            for (k, w) in want.iter().enumerate() {
                let got = &all[3 * n + k].1;
                assert_eq!(
                    &got[c * size..][..size],
                    &w[..],
                    "axis {axis}: case 3 slice {k} channel {c}"
                );
            }
        }
    }
}

fn samples_px(out: &Path) -> Vec<Vec<u8>> {
    let d = Dataset::open(out).unwrap();
    let mut v = Vec::new();
    for (_, sh) in d.shards() {
        let r = d.open_shard(sh).unwrap();
        for b in 0..r.num_blocks() {
            let blk = r.read_block(b).unwrap();
            v.extend((0..blk.len()).map(|i| blk.sample(i).to_vec()));
        }
    }
    v
}

#[test]
fn resized_masks_are_the_source_masks_fitted_by_nearest_neighbour() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("Task03");
    msd(&input);
    for (fit, name) in [
        (Fit::Pad, "pad"),
        (Fit::Crop, "crop"),
        (Fit::Stretch, "stretch"),
    ] {
        let out = t.path().join(format!("out-{name}"));
        let o = convert(
            &input,
            &out,
            &[
                "--size",
                "9x7",
                "--fit",
                name,
                "--test-fraction",
                "0",
                "--dtype",
                "f32",
            ],
            0,
        );
        assert_eq!(report(&o)["shape"], serde_json::json!([2, 9, 7]));
        let target = Target {
            channels: 2,
            height: 9,
            width: 7,
            dtype: Dtype::F32,
            fit,
        };
        let all = samples(&out);
        assert_eq!(all.len(), CASES * Z);
        for (k, (_, _, mask)) in all.iter().enumerate() {
            let (i, z) = (k / Z, k % Z);
            let want = fit_mask(&slice(&label(i), z), X as u32, Y as u32, &target);
            assert_eq!(mask, &want, "{name}: case {i} slice {z}");
        }
    }
}

#[test]
fn skip_empty_masks_leaves_out_background_slices_and_counts_them() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("Task04");
    nnunet(&input);
    let out = t.path().join("out");
    let o = convert(&input, &out, &["--skip-empty-masks", "--dtype", "f32"], 0);
    let empty: usize = (0..CASES)
        .map(|i| {
            (0..Z)
                .filter(|&z| slice(&label(i), z).iter().all(|&v| v == 0))
                .count()
        })
        .sum();
    assert!(empty > CASES, "the generator leaves slices empty");
    let r = report(&o);
    let note = format!("--skip-empty-masks: {empty} slices left out, their masks all background");
    assert!(r["notes"].to_string().contains(&note), "{}", r["notes"]);
    assert!(stderr(&o).contains(&note));
    let all = samples(&out);
    assert_eq!(all.len(), CASES * Z - empty);
    for (_, px, mask) in &all {
        assert!(mask.iter().any(|&v| v != 0));
        let (i, z) = origin(f32s(px)[0]);
        assert_eq!(mask, &slice(&label(i), z));
    }
    assert_eq!(
        Dataset::open(&out).unwrap().manifest.provenance.source["skip_empty_masks"],
        true
    );
    // Anything but a folder of volumes with labels refuses the flag.
    let npy = t.path().join("npy");
    std::fs::create_dir_all(&npy).unwrap();
    crate::util::write_npy(&npy.join("x_train.npy"), "|u1", &[2, 3, 3], &[0; 18]);
    crate::util::write_npy(&npy.join("y_train.npy"), "|u1", &[2], &[0, 1]);
    let o = convert(&npy, &t.path().join("o2"), &["--skip-empty-masks"], 2);
    assert!(stderr(&o).contains("--skip-empty-masks"), "{}", stderr(&o));
}

/// A fresh copy of a layout with `spoil` applied, converted with `--on-error skip` (its rejects)
/// and `--on-error fail` (exit 1 naming `file`, nothing written).
fn spoilt(layout: fn(&Path), spoil: impl Fn(&Path)) -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("Task");
    layout(&input);
    spoil(&input);
    (t, input)
}

fn expect_reject(layout: fn(&Path), spoil: impl Fn(&Path), file: &str, why: &str, cases: usize) {
    let (t, input) = spoilt(layout, spoil);
    let out = t.path().join("skip");
    convert(&input, &out, &["--quiet", "--test-fraction", "0"], 0);
    let r = rejects(&out);
    assert_eq!(r.len(), 1, "{file}: {r:?}");
    assert_eq!(r[0].0, file);
    assert!(r[0].1.contains(why), "{file}: {:?} lacks {why:?}", r[0].1);
    assert_eq!(samples(&out).len(), cases * Z, "{file}");
    let out = t.path().join("fail");
    let o = convert(&input, &out, &["--quiet", "--on-error", "fail"], 1);
    let e = stderr(&o);
    assert!(
        e.contains(&format!("Task/{file}")) && e.contains(why),
        "{e}"
    );
    assert!(!out.exists(), "nothing written for {file}");
}

#[test]
fn files_that_disagree_with_dataset_json_or_each_other_reject_their_case() {
    let msd_: fn(&Path) = msd;
    let nnunet_: fn(&Path) = nnunet;
    // A listed image missing (dataset.json then also counts more cases than usable).
    expect_reject(
        msd_,
        |d| {
            let mut v: serde_json::Value =
                serde_json::from_slice(&std::fs::read(d.join("dataset.json")).unwrap()).unwrap();
            v["training"]
                .as_array_mut()
                .unwrap()
                .push(serde_json::json!(
                    {"image": "./imagesTr/case_099.nii.gz", "label": "./labelsTr/case_099.nii.gz"}
                ));
            v["numTraining"] = (CASES + 1).into();
            json(d, &v);
        },
        "imagesTr/case_099.nii.gz",
        "missing: dataset.json lists it (training[10])",
        CASES,
    );
    // numTraining that is not the number of cases: all of them are converted.
    expect_reject(
        nnunet_,
        |d| {
            let mut v: serde_json::Value =
                serde_json::from_slice(&std::fs::read(d.join("dataset.json")).unwrap()).unwrap();
            v["numTraining"] = 12.into();
            json(d, &v);
        },
        "dataset.json",
        "numTraining is 12, but imagesTr/ holds 10 cases",
        CASES,
    );
    // A label missing, in both layouts.
    for layout in [msd_, nnunet_] {
        expect_reject(
            layout,
            |d| std::fs::remove_file(d.join("labelsTr/case_004.nii.gz")).unwrap(),
            "labelsTr/case_004.nii.gz",
            "missing",
            CASES - 1,
        );
    }
    // A 4-D file with 3 channels where dataset.json names 2.
    expect_reject(
        msd_,
        |d| {
            let mut v = channel(2, 0);
            v.extend(channel(2, 1));
            v.extend(channel(2, 1));
            nifti(
                &d.join("imagesTr/case_002.nii.gz"),
                &[X, Y, Z, 3],
                &Vox::I16(v),
            );
        },
        "imagesTr/case_002.nii.gz",
        "is 5x4x6x3: 3 volumes along its 4th axis, but dataset.json names 2 channels (FLAIR, T1w)",
        CASES - 1,
    );
    // nnU-Net: a channel file missing, and one too many.
    expect_reject(
        nnunet_,
        |d| std::fs::remove_file(d.join("imagesTr/case_005_0001.nii.gz")).unwrap(),
        "imagesTr/case_005_0001.nii.gz",
        "channel 1 (T1w) has none",
        CASES - 1,
    );
    expect_reject(
        nnunet_,
        |d| {
            nifti(
                &d.join("imagesTr/case_005_0002.nii.gz"),
                &[X, Y, Z],
                &Vox::I16(channel(5, 1)),
            )
        },
        "imagesTr/case_005_0002.nii.gz",
        "a file for channel 2 of case case_005, but dataset.json names 2 channels",
        CASES - 1,
    );
    // A channel on another grid than its label.
    expect_reject(
        nnunet_,
        |d| {
            let v = channel(6, 1)[..X * Y * (Z - 1)].to_vec();
            nifti(
                &d.join("imagesTr/case_006_0001.nii.gz"),
                &[X, Y, Z - 1],
                &Vox::I16(v),
            );
        },
        "imagesTr/case_006_0001.nii.gz",
        "is 5x4x5, its label labelsTr/case_006.nii.gz is 5x4x6",
        CASES - 1,
    );
    // A label value beyond dataset.json's names: the voxel and the value.
    expect_reject(
        msd_,
        |d| {
            let mut l = label(7);
            l[3 + X * (2 + Y * 4)] = 3;
            nifti(&d.join("labelsTr/case_007.nii.gz"), &[X, Y, Z], &Vox::U8(l));
        },
        "labelsTr/case_007.nii.gz",
        "label value 3 at voxel (3, 2, 4) is beyond the 3 labels dataset.json names",
        CASES - 1,
    );
    // A truncated channel file: the NIfTI reader's reason, naming the file.
    expect_reject(
        nnunet_,
        |d| {
            let p = d.join("imagesTr/case_008_0000.nii.gz");
            let b = std::fs::read(&p).unwrap();
            std::fs::write(&p, &b[..b.len() / 2]).unwrap();
        },
        "imagesTr/case_008_0000.nii.gz",
        "NIfTI",
        CASES - 1,
    );
}

#[test]
fn a_dataset_json_that_cannot_be_used_stops_the_run_naming_it() {
    let cases: [(&str, Vec<u8>); 5] = [
        ("not an object", b"[1, 2, 3]".to_vec()),
        ("not JSON", b"{\"modality\": ".to_vec()),
        (
            "regions",
            br#"{"channel_names": {"0": "FLAIR"}, "labels": {"background": 0, "whole tumor": [1, 2, 3]}, "file_ending": ".nii.gz"}"#.to_vec(),
        ),
        (
            "no labels",
            br#"{"channel_names": {"0": "FLAIR", "1": "T1w"}}"#.to_vec(),
        ),
        ("too large", vec![b' '; (16 << 20) + 1]),
    ];
    let wants = [
        "expected a JSON object, found an array",
        "not JSON",
        "\"whole tumor\" is a region",
        "no \"labels\"",
        "larger than the 16777216-byte cap for dataset.json",
    ];
    for ((what, bytes), want) in cases.into_iter().zip(wants) {
        let t = tempfile::tempdir().unwrap();
        let input = t.path().join("Task");
        nnunet(&input);
        std::fs::write(input.join("dataset.json"), bytes).unwrap();
        let out = t.path().join("out");
        let o = convert(&input, &out, &["--quiet"], 1);
        let e = stderr(&o);
        assert!(
            e.contains("Task/dataset.json") && e.contains(want),
            "{what}: {e}"
        );
        assert!(!out.exists(), "{what}: nothing written");
    }
}

#[test]
fn more_than_256_label_names_make_a_u16_mask() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("Task05");
    nnunet(&input);
    let labels: serde_json::Map<String, serde_json::Value> =
        (0..300).map(|k| (format!("l{k}"), k.into())).collect();
    json(
        &input,
        &serde_json::json!({
            "channel_names": {"0": "FLAIR", "1": "T1w"},
            "labels": labels,
            "file_ending": ".nii.gz"
        }),
    );
    let mut l: Vec<u16> = label(2).iter().map(|&v| v as u16).collect();
    l[7] = 299;
    nifti(
        &input.join("labelsTr/case_002.nii.gz"),
        &[X, Y, Z],
        &Vox::I16(l.iter().map(|&v| v as i16).collect()),
    );
    let out = t.path().join("out");
    convert(
        &input,
        &out,
        &["--quiet", "--test-fraction", "0", "--dtype", "f32"],
        0,
    );
    let d = Dataset::open(&out).unwrap();
    assert_eq!(d.manifest.fields.0[0].dtype, Dtype::U16);
    assert_eq!(d.manifest.fields.0[0].names.len(), 300);
    let all = samples(&out);
    for (k, (_, _, mask)) in all.iter().enumerate() {
        let (i, z) = (k / Z, k % Z);
        let src = if i == 2 {
            l.clone()
        } else {
            label(i).iter().map(|&v| v as u16).collect()
        };
        let want: Vec<u8> = slice(&src, z)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(mask, &want, "case {i} slice {z}");
    }
}

/// `--meta`: each slice carries its case id and slice number (the ones its pixels come from,
/// skipped slices skipped), the case's first image file and the label volume's voxel size; no
/// case id appears in two splits.
#[test]
fn meta_names_each_slices_case_and_slice() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("Task04");
    msd(&input);
    let out = t.path().join("out");
    convert(
        &input,
        &out,
        &["--meta", "--skip-empty-masks", "--dtype", "f32"],
        0,
    );
    let d = Dataset::open(&out).unwrap();
    let f = &d.manifest.fields.0[1];
    assert_eq!(f.name, "meta");
    let mut splits_of: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut n = 0;
    for (split, sh) in d.shards() {
        let r = d.open_shard(sh).unwrap();
        for b in 0..r.num_blocks() {
            let blk = r.read_block(b).unwrap();
            for i in 0..blk.len() {
                let m = f.decode_meta(blk.field(&d.manifest.fields, 1, i)).unwrap();
                let (case, z) = origin(f32s(blk.sample(i))[0]);
                assert_eq!(m["case"], id(case), "{m:?}");
                assert_eq!(m["slice"], z, "{m:?}");
                assert_eq!(m["spacing_z"], 1.0, "{m:?}");
                assert!(
                    m["source"].as_str().unwrap().starts_with("imagesTr/"),
                    "{m:?}"
                );
                splits_of
                    .entry(id(case))
                    .or_default()
                    .insert(split.to_string());
                n += 1;
            }
        }
    }
    assert!(n > 0 && splits_of.len() > 1);
    assert!(splits_of.values().all(|s| s.len() == 1), "{splits_of:?}");
}
