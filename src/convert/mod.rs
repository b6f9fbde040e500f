//! `prep convert`: real data into a dataset (shards or colmajor), decoded in parallel with bounded
//! memory, with bad inputs skipped into a rejects report or stopping the run.
//!
//! Everything is written into `OUT/.prep-staging/` first and moved into place only when the whole
//! conversion succeeded; a failed run removes its staging folder, so the output directory holds
//! either the complete new dataset or what it held before.

pub mod merge;

use crate::format::colmajor::{
    ColmajorManifest, ColmajorSplit, ColmajorSplitReader, ColmajorWriter,
};
use crate::format::part::{Part, PartRange, PartSpec};
use crate::format::shard::manifest::{self, stats_split, Provenance, SplitInfo};
use crate::format::shard::{
    default_block_samples, default_shard_blocks, Block, Codec, Dataset, Dtype, Manifest,
    SampleSpec, Shape, ShardReader, SplitWriter,
};
use crate::format::OutputFormat;
use crate::source::series::{self, SeriesPlan};
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
    /// A CSV of `path,label` rows labelling the files of a tree.
    pub labels: Option<PathBuf>,
    /// A regex whose first capture group, matched against a file's path relative to the input,
    /// is its class (see `tree::LabelRegex`).
    pub label_from: Option<String>,
    pub test_fraction: f64,
    /// `--test-fraction` was given (refused for a tree that keeps its own split folders).
    pub test_fraction_given: bool,
    pub on_error: OnError,
    pub decode: DecodeOptions,
    pub format: OutputFormat,
    pub codec: Codec,
    pub block_samples: Option<u32>,
    pub shard_blocks: Option<u32>,
    pub force: bool,
    /// Convert only this part of the input (`crate::format::part`): a contiguous range of each split.
    pub part: Option<PartSpec>,
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

/// One unit of decoding work: a file of a tree, or a range of samples of an array dataset.
#[derive(Clone)]
enum Unit {
    File {
        rel: String,
        path: PathBuf,
        kind: Option<FileKind>,
        label: Option<u32>,
    },
    Array {
        name: String,
        array: Arc<Array>,
        start: usize,
        len: usize,
    },
    /// The files of a DICOM series, decoded as one volume (`source::series`).
    Series {
        name: String,
        plan: Arc<SeriesPlan>,
        label: u32,
        /// What it will give, from its headers.
        probe: Probe,
    },
    /// Block `start` of a shard, or samples `start..start + len` of a column-major split.
    Stored {
        name: String,
        src: Arc<Stored>,
        start: usize,
        len: usize,
    },
}

/// A dataset prep reads back: one shard of a prep dataset, or one split of column-major files.
enum Stored {
    Shard(ShardReader),
    Columns(ColmajorSplitReader, Values),
}

/// What the values of column-major files are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Values {
    /// Pixels of the manifest's dtype, each exactly as the layout stores it (`k / 255` for u8).
    Manifest(Dtype),
    /// No manifest and no `--dtype`: u8 while every value is `k / 255`; the first that is not
    /// makes the conversion start again as f32.
    Auto,
    /// No manifest: float values, converted to `--dtype` by its rule.
    Float,
}

impl Unit {
    fn name(&self) -> &str {
        match self {
            Unit::File { rel, .. } => rel,
            Unit::Array { name, .. } | Unit::Stored { name, .. } => name,
            Unit::Series { name, .. } => name,
        }
    }

    /// Look at a file unit's header (None for array units, whose shape is known).
    fn probe(&self, d: &DecodeOptions) -> Option<Result<Probe, Reject>> {
        match self {
            Unit::File {
                path,
                kind: Some(k),
                ..
            } => Some(k.probe(path, d)),
            Unit::Series { probe, .. } => Some(Ok(*probe)),
            _ => None,
        }
    }
}

/// Samples of an array dataset in memory: pixels of `dtype` (planar or interleaved) and labels.
struct Array {
    /// The file the samples come from: a sample that cannot be used is rejected as `name[i]`.
    name: String,
    n: usize,
    channels: usize,
    height: usize,
    width: usize,
    planar: bool,
    dtype: Dtype,
    data: ArrayData,
    labels: Vec<u32>,
}

/// An array's values: in memory (IDX and CIFAR files are read whole; they are small), or read a
/// block at a time (.npy, of any size).
enum ArrayData {
    Bytes(Vec<u8>),
    Npy(npy::NpyImages),
}

impl Array {
    fn sample_bytes(&self) -> usize {
        self.channels * self.height * self.width * self.dtype.size()
    }

    /// Append samples `start..start+len` in the target layout; a sample that cannot be used (a
    /// float value that is not finite) is left out and returned with its reason.
    fn samples(
        &self,
        start: usize,
        len: usize,
        t: &Target,
        out: &mut Vec<u8>,
        labels: &mut Vec<u32>,
    ) -> Result<Vec<RejectEntry>, Reject> {
        let sb = self.sample_bytes();
        let block: std::borrow::Cow<[u8]> = match &self.data {
            ArrayData::Bytes(b) => b[start * sb..(start + len) * sb].into(),
            ArrayData::Npy(a) => {
                let mut b = Vec::new();
                a.read(start, len, &mut b)?;
                b.into()
            }
        };
        let same = self.planar
            && t.channels as usize == self.channels
            && (t.height as usize, t.width as usize) == (self.height, self.width)
            && t.dtype == self.dtype;
        let mut rejects = Vec::new();
        for i in start..start + len {
            let px = &block[(i - start) * sb..(i - start + 1) * sb];
            let r = if same {
                match crate::format::shard::first_non_finite(self.dtype, px) {
                    None => {
                        out.extend_from_slice(px);
                        Ok(())
                    }
                    Some((k, v)) => {
                        let (plane, w) = (self.height * self.width, self.width);
                        Err(Reject::new(format!(
                            "value {v} at channel {}, row {}, column {}: float samples must be finite",
                            k / plane,
                            k % plane / w,
                            k % w
                        )))
                    }
                }
            } else {
                to_sample(self.frame(px)?, t, out)
            };
            match r {
                Ok(()) => labels.push(self.labels[i]),
                Err(why) => rejects.push(RejectEntry {
                    path: format!("{}[{i}]", self.name),
                    reason: why.0,
                }),
            }
        }
        Ok(rejects)
    }

    /// A sample's bytes `s` as a frame: an image for u8/u16 arrays, float planes for f16/f32 ones.
    fn frame(&self, s: &[u8]) -> Result<Frame, Reject> {
        use image::{DynamicImage, ImageBuffer};
        let (c, h, w) = (self.channels, self.height, self.width);
        let vals: Vec<f32> = (0..c * h * w).map(|k| self.dtype.get(s, k)).collect();
        // To interleaved HWC (planar for floats), dropping a 4th channel (alpha) and widening 1
        // to grey.
        let at = |ch: usize, p: usize| {
            if self.planar {
                vals[ch * h * w + p]
            } else {
                vals[p * c + ch]
            }
        };
        let cc = if c >= 3 { 3 } else { 1 };
        if self.dtype.is_float() {
            return Ok(Frame::Float(FloatFrame {
                channels: cc,
                height: h as u32,
                width: w as u32,
                data: (0..cc)
                    .flat_map(|ch| (0..h * w).map(move |p| at(ch, p)))
                    .collect(),
            }));
        }
        // Integer values below 2^16: exact in f32.
        let inter: Vec<u16> = (0..h * w)
            .flat_map(|p| (0..cc).map(move |ch| at(ch, p) as u16))
            .collect();
        let (w, h) = (w as u32, h as u32);
        let bad = || Reject::new("array sample has the wrong size");
        Ok(Frame::Image(match (self.dtype, cc) {
            (Dtype::U8, 1) => DynamicImage::ImageLuma8(
                ImageBuffer::from_raw(w, h, inter.iter().map(|&v| v as u8).collect())
                    .ok_or_else(bad)?,
            ),
            (Dtype::U8, _) => DynamicImage::ImageRgb8(
                ImageBuffer::from_raw(w, h, inter.iter().map(|&v| v as u8).collect())
                    .ok_or_else(bad)?,
            ),
            (_, 1) => {
                DynamicImage::ImageLuma16(ImageBuffer::from_raw(w, h, inter).ok_or_else(bad)?)
            }
            (_, _) => DynamicImage::ImageRgb16(ImageBuffer::from_raw(w, h, inter).ok_or_else(bad)?),
        }))
    }
}

/// What the source holds, before any pixel is converted.
struct Plan {
    kind: Kind,
    classes: Vec<String>,
    splits: BTreeMap<String, Vec<Unit>>,
    /// Channels, (height, width), dtype of the source where it is known without decoding.
    native: Option<(u8, (u32, u32), Dtype)>,
    rejects: Vec<RejectEntry>,
    inputs: usize,
    /// The folder that unit names are relative to.
    root: PathBuf,
    /// Decisions to tell the user about.
    notes: Vec<String>,
    /// Trees: how the splits were decided (`TreeSplit`).
    split_key: Option<TreeSplit>,
    /// For a prep dataset or column-major files: the samples' shape and dtype (None: the
    /// dtype is found as the values are read).
    stored: Option<(Shape, Option<Dtype>)>,
}

const ARRAY_CHUNK: usize = 2048;

fn array_units(name: &str, a: Arc<Array>) -> Vec<Unit> {
    (0..a.n)
        .step_by(ARRAY_CHUNK)
        .map(|start| Unit::Array {
            name: format!("{name}[{start}..]"),
            array: a.clone(),
            start,
            len: ARRAY_CHUNK.min(a.n - start),
        })
        .collect()
}

fn detect(input: &Path) -> Kind {
    if input.is_dir() {
        if input.join(manifest::FILE_NAME).is_file() {
            match crate::format::dataset_format(input).as_deref() {
                Ok(crate::format::colmajor::FORMAT) => return Kind::Colmajor,
                Ok(manifest::FORMAT) => return Kind::Shards,
                _ => {}
            }
        }
        if crate::format::colmajor::looks_like_seed(input) {
            return Kind::Colmajor;
        }
        if idx::detect(input) {
            return Kind::Idx;
        }
        if cifar::find(input).is_some() {
            return Kind::Cifar;
        }
        // .npy files at the top make it an array dataset even when their names are not ones
        // `npy::find` knows: the plan then lists the names it looks for.
        if npy::find(input).map_or(true, |p| !p.is_empty()) || has_top_npy(input) {
            return Kind::Npy;
        }
    }
    Kind::Auto
}

