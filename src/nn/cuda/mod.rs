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
//!
//! Rooms: this file (buffers, the `Cuda` handle and its setup), `device` (what the host has),
//! `conv` (cuDNN plans and algorithm picks), `graph` (recorded steps), `backend` (the trait's ops),
//! `layers` (the U-Net's concatenation, upsampling and bias), `kernels`, `dnn`, `staging`, `nccl`. May import `nn` and `util`, nothing above.

mod dnn;
mod kernels;
pub mod nccl;
pub mod staging;
#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod tests_layers;
#[cfg(test)]
mod tests_losses;
#[cfg(test)]
mod tests_world;

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
    world: Option<world::World>,
    stats: Buf,
    s: Scratch,
    /// The buffers of the mask, labels and values losses (losses.rs).
    losses: losses::LossBufs,
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

/// Raw kernel arguments: each expression's address, valid until the end of the statement that
/// launches (temporaries live that long).
macro_rules! launch {
    ($self:ident, $name:expr, $grid:expr, $block:expr; $($a:expr),* $(,)?) => {
        $self.launch_raw($name, $grid, $block, &mut [$( &$a as *const _ as *mut c_void ),*])
    };
}

// After `launch!`, which they use.
mod backend;
mod conv;
mod device;
mod graph;
mod layers;
mod losses;
mod profile;
pub(crate) mod world;

use device::compute_capability;
pub use device::{device_count, mem_info, probe};
use profile::Profile;

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
            world: None,
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
            losses: losses::LossBufs::new(cs),
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
        self.world = Some(world::World::Nccl(nccl::Comm::new(rank, size, id)?));
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
        if self.sum_f64_over_world(mine, tot, len) {
            (mine, tot)
        } else {
            (mine, mine)
        }
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
}
