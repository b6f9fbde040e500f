//! TIFF files page by page through the `tiff` crate, as scientists save them: every page (IFD) is
//! one image, in strips or tiles, chunky or planar (PlanarConfiguration 2), with any compression
//! the crate reads (none, LZW, Deflate, PackBits, JPEG, CCITT G4, with their predictors).
//!
//! Sample types. Unsigned 8 and 16 bits are pixels, emitted as images with their own values (as
//! before: an RGBA page stays RGBA, the conversion drops alpha); grey of 1 to 7 bits (bilevel
//! scans) is scaled onto 0..=255. Everything else is values: signed integers of 8 to 64 bits,
//! unsigned of 32 and 64, floats of 16, 32 and 64 (64-bit values rounded to float32, as NIfTI's).
//! With `opts.float` they are emitted as float frames as they are (a NaN or ±Inf is left for the
//! conversion to reject, naming the page and the position); else they are windowed onto
//! 0..=65535 by `window_to_u16` through one window for the whole file, as a NIfTI volume is:
//! `opts.window` if given, else the `opts.percentiles` window of the finite values of all its
//! value pages (exact up to `WINDOW_SAMPLE` values, from an even stride above). NaN then becomes
//! 0 and ±Inf the window's ends. Pixel pages ignore the window.
//!
//! Channels. Grey pages are one channel, RGB pages three: extra samples beside R, G, B (alpha or
//! other) are dropped, and so is an alpha sample beside grey. A grey page with extra samples that
//! are not alpha (a 2- or 5-channel fluorescence image) is refused: prep keeps 1 or 3 channels and
//! does not pick among data channels (save one channel per page). CMYK (8/16 bits) becomes RGB as
//! `(max - c) * (max - k) / max`, YCbCr (8 bits, as JPEG-in-TIFF stores it) by JFIF's full-range
//! formula. Palette and CIE L*a*b* colour, complex and undefined sample formats and other bit
//! depths are refused with the reason, and so are interleaved extra samples past RGBA under a
//! predictor or in tiles overhanging the image, which the crate misreads. Planar tiled pages are
//! read around the crate's misplacing of their bottom tiles (`read::planar_tiles`).
//!
//! Sizes are capped before allocation: at most `MAX_SIDE` a side, at most `MAX_ALLOC` bytes of
//! decoded samples and as many of float32 values per page (the crate's own limits as a second
//! guard). The window's first pass keeps decoded pages only up to `KEEP_BYTES`, and decodes the
//! file again beyond. Every call into the crate runs under `catch_unwind`: a panic on hostile
//! bytes is a reject naming the page.

use super::images::{MAX_ALLOC, MAX_SIDE};
use super::nifti::percentile_window;
use super::{window_to_u16, DecodeOptions, Emit, FloatFrame, Frame, Probe, Reject};
use ::tiff::decoder::{Decoder, Limits};
use ::tiff::tags::Tag;
use ::tiff::{ColorType, TiffError};
use image::{DynamicImage, ImageBuffer};
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

mod read;

type Tiff = Decoder<BufReader<File>>;

/// Values the percentile window is computed from: all of them up to this many (a 2048 x 2048
/// page), an even stride of them above; 16 MiB, and as much again while the percentiles are found.
const WINDOW_SAMPLE: usize = 1 << 22;
/// Decoded value pages the window's first pass keeps for emitting, so that a small file is
/// decoded once.
const KEEP_BYTES: usize = 64 << 20;

/// The first page's colour and size, from its header.
pub fn probe(path: &Path) -> Result<Probe, Reject> {
    let mut d = open(path)?;
    let i = guard(|| inspect(&mut d)).map_err(|e| at(0, e))?;
    Ok(Probe {
        colour: i.model != Model::Grey,
        size: Some((i.height, i.width)),
        channels: None,
    })
}

/// Every page of a TIFF file, in order (see the module's rules).
pub fn decode(path: &Path, opts: &DecodeOptions, emit: &mut Emit) -> Result<(), Reject> {
    let mode = match (opts.float, opts.window) {
        (true, _) => Mode::Float,
        (false, Some((low, high))) => Mode::Window(low, high),
        (false, None) => return decode_windowed(path, opts.percentiles, emit),
    };
    each_page(path, &|_| true, &mut |page| emit_page(page, mode, emit))
}

