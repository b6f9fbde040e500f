//! The own kernels (`kernels/*.cu`), compiled by NVRTC to the device's own machine code (a
//! CUBIN for `sm_XY`, so the driver has nothing to JIT-compile), one thread per source, started
//! before the CUDA context exists and waited for only when a source's first kernel launches. The
//! images are kept per process and on disk (keyed by source, target and NVRTC version), so later
//! runs skip the compiler; neither cache is needed for speed or correctness.

use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{sys as nv, Ptx};
use std::collections::HashMap;
use std::collections::VecDeque;
use std::ffi::{c_char, CString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;

const COMMON: &str = include_str!("../../../kernels/common.cuh");
const SOURCES: [(&str, &str); 6] = [
    ("input.cu", include_str!("../../../kernels/input.cu")),
    ("bn.cu", include_str!("../../../kernels/bn.cu")),
    ("ops.cu", include_str!("../../../kernels/ops.cu")),
    ("loss.cu", include_str!("../../../kernels/loss.cu")),
    ("seg.cu", include_str!("../../../kernels/seg.cu")),
    ("unet.cu", include_str!("../../../kernels/unet.cu")),
];

/// A compiled source: machine code for the device (CUBIN), or PTX where this NVRTC cannot
/// target the device's architecture (then the driver compiles it).
#[derive(Clone)]
enum Image {
    Cubin(Arc<Vec<u8>>),
    Ptx(Arc<String>),
}

/// How a program's image was obtained, for PREP_TIMING.
#[derive(Clone, Debug)]
pub struct UnitTiming {
    pub program: String,
    /// Seconds from the start of its compile to an image in hand.
    pub secs: f64,
    /// `nvrtc`, `disk` or `process`.
    pub from: &'static str,
    /// Seconds the first launch of one of its kernels waited for it.
    pub waited: f64,
}

/// An image, how it was obtained, its cache key and its NVRTC target.
type Compiled = Result<(Image, UnitTiming, u64, String), String>;

/// One NVRTC program: a source with one of its instantiating macro lines (`BN(bf16, bf16, 8)`),
/// or with none (its plain kernels). A source compiled whole took up to 3.4 s on a fresh H100
/// host (issue 24); its programs compile side by side in a fraction of that, and a run compiles
/// only those of its precision before its first step.
struct Program {
    file: &'static str,
    /// `bn.cu BN(bf16, bf16, 8)`, or `bn.cu` for the plain kernels.
    label: String,
    body: String,
    names: Vec<String>,
}

/// The programs of every source; those without a kernel are left out.
fn programs() -> &'static [Program] {
    static PROGRAMS: OnceLock<Vec<Program>> = OnceLock::new();
    PROGRAMS.get_or_init(|| {
        let mut out = Vec::new();
        for (file, body) in SOURCES {
            let lines: Vec<&str> = body.lines().collect();
            let inst = instantiations(body);
            let plain_kernels = plain_kernel_lines(&lines);
            // The plain kernels without instantiations, or one instantiation without them.
            let keep = |only: Option<usize>| {
                let kept = lines.iter().enumerate().filter(|(i, _)| match only {
                    None => !inst.contains(i),
                    Some(o) => *i == o || !(inst.contains(i) || plain_kernels.contains(i)),
                });
                kept.map(|(_, l)| *l).collect::<Vec<_>>().join("\n")
            };
            let plain = keep(None);
            let mut add = |label: String, body: String| {
                let names = kernel_names(&body);
                if !names.is_empty() {
                    out.push(Program {
                        file,
                        label,
                        body,
                        names,
                    });
                }
            };
            add(file.to_string(), plain);
            for &i in &inst {
                add(format!("{file} {}", lines[i].trim()), keep(Some(i)));
            }
        }
        out
    })
}

/// Where a program's compile stands.
enum State {
    /// Compiled only when one of its kernels is asked for.
    Lazy,
    /// Waiting for a compiling thread.
    Queued,
    Running,
    Done(Compiled),
    Loaded,
}

