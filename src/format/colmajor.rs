//! The chunked column-major layout (`formats/colmajor.md`): `images_<split>.bin` holds float32 pixels
//! in [0, 1] (u8/u16 sources) or the values themselves (f16/f32 sources), feature-major (what
//! Fortran reads as `data(n_samples, n_features)`), and `labels_<split>.bin` holds int32 labels. Files are written block by block through a memory map
//! whose pages are released as they are written, so a 100 GB file needs no 100 GB of RAM.

use crate::format::shard::manifest::{check_seal, read_capped, seal, Provenance};
use crate::format::shard::{Block, Dtype, SampleSpec, Stats};
use crate::store::output::{write_atomic, OutFile, Temp};
use crate::util::error::{Error, IoContext, Result};
use memmap2::{MmapMut, MmapOptions};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

pub const FORMAT: &str = "prep-colmajor";
/// Version 2 allows f16/f32 sources (whose values the files hold as they are); writers use the
/// dtype's `format_version`, so u8/u16 manifests stay version 1.
pub const VERSION: u32 = 2;
/// Features handled together when transposing: one cache line of u8 pixels per sample.
const TILE: usize = 64;
/// Bytes written into the map between releases of its pages.
const RELEASE_EVERY: usize = 64 << 20;

pub fn images_name(split: &str) -> String {
    format!("images_{split}.bin")
}
pub fn labels_name(split: &str) -> String {
    format!("labels_{split}.bin")
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColmajorManifest {
    pub format: String,
    pub version: u32,
    /// Shape and dtype of the source pixels (the files hold them as float32 pixel/max, or as the
    /// values themselves for f16/f32).
    pub sample: SampleSpec,
    pub classes: Vec<String>,
    pub mean: Vec<f64>,
    pub std: Vec<f64>,
    pub splits: BTreeMap<String, ColmajorSplit>,
    pub provenance: Provenance,
    pub checksum: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColmajorSplit {
    pub samples: u64,
    pub images: String,
    pub labels: String,
    pub class_counts: Vec<u64>,
}

impl ColmajorManifest {
    pub fn write(&self, dir: &Path) -> Result<()> {
        write_atomic(
            &dir.join(crate::format::shard::manifest::FILE_NAME),
            &seal(self),
        )
    }

    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join(crate::format::shard::manifest::FILE_NAME);
        let bytes = read_capped(&path)?;
        let m: ColmajorManifest = serde_json::from_slice(&bytes)
            .map_err(|e| Error::manifest(&path, format!("not a valid colmajor manifest: {e}")))?;
        if m.format != FORMAT || !(1..=VERSION).contains(&m.version) {
            return Err(Error::manifest(
                &path,
                format!(
                    "format {} v{} is not {FORMAT} v1 to v{VERSION}",
                    m.format, m.version
                ),
            ));
        }
        check_seal(&path, &bytes, &m.checksum)?;
        m.validate().map_err(|what| Error::manifest(&path, what))?;
        Ok(m)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        crate::format::shard::Shape::new(self.sample.shape.0.clone()).map_err(|e| e.to_string())?;
        if self.sample.dtype.format_version() as u32 > self.version {
            return Err(format!(
                "dtype {} needs version {}, the file says {}",
                self.sample.dtype,
                self.sample.dtype.format_version(),
                self.version
            ));
        }
        let k = self.classes.len();
        if k == 0 || k > crate::format::shard::format::MAX_CLASSES as usize {
            return Err(format!("{k} classes is outside 1..=65536"));
        }
        let c = self.sample.shape.channels();
        if self.mean.len() != c || self.std.len() != c {
            return Err("mean/std do not have one value per channel".into());
        }
        for (name, s) in &self.splits {
            if !crate::format::shard::manifest::is_split_name(name) {
                return Err(format!(
                    "split name {name:?} is not a plain name (A-Z a-z 0-9 _ -)"
                ));
            }
            if s.images != images_name(name) || s.labels != labels_name(name) {
                return Err(format!(
                    "split {name}: files must be {} and {}",
                    images_name(name),
                    labels_name(name)
                ));
            }
            if s.class_counts.len() != k
                || crate::format::shard::format::checked_sum(&s.class_counts) != Some(s.samples)
            {
                return Err(format!(
                    "split {name}: class counts do not match {k} classes and {} samples",
                    s.samples
                ));
            }
        }
        Ok(())
    }
}

/// Writes one split: samples arrive in blocks, in order. Dropped unfinished (a failure, an
/// interruption), it removes its temporary files.
pub struct ColmajorWriter {
    images: PathBuf,
    labels: PathBuf,
    images_tmp: Temp,
    labels_tmp: Temp,
    map: MmapMut,
    labels_out: BufWriter<OutFile>,
    n: usize,
    features: usize,
    dtype: Dtype,
    written: usize,
    since_release: usize,
    pub stats: Stats,
}

impl ColmajorWriter {
    pub fn create(
        dir: &Path,
        split: &str,
        n: u64,
        spec: &SampleSpec,
        num_classes: u32,
    ) -> Result<Self> {
        let images = dir.join(images_name(split));
        let labels = dir.join(labels_name(split));
        let features = spec.shape.elems();
        let bytes = n
            .checked_mul(features as u64)
            .and_then(|v| v.checked_mul(4))
            .ok_or_else(|| Error::Invalid("colmajor file size overflows".into()))?;
        if n == 0 {
            return Err(Error::Invalid(format!("split {split} has no samples")));
        }
        let images_tmp = Temp::of(&images);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(images_tmp.path())
            .at(&images)?;
        f.set_len(bytes).at(&images)?;
        // The map is written without write calls: a full disk would be a SIGBUS there.
        crate::store::output::reserve(&f, &images, bytes).at(&images)?;
        // SAFETY: the file was just created by us under a temporary name; nothing else maps or
        // resizes it while the writer lives.
        let map = unsafe { MmapOptions::new().map_mut(&f) }.at(&images)?;
        let labels_tmp = Temp::of(&labels);
        let labels_out = BufWriter::new(OutFile::create(labels_tmp.path()).at(&labels)?);
        Ok(ColmajorWriter {
            images,
            labels,
            images_tmp,
            labels_tmp,
            map,
            labels_out,
            n: n as usize,
            features,
            dtype: spec.dtype,
            written: 0,
            since_release: 0,
            stats: Stats::empty(num_classes, spec),
        })
    }

    /// Write the next block of samples (blocks must come in order).
    pub fn push(&mut self, block: &Block, stats: &Stats) -> Result<()> {
        let (start, m, n, f) = (self.written, block.len(), self.n, self.features);
        if start + m > n {
            return Err(Error::Invalid(format!(
                "colmajor split has {n} samples, got more"
            )));
        }
        let px = block.pixels();
        let dtype = self.dtype;
        // Divide (not multiply by 1/max): readers expect exactly pixel / max (value / 1 for
        // floats, which are written as they are).
        let max = dtype.divisor() as f32;
        let map: &mut [f32] = bytemuck_f32(&mut self.map);
        // One tile of TILE features at a time: each sample's tile is one cache line of input,
        // written to TILE rows sequentially.
        map.par_chunks_mut(n * TILE)
            .enumerate()
            .for_each(|(t, rows)| {
                let f0 = t * TILE;
                let tf = rows.len() / n;
                for i in 0..m {
                    let s = i * f + f0;
                    for k in 0..tf {
                        rows[k * n + start + i] = dtype.get(px, s + k) / max;
                    }
                }
            });
        for l in block.labels() {
            self.labels_out
                .write_all(&(l as i32).to_le_bytes())
                .at(&self.labels)?;
        }
        self.stats.add(stats);
        self.written += m;
        self.since_release += m * f * 4;
        if self.since_release >= RELEASE_EVERY {
            self.release()?;
        }
        Ok(())
    }

    /// Hand written pages to the page cache and drop them from this process, so resident memory
    /// stays bounded whatever the file size.
    fn release(&mut self) -> Result<()> {
        self.since_release = 0;
        self.map.flush_async().at(&self.images)?;
        // SAFETY: the mapping is shared and file-backed: dropping our pages loses no data (the page
        // cache keeps it), and later accesses read the file back.
        unsafe {
            self.map
                .unchecked_advise(memmap2::UncheckedAdvice::DontNeed)
        }
        .at(&self.images)
    }

    pub fn finish(self) -> Result<Stats> {
        if self.written != self.n {
            return Err(Error::Invalid(format!(
                "colmajor split got {} of {} samples",
                self.written, self.n
            )));
        }
        self.map.flush().at(&self.images)?;
        drop(self.map);
        let mut lf = self
            .labels_out
            .into_inner()
            .map_err(|e| Error::io(&self.labels, e.into_error()))?;
        lf.flush().at(&self.labels)?;
        lf.file().sync_all().at(&self.labels)?;
        self.labels_tmp.rename_to(&self.labels)?;
        self.images_tmp.rename_to(&self.images)?;
        Ok(self.stats)
    }
}

fn bytemuck_f32(map: &mut MmapMut) -> &mut [f32] {
    let len = map.len() / 4;
    let ptr = map.as_mut_ptr();
    assert_eq!(ptr as usize % 4, 0, "page-aligned map");
    // SAFETY: the map is page aligned, exactly len*4 bytes, and any bit pattern is a valid f32.
    unsafe { std::slice::from_raw_parts_mut(ptr as *mut f32, len) }
}

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
fn seed_split<'a>(name: &'a str, prefix: &str) -> Option<&'a str> {
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
const FAULT_AROUND: usize = 64 << 10;

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

