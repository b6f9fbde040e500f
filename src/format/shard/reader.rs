//! Reading shards: random access to any block, parallel decoding, every block checked on every read.

use super::block::BlockLayout;
use super::format::BlockEntry;
use super::format::{Footer, Header, Trailer, HEADER_LEN, TRAILER_LEN};
use super::{Block, SampleSpec, Stats};
use crate::format::fields::Fields;
use crate::store::Object;
use crate::util::error::{Error, Region, Result};
use rayon::prelude::*;
use std::path::{Path, PathBuf};
use twox_hash::XxHash3_64;

/// An open shard whose header, trailer and footer index have been checked.
#[derive(Debug)]
pub struct ShardReader {
    path: PathBuf,
    file: Box<dyn Object>,
    pub header: Header,
    pub trailer: Trailer,
    pub footer: Footer,
    pub file_len: u64,
    /// The manifest's field declarations (`with_fields`): their values' rules are checked on
    /// every read. Empty for a shard opened alone.
    fields: Fields,
}

impl ShardReader {
    /// Open a local shard file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = crate::store::local::LocalFile::open(path)?;
        Self::from_object(path.to_path_buf(), Box::new(file))
    }

    /// Check and index a shard stored as `file`; `path` names it in errors.
    pub fn from_object(path: PathBuf, file: Box<dyn Object>) -> Result<Self> {
        let file_len = file.len();
        let min = (HEADER_LEN + TRAILER_LEN) as u64;
        if file_len < min {
            return Err(Error::corrupt(
                &path,
                Region::File,
                format!("file is {file_len} bytes, shorter than an empty shard ({min}): truncated"),
            ));
        }
        let mut hb = [0u8; HEADER_LEN];
        file.read_exact_at(&mut hb, 0)?;
        let header = Header::decode(&path, &hb)?;
        let mut tb = [0u8; TRAILER_LEN];
        file.read_exact_at(&mut tb, file_len - TRAILER_LEN as u64)?;
        let trailer = Trailer::decode(&path, &tb, file_len, &header)?;
        // The trailer check bounded footer_len by the header's caps (at most ~41 MiB).
        let mut fb = vec![0u8; trailer.footer_len as usize];
        file.read_exact_at(&mut fb, trailer.footer_offset)?;
        let computed = XxHash3_64::oneshot(&fb);
        if computed != trailer.footer_xxh3 {
            return Err(Error::corrupt(
                &path,
                Region::Footer,
                format!(
                    "checksum mismatch (stored {:016x}, computed {computed:016x})",
                    trailer.footer_xxh3
                ),
            ));
        }
        let footer = Footer::decode(&path, &fb, &header, trailer.footer_offset)?;
        Ok(ShardReader {
            path,
            file,
            header,
            trailer,
            footer,
            file_len,
            fields: Fields::default(),
        })
    }

    /// Check every block's fields by `fields` (the manifest's; their size is the header's).
    pub fn with_fields(mut self, fields: Fields) -> Self {
        self.fields = fields;
        self
    }
    pub fn fields(&self) -> &Fields {
        &self.fields
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn spec(&self) -> &SampleSpec {
        &self.header.spec
    }
    pub fn num_blocks(&self) -> usize {
        self.footer.blocks.len()
    }
    pub fn entry(&self, i: usize) -> &BlockEntry {
        &self.footer.blocks[i]
    }
    pub fn stats(&self) -> &Stats {
        &self.footer.stats
    }

    /// Read the stored bytes of block `i` without decoding them.
    pub fn read_stored(&self, i: usize) -> Result<Vec<u8>> {
        let e = &self.footer.blocks[i];
        // The footer parser checked that the block lies inside the file.
        let mut buf = vec![0u8; e.stored_len as usize];
        self.file.read_exact_at(&mut buf, e.offset)?;
        Ok(buf)
    }

    /// Read, check and decode block `i`.
    pub fn read_block(&self, i: usize) -> Result<Block> {
        self.read_block_into(i, Vec::new())
    }

    /// Read, check and decode block `i` into `buf`, whose allocation is reused (a streaming
    /// reader hands back the buffers of blocks it is done with: fresh multi-MiB buffers cost page
    /// faults on every block). The stored bytes go through a buffer kept per thread.
    pub fn read_block_into(&self, i: usize, buf: Vec<u8>) -> Result<Block> {
        use std::cell::RefCell;
        thread_local! {
            static STORED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
        }
        let e = &self.footer.blocks[i];
        let layout = BlockLayout {
            spec: &self.header.spec,
            codec: self.header.codec,
            num_classes: self.header.num_classes,
            field_bytes: self.header.field_bytes as usize,
            fields: &self.fields,
        };
        if self.header.codec == super::format::CODEC_NONE {
            // Stored bytes are the decoded ones: read them where the block lives.
            let mut buf = buf;
            buf.clear();
            buf.resize(e.stored_len as usize, 0);
            self.file.read_exact_at(&mut buf, e.offset)?;
            return Block::decode_none(&self.path, i as u32, e, buf, &layout);
        }
        STORED.with(|st| {
            let mut stored = st.borrow_mut();
            // The footer parser checked that the block lies inside the file.
            stored.resize(e.stored_len as usize, 0);
            self.file.read_exact_at(&mut stored, e.offset)?;
            Block::decode(&self.path, i as u32, e, &stored, &layout, buf)
        })
    }

    /// Decode the given blocks in parallel, keeping their order; each result stands alone so that one
    /// damaged block does not hide the others.
    pub fn read_blocks_par(&self, blocks: &[usize]) -> Vec<Result<Block>> {
        blocks.par_iter().map(|&i| self.read_block(i)).collect()
    }
}
