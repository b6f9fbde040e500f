//! `prep._prep`: the native half of the Python package. It wraps the main crate's reader
//! (`prep::format::shard`, `prep::train::input`) so that Python reads exactly what `prep train` reads,
//! in the same order, with every block checked. The Python half (`python/prep/`) turns the
//! buffers returned here into NumPy arrays and PyTorch tensors.

use prep::format::fields::Fields;
use prep::format::shard::{Block, Dataset, Dtype};
use prep::train::input::{self, EpochPlan, Loader, OnDamage, Share, Source};
use prep::util::error::Region;
use pyo3::create_exception;
use pyo3::exceptions::{
    PyIndexError, PyKeyboardInterrupt, PyOSError, PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

create_exception!(
    prep,
    DatasetError,
    PyValueError,
    "The directory is not a readable prep dataset, or one of its files breaks the format \
     (the message names the file)."
);
create_exception!(
    prep,
    DamagedBlockError,
    DatasetError,
    "A block of a shard file failed its checks (checksum, size, labels). `file` is the shard \
     file and `block` the block index in it."
);

/// A library error as the Python exception that fits it, naming the file (and block).
fn py_err(py: Python<'_>, e: prep::Error) -> PyErr {
    let msg = e.to_string();
    match e {
        prep::Error::Corrupt {
            path,
            region: Region::Block(b),
            ..
        } => {
            let err = DamagedBlockError::new_err(msg);
            let v = err.value(py);
            let _ = v.setattr("file", path.display().to_string());
            let _ = v.setattr("block", b);
            err
        }
        prep::Error::Corrupt { path, .. } | prep::Error::Manifest { path, .. } => {
            let err = DatasetError::new_err(msg);
            let _ = err.value(py).setattr("file", path.display().to_string());
            err
        }
        prep::Error::Io { path, cause } => os_error(&path, &cause),
        prep::Error::Invalid(_) => PyValueError::new_err(msg),
        prep::Error::Source(_) => DatasetError::new_err(msg),
        prep::Error::Device(_) => PyRuntimeError::new_err(msg),
        // Another prep is writing the dataset: retrying later may work.
        prep::Error::Busy(_) => PyRuntimeError::new_err(msg),
        // Only the prep binary turns signals into this error; kept for completeness.
        prep::Error::Interrupted { .. } => PyKeyboardInterrupt::new_err(msg),
    }
}

/// `OSError(errno, text, filename)`, which Python turns into FileNotFoundError,
/// PermissionError, ... by the errno; its text is the system's, without Rust's "(os error N)".
fn os_error(path: &Path, e: &std::io::Error) -> PyErr {
    let shown = path.display().to_string();
    match e.raw_os_error() {
        Some(code) => {
            let text = e.to_string();
            let text = match text.rfind(" (os error ") {
                Some(at) => text[..at].to_string(),
                None => text,
            };
            PyOSError::new_err((code, text, shown))
        }
        None => PyOSError::new_err(format!("{shown}: {e}")),
    }
}

/// Memory owned by Rust and lent to NumPy through `__array_interface__`: `numpy.asarray(buffer)`
/// is an array over these bytes (no copy) that keeps the buffer alive as its base.
#[pyclass(frozen, module = "prep._prep")]
struct Buffer {
    data: UnsafeCell<Data>,
    shape: Vec<usize>,
    typestr: &'static str,
    /// The reader a batch's pixels came from: they go back to it once NumPy lets go of them, so
    /// that a stream of batches reuses a few buffers instead of zeroing and faulting in fresh
    /// megabytes for every batch.
    home: Option<std::sync::mpsc::Sender<Vec<u8>>>,
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let (Data::Bytes(v), Some(home)) = (self.data.get_mut(), self.home.take()) {
            let _ = home.send(std::mem::take(v));
        }
    }
}

enum Data {
    Bytes(Vec<u8>),
    I64(Vec<i64>),
}

// The data is never read or written through Rust after the buffer is made: only NumPy touches
// it, through the pointer, under its own rules (as for any array it does not own).
unsafe impl Sync for Buffer {}

