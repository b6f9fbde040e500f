//! PNG plots of training curves and confusion matrices, drawn straight into an `image::RgbImage`
//! with the embedded bitmap font of `crate::util::font`, so the tool needs no plotting, font or system
//! dependencies.

use crate::util::error::{Error, Result};
use crate::util::font::{draw_text, fill_rect, text_w, Color};
use image::{ImageFormat, Rgb, RgbImage};
use std::path::Path;

/// One epoch's figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EpochPoint {
    pub epoch: usize,
    pub train_loss: f64,
    pub test_loss: f64,
    pub train_accuracy: f64,
    pub test_accuracy: f64,
}

pub(super) const WHITE: Color = [255, 255, 255];
pub(super) const INK: Color = [30, 30, 30];
pub(super) const FRAME: Color = [110, 110, 110];
const GRID: Color = [228, 228, 228];
const MUTED: Color = [170, 170, 170];
const TRAIN: Color = [31, 119, 180];
const TEST: Color = [230, 100, 10];
/// Text scale: 5x7 glyphs become 10x14 pixels, 12 pixels apart.
const S: i64 = 2;

fn blend(img: &mut RgbImage, x: i64, y: i64, color: Color, alpha: f64) {
    let outside = x < 0 || y < 0 || x >= img.width() as i64 || y >= img.height() as i64;
    // NaN coverage comes from non-finite coordinates; casting it to u8 would paint black.
    if outside || alpha.is_nan() || alpha <= 0.0 {
        return;
    }
    let alpha = alpha.min(1.0);
    let p = img.get_pixel_mut(x as u32, y as u32);
    for (old, new) in p.0.iter_mut().zip(color) {
        *old = (*old as f64 * (1.0 - alpha) + new as f64 * alpha).round() as u8;
    }
}

/// Anti-aliased shape given as a distance function over a pixel box: each pixel is covered by
/// how far inside `radius` its centre lies, which gives smooth lines and dots without a rasteriser.
fn paint(img: &mut RgbImage, bx: [f64; 4], r: f64, c: Color, dist: impl Fn(f64, f64) -> f64) {
    let (x0, y0) = ((bx[0] - r - 1.0).max(0.0), (bx[1] - r - 1.0).max(0.0));
    let x1 = (bx[2] + r + 1.0).min(img.width() as f64);
    let y1 = (bx[3] + r + 1.0).min(img.height() as f64);
    if !(x0 < x1 && y0 < y1) {
        return; // also rejects NaN boxes
    }
    for py in y0 as i64..y1.ceil() as i64 {
        for px in x0 as i64..x1.ceil() as i64 {
            let d = dist(px as f64 + 0.5, py as f64 + 0.5);
            blend(img, px, py, c, (r + 0.5 - d).clamp(0.0, 1.0));
        }
    }
}

/// One-pixel rectangle outline from (l, t) to (r, b) inclusive.
pub(super) fn frame(img: &mut RgbImage, l: i64, t: i64, r: i64, b: i64, c: Color) {
    fill_rect(img, l, t, r - l + 1, 1, c);
    fill_rect(img, l, b, r - l + 1, 1, c);
    fill_rect(img, l, t, 1, b - t + 1, c);
    fill_rect(img, r, t, 1, b - t + 1, c);
}

fn segment(img: &mut RgbImage, a: (f64, f64), b: (f64, f64), width: f64, color: Color) {
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let len2 = dx * dx + dy * dy;
    let bx = [a.0.min(b.0), a.1.min(b.1), a.0.max(b.0), a.1.max(b.1)];
    paint(img, bx, width / 2.0, color, |x, y| {
        // Projection of the pixel onto the segment, clamped to its ends (0/0 gives NaN -> 0).
        let t = (((x - a.0) * dx + (y - a.1) * dy) / len2).clamp(0.0, 1.0);
        let t = if t.is_nan() { 0.0 } else { t };
        ((x - a.0 - t * dx).powi(2) + (y - a.1 - t * dy).powi(2)).sqrt()
    });
}

fn dot(img: &mut RgbImage, c: (f64, f64), r: f64, color: Color) {
    paint(img, [c.0, c.1, c.0, c.1], r, color, |x, y| {
        (x - c.0).hypot(y - c.1)
    });
}

