//! Models as data: each model is a short list of layers (`ModelConfig::layers`), built in one
//! place; `model.rs` walks any such list forward and backward on a `Backend`.
//!
//!
//! - `small`, exactly as DESIGN.md defines it: conv3x3(C->32, no bias) BN ReLU maxpool2 /
//!   conv3x3(32->64) BN ReLU maxpool2 / conv3x3(64->128) BN ReLU / global average pool /
//!   linear(128->classes).
//! - `resnet18`: the standard ResNet-18 (BasicBlocks [2, 2, 2, 2], widths 64-128-256-512, strided
//!   3x3 convolutions and 1x1 projection shortcuts), with torchvision's tensor names. Inputs of
//!   96 px and more (the shorter side) get the 7x7/2 stem and a 3x3/2 max-pool; smaller ones a
//!   3x3/1 stem without the pool, which keeps 28-64 px images from being pooled away.
//! - `unet`: the standard 2-D U-Net for segmentation. Five levels of widths w, 2w, 4w, 8w, 16w
//!   (w = `base_width`, 32 by default), each two conv3x3(pad 1, no bias) BN ReLU; max-pool 2x2
//!   down between levels (four downsamplings); up: conv1x1 halving the channels at the low
//!   resolution (the same function as nearest upsampling then conv1x1, four times cheaper), a
//!   nearest `Upsample` to the skip's size (so odd sizes work), `Concat` [skip, up], two conv3x3
//!   BN ReLU; head: conv1x1 -> classes plus a per-channel `Bias`. Its output is not a linear
//!   layer's [n, classes] but per-pixel logits [n, classes, H, W] at the input's size. Tensor
//!   names: `enc1.conv1`, `enc1.bn1`, ..., `enc5.bn2`, `dec4.up`, `dec4.conv1`, ..., `head`.

use super::{out_size, ConvShape, PoolShape};
use serde::{Deserialize, Serialize};

#[cfg(test)]
mod tests_unet;

/// The models `--model` takes.
pub const MODELS: [&str; 3] = ["small", "resnet18", "unet"];

/// Peak learning rate of the one-cycle schedule that `prep train` uses unless told otherwise:
/// `small` trains fastest near 1.2 at batch 512; resnet18, deeper and with residual adds,
/// diverges there and is trained at 0.4. `unet` starts at 0.1: nnU-Net trains the same kind of
/// network with SGD (Nesterov) at 0.01 and momentum 0.99, an effective step of
/// lr / (1 - momentum) = 1; with our momentum of 0.9 that step is lr 0.1 (to be tuned).
pub fn default_lr(model: &str) -> f32 {
    match model {
        "resnet18" => 0.4,
        "unet" => 0.1,
        _ => 1.2,
    }
}

/// The U-Net's first-level width unless `ModelConfig::base_width` says otherwise.
pub const UNET_BASE_WIDTH: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub name: String,
    pub channels: usize,
    pub height: usize,
    pub width: usize,
    pub classes: usize,
    /// The U-Net's first-level channels (`UNET_BASE_WIDTH` when absent; other models have
    /// none). Optional, so recipes and checkpoints written before it load as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_width: Option<usize>,
}

/// What a layer computes. Convolutions and the linear layer own a weight (and the linear layer a
/// bias); batch norm owns a scale, a shift and running statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Convolution without bias: `cout` filters of k x k.
    Conv {
        cout: usize,
        k: usize,
        stride: usize,
        pad: usize,
    },
    /// Training-mode batch norm over (n, h, w) per channel, with the ReLU fused when `relu`.
    BatchNorm {
        relu: bool,
    },
    MaxPool {
        k: usize,
        stride: usize,
        pad: usize,
    },
    /// The sum of two values of one shape (a residual connection), then ReLU when `relu`.
    Add {
        relu: bool,
    },
    /// [n, c, h, w] -> [n, c].
    GlobalAvgPool,
    /// [n, k] -> [n, out], with bias.
    Linear {
        out: usize,
    },
    /// The channels of inputs[0] then those of inputs[1] (of one height and width; on the GPU
    /// neither may be the input batch, whose channels are padded).
    Concat,
    /// Nearest-neighbour resize to h x w: output row y reads input row floor(y * hin / h), and
    /// the same for columns.
    Upsample {
        h: usize,
        w: usize,
    },
    /// Adds a trainable per-channel bias (`NAME.bias`, no weight decay).
    Bias,
}

