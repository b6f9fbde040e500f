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
    let img = r
        .decode()
        .map_err(|e| Reject::new(format!("cannot decode: {e}")))?;
    emit(img.into())
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
