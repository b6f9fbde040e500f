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
//! Orientation: voxel axes are taken as stored (no reorientation by the affine). Within a slice,
//! columns follow the first remaining axis and rows run from the highest index of the second
//! remaining axis down to 0, as viewers show them (`imshow(slice.T, origin="lower")`): for axis 2
//! an image is `dim x` wide and `dim y` high with y = dim y - 1 on the top row; for axis 0 it is
//! `dim y` wide and `dim z` high, for axis 1 `dim x` wide and `dim z` high, the top row being the
//! highest z.

use super::{window_to_u16, DecodeOptions, Emit, FloatFrame, Frame, Probe, Reject};
use image::{DynamicImage, ImageBuffer, Luma};
use nifti::{Endianness, NiftiHeader, NiftiType};
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

/// A file may hold at most this many voxels in all.
pub const MAX_VOXELS: u64 = 1 << 31;
/// Percentiles are computed exactly on volumes up to this many finite voxels, and on an evenly
/// strided sample of this many above it (keeps the scratch copy at 256 MiB).
const PERCENTILE_SAMPLE: usize = 1 << 26;
/// Bytes read and converted at a time.
const CHUNK: usize = 1 << 20;

pub fn decode(path: &Path, opts: &DecodeOptions, emit: &mut Emit) -> Result<(), Reject> {
    if opts.axis > 2 {
        return Err(Reject::new(format!("axis {} is not 0, 1 or 2", opts.axis)));
    }
    let file = super::open_input(path)?;
    let file_len = file.metadata().map(|m| m.len()).ok();
    let mut buffered = BufReader::with_capacity(1 << 16, file);
    let head = buffered
        .fill_buf()
        .map_err(|e| Reject::new(format!("cannot read: {e}")))?;
    if head.len() >= 2 && head[0] == 0x1f && head[1] == 0x8b {
        decode_stream(
            flate2::read::MultiGzDecoder::new(buffered),
            None,
            opts,
            emit,
        )
    } else {
        decode_stream(buffered, file_len, opts, emit)
    }
}

