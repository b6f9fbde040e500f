//! Byte layout of a shard file (see `formats/shard.md`): header, blocks, footer, trailer.
//! Parsing never trusts a size it has not checked against a cap or the file length, and all offset
//! arithmetic is checked, so a damaged or hostile file gives an error rather than a panic or a huge
//! allocation.

use super::{ChannelSums, Dtype, SampleSpec, Shape, MAX_DIMS, MAX_SAMPLE_BYTES};
use crate::util::error::{Error, Region, Result};
use std::path::Path;
use twox_hash::XxHash3_64;

pub const MAGIC: &[u8; 8] = b"PREPSHRD";
pub const END_MAGIC: &[u8; 8] = b"PREPEND\0";
/// Version 1 holds u8/u16 samples; version 2 adds f16/f32 (and may hold any dtype); version 3
/// adds sample fields (`crate::format::fields`). Writers use the lowest version that holds the
/// data, so files without fields are byte for byte what they were before version 3.
pub const VERSION: u16 = 3;
pub const HEADER_LEN: usize = 64;
pub const TRAILER_LEN: usize = 32;
pub const ENTRY_LEN: usize = 40;
/// Caps a reader enforces before it allocates anything sized by the file.
pub const MAX_BLOCKS: u32 = 1 << 20;
pub const MAX_CLASSES: u32 = 1 << 16;
pub const MAX_CHANNELS: u32 = 1 << 12;
/// Most fields a sample carries (version 3; `crate::format::fields`).
pub const MAX_FIELDS: usize = 64;
/// Largest decoded block (pixels and labels).
pub const MAX_BLOCK_RAW: u64 = 1 << 30;
/// Label bytes per sample (u32, little-endian).
pub const LABEL_BYTES: usize = 4;

pub const CODEC_NONE: u8 = 0;
pub const CODEC_ZSTD: u8 = 1;
pub const CODEC_PRED: u8 = 2;
pub const CODEC_JPEG: u8 = 3;

/// The fixed 64-byte header at offset 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub spec: SampleSpec,
    pub codec: u8,
    pub num_samples: u64,
    pub num_blocks: u32,
    pub num_classes: u32,
    /// Version 3: bytes of every field of one sample (`Fields::bytes`), and how many fields.
    pub field_bytes: u32,
    pub num_fields: u16,
}

impl Header {
    /// The version this header is written with: the lowest that holds its data.
    pub fn version(&self) -> u16 {
        if self.num_fields > 0 {
            3
        } else {
            self.spec.dtype.format_version()
        }
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(MAGIC);
        b[8..10].copy_from_slice(&self.version().to_le_bytes());
        b[10] = self.spec.dtype.code();
        b[11] = self.codec;
        b[12] = self.spec.shape.0.len() as u8;
        for (i, d) in self.spec.shape.0.iter().enumerate() {
            b[16 + 4 * i..20 + 4 * i].copy_from_slice(&d.to_le_bytes());
        }
        b[32..40].copy_from_slice(&self.num_samples.to_le_bytes());
        b[40..44].copy_from_slice(&self.num_blocks.to_le_bytes());
        b[44..48].copy_from_slice(&self.num_classes.to_le_bytes());
        b[48..52].copy_from_slice(&self.field_bytes.to_le_bytes());
        b[52..54].copy_from_slice(&self.num_fields.to_le_bytes());
        let h = XxHash3_64::oneshot(&b[..56]);
        b[56..64].copy_from_slice(&h.to_le_bytes());
        b
    }

