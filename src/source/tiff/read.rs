//! From a page's samples as the `tiff` crate decodes them to a `Page`: pixels kept as they are
//! (grey, RGB, CMYK and YCbCr to RGB, sub-byte grey scaled), values as float32 planes of the kept
//! channels; and a way around the crate's misreading of planar tiles.

use super::{tiff_error, Info, Model, Page, Tiff, Ty};
use crate::source::images::MAX_ALLOC;
use crate::source::FloatFrame;
use ::tiff::decoder::{ChunkType, DecodingResult, TiffCodingUnit};
use ::tiff::TiffError;
use image::{DynamicImage, ImageBuffer};

/// Decode the current page: sizes checked before anything is allocated.
pub(super) fn read(d: &mut Tiff, i: &Info) -> Result<Page, String> {
    let n = i.width as usize * i.height as usize;
    let bytes = match i.ty {
        Ty::Bits(b) => (i.width as usize * b as usize).div_ceil(8) * i.height as usize,
        t => n * i.samples * t.bytes(),
    };
    let too_big = |what: &str, b: usize| {
        format!(
            "{}x{} pixels of {} {} samples: {b} bytes {what}, over the limit of {MAX_ALLOC}",
            i.width,
            i.height,
            i.samples,
            i.ty.name()
        )
    };
    if bytes as u64 > MAX_ALLOC {
        return Err(too_big("decoded", bytes));
    }
    if !i.ty.is_pixels() && (n * i.keep() * 4) as u64 > MAX_ALLOC {
        return Err(too_big("as float32 values", n * i.keep() * 4));
    }
    let res = if i.planar && i.samples > 1 && d.get_chunk_type() == ChunkType::Tile {
        planar_tiles(d, i, bytes)?
    } else {
        let mut res = DecodingResult::U8(Vec::new());
        let layout = d
            .read_image_to_buffer(&mut res)
            .map_err(|e| format!("cannot decode: {}", tiff_error(e)))?;
        if res.as_buffer(0).byte_len() < layout.complete_len.min(bytes) {
            return Err("not every plane could be decoded within the limits".into());
        }
        res
    };
    let short = || "internal: the decoded samples do not fill the page".to_string();
    let need = n * i.samples;
    let values = |len: usize| if len < need { Err(short()) } else { Ok(()) };
    Ok(match (i.ty, res) {
        (Ty::Bits(b), DecodingResult::U8(v)) => {
            let px = unpack(&v, i.width as usize, i.height as usize, b).ok_or_else(short)?;
            let img = ImageBuffer::from_raw(i.width, i.height, px).ok_or_else(short)?;
            Page::Image(DynamicImage::ImageLuma8(img))
        }
        (Ty::U8, DecodingResult::U8(v)) => {
            values(v.len())?;
            let (px, kind) = pixels(v, i);
            match kind {
                Px::Grey => {
                    ImageBuffer::from_raw(i.width, i.height, px).map(DynamicImage::ImageLuma8)
                }
                Px::Rgb => {
                    ImageBuffer::from_raw(i.width, i.height, px).map(DynamicImage::ImageRgb8)
                }
                Px::Rgba => {
                    ImageBuffer::from_raw(i.width, i.height, px).map(DynamicImage::ImageRgba8)
                }
            }
            .map(Page::Image)
            .ok_or_else(short)?
        }
        (Ty::U16, DecodingResult::U16(v)) => {
            values(v.len())?;
            let (px, kind) = pixels(v, i);
            match kind {
                Px::Grey => {
                    ImageBuffer::from_raw(i.width, i.height, px).map(DynamicImage::ImageLuma16)
                }
                Px::Rgb => {
                    ImageBuffer::from_raw(i.width, i.height, px).map(DynamicImage::ImageRgb16)
                }
                Px::Rgba => {
                    ImageBuffer::from_raw(i.width, i.height, px).map(DynamicImage::ImageRgba16)
                }
            }
            .map(Page::Image)
            .ok_or_else(short)?
        }
        (Ty::U32, DecodingResult::U32(v)) => float_planes(&v, i, need, |x| x as f32)?,
        (Ty::U64, DecodingResult::U64(v)) => float_planes(&v, i, need, |x| x as f32)?,
        (Ty::I8, DecodingResult::I8(v)) => float_planes(&v, i, need, f32::from)?,
        (Ty::I16, DecodingResult::I16(v)) => float_planes(&v, i, need, f32::from)?,
        (Ty::I32, DecodingResult::I32(v)) => float_planes(&v, i, need, |x| x as f32)?,
        (Ty::I64, DecodingResult::I64(v)) => float_planes(&v, i, need, |x| x as f32)?,
        (Ty::F16, DecodingResult::F16(v)) => float_planes(&v, i, need, |x| x.to_f32())?,
        (Ty::F32, DecodingResult::F32(v)) => float_planes(&v, i, need, |x| x)?,
        (Ty::F64, DecodingResult::F64(v)) => float_planes(&v, i, need, |x| x as f32)?,
        (t, _) => {
            return Err(format!(
                "internal: {} samples decoded as another type",
                t.name()
            ))
        }
    })
}

