//! NIfTI-1 volumes (`.nii`, `.nii.gz`): each 3-D volume is windowed and cut into 2-D slices.
//!
//! The header is parsed by the `nifti` crate; the voxel data is read here, one 3-D volume at a time
//! (a 4-D file is a series of 3-D volumes), in chunks, so that memory holds one volume as `f32` and
//! a truncated or lying file fails before its declared size is ever allocated.
//!
//! Per volume: voxels are scaled by `scl_slope`/`scl_inter` (slope 0 means no scaling), then the
//! window is `opts.window` if given, else the `opts.percentiles` window over that volume's finite
//! voxels. Slices are cut along `opts.axis` and emitted as 16-bit grey images through
//! `window_to_u16` (NaN voxels become 0). With `opts.float` there is no window: slices are emitted
//! as float frames of the scaled values (float64 data rounded to float32; a NaN stays NaN, for
//! the conversion to reject).
//!
//! Orientation and spacing: each volume is brought to `opts.orientation` (LPS by default, from
//! the sform, else the qform, else pixdim along RAS) and, with `opts.spacing`, resampled, before
//! it is cut as `volume` says (axial slices with anterior at the top and the patient's right on
//! the left; coronal and sagittal ones with superior at the top).

use super::volume::{self, Geometry, View};
use super::{window_to_u16, DecodeOptions, Emit, FloatFrame, Frame, Probe, Reject};
use image::{DynamicImage, ImageBuffer, Luma};
use nifti::{Endianness, NiftiHeader, NiftiType};
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

pub use super::volume::MAX_VOXELS;
/// Percentiles are computed exactly on volumes up to this many finite voxels, and on an evenly
/// strided sample of this many above it (keeps the scratch copy at 256 MiB).
const PERCENTILE_SAMPLE: usize = 1 << 26;
/// A time series' window is taken from an evenly strided sample of at most this many voxels of
/// all its volumes (16 MiB: percentiles of 4M values are as good as of all).
const SERIES_SAMPLE: usize = 1 << 22;
/// Bytes read and converted at a time.
const CHUNK: usize = 1 << 20;

pub fn decode(path: &Path, opts: &DecodeOptions, emit: &mut Emit) -> Result<(), Reject> {
    if opts.axis > 2 {
        return Err(Reject::new(format!("axis {} is not 0, 1 or 2", opts.axis)));
    }
    let values = opts.float || opts.scan_values;
    let g = grid(path)?;
    if let Fourth::Channels(c) = fourth_axis(&g, opts.fourth) {
        return decode_channels(path, c, opts, emit);
    }
    // A time series shares one window, over all its volumes: a signal that changes over time
    // must not be windowed away one volume at a time.
    let window = match opts.window {
        None if !values && g.volumes > 1 => Some(series_window(path, &g, opts.percentiles)?),
        w => w,
    };
    let mut scratch: Vec<f32> = Vec::new();
    // `--every N` keeps every Nth time point (the window is still the whole series').
    let every = match fourth_axis(&g, opts.fourth) {
        Fourth::Time(_) => opts.every.max(1) as usize,
        _ => 1,
    };
    read_volumes(path, &mut |v, grid, vol| {
        if v % every != 0 {
            return Ok(());
        }
        let p = volume::prepare(vol, &grid.geometry, opts, false)?;
        if values {
            return emit_float_view_slices(&p.view(), opts.axis, emit);
        }
        let (low, high) = match window {
            Some(w) => w,
            None => percentile_window(vol, opts.percentiles, &mut scratch)?,
        };
        emit_view_slices(
            &p.view(),
            opts.axis,
            &|x| window_to_u16(x as f64, low, high),
            emit,
        )
    })
    .map(|_| ())
}

/// What a file's 4th axis holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fourth {
    /// One 3-D volume.
    One,
    /// Channels (modalities) of one volume: each slice is a sample of this many channels.
    Channels(usize),
    /// Time points: each is a volume of its own, its slices samples.
    Time(usize),
}

