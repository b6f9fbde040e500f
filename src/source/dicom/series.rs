//! DICOM series: the single-frame files of one series (same Series Instance UID) are one volume.
//!
//! `group` decides, from headers alone (`dicom::read_header`), which files form which series, in
//! which order, which files do not fit their series (and why), and which key the train/test split
//! groups them by; `decode_series` then decodes a series as one volume.
//!
//! Rules, per series:
//! - its files must share one class (sub-folder, `--labels` row or `--label-from` match): a series
//!   whose files carry several is left out whole, each file with the reason;
//! - the reference is the most common combination of Rows x Columns, pixel type (Samples per
//!   Pixel, Bits Allocated, Bits Stored, Pixel Representation, Photometric Interpretation), Pixel
//!   Spacing and Image Orientation (Patient) among its files (ties: the first file's by path); a
//!   file that differs from it is left out with the reason (spacing and orientation within
//!   `SPACING_TOL` and `ORIENT_TOL`);
//! - order: by Image Position (Patient) projected on the slice normal (the cross product of the
//!   row and column direction cosines), ascending, when every file has a position and an
//!   orientation; else by Instance Number, a file without one being left out. Files at the same
//!   position (within `SAME_POS_MM`) or with the same Instance Number are candidates for one slice:
//!   the first by path that decodes is used, the others are left out;
//! - by position, the gaps between slices must be even: within 1% of the median gap, or
//!   `SAME_POS_MM`, whichever is larger. An uneven series is left out with `--axis 0|1` (a
//!   resliced volume would be distorted); along axis 2 it converts slice by slice, with a note;
//! - at most `dicom::MAX_SAMPLES` samples (rows x columns x slices x samples per pixel); a colour
//!   series converts along axis 2 only.
//!
//! Multi-frame files, and files without a Series Instance UID, are decoded on their own as
//! before, and so is a series that keeps one file. The split key of a series (and of such a file)
//! is its PatientID, else its StudyInstanceUID, else its SeriesInstanceUID, else its own path; so a
//! patient's series all fall in the same split.

use super::{decode, min_max, SeriesHeader, MAX_SAMPLES};
use crate::source::nifti::{emit_float_view_slices, emit_view_slices};
use crate::source::volume;
use crate::source::{window_to_u16, DecodeOptions, Emit, Frame, Probe, Reject};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Two slice positions closer than this (mm, along the normal) are the same position.
pub const SAME_POS_MM: f64 = 0.01;
/// Slice gaps may differ from the median gap by this fraction of it.
pub const SPACING_REL_TOL: f64 = 0.01;
/// Pixel Spacing values may differ by this fraction.
pub const SPACING_TOL: f64 = 1e-3;
/// Direction cosines may differ by this much.
pub const ORIENT_TOL: f64 = 1e-3;

/// One DICOM file of a tree, with its class and header.
#[derive(Debug, Clone)]
pub struct Input {
    pub rel: String,
    pub path: PathBuf,
    pub class: String,
    pub header: SeriesHeader,
}

/// What a DICOM input's train/test split is decided by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SplitKey {
    PatientId,
    StudyUid,
    SeriesUid,
    Path,
}

impl SplitKey {
    /// As the manifest's provenance names it.
    pub fn name(self) -> &'static str {
        match self {
            SplitKey::PatientId => "PatientID",
            SplitKey::StudyUid => "StudyInstanceUID",
            SplitKey::SeriesUid => "SeriesInstanceUID",
            SplitKey::Path => "path",
        }
    }
}

/// One file of a series slice.
#[derive(Debug, Clone, PartialEq)]
pub struct SliceFile {
    pub rel: String,
    pub path: PathBuf,
    /// Its first Window Center/Width as (low, high).
    pub window: Option<(f64, f64)>,
}

/// How a series was put in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    Position,
    InstanceNumber,
}

