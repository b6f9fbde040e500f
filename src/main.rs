//! `prep` entry point: parse arguments, run the subcommand, map failures to exit codes
//! (0 success, 1 runtime failure, 2 usage error).

mod cli;
mod cmd;
mod parse;

use clap::{CommandFactory, FromArgMatches};

/// Block buffers of a few MiB are allocated and freed at a high rate; mimalloc reuses them where
/// the system allocator returns them to the kernel and faults them back in (measured: ~15% of synth time).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

/// The ids of the flags of a subcommand that were given on the command line (not defaults).
fn given(m: &clap::ArgMatches) -> Vec<String> {
    m.ids()
        .filter(|id| m.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine))
        .map(|id| id.to_string())
        .collect()
}

fn main() -> ExitCode {
    cmd::end_quietly_on_closed_pipes();
    let matches = cli::Cli::command().get_matches();
    let mut cli = cli::Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match (&mut cli.command, matches.subcommand()) {
        (cli::Command::Train(a), Some((_, m))) => a.given = given(m),
        (cli::Command::Convert(a), Some((_, m))) => a.given = given(m),
        _ => {}
    }
    if let Some(n) = cli.jobs {
        if let Err(e) = rayon::ThreadPoolBuilder::new()
            .num_threads(n.max(1))
            .build_global()
        {
            eprintln!("error: could not start {n} worker threads: {e}");
            return ExitCode::from(1);
        }
    }
    match cmd::run(cli) {
        Ok(code) => {
            prep::train::timing::mark("exit");
            code
        }
        Err(e) => {
            // A job stopped by SIGINT or SIGTERM: the line says what was kept and how to go on;
            // the status is the shell's for that signal.
            let signal = e
                .chain()
                .find_map(|c| match c.downcast_ref::<prep::Error>() {
                    Some(prep::Error::Interrupted { signal, .. }) => Some(*signal),
                    _ => None,
                });
            if let Some(s) = signal {
                eprintln!("{e:#}");
                return ExitCode::from(prep::util::interrupt::exit_status(s) as u8);
            }
            // One write: the ranks of `train --gpus` share a stderr, and a line written in
            // pieces would interleave with another rank's.
            let line = format!("error: {e:#}\n");
            let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
            let usage = e.chain().any(|c| {
                matches!(
                    c.downcast_ref::<prep::Error>(),
                    Some(prep::Error::Invalid(_))
                ) || c.is::<cmd::UsageError>()
            });
            ExitCode::from(if usage { 2 } else { 1 })
        }
    }
}
