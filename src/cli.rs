//! Command-line arguments (clap). Validation of meaning happens in `cmd/`.

use clap::{Args, Parser, Subcommand, ValueEnum};
use prep::format::shard::Shape;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "prep",
    version,
    about = "Generate, convert, check and stream image datasets as compact checksummed shards.",
    after_help = COUNTS_HELP
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Hide progress bars and the summary line.
    #[arg(long, short, global = true)]
    pub quiet: bool,
    /// Worker threads (default: one per core).
    #[arg(long, short, global = true, value_name = "N", value_parser = count::<usize>(1, MAX_JOBS))]
    pub jobs: Option<usize>,
}

const COUNTS_HELP: &str = "\
Counts (--train, --test, --batch, --block-samples, --epochs, ...) are whole numbers written 60000,
60,000, 60k, 1.5M or 1e6: decimal suffixes (k or K = 1000, M = 10^6, G = 10^9, T = 10^12), no
binary ones (Ki, Mi). Shapes are channels first, CxHxW (3x32x32): numpy's and PIL's HxWxC order
(32x32x3) is refused with the shape to write.

A reader that stops reading (prep inspect DS | head -4) ends prep quietly as it ends other Unix
tools: killed by SIGPIPE, status 141 in a shell.";

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Generate a learnable synthetic image dataset of any size.
    Synth(SynthArgs),
    /// Convert real data (IDX, CIFAR, image folders, video, DICOM, NIfTI, TIFF, .npy, MSD /
    /// nnU-Net scans with label volumes) into a dataset.
    Convert(ConvertArgs),
    /// Train the CNN on a dataset (CPU reference backend; CUDA where built).
    Train(TrainArgs),
    /// Recompute a run's test accuracy on a dataset.
    Eval(EvalArgs),
    /// Show what a dataset holds; optionally draw a grid of samples per class.
    Inspect(InspectArgs),
    /// Read and check every block of every shard and the manifest.
    Verify(VerifyArgs),
    /// Estimate disk, host RAM, GPU memory and time for a dataset before making it.
    Plan(PlanArgs),
    /// Join the parts written by `synth --part I/N` or `convert --part I/N` into one dataset.
    #[command(long_about = MERGE_ABOUT)]
    Merge(MergeArgs),
}

const MERGE_ABOUT: &str = "\
Join the parts written by `prep synth ... --part I/N` or `prep convert ... --part I/N` (one per
task of a job array) into one dataset in OUT, in any order of PART arguments.

It first checks that the parts belong together: every PART is a part (its manifest has a `part`
member) of the same job (same `job` digest, same N), each index 0..N-1 is given exactly once, and
each part is complete: its manifest is there and checks out, and every shard it lists is there
with the length, header, footer and footer checksum the manifest says (blocks are not read: that
is `prep verify`). Any failure names the part folder and what is wrong (exit 2 for parts that do
not go together, exit 1 for an incomplete or damaged part), and OUT is left as it was.

Then each part's shards are hard-linked into OUT (copied where a link is impossible, as across
file systems), renamed as a single run names them (split by split, the parts in index order),
and one manifest is written without the `part` member. The parts are left as they were: delete
them once the merge is done (with hard links the merged dataset holds the same files, so the
merge took no space and deleting the parts frees none). OUT must be new or empty; everything is staged in OUT/.prep-staging/ and moved into place
at the end. The merge of synth parts is byte for byte the dataset a single run of the same
command writes, apart from the manifest's `provenance.command`; a merge of convert parts has the
same samples in the same order as a single conversion (its block and shard boundaries differ),
and the parts' rejects.jsonl joined.";

// Every numeric flag is checked where it is parsed: zero, huge and non-finite values are usage
// errors (exit 2) that name the flag (clap does) and the allowed range, before any work.

/// The most worker threads `--jobs` takes.
pub const MAX_JOBS: u64 = 4096;
/// The most samples of one split (`--train`, `--test`): 10^12.
pub const MAX_SAMPLES: u64 = 1_000_000_000_000;
/// The most epochs of a run.
pub const MAX_EPOCHS: u64 = 1_000_000;

