//! A training step recorded as a CUDA graph and replayed (the learning rate read from a
//! device buffer, so one recording serves every step while no buffer moves).

use super::*;

impl Cuda {
    pub(super) fn drop_graph(&mut self) {
        if let Some((g, e, _)) = self.graph.take() {
            unsafe {
                sys::cuGraphExecDestroy(e);
                sys::cuGraphDestroy(g);
            }
        }
    }

    pub(super) fn capture_begin(&mut self) -> bool {
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

    pub(super) fn capture_end(&mut self) -> bool {
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

    pub(super) fn graph_replay(&mut self, lr: f32) -> bool {
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
}