fn has_top_npy(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|rd| {
        rd.flatten().any(|e| {
            e.path()
                .extension()
                .is_some_and(|x| x.eq_ignore_ascii_case("npy"))
        })
    })
}

fn reject_to_error(root: &Path, name: &str, r: Reject) -> Error {
    Error::Source(format!("{}: {r}", tree::shown_path(&root.join(name))))
}

fn plan(o: &ConvertOptions) -> Result<Plan> {
    let input = &o.input;
    if !input.exists() {
        return Err(Error::Invalid(format!(
            "{}: no such file or directory",
            tree::shown_path(input)
        )));
    }
    let kind = if o.kind == Kind::Auto {
        detect(input)
    } else {
        o.kind
    };
    let mut splits: BTreeMap<String, Vec<Unit>> = BTreeMap::new();
    let fail = |name: &str, r: Reject| {
        Error::Source(format!("{}: {r}", tree::shown_path(&input.join(name))))
    };
    if o.shape.is_some() && kind != Kind::Colmajor {
        return Err(Error::Invalid(format!(
            "{}: --shape gives the sample shape of column-major files without a manifest; this input is {}",
            tree::shown_path(input),
            match kind {
                Kind::Auto => "a folder of files".to_string(),
                Kind::Shards => "a prep shard dataset, whose manifest says its shape".to_string(),
                k => format!("a {k:?} dataset"),
            }
        )));
    }
    if matches!(
        kind,
        Kind::Idx | Kind::Cifar | Kind::Npy | Kind::Colmajor | Kind::Shards
    ) {
        for (flag, given) in [
            ("--labels", o.labels.is_some()),
            ("--label-from", o.label_from.is_some()),
        ] {
            if given {
                return Err(Error::Invalid(format!(
                    "{}: {flag} labels the files of a folder, but this is a {kind:?} dataset with labels of its own",
                    tree::shown_path(input)
                )));
            }
        }
    }
    match kind {
        Kind::Idx => {
            let mut classes = 0;
            let mut native = None;
            for split in ["train", "test"] {
                let Some((ip, lp)) = idx::find(input, split) else {
                    continue;
                };
                let name = |p: &Path| {
                    p.file_name()
                        .unwrap_or_default()
                        .to_string_lossy()
                        .into_owned()
                };
                let im = idx::read(&ip).map_err(|r| fail(&name(&ip), r))?;
                let lb = idx::read(&lp).map_err(|r| fail(&name(&lp), r))?;
                if im.dims.len() != 3 || lb.dims.len() != 1 || lb.dims[0] != im.dims[0] {
                    return Err(fail(
                        &name(&ip),
                        Reject::new(format!(
                            "images {:?} and labels {:?} do not match",
                            im.dims, lb.dims
                        )),
                    ));
                }
                let labels: Vec<u32> = lb.data.iter().map(|&l| l as u32).collect();
                classes = classes.max(labels.iter().max().map_or(0, |&m| m as usize + 1));
                let a = Arc::new(Array {
                    name: name(&ip),
                    n: im.dims[0],
                    channels: 1,
                    height: im.dims[1],
                    width: im.dims[2],
                    planar: true,
                    dtype: Dtype::U8,
                    data: ArrayData::Bytes(im.data),
                    labels,
                });
                native = Some((1, (a.height as u32, a.width as u32), Dtype::U8));
                splits.insert(split.into(), array_units(&name(&ip), a));
            }
            let classes = idx::class_names(input, classes.max(1))
                .unwrap_or_else(|| (0..classes.max(1)).map(|k| k.to_string()).collect());
            Ok(Plan {
                kind,
                classes,
                splits,
                native,
                rejects: vec![],
                inputs: 4,
                root: input.clone(),
                notes: vec![],
                split_key: None,
                stored: None,
            })
        }
        Kind::Cifar => {
            let (v, train, test) = cifar::find(input).ok_or_else(|| {
                Error::Invalid(format!(
                    "{}: no CIFAR batches (data_batch_N.bin or train.bin)",
                    tree::shown_path(input)
                ))
            })?;
            let mut max_label = 0;
            let inputs = train.len() + test.len();
            for (split, files) in [("train", train), ("test", test)] {
                let mut units = Vec::new();
                for f in files {
                    let name = f
                        .file_name()
                        .unwrap_or_default()
                        .to_string_lossy()
                        .into_owned();
                    let raw = cifar::read(&f, v).map_err(|r| fail(&name, r))?;
                    let n = raw.len() / v.record();
                    let mut data = Vec::with_capacity(n * cifar::PIXELS);
                    let mut labels = Vec::with_capacity(n);
                    for rec in raw.chunks_exact(v.record()) {
                        labels.push(rec[v.label_offset()] as u32);
                        data.extend_from_slice(&rec[v.record() - cifar::PIXELS..]);
                    }
                    max_label = max_label.max(*labels.iter().max().unwrap_or(&0));
                    let a = Arc::new(Array {
                        name: name.clone(),
                        n,
                        channels: 3,
                        height: 32,
                        width: 32,
                        planar: true,
                        dtype: Dtype::U8,
                        data: ArrayData::Bytes(data),
                        labels,
                    });
                    units.extend(array_units(&name, a));
                }
                if !units.is_empty() {
                    splits.insert(split.into(), units);
                }
            }
            let k = (max_label as usize + 1).max(if v == cifar::Variant::Cifar10 {
                10
            } else {
                100
            });
            let classes = cifar::class_names(input, v)
                .filter(|n| n.len() >= k)
                .unwrap_or_else(|| (0..k).map(|i| i.to_string()).collect());
            Ok(Plan {
                kind,
                classes,
                splits,
                native: Some((3, (32, 32), Dtype::U8)),
                rejects: vec![],
                inputs,
                root: input.clone(),
                notes: vec![],
                split_key: None,
                stored: None,
            })
        }
        Kind::Npy => {
            let pairs = if input.is_dir() {
                npy::find(input)
                    .map_err(|e| Error::Invalid(format!("{}: {e}", tree::shown_path(input))))?
            } else {
                vec![]
            };
            if pairs.is_empty() {
                return Err(Error::Invalid(format!(
                    "{}: no pair of .npy files by the names prep looks for: {}",
                    tree::shown_path(input),
                    npy::NAMES_HELP
                )));
            }
            let mut max_label = 0;
            let mut native = None;
            for (split, ip, lp) in &pairs {
                let name = |p: &Path| {
                    p.file_name()
                        .unwrap_or_default()
                        .to_string_lossy()
                        .into_owned()
                };
                let float = o.dtype.is_some_and(Dtype::is_float);
                let im = npy::read_images(ip, float).map_err(|r| fail(&name(ip), r))?;
                let labels = npy::read_labels(lp, im.n).map_err(|r| fail(&name(lp), r))?;
                max_label = max_label.max(labels.iter().copied().max().unwrap_or(0));
                native = Some((
                    (im.channels.min(3)) as u8,
                    (im.height as u32, im.width as u32),
                    im.dtype,
                ));
                let a = Arc::new(Array {
                    name: name(ip),
                    n: im.n,
                    channels: im.channels,
                    height: im.height,
                    width: im.width,
                    planar: im.planar,
                    dtype: im.dtype,
                    data: ArrayData::Npy(im),
                    labels,
                });
                if split.is_empty() {
                    // One unsplit pair: split by sample index hash, in chunks kept whole.
                    for u in array_units(&name(ip), a) {
                        let s = if tree::is_test(u.name(), o.test_fraction) {
                            "test"
                        } else {
                            "train"
                        };
                        splits.entry(s.into()).or_default().push(u);
                    }
                } else {
                    splits.insert(split.clone(), array_units(&name(ip), a));
                }
            }
            let classes = (0..=max_label).map(|k| k.to_string()).collect();
            Ok(Plan {
                kind,
                classes,
                splits,
                native,
                rejects: vec![],
                inputs: pairs.len() * 2,
                root: input.clone(),
                notes: vec![],
                split_key: None,
                stored: None,
            })
        }
        Kind::Auto | Kind::Images | Kind::Tiff | Kind::Video | Kind::Dicom | Kind::Nifti => {
            plan_tree(o, kind)
        }
        Kind::Colmajor | Kind::Shards => plan_stored(o, kind),
    }
}

