//! The training input pipeline: a seeded permutation of blocks, shuffling within a window of
//! blocks, blocks decoded ahead on worker threads with a bounded lookahead, batches handed to the
//! training loop through a bounded channel. Host memory is bounded by the lookahead, not the
//! dataset; the order is a pure function of (seed, epoch), so a run resumes mid-epoch from a
//! cursor of (epoch, batches done).

mod loader;
mod order;
mod source;

pub use loader::{batches_per_epoch, epoch, epoch_share, Batch, EpochPlan, Loader, OnDamage};
pub use order::{block_order, epoch_order, mix, rank_batches, share_order, share_samples, Share};
pub use source::Source;

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

/// Dtype, classes, mean and std of column-major files without a manifest, from one pass over
/// their labels and values (the first value that is not a u8 pixel / 255 decides f32).
fn scan_bare(
    splits: &BTreeMap<String, Arc<ColmajorSplitReader>>,
    shape: &Shape,
    notes: &mut Vec<String>,
) -> Result<(Dtype, Vec<String>, Vec<f64>, Vec<f64>)> {
    let mut counts = BTreeMap::new();
    let mut k = 1;
    for (name, r) in splits {
        let c = r.check_labels(None)?;
        k = k.max(c.len());
        counts.insert(name.clone(), c);
    }
    let mut scans = BTreeMap::new();
    for (name, r) in splits {
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
    Ok((dtype, (0..k).map(|c| c.to_string()).collect(), mean, std))
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
        if crate::store::remote::is_url(dir) {
            if crate::format::dataset_format(dir)? == colmajor::FORMAT {
                return Err(Error::Invalid(format!(
                    "{}: a column-major dataset is read by mapping its files into memory, which a \
                     store cannot do: copy it to a local disk, or convert it to shards",
                    shown_path(&dir)
                )));
            }
            return Self::open_shards(dir, &check_shape);
        }
        if dir.join(manifest::FILE_NAME).is_file() {
            if crate::format::dataset_format(dir)? == colmajor::FORMAT {
                return Self::open_colmajor(dir, &check_shape);
            }
            return Self::open_shards(dir, &check_shape);
        }
        Self::open_bare_colmajor(dir, shape, known)
    }

    /// Column-major files with their manifest.
    fn open_colmajor(dir: &Path, check_shape: &dyn Fn(&Shape) -> Result<()>) -> Result<Self> {
        let m = ColmajorManifest::read(dir)?;
        check_shape(&m.sample.shape)?;
        let mut splits = BTreeMap::new();
        for s in m.splits.keys() {
            splits.insert(s.clone(), Arc::new(ColmajorSplitReader::open(dir, &m, s)?));
        }
        Ok(Data {
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
        })
    }

    /// A dataset of shards.
    fn open_shards(dir: &Path, check_shape: &dyn Fn(&Shape) -> Result<()>) -> Result<Self> {
        let ds = Dataset::open(dir)?;
        check_shape(&ds.manifest.sample.shape)?;
        let m = &ds.manifest;
        Ok(Data {
            dir: dir.to_path_buf(),
            layout: Layout::Shards,
            manifest: true,
            spec: m.sample.clone(),
            classes: m.classes.clone(),
            mean: m.mean.clone(),
            std: m.std.clone(),
            notes: vec![],
            inner: Inner::Shards(Box::new(ds)),
        })
    }

    /// Column-major files without a manifest: the shape from `--shape`, the rest from `known`
    /// or one pass over the values (`scan_bare`).
    fn open_bare_colmajor(dir: &Path, shape: Option<&Shape>, known: Option<Known>) -> Result<Self> {
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
            None => scan_bare(&splits, shape, &mut notes)?,
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

    /// One split, open for reading by training and evaluation: images and classes (training on
    /// fields is issue 29's).
    pub fn source(&self, split: &str) -> Result<Arc<Source>> {
        self.source_for(split, false)
    }

    /// `source`, whose batches carry the samples' fields when `fields` (a task that trains on
    /// one); column-major files have none.
    pub fn source_for(&self, split: &str, fields: bool) -> Result<Arc<Source>> {
        match &self.inner {
            Inner::Shards(ds) if fields => Source::open(ds, split),
            Inner::Shards(ds) => Source::open_classes(ds, split),
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

#[cfg(test)]
mod tests {
    use super::order::permutation;
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
