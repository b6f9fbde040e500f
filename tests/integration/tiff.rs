//! TIFF as scientists save it, on files written here: a matrix of sample types x channels x pages
//! x planar/chunky (each case converts, with the values it must give, or is refused with its
//! reason), float32 stacks kept bit for bit with `--dtype f32`, integer stacks windowed onto u8,
//! one window for a whole stack, colour models, compressions, truncated files and pages of
//! another size. Most files come from the small baseline writer below (any SamplesPerPixel,
//! planar, tiles, predictors, either byte order), a few from the `tiff` crate's encoder.

use crate::util::*;
use prep::format::shard::{Dataset, Dtype};
use prep::source::transform::{to_sample, Fit, Target};
use prep::source::{window_to_u16, DecodeOptions, FileKind, Frame, Reject};
use std::io::Write;
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------------------------
// A minimal baseline TIFF writer.

/// One page (IFD) to write.
#[derive(Clone, Debug)]
struct Page {
    w: u32,
    h: u32,
    /// SampleFormat: 1 unsigned, 2 signed, 3 float (others written as given).
    format: u16,
    bits: u16,
    photometric: u16,
    spp: u16,
    extra: Vec<u16>,
    planar: bool,
    /// (width, height) of tiles; strips of `rows_per_strip` rows without.
    tiles: Option<(u32, u32)>,
    rows_per_strip: u32,
    /// 1 none, 8 Deflate, 32773 PackBits.
    compression: u16,
    /// 1 none, 2 horizontal, 3 floating point.
    predictor: u16,
    /// Samples, pixel-major: (row, column, sample).
    values: Vec<f64>,
    /// More (tag, type, values) entries.
    tags: Vec<(u16, u16, Vec<u32>)>,
    /// Chunks as they are, instead of encoding `values` (a JPEG stream).
    raw: Option<Vec<Vec<u8>>>,
}

impl Page {
    fn new(w: u32, h: u32, format: u16, bits: u16, photometric: u16, spp: u16) -> Page {
        Page {
            w,
            h,
            format,
            bits,
            photometric,
            spp,
            extra: Vec::new(),
            planar: false,
            tiles: None,
            rows_per_strip: h,
            compression: 1,
            predictor: 1,
            values: vec![0.0; (w * h * spp as u32) as usize],
            tags: Vec::new(),
            raw: None,
        }
    }

    fn at(&self, x: u32, y: u32, c: u16) -> f64 {
        if x >= self.w || y >= self.h {
            return 0.0;
        }
        self.values[((y * self.w + x) * self.spp as u32 + c as u32) as usize]
    }
}

/// A sample's bits, in the low `bits` of the result.
fn pattern(v: f64, format: u16, bits: u16) -> u64 {
    match (format, bits) {
        (3, 16) => half::f16::from_f64(v).to_bits() as u64,
        (3, 32) => (v as f32).to_bits() as u64,
        (3, 64) => v.to_bits(),
        (_, 64) => v as i64 as u64,
        _ => (v as i64 as u64) & ((1u64 << bits) - 1),
    }
}

fn put(out: &mut Vec<u8>, pat: u64, bytes: usize, big: bool) {
    if big {
        out.extend_from_slice(&pat.to_be_bytes()[8 - bytes..]);
    } else {
        out.extend_from_slice(&pat.to_le_bytes()[..bytes]);
    }
}

/// One row of a chunk (`spc` samples per pixel), predicted and in the file's byte order.
fn encode_row(vals: &[f64], p: &Page, spc: usize, big: bool) -> Vec<u8> {
    let bits = p.bits as usize;
    let mut out = Vec::new();
    if bits < 8 {
        let mut acc = 0u32;
        let mut n = 0;
        for &v in vals {
            acc = acc << bits | (v as u32 & ((1 << bits) - 1));
            n += bits;
            if n >= 8 {
                out.push((acc >> (n - 8)) as u8);
                n -= 8;
            }
        }
        if n > 0 {
            out.push((acc << (8 - n)) as u8);
        }
        return out;
    }
    let bytes = bits / 8;
    let pats: Vec<u64> = vals.iter().map(|&v| pattern(v, p.format, p.bits)).collect();
    match p.predictor {
        2 => {
            let mask = if bits == 64 {
                u64::MAX
            } else {
                (1 << bits) - 1
            };
            for i in 0..pats.len() {
                let d = if i >= spc {
                    pats[i].wrapping_sub(pats[i - spc]) & mask
                } else {
                    pats[i]
                };
                put(&mut out, d, bytes, big);
            }
        }
        3 => {
            // Byte planes, most significant first, then byte differences `spc` apart.
            for k in 0..bytes {
                for &pat in &pats {
                    out.push(pat.to_be_bytes()[8 - bytes + k]);
                }
            }
            for i in (spc..out.len()).rev() {
                out[i] = out[i].wrapping_sub(out[i - spc]);
            }
        }
        _ => {
            for &pat in &pats {
                put(&mut out, pat, bytes, big);
            }
        }
    }
    out
}

fn compress(raw: Vec<u8>, method: u16) -> Vec<u8> {
    match method {
        8 => {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(&raw).unwrap();
            e.finish().unwrap()
        }
        32773 => raw
            .chunks(128)
            .flat_map(|c| {
                let mut v = vec![(c.len() - 1) as u8];
                v.extend_from_slice(c);
                v
            })
            .collect(),
        _ => raw,
    }
}

