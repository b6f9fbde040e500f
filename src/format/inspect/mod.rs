//! What `prep inspect` reports about a dataset, and the sample grid picture (`grid`).

mod grid;
pub use grid::grid;

use crate::format::colmajor::ColmajorManifest;
use crate::format::shard::Dataset;
use crate::util::error::Result;
use serde::Serialize;
use std::path::Path;

#[derive(Debug, Serialize)]
pub struct Summary {
    pub dir: String,
    pub format: String,
    pub shape: Vec<u32>,
    pub dtype: String,
    pub classes: Vec<String>,
    /// What each sample carries beside its image and class (format version 3).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<crate::format::fields::Field>,
    pub mean: Vec<f64>,
    pub std: Vec<f64>,
    pub codec: Option<crate::format::shard::Codec>,
    pub block_samples: Option<u32>,
    pub splits: Vec<SplitSummary>,
    pub shards: usize,
    /// Bytes of the dataset's files on disk.
    pub bytes_on_disk: u64,
    /// Bytes of the pixels and labels as decoded (u8/u16 pixels, u32 labels).
    pub bytes_decoded: u64,
    pub compression_ratio: f64,
    pub provenance: serde_json::Value,
    /// Which part of a fanned-out job this is (`--part I/N`), if it is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub part: Option<crate::format::part::Part>,
}

#[derive(Debug, Serialize)]
pub struct SplitSummary {
    pub name: String,
    pub samples: u64,
    pub class_counts: Vec<u64>,
    /// Each field's summary over the split, in declaration order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<crate::format::fields::FieldStats>,
    pub mean: Vec<f64>,
    pub std: Vec<f64>,
    pub shards: usize,
    pub bytes_on_disk: u64,
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

pub fn summarize(dir: &Path) -> Result<Summary> {
    let format = crate::format::dataset_format(dir)?;
    if format == crate::format::colmajor::FORMAT {
        let m = ColmajorManifest::read(dir)?;
        let listed: Vec<(&str, u64)> = m
            .splits
            .values()
            .flat_map(|s| {
                [
                    // float32 feature-major, whatever the sample dtype.
                    (
                        s.images.as_str(),
                        s.samples * m.sample.shape.elems() as u64 * 4,
                    ),
                    (s.labels.as_str(), s.samples * 4),
                ]
            })
            .collect();
        crate::store::check_present(
            &crate::store::local::Dir::new(dir),
            &dir.join(crate::format::shard::manifest::FILE_NAME),
            &listed,
        )?;
        let splits: Vec<SplitSummary> = m
            .splits
            .iter()
            .map(|(name, s)| SplitSummary {
                name: name.clone(),
                samples: s.samples,
                class_counts: s.class_counts.clone(),
                fields: vec![],
                mean: vec![],
                std: vec![],
                shards: 0,
                bytes_on_disk: file_len(&dir.join(&s.images)) + file_len(&dir.join(&s.labels)),
            })
            .collect();
        let on_disk: u64 = splits.iter().map(|s| s.bytes_on_disk).sum();
        let decoded: u64 = splits
            .iter()
            .map(|s| s.samples * (m.sample.bytes() as u64 + 4))
            .sum();
        return Ok(Summary {
            dir: dir.display().to_string(),
            format,
            shape: m.sample.shape.0.clone(),
            dtype: m.sample.dtype.to_string(),
            classes: m.classes.clone(),
            fields: vec![],
            mean: m.mean.clone(),
            std: m.std.clone(),
            codec: None,
            block_samples: None,
            splits,
            shards: 0,
            bytes_on_disk: on_disk,
            bytes_decoded: decoded,
            compression_ratio: decoded as f64 / on_disk.max(1) as f64,
            provenance: serde_json::to_value(&m.provenance).unwrap_or_default(),
            part: None,
        });
    }
    let ds = Dataset::open(dir)?;
    let m = &ds.manifest;
    ds.check_present()?;
    let splits: Vec<SplitSummary> = m
        .splits
        .iter()
        .map(|(name, s)| SplitSummary {
            name: name.clone(),
            samples: s.samples,
            class_counts: s.class_counts.clone(),
            fields: s.fields.clone(),
            mean: s.mean.clone(),
            std: s.std.clone(),
            shards: s.shards.len(),
            bytes_on_disk: s.shards.iter().map(|sh| sh.bytes).sum(),
        })
        .collect();
    let on_disk: u64 =
        splits.iter().map(|s| s.bytes_on_disk).sum::<u64>() + file_len(&dir.join("manifest.json"));
    let decoded: u64 = splits
        .iter()
        .map(|s| s.samples * (m.sample.bytes() as u64 + 4 + m.fields.bytes() as u64))
        .sum();
    Ok(Summary {
        dir: dir.display().to_string(),
        format,
        shape: m.sample.shape.0.clone(),
        dtype: m.sample.dtype.to_string(),
        classes: m.classes.clone(),
        fields: m.fields.0.clone(),
        mean: m.mean.clone(),
        std: m.std.clone(),
        codec: Some(m.codec),
        block_samples: Some(m.block_samples),
        shards: splits.iter().map(|s| s.shards).sum(),
        splits,
        bytes_on_disk: on_disk,
        bytes_decoded: decoded,
        compression_ratio: decoded as f64 / on_disk.max(1) as f64,
        provenance: serde_json::to_value(&m.provenance).unwrap_or_default(),
        part: m.part.clone(),
    })
}
