//! The DICOM decoder's tests (and helpers the series tests share).
use super::header::*;
use super::pixels::*;
use super::*;
use dicom_core::value::{PixelFragmentSequence, Value};
use dicom_core::{DataElement, PrimitiveValue, VR};
use dicom_dictionary_std::uids;
use dicom_object::{FileMetaTableBuilder, InMemDicomObject};

#[derive(Clone, Copy)]
pub(crate) struct Spec<'a> {
    pub rows: u16,
    pub cols: u16,
    pub frames: u32,
    pub bits: u16,
    pub signed: bool,
    pub pi: &'a str,
    pub spp: u16,
    pub slope: Option<f64>,
    pub intercept: Option<f64>,
    pub window: Option<(&'a str, &'a str)>,
    pub ts: &'a str,
}

impl Default for Spec<'_> {
    fn default() -> Self {
        Spec {
            rows: 3,
            cols: 4,
            frames: 1,
            bits: 16,
            signed: false,
            pi: "MONOCHROME2",
            spp: 1,
            slope: None,
            intercept: None,
            window: None,
            ts: uids::EXPLICIT_VR_LITTLE_ENDIAN,
        }
    }
}

/// A DICOM file (with preamble) built with dicom-object's in-memory API. `pixels` are the
/// stored samples in order; for 8 bits they are truncated to bytes.
pub(crate) fn dicom_bytes(s: &Spec, pixels: &[i32]) -> Vec<u8> {
    let pixel = if s.bits == 8 {
        DataElement::new(
            tags::PIXEL_DATA,
            VR::OB,
            PrimitiveValue::from(pixels.iter().map(|&v| v as u8).collect::<Vec<u8>>()),
        )
    } else {
        DataElement::new(
            tags::PIXEL_DATA,
            VR::OW,
            PrimitiveValue::U16(pixels.iter().map(|&v| v as u16).collect()),
        )
    };
    dicom_with(s, pixel)
}

/// An encapsulated file: one fragment per frame, empty basic offset table.
fn dicom_fragments(s: &Spec, frags: Vec<Vec<u8>>) -> Vec<u8> {
    let seq = PixelFragmentSequence::new_fragments(frags);
    dicom_with(
        s,
        DataElement::new(tags::PIXEL_DATA, VR::OB, Value::PixelSequence(seq)),
    )
}

pub(crate) fn dicom_with(s: &Spec, pixel: dicom_object::mem::InMemElement) -> Vec<u8> {
    let mut obj = InMemDicomObject::new_empty();
    let us = |t, v: u16| DataElement::new(t, VR::US, PrimitiveValue::from(v));
    obj.put(DataElement::new(
        tags::SOP_CLASS_UID,
        VR::UI,
        PrimitiveValue::from(uids::SECONDARY_CAPTURE_IMAGE_STORAGE),
    ));
    obj.put(DataElement::new(
        tags::SOP_INSTANCE_UID,
        VR::UI,
        PrimitiveValue::from("1.2.3.4.5.6.7"),
    ));
    obj.put(us(tags::ROWS, s.rows));
    obj.put(us(tags::COLUMNS, s.cols));
    obj.put(us(tags::SAMPLES_PER_PIXEL, s.spp));
    obj.put(us(tags::BITS_ALLOCATED, s.bits));
    obj.put(us(tags::BITS_STORED, s.bits));
    obj.put(us(tags::HIGH_BIT, s.bits - 1));
    obj.put(us(tags::PIXEL_REPRESENTATION, s.signed as u16));
    obj.put(DataElement::new(
        tags::PHOTOMETRIC_INTERPRETATION,
        VR::CS,
        PrimitiveValue::from(s.pi),
    ));
    if s.spp == 3 {
        obj.put(us(tags::PLANAR_CONFIGURATION, 0));
    }
    if s.frames != 1 {
        obj.put(DataElement::new(
            tags::NUMBER_OF_FRAMES,
            VR::IS,
            PrimitiveValue::from(s.frames.to_string()),
        ));
    }
    if let Some(v) = s.slope {
        obj.put(DataElement::new(
            tags::RESCALE_SLOPE,
            VR::DS,
            PrimitiveValue::from(v.to_string()),
        ));
    }
    if let Some(v) = s.intercept {
        obj.put(DataElement::new(
            tags::RESCALE_INTERCEPT,
            VR::DS,
            PrimitiveValue::from(v.to_string()),
        ));
    }
    if let Some((c, w)) = s.window {
        obj.put(DataElement::new(
            tags::WINDOW_CENTER,
            VR::DS,
            PrimitiveValue::from(c),
        ));
        obj.put(DataElement::new(
            tags::WINDOW_WIDTH,
            VR::DS,
            PrimitiveValue::from(w),
        ));
    }
    obj.put(pixel);
    let file = obj
        .with_meta(FileMetaTableBuilder::new().transfer_syntax(s.ts))
        .unwrap();
    let mut out = Vec::new();
    file.write_all(&mut out).unwrap();
    out
}

