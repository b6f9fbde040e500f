//! Codec `jpeg` (see `formats/shard.md`, "Codec jpeg"): each sample of a block of u8 grey or RGB
//! images as its own baseline JPEG, the labels and fields after them as zstd. Lossy: the decoded
//! block is what this module's decoder gives, and the block's checksum and statistics are taken
//! over that, so a reader checks the pixels it trains on as with every other codec.

use super::{Dtype, SampleSpec};
use crate::util::error::{Error, Result};
use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;
use zune_jpeg::JpegDecoder;

/// Method byte: the decoded bytes as one zstd frame (a block JPEG would make larger than the
/// format allows, e.g. noise at quality 100).
pub const PLAIN: u8 = 0;
/// Method byte: one JPEG per sample.
pub const STREAMS: u8 = 1;

/// The samples `jpeg` takes: u8, `C x H x W` with one or three channels, sides JPEG can hold.
pub fn fits(spec: &SampleSpec) -> std::result::Result<(), String> {
    let d = &spec.shape.0;
    let ok = spec.dtype == Dtype::U8
        && d.len() == 3
        && (d[0] == 1 || d[0] == 3)
        && d[1] <= u16::MAX as u32
        && d[2] <= u16::MAX as u32;
    if ok {
        Ok(())
    } else {
        Err(format!(
            "--codec jpeg takes u8 images of 1 or 3 channels (C x H x W, sides up to 65535); these samples are {} {}: use --codec pred (lossless) or zstd",
            spec.shape, spec.dtype
        ))
    }
}

/// `(channels, height, width)` of a spec that `fits`.
fn dims(spec: &SampleSpec) -> (usize, usize, usize) {
    let d = &spec.shape.0;
    (d[0] as usize, d[1] as usize, d[2] as usize)
}

/// The JPEG streams of the `n` samples at the start of `data` (`n * S` bytes of planar pixels):
/// `n` u32 lengths, then the streams, appended to `out`.
pub fn encode_streams(
    pixels: &[u8],
    spec: &SampleSpec,
    n: usize,
    quality: u8,
    out: &mut Vec<u8>,
) -> Result<()> {
    let (c, h, w) = dims(spec);
    let s = c * h * w;
    let table = out.len();
    out.resize(table + 4 * n, 0);
    let mut inter = Vec::with_capacity(s);
    for i in 0..n {
        let sample = &pixels[i * s..(i + 1) * s];
        let colour = if c == 3 {
            inter.clear();
            let (r, rest) = sample.split_at(h * w);
            let (g, b) = rest.split_at(h * w);
            for k in 0..h * w {
                inter.extend_from_slice(&[r[k], g[k], b[k]]);
            }
            jpeg_encoder::ColorType::Rgb
        } else {
            jpeg_encoder::ColorType::Luma
        };
        let src = if c == 3 { &inter[..] } else { sample };
        let start = out.len();
        // The default tables: with optimised ones jpeg-encoder writes one scan per component,
        // which zune-jpeg 0.5 decodes with wrong colours (Pillow decodes it right).
        let e = jpeg_encoder::Encoder::new(&mut *out, quality);
        e.encode(src, w as u16, h as u16, colour)
            .map_err(|e| Error::Invalid(format!("JPEG encoding of sample {i}: {e}")))?;
        let len = u32::try_from(out.len() - start)
            .map_err(|_| Error::Invalid(format!("sample {i}'s JPEG is over 4 GiB")))?;
        out[table + 4 * i..table + 4 * i + 4].copy_from_slice(&len.to_le_bytes());
    }
    Ok(())
}