/// A series to decode as one volume.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesPlan {
    pub uid: String,
    /// The slices in order; each holds the files at that position, by path (the first that
    /// decodes is used).
    pub slots: Vec<Vec<SliceFile>>,
    pub rows: u32,
    pub cols: u32,
    pub colour: bool,
    /// MONOCHROME1: high values are shown dark.
    pub invert: bool,
    pub order: Order,
    /// Where its voxels lie: x = columns (along a row: Image Orientation's first cosine), y =
    /// rows, z = the slices in order (along the normal when ordered by position; orientation
    /// unknown when ordered by Instance Number). Spacing: Pixel Spacing and the median gap.
    pub geometry: volume::Geometry,
    /// Each slice's position along the normal (mm) when ordered by position.
    pub positions: Option<Vec<f64>>,
}

impl SeriesPlan {
    pub fn files(&self) -> usize {
        self.slots.iter().map(Vec::len).sum()
    }

    /// What `decode_series` will emit, from the header alone: slices of the volume oriented and
    /// resampled as `opts` asks.
    pub fn probe(&self, opts: &DecodeOptions) -> Result<Probe, Reject> {
        let size = if self.colour {
            (self.rows, self.cols)
        } else {
            let g = self.geometry.target(opts.orientation, opts.spacing)?;
            let (h, w) = volume::slice_size(g.dims, opts.axis);
            (h as u32, w as u32)
        };
        Ok(Probe {
            colour: self.colour,
            size: Some(size),
            channels: None,
        })
    }
}

/// A unit of work from DICOM inputs.
#[derive(Debug, Clone)]
pub enum What {
    /// One file decoded on its own: multi-frame, without a Series Instance UID, or the only file
    /// left of its series.
    File {
        rel: String,
        path: PathBuf,
    },
    Series(SeriesPlan),
}

#[derive(Debug, Clone)]
pub struct Group {
    pub class: String,
    pub key: SplitKey,
    /// The key's value: the split is a hash of it.
    pub key_value: String,
    /// The first of its files by path (where it stands among the inputs).
    pub first: String,
    pub what: What,
}

#[derive(Debug, Default)]
pub struct Grouping {
    pub groups: Vec<Group>,
    /// (path, reason) of the files that do not fit their series.
    pub rejects: Vec<(String, String)>,
    /// Series that converted despite uneven spacing (along axis 2), one line each.
    pub uneven: Vec<String>,
}

/// The split key of files with these headers: the first PatientID, else StudyInstanceUID, else
/// SeriesInstanceUID among them, else `rel`.
fn split_key<'a>(
    headers: impl Iterator<Item = &'a SeriesHeader> + Clone,
    rel: &str,
) -> (SplitKey, String) {
    let pick = |f: fn(&SeriesHeader) -> &Option<String>| headers.clone().find_map(|h| f(h).clone());
    if let Some(v) = pick(|h| &h.patient_id) {
        (SplitKey::PatientId, v)
    } else if let Some(v) = pick(|h| &h.study_uid) {
        (SplitKey::StudyUid, v)
    } else if let Some(v) = pick(|h| &h.series_uid) {
        (SplitKey::SeriesUid, v)
    } else {
        (SplitKey::Path, rel.to_string())
    }
}

fn lone(i: Input) -> Group {
    let (key, key_value) = split_key(std::iter::once(&i.header), &i.rel);
    Group {
        class: i.class,
        key,
        key_value,
        first: i.rel.clone(),
        what: What::File {
            rel: i.rel,
            path: i.path,
        },
    }
}

/// Group `inputs` (in path order) into series; `axis` is the one the volumes will be cut along.
/// Groups come back in the order of their first files.
pub fn group(inputs: Vec<Input>, opts: &DecodeOptions) -> Grouping {
    let mut out = Grouping::default();
    let mut series: BTreeMap<String, Vec<Input>> = BTreeMap::new();
    for i in inputs {
        match &i.header.series_uid {
            Some(uid) if i.header.frames <= 1 => series.entry(uid.clone()).or_default().push(i),
            _ => out.groups.push(lone(i)),
        }
    }
    for (uid, files) in series {
        one_series(uid, files, opts, &mut out);
    }
    out.groups.sort_by(|a, b| a.first.cmp(&b.first));
    out
}

