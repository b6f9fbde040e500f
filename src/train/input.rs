//! The training input pipeline: a seeded permutation of blocks, shuffling within a window of
//! blocks, blocks decoded ahead on worker threads with a bounded lookahead, batches handed to the
//! training loop through a bounded channel. Host memory is bounded by the lookahead, not the
//! dataset; the order is a pure function of (seed, epoch), so a run resumes mid-epoch from a
//! cursor of (epoch, batches done).

use crate::format::colmajor::{self, ColmajorManifest, ColmajorSplitReader};
use crate::format::shard::{manifest, Block, Dataset, Dtype, SampleSpec, Shape, ShardReader};
use crate::util::error::shown_path;
use crate::util::error::{Error, Region, Result};
use crate::util::pipeline::ordered_map;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
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

/// How a dataset directory stores its samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// prep shard files (`formats/shard.md`).
    #[default]
    Shards,
    /// float32 feature-major files (`formats/colmajor.md`), with or without prep's manifest.
    Colmajor,
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::Shards => "shards",
            Layout::Colmajor => "colmajor",
        }
    }
}

/// What a run already knows about its data (from its recipe), so that a column-major directory
/// without a manifest is not scanned again: the dtype its samples are read as, and the classes.
#[derive(Debug, Clone)]
pub struct Known {
    pub dtype: Dtype,
    pub classes: Vec<String>,
}

/// A dataset directory open for training or evaluation: prep shards, or the column-major layout
/// (memory-mapped, with or without prep's manifest).
pub struct Data {
    pub dir: PathBuf,
    pub layout: Layout,
    /// False for column-major files without prep's `manifest.json`.
    pub manifest: bool,
    /// Samples as training reads them. Column-major files are read as the manifest's dtype (the
    /// values the files hold are exactly those pixels); without a manifest as u8 when every
    /// value is a u8 pixel / 255, else f32.
    pub spec: SampleSpec,
    pub classes: Vec<String>,
    /// Per-channel mean and std of the training split (of value / divisor): the manifest's, or
    /// computed in one pass over a column-major directory without one; empty when `Known`.
    pub mean: Vec<f64>,
    pub std: Vec<f64>,
    /// How the data was read, for the log.
    pub notes: Vec<String>,
    inner: Inner,
}

enum Inner {
    Shards(Box<Dataset>),
    Colmajor(BTreeMap<String, Arc<ColmajorSplitReader>>),
}

