//! What every room uses: typed errors, signals, progress bars, memory figures, the ordered
//! bounded pipeline, the bitmap font. Imports nothing else of the crate.

pub mod error;
pub mod font;
pub mod interrupt;
pub mod mem;
pub mod pipeline;
pub mod progress;

/// This process's command line as text, for a manifest's `provenance.command` and a lock file:
/// an argument that is not UTF-8 (a path: Linux allows any bytes) has its bad bytes replaced by
/// U+FFFD rather than stopping the run (`std::env::args` would panic on it).
pub fn command_args() -> Vec<String> {
    std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}
