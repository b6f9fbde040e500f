//! Finite-difference checks of the losses of the mask, labels and values tasks, written once for
//! any `Backend` (the CPU runs them in `cargo test`; cuda/tests_losses.rs runs them on the GPU).

use super::{Aug, Backend, RawBatch};

struct Rng(u64);
impl Rng {
    fn f(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f() * scale).collect()
    }
    fn below(&mut self, n: usize) -> usize {
        ((self.f() + 1.0) * 0.5 * n as f32) as usize % n
    }
}

const EPS: f32 = 1e-2;

/// Every element of the analytic gradient `g` of `loss(x)` against central differences, within
/// `tol` of the largest analytic element: the gradient of a mean over many elements is small
/// everywhere, so an error relative to 1 would let a wrong gradient pass.
fn compare_all(what: &str, x: &[f32], g: &[f32], mut loss: impl FnMut(&[f32]) -> f64, tol: f64) {
    assert_eq!(x.len(), g.len(), "{what}: gradient length");
    assert!(
        g.iter().all(|v| v.is_finite()),
        "{what}: non-finite gradient"
    );
    let top = g.iter().fold(0.0f64, |m, v| m.max(v.abs() as f64));
    assert!(top > 0.0, "{what}: a zero gradient");
    let mut worst = 0.0f64;
    for i in 0..x.len() {
        let mut xp = x.to_vec();
        xp[i] += EPS;
        let lp = loss(&xp);
        xp[i] -= 2.0 * EPS;
        let lm = loss(&xp);
        let num = (lp - lm) / (2.0 * EPS as f64);
        let err = (num - g[i] as f64).abs() / top;
        worst = worst.max(err);
        assert!(
            err < tol,
            "{what}: index {i}: analytic {} vs numeric {num} (largest {top})",
            g[i]
        );
    }
    eprintln!("gradcheck {what}: worst error {worst:.2e} of the largest element");
}

/// `seg_loss` on logits [n, k, h, w] and targets [n, h*w]: (batch loss, dlogits NCHW, pixels
/// right).
fn seg<B: Backend>(
    be: &mut B,
    z: &[f32],
    t: &B::Buf,
    dice: f32,
    (n, k, h, w): (usize, usize, usize, usize),
) -> (f64, Vec<f32>, u64) {
    let zb = be.upload_act(z, [n, k, h, w]);
    let mut d = be.zeros(0);
    be.seg_loss(&zb, t, dice, &mut d, n, k, h * w);
    let (l, right) = be.take_loss_stats();
    (l / n as f64, be.download(&d), right)
}

