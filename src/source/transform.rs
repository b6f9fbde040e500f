//! From any decoded frame to a sample of the target shape: channel conversion, resize with the
//! chosen fit, bit depth or float type, and the planar C x H x W layout samples have on disk.
//!
//! Float targets (f16/f32) keep values as they are: an image's integer values, a float frame's
//! values in its own units. Only a resize changes them (interpolation); f16 rounds to nearest.

use super::{FloatFrame, Frame, Reject};
use crate::format::shard::Dtype;
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

/// Convert `frame` to the target and append its planar bytes to `out`. Fails (appending nothing)
/// on a float value that is NaN or infinite, or beyond f16's range for an f16 target: float
/// samples must be finite.
pub fn to_sample(frame: Frame, t: &Target, out: &mut Vec<u8>) -> Result<(), Reject> {
    let img = match (frame, t.dtype) {
        (Frame::Image(img), Dtype::U8 | Dtype::U16) => img,
        (Frame::Windowed(f), Dtype::U8 | Dtype::U16) => return windowed_sample(f, t, out),
        (Frame::Float(_), Dtype::U8) => {
            return Err(Reject::new(
                "float values need a float target (--dtype f32 or f16)",
            ))
        }
        (frame, _) => return float_sample(frame, t, out),
    };
    match (t.channels, t.dtype) {
        (1, Dtype::U8) => planar(&fit(img.into_luma8(), t), out),
        (1, _) => planar(&fit(img.into_luma16(), t), out),
        (_, Dtype::U8) => planar(&fit(img.into_rgb8(), t), out),
        (_, _) => planar(&fit(img.into_rgb16(), t), out),
    }
    Ok(())
}

/// The sRGB luma weights (Rec. 709) the `image` crate uses for colour to grey.
const LUMA: [f64; 3] = [0.2126, 0.7152, 0.0722];

fn float_sample(frame: Frame, t: &Target, out: &mut Vec<u8>) -> Result<(), Reject> {
    let f = match frame {
        Frame::Float(f) | Frame::Windowed(f) => f,
        Frame::Image(img) => image_values(img),
    };
    let (w, h) = (f.width as usize, f.height as usize);
    let plane = w * h;
    if f.channels == 0 || f.data.len() != f.channels * plane {
        return Err(Reject::new(format!(
            "internal: {} float values for {} x {h} x {w}",
            f.data.len(),
            f.channels
        )));
    }
    if let Some(i) = f.data.iter().position(|v| !v.is_finite()) {
        return Err(Reject::new(format!(
            "value {} at channel {}, row {}, column {}: float samples must be finite",
            f.data[i],
            i / plane,
            i % plane / w,
            i % w
        )));
    }
    if t.dtype == Dtype::U16 {
        whole_values(&f.data, plane, w)?;
    }
    let planes: Vec<&[f32]> = f.data.chunks_exact(plane).collect();
    let mixed: Vec<Vec<f32>>;
    let chosen: Vec<&[f32]> = match (t.channels, planes.len()) {
        // Every plane: a multi-channel volume's modalities.
        (c, n) if c as usize == n => planes,
        (c, n) if n != 1 && n != 3 && c as usize != n => {
            return Err(Reject::new(format!(
                "{n} channels, the target {c}: each sample keeps all of a volume's channels (leave out --channels)"
            )))
        }
        (1, n) if n >= 3 => {
            mixed = vec![(0..plane)
                .map(|p| {
                    (LUMA[0] * planes[0][p] as f64
                        + LUMA[1] * planes[1][p] as f64
                        + LUMA[2] * planes[2][p] as f64) as f32
                })
                .collect()];
            vec![&mixed[0]]
        }
        (1, _) => vec![planes[0]],
        (_, n) if n >= 3 => planes[..3].to_vec(),
        // Grey to colour: the plane three times.
        (_, _) => vec![planes[0]; 3],
    };
    let start = out.len();
    for p in chosen {
        for v in fit_float(p, f.width, f.height, t) {
            match t.dtype {
                Dtype::F16 => {
                    let hv = half::f16::from_f32(v);
                    if hv.is_infinite() {
                        out.truncate(start);
                        return Err(Reject::new(format!(
                            "value {v} is beyond f16's range (±65504): use --dtype f32"
                        )));
                    }
                    out.extend_from_slice(&hv.to_le_bytes());
                }
                // Whole values (checked above; a resize may blend two), shifted into u16.
                Dtype::U16 => {
                    let u = (v.round() + U16_OFFSET).clamp(0.0, 65535.0) as u16;
                    out.extend_from_slice(&u.to_le_bytes())
                }
                _ => out.extend_from_slice(&v.to_le_bytes()),
            }
        }
    }
    Ok(())
}

