//! cuDNN convolutions and cuBLAS matrix products. A plan (descriptors and the algorithms cuDNN
//! measured fastest for this shape) is made once per shape and kept.

use crate::nn::ConvShape;
use cudarc::cublas::sys as blas;
use cudarc::cudnn::sys as dnn;
use cudarc::driver::sys::CUstream;
use cudarc::driver::CudaContext;
use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

pub fn check(s: dnn::cudnnStatus_t, what: &str) -> Result<(), String> {
    if s == dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(format!("cuDNN {what}: {s:?}"))
    }
}

pub fn check_blas(s: blas::cublasStatus_t, what: &str) -> Result<(), String> {
    if s == blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(format!("cuBLAS {what}: {s:?}"))
    }
}

/// A convolution's plan and remembered algorithms are per shape and precision.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct ConvKey {
    pub s: ConvShape,
    pub bf16: bool,
}

impl ConvKey {
    pub fn new(s: &ConvShape, bf16: bool) -> Self {
        ConvKey { s: *s, bf16 }
    }
}

pub struct Plan {
    pub x: dnn::cudnnTensorDescriptor_t,
    pub y: dnn::cudnnTensorDescriptor_t,
    pub w: dnn::cudnnFilterDescriptor_t,
    pub conv: dnn::cudnnConvolutionDescriptor_t,
    pub fwd: dnn::cudnnConvolutionFwdAlgo_t,
    pub bwd_data: dnn::cudnnConvolutionBwdDataAlgo_t,
    pub bwd_filter: dnn::cudnnConvolutionBwdFilterAlgo_t,
    /// Workspace bytes the candidate algorithms need (the largest).
    pub workspace: usize,
    /// Candidate algorithms of each direction (forward, backward data, backward filter), and
    /// whether the backend has timed them on a real batch yet.
    pub candidates: [Vec<i32>; 3],
    pub tuned: [bool; 3],
}

/// The algorithm timed fastest for each convolution and direction (PREP_CUDNN_TUNE=1),
/// remembered on disk per GPU model and cuDNN version (`cudnn-algos.tsv` in the kernel cache):
/// later runs of the same shapes use the same algorithms, so they compute the same numbers and
/// skip the timing, instead of letting timing noise pick differently in every process. Delete
/// the file to time again.
///
/// Beside it, the algorithms a run used, in a file of the same form in its run folder: a resumed
/// run and `prep eval` take those first, so they repeat the run's arithmetic whatever the memo
/// says by then (or on a host without it).
pub struct AlgoMemo {
    path: Option<PathBuf>,
    /// `GPU name / cuDNN version`, the first column of this GPU's lines.
    device: String,
    chosen: HashMap<(ConvKey, usize), i32>,
    /// The run folder's file, and whether this process writes it (the run's writer).
    run_path: Option<(PathBuf, bool)>,
    run_chosen: HashMap<(ConvKey, usize), i32>,
}

const MEMO_FILE: &str = "cudnn-algos.tsv";
/// A memo holds a few lines per convolution shape; a larger file is not one of ours.
const MEMO_CAP: u64 = 16 << 20;

impl AlgoMemo {
    pub fn open(dir: Option<PathBuf>, gpu: &str) -> AlgoMemo {
        // NHWC: the picks made for the NCHW tensors of earlier versions do not carry over.
        let device = format!(
            "{} / cuDNN {} / NHWC",
            gpu.replace(['\t', '\n'], " "),
            unsafe { dnn::cudnnGetVersion() }
        );
        let path = dir.map(|d| d.join(MEMO_FILE));
        // An unreadable memo costs only the timing.
        let text = path
            .as_ref()
            .and_then(|p| {
                crate::store::local::read_text_capped(p, MEMO_CAP, "cuDNN algorithm memo").ok()
            })
            .unwrap_or_default();
        let chosen = parse_memo(&text, &device);
        AlgoMemo {
            path,
            device,
            chosen,
            run_path: None,
            run_chosen: HashMap::new(),
        }
    }