/// Where each sample's stream lies in `body` (the stored bytes after the method byte), and
/// where the labels' zstd frame starts: the checks of "Codec jpeg" before anything is decoded.
pub fn streams(body: &[u8], n: usize) -> std::result::Result<(Vec<(usize, usize)>, usize), String> {
    let table = 4 * n;
    if body.len() < table {
        return Err(format!(
            "a jpeg block of {n} samples needs {table} bytes of stream lengths, it has {}",
            body.len()
        ));
    }
    let mut at = table;
    let mut spans = Vec::with_capacity(n);
    for i in 0..n {
        let len = u32::from_le_bytes(body[4 * i..4 * i + 4].try_into().unwrap()) as usize;
        let end = at
            .checked_add(len)
            .filter(|&e| e <= body.len() && len > 0)
            .ok_or_else(|| {
                format!(
                    "sample {i}'s JPEG stream ({len} bytes at {at}) is empty or runs past the block's {} bytes",
                    body.len()
                )
            })?;
        spans.push((at, end));
        at = end;
    }
    Ok((spans, at))
}

/// Decode one sample's JPEG `stream` into its planar pixels `out` (`C * H * W` bytes). The
/// stream must be exactly `H x W` with the sample's colour (grey: one component; colour: three).
/// `inter` is scratch for the interleaved RGB the decoder gives.
pub fn decode_sample(
    stream: &[u8],
    spec: &SampleSpec,
    out: &mut [u8],
    inter: &mut Vec<u8>,
) -> std::result::Result<(), String> {
    let (c, h, w) = dims(spec);
    let colour = if c == 3 {
        ColorSpace::RGB
    } else {
        ColorSpace::Luma
    };
    let opts = DecoderOptions::default()
        .set_max_width(w)
        .set_max_height(h)
        .set_strict_mode(true)
        .jpeg_set_out_colorspace(colour);
    // A decoder bug on hostile bytes must be this block's damage, not a dead reader thread.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut d = JpegDecoder::new_with_options(ZCursor::new(stream), opts);
        d.decode_headers()
            .map_err(|e| format!("JPEG header: {e}"))?;
        let info = d.info().ok_or("JPEG header: no frame")?;
        if (info.width as usize, info.height as usize) != (w, h) {
            return Err(format!(
                "JPEG of {}x{}, the samples are {h}x{w}",
                info.height, info.width
            ));
        }
        if info.components as usize != c {
            return Err(format!(
                "JPEG of {} components, the samples have {c} channels",
                info.components
            ));
        }
        if d.output_buffer_size() != Some(c * h * w) {
            return Err(format!(
                "JPEG decodes to {:?} bytes, a sample is {}",
                d.output_buffer_size(),
                c * h * w
            ));
        }
        if c == 1 {
            return d.decode_into(out).map_err(|e| format!("JPEG data: {e}"));
        }
        inter.resize(c * h * w, 0);
        d.decode_into(inter)
            .map_err(|e| format!("JPEG data: {e}"))?;
        let (r, rest) = out.split_at_mut(h * w);
        let (g, b) = rest.split_at_mut(h * w);
        for (k, px) in inter.chunks_exact(3).enumerate() {
            r[k] = px[0];
            g[k] = px[1];
            b[k] = px[2];
        }
        Ok(())
    }));
    r.unwrap_or_else(|_| Err("the JPEG decoder crashed on these bytes".into()))
}