/// A volume is grey; the slice size comes from the header alone (only its 348 bytes are read,
/// un-gzipped where needed).
pub fn probe(path: &Path, opts: &DecodeOptions) -> Result<Probe, Reject> {
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
    read.map_err(|_| Reject::new("cannot read a NIfTI-1 header"))?;
    let [x, y, z] = parse_header(&hdr)?.dims.map(|d| d as u32);
    // As `emit_slices` cuts them: (height, width) per axis.
    let size = match opts.axis {
        0 => (z, y),
        1 => (z, x),
        _ => (y, x),
    };
    Ok(Probe {
        colour: false,
        size: Some(size),
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
}

impl Layout {
    fn volume_voxels(&self) -> usize {
        self.dims[0] * self.dims[1] * self.dims[2]
    }
}

/// Decode a NIfTI-1 byte stream (already un-gzipped); `file_len` is the stream's length when known.
fn decode_stream<R: Read>(
    mut r: R,
    file_len: Option<u64>,
    opts: &DecodeOptions,
    emit: &mut Emit,
) -> Result<(), Reject> {
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
    // Grows as voxels arrive (a short gzip stream never claims its declared size).
    let mut vol: Vec<f32> = Vec::new();
    let mut scratch: Vec<f32> = Vec::new();
    for v in 0..layout.volumes {
        read_volume(&mut r, &layout, n, &mut vol).map_err(|e| match e {
            ReadFail::Eof(got) => Reject::new(format!(
                "truncated NIfTI: volume {v} of {} ends after {got} of its {} voxels",
                layout.volumes, n
            )),
            ReadFail::Io(e) => io_reject("cannot read NIfTI voxel data", e),
            ReadFail::Alloc => Reject::new(format!("cannot allocate a volume of {n} voxels")),
        })?;
        if opts.float {
            emit_float_slices(&vol, layout.dims, opts.axis, true, emit)?;
            continue;
        }
        let (low, high) = match opts.window {
            Some(w) => w,
            None => percentile_window(&vol, opts.percentiles, &mut scratch)?,
        };
        emit_slices(
            &vol,
            layout.dims,
            opts.axis,
            true,
            &|x| window_to_u16(x as f64, low, high),
            emit,
        )?;
    }
    Ok(())
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
/// with `flip` the top row is that axis's highest index (NIfTI's "as displayed"), without it index
/// 0 (DICOM rows, frames in order).
pub(crate) fn emit_slices(
    vol: &[f32],
    dims: [usize; 3],
    axis: usize,
    flip: bool,
    map: &dyn Fn(f32) -> u16,
    emit: &mut Emit,
) -> Result<(), Reject> {
    cut(vol, dims, axis, flip, map, &mut |w, h, px| {
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
    flip: bool,
    emit: &mut Emit,
) -> Result<(), Reject> {
    cut(vol, dims, axis, flip, |v| v, &mut |w, h, px| {
        emit(Frame::Float(FloatFrame::grey(w, h, px)))
    })
}

/// The slicing rule of `emit_slices`: each slice's `map`ped values, row-major, to `out(width,
/// height, values)`.
fn cut<T>(
    vol: &[f32],
    dims: [usize; 3],
    axis: usize,
    flip: bool,
    map: impl Fn(f32) -> T,
    out: &mut dyn FnMut(u32, u32, Vec<T>) -> Result<(), Reject>,
) -> Result<(), Reject> {
    let [nx, ny, nz] = dims;
    debug_assert_eq!(vol.len(), nx * ny * nz);
    let at = |x: usize, y: usize, z: usize| vol[x + nx * (y + ny * z)];
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
                0 => px.extend((0..w).map(|c| map(at(s, c, b)))),
                1 => px.extend((0..w).map(|c| map(at(c, s, b)))),
                _ => {
                    let row = &vol[nx * (b + ny * s)..][..nx];
                    px.extend(row.iter().map(|&v| map(v)));
                }
            }
        }
        out(w as u32, h as u32, px)?;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Write;

    /// A NIfTI-1 single file: 348-byte header, 4 extension bytes (none), voxel data.
    pub(crate) fn nifti_bytes(
        dims: &[u16],
        datatype: i16,
        bitpix: i16,
        slope: f32,
        inter: f32,
        data: &[u8],
        big: bool,
    ) -> Vec<u8> {
        let mut h = vec![0u8; 352];
        macro_rules! put {
            ($off:expr, $v:expr) => {{
                let b = if big {
                    $v.to_be_bytes()
                } else {
                    $v.to_le_bytes()
                };
                h[$off..$off + b.len()].copy_from_slice(&b);
            }};
        }
        put!(0, 348i32);
        put!(40, dims.len() as i16);
        for i in 0..7 {
            put!(42 + 2 * i, *dims.get(i).unwrap_or(&1) as i16);
        }
        put!(70, datatype);
        put!(72, bitpix);
        for i in 0..8 {
            put!(76 + 4 * i, 1.0f32);
        }
        put!(108, 352.0f32);
        put!(112, slope);
        put!(116, inter);
        h[344..348].copy_from_slice(b"n+1\0");
        h.extend_from_slice(data);
        h
    }

    pub(crate) fn i16_data(vals: impl IntoIterator<Item = i16>, big: bool) -> Vec<u8> {
        vals.into_iter()
            .flat_map(|v| {
                if big {
                    v.to_be_bytes()
                } else {
                    v.to_le_bytes()
                }
            })
            .collect()
    }

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    fn gz(bytes: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    type Gray16 = ImageBuffer<Luma<u16>, Vec<u16>>;

    fn run(path: &Path, opts: &DecodeOptions) -> Result<Vec<Gray16>, Reject> {
        let mut out = Vec::new();
        decode(path, opts, &mut |f: Frame| {
            match f.expect_image() {
                DynamicImage::ImageLuma16(b) => out.push(b),
                other => panic!("expected Luma16, got {:?}", other.color()),
            }
            Ok(())
        })?;
        Ok(out)
    }

    #[test]
    fn probe_gives_the_decoded_slice_size() {
        let t = tempfile::tempdir().unwrap();
        let data = i16_data((0..4 * 5 * 6).map(|i| i as i16), false);
        let bytes = nifti_bytes(&[4, 5, 6], 4, 16, 1.0, 0.0, &data, false);
        for (name, b) in [("a.nii", bytes.clone()), ("b.nii.gz", gz(&bytes))] {
            let p = write(t.path(), name, &b);
            for axis in 0..3 {
                let o = opts(axis, None);
                let first = &run(&p, &o).unwrap()[0];
                let got = probe(&p, &o).unwrap();
                assert!(!got.colour);
                assert_eq!(
                    got.size,
                    Some((first.height(), first.width())),
                    "{name} axis {axis}"
                );
            }
        }
        let p = write(t.path(), "short.nii", &bytes[..100]);
        assert!(probe(&p, &opts(2, None)).is_err());
    }

    fn opts(axis: usize, window: Option<(f64, f64)>) -> DecodeOptions {
        DecodeOptions {
            axis,
            window,
            ..DecodeOptions::default()
        }
    }

    /// 4 x 3 x 2 volume whose voxel (x, y, z) holds x + 4y + 12z; stored value v is scaled to
    /// 2v + 10 by the header.
    fn small(big: bool) -> Vec<u8> {
        nifti_bytes(&[4, 3, 2], 4, 16, 2.0, 10.0, &i16_data(0..24, big), big)
    }

    #[test]
    fn slices_along_each_axis_with_given_window() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "v.nii", &small(false));
        // Window 10..56 covers scaled values 2*0+10 ..= 2*23+10 exactly.
        let w = Some((10.0, 56.0));
        let z = run(&p, &opts(2, w)).unwrap();
        assert_eq!(z.len(), 2);
        assert_eq!(z[0].dimensions(), (4, 3));
        let val = |x: u32, y: u32, zz: u32| {
            window_to_u16((2 * (x + 4 * y + 12 * zz) + 10) as f64, 10.0, 56.0)
        };
        // Top row is the highest y.
        for zz in 0..2 {
            for r in 0..3 {
                for x in 0..4 {
                    assert_eq!(
                        z[zz as usize].get_pixel(x, r)[0],
                        val(x, 2 - r, zz),
                        "z={zz} row={r} x={x}"
                    );
                }
            }
        }
        assert_eq!(z[0].get_pixel(0, 2)[0], 0);
        assert_eq!(z[1].get_pixel(3, 0)[0], 65535);

        let x = run(&p, &opts(0, w)).unwrap();
        assert_eq!(x.len(), 4);
        assert_eq!(x[0].dimensions(), (3, 2));
        assert_eq!(x[1].get_pixel(2, 0)[0], val(1, 2, 1));
        assert_eq!(x[1].get_pixel(0, 1)[0], val(1, 0, 0));

        let y = run(&p, &opts(1, w)).unwrap();
        assert_eq!(y.len(), 3);
        assert_eq!(y[0].dimensions(), (4, 2));
        assert_eq!(y[2].get_pixel(3, 0)[0], val(3, 2, 1));
        assert_eq!(y[2].get_pixel(1, 1)[0], val(1, 2, 0));

        assert!(run(&p, &opts(3, w)).unwrap_err().0.contains("axis"));
    }

    #[test]
    fn float_option_emits_scaled_values_without_window() {
        let dir = tempfile::tempdir().unwrap();
        let float = |axis| DecodeOptions {
            float: true,
            ..opts(axis, Some((0.0, 1.0)))
        };
        let run_float = |p: &Path, o: &DecodeOptions| {
            let mut out = Vec::new();
            decode(p, o, &mut |f| {
                match f {
                    Frame::Float(f) => out.push(f),
                    Frame::Image(_) => panic!("expected float values"),
                }
                Ok(())
            })
            .map(|()| out)
        };
        // int16 v scaled to 2v + 10; the window option does not apply.
        let p = write(dir.path(), "v.nii.gz", &gz(&small(true)));
        let z = run_float(&p, &float(2)).unwrap();
        assert_eq!(z.len(), 2);
        assert_eq!((z[1].width, z[1].height), (4, 3));
        // Slice z = 1, top row y = 2: voxels 12 + 8 + x.
        assert_eq!(z[1].data[..4], [50.0, 52.0, 54.0, 56.0]);
        let x = run_float(&p, &float(0)).unwrap();
        assert_eq!(x.len(), 4);
        assert_eq!(x[1].data[2], (2 * (1 + 4 * 2 + 12) + 10) as f32);
        // float64 voxels are rounded to float32; NaN stays, for the conversion to reject.
        let vals = [0.1f64, -1e-3, f64::NAN, 1e300, 7.0, -2.5];
        let data: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let p = write(
            dir.path(),
            "d.nii",
            &nifti_bytes(&[3, 2, 1], 64, 64, 1.0, 0.0, &data, false),
        );
        let f = run_float(&p, &float(2)).unwrap();
        let want = [f32::INFINITY, 7.0, -2.5, 0.1, -1e-3, f32::NAN];
        assert_eq!(
            f[0].data.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn big_endian_and_gzip_give_the_same_images() {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(2, None);
        let a = run(&write(dir.path(), "a.nii", &small(false)), &o).unwrap();
        let b = run(&write(dir.path(), "b.nii", &small(true)), &o).unwrap();
        let c = run(&write(dir.path(), "c.nii.gz", &gz(&small(false))), &o).unwrap();
        let d = run(&write(dir.path(), "d.nii.gz", &gz(&small(true))), &o).unwrap();
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert_eq!(a, d);
    }

    #[test]
    fn percentile_window_and_slope_zero() {
        let dir = tempfile::tempdir().unwrap();
        // 10 x 10 x 1 with values 0..99 and slope 0 (= unscaled).
        let bytes = nifti_bytes(
            &[10, 10, 1],
            4,
            16,
            0.0,
            5.0,
            &i16_data(0..100, false),
            false,
        );
        let p = write(dir.path(), "p.nii", &bytes);
        let o = DecodeOptions {
            percentiles: (10.0, 90.0),
            ..DecodeOptions::default()
        };
        let imgs = run(&p, &o).unwrap();
        assert_eq!(imgs.len(), 1);
        // NumPy: percentile(arange(100), [10, 90]) = [9.9, 89.1].
        let (lo, hi) = (9.9, 89.1);
        let px = |v: u32| imgs[0].get_pixel(v % 10, 9 - v / 10)[0];
        assert_eq!(px(5), 0);
        assert_eq!(px(95), 65535);
        assert_eq!(px(50), window_to_u16(50.0, lo, hi));
        assert!((px(50) as i32 - 32768).abs() < 700, "{}", px(50));
    }

    #[test]
    fn percentiles_match_numpy() {
        let mut v: Vec<f32> = (0..1000).rev().map(|x| x as f32).collect();
        let (lo, hi) = percentiles_in_place(&mut v, (0.5, 99.5));
        assert!((lo - 4.995).abs() < 1e-9, "{lo}");
        assert!((hi - 994.005).abs() < 1e-6, "{hi}");
        let mut one = vec![7.0f32];
        assert_eq!(percentiles_in_place(&mut one, (0.5, 99.5)), (7.0, 7.0));
        let mut s = Vec::new();
        assert_eq!(
            percentile_window(&[f32::NAN, f32::INFINITY], (1.0, 99.0), &mut s).unwrap(),
            (0.0, 0.0)
        );
    }

    #[test]
    fn four_d_windows_each_volume_and_ignores_nan() {
        let dir = tempfile::tempdir().unwrap();
        // 2 x 2 x 2 x 3 float32 volumes; volume t holds (i + 1) * 10^t, one NaN in volume 1.
        let mut vals = Vec::new();
        for t in 0..3 {
            for i in 0..8 {
                vals.push(if t == 1 && i == 3 {
                    f32::NAN
                } else {
                    (i + 1) as f32 * 10f32.powi(t)
                });
            }
        }
        let data: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let p = write(
            dir.path(),
            "t.nii.gz",
            &gz(&nifti_bytes(&[2, 2, 2, 3], 16, 32, 1.0, 0.0, &data, false)),
        );
        let o = DecodeOptions {
            percentiles: (0.0, 100.0),
            ..DecodeOptions::default()
        };
        let imgs = run(&p, &o).unwrap();
        assert_eq!(imgs.len(), 6);
        assert!(imgs.iter().all(|i| i.dimensions() == (2, 2)));
        // Min and max of every volume map to 0 and 65535 whatever the volume's scale.
        for t in [0, 2] {
            assert_eq!(imgs[2 * t].get_pixel(0, 1)[0], 0);
            assert_eq!(imgs[2 * t + 1].get_pixel(1, 0)[0], 65535);
            assert_eq!(imgs[2 * t], imgs[0]);
        }
        // NaN voxel (x=1, y=1, z=0) of volume 1 is 0, not a window bound.
        assert_eq!(imgs[2].get_pixel(1, 0)[0], 0);
        assert_eq!(imgs[3].get_pixel(1, 0)[0], 65535);
        assert_eq!(imgs[2].get_pixel(0, 1)[0], 0);
    }

    #[test]
    fn absurd_headers_are_rejected_before_allocating() {
        let dir = tempfile::tempdir().unwrap();
        let huge = nifti_bytes(&[30000, 30000, 30000], 4, 16, 1.0, 0.0, &[0; 64], false);
        let e = run(&write(dir.path(), "h.nii", &huge), &opts(2, None)).unwrap_err();
        assert!(e.0.contains("too large"), "{e}");
        let e = run(&write(dir.path(), "h.nii.gz", &gz(&huge)), &opts(2, None)).unwrap_err();
        assert!(e.0.contains("too large"), "{e}");
        // Within the limit but far beyond the file: truncated, from the file size alone.
        let big = nifti_bytes(&[1024, 1024, 1024], 4, 16, 1.0, 0.0, &[0; 64], false);
        let e = run(&write(dir.path(), "b.nii", &big), &opts(2, None)).unwrap_err();
        assert!(e.0.starts_with("truncated NIfTI"), "{e}");
        let e = run(&write(dir.path(), "b.nii.gz", &gz(&big)), &opts(2, None)).unwrap_err();
        assert!(e.0.starts_with("truncated NIfTI"), "{e}");
        // Negative dimension, unsupported type, NIfTI-2, ni1 magic.
        let mut neg = small(false);
        neg[44..46].copy_from_slice(&(-3i16).to_le_bytes());
        assert!(run(&write(dir.path(), "n.nii", &neg), &opts(2, None))
            .unwrap_err()
            .0
            .contains("dim[2]"));
        let mut rgb = small(false);
        rgb[70..72].copy_from_slice(&128i16.to_le_bytes());
        assert!(run(&write(dir.path(), "r.nii", &rgb), &opts(2, None))
            .unwrap_err()
            .0
            .contains("RGB24"));
        let mut two = small(false);
        two[0..4].copy_from_slice(&540i32.to_le_bytes());
        assert!(run(&write(dir.path(), "2.nii", &two), &opts(2, None))
            .unwrap_err()
            .0
            .contains("NIfTI-2"));
        let mut pair = small(false);
        pair[344..348].copy_from_slice(b"ni1\0");
        assert!(run(&write(dir.path(), "i.nii", &pair), &opts(2, None))
            .unwrap_err()
            .0
            .contains("ni1"));
    }

    #[test]
    fn truncated_and_garbage_files_are_rejects() {
        let dir = tempfile::tempdir().unwrap();
        let full = small(false);
        let zipped = gz(&full);
        for cut in [0, 1, 100, 347, 348, 351, 352, 353, full.len() - 1] {
            let e = run(&write(dir.path(), "t.nii", &full[..cut]), &opts(2, None)).unwrap_err();
            assert!(
                e.0.contains("truncated") || e.0.contains("not a NIfTI"),
                "cut {cut}: {e}"
            );
        }
        for cut in [
            1,
            2,
            10,
            zipped.len() / 2,
            zipped.len() - 9,
            zipped.len() - 1,
        ] {
            let r = run(
                &write(dir.path(), "t.nii.gz", &zipped[..cut]),
                &opts(2, None),
            );
            // Cutting only the gzip trailer may leave every voxel readable; never a panic.
            if let Err(e) = r {
                assert!(!e.0.is_empty());
            }
        }
        let cut = run(
            &write(dir.path(), "t.nii.gz", &zipped[..zipped.len() / 2]),
            &opts(2, None),
        )
        .unwrap_err();
        assert!(
            cut.0.contains("truncated") || cut.0.contains("corrupt"),
            "{cut}"
        );
        let mut seed = 0x9e3779b97f4a7c15u64;
        for len in [0usize, 3, 348, 352, 1000, 5000] {
            let junk: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            assert!(run(&write(dir.path(), "j.nii", &junk), &opts(2, None)).is_err());
            let mut gzj = vec![0x1f, 0x8b];
            gzj.extend_from_slice(&junk);
            assert!(run(&write(dir.path(), "j.nii.gz", &gzj), &opts(2, None)).is_err());
        }
        // Byte flips in the header: errors or images, never panics.
        for i in 0..352 {
            let mut b = full.clone();
            b[i] ^= 0xA5;
            let _ = run(&write(dir.path(), "f.nii", &b), &opts(2, None));
        }
    }

    #[test]
    fn emit_error_stops_decoding() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "v.nii", &small(false));
        let mut n = 0;
        let e = decode(&p, &opts(2, None), &mut |_| {
            n += 1;
            Err(Reject::new("stop"))
        })
        .unwrap_err();
        assert_eq!(e.0, "stop");
        assert_eq!(n, 1);
    }
}