    /// Take run folder `dir`'s algorithms first from now on, and (when `write`) record there
    /// every pick made.
    pub fn use_run(&mut self, dir: &std::path::Path, write: bool) {
        let p = dir.join(MEMO_FILE);
        let text = crate::store::local::read_text_capped(&p, MEMO_CAP, "cuDNN algorithm record")
            .unwrap_or_default();
        self.run_chosen = parse_memo(&text, &self.device);
        self.run_path = Some((p, write));
    }

    pub fn run_pick(&self, k: &ConvKey, dir: usize) -> Option<i32> {
        self.run_chosen.get(&(*k, dir)).copied()
    }

    /// The run uses `algo` for `k` and `dir`: a line in its folder's file, if it is new.
    pub fn record_run_pick(&mut self, k: &ConvKey, dir: usize, algo: i32) {
        let Some((p, true)) = &self.run_path else {
            return;
        };
        if self.run_chosen.insert((*k, dir), algo) == Some(algo) {
            return;
        }
        append_line(p, &memo_line(&self.device, k, dir, algo));
    }

    pub fn get(&self, k: &ConvKey, dir: usize) -> Option<i32> {
        self.chosen.get(&(*k, dir)).copied()
    }

    /// Remember a choice; one appended line, so concurrent runs at worst time a shape twice.
    pub fn put(&mut self, k: &ConvKey, dir: usize, algo: i32) {
        self.chosen.insert((*k, dir), algo);
        if let Some(p) = &self.path {
            let _ = std::fs::create_dir_all(p.parent().unwrap_or(p));
            append_line(p, &memo_line(&self.device, k, dir, algo));
        }
    }
}

/// One appended line (one write: a reader sees a whole line or a torn last one, which it skips).
/// A file that cannot be written costs only the record.
fn append_line(p: &std::path::Path, line: &str) {
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(p)
    {
        let _ = f.write_all(line.as_bytes());
    }
}

/// `device \t n cin cout h w k stride pad bf16 \t direction \t algorithm`.
pub(crate) fn memo_line(device: &str, k: &ConvKey, dir: usize, algo: i32) -> String {
    format!(
        "{device}\t{} {} {} {} {} {} {} {} {}\t{dir}\t{algo}\n",
        k.s.n, k.s.cin, k.s.cout, k.s.h, k.s.w, k.s.k, k.s.stride, k.s.pad, k.bf16 as u8
    )
}

/// This device's choices in a memo file; lines of other devices and malformed lines (a torn
/// write, an edit) are ignored, and a later line wins. Lines written before convolutions had a
/// kernel size (`n cin cout h w bf16`) were all 3x3, stride 1, padding 1.
fn parse_memo(text: &str, device: &str) -> HashMap<(ConvKey, usize), i32> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() != 4 || f[0] != device {
            continue;
        }
        let v: Vec<usize> = f[1].split(' ').filter_map(|x| x.parse().ok()).collect();
        let (Ok(dir), Ok(algo)) = (f[2].parse::<usize>(), f[3].parse::<i32>()) else {
            continue;
        };
        // Every field must parse: a damaged number must not shift the others into place.
        if v.len() != f[1].split(' ').count() || dir > 2 {
            continue;
        }
        let (k, stride, pad, bf16) = match v.len() {
            6 => (3, 1, 1, v[5]),
            9 => (v[5], v[6], v[7], v[8]),
            _ => continue,
        };
        if bf16 > 1 || stride == 0 {
            continue;
        }
        let s = ConvShape {
            n: v[0],
            cin: v[1],
            cout: v[2],
            h: v[3],
            w: v[4],
            k,
            stride,
            pad,
        };
        let k = ConvKey::new(&s, bf16 == 1);
        out.insert((k, dir), algo);
    }
    out
}