/// A planar tiled page, read one coding unit (a tile's place in every plane) at a time. The crate
/// sizes the tiles of planes after the first as if none ended at the image's bottom edge: reading
/// the whole page, their overhanging rows land in the next plane, or past the buffer's end (a
/// panic). A unit's planes are read in order into a buffer with room for the last one's overhang,
/// so each overhang is overwritten or falls in that room; the units are then placed in the page.
fn planar_tiles(d: &mut Tiff, i: &Info, bytes: usize) -> Result<DecodingResult, String> {
    let err = |e: TiffError| format!("cannot decode: {}", tiff_error(e));
    let (w, h) = (i.width as usize, i.height as usize);
    let (tw, th) = d.chunk_dimensions();
    let (tw, th) = (tw as usize, th as usize);
    let size = i.ty.bytes();
    let (across, down) = (w.div_ceil(tw), h.div_ceil(th));
    let mut page = vec![0u8; bytes];
    let mut unit = Vec::new();
    for ty in 0..down {
        for tx in 0..across {
            let code = TiffCodingUnit((ty * across + tx) as u32);
            let layout = d.image_coding_unit_layout(code).map_err(err)?;
            let (uw, uh) = (tw.min(w - tx * tw), th.min(h - ty * th));
            let (row, plane) = (uw * size, uw * uh * size);
            if layout.complete_len != plane * i.samples {
                return Err("internal: unexpected layout of a planar tile".into());
            }
            // Room for the last plane's overhang: `th` rows where the tile has `uh`.
            let room = (th - uh) * row;
            if room as u64 > MAX_ALLOC {
                return Err(format!("tiles of {tw}x{th} for a {w}x{h} page: absurd"));
            }
            unit.clear();
            unit.resize(layout.complete_len + room, 0);
            d.read_coding_unit_bytes(code, &mut unit).map_err(err)?;
            for c in 0..i.samples {
                for r in 0..uh {
                    let to = c * w * h * size + ((ty * th + r) * w + tx * tw) * size;
                    page[to..to + row].copy_from_slice(&unit[c * plane + r * row..][..row]);
                }
            }
        }
    }
    Ok(typed(page, i.ty))
}

/// Native-endian sample bytes as the crate's typed buffer.
fn typed(b: Vec<u8>, ty: Ty) -> DecodingResult {
    macro_rules! ne {
        ($t:ty, $n:expr, $f:expr) => {
            b.chunks_exact($n)
                .map(|c| {
                    let mut a = [0u8; $n];
                    a.copy_from_slice(c);
                    $f(<$t>::from_ne_bytes(a))
                })
                .collect()
        };
    }
    match ty {
        Ty::Bits(_) | Ty::U8 => DecodingResult::U8(b),
        Ty::I8 => DecodingResult::I8(b.into_iter().map(|v| v as i8).collect()),
        Ty::U16 => DecodingResult::U16(ne!(u16, 2, |v| v)),
        Ty::I16 => DecodingResult::I16(ne!(i16, 2, |v| v)),
        Ty::F16 => DecodingResult::F16(ne!(u16, 2, half::f16::from_bits)),
        Ty::U32 => DecodingResult::U32(ne!(u32, 4, |v| v)),
        Ty::I32 => DecodingResult::I32(ne!(i32, 4, |v| v)),
        Ty::F32 => DecodingResult::F32(ne!(f32, 4, |v| v)),
        Ty::U64 => DecodingResult::U64(ne!(u64, 8, |v| v)),
        Ty::I64 => DecodingResult::I64(ne!(i64, 8, |v| v)),
        Ty::F64 => DecodingResult::F64(ne!(f64, 8, |v| v)),
    }
}

/// How 8/16-bit pixels are interleaved.
enum Px {
    Grey,
    Rgb,
    Rgba,
}

/// An 8 or 16-bit sample.
trait Sub: Copy {
    const MAX: u32;
    fn get(self) -> u32;
    fn of(v: u32) -> Self;
}

impl Sub for u8 {
    const MAX: u32 = 255;
    fn get(self) -> u32 {
        self as u32
    }
    fn of(v: u32) -> Self {
        v.min(255) as u8
    }
}

impl Sub for u16 {
    const MAX: u32 = 65535;
    fn get(self) -> u32 {
        self as u32
    }
    fn of(v: u32) -> Self {
        v.min(65535) as u16
    }
}

