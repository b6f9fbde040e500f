//! cuDNN convolutions and cuBLAS matrix products. A plan (descriptors and the algorithms cuDNN
//! measured fastest for this shape) is made once per shape and kept.

use cudarc::cublas::sys as blas;
use cudarc::cudnn::sys as dnn;
use cudarc::driver::sys::CUstream;
use std::collections::HashMap;

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

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct ConvKey {
    pub n: usize,
    pub cin: usize,
    pub cout: usize,
    pub h: usize,
    pub w: usize,
    pub bf16: bool,
}

pub struct Plan {
    pub x: dnn::cudnnTensorDescriptor_t,
    pub y: dnn::cudnnTensorDescriptor_t,
    pub w: dnn::cudnnFilterDescriptor_t,
    pub conv: dnn::cudnnConvolutionDescriptor_t,
    pub fwd: dnn::cudnnConvolutionFwdAlgo_t,
    pub bwd_data: dnn::cudnnConvolutionBwdDataAlgo_t,
    pub bwd_filter: dnn::cudnnConvolutionBwdFilterAlgo_t,
    /// Workspace bytes the three algorithms need (the largest).
    pub workspace: usize,
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

/// Workspace cuDNN may use for one convolution.
const MAX_WORKSPACE: usize = 256 << 20;

impl Dnn {
    pub fn new(stream: CUstream) -> Result<Self, String> {
        let mut handle = std::ptr::null_mut();
        let mut b = std::ptr::null_mut();
        unsafe {
            check(dnn::cudnnCreate(&mut handle), "create")?;
            check(dnn::cudnnSetStream(handle, stream as _), "set stream")?;
            check_blas(blas::cublasCreate_v2(&mut b), "create")?;
            check_blas(blas::cublasSetStream_v2(b, stream as _), "set stream")?;
        }
        Ok(Dnn {
            handle,
            blas: b,
            plans: HashMap::new(),
        })
    }

    pub fn plan(&mut self, k: ConvKey, stream: CUstream) -> Result<&Plan, String> {
        if !self.plans.contains_key(&k) {
            let p = unsafe { self.make_plan(k, stream)? };
            self.plans.insert(k, p);
        }
        Ok(&self.plans[&k])
    }

