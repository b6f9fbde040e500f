//! DICOM Part 10 files: every frame of the pixel data becomes one image.
//!
//! Parsing and pixel decoding are dicom-rs (`dicom-object`, `dicom-pixeldata` with the pure-Rust
//! codecs only: uncompressed, deflated, RLE Lossless and the JPEG baseline / extended / lossless
//! family). JPEG 2000, JPEG-LS, JPEG XL, HTJ2K and the video syntaxes are rejected as unsupported
//! transfer syntaxes.
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

use super::nifti::{emit_float_slices, emit_slices};
use super::{window_to_u16, DecodeOptions, Emit, FloatFrame, Frame, Probe, Reject};
use dicom_core::header::HasLength;
use dicom_dictionary_std::tags;
use dicom_object::file::ReadPreamble;
use dicom_object::{DefaultDicomObject, OpenFileOptions};
use dicom_pixeldata::{
    DecodedPixelData, PhotometricInterpretation, PixelDecoder, PixelRepresentation,
    PlanarConfiguration,
};
use image::{DynamicImage, ImageBuffer, Luma, Rgb};
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
    }))
}

fn decode_object(
    obj: &DefaultDicomObject,
    opts: &DecodeOptions,
    emit: &mut Emit,
) -> Result<(), Reject> {
    let ts = obj.meta().transfer_syntax().to_string();
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
    check_dimensions(obj)?;
    check_jpeg_frames(obj, &ts)?;
    check_rle_frames(obj, &ts)?;
    let px = guard("decoding DICOM pixel data", || obj.decode_pixel_data())?
        .map_err(|e| pixel_reject(&e, &ts))?;

    let (rows, cols) = (px.rows() as usize, px.columns() as usize);
    let frames = px.number_of_frames() as usize;
    let spp = px.samples_per_pixel();
    let pi = px.photometric_interpretation().clone();
    let layout = SampleLayout::of(&px)?;
    let frame = |f: usize| -> Result<&[u8], Reject> {
        guard("reading a DICOM frame", || px.frame_data(f as u32))?.map_err(|_| {
            Reject::new(format!(
                "truncated DICOM: pixel data holds {} bytes, {frames} frame(s) of {rows}x{cols}x{spp} samples of {} bits need {}",
                px.data().len(),
                px.bits_allocated(),
                frames * rows * cols * spp as usize * layout.bytes
            ))
        })
    };

    match (spp, &pi) {
        (1, PhotometricInterpretation::Monochrome1 | PhotometricInterpretation::Monochrome2) => {
            let invert = pi == PhotometricInterpretation::Monochrome1;
            let rescales = guard("reading Rescale Slope/Intercept", || {
                px.rescale().map(|r| r.to_vec())
            })?
            .map_err(|e| Reject::new(format!("invalid DICOM rescale: {}", chain(&e))))?;
            let rescale = |f: usize| {
                rescales
                    .get(f)
                    .or(rescales.first())
                    .map(|r| (r.slope, r.intercept))
                    .unwrap_or((1.0, 0.0))
            };
            let file_window = match opts.window {
                Some(_) => None,
                None => guard("reading Window Center/Width", || {
                    px.window().map(|w| w.map(|w| w.to_vec()))
                })?
                .ok()
                .flatten(),
            };
            let window_for = |f: usize| -> Option<(f64, f64)> {
                if let Some(w) = opts.window {
                    return Some(w);
                }
                let w = file_window.as_ref()?;
                let w = w.get(f).or(w.first())?;
                dicom_window(w.center, w.width)
            };
            let to_u16 = |v: f64, low: f64, high: f64| {
                let u = window_to_u16(v, low, high);
                if invert {
                    65535 - u
                } else {
                    u
                }
            };

            if frames > 1 && opts.axis != 2 {
                // A volume: x = columns, y = rows, z = frames.
                let n = rows * cols * frames;
                let mut vol: Vec<f32> = Vec::new();
                vol.try_reserve_exact(n)
                    .map_err(|_| Reject::new(format!("cannot allocate a volume of {n} samples")))?;
                for f in 0..frames {
                    let (s, i) = rescale(f);
                    let data = frame(f)?;
                    vol.extend(layout.values(data).map(|v| (v as f64 * s + i) as f32));
                }
                if opts.float {
                    return emit_float_slices(&vol, [cols, rows, frames], opts.axis, false, emit);
                }
                let (low, high) = match window_for(0) {
                    Some(w) => w,
                    None => min_max(vol.iter().map(|&v| v as f64)),
                };
                return emit_slices(
                    &vol,
                    [cols, rows, frames],
                    opts.axis,
                    false,
                    &|v| to_u16(v as f64, low, high),
                    emit,
                );
            }

            for f in 0..frames {
                let data = frame(f)?;
                let (s, i) = rescale(f);
                if opts.float {
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
                let (low, high) = match window_for(f) {
                    Some(w) => w,
                    None => min_max(layout.values(data).map(|v| v as f64 * s + i)),
                };
                let out: Vec<u16> = layout
                    .values(data)
                    .map(|v| to_u16(v as f64 * s + i, low, high))
                    .collect();
                let img =
                    ImageBuffer::<Luma<u16>, Vec<u16>>::from_raw(cols as u32, rows as u32, out)
                        .ok_or_else(|| Reject::new("internal: frame size mismatch"))?;
                emit(DynamicImage::ImageLuma16(img).into())?;
            }
            Ok(())
        }
        (3, PhotometricInterpretation::Rgb | PhotometricInterpretation::YbrFull) => {
            let ybr = pi == PhotometricInterpretation::YbrFull;
            let planar = px.planar_configuration() == PlanarConfiguration::PixelFirst;
            let n = rows * cols;
            let bits = layout.bits.min(16);
            for f in 0..frames {
                let data = frame(f)?;
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
                let img = if layout.bytes == 1 {
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
                };
                emit(img.into())?;
            }
            Ok(())
        }
        (1, other) | (3, other) => Err(Reject::new(format!(
            "unsupported photometric interpretation {} with {spp} sample(s) per pixel",
            other.as_str()
        ))),
        _ => Err(Reject::new(format!("unsupported Samples per Pixel {spp}"))),
    }
}

/// What grouping files into series needs from one file's header (read up to the pixel data, see
/// `read_header`). Strings are trimmed; an empty value counts as absent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SeriesHeader {
    pub patient_id: Option<String>,
    pub study_uid: Option<String>,
    pub series_uid: Option<String>,
    pub rows: u32,
    pub cols: u32,
    /// Number of Frames (1 when absent).
    pub frames: u32,
    pub samples_per_pixel: u32,
    pub bits_allocated: u32,
    pub bits_stored: u32,
    pub pixel_representation: u32,
    pub photometric: String,
    /// Pixel Spacing (row spacing, column spacing) in mm.
    pub pixel_spacing: Option<[f64; 2]>,
    /// Image Orientation (Patient): the row and column direction cosines.
    pub orientation: Option<[f64; 6]>,
    /// Image Position (Patient): the centre of the first pixel, in mm.
    pub position: Option<[f64; 3]>,
    pub instance: Option<i64>,
    /// The first Window Center/Width as (low, high), as `decode` would use it.
    pub window: Option<(f64, f64)>,
}

