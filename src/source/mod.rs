//! Sources for `prep convert`: one file per input kind.
//!
//! Two families:
//! - *array datasets* (IDX, CIFAR, NumPy) hold many samples of one shape in a few files, with their
//!   own train/test split where they have one;
//! - *file trees* (image folders, videos, DICOM, NIfTI) where every file is decoded on its own into
//!   one or more 2-D images (a TIFF stack's pages, a video's frames, a volume's slices), labelled by
//!   its class sub-folder, a labels CSV or a regex over its path (`tree`); except the single-frame
//!   DICOM files of one series, which are one volume (`series`).
//!
//! Every decoder hands out `Frame`s through an `Emit` callback, one at a time, so a long video or a
//! large volume never sits in memory whole; `transform` then turns each frame into a sample of the
//! target shape and dtype. A frame is an 8/16-bit `image::DynamicImage`, or, for float targets
//! (`DecodeOptions::float`), the source's values in its own units as planar float32.

pub mod cifar;
pub mod dicom;
pub mod idx;
pub mod images;
pub mod labels_csv;
pub mod mask;
pub mod meta;
pub mod msd;
pub mod nifti;
pub mod npy;
pub mod tiff;
pub mod transform;
pub mod tree;
pub mod video;
pub mod volume;

use image::DynamicImage;
use std::path::Path;

/// Why one input could not be used. It names no file: the caller adds the path when it reports
/// the rejection (in the rejects report, or in the error that stops the run).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Reject(pub String);

impl Reject {
    pub fn new(what: impl Into<String>) -> Self {
        Reject(what.into())
    }
}

/// Open an input file, which must be a regular file or a link to one (`crate::store::local::open`: a
/// FIFO, device or socket is refused at once rather than read). The reason leaves out the path,
/// which the caller's report adds.
pub fn open_input(path: &Path) -> Result<std::fs::File, Reject> {
    crate::store::local::open(path).map_err(|e| match e {
        crate::Error::Io { cause, .. } => Reject::new(cause.to_string()),
        e => Reject::new(e.to_string()),
    })
}

/// An input file's whole contents, through [`open_input`]; callers bound its size first.
pub fn read_input(path: &Path) -> Result<Vec<u8>, Reject> {
    use std::io::Read;
    let mut out = Vec::new();
    open_input(path)?
        .read_to_end(&mut out)
        .map_err(|e| Reject::new(format!("cannot read: {e}")))?;
    Ok(out)
}

/// One decoded 2-D image.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// Integer pixels (8 or 16 bits, grey or colour), as the `image` crate holds them.
    Image(DynamicImage),
    /// Values in the source's own units (modality units, NIfTI after scaling, float arrays):
    /// `DynamicImage` has no single-channel float variant, and no window is applied.
    Float(FloatFrame),
    /// Planes already windowed onto 0..=65535, of any channel count (a multi-channel volume's
    /// modalities for an integer target: `DynamicImage` has no 2- or 4-channel grey).
    Windowed(FloatFrame),
}

impl From<DynamicImage> for Frame {
    fn from(img: DynamicImage) -> Self {
        Frame::Image(img)
    }
}

impl Frame {
    /// The image of a `Frame::Image` (decoder tests).
    #[cfg(test)]
    pub(crate) fn expect_image(self) -> DynamicImage {
        match self {
            Frame::Image(img) => img,
            Frame::Float(f) | Frame::Windowed(f) => panic!(
                "expected an image, got {}x{} float values",
                f.width, f.height
            ),
        }
    }

    /// (channels, (height, width)) as the source has them (colour counts 3: alpha is dropped).
    pub fn native(&self) -> (u8, (u32, u32)) {
        match self {
            Frame::Image(img) => (transform::native(img).0, (img.height(), img.width())),
            Frame::Float(f) => (if f.channels >= 3 { 3 } else { 1 }, (f.height, f.width)),
            Frame::Windowed(f) => (f.channels as u8, (f.height, f.width)),
        }
    }
}

/// Planar float32 values: `channels` planes of `height` x `width`, each row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct FloatFrame {
    pub channels: usize,
    pub height: u32,
    pub width: u32,
    pub data: Vec<f32>,
}

impl FloatFrame {
    /// One grey plane. `data` holds `width * height` values.
    pub fn grey(width: u32, height: u32, data: Vec<f32>) -> Self {
        debug_assert_eq!(data.len(), width as usize * height as usize);
        FloatFrame {
            channels: 1,
            height,
            width,
            data,
        }
    }
}

/// Receives decoded frames one by one. Returning an error stops the decoder, which must then
/// return that error.
pub type Emit<'a> = dyn FnMut(Frame) -> Result<(), Reject> + 'a;