    pub fn decode(path: &Path, b: &[u8]) -> Result<Self> {
        let bad = |what: String| Error::corrupt(path, Region::Header, what);
        if b.len() < HEADER_LEN {
            return Err(bad(format!(
                "file is {} bytes, shorter than the {HEADER_LEN}-byte header",
                b.len()
            )));
        }
        if &b[0..8] != MAGIC {
            return Err(bad("wrong magic: not a prep shard file".into()));
        }
        let version = u16::from_le_bytes([b[8], b[9]]);
        if !(1..=VERSION).contains(&version) {
            return Err(bad(format!(
                "format version {version} is not supported (this prep reads versions 1 to {VERSION})"
            )));
        }
        let stored = u64_at(b, 56);
        let computed = XxHash3_64::oneshot(&b[..56]);
        if stored != computed {
            return Err(bad(format!(
                "checksum mismatch (stored {stored:016x}, computed {computed:016x})"
            )));
        }
        let dtype =
            Dtype::from_code(b[10]).ok_or_else(|| bad(format!("unknown dtype code {}", b[10])))?;
        if dtype.format_version() > version {
            return Err(bad(format!(
                "dtype {dtype} (code {}) needs format version {}, the header says {version}",
                b[10],
                dtype.format_version()
            )));
        }
        let codec = b[11];
        if codec > CODEC_JPEG {
            return Err(bad(format!("unknown codec code {codec}")));
        }
        let ndim = b[12] as usize;
        if !(2..=MAX_DIMS).contains(&ndim) {
            return Err(bad(format!(
                "sample has {ndim} dimensions, expected 2 to {MAX_DIMS}"
            )));
        }
        // Version 3 uses bytes 48..54 for its fields; before, they are reserved like 54..56.
        let reserved_from = if version >= 3 { 54 } else { 48 };
        if b[13..16].iter().any(|&x| x != 0) || b[reserved_from..56].iter().any(|&x| x != 0) {
            return Err(bad("reserved bytes are not zero".into()));
        }
        let field_bytes = u32_at(b, 48);
        let num_fields = u16::from_le_bytes([b[52], b[53]]);
        if version >= 3
            && (num_fields == 0
                || num_fields as usize > MAX_FIELDS
                || field_bytes == 0
                || field_bytes as u64 > MAX_SAMPLE_BYTES)
        {
            return Err(bad(format!(
                "{num_fields} fields of {field_bytes} bytes a sample: version 3 holds 1 to {} fields of at most {MAX_SAMPLE_BYTES} bytes",
                MAX_FIELDS
            )));
        }
        let dims: Vec<u32> = (0..MAX_DIMS).map(|i| u32_at(b, 16 + 4 * i)).collect();
        if dims[ndim..].iter().any(|&d| d != 0) {
            return Err(bad("unused dimensions are not zero".into()));
        }
        let shape = Shape::new(dims[..ndim].to_vec()).map_err(|e| bad(e.to_string()))?;
        if shape.0[0] > MAX_CHANNELS {
            return Err(bad(format!(
                "{} channels exceeds the cap of {MAX_CHANNELS}",
                shape.0[0]
            )));
        }
        let spec = SampleSpec { shape, dtype };
        if spec.bytes() as u64 > MAX_SAMPLE_BYTES {
            return Err(bad("sample is larger than 512 MiB".into()));
        }
        let num_samples = u64_at(b, 32);
        let num_blocks = u32_at(b, 40);
        let num_classes = u32_at(b, 44);
        if num_blocks > MAX_BLOCKS {
            return Err(bad(format!(
                "{num_blocks} blocks exceeds the cap of {MAX_BLOCKS}"
            )));
        }
        if num_classes == 0 || num_classes > MAX_CLASSES {
            return Err(bad(format!(
                "{num_classes} classes is outside 1..={MAX_CLASSES}"
            )));
        }
        if num_blocks == 0 {
            return Err(bad("a shard holds at least one block".into()));
        }
        if num_samples < num_blocks as u64 {
            return Err(bad(format!(
                "{num_samples} samples in {num_blocks} blocks: a block is never empty"
            )));
        }
        Ok(Header {
            spec,
            codec,
            num_samples,
            num_blocks,
            num_classes,
            field_bytes,
            num_fields,
        })
    }

    /// Decoded bytes per sample: pixels, label, fields.
    pub fn sample_raw_bytes(&self) -> u64 {
        (self.spec.bytes() + LABEL_BYTES) as u64 + self.field_bytes as u64
    }

    /// Exact length of the footer this header implies.
    pub fn footer_len(&self) -> u64 {
        self.num_blocks as u64 * ENTRY_LEN as u64
            + self.num_classes as u64 * 8
            + self.spec.shape.channels() as u64 * 32
    }
}

/// One footer index entry: where a block is and how to check it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockEntry {
    pub offset: u64,
    pub stored_len: u64,
    pub num_samples: u32,
    /// xxh3-64 of the stored (compressed) bytes.
    pub stored_xxh3: u64,
    /// xxh3-64 of the decoded bytes (pixels then labels).
    pub raw_xxh3: u64,
}