impl Drop for Plan {
    fn drop(&mut self) {
        unsafe {
            dnn::cudnnDestroyTensorDescriptor(self.x);
            dnn::cudnnDestroyTensorDescriptor(self.y);
            dnn::cudnnDestroyFilterDescriptor(self.w);
            dnn::cudnnDestroyConvolutionDescriptor(self.conv);
        }
    }
}

pub struct Dnn {
    pub handle: dnn::cudnnHandle_t,
    pub blas: blas::cublasHandle_t,
    plans: HashMap<ConvKey, Plan>,
}

/// Whether algorithm `algo` of direction `dir` (0 forward, 1 backward data, 2 backward filter)
/// computes the convolution as sums of products (GEMM-like), not through FFT or Winograd
/// transforms.
/// Where algorithm `algo` of direction `dir` stands among those that sum products as written,
/// closest to the CPU's order first; None for the others.
fn sums_products(dir: usize, algo: i32) -> Option<usize> {
    use dnn::cudnnConvolutionBwdDataAlgo_t as D;
    use dnn::cudnnConvolutionBwdFilterAlgo_t as F;
    use dnn::cudnnConvolutionFwdAlgo_t as W;
    let ok: &[i32] = match dir {
        0 => &[
            W::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM as i32,
            W::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM as i32,
            W::CUDNN_CONVOLUTION_FWD_ALGO_GEMM as i32,
            W::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT as i32,
        ],
        1 => &[
            D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 as i32,
            D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 as i32,
        ],
        _ => &[
            F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 as i32,
            F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 as i32,
            F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3 as i32,
        ],
    };
    ok.iter().position(|&a| a == algo)
}

/// Whether algorithm `algo` of direction `dir` gives the same bits every time: what cuDNN
/// `reported`, and never the algorithms its documentation names non-deterministic (atomic
/// additions: backward data ALGO_0, backward filter ALGO_0 and ALGO_3), whatever a report says.
fn deterministic(dir: usize, algo: i32, reported: bool) -> bool {
    use dnn::cudnnConvolutionBwdDataAlgo_t as D;
    use dnn::cudnnConvolutionBwdFilterAlgo_t as F;
    let atomics: &[i32] = match dir {
        1 => &[D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 as i32],
        2 => &[
            F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 as i32,
            F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3 as i32,
        ],
        _ => &[],
    };
    reported && !atomics.contains(&algo)
}

/// Workspace cuDNN may use for one convolution.
const MAX_WORKSPACE: usize = 256 << 20;

impl Dnn {
    /// cuDNN's and cuBLAS's handles on `stream`, made at once on two threads (each first call
    /// loads its library's state: about a tenth of a second apiece on an H100 host).
    pub fn new(ctx: &Arc<CudaContext>, stream: CUstream) -> Result<Self, String> {
        // Handles and the stream cross threads as integers; each is used by one thread at a time.
        let st = stream as usize;
        let c = ctx.clone();
        let blas_thread = std::thread::spawn(move || -> Result<usize, String> {
            c.bind_to_thread().map_err(|e| format!("{e:?}"))?;
            let mut b = std::ptr::null_mut();
            unsafe {
                check_blas(blas::cublasCreate_v2(&mut b), "create")?;
                let set = check_blas(blas::cublasSetStream_v2(b, st as _), "set stream");
                if let Err(e) = set {
                    blas::cublasDestroy_v2(b);
                    return Err(e);
                }
            }
            Ok(b as usize)
        });
        let mut handle = std::ptr::null_mut();
        let made = unsafe {
            check(dnn::cudnnCreate(&mut handle), "create")
                .and_then(|()| check(dnn::cudnnSetStream(handle, stream as _), "set stream"))
        };
        let b = blas_thread
            .join()
            .unwrap_or_else(|_| Err("cuBLAS: creating the handle panicked".into()));
        let destroy = || unsafe {
            if !handle.is_null() {
                dnn::cudnnDestroy(handle);
            }
        };
        match (made, b) {
            (Ok(()), Ok(b)) => Ok(Dnn {
                handle,
                blas: b as blas::cublasHandle_t,
                plans: HashMap::new(),
            }),
            (Err(e), b) => {
                if let Ok(b) = b {
                    unsafe { blas::cublasDestroy_v2(b as blas::cublasHandle_t) };
                }
                destroy();
                Err(e)
            }
            (Ok(()), Err(e)) => {
                destroy();
                Err(e)
            }
        }
    }

