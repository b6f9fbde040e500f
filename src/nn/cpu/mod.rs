//! The CPU backend: the numerical reference. rayon across samples and channels, ndarray matrix
//! views (matrixmultiply underneath) for the GEMMs of convolutions (im2col) and the linear layer.
//!
//! Results are bit-for-bit deterministic whatever the thread count: work is split into fixed
//! chunks of samples, and every reduction adds the chunks' partial results in chunk order.

mod im2col;
mod losses;

use im2col::*;

use super::{Aug, Backend, ConvShape, PoolShape, RawBatch};
use ndarray::linalg::general_mat_mul;
use rayon::prelude::*;

// The U-Net's layers.
mod layers;

/// Samples per work chunk: the unit of parallelism and of deterministic reduction.
const CHUNK: usize = 16;
const BN_EPS: f32 = 1e-5;
const BN_MOMENTUM: f32 = 0.1;

#[derive(Debug, Default)]
pub struct Cpu {
    loss_sum: f64,
    correct: u64,
    /// `seg_score`'s counters (losses.rs).
    seg_counts: Vec<u64>,
}

/// Per-channel sums of `f(sample, channel)` over the batch, in f64, reduced in a fixed order.
fn channel_sums(
    n: usize,
    c: usize,
    f: impl Fn(usize, usize) -> (f64, f64) + Sync,
) -> Vec<(f64, f64)> {
    let parts: Vec<Vec<(f64, f64)>> = (0..n.div_ceil(CHUNK))
        .into_par_iter()
        .map(|ch| {
            let mut acc = vec![(0.0, 0.0); c];
            for s in ch * CHUNK..((ch + 1) * CHUNK).min(n) {
                for (ci, a) in acc.iter_mut().enumerate() {
                    let (p, q) = f(s, ci);
                    a.0 += p;
                    a.1 += q;
                }
            }
            acc
        })
        .collect();
    let mut total = vec![(0.0, 0.0); c];
    for p in parts {
        for (t, v) in total.iter_mut().zip(p) {
            t.0 += v.0;
            t.1 += v.1;
        }
    }
    total
}

impl Backend for Cpu {
    type Buf = Vec<f32>;

    fn zeros(&mut self, len: usize) -> Vec<f32> {
        vec![0.0; len]
    }
    fn upload(&mut self, data: &[f32]) -> Vec<f32> {
        data.to_vec()
    }
    fn download(&mut self, b: &Vec<f32>) -> Vec<f32> {
        b.clone()
    }

    fn load_batch(
        &mut self,
        raw: &RawBatch,
        mean: &[f32],
        std: &[f32],
        pad: usize,
        aug: &[Aug],
        out: &mut Vec<f32>,
        labels: &mut Vec<f32>,
    ) {
        labels.clear();
        labels.extend(raw.labels.iter().map(|&l| l as f32));
        let (c, h, w) = (raw.c, raw.h, raw.w);
        let per = c * h * w;
        out.resize(raw.n * per, 0.0);
        // 1 for floats: their values are normalised as they are.
        let max = raw.dtype.divisor() as f32;
        out.par_chunks_mut(per).enumerate().for_each(|(s, o)| {
            let a = aug.get(s).copied().unwrap_or(Aug {
                dy: pad as u8,
                dx: pad as u8,
                flip: false,
            });
            for ci in 0..c {
                let (m, sd) = (mean[ci], std[ci]);
                for y in 0..h {
                    let sy = y as isize + a.dy as isize - pad as isize;
                    for x in 0..w {
                        let xx = if a.flip { w - 1 - x } else { x };
                        let sx = xx as isize + a.dx as isize - pad as isize;
                        let v = if sy < 0 || sy >= h as isize || sx < 0 || sx >= w as isize {
                            0.0
                        } else {
                            let i = s * per + ci * h * w + sy as usize * w + sx as usize;
                            (raw.dtype.get(raw.pixels, i) / max - m) / sd
                        };
                        o[ci * h * w + y * w + x] = v;
                    }
                }
            }
        });
    }

