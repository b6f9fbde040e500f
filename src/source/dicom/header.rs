//! What a file says of its series, from its header alone: what `series::group` groups by.

use super::pixels::dicom_window;
use super::reject::guard;
use super::*;

/// What grouping files into series needs from one file's header (read up to the pixel data, see
/// `read_header`). Strings are trimmed; an empty value counts as absent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SeriesHeader {
    pub patient_id: Option<String>,
    pub study_uid: Option<String>,
    pub series_uid: Option<String>,
    /// Modality (0008,0060): CT, MR, PT, CR, ... (a dataset mixing them is refused unless asked).
    pub modality: Option<String>,
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
        let f = super::super::open_input(path)?;
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
pub(super) fn header_from_head(
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

pub(super) fn header_of(obj: &DefaultDicomObject) -> Result<SeriesHeader, Reject> {
    super::refuse_seg(obj)?;
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
        modality: text(tags::MODALITY),
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
