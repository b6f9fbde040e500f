//! The world of a data-parallel run: which rank this process is, how many there are, and how
//! they find each other.
//!
//! A world comes from the launcher's variables: torchrun's `WORLD_SIZE`/`RANK`/`LOCAL_RANK`/
//! `MASTER_ADDR`/`MASTER_PORT` (a Kubernetes indexed Job's `JOB_COMPLETION_INDEX` standing in for
//! `RANK`), or, in an srun step, Slurm's `SLURM_NTASKS`/`SLURM_PROCID`/`SLURM_LOCALID` (with
//! `MASTER_ADDR`/`MASTER_PORT` from the batch script, or a rendezvous file). `prep train --gpus N`
//! sets torchrun's variables for the processes it starts, so there is one code path.
//!
//! Rendezvous: rank 0 listens on `MASTER_ADDR:MASTER_PORT` (or on a free port it writes to the
//! rendezvous file), every other rank connects and says who it is, and rank 0 answers each with
//! the payload (NCCL's unique id) once all have joined. The connections then stay open as the
//! world's liveness: a process that dies, however it dies, closes its socket; rank 0 then tells
//! every other rank which rank ended and why, and each exits instead of waiting forever in a
//! collective. No home-made collective: the gradients go through NCCL.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Protocol tag of every hello, so that a stray connection is refused.
const MAGIC: &str = "prep-rendezvous-1";
/// How long ranks wait for each other at the start, unless `PREP_RENDEZVOUS_TIMEOUT` says: the
/// hosts of one job may start minutes apart.
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(300);
/// The variable that sets the rendezvous wait, in whole seconds.
pub const TIMEOUT_VAR: &str = "PREP_RENDEZVOUS_TIMEOUT";
/// The longest wait it may ask for (a week): a longer one is a typo, and `Instant + Duration` must
/// not overflow.
const MAX_TIMEOUT_SECS: u64 = 7 * 24 * 3600;

/// Where rank 0 is found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rendezvous {
    Tcp {
        host: String,
        port: u16,
    },
    /// Rank 0 writes `host:port` here; it must not exist before the job starts.
    File(PathBuf),
}

impl std::str::FromStr for Rendezvous {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(p) = s.strip_prefix("file:") {
            if p.is_empty() {
                return Err("--rendezvous file: needs a path (file:/shared/job.rdv)".into());
            }
            return Ok(Rendezvous::File(PathBuf::from(p)));
        }
        if let Some(a) = s.strip_prefix("tcp:") {
            let (host, port) = a
                .rsplit_once(':')
                .ok_or_else(|| format!("--rendezvous {s}: expected tcp:HOST:PORT"))?;
            let port = port
                .parse()
                .map_err(|_| format!("--rendezvous {s}: port `{port}` is not 1..65535"))?;
            return Ok(Rendezvous::Tcp {
                host: host.into(),
                port,
            });
        }
        Err(format!(
            "--rendezvous {s}: expected file:PATH or tcp:HOST:PORT"
        ))
    }
}

/// `--gpus`: how many GPUs of this host to train on, or which.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gpus {
    /// The first N.
    Count(usize),
    All,
    /// These indices (as the driver numbers them), two or more, each once.
    List(Vec<usize>),
}

const GPUS_FORM: &str =
    "expected a count of at least 1 (2), `all`, or GPU indices separated by commas (0,2)";

impl std::str::FromStr for Gpus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if t == "all" {
            return Ok(Gpus::All);
        }
        if !t.contains(',') {
            return match t.parse::<usize>() {
                Ok(n) if n >= 1 => Ok(Gpus::Count(n)),
                _ => Err(format!("--gpus {s}: {GPUS_FORM}")),
            };
        }
        let mut list = Vec::new();
        for part in t.split(',') {
            let i: usize = part
                .trim()
                .parse()
                .map_err(|_| format!("--gpus {s}: `{part}` is not a GPU index; {GPUS_FORM}"))?;
            if list.contains(&i) {
                return Err(format!("--gpus {s}: GPU {i} is named twice"));
            }
            list.push(i);
        }
        Ok(Gpus::List(list))
    }
}