/// The page's chunks (strips or tiles; per plane when planar), encoded and compressed.
fn chunks(p: &Page, big: bool) -> Vec<Vec<u8>> {
    let (planes, spc) = if p.planar {
        (p.spp, 1)
    } else {
        (1, p.spp as usize)
    };
    let row = |plane: u16, y: u32, x0: u32, x1: u32| -> Vec<f64> {
        let mut v = Vec::new();
        for x in x0..x1 {
            if p.planar {
                v.push(p.at(x, y, plane));
            } else {
                v.extend((0..p.spp).map(|c| p.at(x, y, c)));
            }
        }
        v
    };
    let mut out = Vec::new();
    for plane in 0..planes {
        match p.tiles {
            None => {
                let mut y0 = 0;
                while y0 < p.h {
                    let y1 = (y0 + p.rows_per_strip).min(p.h);
                    let raw: Vec<u8> = (y0..y1)
                        .flat_map(|y| encode_row(&row(plane, y, 0, p.w), p, spc, big))
                        .collect();
                    out.push(compress(raw, p.compression));
                    y0 = y1;
                }
            }
            Some((tw, th)) => {
                for ty in 0..p.h.div_ceil(th) {
                    for tx in 0..p.w.div_ceil(tw) {
                        let raw: Vec<u8> = (ty * th..(ty + 1) * th)
                            .flat_map(|y| {
                                encode_row(&row(plane, y, tx * tw, (tx + 1) * tw), p, spc, big)
                            })
                            .collect();
                        out.push(compress(raw, p.compression));
                    }
                }
            }
        }
    }
    out
}

/// A classic TIFF of `pages`, little- or big-endian.
fn tiff_bytes(pages: &[Page], big: bool) -> Vec<u8> {
    let mut out: Vec<u8> = if big { b"MM\0*" } else { b"II*\0" }.to_vec();
    let u32b = |v: u32| {
        if big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    };
    let u16b = |v: u16| {
        if big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    };
    let mut link = 4;
    out.extend_from_slice(&[0; 4]);
    for p in pages {
        let mut offsets = Vec::new();
        let mut counts = Vec::new();
        for c in p.raw.clone().unwrap_or_else(|| chunks(p, big)) {
            offsets.push(out.len() as u32);
            counts.push(c.len() as u32);
            out.extend_from_slice(&c);
            if out.len() % 2 == 1 {
                out.push(0);
            }
        }
        // (tag, type: 3 SHORT or 4 LONG, values)
        let mut e: Vec<(u16, u16, Vec<u32>)> = vec![
            (256, 4, vec![p.w]),
            (257, 4, vec![p.h]),
            (258, 3, vec![p.bits as u32; p.spp as usize]),
            (259, 3, vec![p.compression as u32]),
            (262, 3, vec![p.photometric as u32]),
            (277, 3, vec![p.spp as u32]),
            (284, 3, vec![if p.planar { 2 } else { 1 }]),
            (339, 3, vec![p.format as u32; p.spp as usize]),
        ];
        match p.tiles {
            None => e.extend([
                (273, 4, offsets),
                (278, 4, vec![p.rows_per_strip]),
                (279, 4, counts),
            ]),
            Some((tw, th)) => e.extend([
                (322, 4, vec![tw]),
                (323, 4, vec![th]),
                (324, 4, offsets),
                (325, 4, counts),
            ]),
        }
        if p.predictor != 1 {
            e.push((317, 3, vec![p.predictor as u32]));
        }
        if !p.extra.is_empty() {
            e.push((338, 3, p.extra.iter().map(|&v| v as u32).collect()));
        }
        e.extend(p.tags.iter().cloned());
        e.sort_by_key(|x| x.0);
        let ifd = out.len() as u32;
        out[link..link + 4].copy_from_slice(&u32b(ifd));
        let mut data = ifd as usize + 2 + 12 * e.len() + 4;
        let mut tail = Vec::new();
        out.extend_from_slice(&u16b(e.len() as u16));
        for (tag, ty, vals) in &e {
            let mut bytes = Vec::new();
            for &v in vals {
                if *ty == 3 {
                    bytes.extend_from_slice(&u16b(v as u16));
                } else {
                    bytes.extend_from_slice(&u32b(v));
                }
            }
            out.extend_from_slice(&u16b(*tag));
            out.extend_from_slice(&u16b(*ty));
            out.extend_from_slice(&u32b(vals.len() as u32));
            if bytes.len() <= 4 {
                bytes.resize(4, 0);
                out.extend_from_slice(&bytes);
            } else {
                out.extend_from_slice(&u32b(data as u32));
                data += bytes.len();
                tail.extend_from_slice(&bytes);
            }
        }
        link = out.len();
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&tail);
        if out.len() % 2 == 1 {
            out.push(0);
        }
    }
    out
}

fn write(path: &Path, bytes: &[u8]) -> PathBuf {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
    path.to_path_buf()
}

// ---------------------------------------------------------------------------------------------
// Decoding through the library, and what each case must give.

fn frames(path: &Path, opts: &DecodeOptions) -> Result<Vec<Frame>, Reject> {
    let mut out = Vec::new();
    FileKind::Tiff.decode(path, opts, &mut |f| {
        out.push(f);
        Ok(())
    })?;
    Ok(out)
}

/// Each frame as a sample of its own size with `channels` and `dtype` (planar, little-endian).
fn samples_of(frames: Vec<Frame>, channels: u8, dtype: Dtype) -> Vec<Vec<u8>> {
    frames
        .into_iter()
        .map(|f| {
            let (_, (h, w)) = f.native();
            let t = Target {
                channels,
                height: h,
                width: w,
                dtype,
                fit: Fit::Crop,
            };
            let mut out = Vec::new();
            to_sample(f, &t, &mut out).unwrap();
            out
        })
        .collect()
}

/// The kept channels of a page, planar: channel 0 for grey, 0..3 for RGB.
fn kept(p: &Page, keep: u16) -> Vec<f64> {
    (0..keep)
        .flat_map(|c| (0..p.h).flat_map(move |y| (0..p.w).map(move |x| (x, y, c))))
        .map(|(x, y, c)| p.at(x, y, c))
        .collect()
}

