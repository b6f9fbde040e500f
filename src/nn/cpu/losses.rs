//! The CPU reference of the mask, labels and values tasks: their targets (`load_masks`,
//! `load_targets`) and losses (`seg_loss`, `seg_score`, `bce_logits`, `regression_loss`); the
//! `Backend` methods of `Cpu` delegate here.
//!
//! Every value is computed in f64 and written as f32. Sums are taken per sample and added in
//! sample order, so the results are the same bits whatever the thread count.

use super::Cpu;
use crate::nn::Aug;
use rayon::prelude::*;

/// Dice's smoothing term: an absent class predicted absent scores 1, not 0/0.
pub(crate) const DICE_EPS: f64 = 1.0;

/// The class of a target value if the pixel counts: -1 (ignored), NaN and anything outside
/// 0..k do not (the GPU tests the same, in f32).
pub(crate) fn class_of(t: f32, k: usize) -> Option<usize> {
    (t >= 0.0 && t < k as f32).then_some(t as usize)
}

/// Index of the largest of `k` values read by `z`, the first on ties (as `argmax`).
fn argmax_by(k: usize, z: impl Fn(usize) -> f32) -> usize {
    (1..k).fold(0, |b, j| if z(j) > z(b) { j } else { b })
}

#[allow(clippy::too_many_arguments)]
pub(super) fn load_masks(
    raw: &[u8],
    wide: bool,
    n: usize,
    h: usize,
    w: usize,
    pad: usize,
    aug: &[Aug],
    ignore: Option<u32>,
    out: &mut Vec<f32>,
) {
    let per = h * w;
    let size = if wide { 2 } else { 1 };
    assert!(
        raw.len() >= n * per * size,
        "load_masks: {} bytes for {n} masks of {h}x{w} ({size} bytes a value)",
        raw.len()
    );
    out.resize(n * per, 0.0);
    let value = |i: usize| -> u32 {
        if wide {
            u16::from_le_bytes([raw[2 * i], raw[2 * i + 1]]) as u32
        } else {
            raw[i] as u32
        }
    };
    out.par_chunks_mut(per.max(1))
        .enumerate()
        .for_each(|(s, o)| {
            let a = aug.get(s).copied().unwrap_or(Aug {
                dy: pad as u8,
                dx: pad as u8,
                flip: false,
            });
            // The same source pixel as `load_batch` takes for the image's pixel (y, x).
            for y in 0..h {
                let sy = y as isize + a.dy as isize - pad as isize;
                for x in 0..w {
                    let xx = if a.flip { w - 1 - x } else { x };
                    let sx = xx as isize + a.dx as isize - pad as isize;
                    let inside = sy >= 0 && sy < h as isize && sx >= 0 && sx < w as isize;
                    o[y * w + x] = if inside {
                        let v = value(s * per + sy as usize * w + sx as usize);
                        if ignore == Some(v) {
                            -1.0
                        } else {
                            v as f32
                        }
                    } else {
                        -1.0
                    };
                }
            }
        });
}

pub(super) fn load_targets(values: &[f32], out: &mut Vec<f32>) {
    out.clear();
    out.extend_from_slice(values);
}

/// One sample's (or the batch's) sums for the segmentation loss.
#[derive(Debug, Clone)]
struct SegSums {
    /// Per class: sum of p_c over pixels of class c (sum p_c g_c), sum of p_c, pixels of c.
    inter: Vec<f64>,
    prob: Vec<f64>,
    truth: Vec<f64>,
    /// Sum of the per-pixel cross-entropies, counted pixels, correctly classified ones.
    ce: f64,
    counted: u64,
    correct: u64,
}

impl SegSums {
    fn new(k: usize) -> Self {
        SegSums {
            inter: vec![0.0; k],
            prob: vec![0.0; k],
            truth: vec![0.0; k],
            ce: 0.0,
            counted: 0,
            correct: 0,
        }
    }
    fn add(&mut self, o: &SegSums) {
        for (a, b) in [
            (&mut self.inter, &o.inter),
            (&mut self.prob, &o.prob),
            (&mut self.truth, &o.truth),
        ] {
            a.iter_mut().zip(b).for_each(|(a, b)| *a += b);
        }
        self.ce += o.ce;
        self.counted += o.counted;
        self.correct += o.correct;
    }
    /// Soft Dice of class c.
    fn dice(&self, c: usize) -> f64 {
        (2.0 * self.inter[c] + DICE_EPS) / (self.prob[c] + self.truth[c] + DICE_EPS)
    }
}

