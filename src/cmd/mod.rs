//! One file per subcommand: check arguments, call the library, print the result.

mod convert;
mod eval;
mod inspect;
mod merge;
mod paths;
mod plan;
mod remote_out;
mod synth;
mod train;
mod verify;

use crate::cli::{Cli, CodecArg, Command, FormatArg, StoreArgs};
use prep::format::shard::Codec;
use prep::OutputFormat;
use std::process::ExitCode;

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let quiet = cli.quiet;
    // The long jobs stop cleanly on SIGINT and SIGTERM (`prep::util::interrupt`); plan and inspect,
    // which write at most one file atomically, keep the default action.
    if !matches!(cli.command, Command::Plan(_) | Command::Inspect(_)) {
        prep::util::interrupt::install()
            .map_err(|e| anyhow::anyhow!("cannot catch SIGINT and SIGTERM: {e}"))?;
    }
    prep::util::mem::no_huge_pages();
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
    pub fn codec(&self) -> anyhow::Result<Codec> {
        if self.quality.is_some() && !matches!(self.codec, CodecArg::Jpeg) {
            anyhow::bail!(UsageError(
                "--quality is the quality of --codec jpeg".into()
            ));
        }
        Ok(match self.codec {
            CodecArg::Zstd => Codec::Zstd { level: self.level },
            CodecArg::Pred => Codec::Pred { level: self.level },
            CodecArg::Jpeg => Codec::Jpeg {
                quality: self.quality.unwrap_or(90),
            },
            CodecArg::None => Codec::None,
        })
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
    shape: &prep::format::shard::Shape,
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

/// Print a line on stdout (as `println!`, whose panic on a closed pipe this avoids): a reader
/// that has gone ends the process as [`pipe_closed`] says; another write error is an error.
macro_rules! outln {
    () => {
        $crate::cmd::out(format_args!(""))?
    };
    ($($t:tt)*) => {
        $crate::cmd::out(format_args!($($t)*))?
    };
}
pub(crate) use outln;

pub fn out(args: std::fmt::Arguments) -> anyhow::Result<()> {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    match o.write_fmt(args).and_then(|()| o.write_all(b"\n")) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => pipe_closed(),
        r => r.map_err(|e| anyhow::anyhow!("writing to standard output: {e}")),
    }
}

/// The reader of stdout (or stderr) went away, as `prep inspect DS | head -4` does: end as Unix
/// tools do, killed by SIGPIPE (status 141 in a shell), without a message. Rust ignores SIGPIPE
/// for the whole process, and it stays ignored until here: the rendezvous sockets of `train`
/// (`prep::dist`) then get EPIPE back rather than a signal.
pub fn pipe_closed() -> ! {
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(libc::SIGPIPE);
    }
    std::process::exit(141)
}

/// `println!` and `eprintln!` anywhere (the library logs epochs and notes on stderr) panic when
/// their pipe is closed: that panic ends the process as [`pipe_closed`] does, and any other
/// panic is reported as before.
pub fn end_quietly_on_closed_pipes() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let p = info.payload();
        let msg = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to std")
            && (msg.contains("os error 32") || msg.contains("Broken pipe"))
        {
            pipe_closed();
        }
        default(info)
    }));
}

/// A flag value that does not parse: exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// A command's JSON report, with what its upload did where it wrote to a store (`upload`).
fn with_upload<T: serde::Serialize>(
    r: &T,
    published: &Option<prep::format::publish::Published>,
) -> anyhow::Result<String> {
    let mut v = serde_json::to_value(r)?;
    if let (Some(p), Some(o)) = (published, v.as_object_mut()) {
        o.insert("upload".into(), serde_json::to_value(p)?);
    }
    Ok(serde_json::to_string_pretty(&v)?)
}

/// One line of what an upload did, where there was one.
fn print_upload(published: &Option<prep::format::publish::Published>) -> anyhow::Result<()> {
    if let Some(p) = published {
        outln!(
            "uploaded {} shards and the manifest ({}){}",
            p.shards_uploaded,
            prep::util::mem::human(p.bytes_uploaded),
            if p.shards_kept > 0 {
                format!("; {} shards were in the store already", p.shards_kept)
            } else {
                String::new()
            }
        );
    }
    Ok(())
}