/// u16 to u8 as the `image` crate converts (what a u8 target takes from 16-bit pixels).
fn to_u8(v: u16) -> u8 {
    ((v as u32 + 128) / 257) as u8
}

/// Sample types: (name, SampleFormat, bits).
const TYPES: [(&str, u16, u16); 11] = [
    ("u8", 1, 8),
    ("i8", 2, 8),
    ("u16", 1, 16),
    ("i16", 2, 16),
    ("u32", 1, 32),
    ("i32", 2, 32),
    ("u64", 1, 64),
    ("i64", 2, 64),
    ("f16", 3, 16),
    ("f32", 3, 32),
    ("f64", 3, 64),
];

/// Channel layouts: (name, photometric, extra samples, channels kept or None if refused).
const LAYOUTS: [(&str, u16, &[u16], Option<u16>); 7] = [
    ("grey", 1, &[], Some(1)),
    ("grey+alpha", 1, &[2], Some(1)),
    ("grey+data", 1, &[0], None),
    ("rgb", 2, &[], Some(3)),
    ("rgba", 2, &[2], Some(3)),
    ("rgb+alpha+data", 2, &[1, 0], Some(3)),
    ("grey+4 data", 1, &[0, 0, 0, 0], None),
];

/// A value of sample type `ty` for index `i` of page `page`, spread over the type's range, with
/// fractional parts for floats.
fn value(ty: &str, i: usize, page: usize) -> f64 {
    let k = (i * 37 + page * 101 + 13) as f64;
    match ty {
        "u8" => k % 256.0,
        "i8" => k % 256.0 - 128.0,
        "u16" => (k * 613.0) % 65536.0,
        "i16" => (k * 613.0) % 65536.0 - 32768.0,
        "u32" => (k * 1.9e7) % 4.2e9,
        "i32" => (k * 1.9e7) % 4.2e9 - 2.1e9,
        "u64" => (k * 3.1e13) % 9.0e15,
        "i64" => (k * 3.1e13) % 9.0e15 - 4.5e15,
        "f16" => half::f16::from_f64((k % 400.0 - 200.0) * 0.37).to_f64(),
        "f32" => ((k % 997.0 - 498.0) * 1.0131e-3 * (1 + page) as f64) as f32 as f64,
        _ => (k % 991.0 - 495.0) * 3.7e5 / 7.0,
    }
}

#[test]
fn matrix_of_types_channels_pages_and_layouts() {
    let t = tempfile::tempdir().unwrap();
    let (w, h) = (20, 18);
    let mut case = 0usize;
    let (mut converted, mut refused) = (0, 0);
    for (ty, format, bits) in TYPES {
        for (layout, photometric, extra, keep) in LAYOUTS {
            for pages in [1usize, 3] {
                for planar in [false, true] {
                    case += 1;
                    let spp = if photometric == 2 { 3 } else { 1 } + extra.len() as u16;
                    let big = case % 4 >= 2;
                    let ps: Vec<Page> = (0..pages)
                        .map(|pg| {
                            let mut p = Page::new(w, h, format, bits, photometric, spp);
                            p.extra = extra.to_vec();
                            p.planar = planar;
                            p.compression = [1, 8, 32773][case % 3];
                            if case / 2 % 2 == 1 {
                                p.tiles = Some((16, 16));
                            } else {
                                p.rows_per_strip = 7;
                            }
                            if case % 5 < 3 {
                                p.predictor = if format == 3 { 3 } else { 2 };
                            }
                            for (i, v) in p.values.iter_mut().enumerate() {
                                *v = value(ty, i, pg);
                            }
                            p
                        })
                        .collect();
                    let name = format!(
                        "{ty} {layout} pages={pages} planar={planar} big={big} tiles={:?} \
                         compression={} predictor={}",
                        ps[0].tiles, ps[0].compression, ps[0].predictor
                    );
                    let path = write(
                        &t.path().join(format!("case{case}.tif")),
                        &tiff_bytes(&ps, big),
                    );
                    // The tiff crate misreads interleaved samples it drops (past RGBA) in
                    // tiles overhanging the image, or under a predictor: refused, by name.
                    let misread = !planar
                        && extra.len() >= 2
                        && photometric == 2
                        && (ps[0].tiles.is_some() || ps[0].predictor != 1);
                    let want = match keep {
                        Some(_) if misread => Err("the tiff crate decodes such pages wrongly"),
                        Some(k) => Ok(k),
                        None => Err("several channels of data"),
                    };
                    check_case(&path, &name, ty, &ps, want);
                    match want {
                        Ok(_) => converted += 1,
                        Err(_) => refused += 1,
                    }
                }
            }
        }
    }
    // 11 types x 7 layouts x 2 page counts x 2 configurations: the two grey multi-channel
    // layouts refused, and some of the interleaved RGB + alpha + data ones.
    assert_eq!(converted + refused, 11 * 7 * 4);
    assert!(
        refused > 11 * 2 * 4 && refused < 11 * 3 * 4,
        "{refused} refused"
    );
}

