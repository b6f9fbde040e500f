//! `prep` entry point: parse arguments, run the subcommand, map failures to exit codes
//! (0 success, 1 runtime failure, 2 usage error).

mod cli;
mod cmd;

use clap::Parser;

/// Block buffers of a few MiB are allocated and freed at a high rate; mimalloc reuses them where
/// the system allocator returns them to the kernel and faults them back in (measured: ~15% of synth time).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
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
        Ok(code) => code,
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
                return ExitCode::from(prep::interrupt::exit_status(s) as u8);
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
