//! Still images through the `image` crate (PNG, JPEG, BMP, GIF, WebP). Sizes are capped before any
//! pixel is allocated. TIFF files have their own decoder (`super::tiff`), under the same caps.

use super::{Emit, Probe, Reject};
use image::{ImageDecoder, ImageReader, Limits};
use std::io::BufReader;
use std::path::Path;

/// Largest side and largest decoded image we accept: beyond this a file is rejected as absurd
/// rather than allowed to allocate gigabytes.
pub const MAX_SIDE: u32 = 32_768;
pub const MAX_ALLOC: u64 = 1 << 30;

fn limits() -> Limits {
    let mut l = Limits::default();
    l.max_image_width = Some(MAX_SIDE);
    l.max_image_height = Some(MAX_SIDE);
    l.max_alloc = Some(MAX_ALLOC);
    l
}

pub fn decode(path: &Path, emit: &mut Emit) -> Result<(), Reject> {
    let meta = std::fs::metadata(path).map_err(|e| Reject::new(e.to_string()))?;
    if meta.len() == 0 {
        return Err(Reject::new("empty file (0 bytes)"));
    }
    let mut r = ImageReader::open(path)
        .map_err(|e| Reject::new(e.to_string()))?
        .with_guessed_format()
        .map_err(|e| Reject::new(e.to_string()))?;
    if r.format().is_none() {
        return Err(Reject::new("not an image (unrecognised contents)"));
    }
    r.limits(limits());
    let img = if r.format() == Some(image::ImageFormat::Jpeg) {
        // Read once: the marker scan and the decoder share the bytes.
        let bytes = std::fs::read(path).map_err(|e| Reject::new(e.to_string()))?;
        if non_interleaved(&bytes) {
            return emit(decode_non_interleaved(&bytes)?.into());
        }
        let mut m = ImageReader::with_format(std::io::Cursor::new(bytes), image::ImageFormat::Jpeg);
        m.limits(limits());
        m.decode()
    } else {
        r.decode()
    };
    let img = img.map_err(|e| Reject::new(format!("cannot decode: {e}")))?;
    emit(img.into())
}

/// Whether a JPEG is sequential (baseline or extended) with its colour components in separate
/// scans: zune-jpeg 0.5, the image crate's decoder, decodes such files to wrong colours without
/// an error (zune-image issues 419, 422, 448), so they go to jpeg-decoder instead.
fn non_interleaved(b: &[u8]) -> bool {
    let mut at = 2;
    let mut components = 0;
    // Markers up to the first scan: 0xFF, a code, a big-endian length that counts itself.
    while at + 4 <= b.len() && b[at] == 0xFF {
        let code = b[at + 1];
        if code == 0xFF {
            at += 1;
            continue;
        }
        let len = u16::from_be_bytes([b[at + 2], b[at + 3]]) as usize;
        let seg = &b[(at + 4).min(b.len())..(at + 2 + len).min(b.len())];
        match code {
            0xC0 | 0xC1 if seg.len() >= 6 => components = seg[5],
            // Progressive, lossless, hierarchical or arithmetic frames (0xC4, 0xC8, 0xCC are not).
            0xC2 | 0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF => return false,
            0xDA => return seg.first().is_some_and(|&ns| ns < components),
            _ => {}
        }
        at += 2 + len;
    }
    false
}

fn decode_non_interleaved(bytes: &[u8]) -> Result<image::DynamicImage, Reject> {
    use image::{DynamicImage, ImageBuffer};
    let mut d = jpeg_decoder::Decoder::new(bytes);
    d.set_max_decoding_buffer_size(MAX_ALLOC as usize);
    d.read_info()
        .map_err(|e| Reject::new(format!("cannot read the header: {e}")))?;
    let info = d
        .info()
        .ok_or_else(|| Reject::new("cannot read the header"))?;
    let (w, h) = (info.width as u32, info.height as u32);
    if w > MAX_SIDE || h > MAX_SIDE {
        return Err(Reject::new(format!(
            "{w}x{h} is larger than {MAX_SIDE} a side"
        )));
    }
    let px = d
        .decode()
        .map_err(|e| Reject::new(format!("cannot decode: {e}")))?;
    let bad = || Reject::new("cannot decode: the decoder gave the wrong number of pixels");
    use jpeg_decoder::PixelFormat as F;
    Ok(match info.pixel_format {
        F::L8 => DynamicImage::ImageLuma8(ImageBuffer::from_raw(w, h, px).ok_or_else(bad)?),
        F::RGB24 => DynamicImage::ImageRgb8(ImageBuffer::from_raw(w, h, px).ok_or_else(bad)?),
        F::L16 => {
            let v = px
                .chunks_exact(2)
                .map(|p| u16::from_be_bytes([p[0], p[1]]))
                .collect();
            DynamicImage::ImageLuma16(ImageBuffer::from_raw(w, h, v).ok_or_else(bad)?)
        }
        F::CMYK32 => {
            return Err(Reject::new(
                "a CMYK JPEG with one scan per component is not supported",
            ))
        }
    })
}

/// Enough of a file for any ordinary header (JPEG's APP segments with EXIF thumbnails and ICC
/// profiles included): probing 100k photos should not read 100k whole photos. A header that does
/// not fit is read from the whole file.
const PROBE_PREFIX: u64 = 256 << 10;

