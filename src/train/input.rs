//! The training input pipeline: a seeded permutation of blocks, shuffling within a window of
//! blocks, blocks decoded ahead on worker threads with a bounded lookahead, batches handed to the
//! training loop through a bounded channel. Host memory is bounded by the lookahead, not the
//! dataset; the order is a pure function of (seed, epoch), so a run resumes mid-epoch from a
//! cursor of (epoch, batches done).

use crate::error::{Error, Result};
use crate::pipeline::ordered_map;
use crate::shard::{Block, Dataset, SampleSpec, ShardReader};
use rayon::prelude::*;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Mutex};

/// Blocks shuffled together: samples of this many blocks are mixed before batching.
pub const WINDOW_BLOCKS: usize = 8;

/// Decoded bytes the lookahead may hold whatever the number of cores (32 blocks of 3x32x32 u8):
/// on a 128-core host two blocks per worker would hold over 1 GiB.
pub const LOOKAHEAD_BYTES: usize = 96 << 20;

/// Blocks decoded ahead of the consumer: two per worker, at most `LOOKAHEAD_BYTES` of them.
pub fn lookahead_blocks(block_bytes: usize, workers: usize) -> usize {
    (LOOKAHEAD_BYTES / block_bytes.max(1)).clamp(2, 2 * workers.max(2))
}

/// One split of a dataset, open for reading.
pub struct Source {
    pub spec: SampleSpec,
    pub classes: usize,
    readers: Vec<ShardReader>,
    /// (reader, block, samples) of every block, in file order.
    blocks: Vec<(usize, usize, usize)>,
    pub samples: usize,
}

