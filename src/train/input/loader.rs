//! Batches of an epoch: blocks decoded ahead by worker threads within a bounded window, damaged
//! blocks skipped or stopping the run.

use super::order::{block_order, permutation, Share};
use super::source::Source;
use super::*;

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
                .map(|&b| src.sizes[b])
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
        let biggest = src.sizes.iter().copied().max().unwrap_or(1) * sb;
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
