//! Where a volume's voxels lie in the patient, and the one grid every volume is brought to before
//! it is cut into slices: the same orientation (LPS) and, when asked, the same voxel spacing.
//!
//! Patient coordinates are DICOM's LPS+: +x toward the patient's left, +y toward posterior, +z
//! toward superior (NIfTI's RAS+ world is LPS with x and y negated). A source says which way each
//! voxel axis points (NIfTI: the sform, else the qform, else the NIfTI rule for neither, pixdim
//! along RAS; a DICOM series: Image Orientation (Patient) and the slice normal). The volume is
//! then permuted and flipped, without resampling, so that axis 0 runs toward L, axis 1 toward P
//! and axis 2 toward S: the closest canonical orientation, as nibabel's `as_closest_canonical`
//! (an oblique volume keeps its obliquity; it is not rotated).
//!
//! Slices of a volume in canonical orientation are cut as radiology viewers show them:
//! - axis 2 (axial): columns run from the patient's right to left, rows from anterior (top) to
//!   posterior;
//! - axis 1 (coronal): columns right to left, rows from superior (top) to inferior;
//! - axis 0 (sagittal): columns anterior to posterior, rows superior (top) to inferior.
//!
//! With `Orientation::Stored` the stored voxel axes are cut by the same rule (axis 0 of the file
//! as columns, and so on), whatever they point to.

use super::Reject;

/// A file (or a resampled volume) may hold at most this many voxels in all.
pub const MAX_VOXELS: u64 = 1 << 31;

/// The orientation volumes are brought to before slicing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub enum Orientation {
    /// Closest to LPS: axis 0 toward the patient's left, 1 posterior, 2 superior.
    #[default]
    Lps,
    /// The voxel axes as the file stores them.
    Stored,
}

impl Orientation {
    pub fn name(self) -> &'static str {
        match self {
            Orientation::Lps => "LPS",
            Orientation::Stored => "stored",
        }
    }
}

/// What a 4-D volume's 4th axis is taken to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FourthAxis {
    /// Time points where the header gives a time step, else up to 4 volumes are channels
    /// (modalities) and more time points.
    #[default]
    Auto,
    Channels,
    Time,
}

/// A unit direction for each voxel axis, in LPS.
pub type Axes = [[f64; 3]; 3];

/// What a source says of a volume's place in the patient.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Geometry {
    /// Voxels along axes 0, 1, 2.
    pub dims: [usize; 3],
    /// Each voxel axis's direction (LPS); None where the source does not say.
    pub axes: Option<Axes>,
    /// Voxel size along each axis (mm for scans); None where the source gives none.
    pub spacing: [Option<f64>; 3],
}

impl Geometry {
    /// The stored axes as three letters, each the patient direction that axis runs toward most
    /// ("RAS", "LPS", "LAS"...); "unknown" without axes.
    pub fn codes(&self) -> String {
        match &self.axes {
            None => "unknown".into(),
            Some(a) => {
                // Each axis named by the patient axis `to_lps` gives it (one each, even where an
                // oblique axis lies as near to two).
                let r = Reorient::to_lps(a);
                let mut out = ['?'; 3];
                for (k, (&i, &flip)) in r.perm.iter().zip(&r.flip).enumerate() {
                    out[i] = [['L', 'R'], ['P', 'A'], ['S', 'I']][k][usize::from(flip)];
                }
                out.iter().collect()
            }
        }
    }

    /// How to bring the volume to `o`.
    pub fn reorient(&self, o: Orientation) -> Reorient {
        match (o, &self.axes) {
            (Orientation::Lps, Some(a)) => Reorient::to_lps(a),
            _ => Reorient::IDENTITY,
        }
    }

    /// The grid after reorienting to `o` and resampling to `spacing` (if any): dims and spacing.
    pub fn target(&self, o: Orientation, spacing: Option<[f64; 3]>) -> Result<Geometry, Reject> {
        let r = self.reorient(o);
        let g = r.geometry(self);
        match spacing {
            None => Ok(g),
            Some(to) => {
                let dims = resampled_dims(g.dims, &g.spacing, to)?;
                Ok(Geometry {
                    dims,
                    axes: g.axes,
                    spacing: to.map(Some),
                })
            }
        }
    }