/// A prep dataset (shards or column-major, to change its format, dtype, size or blocks) or
/// column-major files without a manifest: its splits and classes as they are, one unit per
/// shard block or per chunk of column-major samples. Labels of column-major files are checked
/// here in one pass over the labels files.
fn plan_stored(o: &ConvertOptions, kind: Kind) -> Result<Plan> {
    let input = &o.input;
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same(input, &o.out) {
        return Err(Error::Invalid(format!(
            "{}: --out must be another directory than the dataset converted",
            tree::shown_path(&o.out)
        )));
    }
    let check_shape = |have: &Shape| match &o.shape {
        Some(s) if s != have => Err(Error::Invalid(format!(
            "{}: --shape {s}, but the manifest says {have}",
            tree::shown_path(input)
        ))),
        _ => Ok(()),
    };
    let mut splits: BTreeMap<String, Vec<Unit>> = BTreeMap::new();
    let mut rejects = Vec::new();
    let mut inputs = 0;
    let mut notes = Vec::new();
    let (classes, shape, dtype) = if kind == Kind::Shards {
        let ds = Dataset::open(input)?;
        let m = &ds.manifest;
        check_shape(&m.sample.shape)?;
        for (split, info) in &m.splits {
            let mut units = Vec::new();
            for sh in &info.shards {
                inputs += 1;
                let r = match ds.open_shard(sh) {
                    Ok(r) => r,
                    Err(e) if o.on_error == OnError::Skip => {
                        rejects.push(RejectEntry {
                            path: sh.file.clone(),
                            reason: e.to_string(),
                        });
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                let src = Arc::new(Stored::Shard(r));
                let Stored::Shard(r) = &*src else {
                    unreachable!()
                };
                units.extend((0..r.num_blocks()).map(|b| Unit::Stored {
                    name: format!("{} block {b}", sh.file),
                    src: src.clone(),
                    start: b,
                    len: r.entry(b).num_samples as usize,
                }));
            }
            splits.insert(split.clone(), units);
        }
        (
            m.classes.clone(),
            m.sample.shape.clone(),
            Some(m.sample.dtype),
        )
    } else {
        let manifest_path = input.join(manifest::FILE_NAME);
        let (found, shape, dtype, classes) = if manifest_path.is_file() {
            let m = ColmajorManifest::read(input)?;
            check_shape(&m.sample.shape)?;
            let mut found = Vec::new();
            for split in m.splits.keys() {
                let r = ColmajorSplitReader::open(input, &m, split)?;
                r.check_labels(Some(m.classes.len()))?;
                found.push((split.clone(), r));
            }
            (found, m.sample.shape, Some(m.sample.dtype), m.classes)
        } else {
            let pairs = crate::format::colmajor::find_splits(input)?;
            if pairs.is_empty() {
                return Err(Error::Invalid(format!(
                    "{}: no images_<split>.bin with labels_<split>.bin: not column-major files",
                    tree::shown_path(input)
                )));
            }
            let shape = o.shape.clone().ok_or_else(|| {
                Error::Invalid(format!(
                    "{}: column-major files without manifest.json do not say their sample shape: give it with --shape CxHxW",
                    tree::shown_path(input)
                ))
            })?;
            let mut found = Vec::new();
            let mut k = 1;
            for (split, ip, lp) in pairs {
                let r = ColmajorSplitReader::open_files(&ip, &lp, &shape)?;
                k = k.max(r.check_labels(None)?.len());
                found.push((split, r));
            }
            notes.push(format!(
                "no manifest.json: {shape} samples from --shape, {k} classes (0 to {}) from the labels",
                k - 1
            ));
            let classes = (0..k).map(|c| c.to_string()).collect();
            (found, shape, None, classes)
        };
        let values = match (dtype, o.dtype) {
            (Some(d), _) => Values::Manifest(d),
            (None, None) => Values::Auto,
            (None, Some(_)) => Values::Float,
        };
        for (split, r) in found {
            inputs += 2;
            let (n, chunk) = (
                r.samples,
                crate::format::colmajor::chunk_samples(r.features),
            );
            let file = crate::format::colmajor::images_name(&split);
            let src = Arc::new(Stored::Columns(r, values));
            splits.insert(
                split,
                (0..n)
                    .step_by(chunk)
                    .map(|start| Unit::Stored {
                        name: format!("{file}[{start}..]"),
                        src: src.clone(),
                        start,
                        len: chunk.min(n - start),
                    })
                    .collect(),
            );
        }
        (classes, shape, dtype)
    };
    Ok(Plan {
        kind,
        classes,
        splits,
        native: None,
        rejects,
        inputs,
        root: input.clone(),
        notes,
        split_key: None,
        stored: Some((shape, dtype)),
    })
}

/// The target of a conversion of stored samples: their shape (the last two dimensions resized
/// by `--size`, for C x H x W samples) and their dtype unless `--dtype`; channels are kept.
/// Returns whether the dtype is u8 only as long as the values allow it (`Values::Auto`).
fn stored_target(
    o: &ConvertOptions,
    shape: &Shape,
    dtype: Option<Dtype>,
) -> Result<(Target, SampleSpec, bool)> {
    let dims = &shape.0;
    let c = dims[0];
    if let Some(ch) = o.channels {
        if ch as u32 != c {
            return Err(Error::Invalid(format!(
                "--channels {ch}: converting a prep dataset or column-major files keeps the samples' {c} channels"
            )));
        }
    }
    let (h, w) = match dims.len() {
        3 => (dims[1], dims[2]),
        _ => (1, *dims.last().expect("a shape has dimensions")),
    };
    let (th, tw) = match o.size {
        Some(sz) if dims.len() != 3 && sz != (h, w) => {
            return Err(Error::Invalid(format!(
                "--size resizes C x H x W images; these samples are {shape}"
            )))
        }
        Some(sz) => sz,
        None => (h, w),
    };
    let out_shape = if dims.len() == 3 {
        Shape::new(vec![c, th, tw])?
    } else {
        shape.clone()
    };
    let auto = o.dtype.is_none() && dtype.is_none();
    let t = Target {
        channels: c.min(u8::MAX as u32) as u8,
        height: th,
        width: tw,
        dtype: o.dtype.or(dtype).unwrap_or(Dtype::U8),
        fit: o.fit,
    };
    let spec = SampleSpec {
        shape: out_shape,
        dtype: t.dtype,
    };
    Ok((t, spec, auto))
}

/// How the files of a tree get their classes.
enum Labelling {
    /// From the layout: class sub-folders, or one class for a flat folder or a single file.
    Layout,
    Csv(tree::LabelsCsv),
    Regex(tree::LabelRegex),
}

fn labelling(o: &ConvertOptions) -> Result<Labelling> {
    Ok(match (&o.labels, &o.label_from) {
        (Some(_), Some(_)) => {
            return Err(Error::Invalid(
                "--labels and --label-from both say how files are labelled; give one".into(),
            ))
        }
        (Some(p), None) => Labelling::Csv(tree::read_labels_csv(p).map_err(Error::Invalid)?),
        (None, Some(re)) => Labelling::Regex(tree::LabelRegex::new(re).map_err(Error::Invalid)?),
        (None, None) => Labelling::Layout,
    })
}

fn plan_tree(o: &ConvertOptions, kind: Kind) -> Result<Plan> {
    let tree = tree::walk(&o.input)?;
    let labelling = labelling(o)?;
    let accepts = |k: FileKind| match kind {
        Kind::Images => matches!(k, FileKind::Image | FileKind::Tiff),
        Kind::Tiff => k == FileKind::Tiff,
        Kind::Video => k == FileKind::Video,
        Kind::Dicom => k == FileKind::Dicom,
        Kind::Nifti => k == FileKind::Nifti,
        _ => true,
    };
    let mut rejects = Vec::new();
    let mut reject = |path: &str, reason: String| {
        rejects.push(RejectEntry {
            path: path.to_string(),
            reason,
        })
    };
    let mut notes = Vec::new();

    // Files of a kind this run decodes; with a CSV, only the files it lists are part of the
    // dataset (anything else in the folder is left alone, not reported).
    let mut usable = Vec::new();
    for f in &tree.files {
        if let Labelling::Csv(m) = &labelling {
            if !m.rows.contains_key(&f.rel) {
                continue;
            }
        }
        match f.kind {
            None => reject(
                &f.rel,
                "not an image, video or scan file (unknown extension)".into(),
            ),
            Some(k) if !accepts(k) => reject(
                &f.rel,
                format!("is a {} file, not {kind:?}", k.name()).to_lowercase(),
            ),
            Some(_) => usable.push(f),
        }
    }

    // Links that point to nothing are bad inputs (with a CSV, only where it lists them: as
    // missing, below); links to folders are not followed, which a note says.
    if !matches!(labelling, Labelling::Csv(_)) {
        for rel in &tree.dangling {
            reject(
                rel,
                "a symbolic link to nothing (a missing target, or a loop)".into(),
            );
        }
    }
    // Never opened: a FIFO would block the read, a device never end it.
    for (rel, what) in &tree.special {
        reject(rel, format!("is {what}, not a regular file"));
    }
    if let Some(first) = tree.folder_links.first() {
        let n = tree.folder_links.len();
        notes.push(format!(
            "{n} symbolic link{} to folders not followed (e.g. {})",
            if n == 1 { "" } else { "s" },
            tree::shown(first)
        ));
    }

    // Each usable file with its class, and the splits its top folders may give.
    let mut chosen: Vec<(&tree::TreeFile, String)> = Vec::new();
    let mut folders = tree::SplitFolders::None;
    match &labelling {
        Labelling::Csv(m) => {
            chosen.extend(
                usable
                    .into_iter()
                    .map(|f| (f, m.rows[&f.rel].label.clone())),
            );
            // Rows that name no file of the tree: missing, or not walked (hidden, behind a
            // link to a folder, not a regular file), or outside it.
            let csv = o
                .labels
                .as_deref()
                .map(tree::shown_path)
                .unwrap_or_default();
            let walked: std::collections::BTreeSet<&str> =
                tree.files.iter().map(|f| f.rel.as_str()).collect();
            for (rel, row) in &m.rows {
                if !walked.contains(rel.as_str()) {
                    let why = if tree.root.join(rel).exists() {
                        "not read (hidden, inside a linked folder, or not a regular file)"
                    } else {
                        "missing"
                    };
                    reject(rel, format!("listed in {csv} line {} but {why}", row.line));
                }
            }
            for (raw, why) in &m.outside {
                reject(raw, why.clone());
            }
        }
        Labelling::Regex(re) => {
            for f in usable {
                match re.class_of(&f.rel) {
                    Ok(c) => chosen.push((f, c)),
                    Err(why) => reject(&f.rel, why),
                }
            }
        }
        Labelling::Layout => {
            let (loose, nested): (Vec<_>, Vec<_>) =
                usable.into_iter().partition(|f| f.top_folder().is_none());
            if let (Some(a), Some(b)) = (loose.first(), nested.first()) {
                let folders: std::collections::BTreeSet<_> =
                    nested.iter().filter_map(|f| f.top_folder()).collect();
                return Err(Error::Invalid(format!(
                    "{}: {} directly in the folder (e.g. {}) and {} in {} (e.g. {}/), so the classes are unclear; move the loose files into class sub-folders, convert one sub-folder on its own, or label every file with --labels FILE.csv or --label-from REGEX",
                    tree::shown_path(&o.input),
                    count(loose.len(), "file"),
                    tree::shown(&a.rel),
                    nested.len(),
                    count(folders.len(), "sub-folder"),
                    tree::shown(b.top_folder().unwrap_or_default())
                )));
            }
            if !loose.is_empty() {
                // A flat folder (or one file): everything is one class, named after it.
                let class = tree.own_name(&o.input);
                notes.push(if tree.single {
                    format!("one class {}: a single file", json_str(&class))
                } else {
                    format!(
                        "one class {}: {} directly in {} (class sub-folders, --labels or --label-from give more classes)",
                        json_str(&class),
                        count(loose.len(), "file"),
                        tree::shown_path(&o.input)
                    )
                });
                chosen.extend(loose.into_iter().map(|f| (f, class.clone())));
            } else {
                folders = split_folders(o, nested.iter().filter_map(|f| f.top_folder()), false)?;
                if folders == tree::SplitFolders::None {
                    chosen.extend(nested.into_iter().filter_map(|f| {
                        let c = f.top_folder()?.to_string();
                        Some((f, c))
                    }));
                } else {
                    // split/class/file: the class is the folder below the split's.
                    for f in nested {
                        let below = f.rel.split_once('/').and_then(|(_, r)| r.split_once('/'));
                        match below {
                            Some((class, _)) => chosen.push((f, class.to_string())),
                            None => {
                                let top = f.top_folder().unwrap_or_default();
                                return Err(Error::Invalid(format!(
                                    "{}: {} stands directly in the split folder {}/, whose files need class sub-folders ({}/CLASS/...); move it into one, or label every file with --labels FILE.csv or --label-from REGEX",
                                    tree::shown_path(&o.input),
                                    tree::shown(&f.rel),
                                    tree::shown(top),
                                    tree::shown(top)
                                )));
                            }
                        }
                    }
                }
            }
        }
    }
    // Labels from a CSV or a regex: split folders at the top still keep their splits.
    if !matches!(labelling, Labelling::Layout) {
        let loose = chosen.iter().any(|(f, _)| f.top_folder().is_none());
        folders = split_folders(o, chosen.iter().filter_map(|(f, _)| f.top_folder()), loose)?;
    }
    match &folders {
        tree::SplitFolders::Splits(m) => {
            if o.test_fraction_given {
                return Err(Error::Invalid(format!(
                    "--test-fraction {}: {} keeps its own splits in the folders {}, so none is drawn by hash; leave --test-fraction out (or convert the training folder alone to split it by hash)",
                    o.test_fraction,
                    tree::shown_path(&o.input),
                    m.keys().map(|k| format!("{}/", tree::shown(k))).collect::<Vec<_>>().join(", ")
                )));
            }
            let each: Vec<String> = m
                .iter()
                .map(|(folder, split)| {
                    if folder == split {
                        format!("{}/", tree::shown(folder))
                    } else {
                        format!("{}/ -> {split}", tree::shown(folder))
                    }
                })
                .collect();
            notes.push(format!(
                "splits from folders: {} (prep train evaluates on the test split, prep eval reads it by default); no split drawn by hash",
                each.join(", ")
            ));
        }
        tree::SplitFolders::TrainOnly(t) => notes.push(format!(
            "{}/ is the only folder: its sub-folders are the classes, and the test split is drawn from it by a hash of each path (--test-fraction {})",
            tree::shown(t),
            o.test_fraction
        )),
        tree::SplitFolders::None => {
            let named: Vec<&str> = chosen
                .iter()
                .filter_map(|(f, _)| f.top_folder())
                .filter(|t| {
                    let l = t.to_ascii_lowercase();
                    l == tree::TRAIN_FOLDER || tree::HELD_OUT_FOLDERS.contains(&l.as_str())
                })
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            if !named.is_empty() && matches!(labelling, Labelling::Layout) {
                notes.push(format!(
                    "{} named like split folders, but not every top folder is one: each top folder is a class, and the test split is drawn by hash",
                    named.iter().map(|t| format!("{}/", tree::shown(t))).collect::<Vec<_>>().join(" and ")
                ));
            }
        }
    }

    let classes: Vec<String> = {
        let mut c: Vec<String> = chosen.iter().map(|(_, c)| c.clone()).collect();
        c.sort();
        c.dedup();
        c
    };
    if classes.is_empty() {
        let example = rejects
            .first()
            .map(|r| format!(", e.g. {}: {}", tree::shown(&r.path), r.reason))
            .unwrap_or_default();
        return Err(Error::Invalid(format!(
            "{}: found no usable input files ({} rejected{example})",
            tree::shown_path(&o.input),
            rejects.len(),
        )));
    }
    // The kind it turned out to be, for the report: one kind of file, or a folder of images.
    let kind = match kind {
        Kind::Auto => {
            let mut kinds = chosen.iter().filter_map(|(f, _)| f.kind);
            match kinds.next() {
                Some(first) if kinds.all(|k| k == first) => match first {
                    FileKind::Image => Kind::Images,
                    FileKind::Tiff => Kind::Tiff,
                    FileKind::Video => Kind::Video,
                    FileKind::Dicom => Kind::Dicom,
                    FileKind::Nifti => Kind::Nifti,
                },
                _ => Kind::Images,
            }
        }
        k => k,
    };
    let inputs = chosen.len() + rejects.len();
    let tu = tree_units(o, chosen, &classes, &folders);
    rejects.extend(tu.rejects);
    notes.extend(tu.notes);
    Ok(Plan {
        kind,
        classes,
        splits: tu.splits,
        native: None,
        rejects,
        inputs,
        root: tree.root.clone(),
        notes,
        split_key: Some(TreeSplit {
            key: tu.split_key,
            keys: tu.split_keys,
            folders: match folders {
                tree::SplitFolders::Splits(m) => m,
                _ => BTreeMap::new(),
            },
        }),
        stored: None,
    })
}

/// How a tree's splits were decided: by a hash of what `key` names (`TreeUnits::split_key`;
/// "folders" for split folders), with the units each key split, and the split folders (top
/// folder -> split) when the tree has its own.
#[derive(Debug, Clone, Serialize)]
struct TreeSplit {
    key: String,
    keys: BTreeMap<String, usize>,
    folders: BTreeMap<String, String>,
}

/// `tree::split_folders`, its error naming the input.
fn split_folders<'a>(
    o: &ConvertOptions,
    tops: impl IntoIterator<Item = &'a str>,
    loose: bool,
) -> Result<tree::SplitFolders> {
    tree::split_folders(tops, loose)
        .map_err(|e| Error::Invalid(format!("{}: {e}", tree::shown_path(&o.input))))
}

/// A name in double quotes, escaped as a JSON string (a newline in it forges no line).
fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// "1 file", "3 files".
fn count(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

/// The units of a labelled tree, by split, and what decided the split.
struct TreeUnits {
    splits: BTreeMap<String, Vec<Unit>>,
    /// The key the DICOM inputs were split by when one key served them all ("PatientID",
    /// "StudyInstanceUID", "SeriesInstanceUID"), "path" when there are none or none had an
    /// identifier, "mixed" otherwise. Other files are split by their path.
    split_key: String,
    /// Units split by each key.
    split_keys: BTreeMap<String, usize>,
    /// DICOM files that do not fit their series.
    rejects: Vec<RejectEntry>,
    notes: Vec<String>,
}

/// One unit per file, except DICOM files, which are grouped into series (`source::series`): a
/// series is one unit. Units keep the order of their first files. A file is split by a hash of its
/// path; DICOM inputs by a hash of their patient (else study, else series) so that no patient is
/// in both splits.
fn tree_units(
    o: &ConvertOptions,
    chosen: Vec<(&tree::TreeFile, String)>,
    classes: &[String],
    folders: &tree::SplitFolders,
) -> TreeUnits {
    let label = |c: &str| {
        classes
            .binary_search_by(|x| x.as_str().cmp(c))
            .expect("class listed") as u32
    };
    // A unit's split: its split folder's (`rel` is its first file), else a hash of `key`.
    let split_of = |rel: &str, key: &str| -> String {
        if let tree::SplitFolders::Splits(m) = folders {
            if let Some(s) = rel.split_once('/').and_then(|(top, _)| m.get(top)) {
                return s.clone();
            }
        }
        if tree::is_test(key, o.test_fraction) {
            "test".into()
        } else {
            "train".into()
        }
    };
    let by_folder = matches!(folders, tree::SplitFolders::Splits(_));
    let file_unit = |f: &tree::TreeFile, c: &str| Unit::File {
        rel: f.rel.clone(),
        path: f.path.clone(),
        kind: f.kind,
        label: Some(label(c)),
    };

    // Every DICOM header, read in parallel up to the pixel data.
    let dicom: Vec<&tree::TreeFile> = chosen
        .iter()
        .filter(|(f, _)| f.kind == Some(FileKind::Dicom))
        .map(|(f, _)| *f)
        .collect();
    let pb = crate::util::progress::bar(dicom.len() as u64, "headers", "files", o.quiet);
    let headers: BTreeMap<&str, dicom::SeriesHeader> = dicom
        .par_iter()
        .filter_map(|f| {
            // Once a signal asked to stop, the rest is skipped (convert_into then stops).
            if crate::util::interrupt::requested().is_some() {
                return None;
            }
            let h = dicom::read_header(&f.path).ok();
            pb.inc(1);
            // A header that cannot be read leaves the file on its own: decoding it says why.
            h.map(|h| (f.rel.as_str(), h))
        })
        .collect();
    pb.finish_and_clear();

    // (position of the first file among the inputs, split, unit)
    let mut units: Vec<(usize, String, Unit)> = Vec::new();
    let mut split_keys: BTreeMap<String, usize> = BTreeMap::new();
    let mut dicom_keys = std::collections::BTreeSet::new();
    let mut at: BTreeMap<&str, usize> = BTreeMap::new();
    let mut inputs = Vec::new();
    for (i, (f, c)) in chosen.iter().enumerate() {
        at.insert(&f.rel, i);
        match headers.get(f.rel.as_str()) {
            Some(h) => inputs.push(series::Input {
                rel: f.rel.clone(),
                path: f.path.clone(),
                class: c.clone(),
                header: h.clone(),
            }),
            None => {
                let key = if by_folder { "folders" } else { "path" };
                if f.kind == Some(FileKind::Dicom) {
                    dicom_keys.insert(key);
                }
                *split_keys.entry(key.into()).or_default() += 1;
                units.push((i, split_of(&f.rel, &f.rel), file_unit(f, c)));
            }
        }
    }
    let g = series::group(inputs, o.decode.axis);
    let (mut n_series, mut n_files) = (0, 0);
    for group in g.groups {
        let key = if by_folder {
            "folders"
        } else {
            group.key.name()
        };
        dicom_keys.insert(key);
        *split_keys.entry(key.into()).or_default() += 1;
        let unit = match group.what {
            series::What::File { rel, path } => Unit::File {
                rel,
                path,
                kind: Some(FileKind::Dicom),
                label: Some(label(&group.class)),
            },
            series::What::Series(plan) => {
                n_series += 1;
                n_files += plan.files();
                Unit::Series {
                    name: format!(
                        "{} (series {}, {} files)",
                        group.first,
                        plan.uid,
                        plan.files()
                    ),
                    probe: plan.probe(o.decode.axis),
                    plan: Arc::new(plan),
                    label: label(&group.class),
                }
            }
        };
        units.push((
            at[group.first.as_str()],
            split_of(&group.first, &group.key_value),
            unit,
        ));
    }
    units.sort_by_key(|u| u.0);
    let mut splits: BTreeMap<String, Vec<Unit>> = BTreeMap::new();
    for (_, split, unit) in units {
        splits.entry(split).or_default().push(unit);
    }
    let split_key = match dicom_keys.len() {
        0 if by_folder => "folders".to_string(),
        0 => "path".to_string(),
        1 => dicom_keys.first().expect("one").to_string(),
        _ => "mixed".to_string(),
    };
    let mut notes = Vec::new();
    if n_series > 0 {
        let by: Vec<String> = dicom_keys.iter().map(|k| k.to_string()).collect();
        notes.push(format!(
            "dicom: {} in {}, each one volume; train/test split by {}",
            count(n_files, "file"),
            count(n_series, "series"),
            by.join(", else ")
        ));
    }
    for u in &g.uneven {
        notes.push(format!("{u}; converted slice by slice"));
    }
    TreeUnits {
        splits,
        split_key,
        split_keys,
        rejects: g
            .rejects
            .into_iter()
            .map(|(path, reason)| RejectEntry { path, reason })
            .collect(),
        notes,
    }
}

/// Samples and labels decoded from one unit, and the samples of an array left out (by name).
type Decoded = (Vec<u8>, Vec<u32>, Vec<RejectEntry>);

/// Why a unit gave no samples.
enum Failed {
    /// The unit cannot be used (its reason).
    Reject(Reject),
    /// Column-major values read as u8 (`Values::Auto`) met one that is not a u8 pixel / 255: where.
    NotU8(String),
}

impl From<Reject> for Failed {
    fn from(r: Reject) -> Self {
        Failed::Reject(r)
    }
}

/// Decode one unit into target samples. A file is used whole or rejected whole; an array unit
/// and a stored one leave out the samples that cannot be used.
fn decode_unit(u: &Unit, t: &Target, d: &DecodeOptions) -> Result<Decoded, Failed> {
    let mut px = Vec::new();
    let mut labels = Vec::new();
    let mut left_out = Vec::new();
    match u {
        Unit::Array {
            array, start, len, ..
        } => left_out = array.samples(*start, *len, t, &mut px, &mut labels)?,
        Unit::Stored {
            src, start, len, ..
        } => left_out = decode_stored(src, *start, *len, t, &mut px, &mut labels)?,
        Unit::File {
            path, kind, label, ..
        } => {
            let kind = kind.ok_or_else(|| Reject::new("unknown file kind"))?;
            let label = label.expect("tree units are labelled");
            // A decoder bug must not take the whole run down: a panic becomes this file's reject.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                kind.decode(path, d, &mut |frame| {
                    to_sample(frame, t, &mut px)
                        .map_err(|why| Reject::new(format!("image {}: {why}", labels.len())))?;
                    labels.push(label);
                    Ok(())
                })
            }));
            match r {
                Ok(r) => r?,
                Err(_) => return Err(Reject::new("the decoder crashed on this file").into()),
            }
            if labels.is_empty() {
                return Err(Reject::new("holds no images").into());
            }
        }
        Unit::Series { plan, label, .. } => {
            // Files that do not make it are named one by one, so a series never fails as a whole
            // here.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                series::decode_series(plan, d, &mut |frame| {
                    to_sample(frame, t, &mut px)
                        .map_err(|why| Reject::new(format!("image {}: {why}", labels.len())))?;
                    labels.push(*label);
                    Ok(())
                })
            }));
            let left = match r {
                Ok(Ok(left)) => left,
                Ok(Err(all)) => {
                    px.clear();
                    labels.clear();
                    all
                }
                Err(_) => {
                    px.clear();
                    labels.clear();
                    let why = format!("the decoder crashed on its series {}", plan.uid);
                    plan.slots
                        .iter()
                        .flatten()
                        .map(|f| (f.rel.clone(), why.clone()))
                        .collect()
                }
            };
            left_out = left
                .into_iter()
                .map(|(path, reason)| RejectEntry { path, reason })
                .collect();
        }
    }
    Ok((px, labels, left_out))
}