/// Rounds a raw step to 1, 2 or 5 times a power of ten, so tick labels stay short.
fn nice_step(raw: f64) -> f64 {
    if !(raw > 0.0 && raw.is_finite()) {
        return 1.0;
    }
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let m = [(1.5, 1.0), (3.5, 2.0), (7.5, 5.0)]
        .iter()
        .find(|(lim, _)| norm < *lim);
    m.map_or(10.0, |(_, m)| *m) * mag
}

/// Multiples of a nice step lying within [lo, hi] (at most 50; none for an empty or odd range).
fn ticks(lo: f64, hi: f64, target: usize, integer: bool) -> (Vec<f64>, f64) {
    let span = hi - lo;
    if !(span > 0.0 && span.is_finite()) {
        return (Vec::new(), 1.0);
    }
    let mut step = nice_step(span / target as f64);
    if integer {
        step = step.max(1.0).round();
    }
    let first = (lo / step - 1e-9).ceil();
    let v = (0..50)
        .map(|k| (first + k as f64) * step)
        .take_while(|v| *v <= hi + step * 1e-9)
        .collect();
    (v, step)
}

fn fmt_tick(v: f64, step: f64) -> String {
    let v = if v.abs() < step * 1e-6 { 0.0 } else { v }; // avoid "-0.0" and 1e-17 residue
    if v != 0.0 && !(1e-4..1e5).contains(&step) {
        // Enough mantissa digits to tell neighbouring ticks apart.
        let prec = (v.abs().log10().floor() - step.log10().floor()).clamp(1.0, 6.0) as usize;
        return format!("{v:.prec$e}");
    }
    let dec = (-(step.log10() + 1e-9).floor()).max(0.0) as usize;
    format!("{v:.dec$}")
}

/// Y range for a panel: padded data range widened to nice steps; accuracies in [0, 1] stay inside it
/// and use the full 0..1 when they spread below one half.
fn y_range(vals: &[f64], accuracy: bool) -> (f64, f64) {
    if vals.is_empty() {
        return (0.0, 1.0);
    }
    let lo = vals.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let unit = accuracy && lo >= 0.0 && hi <= 1.0;
    if unit && lo < 0.5 {
        return (0.0, 1.0);
    }
    let span = hi - lo;
    let pad = 0.05 * if span > 0.0 { span } else { lo.abs().max(0.2) };
    let (a, b) = (lo - pad, hi + pad);
    let step = nice_step((b - a) / 5.0);
    let (mut a2, mut b2) = ((a / step).floor() * step, (b / step).ceil() * step);
    if !(a2.is_finite() && b2.is_finite() && b2 > a2) {
        (a2, b2) = (a, b);
    }
    if lo >= 0.0 {
        a2 = a2.max(0.0); // losses and accuracies are never negative; keep the axis from suggesting it
    }
    if unit {
        b2 = b2.min(1.0);
    }
    (a2, b2)
}

/// One named series of a panel.
struct Line<'a> {
    name: &'a str,
    ys: &'a [f64],
    color: Color,
    /// Stroke width; wider lines are drawn after (over) narrower ones.
    width: f64,
}

/// Legend entries longer than this are cut (the legend column's width follows the longest).
const LEGEND_CHARS: usize = 14;
/// Rows of the legend column: as many as fit beside the 318-pixel plot area at 20 pixels each.
const LEGEND_ROWS: usize = 15;

/// Whether the legend of `lines` fits in the header row beside `title` (else: a column).
fn header_legend_fits(title: &str, lines: &[Line]) -> bool {
    let legend: i64 = lines.iter().map(|e| 44 + text_w(e.name, S)).sum();
    text_w(title, S) + 20 + legend <= 400 + 16
}

/// Width of the legend column beside a panel's plot area (0 when the legend sits in the header).
fn legend_col_w(title: &str, lines: &[Line]) -> i64 {
    if header_legend_fits(title, lines) {
        return 0;
    }
    let w = lines
        .iter()
        .map(|e| text_w(&truncate(e.name, LEGEND_CHARS), S))
        .max()
        .unwrap_or(0);
    w.max(text_w("+99 more", S)) + 28 + 16
}

