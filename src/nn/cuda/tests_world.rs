//! Several ranks on one GPU, each a thread with its own backend, their sums meeting on the host
//! (`world::host`): a data-parallel step's arithmetic (the gradients' average, synchronised
//! batch norm) against one rank at the ranks' summed batch, on the GPU and on the CPU.

use super::staging::Kind;
use super::tests::{gpu, random_augs, rel, Rng};
use super::world::host;
use super::{Cuda, Precision};
use crate::format::shard::Dtype;
use crate::nn::architecture::init_values;
use crate::nn::cpu::Cpu;
use crate::nn::{Aug, Backend, Model, ModelConfig, RawBatch};

/// One step's batch of the whole world.
struct Batch {
    pixels: Vec<u8>,
    labels: Vec<u32>,
    aug: Vec<Aug>,
}

/// What a run leaves after each step: the (averaged) gradients and the state (weights, running
/// statistics, momentum).
struct Run {
    grads: Vec<Vec<(String, Vec<f32>)>>,
    states: Vec<Vec<(String, Vec<f32>)>>,
}

const LR: f32 = 0.2;

/// `steps` training steps of `cfg` on samples `from..to` of each batch.
fn train<B: Backend>(
    be: &mut B,
    cfg: &ModelConfig,
    batches: &[Batch],
    (from, to): (usize, usize),
) -> Run {
    let init = init_values(cfg, 4);
    let mut m = Model::new(be, cfg.clone(), &init);
    let (ch, h, w) = (cfg.channels, cfg.height, cfg.width);
    let pad = (h.min(w) as f32 / 12.0).round().max(1.0) as usize;
    let (mean, std) = (vec![0.3; ch], vec![0.35; ch]);
    let per = ch * h * w;
    let n = to - from;
    let (mut grads, mut states) = (Vec::new(), Vec::new());
    for b in batches {
        let raw = RawBatch {
            pixels: &b.pixels[from * per..to * per],
            dtype: Dtype::U8,
            n,
            c: ch,
            h,
            w,
            labels: &b.labels[from..to],
        };
        m.load(be, &raw, &mean, &std, pad, &b.aug[from..to]);
        m.forward(be, n, true);
        m.loss(be, n, 0.1);
        m.backward(be, n);
        m.step(be, LR, 0.9, 5e-4);
        // After the step: a rank's gradients are the world's average by then.
        let p = &m.params;
        grads.push(
            p.names
                .iter()
                .zip(&p.g)
                .map(|(name, g)| (name.clone(), be.download(g)))
                .collect(),
        );
        states.push(m.state(be));
    }
    be.status().unwrap();
    Run { grads, states }
}