impl std::fmt::Display for Gpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Gpus::Count(n) => write!(f, "{n}"),
            Gpus::All => write!(f, "all"),
            Gpus::List(l) => {
                let v: Vec<String> = l.iter().map(|i| i.to_string()).collect();
                write!(f, "{}", v.join(","))
            }
        }
    }
}

impl Gpus {
    /// The GPU indices to train on, given what the driver reports: its GPU count, or why there
    /// is no driver. The error says what exists.
    pub fn resolve(&self, count: Result<usize, String>) -> Result<Vec<usize>, String> {
        let n = match count {
            Ok(0) => {
                return Err(format!(
                    "--gpus {self}: no CUDA GPU found (the driver reports none)"
                ))
            }
            Ok(n) => n,
            Err(why) => return Err(format!("--gpus {self}: no CUDA GPU found ({why})")),
        };
        let exist = if n == 1 {
            "this host has 1 GPU (index 0)".to_string()
        } else {
            format!("this host has {n} GPUs (indices 0 to {})", n - 1)
        };
        match self {
            Gpus::All => Ok((0..n).collect()),
            Gpus::Count(k) if *k <= n => Ok((0..*k).collect()),
            Gpus::Count(k) => Err(format!("--gpus {k}: {exist}")),
            Gpus::List(l) => match l.iter().find(|&&i| i >= n) {
                Some(i) => Err(format!("--gpus {self}: there is no GPU {i}; {exist}")),
                None => Ok(l.clone()),
            },
        }
    }
}

/// This process's place in the world.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct World {
    pub rank: usize,
    pub size: usize,
    /// Rank on this host: the GPU it uses.
    pub local_rank: usize,
    pub rendezvous: Rendezvous,
    /// Which launcher's variables described it.
    pub launcher: &'static str,
    /// How long the rendezvous waits for the other ranks (`PREP_RENDEZVOUS_TIMEOUT`).
    pub join_timeout: Duration,
}

fn var<'a>(
    get: &dyn Fn(&str) -> Option<String>,
    name: &'a str,
) -> Result<Option<(usize, &'a str)>, String> {
    match get(name) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse::<usize>()
            .map(|n| Some((n, name)))
            .map_err(|_| format!("{name}={v} is not a whole number")),
    }
}

/// Whether this process is a task of an srun job step. Slurm sets `SLURM_STEP_ID` (and the older
/// `SLURM_STEPID`) for the tasks of a step; the batch script's own shell has neither, or the
/// batch step's reserved id (above `SLURM_MAX_NORMAL_STEP_ID`, shown as `batch`), though it has
/// the allocation's `SLURM_NTASKS` and `SLURM_PROCID=0`.
fn in_srun_step(get: &dyn Fn(&str) -> Option<String>) -> bool {
    const MAX_NORMAL_STEP_ID: u32 = 0xFFFF_FFF0;
    ["SLURM_STEP_ID", "SLURM_STEPID"]
        .iter()
        .filter_map(|n| get(n))
        .any(|v| matches!(v.trim().parse::<u32>(), Ok(id) if id < MAX_NORMAL_STEP_ID))
}

/// Whether the Slurm variables describe an allocation of several tasks seen from outside any
/// srun step (the batch script, or salloc's shell): one process, not one of the tasks.
/// `prep train --gpus N` may run there: it starts its own ranks on this node.
pub fn in_slurm_allocation_shell(get: &dyn Fn(&str) -> Option<String>) -> bool {
    get("WORLD_SIZE").is_none()
        && matches!(var(get, "SLURM_NTASKS"), Ok(Some((n, _))) if n > 1)
        && !in_srun_step(get)
}