use crate::parse::count;

/// A finite number in a range: `[lo, hi]`, or open at an end where `open` says so. NaN and the
/// infinities are refused with the range in the message.
fn real(s: &str, lo: f64, hi: f64, open: (bool, bool)) -> Result<f64, String> {
    let ok = |v: f64| {
        v.is_finite()
            && if open.0 { v > lo } else { v >= lo }
            && if open.1 { v < hi } else { v <= hi }
    };
    match s.trim().parse::<f64>() {
        Ok(v) if ok(v) => Ok(v),
        _ => Err(format!(
            "{s} is not a number in {}{lo}, {hi}{}",
            if open.0 { "(" } else { "[" },
            if open.1 { ")" } else { "]" }
        )),
    }
}

/// `--test-fraction`: 0.0 to 1.0.
fn fraction(s: &str) -> Result<f64, String> {
    real(s, 0.0, 1.0, (false, false))
}
/// `--fps`: above 0, at most 1000 frames a second.
fn fps(s: &str) -> Result<f64, String> {
    real(s, 0.0, 1000.0, (true, false))
}
/// `--lr`: above 0, at most 100.
fn lr(s: &str) -> Result<f32, String> {
    real(s, 0.0, 100.0, (true, false)).map(|v| v as f32)
}
/// `--momentum`, `--label-smoothing`: 0 up to (not including) 1.
fn below_one(s: &str) -> Result<f32, String> {
    real(s, 0.0, 1.0, (false, true)).map(|v| v as f32)
}
/// `--weight-decay`: 0 to 1.
fn unit(s: &str) -> Result<f32, String> {
    real(s, 0.0, 1.0, (false, false)).map(|v| v as f32)
}