    /// In-plane pixel spacing of slices cut along `axis` (columns, rows), where both are known.
    pub fn slice_spacing(&self, axis: usize) -> Option<(f64, f64)> {
        let (c, r) = match axis {
            0 => (1, 2),
            1 => (0, 2),
            _ => (0, 1),
        };
        Some((self.spacing[c]?, self.spacing[r]?))
    }
}

/// Why a label volume's geometry `b` does not lie on image geometry `a`, if it does not: other
/// dims, axes pointing elsewhere (more than ~1 degree), or other voxel sizes (more than 0.1%).
/// What one of them leaves unknown is not compared.
pub fn disagree(a: &Geometry, b: &Geometry) -> Option<String> {
    if a.dims != b.dims {
        let d = |g: &Geometry| format!("{}x{}x{}", g.dims[0], g.dims[1], g.dims[2]);
        return Some(format!("its grid {} differs from the grid {}", d(b), d(a)));
    }
    if let (Some(x), Some(y)) = (&a.axes, &b.axes) {
        let off = (0..3).any(|i| (0..3).any(|k| (x[i][k] - y[i][k]).abs() > 0.02));
        if off {
            return Some(format!(
                "its orientation {} differs from the orientation {}",
                b.codes(),
                a.codes()
            ));
        }
    }
    for k in 0..3 {
        if let (Some(s), Some(t)) = (a.spacing[k], b.spacing[k]) {
            if (s - t).abs() > 1e-3 * s.max(t) {
                return Some(format!(
                    "its voxel size {t} mm along axis {k} differs from the voxel size {s} mm"
                ));
            }
        }
    }
    None
}

/// A permutation and flips of a volume's axes: output axis `k` is input axis `perm[k]`, read
/// from its far end where `flip[k]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reorient {
    pub perm: [usize; 3],
    pub flip: [bool; 3],
}

impl Reorient {
    pub const IDENTITY: Reorient = Reorient {
        perm: [0, 1, 2],
        flip: [false; 3],
    };

    /// The closest canonical LPS orientation: each patient axis gets the voxel axis most aligned
    /// with it, the strongest pairs first (so a permutation even for oblique axes).
    pub fn to_lps(axes: &Axes) -> Reorient {
        let mut perm = [usize::MAX; 3];
        let mut flip = [false; 3];
        let mut used = [false; 3];
        for _ in 0..3 {
            let mut best: Option<(usize, usize, f64)> = None;
            for (i, d) in axes.iter().enumerate().filter(|(i, _)| !used[*i]) {
                for k in (0..3).filter(|&k| perm[k] == usize::MAX) {
                    if best.is_none_or(|(_, _, m)| d[k].abs() > m) {
                        best = Some((i, k, d[k].abs()));
                    }
                }
            }
            let (i, k, _) = best.expect("an axis is left");
            used[i] = true;
            perm[k] = i;
            flip[k] = axes[i][k] < 0.0;
        }
        Reorient { perm, flip }
    }

    pub fn is_identity(&self) -> bool {
        *self == Self::IDENTITY
    }

    pub fn dims(&self, d: [usize; 3]) -> [usize; 3] {
        self.perm.map(|i| d[i])
    }

    /// A geometry's reoriented form (axes flipped where read from their far end).
    pub fn geometry(&self, g: &Geometry) -> Geometry {
        Geometry {
            dims: self.dims(g.dims),
            axes: g.axes.map(|a| {
                let mut out = [[0.0; 3]; 3];
                for k in 0..3 {
                    let s = if self.flip[k] { -1.0 } else { 1.0 };
                    out[k] = a[self.perm[k]].map(|v| v * s);
                }
                out
            }),
            spacing: self.perm.map(|i| g.spacing[i]),
        }
    }

    /// Output voxel `o` (in output axes) reads input index `self.source(o, dims)`.
    pub fn source(&self, o: [usize; 3], dims: [usize; 3]) -> [usize; 3] {
        let mut s = [0; 3];
        for ((&i, &flip), &at) in self.perm.iter().zip(&self.flip).zip(&o) {
            s[i] = if flip { dims[i] - 1 - at } else { at };
        }
        s
    }