/// Softmax of pixel p of sample s of logits [n, k, hw] into `prob`; returns (log-sum-exp,
/// argmax).
fn softmax_at(
    logits: &[f32],
    s: usize,
    p: usize,
    k: usize,
    hw: usize,
    prob: &mut [f64],
) -> (f64, usize) {
    let z = |c: usize| logits[(s * k + c) * hw + p];
    let mx = (0..k).map(z).fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = (0..k).map(|c| (z(c) as f64 - mx).exp()).sum();
    let lse = mx + sum.ln();
    for (c, q) in prob.iter_mut().enumerate() {
        *q = (z(c) as f64 - lse).exp();
    }
    (lse, argmax_by(k, z))
}

fn check_seg(logits: &[f32], targets: &[f32], n: usize, k: usize, hw: usize, what: &str) {
    assert!(k >= 1, "{what}: no classes");
    assert!(
        logits.len() >= n * k * hw && targets.len() >= n * hw,
        "{what}: {} logits and {} targets for {n}x{k}x{hw}",
        logits.len(),
        targets.len()
    );
}

#[allow(clippy::too_many_arguments)]
pub(super) fn seg_loss(
    cpu: &mut Cpu,
    logits: &[f32],
    targets: &[f32],
    dice: f32,
    dlogits: &mut Vec<f32>,
    n: usize,
    k: usize,
    hw: usize,
) {
    check_seg(logits, targets, n, k, hw, "seg_loss");
    let per: Vec<SegSums> = (0..n)
        .into_par_iter()
        .map(|s| {
            let mut acc = SegSums::new(k);
            let mut prob = vec![0.0; k];
            for p in 0..hw {
                let Some(y) = class_of(targets[s * hw + p], k) else {
                    continue;
                };
                let (lse, best) = softmax_at(logits, s, p, k, hw, &mut prob);
                acc.ce += lse - logits[(s * k + y) * hw + p] as f64;
                acc.counted += 1;
                acc.correct += (best == y) as u64;
                acc.inter[y] += prob[y];
                acc.truth[y] += 1.0;
                acc.prob.iter_mut().zip(&prob).for_each(|(a, q)| *a += q);
            }
            acc
        })
        .collect();
    let mut tot = SegSums::new(k);
    per.iter().for_each(|p| tot.add(p));
    let m = tot.counted as f64;
    let inv_m = if tot.counted > 0 { 1.0 / m } else { 0.0 };
    // d(loss)/d(p_c) at a pixel of class y is a[c] + (c == y) b[c]: the Dice term's derivative
    // w (D_c - 2 g_c) / U_c, w = dice / (k - 1), U_c = sum p_c + sum g_c + eps; class 0 has none.
    let w = if k > 1 {
        dice as f64 / (k - 1) as f64
    } else {
        0.0
    };
    let (mut a, mut b) = (vec![0.0; k], vec![0.0; k]);
    for c in 1..k {
        let u = tot.prob[c] + tot.truth[c] + DICE_EPS;
        a[c] = w * tot.dice(c) / u;
        b[c] = -2.0 * w / u;
    }
    dlogits.resize(n * k * hw, 0.0);
    dlogits
        .par_chunks_mut((k * hw).max(1))
        .enumerate()
        .for_each(|(s, d)| {
            let mut prob = vec![0.0; k];
            for p in 0..hw {
                let Some(y) = class_of(targets[s * hw + p], k) else {
                    (0..k).for_each(|c| d[c * hw + p] = 0.0);
                    continue;
                };
                softmax_at(logits, s, p, k, hw, &mut prob);
                let at = |c: usize| a[c] + if c == y { b[c] } else { 0.0 };
                let sum: f64 = (0..k).map(|c| prob[c] * at(c)).sum();
                for c in 0..k {
                    let g = if c == y { 1.0 } else { 0.0 };
                    d[c * hw + p] = ((prob[c] - g) * inv_m + prob[c] * (at(c) - sum)) as f32;
                }
            }
        });
    let mean_dice = if k > 1 {
        (1..k).map(|c| tot.dice(c)).sum::<f64>() / (k - 1) as f64
    } else {
        1.0
    };
    let loss = tot.ce * inv_m + dice as f64 * (1.0 - mean_dice);
    cpu.loss_sum += loss * n as f64;
    cpu.correct += tot.correct;
}

