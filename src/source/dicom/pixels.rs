//! Pixel data checked before it is decoded (dimensions, JPEG and RLE fragments) and the layout
//! and window of what is decoded.

use super::*;

/// The DICOM linear window (PS3.3 C.11.2.1.2.1) as the (low, high) that `window_to_u16` maps onto
/// 0 and 65535; `None` for a width below 1 (not a valid window).
pub(super) fn dicom_window(center: f64, width: f64) -> Option<(f64, f64)> {
    if !center.is_finite() || !width.is_finite() || width < 1.0 {
        return None;
    }
    let half = (width - 1.0) / 2.0;
    Some((center - 0.5 - half, center - 0.5 + half))
}

pub(in crate::source) fn min_max(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values {
        if v.is_finite() {
            lo = lo.min(v);
            hi = hi.max(v);
        }
    }
    if lo > hi {
        (0.0, 0.0)
    } else {
        (lo, hi)
    }
}

/// How to read stored samples out of a frame's native bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct SampleLayout {
    /// Bytes per sample: 1, 2 or 4.
    pub(super) bytes: usize,
    /// Bits stored (1..=8 * bytes).
    pub(super) bits: u32,
    /// Right shift that puts the high bit at `bits - 1`.
    pub(super) shift: u32,
    pub(super) signed: bool,
}

impl SampleLayout {
    pub(super) fn of(px: &DecodedPixelData) -> Result<Self, Reject> {
        let ba = px.bits_allocated() as u32;
        let bytes = match ba {
            1 | 8 => 1, // 1-bit data comes expanded to one byte per sample (0 or 255)
            16 => 2,
            32 => 4,
            _ => return Err(Reject::new(format!("unsupported Bits Allocated {ba}"))),
        };
        let width = 8 * bytes as u32;
        let mut bits = px.bits_stored() as u32;
        if bits == 0 || bits > width || ba == 1 {
            bits = if ba == 1 { 8 } else { width };
        }
        let high = px.high_bit() as u32;
        let shift = if high < width && high + 1 >= bits {
            high + 1 - bits
        } else {
            0
        };
        Ok(SampleLayout {
            bytes,
            bits,
            shift,
            signed: px.pixel_representation() == PixelRepresentation::Signed,
        })
    }

    /// The raw samples (bits stored, shifted down), unsigned.
    pub(super) fn unsigned_values<'a>(&self, data: &'a [u8]) -> impl Iterator<Item = u32> + 'a {
        let (bytes, shift) = (self.bytes, self.shift);
        let mask = if self.bits >= 32 {
            u32::MAX
        } else {
            (1u32 << self.bits) - 1
        };
        data.chunks_exact(bytes).map(move |c| {
            let raw = match bytes {
                1 => c[0] as u32,
                2 => u16::from_ne_bytes([c[0], c[1]]) as u32,
                _ => u32::from_ne_bytes([c[0], c[1], c[2], c[3]]),
            };
            (raw >> shift) & mask
        })
    }

    /// The stored values, sign-extended for Pixel Representation 1.
    pub(super) fn values<'a>(&self, data: &'a [u8]) -> impl Iterator<Item = i64> + 'a {
        let (bits, signed) = (self.bits, self.signed);
        self.unsigned_values(data).map(move |u| {
            let u = u as i64;
            if signed && (u >> (bits - 1)) & 1 == 1 {
                u - (1i64 << bits)
            } else {
                u
            }
        })
    }
}

/// Rows, Columns, Number of Frames and Samples per Pixel, checked before any pixel data is decoded.
pub(super) fn check_dimensions(obj: &DefaultDicomObject) -> Result<(), Reject> {
    let int = |tag, name: &str, required: bool| -> Result<Option<i64>, Reject> {
        match obj.get(tag) {
            None if required => Err(Reject::new(format!("missing {name}"))),
            None => Ok(None),
            Some(e) if e.is_empty() && !required => Ok(None),
            Some(e) => e.to_int::<i64>().map(Some).map_err(|_| {
                Reject::new(format!(
                    "invalid {name}: {:?}",
                    e.to_str().unwrap_or_default()
                ))
            }),
        }
    };
    let rows = int(tags::ROWS, "Rows", true)?.unwrap_or(0);
    let cols = int(tags::COLUMNS, "Columns", true)?.unwrap_or(0);
    let frames = int(tags::NUMBER_OF_FRAMES, "Number of Frames", false)?.unwrap_or(1);
    let spp = int(tags::SAMPLES_PER_PIXEL, "Samples per Pixel", false)?.unwrap_or(1);
    for (v, name) in [(rows, "Rows"), (cols, "Columns")] {
        if !(1..=65535).contains(&v) {
            return Err(Reject::new(format!("invalid image size: {name} = {v}")));
        }
    }
    if frames < 1 || !(1..=4).contains(&spp) {
        return Err(Reject::new(format!(
            "invalid image: Number of Frames = {frames}, Samples per Pixel = {spp}"
        )));
    }
    let total = (rows as u64) * (cols as u64) * (spp as u64);
    let total = total.saturating_mul(frames as u64);
    if total > MAX_SAMPLES {
        return Err(Reject::new(format!(
            "DICOM image too large: {frames} frame(s) of {rows}x{cols}x{spp} = {total} samples (limit {MAX_SAMPLES})"
        )));
    }
    Ok(())
}

