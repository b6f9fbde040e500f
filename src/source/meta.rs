//! Per-sample metadata files: JSON lines, one object of strings, numbers, booleans or nulls per
//! sample (`meta_train.jsonl` beside `x_train.npy` + `y_train.npy`). The file is memory-mapped
//! and only its line offsets are kept (8 bytes a sample), so a file of any length converts in
//! bounded memory; every line is parsed once when planning (its keys, its size) and again when
//! its sample is written.

use super::Reject;
use crate::format::fields::{Field, MAX_META_BYTES, MAX_NAMES};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// The metadata file that goes with a labels array: `labels` -> `meta`, `y_`/`Y_` -> `meta_`,
/// with the extension `.jsonl` (`y_train.npy` -> `meta_train.jsonl`, `labels.npy` ->
/// `meta.jsonl`).
pub fn beside(labels: &Path) -> PathBuf {
    let name = labels
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let stem = name.strip_suffix(".npy").unwrap_or(&name);
    let meta = if let Some(rest) = stem.strip_prefix("y_").or_else(|| stem.strip_prefix("Y_")) {
        format!("meta_{rest}")
    } else {
        stem.replace("labels", "meta")
    };
    labels.with_file_name(format!("{meta}.jsonl"))
}

/// A metadata file: where each sample's line starts, the keys its lines use (in the order first
/// seen) and the largest line as compact JSON.
pub struct MetaLines {
    pub path: PathBuf,
    map: memmap2::Mmap,
    /// Start of every line, and the end of the last.
    starts: Vec<usize>,
    pub keys: Vec<String>,
    pub bytes: usize,
}

impl MetaLines {
    pub fn len(&self) -> usize {
        self.starts.len() - 1
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Line `i` as an object (checked when the file was read).
    pub fn get(&self, i: usize) -> Result<Map<String, Value>, Reject> {
        parse(&self.map[self.starts[i]..self.starts[i + 1]])
            .map_err(|why| Reject::new(format!("line {}: {why}", i + 1)))
    }

    /// Sample `i`'s bytes of `field` (a metadata field declaring every key of this file).
    pub fn encode(&self, i: usize, field: &Field) -> Result<Vec<u8>, Reject> {
        field
            .encode_meta(&self.get(i)?)
            .map_err(|why| Reject::new(format!("{} line {}: {why}", self.path.display(), i + 1)))
    }
}

/// One line's object: JSON, an object, of flat values.
fn parse(line: &[u8]) -> Result<Map<String, Value>, String> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let obj: Map<String, Value> =
        serde_json::from_slice(line).map_err(|e| format!("not a JSON object of metadata: {e}"))?;
    if let Some((k, _)) = obj
        .iter()
        .find(|(_, v)| matches!(v, Value::Array(_) | Value::Object(_)))
    {
        return Err(format!(
            "{k:?} holds a list or an object; metadata values are strings, numbers, booleans or null"
        ));
    }
    Ok(obj)
}