/// Planes windowed onto 0..=65535 into a u8 or u16 sample of as many channels (u8: the nearest
/// of 256 levels, as a 16-bit image's conversion gives).
fn windowed_sample(f: FloatFrame, t: &Target, out: &mut Vec<u8>) -> Result<(), Reject> {
    let plane = f.width as usize * f.height as usize;
    if f.channels != t.channels as usize {
        return Err(Reject::new(format!(
            "{} channels, the target {}: each sample keeps all of a volume's channels (leave out --channels)",
            f.channels, t.channels
        )));
    }
    for p in f.data.chunks_exact(plane.max(1)) {
        for v in fit_float(p, f.width, f.height, t) {
            match t.dtype {
                Dtype::U8 => out.push((v / 257.0).round().clamp(0.0, 255.0) as u8),
                _ => out.extend((v.round().clamp(0.0, 65535.0) as u16).to_le_bytes()),
            }
        }
    }
    Ok(())
}

/// u16 samples of modality values (scans without a window) hold value + `U16_OFFSET`: every
/// whole value from -32768 to 32767 (CT's Hounsfield units, MR's signal) kept exactly.
pub const U16_OFFSET: f32 = 32768.0;

/// Values for a u16 target must be whole numbers within -32768..=32767: the first that is not.
fn whole_values(v: &[f32], plane: usize, w: usize) -> Result<(), Reject> {
    let bad = |x: f32| x.fract() != 0.0 || !(-U16_OFFSET..U16_OFFSET).contains(&x);
    match v.iter().position(|&x| bad(x)) {
        None => Ok(()),
        Some(i) => Err(Reject::new(format!(
            "value {} at channel {}, row {}, column {}: --dtype u16 keeps whole modality values from -32768 to 32767 (stored + 32768); use --dtype f32, or --window LOW:HIGH to window into u16",
            v[i],
            i / plane,
            i % plane / w,
            i % w
        ))),
    }
}

/// An image's integer values (8 or 16 bits; float images as they are) as planar float32: grey
/// images one plane, colour ones three (alpha dropped).
fn image_values(img: DynamicImage) -> FloatFrame {
    let (w, h) = (img.width(), img.height());
    let colour = img.color().has_color();
    let bits = img.color().bytes_per_pixel() / img.color().channel_count() * 8;
    let inter: Vec<f32> = match (colour, bits) {
        (_, 32) => img.into_rgb32f().into_raw(),
        (true, 16) => img
            .into_rgb16()
            .into_raw()
            .into_iter()
            .map(f32::from)
            .collect(),
        (false, 16) => img
            .into_luma16()
            .into_raw()
            .into_iter()
            .map(f32::from)
            .collect(),
        (true, _) => img
            .into_rgb8()
            .into_raw()
            .into_iter()
            .map(f32::from)
            .collect(),
        (false, _) => img
            .into_luma8()
            .into_raw()
            .into_iter()
            .map(f32::from)
            .collect(),
    };
    let c = inter.len() / (w as usize * h as usize).max(1);
    let data = (0..c)
        .flat_map(|ch| inter.iter().skip(ch).step_by(c.max(1)).copied())
        .collect();
    FloatFrame {
        channels: c,
        height: h,
        width: w,
        data,
    }
}

/// One plane of `w` x `h` values brought to the target size with the target's fit. The image
/// crate's resampling clamps float pixels to [0, 1], so the plane is mapped onto [0, 1] by its
/// own min..max around the resize (the triangle filter's weights are positive: results stay in
/// range) and back. A plane already of the target size is returned exactly. `Fit::Pad` pads with
/// the plane's minimum, its darkest value.
fn fit_float(p: &[f32], w: u32, h: u32, t: &Target) -> Vec<f32> {
    if (w, h) == (t.width, t.height) {
        return p.to_vec();
    }
    let lo = p.iter().copied().fold(f32::INFINITY, f32::min) as f64;
    let hi = p.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let span = if hi > lo { hi - lo } else { 1.0 };
    let unit: Vec<f32> = p.iter().map(|&v| ((v as f64 - lo) / span) as f32).collect();
    let img = ImageBuffer::<Luma<f32>, Vec<f32>>::from_raw(w, h, unit).expect("w * h values");
    fit(img, t)
        .into_raw()
        .into_iter()
        .map(|v| (lo + v as f64 * span) as f32)
        .collect()
}

