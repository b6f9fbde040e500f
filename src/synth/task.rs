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

use super::generator::{Generator, Scene, KINDS, KIND_NAMES};
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
    /// `fields` declares them).
    fn write(self, g: &Generator, fields: &Fields, scene: &Scene, out: &mut [u8]) {
        let shape = &g.spec.shape.0;
        let (h, w) = (shape[1] as usize, shape[2] as usize);
        match self {
            Task::Class => {}
            Task::Mask => {
                let value = scene.label + 1;
                if fields.0[0].dtype == Dtype::U8 {
                    mask(scene, h, w, value as u8, out);
                } else {
                    let mut m = vec![0u16; h * w];
                    mask(scene, h, w, value as u16, &mut m);
                    for (o, v) in out.chunks_exact_mut(2).zip(m) {
                        o.copy_from_slice(&v.to_le_bytes());
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
                let v = [area(scene, h, w), scene.count as f32];
                for (o, v) in out.chunks_exact_mut(4).zip(v) {
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
        }
    }
}

/// Pixels of the `h` x `w` image where `scene`'s class pattern shows: `value`, elsewhere 0.
pub fn mask<T: Copy + Default>(scene: &Scene, h: usize, w: usize, value: T, out: &mut [T]) {
    debug_assert_eq!(out.len(), h * w);
    let main = &scene.main;
    for (y, row) in out.chunks_exact_mut(w.max(1)).enumerate().take(h) {
        let dy = main.dy(y);
        for (x, px) in row.iter_mut().enumerate() {
            *px = if main.envelope(x, dy) >= MASK_THRESHOLD {
                value
            } else {
                T::default()
            };
        }
        for d in scene.distractors() {
            let dy = d.dy(y);
            for (x, px) in row.iter_mut().enumerate() {
                if d.envelope(x, dy) >= MASK_THRESHOLD {
                    *px = T::default();
                }
            }
        }
    }
}

/// The share of the `h` x `w` image's pixels where the main disc's envelope is at least 0.5.
pub fn area(scene: &Scene, h: usize, w: usize) -> f32 {
    let main = &scene.main;
    let mut covered = 0u64;
    for y in 0..h {
        let dy = main.dy(y);
        covered += (0..w)
            .filter(|&x| main.envelope(x, dy) >= MASK_THRESHOLD)
            .count() as u64;
    }
    (covered as f64 / (h * w).max(1) as f64) as f32
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
        let mut scratch = Vec::new();
        for i in 0..n {
            let scene =
                self.render_scene(split, start + i as u64, block.sample_mut(i), &mut scratch);
            block.set_label(i, scene.label);
            task.write(self, fields, &scene, block.field_mut(fields, 0, i));
        }
        block
    }
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
