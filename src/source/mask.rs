//! Mask images as class indices: one integer per pixel, never a colour and never interpolated.
//!
//! Rules, by what the file holds:
//! - palette (indexed) PNG: the palette indices, whatever the colours (the `image` crate would
//!   expand them to colours, so PNGs are read with the `png` crate, untransformed);
//! - grey PNG: its values as stored: 1, 2, 4 or 8 bits as u8 (a 1-bit mask is 0/1, not 0/255),
//!   16 bits as u16;
//! - grey BMP, GIF, JPEG, WebP: what the `image` crate decodes, 8 or 16 bits;
//! - TIFF: every page, through `super::tiff` (a stack of masks for a stack of images); pages of
//!   unsigned 8/16-bit pixels as they are, value pages (signed or 32-bit integers, floats) when
//!   every value is an integer in 0..=65535;
//! - colour (RGB) pixels are read as grey only where every pixel has R = G = B (a grey mask
//!   saved as RGB); a colour map is not read: such a mask is refused, naming a colour pixel.
//!   Alpha is ignored everywhere: a transparent pixel keeps its value.

use super::images::{MAX_ALLOC, MAX_SIDE};
use super::{DecodeOptions, Frame, Reject};
use image::DynamicImage;
use std::io::BufReader;
use std::path::Path;

/// One mask frame: `width` x `height` values, row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaskFrame {
    pub width: u32,
    pub height: u32,
    pub values: MaskValues,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MaskValues {
    U8(Vec<u8>),
    U16(Vec<u16>),
}

impl MaskValues {
    /// The largest value (0 for none).
    pub fn max(&self) -> u16 {
        match self {
            MaskValues::U8(v) => v.iter().copied().max().unwrap_or(0) as u16,
            MaskValues::U16(v) => v.iter().copied().max().unwrap_or(0),
        }
    }
}

fn is_png(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"))
}

fn is_tiff(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("tif") || e.eq_ignore_ascii_case("tiff"))
}

/// Whether the mask's values may need 16 bits, from its header alone (a 16-bit grey PNG, a TIFF
/// of more than 8 bits a sample). A header that cannot be read says no: decoding rejects it.
pub fn wide(path: &Path) -> bool {
    // A decoder may panic on hostile bytes: such a header says no too.
    std::panic::catch_unwind(|| header_wide(path)).unwrap_or(false)
}

fn header_wide(path: &Path) -> bool {
    if is_png(path) {
        let Ok(f) = super::open_input(path) else {
            return false;
        };
        let mut d = png::Decoder::new(BufReader::new(f));
        return d
            .read_header_info()
            .is_ok_and(|i| i.bit_depth == png::BitDepth::Sixteen);
    }
    if is_tiff(path) {
        let Ok(f) = super::open_input(path) else {
            return false;
        };
        let Ok(mut d) = ::tiff::decoder::Decoder::new(BufReader::new(f)) else {
            return false;
        };
        use ::tiff::ColorType as C;
        return matches!(
            d.colortype(),
            Ok(C::Gray(b) | C::GrayA(b) | C::RGB(b) | C::RGBA(b)) if b > 8
        );
    }
    let Ok(r) = image::ImageReader::open(path).and_then(|r| r.with_guessed_format()) else {
        return false;
    };
    use image::ImageDecoder;
    r.into_decoder()
        .is_ok_and(|d| d.color_type().bytes_per_pixel() / d.color_type().channel_count() >= 2)
}

/// Every frame of the mask at `path` (one, except TIFF stacks), as class indices.
pub fn read(path: &Path) -> Result<Vec<MaskFrame>, Reject> {
    let len = std::fs::metadata(path)
        .map_err(|e| Reject::new(e.to_string()))?
        .len();
    if len == 0 {
        return Err(Reject::new("empty file (0 bytes)"));
    }
    if is_png(path) {
        return read_png(path).map(|f| vec![f]);
    }
    let mut frames = Vec::new();
    let mut each = |frame: Frame| -> Result<(), Reject> {
        let i = frames.len();
        let f = match frame {
            Frame::Image(img) => from_image(img),
            Frame::Float(f) | Frame::Windowed(f) => {
                from_values(f.width, f.height, f.channels, &f.data)
            }
        }
        .map_err(|why| {
            Reject::new(if i == 0 {
                why
            } else {
                format!("page {i}: {why}")
            })
        })?;
        frames.push(f);
        Ok(())
    };
    if is_tiff(path) {
        // Value pages come as values in their own units, unwindowed.
        let opts = DecodeOptions {
            float: true,
            ..Default::default()
        };
        super::tiff::decode(path, &opts, &mut each)?;
    } else {
        super::images::decode(path, &mut each)?;
    }
    Ok(frames)
}