/// The attributes a series' files must share, as compared.
#[derive(Debug, Clone, PartialEq)]
struct Geometry {
    size: (u32, u32),
    pixel: (u32, u32, u32, u32, String),
    spacing: Option<[f64; 2]>,
    orientation: Option<[f64; 6]>,
}

impl Geometry {
    fn of(h: &SeriesHeader) -> Self {
        Geometry {
            size: (h.rows, h.cols),
            pixel: (
                h.samples_per_pixel,
                h.bits_allocated,
                h.bits_stored,
                h.pixel_representation,
                h.photometric.clone(),
            ),
            spacing: h.pixel_spacing,
            orientation: h.orientation,
        }
    }

    /// Why `self` does not fit the reference `r`, if it does not.
    fn misfit(&self, r: &Geometry) -> Option<String> {
        if self.size != r.size {
            return Some(format!(
                "Rows x Columns {}x{} differ from its series' {}x{}",
                self.size.0, self.size.1, r.size.0, r.size.1
            ));
        }
        if self.pixel != r.pixel {
            return Some(format!(
                "pixel type ({}) differs from its series' ({})",
                pixel_name(&self.pixel),
                pixel_name(&r.pixel)
            ));
        }
        let near = |a: &[f64], b: &[f64], tol: &dyn Fn(f64, f64) -> f64| {
            a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol(*x, *y))
        };
        match (self.spacing, r.spacing) {
            (Some(a), Some(b)) if near(&a, &b, &|x, y| SPACING_TOL * x.abs().max(y.abs())) => {}
            (None, None) => {}
            (a, b) => {
                return Some(format!(
                    "Pixel Spacing {} differs from its series' {}",
                    list(a.as_ref().map(|v| &v[..])),
                    list(b.as_ref().map(|v| &v[..]))
                ))
            }
        }
        match (self.orientation, r.orientation) {
            (Some(a), Some(b)) if near(&a, &b, &|_, _| ORIENT_TOL) => {}
            (None, None) => {}
            (a, b) => {
                return Some(format!(
                    "Image Orientation (Patient) {} differs from its series' {}",
                    list(a.as_ref().map(|v| &v[..])),
                    list(b.as_ref().map(|v| &v[..]))
                ))
            }
        }
        None
    }

    /// Equal for the vote on the reference (values rounded to their tolerances).
    fn vote_key(&self) -> String {
        let r =
            |v: &[f64], q: f64| -> Vec<i64> { v.iter().map(|x| (x / q).round() as i64).collect() };
        format!(
            "{:?} {:?} {:?} {:?}",
            self.size,
            self.pixel,
            self.spacing.map(|s| r(&s, 1e-3)),
            self.orientation.map(|o| r(&o, ORIENT_TOL))
        )
    }
}

fn pixel_name(p: &(u32, u32, u32, u32, String)) -> String {
    format!(
        "{} sample(s) per pixel, {} bits allocated, {} stored, {}, {}",
        p.0,
        p.1,
        p.2,
        if p.3 == 1 { "signed" } else { "unsigned" },
        if p.4.is_empty() {
            "no photometric interpretation"
        } else {
            &p.4
        }
    )
}

fn list(v: Option<&[f64]>) -> String {
    match v {
        None => "(absent)".into(),
        Some(v) => v
            .iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join("\\"),
    }
}

/// The slice normal of an Image Orientation (Patient): the cross product of its row and column
/// cosines. None unless they are unit vectors at a right angle (within 1%): positions cannot be
/// ordered along a degenerate normal.
fn normal(o: [f64; 6]) -> Option<[f64; 3]> {
    let (r, c) = ([o[0], o[1], o[2]], [o[3], o[4], o[5]]);
    let dot = |a: [f64; 3], b: [f64; 3]| a[0] * b[0] + a[1] * b[1] + a[2] * b[2];
    let unit = |a: [f64; 3]| (dot(a, a).sqrt() - 1.0).abs() <= 0.01;
    (unit(r) && unit(c) && dot(r, c).abs() <= 0.01).then(|| cross(r, c))
}

