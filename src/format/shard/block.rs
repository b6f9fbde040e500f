//! Blocks: a few thousand samples with their labels, compressed and checksummed as one unit.
//! A decoded block is one buffer: the pixels of every sample, then one u32 label per sample,
//! then (format version 3) each field's values for every sample.

use super::format::{BlockEntry, LABEL_BYTES};
use super::zframe::{compress, compress_literals, unzstd};
use super::{jpeg, pred};
use super::{Dtype, SampleSpec};
use crate::format::fields::{FieldStats, Fields};
use crate::util::error::{Error, Region, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;
use twox_hash::XxHash3_64;

/// How blocks are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "lowercase")]
pub enum Codec {
    None,
    Zstd {
        level: i32,
    },
    /// zstd after a prediction filter per plane, chosen per block (`pred`).
    Pred {
        level: i32,
    },
    /// One JPEG per sample at this quality (1-100), lossy (`jpeg`).
    Jpeg {
        quality: u8,
    },
}

impl Codec {
    pub fn code(self) -> u8 {
        match self {
            Codec::None => super::format::CODEC_NONE,
            Codec::Zstd { .. } => super::format::CODEC_ZSTD,
            Codec::Pred { .. } => super::format::CODEC_PRED,
            Codec::Jpeg { .. } => super::format::CODEC_JPEG,
        }
    }

    /// Whether samples of `spec` can be stored with this codec (`jpeg` takes u8 grey and RGB
    /// images only), as a message for the user where not.
    pub fn fits(self, spec: &SampleSpec) -> std::result::Result<(), String> {
        match self {
            Codec::Jpeg { .. } => jpeg::fits(spec),
            _ => Ok(()),
        }
    }
}

/// The planes of a block of `n` samples of `spec` as the `pred` filter sees them (None for
/// float samples, which it leaves as they are).
fn pred_geometry(spec: &SampleSpec, n: usize) -> Option<pred::Geometry> {
    if spec.dtype.is_float() {
        return None;
    }
    let width = *spec.shape.0.last().unwrap_or(&1) as usize;
    Some(pred::Geometry {
        planes: n * spec.shape.channels(),
        channels: spec.shape.channels(),
        rows: spec.shape.plane() / width.max(1),
        width: width.max(1),
        wide: spec.dtype == Dtype::U16,
    })
}

#[cfg(test)]
pub(super) fn tests_pred_geometry(spec: &SampleSpec, n: usize) -> Option<pred::Geometry> {
    pred_geometry(spec, n)
}

/// Stored bytes of `data` (a block of `n` samples) under `pred`: the method byte, then zstd of
/// the filtered pixels followed by the labels and fields as they are. Where the filter does not
/// pay, the block is stored with method 0 (zstd of the bytes as they are).
fn encode_pred(data: &[u8], spec: &SampleSpec, n: usize, level: i32) -> Result<Vec<u8>> {
    let plain = || -> Result<Vec<u8>> {
        let mut out = vec![pred::PLAIN];
        out.extend(compress(data, level)?);
        Ok(out)
    };
    let Some(g) = pred_geometry(spec, n) else {
        return plain();
    };
    let pixels = n * spec.bytes();
    let method = pred::choose(&data[..pixels], &g);
    let mut filtered = Vec::with_capacity(data.len());
    pred::encode(&data[..pixels], &g, method, &mut filtered);
    filtered.extend_from_slice(&data[pixels..]);
    let mut out = vec![method];
    // Residuals as literals alone: on photos smaller than with zstd's matches (which spoil its
    // Huffman statistics with many short ones) and faster to decode. Where they are mostly runs
    // (under 2 bits a value), or where a high level asks for the smallest, matches may pay: both
    // are tried.
    let mut frame = compress_literals(&filtered, level)?;
    if frame.len() * 4 < filtered.len() || level >= 10 {
        let matched = compress(&filtered, level)?;
        if matched.len() < frame.len() {
            frame = matched;
        }
    }
    out.extend(frame);
    // zstd alone is tried on the whole block only where a sample of it (an eighth, at least
    // 64 KiB) says it might come close: photos skip a second full compression.
    let sample = &data[..data.len().min((data.len() / 8).max(64 << 10))];
    let guess = compress(sample, level)?.len() as f64 / sample.len() as f64;
    if guess < 1.15 * out.len() as f64 / data.len() as f64 {
        let raw = plain()?;
        if raw.len() <= out.len() {
            return Ok(raw);
        }
    }
    Ok(out)
}

/// Stored bytes of `data` (a block of `n` samples) under `jpeg`: the method byte, each sample's
/// JPEG, then zstd of the labels and fields. A block whose JPEGs would pass the format's cap on
/// stored bytes (noise at a high quality) is stored with method 0, zstd of the bytes as they are.
fn encode_jpeg(data: &[u8], spec: &SampleSpec, n: usize, quality: u8) -> Result<Vec<u8>> {
    jpeg::fits(spec).map_err(Error::Invalid)?;
    let pixels = n * spec.bytes();
    let mut out = vec![jpeg::STREAMS];
    jpeg::encode_streams(&data[..pixels], spec, n, quality, &mut out)?;
    out.extend(compress(&data[pixels..], 1)?);
    let raw = data.len();
    if out.len() > raw + raw / 128 + (1 << 16) {
        let mut plain = vec![jpeg::PLAIN];
        plain.extend(compress(data, 1)?);
        return Ok(plain);
    }
    Ok(out)
}

/// The decoded bytes of a `jpeg` block (`stored` from its method byte on), in `buf`'s
/// allocation: every stream checked and decoded, the labels and fields unpacked.
fn decode_jpeg(
    stored: &[u8],
    spec: &SampleSpec,
    n: usize,
    raw_len: usize,
    mut buf: Vec<u8>,
    bad: &dyn Fn(String) -> Error,
) -> Result<Vec<u8>> {
    let (method, body) = match stored.split_first() {
        Some((&m, body)) if jpeg::fits(spec).is_ok() && m <= jpeg::STREAMS => (m, body),
        Some((&m, _)) => {
            return Err(bad(format!(
                "jpeg method {m:#04x} is unknown or does not fit {} samples of shape {}",
                spec.dtype, spec.shape
            )))
        }
        None => return Err(bad("a jpeg block has no method byte".into())),
    };
    if method == jpeg::PLAIN {
        return unzstd(body, raw_len, buf, bad);
    }
    let (spans, tail) = jpeg::streams(body, n).map_err(bad)?;
    let pixels = n * spec.bytes();
    let rest = SCRATCH.with(|s| {
        let r = unzstd(&body[tail..], raw_len - pixels, s.take(), bad);
        r.map(|rest| {
            buf.clear();
            buf.resize(raw_len, 0);
            buf[pixels..].copy_from_slice(&rest);
            s.replace(rest);
        })
    });
    rest?;
    jpeg::INTER.with(|inter| {
        let mut scratch = inter.take();
        let s = spec.bytes();
        let r = spans.iter().enumerate().try_for_each(|(i, &(a, b))| {
            jpeg::decode_sample(
                &body[a..b],
                spec,
                &mut buf[i * s..(i + 1) * s],
                &mut scratch,
            )
            .map_err(|why| bad(format!("sample {i}: {why}")))
        });
        inter.replace(scratch);
        r
    })?;
    Ok(buf)
}

/// Decoded samples and labels of one block, in one buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    data: Vec<u8>,
    num_samples: usize,
    sample_bytes: usize,
    /// Bytes of every field of one sample (0 without fields).
    field_bytes: usize,
}