/// Without a window given: a first pass over the value pages for the file's percentile window,
/// then the pages.
fn decode_windowed(path: &Path, percentiles: (f64, f64), emit: &mut Emit) -> Result<(), Reject> {
    let mut sample = Sample::new(WINDOW_SAMPLE);
    let mut kept: Option<Vec<FloatFrame>> = Some(Vec::new());
    let (mut kept_bytes, mut pixel_pages, mut value_pages) = (0usize, 0usize, 0usize);
    each_page(path, &|i| !i.ty.is_pixels(), &mut |page| {
        match page {
            Some(Page::Values(f)) => {
                value_pages += 1;
                sample.add(&f.data);
                kept_bytes = kept_bytes.saturating_add(f.data.len() * 4);
                match &mut kept {
                    Some(k) if kept_bytes <= KEEP_BYTES => k.push(f),
                    _ => kept = None,
                }
            }
            _ => pixel_pages += 1,
        }
        Ok(())
    })?;
    let (low, high) = if value_pages == 0 {
        (0.0, 0.0)
    } else {
        let mut scratch = Vec::new();
        percentile_window(&sample.values, percentiles, &mut scratch)?
    };
    drop(sample);
    let mode = Mode::Window(low, high);
    if let (Some(kept), 0) = (kept, pixel_pages) {
        for f in kept {
            emit_page(Some(Page::Values(f)), mode, emit)?;
        }
        return Ok(());
    }
    each_page(path, &|_| true, &mut |page| emit_page(page, mode, emit))
}

#[derive(Debug, Clone, Copy)]
enum Mode {
    /// Values as float frames.
    Float,
    /// Values through this window (low, high) onto 16-bit images.
    Window(f64, f64),
}

/// One decoded page.
enum Page {
    /// 8/16-bit pixels with their own values.
    Image(DynamicImage),
    /// Values of any other type as float32 planes (1 or 3).
    Values(FloatFrame),
}

fn emit_page(page: Option<Page>, mode: Mode, emit: &mut Emit) -> Result<(), Reject> {
    match (page, mode) {
        (Some(Page::Image(img)), _) => emit(img.into()),
        (Some(Page::Values(f)), Mode::Float) => emit(Frame::Float(f)),
        (Some(Page::Values(f)), Mode::Window(low, high)) => emit(windowed(f, low, high)?.into()),
        (None, _) => Err(Reject::new("internal: a TIFF page was not decoded")),
    }
}

/// Float planes through the window onto a 16-bit grey or RGB image.
fn windowed(f: FloatFrame, low: f64, high: f64) -> Result<DynamicImage, Reject> {
    let u = |v: f32| window_to_u16(v as f64, low, high);
    let n = f.width as usize * f.height as usize;
    let bad = || Reject::new("internal: float planes do not fill the page");
    if f.channels == 1 {
        let px: Vec<u16> = f.data.iter().map(|&v| u(v)).collect();
        let img = ImageBuffer::from_raw(f.width, f.height, px).ok_or_else(bad)?;
        return Ok(DynamicImage::ImageLuma16(img));
    }
    if f.data.len() < 3 * n {
        return Err(bad());
    }
    let px: Vec<u16> = (0..n)
        .flat_map(|p| (0..3).map(move |c| (c, p)))
        .map(|(c, p)| u(f.data[c * n + p]))
        .collect();
    let img = ImageBuffer::from_raw(f.width, f.height, px).ok_or_else(bad)?;
    Ok(DynamicImage::ImageRgb16(img))
}

/// Finite values of the pages, for the percentile window: all of them, or every `stride`-th
/// once there are more than `cap` (the stride doubles each time the sample fills).
struct Sample {
    values: Vec<f32>,
    cap: usize,
    /// Finite values seen.
    seen: usize,
    stride: usize,
}

impl Sample {
    fn new(cap: usize) -> Sample {
        Sample {
            values: Vec::new(),
            cap: cap.max(2),
            seen: 0,
            stride: 1,
        }
    }

    fn add(&mut self, data: &[f32]) {
        for &v in data.iter().filter(|v| v.is_finite()) {
            if self.seen % self.stride == 0 {
                if self.values.len() == self.cap {
                    // Keep the values at even positions: those at multiples of twice the stride.
                    let mut i = 0;
                    self.values.retain(|_| {
                        i += 1;
                        i % 2 == 1
                    });
                    self.stride *= 2;
                }
                if self.seen % self.stride == 0 {
                    self.values.push(v);
                }
            }
            self.seen += 1;
        }
    }
}

/// "page N: what" for a reject.
fn at(page: usize, what: String) -> Reject {
    Reject::new(format!("page {page}: {what}"))
}

