//! `prep synth --task`: what a sample carries beside its image and class. The image and the class
//! are the same for every task (the same parameters give the same pixels); a task other than
//! `class` adds one field (`formats/shard.md`, "Fields") computed from the sample's `Scene`, the
//! geometry the renderer drew, so it is a pure function of (seed, split, index) like the image.
//!
//! - `mask`: field `mask`, the image's H x W, u8 (u16 from 256 classes on), names `background`
//!   then the class names: a pixel is `class + 1` where the main disc's envelope is at least 0.5
//!   and no distractor's is (a distractor with envelope >= 0.5 shows more of itself than of what
//!   it covers), else 0. The envelope is the renderer's own f32 arithmetic.
//! - `labels`: field `labels`, K-hot over the 6 pattern kinds (`stripes`, `checks`, ...): the main
//!   disc's kind and every distractor's kind (distractors come with `--difficulty`; without any,
//!   one label is set).
//! - `values`: field `values`, [`area`, `distractors`]: the share of the image's pixels where the
//!   main disc's envelope is at least 0.5 (the mask's disc before occlusion, clipped at the
//!   image's edges), and how many distractor discs were drawn.

use super::generator::{DiscGeom, Generator, Scene, KINDS, KIND_NAMES};
use crate::format::fields::{Field, Fields};
use crate::format::shard::{Block, Dtype};
use crate::util::error::{Error, Result};

/// What `prep synth` writes beside each image and class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Task {
    /// The class alone (no fields): the datasets of every prep before tasks existed.
    #[default]
    Class,
    /// A segmentation mask of where the class's pattern shows.
    Mask,
    /// K-hot over the pattern kinds drawn.
    Labels,
    /// The main disc's area and the number of distractors.
    Values,
}

/// A mask pixel is the class's where the main disc's envelope reaches this and no distractor's does.
pub const MASK_THRESHOLD: f32 = 0.5;