/// The compiling threads' shared state.
struct Pool {
    states: Mutex<Vec<State>>,
    changed: Condvar,
    /// Programs in the order the threads take them.
    queue: Mutex<VecDeque<usize>>,
    stop: AtomicBool,
}

/// Every `extern "C" __global__` function of the sources, by name, loaded as its program's
/// compile finishes.
pub struct Kernels {
    /// The device's compute capability.
    cc: (i32, i32),
    pool: Arc<Pool>,
    threads: Vec<JoinHandle<()>>,
    /// Kernel name to its program.
    owner: HashMap<String, usize>,
    fns: HashMap<String, CudaFunction>,
    timings: Vec<UnitTiming>,
}

/// Images compiled or read by this process, by key: later backends of the process (the tests
/// make many) load them without the compiler or the disk.
fn images() -> &'static Mutex<HashMap<u64, Image>> {
    static IMAGES: OnceLock<Mutex<HashMap<u64, Image>>> = OnceLock::new();
    IMAGES.get_or_init(|| Mutex::new(HashMap::new()))
}

pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("PREP_KERNEL_CACHE") {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("prep").join("kernels"))
}

fn kernel_names(src: &str) -> Vec<String> {
    // Names from `extern "C" __global__ void NAME(` lines, and from the instantiating macros'
    // expansions: a macro `#define OPS(TN, T)` whose body names `relu_##TN`, invoked as
    // `OPS(bf16, bf16)`, makes `relu_bf16`.
    let mut out = Vec::new();
    // (macro name, its parameters, the templated names in its body)
    let mut macros: Vec<(String, Vec<String>, Vec<String>)> = Vec::new();
    for line in src.lines() {
        if let Some(def) = line.trim().strip_prefix("#define ") {
            if let (Some(open), Some(close)) = (def.find('('), def.find(')')) {
                let params = def[open + 1..close]
                    .split(',')
                    .map(|p| p.trim().to_string());
                macros.push((def[..open].to_string(), params.collect(), Vec::new()));
            }
        }
        if let Some(rest) = line.split("__global__ void ").nth(1) {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '#')
                .collect();
            match macros.last_mut() {
                Some(m) if name.contains("##") => m.2.push(name),
                _ => out.push(name),
            }
        }
    }
    for line in src.lines() {
        let l = line.trim();
        let Some(open) = l.find('(') else { continue };
        let Some((_, params, names)) = macros.iter().find(|m| m.0 == l[..open]) else {
            continue;
        };
        if !l.ends_with(')') {
            continue;
        }
        let args: Vec<&str> = l[open + 1..l.len() - 1].split(',').map(str::trim).collect();
        if args.len() != params.len() {
            continue;
        }
        for t in names {
            let name: String = t
                .split("##")
                .map(|seg| {
                    params
                        .iter()
                        .position(|p| p == seg)
                        .map_or(seg, |i| args[i])
                })
                .collect();
            if !out.contains(&name) {
                out.push(name);
            }
        }
    }
    out
}

/// The NVRTC target for a device of compute capability `major.minor`: its own machine code
/// (`sm_XY`) where this NVRTC knows the architecture, else PTX for the newest one it knows below
/// (the driver compiles that on load).
fn target(major: i32, minor: i32) -> String {
    static KNOWN: OnceLock<Mutex<HashMap<(i32, i32), String>>> = OnceLock::new();
    let known = KNOWN.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(t) = known.lock().unwrap().get(&(major, minor)) {
        return t.clone();
    }
    let t = target_uncached(major * 10 + minor);
    known.lock().unwrap().insert((major, minor), t.clone());
    t
}

fn target_uncached(want: i32) -> String {
    let archs = unsafe {
        let mut n = 0;
        if nv::nvrtcGetNumSupportedArchs(&mut n) != nv::nvrtcResult::NVRTC_SUCCESS || n <= 0 {
            return format!("sm_{want}");
        }
        let mut v = vec![0i32; n as usize];
        if nv::nvrtcGetSupportedArchs(v.as_mut_ptr()) != nv::nvrtcResult::NVRTC_SUCCESS {
            return format!("sm_{want}");
        }
        v
    };
    if archs.contains(&want) {
        return format!("sm_{want}");
    }
    match archs.iter().filter(|&&a| a < want).max() {
        Some(a) => format!("compute_{a}"),
        None => format!("sm_{want}"),
    }
}

