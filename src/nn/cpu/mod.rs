//! The CPU backend: the numerical reference. rayon across samples and channels, matrixmultiply for
//! the GEMMs of convolutions (im2col) and the linear layer.
//!
//! Results are bit-for-bit deterministic whatever the thread count: work is split into fixed
//! chunks of samples, and every reduction adds the chunks' partial results in chunk order.

use super::{Aug, Backend, RawBatch};
use rayon::prelude::*;

/// Samples per work chunk: the unit of parallelism and of deterministic reduction.
const CHUNK: usize = 16;
const BN_EPS: f32 = 1e-5;
const BN_MOMENTUM: f32 = 0.1;

#[derive(Debug, Default)]
pub struct Cpu {
    loss_sum: f64,
    correct: u64,
}

/// Two per-thread scratch buffers, grown as needed and reused across calls: the im2col and GEMM
/// buffers of a chunk are tens of MB, and allocating them afresh costs page faults and zeroing
/// (measured: 13% of a training step).
fn with_scratch<R>(a: usize, b: usize, f: impl FnOnce(&mut [f32], &mut [f32]) -> R) -> R {
    use std::cell::RefCell;
    thread_local! {
        static SCRATCH: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    }
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        let (x, y) = &mut *s;
        if x.len() < a {
            x.resize(a, 0.0);
        }
        if y.len() < b {
            y.resize(b, 0.0);
        }
        f(&mut x[..a], &mut y[..b])
    })
}

