//! Generator version 2: the class is in the pattern, not in the colour, and `--difficulty` sets how
//! hard it is to see.
//!
//! Each class keeps version 1's pattern kind, orientation and spatial frequency (classes k and k+6
//! share a kind and differ in frequency and orientation). Each sample draws two colours from one
//! distribution shared by all classes, with a luminance gap so the pattern shows in every channel
//! count, and swaps them at random: foreground and background then have the same expected colour,
//! so the expected colour of every pixel is the same for every class. Difficulty `d` in [0, 1]:
//!
//! - orientation jitter +-(0.25 + 0.35d) rad and frequency jitter +-(12 + 30d)%. Two classes of
//!   one kind are 0.92 rad and 1.4x to 2x in frequency apart: their frequency ranges overlap from
//!   d = 0.17 (1.4x) to 0.71 (2x) on, their orientation ranges from 0.6, and samples in the overlap
//!   are ambiguous (rings have no orientation: classes 2 and 8 overlap first);
//! - pattern contrast (0.65 to 1.0) x (1 - 0.33d) of the colours' luminance gap;
//! - additive noise of standard deviation 14 (1 + d) pixel levels;
//! - on average d distractors: small discs of a random pattern kind, orientation, frequency and
//!   level that occlude what lies under them.
//!
//! The same arithmetic rules as version 1 hold (IEEE-exact operations only, vectorisable rows), so
//! the AVX2 and baseline code paths agree and every sample is a pure function of its inputs.

use super::generator::{
    noise_table, sin_cos, tri, DiscGeom, Generator, Rng, Scene, KINDS, MAX_DISTRACTORS, NOISE_LEN,
};
use std::f32::consts::PI;

/// Everything a pattern disc needs, in image units (1.0 = the shorter side).
#[derive(Clone, Copy)]
struct Disc {
    cx: f32,
    scale: f32,
    cos: f32,
    sin: f32,
    freq: f32,
    phase: f32,
    r2: f32,
    edge: f32,
    /// Intensity inside the disc: `level + contrast * pattern`.
    level: f32,
    contrast: f32,
}

/// The difficulty's effect on one sample's parameters.
struct Knobs {
    angle_jitter: f32,
    freq_jitter: f32,
    contrast: f32,
    noise_gain: f32,
    distractors: f32,
}

impl Knobs {
    fn of(d: f32) -> Self {
        Knobs {
            angle_jitter: 0.25 + 0.35 * d,
            freq_jitter: 0.12 + 0.3 * d,
            contrast: 1.0 - 0.33 * d,
            noise_gain: 1.0 + d,
            distractors: d,
        }
    }
}

/// Draw one row of a disc over `row` (pixels `x0 ..`). `OVER` blends the disc over what the row
/// holds (occlusion, by the disc's soft-edged envelope); otherwise the row is overwritten with the
/// disc on a zero background.
#[inline(always)]
fn disc_row<const KIND: u32, const OVER: bool>(row: &mut [f32], x0: usize, dy: f32, p: &Disc) {
    for (x, px) in row.iter_mut().enumerate() {
        let dx = ((x0 + x) as f32 + 0.5 - p.cx) * p.scale;
        let u = dx * p.cos + dy * p.sin;
        let v = dy * p.cos - dx * p.sin;
        let d2 = u * u + v * v;
        let a = tri(u * p.freq + p.phase);
        let b = tri(v * p.freq + p.phase);
        let pattern = match KIND {
            0 => a,
            1 => 0.5 + 2.0 * (a - 0.5) * (b - 0.5),
            2 => tri(d2.sqrt() * p.freq * 1.5 + p.phase),
            3 => a * b,
            4 => tri(u * p.freq + 0.6 * b + p.phase),
            _ => a.max(b),
        };
        let envelope = ((p.r2 - d2) * p.edge).clamp(0.0, 1.0);
        let value = p.level + p.contrast * pattern;
        *px = if OVER {
            *px + envelope * (value - *px)
        } else {
            envelope * value
        };
    }
}

/// `disc_row` with the kind chosen at run time; each kind is its own branch-free loop.
#[inline(always)]
fn row_of(kind: u32, over: bool, row: &mut [f32], x0: usize, dy: f32, p: &Disc) {
    match (kind, over) {
        (0, false) => disc_row::<0, false>(row, x0, dy, p),
        (1, false) => disc_row::<1, false>(row, x0, dy, p),
        (2, false) => disc_row::<2, false>(row, x0, dy, p),
        (3, false) => disc_row::<3, false>(row, x0, dy, p),
        (4, false) => disc_row::<4, false>(row, x0, dy, p),
        (_, false) => disc_row::<5, false>(row, x0, dy, p),
        (0, true) => disc_row::<0, true>(row, x0, dy, p),
        (1, true) => disc_row::<1, true>(row, x0, dy, p),
        (2, true) => disc_row::<2, true>(row, x0, dy, p),
        (3, true) => disc_row::<3, true>(row, x0, dy, p),
        (4, true) => disc_row::<4, true>(row, x0, dy, p),
        (_, true) => disc_row::<5, true>(row, x0, dy, p),
    }
}

