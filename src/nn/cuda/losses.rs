//! The targets and losses of the mask, labels and values tasks on the GPU (kernels/seg.cu): the
//! `Backend` methods of `Cuda` delegate here, and `load_masks_device` / `gather_targets_device`
//! serve a dataset held in GPU memory.
//!
//! Segmentation logits are an activation (NHWC, in the activation type) or a plain NCHW float
//! buffer; the gradient is written in the same layout and type, which is what the backward of
//! the layer that made them reads. The labels and values heads are the linear layer's [n, k]
//! float32. The segmentation loss is three kernels (per-block partial sums, their totals in
//! block order, gradient) that allocate nothing after the first call of a shape and read
//! nothing back: safe in a recorded graph, and the same bits on every run (no float is added
//! atomically; see kernels/seg.cu).

use super::*;

// seg_stats keeps one slot per warp of a block: SEG_WARPS = 8 in kernels/seg.cu.
const _: () = assert!(THREADS == 8 * 32);

/// Device buffers of the losses, kept between calls.
pub(super) struct LossBufs {
    /// `seg_loss`'s per-block partial sums (f64) [3k + 3][blocks]: the grid is fixed for a
    /// shape, so this is sized once per shape (seg_stats in kernels/seg.cu).
    part: Buf,
    /// Their totals in block order (f64): per class sum p_c g_c, sum p_c and pixels, then the
    /// cross-entropy sum, counted pixels and correct ones (seg_sums).
    sums: Buf,
    /// `seg_score`'s counters: 3k u64, in a buffer typed F64 (eight bytes a value).
    counts: Buf,
    /// The class count the counters are for (0: none).
    counts_k: usize,
}

impl LossBufs {
    pub(super) fn new(stream: sys::CUstream) -> Self {
        LossBufs {
            part: Buf::unallocated(Dt::F64, stream),
            sums: Buf::unallocated(Dt::F64, stream),
            counts: Buf::unallocated(Dt::F64, stream),
            counts_k: 0,
        }
    }
}

/// (channel stride, pixel stride) of segmentation logits [n, k, hw] as stored: NHWC for an
/// activation (which must be of that shape, without padded channels), NCHW for a plain buffer.
fn seg_layout(x: &Buf, n: usize, k: usize, hw: usize, what: &str) -> (i64, i64) {
    assert!(k >= 1, "{what}: no classes");
    assert!(
        x.len >= n * k * hw,
        "{what}: {} logits for {n}x{k}x{hw}",
        x.len
    );
    assert!(
        hw <= i32::MAX as usize && k <= i32::MAX as usize,
        "{what}: {k} classes of {hw} pixels"
    );
    match x.act {
        Some(a) => {
            assert_eq!(
                a,
                Nhwc::of(n, k, hw),
                "{what}: logits of {a:?} for {n}x{k}x{hw}"
            );
            (1, k as i64)
        }
        None => (hw as i64, 1),
    }
}

/// Rows of [n, k] (a head's output, or an activation [n, k, 1, 1]).
fn check_rows(x: &Buf, t: &Buf, n: usize, k: usize, what: &str) {
    assert!(
        x.len >= n * k && t.len >= n * k && t.dt == Dt::F32,
        "{what}: {} predictions and {} {:?} targets for {n}x{k}",
        x.len,
        t.len,
        t.dt
    );
    if let Some(a) = x.act {
        assert_eq!(a, Nhwc::of(n, k, 1), "{what}: predictions of {a:?}");
    }
    assert!(n <= i32::MAX as usize / 32 && k <= i32::MAX as usize);
}

fn check_targets(t: &Buf, len: usize, what: &str) {
    assert!(
        t.dt == Dt::F32 && t.len >= len,
        "{what}: {} {:?} targets for {len}",
        t.len,
        t.dt
    );
}

