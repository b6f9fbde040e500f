//! The CUDA backend: the `Backend` trait on an NVIDIA GPU, through cudarc (driver, NVRTC, cuDNN,
//! cuBLAS, all loaded at run time). Convolutions are cuDNN's (NCHW, the algorithm measured fastest
//! per shape), the linear layer is cuBLAS, everything else is our kernels in `kernels/*.cu`.
//!
//! Precision: `F32` is plain float32 everywhere (FMA convolutions, no TF32): the mode tested op by
//! op against the CPU reference. `Bf16` is mixed precision: activations and their gradients are
//! bfloat16, convolutions run on tensor cores, and weights, their gradients, momentum, batch-norm
//! statistics, the loss and every reduction stay float32 (the master copy; conv weights are cast
//! to bfloat16 for each use).
//!
//! All work goes to one compute stream in order; nothing waits for the GPU except `download`,
//! `argmax` and `take_loss_stats`. A CUDA failure is kept (the first one) and reported by
//! `status`; the ops after it do nothing.

mod dnn;
mod kernels;
pub mod nccl;
pub mod staging;
#[cfg(test)]
pub(crate) mod tests;

use super::{Aug, Backend, ConvShape, PoolShape, RawBatch};
use cudarc::cublas::sys as blas;
use cudarc::cudnn::sys as cudnn;
use cudarc::driver::{result as dr, sys, CudaContext, CudaStream};
use std::ffi::c_void;
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    F32,
    Bf16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dt {
    F32,
    Bf16,
    U8,
    U32,
    F64,
}

impl Dt {
    fn size(self) -> usize {
        match self {
            Dt::F32 | Dt::U32 => 4,
            Dt::Bf16 => 2,
            Dt::U8 => 1,
            Dt::F64 => 8,
        }
    }
    fn suffix(self) -> &'static str {
        match self {
            Dt::F32 => "f32",
            Dt::Bf16 => "bf16",
            d => panic!("no kernels for {d:?} tensors"),
        }
    }
}

/// A tensor in GPU memory: `len` elements of `dt`, in an allocation of `cap` bytes that only
/// grows.
pub struct Buf {
    ptr: u64,
    len: usize,
    cap: usize,
    dt: Dt,
    /// For an activation: its shape, stored NHWC. `download` gives it back NCHW.
    act: Option<Nhwc>,
    stream: sys::CUstream,
}

/// An activation [n, c, h, w] stored as [n, h, w, cs]: channels last, with `cs - c` zero
/// channels after the real ones (the input's padding to an aligned channel count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nhwc {
    pub n: usize,
    pub c: usize,
    pub hw: usize,
    pub cs: usize,
}

impl Nhwc {
    fn of(n: usize, c: usize, hw: usize) -> Self {
        Nhwc { n, c, hw, cs: c }
    }
}

/// Buffers are plain cuMemAlloc allocations (not the stream-ordered pool, whose cached chunks
/// made the memory in use depend on the history of allocations), made once and only grown; a
/// free waits for the stream to drain.
unsafe fn free_buf(ptr: u64, stream: sys::CUstream) {
    let _ = sys::cuStreamSynchronize(stream);
    let _ = dr::free_sync(ptr);
}