fn decode_all(bytes: &[u8], opts: &DecodeOptions) -> Result<Vec<DynamicImage>, Reject> {
    let mut out = Vec::new();
    decode_bytes(bytes, opts, &mut |f| {
        out.push(f.expect_image());
        Ok(())
    })?;
    Ok(out)
}

#[test]
fn probe_reads_colour_and_size_from_the_header() {
    let t = tempfile::tempdir().unwrap();
    let rgb = Spec {
        bits: 8,
        pi: "RGB",
        spp: 3,
        ..Spec::default()
    };
    let multi = Spec {
        frames: 5,
        ..Spec::default()
    };
    // big.dcm is larger than the first read: probed from its first bytes.
    let big = Spec {
        rows: 200,
        cols: 300,
        ..Spec::default()
    };
    for (name, spec, n) in [
        ("grey.dcm", Spec::default(), 12),
        ("rgb.dcm", rgb, 36),
        ("multi.dcm", multi, 60),
        ("big.dcm", big, 60_000),
    ] {
        let bytes = dicom_bytes(&spec, &(0..n).collect::<Vec<_>>());
        let p = t.path().join(name);
        std::fs::write(&p, &bytes).unwrap();
        for axis in 0..3 {
            let o = DecodeOptions {
                axis,
                ..DecodeOptions::default()
            };
            let first = decode_all(&bytes, &o).unwrap().remove(0);
            let got = probe(&p, &o).unwrap();
            assert_eq!(got.colour, first.color().has_color(), "{name}");
            assert_eq!(
                got.size,
                Some((first.height(), first.width())),
                "{name} axis {axis}"
            );
        }
    }
    let p = t.path().join("junk.dcm");
    std::fs::write(&p, b"not a DICOM file").unwrap();
    assert!(probe(&p, &DecodeOptions::default()).is_err());
}

fn luma(img: &DynamicImage) -> &ImageBuffer<Luma<u16>, Vec<u16>> {
    match img {
        DynamicImage::ImageLuma16(b) => b,
        other => panic!("expected Luma16, got {:?}", other.color()),
    }
}

#[test]
fn ct_like_frame_with_rescale_and_file_window() {
    // Stored 0..11, rescaled to 10 v - 1000: -1000 ..= -890; window center -945 width 41 is
    // [-945.5 - 20, -945.5 + 20] = [-965.5, -925.5].
    let pixels: Vec<i32> = (0..12).collect();
    let spec = Spec {
        slope: Some(10.0),
        intercept: Some(-1000.0),
        window: Some(("-945", "41")),
        ..Spec::default()
    };
    for ts in [
        uids::EXPLICIT_VR_LITTLE_ENDIAN,
        uids::IMPLICIT_VR_LITTLE_ENDIAN,
    ] {
        let bytes = dicom_bytes(&Spec { ts, ..spec }, &pixels);
        let imgs = decode_all(&bytes, &DecodeOptions::default()).unwrap();
        assert_eq!(imgs.len(), 1);
        let img = luma(&imgs[0]);
        assert_eq!(img.dimensions(), (4, 3));
        let (low, high) = (-945.0 - 0.5 - 20.0, -945.0 - 0.5 + 20.0);
        for (i, p) in img.pixels().enumerate() {
            assert_eq!(
                p[0],
                window_to_u16(10.0 * i as f64 - 1000.0, low, high),
                "pixel {i}"
            );
        }
        assert_eq!(img.get_pixel(0, 0)[0], 0, "below the window");
        assert_eq!(img.get_pixel(3, 2)[0], 65535, "above the window");
        // Center -945 is stored 5.5; stored 5 (-950) and 6 (-940) straddle 32768.
        assert!(img.get_pixel(1, 1)[0] < 32768 && img.get_pixel(2, 1)[0] > 32768);
        assert!((window_to_u16(-945.0, low, high) as i32 - 32768).abs() < 1000);
    }
}

/// Every frame decoded with `opts.float`, as float frames.
fn decode_float(bytes: &[u8], axis: usize) -> Vec<FloatFrame> {
    let mut out = Vec::new();
    let o = DecodeOptions {
        float: true,
        axis,
        ..DecodeOptions::default()
    };
    decode_bytes(bytes, &o, &mut |f| {
        match f {
            Frame::Float(f) => out.push(f),
            Frame::Image(i) => panic!("expected float values, got {:?}", i.color()),
            Frame::Windowed(_) => panic!("expected float values"),
        }
        Ok(())
    })
    .unwrap();
    out
}