/// Options that shape how files are decoded.
#[derive(Debug, Clone)]
pub struct DecodeOptions {
    /// Video: keep every Nth frame (1 = all); 4-D NIfTI time series: every Nth time point.
    pub every: u32,
    /// Video: sample frames at this rate (frames per second) instead of `every`.
    pub fps: Option<f64>,
    /// Volumes (NIfTI, multi-frame DICOM, DICOM series): slice along this axis of the volume (0 = x, 1 = y,
    /// 2 = z, the usual axial slices).
    pub axis: usize,
    /// Intensity window: DICOM uses its own Window Center/Width unless this overrides it;
    /// NIfTI, and TIFF pages of signed, 32/64-bit or float samples, use the `percentiles` window
    /// unless this overrides it. (low, high) in stored units after rescale slope/intercept.
    pub window: Option<(f64, f64)>,
    /// NIfTI (TIFF): the percentile window (low, high), in percent, over the whole volume's voxels
    /// (the whole file's values).
    pub percentiles: (f64, f64),
    /// Scans (DICOM grey images, NIfTI) and TIFF value pages: emit `Frame::Float` values in their
    /// own units (after rescale slope/intercept) with no window, for f16/f32 targets. Other kinds emit images either
    /// way, whose integer values a float target keeps.
    pub float: bool,
    /// Scans (DICOM grey images, NIfTI volumes, MSD cases): emit `Frame::Float` modality values
    /// with no window for a u16 target too (`transform::U16_OFFSET`). TIFF pages ignore it.
    pub scan_values: bool,
    /// Volumes: the orientation they are brought to before slicing (`volume`).
    pub orientation: volume::Orientation,
    /// 4-D NIfTI files in a tree: whether the 4th axis is channels or time points.
    pub fourth: volume::FourthAxis,
    /// Volumes: resample to this voxel size (mm along the oriented axes 0, 1, 2) before slicing.
    pub spacing: Option<[f64; 3]>,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions {
            every: 1,
            fps: None,
            axis: 2,
            window: None,
            percentiles: (0.5, 99.5),
            float: false,
            scan_values: false,
            fourth: volume::FourthAxis::Auto,
            orientation: volume::Orientation::Lps,
            spacing: None,
        }
    }
}

/// Map intensities in `[low, high]` linearly onto `0..=65535` (clamping outside), the rule every
/// scan decoder uses so that 16-bit output keeps the window's full precision and 8-bit output is
/// its top byte.
pub fn window_to_u16(v: f64, low: f64, high: f64) -> u16 {
    if !(high > low) {
        return if v >= high { 65535 } else { 0 };
    }
    let t = ((v - low) / (high - low)).clamp(0.0, 1.0);
    (t * 65535.0).round() as u16
}

/// What a file's header says about the images it will give, read without decoding pixels, so
/// that every input of a large tree can be looked at before the conversion picks its shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// The decoded images will be colour (RGB) rather than grey.
    pub colour: bool,
    /// (height, width) of its first image, where the header tells it cheaply.
    pub size: Option<(u32, u32)>,
    /// A volume whose 4th axis is channels (modalities): how many.
    pub channels: Option<u8>,
}

/// Kinds of single files a tree may hold, by extension (and content, for DICOM files without one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FileKind {
    Image,
    Tiff,
    Video,
    Dicom,
    Nifti,
}

impl FileKind {
    pub fn of(path: &Path) -> Option<FileKind> {
        let name = path.file_name()?.to_string_lossy().to_ascii_lowercase();
        let ext = name.rsplit('.').next().unwrap_or("");
        if name.ends_with(".nii") || name.ends_with(".nii.gz") {
            return Some(FileKind::Nifti);
        }
        match ext {
            "png" | "jpg" | "jpeg" | "bmp" | "gif" | "webp" => Some(FileKind::Image),
            "tif" | "tiff" => Some(FileKind::Tiff),
            "mp4" | "m4v" | "mov" | "webm" | "avi" | "mkv" | "mpg" | "mpeg" | "wmv" | "flv"
            | "ts" => Some(FileKind::Video),
            "dcm" | "dicom" => Some(FileKind::Dicom),
            _ if is_dicom_by_content(path) => Some(FileKind::Dicom),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FileKind::Image => "image",
            FileKind::Tiff => "tiff",
            FileKind::Video => "video",
            FileKind::Dicom => "dicom",
            FileKind::Nifti => "nifti",
        }
    }

    /// Decode one file of this kind, emitting its 2-D images in order.
    pub fn decode(self, path: &Path, opts: &DecodeOptions, emit: &mut Emit) -> Result<(), Reject> {
        match self {
            FileKind::Image => images::decode(path, emit),
            FileKind::Tiff => tiff::decode(path, opts, emit),
            FileKind::Video => video::decode(path, opts, emit),
            FileKind::Dicom => dicom::decode(path, opts, emit),
            FileKind::Nifti => nifti::decode(path, opts, emit),
        }
    }

    /// Look at one file of this kind from its header (videos: through ffprobe), without
    /// decoding its pixels.
    pub fn probe(self, path: &Path, opts: &DecodeOptions) -> Result<Probe, Reject> {
        match self {
            FileKind::Image => images::probe(path),
            FileKind::Tiff => tiff::probe(path),
            FileKind::Video => video::probe(path),
            FileKind::Dicom => dicom::probe(path, opts),
            FileKind::Nifti => nifti::probe(path, opts),
        }
    }
}

/// A DICOM Part 10 file has "DICM" at offset 128.
fn is_dicom_by_content(path: &Path) -> bool {
    use std::io::Read;
    let mut b = [0u8; 132];
    open_input(path).is_ok_and(|mut f| f.read_exact(&mut b).is_ok()) && &b[128..132] == b"DICM"
}
