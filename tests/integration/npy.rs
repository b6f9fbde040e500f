//! `.npy` arrays as numpy users save them: C or Fortran order, little- or big-endian, every image
//! dtype and shape prep reads, labels of every integer type. Each variant is converted next to its
//! C-order little-endian twin and must give the same shards, byte for byte.

use crate::util::*;
use std::path::Path;

/// Write a .npy file: `c_values` are the array's values in C order, each `size` bytes
/// little-endian; they are stored in `order` ('C' or 'F') with the byte order of `descr`.
fn write_npy_as(path: &Path, descr: &str, shape: &[usize], c_values: &[u8], order: char) {
    let size: usize = descr[2..].parse().unwrap();
    assert_eq!(c_values.len(), shape.iter().product::<usize>() * size);
    let mut bytes = npy_header(descr, order == 'F', shape);
    let values: Vec<&[u8]> = c_values.chunks_exact(size).collect();
    let stored: Vec<&[u8]> = if order == 'F' {
        fortran_order(&values, shape)
    } else {
        values
    };
    for v in stored {
        if descr.starts_with('>') {
            bytes.extend(v.iter().rev());
        } else {
            bytes.extend_from_slice(v);
        }
    }
    std::fs::write(path, bytes).unwrap();
}

/// The values of a C-order array in Fortran order: the first axis fastest.
fn fortran_order<'a>(c: &[&'a [u8]], shape: &[usize]) -> Vec<&'a [u8]> {
    let mut c_stride = vec![1usize; shape.len()];
    for a in (0..shape.len() - 1).rev() {
        c_stride[a] = c_stride[a + 1] * shape[a + 1];
    }
    let mut idx = vec![0usize; shape.len()];
    let mut out = Vec::with_capacity(c.len());
    for _ in 0..c.len() {
        out.push(c[idx.iter().zip(&c_stride).map(|(i, s)| i * s).sum::<usize>()]);
        for (a, i) in idx.iter_mut().enumerate() {
            *i += 1;
            if *i < shape[a] {
                break;
            }
            *i = 0;
        }
    }
    out
}

/// Values of `kind` ('u', 'f') and `size` bytes, little-endian, that exercise every byte: floats
/// in [0, 1] so that a u8 target keeps information.
fn values(kind: char, size: usize, n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut out = Vec::with_capacity(n * size);
    for _ in 0..n {
        let r = next();
        let unit = (r >> 11) as f64 / (1u64 << 53) as f64;
        match (kind, size) {
            ('u', _) => out.extend_from_slice(&r.to_le_bytes()[..size]),
            ('f', 2) => out.extend_from_slice(&half::f16::from_f64(unit).to_le_bytes()),
            ('f', 4) => out.extend_from_slice(&(unit as f32).to_le_bytes()),
            ('f', 8) => out.extend_from_slice(&unit.to_le_bytes()),
            _ => unreachable!(),
        }
    }
    out
}

fn labels_le(kind: char, size: usize, n: usize, classes: u64) -> Vec<u8> {
    let _ = kind;
    (0..n as u64)
        .flat_map(|i| (i * 7 % classes).to_le_bytes()[..size].to_vec())
        .collect()
}

fn convert(src: &Path, out: &Path, extra: &[&str]) {
    let mut args = vec![
        "convert",
        src.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ];
    args.extend_from_slice(extra);
    run(&args, 0);
}