impl Buf {
    /// No memory yet; `Cuda::ensure` allocates.
    fn unallocated(dt: Dt, stream: sys::CUstream) -> Self {
        Buf {
            ptr: 0,
            len: 0,
            cap: 0,
            dt,
            act: None,
            stream,
        }
    }
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn dt(&self) -> Dt {
        self.dt
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        if self.cap > 0 {
            unsafe { free_buf(self.ptr, self.stream) };
        }
    }
}

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
fn compute_capability(ordinal: usize) -> Result<(i32, i32), String> {
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

struct Scratch {
    part: Buf,
    scale: Buf,
    shift: Buf,
    coef: Buf,
    /// A convolution's weights and their gradient as cuDNN reads and writes them.
    wpk: Buf,
    dwpk: Buf,
    workspace: Buf,
    idx: Buf,
    /// Synchronised batch norm's packed sums: this rank's, then the world's (doubles).
    sync: Buf,
}

impl Scratch {
    fn empty(stream: sys::CUstream) -> Self {
        let e = |dt| Buf::unallocated(dt, stream);
        Scratch {
            part: e(Dt::F32),
            scale: e(Dt::F32),
            shift: e(Dt::F32),
            coef: e(Dt::F32),
            wpk: e(Dt::Bf16),
            dwpk: e(Dt::Bf16),
            workspace: e(Dt::U8),
            idx: e(Dt::U32),
            sync: e(Dt::F32),
        }
    }
}

pub struct Cuda {
    // Fields drop in this order: buffers, ring and library handles before the streams, and the
    // context last.
    /// The data-parallel world's communicator (`join_world`), if this is one of several ranks.
    comm: Option<nccl::Comm>,
    stats: Buf,
    s: Scratch,
    ring: staging::Ring,
    dnn: dnn::Dnn,
    memo: dnn::AlgoMemo,
    k: kernels::Kernels,
    prec: Precision,
    err: Option<String>,
    sms: u32,
    /// How the input's channels are padded (`input_channels`).
    pad_input: usize,
    /// prep's own GPU allocations (bytes), beside what the driver and libraries hold.
    pub allocated: usize,
    /// The learning rate the SGD kernel reads (set before each step or replay).
    lr_buf: Buf,
    /// Captured training step: (graph, its executable, the allocation generation it saw).
    graph: Option<(sys::CUgraph, sys::CUgraphExec, u64)>,
    capturing: bool,
    /// Bumped whenever a buffer moves: a graph recorded before holds stale addresses.
    generation: u64,
    graphs: bool,
    /// Batch-norm statistics over the whole world's batch (`set_sync_bn`).
    sync_bn: bool,
    /// The pointer tables of `sgd_step_many`, by content.
    sgd_tables: Vec<(Vec<u64>, Buf)>,
    /// With PREP_PROFILE=1: GPU time per kernel, measured with events around each launch.
    prof: Option<Profile>,
    /// When `new` finished each of its steps (seconds from its start), for PREP_TIMING.
    times: Vec<(&'static str, f64)>,
    /// PREP_TIMING=1: say where a run's start goes (and the algorithm picks).
    timing: bool,
    /// PREP_CUDNN_TUNE=1: time the candidate algorithms of a shape without a remembered pick.
    pub(crate) tune_by_timing: bool,
    copy: Arc<CudaStream>,
    stream: Arc<CudaStream>,
    /// Held so that the context outlives every buffer and handle.
    _ctx: Arc<CudaContext>,
}

/// GPU time per kernel name, for finding where a step's time goes (PREP_PROFILE=1).
#[derive(Default)]
struct Profile {
    pending: Vec<(String, sys::CUevent, sys::CUevent)>,
    totals: std::collections::BTreeMap<String, (f64, u64)>,
}

impl Profile {
    fn begin(&mut self, stream: sys::CUstream) -> sys::CUevent {
        let mut e = std::ptr::null_mut();
        unsafe {
            sys::cuEventCreate(&mut e, 0);
            sys::cuEventRecord(e, stream);
        }
        e
    }
    fn end(&mut self, name: &str, start: sys::CUevent, stream: sys::CUstream) {
        let mut e = std::ptr::null_mut();
        unsafe {
            sys::cuEventCreate(&mut e, 0);
            sys::cuEventRecord(e, stream);
        }
        self.pending.push((name.to_string(), start, e));
    }
    /// After the stream has drained.
    fn collect(&mut self) {
        for (name, a, b) in self.pending.drain(..) {
            let mut ms = 0f32;
            unsafe {
                sys::cuEventElapsedTime_v2(&mut ms, a, b);
                sys::cuEventDestroy_v2(a);
                sys::cuEventDestroy_v2(b);
            }
            let t = self.totals.entry(name).or_default();
            t.0 += ms as f64;
            t.1 += 1;
        }
    }
    fn report(&self) {
        let all: f64 = self.totals.values().map(|t| t.0).sum();
        let mut v: Vec<_> = self.totals.iter().collect();
        v.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
        eprintln!("GPU time by kernel (PREP_PROFILE): {all:.1} ms in all");
        for (name, (ms, n)) in v {
            eprintln!(
                "  {name:<28} {ms:>10.2} ms {n:>8} calls {:>8.1} us/call",
                ms * 1000.0 / *n as f64
            );
        }
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        let _ = self.stream.synchronize();
        self.drop_graph();
        if let Some(p) = &mut self.prof {
            let _ = self.stream.synchronize();
            p.collect();
            p.report();
        }
    }
}

const THREADS: u32 = 256;
/// Threads of a block of the batch-norm kernels (BN_THREADS in kernels/bn.cu).
const BN_THREADS: u32 = 256;

/// How the batch-norm kernels split `m` rows of `c` channels: `v` channels per thread, `gb`
/// channel groups per block, `cb` blocks across the channels, and the row splits of the
/// reductions (`stats`, whose partial sums are then added in order) and of the elementwise
/// passes (`apply`).
struct BnGrid {
    v: usize,
    gb: usize,
    cb: usize,
    stats: usize,
    apply: usize,
}

/// Channels a thread of the NHWC kernels handles at once: 8 (16-byte accesses) where rows allow.
fn vec_width(c: usize) -> usize {
    if c % 8 == 0 {
        8
    } else {
        1
    }
}

/// NCHW values of an activation stored NHWC (dropping padded channels).
fn nhwc_to_nchw(v: &[f32], a: Nhwc) -> Vec<f32> {
    let mut out = vec![0.0; a.n * a.c * a.hw];
    for s in 0..a.n {
        for p in 0..a.hw {
            for ch in 0..a.c {
                out[(s * a.c + ch) * a.hw + p] = v[(s * a.hw + p) * a.cs + ch];
            }
        }
    }
    out
}

/// NHWC values (no padding) of an NCHW activation.
fn nchw_to_nhwc(v: &[f32], a: Nhwc) -> Vec<f32> {
    let mut out = vec![0.0; a.n * a.c * a.hw];
    for s in 0..a.n {
        for p in 0..a.hw {
            for ch in 0..a.c {
                out[(s * a.hw + p) * a.c + ch] = v[(s * a.c + ch) * a.hw + p];
            }
        }
    }
    out
}

/// Blocks of `per` threads for one thread per item, for kernels without a grid-stride loop: at
/// least 1 (an empty grid is a launch error), and no more than CUDA's x limit.
fn blocks(items: usize, per: u32) -> u32 {
    items.div_ceil(per as usize).clamp(1, i32::MAX as usize) as u32
}
/// Timing of candidate convolution algorithms: rounds, and runs per candidate in a round (one
/// round of three runs let noise pick differently from one process to the next).
const TUNE_ROUNDS: usize = 3;
const TUNE_RUNS: usize = 5;

/// Raw kernel arguments: each expression's address, valid until the end of the statement that
/// launches (temporaries live that long).
macro_rules! launch {
    ($self:ident, $name:expr, $grid:expr, $block:expr; $($a:expr),* $(,)?) => {
        $self.launch_raw($name, $grid, $block, &mut [$( &$a as *const _ as *mut c_void ),*])
    };
}

impl Cuda {
    pub fn new(ordinal: usize, prec: Precision, staging: staging::Kind) -> Result<Self, String> {
        let t0 = std::time::Instant::now();
        let mut times = Vec::new();
        let mut mark = |what: &'static str| times.push((what, t0.elapsed().as_secs_f64()));
        let gpu = probe(ordinal)?;
        mark("probe");
        // The kernels compile (NVRTC needs no context) while the context and the libraries'
        // handles are made, and later the data loads: the first launch of a source's kernel waits.
        let (major, minor) = compute_capability(ordinal)?;
        let tn = if prec == Precision::Bf16 {
            "bf16"
        } else {
            "f32"
        };
        let k = kernels::Kernels::start(major, minor, tn);
        let ctx =
            CudaContext::new(ordinal).map_err(|e| format!("creating a CUDA context: {e:?}"))?;
        mark("context");
        // We order work ourselves (one compute stream, events for the copies).
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(|e| format!("{e:?}"))?;
        let copy = ctx.new_stream().map_err(|e| format!("{e:?}"))?;
        // cuDNN's and cuBLAS's handles (each loads its library's state) on their own threads.
        let dnn = dnn::Dnn::new(&ctx, stream.cu_stream())?;
        mark("cudnn+cublas");
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| format!("{e:?}"))? as u32;
        let ring = staging::Ring::new(&ctx, staging, 3)?;
        let cs = stream.cu_stream();
        let mut me = Cuda {
            sgd_tables: Vec::new(),
            sync_bn: false,
            lr_buf: Buf::unallocated(Dt::F32, cs),
            graph: None,
            capturing: false,
            generation: 0,
            graphs: std::env::var("PREP_PROFILE").as_deref() != Ok("1")
                && std::env::var("PREP_NO_GRAPHS").as_deref() != Ok("1"),
            prof: (std::env::var("PREP_PROFILE").as_deref() == Ok("1")).then(Profile::default),
            comm: None,
            _ctx: ctx,
            copy,
            k,
            dnn,
            memo: dnn::AlgoMemo::open(kernels::cache_dir(), &gpu),
            times,
            timing: std::env::var("PREP_TIMING").as_deref() == Ok("1"),
            tune_by_timing: std::env::var("PREP_CUDNN_TUNE").as_deref() == Ok("1"),
            prec,
            err: None,
            stats: Buf::unallocated(Dt::F64, cs),
            s: Scratch::empty(cs),
            ring,
            sms,
            pad_input: match std::env::var("PREP_PAD_INPUT").as_deref() {
                Ok("0") => 0,
                Ok("4") => 4,
                _ => 8,
            },
            allocated: 0,
            stream,
        };
        let mut stats = me.empty(Dt::F64);
        me.ensure(&mut stats, 2, Dt::F64);
        me.memset0(&stats);
        me.stats = stats;
        let mut lr = me.empty(Dt::F32);
        me.ensure(&mut lr, 1, Dt::F32);
        me.lr_buf = lr;
        me.status()?;
        Ok(me)
    }

    pub fn precision(&self) -> Precision {
        self.prec
    }

    pub fn act_dt(&self) -> Dt {
        match self.prec {
            Precision::F32 => Dt::F32,
            Precision::Bf16 => Dt::Bf16,
        }
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Join a data-parallel world of `size` ranks as `rank` (`id`: rank 0's NCCL unique id):
    /// from now on `all_reduce_grads` averages the gradients across the ranks. Returns once all
    /// ranks have joined. Steps are still recorded as graphs with their all-reduces in them
    /// (NCCL supports stream capture): short steps are bound by launches without them.
    pub fn join_world(&mut self, rank: usize, size: usize, id: &[u8]) -> Result<(), String> {
        self._ctx
            .bind_to_thread()
            .map_err(|e| format!("making the CUDA context current: {e:?}"))?;
        self.comm = Some(nccl::Comm::new(rank, size, id)?);
        Ok(())
    }

    /// Batch norm in training takes its statistics over every rank's batch, as PyTorch's
    /// SyncBatchNorm (two small all-reduces per layer and step); off, each rank normalises by
    /// its own batch, as PyTorch DDP does by default. With one rank both compute the same.
    pub fn set_sync_bn(&mut self, on: bool) {
        self.sync_bn = on;
    }

    /// Synchronised batch norm's sums: `pack` (a `bn_*sync_pack` kernel) reduces the S partial
    /// sums of `part` to this rank's per-channel pairs and row count in `sync` (doubles), and the
    /// world's sum of them lands behind them. Returns (this rank's, the world's); with one rank
    /// both are this rank's.
    fn world_sums(
        &mut self,
        pack: &str,
        part: u64,
        sp: i32,
        c: usize,
        m: usize,
        sync: u64,
    ) -> (u64, u64) {
        let len = 2 * c + 1;
        let (mine, tot) = (sync, sync + 8 * len as u64);
        launch!(self, pack, (blocks(c * 32, THREADS), 1), THREADS; part, sp, c as i32, m as i64, mine);
        let Some(comm) = &self.comm else {
            return (mine, mine);
        };
        if let Err(e) = comm.sum_f64(mine, tot, len, self.stream.cu_stream()) {
            self.fail(e);
        }
        (mine, tot)
    }

    pub fn staging_kind(&self) -> staging::Kind {
        self.ring.kind()
    }

    fn fail(&mut self, e: String) {
        if self.err.is_none() {
            self.err = Some(e);
        }
    }

    fn ok<T>(&mut self, r: Result<T, String>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.fail(e);
                None
            }
        }
    }

    pub fn empty(&self, dt: Dt) -> Buf {
        Buf::unallocated(dt, self.stream.cu_stream())
    }

    /// Make `b` hold `len` elements of `dt`, growing its allocation if needed.
    pub fn ensure(&mut self, b: &mut Buf, len: usize, dt: Dt) -> bool {
        let bytes = (len * dt.size()).max(1);
        if b.cap < bytes && self.capturing {
            self.fail("an allocation while recording a graph".into());
            return false;
        }
        if b.cap < bytes {
            if b.cap > 0 {
                unsafe { free_buf(b.ptr, b.stream) };
                self.allocated -= b.cap;
                b.cap = 0;
                self.generation += 1;
            }
            let r = unsafe { dr::malloc_sync(bytes) };
            match r {
                Ok(p) => {
                    b.ptr = p;
                    b.cap = bytes;
                    self.allocated += bytes;
                }
                Err(e) => {
                    self.fail(format!("allocating {bytes} bytes of GPU memory: {e:?}"));
                    b.len = 0;
                    return false;
                }
            }
        }
        b.len = len;
        b.dt = dt;
        b.act = None;
        b.stream = self.stream.cu_stream();
        true
    }

    fn memset0(&mut self, b: &Buf) {
        if b.cap == 0 {
            return;
        }
        let r =
            unsafe { dr::memset_d8_async(b.ptr, 0, b.len * b.dt.size(), self.stream.cu_stream()) };
        let _ = self.ok(r.map_err(|e| format!("cuMemsetD8Async: {e:?}")));
    }

    /// The grid of the per-sample kernels (SAMPLE_STRIDE / ITEM_STRIDE in kernels/common.cuh):
    /// y over the `n` samples, x over the `per` items of one sample, about 32 blocks of
    /// THREADS per multiprocessor in all.
    fn sample_grid(&self, n: usize, per: usize) -> (u32, u32) {
        assert!(
            per <= i32::MAX as usize,
            "{per} values in one sample: more than 2^31"
        );
        let y = n.clamp(1, 65535);
        let most = (32 * self.sms as usize / y).max(1);
        (
            per.div_ceil(THREADS as usize).clamp(1, most) as u32,
            y as u32,
        )
    }

    fn grid(&self, total: usize) -> u32 {
        (total.div_ceil(THREADS as usize) as u64).clamp(1, self.sms as u64 * 16) as u32
    }

    /// Channels as the y dimension of a grid (the batch-norm reductions), which CUDA caps at
    /// 65535; false (and the backend failed) beyond.
    fn grid_y_fits(&mut self, c: usize, what: &str) -> bool {
        if c > 65535 {
            self.fail(format!(
                "{what}: {c} is more than the 65535 a CUDA grid's y allows"
            ));
            return false;
        }
        true
    }

    fn launch_raw(&mut self, name: &str, grid: (u32, u32), block: u32, args: &mut [*mut c_void]) {
        if self.err.is_some() {
            return;
        }
        let f = match self.k.get(&self._ctx, name) {
            Ok(f) => f.cu_function(),
            Err(e) => return self.fail(e),
        };
        let st = self.stream.cu_stream();
        let t0 = self.prof.as_mut().map(|p| p.begin(st));
        let r = unsafe { dr::launch_kernel(f, (grid.0, grid.1, 1), (block, 1, 1), 0, st, args) };
        if let (Some(p), Some(t0)) = (self.prof.as_mut(), t0) {
            p.end(name, t0, st);
        }
        if let Err(e) = r {
            self.fail(format!("launching {name}: {e:?}"));
        }
    }

    /// Copy host values into `b` (resized to fit) in stream order.
    pub fn upload_into<T: Copy>(&mut self, b: &mut Buf, data: &[T], dt: Dt) {
        assert_eq!(std::mem::size_of::<T>(), dt.size());
        if self.capturing {
            // A graph would replay a copy from host memory that is gone by then.
            self.fail("a copy from the host while recording a graph".into());
            return;
        }
        if !self.ensure(b, data.len(), dt) || data.is_empty() {
            return;
        }
        // Pageable source: the driver stages it before returning, so `data` may go right after.
        let r = unsafe { dr::memcpy_htod_async(b.ptr, data, self.stream.cu_stream()) };
        let _ = self.ok(r.map_err(|e| format!("copying to the GPU: {e:?}")));
    }

    fn set_lr(&mut self, lr: f32) {
        let r = unsafe {
            sys::cuMemsetD32Async(self.lr_buf.ptr, lr.to_bits(), 1, self.stream.cu_stream())
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            self.fail(format!("setting the learning rate: {r:?}"));
        }
    }

    /// Wait for every queued operation; the first failure, if any.
    pub fn synchronize(&mut self) -> Result<(), String> {
        self.sync();
        self.status()
    }

    fn sync(&mut self) {
        if let Err(e) = self.stream.synchronize() {
            self.fail(format!("the GPU failed: {e:?}"));
        }
    }

    fn read_back<T: Copy + Default>(&mut self, ptr: u64, len: usize) -> Vec<T> {
        let mut out = vec![T::default(); len];
        if self.err.is_some() || len == 0 {
            return out;
        }
        let r = unsafe { dr::memcpy_dtoh_async(&mut out, ptr, self.stream.cu_stream()) };
        if let Err(e) = r {
            self.fail(format!("copying from the GPU: {e:?}"));
        }
        self.sync();
        if let Some(p) = &mut self.prof {
            p.collect();
        }
        out
    }

    /// Channels the input batch is stored with. Convolutions run on tensor cores with a channel
    /// count that is a multiple of 8 (4 is enough for a stride-2 first layer, NVIDIA's guide
    /// says), so the input gets zero channels up to that: PREP_PAD_INPUT=8 (the default), 4
    /// (four for inputs of up to four channels) or 0 (none).
    pub fn input_channels(&self, c: usize) -> usize {
        match self.pad_input {
            0 => c,
            4 if c <= 4 => 4,
            _ => c.next_multiple_of(8),
        }
    }

    fn cast(&mut self, src: &Buf, dst: &mut Buf, dt: Dt) {
        let n = src.len;
        if !self.ensure(dst, n, dt) {
            return;
        }
        dst.act = src.act;
        let name = match (src.dt, dt) {
            (Dt::F32, Dt::Bf16) => "cast_f32_bf16",
            (Dt::Bf16, Dt::F32) => "cast_bf16_f32",
            (Dt::U8, Dt::F32) => "cast_u8_f32",
            (a, b) => panic!("no cast from {a:?} to {b:?}"),
        };
        let g = self.grid(n);
        launch!(self, name, (g, 1), THREADS; src.ptr, dst.ptr, n as i64);
    }

    fn expect_act(&self, b: &Buf, what: &str) {
        assert_eq!(
            b.dt,
            self.act_dt(),
            "{what}: a {:?} tensor given to a {:?} backend",
            b.dt,
            self.prec
        );
    }

    /// Normalise, crop and flip a batch already in GPU memory: `pix` raw samples of `dtype`, `idx`
    /// (or 0) the samples to take, `lab` u32 labels indexed like the samples, `aug` (or 0) one
    /// packed augmentation per sample, `mean_std` 2c floats.
    #[allow(clippy::too_many_arguments)]
    pub fn load_device(
        &mut self,
        pix: u64,
        dtype: crate::format::shard::Dtype,
        idx: u64,
        lab: u64,
        aug: u64,
        mean_std: u64,
        n: usize,
        (c, h, w): (usize, usize, usize),
        pad: usize,
        out: &mut Buf,
        labels: &mut Buf,
    ) {
        let dt = self.act_dt();
        let cs = self.input_channels(c);
        if !self.ensure(out, n * cs * h * w, dt) || !self.ensure(labels, n, Dt::F32) {
            return;
        }
        out.act = Some(Nhwc {
            n,
            c,
            hw: h * w,
            cs,
        });
        let v = vec_width(cs);
        // kernels/input.cu names its pixel types as `Dtype` displays them: u8, u16, f16, f32.
        let name = format!("load_{dtype}_{}_v{v}", dt.suffix());
        let maxv = dtype.divisor() as f32;
        let g = self.sample_grid(n, h * w * cs / v);
        let std_ptr = mean_std + 4 * c as u64;
        launch!(self, &name, g, THREADS;
            pix, idx, lab, aug, mean_std, std_ptr, out.ptr, labels.ptr,
            n as i32, c as i32, h as i32, w as i32, pad as i32, maxv, cs as i32);
    }

    /// The grid of the batch-norm kernels (kernels/bn.cu) over `m` rows of `c` channels.
    fn bn_grid(&self, m: usize, c: usize) -> BnGrid {
        let v = vec_width(c);
        let groups = c / v;
        let gb = groups.min(BN_THREADS as usize);
        let cb = groups.div_ceil(gb);
        let lanes = BN_THREADS as usize / gb;
        // Row splits for `per` rows per thread.
        let rows = |per: usize| m.div_ceil(lanes * per).max(1);
        BnGrid {
            v,
            gb,
            cb,
            // Four blocks per multiprocessor (half of what fits), each at least 4 rows a thread:
            // enough reads in flight, and few partial sums for the finalising warps to add.
            stats: (4 * self.sms as usize).div_ceil(cb).clamp(1, rows(4)),
            apply: rows(8),
        }
    }

    fn conv_plan(&mut self, key: dnn::ConvKey) -> Option<(*const dnn::Plan, usize)> {
        let st = self.stream.cu_stream();
        let r = self
            .dnn
            .plan(key, st)
            .map(|p| (p as *const dnn::Plan, p.workspace));
        let (p, ws) = self.ok(r)?;
        let mut w = {
            let e = self.empty(Dt::U8);
            std::mem::replace(&mut self.s.workspace, e)
        };
        let fits = w.cap >= ws || self.ensure(&mut w, ws, Dt::U8);
        self.s.workspace = w;
        fits.then_some((p, ws))
    }

    /// The conv weights as the convolution reads them: [cout, k, k, cs] in the activations'
    /// type, from the float32 master copy [cout, cin, k, k] (the `cs - cin` padded input
    /// channels get zeros).
    fn conv_weights(&mut self, w: &Buf, s: &ConvShape, cs: usize) -> u64 {
        let dt = self.act_dt();
        let mut wp = {
            let e = self.empty(dt);
            std::mem::replace(&mut self.s.wpk, e)
        };
        if self.ensure(&mut wp, s.cout * s.k * s.k * cs, dt) {
            let g = self.grid(wp.len);
            launch!(self, &format!("wpack_{}", dt.suffix()), (g, 1), THREADS;
                w.ptr, wp.ptr, s.cout as i32, s.cin as i32, (s.k * s.k) as i32, cs as i32);
        }
        let p = wp.ptr;
        self.s.wpk = wp;
        p
    }

    fn drop_graph(&mut self) {
        if let Some((g, e, _)) = self.graph.take() {
            unsafe {
                sys::cuGraphExecDestroy(e);
                sys::cuGraphDestroy(g);
            }
        }
    }

    /// Pick the algorithm of direction `dir` (0 forward, 1 backward data, 2 backward filter),
    /// once per plan: the one this run folder recorded (`use_run_algorithms`: a resumed run and
    /// `prep eval` repeat the run's arithmetic), else the one timed fastest for this shape on
    /// this GPU (the memo), else, with PREP_CUDNN_TUNE=1, the fastest candidate timed on the
    /// tensors at hand, else cuDNN's heuristic ranking's first. Nothing is timed by default: the
    /// heuristics' picks ran as fast as timed ones (BENCHMARKS.md, issue 24). The pick is tried
    /// once (`run(algo)` issues one convolution with that algorithm); one that fails gives way
    /// to the next candidate.
    fn tune(&mut self, key: &dnn::ConvKey, dir: usize, run: &dyn Fn(i32) -> cudnn::cudnnStatus_t) {
        let Some(p) = self.dnn.plan_mut(key) else {
            return;
        };
        if p.tuned[dir] {
            return;
        }
        p.tuned[dir] = true;
        let cands = p.candidates[dir].clone();
        if cands.is_empty() || self.err.is_some() {
            return;
        }
        let (mut a, mut how) = (cands[0], "heuristic".to_string());
        if let Some(r) = self.memo.run_pick(key, dir).filter(|a| cands.contains(a)) {
            (a, how) = (r, "this run's".into());
        } else if let Some(m) = self.memo.get(key, dir).filter(|a| cands.contains(a)) {
            (a, how) = (m, "remembered".into());
        } else if self.tune_by_timing && cands.len() > 1 {
            if let Some((t, us)) = self.time_candidates(&cands, run) {
                self.memo.put(key, dir, t);
                (a, how) = (t, format!("{us:.1} us per run"));
            }
        }
        if !self.capturing {
            // The pick first, then the others in the heuristics' order.
            let order = std::iter::once(a).chain(cands.iter().copied().filter(|&c| c != a));
            match order
                .into_iter()
                .find(|&c| run(c) == cudnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS)
            {
                Some(c) if c != a => {
                    how = format!("{how} pick {a} failed");
                    a = c;
                }
                Some(_) => {}
                // None runs: the convolution itself reports the error.
                None => return,
            }
        }
        self.memo.record_run_pick(key, dir, a);
        let p = self.dnn.plan_mut(key).unwrap();
        unsafe {
            match dir {
                0 => p.fwd = std::mem::transmute::<i32, cudnn::cudnnConvolutionFwdAlgo_t>(a),
                1 => {
                    p.bwd_data = std::mem::transmute::<i32, cudnn::cudnnConvolutionBwdDataAlgo_t>(a)
                }
                _ => {
                    p.bwd_filter =
                        std::mem::transmute::<i32, cudnn::cudnnConvolutionBwdFilterAlgo_t>(a)
                }
            }
        }
        if self.prof.is_some() || self.timing {
            eprintln!(
                "cuDNN {key:?} {}: algorithm {a} of {cands:?}, {how}",
                ["forward", "backward data", "backward filter"][dir],
            );
        }
    }

    /// The fastest of `cands` and its time per run (us). Candidates take turns over several
    /// rounds and each keeps its best round, so a clock ramp or a busy moment during one
    /// candidate's turn does not decide.
    fn time_candidates(
        &mut self,
        cands: &[i32],
        run: &dyn Fn(i32) -> cudnn::cudnnStatus_t,
    ) -> Option<(i32, f32)> {
        if self.capturing {
            self.fail("timing convolution algorithms while recording a graph".into());
            return None;
        }
        let st = self.stream.cu_stream();
        let mut best_ms = vec![f32::INFINITY; cands.len()];
        let mut ok = vec![true; cands.len()];
        unsafe {
            let (mut e0, mut e1) = (std::ptr::null_mut(), std::ptr::null_mut());
            sys::cuEventCreate(&mut e0, 0);
            sys::cuEventCreate(&mut e1, 0);
            for (i, &a) in cands.iter().enumerate() {
                ok[i] = run(a) == cudnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS; // warm-up
            }
            for _ in 0..TUNE_ROUNDS {
                for (i, &a) in cands.iter().enumerate() {
                    if !ok[i] {
                        continue;
                    }
                    sys::cuEventRecord(e0, st);
                    for _ in 0..TUNE_RUNS {
                        ok[i] &= run(a) == cudnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS;
                    }
                    sys::cuEventRecord(e1, st);
                    sys::cuEventSynchronize(e1);
                    let mut ms = f32::INFINITY;
                    sys::cuEventElapsedTime_v2(&mut ms, e0, e1);
                    best_ms[i] = best_ms[i].min(ms);
                }
            }
            sys::cuEventDestroy_v2(e0);
            sys::cuEventDestroy_v2(e1);
        }
        (0..cands.len())
            .filter(|&i| ok[i] && best_ms[i].is_finite())
            .min_by(|&i, &j| best_ms[i].total_cmp(&best_ms[j]))
            .map(|i| (cands[i], best_ms[i] * 1000.0 / TUNE_RUNS as f32))
    }

    /// Take run folder `dir`'s recorded convolution algorithms first, and (when `write`, the
    /// run's writer) record there every algorithm this backend picks (`dnn::AlgoMemo`).
    pub fn use_run_algorithms(&mut self, dir: &std::path::Path, write: bool) {
        self.memo.use_run(dir, write);
    }

    /// Where `new`'s time went (PREP_TIMING; the kernels' own lines come when they are dropped).
    pub fn startup_report(&self) -> String {
        let t = self
            .times
            .iter()
            .map(|(w, t)| format!("{w} done at {t:.3} s"));
        t.collect::<Vec<_>>().join(", ")
    }

    /// Find the convolution algorithms for a batch size ahead of timing anything; `input` when
    /// the convolution reads the input batch (stored with `input_channels`).
    pub fn prepare_conv(&mut self, s: &ConvShape, input: bool) {
        let cin = if input {
            self.input_channels(s.cin)
        } else {
            s.cin
        };
        let key = dnn::ConvKey::new(&ConvShape { cin, ..*s }, self.prec == Precision::Bf16);
        let _ = self.conv_plan(key);
    }
}

/// `cin->cout HxW kK/S`, for profiles.
fn conv_label(s: &ConvShape) -> String {
    format!(
        "{}->{} {}x{} k{}/{}",
        s.cin, s.cout, s.h, s.w, s.k, s.stride
    )
}

/// The channels a convolution's input is stored with (its padding), checking that a shaped
/// input has the convolution's shape.
fn conv_channels(x: &Buf, s: &ConvShape) -> usize {
    match x.act {
        Some(a) => {
            assert_eq!(
                (a.n, a.c, a.hw),
                (s.n, s.cin, s.h * s.w),
                "conv: an input of {a:?} for {s:?}"
            );
            a.cs
        }
        None => s.cin,
    }
}

/// A convolution's tensors hold at least what its shape says (cuDNN would read past them).
fn check_conv_lens(x: &Buf, w: &Buf, dy: Option<&Buf>, s: &ConvShape, cs: usize) {
    assert!(
        x.len >= s.n * cs * s.h * s.w && w.len >= s.cout * s.cin * s.k * s.k,
        "conv: {} inputs and {} weights for {s:?}",
        x.len,
        w.len
    );
    if let Some(dy) = dy {
        assert!(
            dy.len >= s.n * s.cout * s.oh() * s.ow(),
            "conv_backward: {} gradients for {s:?}",
            dy.len
        );
    }
}

/// The pooling kernels' int arguments [h, w, oh, ow, k, stride, pad]; `arg` is a u8 per output,
/// so k * k <= 256.
fn pool_args(s: &PoolShape) -> [i32; 7] {
    assert!(
        (1..=16).contains(&s.k) && s.stride >= 1,
        "max pooling needs 1 <= k <= 16 and stride >= 1: {s:?}"
    );
    let d = [s.h, s.w, s.oh(), s.ow(), s.k, s.stride, s.pad];
    d.map(|v| i32::try_from(v).expect("a max pooling size over 2^31"))
}

/// Rows (n * hw) of an activation of `c` channels that an op reads, checking its length and,
/// where it has one, its shape (no padded channels).
fn check_act(x: &Buf, n: usize, c: usize, hw: usize, what: &str) -> usize {
    assert!(
        x.len >= n * c * hw,
        "{what}: {} values for {n}x{c}x{hw}",
        x.len
    );
    if let Some(a) = x.act {
        assert_eq!(
            a,
            Nhwc::of(n, c, hw),
            "{what}: a tensor of {a:?} for {n}x{c}x{hw}"
        );
    }
    n * hw
}

fn cudnn_ok(r: cudnn::cudnnStatus_t, what: &str) -> Result<(), String> {
    dnn::check(r, what)
}

impl Backend for Cuda {
    type Buf = Buf;

    fn zeros(&mut self, len: usize) -> Buf {
        let mut b = self.empty(Dt::F32);
        if len > 0 && self.ensure(&mut b, len, Dt::F32) {
            self.memset0(&b);
        }
        b
    }

    fn upload(&mut self, data: &[f32]) -> Buf {
        let mut b = self.empty(Dt::F32);
        self.upload_into(&mut b, data, Dt::F32);
        b
    }

    fn download(&mut self, b: &Buf) -> Vec<f32> {
        let flat = match b.dt {
            Dt::F32 => self.read_back::<f32>(b.ptr, b.len),
            Dt::Bf16 | Dt::U8 => {
                let mut f = self.empty(Dt::F32);
                self.cast(b, &mut f, Dt::F32);
                self.read_back::<f32>(f.ptr, f.len)
            }
            Dt::U32 => self
                .read_back::<u32>(b.ptr, b.len)
                .into_iter()
                .map(|v| v as f32)
                .collect(),
            Dt::F64 => self
                .read_back::<f64>(b.ptr, b.len)
                .into_iter()
                .map(|v| v as f32)
                .collect(),
        };
        match b.act {
            Some(a) if flat.len() >= a.n * a.hw * a.cs => nhwc_to_nchw(&flat, a),
            _ => flat,
        }
    }

    fn upload_act(&mut self, data: &[f32], [n, c, h, w]: [usize; 4]) -> Buf {
        assert_eq!(
            data.len(),
            n * c * h * w,
            "upload_act: values for {n}x{c}x{h}x{w}"
        );
        let a = Nhwc::of(n, c, h * w);
        let f = self.upload(&nchw_to_nhwc(data, a));
        let mut b = if self.act_dt() == Dt::F32 {
            f
        } else {
            let mut b = self.empty(Dt::Bf16);
            self.cast(&f, &mut b, Dt::Bf16);
            b
        };
        b.act = Some(a);
        b
    }

    fn load_batch(
        &mut self,
        raw: &RawBatch,
        mean: &[f32],
        std: &[f32],
        pad: usize,
        aug: &[Aug],
        out: &mut Buf,
        labels: &mut Buf,
    ) {
        if self.err.is_some() {
            return;
        }
        let packed: Vec<u32> = aug.iter().map(|a| a.packed()).collect();
        let mut ms: Vec<f32> = mean.to_vec();
        ms.extend_from_slice(std);
        let bytes = |v: &[u32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let lab = bytes(raw.labels);
        let augb = bytes(&packed);
        let msb: Vec<u8> = ms.iter().flat_map(|x| x.to_le_bytes()).collect();
        let r = self
            .ring
            .put(&[raw.pixels, &lab, &augb, &msb], &self.copy, &self.stream);
        let Some(p) = self.ok(r) else { return };
        let aug_ptr = if aug.is_empty() { 0 } else { p[2] };
        self.load_device(
            p[0],
            raw.dtype,
            0,
            p[1],
            aug_ptr,
            p[3],
            raw.n,
            (raw.c, raw.h, raw.w),
            pad,
            out,
            labels,
        );
        let r = self.ring.consumed(&self.stream);
        self.ok(r);
    }

    fn conv(&mut self, x: &Buf, w: &Buf, y: &mut Buf, s: &ConvShape) {
        self.expect_act(x, "conv input");
        let cs = conv_channels(x, s);
        check_conv_lens(x, w, None, s, cs);
        let dt = self.act_dt();
        if !self.ensure(y, s.n * s.cout * s.oh() * s.ow(), dt) {
            return;
        }
        y.act = Some(Nhwc::of(s.n, s.cout, s.oh() * s.ow()));
        let key = dnn::ConvKey::new(&ConvShape { cin: cs, ..*s }, dt == Dt::Bf16);
        let Some((plan, ws)) = self.conv_plan(key) else {
            return;
        };
        let wp = self.conv_weights(w, s, cs);
        if self.err.is_some() {
            return;
        }
        let (one, zero) = (1.0f32, 0.0f32);
        let (hd, xd, wdsc, cd, yd, wsp) = unsafe {
            let p = &*plan;
            (self.dnn.handle, p.x, p.w, p.conv, p.y, self.s.workspace.ptr)
        };
        let (xp, yp) = (x.ptr, y.ptr);
        let run = |a: i32| unsafe {
            cudnn::cudnnConvolutionForward(
                hd,
                &one as *const f32 as *const c_void,
                xd,
                xp as *const c_void,
                wdsc,
                wp as *const c_void,
                cd,
                std::mem::transmute::<i32, cudnn::cudnnConvolutionFwdAlgo_t>(a),
                wsp as *mut c_void,
                ws,
                &zero as *const f32 as *const c_void,
                yd,
                yp as *mut c_void,
            )
        };
        self.tune(&key, 0, &run);
        let st = self.stream.cu_stream();
        let t0 = self.prof.as_mut().map(|p| p.begin(st));
        let r = run(unsafe { (*plan).fwd } as i32);
        if let (Some(p), Some(t0)) = (self.prof.as_mut(), t0) {
            p.end(&format!("cudnn fwd {}", conv_label(s)), t0, st);
        }
        self.ok(cudnn_ok(r, "convolution forward"));
    }

    fn conv_backward(
        &mut self,
        x: &Buf,
        w: &Buf,
        dy: &Buf,
        dx: Option<&mut Buf>,
        dw: &mut Buf,
        s: &ConvShape,
    ) {
        self.expect_act(x, "conv_backward input");
        self.expect_act(dy, "conv_backward gradient");
        let cs = conv_channels(x, s);
        check_conv_lens(x, w, Some(dy), s, cs);
        let dt = self.act_dt();
        let key = dnn::ConvKey::new(&ConvShape { cin: cs, ..*s }, dt == Dt::Bf16);
        let Some((plan, ws)) = self.conv_plan(key) else {
            return;
        };
        if !self.ensure(dw, s.cout * s.cin * s.k * s.k, Dt::F32) {
            return;
        }
        let wp = self.conv_weights(w, s, cs);
        // cuDNN writes the weight gradient as it reads the weights; unpacked into `dw` below.
        let mut dwb = {
            let e = self.empty(dt);
            std::mem::replace(&mut self.s.dwpk, e)
        };
        if !self.ensure(&mut dwb, s.cout * s.k * s.k * cs, dt) {
            self.s.dwpk = dwb;
            return;
        }
        let dw_target = dwb.ptr;
        let (one, zero) = (1.0f32, 0.0f32);
        let (hd, xd, wdsc, cd, yd, wsp) = unsafe {
            let p = &*plan;
            (self.dnn.handle, p.x, p.w, p.conv, p.y, self.s.workspace.ptr)
        };
        let (xp, dyp) = (x.ptr, dy.ptr);
        let run_filter = |a: i32| unsafe {
            cudnn::cudnnConvolutionBackwardFilter(
                hd,
                &one as *const f32 as *const c_void,
                xd,
                xp as *const c_void,
                yd,
                dyp as *const c_void,
                cd,
                std::mem::transmute::<i32, cudnn::cudnnConvolutionBwdFilterAlgo_t>(a),
                wsp as *mut c_void,
                ws,
                &zero as *const f32 as *const c_void,
                wdsc,
                dw_target as *mut c_void,
            )
        };
        self.tune(&key, 2, &run_filter);
        let st = self.stream.cu_stream();
        let t0 = self.prof.as_mut().map(|p| p.begin(st));
        if self.err.is_none() {
            let r = run_filter(unsafe { (*plan).bwd_filter } as i32);
            self.ok(cudnn_ok(r, "convolution backward (filter)"));
        }
        if let (Some(p), Some(t0)) = (self.prof.as_mut(), t0) {
            p.end(&format!("cudnn bwd filter {}", conv_label(s)), t0, st);
        }
        let g = self.grid(dw.len);
        launch!(self, &format!("wunpack_{}", dt.suffix()), (g, 1), THREADS;
            dwb.ptr, dw.ptr, s.cout as i32, s.cin as i32, (s.k * s.k) as i32, cs as i32);
        self.s.dwpk = dwb;
        if let Some(dx) = dx {
            if !self.ensure(dx, s.n * cs * s.h * s.w, dt) || self.err.is_some() {
                return;
            }
            dx.act = Some(Nhwc {
                n: s.n,
                c: s.cin,
                hw: s.h * s.w,
                cs,
            });
            let dxp = dx.ptr;
            let run_data = |a: i32| unsafe {
                cudnn::cudnnConvolutionBackwardData(
                    hd,
                    &one as *const f32 as *const c_void,
                    wdsc,
                    wp as *const c_void,
                    yd,
                    dyp as *const c_void,
                    cd,
                    std::mem::transmute::<i32, cudnn::cudnnConvolutionBwdDataAlgo_t>(a),
                    wsp as *mut c_void,
                    ws,
                    &zero as *const f32 as *const c_void,
                    xd,
                    dxp as *mut c_void,
                )
            };
            self.tune(&key, 1, &run_data);
            let t0 = self.prof.as_mut().map(|p| p.begin(st));
            let r = run_data(unsafe { (*plan).bwd_data } as i32);
            if let (Some(p), Some(t0)) = (self.prof.as_mut(), t0) {
                p.end(&format!("cudnn bwd data {}", conv_label(s)), t0, st);
            }
            self.ok(cudnn_ok(r, "convolution backward (data)"));
        }
    }

    fn bn_train(
        &mut self,
        x: &Buf,
        gamma: &Buf,
        beta: &Buf,
        y: &mut Buf,
        saved_mean: &mut Buf,
        saved_invstd: &mut Buf,
        running_mean: &mut Buf,
        running_var: &mut Buf,
        n: usize,
        c: usize,
        hw: usize,
        relu: bool,
    ) {
        self.expect_act(x, "bn_train input");
        let dt = x.dt;
        let m = check_act(x, n, c, hw, "bn_train");
        let gd = self.bn_grid(m, c);
        let mut s = std::mem::replace(&mut self.s, Scratch::empty(self.stream.cu_stream()));
        let ok = self.grid_y_fits(gd.cb, "bn_train channel blocks")
            && self.ensure(y, x.len, dt)
            && self.ensure(saved_mean, c, Dt::F32)
            && self.ensure(saved_invstd, c, Dt::F32)
            && self.ensure(&mut s.part, c * gd.stats * 2 + c, Dt::F32)
            && self.ensure(&mut s.scale, c, Dt::F32)
            && self.ensure(&mut s.shift, c, Dt::F32)
            && (!self.sync_bn || self.ensure(&mut s.sync, 4 * (2 * c + 1), Dt::F32));
        if ok {
            y.act = Some(Nhwc::of(n, c, hw));
            let sfx = format!("{}_v{}", dt.suffix(), gd.v);
            let (sp, gb) = (gd.stats as i32, gd.gb as i32);
            launch!(self, &format!("bn_stats_{sfx}"), (gd.stats as u32, gd.cb as u32), BN_THREADS;
                x.ptr, s.part.ptr, m as i64, c as i32, sp, gb);
            if self.sync_bn {
                let (_, tot) = self.world_sums("bn_sync_pack", s.part.ptr, sp, c, m, s.sync.ptr);
                launch!(self, "bn_sync_finalize", (blocks(c, THREADS), 1), THREADS;
                    tot, c as i32, gamma.ptr, beta.ptr, saved_mean.ptr, saved_invstd.ptr,
                    running_mean.ptr, running_var.ptr, 0.1f32, 1e-5f32, s.scale.ptr, s.shift.ptr);
            } else {
                launch!(self, "bn_finalize", (blocks(c * 32, THREADS), 1), THREADS;
                    s.part.ptr, sp, c as i32, m as i64, gamma.ptr, beta.ptr,
                    saved_mean.ptr, saved_invstd.ptr, running_mean.ptr, running_var.ptr,
                    0.1f32, 1e-5f32, s.scale.ptr, s.shift.ptr);
            }
            launch!(self, &format!("bn_apply_{sfx}"), (gd.apply as u32, gd.cb as u32), BN_THREADS;
                x.ptr, s.scale.ptr, s.shift.ptr, 0u64, y.ptr, m as i64, c as i32,
                gd.apply as i32, gb, relu as i32);
        }
        self.s = s;
    }

    fn bn_eval(
        &mut self,
        x: &Buf,
        gamma: &Buf,
        beta: &Buf,
        running_mean: &Buf,
        running_var: &Buf,
        y: &mut Buf,
        n: usize,
        c: usize,
        hw: usize,
        relu: bool,
    ) {
        self.expect_act(x, "bn_eval input");
        let dt = x.dt;
        let m = check_act(x, n, c, hw, "bn_eval");
        let gd = self.bn_grid(m, c);
        let mut s = std::mem::replace(&mut self.s, Scratch::empty(self.stream.cu_stream()));
        let ok = self.grid_y_fits(gd.cb, "bn_eval channel blocks")
            && self.ensure(y, x.len, dt)
            && self.ensure(&mut s.scale, c, Dt::F32)
            && self.ensure(&mut s.shift, c, Dt::F32);
        if ok {
            y.act = Some(Nhwc::of(n, c, hw));
            launch!(self, "bn_eval_prep", (blocks(c, 128), 1), 128;
                gamma.ptr, beta.ptr, running_mean.ptr, running_var.ptr, 1e-5f32,
                s.scale.ptr, s.shift.ptr, c as i32);
            let name = format!("bn_apply_{}_v{}", dt.suffix(), gd.v);
            launch!(self, &name, (gd.apply as u32, gd.cb as u32), BN_THREADS;
                x.ptr, s.scale.ptr, s.shift.ptr, 0u64, y.ptr, m as i64, c as i32,
                gd.apply as i32, gd.gb as i32, relu as i32);
        }
        self.s = s;
    }

    fn bn_backward(
        &mut self,
        x: &Buf,
        dy: &Buf,
        gamma: &Buf,
        beta: &Buf,
        saved_mean: &Buf,
        saved_invstd: &Buf,
        dx: &mut Buf,
        dgamma: &mut Buf,
        dbeta: &mut Buf,
        n: usize,
        c: usize,
        hw: usize,
        relu_out: Option<&Buf>,
    ) {
        self.expect_act(x, "bn_backward input");
        self.expect_act(dy, "bn_backward gradient");
        let m = check_act(x, n, c, hw, "bn_backward");
        check_act(dy, n, c, hw, "bn_backward gradient");
        // The ReLU's mask is recomputed from x, gamma, beta and the saved statistics (what
        // bn_finalize made of them), not read from its output.
        let relu = relu_out.is_some() as i32;
        let dt = x.dt;
        let gd = self.bn_grid(m, c);
        let mut s = std::mem::replace(&mut self.s, Scratch::empty(self.stream.cu_stream()));
        let ok = self.grid_y_fits(gd.cb, "bn_backward channel blocks")
            && self.ensure(dx, x.len, dt)
            && self.ensure(dgamma, c, Dt::F32)
            && self.ensure(dbeta, c, Dt::F32)
            && self.ensure(&mut s.part, c * gd.stats * 2 + c, Dt::F32)
            && self.ensure(&mut s.coef, 3 * c, Dt::F32)
            && (!self.sync_bn || self.ensure(&mut s.sync, 4 * (2 * c + 1), Dt::F32));
        if ok {
            dx.act = Some(Nhwc::of(n, c, hw));
            let sfx = format!("{}_v{}", dt.suffix(), gd.v);
            let (sp, gb) = (gd.stats as i32, gd.gb as i32);
            let (gp, bp, mp, ip) = (gamma.ptr, beta.ptr, saved_mean.ptr, saved_invstd.ptr);
            launch!(self, &format!("bn_bwd_stats_{sfx}"), (gd.stats as u32, gd.cb as u32),
                BN_THREADS; x.ptr, dy.ptr, 0u64, gp, bp, mp, ip, relu, s.part.ptr, m as i64,
                c as i32, sp, gb);
            if self.sync_bn {
                let (mine, tot) =
                    self.world_sums("bn_bwd_sync_pack", s.part.ptr, sp, c, m, s.sync.ptr);
                launch!(self, "bn_bwd_sync_finalize", (blocks(c, THREADS), 1), THREADS;
                    mine, tot, c as i32, gp, ip, dgamma.ptr, dbeta.ptr, s.coef.ptr);
            } else {
                launch!(self, "bn_bwd_finalize", (blocks(c * 32, THREADS), 1), THREADS;
                    s.part.ptr, sp, c as i32, m as i64, gp, ip, dgamma.ptr, dbeta.ptr,
                    s.coef.ptr);
            }
            launch!(self, &format!("bn_bwd_apply_{sfx}"), (gd.apply as u32, gd.cb as u32),
                BN_THREADS; x.ptr, dy.ptr, 0u64, gp, bp, mp, ip, relu, s.coef.ptr, dx.ptr, 0u64,
                m as i64, c as i32, gd.apply as i32, gb);
        }
        self.s = s;
    }

    fn relu(&mut self, x: &mut Buf) {
        self.expect_act(x, "relu input");
        let g = self.grid(x.len);
        launch!(self, &format!("relu_{}", x.dt.suffix()), (g, 1), THREADS; x.ptr, x.len as i64);
    }

    fn relu_backward(&mut self, y: &Buf, dy: &mut Buf) {
        self.expect_act(y, "relu_backward output");
        self.expect_act(dy, "relu_backward gradient");
        let g = self.grid(y.len);
        launch!(self, &format!("relu_bwd_{}", y.dt.suffix()), (g, 1), THREADS;
            y.ptr, dy.ptr, y.len as i64);
    }

    fn maxpool(&mut self, x: &Buf, y: &mut Buf, arg: &mut Buf, s: &PoolShape) {
        self.expect_act(x, "maxpool input");
        let dims = pool_args(s);
        check_act(x, s.n, s.c, s.h * s.w, "maxpool");
        let out = s.n * s.c * s.oh() * s.ow();
        if !self.ensure(y, out, x.dt) || !self.ensure(arg, out, Dt::U8) {
            return;
        }
        y.act = Some(Nhwc::of(s.n, s.c, s.oh() * s.ow()));
        arg.act = y.act;
        let v = vec_width(s.c);
        let g = self.sample_grid(s.n, out / s.n.max(1) / v);
        let [h, w, oh, ow, k, stride, pad] = dims;
        launch!(self, &format!("maxpool_{}_v{v}", x.dt.suffix()), g, THREADS;
            x.ptr, y.ptr, arg.ptr, s.n as i64, s.c as i32, h, w, oh, ow, k, stride, pad);
    }

    fn maxpool_backward(&mut self, dy: &Buf, arg: &Buf, dx: &mut Buf, s: &PoolShape) {
        self.expect_act(dy, "maxpool_backward gradient");
        assert_eq!(
            arg.dt,
            Dt::U8,
            "maxpool_backward: the argmax of `maxpool` is u8"
        );
        let dims = pool_args(s);
        check_act(dy, s.n, s.c, s.oh() * s.ow(), "maxpool_backward gradient");
        check_act(arg, s.n, s.c, s.oh() * s.ow(), "maxpool_backward winners");
        let total = s.n * s.c * s.h * s.w;
        if !self.ensure(dx, total, dy.dt) {
            return;
        }
        dx.act = Some(Nhwc::of(s.n, s.c, s.h * s.w));
        let v = vec_width(s.c);
        let g = self.sample_grid(s.n, total / s.n.max(1) / v);
        let [h, w, oh, ow, k, stride, pad] = dims;
        launch!(self, &format!("maxpool_bwd_{}_v{v}", dy.dt.suffix()), g, THREADS;
            dy.ptr, arg.ptr, dx.ptr, s.n as i64, s.c as i32, h, w, oh, ow, k, stride, pad);
    }

    fn add(&mut self, a: &Buf, b: &Buf, y: &mut Buf, relu: bool) {
        self.expect_act(a, "add input");
        self.expect_act(b, "add input");
        assert_eq!(a.len, b.len, "add: operands of different lengths");
        assert!(
            a.act.is_none() || b.act.is_none() || a.act == b.act,
            "add: operands of shapes {:?} and {:?}",
            a.act,
            b.act
        );
        if !self.ensure(y, a.len, a.dt) {
            return;
        }
        y.act = a.act.or(b.act);
        let v = vec_width(a.len);
        let g = self.grid(a.len / v);
        launch!(self, &format!("add_{}_v{v}", a.dt.suffix()), (g, 1), THREADS;
            a.ptr, b.ptr, y.ptr, a.len as i64, relu as i32);
    }

    fn accumulate(&mut self, dst: &mut Buf, src: &Buf) {
        self.expect_act(dst, "accumulate target");
        self.expect_act(src, "accumulate source");
        assert_eq!(dst.len, src.len, "accumulate: tensors of different lengths");
        assert!(
            dst.act.is_none() || src.act.is_none() || dst.act == src.act,
            "accumulate: tensors of shapes {:?} and {:?}",
            dst.act,
            src.act
        );
        let v = vec_width(dst.len);
        let g = self.grid(dst.len / v);
        launch!(self, &format!("accumulate_{}_v{v}", dst.dt.suffix()), (g, 1), THREADS;
            dst.ptr, src.ptr, dst.len as i64);
    }

    fn copy(&mut self, src: &Buf, dst: &mut Buf) {
        if !self.ensure(dst, src.len, src.dt) || src.len == 0 || self.err.is_some() {
            return;
        }
        dst.act = src.act;
        // On the compute stream, so it is ordered with the kernels and a graph records it.
        let st = self.stream.cu_stream();
        let t0 = self.prof.as_mut().map(|p| p.begin(st));
        let r = unsafe { dr::memcpy_dtod_async(dst.ptr, src.ptr, src.len * src.dt.size(), st) };
        if let (Some(p), Some(t0)) = (self.prof.as_mut(), t0) {
            p.end("copy", t0, st);
        }
        let _ = self.ok(r.map_err(|e| format!("copying on the GPU: {e:?}")));
    }

    fn gap(&mut self, x: &Buf, y: &mut Buf, n: usize, c: usize, hw: usize) {
        self.expect_act(x, "gap input");
        check_act(x, n, c, hw, "gap");
        if !self.grid_y_fits(c.div_ceil(32), "gap channel blocks")
            || !self.ensure(y, n * c, Dt::F32)
        {
            return;
        }
        let g = (n.clamp(1, i32::MAX as usize) as u32, c.div_ceil(32) as u32);
        launch!(self, &format!("gap_{}", x.dt.suffix()), g, THREADS;
            x.ptr, y.ptr, c as i32, hw as i32);
    }

    fn gap_backward(&mut self, dy: &Buf, dx: &mut Buf, n: usize, c: usize, hw: usize) {
        let dt = self.act_dt();
        if !self.ensure(dx, n * c * hw, dt) {
            return;
        }
        dx.act = Some(Nhwc::of(n, c, hw));
        let g = self.sample_grid(n, c * hw);
        launch!(self, &format!("gap_bwd_{}", dt.suffix()), g, THREADS;
            dy.ptr, dx.ptr, n as i64, c as i32, hw as i32);
    }

    fn linear(&mut self, x: &Buf, w: &Buf, b: &Buf, y: &mut Buf, n: usize, k: usize, m: usize) {
        if !self.ensure(y, n * m, Dt::F32) || self.err.is_some() {
            return;
        }
        // Row-major y[n,m] = x[n,k] w[m,k]^T is column-major y^T = w^T^T x^T.
        let (one, zero) = (1.0f32, 0.0f32);
        let r = unsafe {
            blas::cublasSgemm_v2(
                self.dnn.blas,
                blas::cublasOperation_t::CUBLAS_OP_T,
                blas::cublasOperation_t::CUBLAS_OP_N,
                m as i32,
                n as i32,
                k as i32,
                &one,
                w.ptr as *const f32,
                k as i32,
                x.ptr as *const f32,
                k as i32,
                &zero,
                y.ptr as *mut f32,
                m as i32,
            )
        };
        if self.ok(dnn::check_blas(r, "linear forward")).is_none() {
            return;
        }
        let g = self.grid(n * m);
        launch!(self, "add_bias", (g, 1), THREADS; y.ptr, b.ptr, n as i32, m as i32);
    }

    fn linear_backward(
        &mut self,
        x: &Buf,
        w: &Buf,
        dy: &Buf,
        dx: &mut Buf,
        dw: &mut Buf,
        db: &mut Buf,
        n: usize,
        k: usize,
        m: usize,
    ) {
        if !self.ensure(dx, n * k, Dt::F32)
            || !self.ensure(dw, m * k, Dt::F32)
            || !self.ensure(db, m, Dt::F32)
            || self.err.is_some()
        {
            return;
        }
        let (one, zero) = (1.0f32, 0.0f32);
        use blas::cublasOperation_t::{CUBLAS_OP_N as N, CUBLAS_OP_T as T};
        let r = unsafe {
            // dx^T[k,n] = W^T[k,m] dy^T[m,n]
            let a = blas::cublasSgemm_v2(
                self.dnn.blas,
                N,
                N,
                k as i32,
                n as i32,
                m as i32,
                &one,
                w.ptr as *const f32,
                k as i32,
                dy.ptr as *const f32,
                m as i32,
                &zero,
                dx.ptr as *mut f32,
                k as i32,
            );
            // dw^T[k,m] = x^T[k,n] dy[n,m]
            let b = blas::cublasSgemm_v2(
                self.dnn.blas,
                N,
                T,
                k as i32,
                m as i32,
                n as i32,
                &one,
                x.ptr as *const f32,
                k as i32,
                dy.ptr as *const f32,
                m as i32,
                &zero,
                dw.ptr as *mut f32,
                k as i32,
            );
            dnn::check_blas(a, "linear backward (input)")
                .and(dnn::check_blas(b, "linear backward (weights)"))
        };
        if self.ok(r).is_none() {
            return;
        }
        launch!(self, "col_sum", (blocks(m, 128), 1), 128;
            dy.ptr, db.ptr, n as i32, m as i32);
    }

    fn softmax_xent(
        &mut self,
        logits: &Buf,
        labels: &Buf,
        smoothing: f32,
        dlogits: &mut Buf,
        n: usize,
        k: usize,
    ) {
        if !self.ensure(dlogits, n * k, Dt::F32) {
            return;
        }
        let g = blocks(n * 32, THREADS);
        let stats = self.stats.ptr;
        launch!(self, "softmax_xent", (g, 1), THREADS;
            logits.ptr, labels.ptr, dlogits.ptr, stats, n as i32, k as i32, smoothing);
    }

    fn take_loss_stats(&mut self) -> (f64, u64) {
        let v = self.read_back::<f64>(self.stats.ptr, 2);
        let stats = {
            let e = self.empty(Dt::F64);
            std::mem::replace(&mut self.stats, e)
        };
        self.memset0(&stats);
        self.stats = stats;
        (v[0], v[1] as u64)
    }

    fn argmax(&mut self, logits: &Buf, n: usize, k: usize) -> Vec<u32> {
        let mut idx = {
            let e = self.empty(Dt::U32);
            std::mem::replace(&mut self.s.idx, e)
        };
        let mut out = vec![0; n];
        if self.ensure(&mut idx, n, Dt::U32) {
            launch!(self, "argmax_rows", (blocks(n, 128), 1), 128;
                logits.ptr, idx.ptr, n as i32, k as i32);
            out = self.read_back::<u32>(idx.ptr, n);
        }
        self.s.idx = idx;
        out
    }

    fn sgd_step(&mut self, w: &mut Buf, g: &Buf, v: &mut Buf, lr: f32, momentum: f32, wd: f32) {
        let gr = self.grid(w.len);
        launch!(self, "sgd", (gr, 1), THREADS;
            w.ptr, g.ptr, v.ptr, w.len as i64, lr, momentum, wd);
    }

    fn sgd_step_many(
        &mut self,
        w: &mut [Buf],
        g: &[Buf],
        v: &mut [Buf],
        decay: &[bool],
        lr: f32,
        momentum: f32,
        weight_decay: f32,
    ) {
        // One launch for every tensor (blockIdx.y picks it); the table of pointers is uploaded
        // when it changes.
        if w.is_empty() || !self.grid_y_fits(w.len(), "sgd_step_many tensors") {
            return;
        }
        let mut table: Vec<u64> = Vec::with_capacity(w.len() * 5);
        let mut longest = 0;
        for i in 0..w.len() {
            table.extend([
                w[i].ptr,
                g[i].ptr,
                v[i].ptr,
                w[i].len as u64,
                decay[i] as u64,
            ]);
            longest = longest.max(w[i].len);
        }
        // One table per set of tensors (per model), uploaded once: a graph replays with the
        // table it recorded, so a table is never rewritten.
        let t = match self.sgd_tables.iter().find(|(k, _)| *k == table) {
            Some((_, b)) => b.ptr,
            None => {
                let mut b = self.empty(Dt::U32);
                let words: Vec<u32> = table
                    .iter()
                    .flat_map(|&x| [x as u32, (x >> 32) as u32])
                    .collect();
                self.upload_into(&mut b, &words, Dt::U32);
                let p = b.ptr;
                self.sgd_tables.push((table, b));
                p
            }
        };
        let gx = longest.div_ceil(THREADS as usize).clamp(1, 64) as u32;
        // While recording, the rate stays out of the graph: `replay` sets it before each replay.
        if !self.capturing {
            self.set_lr(lr);
        }
        let lr_p = self.lr_buf.ptr;
        launch!(self, "sgd_multi", (gx, w.len() as u32), THREADS;
            t, lr_p, momentum, weight_decay);
    }

    fn all_reduce_grads(&mut self, g: &mut [Buf]) {
        let Some(comm) = &self.comm else { return };
        if self.err.is_some() {
            return;
        }
        let t: Vec<(u64, usize)> = g.iter().map(|b| (b.ptr, b.len)).collect();
        if let Err(e) = comm.average_f32(&t, self.stream.cu_stream()) {
            self.fail(e);
        }
    }

    fn begin_capture(&mut self) -> bool {
        if !self.graphs || self.err.is_some() {
            return false;
        }
        self.drop_graph();
        let st = self.stream.cu_stream();
        let r = unsafe {
            sys::cuStreamBeginCapture_v2(
                st,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
        };
        self.capturing = r == sys::CUresult::CUDA_SUCCESS;
        self.capturing
    }

    fn end_capture(&mut self) -> bool {
        if !self.capturing {
            return false;
        }
        self.capturing = false;
        let st = self.stream.cu_stream();
        let mut g = std::ptr::null_mut();
        let r = unsafe { sys::cuStreamEndCapture(st, &mut g) };
        let mut exec = std::ptr::null_mut();
        let ok = r == sys::CUresult::CUDA_SUCCESS
            && self.err.is_none()
            && unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, g, 0) }
                == sys::CUresult::CUDA_SUCCESS;
        if ok {
            self.graph = Some((g, exec, self.generation));
            return true;
        }
        // Recording failed: nothing recorded ran. Say so once, and issue steps directly from now.
        eprintln!(
            "note: CUDA graph capture failed ({r:?}{}); training steps are issued one by one",
            self.err
                .as_deref()
                .map(|e| format!(", {e}"))
                .unwrap_or_default()
        );
        if !g.is_null() {
            unsafe { sys::cuGraphDestroy(g) };
        }
        self.err = None;
        self.graphs = false;
        false
    }

    fn replay(&mut self, lr: f32) -> bool {
        match self.graph {
            Some((_, exec, gen)) if gen == self.generation && self.err.is_none() => {
                self.set_lr(lr);
                let r = unsafe { sys::cuGraphLaunch(exec, self.stream.cu_stream()) };
                if r != sys::CUresult::CUDA_SUCCESS {
                    self.fail(format!("launching the training step's graph: {r:?}"));
                }
                true
            }
            _ => false,
        }
    }

    fn status(&self) -> Result<(), String> {
        match &self.err {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn gpu_mem_bytes(&mut self) -> u64 {
        self.sync();
        match mem_info() {
            Ok((free, total)) => (total - free) as u64,
            Err(_) => 0,
        }
    }
}