/// What decoding a block needs from its shard (and, for the fields' rules, its manifest).
pub struct BlockLayout<'a> {
    pub spec: &'a SampleSpec,
    pub codec: u8,
    pub num_classes: u32,
    /// The header's bytes of fields per sample.
    pub field_bytes: usize,
    /// The manifest's declarations; empty where only the shard is known (sizes are still
    /// checked, the values' rules not).
    pub fields: &'a Fields,
}

impl Block {
    /// A zeroed block for `n` samples, to be filled through `sample_mut` and `set_label`.
    pub fn zeroed(n: usize, sample_bytes: usize) -> Self {
        Self::with_fields(n, sample_bytes, 0)
    }
    /// A zeroed block for `n` samples with `field_bytes` of fields each (`fields_mut`).
    pub fn with_fields(n: usize, sample_bytes: usize, field_bytes: usize) -> Self {
        Block {
            data: vec![0; n * (sample_bytes + LABEL_BYTES + field_bytes)],
            num_samples: n,
            sample_bytes,
            field_bytes,
        }
    }
    /// A block for `n` samples in the allocation of `buf` (its contents are not kept), to be
    /// filled like a `zeroed` one.
    pub fn reuse(buf: Vec<u8>, n: usize, sample_bytes: usize) -> Self {
        Self::reuse_with_fields(buf, n, sample_bytes, 0)
    }
    /// `reuse`, with `field_bytes` of fields a sample.
    pub fn reuse_with_fields(
        mut buf: Vec<u8>,
        n: usize,
        sample_bytes: usize,
        field_bytes: usize,
    ) -> Self {
        buf.clear();
        buf.resize(n * (sample_bytes + LABEL_BYTES + field_bytes), 0);
        Block {
            data: buf,
            num_samples: n,
            sample_bytes,
            field_bytes,
        }
    }
    pub fn len(&self) -> usize {
        self.num_samples
    }
    pub fn is_empty(&self) -> bool {
        self.num_samples == 0
    }
    pub fn sample_bytes(&self) -> usize {
        self.sample_bytes
    }
    /// Pixels of every sample, sample after sample (u16 as little-endian pairs).
    pub fn pixels(&self) -> &[u8] {
        &self.data[..self.num_samples * self.sample_bytes]
    }
    pub fn pixels_mut(&mut self) -> &mut [u8] {
        let n = self.num_samples * self.sample_bytes;
        &mut self.data[..n]
    }
    pub fn sample(&self, i: usize) -> &[u8] {
        &self.data[i * self.sample_bytes..(i + 1) * self.sample_bytes]
    }
    pub fn sample_mut(&mut self, i: usize) -> &mut [u8] {
        &mut self.data[i * self.sample_bytes..(i + 1) * self.sample_bytes]
    }
    pub fn label(&self, i: usize) -> u32 {
        let o = self.num_samples * self.sample_bytes + i * LABEL_BYTES;
        u32::from_le_bytes(self.data[o..o + 4].try_into().unwrap())
    }
    pub fn set_label(&mut self, i: usize, label: u32) {
        let o = self.num_samples * self.sample_bytes + i * LABEL_BYTES;
        self.data[o..o + 4].copy_from_slice(&label.to_le_bytes());
    }
    pub fn labels(&self) -> impl ExactSizeIterator<Item = u32> + '_ {
        (0..self.num_samples).map(|i| self.label(i))
    }
    /// The decoded bytes as stored: pixels, then labels, then fields.
    pub fn raw(&self) -> &[u8] {
        &self.data
    }
    pub fn field_bytes(&self) -> usize {
        self.field_bytes
    }
    /// Every field of every sample: field after field, each for all samples in order.
    pub fn fields(&self) -> &[u8] {
        &self.data[self.num_samples * (self.sample_bytes + LABEL_BYTES)..]
    }
    pub fn fields_mut(&mut self) -> &mut [u8] {
        let o = self.num_samples * (self.sample_bytes + LABEL_BYTES);
        &mut self.data[o..]
    }
    /// Field `f` (of `fields`, the dataset's declarations) of sample `i`.
    pub fn field(&self, fields: &Fields, f: usize, i: usize) -> &[u8] {
        let b = fields.0[f].bytes();
        let r = fields.range(f, self.num_samples);
        &self.fields()[r.start + i * b..r.start + (i + 1) * b]
    }
    pub fn field_mut(&mut self, fields: &Fields, f: usize, i: usize) -> &mut [u8] {
        let b = fields.0[f].bytes();
        let r = fields.range(f, self.num_samples);
        &mut self.fields_mut()[r.start + i * b..r.start + (i + 1) * b]
    }

    /// Compress, checksum and gather statistics. `num_classes` bounds the labels.
    pub fn encode(
        &self,
        spec: &SampleSpec,
        num_classes: u32,
        codec: Codec,
    ) -> Result<EncodedBlock> {
        self.encode_fields(spec, num_classes, codec, &Fields::default())
    }

    /// `encode` for a block whose samples carry `fields` (each value checked by its rules).
    pub fn encode_fields(
        &self,
        spec: &SampleSpec,
        num_classes: u32,
        codec: Codec,
        fields: &Fields,
    ) -> Result<EncodedBlock> {
        assert_eq!(
            self.field_bytes,
            fields.bytes(),
            "a block built for other fields"
        );
        if let Some((name, i, p, why)) = fields.first_bad(self.fields(), self.num_samples) {
            return Err(Error::Invalid(format!(
                "sample {i} of a block: field {name}, value {p}: {why}"
            )));
        }
        if let Some(i) = self.labels().position(|l| l >= num_classes) {
            return Err(Error::Invalid(format!(
                "sample {i} of a block has label {} but there are {num_classes} classes",
                self.label(i)
            )));
        }
        if let Some((i, v)) = super::first_non_finite(spec.dtype, self.pixels()) {
            return Err(Error::Invalid(format!(
                "sample {} of a block holds {v}: {} samples must be finite",
                i / spec.shape.elems(),
                spec.dtype
            )));
        }
        let bytes = match codec {
            Codec::None => self.data.clone(),
            Codec::Zstd { level } => compress(&self.data, level)?,
            Codec::Pred { level } => encode_pred(&self.data, spec, self.num_samples, level)?,
            Codec::Jpeg { quality } => encode_jpeg(&self.data, spec, self.num_samples, quality)?,
        };
        // A lossy codec's block is what a reader will decode: its checksum and statistics are
        // taken over that.
        let decoded = match codec {
            Codec::Jpeg { .. } => {
                let bad =
                    |why: String| Error::Invalid(format!("a jpeg block does not decode: {why}"));
                let data = decode_jpeg(
                    &bytes,
                    spec,
                    self.num_samples,
                    self.data.len(),
                    Vec::new(),
                    &bad,
                )?;
                Some(Block { data, ..*self })
            }
            _ => None,
        };
        let this = decoded.as_ref().unwrap_or(self);
        Ok(EncodedBlock {
            stored_xxh3: XxHash3_64::oneshot(&bytes),
            raw_xxh3: XxHash3_64::oneshot(&this.data),
            bytes,
            num_samples: self.num_samples as u32,
            stats: Stats::of_block(this, spec, num_classes),
            field_stats: fields.summarise(self.fields(), self.num_samples),
        })
    }

    /// The block's bytes (samples then labels), for reuse as the buffer of another `decode`.
    pub fn into_data(self) -> Vec<u8> {
        self.data
    }

    /// Check and decode one stored block into `buf` (its allocation is reused, its contents
    /// replaced). Every rule a reader enforces on block bytes is here.
    pub fn decode(
        path: &Path,
        index: u32,
        entry: &BlockEntry,
        stored: &[u8],
        layout: &BlockLayout,
        mut buf: Vec<u8>,
    ) -> Result<Block> {
        let (spec, codec) = (layout.spec, layout.codec);
        let bad = |what: String| Error::corrupt(path, Region::Block(index), what);
        let computed = XxHash3_64::oneshot(stored);
        if computed != entry.stored_xxh3 {
            return Err(bad(format!(
                "checksum mismatch (stored {:016x}, computed {computed:016x})",
                entry.stored_xxh3
            )));
        }
        let n = entry.num_samples as usize;
        let sample_bytes = spec.bytes();
        // The footer parser bounded this product by MAX_BLOCK_RAW.
        let raw_len = n * (sample_bytes + LABEL_BYTES + layout.field_bytes);
        let data = match codec {
            super::format::CODEC_ZSTD => unzstd(stored, raw_len, buf, &bad)?,
            super::format::CODEC_PRED => {
                let Some((&method, frame)) = stored.split_first() else {
                    return Err(bad("a pred block has no method byte".into()));
                };
                let g = pred_geometry(spec, n);
                if !pred::valid(method, g.as_ref()) {
                    return Err(bad(format!(
                        "pred method {method:#04x} is unknown or does not fit {} samples of {} channels",
                        spec.dtype,
                        spec.shape.channels()
                    )));
                }
                match g.filter(|_| method != pred::PLAIN) {
                    None => unzstd(frame, raw_len, buf, &bad)?,
                    Some(g) => {
                        let filtered = SCRATCH.with(|s| {
                            let mut scratch = s.take();
                            let r = unzstd(frame, raw_len, std::mem::take(&mut scratch), &bad);
                            r.map(|f| {
                                let pixels = n * sample_bytes;
                                // Every byte is written below: a buffer of the right length
                                // (the usual reused one) is not zeroed first.
                                buf.resize(raw_len, 0);
                                pred::decode(&f[..pixels], &g, method, &mut buf[..pixels]);
                                buf[pixels..].copy_from_slice(&f[pixels..]);
                                s.replace(f);
                                buf
                            })
                        });
                        filtered?
                    }
                }
            }
            super::format::CODEC_JPEG => decode_jpeg(stored, spec, n, raw_len, buf, &bad)?,
            _ => {
                buf.clear();
                buf.extend_from_slice(stored);
                buf
            }
        };
        if XxHash3_64::oneshot(&data) != entry.raw_xxh3 {
            return Err(bad("decoded bytes do not match their checksum".into()));
        }
        Self::checked(path, index, entry, data, layout)
    }

    /// A block of codec `none` read straight into `stored` (the decoded bytes are the stored
    /// ones: no copy, and one hash serves both checksums, which must then be equal). The same
    /// rules as `decode`, whose result it equals.
    pub fn decode_none(
        path: &Path,
        index: u32,
        entry: &BlockEntry,
        stored: Vec<u8>,
        layout: &BlockLayout,
    ) -> Result<Block> {
        let bad = |what: String| Error::corrupt(path, Region::Block(index), what);
        let computed = XxHash3_64::oneshot(&stored);
        if computed != entry.stored_xxh3 {
            return Err(bad(format!(
                "checksum mismatch (stored {:016x}, computed {computed:016x})",
                entry.stored_xxh3
            )));
        }
        if entry.raw_xxh3 != entry.stored_xxh3 {
            return Err(bad("decoded bytes do not match their checksum".into()));
        }
        Self::checked(path, index, entry, stored, layout)
    }

    /// The decoded bytes of a block as a block, after the rules on their contents: labels
    /// within the classes, finite floats, valid fields.
    fn checked(
        path: &Path,
        index: u32,
        entry: &BlockEntry,
        data: Vec<u8>,
        layout: &BlockLayout,
    ) -> Result<Block> {
        let (spec, num_classes) = (layout.spec, layout.num_classes);
        let bad = |what: String| Error::corrupt(path, Region::Block(index), what);
        let n = entry.num_samples as usize;
        let sample_bytes = spec.bytes();
        let block = Block {
            data,
            num_samples: n,
            sample_bytes,
            field_bytes: layout.field_bytes,
        };
        if let Some(i) = block.labels().position(|l| l >= num_classes) {
            return Err(bad(format!(
                "sample {i} has label {} but the shard has {num_classes} classes",
                block.label(i)
            )));
        }
        if let Some((i, v)) = super::first_non_finite(spec.dtype, block.pixels()) {
            let e = spec.shape.elems();
            return Err(bad(format!(
                "sample {} holds {v} at value {}: {} samples must be finite",
                i / e,
                i % e,
                spec.dtype
            )));
        }
        if let Some((name, i, p, why)) = layout.fields.first_bad(block.fields(), n) {
            return Err(bad(format!("sample {i}, field {name}, value {p}: {why}")));
        }
        Ok(block)
    }
}