/// `PREP_RENDEZVOUS_TIMEOUT`: whole seconds, 1 to a week; 300 when unset.
fn join_timeout(get: &dyn Fn(&str) -> Option<String>) -> Result<Duration, String> {
    let Some(v) = get(TIMEOUT_VAR) else {
        return Ok(JOIN_TIMEOUT);
    };
    match v.trim().parse::<u64>() {
        Ok(s) if (1..=MAX_TIMEOUT_SECS).contains(&s) => Ok(Duration::from_secs(s)),
        _ => Err(format!(
            "{TIMEOUT_VAR}={v} is not a number of seconds from 1 to {MAX_TIMEOUT_SECS} (how long the ranks wait for each other at the start; default {})",
            JOIN_TIMEOUT.as_secs()
        )),
    }
}

/// The world the environment describes, or `None` for a one-process run. `get` reads a variable
/// (`std::env::var` in the binary; a map in tests); `flag` is `--rendezvous`.
///
/// With `WORLD_SIZE` set and `RANK` not, a Kubernetes indexed Job's `JOB_COMPLETION_INDEX` is the
/// rank, so that a pod needs no shell to copy it.
pub fn from_env(
    get: &dyn Fn(&str) -> Option<String>,
    flag: Option<&Rendezvous>,
) -> Result<Option<World>, String> {
    let (size, rank, local, launcher) = if let Some((size, sn)) = var(get, "WORLD_SIZE")? {
        if let Some((rank, _)) = var(get, "RANK")? {
            let local = var(get, "LOCAL_RANK")?.map_or(rank, |v| v.0);
            (size, rank, local, "torchrun")
        } else if let Some((rank, _)) = var(get, "JOB_COMPLETION_INDEX")? {
            // An indexed Job runs one pod per rank, each with its own GPU: local rank 0.
            let local = var(get, "LOCAL_RANK")?.map_or(0, |v| v.0);
            (size, rank, local, "Kubernetes indexed Job")
        } else {
            return Err(format!(
                "{sn} is set but RANK is not (nor JOB_COMPLETION_INDEX, which a Kubernetes indexed Job sets)"
            ));
        }
    } else if let Some((size, _)) = var(get, "SLURM_NTASKS")? {
        if !in_srun_step(get) {
            // The batch script (or salloc's shell) is one process: the allocation's other tasks
            // exist only once srun starts them, and a rank would wait for them in vain.
            if size > 1 {
                return Err(format!(
                    "SLURM_NTASKS={size} is set but this process is not one of srun's tasks (no SLURM_STEP_ID): it is the batch script (or salloc's shell) itself, and the other {} task(s) would never join. Start prep with srun, one task per GPU: `srun prep train ...`; or train on this node's GPUs alone with `prep train ... --gpus N`",
                    size - 1
                ));
            }
            if size == 1 {
                return Ok(None);
            }
        }
        let (rank, _) =
            var(get, "SLURM_PROCID")?.ok_or("SLURM_NTASKS is set but SLURM_PROCID is not")?;
        let local = var(get, "SLURM_LOCALID")?.map_or(0, |v| v.0);
        (size, rank, local, "slurm")
    } else {
        return Ok(None);
    };
    if size == 0 {
        return Err("the world size is 0".into());
    }
    if rank >= size {
        return Err(format!("rank {rank} is not below the world size {size}"));
    }
    if size == 1 {
        return Ok(None);
    }
    let join_timeout = join_timeout(get)?;
    let rendezvous = match flag {
        Some(r) => r.clone(),
        None => {
            let host = get("MASTER_ADDR").ok_or(
                "a multi-process run needs MASTER_ADDR and MASTER_PORT (rank 0's host and a free port), or --rendezvous file:PATH on shared storage",
            )?;
            let port = get("MASTER_PORT").ok_or("MASTER_ADDR is set but MASTER_PORT is not")?;
            let port = match port.trim().parse::<u16>() {
                Ok(p) if p > 0 => p,
                _ => return Err(format!("MASTER_PORT={port} is not a port (1..65535)")),
            };
            Rendezvous::Tcp { host, port }
        }
    };
    Ok(Some(World {
        rank,
        size,
        local_rank: local,
        rendezvous,
        launcher,
        join_timeout,
    }))
}