/// Read the header of a DICOM file up to its pixel data: the first 64 KiB, or 4 MiB when the pixel
/// data does not start within them. Never reads the pixels.
pub fn read_header(path: &Path) -> Result<SeriesHeader, Reject> {
    use std::io::Read;
    let len = std::fs::metadata(path)
        .map_err(|e| Reject::new(format!("cannot open: {e}")))?
        .len();
    for (i, limit) in PROBE_BYTES.into_iter().enumerate() {
        let whole = len <= limit;
        let last = i + 1 == PROBE_BYTES.len();
        let f = super::open_input(path)?;
        let mut head = Vec::new();
        f.take(limit)
            .read_to_end(&mut head)
            .map_err(|e| Reject::new(format!("cannot read: {e}")))?;
        match header_from_head(&head, whole, len, last) {
            Some(r) => return r,
            None => continue,
        }
    }
    Err(Reject::new("the header is larger than 4 MiB"))
}

/// The header from the first bytes of a file (all of it when `whole`); None to ask for more bytes.
/// `last`: no more will come, parse what there is.
fn header_from_head(
    head: &[u8],
    whole: bool,
    file_len: u64,
    last: bool,
) -> Option<Result<SeriesHeader, Reject>> {
    // dicom-rs ends a data set quietly where the bytes end between two elements, so a prefix is
    // only trusted once it holds the Pixel Data tag (little or big endian): the attributes that
    // grouping needs all come before it.
    let reached = head
        .windows(4)
        .any(|w| w == [0xE0, 0x7F, 0x10, 0x00] || w == [0x7F, 0xE0, 0x00, 0x10]);
    if !whole && !reached && !last {
        return None;
    }
    Some((|| {
        let obj = parse_head(head, whole, file_len)?;
        guard("reading the DICOM header", || header_of(&obj))?
    })())
}

fn header_of(obj: &DefaultDicomObject) -> Result<SeriesHeader, Reject> {
    let text = |tag| -> Option<String> {
        let s = obj.get(tag)?.to_str().ok()?;
        let s = s.trim_matches(|c: char| c == ' ' || c == '\0');
        (!s.is_empty()).then(|| s.to_string())
    };
    let int = |tag| -> Option<i64> { obj.get(tag)?.to_int::<i64>().ok() };
    let uint = |tag| int(tag).and_then(|v| u32::try_from(v).ok());
    let floats = |tag, n: usize| -> Option<Vec<f64>> {
        let v = obj.get(tag)?.to_multi_float64().ok()?;
        (v.len() >= n && v[..n].iter().all(|x| x.is_finite())).then_some(v)
    };
    let (Some(rows), Some(cols)) = (uint(tags::ROWS), uint(tags::COLUMNS)) else {
        return Err(Reject::new("no image attributes (Rows, Columns)"));
    };
    let window = match (
        floats(tags::WINDOW_CENTER, 1),
        floats(tags::WINDOW_WIDTH, 1),
    ) {
        (Some(c), Some(w)) => dicom_window(c[0], w[0]),
        _ => None,
    };
    Ok(SeriesHeader {
        patient_id: text(tags::PATIENT_ID),
        study_uid: text(tags::STUDY_INSTANCE_UID),
        series_uid: text(tags::SERIES_INSTANCE_UID),
        rows,
        cols,
        frames: uint(tags::NUMBER_OF_FRAMES).unwrap_or(1),
        samples_per_pixel: uint(tags::SAMPLES_PER_PIXEL).unwrap_or(1),
        bits_allocated: uint(tags::BITS_ALLOCATED).unwrap_or(0),
        bits_stored: uint(tags::BITS_STORED).unwrap_or(0),
        pixel_representation: uint(tags::PIXEL_REPRESENTATION).unwrap_or(0),
        photometric: text(tags::PHOTOMETRIC_INTERPRETATION).unwrap_or_default(),
        pixel_spacing: floats(tags::PIXEL_SPACING, 2).map(|v| [v[0], v[1]]),
        orientation: floats(tags::IMAGE_ORIENTATION_PATIENT, 6)
            .map(|v| [v[0], v[1], v[2], v[3], v[4], v[5]]),
        position: floats(tags::IMAGE_POSITION_PATIENT, 3).map(|v| [v[0], v[1], v[2]]),
        instance: int(tags::INSTANCE_NUMBER),
        window,
    })
}

