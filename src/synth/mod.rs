//! `prep synth`: the procedural generator and the job that writes its samples as a dataset.

mod generator;
mod held;
mod job;
mod pattern_only;
mod render;
mod task;

pub use generator::{
    split_id, DiscGeom, Generator, Scene, Version, DEFAULT_DIFFICULTY, KIND_NAMES,
};
pub use held::held_by_store;
#[cfg(test)]
pub use job::test_dataset;
pub use job::{
    clean, dir_bytes, synthesize, synthesize_task, SynthOptions, SynthReport, PARTIAL_MARKER,
};
pub use task::{area, mask, Task, MASK_THRESHOLD};