/// The legend as a column right of the plot area, top-aligned with it; past `LEGEND_ROWS` the
/// last row counts the rest.
fn legend_column(img: &mut RgbImage, x: i64, t: i64, lines: &[Line]) {
    let fits = lines.len() <= LEGEND_ROWS;
    let shown = if fits { lines.len() } else { LEGEND_ROWS - 1 };
    for (i, e) in lines.iter().take(shown).enumerate() {
        let y = t + 4 + 20 * i as i64;
        let cy = y as f64 + 7.0;
        segment(img, (x as f64, cy), (x as f64 + 22.0, cy), 2.0, e.color);
        dot(img, (x as f64 + 11.0, cy), 3.5, e.color);
        let name = truncate(e.name, LEGEND_CHARS);
        draw_text(img, x + 28, y, &name, S, INK, false);
    }
    if !fits {
        let more = format!("+{} more", lines.len() - shown);
        draw_text(
            img,
            x + 28,
            t + 4 + 20 * shown as i64,
            &more,
            S,
            FRAME,
            false,
        );
    }
}

/// Draws one panel of series against epochs, with its plot area spanning x0+84..x0+484 and its
/// legend in the header row or, when that is too narrow, in a column right of the plot area.
fn panel(img: &mut RgbImage, x0: i64, title: &str, xs: &[f64], lines: &[Line], acc: bool) {
    let (l, r, t, b) = (x0 + 84, x0 + 484, 44i64, 362i64);
    let finite: Vec<f64> = lines
        .iter()
        .flat_map(|e| e.ys.iter().copied())
        .filter(|v| v.is_finite())
        .collect();
    let (ylo, yhi) = y_range(&finite, acc);
    let (xlo, xhi) = match (xs.first(), xs.last()) {
        (Some(&a), Some(&z)) => {
            let pad = ((z - a) * 0.03).max(0.5);
            (a - pad, z + pad)
        }
        _ => (0.0, 1.0),
    };
    let px = |x: f64| l as f64 + (x - xlo) / (xhi - xlo) * (r - l) as f64;
    let py = |y: f64| b as f64 - (y - ylo) / (yhi - ylo) * (b - t) as f64;

    let (yt, ystep) = ticks(ylo, yhi, 6, false);
    let labels: Vec<String> = yt.iter().map(|&v| fmt_tick(v, ystep)).collect();
    // Long labels (tiny losses in exponent form) drop to half size rather than run off the edge.
    let fits = labels.iter().all(|s| text_w(s, S) <= l - x0 - 10);
    let sc = if fits { S } else { 1 };
    for (v, s) in yt.iter().zip(&labels) {
        let y = py(*v).round() as i64;
        fill_rect(img, l, y, r - l, 1, GRID);
        fill_rect(img, l - 5, y, 5, 1, FRAME);
        let (lx, ly) = (l - 9 - text_w(s, sc), y - 7 * sc / 2);
        draw_text(img, lx, ly, s, sc, INK, false);
    }
    // Fewer x ticks until the widest label fits between neighbours (large epoch numbers).
    let room = |(v, st): &(Vec<f64>, f64)| {
        let widest = v.iter().map(|&x| text_w(&fmt_tick(x, *st), S)).max();
        (widest.unwrap_or(0) + 12) as f64 <= st / (xhi - xlo) * (r - l) as f64
    };
    let xt = (2..=6).rev().map(|k| ticks(xlo, xhi, k, true)).find(room);
    let (xt, xstep) = xt.unwrap_or_else(|| ticks(xlo, xhi, 2, true));
    for v in xt {
        let x = px(v).round() as i64;
        fill_rect(img, x, t, 1, b - t, GRID);
        fill_rect(img, x, b, 1, 5, FRAME);
        let s = fmt_tick(v, xstep);
        draw_text(img, x - text_w(&s, S) / 2, b + 9, &s, S, INK, false);
    }
    frame(img, l, t, r, b, FRAME);
    let ex = (l + r - text_w("epoch", S)) / 2;
    draw_text(img, ex, b + 31, "epoch", S, INK, false);
    draw_text(img, l, 16, title, S, INK, false);

    // Legend in the header row, right-aligned, so it never hides data.
    if header_legend_fits(title, lines) {
        let mut lx = r + 16 - lines.iter().map(|e| 44 + text_w(e.name, S)).sum::<i64>();
        for e in lines {
            segment(
                img,
                (lx as f64, 23.0),
                (lx as f64 + 22.0, 23.0),
                2.0,
                e.color,
            );
            dot(img, (lx as f64 + 11.0, 23.0), 3.5, e.color);
            draw_text(img, lx + 28, 16, e.name, S, INK, false);
            lx += 44 + text_w(e.name, S);
        }
    } else {
        legend_column(img, r + 16, t, lines);
    }

    if finite.is_empty() {
        let msg = "no data";
        let (mx, my) = ((l + r - text_w(msg, S)) / 2, (t + b) / 2 - 7);
        draw_text(img, mx, my, msg, S, FRAME, false);
        return;
    }
    // Dots shrink as points crowd together so 100 epochs still read as a line.
    let gap = (r - l) as f64 / (xs.len().max(2) - 1) as f64;
    let radius = (gap / 3.0).clamp(1.5, 3.5);
    let mut order: Vec<&Line> = lines.iter().collect();
    order.sort_by(|a, b| a.width.total_cmp(&b.width)); // stable: equal widths keep their order
    for e in order {
        let (s, c) = (e.ys, e.color);
        for i in 1..s.len().min(xs.len()) {
            if s[i - 1].is_finite() && s[i].is_finite() {
                let (p, q) = ((px(xs[i - 1]), py(s[i - 1])), (px(xs[i]), py(s[i])));
                segment(img, p, q, e.width, c);
            }
        }
        for (&x, &y) in xs.iter().zip(s.iter()).filter(|(_, y)| y.is_finite()) {
            dot(img, (px(x), py(y)), radius, c);
        }
    }
}

