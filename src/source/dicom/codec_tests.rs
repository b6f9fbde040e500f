//! Compressed transfer syntaxes on real files: `fixtures/dicom/`, copied from pydicom's test data
//! (fixtures/README.md). The expected values were computed once with pydicom 3.0.2 and the
//! pylibjpeg 2.1 plugins (pylibjpeg-openjpeg 2.6, pylibjpeg-libjpeg 2.5) and numpy: xxh3-64 of
//! the modality values (stored x Rescale Slope + Intercept, as little-endian f32, row-major) or of
//! the RGB bytes, and a few values. The CI tier `python/tests/test_dicom_codecs.py` compares every
//! value of `prep convert`'s output against pydicom.
use super::tests::dicom_with;
use super::tests::Spec;
use super::*;
use dicom_core::value::{PixelFragmentSequence, Value};
use dicom_core::{DataElement, PrimitiveValue, VR};
use std::path::PathBuf;
use twox_hash::XxHash3_64;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/dicom")
        .join(name)
}

fn read(name: &str) -> Vec<u8> {
    std::fs::read(fixture(name)).unwrap()
}

/// A fixture with its data set edited, written back to bytes.
fn edited(name: &str, edit: impl FnOnce(&mut DefaultDicomObject)) -> Vec<u8> {
    let mut obj = OpenFileOptions::new().open_file(fixture(name)).unwrap();
    edit(&mut obj);
    let mut out = Vec::new();
    obj.write_all(&mut out).unwrap();
    out
}

fn set_us(obj: &mut DefaultDicomObject, tag: dicom_core::Tag, v: u16) {
    obj.put(DataElement::new(tag, VR::US, PrimitiveValue::from(v)));
}

/// The first fragment of a fixture's encapsulated pixel data.
fn first_fragment(name: &str) -> Vec<u8> {
    let obj = OpenFileOptions::new().open_file(fixture(name)).unwrap();
    let px = obj.get(tags::PIXEL_DATA).unwrap();
    px.value().fragments().unwrap()[0].clone()
}

/// Every frame as decoded for a float target: modality values of grey images, RGB images.
fn frames(bytes: &[u8]) -> Result<Vec<Frame>, Reject> {
    let mut out = Vec::new();
    let opts = DecodeOptions {
        float: true,
        ..DecodeOptions::default()
    };
    decode_bytes(bytes, &opts, &mut |f| {
        out.push(f);
        Ok(())
    })?;
    Ok(out)
}

fn grey(f: &Frame) -> &FloatFrame {
    match f {
        Frame::Float(f) if f.channels == 1 => f,
        _ => panic!("expected one grey plane of float values"),
    }
}