fn cross(a: [f64; 3], b: [f64; 3]) -> [f64; 3] {
    [
        a[1] * b[2] - a[2] * b[1],
        a[2] * b[0] - a[0] * b[2],
        a[0] * b[1] - a[1] * b[0],
    ]
}

fn one_series(uid: String, files: Vec<Input>, opts: &DecodeOptions, out: &mut Grouping) {
    // One label per volume.
    if let Some(why) = mixed_classes(&uid, &files) {
        reject_all(&files, &why, out);
        return;
    }
    // One file is no volume: it converts on its own, placed or not.
    if files.len() == 1 {
        let f = files.into_iter().next().expect("one file");
        out.groups.push(lone(f));
        return;
    }
    let geos: Vec<Geometry> = files.iter().map(|f| Geometry::of(&f.header)).collect();
    let reference = reference_geometry(&geos);
    let fit = fit_reference(&uid, files, &geos, &reference, out);
    let (order, keyed) = order_slices(&uid, fit, &reference, out);
    let slots = slots_of(keyed, order);
    if slots.is_empty() {
        return;
    }
    let all_files: Vec<Input> = slots.iter().flat_map(|(_, s)| s.iter().cloned()).collect();
    if all_files.len() == 1 {
        let f = all_files.into_iter().next().expect("one file");
        out.groups.push(lone(f));
        return;
    }
    let positions: Option<Vec<f64>> =
        (order == Order::Position).then(|| slots.iter().map(|s| s.0).collect());
    let geometry = series_geometry(&all_files[0].header, slots.len(), positions.as_deref());
    let reslices = reslices(&geometry, opts);
    let axis = opts.axis;
    if let Some(why) = not_a_volume(&uid, &reference, slots.len(), axis, reslices) {
        reject_all(&all_files, &why, out);
        return;
    }
    if order == Order::Position {
        if let Some(what) = uneven_spacing(&uid, &slots) {
            if reslices {
                let why = if opts.spacing.is_some() {
                    format!("{what}; --spacing resamples the volume, which needs it evenly spaced")
                } else {
                    format!("{what}; --axis {axis} needs an evenly spaced volume: in {} orientation it cuts across the series' slices (the axis along them converts slice by slice)", opts.orientation.name())
                };
                reject_all(&all_files, &why, out);
                return;
            }
            out.uneven.push(what);
        }
    }
    let colour = reference.pixel.0 >= 3;
    out.groups.push(series_group(
        uid, slots, all_files, colour, order, geometry, positions,
    ));
}

/// Whether cutting the series as `opts` asks needs every slice of it: slices across the stored
/// ones (after orientation), or a volume resampled.
fn reslices(g: &volume::Geometry, opts: &DecodeOptions) -> bool {
    g.reorient(opts.orientation).perm[opts.axis.min(2)] != 2 || opts.spacing.is_some()
}

/// Leave out every file of `files` with the reason `why`.
fn reject_all(files: &[Input], why: &str, out: &mut Grouping) {
    out.rejects
        .extend(files.iter().map(|f| (f.rel.clone(), why.to_string())));
}

/// Why a series cannot be one volume with one label: its files carry several classes.
fn mixed_classes(uid: &str, files: &[Input]) -> Option<String> {
    let mut classes: BTreeMap<&str, usize> = BTreeMap::new();
    for f in files {
        *classes.entry(&f.class).or_default() += 1;
    }
    if classes.len() > 1 {
        let list: Vec<String> = classes.iter().map(|(c, n)| format!("{c}: {n}")).collect();
        return Some(format!(
            "its series {uid} has files in {} classes ({}); a series is one volume with one label",
            classes.len(),
            list.join(", ")
        ));
    }
    None
}

