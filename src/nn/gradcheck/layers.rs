//! Finite-difference checks of the U-Net's layers (concatenation, nearest upsampling, bias) and
//! of whole small U-Nets, for any `Backend`.

use super::{compare, dot, Backend, Model, ModelConfig, RawBatch, Rng};

/// d/d(inputs) of <op(inputs), r> for each new op, against central differences.
pub fn check_unet_ops<B: Backend>(be: &mut B) {
    let mut rng = Rng(13);
    let (n, h, w) = (2, 3, 5);

    // concat: both inputs' shares of the gradient, and one share asked for alone.
    let (ca, cb) = (3, 2);
    let a = rng.vec(n * ca * h * w);
    let b = rng.vec(n * cb * h * w);
    let r = rng.vec(n * (ca + cb) * h * w);
    let (ad, bd) = ([n, ca, h, w], [n, cb, h, w]);
    let rb = be.upload_act(&r, [n, ca + cb, h, w]);
    let (mut da, mut db, mut db_only) = (be.zeros(0), be.zeros(0), be.zeros(0));
    be.concat_backward(&rb, Some(&mut da), Some(&mut db), n, ca, cb, h * w);
    be.concat_backward(&rb, None, Some(&mut db_only), n, ca, cb, h * w);
    let (da, db, db_only) = (be.download(&da), be.download(&db), be.download(&db_only));
    assert_eq!(db, db_only, "concat_backward of b alone");
    let cat = |be: &mut B, a: &[f32], b: &[f32]| {
        let (x, y) = (be.upload_act(a, ad), be.upload_act(b, bd));
        let mut out = be.zeros(0);
        be.concat(&x, &y, &mut out, n, ca, cb, h * w);
        dot(&be.download(&out), &r)
    };
    compare("concat da", &a, &da, |v| cat(be, v, &b), &mut rng);
    compare("concat db", &b, &db, |v| cat(be, &a, v), &mut rng);

    // upsample: enlarging by odd factors, exactly 2x, and shrinking (inputs nobody reads get 0).
    let c = 3;
    for (h, w, oh, ow) in [(3, 5, 7, 11), (4, 3, 8, 6), (5, 4, 3, 2), (1, 1, 2, 3)] {
        let x = rng.vec(n * c * h * w);
        let r = rng.vec(n * c * oh * ow);
        let (xd, yd) = ([n, c, h, w], [n, c, oh, ow]);
        let rb = be.upload_act(&r, yd);
        let mut dx = be.zeros(0);
        be.upsample_backward(&rb, &mut dx, n, c, h, w, oh, ow);
        let dx = be.download(&dx);
        let up = |be: &mut B, v: &[f32]| {
            let xb = be.upload_act(v, xd);
            let mut y = be.zeros(0);
            be.upsample(&xb, &mut y, n, c, h, w, oh, ow);
            dot(&be.download(&y), &r)
        };
        let what = format!("upsample {h}x{w} -> {oh}x{ow}");
        compare(&what, &x, &dx, |v| up(be, v), &mut rng);
    }

    // bias: d/db (d/dx is dy itself, which the walker passes on).
    let x = rng.vec(n * c * h * w);
    let bias = rng.vec(c);
    let r = rng.vec(n * c * h * w);
    let xd = [n, c, h, w];
    let rb = be.upload_act(&r, xd);
    let mut db = be.zeros(0);
    be.bias_backward(&rb, &mut db, n, c, h * w);
    let db = be.download(&db);
    let xb = be.upload_act(&x, xd);
    let with = |be: &mut B, b: &[f32]| {
        let bb = be.upload(b);
        let mut y = be.zeros(0);
        be.bias(&xb, &bb, &mut y, n, c, h * w);
        dot(&be.download(&y), &r)
    };
    compare("bias db", &bias, &db, |v| with(be, v), &mut rng);
}

/// Whole U-Nets: d<output, r>/d(every trainable tensor) against central differences, on the
/// smallest square image and on an odd one whose levels round down differently in each
/// direction (19x23: 9x11, 4x5, 2x2, 1x1), with batches that leave the 1x1 bottleneck's batch
/// norms several values each.
pub fn check_unet<B: Backend>(be: &mut B) {
    check_unet_at(be, ModelConfig::unet(2, 16, 16, 3, 4), 8);
    check_unet_at(be, ModelConfig::unet(1, 19, 23, 2, 4), 6);
}

