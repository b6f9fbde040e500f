//! One file per subcommand: check arguments, call the library, print the result.

mod convert;
mod eval;
mod inspect;
mod merge;
mod plan;
mod synth;
mod train;
mod verify;

use crate::cli::{Cli, CodecArg, Command, FormatArg, StoreArgs};
use prep::shard::Codec;
use prep::OutputFormat;
use std::process::ExitCode;

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let quiet = cli.quiet;
    // The long jobs stop cleanly on SIGINT and SIGTERM (`prep::interrupt`); plan and inspect,
    // which write at most one file atomically, keep the default action.
    if !matches!(cli.command, Command::Plan(_) | Command::Inspect(_)) {
        prep::interrupt::install()
            .map_err(|e| anyhow::anyhow!("cannot catch SIGINT and SIGTERM: {e}"))?;
    }
    match cli.command {
        Command::Synth(a) => synth::run(a, quiet),
        Command::Convert(a) => convert::run(a, quiet),
        Command::Train(a) => train::run(a, quiet),
        Command::Eval(a) => eval::run(a),
        Command::Inspect(a) => inspect::run(a, quiet),
        Command::Verify(a) => verify::run(a, quiet),
        Command::Plan(a) => plan::run(a),
        Command::Merge(a) => merge::run(a, quiet),
    }
}

impl StoreArgs {
    pub fn codec(&self) -> Codec {
        match self.codec {
            CodecArg::Zstd => Codec::Zstd { level: self.level },
            CodecArg::None => Codec::None,
        }
    }
    pub fn format(&self) -> OutputFormat {
        match self.format {
            FormatArg::Shards => OutputFormat::Shards,
            FormatArg::Colmajor => OutputFormat::Colmajor,
        }
    }
}

/// "1,234,567"
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes of `train + test` samples of `sample_bytes` each, refused as a usage error where the
/// product does not fit in 64 bits (e.g. `--train 1000000000000 --shape 4x16384x16384`).
pub fn dataset_bytes(
    train: u64,
    test: u64,
    sample_bytes: u64,
    shape: &prep::shard::Shape,
) -> Result<u64, UsageError> {
    train
        .checked_add(test)
        .and_then(|n| n.checked_mul(sample_bytes))
        .ok_or_else(|| {
            UsageError(format!(
                "--train {train} --test {test} of {shape} samples ({sample_bytes} bytes each) \
                 is more than 2^64 bytes; ask for fewer or smaller samples"
            ))
        })
}

/// A flag value that does not parse: exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);
