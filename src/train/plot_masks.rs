//! A grid PNG of segmentation test samples: one row per sample with its image, its true mask and
//! its predicted mask as colour overlays on the image, drawn like `plot`'s pictures (into an
//! `image::RgbImage` with the embedded bitmap font).

use super::plot::{frame, save, truncate, FRAME, INK, WHITE};
use crate::util::error::{shown_path, Error, Result};
use crate::util::font::{draw_text, fill_rect, text_w, Color};
use image::{Rgb, RgbImage};
use std::path::Path;

/// Samples of one grid, as plain arrays.
#[derive(Debug, Clone, Copy)]
pub struct MaskGrid<'a> {
    /// [n, c, h, w]: one channel (grey), three (RGB) or any other number (the first is shown in
    /// grey). Each sample is min-max scaled on its own, so normalised values need no undoing;
    /// non-finite values show black.
    pub images: &'a [f32],
    /// [n, h, w] true class per pixel.
    pub truth: &'a [u32],
    /// [n, h, w] predicted class per pixel.
    pub pred: &'a [u32],
    /// [c, h, w].
    pub shape: [usize; 3],
    /// The names of the mask's values; values past them (an ignore value) show white.
    pub classes: &'a [String],
    /// The class left transparent (0 unless the dataset says otherwise); it and values past the
    /// classes are left out of each row's mean Dice.
    pub background: Option<u32>,
}

/// Rows drawn at most; the title says how many samples there were.
pub const MAX_ROWS: usize = 12;
const ALPHA: f64 = 0.5;
/// What an overlay lays over pixels whose value has no name (an ignore value).
const OTHER: Color = [255, 255, 255];
/// Sasha Trubetskoy's 20 distinct colours, indexed by class value (cycling past 20): class 1 is red,
/// 2 green, 3 yellow, ...
const PALETTE: [Color; 20] = [
    [0, 130, 200],
    [230, 25, 75],
    [60, 180, 75],
    [255, 225, 25],
    [245, 130, 48],
    [145, 30, 180],
    [70, 240, 240],
    [240, 50, 230],
    [210, 245, 60],
    [250, 190, 212],
    [0, 128, 128],
    [220, 190, 255],
    [170, 110, 40],
    [255, 250, 200],
    [128, 0, 0],
    [170, 255, 195],
    [128, 128, 0],
    [255, 215, 180],
    [0, 0, 128],
    [128, 128, 128],
];
/// Margin, gap between cells, and text scale (5x7 glyphs drawn 10x14).
const PAD: i64 = 16;
const GAP: i64 = 12;
const S: i64 = 2;
/// Height of the text line above each row and of a legend line.
const LINE: i64 = 20;

/// The colour of class value `v`.
pub fn class_color(v: u32) -> Color {
    PALETTE[v as usize % PALETTE.len()]
}

/// Where everything goes, from the sizes alone (the tests find pixels through it).
#[derive(Debug, Clone, PartialEq)]
struct Layout {
    rows: usize,
    /// Cell size in pixels.
    cw: i64,
    ch: i64,
    /// Top of the first row's text line, and one row's height (text line, cell, gap).
    top: i64,
    row_h: i64,
    width: i64,
    height: i64,
    legend: Vec<LegendLine>,
}

/// One line of the legend: its entries as (colour, name, x).
type LegendLine = Vec<(Color, String, i64)>;

impl Layout {
    fn cell(&self, row: usize, col: usize) -> (i64, i64) {
        let x = PAD + col as i64 * (self.cw + GAP);
        (x, self.top + row as i64 * self.row_h + LINE)
    }
}

