//! What `prep inspect` reports about a dataset, and the sample grid picture.

use crate::format::colmajor::{ColmajorManifest, ColmajorSplitReader};
use crate::format::shard::{Dataset, Dtype, SampleSpec};
use crate::util::error::{Error, Result};
use image::{Rgb, RgbImage};
use rayon::prelude::*;
use serde::Serialize;
use std::path::Path;

#[derive(Debug, Serialize)]
pub struct Summary {
    pub dir: String,
    pub format: String,
    pub shape: Vec<u32>,
    pub dtype: String,
    pub classes: Vec<String>,
    /// What each sample carries beside its image and class (format version 3).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<crate::format::fields::Field>,
    pub mean: Vec<f64>,
    pub std: Vec<f64>,
    pub codec: Option<crate::format::shard::Codec>,
    pub block_samples: Option<u32>,
    pub splits: Vec<SplitSummary>,
    pub shards: usize,
    /// Bytes of the dataset's files on disk.
    pub bytes_on_disk: u64,
    /// Bytes of the pixels and labels as decoded (u8/u16 pixels, u32 labels).
    pub bytes_decoded: u64,
    pub compression_ratio: f64,
    pub provenance: serde_json::Value,
    /// Which part of a fanned-out job this is (`--part I/N`), if it is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub part: Option<crate::format::part::Part>,
}

