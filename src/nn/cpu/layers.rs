//! The U-Net's layers on the CPU (the reference): channel concatenation, nearest-neighbour
//! resizing and a per-channel bias, NCHW, each with its backward. Every sum is taken in a fixed
//! order, so results do not depend on the thread count.

use rayon::prelude::*;

/// y [n, ca+cb, hw] = a [n, ca, hw] then b [n, cb, hw], sample by sample.
pub(super) fn concat(
    a: &[f32],
    b: &[f32],
    y: &mut Vec<f32>,
    n: usize,
    ca: usize,
    cb: usize,
    hw: usize,
) {
    let (pa, pb) = (ca * hw, cb * hw);
    assert!(
        a.len() >= n * pa && b.len() >= n * pb,
        "concat: {} and {} values for {n}x({ca}+{cb})x{hw}",
        a.len(),
        b.len()
    );
    y.resize(n * (pa + pb), 0.0);
    if pa + pb == 0 {
        return;
    }
    y.par_chunks_mut(pa + pb).enumerate().for_each(|(s, o)| {
        o[..pa].copy_from_slice(&a[s * pa..][..pa]);
        o[pa..].copy_from_slice(&b[s * pb..][..pb]);
    });
}

/// da = the first ca channels of dy, db the other cb, each where asked for.
#[allow(clippy::too_many_arguments)]
pub(super) fn concat_backward(
    dy: &[f32],
    da: Option<&mut Vec<f32>>,
    db: Option<&mut Vec<f32>>,
    n: usize,
    ca: usize,
    cb: usize,
    hw: usize,
) {
    let (pa, pb) = (ca * hw, cb * hw);
    assert!(
        dy.len() >= n * (pa + pb),
        "concat_backward: {} values for {n}x({ca}+{cb})x{hw}",
        dy.len()
    );
    // Part `off..off + per` of each sample of dy.
    let take = |d: &mut Vec<f32>, off: usize, per: usize| {
        d.resize(n * per, 0.0);
        if per > 0 {
            d.par_chunks_mut(per)
                .enumerate()
                .for_each(|(s, o)| o.copy_from_slice(&dy[s * (pa + pb) + off..][..per]));
        }
    };
    if let Some(da) = da {
        take(da, 0, pa);
    }
    if let Some(db) = db {
        take(db, pa, pb);
    }
}

/// The source index along one axis of each output index: floor(o * size / out).
fn sources(size: usize, out: usize) -> Vec<usize> {
    (0..out).map(|o| o * size / out).collect()
}

#[allow(clippy::too_many_arguments)]
pub(super) fn upsample(
    x: &[f32],
    y: &mut Vec<f32>,
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
) {
    assert!(
        x.len() >= n * c * h * w && (h * w > 0 || oh * ow == 0),
        "upsample: {} values for {n}x{c}x{h}x{w} -> {oh}x{ow}",
        x.len()
    );
    y.resize(n * c * oh * ow, 0.0);
    if oh * ow == 0 {
        return;
    }
    let (sy, sx) = (sources(h, oh), sources(w, ow));
    y.par_chunks_mut(oh * ow).enumerate().for_each(|(p, o)| {
        let plane = &x[p * h * w..][..h * w];
        for (oy, row) in o.chunks_mut(ow).enumerate() {
            let src = &plane[sy[oy] * w..][..w];
            row.iter_mut().zip(&sx).for_each(|(v, &ix)| *v = src[ix]);
        }
    });
}

/// dx: each input's sum of the gradients of the outputs that read it, added in ascending
/// (oy, ox) order from 0 (the GPU's order, so float32 sums agree to the bit).
#[allow(clippy::too_many_arguments)]
pub(super) fn upsample_backward(
    dy: &[f32],
    dx: &mut Vec<f32>,
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
) {
    assert!(
        dy.len() >= n * c * oh * ow,
        "upsample_backward: {} values for {n}x{c}x{oh}x{ow}",
        dy.len()
    );
    dx.resize(n * c * h * w, 0.0);
    if h * w == 0 {
        return;
    }
    let (sy, sx) = (sources(h, oh), sources(w, ow));
    dx.par_chunks_mut(h * w).enumerate().for_each(|(p, d)| {
        d.fill(0.0);
        let plane = &dy[p * oh * ow..][..oh * ow];
        for (oy, row) in plane.chunks(ow.max(1)).take(oh).enumerate() {
            let dst = &mut d[sy[oy] * w..][..w];
            row.iter().zip(&sx).for_each(|(&v, &ix)| dst[ix] += v);
        }
    });
}