impl Buffer {
    fn bytes(v: Vec<u8>, shape: Vec<usize>, typestr: &'static str) -> Self {
        Buffer {
            data: UnsafeCell::new(Data::Bytes(v)),
            shape,
            typestr,
            home: None,
        }
    }
    fn labels(v: Vec<i64>) -> Self {
        let n = v.len();
        Buffer {
            data: UnsafeCell::new(Data::I64(v)),
            shape: vec![n],
            typestr: "<i8",
            home: None,
        }
    }
}

#[pymethods]
impl Buffer {
    #[getter(__array_interface__)]
    fn array_interface<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        // SAFETY: the pointer is taken, not dereferenced; the Vec is not resized after creation.
        let ptr = unsafe {
            match &mut *self.data.get() {
                Data::Bytes(v) => v.as_mut_ptr() as usize,
                Data::I64(v) => v.as_mut_ptr() as usize,
            }
        };
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", pyo3::types::PyTuple::new(py, &self.shape)?)?;
        d.set_item("typestr", self.typestr)?;
        d.set_item("data", (ptr, false))?;
        Ok(d)
    }
}

fn typestr(d: Dtype) -> &'static str {
    match d {
        Dtype::U8 => "|u1",
        Dtype::U16 => "<u2",
        Dtype::F16 => "<f2",
        Dtype::F32 => "<f4",
    }
}

/// An open dataset directory: its manifest has been read and checked.
#[pyclass(frozen, module = "prep._prep")]
struct NativeDataset {
    ds: Arc<Dataset>,
}

#[pymethods]
impl NativeDataset {
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        if prep::store::remote::is_url(&path) {
            // A dataset in an object store or on an HTTP server (s3://, gs://, az://, http(s)://).
            let ds = py
                .detach(|| Dataset::open(&path))
                .map_err(|e| py_err(py, e))?;
            return Ok(NativeDataset { ds: Arc::new(ds) });
        }
        // `manifest.json` itself names its dataset.
        let dir = if path.is_file()
            && path
                .file_name()
                .map(|n| n == prep::format::shard::manifest::FILE_NAME)
                == Some(true)
        {
            path.parent().unwrap_or(Path::new(".")).to_path_buf()
        } else {
            path
        };
        let shown = dir.display().to_string();
        match std::fs::metadata(&dir) {
            Err(e) => return Err(os_error(&dir, &e)),
            Ok(m) if !m.is_dir() => {
                return Err(DatasetError::new_err(format!(
                    "{shown}: not a directory; a prep dataset is a directory holding manifest.json"
                )))
            }
            Ok(_) => {}
        }
        let manifest = dir.join(prep::format::shard::manifest::FILE_NAME);
        if !manifest.exists() {
            return Err(DatasetError::new_err(format!(
                "{shown}: not a prep dataset (it has no {})",
                prep::format::shard::manifest::FILE_NAME
            )));
        }
        if let Ok(f) = prep::dataset_format(&dir) {
            if f != prep::format::shard::manifest::FORMAT {
                return Err(DatasetError::new_err(format!(
                    "{shown}: a '{f}' dataset; the Python reader reads prep shard datasets \
                     ('{}', `prep convert --format shards`)",
                    prep::format::shard::manifest::FORMAT
                )));
            }
        }
        let ds = py
            .detach(|| Dataset::open(&dir))
            .map_err(|e| py_err(py, e))?;
        Ok(NativeDataset { ds: Arc::new(ds) })
    }

    /// The manifest as JSON text (the Python side parses it).
    fn manifest_json(&self) -> String {
        String::from_utf8_lossy(&self.ds.manifest.to_bytes()).into_owned()
    }

    #[getter]
    fn path(&self) -> String {
        self.ds.dir.display().to_string()
    }

    /// Open a split: every shard's header, trailer and footer index is read and checked against
    /// the manifest. `cache_bytes` bounds the decoded blocks kept for random access (at least one
    /// block is kept).
    fn open_split(&self, py: Python<'_>, name: &str, cache_bytes: usize) -> PyResult<NativeSplit> {
        let ds = self.ds.clone();
        let src = py
            .detach(|| Source::open(&ds, name))
            .map_err(|e| py_err(py, e))?;
        let sizes = src.block_sizes();
        let mut starts = Vec::with_capacity(sizes.len() + 1);
        let mut acc = 0usize;
        starts.push(0);
        for &s in &sizes {
            acc += s;
            starts.push(acc);
        }
        Ok(NativeSplit {
            fields: ds.manifest.fields.clone(),
            name: name.to_string(),
            dims: src.spec.shape.0.iter().map(|&d| d as usize).collect(),
            typestr: typestr(src.spec.dtype),
            sample_bytes: src.spec.bytes(),
            src,
            sizes,
            starts,
            cache: Mutex::new(VecDeque::new()),
            cache_bytes,
            hits: AtomicUsize::new(0),
            misses: AtomicUsize::new(0),
        })
    }
}

