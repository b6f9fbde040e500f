//! The targets and losses of the mask, labels and values tasks, CUDA against the CPU reference:
//! mask and target loads (host and GPU-memory paths) exactly, the losses and their gradients in
//! float32 and bfloat16 on odd sizes (k = 2, 3, 5 and more classes than the kernels keep in
//! shared memory; pixel counts that are not a multiple of the block), written over stale outputs;
//! known values; the finite-difference checks; and the segmentation loss replayed from a graph.
//! Without a GPU these tests say so and pass, unless PREP_REQUIRE_CUDA=1.

use super::staging::Kind;
use super::tests::{bf16_round, close, gpu, Rng};
use super::{Buf, Cuda, Dt, Precision};
use crate::nn::cpu::Cpu;
use crate::nn::{Aug, Backend};

/// Values as the GPU holds an activation of this precision.
fn round(prec: Precision, v: Vec<f32>) -> Vec<f32> {
    match prec {
        Precision::Bf16 => v.into_iter().map(bf16_round).collect(),
        Precision::F32 => v,
    }
}

fn close_f64(what: &str, gpu: f64, cpu: f64, tol: f64) {
    let e = (gpu - cpu).abs() / cpu.abs().max(1e-30);
    eprintln!("{what}: {gpu} vs {cpu}, relative error {e:.2e}");
    assert!(e < tol, "{what}: {gpu} vs {cpu}");
}

fn random_augs(rng: &mut Rng, n: usize, pad: usize) -> Vec<Aug> {
    let span = 2 * pad as u64 + 1;
    (0..n)
        .map(|_| Aug {
            dy: rng.below(span) as u8,
            dx: rng.below(span) as u8,
            flip: rng.below(2) == 0,
        })
        .collect()
}

const PRECISIONS: [(Precision, f64); 2] = [(Precision::F32, 1e-5), (Precision::Bf16, 8e-3)];

/// Masks through the staging ring and from GPU memory (gathered in another order), u8 and u16,
/// with and without crops, flips and an ignored value, on a shape that is not a multiple of
/// the block, exactly as the CPU: over a longer stale output.
#[test]
fn mask_loads_match_the_cpu_exactly() {
    let Some(mut g) = gpu(Precision::F32, Kind::Pinned) else {
        return;
    };
    let mut c = Cpu::default();
    let mut rng = Rng(31);
    let (n, h, w) = (5, 13, 11);
    let mut out = g.upload(&rng.scaled(4 * n * h * w, 9.0));
    for wide in [false, true] {
        let size = if wide { 2 } else { 1 };
        let raw: Vec<u8> = (0..n * h * w * size).map(|_| rng.next() as u8).collect();
        // A value that occurs: the first pixel's.
        let first = if wide {
            u16::from_le_bytes([raw[0], raw[1]]) as u32
        } else {
            raw[0] as u32
        };
        for (pad, aug, ignore) in [
            (0, vec![], None),
            (2, random_augs(&mut rng, n, 2), Some(first)),
            (3, random_augs(&mut rng, 2, 3), Some(first)),
        ] {
            let what = format!("wide={wide} pad={pad} {} augs ignore={ignore:?}", aug.len());
            g.load_masks(&raw, wide, n, h, w, pad, &aug, ignore, &mut out);
            let mut want = vec![];
            c.load_masks(&raw, wide, n, h, w, pad, &aug, ignore, &mut want);
            assert_eq!(g.download(&out), want, "{what}");
        }
        // The masks in GPU memory, samples in reverse order, each with its own crop and flip.
        let order: Vec<u32> = (0..n as u32).rev().collect();
        let aug = random_augs(&mut rng, n, 2);
        let packed: Vec<u32> = aug.iter().map(|a| a.packed()).collect();
        let (mut mb, mut ob, mut ab) = (g.empty(Dt::U8), g.empty(Dt::U32), g.empty(Dt::U32));
        g.upload_into(&mut mb, &raw, Dt::U8);
        g.upload_into(&mut ob, &order, Dt::U32);
        g.upload_into(&mut ab, &packed, Dt::U32);
        let per = h * w * size;
        let gathered: Vec<u8> = order
            .iter()
            .flat_map(|&i| raw[i as usize * per..][..per].iter().copied())
            .collect();
        let mut want = vec![];
        c.load_masks(&gathered, wide, n, h, w, 2, &aug, Some(first), &mut want);
        g.load_masks_device(
            mb.ptr(),
            wide,
            ob.ptr(),
            ab.ptr(),
            n,
            h,
            w,
            2,
            Some(first),
            &mut out,
        );
        assert_eq!(g.download(&out), want, "wide={wide} from GPU memory");
        // Without an order or augmentations: the first n, centred.
        c.load_masks(&raw, wide, 3, h, w, 1, &[], None, &mut want);
        g.load_masks_device(mb.ptr(), wide, 0, 0, 3, h, w, 1, None, &mut out);
        assert_eq!(g.download(&out), want, "wide={wide} in place");
    }
    g.status().unwrap();
}

