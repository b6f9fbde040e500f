//! Inputs kept from fuzzing the convert decoders: each once made a decoder panic, hang or over-allocate.
//!
//! Each input is in `fuzz/regressions/` (see its README for how it was found); here `prep convert`
//! runs on a folder holding it and must stop or reject it cleanly, naming the file and what is
//! wrong with it.

use crate::util::{prep, stderr, stdout};
use std::path::Path;

fn regression(name: &str) -> Vec<u8> {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/regressions"));
    std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// `prep convert` of a folder holding `files` (name, bytes): exits 1 with an error (stderr) that
/// names `file` and says each of `why`.
fn convert_fails(files: &[(&str, &[u8])], file: &str, why: &[&str]) {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    std::fs::create_dir(&input).unwrap();
    for (name, bytes) in files {
        std::fs::write(input.join(name), bytes).unwrap();
    }
    let out = t.path().join("out");
    let o = prep()
        .args(["convert", input.to_str().unwrap(), "--out"])
        .arg(&out)
        .arg("--quiet")
        .output()
        .unwrap();
    let e = stderr(&o);
    assert_eq!(
        o.status.code(),
        Some(1),
        "stdout:\n{}\nstderr:\n{e}",
        stdout(&o)
    );
    assert!(e.contains(file), "{file} not named in: {e}");
    for w in why {
        assert!(e.contains(w), "no {w:?} in: {e}");
    }
    assert!(!out.exists(), "a failed convert left {}", out.display());
}

/// A well-formed labels array of `n` uint8 labels, as numpy writes it.
fn npy_labels(n: usize) -> Vec<u8> {
    let mut h = format!("{{'descr': '|u1', 'fortran_order': False, 'shape': ({n},), }}");
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend_from_slice(&(h.len() as u16).to_le_bytes());
    b.extend_from_slice(h.as_bytes());
    b.extend(std::iter::repeat_n(0u8, n));
    b
}

/// A 12-byte .npy (format 2.0) whose header claims 4 GiB: npyz allocated all of it before reading.
#[test]
fn npy_header_longer_than_the_file() {
    convert_fails(
        &[
            (
                "train_images.npy",
                &regression("npy-oom-header-len-4gib.npy"),
            ),
            ("train_labels.npy", &npy_labels(4)),
        ],
        "train_images.npy",
        &["header declares 4294967280 bytes"],
    );
}

/// Shape (2^32, 2^32, 2): npyz multiplied the dimensions unchecked (a panic with overflow checks
/// on, as in this debug build; a wrapped element count in release).
#[test]
fn npy_shape_whose_product_overflows() {
    convert_fails(
        &[
            (
                "train_images.npy",
                &regression("npy-panic-shape-overflow.npy"),
            ),
            ("train_labels.npy", &npy_labels(4)),
        ],
        "train_images.npy",
        &["absurd array shape", "overflow 64 bits"],
    );
}

/// A grey (1 sample per pixel) 8x8 DICOM whose JPEG Baseline pixel data has 3 components: dicom-rs
/// copied the 192 decoded bytes into its 64-byte buffer and panicked (caught, the file was rejected
/// as "the decoder failed"). Now the JPEG frame header is checked against the attributes first.
#[test]
fn dicom_jpeg_larger_than_its_attributes() {
    convert_fails(
        &[(
            "a.dcm",
            &regression("dicom-panic-jpeg-colour-in-grey-file.dcm"),
        )],
        "a.dcm",
        &[
            "JPEG frame 0 is 8x8 with 3 component(s)",
            "8x8 with 1 sample(s) per pixel",
        ],
    );
}

/// A 530-byte deflated DICOM (a mutated seed) whose inflated data set has an element declaring
/// 1 546 661 408 bytes: dicom-rs zero-filled that much before reading (1.5 GB of RSS, three times:
/// header, probe, decode). The inflated data set is now walked like any other before dicom-rs
/// reads it.
#[test]
fn dicom_deflated_element_longer_than_the_data_set() {
    convert_fails(
        &[(
            "a.dcm",
            &regression("dicom-alloc-1500mb-deflated-element-length.dcm"),
        )],
        "a.dcm",
        &["declares 1546661408 bytes", "in the inflated data set"],
    );
}

/// A 159-byte .npy whose header opens 27 braces: npyz's backtracking header grammar ran for
/// minutes (the npy fuzz target's timeout). Headers nesting brackets more than 4 deep are refused
/// before npyz parses them.
#[test]
fn npy_header_nested_too_deep() {
    convert_fails(
        &[
            (
                "train_images.npy",
                &regression("npy-timeout-header-nested-braces.npy"),
            ),
            ("train_labels.npy", &npy_labels(4)),
        ],
        "train_images.npy",
        &["nests brackets more than 4 deep"],
    );
}

/// The same deflated file with one tag in its file meta group mutated ((0002,0013) to (3002,0013)):
/// prep's walk ended the meta group there while dicom-rs, following the group length, read on, so
/// the two started the data set at different bytes and dicom-rs again zero-filled 1.5 GB. The walk
/// now follows the group length as dicom-rs does.
#[test]
fn dicom_meta_group_read_as_its_group_length_says() {
    convert_fails(
        &[(
            "a.dcm",
            &regression("dicom-alloc-1500mb-meta-group-tag-mutated.dcm"),
        )],
        "a.dcm",
        &["declares 1546661425 bytes", "in the inflated data set"],
    );
}

/// The RLE seed with its data mutated so that a segment decodes to fewer bytes than Rows x
/// Columns: dicom-rs indexed past the decoded segment and panicked (caught, the file was rejected
/// as "the decoder failed"). The segments' decoded lengths are now counted first.
#[test]
fn dicom_rle_segment_shorter_than_the_frame() {
    convert_fails(
        &[(
            "a.dcm",
            &regression("dicom-panic-rle-segment-shorter-than-frame.dcm"),
        )],
        "a.dcm",
        &["RLE frame 0: segment"],
    );
}

/// A 602-byte DICOM (from the dicom fuzz corpus) whose (0020,0013) has VR FD and length 2:
/// dicom-rs reads `2 / 8` = 0 values and consumes 0 bytes, while prep's walk stepped over 2, so
/// the two read different headers from there and dicom-rs zero-filled 775 MB for an element of
/// its own reading. The walk now consumes what dicom-rs consumes and finds that element too long.
#[test]
fn dicom_binary_value_length_not_a_multiple_of_its_size() {
    convert_fails(
        &[(
            "a.dcm",
            &regression("dicom-alloc-775mb-fd-length-not-multiple.dcm"),
        )],
        "a.dcm",
        &["declares 774897676 bytes"],
    );
}

/// A 722-byte JPEG DICOM (found by the dicom fuzz target with `-malloc_limit_mb=256`) whose data
/// set opens with an item header (FFFE,E000) of length 4 outside any sequence: dicom-rs reads it
/// as an element and consumes its 4 bytes, while prep's walk stepped into it as into an item, so
/// the two read different headers from there and dicom-rs allocated 3.77 GB for one of its own
/// reading. The walk now follows dicom-rs's reader state by state.
#[test]
fn dicom_item_header_outside_a_sequence() {
    convert_fails(
        &[(
            "a.dcm",
            &regression("dicom-alloc-3774mb-item-at-element-level.dcm"),
        )],
        "a.dcm",
        &["element (00E0,FE00)", "declares 3774863615 bytes"],
    );
}
