//! Finite-difference checks of every backward operation and of the whole model, written once for
//! any `Backend` (the CPU reference runs them in `cargo test`; the CUDA backend runs the same).

use super::{Backend, ConvShape, Model, ModelConfig, PoolShape, RawBatch};

// The U-Net's layers and model (gradcheck/layers.rs).
mod layers;
pub use layers::{check_unet, check_unet_ops};

struct Rng(u64);
impl Rng {
    fn f(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f()).collect()
    }
    fn idx(&mut self, n: usize) -> usize {
        ((self.f() + 1.0) * 0.5 * n as f32) as usize % n
    }
}

/// Step of the central differences: single ops are smooth enough for 1e-2; a whole network has
/// ReLU kinks that a step of 1e-2 crosses (resnet18's first layers then read 3e-2 off).
const EPS: f32 = 1e-2;
const MODEL_EPS: f32 = 1e-3;

/// Compare analytic gradient `g` of `loss(x)` against central differences at sampled indices.
fn compare(what: &str, x: &[f32], g: &[f32], loss: impl FnMut(&[f32]) -> f64, rng: &mut Rng) {
    compare_eps(what, x, g, loss, rng, EPS)
}

fn compare_eps(
    what: &str,
    x: &[f32],
    g: &[f32],
    mut loss: impl FnMut(&[f32]) -> f64,
    rng: &mut Rng,
    eps: f32,
) {
    let mut worst = 0.0f64;
    for _ in 0..24 {
        let i = rng.idx(x.len());
        let mut xp = x.to_vec();
        xp[i] += eps;
        let lp = loss(&xp);
        xp[i] -= 2.0 * eps;
        let lm = loss(&xp);
        let num = (lp - lm) / (2.0 * eps as f64);
        let err = (num - g[i] as f64).abs() / (1.0f64).max(num.abs());
        worst = worst.max(err);
        assert!(
            err < 2e-2,
            "{what}: index {i}: analytic {} vs numeric {num}",
            g[i]
        );
    }
    eprintln!("gradcheck {what}: worst relative error {worst:.2e}");
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

/// Every backward op of `be` against finite differences.
pub fn check_ops<B: Backend>(be: &mut B) {
    let mut rng = Rng(7);
    let (n, cin, cout, h, w) = (3, 2, 4, 6, 5);

    // Convolutions of every kind the models use, on an odd, non-square image: d/dx and d/dw of
    // <conv(x, w), r>.
    for (k, stride, pad) in [(3, 1, 1), (1, 1, 0), (1, 2, 0), (3, 2, 1), (7, 2, 3)] {
        let s = ConvShape {
            n,
            cin,
            cout,
            h: 7,
            w: 6,
            k,
            stride,
            pad,
        };
        let x = rng.vec(n * cin * s.h * s.w);
        let wt = rng.vec(cout * cin * k * k);
        let r = rng.vec(n * cout * s.oh() * s.ow());
        let (xd, yd) = ([n, cin, s.h, s.w], [n, cout, s.oh(), s.ow()]);
        let (xb, wb, rb) = (be.upload_act(&x, xd), be.upload(&wt), be.upload_act(&r, yd));
        let (mut dx, mut dw) = (be.zeros(0), be.zeros(0));
        be.conv_backward(&xb, &wb, &rb, Some(&mut dx), &mut dw, &s);
        let (dx, dw) = (be.download(&dx), be.download(&dw));
        let conv = |be: &mut B, x: &[f32], wt: &[f32]| {
            let (xb, wb) = (be.upload_act(x, xd), be.upload(wt));
            let mut y = be.zeros(0);
            be.conv(&xb, &wb, &mut y, &s);
            dot(&be.download(&y), &r)
        };
        let what = format!("conv{k}x{k}/{stride} pad {pad}");
        compare(
            &format!("{what} dx"),
            &x,
            &dx,
            |v| conv(be, v, &wt),
            &mut rng,
        );
        compare(
            &format!("{what} dw"),
            &wt,
            &dw,
            |v| conv(be, &x, v),
            &mut rng,
        );
    }
    let _ = (h, w);

    // batch norm (training mode): dx, dgamma, dbeta of <bn(x), r>
    let c = 3;
    let hw = 4;
    let x = rng.vec(n * c * hw);
    let gamma: Vec<f32> = rng.vec(c).iter().map(|v| 1.0 + 0.5 * v).collect();
    let beta = rng.vec(c);
    let r = rng.vec(n * c * hw);
    let bn = |be: &mut B, x: &[f32], g: &[f32], b: &[f32], grads: bool| -> (f64, Vec<Vec<f32>>) {
        let d = [n, c, hw, 1];
        let (xb, gb, bb) = (be.upload_act(x, d), be.upload(g), be.upload(b));
        let rb = be.upload_act(&r, d);
        let (mut y, mut m, mut is) = (be.zeros(0), be.zeros(0), be.zeros(0));
        let (mut rm, mut rv) = (be.zeros(c), be.upload(&vec![1.0; c]));
        be.bn_train(
            &xb, &gb, &bb, &mut y, &mut m, &mut is, &mut rm, &mut rv, n, c, hw, false,
        );
        let l = dot(&be.download(&y), &r);
        if !grads {
            return (l, vec![]);
        }
        let (mut dx, mut dg, mut db) = (be.zeros(0), be.zeros(0), be.zeros(0));
        be.bn_backward(
            &xb, &rb, &gb, &bb, &m, &is, &mut dx, &mut dg, &mut db, n, c, hw, None,
        );
        (
            l,
            vec![be.download(&dx), be.download(&dg), be.download(&db)],
        )
    };
    let (_, gr) = bn(be, &x, &gamma, &beta, true);
    compare(
        "batchnorm dx",
        &x,
        &gr[0],
        |v| bn(be, v, &gamma, &beta, false).0,
        &mut rng,
    );
    compare(
        "batchnorm dgamma",
        &gamma,
        &gr[1],
        |v| bn(be, &x, v, &beta, false).0,
        &mut rng,
    );
    compare(
        "batchnorm dbeta",
        &beta,
        &gr[2],
        |v| bn(be, &x, &gamma, v, false).0,
        &mut rng,
    );

    // ReLU, away from the kink.
    let x: Vec<f32> = rng
        .vec(64)
        .iter()
        .map(|v| if v.abs() < 0.1 { 0.5 } else { *v })
        .collect();
    let r = rng.vec(64);
    let mut y = be.upload(&x);
    be.relu(&mut y);
    let mut d = be.upload(&r);
    be.relu_backward(&y, &mut d);
    let d = be.download(&d);
    compare(
        "relu",
        &x,
        &d,
        |v| {
            let mut y = be.upload(v);
            be.relu(&mut y);
            dot(&be.download(&y), &r)
        },
        &mut rng,
    );

    // Max pools (2x2/2, and 3x3/2 with padding, whose windows overlap), with well separated
    // values so the winners do not change.
    for (k, stride, pad) in [(2, 2, 0), (3, 2, 1)] {
        let s = PoolShape {
            n,
            c: 2,
            h: 5,
            w: 6,
            k,
            stride,
            pad,
        };
        let x: Vec<f32> = (0..n * s.c * s.h * s.w)
            .map(|i| (i as f32 * 0.37).sin() * 3.0 + i as f32 * 0.05)
            .collect();
        let r = rng.vec(n * s.c * s.oh() * s.ow());
        let (mut y, mut arg, mut dx) = (be.zeros(0), be.zeros(0), be.zeros(0));
        let (xd, yd) = ([n, s.c, s.h, s.w], [n, s.c, s.oh(), s.ow()]);
        let xb = be.upload_act(&x, xd);
        be.maxpool(&xb, &mut y, &mut arg, &s);
        let rb = be.upload_act(&r, yd);
        be.maxpool_backward(&rb, &arg, &mut dx, &s);
        let dx = be.download(&dx);
        compare(
            &format!("maxpool {k}x{k}/{stride} pad {pad}"),
            &x,
            &dx,
            |v| {
                let (mut y, mut a) = (be.zeros(0), be.zeros(0));
                let vb = be.upload_act(v, xd);
                be.maxpool(&vb, &mut y, &mut a, &s);
                dot(&be.download(&y), &r)
            },
            &mut rng,
        );
    }

    // Residual add, plain and with the ReLU (away from the kink); d/da (the same as d/db).
    for relu in [false, true] {
        let a: Vec<f32> = rng.vec(64);
        let b: Vec<f32> = a
            .iter()
            .map(|v| if v.abs() < 0.1 { 0.5 } else { v * 0.5 })
            .collect();
        let r = rng.vec(64);
        let (ab, bb) = (be.upload(&a), be.upload(&b));
        let mut y = be.zeros(0);
        be.add(&ab, &bb, &mut y, relu);
        let mut d = be.upload(&r);
        if relu {
            be.relu_backward(&y, &mut d);
        }
        // A gradient that reaches a value twice is the sum of both.
        let mut twice = be.zeros(0);
        be.copy(&d, &mut twice);
        be.accumulate(&mut twice, &d);
        let (d, twice) = (be.download(&d), be.download(&twice));
        let doubled: Vec<f32> = d.iter().map(|v| 2.0 * v).collect();
        assert_eq!(twice, doubled, "accumulate");
        compare(
            &format!("add{}", if relu { "+relu" } else { "" }),
            &a,
            &d,
            |v| {
                let (vb, mut y) = (be.upload(v), be.zeros(0));
                be.add(&vb, &bb, &mut y, relu);
                dot(&be.download(&y), &r)
            },
            &mut rng,
        );
    }

    // global average pool
    let x = rng.vec(n * c * 9);
    let r = rng.vec(n * c);
    let mut dx = be.zeros(0);
    let rb = be.upload(&r);
    be.gap_backward(&rb, &mut dx, n, c, 9);
    let dx = be.download(&dx);
    compare(
        "gap",
        &x,
        &dx,
        |v| {
            let mut y = be.zeros(0);
            let vb = be.upload_act(v, [n, c, 3, 3]);
            be.gap(&vb, &mut y, n, c, 9);
            dot(&be.download(&y), &r)
        },
        &mut rng,
    );

    // linear: dx, dw, db
    let (k, m) = (5, 3);
    let x = rng.vec(n * k);
    let wt = rng.vec(m * k);
    let b = rng.vec(m);
    let r = rng.vec(n * m);
    let (mut dx, mut dw, mut db) = (be.zeros(0), be.zeros(0), be.zeros(0));
    let (xb, wb, rb) = (be.upload(&x), be.upload(&wt), be.upload(&r));
    be.linear_backward(&xb, &wb, &rb, &mut dx, &mut dw, &mut db, n, k, m);
    let (dx, dw, db) = (be.download(&dx), be.download(&dw), be.download(&db));
    let lin = |be: &mut B, x: &[f32], wt: &[f32], b: &[f32]| {
        let mut y = be.zeros(0);
        let (xb, wb, bb) = (be.upload(x), be.upload(wt), be.upload(b));
        be.linear(&xb, &wb, &bb, &mut y, n, k, m);
        dot(&be.download(&y), &r)
    };
    compare("linear dx", &x, &dx, |v| lin(be, v, &wt, &b), &mut rng);
    compare("linear dw", &wt, &dw, |v| lin(be, &x, v, &b), &mut rng);
    compare("linear db", &b, &db, |v| lin(be, &x, &wt, v), &mut rng);

    // softmax cross-entropy with label smoothing
    let k = 5;
    let z: Vec<f32> = rng.vec(n * k).iter().map(|v| v * 3.0).collect();
    let labels = be.upload(&[1.0, 4.0, 0.0]);
    let mut dz = be.zeros(0);
    let zb = be.upload(&z);
    be.softmax_xent(&zb, &labels, 0.1, &mut dz, n, k);
    be.take_loss_stats();
    let dz = be.download(&dz);
    compare(
        "softmax cross-entropy",
        &z,
        &dz,
        |v| {
            let mut d = be.zeros(0);
            let vb = be.upload(v);
            be.softmax_xent(&vb, &labels, 0.1, &mut d, n, k);
            be.take_loss_stats().0 / n as f64
        },
        &mut rng,
    );
}

/// Whole-model checks: d(mean loss)/d(trainable tensors) against finite differences, for every
/// tensor of `small`, and for tensors of every kind of `resnet18` at both of its stems.
pub fn check_model<B: Backend>(be: &mut B) {
    check_model_at(be, ModelConfig::small(2, 8, 8, 3), 4, &[]);
    let some = [
        "conv1.weight",
        "bn1.weight",
        "layer1.0.conv2.weight",
        "layer2.0.downsample.0.weight",
        "layer2.0.downsample.1.bias",
        "layer3.1.bn2.weight",
        "layer4.1.conv1.weight",
        "fc.weight",
        "fc.bias",
    ];
    check_model_at(
        be,
        ModelConfig::new("resnet18", 2, 7, 9, 3).unwrap(),
        3,
        &some,
    );
    check_model_at(
        be,
        ModelConfig::new("resnet18", 1, 96, 97, 3).unwrap(),
        2,
        &some[..3],
    );
}

/// `only`: the tensors to check (empty: all).
fn check_model_at<B: Backend>(be: &mut B, cfg: ModelConfig, n: usize, only: &[&str]) {
    let (c, h, w) = (cfg.channels, cfg.height, cfg.width);
    let mut rng = Rng(11);
    let px: Vec<u8> = (0..n * c * h * w)
        .map(|_| ((rng.f() + 1.0) * 127.0) as u8)
        .collect();
    let labels: Vec<u32> = (0..n).map(|i| [0, 2, 1][i % 3]).collect();
    let raw = RawBatch {
        pixels: &px,
        dtype: crate::format::shard::Dtype::U8,
        n,
        c,
        h,
        w,
        labels: &labels,
    };
    let (mean, std) = (vec![0.5; c], vec![0.25; c]);
    let init = super::architecture::init_values(&cfg, 5);
    let loss_with = |be: &mut B, name: &str, vals: &[f32]| -> f64 {
        let mut v = init.clone();
        v.iter_mut().find(|(k, _)| k == name).unwrap().1 = vals.to_vec();
        let mut m = Model::new(be, cfg.clone(), &v);
        m.load(be, &raw, &mean, &std, 0, &[]);
        m.forward(be, n, true);
        m.loss(be, n, 0.1);
        be.take_loss_stats().0 / n as f64
    };
    let mut m = Model::new(be, cfg.clone(), &init);
    m.load(be, &raw, &mean, &std, 0, &[]);
    m.forward(be, n, true);
    m.loss(be, n, 0.1);
    be.take_loss_stats();
    m.backward(be, n);
    let names = m.params.names.clone();
    for (i, name) in names.iter().enumerate() {
        if !only.is_empty() && !only.contains(&name.as_str()) {
            continue;
        }
        let g = be.download(&m.params.g[i]);
        let w = init.iter().find(|(k, _)| k == name).unwrap().1.clone();
        compare_eps(
            &format!("{} {name}", cfg.name),
            &w,
            &g,
            |v| loss_with(be, name, v),
            &mut rng,
            MODEL_EPS,
        );
    }
}