/// The DICOM linear window (PS3.3 C.11.2.1.2.1) as the (low, high) that `window_to_u16` maps onto
/// 0 and 65535; `None` for a width below 1 (not a valid window).
fn dicom_window(center: f64, width: f64) -> Option<(f64, f64)> {
    if !center.is_finite() || !width.is_finite() || width < 1.0 {
        return None;
    }
    let half = (width - 1.0) / 2.0;
    Some((center - 0.5 - half, center - 0.5 + half))
}

pub(super) fn min_max(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values {
        if v.is_finite() {
            lo = lo.min(v);
            hi = hi.max(v);
        }
    }
    if lo > hi {
        (0.0, 0.0)
    } else {
        (lo, hi)
    }
}

/// How to read stored samples out of a frame's native bytes.
#[derive(Debug, Clone, Copy)]
struct SampleLayout {
    /// Bytes per sample: 1, 2 or 4.
    bytes: usize,
    /// Bits stored (1..=8 * bytes).
    bits: u32,
    /// Right shift that puts the high bit at `bits - 1`.
    shift: u32,
    signed: bool,
}

impl SampleLayout {
    fn of(px: &DecodedPixelData) -> Result<Self, Reject> {
        let ba = px.bits_allocated() as u32;
        let bytes = match ba {
            1 | 8 => 1, // 1-bit data comes expanded to one byte per sample (0 or 255)
            16 => 2,
            32 => 4,
            _ => return Err(Reject::new(format!("unsupported Bits Allocated {ba}"))),
        };
        let width = 8 * bytes as u32;
        let mut bits = px.bits_stored() as u32;
        if bits == 0 || bits > width || ba == 1 {
            bits = if ba == 1 { 8 } else { width };
        }
        let high = px.high_bit() as u32;
        let shift = if high < width && high + 1 >= bits {
            high + 1 - bits
        } else {
            0
        };
        Ok(SampleLayout {
            bytes,
            bits,
            shift,
            signed: px.pixel_representation() == PixelRepresentation::Signed,
        })
    }

    /// The raw samples (bits stored, shifted down), unsigned.
    fn unsigned_values<'a>(&self, data: &'a [u8]) -> impl Iterator<Item = u32> + 'a {
        let (bytes, shift) = (self.bytes, self.shift);
        let mask = if self.bits >= 32 {
            u32::MAX
        } else {
            (1u32 << self.bits) - 1
        };
        data.chunks_exact(bytes).map(move |c| {
            let raw = match bytes {
                1 => c[0] as u32,
                2 => u16::from_ne_bytes([c[0], c[1]]) as u32,
                _ => u32::from_ne_bytes([c[0], c[1], c[2], c[3]]),
            };
            (raw >> shift) & mask
        })
    }

    /// The stored values, sign-extended for Pixel Representation 1.
    fn values<'a>(&self, data: &'a [u8]) -> impl Iterator<Item = i64> + 'a {
        let (bits, signed) = (self.bits, self.signed);
        self.unsigned_values(data).map(move |u| {
            let u = u as i64;
            if signed && (u >> (bits - 1)) & 1 == 1 {
                u - (1i64 << bits)
            } else {
                u
            }
        })
    }
}

/// Rows, Columns, Number of Frames and Samples per Pixel, checked before any pixel data is decoded.
fn check_dimensions(obj: &DefaultDicomObject) -> Result<(), Reject> {
    let int = |tag, name: &str, required: bool| -> Result<Option<i64>, Reject> {
        match obj.get(tag) {
            None if required => Err(Reject::new(format!("missing {name}"))),
            None => Ok(None),
            Some(e) if e.is_empty() && !required => Ok(None),
            Some(e) => e.to_int::<i64>().map(Some).map_err(|_| {
                Reject::new(format!(
                    "invalid {name}: {:?}",
                    e.to_str().unwrap_or_default()
                ))
            }),
        }
    };
    let rows = int(tags::ROWS, "Rows", true)?.unwrap_or(0);
    let cols = int(tags::COLUMNS, "Columns", true)?.unwrap_or(0);
    let frames = int(tags::NUMBER_OF_FRAMES, "Number of Frames", false)?.unwrap_or(1);
    let spp = int(tags::SAMPLES_PER_PIXEL, "Samples per Pixel", false)?.unwrap_or(1);
    for (v, name) in [(rows, "Rows"), (cols, "Columns")] {
        if !(1..=65535).contains(&v) {
            return Err(Reject::new(format!("invalid image size: {name} = {v}")));
        }
    }
    if frames < 1 || !(1..=4).contains(&spp) {
        return Err(Reject::new(format!(
            "invalid image: Number of Frames = {frames}, Samples per Pixel = {spp}"
        )));
    }
    let total = (rows as u64) * (cols as u64) * (spp as u64);
    let total = total.saturating_mul(frames as u64);
    if total > MAX_SAMPLES {
        return Err(Reject::new(format!(
            "DICOM image too large: {frames} frame(s) of {rows}x{cols}x{spp} = {total} samples (limit {MAX_SAMPLES})"
        )));
    }
    Ok(())
}

/// The JPEG transfer syntaxes dicom-rs decodes (Baseline, Extended, Lossless 14 and 14 SV1).
const JPEG_SYNTAXES: [&str; 4] = [
    "1.2.840.10008.1.2.4.50",
    "1.2.840.10008.1.2.4.51",
    "1.2.840.10008.1.2.4.57",
    "1.2.840.10008.1.2.4.70",
];

