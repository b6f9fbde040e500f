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
//! depths are refused with the reason.
//!
//! Sizes are capped before allocation: at most `MAX_SIDE` a side, at most `MAX_ALLOC` bytes of
//! decoded samples and as many of float32 values per page (the crate's own limits as a second
//! guard). The window's first pass keeps decoded pages only up to `KEEP_BYTES`, and decodes the
//! file again beyond.

use super::images::{MAX_ALLOC, MAX_SIDE};
use super::nifti::percentile_window;
use super::{window_to_u16, DecodeOptions, Emit, FloatFrame, Frame, Probe, Reject};
use ::tiff::decoder::{ChunkType, Decoder, DecodingResult, Limits, TiffCodingUnit};
use ::tiff::tags::Tag;
use ::tiff::{ColorType, TiffError};
use image::{DynamicImage, ImageBuffer};
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

type Tiff = Decoder<BufReader<File>>;

/// Values the percentile window is computed from: all of them up to this many, an even stride
/// of them above (64 MiB).
const WINDOW_SAMPLE: usize = 1 << 24;
/// Decoded value pages the window's first pass keeps for emitting, so that a small file is
/// decoded once.
const KEEP_BYTES: usize = 256 << 20;

/// The first page's colour and size, from its header.
pub fn probe(path: &Path) -> Result<Probe, Reject> {
    let mut d = open(path)?;
    let i = inspect(&mut d).map_err(|e| at(0, e))?;
    Ok(Probe {
        colour: i.model != Model::Grey,
        size: Some((i.height, i.width)),
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
    let mut sample = Sample::default();
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
/// once there are more than `WINDOW_SAMPLE` (the stride doubles each time the sample fills).
#[derive(Default)]
struct Sample {
    values: Vec<f32>,
    /// Finite values seen.
    seen: usize,
    /// 0 until the first value: then 1, 2, 4, ...
    stride: usize,
}

impl Sample {
    fn add(&mut self, data: &[f32]) {
        self.stride = self.stride.max(1);
        for &v in data.iter().filter(|v| v.is_finite()) {
            if self.seen % self.stride == 0 {
                if self.values.len() == WINDOW_SAMPLE {
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
        let info = inspect(&mut d).map_err(|e| at(page, e))?;
        let decoded = if want(&info) {
            Some(read(&mut d, &info).map_err(|e| at(page, e))?)
        } else {
            None
        };
        f(decoded)?;
        page += 1;
        if !d.more_images() {
            return Ok(());
        }
        d.next_image().map_err(|e| at(page, tiff_error(e)))?;
    }
}

fn open(path: &Path) -> Result<Tiff, Reject> {
    let mut f = File::open(path).map_err(|e| Reject::new(format!("cannot open: {e}")))?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len == 0 {
        return Err(Reject::new("empty file (0 bytes)"));
    }
    let mut magic = [0u8; 4];
    let got = (&mut f)
        .take(4)
        .read(&mut magic)
        .map_err(|e| Reject::new(format!("cannot read: {e}")))?;
    // Classic TIFF (42) and BigTIFF (43), either byte order.
    if got < 4 || !matches!(&magic, b"II*\0" | b"MM\0*" | b"II+\0" | b"MM\0+") {
        return Err(Reject::new(
            "not a TIFF (no II*/MM* header in its first 4 bytes)",
        ));
    }
    f.seek(SeekFrom::Start(0))
        .map_err(|e| Reject::new(format!("cannot read: {e}")))?;
    let mut lim = Limits::default();
    lim.decoding_buffer_size = MAX_ALLOC as usize;
    lim.intermediate_buffer_size = MAX_ALLOC as usize;
    Decoder::new(BufReader::new(f))
        .map(|d| d.with_limits(lim))
        .map_err(|e| at(0, tiff_error(e)))
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
    let tag = |e: TiffError| e.to_string();
    match d
        .find_tag_unsigned::<u16>(Tag::PhotometricInterpretation)
        .map_err(tag)?
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
        Some(p @ (8 | 9 | 10)) => {
            return Err(format!(
                "CIE L*a*b* colour (PhotometricInterpretation {p}) is not supported: save it as RGB"
            ))
        }
        _ => {}
    }
    let color = d.colortype().map_err(tiff_error)?;
    let format = d
        .find_tag_unsigned_vec::<u16>(Tag::SampleFormat)
        .map_err(tag)?
        .and_then(|v| v.first().copied())
        .unwrap_or(1);
    let bits = color.bit_depth();
    let ty = match (format, bits) {
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
    };
    let (model, samples) = match color {
        ColorType::Gray(_) => (Model::Grey, 1),
        ColorType::Multiband { num_samples, .. } => {
            let extra = d
                .find_tag_unsigned_vec::<u16>(Tag::ExtraSamples)
                .map_err(tag)?
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
    };
    match (model, ty) {
        (_, Ty::Bits(b)) if samples != 1 => {
            return Err(format!(
                "{b}-bit samples are supported in single-sample grey images only"
            ))
        }
        (Model::Cmyk, t) if !matches!(t, Ty::U8 | Ty::U16) => {
            return Err(format!(
                "CMYK of {t:?} samples is not supported (8 or 16 bits)"
            ))
        }
        (Model::YCbCr, t) if t != Ty::U8 => {
            return Err(format!("YCbCr of {t:?} samples is not supported (8 bits)"))
        }
        _ => {}
    }
    let planar = d
        .find_tag_unsigned::<u16>(Tag::PlanarConfiguration)
        .map_err(tag)?
        == Some(2);
    // Interleaved extra samples beyond those read are dropped by the crate as it reads each row
    // of a chunk; before its predictor (which then strides wrongly) and past the image's right
    // edge in a tile that sticks out of it (writing over the next row): refused, not misread.
    let in_file = d
        .find_tag_unsigned::<u16>(Tag::SamplesPerPixel)
        .map_err(tag)?
        .unwrap_or(1) as usize;
    if !planar && in_file > samples {
        let predictor = d.find_tag_unsigned::<u16>(Tag::Predictor).map_err(tag)?;
        let tile = d.find_tag_unsigned::<u32>(Tag::TileWidth).map_err(tag)?;
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
    Ok(Info {
        width,
        height,
        ty,
        model,
        samples,
        planar,
    })
}

/// Decode the current page: sizes checked before anything is allocated.
fn read(d: &mut Tiff, i: &Info) -> Result<Page, String> {
    let n = i.width as usize * i.height as usize;
    let bytes = match i.ty {
        Ty::Bits(b) => (i.width as usize * b as usize).div_ceil(8) * i.height as usize,
        t => n * i.samples * t.bytes(),
    };
    let too_big = |what: &str, b: usize| {
        format!(
            "{}x{} pixels of {} {:?} samples: {b} bytes {what}, over the limit of {MAX_ALLOC}",
            i.width, i.height, i.samples, i.ty
        )
    };
    if bytes as u64 > MAX_ALLOC {
        return Err(too_big("decoded", bytes));
    }
    if !i.ty.is_pixels() && (n * i.keep() * 4) as u64 > MAX_ALLOC {
        return Err(too_big("as float32 values", n * i.keep() * 4));
    }
    let res = if i.planar && i.samples > 1 && d.get_chunk_type() == ChunkType::Tile {
        planar_tiles(d, i, bytes)?
    } else {
        let mut res = DecodingResult::U8(Vec::new());
        let layout = d
            .read_image_to_buffer(&mut res)
            .map_err(|e| format!("cannot decode: {}", tiff_error(e)))?;
        if res.as_buffer(0).byte_len() < layout.complete_len.min(bytes) {
            return Err("not every plane could be decoded within the limits".into());
        }
        res
    };
    let short = || "internal: the decoded samples do not fill the page".to_string();
    let need = n * i.samples;
    let values = |len: usize| if len < need { Err(short()) } else { Ok(()) };
    Ok(match (i.ty, res) {
        (Ty::Bits(b), DecodingResult::U8(v)) => {
            let px = unpack(&v, i.width as usize, i.height as usize, b).ok_or_else(short)?;
            let img = ImageBuffer::from_raw(i.width, i.height, px).ok_or_else(short)?;
            Page::Image(DynamicImage::ImageLuma8(img))
        }
        (Ty::U8, DecodingResult::U8(v)) => {
            values(v.len())?;
            let (px, kind) = pixels(v, i);
            match kind {
                Px::Grey => {
                    ImageBuffer::from_raw(i.width, i.height, px).map(DynamicImage::ImageLuma8)
                }
                Px::Rgb => {
                    ImageBuffer::from_raw(i.width, i.height, px).map(DynamicImage::ImageRgb8)
                }
                Px::Rgba => {
                    ImageBuffer::from_raw(i.width, i.height, px).map(DynamicImage::ImageRgba8)
                }
            }
            .map(Page::Image)
            .ok_or_else(short)?
        }
        (Ty::U16, DecodingResult::U16(v)) => {
            values(v.len())?;
            let (px, kind) = pixels(v, i);
            match kind {
                Px::Grey => {
                    ImageBuffer::from_raw(i.width, i.height, px).map(DynamicImage::ImageLuma16)
                }
                Px::Rgb => {
                    ImageBuffer::from_raw(i.width, i.height, px).map(DynamicImage::ImageRgb16)
                }
                Px::Rgba => {
                    ImageBuffer::from_raw(i.width, i.height, px).map(DynamicImage::ImageRgba16)
                }
            }
            .map(Page::Image)
            .ok_or_else(short)?
        }
        (Ty::U32, DecodingResult::U32(v)) => float_planes(&v, i, need, |x| x as f32)?,
        (Ty::U64, DecodingResult::U64(v)) => float_planes(&v, i, need, |x| x as f32)?,
        (Ty::I8, DecodingResult::I8(v)) => float_planes(&v, i, need, f32::from)?,
        (Ty::I16, DecodingResult::I16(v)) => float_planes(&v, i, need, f32::from)?,
        (Ty::I32, DecodingResult::I32(v)) => float_planes(&v, i, need, |x| x as f32)?,
        (Ty::I64, DecodingResult::I64(v)) => float_planes(&v, i, need, |x| x as f32)?,
        (Ty::F16, DecodingResult::F16(v)) => float_planes(&v, i, need, |x| x.to_f32())?,
        (Ty::F32, DecodingResult::F32(v)) => float_planes(&v, i, need, |x| x)?,
        (Ty::F64, DecodingResult::F64(v)) => float_planes(&v, i, need, |x| x as f32)?,
        (t, _) => return Err(format!("internal: {t:?} samples decoded as another type")),
    })
}

/// A planar tiled page, read one coding unit (a tile's place in every plane) at a time. The crate
/// sizes the tiles of planes after the first as if none ended at the image's bottom edge: reading
/// the whole page, their overhanging rows land in the next plane, or past the buffer's end (a
/// panic). A unit's planes are read in order into a buffer with room for the last one's overhang,
/// so each overhang is overwritten or falls in that room; the units are then placed in the page.
fn planar_tiles(d: &mut Tiff, i: &Info, bytes: usize) -> Result<DecodingResult, String> {
    let err = |e: TiffError| format!("cannot decode: {}", tiff_error(e));
    let (w, h) = (i.width as usize, i.height as usize);
    let (tw, th) = d.chunk_dimensions();
    let (tw, th) = (tw as usize, th as usize);
    let size = i.ty.bytes();
    let (across, down) = (w.div_ceil(tw), h.div_ceil(th));
    let mut page = vec![0u8; bytes];
    let mut unit = Vec::new();
    for ty in 0..down {
        for tx in 0..across {
            let code = TiffCodingUnit((ty * across + tx) as u32);
            let layout = d.image_coding_unit_layout(code).map_err(err)?;
            let (uw, uh) = (tw.min(w - tx * tw), th.min(h - ty * th));
            let (row, plane) = (uw * size, uw * uh * size);
            if layout.complete_len != plane * i.samples {
                return Err("internal: unexpected layout of a planar tile".into());
            }
            unit.clear();
            unit.resize(layout.complete_len + th * tw * size, 0);
            d.read_coding_unit_bytes(code, &mut unit).map_err(err)?;
            for c in 0..i.samples {
                for r in 0..uh {
                    let to = c * w * h * size + ((ty * th + r) * w + tx * tw) * size;
                    page[to..to + row].copy_from_slice(&unit[c * plane + r * row..][..row]);
                }
            }
        }
    }
    Ok(typed(page, i.ty))
}

/// Native-endian sample bytes as the crate's typed buffer.
fn typed(b: Vec<u8>, ty: Ty) -> DecodingResult {
    macro_rules! ne {
        ($t:ty, $n:expr, $f:expr) => {
            b.chunks_exact($n)
                .map(|c| {
                    let mut a = [0u8; $n];
                    a.copy_from_slice(c);
                    $f(<$t>::from_ne_bytes(a))
                })
                .collect()
        };
    }
    match ty {
        Ty::Bits(_) | Ty::U8 => DecodingResult::U8(b),
        Ty::I8 => DecodingResult::I8(b.into_iter().map(|v| v as i8).collect()),
        Ty::U16 => DecodingResult::U16(ne!(u16, 2, |v| v)),
        Ty::I16 => DecodingResult::I16(ne!(i16, 2, |v| v)),
        Ty::F16 => DecodingResult::F16(ne!(u16, 2, half::f16::from_bits)),
        Ty::U32 => DecodingResult::U32(ne!(u32, 4, |v| v)),
        Ty::I32 => DecodingResult::I32(ne!(i32, 4, |v| v)),
        Ty::F32 => DecodingResult::F32(ne!(f32, 4, |v| v)),
        Ty::U64 => DecodingResult::U64(ne!(u64, 8, |v| v)),
        Ty::I64 => DecodingResult::I64(ne!(i64, 8, |v| v)),
        Ty::F64 => DecodingResult::F64(ne!(f64, 8, |v| v)),
    }
}

/// How 8/16-bit pixels are interleaved.
enum Px {
    Grey,
    Rgb,
    Rgba,
}

/// An 8 or 16-bit sample.
trait Sub: Copy {
    const MAX: u32;
    fn get(self) -> u32;
    fn of(v: u32) -> Self;
}

impl Sub for u8 {
    const MAX: u32 = 255;
    fn get(self) -> u32 {
        self as u32
    }
    fn of(v: u32) -> Self {
        v.min(255) as u8
    }
}

impl Sub for u16 {
    const MAX: u32 = 65535;
    fn get(self) -> u32 {
        self as u32
    }
    fn of(v: u32) -> Self {
        v.min(65535) as u16
    }
}

/// 8/16-bit samples (`i.samples` of a pixel, interleaved or in planes) as interleaved grey, RGB,
/// or RGBA pixels. Grey, RGB and chunky RGBA are the decoded buffer itself, as before.
fn pixels<T: Sub>(v: Vec<T>, i: &Info) -> (Vec<T>, Px) {
    let n = i.width as usize * i.height as usize;
    let at = |p: usize, c: usize| {
        if i.planar {
            v[c * n + p]
        } else {
            v[p * i.samples + c]
        }
    };
    match i.model {
        Model::Grey if i.samples == 1 => (v, Px::Grey),
        Model::Grey => ((0..n).map(|p| at(p, 0)).collect(), Px::Grey),
        Model::Rgb if !i.planar && i.samples == 3 => (v, Px::Rgb),
        Model::Rgb if !i.planar && i.samples == 4 => (v, Px::Rgba),
        Model::Rgb => (
            (0..n)
                .flat_map(|p| (0..3).map(move |c| (p, c)))
                .map(|(p, c)| at(p, c))
                .collect(),
            Px::Rgb,
        ),
        Model::Cmyk => {
            let mut out = Vec::with_capacity(n * 3);
            for p in 0..n {
                let k = T::MAX - at(p, 3).get().min(T::MAX);
                for c in 0..3 {
                    let ink = T::MAX - at(p, c).get().min(T::MAX);
                    let v = (ink as u64 * k as u64 + T::MAX as u64 / 2) / T::MAX as u64;
                    out.push(T::of(v as u32));
                }
            }
            (out, Px::Rgb)
        }
        Model::YCbCr => {
            let mut out = Vec::with_capacity(n * 3);
            let half = (T::MAX + 1) as f32 / 2.0;
            for p in 0..n {
                let y = at(p, 0).get() as f32;
                let cb = at(p, 1).get() as f32 - half;
                let cr = at(p, 2).get() as f32 - half;
                for v in [
                    y + 1.402 * cr,
                    y - 0.344_136 * cb - 0.714_136 * cr,
                    y + 1.772 * cb,
                ] {
                    out.push(T::of(v.round().clamp(0.0, T::MAX as f32) as u32));
                }
            }
            (out, Px::Rgb)
        }
    }
}

/// Values (`i.samples` of a pixel, interleaved or in planes) as float32 planes of the kept
/// channels. `need`: the samples the buffer must hold.
fn float_planes<T: Copy>(
    v: &[T],
    i: &Info,
    need: usize,
    f: impl Fn(T) -> f32,
) -> Result<Page, String> {
    if v.len() < need {
        return Err("internal: the decoded samples do not fill the page".into());
    }
    let n = i.width as usize * i.height as usize;
    let keep = i.keep();
    let mut data = Vec::with_capacity(n * keep);
    for c in 0..keep {
        if i.planar {
            data.extend(v[c * n..][..n].iter().map(|&x| f(x)));
        } else {
            data.extend(v[c..].iter().step_by(i.samples).take(n).map(|&x| f(x)));
        }
    }
    Ok(Page::Values(FloatFrame {
        channels: keep,
        height: i.height,
        width: i.width,
        data,
    }))
}

/// Packed `bits`-bit grey samples (rows padded to whole bytes, first sample in the high bits) as
/// 8-bit pixels scaled onto 0..=255.
fn unpack(v: &[u8], w: usize, h: usize, bits: u8) -> Option<Vec<u8>> {
    let b = bits as usize;
    let stride = (w * b).div_ceil(8);
    if v.len() < stride * h || !(1..=7).contains(&b) {
        return None;
    }
    let mask = (1u16 << b) - 1;
    let mut out = Vec::with_capacity(w * h);
    for row in v.chunks_exact(stride).take(h) {
        for x in 0..w {
            let bit = x * b;
            let hi = row[bit / 8] as u16;
            let lo = row.get(bit / 8 + 1).copied().unwrap_or(0) as u16;
            let s = ((hi << 8 | lo) >> (16 - bit % 8 - b)) & mask;
            out.push(((s as u32 * 255 + mask as u32 / 2) / mask as u32) as u8);
        }
    }
    Some(out)
}
