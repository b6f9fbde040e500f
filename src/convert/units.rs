//! What a conversion works through: units (a file, a series, a range of an array or of a stored
//! dataset's samples), the plan that holds them by split, the layout decided from it, and what
//! the writing came to.

use super::file_fields::FileFields;
use super::*;

/// One unit of decoding work: a file of a tree, or a range of samples of an array dataset.
#[derive(Clone)]
pub(super) enum Unit {
    File {
        rel: String,
        path: PathBuf,
        kind: Option<FileKind>,
        label: Option<u32>,
        /// What its samples carry beside image and class (its mask, its labels CSV's labels
        /// and values); None where the plan has no fields.
        with: Option<Arc<FileFields>>,
    },
    Array {
        name: String,
        array: Arc<Array>,
        start: usize,
        len: usize,
    },
    /// The files of a DICOM series, decoded as one volume (`source::dicom::series`).
    Series {
        name: String,
        plan: Arc<SeriesPlan>,
        label: u32,
        /// The metadata field (`--meta`): the series' facts, each slice's number.
        meta: Option<Field>,
        /// Its masks (`--masks`): a label volume, or an image a slice.
        mask: Option<SeriesMask>,
        /// What it will give, from its headers.
        probe: Result<Probe, Reject>,
    },
    /// One case of an MSD / nnU-Net dataset: its channel volumes and label volume, sliced
    /// (`convert::msd`). Named by its first image file.
    Case {
        name: String,
        case: Arc<crate::source::msd::Case>,
        job: Arc<CaseJob>,
    },
    /// Block `start` of a shard, or samples `start..start + len` of a column-major split.
    Stored {
        name: String,
        src: Arc<Stored>,
        start: usize,
        len: usize,
    },
}

/// What every case of one MSD conversion shares: how it is decoded, and the slices left out
/// for an all-background mask so far (for the note after the run).
pub(super) struct CaseJob {
    pub(super) options: crate::source::msd::CaseOptions,
    /// `--meta`: each slice's case, slice number and voxel spacing, after its mask.
    pub(super) meta: Option<Field>,
    pub(super) skipped: std::sync::atomic::AtomicU64,
}

/// A dataset prep reads back: one shard of a prep dataset, or one split of column-major files.
pub(super) enum Stored {
    Shard(ShardReader),
    Columns(ColmajorSplitReader, Values),
}

/// What the values of column-major files are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Values {
    /// Pixels of the manifest's dtype, each exactly as the layout stores it (`k / 255` for u8).
    Manifest(Dtype),
    /// No manifest and no `--dtype`: u8 while every value is `k / 255`; the first that is not
    /// makes the conversion start again as f32.
    Auto,
    /// No manifest: float values, converted to `--dtype` by its rule.
    Float,
}

impl Unit {
    pub(super) fn name(&self) -> &str {
        match self {
            Unit::File { rel, .. } => rel,
            Unit::Array { name, .. } | Unit::Stored { name, .. } => name,
            Unit::Series { name, .. } => name,
            Unit::Case { name, .. } => name,
        }
    }

    /// Look at a file unit's header (None for array units, whose shape is known).
    pub(super) fn probe(&self, d: &DecodeOptions) -> Option<Result<Probe, Reject>> {
        match self {
            Unit::File {
                path,
                kind: Some(k),
                ..
            } => Some(k.probe(path, d)),
            Unit::Series { probe, .. } => Some(probe.clone()),
            _ => None,
        }
    }
}

/// Samples of an array dataset in memory: pixels of `dtype` (planar or interleaved) and labels.
pub(super) struct Array {
    /// The file the samples come from: a sample that cannot be used is rejected as `name[i]`.
    pub(super) name: String,
    pub(super) n: usize,
    pub(super) channels: usize,
    pub(super) height: usize,
    pub(super) width: usize,
    pub(super) planar: bool,
    pub(super) dtype: Dtype,
    pub(super) data: ArrayData,
    pub(super) labels: Vec<u32>,
    /// A .npy `y` array that is not classes: each sample's field (the plan's first field).
    pub(super) targets: Option<npy::Targets>,
    /// A metadata file beside the arrays, and the plan's metadata field (its last).
    pub(super) meta: Option<(Arc<crate::source::meta::MetaLines>, Field)>,
}

/// An array's values: in memory (IDX and CIFAR files are read whole; they are small), or read a
/// block at a time (.npy, of any size).
pub(super) enum ArrayData {
    Bytes(Vec<u8>),
    Npy(npy::NpyImages),
}

