//! The chunked column-major layout (`formats/colmajor.md`): `images_<split>.bin` holds float32 pixels
//! in [0, 1] (u8/u16 sources) or the values themselves (f16/f32 sources), feature-major (what
//! Fortran reads as `data(n_samples, n_features)`), and `labels_<split>.bin` holds int32 labels. Files are written block by block through a memory map
//! whose pages are released as they are written, so a 100 GB file needs no 100 GB of RAM.

use crate::error::{Error, IoContext, Result};
use crate::shard::manifest::{check_seal, read_capped, seal, write_atomic, Provenance};
use crate::shard::writer::temp_path;
use crate::shard::{Block, Dtype, SampleSpec, Stats};
use memmap2::{MmapMut, MmapOptions};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
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
        write_atomic(&dir.join(crate::shard::manifest::FILE_NAME), &seal(self))
    }

    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join(crate::shard::manifest::FILE_NAME);
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
        crate::shard::Shape::new(self.sample.shape.0.clone()).map_err(|e| e.to_string())?;
        if self.sample.dtype.format_version() as u32 > self.version {
            return Err(format!(
                "dtype {} needs version {}, the file says {}",
                self.sample.dtype,
                self.sample.dtype.format_version(),
                self.version
            ));
        }
        let k = self.classes.len();
        if k == 0 || k > crate::shard::format::MAX_CLASSES as usize {
            return Err(format!("{k} classes is outside 1..=65536"));
        }
        let c = self.sample.shape.channels();
        if self.mean.len() != c || self.std.len() != c {
            return Err("mean/std do not have one value per channel".into());
        }
        for (name, s) in &self.splits {
            if s.images != images_name(name) || s.labels != labels_name(name) {
                return Err(format!(
                    "split {name}: files must be {} and {}",
                    images_name(name),
                    labels_name(name)
                ));
            }
            if s.class_counts.len() != k
                || crate::shard::format::checked_sum(&s.class_counts) != Some(s.samples)
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

/// Writes one split: samples arrive in blocks, in order.
pub struct ColmajorWriter {
    images: PathBuf,
    labels: PathBuf,
    map: MmapMut,
    labels_out: BufWriter<File>,
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
        let tmp = temp_path(&images);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .at(&tmp)?;
        f.set_len(bytes).at(&tmp)?;
        // SAFETY: the file was just created by us under a temporary name; nothing else maps or
        // resizes it while the writer lives.
        let map = unsafe { MmapOptions::new().map_mut(&f) }.at(&tmp)?;
        let ltmp = temp_path(&labels);
        let labels_out = BufWriter::new(File::create(&ltmp).at(&ltmp)?);
        Ok(ColmajorWriter {
            images,
            labels,
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
        lf.sync_all().at(&self.labels)?;
        crate::shard::writer::rename_durably(&temp_path(&self.labels), &self.labels)?;
        crate::shard::writer::rename_durably(&temp_path(&self.images), &self.images)?;
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

/// Read-only view of one colmajor split, memory-mapped.
pub struct ColmajorSplitReader {
    pub samples: usize,
    pub features: usize,
    images: memmap2::Mmap,
    labels: Vec<i32>,
}

impl ColmajorSplitReader {
    pub fn open(dir: &Path, m: &ColmajorManifest, split: &str) -> Result<Self> {
        let s = m
            .splits
            .get(split)
            .ok_or_else(|| Error::manifest(dir, format!("no split '{split}'")))?;
        let features = m.sample.shape.elems();
        let ip = dir.join(&s.images);
        let lp = dir.join(&s.labels);
        let f = File::open(&ip).at(&ip)?;
        let want = s
            .samples
            .checked_mul(features as u64 * 4)
            .ok_or_else(|| Error::manifest(&ip, "size overflows"))?;
        let len = f.metadata().at(&ip)?.len();
        if len != want {
            return Err(Error::manifest(
                &ip,
                format!("is {len} bytes, expected {want}"),
            ));
        }
        // SAFETY: read-only map of a file we do not modify; a concurrent truncation by another
        // process is outside what a dataset reader can guard against.
        let images = unsafe { memmap2::Mmap::map(&f) }.at(&ip)?;
        let lb = std::fs::read(&lp).at(&lp)?;
        if lb.len() as u64 != want / features as u64 {
            return Err(Error::manifest(
                &lp,
                format!("is {} bytes, expected {}", lb.len(), s.samples * 4),
            ));
        }
        let labels = lb
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        Ok(ColmajorSplitReader {
            samples: s.samples as usize,
            features,
            images,
            labels,
        })
    }

    /// Value of feature `f` of sample `i`.
    pub fn get(&self, i: usize, f: usize) -> f32 {
        let o = (f * self.samples + i) * 4;
        f32::from_le_bytes(self.images[o..o + 4].try_into().unwrap())
    }

    pub fn label(&self, i: usize) -> i32 {
        self.labels[i]
    }
}