#[test]
fn float_option_gives_modality_values_without_window_or_inversion() {
    // Signed stored values, slope 2.5, intercept -1024, a file window and MONOCHROME1: the
    // values are 2.5 v - 1024 as they are.
    let pixels: Vec<i32> = (-6..6).chain(100..112).collect();
    let spec = Spec {
        frames: 2,
        signed: true,
        pi: "MONOCHROME1",
        slope: Some(2.5),
        intercept: Some(-1024.0),
        window: Some(("40", "400")),
        ..Spec::default()
    };
    let bytes = dicom_bytes(&spec, &pixels);
    let hu = |v: i32| (v as f64 * 2.5 - 1024.0) as f32;
    let frames = decode_float(&bytes, 2);
    assert_eq!(frames.len(), 2);
    for (f, frame) in frames.iter().enumerate() {
        assert_eq!((frame.channels, frame.width, frame.height), (1, 4, 3));
        let want: Vec<f32> = pixels[12 * f..12 * (f + 1)]
            .iter()
            .map(|&v| hu(v))
            .collect();
        assert_eq!(frame.data, want, "frame {f}");
    }
    // As a volume cut along x: column 1 of both frames, the last frame on the top row (a
    // multi-frame file's orientation is not read: its axes are cut as stored).
    let cols = decode_float(&bytes, 0);
    assert_eq!(cols.len(), 4);
    assert_eq!((cols[1].width, cols[1].height), (3, 2));
    let want: Vec<f32> = [13, 17, 21, 1, 5, 9]
        .iter()
        .map(|&i| hu(pixels[i]))
        .collect();
    assert_eq!(cols[1].data, want);
}

#[test]
fn option_window_overrides_and_min_max_fallback() {
    let pixels: Vec<i32> = (0..12).map(|v| v * 100).collect();
    let bytes = dicom_bytes(
        &Spec {
            window: Some(("0", "10")),
            ..Spec::default()
        },
        &pixels,
    );
    let o = DecodeOptions {
        window: Some((0.0, 1100.0)),
        ..DecodeOptions::default()
    };
    let img = decode_all(&bytes, &o).unwrap();
    assert_eq!(luma(&img[0]).get_pixel(0, 0)[0], 0);
    assert_eq!(luma(&img[0]).get_pixel(3, 2)[0], 65535);
    assert_eq!(
        luma(&img[0]).get_pixel(1, 0)[0],
        window_to_u16(100.0, 0.0, 1100.0)
    );
    // No window in the file: min..max of the frame.
    let bytes = dicom_bytes(&Spec::default(), &pixels);
    let img = decode_all(&bytes, &DecodeOptions::default()).unwrap();
    assert_eq!(luma(&img[0]).get_pixel(0, 0)[0], 0);
    assert_eq!(luma(&img[0]).get_pixel(3, 2)[0], 65535);
    assert_eq!(
        luma(&img[0]).get_pixel(1, 0)[0],
        window_to_u16(100.0, 0.0, 1100.0)
    );
}

#[test]
fn signed_monochrome1_multiframe() {
    // Two frames of signed values; MONOCHROME1 inverts.
    let pixels: Vec<i32> = (-6..6).chain(0..12).collect();
    let spec = Spec {
        frames: 2,
        signed: true,
        pi: "MONOCHROME1",
        ..Spec::default()
    };
    let bytes = dicom_bytes(&spec, &pixels);
    let imgs = decode_all(&bytes, &DecodeOptions::default()).unwrap();
    assert_eq!(imgs.len(), 2);
    let a = luma(&imgs[0]);
    assert_eq!(
        a.get_pixel(0, 0)[0],
        65535,
        "-6 is the frame minimum, inverted to white"
    );
    assert_eq!(a.get_pixel(3, 2)[0], 0);
    assert_eq!(a.get_pixel(2, 1)[0], 65535 - window_to_u16(0.0, -6.0, 5.0));
    assert_eq!(luma(&imgs[1]).get_pixel(0, 0)[0], 65535);

    // The same two frames as a volume, cut along x: 4 images of 3 x 2; along y: 3 of 4 x 2.
    let spec = Spec {
        frames: 2,
        signed: true,
        ..Spec::default()
    };
    let bytes = dicom_bytes(&spec, &pixels);
    let o = DecodeOptions {
        axis: 0,
        ..DecodeOptions::default()
    };
    let x = decode_all(&bytes, &o).unwrap();
    assert_eq!(x.len(), 4);
    assert_eq!(luma(&x[0]).dimensions(), (3, 2));
    // Volume window -6..11: column 0, row 0 of frame 0 is -6 -> 0; frame 1 row 2 col 3 is 11.
    // The last frame is the top row.
    assert_eq!(luma(&x[0]).get_pixel(0, 1)[0], 0);
    assert_eq!(luma(&x[3]).get_pixel(2, 0)[0], 65535);
    assert_eq!(
        luma(&x[1]).get_pixel(2, 0)[0],
        window_to_u16(9.0, -6.0, 11.0)
    );
    let y = decode_all(
        &bytes,
        &DecodeOptions {
            axis: 1,
            ..DecodeOptions::default()
        },
    )
    .unwrap();
    assert_eq!(y.len(), 3);
    assert_eq!(luma(&y[2]).dimensions(), (4, 2));
    assert_eq!(
        luma(&y[2]).get_pixel(1, 0)[0],
        window_to_u16(9.0, -6.0, 11.0)
    );
}