impl World {
    /// A world of one rank meeting on a free local port: the multi-rank path on one GPU, for tests.
    pub fn of_one() -> Result<World, String> {
        let port = std::net::TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| io("finding a free port", e))?
            .port();
        Ok(World {
            rank: 0,
            size: 1,
            local_rank: 0,
            rendezvous: Rendezvous::Tcp {
                host: "127.0.0.1".into(),
                port,
            },
            launcher: "test",
            join_timeout: JOIN_TIMEOUT,
        })
    }
}

/// The joined world: rank 0 holds a connection to every rank, the others one to rank 0.
pub struct Joined {
    pub world: World,
    /// What rank 0 handed out (NCCL's unique id).
    pub payload: Vec<u8>,
    links: Vec<(usize, TcpStream)>,
    file: Option<PathBuf>,
}

fn io(what: &str, e: std::io::Error) -> String {
    format!("rendezvous: {what}: {e}")
}

/// Join the world: rank 0 hands `payload()` (called once, on rank 0 only) to all. `key` names the
/// job (the same on every rank: data path and arguments), so that ranks of two jobs sharing a port
/// or a file never join each other.
pub fn join(
    world: &World,
    key: &str,
    payload: impl FnOnce() -> Result<Vec<u8>, String>,
) -> Result<Joined, String> {
    let deadline = Instant::now() + world.join_timeout;
    if world.rank == 0 {
        lead(world, key, payload, deadline)
    } else {
        follow(world, key, deadline)
    }
}

/// Rank 0's side of `join`: listen, gather every other rank, then hand each the payload.
fn lead(
    world: &World,
    key: &str,
    payload: impl FnOnce() -> Result<Vec<u8>, String>,
    deadline: Instant,
) -> Result<Joined, String> {
    let (listener, file) = listen(world, key)?;
    let payload = payload()?;
    let mut links = gather(world, key, &listener, deadline)?;
    answer(&mut links, &payload)?;
    Ok(Joined {
        world: world.clone(),
        payload,
        links,
        file,
    })
}

/// Rank 0's listener: on the given port, or on a free one written to the rendezvous file (then
/// returned with it).
fn listen(world: &World, key: &str) -> Result<(TcpListener, Option<PathBuf>), String> {
    Ok(match &world.rendezvous {
        Rendezvous::Tcp { port, .. } => (
            TcpListener::bind(("0.0.0.0", *port))
                .map_err(|e| io(&format!("listening on port {port}"), e))?,
            None,
        ),
        Rendezvous::File(p) => {
            let l = TcpListener::bind(("0.0.0.0", 0)).map_err(|e| io("listening", e))?;
            let port = l.local_addr().map_err(|e| io("listening", e))?.port();
            let host = hostname();
            write_rendezvous_file(p, &format!("{host}:{port} {key}\n"))?;
            (l, Some(p.clone()))
        }
    })
}

/// Accept the other ranks until all have said hello, or refuse at the deadline naming those
/// missing.
fn gather(
    world: &World,
    key: &str,
    listener: &TcpListener,
    deadline: Instant,
) -> Result<Vec<(usize, TcpStream)>, String> {
    let mut links: Vec<(usize, TcpStream)> = Vec::new();
    listener
        .set_nonblocking(true)
        .map_err(|e| io("listening", e))?;
    while links.len() + 1 < world.size {
        match listener.accept() {
            Ok((s, peer)) => {
                let r = read_hello(&s, peer, world.size, key)?;
                if r == 0 || links.iter().any(|(k, _)| *k == r) {
                    return Err(format!(
                        "rendezvous: rank {r} joined twice (from {peer}): are two jobs using the same rendezvous?"
                    ));
                }
                links.push((r, s));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(missing_ranks(world, &links));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(io("accepting", e)),
        }
    }
    Ok(links)
}

/// The rank that a newly accepted connection from `peer` says it is.
fn read_hello(
    s: &TcpStream,
    peer: std::net::SocketAddr,
    size: usize,
    key: &str,
) -> Result<usize, String> {
    s.set_nonblocking(false).map_err(|e| io("accepting", e))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| io("accepting", e))?;
    let line = read_line(s, 4096).map_err(|e| io(&format!("reading the hello of {peer}"), e))?;
    parse_hello(&line, size, key).map_err(|e| format!("rendezvous: {peer}: {e}"))
}