/// For JPEG pixel data: every frame header (SOF) of the JPEG streams dicom-rs will decode must
/// describe the image the attributes declare (Columns x Rows, Samples per Pixel components, more
/// than 8 bits of precision exactly when 16 bits are allocated). dicom-rs sizes its buffer from
/// the attributes and copies each decoded JPEG into it unchecked: a larger JPEG (a colour JPEG in
/// a grey file, a bigger image) panics with an index out of range.
///
/// The streams are walked as dicom-rs and jpeg-decoder read them: the fragments concatenated, one
/// stream per frame from the start, the next beginning at the first FF D8 after an EOI; within a
/// stream, segments by their lengths, markers after garbage and fill bytes, entropy-coded data up
/// to the next marker that is not a stuffed 00 or a restart.
fn check_jpeg_frames(obj: &DefaultDicomObject, ts: &str) -> Result<(), Reject> {
    if !JPEG_SYNTAXES.contains(&ts) {
        return Ok(());
    }
    let Some(fragments) = obj
        .get(tags::PIXEL_DATA)
        .and_then(|e| e.value().fragments())
    else {
        return Ok(()); // native pixel data under a JPEG syntax: dicom-rs rejects it
    };
    let int = |tag| -> u64 {
        obj.get(tag)
            .and_then(|e| e.to_int::<u32>().ok())
            .unwrap_or(0) as u64
    };
    let (rows, cols) = (int(tags::ROWS), int(tags::COLUMNS));
    let spp = obj
        .get(tags::SAMPLES_PER_PIXEL)
        .and_then(|e| e.to_int::<u32>().ok())
        .unwrap_or(1) as u64;
    let bits = int(tags::BITS_ALLOCATED);
    let frames = obj
        .get(tags::NUMBER_OF_FRAMES)
        .and_then(|e| e.to_int::<u32>().ok())
        .unwrap_or(1)
        .max(1) as usize;
    let data: Vec<u8> = fragments.iter().flatten().copied().collect();
    let mut pos = 0;
    for frame in 0..frames {
        if frame > 0 {
            // dicom-rs: the next frame starts at the next SOI.
            match data[pos.min(data.len())..]
                .windows(2)
                .position(|w| w == [0xFF, 0xD8])
            {
                Some(i) => pos += i,
                None => return Ok(()),
            }
        }
        if data.get(pos..pos + 2) != Some(&[0xFF, 0xD8][..]) {
            return Ok(()); // jpeg-decoder fails on this frame: nothing is copied
        }
        pos += 2;
        loop {
            // The next marker: jpeg-decoder skips garbage before it and fill bytes (FF FF).
            while pos < data.len() && data[pos] != 0xFF {
                pos += 1;
            }
            while pos + 1 < data.len() && data[pos + 1] == 0xFF {
                pos += 1;
            }
            let Some(&m) = data.get(pos + 1) else {
                return Ok(()); // the stream ends: jpeg-decoder fails
            };
            pos += 2;
            let seg_len = || {
                data.get(pos..pos + 2)
                    .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
            };
            match m {
                0xD9 => break, // EOI
                0x00 | 0x01 | 0xD0..=0xD7 => {}
                0xD8 => return Ok(()), // a second SOI: jpeg-decoder fails
                0xC0..=0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF => {
                    let Some(h) = data.get(pos..pos + 8) else {
                        return Ok(());
                    };
                    let precision = h[2] as u64;
                    let height = u16::from_be_bytes([h[3], h[4]]) as u64;
                    let width = u16::from_be_bytes([h[5], h[6]]) as u64;
                    let comps = h[7] as u64;
                    let wide = precision > 8;
                    if (width, height, comps) != (cols, rows, spp) || wide != (bits == 16) {
                        return Err(Reject::new(format!(
                            "JPEG frame {frame} is {width}x{height} with {comps} component(s) of {precision} bits, the DICOM attributes declare {cols}x{rows} with {spp} sample(s) per pixel of {bits} bits allocated"
                        )));
                    }
                    pos += seg_len().unwrap_or(0);
                }
                0xDA => {
                    // SOS: its header, then entropy-coded data up to the next real marker.
                    pos += seg_len().unwrap_or(0);
                    while pos + 1 < data.len() {
                        if data[pos] == 0xFF && !matches!(data[pos + 1], 0x00 | 0xD0..=0xD7 | 0xFF)
                        {
                            break;
                        }
                        pos += 1;
                    }
                }
                _ => pos += seg_len().unwrap_or(0),
            }
        }
    }
    Ok(())
}

/// For RLE Lossless pixel data: each fragment (dicom-rs takes one per frame) must hold a 64-byte
/// RLE header with 1 to 15 segments, at least Samples per Pixel x bytes per sample of them, and
/// each of those must decode to at least Rows x Columns bytes. dicom-rs slices the header as the
/// segment count says and copies Rows x Columns bytes from every segment unchecked: a short
/// segment or a fragment shorter than its header panicked (the dicom fuzz target).
///
/// The decoded length is counted as dicom-rs's PackBits reader decodes: a header byte n in 0..=127
/// copies the next n + 1 bytes (fewer where the segment ends), -127..=-1 repeats the next byte
/// 1 - n times, -128 is nothing.
fn check_rle_frames(obj: &DefaultDicomObject, ts: &str) -> Result<(), Reject> {
    if ts != "1.2.840.10008.1.2.5" {
        return Ok(());
    }
    let Some(fragments) = obj
        .get(tags::PIXEL_DATA)
        .and_then(|e| e.value().fragments())
    else {
        return Ok(()); // native pixel data under the RLE syntax: dicom-rs rejects it
    };
    let int = |tag, default: u32| -> usize {
        obj.get(tag)
            .and_then(|e| e.to_int::<u32>().ok())
            .unwrap_or(default) as usize
    };
    let plane = int(tags::ROWS, 0) * int(tags::COLUMNS, 0);
    let segments = int(tags::SAMPLES_PER_PIXEL, 1) * (int(tags::BITS_ALLOCATED, 0) / 8);
    for (frame, f) in fragments.iter().enumerate() {
        let bad = |what: String| Reject::new(format!("RLE frame {frame}: {what}"));
        if f.len() < 64 {
            return Err(bad(format!(
                "{} bytes, shorter than the 64-byte RLE header",
                f.len()
            )));
        }
        let word =
            |i: usize| u32::from_le_bytes([f[4 * i], f[4 * i + 1], f[4 * i + 2], f[4 * i + 3]]);
        let n = word(0) as usize;
        if !(1..=15).contains(&n) || n < segments {
            return Err(bad(format!(
                "the RLE header declares {n} segment(s), {segments} needed (at most 15)"
            )));
        }
        let mut bounds: Vec<usize> = (1..=n).map(|i| word(i) as usize).collect();
        bounds.push(f.len());
        for s in 0..segments {
            // Ranges dicom-rs cannot take it reports itself.
            let Some(seg) = f.get(bounds[s]..bounds[s + 1]) else {
                continue;
            };
            let (mut at, mut out) = (0usize, 0usize);
            while at < seg.len() && out < plane {
                let h = seg[at] as i8;
                at += 1;
                if h >= 0 {
                    let take = (h as usize + 1).min(seg.len() - at);
                    out += take;
                    at += h as usize + 1;
                } else if h > -128 {
                    if at >= seg.len() {
                        break; // dicom-rs fails to read the byte to repeat
                    }
                    out += (1 - h as isize) as usize;
                    at += 1;
                }
            }
            if out < plane {
                return Err(bad(format!(
                    "segment {s} decodes to {out} bytes, Rows x Columns is {plane}"
                )));
            }
        }
    }
    Ok(())
}

