//! What a host's GPUs are: how many, their memory, whether the libraries load, and one line that
//! names a device for the run's report.

use super::*;

/// (free, total) bytes of the current device.
pub fn mem_info() -> Result<(usize, usize), String> {
    dr::mem_get_info().map_err(|e| format!("cuMemGetInfo: {e:?}"))
}

/// GPUs the CUDA driver sees (after CUDA_VISIBLE_DEVICES); an error when there is no driver.
pub fn device_count() -> Result<usize, String> {
    unsafe {
        if !sys::is_culib_present() {
            return Err("no NVIDIA driver found (libcuda.so could not be loaded)".into());
        }
    }
    dr::init().map_err(|e| format!("the CUDA driver did not start: {e:?}"))?;
    let count = CudaContext::device_count()
        .map_err(|e| format!("the CUDA driver found no devices: {e:?}"))?;
    Ok(count.max(0) as usize)
}

/// Whether the run-time library `name` (as cudarc names it) can be loaded. It stays loaded, so
/// that cudarc's own load later finds it in place (a check that closed it again made the dynamic
/// linker map and relocate cuBLAS, cuDNN and NVRTC once per check).
fn library_present(name: &str) -> bool {
    cudarc::get_lib_name_candidates(name).iter().any(|n| {
        let Ok(c) = std::ffi::CString::new(n.as_str()) else {
            return false;
        };
        // The flags libloading (cudarc's loader) uses, so both refer to the same load.
        !unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) }.is_null()
    })
}

/// NVRTC, cuBLAS and cuDNN, looked for once per process (on their own thread while the driver
/// starts: loading them is a good part of a first run's start).
fn libraries() -> &'static Result<(), String> {
    static LIBS: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    LIBS.get_or_init(|| {
        let nvrtc = std::thread::spawn(|| library_present("nvrtc"));
        let cudnn = std::thread::spawn(|| library_present("cudnn"));
        if !library_present("cublas") {
            return Err("cuBLAS (libcublas.so) is not installed".into());
        }
        if !nvrtc.join().unwrap_or(false) {
            return Err("NVRTC (libnvrtc.so) is not installed; it compiles prep's kernels".into());
        }
        if !cudnn.join().unwrap_or(false) {
            return Err("cuDNN (libcudnn.so) is not installed".into());
        }
        Ok(())
    })
}

/// Whether CUDA training can run on device `ordinal`: the driver, a device, NVRTC, cuBLAS and
/// cuDNN. Ok(device name) or Err(why not), in words a user can act on.
pub fn probe(ordinal: usize) -> Result<String, String> {
    // The libraries load while the driver starts (where there is a driver at all).
    let libs = unsafe { sys::is_culib_present() }.then(|| std::thread::spawn(libraries));
    let count = device_count()?;
    if count == 0 {
        return Err("the CUDA driver reports no GPU".into());
    }
    if ordinal >= count {
        return Err(format!(
            "there is no GPU {ordinal}: the driver reports {count} (cuda:0 to cuda:{})",
            count - 1
        ));
    }
    match libs.map(|t| t.join()) {
        Some(Ok(r)) => r.clone()?,
        _ => return Err("looking for the CUDA libraries failed".into()),
    }
    let dev = dr::device::get(ordinal as i32).map_err(|e| format!("{e:?}"))?;
    let name = dr::device::get_name(dev).map_err(|e| format!("{e:?}"))?;
    let (major, minor) = compute_capability(ordinal)?;
    if major < 8 {
        return Err(format!(
            "{name} has compute capability {major}.{minor}; prep's CUDA backend needs 8.0 or newer (bfloat16)"
        ));
    }
    Ok(name)
}

/// Device `ordinal`'s compute capability, without a context.
pub(super) fn compute_capability(ordinal: usize) -> Result<(i32, i32), String> {
    let dev = dr::device::get(ordinal as i32).map_err(|e| format!("{e:?}"))?;
    unsafe {
        use sys::CUdevice_attribute::*;
        Ok((
            dr::device::get_attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
                .map_err(|e| format!("{e:?}"))?,
            dr::device::get_attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
                .map_err(|e| format!("{e:?}"))?,
        ))
    }
}
