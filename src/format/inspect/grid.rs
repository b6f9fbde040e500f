//! `prep inspect --grid`: a picture of samples, a row per class, with what they carry drawn on
//! them: a mask as a coloured overlay (a legend of its value names below), labels and values as
//! a caption under each sample.

use crate::format::colmajor::{ColmajorManifest, ColmajorSplitReader};
use crate::format::fields::{FieldKind, Fields};
use crate::format::shard::{Dataset, Dtype, SampleSpec};
use crate::util::error::{Error, Result};
use image::{Rgb, RgbImage};
use rayon::prelude::*;
use std::path::Path;

/// One sample shown: its pixels, and its bytes of every field (in declaration order).
#[derive(Clone, Default)]
struct Pick {
    px: Vec<u8>,
    fields: Vec<u8>,
}

/// Up to `per_class` samples of every class, in sample order.
type Picks = Vec<Vec<Pick>>;

/// How many blocks `grid` reads at most looking for rare classes.
const GRID_MAX_BLOCKS: usize = 256;

/// A picture with one row of `per_class` samples for every class, from `split`, each sample scaled
/// up by `zoom`; a thin dark line separates samples.
pub fn grid(dir: &Path, split: &str, per_class: usize, zoom: u32) -> Result<RgbImage> {
    let format = crate::format::dataset_format(dir)?;
    let (spec, classes, fields, picks, mean_std) = if format == crate::format::colmajor::FORMAT {
        let m = ColmajorManifest::read(dir)?;
        let r = ColmajorSplitReader::open(dir, &m, split)?;
        let k = m.classes.len();
        let mut picks: Picks = vec![Vec::new(); k];
        let max = m.sample.dtype.divisor() as f32;
        for i in 0..r.samples {
            let l = r.label(i) as usize;
            if l < k && picks[l].len() < per_class {
                let px: Vec<u8> = match m.sample.dtype {
                    Dtype::U8 => (0..r.features)
                        .map(|f| (r.get(i, f) * max).round() as u8)
                        .collect(),
                    Dtype::U16 => (0..r.features)
                        .flat_map(|f| ((r.get(i, f) * max).round() as u16).to_le_bytes())
                        .collect(),
                    // The file holds the values themselves (f16 ones exactly as float32).
                    Dtype::F16 => (0..r.features)
                        .flat_map(|f| half::f16::from_f32(r.get(i, f)).to_le_bytes())
                        .collect(),
                    Dtype::F32 => (0..r.features)
                        .flat_map(|f| r.get(i, f).to_le_bytes())
                        .collect(),
                };
                picks[l].push(Pick {
                    px,
                    fields: Vec::new(),
                });
            }
            if picks.iter().all(|p| p.len() >= per_class) {
                break;
            }
        }
        (
            m.sample.clone(),
            m.classes.clone(),
            Fields::default(),
            picks,
            (m.mean.clone(), m.std.clone()),
        )
    } else {
        let ds = Dataset::open(dir)?;
        let s = ds
            .manifest
            .splits
            .get(split)
            .ok_or_else(|| Error::Invalid(format!("{}: no split '{split}'", dir.display())))?;
        let k = ds.manifest.classes.len();
        let fields = ds.manifest.fields.clone();
        // With a mask, samples showing some of it come first: the first slices of a scan are
        // often all background.
        let mask = fields.iter().position(|f| f.kind == FieldKind::Mask);
        let mut picks: Picks = vec![Vec::new(); k];
        let mut plain: Picks = vec![Vec::new(); k];
        let mut read = 0;
        'shards: for info in &s.shards {
            let r = ds.open_shard(info)?;
            let n = r.num_blocks();
            let mut b0 = 0;
            while b0 < n {
                let b1 = (b0 + rayon::current_num_threads()).min(n);
                let idx: Vec<usize> = (b0..b1).collect();
                for block in r.read_blocks_par(&idx) {
                    let block = block?;
                    for i in 0..block.len() {
                        let l = block.label(i) as usize;
                        if picks[l].len() >= per_class {
                            continue;
                        }
                        let shows =
                            mask.is_none_or(|f| block.field(&fields, f, i).iter().any(|&b| b != 0));
                        if !shows && plain[l].len() >= per_class {
                            continue;
                        }
                        let pick = Pick {
                            px: block.sample(i).to_vec(),
                            fields: (0..fields.0.len())
                                .flat_map(|f| block.field(&fields, f, i).to_vec())
                                .collect(),
                        };
                        if shows { &mut picks[l] } else { &mut plain[l] }.push(pick);
                    }
                }
                read += b1 - b0;
                if picks.iter().all(|p| p.len() >= per_class) || read >= GRID_MAX_BLOCKS {
                    break 'shards;
                }
                b0 = b1;
            }
        }
        for (p, rest) in picks.iter_mut().zip(plain) {
            let more = per_class - p.len().min(per_class);
            p.extend(rest.into_iter().take(more));
        }
        let m = &ds.manifest;
        (
            m.sample.clone(),
            m.classes.clone(),
            fields,
            picks,
            (m.mean.clone(), m.std.clone()),
        )
    };
    let window = display_window(&spec, &mean_std.0, &mean_std.1);
    // The picture's sides, in 64 bits: refuse one the PNG would not hold in reason.
    let dims = &spec.shape.0;
    let (h, w) = (dims[dims.len() - 2] as u64, dims[dims.len() - 1] as u64);
    let zoom = zoom.max(1);
    let side = |n: u64, cells: u64| {
        (n.saturating_mul(zoom as u64) + 1)
            .saturating_mul(cells.max(1))
            .saturating_add(1)
    };
    let label_w = label_width(&classes, label_scale(zoom, h as u32)) as u64;
    let extra = Extra::of(&fields);
    let (gw, gh) = (
        side(w, per_class as u64) + label_w,
        side(h, classes.len() as u64)
            + extra.caption_h() as u64 * classes.len() as u64
            + extra.legend_h() as u64,
    );
    if gw > GRID_MAX_SIDE || gh > GRID_MAX_SIDE {
        return Err(Error::Invalid(format!(
            "a grid of {per_class} samples of {w}x{h} pixels per class for {} classes at \
             --zoom {zoom} would be {gw}x{gh} pixels, over {GRID_MAX_SIDE} a side: ask for fewer \
             --per-class or a smaller --zoom",
            classes.len()
        )));
    }
    let mut img = draw(
        &spec,
        &classes,
        per_class,
        zoom.max(1),
        &picks,
        &window,
        &extra,
    );
    extra.legend(&mut img);
    Ok(img)
}