#[test]
fn eight_bit_grey_and_rgb() {
    let pixels: Vec<i32> = (0..12).map(|v| v * 20).collect();
    let bytes = dicom_bytes(
        &Spec {
            bits: 8,
            ..Spec::default()
        },
        &pixels,
    );
    let img = decode_all(&bytes, &DecodeOptions::default()).unwrap();
    assert_eq!(luma(&img[0]).get_pixel(3, 2)[0], 65535);
    assert_eq!(luma(&img[0]).get_pixel(0, 0)[0], 0);

    let rgb: Vec<i32> = (0..36).map(|v| v * 7).collect();
    let bytes = dicom_bytes(
        &Spec {
            bits: 8,
            spp: 3,
            pi: "RGB",
            window: Some(("0", "2")),
            ..Spec::default()
        },
        &rgb,
    );
    let img = decode_all(&bytes, &DecodeOptions::default()).unwrap();
    match &img[0] {
        DynamicImage::ImageRgb8(b) => {
            assert_eq!(b.dimensions(), (4, 3));
            assert_eq!(b.get_pixel(1, 0).0, [21, 28, 35]);
            assert_eq!(b.get_pixel(3, 2).0, [231, 238, 245]);
        }
        other => panic!("expected Rgb8, got {:?}", other.color()),
    }
    let rgb16: Vec<i32> = (0..36).map(|v| v * 1000).collect();
    let bytes = dicom_bytes(
        &Spec {
            spp: 3,
            pi: "RGB",
            ..Spec::default()
        },
        &rgb16,
    );
    match &decode_all(&bytes, &DecodeOptions::default()).unwrap()[0] {
        DynamicImage::ImageRgb16(b) => assert_eq!(b.get_pixel(1, 0).0, [3000, 4000, 5000]),
        other => panic!("expected Rgb16, got {:?}", other.color()),
    }
}

#[test]
fn unsupported_and_missing_pixel_data() {
    // No pixel data.
    let mut obj = InMemDicomObject::new_empty();
    obj.put(DataElement::new(
        tags::SOP_INSTANCE_UID,
        VR::UI,
        PrimitiveValue::from("1.2.3"),
    ));
    obj.put(DataElement::new(
        tags::SOP_CLASS_UID,
        VR::UI,
        PrimitiveValue::from(uids::BASIC_TEXT_SR_STORAGE),
    ));
    let file = obj
        .with_meta(FileMetaTableBuilder::new().transfer_syntax(uids::EXPLICIT_VR_LITTLE_ENDIAN))
        .unwrap();
    let mut bytes = Vec::new();
    file.write_all(&mut bytes).unwrap();
    let e = decode_all(&bytes, &DecodeOptions::default()).unwrap_err();
    assert!(e.0.contains("no pixel data"), "{e}");

    // JPEG XL: an encapsulated fragment the pure-Rust build cannot decode.
    let mut obj = InMemDicomObject::new_empty();
    let us = |t, v: u16| DataElement::new(t, VR::US, PrimitiveValue::from(v));
    for (t, v) in [
        (tags::ROWS, 4),
        (tags::COLUMNS, 4),
        (tags::SAMPLES_PER_PIXEL, 1),
        (tags::BITS_ALLOCATED, 16),
        (tags::BITS_STORED, 16),
        (tags::HIGH_BIT, 15),
        (tags::PIXEL_REPRESENTATION, 0),
    ] {
        obj.put(us(t, v));
    }
    obj.put(DataElement::new(
        tags::SOP_INSTANCE_UID,
        VR::UI,
        PrimitiveValue::from("1.2.3"),
    ));
    obj.put(DataElement::new(
        tags::SOP_CLASS_UID,
        VR::UI,
        PrimitiveValue::from(uids::CT_IMAGE_STORAGE),
    ));
    obj.put(DataElement::new(
        tags::PHOTOMETRIC_INTERPRETATION,
        VR::CS,
        PrimitiveValue::from("MONOCHROME2"),
    ));
    obj.put(DataElement::new(
        tags::PIXEL_DATA,
        VR::OB,
        Value::PixelSequence(PixelFragmentSequence::new_fragments(vec![vec![
            0xFF, 0x4F, 0xFF, 0x51, 0, 0,
        ]])),
    ));
    let file = obj
        .with_meta(FileMetaTableBuilder::new().transfer_syntax("1.2.840.10008.1.2.4.110"))
        .unwrap();
    let mut bytes = Vec::new();
    file.write_all(&mut bytes).unwrap();
    let e = decode_all(&bytes, &DecodeOptions::default()).unwrap_err();
    assert_eq!(
        e.0,
        "unsupported transfer syntax 1.2.840.10008.1.2.4.110 (JPEG XL)"
    );
    // Cut inside its fragment: the header walk names the truncation.
    let e = decode_all(&bytes[..bytes.len() - 3], &DecodeOptions::default()).unwrap_err();
    assert!(e.0.starts_with("truncated DICOM"), "{e}");
    let e = decode_all(&bytes[..bytes.len() - 8], &DecodeOptions::default()).unwrap_err();
    assert!(e.0.starts_with("truncated DICOM"), "{e}");
}