    pub fn plan_mut(&mut self, k: &ConvKey) -> Option<&mut Plan> {
        self.plans.get_mut(k)
    }

    pub fn plan(&mut self, k: ConvKey, stream: CUstream) -> Result<&Plan, String> {
        if !self.plans.contains_key(&k) {
            let p = unsafe { self.make_plan(k, stream)? };
            self.plans.insert(k, p);
        }
        Ok(&self.plans[&k])
    }

    unsafe fn make_plan(&self, k: ConvKey, stream: CUstream) -> Result<Plan, String> {
        let s = k.s;
        if s.stride == 0 || s.oh() == 0 || s.ow() == 0 {
            return Err(format!("a convolution whose kernel does not fit: {k:?}"));
        }
        self.make_plan_for(k, stream).map_err(|e| {
            // cuDNN documents its tensors as limited to 2^31 - 1 elements; say so rather than
            // leave a bare BAD_PARAM.
            let most = (s.n * s.cin * s.h * s.w).max(s.n * s.cout * s.oh() * s.ow());
            if most > i32::MAX as usize {
                format!(
                    "{e} (a tensor of {most} elements, over cuDNN's 2^31 - 1: a smaller batch \
                     may fit)"
                )
            } else {
                e
            }
        })
    }

    /// `k`'s plan: its descriptors, and the candidate algorithms of each direction.
    unsafe fn make_plan_for(&self, k: ConvKey, stream: CUstream) -> Result<Plan, String> {
        check_fits_cudnn(&k)?;
        let mut p = Plan::unset();
        // From here on `p` owns what is created: an error drops it, and with it the descriptors.
        p.create_descriptors()?;
        p.describe(&k)?;
        p.check_output_size(&k)?;
        p.set_math_type(&k)?;

        // cuDNN's heuristics rank the algorithms for this shape without running any (cudnnFind
        // ran every one, with its workspace, on the critical path of a run's start: about half a
        // second for the small model). The ranking's first usable candidate is the pick unless
        // this run or this GPU's memo names another (`Cuda::tune`); with PREP_CUDNN_TUNE=1 the
        // candidates are timed on the first real batch. The workspace fits every candidate.
        let _ = stream;
        let h = self.handle;
        let found = rank_forward(h, &p)?;
        p.add_candidates(&k, 0, &found);
        let found = rank_backward_data(h, &p)?;
        p.add_candidates(&k, 1, &found);
        let found = rank_backward_filter(h, &p)?;
        p.add_candidates(&k, 2, &found);
        p.check_candidates(&k)?;
        p.pick_first_candidates();
        Ok(p)
    }
}

/// Refuse a convolution with a size cuDNN's 32-bit arguments cannot hold.
fn check_fits_cudnn(k: &ConvKey) -> Result<(), String> {
    let s = k.s;
    let (oh, ow) = (s.oh(), s.ow());
    let dims = [
        k.s.n, k.s.cin, k.s.cout, k.s.h, k.s.w, k.s.k, k.s.stride, k.s.pad, oh, ow,
    ];
    if dims.iter().any(|&d| d > i32::MAX as usize) {
        return Err(format!("a convolution too large for cuDNN: {k:?}"));
    }
    Ok(())
}

/// An algorithm cuDNN ranked: (algorithm, workspace bytes, deterministic).
type Found = (i32, usize, bool);

