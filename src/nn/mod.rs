//! The model and the small backend trait it runs on. `small` is defined once, here, as a sequence
//! of backend operations; the CPU backend is the numerical reference and the CUDA backend
//! implements the same trait.

pub mod architecture;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(test)]
pub mod gradcheck;
#[cfg(test)]
pub mod gradcheck_losses;
pub mod model;

pub use architecture::ModelConfig;
pub use model::{Model, Objective, Params};

/// Per-sample augmentation, decided on the host (seeded) and applied where the batch is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Aug {
    /// Crop offset in the zero-padded image, 0..=2*pad (pad means no shift).
    pub dy: u8,
    pub dx: u8,
    pub flip: bool,
}

impl Aug {
    /// `dy | dx << 8 | flip << 16`, as the GPU's input kernel reads it.
    pub fn packed(self) -> u32 {
        self.dy as u32 | (self.dx as u32) << 8 | (self.flip as u32) << 16
    }
}

/// A batch of raw pixels as read from shards.
pub struct RawBatch<'a> {
    /// `n` samples of `c*h*w` values of `dtype`, little-endian.
    pub pixels: &'a [u8],
    /// u8/u16 are normalised as `(p / max - mean) / std`, f16/f32 as `(v - mean) / std`.
    pub dtype: crate::format::shard::Dtype,
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    /// Class of each sample.
    pub labels: &'a [u32],
}

/// A convolution's shape: input [n, cin, h, w], square kernel k, stride, zero padding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConvShape {
    pub n: usize,
    pub cin: usize,
    pub cout: usize,
    pub h: usize,
    pub w: usize,
    pub k: usize,
    pub stride: usize,
    pub pad: usize,
}

impl ConvShape {
    pub fn oh(&self) -> usize {
        out_size(self.h, self.k, self.stride, self.pad)
    }
    pub fn ow(&self) -> usize {
        out_size(self.w, self.k, self.stride, self.pad)
    }
}

/// A max pool's shape: input [n, c, h, w], k x k windows, stride, padding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PoolShape {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub k: usize,
    pub stride: usize,
    pub pad: usize,
}

impl PoolShape {
    pub fn oh(&self) -> usize {
        out_size(self.h, self.k, self.stride, self.pad)
    }
    pub fn ow(&self) -> usize {
        out_size(self.w, self.k, self.stride, self.pad)
    }
}

/// Output size of a window sliding over `n` (floor, as PyTorch); 0 when the window does not fit.
pub fn out_size(n: usize, k: usize, stride: usize, pad: usize) -> usize {
    (n + 2 * pad).checked_sub(k).map_or(0, |r| r / stride + 1)
}

/// The operations models are made of, on buffers of f32 that live wherever the backend computes.
/// Shapes are NCHW as the host sees them (`upload_act`, `download`); a backend may store
/// activations in another layout and precision (the CUDA backend: NHWC). Every backward op
/// *writes* its input gradient and *writes* (not accumulates) parameter gradients.
pub trait Backend {
    type Buf;

    fn zeros(&mut self, len: usize) -> Self::Buf;
    fn upload(&mut self, data: &[f32]) -> Self::Buf;
    /// Values of a buffer; an activation comes back NCHW.
    fn download(&mut self, b: &Self::Buf) -> Vec<f32>;
    /// An activation [n, c, h, w] from NCHW values, stored as the backend's ops read it.
    fn upload_act(&mut self, data: &[f32], dims: [usize; 4]) -> Self::Buf {
        let _ = dims;
        self.upload(data)
    }

    /// Normalise `(pixel/max - mean[c]) / std[c]`, pad by `pad` with zeros (after normalisation:
    /// the padded border is the mean), crop back to h x w at each sample's offset, flip. The
    /// labels go to `labels` as f32 class numbers (exact below 2^24), where the loss reads them.
    #[allow(clippy::too_many_arguments)]
    fn load_batch(
        &mut self,
        raw: &RawBatch,
        mean: &[f32],
        std: &[f32],
        pad: usize,
        aug: &[Aug],
        out: &mut Self::Buf,
        labels: &mut Self::Buf,
    );

    /// Convolution without bias (cross-correlation, zero padding). w: [cout, cin, k, k].
    fn conv(&mut self, x: &Self::Buf, w: &Self::Buf, y: &mut Self::Buf, s: &ConvShape);
    /// Gradients of `conv`: `dx` (when asked for) and `dw`.
    fn conv_backward(
        &mut self,
        x: &Self::Buf,
        w: &Self::Buf,
        dy: &Self::Buf,
        dx: Option<&mut Self::Buf>,
        dw: &mut Self::Buf,
        s: &ConvShape,
    );