#[test]
fn rle_and_jpeg_encapsulated_frames() {
    // RLE Lossless, 8-bit grey, two frames: one PackBits literal run per frame.
    let frame = |k: u8| -> Vec<u8> {
        let mut f = vec![0u8; 64];
        f[0] = 1; // one segment
        f[4] = 64; // at offset 64
        f.push(11); // 12 literal bytes follow
        f.extend((0..12u8).map(|v| v * 20 + k));
        f.push(0); // even length
        f
    };
    let spec = Spec {
        bits: 8,
        frames: 2,
        ts: uids::RLE_LOSSLESS,
        ..Spec::default()
    };
    let bytes = dicom_fragments(&spec, vec![frame(0), frame(5)]);
    let o = DecodeOptions {
        window: Some((0.0, 255.0)),
        ..DecodeOptions::default()
    };
    let imgs = decode_all(&bytes, &o).unwrap();
    assert_eq!(imgs.len(), 2);
    for (k, img) in imgs.iter().enumerate() {
        let img = luma(img);
        assert_eq!(img.dimensions(), (4, 3));
        for (i, p) in img.pixels().enumerate() {
            assert_eq!(
                p[0],
                (i as u16 * 20 + 5 * k as u16) * 257,
                "frame {k} pixel {i}"
            );
        }
    }

    // JPEG baseline, grey and colour (YBR_FULL_422 in the file, RGB out of the codec).
    use image::codecs::jpeg::JpegEncoder;
    use image::ExtendedColorType;
    let (w, h) = (16u32, 8u32);
    let grey: Vec<u8> = (0..w * h)
        .map(|i| if i % w < 8 { 40 } else { 200 })
        .collect();
    let mut jpg = Vec::new();
    JpegEncoder::new_with_quality(&mut jpg, 95)
        .encode(&grey, w, h, ExtendedColorType::L8)
        .unwrap();
    if jpg.len() % 2 == 1 {
        jpg.push(0);
    }
    let spec = Spec {
        bits: 8,
        rows: h as u16,
        cols: w as u16,
        ts: uids::JPEG_BASELINE8_BIT,
        ..Spec::default()
    };
    let imgs = decode_all(&dicom_fragments(&spec, vec![jpg]), &o).unwrap();
    let img = luma(&imgs[0]);
    assert_eq!(img.dimensions(), (w, h));
    assert!((img.get_pixel(2, 3)[0] as i32 - 40 * 257).abs() < 6 * 257);
    assert!((img.get_pixel(13, 3)[0] as i32 - 200 * 257).abs() < 6 * 257);

    let rgb: Vec<u8> = (0..w * h)
        .flat_map(|i| {
            if i % w < 8 {
                [200, 30, 30]
            } else {
                [20, 60, 220]
            }
        })
        .collect();
    let mut jpg = Vec::new();
    JpegEncoder::new_with_quality(&mut jpg, 95)
        .encode(&rgb, w, h, ExtendedColorType::Rgb8)
        .unwrap();
    if jpg.len() % 2 == 1 {
        jpg.push(0);
    }
    let spec = Spec {
        spp: 3,
        pi: "YBR_FULL_422",
        ..spec
    };
    let imgs = decode_all(
        &dicom_fragments(&spec, vec![jpg]),
        &DecodeOptions::default(),
    )
    .unwrap();
    match &imgs[0] {
        DynamicImage::ImageRgb8(b) => {
            let near = |p: [u8; 3], q: [u8; 3]| {
                p.iter()
                    .zip(q)
                    .all(|(&a, b)| (a as i32 - b as i32).abs() < 12)
            };
            assert!(
                near(b.get_pixel(2, 3).0, [200, 30, 30]),
                "{:?}",
                b.get_pixel(2, 3)
            );
            assert!(
                near(b.get_pixel(13, 3).0, [20, 60, 220]),
                "{:?}",
                b.get_pixel(13, 3)
            );
        }
        other => panic!("expected Rgb8, got {:?}", other.color()),
    }
}

