//! The chunked column-major layout (`formats/colmajor.md`): `images_<split>.bin` holds float32 pixels
//! in [0, 1] (u8/u16 sources) or the values themselves (f16/f32 sources), feature-major (what
//! Fortran reads as `data(n_samples, n_features)`), and `labels_<split>.bin` holds int32 labels. Files are written block by block through a memory map
//! whose pages are released as they are written, so a 100 GB file needs no 100 GB of RAM.

mod reader;
mod values;
mod writer;

pub use reader::{chunk_samples, find_splits, looks_like_seed, ColmajorSplitReader, Scan};
pub use values::{encode_exact, encode_scaled, exact_u16, exact_u8, value_of, ScaleError};
pub use writer::ColmajorWriter;

use crate::format::shard::manifest::{check_seal, read_capped, seal, Provenance};
use crate::format::shard::{Block, Dtype, SampleSpec, Stats};
use crate::store::output::{write_atomic, OutFile, Temp};
use crate::util::error::{Error, IoContext, Result};
use memmap2::{MmapMut, MmapOptions};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

pub const FORMAT: &str = "prep-colmajor";
/// Version 2 allows f16/f32 sources (whose values the files hold as they are); writers use the
/// dtype's `format_version`, so u8/u16 manifests stay version 1.
pub const VERSION: u32 = 2;
/// Features handled together when transposing: one cache line of u8 pixels per sample.
const TILE: usize = 64;
/// Bytes written into the map between releases of its pages.
const RELEASE_EVERY: usize = 64 << 20;