/// C (m x n) = alpha * A (m x k) B (k x n) + beta * C, all row-major with the given row strides.
#[allow(clippy::too_many_arguments)]
fn gemm(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    a_rs: usize,
    a_cs: usize,
    b: &[f32],
    b_rs: usize,
    b_cs: usize,
    c: &mut [f32],
    beta: f32,
) {
    // SAFETY: callers pass slices holding the full strided extents of each matrix.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            a_rs as isize,
            a_cs as isize,
            b.as_ptr(),
            b_rs as isize,
            b_cs as isize,
            beta,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// col[(ci*9 + ky*3 + kx), s*hw + y*w + x] = x[s, ci, y+ky-1, x+kx-1] (0 outside).
fn im2col(x: &[f32], s_count: usize, cin: usize, h: usize, w: usize, col: &mut [f32]) {
    let hw = h * w;
    let cols = s_count * hw;
    for ci in 0..cin {
        for ky in 0..3 {
            for kx in 0..3 {
                let row = &mut col[(ci * 9 + ky * 3 + kx) * cols..][..cols];
                for s in 0..s_count {
                    let src = &x[(s * cin + ci) * hw..][..hw];
                    let dst = &mut row[s * hw..][..hw];
                    for y in 0..h {
                        let sy = y as isize + ky as isize - 1;
                        let drow = &mut dst[y * w..][..w];
                        if sy < 0 || sy >= h as isize {
                            drow.fill(0.0);
                            continue;
                        }
                        let srow = &src[sy as usize * w..][..w];
                        match kx {
                            0 => {
                                drow[0] = 0.0;
                                drow[1..].copy_from_slice(&srow[..w - 1]);
                            }
                            1 => drow.copy_from_slice(srow),
                            _ => {
                                drow[..w - 1].copy_from_slice(&srow[1..]);
                                drow[w - 1] = 0.0;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The adjoint of im2col: dx[s, ci, ...] += col rows.
fn col2im(col: &[f32], s_count: usize, cin: usize, h: usize, w: usize, dx: &mut [f32]) {
    let hw = h * w;
    let cols = s_count * hw;
    dx.fill(0.0);
    for ci in 0..cin {
        for ky in 0..3 {
            for kx in 0..3 {
                let row = &col[(ci * 9 + ky * 3 + kx) * cols..][..cols];
                for s in 0..s_count {
                    let src = &row[s * hw..][..hw];
                    let dst = &mut dx[(s * cin + ci) * hw..][..hw];
                    for y in 0..h {
                        let sy = y as isize + ky as isize - 1;
                        if sy < 0 || sy >= h as isize {
                            continue;
                        }
                        let srow = &src[y * w..][..w];
                        let drow = &mut dst[sy as usize * w..][..w];
                        match kx {
                            0 => drow[..w - 1]
                                .iter_mut()
                                .zip(&srow[1..])
                                .for_each(|(d, s)| *d += s),
                            1 => drow.iter_mut().zip(srow).for_each(|(d, s)| *d += s),
                            _ => drow[1..]
                                .iter_mut()
                                .zip(&srow[..w - 1])
                                .for_each(|(d, s)| *d += s),
                        }
                    }
                }
            }
        }
    }
}

/// [s, c, hw] <-> [c, s*hw]
fn nchw_to_cn(x: &[f32], s_count: usize, c: usize, hw: usize, out: &mut [f32]) {
    for s in 0..s_count {
        for ci in 0..c {
            out[ci * s_count * hw + s * hw..][..hw].copy_from_slice(&x[(s * c + ci) * hw..][..hw]);
        }
    }
}
fn cn_to_nchw(x: &[f32], s_count: usize, c: usize, hw: usize, out: &mut [f32]) {
    for s in 0..s_count {
        for ci in 0..c {
            out[(s * c + ci) * hw..][..hw].copy_from_slice(&x[ci * s_count * hw + s * hw..][..hw]);
        }
    }
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
        let max = if raw.u16 { 65535.0f32 } else { 255.0 };
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
                            let p = if raw.u16 {
                                u16::from_le_bytes([raw.pixels[2 * i], raw.pixels[2 * i + 1]])
                                    as f32
                            } else {
                                raw.pixels[i] as f32
                            };
                            (p / max - m) / sd
                        };
                        o[ci * h * w + y * w + x] = v;
                    }
                }
            }
        });
    }

    fn conv3x3(
        &mut self,
        x: &Vec<f32>,
        wt: &Vec<f32>,
        y: &mut Vec<f32>,
        n: usize,
        cin: usize,
        cout: usize,
        h: usize,
        w: usize,
    ) {
        let hw = h * w;
        y.resize(n * cout * hw, 0.0);
        y.par_chunks_mut(CHUNK * cout * hw)
            .enumerate()
            .for_each(|(ch, yc)| {
                let s_count = yc.len() / (cout * hw);
                let xs = &x[ch * CHUNK * cin * hw..][..s_count * cin * hw];
                with_scratch(cin * 9 * s_count * hw, cout * s_count * hw, |col, out| {
                    im2col(xs, s_count, cin, h, w, col);
                    gemm(
                        cout,
                        cin * 9,
                        s_count * hw,
                        wt,
                        cin * 9,
                        1,
                        col,
                        s_count * hw,
                        1,
                        out,
                        0.0,
                    );
                    cn_to_nchw(out, s_count, cout, hw, yc);
                });
            });
    }

    fn conv3x3_backward(
        &mut self,
        x: &Vec<f32>,
        wt: &Vec<f32>,
        dy: &Vec<f32>,
        dx: Option<&mut Vec<f32>>,
        dw: &mut Vec<f32>,
        n: usize,
        cin: usize,
        cout: usize,
        h: usize,
        w: usize,
    ) {
        let hw = h * w;
        let chunks = n.div_ceil(CHUNK);
        let partial: Vec<Vec<f32>> = (0..chunks)
            .into_par_iter()
            .map(|ch| {
                let s0 = ch * CHUNK;
                let s_count = CHUNK.min(n - s0);
                let xs = &x[s0 * cin * hw..][..s_count * cin * hw];
                let mut dwc = vec![0.0f32; cout * cin * 9];
                with_scratch(cin * 9 * s_count * hw, cout * s_count * hw, |col, dyc| {
                    im2col(xs, s_count, cin, h, w, col);
                    nchw_to_cn(
                        &dy[s0 * cout * hw..][..s_count * cout * hw],
                        s_count,
                        cout,
                        hw,
                        dyc,
                    );
                    // dW_chunk (cout x cin*9) = dY (cout x S*hw) . col^T (S*hw x cin*9)
                    gemm(
                        cout,
                        s_count * hw,
                        cin * 9,
                        dyc,
                        s_count * hw,
                        1,
                        col,
                        1,
                        s_count * hw,
                        &mut dwc,
                        0.0,
                    );
                });
                dwc
            })
            .collect();
        dw.resize(cout * cin * 9, 0.0);
        dw.fill(0.0);
        for p in partial {
            dw.iter_mut().zip(p).for_each(|(a, b)| *a += b);
        }
        if let Some(dx) = dx {
            dx.resize(n * cin * hw, 0.0);
            dx.par_chunks_mut(CHUNK * cin * hw)
                .enumerate()
                .for_each(|(ch, dxc)| {
                    let s0 = ch * CHUNK;
                    let s_count = dxc.len() / (cin * hw);
                    with_scratch(cin * 9 * s_count * hw, cout * s_count * hw, |dcol, dyc| {
                        nchw_to_cn(
                            &dy[s0 * cout * hw..][..s_count * cout * hw],
                            s_count,
                            cout,
                            hw,
                            dyc,
                        );
                        // dcol (cin*9 x S*hw) = W^T (cin*9 x cout) . dY (cout x S*hw)
                        gemm(
                            cin * 9,
                            cout,
                            s_count * hw,
                            wt,
                            1,
                            cin * 9,
                            dyc,
                            s_count * hw,
                            1,
                            dcol,
                            0.0,
                        );
                        col2im(dcol, s_count, cin, h, w, dxc);
                    });
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

    fn maxpool2(
        &mut self,
        x: &Vec<f32>,
        y: &mut Vec<f32>,
        arg: &mut Vec<f32>,
        n: usize,
        c: usize,
        h: usize,
        w: usize,
    ) {
        let (oh, ow) = (h / 2, w / 2);
        y.resize(n * c * oh * ow, 0.0);
        arg.resize(n * c * oh * ow, 0.0);
        y.par_chunks_mut(oh * ow)
            .zip(arg.par_chunks_mut(oh * ow))
            .enumerate()
            .for_each(|(p, (yo, ao))| {
                let xi = &x[p * h * w..][..h * w];
                for oy in 0..oh {
                    for ox in 0..ow {
                        let base = 2 * oy * w + 2 * ox;
                        let cand = [xi[base], xi[base + 1], xi[base + w], xi[base + w + 1]];
                        let mut best = 0;
                        for k in 1..4 {
                            if cand[k] > cand[best] {
                                best = k;
                            }
                        }
                        yo[oy * ow + ox] = cand[best];
                        ao[oy * ow + ox] = best as f32;
                    }
                }
            });
    }

    fn maxpool2_backward(
        &mut self,
        dy: &Vec<f32>,
        arg: &Vec<f32>,
        dx: &mut Vec<f32>,
        n: usize,
        c: usize,
        h: usize,
        w: usize,
    ) {
        let (oh, ow) = (h / 2, w / 2);
        dx.resize(n * c * h * w, 0.0);
        dx.par_chunks_mut(h * w).enumerate().for_each(|(p, d)| {
            d.fill(0.0);
            let (dyi, ai) = (
                &dy[p * oh * ow..][..oh * ow],
                &arg[p * oh * ow..][..oh * ow],
            );
            for oy in 0..oh {
                for ox in 0..ow {
                    let k = ai[oy * ow + ox] as usize;
                    d[(2 * oy + k / 2) * w + 2 * ox + k % 2] = dyi[oy * ow + ox];
                }
            }
        });
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
        gemm(n, k, m, x, k, 1, wt, 1, k, y, 1.0);
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
        gemm(n, m, k, dy, m, 1, wt, k, 1, dx, 0.0);
        dw.resize(m * k, 0.0);
        gemm(m, n, k, dy, 1, m, x, k, 1, dw, 0.0);
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
