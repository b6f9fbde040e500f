//! The U-Net's layers on the GPU against the CPU reference: each op on both vector widths and
//! in both precisions (written over stale outputs, so an element left unwritten shows), a
//! small U-Net's forward, backward and SGD step, and that step recorded as a CUDA graph. Without
//! a GPU these tests say so and pass, unless PREP_REQUIRE_CUDA=1.

use super::staging::Kind;
use super::tests::{close, gpu, rel, Rng};
use super::{Buf, Cuda, Precision};
use crate::format::shard::Dtype;
use crate::nn::architecture::init_values;
use crate::nn::cpu::Cpu;
use crate::nn::{Backend, Model, ModelConfig, RawBatch};

/// Cosine of the angle between two vectors: near 1 for rounding, near 0 for a wrong layout or op.
fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot = |x: &[f32], y: &[f32]| {
        x.iter()
            .zip(y)
            .map(|(&p, &q)| p as f64 * q as f64)
            .sum::<f64>()
    };
    dot(a, b) / (dot(a, a) * dot(b, b)).sqrt().max(1e-300)
}

/// Values as the GPU holds them in `prec` (bfloat16: rounded to nearest even), so that a
/// comparison measures the op, not the input's rounding.
fn held(prec: Precision, v: Vec<f32>) -> Vec<f32> {
    if prec == Precision::F32 {
        return v;
    }
    v.into_iter()
        .map(|x| {
            let u = x.to_bits();
            f32::from_bits(((u + 0x7fff + ((u >> 16) & 1)) >> 16) << 16)
        })
        .collect()
}