fn label_error(path: &Path, index: usize, label: i32, classes: Option<usize>) -> Error {
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

/// The f32 that the colmajor writer stores for u8 pixel `k`: `k / 255`, one float32 division.
fn u8_value(k: u8) -> f32 {
    k as f32 / 255.0
}

/// `v` as the u8 pixel `k` when `v` is bit for bit the value the colmajor layout stores for it
/// (`float32(k) / 255`); None for anything else (-0.0 included, so that a round trip through u8
/// gives back the very bytes).
#[inline]
pub fn exact_u8(v: f32) -> Option<u8> {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let t = TABLE.get_or_init(|| std::array::from_fn(|k| u8_value(k as u8).to_bits()));
    // k/255 in float32 is within 2^-24 relative of the true quotient, so v * 255 rounds to k.
    let k = (v * 255.0).round();
    (0.0..=255.0)
        .contains(&k)
        .then_some(k as u8)
        .filter(|&k| t[k as usize] == v.to_bits())
}

/// `v` as the u16 pixel `k` when it is bit for bit `float32(k) / 65535`.
#[inline]
pub fn exact_u16(v: f32) -> Option<u16> {
    let k = (v * 65535.0).round();
    (0.0..=65535.0)
        .contains(&k)
        .then_some(k as u16)
        .filter(|&k| (k as f32 / 65535.0).to_bits() == v.to_bits())
}

/// Store float32 `values` as `dtype` (little-endian into `out`) when each is exactly a value of
/// that dtype as the colmajor layout stores it: u8/u16 pixels as `k / max`, f16 values exactly
/// (and finite), f32 finite. Otherwise the index and value of the first that is not.
pub fn encode_exact(values: &[f32], dtype: Dtype, out: &mut [u8]) -> Result<(), (usize, f32)> {
    let miss = |i: usize| Err((i, values[i]));
    match dtype {
        Dtype::U8 => {
            for (i, (&v, o)) in values.iter().zip(out.iter_mut()).enumerate() {
                match exact_u8(v) {
                    Some(k) => *o = k,
                    None => return miss(i),
                }
            }
        }
        Dtype::U16 => {
            for (i, (&v, o)) in values.iter().zip(out.chunks_exact_mut(2)).enumerate() {
                match exact_u16(v) {
                    Some(k) => o.copy_from_slice(&k.to_le_bytes()),
                    None => return miss(i),
                }
            }
        }
        Dtype::F16 => {
            for (i, (&v, o)) in values.iter().zip(out.chunks_exact_mut(2)).enumerate() {
                let h = half::f16::from_f32(v);
                if !v.is_finite() || h.to_f32().to_bits() != v.to_bits() {
                    return miss(i);
                }
                o.copy_from_slice(&h.to_le_bytes());
            }
        }
        Dtype::F32 => {
            for (i, (&v, o)) in values.iter().zip(out.chunks_exact_mut(4)).enumerate() {
                if !v.is_finite() {
                    return miss(i);
                }
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
    }
    Ok(())
}

/// Why `encode_scaled` could not store a value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ScaleError {
    /// NaN or infinite.
    NotFinite(usize, f32),
    /// An integer dtype takes values in [0, 1].
    OutOfRange(usize, f32),
    /// Beyond f16's range.
    TooLarge(usize, f32),
}

impl std::fmt::Display for ScaleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            ScaleError::NotFinite(_, v) => write!(f, "value {v}: float samples must be finite"),
            ScaleError::OutOfRange(_, v) => write!(
                f,
                "value {v} is outside [0, 1], which --dtype u8/u16 scale to pixels; use --dtype f32 to keep it"
            ),
            ScaleError::TooLarge(_, v) => {
                write!(f, "value {v} is beyond f16's range (±65504): use --dtype f32")
            }
        }
    }
}