/// A PNG's stored values: palette indices, grey values, or grey pixels of RGB(A).
fn read_png(path: &Path) -> Result<MaskFrame, Reject> {
    let f = super::open_input(path)?;
    let limits = png::Limits {
        bytes: MAX_ALLOC as usize,
    };
    let mut d = png::Decoder::new_with_limits(BufReader::new(f), limits);
    d.set_transformations(png::Transformations::IDENTITY);
    let bad = |e: png::DecodingError| Reject::new(format!("cannot decode: {e}"));
    let (w, h) = d.read_header_info().map_err(bad)?.size();
    if w > MAX_SIDE || h > MAX_SIDE {
        return Err(Reject::new(format!(
            "mask is {w}x{h}, beyond the {MAX_SIDE}-pixel side prep reads"
        )));
    }
    let mut r = d.read_info().map_err(bad)?;
    let size = r
        .output_buffer_size()
        .filter(|&n| n as u64 <= MAX_ALLOC)
        .ok_or_else(|| Reject::new("mask too large to decode"))?;
    let mut buf = vec![0u8; size];
    let out = r.next_frame(&mut buf).map_err(bad)?;
    let (ct, depth, line) = (out.color_type, out.bit_depth, out.line_size);
    let (wu, hu) = (w as usize, h as usize);
    let bits = depth as usize;
    use png::ColorType as C;
    let values = match (ct, bits) {
        (C::Indexed | C::Grayscale, 1 | 2 | 4 | 8) => {
            MaskValues::U8(unpack(&buf, line, wu, hu, bits, 1))
        }
        (C::Grayscale, _) => MaskValues::U16(be16(&buf, line, wu, hu, 1, 0)),
        (C::GrayscaleAlpha, 8) => MaskValues::U8(unpack(&buf, line, wu, hu, 8, 2)),
        (C::GrayscaleAlpha, _) => MaskValues::U16(be16(&buf, line, wu, hu, 2, 0)),
        (C::Rgb | C::Rgba, _) => {
            let c = if ct == C::Rgb { 3 } else { 4 };
            let (r, g, b) = if bits == 8 {
                let ch = |k: usize| -> Vec<u16> {
                    let buf = &buf[k..];
                    unpack(buf, line, wu, hu, 8, c)
                        .into_iter()
                        .map(u16::from)
                        .collect()
                };
                (ch(0), ch(1), ch(2))
            } else {
                (
                    be16(&buf, line, wu, hu, c, 0),
                    be16(&buf, line, wu, hu, c, 1),
                    be16(&buf, line, wu, hu, c, 2),
                )
            };
            grey_of_colour(wu, &r, &g, &b)?;
            if bits == 8 {
                MaskValues::U8(r.into_iter().map(|v| v as u8).collect())
            } else {
                MaskValues::U16(r)
            }
        }
        (ct, bits) => {
            return Err(Reject::new(format!(
                "mask of {ct:?} at {bits} bits is not a layout prep reads"
            )))
        }
    };
    Ok(MaskFrame {
        width: w,
        height: h,
        values,
    })
}

/// The first sample of every pixel of `bits` (1, 2, 4 or 8) with `c` samples a pixel, rows of
/// `line` bytes, most significant bits first (PNG's packing).
fn unpack(buf: &[u8], line: usize, w: usize, h: usize, bits: usize, c: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(w * h);
    for y in 0..h {
        let row = &buf[y * line..];
        if bits == 8 && c == 1 {
            // Grey and palette masks, the usual case: each row as it is.
            out.extend_from_slice(&row[..w]);
            continue;
        }
        if bits == 8 {
            out.extend(row.iter().step_by(c).take(w));
            continue;
        }
        let per = 8 / bits;
        let mask = (1u16 << bits) as u8 - 1;
        out.extend((0..w).map(|x| {
            let byte = row[x / per];
            let shift = 8 - bits * (x % per + 1);
            (byte >> shift) & mask
        }));
    }
    out
}