thread_local! {
    /// Each thread's buffer for a pred block's filtered bytes, between zstd and the filter.
    static SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// A block ready to be written.
#[derive(Debug, Clone)]
pub struct EncodedBlock {
    pub bytes: Vec<u8>,
    pub num_samples: u32,
    pub stored_xxh3: u64,
    pub raw_xxh3: u64,
    pub stats: Stats,
    /// One per declared field, in declaration order.
    pub field_stats: Vec<FieldStats>,
}

/// Sums from which class balance and per-channel mean/std follow.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Stats {
    pub class_counts: Vec<u64>,
    pub channels: ChannelSums,
}

/// Per-channel sum and sum of squares of the stored values.
#[derive(Debug, Clone, PartialEq)]
pub enum ChannelSums {
    /// u8/u16: exact integers, so that they add up identically in any order and a resumed run
    /// reports the same figures.
    Int { sum: Vec<u128>, sumsq: Vec<u128> },
    /// f16/f32: f64 sums, added in a fixed order (within a block, then block after block, shard
    /// after shard), so the same dataset always reports the same figures.
    Float { sum: Vec<f64>, sumsq: Vec<f64> },
}

impl Default for ChannelSums {
    fn default() -> Self {
        ChannelSums::Int {
            sum: Vec::new(),
            sumsq: Vec::new(),
        }
    }
}

