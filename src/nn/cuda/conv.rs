//! Convolutions through cuDNN: plans per shape, the weights packed as cuDNN reads them, the
//! algorithm picked per direction (this run's, remembered, timed or the heuristics' first), and
//! the forward and backward passes that `Backend::conv` and `Backend::conv_backward` run.

use super::*;

/// Timing of candidate convolution algorithms: rounds, and runs per candidate in a round (one
/// round of three runs let noise pick differently from one process to the next).
const TUNE_ROUNDS: usize = 3;
const TUNE_RUNS: usize = 5;

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

fn cudnn_ok(r: cudnn::cudnnStatus_t, what: &str) -> Result<(), String> {
    dnn::check(r, what)
}

impl Cuda {
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

    pub(super) fn conv_forward(&mut self, x: &Buf, w: &Buf, y: &mut Buf, s: &ConvShape) {
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

    pub(super) fn conv_backward_pass(
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
}