/// The JPEG transfer syntaxes dicom-rs decodes (Baseline, Extended, Lossless 14 and 14 SV1).
pub(super) const JPEG_SYNTAXES: [&str; 4] = [
    "1.2.840.10008.1.2.4.50",
    "1.2.840.10008.1.2.4.51",
    "1.2.840.10008.1.2.4.57",
    "1.2.840.10008.1.2.4.70",
];

/// For JPEG pixel data: every frame header (SOF) of the JPEG streams dicom-rs will decode must
/// describe the image the attributes declare (Columns x Rows, Samples per Pixel components, more
/// than 8 bits of precision exactly when 16 bits are allocated). dicom-rs sizes its buffer from
/// the attributes and copies each decoded JPEG into it unchecked: a larger JPEG (a colour JPEG in
/// a grey file, a bigger image) panics with an index out of range.
///
/// The streams are walked as dicom-rs and jpeg-decoder read them: the fragments concatenated, one
/// stream per frame from the start, the next beginning at the first FF D8 after an EOI; within a
/// stream, segments by their lengths, markers after garbage and fill bytes, entropy-coded data up
/// to the next marker that is not a stuffed 00 or a restart.
pub(super) fn check_jpeg_frames(obj: &DefaultDicomObject, ts: &str) -> Result<(), Reject> {
    if !JPEG_SYNTAXES.contains(&ts) {
        return Ok(());
    }
    let Some(fragments) = obj
        .get(tags::PIXEL_DATA)
        .and_then(|e| e.value().fragments())
    else {
        return Ok(()); // native pixel data under a JPEG syntax: dicom-rs rejects it
    };
    let int = |tag| -> u64 {
        obj.get(tag)
            .and_then(|e| e.to_int::<u32>().ok())
            .unwrap_or(0) as u64
    };
    let (rows, cols) = (int(tags::ROWS), int(tags::COLUMNS));
    let spp = obj
        .get(tags::SAMPLES_PER_PIXEL)
        .and_then(|e| e.to_int::<u32>().ok())
        .unwrap_or(1) as u64;
    let bits = int(tags::BITS_ALLOCATED);
    let frames = obj
        .get(tags::NUMBER_OF_FRAMES)
        .and_then(|e| e.to_int::<u32>().ok())
        .unwrap_or(1)
        .max(1) as usize;
    let data: Vec<u8> = fragments.iter().flatten().copied().collect();
    let mut pos = 0;
    for frame in 0..frames {
        if frame > 0 {
            // dicom-rs: the next frame starts at the next SOI.
            match data[pos.min(data.len())..]
                .windows(2)
                .position(|w| w == [0xFF, 0xD8])
            {
                Some(i) => pos += i,
                None => return Ok(()),
            }
        }
        if data.get(pos..pos + 2) != Some(&[0xFF, 0xD8][..]) {
            return Ok(()); // jpeg-decoder fails on this frame: nothing is copied
        }
        pos += 2;
        loop {
            // The next marker: jpeg-decoder skips garbage before it and fill bytes (FF FF).
            while pos < data.len() && data[pos] != 0xFF {
                pos += 1;
            }
            while pos + 1 < data.len() && data[pos + 1] == 0xFF {
                pos += 1;
            }
            let Some(&m) = data.get(pos + 1) else {
                return Ok(()); // the stream ends: jpeg-decoder fails
            };
            pos += 2;
            let seg_len = || {
                data.get(pos..pos + 2)
                    .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
            };
            match m {
                0xD9 => break, // EOI
                0x00 | 0x01 | 0xD0..=0xD7 => {}
                0xD8 => return Ok(()), // a second SOI: jpeg-decoder fails
                0xC0..=0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF => {
                    let Some(h) = data.get(pos..pos + 8) else {
                        return Ok(());
                    };
                    let precision = h[2] as u64;
                    let height = u16::from_be_bytes([h[3], h[4]]) as u64;
                    let width = u16::from_be_bytes([h[5], h[6]]) as u64;
                    let comps = h[7] as u64;
                    let wide = precision > 8;
                    if (width, height, comps) != (cols, rows, spp) || wide != (bits == 16) {
                        return Err(Reject::new(format!(
                            "JPEG frame {frame} is {width}x{height} with {comps} component(s) of {precision} bits, the DICOM attributes declare {cols}x{rows} with {spp} sample(s) per pixel of {bits} bits allocated"
                        )));
                    }
                    pos += seg_len().unwrap_or(0);
                }
                0xDA => {
                    // SOS: its header, then entropy-coded data up to the next real marker.
                    pos += seg_len().unwrap_or(0);
                    while pos + 1 < data.len() {
                        if data[pos] == 0xFF && !matches!(data[pos + 1], 0x00 | 0xD0..=0xD7 | 0xFF)
                        {
                            break;
                        }
                        pos += 1;
                    }
                }
                _ => pos += seg_len().unwrap_or(0),
            }
        }
    }
    Ok(())
}