    fn conv(&mut self, x: &Vec<f32>, wt: &Vec<f32>, y: &mut Vec<f32>, s: &ConvShape) {
        let (ohw, ow) = (s.oh() * s.ow(), s.ow());
        let kk = s.cin * s.k * s.k;
        y.resize(s.n * s.cout * ohw, 0.0);
        let groups = chunks(s);
        let per = groups[0][0].ns * s.cout * ohw;
        y.par_chunks_mut(per)
            .zip(groups.par_iter())
            .for_each(|(yc, group)| {
                for ch in group {
                    let cols = ch.cols(ow);
                    with_scratch(kk * cols, s.cout * cols, |col, out| {
                        im2col(x, s, ch, col);
                        let (w, c) = (mat(wt, s.cout, kk), mat(col, kk, cols));
                        general_mat_mul(1.0, &w, &c, 0.0, &mut mat_mut(out, s.cout, cols));
                        cn_to_nchw(out, s.cout, ohw, ow, ch, yc);
                    });
                }
            });
    }

    fn conv_backward(
        &mut self,
        x: &Vec<f32>,
        wt: &Vec<f32>,
        dy: &Vec<f32>,
        dx: Option<&mut Vec<f32>>,
        dw: &mut Vec<f32>,
        s: &ConvShape,
    ) {
        let (ohw, ow) = (s.oh() * s.ow(), s.ow());
        let kk = s.cin * s.k * s.k;
        let groups = chunks(s);
        let all: Vec<Chunk> = groups.iter().flatten().copied().collect();
        dw.resize(s.cout * kk, 0.0);
        dw.fill(0.0);
        // Each chunk's dW, added in chunk order (deterministic whatever the thread count); a
        // few chunks at a time, so that their partial sums stay few. The partial buffers are
        // this thread's, made once per call: buffers a worker allocated and this thread freed
        // stayed with the worker's heap, about 16 MB more peak RSS per thread (BENCHMARKS.md).
        let mut partial = vec![vec![0.0f32; s.cout * kk]; all.len().min(8)];
        for part in all.chunks(8) {
            part.par_iter()
                .zip(partial.par_iter_mut())
                .for_each(|(ch, dwc)| {
                    let cols = ch.cols(ow);
                    with_scratch(kk * cols, s.cout * cols, |col, dyc| {
                        im2col(x, s, ch, col);
                        nchw_to_cn(dy, s.cout, ohw, ow, ch, dyc);
                        // dW_chunk (cout x kk) = dY (cout x cols) . col^T (cols x kk)
                        let (d, c) = (mat(dyc, s.cout, cols), mat(col, kk, cols));
                        general_mat_mul(1.0, &d, &c.t(), 0.0, &mut mat_mut(dwc, s.cout, kk));
                    });
                });
            for p in &partial[..part.len()] {
                dw.iter_mut().zip(p).for_each(|(a, b)| *a += b);
            }
        }
        if let Some(dx) = dx {
            let per_x = s.cin * s.h * s.w;
            dx.resize(s.n * per_x, 0.0);
            dx.par_chunks_mut(groups[0][0].ns * per_x)
                .zip(groups.par_iter())
                .for_each(|(dxc, group)| {
                    dxc.fill(0.0);
                    for ch in group {
                        let cols = ch.cols(ow);
                        with_scratch(kk * cols, s.cout * cols, |dcol, dyc| {
                            nchw_to_cn(dy, s.cout, ohw, ow, ch, dyc);
                            // dcol (kk x cols) = W^T (kk x cout) . dY (cout x cols)
                            let (w, d) = (mat(wt, s.cout, kk), mat(dyc, s.cout, cols));
                            general_mat_mul(1.0, &w.t(), &d, 0.0, &mut mat_mut(dcol, kk, cols));
                            col2im(dcol, s, ch, dxc);
                        });
                    }
                });
        }
    }

