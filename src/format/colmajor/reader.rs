//! Reading a split: finding the files (with or without a manifest), sizes and labels checked,
//! samples gathered from the feature-major columns a chunk at a time.

use super::values::exact_u8;
use super::*;

/// The splits of a directory in the seed layout, found by their file names: `images_<split>.bin`
/// beside `labels_<split>.bin`, sorted by split name. An images file without its labels file (or
/// labels without images) is an error naming it; other files are ignored.
pub fn find_splits(dir: &Path) -> Result<Vec<(String, PathBuf, PathBuf)>> {
    let mut out = Vec::new();
    let mut names = Vec::new();
    for e in std::fs::read_dir(dir).at(dir)? {
        let e = e.at(dir)?;
        names.push(e.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    for name in &names {
        for (prefix, other) in [("images_", "labels_"), ("labels_", "images_")] {
            let Some(split) = seed_split(name, prefix) else {
                continue;
            };
            let partner = format!("{other}{split}.bin");
            if !dir.join(&partner).is_file() {
                return Err(Error::Source(format!(
                    "{}: no {partner} beside it: the column-major layout has one images_<split>.bin and one labels_<split>.bin per split",
                    dir.join(name).display(),
                )));
            }
            if prefix == "images_" {
                out.push((
                    split.to_string(),
                    dir.join(name),
                    dir.join(labels_name(split)),
                ));
            }
        }
    }
    Ok(out)
}

/// The split of a seed-layout file name `<prefix><split>.bin`.
pub(super) fn seed_split<'a>(name: &'a str, prefix: &str) -> Option<&'a str> {
    let split = name.strip_prefix(prefix)?.strip_suffix(".bin")?;
    crate::format::shard::manifest::is_split_name(split).then_some(split)
}

/// Whether `dir` holds files of the seed layout: an `images_<split>.bin` or a
/// `labels_<split>.bin` (`find_splits` then says what is missing).
pub fn looks_like_seed(dir: &Path) -> bool {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return false;
    };
    rd.flatten().any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        seed_split(&name, "images_").is_some() || seed_split(&name, "labels_").is_some()
    })
}

/// Samples read together: about 4 MiB of float32 values, a power of two (so that each feature's
/// run is a few KiB of sequential bytes).
pub fn chunk_samples(features: usize) -> usize {
    crate::format::shard::default_block_samples(features.saturating_mul(4)) as usize
}

/// Read-only view of one colmajor split, memory-mapped, read in chunks of samples. Pages are
/// dropped from the process as reading goes on, so resident memory stays bounded whatever the
/// file size.
pub struct ColmajorSplitReader {
    pub samples: usize,
    pub features: usize,
    pub shape: crate::format::shard::Shape,
    pub images_path: PathBuf,
    pub labels_path: PathBuf,
    images: memmap2::Mmap,
    labels: memmap2::Mmap,
    /// Bytes the maps have (about) brought into the process since their pages were last
    /// released.
    since_release: std::sync::atomic::AtomicUsize,
    /// The fault-around window (`FAULT_AROUND` bytes of a feature's run) where the last chunk
    /// read ended; `usize::MAX` before the first.
    last_window: std::sync::atomic::AtomicUsize,
}

/// Bytes of a file the kernel maps into the process around a page that faults when the page
/// cache holds them ("fault-around": 64 KiB by default on Linux): a chunk that reads a few
/// values of each feature far from the last chunk costs up to this much resident memory per
/// feature, not the bytes read.
pub(super) const FAULT_AROUND: usize = 64 << 10;

impl ColmajorSplitReader {
    /// Open a split of a prep colmajor dataset: the files named by the manifest, of exactly the
    /// sizes it says (a file of another size is an error naming it and both sizes).
    pub fn open(dir: &Path, m: &ColmajorManifest, split: &str) -> Result<Self> {
        let s = m
            .splits
            .get(split)
            .ok_or_else(|| Error::manifest(dir, format!("no split '{split}'")))?;
        Self::open_sized(
            &dir.join(&s.images),
            &dir.join(&s.labels),
            &m.sample.shape,
            Some(s.samples),
        )
    }

    /// Open an images file and its labels file holding samples of `shape` given by `--shape`
    /// (the files do not say it): the images file must be a whole, non-zero number of samples of
    /// `4 * F` bytes and the labels file exactly 4 bytes per sample. Nothing is read but the
    /// sizes. A shape that does not fit the files is a usage error (`Error::Invalid`) naming
    /// both numbers; files that disagree otherwise (a truncated labels file) are `Error::Source`.
    pub fn open_files(
        images: &Path,
        labels: &Path,
        shape: &crate::format::shard::Shape,
    ) -> Result<Self> {
        Self::open_sized(images, labels, shape, None)
    }