/// Every image dtype x byte order x order x shape layout, with sample counts on both sides of
/// the converter's block of 2048 samples: the same shards as the C-order little-endian twin.
#[test]
fn fortran_order_and_big_endian_give_the_c_order_twins_shards() {
    let t = tempfile::tempdir().unwrap();
    let mut cases = 0;
    for (kind, size) in [('u', 1), ('u', 2), ('f', 2), ('f', 4), ('f', 8)] {
        for shape_kind in ["NHW", "NHWC", "NCHW", "NHW1"] {
            for &n in &[5usize, 2050] {
                // Small images keep the 2050-sample cases quick; odd sizes catch a swapped H and W.
                let (h, w) = (3, 5);
                let shape: Vec<usize> = match shape_kind {
                    "NHW" => vec![n, h, w],
                    "NHWC" => vec![n, h, w, 3],
                    "NCHW" => vec![n, 3, h, w],
                    _ => vec![n, h, w, 1],
                };
                let count: usize = shape.iter().product();
                let vals = values(kind, size, count, (n * size) as u64);
                let labels = labels_le('i', 8, n, 10);
                let le = if size == 1 {
                    format!("|{kind}{size}")
                } else {
                    format!("<{kind}{size}")
                };
                let be = if size == 1 {
                    le.clone()
                } else {
                    format!(">{kind}{size}")
                };
                let targets: &[&[&str]] = if kind == 'f' {
                    &[&[], &["--dtype", "f32"]]
                } else {
                    &[&[]]
                };
                for target in targets {
                    let case = format!("{kind}{size}-{shape_kind}-{n}-{}", target.len());
                    let twin = t.path().join(format!("{case}-twin"));
                    std::fs::create_dir_all(&twin).unwrap();
                    write_npy_as(&twin.join("x_train.npy"), &le, &shape, &vals, 'C');
                    write_npy_as(&twin.join("y_train.npy"), "<i8", &[n], &labels, 'C');
                    let twin_out = t.path().join(format!("{case}-twin-out"));
                    convert(&twin, &twin_out, target);
                    let want = shard_files(&twin_out);
                    assert!(!want.is_empty());
                    for (v, (descr, order)) in
                        [(&le, 'F'), (&be, 'C'), (&be, 'F')].into_iter().enumerate()
                    {
                        let src = t.path().join(format!("{case}-{v}"));
                        std::fs::create_dir_all(&src).unwrap();
                        write_npy_as(&src.join("x_train.npy"), descr, &shape, &vals, order);
                        // Labels in the same byte order, as numpy would save them.
                        let ldescr = if descr.starts_with('>') { ">i8" } else { "<i8" };
                        write_npy_as(&src.join("y_train.npy"), ldescr, &[n], &labels, order);
                        let out = t.path().join(format!("{case}-{v}-out"));
                        convert(&src, &out, target);
                        assert!(
                            shard_files(&out) == want,
                            "{case}: {descr} order {order} differs from the C-order twin"
                        );
                        cases += 1;
                    }
                }
            }
        }
    }
    assert_eq!(cases, (2 + 3 * 2) * 4 * 2 * 3);
}

/// Labels of every integer type, either byte order, shape (N,) or Keras's (N, 1), and
/// scikit-learn's `X_train` name: the same labels.
#[test]
fn labels_of_every_integer_type_and_byte_order() {
    let t = tempfile::tempdir().unwrap();
    let n = 40;
    let px = values('u', 1, n * 4 * 4, 1);
    let twin = t.path().join("twin");
    std::fs::create_dir_all(&twin).unwrap();
    write_npy_as(&twin.join("x_train.npy"), "|u1", &[n, 4, 4], &px, 'C');
    write_npy_as(
        &twin.join("y_train.npy"),
        "<i8",
        &[n],
        &labels_le('i', 8, n, 10),
        'C',
    );
    let twin_out = t.path().join("twin-out");
    convert(&twin, &twin_out, &[]);
    let want = shard_files(&twin_out);
    for kind in ['u', 'i'] {
        for size in [1, 2, 4, 8] {
            for endian in ['<', '>'] {
                for shape in [vec![n], vec![n, 1]] {
                    let descr = if size == 1 {
                        format!("|{kind}{size}")
                    } else {
                        format!("{endian}{kind}{size}")
                    };
                    let case = format!("{kind}{size}{endian}{}", shape.len());
                    let src = t.path().join(&case);
                    std::fs::create_dir_all(&src).unwrap();
                    write_npy_as(&src.join("X_train.npy"), "|u1", &[n, 4, 4], &px, 'C');
                    let l = labels_le(kind, size, n, 10);
                    write_npy_as(&src.join("y_train.npy"), &descr, &shape, &l, 'C');
                    let out = t.path().join(format!("{case}-out"));
                    convert(&src, &out, &[]);
                    assert!(shard_files(&out) == want, "labels {descr} {shape:?}");
                }
            }
        }
    }
    // A negative label is refused by sample, whatever the byte order.
    let src = t.path().join("negative");
    std::fs::create_dir_all(&src).unwrap();
    write_npy_as(&src.join("x_train.npy"), "|u1", &[n, 4, 4], &px, 'C');
    let mut l = labels_le('i', 2, n, 10);
    l[6..8].copy_from_slice(&(-3i16).to_le_bytes());
    write_npy_as(&src.join("y_train.npy"), ">i2", &[n], &l, 'C');
    let o = run(
        &[
            "convert",
            src.to_str().unwrap(),
            "--out",
            t.path().join("neg-out").to_str().unwrap(),
        ],
        1,
    );
    assert!(
        stderr(&o).contains("label -3 of sample 3"),
        "{}",
        stderr(&o)
    );
}

