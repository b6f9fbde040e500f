//! Batches of an epoch: blocks decoded ahead by worker threads within a bounded window, damaged
//! blocks skipped or stopping the run.

use super::order::{block_order, permutation, Share};
use super::source::Source;
use super::*;
use crate::format::fields::Fields;
use std::sync::mpsc::SyncSender;

/// A batch of raw samples.
pub struct Batch {
    pub pixels: Vec<u8>,
    pub labels: Vec<u32>,
    /// Each declared field's values for the batch's samples in order (`n * bytes` each), in
    /// the dataset's order of fields; empty for a dataset without fields.
    pub fields: Vec<Vec<u8>>,
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

    /// Where pixel buffers go back from owners that outlive a borrow of the loader (Python's
    /// arrays, freed whenever the caller lets go of them); a send after the epoch ended fails and
    /// the buffer is simply freed.
    pub fn recycler(&self) -> std::sync::mpsc::Sender<Vec<u8>> {
        self.recycle.clone()
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
    let plan = EpochPlan {
        batch: plan.batch.max(1),
        ..plan
    };
    let body = move || stream_epoch(&src, plan, on_damage, workers, &damaged, tx, returned);
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

/// Decode the blocks of `plan`'s share in order and send its batches on `tx`, then the error
/// that stopped it, if any.
fn stream_epoch(
    src: &Source,
    plan: EpochPlan,
    on_damage: OnDamage,
    workers: usize,
    damaged: &std::sync::Mutex<Vec<String>>,
    tx: SyncSender<Result<Batch>>,
    returned: Receiver<Vec<u8>>,
) {
    let EpochPlan {
        batch,
        seed,
        epoch,
        start,
        shuffle,
        ..
    } = plan;
    let order = plan
        .share
        .blocks(&block_order(src.num_blocks(), seed, epoch, shuffle));
    let nb = order.len();
    let sb = src.spec.bytes();
    let (w0, mut skip) = skip_windows(src, &order, start * batch);
    let first_block = w0 * WINDOW_BLOCKS;
    let todo = &order[first_block..];
    let mut out = Batcher::new(plan, sb, src.fields.clone(), tx, returned);
    let mut window: Vec<Block> = Vec::new();
    let mut wi = w0;
    // The buffers of blocks already batched, decoded into again: no more of them than blocks
    // alive at once (the lookahead and one window).
    let spare = Mutex::new(Vec::<Vec<u8>>::new());
    let biggest = src.sizes.iter().copied().max().unwrap_or(1) * sb;
    let (threads, ahead) = if src.remote {
        remote_lookahead(biggest)
    } else {
        let ahead = lookahead_blocks(biggest, workers);
        (workers.min(ahead), ahead)
    };
    let r = ordered_map(
        todo.len(),
        threads,
        ahead,
        |i| {
            let buf = spare.lock().unwrap().pop().unwrap_or_default();
            Ok::<_, Error>(src.read_into(todo[i], buf))
        },
        |i, block| {
            keep_block(block, &mut window, on_damage, damaged)?;
            let pos = first_block + i + 1;
            if pos % WINDOW_BLOCKS == 0 || pos == nb {
                if !out.flush_window(&mut window, wi, &mut skip, &spare) {
                    return Err(Error::Invalid("stopped".into()));
                }
                wi += 1;
            }
            Ok(())
        },
    );
    out.end(r);
}

/// Threads and blocks ahead for a source over a network: enough reads in flight to hide tens of
/// milliseconds of latency per request (each thread waits on its request, then decodes), within
/// `REMOTE_LOOKAHEAD_BYTES` of decoded blocks.
fn remote_lookahead(block_bytes: usize) -> (usize, usize) {
    let ahead = (REMOTE_LOOKAHEAD_BYTES / block_bytes.max(1)).clamp(4, REMOTE_READS);
    (ahead, ahead)
}

/// Block reads in flight at most from a store over a network, and the decoded bytes they may hold.
const REMOTE_READS: usize = 64;
const REMOTE_LOOKAHEAD_BYTES: usize = 384 << 20;

/// Skip whole windows before the resume point (`skip` samples in) without decoding them: the
/// first window to decode, and the samples left to skip from it.
fn skip_windows(src: &Source, order: &[usize], mut skip: usize) -> (usize, usize) {
    let nb = order.len();
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
    (w0, skip)
}

/// Add a decoded block to the window; a damaged one is skipped or stops the epoch.
fn keep_block(
    block: Result<Block>,
    window: &mut Vec<Block>,
    on_damage: OnDamage,
    damaged: &std::sync::Mutex<Vec<String>>,
) -> Result<()> {
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
    Ok(())
}

/// The open batch of an epoch, and where finished batches go.
struct Batcher {
    plan: EpochPlan,
    sb: usize,
    tx: SyncSender<Result<Batch>>,
    returned: Receiver<Vec<u8>>,
    /// The open batch: its pixel buffer is always a whole batch long (a handed-back one, or a
    /// new one), and `labels` counts the samples in it.
    pixels: Vec<u8>,
    labels: Vec<u32>,
    /// The source's fields, and the open batch's values of each.
    fields: Fields,
    field_values: Vec<Vec<u8>>,
    index: usize,
}

impl Batcher {
    /// An empty batch, numbered `plan.start`.
    fn new(
        plan: EpochPlan,
        sb: usize,
        fields: Fields,
        tx: SyncSender<Result<Batch>>,
        returned: Receiver<Vec<u8>>,
    ) -> Batcher {
        let mut b = Batcher {
            plan,
            sb,
            tx,
            returned,
            pixels: Vec::new(),
            labels: Vec::with_capacity(plan.batch),
            field_values: vec![Vec::new(); fields.0.len()],
            fields,
            index: plan.start,
        };
        b.pixels = b.fresh();
        b
    }

    /// A pixel buffer a whole batch long: a handed-back one, or a new one.
    fn fresh(&self) -> Vec<u8> {
        let mut b = self.returned.try_recv().unwrap_or_default();
        b.resize(self.plan.batch * self.sb, 0);
        b
    }

    /// Send the open batch and open the next; false once the receiver is gone.
    fn emit(&mut self) -> bool {
        let next = self.fresh();
        let mut px = std::mem::replace(&mut self.pixels, next);
        px.truncate(self.labels.len() * self.sb);
        let b = Batch {
            pixels: px,
            labels: std::mem::take(&mut self.labels),
            fields: self.field_values.iter_mut().map(std::mem::take).collect(),
            index: self.index,
        };
        self.index += 1;
        self.tx.send(Ok(b)).is_ok()
    }

    /// Batch the samples of window `wi` (shuffled in training order), past the `skip` left;
    /// false once the receiver is gone.
    fn flush_window(
        &mut self,
        window: &mut Vec<Block>,
        wi: usize,
        skip: &mut usize,
        spare: &Mutex<Vec<Vec<u8>>>,
    ) -> bool {
        let EpochPlan {
            batch,
            seed,
            epoch,
            shuffle,
            share,
            ..
        } = self.plan;
        let sb = self.sb;
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
            let n = (batch - self.labels.len()).min(idx.len() - k);
            let at = self.labels.len() * sb;
            self.pixels[at..at + n * sb]
                .par_chunks_mut(sb)
                .zip(idx[k..k + n].par_iter())
                .with_min_len(((1 << 20) / sb).max(16))
                .for_each(|(d, &(b, i))| d.copy_from_slice(window[b].sample(i)));
            self.labels
                .extend(idx[k..k + n].iter().map(|&(b, i)| window[b].label(i)));
            for (f, out) in self.field_values.iter_mut().enumerate() {
                for &(b, i) in &idx[k..k + n] {
                    out.extend_from_slice(window[b].field(&self.fields, f, i));
                }
            }
            k += n;
            if self.labels.len() == batch && !self.emit() {
                return false;
            }
        }
        spare
            .lock()
            .unwrap()
            .extend(window.drain(..).map(Block::into_data));
        true
    }

    /// End the epoch as `r` ended it: send its error, or the partial batch where it is kept.
    fn end(&mut self, r: Result<()>) {
        match r {
            Err(Error::Invalid(s)) if s == "stopped" => {}
            Err(e) => {
                let _ = self.tx.send(Err(e));
            }
            Ok(()) => {
                if self.plan.keep_partial && !self.labels.is_empty() {
                    self.emit();
                }
            }
        }
    }
}

/// Batches per epoch when the partial batch is dropped.
pub fn batches_per_epoch(samples: usize, batch: usize) -> usize {
    samples / batch
}
