//! Writing a split's files: images memory-mapped and filled a tile of samples at a time, labels.

use super::*;

/// Writes one split: samples arrive in blocks, in order. Dropped unfinished (a failure, an
/// interruption), it removes its temporary files.
pub struct ColmajorWriter {
    images: PathBuf,
    labels: PathBuf,
    images_tmp: Temp,
    labels_tmp: Temp,
    map: MmapMut,
    labels_out: BufWriter<OutFile>,
    n: usize,
    features: usize,
    dtype: Dtype,
    written: usize,
    since_release: usize,
    pub stats: Stats,
}

impl ColmajorWriter {
    pub fn create(
        dir: &Path,
        split: &str,
        n: u64,
        spec: &SampleSpec,
        num_classes: u32,
    ) -> Result<Self> {
        let images = dir.join(images_name(split));
        let labels = dir.join(labels_name(split));
        let features = spec.shape.elems();
        let bytes = n
            .checked_mul(features as u64)
            .and_then(|v| v.checked_mul(4))
            .ok_or_else(|| Error::Invalid("colmajor file size overflows".into()))?;
        if n == 0 {
            return Err(Error::Invalid(format!("split {split} has no samples")));
        }
        let images_tmp = Temp::of(&images);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(images_tmp.path())
            .at(&images)?;
        f.set_len(bytes).at(&images)?;
        // The map is written without write calls: a full disk would be a SIGBUS there.
        crate::store::output::reserve(&f, &images, bytes).at(&images)?;
        // SAFETY: the file was just created by us under a temporary name; nothing else maps or
        // resizes it while the writer lives.
        let map = unsafe { MmapOptions::new().map_mut(&f) }.at(&images)?;
        let labels_tmp = Temp::of(&labels);
        let labels_out = BufWriter::new(OutFile::create(labels_tmp.path()).at(&labels)?);
        Ok(ColmajorWriter {
            images,
            labels,
            images_tmp,
            labels_tmp,
            map,
            labels_out,
            n: n as usize,
            features,
            dtype: spec.dtype,
            written: 0,
            since_release: 0,
            stats: Stats::empty(num_classes, spec),
        })
    }

    /// Write the next block of samples (blocks must come in order).
    pub fn push(&mut self, block: &Block, stats: &Stats) -> Result<()> {
        let (start, m, n, f) = (self.written, block.len(), self.n, self.features);
        if start + m > n {
            return Err(Error::Invalid(format!(
                "colmajor split has {n} samples, got more"
            )));
        }
        let px = block.pixels();
        let dtype = self.dtype;
        // Divide (not multiply by 1/max): readers expect exactly pixel / max (value / 1 for
        // floats, which are written as they are).
        let max = dtype.divisor() as f32;
        let map: &mut [f32] = bytemuck_f32(&mut self.map);
        // One tile of TILE features at a time: each sample's tile is one cache line of input,
        // written to TILE rows sequentially.
        map.par_chunks_mut(n * TILE)
            .enumerate()
            .for_each(|(t, rows)| {
                let f0 = t * TILE;
                let tf = rows.len() / n;
                for i in 0..m {
                    let s = i * f + f0;
                    for k in 0..tf {
                        rows[k * n + start + i] = dtype.get(px, s + k) / max;
                    }
                }
            });
        for l in block.labels() {
            self.labels_out
                .write_all(&(l as i32).to_le_bytes())
                .at(&self.labels)?;
        }
        self.stats.add(stats);
        self.written += m;
        self.since_release += m * f * 4;
        if self.since_release >= RELEASE_EVERY {
            self.release()?;
        }
        Ok(())
    }

    /// Hand written pages to the page cache and drop them from this process, so resident memory
    /// stays bounded whatever the file size.
    fn release(&mut self) -> Result<()> {
        self.since_release = 0;
        self.map.flush_async().at(&self.images)?;
        // SAFETY: the mapping is shared and file-backed: dropping our pages loses no data (the page
        // cache keeps it), and later accesses read the file back.
        unsafe {
            self.map
                .unchecked_advise(memmap2::UncheckedAdvice::DontNeed)
        }
        .at(&self.images)
    }

    pub fn finish(self) -> Result<Stats> {
        if self.written != self.n {
            return Err(Error::Invalid(format!(
                "colmajor split got {} of {} samples",
                self.written, self.n
            )));
        }
        self.map.flush().at(&self.images)?;
        drop(self.map);
        let mut lf = self
            .labels_out
            .into_inner()
            .map_err(|e| Error::io(&self.labels, e.into_error()))?;
        lf.flush().at(&self.labels)?;
        lf.file().sync_all().at(&self.labels)?;
        self.labels_tmp.rename_to(&self.labels)?;
        self.images_tmp.rename_to(&self.images)?;
        Ok(self.stats)
    }
}

pub(super) fn bytemuck_f32(map: &mut MmapMut) -> &mut [f32] {
    let len = map.len() / 4;
    let ptr = map.as_mut_ptr();
    assert_eq!(ptr as usize % 4, 0, "page-aligned map");
    // SAFETY: the map is page aligned, exactly len*4 bytes, and any bit pattern is a valid f32.
    unsafe { std::slice::from_raw_parts_mut(ptr as *mut f32, len) }
}