impl Plan {
    /// A plan with no descriptors yet and placeholder algorithms.
    fn unset() -> Plan {
        Plan {
            x: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            w: std::ptr::null_mut(),
            conv: std::ptr::null_mut(),
            fwd: dnn::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
            bwd_data: dnn::cudnnConvolutionBwdDataAlgo_t::CUDNN_CONVOLUTION_BWD_DATA_ALGO_0,
            bwd_filter: dnn::cudnnConvolutionBwdFilterAlgo_t::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0,
            workspace: 0,
            candidates: [Vec::new(), Vec::new(), Vec::new()],
            tuned: [false; 3],
        }
    }

    /// Create the input, output, filter and convolution descriptors, owned by the plan.
    unsafe fn create_descriptors(&mut self) -> Result<(), String> {
        let p = self;
        check(
            dnn::cudnnCreateTensorDescriptor(&mut p.x),
            "tensor descriptor",
        )?;
        check(
            dnn::cudnnCreateTensorDescriptor(&mut p.y),
            "tensor descriptor",
        )?;
        check(
            dnn::cudnnCreateFilterDescriptor(&mut p.w),
            "filter descriptor",
        )?;
        check(
            dnn::cudnnCreateConvolutionDescriptor(&mut p.conv),
            "convolution descriptor",
        )
    }

    /// Set the descriptors to `k`'s shapes, channels last, and its padding and stride.
    unsafe fn describe(&self, k: &ConvKey) -> Result<(), String> {
        use dnn::cudnnDataType_t::*;
        let p = self;
        let dt = if k.bf16 {
            CUDNN_DATA_BFLOAT16
        } else {
            CUDNN_DATA_FLOAT
        };
        // Channels last: tensor cores read NHWC without transposing (NCHW cost twice the time).
        let nhwc = dnn::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC;
        let (oh, ow) = (k.s.oh(), k.s.ow());
        let i = |v: usize| v as i32;
        check(
            dnn::cudnnSetTensor4dDescriptor(
                p.x,
                nhwc,
                dt,
                i(k.s.n),
                i(k.s.cin),
                i(k.s.h),
                i(k.s.w),
            ),
            "input shape",
        )?;
        check(
            dnn::cudnnSetTensor4dDescriptor(p.y, nhwc, dt, i(k.s.n), i(k.s.cout), i(oh), i(ow)),
            "output shape",
        )?;
        check(
            dnn::cudnnSetFilter4dDescriptor(
                p.w,
                dt,
                nhwc,
                i(k.s.cout),
                i(k.s.cin),
                i(k.s.k),
                i(k.s.k),
            ),
            "filter shape",
        )?;
        check(
            dnn::cudnnSetConvolution2dDescriptor(
                p.conv,
                i(k.s.pad),
                i(k.s.pad),
                i(k.s.stride),
                i(k.s.stride),
                1,
                1,
                dnn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                CUDNN_DATA_FLOAT,
            ),
            "convolution",
        )
    }

    /// Refuse a plan whose output size cuDNN computes differently from ours.
    unsafe fn check_output_size(&self, k: &ConvKey) -> Result<(), String> {
        let p = self;
        let (oh, ow) = (k.s.oh(), k.s.ow());
        let i = |v: usize| v as i32;
        // The output size is ours (`out_size`); cuDNN must agree, or the buffers would be wrong.
        let (mut cn, mut cc, mut ch, mut cw) = (0, 0, 0, 0);
        check(
            dnn::cudnnGetConvolution2dForwardOutputDim(
                p.conv, p.x, p.w, &mut cn, &mut cc, &mut ch, &mut cw,
            ),
            "output size",
        )?;
        if [cn, cc, ch, cw] != [i(k.s.n), i(k.s.cout), i(oh), i(ow)] {
            return Err(format!(
                "cuDNN computes a {cn}x{cc}x{ch}x{cw} output for {k:?}, not {}x{}x{oh}x{ow}",
                k.s.n, k.s.cout
            ));
        }
        Ok(())
    }