    fn bn_train(
        &mut self,
        x: &Vec<f32>,
        gamma: &Vec<f32>,
        beta: &Vec<f32>,
        y: &mut Vec<f32>,
        saved_mean: &mut Vec<f32>,
        saved_invstd: &mut Vec<f32>,
        running_mean: &mut Vec<f32>,
        running_var: &mut Vec<f32>,
        n: usize,
        c: usize,
        hw: usize,
        relu: bool,
    ) {
        let sums = channel_sums(n, c, |s, ci| {
            let v = &x[(s * c + ci) * hw..][..hw];
            let (mut p, mut q) = (0.0f64, 0.0f64);
            for &e in v {
                p += e as f64;
                q += (e as f64) * (e as f64);
            }
            (p, q)
        });
        let count = (n * hw) as f64;
        saved_mean.resize(c, 0.0);
        saved_invstd.resize(c, 0.0);
        for ci in 0..c {
            let m = sums[ci].0 / count;
            let var = (sums[ci].1 / count - m * m).max(0.0);
            saved_mean[ci] = m as f32;
            saved_invstd[ci] = (1.0 / (var + BN_EPS as f64).sqrt()) as f32;
            let unbiased = if count > 1.0 {
                var * count / (count - 1.0)
            } else {
                var
            };
            running_mean[ci] = (1.0 - BN_MOMENTUM) * running_mean[ci] + BN_MOMENTUM * m as f32;
            running_var[ci] = (1.0 - BN_MOMENTUM) * running_var[ci] + BN_MOMENTUM * unbiased as f32;
        }
        y.resize(x.len(), 0.0);
        let (sm, si) = (&*saved_mean, &*saved_invstd);
        y.par_chunks_mut(hw)
            .zip(x.par_chunks(hw))
            .enumerate()
            .for_each(|(i, (yo, xi))| {
                let ci = i % c;
                let (a, b) = (gamma[ci] * si[ci], beta[ci] - gamma[ci] * si[ci] * sm[ci]);
                yo.iter_mut().zip(xi).for_each(|(o, &v)| *o = v * a + b);
            });
        if relu {
            self.relu(y);
        }
    }

    fn bn_eval(
        &mut self,
        x: &Vec<f32>,
        gamma: &Vec<f32>,
        beta: &Vec<f32>,
        running_mean: &Vec<f32>,
        running_var: &Vec<f32>,
        y: &mut Vec<f32>,
        _n: usize,
        c: usize,
        hw: usize,
        relu: bool,
    ) {
        y.resize(x.len(), 0.0);
        y.par_chunks_mut(hw)
            .zip(x.par_chunks(hw))
            .enumerate()
            .for_each(|(i, (yo, xi))| {
                let ci = i % c;
                let inv = 1.0 / (running_var[ci] + BN_EPS).sqrt();
                let (a, b) = (
                    gamma[ci] * inv,
                    beta[ci] - gamma[ci] * inv * running_mean[ci],
                );
                yo.iter_mut().zip(xi).for_each(|(o, &v)| *o = v * a + b);
            });
        if relu {
            self.relu(y);
        }
    }

    fn bn_backward(
        &mut self,
        x: &Vec<f32>,
        dy: &Vec<f32>,
        gamma: &Vec<f32>,
        _beta: &Vec<f32>,
        saved_mean: &Vec<f32>,
        saved_invstd: &Vec<f32>,
        dx: &mut Vec<f32>,
        dgamma: &mut Vec<f32>,
        dbeta: &mut Vec<f32>,
        n: usize,
        c: usize,
        hw: usize,
        relu_out: Option<&Vec<f32>>,
    ) {
        // The gradient as the ReLU's backward leaves it (zero where its output is not positive),
        // read in place rather than copied.
        let dy_at = |i: usize| match relu_out {
            Some(y) if y[i] <= 0.0 => 0.0,
            _ => dy[i],
        };
        // sums of dy and dy * xhat per channel
        let sums = channel_sums(n, c, |s, ci| {
            let o = (s * c + ci) * hw;
            let (m, is) = (saved_mean[ci], saved_invstd[ci]);
            let (mut p, mut q) = (0.0f64, 0.0f64);
            for (j, &v) in x[o..o + hw].iter().enumerate() {
                let d = dy_at(o + j);
                p += d as f64;
                q += (d * (v - m) * is) as f64;
            }
            (p, q)
        });
        dgamma.resize(c, 0.0);
        dbeta.resize(c, 0.0);
        for ci in 0..c {
            dbeta[ci] = sums[ci].0 as f32;
            dgamma[ci] = sums[ci].1 as f32;
        }
        let count = (n * hw) as f32;
        dx.resize(x.len(), 0.0);
        dx.par_chunks_mut(hw).enumerate().for_each(|(i, dxo)| {
            let ci = i % c;
            let o = i * hw;
            let (m, is, g) = (saved_mean[ci], saved_invstd[ci], gamma[ci]);
            let (sd, sdx) = (sums[ci].0 as f32 / count, sums[ci].1 as f32 / count);
            for (j, d) in dxo.iter_mut().enumerate() {
                let xhat = (x[o + j] - m) * is;
                *d = g * is * (dy_at(o + j) - sd - xhat * sdx);
            }
        });
    }

