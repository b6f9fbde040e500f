//! SIGINT and SIGTERM as a request to stop (issue 14).
//!
//! `install` (called by the CLI before a long job) turns the first of these signals into a flag;
//! the long loops (`crate::util::pipeline::ordered_map` and its workers, the training step, verify,
//! the copies of merge and the column-major writers) call `check` between units of work of a
//! few milliseconds and return `Error::Interrupted`, so that the job unwinds like any failed job:
//! temporary files and staging folders are removed on the way out, the lock is released, and
//! what was complete before (finished shards, the last checkpoint, an older dataset) stays. A
//! second signal ends the process at once (exit 130 or 143), leaving what a SIGKILL would:
//! only what a rerun cleans up.
//!
//! Without `install` (the library used from Python, the tests) the flag is never set and
//! signals keep their default action.
//!
//! Test-only: `PREP_TEST_SLOW_MS=N` makes every look at the flag wait N ms first, so that a test
//! can signal a job in the middle of its work whatever the speed of the machine.

use crate::util::error::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The first signal received (0: none).
static SIGNAL: AtomicUsize = AtomicUsize::new(0);
/// Set by the first signal: a second one then exits at once.
static ARMED: AtomicBool = AtomicBool::new(false);

/// Catch SIGINT and SIGTERM for the rest of the process.
pub fn install() -> std::io::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    use signal_hook::flag;
    for sig in [SIGINT, SIGTERM] {
        // The exit must be registered before the flag is set: on the first signal it finds the
        // flag still down and does nothing.
        flag::register_conditional_shutdown(sig, exit_status(sig), &ARMED)?;
        flag::register_usize(sig, &SIGNAL, sig as usize)?;
        flag::register(sig, &ARMED)?;
    }
    Ok(())
}

/// The signal that asked the job to stop, if one did.
pub fn requested() -> Option<i32> {
    static SLOW: OnceLock<u64> = OnceLock::new();
    let ms = *SLOW.get_or_init(|| {
        std::env::var("PREP_TEST_SLOW_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    });
    if ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(ms.min(10_000)));
    }
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s as i32),
    }
}

/// `Err(Error::Interrupted)` once a signal asked the job to stop.
pub fn check() -> Result<()> {
    match requested() {
        None => Ok(()),
        Some(signal) => Err(Error::Interrupted {
            signal,
            note: String::new(),
        }),
    }
}

/// The shell's status for a process ended by `signal`: 128 + its number (130 SIGINT, 143
/// SIGTERM).
pub fn exit_status(signal: i32) -> i32 {
    128 + signal
}

pub use crate::util::error::signal_name;