/// Decode one matrix case every way and check what comes out.
fn check_case(path: &Path, name: &str, ty: &str, ps: &[Page], want: Result<u16, &str>) {
    let opts = DecodeOptions::default();
    let keep = match want {
        Ok(k) => k,
        Err(why) => {
            let e = frames(path, &opts).unwrap_err();
            assert!(
                e.0.starts_with("page 0: ") && e.0.contains(why),
                "{name}: {e}"
            );
            let e = FileKind::Tiff.probe(path, &opts).unwrap_err();
            assert!(e.0.contains(why), "{name}: {e}");
            return;
        }
    };
    let probe = FileKind::Tiff.probe(path, &opts).unwrap();
    assert_eq!(probe.colour, keep == 3, "{name}");
    assert_eq!(probe.size, Some((ps[0].h, ps[0].w)), "{name}");
    let pixels = matches!(ty, "u8" | "u16");
    let want: Vec<Vec<f64>> = ps.iter().map(|p| kept(p, keep)).collect();

    // Float target: every value as float32, bit for bit (integers as they convert).
    let float = DecodeOptions {
        float: true,
        ..DecodeOptions::default()
    };
    let got = samples_of(frames(path, &float).unwrap(), keep as u8, Dtype::F32);
    assert_eq!(got.len(), ps.len(), "{name}");
    for (pg, (g, wv)) in got.iter().zip(&want).enumerate() {
        let wb: Vec<u8> = wv.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect();
        if g != &wb {
            let diff: Vec<usize> = (0..wb.len() / 4)
                .filter(|i| g[i * 4..i * 4 + 4] != wb[i * 4..i * 4 + 4])
                .collect();
            panic!(
                "{name}: page {pg} float values differ at {} of {}: {:?}",
                diff.len(),
                wb.len() / 4,
                &diff[..diff.len().min(40)]
            );
        }
    }

    // A given window onto u8: values through it; 8/16-bit pixels keep their values.
    let (lo, hi) = match ty {
        "u8" | "i8" => (-50.0, 200.0),
        "u16" | "i16" => (-20000.0, 30000.0),
        "u32" | "i32" => (-1e9, 3e9),
        "u64" | "i64" => (-1e15, 5e15),
        _ => (-100.0, 150.0),
    };
    let windowed = DecodeOptions {
        window: Some((lo, hi)),
        ..DecodeOptions::default()
    };
    let got = samples_of(frames(path, &windowed).unwrap(), keep as u8, Dtype::U8);
    for (pg, (g, wv)) in got.iter().zip(&want).enumerate() {
        let wb: Vec<u8> = wv
            .iter()
            .map(|&v| match ty {
                "u8" => v as u8,
                "u16" => to_u8(v as u16),
                _ => to_u8(window_to_u16(v as f32 as f64, lo, hi)),
            })
            .collect();
        assert!(g == &wb, "{name}: page {pg} windowed pixels differ");
    }

    // No window given: one window for the whole file (here its min..max), onto u16.
    let whole = DecodeOptions {
        percentiles: (0.0, 100.0),
        ..DecodeOptions::default()
    };
    let all = want.iter().flatten().map(|&v| v as f32 as f64);
    let lo = all.clone().fold(f64::INFINITY, f64::min);
    let hi = all.fold(f64::NEG_INFINITY, f64::max);
    let got = samples_of(frames(path, &whole).unwrap(), keep as u8, Dtype::U16);
    for (pg, (g, wv)) in got.iter().zip(&want).enumerate() {
        let wb: Vec<u8> = wv
            .iter()
            .map(|&v| match pixels {
                true => v as u16 * if ty == "u8" { 257 } else { 1 },
                false => window_to_u16(v as f32 as f64, lo, hi),
            })
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert!(g == &wb, "{name}: page {pg} whole-file window differs");
    }
}

// ---------------------------------------------------------------------------------------------
// End to end: `prep convert`, the shards read back through the library.

fn convert(input: &Path, out: &Path, extra: &[&str], code: i32) -> std::process::Output {
    let mut args = vec![
        "convert",
        input.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--quiet",
        "--test-fraction",
        "0",
    ];
    args.extend_from_slice(extra);
    run(&args, code)
}

/// Every sample of the train split, in order.
fn shard_samples(d: &Path) -> Vec<Vec<u8>> {
    let ds = Dataset::open(d).unwrap();
    let mut out = Vec::new();
    for info in &ds.manifest.splits["train"].shards {
        let r = ds.open_shard(info).unwrap();
        for b in 0..r.num_blocks() {
            let block = r.read_block(b).unwrap();
            for i in 0..block.len() {
                out.push(block.sample(i).to_vec());
            }
        }
    }
    out
}

