//! The U-Net's layers on the GPU (kernels/unet.cu), NHWC in the activations' type: channel
//! concatenation and its split, nearest-neighbour resizing, a per-channel bias. `Backend for
//! Cuda` delegates to these. No host synchronisation and, after a first step, no allocation:
//! a recorded step replays them.

use super::backend::check_act;
use super::*;

/// The vector width of a channel copy: 8 where the copied run, both row strides and both
/// offsets are multiples of 8 (16-byte accesses), else 1.
fn copy_width(d: &[usize]) -> usize {
    if d.iter().all(|v| v % 8 == 0) {
        8
    } else {
        1
    }
}

/// A size as a kernel's int argument.
fn int(v: usize, what: &str) -> i32 {
    i32::try_from(v).unwrap_or_else(|_| panic!("{what}: {v} is over 2^31"))
}

impl Cuda {
    /// dst[row, doff..doff + cw] = src[row, soff..soff + cw] over the n * hw rows.
    #[allow(clippy::too_many_arguments)]
    fn channel_copy(
        &mut self,
        src: &Buf,
        dst: &Buf,
        n: usize,
        hw: usize,
        cw: usize,
        (sstride, soff): (usize, usize),
        (dstride, doff): (usize, usize),
    ) {
        if cw == 0 || n * hw == 0 {
            return;
        }
        let v = copy_width(&[cw, sstride, soff, dstride, doff]);
        let g = self.sample_grid(n, hw * cw / v);
        let name = format!("channel_copy_{}_v{v}", src.dt.suffix());
        launch!(self, &name, g, THREADS;
            src.ptr, dst.ptr, n as i64, int(hw, "concat pixels"), int(cw, "concat channels"),
            sstride as i32, soff as i32, dstride as i32, doff as i32);
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn concat_fwd(
        &mut self,
        a: &Buf,
        b: &Buf,
        y: &mut Buf,
        n: usize,
        ca: usize,
        cb: usize,
        hw: usize,
    ) {
        self.expect_act(a, "concat input");
        self.expect_act(b, "concat input");
        check_act(a, n, ca, hw, "concat first input");
        check_act(b, n, cb, hw, "concat second input");
        let c = ca + cb;
        int(hw * c, "concat values of a sample");
        if !self.ensure(y, n * hw * c, a.dt) {
            return;
        }
        y.act = Some(Nhwc::of(n, c, hw));
        self.channel_copy(a, y, n, hw, ca, (ca, 0), (c, 0));
        self.channel_copy(b, y, n, hw, cb, (cb, 0), (c, ca));
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn concat_bwd(
        &mut self,
        dy: &Buf,
        da: Option<&mut Buf>,
        db: Option<&mut Buf>,
        n: usize,
        ca: usize,
        cb: usize,
        hw: usize,
    ) {
        self.expect_act(dy, "concat_backward gradient");
        let c = ca + cb;
        check_act(dy, n, c, hw, "concat_backward gradient");
        int(hw * c, "concat values of a sample");
        for (d, cw, off) in [(da, ca, 0), (db, cb, ca)] {
            let Some(d) = d else { continue };
            if !self.ensure(d, n * hw * cw, dy.dt) {
                return;
            }
            d.act = Some(Nhwc::of(n, cw, hw));
            self.channel_copy(dy, d, n, hw, cw, (c, off), (cw, 0));
        }
    }

    /// The int arguments [c, h, w, oh, ow] of the resizing kernels, checking that a sample's
    /// values of either side count below 2^31.
    fn upsample_args(c: usize, h: usize, w: usize, oh: usize, ow: usize) -> [i32; 5] {
        int(c * h * w, "upsample input values of a sample");
        int(c * oh * ow, "upsample output values of a sample");
        [c, h, w, oh, ow].map(|v| v as i32)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn upsample_fwd(
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
        self.expect_act(x, "upsample input");
        check_act(x, n, c, h * w, "upsample");
        assert!(
            h * w > 0 || oh * ow == 0,
            "upsample: an empty {h}x{w} image to {oh}x{ow}"
        );
        let [ci, hi, wi, ohi, owi] = Self::upsample_args(c, h, w, oh, ow);
        if !self.ensure(y, n * c * oh * ow, x.dt) {
            return;
        }
        y.act = Some(Nhwc::of(n, c, oh * ow));
        let v = vec_width(c);
        let g = self.sample_grid(n, oh * ow * c / v);
        launch!(self, &format!("upsample_{}_v{v}", x.dt.suffix()), g, THREADS;
            x.ptr, y.ptr, n as i64, ci, hi, wi, ohi, owi);
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn upsample_bwd(
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
        self.expect_act(dy, "upsample_backward gradient");
        check_act(dy, n, c, oh * ow, "upsample_backward gradient");
        let [ci, hi, wi, ohi, owi] = Self::upsample_args(c, h, w, oh, ow);
        if !self.ensure(dx, n * c * h * w, dy.dt) {
            return;
        }
        dx.act = Some(Nhwc::of(n, c, h * w));
        let v = vec_width(c);
        let g = self.sample_grid(n, h * w * c / v);
        launch!(self, &format!("upsample_bwd_{}_v{v}", dy.dt.suffix()), g, THREADS;
            dy.ptr, dx.ptr, n as i64, ci, hi, wi, ohi, owi);
    }

    pub(super) fn bias_fwd(
        &mut self,
        x: &Buf,
        b: &Buf,
        y: &mut Buf,
        n: usize,
        c: usize,
        hw: usize,
    ) {
        self.expect_act(x, "bias input");
        check_act(x, n, c, hw, "bias");
        assert!(
            b.dt == Dt::F32 && b.len >= c,
            "bias: {} {:?} biases for {c} channels",
            b.len,
            b.dt
        );
        let total = n * c * hw;
        if !self.ensure(y, total, x.dt) {
            return;
        }
        y.act = Some(Nhwc::of(n, c, hw));
        let v = vec_width(c);
        let g = self.grid(total / v);
        launch!(self, &format!("bias_{}_v{v}", x.dt.suffix()), (g, 1), THREADS;
            x.ptr, b.ptr, y.ptr, total as i64, int(c, "bias channels"));
    }

    /// db in two passes: partial sums of row ranges per channel (about four blocks per
    /// multiprocessor), then their sum in order (deterministic, as the batch-norm sums).
    pub(super) fn bias_bwd(&mut self, dy: &Buf, db: &mut Buf, n: usize, c: usize, hw: usize) {
        self.expect_act(dy, "bias_backward gradient");
        check_act(dy, n, c, hw, "bias_backward gradient");
        let rows = n * hw;
        let tiles = c.div_ceil(32).max(1);
        let splits = (4 * self.sms as usize)
            .div_ceil(tiles)
            .clamp(1, rows.div_ceil(8).max(1));
        let chunk = rows.div_ceil(splits).max(1);
        let mut part = {
            let e = self.empty(Dt::F32);
            std::mem::replace(&mut self.s.part, e)
        };
        let ok = self.grid_y_fits(tiles, "bias_backward channel blocks")
            && self.ensure(db, c, Dt::F32)
            && self.ensure(&mut part, splits * c, Dt::F32);
        if ok {
            let name = format!("bias_bwd_part_{}", dy.dt.suffix());
            launch!(self, &name, (splits as u32, tiles as u32), THREADS;
                dy.ptr, part.ptr, rows as i64, c as i32, chunk as i64);
            launch!(self, "bias_bwd_finalize", (blocks(c, THREADS), 1), THREADS;
                part.ptr, splits as i32, c as i32, db.ptr);
        }
        self.s.part = part;
    }
}