/// `--part I/N`: part I (from 0) of N of a job fanned out over a job array.
fn part(s: &str) -> Result<prep::format::part::PartSpec, String> {
    s.parse().map_err(|e: prep::Error| e.to_string())
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum FormatArg {
    Shards,
    Colmajor,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum TaskArg {
    Class,
    Mask,
    Labels,
    Values,
}

impl TaskArg {
    pub fn task(self) -> prep::synth::Task {
        use prep::synth::Task;
        match self {
            TaskArg::Class => Task::Class,
            TaskArg::Mask => Task::Mask,
            TaskArg::Labels => Task::Labels,
            TaskArg::Values => Task::Values,
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum FourthAxisArg {
    /// Time points where the header gives a time step, else up to 4 volumes are channels.
    Auto,
    /// Channels (modalities): each slice one sample of every channel.
    Channels,
    /// Time points: each volume's slices samples, one window for the series.
    Time,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum OrientationArg {
    /// Closest to LPS: axial slices with anterior at the top and the patient's right on the
    /// left, coronal and sagittal ones with superior at the top.
    Lps,
    /// The voxel axes as the file stores them.
    Stored,
}

/// `--spacing`: mm, one value or XxYxZ.
fn spacing(s: &str) -> Result<[f64; 3], String> {
    prep::source::volume::parse_spacing(s)
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum CodecArg {
    /// zstd of the bytes as they are.
    Zstd,
    /// zstd after a prediction filter per image plane (left, up or median, with green taken
    /// from red and blue), chosen per block: lossless, about half of zstd's size on photos
    /// and faster to read; slower to write.
    Pred,
    /// one JPEG per sample at --quality (lossy; u8 grey or RGB images), for photo datasets
    /// whose size matters more than exact pixels.
    Jpeg,
    /// the bytes as they are: the largest shards, and the fastest to read where the disk keeps
    /// up (no decoding, only the checksum).
    None,
}

#[derive(Args, Debug)]
pub struct SynthArgs {
    /// Training samples (60000, 60k, 1.5M, 1e6: decimal, k = 1000).
    #[arg(long, value_name = "N", value_parser = count::<u64>(0, MAX_SAMPLES))]
    pub train: u64,
    /// Test samples (10000, 10k, 1e4).
    #[arg(long, value_name = "N", default_value_t = 10_000, value_parser = count::<u64>(0, MAX_SAMPLES))]
    pub test: u64,
    /// Sample shape, channels first (3x32x32; numpy's 32x32x3 is refused with a hint).
    #[arg(long, value_name = "CxHxW", default_value = "3x32x32", value_parser = crate::parse::shape)]
    pub shape: Shape,
    /// Number of classes.
    #[arg(long, value_name = "K", default_value_t = 10, value_parser = count::<u32>(1, prep::format::shard::format::MAX_CLASSES as u64))]
    pub classes: u32,
    /// Seed: every sample is a pure function of (seed, split, index).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Generator version: 2 (default) draws colours independently of the class; 1 is the original
    /// generator, whose colours give the class away (to resume or remake datasets made with it).
    #[arg(long, value_name = "1|2", value_parser = clap::value_parser!(u32).range(1..=2))]
    pub generator: Option<u32>,
    /// How hard generator 2's classes are to tell apart: 0.0 (easiest) to 1.0 (hardest); more
    /// noise, lower contrast, overlapping class parameters and occluding distractors [default: 0.5].
    #[arg(long, value_name = "D", allow_negative_numbers = true, value_parser = difficulty)]
    pub difficulty: Option<f64>,
    /// What each sample carries beside its image and class: nothing more (class), a mask of where
    /// the class's pattern shows (mask: 0 background, class + 1), which pattern kinds are drawn
    /// (labels: K-hot over 6 kinds), or the pattern disc's area and the number of distractors
    /// (values). The images are the same for every task; shards only.
    #[arg(long, value_enum, default_value = "class")]
    pub task: TaskArg,
    /// Output directory.
    #[arg(long, short, value_name = "DIR", default_value = "shards")]
    pub out: PathBuf,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Write part I (from 0) of N of this dataset, for a job array: whole shards of each split,
    /// cut into N ranges. `prep merge` joins the N parts. E.g. --part
    /// $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT.
    #[arg(long, value_name = "I/N", value_parser = part)]
    pub part: Option<prep::format::part::PartSpec>,
    /// Replace a different dataset already in --out.
    #[arg(long)]
    pub force: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `--difficulty`: a number from 0.0 to 1.0 (negative ones parsed too, so that they are refused
/// with this message rather than taken for a flag).
fn difficulty(s: &str) -> Result<f64, String> {
    real(s, 0.0, 1.0, (false, false))
}

/// How a dataset is stored; shared by the commands that write one.
#[derive(Args, Debug)]
pub struct StoreArgs {
    /// Shard files, or the float32 column-major layout.
    #[arg(long, value_enum, default_value = "shards")]
    pub format: FormatArg,
    /// Block compression.
    #[arg(long, value_enum, default_value = "zstd")]
    pub codec: CodecArg,
    /// zstd level (1 = fastest; 19 = smallest).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..=22))]
    pub level: i32,
    /// JPEG quality of --codec jpeg (1-100; at 90 and above colour is kept at full resolution,
    /// below it is halved both ways, 4:2:0).
    #[arg(long, value_name = "Q", value_parser = clap::value_parser!(u8).range(1..=100))]
    pub quality: Option<u8>,
    /// Samples per block (default: about 4 MiB of pixels, a power of two).
    #[arg(long, value_name = "N", value_parser = count::<u32>(1, 1_048_576))]
    pub block_samples: Option<u32>,
    /// Blocks per shard file (default: about 256 MiB of pixels).
    #[arg(long, value_name = "N", value_parser = count::<u32>(1, 1_048_576))]
    pub shard_blocks: Option<u32>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum KindArg {
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
    /// images_<split>.bin + labels_<split>.bin (float32 feature-major, int32), with or without
    /// prep's manifest.
    Colmajor,
    /// A prep shard dataset.
    Shards,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum OnErrorArg {
    /// Skip the file and list it in OUT/rejects.jsonl.
    Skip,
    /// Stop with exit code 1, naming the file; nothing new is left in OUT.
    Fail,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum FitArg {
    Crop,
    Stretch,
    Pad,
}

/// `--classes`: where a tree's classes come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ClassesArg {
    Auto,
    Folders,
}

#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// A folder (one sub-folder per class, files directly inside it as one class, or a dataset's
    /// own files) or a single file.
    pub input: PathBuf,
    /// Output directory.
    #[arg(long, short, value_name = "DIR", default_value = "shards")]
    pub out: PathBuf,
    /// What the input is (auto: a prep dataset by its manifest.json; a Medical Segmentation
    /// Decathlon / nnU-Net folder by dataset.json beside imagesTr/; column-major, IDX, CIFAR and
    /// .npy datasets by their file names; else a tree of images, videos and scans by extension).
    #[arg(long, value_enum, default_value = "auto")]
    pub kind: KindArg,
    /// Sample shape of column-major files without prep's manifest.json (images_<split>.bin,
    /// labels_<split>.bin), which do not say it.
    #[arg(long, value_name = "CxHxW", value_parser = crate::parse::shape)]
    pub shape: Option<Shape>,
    /// Sample size, HxW, or one side for a square (32 is 32x32). Default: the source's own.
    #[arg(long, value_name = "HxW")]
    pub size: Option<String>,
    /// Channels of every sample: 1 (grey) or 3 (RGB). Default: 3 if any input is colour (read
    /// from every file's header), else 1.
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=3))]
    pub channels: Option<u8>,
    /// Pixel type on disk; u16 keeps 16-bit images (PNG/TIFF) at full precision, and scans'
    /// whole modality values (CT's HU, MR signal) with no window as value + 32768 (--window
    /// windows into u16 instead). f32/f16 keep the source's values with no window: float .npy as stored (float64 rounded to
    /// float32), NIfTI after scl_slope/scl_inter, DICOM in modality units (Rescale Slope and
    /// Intercept); f16 rounds to nearest. Images keep their integer values. Column-major files
    /// and prep datasets: values pixel / max; u8/u16 from values in [0, 1] (rounded), default
    /// the dataset's own, or for column-major files without a manifest u8 when every value is
    /// k / 255, else f32.
    #[arg(long, value_enum)]
    pub dtype: Option<DtypeArg>,
    /// How an image of another aspect ratio reaches --size.
    #[arg(long, value_enum, default_value = "crop")]
    pub fit: FitArg,
    /// CSV of `path,label` rows (paths relative to INPUT; to its images/ folder where it is
    /// laid out as images/ beside masks/) instead of class sub-folders. With a header row
    /// (path,...): a `label` or `class` column gives the class (none: one class), the columns
    /// --values names become each sample's values, every other column holds 0/1 labels.
    #[arg(long, value_name = "FILE.csv")]
    pub labels: Option<PathBuf>,
    /// Columns of the --labels CSV that hold numbers: each sample's `values` field (f32, finite;
    /// an empty or bad cell rejects its file), e.g. --values age,weight.
    #[arg(
        long,
        value_name = "COL[,COL]",
        value_delimiter = ',',
        requires = "labels"
    )]
    pub values: Vec<String>,
    /// A folder of masks beside INPUT's images, paired by relative path and stem (a/b/x.jpg with
    /// a/b/x.png, any image format): each sample's `mask` field. Palette PNGs give their
    /// indices, grey masks their values (16-bit: a u16 field); resized with --size by nearest
    /// neighbour. Without it, INPUT laid out as images/ beside masks/ (or labels/ of images)
    /// is found by itself.
    #[arg(long, value_name = "DIR")]
    pub masks: Option<PathBuf>,
    /// Names of the mask values in value order: comma-separated ('background,road,car') or
    /// @FILE with one name a line. A larger value rejects its file. Default: "0".."max" of the
    /// values seen.
    #[arg(long, value_name = "NAMES|@FILE")]
    pub mask_names: Option<String>,
    /// Class of each file from its path relative to INPUT ('/' separators): the regex's first
    /// capture group, e.g. '^(\w+)_\d+\.png$' or '^[^/]+/([^/]+)/'. Files that do not match are
    /// rejected.
    #[arg(long, value_name = "REGEX", conflicts_with = "labels")]
    pub label_from: Option<String>,
    /// Names of the classes, in class-index order: comma-separated ('cat,dog,bird') or @FILE with
    /// one name a line. Their number must be the dataset's number of classes. Default: the
    /// source's own (folder names, CIFAR's batches.meta, Fashion-MNIST's ten), else 0, 1, 2...
    #[arg(long, value_name = "NAMES|@FILE")]
    pub class_names: Option<String>,
    /// Where a tree's classes come from. auto: its sub-folders, except DICOM folders that are
    /// patients (each holds the files of one PatientID, no two the same: PAT001/, PAT002/):
    /// then one class named after INPUT, split by patient, said on stderr (--labels or
    /// --label-from give classes). folders: the sub-folders even then, every class wholly in one
    /// split.
    #[arg(long, value_enum, default_value = "auto")]
    pub classes: ClassesArg,
    /// DICOM: keep files of several modalities (CT with MR, ...: different units) in one
    /// dataset. Without it such a tree is refused, naming each modality with its file count.
    #[arg(long)]
    pub mixed_modalities: bool,
    /// Fraction of inputs put in the test split. Groups (DICOM patients, else studies or series;
    /// MSD cases; volume and video files; runs of an unsplit .npy's samples) are ranked by a hash
    /// of their key and round(F x groups) go to test, at least one when F > 0 and there are two
    /// or more, and at least one stays in train when F < 1; image files go by a hash of their
    /// path. The summary gives the split that came out, with a warning where the groups cannot
    /// give F (3 patients at 0.1: 1 of 3). Sources with their own split keep it: IDX and CIFAR
    /// files, and trees whose top folders are split folders (train/ with val/, valid/,
    /// validation/ or test/), where this flag is refused.
    #[arg(long, value_name = "F", default_value_t = 0.1, allow_negative_numbers = true, value_parser = fraction)]
    pub test_fraction: f64,
    /// What to do with an input that cannot be decoded.
    #[arg(long, value_enum, default_value = "skip")]
    pub on_error: OnErrorArg,
    /// Video: keep every Nth frame; 4-D NIfTI time series: every Nth time point.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = count::<u32>(1, 1_000_000))]
    pub every: u32,
    /// Video: sample frames at F per second (instead of --every).
    #[arg(long, value_name = "F", allow_negative_numbers = true, value_parser = fps)]
    pub fps: Option<f64>,
    /// Volumes: slice along this axis (0 = x, 1 = y, 2 = z).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub axis: u8,
    /// Scans: intensity window LOW:HIGH (after rescale). Default for u8: DICOM's own window,
    /// NIfTI's 0.5-99.5 percentile window; u16, f16 and f32 keep the values unwindowed.
    #[arg(long, value_name = "LOW:HIGH", allow_hyphen_values = true)]
    pub window: Option<String>,
    /// Volumes (NIfTI, DICOM series, MSD folders): bring every volume to one orientation
    /// before slicing (from the NIfTI sform/qform, DICOM Image Orientation and Position), or
    /// keep the stored voxel axes.
    #[arg(long, value_enum, default_value_t = OrientationArg::Lps)]
    pub orientation: OrientationArg,
    /// Volumes: resample to this voxel size in mm before slicing (trilinear for images,
    /// nearest for label volumes), e.g. 1 or 0.8x0.8x2.5 (along the oriented x, y, z).
    #[arg(long, value_name = "MM", value_parser = spacing)]
    pub spacing: Option<[f64; 3]>,
    /// 4-D NIfTI files: their 4th axis as channels (each slice one sample of every modality,
    /// each windowed on its own) or time points (each a volume of samples, one window for the
    /// whole series, `t` in --meta). auto: time points where the header gives a time step,
    /// else up to 4 volumes are channels.
    #[arg(long, value_enum, default_value_t = FourthAxisArg::Auto)]
    pub fourth_axis: FourthAxisArg,
    /// Scans with label volumes (MSD / nnU-Net folders): leave out slices whose mask is all
    /// background (value 0); a line on stderr counts them.
    #[arg(long)]
    pub skip_empty_masks: bool,
    /// Trees of files and MSD/nnU-Net folders: give every sample a `meta` field of where it
    /// comes from: its source path (MSD: its case), page/frame or slice number, a video frame's
    /// time, a 4-D series' time point t, DICOM patient, study, series and modality, voxel spacing
    /// as cut (prep inspect counts the keys; Python gives a dict a sample).
    #[arg(long)]
    pub meta: bool,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Convert part I (from 0) of N of the input, for a job array: every part plans the whole
    /// input (the same classes, shape and splits), then converts a contiguous range of each
    /// split's sorted inputs (of the samples for IDX, CIFAR and .npy). `prep merge` joins the N
    /// parts. E.g. --part $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT.
    #[arg(long, value_name = "I/N", value_parser = part)]
    pub part: Option<prep::format::part::PartSpec>,
    /// Replace the dataset already in --out (only once the new one is complete).
    #[arg(long)]
    pub force: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// The flags given on the command line (clap ids), set after parsing.
    #[arg(skip)]
    pub given: Vec<String>,
}

const PRECISIONS: [&str; 2] = ["bf16", "f32"];
use prep::nn::architecture::MODELS;

#[derive(Args, Debug)]
pub struct TrainArgs {
    /// Dataset directory: prep shards, or column-major files (read memory-mapped; not needed
    /// with --resume).
    #[arg(required_unless_present = "resume")]
    pub data: Option<PathBuf>,
    /// Sample shape of column-major files without prep's manifest.json, which do not say it.
    #[arg(long, value_name = "CxHxW", conflicts_with = "resume", value_parser = crate::parse::shape)]
    pub shape: Option<Shape>,
    /// The network: small (three convolutions, for small images and quick runs), resnet18
    /// (7x7/2 stem and max-pool from 96 px up, a 3x3/1 stem below), or unet (segmentation: a
    /// 2-D U-Net of four downsamplings, a per-pixel output). Default: unet for a mask task,
    /// else small.
    #[arg(long, value_parser = MODELS)]
    pub model: Option<String>,
    /// What to learn: class, mask (segmentation), labels (multi-label), values (regression), or
    /// a field's name. Default: the dataset's one mask, labels or values field, else the class.
    #[arg(long, value_name = "TASK", conflicts_with = "resume")]
    pub task: Option<String>,
    /// Loss of a values task: mse (default) or smooth-l1. (Masks train with per-pixel
    /// cross-entropy + soft Dice, labels with binary cross-entropy.)
    #[arg(long, value_parser = ["auto", "mse", "smooth-l1"], conflicts_with = "resume")]
    pub loss: Option<String>,
    /// Channels of the U-Net's first level (its levels have w, 2w, 4w, 8w, 16w); default 32.
    #[arg(long, value_name = "W", value_parser = count::<usize>(1, 1024), conflicts_with = "resume")]
    pub width: Option<usize>,
    /// Passes over the training split (1 and up); the learning rate rises then falls over them
    /// (one-cycle). With --resume, more than the run's extends it to this many.
    #[arg(long, default_value_t = 15, value_parser = count::<usize>(1, MAX_EPOCHS))]
    pub epochs: usize,
    /// Samples per training step (1-65536; per GPU with --gpus). Larger is faster on a GPU up to
    /// its memory, which is checked before the first step (as the CPU's is).
    #[arg(long, default_value_t = 512, value_parser = count::<u64>(1, 65536))]
    pub batch: u64,
    /// Peak learning rate of the one-cycle schedule (default: 1.2 for small, 0.4 for resnet18).
    #[arg(long, allow_negative_numbers = true, value_parser = lr)]
    pub lr: Option<f32>,
    /// SGD momentum: the share of the last update kept in the next, in [0, 1).
    #[arg(long, default_value_t = 0.9, allow_negative_numbers = true, value_parser = below_one)]
    pub momentum: f32,
    /// L2 penalty on the weights (not on batch-norm and bias terms), in [0, 1].
    #[arg(long, default_value_t = 5e-4, allow_negative_numbers = true, value_parser = unit)]
    pub weight_decay: f32,
    /// Share of each target's probability spread over the other classes, in [0, 1): 0 trains
    /// on one-hot targets.
    #[arg(long, default_value_t = 0.1, allow_negative_numbers = true, value_parser = below_one)]
    pub label_smoothing: f32,
    /// Seed of the initial weights, the data order and the augmentation.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Train without random crop and flip.
    #[arg(long)]
    pub no_augment: bool,
    /// auto, cpu, or cuda[:N].
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Train one model on several GPUs of this host, one process each, gradients averaged
    /// through NCCL: a count (the first N), `all`, or indices (0,2). --batch is per GPU.
    #[arg(long, value_name = "N|all|LIST")]
    pub gpus: Option<prep::dist::Gpus>,
    /// Where the ranks of a multi-process run meet: tcp:HOST:PORT, or file:PATH on storage all
    /// ranks share (default: MASTER_ADDR:MASTER_PORT from the launcher).
    #[arg(long, value_name = "tcp:HOST:PORT|file:PATH")]
    pub rendezvous: Option<prep::dist::Rendezvous>,
    /// Set by `--gpus N` on the processes it starts (each one rank of the world).
    #[arg(long, hide = true)]
    pub rank_of_gpus: bool,
    /// Batch-norm statistics over every rank's batch (as PyTorch's SyncBatchNorm), for small
    /// per-GPU batches; by default each rank normalises by its own batch, as PyTorch DDP does.
    /// Costs two small all-reduces per batch-norm layer and step; no effect with one GPU.
    #[arg(long, conflicts_with = "resume")]
    pub sync_bn: bool,
    /// Input pipeline on the GPU: device (split held in GPU memory), stream (pinned ring, copies
    /// overlapped), managed (ring of managed memory), or auto (device when the split fits half of
    /// the free GPU memory, else stream). The CPU backend streams.
    #[arg(long, default_value = "auto", value_parser = ["auto", "device", "stream", "managed"])]
    pub memory: String,
    /// For a dataset in a store (s3://, gs://, az://, http(s)://): keep the blocks read in this
    /// local folder, up to --cache-bytes; later epochs (and runs) read what fits from there.
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// Bytes the --cache folder may hold (decimal suffixes: 50G); once full, nothing more is added.
    #[arg(long, value_name = "BYTES", default_value = "20G", requires = "cache", value_parser = crate::parse::parse_count)]
    pub cache_bytes: u64,
    /// GPU arithmetic: bf16 (mixed precision, float32 master weights) or f32.
    #[arg(long, default_value = "bf16", value_parser = PRECISIONS)]
    pub precision: String,
    /// Run folder (default: the next free runs/NNN).
    #[arg(long, short, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Start afresh in --out even if it holds a run (a finished one, or one killed before its
    /// first checkpoint): its run files are removed first.
    #[arg(long, requires = "out", conflicts_with = "resume")]
    pub force: bool,
    /// Continue the run in DIR from its last checkpoint, with the run's settings: a flag given
    /// with another value is refused by name, except --epochs N above the run's, which extends
    /// it to N epochs (the one-cycle schedule recomputed for N from the current step). DATA, if
    /// given, must hold the dataset the run was trained on.
    #[arg(long, value_name = "DIR", conflicts_with = "out")]
    pub resume: Option<PathBuf>,
    /// Write a checkpoint every N steps as well as after each epoch (0: only after each epoch).
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = count::<usize>(0, 1_000_000_000))]
    pub checkpoint_every: usize,
    /// Skip damaged blocks (each one logged) instead of stopping.
    #[arg(long)]
    pub skip_damaged: bool,
    /// Stop after this many steps, with a checkpoint (for tests of resuming).
    #[arg(long, hide = true, value_name = "STEPS")]
    pub stop_after: Option<usize>,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// The flags given on the command line (clap ids), set after parsing: `--resume` refuses
    /// those that differ from the run's settings, and only those.
    #[arg(skip)]
    pub given: Vec<String>,
}

#[derive(Args, Debug)]
pub struct EvalArgs {
    /// Run folder (holds config.json and checkpoint.safetensors).
    pub run: PathBuf,
    /// Dataset directory.
    pub data: PathBuf,
    /// Split to evaluate.
    #[arg(long, default_value = "test")]
    pub split: String,
    /// auto, cpu, or cuda[:N] (default: cpu for a run trained on the CPU, else auto).
    #[arg(long)]
    pub device: Option<String>,
    /// GPU arithmetic, bf16 or f32 (default: the run's own).
    #[arg(long, value_parser = PRECISIONS)]
    pub precision: Option<String>,
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// Dataset directory.
    pub dir: PathBuf,
    /// Write a PNG with a row of samples for every class (f16/f32 data is shown through a window
    /// of each channel's mean ± 3 standard deviations).
    #[arg(long, value_name = "FILE.png")]
    pub grid: Option<PathBuf>,
    /// Samples per class in the grid.
    #[arg(long, value_name = "N", default_value_t = 12, value_parser = count::<usize>(1, 1000))]
    pub per_class: usize,
    /// Split the grid takes samples from.
    #[arg(long, default_value = "train")]
    pub split: String,
    /// Pixel zoom of the grid (default: enough for about 64 pixels per sample).
    #[arg(long, value_name = "N", value_parser = count::<u32>(1, 64))]
    pub zoom: Option<u32>,
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// Dataset directory.
    pub dir: PathBuf,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct MergeArgs {
    /// Output directory (new or empty).
    pub out: PathBuf,
    /// The part folders, in any order.
    #[arg(required = true, value_name = "PART")]
    pub parts: Vec<PathBuf>,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Training samples (60000, 60k, 1.5M, 1e6: decimal, k = 1000).
    #[arg(long, value_name = "N", value_parser = count::<u64>(0, MAX_SAMPLES))]
    pub train: u64,
    /// Test samples (10000, 10k, 1e4).
    #[arg(long, value_name = "N", default_value_t = 10_000, value_parser = count::<u64>(0, MAX_SAMPLES))]
    pub test: u64,
    /// Sample shape, channels first (3x32x32; numpy's 32x32x3 is refused with a hint).
    #[arg(long, value_name = "CxHxW", default_value = "3x32x32", value_parser = crate::parse::shape)]
    pub shape: Shape,
    /// Pixel type on disk.
    #[arg(long, value_enum, default_value = "u8")]
    pub dtype: DtypeArg,
    /// Training batch size.
    #[arg(long, default_value_t = 512, value_parser = count::<u64>(1, 65536))]
    pub batch: u64,
    /// The network to size the GPU memory for.
    #[arg(long, default_value = "small", value_parser = MODELS)]
    pub model: String,
    /// GPUs of a data-parallel run (`prep train --gpus N`): memory per GPU, all-reduce cost and
    /// speed-up. --batch is then per GPU.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = count::<u64>(1, 4096))]
    pub gpus: u64,
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DtypeArg {
    U8,
    U16,
    F16,
    F32,
}

impl From<DtypeArg> for prep::format::shard::Dtype {
    fn from(d: DtypeArg) -> Self {
        match d {
            DtypeArg::U8 => Self::U8,
            DtypeArg::U16 => Self::U16,
            DtypeArg::F16 => Self::F16,
            DtypeArg::F32 => Self::F32,
        }
    }
}