/// How `asked` reads the 4th axis of a file of `g`: `Auto` takes it as time points where the
/// header gives it a time step (fMRI, perfusion), else up to 4 volumes as channels (BraTS-like
/// modality stacks) and more as time points.
pub fn fourth_axis(g: &Grid, asked: volume::FourthAxis) -> Fourth {
    match (g.volumes, asked) {
        (1, _) => Fourth::One,
        (n, volume::FourthAxis::Channels) => Fourth::Channels(n),
        (n, volume::FourthAxis::Time) => Fourth::Time(n),
        (n, volume::FourthAxis::Auto) if n <= 4 && g.time_step.is_none() => Fourth::Channels(n),
        (n, _) => Fourth::Time(n),
    }
}

/// The most channels a sample may have.
pub const MAX_CHANNELS: usize = 64;

/// A volume whose `c` volumes are its channels: every channel volume is oriented and windowed on
/// its own (`opts.window`, else its percentiles), then each slice is one frame of `c` planes.
/// Memory: all `c` channel volumes, as slices.
fn decode_channels(
    path: &Path,
    c: usize,
    opts: &DecodeOptions,
    emit: &mut Emit,
) -> Result<(), Reject> {
    if c > MAX_CHANNELS {
        return Err(Reject::new(format!(
            "{c} volumes along the 4th axis are too many channels (at most {MAX_CHANNELS}): --fourth-axis time takes them as time points"
        )));
    }
    let values = opts.float || opts.scan_values;
    let mut scratch: Vec<f32> = Vec::new();
    // [channel][slice] -> the slice's values (windowed onto 0..=65535 unless `values`).
    let mut planes: Vec<Vec<Vec<f32>>> = Vec::with_capacity(c);
    let (mut w, mut h) = (0u32, 0u32);
    read_volumes(path, &mut |_, grid, vol| {
        let p = volume::prepare(vol, &grid.geometry, opts, false)?;
        let (low, high) = match (values, opts.window) {
            (true, _) => (0.0, 0.0),
            (_, Some(w)) => w,
            _ => percentile_window(vol, opts.percentiles, &mut scratch)?,
        };
        let mut slices = Vec::new();
        let map = |x: f32| {
            if values {
                x
            } else {
                window_to_u16(x as f64, low, high) as f32
            }
        };
        cut(&p.view(), opts.axis, map, &mut |ww, hh, px| {
            (w, h) = (ww, hh);
            slices.push(px);
            Ok(())
        })?;
        planes.push(slices);
        Ok(())
    })?;
    let count = planes.first().map_or(0, Vec::len);
    for s in 0..count {
        let data: Vec<f32> = planes
            .iter_mut()
            .flat_map(|p| std::mem::take(&mut p[s]))
            .collect();
        let f = FloatFrame {
            channels: c,
            height: h,
            width: w,
            data,
        };
        emit(if values {
            Frame::Float(f)
        } else {
            Frame::Windowed(f)
        })?;
    }
    Ok(())
}

/// The percentile window over every volume of a file (a strided sample of at most
/// `PERCENTILE_SAMPLE` voxels), read in a first pass.
fn series_window(path: &Path, g: &Grid, p: (f64, f64)) -> Result<(f64, f64), Reject> {
    let per = g.dims.iter().product::<usize>();
    let stride = (per * g.volumes).div_ceil(SERIES_SAMPLE).max(1);
    let mut sample: Vec<f32> = Vec::new();
    read_volumes(path, &mut |v, _, vol| {
        // The strided positions over the whole series, continued across volumes.
        let first = (stride - (v * per) % stride) % stride;
        sample.extend(
            vol.iter()
                .skip(first)
                .step_by(stride)
                .copied()
                .filter(|x| x.is_finite()),
        );
        Ok(())
    })?;
    Ok(percentiles_in_place(&mut sample, p))
}

/// The voxel grid a file's header declares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grid {
    /// x, y, z of one 3-D volume (missing dimensions are 1).
    pub dims: [usize; 3],
    /// Number of 3-D volumes (the product of dimensions 4 to 7: a 4-D file's 4th axis).
    pub volumes: usize,
    /// Where the voxel axes point and their sizes (`geometry.dims` is `dims`).
    pub geometry: Geometry,
    /// Seconds between volumes, where the header gives the 4th axis a time unit and a step.
    pub time_step: Option<f64>,
}