/// One layer: its op, the values it reads (0 is the input batch, value i + 1 is layer i's
/// output) and the name its tensors are saved under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    pub op: Op,
    pub inputs: Vec<usize>,
    pub name: String,
}

/// Shape of a value: channels, height, width (a linear layer's output is [c, 1, 1]).
pub type Dims = (usize, usize, usize);

/// Builds a layer list and tracks the shape of every value.
struct Builder {
    layers: Vec<Layer>,
    dims: Vec<Dims>,
}

impl Builder {
    fn new(input: Dims) -> Self {
        Builder {
            layers: Vec::new(),
            dims: vec![input],
        }
    }
    fn push(&mut self, op: Op, inputs: &[usize], name: &str) -> usize {
        let (c, h, w) = self.dims[inputs[0]];
        let d = match op {
            Op::Conv {
                cout,
                k,
                stride,
                pad,
            } => (
                cout,
                out_size(h, k, stride, pad),
                out_size(w, k, stride, pad),
            ),
            Op::MaxPool { k, stride, pad } => {
                (c, out_size(h, k, stride, pad), out_size(w, k, stride, pad))
            }
            Op::BatchNorm { .. } | Op::Add { .. } | Op::Bias => (c, h, w),
            Op::GlobalAvgPool => (c, 1, 1),
            Op::Linear { out } => (out, 1, 1),
            Op::Concat => (c + self.dims[inputs[1]].0, h, w),
            Op::Upsample { h, w } => (c, h, w),
        };
        self.layers.push(Layer {
            op,
            inputs: inputs.to_vec(),
            name: name.to_string(),
        });
        self.dims.push(d);
        self.dims.len() - 1
    }
    fn conv(&mut self, x: usize, name: &str, cout: usize, k: usize, stride: usize) -> usize {
        let op = Op::Conv {
            cout,
            k,
            stride,
            pad: k / 2,
        };
        self.push(op, &[x], name)
    }
    fn bn(&mut self, x: usize, name: &str, relu: bool) -> usize {
        self.push(Op::BatchNorm { relu }, &[x], name)
    }
}

impl ModelConfig {
    /// A model by name for CxHxW inputs, or why it cannot take them.
    pub fn new(
        name: &str,
        channels: usize,
        height: usize,
        width: usize,
        classes: usize,
    ) -> Result<Self, String> {
        if !MODELS.contains(&name) {
            return Err(format!(
                "there is no model `{name}`; models: {}",
                MODELS.join(", ")
            ));
        }
        let cfg = ModelConfig {
            name: name.into(),
            channels,
            height,
            width,
            classes,
            base_width: None,
        };
        if channels == 0 || classes == 0 {
            return Err(format!(
                "model `{name}` needs at least one channel and one class"
            ));
        }
        // Every value must keep at least one pixel.
        let empty = |c: &ModelConfig| {
            let (layers, dims) = c.layers();
            layers
                .into_iter()
                .zip(&dims[1..])
                .find(|(_, d)| d.1 == 0 || d.2 == 0)
                .map(|(l, _)| l.name)
        };
        if let Some(layer) = empty(&cfg) {
            let min = (1..=4096).find(|&s| {
                empty(&ModelConfig {
                    height: s,
                    width: s,
                    ..cfg.clone()
                })
                .is_none()
            });
            return Err(format!(
                "model `{name}` needs images of at least {0}x{0}: after its layer `{layer}`, {height}x{width} images have no pixels left",
                min.unwrap_or(0)
            ));
        }
        Ok(cfg)
    }

    pub fn small(channels: usize, height: usize, width: usize, classes: usize) -> Self {
        ModelConfig {
            name: "small".into(),
            channels,
            height,
            width,
            classes,
            base_width: None,
        }
    }