/// Draw a disc centred at (`p.cx`, `cy`) pixels into a `w` x `h` plane. Only the pixels within the
/// disc, and one more on each side, are visited: outside it the envelope is 0, so the plane would
/// be left as it is (0 on the first disc). A distractor thus costs its area, not the image's.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn draw(
    plane: &mut [f32],
    w: usize,
    h: usize,
    kind: u32,
    over: bool,
    p: &Disc,
    cy: f32,
    radius: f32,
) {
    let side = 1.0 / p.scale;
    let (y0, y1) = span(cy, radius * side + 1.0, h);
    for y in y0..y1 {
        let dy = (y as f32 + 0.5 - cy) * p.scale;
        let half = (p.r2 - dy * dy).max(0.0).sqrt() * side;
        let (x0, x1) = span(p.cx, half + 1.0, w);
        // Whole groups of 8 pixels, so that the vectorised loop has no scalar remainder.
        let (x0, x1) = (x0 & !7, ((x1 + 7) & !7).min(w));
        row_of(kind, over, &mut plane[y * w + x0..y * w + x1], x0, dy, p);
    }
}

/// `to_u8` with the clamp done on integers, where it vectorises to saturating packs (a third of
/// the render time went to packing bytes one lane at a time). The same bytes for `v` within
/// +-2^31: here |v| < 1000 (colours 0-255, intensities 0-1, noise under 50 x 2).
#[inline(always)]
fn to_u8_int(v: f32) -> u8 {
    // SAFETY: v + 0.5 is finite and far inside the i32 range (see above).
    let i = unsafe { (v + 0.5).to_int_unchecked::<i32>() };
    i.clamp(0, 255) as u8
}

/// The pixels `lo .. hi` (of `n`) whose centres lie within `reach` of `c`, and those next to them.
fn span(c: f32, reach: f32, n: usize) -> (usize, usize) {
    let lo = (c - reach).max(0.0) as usize;
    let hi = ((c + reach + 1.0).max(0.0) as usize).min(n);
    (lo.min(hi), hi)
}

fn luminance(v: [f32; 3]) -> f32 {
    0.299 * v[0] + 0.587 * v[1] + 0.114 * v[2]
}

/// A colour of hue `h` and saturation `s` whose luminance is `lum` (0-255): the full-value colour
/// darkened, or mixed with white where it is darker than `lum`.
fn colour(h: f32, s: f32, lum: f32) -> [f32; 3] {
    let base = super::generator::hsv(h, s, 1.0);
    let lb = luminance(base);
    if lum <= lb {
        base.map(|c| c * (lum / lb))
    } else {
        let t = (lum - lb) / (255.0 - lb).max(1e-3);
        base.map(|c| c + (255.0 - c) * t)
    }
}

/// Where disc `p`, of pattern `kind`, centred on row `cy`, of radius `radius`, lies.
#[inline(always)]
fn geom(kind: u32, p: &Disc, cy: f32, radius: f32) -> DiscGeom {
    DiscGeom {
        kind,
        cx: p.cx,
        cy,
        scale: p.scale,
        cos: p.cos,
        sin: p.sin,
        radius,
        r2: p.r2,
        edge: p.edge,
    }
}

