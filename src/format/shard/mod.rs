//! The shard dataset format: sample description, block codec, shard files, manifest, and whole-dataset
//! verification. The byte layout is specified in `formats/shard.md`; this module is its reference
//! implementation.

pub mod block;
pub mod dataset;
pub mod format;
pub mod jpeg;
pub mod manifest;
pub mod pred;
pub mod reader;
pub mod writer;
mod zframe;

pub use block::{Block, ChannelSums, Codec, EncodedBlock, Stats};
pub use dataset::{Damage, Dataset, VerifyReport};
pub use manifest::Manifest;
pub use reader::ShardReader;
pub use writer::{ShardWriter, SplitWriter};

use crate::util::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Pixel type on disk. Integers for images (u8, u16); IEEE floats (f16, f32) only for data whose
/// values are not small integers (CT in modality units, float arrays). Normalisation happens where
/// the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    U8,
    U16,
    F16,
    F32,
}

impl Dtype {
    pub fn size(self) -> usize {
        match self {
            Dtype::U8 => 1,
            Dtype::U16 | Dtype::F16 => 2,
            Dtype::F32 => 4,
        }
    }
    pub fn code(self) -> u8 {
        match self {
            Dtype::U8 => 1,
            Dtype::U16 => 2,
            Dtype::F16 => 3,
            Dtype::F32 => 4,
        }
    }
    pub fn from_code(c: u8) -> Option<Self> {
        match c {
            1 => Some(Dtype::U8),
            2 => Some(Dtype::U16),
            3 => Some(Dtype::F16),
            4 => Some(Dtype::F32),
            _ => None,
        }
    }
    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::F32)
    }
    /// The oldest format version (shard header and manifest) that can hold this dtype: writers
    /// use it, so that u8/u16 datasets stay readable by version-1 readers, byte for byte as before.
    pub fn format_version(self) -> u16 {
        if self.is_float() {
            2
        } else {
            1
        }
    }
    /// What a stored value is divided by before statistics and normalisation: the largest value
    /// for integers (so pixels are in [0, 1]), 1 for floats (used in their own units).
    pub fn divisor(self) -> f64 {
        match self {
            Dtype::U8 => 255.0,
            Dtype::U16 => 65535.0,
            Dtype::F16 | Dtype::F32 => 1.0,
        }
    }
    /// Value `i` of little-endian `px` (a sample or a run of samples) as f32: exact for every dtype.
    #[inline]
    pub fn get(self, px: &[u8], i: usize) -> f32 {
        match self {
            Dtype::U8 => px[i] as f32,
            Dtype::U16 => u16::from_le_bytes([px[2 * i], px[2 * i + 1]]) as f32,
            Dtype::F16 => {
                half::f16::from_bits(u16::from_le_bytes([px[2 * i], px[2 * i + 1]])).to_f32()
            }
            Dtype::F32 => f32::from_le_bytes(px[4 * i..4 * i + 4].try_into().unwrap()),
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dtype::U8 => "u8",
            Dtype::U16 => "u16",
            Dtype::F16 => "f16",
            Dtype::F32 => "f32",
        })
    }
}

/// The first value of little-endian f16/f32 data `px` that is NaN or infinite: (index, value).
/// Float samples are finite by rule (`formats/shard.md`): a NaN would poison every statistic and
/// every training step that sees it.
pub fn first_non_finite(dtype: Dtype, px: &[u8]) -> Option<(usize, f32)> {
    // An exponent of all ones is infinity or NaN; comparing bits keeps this a fast scan.
    match dtype {
        Dtype::U8 | Dtype::U16 => None,
        Dtype::F16 => px
            .chunks_exact(2)
            .position(|b| u16::from_le_bytes([b[0], b[1]]) & 0x7c00 == 0x7c00)
            .map(|i| (i, dtype.get(px, i))),
        Dtype::F32 => px
            .chunks_exact(4)
            .position(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) & 0x7f80_0000 == 0x7f80_0000)
            .map(|i| (i, dtype.get(px, i))),
    }
}