    fn relu(&mut self, x: &mut Vec<f32>) {
        x.par_chunks_mut(1 << 14)
            .for_each(|c| c.iter_mut().for_each(|v| *v = v.max(0.0)));
    }
    fn relu_backward(&mut self, y: &Vec<f32>, dy: &mut Vec<f32>) {
        dy.par_chunks_mut(1 << 14)
            .zip(y.par_chunks(1 << 14))
            .for_each(|(d, y)| {
                d.iter_mut().zip(y).for_each(|(d, &y)| {
                    if y <= 0.0 {
                        *d = 0.0
                    }
                })
            });
    }

    fn maxpool(&mut self, x: &Vec<f32>, y: &mut Vec<f32>, arg: &mut Vec<f32>, s: &PoolShape) {
        let (h, w, k, st) = (s.h, s.w, s.k, s.stride);
        let (oh, ow) = (s.oh(), s.ow());
        y.resize(s.n * s.c * oh * ow, 0.0);
        arg.resize(y.len(), 0.0);
        y.par_chunks_mut(oh * ow)
            .zip(arg.par_chunks_mut(oh * ow))
            .enumerate()
            .for_each(|(p, (yo, ao))| {
                let xi = &x[p * h * w..][..h * w];
                for oy in 0..oh {
                    for ox in 0..ow {
                        // The first in-image element, then any strictly greater one.
                        let mut best: Option<(f32, usize)> = None;
                        for ky in 0..k {
                            let iy = (oy * st + ky) as isize - s.pad as isize;
                            if iy < 0 || iy >= h as isize {
                                continue;
                            }
                            for kx in 0..k {
                                let ix = (ox * st + kx) as isize - s.pad as isize;
                                if ix < 0 || ix >= w as isize {
                                    continue;
                                }
                                let v = xi[iy as usize * w + ix as usize];
                                if best.is_none_or(|b| v > b.0) {
                                    best = Some((v, ky * k + kx));
                                }
                            }
                        }
                        let (v, a) = best.unwrap_or((0.0, 0));
                        yo[oy * ow + ox] = v;
                        ao[oy * ow + ox] = a as f32;
                    }
                }
            });
    }

    fn maxpool_backward(
        &mut self,
        dy: &Vec<f32>,
        arg: &Vec<f32>,
        dx: &mut Vec<f32>,
        s: &PoolShape,
    ) {
        let (h, w, k, st, pad) = (s.h, s.w, s.k, s.stride, s.pad);
        let (oh, ow) = (s.oh(), s.ow());
        // The outputs whose window holds input position i (along one axis).
        let range = |i: usize, o: usize| {
            let lo = (i + pad + 1).saturating_sub(k).div_ceil(st);
            let hi = ((i + pad) / st + 1).min(o);
            lo..hi.max(lo)
        };
        dx.resize(s.n * s.c * h * w, 0.0);
        dx.par_chunks_mut(h * w).enumerate().for_each(|(p, d)| {
            let (dyi, ai) = (
                &dy[p * oh * ow..][..oh * ow],
                &arg[p * oh * ow..][..oh * ow],
            );
            for iy in 0..h {
                for ix in 0..w {
                    // Gathered per input in a fixed order, as the GPU does: no write races.
                    let mut v: Option<f32> = None;
                    for oy in range(iy, oh) {
                        for ox in range(ix, ow) {
                            let o = oy * ow + ox;
                            let won = (iy + pad - oy * st) * k + ix + pad - ox * st;
                            if ai[o] as usize == won {
                                v = Some(v.map_or(dyi[o], |a| a + dyi[o]));
                            }
                        }
                    }
                    d[iy * w + ix] = v.unwrap_or(0.0);
                }
            }
        });
    }

    fn add(&mut self, a: &Vec<f32>, b: &Vec<f32>, y: &mut Vec<f32>, relu: bool) {
        y.resize(a.len(), 0.0);
        y.par_chunks_mut(1 << 14)
            .zip(a.par_chunks(1 << 14).zip(b.par_chunks(1 << 14)))
            .for_each(|(y, (a, b))| {
                for ((y, &a), &b) in y.iter_mut().zip(a).zip(b) {
                    let v = a + b;
                    *y = if relu { v.max(0.0) } else { v };
                }
            });
    }

