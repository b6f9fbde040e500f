//! From any decoded image to a sample of the target shape: channel conversion, resize with the
//! chosen fit, bit depth, and the planar C x H x W layout samples have on disk.

use crate::shard::Dtype;
use image::imageops::{self, FilterType};
use image::{DynamicImage, GenericImageView, ImageBuffer, Luma, Pixel, Rgb};

/// How an image of another aspect ratio is brought to the target size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Fit {
    /// Scale to cover the target, then cut the centre (keeps proportions, may lose borders).
    Crop,
    /// Scale each axis independently (keeps everything, distorts proportions).
    Stretch,
    /// Scale to fit inside the target, then pad with black (keeps everything and proportions).
    Pad,
}

/// What every sample becomes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Target {
    pub channels: u8,
    pub height: u32,
    pub width: u32,
    pub dtype: Dtype,
    pub fit: Fit,
}

impl Target {
    pub fn sample_bytes(&self) -> usize {
        self.channels as usize * self.height as usize * self.width as usize * self.dtype.size()
    }
}

/// Convert `img` to the target and append its planar bytes to `out`.
pub fn to_sample(img: DynamicImage, t: &Target, out: &mut Vec<u8>) {
    match (t.channels, t.dtype) {
        (1, Dtype::U8) => planar(&fit(img.into_luma8(), t), out),
        (1, Dtype::U16) => planar(&fit(img.into_luma16(), t), out),
        (_, Dtype::U8) => planar(&fit(img.into_rgb8(), t), out),
        (_, Dtype::U16) => planar(&fit(img.into_rgb16(), t), out),
    }
}

trait Sub: image::Primitive + 'static {
    fn le(self, out: &mut Vec<u8>);
}
impl Sub for u8 {
    fn le(self, out: &mut Vec<u8>) {
        out.push(self)
    }
}
impl Sub for u16 {
    fn le(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes())
    }
}

/// Interleaved H x W x C to planar C x H x W, little-endian.
fn planar<P: Pixel + 'static>(img: &ImageBuffer<P, Vec<P::Subpixel>>, out: &mut Vec<u8>)
where
    P::Subpixel: Sub,
{
    let c = P::CHANNEL_COUNT as usize;
    let raw = img.as_raw();
    for ch in 0..c {
        for px in raw.chunks_exact(c) {
            px[ch].le(out);
        }
    }
}

fn fit<P>(img: ImageBuffer<P, Vec<P::Subpixel>>, t: &Target) -> ImageBuffer<P, Vec<P::Subpixel>>
where
    P: Pixel + 'static,
    P::Subpixel: Into<f32> + Sub,
    ImageBuffer<P, Vec<P::Subpixel>>: GenericImageView<Pixel = P>,
{
    let (w, h) = img.dimensions();
    let (tw, th) = (t.width, t.height);
    if (w, h) == (tw, th) {
        return img;
    }
    match t.fit {
        Fit::Stretch => resize(img, tw, th),
        Fit::Crop => {
            // Scale so both sides cover the target, then cut the centre.
            let s = (tw as f64 / w as f64).max(th as f64 / h as f64);
            let (sw, sh) = (
                ((w as f64 * s).round() as u32).max(tw),
                ((h as f64 * s).round() as u32).max(th),
            );
            let scaled = resize(img, sw, sh);
            imageops::crop_imm(&scaled, (sw - tw) / 2, (sh - th) / 2, tw, th).to_image()
        }
        Fit::Pad => {
            let s = (tw as f64 / w as f64).min(th as f64 / h as f64);
            let (sw, sh) = (
                ((w as f64 * s).round() as u32).clamp(1, tw),
                ((h as f64 * s).round() as u32).clamp(1, th),
            );
            let scaled = resize(img, sw, sh);
            let mut canvas = ImageBuffer::<P, Vec<P::Subpixel>>::new(tw, th);
            imageops::replace(
                &mut canvas,
                &scaled,
                ((tw - sw) / 2) as i64,
                ((th - sh) / 2) as i64,
            );
            canvas
        }
    }
}

/// Resize with a triangle filter. Large reductions first average whole k x k boxes (exact, and
/// far cheaper than a wide filter), leaving at most a 2x-4x step for the filter.
fn resize<P>(
    img: ImageBuffer<P, Vec<P::Subpixel>>,
    tw: u32,
    th: u32,
) -> ImageBuffer<P, Vec<P::Subpixel>>
where
    P: Pixel + 'static,
    P::Subpixel: Into<f32>,
{
    let (w, h) = img.dimensions();
    let k = (w / tw.max(1)).min(h / th.max(1)) / 2;
    let img = if k >= 2 { box_reduce(&img, k) } else { img };
    if img.dimensions() == (tw, th) {
        return img;
    }
    imageops::resize(&img, tw, th, FilterType::Triangle)
}

