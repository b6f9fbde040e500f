//! Writing shards. A shard is written under a temporary name and renamed only once its footer and
//! header are complete, so a reader (or a resumed run) never sees half a shard under a final name.

use super::format::{BlockEntry, Footer, Header, Trailer, HEADER_LEN};
use super::manifest::ShardInfo;
use super::{shard_file_name, Codec, EncodedBlock, SampleSpec, Stats};
use crate::format::fields::{FieldStats, Fields};
use crate::store::output::{OutFile, Temp};
use crate::util::error::{Error, IoContext, Result};
use std::fs::{self, File};
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use twox_hash::XxHash3_64;

/// Writes one shard file from encoded blocks. Errors name the shard's final path; dropped
/// unfinished (a failure, an interruption), it removes its temporary file.
pub struct ShardWriter {
    path: PathBuf,
    rel: String,
    tmp: Temp,
    out: BufWriter<OutFile>,
    spec: SampleSpec,
    codec: Codec,
    num_classes: u32,
    blocks: Vec<BlockEntry>,
    stats: Stats,
    /// Declared fields (version 3) and their summaries so far.
    fields: Fields,
    field_stats: Vec<FieldStats>,
    offset: u64,
    samples: u64,
}

impl ShardWriter {
    /// Start `dir/rel` (written as `dir/rel.tmp` until `finish`).
    pub fn create(
        dir: &Path,
        rel: &str,
        spec: &SampleSpec,
        codec: Codec,
        num_classes: u32,
    ) -> Result<Self> {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).at(parent)?;
        }
        let tmp = Temp::of(&path);
        let file = OutFile::create(tmp.path()).at(&path)?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        // Placeholder; the real header (with counts) is written last.
        out.write_all(&[0u8; HEADER_LEN]).at(&path)?;
        Ok(ShardWriter {
            path,
            rel: rel.to_string(),
            tmp,
            out,
            spec: spec.clone(),
            codec,
            num_classes,
            blocks: Vec::new(),
            stats: Stats::empty(num_classes, spec),
            fields: Fields::default(),
            field_stats: Vec::new(),
            offset: HEADER_LEN as u64,
            samples: 0,
        })
    }

    /// Samples of this shard carry `fields` (set before the first block).
    pub fn with_fields(mut self, fields: &Fields) -> Self {
        self.field_stats = fields.iter().map(FieldStats::empty).collect();
        self.fields = fields.clone();
        self
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    pub fn push(&mut self, b: &EncodedBlock) -> Result<()> {
        if self.blocks.len() as u32 >= super::format::MAX_BLOCKS {
            return Err(Error::Invalid("a shard holds at most 2^20 blocks".into()));
        }
        let per_sample = self.spec.bytes() + super::format::LABEL_BYTES + self.fields.bytes();
        let raw = b.num_samples as u64 * per_sample as u64;
        if raw > super::format::MAX_BLOCK_RAW {
            return Err(Error::Invalid(format!(
                "a block of {} samples decodes to {raw} bytes, over the {} cap: use fewer samples per block",
                b.num_samples,
                super::format::MAX_BLOCK_RAW
            )));
        }
        self.out.write_all(&b.bytes).at(&self.path)?;
        self.blocks.push(BlockEntry {
            offset: self.offset,
            stored_len: b.bytes.len() as u64,
            num_samples: b.num_samples,
            stored_xxh3: b.stored_xxh3,
            raw_xxh3: b.raw_xxh3,
        });
        self.offset += b.bytes.len() as u64;
        self.samples += b.num_samples as u64;
        self.stats.add(&b.stats);
        assert_eq!(
            b.field_stats.len(),
            self.fields.0.len(),
            "a block of other fields"
        );
        for (a, s) in self.field_stats.iter_mut().zip(&b.field_stats) {
            a.add(s);
        }
        Ok(())
    }

    /// Write footer, trailer and header, flush to disk and rename to the final name.
    pub fn finish(mut self) -> Result<ShardInfo> {
        if self.blocks.is_empty() {
            return Err(Error::Invalid("a shard holds at least one block".into()));
        }
        let num_blocks = self.blocks.len() as u32;
        let footer = Footer {
            blocks: std::mem::take(&mut self.blocks),
            stats: self.stats.clone(),
        }
        .encode();
        let trailer = Trailer {
            footer_offset: self.offset,
            footer_len: footer.len() as u64,
            footer_xxh3: XxHash3_64::oneshot(&footer),
        };
        let header = Header {
            spec: self.spec.clone(),
            codec: self.codec.code(),
            num_samples: self.samples,
            num_blocks,
            num_classes: self.num_classes,
            field_bytes: self.fields.bytes() as u32,
            num_fields: self.fields.0.len() as u16,
        };
        let path = self.path;
        self.out.write_all(&footer).at(&path)?;
        self.out.write_all(&trailer.encode()).at(&path)?;
        let mut file = self
            .out
            .into_inner()
            .map_err(|e| Error::io(&path, e.into_error()))?;
        file.seek(SeekFrom::Start(0)).at(&path)?;
        file.write_all(&header.encode()).at(&path)?;
        file.file().sync_all().at(&path)?;
        drop_cached(file.file());
        let bytes = file.file().metadata().at(&path)?.len();
        drop(file);
        self.tmp.rename_to(&path)?;
        Ok(ShardInfo {
            file: self.rel.clone(),
            samples: header.num_samples,
            blocks: header.num_blocks,
            bytes,
            footer_xxh3: format!("{:016x}", trailer.footer_xxh3),
            fields: self.field_stats,
            stats: self.stats,
        })
    }
}