fn nvrtc_version() -> String {
    let (mut a, mut b) = (0, 0);
    unsafe { nv::nvrtcVersion(&mut a, &mut b) };
    format!("{a}.{b}")
}

/// A CUBIN is an ELF file.
fn looks_like_cubin(b: &[u8]) -> bool {
    b.len() > 64 && b.starts_with(b"\x7fELF")
}

/// Compile `src` for `target` (`sm_XY`: a CUBIN; `compute_XY`: PTX).
fn nvrtc_compile(file: &str, src: &str, target: &str) -> Result<Image, String> {
    let fail = |what: &str, r: nv::nvrtcResult| format!("NVRTC {what} kernels/{file}: {r:?}");
    let c_src = CString::new(src).map_err(|_| format!("kernels/{file} holds a NUL byte"))?;
    let c_name = CString::new(file).unwrap();
    let opts: Vec<CString> = [format!("--gpu-architecture={target}"), "-std=c++17".into()]
        .into_iter()
        .map(|o| CString::new(o).unwrap())
        .collect();
    let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    unsafe {
        let mut prog: nv::nvrtcProgram = std::ptr::null_mut();
        let r = nv::nvrtcCreateProgram(
            &mut prog,
            c_src.as_ptr(),
            c_name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        );
        if r != nv::nvrtcResult::NVRTC_SUCCESS {
            return Err(fail("could not take", r));
        }
        let out = (|| {
            let r = nv::nvrtcCompileProgram(prog, ptrs.len() as i32, ptrs.as_ptr());
            if r != nv::nvrtcResult::NVRTC_SUCCESS {
                let mut n = 0usize;
                nv::nvrtcGetProgramLogSize(prog, &mut n);
                let mut log = vec![0u8; n.max(1)];
                nv::nvrtcGetProgramLog(prog, log.as_mut_ptr() as *mut c_char);
                let log = String::from_utf8_lossy(&log);
                return Err(format!(
                    "NVRTC could not compile kernels/{file} for {target}: {r:?}\n{}",
                    log.trim_end_matches('\0').trim()
                ));
            }
            let mut n = 0usize;
            if target.starts_with("sm_") {
                let r = nv::nvrtcGetCUBINSize(prog, &mut n);
                if r != nv::nvrtcResult::NVRTC_SUCCESS {
                    return Err(fail("gave no CUBIN for", r));
                }
                let mut b = vec![0u8; n];
                let r = nv::nvrtcGetCUBIN(prog, b.as_mut_ptr() as *mut c_char);
                if r != nv::nvrtcResult::NVRTC_SUCCESS {
                    return Err(fail("gave no CUBIN for", r));
                }
                Ok(Image::Cubin(Arc::new(b)))
            } else {
                let r = nv::nvrtcGetPTXSize(prog, &mut n);
                if r != nv::nvrtcResult::NVRTC_SUCCESS {
                    return Err(fail("gave no PTX for", r));
                }
                let mut b = vec![0u8; n];
                let r = nv::nvrtcGetPTX(prog, b.as_mut_ptr() as *mut c_char);
                if r != nv::nvrtcResult::NVRTC_SUCCESS {
                    return Err(fail("gave no PTX for", r));
                }
                let text = String::from_utf8_lossy(&b)
                    .trim_end_matches('\0')
                    .to_string();
                Ok(Image::Ptx(Arc::new(text)))
            }
        })();
        nv::nvrtcDestroyProgram(&mut prog);
        out
    }
}

fn cache_path(file: &str, key: u64, target: &str) -> Option<PathBuf> {
    let ext = if target.starts_with("sm_") {
        "cubin"
    } else {
        "ptx"
    };
    cache_dir().map(|d| d.join(format!("{file}-{key:016x}.{ext}")))
}