/// dicom-rs copies each decoded JPEG into a buffer sized from the attributes without a bounds
/// check: a JPEG larger than they declare, in any frame, panicked (fuzz/regressions holds the
/// file the dicom fuzz target found). It is rejected before decoding, naming the frame.
#[test]
fn jpeg_frames_larger_than_the_attributes_are_rejected() {
    use image::codecs::jpeg::JpegEncoder;
    use image::ExtendedColorType;
    let jpeg = |w: u32, colour: bool| {
        let c = if colour { 3 } else { 1 };
        let px = vec![90u8; (w * 8 * c) as usize];
        let ty = if colour {
            ExtendedColorType::Rgb8
        } else {
            ExtendedColorType::L8
        };
        let mut j = Vec::new();
        JpegEncoder::new(&mut j).encode(&px, w, 8, ty).unwrap();
        if j.len() % 2 == 1 {
            j.push(0);
        }
        j
    };
    let spec = Spec {
        bits: 8,
        rows: 8,
        cols: 16,
        ts: uids::JPEG_BASELINE8_BIT,
        ..Spec::default()
    };
    let o = DecodeOptions::default();
    // A colour JPEG in a grey file.
    let e = decode_all(&dicom_fragments(&spec, vec![jpeg(16, true)]), &o).unwrap_err();
    assert!(
        e.0.contains("JPEG frame 0 is 16x8 with 3 component(s) of 8 bits")
            && e.0.contains("16x8 with 1 sample(s) per pixel"),
        "{e}"
    );
    // Two frames, the second wider than the attributes say.
    let two = Spec { frames: 2, ..spec };
    let e = decode_all(
        &dicom_fragments(&two, vec![jpeg(16, false), jpeg(32, false)]),
        &o,
    )
    .unwrap_err();
    assert!(e.0.contains("JPEG frame 1 is 32x8"), "{e}");
    // Both frames as declared: decoded.
    let imgs = decode_all(
        &dicom_fragments(&two, vec![jpeg(16, false), jpeg(16, false)]),
        &o,
    )
    .unwrap();
    assert_eq!(imgs.len(), 2);
}

#[test]
fn absurd_dimensions_are_rejected() {
    // Claims 60000 x 60000 but holds 12 samples.
    let bytes = dicom_bytes(&Spec::default(), &(0..12).collect::<Vec<_>>());
    let mut obj = OpenFileOptions::new().from_reader(&bytes[128..]).unwrap();
    obj.put(DataElement::new(
        tags::ROWS,
        VR::US,
        PrimitiveValue::from(60000u16),
    ));
    obj.put(DataElement::new(
        tags::COLUMNS,
        VR::US,
        PrimitiveValue::from(60000u16),
    ));
    let e = decode_object(&obj, &DecodeOptions::default(), &mut |_| Ok(())).unwrap_err();
    assert!(e.0.contains("too large"), "{e}");
    obj.put(DataElement::new(
        tags::ROWS,
        VR::US,
        PrimitiveValue::from(30u16),
    ));
    obj.put(DataElement::new(
        tags::COLUMNS,
        VR::US,
        PrimitiveValue::from(30u16),
    ));
    let e = decode_object(&obj, &DecodeOptions::default(), &mut |_| Ok(())).unwrap_err();
    assert!(
        e.0.contains("truncated") || e.0.contains("pixel data"),
        "{e}"
    );
    obj.put(DataElement::new(
        tags::NUMBER_OF_FRAMES,
        VR::IS,
        PrimitiveValue::from("2000000000"),
    ));
    let e = decode_object(&obj, &DecodeOptions::default(), &mut |_| Ok(())).unwrap_err();
    assert!(e.0.contains("too large"), "{e}");
    obj.put(DataElement::new(
        tags::ROWS,
        VR::US,
        PrimitiveValue::from(0u16),
    ));
    let e = decode_object(&obj, &DecodeOptions::default(), &mut |_| Ok(())).unwrap_err();
    assert!(e.0.contains("Rows = 0"), "{e}");
}