/// One split, open for random access and streaming.
#[pyclass(frozen, module = "prep._prep")]
struct NativeSplit {
    /// What each sample carries beside its image and class (format version 3).
    fields: Fields,
    name: String,
    src: Arc<Source>,
    dims: Vec<usize>,
    typestr: &'static str,
    sample_bytes: usize,
    sizes: Vec<usize>,
    /// Index of the first sample of each block, and the sample count at the end.
    starts: Vec<usize>,
    /// Decoded blocks, least recently used first.
    cache: Mutex<VecDeque<(usize, Arc<Block>)>>,
    cache_bytes: usize,
    hits: AtomicUsize,
    misses: AtomicUsize,
}

impl NativeSplit {
    fn locate(&self, i: usize) -> (usize, usize) {
        // The last block whose first sample is at or before i.
        let b = self.starts.partition_point(|&s| s <= i) - 1;
        (b, i - self.starts[b])
    }

    fn cached(&self, b: usize) -> Option<Arc<Block>> {
        let mut c = self.cache.lock().unwrap();
        let at = c.iter().position(|(k, _)| *k == b)?;
        let e = c.remove(at).unwrap();
        let blk = e.1.clone();
        c.push_back(e);
        Some(blk)
    }

    fn insert(&self, b: usize, blk: Arc<Block>) {
        let mut c = self.cache.lock().unwrap();
        if c.iter().any(|(k, _)| *k == b) {
            return;
        }
        c.push_back((b, blk));
        let bytes = |c: &VecDeque<(usize, Arc<Block>)>| -> usize {
            c.iter().map(|(_, b)| b.raw().len()).sum()
        };
        while c.len() > 1 && bytes(&c) > self.cache_bytes {
            c.pop_front();
        }
    }

    /// Block `b`, from the cache or read, checked and decoded (without the GIL).
    fn block(&self, py: Python<'_>, b: usize) -> PyResult<Arc<Block>> {
        if let Some(blk) = self.cached(b) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(blk);
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let blk = Arc::new(py.detach(|| self.src.read(b)).map_err(|e| py_err(py, e))?);
        self.insert(b, blk.clone());
        Ok(blk)
    }

    /// Field `f`'s values of `n` samples (or of one, without a leading axis).
    fn field_buffer(&self, f: usize, v: Vec<u8>, n: Option<usize>) -> Buffer {
        let field = &self.fields.0[f];
        let shape = n
            .into_iter()
            .chain(field.shape.iter().map(|&d| d as usize))
            .collect();
        Buffer::bytes(v, shape, typestr(field.dtype))
    }

    fn sample_shape(&self, n: Option<usize>) -> Vec<usize> {
        n.into_iter().chain(self.dims.iter().copied()).collect()
    }

    fn index(&self, i: i64) -> PyResult<usize> {
        let n = self.len() as i64;
        let j = if i < 0 { i + n } else { i };
        if j < 0 || j >= n {
            return Err(PyIndexError::new_err(format!(
                "sample {i} is out of range: split '{}' has {n} samples",
                self.name
            )));
        }
        Ok(j as usize)
    }

    fn len(&self) -> usize {
        *self.starts.last().unwrap()
    }

    fn share(&self, index: usize, count: usize) -> PyResult<Share> {
        Share::new(index, count).map_err(|e| PyValueError::new_err(e.to_string()))
    }
}

fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

fn pool(threads: usize) -> PyResult<Arc<rayon::ThreadPool>> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .thread_name(|i| format!("prep-copy-{i}"))
        .build()
        .map(Arc::new)
        .map_err(|e| PyRuntimeError::new_err(format!("could not start threads: {e}")))
}