/// Render one version-2 sample into `out` (C*H*W bytes) and return what it draws (its label
/// first).
#[inline(always)]
pub(super) fn render(
    g: &Generator,
    difficulty: f32,
    split: u64,
    index: u64,
    out: &mut [u8],
    scratch: &mut Vec<f32>,
) -> Scene {
    let shape = &g.spec.shape.0;
    let (c, h, w) = (shape[0] as usize, shape[1] as usize, shape[2] as usize);
    let plane = h * w;
    debug_assert_eq!(out.len(), c * plane);
    let k = Knobs::of(difficulty);
    let mut r: Rng = g.rng(split, index);
    let label = r.below(g.classes as u64) as u32;
    let class = &g.params[label as usize];
    let side = h.min(w) as f32;
    let scale = 1.0 / side;

    // The class's pattern, jittered; its disc placed and sized at random.
    let (sin, cos) = sin_cos(class.angle + r.sym(k.angle_jitter));
    let radius = 0.3 + 0.2 * r.unit();
    let r2 = radius * radius;
    let main = Disc {
        cx: w as f32 * (0.5 + r.sym(0.2)),
        scale,
        cos,
        sin,
        freq: class.freq * (1.0 + r.sym(k.freq_jitter)),
        phase: r.unit(),
        r2,
        edge: 1.0 / (0.35 * r2),
        level: 0.0,
        contrast: (0.65 + 0.35 * r.unit()) * k.contrast,
    };
    let cy = h as f32 * (0.5 + r.sym(0.2));
    scratch.clear();
    scratch.resize(plane, 0.0);
    draw(scratch, w, h, class.kind, false, &main, cy, radius);
    let mut scene = Scene {
        label,
        main: geom(class.kind, &main, cy, radius),
        ..Scene::default()
    };

    // Distractors: d on average (the integer part always, the fraction with that probability).
    let count = (k.distractors + r.unit()) as u32;
    for _ in 0..count {
        let kind = r.below(KINDS as u64) as u32;
        let (sin, cos) = sin_cos(r.unit() * PI);
        let radius = 0.12 + 0.12 * r.unit();
        let r2 = radius * radius;
        let contrast = main.contrast * (0.5 + 0.5 * r.unit());
        let d = Disc {
            cx: w as f32 * r.unit(),
            scale,
            cos,
            sin,
            freq: 2.0 + 2.5 * r.unit(),
            phase: r.unit(),
            r2,
            edge: 1.0 / (0.35 * r2),
            level: r.unit() * (1.0 - contrast),
            contrast,
        };
        let cy = h as f32 * r.unit();
        draw(scratch, w, h, kind, true, &d, cy, radius);
        if (scene.count as usize) < MAX_DISTRACTORS {
            scene.distractors[scene.count as usize] = geom(kind, &d, cy, radius);
            scene.count += 1;
        }
    }
    debug_assert_eq!(scene.count, count, "more distractors than a Scene holds");

    // Two colours from the distribution every class shares, a luminance gap apart, in random order.
    let lo = 255.0 * (0.05 + 0.45 * r.unit());
    let hi = lo + 255.0 * (0.25 + 0.25 * r.unit());
    let a = colour(r.unit(), 0.2 + 0.7 * r.unit(), lo);
    let b = colour(r.unit(), 0.2 + 0.7 * r.unit(), hi);
    let (fg, bg) = if r.unit() < 0.5 { (a, b) } else { (b, a) };

    let noise = noise_table();
    let gain = k.noise_gain;
    for ch in 0..c {
        let (f, b) = if c == 1 {
            (luminance(fg), luminance(bg))
        } else {
            (fg[ch % 3], bg[ch % 3])
        };
        let diff = f - b;
        let dst = &mut out[ch * plane..(ch + 1) * plane];
        let mut done = 0;
        while done < plane {
            let len = (plane - done).min(NOISE_LEN);
            let o = r.below(NOISE_LEN as u64) as usize;
            let nz = &noise[o..o + len];
            for ((d, &i), &n) in dst[done..done + len]
                .iter_mut()
                .zip(&scratch[done..done + len])
                .zip(nz)
            {
                *d = to_u8_int(b + diff * i + n * gain);
            }
            done += len;
        }
    }
    scene
}

#[cfg(test)]
mod tests {
    use super::super::generator::{split_id, Generator, Version};

    fn v2(shape: &str, classes: u32, seed: u64, difficulty: f64) -> Generator {
        let v = Version::V2 { difficulty };
        Generator::with_version(shape.parse().unwrap(), classes, seed, v).unwrap()
    }

    #[test]
    fn samples_are_pure_functions_of_seed_split_index_and_difficulty() {
        let g = v2("3x16x16", 10, 7, 0.5);
        let a = g.render_block(split_id("train"), 100, 5);
        assert_eq!(a, g.render_block(split_id("train"), 100, 5));
        let c = g.render_block(split_id("train"), 102, 1);
        assert_eq!((a.sample(2), a.label(2)), (c.sample(0), c.label(0)));
        assert_ne!(g.render_block(split_id("test"), 100, 5), a);
        assert_ne!(
            v2("3x16x16", 10, 8, 0.5).render_block(split_id("train"), 100, 5),
            a
        );
        // Other difficulties, and version 1 with the same seed, give other data.
        for d in [0.0, 0.49, 1.0] {
            assert_ne!(
                v2("3x16x16", 10, 7, d).render_block(split_id("train"), 100, 5),
                a
            );
        }
        let v1 = Generator::new("3x16x16".parse().unwrap(), 10, 7).unwrap();
        assert_ne!(v1.render_block(split_id("train"), 100, 5), a);
    }