fn read_cached(p: &PathBuf, target: &str) -> Option<Image> {
    // A kernel image is some hundreds of KiB; a cache file is checked as every other file is.
    let b = crate::store::local::read_capped(p, 64 << 20, "cached kernel image").ok()?;
    if target.starts_with("sm_") {
        looks_like_cubin(&b).then(|| Image::Cubin(Arc::new(b)))
    } else {
        String::from_utf8(b).ok().map(|t| Image::Ptx(Arc::new(t)))
    }
}

/// A cache that cannot be written only costs the next run a compile; written whole (rename).
fn write_cached(p: &PathBuf, img: &Image) {
    let bytes: &[u8] = match img {
        Image::Cubin(b) => b,
        Image::Ptx(t) => t.as_bytes(),
    };
    let _ = std::fs::create_dir_all(p.parent().unwrap());
    let tmp = p.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, bytes).is_ok() && std::fs::rename(&tmp, p).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// The image of program `i`: this process's, the disk cache's, or NVRTC's (`disk`: the disk
/// cache may be read).
fn obtain(i: usize, target: &str, disk: bool) -> Compiled {
    let p = &programs()[i];
    let t0 = Instant::now();
    let key = twox_hash::XxHash3_64::oneshot(
        format!("{target} {}\n{COMMON}\n{}", nvrtc_version(), p.body).as_bytes(),
    );
    let timing = |from| UnitTiming {
        program: p.label.clone(),
        secs: t0.elapsed().as_secs_f64(),
        from,
        waited: 0.0,
    };
    if let Some(img) = images().lock().unwrap().get(&key).cloned() {
        return Ok((img, timing("process"), key, target.into()));
    }
    let cached = cache_path(p.file, key, target);
    if disk {
        if let Some(img) = cached.as_ref().and_then(|c| read_cached(c, target)) {
            images().lock().unwrap().insert(key, img.clone());
            return Ok((img, timing("disk"), key, target.into()));
        }
    }
    let img = nvrtc_compile(&p.label, &format!("{COMMON}\n{}", p.body), target)?;
    if let Some(c) = &cached {
        write_cached(c, &img);
    }
    images().lock().unwrap().insert(key, img.clone());
    Ok((img, timing("nvrtc"), key, target.into()))
}

/// The lines of `src` that instantiate kernels: calls of a macro whose body defines
/// `extern "C" __global__` functions with pasted names.
fn instantiations(src: &str) -> Vec<usize> {
    let mut kernel_macros: Vec<&str> = Vec::new();
    let mut current: Option<&str> = None;
    for line in src.lines() {
        if let Some(def) = line.trim().strip_prefix("#define ") {
            current = def.find('(').map(|open| &def[..open]);
        }
        if let Some(rest) = line.split("__global__ void ").nth(1) {
            let name = rest.split('(').next().unwrap_or("");
            if let (Some(m), true) = (current, name.contains("##")) {
                if !kernel_macros.contains(&m) {
                    kernel_macros.push(m);
                }
            }
        }
    }
    src.lines()
        .enumerate()
        .filter(|(_, l)| {
            let l = l.trim();
            l.ends_with(')')
                && l.find('(')
                    .is_some_and(|o| kernel_macros.contains(&&l[..o]))
        })
        .map(|(i, _)| i)
        .collect()
}