impl Data {
    /// Open `dir`. `shape` is required for column-major files without a manifest (they do not
    /// say it) and otherwise must match the dataset's. `known` spares such a directory its pass
    /// over every value (dtype, classes, mean and std).
    pub fn open(dir: &Path, shape: Option<&Shape>, known: Option<Known>) -> Result<Self> {
        // Not a dataset another prep is writing (`crate::format::lock`).
        crate::format::lock::check_not_written(dir)?;
        let check_shape = |have: &Shape| match shape {
            Some(s) if s != have => Err(Error::Invalid(format!(
                "{}: its samples are {have}, not {s}",
                shown_path(&dir)
            ))),
            _ => Ok(()),
        };
        if dir.join(manifest::FILE_NAME).is_file() {
            if crate::format::dataset_format(dir)? == colmajor::FORMAT {
                let m = ColmajorManifest::read(dir)?;
                check_shape(&m.sample.shape)?;
                let mut splits = BTreeMap::new();
                for s in m.splits.keys() {
                    splits.insert(s.clone(), Arc::new(ColmajorSplitReader::open(dir, &m, s)?));
                }
                return Ok(Data {
                    dir: dir.to_path_buf(),
                    layout: Layout::Colmajor,
                    manifest: true,
                    notes: vec![format!(
                        "column-major files, memory-mapped (manifest.json: {} {})",
                        m.sample.dtype, m.sample.shape
                    )],
                    spec: m.sample,
                    classes: m.classes,
                    mean: m.mean,
                    std: m.std,
                    inner: Inner::Colmajor(splits),
                });
            }
            let ds = Dataset::open(dir)?;
            check_shape(&ds.manifest.sample.shape)?;
            let m = &ds.manifest;
            return Ok(Data {
                dir: dir.to_path_buf(),
                layout: Layout::Shards,
                manifest: true,
                spec: m.sample.clone(),
                classes: m.classes.clone(),
                mean: m.mean.clone(),
                std: m.std.clone(),
                notes: vec![],
                inner: Inner::Shards(Box::new(ds)),
            });
        }
        let found = if dir.is_dir() {
            colmajor::find_splits(dir)?
        } else {
            vec![]
        };
        if found.is_empty() {
            // The shard reader's own error names what is missing.
            Dataset::open(dir)?;
        }
        let shape = shape.ok_or_else(|| {
            Error::Invalid(format!(
                "{}: column-major files without manifest.json do not say their sample shape: give it with --shape CxHxW",
                shown_path(&dir)
            ))
        })?;
        let mut splits = BTreeMap::new();
        for (name, ip, lp) in &found {
            splits.insert(
                name.clone(),
                Arc::new(ColmajorSplitReader::open_files(ip, lp, shape)?),
            );
        }
        let mut notes = vec![format!(
            "column-major files without manifest.json, memory-mapped: {shape} samples from --shape"
        )];
        let (dtype, classes, mean, std) = match known {
            Some(k) => (k.dtype, k.classes, vec![], vec![]),
            None => {
                let mut counts = BTreeMap::new();
                let mut k = 1;
                for (name, r) in &splits {
                    let c = r.check_labels(None)?;
                    k = k.max(c.len());
                    counts.insert(name.clone(), c);
                }
                let mut scans = BTreeMap::new();
                for (name, r) in &splits {
                    scans.insert(name.clone(), r.scan(shape)?);
                }
                let not_u8 = splits
                    .iter()
                    .find_map(|(n, r)| scans[n].not_u8.map(|m| (r, m)));
                let dtype = match not_u8 {
                    None => {
                        notes.push("every value is a u8 pixel / 255: read as u8".into());
                        Dtype::U8
                    }
                    Some((r, (i, f, v))) => {
                        notes.push(format!(
                            "read as f32 ({} sample {i}, feature {f} holds {v}, not a u8 pixel / 255)",
                            shown_path(&r.images_path)
                        ));
                        Dtype::F32
                    }
                };
                let st = manifest::stats_split(splits.keys()).to_string();
                let mut cc = counts.remove(&st).unwrap_or_default();
                cc.resize(k, 0);
                let spec = SampleSpec {
                    shape: shape.clone(),
                    dtype,
                };
                let (mean, std) = scans[&st].stats(dtype, cc).mean_std(&spec);
                notes.push(format!(
                    "{k} classes (0 to {}) from the labels; mean and std of split {st} computed in one pass",
                    k - 1
                ));
                (dtype, (0..k).map(|c| c.to_string()).collect(), mean, std)
            }
        };
        let spec = SampleSpec {
            shape: shape.clone(),
            dtype,
        };
        spec.check()?;
        Ok(Data {
            dir: dir.to_path_buf(),
            layout: Layout::Colmajor,
            manifest: false,
            spec,
            classes,
            mean,
            std,
            notes,
            inner: Inner::Colmajor(splits),
        })
    }

    pub fn has_split(&self, split: &str) -> bool {
        match &self.inner {
            Inner::Shards(ds) => ds.manifest.splits.contains_key(split),
            Inner::Colmajor(m) => m.contains_key(split),
        }
    }

    /// One split, open for reading.
    pub fn source(&self, split: &str) -> Result<Arc<Source>> {
        match &self.inner {
            Inner::Shards(ds) => Source::open(ds, split),
            Inner::Colmajor(m) => {
                let r = m.get(split).ok_or_else(|| {
                    Error::Invalid(format!(
                        "{}: the dataset has no '{split}' split (it has: {})",
                        shown_path(&self.dir),
                        m.keys().cloned().collect::<Vec<_>>().join(", ")
                    ))
                })?;
                Ok(Arc::new(Source::colmajor(
                    r.clone(),
                    self.spec.clone(),
                    self.classes.len(),
                )))
            }
        }
    }
}

/// One split of a dataset, open for reading in blocks: a shard dataset's blocks, or virtual
/// blocks of a fixed number of samples of a column-major split (as many as a shard block of
/// these samples holds by default, so that the order of a seed is the same for a colmajor
/// directory and its conversion to shards).
pub struct Source {
    pub spec: SampleSpec,
    pub classes: usize,
    pub samples: usize,
    /// Samples of every block, in file order.
    sizes: Vec<usize>,
    from: From,
}

enum From {
    Shards {
        readers: Vec<ShardReader>,
        /// (reader, block) of every block, in file order.
        blocks: Vec<(usize, usize)>,
    },
    /// Block `i` is samples `i * block ..` of the split.
    Colmajor {
        reader: Arc<ColmajorSplitReader>,
        block: usize,
    },
}

/// float32 values gathered at a time when reading a column-major block (1 MiB), so that the
/// scratch memory of a reading thread does not grow with the block.
const GATHER_VALUES: usize = 1 << 18;