fn rejects(out: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("rejects.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A grey page of float32 `values` (w x h), in strips of 3 rows.
fn f32_page(w: u32, h: u32, values: &[f32]) -> Page {
    let mut p = Page::new(w, h, 3, 32, 1, 1);
    p.rows_per_strip = 3;
    p.values = values.iter().map(|&v| v as f64).collect();
    p
}

/// The float32 values a microscope might give, and the ones conversions get wrong: signed zeros,
/// subnormals, large and tiny magnitudes, f16's limits.
fn stack_values(n: usize, page: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..n)
        .map(|i| {
            let u = ((i + 1000 * page) as u32).wrapping_mul(2654435761) as f64 / u32::MAX as f64;
            ((u - 0.3) * 3000.0) as f32 + 0.123
        })
        .collect();
    let special = [-0.0, 0.0, 1e-40, -3.4e38, 3.3e38, 5.96e-8, 65504.0, 0.1];
    v[..special.len()].copy_from_slice(&special);
    v
}

#[test]
fn float32_stacks_keep_their_values_bit_for_bit() {
    let t = tempfile::tempdir().unwrap();
    let (w, h) = (9, 7);
    let vals: Vec<Vec<f32>> = (0..3).map(|p| stack_values((w * h) as usize, p)).collect();
    // Grey, little-endian strips, Deflate with the floating-point predictor.
    let grey: Vec<Page> = vals
        .iter()
        .map(|v| {
            let mut p = f32_page(w, h, v);
            p.compression = 8;
            p.predictor = 3;
            p
        })
        .collect();
    write(&t.path().join("grey/stack.tif"), &tiff_bytes(&grey, false));
    let out = t.path().join("grey-f32");
    convert(&t.path().join("grey"), &out, &["--dtype", "f32"], 0);
    let s = shard_samples(&out);
    assert_eq!(s.len(), 3);
    for (i, v) in vals.iter().enumerate() {
        let want: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(s[i], want, "page {i}");
    }
    let m = Dataset::open(&out).unwrap().manifest;
    assert_eq!(
        (m.sample.dtype, m.sample.shape.0.clone()),
        (Dtype::F32, vec![1, h, w])
    );

    // RGB, big-endian, planar, tiled: three planes of three pages.
    let rgb: Vec<Page> = (0..3)
        .map(|pg| {
            let mut p = Page::new(w, h, 3, 32, 2, 3);
            p.planar = true;
            p.tiles = Some((16, 16));
            for (i, v) in p.values.iter_mut().enumerate() {
                *v = vals[(pg + i % 3) % 3][i / 3] as f64;
            }
            p
        })
        .collect();
    write(&t.path().join("rgb/stack.tif"), &tiff_bytes(&rgb, true));
    let out = t.path().join("rgb-f32");
    convert(&t.path().join("rgb"), &out, &["--dtype", "f32"], 0);
    let s = shard_samples(&out);
    assert_eq!(s.len(), 3);
    for (pg, p) in rgb.iter().enumerate() {
        let want: Vec<u8> = kept(p, 3)
            .iter()
            .flat_map(|&x| (x as f32).to_le_bytes())
            .collect();
        assert_eq!(s[pg], want, "page {pg}");
    }

    // f16: rounded to nearest; a value beyond f16's range rejects the file by page.
    let small: Vec<Page> = vals
        .iter()
        .map(|v| {
            let v: Vec<f32> = v.iter().map(|x| x.clamp(-60000.0, 60000.0)).collect();
            f32_page(w, h, &v)
        })
        .collect();
    write(
        &t.path().join("small/stack.tif"),
        &tiff_bytes(&small, false),
    );
    let out = t.path().join("f16");
    convert(&t.path().join("small"), &out, &["--dtype", "f16"], 0);
    let s = shard_samples(&out);
    for (i, p) in small.iter().enumerate() {
        let want: Vec<u8> = p
            .values
            .iter()
            .flat_map(|&x| half::f16::from_f64(x).to_le_bytes())
            .collect();
        assert_eq!(s[i], want, "page {i}");
    }
    let o = convert(
        &t.path().join("grey"),
        &t.path().join("far"),
        &["--dtype", "f16"],
        1,
    );
    let e = stderr(&o);
    assert!(
        e.contains("stack.tif: image 0: value") && e.contains("beyond f16's range"),
        "{e}"
    );
}

#[test]
fn non_finite_values_reject_a_float_stack_and_window_to_zero() {
    let t = tempfile::tempdir().unwrap();
    let (w, h) = (4, 3);
    let mut pages: Vec<Vec<f32>> = (0..3)
        .map(|p| (0..12).map(|i| (i + 12 * p) as f32).collect())
        .collect();
    pages[1][5] = f32::NAN;
    pages[2][0] = f32::INFINITY;
    let ps: Vec<Page> = pages.iter().map(|v| f32_page(w, h, v)).collect();
    write(&t.path().join("in/nan.tif"), &tiff_bytes(&ps, false));
    let out = t.path().join("f32");
    let o = convert(
        &t.path().join("in"),
        &out,
        &["--dtype", "f32", "--on-error", "fail"],
        1,
    );
    let e = stderr(&o);
    assert!(
        e.contains("nan.tif") && e.contains("image 1: value NaN at channel 0, row 1, column 1"),
        "{e}"
    );

    // Windowed: NaN is 0, +Inf the window's top; the window (0..35 here, min..max of the finite
    // values at 0-100 percentiles... the default 0.5-99.5 on 34 values) is the whole stack's.
    let out = t.path().join("u16");
    convert(
        &t.path().join("in"),
        &out,
        &["--dtype", "u16", "--window", "0:35"],
        0,
    );
    let s = shard_samples(&out);
    let px = |page: usize, i: usize| u16::from_le_bytes([s[page][2 * i], s[page][2 * i + 1]]);
    assert_eq!(px(1, 5), 0);
    assert_eq!(px(2, 0), 65535);
    assert_eq!(px(1, 6), window_to_u16(18.0, 0.0, 35.0));
}

/// NumPy's default `percentile` (linear between ranks) of sorted `v`.
fn percentile(v: &[f64], q: f64) -> f64 {
    let pos = q / 100.0 * (v.len() - 1) as f64;
    let k = pos.floor() as usize;
    let f = pos - k as f64;
    if k + 1 < v.len() {
        v[k] + f * (v[k + 1] - v[k])
    } else {
        v[k]
    }
}

#[test]
fn integer_stacks_window_onto_u8() {
    let t = tempfile::tempdir().unwrap();
    let (w, h) = (6, 5);
    for (ty, format, bits, scale) in [
        ("i8", 2, 8, 2.0),
        ("i16", 2, 16, 97.0),
        ("u32", 1, 32, 9.0e6),
        ("i32", 2, 32, -1.1e7),
        ("f64", 3, 64, 0.013),
    ] {
        let dir = t.path().join(ty);
        // Three pages whose ranges differ: one window for the stack, not one per page.
        let ps: Vec<Page> = (0..3)
            .map(|pg| {
                let mut p = Page::new(w, h, format, bits, 1, 1);
                p.compression = 32773;
                for (i, v) in p.values.iter_mut().enumerate() {
                    let k = (i as f64 - 15.0) * (pg + 1) as f64;
                    *v = if ty == "u32" {
                        (k + 400.0) * scale
                    } else {
                        k * scale
                    };
                }
                p
            })
            .collect();
        write(&dir.join("stack.tif"), &tiff_bytes(&ps, true));
        let all: Vec<f64> = ps.iter().flat_map(|p| p.values.clone()).collect();

        // A known window, inside the stack's range.
        let min = all.iter().copied().fold(f64::INFINITY, f64::min);
        let max = all.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let (lo, hi) = (min + 0.2 * (max - min), max - 0.3 * (max - min));
        let out = t.path().join(format!("{ty}-window"));
        let win = format!("{lo}:{hi}");
        convert(&dir, &out, &["--window", &win], 0);
        let s = shard_samples(&out);
        assert_eq!(s.len(), 3, "{ty}");
        for (pg, p) in ps.iter().enumerate() {
            let want: Vec<u8> = p
                .values
                .iter()
                .map(|&v| to_u8(window_to_u16(v as f32 as f64, lo, hi)))
                .collect();
            assert_eq!(s[pg], want, "{ty} page {pg}");
        }
        // Page 2 reaches beyond both ends of the window, page 0 stays within.
        assert!(s[2].contains(&0) && s[2].contains(&255), "{ty}: {:?}", s[2]);
        assert!(s[0].iter().all(|&v| v > 0 && v < 255), "{ty}: {:?}", s[0]);

        // No window: the 0.5-99.5 percentile window of the whole stack's values.
        let out = t.path().join(format!("{ty}-auto"));
        convert(&dir, &out, &[], 0);
        let mut sorted: Vec<f64> = all.iter().map(|&v| v as f32 as f64).collect();
        sorted.sort_by(f64::total_cmp);
        let (lo, hi) = (percentile(&sorted, 0.5), percentile(&sorted, 99.5));
        let s = shard_samples(&out);
        for (pg, p) in ps.iter().enumerate() {
            let want: Vec<u8> = p
                .values
                .iter()
                .map(|&v| to_u8(window_to_u16(v as f32 as f64, lo, hi)))
                .collect();
            assert_eq!(s[pg], want, "{ty} page {pg}");
        }
        // Page 0 spans a third of the stack's range: it does not reach 0 or 255.
        assert!(s[0].iter().all(|&v| v > 40 && v < 215), "{ty}: {:?}", s[0]);
    }
}

/// Planar tiled pages of sizes that do and do not fill their tiles (the `tiff` crate alone
/// misplaces or panics on the bottom tiles of planes after the first).
#[test]
fn planar_tiles_of_any_size() {
    let t = tempfile::tempdir().unwrap();
    let float = DecodeOptions {
        float: true,
        ..DecodeOptions::default()
    };
    for (w, h) in [
        (20, 18),
        (9, 7),
        (16, 16),
        (17, 16),
        (16, 17),
        (40, 40),
        (33, 1),
    ] {
        for spp in [3, 4] {
            let mut p = Page::new(w, h, 3, 32, 2, spp);
            p.extra = vec![2; spp as usize - 3];
            p.planar = true;
            p.tiles = Some((16, 16));
            for (i, v) in p.values.iter_mut().enumerate() {
                *v = i as f64 * 0.5 - 100.0;
            }
            let path = write(
                &t.path().join("p.tif"),
                &tiff_bytes(&[p.clone(), p.clone()], false),
            );
            let got = samples_of(frames(&path, &float).unwrap(), 3, Dtype::F32);
            let want: Vec<u8> = kept(&p, 3)
                .iter()
                .flat_map(|&x| (x as f32).to_le_bytes())
                .collect();
            assert_eq!(got, vec![want.clone(), want], "{w}x{h}, {spp} samples");
        }
    }
}

/// A 3-page grey float32 stack of 12 x 10 pages, in strips of 3 rows.
fn float_stack() -> Vec<Page> {
    (0..3)
        .map(|pg| f32_page(12, 10, &stack_values(120, pg)))
        .collect()
}

/// A float32 page of `w` x `h` whose one strip holds 16 bytes.
fn header_only(w: u32, h: u32) -> Page {
    let mut p = Page::new(1, 1, 3, 32, 1, 1);
    (p.w, p.h, p.rows_per_strip) = (w, h, h);
    p.raw = Some(vec![vec![0; 16]]);
    p
}

#[test]
fn bad_files_are_refused_by_file_and_page() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("in");
    let good = tiff_bytes(&float_stack(), false);
    write(&dir.join("good.tif"), &good);
    let page = |format, bits, photometric, spp| {
        let mut p = Page::new(8, 6, format, bits, photometric, spp);
        p.extra = vec![0; spp as usize - if photometric == 2 { 3 } else { 1 }];
        p
    };
    // (file, pages, the reason's words)
    let bad: Vec<(&str, Vec<Page>, &str)> = vec![
        (
            "multi.tif",
            vec![page(1, 16, 1, 5)],
            "page 0: 5 samples per pixel in a grey image",
        ),
        (
            "palette.tif",
            vec![page(1, 8, 3, 1)],
            "page 0: palette colour",
        ),
        ("lab.tif", vec![page(1, 8, 8, 3)], "page 0: CIE L*a*b*"),
        (
            "complex.tif",
            vec![page(6, 64, 1, 1)],
            "page 0: complex samples",
        ),
        (
            "void.tif",
            vec![page(4, 8, 1, 1)],
            "page 0: samples of undefined format",
        ),
        (
            "bits12.tif",
            vec![page(1, 12, 1, 1)],
            "page 0: 12-bit unsigned samples",
        ),
        (
            "float24.tif",
            vec![page(3, 24, 1, 1)],
            "page 0: 24-bit float samples",
        ),
        // Sizes refused from the header, before anything is allocated.
        (
            "huge.tif",
            vec![header_only(30000, 30000)],
            "page 0: 30000x30000 pixels of 1 float32",
        ),
        (
            "wide.tif",
            vec![header_only(40000, 2)],
            "page 0: absurd size 40000x2",
        ),
        // A bad page after good ones: the whole file, by the bad page's number.
        (
            "third.tif",
            vec![page(3, 32, 1, 1), page(3, 32, 1, 1), page(5, 32, 1, 1)],
            "page 2: complex samples",
        ),
    ];
    for (name, pages, _) in &bad {
        write(&dir.join(name), &tiff_bytes(pages, false));
    }
    write(&dir.join("junk.tif"), b"P5 not a tiff at all");
    write(&dir.join("empty.tif"), b"");
    // Cut in the middle of the third page's pixel data (its directory follows them).
    let two = tiff_bytes(&float_stack()[..2], false).len();
    write(&dir.join("cut.tif"), &good[..two + 200]);

    let out = t.path().join("out");
    convert(&dir, &out, &["--dtype", "f32"], 0);
    assert_eq!(shard_samples(&out).len(), 3, "good.tif converts");
    let r = rejects(&out);
    let reason = |file: &str| -> String {
        r.iter()
            .find(|e| e["path"] == file)
            .unwrap_or_else(|| panic!("{file} not rejected: {r:?}"))["reason"]
            .as_str()
            .unwrap()
            .to_string()
    };
    for (name, _, why) in &bad {
        let got = reason(name);
        assert!(got.starts_with(why), "{name}: {got}");
    }
    assert!(reason("junk.tif").starts_with("not a TIFF"), "{r:?}");
    assert!(reason("empty.tif").contains("empty file"), "{r:?}");
    let cut = reason("cut.tif");
    assert!(cut.starts_with("page 2: truncated"), "{cut}");
    assert_eq!(r.len(), bad.len() + 3, "{r:?}");

    // Every cut of a stack is refused with a reason, none crashes the decoder.
    for end in (0..good.len()).step_by(97) {
        let p = write(&t.path().join("cuts/c.tif"), &good[..end]);
        let e = frames(&p, &DecodeOptions::default()).unwrap_err();
        assert!(
            e.0.starts_with("page ") || e.0.starts_with("not a TIFF") || e.0.contains("empty"),
            "cut at {end}: {e}"
        );
    }

    // Every byte flipped in turn, in files of strips and of planar tiles: a reason or pages,
    // never a panic out of the decoder.
    let mut tiled = Page::new(17, 5, 1, 8, 2, 3);
    tiled.planar = true;
    tiled.tiles = Some((16, 16));
    for (name, bytes) in [
        ("strips", tiff_bytes(&float_stack()[..2], true)),
        ("tiles", tiff_bytes(&[tiled.clone(), tiled], false)),
    ] {
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x5A;
            let p = write(&t.path().join("flips/f.tif"), &b);
            for o in [
                DecodeOptions::default(),
                DecodeOptions {
                    float: true,
                    ..Default::default()
                },
            ] {
                if let Err(e) = frames(&p, &o) {
                    assert!(!e.0.is_empty(), "{name} byte {i}");
                }
            }
        }
    }

    // --on-error fail stops at the first, naming the file and the page.
    std::fs::remove_file(dir.join("empty.tif")).unwrap();
    std::fs::remove_file(dir.join("junk.tif")).unwrap();
    let o = convert(&dir, &t.path().join("fail"), &["--on-error", "fail"], 1);
    let e = stderr(&o);
    assert!(e.contains(".tif") && e.contains(": page "), "{e}");
}