    /// Training-mode batch norm over (n, hw) per channel; saves mean and 1/std for backward and
    /// updates the running statistics (running = (1-m) running + m batch; variance unbiased).
    /// With `relu`, y = max(bn(x), 0): one pass instead of two.
    #[allow(clippy::too_many_arguments)]
    fn bn_train(
        &mut self,
        x: &Self::Buf,
        gamma: &Self::Buf,
        beta: &Self::Buf,
        y: &mut Self::Buf,
        saved_mean: &mut Self::Buf,
        saved_invstd: &mut Self::Buf,
        running_mean: &mut Self::Buf,
        running_var: &mut Self::Buf,
        n: usize,
        c: usize,
        hw: usize,
        relu: bool,
    );
    #[allow(clippy::too_many_arguments)]
    fn bn_eval(
        &mut self,
        x: &Self::Buf,
        gamma: &Self::Buf,
        beta: &Self::Buf,
        running_mean: &Self::Buf,
        running_var: &Self::Buf,
        y: &mut Self::Buf,
        n: usize,
        c: usize,
        hw: usize,
        relu: bool,
    );
    #[allow(clippy::too_many_arguments)]
    /// Backward of `bn_train`; with `relu_out` (its output y when it applied the ReLU) the
    /// gradient is first masked by y > 0 (which a backend may recompute from x, gamma, beta and
    /// the saved statistics instead).
    fn bn_backward(
        &mut self,
        x: &Self::Buf,
        dy: &Self::Buf,
        gamma: &Self::Buf,
        beta: &Self::Buf,
        saved_mean: &Self::Buf,
        saved_invstd: &Self::Buf,
        dx: &mut Self::Buf,
        dgamma: &mut Self::Buf,
        dbeta: &mut Self::Buf,
        n: usize,
        c: usize,
        hw: usize,
        relu_out: Option<&Self::Buf>,
    );

    /// y = max(x, 0) in place.
    fn relu(&mut self, x: &mut Self::Buf);
    /// dy *= (y > 0), in place.
    fn relu_backward(&mut self, y: &Self::Buf, dy: &mut Self::Buf);

    /// Max pooling over k x k windows (padding never wins); `arg` records the winner's place in
    /// its window (ky * k + kx, the first one on ties).
    fn maxpool(&mut self, x: &Self::Buf, y: &mut Self::Buf, arg: &mut Self::Buf, s: &PoolShape);
    /// Writes every element of `dx`: the sum of the gradients of the windows it won.
    fn maxpool_backward(
        &mut self,
        dy: &Self::Buf,
        arg: &Self::Buf,
        dx: &mut Self::Buf,
        s: &PoolShape,
    );

    /// y = a + b, then max(y, 0) when `relu` (a residual connection).
    fn add(&mut self, a: &Self::Buf, b: &Self::Buf, y: &mut Self::Buf, relu: bool);
    /// dst += src (gradients of a value that several layers read).
    fn accumulate(&mut self, dst: &mut Self::Buf, src: &Self::Buf);
    /// dst = src.
    fn copy(&mut self, src: &Self::Buf, dst: &mut Self::Buf);

    /// Global average pool: [n, c, hw] -> [n, c].
    fn gap(&mut self, x: &Self::Buf, y: &mut Self::Buf, n: usize, c: usize, hw: usize);
    fn gap_backward(&mut self, dy: &Self::Buf, dx: &mut Self::Buf, n: usize, c: usize, hw: usize);

