//! Progress bars for long jobs: throughput and ETA on a terminal, nothing when stderr is not one
//! (logs and CI stay clean) or when `--quiet` is given.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressStyle};
use std::io::IsTerminal;

/// A bar counting `unit`s (e.g. "samples") up to `len`.
pub fn bar(len: u64, what: &str, unit: &str, quiet: bool) -> ProgressBar {
    // Cleared when dropped unfinished too (a failure, an interruption): the error line then
    // stands alone.
    let pb = ProgressBar::with_draw_target(Some(len), target(quiet))
        .with_finish(ProgressFinish::AndClear);
    pb.set_style(
        ProgressStyle::with_template(&format!(
            "{{msg:>8}} [{{bar:30}}] {{human_pos}}/{{human_len}} {unit} {{per_sec}} ETA {{eta}}"
        ))
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// A bar counting bytes up to `len`.
pub fn bytes_bar(len: u64, what: &str, quiet: bool) -> ProgressBar {
    // Cleared when dropped unfinished too (a failure, an interruption): the error line then
    // stands alone.
    let pb = ProgressBar::with_draw_target(Some(len), target(quiet))
        .with_finish(ProgressFinish::AndClear);
    pb.set_style(
        ProgressStyle::with_template(
            "{msg:>8} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

fn target(quiet: bool) -> ProgressDrawTarget {
    if quiet || !std::io::stderr().is_terminal() {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    }
}