/// Encoded in memory (a few hundred KB) and written atomically: a failed write leaves no
/// half-written picture, and its error names the file once.
pub fn save(img: &RgbImage, path: &Path) -> Result<()> {
    let mut png = Vec::new();
    img.write_to(&mut std::io::Cursor::new(&mut png), ImageFormat::Png)
        .map_err(|e| {
            Error::Invalid(format!(
                "plot {}: {e}",
                crate::util::error::shown_path(path)
            ))
        })?;
    crate::store::output::write_atomic(path, &png)
}

/// Two side-by-side panels, "loss" (train and test) and "accuracy" (train and test, y axis 0..1 or
/// tighter around the data), epochs on the x axis, with axes, tick labels, a legend, distinct line
/// colours and dots at each point. Works for 1 point (draw the dots) and for many (e.g. 100).
/// Writes a PNG of about 1000x420 pixels.
pub fn curves_png(points: &[EpochPoint], path: &Path) -> Result<()> {
    curves_with_png(points, None, path)
}

/// A named per-epoch series: one value per `EpochPoint`, in the order the points are given
/// (non-finite values are gaps, e.g. an epoch where a class's Dice is undefined).
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub values: Vec<f64>,
}

/// A panel of task metrics beside the loss: "mean Dice" with one series per class, "mAP", "R2".
#[derive(Debug, Clone, PartialEq)]
pub struct MetricPanel {
    pub title: String,
    /// Series named "train" and "test" take the loss panel's colours; with three or more series
    /// the first is the headline (the mean), drawn black, wider and on top; the rest take green,
    /// red, purple, brown, pink, grey, olive, cyan, blue, orange in order (cycling).
    pub series: Vec<Series>,
    /// Values lie in [0, 1] (Dice, IoU, mAP, F1): the y axis treats them like accuracies. R2 can
    /// go below 0 and stays `false`.
    pub unit: bool,
    /// Keep the accuracy panel between loss and this one (off for tasks without an accuracy).
    pub with_accuracy: bool,
}

const PALETTE: [Color; 10] = [
    [44, 160, 44],
    [214, 39, 40],
    [148, 103, 189],
    [140, 86, 75],
    [227, 119, 194],
    [127, 127, 127],
    [188, 189, 34],
    [23, 190, 207],
    TRAIN,
    TEST,
];