fn layout(g: &MaskGrid, n: usize, title: &str, other: bool) -> Layout {
    let [_, h, w] = g.shape;
    let rows = n.min(MAX_ROWS);
    let target = if rows <= 8 { 192 } else { 112 };
    let big = h.max(w);
    // Small images grow by a whole factor (crisp square pixels), large ones shrink to fit.
    let scale = if big <= target {
        (target / big) as f64
    } else {
        target as f64 / big as f64
    };
    let (cw, ch) = (
        ((w as f64 * scale).round() as i64).max(1),
        ((h as f64 * scale).round() as i64).max(1),
    );
    let grid_w = 3 * cw + 2 * GAP;
    let width = (2 * PAD + grid_w).max(2 * PAD + text_w(title, S)).max(420);
    // Legend entries: foreground classes in value order, wrapped to the width; no more than the
    // palette has colours, since past that they repeat.
    let mut entries: Vec<(Color, String)> = (0..g.classes.len() as u32)
        .filter(|&v| Some(v) != g.background)
        .map(|v| (class_color(v), truncate(&g.classes[v as usize], 14)))
        .collect();
    let extra = entries.len().saturating_sub(PALETTE.len());
    entries.truncate(PALETTE.len());
    if extra > 0 {
        entries.push((WHITE, format!("+{extra} more")));
    }
    if other {
        entries.push((OTHER, "unnamed".into()));
    }
    let mut legend: Vec<LegendLine> = vec![Vec::new()];
    let mut x = PAD;
    for (c, name) in entries {
        let w_entry = 20 + text_w(&name, S) + 16;
        if x > PAD && x + w_entry > width - PAD {
            legend.push(Vec::new());
            x = PAD;
        }
        legend.last_mut().unwrap().push((c, name, x));
        x += w_entry;
    }
    // Title, legend lines, column headers, then the rows.
    let top = PAD + LINE + legend.len() as i64 * LINE + 4 + LINE;
    let row_h = LINE + ch + GAP;
    Layout {
        rows,
        cw,
        ch,
        top,
        row_h,
        width,
        height: top + rows as i64 * row_h + PAD - GAP,
        legend,
    }
}

fn check(g: &MaskGrid, path: &Path) -> Result<usize> {
    let [c, h, w] = g.shape;
    let bad = |what: String| Error::Invalid(format!("plot {}: {what}", shown_path(path)));
    let (plane, sample) = (h.saturating_mul(w), c.saturating_mul(h).saturating_mul(w));
    if plane == 0 || sample == 0 || g.images.len() % sample != 0 {
        return Err(bad(format!(
            "{} image values are not whole samples of shape {c}x{h}x{w}",
            g.images.len()
        )));
    }
    let n = g.images.len() / sample;
    if n == 0 {
        return Err(bad("no samples to draw".into()));
    }
    if g.truth.len() != n * plane || g.pred.len() != n * plane {
        return Err(bad(format!(
            "{n} images of {h}x{w} but {} true and {} predicted mask values",
            g.truth.len(),
            g.pred.len()
        )));
    }
    Ok(n)
}

/// One sample's image as RGB bytes per pixel, min-max scaled over its finite values.
fn to_rgb(img: &[f32], c: usize, plane: usize) -> Vec<Color> {
    let shown = if c == 3 { img } else { &img[..plane] };
    let finite = shown.iter().copied().filter(|v| v.is_finite());
    let (lo, hi) = finite.fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), v| {
        (a.min(v), b.max(v))
    });
    let span = (hi as f64 - lo as f64).max(f64::MIN_POSITIVE);
    let byte = |v: f32| {
        if v.is_finite() {
            ((v as f64 - lo as f64) / span * 255.0)
                .round()
                .clamp(0.0, 255.0) as u8
        } else {
            0
        }
    };
    (0..plane)
        .map(|p| {
            if c == 3 {
                [byte(img[p]), byte(img[plane + p]), byte(img[2 * plane + p])]
            } else {
                [byte(img[p]); 3]
            }
        })
        .collect()
}

fn over(base: Color, c: Color, alpha: f64) -> Color {
    [0, 1, 2].map(|k| (base[k] as f64 * (1.0 - alpha) + c[k] as f64 * alpha).round() as u8)
}

/// The colour a mask value lays over a pixel, if any.
fn overlay(v: u32, g: &MaskGrid) -> Option<Color> {
    if Some(v) == g.background {
        None
    } else if (v as usize) < g.classes.len() {
        Some(class_color(v))
    } else {
        Some(OTHER)
    }
}

/// Mean Dice over the foreground classes present in the sample's truth or prediction, over the
/// pixels whose truth and prediction both have a name; `None` when no such class is present.
fn row_dice(truth: &[u32], pred: &[u32], g: &MaskGrid) -> Option<f64> {
    let k = g.classes.len();
    let mut counts = vec![[0u64; 3]; k];
    for (&t, &p) in truth.iter().zip(pred) {
        let (t, p) = (t as usize, p as usize);
        if t >= k || p >= k {
            continue;
        }
        if t == p {
            counts[t][0] += 1;
        } else {
            counts[p][1] += 1;
            counts[t][2] += 1;
        }
    }
    let fg = counts
        .iter()
        .enumerate()
        .filter(|(v, c)| Some(*v as u32) != g.background && c.iter().any(|&x| x > 0));
    let dice: Vec<f64> = fg
        .map(|(_, [tp, fp, fn_])| 2.0 * *tp as f64 / (2 * tp + fp + fn_) as f64)
        .collect();
    (!dice.is_empty()).then(|| dice.iter().sum::<f64>() / dice.len() as f64)
}