/// Concatenation, nearest resizing and bias, forward and backward, GPU against CPU. `tol`: of
/// values the GPU rounds once to its activation type (exact in float32 up to the last bit).
fn unet_ops_match(prec: Precision, tol: f64) {
    let Some(mut g) = gpu(prec, Kind::Pinned) else {
        return;
    };
    let mut c = Cpu::default();
    let mut rng = Rng(21);
    let act = g.act_dt();
    let n = 3;
    let mut stale = |g: &mut Cuda, len: usize| -> Buf {
        let v = rng.vec(len);
        let mut b = g.empty(act);
        let f = g.upload(&v);
        g.copy(&f, &mut b);
        b
    };
    let mut rng = Rng(22);
    let mut vals = |len: usize| held(prec, rng.vec(len));

    // Channel runs of 8 (16-byte accesses), odd ones, and one of each.
    for (ca, cb, h, w) in [(8, 16, 9, 7), (3, 5, 9, 7), (8, 3, 4, 5), (32, 32, 16, 16)] {
        let (hw, what) = (h * w, format!("concat {n}x({ca}+{cb})x{h}x{w}"));
        let (mut y, mut da, mut db) = (
            stale(&mut g, n * (ca + cb) * hw),
            stale(&mut g, n * ca * hw),
            stale(&mut g, n * cb * hw),
        );
        let (a, b, dy) = (
            vals(n * ca * hw),
            vals(n * cb * hw),
            vals(n * (ca + cb) * hw),
        );
        let ab = g.upload_act(&a, [n, ca, h, w]);
        let bb = g.upload_act(&b, [n, cb, h, w]);
        let dyb = g.upload_act(&dy, [n, ca + cb, h, w]);
        g.concat(&ab, &bb, &mut y, n, ca, cb, hw);
        g.concat_backward(&dyb, Some(&mut da), Some(&mut db), n, ca, cb, hw);
        let (mut cy, mut cda, mut cdb) = (vec![], vec![], vec![]);
        c.concat(&a, &b, &mut cy, n, ca, cb, hw);
        c.concat_backward(&dy, Some(&mut cda), Some(&mut cdb), n, ca, cb, hw);
        // Moves of values the GPU holds exactly: equal to the bit in either precision.
        assert_eq!(g.download(&y), cy, "{what} y");
        assert_eq!(g.download(&da), cda, "{what} da");
        assert_eq!(g.download(&db), cdb, "{what} db");
        let mut only = stale(&mut g, n * cb * hw);
        g.concat_backward(&dyb, None, Some(&mut only), n, ca, cb, hw);
        assert_eq!(g.download(&only), cdb, "{what} db alone");
    }

    // Enlarging by odd factors and by 2, shrinking, on both vector widths.
    for (ch, h, w, oh, ow) in [
        (16, 4, 5, 9, 11),
        (3, 8, 8, 16, 16),
        (8, 5, 4, 3, 2),
        (5, 19, 23, 38, 46),
    ] {
        let what = format!("upsample {n}x{ch}x{h}x{w} -> {oh}x{ow}");
        let (mut y, mut dx) = (
            stale(&mut g, n * ch * oh * ow),
            stale(&mut g, n * ch * h * w),
        );
        let (x, dy) = (vals(n * ch * h * w), vals(n * ch * oh * ow));
        let xb = g.upload_act(&x, [n, ch, h, w]);
        let dyb = g.upload_act(&dy, [n, ch, oh, ow]);
        g.upsample(&xb, &mut y, n, ch, h, w, oh, ow);
        g.upsample_backward(&dyb, &mut dx, n, ch, h, w, oh, ow);
        let (mut cy, mut cdx) = (vec![], vec![]);
        c.upsample(&x, &mut cy, n, ch, h, w, oh, ow);
        c.upsample_backward(&dy, &mut cdx, n, ch, h, w, oh, ow);
        assert_eq!(g.download(&y), cy, "{what} y");
        // The same float32 additions in the same order; bfloat16 rounds the sum once.
        close(&format!("{what} dx"), &g.download(&dx), &cdx, tol);
    }

    // The bias: few channels (a head's classes), a run of 8, and two channel tiles of 32; with
    // enough pixels for the gradient's sums to be split between blocks.
    for (ch, h, w) in [(2, 37, 41), (16, 9, 7), (40, 13, 11), (3, 64, 64)] {
        let (hw, what) = (h * w, format!("bias {n}x{ch}x{h}x{w}"));
        let mut y = stale(&mut g, n * ch * hw);
        let mut db = g.upload(&rng_vec(ch + 5));
        let (x, dy, b) = (vals(n * ch * hw), vals(n * ch * hw), rng_vec(ch));
        let xb = g.upload_act(&x, [n, ch, h, w]);
        let dyb = g.upload_act(&dy, [n, ch, h, w]);
        let bb = g.upload(&b);
        g.bias(&xb, &bb, &mut y, n, ch, hw);
        g.bias_backward(&dyb, &mut db, n, ch, hw);
        let (mut cy, mut cdb) = (vec![], vec![]);
        c.bias(&x, &b, &mut cy, n, ch, hw);
        c.bias_backward(&dy, &mut cdb, n, ch, hw);
        close(&format!("{what} y"), &g.download(&y), &cy, tol);
        // Float32 sums in blocks against the CPU's float64: their rounding, some 1e-7 of each
        // of up to 12288 terms.
        close(&format!("{what} db"), &g.download(&db), &cdb, 1e-5);
    }
    g.status().unwrap();
}

/// Random values for parameters (float32 on both sides).
fn rng_vec(n: usize) -> Vec<f32> {
    Rng(n as u64 + 99).vec(n)
}

#[test]
fn unet_ops_match_the_cpu_in_float32() {
    unet_ops_match(Precision::F32, 1e-7);
}

#[test]
fn unet_ops_match_the_cpu_in_bfloat16() {
    // One rounding to bfloat16 (8 bits of mantissa): relative error up to 2^-9 per element.
    unet_ops_match(Precision::Bf16, 8e-3);
}