    /// A `unet` of first-level width `base` (tests; no size check).
    pub fn unet(channels: usize, height: usize, width: usize, classes: usize, base: usize) -> Self {
        ModelConfig {
            name: "unet".into(),
            channels,
            height,
            width,
            classes,
            base_width: Some(base),
        }
    }

    /// This model with the U-Net's first-level width `base` (from 1 to 4096: its widest level
    /// has 16 times that), or why not.
    pub fn with_base_width(mut self, base: usize) -> Result<Self, String> {
        if self.name != "unet" {
            return Err(format!("model `{}` has no width option", self.name));
        }
        if !(1..=4096).contains(&base) {
            return Err(format!(
                "a U-Net's width must be from 1 to 4096 channels, not {base}"
            ));
        }
        self.base_width = Some(base);
        Ok(self)
    }

    /// The layer list and the shape of every value (input first).
    pub fn layers(&self) -> (Vec<Layer>, Vec<Dims>) {
        let mut b = Builder::new((self.channels, self.height, self.width));
        let x = match self.name.as_str() {
            "resnet18" => resnet18(&mut b, self.height.min(self.width) >= 96),
            "unet" => {
                let base = self.base_width.unwrap_or(UNET_BASE_WIDTH);
                unet(&mut b, base, self.classes);
                return (b.layers, b.dims);
            }
            _ => small(&mut b),
        };
        b.push(Op::Linear { out: self.classes }, &[x], "fc");
        (b.layers, b.dims)
    }

    /// (name, shape, weight decay applies) of every trainable tensor, in a fixed order.
    pub fn trainable(&self) -> Vec<(String, Vec<usize>, bool)> {
        let (layers, dims) = self.layers();
        let mut v = Vec::new();
        for l in &layers {
            let cin = dims[l.inputs[0]].0;
            match l.op {
                Op::Conv { cout, k, .. } => {
                    v.push((format!("{}.weight", l.name), vec![cout, cin, k, k], true))
                }
                Op::BatchNorm { .. } => {
                    v.push((format!("{}.weight", l.name), vec![cin], false));
                    v.push((format!("{}.bias", l.name), vec![cin], false));
                }
                Op::Linear { out } => {
                    v.push((format!("{}.weight", l.name), vec![out, cin], true));
                    v.push((format!("{}.bias", l.name), vec![out], false));
                }
                Op::Bias => v.push((format!("{}.bias", l.name), vec![cin], false)),
                _ => {}
            }
        }
        v
    }

    /// Running statistics of the batch norms (not trained, but part of the model).
    pub fn buffers(&self) -> Vec<(String, Vec<usize>)> {
        let (layers, dims) = self.layers();
        let mut v = Vec::new();
        for l in layers
            .iter()
            .filter(|l| matches!(l.op, Op::BatchNorm { .. }))
        {
            let c = dims[l.inputs[0]].0;
            v.push((format!("{}.running_mean", l.name), vec![c]));
            v.push((format!("{}.running_var", l.name), vec![c]));
        }
        v
    }

    /// Every convolution of a batch of `n`, in the order the walker runs them, and whether it
    /// reads the input batch.
    pub fn convs(&self, n: usize) -> Vec<(ConvShape, bool)> {
        let (layers, dims) = self.layers();
        layers
            .iter()
            .filter_map(|l| Some((conv_shape(&l.op, dims[l.inputs[0]], n)?, l.inputs[0] == 0)))
            .collect()
    }

    /// Bytes a training step of a batch of `n` keeps on the device beside the weights, with
    /// activations of `act_bytes` each: every layer's output, the max pools' winners, the
    /// input, and the gradients in flight during backward: at least three values' worth (the
    /// one being read, the one being written and one shared by a residual add), more where
    /// gradients wait longer (a U-Net's skip connections; `gradients_in_flight`).
    pub fn activation_bytes(&self, n: usize, act_bytes: usize) -> u64 {
        let (layers, dims) = self.layers();
        let size = |d: &Dims| (d.0 * d.1 * d.2) as u64;
        let outputs: u64 = dims.iter().map(size).sum();
        let winners: u64 = layers
            .iter()
            .enumerate()
            .filter(|(_, l)| matches!(l.op, Op::MaxPool { .. }))
            .map(|(i, _)| size(&dims[i + 1]))
            .sum();
        let largest = dims.iter().map(size).max().unwrap_or(0);
        let grads = (3 * largest).max(gradients_in_flight(&layers, &dims));
        n as u64 * ((outputs + grads) * act_bytes as u64 + winners)
    }