#[test]
fn truncated_and_garbage_bytes_are_rejects() {
    let pixels: Vec<i32> = (0..12).collect();
    let full = dicom_bytes(
        &Spec {
            window: Some(("5", "10")),
            ..Spec::default()
        },
        &pixels,
    );
    assert!(decode_all(&full, &DecodeOptions::default()).is_ok());
    for cut in (0..full.len())
        .step_by(3)
        .chain([full.len() - 1, full.len() - 2])
    {
        let e = decode_all(&full[..cut], &DecodeOptions::default()).unwrap_err();
        assert!(
            e.0.contains("truncated") || e.0.contains("not a DICOM") || e.0.contains("pixel data"),
            "cut at {cut}: {e}"
        );
    }
    let e = decode_all(&full[..full.len() - 5], &DecodeOptions::default()).unwrap_err();
    assert!(e.0.starts_with("truncated DICOM"), "{e}");
    // A length field that lies: pixel data claiming 2 GiB.
    let at = full
        .windows(4)
        .rposition(|w| w == [0xE0, 0x7F, 0x10, 0x00])
        .unwrap();
    let mut lie = full.clone();
    lie[at + 8..at + 12].copy_from_slice(&0x8000_0000u32.to_le_bytes());
    let e = decode_all(&lie, &DecodeOptions::default()).unwrap_err();
    assert!(e.0.contains("declares 2147483648 bytes"), "{e}");
    // Garbage, with and without a DICM marker; byte flips everywhere.
    let mut seed = 0x2545F4914F6CDD1Du64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed as u8
    };
    for len in [0usize, 10, 132, 200, 1000] {
        let mut junk: Vec<u8> = (0..len).map(|_| rnd()).collect();
        assert!(decode_all(&junk, &DecodeOptions::default()).is_err());
        if len >= 132 {
            junk[128..132].copy_from_slice(b"DICM");
            assert!(decode_all(&junk, &DecodeOptions::default()).is_err());
        }
    }
    for i in 128..full.len() {
        let mut b = full.clone();
        b[i] ^= 0x5A;
        let _ = decode_all(&b, &DecodeOptions::default());
        b[i] = rnd();
        let _ = decode_all(&b, &DecodeOptions::default());
    }
}

/// `bytes` with these elements added (DS/UI/LO/IS strings).
fn with_elements(bytes: &[u8], els: &[(dicom_core::Tag, VR, &str)]) -> Vec<u8> {
    let mut obj = OpenFileOptions::new().from_reader(&bytes[128..]).unwrap();
    for &(tag, vr, v) in els {
        obj.put(DataElement::new(tag, vr, PrimitiveValue::from(v)));
    }
    let mut out = Vec::new();
    obj.write_all(&mut out).unwrap();
    out
}

/// A file larger than what `probe` and `read_header` read (4 MiB) whose header holds an element
/// declaring more bytes than the whole file: dicom-rs zero-filled the declared 2 GiB before
/// reading from the 64 KiB and 4 MiB prefixes. The prefix is walked with the file's length as
/// the bound first.
#[test]
fn header_length_beyond_the_file_is_rejected_from_a_prefix() {
    let base = dicom_bytes(&Spec::default(), &(0..12).collect::<Vec<_>>());
    let mut obj = OpenFileOptions::new().from_reader(&base[128..]).unwrap();
    obj.put(DataElement::new(
        dicom_core::Tag(0x0009, 0x1000),
        VR::OB,
        PrimitiveValue::from(vec![1u8; 16]),
    ));
    // After the pixel data, which the header reads stop at: makes the file larger than 4 MiB.
    obj.put(DataElement::new(
        dicom_core::Tag(0x7FE1, 0x0010),
        VR::OB,
        PrimitiveValue::from(vec![7u8; 4 << 20]),
    ));
    let mut b = Vec::new();
    obj.write_all(&mut b).unwrap();
    // The element's 32-bit length follows "OB" and two reserved bytes.
    let at = b
        .windows(6)
        .position(|w| w == [0x09, 0x00, 0x00, 0x10, b'O', b'B'])
        .unwrap();
    b[at + 8..at + 12].copy_from_slice(&0x7FFF_FFF0u32.to_le_bytes());
    assert!(b.len() as u64 > PROBE_BYTES[1]);
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("lying.dcm");
    std::fs::write(&p, &b).unwrap();
    let want = "declares 2147483632 bytes";
    let e = read_header(&p).unwrap_err();
    assert!(e.0.contains(want), "{e}");
    let e = probe(&p, &DecodeOptions::default()).unwrap_err();
    assert!(e.0.contains(want), "{e}");
    // The same file with its true length: read from the prefixes.
    let mut ok = Vec::new();
    obj.write_all(&mut ok).unwrap();
    std::fs::write(&p, &ok).unwrap();
    assert_eq!(read_header(&p).unwrap().rows, Spec::default().rows as u32);
    assert!(probe(&p, &DecodeOptions::default()).is_ok());
}