    /// Set the convolution's arithmetic: FMA in float32, tensor cores in bfloat16.
    unsafe fn set_math_type(&self, k: &ConvKey) -> Result<(), String> {
        // float32: plain FMA arithmetic, the reference. bfloat16: tensor cores.
        let math = if k.bf16 {
            dnn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH
        } else {
            dnn::cudnnMathType_t::CUDNN_FMA_MATH
        };
        check(
            dnn::cudnnSetConvolutionMathType(self.conv, math),
            "math type",
        )
    }

    /// Add direction `dir`'s candidates among `found` and grow the workspace to fit them.
    fn add_candidates(&mut self, k: &ConvKey, dir: usize, found: &[Found]) {
        // Deterministic algorithms only where cuDNN has any (atomics-based ones otherwise): the
        // candidate set, and with it the pick, is the same in every process, so runs repeat bit
        // for bit and a resumed run ends where an uninterrupted one does.
        // In float32, the reference arithmetic, only algorithms that sum products as written
        // (unless there are none): FFT and Winograd transforms were measured 2.2e-3 off the CPU's
        // weight gradient.
        // Those come in a fixed order, not the heuristics': with IMPLICIT_PRECOMP_GEMM first
        // (the heuristics' pick for 64x64x7x7) a ReLU mask flipped on a value next to 0 and the
        // CPU comparison of whole steps was 1e-3 off (IMPLICIT_GEMM: 5e-6).
        let p = self;
        let mut plain: Vec<_> = found
            .iter()
            .copied()
            .filter(|f| k.bf16 || sums_products(dir, f.0).is_some())
            .collect();
        if !k.bf16 {
            plain.sort_by_key(|f| sums_products(dir, f.0));
        }
        let found = if plain.is_empty() {
            found.to_vec()
        } else {
            plain
        };
        let any_det = found.iter().any(|f| f.2);
        for &(algo, mem, _) in found.iter().filter(|f| f.2 || !any_det) {
            if !p.candidates[dir].contains(&algo) {
                p.candidates[dir].push(algo);
            }
            p.workspace = p.workspace.max(mem);
        }
    }

    /// Refuse a plan without a candidate in some direction.
    fn check_candidates(&self, k: &ConvKey) -> Result<(), String> {
        for (i, what) in ["forward", "backward-data", "backward-filter"]
            .iter()
            .enumerate()
        {
            if self.candidates[i].is_empty() {
                return Err(format!("cuDNN has no {what} convolution for {k:?}"));
            }
        }
        Ok(())
    }

    /// Use each direction's first candidate until tuning or a memo says otherwise.
    unsafe fn pick_first_candidates(&mut self) {
        let p = self;
        p.fwd = std::mem::transmute::<i32, dnn::cudnnConvolutionFwdAlgo_t>(p.candidates[0][0]);
        p.bwd_data =
            std::mem::transmute::<i32, dnn::cudnnConvolutionBwdDataAlgo_t>(p.candidates[1][0]);
        p.bwd_filter =
            std::mem::transmute::<i32, dnn::cudnnConvolutionBwdFilterAlgo_t>(p.candidates[2][0]);
    }
}

/// The workspace a candidate needs: the larger of what the heuristics reported and what
/// cudnnGet*WorkspaceSize says for the algorithm (cudnnFind's figure alone was once too
/// small: 3x128x128, batch 256, backward filter failed with BAD_PARAM,
/// "workSpaceSizeInBytes < requiredWorkspace"). A candidate whose query fails or that
/// needs more than MAX_WORKSPACE is dropped.
fn usable(
    st: dnn::cudnnStatus_t,
    found_mem: usize,
    query: &dyn Fn(&mut usize) -> dnn::cudnnStatus_t,
) -> Option<usize> {
    use dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS as OK;
    if st != OK {
        return None;
    }
    let mut need = 0usize;
    if query(&mut need) != OK {
        return None;
    }
    let mem = found_mem.max(need);
    (mem <= MAX_WORKSPACE).then_some(mem)
}