/// A U-Net of `cfg` on a batch of `n`, GPU against CPU from the same weights: the logits, every
/// parameter gradient from the same output gradient, and the weights after one SGD step.
fn unet_step_matches(
    prec: Precision,
    cfg: ModelConfig,
    n: usize,
    (out_tol, grad_tol, weight_tol): (f64, f64, f64),
    min_cos: f64,
) {
    let Some(mut g) = gpu(prec, Kind::Pinned) else {
        return;
    };
    let mut c = Cpu::default();
    let init = init_values(&cfg, 3);
    let mut gm = Model::new(&mut g, cfg.clone(), &init);
    let mut cm = Model::new(&mut c, cfg.clone(), &init);
    let mut rng = Rng(23);
    let (ch, h, w, k) = (cfg.channels, cfg.height, cfg.width, cfg.classes);
    let pixels = rng.bytes(n * ch * h * w);
    let labels = vec![0u32; n];
    let raw = RawBatch {
        pixels: &pixels,
        dtype: Dtype::U8,
        n,
        c: ch,
        h,
        w,
        labels: &labels,
    };
    let (mean, std) = (vec![0.45; ch], vec![0.3; ch]);
    let label = format!("unet {ch}x{h}x{w} width {:?} {prec:?}", cfg.base_width);
    gm.load(&mut g, &raw, &mean, &std, 0, &[]);
    cm.load(&mut c, &raw, &mean, &std, 0, &[]);
    let gy = {
        let y = gm.forward(&mut g, n, true);
        g.download(y)
    };
    let cy = cm.forward(&mut c, n, true).clone();
    close(&format!("{label} logits"), &gy, &cy, out_tol);
    let r = held(prec, rng.vec(n * k * h * w));
    *gm.output_grad() = g.upload_act(&r, [n, k, h, w]);
    *cm.output_grad() = c.upload_act(&r, [n, k, h, w]);
    gm.backward(&mut g, n);
    cm.backward(&mut c, n);
    let mut failed = Vec::new();
    // Every gradient as one vector: its cosine with the CPU's, beside each tensor's own.
    let (mut all_g, mut all_c) = (Vec::new(), Vec::new());
    for i in 0..gm.params.names.len() {
        let name = &gm.params.names[i];
        let (a, b) = (g.download(&gm.params.g[i]), c.download(&cm.params.g[i]));
        let (e, cos) = (rel(&a, &b), cosine(&a, &b));
        all_g.extend_from_slice(&a);
        all_c.extend_from_slice(&b);
        eprintln!(
            "{label} grad {name}: relative error {e:.2e} (tolerance {grad_tol:.0e}), cosine {cos:.3}"
        );
        if e >= grad_tol || cos < min_cos {
            failed.push(format!(
                "{label}: gradient of {name} off by {e:.3e}, cosine {cos:.3}"
            ));
        }
    }
    let cos = cosine(&all_g, &all_c);
    eprintln!("{label} every gradient: cosine {cos:.4}");
    if cos < min_cos.max(0.6) {
        failed.push(format!(
            "{label}: the gradients as one vector have cosine {cos:.4}"
        ));
    }
    gm.step(&mut g, 0.1, 0.9, 5e-4);
    cm.step(&mut c, 0.1, 0.9, 5e-4);
    for ((name, a), (_, b)) in gm.state(&mut g).iter().zip(&cm.state(&mut c)) {
        // Momentum and biases are the gradients themselves after one step.
        let from_grads = name.ends_with(".momentum") || name.ends_with(".bias");
        let tol = if from_grads { grad_tol } else { weight_tol };
        let e = rel(a, b);
        eprintln!("{label} after a step: {name}: relative error {e:.2e} (tolerance {tol:.0e})");
        if e >= tol {
            failed.push(format!("{label} after a step: {name} off by {e:.3e}"));
        }
    }
    g.status().unwrap();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn a_unet_step_matches_the_cpu() {
    // Width 8 (every run of channels a multiple of 8, after the input) on an odd size whose
    // levels round down differently per axis (to 2x2 at the bottom), and width 4 (the
    // one-channel kernels) at the smallest size, with three channels padded to 8 in the input.
    // float32, the check of the arithmetic: the same sums in another order (cuDNN's algorithms,
    // block sums): 1e-4 logits, 1e-3 gradients (3e-5 measured on an H100), weights 1e-4, as a
    // step of 0.1 moves these narrow layers' weights by about their own size, so that they
    // carry the gradients' error.
    for cfg in [
        ModelConfig::unet(1, 37, 43, 3, 8),
        ModelConfig::unet(3, 16, 16, 2, 4),
    ] {
        unet_step_matches(Precision::F32, cfg, 4, (1e-4, 1e-3, 1e-4), 0.999);
    }
    // bfloat16: activations carry 8 bits, so the forward differs from the CPU's (logits by
    // 9%) and the backward follows other paths: max-pool winners among near-equal values and
    // ReLU gates near 0 flip, and batch norms' parameter gradients are sums of nearly cancelling
    // terms. The parameter gradients' relative error grows smoothly from the head to the input
    // (on an H100: head 5e-2, dec1 0.3-0.4, dec3 0.5-0.6, enc1-enc3 0.5-1.1), as resnet18's does
    // in `whole_steps_match_the_cpu_across_shapes` (0.51); each op alone matches within 8e-3
    // (`unet_ops_match_the_cpu_in_bfloat16`). Rounding leaves the gradient pointing roughly the
    // same way; a wrong layout or op turns it (cosine near 0): all gradients as one vector must
    // have a cosine of at least 0.6 with the CPU's (0.79 measured), each tensor's at least 0.3
    // (0.44 measured for enc1.bn1's bias, 8 values). The weights after a step of 0.1 carry the
    // gradients' error (these narrow layers move by about their own size), as in float32.
    unet_step_matches(
        Precision::Bf16,
        ModelConfig::unet(1, 64, 64, 3, 8),
        16,
        (1.5e-1, 1.5, 1.5),
        0.3,
    );
}

/// A U-Net training step recorded as a CUDA graph and replayed gives what issuing its ops
/// does: nothing in the new layers allocates or waits for the host once the first step ran.
#[test]
fn replayed_unet_steps_match_direct_steps() {
    let Some(mut g) = gpu(Precision::F32, Kind::Pinned) else {
        return;
    };
    let cfg = ModelConfig::unet(1, 19, 23, 3, 8);
    let init = init_values(&cfg, 2);
    let mut direct = Model::new(&mut g, cfg.clone(), &init);
    let mut graphed = Model::new(&mut g, cfg, &init);
    let mut rng = Rng(24);
    let n = 4;
    // The output gradient, copied on the device into each model's (a step's own loss would
    // write it there).
    let r = g.upload_act(&rng.vec(n * 3 * 19 * 23), [n, 3, 19, 23]);
    for step in 0..4 {
        let pixels = rng.bytes(n * 19 * 23);
        let labels = vec![0u32; n];
        let raw = RawBatch {
            pixels: &pixels,
            dtype: Dtype::U8,
            n,
            c: 1,
            h: 19,
            w: 23,
            labels: &labels,
        };
        let lr = 0.05 * (step + 1) as f32;
        let run = |g: &mut Cuda, m: &mut Model<Cuda>| {
            m.forward(g, n, true);
            g.copy(&r, m.output_grad());
            m.backward(g, n);
            m.step(g, lr, 0.9, 5e-4);
        };
        direct.load(&mut g, &raw, &[0.5], &[0.3], 0, &[]);
        run(&mut g, &mut direct);
        graphed.load(&mut g, &raw, &[0.5], &[0.3], 0, &[]);
        if step == 0 || !g.replay(lr) {
            let rec = step > 0 && g.begin_capture();
            run(&mut g, &mut graphed);
            if rec {
                assert!(g.end_capture(), "capture failed: {:?}", g.status());
                assert!(g.replay(lr));
            }
        }
    }
    let (a, b) = (direct.state(&mut g), graphed.state(&mut g));
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        close(&format!("unet graph vs direct: {name}"), y, x, 1e-5);
    }
    g.status().unwrap();
}