impl Cuda {
    /// Masks to f32 classes [n, h, w] (-1 ignored) from masks in GPU memory: `mask` (u8, or u16
    /// when `wide`) holds [samples, h, w]; `order` (or 0: 0..n) the u32 sample index of each of
    /// the batch; `aug` (or 0: centred, unflipped) one packed `Aug` per sample of the batch.
    /// Pad, crop, flip and `ignore` as `Backend::load_masks`.
    #[allow(clippy::too_many_arguments)]
    pub fn load_masks_device(
        &mut self,
        mask: u64,
        wide: bool,
        order: u64,
        aug: u64,
        n: usize,
        h: usize,
        w: usize,
        pad: usize,
        ignore: Option<u32>,
        out: &mut Buf,
    ) {
        if !self.ensure(out, n * h * w, Dt::F32) {
            return;
        }
        let g = self.sample_grid(n, h * w);
        let name = if wide {
            "load_masks_u16"
        } else {
            "load_masks_u8"
        };
        let (has, value) = match ignore {
            Some(v) => (1i32, v),
            None => (0, 0u32),
        };
        launch!(self, name, g, THREADS;
            mask, order, aug, out.ptr, n as i32, h as i32, w as i32, pad as i32, has, value);
    }

    /// `out` [n, k] = rows `order[0..n]` (or 0: the first n) of `src`, f32 [samples, k] in GPU
    /// memory: the targets of labels or values of a batch of a dataset held on the GPU.
    pub fn gather_targets_device(
        &mut self,
        src: u64,
        order: u64,
        n: usize,
        k: usize,
        out: &mut Buf,
    ) {
        if !self.ensure(out, n * k, Dt::F32) {
            return;
        }
        let g = self.grid(n * k);
        launch!(self, "gather_targets", (g, 1), THREADS;
            src, order, out.ptr, n as i32, k as i32);
    }

    /// `Backend::load_masks`: the raw masks and augmentations through the staging ring, then
    /// `load_masks_device`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn load_masks_host(
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
        let bytes = n * h * w * if wide { 2 } else { 1 };
        assert!(
            raw.len() >= bytes,
            "load_masks: {} bytes for {n} masks of {h}x{w}",
            raw.len()
        );
        if self.err.is_some() || bytes == 0 {
            self.ensure(out, 0, Dt::F32);
            return;
        }
        // A sample without an augmentation is centred, as on the CPU.
        let centred = Aug {
            dy: pad as u8,
            dx: pad as u8,
            flip: false,
        };
        let augb: Vec<u8> = (0..n)
            .flat_map(|s| aug.get(s).unwrap_or(&centred).packed().to_le_bytes())
            .collect();
        let r = self
            .ring
            .put(&[&raw[..bytes], &augb], &self.copy, &self.stream);
        let Some(p) = self.ok(r) else { return };
        let aug_ptr = if aug.is_empty() { 0 } else { p[1] };
        self.load_masks_device(p[0], wide, 0, aug_ptr, n, h, w, pad, ignore, out);
        let r = self.ring.consumed(&self.stream);
        self.ok(r);
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn seg_loss_impl(
        &mut self,
        logits: &Buf,
        targets: &Buf,
        dice: f32,
        dlogits: &mut Buf,
        n: usize,
        k: usize,
        hw: usize,
    ) {
        let (sc, sp) = seg_layout(logits, n, k, hw, "seg_loss");
        check_targets(targets, n * hw, "seg_loss");
        let (m, sfx) = (n * hw, logits.dt.suffix());
        // The grid depends on the shape only: which block adds which pixels, and so every
        // rounding, is the same on each call.
        let g = self.grid(m);
        let cols = 3 * k + 3;
        assert!(cols <= i32::MAX as usize, "seg_loss: {k} classes");
        let e = self.empty(Dt::F64);
        let mut part = std::mem::replace(&mut self.losses.part, e);
        let e = self.empty(Dt::F64);
        let mut sums = std::mem::replace(&mut self.losses.sums, e);
        let ok = self.ensure(&mut part, cols * g as usize, Dt::F64)
            && self.ensure(&mut sums, cols, Dt::F64)
            && self.ensure(dlogits, logits.len, logits.dt);
        if ok {
            dlogits.act = logits.act;
            let stats = self.stats.ptr;
            launch!(self, &format!("seg_stats_{sfx}"), (g, 1), THREADS;
                logits.ptr, targets.ptr, part.ptr, m as i64, hw as i32, k as i32, sc, sp);
            launch!(self, "seg_sums", (blocks(cols * 32, THREADS), 1), THREADS;
                part.ptr, sums.ptr, cols as i32, g as i32);
            launch!(self, &format!("seg_grad_{sfx}"), (g, 1), THREADS;
                logits.ptr, targets.ptr, sums.ptr, dlogits.ptr, stats, m as i64, hw as i32,
                k as i32, sc, sp, dice, n as i32);
        }
        self.losses.part = part;
        self.losses.sums = sums;
    }