    #[test]
    fn both_code_paths_give_identical_bytes() {
        for d in [0.0, 0.5, 1.0] {
            let g = v2("3x20x28", 12, 3, d);
            let mut scratch = Vec::new();
            for i in 0..200 {
                let mut a = vec![0u8; g.spec.bytes()];
                let mut b = a.clone();
                let la = g.render_scene(0, i, &mut a, &mut scratch);
                let lb = super::render(&g, d as f32, 0, i, &mut b, &mut scratch);
                assert_eq!((la, &a), (lb, &b), "difficulty {d}, sample {i}");
            }
        }
    }

    #[test]
    fn odd_shapes_and_one_channel_render() {
        // Distractor boxes clipped at every edge, images smaller than a distractor, grey images.
        for shape in ["1x8x8", "3x5x40", "4x33x7", "1x1x1"] {
            let g = v2(shape, 7, 0, 1.0);
            let b = g.render_block(0, 0, 300);
            assert!(b.labels().all(|l| l < 7));
        }
        let b = v2("1x16x16", 7, 0, 0.0).render_block(0, 0, 50);
        let px = b.sample(0);
        let (lo, hi) = (px.iter().min().unwrap(), px.iter().max().unwrap());
        assert!(hi - lo > 40, "sample 0 spans only {lo}..{hi}");
    }

    #[test]
    fn difficulty_outside_0_to_1_is_refused() {
        for d in [-0.1, 1.01, f64::NAN] {
            let v = Version::V2 { difficulty: d };
            assert!(Generator::with_version("3x8x8".parse().unwrap(), 10, 0, v).is_err());
        }
    }

    /// Per-class mean of each channel over `n` samples, in pixel levels.
    fn class_colour_means(g: &Generator, split: u64, n: usize) -> Vec<[f64; 3]> {
        let b = g.render_block(split, 0, n);
        let plane = g.spec.bytes() / 3;
        let mut sums = vec![[0f64; 3]; g.classes as usize];
        let mut counts = vec![0f64; g.classes as usize];
        for i in 0..b.len() {
            let l = b.label(i) as usize;
            counts[l] += 1.0;
            for (ch, px) in b.sample(i).chunks(plane).enumerate() {
                sums[l][ch] += px.iter().map(|&p| p as f64).sum::<f64>() / plane as f64;
            }
        }
        sums.iter()
            .zip(&counts)
            .map(|(s, &k)| s.map(|v| v / k))
            .collect()
    }

    /// The largest difference between two classes' mean of one channel.
    fn spread(means: &[[f64; 3]]) -> f64 {
        (0..3)
            .map(|ch| {
                let v = means.iter().map(|m| m[ch]);
                v.clone().fold(f64::MIN, f64::max) - v.fold(f64::MAX, f64::min)
            })
            .fold(0.0, f64::max)
    }

    #[test]
    fn colour_does_not_give_the_class_away() {
        let n = 20_000;
        let v1 = Generator::new("3x8x8".parse().unwrap(), 10, 1).unwrap();
        let (s1, s2) = (
            spread(&class_colour_means(&v1, 0, n)),
            spread(&class_colour_means(&v2("3x8x8", 10, 1, 0.5), 0, n)),
        );
        // Version 1's classes differ by tens of levels in mean colour (27 here); version 2's only
        // by the sampling error of 2,000 samples a class (a sample's channel mean varies by about
        // 55 levels, so about 1.2 levels for a class mean).
        assert!(
            s2 < 8.0 && s2 < s1 / 4.0,
            "class colour spread: v1 {s1:.1}, v2 {s2:.1}"
        );

        // A classifier that knows only a sample's mean colour does no better than chance in
        // version 2 (0.30 in version 1, whose dark backgrounds dilute the class colour).
        let accuracy = |g: &Generator| {
            let means = class_colour_means(g, 0, n);
            let test = g.render_block(1, 0, 2000);
            let plane = g.spec.bytes() / 3;
            let hits = (0..test.len())
                .filter(|&i| {
                    let c: Vec<f64> = test
                        .sample(i)
                        .chunks(plane)
                        .map(|px| px.iter().map(|&p| p as f64).sum::<f64>() / plane as f64)
                        .collect();
                    let dist = |m: &[f64; 3]| (0..3).map(|ch| (m[ch] - c[ch]).powi(2)).sum::<f64>();
                    let best = (0..means.len())
                        .min_by(|&a, &b| dist(&means[a]).total_cmp(&dist(&means[b])))
                        .unwrap();
                    best as u32 == test.label(i)
                })
                .count();
            hits as f64 / test.len() as f64
        };
        let (a1, a2) = (accuracy(&v1), accuracy(&v2("3x8x8", 10, 1, 0.5)));
        assert!(a1 > 0.2, "version 1 nearest mean colour: {a1}");
        assert!(
            a2 < 0.13,
            "version 2 nearest mean colour: {a2} (chance 0.1)"
        );
    }
}