#[test]
fn a_page_of_another_size_is_resized_with_the_stack() {
    let t = tempfile::tempdir().unwrap();
    let mut ps = float_stack();
    ps.push(f32_page(24, 20, &[-7.25; 480]));
    write(&t.path().join("in/s.tif"), &tiff_bytes(&ps, true));
    let out = t.path().join("f32");
    convert(&t.path().join("in"), &out, &["--dtype", "f32"], 0);
    let s = shard_samples(&out);
    assert_eq!(s.len(), 4);
    for (i, p) in ps[..3].iter().enumerate() {
        let want: Vec<u8> = p
            .values
            .iter()
            .flat_map(|&v| (v as f32).to_le_bytes())
            .collect();
        assert_eq!(s[i], want, "page {i}");
    }
    // The larger page takes the first page's size (10 x 12); a constant stays exact.
    assert_eq!(s[3], (-7.25f32).to_le_bytes().repeat(120));
    // 16-bit pages as before: each an image resized to the first page's size.
    let pages: Vec<Page> = [(12, 10, 1000.0), (6, 5, 2000.0), (12, 10, 3000.0)]
        .iter()
        .map(|&(w, h, v)| {
            let mut p = Page::new(w, h, 1, 16, 1, 1);
            p.values.iter_mut().for_each(|x| *x = v);
            p
        })
        .collect();
    write(&t.path().join("in16/s.tif"), &tiff_bytes(&pages, false));
    let out = t.path().join("u16");
    convert(&t.path().join("in16"), &out, &["--dtype", "u16"], 0);
    let s = shard_samples(&out);
    assert_eq!(s.len(), 3);
    for (i, v) in [1000u16, 2000, 3000].iter().enumerate() {
        assert_eq!(s[i], v.to_le_bytes().repeat(120), "page {i}");
    }
}

