//! `small`, exactly as DESIGN.md defines it:
//! conv3x3(C->32, no bias) BN ReLU maxpool2 / conv3x3(32->64) BN ReLU maxpool2 /
//! conv3x3(64->128) BN ReLU / global average pool / linear(128->classes).

use super::{Aug, Backend, RawBatch};
use serde::{Deserialize, Serialize};

pub const WIDTHS: [usize; 3] = [32, 64, 128];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub name: String,
    pub channels: usize,
    pub height: usize,
    pub width: usize,
    pub classes: usize,
}

impl ModelConfig {
    pub fn small(channels: usize, height: usize, width: usize, classes: usize) -> Self {
        ModelConfig {
            name: "small".into(),
            channels,
            height,
            width,
            classes,
        }
    }

    /// (name, shape, weight decay applies) of every trainable tensor, in a fixed order.
    pub fn trainable(&self) -> Vec<(String, Vec<usize>, bool)> {
        let mut v = Vec::new();
        let mut cin = self.channels;
        for (i, &c) in WIDTHS.iter().enumerate() {
            v.push((format!("conv{}.weight", i + 1), vec![c, cin, 3, 3], true));
            v.push((format!("bn{}.weight", i + 1), vec![c], false));
            v.push((format!("bn{}.bias", i + 1), vec![c], false));
            cin = c;
        }
        v.push(("fc.weight".into(), vec![self.classes, cin], true));
        v.push(("fc.bias".into(), vec![self.classes], false));
        v
    }

    /// Running statistics of the batch norms (not trained, but part of the model).
    pub fn buffers(&self) -> Vec<(String, Vec<usize>)> {
        let mut v = Vec::new();
        for (i, &c) in WIDTHS.iter().enumerate() {
            v.push((format!("bn{}.running_mean", i + 1), vec![c]));
            v.push((format!("bn{}.running_var", i + 1), vec![c]));
        }
        v
    }
}

/// Deterministic initial values: Kaiming-normal conv weights (fan-in, ReLU gain), PyTorch's
/// default uniform for the linear layer, BN weight 1 and bias 0, running var 1.
pub fn init_values(cfg: &ModelConfig, seed: u64) -> Vec<(String, Vec<f32>)> {
    let mut state = seed ^ 0x1234_5678_9ABC_DEF0;
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut out = Vec::new();
    for (name, shape, _) in cfg.trainable() {
        let len: usize = shape.iter().product();
        let vals: Vec<f32> = if name.starts_with("conv") {
            let fan_in = (shape[1] * 9) as f64;
            let sd = (2.0 / fan_in).sqrt();
            (0..len)
                .map(|_| {
                    let (u1, u2) = (next().max(1e-300), next());
                    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos() * sd) as f32
                })
                .collect()
        } else if name == "fc.weight" || name == "fc.bias" {
            let bound = 1.0 / (cfg_fc_in() as f64).sqrt();
            (0..len)
                .map(|_| ((next() * 2.0 - 1.0) * bound) as f32)
                .collect()
        } else if name.ends_with(".weight") {
            vec![1.0; len]
        } else {
            vec![0.0; len]
        };
        out.push((name, vals));
    }
    for (name, shape) in cfg.buffers() {
        let len: usize = shape.iter().product();
        out.push((
            name.clone(),
            vec![
                if name.ends_with("running_var") {
                    1.0
                } else {
                    0.0
                };
                len
            ],
        ));
    }
    out
}

fn cfg_fc_in() -> usize {
    WIDTHS[2]
}

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

/// Saved activations of one forward pass, reused between steps.
struct Acts<B: Backend> {
    a: Vec<B::Buf>,   // conv outputs (BN inputs)
    r: Vec<B::Buf>,   // BN+ReLU outputs
    p: Vec<B::Buf>,   // pooled outputs (stages 1, 2)
    arg: Vec<B::Buf>, // pool argmax
    mean: Vec<B::Buf>,
    invstd: Vec<B::Buf>,
    gap: B::Buf,
    logits: B::Buf,
    // scratch for backward
    d1: B::Buf,
    d2: B::Buf,
    dp: B::Buf,
    dlogits: B::Buf,
}