trait Sub: image::Primitive + 'static {
    fn le(self, out: &mut Vec<u8>);
    /// The value nearest `v` (a mean of values of this type).
    fn from_mean(v: f32) -> Self;
    /// `c` interleaved channels to planes, appended little-endian.
    fn planes(raw: &[Self], c: usize, out: &mut Vec<u8>) {
        for ch in 0..c {
            for px in raw.chunks_exact(c) {
                px[ch].le(out);
            }
        }
    }
}
impl Sub for u8 {
    fn le(self, out: &mut Vec<u8>) {
        out.push(self)
    }
    // Photos' hot path: one pass, each plane written by index.
    fn planes(raw: &[u8], c: usize, out: &mut Vec<u8>) {
        let (start, n) = (out.len(), raw.len() / c.max(1));
        out.resize(start + n * c, 0);
        let o = &mut out[start..];
        for (k, px) in raw.chunks_exact(c).enumerate() {
            for (ch, &v) in px.iter().enumerate() {
                o[ch * n + k] = v;
            }
        }
    }
    fn from_mean(v: f32) -> Self {
        num_from_f32(v)
    }
}
impl Sub for u16 {
    fn le(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes())
    }
    fn from_mean(v: f32) -> Self {
        num_from_f32(v)
    }
}
impl Sub for f32 {
    fn le(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes())
    }
    fn from_mean(v: f32) -> Self {
        v
    }
}

/// Interleaved H x W x C to planar C x H x W, little-endian.
fn planar<P: Pixel + 'static>(img: &ImageBuffer<P, Vec<P::Subpixel>>, out: &mut Vec<u8>)
where
    P::Subpixel: Sub,
{
    P::Subpixel::planes(img.as_raw(), P::CHANNEL_COUNT as usize, out)
}

/// Where an image of `w` x `h` lands in the target: scaled to `scaled` (w, h), then cut at
/// `offset` (Crop: the part of the scaled image kept) or placed at it (Pad: on a blank canvas).
/// One rule for images and their masks, so a mask's pixels stay over the image's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Placement {
    scaled: (u32, u32),
    offset: (u32, u32),
    pad: bool,
}