/// A Fortran-order file cut short, or whose header claims more samples than it holds, is refused
/// before any sample is written, naming the file.
#[test]
fn short_fortran_arrays_are_refused_by_name() {
    let t = tempfile::tempdir().unwrap();
    let n = 30;
    let src = t.path().join("short");
    std::fs::create_dir_all(&src).unwrap();
    let px = values('f', 4, n * 6 * 6, 2);
    write_npy_as(&src.join("x_train.npy"), ">f4", &[n, 6, 6], &px, 'F');
    write_npy_as(
        &src.join("y_train.npy"),
        "<i8",
        &[n],
        &labels_le('i', 8, n, 3),
        'C',
    );
    let p = src.join("x_train.npy");
    let len = std::fs::metadata(&p).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len - 5)
        .unwrap();
    let out = t.path().join("out");
    let o = run(
        &[
            "convert",
            src.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
        1,
    );
    let e = stderr(&o);
    assert!(e.contains("x_train.npy") && e.contains("truncated"), "{e}");
    assert!(!out.join("manifest.json").exists());
}

/// Split names beyond train/test: a validation pair is the test split when there is no test
/// pair, and `val` beside one; unknown names get the list of names prep looks for.
#[test]
fn npy_split_names_and_unknown_names() {
    let t = tempfile::tempdir().unwrap();
    let n = 12;
    let px = values('u', 1, n * 4 * 4, 3);
    let l = labels_le('i', 8, n, 4);
    let split_of = |files: &[(&str, &str)]| {
        let src = t.path().join(files[0].0.replace('.', "-"));
        std::fs::create_dir_all(&src).unwrap();
        for (x, y) in files {
            write_npy_as(&src.join(x), "|u1", &[n, 4, 4], &px, 'C');
            write_npy_as(&src.join(y), "<i8", &[n], &l, 'C');
        }
        let out = src.with_extension("out");
        convert(&src, &out, &[]);
        let m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
        let mut s: Vec<String> = m["splits"].as_object().unwrap().keys().cloned().collect();
        s.sort();
        s
    };
    assert_eq!(
        split_of(&[("X_train.npy", "y_train.npy"), ("X_val.npy", "y_val.npy")]),
        ["test", "train"]
    );
    assert_eq!(
        split_of(&[
            ("train_images.npy", "train_labels.npy"),
            ("valid_images.npy", "valid_labels.npy"),
            ("test_images.npy", "test_labels.npy")
        ]),
        ["test", "train", "val"]
    );
    let src = t.path().join("odd");
    std::fs::create_dir_all(&src).unwrap();
    write_npy_as(&src.join("features.npy"), "|u1", &[n, 4, 4], &px, 'C');
    write_npy_as(&src.join("targets.npy"), "<i8", &[n], &l, 'C');
    let o = run(
        &[
            "convert",
            src.to_str().unwrap(),
            "--out",
            t.path().join("odd-out").to_str().unwrap(),
        ],
        2,
    );
    let e = stderr(&o);
    assert!(
        e.contains("x_train.npy + y_train.npy") && e.contains("images.npy + labels.npy"),
        "{e}"
    );
}