impl ScaleError {
    pub fn index(&self) -> usize {
        match *self {
            ScaleError::NotFinite(i, _)
            | ScaleError::OutOfRange(i, _)
            | ScaleError::TooLarge(i, _) => i,
        }
    }
}

/// Store values (pixels in [0, 1] for integer dtypes, anything finite for floats) as `dtype`:
/// u8/u16 as `round(v * 255)` / `round(v * 65535)` (so `k / 255` gives back `k`), f16 rounded to
/// nearest, f32 as they are.
pub fn encode_scaled(values: &[f32], dtype: Dtype, out: &mut [u8]) -> Result<(), ScaleError> {
    for (i, &v) in values.iter().enumerate() {
        if !v.is_finite() {
            return Err(ScaleError::NotFinite(i, v));
        }
        match dtype {
            Dtype::U8 | Dtype::U16 if !(0.0..=1.0).contains(&v) => {
                return Err(ScaleError::OutOfRange(i, v))
            }
            Dtype::U8 => out[i] = (v * 255.0).round() as u8,
            Dtype::U16 => {
                out[2 * i..2 * i + 2].copy_from_slice(&((v * 65535.0).round() as u16).to_le_bytes())
            }
            Dtype::F16 => {
                let h = half::f16::from_f32(v);
                if h.is_infinite() {
                    return Err(ScaleError::TooLarge(i, v));
                }
                out[2 * i..2 * i + 2].copy_from_slice(&h.to_le_bytes());
            }
            Dtype::F32 => out[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes()),
        }
    }
    Ok(())
}