/// Samples of a stored unit (a shard block, or a chunk of column-major samples) in the target:
/// kept as they are when shape and dtype agree, else each value taken as `value / divisor`
/// (pixels in [0, 1], float values as they are) and stored by `colmajor::encode_scaled`, resized
/// plane by plane when `--size` asks (integer to integer pixels as images are resized, anything
/// else through float planes). A sample that cannot be stored is left out with its reason.
fn decode_stored(
    src: &Stored,
    start: usize,
    len: usize,
    t: &Target,
    out: &mut Vec<u8>,
    labels: &mut Vec<u32>,
) -> Result<Vec<RejectEntry>, Failed> {
    let mut rejects = Vec::new();
    // The samples as stored (dtype, shape, pixels, labels), and the index in the unit of each.
    let (dtype, shape, px, lb, idx) = match src {
        Stored::Shard(r) => {
            let b = r
                .read_block(start)
                .map_err(|e| Reject::new(e.to_string()))?;
            let n = b.len();
            let lb: Vec<u32> = b.labels().collect();
            let mut px = b.into_data();
            px.truncate(n * r.spec().bytes());
            (r.spec().dtype, &r.spec().shape, px, lb, (0..n).collect())
        }
        Stored::Columns(r, values) => {
            let f = r.features;
            let mut vals = vec![0f32; len * f];
            r.read_chunk(start, len, &mut vals);
            let (d, strict) = match *values {
                Values::Manifest(d) => (d, true),
                Values::Auto => (Dtype::U8, true),
                Values::Float => (Dtype::F32, false),
            };
            let sb = f * d.size();
            let mut px = vec![0u8; len * sb];
            let mut lb = Vec::with_capacity(len);
            let mut idx = Vec::with_capacity(len);
            let mut at = 0;
            // Labels were checked when planning.
            for (i, (v, l)) in vals.chunks_exact(f).zip(r.labels(start, len)).enumerate() {
                let p = &mut px[at..at + sb];
                let res = crate::format::colmajor::encode_exact(
                    v,
                    if strict { d } else { Dtype::F32 },
                    p,
                );
                match res {
                    Ok(()) => {
                        at += sb;
                        lb.push(l as u32);
                        idx.push(i);
                    }
                    Err((k, val)) if *values == Values::Auto && val.is_finite() => {
                        return Err(Failed::NotU8(format!(
                            "{} feature {k} holds {val}, not a u8 pixel / 255",
                            sample_name(src, start, i)
                        )))
                    }
                    Err((k, val)) => rejects.push(RejectEntry {
                        path: sample_name(src, start, i),
                        reason: if val.is_finite() {
                            format!(
                                "feature {k}: value {val} is not a {d} value as the manifest says ({d} pixels are stored as k / {})",
                                d.divisor()
                            )
                        } else {
                            format!("feature {k}: value {val}: float samples must be finite")
                        },
                    }),
                }
            }
            px.truncate(at);
            (d, &r.shape, px, lb, idx)
        }
    };
    let dims = &shape.0;
    let resize = dims.len() == 3 && (t.height, t.width) != (dims[1], dims[2]);
    let sb_in = shape.elems() * dtype.size();
    let mut vals: Vec<f32> = Vec::new();
    for (j, (&l, &i)) in lb.iter().zip(&idx).enumerate() {
        let p = &px[j * sb_in..(j + 1) * sb_in];
        let at = out.len();
        let r = if !resize && dtype == t.dtype {
            out.extend_from_slice(p);
            Ok(())
        } else if !resize {
            vals.clear();
            vals.extend((0..shape.elems()).map(|k| crate::format::colmajor::value_of(dtype, p, k)));
            out.resize(at + vals.len() * t.dtype.size(), 0);
            crate::format::colmajor::encode_scaled(&vals, t.dtype, &mut out[at..])
                .map_err(|e| format!("feature {}: {e}", e.index()))
        } else {
            resize_planes(p, dtype, (dims[0] as usize, dims[1], dims[2]), t, out)
        };
        match r {
            Ok(()) => labels.push(l),
            Err(reason) => {
                out.truncate(at);
                rejects.push(RejectEntry {
                    path: sample_name(src, start, i),
                    reason,
                });
            }
        }
    }
    Ok(rejects)
}

