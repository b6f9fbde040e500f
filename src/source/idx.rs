//! IDX files (MNIST, Fashion-MNIST, EMNIST...), plain or gzipped: `train-images-idx3-ubyte[.gz]`,
//! `train-labels-idx1-ubyte[.gz]`, and `t10k-*` for the test split.

use super::Reject;
use std::io::Read;
use std::path::{Path, PathBuf};

/// A decoded IDX array: dims and u8 data.
#[derive(Debug)]
pub struct Idx {
    pub dims: Vec<usize>,
    pub data: Vec<u8>,
}

/// Largest IDX array we load (IDX datasets are small; this bounds a hostile header).
const MAX_BYTES: usize = 8 << 30;

pub fn read(path: &Path) -> Result<Idx, Reject> {
    let f = super::open_input(path)?;
    let mut head = [0u8; 2];
    let gz = {
        use std::io::{Seek, SeekFrom};
        let mut f2 = &f;
        let n = f2.read(&mut head).map_err(|e| Reject::new(e.to_string()))?;
        f2.seek(SeekFrom::Start(0))
            .map_err(|e| Reject::new(e.to_string()))?;
        n == 2 && head == [0x1f, 0x8b]
    };
    let mut r: Box<dyn Read> = if gz {
        Box::new(flate2::read::GzDecoder::new(std::io::BufReader::new(f)))
    } else {
        Box::new(std::io::BufReader::new(f))
    };
    let mut magic = [0u8; 4];
    r.read_exact(&mut magic)
        .map_err(|_| Reject::new("truncated: no IDX header"))?;
    if magic[0] != 0 || magic[1] != 0 {
        return Err(Reject::new("not an IDX file (bad magic)"));
    }
    if magic[2] != 0x08 {
        return Err(Reject::new(format!(
            "IDX element type 0x{:02x} is not supported (only unsigned bytes, 0x08)",
            magic[2]
        )));
    }
    let nd = magic[3] as usize;
    if nd == 0 || nd > 4 {
        return Err(Reject::new(format!(
            "IDX with {nd} dimensions is not supported"
        )));
    }
    let mut dims = Vec::with_capacity(nd);
    for _ in 0..nd {
        let mut d = [0u8; 4];
        r.read_exact(&mut d)
            .map_err(|_| Reject::new("truncated IDX header"))?;
        dims.push(u32::from_be_bytes(d) as usize);
    }
    let n = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= MAX_BYTES)
        .ok_or_else(|| Reject::new(format!("absurd IDX dimensions {dims:?}")))?;
    let mut data = Vec::new();
    // Read at most one byte more than declared, to detect both truncation and trailing garbage.
    r.take(n as u64 + 1)
        .read_to_end(&mut data)
        .map_err(|e| Reject::new(format!("cannot read data: {e}")))?;
    if data.len() != n {
        return Err(Reject::new(format!(
            "IDX data is {} bytes, the header says {n}",
            data.len()
        )));
    }
    Ok(Idx { dims, data })
}

/// The (images, labels) files of a split in `dir`, if present: `train` or `t10k`/`test` names.
pub fn find(dir: &Path, split: &str) -> Option<(PathBuf, PathBuf)> {
    let prefixes: &[&str] = if split == "train" {
        &["train"]
    } else {
        &["t10k", "test"]
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    let pick = |what: &str| {
        files
            .iter()
            .find(|p| {
                let n = p
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .to_ascii_lowercase();
                prefixes.iter().any(|pre| n.starts_with(pre))
                    && n.contains(what)
                    && n.contains("idx")
            })
            .cloned()
    };
    Some((pick("images")?, pick("labels")?))
}

/// Is this directory an IDX dataset?
pub fn detect(dir: &Path) -> bool {
    dir.is_dir() && find(dir, "train").is_some()
}

/// Fashion-MNIST's ten classes, in label order (Zalando's README).
pub const FASHION_MNIST: [&str; 10] = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
];

/// Class names of a known IDX dataset: IDX files do not say them, so Fashion-MNIST (a folder
/// whose name holds "fashion", as Zalando's repository and Debian's package have it) of
/// `classes` <= 10 gets its ten names; others (MNIST's digits) keep 0, 1, 2...
pub fn class_names(dir: &Path, classes: usize) -> Option<Vec<String>> {
    let full = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let fashion = full.components().any(|c| {
        c.as_os_str()
            .to_string_lossy()
            .to_ascii_lowercase()
            .contains("fashion")
    });
    (fashion && classes <= 10).then(|| FASHION_MNIST.iter().map(|s| s.to_string()).collect())
}