/// Run a dicom-rs call, turning a panic into a `Reject`.
fn guard<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, Reject> {
    std::panic::catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Reject::new(format!("{what}: the decoder failed on this file ({msg})"))
    })
}

/// An error and its sources, "outer: inner: innermost" (snafu errors often repeat their source in
/// their message; repeats are dropped).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur = Some(e);
    while let Some(err) = cur {
        let s = err.to_string();
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
        cur = err.source();
    }
    parts.join(": ")
}

fn is_eof(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::UnexpectedEof {
                return true;
            }
        }
        let s = err.to_string().to_ascii_lowercase();
        if s.contains("unexpected end")
            || s.contains("failed to fill whole buffer")
            || s.contains("end of file")
        {
            return true;
        }
        cur = err.source();
    }
    false
}

fn read_reject(e: &dicom_object::ReadError, ts: &str) -> Reject {
    let text = chain(e);
    if is_eof(e) {
        return Reject::new(format!("truncated DICOM: {text}"));
    }
    if text.to_ascii_lowercase().contains("transfer syntax") {
        return Reject::new(format!(
            "unsupported transfer syntax {}: {text}",
            ts_label(ts)
        ));
    }
    Reject::new(format!("invalid DICOM: {text}"))
}

fn pixel_reject(e: &dicom_pixeldata::Error, ts: &str) -> Reject {
    let text = chain(e);
    let lower = text.to_ascii_lowercase();
    if lower.contains("unsupported transfersyntax") || lower.contains("unknown transfer syntax") {
        return Reject::new(format!("unsupported transfer syntax {}", ts_label(ts)));
    }
    if is_eof(e) {
        return Reject::new(format!("truncated DICOM pixel data: {text}"));
    }
    Reject::new(format!(
        "cannot decode DICOM pixel data ({}): {text}",
        ts_label(ts)
    ))
}

/// "UID (name)" for the transfer syntaxes one meets, "UID" otherwise.
fn ts_label(uid: &str) -> String {
    let name = match uid {
        "1.2.840.10008.1.2" => "Implicit VR Little Endian",
        "1.2.840.10008.1.2.1" => "Explicit VR Little Endian",
        "1.2.840.10008.1.2.1.98" => "Encapsulated Uncompressed",
        "1.2.840.10008.1.2.1.99" => "Deflated Explicit VR Little Endian",
        "1.2.840.10008.1.2.2" => "Explicit VR Big Endian",
        "1.2.840.10008.1.2.4.50" => "JPEG Baseline",
        "1.2.840.10008.1.2.4.51" => "JPEG Extended",
        "1.2.840.10008.1.2.4.57" | "1.2.840.10008.1.2.4.70" => "JPEG Lossless",
        "1.2.840.10008.1.2.4.80" | "1.2.840.10008.1.2.4.81" => "JPEG-LS",
        "1.2.840.10008.1.2.4.90" | "1.2.840.10008.1.2.4.91" => "JPEG 2000",
        "1.2.840.10008.1.2.4.92" | "1.2.840.10008.1.2.4.93" => "JPEG 2000 Part 2",
        "1.2.840.10008.1.2.4.94" | "1.2.840.10008.1.2.4.95" => "JPIP",
        "1.2.840.10008.1.2.4.100" | "1.2.840.10008.1.2.4.101" => "MPEG-2",
        "1.2.840.10008.1.2.4.102"
        | "1.2.840.10008.1.2.4.103"
        | "1.2.840.10008.1.2.4.104"
        | "1.2.840.10008.1.2.4.105"
        | "1.2.840.10008.1.2.4.106" => "MPEG-4",
        "1.2.840.10008.1.2.4.107" | "1.2.840.10008.1.2.4.108" => "HEVC",
        "1.2.840.10008.1.2.4.110" | "1.2.840.10008.1.2.4.111" | "1.2.840.10008.1.2.4.112" => {
            "JPEG XL"
        }
        "1.2.840.10008.1.2.4.201" | "1.2.840.10008.1.2.4.202" | "1.2.840.10008.1.2.4.203" => {
            "HTJ2K"
        }
        "1.2.840.10008.1.2.5" => "RLE Lossless",
        "1.2.840.10008.1.2.8.1" => "Deflated Image Frame Compression",
        _ => return uid.to_string(),
    };
    format!("{uid} ({name})")
}

/// What the header walk found.
struct Scan {
    /// Offset of "DICM" (128 with a preamble, 0 without).
    start: usize,
    transfer_syntax: String,
}