/// Sample `i` of a stored unit, for the rejects report: `images_train.bin[17]`, or
/// `train-00000.shard block 3 sample 5`.
fn sample_name(src: &Stored, start: usize, i: usize) -> String {
    let file = |p: &Path| {
        p.file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned()
    };
    match src {
        Stored::Shard(r) => format!("{} block {start} sample {i}", file(r.path())),
        Stored::Columns(r, _) => format!("{}[{}]", file(&r.images_path), start + i),
    }
}

/// One C x H x W sample of `dtype` resized to the target's height and width, plane by plane
/// (channels resize independently, so this is what resizing the whole image gives), appended to
/// `out` as the target dtype. u8/u16 to u8/u16 goes through the image resizer as images do;
/// otherwise each plane is a float plane of `value / divisor`.
fn resize_planes(
    p: &[u8],
    dtype: Dtype,
    (c, h, w): (usize, u32, u32),
    t: &Target,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    use image::{DynamicImage, ImageBuffer};
    let plane = h as usize * w as usize;
    let one = Target {
        channels: 1,
        ..t.clone()
    };
    let ints = !dtype.is_float() && !t.dtype.is_float();
    for ch in 0..c {
        let range = ch * plane..(ch + 1) * plane;
        if ints {
            let img = match dtype {
                Dtype::U8 => DynamicImage::ImageLuma8(
                    ImageBuffer::from_raw(w, h, p[range].to_vec()).expect("h * w pixels"),
                ),
                _ => DynamicImage::ImageLuma16(
                    ImageBuffer::from_raw(w, h, range.map(|k| dtype.get(p, k) as u16).collect())
                        .expect("h * w pixels"),
                ),
            };
            to_sample(Frame::Image(img), &one, out).map_err(|r| r.0)?;
            continue;
        }
        let data: Vec<f32> = range
            .clone()
            .map(|k| crate::format::colmajor::value_of(dtype, p, k))
            .collect();
        if !t.dtype.is_float() {
            // Pixels come from values in [0, 1]; the resize keeps them there (up to rounding).
            if let Some(&v) = data.iter().find(|v| !(0.0..=1.0).contains(*v)) {
                return Err(format!(
                    "channel {ch}: {}",
                    crate::format::colmajor::ScaleError::OutOfRange(0, v)
                ));
            }
        }
        let frame = Frame::Float(FloatFrame {
            channels: 1,
            height: h,
            width: w,
            data,
        });
        if t.dtype.is_float() {
            to_sample(frame, &one, out).map_err(|r| format!("channel {ch}: {}", r.0))?;
        } else {
            let mut f = Vec::new();
            let as_f32 = Target {
                dtype: Dtype::F32,
                ..one.clone()
            };
            to_sample(frame, &as_f32, &mut f).map_err(|r| format!("channel {ch}: {}", r.0))?;
            let vals: Vec<f32> = f
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]).clamp(0.0, 1.0))
                .collect();
            let at = out.len();
            out.resize(at + vals.len() * t.dtype.size(), 0);
            crate::format::colmajor::encode_scaled(&vals, t.dtype, &mut out[at..])
                .map_err(|e| format!("channel {ch}: {e}"))?;
        }
    }
    Ok(())
}