/// Draws one cell: the image, with `mask`'s colours laid over it when given, sampled nearest-
/// neighbour into a cw x ch box at (x0, y0).
fn cell(
    img: &mut RgbImage,
    at: (i64, i64),
    l: &Layout,
    rgb: &[Color],
    mask: Option<&[u32]>,
    g: &MaskGrid,
) {
    let [_, h, w] = g.shape;
    for cy in 0..l.ch {
        let sy = ((cy as usize * h) / l.ch as usize).min(h - 1);
        for cx in 0..l.cw {
            let sx = ((cx as usize * w) / l.cw as usize).min(w - 1);
            let p = sy * w + sx;
            let base = rgb[p];
            let c = match mask.and_then(|m| overlay(m[p], g)) {
                Some(c) => over(base, c, ALPHA),
                None => base,
            };
            img.put_pixel((at.0 + cx) as u32, (at.1 + cy) as u32, Rgb(c));
        }
    }
    frame(img, at.0 - 1, at.1 - 1, at.0 + l.cw, at.1 + l.ch, FRAME);
}

/// Writes the grid: a title, a legend of the classes' colours, then for each of the first
/// `MAX_ROWS` samples a line "sample i: mean Dice d" and three cells (image; truth over the image;
/// prediction over the image). Cells are about 192 pixels on their long side (112 past 8 rows):
/// small images grow by a whole factor, large ones shrink, both nearest-neighbour, so the PNG
/// stays under about 2000 pixels each way for any sample size.
pub fn masks_png(g: &MaskGrid, path: &Path) -> Result<()> {
    let n = check(g, path)?;
    let [c, h, w] = g.shape;
    let plane = h * w;
    let rows = n.min(MAX_ROWS);
    let title = if n > rows {
        format!("first {rows} of {n} test samples: image, truth, prediction")
    } else {
        format!("{n} test samples: image, truth, prediction")
    };
    let k = g.classes.len();
    let unnamed = |m: &[u32]| {
        m.iter()
            .any(|&v| v as usize >= k && Some(v) != g.background)
    };
    let shown = rows * plane;
    let other = unnamed(&g.truth[..shown]) || unnamed(&g.pred[..shown]);
    let l = layout(g, n, &title, other);
    let mut img = RgbImage::from_pixel(l.width as u32, l.height as u32, Rgb(WHITE));
    draw_text(&mut img, PAD, PAD, &title, S, INK, false);
    for (i, line) in l.legend.iter().enumerate() {
        let y = PAD + LINE * (i as i64 + 1);
        for (color, name, x) in line {
            fill_rect(&mut img, *x, y, 14, 14, *color);
            frame(&mut img, *x, y, x + 13, y + 13, FRAME);
            draw_text(&mut img, x + 20, y, name, S, INK, false);
        }
    }
    for (col, head) in ["image", "truth", "prediction"].iter().enumerate() {
        let (x, _) = l.cell(0, col);
        draw_text(&mut img, x, l.top - LINE, head, S, INK, false);
    }
    for r in 0..rows {
        let rgb = to_rgb(&g.images[r * c * plane..(r + 1) * c * plane], c, plane);
        let (truth, pred) = (
            &g.truth[r * plane..][..plane],
            &g.pred[r * plane..][..plane],
        );
        let dice = row_dice(truth, pred, g).map_or("-".into(), |d| format!("{d:.3}"));
        let (x, y) = l.cell(r, 0);
        let label = format!("sample {r}: mean Dice {dice}");
        draw_text(&mut img, x, y - LINE + 2, &label, S, INK, false);
        for (col, mask) in [None, Some(truth), Some(pred)].into_iter().enumerate() {
            cell(&mut img, l.cell(r, col), &l, &rgb, mask, g);
        }
    }
    save(&img, path)
}

#[cfg(test)]
mod tests;
