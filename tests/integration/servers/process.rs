//! The servers' processes: ending a server and everything it started, and reading its log.

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

/// The last `max` bytes of a file, as text ("" if it is not there).
pub fn tail(path: &Path, max: u64) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(max)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// Every process descended from `root`, `root` first, each with its start time (to tell it from
/// a later process that reuses its pid), from /proc.
fn descendants(root: u32) -> Vec<(u32, u64)> {
    let mut procs = Vec::new(); // (pid, ppid, start time)
    if let Ok(entries) = fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some((ppid, start)) = stat_of(pid) {
                procs.push((pid, ppid, start));
            }
        }
    }
    let mut out: Vec<(u32, u64)> = procs
        .iter()
        .filter(|p| p.0 == root)
        .map(|p| (p.0, p.2))
        .collect();
    let mut i = 0;
    while i < out.len() {
        let parent = out[i].0;
        out.extend(procs.iter().filter(|p| p.1 == parent).map(|p| (p.0, p.2)));
        i += 1;
    }
    out
}

/// (ppid, start time) of a live (not zombie) process, from /proc/PID/stat.
fn stat_of(pid: u32) -> Option<(u32, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ... starttime(22nd field)": comm may hold spaces and parentheses.
    let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    if rest.first() == Some(&"Z") {
        return None;
    }
    Some((rest.get(1)?.parse().ok()?, rest.get(19)?.parse().ok()?))
}

/// Signal those of `procs` still alive and still the same processes (start time unchanged).
fn signal_all(procs: &[(u32, u64)], sig: libc::c_int) -> usize {
    let mut n = 0;
    for &(pid, start) in procs {
        if stat_of(pid).is_some_and(|(_, s)| s == start) {
            // SAFETY: kill(2) of a process this test started (or one it started), checked above.
            unsafe { libc::kill(pid as libc::pid_t, sig) };
            n += 1;
        }
    }
    n
}

/// End `child` and every process under it (a pyenv shim runs moto_server's Python as its child;
/// nginx has workers): SIGTERM and up to `grace` to exit, then SIGKILL; then reap it. The child is
/// reaped only at the end, so its pid cannot be reused meanwhile.
pub fn terminate(mut child: Child, grace: Duration) {
    let tree = descendants(child.id());
    if !grace.is_zero() && signal_all(&tree, libc::SIGTERM) > 0 {
        let until = Instant::now() + grace;
        while Instant::now() < until
            && tree
                .iter()
                .any(|&(p, s)| stat_of(p).is_some_and(|(_, s2)| s2 == s))
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // Also any process started since the list was taken (a respawned worker).
    let mut all = descendants(child.id());
    all.extend(tree);
    signal_all(&all, libc::SIGKILL);
    let _ = child.wait();
}
