//! The codecs dicom-rs lacks in this build: JPEG-LS (`pure_jpegls`: one component, lossless and
//! near-lossless, 2 to 16 bits) and 12-bit lossy JPEG (`libjpeg-turbo-rs`; jpeg-decoder decodes
//! 8-bit DCT only). A file in one of them is decoded here frame by frame into a copy of its data
//! set holding native pixel data, which dicom-rs then reads as an uncompressed file. JPEG 2000 is
//! dicom-rs's own (openjp2); its codestream headers are checked here first.

use super::*;
use dicom_core::{DataElement, PrimitiveValue, VR};
use reject::ts_label;
use std::borrow::Cow;

const JPEG_LS_SYNTAXES: [&str; 2] = ["1.2.840.10008.1.2.4.80", "1.2.840.10008.1.2.4.81"];

/// JPEG 2000 (Part 1 and 2) and HTJ2K: the syntaxes dicom-rs decodes with openjp2 (which has
/// OpenJPEG's HTJ2K decoder; no HTJ2K file is among the tests).
const J2K_SYNTAXES: [&str; 7] = [
    "1.2.840.10008.1.2.4.90",
    "1.2.840.10008.1.2.4.91",
    "1.2.840.10008.1.2.4.92",
    "1.2.840.10008.1.2.4.93",
    "1.2.840.10008.1.2.4.201",
    "1.2.840.10008.1.2.4.202",
    "1.2.840.10008.1.2.4.203",
];

const EXPLICIT_VR_LITTLE_ENDIAN: &str = "1.2.840.10008.1.2.1";

/// The attributes a frame is decoded against.
struct Image {
    rows: u32,
    cols: u32,
    spp: u32,
    bits_allocated: u32,
    frames: usize,
}

impl Image {
    fn of(obj: &DefaultDicomObject) -> Self {
        let int = |tag, default: u32| -> u32 {
            obj.get(tag)
                .and_then(|e| e.to_int::<u32>().ok())
                .unwrap_or(default)
        };
        Image {
            rows: int(tags::ROWS, 0),
            cols: int(tags::COLUMNS, 0),
            spp: int(tags::SAMPLES_PER_PIXEL, 1),
            bits_allocated: int(tags::BITS_ALLOCATED, 0),
            frames: int(tags::NUMBER_OF_FRAMES, 1).max(1) as usize,
        }
    }

    fn declared(&self) -> String {
        format!(
            "the DICOM attributes declare {}x{} with {} sample(s) per pixel of {} bits allocated",
            self.cols, self.rows, self.spp, self.bits_allocated
        )
    }
}

/// Where a frame's stream begins: JPEG and JPEG-LS SOI, a JPEG 2000 codestream (SOC SIZ) or a JP2
/// file signature box.
fn starts_frame(fragment: &[u8]) -> bool {
    fragment.starts_with(&[0xFF, 0xD8])
        || fragment.starts_with(&[0xFF, 0x4F, 0xFF, 0x51])
        || fragment.starts_with(&[0, 0, 0, 0x0C, b'j', b'P', b' ', b' '])
}

/// Each frame's encoded stream, split as dicom-rs splits it: one fragment per frame when there
/// are as many, all fragments for a single frame, else by the Basic Offset Table; without one, a
/// frame starts at each fragment that starts a stream. None for native pixel data.
fn frame_streams<'a>(
    obj: &'a DefaultDicomObject,
    frames: usize,
) -> Result<Option<Vec<Cow<'a, [u8]>>>, Reject> {
    let Some(value) = obj.get(tags::PIXEL_DATA).map(|e| e.value()) else {
        return Ok(None);
    };
    let (Some(fragments), Some(table)) = (value.fragments(), value.offset_table()) else {
        return Ok(None);
    };
    if fragments.len() == frames {
        return Ok(Some(fragments.iter().map(|f| Cow::from(&f[..])).collect()));
    }
    if frames == 1 {
        return Ok(Some(vec![Cow::from(fragments.concat())]));
    }
    let mut out: Vec<Vec<u8>> = Vec::new();
    if table.len() == frames {
        // Fragment offsets as the table counts them: from the first fragment's item header.
        let mut offset = 0u64;
        for f in fragments {
            let frame = table.iter().rposition(|&t| t as u64 <= offset).unwrap_or(0);
            out.resize_with(out.len().max(frame + 1), Vec::new);
            out[frame].extend_from_slice(f);
            offset += f.len() as u64 + 8;
        }
    } else {
        for f in fragments {
            if starts_frame(f) || out.is_empty() {
                out.push(Vec::new());
            }
            out.last_mut().expect("pushed above").extend_from_slice(f);
        }
    }
    if out.len() != frames {
        return Err(Reject::new(format!(
            "encapsulated pixel data: {} fragment(s) hold {} frame(s), Number of Frames is {frames}",
            fragments.len(),
            out.len()
        )));
    }
    Ok(Some(out.into_iter().map(Cow::from).collect()))
}