    /// `vol` (x fastest, `dims`) read in the output axes, without a copy.
    pub fn view<'a>(&self, vol: &'a [f32], dims: [usize; 3]) -> View<'a> {
        let stride = [1, dims[0], dims[0] * dims[1]];
        let mut step = [0isize; 3];
        let mut base = 0isize;
        for (k, (&i, &flip)) in self.perm.iter().zip(&self.flip).enumerate() {
            if flip {
                step[k] = -(stride[i] as isize);
                base += ((dims[i] - 1) * stride[i]) as isize;
            } else {
                step[k] = stride[i] as isize;
            }
        }
        View {
            vol,
            dims: self.dims(dims),
            base,
            step,
        }
    }

    /// `vol` (x fastest, `dims`) in the output axes, copied.
    pub fn apply(&self, vol: &[f32], dims: [usize; 3]) -> Vec<f32> {
        if self.is_identity() {
            return vol.to_vec();
        }
        let v = self.view(vol, dims);
        let [nx, ny, nz] = v.dims;
        let mut out = Vec::with_capacity(vol.len());
        for z in 0..nz {
            for y in 0..ny {
                out.extend((0..nx).map(|x| v.at(x, y, z)));
            }
        }
        out
    }
}

/// Voxels along each axis after resampling from `from` to `to` spacing: the same extent,
/// rounded (at least 1). Every axis's spacing must be known.
pub fn resampled_dims(
    dims: [usize; 3],
    from: &[Option<f64>; 3],
    to: [f64; 3],
) -> Result<[usize; 3], Reject> {
    let mut out = [0; 3];
    for k in 0..3 {
        let Some(s) = from[k] else {
            return Err(Reject::new(format!(
                "--spacing: the volume gives no voxel size along axis {k}"
            )));
        };
        let n = (dims[k] as f64 * s / to[k]).round().max(1.0);
        if n > MAX_VOXELS as f64 {
            return Err(Reject::new(format!(
                "--spacing: {} voxels of {s} mm along axis {k} would become {n} of {} mm",
                dims[k], to[k]
            )));
        }
        out[k] = n as usize;
    }
    let total = out.iter().map(|&d| d as u64).product::<u64>();
    if total > MAX_VOXELS {
        return Err(Reject::new(format!(
            "--spacing: the resampled volume would be {}x{}x{} = {total} voxels (limit {})",
            out[0], out[1], out[2], MAX_VOXELS
        )));
    }
    Ok(out)
}

/// Resample `vol` (x fastest, `dims`, voxel sizes `from`) to voxel sizes `to`, keeping the first
/// voxel's centre where it is (output voxel i lies at i * to / from input voxels; beyond the last
/// input voxel the edge value is kept). Linear along each axis in turn (trilinear in all), or the
/// nearest voxel for label volumes (`nearest`), so labels stay labels.
pub fn resample(
    vol: &[f32],
    dims: [usize; 3],
    from: &[Option<f64>; 3],
    to: [f64; 3],
    nearest: bool,
) -> Result<(Vec<f32>, [usize; 3]), Reject> {
    let out_dims = resampled_dims(dims, from, to)?;
    let mut cur = vol.to_vec();
    let mut cur_dims = dims;
    for k in 0..3 {
        if out_dims[k] == cur_dims[k] && (from[k].unwrap_or(0.0) - to[k]).abs() < 1e-9 {
            continue;
        }
        let ratio = to[k] / from[k].expect("checked in resampled_dims");
        let (next, d) = along(&cur, cur_dims, k, out_dims[k], ratio, nearest)?;
        cur = next;
        cur_dims = d;
    }
    Ok((cur, out_dims))
}