    /// Bytes of the weights, their gradients and momentum (float32).
    pub fn parameter_bytes(&self) -> u64 {
        let count: usize = self
            .trainable()
            .iter()
            .map(|t| t.1.iter().product::<usize>())
            .sum();
        3 * 4 * count as u64
    }
}

fn small(b: &mut Builder) -> usize {
    let mut x = 0;
    for (i, c) in [32, 64, 128].into_iter().enumerate() {
        let n = i + 1;
        x = b.conv(x, &format!("conv{n}"), c, 3, 1);
        x = b.bn(x, &format!("bn{n}"), true);
        if i < 2 {
            let op = Op::MaxPool {
                k: 2,
                stride: 2,
                pad: 0,
            };
            x = b.push(op, &[x], &format!("pool{n}"));
        }
    }
    b.push(Op::GlobalAvgPool, &[x], "avgpool")
}

/// Two conv3x3(pad 1) BN ReLU at `c` channels: `P.conv1`, `P.bn1`, `P.conv2`, `P.bn2`.
fn double_conv(b: &mut Builder, x: usize, p: &str, c: usize) -> usize {
    let x = b.conv(x, &format!("{p}.conv1"), c, 3, 1);
    let x = b.bn(x, &format!("{p}.bn1"), true);
    let x = b.conv(x, &format!("{p}.conv2"), c, 3, 1);
    b.bn(x, &format!("{p}.bn2"), true)
}

fn unet(b: &mut Builder, base: usize, classes: usize) -> usize {
    let mut skips = Vec::new();
    let mut x = 0;
    for level in 1..=5 {
        if level > 1 {
            let op = Op::MaxPool {
                k: 2,
                stride: 2,
                pad: 0,
            };
            x = b.push(op, &[x], &format!("pool{}", level - 1));
        }
        x = double_conv(b, x, &format!("enc{level}"), base << (level - 1));
        skips.push(x);
    }
    for level in (1..=4).rev() {
        let (c, skip) = (base << (level - 1), skips[level - 1]);
        let (_, h, w) = b.dims[skip];
        let p = format!("dec{level}");
        let up = b.conv(x, &format!("{p}.up"), c, 1, 1);
        let up = b.push(Op::Upsample { h, w }, &[up], &format!("{p}.upsample"));
        let cat = b.push(Op::Concat, &[skip, up], &format!("{p}.concat"));
        x = double_conv(b, cat, &p, c);
    }
    let y = b.conv(x, "head", classes, 1, 1);
    b.push(Op::Bias, &[y], "head")
}

fn resnet18(b: &mut Builder, large: bool) -> usize {
    let mut x = if large {
        let x = b.conv(0, "conv1", 64, 7, 2);
        let x = b.bn(x, "bn1", true);
        let op = Op::MaxPool {
            k: 3,
            stride: 2,
            pad: 1,
        };
        b.push(op, &[x], "maxpool")
    } else {
        let x = b.conv(0, "conv1", 64, 3, 1);
        b.bn(x, "bn1", true)
    };
    let mut cin = 64;
    for (stage, width) in [64, 128, 256, 512].into_iter().enumerate() {
        for block in 0..2 {
            let stride = if stage > 0 && block == 0 { 2 } else { 1 };
            let p = format!("layer{}.{block}", stage + 1);
            let y = b.conv(x, &format!("{p}.conv1"), width, 3, stride);
            let y = b.bn(y, &format!("{p}.bn1"), true);
            let y = b.conv(y, &format!("{p}.conv2"), width, 3, 1);
            let y = b.bn(y, &format!("{p}.bn2"), false);
            let short = if stride != 1 || cin != width {
                let s = b.conv(x, &format!("{p}.downsample.0"), width, 1, stride);
                b.bn(s, &format!("{p}.downsample.1"), false)
            } else {
                x
            };
            x = b.push(Op::Add { relu: true }, &[y, short], &format!("{p}.add"));
            cin = width;
        }
    }
    b.push(Op::GlobalAvgPool, &[x], "avgpool")
}

