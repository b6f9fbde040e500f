//! `.npy` targets as fields: `y` of shape (N, H, W) is a mask, (N, K) of 0/1 labels, (N, K)
//! floats values. Converted fields equal the source: masks pixel-exact, values bit-exact in f32.

use crate::util::{npy_header, run, stderr, write_npy};
use prep::format::fields::FieldKind;
use prep::format::shard::Dataset;
use std::path::Path;

const N: usize = 70;
const H: usize = 6;
const W: usize = 5;

fn images(dir: &Path) {
    let px: Vec<u8> = (0..N * H * W).map(|i| (i * 7 % 251) as u8).collect();
    write_npy(&dir.join("x_train.npy"), "|u1", &[N, H, W], &px);
}

/// Every sample's field bytes, in file order, from prep's reader.
fn read_fields(ds: &Path) -> (Vec<Vec<u8>>, Dataset) {
    let d = Dataset::open(ds).unwrap();
    let mut out = Vec::new();
    for (_, sh) in d.shards() {
        let r = d.open_shard(sh).unwrap();
        for b in 0..r.num_blocks() {
            let blk = r.read_block(b).unwrap();
            for i in 0..blk.len() {
                out.push(blk.field(&d.manifest.fields, 0, i).to_vec());
            }
        }
    }
    (out, d)
}

fn convert(dir: &Path, extra: &[&str]) -> std::path::PathBuf {
    let out = dir.join("out");
    let mut args = vec![
        "convert",
        dir.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(&["--quiet"]);
    args.extend_from_slice(extra);
    run(&args, 0);
    out
}

#[test]
fn a_mask_array_becomes_a_mask_field_pixel_exact_in_any_integer_type_and_order() {
    for (descr, size, values, fortran) in [
        ("|u1", 1, 3u64, false),
        ("<i8", 8, 3, false),
        (">u2", 2, 3, false),
        ("<i4", 4, 300, false),
        ("|u1", 1, 3, true),
    ] {
        let d = tempfile::tempdir().unwrap();
        images(d.path());
        let mask: Vec<u64> = (0..N * H * W)
            .map(|i| (i as u64 * 13 + i as u64 / 7) % values)
            .collect();
        // Stored as the header says: C order unless `fortran` (then the sample axis fastest).
        let mut bytes = npy_header(descr, fortran, &[N, H, W]);
        for j in 0..N * H * W {
            let i = if fortran {
                let (n, p) = (j % N, j / N);
                let (y, x) = (p % H, p / H);
                n * H * W + y * W + x
            } else {
                j
            };
            let v = mask[i].to_le_bytes();
            let mut b = v[..size].to_vec();
            if descr.starts_with('>') {
                b.reverse();
            }
            bytes.extend_from_slice(&b);
        }
        std::fs::write(d.path().join("y_train.npy"), bytes).unwrap();
        let out = convert(d.path(), &[]);
        let (got, ds) = read_fields(&out);
        let f = &ds.manifest.fields.0[0];
        assert_eq!(
            (f.kind, f.name.as_str()),
            (FieldKind::Mask, "mask"),
            "{descr}"
        );
        assert_eq!(f.names.len() as u64, values, "{descr}");
        assert_eq!(f.shape, vec![H as u32, W as u32]);
        assert_eq!(ds.manifest.classes, vec!["all"]);
        assert_eq!(got.len(), N);
        for (i, g) in got.iter().enumerate() {
            let want: Vec<u8> = mask[i * H * W..(i + 1) * H * W]
                .iter()
                .flat_map(|&v| {
                    if values > 256 {
                        (v as u16).to_le_bytes().to_vec()
                    } else {
                        vec![v as u8]
                    }
                })
                .collect();
            assert_eq!(g, &want, "{descr} fortran {fortran}: sample {i}");
        }
    }
}

#[test]
fn labels_and_values_arrays_become_fields_values_bit_exact() {
    let d = tempfile::tempdir().unwrap();
    images(d.path());
    let k = 4;
    let labels: Vec<u8> = (0..N * k).map(|i| ((i * 5) % 3 == 0) as u8).collect();
    write_npy(&d.path().join("y_train.npy"), "|b1", &[N, k], &labels);
    let (got, ds) = read_fields(&convert(d.path(), &[]));
    assert_eq!(ds.manifest.fields.0[0].kind, FieldKind::Labels);
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g, &labels[i * k..(i + 1) * k]);
    }
    // Values: float64 rounded to float32 as prep documents; float32 kept bit for bit.
    let d = tempfile::tempdir().unwrap();
    images(d.path());
    let v: Vec<f32> = (0..N * 2)
        .map(|i| (i as f32 * 0.37 - 11.0) * 1.0e-3)
        .collect();
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    write_npy(&d.path().join("y_train.npy"), "<f4", &[N, 2], &bytes);
    let (got, ds) = read_fields(&convert(d.path(), &[]));
    assert_eq!(ds.manifest.fields.0[0].kind, FieldKind::Values);
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g, &bytes[i * 8..(i + 1) * 8], "sample {i}");
    }
}

