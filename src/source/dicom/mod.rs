//! DICOM Part 10 files: every frame of the pixel data becomes one image.
//!
//! Parsing and pixel decoding are dicom-rs (`dicom-object`, `dicom-pixeldata` with the pure-Rust
//! codecs only: uncompressed, deflated, RLE Lossless, the JPEG baseline / extended / lossless
//! family and JPEG 2000), with grey JPEG-LS and 12-bit lossy JPEG decoded in `codec` (colour
//! JPEG-LS and colour 12-bit JPEG are refused by name). JPEG XL and the video syntaxes are
//! rejected as unsupported transfer syntaxes.
//!
//! Grey images (MONOCHROME1/2): the stored samples go through the Modality LUT (Rescale Slope and
//! Intercept, per frame where the file has them per frame), then a linear window onto 0..=65535
//! with `window_to_u16`: `opts.window` if given, else the file's first Window Center/Width
//! (low = c - 0.5 - (w - 1)/2, high = c - 0.5 + (w - 1)/2, as PS3.3 C.11.2.1.2), else the frame's
//! own min..max. MONOCHROME1 is inverted so that high values are white. Each frame is emitted as
//! `ImageLuma16`. With `opts.axis` 0 or 1 a multi-frame grey image is treated as a volume (x =
//! columns, y = rows, z = frames) and cut across the frames instead: axis 0 gives one image per
//! column (`rows` wide, `frames` high), axis 1 one per row (`columns` wide, `frames` high), frame 0
//! on the top row; the window is then the same for the whole volume (its min..max when neither
//! the options nor the file give one).
//!
//! With `opts.float` grey images are emitted as float frames of their modality values (after
//! Rescale Slope/Intercept) with no window and no MONOCHROME1 inversion (which only changes how
//! values are shown); volumes are cut as above.
//!
//! Colour images (RGB, and YBR_FULL stored uncompressed; compressed YBR data is converted to RGB
//! by its codec) are emitted without any LUT as `ImageRgb8`, or `ImageRgb16` when 16 bits are
//! allocated (samples shifted up so Bits Stored fills 16 bits).
//!
//! Series: `read_header` reads what `series::group` needs to group single-frame files into series
//! (up to the pixel data only); `decode_series` decodes one series as a volume.
//!
//! Robustness: before dicom-rs sees the bytes, a header walk checks that no element declares more
//! bytes than the file still holds (so a corrupt length never turns into a multi-gigabyte
//! allocation, and a truncated file is named as such); image sizes are checked (each side
//! 1..=65535, at most 2^30 samples in all) before pixel data is decoded; every dicom-rs call runs
//! under `catch_unwind` so that a panic on hostile bytes becomes a `Reject`.

mod codec;
mod header;
pub mod labels;
mod pixels;
mod reject;
mod scan;
pub mod series;

use super::nifti::{emit_float_slices, emit_slices};
use super::{window_to_u16, DecodeOptions, Emit, FloatFrame, Frame, Probe, Reject};
use dicom_core::header::HasLength;
use dicom_dictionary_std::tags;
use dicom_object::file::ReadPreamble;
use dicom_object::{DefaultDicomObject, OpenFileOptions};
use dicom_pixeldata::{
    DecodedPixelData, PhotometricInterpretation, PixelDecoder, PixelRepresentation,
    PlanarConfiguration, Rescale, WindowLevel,
};
pub use header::{read_header, SeriesHeader};
use image::{DynamicImage, ImageBuffer, Luma, Rgb};
pub(super) use pixels::min_max;
use pixels::{check_dimensions, check_jpeg_frames, check_rle_frames, dicom_window, SampleLayout};
use reject::{chain, guard, pixel_reject, read_reject};
use scan::{prescan, prescan_in};
use std::panic::AssertUnwindSafe;
use std::path::Path;

/// At most this many samples (rows x columns x frames x samples per pixel) per file.
pub const MAX_SAMPLES: u64 = 1 << 30;
/// Files larger than this are not read (2^30 samples of 32 bits, plus room for the rest).
const MAX_FILE_BYTES: u64 = (1 << 32) + (1 << 28);