    /// y [n, ca+cb, h, w] = the channels of a [n, ca, h, w] then those of b [n, cb, h, w].
    #[allow(clippy::too_many_arguments)]
    fn concat(
        &mut self,
        a: &Self::Buf,
        b: &Self::Buf,
        y: &mut Self::Buf,
        n: usize,
        ca: usize,
        cb: usize,
        hw: usize,
    );
    /// Splits dy [n, ca+cb, h, w] back: da gets its first ca channels and db the other cb, each
    /// only where asked for.
    #[allow(clippy::too_many_arguments)]
    fn concat_backward(
        &mut self,
        dy: &Self::Buf,
        da: Option<&mut Self::Buf>,
        db: Option<&mut Self::Buf>,
        n: usize,
        ca: usize,
        cb: usize,
        hw: usize,
    );
    /// Nearest-neighbour resize [n, c, h, w] -> [n, c, oh, ow]: output (y, x) reads input
    /// (floor(y * h / oh), floor(x * w / ow)).
    #[allow(clippy::too_many_arguments)]
    fn upsample(
        &mut self,
        x: &Self::Buf,
        y: &mut Self::Buf,
        n: usize,
        c: usize,
        h: usize,
        w: usize,
        oh: usize,
        ow: usize,
    );
    /// Writes every element of dx [n, c, h, w]: the sum of the gradients of the outputs that
    /// read it (0 for an input no output reads).
    #[allow(clippy::too_many_arguments)]
    fn upsample_backward(
        &mut self,
        dy: &Self::Buf,
        dx: &mut Self::Buf,
        n: usize,
        c: usize,
        h: usize,
        w: usize,
        oh: usize,
        ow: usize,
    );
    /// y = x + b[channel] for x [n, c, hw] (an activation; b: c float32 values).
    fn bias(
        &mut self,
        x: &Self::Buf,
        b: &Self::Buf,
        y: &mut Self::Buf,
        n: usize,
        c: usize,
        hw: usize,
    );
    /// db = the sum of dy [n, c, hw] over n and hw (x's gradient is dy itself: the walker
    /// passes it on).
    fn bias_backward(&mut self, dy: &Self::Buf, db: &mut Self::Buf, n: usize, c: usize, hw: usize);

    /// y = x w^T + b; x: [n, k], w: [m, k], b: [m], y: [n, m].
    #[allow(clippy::too_many_arguments)]
    fn linear(
        &mut self,
        x: &Self::Buf,
        w: &Self::Buf,
        b: &Self::Buf,
        y: &mut Self::Buf,
        n: usize,
        k: usize,
        m: usize,
    );
    #[allow(clippy::too_many_arguments)]
    fn linear_backward(
        &mut self,
        x: &Self::Buf,
        w: &Self::Buf,
        dy: &Self::Buf,
        dx: &mut Self::Buf,
        dw: &mut Self::Buf,
        db: &mut Self::Buf,
        n: usize,
        k: usize,
        m: usize,
    );

    /// Mean softmax cross-entropy with label smoothing over the batch; writes d(loss)/d(logits)
    /// and adds the sum of per-sample losses and the number of correct argmax predictions to
    /// running totals that `take_loss_stats` reads. Nothing here waits for the device.
    #[allow(clippy::too_many_arguments)]
    fn softmax_xent(
        &mut self,
        logits: &Self::Buf,
        labels: &Self::Buf,
        smoothing: f32,
        dlogits: &mut Self::Buf,
        n: usize,
        k: usize,
    );

    // The targets and losses of the mask, labels and values tasks (cpu/losses.rs,
    // cuda/losses.rs). Targets live in f32 buffers: class numbers [n, h, w] (-1 ignored), or
    // [n, k] values. A class number outside 0..k counts as ignored in the losses and scores.