/// Targets of labels and values: from the host, and gathered from GPU memory by index.
/// The crop and flip of `load_batch` and `load_masks` move an image and its mask together.
#[test]
fn the_crop_and_flip_move_image_and_mask_together() {
    let Some(mut g) = gpu(Precision::F32, Kind::Pinned) else {
        return;
    };
    crate::nn::gradcheck_losses::image_and_mask_move_together(&mut g);
    g.status().unwrap();
}

#[test]
fn targets_load_and_gather_exactly() {
    let Some(mut g) = gpu(Precision::F32, Kind::Pinned) else {
        return;
    };
    let mut rng = Rng(37);
    let (samples, n, k) = (50, 33, 7);
    let all = rng.scaled(samples * k, 100.0);
    let mut out = g.upload(&rng.scaled(3 * samples * k, 1.0));
    g.load_targets(&all[..n * k], &mut out);
    assert_eq!(g.download(&out), &all[..n * k]);
    let order: Vec<u32> = (0..n).map(|_| rng.below(samples as u64) as u32).collect();
    let (mut src, mut ob) = (g.empty(Dt::F32), g.empty(Dt::U32));
    g.upload_into(&mut src, &all, Dt::F32);
    g.upload_into(&mut ob, &order, Dt::U32);
    g.gather_targets_device(src.ptr(), ob.ptr(), n, k, &mut out);
    let want: Vec<f32> = order
        .iter()
        .flat_map(|&i| all[i as usize * k..][..k].iter().copied())
        .collect();
    assert_eq!(g.download(&out), want);
    g.gather_targets_device(src.ptr(), 0, n, k, &mut out);
    assert_eq!(g.download(&out), &all[..n * k]);
    g.status().unwrap();
}

/// Random targets over [n, hw]: about one pixel in six ignored (-1), one out of range.
fn seg_targets(rng: &mut Rng, len: usize, k: usize) -> Vec<f32> {
    let mut t: Vec<f32> = (0..len)
        .map(|_| match rng.below(6) {
            0 => -1.0,
            _ => rng.below(k as u64) as f32,
        })
        .collect();
    t[len / 2] = k as f32;
    t
}

/// seg_loss and seg_score against the CPU on logits `z` [n, k, h, w] uploaded as an activation
/// (or, with `plain`, as an NCHW float buffer); the GPU's outputs start stale.
#[allow(clippy::too_many_arguments)]
fn seg_matches(
    g: &mut Cuda,
    c: &mut Cpu,
    z: &[f32],
    t: &[f32],
    dice: f32,
    (n, k, h, w): (usize, usize, usize, usize),
    plain: bool,
    tol: f64,
    what: &str,
) {
    let hw = h * w;
    let zb = if plain {
        g.upload(z)
    } else {
        g.upload_act(z, [n, k, h, w])
    };
    let tb = g.upload(t);
    let mut gd = g.upload_act(&vec![7.0; z.len()], [n, k, h, w]);
    g.take_loss_stats();
    g.seg_loss(&zb, &tb, dice, &mut gd, n, k, hw);
    let (gl, gc) = g.take_loss_stats();
    let (z, t) = (z.to_vec(), t.to_vec());
    let mut cd = vec![];
    c.seg_loss(&z, &t, dice, &mut cd, n, k, hw);
    let (cl, cc) = c.take_loss_stats();
    close(&format!("{what} dlogits"), &g.download(&gd), &cd, tol);
    close_f64(&format!("{what} loss"), gl, cl, 1e-5);
    assert_eq!(gc, cc, "{what}: correctly classified pixels");
    for _ in 0..2 {
        g.seg_score(&zb, &tb, n, k, hw);
        c.seg_score(&z, &t, n, k, hw);
    }
    let counts = g.take_seg_counts(k);
    assert_eq!(counts, c.take_seg_counts(k), "{what}: counts");
    assert!(counts.iter().sum::<u64>() > 0);
    assert_eq!(
        g.take_seg_counts(k),
        vec![0; 3 * k],
        "{what}: counters restart"
    );
}

