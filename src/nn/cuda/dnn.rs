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
    /// Workspace bytes the candidate algorithms need (the largest).
    pub workspace: usize,
    /// Candidate algorithms of each direction (forward, backward data, backward filter), and
    /// whether the backend has timed them on a real batch yet.
    pub candidates: [Vec<i32>; 3],
    pub tuned: [bool; 3],
}

/// Algorithms per direction that are timed on a real batch.
const CANDIDATES: usize = 4;

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
            candidates: [Vec::new(), Vec::new(), Vec::new()],
            tuned: [false; 3],
        };
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

        // cuDNN's own measurement (cudnnFind) gives the candidates, fastest first; it once
        // ranked first an atomics-based backward-filter algorithm that then ran 15 times slower
        // on real batches, so the backend times the candidates again on the first real batch
        // (`Cuda::tune`) and keeps the fastest. The workspace fits every candidate.
        let _ = stream;
        let ok = |st: dnn::cudnnStatus_t, mem: usize| {
            st == dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS && mem <= MAX_WORKSPACE
        };
        let mut count = 0;
        let mut r: [dnn::cudnnConvolutionFwdAlgoPerf_t; 8] = std::mem::zeroed();
        check(
            dnn::cudnnFindConvolutionForwardAlgorithm(
                self.handle,
                p.x,
                p.w,
                p.conv,
                p.y,
                8,
                &mut count,
                r.as_mut_ptr(),
            ),
            "finding a forward algorithm",
        )?;
        for r in r[..count as usize]
            .iter()
            .filter(|r| ok(r.status, r.memory))
            .take(CANDIDATES)
        {
            if !p.candidates[0].contains(&(r.algo as i32)) {
                p.candidates[0].push(r.algo as i32);
            }
            p.workspace = p.workspace.max(r.memory);
        }
        let mut r: [dnn::cudnnConvolutionBwdDataAlgoPerf_t; 8] = std::mem::zeroed();
        check(
            dnn::cudnnFindConvolutionBackwardDataAlgorithm(
                self.handle,
                p.w,
                p.y,
                p.conv,
                p.x,
                8,
                &mut count,
                r.as_mut_ptr(),
            ),
            "finding a backward-data algorithm",
        )?;
        for r in r[..count as usize]
            .iter()
            .filter(|r| ok(r.status, r.memory))
            .take(CANDIDATES)
        {
            if !p.candidates[1].contains(&(r.algo as i32)) {
                p.candidates[1].push(r.algo as i32);
            }
            p.workspace = p.workspace.max(r.memory);
        }
        let mut r: [dnn::cudnnConvolutionBwdFilterAlgoPerf_t; 8] = std::mem::zeroed();
        check(
            dnn::cudnnFindConvolutionBackwardFilterAlgorithm(
                self.handle,
                p.x,
                p.y,
                p.conv,
                p.w,
                8,
                &mut count,
                r.as_mut_ptr(),
            ),
            "finding a backward-filter algorithm",
        )?;
        for r in r[..count as usize]
            .iter()
            .filter(|r| ok(r.status, r.memory))
            .take(CANDIDATES)
        {
            if !p.candidates[2].contains(&(r.algo as i32)) {
                p.candidates[2].push(r.algo as i32);
            }
            p.workspace = p.workspace.max(r.memory);
        }
        for (i, what) in ["forward", "backward-data", "backward-filter"]
            .iter()
            .enumerate()
        {
            if p.candidates[i].is_empty() {
                return Err(format!("cuDNN has no {what} convolution for {k:?}"));
            }
        }
        p.fwd = std::mem::transmute::<i32, dnn::cudnnConvolutionFwdAlgo_t>(p.candidates[0][0]);
        p.bwd_data =
            std::mem::transmute::<i32, dnn::cudnnConvolutionBwdDataAlgo_t>(p.candidates[1][0]);
        p.bwd_filter =
            std::mem::transmute::<i32, dnn::cudnnConvolutionBwdFilterAlgo_t>(p.candidates[2][0]);
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