/// Walk the element headers of a Part 10 file without decoding values: find the file meta group's
/// transfer syntax and check that no element or item declares more bytes than remain in the file.
/// The walk reads headers by the same rules as dicom-rs (an unknown VR has the long form, as UN;
/// implicit VR comes from the standard dictionary; any undefined length other than encapsulated
/// pixel data opens a sequence), so it visits the headers dicom-rs will visit and never rejects a
/// file that dicom-rs would read. A deflated data set is walked inflated.
fn prescan(b: &[u8]) -> Result<Scan, Reject> {
    prescan_in(b, None)
}

/// `prescan` of `b`, or, with `file_len`, of the first bytes of a file that long: lengths are
/// checked against the file, and the walk stops where `b` ends. A deflated data set is not walked
/// then (its inflated length is unknown).
fn prescan_in(b: &[u8], file_len: Option<u64>) -> Result<Scan, Reject> {
    let total = file_len.map_or(b.len(), |l| {
        usize::try_from(l).unwrap_or(usize::MAX).max(b.len())
    });
    let start = if b.len() >= 132 && &b[128..132] == b"DICM" {
        128
    } else if b.len() >= 4 && &b[0..4] == b"DICM" {
        0
    } else {
        return Err(Reject::new(format!(
            "not a DICOM Part 10 file: no \"DICM\" marker at byte 128 ({} bytes)",
            b.len()
        )));
    };
    let trunc = |what: String| Reject::new(format!("truncated DICOM: {what}"));
    let mut pos = start + 4;
    let mut ts = String::new();
    // File meta group: always explicit VR little endian. dicom-rs reads it as its group length
    // (0002,0000) says: whole elements, of any group, until that many bytes are consumed, and the
    // data set starts after them. Without a group length (which dicom-rs refuses), it ends at the
    // first element of another group. A mutated tag in the group once made this walk start the
    // data set elsewhere than dicom-rs, which then zero-filled 1.5 GB (the dicom fuzz target).
    let group_len = match header(b, pos, Mode::ExplicitLe) {
        Some(h) if (h.group, h.elem, h.len) == (0x0002, 0x0000, Some(4)) => {
            b.get(pos + h.size..pos + h.size + 4).map(|v| {
                (
                    pos + h.size + 4,
                    u32::from_le_bytes([v[0], v[1], v[2], v[3]]) as usize,
                )
            })
        }
        _ => None,
    };
    loop {
        if let Some((from, len)) = group_len {
            if pos >= from && pos - from >= len {
                break;
            }
        }
        if pos == b.len() {
            return Err(trunc("the file ends inside the file meta group".into()));
        }
        let Some(h) = header(b, pos, Mode::ExplicitLe) else {
            return Err(trunc(format!("element header cut off at byte {pos}")));
        };
        if h.group != 0x0002 && group_len.is_none() {
            break;
        }
        let Some(len) = h.len else {
            return Err(Reject::new(
                "invalid DICOM: undefined length in the file meta group",
            ));
        };
        let rem = total - pos - h.size;
        if len > rem {
            return Err(trunc(format!(
                "{} at byte {pos} declares {len} bytes, {rem} remain",
                h.tag_name()
            )));
        }
        if (h.group, h.elem) == (0x0002, 0x0010) {
            let Some(v) = b.get(pos + h.size..pos + h.size + len) else {
                return Err(Reject::new(
                    "the file meta group is longer than the bytes read",
                ));
            };
            ts = String::from_utf8_lossy(v)
                .trim_end_matches(['\0', ' '])
                .to_string();
        }
        pos += h.size + len;
    }
    if ts.is_empty() {
        return Err(Reject::new(
            "invalid DICOM: no Transfer Syntax UID (0002,0010) in the file meta group",
        ));
    }
    let done = |ts: String| {
        Ok(Scan {
            start,
            transfer_syntax: ts,
        })
    };
    let mode = match ts.as_str() {
        "1.2.840.10008.1.2" => Mode::ImplicitLe,
        "1.2.840.10008.1.2.2" => Mode::ExplicitBe,
        "1.2.840.10008.1.2.1.99" if file_len.is_some() => return done(ts),
        "1.2.840.10008.1.2.1.99" => {
            // Deflated: the data set is walked as dicom-rs will read it, inflated (raw deflate,
            // explicit VR little endian). dicom-rs zero-fills each element's declared length
            // before reading it, so a 530-byte file declaring 1.5 GB took 1.5 GB (the dicom fuzz
            // target). Where the stream is corrupt, only what inflates before the error counts.
            use std::io::Read;
            let mut inflated = Vec::new();
            let mut z = flate2::read::DeflateDecoder::new(&b[pos..]).take(MAX_FILE_BYTES + 1);
            let _ = z.read_to_end(&mut inflated);
            if inflated.len() as u64 > MAX_FILE_BYTES {
                return Err(Reject::new(format!(
                    "deflated DICOM data set inflates to more than {MAX_FILE_BYTES} bytes"
                )));
            }
            walk_data_set(&inflated, 0, Mode::ExplicitLe, inflated.len())
                .map_err(|r| Reject::new(format!("{} (in the inflated data set)", r.0)))?;
            return done(ts);
        }
        _ => Mode::ExplicitLe,
    };
    walk_data_set(b, pos, mode, total)?;
    done(ts)
}