    /// Masks of a batch to per-pixel class numbers: `raw` holds n masks of h x w values (u8, or
    /// u16 little-endian when `wide`), padded by `pad` with the ignored value, cropped at each
    /// sample's offset and flipped exactly as `load_batch` does its images (same `Aug`, same
    /// meaning; a sample without one is centred), then written to `out` as f32 [n, h, w]: the
    /// value, or -1 where ignored (`ignore`, if given, or padding).
    #[allow(clippy::too_many_arguments)]
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
        out: &mut Self::Buf,
    );
    /// `out` = these f32 values (targets of labels or values, [n, k]), in a buffer kept between
    /// calls.
    fn load_targets(&mut self, values: &[f32], out: &mut Self::Buf);
    /// Segmentation loss on logits [n, k, h, w] (an activation) against targets [n, h, w]: mean
    /// per-pixel softmax cross-entropy over the counted pixels, plus `dice` x (1 - mean over
    /// classes 1..k of the soft Dice of the batch: (2 sum p_c g_c + eps) / (sum p_c + sum g_c +
    /// eps), eps = 1, over counted pixels; no term when k = 1). Writes dlogits (shaped and typed
    /// as the logits; zero at ignored pixels); adds (the batch's loss x n, the correctly
    /// classified counted pixels) to the running totals `take_loss_stats` returns. With no
    /// counted pixel the loss is 0.
    #[allow(clippy::too_many_arguments)]
    fn seg_loss(
        &mut self,
        logits: &Self::Buf,
        targets: &Self::Buf,
        dice: f32,
        dlogits: &mut Self::Buf,
        n: usize,
        k: usize,
        hw: usize,
    );
    /// Adds, for each class c, (true positives, false positives, false negatives) of the argmax
    /// (the first on ties) of logits [n, k, h, w] against targets (ignored pixels not counted)
    /// to counters read by `take_seg_counts`.
    fn seg_score(&mut self, logits: &Self::Buf, targets: &Self::Buf, n: usize, k: usize, hw: usize);
    /// [tp0, fp0, fn0, tp1, ...] since the last call (3k values), then zero. Waits for the
    /// device.
    fn take_seg_counts(&mut self, k: usize) -> Vec<u64>;
    /// Mean binary cross-entropy with logits over [n, k] against 0/1 targets (PyTorch's
    /// BCEWithLogitsLoss, 'mean', stable form); writes dlogits; running totals: (sum of
    /// per-sample mean losses, samples whose every label is predicted right at logit 0: a
    /// logit > 0 predicts 1, a target > 0.5 is 1).
    fn bce_logits(
        &mut self,
        logits: &Self::Buf,
        targets: &Self::Buf,
        dlogits: &mut Self::Buf,
        n: usize,
        k: usize,
    );
    /// Regression on [n, k] against targets: mean squared error, or smooth L1 (beta 1) when
    /// `smooth_l1`, mean over n*k (PyTorch's 'mean'); writes dpred; running totals: (sum of
    /// per-sample mean losses, 0).
    #[allow(clippy::too_many_arguments)]
    fn regression_loss(
        &mut self,
        pred: &Self::Buf,
        targets: &Self::Buf,
        smooth_l1: bool,
        dpred: &mut Self::Buf,
        n: usize,
        k: usize,
    );

    /// `sgd_step` on every tensor; `decay[i]` says whether weight decay applies to tensor i.
    #[allow(clippy::too_many_arguments)]
    fn sgd_step_many(
        &mut self,
        w: &mut [Self::Buf],
        g: &[Self::Buf],
        v: &mut [Self::Buf],
        decay: &[bool],
        lr: f32,
        momentum: f32,
        weight_decay: f32,
    ) {
        for i in 0..w.len() {
            let wd = if decay[i] { weight_decay } else { 0.0 };
            self.sgd_step(&mut w[i], &g[i], &mut v[i], lr, momentum, wd);
        }
    }

    /// Average the gradients across the ranks of a data-parallel world, before the optimiser
    /// step; nothing for a backend that is not one of several ranks (the CPU never is).
    fn all_reduce_grads(&mut self, g: &mut [Self::Buf]) {
        let _ = g;
    }

    /// (sum of losses, correct predictions) since the last call, then zero. Waits for the device.
    fn take_loss_stats(&mut self) -> (f64, u64);

    /// Start recording the ops issued next as one replayable graph (a training step); false when
    /// the backend does not record (the CPU), or recording is off.
    fn begin_capture(&mut self) -> bool {
        false
    }
    /// Stop recording; true when the graph is ready to replay. On false the recorded ops did not
    /// run and the caller issues them again directly.
    fn end_capture(&mut self) -> bool {
        false
    }
    /// Replay the recorded step with learning rate `lr`; false when there is no valid graph.
    fn replay(&mut self, lr: f32) -> bool {
        let _ = lr;
        false
    }

    /// The first failure of the device since the backend was made (ops cannot return one).
    fn status(&self) -> Result<(), String> {
        Ok(())
    }

    /// Device memory in use by this process (0 on the CPU).
    fn gpu_mem_bytes(&mut self) -> u64 {
        0
    }

    /// Predicted class of each row of [n, k] logits.
    fn argmax(&mut self, logits: &Self::Buf, n: usize, k: usize) -> Vec<u32>;

    /// SGD with Nesterov momentum (PyTorch's formulation): d = g + wd*w; v = mu*v + d;
    /// w -= lr * (d + mu*v).
    #[allow(clippy::too_many_arguments)]
    fn sgd_step(
        &mut self,
        w: &mut Self::Buf,
        g: &Self::Buf,
        v: &mut Self::Buf,
        lr: f32,
        momentum: f32,
        wd: f32,
    );
}