pub struct Model<B: Backend> {
    pub cfg: ModelConfig,
    pub params: Params<B>,
    acts: Acts<B>,
    pub input: B::Buf,
    /// Labels of the batch in `input`, as the backend's loss reads them.
    pub labels: B::Buf,
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
        let z = |be: &mut B| be.zeros(0);
        let acts = Acts {
            a: (0..3).map(|_| z(be)).collect(),
            r: (0..3).map(|_| z(be)).collect(),
            p: (0..2).map(|_| z(be)).collect(),
            arg: (0..2).map(|_| z(be)).collect(),
            mean: (0..3).map(|_| z(be)).collect(),
            invstd: (0..3).map(|_| z(be)).collect(),
            gap: z(be),
            logits: z(be),
            d1: z(be),
            d2: z(be),
            dp: z(be),
            dlogits: z(be),
        };
        let input = be.zeros(0);
        let labels = be.zeros(0);
        Model {
            cfg,
            params,
            acts,
            input,
            labels,
        }
    }

    /// Spatial size at each stage: (h, w) before stage i's conv.
    fn dims(&self) -> [(usize, usize); 3] {
        let (h, w) = (self.cfg.height, self.cfg.width);
        [(h, w), (h / 2, w / 2), (h / 4, w / 4)]
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
        let dims = self.dims();
        let p = &mut self.params;
        let a = &mut self.acts;
        let mut cin = self.cfg.channels;
        for s in 0..3 {
            let (h, w) = dims[s];
            let c = WIDTHS[s];
            let x = if s == 0 { &self.input } else { &a.p[s - 1] };
            be.conv3x3(x, &p.w[3 * s], &mut a.a[s], n, cin, c, h, w);
            let (rm, rest) = p.running.split_at_mut(2 * s + 1);
            if train {
                be.bn_train(
                    &a.a[s],
                    &p.w[3 * s + 1],
                    &p.w[3 * s + 2],
                    &mut a.r[s],
                    &mut a.mean[s],
                    &mut a.invstd[s],
                    &mut rm[2 * s],
                    &mut rest[0],
                    n,
                    c,
                    h * w,
                    true,
                );
            } else {
                be.bn_eval(
                    &a.a[s],
                    &p.w[3 * s + 1],
                    &p.w[3 * s + 2],
                    &rm[2 * s],
                    &rest[0],
                    &mut a.r[s],
                    n,
                    c,
                    h * w,
                    true,
                );
            }
            if s < 2 {
                be.maxpool2(&a.r[s], &mut a.p[s], &mut a.arg[s], n, c, h, w);
            }
            cin = c;
        }
        let (h, w) = dims[2];
        be.gap(&a.r[2], &mut a.gap, n, WIDTHS[2], h * w);
        be.linear(
            &a.gap,
            &p.w[9],
            &p.w[10],
            &mut a.logits,
            n,
            WIDTHS[2],
            self.cfg.classes,
        );
        &a.logits
    }

    /// Loss and its gradient for the last forward pass of `n` samples; the loss sum and correct
    /// count accumulate in the backend (`Backend::take_loss_stats`).
    pub fn loss(&mut self, be: &mut B, n: usize, smoothing: f32) {
        be.softmax_xent(
            &self.acts.logits,
            &self.labels,
            smoothing,
            &mut self.acts.dlogits,
            n,
            self.cfg.classes,
        )
    }

    /// Backward from `dlogits` (set by `loss`), writing every parameter gradient.
    pub fn backward(&mut self, be: &mut B, n: usize) {
        let dims = self.dims();
        let p = &mut self.params;
        let a = &mut self.acts;
        let k = self.cfg.classes;
        let c3 = WIDTHS[2];
        let (g9, g10) = p.g.split_at_mut(10);
        be.linear_backward(
            &a.gap,
            &p.w[9],
            &a.dlogits,
            &mut a.d1,
            &mut g9[9],
            &mut g10[0],
            n,
            c3,
            k,
        );
        let (h, w) = dims[2];
        be.gap_backward(&a.d1, &mut a.d2, n, c3, h * w);
        // d2 holds d(out of stage 2's ReLU).
        for s in (0..3).rev() {
            let (h, w) = dims[s];
            let c = WIDTHS[s];
            let cin = if s == 0 {
                self.cfg.channels
            } else {
                WIDTHS[s - 1]
            };
            {
                let (gw, gb) = p.g.split_at_mut(3 * s + 2);
                be.bn_backward(
                    &a.a[s],
                    &a.d2,
                    &p.w[3 * s + 1],
                    &a.mean[s],
                    &a.invstd[s],
                    &mut a.d1,
                    &mut gw[3 * s + 1],
                    &mut gb[0],
                    n,
                    c,
                    h * w,
                    Some(&a.r[s]),
                );
            }
            let x = if s == 0 { &self.input } else { &a.p[s - 1] };
            if s == 0 {
                be.conv3x3_backward(x, &p.w[0], &a.d1, None, &mut p.g[0], n, cin, c, h, w);
            } else {
                // d(pooled input) into dp, then through the previous stage's pool into d2.
                be.conv3x3_backward(
                    x,
                    &p.w[3 * s],
                    &a.d1,
                    Some(&mut a.dp),
                    &mut p.g[3 * s],
                    n,
                    cin,
                    c,
                    h,
                    w,
                );
                let (ph, pw) = dims[s - 1];
                be.maxpool2_backward(&a.dp, &a.arg[s - 1], &mut a.d2, n, cin, ph, pw);
            }
        }
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
