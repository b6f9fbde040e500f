//! Still images through the `image` crate (PNG, JPEG, BMP, GIF, WebP, single-page TIFF), and TIFF
//! stacks page by page through the `tiff` crate. Sizes are capped before any pixel is allocated.

use super::{Emit, Reject};
use image::{DynamicImage, ImageBuffer, ImageReader, Limits};
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

/// Every page of a TIFF file, in order.
pub fn decode_tiff(path: &Path, emit: &mut Emit) -> Result<(), Reject> {
    use tiff::decoder::{Decoder, DecodingResult};
    use tiff::ColorType;
    let f = std::fs::File::open(path).map_err(|e| Reject::new(e.to_string()))?;
    if f.metadata().map(|m| m.len()).unwrap_or(0) == 0 {
        return Err(Reject::new("empty file (0 bytes)"));
    }
    let mut lim = tiff::decoder::Limits::default();
    lim.decoding_buffer_size = MAX_ALLOC as usize;
    lim.intermediate_buffer_size = MAX_ALLOC as usize;
    let mut d = Decoder::new(BufReader::new(f))
        .map_err(|e| Reject::new(format!("not a TIFF: {e}")))?
        .with_limits(lim);
    let mut page = 0;
    loop {
        let (w, h) = d
            .dimensions()
            .map_err(|e| Reject::new(format!("page {page}: {e}")))?;
        if w == 0 || h == 0 || w > MAX_SIDE || h > MAX_SIDE {
            return Err(Reject::new(format!("page {page}: absurd size {w}x{h}")));
        }
        let color = d
            .colortype()
            .map_err(|e| Reject::new(format!("page {page}: {e}")))?;
        let data = d
            .read_image()
            .map_err(|e| Reject::new(format!("page {page}: cannot decode: {e}")))?;
        let bad = || Reject::new(format!("page {page}: {color:?} pixels do not fill {w}x{h}"));
        let img = match (color, data) {
            (ColorType::Gray(8), DecodingResult::U8(v)) => {
                DynamicImage::ImageLuma8(ImageBuffer::from_raw(w, h, v).ok_or_else(bad)?)
            }
            (ColorType::Gray(16), DecodingResult::U16(v)) => {
                DynamicImage::ImageLuma16(ImageBuffer::from_raw(w, h, v).ok_or_else(bad)?)
            }
            (ColorType::GrayA(8), DecodingResult::U8(v)) => {
                DynamicImage::ImageLumaA8(ImageBuffer::from_raw(w, h, v).ok_or_else(bad)?)
            }
            (ColorType::GrayA(16), DecodingResult::U16(v)) => {
                DynamicImage::ImageLumaA16(ImageBuffer::from_raw(w, h, v).ok_or_else(bad)?)
            }
            (ColorType::RGB(8), DecodingResult::U8(v)) => {
                DynamicImage::ImageRgb8(ImageBuffer::from_raw(w, h, v).ok_or_else(bad)?)
            }
            (ColorType::RGB(16), DecodingResult::U16(v)) => {
                DynamicImage::ImageRgb16(ImageBuffer::from_raw(w, h, v).ok_or_else(bad)?)
            }
            (ColorType::RGBA(8), DecodingResult::U8(v)) => {
                DynamicImage::ImageRgba8(ImageBuffer::from_raw(w, h, v).ok_or_else(bad)?)
            }
            (ColorType::RGBA(16), DecodingResult::U16(v)) => {
                DynamicImage::ImageRgba16(ImageBuffer::from_raw(w, h, v).ok_or_else(bad)?)
            }
            (c, _) => {
                return Err(Reject::new(format!(
                    "page {page}: unsupported TIFF pixel type {c:?}"
                )))
            }
        };
        emit(img.into())?;
        page += 1;
        if !d.more_images() {
            return Ok(());
        }
        d.next_image()
            .map_err(|e| Reject::new(format!("page {page}: {e}")))?;
    }
}