impl Grid {
    /// "240x240x155", or "240x240x155x4" for several volumes.
    pub fn shown(&self) -> String {
        let [x, y, z] = self.dims;
        if self.volumes == 1 {
            format!("{x}x{y}x{z}")
        } else {
            format!("{x}x{y}x{z}x{}", self.volumes)
        }
    }
}

/// Receives a file's volumes one at a time: (index, grid, voxels).
pub type EachVolume<'a> = dyn FnMut(usize, Grid, &[f32]) -> Result<(), Reject> + 'a;

/// Every 3-D volume of a file in order, as scaled float32 voxels (x fastest), handed to
/// `each(index, grid, voxels)` one at a time: memory holds one volume. Returns the grid.
pub fn read_volumes(path: &Path, each: &mut EachVolume) -> Result<Grid, Reject> {
    let file = super::open_input(path)?;
    let file_len = file.metadata().map(|m| m.len()).ok();
    let mut buffered = BufReader::with_capacity(1 << 16, file);
    let head = buffered
        .fill_buf()
        .map_err(|e| Reject::new(format!("cannot read: {e}")))?;
    if head.len() >= 2 && head[0] == 0x1f && head[1] == 0x8b {
        read_stream(flate2::read::MultiGzDecoder::new(buffered), None, each)
    } else {
        read_stream(buffered, file_len, each)
    }
}

/// The grid of a file from its header alone (348 bytes, un-gzipped where needed).
pub fn grid(path: &Path) -> Result<Grid, Reject> {
    Ok(read_header(path)?.grid())
}

fn read_header(path: &Path) -> Result<Layout, Reject> {
    let file = super::open_input(path)?;
    let mut buffered = BufReader::with_capacity(1 << 12, file);
    let head = buffered
        .fill_buf()
        .map_err(|e| Reject::new(format!("cannot read: {e}")))?;
    let gz = head.len() >= 2 && head[0] == 0x1f && head[1] == 0x8b;
    let mut hdr = [0u8; 348];
    let read = if gz {
        read_full(&mut flate2::read::MultiGzDecoder::new(buffered), &mut hdr)
    } else {
        read_full(&mut buffered, &mut hdr)
    };
    read.map_err(|e| match e {
        ReadFail::Eof(n) => Reject::new(format!(
            "truncated NIfTI: {n} bytes, a NIfTI-1 header needs 348"
        )),
        ReadFail::Io(e) => io_reject("cannot read NIfTI header", e),
        ReadFail::Alloc => Reject::new("out of memory"),
    })?;
    parse_header(&hdr)
}

/// A volume is grey; the slice size comes from the header alone (only its 348 bytes are read,
/// un-gzipped where needed), after orientation and spacing.
pub fn probe(path: &Path, opts: &DecodeOptions) -> Result<Probe, Reject> {
    let grid = grid(path)?;
    let g = grid.geometry.target(opts.orientation, opts.spacing)?;
    let (h, w) = volume::slice_size(g.dims, opts.axis);
    let channels = match fourth_axis(&grid, opts.fourth) {
        Fourth::Channels(c) if c <= MAX_CHANNELS => Some(c as u8),
        _ => None,
    };
    Ok(Probe {
        colour: false,
        size: Some((h as u32, w as u32)),
        channels,
    })
}

/// What the header says about the voxel data, checked.
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// x, y, z of one 3-D volume (missing dimensions are 1).
    dims: [usize; 3],
    /// Number of 3-D volumes (the product of dimensions 4 to 7).
    volumes: usize,
    datatype: NiftiType,
    little_endian: bool,
    vox_offset: u64,
    slope: f64,
    inter: f64,
    /// Voxel size along x, y, z (the sform's or pixdim's, in the file's units, mm for most
    /// scans); None where the header gives no positive finite size.
    spacing: [Option<f64>; 3],
    /// The voxel axes' directions (`volume::nifti_axes`).
    axes: Option<volume::Axes>,
    /// pixdim[4] in seconds, where xyzt_units gives the 4th axis a time unit.
    time_step: Option<f64>,
}