impl Source {
    pub fn open(ds: &Dataset, split: &str) -> Result<Arc<Self>> {
        let info = ds.manifest.splits.get(split).ok_or_else(|| {
            Error::Invalid(format!(
                "{}: the dataset has no '{split}' split (it has: {})",
                ds.dir.display(),
                ds.manifest
                    .splits
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        let mut readers = Vec::new();
        let mut blocks = Vec::new();
        for sh in &info.shards {
            let r = ds.open_shard(sh)?;
            for b in 0..r.num_blocks() {
                blocks.push((readers.len(), b, r.entry(b).num_samples as usize));
            }
            readers.push(r);
        }
        Ok(Arc::new(Source {
            spec: ds.manifest.sample.clone(),
            classes: ds.manifest.classes.len(),
            samples: blocks.iter().map(|b| b.2).sum(),
            readers,
            blocks,
        }))
    }

    pub fn read(&self, i: usize) -> Result<Block> {
        self.read_into(i, Vec::new())
    }

    /// `read` into a reused buffer (`ShardReader::read_block_into`).
    pub fn read_into(&self, i: usize, buf: Vec<u8>) -> Result<Block> {
        let (r, b, _) = self.blocks[i];
        self.readers[r].read_block_into(b, buf)
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Samples in each block, in file order.
    pub fn block_sizes(&self) -> Vec<usize> {
        self.blocks.iter().map(|b| b.2).collect()
    }
}

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

    /// The key of this share's window `wi` (the shuffle within it): `wi` itself for `ALL`.
    fn window_key(self, seed: u64, epoch: usize, wi: usize) -> u64 {
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

fn permutation(n: usize, key: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut s = key;
    for i in (1..n).rev() {
        s = mix(s);
        let j = ((s as u128 * (i as u128 + 1)) >> 64) as usize;
        v.swap(i, j);
    }
    v
}

/// A batch of raw samples.
pub struct Batch {
    pub pixels: Vec<u8>,
    pub labels: Vec<u32>,
    /// Index of this batch in its epoch.
    pub index: usize,
}

/// What to do with a damaged block met while training.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDamage {
    Stop,
    /// Skip it, with a warning on stderr.
    Skip,
    /// Skip it and only record it (for callers that report it their own way, as Python does).
    SkipQuietly,
}

/// Stream the batches of one epoch, from batch `start` on. Training order: blocks permuted by
/// (seed, epoch), samples shuffled within each window of `WINDOW_BLOCKS` blocks; the last partial
/// batch is dropped. With `shuffle` false (evaluation), file order and the partial batch is kept.
pub struct Loader {
    pub rx: Receiver<Result<Batch>>,
    /// Pixel buffers handed back for reuse: a fresh megabyte-sized buffer per batch costs page
    /// faults on every batch (measured: the stream fell 6% behind the GPU-resident input).
    recycle: std::sync::mpsc::Sender<Vec<u8>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Loader {
    /// Return a batch's pixel buffer once its contents are no longer needed.
    pub fn give_back(&self, pixels: Vec<u8>) {
        let _ = self.recycle.send(pixels);
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        // Dropping the receiver makes the producer's next send fail; then wait for it.
        let (_, dead) = sync_channel(0);
        let rx = std::mem::replace(&mut self.rx, dead);
        drop(rx);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub fn epoch(
    src: Arc<Source>,
    batch: usize,
    seed: u64,
    epoch: usize,
    start: usize,
    shuffle: bool,
    on_damage: OnDamage,
    workers: usize,
    damaged: Arc<std::sync::Mutex<Vec<String>>>,
) -> Loader {
    epoch_share(
        src,
        EpochPlan {
            batch,
            seed,
            epoch,
            start,
            shuffle,
            keep_partial: !shuffle,
            share: Share::ALL,
        },
        on_damage,
        workers,
        None,
        damaged,
    )
}

/// What one reader streams of an epoch.
#[derive(Debug, Clone, Copy)]
pub struct EpochPlan {
    pub batch: usize,
    pub seed: u64,
    pub epoch: usize,
    /// Batches of this share already done (resume): they are skipped, whole windows without
    /// decoding them.
    pub start: usize,
    pub shuffle: bool,
    /// Emit the last, partial batch.
    pub keep_partial: bool,
    pub share: Share,
}

/// Stream share `plan.share` of an epoch (`epoch` is `Share::ALL` with the partial batch kept
/// only in file order). Samples are copied into batches on `pool` when given, else on rayon's
/// global pool (a process that forks after using the global pool leaves its children a pool
/// without threads: callers that may fork, as Python's DataLoader does, bring their own).
pub fn epoch_share(
    src: Arc<Source>,
    plan: EpochPlan,
    on_damage: OnDamage,
    workers: usize,
    pool: Option<Arc<rayon::ThreadPool>>,
    damaged: Arc<std::sync::Mutex<Vec<String>>>,
) -> Loader {
    let (tx, rx) = sync_channel::<Result<Batch>>(4);
    let (recycle, returned) = std::sync::mpsc::channel::<Vec<u8>>();
    let EpochPlan {
        batch,
        seed,
        epoch,
        start,
        shuffle,
        keep_partial,
        share,
    } = plan;
    let batch = batch.max(1);
    let body = move || {
        let order = share.blocks(&block_order(src.num_blocks(), seed, epoch, shuffle));
        let nb = order.len();
        let sb = src.spec.bytes();
        // Skip whole windows before the resume point without decoding them.
        let mut skip = start * batch;
        let mut w0 = 0;
        while w0 * WINDOW_BLOCKS < nb {
            let wsize: usize = order[w0 * WINDOW_BLOCKS..((w0 + 1) * WINDOW_BLOCKS).min(nb)]
                .iter()
                .map(|&b| src.blocks[b].2)
                .sum();
            if skip < wsize {
                break;
            }
            skip -= wsize;
            w0 += 1;
        }
        let first_block = w0 * WINDOW_BLOCKS;
        let todo = &order[first_block..];
        let mut index = start;
        // The open batch: its pixel buffer is always a whole batch long (a handed-back one, or a
        // new one), and `labels` counts the samples in it.
        let fresh = || {
            let mut b = returned.try_recv().unwrap_or_default();
            b.resize(batch * sb, 0);
            b
        };
        let mut pixels = fresh();
        let mut labels = Vec::with_capacity(batch);
        let mut window: Vec<Block> = Vec::new();
        let mut wi = w0;
        let emit = |pixels: &mut Vec<u8>, labels: &mut Vec<u32>, index: &mut usize| -> bool {
            let mut px = std::mem::replace(pixels, fresh());
            px.truncate(labels.len() * sb);
            let b = Batch {
                pixels: px,
                labels: std::mem::take(labels),
                index: *index,
            };
            *index += 1;
            tx.send(Ok(b)).is_ok()
        };
        // The buffers of blocks already batched, decoded into again: no more of them than blocks
        // alive at once (the lookahead and one window).
        let spare = Mutex::new(Vec::<Vec<u8>>::new());
        let flush_window = |window: &mut Vec<Block>,
                            wi: usize,
                            skip: &mut usize,
                            pixels: &mut Vec<u8>,
                            labels: &mut Vec<u32>,
                            index: &mut usize|
         -> bool {
            let mut idx: Vec<(usize, usize)> = window
                .iter()
                .enumerate()
                .flat_map(|(b, bl)| (0..bl.len()).map(move |i| (b, i)))
                .collect();
            if shuffle {
                let p = permutation(idx.len(), share.window_key(seed, epoch, wi));
                idx = p.into_iter().map(|i| idx[i]).collect();
            }
            // What is left to skip after whole windows (more than this window only when a
            // damaged block was skipped from it).
            let s = (*skip).min(idx.len());
            *skip -= s;
            let idx = &idx[s..];
            // Into the open batch as many as it takes, the samples copied on every core (one
            // thread copying them fell behind the GPU at 3x224x224), at least a megabyte per task
            // (small samples split finer cost more in hand-offs than the copy).
            let mut k = 0;
            while k < idx.len() {
                let n = (batch - labels.len()).min(idx.len() - k);
                let at = labels.len() * sb;
                pixels[at..at + n * sb]
                    .par_chunks_mut(sb)
                    .zip(idx[k..k + n].par_iter())
                    .with_min_len(((1 << 20) / sb).max(16))
                    .for_each(|(d, &(b, i))| d.copy_from_slice(window[b].sample(i)));
                labels.extend(idx[k..k + n].iter().map(|&(b, i)| window[b].label(i)));
                k += n;
                if labels.len() == batch && !emit(pixels, labels, index) {
                    return false;
                }
            }
            spare
                .lock()
                .unwrap()
                .extend(window.drain(..).map(Block::into_data));
            true
        };
        let biggest = src.blocks.iter().map(|b| b.2).max().unwrap_or(1) * sb;
        let ahead = lookahead_blocks(biggest, workers);
        let r = ordered_map(
            todo.len(),
            workers.min(ahead),
            ahead,
            |i| {
                let buf = spare.lock().unwrap().pop().unwrap_or_default();
                Ok::<_, Error>(src.read_into(todo[i], buf))
            },
            |i, block| {
                match block {
                    Ok(b) => window.push(b),
                    Err(e) if on_damage != OnDamage::Stop => {
                        if on_damage == OnDamage::Skip {
                            eprintln!("warning: skipping damaged block: {e}");
                        }
                        damaged.lock().unwrap().push(e.to_string());
                    }
                    Err(e) => return Err(e),
                }
                let pos = first_block + i + 1;
                if pos % WINDOW_BLOCKS == 0 || pos == nb {
                    if !flush_window(
                        &mut window,
                        wi,
                        &mut skip,
                        &mut pixels,
                        &mut labels,
                        &mut index,
                    ) {
                        return Err(Error::Invalid("stopped".into()));
                    }
                    wi += 1;
                }
                Ok(())
            },
        );
        match r {
            Err(Error::Invalid(s)) if s == "stopped" => {}
            Err(e) => {
                let _ = tx.send(Err(e));
            }
            Ok(()) => {
                if keep_partial && !labels.is_empty() {
                    emit(&mut pixels, &mut labels, &mut index);
                }
            }
        }
    };
    let handle = std::thread::spawn(move || match pool {
        Some(p) => p.install(body),
        None => body(),
    });
    Loader {
        rx,
        recycle,
        handle: Some(handle),
    }
}

/// Batches per epoch when the partial batch is dropped.
pub fn batches_per_epoch(samples: usize, batch: usize) -> usize {
    samples / batch
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Host memory of the lookahead does not grow with the core count past its budget, and a
    /// small machine still decodes ahead.
    #[test]
    fn lookahead_is_bounded_in_bytes_not_by_cores() {
        let block = 1024 * 3 * 32 * 32; // the default block of 3x32x32 u8
        assert_eq!(lookahead_blocks(block, 2), 4);
        assert_eq!(lookahead_blocks(block, 16), 32);
        for cores in [64, 128, 1024] {
            let n = lookahead_blocks(block, cores);
            assert!(n * block <= LOOKAHEAD_BYTES, "{cores} cores: {n} blocks");
        }
        // A block bigger than the budget: still two, so decoding overlaps consumption.
        assert_eq!(lookahead_blocks(1 << 30, 128), 2);
    }

    /// `epoch_order` (the GPU-resident input) walks the samples in the order `epoch` streams them.
    #[test]
    fn epoch_order_is_the_streamed_order() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("ds");
        crate::synth::test_dataset(&out, 3000, "1x6x6");
        let ds = Dataset::open(&out).unwrap();
        let src = Source::open(&ds, "train").unwrap();
        // Every sample in file order.
        let mut all: Vec<(Vec<u8>, u32)> = Vec::new();
        for b in 0..src.num_blocks() {
            let bl = src.read(b).unwrap();
            all.extend((0..bl.len()).map(|i| (bl.sample(i).to_vec(), bl.label(i))));
        }
        let sizes = src.block_sizes();
        for (epoch, start) in [(0, 0), (3, 7)] {
            let order = epoch_order(&sizes, &vec![true; sizes.len()], 42, epoch);
            assert_eq!(order.len(), 3000);
            let loader = super::epoch(
                src.clone(),
                32,
                42,
                epoch,
                start,
                true,
                OnDamage::Stop,
                2,
                Arc::new(std::sync::Mutex::new(Vec::new())),
            );
            let mut k = start * 32;
            for b in loader.rx.iter() {
                let b = b.unwrap();
                for (i, &l) in b.labels.iter().enumerate() {
                    let (px, lab) = &all[order[k] as usize];
                    assert_eq!((&b.pixels[i * 36..(i + 1) * 36], l), (px.as_slice(), *lab));
                    k += 1;
                }
            }
            assert_eq!(k, 3000 / 32 * 32);
        }
    }

    /// Every share streams the samples in `share_order`, from any resume point, in shuffled and
    /// file order; the shares of an epoch together hold every sample exactly once.
    #[test]
    fn shares_are_disjoint_complete_and_resumable() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("ds");
        crate::synth::test_dataset(&out, 3000, "1x6x6");
        let ds = Dataset::open(&out).unwrap();
        let src = Source::open(&ds, "train").unwrap();
        let mut all: Vec<(Vec<u8>, u32)> = Vec::new();
        for b in 0..src.num_blocks() {
            let bl = src.read(b).unwrap();
            all.extend((0..bl.len()).map(|i| (bl.sample(i).to_vec(), bl.label(i))));
        }
        let sizes = src.block_sizes();
        let present = vec![true; sizes.len()];
        let pool = Arc::new(
            rayon::ThreadPoolBuilder::new()
                .num_threads(2)
                .build()
                .unwrap(),
        );
        for shuffle in [true, false] {
            for count in [1, 2, 3, 5] {
                let mut seen = vec![0u32; 3000];
                for index in 0..count {
                    let share = Share::new(index, count).unwrap();
                    let order = share_order(&sizes, &present, 7, 2, shuffle, share);
                    assert_eq!(order.len(), share_samples(&sizes, 7, 2, shuffle, share));
                    for &i in &order {
                        seen[i as usize] += 1;
                    }
                    // From the start, and from a batch past the first window.
                    for start in [0, 9] {
                        let loader = epoch_share(
                            src.clone(),
                            EpochPlan {
                                batch: 20,
                                seed: 7,
                                epoch: 2,
                                start,
                                shuffle,
                                keep_partial: true,
                                share,
                            },
                            OnDamage::Stop,
                            2,
                            Some(pool.clone()),
                            Arc::new(Mutex::new(Vec::new())),
                        );
                        let mut k = start * 20;
                        let mut index = start;
                        for b in loader.rx.iter() {
                            let b = b.unwrap();
                            assert_eq!(b.index, index);
                            index += 1;
                            for (i, &l) in b.labels.iter().enumerate() {
                                let (px, lab) = &all[order[k] as usize];
                                assert_eq!(
                                    (&b.pixels[i * 36..(i + 1) * 36], l),
                                    (px.as_slice(), *lab)
                                );
                                k += 1;
                            }
                        }
                        assert_eq!(k, order.len().max(start * 20), "{count} {index} {start}");
                    }
                }
                assert!(
                    seen.iter().all(|&n| n == 1),
                    "{count} shares, shuffle {shuffle}"
                );
            }
        }
        // One share is the whole epoch in `prep train`'s order.
        assert_eq!(
            share_order(&sizes, &present, 7, 2, true, Share::ALL),
            epoch_order(&sizes, &present, 7, 2)
        );
        assert!(Share::new(2, 2).is_err() && Share::new(0, 0).is_err());
    }

    #[test]
    fn permutations_are_seeded_and_complete() {
        let a = permutation(1000, 5);
        let mut s = a.clone();
        s.sort();
        assert_eq!(s, (0..1000).collect::<Vec<_>>());
        assert_eq!(a, permutation(1000, 5));
        assert_ne!(a, permutation(1000, 6));
    }
}