    fn accumulate(&mut self, dst: &mut Vec<f32>, src: &Vec<f32>) {
        dst.par_chunks_mut(1 << 14)
            .zip(src.par_chunks(1 << 14))
            .for_each(|(d, s)| d.iter_mut().zip(s).for_each(|(d, s)| *d += s));
    }

    fn copy(&mut self, src: &Vec<f32>, dst: &mut Vec<f32>) {
        dst.clone_from(src);
    }

    fn gap(&mut self, x: &Vec<f32>, y: &mut Vec<f32>, n: usize, c: usize, hw: usize) {
        y.resize(n * c, 0.0);
        y.par_iter_mut().enumerate().for_each(|(i, o)| {
            *o = (x[i * hw..][..hw].iter().map(|&v| v as f64).sum::<f64>() / hw as f64) as f32;
        });
    }
    fn gap_backward(&mut self, dy: &Vec<f32>, dx: &mut Vec<f32>, n: usize, c: usize, hw: usize) {
        dx.resize(n * c * hw, 0.0);
        dx.par_chunks_mut(hw)
            .enumerate()
            .for_each(|(i, d)| d.fill(dy[i] / hw as f32));
    }

    // The U-Net's layers (layers.rs).
    fn concat(
        &mut self,
        a: &Vec<f32>,
        b: &Vec<f32>,
        y: &mut Vec<f32>,
        n: usize,
        ca: usize,
        cb: usize,
        hw: usize,
    ) {
        layers::concat(a, b, y, n, ca, cb, hw)
    }
    fn concat_backward(
        &mut self,
        dy: &Vec<f32>,
        da: Option<&mut Vec<f32>>,
        db: Option<&mut Vec<f32>>,
        n: usize,
        ca: usize,
        cb: usize,
        hw: usize,
    ) {
        layers::concat_backward(dy, da, db, n, ca, cb, hw)
    }
    fn upsample(
        &mut self,
        x: &Vec<f32>,
        y: &mut Vec<f32>,
        n: usize,
        c: usize,
        h: usize,
        w: usize,
        oh: usize,
        ow: usize,
    ) {
        layers::upsample(x, y, n, c, h, w, oh, ow)
    }
    fn upsample_backward(
        &mut self,
        dy: &Vec<f32>,
        dx: &mut Vec<f32>,
        n: usize,
        c: usize,
        h: usize,
        w: usize,
        oh: usize,
        ow: usize,
    ) {
        layers::upsample_backward(dy, dx, n, c, h, w, oh, ow)
    }
    fn bias(
        &mut self,
        x: &Vec<f32>,
        b: &Vec<f32>,
        y: &mut Vec<f32>,
        n: usize,
        c: usize,
        hw: usize,
    ) {
        layers::bias(x, b, y, n, c, hw)
    }
    fn bias_backward(&mut self, dy: &Vec<f32>, db: &mut Vec<f32>, n: usize, c: usize, hw: usize) {
        layers::bias_backward(dy, db, n, c, hw)
    }

    fn linear(
        &mut self,
        x: &Vec<f32>,
        wt: &Vec<f32>,
        b: &Vec<f32>,
        y: &mut Vec<f32>,
        n: usize,
        k: usize,
        m: usize,
    ) {
        y.resize(n * m, 0.0);
        for r in 0..n {
            y[r * m..][..m].copy_from_slice(b);
        }
        general_mat_mul(
            1.0,
            &mat(x, n, k),
            &mat(wt, m, k).t(),
            1.0,
            &mut mat_mut(y, n, m),
        );
    }

    fn linear_backward(
        &mut self,
        x: &Vec<f32>,
        wt: &Vec<f32>,
        dy: &Vec<f32>,
        dx: &mut Vec<f32>,
        dw: &mut Vec<f32>,
        db: &mut Vec<f32>,
        n: usize,
        k: usize,
        m: usize,
    ) {
        dx.resize(n * k, 0.0);
        general_mat_mul(
            1.0,
            &mat(dy, n, m),
            &mat(wt, m, k),
            0.0,
            &mut mat_mut(dx, n, k),
        );
        dw.resize(m * k, 0.0);
        general_mat_mul(
            1.0,
            &mat(dy, n, m).t(),
            &mat(x, n, k),
            0.0,
            &mut mat_mut(dw, m, k),
        );
        db.resize(m, 0.0);
        for j in 0..m {
            db[j] = (0..n).map(|r| dy[r * m + j] as f64).sum::<f64>() as f32;
        }
    }