impl Layout {
    fn grid(&self) -> Grid {
        Grid {
            dims: self.dims,
            volumes: self.volumes,
            geometry: Geometry {
                dims: self.dims,
                axes: self.axes,
                spacing: self.spacing,
            },
            time_step: self.time_step,
        }
    }

    fn volume_voxels(&self) -> usize {
        self.dims[0] * self.dims[1] * self.dims[2]
    }
}

/// Read a NIfTI-1 byte stream (already un-gzipped) volume by volume; `file_len` is the stream's
/// length when known.
fn read_stream<R: Read>(
    mut r: R,
    file_len: Option<u64>,
    each: &mut EachVolume,
) -> Result<Grid, Reject> {
    let mut hdr = [0u8; 348];
    read_full(&mut r, &mut hdr).map_err(|e| match e {
        ReadFail::Eof(n) => Reject::new(format!(
            "truncated NIfTI: {n} bytes, a NIfTI-1 header needs 348"
        )),
        ReadFail::Io(e) => io_reject("cannot read NIfTI header", e),
        ReadFail::Alloc => Reject::new("out of memory"),
    })?;
    let layout = parse_header(&hdr)?;
    let bytes_per = layout.datatype.size_of() as u64;
    let data_bytes = (layout.volume_voxels() as u64) * (layout.volumes as u64) * bytes_per;
    if let Some(len) = file_len {
        let need = layout.vox_offset + data_bytes;
        if len < need {
            return Err(Reject::new(format!(
                "truncated NIfTI: header declares {} voxels of {} from byte {} ({need} bytes in all), file has {len} bytes",
                layout.volume_voxels() as u64 * layout.volumes as u64,
                type_name(layout.datatype),
                layout.vox_offset,
            )));
        }
    }
    // Skip the extensions (bytes 348 .. vox_offset).
    let skip = layout.vox_offset - 348;
    let skipped = io::copy(&mut (&mut r).take(skip), &mut io::sink())
        .map_err(|e| io_reject("cannot read NIfTI extensions", e))?;
    if skipped < skip {
        return Err(Reject::new(format!(
            "truncated NIfTI: voxel data should start at byte {}, the stream ends at byte {}",
            layout.vox_offset,
            348 + skipped
        )));
    }

    let n = layout.volume_voxels();
    let grid = layout.grid();
    // Grows as voxels arrive (a short gzip stream never claims its declared size).
    let mut vol: Vec<f32> = Vec::new();
    for v in 0..layout.volumes {
        read_volume(&mut r, &layout, n, &mut vol).map_err(|e| match e {
            ReadFail::Eof(got) => Reject::new(format!(
                "truncated NIfTI: volume {v} of {} ends after {got} of its {} voxels",
                layout.volumes, n
            )),
            ReadFail::Io(e) => io_reject("cannot read NIfTI voxel data", e),
            ReadFail::Alloc => Reject::new(format!("cannot allocate a volume of {n} voxels")),
        })?;
        each(v, grid, &vol)?;
    }
    Ok(grid)
}