/// Per channel, the stored values shown black and white: the whole range for u8/u16; for f16/f32
/// (values in their own units, no range of their own) the dataset's mean ± 3 standard deviations
/// (from the manifest), which holds nearly every value of most data.
fn display_window(spec: &SampleSpec, mean: &[f64], std: &[f64]) -> Vec<(f32, f32)> {
    (0..spec.shape.channels())
        .map(|c| {
            if !spec.dtype.is_float() {
                return (0.0, spec.dtype.divisor() as f32);
            }
            let (m, s) = (
                mean.get(c).copied().unwrap_or(0.0),
                std.get(c).copied().unwrap_or(0.0),
            );
            // A constant channel shows mid-grey.
            let s = if s > 0.0 { s } else { 1.0 };
            ((m - 3.0 * s) as f32, (m + 3.0 * s) as f32)
        })
        .collect()
}

/// The most pixels a side of `--grid`'s picture has.
const GRID_MAX_SIDE: u64 = 32_768;

/// Longest class name shown at the start of a grid row, in characters.
const LABEL_CHARS: usize = 20;

/// Text scale of the row labels: 1 while rows are under 16 pixels, else 2.
fn label_scale(zoom: u32, h: u32) -> i64 {
    if h.saturating_mul(zoom) >= 16 {
        2
    } else {
        1
    }
}

/// Pixels of the label column: the longest (shortened) name at `scale`, a margin either side.
fn label_width(classes: &[String], scale: i64) -> u32 {
    let widest = classes
        .iter()
        .map(|c| crate::util::font::text_w(&shown(c, LABEL_CHARS), scale))
        .max()
        .unwrap_or(0);
    widest as u32 + 8
}