/// What the headers of every file of a tree say: how many give colour and grey images, and the
/// smallest and largest first image (by area).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Survey {
    colour: u64,
    grey: u64,
    smallest: Option<(u32, u32)>,
    largest: Option<(u32, u32)>,
}

impl Survey {
    fn of(p: &Probe) -> Survey {
        Survey {
            colour: u64::from(p.colour),
            grey: u64::from(!p.colour),
            smallest: p.size,
            largest: p.size,
        }
    }

    /// Order-independent, so a parallel reduction gives the same answer every time.
    fn merge(a: Survey, b: Survey) -> Survey {
        let key = |s: &(u32, u32)| (s.0 as u64 * s.1 as u64, *s);
        let pick = |x: Option<(u32, u32)>, y: Option<(u32, u32)>, min: bool| match (x, y) {
            (Some(x), Some(y)) => Some(if (key(&x) <= key(&y)) == min { x } else { y }),
            (x, y) => x.or(y),
        };
        Survey {
            colour: a.colour + b.colour,
            grey: a.grey + b.grey,
            smallest: pick(a.smallest, b.smallest, true),
            largest: pick(a.largest, b.largest, false),
        }
    }
}

/// Probe the header of every file unit, on every core. Memory stays bounded: each probe reads one
/// header and only the counts are kept.
fn survey(o: &ConvertOptions, p: &Plan) -> Survey {
    let units: Vec<&Unit> = p.splits.values().flatten().collect();
    let pb = crate::util::progress::bar(units.len() as u64, "probe", "inputs", o.quiet);
    let s = units
        .par_iter()
        .map(|u| {
            // A file whose header cannot be read counts for nothing here; decoding rejects it
            // with the reason.
            if crate::util::interrupt::requested().is_some() {
                return Survey::default();
            }
            let s = match u.probe(&o.decode) {
                Some(Ok(probe)) => Survey::of(&probe),
                _ => Survey::default(),
            };
            pb.inc(1);
            s
        })
        .reduce(Survey::default, Survey::merge);
    pb.finish_and_clear();
    s
}