/// For RLE Lossless pixel data: each fragment (dicom-rs takes one per frame) must hold a 64-byte
/// RLE header with 1 to 15 segments, at least Samples per Pixel x bytes per sample of them, and
/// each of those must decode to at least Rows x Columns bytes. dicom-rs slices the header as the
/// segment count says and copies Rows x Columns bytes from every segment unchecked: a short
/// segment or a fragment shorter than its header panicked (the dicom fuzz target).
///
/// The decoded length is counted as dicom-rs's PackBits reader decodes: a header byte n in 0..=127
/// copies the next n + 1 bytes (fewer where the segment ends), -127..=-1 repeats the next byte
/// 1 - n times, -128 is nothing.
pub(super) fn check_rle_frames(obj: &DefaultDicomObject, ts: &str) -> Result<(), Reject> {
    if ts != "1.2.840.10008.1.2.5" {
        return Ok(());
    }
    let Some(fragments) = obj
        .get(tags::PIXEL_DATA)
        .and_then(|e| e.value().fragments())
    else {
        return Ok(()); // native pixel data under the RLE syntax: dicom-rs rejects it
    };
    let int = |tag, default: u32| -> usize {
        obj.get(tag)
            .and_then(|e| e.to_int::<u32>().ok())
            .unwrap_or(default) as usize
    };
    let plane = int(tags::ROWS, 0) * int(tags::COLUMNS, 0);
    let segments = int(tags::SAMPLES_PER_PIXEL, 1) * (int(tags::BITS_ALLOCATED, 0) / 8);
    for (frame, f) in fragments.iter().enumerate() {
        let bad = |what: String| Reject::new(format!("RLE frame {frame}: {what}"));
        if f.len() < 64 {
            return Err(bad(format!(
                "{} bytes, shorter than the 64-byte RLE header",
                f.len()
            )));
        }
        let word =
            |i: usize| u32::from_le_bytes([f[4 * i], f[4 * i + 1], f[4 * i + 2], f[4 * i + 3]]);
        let n = word(0) as usize;
        if !(1..=15).contains(&n) || n < segments {
            return Err(bad(format!(
                "the RLE header declares {n} segment(s), {segments} needed (at most 15)"
            )));
        }
        let mut bounds: Vec<usize> = (1..=n).map(|i| word(i) as usize).collect();
        bounds.push(f.len());
        for s in 0..segments {
            // Ranges dicom-rs cannot take it reports itself.
            let Some(seg) = f.get(bounds[s]..bounds[s + 1]) else {
                continue;
            };
            let (mut at, mut out) = (0usize, 0usize);
            while at < seg.len() && out < plane {
                let h = seg[at] as i8;
                at += 1;
                if h >= 0 {
                    let take = (h as usize + 1).min(seg.len() - at);
                    out += take;
                    at += h as usize + 1;
                } else if h > -128 {
                    if at >= seg.len() {
                        break; // dicom-rs fails to read the byte to repeat
                    }
                    out += (1 - h as isize) as usize;
                    at += 1;
                }
            }
            if out < plane {
                return Err(bad(format!(
                    "segment {s} decodes to {out} bytes, Rows x Columns is {plane}"
                )));
            }
        }
    }
    Ok(())
}