/// Colour and stroke width of each metric series (see `MetricPanel::series`).
fn series_style(series: &[Series]) -> Vec<(Color, f64)> {
    let mut next = 0;
    let headline = series.len() >= 3;
    let style = |(i, s): (usize, &Series)| match s.name.as_str() {
        "train" => (TRAIN, 2.0),
        "test" => (TEST, 2.0),
        _ if headline && i == 0 => (INK, 3.0),
        _ => {
            next += 1;
            (PALETTE[(next - 1) % PALETTE.len()], 2.0)
        }
    };
    series.iter().enumerate().map(style).collect()
}

/// `curves_png` with an optional metric panel after loss (and accuracy, if kept); the panel is
/// 500 pixels wide plus a legend column when its names do not fit in its header row. Without
/// one it draws exactly what `curves_png` draws. A series whose length differs from the
/// points' is an error.
pub fn curves_with_png(
    points: &[EpochPoint],
    metric: Option<&MetricPanel>,
    path: &Path,
) -> Result<()> {
    if let Some(bad) = metric.and_then(|m| m.series.iter().find(|s| s.values.len() != points.len()))
    {
        return Err(Error::Invalid(format!(
            "plot {}: series {:?} has {} values for {} epochs",
            crate::util::error::shown_path(path),
            bad.name,
            bad.values.len(),
            points.len()
        )));
    }
    // A stable sort, so the series follow the points into epoch order.
    let mut order: Vec<usize> = (0..points.len()).collect();
    order.sort_by_key(|&i| points[i].epoch);
    let xs: Vec<f64> = order.iter().map(|&i| points[i].epoch as f64).collect();
    let col =
        |f: fn(&EpochPoint) -> f64| order.iter().map(|&i| f(&points[i])).collect::<Vec<f64>>();
    let (trl, tel) = (col(|p| p.train_loss), col(|p| p.test_loss));
    let (tra, tea) = (col(|p| p.train_accuracy), col(|p| p.test_accuracy));
    let pair = |tr, te| {
        [
            Line {
                name: "train",
                ys: tr,
                color: TRAIN,
                width: 2.0,
            },
            Line {
                name: "test",
                ys: te,
                color: TEST,
                width: 2.0,
            },
        ]
    };
    let with_acc = metric.is_none_or(|m| m.with_accuracy);
    let values: Vec<Vec<f64>> = metric.map_or_else(Vec::new, |m| {
        let sorted = |s: &Series| order.iter().map(|&i| s.values[i]).collect();
        m.series.iter().map(sorted).collect()
    });
    let lines: Vec<Line> = metric.map_or_else(Vec::new, |m| {
        let it = m.series.iter().zip(&values).zip(series_style(&m.series));
        it.map(|((s, ys), (color, width))| Line {
            name: &s.name,
            ys,
            color,
            width,
        })
        .collect()
    });
    let title = metric.map_or("", |m| m.title.as_str());
    let metric_x = if with_acc { 1000 } else { 500 };
    let w = match metric {
        Some(_) => metric_x + 500 + legend_col_w(title, &lines),
        None => 1000,
    };
    let mut img = RgbImage::from_pixel(w as u32, 420, Rgb(WHITE));
    panel(&mut img, 0, "loss", &xs, &pair(&trl, &tel), false);
    if with_acc {
        panel(&mut img, 500, "accuracy", &xs, &pair(&tra, &tea), true);
    }
    if let Some(m) = metric {
        panel(&mut img, metric_x, title, &xs, &lines, m.unit);
    }
    save(&img, path)
}

/// Cell shade for a row fraction: white to dark blue, on a square-root scale so that small
/// confusions (a few percent of a row) still show against white.
fn shade(f: f64) -> Color {
    let (a, b) = ([247.0, 251.0, 255.0], [8.0, 48.0, 107.0]);
    let f = f.clamp(0.0, 1.0).sqrt();
    [0, 1, 2].map(|k: usize| (a[k] + (b[k] - a[k]) * f).round() as u8)
}

pub(super) fn truncate(name: &str, max: usize) -> String {
    if name.chars().count() <= max {
        name.to_string()
    } else {
        name.chars().take(max - 1).chain(['~']).collect()
    }
}