    pub(super) fn seg_score_impl(
        &mut self,
        logits: &Buf,
        targets: &Buf,
        n: usize,
        k: usize,
        hw: usize,
    ) {
        let (sc, sp) = seg_layout(logits, n, k, hw, "seg_score");
        check_targets(targets, n * hw, "seg_score");
        let e = self.empty(Dt::F64);
        let mut counts = std::mem::replace(&mut self.losses.counts, e);
        // Counters of another class count start again (as on the CPU).
        let ok = self.losses.counts_k == k || {
            let fresh = self.ensure(&mut counts, 3 * k, Dt::F64);
            if fresh {
                self.memset0(&counts);
                self.losses.counts_k = k;
            }
            fresh
        };
        if ok {
            let m = n * hw;
            let g = self.grid(m);
            launch!(self, &format!("seg_score_{}", logits.dt.suffix()), (g, 1), THREADS;
                logits.ptr, targets.ptr, counts.ptr, m as i64, hw as i32, k as i32, sc, sp);
        }
        self.losses.counts = counts;
    }

    pub(super) fn take_seg_counts_impl(&mut self, k: usize) -> Vec<u64> {
        if self.losses.counts_k != k {
            self.losses.counts_k = 0;
            return vec![0; 3 * k];
        }
        let ptr = self.losses.counts.ptr;
        let out = self.read_back::<u64>(ptr, 3 * k);
        let e = self.empty(Dt::F64);
        let counts = std::mem::replace(&mut self.losses.counts, e);
        self.memset0(&counts);
        self.losses.counts = counts;
        out
    }

    pub(super) fn bce_logits_impl(
        &mut self,
        logits: &Buf,
        targets: &Buf,
        dlogits: &mut Buf,
        n: usize,
        k: usize,
    ) {
        check_rows(logits, targets, n, k, "bce_logits");
        if !self.ensure(dlogits, n * k, logits.dt) {
            return;
        }
        dlogits.act = logits.act;
        let stats = self.stats.ptr;
        launch!(self, &format!("bce_logits_{}", logits.dt.suffix()),
            (blocks(n * 32, THREADS), 1), THREADS;
            logits.ptr, targets.ptr, dlogits.ptr, stats, n as i32, k as i32);
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn regression_impl(
        &mut self,
        pred: &Buf,
        targets: &Buf,
        smooth_l1: bool,
        dpred: &mut Buf,
        n: usize,
        k: usize,
    ) {
        check_rows(pred, targets, n, k, "regression_loss");
        if !self.ensure(dpred, n * k, pred.dt) {
            return;
        }
        dpred.act = pred.act;
        let stats = self.stats.ptr;
        launch!(self, &format!("regression_{}", pred.dt.suffix()),
            (blocks(n * 32, THREADS), 1), THREADS;
            pred.ptr, targets.ptr, dpred.ptr, stats, n as i32, k as i32, smooth_l1 as i32);
    }
}