    fn open_sized(
        images: &Path,
        labels: &Path,
        shape: &crate::format::shard::Shape,
        manifest_samples: Option<u64>,
    ) -> Result<Self> {
        let features = shape.elems();
        let sample_bytes = (features as u64)
            .checked_mul(4)
            .ok_or_else(|| Error::Invalid(format!("a {shape} sample is too large")))?;
        let f = crate::store::local::open(images)?;
        let len = f.metadata().at(images)?.len();
        let lf = crate::store::local::open(labels)?;
        let llen = lf.metadata().at(labels)?.len();
        let n = match manifest_samples {
            Some(n) => {
                let want = n.checked_mul(sample_bytes).ok_or_else(|| {
                    Error::manifest(
                        images,
                        format!("{n} samples of {shape} overflow a file size"),
                    )
                })?;
                if len != want {
                    return Err(Error::manifest(
                        images,
                        format!(
                            "is {len} bytes, but the manifest's {n} samples of {shape} float32 make {want} bytes{}",
                            if len < want { " (truncated?)" } else { "" }
                        ),
                    ));
                }
                if llen != n * 4 {
                    return Err(Error::manifest(
                        labels,
                        format!(
                            "is {llen} bytes, but the manifest's {n} int32 labels make {} bytes{}",
                            n * 4,
                            if llen < n * 4 { " (truncated?)" } else { "" }
                        ),
                    ));
                }
                n
            }
            None => {
                if llen % 4 != 0 {
                    return Err(Error::Source(format!(
                        "{}: its size, {llen} bytes, is not a multiple of 4 bytes, the size of one int32 label: the file is truncated or not labels",
                        labels.display()
                    )));
                }
                let nl = llen / 4;
                // The labels count the samples: when the images file divides into that many,
                // the shape is the likely mistake, and the message says what would fit.
                let fits = (nl > 0 && len % (nl * 4) == 0).then(|| len / (nl * 4));
                let hint = |v: u64| {
                    format!(
                        "{nl} int32 labels in {} make {v} float32 values per sample, not the {features} of {shape}: check --shape",
                        labels.display()
                    )
                };
                if len % sample_bytes != 0 {
                    let what = format!(
                        "{}: its size, {len} bytes, is not a multiple of {sample_bytes} bytes, the size of one {shape} float32 sample",
                        images.display()
                    );
                    return Err(match fits {
                        Some(v) => Error::Invalid(format!("{what}; {}", hint(v))),
                        None if len < nl.saturating_mul(sample_bytes) => Error::Source(format!(
                            "{what}, and short of the {} bytes that {nl} samples (as {} counts) take: truncated?",
                            nl.saturating_mul(sample_bytes),
                            labels.display()
                        )),
                        None => Error::Invalid(format!(
                            "{what}: --shape does not fit this file, or the file is truncated"
                        )),
                    });
                }
                let n = len / sample_bytes;
                if n == 0 {
                    return Err(Error::Source(format!(
                        "{}: is empty: it holds no samples",
                        images.display()
                    )));
                }
                if nl != n {
                    let what = format!(
                        "{}: {nl} int32 labels ({llen} bytes), but {} holds {n} samples of {shape} ({len} bytes)",
                        labels.display(),
                        images.display()
                    );
                    return Err(match fits {
                        Some(v) => Error::Invalid(format!("{what}; {}", hint(v))),
                        None => Error::Source(format!(
                            "{what}: one of the files is truncated, or --shape does not fit them"
                        )),
                    });
                }
                n
            }
        };
        let samples = usize::try_from(n)
            .map_err(|_| Error::Source(format!("{}: too many samples", images.display())))?;
        // SAFETY: read-only maps of files we do not modify; a concurrent truncation by another
        // process is outside what a dataset reader can guard against.
        let images_map = unsafe { memmap2::Mmap::map(&f) }.at(images)?;
        let labels_map = unsafe { memmap2::Mmap::map(&lf) }.at(labels)?;
        Ok(ColmajorSplitReader {
            samples,
            features,
            shape: shape.clone(),
            images_path: images.to_path_buf(),
            labels_path: labels.to_path_buf(),
            images: images_map,
            labels: labels_map,
            since_release: Default::default(),
            last_window: usize::MAX.into(),
        })
    }

    /// Value of feature `f` of sample `i`.
    pub fn get(&self, i: usize, f: usize) -> f32 {
        let o = (f * self.samples + i) * 4;
        f32::from_le_bytes(self.images[o..o + 4].try_into().unwrap())
    }