fn draw(
    spec: &SampleSpec,
    names: &[String],
    per_class: usize,
    zoom: u32,
    picks: &Picks,
    window: &[(f32, f32)],
    extra: &Extra,
) -> RgbImage {
    let dims = &spec.shape.0;
    // Volumes show their middle slice.
    let (c, h, w) = (
        dims[0] as usize,
        dims[dims.len() - 2] as usize,
        dims[dims.len() - 1] as usize,
    );
    let depth = if dims.len() == 4 { dims[1] as usize } else { 1 };
    let plane = h * w;
    let gap = 1u32;
    let cell_w = w as u32 * zoom + gap;
    let caption_h = extra.caption_h();
    let cell_h = h as u32 * zoom + caption_h + gap;
    let classes = names.len();
    // Each row starts with its class name, so the picture reads without the manifest.
    let scale = label_scale(zoom, h as u32);
    let label_w = label_width(names, scale);
    let mut img = RgbImage::from_pixel(
        label_w + cell_w * per_class as u32 + gap,
        cell_h * classes as u32 + gap + extra.legend_h(),
        Rgb([40, 40, 48]),
    );
    for (k, name) in names.iter().enumerate() {
        let glyph_h = 7 * scale;
        let y = (gap + k as u32 * cell_h) as i64 + ((cell_h - caption_h) as i64 - glyph_h) / 2;
        crate::util::font::draw_text(
            &mut img,
            4,
            y,
            &shown(name, LABEL_CHARS),
            scale,
            [235, 235, 235],
            false,
        );
    }
    let value = |px: &[u8], ch: usize, p: usize| -> u8 {
        let e = (ch * depth + depth / 2) * plane + p;
        match spec.dtype {
            Dtype::U8 => px[e],
            Dtype::U16 => (u16::from_le_bytes([px[2 * e], px[2 * e + 1]]) >> 8) as u8,
            Dtype::F16 | Dtype::F32 => {
                let (lo, hi) = window[ch];
                let t = (spec.dtype.get(px, e) - lo) / (hi - lo);
                (t * 255.0).round().clamp(0.0, 255.0) as u8
            }
        }
    };
    let rows: Vec<(usize, usize, Vec<[u8; 3]>)> = picks
        .par_iter()
        .enumerate()
        .flat_map(|(k, samples)| {
            samples.par_iter().enumerate().map(move |(j, pick)| {
                let px = &pick.px;
                let mask = extra.mask_of(pick, depth);
                let rgb = (0..plane)
                    .map(|p| {
                        let rgb = if c >= 3 {
                            [value(px, 0, p), value(px, 1, p), value(px, 2, p)]
                        } else {
                            let g = value(px, 0, p);
                            [g, g, g]
                        };
                        match mask.as_ref().map(|m| m[p]) {
                            Some(v) if v != 0 => blend(rgb, mask_colour(v)),
                            _ => rgb,
                        }
                    })
                    .collect();
                (k, j, rgb)
            })
        })
        .collect();
    for (k, j, rgb) in rows {
        let (x0, y0) = (label_w + gap + j as u32 * cell_w, gap + k as u32 * cell_h);
        for y in 0..h * zoom as usize {
            for x in 0..w * zoom as usize {
                let p = (y / zoom as usize) * w + x / zoom as usize;
                img.put_pixel(x0 + x as u32, y0 + y as u32, Rgb(rgb[p]));
            }
        }
        if caption_h > 0 {
            let text = extra.caption(&picks[k][j], cell_w - gap);
            let y = (y0 + h as u32 * zoom + 2) as i64;
            crate::util::font::draw_text(&mut img, x0 as i64, y, &text, 1, [235, 235, 235], false);
        }
    }
    img
}

/// What is drawn beside the pixels: the first mask field as an overlay, the first labels or
/// values field as captions.
pub(super) struct Extra {
    fields: Fields,
    mask: Option<usize>,
    caption: Option<usize>,
}

impl Extra {
    fn of(fields: &Fields) -> Extra {
        let first = |k: FieldKind| fields.iter().position(|f| f.kind == k);
        Extra {
            fields: fields.clone(),
            mask: first(FieldKind::Mask),
            caption: first(FieldKind::Labels).or_else(|| first(FieldKind::Values)),
        }
    }

    /// Pixels below each sample for its caption.
    fn caption_h(&self) -> u32 {
        if self.caption.is_some() {
            11
        } else {
            0
        }
    }

    /// Rows of the mask legend: one line of up to 8 value names each, at most 4 lines.
    fn legend_lines(&self) -> Vec<Vec<(u32, String)>> {
        let Some(f) = self.mask else {
            return Vec::new();
        };
        let named: Vec<(u32, String)> = self.fields.0[f]
            .names
            .iter()
            .enumerate()
            .skip(1)
            .take(32)
            .map(|(v, n)| (v as u32, shown(n, 16)))
            .collect();
        named.chunks(8).map(|c| c.to_vec()).collect()
    }

    fn legend_h(&self) -> u32 {
        self.legend_lines().len() as u32 * 12 + u32::from(self.mask.is_some()) * 4
    }