pub(super) fn bias(x: &[f32], b: &[f32], y: &mut Vec<f32>, n: usize, c: usize, hw: usize) {
    assert!(
        x.len() >= n * c * hw && b.len() >= c,
        "bias: {} values and {} biases for {n}x{c}x{hw}",
        x.len(),
        b.len()
    );
    y.resize(n * c * hw, 0.0);
    if hw == 0 {
        return;
    }
    y.par_chunks_mut(hw).enumerate().for_each(|(i, o)| {
        let bc = b[i % c];
        o.iter_mut()
            .zip(&x[i * hw..][..hw])
            .for_each(|(o, &v)| *o = v + bc);
    });
}

/// db[c] = the sum of dy over samples and pixels, in float64, in sample then pixel order.
pub(super) fn bias_backward(dy: &[f32], db: &mut Vec<f32>, n: usize, c: usize, hw: usize) {
    assert!(
        dy.len() >= n * c * hw,
        "bias_backward: {} values for {n}x{c}x{hw}",
        dy.len()
    );
    db.resize(c, 0.0);
    db.par_iter_mut().enumerate().for_each(|(ci, o)| {
        let mut s = 0.0f64;
        for si in 0..n {
            s += dy[(si * c + ci) * hw..][..hw]
                .iter()
                .map(|&v| v as f64)
                .sum::<f64>();
        }
        *o = s as f32;
    });
}

#[cfg(test)]
mod tests {
    use crate::nn::cpu::Cpu;
    use crate::nn::Backend;

    #[test]
    fn unet_ops_match_finite_differences() {
        crate::nn::gradcheck::check_unet_ops(&mut Cpu::default());
    }

    #[test]
    fn unet_matches_finite_differences() {
        crate::nn::gradcheck::check_unet(&mut Cpu::default());
    }

    /// The ops on small values worked out by hand.
    #[test]
    fn unet_ops_give_the_values_worked_out_by_hand() {
        let mut c = Cpu::default();
        // Two samples: a has 1 channel, b has 2, of 2 pixels.
        let (a, b) = (
            vec![1., 2., 3., 4.],
            vec![5., 6., 7., 8., 9., 10., 11., 12.],
        );
        let mut y = vec![99.0; 3];
        c.concat(&a, &b, &mut y, 2, 1, 2, 2);
        assert_eq!(y, [1., 2., 5., 6., 7., 8., 3., 4., 9., 10., 11., 12.]);
        let (mut da, mut db) = (vec![], vec![7.0; 40]);
        c.concat_backward(&y, Some(&mut da), Some(&mut db), 2, 1, 2, 2);
        assert_eq!((&da, &db), (&a, &b));
        let mut db = vec![];
        c.concat_backward(&y, None, Some(&mut db), 2, 1, 2, 2);
        assert_eq!(db.len(), 8);

        // 2x3 -> 3x5: rows 0,0,1 (floor(y*2/3)); columns 0,0,1,1,2 (floor(x*3/5)).
        let x = vec![1., 2., 3., 4., 5., 6.];
        let mut u = vec![];
        c.upsample(&x, &mut u, 1, 1, 2, 3, 3, 5);
        let want = [1., 1., 2., 2., 3., 1., 1., 2., 2., 3., 4., 4., 5., 5., 6.];
        assert_eq!(u, want);
        let mut dx = vec![5.0; 100];
        c.upsample_backward(&vec![1.0; 15], &mut dx, 1, 1, 2, 3, 3, 5);
        // How many outputs read each input: rows 2,1 times columns 2,2,1.
        assert_eq!(dx, [4., 4., 2., 2., 2., 1.]);
        // Shrinking: inputs nobody reads get 0.
        let mut s = vec![];
        c.upsample(&vec![1., 2., 3., 4.], &mut s, 1, 1, 1, 4, 1, 2);
        assert_eq!(s, [1., 3.]);
        c.upsample_backward(&vec![1., 1.], &mut dx, 1, 1, 1, 4, 1, 2);
        assert_eq!(dx, [1., 0., 1., 0.]);

        let mut yb = vec![];
        c.bias(&b, &vec![0.5, -1.0], &mut yb, 2, 2, 2);
        assert_eq!(yb, [5.5, 6.5, 6., 7., 9.5, 10.5, 10., 11.]);
        let mut g = vec![];
        c.bias_backward(&b, &mut g, 2, 2, 2);
        assert_eq!(g, [5. + 6. + 9. + 10., 7. + 8. + 11. + 12.]);
    }
}