#[test]
fn bad_targets_are_refused_or_left_out_naming_the_file_and_sample() {
    // A value that is not finite: the sample is left out (listed in rejects), or stops the run.
    let d = tempfile::tempdir().unwrap();
    images(d.path());
    let mut v: Vec<f32> = (0..N).map(|i| i as f32).collect();
    v[9] = f32::NAN;
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    write_npy(&d.path().join("y_train.npy"), "<f4", &[N, 1], &bytes);
    // (N, 1) floats: one value per sample, not classes.
    let out = convert(d.path(), &[]);
    let (got, _) = read_fields(&out);
    assert_eq!(got.len(), N - 1);
    let rejects = std::fs::read_to_string(out.join("rejects.jsonl")).unwrap();
    assert!(
        rejects.contains("x_train.npy[9]") && rejects.contains("values must be finite"),
        "{rejects}"
    );
    let o = crate::util::prep()
        .args(["convert", d.path().to_str().unwrap(), "--out"])
        .arg(d.path().join("fail"))
        .args(["--on-error", "fail"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("values must be finite"),
        "{}",
        stderr(&o)
    );
    assert!(!d.path().join("fail/manifest.json").exists());

    let cases: Vec<(&str, Box<dyn Fn(&Path)>, &[&str], &str)> = vec![
        (
            "mask of another size",
            Box::new(|p| {
                write_npy(
                    &p.join("y_train.npy"),
                    "|u1",
                    &[N, H, W + 1],
                    &vec![0; N * H * (W + 1)],
                )
            }),
            &[],
            "expected (70,) classes, (70, 6, 5) a mask",
        ),
        (
            "negative mask value",
            Box::new(|p| {
                let mut m = vec![0i16; N * H * W];
                m[H * W * 3 + 7] = -2;
                let b: Vec<u8> = m.iter().flat_map(|x| x.to_le_bytes()).collect();
                write_npy(&p.join("y_train.npy"), "<i2", &[N, H, W], &b)
            }),
            &[],
            "mask value -2 of sample 3 at row 1, column 2 is not 0..65535",
        ),
        (
            "integer (N, K) not 0/1",
            Box::new(|p| write_npy(&p.join("y_train.npy"), "|u1", &[N, 2], &vec![2; N * 2])),
            &[],
            "label 2 of sample 0 column 0 is not 0 or 1",
        ),
        (
            "mask into column-major files",
            Box::new(|p| {
                write_npy(
                    &p.join("y_train.npy"),
                    "|u1",
                    &[N, H, W],
                    &vec![1; N * H * W],
                )
            }),
            &["--format", "colmajor"],
            "the column-major layout has images and class labels only",
        ),
    ];
    for (what, make, extra, want) in cases {
        let d = tempfile::tempdir().unwrap();
        images(d.path());
        make(d.path());
        let out = d.path().join("out");
        let o = crate::util::prep()
            .args([
                "convert",
                d.path().to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ])
            .args(extra)
            .output()
            .unwrap();
        let e = stderr(&o);
        assert_ne!(o.status.code(), Some(0), "{what}");
        assert!(e.contains(want), "{what}: {e}");
        assert!(!out.join("manifest.json").exists(), "{what}");
    }
}

#[test]
fn training_on_a_dataset_whose_only_target_is_a_field_is_refused_not_faked() {
    let d = tempfile::tempdir().unwrap();
    images(d.path());
    write_npy(
        &d.path().join("y_train.npy"),
        "|u1",
        &[N, H, W],
        &vec![1; N * H * W],
    );
    let ds = convert(d.path(), &[]);
    let run_dir = d.path().join("run");
    let o = crate::util::prep()
        .args([
            "train",
            ds.to_str().unwrap(),
            "--device",
            "cpu",
            "--epochs",
            "1",
            "--task",
            "class",
            "--out",
        ])
        .arg(&run_dir)
        .output()
        .unwrap();
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains("has one class, so there is nothing to learn")
            && e.contains("train on a field instead: class, mask (mask)"),
        "{e}"
    );
    assert!(!run_dir.join("summary.json").exists());
}