/// A JPEG or JPEG-LS stream's frame header: (precision, height, width, components), and whether
/// it is a DCT frame (SOF0..2, 5..7, 9..11, 13..15). Segments before it all carry lengths.
fn jpeg_sof(stream: &[u8]) -> Option<(u8, u32, u32, u32, bool)> {
    if !stream.starts_with(&[0xFF, 0xD8]) {
        return None;
    }
    let mut pos = 2;
    loop {
        while stream.get(pos) == Some(&0xFF) && stream.get(pos + 1) == Some(&0xFF) {
            pos += 1; // fill bytes
        }
        if *stream.get(pos)? != 0xFF {
            return None;
        }
        let m = *stream.get(pos + 1)?;
        let seg = stream.get(pos + 2..pos + 10);
        match m {
            0xC0..=0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF | 0xF7 => {
                let h = seg?;
                let dct = m != 0xF7 && m & 3 != 3;
                return Some((
                    h[2],
                    u16::from_be_bytes([h[3], h[4]]) as u32,
                    u16::from_be_bytes([h[5], h[6]]) as u32,
                    h[7] as u32,
                    dct,
                ));
            }
            0xD8..=0xDA => return None,
            _ => {
                let len = stream.get(pos + 2..pos + 4)?;
                pos += 2 + u16::from_be_bytes([len[0], len[1]]) as usize;
            }
        }
    }
}

/// For JPEG-LS, and JPEG whose first frame is 12-bit DCT: the data set with its frames decoded
/// into native pixel data (Explicit VR Little Endian). None for every other file.
pub(super) fn decode_to_native(
    obj: &DefaultDicomObject,
    ts: &str,
) -> Result<Option<DefaultDicomObject>, Reject> {
    let jpeg_ls = JPEG_LS_SYNTAXES.contains(&ts);
    if !jpeg_ls && !pixels::JPEG_SYNTAXES.contains(&ts) {
        return Ok(None);
    }
    let img = Image::of(obj);
    let Some(streams) = frame_streams(obj, img.frames)? else {
        return Ok(None); // native pixel data under a compressed syntax: dicom-rs rejects it
    };
    if !jpeg_ls {
        let twelve = matches!(
            streams.first().and_then(|s| jpeg_sof(s)),
            Some((12, .., true))
        );
        if !twelve {
            return Ok(None); // 8-bit DCT and lossless JPEG: jpeg-decoder, through dicom-rs
        }
    }
    if img.spp != 1 {
        return Err(Reject::new(format!(
            "unsupported transfer syntax {} with {} samples per pixel: prep decodes {} for grey images only",
            ts_label(ts),
            img.spp,
            if jpeg_ls { "JPEG-LS" } else { "12-bit JPEG" }
        )));
    }
    if !matches!(img.bits_allocated, 8 | 16) {
        return Err(Reject::new(format!(
            "{}: unsupported Bits Allocated {}",
            ts_label(ts),
            img.bits_allocated
        )));
    }
    let wide = img.bits_allocated == 16;
    let n = img.rows as usize * img.cols as usize;
    let mut data: Vec<u8> = Vec::new();
    let bytes = n * img.frames * if wide { 2 } else { 1 };
    data.try_reserve_exact(bytes)
        .map_err(|_| Reject::new(format!("cannot allocate {bytes} bytes of pixel data")))?;
    for (f, stream) in streams.iter().enumerate() {
        let bad = |what: String| Reject::new(format!("{} frame {f}: {what}", ts_label(ts)));
        let Some((precision, height, width, comps, _)) = jpeg_sof(stream) else {
            return Err(bad("no frame header (SOF) before the scan".into()));
        };
        if (width, height, comps) != (img.cols, img.rows, 1) || (precision > 8 && !wide) {
            return Err(bad(format!(
                "the stream is {width}x{height} with {comps} component(s) of {precision} bits, {}",
                img.declared()
            )));
        }
        let samples: Vec<u16> = if jpeg_ls {
            guard("decoding JPEG-LS", || {
                jpegls::decode(stream, img.cols, img.rows)
            })?
            .map_err(|e| bad(format!("JPEG-LS decoder: {e}")))?
            .0
        } else {
            let im = guard("decoding 12-bit JPEG", || {
                libjpeg_turbo_rs::decompress_12bit(stream)
            })?
            .map_err(|e| bad(format!("12-bit JPEG decoder: {e}")))?;
            if (im.width, im.height, im.num_components) != (width as usize, height as usize, 1) {
                return Err(bad(format!(
                    "decoded to {}x{} with {} component(s), {}",
                    im.width,
                    im.height,
                    im.num_components,
                    img.declared()
                )));
            }
            im.data.iter().map(|&v| v.clamp(0, 4095) as u16).collect()
        };
        if samples.len() != n {
            return Err(bad(format!(
                "decoded to {} samples, {}x{} expected",
                samples.len(),
                img.cols,
                img.rows
            )));
        }
        if wide {
            data.extend(samples.iter().flat_map(|v| v.to_le_bytes()));
        } else {
            data.extend(samples.iter().map(|&v| v as u8));
        }
    }
    let mut native = obj.clone();
    let vr = if wide { VR::OW } else { VR::OB };
    native.put(DataElement::new(
        tags::PIXEL_DATA,
        vr,
        PrimitiveValue::from(data),
    ));
    native.meta_mut().transfer_syntax = EXPLICIT_VR_LITTLE_ENDIAN.to_string();
    Ok(Some(native))
}