/// The lines of the plain (not macro-made) kernels' definitions: from `extern "C" __global__`
/// to the brace that closes its body.
fn plain_kernel_lines(lines: &[&str]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        if !(l.starts_with("extern \"C\" __global__") && !l.trim_end().ends_with('\\')) {
            i += 1;
            continue;
        }
        let (mut depth, mut opened) = (0i32, false);
        while i < lines.len() {
            out.push(i);
            for c in lines[i].chars() {
                match c {
                    '{' => (depth, opened) = (depth + 1, true),
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            i += 1;
            if opened && depth <= 0 {
                break;
            }
        }
    }
    out
}

/// Whether a program belongs to the set a run of precision `tn` (`bf16`, `f32`) compiles before
/// its first step: the plain kernels, and the instantiations naming its type.
fn eager(p: &Program, tn: &str) -> bool {
    match p.label.split_once(' ') {
        None => true,
        Some((_, inst)) => inst
            .split(|c: char| !c.is_alphanumeric())
            .any(|arg| arg == tn),
    }
}

impl Kernels {
    /// Start compiling, for a device of compute capability `major.minor`, the programs a run
    /// of precision `tn` (`bf16` or `f32`) needs, on as many threads as the host has cores
    /// (NVRTC needs no CUDA context); `get` waits for a program when one of its kernels is
    /// first asked for, and compiles the others then.
    pub fn start(major: i32, minor: i32, tn: &str) -> Kernels {
        let progs = programs();
        let mut owner = HashMap::new();
        for (i, p) in progs.iter().enumerate() {
            for name in &p.names {
                owner.entry(name.clone()).or_insert(i);
            }
        }
        // The input's loaders last: a run needs one of them, and each is quick.
        let mut first: Vec<usize> = (0..progs.len()).filter(|&i| eager(&progs[i], tn)).collect();
        first.sort_by_key(|&i| progs[i].label.contains(" LOAD("));
        let first = VecDeque::from(first);
        let states = (0..progs.len())
            .map(|i| {
                if first.contains(&i) {
                    State::Queued
                } else {
                    State::Lazy
                }
            })
            .collect();
        let n = std::thread::available_parallelism()
            .map_or(4, |n| n.get())
            .min(first.len());
        let pool = Arc::new(Pool {
            states: Mutex::new(states),
            changed: Condvar::new(),
            queue: Mutex::new(first),
            stop: AtomicBool::new(false),
        });
        let threads = (0..n)
            .filter_map(|t| {
                let pool = pool.clone();
                std::thread::Builder::new()
                    .name(format!("nvrtc {t}"))
                    .spawn(move || compile_queued(&pool, major, minor))
                    .ok()
            })
            .collect();
        Kernels {
            cc: (major, minor),
            pool,
            threads,
            owner,
            fns: HashMap::new(),
            timings: Vec::new(),
        }
    }

    /// Compile and load every program now (a test of the sources; the backend loads lazily).
    #[cfg(test)]
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Self, String> {
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| format!("reading the compute capability: {e:?}"))?;
        let mut k = Kernels::start(major, minor, "bf16");
        for i in 0..programs().len() {
            k.load_program(ctx, i)?;
        }
        Ok(k)
    }

    /// How each program loaded so far was obtained.
    #[cfg(test)]
    pub fn timings(&self) -> &[UnitTiming] {
        &self.timings
    }

    /// Program `i`'s image: a compiling thread's, waited for, or compiled here.
    fn take(&self, i: usize) -> Compiled {
        let mut st = self.pool.states.lock().unwrap();
        loop {
            match std::mem::replace(&mut st[i], State::Running) {
                State::Done(c) => {
                    st[i] = State::Loaded;
                    return c;
                }
                State::Lazy | State::Queued => {
                    drop(st);
                    let c = obtain(i, &target(self.cc.0, self.cc.1), true);
                    self.pool.states.lock().unwrap()[i] = State::Loaded;
                    return c;
                }
                State::Running => st = self.pool.changed.wait(st).unwrap(),
                State::Loaded => unreachable!("program {i} is loaded once"),
            }
        }
    }

    fn load_program(&mut self, ctx: &Arc<CudaContext>, i: usize) -> Result<(), String> {
        if self
            .timings
            .iter()
            .any(|t| t.program == programs()[i].label)
        {
            return Ok(());
        }
        let p = &programs()[i];
        let t0 = Instant::now();
        let (img, mut timing, key, target) = self.take(i)?;
        timing.waited = t0.elapsed().as_secs_f64();
        let load = |img: Image| {
            ctx.load_module(match img {
                Image::Cubin(b) => Ptx::from_binary(b.to_vec()),
                Image::Ptx(t) => Ptx::from_src(t.to_string()),
            })
        };
        let module = match load(img) {
            Ok(m) => m,
            // A damaged cache file: compile again, without the caches.
            Err(_) if timing.from != "nvrtc" => {
                images().lock().unwrap().remove(&key);
                let (img, ..) = obtain(i, &target, false)?;
                load(img).map_err(|e| format!("loading {}: {e:?}", p.label))?
            }
            Err(e) => return Err(format!("loading {}: {e:?}", p.label)),
        };
        for name in &p.names {
            let f = module
                .load_function(name)
                .map_err(|e| format!("{}: no function {name}: {e:?}", p.label))?;
            self.fns.insert(name.clone(), f);
        }
        self.timings.push(timing);
        Ok(())
    }

    /// Kernel `name`, waiting for its program's compile if that is still running. A name that
    /// is in no source is a bug of the caller (a panic).
    pub fn get(&mut self, ctx: &Arc<CudaContext>, name: &str) -> Result<&CudaFunction, String> {
        if !self.fns.contains_key(name) {
            let i = *self
                .owner
                .get(name)
                .unwrap_or_else(|| panic!("kernel {name} is not in kernels/*.cu"));
            self.load_program(ctx, i)?;
        }
        Ok(&self.fns[name])
    }
}