/// The losses' gradients against finite differences: segmentation (cross-entropy alone and with
/// Dice, k = 2, 3, 5, ignored pixels and out-of-range classes, and a batch with nothing counted),
/// BCE with logits, MSE and smooth L1. `tol` is relative to the largest gradient element: 1e-2
/// holds for float32 (whose rounding of the loss the step of 1e-2 divides by 50).
pub fn check_losses<B: Backend>(be: &mut B) {
    let mut rng = Rng(3);
    let tol = 1e-2;
    for (k, dice, (n, h, w)) in [
        (3, 0.7, (2, 5, 7)),
        (2, 0.0, (3, 4, 3)),
        (5, 1.0, (2, 3, 5)),
    ] {
        let hw = h * w;
        // About one pixel in six ignored, one outside 0..k (ignored too).
        let mut t: Vec<f32> = (0..n * hw)
            .map(|_| match rng.below(6) {
                0 => -1.0,
                _ => rng.below(k) as f32,
            })
            .collect();
        t[1] = k as f32;
        let z = rng.vec(n * k * hw, 3.0);
        let tb = be.upload(&t);
        let shape = (n, k, h, w);
        let (_, d, _) = seg(be, &z, &tb, dice, shape);
        for s in 0..n {
            for p in 0..hw {
                if t[s * hw + p] < 0.0 || t[s * hw + p] >= k as f32 {
                    for c in 0..k {
                        assert_eq!(d[(s * k + c) * hw + p], 0.0, "an ignored pixel's gradient");
                    }
                }
            }
        }
        compare_all(
            &format!("seg_loss k={k} dice={dice} {n}x{h}x{w}"),
            &z,
            &d,
            |v| seg(be, v, &tb, dice, shape).0,
            tol,
        );
    }
    // Nothing counted: loss 0, gradient 0, no NaN.
    let (n, k, h, w) = (2, 3, 2, 3);
    let t = vec![-1.0; n * h * w];
    let tb = be.upload(&t);
    let z = rng.vec(n * k * h * w, 3.0);
    let (l, d, right) = seg(be, &z, &tb, 1.0, (n, k, h, w));
    assert_eq!((l, right), (0.0, 0), "an all-ignored batch's loss");
    assert_eq!(d, vec![0.0; z.len()], "an all-ignored batch's gradient");

    // BCE with logits: 0/1 targets and a soft one.
    let (n, k) = (3, 4);
    let z = rng.vec(n * k, 4.0);
    let mut t: Vec<f32> = (0..n * k).map(|_| rng.below(2) as f32).collect();
    t[5] = 0.3;
    let tb = be.upload(&t);
    let bce = |be: &mut B, z: &[f32]| {
        let (zb, mut d) = (be.upload(z), be.zeros(0));
        be.bce_logits(&zb, &tb, &mut d, n, k);
        (be.take_loss_stats().0 / n as f64, be.download(&d))
    };
    let (_, d) = bce(be, &z);
    compare_all("bce_logits", &z, &d, |v| bce(be, v).0, tol);

    // Regression: errors away from smooth L1's kink at |e| = 1 (the step is 1e-2).
    let t = rng.vec(n * k, 2.0);
    let pred: Vec<f32> = t
        .iter()
        .map(|&v| {
            let e = rng.f() * 3.0;
            let e = if (e.abs() - 1.0).abs() < 0.1 {
                e * 0.5
            } else {
                e
            };
            v + e
        })
        .collect();
    let tb = be.upload(&t);
    for smooth in [false, true] {
        let reg = |be: &mut B, p: &[f32]| {
            let (pb, mut d) = (be.upload(p), be.zeros(0));
            be.regression_loss(&pb, &tb, smooth, &mut d, n, k);
            let (l, right) = be.take_loss_stats();
            assert_eq!(right, 0, "regression counts nothing right");
            (l / n as f64, be.download(&d))
        };
        let (_, d) = reg(be, &pred);
        compare_all(
            &format!("regression smooth_l1={smooth}"),
            &pred,
            &d,
            |v| reg(be, v).0,
            tol,
        );
    }
}

/// The random crop and flip move a mask exactly as they move its image: each sample's image
/// holds its mask's values as pixels (`p = v`, mean 0, std 1, so the normalised pixel is
/// `v / 255`), both are loaded with the same augmentation, and every pixel of the image must be
/// its target / 255, or 0 (the image's padding) where the target is ignored (the mask's).
pub fn image_and_mask_move_together<B: Backend>(be: &mut B) {
    let (n, h, w, pad) = (6, 5, 7, 2);
    let vals: Vec<u8> = (0..n * h * w).map(|i| (i * 37 % 200 + 1) as u8).collect();
    let labels = vec![0u32; n];
    let raw = RawBatch {
        pixels: &vals,
        dtype: crate::format::shard::Dtype::U8,
        n,
        c: 1,
        h,
        w,
        labels: &labels,
    };
    let aug: Vec<Aug> = (0..n)
        .map(|i| Aug {
            dy: (i * 3 % 5) as u8,
            dx: (i * 2 % 5) as u8,
            flip: i % 2 == 1,
        })
        .collect();
    let (mut img, mut lab, mut t) = (be.zeros(0), be.zeros(0), be.zeros(0));
    be.load_batch(&raw, &[0.0], &[1.0], pad, &aug, &mut img, &mut lab);
    be.load_masks(&vals, false, n, h, w, pad, &aug, None, &mut t);
    let (img, t) = (be.download(&img), be.download(&t));
    let mut padded = 0;
    for (i, (&p, &v)) in img.iter().zip(&t).enumerate() {
        if v < 0.0 {
            padded += 1;
            assert_eq!(
                p, 0.0,
                "pixel {i}: padding of the image where the mask is padded"
            );
        } else {
            assert_eq!(
                (p * 255.0).round(),
                v,
                "pixel {i}: image and mask moved apart"
            );
        }
    }
    // Every sample but the centred ones reaches into the padding, and none is all padding.
    assert!(
        padded > 0 && padded < n * h * w / 2,
        "{padded} padded pixels"
    );
}
