//! Labels CSVs with several columns: a class column, 0/1 columns (the `labels` field) and the
//! columns `--values` names (the `values` field, f32 bit for bit); a bad cell rejects its file,
//! a bad column refuses the CSV.

use crate::fields_tree::{convert, grey_png, image, mask_values, read_all, rejects};
use crate::util::{run, stderr, stdout};
use prep::format::fields::FieldKind;
use std::path::Path;

const W: u32 = 9;
const H: u32 = 5;

/// Four images 0.png..3.png in `dir`.
fn images(dir: &Path) {
    for i in 0..4 {
        image(&dir.join(format!("{i}.png")), W, H, i, i % 2 == 1);
    }
}

fn write(p: &Path, text: &str) -> String {
    std::fs::write(p, text).unwrap();
    p.to_str().unwrap().to_string()
}

#[test]
fn label_columns_and_values_come_back_bit_exact() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    images(&input);
    // Values that f32 holds exactly, that it rounds, and at its edges; quoted and spaced cells.
    let rows = [
        (
            "0.png",
            "x",
            [1u8, 0],
            ["0.1", "-3.5e-7"],
            [0.1f32, -3.5e-7],
        ),
        (
            "1.png",
            "y",
            [0, 0],
            ["1e30", "16777217"],
            [1e30, 16777216.0],
        ),
        (
            "2.png",
            "x",
            [1, 1],
            ["-0", "3.4028235e38"],
            [-0.0, f32::MAX],
        ),
        (
            "3.png",
            "y",
            [0, 1],
            ["1.17549435e-38", " 2.5 "],
            [f32::MIN_POSITIVE, 2.5],
        ),
    ];
    let mut csv = String::from("path,cat,age,Label,dog,score\n");
    for (p, class, l, v, _) in &rows {
        csv.push_str(&format!(
            "{p},{},{},{class},{},\"{}\"\n",
            l[0], v[0], l[1], v[1]
        ));
    }
    let labels = write(&t.path().join("l.csv"), &csv);
    let out = t.path().join("out");
    let args = [
        "--labels",
        &labels,
        "--values",
        "age,score",
        "--test-fraction",
        "0",
        "--quiet",
    ];
    convert(&input, &out, &args, 0);
    let (samples, ds) = read_all(&out);
    let f = &ds.manifest.fields.0;
    assert_eq!(
        (f[0].kind, f[0].names.clone()),
        (FieldKind::Labels, vec!["cat".to_string(), "dog".into()])
    );
    assert_eq!(
        (f[1].kind, f[1].names.clone()),
        (FieldKind::Values, vec!["age".to_string(), "score".into()])
    );
    assert_eq!(ds.manifest.classes, ["x", "y"]);
    assert_eq!(samples.len(), 4);
    for (s, (p, class, l, _, v)) in samples.iter().zip(&rows) {
        assert_eq!(s.class, u32::from(*class == "y"), "{p}");
        assert_eq!(s.fields[0], l.to_vec(), "{p}");
        let bits: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(s.fields[1], bits, "{p}");
    }
    let split = &ds.manifest.splits["train"];
    assert_eq!(split.fields[0].counts, vec![2, 2]);
    assert_eq!(split.fields[1].max, vec![1e30f32 as f64, f32::MAX as f64]);
    // inspect reports the fields.
    let o = run(&["inspect", out.to_str().unwrap(), "--json"], 0);
    assert!(stdout(&o).contains("\"score\""), "{}", stdout(&o));
}

#[test]
fn without_a_class_column_every_file_is_one_class_and_masks_come_first() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    let masks = t.path().join("m");
    images(&input);
    for i in 0..4 {
        grey_png(
            &masks.join(format!("{i}.png")),
            W,
            H,
            &mask_values(W, H, i, 2),
        );
    }
    let labels = write(
        &t.path().join("l.csv"),
        "file,sick\n0.png,1\n1.png,0\n2.png,1\n3.png,0\n",
    );
    let out = t.path().join("out");
    let m = masks.to_str().unwrap();
    let o = convert(
        &input,
        &out,
        &[
            "--labels",
            &labels,
            "--masks",
            m,
            "--test-fraction",
            "0",
            "--json",
        ],
        0,
    );
    assert!(
        stdout(&o).contains("has no label or class column"),
        "{}",
        stdout(&o)
    );
    let (samples, ds) = read_all(&out);
    assert_eq!(ds.manifest.classes, ["in"]);
    let kinds: Vec<FieldKind> = ds.manifest.fields.0.iter().map(|f| f.kind).collect();
    assert_eq!(kinds, [FieldKind::Mask, FieldKind::Labels]);
    for (i, s) in samples.iter().enumerate() {
        assert_eq!(s.fields[0], mask_values(W, H, i as u32, 2));
        assert_eq!(s.fields[1], vec![u8::from(i % 2 == 0)]);
    }
}

