//! The convolution's data movement on the CPU: per-thread scratch, work chunks bounded in
//! memory, im2col / col2im and the layout changes around the GEMMs (mod.rs runs them).

use super::{ConvShape, CHUNK};
use ndarray::{ArrayView2, ArrayViewMut2};

/// Two per-thread scratch buffers, grown as needed and reused across calls: the im2col and GEMM
/// buffers of a chunk are tens of MB, and allocating them afresh costs page faults and zeroing
/// (measured: 13% of a training step).
pub(super) fn with_scratch<R>(
    a: usize,
    b: usize,
    f: impl FnOnce(&mut [f32], &mut [f32]) -> R,
) -> R {
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

/// The front of `v` as a row-major rows x cols matrix (ndarray hands products of these views,
/// transposed or not, to matrixmultiply's sgemm with their strides).
pub(super) fn mat(v: &[f32], rows: usize, cols: usize) -> ArrayView2<'_, f32> {
    ArrayView2::from_shape((rows, cols), &v[..rows * cols]).expect("the slice holds the matrix")
}
pub(super) fn mat_mut(v: &mut [f32], rows: usize, cols: usize) -> ArrayViewMut2<'_, f32> {
    ArrayViewMut2::from_shape((rows, cols), &mut v[..rows * cols])
        .expect("the slice holds the matrix")
}

/// Most floats one im2col or GEMM scratch buffer of a work chunk may hold: `CHUNK` samples of
/// images up to about 32x32 fit in 5 MiB and chunk as they always did (the same bits as before
/// chunks were bounded); anything larger works in chunks of at most 1 MiB, which bounds what
/// each thread holds whatever the image size.
pub(super) const SCRATCH_FLOATS: usize = 5 << 18;
pub(super) const SCRATCH_FLOATS_LARGE: usize = 1 << 18;

/// A convolution's work chunk: samples `s0..s0 + ns`, output rows `r0..r1` of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Chunk {
    pub(super) s0: usize,
    pub(super) ns: usize,
    pub(super) r0: usize,
    pub(super) r1: usize,
}

impl Chunk {
    pub(super) fn cols(&self, ow: usize) -> usize {
        self.ns * (self.r1 - self.r0) * ow
    }
}

/// The chunks of a convolution, grouped by the samples they cover: `CHUNK` whole samples when
/// their scratch fits `SCRATCH_FLOATS` (so small images chunk as they always did, and give the
/// same bits), else fewer samples, else bands of output rows of one sample.
pub(super) fn chunks(s: &ConvShape) -> Vec<Vec<Chunk>> {
    let (oh, ow) = (s.oh(), s.ow());
    let row = (s.cin * s.k * s.k).max(s.cout) * ow;
    let per_sample = row * oh;
    let budget = if CHUNK * per_sample <= SCRATCH_FLOATS {
        SCRATCH_FLOATS
    } else {
        SCRATCH_FLOATS_LARGE
    };
    let samples = (budget / per_sample.max(1)).clamp(1, CHUNK);
    let rows = if per_sample <= budget {
        oh
    } else {
        (budget / row.max(1)).clamp(1, oh)
    };
    (0..s.n)
        .step_by(samples)
        .map(|s0| {
            let ns = samples.min(s.n - s0);
            (0..oh)
                .step_by(rows)
                .map(|r0| Chunk {
                    s0,
                    ns,
                    r0,
                    r1: (r0 + rows).min(oh),
                })
                .collect()
        })
        .collect()
}

/// The output columns `lo..hi` whose input column ox*stride + kx - pad lies inside the image.
pub(super) fn inside_columns(s: &ConvShape, kx: usize) -> (usize, usize) {
    let ow = s.ow();
    let lo = s.pad.saturating_sub(kx).div_ceil(s.stride).min(ow);
    let hi = (s.w + s.pad)
        .saturating_sub(kx)
        .div_ceil(s.stride)
        .clamp(lo, ow);
    (lo, hi)
}