/// d/dx of `loss` at 12 sampled indices by central differences of step 5e-3, against `g`:
/// ‖numeric − analytic‖ over them must stay under 0.1 of the larger of the two norms plus
/// 0.05. Why so loose, and why it still fails on a wrong walker: the loss sums thousands of
/// float32 logits whose rounding moves each difference quotient by about 6e-3 (measured:
/// 0.02-0.05 over 16 indices whatever the gradient's size, so 1e-3 steps drown), and the
/// per-pixel output has thousands of max-pool windows whose winners such steps change (up to
/// 5% of a tensor's gradient norm measured, with the ReLUs kept off their kinks by the caller);
/// a lost skip gradient or a misplaced channel or pixel is off by a large part of the norm
/// (see `a_wrong_walker_fails_the_unet_check`).
fn compare_norms(
    what: &str,
    x: &[f32],
    g: &[f32],
    mut loss: impl FnMut(&[f32]) -> f64,
    rng: &mut Rng,
) {
    let eps = 5e-3;
    let (mut d2, mut n2, mut g2) = (0.0f64, 0.0f64, 0.0f64);
    for _ in 0..12 {
        let i = rng.idx(x.len());
        let mut xp = x.to_vec();
        xp[i] += eps;
        let lp = loss(&xp);
        xp[i] -= 2.0 * eps;
        let num = (lp - loss(&xp)) / (2.0 * eps as f64);
        d2 += (num - g[i] as f64).powi(2);
        n2 += num * num;
        g2 += (g[i] as f64).powi(2);
    }
    let (diff, norm) = (d2.sqrt(), n2.sqrt().max(g2.sqrt()));
    eprintln!("gradcheck {what}: ‖numeric − analytic‖ {diff:.2e} of ‖gradient‖ {norm:.2e}");
    assert!(
        diff < 0.1 * norm + 0.05,
        "{what}: ‖numeric − analytic‖ {diff:.3e} over 0.1 of ‖gradient‖ {norm:.3e} + 0.05"
    );
}

fn check_unet_at<B: Backend>(be: &mut B, cfg: ModelConfig, n: usize) {
    let (c, h, w, k) = (cfg.channels, cfg.height, cfg.width, cfg.classes);
    let mut rng = Rng(17);
    let px: Vec<u8> = (0..n * c * h * w)
        .map(|_| ((rng.f() + 1.0) * 127.0) as u8)
        .collect();
    let labels = vec![0u32; n];
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
    // The loss <logits, r>: a random per-pixel weighting of every logit.
    let r = rng.vec(n * k * h * w);
    // Batch-norm shifts of 4 keep the units off the ReLU's kink (3e-5 of them below it rather
    // than half): the same wiring checked, with the max pools' switches the only kinks left.
    let mut init = crate::nn::architecture::init_values(&cfg, 5);
    for (name, v) in &mut init {
        if name.contains(".bn") && name.ends_with(".bias") {
            v.fill(4.0);
        }
    }
    let loss_with = |be: &mut B, name: &str, vals: &[f32]| -> f64 {
        let mut v = init.clone();
        v.iter_mut().find(|(t, _)| t == name).unwrap().1 = vals.to_vec();
        let mut m = Model::new(be, cfg.clone(), &v);
        m.load(be, &raw, &mean, &std, 0, &[]);
        let y = m.forward(be, n, true);
        dot(&be.download(y), &r)
    };
    let mut m = Model::new(be, cfg.clone(), &init);
    m.load(be, &raw, &mean, &std, 0, &[]);
    let y = m.forward(be, n, true);
    assert_eq!(
        be.download(y).len(),
        r.len(),
        "unet output of [n, classes, H, W]"
    );
    *m.output_grad() = be.upload_act(&r, [n, k, h, w]);
    m.backward(be, n);
    let names = m.params.names.clone();
    // enc1-5: 2 convs and 2 batch norms of 2 tensors; dec4-1: those and the up conv; head: 2.
    assert_eq!(names.len(), 5 * 6 + 4 * 7 + 2, "tensors of a unet");
    for (i, name) in names.iter().enumerate() {
        let g = be.download(&m.params.g[i]);
        let w0 = init.iter().find(|(t, _)| t == name).unwrap().1.clone();
        compare_norms(
            &format!("unet {c}x{h}x{w} {name}"),
            &w0,
            &g,
            |v| loss_with(be, name, v),
            &mut rng,
        );
    }
}