#[test]
fn read_header_gives_what_series_need_and_never_panics() {
    let t = tempfile::tempdir().unwrap();
    let els = [
        (tags::MODALITY, VR::CS, "CT"),
        (tags::PATIENT_ID, VR::LO, "PAT 7 "),
        (tags::STUDY_INSTANCE_UID, VR::UI, "1.2.3"),
        (tags::SERIES_INSTANCE_UID, VR::UI, "1.2.3.4"),
        (tags::INSTANCE_NUMBER, VR::IS, "12"),
        (tags::IMAGE_POSITION_PATIENT, VR::DS, "-10.5\\20\\-3.25"),
        (tags::IMAGE_ORIENTATION_PATIENT, VR::DS, "1\\0\\0\\0\\1\\0"),
        (tags::PIXEL_SPACING, VR::DS, "0.7\\0.8"),
    ];
    let spec = Spec {
        window: Some(("40", "401")),
        signed: true,
        ..Spec::default()
    };
    // Small (read whole) and large (read from its first 64 KiB, pixel data beyond them).
    for (rows, cols) in [(3u16, 4u16), (200, 300)] {
        let n = rows as i32 * cols as i32;
        let bytes = with_elements(
            &dicom_bytes(&Spec { rows, cols, ..spec }, &(0..n).collect::<Vec<_>>()),
            &els,
        );
        let p = t.path().join(format!("{rows}.dcm"));
        std::fs::write(&p, &bytes).unwrap();
        let h = read_header(&p).unwrap();
        assert_eq!(
            h,
            SeriesHeader {
                patient_id: Some("PAT 7".into()),
                study_uid: Some("1.2.3".into()),
                series_uid: Some("1.2.3.4".into()),
                modality: Some("CT".into()),
                rows: rows as u32,
                cols: cols as u32,
                frames: 1,
                samples_per_pixel: 1,
                bits_allocated: 16,
                bits_stored: 16,
                pixel_representation: 1,
                photometric: "MONOCHROME2".into(),
                pixel_spacing: Some([0.7, 0.8]),
                orientation: Some([1.0, 0.0, 0.0, 0.0, 1.0, 0.0]),
                position: Some([-10.5, 20.0, -3.25]),
                instance: Some(12),
                window: dicom_window(40.0, 401.0),
            }
        );
    }
    // Every cut and byte flip of a small file: an answer, never a panic.
    let full = with_elements(&dicom_bytes(&spec, &(0..12).collect::<Vec<_>>()), &els);
    for cut in 0..full.len() {
        let _ = header_from_head(&full[..cut], true, cut as u64, true);
        let _ = header_from_head(&full[..cut], false, full.len() as u64, true);
    }
    for i in 128..full.len() {
        let mut b = full.clone();
        b[i] ^= 0x5A;
        let _ = header_from_head(&b, true, b.len() as u64, true);
        let _ = header_from_head(&b, false, u64::MAX, true);
    }
    let p = t.path().join("junk.dcm");
    std::fs::write(&p, b"not a DICOM file").unwrap();
    assert!(read_header(&p).is_err());
}

#[test]
fn a_series_slice_that_cannot_be_decoded_is_left_out_or_ends_the_series() {
    use super::series::{decode_series, Order, SeriesPlan, SliceFile};
    let t = tempfile::tempdir().unwrap();
    let spec = Spec {
        pi: "MONOCHROME1",
        ..Spec::default()
    };
    let mut slots = Vec::new();
    for k in 0..3 {
        let bytes = dicom_bytes(&spec, &(0..12).map(|v| v + 100 * k).collect::<Vec<_>>());
        let p = t.path().join(format!("s{k}.dcm"));
        // The middle slice is cut short.
        let keep = if k == 1 { bytes.len() - 7 } else { bytes.len() };
        std::fs::write(&p, &bytes[..keep]).unwrap();
        slots.push(vec![SliceFile {
            rel: format!("s{k}.dcm"),
            path: p,
            window: None,
        }]);
    }
    let plan = SeriesPlan {
        uid: "1.2".into(),
        slots,
        rows: 3,
        cols: 4,
        colour: false,
        invert: true,
        order: Order::Position,
        geometry: crate::source::volume::Geometry {
            dims: [4, 3, 3],
            axes: None,
            spacing: [None; 3],
        },
        positions: None,
    };
    let mut imgs = Vec::new();
    let left = decode_series(&plan, &DecodeOptions::default(), &mut |f| {
        imgs.push(f.expect_image());
        Ok(())
    })
    .unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].0, "s1.dcm");
    assert!(left[0].1.contains("truncated"), "{left:?}");
    assert_eq!(imgs.len(), 2);
    // One window for the volume (min 0 .. max 211), inverted for MONOCHROME1.
    assert_eq!(luma(&imgs[0]).get_pixel(0, 0)[0], 65535);
    assert_eq!(luma(&imgs[1]).get_pixel(3, 2)[0], 0);
    assert_eq!(
        luma(&imgs[1]).get_pixel(0, 0)[0],
        65535 - window_to_u16(200.0, 0.0, 211.0)
    );
    // Along x the volume needs every slice: the whole series is left out, each file named.
    let o = DecodeOptions {
        axis: 0,
        ..DecodeOptions::default()
    };
    let all = decode_series(&plan, &o, &mut |_| Ok(())).unwrap_err();
    let names: Vec<&str> = all.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(names, ["s1.dcm", "s0.dcm", "s2.dcm"]);
    assert!(all[0].1.contains("truncated"), "{all:?}");
    assert!(
        all[1].1.contains("--axis 0 reslices the whole volume"),
        "{all:?}"
    );
}