/// Rank 0's refusal when the deadline passes: which ranks (up to 8) did not join, and where.
fn missing_ranks(world: &World, links: &[(usize, TcpStream)]) -> String {
    let mut missing: Vec<usize> = (1..world.size)
        .filter(|r| !links.iter().any(|(k, _)| k == r))
        .collect();
    missing.truncate(8);
    format!(
        "rendezvous: ranks {missing:?} did not join {} within {} s: are they running, and do they reach this host? To wait longer, set {TIMEOUT_VAR}=SECONDS",
        match &world.rendezvous {
            Rendezvous::Tcp { port, .. } => format!("on port {port}"),
            Rendezvous::File(p) => format!("through {}", p.display()),
        },
        world.join_timeout.as_secs()
    )
}

/// Hand the payload to every joined rank.
fn answer(links: &mut [(usize, TcpStream)], payload: &[u8]) -> Result<(), String> {
    let hex = to_hex(payload);
    for (r, s) in links {
        s.set_read_timeout(None).map_err(|e| io("joining", e))?;
        writeln!(s, "ok {hex}").map_err(|e| io(&format!("answering rank {r}"), e))?;
    }
    Ok(())
}

/// Every other rank's side of `join`: find rank 0, say hello, and wait for the payload.
fn follow(world: &World, key: &str, deadline: Instant) -> Result<Joined, String> {
    let addr = rank_zero_address(world, key, deadline)?;
    let mut s = connect(&addr, deadline, world.join_timeout)?;
    writeln!(s, "{MAGIC} {} {} {}", world.rank, world.size, key)
        .map_err(|e| io(&format!("greeting rank 0 at {addr}"), e))?;
    let payload = read_payload(&s, &addr)?;
    Ok(Joined {
        world: world.clone(),
        payload,
        links: vec![(0, s)],
        file: None,
    })
}