pub(super) fn seg_score(
    cpu: &mut Cpu,
    logits: &[f32],
    targets: &[f32],
    n: usize,
    k: usize,
    hw: usize,
) {
    check_seg(logits, targets, n, k, hw, "seg_score");
    let per: Vec<Vec<u64>> = (0..n)
        .into_par_iter()
        .map(|s| {
            let mut c3 = vec![0u64; 3 * k];
            for p in 0..hw {
                let Some(y) = class_of(targets[s * hw + p], k) else {
                    continue;
                };
                let best = argmax_by(k, |c| logits[(s * k + c) * hw + p]);
                if best == y {
                    c3[3 * y] += 1;
                } else {
                    c3[3 * best + 1] += 1;
                    c3[3 * y + 2] += 1;
                }
            }
            c3
        })
        .collect();
    // Counters of another class count start again (as on the GPU).
    if cpu.seg_counts.len() != 3 * k {
        cpu.seg_counts = vec![0; 3 * k];
    }
    for c3 in per {
        cpu.seg_counts.iter_mut().zip(c3).for_each(|(a, b)| *a += b);
    }
}

pub(super) fn take_seg_counts(cpu: &mut Cpu, k: usize) -> Vec<u64> {
    let out = std::mem::take(&mut cpu.seg_counts);
    // Counters of another class count are not these.
    if out.len() == 3 * k {
        out
    } else {
        vec![0; 3 * k]
    }
}

fn check_rows(x: &[f32], t: &[f32], n: usize, k: usize, what: &str) {
    assert!(
        x.len() >= n * k && t.len() >= n * k,
        "{what}: {} predictions and {} targets for {n}x{k}",
        x.len(),
        t.len()
    );
}

/// Fills `d` [n, k] with each element's gradient and returns the batch's (sum of per-sample
/// mean losses, samples right): `f(x, t)` gives an element's (loss, d loss / dx, right).
fn rowwise(
    x: &[f32],
    t: &[f32],
    d: &mut Vec<f32>,
    n: usize,
    k: usize,
    f: impl Fn(f64, f64) -> (f64, f64, bool) + Sync,
) -> (f64, u64) {
    d.resize(n * k, 0.0);
    let count = (n * k) as f64;
    let per: Vec<(f64, bool)> = d
        .par_chunks_mut(k.max(1))
        .enumerate()
        .map(|(r, d)| {
            let (mut loss, mut right) = (0.0, true);
            for j in 0..k {
                let (l, g, ok) = f(x[r * k + j] as f64, t[r * k + j] as f64);
                loss += l;
                right &= ok;
                d[j] = (g / count) as f32;
            }
            (loss / k as f64, right)
        })
        .collect();
    (
        per.iter().map(|p| p.0).sum(),
        per.iter().filter(|p| p.1).count() as u64,
    )
}

pub(super) fn bce_logits(
    cpu: &mut Cpu,
    logits: &[f32],
    targets: &[f32],
    dlogits: &mut Vec<f32>,
    n: usize,
    k: usize,
) {
    check_rows(logits, targets, n, k, "bce_logits");
    let (loss, right) = rowwise(logits, targets, dlogits, n, k, |z, y| {
        // max(z, 0) - z y + log(1 + e^-|z|): no overflow for any z.
        let l = z.max(0.0) - z * y + (-z.abs()).exp().ln_1p();
        let sig = if z >= 0.0 {
            1.0 / (1.0 + (-z).exp())
        } else {
            z.exp() / (1.0 + z.exp())
        };
        (l, sig - y, (z > 0.0) == (y > 0.5))
    });
    cpu.loss_sum += loss;
    cpu.correct += right;
}