/// A compiling thread: take queued programs until none is left (or the backend is gone).
fn compile_queued(pool: &Pool, major: i32, minor: i32) {
    let t = target(major, minor);
    while !pool.stop.load(Ordering::Relaxed) {
        let Some(i) = pool.queue.lock().unwrap().pop_front() else {
            return;
        };
        {
            let mut st = pool.states.lock().unwrap();
            // `get` may have compiled it already.
            if !matches!(st[i], State::Queued) {
                continue;
            }
            st[i] = State::Running;
        }
        let c = obtain(i, &t, true);
        pool.states.lock().unwrap()[i] = State::Done(c);
        pool.changed.notify_all();
    }
}

impl Drop for Kernels {
    /// Compiles still running finish before the process may exit (NVRTC must not be torn down
    /// under a thread); none is started after this.
    fn drop(&mut self) {
        self.pool.stop.store(true, Ordering::Relaxed);
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
        if std::env::var("PREP_TIMING").as_deref() == Ok("1") {
            for u in &self.timings {
                eprintln!(
                    "timing: kernels/{}: {:.3} s ({}), the first launch waited {:.3} s",
                    u.program, u.secs, u.from, u.waited
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// Every source compiles to the device's own machine code (nothing left for the driver to
    /// JIT-compile) and every kernel named in it loads.
    #[test]
    fn every_source_compiles_to_the_devices_machine_code_and_loads() {
        use crate::nn::cuda::{staging::Kind, Precision};
        let Some(g) = crate::nn::cuda::tests::gpu(Precision::F32, Kind::Pinned) else {
            return;
        };
        let (major, minor) = g._ctx.compute_capability().unwrap();
        assert_eq!(super::target(major, minor), format!("sm_{major}{minor}"));
        let mut k = super::Kernels::load(&g._ctx).unwrap();
        for (file, body) in super::SOURCES {
            for name in super::kernel_names(body) {
                assert!(k.get(&g._ctx, &name).is_ok(), "kernels/{file}: {name}");
            }
        }
        assert_eq!(k.timings().len(), super::programs().len());
        let images = super::images().lock().unwrap();
        assert!(!images.is_empty());
        for img in images.values() {
            match img {
                super::Image::Cubin(b) => assert!(super::looks_like_cubin(b)),
                super::Image::Ptx(_) => panic!("PTX where NVRTC knows the device"),
            }
        }
    }

    /// A cache file that is not a CUBIN (a torn write, another file) is not used.
    #[test]
    fn a_damaged_cache_file_is_not_taken_for_a_cubin() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("ops.cu-0.cubin");
        std::fs::write(&p, b"\x7fEL").unwrap();
        assert!(super::read_cached(&p, "sm_90").is_none());
        std::fs::write(&p, vec![b'x'; 4096]).unwrap();
        assert!(super::read_cached(&p, "sm_90").is_none());
        let mut elf = b"\x7fELF".to_vec();
        elf.resize(4096, 1);
        std::fs::write(&p, &elf).unwrap();
        assert!(matches!(
            super::read_cached(&p, "sm_90"),
            Some(super::Image::Cubin(_))
        ));
        assert!(super::read_cached(&t.path().join("none.cubin"), "sm_90").is_none());
    }

    /// The programs hold every kernel of the sources once, each instantiation in a program
    /// of its own without the plain kernels, and a run of one precision compiles first the
    /// programs of its type.
    #[test]
    fn the_sources_split_into_programs_that_hold_each_kernel_once() {
        let progs = super::programs();
        let mut all: Vec<String> = progs.iter().flat_map(|p| p.names.clone()).collect();
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "a kernel in two programs");
        let mut want: Vec<String> = super::SOURCES
            .iter()
            .flat_map(|(_, s)| super::kernel_names(s))
            .collect();
        want.sort();
        assert_eq!(all, want);
        let bn = progs
            .iter()
            .find(|p| p.label == "bn.cu BN_BWD(bf16, bf16, 8)");
        assert_eq!(
            bn.unwrap().names,
            ["bn_bwd_stats_bf16_v8", "bn_bwd_apply_bf16_v8"]
        );
        let bn = bn.unwrap();
        assert!(!bn.body.contains("void bn_finalize("), "{}", bn.body);
        let plain = progs.iter().find(|p| p.label == "bn.cu").unwrap();
        assert!(plain.names.contains(&"bn_finalize".to_string()));
        assert!(
            plain.names.iter().all(|n| !n.contains("_v8")),
            "{:?}",
            plain.names
        );
        // Every source is more than one program.
        assert!(progs.len() >= 2 * super::SOURCES.len(), "{}", progs.len());
        let eager = |tn| progs.iter().filter(|p| super::eager(p, tn)).count();
        assert!(super::eager(bn, "bf16") && !super::eager(bn, "f32"));
        assert!(super::eager(plain, "bf16") && super::eager(plain, "f32"));
        assert!(eager("bf16") < progs.len() && eager("f32") < progs.len());
    }

    #[test]
    fn every_instantiated_kernel_is_found() {
        let names: Vec<String> = super::SOURCES
            .iter()
            .flat_map(|(_, s)| super::kernel_names(s))
            .collect();
        for n in [
            "load_u8_f32_v1",
            "load_u16_bf16_v8",
            "load_f16_bf16_v8",
            "load_f16_f32_v1",
            "load_f32_bf16_v1",
            "load_f32_f32_v8",
            "bn_stats_bf16_v8",
            "bn_stats_f32_v1",
            "bn_finalize",
            "bn_sync_pack",
            "bn_sync_finalize",
            "bn_bwd_sync_pack",
            "bn_bwd_sync_finalize",
            "bn_bwd_apply_f32_v8",
            "maxpool_f32_v1",
            "maxpool_bwd_bf16_v8",
            "add_f32_v8",
            "add_bf16_v1",
            "accumulate_f32_v1",
            "accumulate_bf16_v8",
            "gap_f32",
            "wpack_bf16",
            "wunpack_f32",
            "cast_f32_bf16",
            "softmax_xent",
            "sgd",
            "channel_copy_bf16_v8",
            "channel_copy_f32_v1",
            "upsample_f32_v1",
            "upsample_bwd_bf16_v8",
            "bias_f32_v8",
            "bias_bwd_part_bf16",
            "bias_bwd_finalize",
        ] {
            assert!(names.contains(&n.to_string()), "{n} missing from {names:?}");
        }
        assert!(
            names.iter().all(|n| !n.contains('#')),
            "a macro's name was not expanded: {names:?}"
        );
    }
}
