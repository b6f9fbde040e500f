//! Command-line arguments (clap). Validation of meaning happens in `cmd/`.

use clap::{Args, Parser, Subcommand, ValueEnum};
use prep::shard::Shape;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "prep",
    version,
    about = "Generate, convert, check and stream image datasets as compact checksummed shards."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Hide progress bars and the summary line.
    #[arg(long, short, global = true)]
    pub quiet: bool,
    /// Worker threads (default: one per core).
    #[arg(long, short, global = true, value_name = "N")]
    pub jobs: Option<usize>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Generate a learnable synthetic image dataset of any size.
    Synth(SynthArgs),
    /// Show what a dataset holds; optionally draw a grid of samples per class.
    Inspect(InspectArgs),
    /// Read and check every block of every shard and the manifest.
    Verify(VerifyArgs),
    /// Estimate disk, host RAM, GPU memory and time for a dataset before making it.
    Plan(PlanArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum FormatArg {
    Shards,
    Colmajor,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum CodecArg {
    Zstd,
    None,
}

#[derive(Args, Debug)]
pub struct SynthArgs {
    /// Training samples.
    #[arg(long, value_name = "N")]
    pub train: u64,
    /// Test samples.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub test: u64,
    /// Sample shape, channels first.
    #[arg(long, value_name = "CxHxW", default_value = "3x32x32")]
    pub shape: Shape,
    /// Number of classes.
    #[arg(long, value_name = "K", default_value_t = 10)]
    pub classes: u32,
    /// Seed: every sample is a pure function of (seed, split, index).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output directory.
    #[arg(long, short, value_name = "DIR", default_value = "shards")]
    pub out: PathBuf,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Replace a different dataset already in --out.
    #[arg(long)]
    pub force: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// How a dataset is stored; shared by the commands that write one.
#[derive(Args, Debug)]
pub struct StoreArgs {
    /// Shard files, or the float32 column-major layout.
    #[arg(long, value_enum, default_value = "shards")]
    pub format: FormatArg,
    /// Block compression.
    #[arg(long, value_enum, default_value = "zstd")]
    pub codec: CodecArg,
    /// zstd level (1 = fastest; 19 = smallest).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..=22))]
    pub level: i32,
    /// Samples per block (default: about 4 MiB of pixels, a power of two).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub block_samples: Option<u32>,
    /// Blocks per shard file (default: about 256 MiB of pixels).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub shard_blocks: Option<u32>,
}

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// Dataset directory.
    pub dir: PathBuf,
    /// Write a PNG with a row of samples for every class.
    #[arg(long, value_name = "FILE.png")]
    pub grid: Option<PathBuf>,
    /// Samples per class in the grid.
    #[arg(long, value_name = "N", default_value_t = 12)]
    pub per_class: usize,
    /// Split the grid takes samples from.
    #[arg(long, default_value = "train")]
    pub split: String,
    /// Pixel zoom of the grid (default: enough for about 64 pixels per sample).
    #[arg(long, value_name = "N")]
    pub zoom: Option<u32>,
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// Dataset directory.
    pub dir: PathBuf,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Training samples.
    #[arg(long, value_name = "N")]
    pub train: u64,
    /// Test samples.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub test: u64,
    /// Sample shape, channels first.
    #[arg(long, value_name = "CxHxW", default_value = "3x32x32")]
    pub shape: Shape,
    /// Pixel type on disk.
    #[arg(long, value_enum, default_value = "u8")]
    pub dtype: DtypeArg,
    /// Training batch size.
    #[arg(long, default_value_t = 512)]
    pub batch: u64,
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DtypeArg {
    U8,
    U16,
}