/// The most values' worth of gradients (per sample) that the walker's backward holds at once,
/// counted from above: a value's gradient lives from the backward of its first reader to its
/// producer's, and a layer's backward writes its inputs' gradients into fresh buffers while
/// its output's is still held.
fn gradients_in_flight(layers: &[Layer], dims: &[Dims]) -> u64 {
    let size = |v: usize| (dims[v].0 * dims[v].1 * dims[v].2) as u64;
    let mut live = vec![false; dims.len()];
    live[dims.len() - 1] = true;
    let (mut held, mut peak) = (size(dims.len() - 1), size(dims.len() - 1));
    for (i, l) in layers.iter().enumerate().rev() {
        if !live[i + 1] {
            continue;
        }
        let fresh: u64 = l.inputs.iter().map(|&v| size(v)).sum();
        peak = peak.max(held + fresh);
        live[i + 1] = false;
        held -= size(i + 1);
        for &v in l.inputs.iter().filter(|&&v| v != 0) {
            if !live[v] {
                live[v] = true;
                held += size(v);
            }
        }
    }
    peak
}

/// Deterministic initial values: Kaiming-normal conv weights (fan-in, ReLU gain), PyTorch's
/// default uniform for the linear layer, BN weight 1 and bias 0, running var 1; a `Bias`
/// layer's bias 0 (the U-Net's 1x1 head weight is Kaiming-normal as every conv's).
pub fn init_values(cfg: &ModelConfig, seed: u64) -> Vec<(String, Vec<f32>)> {
    let mut state = seed ^ 0x1234_5678_9ABC_DEF0;
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let (layers, _) = cfg.layers();
    let linear = |name: &str| {
        layers
            .iter()
            .any(|l| matches!(l.op, Op::Linear { .. }) && name.starts_with(&format!("{}.", l.name)))
    };
    let mut out = Vec::new();
    for (name, shape, _) in cfg.trainable() {
        let len: usize = shape.iter().product();
        let vals: Vec<f32> = if linear(&name) {
            // fan-in of the weight [out, in]
            let bound = 1.0 / (cfg_fan_in(&cfg.trainable(), &name) as f64).sqrt();
            (0..len)
                .map(|_| ((next() * 2.0 - 1.0) * bound) as f32)
                .collect()
        } else if shape.len() == 4 {
            let fan_in = (shape[1] * shape[2] * shape[3]) as f64;
            let sd = (2.0 / fan_in).sqrt();
            (0..len)
                .map(|_| {
                    let (u1, u2) = (next().max(1e-300), next());
                    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos() * sd) as f32
                })
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
        let v = if name.ends_with("running_var") {
            1.0
        } else {
            0.0
        };
        out.push((name, vec![v; len]));
    }
    out
}

/// In-features of the linear layer a tensor (`NAME.weight` or `NAME.bias`) belongs to.
fn cfg_fan_in(trainable: &[(String, Vec<usize>, bool)], name: &str) -> usize {
    let layer = name.rsplit_once('.').map_or(name, |p| p.0);
    trainable
        .iter()
        .find(|t| t.0 == format!("{layer}.weight"))
        .map_or(1, |t| t.1[1])
}

pub(super) fn conv_shape(op: &Op, (cin, h, w): Dims, n: usize) -> Option<ConvShape> {
    match *op {
        Op::Conv {
            cout,
            k,
            stride,
            pad,
        } => Some(ConvShape {
            n,
            cin,
            cout,
            h,
            w,
            k,
            stride,
            pad,
        }),
        _ => None,
    }
}

pub(super) fn pool_shape(
    (c, h, w): Dims,
    n: usize,
    k: usize,
    stride: usize,
    pad: usize,
) -> PoolShape {
    PoolShape {
        n,
        c,
        h,
        w,
        k,
        stride,
        pad,
    }
}