fn box_reduce<P>(img: &ImageBuffer<P, Vec<P::Subpixel>>, k: u32) -> ImageBuffer<P, Vec<P::Subpixel>>
where
    P: Pixel + 'static,
    P::Subpixel: Into<f32>,
{
    let (w, h) = img.dimensions();
    let (ow, oh) = (w / k, h / k);
    let c = P::CHANNEL_COUNT as usize;
    let raw = img.as_raw();
    let mut out = vec![0.0f32; ow as usize * oh as usize * c];
    for y in 0..(oh * k) as usize {
        let row = &raw[y * w as usize * c..];
        let orow = &mut out[(y / k as usize) * ow as usize * c..][..ow as usize * c];
        for ox in 0..ow as usize {
            let src = &row[ox * k as usize * c..(ox + 1) * k as usize * c];
            let dst = &mut orow[ox * c..(ox + 1) * c];
            for px in src.chunks_exact(c) {
                for (d, &s) in dst.iter_mut().zip(px) {
                    *d += s.into();
                }
            }
        }
    }
    let n = (k * k) as f32;
    let data: Vec<P::Subpixel> = out
        .into_iter()
        .map(|v| num_from_f32::<P::Subpixel>(v / n))
        .collect();
    ImageBuffer::from_raw(ow, oh, data).expect("sized above")
}

fn num_from_f32<S: image::Primitive>(v: f32) -> S {
    let max: f32 = S::DEFAULT_MAX_VALUE.to_f32().unwrap_or(255.0);
    S::from((v + 0.5).clamp(0.0, max)).unwrap_or(S::DEFAULT_MIN_VALUE)
}

/// Grey or colour, 8 or 16 bits: what an image naturally is (for picking defaults).
pub fn native(img: &DynamicImage) -> (u8, Dtype) {
    let c = img.color();
    let ch = if c.has_color() { 3 } else { 1 };
    let dt = if c.bytes_per_pixel() / c.channel_count() >= 2 {
        Dtype::U16
    } else {
        Dtype::U8
    };
    (ch, dt)
}

#[allow(dead_code)]
fn _assert_types(_: Luma<u8>, _: Rgb<u16>) {}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{GrayImage, RgbImage, RgbaImage};

    fn t(c: u8, h: u32, w: u32, dtype: Dtype, fit: Fit) -> Target {
        Target {
            channels: c,
            height: h,
            width: w,
            dtype,
            fit,
        }
    }

    #[test]
    fn planar_layout_and_channel_conversion() {
        let mut img = RgbImage::new(2, 1);
        img.put_pixel(0, 0, Rgb([1, 2, 3]));
        img.put_pixel(1, 0, Rgb([4, 5, 6]));
        let mut out = Vec::new();
        to_sample(
            DynamicImage::ImageRgb8(img.clone()),
            &t(3, 1, 2, Dtype::U8, Fit::Crop),
            &mut out,
        );
        assert_eq!(out, vec![1, 4, 2, 5, 3, 6]);
        out.clear();
        to_sample(
            DynamicImage::ImageRgb8(img),
            &t(3, 1, 2, Dtype::U16, Fit::Crop),
            &mut out,
        );
        assert_eq!(&out[..4], &[0x01, 0x01, 0x04, 0x04]); // 1 * 257, little-endian
        out.clear();
        let grey = GrayImage::from_pixel(3, 3, Luma([200]));
        to_sample(
            DynamicImage::ImageLuma8(grey),
            &t(3, 3, 3, Dtype::U8, Fit::Crop),
            &mut out,
        );
        assert!(out.iter().all(|&v| v == 200) && out.len() == 27);
        out.clear();
        let rgba = RgbaImage::from_pixel(4, 4, image::Rgba([10, 20, 30, 0]));
        to_sample(
            DynamicImage::ImageRgba8(rgba),
            &t(1, 4, 4, Dtype::U8, Fit::Crop),
            &mut out,
        );
        assert_eq!(out.len(), 16);
    }

    #[test]
    fn fits_keep_the_right_parts() {
        // 40x20: left half black, right half white. Crop to 10x10 keeps the middle (half/half),
        // pad keeps proportions with black bars, stretch keeps the halves.
        let img = GrayImage::from_fn(40, 20, |x, _| Luma([if x < 20 { 0 } else { 255 }]));
        let mut out = Vec::new();
        to_sample(
            DynamicImage::ImageLuma8(img.clone()),
            &t(1, 10, 10, Dtype::U8, Fit::Crop),
            &mut out,
        );
        assert!(out[0] < 20 && out[9] > 235, "{:?}", &out[..10]);
        out.clear();
        to_sample(
            DynamicImage::ImageLuma8(img.clone()),
            &t(1, 10, 10, Dtype::U8, Fit::Pad),
            &mut out,
        );
        assert_eq!(out[0], 0); // top bar
        assert!(out[5 * 10 + 9] > 200); // right half, middle row
        out.clear();
        to_sample(
            DynamicImage::ImageLuma8(img),
            &t(1, 8, 8, Dtype::U8, Fit::Stretch),
            &mut out,
        );
        assert!(out[0] < 20 && out[7] > 235);
    }

    #[test]
    fn big_reductions_average() {
        let img = GrayImage::from_fn(512, 512, |x, y| Luma([((x + y) % 2 * 255) as u8]));
        let mut out = Vec::new();
        to_sample(
            DynamicImage::ImageLuma8(img),
            &t(1, 32, 32, Dtype::U8, Fit::Crop),
            &mut out,
        );
        assert!(
            out.iter().all(|&v| (120..=135).contains(&v)),
            "{:?}",
            &out[..8]
        );
    }
}