impl Stats {
    pub fn empty(num_classes: u32, spec: &SampleSpec) -> Self {
        let c = spec.shape.channels();
        Stats {
            class_counts: vec![0; num_classes as usize],
            channels: if spec.dtype.is_float() {
                ChannelSums::Float {
                    sum: vec![0.0; c],
                    sumsq: vec![0.0; c],
                }
            } else {
                ChannelSums::Int {
                    sum: vec![0; c],
                    sumsq: vec![0; c],
                }
            },
        }
    }

    pub fn of_block(block: &Block, spec: &SampleSpec, num_classes: u32) -> Self {
        let c = spec.shape.channels();
        let plane = spec.shape.plane();
        let size = spec.dtype.size();
        let mut s = Stats::empty(num_classes, spec);
        for l in block.labels() {
            s.class_counts[l as usize] += 1;
        }
        for i in 0..block.len() {
            let px = block.sample(i);
            for ch in 0..c {
                let v = &px[size * ch * plane..size * (ch + 1) * plane];
                match (&mut s.channels, spec.dtype) {
                    (ChannelSums::Int { sum, sumsq }, Dtype::U8) => {
                        let (a, q) = sums_u8(v);
                        sum[ch] += a as u128;
                        sumsq[ch] += q;
                    }
                    (ChannelSums::Int { sum, sumsq }, _) => {
                        let (a, q) = sums_u16(v);
                        sum[ch] += a as u128;
                        sumsq[ch] += q;
                    }
                    (ChannelSums::Float { sum, sumsq }, dtype) => {
                        let (a, q) = sums_float(dtype, v);
                        sum[ch] += a;
                        sumsq[ch] += q;
                    }
                }
            }
        }
        s
    }

