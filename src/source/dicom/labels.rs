//! A DICOM series' segmentation beside it: a label volume (NIfTI) over the whole series, or a
//! stack of mask images, one per slice file. Either is brought to the series' orientation (and
//! `--spacing`) by nearest voxel and cut along the same axis, so mask slice k lies on image
//! slice k, voxel for voxel.
//!
//! A label volume must lie on the series' voxels: after both are brought to LPS, the same
//! grid, the same axes (within about 1 degree) and the same voxel size (within 0.1%); its
//! values whole numbers from 0 to 65535. A stack holds one single-frame mask of Rows x Columns
//! per slice.

use super::series::SeriesPlan;
use crate::source::mask::{self, MaskFrame, MaskValues};
use crate::source::nifti::{self, emit_float_view_slices};
use crate::source::volume::{self, Geometry};
use crate::source::{DecodeOptions, Frame, Reject};
use std::path::Path;

/// Where a series' masks come from.
#[derive(Debug, Clone, Copy)]
pub enum Label<'a> {
    /// One label volume.
    Volume(&'a Path),
    /// A mask image for each slice, in the series' slice order.
    Stack(&'a [&'a Path]),
}

/// The series' mask slices, as `decode_series` cuts its images along `opts.axis`.
pub fn series_masks(
    s: &SeriesPlan,
    label: Label,
    opts: &DecodeOptions,
) -> Result<Vec<MaskFrame>, Reject> {
    let (vol, geo) = match label {
        Label::Volume(path) => volume_label(s, path, opts)?,
        Label::Stack(paths) => stack(s, paths)?,
    };
    let p = volume::prepare(&vol, &geo, opts, true)?;
    let mut out = Vec::new();
    emit_float_view_slices(&p.view(), opts.axis, &mut |f| {
        if let Frame::Float(f) = f {
            // Whole numbers in 0..=65535 (checked as read): exact as u16.
            let v: Vec<u16> = f.data.iter().map(|&x| x as u16).collect();
            let values = if v.iter().all(|&x| x < 256) {
                MaskValues::U8(v.into_iter().map(|x| x as u8).collect())
            } else {
                MaskValues::U16(v)
            };
            out.push(MaskFrame {
                width: f.width,
                height: f.height,
                values,
            });
        }
        Ok(())
    })?;
    Ok(out)
}

/// A NIfTI label volume checked against the series' geometry: its values and its geometry.
fn volume_label(
    s: &SeriesPlan,
    path: &Path,
    opts: &DecodeOptions,
) -> Result<(Vec<f32>, Geometry), Reject> {
    let grid = nifti::grid(path)?;
    if grid.volumes != 1 {
        return Err(Reject::new(format!(
            "is {}: a label volume is one 3-D volume",
            grid.shown()
        )));
    }
    let theirs = grid.geometry.target(opts.orientation, None)?;
    let ours = s.geometry.target(opts.orientation, None)?;
    if let Some(why) = volume::disagree(&ours, &theirs) {
        return Err(Reject::new(format!(
            "{why} of its DICOM series {} (both in {} orientation): a label volume must lie on the series' voxels",
            s.uid,
            opts.orientation.name()
        )));
    }
    let mut out = Vec::new();
    nifti::read_volumes(path, &mut |_, g, vol| {
        if let Some(i) = vol
            .iter()
            .position(|&v| !(v >= 0.0 && v.fract() == 0.0 && v <= 65535.0))
        {
            let d = g.dims;
            return Err(Reject::new(format!(
                "label value {} at voxel ({}, {}, {}) is not a whole number from 0 to 65535",
                vol[i],
                i % d[0],
                i / d[0] % d[1],
                i / (d[0] * d[1])
            )));
        }
        out = vol.to_vec();
        Ok(())
    })?;
    Ok((out, grid.geometry))
}

/// One mask image per slice, stacked as the series' volume is (columns, rows, slices).
fn stack(s: &SeriesPlan, paths: &[&Path]) -> Result<(Vec<f32>, Geometry), Reject> {
    if paths.len() != s.slots.len() {
        return Err(Reject::new(format!(
            "{} mask images for the {} slices of its series {}",
            paths.len(),
            s.slots.len(),
            s.uid
        )));
    }
    let (rows, cols) = (s.rows, s.cols);
    let mut vol: Vec<f32> = Vec::new();
    for p in paths {
        let frames =
            mask::read(p).map_err(|why| Reject::new(format!("mask {}: {}", p.display(), why.0)))?;
        let [m] = frames.as_slice() else {
            return Err(Reject::new(format!(
                "mask {} has {} frames, a slice's mask one",
                p.display(),
                frames.len()
            )));
        };
        if (m.height, m.width) != (rows, cols) {
            return Err(Reject::new(format!(
                "mask {} is {}x{}, its slice {rows}x{cols} (rows x columns)",
                p.display(),
                m.height,
                m.width
            )));
        }
        match &m.values {
            MaskValues::U8(v) => vol.extend(v.iter().map(|&x| x as f32)),
            MaskValues::U16(v) => vol.extend(v.iter().map(|&x| x as f32)),
        }
    }
    let geo = Geometry {
        dims: [cols as usize, rows as usize, paths.len()],
        ..s.geometry
    };
    Ok((vol, geo))
}
