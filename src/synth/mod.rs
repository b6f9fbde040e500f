//! `prep synth`: the procedural generator and the job that writes its samples as a dataset.

mod generator;
mod job;

pub use generator::{split_id, Generator};
pub use job::{synthesize, SynthOptions, SynthReport};