/// Sample `k` of every pixel of big-endian 16-bit samples, `c` a pixel.
fn be16(buf: &[u8], line: usize, w: usize, h: usize, c: usize, k: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(w * h);
    for y in 0..h {
        let row = &buf[y * line..];
        out.extend((0..w).map(|x| {
            let i = 2 * (x * c + k);
            u16::from_be_bytes([row[i], row[i + 1]])
        }));
    }
    out
}

/// Colour planes of a mask are grey only where R = G = B everywhere; else the first pixel that is
/// not says why the mask is refused.
fn grey_of_colour(w: usize, r: &[u16], g: &[u16], b: &[u16]) -> Result<(), Reject> {
    match (0..r.len()).find(|&i| r[i] != g[i] || r[i] != b[i]) {
        None => Ok(()),
        Some(i) => Err(Reject::new(format!(
            "mask is colour: pixel ({}, {}, {}) at row {}, column {} is not grey; a colour map is not read: save masks as palette (indexed) or grey images of class indices",
            r[i],
            g[i],
            b[i],
            i / w.max(1),
            i % w.max(1)
        ))),
    }
}

/// A decoded image as indices (grey values; colour by the grey rule; alpha ignored).
fn from_image(img: DynamicImage) -> Result<MaskFrame, String> {
    let (width, height) = (img.width(), img.height());
    let w = width as usize;
    let colour = |r: Vec<u16>, g: Vec<u16>, b: Vec<u16>| {
        grey_of_colour(w, &r, &g, &b).map_err(|e| e.0)?;
        Ok::<_, String>(r)
    };
    let values = match img {
        DynamicImage::ImageLuma8(b) => MaskValues::U8(b.into_raw()),
        DynamicImage::ImageLumaA8(b) => MaskValues::U8(b.pixels().map(|p| p.0[0]).collect()),
        DynamicImage::ImageLuma16(b) => MaskValues::U16(b.into_raw()),
        DynamicImage::ImageLumaA16(b) => MaskValues::U16(b.pixels().map(|p| p.0[0]).collect()),
        DynamicImage::ImageRgb8(_) | DynamicImage::ImageRgba8(_) => {
            let b = img.into_rgb8();
            let ch = |k: usize| b.pixels().map(|p| p.0[k] as u16).collect::<Vec<_>>();
            let r = colour(ch(0), ch(1), ch(2))?;
            MaskValues::U8(r.into_iter().map(|v| v as u8).collect())
        }
        DynamicImage::ImageRgb16(_) | DynamicImage::ImageRgba16(_) => {
            let b = img.into_rgb16();
            let ch = |k: usize| b.pixels().map(|p| p.0[k]).collect::<Vec<_>>();
            MaskValues::U16(colour(ch(0), ch(1), ch(2))?)
        }
        other => {
            return Err(format!(
                "mask of {:?} pixels: masks hold integers (grey or palette)",
                other.color()
            ))
        }
    };
    Ok(MaskFrame {
        width,
        height,
        values,
    })
}