/// seg_loss and seg_score against the CPU in both precisions, k = 2, 3, 5 and 70 (beyond the
/// 64 classes kept in shared memory), pixel counts of 143 and 1073 per sample.
#[test]
fn segmentation_losses_match_the_cpu() {
    for (prec, tol) in PRECISIONS {
        let Some(mut g) = gpu(prec, Kind::Pinned) else {
            return;
        };
        let mut c = Cpu::default();
        let mut rng = Rng(41);
        for (k, dice, (n, h, w)) in [
            (2, 0.5, (3, 13, 11)),
            (3, 1.0, (2, 37, 29)),
            (5, 0.0, (3, 13, 11)),
            (5, 0.7, (2, 37, 29)),
            (70, 0.5, (2, 7, 5)),
        ] {
            let len = n * k * h * w;
            let z = round(prec, rng.scaled(len, 4.0));
            let t = seg_targets(&mut rng, n * h * w, k);
            let what = format!("{prec:?} seg k={k} dice={dice} {n}x{h}x{w}");
            seg_matches(
                &mut g,
                &mut c,
                &z,
                &t,
                dice,
                (n, k, h, w),
                false,
                tol,
                &what,
            );
            if prec == Precision::F32 {
                let what = format!("{what} NCHW");
                seg_matches(&mut g, &mut c, &z, &t, dice, (n, k, h, w), true, tol, &what);
            }
        }
        g.status().unwrap();
    }
}

/// (loss bits, correct pixels, dlogits bits) of one seg_loss over a stale gradient buffer.
fn seg_bits(g: &mut Cuda, z: &Buf, t: &Buf, d: &mut Buf, (n, k, hw): Dims3) -> SegBits {
    g.take_loss_stats();
    g.seg_loss(z, t, 0.5, d, n, k, hw);
    let (loss, right) = g.take_loss_stats();
    let bits = g.download(d).iter().map(|v| v.to_bits()).collect();
    (loss.to_bits(), right, bits)
}
type Dims3 = (usize, usize, usize);
type SegBits = (u64, u64, Vec<u32>);

/// The segmentation loss gives the same bits on every call: the same inputs twice with another
/// batch between them (whose sums and gradient the buffers then hold), and once on a fresh
/// backend; over tens of blocks, k = 3 and 70 (classes summed in groups beyond those kept in
/// shared memory), both precisions, NHWC and (float32) NCHW.
#[test]
fn the_segmentation_loss_is_bit_for_bit_deterministic() {
    for (prec, _) in PRECISIONS {
        let Some(mut g) = gpu(prec, Kind::Pinned) else {
            return;
        };
        let mut fresh = gpu(prec, Kind::Pinned).expect("a second backend");
        let mut rng = Rng(59);
        for (k, (n, h, w)) in [(3, (4, 64, 61)), (70, (2, 48, 45))] {
            let hw = h * w;
            assert!(n * hw > 16 * 256, "several blocks");
            let z = round(prec, rng.scaled(n * k * hw, 4.0));
            let other = round(prec, rng.scaled(n * k * hw, 4.0));
            let t = seg_targets(&mut rng, n * hw, k);
            for plain in [false, true] {
                if plain && prec != Precision::F32 {
                    continue;
                }
                let what = format!("{prec:?} k={k} {n}x{h}x{w} NCHW={plain}");
                let up = |g: &mut Cuda, v: &[f32]| {
                    if plain {
                        g.upload(v)
                    } else {
                        g.upload_act(v, [n, k, h, w])
                    }
                };
                let (zb, ob, tb) = (up(&mut g, &z), up(&mut g, &other), g.upload(&t));
                let mut d = up(&mut g, &vec![7.0; z.len()]);
                let first = seg_bits(&mut g, &zb, &tb, &mut d, (n, k, hw));
                assert!(
                    first.1 > 0 && first.2.iter().any(|&b| b != 0),
                    "{what}: nothing"
                );
                let between = seg_bits(&mut g, &ob, &tb, &mut d, (n, k, hw));
                assert_ne!(between.0, first.0, "{what}: other logits, same loss");
                let again = seg_bits(&mut g, &zb, &tb, &mut d, (n, k, hw));
                assert!(
                    again.0 == first.0,
                    "{what}: loss {:e} then {:e}",
                    f64::from_bits(first.0),
                    f64::from_bits(again.0)
                );
                assert_eq!(again.1, first.1, "{what}: correct pixels");
                let differ = first.2.iter().zip(&again.2).filter(|(a, b)| a != b).count();
                assert_eq!(differ, 0, "{what}: dlogits differ in {differ} values");
                let (fz, ft) = (up(&mut fresh, &z), fresh.upload(&t));
                let mut fd = fresh.empty(d.dt);
                let other_backend = seg_bits(&mut fresh, &fz, &ft, &mut fd, (n, k, hw));
                assert!(other_backend == first, "{what}: another backend differs");
            }
        }
        g.status().unwrap();
        fresh.status().unwrap();
    }
}