/// The reference geometry: the most common, ties to the first file's.
fn reference_geometry(geos: &[Geometry]) -> Geometry {
    let mut votes: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for (i, g) in geos.iter().enumerate() {
        votes.entry(g.vote_key()).or_insert((0, i)).0 += 1;
    }
    let (_, first) = votes
        .values()
        .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
        .copied()
        .expect("a series has files");
    geos[first].clone()
}

/// The files whose geometry fits the reference; the others are left out with the reason.
fn fit_reference(
    uid: &str,
    files: Vec<Input>,
    geos: &[Geometry],
    reference: &Geometry,
    out: &mut Grouping,
) -> Vec<Input> {
    let mut fit = Vec::new();
    for (f, g) in files.into_iter().zip(geos) {
        match g.misfit(reference) {
            Some(why) => out.rejects.push((f.rel, format!("{why} (series {uid})"))),
            None => fit.push(f),
        }
    }
    fit
}

/// The files keyed by their place in the volume, sorted, and how: by position along the normal,
/// else by Instance Number (a file without one is left out).
fn order_slices(
    uid: &str,
    fit: Vec<Input>,
    reference: &Geometry,
    out: &mut Grouping,
) -> (Order, Vec<(f64, Input)>) {
    // Order: by position along the normal, else by Instance Number.
    let normal = reference.orientation.and_then(normal);
    let by_position = normal.is_some()
        && fit
            .iter()
            .all(|f| f.header.position.is_some() && f.header.orientation.is_some());
    let mut keyed: Vec<(f64, Input)> = Vec::new();
    let order = if let (true, Some(normal)) = (by_position, normal) {
        for f in fit {
            let p = f.header.position.expect("all have one");
            keyed.push((p[0] * normal[0] + p[1] * normal[1] + p[2] * normal[2], f));
        }
        Order::Position
    } else {
        for f in fit {
            match f.header.instance {
                Some(n) => keyed.push((n as f64, f)),
                None => out.rejects.push((
                    f.rel,
                    format!(
                        "no Instance Number, and not every file of its series {uid} has an Image Position and Orientation (Patient): its place in the volume is unknown"
                    ),
                )),
            }
        }
        Order::InstanceNumber
    };
    // Stable: files at one position stay in path order.
    keyed.sort_by(|a, b| a.0.total_cmp(&b.0));
    (order, keyed)
}

/// The sorted files gathered into slices: those at the same place share one.
fn slots_of(keyed: Vec<(f64, Input)>, order: Order) -> Vec<(f64, Vec<Input>)> {
    let same = |a: f64, b: f64| match order {
        Order::Position => (a - b).abs() <= SAME_POS_MM,
        Order::InstanceNumber => a == b,
    };
    let mut slots: Vec<(f64, Vec<Input>)> = Vec::new();
    for (k, f) in keyed {
        match slots.last_mut() {
            Some((k0, s)) if same(*k0, k) => s.push(f),
            _ => slots.push((k, vec![f])),
        }
    }
    slots
}

/// Why a series of `slices` cannot convert as one volume: too many samples, or colour resliced.
fn not_a_volume(
    uid: &str,
    reference: &Geometry,
    slices: usize,
    axis: usize,
    reslices: bool,
) -> Option<String> {
    let spp = reference.pixel.0 as u64;
    let total = reference.size.0 as u64 * reference.size.1 as u64 * spp * slices as u64;
    if total > MAX_SAMPLES {
        return Some(format!(
            "its series {uid} is too large: {} slices of {}x{}x{spp} = {total} samples (limit {MAX_SAMPLES})",
            slices,
            reference.size.0,
            reference.size.1
        ));
    }
    let colour = spp >= 3;
    if colour && reslices {
        return Some(format!(
            "its series {uid} is colour, not a volume: --axis {axis} reslices grey series only"
        ));
    }
    None
}