fn parse_header(hdr: &[u8; 348]) -> Result<Layout, Reject> {
    let size_le = i32::from_le_bytes(hdr[0..4].try_into().unwrap());
    let size_be = i32::from_be_bytes(hdr[0..4].try_into().unwrap());
    if size_le == 540 || size_be == 540 {
        return Err(Reject::new(
            "NIfTI-2 files are not supported (only NIfTI-1)",
        ));
    }
    if size_le != 348 && size_be != 348 {
        return Err(Reject::new(
            "not a NIfTI-1 file (header size field is not 348)",
        ));
    }
    let h = NiftiHeader::from_reader(&hdr[..])
        .map_err(|e| Reject::new(format!("invalid NIfTI header: {e}")))?;
    if &h.magic == b"ni1\0" {
        return Err(Reject::new("NIfTI header/image pairs (.hdr/.img, magic \"ni1\") are not supported; only single .nii files"));
    }
    let rank = h.dim[0] as usize;
    if !(1..=7).contains(&rank) {
        return Err(Reject::new(format!(
            "invalid NIfTI header: dim[0] = {} (must be 1 to 7)",
            h.dim[0] as i16
        )));
    }
    let mut all = [1usize; 7];
    for (i, slot) in all.iter_mut().enumerate().take(rank) {
        let d = h.dim[i + 1] as i16;
        if d <= 0 {
            return Err(Reject::new(format!(
                "invalid NIfTI header: dim[{}] = {d}",
                i + 1
            )));
        }
        *slot = d as usize;
    }
    let total: u64 = all.iter().map(|&d| d as u64).product();
    if total > MAX_VOXELS {
        return Err(Reject::new(format!(
            "NIfTI volume too large: {} = {total} voxels (limit {MAX_VOXELS})",
            all[..rank]
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join("x")
        )));
    }
    let datatype = h
        .data_type()
        .map_err(|_| Reject::new(format!("unknown NIfTI datatype code {}", h.datatype)))?;
    use NiftiType::*;
    match datatype {
        Uint8 | Int8 | Uint16 | Int16 | Uint32 | Int32 | Uint64 | Int64 | Float32 | Float64 => {}
        other => {
            return Err(Reject::new(format!(
                "unsupported NIfTI datatype {}",
                type_name(other)
            )))
        }
    }
    let vo = h.vox_offset;
    if !(348.0..=1e12).contains(&vo) {
        return Err(Reject::new(format!(
            "invalid NIfTI header: vox_offset = {vo}"
        )));
    }
    let slope = if h.scl_slope.is_finite() && h.scl_slope != 0.0 {
        h.scl_slope as f64
    } else {
        1.0
    };
    let inter = if h.scl_inter.is_finite() && h.scl_slope.is_finite() && h.scl_slope != 0.0 {
        h.scl_inter as f64
    } else {
        0.0
    };
    Ok(Layout {
        dims: [all[0], all[1], all[2]],
        volumes: all[3..].iter().product(),
        datatype,
        little_endian: h.endianness == Endianness::Little,
        vox_offset: vo as u64,
        slope,
        inter,
        spacing: volume::nifti_spacing(&h),
        axes: volume::nifti_axes(&h),
        time_step: {
            // xyzt_units bits 3-5: 8 seconds, 16 milliseconds, 24 microseconds.
            let scale = match h.xyzt_units & 0x38 {
                0x08 => Some(1.0),
                0x10 => Some(1e-3),
                0x18 => Some(1e-6),
                _ => None,
            };
            let step = h.pixdim[4] as f64;
            scale
                .filter(|_| step.is_finite() && step > 0.0)
                .map(|k| step * k)
        },
    })
}

fn type_name(t: NiftiType) -> &'static str {
    use NiftiType::*;
    match t {
        Uint8 => "UINT8",
        Int8 => "INT8",
        Uint16 => "UINT16",
        Int16 => "INT16",
        Uint32 => "UINT32",
        Int32 => "INT32",
        Uint64 => "UINT64",
        Int64 => "INT64",
        Float32 => "FLOAT32",
        Float64 => "FLOAT64",
        Float128 => "FLOAT128",
        Complex64 => "COMPLEX64",
        Complex128 => "COMPLEX128",
        Complex256 => "COMPLEX256",
        Rgb24 => "RGB24",
        Rgba32 => "RGBA32",
    }
}

enum ReadFail {
    /// The stream ended after this many bytes (or voxels, for `read_volume`).
    Eof(u64),
    Io(io::Error),
    Alloc,
}

/// Fill `buf`; on a short stream report how many bytes came.
fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> Result<(), ReadFail> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => return Err(ReadFail::Eof(got as u64)),
            Ok(k) => got += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(ReadFail::Eof(got as u64))
            }
            Err(e) => return Err(ReadFail::Io(e)),
        }
    }
    Ok(())
}