/// Known values: a perfect prediction (loss 0, every Dice 1, counts exact), an all-ignored
/// batch (loss 0, gradient 0), BCE of logit 0 (ln 2 per sample).
#[test]
fn losses_give_known_values_on_the_gpu() {
    for (prec, _) in PRECISIONS {
        let Some(mut g) = gpu(prec, Kind::Pinned) else {
            return;
        };
        let mut rng = Rng(43);
        let (n, k, h, w) = (3, 3, 9, 7);
        let hw = h * w;
        let t = seg_targets(&mut rng, n * hw, k);
        let mut z = vec![0.0; n * k * hw];
        let mut want = vec![0u64; 3 * k];
        for s in 0..n {
            for p in 0..hw {
                let y = t[s * hw + p];
                if (0.0..k as f32).contains(&y) {
                    z[(s * k + y as usize) * hw + p] = 40.0;
                    want[3 * y as usize] += 1;
                } else {
                    z[(s * k + 1) * hw + p] = 40.0;
                }
            }
        }
        let counted: u64 = want.iter().sum();
        let (zb, tb) = (g.upload_act(&z, [n, k, h, w]), g.upload(&t));
        let mut d = g.upload_act(&vec![7.0; z.len()], [n, k, h, w]);
        g.take_loss_stats();
        g.seg_loss(&zb, &tb, 1.0, &mut d, n, k, hw);
        let (loss, right) = g.take_loss_stats();
        assert!(
            loss.abs() < 1e-6,
            "{prec:?}: perfect prediction's loss {loss}"
        );
        assert_eq!(right, counted);
        assert!(g.download(&d).iter().all(|v| v.abs() < 1e-9));
        g.seg_score(&zb, &tb, n, k, hw);
        assert_eq!(g.take_seg_counts(k), want, "{prec:?}: counts");
        // Nothing counted.
        let tb = g.upload(&vec![-1.0; n * hw]);
        g.seg_loss(&zb, &tb, 1.0, &mut d, n, k, hw);
        assert_eq!(g.take_loss_stats(), (0.0, 0), "{prec:?}: all ignored");
        assert!(g.download(&d).iter().all(|&v| v == 0.0));
        // BCE at logit 0, as a head's float32 output and as an activation [n, k, 1, 1].
        let (n, k) = (37, 45);
        let tb = g.upload(
            &(0..n * k)
                .map(|i| (i % 3 == 0) as u8 as f32)
                .collect::<Vec<_>>(),
        );
        for zb in [
            g.upload(&vec![0.0; n * k]),
            g.upload_act(&vec![0.0; n * k], [n, k, 1, 1]),
        ] {
            let mut d = g.zeros(0);
            g.bce_logits(&zb, &tb, &mut d, n, k);
            let (loss, right) = g.take_loss_stats();
            close_f64(
                &format!("{prec:?} BCE at 0"),
                loss,
                n as f64 * 2f64.ln(),
                1e-6,
            );
            assert_eq!(right, 0);
        }
        g.status().unwrap();
    }
}