pub fn images_name(split: &str) -> String {
    format!("images_{split}.bin")
}
pub fn labels_name(split: &str) -> String {
    format!("labels_{split}.bin")
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColmajorManifest {
    pub format: String,
    pub version: u32,
    /// Shape and dtype of the source pixels (the files hold them as float32 pixel/max, or as the
    /// values themselves for f16/f32).
    pub sample: SampleSpec,
    pub classes: Vec<String>,
    pub mean: Vec<f64>,
    pub std: Vec<f64>,
    pub splits: BTreeMap<String, ColmajorSplit>,
    pub provenance: Provenance,
    pub checksum: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColmajorSplit {
    pub samples: u64,
    pub images: String,
    pub labels: String,
    pub class_counts: Vec<u64>,
}

impl ColmajorManifest {
    pub fn write(&self, dir: &Path) -> Result<()> {
        write_atomic(
            &dir.join(crate::format::shard::manifest::FILE_NAME),
            &seal(self),
        )
    }

    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join(crate::format::shard::manifest::FILE_NAME);
        let bytes = read_capped(&path)?;
        let m: ColmajorManifest = serde_json::from_slice(&bytes)
            .map_err(|e| Error::manifest(&path, format!("not a valid colmajor manifest: {e}")))?;
        if m.format != FORMAT || !(1..=VERSION).contains(&m.version) {
            return Err(Error::manifest(
                &path,
                format!(
                    "format {} v{} is not {FORMAT} v1 to v{VERSION}",
                    m.format, m.version
                ),
            ));
        }
        check_seal(&path, &bytes, &m.checksum)?;
        m.validate().map_err(|what| Error::manifest(&path, what))?;
        Ok(m)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        crate::format::shard::Shape::new(self.sample.shape.0.clone()).map_err(|e| e.to_string())?;
        if self.sample.dtype.format_version() as u32 > self.version {
            return Err(format!(
                "dtype {} needs version {}, the file says {}",
                self.sample.dtype,
                self.sample.dtype.format_version(),
                self.version
            ));
        }
        let k = self.classes.len();
        if k == 0 || k > crate::format::shard::format::MAX_CLASSES as usize {
            return Err(format!("{k} classes is outside 1..=65536"));
        }
        let c = self.sample.shape.channels();
        if self.mean.len() != c || self.std.len() != c {
            return Err("mean/std do not have one value per channel".into());
        }
        for (name, s) in &self.splits {
            if !crate::format::shard::manifest::is_split_name(name) {
                return Err(format!(
                    "split name {name:?} is not a plain name (A-Z a-z 0-9 _ -)"
                ));
            }
            if s.images != images_name(name) || s.labels != labels_name(name) {
                return Err(format!(
                    "split {name}: files must be {} and {}",
                    images_name(name),
                    labels_name(name)
                ));
            }
            if s.class_counts.len() != k
                || crate::format::shard::format::checked_sum(&s.class_counts) != Some(s.samples)
            {
                return Err(format!(
                    "split {name}: class counts do not match {k} classes and {} samples",
                    s.samples
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::values::u8_value;
    use super::*;
    use crate::format::shard::Shape;

    #[test]
    fn exact_u8_takes_exactly_the_values_the_writer_stores() {
        for k in 0..=255u8 {
            let v = u8_value(k);
            assert_eq!(exact_u8(v), Some(k), "{k}");
            // The neighbouring floats are not pixels.
            assert_eq!(
                exact_u8(f32::from_bits(v.to_bits() + 1)),
                None,
                "{k} + 1 ulp"
            );
            if k > 0 {
                assert_eq!(
                    exact_u8(f32::from_bits(v.to_bits() - 1)),
                    None,
                    "{k} - 1 ulp"
                );
            }
            let w = (k as u16 * 257) as f32 / 65535.0;
            assert_eq!(exact_u16(w), Some(k as u16 * 257), "{k} as u16");
        }
        for v in [
            -0.0,
            -1e-45,
            0.5,
            1.0 + f32::EPSILON,
            2.0,
            f32::NAN,
            f32::INFINITY,
        ] {
            assert_eq!(exact_u8(v), None, "{v}");
        }
        assert_eq!(exact_u16(1.0), Some(65535));
        assert_eq!(exact_u16(-0.0), None);
    }

    #[test]
    fn encode_exact_and_scaled_name_the_first_value_they_cannot_store() {
        let mut out = [0u8; 16];
        let v = [0.0, 1.0 / 255.0, 1.0, 0.5];
        assert_eq!(encode_exact(&v, Dtype::U8, &mut out), Err((3, 0.5)));
        assert_eq!(&out[..3], &[0, 1, 255]);
        assert_eq!(encode_exact(&v[..3], Dtype::U8, &mut out), Ok(()));
        assert_eq!(
            encode_exact(&v, Dtype::F16, &mut out),
            Err((1, 1.0 / 255.0))
        );
        assert_eq!(encode_exact(&[0.5, -2.0], Dtype::F16, &mut out), Ok(()));
        assert!(matches!(
            encode_exact(&[1.0, f32::NAN], Dtype::F32, &mut out),
            Err((1, x)) if x.is_nan()
        ));
        assert_eq!(
            encode_scaled(&[0.2, 1.5], Dtype::U8, &mut out),
            Err(ScaleError::OutOfRange(1, 1.5))
        );
        assert_eq!(out[0], 51);
        assert_eq!(
            encode_scaled(&[1e6], Dtype::F16, &mut out),
            Err(ScaleError::TooLarge(0, 1e6))
        );
        assert!(matches!(
            encode_scaled(&[0.0, 0.0, f32::INFINITY], Dtype::F32, &mut out),
            Err(ScaleError::NotFinite(2, _))
        ));
        // u8 -> value -> u8 and u16 -> value -> u16 give back the pixels.
        for k in 0..=255u8 {
            encode_scaled(&[value_of(Dtype::U8, &[k], 0)], Dtype::U8, &mut out).unwrap();
            assert_eq!(out[0], k);
            let p = (k as u16 * 251).to_le_bytes();
            encode_scaled(&[value_of(Dtype::U16, &p, 0)], Dtype::U16, &mut out).unwrap();
            assert_eq!(out[..2], p);
        }
    }

    fn write(dir: &Path, split: &str, n: usize, f: usize) {
        let img: Vec<u8> = (0..n * f)
            .flat_map(|j| {
                // Element (sample i, feature k) at j = k * n + i holds i * 1000 + k.
                let (k, i) = (j / n, j % n);
                ((i * 1000 + k) as f32).to_le_bytes()
            })
            .collect();
        std::fs::write(dir.join(images_name(split)), img).unwrap();
        let l: Vec<u8> = (0..n).flat_map(|i| (i as i32 % 3).to_le_bytes()).collect();
        std::fs::write(dir.join(labels_name(split)), l).unwrap();
    }

    #[test]
    fn chunks_read_back_sample_after_sample_across_releases() {
        let t = tempfile::tempdir().unwrap();
        // 70 features: one whole tile of 64 and part of another.
        let (n, f) = (5000, 70);
        write(t.path(), "train", n, f);
        let shape: Shape = "1x7x10".parse().unwrap();
        let found = find_splits(t.path()).unwrap();
        assert_eq!(found.len(), 1);
        let r = ColmajorSplitReader::open_files(&found[0].1, &found[0].2, &shape).unwrap();
        assert_eq!((r.samples, r.features), (n, f));
        // In order, then out of order (each far chunk drops the pages mapped before).
        let starts: Vec<usize> = (0..n).step_by(333).chain([4000, 7, 2500, 0]).collect();
        for s in starts {
            let m = 333.min(n - s);
            let mut out = vec![0f32; m * f];
            r.read_chunk(s, m, &mut out);
            for i in 0..m {
                for k in 0..f {
                    assert_eq!(out[i * f + k], ((s + i) * 1000 + k) as f32, "{s} {i} {k}");
                }
            }
            let l: Vec<i32> = r.labels(s, m).collect();
            assert_eq!(l, (s..s + m).map(|i| i as i32 % 3).collect::<Vec<_>>());
        }
        assert_eq!(r.check_labels(None).unwrap(), vec![1667, 1667, 1666]);
        let scan = r.scan(&shape).unwrap();
        // Values 0 and 1 are pixels 0 and 255; 2 is not.
        assert_eq!(scan.not_u8.map(|x| (x.0, x.1)), Some((0, 2)));
    }

    #[test]
    fn find_splits_names_a_file_without_its_partner() {
        let t = tempfile::tempdir().unwrap();
        write(t.path(), "train", 4, 3);
        write(t.path(), "test", 2, 3);
        std::fs::write(t.path().join("images_.bin"), b"").unwrap();
        std::fs::write(t.path().join("notes.txt"), b"").unwrap();
        let found = find_splits(t.path()).unwrap();
        let names: Vec<&str> = found.iter().map(|f| f.0.as_str()).collect();
        assert_eq!(names, ["test", "train"]);
        assert!(looks_like_seed(t.path()));
        std::fs::remove_file(t.path().join("images_test.bin")).unwrap();
        let e = find_splits(t.path()).unwrap_err().to_string();
        assert!(
            e.contains("labels_test.bin: no images_test.bin beside it"),
            "{e}"
        );
        assert!(looks_like_seed(t.path()));
        std::fs::remove_file(t.path().join("labels_test.bin")).unwrap();
        std::fs::remove_file(t.path().join("labels_train.bin")).unwrap();
        let e = find_splits(t.path()).unwrap_err().to_string();
        assert!(
            e.contains("images_train.bin: no labels_train.bin beside it"),
            "{e}"
        );
        let empty = tempfile::tempdir().unwrap();
        assert!(!looks_like_seed(empty.path()));
    }

    #[test]
    fn sizes_that_do_not_fit_the_shape_are_usage_errors_naming_both_numbers() {
        let t = tempfile::tempdir().unwrap();
        write(t.path(), "train", 10, 12);
        let (ip, lp) = (
            t.path().join("images_train.bin"),
            t.path().join("labels_train.bin"),
        );
        let open = |s: &str| ColmajorSplitReader::open_files(&ip, &lp, &s.parse().unwrap());
        assert!(open("3x2x2").is_ok());
        // 480 bytes: 5 samples of 1x4x6 (96 bytes) for 10 labels.
        let e = open("1x4x6").err().unwrap();
        assert!(matches!(e, Error::Invalid(_)), "{e}");
        let e = e.to_string();
        assert!(e.contains("10 int32 labels (40 bytes), but"), "{e}");
        assert!(e.contains("holds 5 samples of 1x4x6 (480 bytes)"), "{e}");
        assert!(
            e.contains("make 12 float32 values per sample, not the 24 of 1x4x6"),
            "{e}"
        );
        // 480 bytes is not a whole number of 1x5x5 samples (100 bytes).
        let e = open("1x5x5").err().unwrap();
        assert!(matches!(e, Error::Invalid(_)), "{e}");
        assert!(
            e.to_string()
                .contains("480 bytes, is not a multiple of 100 bytes"),
            "{e}"
        );
        // One label short: the labels are truncated (exit 1, not a usage error).
        let l = std::fs::read(&lp).unwrap();
        std::fs::write(&lp, &l[..36]).unwrap();
        let e = open("3x2x2").err().unwrap();
        assert!(matches!(e, Error::Source(_)), "{e}");
        assert!(
            e.to_string().contains("9 int32 labels (36 bytes), but"),
            "{e}"
        );
    }
}
