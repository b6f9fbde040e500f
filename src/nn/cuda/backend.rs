//! `Backend` for `Cuda`: each op of the models, as our kernels (batch norm, pooling, elementwise,
//! loss, SGD), cuBLAS (the linear layer) or the convolution and graph rooms beside this one.

use super::*;

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
pub(super) fn check_act(x: &Buf, n: usize, c: usize, hw: usize, what: &str) -> usize {
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
        self.conv_forward(x, w, y, s)
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
        self.conv_backward_pass(x, w, dy, dx, dw, s)
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

    // The U-Net's layers (layers.rs).
    fn concat(&mut self, a: &Buf, b: &Buf, y: &mut Buf, n: usize, ca: usize, cb: usize, hw: usize) {
        self.concat_fwd(a, b, y, n, ca, cb, hw)
    }
    fn concat_backward(
        &mut self,
        dy: &Buf,
        da: Option<&mut Buf>,
        db: Option<&mut Buf>,
        n: usize,
        ca: usize,
        cb: usize,
        hw: usize,
    ) {
        self.concat_bwd(dy, da, db, n, ca, cb, hw)
    }
    fn upsample(
        &mut self,
        x: &Buf,
        y: &mut Buf,
        n: usize,
        c: usize,
        h: usize,
        w: usize,
        oh: usize,
        ow: usize,
    ) {
        self.upsample_fwd(x, y, n, c, h, w, oh, ow)
    }
    fn upsample_backward(
        &mut self,
        dy: &Buf,
        dx: &mut Buf,
        n: usize,
        c: usize,
        h: usize,
        w: usize,
        oh: usize,
        ow: usize,
    ) {
        self.upsample_bwd(dy, dx, n, c, h, w, oh, ow)
    }
    fn bias(&mut self, x: &Buf, b: &Buf, y: &mut Buf, n: usize, c: usize, hw: usize) {
        self.bias_fwd(x, b, y, n, c, hw)
    }
    fn bias_backward(&mut self, dy: &Buf, db: &mut Buf, n: usize, c: usize, hw: usize) {
        self.bias_bwd(dy, db, n, c, hw)
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

    fn load_masks(
        &mut self,
        raw: &[u8],
        wide: bool,
        n: usize,
        h: usize,
        w: usize,
        pad: usize,
        aug: &[Aug],
        ignore: Option<u32>,
        out: &mut Buf,
    ) {
        self.load_masks_host(raw, wide, n, h, w, pad, aug, ignore, out)
    }
    fn load_targets(&mut self, values: &[f32], out: &mut Buf) {
        self.upload_into(out, values, Dt::F32)
    }
    fn seg_loss(
        &mut self,
        logits: &Buf,
        targets: &Buf,
        dice: f32,
        dlogits: &mut Buf,
        n: usize,
        k: usize,
        hw: usize,
    ) {
        self.seg_loss_impl(logits, targets, dice, dlogits, n, k, hw)
    }
    fn seg_score(&mut self, logits: &Buf, targets: &Buf, n: usize, k: usize, hw: usize) {
        self.seg_score_impl(logits, targets, n, k, hw)
    }
    fn take_seg_counts(&mut self, k: usize) -> Vec<u64> {
        self.take_seg_counts_impl(k)
    }
    fn bce_logits(&mut self, logits: &Buf, targets: &Buf, dlogits: &mut Buf, n: usize, k: usize) {
        self.bce_logits_impl(logits, targets, dlogits, n, k)
    }
    fn regression_loss(
        &mut self,
        pred: &Buf,
        targets: &Buf,
        smooth_l1: bool,
        dpred: &mut Buf,
        n: usize,
        k: usize,
    ) {
        self.regression_impl(pred, targets, smooth_l1, dpred, n, k)
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
        if self.world.is_none() || self.err.is_some() {
            return;
        }
        let t: Vec<(u64, usize)> = g.iter().map(|b| (b.ptr, b.len)).collect();
        self.average_f32_over_world(&t);
    }

    fn begin_capture(&mut self) -> bool {
        self.capture_begin()
    }

    fn end_capture(&mut self) -> bool {
        self.capture_end()
    }

    fn replay(&mut self, lr: f32) -> bool {
        self.graph_replay(lr)
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