/// A JPEG 2000 frame's image header (SIZ): width, height, and per component its precision in
/// bits and subsampling (x, y).
struct Siz {
    width: u32,
    height: u32,
    comps: Vec<(u32, u8, u8)>,
}

/// The codestream of a frame: the frame itself, or the contents of a JP2 file's `jp2c` box.
fn codestream(stream: &[u8]) -> Option<&[u8]> {
    if stream.starts_with(&[0xFF, 0x4F]) {
        return Some(stream);
    }
    let mut pos = 0usize;
    while pos + 8 <= stream.len() {
        let len = u32::from_be_bytes(stream[pos..pos + 4].try_into().ok()?) as u64;
        let kind = &stream[pos + 4..pos + 8];
        let (header, len) = match len {
            0 => (8, (stream.len() - pos) as u64),
            1 => (
                16,
                u64::from_be_bytes(stream.get(pos + 8..pos + 16)?.try_into().ok()?),
            ),
            l => (8, l),
        };
        if len < header as u64 {
            return None;
        }
        let end = pos
            .checked_add(usize::try_from(len).ok()?)?
            .min(stream.len());
        if kind == b"jp2c" {
            return stream.get(pos + header..end);
        }
        pos = end;
    }
    None
}

fn j2k_siz(stream: &[u8]) -> Option<Siz> {
    let cs = codestream(stream)?;
    if !cs.starts_with(&[0xFF, 0x4F, 0xFF, 0x51]) {
        return None;
    }
    let s = cs.get(4..)?;
    let word =
        |i: usize| -> Option<u32> { Some(u32::from_be_bytes(s.get(i..i + 4)?.try_into().ok()?)) };
    let (x, y, x0, y0) = (word(4)?, word(8)?, word(12)?, word(16)?);
    let csiz = u16::from_be_bytes(s.get(36..38)?.try_into().ok()?) as usize;
    let comps = (0..csiz)
        .map(|c| {
            let b = s.get(38 + 3 * c..41 + 3 * c)?;
            Some(((b[0] & 0x7F) as u32 + 1, b[1], b[2]))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Siz {
        width: x.checked_sub(x0)?,
        height: y.checked_sub(y0)?,
        comps,
    })
}

/// For JPEG 2000 pixel data: each frame's codestream header (SIZ) must describe the image the
/// attributes declare (Columns x Rows, Samples per Pixel components, none subsampled, none wider
/// than Bits Allocated). dicom-rs decodes the whole codestream, then copies its components into
/// a buffer sized from the attributes: a larger image panics, a smaller one leaves zeros, a
/// wider sample is cut to its low bytes. A header this walk cannot find is refused too.
pub(super) fn check_j2k_frames(obj: &DefaultDicomObject, ts: &str) -> Result<(), Reject> {
    if !J2K_SYNTAXES.contains(&ts) {
        return Ok(());
    }
    let img = Image::of(obj);
    let Some(streams) = frame_streams(obj, img.frames)? else {
        return Ok(()); // native pixel data under a JPEG 2000 syntax: dicom-rs rejects it
    };
    for (f, stream) in streams.iter().enumerate() {
        let bad = |what: String| Reject::new(format!("{} frame {f}: {what}", ts_label(ts)));
        let Some(siz) = j2k_siz(stream) else {
            return Err(bad("no JPEG 2000 codestream header (SOC, SIZ)".into()));
        };
        let precision = siz.comps.iter().map(|c| c.0).max().unwrap_or(0);
        let subsampled = siz.comps.iter().any(|c| (c.1, c.2) != (1, 1));
        if (siz.width, siz.height, siz.comps.len() as u32) != (img.cols, img.rows, img.spp)
            || precision > img.bits_allocated
            || subsampled
        {
            return Err(bad(format!(
                "the codestream is {}x{} with {} component(s) of up to {precision} bits{}, {}",
                siz.width,
                siz.height,
                siz.comps.len(),
                if subsampled { ", subsampled" } else { "" },
                img.declared()
            )));
        }
    }
    Ok(())
}
