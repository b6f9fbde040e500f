//! `prep`: generate, convert, verify and stream image datasets as compact checksummed shards, and
//! train a CNN on them. The binary's subcommands are thin layers over this library.

pub mod convert;
pub mod dist;
pub mod format;
pub mod nn;
pub mod source;
pub mod store;
pub mod synth;
pub mod train;
pub mod util;

pub use format::{dataset_format, OutputFormat};
pub use util::command_args;
pub use util::error::{Error, Result};