    /// Add another part's sums. Integer sums saturate: figures read from files were validated,
    /// and a saturated statistic is better than a panic or a silent wrap. Parts of different
    /// kinds (which a dataset never mixes) leave the sums as they are.
    pub fn add(&mut self, o: &Stats) {
        for (a, b) in self.class_counts.iter_mut().zip(&o.class_counts) {
            *a = a.saturating_add(*b);
        }
        match (&mut self.channels, &o.channels) {
            (ChannelSums::Int { sum, sumsq }, ChannelSums::Int { sum: s2, sumsq: q2 }) => {
                for (a, b) in sum.iter_mut().zip(s2).chain(sumsq.iter_mut().zip(q2)) {
                    *a = a.saturating_add(*b);
                }
            }
            (ChannelSums::Float { sum, sumsq }, ChannelSums::Float { sum: s2, sumsq: q2 }) => {
                for (a, b) in sum.iter_mut().zip(s2).chain(sumsq.iter_mut().zip(q2)) {
                    *a += *b;
                }
            }
            _ => {}
        }
    }

    pub fn samples(&self) -> u64 {
        self.class_counts
            .iter()
            .fold(0u64, |a, &b| a.saturating_add(b))
    }

    /// Per-channel mean and standard deviation of value / `dtype.divisor()`: pixels in [0, 1]
    /// for u8/u16, the values themselves for f16/f32.
    pub fn mean_std(&self, spec: &SampleSpec) -> (Vec<f64>, Vec<f64>) {
        let count = self.samples() as f64 * spec.shape.plane() as f64;
        let div = spec.dtype.divisor();
        let (sum, sumsq): (Vec<f64>, Vec<f64>) = match &self.channels {
            ChannelSums::Int { sum, sumsq } => (
                sum.iter().map(|&v| v as f64).collect(),
                sumsq.iter().map(|&v| v as f64).collect(),
            ),
            ChannelSums::Float { sum, sumsq } => (sum.clone(), sumsq.clone()),
        };
        if count == 0.0 {
            let z = vec![0.0; sum.len()];
            return (z.clone(), z);
        }
        sum.iter()
            .zip(&sumsq)
            .map(|(&s, &q)| {
                let m = s / count;
                let var = (q / count - m * m).max(0.0);
                (m / div, var.sqrt() / div)
            })
            .unzip()
    }
}

