//! `manifest.json`: what a dataset holds and how to check it. It carries a checksum of its own bytes
//! (see `formats/shard.md`), so a single changed byte anywhere in it is detected.

use super::format::MAX_CLASSES;
use super::{Codec, SampleSpec, Stats};
use crate::format::fields::{FieldStats, Fields};
use crate::util::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Component, Path};
use twox_hash::XxHash3_64;

pub const FORMAT: &str = "prep-shards";
/// Version 1 describes u8/u16 datasets, version 2 adds f16/f32, version 3 sample fields; a
/// writer uses the lowest version that describes its data, so older manifests are unchanged.
pub const VERSION: u32 = 3;
pub const FILE_NAME: &str = "manifest.json";
/// A reader refuses larger manifests before reading them.
pub const MAX_MANIFEST_BYTES: u64 = 256 << 20;
const CHECKSUM_KEY: &[u8] = b"\"checksum\": \"";
const ZERO_SUM: &str = "0000000000000000";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    pub sample: SampleSpec,
    pub classes: Vec<String>,
    /// What each sample carries beside its image and class (version 3), in block order.
    #[serde(default, skip_serializing_if = "Fields::is_empty")]
    pub fields: Fields,
    pub codec: Codec,
    pub block_samples: u32,
    /// Per-channel mean and std of value / `dtype.divisor()` (pixel / max for u8/u16, the value
    /// itself for f16/f32) over the train split (or the first split).
    pub mean: Vec<f64>,
    pub std: Vec<f64>,
    pub splits: BTreeMap<String, SplitInfo>,
    pub provenance: Provenance,
    /// Present only in the output of `--part I/N`: which part of which job it is. Absent
    /// otherwise, so other manifests are what they were before parts existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<crate::format::part::Part>,
    /// xxh3-64 of this file with these 16 hex digits set to '0'. Always the last member.
    pub checksum: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SplitInfo {
    pub samples: u64,
    pub class_counts: Vec<u64>,
    /// Each field's summary over the split (its shards' added in order); empty without fields
    /// or samples.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<FieldStats>,
    pub mean: Vec<f64>,
    pub std: Vec<f64>,
    pub shards: Vec<ShardInfo>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardInfo {
    /// Path relative to the dataset directory.
    pub file: String,
    pub samples: u64,
    pub blocks: u32,
    pub bytes: u64,
    /// The footer checksum stored in the shard's trailer, which covers every block checksum.
    pub footer_xxh3: String,
    /// Each field's summary over the shard (version 3).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<FieldStats>,
    #[serde(skip)]
    pub stats: Stats,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    pub tool: String,
    pub command: Vec<String>,
    /// What produced the data: generator parameters for `synth`, the source for `convert`.
    pub source: serde_json::Value,
}

impl Provenance {
    pub fn here(source: serde_json::Value) -> Self {
        Provenance {
            tool: format!("prep {}", env!("CARGO_PKG_VERSION")),
            command: crate::util::command_args(),
            source,
        }
    }
}

impl SplitInfo {
    pub fn from_shards(spec: &SampleSpec, num_classes: u32, shards: Vec<ShardInfo>) -> Self {
        let mut stats = Stats::empty(num_classes, spec);
        for s in &shards {
            stats.add(&s.stats);
        }
        let (mean, std) = stats.mean_std(spec);
        let mut fields: Vec<FieldStats> = Vec::new();
        for s in &shards {
            if fields.is_empty() {
                fields = s.fields.clone();
            } else {
                fields.iter_mut().zip(&s.fields).for_each(|(a, b)| a.add(b));
            }
        }
        SplitInfo {
            samples: stats.samples(),
            class_counts: stats.class_counts,
            fields,
            mean,
            std,
            shards,
        }
    }
}

impl Manifest {
    /// A manifest for the given splits; mean/std are taken from `train` when present.
    pub fn new(
        sample: SampleSpec,
        classes: Vec<String>,
        codec: Codec,
        block_samples: u32,
        splits: BTreeMap<String, SplitInfo>,
        provenance: Provenance,
    ) -> Self {
        let first = splits
            .get(stats_split(splits.keys()))
            .expect("stats_split names a split");
        let (mean, std) = (first.mean.clone(), first.std.clone());
        Manifest {
            format: FORMAT.into(),
            version: sample.dtype.format_version() as u32,
            sample,
            classes,
            fields: Fields::default(),
            codec,
            block_samples,
            mean,
            std,
            splits,
            provenance,
            part: None,
            checksum: ZERO_SUM.into(),
        }
    }

    /// This manifest with samples carrying `fields` (version 3 where there are any).
    pub fn with_fields(mut self, fields: Fields) -> Self {
        self.version = if fields.is_empty() {
            self.sample.dtype.format_version() as u32
        } else {
            3
        };
        self.fields = fields;
        self
    }

    /// The bytes of the file, checksum included.
    pub fn to_bytes(&self) -> Vec<u8> {
        seal(self)
    }

    /// Write `dir/manifest.json` atomically (temporary file, then rename).
    pub fn write(&self, dir: &Path) -> Result<()> {
        crate::store::output::write_atomic(&dir.join(FILE_NAME), &self.to_bytes())
    }

    /// Read and check `dir/manifest.json`: size cap, checksum, then consistency.
    pub fn read(dir: &Path) -> Result<Self> {
        Self::read_from(&*crate::store::open_dir(dir)?)
    }

    /// The manifest of the dataset in `store`.
    pub fn read_from(store: &dyn crate::store::Store) -> Result<Self> {
        let bytes = store.read(FILE_NAME, MAX_MANIFEST_BYTES, "a manifest")?;
        Self::from_bytes(&store.location(FILE_NAME), &bytes)
    }

    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Self> {
        let m: Manifest = serde_json::from_slice(bytes)
            .map_err(|e| Error::manifest(path, format!("not a valid manifest: {e}")))?;
        if m.format != FORMAT {
            return Err(Error::manifest(
                path,
                format!("format is '{}', expected '{FORMAT}'", m.format),
            ));
        }
        if !(1..=VERSION).contains(&m.version) {
            return Err(Error::manifest(
                path,
                format!(
                    "version {} is not supported (this prep reads versions 1 to {VERSION})",
                    m.version
                ),
            ));
        }
        check_seal(path, bytes, &m.checksum)?;
        m.validate().map_err(|what| Error::manifest(path, what))?;
        Ok(m)
    }

    /// Rules that hold between the members of a manifest.
    fn validate(&self) -> std::result::Result<(), String> {
        let k = self.classes.len();
        if k == 0 || k > MAX_CLASSES as usize {
            return Err(format!("{k} classes is outside 1..={MAX_CLASSES}"));
        }
        super::Shape::new(self.sample.shape.0.clone()).map_err(|e| e.to_string())?;
        self.sample.check().map_err(|e| e.to_string())?;
        let v = self.sample.dtype.format_version() as u32;
        if v > self.version {
            return Err(format!(
                "dtype {} needs manifest version {v}, the file says {}",
                self.sample.dtype, self.version
            ));
        }
        if self.fields.is_empty() != (self.version < 3) {
            return Err(format!(
                "version {} with {} fields: fields come with version 3 and version 3 with fields",
                self.version,
                self.fields.0.len()
            ));
        }
        self.fields.validate(&self.sample.shape.0)?;
        let c = self.sample.shape.channels();
        if self.mean.len() != c || self.std.len() != c {
            return Err("mean/std do not have one value per channel".into());
        }
        for (name, s) in &self.splits {
            if !is_split_name(name) {
                return Err(format!(
                    "split name {name:?} is not a plain name (A-Z a-z 0-9 _ -)"
                ));
            }
            if s.class_counts.len() != k {
                return Err(format!(
                    "split {name}: {} class counts for {k} classes",
                    s.class_counts.len()
                ));
            }
            if super::format::checked_sum(&s.class_counts) != Some(s.samples) {
                return Err(format!(
                    "split {name}: class counts do not add up to {}",
                    s.samples
                ));
            }
            let shard_samples: Vec<u64> = s.shards.iter().map(|sh| sh.samples).collect();
            if super::format::checked_sum(&shard_samples) != Some(s.samples) {
                return Err(format!(
                    "split {name}: shard sample counts do not add up to {}",
                    s.samples
                ));
            }
            self.check_field_stats(&s.fields, s.samples)
                .map_err(|e| format!("split {name}: {e}"))?;
            for sh in &s.shards {
                self.check_field_stats(&sh.fields, sh.samples)
                    .map_err(|e| format!("split {name}, shard {}: {e}", sh.file))?;
                let p = Path::new(&sh.file);
                if sh.file.is_empty() || !p.components().all(|c| matches!(c, Component::Normal(_)))
                {
                    return Err(format!(
                        "split {name}: shard path {:?} is not a relative path inside the dataset directory (no root, '..' or '.' component)",
                        sh.file
                    ));
                }
            }
        }
        Ok(())
    }

    /// Summaries of the fields over `samples` samples: one per field that fits it (none where
    /// there are no fields, or for a split without samples).
    fn check_field_stats(
        &self,
        st: &[FieldStats],
        samples: u64,
    ) -> std::result::Result<(), String> {
        if st.is_empty() && (self.fields.is_empty() || samples == 0) {
            return Ok(());
        }
        if st.len() != self.fields.0.len() {
            return Err(format!(
                "{} field summaries for {} fields",
                st.len(),
                self.fields.0.len()
            ));
        }
        for (f, s) in self.fields.iter().zip(st) {
            if !s.fits(f, samples) {
                return Err(format!(
                    "the summary of field {} does not fit its {samples} samples",
                    f.name
                ));
            }
        }
        Ok(())
    }

    pub fn num_classes(&self) -> u32 {
        self.classes.len() as u32
    }

    /// Raw (decoded) bytes of all pixels in the dataset.
    pub fn raw_bytes(&self) -> u64 {
        let samples = self
            .splits
            .values()
            .fold(0u64, |a, s| a.saturating_add(s.samples));
        samples.saturating_mul(self.sample.bytes() as u64)
    }
}

/// The split whose statistics a dataset reports as its mean/std: `train`, else the first by name.
pub fn stats_split<'a>(mut names: impl Iterator<Item = &'a String> + Clone) -> &'a str {
    if names.clone().any(|n| n == "train") {
        "train"
    } else {
        names.next().map(String::as_str).unwrap_or("train")
    }
}

