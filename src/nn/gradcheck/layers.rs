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

/// Central differences at two steps, 4e-3 and 2e-3: where they agree within 1e-2 no ReLU or
/// max-pool kink lay within the steps, and the analytic gradient must match the smaller step's
/// within 3e-2 - relative to the larger of the value and the tensor's root-mean-square gradient.
/// Why so: the loss sums thousands of float32 logits, whose rounding moves it by about 1e-4
/// (measured), 2.5e-2 of a gradient at a step of 2e-3 (1e-3 and below drown in it); and a
/// U-Net's per-pixel output has thousands of units whose kinks such steps cross (the plain
/// check failed on a correct walker at every step), so indices that cross one are skipped, but
/// at most a quarter of each tensor's: a wrong gradient (a lost skip connection, a channel
/// split off by one) is off at nearly every index, kinks or not.
fn compare_smooth(
    what: &str,
    x: &[f32],
    g: &[f32],
    mut loss: impl FnMut(&[f32]) -> f64,
    rng: &mut Rng,
) {
    let num = |loss: &mut dyn FnMut(&[f32]) -> f64, i: usize, eps: f32| {
        let mut xp = x.to_vec();
        xp[i] += eps;
        let lp = loss(&xp);
        xp[i] -= 2.0 * eps;
        (lp - loss(&xp)) / (2.0 * eps as f64)
    };
    let rms = (g.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / g.len() as f64).sqrt();
    let (mut worst, mut kinked) = (0.0f64, 0);
    let tries = 16;
    for _ in 0..tries {
        let i = rng.idx(x.len());
        let (a, b) = (num(&mut loss, i, 4e-3), num(&mut loss, i, 2e-3));
        let scale = rms.max(a.abs()).max(b.abs()).max(1e-6);
        if (a - b).abs() / scale > 1e-2 {
            kinked += 1;
            continue;
        }
        let err = (b - g[i] as f64).abs() / scale;
        worst = worst.max(err);
        assert!(
            err < 3e-2,
            "{what}: index {i}: analytic {} vs numeric {b} (and {a} at twice the step)",
            g[i]
        );
    }
    eprintln!("gradcheck {what}: worst relative error {worst:.2e}, {kinked} of {tries} indices across a kink");
    assert!(
        4 * kinked <= tries,
        "{what}: {kinked} of {tries} indices disagree between two steps: not kinks but a wrong or rough gradient"
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
    // Batch-norm shifts of 2 keep most units off the ReLU's kink (2% below it rather than
    // half): fewer indices to skip, the same wiring checked.
    let mut init = crate::nn::architecture::init_values(&cfg, 5);
    for (name, v) in &mut init {
        if name.contains(".bn") && name.ends_with(".bias") {
            v.fill(2.0);
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
    assert_eq!(be.download(y).len(), r.len(), "unet output of [n, classes, H, W]");
    *m.output_grad() = be.upload_act(&r, [n, k, h, w]);
    m.backward(be, n);
    let names = m.params.names.clone();
    // enc1-5: 2 convs and 2 batch norms of 2 tensors; dec4-1: those and the up conv; head: 2.
    assert_eq!(names.len(), 5 * 6 + 4 * 7 + 2, "tensors of a unet");
    for (i, name) in names.iter().enumerate() {
        let g = be.download(&m.params.g[i]);
        let w0 = init.iter().find(|(t, _)| t == name).unwrap().1.clone();
        compare_smooth(
            &format!("unet {c}x{h}x{w} {name}"),
            &w0,
            &g,
            |v| loss_with(be, name, v),
            &mut rng,
        );
    }
}