#[derive(Debug, Serialize)]
pub struct SplitSummary {
    pub name: String,
    pub samples: u64,
    pub class_counts: Vec<u64>,
    /// Each field's summary over the split, in declaration order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<crate::format::fields::FieldStats>,
    pub mean: Vec<f64>,
    pub std: Vec<f64>,
    pub shards: usize,
    pub bytes_on_disk: u64,
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

pub fn summarize(dir: &Path) -> Result<Summary> {
    let format = crate::format::dataset_format(dir)?;
    if format == crate::format::colmajor::FORMAT {
        let m = ColmajorManifest::read(dir)?;
        let listed: Vec<(std::path::PathBuf, u64)> = m
            .splits
            .values()
            .flat_map(|s| {
                [
                    // float32 feature-major, whatever the sample dtype.
                    (
                        dir.join(&s.images),
                        s.samples * m.sample.shape.elems() as u64 * 4,
                    ),
                    (dir.join(&s.labels), s.samples * 4),
                ]
            })
            .collect();
        crate::store::local::check_present(
            &dir.join(crate::format::shard::manifest::FILE_NAME),
            &listed,
        )?;
        let splits: Vec<SplitSummary> = m
            .splits
            .iter()
            .map(|(name, s)| SplitSummary {
                name: name.clone(),
                samples: s.samples,
                class_counts: s.class_counts.clone(),
                fields: vec![],
                mean: vec![],
                std: vec![],
                shards: 0,
                bytes_on_disk: file_len(&dir.join(&s.images)) + file_len(&dir.join(&s.labels)),
            })
            .collect();
        let on_disk: u64 = splits.iter().map(|s| s.bytes_on_disk).sum();
        let decoded: u64 = splits
            .iter()
            .map(|s| s.samples * (m.sample.bytes() as u64 + 4))
            .sum();
        return Ok(Summary {
            dir: dir.display().to_string(),
            format,
            shape: m.sample.shape.0.clone(),
            dtype: m.sample.dtype.to_string(),
            classes: m.classes.clone(),
            fields: vec![],
            mean: m.mean.clone(),
            std: m.std.clone(),
            codec: None,
            block_samples: None,
            splits,
            shards: 0,
            bytes_on_disk: on_disk,
            bytes_decoded: decoded,
            compression_ratio: decoded as f64 / on_disk.max(1) as f64,
            provenance: serde_json::to_value(&m.provenance).unwrap_or_default(),
            part: None,
        });
    }
    let ds = Dataset::open(dir)?;
    let m = &ds.manifest;
    let listed: Vec<(std::path::PathBuf, u64)> = ds
        .shards()
        .map(|(_, sh)| (ds.shard_path(sh), sh.bytes))
        .collect();
    crate::store::local::check_present(
        &dir.join(crate::format::shard::manifest::FILE_NAME),
        &listed,
    )?;
    let splits: Vec<SplitSummary> = m
        .splits
        .iter()
        .map(|(name, s)| SplitSummary {
            name: name.clone(),
            samples: s.samples,
            class_counts: s.class_counts.clone(),
            fields: s.fields.clone(),
            mean: s.mean.clone(),
            std: s.std.clone(),
            shards: s.shards.len(),
            bytes_on_disk: s.shards.iter().map(|sh| sh.bytes).sum(),
        })
        .collect();
    let on_disk: u64 =
        splits.iter().map(|s| s.bytes_on_disk).sum::<u64>() + file_len(&dir.join("manifest.json"));
    let decoded: u64 = splits
        .iter()
        .map(|s| s.samples * (m.sample.bytes() as u64 + 4 + m.fields.bytes() as u64))
        .sum();
    Ok(Summary {
        dir: dir.display().to_string(),
        format,
        shape: m.sample.shape.0.clone(),
        dtype: m.sample.dtype.to_string(),
        classes: m.classes.clone(),
        fields: m.fields.0.clone(),
        mean: m.mean.clone(),
        std: m.std.clone(),
        codec: Some(m.codec),
        block_samples: Some(m.block_samples),
        shards: splits.iter().map(|s| s.shards).sum(),
        splits,
        bytes_on_disk: on_disk,
        bytes_decoded: decoded,
        compression_ratio: decoded as f64 / on_disk.max(1) as f64,
        provenance: serde_json::to_value(&m.provenance).unwrap_or_default(),
        part: m.part.clone(),
    })
}

/// Up to `per_class` samples of every class, as (class, pixels) in sample order.
type Picks = Vec<Vec<Vec<u8>>>;

/// How many blocks `grid` reads at most looking for rare classes.
const GRID_MAX_BLOCKS: usize = 256;

/// A picture with one row of `per_class` samples for every class, from `split`, each sample scaled
/// up by `zoom`; a thin dark line separates samples.
pub fn grid(dir: &Path, split: &str, per_class: usize, zoom: u32) -> Result<RgbImage> {
    let format = crate::format::dataset_format(dir)?;
    let (spec, classes, picks, mean_std) = if format == crate::format::colmajor::FORMAT {
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
                picks[l].push(px);
            }
            if picks.iter().all(|p| p.len() >= per_class) {
                break;
            }
        }
        (
            m.sample.clone(),
            m.classes.clone(),
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
        let mut picks: Picks = vec![Vec::new(); k];
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
                        if picks[l].len() < per_class {
                            picks[l].push(block.sample(i).to_vec());
                        }
                    }
                }
                read += b1 - b0;
                if picks.iter().all(|p| p.len() >= per_class) || read >= GRID_MAX_BLOCKS {
                    break 'shards;
                }
                b0 = b1;
            }
        }
        let m = &ds.manifest;
        (
            m.sample.clone(),
            m.classes.clone(),
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
    let (gw, gh) = (
        side(w, per_class as u64) + label_w,
        side(h, classes.len() as u64),
    );
    if gw > GRID_MAX_SIDE || gh > GRID_MAX_SIDE {
        return Err(Error::Invalid(format!(
            "a grid of {per_class} samples of {w}x{h} pixels per class for {} classes at \
             --zoom {zoom} would be {gw}x{gh} pixels, over {GRID_MAX_SIDE} a side: ask for fewer \
             --per-class or a smaller --zoom",
            classes.len()
        )));
    }
    Ok(draw(
        &spec,
        &classes,
        per_class,
        zoom.max(1),
        &picks,
        &window,
    ))
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

fn shown_label(name: &str) -> String {
    if name.chars().count() > LABEL_CHARS {
        let mut s: String = name.chars().take(LABEL_CHARS - 1).collect();
        s.push('~');
        s
    } else {
        name.to_string()
    }
}

/// Pixels of the label column: the longest (shortened) name at `scale`, a margin either side.
fn label_width(classes: &[String], scale: i64) -> u32 {
    let widest = classes
        .iter()
        .map(|c| crate::util::font::text_w(&shown_label(c), scale))
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
    let cell_h = h as u32 * zoom + gap;
    let classes = names.len();
    // Each row starts with its class name, so the picture reads without the manifest.
    let scale = label_scale(zoom, h as u32);
    let label_w = label_width(names, scale);
    let mut img = RgbImage::from_pixel(
        label_w + cell_w * per_class as u32 + gap,
        cell_h * classes as u32 + gap,
        Rgb([40, 40, 48]),
    );
    for (k, name) in names.iter().enumerate() {
        let glyph_h = 7 * scale;
        let y = (gap + k as u32 * cell_h) as i64 + (cell_h as i64 - glyph_h) / 2;
        crate::util::font::draw_text(
            &mut img,
            4,
            y,
            &shown_label(name),
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
            samples.par_iter().enumerate().map(move |(j, px)| {
                let rgb = (0..plane)
                    .map(|p| {
                        if c >= 3 {
                            [value(px, 0, p), value(px, 1, p), value(px, 2, p)]
                        } else {
                            let g = value(px, 0, p);
                            [g, g, g]
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
    }
    img
}
