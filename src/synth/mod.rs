//! `prep synth`: the procedural generator and the job that writes its samples as a dataset.

mod generator;
mod job;
mod pattern_only;
mod render;

pub use generator::{split_id, Generator, Version, DEFAULT_DIFFICULTY};
#[cfg(test)]
pub use job::test_dataset;
pub use job::{clean, dir_bytes, synthesize, SynthOptions, SynthReport, PARTIAL_MARKER};