/// The 32-byte trailer at the very end of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trailer {
    pub footer_offset: u64,
    pub footer_len: u64,
    pub footer_xxh3: u64,
}

impl Trailer {
    pub fn encode(&self) -> [u8; TRAILER_LEN] {
        let mut b = [0u8; TRAILER_LEN];
        b[0..8].copy_from_slice(&self.footer_offset.to_le_bytes());
        b[8..16].copy_from_slice(&self.footer_len.to_le_bytes());
        b[16..24].copy_from_slice(&self.footer_xxh3.to_le_bytes());
        b[24..32].copy_from_slice(END_MAGIC);
        b
    }

    /// Parse and bound-check the trailer against the file length and the header.
    pub fn decode(path: &Path, b: &[u8], file_len: u64, header: &Header) -> Result<Self> {
        let bad = |what: String| Error::corrupt(path, Region::Trailer, what);
        if &b[24..32] != END_MAGIC {
            return Err(bad(
                "wrong end magic: the file is truncated or was not finished".into(),
            ));
        }
        let t = Trailer {
            footer_offset: u64_at(b, 0),
            footer_len: u64_at(b, 8),
            footer_xxh3: u64_at(b, 16),
        };
        let expect_len = header.footer_len();
        if t.footer_len != expect_len {
            return Err(bad(format!(
                "footer length {} disagrees with the header ({expect_len} expected)",
                t.footer_len
            )));
        }
        let end = t
            .footer_offset
            .checked_add(t.footer_len)
            .and_then(|e| e.checked_add(TRAILER_LEN as u64));
        if t.footer_offset < HEADER_LEN as u64 || end != Some(file_len) {
            return Err(bad(format!(
                "footer at {}+{} does not end at the trailer (file is {file_len} bytes)",
                t.footer_offset, t.footer_len
            )));
        }
        Ok(t)
    }
}

/// Decoded footer: the block index and the shard's statistics.
#[derive(Debug, Clone, PartialEq)]
pub struct Footer {
    pub blocks: Vec<BlockEntry>,
    pub stats: super::Stats,
}

