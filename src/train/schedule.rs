//! The learning rate over the run (one-cycle) and each batch's augmentation.

use super::recipe::Recipe;
use super::*;

/// One-cycle: linear warm-up from lr/25 over the first 25% of steps, then linear decay to 0.
pub fn one_cycle(step: usize, total: usize, lr: f32) -> f32 {
    let total = total.max(1) as f32;
    let warm = (0.25 * total).max(1.0);
    let s = step as f32;
    if s < warm {
        lr * (0.04 + 0.96 * s / warm)
    } else {
        lr * (1.0 - (s - warm) / (total - warm).max(1.0)).max(0.0)
    }
}

/// Per-sample augmentation for sample `i` of batch `b` of `epoch`: a pure function of the seed.
pub(crate) fn augmentation(r: &Recipe, epoch: usize, b: usize, n: usize) -> Vec<Aug> {
    (0..n)
        .map(|i| {
            let h = mix(r.seed ^ mix((epoch as u64) << 40 ^ (b as u64) << 16 ^ i as u64 ^ 0x5151));
            let span = 2 * r.crop_pad as u64 + 1;
            Aug {
                dy: (h % span) as u8,
                dx: ((h >> 16) % span) as u8,
                flip: r.flip && (h >> 32) & 1 == 1,
            }
        })
        .collect()
}