/// Rank 0's `host:port`: given, or read from the rendezvous file once rank 0 has written it.
fn rank_zero_address(world: &World, key: &str, deadline: Instant) -> Result<String, String> {
    Ok(match &world.rendezvous {
        Rendezvous::Tcp { host, port } => format!("{host}:{port}"),
        Rendezvous::File(p) => loop {
            if let Some(a) = read_rendezvous_file(p, key) {
                break a;
            }
            if Instant::now() > deadline {
                let p = p.display();
                return Err(format!(
                    "rendezvous: rank 0 did not write {p} within {} s: is rank 0 running, and is {p} on storage that every node sees? To wait longer, set {TIMEOUT_VAR}=SECONDS",
                    world.join_timeout.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        },
    })
}

/// A connection to rank 0 at `addr`, tried again until the deadline.
fn connect(addr: &str, deadline: Instant, wait: Duration) -> Result<TcpStream, String> {
    // Rank 0 may not listen yet, nor its name resolve (a Kubernetes pod's DNS record comes
    // with the pod): try again until the deadline, and say what failed last.
    loop {
        // Each attempt ends by the deadline, give or take the connect floor.
        let left = deadline.saturating_duration_since(Instant::now());
        let per_try = left.clamp(Duration::from_millis(100), Duration::from_secs(5));
        let last = match try_connect(addr, per_try) {
            Ok(s) => return Ok(s),
            Err(why) => why,
        };
        if Instant::now() > deadline {
            return Err(format!(
                "rendezvous: could not reach rank 0 at {addr} within {} s (last: {last}): is rank 0 running, and is {addr} its address? To wait longer, set {TIMEOUT_VAR}=SECONDS",
                wait.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One attempt to connect to each address `addr` resolves to, in turn; else what failed last.
fn try_connect(addr: &str, per_try: Duration) -> Result<TcpStream, String> {
    match addr.to_socket_addrs() {
        Err(e) => Err(format!("resolving {addr}: {e}")),
        Ok(addrs) => {
            let mut last = format!("{addr} resolves to no address");
            let mut got = None;
            for a in addrs {
                match TcpStream::connect_timeout(&a, per_try) {
                    Ok(s) => {
                        got = Some(s);
                        break;
                    }
                    Err(e) => last = format!("connecting to {a}: {e}"),
                }
            }
            got.ok_or(last)
        }
    }
}

/// Rank 0's answer to the hello: the payload, or why there is none.
fn read_payload(s: &TcpStream, addr: &str) -> Result<Vec<u8>, String> {
    let line =
        read_line(s, 1 << 16).map_err(|e| io(&format!("waiting for rank 0 at {addr}"), e))?;
    let line = line.trim_end();
    Ok(match line.strip_prefix("ok ") {
        Some(h) => from_hex(h).ok_or("rendezvous: rank 0 sent a malformed id")?,
        None if line.is_empty() => {
            return Err(format!(
                "rendezvous: rank 0 at {addr} closed the connection before the world was complete"
            ))
        }
        None => return Err(format!("rendezvous: rank 0 refused: {line}")),
    })
}

/// One line, read a byte at a time: a buffered reader could swallow what follows it (the first
/// message of the watch), which belongs to the watcher.
fn read_line(mut s: &TcpStream, limit: usize) -> std::io::Result<String> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while line.len() < limit {
        if s.read(&mut b)? == 0 || b[0] == b'\n' {
            break;
        }
        line.push(b[0]);
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

fn parse_hello(line: &str, size: usize, key: &str) -> Result<usize, String> {
    let mut it = line.trim_end().splitn(4, ' ');
    if it.next() != Some(MAGIC) {
        return Err("not a prep rank (wrong hello)".into());
    }
    let rank: usize = it
        .next()
        .and_then(|v| v.parse().ok())
        .ok_or("hello without a rank")?;
    let their: usize = it
        .next()
        .and_then(|v| v.parse().ok())
        .ok_or("hello without a world size")?;
    if their != size {
        return Err(format!(
            "rank {rank} says the world has {their} ranks, rank 0 says {size}"
        ));
    }
    if rank >= size {
        return Err(format!("rank {rank} is not below the world size {size}"));
    }
    if it.next().unwrap_or("") != key {
        return Err(format!(
            "rank {rank} runs another job (its data or arguments differ from rank 0's)"
        ));
    }
    Ok(rank)
}

fn write_rendezvous_file(p: &Path, text: &str) -> Result<(), String> {
    if p.exists() {
        return Err(format!(
            "rendezvous: {} already exists (left by an earlier job?): remove it or name a new file",
            p.display()
        ));
    }
    let tmp = p.with_extension("tmp");
    std::fs::write(&tmp, text)
        .and_then(|_| std::fs::rename(&tmp, p))
        .map_err(|e| io(&format!("writing {}", p.display()), e))
}

fn read_rendezvous_file(p: &Path, key: &str) -> Option<String> {
    let t = crate::store::local::read_text_capped(p, 4096, "a rendezvous file").ok()?;
    let (addr, k) = t.trim_end().split_once(' ')?;
    (k == key).then(|| addr.to_string())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "127.0.0.1".into())
}

fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn from_hex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Why the world ended, as the watcher saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub rank: usize,
    pub reason: String,
}

impl Joined {
    /// Watch the world from a thread: when another rank ends (its connection closes, or it says
    /// why), `on_end` runs once with which rank and why; the caller's `on_end` exits the process,
    /// since the main thread may be inside a collective that will never complete.
    pub fn watch(&self, on_end: impl Fn(Ended) + Send + Sync + 'static) -> Result<Watch, String> {
        let on_end = Arc::new(on_end);
        let fired = Arc::new(Mutex::new(false));
        let me = self.world.rank;
        let mut writers = Vec::new();
        for (r, s) in &self.links {
            let r = *r;
            let read = s.try_clone().map_err(|e| io("watching", e))?;
            writers.push((r, s.try_clone().map_err(|e| io("watching", e))?));
            let (on_end, fired) = (on_end.clone(), fired.clone());
            // Rank 0 relays the end of a rank to all others.
            let relay: Vec<(usize, TcpStream)> = if me == 0 {
                self.links
                    .iter()
                    .filter(|(k, _)| *k != r)
                    .filter_map(|(k, s)| Some((*k, s.try_clone().ok()?)))
                    .collect()
            } else {
                Vec::new()
            };
            std::thread::Builder::new()
                .name(format!("prep-watch-{r}"))
                .spawn(move || {
                    let mut line = String::new();
                    let n = BufReader::new(read).read_line(&mut line).unwrap_or(0);
                    if line.trim_end() == "bye" {
                        return;
                    }
                    let ended = match line.trim_end().strip_prefix("end ") {
                        Some(rest) => {
                            let (who, why) = rest.split_once(' ').unwrap_or((rest, ""));
                            Ended {
                                rank: who.parse().unwrap_or(r),
                                reason: why.to_string(),
                            }
                        }
                        None if n == 0 => Ended {
                            rank: r,
                            reason: "its process ended without a word (killed, or out of memory)"
                                .into(),
                        },
                        None => Ended {
                            rank: r,
                            reason: format!("unexpected message `{}`", line.trim_end()),
                        },
                    };
                    {
                        let mut f = fired.lock().unwrap();
                        if *f {
                            return;
                        }
                        *f = true;
                    }
                    for (_, mut s) in relay {
                        let _ = writeln!(s, "end {} {}", ended.rank, one_line(&ended.reason));
                    }
                    on_end(ended);
                })
                .map_err(|e| io("starting the watcher", e))?;
        }
        Ok(Watch {
            rank: me,
            writers,
            fired,
        })
    }
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

/// The sending side of the watch: say why this rank ends, or that it finished.
pub struct Watch {
    rank: usize,
    writers: Vec<(usize, TcpStream)>,
    fired: Arc<Mutex<bool>>,
}

impl Watch {
    /// Tell the others that this rank stops, and why (before exiting with an error).
    pub fn fail(&mut self, reason: &str) {
        *self.fired.lock().unwrap() = true;
        for (_, s) in &mut self.writers {
            let _ = writeln!(s, "end {} {}", self.rank, one_line(reason));
        }
    }

    /// A normal end: the others read a goodbye, not a closed connection, so none of them takes
    /// this rank's exit for a failure.
    pub fn finish(mut self) {
        *self.fired.lock().unwrap() = true;
        for (_, s) in &mut self.writers {
            let _ = writeln!(s, "bye");
            let _ = s.shutdown(std::net::Shutdown::Write);
        }
    }
}

impl Joined {
    /// Close every connection as a process's death does (threads of one test process share the
    /// descriptors a real exit would close).
    #[cfg(test)]
    fn sever(&self) {
        for (_, s) in &self.links {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Drop for Joined {
    fn drop(&mut self) {
        if let Some(f) = &self.file {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// A free TCP port on this host, for the processes `--gpus N` starts.
pub fn free_port() -> Result<u16, String> {
    TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| io("finding a free port", e))
}

#[cfg(test)]
mod tests;