impl Footer {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.blocks.len() * ENTRY_LEN + 64);
        for e in &self.blocks {
            b.extend_from_slice(&e.offset.to_le_bytes());
            b.extend_from_slice(&e.stored_len.to_le_bytes());
            b.extend_from_slice(&e.num_samples.to_le_bytes());
            b.extend_from_slice(&0u32.to_le_bytes());
            b.extend_from_slice(&e.stored_xxh3.to_le_bytes());
            b.extend_from_slice(&e.raw_xxh3.to_le_bytes());
        }
        for c in &self.stats.class_counts {
            b.extend_from_slice(&c.to_le_bytes());
        }
        match &self.stats.channels {
            ChannelSums::Int { sum, sumsq } => {
                for s in sum.iter().chain(sumsq) {
                    b.extend_from_slice(&s.to_le_bytes());
                }
            }
            // An f64 in the low 8 bytes of each 16-byte field, the high 8 bytes zero.
            ChannelSums::Float { sum, sumsq } => {
                for s in sum.iter().chain(sumsq) {
                    b.extend_from_slice(&s.to_le_bytes());
                    b.extend_from_slice(&[0u8; 8]);
                }
            }
        }
        b
    }

    /// Parse a footer whose length and checksum were already checked against the trailer.
    pub fn decode(path: &Path, b: &[u8], header: &Header, footer_offset: u64) -> Result<Self> {
        let bad = |what: String| Error::corrupt(path, Region::Footer, what);
        debug_assert_eq!(b.len() as u64, header.footer_len());
        let nb = header.num_blocks as usize;
        let mut blocks = Vec::with_capacity(nb);
        let mut expect_offset = HEADER_LEN as u64;
        let mut samples = 0u64;
        let per_sample_raw = header.sample_raw_bytes();
        for i in 0..nb {
            let o = i * ENTRY_LEN;
            let e = BlockEntry {
                offset: u64_at(b, o),
                stored_len: u64_at(b, o + 8),
                num_samples: u32_at(b, o + 16),
                stored_xxh3: u64_at(b, o + 24),
                raw_xxh3: u64_at(b, o + 32),
            };
            if u32_at(b, o + 20) != 0 {
                return Err(bad(format!("entry {i}: reserved bytes are not zero")));
            }
            if e.offset != expect_offset {
                return Err(bad(format!(
                    "block {i} starts at {} but the previous block ends at {expect_offset}",
                    e.offset
                )));
            }
            if e.num_samples == 0 {
                return Err(bad(format!("block {i} holds no samples")));
            }
            let raw = (e.num_samples as u64)
                .checked_mul(per_sample_raw)
                .filter(|&r| r <= MAX_BLOCK_RAW)
                .ok_or_else(|| {
                    bad(format!(
                        "block {i} decodes to more than {MAX_BLOCK_RAW} bytes"
                    ))
                })?;
            if header.codec == CODEC_NONE && e.stored_len != raw {
                return Err(bad(format!(
                    "block {i} is stored raw but is not {raw} bytes long"
                )));
            }
            // zstd never expands data by more than ~1/128 plus a small constant.
            if e.stored_len == 0 || e.stored_len > raw + raw / 128 + (1 << 16) {
                return Err(bad(format!(
                    "block {i}: stored length {} is impossible for {raw} decoded bytes",
                    e.stored_len
                )));
            }
            expect_offset = e
                .offset
                .checked_add(e.stored_len)
                .filter(|&end| end <= footer_offset)
                .ok_or_else(|| bad(format!("block {i} runs past the footer")))?;
            samples += e.num_samples as u64; // at most 2^20 blocks of 2^32 samples: no overflow
            blocks.push(e);
        }
        if expect_offset != footer_offset {
            return Err(bad(format!(
                "blocks end at {expect_offset} but the footer starts at {footer_offset}"
            )));
        }
        if samples != header.num_samples {
            return Err(bad(format!(
                "blocks hold {samples} samples, the header says {}",
                header.num_samples
            )));
        }
        let mut o = nb * ENTRY_LEN;
        let class_counts: Vec<u64> = (0..header.num_classes as usize)
            .map(|k| u64_at(b, o + 8 * k))
            .collect();
        o += 8 * header.num_classes as usize;
        let c = header.spec.shape.channels();
        if checked_sum(&class_counts) != Some(header.num_samples) {
            return Err(bad(
                "class counts do not add up to the number of samples".into()
            ));
        }
        let fields: Vec<u128> = (0..2 * c).map(|k| u128_at(b, o + 16 * k)).collect();
        let channels = if header.spec.dtype.is_float() {
            let mut v = Vec::with_capacity(2 * c);
            for (k, &f) in fields.iter().enumerate() {
                let what = if k < c { "sum" } else { "sum of squares" };
                let x = f64::from_bits(f as u64);
                if f >> 64 != 0 {
                    return Err(bad(format!(
                        "channel {} {what}: the high 8 bytes of a float statistic are not zero",
                        k % c
                    )));
                }
                if !x.is_finite() || (k >= c && x < 0.0) {
                    return Err(bad(format!("channel {} {what} is {x}", k % c)));
                }
                v.push(x);
            }
            let sumsq = v.split_off(c);
            ChannelSums::Float { sum: v, sumsq }
        } else {
            let mut sum = fields;
            let sumsq = sum.split_off(c);
            ChannelSums::Int { sum, sumsq }
        };
        Ok(Footer {
            blocks,
            stats: super::Stats {
                class_counts,
                channels,
            },
        })
    }
}

/// Sum that reports overflow instead of wrapping: counts come from files.
pub fn checked_sum(v: &[u64]) -> Option<u64> {
    v.iter().try_fold(0u64, |a, &b| a.checked_add(b))
}

