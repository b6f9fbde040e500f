//! The own kernels (`kernels/*.cu`), compiled by NVRTC for the device's architecture once per
//! process, and the compiled PTX cached on disk (keyed by source, architecture and NVRTC version),
//! so later runs skip the compiler.

use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

const COMMON: &str = include_str!("../../../kernels/common.cuh");
const SOURCES: [(&str, &str); 4] = [
    ("input.cu", include_str!("../../../kernels/input.cu")),
    ("bn.cu", include_str!("../../../kernels/bn.cu")),
    ("ops.cu", include_str!("../../../kernels/ops.cu")),
    ("loss.cu", include_str!("../../../kernels/loss.cu")),
];

/// Every `extern "C" __global__` function of the sources, by name.
pub struct Kernels {
    fns: HashMap<String, CudaFunction>,
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

impl Kernels {
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Self, String> {
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| format!("reading the compute capability: {e:?}"))?;
        let arch = format!("compute_{major}{minor}");
        let nvrtc = unsafe {
            let (mut a, mut b) = (0, 0);
            cudarc::nvrtc::sys::nvrtcVersion(&mut a, &mut b);
            format!("{a}.{b}")
        };
        let mut fns = HashMap::new();
        for (file, body) in SOURCES {
            let src = format!("{COMMON}\n{body}");
            let key = xxhash_rust::xxh3::xxh3_64(format!("{arch} {nvrtc}\n{src}").as_bytes());
            let cached = cache_dir().map(|d| d.join(format!("{file}-{key:016x}.ptx")));
            let ptx = match cached
                .as_ref()
                .and_then(|p| std::fs::read_to_string(p).ok())
            {
                Some(text) => Ptx::from_src(text),
                None => {
                    let opts = CompileOptions {
                        options: vec![format!("--gpu-architecture={arch}"), "-std=c++17".into()],
                        name: Some(file.into()),
                        ..Default::default()
                    };
                    let ptx = compile_ptx_with_opts(&src, opts)
                        .map_err(|e| format!("NVRTC could not compile kernels/{file}: {e}"))?;
                    if let Some(p) = &cached {
                        // A cache that cannot be written only costs the next run a compile.
                        let _ = std::fs::create_dir_all(p.parent().unwrap());
                        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
                        if std::fs::write(&tmp, ptx.to_src()).is_ok() {
                            let _ = std::fs::rename(&tmp, p);
                        }
                    }
                    ptx
                }
            };
            let module = ctx
                .load_module(ptx)
                .map_err(|e| format!("loading kernels/{file}: {e:?}"))?;
            for name in kernel_names(body) {
                let f = module
                    .load_function(&name)
                    .map_err(|e| format!("kernels/{file}: no function {name}: {e:?}"))?;
                fns.insert(name, f);
            }
        }
        Ok(Kernels { fns })
    }

    pub fn get(&self, name: &str) -> &CudaFunction {
        self.fns
            .get(name)
            .unwrap_or_else(|| panic!("kernel {name} is not in kernels/*.cu"))
    }
}

#[cfg(test)]
mod tests {
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