    /// The label of sample `i` as stored (int32).
    pub fn label(&self, i: usize) -> i32 {
        i32::from_le_bytes(self.labels[4 * i..4 * i + 4].try_into().unwrap())
    }

    /// Samples `start..start + m` into `out` (`m * features` values), sample after sample. The
    /// file holds each feature's values of all samples together, so this reads one contiguous
    /// run of `m` values per feature: a chunk is a set of sequential reads. Features go in tiles,
    /// so that each sample's slice of `out` is written a cache line at a time.
    pub fn read_chunk(&self, start: usize, m: usize, out: &mut [f32]) {
        let (n, f) = (self.samples, self.features);
        assert!(
            start + m <= n && out.len() == m * f,
            "chunk inside the split"
        );
        // Resident memory: a chunk far from the last one (a shuffled block when training) maps
        // a new fault-around window in every feature's run, so the pages mapped by earlier
        // chunks are dropped first; a chunk next to the last one (reading in order) adds its
        // bytes. The estimate is counted towards the next release.
        use std::sync::atomic::Ordering;
        let (w0, w1) = (4 * start / FAULT_AROUND, 4 * (start + m) / FAULT_AROUND);
        let last = self.last_window.swap(w1, Ordering::Relaxed);
        let near = last != usize::MAX && last.abs_diff(w0) <= 1;
        if !near {
            self.release();
        }
        let per_feature = if near {
            4 * m
        } else {
            (4 * m).max(FAULT_AROUND)
        };
        let img: &[u8] = &self.images;
        let mut runs: Vec<&[u8]> = Vec::with_capacity(TILE);
        for f0 in (0..f).step_by(TILE) {
            let tf = TILE.min(f - f0);
            runs.clear();
            runs.extend((f0..f0 + tf).map(|k| &img[4 * (k * n + start)..4 * (k * n + start + m)]));
            for i in 0..m {
                let row = &mut out[i * f + f0..i * f + f0 + tf];
                for (v, run) in row.iter_mut().zip(&runs) {
                    *v = f32::from_le_bytes(run[4 * i..4 * i + 4].try_into().unwrap());
                }
            }
        }
        self.read_bytes(per_feature.saturating_mul(f));
    }

