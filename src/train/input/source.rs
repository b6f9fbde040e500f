//! A split's samples as training reads them: from shard blocks or column-major chunks, in the
//! dataset's dtype.

use super::*;
use crate::format::fields::Fields;

/// One split of a dataset, open for reading in blocks: a shard dataset's blocks, or virtual
/// blocks of a fixed number of samples of a column-major split (as many as a shard block of
/// these samples holds by default, so that the order of a seed is the same for a colmajor
/// directory and its conversion to shards).
pub struct Source {
    pub spec: SampleSpec,
    pub classes: usize,
    /// What each sample carries beside its class (none for column-major splits).
    pub fields: Fields,
    pub samples: usize,
    /// Samples of every block, in file order.
    pub(super) sizes: Vec<usize>,
    /// Whether blocks come over a network: the loader then keeps many reads in flight.
    pub(super) remote: bool,
    from: From,
}

pub(super) enum From {
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
pub(super) const GATHER_VALUES: usize = 1 << 18;

impl Source {
    pub fn open(ds: &Dataset, split: &str) -> Result<Arc<Self>> {
        Self::open_with(ds, split, ds.manifest.fields.clone())
    }

    /// `open`, for training on the class: batches carry no fields (their blocks are still read
    /// and checked whole), so a dataset with metadata or masks costs no copies it does not use.
    pub fn open_classes(ds: &Dataset, split: &str) -> Result<Arc<Self>> {
        Self::open_with(ds, split, Fields::default())
    }

    fn open_with(ds: &Dataset, split: &str, fields: Fields) -> Result<Arc<Self>> {
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
        let readers = ds.open_shards(&info.shards.iter().collect::<Vec<_>>())?;
        let mut blocks = Vec::new();
        let mut sizes = Vec::new();
        for (i, r) in readers.iter().enumerate() {
            for b in 0..r.num_blocks() {
                blocks.push((i, b));
                sizes.push(r.entry(b).num_samples as usize);
            }
        }
        Ok(Arc::new(Source {
            remote: ds.remote_store(),
            spec: ds.manifest.sample.clone(),
            classes: ds.manifest.classes.len(),
            fields,
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
            remote: false,
            spec,
            classes,
            fields: Fields::default(),
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