/// `meta_train.jsonl` beside the arrays: a `meta` field with every key of the file, each
/// sample's object read back equal (file order; a sample left out takes its line with it), the
/// summary counting samples per key; a bad line or a count that differs names the file.
#[test]
fn a_metadata_file_beside_the_arrays_becomes_a_meta_field() {
    let d = tempfile::tempdir().unwrap();
    images(d.path());
    let labels: Vec<u8> = (0..N).map(|i| (i % 3) as u8).collect();
    write_npy(&d.path().join("y_train.npy"), "|u1", &[N], &labels);
    let lines: Vec<serde_json::Value> = (0..N)
        .map(|i| {
            if i % 4 == 0 {
                serde_json::json!({"patient": format!("p{}", i / 10), "slice": i, "t": i as f64 * 0.25})
            } else {
                serde_json::json!({"patient": format!("p{}", i / 10), "slice": i, "ok": i % 2 == 0})
            }
        })
        .collect();
    let text: String = lines.iter().map(|v| format!("{v}\n")).collect();
    std::fs::write(d.path().join("meta_train.jsonl"), &text).unwrap();
    let out = convert(d.path(), &["--test-fraction", "0"]);
    let (got, ds) = read_fields(&out);
    let f = &ds.manifest.fields.0[0];
    assert_eq!(f.kind, FieldKind::Meta);
    assert_eq!(f.names, ["patient", "slice", "t", "ok"]);
    // Classes stay the classes: metadata is no target.
    assert_eq!(ds.manifest.classes.len(), 3);
    assert_eq!(got.len(), N);
    for (i, v) in got.iter().enumerate() {
        let obj = f.decode_meta(v).unwrap();
        assert_eq!(serde_json::Value::Object(obj), lines[i], "sample {i}");
    }
    let o = run(&["inspect", out.to_str().unwrap(), "--json"], 0);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let train = v["splits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "train")
        .unwrap();
    assert_eq!(
        train["fields"][0]["counts"],
        serde_json::json!([N, N, N / 4 + 1, N - N / 4 - 1])
    );
    run(&["verify", out.to_str().unwrap()], 0);

    // Bad files: a line that is no object, a nested value, a line too few; a split without.
    for (text, want) in [
        (
            text.replacen("{", "[", 1),
            "meta_train.jsonl: line 1: not a JSON object",
        ),
        (
            text.replacen("\"ok\":false", "\"ok\":[1]", 1),
            "holds a list or an object",
        ),
        (
            text.lines().skip(1).map(|l| format!("{l}\n")).collect(),
            "69 lines of metadata for the 70 samples",
        ),
    ] {
        std::fs::write(d.path().join("meta_train.jsonl"), &text).unwrap();
        let bad = d.path().join("bad");
        let o = run(
            &[
                "convert",
                d.path().to_str().unwrap(),
                "--out",
                bad.to_str().unwrap(),
                "--quiet",
            ],
            1,
        );
        let e = stderr(&o);
        assert!(e.contains(want), "{want}: {e}");
        assert!(!bad.exists(), "nothing written");
    }
    std::fs::write(d.path().join("meta_train.jsonl"), &text).unwrap();
    write_npy(
        &d.path().join("x_test.npy"),
        "|u1",
        &[2, H, W],
        &[0; 2 * H * W],
    );
    write_npy(&d.path().join("y_test.npy"), "|u1", &[2], &[0, 1]);
    let bad = d.path().join("bad2");
    let o = run(
        &[
            "convert",
            d.path().to_str().unwrap(),
            "--out",
            bad.to_str().unwrap(),
        ],
        2,
    );
    assert!(
        stderr(&o).contains("there is no meta_test.jsonl"),
        "{}",
        stderr(&o)
    );
}

/// With `--size` and each `--fit`, a mask array is brought to the target with its image's
/// placement by nearest-neighbour sampling: equal to `fit_mask` of the source, values never
/// blended; u16 masks too.
#[test]
fn mask_arrays_follow_their_images_through_every_fit() {
    use prep::source::transform::{fit_mask, Fit, Target};
    for (descr, values) in [("|u1", 3u64), ("<u2", 300)] {
        let d = tempfile::tempdir().unwrap();
        images(d.path());
        let mask: Vec<u64> = (0..N * H * W)
            .map(|i| (i as u64 * 7 + i as u64 / 5) % values)
            .collect();
        let size = if descr == "|u1" { 1 } else { 2 };
        let bytes: Vec<u8> = mask
            .iter()
            .flat_map(|v| v.to_le_bytes()[..size].to_vec())
            .collect();
        write_npy(&d.path().join("y_train.npy"), descr, &[N, H, W], &bytes);
        for (fit, name) in [
            (Fit::Crop, "crop"),
            (Fit::Stretch, "stretch"),
            (Fit::Pad, "pad"),
        ] {
            let out = d.path().join(format!("out-{name}"));
            run(
                &[
                    "convert",
                    d.path().to_str().unwrap(),
                    "--out",
                    out.to_str().unwrap(),
                    "--size",
                    "4x9",
                    "--fit",
                    name,
                    "--test-fraction",
                    "0",
                    "--quiet",
                ],
                0,
            );
            let (got, ds) = read_fields(&out);
            assert_eq!(ds.manifest.fields.0[0].shape, [4, 9], "{name}");
            let t = Target {
                channels: 1,
                height: 4,
                width: 9,
                dtype: prep::format::shard::Dtype::U8,
                fit,
            };
            for (i, g) in got.iter().enumerate() {
                let src: Vec<u16> = mask[i * H * W..(i + 1) * H * W]
                    .iter()
                    .map(|&v| v as u16)
                    .collect();
                let want: Vec<u8> = fit_mask(&src, W as u32, H as u32, &t)
                    .iter()
                    .flat_map(|v| v.to_le_bytes()[..size].to_vec())
                    .collect();
                assert_eq!(g, &want, "{descr} {name} sample {i}");
            }
        }
    }
}