    unsafe fn make_plan(&self, k: ConvKey, stream: CUstream) -> Result<Plan, String> {
        use dnn::cudnnDataType_t::*;
        let dt = if k.bf16 {
            CUDNN_DATA_BFLOAT16
        } else {
            CUDNN_DATA_FLOAT
        };
        let nchw = dnn::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW;
        let i = |v: usize| v as i32;
        let mut p = Plan {
            x: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            w: std::ptr::null_mut(),
            conv: std::ptr::null_mut(),
            fwd: dnn::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
            bwd_data: dnn::cudnnConvolutionBwdDataAlgo_t::CUDNN_CONVOLUTION_BWD_DATA_ALGO_0,
            bwd_filter: dnn::cudnnConvolutionBwdFilterAlgo_t::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0,
            workspace: 0,
        };
        check(dnn::cudnnCreateTensorDescriptor(&mut p.x), "tensor descriptor")?;
        check(dnn::cudnnCreateTensorDescriptor(&mut p.y), "tensor descriptor")?;
        check(dnn::cudnnCreateFilterDescriptor(&mut p.w), "filter descriptor")?;
        check(
            dnn::cudnnCreateConvolutionDescriptor(&mut p.conv),
            "convolution descriptor",
        )?;
        check(
            dnn::cudnnSetTensor4dDescriptor(p.x, nchw, dt, i(k.n), i(k.cin), i(k.h), i(k.w)),
            "input shape",
        )?;
        check(
            dnn::cudnnSetTensor4dDescriptor(p.y, nchw, dt, i(k.n), i(k.cout), i(k.h), i(k.w)),
            "output shape",
        )?;
        check(
            dnn::cudnnSetFilter4dDescriptor(p.w, dt, nchw, i(k.cout), i(k.cin), 3, 3),
            "filter shape",
        )?;
        check(
            dnn::cudnnSetConvolution2dDescriptor(
                p.conv,
                1,
                1,
                1,
                1,
                1,
                1,
                dnn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                CUDNN_DATA_FLOAT,
            ),
            "convolution",
        )?;
        // float32: plain FMA arithmetic, the reference. bfloat16: tensor cores.
        let math = if k.bf16 {
            dnn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH
        } else {
            dnn::cudnnMathType_t::CUDNN_FMA_MATH
        };
        check(dnn::cudnnSetConvolutionMathType(p.conv, math), "math type")?;

        // cuDNN times every algorithm for this shape. Twice, keeping the algorithm with the lower
        // sum: a single noisy measurement once picked a backward-filter algorithm 15 times slower.
        let _ = stream;
        // Deterministic algorithms only: the atomics-based ones (ALGO_0 of the backward passes)
        // measured fast inside cudnnFind but ran 15 to 25 times slower on real batches.
        let ok = |st: dnn::cudnnStatus_t, mem: usize, det: dnn::cudnnDeterminism_t| {
            st == dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS
                && mem <= MAX_WORKSPACE
                && det == dnn::cudnnDeterminism_t::CUDNN_DETERMINISTIC
        };
        let mut fwd_t: HashMap<i32, f32> = HashMap::new();
        let mut bd_t: HashMap<i32, f32> = HashMap::new();
        let mut bf_t: HashMap<i32, f32> = HashMap::new();
        let mut mem: HashMap<(u8, i32), usize> = HashMap::new();
        for _ in 0..2 {
            let mut count = 0;
            let mut r: [dnn::cudnnConvolutionFwdAlgoPerf_t; 8] = std::mem::zeroed();
            check(
                dnn::cudnnFindConvolutionForwardAlgorithm(
                    self.handle, p.x, p.w, p.conv, p.y, 8, &mut count, r.as_mut_ptr(),
                ),
                "finding a forward algorithm",
            )?;
            for r in r[..count as usize].iter().filter(|r| ok(r.status, r.memory, r.determinism)) {
                *fwd_t.entry(r.algo as i32).or_default() += r.time;
                mem.insert((0, r.algo as i32), r.memory);
            }
            let mut r: [dnn::cudnnConvolutionBwdDataAlgoPerf_t; 8] = std::mem::zeroed();
            check(
                dnn::cudnnFindConvolutionBackwardDataAlgorithm(
                    self.handle, p.w, p.y, p.conv, p.x, 8, &mut count, r.as_mut_ptr(),
                ),
                "finding a backward-data algorithm",
            )?;
            for r in r[..count as usize].iter().filter(|r| ok(r.status, r.memory, r.determinism)) {
                *bd_t.entry(r.algo as i32).or_default() += r.time;
                mem.insert((1, r.algo as i32), r.memory);
            }
            let mut r: [dnn::cudnnConvolutionBwdFilterAlgoPerf_t; 8] = std::mem::zeroed();
            check(
                dnn::cudnnFindConvolutionBackwardFilterAlgorithm(
                    self.handle, p.x, p.y, p.conv, p.w, 8, &mut count, r.as_mut_ptr(),
                ),
                "finding a backward-filter algorithm",
            )?;
            for r in r[..count as usize].iter().filter(|r| ok(r.status, r.memory, r.determinism)) {
                *bf_t.entry(r.algo as i32).or_default() += r.time;
                mem.insert((2, r.algo as i32), r.memory);
            }
        }
        let best = |t: &HashMap<i32, f32>, what: &str| -> Result<i32, String> {
            t.iter()
                .min_by(|a, b| a.1.total_cmp(b.1))
                .map(|(&a, _)| a)
                .ok_or_else(|| format!("cuDNN has no {what} convolution for {k:?}"))
        };
        let (f, d, fl) = (best(&fwd_t, "forward")?, best(&bd_t, "backward-data")?, best(&bf_t, "backward-filter")?);
        p.fwd = std::mem::transmute::<i32, dnn::cudnnConvolutionFwdAlgo_t>(f);
        p.bwd_data = std::mem::transmute::<i32, dnn::cudnnConvolutionBwdDataAlgo_t>(d);
        p.bwd_filter = std::mem::transmute::<i32, dnn::cudnnConvolutionBwdFilterAlgo_t>(fl);
        p.workspace = mem[&(0, f)].max(mem[&(1, d)]).max(mem[&(2, fl)]);
        if std::env::var("PREP_PROFILE").as_deref() == Ok("1") {
            eprintln!(
                "cuDNN plan {k:?}: fwd {:?} {:.3} ms, bwd data {:?} {:.3} ms, bwd filter {:?} {:.3} ms (two measurements)",
                p.fwd, fwd_t[&f], p.bwd_data, bd_t[&d], p.bwd_filter, bf_t[&fl]
            );
        }
        Ok(p)
    }
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