/// col[(ci*k*k + ky*k + kx), column] = x[s, ci, oy*stride + ky - pad, ox*stride + kx - pad]
/// (0 outside), one column per output pixel of the chunk, samples then rows then columns.
pub(super) fn im2col(x: &[f32], s: &ConvShape, ch: &Chunk, col: &mut [f32]) {
    let (h, w, k, st) = (s.h, s.w, s.k, s.stride);
    let (oh_rows, ow) = (ch.r1 - ch.r0, s.ow());
    let cols = ch.cols(ow);
    for ci in 0..s.cin {
        for ky in 0..k {
            for kx in 0..k {
                let row = &mut col[((ci * k + ky) * k + kx) * cols..][..cols];
                let (lo, hi) = inside_columns(s, kx);
                for si in 0..ch.ns {
                    let src = &x[((ch.s0 + si) * s.cin + ci) * h * w..][..h * w];
                    for oy in ch.r0..ch.r1 {
                        let dst = &mut row[(si * oh_rows + oy - ch.r0) * ow..][..ow];
                        let iy = (oy * st + ky) as isize - s.pad as isize;
                        if iy < 0 || iy >= h as isize {
                            dst.fill(0.0);
                            continue;
                        }
                        let srow = &src[iy as usize * w..][..w];
                        dst[..lo].fill(0.0);
                        dst[hi..].fill(0.0);
                        let ix0 = lo * st + kx - s.pad;
                        if st == 1 {
                            dst[lo..hi].copy_from_slice(&srow[ix0..ix0 + hi - lo]);
                        } else {
                            for (j, d) in dst[lo..hi].iter_mut().enumerate() {
                                *d = srow[ix0 + j * st];
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The adjoint of im2col: dx (the chunk's samples, from their first) += col rows.
pub(super) fn col2im(col: &[f32], s: &ConvShape, ch: &Chunk, dx: &mut [f32]) {
    let (h, w, k, st) = (s.h, s.w, s.k, s.stride);
    let (oh_rows, ow) = (ch.r1 - ch.r0, s.ow());
    let cols = ch.cols(ow);
    for ci in 0..s.cin {
        for ky in 0..k {
            for kx in 0..k {
                let row = &col[((ci * k + ky) * k + kx) * cols..][..cols];
                let (lo, hi) = inside_columns(s, kx);
                for si in 0..ch.ns {
                    let dst = &mut dx[(si * s.cin + ci) * h * w..][..h * w];
                    for oy in ch.r0..ch.r1 {
                        let iy = (oy * st + ky) as isize - s.pad as isize;
                        if iy < 0 || iy >= h as isize || lo == hi {
                            continue;
                        }
                        let srow = &row[(si * oh_rows + oy - ch.r0) * ow..][..ow];
                        let drow = &mut dst[iy as usize * w..][..w];
                        let ix0 = lo * st + kx - s.pad;
                        if st == 1 {
                            drow[ix0..ix0 + hi - lo]
                                .iter_mut()
                                .zip(&srow[lo..hi])
                                .for_each(|(d, v)| *d += v);
                        } else {
                            for (j, v) in srow[lo..hi].iter().enumerate() {
                                drow[ix0 + j * st] += v;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The chunk's part of y [n, c, oh*ow] <-> [c, chunk columns].
pub(super) fn nchw_to_cn(x: &[f32], c: usize, ohw: usize, ow: usize, ch: &Chunk, out: &mut [f32]) {
    let band = (ch.r1 - ch.r0) * ow;
    let cols = ch.ns * band;
    for si in 0..ch.ns {
        for ci in 0..c {
            out[ci * cols + si * band..][..band]
                .copy_from_slice(&x[((ch.s0 + si) * c + ci) * ohw + ch.r0 * ow..][..band]);
        }
    }
}
/// Writes into `y`, which holds the chunk's samples from their first.
pub(super) fn cn_to_nchw(x: &[f32], c: usize, ohw: usize, ow: usize, ch: &Chunk, y: &mut [f32]) {
    let band = (ch.r1 - ch.r0) * ow;
    let cols = ch.ns * band;
    for si in 0..ch.ns {
        for ci in 0..c {
            y[(si * c + ci) * ohw + ch.r0 * ow..][..band]
                .copy_from_slice(&x[ci * cols + si * band..][..band]);
        }
    }
}