/// Colour type and size from the image's header (the decoder is made, no pixel is decoded).
pub fn probe(path: &Path) -> Result<Probe, Reject> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| Reject::new(e.to_string()))?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(u64::MAX);
    if len == 0 {
        return Err(Reject::new("empty file (0 bytes)"));
    }
    let mut head = Vec::new();
    f.take(PROBE_PREFIX)
        .read_to_end(&mut head)
        .map_err(|e| Reject::new(e.to_string()))?;
    match probe_reader(path, std::io::Cursor::new(head)) {
        Err(_) if len > PROBE_PREFIX => {
            let f = std::fs::File::open(path).map_err(|e| Reject::new(e.to_string()))?;
            probe_reader(path, BufReader::new(f))
        }
        r => r,
    }
}

fn probe_reader<R: std::io::BufRead + std::io::Seek>(path: &Path, r: R) -> Result<Probe, Reject> {
    let mut r = ImageReader::new(r);
    // As `ImageReader::open` does: the extension, unless the contents say otherwise.
    if let Ok(f) = image::ImageFormat::from_path(path) {
        r.set_format(f);
    }
    let mut r = r
        .with_guessed_format()
        .map_err(|e| Reject::new(e.to_string()))?;
    if r.format().is_none() {
        return Err(Reject::new("not an image (unrecognised contents)"));
    }
    r.limits(limits());
    let d = r
        .into_decoder()
        .map_err(|e| Reject::new(format!("cannot read the header: {e}")))?;
    let (w, h) = d.dimensions();
    Ok(Probe {
        colour: d.color_type().has_color(),
        size: Some((h, w)),
        channels: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{GrayImage, Luma, Rgb, RgbImage};

    fn crc32(bytes: &[u8]) -> u32 {
        let mut c = !0u32;
        for &b in bytes {
            c ^= b as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
        }
        !c
    }

    #[test]
    fn a_jpeg_with_one_scan_per_component_keeps_its_colours() {
        // jpeg-encoder writes one scan per component with optimised Huffman tables.
        let (w, h) = (40usize, 24usize);
        let rgb: Vec<u8> = (0..w * h)
            .flat_map(|k| {
                let (x, y) = ((k % w) as u8, (k / w) as u8);
                [x * 2 + y, x * 2 + y + 40, x * 2 + y + 80]
            })
            .collect();
        for q in [95, 75] {
            let mut jpg = Vec::new();
            let mut e = jpeg_encoder::Encoder::new(&mut jpg, q);
            e.set_optimized_huffman_tables(true);
            e.encode(&rgb, w as u16, h as u16, jpeg_encoder::ColorType::Rgb)
                .unwrap();
            assert!(non_interleaved(&jpg), "quality {q}: one scan per component");
            let t = tempfile::tempdir().unwrap();
            let p = t.path().join("a.jpg");
            std::fs::write(&p, &jpg).unwrap();
            decode(&p, &mut |frame| {
                let got = frame.expect_image().into_rgb8().into_raw();
                let err = got
                    .iter()
                    .zip(&rgb)
                    .map(|(&a, &b)| (a as f64 - b as f64).abs())
                    .sum::<f64>()
                    / rgb.len() as f64;
                assert!(err < 3.0, "quality {q}: mean error {err}");
                Ok(())
            })
            .unwrap();
            // An ordinary (interleaved) JPEG keeps the usual decoder.
            let mut jpg = Vec::new();
            jpeg_encoder::Encoder::new(&mut jpg, q)
                .encode(&rgb, w as u16, h as u16, jpeg_encoder::ColorType::Rgb)
                .unwrap();
            assert!(!non_interleaved(&jpg));
        }
        assert!(!non_interleaved(&[0xFF, 0xD8, 0xFF]));
        assert!(!non_interleaved(&[]));
    }

    #[test]
    fn probe_reads_headers_even_past_the_prefix() {
        let t = tempfile::tempdir().unwrap();
        let grey = t.path().join("g.jpg");
        GrayImage::from_pixel(9, 4, Luma([3])).save(&grey).unwrap();
        assert_eq!(
            probe(&grey).unwrap(),
            Probe {
                colour: false,
                size: Some((4, 9)),
                channels: None,
            }
        );
        // An RGB PNG with a private ancillary chunk larger than the prefix before its pixels.
        let mut png = Vec::new();
        RgbImage::from_pixel(7, 5, Rgb([1, 2, 3]))
            .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
            .unwrap();
        let data = vec![b'x'; PROBE_PREFIX as usize + 1000];
        let mut chunk = (data.len() as u32).to_be_bytes().to_vec();
        let body = [&b"prVt"[..], &data].concat();
        chunk.extend_from_slice(&body);
        chunk.extend_from_slice(&crc32(&body).to_be_bytes());
        let after_ihdr = 8 + 25;
        png.splice(after_ihdr..after_ihdr, chunk);
        let p = t.path().join("big-header.png");
        std::fs::write(&p, &png).unwrap();
        let mut n = 0;
        decode(&p, &mut |frame| {
            let img = frame.expect_image();
            assert_eq!((img.width(), img.height()), (7, 5));
            n += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(n, 1, "the test file itself decodes");
        assert_eq!(
            probe(&p).unwrap(),
            Probe {
                colour: true,
                size: Some((5, 7)),
                channels: None,
            }
        );
        let bad = t.path().join("bad.png");
        std::fs::write(&bad, b"not a png").unwrap();
        assert!(probe(&bad).is_err());
    }
}
