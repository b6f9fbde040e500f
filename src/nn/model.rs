//! The walker: runs any layer list of `architecture.rs` forward and backward on any `Backend`,
//! with the parameters, their gradients and momentum on that backend.

use super::architecture::{conv_shape, pool_shape, Dims, Layer, ModelConfig, Op};
use super::{Aug, Backend, RawBatch};

/// Parameters, their gradients and momentum, on a backend.
pub struct Params<B: Backend> {
    pub names: Vec<String>,
    pub decay: Vec<bool>,
    pub w: Vec<B::Buf>,
    pub g: Vec<B::Buf>,
    pub v: Vec<B::Buf>,
    /// BN running statistics, in `ModelConfig::buffers` order.
    pub running: Vec<B::Buf>,
    pub running_names: Vec<String>,
}

/// A layer as the walker runs it: where its tensors are and what it keeps for backward.
struct Node<B: Backend> {
    layer: Layer,
    /// Index of its first trainable tensor in `Params::w`, and of its first running statistic.
    param: usize,
    running: usize,
    /// Its output value.
    y: B::Buf,
    /// Saved for backward: BN mean and 1/std, a max pool's winners.
    aux: [B::Buf; 2],
}

/// Gradients of values during backward, in a pool of reused buffers: a value's gradient lives
/// from its first contribution until its producer's backward has read it. A slot may be shared
/// (a residual add passes one gradient to both inputs) and is copied before it is changed.
struct Grads<B: Backend> {
    bufs: Vec<B::Buf>,
    refs: Vec<usize>,
    free: Vec<usize>,
    of: Vec<Option<usize>>,
}

impl<B: Backend> Grads<B> {
    fn take(&mut self, be: &mut B) -> usize {
        let s = self.free.pop().unwrap_or_else(|| {
            self.bufs.push(be.zeros(0));
            self.refs.push(0);
            self.bufs.len() - 1
        });
        self.refs[s] = 1;
        s
    }
    fn release(&mut self, s: usize) {
        self.refs[s] -= 1;
        if self.refs[s] == 0 {
            // Later slots first, so that the same slots serve the same values every step.
            self.free.push(s);
            self.free.sort_unstable_by(|a, b| b.cmp(a));
        }
    }
    /// `v`'s slot, unshared (copied if another value reads it too).
    fn unique(&mut self, be: &mut B, v: usize) -> usize {
        let s = self.of[v].expect("value has a gradient");
        if self.refs[s] == 1 {
            return s;
        }
        let t = self.take(be);
        let (src, dst) = pair(&mut self.bufs, s, t);
        be.copy(src, dst);
        self.release(s);
        self.of[v] = Some(t);
        t
    }
    /// The gradient written to the fresh slot `t` belongs to `v` (added to what it has).
    fn arrive(&mut self, be: &mut B, v: usize, t: usize) {
        match self.of[v] {
            None => self.of[v] = Some(t),
            Some(_) => {
                let s = self.unique(be, v);
                let (src, dst) = pair(&mut self.bufs, t, s);
                be.accumulate(dst, src);
                self.release(t);
            }
        }
    }
    /// `v` receives the very gradient in slot `s` (shared, not copied).
    fn share(&mut self, be: &mut B, v: usize, s: usize) {
        match self.of[v] {
            None => {
                self.refs[s] += 1;
                self.of[v] = Some(s);
            }
            Some(_) => {
                let d = self.unique(be, v);
                let (src, dst) = pair(&mut self.bufs, s, d);
                be.accumulate(dst, src);
            }
        }
    }
}

/// `&v[a]` and, where asked for, `&mut v[b]` and `&mut v[c]` (all different).
fn split3<T>(
    v: &mut [T],
    a: usize,
    b: Option<usize>,
    c: Option<usize>,
) -> (&T, Option<&mut T>, Option<&mut T>) {
    assert!(
        (b.is_none() || b != c) && Some(a) != b && Some(a) != c,
        "one slot for two gradients"
    );
    let (mut ra, mut rb, mut rc) = (None, None, None);
    for (i, x) in v.iter_mut().enumerate() {
        if i == a {
            ra = Some(&*x);
        } else if Some(i) == b {
            rb = Some(x);
        } else if Some(i) == c {
            rc = Some(x);
        }
    }
    (ra.expect("slot a is in the pool"), rb, rc)
}

