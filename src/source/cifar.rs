//! CIFAR-10 and CIFAR-100 binary batches. CIFAR-10: `data_batch_1..5.bin` (train) and
//! `test_batch.bin`, records of 1 label byte + 3072 pixel bytes (3x32x32, already planar).
//! CIFAR-100: `train.bin` and `test.bin`, records of a coarse and a fine label byte + 3072 bytes;
//! the fine label is used.

use super::Reject;
use std::path::{Path, PathBuf};

pub const PIXELS: usize = 3 * 32 * 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Cifar10,
    Cifar100,
}

impl Variant {
    pub fn record(self) -> usize {
        match self {
            Variant::Cifar10 => 1 + PIXELS,
            Variant::Cifar100 => 2 + PIXELS,
        }
    }
    pub fn label_offset(self) -> usize {
        match self {
            Variant::Cifar10 => 0,
            Variant::Cifar100 => 1,
        }
    }
}

/// The variant and the batch files of each split found in `dir`.
pub fn find(dir: &Path) -> Option<(Variant, Vec<PathBuf>, Vec<PathBuf>)> {
    let d = if dir.join("cifar-10-batches-bin").is_dir() {
        dir.join("cifar-10-batches-bin")
    } else if dir.join("cifar-100-binary").is_dir() {
        dir.join("cifar-100-binary")
    } else {
        dir.to_path_buf()
    };
    let mut train: Vec<PathBuf> = (1..=5)
        .map(|i| d.join(format!("data_batch_{i}.bin")))
        .filter(|p| p.is_file())
        .collect();
    if !train.is_empty() {
        let test = d.join("test_batch.bin");
        return Some((
            Variant::Cifar10,
            train,
            if test.is_file() { vec![test] } else { vec![] },
        ));
    }
    if d.join("train.bin").is_file() {
        train.push(d.join("train.bin"));
        let test = d.join("test.bin");
        return Some((
            Variant::Cifar100,
            train,
            if test.is_file() { vec![test] } else { vec![] },
        ));
    }
    None
}

/// Class names from `batches.meta.txt` (CIFAR-10) or `fine_label_names.txt` (CIFAR-100).
pub fn class_names(dir: &Path, v: Variant) -> Option<Vec<String>> {
    let file = match v {
        Variant::Cifar10 => "batches.meta.txt",
        Variant::Cifar100 => "fine_label_names.txt",
    };
    let d = find(dir)
        .and_then(|(_, t, _)| t.first().and_then(|p| p.parent().map(Path::to_path_buf)))?;
    let text =
        crate::store::local::read_text_capped(&d.join(file), 1 << 20, "a class names file").ok()?;
    let names: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    (!names.is_empty()).then_some(names)
}

/// Read one batch file whole (a batch is 30 MB at most), checking it holds whole records.
pub fn read(path: &Path, v: Variant) -> Result<Vec<u8>, Reject> {
    let len = std::fs::metadata(path)
        .map_err(|e| Reject::new(e.to_string()))?
        .len();
    if len == 0 || len % v.record() as u64 != 0 || len > 1 << 32 {
        return Err(Reject::new(format!(
            "{len} bytes is not a whole number of {}-byte CIFAR records (truncated or not a CIFAR batch)",
            v.record()
        )));
    }
    super::read_input(path)
}