/// Read the metadata of `n` samples from `path`: one line a sample (a last empty line allowed).
pub fn read(path: &Path, n: usize) -> Result<MetaLines, Reject> {
    let f = super::open_input(path)?;
    // SAFETY: read only; a file changed under the conversion gives wrong metadata or a parse
    // error, never memory unsafety beyond what any mmap reader accepts.
    let map =
        unsafe { memmap2::Mmap::map(&f) }.map_err(|e| Reject::new(format!("cannot map: {e}")))?;
    let mut starts = vec![0usize];
    let mut keys: Vec<String> = Vec::new();
    let mut bytes = 2;
    let mut at = 0;
    while at < map.len() {
        let end = map[at..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(map.len(), |p| at + p + 1);
        let line = starts.len();
        if line > n {
            return Err(Reject::new(format!(
                "has more lines than the {n} samples of its images"
            )));
        }
        let obj = parse(&map[at..end]).map_err(|why| Reject::new(format!("line {line}: {why}")))?;
        for k in obj.keys() {
            if !keys.iter().any(|x| x == k) {
                if keys.len() == MAX_NAMES {
                    return Err(Reject::new(format!(
                        "line {line}: more than {MAX_NAMES} different keys"
                    )));
                }
                keys.push(k.clone());
            }
        }
        let size = serde_json::to_vec(&obj).map_or(usize::MAX, |v| v.len());
        if size > MAX_META_BYTES {
            return Err(Reject::new(format!(
                "line {line}: {size} bytes of metadata, over the {MAX_META_BYTES} a sample may have"
            )));
        }
        bytes = bytes.max(size);
        starts.push(end);
        at = end;
    }
    if starts.len() - 1 != n {
        return Err(Reject::new(format!(
            "has {} lines of metadata for the {n} samples of its images",
            starts.len() - 1
        )));
    }
    Ok(MetaLines {
        path: path.to_path_buf(),
        map,
        starts,
        keys,
        bytes,
    })
}

/// The keys of the metadata `prep convert --meta` gives the samples of a tree's files.
pub const FILE_KEYS: [&str; 12] = [
    "source",
    "frame",
    "time",
    "slice",
    "t",
    "patient",
    "study",
    "series",
    "modality",
    "spacing_x",
    "spacing_y",
    "spacing_z",
];

/// Longest patient or series identifier kept (DICOM's LO and UI values are at most 64).
const ID_CHARS: usize = 64;

/// Bytes of a `FILE_KEYS` metadata field whose longest source path is `source` bytes as JSON:
/// the path, and room for every other key at its longest (numbers of 24 characters, identifiers
/// of 64 written out in full: patient, study, series, modality).
pub fn file_bytes(source: usize) -> usize {
    let keys: usize = FILE_KEYS.iter().map(|k| k.len() + 4).sum();
    (2 + keys + source + 4 * (6 * ID_CHARS + 2) + 7 * 24).min(MAX_META_BYTES)
}

/// What a file says of each image it gives: its own facts (source path, patient, series, voxel
/// size), and where the `k`-th image comes from (a page or frame number, a video frame's time, a
/// volume's slice).
pub struct FileFacts {
    fixed: Map<String, Value>,
    per: PerImage,
}

enum PerImage {
    Frame,
    Video {
        rate: Option<f64>,
    },
    Slice,
    /// A time series of volumes, `per` slices each, every `every`th time point kept: image k is
    /// slice k % per of time point (k / per) x every.
    TimeSlice {
        per: usize,
        every: usize,
    },
}

impl FileFacts {
    /// The facts of `path` (shown as `rel`), as far as its header gives them: a header that
    /// cannot be read leaves them out (decoding then says why the file is refused).
    pub fn of(
        kind: super::FileKind,
        path: &Path,
        rel: &str,
        opts: &super::DecodeOptions,
    ) -> FileFacts {
        use super::FileKind;
        let mut fixed = Map::new();
        fixed.insert("source".into(), rel.into());
        let mut spacing = |xyz: [Option<f64>; 3]| {
            for (k, v) in ["spacing_x", "spacing_y", "spacing_z"].iter().zip(xyz) {
                if let Some(v) = v.and_then(serde_json::Number::from_f64) {
                    fixed.insert(k.to_string(), Value::Number(v));
                }
            }
        };
        let per = match kind {
            FileKind::Video => PerImage::Video {
                rate: super::video::frame_rate(path),
            },
            FileKind::Nifti => {
                // The voxel size of the volume as it is cut: oriented, resampled.
                let grid = super::nifti::grid(path).ok();
                let g = grid
                    .as_ref()
                    .and_then(|g| g.geometry.target(opts.orientation, opts.spacing).ok());
                spacing(g.map_or([None; 3], |g| g.spacing));
                let time = grid
                    .as_ref()
                    .map(|gr| super::nifti::fourth_axis(gr, opts.fourth));
                match (time, g) {
                    (Some(super::nifti::Fourth::Time(_)), Some(g)) => PerImage::TimeSlice {
                        per: g.dims[opts.axis.min(2)].max(1),
                        every: opts.every.max(1) as usize,
                    },
                    _ => PerImage::Slice,
                }
            }
            FileKind::Dicom => {
                let h = super::dicom::read_header(path).ok();
                if let Some(h) = &h {
                    let ps = h.pixel_spacing;
                    spacing([ps.map(|p| p[1]), ps.map(|p| p[0]), None]);
                }
                let h = h.unwrap_or_default();
                Self::ids(&mut fixed, &h);
                PerImage::Slice
            }
            FileKind::Image | FileKind::Tiff => PerImage::Frame,
        };
        FileFacts { fixed, per }
    }

    /// A DICOM series read as one volume: its first file's facts, slices numbered in order.
    /// `spacing`: the voxel size of the series' volume as it is cut (oriented, resampled).
    pub fn of_series(rel: &str, h: &super::dicom::SeriesHeader, spacing: [Option<f64>; 3]) -> Self {
        let mut fixed = Map::new();
        fixed.insert("source".into(), rel.into());
        Self::ids(&mut fixed, h);
        for (k, v) in ["spacing_x", "spacing_y", "spacing_z"].iter().zip(spacing) {
            if let Some(v) = v.and_then(serde_json::Number::from_f64) {
                fixed.insert(k.to_string(), Value::Number(v));
            }
        }
        FileFacts {
            fixed,
            per: PerImage::Slice,
        }
    }

    /// A DICOM header's patient, study, series and modality, where it gives them.
    fn ids(fixed: &mut Map<String, Value>, h: &super::dicom::SeriesHeader) {
        for (k, v) in [
            ("patient", &h.patient_id),
            ("study", &h.study_uid),
            ("series", &h.series_uid),
            ("modality", &h.modality),
        ] {
            if let Some(v) = v {
                fixed.insert(
                    k.into(),
                    v.chars().take(ID_CHARS).collect::<String>().into(),
                );
            }
        }
    }

    /// The metadata of the `k`-th image of the file.
    pub fn image(&self, k: usize, opts: &super::DecodeOptions) -> Map<String, Value> {
        let mut m = self.fixed.clone();
        match self.per {
            PerImage::Frame => {
                m.insert("frame".into(), k.into());
            }
            PerImage::Slice => {
                m.insert("slice".into(), k.into());
            }
            PerImage::TimeSlice { per, every } => {
                m.insert("t".into(), (k / per * every).into());
                m.insert("slice".into(), (k % per).into());
            }
            PerImage::Video { rate } => {
                let (frame, time) = super::video::frame_at(k, opts, rate);
                if let Some(f) = frame {
                    m.insert("frame".into(), f.into());
                }
                if let Some(t) = time.and_then(serde_json::Number::from_f64) {
                    m.insert("time".into(), Value::Number(t));
                }
            }
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_beside_the_labels() {
        for (l, m) in [
            ("d/y_train.npy", "d/meta_train.jsonl"),
            ("d/Y_test.npy", "d/meta_test.jsonl"),
            ("d/train_labels.npy", "d/train_meta.jsonl"),
            ("d/labels_val.npy", "d/meta_val.jsonl"),
            ("d/labels.npy", "d/meta.jsonl"),
        ] {
            assert_eq!(beside(Path::new(l)), Path::new(m));
        }
    }

    #[test]
    fn lines_are_counted_checked_and_read_back() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("m.jsonl");
        std::fs::write(
            &p,
            "{\"patient\": \"a\", \"slice\": 3}\r\n{\"slice\": 4, \"t\": 0.5}\n",
        )
        .unwrap();
        let m = read(&p, 2).unwrap();
        assert_eq!(m.keys, ["patient", "slice", "t"]);
        assert_eq!(m.bytes, r#"{"patient":"a","slice":3}"#.len());
        assert_eq!(m.get(1).unwrap()["t"], 0.5);
        let f = Field::meta("meta", m.keys.clone(), m.bytes);
        let v = m.encode(0, &f).unwrap();
        assert_eq!(f.decode_meta(&v).unwrap(), m.get(0).unwrap());
        let e = read(&p, 3).err().unwrap().0;
        assert!(e.contains("2 lines") && e.contains("3 samples"), "{e}");
        let e = read(&p, 1).err().unwrap().0;
        assert!(e.contains("more lines"), "{e}");
        for (text, want) in [
            ("{\"a\": 1}\n[1]\n", "line 2: not a JSON object"),
            ("{\"a\": 1}\n{\"a\": [1]}\n", "line 2: \"a\" holds a list"),
            ("{\"a\": 1}\n\n", "line 2: not a JSON object"),
        ] {
            std::fs::write(&p, text).unwrap();
            let e = read(&p, 2).err().unwrap().0;
            assert!(e.contains(want), "{text:?}: {e}");
        }
        std::fs::write(&p, format!("{{\"a\": \"{}\"}}\n", "x".repeat(5000))).unwrap();
        assert!(read(&p, 1).err().unwrap().0.contains("over the 4096"));
    }
}