/// 8/16-bit samples (`i.samples` of a pixel, interleaved or in planes) as interleaved grey, RGB,
/// or RGBA pixels. Grey, RGB and chunky RGBA are the decoded buffer itself, as before.
fn pixels<T: Sub>(v: Vec<T>, i: &Info) -> (Vec<T>, Px) {
    let n = i.width as usize * i.height as usize;
    let at = |p: usize, c: usize| {
        if i.planar {
            v[c * n + p]
        } else {
            v[p * i.samples + c]
        }
    };
    match i.model {
        Model::Grey if i.samples == 1 => (v, Px::Grey),
        Model::Grey => ((0..n).map(|p| at(p, 0)).collect(), Px::Grey),
        Model::Rgb if !i.planar && i.samples == 3 => (v, Px::Rgb),
        Model::Rgb if !i.planar && i.samples == 4 => (v, Px::Rgba),
        Model::Rgb => (
            (0..n)
                .flat_map(|p| (0..3).map(move |c| (p, c)))
                .map(|(p, c)| at(p, c))
                .collect(),
            Px::Rgb,
        ),
        Model::Cmyk => {
            let mut out = Vec::with_capacity(n * 3);
            for p in 0..n {
                let k = T::MAX - at(p, 3).get().min(T::MAX);
                for c in 0..3 {
                    let ink = T::MAX - at(p, c).get().min(T::MAX);
                    let v = (ink as u64 * k as u64 + T::MAX as u64 / 2) / T::MAX as u64;
                    out.push(T::of(v as u32));
                }
            }
            (out, Px::Rgb)
        }
        Model::YCbCr => {
            let mut out = Vec::with_capacity(n * 3);
            let half = (T::MAX + 1) as f32 / 2.0;
            for p in 0..n {
                let y = at(p, 0).get() as f32;
                let cb = at(p, 1).get() as f32 - half;
                let cr = at(p, 2).get() as f32 - half;
                for v in [
                    y + 1.402 * cr,
                    y - 0.344_136 * cb - 0.714_136 * cr,
                    y + 1.772 * cb,
                ] {
                    out.push(T::of(v.round().clamp(0.0, T::MAX as f32) as u32));
                }
            }
            (out, Px::Rgb)
        }
    }
}

/// Values (`i.samples` of a pixel, interleaved or in planes) as float32 planes of the kept
/// channels. `need`: the samples the buffer must hold.
fn float_planes<T: Copy>(
    v: &[T],
    i: &Info,
    need: usize,
    f: impl Fn(T) -> f32,
) -> Result<Page, String> {
    if v.len() < need {
        return Err("internal: the decoded samples do not fill the page".into());
    }
    let n = i.width as usize * i.height as usize;
    let keep = i.keep();
    let mut data = Vec::with_capacity(n * keep);
    for c in 0..keep {
        if i.planar {
            data.extend(v[c * n..][..n].iter().map(|&x| f(x)));
        } else {
            data.extend(v[c..].iter().step_by(i.samples).take(n).map(|&x| f(x)));
        }
    }
    Ok(Page::Values(FloatFrame {
        channels: keep,
        height: i.height,
        width: i.width,
        data,
    }))
}

/// Packed `bits`-bit grey samples (rows padded to whole bytes, first sample in the high bits) as
/// 8-bit pixels scaled onto 0..=255.
fn unpack(v: &[u8], w: usize, h: usize, bits: u8) -> Option<Vec<u8>> {
    let b = bits as usize;
    let stride = (w * b).div_ceil(8);
    if v.len() < stride * h || !(1..=7).contains(&b) {
        return None;
    }
    let mask = (1u16 << b) - 1;
    let mut out = Vec::with_capacity(w * h);
    for row in v.chunks_exact(stride).take(h) {
        for x in 0..w {
            let bit = x * b;
            let hi = row[bit / 8] as u16;
            let lo = row.get(bit / 8 + 1).copied().unwrap_or(0) as u16;
            let s = ((hi << 8 | lo) >> (16 - bit % 8 - b)) & mask;
            out.push(((s as u32 * 255 + mask as u32 / 2) / mask as u32) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_byte_grey_unpacks_across_bytes() {
        // 3-bit samples 0..7, then 7 again: 9 samples in 27 bits, the row padded to 4 bytes.
        let row: u32 = (0..8).fold(0, |a, v| a << 3 | v) << 8 | 0b111 << 5;
        let bytes = row.to_be_bytes();
        let px = unpack(&bytes, 9, 1, 3).unwrap();
        let want: Vec<u8> = (0..8)
            .chain([7])
            .map(|v| ((v * 255 + 3) / 7) as u8)
            .collect();
        assert_eq!(px, want);
        assert!(unpack(&bytes[..3], 9, 1, 3).is_none(), "short rows");
        assert_eq!(unpack(&[0b1010_0000], 3, 1, 1).unwrap(), [255, 0, 255]);
    }

    #[test]
    fn typed_buffers_from_native_bytes() {
        let b: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        match typed(b, Ty::F32) {
            DecodingResult::F32(v) => assert_eq!(v, [1.5, -2.0]),
            _ => panic!("not f32"),
        }
        match typed(vec![0xff, 0x01], Ty::I8) {
            DecodingResult::I8(v) => assert_eq!(v, [-1, 1]),
            _ => panic!("not i8"),
        }
        let b: Vec<u8> = [half::f16::from_f32(0.5)]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        match typed(b, Ty::F16) {
            DecodingResult::F16(v) => assert_eq!(v[0].to_f32(), 0.5),
            _ => panic!("not f16"),
        }
    }
}