pub fn decode(path: &Path, opts: &DecodeOptions, emit: &mut Emit) -> Result<(), Reject> {
    if opts.axis > 2 {
        return Err(Reject::new(format!("axis {} is not 0, 1 or 2", opts.axis)));
    }
    let len = std::fs::metadata(path)
        .map_err(|e| Reject::new(format!("cannot open: {e}")))?
        .len();
    if len > MAX_FILE_BYTES {
        return Err(Reject::new(format!(
            "DICOM file too large: {len} bytes (limit {MAX_FILE_BYTES})"
        )));
    }
    let bytes = super::read_input(path)?;
    decode_bytes(&bytes, opts, emit)
}

/// Decode a whole Part 10 file held in memory.
pub fn decode_bytes(bytes: &[u8], opts: &DecodeOptions, emit: &mut Emit) -> Result<(), Reject> {
    let scan = prescan(bytes)?;
    let obj = guard("reading DICOM", || {
        OpenFileOptions::new()
            .read_preamble(ReadPreamble::Never)
            .from_reader(&bytes[scan.start..])
    })?
    .map_err(|e| read_reject(&e, &scan.transfer_syntax))?;
    decode_object(&obj, opts, emit)
}

/// How much of a file is read to probe its header: first a little (headers are usually a few
/// KiB and pixel data comes last), then more where the header did not fit.
const PROBE_BYTES: [u64; 2] = [64 << 10, 4 << 20];

/// Colour and first image size from the data set up to the pixel data. A file larger than what is
/// read is parsed from its first bytes only, after the same header walk as a whole file with the
/// file's length as the bound: dicom-rs zero-fills what an element declares before it reads, so a
/// length beyond the file would cost that much memory.
pub fn probe(path: &Path, opts: &DecodeOptions) -> Result<Probe, Reject> {
    use std::io::Read;
    let len = std::fs::metadata(path)
        .map_err(|e| Reject::new(format!("cannot open: {e}")))?
        .len();
    let mut last = None;
    for limit in PROBE_BYTES {
        let f = super::open_input(path)?;
        let mut head = Vec::new();
        f.take(limit)
            .read_to_end(&mut head)
            .map_err(|e| Reject::new(format!("cannot read: {e}")))?;
        let whole = len <= limit;
        match probe_head(&head, whole, len, opts) {
            Ok(Some(p)) => return Ok(p),
            Ok(None) if whole => return Err(Reject::new("no image attributes (Rows, Columns)")),
            Err(r) if whole => return Err(r),
            Ok(None) => {}
            Err(r) => last = Some(r),
        }
    }
    Err(last.unwrap_or_else(|| Reject::new("the header is too large to probe")))
}

/// The data set of a file's first bytes (all of it when `whole`, else the first bytes of
/// `file_len`) up to its pixel data.
fn parse_head(head: &[u8], whole: bool, file_len: u64) -> Result<DefaultDicomObject, Reject> {
    let start = if whole {
        prescan(head)?.start
    } else {
        prescan_in(head, Some(file_len))?.start
    };
    guard("reading DICOM", || {
        OpenFileOptions::new()
            .read_preamble(ReadPreamble::Never)
            .read_until(tags::PIXEL_DATA)
            .from_reader(&head[start..])
    })?
    .map_err(|e| Reject::new(format!("cannot read the header: {}", chain(&e))))
}

/// Probe the first bytes of a file (all of it when `whole`); None when they end before Rows and
/// Columns.
fn probe_head(
    head: &[u8],
    whole: bool,
    file_len: u64,
    opts: &DecodeOptions,
) -> Result<Option<Probe>, Reject> {
    let obj = parse_head(head, whole, file_len)?;
    refuse_seg(&obj)?;
    let int = |tag| -> Option<u32> { obj.get(tag)?.to_int::<u32>().ok() };
    let (Some(rows), Some(cols)) = (int(tags::ROWS), int(tags::COLUMNS)) else {
        return Ok(None);
    };
    let frames = int(tags::NUMBER_OF_FRAMES).unwrap_or(1);
    let spp = int(tags::SAMPLES_PER_PIXEL).unwrap_or(1);
    // As `decode_object` emits them: frames, or cuts across the frames of a grey volume.
    let size = match opts.axis {
        0 if frames > 1 && spp == 1 => (frames, rows),
        1 if frames > 1 && spp == 1 => (frames, cols),
        _ => (rows, cols),
    };
    Ok(Some(Probe {
        colour: spp >= 3,
        size: Some(size),
        channels: None,
    }))
}