/// A raw pointer that may cross threads: each task writes a disjoint part of one output buffer.
#[derive(Clone, Copy)]
struct SendPtr(*mut u8);
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

#[pymethods]
impl NativeSplit {
    fn __len__(&self) -> usize {
        self.len()
    }

    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    #[getter]
    fn block_sizes(&self) -> Vec<usize> {
        self.sizes.clone()
    }

    /// (hits, misses) of the block cache.
    fn cache_stats(&self) -> (usize, usize) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }

    /// Sample `i` (negative counts from the end): its pixels, label and fields (in declaration
    /// order; none before format version 3). Only the block holding it is read and checked,
    /// unless the cache holds it already.
    fn get(&self, py: Python<'_>, i: i64) -> PyResult<(Buffer, u32, Vec<Buffer>)> {
        let (b, k) = self.locate(self.index(i)?);
        let blk = self.block(py, b)?;
        let fields = (0..self.fields.0.len())
            .map(|f| self.field_buffer(f, blk.field(&self.fields, f, k).to_vec(), None))
            .collect();
        Ok((
            Buffer::bytes(
                blk.sample(k).to_vec(),
                self.sample_shape(None),
                self.typestr,
            ),
            blk.label(k),
            fields,
        ))
    }

    /// The names, kinds and value names of the fields, in declaration order.
    fn field_names(&self) -> Vec<String> {
        self.fields.iter().map(|f| f.name.clone()).collect()
    }

    /// The samples at `indices`, in that order, as one batch: each block that holds any of them
    /// is read and checked once, on `threads` threads, at most `threads` blocks in memory at once
    /// besides the cache.
    #[pyo3(signature = (indices, threads=None))]
    fn take(
        &self,
        py: Python<'_>,
        indices: Vec<i64>,
        threads: Option<usize>,
    ) -> PyResult<(Buffer, Buffer, Vec<Buffer>)> {
        let n = indices.len();
        let mut by_block: Vec<(usize, usize, usize)> = Vec::with_capacity(n); // (block, offset, out)
        for (o, &i) in indices.iter().enumerate() {
            let (b, k) = self.locate(self.index(i)?);
            by_block.push((b, k, o));
        }
        by_block.sort_unstable();
        let mut groups: Vec<&[(usize, usize, usize)]> = Vec::new();
        let mut s = 0;
        for j in 1..=by_block.len() {
            if j == by_block.len() || by_block[j].0 != by_block[s].0 {
                groups.push(&by_block[s..j]);
                s = j;
            }
        }
        let sb = self.sample_bytes;
        let mut pixels = vec![0u8; n * sb];
        let mut labels = vec![0i64; n];
        let fields = &self.fields;
        let field_bytes: Vec<usize> = fields.iter().map(|f| f.bytes()).collect();
        let mut field_out: Vec<Vec<u8>> = field_bytes.iter().map(|&b| vec![0u8; n * b]).collect();
        let field_ptrs: Vec<SendPtr> = field_out
            .iter_mut()
            .map(|v| SendPtr(v.as_mut_ptr()))
            .collect();
        let threads = threads.unwrap_or_else(default_threads).max(1);
        let next = AtomicUsize::new(0);
        let px = SendPtr(pixels.as_mut_ptr());
        let lb = SendPtr(labels.as_mut_ptr() as *mut u8);
        let cached: Vec<Option<Arc<Block>>> = groups.iter().map(|g| self.cached(g[0].0)).collect();
        let src = &self.src;
        let r: prep::Result<()> = py.detach(|| {
            std::thread::scope(|sc| {
                let work = || -> prep::Result<()> {
                    loop {
                        let gi = next.fetch_add(1, Ordering::Relaxed);
                        if gi >= groups.len() {
                            return Ok(());
                        }
                        let g = groups[gi];
                        let read;
                        let blk: &Block = match &cached[gi] {
                            Some(b) => b,
                            None => {
                                read = src.read(g[0].0)?;
                                &read
                            }
                        };
                        for &(_, k, o) in g {
                            // SAFETY: every output slot `o` belongs to exactly one group.
                            unsafe {
                                let (px, lb) = (px, lb);
                                std::ptr::copy_nonoverlapping(
                                    blk.sample(k).as_ptr(),
                                    px.0.add(o * sb),
                                    sb,
                                );
                                *(lb.0 as *mut i64).add(o) = blk.label(k) as i64;
                                for (f, (&fb, fp)) in
                                    field_bytes.iter().zip(&field_ptrs).enumerate()
                                {
                                    std::ptr::copy_nonoverlapping(
                                        blk.field(fields, f, k).as_ptr(),
                                        fp.0.add(o * fb),
                                        fb,
                                    );
                                }
                            }
                        }
                    }
                };
                let hs: Vec<_> = (0..threads.min(groups.len()).max(1))
                    .map(|_| sc.spawn(work))
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().expect("reader thread panicked"))
                    .collect::<prep::Result<Vec<()>>>()
                    .map(|_| ())
            })
        });
        r.map_err(|e| py_err(py, e))?;
        let fields = field_out
            .into_iter()
            .enumerate()
            .map(|(f, v)| self.field_buffer(f, v, Some(n)))
            .collect();
        Ok((
            Buffer::bytes(pixels, self.sample_shape(Some(n)), self.typestr),
            Buffer::labels(labels),
            fields,
        ))
    }

    /// Samples in share `index` of `count` of an epoch (before any damaged block is skipped).
    #[pyo3(signature = (seed, epoch, shuffle, index=0, count=1))]
    fn share_samples(
        &self,
        seed: u64,
        epoch: usize,
        shuffle: bool,
        index: usize,
        count: usize,
    ) -> PyResult<usize> {
        let share = self.share(index, count)?;
        Ok(input::share_samples(
            &self.sizes,
            seed,
            epoch,
            shuffle,
            share,
        ))
    }

    /// The sample indices (file order) in the order share `index` of `count` of an epoch
    /// streams them.
    #[pyo3(signature = (seed, epoch, shuffle, index=0, count=1))]
    fn order(
        &self,
        seed: u64,
        epoch: usize,
        shuffle: bool,
        index: usize,
        count: usize,
    ) -> PyResult<Buffer> {
        let share = self.share(index, count)?;
        let present = vec![true; self.sizes.len()];
        let o = input::share_order(&self.sizes, &present, seed, epoch, shuffle, share);
        Ok(Buffer::labels(o.into_iter().map(|i| i as i64).collect()))
    }

    /// Stream share `index` of `count` of an epoch from batch `start` on.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (batch, shuffle, seed, epoch, index, count, drop_last, start, threads, skip_damaged))]
    fn batches(
        &self,
        batch: usize,
        shuffle: bool,
        seed: u64,
        epoch: usize,
        index: usize,
        count: usize,
        drop_last: bool,
        start: usize,
        threads: Option<usize>,
        skip_damaged: bool,
    ) -> PyResult<NativeBatches> {
        if batch == 0 {
            return Err(PyValueError::new_err("batch_size must be at least 1"));
        }
        let share = self.share(index, count)?;
        let threads = threads.unwrap_or_else(default_threads).max(1);
        let damaged = Arc::new(Mutex::new(Vec::new()));
        let loader = input::epoch_share(
            self.src.clone(),
            EpochPlan {
                batch,
                seed,
                epoch,
                start,
                shuffle,
                keep_partial: !drop_last,
                share,
            },
            if skip_damaged {
                OnDamage::SkipQuietly
            } else {
                OnDamage::Stop
            },
            threads,
            Some(pool(threads)?),
            damaged.clone(),
        );
        Ok(NativeBatches {
            loader: Mutex::new(Some(loader)),
            dims: self.dims.clone(),
            typestr: self.typestr,
            fields: self.fields.clone(),
            damaged,
        })
    }
}