impl Task {
    pub fn name(self) -> &'static str {
        match self {
            Task::Class => "class",
            Task::Mask => "mask",
            Task::Labels => "labels",
            Task::Values => "values",
        }
    }

    /// The fields a dataset of this task declares for generator `g` (none for `class`).
    pub fn fields(self, g: &Generator) -> Result<Fields> {
        let f = match self {
            Task::Class => return Ok(Fields::default()),
            Task::Mask => {
                let names: Vec<String> = std::iter::once("background".to_string())
                    .chain(g.class_names())
                    .collect();
                if names.len() > crate::format::fields::MAX_NAMES {
                    return Err(Error::Invalid(format!(
                        "--task mask names background and each class: at most {} classes, got {}",
                        crate::format::fields::MAX_NAMES - 1,
                        g.classes
                    )));
                }
                let dtype = if names.len() <= 256 {
                    Dtype::U8
                } else {
                    Dtype::U16
                };
                Field::mask("mask", &g.spec.shape.0, dtype, names)
            }
            Task::Labels => {
                Field::labels("labels", KIND_NAMES.iter().map(|s| s.to_string()).collect())
            }
            Task::Values => Field::values("values", vec!["area".into(), "distractors".into()]),
        };
        Ok(Fields(vec![f]))
    }

    /// Write this task's field of the sample that drew `scene` into `out` (its bytes, as
    /// `fields` declares them). `scratch` is reused between calls.
    #[inline(always)]
    fn write(
        self,
        g: &Generator,
        fields: &Fields,
        scene: &Scene,
        out: &mut [u8],
        scratch: &mut Scratch,
    ) {
        let shape = &g.spec.shape.0;
        let (h, w) = (shape[1] as usize, shape[2] as usize);
        match self {
            Task::Class => {}
            Task::Mask => {
                let value = scene.label + 1;
                if fields.0[0].dtype == Dtype::U8 {
                    shown(scene, h, w, out, &mut scratch.dx);
                    out.iter_mut().for_each(|v| *v *= value as u8);
                } else {
                    scratch.plane.resize(h * w, 0);
                    shown(scene, h, w, &mut scratch.plane, &mut scratch.dx);
                    let v = (value as u16).to_le_bytes();
                    for (o, &m) in out.chunks_exact_mut(2).zip(&scratch.plane) {
                        o.copy_from_slice(&[v[0] * m, v[1] * m]);
                    }
                }
            }
            Task::Labels => {
                out.fill(0);
                out[scene.main.kind as usize] = 1;
                for d in scene.distractors() {
                    out[d.kind as usize] = 1;
                }
            }
            Task::Values => {
                scratch.plane.resize(h * w, 0);
                let v = [
                    area_in(scene, h, w, &mut scratch.plane, &mut scratch.dx),
                    scene.count as f32,
                ];
                for (o, v) in out.chunks_exact_mut(4).zip(v) {
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
        }
    }
}

/// Buffers reused from sample to sample.
#[derive(Default)]
struct Scratch {
    dx: Vec<f32>,
    plane: Vec<u8>,
}

/// Set `out[y * w + x]` to `set` where disc `d`'s envelope is at least `MASK_THRESHOLD`, leaving
/// every other pixel as it is. Only the rows and columns within the disc's radius (and a pixel
/// more) are visited: beyond them its envelope is 0. `dx` holds each column's horizontal offset,
/// computed as the renderer computes it.
#[inline(always)]
fn paint(d: &DiscGeom, h: usize, w: usize, out: &mut [u8], set: u8, dx: &mut Vec<f32>) {
    dx.clear();
    dx.extend((0..w).map(|x| (x as f32 + 0.5 - d.cx) * d.scale));
    let side = 1.0 / d.scale;
    let (y0, y1) = span(d.cy, d.radius * side + 1.0, h);
    for y in y0..y1 {
        let dy = d.dy(y);
        let half = (d.r2 - dy * dy).max(0.0).sqrt() * side;
        let (x0, x1) = span(d.cx, half + 1.0, w);
        // Whole groups of 8 pixels, so that the vectorised loop has no scalar remainder (the
        // pixels added lie outside the disc: the envelope leaves them as they are).
        let (x0, x1) = (x0 & !7, ((x1 + 7) & !7).min(w));
        let row = &mut out[y * w + x0..y * w + x1];
        for (px, &dx) in row.iter_mut().zip(&dx[x0..x1]) {
            // The renderer's envelope, operation for operation (`DiscGeom::envelope`).
            let u = dx * d.cos + dy * d.sin;
            let v = dy * d.cos - dx * d.sin;
            let d2 = u * u + v * v;
            let e = ((d.r2 - d2) * d.edge).clamp(0.0, 1.0);
            *px = if e >= MASK_THRESHOLD { set } else { *px };
        }
    }
}

/// The pixels `lo .. hi` (of `n`) whose centres lie within `reach` pixels of `c`, and those next
/// to them.
fn span(c: f32, reach: f32, n: usize) -> (usize, usize) {
    let lo = (c - reach).max(0.0) as usize;
    let hi = ((c + reach + 1.0).max(0.0) as usize).min(n);
    (lo.min(hi), hi)
}

/// 1 where `scene`'s class pattern shows in the `h` x `w` image, else 0: where the main disc's
/// envelope is at least `MASK_THRESHOLD` and no distractor's is.
#[inline(always)]
fn shown(scene: &Scene, h: usize, w: usize, out: &mut [u8], dx: &mut Vec<f32>) {
    out.fill(0);
    paint(&scene.main, h, w, out, 1, dx);
    for d in scene.distractors() {
        paint(d, h, w, out, 0, dx);
    }
}

/// `area`, with `plane` (h x w bytes) and `dx` as buffers.
#[inline(always)]
fn area_in(scene: &Scene, h: usize, w: usize, plane: &mut [u8], dx: &mut Vec<f32>) -> f32 {
    plane.fill(0);
    paint(&scene.main, h, w, plane, 1, dx);
    let covered: usize = plane.iter().map(|&b| b as usize).sum();
    (covered as f64 / (h * w).max(1) as f64) as f32
}

/// Pixels of the `h` x `w` image where `scene`'s class pattern shows: `value`, elsewhere 0.
pub fn mask(scene: &Scene, h: usize, w: usize, value: u8, out: &mut [u8]) {
    shown(scene, h, w, out, &mut Vec::new());
    out.iter_mut().for_each(|v| *v *= value);
}

/// The share of the `h` x `w` image's pixels where the main disc's envelope is at least 0.5
/// (clipped at the image's edges; distractors not taken off).
pub fn area(scene: &Scene, h: usize, w: usize) -> f32 {
    area_in(scene, h, w, &mut vec![0; h * w], &mut Vec::new())
}

/// Each pixel's envelope computed over the whole image by `DiscGeom::envelope`: what `paint`
/// must agree with (a test checks it).
#[cfg(test)]
fn mask_by_envelope(scene: &Scene, h: usize, w: usize) -> Vec<u8> {
    let mut out = vec![0u8; h * w];
    for y in 0..h {
        for x in 0..w {
            let on = |d: &DiscGeom| d.envelope(x, d.dy(y)) >= MASK_THRESHOLD;
            out[y * w + x] = (on(&scene.main) && !scene.distractors().iter().any(on)) as u8;
        }
    }
    out
}

impl Generator {
    /// Render samples `start .. start + n` of a split as one block carrying `task`'s field
    /// (`fields`, from `task.fields(self)`). `Task::Class` is `render_block`.
    pub fn render_task_block(
        &self,
        task: Task,
        fields: &Fields,
        split: u64,
        start: u64,
        n: usize,
    ) -> Block {
        if task == Task::Class {
            return self.render_block(split, start, n);
        }
        let mut block = Block::with_fields(n, self.spec.bytes(), fields.bytes());
        let (mut scratch, mut buffers) = (Vec::new(), Scratch::default());
        for i in 0..n {
            let scene =
                self.render_scene(split, start + i as u64, block.sample_mut(i), &mut scratch);
            block.set_label(i, scene.label);
            let out = block.field_mut(fields, 0, i);
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU supports AVX2 (checked just above).
                unsafe { write_avx2(task, self, fields, &scene, out, &mut buffers) };
                continue;
            }
            task.write(self, fields, &scene, out, &mut buffers);
        }
        block
    }
}