fn checksum_pos(bytes: &[u8]) -> Option<usize> {
    let key = bytes
        .windows(CHECKSUM_KEY.len())
        .rposition(|w| w == CHECKSUM_KEY)?;
    Some(key + CHECKSUM_KEY.len())
}

/// Serialise a JSON document whose last member is `"checksum"`, and fill that member with the xxh3-64
/// of the document's bytes taken with the checksum's 16 hex digits set to '0'.
pub fn seal<T: Serialize>(doc: &T) -> Vec<u8> {
    let mut v = serde_json::to_value(doc).expect("manifest serialises");
    if let Some(o) = v.as_object_mut() {
        o.insert("checksum".into(), ZERO_SUM.into());
    }
    let mut bytes = serde_json::to_vec_pretty(&v).expect("manifest serialises");
    bytes.push(b'\n');
    let sum = format!("{:016x}", XxHash3_64::oneshot(&bytes));
    let at = checksum_pos(&bytes).expect("checksum member is written");
    bytes[at..at + 16].copy_from_slice(sum.as_bytes());
    bytes
}

/// Check the self-checksum written by `seal`; `stored` is the parsed `checksum` member.
pub fn check_seal(path: &Path, bytes: &[u8], stored: &str) -> Result<()> {
    let at = checksum_pos(bytes)
        .filter(|&at| bytes.get(at..at + 16) == Some(stored.as_bytes()))
        .ok_or_else(|| {
            Error::manifest(
                path,
                "the checksum member is missing or not the last member",
            )
        })?;
    let mut zeroed = bytes.to_vec();
    zeroed[at..at + 16].copy_from_slice(ZERO_SUM.as_bytes());
    let computed = format!("{:016x}", XxHash3_64::oneshot(&zeroed));
    if computed != stored {
        return Err(Error::manifest(
            path,
            format!("checksum mismatch (stored {stored}, computed {computed}): the file was changed or damaged"),
        ));
    }
    Ok(())
}

/// Whether `name` may name a split: non-empty, only ASCII letters, digits, `_` and `-` (split
/// names become folder and file names: `train/`, `images_train.bin`).
pub fn is_split_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Read a JSON file after checking that it is a regular file within the manifest size cap.
pub fn read_capped(path: &Path) -> Result<Vec<u8>> {
    crate::store::local::read_capped(path, MAX_MANIFEST_BYTES, "a manifest")
}