    fn softmax_xent(
        &mut self,
        logits: &Vec<f32>,
        labels: &Vec<f32>,
        smoothing: f32,
        dlogits: &mut Vec<f32>,
        n: usize,
        k: usize,
    ) {
        dlogits.resize(n * k, 0.0);
        let per: Vec<(f64, bool)> = dlogits
            .par_chunks_mut(k)
            .enumerate()
            .map(|(r, d)| {
                let z = &logits[r * k..][..k];
                let mx = z.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let sum: f64 = z.iter().map(|&v| ((v - mx) as f64).exp()).sum();
                let lse = mx as f64 + sum.ln();
                let y = labels[r] as usize;
                let off = smoothing as f64 / k as f64;
                let mut loss = 0.0;
                for j in 0..k {
                    let q = off + if j == y { 1.0 - smoothing as f64 } else { 0.0 };
                    let logp = z[j] as f64 - lse;
                    loss -= q * logp;
                    d[j] = ((logp.exp() - q) / n as f64) as f32;
                }
                let pred = (0..k).fold(0, |b, j| if z[j] > z[b] { j } else { b });
                (loss, pred == y)
            })
            .collect();
        self.loss_sum += per.iter().map(|p| p.0).sum::<f64>();
        self.correct += per.iter().filter(|p| p.1).count() as u64;
    }

    // The mask, labels and values tasks (losses.rs).
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
        out: &mut Vec<f32>,
    ) {
        losses::load_masks(raw, wide, n, h, w, pad, aug, ignore, out)
    }
    fn load_targets(&mut self, values: &[f32], out: &mut Vec<f32>) {
        losses::load_targets(values, out)
    }
    fn seg_loss(
        &mut self,
        logits: &Vec<f32>,
        targets: &Vec<f32>,
        dice: f32,
        dlogits: &mut Vec<f32>,
        n: usize,
        k: usize,
        hw: usize,
    ) {
        losses::seg_loss(self, logits, targets, dice, dlogits, n, k, hw)
    }
    fn seg_score(&mut self, logits: &Vec<f32>, targets: &Vec<f32>, n: usize, k: usize, hw: usize) {
        losses::seg_score(self, logits, targets, n, k, hw)
    }
    fn take_seg_counts(&mut self, k: usize) -> Vec<u64> {
        losses::take_seg_counts(self, k)
    }
    fn bce_logits(
        &mut self,
        logits: &Vec<f32>,
        targets: &Vec<f32>,
        dlogits: &mut Vec<f32>,
        n: usize,
        k: usize,
    ) {
        losses::bce_logits(self, logits, targets, dlogits, n, k)
    }
    fn regression_loss(
        &mut self,
        pred: &Vec<f32>,
        targets: &Vec<f32>,
        smooth_l1: bool,
        dpred: &mut Vec<f32>,
        n: usize,
        k: usize,
    ) {
        losses::regression_loss(self, pred, targets, smooth_l1, dpred, n, k)
    }

    fn take_loss_stats(&mut self) -> (f64, u64) {
        let r = (self.loss_sum, self.correct);
        (self.loss_sum, self.correct) = (0.0, 0);
        r
    }

    fn argmax(&mut self, logits: &Vec<f32>, n: usize, k: usize) -> Vec<u32> {
        (0..n)
            .map(|r| {
                let z = &logits[r * k..][..k];
                (0..k).fold(0, |b, j| if z[j] > z[b] { j } else { b }) as u32
            })
            .collect()
    }

    fn sgd_step(
        &mut self,
        w: &mut Vec<f32>,
        g: &Vec<f32>,
        v: &mut Vec<f32>,
        lr: f32,
        momentum: f32,
        wd: f32,
    ) {
        w.par_chunks_mut(4096)
            .zip(v.par_chunks_mut(4096))
            .zip(g.par_chunks(4096))
            .for_each(|((w, v), g)| {
                for ((w, v), &g) in w.iter_mut().zip(v.iter_mut()).zip(g) {
                    let d = g + wd * *w;
                    *v = momentum * *v + d;
                    *w -= lr * (d + momentum * *v);
                }
            });
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_op_matches_finite_differences() {
        crate::nn::gradcheck::check_ops(&mut super::Cpu::default());
    }

    #[test]
    fn whole_model_matches_finite_differences() {
        crate::nn::gradcheck::check_model(&mut super::Cpu::default());
    }
}
