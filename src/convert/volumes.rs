//! What a plan's volumes (NIfTI files, DICOM series, MSD cases) say of their geometry, read from
//! headers before any voxel: the manifest's record of orientation and spacing, and the notes
//! that warn where slices would be distorted.

use super::units::{Plan, Unit};
use crate::source::nifti::{fourth_axis, Fourth};
use crate::source::volume::{Geometry, Orientation};
use crate::source::{DecodeOptions, FileKind};
use rayon::prelude::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// In-plane pixel sizes further apart than this fraction are not square.
const SQUARE_TOL: f64 = 0.01;

/// The volumes of a plan, as they will be cut.
pub(super) struct Volumes {
    count: usize,
    /// Stored axis codes ("RAS", "LPS", "unknown"...) and how many volumes have each.
    stored: BTreeMap<String, usize>,
    /// Voxel size of each volume after orientation (and `--spacing`), where known.
    spacing: Vec<[Option<f64>; 3]>,
    /// The first volume whose slices have pixels that are not square: its name and (column,
    /// row) size; and how many such volumes.
    oblong: Option<(String, (f64, f64))>,
    oblong_count: usize,
    /// 4-D NIfTI files whose 4th axis is taken as channels, and as time points.
    channels: usize,
    times: usize,
}

/// The geometry of every volume of the plan (headers only; a header that cannot be read is left
/// to the decoder to report). None when the plan holds no volume.
pub(super) fn survey(plan: &Plan, d: &DecodeOptions) -> Option<Volumes> {
    let units: Vec<&Unit> = plan.splits.values().flatten().collect();
    let found: Vec<(String, Geometry, Fourth)> = units
        .par_iter()
        .filter_map(|u| match u {
            Unit::File {
                kind: Some(FileKind::Nifti),
                path,
                rel,
                ..
            } => crate::source::nifti::grid(path)
                .ok()
                .map(|g| (rel.clone(), g.geometry, fourth_axis(&g, d.fourth))),
            Unit::Series { plan, name, .. } if !plan.colour => {
                Some((name.clone(), plan.geometry, Fourth::One))
            }
            Unit::Case { case, name, .. } => Some((name.clone(), case.geometry, Fourth::One)),
            _ => None,
        })
        .collect();
    if found.is_empty() {
        return None;
    }
    let mut v = Volumes {
        count: found.len(),
        stored: BTreeMap::new(),
        spacing: Vec::new(),
        oblong: None,
        oblong_count: 0,
        channels: 0,
        times: 0,
    };
    for (name, g, fourth) in &found {
        match fourth {
            Fourth::Channels(_) => v.channels += 1,
            Fourth::Time(_) => v.times += 1,
            Fourth::One => {}
        }
        *v.stored.entry(g.codes()).or_default() += 1;
        let Ok(t) = g.target(d.orientation, d.spacing) else {
            continue;
        };
        v.spacing.push(t.spacing);
        if let Some((c, r)) = t.slice_spacing(d.axis) {
            if (c - r).abs() > SQUARE_TOL * c.max(r) {
                v.oblong_count += 1;
                v.oblong.get_or_insert((name.clone(), (c, r)));
            }
        }
    }
    Some(v)
}

impl Volumes {
    /// Lines for the user: the orientations brought together, volumes without one, and
    /// slices whose pixels are not square.
    pub(super) fn notes(&self, d: &DecodeOptions) -> Vec<String> {
        let mut out = Vec::new();
        let listed: Vec<String> = self
            .stored
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let unknown = self.stored.get("unknown").copied().unwrap_or(0);
        match d.orientation {
            Orientation::Lps => out.push(format!(
                "volumes: {} (stored {}), brought to LPS before slicing along --axis {} ({}); --orientation stored keeps the stored axes",
                self.count,
                listed.join(", "),
                d.axis,
                ["sagittal", "coronal", "axial"][d.axis.min(2)]
            )),
            Orientation::Stored => out.push(format!(
                "volumes: {} (stored {}), cut along their stored axis {}",
                self.count,
                listed.join(", "),
                d.axis
            )),
        }
        if self.channels + self.times > 0 {
            out.push(format!(
                "volumes: 4-D files take their 4th axis as channels ({}) or time points ({}); --fourth-axis {} {}",
                self.channels,
                self.times,
                if self.channels > 0 { "time" } else { "channels" },
                if d.fourth == crate::source::volume::FourthAxis::Auto {
                    "to choose otherwise (auto: time points where the header gives a time step, else up to 4 volumes are channels)"
                } else {
                    "to choose otherwise"
                }
            ));
        }
        if unknown > 0 && d.orientation == Orientation::Lps {
            out.push(format!(
                "volumes: {unknown} without an orientation (a DICOM series placed by Instance Number, a NIfTI file whose affine has an axis of length 0) are cut as stored"
            ));
        }
        if let (Some((name, (c, r))), None) = (&self.oblong, d.spacing) {
            out.push(format!(
                "warning: the slices of {} have pixels that are not square (e.g. {name}: {c} mm wide x {r} mm high): --size and --fit treat pixels as square, so anatomy is stretched; --spacing {} resamples to square voxels first",
                super::folders::count(self.oblong_count, "volume"),
                c.min(*r)
            ));
        }
        out
    }

    /// The manifest's record: the orientation asked for, the stored ones, and the voxel size
    /// (one for all, else the range).
    pub(super) fn json(&self, d: &DecodeOptions) -> Value {
        let mut v = json!({
            "count": self.count,
            "orientation": d.orientation.name(),
            "stored_orientations": self.stored,
        });
        if let Some(s) = d.spacing {
            v["resampled_to"] = json!(s);
        }
        let known: Vec<[f64; 3]> = self
            .spacing
            .iter()
            .filter_map(|s| Some([s[0]?, s[1]?, s[2]?]))
            .collect();
        if let Some(first) = known.first() {
            let same = known
                .iter()
                .all(|s| (0..3).all(|k| (s[k] - first[k]).abs() <= 1e-3 * first[k].max(s[k])));
            if same {
                v["spacing"] = json!(first);
            } else {
                let lo = (0..3).map(|k| known.iter().map(|s| s[k]).fold(f64::INFINITY, f64::min));
                let hi = (0..3).map(|k| known.iter().map(|s| s[k]).fold(0.0, f64::max));
                v["spacing"] =
                    json!({"min": lo.collect::<Vec<_>>(), "max": hi.collect::<Vec<_>>()});
            }
        }
        v
    }
}

/// Whether the plan holds scans whose modality values a u16 target keeps (`DecodeOptions::
/// scan_values`): DICOM files and series, NIfTI files, MSD cases.
pub(super) fn has_scans(plan: &Plan) -> bool {
    plan.splits.values().flatten().any(|u| match u {
        Unit::File { kind, .. } => matches!(kind, Some(FileKind::Dicom | FileKind::Nifti)),
        Unit::Series { .. } | Unit::Case { .. } => true,
        _ => false,
    })
}