/// DICOM Segmentation Storage: segments as bit planes with their own frame layout, not an
/// image of the series. Read as an image it would give wrong pictures without a word.
const SEG_SOP_CLASS: &str = "1.2.840.10008.5.1.4.1.1.66.4";

/// A DICOM SEG object is refused by name: prep does not read its segments (yet).
pub(super) fn refuse_seg(obj: &DefaultDicomObject) -> Result<(), Reject> {
    let text = |tag| -> Option<String> {
        let s = obj.get(tag)?.to_str().ok()?;
        Some(s.trim_matches(|c: char| c == ' ' || c == '\0').to_string())
    };
    let sop = text(tags::SOP_CLASS_UID).unwrap_or_default();
    if sop == SEG_SOP_CLASS || text(tags::MODALITY).as_deref() == Some("SEG") {
        return Err(Reject::new(
            "a DICOM Segmentation (SEG) object: prep does not read DICOM SEG; export its segments \
             as a label volume (NIfTI, e.g. with dcmqi's segimage2itkimage) and convert them with \
             their scans in the MSD/nnU-Net layout (imagesTr/ + labelsTr/)",
        ));
    }
    Ok(())
}

fn decode_object(
    obj: &DefaultDicomObject,
    opts: &DecodeOptions,
    emit: &mut Emit,
) -> Result<(), Reject> {
    refuse_seg(obj)?;
    let ts = obj.meta().transfer_syntax().to_string();
    check_pixel_data(obj)?;
    check_dimensions(obj)?;
    check_jpeg_frames(obj, &ts)?;
    check_rle_frames(obj, &ts)?;
    codec::check_j2k_frames(obj, &ts)?;
    let native = codec::decode_to_native(obj, &ts)?;
    let obj = native.as_ref().unwrap_or(obj);
    let px = guard("decoding DICOM pixel data", || obj.decode_pixel_data())?
        .map_err(|e| pixel_reject(&e, &ts))?;

    let spp = px.samples_per_pixel();
    let pi = px.photometric_interpretation().clone();
    let layout = SampleLayout::of(&px)?;
    match (spp, &pi) {
        (1, PhotometricInterpretation::Monochrome1 | PhotometricInterpretation::Monochrome2) => {
            let invert = pi == PhotometricInterpretation::Monochrome1;
            emit_grey(&px, &layout, invert, opts, emit)
        }
        (3, PhotometricInterpretation::Rgb | PhotometricInterpretation::YbrFull) => {
            let ybr = pi == PhotometricInterpretation::YbrFull;
            emit_colour(&px, &layout, ybr, emit)
        }
        (1, other) | (3, other) => Err(Reject::new(format!(
            "unsupported photometric interpretation {} with {spp} sample(s) per pixel",
            other.as_str()
        ))),
        _ => Err(Reject::new(format!("unsupported Samples per Pixel {spp}"))),
    }
}

/// Refuse a data set without (integer) pixel data, naming float pixel data as such.
fn check_pixel_data(obj: &DefaultDicomObject) -> Result<(), Reject> {
    if obj.get(tags::PIXEL_DATA).is_none() {
        if obj.get(tags::FLOAT_PIXEL_DATA).is_some()
            || obj.get(tags::DOUBLE_FLOAT_PIXEL_DATA).is_some()
        {
            return Err(Reject::new(
                "float pixel data (7FE0,0008/0009) is not supported",
            ));
        }
        return Err(Reject::new("no pixel data (7FE0,0010): not an image"));
    }
    Ok(())
}

/// The bytes of frame `f`, or a reject saying how many the pixel data holds and needs.
fn frame_data<'p>(
    px: &'p DecodedPixelData,
    layout: &SampleLayout,
    f: usize,
) -> Result<&'p [u8], Reject> {
    let (rows, cols) = (px.rows() as usize, px.columns() as usize);
    let frames = px.number_of_frames() as usize;
    let spp = px.samples_per_pixel();
    guard("reading a DICOM frame", || px.frame_data(f as u32))?.map_err(|_| {
        Reject::new(format!(
            "truncated DICOM: pixel data holds {} bytes, {frames} frame(s) of {rows}x{cols}x{spp} samples of {} bits need {}",
            px.data().len(),
            px.bits_allocated(),
            frames * rows * cols * spp as usize * layout.bytes
        ))
    })
}

