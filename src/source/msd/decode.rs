//! One case into samples: every slice along the axis is one sample of C channels (each channel
//! windowed or kept in its units as the NIfTI source does for one volume) with its label slice
//! as the mask, brought to the target size by the image's placement with nearest sampling.
//!
//! Memory: the label volume (float32 while it is read and checked, then u16 slices), one channel
//! volume at a time (float32, with the percentile window's scratch copy of its finite voxels)
//! and the case's samples and masks as stored: about 10 bytes a voxel of one channel beside the
//! output, never every channel's volume at once.

use super::{Case, CaseFile};
use crate::format::shard::Dtype;
use crate::source::nifti::{self, Grid};
use crate::source::transform::{fit_mask, to_sample, Target};
use crate::source::volume;
use crate::source::{window_to_u16, DecodeOptions, Frame, Reject};

/// What every case is decoded against.
#[derive(Debug, Clone)]
pub struct CaseOptions {
    /// Channel names (dataset.json), for messages.
    pub channels: Vec<String>,
    /// Label values run 0 to labels - 1.
    pub labels: usize,
    /// The mask's dtype: u8 up to 256 labels, else u16.
    pub mask: Dtype,
    /// Leave out slices whose mask is all background (0).
    pub skip_empty: bool,
}

/// A case's samples: `n` of them, pixels in the target layout and masks (the mask dtype,
/// little-endian) one after the other.
#[derive(Debug, Default)]
pub struct Samples {
    pub n: usize,
    pub px: Vec<u8>,
    pub masks: Vec<u8>,
    /// Slices left out for an all-background mask.
    pub skipped: usize,
    /// The slice (along the axis) each sample is.
    pub slices: Vec<usize>,
}

/// Why a case gave no samples: the file at fault (relative to the dataset) and the reason.
pub type CaseReject = (String, Reject);

/// Decode case `case` into samples of target `t`: its label volume first (every value checked),
/// then each channel volume into its plane of every kept sample.
pub fn decode_case(
    case: &Case,
    o: &CaseOptions,
    t: &Target,
    d: &DecodeOptions,
) -> Result<Samples, CaseReject> {
    fn at(f: &CaseFile) -> impl Fn(Reject) -> CaseReject + '_ {
        move |r| (f.rel.clone(), r)
    }
    if d.axis > 2 {
        return Err(at(&case.label)(Reject::new(format!(
            "axis {} is not 0, 1 or 2",
            d.axis
        ))));
    }
    if t.channels as usize != o.channels.len() {
        return Err(at(&case.images[0])(Reject::new(format!(
            "internal: {} channels for a target of {}",
            o.channels.len(),
            t.channels
        ))));
    }
    let masks = read_label(case, o, d).map_err(at(&case.label))?;
    let kept: Vec<usize> = (0..masks.count)
        .filter(|&s| !o.skip_empty || masks.slice(s).iter().any(|&v| v != 0))
        .collect();
    let mut out = Samples {
        n: kept.len(),
        skipped: masks.count - kept.len(),
        slices: kept.clone(),
        ..Samples::default()
    };
    // Each kept slice's place among the samples.
    let mut place = vec![None; masks.count];
    for (j, &s) in kept.iter().enumerate() {
        place[s] = Some(j);
    }
    let sb = t.sample_bytes();
    let total = kept.len().checked_mul(sb).ok_or_else(|| {
        at(&case.images[0])(Reject::new("the case's samples overflow memory sizes"))
    })?;
    out.px.try_reserve_exact(total).map_err(|_| {
        at(&case.images[0])(Reject::new(format!(
            "cannot allocate {total} bytes for the case's samples"
        )))
    })?;
    out.px.resize(total, 0);
    for (k, f) in case.images.iter().enumerate() {
        read_channels(case, k, o, t, d, &place, &mut out.px).map_err(at(f))?;
    }
    for &s in &kept {
        let m = fit_mask(masks.slice(s), masks.w as u32, masks.h as u32, t);
        match o.mask {
            Dtype::U8 => out.masks.extend(m.iter().map(|&v| v as u8)),
            _ => out.masks.extend(m.iter().flat_map(|v| v.to_le_bytes())),
        }
    }
    Ok(out)
}

/// A label volume's slices, as the images' are cut.
struct Masks {
    count: usize,
    w: usize,
    h: usize,
    values: Vec<u16>,
}

impl Masks {
    fn slice(&self, s: usize) -> &[u16] {
        &self.values[s * self.w * self.h..][..self.w * self.h]
    }
}