    /// Labels of samples `start..start + m`, as stored.
    pub fn labels(&self, start: usize, m: usize) -> impl Iterator<Item = i32> + '_ {
        self.labels[4 * start..4 * (start + m)]
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
    }

    /// Count bytes brought into the process; past `RELEASE_EVERY`, release the maps' pages, so
    /// that resident memory does not grow to the file size.
    fn read_bytes(&self, bytes: usize) {
        use std::sync::atomic::Ordering;
        let before = self.since_release.fetch_add(bytes, Ordering::Relaxed);
        if before.saturating_add(bytes) >= RELEASE_EVERY {
            self.release();
        }
    }

    /// Drop the maps' pages from the process (the page cache keeps them).
    fn release(&self) {
        use std::sync::atomic::Ordering;
        if self.since_release.swap(0, Ordering::Relaxed) == 0 {
            return;
        }
        // SAFETY: read-only, file-backed maps: dropping their pages loses nothing, and a
        // thread reading them meanwhile faults them back in from the page cache.
        unsafe {
            let _ = self
                .images
                .unchecked_advise(memmap2::UncheckedAdvice::DontNeed);
            let _ = self
                .labels
                .unchecked_advise(memmap2::UncheckedAdvice::DontNeed);
        }
    }

    /// Check every label: an int32 in `0..classes` (with `classes` None: not negative, and below
    /// the 65536-class cap). Returns the samples per label; an error names the file and index.
    pub fn check_labels(&self, classes: Option<usize>) -> Result<Vec<u64>> {
        let cap = classes.unwrap_or(crate::format::shard::format::MAX_CLASSES as usize);
        let mut counts = vec![0u64; classes.unwrap_or(0)];
        let step = 1 << 20;
        for start in (0..self.samples).step_by(step) {
            let m = step.min(self.samples - start);
            for (j, l) in self.labels(start, m).enumerate() {
                if l < 0 || l as usize >= cap {
                    return Err(label_error(&self.labels_path, start + j, l, classes));
                }
                let l = l as usize;
                if l >= counts.len() {
                    counts.resize(l + 1, 0);
                }
                counts[l] += 1;
            }
            self.read_bytes(m * 4);
        }
        Ok(counts)
    }

    /// One pass over every value: whether each is a u8 pixel / 255 (the first that is not, as
    /// (sample, feature, value)), and the per-channel sums of the split for its mean and std, both
    /// as u8 pixels (exact, as shards count them) and as the float values. A value that is NaN or
    /// infinite is an error naming the file, sample and feature. Chunks are read on every core and
    /// added up in order, so the float sums do not depend on the thread count.
    pub fn scan(&self, shape: &crate::format::shard::Shape) -> Result<Scan> {
        let (c, plane, f) = (shape.channels(), shape.plane(), self.features);
        let chunk = chunk_samples(f);
        let chunks = self.samples.div_ceil(chunk);
        let threads = rayon::current_num_threads();
        let mut total = Scan {
            not_u8: None,
            int_sum: vec![0; c],
            int_sumsq: vec![0; c],
            sum: vec![0.0; c],
            sumsq: vec![0.0; c],
        };
        crate::util::pipeline::ordered_map(
            chunks,
            threads,
            2 * threads,
            |k| {
                let start = k * chunk;
                let m = chunk.min(self.samples - start);
                let mut vals = vec![0f32; m * f];
                self.read_chunk(start, m, &mut vals);
                if let Some(i) = vals.iter().position(|v| !v.is_finite()) {
                    return Err(Error::Source(format!(
                        "{}: sample {}, feature {}: value {} is not finite",
                        self.images_path.display(),
                        start + i / f,
                        i % f,
                        vals[i]
                    )));
                }
                let mut s = Scan {
                    not_u8: vals
                        .iter()
                        .position(|&v| exact_u8(v).is_none())
                        .map(|i| (start + i / f, i % f, vals[i])),
                    int_sum: vec![0; c],
                    int_sumsq: vec![0; c],
                    sum: vec![0.0; c],
                    sumsq: vec![0.0; c],
                };
                // Per sample and channel, then added: the order shards sum their blocks in.
                for px in vals.chunks_exact(f) {
                    for ch in 0..c {
                        let p = &px[ch * plane..(ch + 1) * plane];
                        let (mut a, mut q) = (0.0f64, 0.0f64);
                        for &v in p {
                            a += v as f64;
                            q += v as f64 * v as f64;
                        }
                        s.sum[ch] += a;
                        s.sumsq[ch] += q;
                        if s.not_u8.is_none() {
                            let (mut a, mut q) = (0u64, 0u128);
                            for &v in p {
                                let k = exact_u8(v).unwrap_or(0) as u64;
                                a += k;
                                q += (k * k) as u128;
                            }
                            s.int_sum[ch] += a as u128;
                            s.int_sumsq[ch] += q;
                        }
                    }
                }
                Ok(s)
            },
            |_, s| {
                total.not_u8 = total.not_u8.or(s.not_u8);
                for ch in 0..c {
                    total.sum[ch] += s.sum[ch];
                    total.sumsq[ch] += s.sumsq[ch];
                    total.int_sum[ch] = total.int_sum[ch].saturating_add(s.int_sum[ch]);
                    total.int_sumsq[ch] = total.int_sumsq[ch].saturating_add(s.int_sumsq[ch]);
                }
                Ok(())
            },
        )?;
        Ok(total)
    }
}

/// What `ColmajorSplitReader::scan` found.
#[derive(Debug, Clone)]
pub struct Scan {
    /// The first value that is not exactly a u8 pixel / 255, as (sample, feature, value).
    pub not_u8: Option<(usize, usize, f32)>,
    int_sum: Vec<u128>,
    int_sumsq: Vec<u128>,
    sum: Vec<f64>,
    sumsq: Vec<f64>,
}

impl Scan {
    /// The statistics of the split as `dtype` samples (u8: the exact pixel sums, only when every
    /// value is a u8 pixel / 255; otherwise the float values' sums), with `class_counts`.
    pub fn stats(&self, dtype: Dtype, class_counts: Vec<u64>) -> Stats {
        use crate::format::shard::ChannelSums;
        Stats {
            class_counts,
            channels: if dtype == Dtype::U8 && self.not_u8.is_none() {
                ChannelSums::Int {
                    sum: self.int_sum.clone(),
                    sumsq: self.int_sumsq.clone(),
                }
            } else {
                ChannelSums::Float {
                    sum: self.sum.clone(),
                    sumsq: self.sumsq.clone(),
                }
            },
        }
    }
}

pub(super) fn label_error(path: &Path, index: usize, label: i32, classes: Option<usize>) -> Error {
    Error::Source(match classes {
        Some(k) => format!(
            "{}: label {label} at index {index} is not a class (there are {k}: 0 to {})",
            path.display(),
            k - 1
        ),
        None if label < 0 => format!(
            "{}: label {label} at index {index} is negative: labels are int32 class indices in [0, 2^31)",
            path.display()
        ),
        None => format!(
            "{}: label {label} at index {index} is over the cap of {} classes",
            path.display(),
            crate::format::shard::format::MAX_CLASSES
        ),
    })
}