/// `&v[a]` and `&mut v[b]` (a != b).
fn pair<T>(v: &mut [T], a: usize, b: usize) -> (&T, &mut T) {
    assert_ne!(a, b);
    if a < b {
        let (l, r) = v.split_at_mut(b);
        (&l[a], &mut r[0])
    } else {
        let (l, r) = v.split_at_mut(a);
        (&r[0], &mut l[b])
    }
}

/// What the model's output is trained against (`Model::loss`), and where its targets come from:
/// the batch's labels (classes) or `Model::targets` (every other task).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Objective {
    /// Softmax cross-entropy over classes (`Backend::softmax_xent`).
    #[default]
    Classes,
    /// Per-pixel cross-entropy plus `dice` x soft Dice over [k, h, w] logits (`Backend::seg_loss`).
    Segment { dice: f32 },
    /// Binary cross-entropy with logits per label (`Backend::bce_logits`).
    Labels,
    /// Mean squared error, or smooth L1, per value (`Backend::regression_loss`).
    Values { smooth_l1: bool },
}

pub struct Model<B: Backend> {
    pub cfg: ModelConfig,
    /// Set by the caller before training when the task is not classes.
    pub objective: Objective,
    pub params: Params<B>,
    nodes: Vec<Node<B>>,
    dims: Vec<Dims>,
    grads: Grads<B>,
    /// d(loss)/d(logits), written by `loss`.
    dlogits: B::Buf,
    pub input: B::Buf,
    /// Labels of the batch in `input`, as the backend's loss reads them.
    pub labels: B::Buf,
    /// Targets of the batch for every objective but classes: per-pixel class numbers [n, h, w]
    /// (-1 ignored), or [n, k] labels (0/1) or standardised values.
    pub targets: B::Buf,
}