/// Decode every page in order, each handed to `f`: decoded where `want` says so (else `None`).
/// A page that cannot be read stops with its number; an error from `f` is returned as it is.
fn each_page(
    path: &Path,
    want: &dyn Fn(&Info) -> bool,
    f: &mut dyn FnMut(Option<Page>) -> Result<(), Reject>,
) -> Result<(), Reject> {
    let mut d = open(path)?;
    let mut page = 0;
    loop {
        let info = guard(|| inspect(&mut d)).map_err(|e| at(page, e))?;
        let decoded = if want(&info) {
            Some(guard(|| read::read(&mut d, &info)).map_err(|e| at(page, e))?)
        } else {
            None
        };
        f(decoded)?;
        page += 1;
        if !d.more_images() {
            return Ok(());
        }
        guard(|| d.next_image().map_err(tiff_error)).map_err(|e| at(page, e))?;
    }
}

/// Run the crate on a page, a panic (it asserts on some malformed layouts) becoming a reason.
fn guard<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(format!("the TIFF decoder failed on this page ({msg})"))
    })
}

fn open(path: &Path) -> Result<Tiff, Reject> {
    let mut f = super::open_input(path)?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len == 0 {
        return Err(Reject::new("empty file (0 bytes)"));
    }
    let mut magic = [0u8; 4];
    let whole = match f.read_exact(&mut magic) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => false,
        Err(e) => return Err(Reject::new(format!("cannot read: {e}"))),
    };
    // Classic TIFF (42) and BigTIFF (43), either byte order.
    if !whole || !matches!(&magic, b"II*\0" | b"MM\0*" | b"II+\0" | b"MM\0+") {
        return Err(Reject::new(
            "not a TIFF (no II*/MM* header in its first 4 bytes)",
        ));
    }
    f.seek(SeekFrom::Start(0))
        .map_err(|e| Reject::new(format!("cannot read: {e}")))?;
    let mut lim = Limits::default();
    lim.decoding_buffer_size = MAX_ALLOC as usize;
    lim.intermediate_buffer_size = MAX_ALLOC as usize;
    guard(|| Decoder::new(BufReader::new(f)).map_err(tiff_error))
        .map(|d| d.with_limits(lim))
        .map_err(|e| at(0, e))
}

/// The crate's error, a file that ends early said as such.
fn tiff_error(e: TiffError) -> String {
    match e {
        TiffError::IoError(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            "truncated: the file ends before this page's data".to_string()
        }
        e => e.to_string(),
    }
}

/// What a page's samples are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    /// Unsigned grey of 1 to 7 bits, packed.
    Bits(u8),
    U8,
    U16,
    U32,
    U64,
    I8,
    I16,
    I32,
    I64,
    F16,
    F32,
    F64,
}

impl Ty {
    /// Pixels (emitted with their own values) rather than values (windowed, or floats).
    fn is_pixels(self) -> bool {
        matches!(self, Ty::Bits(_) | Ty::U8 | Ty::U16)
    }

    /// As messages name it.
    fn name(self) -> String {
        match self {
            Ty::Bits(b) => format!("{b}-bit"),
            Ty::U8 => "uint8".into(),
            Ty::U16 => "uint16".into(),
            Ty::U32 => "uint32".into(),
            Ty::U64 => "uint64".into(),
            Ty::I8 => "int8".into(),
            Ty::I16 => "int16".into(),
            Ty::I32 => "int32".into(),
            Ty::I64 => "int64".into(),
            Ty::F16 => "float16".into(),
            Ty::F32 => "float32".into(),
            Ty::F64 => "float64".into(),
        }
    }

    fn bytes(self) -> usize {
        match self {
            Ty::Bits(_) | Ty::U8 | Ty::I8 => 1,
            Ty::U16 | Ty::I16 | Ty::F16 => 2,
            Ty::U32 | Ty::I32 | Ty::F32 => 4,
            Ty::U64 | Ty::I64 | Ty::F64 => 8,
        }
    }
}

/// The colour model of a page's samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Model {
    Grey,
    Rgb,
    Cmyk,
    YCbCr,
}

/// A page as its header describes it.
#[derive(Debug, Clone, Copy)]
struct Info {
    width: u32,
    height: u32,
    ty: Ty,
    model: Model,
    /// Samples per pixel in the decoded buffer: the crate reads the photometric samples and, after
    /// them, alpha (RGBA, CMYKA) or every sample of a grey page; other extra samples are skipped.
    samples: usize,
    /// One plane per sample (PlanarConfiguration 2) rather than interleaved.
    planar: bool,
}

impl Info {
    /// Channels kept: 1 (grey) or 3 (colour).
    fn keep(&self) -> usize {
        if self.model == Model::Grey {
            1
        } else {
            3
        }
    }
}