/// What is uneven about the gaps between the slices of a series ordered by position, if they
/// are (3 slices or more).
fn uneven_spacing(uid: &str, slots: &[(f64, Vec<Input>)]) -> Option<String> {
    if slots.len() < 3 {
        return None;
    }
    let gaps: Vec<f64> = slots.windows(2).map(|w| w[1].0 - w[0].0).collect();
    let mut sorted = gaps.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let tol = (SPACING_REL_TOL * median).max(SAME_POS_MM);
    let i = gaps.iter().position(|g| (g - median).abs() > tol)?;
    Some(format!(
        "uneven slice spacing in series {uid}: {:.4} mm between {} and {} where the series' spacing is {:.4} mm (tolerance 1%)",
        gaps[i], slots[i].1[0].rel, slots[i + 1].1[0].rel, median
    ))
}

/// The group of a series that converts as one volume: its plan, class and split key.
fn series_group(
    uid: String,
    slots: Vec<(f64, Vec<Input>)>,
    all_files: Vec<Input>,
    colour: bool,
    order: Order,
    geometry: volume::Geometry,
    positions: Option<Vec<f64>>,
) -> Group {
    let first = all_files
        .iter()
        .map(|f| f.rel.clone())
        .min()
        .expect("files");
    let (key, key_value) = split_key(all_files.iter().map(|f| &f.header), &first);
    let h = &all_files[0].header;
    let plan = SeriesPlan {
        geometry,
        positions,
        uid,
        rows: h.rows,
        cols: h.cols,
        colour,
        invert: h.photometric == "MONOCHROME1",
        order,
        slots: slots
            .into_iter()
            .map(|(_, mut s)| {
                s.sort_by(|a, b| a.rel.cmp(&b.rel));
                s.into_iter()
                    .map(|f| SliceFile {
                        rel: f.rel,
                        path: f.path,
                        window: f.header.window,
                    })
                    .collect()
            })
            .collect(),
    };
    Group {
        class: all_files[0].class.clone(),
        key,
        key_value,
        first,
        what: What::Series(plan),
    }
}