#[allow(clippy::too_many_arguments)]
pub(super) fn regression_loss(
    cpu: &mut Cpu,
    pred: &[f32],
    targets: &[f32],
    smooth_l1: bool,
    dpred: &mut Vec<f32>,
    n: usize,
    k: usize,
) {
    check_rows(pred, targets, n, k, "regression_loss");
    let (loss, _) = rowwise(pred, targets, dpred, n, k, |x, t| {
        let e = x - t;
        if !smooth_l1 {
            (e * e, 2.0 * e, false)
        } else if e.abs() < 1.0 {
            (0.5 * e * e, e, false)
        } else {
            (e.abs() - 0.5, e.signum(), false)
        }
    });
    cpu.loss_sum += loss;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::Backend;

    #[test]
    fn the_crop_and_flip_move_image_and_mask_together() {
        crate::nn::gradcheck_losses::image_and_mask_move_together(&mut Cpu::default());
    }

    /// A 3x4 mask 0..12 (u8 and u16 well above 255), padded by 1, cropped and flipped:
    /// every output value checked by hand.
    #[test]
    fn masks_are_padded_cropped_and_flipped_as_images_are() {
        let mut c = Cpu::default();
        let (h, w) = (3, 4);
        let vals: Vec<u32> = (0..12).collect();
        let aug = [
            // Centred: the mask as it is, 5 ignored.
            Aug {
                dy: 1,
                dx: 1,
                flip: false,
            },
            // One row down and one column right of centre: the source moves +1, +1.
            Aug {
                dy: 2,
                dx: 2,
                flip: false,
            },
            // Flipped, shifted one column left.
            Aug {
                dy: 1,
                dx: 0,
                flip: true,
            },
        ];
        for wide in [false, true] {
            let off = if wide { 1000 } else { 0 };
            let raw: Vec<u8> = (0..3)
                .flat_map(|_| vals.iter().map(|v| v + off))
                .flat_map(|v| {
                    if wide {
                        (v as u16).to_le_bytes().to_vec()
                    } else {
                        vec![v as u8]
                    }
                })
                .collect();
            let mut out = vec![7.0; 5];
            c.load_masks(&raw, wide, 3, h, w, 1, &aug, Some(5 + off), &mut out);
            let o = |v: i32| if v < 0 { -1.0 } else { (v + off as i32) as f32 };
            let want: Vec<f32> = [
                // centred: 0..12 with 5 ignored
                [0, 1, 2, 3, 4, -1, 6, 7, 8, 9, 10, 11],
                // output (y, x) reads (y + 1, x + 1): rows 1, 2 then padding
                [-1, 6, 7, -1, 9, 10, 11, -1, -1, -1, -1, -1],
                // output (y, x) reads (y, 3 - x - 1): the flipped row shifted, padding last
                [2, 1, 0, -1, 6, -1, 4, -1, 10, 9, 8, -1],
            ]
            .iter()
            .flatten()
            .map(|&v| o(v))
            .collect();
            assert_eq!(out, want, "wide={wide}");
            // No augmentation: centred; without `ignore` nothing inside is ignored.
            c.load_masks(&raw, wide, 2, h, w, 0, &[], None, &mut out);
            let plain: Vec<f32> = (0..2).flat_map(|_| (0..12).map(o)).collect();
            assert_eq!(out, plain, "wide={wide} without augmentation");
        }
        let mut t = vec![9.0; 7];
        c.load_targets(&[1.5, -2.0], &mut t);
        assert_eq!(t, [1.5, -2.0]);
    }

    /// Logits far apart at each pixel's class: cross-entropy near 0, every Dice 1, counts exact.
    #[test]
    fn a_perfect_prediction_scores_dice_one_and_exact_counts() {
        let mut c = Cpu::default();
        let (n, k, hw) = (2, 3, 5);
        let t: Vec<f32> = vec![0., 1., 2., 2., -1., 1., 1., 0., 2., 7.];
        let mut z = vec![0.0; n * k * hw];
        for s in 0..n {
            for p in 0..hw {
                let y = t[s * hw + p];
                let y = if (0.0..3.0).contains(&y) {
                    y as usize
                } else {
                    1
                };
                z[(s * k + y) * hw + p] = 40.0;
            }
        }
        let mut d = vec![];
        c.seg_loss(&z, &t, 1.0, &mut d, n, k, hw);
        let (loss, right) = c.take_loss_stats();
        assert!(loss.abs() < 1e-12, "loss {loss}");
        assert_eq!(right, 8, "counted pixels all right");
        assert!(d.iter().all(|v| v.abs() < 1e-12));
        c.seg_score(&z, &t, n, k, hw);
        c.seg_score(&z, &t, n, k, hw);
        // class 0: 2 pixels, class 1: 3 (the 7 is ignored), class 2: 3; twice
        assert_eq!(c.take_seg_counts(k), [4, 0, 0, 6, 0, 0, 6, 0, 0]);
        assert_eq!(c.take_seg_counts(k), [0; 9], "counters restart");
        // Everything predicted as class 0 instead.
        let mut z0 = vec![0.0; n * k * hw];
        z0[..hw].fill(1.0);
        z0[k * hw..(k + 1) * hw].fill(1.0);
        c.seg_score(&z0, &t, n, k, hw);
        assert_eq!(c.take_seg_counts(k), [2, 6, 0, 0, 0, 3, 0, 0, 3]);
    }

    /// Equal logits: cross-entropy ln k per pixel, every p_c = 1/k; the Dice by hand.
    #[test]
    fn uniform_logits_give_the_loss_by_hand() {
        let mut c = Cpu::default();
        let (n, k, hw) = (1, 2, 4);
        let t = vec![0., 1., 1., -1.];
        let z = vec![0.3; n * k * hw];
        let mut d = vec![];
        c.seg_loss(&z, &t, 0.5, &mut d, n, k, hw);
        let (loss, right) = c.take_loss_stats();
        // Dice of class 1: (2 * 2 * 0.5 + 1) / (3 * 0.5 + 2 + 1) = 3 / 4.5
        let want = 2f64.ln() + 0.5 * (1.0 - 3.0 / 4.5);
        assert!((loss - want).abs() < 1e-12, "{loss} vs {want}");
        // ties go to class 0: the first pixel is right
        assert_eq!(right, 1);
        assert_eq!(&d[3..4], &[0.0]);
        assert_eq!(d[k * hw - 1], 0.0, "ignored pixel's gradient");
    }

    /// Nothing counted: loss 0, gradient 0, no NaN; k = 1 has no Dice term.
    #[test]
    fn an_all_ignored_batch_has_no_loss() {
        let mut c = Cpu::default();
        let (n, k, hw) = (2, 3, 3);
        let t = vec![-1.0, 3.0, f32::NAN, -1.0, -1.0, 5.0];
        let z: Vec<f32> = (0..n * k * hw).map(|i| (i as f32).sin()).collect();
        let mut d = vec![1.0; 4];
        c.seg_loss(&z, &t, 1.0, &mut d, n, k, hw);
        assert_eq!(c.take_loss_stats(), (0.0, 0));
        assert_eq!(d, vec![0.0; n * k * hw]);
        let t1 = vec![0.0; hw];
        let z1 = vec![2.0; hw];
        c.seg_loss(&z1, &t1, 1.0, &mut d, 1, 1, hw);
        assert_eq!(c.take_loss_stats(), (0.0, hw as u64));
        assert_eq!(d, vec![0.0; hw]);
    }

    /// BCE of logit 0 is ln 2 whatever the target; MSE and smooth L1 by hand.
    #[test]
    fn bce_and_regression_losses_by_hand() {
        let mut c = Cpu::default();
        let (n, k) = (2, 3);
        let t = vec![0., 1., 1., 0., 0., 1.];
        let mut d = vec![];
        c.bce_logits(&vec![0.0; n * k], &t, &mut d, n, k);
        let (loss, right) = c.take_loss_stats();
        assert!((loss - n as f64 * 2f64.ln()).abs() < 1e-12, "{loss}");
        // logit 0 predicts 0: only an all-zero row would be right
        assert_eq!(right, 0);
        let want: Vec<f32> = t.iter().map(|&y| ((0.5 - y as f64) / 6.0) as f32).collect();
        assert_eq!(d, want);
        // Large logits of the right sign: loss near 0, every sample right, no overflow.
        let z: Vec<f32> = t
            .iter()
            .map(|&y| if y > 0.5 { 500.0 } else { -500.0 })
            .collect();
        c.bce_logits(&z, &t, &mut d, n, k);
        let (loss, right) = c.take_loss_stats();
        assert!(loss < 1e-200 && right == 2, "{loss} {right}");
        let p = vec![1.0, 2.0, 3.0, 0.0, 0.0, 0.5];
        let t = vec![1.0, 0.0, 6.0, 0.0, 0.0, 0.0];
        c.regression_loss(&p, &t, false, &mut d, n, k);
        // rows: (0 + 4 + 9) / 3 and 0.25 / 3
        let (loss, _) = c.take_loss_stats();
        assert!((loss - 13.25 / 3.0).abs() < 1e-12, "{loss}");
        let want: Vec<f32> = [0.0, 4.0, -6.0, 0.0, 0.0, 1.0]
            .iter()
            .map(|v: &f64| (v / 6.0) as f32)
            .collect();
        assert_eq!(d, want);
        c.regression_loss(&p, &t, true, &mut d, n, k);
        // rows: (0 + 1.5 + 2.5) / 3 and 0.125 / 3
        let (loss, _) = c.take_loss_stats();
        assert!((loss - 4.125 / 3.0).abs() < 1e-12, "{loss}");
        let want: Vec<f32> = [0.0, 1.0, -1.0, 0.0, 0.0, 0.5]
            .iter()
            .map(|v: &f64| (v / 6.0) as f32)
            .collect();
        assert_eq!(d, want);
    }

    #[test]
    fn losses_match_finite_differences() {
        crate::nn::gradcheck_losses::check_losses(&mut Cpu::default());
    }
}