fn io_reject(what: &str, e: io::Error) -> Reject {
    match e.kind() {
        io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData => {
            Reject::new(format!("corrupt NIfTI gzip stream: {e}"))
        }
        _ => Reject::new(format!("{what}: {e}")),
    }
}

/// Read the next `n` voxels into `out` (cleared first), scaled by slope and intercept.
fn read_volume<R: Read>(
    r: &mut R,
    l: &Layout,
    n: usize,
    out: &mut Vec<f32>,
) -> Result<(), ReadFail> {
    out.clear();
    let size = l.datatype.size_of();
    let mut buf = vec![0u8; CHUNK - CHUNK % size];
    while out.len() < n {
        let want = ((n - out.len()) * size).min(buf.len());
        read_full(r, &mut buf[..want]).map_err(|e| match e {
            ReadFail::Eof(b) => ReadFail::Eof((out.len() + b as usize / size) as u64),
            e => e,
        })?;
        out.try_reserve(want / size).map_err(|_| ReadFail::Alloc)?;
        convert(&buf[..want], l, out);
    }
    Ok(())
}

fn convert(bytes: &[u8], l: &Layout, out: &mut Vec<f32>) {
    macro_rules! go {
        ($t:ty, $n:expr) => {{
            let (s, i) = (l.slope, l.inter);
            let le = l.little_endian;
            out.extend(bytes.chunks_exact($n).map(|c| {
                let a: [u8; $n] = c.try_into().unwrap();
                let v = if le {
                    <$t>::from_le_bytes(a)
                } else {
                    <$t>::from_be_bytes(a)
                };
                (v as f64 * s + i) as f32
            }));
        }};
    }
    use NiftiType::*;
    match l.datatype {
        Uint8 => go!(u8, 1),
        Int8 => go!(i8, 1),
        Uint16 => go!(u16, 2),
        Int16 => go!(i16, 2),
        Uint32 => go!(u32, 4),
        Int32 => go!(i32, 4),
        Uint64 => go!(u64, 8),
        Int64 => go!(i64, 8),
        Float32 => go!(f32, 4),
        Float64 => go!(f64, 8),
        _ => unreachable!("datatype checked in parse_header"),
    }
}

/// The (low, high) values at percentiles `p` (in percent) of the finite values of `vol`, with linear
/// interpolation between ranks as NumPy's default `percentile`. Above `PERCENTILE_SAMPLE` finite
/// voxels, an evenly strided sample is used. No finite voxel: (0, 0).
pub(crate) fn percentile_window(
    vol: &[f32],
    p: (f64, f64),
    scratch: &mut Vec<f32>,
) -> Result<(f64, f64), Reject> {
    scratch.clear();
    let finite = vol.iter().filter(|v| v.is_finite()).count();
    let stride = finite.div_ceil(PERCENTILE_SAMPLE).max(1);
    let want = finite.div_ceil(stride);
    scratch
        .try_reserve_exact(want.saturating_sub(scratch.capacity()))
        .map_err(|_| {
            Reject::new(format!(
                "cannot allocate {want} values for the percentile window"
            ))
        })?;
    scratch.extend(
        vol.iter()
            .copied()
            .filter(|v| v.is_finite())
            .step_by(stride),
    );
    Ok(percentiles_in_place(scratch, p))
}

fn percentiles_in_place(v: &mut [f32], p: (f64, f64)) -> (f64, f64) {
    let n = v.len();
    if n == 0 {
        return (0.0, 0.0);
    }
    let (pl, ph) = (p.0.clamp(0.0, 100.0), p.1.clamp(0.0, 100.0));
    let (pl, ph) = if pl <= ph { (pl, ph) } else { (ph, pl) };
    let pos = |q: f64| q / 100.0 * (n - 1) as f64;
    let (pos_lo, pos_hi) = (pos(pl), pos(ph));
    let (k_lo, k_hi) = (pos_lo.floor() as usize, pos_hi.floor() as usize);
    let min_of = |s: &[f32]| s.iter().copied().fold(f32::INFINITY, f32::min);

    v.select_nth_unstable_by(k_lo, f32::total_cmp);
    let lo_v = v[k_lo] as f64;
    let lo = interpolate(lo_v, pos_lo - k_lo as f64, || min_of(&v[k_lo + 1..]) as f64);
    let hi = if k_hi == k_lo {
        interpolate(lo_v, pos_hi - k_hi as f64, || min_of(&v[k_lo + 1..]) as f64)
    } else {
        let rest = &mut v[k_lo + 1..];
        let k = k_hi - k_lo - 1;
        rest.select_nth_unstable_by(k, f32::total_cmp);
        let hv = rest[k] as f64;
        interpolate(hv, pos_hi - k_hi as f64, || min_of(&rest[k + 1..]) as f64)
    };
    (lo, hi)
}