/// Sum and sum of squares of little-endian f16/f32 values, in f64 (a float32 square is exact in
/// f64). Sequential, so the result depends only on the values.
fn sums_float(dtype: Dtype, v: &[u8]) -> (f64, f64) {
    let (mut s, mut q) = (0.0f64, 0.0f64);
    for i in 0..v.len() / dtype.size() {
        let x = dtype.get(v, i) as f64;
        s += x;
        q += x * x;
    }
    (s, q)
}

/// Sum and sum of squares of u8 values. u32 lanes over short runs let the compiler vectorise.
fn sums_u8(v: &[u8]) -> (u64, u128) {
    let (mut s, mut q) = (0u64, 0u128);
    for chunk in v.chunks(1 << 14) {
        let (mut cs, mut cq) = (0u32, 0u32);
        for &x in chunk {
            let x = x as u32;
            cs += x;
            cq += x * x;
        }
        s += cs as u64;
        q += cq as u128;
    }
    (s, q)
}

fn sums_u16(v: &[u8]) -> (u64, u128) {
    let (mut s, mut q) = (0u64, 0u128);
    for chunk in v.chunks(1 << 14) {
        let (mut cs, mut cq) = (0u64, 0u64);
        for p in chunk.chunks_exact(2) {
            let x = u16::from_le_bytes([p[0], p[1]]) as u64;
            cs += x;
            cq += x * x;
        }
        s += cs;
        q += cq as u128;
    }
    (s, q)
}
