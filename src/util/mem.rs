//! Memory figures of this process, read from /proc (Linux); zero elsewhere.

/// Peak resident set size in bytes (VmHWM).
pub fn peak_rss_bytes() -> u64 {
    status_kib("VmHWM:") * 1024
}

/// Current resident set size in bytes (VmRSS).
pub fn rss_bytes() -> u64 {
    status_kib("VmRSS:") * 1024
}

fn status_kib(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Memory this process may still take: the kernel's MemAvailable, less where a cgroup (v2: a
/// container's or a Slurm job's limit) allows less. None where neither can be read.
pub fn available_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("MemAvailable:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kib| kib * 1024)
    });
    let cgroup = (|| {
        let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
        let dir = std::path::Path::new("/sys/fs/cgroup").join(rel.trim_start_matches('/'));
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
        let max: u64 = read("memory.max")?.trim().parse().ok()?; // "max": no limit
        let current: u64 = read("memory.current")?.trim().parse().ok()?;
        Some(max.saturating_sub(current))
    })();
    match (meminfo, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// "123.4 MiB"
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Have the allocator (mimalloc, in the prep binary) give freed pages back to the OS at once
/// rather than after its default 10 ms, and keep this process off transparent huge pages
/// (`no_huge_pages`): training frees and reallocates buffers of many MiB on every thread. The
/// pages held back added 160 MB to peak RSS at 3x224x224 with 16 threads, and the 2 MiB huge
/// pages that mimalloc asks for (madvise) another 240 MB, about 15 MB a thread, which no purge
/// could return in part (BENCHMARKS.md).
pub fn purge_freed_memory_at_once() {
    no_huge_pages();
    // mi_option_purge_delay: 15 in the enum of mimalloc v2 and v3 alike.
    const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    // SAFETY: mimalloc options may be set at any time, from any thread.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, 0) };
}

/// Keep this process (the prep binary) off transparent huge pages, in mimalloc and in the
/// kernel. Every command frees and allocates buffers of a few MiB at a high rate (a decoded
/// photo, a block); with huge pages each fresh one is a 2 MiB page zeroed whole at its first
/// touch, 10% of `prep convert`'s time on photos (BENCHMARKS.md "Block codecs").
pub fn no_huge_pages() {
    // mi_option_allow_thp: 43 in mimalloc v3 (the version the mimalloc crate builds).
    const ALLOW_THP: libmimalloc_sys::mi_option_t = 43;
    // SAFETY: mimalloc options may be set at any time, from any thread; PR_SET_THP_DISABLE
    // only sets a flag of this process that the kernel reads at page faults.
    unsafe {
        libmimalloc_sys::mi_option_set(ALLOW_THP, 0);
        #[cfg(target_os = "linux")]
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}
