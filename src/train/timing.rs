//! Where a run's fixed time goes (issue 24): seconds since the process started, and with
//! PREP_TIMING=1 a line on stderr at each point of a run's start and end.

use std::sync::OnceLock;
use std::time::Instant;

/// The process's start as an `Instant`: its start time from /proc/self/stat (clock ticks since
/// boot) against the boot clock, so the time before `main` (loading, linking) counts too; where
/// that cannot be read, the first call.
fn start() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(|| {
        let now = Instant::now();
        match age() {
            Some(a) => now.checked_sub(a).unwrap_or(now),
            None => now,
        }
    })
}

/// How long ago this process started.
fn age() -> Option<std::time::Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    // Field 22 of the whole line is the 20th after the name.
    let ticks: u64 = rest.split(' ').nth(19)?.parse().ok()?;
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    if hz <= 0 || unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
        return None;
    }
    let now = ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9;
    let age = now - ticks as f64 / hz as f64;
    (0.0..3600.0 * 24.0 * 365.0)
        .contains(&age)
        .then(|| std::time::Duration::from_secs_f64(age))
}

/// Seconds since the process started.
pub fn since_start() -> f64 {
    start().elapsed().as_secs_f64()
}

pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("PREP_TIMING").as_deref() == Ok("1"))
}

/// With PREP_TIMING=1: `timing: WHAT at T s` (T from the process's start).
pub fn mark(what: &str) {
    if enabled() {
        eprintln!("timing: {what} at {:.3} s", since_start());
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_process_started_before_now_and_not_long_ago() {
        let a = super::since_start();
        // This test process has run for some time already, but not for hours.
        assert!(a > 0.0 && a < 3600.0, "{a}");
        assert!(super::age().is_some(), "/proc/self/stat could not be read");
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(super::since_start() >= a + 0.019);
    }
}