/// Float values (a TIFF value page) as indices: every one an integer in 0..=65535.
fn from_values(
    width: u32,
    height: u32,
    channels: usize,
    data: &[f32],
) -> Result<MaskFrame, String> {
    if channels != 1 {
        return Err(format!(
            "mask of {channels} channels of values: masks hold one integer a pixel"
        ));
    }
    if let Some(i) = data
        .iter()
        .position(|&v| !((0.0..=65535.0).contains(&v) && v.fract() == 0.0))
    {
        let w = width.max(1) as usize;
        return Err(format!(
            "mask value {} at row {}, column {} is not an integer in 0..=65535",
            data[i],
            i / w,
            i % w
        ));
    }
    Ok(MaskFrame {
        width,
        height,
        values: MaskValues::U16(data.iter().map(|&v| v as u16).collect()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_png(
        path: &Path,
        w: u32,
        h: u32,
        ct: png::ColorType,
        depth: png::BitDepth,
        palette: Option<Vec<u8>>,
        data: &[u8],
    ) {
        let f = std::fs::File::create(path).unwrap();
        let mut e = png::Encoder::new(std::io::BufWriter::new(f), w, h);
        e.set_color(ct);
        e.set_depth(depth);
        if let Some(p) = palette {
            e.set_palette(p);
        }
        let mut wr = e.write_header().unwrap();
        wr.write_image_data(data).unwrap();
    }

    #[test]
    fn palette_pngs_give_indices_not_colours() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("m.png");
        // 3x2 at 8 bits: indices 0..=2 of a colour palette.
        let pal = vec![0, 0, 0, 255, 0, 0, 0, 255, 0];
        write_png(
            &p,
            3,
            2,
            png::ColorType::Indexed,
            png::BitDepth::Eight,
            Some(pal.clone()),
            &[0, 1, 2, 2, 1, 0],
        );
        let f = read(&p).unwrap();
        assert_eq!(f[0].values, MaskValues::U8(vec![0, 1, 2, 2, 1, 0]));
        assert!(!wide(&p));
        // 2 bits a pixel, 5 wide: packed MSB first with a padded row.
        write_png(
            &p,
            5,
            1,
            png::ColorType::Indexed,
            png::BitDepth::Two,
            Some(pal),
            &[0b00_01_10_01, 0b10_000000],
        );
        assert_eq!(
            read(&p).unwrap()[0].values,
            MaskValues::U8(vec![0, 1, 2, 1, 2])
        );
    }

    #[test]
    fn grey_depths_and_colour_rules() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("m.png");
        write_png(
            &p,
            3,
            1,
            png::ColorType::Grayscale,
            png::BitDepth::One,
            None,
            &[0b101_00000],
        );
        assert_eq!(read(&p).unwrap()[0].values, MaskValues::U8(vec![1, 0, 1]));
        let v16: Vec<u8> = [0u16, 300, 65535]
            .iter()
            .flat_map(|v| v.to_be_bytes())
            .collect();
        write_png(
            &p,
            3,
            1,
            png::ColorType::Grayscale,
            png::BitDepth::Sixteen,
            None,
            &v16,
        );
        assert!(wide(&p));
        let f = read(&p).unwrap();
        assert_eq!(f[0].values, MaskValues::U16(vec![0, 300, 65535]));
        assert_eq!(f[0].values.max(), 65535);
        // Grey saved as RGBA: read as grey, alpha ignored.
        write_png(
            &p,
            2,
            1,
            png::ColorType::Rgba,
            png::BitDepth::Eight,
            None,
            &[3, 3, 3, 0, 7, 7, 7, 255],
        );
        assert_eq!(read(&p).unwrap()[0].values, MaskValues::U8(vec![3, 7]));
        write_png(
            &p,
            2,
            1,
            png::ColorType::Rgb,
            png::BitDepth::Eight,
            None,
            &[3, 3, 3, 255, 0, 0],
        );
        let e = read(&p).unwrap_err().0;
        assert!(
            e.contains("mask is colour: pixel (255, 0, 0) at row 0, column 1"),
            "{e}"
        );
        // Other formats through the image crate: a BMP of grey RGB, a colour one refused.
        let bmp = t.path().join("m.bmp");
        image::RgbImage::from_fn(2, 2, |x, y| image::Rgb([(x + 2 * y) as u8; 3]))
            .save(&bmp)
            .unwrap();
        assert_eq!(
            read(&bmp).unwrap()[0].values,
            MaskValues::U8(vec![0, 1, 2, 3])
        );
        image::RgbImage::from_pixel(2, 2, image::Rgb([1, 2, 3]))
            .save(&bmp)
            .unwrap();
        assert!(read(&bmp).unwrap_err().0.contains("not grey"));
        std::fs::write(&p, b"").unwrap();
        assert!(read(&p).unwrap_err().0.contains("empty"));
        std::fs::write(&p, b"\x89PNG\r\n\x1a\nrubbish").unwrap();
        assert!(read(&p).unwrap_err().0.contains("cannot decode"));
    }

    #[test]
    fn float_values_must_be_small_integers() {
        assert_eq!(
            from_values(2, 1, 1, &[0.0, 7.0]).unwrap().values,
            MaskValues::U16(vec![0, 7])
        );
        for bad in [-1.0, 0.5, 70000.0, f32::NAN] {
            let e = from_values(2, 1, 1, &[0.0, bad]).unwrap_err();
            assert!(e.contains("row 0, column 1"), "{e}");
        }
    }
}