impl Source {
    pub fn open(ds: &Dataset, split: &str) -> Result<Arc<Self>> {
        let info = ds.manifest.splits.get(split).ok_or_else(|| {
            Error::Invalid(format!(
                "{}: the dataset has no '{split}' split (it has: {})",
                shown_path(&ds.dir),
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
        let mut sizes = Vec::new();
        for sh in &info.shards {
            let r = ds.open_shard(sh)?;
            for b in 0..r.num_blocks() {
                blocks.push((readers.len(), b));
                sizes.push(r.entry(b).num_samples as usize);
            }
            readers.push(r);
        }
        Ok(Arc::new(Source {
            spec: ds.manifest.sample.clone(),
            classes: ds.manifest.classes.len(),
            samples: sizes.iter().sum(),
            sizes,
            from: From::Shards { readers, blocks },
        }))
    }

    /// A column-major split read as `spec` samples (their values must be exactly values of its
    /// dtype), labels in `0..classes`.
    pub fn colmajor(reader: Arc<ColmajorSplitReader>, spec: SampleSpec, classes: usize) -> Self {
        let block = crate::format::shard::default_block_samples(spec.bytes()) as usize;
        let n = reader.samples;
        let sizes = (0..n).step_by(block).map(|s| block.min(n - s)).collect();
        Source {
            spec,
            classes,
            samples: n,
            sizes,
            from: From::Colmajor { reader, block },
        }
    }

    pub fn read(&self, i: usize) -> Result<Block> {
        self.read_into(i, Vec::new())
    }

    /// `read` into a reused buffer (`ShardReader::read_block_into`).
    pub fn read_into(&self, i: usize, buf: Vec<u8>) -> Result<Block> {
        match &self.from {
            From::Shards { readers, blocks } => {
                let (r, b) = blocks[i];
                readers[r].read_block_into(b, buf)
            }
            From::Colmajor { reader, block } => self.read_colmajor(reader, i * block, i, buf),
        }
    }

    /// Samples `start..` of block `i`, gathered feature by feature and checked: each value must
    /// be exactly a value of the dtype read (a u8 pixel / 255 for u8), each label a class.
    fn read_colmajor(
        &self,
        r: &ColmajorSplitReader,
        start: usize,
        i: usize,
        buf: Vec<u8>,
    ) -> Result<Block> {
        thread_local! {
            static VALUES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let (m, f, dtype) = (self.sizes[i], r.features, self.spec.dtype);
        let sb = self.spec.bytes();
        let mut b = Block::reuse(buf, m, sb);
        let step = (GATHER_VALUES / f.max(1)).max(1);
        VALUES.with(|v| -> Result<()> {
            let mut v = v.borrow_mut();
            for s0 in (0..m).step_by(step) {
                let ms = step.min(m - s0);
                v.resize(ms * f, 0.0);
                r.read_chunk(start + s0, ms, &mut v);
                let px = &mut b.pixels_mut()[s0 * sb..(s0 + ms) * sb];
                colmajor::encode_exact(&v, dtype, px).map_err(|(k, val)| {
                    Error::corrupt(
                        &r.images_path,
                        Region::File,
                        format!(
                            "sample {}, feature {}: value {val} is not {}",
                            start + s0 + k / f,
                            k % f,
                            match dtype {
                                Dtype::U8 => "a u8 pixel / 255, as the dataset's dtype u8 says",
                                Dtype::U16 =>
                                    "a u16 pixel / 65535, as the dataset's dtype u16 says",
                                Dtype::F16 => "an f16 value, as the dataset's dtype f16 says",
                                Dtype::F32 => "finite",
                            }
                        ),
                    )
                })?;
            }
            Ok(())
        })?;
        let k = self.classes;
        for (j, l) in r.labels(start, m).enumerate() {
            if l < 0 || l as usize >= k {
                return Err(Error::corrupt(
                    &r.labels_path,
                    Region::File,
                    format!(
                        "label {l} at index {} is not a class (there are {k}: 0 to {})",
                        start + j,
                        k.saturating_sub(1)
                    ),
                ));
            }
            b.set_label(j, l as u32);
        }
        Ok(b)
    }

    pub fn num_blocks(&self) -> usize {
        self.sizes.len()
    }

    /// Samples in each block, in file order.
    pub fn block_sizes(&self) -> Vec<usize> {
        self.sizes.clone()
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

    /// The number by which batch `b` of this share draws its augmentation: `b` itself for
    /// `ALL`; interleaved for ranks, so that no two ranks crop and flip alike.
    pub fn batch_key(self, b: usize) -> usize {
        b * self.count + self.index
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

    /// Every sample of `src` with its label, in file order.
    fn file_order(src: &Source) -> Vec<(Vec<u8>, u32)> {
        let mut all = Vec::new();
        for b in 0..src.num_blocks() {
            let bl = src.read(b).unwrap();
            all.extend((0..bl.len()).map(|i| (bl.sample(i).to_vec(), bl.label(i))));
        }
        all
    }

    /// `epoch_order` (the GPU-resident input) walks the samples in the order `epoch` streams them.
    #[test]
    fn epoch_order_is_the_streamed_order() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("ds");
        crate::synth::test_dataset(&out, 3000, "1x6x6");
        let ds = Dataset::open(&out).unwrap();
        let src = Source::open(&ds, "train").unwrap();
        let all = file_order(&src);
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
        let all = file_order(&src);
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

    /// When a rank's batch is one whole window (`WINDOW_BLOCKS` blocks), step s of W ranks reads
    /// the same samples as step s of one rank at W times the batch, in another order: with
    /// synchronised batch norm the two runs train alike (the GPU script's `dist` stage compares
    /// their weights).
    #[test]
    fn ranks_step_the_samples_of_one_rank_at_their_summed_batch() {
        let block = 16;
        let sizes = vec![block; 160];
        let present = vec![true; sizes.len()];
        for world in [2, 4] {
            for epoch in 0..3 {
                let batch = WINDOW_BLOCKS * block;
                let one = share_order(&sizes, &present, 5, epoch, true, Share::ALL);
                let ranks: Vec<Vec<u32>> = (0..world)
                    .map(|r| {
                        share_order(
                            &sizes,
                            &present,
                            5,
                            epoch,
                            true,
                            Share::new(r, world).unwrap(),
                        )
                    })
                    .collect();
                let steps = rank_batches(&sizes, world, batch);
                assert_eq!(steps, sizes.len() / world / WINDOW_BLOCKS);
                for s in 0..steps {
                    let mut a: Vec<u32> = ranks
                        .iter()
                        .flat_map(|o| o[s * batch..(s + 1) * batch].iter().copied())
                        .collect();
                    let mut b = one[s * batch * world..(s + 1) * batch * world].to_vec();
                    assert_ne!(a, b, "the orders within a step differ");
                    a.sort_unstable();
                    b.sort_unstable();
                    assert_eq!(a, b, "{world} ranks, epoch {epoch}, step {s}");
                }
            }
        }
    }

    /// Every rank can take `rank_batches` batches from its share in every epoch (so the ranks
    /// step together), what is left over is under a block and a batch per rank, the count does
    /// not depend on the seed or epoch, and one rank takes a one-GPU epoch.
    #[test]
    fn every_rank_takes_the_same_number_of_batches() {
        let layouts: [Vec<usize>; 4] = [
            vec![1024; 40],
            [vec![1000; 37], vec![123]].concat(),
            vec![7, 300, 5, 999, 64, 64, 2, 1000, 512, 13, 77],
            vec![50; 3],
        ];
        for sizes in &layouts {
            let total: usize = sizes.iter().sum();
            let biggest = *sizes.iter().max().unwrap();
            let uniform = sizes[..sizes.len() - 1].iter().all(|&b| b == sizes[0]);
            assert_eq!(rank_batches(sizes, 1, 32), batches_per_epoch(total, 32));
            for world in [2, 3, 4, 8] {
                for batch in [1, 16, 100] {
                    let n = rank_batches(sizes, world, batch);
                    for seed in 0..5 {
                        for epoch in 0..4 {
                            for r in 0..world {
                                let share = Share::new(r, world).unwrap();
                                let held = share_samples(sizes, seed, epoch, true, share);
                                assert!(n * batch <= held, "{sizes:?} {world} {batch}");
                                // Balanced where the writer's blocks are (all full but the
                                // last): a rank leaves out under a block, two when the blocks do
                                // not deal evenly, and a batch.
                                let uneven = usize::from(sizes.len() % world != 0);
                                assert!(
                                    !uniform || held - n * batch < biggest * (1 + uneven) + batch,
                                    "{sizes:?} world {world} batch {batch}: {held} held, {n} batches"
                                );
                            }
                        }
                    }
                    assert_eq!(n, rank_batches(sizes, world, batch));
                }
            }
            // A one-reader epoch augments batch b as b; ranks never share a key.
            assert_eq!(Share::ALL.batch_key(7), 7);
            let keys: std::collections::HashSet<usize> = (0..3)
                .flat_map(|r| (0..50).map(move |b| Share::new(r, 3).unwrap().batch_key(b)))
                .collect();
            assert_eq!(keys.len(), 150);
            // More ranks than blocks: some rank has nothing, so no rank steps.
            assert_eq!(rank_batches(sizes, sizes.len() + 1, 1), 0);
        }
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