/// The label volume, every value a whole number below the label count, brought to the images'
/// orientation and spacing (nearest voxel) and cut into slices.
fn read_label(case: &Case, o: &CaseOptions, d: &DecodeOptions) -> Result<Masks, Reject> {
    let axis = d.axis;
    let target = case.geometry.target(d.orientation, d.spacing)?;
    let (h, w) = volume::slice_size(target.dims, axis);
    let count = target.dims[axis];
    let mut masks = Masks {
        count,
        w,
        h,
        values: Vec::new(),
    };
    nifti::read_volumes(&case.label.path, &mut |_, g, vol| {
        same_grid(g, case, 1)?;
        check_labels(vol, g.dims, o.labels)?;
        let p = volume::prepare(vol, &case.geometry, d, true)?;
        let n = p.geometry.dims.iter().product::<usize>();
        masks
            .values
            .try_reserve_exact(n)
            .map_err(|_| Reject::new(format!("cannot allocate {n} label values")))?;
        nifti::emit_float_view_slices(&p.view(), axis, &mut |f| {
            if let Frame::Float(f) = f {
                // Whole numbers below the label count (checked above): exact as u16.
                masks.values.extend(f.data.iter().map(|&v| v as u16));
            }
            Ok(())
        })
    })?;
    Ok(masks)
}

/// The file's grid is the case's (its headers said so when the case was planned; a file that
/// changed since is caught here).
fn same_grid(g: Grid, case: &Case, volumes: usize) -> Result<(), Reject> {
    if g.dims != case.grid || g.volumes != volumes {
        let [x, y, z] = case.grid;
        return Err(Reject::new(format!(
            "is {}, but the case's volumes are {x}x{y}x{z}{} (changed since it was planned?)",
            g.shown(),
            if volumes > 1 {
                format!("x{volumes}")
            } else {
                String::new()
            }
        )));
    }
    Ok(())
}

/// The first label value that is not a whole number from 0 to `labels - 1`, named with its voxel.
fn check_labels(vol: &[f32], dims: [usize; 3], labels: usize) -> Result<(), Reject> {
    let bad = |v: f32| !(v >= 0.0 && v.fract() == 0.0 && (v as usize) < labels);
    let Some(i) = vol.iter().position(|&v| bad(v)) else {
        return Ok(());
    };
    let v = vol[i];
    let (x, y, z) = (i % dims[0], i / dims[0] % dims[1], i / (dims[0] * dims[1]));
    let why = if v.is_finite() && v.fract() == 0.0 && v >= 0.0 {
        format!(
            "is beyond the {labels} labels dataset.json names (values 0 to {})",
            labels - 1
        )
    } else {
        "is not a label value (a whole number from 0)".to_string()
    };
    Err(Reject::new(format!(
        "label value {v} at voxel ({x}, {y}, {z}) {why}"
    )))
}

/// Image file `k` of the case: its channel volumes (one, or all C) into their planes of the
/// kept samples (`place[slice]`: the sample it is, if kept).
fn read_channels(
    case: &Case,
    k: usize,
    o: &CaseOptions,
    t: &Target,
    d: &DecodeOptions,
    place: &[Option<usize>],
    px: &mut [u8],
) -> Result<(), Reject> {
    let plane_t = Target {
        channels: 1,
        ..t.clone()
    };
    let pb = plane_t.sample_bytes();
    let sb = t.sample_bytes();
    let volumes = if case.per_channel {
        1
    } else {
        o.channels.len()
    };
    let mut scratch: Vec<f32> = Vec::new();
    let mut plane: Vec<u8> = Vec::with_capacity(pb);
    nifti::read_volumes(&case.images[k].path, &mut |v, g, vol| {
        same_grid(g, case, volumes)?;
        let c = if case.per_channel { k } else { v };
        let mut s = 0;
        let mut put = |frame: Frame| -> Result<(), Reject> {
            let slice = s;
            s += 1;
            let Some(j) = place[slice] else {
                return Ok(());
            };
            if let Frame::Float(f) = &frame {
                finite(&f.data, f.width as usize, c, slice, &o.channels)?;
            }
            plane.clear();
            to_sample(frame, &plane_t, &mut plane).map_err(|why| {
                Reject::new(format!(
                    "channel {c} ({}), slice {slice}: {why}",
                    o.channels[c]
                ))
            })?;
            px[j * sb + c * pb..][..pb].copy_from_slice(&plane);
            Ok(())
        };
        let values = d.float || d.scan_values;
        let (low, high) = match (values, d.window) {
            (true, _) => (0.0, 0.0),
            (_, Some(w)) => w,
            _ => nifti::percentile_window(vol, d.percentiles, &mut scratch)?,
        };
        let p = volume::prepare(vol, &case.geometry, d, false)?;
        if values {
            return nifti::emit_float_view_slices(&p.view(), d.axis, &mut put);
        }
        nifti::emit_view_slices(
            &p.view(),
            d.axis,
            &|x| window_to_u16(x as f64, low, high),
            &mut put,
        )
    })?;
    Ok(())
}

/// Float samples must be finite: the first value that is not, by channel, slice, row and column.
fn finite(v: &[f32], w: usize, c: usize, slice: usize, names: &[String]) -> Result<(), Reject> {
    match v.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(i) => Err(Reject::new(format!(
            "value {} in channel {c} ({}), slice {slice}, row {}, column {}: float samples must be finite",
            v[i],
            names[c],
            i / w.max(1),
            i % w.max(1)
        ))),
    }
}