    fn legend(&self, img: &mut RgbImage) {
        let lines = self.legend_lines();
        let top = img.height() - self.legend_h() + 4;
        for (r, line) in lines.iter().enumerate() {
            let y = top + r as u32 * 12;
            let mut x = 4i64;
            for (v, name) in line {
                let colour = mask_colour(*v);
                for dy in 0..8 {
                    for dx in 0..8 {
                        if x as u32 + dx < img.width() && y + dy < img.height() {
                            img.put_pixel(x as u32 + dx, y + dy, Rgb(colour));
                        }
                    }
                }
                let text = format!("{v} {name}");
                crate::util::font::draw_text(
                    img,
                    x + 11,
                    y as i64,
                    &text,
                    1,
                    [235, 235, 235],
                    false,
                );
                x += 11 + crate::util::font::text_w(&text, 1) + 10;
            }
        }
    }

    /// The mask of `pick` as one value a pixel (a volume's middle slice), if there is a mask.
    fn mask_of(&self, pick: &Pick, depth: usize) -> Option<Vec<u32>> {
        let f = self.mask?;
        let field = &self.fields.0[f];
        let at = self.fields.0[..f].iter().map(|g| g.bytes()).sum::<usize>();
        let bytes = &pick.fields[at..at + field.bytes()];
        let plane = field.elems() / depth.max(1);
        let start = plane * (depth / 2);
        Some(match field.dtype {
            Dtype::U16 => (start..start + plane)
                .map(|e| u16::from_le_bytes([bytes[2 * e], bytes[2 * e + 1]]) as u32)
                .collect(),
            _ => bytes[start..start + plane]
                .iter()
                .map(|&b| b as u32)
                .collect(),
        })
    }

    /// The caption of `pick`, at most `width` pixels: the labels set, or the first values.
    fn caption(&self, pick: &Pick, width: u32) -> String {
        let Some(f) = self.caption else {
            return String::new();
        };
        let field = &self.fields.0[f];
        let at = self.fields.0[..f].iter().map(|g| g.bytes()).sum::<usize>();
        let bytes = &pick.fields[at..at + field.bytes()];
        let text = match field.kind {
            FieldKind::Labels => {
                let on: Vec<&str> = field
                    .names
                    .iter()
                    .zip(bytes)
                    .filter(|(_, &b)| b == 1)
                    .map(|(n, _)| n.as_str())
                    .collect();
                if on.is_empty() {
                    "-".to_string()
                } else {
                    on.join(",")
                }
            }
            _ => bytes
                .chunks_exact(4)
                .map(|b| format!("{:.3}", f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                .collect::<Vec<_>>()
                .join(" "),
        };
        let chars = ((width as i64 + 1) / 6).max(1) as usize;
        shown(&text, chars)
    }
}

/// `text` cut to `chars` characters, a `~` marking the cut.
fn shown(text: &str, chars: usize) -> String {
    if text.chars().count() > chars {
        let mut s: String = text.chars().take(chars.saturating_sub(1)).collect();
        s.push('~');
        s
    } else {
        text.to_string()
    }
}

/// A distinct colour for mask value `v` (1 and up): a fixed table, then golden-angle hues.
fn mask_colour(v: u32) -> [u8; 3] {
    const TABLE: [[u8; 3]; 8] = [
        [230, 25, 75],
        [60, 180, 75],
        [255, 225, 25],
        [0, 130, 200],
        [245, 130, 48],
        [145, 30, 180],
        [70, 240, 240],
        [240, 50, 230],
    ];
    if (1..=8).contains(&v) {
        return TABLE[v as usize - 1];
    }
    let h = (v as f32 * 137.508) % 360.0;
    let (s, l) = (0.8f32, 0.55f32);
    let c = (1.0 - (2.0 * l - 1.0).abs()) * s;
    let x = c * (1.0 - ((h / 60.0) % 2.0 - 1.0).abs());
    let (r, g, b) = match (h / 60.0) as u32 {
        0 => (c, x, 0.0),
        1 => (x, c, 0.0),
        2 => (0.0, c, x),
        3 => (0.0, x, c),
        4 => (x, 0.0, c),
        _ => (c, 0.0, x),
    };
    let m = l - c / 2.0;
    [r, g, b].map(|v| ((v + m) * 255.0).round() as u8)
}

/// A mask colour over a pixel, half and half: the image stays readable under it.
fn blend(px: [u8; 3], colour: [u8; 3]) -> [u8; 3] {
    [0, 1, 2].map(|i| ((px[i] as u16 + colour[i] as u16) / 2) as u8)
}