/// One axis of `resample`.
fn along(
    vol: &[f32],
    dims: [usize; 3],
    axis: usize,
    n: usize,
    ratio: f64,
    nearest: bool,
) -> Result<(Vec<f32>, [usize; 3]), Reject> {
    let mut od = dims;
    od[axis] = n;
    let total = od.iter().product::<usize>();
    let mut out: Vec<f32> = Vec::new();
    out.try_reserve_exact(total).map_err(|_| {
        Reject::new(format!(
            "cannot allocate a resampled volume of {total} voxels"
        ))
    })?;
    let last = dims[axis] - 1;
    // Per output index: (lower input index, weight of the upper one).
    let taps: Vec<(usize, f32)> = (0..n)
        .map(|i| {
            let x = (i as f64 * ratio).min(last as f64);
            if nearest {
                ((x.round() as usize).min(last), 0.0)
            } else {
                let lo = x.floor() as usize;
                (lo.min(last), (x - lo as f64) as f32)
            }
        })
        .collect();
    let stride = [1, dims[0], dims[0] * dims[1]][axis];
    for z in 0..od[2] {
        for y in 0..od[1] {
            for x in 0..od[0] {
                let mut at = [x, y, z];
                let (lo, w) = taps[at[axis]];
                at[axis] = lo;
                let i = at[0] + dims[0] * (at[1] + dims[1] * at[2]);
                let v = if w == 0.0 || lo == last {
                    vol[i]
                } else {
                    vol[i] * (1.0 - w) + vol[i + stride] * w
                };
                out.push(v);
            }
        }
    }
    Ok((out, od))
}

/// Parse `--spacing`: "1" (every axis) or "AxBxC" in mm, each positive and finite.
pub fn parse_spacing(s: &str) -> Result<[f64; 3], String> {
    let parts: Vec<&str> = s.split(['x', 'X', ',']).collect();
    let vals: Vec<f64> = parts
        .iter()
        .map(|p| p.trim().parse::<f64>())
        .collect::<Result<_, _>>()
        .map_err(|_| format!("--spacing {s:?}: expected mm as X, or XxYxZ (e.g. 1x1x2.5)"))?;
    let v = match vals.as_slice() {
        [a] => [*a; 3],
        [a, b, c] => [*a, *b, *c],
        _ => {
            return Err(format!(
                "--spacing {s:?}: expected one value or three (XxYxZ)"
            ))
        }
    };
    if v.iter().any(|x| !(x.is_finite() && *x > 0.0)) {
        return Err(format!("--spacing {s:?}: every size must be positive"));
    }
    Ok(v)
}