pub fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
pub fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}
fn u128_at(b: &[u8], o: usize) -> u128 {
    u128::from_le_bytes(b[o..o + 16].try_into().unwrap())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::shard::{Block, Codec, Stats};

    fn spec(dtype: Dtype) -> SampleSpec {
        SampleSpec {
            shape: Shape::new(vec![2, 2, 3]).unwrap(),
            dtype,
        }
    }

    fn header(dtype: Dtype) -> Header {
        Header {
            spec: spec(dtype),
            codec: CODEC_NONE,
            num_samples: 3,
            num_blocks: 1,
            num_classes: 2,
            field_bytes: 0,
            num_fields: 0,
        }
    }

    fn rehash(b: &mut [u8; HEADER_LEN]) {
        let h = XxHash3_64::oneshot(&b[..56]);
        b[56..64].copy_from_slice(&h.to_le_bytes());
    }

    #[test]
    fn header_version_follows_the_dtype() {
        let path = Path::new("x.shard");
        for (dtype, version) in [
            (Dtype::U8, 1),
            (Dtype::U16, 1),
            (Dtype::F16, 2),
            (Dtype::F32, 2),
        ] {
            let b = header(dtype).encode();
            assert_eq!(u16::from_le_bytes([b[8], b[9]]), version, "{dtype}");
            assert_eq!(b[10], dtype.code());
            assert_eq!(Header::decode(path, &b).unwrap(), header(dtype));
        }
        // A float code under version 1 is an error naming the file; version 2 reads u8 too.
        let mut b = header(Dtype::F16).encode();
        b[8] = 1;
        rehash(&mut b);
        let e = Header::decode(path, &b).unwrap_err().to_string();
        assert_eq!(
            e,
            "x.shard: header: dtype f16 (code 3) needs format version 2, the header says 1"
        );
        let mut b = header(Dtype::U8).encode();
        b[8] = 2;
        rehash(&mut b);
        assert_eq!(Header::decode(path, &b).unwrap(), header(Dtype::U8));
        b[10] = 5;
        rehash(&mut b);
        assert!(Header::decode(path, &b)
            .unwrap_err()
            .to_string()
            .contains("unknown dtype code 5"));
    }

    /// How a reader of `float_block`'s shard (codec none, two classes) decodes its blocks.
    fn none_layout(h: &Header) -> crate::format::shard::block::BlockLayout<'_> {
        static NO_FIELDS: std::sync::OnceLock<crate::format::fields::Fields> =
            std::sync::OnceLock::new();
        crate::format::shard::block::BlockLayout {
            spec: &h.spec,
            codec: CODEC_NONE,
            num_classes: 2,
            field_bytes: 0,
            fields: NO_FIELDS.get_or_init(Default::default),
        }
    }

    /// A block of three f32 samples and the footer of a shard holding just it.
    fn float_block() -> (Block, Footer, Header) {
        let sp = spec(Dtype::F32);
        let mut block = Block::zeroed(3, sp.bytes());
        for (k, v) in block.pixels_mut().chunks_exact_mut(4).enumerate() {
            v.copy_from_slice(&(k as f32 * -1.5 + 2.0).to_le_bytes());
        }
        block.set_label(1, 1);
        let enc = block.encode(&sp, 2, Codec::None).unwrap();
        let footer = Footer {
            blocks: vec![BlockEntry {
                offset: HEADER_LEN as u64,
                stored_len: enc.bytes.len() as u64,
                num_samples: 3,
                stored_xxh3: enc.stored_xxh3,
                raw_xxh3: enc.raw_xxh3,
            }],
            stats: enc.stats,
        };
        (block, footer, header(Dtype::F32))
    }

    #[test]
    fn float_statistics_round_trip_and_are_checked() {
        let path = Path::new("f.shard");
        let (block, footer, h) = float_block();
        let end = HEADER_LEN as u64 + footer.blocks[0].stored_len;
        let b = footer.encode();
        assert_eq!(b.len() as u64, h.footer_len());
        let back = Footer::decode(path, &b, &h, end).unwrap();
        assert_eq!(back, footer);
        // Channel 0 holds values 0..6 of each sample, channel 1 values 6..12: raw statistics.
        let (mean, std) = back.stats.mean_std(&h.spec);
        let vals = |c: usize| -> Vec<f64> {
            (0..3)
                .flat_map(|s| (0..6).map(move |p| (s * 12 + c * 6 + p) as f64 * -1.5 + 2.0))
                .collect()
        };
        for c in 0..2 {
            let v = vals(c);
            let m = v.iter().sum::<f64>() / 18.0;
            let sd = (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / 18.0).sqrt();
            assert!((mean[c] - m).abs() < 1e-12 && (std[c] - sd).abs() < 1e-9);
        }
        let mut total = Stats::empty(2, &h.spec);
        total.add(&Stats::of_block(&block, &h.spec, 2));
        assert_eq!(total, footer.stats);
        // The high bytes of a float field, a NaN sum, a negative sum of squares.
        let stats_at = ENTRY_LEN + 8 * 2;
        for (at, bytes, what) in [
            (stats_at + 8, vec![1u8], "high 8 bytes"),
            (
                stats_at,
                f64::NAN.to_le_bytes().to_vec(),
                "channel 0 sum is NaN",
            ),
            (
                stats_at + 16 * 3,
                (-1.0f64).to_le_bytes().to_vec(),
                "channel 1 sum of squares is -1",
            ),
        ] {
            let mut bad = b.clone();
            bad[at..at + bytes.len()].copy_from_slice(&bytes);
            let e = Footer::decode(path, &bad, &h, end).unwrap_err().to_string();
            assert!(
                e.starts_with("f.shard: footer: ") && e.contains(what),
                "{e}"
            );
        }
    }

    #[test]
    fn non_finite_float_values_are_refused_both_ways() {
        let path = Path::new("n.shard");
        let (block, footer, h) = float_block();
        for (dtype, bits) in [
            (Dtype::F32, f32::NAN.to_le_bytes().to_vec()),
            (Dtype::F32, f32::INFINITY.to_le_bytes().to_vec()),
            (Dtype::F16, half::f16::NEG_INFINITY.to_le_bytes().to_vec()),
        ] {
            let sp = spec(dtype);
            let mut b = Block::zeroed(3, sp.bytes());
            let at = sp.bytes() + 2 * dtype.size();
            b.pixels_mut()[at..at + bits.len()].copy_from_slice(&bits);
            let e = b.encode(&sp, 2, Codec::None).unwrap_err().to_string();
            assert!(e.contains("sample 1") && e.contains("finite"), "{e}");
        }
        // Decoding a block whose checksums hold but which holds a NaN.
        let mut raw = block.raw().to_vec();
        raw[4 * 13..4 * 14].copy_from_slice(&f32::NAN.to_le_bytes());
        let mut e = footer.blocks[0];
        e.stored_xxh3 = XxHash3_64::oneshot(&raw);
        e.raw_xxh3 = e.stored_xxh3;
        let layout = none_layout(&h);
        let err = Block::decode(path, 0, &e, &raw, &layout, Vec::new())
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "n.shard: block 0: sample 1 holds NaN at value 1: f32 samples must be finite"
        );
        let err = Block::decode_none(path, 0, &e, raw, &layout)
            .unwrap_err()
            .to_string();
        assert!(err.contains("sample 1 holds NaN"), "{err}");
    }

    /// A `none` block read in place (`decode_none`) is the block `decode` gives, and is refused
    /// where `decode` refuses it: a flipped byte, or checksums that differ (the decoded bytes
    /// are the stored ones, so they cannot).
    #[test]
    fn a_none_block_read_in_place_follows_the_rules_of_decode() {
        let path = Path::new("z.shard");
        let (block, footer, h) = float_block();
        let layout = none_layout(&h);
        let e = footer.blocks[0];
        let raw = block.raw().to_vec();
        let a = Block::decode(path, 0, &e, &raw, &layout, Vec::new()).unwrap();
        let b = Block::decode_none(path, 0, &e, raw.clone(), &layout).unwrap();
        assert_eq!(a.raw(), b.raw());
        assert_eq!(b.raw(), block.raw());
        let mut flipped = raw.clone();
        flipped[5] ^= 0x10;
        for r in [
            Block::decode(path, 0, &e, &flipped, &layout, Vec::new()),
            Block::decode_none(path, 0, &e, flipped.clone(), &layout),
        ] {
            let err = r.unwrap_err().to_string();
            assert!(
                err.starts_with("z.shard: block 0: checksum mismatch"),
                "{err}"
            );
        }
        let mut odd = e;
        odd.raw_xxh3 ^= 1;
        for r in [
            Block::decode(path, 0, &odd, &raw, &layout, Vec::new()),
            Block::decode_none(path, 0, &odd, raw.clone(), &layout),
        ] {
            let err = r.unwrap_err().to_string();
            assert_eq!(
                err,
                "z.shard: block 0: decoded bytes do not match their checksum"
            );
        }
    }
}