impl<B: Backend> Model<B> {
    pub fn new(be: &mut B, cfg: ModelConfig, values: &[(String, Vec<f32>)]) -> Self {
        let get = |n: &str| {
            values
                .iter()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.as_slice())
                .unwrap_or_else(|| panic!("missing tensor {n}"))
        };
        let tr = cfg.trainable();
        let params = Params {
            names: tr.iter().map(|t| t.0.clone()).collect(),
            decay: tr.iter().map(|t| t.2).collect(),
            w: tr.iter().map(|t| be.upload(get(&t.0))).collect(),
            g: tr.iter().map(|t| be.zeros(t.1.iter().product())).collect(),
            v: tr.iter().map(|t| be.zeros(t.1.iter().product())).collect(),
            running: cfg.buffers().iter().map(|b| be.upload(get(&b.0))).collect(),
            running_names: cfg.buffers().into_iter().map(|b| b.0).collect(),
        };
        let (layers, dims) = cfg.layers();
        let (mut param, mut running) = (0, 0);
        let nodes = layers
            .into_iter()
            .map(|layer| {
                let node = Node {
                    param,
                    running,
                    y: be.zeros(0),
                    aux: [be.zeros(0), be.zeros(0)],
                    layer,
                };
                match node.layer.op {
                    Op::Conv { .. } | Op::Bias => param += 1,
                    Op::Linear { .. } => param += 2,
                    Op::BatchNorm { .. } => {
                        param += 2;
                        running += 2;
                    }
                    _ => {}
                }
                node
            })
            .collect::<Vec<_>>();
        let grads = Grads {
            bufs: Vec::new(),
            refs: Vec::new(),
            free: Vec::new(),
            of: vec![None; dims.len()],
        };
        Model {
            cfg,
            params,
            nodes,
            dims,
            grads,
            dlogits: be.zeros(0),
            input: be.zeros(0),
            labels: be.zeros(0),
            targets: be.zeros(0),
            objective: Objective::Classes,
        }
    }

    pub fn load(
        &mut self,
        be: &mut B,
        raw: &RawBatch,
        mean: &[f32],
        std: &[f32],
        pad: usize,
        aug: &[Aug],
    ) {
        be.load_batch(raw, mean, std, pad, aug, &mut self.input, &mut self.labels);
    }

    /// Forward pass on `self.input` (n samples). Training mode uses batch statistics and saves
    /// what backward needs; evaluation mode uses the running statistics.
    pub fn forward(&mut self, be: &mut B, n: usize, train: bool) -> &B::Buf {
        let p = &mut self.params;
        for i in 0..self.nodes.len() {
            let (done, rest) = self.nodes.split_at_mut(i);
            let node = &mut rest[0];
            let value = |v: usize| if v == 0 { &self.input } else { &done[v - 1].y };
            let ins = &node.layer.inputs;
            let x = value(ins[0]);
            let (c, h, w) = self.dims[ins[0]];
            let (j, r) = (node.param, node.running);
            match node.layer.op {
                op @ Op::Conv { .. } => {
                    let s = conv_shape(&op, (c, h, w), n).unwrap();
                    be.conv(x, &p.w[j], &mut node.y, &s);
                }
                Op::BatchNorm { relu } => {
                    let [mean, invstd] = &mut node.aux;
                    let (rm, rv) = p.running[r..].split_at_mut(1);
                    if train {
                        be.bn_train(
                            x,
                            &p.w[j],
                            &p.w[j + 1],
                            &mut node.y,
                            mean,
                            invstd,
                            &mut rm[0],
                            &mut rv[0],
                            n,
                            c,
                            h * w,
                            relu,
                        );
                    } else {
                        be.bn_eval(
                            x,
                            &p.w[j],
                            &p.w[j + 1],
                            &rm[0],
                            &rv[0],
                            &mut node.y,
                            n,
                            c,
                            h * w,
                            relu,
                        );
                    }
                }
                Op::MaxPool { k, stride, pad } => {
                    let s = pool_shape((c, h, w), n, k, stride, pad);
                    be.maxpool(x, &mut node.y, &mut node.aux[0], &s);
                }
                Op::Add { relu } => be.add(x, value(ins[1]), &mut node.y, relu),
                Op::GlobalAvgPool => be.gap(x, &mut node.y, n, c, h * w),
                Op::Linear { out } => be.linear(x, &p.w[j], &p.w[j + 1], &mut node.y, n, c, out),
                Op::Concat => {
                    let cb = self.dims[ins[1]].0;
                    be.concat(x, value(ins[1]), &mut node.y, n, c, cb, h * w);
                }
                Op::Upsample { h: oh, w: ow } => be.upsample(x, &mut node.y, n, c, h, w, oh, ow),
                Op::Bias => be.bias(x, &p.w[j], &mut node.y, n, c, h * w),
            }
        }
        &self.nodes.last().expect("a model has layers").y
    }

    /// Loss and its gradient for the last forward pass of `n` samples (label smoothing applies to
    /// classes only); the loss sum and correct count accumulate in the backend
    /// (`Backend::take_loss_stats`).
    pub fn loss(&mut self, be: &mut B, n: usize, smoothing: f32) {
        let out = &self.nodes.last().expect("a model has layers").y;
        let (k, h, w) = *self.dims.last().expect("a model has values");
        let dl = &mut self.dlogits;
        match self.objective {
            Objective::Classes => be.softmax_xent(out, &self.labels, smoothing, dl, n, k),
            Objective::Segment { dice } => be.seg_loss(out, &self.targets, dice, dl, n, k, h * w),
            Objective::Labels => be.bce_logits(out, &self.targets, dl, n, k),
            Objective::Values { smooth_l1 } => {
                be.regression_loss(out, &self.targets, smooth_l1, dl, n, k)
            }
        }
    }

    /// The last forward pass's output.
    pub fn last_output(&self) -> &B::Buf {
        &self.nodes.last().expect("a model has layers").y
    }

    /// The output's shape: (outputs, height, width); 1 x 1 for a model ending in a linear layer.
    pub fn out_dims(&self) -> (usize, usize, usize) {
        *self.dims.last().expect("a model has values")
    }

    /// Backward from `dlogits` (set by `loss`), writing every parameter gradient.
    pub fn backward(&mut self, be: &mut B, n: usize) {
        let last = self.nodes.len();
        let g = &mut self.grads;
        // dlogits enters the pool as the logits' gradient and comes back at the end; every slot
        // is free between steps, so each step uses the same slots (and buffers) in the same way.
        let top = g.take(be);
        std::mem::swap(&mut g.bufs[top], &mut self.dlogits);
        g.of[last] = Some(top);
        let p = &mut self.params;
        for i in (0..last).rev() {
            let Some(gy) = g.of[i + 1] else { continue };
            let (done, rest) = self.nodes.split_at_mut(i);
            let node = &rest[0];
            let value = |v: usize| if v == 0 { &self.input } else { &done[v - 1].y };
            let ins = &node.layer.inputs;
            if let Op::Add { relu } = node.layer.op {
                // Both inputs receive the sum's gradient as it is.
                let gy = if relu {
                    let s = g.unique(be, i + 1);
                    be.relu_backward(&node.y, &mut g.bufs[s]);
                    s
                } else {
                    gy
                };
                for &v in ins.iter().filter(|&&v| v != 0) {
                    g.share(be, v, gy);
                }
                g.release(gy);
                g.of[i + 1] = None;
                continue;
            }
            match node.layer.op {
                Op::Concat => {
                    // Each input (but the batch) gets its channels' share in a fresh slot.
                    let (ca, cb, (_, h, w)) =
                        (self.dims[ins[0]].0, self.dims[ins[1]].0, self.dims[ins[0]]);
                    let ta = (ins[0] != 0).then(|| g.take(be));
                    let tb = (ins[1] != 0).then(|| g.take(be));
                    let (dy, da, db) = split3(&mut g.bufs, gy, ta, tb);
                    be.concat_backward(dy, da, db, n, ca, cb, h * w);
                    g.release(gy);
                    g.of[i + 1] = None;
                    for (v, t) in [(ins[0], ta), (ins[1], tb)] {
                        if let Some(t) = t {
                            g.arrive(be, v, t);
                        }
                    }
                    continue;
                }
                Op::Bias => {
                    // dx = dy: the input receives the output's gradient as it is.
                    let (c, h, w) = self.dims[ins[0]];
                    be.bias_backward(&g.bufs[gy], &mut p.g[node.param], n, c, h * w);
                    if ins[0] != 0 {
                        g.share(be, ins[0], gy);
                    }
                    g.release(gy);
                    g.of[i + 1] = None;
                    continue;
                }
                _ => {}
            }
            let x = value(ins[0]);
            let (c, h, w) = self.dims[ins[0]];
            let j = node.param;
            // The input batch (value 0) needs no gradient: a convolution skips it, other layers
            // write it to a slot that is dropped.
            let wanted = ins[0] != 0;
            let conv = conv_shape(&node.layer.op, (c, h, w), n);
            let t = (wanted || conv.is_none()).then(|| g.take(be));
            if let Some(s) = conv {
                match t {
                    Some(t) => {
                        let (dy, dx) = pair(&mut g.bufs, gy, t);
                        be.conv_backward(x, &p.w[j], dy, Some(dx), &mut p.g[j], &s);
                    }
                    None => be.conv_backward(x, &p.w[j], &g.bufs[gy], None, &mut p.g[j], &s),
                }
            } else {
                let (dy, dx) = pair(&mut g.bufs, gy, t.unwrap());
                match node.layer.op {
                    Op::BatchNorm { relu } => {
                        let (gw, gb) = p.g[j..].split_at_mut(1);
                        be.bn_backward(
                            x,
                            dy,
                            &p.w[j],
                            &p.w[j + 1],
                            &node.aux[0],
                            &node.aux[1],
                            dx,
                            &mut gw[0],
                            &mut gb[0],
                            n,
                            c,
                            h * w,
                            relu.then_some(&node.y),
                        );
                    }
                    Op::MaxPool { k, stride, pad } => {
                        let s = pool_shape((c, h, w), n, k, stride, pad);
                        be.maxpool_backward(dy, &node.aux[0], dx, &s);
                    }
                    Op::GlobalAvgPool => be.gap_backward(dy, dx, n, c, h * w),
                    Op::Linear { out } => {
                        let (dw, db) = p.g[j..].split_at_mut(1);
                        be.linear_backward(x, &p.w[j], dy, dx, &mut dw[0], &mut db[0], n, c, out);
                    }
                    Op::Upsample { h: oh, w: ow } => {
                        be.upsample_backward(dy, dx, n, c, h, w, oh, ow)
                    }
                    Op::Conv { .. } | Op::Add { .. } | Op::Concat | Op::Bias => unreachable!(),
                }
            }
            g.release(gy);
            g.of[i + 1] = None;
            match t {
                Some(t) if wanted => g.arrive(be, ins[0], t),
                Some(t) => g.release(t),
                None => {}
            }
        }
        std::mem::swap(&mut g.bufs[top], &mut self.dlogits);
    }

    /// The gradient of the loss with respect to the last layer's output, which `backward` starts
    /// from (`loss` writes it): for a loss computed elsewhere, an activation of the output's
    /// shape as the backend stores activations (`Backend::upload_act` of NCHW values, or a
    /// backend op's output: on the GPU NHWC in the activations' type). `backward` leaves
    /// another value here: write it before each backward.
    pub fn output_grad(&mut self) -> &mut B::Buf {
        &mut self.dlogits
    }

    /// One training step on the batch in `input`: forward, loss, backward, SGD.
    #[allow(clippy::too_many_arguments)]
    pub fn train_step(
        &mut self,
        be: &mut B,
        n: usize,
        smoothing: f32,
        lr: f32,
        momentum: f32,
        weight_decay: f32,
    ) {
        self.forward(be, n, true);
        self.loss(be, n, smoothing);
        self.backward(be, n);
        self.step(be, lr, momentum, weight_decay);
    }

    /// One SGD step over every trainable tensor.
    pub fn step(&mut self, be: &mut B, lr: f32, momentum: f32, weight_decay: f32) {
        let p = &mut self.params;
        // Data-parallel ranks step on the average of their gradients, so the weights stay equal.
        be.all_reduce_grads(&mut p.g);
        be.sgd_step_many(
            &mut p.w,
            &p.g,
            &mut p.v,
            &p.decay,
            lr,
            momentum,
            weight_decay,
        );
    }

    /// Every tensor (weights, running statistics, momentum as `NAME.momentum`) on the host.
    pub fn state(&self, be: &mut B) -> Vec<(String, Vec<f32>)> {
        let p = &self.params;
        let mut out: Vec<(String, Vec<f32>)> = p
            .names
            .iter()
            .zip(&p.w)
            .map(|(n, w)| (n.clone(), be.download(w)))
            .collect();
        out.extend(
            p.running_names
                .iter()
                .zip(&p.running)
                .map(|(n, w)| (n.clone(), be.download(w))),
        );
        out.extend(
            p.names
                .iter()
                .zip(&p.v)
                .map(|(n, v)| (format!("{n}.momentum"), be.download(v))),
        );
        out
    }

    /// Restore momentum from a saved state (weights come through `new`).
    pub fn set_momentum(&mut self, be: &mut B, state: &[(String, Vec<f32>)]) {
        for (i, n) in self.params.names.clone().iter().enumerate() {
            if let Some((_, v)) = state.iter().find(|(k, _)| *k == format!("{n}.momentum")) {
                self.params.v[i] = be.upload(v);
            }
        }
    }
}