/// A NIfTI-1 header's voxel axes in LPS: the sform where its code is set, else the qform, else
/// the NIfTI rule for neither (pixdim along RAS). Columns of the 3x3 part, normalised; an axis of
/// zero length leaves the axes unknown.
pub fn nifti_axes(h: &nifti::NiftiHeader) -> Option<Axes> {
    let cols: [[f64; 3]; 3] = if h.sform_code > 0 {
        let r = [h.srow_x, h.srow_y, h.srow_z];
        [0, 1, 2].map(|j| [r[0][j] as f64, r[1][j] as f64, r[2][j] as f64])
    } else if h.qform_code > 0 {
        let (b, c, d) = (h.quatern_b as f64, h.quatern_c as f64, h.quatern_d as f64);
        let a = (1.0 - (b * b + c * c + d * d)).max(0.0).sqrt();
        let m = [
            [
                a * a + b * b - c * c - d * d,
                2.0 * (b * c - a * d),
                2.0 * (b * d + a * c),
            ],
            [
                2.0 * (b * c + a * d),
                a * a + c * c - b * b - d * d,
                2.0 * (c * d - a * b),
            ],
            [
                2.0 * (b * d - a * c),
                2.0 * (c * d + a * b),
                a * a + d * d - c * c - b * b,
            ],
        ];
        let qfac = if h.pixdim[0] < 0.0 { -1.0 } else { 1.0 };
        [0, 1, 2].map(|j| {
            let s = if j == 2 { qfac } else { 1.0 };
            [m[0][j] * s, m[1][j] * s, m[2][j] * s]
        })
    } else {
        [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    };
    let mut out = [[0.0; 3]; 3];
    for (j, c) in cols.iter().enumerate() {
        let n = (c[0] * c[0] + c[1] * c[1] + c[2] * c[2]).sqrt();
        if !(n.is_finite() && n > 0.0) {
            return None;
        }
        // RAS to LPS.
        out[j] = [-c[0] / n, -c[1] / n, c[2] / n];
    }
    Some(out)
}

/// Voxel sizes from a NIfTI header: the sform's column lengths where the sform is used, else
/// pixdim 1 to 3; None where not positive and finite.
pub fn nifti_spacing(h: &nifti::NiftiHeader) -> [Option<f64>; 3] {
    let raw: [f64; 3] = if h.sform_code > 0 {
        let r = [h.srow_x, h.srow_y, h.srow_z];
        [0, 1, 2].map(|j| {
            let c = [r[0][j] as f64, r[1][j] as f64, r[2][j] as f64];
            (c[0] * c[0] + c[1] * c[1] + c[2] * c[2]).sqrt()
        })
    } else {
        [1, 2, 3].map(|i| h.pixdim[i].abs() as f64)
    };
    // Through a short decimal: 0.8 stays 0.8, not 0.800000011920929.
    raw.map(|v| {
        let v: f64 = format!("{v:.6}").parse().unwrap_or(f64::NAN);
        (v.is_finite() && v > 0.0).then_some(v)
    })
}

#[cfg(test)]
mod tests;

/// (height, width) of the slices of a volume of `dims` cut along `axis` (see the module's rule).
pub fn slice_size(dims: [usize; 3], axis: usize) -> (usize, usize) {
    match axis {
        0 => (dims[2], dims[1]),
        1 => (dims[2], dims[0]),
        _ => (dims[1], dims[0]),
    }
}

/// A volume as read (x fastest, its source's geometry) brought to the orientation and spacing
/// of `opts`. Reorienting copies nothing: the result is read through a `View` of the source
/// voxels; only `--spacing` makes a new volume. `nearest`: a label volume, resampled by nearest
/// voxel.
pub fn prepare<'a>(
    vol: &'a [f32],
    geo: &Geometry,
    opts: &super::DecodeOptions,
    nearest: bool,
) -> Result<Prepared<'a>, Reject> {
    let r = geo.reorient(opts.orientation);
    let g = r.geometry(geo);
    match opts.spacing {
        None => Ok(Prepared {
            data: std::borrow::Cow::Borrowed(vol),
            src_dims: geo.dims,
            r,
            geometry: g,
        }),
        Some(to) => {
            let oriented = r.apply(vol, geo.dims);
            let (mut out, dims) = resample(&oriented, g.dims, &g.spacing, to, nearest)?;
            drop(oriented);
            // Whole modality values for a u16 target stay whole: interpolation rounds to them.
            if opts.scan_values && !opts.float && vol.iter().all(|x| x.fract() == 0.0) {
                out.iter_mut().for_each(|x| *x = x.round());
            }
            Ok(Prepared {
                data: std::borrow::Cow::Owned(out),
                src_dims: dims,
                r: Reorient::IDENTITY,
                geometry: Geometry {
                    dims,
                    axes: g.axes,
                    spacing: to.map(Some),
                },
            })
        }
    }
}

/// A volume brought to its orientation and spacing (`prepare`).
pub struct Prepared<'a> {
    data: std::borrow::Cow<'a, [f32]>,
    src_dims: [usize; 3],
    r: Reorient,
    /// Its geometry as it is cut (`geometry.dims` are the view's).
    pub geometry: Geometry,
}

impl Prepared<'_> {
    pub fn view(&self) -> View<'_> {
        self.r.view(&self.data, self.src_dims)
    }
}

/// Voxels read through a permutation and flips of their axes: voxel (x, y, z) of the view is
/// `vol[base + x step0 + y step1 + z step2]`.
pub struct View<'a> {
    vol: &'a [f32],
    pub dims: [usize; 3],
    base: isize,
    step: [isize; 3],
}

impl<'a> View<'a> {
    /// `vol` as it is stored (x fastest).
    pub fn stored(vol: &'a [f32], dims: [usize; 3]) -> Self {
        debug_assert_eq!(vol.len(), dims.iter().product::<usize>());
        View {
            vol,
            dims,
            base: 0,
            step: [1, dims[0] as isize, (dims[0] * dims[1]) as isize],
        }
    }

    pub fn at(&self, x: usize, y: usize, z: usize) -> f32 {
        let i = self.base
            + x as isize * self.step[0]
            + y as isize * self.step[1]
            + z as isize * self.step[2];
        self.vol[i as usize]
    }

    /// Row (y, z) along x, where it lies contiguous and forward in memory.
    pub fn row(&self, y: usize, z: usize) -> Option<&'a [f32]> {
        if self.step[0] != 1 {
            return None;
        }
        let i = (self.base + y as isize * self.step[1] + z as isize * self.step[2]) as usize;
        Some(&self.vol[i..i + self.dims[0]])
    }
}