/// RGB of 8-bit samples, pixel-major.
fn rgb_of(frame: Frame) -> Vec<u8> {
    match frame {
        Frame::Image(img) => img.into_rgb8().into_raw(),
        Frame::Float(_) | Frame::Windowed(_) => panic!("expected an image"),
    }
}

/// Grey of 8-bit samples.
fn grey_of(frame: Frame) -> Vec<u8> {
    match frame {
        Frame::Image(img) => img.into_luma8().into_raw(),
        Frame::Float(_) | Frame::Windowed(_) => panic!("expected an image"),
    }
}

#[test]
fn colour_models_bit_depths_and_the_crates_own_files() {
    let t = tempfile::tempdir().unwrap();
    let o = DecodeOptions::default();
    let (w, h) = (11u32, 5u32);
    let one = |p: &Page, name: &str| -> Frame {
        let path = write(
            &t.path().join(name),
            &tiff_bytes(std::slice::from_ref(p), false),
        );
        let mut f = frames(&path, &o).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(f.len(), 1);
        f.remove(0)
    };
    // Bilevel, white is zero (as fax scans): 0 is white.
    let mut p = Page::new(w, h, 1, 1, 0, 1);
    p.values
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = (i % 3 == 0) as u8 as f64);
    let want: Vec<u8> = p
        .values
        .iter()
        .map(|&v| if v == 0.0 { 255 } else { 0 })
        .collect();
    assert_eq!(grey_of(one(&p, "bilevel.tif")), want);
    // 4-bit grey onto 0..=255.
    let mut p = Page::new(w, h, 1, 4, 1, 1);
    p.values
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = (i % 16) as f64);
    let want: Vec<u8> = p.values.iter().map(|&v| v as u8 * 17).collect();
    assert_eq!(grey_of(one(&p, "grey4.tif")), want);
    // CMYK.
    let mut p = Page::new(w, h, 1, 8, 5, 4);
    p.values
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = ((i * 53) % 256) as f64);
    let want: Vec<u8> = p
        .values
        .chunks(4)
        .flat_map(|c| {
            let k = 255 - c[3] as u32;
            (0..3).map(move |i| (((255 - c[i] as u32) * k + 127) / 255) as u8)
        })
        .collect();
    assert_eq!(rgb_of(one(&p, "cmyk.tif")), want);
    // YCbCr, uncompressed and not subsampled, by JFIF's formula.
    let mut p = Page::new(w, h, 1, 8, 6, 3);
    p.tags.push((530, 3, vec![1, 1]));
    p.values
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = ((i * 71 + 40) % 256) as f64);
    let want: Vec<u8> = p
        .values
        .chunks(3)
        .flat_map(|c| {
            let (y, cb, cr) = (c[0] as f32, c[1] as f32 - 128.0, c[2] as f32 - 128.0);
            [
                y + 1.402 * cr,
                y - 0.344_136 * cb - 0.714_136 * cr,
                y + 1.772 * cb,
            ]
            .map(|v| v.round().clamp(0.0, 255.0) as u8)
        })
        .collect();
    assert_eq!(rgb_of(one(&p, "ycbcr.tif")), want);
    // JPEG in TIFF (YCbCr): as the image crate decodes the same JPEG, within rounding.
    let (jw, jh) = (32u32, 24u32);
    let src = image::RgbImage::from_fn(jw, jh, |x, y| {
        image::Rgb([(x * 8) as u8, (y * 10) as u8, ((x + y) * 4) as u8])
    });
    let mut jpeg = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 95)
        .encode_image(&src)
        .unwrap();
    let reference = image::load_from_memory(&jpeg)
        .unwrap()
        .into_rgb8()
        .into_raw();
    let mut p = Page::new(jw, jh, 1, 8, 6, 3);
    p.compression = 7;
    p.raw = Some(vec![jpeg]);
    let got = rgb_of(one(&p, "jpeg.tif"));
    assert_eq!(got.len(), reference.len());
    let worst = got
        .iter()
        .zip(&reference)
        .map(|(a, b)| a.abs_diff(*b))
        .max()
        .unwrap();
    assert!(
        worst <= 3,
        "JPEG-in-TIFF differs from the JPEG by up to {worst}"
    );

    // The tiff crate's encoder: LZW float stack, LZW + predictor RGB16, BigTIFF signed 16-bit.
    use tiff::encoder::{colortype, Compression, Predictor, TiffEncoder};
    let path = t.path().join("lzw.tif");
    let vals: Vec<Vec<f32>> = (0..3).map(|p| stack_values(120, p)).collect();
    {
        let f = std::fs::File::create(&path).unwrap();
        let mut e = TiffEncoder::new(f)
            .unwrap()
            .with_compression(Compression::Lzw);
        for v in &vals {
            e.write_image::<colortype::Gray32Float>(12, 10, v).unwrap();
        }
    }
    let float = DecodeOptions {
        float: true,
        ..DecodeOptions::default()
    };
    let got = samples_of(frames(&path, &float).unwrap(), 1, Dtype::F32);
    let want: Vec<Vec<u8>> = vals
        .iter()
        .map(|v| v.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    assert_eq!(got, want);
    let path = t.path().join("rgb16.tif");
    let px: Vec<u16> = (0..12 * 10 * 3).map(|i| (i * 541 % 65536) as u16).collect();
    {
        let f = std::fs::File::create(&path).unwrap();
        let mut e = TiffEncoder::new(f)
            .unwrap()
            .with_compression(Compression::Lzw)
            .with_predictor(Predictor::Horizontal);
        e.write_image::<colortype::RGB16>(12, 10, &px).unwrap();
    }
    let got = samples_of(frames(&path, &o).unwrap(), 3, Dtype::U16);
    let planar: Vec<u8> = (0..3)
        .flat_map(|c| px.iter().skip(c).step_by(3).flat_map(|v| v.to_le_bytes()))
        .collect();
    assert_eq!(got, vec![planar]);
    let path = t.path().join("big.tif");
    let px: Vec<i16> = (0..12 * 10)
        .map(|i| (i * 523 % 65536 - 32768) as i16)
        .collect();
    {
        let f = std::fs::File::create(&path).unwrap();
        let mut e = TiffEncoder::new_big(f).unwrap();
        e.write_image::<colortype::GrayI16>(12, 10, &px).unwrap();
    }
    let got = samples_of(frames(&path, &float).unwrap(), 1, Dtype::F32);
    let want: Vec<u8> = px.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect();
    assert_eq!(got, vec![want]);
}