/// BCE with logits and the regression losses against the CPU: on a head's float32 output and
/// on an activation of the precision, k of 1, 5 and 45 (more than a warp), over stale outputs.
#[test]
fn head_losses_match_the_cpu() {
    for (prec, tol) in PRECISIONS {
        let Some(mut g) = gpu(prec, Kind::Pinned) else {
            return;
        };
        let mut c = Cpu::default();
        let mut rng = Rng(47);
        for (n, k) in [(37, 1), (37, 5), (9, 45)] {
            for act in [false, true] {
                let what = format!("{prec:?} {n}x{k} activation={act}");
                let raw = rng.scaled(n * k, 5.0);
                let z = if act { round(prec, raw) } else { raw };
                let up = |g: &mut Cuda, v: &[f32]| {
                    if act {
                        g.upload_act(v, [n, k, 1, 1])
                    } else {
                        g.upload(v)
                    }
                };
                let zb = up(&mut g, &z);
                let mut gd = up(&mut g, &vec![7.0; n * k]);
                // Labels, some rows all right; values of the logits' scale.
                let labels: Vec<f32> = (0..n * k).map(|_| rng.below(2) as f32).collect();
                let values = rng.scaled(n * k, 4.0);
                let dtol = if act { tol } else { 1e-5 };
                let lb = g.upload(&labels);
                g.take_loss_stats();
                g.bce_logits(&zb, &lb, &mut gd, n, k);
                let (gl, gc) = g.take_loss_stats();
                let mut cd = vec![];
                c.bce_logits(&z, &labels, &mut cd, n, k);
                let (cl, cc) = c.take_loss_stats();
                close(&format!("{what} BCE dlogits"), &g.download(&gd), &cd, dtol);
                close_f64(&format!("{what} BCE loss"), gl, cl, 1e-5);
                assert_eq!(gc, cc, "{what}: samples right");
                let vb = g.upload(&values);
                for smooth in [false, true] {
                    g.regression_loss(&zb, &vb, smooth, &mut gd, n, k);
                    let (gl, gc) = g.take_loss_stats();
                    c.regression_loss(&z, &values, smooth, &mut cd, n, k);
                    let (cl, _) = c.take_loss_stats();
                    let what = format!("{what} regression smooth_l1={smooth}");
                    close(&format!("{what} dpred"), &g.download(&gd), &cd, dtol);
                    close_f64(&format!("{what} loss"), gl, cl, 1e-5);
                    assert_eq!(gc, 0);
                }
            }
        }
        g.status().unwrap();
    }
}

#[test]
fn loss_gradients_match_finite_differences_on_the_gpu() {
    let Some(mut g) = gpu(Precision::F32, Kind::Pinned) else {
        return;
    };
    crate::nn::gradcheck_losses::check_losses(&mut g);
    g.status().unwrap();
}

/// The segmentation loss recorded as a graph and replayed twice gives the loss and gradient of a
/// direct call each time (its partial sums are written afresh inside the graph; nothing is
/// allocated or read back while recording).
#[test]
fn a_recorded_segmentation_loss_replays_as_it_runs() {
    let Some(mut g) = gpu(Precision::Bf16, Kind::Pinned) else {
        return;
    };
    let mut rng = Rng(53);
    let (n, k, h, w) = (4, 3, 17, 19);
    let z = round(Precision::Bf16, rng.scaled(n * k * h * w, 4.0));
    let t = seg_targets(&mut rng, n * h * w, k);
    let (zb, tb) = (g.upload_act(&z, [n, k, h, w]), g.upload(&t));
    let mut d = g.empty(Dt::Bf16);
    g.take_loss_stats();
    g.seg_loss(&zb, &tb, 0.5, &mut d, n, k, h * w);
    let direct = g.take_loss_stats();
    let dd = g.download(&d);
    if !g.begin_capture() {
        eprintln!("skipped: graphs are off (PREP_NO_GRAPHS or PREP_PROFILE)");
        return;
    }
    g.seg_loss(&zb, &tb, 0.5, &mut d, n, k, h * w);
    assert!(g.end_capture(), "recording the loss: {:?}", g.status());
    let act = d.act;
    for replay in 0..2 {
        // Zeros first (in place: the graph holds this address), so that the replay must write.
        g.upload_into(&mut d, &vec![0u16; dd.len()], Dt::Bf16);
        d.act = act;
        assert!(g.replay(0.1));
        let (l, right) = g.take_loss_stats();
        close_f64(&format!("replay {replay} loss"), l, direct.0, 1e-9);
        assert_eq!(right, direct.1);
        close(
            &format!("replay {replay} dlogits"),
            &g.download(&d),
            &dd,
            1e-6,
        );
    }
    g.status().unwrap();
}