/// Walk the data set in `b` from `pos`: every element, item and delimiter header must declare no
/// more bytes than remain of `total` (`b.len()`, or the file's length when `b` is its first bytes;
/// then the walk stops where `b` ends).
///
/// The walk is dicom-parser 0.10's `DataSetReader` without the values: the same states (element
/// level, sequence level, encapsulated fragments), the same sequence and item ends (a defined
/// length ends where dicom-rs's own count of bytes reaches it), and the same bytes consumed. It
/// must visit exactly the headers dicom-rs will, because dicom-rs allocates whatever a header
/// declares before reading: each place where the two once parted (a value shorter than its VR's
/// unit, an item header at element level) let a file of a few hundred bytes take gigabytes (the
/// dicom fuzz target). Where dicom-rs would stop with an error, the walk stops too, accepting:
/// dicom-rs then says what is wrong.
fn walk_data_set(b: &[u8], mut pos: usize, mode: Mode, total: usize) -> Result<(), Reject> {
    let prefix = total > b.len();
    let trunc = |what: String| Reject::new(format!("truncated DICOM: {what}"));
    // An open sequence or item: dicom-rs's `SeqToken`.
    struct Open {
        item: bool,
        pixel_data: bool,
        len: Option<usize>,
        /// dicom-rs's count of bytes where its content starts.
        base: usize,
    }
    let mut open: Vec<Open> = Vec::new();
    // dicom-rs's count of bytes read, which adds a value's declared length where it consumed
    // whole values only; `pos` is where the next bytes are really read.
    let mut count = pos;
    let mut in_sequence = false;
    let mut check_ends = false;
    let mut fragments_next = false;
    let mut offset_table_next = false;
    loop {
        if check_ends {
            match open.last() {
                Some(o) if o.len.is_some_and(|l| o.base + l == count) => {
                    in_sequence = o.item;
                    open.pop();
                    continue;
                }
                // dicom-rs: "inconsistent sequence end"
                Some(o) if o.len.is_some_and(|l| o.base + l < count) => return Ok(()),
                _ => check_ends = false,
            }
        }
        if pos >= b.len() || b.len() - pos < 4 {
            break; // dicom-rs ends the data set where a tag cannot be read
        }
        let fragment = open
            .last()
            .filter(|o| o.item && o.pixel_data)
            .map(|o| o.len);
        if in_sequence || fragments_next {
            // An item header: tag and length, in every transfer syntax.
            let Some(h) = header(b, pos, Mode::ExplicitLe).filter(|h| h.group == 0xFFFE) else {
                if header(b, pos, mode).is_none() && !prefix {
                    return Err(trunc(format!("item header cut off at byte {pos}")));
                }
                return Ok(()); // dicom-rs: not an item header, or the file ends
            };
            let (size, len) = (8, h.len);
            if let Some(l) = len {
                let rem = total - pos - size;
                if l > rem {
                    return Err(trunc(format!(
                        "item at byte {pos} declares {l} bytes, {rem} remain"
                    )));
                }
            }
            let first = fragments_next;
            let pixel_data = first || open.last().is_some_and(|o| o.pixel_data);
            if first {
                if h.elem == 0xE00D {
                    return Ok(()); // dicom-rs: an item end where the offset table was expected
                }
                fragments_next = false;
                open.push(Open {
                    item: false,
                    pixel_data: true,
                    len: None,
                    base: count,
                });
            }
            pos += size;
            count += size;
            match h.elem {
                0xE000 => {
                    if open.is_empty() {
                        return Ok(()); // dicom-rs: an item header outside a sequence
                    }
                    in_sequence = false;
                    open.push(Open {
                        item: true,
                        pixel_data,
                        len,
                        base: count,
                    });
                    if len == Some(0) {
                        check_ends = true;
                    } else if first {
                        // The first item of encapsulated pixel data: the offset table.
                        offset_table_next = true;
                    }
                }
                0xE00D => {
                    open.pop();
                    in_sequence = true;
                    check_ends = true;
                }
                0xE0DD => {
                    open.pop();
                    in_sequence = false;
                    check_ends = true;
                }
                _ => return Ok(()), // dicom-rs: a bad item header
            }
            continue;
        }
        if let Some(len) = fragment {
            // A fragment's bytes (or the offset table's, read as whole 32-bit values).
            let Some(len) = len else {
                return Ok(()); // dicom-rs: an undefined item length
            };
            let n = if offset_table_next {
                len - len % 4
            } else {
                len
            };
            offset_table_next = false;
            pos += n;
            count += n;
            check_ends = true;
            continue;
        }
        // An element header.
        let Some(h) = header(b, pos, mode) else {
            if prefix {
                return Ok(()); // the bytes read end here, not the file
            }
            return Err(trunc(format!("element header cut off at byte {pos}")));
        };
        let rem = total - pos - h.size;
        if let Some(len) = h.len {
            if len > rem {
                let what = if h.group == 0xFFFE {
                    "item".to_string()
                } else {
                    h.tag_name()
                };
                return Err(trunc(format!(
                    "{what} at byte {pos} declares {len} bytes, {rem} remain"
                )));
            }
        }
        pos += h.size;
        count += h.size;
        if h.sq && h.group != 0xFFFE {
            in_sequence = true;
            open.push(Open {
                item: false,
                pixel_data: false,
                len: h.len,
                base: count,
            });
            check_ends = h.len == Some(0);
        } else if (h.group, h.elem) == (0xFFFE, 0xE00D) {
            if !open.is_empty() {
                in_sequence = true;
                open.pop();
                check_ends = true;
            }
        } else if (h.group, h.elem) == (0x7FE0, 0x0010) && h.len.is_none() {
            fragments_next = true;
        } else if let Some(len) = h.len {
            // A value: dicom-rs reads a binary VR as `len / unit` whole values and consumes
            // only those bytes, but counts all `len`.
            pos += len - len % h.unit;
            count += len;
            check_ends = true;
        } else {
            // Any other undefined length opens a sequence.
            in_sequence = true;
            open.push(Open {
                item: false,
                pixel_data: false,
                len: None,
                base: count,
            });
        }
    }
    if !prefix && (fragments_next || open.iter().any(|o| o.pixel_data)) {
        return Err(trunc(
            "the encapsulated pixel data ends without its sequence delimiter".into(),
        ));
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    ImplicitLe,
    ExplicitLe,
    ExplicitBe,
}

struct Header {
    group: u16,
    elem: u16,
    /// A sequence (VR SQ, explicit or from the dictionary).
    sq: bool,
    /// None: undefined length.
    len: Option<usize>,
    /// Header bytes.
    size: usize,
    /// The size of one value of the element's VR as dicom-rs reads it (1 for strings and bytes).
    unit: usize,
}

impl Header {
    fn tag_name(&self) -> String {
        format!("element ({:04X},{:04X})", self.group, self.elem)
    }
}

/// The element header at `pos`, read as dicom-rs reads it; None where the file ends inside it.
fn header(b: &[u8], pos: usize, mode: Mode) -> Option<Header> {
    use dicom_core::dictionary::{DataDictionary, DataDictionaryEntry};
    let be = mode == Mode::ExplicitBe;
    let at = |p: usize, n: usize| b.get(p..p + n);
    let u16_at = |p: usize| {
        at(p, 2).map(|s| {
            if be {
                u16::from_be_bytes([s[0], s[1]])
            } else {
                u16::from_le_bytes([s[0], s[1]])
            }
        })
    };
    let u32_at = |p: usize| {
        at(p, 4).map(|s| {
            let a = [s[0], s[1], s[2], s[3]];
            if be {
                u32::from_be_bytes(a)
            } else {
                u32::from_le_bytes(a)
            }
        })
    };
    let (group, elem) = (u16_at(pos)?, u16_at(pos + 2)?);
    let len = |l: u32| {
        if l == u32::MAX {
            None
        } else {
            Some(l as usize)
        }
    };
    // Items and delimiters have no VR in any transfer syntax.
    if group == 0xFFFE {
        return Some(Header {
            group,
            elem,
            sq: false,
            len: len(u32_at(pos + 4)?),
            size: 8,
            unit: 1,
        });
    }
    if mode == Mode::ImplicitLe {
        // As dicom-rs's implicit VR decoder: OW for pixel and overlay data, else the dictionary's
        // VR, else UN.
        let is_pixels = (group, elem) == (0x7FE0, 0x0010) || (group >> 8 == 0x60 && elem == 0x3000);
        let vr = if is_pixels {
            dicom_core::VR::OW
        } else {
            dicom_dictionary_std::StandardDataDictionary
                .by_tag(dicom_core::Tag(group, elem))
                .map_or(dicom_core::VR::UN, |e| e.vr().relaxed())
        };
        return Some(Header {
            group,
            elem,
            sq: vr == dicom_core::VR::SQ,
            len: len(u32_at(pos + 4)?),
            size: 8,
            unit: value_unit(vr.to_bytes()),
        });
    }
    let vr = at(pos + 4, 2)?;
    // The VRs with a 16-bit length (PS3.5 7.1.2); dicom-rs reads every other VR, unknown ones
    // included (as UN), with 2 reserved bytes and a 32-bit length.
    const SHORT: [&[u8; 2]; 21] = [
        b"AE", b"AS", b"AT", b"CS", b"DA", b"DS", b"DT", b"FL", b"FD", b"IS", b"LO", b"LT", b"PN",
        b"SH", b"SL", b"SS", b"ST", b"TM", b"UI", b"UL", b"US",
    ];
    if SHORT.iter().any(|s| &s[..] == vr) {
        Some(Header {
            group,
            elem,
            sq: false,
            len: Some(u16_at(pos + 6)? as usize),
            size: 8,
            unit: value_unit([vr[0], vr[1]]),
        })
    } else {
        Some(Header {
            group,
            elem,
            sq: vr == b"SQ",
            len: len(u32_at(pos + 8)?),
            size: 12,
            unit: value_unit([vr[0], vr[1]]),
        })
    }
}

/// The bytes of one value of a VR as dicom-parser's `read_value` reads it: binary VRs are read as
/// arrays of whole values; strings, bytes and unknown VRs (read as UN) byte by byte.
fn value_unit(vr: [u8; 2]) -> usize {
    match &vr {
        b"US" | b"SS" | b"OW" => 2,
        b"AT" | b"FL" | b"OF" | b"SL" | b"UL" | b"OL" => 4,
        b"FD" | b"OD" | b"SV" | b"UV" | b"OV" => 8,
        _ => 1,
    }
}

#[cfg(test)]
pub(crate) mod tests {
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

    fn dicom_with(s: &Spec, pixel: dicom_object::mem::InMemElement) -> Vec<u8> {
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
        // As a volume cut along x: column 1 of both frames, frame 0 on the top row.
        let cols = decode_float(&bytes, 0);
        assert_eq!(cols.len(), 4);
        assert_eq!((cols[1].width, cols[1].height), (3, 2));
        let want: Vec<f32> = [1, 5, 9, 13, 17, 21]
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
        assert_eq!(luma(&x[0]).get_pixel(0, 0)[0], 0);
        assert_eq!(luma(&x[3]).get_pixel(2, 1)[0], 65535);
        assert_eq!(
            luma(&x[1]).get_pixel(2, 1)[0],
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
            luma(&y[2]).get_pixel(1, 1)[0],
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

        // JPEG 2000: an encapsulated fragment the pure-Rust build cannot decode.
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
            .with_meta(FileMetaTableBuilder::new().transfer_syntax("1.2.840.10008.1.2.4.90"))
            .unwrap();
        let mut bytes = Vec::new();
        file.write_all(&mut bytes).unwrap();
        let e = decode_all(&bytes, &DecodeOptions::default()).unwrap_err();
        assert_eq!(
            e.0,
            "unsupported transfer syntax 1.2.840.10008.1.2.4.90 (JPEG 2000)"
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
                e.0.contains("truncated")
                    || e.0.contains("not a DICOM")
                    || e.0.contains("pixel data"),
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
        use super::super::series::{decode_series, Order, SeriesPlan, SliceFile};
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
}