/// The runs of `ranks` ranks of one GPU with `sync_bn`, one per thread, each on its share of
/// every batch.
fn ranks(
    prec: Precision,
    ranks: usize,
    sync_bn: bool,
    cfg: &ModelConfig,
    batches: &[Batch],
    n: usize,
) -> Vec<Run> {
    let world = host::world(ranks);
    std::thread::scope(|s| {
        let handles: Vec<_> = world
            .into_iter()
            .enumerate()
            .map(|(r, rank)| {
                s.spawn(move || {
                    let mut g = Cuda::new(0, prec, Kind::Pinned).expect("CUDA backend starts");
                    g.set_sync_bn(sync_bn);
                    g.join_host_world(rank);
                    train(&mut g, cfg, batches, (r * n, (r + 1) * n))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The largest difference of two states' tensors, relative to each tensor's largest magnitude
/// (scripts/compare-weights.py's figure), and the tensor where it is; momentum left out.
fn worst(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> (f64, String) {
    let mut out = (0.0f64, String::new());
    for ((name, x), (other, y)) in a.iter().zip(b) {
        assert_eq!(name, other);
        if name.ends_with(".momentum") {
            continue;
        }
        let scale = y.iter().fold(1e-12f32, |m, v| m.max(v.abs())) as f64;
        let d = x
            .iter()
            .zip(y)
            .map(|(u, v)| (u - v).abs() as f64)
            .fold(0.0, f64::max)
            / scale;
        assert!(d.is_finite(), "{name}: not finite");
        if d > out.0 {
            out = (d, name.clone());
        }
    }
    out
}

fn worst_grad(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> (f64, String) {
    let mut out = (0.0f64, String::new());
    for ((name, x), (_, y)) in a.iter().zip(b) {
        let e = rel(x, y);
        if e > out.0 {
            out = (e, name.clone());
        }
    }
    out
}

/// Two ranks of n samples with `--sync-bn` train what one rank of 2n does. The ranks hold the
/// same bits, a world of one rank the bits of one rank, and after one step the weights and
/// running statistics of two ranks are one rank's (and the CPU's) within the 1e-3
/// (largest difference over the tensor's largest magnitude; measured about 2e-6). Without
/// synchronised batch norm the same comparison fails (each rank normalises by its own half): the
/// check can tell. Later steps are printed, not held to it: float32 rounding then flips a ReLU or
/// a max-pool's winner now and then, and one rank against the CPU moves as far (about 1e-3 at
/// step 3 of 3x32x32, where two ranks against one stay at 1e-6; the other way round at 5x37x53);
/// resnet18's deep layers at these small batches (2x2 pixels x 16 samples a channel) differ
/// from the CPU by 1e-2 after one step, so it is left to the layer test below.
#[test]
fn two_ranks_with_synchronised_batch_norm_train_as_one_rank_of_both_batches() {
    if gpu(Precision::F32, Kind::Pinned).is_none() {
        return;
    }
    let mut failed = Vec::new();
    for (model, (c, h, w), n) in [("small", (3, 32, 32), 32), ("small", (5, 37, 53), 8)] {
        let cfg = ModelConfig::new(model, c, h, w, 10).unwrap();
        let pad = (h.min(w) as f32 / 12.0).round().max(1.0) as usize;
        let mut rng = Rng(11);
        let batches: Vec<Batch> = (0..3)
            .map(|_| Batch {
                pixels: rng.bytes(2 * n * c * h * w),
                labels: (0..2 * n).map(|_| (rng.next() % 10) as u32).collect(),
                aug: random_augs(&mut rng, 2 * n, pad),
            })
            .collect();
        let label = format!("{model} {c}x{h}x{w}, 2 x {n}");
        let mut one = gpu(Precision::F32, Kind::Pinned).unwrap();
        let one = train(&mut one, &cfg, &batches, (0, 2 * n));
        let cpu = train(&mut Cpu::default(), &cfg, &batches, (0, 2 * n));
        let two = ranks(Precision::F32, 2, true, &cfg, &batches, n);
        let alone = ranks(Precision::F32, 1, true, &cfg, &batches, 2 * n);
        let plain = ranks(Precision::F32, 2, false, &cfg, &batches, n);
        let mut small = gpu(Precision::F32, Kind::Pinned).unwrap();
        let small = train(&mut small, &cfg, &batches, (0, n));
        let small_cpu = train(&mut Cpu::default(), &cfg, &batches, (0, n));
        for s in 0..batches.len() {
            let (same, _) = worst(&two[0].states[s], &two[1].states[s]);
            let (w_one, t_one) = worst(&two[0].states[s], &one.states[s]);
            let (w_cpu, t_cpu) = worst(&two[0].states[s], &cpu.states[s]);
            let (w_ref, t_ref) = worst(&one.states[s], &cpu.states[s]);
            let (w_alone, _) = worst(&alone[0].states[s], &one.states[s]);
            let (w_plain, t_plain) = worst(&plain[0].states[s], &one.states[s]);
            let (g_one, tg) = worst_grad(&two[0].grads[s], &one.grads[s]);
            let (g_ref, tr) = worst_grad(&one.grads[s], &cpu.grads[s]);
            let (w_small, t_small) = worst(&small.states[s], &small_cpu.states[s]);
            eprintln!(
                "{label}, step {}: ranks apart {same:.1e}, a world of one against one rank \
                 {w_alone:.1e}; 2 ranks against 1 rank {w_one:.2e} ({t_one}), against the CPU \
                 {w_cpu:.2e} ({t_cpu}); 1 rank against the CPU {w_ref:.2e} ({t_ref}); gradients \
                 2 ranks / 1 rank {g_one:.2e} ({tg}), 1 rank / CPU {g_ref:.2e} ({tr}); \
                 without --sync-bn {w_plain:.2e} ({t_plain}); 1 rank of {n} against the CPU \
                 {w_small:.2e} ({t_small})",
                s + 1
            );
            if same != 0.0 || w_alone != 0.0 {
                failed.push(format!(
                    "{label}: the ranks' states differ by {same:e}, a world of one by {w_alone:e}"
                ));
            }
            for (what, v) in [("1 rank", w_one), ("the CPU", w_cpu)] {
                if s == 0 && v > 1e-3 {
                    failed.push(format!(
                        "{label}, step {}: 2 ranks against {what}: {v:.3e} > 1e-3",
                        s + 1
                    ));
                }
            }
            if s == 0 && w_plain <= 1e-3 {
                failed.push(format!(
                    "{label}: without --sync-bn the ranks also match one rank ({w_plain:.3e}): \
                     the comparison cannot tell"
                ));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// One batch-norm layer (with its ReLU) forward and backward: y, dx, dgamma, dbeta, the saved
/// mean and inverse deviation, the running mean and variance.
fn bn_layer(g: &mut Cuda, x: &[f32], dy: &[f32], n: usize, c: usize, hw: usize) -> Vec<Vec<f32>> {
    let mut rng = Rng(3);
    let gamma = rng.vec(c);
    let beta = rng.vec(c);
    let act = g.act_dt();
    let (xb, dyb) = (
        g.upload_act(x, [n, c, hw, 1]),
        g.upload_act(dy, [n, c, hw, 1]),
    );
    let (gb, bb) = (g.upload(&gamma), g.upload(&beta));
    let (mut rm, mut rv) = (g.upload(&vec![0.0; c]), g.upload(&vec![1.0; c]));
    let (mut y, mut m, mut is, mut dx) = (g.empty(act), g.zeros(0), g.zeros(0), g.empty(act));
    let (mut dg, mut db) = (g.zeros(0), g.zeros(0));
    g.bn_train(
        &xb, &gb, &bb, &mut y, &mut m, &mut is, &mut rm, &mut rv, n, c, hw, true,
    );
    g.bn_backward(
        &xb,
        &dyb,
        &gb,
        &bb,
        &m,
        &is,
        &mut dx,
        &mut dg,
        &mut db,
        n,
        c,
        hw,
        Some(&y),
    );
    let out = [&y, &dx, &dg, &db, &m, &is, &rm, &rv].map(|b| g.download(b));
    g.status().unwrap();
    out.to_vec()
}

/// The layer itself: two ranks of n rows each (a world on the host) against one rank of 2n, on
/// values about zero and far from it: y, dx, the saved and running statistics as one rank's,
/// and dgamma, dbeta summed over the ranks (each rank's are its own, averaged with the other
/// gradients) as one rank's.
#[test]
fn two_ranks_of_synchronised_batch_norm_make_one_layer() {
    if gpu(Precision::F32, Kind::Pinned).is_none() {
        return;
    }
    let names = [
        "y",
        "dx",
        "dgamma",
        "dbeta",
        "mean",
        "invstd",
        "running mean",
        "running var",
    ];
    let mut failed = Vec::new();
    for (n, c, hw, offset) in [
        (8, 32, 37 * 53, 0.0),
        (8, 32, 37 * 53, 30.0),
        (3, 13, 97, 0.0),
        (16, 64, 9 * 13, 5.0),
        (4, 8, 1, 0.0),
    ] {
        let mut rng = Rng(7);
        let x: Vec<f32> = rng
            .vec(2 * n * c * hw)
            .iter()
            .map(|v| 2.0 * v + offset)
            .collect();
        let dy = rng.vec(2 * n * c * hw);
        let mut one = gpu(Precision::F32, Kind::Pinned).unwrap();
        let whole = bn_layer(&mut one, &x, &dy, 2 * n, c, hw);
        let half = n * c * hw;
        let world = host::world(2);
        let parts: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
            let hs: Vec<_> = world
                .into_iter()
                .enumerate()
                .map(|(r, rank)| {
                    let (x, dy) = (&x[r * half..(r + 1) * half], &dy[r * half..(r + 1) * half]);
                    s.spawn(move || {
                        let mut g = Cuda::new(0, Precision::F32, Kind::Pinned).unwrap();
                        g.set_sync_bn(true);
                        g.join_host_world(rank);
                        bn_layer(&mut g, x, dy, n, c, hw)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (i, name) in names.iter().enumerate() {
            let joined: Vec<f32> = match *name {
                "y" | "dx" => [&parts[0][i][..], &parts[1][i][..]].concat(),
                "dgamma" | "dbeta" => parts[0][i]
                    .iter()
                    .zip(&parts[1][i])
                    .map(|(a, b)| a + b)
                    .collect(),
                _ => {
                    assert_eq!(parts[0][i], parts[1][i], "{name}: the ranks differ");
                    parts[0][i].clone()
                }
            };
            let e = rel(&joined, &whole[i]);
            eprintln!("2 x {n} rows of {c} channels x {hw}, offset {offset}: {name} {e:.2e}");
            if e > 1e-5 {
                failed.push(format!(
                    "{n} x {c} x {hw} offset {offset}: {name} off by {e:.2e}"
                ));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