/// The usable forward algorithms cuDNN's heuristics rank for `p`, best first.
unsafe fn rank_forward(h: dnn::cudnnHandle_t, p: &Plan) -> Result<Vec<Found>, String> {
    let det = dnn::cudnnDeterminism_t::CUDNN_DETERMINISTIC;
    let mut count = 0;
    let mut r: [dnn::cudnnConvolutionFwdAlgoPerf_t; 8] = std::mem::zeroed();
    check(
        dnn::cudnnGetConvolutionForwardAlgorithm_v7(
            h,
            p.x,
            p.w,
            p.conv,
            p.y,
            r.len() as i32,
            &mut count,
            r.as_mut_ptr(),
        ),
        "ranking forward algorithms",
    )?;
    let found: Vec<_> = r[..(count.max(0) as usize).min(r.len())]
        .iter()
        .filter_map(|r| {
            let q = |m: &mut usize| {
                dnn::cudnnGetConvolutionForwardWorkspaceSize(h, p.x, p.w, p.conv, p.y, r.algo, m)
            };
            let mem = usable(r.status, r.memory, &q)?;
            let a = r.algo as i32;
            Some((a, mem, deterministic(0, a, r.determinism == det)))
        })
        .collect();
    Ok(found)
}

/// The usable backward-data algorithms cuDNN's heuristics rank for `p`, best first.
unsafe fn rank_backward_data(h: dnn::cudnnHandle_t, p: &Plan) -> Result<Vec<Found>, String> {
    let det = dnn::cudnnDeterminism_t::CUDNN_DETERMINISTIC;
    let mut count = 0;
    let mut r: [dnn::cudnnConvolutionBwdDataAlgoPerf_t; 8] = std::mem::zeroed();
    check(
        dnn::cudnnGetConvolutionBackwardDataAlgorithm_v7(
            h,
            p.w,
            p.y,
            p.conv,
            p.x,
            r.len() as i32,
            &mut count,
            r.as_mut_ptr(),
        ),
        "ranking backward-data algorithms",
    )?;
    let found: Vec<_> = r[..(count.max(0) as usize).min(r.len())]
        .iter()
        .filter_map(|r| {
            let q = |m: &mut usize| {
                dnn::cudnnGetConvolutionBackwardDataWorkspaceSize(
                    h, p.w, p.y, p.conv, p.x, r.algo, m,
                )
            };
            let mem = usable(r.status, r.memory, &q)?;
            let a = r.algo as i32;
            Some((a, mem, deterministic(1, a, r.determinism == det)))
        })
        .collect();
    Ok(found)
}

/// The usable backward-filter algorithms cuDNN's heuristics rank for `p`, best first.
unsafe fn rank_backward_filter(h: dnn::cudnnHandle_t, p: &Plan) -> Result<Vec<Found>, String> {
    let det = dnn::cudnnDeterminism_t::CUDNN_DETERMINISTIC;
    let mut count = 0;
    let mut r: [dnn::cudnnConvolutionBwdFilterAlgoPerf_t; 8] = std::mem::zeroed();
    check(
        dnn::cudnnGetConvolutionBackwardFilterAlgorithm_v7(
            h,
            p.x,
            p.y,
            p.conv,
            p.w,
            r.len() as i32,
            &mut count,
            r.as_mut_ptr(),
        ),
        "ranking backward-filter algorithms",
    )?;
    let found: Vec<_> = r[..(count.max(0) as usize).min(r.len())]
        .iter()
        .filter_map(|r| {
            let q = |m: &mut usize| {
                dnn::cudnnGetConvolutionBackwardFilterWorkspaceSize(
                    h, p.x, p.y, p.conv, p.w, r.algo, m,
                )
            };
            let mem = usable(r.status, r.memory, &q)?;
            let a = r.algo as i32;
            Some((a, mem, deterministic(2, a, r.determinism == det)))
        })
        .collect();
    Ok(found)
}