/// How a grey image's stored samples become output values: Modality LUT, window, inversion.
struct GreyLut {
    /// MONOCHROME1: high values are shown dark.
    invert: bool,
    rescales: Vec<Rescale>,
    /// The options' window, which overrides the file's.
    window: Option<(f64, f64)>,
    file_window: Option<Vec<WindowLevel>>,
}

impl GreyLut {
    /// Read the Rescale Slope/Intercept, and the Window Center/Width unless the options give one.
    fn read(px: &DecodedPixelData, invert: bool, opts: &DecodeOptions) -> Result<Self, Reject> {
        let rescales = guard("reading Rescale Slope/Intercept", || {
            px.rescale().map(|r| r.to_vec())
        })?
        .map_err(|e| Reject::new(format!("invalid DICOM rescale: {}", chain(&e))))?;
        let file_window = match opts.window {
            Some(_) => None,
            None => guard("reading Window Center/Width", || {
                px.window().map(|w| w.map(|w| w.to_vec()))
            })?
            .ok()
            .flatten(),
        };
        Ok(GreyLut {
            invert,
            rescales,
            window: opts.window,
            file_window,
        })
    }

    /// Frame `f`'s (slope, intercept): its own, else the first, else the identity.
    fn rescale(&self, f: usize) -> (f64, f64) {
        self.rescales
            .get(f)
            .or(self.rescales.first())
            .map(|r| (r.slope, r.intercept))
            .unwrap_or((1.0, 0.0))
    }

    /// Frame `f`'s window (low, high): the options', else the file's; None for min..max.
    fn window_for(&self, f: usize) -> Option<(f64, f64)> {
        if let Some(w) = self.window {
            return Some(w);
        }
        let w = self.file_window.as_ref()?;
        let w = w.get(f).or(w.first())?;
        dicom_window(w.center, w.width)
    }

    /// A modality value through the window onto 0..=65535, inverted for MONOCHROME1.
    fn to_u16(&self, v: f64, low: f64, high: f64) -> u16 {
        let u = window_to_u16(v, low, high);
        if self.invert {
            65535 - u
        } else {
            u
        }
    }
}

/// A grey image: its frames, or cuts across the frames of a volume.
fn emit_grey(
    px: &DecodedPixelData,
    layout: &SampleLayout,
    invert: bool,
    opts: &DecodeOptions,
    emit: &mut Emit,
) -> Result<(), Reject> {
    let lut = GreyLut::read(px, invert, opts)?;
    if px.number_of_frames() > 1 && opts.axis != 2 {
        return emit_grey_volume(px, layout, &lut, opts, emit);
    }
    emit_grey_frames(px, layout, &lut, opts, emit)
}

/// A multi-frame grey image as a volume, cut along `opts.axis`: float values, or through one
/// window for the whole volume.
fn emit_grey_volume(
    px: &DecodedPixelData,
    layout: &SampleLayout,
    lut: &GreyLut,
    opts: &DecodeOptions,
    emit: &mut Emit,
) -> Result<(), Reject> {
    let (rows, cols) = (px.rows() as usize, px.columns() as usize);
    let frames = px.number_of_frames() as usize;
    let vol = grey_volume(px, layout, lut)?;
    if opts.float || opts.scan_values {
        return emit_float_slices(&vol, [cols, rows, frames], opts.axis, emit);
    }
    let (low, high) = match lut.window_for(0) {
        Some(w) => w,
        None => min_max(vol.iter().map(|&v| v as f64)),
    };
    emit_slices(
        &vol,
        [cols, rows, frames],
        opts.axis,
        &|v| lut.to_u16(v as f64, low, high),
        emit,
    )
}

/// The modality values of every frame, in one volume.
fn grey_volume(
    px: &DecodedPixelData,
    layout: &SampleLayout,
    lut: &GreyLut,
) -> Result<Vec<f32>, Reject> {
    let (rows, cols) = (px.rows() as usize, px.columns() as usize);
    let frames = px.number_of_frames() as usize;
    // A volume: x = columns, y = rows, z = frames.
    let n = rows * cols * frames;
    let mut vol: Vec<f32> = Vec::new();
    vol.try_reserve_exact(n)
        .map_err(|_| Reject::new(format!("cannot allocate a volume of {n} samples")))?;
    for f in 0..frames {
        let (s, i) = lut.rescale(f);
        let data = frame_data(px, layout, f)?;
        vol.extend(layout.values(data).map(|v| (v as f64 * s + i) as f32));
    }
    Ok(vol)
}

