//! The own kernels (`kernels/*.cu`), compiled by NVRTC to the device's own machine code (a
//! CUBIN for `sm_XY`, so the driver has nothing to JIT-compile), one thread per source, started
//! before the CUDA context exists and waited for only when a source's first kernel launches. The
//! images are kept per process and on disk (keyed by source, target and NVRTC version), so later
//! runs skip the compiler; neither cache is needed for speed or correctness.

use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{sys as nv, Ptx};
use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;

const COMMON: &str = include_str!("../../../kernels/common.cuh");
const SOURCES: [(&str, &str); 4] = [
    ("input.cu", include_str!("../../../kernels/input.cu")),
    ("bn.cu", include_str!("../../../kernels/bn.cu")),
    ("ops.cu", include_str!("../../../kernels/ops.cu")),
    ("loss.cu", include_str!("../../../kernels/loss.cu")),
];

/// A compiled source: machine code for the device (CUBIN), or PTX where this NVRTC cannot
/// target the device's architecture (then the driver compiles it).
#[derive(Clone)]
enum Image {
    Cubin(Arc<Vec<u8>>),
    Ptx(Arc<String>),
}

/// How a source's image was obtained, for PREP_TIMING.
#[derive(Clone, Debug)]
pub struct UnitTiming {
    pub file: &'static str,
    /// Seconds from the start of its thread to an image in hand.
    pub secs: f64,
    /// `nvrtc`, `disk` or `process`.
    pub from: &'static str,
    /// Seconds the first launch of one of its kernels waited for it.
    pub waited: f64,
}

/// An image, how it was obtained, its cache key and its NVRTC target.
type Compiled = Result<(Image, UnitTiming, u64, String), String>;

struct Unit {
    pending: Option<JoinHandle<Compiled>>,
    loaded: bool,
}

/// Every `extern "C" __global__` function of the sources, by name, loaded as its source's
/// compile finishes.
pub struct Kernels {
    /// The device's compute capability.
    cc: (i32, i32),
    units: Vec<Unit>,
    /// Kernel name to its unit.
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
                let text = String::from_utf8_lossy(&b).trim_end_matches('\0').to_string();
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
    let b = std::fs::read(p).ok()?;
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

/// The image of one source: this process's, the disk cache's, or NVRTC's.
fn obtain(file: &'static str, body: &str, key: u64, target: &str, disk: bool) -> Compiled {
    let t0 = Instant::now();
    let timing = |from| UnitTiming {
        file,
        secs: t0.elapsed().as_secs_f64(),
        from,
        waited: 0.0,
    };
    if let Some(img) = images().lock().unwrap().get(&key).cloned() {
        return Ok((img, timing("process"), key, target.into()));
    }
    let cached = cache_path(file, key, target);
    if disk {
        if let Some(img) = cached.as_ref().and_then(|p| read_cached(p, target)) {
            images().lock().unwrap().insert(key, img.clone());
            return Ok((img, timing("disk"), key, target.into()));
        }
    }
    let img = nvrtc_compile(file, &format!("{COMMON}\n{body}"), target)?;
    if let Some(p) = &cached {
        write_cached(p, &img);
    }
    images().lock().unwrap().insert(key, img.clone());
    Ok((img, timing("nvrtc"), key, target.into()))
}

/// The target, key and image of source `i` (on its own thread).
fn unit(i: usize, major: i32, minor: i32) -> Compiled {
    let (file, body) = SOURCES[i];
    let t = target(major, minor);
    let key = xxhash_rust::xxh3::xxh3_64(
        format!("{t} {}\n{COMMON}\n{body}", nvrtc_version()).as_bytes(),
    );
    obtain(file, body, key, &t, true)
}

impl Kernels {
    /// Start compiling every source for a device of compute capability `major.minor`, each on
    /// its own thread (NVRTC needs no CUDA context); `get` waits for a source when one of its
    /// kernels is first asked for.
    pub fn start(major: i32, minor: i32) -> Kernels {
        let mut units = Vec::new();
        let mut owner = HashMap::new();
        for (i, (file, body)) in SOURCES.into_iter().enumerate() {
            for name in kernel_names(body) {
                owner.insert(name, i);
            }
            let pending = std::thread::Builder::new()
                .name(format!("nvrtc {file}"))
                .spawn(move || unit(i, major, minor))
                .ok();
            units.push(Unit {
                pending,
                loaded: false,
            });
        }
        Kernels {
            cc: (major, minor),
            units,
            owner,
            fns: HashMap::new(),
            timings: Vec::new(),
        }
    }

    /// Compile and load every source now (a test of the sources; the backend loads lazily).
    #[cfg(test)]
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Self, String> {
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| format!("reading the compute capability: {e:?}"))?;
        let mut k = Kernels::start(major, minor);
        for i in 0..k.units.len() {
            k.load_unit(ctx, i)?;
        }
        Ok(k)
    }

    /// How each source loaded so far was obtained.
    pub fn timings(&self) -> &[UnitTiming] {
        &self.timings
    }

    fn load_unit(&mut self, ctx: &Arc<CudaContext>, i: usize) -> Result<(), String> {
        if self.units[i].loaded {
            return Ok(());
        }
        let (file, body) = SOURCES[i];
        let t0 = Instant::now();
        let got = match self.units[i].pending.take() {
            Some(h) => h
                .join()
                .unwrap_or_else(|_| Err(format!("compiling kernels/{file}: the thread panicked"))),
            // No thread could be started: compile here.
            None => unit(i, self.cc.0, self.cc.1),
        };
        let (img, mut timing, key, target) = got?;
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
                let (img, ..) = obtain(file, body, key, &target, false)?;
                load(img).map_err(|e| format!("loading kernels/{file}: {e:?}"))?
            }
            Err(e) => return Err(format!("loading kernels/{file}: {e:?}")),
        };
        for name in kernel_names(body) {
            let f = module
                .load_function(&name)
                .map_err(|e| format!("kernels/{file}: no function {name}: {e:?}"))?;
            self.fns.insert(name, f);
        }
        self.units[i].loaded = true;
        self.timings.push(timing);
        Ok(())
    }

    /// Kernel `name`, waiting for its source's compile if that is still running. A name that is
    /// in no source is a bug of the caller (a panic).
    pub fn get(&mut self, ctx: &Arc<CudaContext>, name: &str) -> Result<&CudaFunction, String> {
        if !self.fns.contains_key(name) {
            let i = *self
                .owner
                .get(name)
                .unwrap_or_else(|| panic!("kernel {name} is not in kernels/*.cu"));
            self.load_unit(ctx, i)?;
        }
        Ok(&self.fns[name])
    }
}

impl Drop for Kernels {
    /// Compiles still running finish before the process may exit (NVRTC must not be torn down
    /// under a thread).
    fn drop(&mut self) {
        for u in &mut self.units {
            if let Some(h) = u.pending.take() {
                let _ = h.join();
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
        assert_eq!(k.timings().len(), super::SOURCES.len());
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
        assert!(matches!(super::read_cached(&p, "sm_90"), Some(super::Image::Cubin(_))));
        assert!(super::read_cached(&t.path().join("none.cubin"), "sm_90").is_none());
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
        ] {
            assert!(names.contains(&n.to_string()), "{n} missing from {names:?}");
        }
        assert!(
            names.iter().all(|n| !n.contains('#')),
            "a macro's name was not expanded: {names:?}"
        );
    }
}