/// Tell the kernel the written (and synced) pages of `file` will not be read soon: writing tens of
/// GB would otherwise fill the page cache and push out what the machine is really using.
pub fn drop_cached(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: plain advisory call on an open descriptor; failure is harmless.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

/// Writes the blocks of one split in order, starting a new shard every `shard_blocks` blocks.
pub struct SplitWriter {
    dir: PathBuf,
    split: String,
    spec: SampleSpec,
    codec: Codec,
    num_classes: u32,
    shard_blocks: u32,
    fields: Fields,
    next_shard: usize,
    current: Option<ShardWriter>,
    done: Vec<ShardInfo>,
}

impl SplitWriter {
    pub fn new(
        dir: &Path,
        split: &str,
        spec: &SampleSpec,
        codec: Codec,
        num_classes: u32,
        shard_blocks: u32,
    ) -> Self {
        SplitWriter {
            dir: dir.to_path_buf(),
            split: split.to_string(),
            spec: spec.clone(),
            codec,
            num_classes,
            shard_blocks: shard_blocks.max(1),
            fields: Fields::default(),
            next_shard: 0,
            current: None,
            done: Vec::new(),
        }
    }

    /// Samples of this split carry `fields`.
    pub fn with_fields(mut self, fields: &Fields) -> Self {
        self.fields = fields.clone();
        self
    }

    pub fn push(&mut self, b: &EncodedBlock) -> Result<()> {
        if self.current.is_none() {
            let rel = shard_file_name(&self.split, self.next_shard);
            self.next_shard += 1;
            let w = ShardWriter::create(&self.dir, &rel, &self.spec, self.codec, self.num_classes)?;
            self.current = Some(w.with_fields(&self.fields));
        }
        let w = self.current.as_mut().unwrap();
        w.push(b)?;
        if w.num_blocks() as u32 >= self.shard_blocks {
            self.done.push(self.current.take().unwrap().finish()?);
        }
        Ok(())
    }

    /// Finish the last shard and return every shard written, in order.
    pub fn finish(mut self) -> Result<Vec<ShardInfo>> {
        if let Some(w) = self.current.take() {
            self.done.push(w.finish()?);
        }
        Ok(self.done)
    }
}