/// A confusion matrix heat map: rows = true class, columns = predicted class, cells shaded by
/// row-normalised value with the count written in each cell when it fits (up to ~20 classes;
/// beyond that, only shading), class names (truncated to ~10 chars) on both axes, title
/// "confusion matrix (rows: true, columns: predicted)". Any number of classes from 1 to 1000 must not
/// panic (cells get smaller; cap the image at about 2000x2000).
pub fn confusion_png(matrix: &[Vec<u64>], classes: &[String], path: &Path) -> Result<()> {
    let n = matrix.len();
    if n == 0 || classes.len() != n || matrix.iter().any(|row| row.len() != n) {
        let lens: Vec<usize> = matrix.iter().map(Vec::len).take(5).collect();
        return Err(Error::Invalid(format!(
            "plot {}: confusion matrix must be NxN (N >= 1) with N class names; got {n} rows (lengths {lens:?}...) and {} names",
            path.display(),
            classes.len()
        )));
    }
    // Cells up to 72 px (room for 6-digit counts), the grid at most 1600 px with fractional cell
    // edges; past 1600 classes some cells round to zero width and are skipped, bounding the image.
    let grid = n.saturating_mul(72).min(1600) as i64;
    let cell = grid as f64 / n as f64;
    let ls = if cell >= 16.0 { 2 } else { 1 };
    let stride = ((7 * ls + 3) as f64 / cell).ceil().max(1.0) as usize; // label every k-th class
    let names: Vec<String> = classes.iter().map(|c| truncate(c, 10)).collect();
    let lw = names.iter().map(|s| text_w(s, ls)).max().unwrap_or(0);
    let title = "confusion matrix (rows: true, columns: predicted)";
    let pad = 16;
    let (gl, gt) = (pad + lw + 10, pad + 14 + 18);
    let w = (gl + grid + pad).max(text_w(title, S) + 2 * pad);
    let h = gt + grid + 10 + lw + pad;
    let mut img = RgbImage::from_pixel(w as u32, h as u32, Rgb(WHITE));
    draw_text(&mut img, pad, pad, title, S, INK, false);
    let edge = |i: usize| (i as f64 * cell).round() as i64;

    for (i, row) in matrix.iter().enumerate() {
        let (y0, y1) = (gt + edge(i), gt + edge(i + 1));
        if y1 == y0 {
            continue;
        }
        let total: u128 = row.iter().map(|&v| v as u128).sum();
        for (j, &count) in row.iter().enumerate() {
            let (x0, x1) = (gl + edge(j), gl + edge(j + 1));
            if x1 == x0 {
                continue;
            }
            let f = count as f64 / total.max(1) as f64;
            fill_rect(&mut img, x0, y0, x1 - x0, y1 - y0, shade(f));
            let s = count.to_string();
            let on_shade = if f > 0.36 { WHITE } else { INK };
            let color = if count == 0 { MUTED } else { on_shade };
            // Past ~30 classes a grid of numbers is unreadable even where it fits; shading says more.
            let fits = |sc: i64| text_w(&s, sc) + 4 <= x1 - x0 && 7 * sc + 4 <= y1 - y0;
            if let Some(sc) = [2, 1].into_iter().find(|&sc| n <= 30 && fits(sc)) {
                let (tx, ty) = ((x0 + x1 - text_w(&s, sc)) / 2, (y0 + y1 - 7 * sc) / 2);
                draw_text(&mut img, tx, ty, &s, sc, color, false);
            }
        }
    }
    // Thin separators only where cells are big enough for them not to swamp the shading.
    if cell >= 8.0 {
        for i in 1..n {
            fill_rect(&mut img, gl + edge(i), gt, 1, grid, GRID);
            fill_rect(&mut img, gl, gt + edge(i), grid, 1, GRID);
        }
    }
    frame(&mut img, gl - 1, gt - 1, gl + grid, gt + grid, FRAME);
    for i in (0..n).step_by(stride) {
        let (mid, half) = ((edge(i) + edge(i + 1)) / 2, 7 * ls / 2);
        let (name, nw) = (&names[i], text_w(&names[i], ls));
        fill_rect(&mut img, gl - 5, gt + mid, 4, 1, FRAME);
        draw_text(&mut img, gl - 7 - nw, gt + mid - half, name, ls, INK, false);
        fill_rect(&mut img, gl + mid, gt + grid + 1, 1, 4, FRAME);
        let (cx, cy) = (gl + mid - half, gt + grid + 8 + nw);
        draw_text(&mut img, cx, cy, name, ls, INK, true);
    }
    save(&img, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory per test, so parallel tests can each clean up after themselves.
    fn dir(test: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("prep-plot-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn dims(path: &Path) -> (u32, u32) {
        let img = image::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        (img.width(), img.height())
    }

    fn point(epoch: usize) -> EpochPoint {
        let e = epoch as f64;
        EpochPoint {
            epoch,
            train_loss: 2.3 / (1.0 + e * 0.3),
            test_loss: 2.3 / (1.0 + e * 0.25) + 0.05,
            train_accuracy: 1.0 - 0.9 / (1.0 + e * 0.4),
            test_accuracy: 0.97 - 0.85 / (1.0 + e * 0.35),
        }
    }

    #[test]
    fn curves_many_one_and_none() {
        let d = dir("curves");
        for n in [100, 1, 0] {
            let pts: Vec<EpochPoint> = (1..=n).map(point).collect();
            let path = d.join(format!("c{n}.png"));
            curves_png(&pts, &path).unwrap();
            assert_eq!(dims(&path), (1000, 420), "{n} points");
        }
        // The lone point is drawn as dots (dot centres are fully opaque).
        let one = image::open(d.join("c1.png")).unwrap().to_rgb8();
        assert!(one.pixels().any(|p| p.0 == TEST) && one.pixels().any(|p| p.0 == TRAIN));
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn curves_skip_non_finite() {
        let d = dir("nan");
        let mut pts: Vec<EpochPoint> = (0..10).map(point).collect();
        pts[3].train_loss = f64::NAN;
        pts[4].test_loss = f64::INFINITY;
        pts[5].test_accuracy = f64::NAN;
        curves_png(&pts, &d.join("nan.png")).unwrap();
        assert_eq!(dims(&d.join("nan.png")), (1000, 420));
        for p in &mut pts {
            (p.train_loss, p.test_loss) = (f64::NAN, f64::NAN);
            (p.train_accuracy, p.test_accuracy) = (f64::NAN, f64::NEG_INFINITY);
        }
        curves_png(&pts, &d.join("allnan.png")).unwrap();
        assert_eq!(dims(&d.join("allnan.png")), (1000, 420));
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn confusion_sizes() {
        let d = dir("confusion");
        let ok = |v: u32| (100..=2000).contains(&v);
        for n in [1usize, 3, 10, 20, 100, 1000] {
            let mut m = vec![vec![0u64; n]; n];
            for (i, row) in m.iter_mut().enumerate() {
                row[i] = 90;
                row[(i * 7 + 1) % n] += 3;
            }
            let names: Vec<String> = (0..n).map(|i| format!("class_number_{i}")).collect();
            let path = d.join(format!("cm{n}.png"));
            confusion_png(&m, &names, &path).unwrap();
            let (w, h) = dims(&path);
            assert!(ok(w) && ok(h), "{n}: {w}x{h}");
        }
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn errors_name_the_path() {
        let d = dir("errors");
        let err = confusion_png(&[vec![1, 2]], &["a".into()], &d.join("bad.png")).unwrap_err();
        assert!(err.to_string().contains("bad.png"), "{err}");
        let err = confusion_png(&[], &[], &d.join("empty.png")).unwrap_err();
        assert!(err.to_string().contains("empty.png"), "{err}");
        let err = curves_png(&[point(1)], &d.join("no-such-dir").join("x.png")).unwrap_err();
        assert!(err.to_string().contains("no-such-dir"), "{err}");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn labels_and_ticks() {
        let unknown = crate::util::font::glyph('\u{1}');
        let title =
            "confusion matrix (rows: true, columns: predicted) loss accuracy epoch train test";
        let known = title
            .chars()
            .chain('0'..='9')
            .all(|c| crate::util::font::glyph(c) != unknown);
        assert!(known, "missing glyph");
        assert_eq!(fmt_tick(0.2 + 0.1, 0.1), "0.3");
        assert_eq!(fmt_tick(-1e-18, 0.05), "0.00");
        assert_eq!(fmt_tick(20.0, 20.0), "20");
        assert_eq!(fmt_tick(1.25e-9, 5e-11), "1.25e-9");
        let (v, step) = ticks(0.0, 1.0, 6, false);
        assert_eq!((v.len(), step), (6, 0.2));
        assert!(ticks(1.0, 1.0, 6, false).0.is_empty());
        assert_eq!(truncate("T-shirt/top", 10), "T-shirt/t~");
    }

    fn metric(names: &[&str], n: usize) -> MetricPanel {
        let series = names
            .iter()
            .enumerate()
            .map(|(j, s)| Series {
                name: s.to_string(),
                values: (0..n)
                    .map(|e| 0.9 - 0.5 / (1.0 + e as f64 + j as f64))
                    .collect(),
            })
            .collect();
        MetricPanel {
            title: "Dice (test)".into(),
            series,
            unit: true,
            with_accuracy: true,
        }
    }

    #[test]
    fn metric_panel_sizes_and_colours() {
        let d = dir("metric");
        let pts: Vec<EpochPoint> = (1..=20).map(point).collect();
        // One short series beside loss only: the legend fits the header, 1000 pixels wide.
        let mut one = metric(&["test"], 20);
        one.with_accuracy = false;
        one.title = "mAP".into();
        curves_with_png(&pts, Some(&one), &d.join("one.png")).unwrap();
        assert_eq!(dims(&d.join("one.png")), (1000, 420));
        // A headline and 20 classes beside loss and accuracy: a legend column past 1500 pixels.
        let mut names = vec!["mean".to_string()];
        names.extend((0..20).map(|i| format!("a_rather_long_class_{i}")));
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        curves_with_png(&pts, Some(&metric(&refs, 20)), &d.join("many.png")).unwrap();
        let (w, h) = dims(&d.join("many.png"));
        assert!(h == 420 && (1600..1800).contains(&w), "{w}x{h}");
        let img = image::open(d.join("many.png")).unwrap().to_rgb8();
        let plot_area = |c: Color| {
            let mut inside = img
                .enumerate_pixels()
                .filter(|(x, y, _)| *x > 1084 && *x < 1484 && *y > 44 && *y < 362);
            inside.any(|(_, _, p)| p.0 == c)
        };
        // The headline is black, the first classes green and red (dot centres are opaque).
        assert!(plot_area(INK) && plot_area([44, 160, 44]) && plot_area([214, 39, 40]));
        assert_eq!(series_style(&one.series), vec![(TEST, 2.0)]);
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn metric_series_follow_the_points_into_epoch_order() {
        let d = dir("order");
        // Points out of order; the one finite value belongs to epoch 1, drawn at the left.
        let pts = [point(9), point(1), point(5)];
        let mut m = metric(&["test"], 3);
        m.series[0].values = vec![f64::NAN, 0.7, f64::NAN];
        m.with_accuracy = false;
        curves_with_png(&pts, Some(&m), &d.join("o.png")).unwrap();
        let img = image::open(d.join("o.png")).unwrap().to_rgb8();
        let test_at = |x0: u32, x1: u32| {
            img.enumerate_pixels()
                .any(|(x, y, p)| x >= x0 && x < x1 && y > 44 && y < 362 && p.0 == TEST)
        };
        // Plot area 584..984 over epochs 0.5..9.5: epoch 1 lies near x 606, epoch 9 near 962.
        assert!(test_at(590, 630) && !test_at(630, 990));
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn metric_series_of_the_wrong_length() {
        let d = dir("badseries");
        let pts: Vec<EpochPoint> = (1..=3).map(point).collect();
        let err = curves_with_png(&pts, Some(&metric(&["mean", "x"], 2)), &d.join("b.png"));
        let err = err.unwrap_err().to_string();
        assert!(err.contains("b.png") && err.contains("\"mean\""), "{err}");
        // No points and no values: the panels say "no data" but draw.
        curves_with_png(&[], Some(&metric(&["mean"], 0)), &d.join("e.png")).unwrap();
        std::fs::remove_dir_all(d).unwrap();
    }
}
