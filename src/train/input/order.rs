//! The seeded order of an epoch: blocks shuffled, each rank's disjoint share, batches per rank.

use super::*;

/// The training order of one epoch as indices into the split's samples in file order: exactly
/// the order `epoch` streams them (blocks permuted, samples shuffled within each window), for
/// inputs that hold the whole split in memory. Blocks with `present[b]` false are left out, as a
/// skipped damaged block is.
pub fn epoch_order(sizes: &[usize], present: &[bool], seed: u64, epoch: usize) -> Vec<u32> {
    share_order(sizes, present, seed, epoch, true, Share::ALL)
}

/// Which part of an epoch one reader takes: share `index` of `count` (a data-parallel rank, or a
/// rank's DataLoader worker: `rank * workers + worker` of `world * workers`). The epoch's block
/// order is dealt out like cards, block `order[p]` going to share `p % count`; each share then
/// shuffles within windows of its own blocks and cuts its own batches. The shares are disjoint
/// and together hold every block of the epoch, so every sample is read once; each block is
/// decoded by one share only. `Share::ALL` is the one-reader epoch that `prep train` streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    pub index: usize,
    pub count: usize,
}

impl Share {
    pub const ALL: Share = Share { index: 0, count: 1 };

    pub fn new(index: usize, count: usize) -> Result<Self> {
        if count == 0 || index >= count {
            return Err(Error::Invalid(format!(
                "share {index} of {count}: the index must be below the count, which must be at least 1"
            )));
        }
        Ok(Share { index, count })
    }

    /// The blocks of this share, in the order it reads them.
    pub fn blocks(self, order: &[usize]) -> Vec<usize> {
        order
            .iter()
            .skip(self.index)
            .step_by(self.count)
            .copied()
            .collect()
    }

    /// The number by which batch `b` of this share draws its augmentation: `b` itself for
    /// `ALL`; interleaved for ranks, so that no two ranks crop and flip alike.
    pub fn batch_key(self, b: usize) -> usize {
        b * self.count + self.index
    }

    /// The key of this share's window `wi` (the shuffle within it): `wi` itself for `ALL`.
    pub(super) fn window_key(self, seed: u64, epoch: usize, wi: usize) -> u64 {
        let w = (wi * self.count + self.index) as u64;
        mix(seed ^ mix(epoch as u64 + 1) ^ mix(0xABCD ^ w))
    }
}

/// The order of the blocks in an epoch: permuted by (seed, epoch) when shuffling, else file order.
pub fn block_order(num_blocks: usize, seed: u64, epoch: usize, shuffle: bool) -> Vec<usize> {
    if shuffle {
        permutation(num_blocks, mix(seed ^ mix(epoch as u64 + 1)))
    } else {
        (0..num_blocks).collect()
    }
}

/// Samples a share of an epoch holds (before any damaged block is skipped): its batches are this
/// divided by the batch size, rounded down when the partial batch is dropped, up when it is kept.
pub fn share_samples(
    sizes: &[usize],
    seed: u64,
    epoch: usize,
    shuffle: bool,
    share: Share,
) -> usize {
    share
        .blocks(&block_order(sizes.len(), seed, epoch, shuffle))
        .iter()
        .map(|&b| sizes[b])
        .sum()
}

/// Batches per epoch that every one of `world` ranks takes in a data-parallel run. Each rank
/// reads share `rank` of `world` of the epoch (`Share`); the shares differ by up to a block, and
/// by epoch, but NCCL needs every rank to make the same number of steps. A share always holds at
/// least `num_blocks / world` blocks, so it holds at least the samples of that many of the
/// smallest blocks: that, cut into whole batches, is the count, the same for every rank and every
/// epoch. What a share holds beyond it (less than a block and a batch) is not trained on in that
/// epoch, as a one-GPU run drops its last partial batch; the next epoch deals the blocks anew.
/// With `world` 1 this is `batches_per_epoch` of the whole split.
pub fn rank_batches(sizes: &[usize], world: usize, batch: usize) -> usize {
    let world = world.max(1);
    let mut s = sizes.to_vec();
    s.sort_unstable();
    let guaranteed: usize = s[..sizes.len() / world].iter().sum();
    guaranteed / batch.max(1)
}

/// The order in which share `share` of an epoch streams the samples (`epoch_share`), as indices
/// into the split's samples in file order. Blocks with `present[b]` false are left out.
pub fn share_order(
    sizes: &[usize],
    present: &[bool],
    seed: u64,
    epoch: usize,
    shuffle: bool,
    share: Share,
) -> Vec<u32> {
    let mut starts = Vec::with_capacity(sizes.len());
    let mut acc = 0usize;
    for &s in sizes {
        starts.push(acc);
        acc += s;
    }
    let seq = share.blocks(&block_order(sizes.len(), seed, epoch, shuffle));
    let mut out = Vec::new();
    for (wi, win) in seq.chunks(WINDOW_BLOCKS).enumerate() {
        let idx: Vec<u32> = win
            .iter()
            .filter(|&&b| present[b])
            .flat_map(|&b| (starts[b]..starts[b] + sizes[b]).map(|i| i as u32))
            .collect();
        if shuffle {
            let p = permutation(idx.len(), share.window_key(seed, epoch, wi));
            out.extend(p.into_iter().map(|i| idx[i]));
        } else {
            out.extend(idx);
        }
    }
    out
}

/// splitmix64 over a key: the seed of every random decision in training.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub(super) fn permutation(n: usize, key: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut s = key;
    for i in (1..n).rev() {
        s = mix(s);
        let j = ((s as u128 * (i as u128 + 1)) >> 64) as usize;
        v.swap(i, j);
    }
    v
}