impl Drop for Dnn {
    fn drop(&mut self) {
        self.plans.clear();
        unsafe {
            dnn::cudnnDestroy(self.handle);
            blas::cublasDestroy_v2(self.blas);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memo_reads_back_what_it_wrote_and_skips_other_devices_and_damage() {
        let s = ConvShape {
            n: 512,
            cin: 3,
            cout: 32,
            h: 32,
            w: 32,
            k: 7,
            stride: 2,
            pad: 3,
        };
        let k = ConvKey::new(&s, true);
        let k2 = ConvKey::new(&s, false);
        let k3 = ConvKey::new(&ConvShape { stride: 1, ..s }, true);
        let dev = "NVIDIA H200 / cuDNN 91000";
        let text = [
            memo_line(dev, &k, 2, 1),
            memo_line("NVIDIA H100 / cuDNN 91000", &k, 0, 6),
            memo_line(dev, &k2, 0, 7),
            memo_line(dev, &k3, 1, 4),
            "NVIDIA H200 / cuDNN 91000\t512 3 32 32\t0\t1\n".into(),
            "NVIDIA H200 / cuDNN 91000\t512 3 32 32 32 7 2 3 1\t9\t1\n".into(),
            "NVIDIA H200 / cuDNN 91000\t512 3 32 32 32 7 2 3 1\t0\tx\n".into(),
            "NVIDIA H200 / cuDNN 91000\t512 3 32 32 32 7 2 3 2\t0\t1\n".into(),
            // One damaged field of nine must not pass for an old line of six.
            "NVIDIA H200 / cuDNN 91000\t512 3 32 32 32 x 2 3 1\t0\t1\n".into(),
            "NVIDIA H200 / cuDNN 91000\t512 3 32 32 32 7 0 3 1\t0\t1\n".into(),
            "\u{0}\u{ff}garbage\n".into(),
            memo_line(dev, &k, 2, 3),
            memo_line(dev, &k, 0, 2)[..20].into(),
        ]
        .concat();
        let m = parse_memo(&text, dev);
        assert_eq!(m.len(), 3, "{m:?}");
        assert_eq!(m[&(k, 2)], 3, "a later line wins");
        assert_eq!(m[&(k2, 0)], 7);
        assert_eq!(m[&(k3, 1)], 4);
        assert!(!m.contains_key(&(k, 0)));
    }

    #[test]
    fn memo_lines_without_a_kernel_size_are_3x3_stride_1_padding_1() {
        let dev = "NVIDIA H100 80GB HBM3 / cuDNN 91002";
        let text = format!("{dev}\t256 3 32 128 128 1\t2\t1\n{dev}\t256 32 64 64 64 0\t0\t6\n");
        let m = parse_memo(&text, dev);
        let old = |cin, cout, h, bf16| {
            ConvKey::new(
                &ConvShape {
                    n: 256,
                    cin,
                    cout,
                    h,
                    w: h,
                    k: 3,
                    stride: 1,
                    pad: 1,
                },
                bf16,
            )
        };
        assert_eq!(m.len(), 2, "{m:?}");
        assert_eq!(m[&(old(3, 32, 128, true), 2)], 1);
        assert_eq!(m[&(old(32, 64, 64, false), 0)], 6);
        // Written back in the new form, the same key reads the same.
        let k = old(3, 32, 128, true);
        let again = parse_memo(&memo_line(dev, &k, 2, 1), dev);
        assert_eq!(again[&(k, 2)], 1);
        assert_eq!(k.s.oh(), 128);
    }
}