/// The target shape: options first, else the source's own. Size: the first tree file that
/// decodes (train files first). Channels: 3 when any file of a tree is colour, from every file's
/// header. What was decided from inputs that disagree goes into `notes`.
fn target(o: &ConvertOptions, p: &Plan, notes: &mut Vec<String>) -> Result<Target> {
    let native = match p.native {
        Some(n) => Some(n),
        // Probe train files first: the default shape must not depend on how the split fell.
        None => p
            .splits
            .get("train")
            .into_iter()
            .chain(
                p.splits
                    .iter()
                    .filter(|(k, _)| *k != "train")
                    .map(|(_, v)| v),
            )
            .flatten()
            .take(32)
            .find_map(|u| match u {
                Unit::File {
                    path,
                    kind: Some(k),
                    ..
                } => {
                    let mut first = None;
                    let _ = k.decode(path, &o.decode, &mut |frame| {
                        first = Some(frame.native());
                        Err(Reject::new("probe done"))
                    });
                    first.map(|(c, hw)| (c, hw, Dtype::U8))
                }
                Unit::Series { probe, .. } => probe
                    .size
                    .map(|hw| (if probe.colour { 3 } else { 1 }, hw, Dtype::U8)),
                _ => None,
            }),
    };
    let (mut c, (h, w), _) = native.unwrap_or((3, (32, 32), Dtype::U8));
    // A tree's files need not agree: one colour photo among grey ones must not lose its colour
    // because a grey one came first.
    if o.channels.is_none() && p.native.is_none() {
        let s = survey(o, p);
        if s.colour > 0 {
            c = 3;
        } else if s.grey > 0 {
            c = 1;
        }
        if s.colour > 0 && s.grey > 0 {
            notes.push(format!(
                "channels: 3 ({} colour inputs, {} grey); --channels 1 to keep grey",
                s.colour, s.grey
            ));
        }
        if let (None, Some(small), Some(large)) = (o.size, s.smallest, s.largest) {
            if small != large {
                notes.push(format!(
                    "size: {h}x{w}, the first input's (inputs range from {}x{} to {}x{}); --size HxW to choose",
                    small.0, small.1, large.0, large.1
                ));
            }
        }
    }
    let (h, w) = o.size.unwrap_or((h, w));
    let t = Target {
        channels: o.channels.unwrap_or(c),
        height: h,
        width: w,
        dtype: o.dtype.unwrap_or(Dtype::U8),
        fit: o.fit,
    };
    Shape::new(vec![t.channels as u32, t.height, t.width])?;
    Ok(t)
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

/// `locked`: the caller (this function, starting again) already holds the lock on `o.out`.
fn convert_into(o: &ConvertOptions, locked: bool) -> Result<ConvertReport> {
    let t0 = Instant::now();
    if !(0.0..=1.0).contains(&o.test_fraction) {
        return Err(Error::Invalid(format!(
            "--test-fraction must be in [0, 1], got {}",
            o.test_fraction
        )));
    }
    // A bad --labels/--label-from is refused before anything is created.
    labelling(o)?;
    // A dataset (or any folder) being written by another prep is not read half-written.
    if o.input.is_dir() {
        crate::format::lock::check_not_written(&o.input)?;
    }
    if o.part.is_some() && o.format == OutputFormat::Colmajor {
        return Err(Error::Invalid(
            "--part writes shards (column-major files cannot be joined by appending): merge the \
             parts, then `prep convert MERGED --format colmajor`"
                .into(),
        ));
    }
    let out = &o.out;
    // One writer per folder, from before anything in it is looked at or removed; released (and
    // the folder removed if this run created it and left it empty) when this returns.
    let _lock = if locked {
        None
    } else {
        Some(crate::format::lock::lock_dir(out)?)
    };
    let request = request_key(o);
    if !o.force {
        if let Some(r) = already_converted(o, &request) {
            return Ok(r);
        }
    }
    check_out(out, o.force)?;
    let mut plan = plan(o)?;
    if let Some(names) = &o.class_names {
        if names.len() != plan.classes.len() {
            return Err(Error::Invalid(format!(
                "--class-names gives {} names, but {} has {} classes ({})",
                names.len(),
                tree::shown_path(&o.input),
                plan.classes.len(),
                shown_list(&plan.classes)
            )));
        }
        plan.classes = names.clone();
    }
    crate::util::interrupt::check()?;
    let mut notes = plan.notes.clone();
    let (t, spec, auto_u8) = match &plan.stored {
        Some((shape, dtype)) => stored_target(o, shape, *dtype)?,
        None => {
            let t = target(o, &plan, &mut notes)?;
            let spec = SampleSpec {
                shape: Shape::new(vec![t.channels as u32, t.height, t.width])?,
                dtype: t.dtype,
            };
            (t, spec, false)
        }
    };
    // The headers read above skip their work once a signal asked to stop.
    crate::util::interrupt::check()?;
    if !o.quiet {
        for n in &notes {
            eprintln!("{n}");
        }
    }
    spec.check()?;
    // Float targets take scans in their own units, unwindowed.
    let decode = DecodeOptions {
        float: t.dtype.is_float(),
        ..o.decode.clone()
    };
    let k = plan.classes.len() as u32;
    let bs = o
        .block_samples
        .unwrap_or_else(|| default_block_samples(spec.bytes()))
        .max(1);
    let sb = o
        .shard_blocks
        .unwrap_or_else(|| default_shard_blocks(bs, spec.bytes()))
        .max(1);
    let codec = if o.format == OutputFormat::Colmajor {
        Codec::Zstd { level: 1 }
    } else {
        o.codec
    };
    // The whole input was planned and the target decided from it, so every part agrees on
    // them; now keep this part's range.
    let part = match o.part {
        Some(_) if auto_u8 => {
            return Err(Error::Invalid(format!(
            "{}: with --part, column-major files without manifest.json need --dtype (u8 or f32): \
                 each part would otherwise decide the dtype from its own values",
            tree::shown_path(&o.input)
        )))
        }
        Some(p) => {
            let job = serde_json::json!({
                "converter": "prep-convert/1",
                "kind": plan.kind,
                "classes": plan.classes,
                "sample": spec,
                "target": t,
                "format": o.format.name(),
                "codec": codec,
                "block_samples": bs,
                "shard_blocks": sb,
                "test_fraction": o.test_fraction,
                "on_error": format!("{:?}", o.on_error),
                "decode": format!("{decode:?}"),
                "label_from": o.label_from,
                "split_key": plan.split_key,
                "inputs": plan.inputs,
                "rejects": plan.rejects,
            });
            Some(take_part(&mut plan, p, &job))
        }
        None => None,
    };

    let staging = out.join(STAGING);
    if staging.exists() {
        std::fs::remove_dir_all(&staging).at(&staging)?;
    }
    std::fs::create_dir_all(&staging).at(&staging)?;
    // Where a value of column-major files read as u8 (`Values::Auto`) was not a u8 pixel / 255.
    let mut not_u8: Option<String> = None;
    let result = (|| -> Result<(BTreeMap<String, SplitInfo>, Vec<RejectEntry>)> {
        let total: usize = plan.splits.values().map(Vec::len).sum();
        let pb = crate::util::progress::bar(total as u64, "convert", "inputs", o.quiet);
        let mut rejects = plan.rejects.clone();
        if o.on_error == OnError::Fail {
            if let Some(r) = rejects.first() {
                return Err(reject_to_error(
                    &plan.root,
                    &r.path,
                    Reject::new(r.reason.clone()),
                ));
            }
        }
        let mut infos = BTreeMap::new();
        for (split, units) in &plan.splits {
            let mut w = SplitWriter::new(&staging, split, &spec, codec, k, sb);
            let mut pending: Vec<Block> = Vec::new();
            let mut px_buf: Vec<u8> = Vec::new();
            let mut lb_buf: Vec<u32> = Vec::new();
            let threads = rayon::current_num_threads();
            let flush = |pending: &mut Vec<Block>, w: &mut SplitWriter| -> Result<()> {
                let enc = pending
                    .par_iter()
                    .map(|b| b.encode(&spec, k, codec))
                    .collect::<Result<Vec<_>>>()?;
                pending.clear();
                enc.iter().try_for_each(|e| w.push(e))
            };
            ordered_map(
                units.len(),
                threads,
                2 * threads,
                |i| Ok::<_, Error>(decode_unit(&units[i], &t, &decode)),
                |i, r| {
                    pb.inc(1);
                    match r {
                        Err(Failed::NotU8(why)) => {
                            let e = Error::Invalid(why.clone());
                            not_u8 = Some(why);
                            return Err(e);
                        }
                        Err(Failed::Reject(reason)) => {
                            if o.on_error == OnError::Fail {
                                return Err(reject_to_error(&plan.root, units[i].name(), reason));
                            }
                            rejects.push(RejectEntry {
                                path: units[i].name().to_string(),
                                reason: reason.0,
                            });
                        }
                        Ok((px, labels, left_out)) => {
                            for r in left_out {
                                if o.on_error == OnError::Fail {
                                    return Err(reject_to_error(
                                        &o.input,
                                        &r.path,
                                        Reject::new(r.reason),
                                    ));
                                }
                                rejects.push(r);
                            }
                            px_buf.extend_from_slice(&px);
                            lb_buf.extend_from_slice(&labels);
                            while lb_buf.len() >= bs as usize {
                                pending.push(make_block(
                                    &mut px_buf,
                                    &mut lb_buf,
                                    bs as usize,
                                    spec.bytes(),
                                ));
                                if pending.len() >= threads {
                                    flush(&mut pending, &mut w)?;
                                }
                            }
                        }
                    }
                    Ok(())
                },
            )?;
            if !lb_buf.is_empty() {
                let n = lb_buf.len();
                pending.push(make_block(&mut px_buf, &mut lb_buf, n, spec.bytes()));
            }
            flush(&mut pending, &mut w)?;
            let shards = w.finish()?;
            if !shards.is_empty() {
                infos.insert(split.clone(), SplitInfo::from_shards(&spec, k, shards));
            }
        }
        pb.finish_and_clear();
        if infos.is_empty() && part.is_some() {
            // A part may hold nothing (more parts than inputs, or all of its inputs rejected):
            // it is still a part, and the merge decides whether the job made anything.
            for split in plan.splits.keys() {
                infos.insert(split.clone(), SplitInfo::from_shards(&spec, k, vec![]));
            }
        }
        if infos.is_empty() {
            let example = rejects
                .first()
                .map(|r| format!(", e.g. {}: {}", tree::shown(&r.path), r.reason))
                .unwrap_or_default();
            return Err(Error::Source(format!(
                "{}: no input could be decoded ({} rejected{example})",
                tree::shown_path(&o.input),
                rejects.len()
            )));
        }
        Ok((infos, rejects))
    })();
    let (infos, rejects) = match result {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            if let (true, Some(why)) = (auto_u8, not_u8) {
                // Checked as the values are read: the first that is not k / 255 decides f32, and
                // the conversion starts again (nothing has been published).
                let note = format!("dtype: f32 ({why})");
                if !o.quiet {
                    eprintln!("{note}");
                }
                // Still holding the lock on `out`.
                let mut r = convert_into(
                    &ConvertOptions {
                        dtype: Some(Dtype::F32),
                        ..o.clone()
                    },
                    true,
                )?;
                r.notes.insert(0, note);
                return Ok(r);
            }
            return Err(e);
        }
    };
    if auto_u8 {
        let note = "dtype: u8 (every value is a u8 pixel / 255)".to_string();
        if !o.quiet {
            eprintln!("{note}");
        }
        notes.push(note);
    }
    let mut source = serde_json::json!({
        "converter": "prep-convert/1",
        "request": request,
        "input": o.input.display().to_string(),
        "kind": plan.kind,
        "target": t,
        "test_fraction": o.test_fraction,
        "inputs": plan.inputs,
        "rejects": rejects.len(),
    });
    if let Some(ts) = &plan.split_key {
        source["split_key"] = ts.key.clone().into();
        source["split_keys"] = serde_json::json!(ts.keys);
        if !ts.folders.is_empty() {
            source["split_folders"] = serde_json::json!(ts.folders);
            source["test_fraction"] = serde_json::Value::Null;
        }
    }
    if let Some(p) = o.part {
        // Taken out again by `prep merge`, with `rejects` summed over the parts.
        source["part"] = p.to_string().into();
    }
    let provenance = Provenance::here(source);
    let splits: BTreeMap<String, u64> = infos.iter().map(|(s, i)| (s.clone(), i.samples)).collect();
    // Every file is written into staging, the rejects list and the manifest too, before the old
    // dataset (with --force) is removed: a write that fails (a full disk) leaves it as it was.
    // Publishing is then renames only, the manifest last.
    let finish = || -> Result<()> {
        if !rejects.is_empty() {
            let mut text = String::new();
            for r in &rejects {
                text.push_str(&serde_json::to_string(r).expect("serialises"));
                text.push('\n');
            }
            write_atomic(&staging.join(REJECTS), text.as_bytes())?;
        }
        match o.format {
            OutputFormat::Shards => {
                let mut m = Manifest::new(
                    spec.clone(),
                    plan.classes.clone(),
                    codec,
                    bs,
                    infos.clone(),
                    provenance.clone(),
                );
                m.part = part.clone();
                m.write(&staging)?;
                let files = m.splits.values().flat_map(|s| &s.shards).map(|s| &s.file);
                publish(&staging, out, o.force, files)
            }
            OutputFormat::Colmajor => {
                // Shards in staging become the colmajor files: now the sample counts are known.
                let mut cm_splits = BTreeMap::new();
                let mut stats = BTreeMap::new();
                let m = Manifest::new(
                    spec.clone(),
                    plan.classes.clone(),
                    codec,
                    bs,
                    infos.clone(),
                    provenance.clone(),
                );
                write_atomic(&staging.join(manifest::FILE_NAME), &m.to_bytes())?;
                let ds = crate::format::shard::Dataset::open(&staging)?;
                for (split, info) in &ds.manifest.splits {
                    let mut cw = ColmajorWriter::create(&staging, split, info.samples, &spec, k)?;
                    for sh in &info.shards {
                        let r = ds.open_shard(sh)?;
                        for b in 0..r.num_blocks() {
                            crate::util::interrupt::check()?;
                            let block = r.read_block(b)?;
                            let st = crate::format::shard::Stats::of_block(&block, &spec, k);
                            cw.push(&block, &st)?;
                        }
                    }
                    stats.insert(split.clone(), cw.finish()?);
                    cm_splits.insert(
                        split.clone(),
                        ColmajorSplit {
                            samples: info.samples,
                            images: crate::format::colmajor::images_name(split),
                            labels: crate::format::colmajor::labels_name(split),
                            class_counts: info.class_counts.clone(),
                        },
                    );
                }
                let (mean, std) = stats[stats_split(stats.keys())].mean_std(&spec);
                let cm = ColmajorManifest {
                    format: crate::format::colmajor::FORMAT.into(),
                    version: spec.dtype.format_version() as u32,
                    sample: spec.clone(),
                    classes: plan.classes.clone(),
                    mean,
                    std,
                    splits: cm_splits,
                    provenance: provenance.clone(),
                    checksum: String::new(),
                };
                // In place of the shards' manifest, which is no longer read.
                cm.write(&staging)?;
                let files = cm.splits.values().flat_map(|s| [&s.images, &s.labels]);
                publish(&staging, out, o.force, files)
            }
        }
    };
    if let Err(e) = finish() {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    let _ = std::fs::remove_dir_all(&staging);
    let secs = t0.elapsed().as_secs_f64();
    let samples: u64 = splits.values().sum();
    Ok(ConvertReport {
        out: out.clone(),
        kind: plan.kind,
        shape: spec.shape.0.clone(),
        dtype: spec.dtype,
        classes: plan.classes.len(),
        splits,
        inputs: plan.inputs,
        rejects,
        split_folders: plan
            .split_key
            .as_ref()
            .map(|t| t.folders.clone())
            .unwrap_or_default(),
        notes,
        seconds: secs,
        samples_per_sec: samples as f64 / secs.max(1e-9),
        bytes_on_disk: crate::format::folder::dir_bytes(out),
        peak_rss_bytes: crate::util::mem::peak_rss_bytes(),
        already_complete: false,
    })
}

/// Keep part `p` of every split of `plan`: the units (arrays: the samples) of a contiguous
/// range, in order. Returns the manifest's `part` member; its `job` digest covers `job` (what
/// shapes the output) and every unit of the whole plan in order with its label, and what
/// cheaply tells one input from another of the same name (a file's length, an array's labels).
fn take_part(plan: &mut Plan, p: PartSpec, job: &serde_json::Value) -> Part {
    use xxhash_rust::xxh3::Xxh3;
    let mut h = Xxh3::new();
    h.update(&serde_json::to_vec(job).expect("serialises"));
    for (split, units) in &plan.splits {
        h.update(split.as_bytes());
        h.update(b"\0");
        // One file system call per file: done on every core.
        let sums: Vec<[u64; 2]> = units
            .par_iter()
            .map(|u| match u {
                Unit::File { path, label, .. } => [
                    std::fs::metadata(path).map_or(u64::MAX, |m| m.len()),
                    label.map_or(u64::MAX, u64::from),
                ],
                Unit::Array {
                    array, start, len, ..
                } => {
                    let mut h = Xxh3::new();
                    for l in &array.labels[*start..start + len] {
                        h.update(&l.to_le_bytes());
                    }
                    [h.digest(), *len as u64]
                }
                Unit::Series { plan, label, .. } => [plan.files() as u64, u64::from(*label)],
                Unit::Stored { len, .. } => [0, *len as u64],
            })
            .collect();
        for (u, sum) in units.iter().zip(sums) {
            h.update(u.name().as_bytes());
            h.update(b"\0");
            h.update(&sum[0].to_le_bytes());
            h.update(&sum[1].to_le_bytes());
        }
    }
    // Arrays are cut by sample, anything else by unit (a file, a series, a block).
    let weight = |u: &Unit| match u {
        Unit::Array { len, .. } => *len as u64,
        _ => 1,
    };
    let arrays = plan
        .splits
        .values()
        .flatten()
        .any(|u| matches!(u, Unit::Array { .. }));
    let mut ranges = BTreeMap::new();
    for (split, units) in plan.splits.iter_mut() {
        let total: u64 = units.iter().map(weight).sum();
        let (a, b) = crate::format::part::share(total, 1, p);
        let mut kept = Vec::new();
        let mut at = 0u64;
        for u in std::mem::take(units) {
            let w = weight(&u);
            let (s, e) = (at.max(a), (at + w).min(b));
            if s < e {
                kept.push(match u {
                    Unit::Array { array, start, .. } if (s, e) != (at, at + w) => {
                        let start = start + (s - at) as usize;
                        Unit::Array {
                            name: format!("{}[{start}..]", array.name),
                            array,
                            start,
                            len: (e - s) as usize,
                        }
                    }
                    u => u,
                });
            }
            at += w;
        }
        *units = kept;
        ranges.insert(
            split.clone(),
            PartRange {
                start: a,
                end: b,
                total,
            },
        );
    }
    Part {
        index: p.index,
        count: p.count,
        job: format!("{:016x}", h.digest()),
        of: if arrays { "samples" } else { "inputs" }.into(),
        ranges,
    }
}

fn make_block(px: &mut Vec<u8>, labels: &mut Vec<u32>, n: usize, sb: usize) -> Block {
    let mut b = Block::zeroed(n, sb);
    b.pixels_mut().copy_from_slice(&px[..n * sb]);
    for (i, &l) in labels[..n].iter().enumerate() {
        b.set_label(i, l);
    }
    px.drain(..n * sb);
    labels.drain(..n);
    b
}

/// "a, b, c" or "a, b, ... (10 in all)".
fn shown_list(v: &[String]) -> String {
    if v.len() <= 6 {
        v.join(", ")
    } else {
        format!("{}, ... ({} in all)", v[..4].join(", "), v.len())
    }
}

/// A digest of what decides a conversion's output: the options, and the input files' names,
/// sizes and modification times (one stat per file, no reading). Equal digests: a rerun of the
/// same command on unchanged inputs.
fn request_key(o: &ConvertOptions) -> String {
    use xxhash_rust::xxh3::Xxh3;
    let mut h = Xxh3::new();
    let canon = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    h.update(
        format!(
            "{:?}",
            (
                canon(&o.input),
                o.kind,
                &o.shape,
                o.size,
                o.channels,
                o.dtype,
                &o.fit,
                (&o.label_from, &o.class_names),
                o.test_fraction.to_bits(),
                &o.on_error,
                &o.decode,
                (
                    &o.format,
                    &o.codec,
                    o.block_samples,
                    o.shard_blocks,
                    &o.part
                ),
            )
        )
        .as_bytes(),
    );
    // Links are not followed into folders (a link loop would never end): a link to a folder
    // counts by where it points, a link to a file by that file.
    fn walk(root: &Path, p: &Path, h: &mut Xxh3) {
        // A signal stops the walk; the plan that follows checks for it and ends the run.
        if crate::util::interrupt::requested().is_some() {
            return;
        }
        let Ok(meta) = std::fs::symlink_metadata(p) else {
            return;
        };
        let meta = if meta.file_type().is_symlink() {
            match std::fs::metadata(p) {
                Ok(m) if !m.is_dir() || p == root => m,
                _ => {
                    h.update(
                        p.strip_prefix(root)
                            .unwrap_or(p)
                            .as_os_str()
                            .as_encoded_bytes(),
                    );
                    h.update(b"\0->");
                    if let Ok(t) = std::fs::read_link(p) {
                        h.update(t.as_os_str().as_encoded_bytes());
                    }
                    return;
                }
            }
        } else {
            meta
        };
        if meta.is_dir() {
            let Ok(rd) = std::fs::read_dir(p) else {
                return;
            };
            let mut names: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
            names.sort();
            for n in names {
                walk(root, &n, h);
            }
        } else {
            use std::os::unix::fs::MetadataExt;
            h.update(
                p.strip_prefix(root)
                    .unwrap_or(p)
                    .as_os_str()
                    .as_encoded_bytes(),
            );
            h.update(&[0]);
            for v in [meta.len() as i64, meta.mtime(), meta.mtime_nsec()] {
                h.update(&v.to_le_bytes());
            }
        }
    }
    walk(&o.input, &o.input, &mut h);
    if let Some(l) = &o.labels {
        walk(l, l, &mut h);
    }
    format!("{:016x}", h.digest())
}

/// The report of a finished conversion that `o.out` holds when it was made by the same request
/// (options and unchanged inputs) and is whole (manifest sealed, every listed file there).
fn already_converted(o: &ConvertOptions, request: &str) -> Option<ConvertReport> {
    if !o.out.join(manifest::FILE_NAME).is_file() {
        return None;
    }
    let s = crate::format::inspect::summarize(&o.out).ok()?;
    let src = &s.provenance["source"];
    if src["request"].as_str() != Some(request) {
        return None;
    }
    Some(ConvertReport {
        out: o.out.clone(),
        kind: serde_json::from_value(src["kind"].clone()).unwrap_or(o.kind),
        shape: s.shape.clone(),
        dtype: serde_json::from_value(serde_json::Value::String(s.dtype.clone())).ok()?,
        classes: s.classes.len(),
        splits: s
            .splits
            .iter()
            .map(|x| (x.name.clone(), x.samples))
            .collect(),
        inputs: src["inputs"].as_u64().unwrap_or(0) as usize,
        rejects: vec![],
        split_folders: serde_json::from_value(src["split_folders"].clone()).unwrap_or_default(),
        notes: vec![],
        seconds: 0.0,
        samples_per_sec: 0.0,
        bytes_on_disk: s.bytes_on_disk,
        peak_rss_bytes: crate::util::mem::peak_rss_bytes(),
        already_complete: true,
    })
}

/// Refuse to replace an existing dataset without --force; the replacement itself happens only
/// after the new one is complete.
fn check_out(out: &Path, force: bool) -> Result<()> {
    if force {
        return Ok(());
    }
    let busy = std::fs::read_dir(out).at(out)?.flatten().any(|e| {
        let n = e.file_name();
        n != STAGING && n != REJECTS && n != crate::format::lock::LOCK_FILE
    });
    if busy {
        return Err(Error::Invalid(format!(
            "{} is not empty; choose another --out, or pass --force to replace what it holds once the conversion succeeds",
            tree::shown_path(out)
        )));
    }
    Ok(())
}

/// Replace the old dataset in `out` (with --force) by the one complete in `staging`: its data
/// `files`, its rejects list (or none: an old one is removed) and, last, its manifest.
fn publish<'a>(
    staging: &Path,
    out: &Path,
    force: bool,
    files: impl Iterator<Item = &'a String>,
) -> Result<()> {
    if force {
        crate::format::folder::clean(out)?;
    }
    for f in files {
        let to = out.join(f);
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir).at(dir)?;
        }
        crate::store::output::rename_durably(&staging.join(f), &to)?;
    }
    let rejects = out.join(REJECTS);
    if staging.join(REJECTS).exists() {
        crate::store::output::rename_durably(&staging.join(REJECTS), &rejects)?;
    } else if rejects.exists() {
        std::fs::remove_file(&rejects).at(&rejects)?;
    }
    let m = manifest::FILE_NAME;
    crate::store::output::rename_durably(&staging.join(m), &out.join(m))
}