/// A stored sample value as the colmajor layout holds it: `k / max` for u8/u16 pixels (one
/// float32 division, as the writer does), the value itself for f16/f32.
#[inline]
pub fn value_of(dtype: Dtype, px: &[u8], i: usize) -> f32 {
    dtype.get(px, i) / dtype.divisor() as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::shard::Shape;

    #[test]
    fn exact_u8_takes_exactly_the_values_the_writer_stores() {
        for k in 0..=255u8 {
            let v = u8_value(k);
            assert_eq!(exact_u8(v), Some(k), "{k}");
            // The neighbouring floats are not pixels.
            assert_eq!(
                exact_u8(f32::from_bits(v.to_bits() + 1)),
                None,
                "{k} + 1 ulp"
            );
            if k > 0 {
                assert_eq!(
                    exact_u8(f32::from_bits(v.to_bits() - 1)),
                    None,
                    "{k} - 1 ulp"
                );
            }
            let w = (k as u16 * 257) as f32 / 65535.0;
            assert_eq!(exact_u16(w), Some(k as u16 * 257), "{k} as u16");
        }
        for v in [
            -0.0,
            -1e-45,
            0.5,
            1.0 + f32::EPSILON,
            2.0,
            f32::NAN,
            f32::INFINITY,
        ] {
            assert_eq!(exact_u8(v), None, "{v}");
        }
        assert_eq!(exact_u16(1.0), Some(65535));
        assert_eq!(exact_u16(-0.0), None);
    }

    #[test]
    fn encode_exact_and_scaled_name_the_first_value_they_cannot_store() {
        let mut out = [0u8; 16];
        let v = [0.0, 1.0 / 255.0, 1.0, 0.5];
        assert_eq!(encode_exact(&v, Dtype::U8, &mut out), Err((3, 0.5)));
        assert_eq!(&out[..3], &[0, 1, 255]);
        assert_eq!(encode_exact(&v[..3], Dtype::U8, &mut out), Ok(()));
        assert_eq!(
            encode_exact(&v, Dtype::F16, &mut out),
            Err((1, 1.0 / 255.0))
        );
        assert_eq!(encode_exact(&[0.5, -2.0], Dtype::F16, &mut out), Ok(()));
        assert!(matches!(
            encode_exact(&[1.0, f32::NAN], Dtype::F32, &mut out),
            Err((1, x)) if x.is_nan()
        ));
        assert_eq!(
            encode_scaled(&[0.2, 1.5], Dtype::U8, &mut out),
            Err(ScaleError::OutOfRange(1, 1.5))
        );
        assert_eq!(out[0], 51);
        assert_eq!(
            encode_scaled(&[1e6], Dtype::F16, &mut out),
            Err(ScaleError::TooLarge(0, 1e6))
        );
        assert!(matches!(
            encode_scaled(&[0.0, 0.0, f32::INFINITY], Dtype::F32, &mut out),
            Err(ScaleError::NotFinite(2, _))
        ));
        // u8 -> value -> u8 and u16 -> value -> u16 give back the pixels.
        for k in 0..=255u8 {
            encode_scaled(&[value_of(Dtype::U8, &[k], 0)], Dtype::U8, &mut out).unwrap();
            assert_eq!(out[0], k);
            let p = (k as u16 * 251).to_le_bytes();
            encode_scaled(&[value_of(Dtype::U16, &p, 0)], Dtype::U16, &mut out).unwrap();
            assert_eq!(out[..2], p);
        }
    }

    fn write(dir: &Path, split: &str, n: usize, f: usize) {
        let img: Vec<u8> = (0..n * f)
            .flat_map(|j| {
                // Element (sample i, feature k) at j = k * n + i holds i * 1000 + k.
                let (k, i) = (j / n, j % n);
                ((i * 1000 + k) as f32).to_le_bytes()
            })
            .collect();
        std::fs::write(dir.join(images_name(split)), img).unwrap();
        let l: Vec<u8> = (0..n).flat_map(|i| (i as i32 % 3).to_le_bytes()).collect();
        std::fs::write(dir.join(labels_name(split)), l).unwrap();
    }

    #[test]
    fn chunks_read_back_sample_after_sample_across_releases() {
        let t = tempfile::tempdir().unwrap();
        // 70 features: one whole tile of 64 and part of another.
        let (n, f) = (5000, 70);
        write(t.path(), "train", n, f);
        let shape: Shape = "1x7x10".parse().unwrap();
        let found = find_splits(t.path()).unwrap();
        assert_eq!(found.len(), 1);
        let r = ColmajorSplitReader::open_files(&found[0].1, &found[0].2, &shape).unwrap();
        assert_eq!((r.samples, r.features), (n, f));
        // In order, then out of order (each far chunk drops the pages mapped before).
        let starts: Vec<usize> = (0..n).step_by(333).chain([4000, 7, 2500, 0]).collect();
        for s in starts {
            let m = 333.min(n - s);
            let mut out = vec![0f32; m * f];
            r.read_chunk(s, m, &mut out);
            for i in 0..m {
                for k in 0..f {
                    assert_eq!(out[i * f + k], ((s + i) * 1000 + k) as f32, "{s} {i} {k}");
                }
            }
            let l: Vec<i32> = r.labels(s, m).collect();
            assert_eq!(l, (s..s + m).map(|i| i as i32 % 3).collect::<Vec<_>>());
        }
        assert_eq!(r.check_labels(None).unwrap(), vec![1667, 1667, 1666]);
        let scan = r.scan(&shape).unwrap();
        // Values 0 and 1 are pixels 0 and 255; 2 is not.
        assert_eq!(scan.not_u8.map(|x| (x.0, x.1)), Some((0, 2)));
    }

    #[test]
    fn find_splits_names_a_file_without_its_partner() {
        let t = tempfile::tempdir().unwrap();
        write(t.path(), "train", 4, 3);
        write(t.path(), "test", 2, 3);
        std::fs::write(t.path().join("images_.bin"), b"").unwrap();
        std::fs::write(t.path().join("notes.txt"), b"").unwrap();
        let found = find_splits(t.path()).unwrap();
        let names: Vec<&str> = found.iter().map(|f| f.0.as_str()).collect();
        assert_eq!(names, ["test", "train"]);
        assert!(looks_like_seed(t.path()));
        std::fs::remove_file(t.path().join("images_test.bin")).unwrap();
        let e = find_splits(t.path()).unwrap_err().to_string();
        assert!(
            e.contains("labels_test.bin: no images_test.bin beside it"),
            "{e}"
        );
        assert!(looks_like_seed(t.path()));
        std::fs::remove_file(t.path().join("labels_test.bin")).unwrap();
        std::fs::remove_file(t.path().join("labels_train.bin")).unwrap();
        let e = find_splits(t.path()).unwrap_err().to_string();
        assert!(
            e.contains("images_train.bin: no labels_train.bin beside it"),
            "{e}"
        );
        let empty = tempfile::tempdir().unwrap();
        assert!(!looks_like_seed(empty.path()));
    }

    #[test]
    fn sizes_that_do_not_fit_the_shape_are_usage_errors_naming_both_numbers() {
        let t = tempfile::tempdir().unwrap();
        write(t.path(), "train", 10, 12);
        let (ip, lp) = (
            t.path().join("images_train.bin"),
            t.path().join("labels_train.bin"),
        );
        let open = |s: &str| ColmajorSplitReader::open_files(&ip, &lp, &s.parse().unwrap());
        assert!(open("3x2x2").is_ok());
        // 480 bytes: 5 samples of 1x4x6 (96 bytes) for 10 labels.
        let e = open("1x4x6").err().unwrap();
        assert!(matches!(e, Error::Invalid(_)), "{e}");
        let e = e.to_string();
        assert!(e.contains("10 int32 labels (40 bytes), but"), "{e}");
        assert!(e.contains("holds 5 samples of 1x4x6 (480 bytes)"), "{e}");
        assert!(
            e.contains("make 12 float32 values per sample, not the 24 of 1x4x6"),
            "{e}"
        );
        // 480 bytes is not a whole number of 1x5x5 samples (100 bytes).
        let e = open("1x5x5").err().unwrap();
        assert!(matches!(e, Error::Invalid(_)), "{e}");
        assert!(
            e.to_string()
                .contains("480 bytes, is not a multiple of 100 bytes"),
            "{e}"
        );
        // One label short: the labels are truncated (exit 1, not a usage error).
        let l = std::fs::read(&lp).unwrap();
        std::fs::write(&lp, &l[..36]).unwrap();
        let e = open("3x2x2").err().unwrap();
        assert!(matches!(e, Error::Source(_)), "{e}");
        assert!(
            e.to_string().contains("9 int32 labels (36 bytes), but"),
            "{e}"
        );
    }
}