fn f32_hash(v: &[f32]) -> u64 {
    XxHash3_64::oneshot(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
}

/// (file, transfer syntax, rows, cols, xxh3 of pydicom's values, min, max, (row, col, value)...)
type Grey = (
    &'static str,
    &'static str,
    u32,
    u32,
    u64,
    f32,
    f32,
    [(usize, usize, f32); 4],
);

/// Lossless files, and JPEG 2000 lossy (openjp2 is OpenJPEG, as pylibjpeg-openjpeg): exactly
/// pydicom's values.
const EXACT_GREY: [Grey; 5] = [
    (
        "JPEG2000.dcm",
        "1.2.840.10008.1.2.4.91",
        1024,
        256,
        0x0eebc0f6b63f9e0b,
        -30.0,
        245.0,
        [
            (0, 0, 0.0),
            (512, 128, 7.0),
            (341, 170, 34.0),
            (1023, 255, 0.0),
        ],
    ),
    (
        "MR_small_jp2klossless.dcm",
        "1.2.840.10008.1.2.4.90",
        64,
        64,
        0x3c44e6e14722d72c,
        127.0,
        2145.0,
        [
            (0, 0, 905.0),
            (32, 32, 182.0),
            (21, 42, 375.0),
            (63, 63, 862.0),
        ],
    ),
    // The same image as MR_small_jp2klossless.dcm.
    (
        "MR_small_jpeg_ls_lossless.dcm",
        "1.2.840.10008.1.2.4.80",
        64,
        64,
        0x3c44e6e14722d72c,
        127.0,
        2145.0,
        [
            (0, 0, 905.0),
            (32, 32, 182.0),
            (21, 42, 375.0),
            (63, 63, 862.0),
        ],
    ),
    // Near-lossless: pydicom's values are the decoder's, whatever the encoder's error was.
    (
        "JPEGLSNearLossless_08.dcm",
        "1.2.840.10008.1.2.4.81",
        45,
        10,
        0xcf6022e6af92ddd4,
        0.0,
        255.0,
        [(0, 0, 255.0), (22, 5, 15.0), (15, 6, 30.0), (44, 9, 0.0)],
    ),
    (
        "JPEGLSNearLossless_16.dcm",
        "1.2.840.10008.1.2.4.81",
        50,
        10,
        0x254226122df26efe,
        0.0,
        65535.0,
        [
            (0, 0, 65535.0),
            (25, 5, 255.0),
            (16, 6, 4095.0),
            (49, 9, 0.0),
        ],
    ),
];

#[test]
fn compressed_fixtures_decode_to_pydicom_values() {
    for (name, ts, rows, cols, hash, min, max, points) in EXACT_GREY {
        let bytes = read(name);
        let obj = OpenFileOptions::new().open_file(fixture(name)).unwrap();
        assert_eq!(obj.meta().transfer_syntax(), ts, "{name}");
        let fr = frames(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(fr.len(), 1, "{name}");
        let f = grey(&fr[0]);
        assert_eq!((f.height, f.width), (rows, cols), "{name}");
        let (lo, hi) = f
            .data
            .iter()
            .fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        assert_eq!((lo, hi), (min, max), "{name}");
        for (r, c, v) in points {
            assert_eq!(f.data[r * cols as usize + c], v, "{name} at ({r}, {c})");
        }
        assert_eq!(
            f32_hash(&f.data),
            hash,
            "{name}: values differ from pydicom's"
        );
    }

    // JPEG 2000 lossless, YBR_RCT in a JP2 file (not a bare codestream): RGB as pydicom gives it.
    let fr = frames(&read("GDCMJ2K_TextGBR.dcm")).unwrap();
    let [Frame::Image(DynamicImage::ImageRgb8(img))] = &fr[..] else {
        panic!("GDCMJ2K_TextGBR.dcm: expected one RGB8 image");
    };
    assert_eq!(img.dimensions(), (400, 400));
    assert_eq!(img.get_pixel(0, 0).0, [128, 128, 128]);
    assert_eq!(img.get_pixel(133, 200).0, [0, 255, 0]);
    assert_eq!(img.get_pixel(399, 399).0, [128, 128, 128]);
    assert_eq!(XxHash3_64::oneshot(img.as_raw()), 0x98ea4c2cd70e63ca);
}

/// 12-bit lossy JPEG (JPEG Extended, Process 4). libjpeg-turbo-rs's integer IDCT (libjpeg's
/// "islow") and libjpeg's in pylibjpeg-libjpeg round differently: 3612 of the 262144 values
/// differ by exactly 1 (T.81 allows an IDCT this close). The output is pinned by its hash; the
/// values pydicom gives are checked within 1, at points where the two agree and where they differ.
#[test]
fn twelve_bit_jpeg_is_within_one_of_pydicom() {
    const OURS: u64 = 0x708bf1ffab0f59c4;
    let bytes = read("JPGExtended.dcm");
    let fr = frames(&bytes).unwrap();
    assert_eq!(fr.len(), 1);
    let f = grey(&fr[0]);
    assert_eq!((f.height, f.width), (1024, 256));
    let at = |r: usize, c: usize| f.data[r * 256 + c];
    // pydicom's values: (0, 0) .. (1023, 255) agree, the last three are where they differ.
    for (r, c, v) in [
        (0, 0, 1.0),
        (512, 128, 14.0),
        (341, 170, 31.0),
        (1023, 255, 1.0),
        (88, 131, 5.0),
        (408, 138, 81.0),
        (855, 155, 1.0),
    ] {
        assert!(
            (at(r, c) - v).abs() <= 1.0,
            "({r}, {c}): {} vs {v}",
            at(r, c)
        );
    }
    let (lo, hi) = f
        .data
        .iter()
        .fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    assert_eq!((lo, hi), (0.0, 264.0)); // as pydicom's
    let sum: f64 = f.data.iter().map(|&v| v as f64).sum();
    // pydicom's sum is 3770427; the 3612 differences of 1 bound the gap.
    assert!((sum - 3770427.0).abs() <= 3612.0, "sum {sum}");
    assert_eq!(f32_hash(&f.data), OURS);

    // JPEG-lossy.dcm in pydicom's data: the same file with the scan's spectral end (Se) 0, not
    // 63. libjpeg refuses it; a sequential scan ignores Se, and so does this decoder.
    let sos = bytes
        .windows(4)
        .position(|w| w == [0xFF, 0xDA, 0x00, 0x08])
        .expect("one SOS");
    let mut bad = bytes.clone();
    assert_eq!(bad[sos + 8], 63);
    bad[sos + 8] = 0;
    let fr = frames(&bad).unwrap();
    assert_eq!(f32_hash(&grey(&fr[0]).data), OURS);

    // And through the file's window onto 16-bit grey, as converted to integers.
    let mut n = 0;
    decode_bytes(&bytes, &DecodeOptions::default(), &mut |f| {
        assert!(matches!(f.expect_image(), DynamicImage::ImageLuma16(i) if i.dimensions() == (256, 1024)));
        n += 1;
        Ok(())
    })
    .unwrap();
    assert_eq!(n, 1);
}

#[test]
fn colour_jpeg_ls_and_colour_twelve_bit_jpeg_are_refused_by_name() {
    let e = frames(&read("SC_rgb_jls_lossy_line.dcm")).unwrap_err();
    assert_eq!(
        e.0,
        "unsupported transfer syntax 1.2.840.10008.1.2.4.81 (JPEG-LS Near-Lossless) with 3 samples per pixel: prep decodes JPEG-LS for grey images only"
    );

    // A 12-bit colour JPEG (YCbCr 4:2:0) made here.
    let px: Vec<i16> = (0..16 * 16 * 3).map(|i| (i * 13 % 4096) as i16).collect();
    let jpeg =
        libjpeg_turbo_rs::compress_12bit(&px, 16, 16, 3, 90, libjpeg_turbo_rs::Subsampling::S420)
            .unwrap();
    let spec = Spec {
        rows: 16,
        cols: 16,
        spp: 3,
        pi: "YBR_FULL_422",
        ts: "1.2.840.10008.1.2.4.51",
        ..Spec::default()
    };
    let seq = PixelFragmentSequence::new_fragments(vec![jpeg]);
    let bytes = dicom_with(
        &spec,
        DataElement::new(tags::PIXEL_DATA, VR::OB, Value::PixelSequence(seq)),
    );
    let e = frames(&bytes).unwrap_err();
    assert_eq!(
        e.0,
        "unsupported transfer syntax 1.2.840.10008.1.2.4.51 (JPEG Extended) with 3 samples per pixel: prep decodes 12-bit JPEG for grey images only"
    );
}

#[test]
fn j2k_codestreams_unlike_the_attributes_are_rejected() {
    // pydicom's JPEG2000-embedded-sequence-delimiter.dcm: four codestream bytes (Rsiz and the
    // top of Xsiz) replaced by a Sequence Delimitation Item tag.
    let mut bytes = read("JPEG2000.dcm");
    assert_eq!(bytes[3056..3062], [0, 0, 0, 0, 1, 0]);
    bytes[3056..3060].copy_from_slice(&[0xFE, 0xFF, 0xDD, 0xE0]);
    let e = frames(&bytes).unwrap_err();
    assert_eq!(
        e.0,
        "1.2.840.10008.1.2.4.91 (JPEG 2000) frame 0: the codestream is 3722445056x1024 with 1 component(s) of up to 16 bits, the DICOM attributes declare 256x1024 with 1 sample(s) per pixel of 16 bits allocated"
    );

    // Fewer rows declared than the codestream holds (dicom-rs would write past its buffer).
    let bytes = edited("JPEG2000.dcm", |o| set_us(o, tags::ROWS, 512));
    let e = frames(&bytes).unwrap_err();
    assert!(
        e.0.contains("the codestream is 256x1024") && e.0.contains("declare 256x512"),
        "{e}"
    );
    // 16-bit samples with 8 bits allocated (dicom-rs would keep their low bytes).
    let bytes = edited("MR_small_jp2klossless.dcm", |o| {
        set_us(o, tags::BITS_ALLOCATED, 8);
        set_us(o, tags::BITS_STORED, 8);
        set_us(o, tags::HIGH_BIT, 7);
    });
    let e = frames(&bytes).unwrap_err();
    assert!(e.0.contains("of up to 16 bits"), "{e}");
    // Three components declared, one in the codestream.
    let bytes = edited("MR_small_jp2klossless.dcm", |o| {
        set_us(o, tags::SAMPLES_PER_PIXEL, 3)
    });
    assert!(frames(&bytes)
        .unwrap_err()
        .0
        .contains("with 1 component(s)"));
    // Not a JPEG 2000 stream at all.
    let spec = Spec {
        ts: "1.2.840.10008.1.2.4.90",
        ..Spec::default()
    };
    let seq = PixelFragmentSequence::new_fragments(vec![vec![0xFF, 0xD8, 0xFF, 0xD9]]);
    let bytes = dicom_with(
        &spec,
        DataElement::new(tags::PIXEL_DATA, VR::OB, Value::PixelSequence(seq)),
    );
    assert_eq!(
        frames(&bytes).unwrap_err().0,
        "1.2.840.10008.1.2.4.90 (JPEG 2000 Lossless) frame 0: no JPEG 2000 codestream header (SOC, SIZ)"
    );
}

/// A 64x64 signed 16-bit JPEG-LS file of `frames` frames with these fragments and offset table.
fn jpeg_ls_file(frames: u32, table: Vec<u32>, fragments: Vec<Vec<u8>>) -> Vec<u8> {
    let spec = Spec {
        rows: 64,
        cols: 64,
        frames,
        signed: true,
        ts: "1.2.840.10008.1.2.4.80",
        ..Spec::default()
    };
    let seq = PixelFragmentSequence::new(table, fragments);
    dicom_with(
        &spec,
        DataElement::new(tags::PIXEL_DATA, VR::OB, Value::PixelSequence(seq)),
    )
}

#[test]
fn multi_frame_jpeg_ls_frames_are_found_as_dicom_rs_finds_them() {
    let stream = first_fragment("MR_small_jpeg_ls_lossless.dcm");
    let one = frames(&read("MR_small_jpeg_ls_lossless.dcm")).unwrap();
    let want = grey(&one[0]).data.clone();
    let (a, b) = stream.split_at(1000);
    let (a, b) = (a.to_vec(), b.to_vec());
    let second = (a.len() + b.len() + 16) as u32;
    for (what, bytes) in [
        (
            "one fragment per frame",
            jpeg_ls_file(2, vec![], vec![stream.clone(), stream.clone()]),
        ),
        (
            "two fragments per frame, by the offset table",
            jpeg_ls_file(
                2,
                vec![0, second],
                vec![a.clone(), b.clone(), a.clone(), b.clone()],
            ),
        ),
        (
            "two fragments per frame, no offset table: a frame starts at SOI",
            jpeg_ls_file(2, vec![], vec![a.clone(), b.clone(), a.clone(), b.clone()]),
        ),
        (
            "one frame in three fragments",
            jpeg_ls_file(
                1,
                vec![],
                vec![a.clone(), b[..10].to_vec(), b[10..].to_vec()],
            ),
        ),
    ] {
        let fr = frames(&bytes).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(!fr.is_empty(), "{what}");
        for f in &fr {
            assert_eq!(grey(f).data, want, "{what}");
        }
    }
    // Three frames declared, two streams.
    let bytes = jpeg_ls_file(3, vec![], vec![a.clone(), b.clone(), a.clone(), b.clone()]);
    assert_eq!(
        frames(&bytes).unwrap_err().0,
        "encapsulated pixel data: 4 fragment(s) hold 2 frame(s), Number of Frames is 3"
    );
}

#[test]
fn damaged_streams_are_rejects_not_panics() {
    let ls = first_fragment("MR_small_jpeg_ls_lossless.dcm");
    let j12 = first_fragment("JPGExtended.dcm");
    let j2k = first_fragment("MR_small_jp2klossless.dcm");
    let file = |ts: &str, frag: Vec<u8>| {
        let spec = Spec {
            rows: if ts.ends_with(".51") { 1024 } else { 64 },
            cols: if ts.ends_with(".51") { 256 } else { 64 },
            signed: !ts.ends_with(".51"),
            ts,
            ..Spec::default()
        };
        let seq = PixelFragmentSequence::new_fragments(vec![frag]);
        dicom_with(
            &spec,
            DataElement::new(tags::PIXEL_DATA, VR::OB, Value::PixelSequence(seq)),
        )
    };
    for (ts, stream) in [
        ("1.2.840.10008.1.2.4.80", &ls),
        ("1.2.840.10008.1.2.4.51", &j12),
        ("1.2.840.10008.1.2.4.90", &j2k),
    ] {
        // Whole: decodes.
        frames(&file(ts, stream.clone())).unwrap_or_else(|e| panic!("{ts}: {e}"));
        for cut in [stream.len() / 2, stream.len() * 9 / 10, 40] {
            let mut s = stream[..cut].to_vec();
            s.truncate(s.len() & !1);
            let e = frames(&file(ts, s)).expect_err(ts);
            assert!(!e.0.is_empty(), "{ts}");
        }
        // Entropy-coded bytes flipped: an error or some image, never a panic.
        let mut s = stream.clone();
        for i in (s.len() / 3..s.len() - 4).step_by(7) {
            s[i] ^= 0x5A;
        }
        let _ = frames(&file(ts, s));
    }
}

#[test]
fn probe_and_series_header_read_compressed_files() {
    for (name, rows, cols, spp) in [
        ("JPEG2000.dcm", 1024, 256, 1),
        ("MR_small_jp2klossless.dcm", 64, 64, 1),
        ("GDCMJ2K_TextGBR.dcm", 400, 400, 3),
        ("MR_small_jpeg_ls_lossless.dcm", 64, 64, 1),
        ("JPEGLSNearLossless_16.dcm", 50, 10, 1),
        ("SC_rgb_jls_lossy_line.dcm", 100, 100, 3),
        ("JPGExtended.dcm", 1024, 256, 1),
    ] {
        let p = probe(&fixture(name), &DecodeOptions::default()).unwrap();
        assert_eq!(p.size, Some((rows, cols)), "{name}");
        assert_eq!(p.colour, spp == 3, "{name}");
        let h = read_header(&fixture(name)).unwrap();
        assert_eq!(
            (h.rows, h.cols, h.samples_per_pixel, h.frames),
            (rows, cols, spp, 1),
            "{name}"
        );
    }
}