fn interpolate(at: f64, frac: f64, next: impl FnOnce() -> f64) -> f64 {
    if frac > 0.0 {
        let nx = next();
        if nx.is_finite() {
            return at + frac * (nx - at);
        }
    }
    at
}

/// Cut the volume `vol` (x fastest, then y, then z) into 2-D slices along `axis` and emit each as a
/// 16-bit grey image of `map(voxel)`. Columns follow the first remaining axis, rows the second;
/// along axis 2 row 0 is y = 0, along axes 0 and 1 the top row is the highest z (`volume`'s rule:
/// in LPS, anterior resp. superior at the top).
pub(crate) fn emit_slices(
    vol: &[f32],
    dims: [usize; 3],
    axis: usize,
    map: &dyn Fn(f32) -> u16,
    emit: &mut Emit,
) -> Result<(), Reject> {
    emit_view_slices(&View::stored(vol, dims), axis, map, emit)
}

/// `emit_slices` of a volume read through a view (oriented without a copy).
pub(crate) fn emit_view_slices(
    v: &View,
    axis: usize,
    map: &dyn Fn(f32) -> u16,
    emit: &mut Emit,
) -> Result<(), Reject> {
    cut(v, axis, map, &mut |w, h, px| {
        let img = ImageBuffer::<Luma<u16>, Vec<u16>>::from_raw(w, h, px)
            .expect("buffer holds w*h pixels");
        emit(DynamicImage::ImageLuma16(img).into())
    })
}

/// The slices of `emit_slices` as float frames of the voxel values themselves.
pub(crate) fn emit_float_slices(
    vol: &[f32],
    dims: [usize; 3],
    axis: usize,
    emit: &mut Emit,
) -> Result<(), Reject> {
    emit_float_view_slices(&View::stored(vol, dims), axis, emit)
}

/// `emit_float_slices` through a view.
pub(crate) fn emit_float_view_slices(v: &View, axis: usize, emit: &mut Emit) -> Result<(), Reject> {
    cut(v, axis, |x| x, &mut |w, h, px| {
        emit(Frame::Float(FloatFrame::grey(w, h, px)))
    })
}

/// The slicing rule of `emit_slices`: each slice's `map`ped values, row-major, to `out(width,
/// height, values)`.
fn cut<T>(
    v: &View,
    axis: usize,
    map: impl Fn(f32) -> T,
    out: &mut dyn FnMut(u32, u32, Vec<T>) -> Result<(), Reject>,
) -> Result<(), Reject> {
    let [nx, ny, nz] = v.dims;
    let flip = axis != 2;
    let row_of = |r: usize, h: usize| if flip { h - 1 - r } else { r };
    let (count, w, h) = match axis {
        0 => (nx, ny, nz),
        1 => (ny, nx, nz),
        _ => (nz, nx, ny),
    };
    for s in 0..count {
        let mut px: Vec<T> = Vec::with_capacity(w * h);
        for r in 0..h {
            let b = row_of(r, h);
            match axis {
                0 => px.extend((0..w).map(|c| map(v.at(s, c, b)))),
                1 => px.extend((0..w).map(|c| map(v.at(c, s, b)))),
                _ => match v.row(b, s) {
                    Some(row) => px.extend(row.iter().map(|&x| map(x))),
                    None => px.extend((0..w).map(|c| map(v.at(c, b, s)))),
                },
            }
        }
        out(w as u32, h as u32, px)?;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests;