impl Array {
    pub(super) fn sample_bytes(&self) -> usize {
        self.channels * self.height * self.width * self.dtype.size()
    }

    /// Append samples `start..start+len` in the target layout; a sample that cannot be used (a
    /// float value that is not finite) is left out and returned with its reason.
    pub(super) fn samples(
        &self,
        start: usize,
        len: usize,
        t: &Target,
        out: &mut Vec<u8>,
        labels: &mut Vec<u32>,
        fields: &mut Vec<u8>,
    ) -> Result<Vec<RejectEntry>, Reject> {
        let sb = self.sample_bytes();
        // Room for every sample at once: growing by doubling copies and faults in pages again.
        out.reserve(len * t.sample_bytes());
        let targets = self.read_targets(start, len)?;
        let per = targets.as_ref().map_or(0, ChunkTargets::bytes)
            + self.meta.as_ref().map_or(0, |(_, f)| f.bytes());
        fields.reserve(len * per);
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
            // A sample whose target cannot be used is left out, pixels and all.
            let usable = targets.as_ref().map_or(Ok(()), |t| t.check(i - start));
            let r = if let Err(why) = usable {
                Err(why)
            } else if same {
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
                Ok(()) => {
                    labels.push(self.labels[i]);
                    if let Some(tg) = &targets {
                        tg.push(i - start, (self.width, self.height), t, fields);
                    }
                    if let Some((m, f)) = &self.meta {
                        fields.extend(m.encode(i, f)?);
                    }
                }
                Err(why) => rejects.push(RejectEntry {
                    path: format!("{}[{i}]", self.name),
                    reason: why.0,
                }),
            }
        }
        Ok(rejects)
    }

    /// A sample's bytes `s` as a frame: an image for u8/u16 arrays, float planes for f16/f32 ones.
    pub(super) fn frame(&self, s: &[u8]) -> Result<Frame, Reject> {
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

/// One chunk's targets of an array, read with its pixels.
pub(super) enum ChunkTargets {
    /// Mask bytes (u8 or u16) of each sample in turn, `bytes` a sample.
    Mask {
        v: Vec<u8>,
        bytes: usize,
    },
    Labels {
        v: Vec<u8>,
        k: usize,
    },
    Values {
        v: Vec<f32>,
        k: usize,
    },
}

impl ChunkTargets {
    /// Whether sample `j` of the chunk can be stored: values must be finite.
    fn check(&self, j: usize) -> Result<(), Reject> {
        if let ChunkTargets::Values { v, k } = self {
            if let Some(c) = v[j * k..(j + 1) * k].iter().position(|x| !x.is_finite()) {
                return Err(Reject::new(format!(
                    "value {} in column {c}: values must be finite",
                    v[j * k + c]
                )));
            }
        }
        Ok(())
    }

    /// Field bytes a sample.
    fn bytes(&self) -> usize {
        match self {
            ChunkTargets::Mask { bytes, .. } => *bytes,
            ChunkTargets::Labels { k, .. } => *k,
            ChunkTargets::Values { k, .. } => 4 * k,
        }
    }

    /// Append sample `j`'s field bytes; a mask of its images' size `(w, h)` is brought to the
    /// target with its image's placement (nearest, `fit_mask`).
    fn push(&self, j: usize, (w, h): (usize, usize), t: &Target, out: &mut Vec<u8>) {
        match self {
            ChunkTargets::Mask { v, bytes } => {
                let m = &v[j * bytes..(j + 1) * bytes];
                let (wu, hu) = (w as u32, h as u32);
                if (t.width, t.height) == (wu, hu) {
                    out.extend_from_slice(m)
                } else if *bytes == w * h {
                    out.extend(crate::source::transform::fit_mask(m, wu, hu, t))
                } else {
                    let m: Vec<u16> = m
                        .chunks_exact(2)
                        .map(|b| u16::from_le_bytes([b[0], b[1]]))
                        .collect();
                    for x in crate::source::transform::fit_mask(&m, wu, hu, t) {
                        out.extend_from_slice(&x.to_le_bytes());
                    }
                }
            }
            ChunkTargets::Labels { v, k } => out.extend_from_slice(&v[j * k..(j + 1) * k]),
            ChunkTargets::Values { v, k } => v[j * k..(j + 1) * k]
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        }
    }
}

impl Array {
    /// The targets of samples `start..start + len`, where the array has a field.
    fn read_targets(&self, start: usize, len: usize) -> Result<Option<ChunkTargets>, Reject> {
        Ok(Some(match &self.targets {
            None | Some(npy::Targets::Class(_)) => return Ok(None),
            Some(npy::Targets::Mask { array, .. }) => {
                let mut v = Vec::new();
                array.read(start, len, &mut v)?;
                ChunkTargets::Mask {
                    v,
                    bytes: array.sample_bytes(),
                }
            }
            Some(npy::Targets::Labels { k, v }) => ChunkTargets::Labels {
                v: v[start * k..(start + len) * k].to_vec(),
                k: *k,
            },
            Some(npy::Targets::Values { k, v }) => ChunkTargets::Values {
                v: v[start * k..(start + len) * k].to_vec(),
                k: *k,
            },
        }))
    }
}

/// Where a DICOM series' masks come from, and how they are stored.
#[derive(Debug, Clone)]
pub(super) struct SeriesMask {
    pub(super) rule: Arc<super::file_fields::MaskRule>,
    pub(super) label: SeriesLabel,
}

/// A series' label volume, or a mask image for each slice in order (path, as reports name it).
#[derive(Debug, Clone)]
pub(super) enum SeriesLabel {
    Volume(PathBuf, String),
    Stack(Vec<(PathBuf, String)>),
}

/// What the source holds, before any pixel is converted.
pub(super) struct Plan {
    pub(super) kind: Kind,
    pub(super) classes: Vec<String>,
    pub(super) splits: BTreeMap<String, Vec<Unit>>,
    /// Channels, (height, width), dtype of the source where it is known without decoding.
    pub(super) native: Option<(u8, (u32, u32), Dtype)>,
    pub(super) rejects: Vec<RejectEntry>,
    pub(super) inputs: usize,
    /// The folder that unit names are relative to.
    pub(super) root: PathBuf,
    /// Decisions to tell the user about.
    pub(super) notes: Vec<String>,
    /// What each sample carries beside its image and class (a .npy mask, labels or values).
    pub(super) fields: Fields,
    /// Trees: how the splits were decided (`TreeSplit`).
    pub(super) split_key: Option<TreeSplit>,
    /// For a prep dataset or column-major files: the samples' shape and dtype (None: the
    /// dtype is found as the values are read).
    pub(super) stored: Option<(Shape, Option<Dtype>)>,
    /// How train and test were drawn (`split::draw`); None where the source has its splits.
    pub(super) drawn: Option<super::split::Drawn>,
}

pub(super) const ARRAY_CHUNK: usize = 2048;

pub(super) fn array_units(name: &str, a: Arc<Array>) -> Vec<Unit> {
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

pub(super) fn reject_to_error(root: &Path, name: &str, r: Reject) -> Error {
    Error::Source(format!("{}: {r}", tree::shown_path(&root.join(name))))
}

/// How a tree's splits were decided: by a hash of what `key` names (`TreeUnits::split_key`;
/// "folders" for split folders), with the units each key split, and the split folders (top
/// folder -> split) when the tree has its own.
#[derive(Debug, Clone, Serialize)]
pub(super) struct TreeSplit {
    pub(super) key: String,
    pub(super) keys: BTreeMap<String, usize>,
    pub(super) folders: BTreeMap<String, String>,
}

/// Samples and labels decoded from one unit, and the samples of an array left out (by name).
/// Pixels, labels and fields (each sample's field bytes in turn) of the samples kept, and the
/// samples left out.
pub(super) type Decoded = (Vec<u8>, Vec<u32>, Vec<u8>, Vec<RejectEntry>);

/// Why a unit gave no samples.
pub(super) enum Failed {
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

/// What the conversion writes, decided from the options and the whole plan: every part of a
/// fanned-out job decides the same.
pub(super) struct Layout {
    pub(super) target: Target,
    pub(super) spec: SampleSpec,
    /// Column-major files without a manifest read as u8 until a value says otherwise.
    pub(super) auto_u8: bool,
    pub(super) decode: DecodeOptions,
    pub(super) k: u32,
    /// Samples per block, blocks per shard.
    pub(super) bs: u32,
    pub(super) sb: u32,
    pub(super) codec: Codec,
    /// What each sample carries beside its image and class.
    pub(super) fields: Fields,
}

/// What the splits came to: per split the shards written, and every input left out.
pub(super) type Written = (BTreeMap<String, SplitInfo>, Vec<RejectEntry>);