/// Read the current page's header and decide what it becomes, or why it cannot be used.
fn inspect(d: &mut Tiff) -> Result<Info, String> {
    let (width, height) = d.dimensions().map_err(tiff_error)?;
    if width == 0 || height == 0 || width > MAX_SIDE || height > MAX_SIDE {
        return Err(format!(
            "absurd size {width}x{height} (each side 1 to {MAX_SIDE})"
        ));
    }
    refuse_photometric(d)?;
    let color = d.colortype().map_err(tiff_error)?;
    let ty = sample_type(d, color)?;
    let (model, samples) = colour_model(d, color)?;
    check_model_type(model, ty, samples)?;
    let planar = d
        .find_tag_unsigned::<u16>(Tag::PlanarConfiguration)
        .map_err(tag_error)?
        == Some(2);
    check_interleaved_extras(d, width, planar, samples)?;
    Ok(Info {
        width,
        height,
        ty,
        model,
        samples,
        planar,
    })
}

/// A tag that cannot be read, as a reason.
fn tag_error(e: TiffError) -> String {
    e.to_string()
}

/// Refuse the photometric interpretations that are no image prep reads: palette, mask, L*a*b*.
fn refuse_photometric(d: &mut Tiff) -> Result<(), String> {
    match d
        .find_tag_unsigned::<u16>(Tag::PhotometricInterpretation)
        .map_err(tag_error)?
    {
        Some(3) => {
            return Err(
                "palette colour (PhotometricInterpretation 3) is not supported: save it as RGB"
                    .into(),
            )
        }
        Some(4) => {
            return Err("a transparency mask (PhotometricInterpretation 4), not an image".into())
        }
        Some(p @ 8..=10) => {
            return Err(format!(
                "CIE L*a*b* colour (PhotometricInterpretation {p}) is not supported: save it as RGB"
            ))
        }
        _ => {}
    }
    Ok(())
}

/// The page's sample type, from its SampleFormat and bit depth.
fn sample_type(d: &mut Tiff, color: ColorType) -> Result<Ty, String> {
    let format = d
        .find_tag_unsigned_vec::<u16>(Tag::SampleFormat)
        .map_err(tag_error)?
        .and_then(|v| v.first().copied())
        .unwrap_or(1);
    let bits = color.bit_depth();
    Ok(match (format, bits) {
        (1, 1..=7) => Ty::Bits(bits),
        (1, 8) => Ty::U8,
        (1, 16) => Ty::U16,
        (1, 32) => Ty::U32,
        (1, 64) => Ty::U64,
        (2, 8) => Ty::I8,
        (2, 16) => Ty::I16,
        (2, 32) => Ty::I32,
        (2, 64) => Ty::I64,
        (3, 16) => Ty::F16,
        (3, 32) => Ty::F32,
        (3, 64) => Ty::F64,
        (5 | 6, _) => {
            return Err(format!(
                "complex samples (SampleFormat {format}) are not supported"
            ))
        }
        (4, _) => {
            return Err("samples of undefined format (SampleFormat 4) are not supported".into())
        }
        (1, b) => {
            return Err(format!(
                "{b}-bit unsigned samples are not supported (1 to 8, 16, 32 or 64 bits)"
            ))
        }
        (2, b) => {
            return Err(format!(
                "{b}-bit signed samples are not supported (8, 16, 32 or 64 bits)"
            ))
        }
        (3, b) => {
            return Err(format!(
                "{b}-bit float samples are not supported (16, 32 or 64 bits)"
            ))
        }
        (f, _) => return Err(format!("unknown SampleFormat {f}")),
    })
}

/// The page's colour model and the samples per pixel the crate decodes; a grey page with extra
/// samples that are not alpha is refused.
fn colour_model(d: &mut Tiff, color: ColorType) -> Result<(Model, usize), String> {
    Ok(match color {
        ColorType::Gray(_) => (Model::Grey, 1),
        ColorType::Multiband { num_samples, .. } => {
            let extra = d
                .find_tag_unsigned_vec::<u16>(Tag::ExtraSamples)
                .map_err(tag_error)?
                .unwrap_or_default();
            let k = num_samples as usize;
            // 1: associated alpha, 2: unassociated alpha.
            if extra.len() + 1 != k || !extra.iter().all(|&e| e == 1 || e == 2) {
                return Err(format!(
                    "{k} samples per pixel in a grey image ({} extra declared, {} of them alpha): \
                     several channels of data; prep keeps 1 (grey) or 3 (RGB) channels and does \
                     not pick among them: save one channel per page",
                    extra.len(),
                    extra.iter().filter(|&&e| e == 1 || e == 2).count()
                ));
            }
            (Model::Grey, k)
        }
        ColorType::RGB(_) => (Model::Rgb, 3),
        ColorType::RGBA(_) => (Model::Rgb, 4),
        ColorType::CMYK(_) => (Model::Cmyk, 4),
        ColorType::CMYKA(_) => (Model::Cmyk, 5),
        ColorType::YCbCr(_) => (Model::YCbCr, 3),
        other => return Err(format!("{other:?} colour is not supported")),
    })
}