/// Each frame of a grey image: float values, or windowed onto a 16-bit grey image.
fn emit_grey_frames(
    px: &DecodedPixelData,
    layout: &SampleLayout,
    lut: &GreyLut,
    opts: &DecodeOptions,
    emit: &mut Emit,
) -> Result<(), Reject> {
    let (rows, cols) = (px.rows() as usize, px.columns() as usize);
    for f in 0..px.number_of_frames() as usize {
        let data = frame_data(px, layout, f)?;
        let (s, i) = lut.rescale(f);
        if opts.float || opts.scan_values {
            let vals = layout
                .values(data)
                .map(|v| (v as f64 * s + i) as f32)
                .collect();
            emit(Frame::Float(FloatFrame::grey(
                cols as u32,
                rows as u32,
                vals,
            )))?;
            continue;
        }
        let (low, high) = match lut.window_for(f) {
            Some(w) => w,
            None => min_max(layout.values(data).map(|v| v as f64 * s + i)),
        };
        let out: Vec<u16> = layout
            .values(data)
            .map(|v| lut.to_u16(v as f64 * s + i, low, high))
            .collect();
        let img = ImageBuffer::<Luma<u16>, Vec<u16>>::from_raw(cols as u32, rows as u32, out)
            .ok_or_else(|| Reject::new("internal: frame size mismatch"))?;
        emit(DynamicImage::ImageLuma16(img).into())?;
    }
    Ok(())
}

/// Each frame of an RGB or YBR_FULL image as an RGB image.
fn emit_colour(
    px: &DecodedPixelData,
    layout: &SampleLayout,
    ybr: bool,
    emit: &mut Emit,
) -> Result<(), Reject> {
    let (rows, cols) = (px.rows() as usize, px.columns() as usize);
    let planar = px.planar_configuration() == PlanarConfiguration::PixelFirst;
    for f in 0..px.number_of_frames() as usize {
        let data = frame_data(px, layout, f)?;
        emit(colour_image(data, layout, ybr, planar, rows, cols)?.into())?;
    }
    Ok(())
}

/// One colour frame's samples (interleaved, or planar) as an 8- or 16-bit RGB image, YBR_FULL
/// converted to RGB.
fn colour_image(
    data: &[u8],
    layout: &SampleLayout,
    ybr: bool,
    planar: bool,
    rows: usize,
    cols: usize,
) -> Result<DynamicImage, Reject> {
    let n = rows * cols;
    let bits = layout.bits.min(16);
    let s: Vec<u32> = layout.unsigned_values(data).collect();
    let sample = |p: usize, c: usize| if planar { s[c * n + p] } else { s[3 * p + c] };
    let max = ((1u64 << bits) - 1) as f64;
    let rgb = |p: usize| -> [u32; 3] {
        let (a, b, c) = (sample(p, 0), sample(p, 1), sample(p, 2));
        if !ybr {
            return [a, b, c];
        }
        // PS3.3 C.7.6.3.1.2, YBR_FULL to RGB.
        let half = (max + 1.0) / 2.0;
        let (y, cb, cr) = (a as f64, b as f64 - half, c as f64 - half);
        let q = |v: f64| v.round().clamp(0.0, max) as u32;
        [
            q(y + 1.402 * cr),
            q(y - 0.344136 * cb - 0.714136 * cr),
            q(y + 1.772 * cb),
        ]
    };
    Ok(if layout.bytes == 1 {
        let out: Vec<u8> = (0..n).flat_map(|p| rgb(p).map(|v| v as u8)).collect();
        DynamicImage::ImageRgb8(
            ImageBuffer::<Rgb<u8>, Vec<u8>>::from_raw(cols as u32, rows as u32, out)
                .ok_or_else(|| Reject::new("internal: frame size mismatch"))?,
        )
    } else {
        let shift = 16 - bits;
        let out: Vec<u16> = (0..n)
            .flat_map(|p| rgb(p).map(|v| ((v << shift) & 0xFFFF) as u16))
            .collect();
        DynamicImage::ImageRgb16(
            ImageBuffer::<Rgb<u16>, Vec<u16>>::from_raw(cols as u32, rows as u32, out)
                .ok_or_else(|| Reject::new("internal: frame size mismatch"))?,
        )
    })
}

#[cfg(test)]
mod codec_tests;
#[cfg(test)]
pub(crate) mod tests;
