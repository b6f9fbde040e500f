//! `prep convert`: real data into a dataset (shards or colmajor), decoded in parallel with bounded
//! memory, with bad inputs skipped into a rejects report or stopping the run.
//!
//! Everything is written into `OUT/.prep-staging/` first and moved into place only when the whole
//! conversion succeeded; a failed run removes its staging folder, so the output directory holds
//! either the complete new dataset or what it held before.

pub mod merge;

mod decode;
mod file_fields;
mod folders;
mod msd;
mod output;
mod part;
mod plan;
mod run;
mod split;
mod stored;
mod target;
mod tree_fields;
mod tree_units;
mod units;
mod volumes;
mod write;

pub use split::SplitReport;

use run::convert_into;

use crate::format::colmajor::{
    ColmajorManifest, ColmajorSplit, ColmajorSplitReader, ColmajorWriter,
};
use crate::format::fields::{Field, Fields};
use crate::format::part::{Part, PartRange, PartSpec};
use crate::format::shard::manifest::{self, stats_split, Provenance, SplitInfo};
use crate::format::shard::{
    default_block_samples, default_shard_blocks, Block, Codec, Dataset, Dtype, Manifest,
    SampleSpec, Shape, ShardReader, SplitWriter,
};
use crate::format::OutputFormat;
use crate::source::dicom::series::{self, SeriesPlan};
use crate::source::transform::{to_sample, Fit, Target};
use crate::source::{
    cifar, dicom, idx, npy, tree, DecodeOptions, FileKind, FloatFrame, Frame, Probe, Reject,
};
use crate::store::output::write_atomic;
use crate::util::error::{Error, IoContext, Result};
use crate::util::pipeline::ordered_map;
use rayon::prelude::*;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

pub const STAGING: &str = ".prep-staging";
pub const REJECTS: &str = "rejects.jsonl";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Auto,
    Idx,
    Cifar,
    Images,
    Video,
    Dicom,
    Nifti,
    Tiff,
    Npy,
    /// A Medical Segmentation Decathlon / nnU-Net folder: dataset.json, imagesTr/, labelsTr/.
    Msd,
    /// The column-major layout (`images_<split>.bin`, `labels_<split>.bin`), with or without
    /// prep's manifest.
    Colmajor,
    /// A prep shard dataset.
    Shards,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    Skip,
    Fail,
}

#[derive(Debug, Clone)]
pub struct ConvertOptions {
    /// Class names in class-index order, replacing the source's (their number must match).
    pub class_names: Option<Vec<String>>,
    pub input: PathBuf,
    pub out: PathBuf,
    pub kind: Kind,
    /// The sample shape of column-major files without a manifest (which do not say it).
    pub shape: Option<Shape>,
    /// (height, width); None: the source's own size.
    pub size: Option<(u32, u32)>,
    pub channels: Option<u8>,
    pub dtype: Option<Dtype>,
    pub fit: Fit,
    /// A CSV of `path,label` rows labelling the files of a tree, or with a header row, of a
    /// class column, 0/1 label columns and value columns (`source::labels_csv`).
    pub labels: Option<PathBuf>,
    /// The labels CSV's columns that hold numbers: the `values` field, in this order.
    pub values: Vec<String>,
    /// A folder of masks beside the tree's images, paired by relative path and stem (without
    /// it, a folder laid out as `images/` beside `masks/` or `labels/` is found by itself).
    pub masks: Option<PathBuf>,
    /// Names of the mask values in value order; None: "0".."max" of the values seen.
    pub mask_names: Option<Vec<String>>,
    /// A regex whose first capture group, matched against a file's path relative to the input,
    /// is its class (see `tree::LabelRegex`).
    pub label_from: Option<String>,
    pub test_fraction: f64,
    /// `--test-fraction` was given (refused for a tree that keeps its own split folders).
    pub test_fraction_given: bool,
    /// `--classes folders`: a DICOM tree's class folders stay classes even where each holds
    /// one patient (`tree_units::patient_folders`).
    pub folder_classes: bool,
    /// `--mixed-modalities`: DICOM files of several modalities may share the dataset.
    pub mixed_modalities: bool,
    pub on_error: OnError,
    pub decode: DecodeOptions,
    pub format: OutputFormat,
    pub codec: Codec,
    pub block_samples: Option<u32>,
    pub shard_blocks: Option<u32>,
    pub force: bool,
    /// Convert only this part of the input (`crate::format::part`): a contiguous range of each split.
    pub part: Option<PartSpec>,
    /// Volumes with label volumes (MSD): leave out slices whose mask is all background.
    pub skip_empty_masks: bool,
    /// Give every sample of a tree's files a `meta` field: its source path, frame or slice,
    /// a video frame's time, DICOM patient and series, voxel size (`source::meta::FILE_KEYS`).
    pub meta: bool,
    pub quiet: bool,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RejectEntry {
    pub path: String,
    pub reason: String,
}

#[derive(Debug, Serialize)]
pub struct ConvertReport {
    pub out: PathBuf,
    pub kind: Kind,
    pub shape: Vec<u32>,
    pub dtype: Dtype,
    pub classes: usize,
    pub splits: BTreeMap<String, u64>,
    pub inputs: usize,
    pub rejects: Vec<RejectEntry>,
    /// A tree's own split folders (top folder -> split), empty when the splits were drawn by
    /// hash or come from the source's files.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub split_folders: BTreeMap<String, String>,
    /// How train and test were drawn and what came out, where prep drew them (`split`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub split: Option<SplitReport>,
    /// What the conversion decided on its own (one class for a flat folder, channels from mixed
    /// inputs, ...), also printed on stderr unless quiet.
    pub notes: Vec<String>,
    pub seconds: f64,
    pub samples_per_sec: f64,
    pub bytes_on_disk: u64,
    pub peak_rss_bytes: u64,
    /// `out` already held the dataset these options and inputs make: nothing was done.
    pub already_complete: bool,
}

pub fn convert(o: &ConvertOptions) -> Result<ConvertReport> {
    // A run that fails removes the output directory it created (when nothing else is in it).
    let created = !o.out.exists();
    let r = convert_into(o, false);
    if r.is_err() && created {
        let _ = std::fs::remove_dir(&o.out);
    }
    r.map_err(|e| {
        e.when_interrupted(|| {
            let kept = if created {
                "nothing was written".to_string()
            } else {
                format!("{} holds what it held before", o.out.display())
            };
            format!("{kept}: the same command converts again from the start")
        })
    })
}