#[test]
fn bad_cells_reject_their_files_naming_the_csv_line_and_column() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    images(&input);
    let labels = write(
        &t.path().join("l.csv"),
        "path,label,age\n0.png,a,NaN\n1.png,a,inf\n2.png,a,\n3.png,a,40\n",
    );
    let out = t.path().join("skip");
    convert(
        &input,
        &out,
        &["--labels", &labels, "--values", "age", "--quiet"],
        0,
    );
    let r = rejects(&out);
    let want = [
        (
            "0.png",
            "l.csv line 2, column age: NaN is not a finite number",
        ),
        (
            "1.png",
            "l.csv line 3, column age: inf is not a finite number",
        ),
        ("2.png", "l.csv line 4, column age: an empty cell"),
    ];
    for (file, why) in want {
        assert!(
            r.iter().any(|(p, w)| p == file && w.contains(why)),
            "{file}: {r:?}"
        );
    }
    let (samples, _) = read_all(&out);
    assert_eq!(samples.len(), 1);
    let out = t.path().join("fail");
    let o = convert(
        &input,
        &out,
        &["--labels", &labels, "--values", "age", "--on-error", "fail"],
        1,
    );
    let e = stderr(&o);
    assert!(
        e.contains("0.png") && e.contains("line 2, column age: NaN"),
        "{e}"
    );
    assert!(!out.exists());
}

#[test]
fn bad_columns_refuse_the_csv() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    images(&input);
    let out = t.path().join("out");
    for (text, values, says) in [
        (
            "path,label,age\n0.png,a,31\n",
            "",
            "column age holds 31 on line 2, not 0 or 1",
        ),
        (
            "path,label,age\n0.png,a,31\n",
            "weight",
            "--values weight: ",
        ),
        (
            "path,label,age,cat\n0.png,a,1\n",
            "age",
            "line 2: 3 fields, but the header names 4",
        ),
        ("0.png,a\n", "age", "no header row"),
    ] {
        let labels = write(&t.path().join("l.csv"), text);
        let mut args = vec!["--labels", labels.as_str()];
        if !values.is_empty() {
            args.extend_from_slice(&["--values", values]);
        }
        let o = convert(&input, &out, &args, 2);
        let e = stderr(&o);
        assert!(e.contains("l.csv") && e.contains(says), "{text:?}: {e}");
        if values.is_empty() {
            assert!(e.contains("--values age"), "{e}");
        }
        assert!(!out.exists());
    }
    let o = convert(&input, &out, &["--values", "age"], 2);
    assert!(stderr(&o).contains("--labels"), "{}", stderr(&o));
}

#[test]
fn a_csv_beside_images_and_masks_names_files_from_either_folder() {
    let t = tempfile::tempdir().unwrap();
    let ds = t.path().join("DS");
    for i in 0..2 {
        image(&ds.join(format!("images/{i}.png")), W, H, i, false);
        grey_png(
            &ds.join(format!("masks/{i}.png")),
            W,
            H,
            &mask_values(W, H, i, 2),
        );
    }
    for (n, prefix) in [(0, ""), (1, "images/")] {
        let labels = write(
            &t.path().join(format!("l{n}.csv")),
            &format!("path,label,big\n{prefix}0.png,a,1\n{prefix}1.png,b,0\n"),
        );
        let out = t.path().join(format!("out{n}"));
        convert(
            &ds,
            &out,
            &["--labels", &labels, "--test-fraction", "0", "--quiet"],
            0,
        );
        let (samples, d) = read_all(&out);
        assert_eq!(d.manifest.classes, ["a", "b"], "{prefix}");
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[0].fields[1], [1]);
        assert!(rejects(&out).is_empty(), "{prefix}: {:?}", rejects(&out));
    }
}