/// The batches of one share of an epoch, decoded ahead on Rust threads (a bounded number of
/// blocks and at most four batches ahead).
#[pyclass(frozen, module = "prep._prep")]
struct NativeBatches {
    loader: Mutex<Option<Loader>>,
    dims: Vec<usize>,
    typestr: &'static str,
    fields: Fields,
    damaged: Arc<Mutex<Vec<String>>>,
}

#[pymethods]
impl NativeBatches {
    /// The next batch: (pixels, labels, fields, index of the batch in its share's epoch), or
    /// None at the end. Waits without the GIL.
    #[allow(clippy::type_complexity)]
    fn next(&self, py: Python<'_>) -> PyResult<Option<(Buffer, Buffer, Vec<Buffer>, usize)>> {
        let got = py.detach(|| {
            let l = self.loader.lock().unwrap();
            l.as_ref().map(|l| (l.rx.recv(), l.recycler()))
        });
        let (got, home) = match got {
            Some((r, home)) => (Some(r), Some(home)),
            None => (None, None),
        };
        let b = match got {
            None | Some(Err(_)) => {
                self.close(py);
                return Ok(None);
            }
            Some(Ok(Err(e))) => {
                self.close(py);
                return Err(py_err(py, e));
            }
            Some(Ok(Ok(b))) => b,
        };
        let n = b.labels.len();
        let shape = std::iter::once(n)
            .chain(self.dims.iter().copied())
            .collect();
        let labels = b.labels.iter().map(|&l| l as i64).collect();
        let fields = self
            .fields
            .iter()
            .zip(b.fields)
            .map(|(f, v)| {
                let shape = std::iter::once(n)
                    .chain(f.shape.iter().map(|&d| d as usize))
                    .collect();
                Buffer::bytes(v, shape, typestr(f.dtype))
            })
            .collect();
        let mut pixels = Buffer::bytes(b.pixels, shape, self.typestr);
        pixels.home = home;
        Ok(Some((pixels, Buffer::labels(labels), fields, b.index)))
    }