/// A series' voxel grid from its first file's header and its slices' positions along the normal.
fn series_geometry(h: &SeriesHeader, slices: usize, positions: Option<&[f64]>) -> volume::Geometry {
    let gap = positions.filter(|p| p.len() >= 2).map(|p| {
        let mut gaps: Vec<f64> = p.windows(2).map(|w| w[1] - w[0]).collect();
        gaps.sort_by(f64::total_cmp);
        gaps[gaps.len() / 2]
    });
    let axes = match (h.orientation, positions) {
        (Some(o), Some(_)) => normal(o).map(|n| {
            let unit = |v: [f64; 3]| {
                let l = (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt();
                v.map(|x| x / l)
            };
            [unit([o[0], o[1], o[2]]), unit([o[3], o[4], o[5]]), unit(n)]
        }),
        _ => None,
    };
    let ps = h.pixel_spacing;
    volume::Geometry {
        dims: [h.cols as usize, h.rows as usize, slices],
        axes,
        // Pixel Spacing is (between rows, between columns).
        spacing: [ps.map(|p| p[1]), ps.map(|p| p[0]), gap.filter(|g| *g > 0.0)],
    }
}

/// Files left out of a series, with their reasons: (path relative to the input, reason).
pub type LeftOut = Vec<(String, String)>;

/// Decode a series (see `series::group`) as one volume and emit its slices along `opts.axis`.
///
/// Grey series: each slice is decoded on its own (modality values after its own Rescale
/// Slope/Intercept) into a volume with x = columns, y = rows, z = the slices in order, which is
/// then cut as a multi-frame volume is (`emit_slices`, slice 0 on the top row for axes 0 and 1).
/// `opts.float`: the values as they are; else the window is `opts.window`, else the Window
/// Center/Width of the first slice, else the volume's min..max, the same for every slice;
/// MONOCHROME1 is inverted. Colour series (axis 2 only) emit each slice's image in order.
///
/// Where several files share a slice position, the first that decodes is used and the others
/// are left out. A file that cannot be decoded is left out with its reason; along axis 2 the rest
/// still converts, along axes 0 and 1 (which need every slice) the whole series is left out.
/// `Ok`: the files left out of a series that converted; `Err`: every file of a series that did
/// not, each with its reason.
pub fn decode_series(
    s: &SeriesPlan,
    opts: &DecodeOptions,
    emit: &mut Emit,
) -> Result<LeftOut, LeftOut> {
    let mut left: LeftOut = Vec::new();
    if opts.axis > 2 {
        return Err(leave_all(
            s,
            left,
            &format!("axis {} is not 0, 1 or 2", opts.axis),
        ));
    }
    if s.colour {
        return decode_colour_series(s, opts, emit);
    }
    let mut vol = match volume_for(s) {
        Ok(v) => v,
        Err(why) => return Err(leave_all(s, left, &why)),
    };
    let (slices, window) = match read_slices(s, opts, &mut vol, &mut left) {
        Ok(r) => r,
        Err(why) => return Err(leave_all(s, left, &why)),
    };
    if slices == 0 {
        return Ok(left);
    }
    match emit_volume(s, opts, &vol, slices, window, emit) {
        Ok(()) => Ok(left),
        Err(e) => Err(leave_all(
            s,
            left,
            &format!("its series {} could not be converted: {e}", s.uid),
        )),
    }
}

/// Every file not yet named gets `why`: the whole series is left out.
pub fn leave_all(s: &SeriesPlan, left: LeftOut, why: &str) -> LeftOut {
    let mut out = left;
    for f in s.slots.iter().flatten() {
        if !out.iter().any(|(r, _)| *r == f.rel) {
            out.push((f.rel.clone(), why.to_string()));
        }
    }
    out
}

/// Why a file is left out beside `used`, the file of its slice that decoded.
fn duplicate(s: &SeriesPlan, used: &str) -> String {
    format!(
        "same slice position as {used} in series {}, which is used",
        s.uid
    )
}

/// A colour series (axis 2 only): each slice's image in order, the first file of a slice that
/// decodes emitted.
fn decode_colour_series(
    s: &SeriesPlan,
    opts: &DecodeOptions,
    emit: &mut Emit,
) -> Result<LeftOut, LeftOut> {
    let mut left: LeftOut = Vec::new();
    if reslices(&s.geometry, opts) {
        return Err(leave_all(
            s,
            left,
            "a colour series is not a volume: --axis 0 and 1 reslice grey series only",
        ));
    }
    let one = DecodeOptions {
        axis: 2,
        ..opts.clone()
    };
    for slot in &s.slots {
        let mut used: Option<&str> = None;
        for f in slot {
            if let Some(u) = used {
                left.push((f.rel.clone(), duplicate(s, u)));
                continue;
            }
            // An error from `emit` is the conversion's, not this file's: it ends the series.
            let mut emit_failed = None;
            let r = decode(&f.path, &one, &mut |frame| {
                emit(frame).inspect_err(|e| emit_failed = Some(e.clone()))
            });
            if let Some(e) = emit_failed {
                return Err(leave_all(
                    s,
                    left,
                    &format!("its series {} could not be converted: {e}", s.uid),
                ));
            }
            match r {
                Ok(()) => used = Some(&f.rel),
                Err(r) => left.push((f.rel.clone(), r.0)),
            }
        }
    }
    Ok(left)
}

/// Room for a grey series' volume, or why there is none.
fn volume_for(s: &SeriesPlan) -> Result<Vec<f32>, String> {
    let (rows, cols) = (s.rows as usize, s.cols as usize);
    let total = (rows as u64) * (cols as u64) * (s.slots.len() as u64);
    if total > MAX_SAMPLES {
        return Err(format!(
            "series too large: {total} samples (limit {MAX_SAMPLES})"
        ));
    }
    let mut vol: Vec<f32> = Vec::new();
    if vol.try_reserve_exact(total as usize).is_err() {
        return Err(format!("cannot allocate a volume of {total} samples"));
    }
    Ok(vol)
}

/// Read each slice's modality values onto `vol` (the first file of a slice that decodes; the
/// others are left out): the slices read and the first one's window. Err: why the whole series
/// is left out (a slice missing where `opts.axis` reslices).
fn read_slices(
    s: &SeriesPlan,
    opts: &DecodeOptions,
    vol: &mut Vec<f32>,
    left: &mut LeftOut,
) -> Result<(usize, Option<(f64, f64)>), String> {
    let values = DecodeOptions {
        float: true,
        axis: 2,
        window: None,
        ..opts.clone()
    };
    let mut window = None;
    let mut slices = 0;
    for slot in &s.slots {
        let mut used: Option<&str> = None;
        for f in slot {
            if let Some(u) = used {
                left.push((f.rel.clone(), duplicate(s, u)));
                continue;
            }
            match read_slice(&f.path, &values, s.rows, s.cols) {
                Ok(v) => {
                    vol.extend_from_slice(&v);
                    if slices == 0 {
                        window = f.window;
                    }
                    slices += 1;
                    used = Some(&f.rel);
                }
                Err(r) => left.push((f.rel.clone(), r.0)),
            }
        }
        if used.is_none() && reslices(&s.geometry, opts) {
            let rel = &slot[0].rel;
            return Err(format!(
                "left out with its series {}: --axis {} reslices the whole volume and the slice of {rel} could not be decoded",
                s.uid, opts.axis
            ));
        }
    }
    Ok((slices, window))
}

/// Emit the volume's slices along `opts.axis`: float values, or through one window (the
/// options', else the first slice's, else the volume's min..max), MONOCHROME1 inverted.
fn emit_volume(
    s: &SeriesPlan,
    opts: &DecodeOptions,
    vol: &[f32],
    slices: usize,
    window: Option<(f64, f64)>,
    emit: &mut Emit,
) -> Result<(), Reject> {
    // Slices that could not be decoded (axis 2 only) are not in the volume.
    let geo = volume::Geometry {
        dims: [s.cols as usize, s.rows as usize, slices],
        ..s.geometry
    };
    let p = volume::prepare(vol, &geo, opts, false)?;
    if opts.float || opts.scan_values {
        emit_float_view_slices(&p.view(), opts.axis, emit)
    } else {
        let (low, high) = opts
            .window
            .or(window)
            .unwrap_or_else(|| min_max(vol.iter().map(|&v| v as f64)));
        let invert = s.invert;
        emit_view_slices(
            &p.view(),
            opts.axis,
            &|v| {
                let u = window_to_u16(v as f64, low, high);
                if invert {
                    65535 - u
                } else {
                    u
                }
            },
            emit,
        )
    }
}

/// The modality values of a single-frame grey file of `rows` x `cols`.
fn read_slice(
    path: &Path,
    values: &DecodeOptions,
    rows: u32,
    cols: u32,
) -> Result<Vec<f32>, Reject> {
    let mut out = None;
    decode(path, values, &mut |frame| {
        if out.is_some() {
            return Err(Reject::new("holds several frames, a slice of a series one"));
        }
        match frame {
            Frame::Float(f) if f.channels == 1 && (f.height, f.width) == (rows, cols) => {
                out = Some(f.data);
                Ok(())
            }
            Frame::Float(f) => Err(Reject::new(format!(
                "decodes to {}x{} with {} channel(s), its series is {rows}x{cols} grey",
                f.height, f.width, f.channels
            ))),
            Frame::Image(_) | Frame::Windowed(_) => {
                Err(Reject::new("not a grey image, its series is grey"))
            }
        }
    })?;
    out.ok_or_else(|| Reject::new("holds no image"))
}

#[cfg(test)]
mod tests;