/// `Task::write` compiled for AVX2, like the renderer: IEEE-exact operations only, so the same
/// bytes as the baseline build.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn write_avx2(
    task: Task,
    g: &Generator,
    fields: &Fields,
    scene: &Scene,
    out: &mut [u8],
    scratch: &mut Scratch,
) {
    task.write(g, fields, scene, out, scratch)
}

const _: () = assert!(KIND_NAMES.len() == KINDS as usize);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{split_id, Version};

    fn v2(shape: &str, classes: u32, d: f64) -> Generator {
        let v = Version::V2 { difficulty: d };
        Generator::with_version(shape.parse().unwrap(), classes, 3, v).unwrap()
    }

    #[test]
    fn class_task_is_render_block() {
        let g = v2("3x16x16", 10, 0.5);
        let f = Task::Class.fields(&g).unwrap();
        assert!(f.is_empty());
        assert_eq!(
            g.render_task_block(Task::Class, &f, 7, 100, 20),
            g.render_block(7, 100, 20)
        );
    }

    #[test]
    fn every_task_has_the_class_tasks_pixels_and_labels() {
        for g in [
            v2("3x16x20", 10, 0.5),
            v2("1x9x9", 3, 1.0),
            Generator::new("3x16x16".parse().unwrap(), 12, 1).unwrap(),
        ] {
            let plain = g.render_block(split_id("train"), 50, 40);
            for task in [Task::Mask, Task::Labels, Task::Values] {
                let f = task.fields(&g).unwrap();
                let b = g.render_task_block(task, &f, split_id("train"), 50, 40);
                assert_eq!(b.pixels(), plain.pixels(), "{task:?}");
                assert!(b.labels().eq(plain.labels()), "{task:?}");
                assert!(f.first_bad(b.fields(), b.len()).is_none(), "{task:?}");
            }
        }
    }

    #[test]
    fn mask_marks_the_main_disc_less_distractors() {
        // Difficulty 0.5: every other sample or so has a distractor.
        let g = v2("3x24x24", 10, 0.5);
        let mut scratch = Vec::new();
        let mut px = vec![0u8; g.spec.bytes()];
        let (mut occluded, mut plain) = (0, 0);
        for i in 0..200 {
            let s = g.render_scene(0, i, &mut px, &mut scratch);
            let mut m = vec![0u8; 24 * 24];
            mask(&s, 24, 24, s.label as u8 + 1, &mut m);
            let shown = m.iter().filter(|&&v| v != 0).count();
            let a = area(&s, 24, 24);
            assert!(m.iter().all(|&v| v == 0 || v as u32 == s.label + 1));
            // The disc's radius is 0.3 to 0.5 of the side; its 0.5 envelope about 0.9 of that.
            assert!(a > 0.15 && a < 0.7, "sample {i}: area {a}");
            let covered = (a as f64 * 576.0).round() as usize;
            if s.count == 0 {
                assert_eq!(shown, covered, "sample {i}");
                plain += 1;
            } else {
                assert!(shown <= covered, "sample {i}");
                occluded += (shown < covered) as usize;
            }
            // Nothing is marked beyond the disc's radius.
            for y in 0..24 {
                for x in 0..24 {
                    let (dx, dy) = (x as f32 + 0.5 - s.main.cx, y as f32 + 0.5 - s.main.cy);
                    let r = s.main.radius * 24.0;
                    if dx * dx + dy * dy > r * r {
                        assert_eq!(m[y * 24 + x], 0, "sample {i} ({x}, {y})");
                    }
                }
            }
        }
        assert!(plain > 30 && occluded > 30, "{plain} {occluded}");
    }

    #[test]
    fn the_mask_is_each_pixels_envelope_and_both_code_paths_agree() {
        // Discs clipped at every edge, images smaller than a disc, distractors on every sample.
        for (shape, d) in [
            ("3x24x24", 0.5),
            ("1x8x8", 1.0),
            ("3x5x40", 1.0),
            ("4x33x7", 0.7),
            ("1x1x1", 1.0),
        ] {
            let g = v2(shape, 7, d);
            let (h, w) = (g.spec.shape.0[1] as usize, g.spec.shape.0[2] as usize);
            let mut scratch = Vec::new();
            let mut px = vec![0u8; g.spec.bytes()];
            for task in [Task::Mask, Task::Values] {
                let f = task.fields(&g).unwrap();
                let b = g.render_task_block(task, &f, 0, 0, 300);
                let mut buffers = Scratch::default();
                for i in 0..300 {
                    let s = g.render_scene(0, i as u64, &mut px, &mut scratch);
                    // The baseline build of `write`; the block took the AVX2 one where it can.
                    let mut out = vec![0u8; f.bytes()];
                    task.write(&g, &f, &s, &mut out, &mut buffers);
                    assert_eq!(b.field(&f, 0, i), &out[..], "{shape} {task:?} sample {i}");
                    let m = mask_by_envelope(&s, h, w);
                    if task == Task::Mask {
                        let want: Vec<u8> = m.iter().map(|&v| v * (s.label as u8 + 1)).collect();
                        assert_eq!(out, want, "{shape} sample {i}");
                    } else {
                        let main = Scene { count: 0, ..s };
                        let n = mask_by_envelope(&main, h, w)
                            .iter()
                            .filter(|&&v| v == 1)
                            .count();
                        let a = f32::from_le_bytes(out[..4].try_into().unwrap());
                        assert_eq!(a, (n as f64 / (h * w) as f64) as f32, "{shape} sample {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn many_classes_make_a_u16_mask_and_too_many_are_refused() {
        let g = v2("1x8x8", 300, 0.5);
        let f = Task::Mask.fields(&g).unwrap();
        assert_eq!(f.0[0].dtype, Dtype::U16);
        assert_eq!(f.0[0].names.len(), 301);
        let b = g.render_task_block(Task::Mask, &f, 0, 0, 50);
        assert!(f.first_bad(b.fields(), 50).is_none());
        for i in 0..50 {
            let m = b.field(&f, 0, i);
            let want = b.label(i) as u16 + 1;
            let m: Vec<u16> = m
                .chunks(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect();
            assert!(m.iter().all(|&v| v == 0 || v == want), "sample {i}: {m:?}");
            assert!(m.contains(&want), "sample {i}: {m:?}");
        }
        let g = v2("1x8x8", 65536, 0.5);
        assert!(Task::Mask.fields(&g).is_err());
        assert!(Task::Labels.fields(&g).is_ok());
    }
}