    /// Damaged blocks skipped so far (`skip_damaged`), each as its error message.
    fn damaged(&self) -> Vec<String> {
        self.damaged.lock().unwrap().clone()
    }

    /// Stop the reader threads and free what they hold.
    fn close(&self, py: Python<'_>) {
        let l = self.loader.lock().unwrap().take();
        py.detach(move || drop(l));
    }
}

/// The batches `prep train` streams for one epoch of `split` (its `HostFeed` calls
/// `input::epoch` with these arguments: shuffled, the partial batch dropped, stop at damage).
/// For tests: the Python reader's order is checked against it.
#[pyfunction]
fn _prep_train_epoch(
    py: Python<'_>,
    split: &NativeSplit,
    batch: usize,
    seed: u64,
    epoch: usize,
    workers: usize,
) -> PyResult<Vec<(Buffer, Buffer)>> {
    let src = split.src.clone();
    let r: prep::Result<Vec<(Vec<u8>, Vec<u32>)>> = py.detach(|| {
        let loader = input::epoch(
            src,
            batch,
            seed,
            epoch,
            0,
            true,
            OnDamage::Stop,
            workers,
            Arc::new(Mutex::new(Vec::new())),
        );
        loader
            .rx
            .iter()
            .map(|b| b.map(|b| (b.pixels, b.labels)))
            .collect()
    });
    let batches = r.map_err(|e| py_err(py, e))?;
    Ok(batches
        .into_iter()
        .map(|(px, lb)| {
            let n = lb.len();
            (
                Buffer::bytes(px, split.sample_shape(Some(n)), split.typestr),
                Buffer::labels(lb.into_iter().map(|l| l as i64).collect()),
            )
        })
        .collect())
}

/// Ranged reads this process has made from stores, the bytes they brought, and the reads the
/// local block cache served (`prep.store_traffic`).
#[pyfunction]
fn _store_traffic() -> (u64, u64, u64) {
    prep::store::remote::traffic()
}

#[pymodule]
fn _prep(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeDataset>()?;
    m.add_class::<NativeSplit>()?;
    m.add_class::<NativeBatches>()?;
    m.add_class::<Buffer>()?;
    m.add_function(wrap_pyfunction!(_prep_train_epoch, m)?)?;
    m.add_function(wrap_pyfunction!(_store_traffic, m)?)?;
    let py = m.py();
    m.add("DatasetError", py.get_type::<DatasetError>())?;
    m.add("DamagedBlockError", py.get_type::<DamagedBlockError>())?;
    m.add("WINDOW_BLOCKS", input::WINDOW_BLOCKS)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