/// Largest number of dimensions of one sample: C x H x W, or C x D x H x W for volumes.
pub const MAX_DIMS: usize = 4;
/// Largest sample: 512 MiB (so that a block of one sample stays under the 1 GiB block cap).
/// Bounds every allocation a reader makes from a header.
pub const MAX_SAMPLE_BYTES: u64 = 1 << 29;

/// Shape of one sample, channels first (`C x H x W` or `C x D x H x W`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Shape(pub Vec<u32>);

impl Shape {
    pub fn new(dims: Vec<u32>) -> Result<Self> {
        if dims.len() < 2 || dims.len() > MAX_DIMS {
            return Err(Error::Invalid(format!(
                "a sample shape has 2 to {MAX_DIMS} dimensions (CxHxW), got {}",
                dims.len()
            )));
        }
        if dims.contains(&0) {
            return Err(Error::Invalid(
                "a sample shape has no zero dimension".into(),
            ));
        }
        if dims[0] > format::MAX_CHANNELS {
            return Err(Error::Invalid(format!(
                "{} channels is over the cap of {}",
                dims[0],
                format::MAX_CHANNELS
            )));
        }
        let s = Shape(dims);
        // 2^28 values of two bytes fill MAX_SAMPLE_BYTES; f32 samples are held to 2^27 by
        // `SampleSpec::check`.
        s.checked_elems()
            .filter(|&e| e <= MAX_SAMPLE_BYTES / 2)
            .ok_or_else(|| Error::Invalid(format!("sample shape {s} has more than 2^28 values")))?;
        Ok(s)
    }
    pub fn channels(&self) -> usize {
        self.0[0] as usize
    }
    fn checked_elems(&self) -> Option<u64> {
        self.0
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d as u64))
    }
    /// Number of values in one sample.
    pub fn elems(&self) -> usize {
        self.0.iter().map(|&d| d as usize).product()
    }
    /// Values per channel (H*W, or D*H*W).
    pub fn plane(&self) -> usize {
        self.elems() / self.channels()
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|d| d.to_string()).collect();
        f.write_str(&parts.join("x"))
    }
}

impl FromStr for Shape {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let dims = s
            .split(['x', 'X'])
            .map(|p| {
                p.trim()
                    .parse::<u32>()
                    .map_err(|_| Error::Invalid(format!("bad shape '{s}': expected e.g. 3x32x32")))
            })
            .collect::<Result<Vec<_>>>()?;
        Shape::new(dims)
    }
}

/// What every sample of a dataset looks like.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleSpec {
    pub shape: Shape,
    pub dtype: Dtype,
}

impl SampleSpec {
    /// Bytes of one sample's pixels.
    pub fn bytes(&self) -> usize {
        self.shape.elems() * self.dtype.size()
    }
    /// A sample is at most `MAX_SAMPLE_BYTES` (checked for a shape that `Shape::new` accepted).
    pub fn check(&self) -> Result<()> {
        if self.bytes() as u64 > MAX_SAMPLE_BYTES {
            return Err(Error::Invalid(format!(
                "a {} {} sample is {} bytes, over the {MAX_SAMPLE_BYTES}-byte cap",
                self.shape,
                self.dtype,
                self.bytes()
            )));
        }
        Ok(())
    }
}

/// Samples per block so that a block holds about `target` bytes of pixels: a power of two between 1
/// and 8192. Blocks are the unit of compression, parallelism and integrity checking.
pub fn default_block_samples(sample_bytes: usize) -> u32 {
    const TARGET: usize = 4 << 20;
    let n = (TARGET / sample_bytes.max(1)).clamp(1, 8192);
    1 << (usize::BITS - 1 - n.leading_zeros())
}

/// Blocks per shard so that a shard holds about 256 MiB of pixels.
pub fn default_shard_blocks(block_samples: u32, sample_bytes: usize) -> u32 {
    let block = block_samples as usize * sample_bytes;
    ((256usize << 20) / block.max(1)).clamp(1, 4096) as u32
}

/// The name of shard `i` of a split, relative to the dataset directory.
pub fn shard_file_name(split: &str, i: usize) -> String {
    format!("{split}/{split}-{i:05}.shard")
}