thread_local! {
    /// Each reader thread's interleaved pixels between the JPEG decoder and the planes.
    pub static INTER: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::shard::Shape;

    fn spec(c: u32, h: u32, w: u32) -> SampleSpec {
        SampleSpec {
            shape: Shape::new(vec![c, h, w]).unwrap(),
            dtype: Dtype::U8,
        }
    }

    /// A smooth image with an edge: what JPEG is made for.
    fn image(c: usize, h: usize, w: usize, seed: usize) -> Vec<u8> {
        (0..c * h * w)
            .map(|k| {
                let (ch, y, x) = (k / (h * w), k / w % h, k % w);
                let edge = if x * 3 > w + seed % 7 { 60 } else { 0 };
                ((x * 2 + y + ch * 40 + seed * 13 + edge) % 256) as u8
            })
            .collect()
    }

    #[test]
    fn streams_decode_close_to_their_images_in_every_shape() {
        for &(c, h, w) in &[
            (3, 32, 32),
            (1, 28, 28),
            (3, 17, 45),
            (1, 1, 1),
            (3, 9, 130),
        ] {
            let sp = spec(c as u32, h as u32, w as u32);
            let n = 3;
            let px: Vec<u8> = (0..n).flat_map(|i| image(c, h, w, i)).collect();
            let mut body = Vec::new();
            encode_streams(&px, &sp, n, 95, &mut body).unwrap();
            let (spans, end) = streams(&body, n).unwrap();
            assert_eq!(end, body.len());
            let mut out = vec![0u8; px.len()];
            let mut inter = Vec::new();
            let s = c * h * w;
            for (i, &(a, b)) in spans.iter().enumerate() {
                decode_sample(&body[a..b], &sp, &mut out[i * s..(i + 1) * s], &mut inter).unwrap();
            }
            let mean_err: f64 = px
                .iter()
                .zip(&out)
                .map(|(&a, &b)| (a as f64 - b as f64).abs())
                .sum::<f64>()
                / px.len() as f64;
            assert!(mean_err < 4.0, "{c}x{h}x{w}: mean error {mean_err}");
        }
    }

    #[test]
    fn the_decoder_gives_the_same_pixels_with_and_without_its_simd_paths() {
        // The block checksum is taken over what the writer's decoder gave: a reader on a CPU
        // without AVX2 must decode the same bytes.
        for &(c, q) in &[(3usize, 90u8), (3, 75), (1, 90)] {
            let sp = spec(c as u32, 64, 48);
            let px = image(c, 64, 48, 5);
            let mut body = Vec::new();
            encode_streams(&px, &sp, 1, q, &mut body).unwrap();
            let stream = &body[4..];
            let dec = |unsafe_: bool| {
                let colour = if c == 3 {
                    ColorSpace::RGB
                } else {
                    ColorSpace::Luma
                };
                let o = DecoderOptions::default()
                    .set_use_unsafe(unsafe_)
                    .jpeg_set_out_colorspace(colour);
                JpegDecoder::new_with_options(ZCursor::new(stream), o)
                    .decode()
                    .unwrap()
            };
            assert_eq!(dec(true), dec(false), "{c} channels, quality {q}");
        }
    }

    #[test]
    fn a_stream_that_makes_zune_jpeg_panic_is_an_error() {
        // Found by fuzz/fuzz_targets/jpeg_block.rs: zune-jpeg 0.5.15 unwraps a None in its AVX2
        // IDCT on these bytes (a 3x16x16 sample behind the target's 4 bytes).
        let input = include_bytes!("../../../fuzz/seeds/jpeg_block/zune-idct-panic");
        let mut out = vec![0u8; 3 * 16 * 16];
        let r = decode_sample(&input[4..], &spec(3, 16, 16), &mut out, &mut Vec::new());
        assert!(r.is_err());
    }

    #[test]
    fn bad_streams_are_errors_not_panics() {
        let sp = spec(3, 16, 16);
        let px = image(3, 16, 16, 1);
        let mut body = Vec::new();
        encode_streams(&px, &sp, 1, 90, &mut body).unwrap();
        let mut out = vec![0u8; px.len()];
        let mut inter = Vec::new();
        // Another size, another colour, cut short, garbage: each an error naming what.
        let other = spec(3, 16, 17);
        assert!(
            decode_sample(&body[4..], &other, &mut vec![0; 3 * 16 * 17], &mut inter)
                .unwrap_err()
                .contains("16x16")
        );
        let grey = spec(1, 16, 16);
        assert!(decode_sample(&body[4..], &grey, &mut vec![0; 256], &mut inter).is_err());
        for cut in [1, 10, body.len() / 2] {
            assert!(decode_sample(&body[4..cut.max(5)], &sp, &mut out, &mut inter).is_err());
        }
        assert!(decode_sample(&[0xff, 0xd8, 0, 1, 2], &sp, &mut out, &mut inter).is_err());
        // Lengths that run past the block, or a zero length.
        assert!(streams(&[1, 0, 0], 1).is_err());
        assert!(streams(&[200, 0, 0, 0, 1, 2], 1).is_err());
        assert!(streams(&[0, 0, 0, 0, 1, 2], 1).is_err());
        assert_eq!(streams(&[2, 0, 0, 0, 1, 2], 1).unwrap(), (vec![(4, 6)], 6));
    }
}