fn placement(w: u32, h: u32, t: &Target) -> Placement {
    let (tw, th) = (t.width, t.height);
    match t.fit {
        Fit::Stretch => Placement {
            scaled: (tw, th),
            offset: (0, 0),
            pad: false,
        },
        Fit::Crop => {
            // Scale so both sides cover the target, then cut the centre.
            let s = (tw as f64 / w as f64).max(th as f64 / h as f64);
            let (sw, sh) = (
                ((w as f64 * s).round() as u32).max(tw),
                ((h as f64 * s).round() as u32).max(th),
            );
            Placement {
                scaled: (sw, sh),
                offset: ((sw - tw) / 2, (sh - th) / 2),
                pad: false,
            }
        }
        Fit::Pad => {
            let s = (tw as f64 / w as f64).min(th as f64 / h as f64);
            let (sw, sh) = (
                ((w as f64 * s).round() as u32).clamp(1, tw),
                ((h as f64 * s).round() as u32).clamp(1, th),
            );
            Placement {
                scaled: (sw, sh),
                offset: ((tw - sw) / 2, (th - sh) / 2),
                pad: true,
            }
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
    let p = placement(w, h, t);
    let (sw, sh) = p.scaled;
    if !p.pad && (sw, sh) != (tw, th) {
        // Crop: the kept part of the source resized straight to the target (the same filter
        // and scale as resizing the whole image and cutting it, without the whole's pixels).
        let k = (w / sw.max(1)).min(h / sh.max(1)) / 2;
        let src = if k >= 2 { box_reduce(&img, k) } else { img };
        let (fx, fy) = (
            src.width() as f64 / sw as f64,
            src.height() as f64 / sh as f64,
        );
        let kept = [
            p.offset.0 as f64 * fx,
            p.offset.1 as f64 * fy,
            tw as f64 * fx,
            th as f64 * fy,
        ];
        if let Some(out) = fir_resize(&src, tw, th, Some(kept)) {
            return out;
        }
        let scaled = resize(src, sw, sh);
        return imageops::crop_imm(&scaled, p.offset.0, p.offset.1, tw, th).to_image();
    }
    let scaled = resize(img, sw, sh);
    if p.pad {
        let mut canvas = ImageBuffer::<P, Vec<P::Subpixel>>::new(tw, th);
        imageops::replace(&mut canvas, &scaled, p.offset.0 as i64, p.offset.1 as i64);
        canvas
    } else if (sw, sh) == (tw, th) {
        scaled
    } else {
        imageops::crop_imm(&scaled, p.offset.0, p.offset.1, tw, th).to_image()
    }
}

/// A mask (`w` x `h` values, row-major) brought to the target size by the same placement as its
/// image, with nearest-neighbour sampling: every value out is a value in, never a blend of two
/// classes. Padding is 0, the background.
pub fn fit_mask<T: Copy + Default>(m: &[T], w: u32, h: u32, t: &Target) -> Vec<T> {
    let (tw, th) = (t.width as usize, t.height as usize);
    if (w as usize, h as usize) == (tw, th) {
        return m.to_vec();
    }
    let p = placement(w, h, t);
    let (sw, sh) = (p.scaled.0 as u64, p.scaled.1 as u64);
    let (ox, oy) = (p.offset.0 as i64, p.offset.1 as i64);
    // Source index of scaled coordinate `s`: the pixel whose span holds its centre.
    let src = |s: u64, n: u32, sn: u64| (((2 * s + 1) * n as u64) / (2 * sn)).min(n as u64 - 1);
    let cols: Vec<Option<usize>> = (0..tw as i64)
        .map(|x| {
            let s = if p.pad { x - ox } else { x + ox };
            (0..sw as i64)
                .contains(&s)
                .then(|| src(s as u64, w, sw) as usize)
        })
        .collect();
    let mut out = vec![T::default(); tw * th];
    for y in 0..th as i64 {
        let s = if p.pad { y - oy } else { y + oy };
        if !(0..sh as i64).contains(&s) {
            continue;
        }
        let row = &m[src(s as u64, h, sh) as usize * w as usize..][..w as usize];
        for (o, c) in out[y as usize * tw..][..tw].iter_mut().zip(&cols) {
            if let Some(c) = c {
                *o = row[*c];
            }
        }
    }
    out
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
    P::Subpixel: Into<f32> + Sub,
{
    let (w, h) = img.dimensions();
    let k = (w / tw.max(1)).min(h / th.max(1)) / 2;
    let img = if k >= 2 { box_reduce(&img, k) } else { img };
    if img.dimensions() == (tw, th) {
        return img;
    }
    fir_resize(&img, tw, th, None)
        .unwrap_or_else(|| imageops::resize(&img, tw, th, FilterType::Triangle))
}

/// The triangle filter's resize by fast_image_resize (SIMD, integer arithmetic; 10x the image
/// crate's speed on photos) for u8 and u16 grey and RGB images, of the whole image or of the
/// part `kept` (left, top, width, height in source pixels); None for other images.
fn fir_resize<P>(
    img: &ImageBuffer<P, Vec<P::Subpixel>>,
    tw: u32,
    th: u32,
    kept: Option<[f64; 4]>,
) -> Option<ImageBuffer<P, Vec<P::Subpixel>>>
where
    P: Pixel + 'static,
{
    use fast_image_resize as fir;
    use std::any::TypeId;
    let sub = TypeId::of::<P::Subpixel>();
    let pt = match (
        P::CHANNEL_COUNT,
        sub == TypeId::of::<u8>(),
        sub == TypeId::of::<u16>(),
    ) {
        (1, true, _) => fir::PixelType::U8,
        (3, true, _) => fir::PixelType::U8x3,
        (1, _, true) => fir::PixelType::U16,
        (3, _, true) => fir::PixelType::U16x3,
        _ => return None,
    };
    let (w, h) = img.dimensions();
    let raw = img.as_raw().as_slice();
    // SAFETY: the subpixels are u8 or u16 (checked above): plain bytes, aligned for their type.
    let src = unsafe {
        std::slice::from_raw_parts(raw.as_ptr() as *const u8, std::mem::size_of_val(raw))
    };
    let src = fir::images::ImageRef::new(w, h, src, pt).ok()?;
    let mut out = vec![
        <P::Subpixel as image::Primitive>::DEFAULT_MIN_VALUE;
        tw as usize * th as usize * P::CHANNEL_COUNT as usize
    ];
    let bytes = std::mem::size_of_val(out.as_slice());
    // SAFETY: as above, for the output's u8 or u16 subpixels.
    let dst = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u8, bytes) };
    let mut dst = fir::images::Image::from_slice_u8(tw, th, dst, pt).ok()?;
    let mut opts = fir::ResizeOptions::new()
        .resize_alg(fir::ResizeAlg::Convolution(fir::FilterType::Bilinear));
    if let Some([l, t, w, h]) = kept {
        opts = opts.crop(l, t, w, h);
    }
    fir::Resizer::new().resize(&src, &mut dst, &opts).ok()?;
    ImageBuffer::from_raw(tw, th, out)
}

fn box_reduce<P>(img: &ImageBuffer<P, Vec<P::Subpixel>>, k: u32) -> ImageBuffer<P, Vec<P::Subpixel>>
where
    P: Pixel + 'static,
    P::Subpixel: Into<f32> + Sub,
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
        .map(|v| P::Subpixel::from_mean(v / n))
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
    fn masks_follow_their_image_with_nearest_values() {
        // 32 x 16, value = 1 + column / 8: four bands.
        let (w, h) = (32u32, 16u32);
        let m: Vec<u16> = (0..w * h).map(|i| 1 + (i % w) as u16 / 8).collect();
        let same = fit_mask(&m, w, h, &t(1, 16, 32, Dtype::U8, Fit::Crop));
        assert_eq!(same, m);
        // Stretch to 16 x 8: every other column and row.
        let s = fit_mask(&m, w, h, &t(1, 8, 16, Dtype::U8, Fit::Stretch));
        let want: Vec<u16> = (0..16 * 8).map(|i| 1 + ((i % 16) * 2) as u16 / 8).collect();
        assert_eq!(s, want);
        // Crop to 16 x 16: the middle columns 8..24 at scale 1.
        let c = fit_mask(&m, w, h, &t(1, 16, 16, Dtype::U8, Fit::Crop));
        let want: Vec<u16> = (0..16 * 16).map(|i| 1 + (8 + i % 16) as u16 / 8).collect();
        assert_eq!(c, want);
        // Pad to 16 x 16: scaled to 16 x 8 at rows 4..12, background around.
        let p = fit_mask(&m, w, h, &t(1, 16, 16, Dtype::U8, Fit::Pad));
        for (i, &v) in p.iter().enumerate() {
            let (x, y) = (i % 16, i / 16);
            let want = if (4..12).contains(&y) {
                1 + (x * 2) as u16 / 8
            } else {
                0
            };
            assert_eq!(v, want, "at {x},{y}");
        }
        // Enlarging repeats values; odd sizes never read past the edge.
        for (tw, th) in [(7, 5), (33, 17), (64, 3), (1, 1)] {
            for fit in [Fit::Crop, Fit::Stretch, Fit::Pad] {
                let o = fit_mask(&m, w, h, &t(1, th, tw, Dtype::U8, fit));
                assert_eq!(o.len(), (tw * th) as usize);
                assert!(o.iter().all(|&v| v <= 4), "{tw}x{th} {fit:?}");
            }
        }
    }

    #[test]
    fn planar_layout_and_channel_conversion() {
        let mut img = RgbImage::new(2, 1);
        img.put_pixel(0, 0, Rgb([1, 2, 3]));
        img.put_pixel(1, 0, Rgb([4, 5, 6]));
        let mut out = Vec::new();
        to_sample(
            DynamicImage::ImageRgb8(img.clone()).into(),
            &t(3, 1, 2, Dtype::U8, Fit::Crop),
            &mut out,
        )
        .unwrap();
        assert_eq!(out, vec![1, 4, 2, 5, 3, 6]);
        out.clear();
        to_sample(
            DynamicImage::ImageRgb8(img).into(),
            &t(3, 1, 2, Dtype::U16, Fit::Crop),
            &mut out,
        )
        .unwrap();
        assert_eq!(&out[..4], &[0x01, 0x01, 0x04, 0x04]); // 1 * 257, little-endian
        out.clear();
        let grey = GrayImage::from_pixel(3, 3, Luma([200]));
        to_sample(
            DynamicImage::ImageLuma8(grey).into(),
            &t(3, 3, 3, Dtype::U8, Fit::Crop),
            &mut out,
        )
        .unwrap();
        assert!(out.iter().all(|&v| v == 200) && out.len() == 27);
        out.clear();
        let rgba = RgbaImage::from_pixel(4, 4, image::Rgba([10, 20, 30, 0]));
        to_sample(
            DynamicImage::ImageRgba8(rgba).into(),
            &t(1, 4, 4, Dtype::U8, Fit::Crop),
            &mut out,
        )
        .unwrap();
        assert_eq!(out.len(), 16);
    }

    #[test]
    fn fits_keep_the_right_parts() {
        // 40x20: left half black, right half white. Crop to 10x10 keeps the middle (half/half),
        // pad keeps proportions with black bars, stretch keeps the halves.
        let img = GrayImage::from_fn(40, 20, |x, _| Luma([if x < 20 { 0 } else { 255 }]));
        let mut out = Vec::new();
        to_sample(
            DynamicImage::ImageLuma8(img.clone()).into(),
            &t(1, 10, 10, Dtype::U8, Fit::Crop),
            &mut out,
        )
        .unwrap();
        assert!(out[0] < 20 && out[9] > 235, "{:?}", &out[..10]);
        out.clear();
        to_sample(
            DynamicImage::ImageLuma8(img.clone()).into(),
            &t(1, 10, 10, Dtype::U8, Fit::Pad),
            &mut out,
        )
        .unwrap();
        assert_eq!(out[0], 0); // top bar
        assert!(out[5 * 10 + 9] > 200); // right half, middle row
        out.clear();
        to_sample(
            DynamicImage::ImageLuma8(img).into(),
            &t(1, 8, 8, Dtype::U8, Fit::Stretch),
            &mut out,
        )
        .unwrap();
        assert!(out[0] < 20 && out[7] > 235);
    }

    #[test]
    fn big_reductions_average() {
        let img = GrayImage::from_fn(512, 512, |x, y| Luma([((x + y) % 2 * 255) as u8]));
        let mut out = Vec::new();
        to_sample(
            DynamicImage::ImageLuma8(img).into(),
            &t(1, 32, 32, Dtype::U8, Fit::Crop),
            &mut out,
        )
        .unwrap();
        assert!(
            out.iter().all(|&v| (120..=135).contains(&v)),
            "{:?}",
            &out[..8]
        );
    }

    fn floats(out: &[u8]) -> Vec<f32> {
        out.chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    fn grey(w: u32, h: u32, f: impl Fn(u32, u32) -> f32) -> Frame {
        let data = (0..h)
            .flat_map(|y| (0..w).map(move |x| (x, y)))
            .map(|(x, y)| f(x, y));
        Frame::Float(FloatFrame::grey(w, h, data.collect()))
    }

    #[test]
    fn float_targets_keep_values_and_convert_channels() {
        let vals = [-1024.5f32, -0.0, 1e-40, 3.25, 70000.0, 0.1];
        let frame = Frame::Float(FloatFrame::grey(3, 2, vals.to_vec()));
        let mut out = Vec::new();
        to_sample(frame.clone(), &t(1, 2, 3, Dtype::F32, Fit::Crop), &mut out).unwrap();
        let want: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(out, want, "bit for bit");
        out.clear();
        to_sample(frame.clone(), &t(3, 2, 3, Dtype::F32, Fit::Crop), &mut out).unwrap();
        assert_eq!(
            out,
            [want.clone(), want.clone(), want].concat(),
            "grey repeated"
        );
        // f16: nearest, and 70000 is beyond its range.
        out.clear();
        let e = to_sample(frame, &t(1, 2, 3, Dtype::F16, Fit::Crop), &mut out).unwrap_err();
        assert!(e.0.contains("beyond f16's range"), "{e}");
        assert!(out.is_empty(), "nothing appended on failure");
        let small = Frame::Float(FloatFrame::grey(2, 1, vec![0.1, -2049.0]));
        to_sample(small, &t(1, 1, 2, Dtype::F16, Fit::Crop), &mut out).unwrap();
        let h: Vec<f32> = out
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect();
        assert_eq!(h, vec![half::f16::from_f32(0.1).to_f32(), -2048.0]);
        // Colour to grey by the luma weights.
        out.clear();
        let rgb = Frame::Float(FloatFrame {
            channels: 3,
            height: 1,
            width: 1,
            data: vec![100.0, -50.0, 10.0],
        });
        to_sample(rgb, &t(1, 1, 1, Dtype::F32, Fit::Crop), &mut out).unwrap();
        let luma = (0.2126 * 100.0 - 0.7152 * 50.0 + 0.0722 * 10.0) as f32;
        assert_eq!(floats(&out), vec![luma]);
        // Images keep their integer values; 16-bit colour gives three planes.
        out.clear();
        let mut img = ImageBuffer::<Rgb<u16>, Vec<u16>>::new(2, 1);
        img.put_pixel(1, 0, Rgb([65535, 7, 300]));
        let img = DynamicImage::ImageRgb16(img);
        to_sample(img.into(), &t(3, 1, 2, Dtype::F32, Fit::Crop), &mut out).unwrap();
        assert_eq!(floats(&out), vec![0.0, 65535.0, 0.0, 7.0, 0.0, 300.0]);
        // Non-finite values are named by position.
        let nan = grey(4, 3, |x, y| if (x, y) == (2, 1) { f32::NAN } else { 1.0 });
        let e = to_sample(nan, &t(1, 3, 4, Dtype::F32, Fit::Crop), &mut out).unwrap_err();
        assert_eq!(
            e.0,
            "value NaN at channel 0, row 1, column 2: float samples must be finite"
        );
        let e = to_sample(
            grey(1, 1, |_, _| 1.0),
            &t(1, 1, 1, Dtype::U8, Fit::Crop),
            &mut out,
        )
        .unwrap_err();
        assert!(e.0.contains("--dtype f32"), "{e}");
    }

    #[test]
    fn float_resizes_stay_in_range_and_pad_with_the_minimum() {
        // 40x20: left half -1000, right half 3000, as the u8 test above.
        let halves = || grey(40, 20, |x, _| if x < 20 { -1000.0 } else { 3000.0 });
        let mut out = Vec::new();
        to_sample(halves(), &t(1, 10, 10, Dtype::F32, Fit::Crop), &mut out).unwrap();
        let v = floats(&out);
        assert!(v.iter().all(|x| (-1000.0..=3000.0).contains(x)), "{v:?}");
        assert!(
            (v[0] + 1000.0).abs() < 1.0 && (v[9] - 3000.0).abs() < 1.0,
            "{v:?}"
        );
        out.clear();
        to_sample(halves(), &t(1, 10, 10, Dtype::F32, Fit::Pad), &mut out).unwrap();
        let v = floats(&out);
        assert_eq!(v[0], -1000.0, "top bar: the minimum");
        assert!((v[5 * 10 + 9] - 3000.0).abs() < 1.0, "{v:?}");
        out.clear();
        to_sample(halves(), &t(1, 8, 8, Dtype::F32, Fit::Stretch), &mut out).unwrap();
        let v = floats(&out);
        assert!(
            (v[0] + 1000.0).abs() < 1.0 && (v[7] - 3000.0).abs() < 1.0,
            "{v:?}"
        );
        // Large reductions average boxes (no rounding to integers, no clamping to [0, 1]).
        out.clear();
        let checks = grey(
            512,
            512,
            |x, y| if (x + y) % 2 == 0 { -500.0 } else { 501.0 },
        );
        to_sample(checks, &t(1, 32, 32, Dtype::F32, Fit::Crop), &mut out).unwrap();
        let v = floats(&out);
        assert!(v.iter().all(|x| (x - 0.5).abs() < 0.01), "{:?}", &v[..8]);
        // A constant plane stays exactly constant.
        out.clear();
        to_sample(
            grey(30, 20, |_, _| -3.5),
            &t(1, 7, 9, Dtype::F32, Fit::Pad),
            &mut out,
        )
        .unwrap();
        assert!(floats(&out).iter().all(|&x| x == -3.5));
    }
}