/// Refuse the sample types a colour model is not read in: packed bits beside other samples,
/// CMYK beyond 16 bits, YCbCr beyond 8.
fn check_model_type(model: Model, ty: Ty, samples: usize) -> Result<(), String> {
    match (model, ty) {
        (_, Ty::Bits(b)) if samples != 1 => {
            return Err(format!(
                "{b}-bit samples are supported in single-sample grey images only"
            ))
        }
        (Model::Cmyk, t) if !matches!(t, Ty::U8 | Ty::U16) => {
            return Err(format!(
                "CMYK of {} samples is not supported (8 or 16 bits)",
                t.name()
            ))
        }
        (Model::YCbCr, t) if t != Ty::U8 => {
            return Err(format!(
                "YCbCr of {} samples is not supported (8 bits)",
                t.name()
            ))
        }
        _ => {}
    }
    Ok(())
}

/// Refuse interleaved extra samples the crate would misread (under a predictor, or in tiles
/// that overhang the image).
fn check_interleaved_extras(
    d: &mut Tiff,
    width: u32,
    planar: bool,
    samples: usize,
) -> Result<(), String> {
    // Interleaved extra samples beyond those read are dropped by the crate as it reads each row
    // of a chunk; before its predictor (which then strides wrongly) and past the image's right
    // edge in a tile that sticks out of it (writing over the next row): refused, not misread.
    let in_file = d
        .find_tag_unsigned::<u16>(Tag::SamplesPerPixel)
        .map_err(tag_error)?
        .unwrap_or(1) as usize;
    if !planar && in_file > samples {
        let predictor = d
            .find_tag_unsigned::<u16>(Tag::Predictor)
            .map_err(tag_error)?;
        let tile = d
            .find_tag_unsigned::<u32>(Tag::TileWidth)
            .map_err(tag_error)?;
        let why = match (predictor, tile) {
            (Some(p), _) if p != 1 => Some(format!("with a predictor (Predictor {p})")),
            (_, Some(t)) if t > 0 && width % t != 0 => Some(format!(
                "in tiles that overhang the image ({width} pixels wide, tiles of {t})"
            )),
            _ => None,
        };
        if let Some(why) = why {
            return Err(format!(
                "{in_file} interleaved samples per pixel of which {samples} are read, {why}: \
                 the tiff crate decodes such pages wrongly, so they are not supported \
                 (save without the extra samples, or planar)"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_sample_is_every_value_then_an_even_stride() {
        let mut s = Sample::new(8);
        s.add(&[0.0, f32::NAN, 1.0, 2.0]);
        s.add(&[3.0, f32::INFINITY, 4.0, 5.0, 6.0, 7.0]);
        assert_eq!(s.values, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
        // Full: halved to the even values, then every second one.
        s.add(&[8.0, 9.0, 10.0]);
        assert_eq!(
            (s.values.as_slice(), s.stride),
            (&[0.0, 2.0, 4.0, 6.0, 8.0, 10.0][..], 2)
        );
        s.add(&(11..40).map(|v| v as f32).collect::<Vec<_>>());
        assert_eq!(s.stride, 8);
        assert_eq!(s.values, [0.0, 8.0, 16.0, 24.0, 32.0]);
        assert_eq!(s.seen, 40);
    }

    #[test]
    fn values_window_onto_grey_and_rgb() {
        let grey = FloatFrame::grey(2, 1, vec![-1.0, 3.0]);
        match windowed(grey, -1.0, 3.0).unwrap() {
            DynamicImage::ImageLuma16(b) => assert_eq!(b.into_raw(), [0, 65535]),
            other => panic!("{:?}", other.color()),
        }
        let rgb = FloatFrame {
            channels: 3,
            height: 1,
            width: 2,
            data: vec![0.0, 1.0, 2.0, 3.0, f32::NAN, f32::NEG_INFINITY],
        };
        match windowed(rgb, 0.0, 2.0).unwrap() {
            DynamicImage::ImageRgb16(b) => {
                assert_eq!(b.into_raw(), [0, 65535, 0, 32768, 65535, 0])
            }
            other => panic!("{:?}", other.color()),
        }
    }
}
