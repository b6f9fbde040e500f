//! Scans with label volumes in the Medical Segmentation Decathlon (MSD) and nnU-Net layouts
//! (`formats/msd.md`): a folder holding `dataset.json`, `imagesTr/`, `labelsTr/` and maybe
//! `imagesTs/`. Here `dataset.json` is read (the channel and label names, the training cases it
//! lists); `cases` finds each training case's files and checks their headers against it and
//! against each other; `decode` turns one case into samples, each slice along the axis one
//! sample of C channels with its label slice as the mask.
//!
//! A case's images come in one of two conventions: MSD's one file per case whose 4th axis holds
//! the channels (a 3-D file for one channel), or nnU-Net's one 3-D file per channel,
//! `CASE_0000.nii.gz`, `CASE_0001.nii.gz`, ... Its label is `labelsTr/CASE.nii.gz` in both.

mod cases;
mod decode;

pub use cases::{find_cases, Case, CaseFile, Found};
pub use decode::{decode_case, CaseOptions, Samples};

use crate::util::error::{shown_path, Error, Result};
use serde_json::{Map, Value};
use std::path::Path;

pub const DATASET_JSON: &str = "dataset.json";
pub const IMAGES_TR: &str = "imagesTr";
pub const LABELS_TR: &str = "labelsTr";
pub const IMAGES_TS: &str = "imagesTs";
/// dataset.json is read whole; a real one, case list and all, is well under a MiB.
pub const MAX_JSON_BYTES: u64 = 16 << 20;
/// A sample's channel count is a byte.
pub const MAX_CHANNELS: usize = 255;

/// Whether `dir` looks like such a dataset: dataset.json beside an imagesTr/ folder.
pub fn detect(dir: &Path) -> bool {
    dir.join(DATASET_JSON).is_file() && dir.join(IMAGES_TR).is_dir()
}

/// What dataset.json says, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Description {
    /// Channel names in channel order (`modality`, or nnU-Net v2's `channel_names`).
    pub channels: Vec<String>,
    /// Label names in value order: value `v` of a label volume is `labels[v]`.
    pub labels: Vec<String>,
    /// `file_ending` (nnU-Net v2): ".nii.gz" or ".nii"; None: either.
    pub ending: Option<String>,
    /// The `training` list (MSD, nnU-Net v1); None: the cases are the files of imagesTr/.
    pub training: Option<Vec<Listed>>,
    /// nnU-Net v2 (`channel_names`): unlisted cases have one file per channel.
    pub per_channel_files: bool,
    pub num_training: Option<u64>,
    /// Entries of the `test` list, where there is one.
    pub test_listed: Option<usize>,
}

/// One entry of the `training` list: paths relative to the dataset folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub image: String,
    pub label: String,
    /// Its index in the list, for messages (`training[3]`).
    pub at: usize,
}

/// Read and check `root/dataset.json`; an error names the file.
pub fn read_description(root: &Path) -> Result<Description> {
    let path = root.join(DATASET_JSON);
    let bytes = crate::store::local::read_capped(&path, MAX_JSON_BYTES, "dataset.json")?;
    let bad = |why: String| Error::Source(format!("{}: {why}", shown_path(&path)));
    let v: Value = serde_json::from_slice(&bytes).map_err(|e| bad(format!("not JSON: {e}")))?;
    describe(&v).map_err(bad)
}

/// The description in a parsed dataset.json; the error is the reason.
pub fn describe(v: &Value) -> std::result::Result<Description, String> {
    let o = v
        .as_object()
        .ok_or_else(|| format!("expected a JSON object, found {}", what(v)))?;
    let channels = channels(o)?;
    let labels = match o.get("labels") {
        None => return Err("no \"labels\" (the names of the label values)".into()),
        Some(l) => labels(l)?,
    };
    let ending = match o.get("file_ending") {
        None => None,
        Some(Value::String(e)) if is_nifti_ending(e) => Some(e.to_ascii_lowercase()),
        Some(e) => {
            return Err(format!(
                "file_ending {e}: prep reads NIfTI volumes (\".nii.gz\" or \".nii\") only"
            ))
        }
    };
    let training = match o.get("training") {
        None => None,
        Some(t) => Some(training(t)?),
    };
    let test_listed = match o.get("test") {
        Some(Value::Array(a)) => Some(a.len()),
        _ => None,
    };
    Ok(Description {
        channels,
        labels,
        ending,
        training,
        per_channel_files: o.contains_key("channel_names"),
        num_training: o.get("numTraining").and_then(Value::as_u64),
        test_listed,
    })
}

fn is_nifti_ending(e: &str) -> bool {
    matches!(e.to_ascii_lowercase().as_str(), ".nii.gz" | ".nii")
}

/// A JSON value's kind, for messages.
fn what(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `channel_names` (nnU-Net v2) or `modality` (MSD, nnU-Net v1): `{"0": "FLAIR", ...}`. Where
/// both are given they must agree.
fn channels(o: &Map<String, Value>) -> std::result::Result<Vec<String>, String> {
    let v2 = o.get("channel_names").map(|v| by_index(v, "channel_names"));
    let v1 = o.get("modality").map(|v| by_index(v, "modality"));
    let names = match (v2, v1) {
        (None, None) => {
            return Err(
                "no \"modality\" or \"channel_names\" (the names of the image channels)".into(),
            )
        }
        (Some(a), Some(b)) => {
            let (a, b) = (a?, b?);
            if a != b {
                return Err(format!(
                    "\"channel_names\" {a:?} and \"modality\" {b:?} disagree"
                ));
            }
            a
        }
        (Some(a), None) | (None, Some(a)) => a?,
    };
    if names.len() > MAX_CHANNELS {
        return Err(format!(
            "{} channels, more than the {MAX_CHANNELS} a sample holds",
            names.len()
        ));
    }
    Ok(names)
}

/// `{"0": "a", "1": "b"}`: names by index, every index from 0 once.
fn by_index(v: &Value, key: &str) -> std::result::Result<Vec<String>, String> {
    let o = v.as_object().ok_or_else(|| {
        format!(
            "\"{key}\" is {}, expected an object of index: name",
            what(v)
        )
    })?;
    if o.is_empty() {
        return Err(format!("\"{key}\" names nothing"));
    }
    let n = o.len();
    let mut names: Vec<Option<String>> = vec![None; n];
    for (k, name) in o {
        let i = k
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|&i| i < n)
            .ok_or_else(|| {
                format!(
                    "\"{key}\" has the key {k:?}: its keys must be the indices 0 to {}",
                    n - 1
                )
            })?;
        let name = name.as_str().ok_or_else(|| {
            format!(
                "\"{key}\" {k:?} is {}, expected a name (a string)",
                what(name)
            )
        })?;
        if names[i].is_some() {
            return Err(format!("\"{key}\" names index {i} twice"));
        }
        names[i] = Some(name.to_string());
    }
    Ok(names
        .into_iter()
        .map(|n| n.expect("each index once"))
        .collect())
}

/// `labels`: MSD's `{"0": "background", "1": "edema"}` or nnU-Net v2's inverted
/// `{"background": 0, "edema": 1}`; values from 0, each once. nnU-Net's regions (a name for a
/// list of values) are refused: they overlap, and a mask holds one value per pixel.
fn labels(v: &Value) -> std::result::Result<Vec<String>, String> {
    let o = v.as_object().ok_or_else(|| {
        format!(
            "\"labels\" is {}, expected an object of value: name (or name: value)",
            what(v)
        )
    })?;
    if o.values().all(Value::is_string) {
        return by_index(v, "labels");
    }
    if o.values().any(Value::is_string) {
        return Err(
            "\"labels\" mixes MSD's {\"1\": \"name\"} and nnU-Net's {\"name\": 1}: use one".into(),
        );
    }
    if let Some((name, region)) = o.iter().find(|(_, v)| v.is_array()) {
        return Err(format!(
            "\"labels\": {name:?} is a region ({region}): region-based labels overlap, and a mask holds one value per pixel; give each label one value (\"background\": 0, \"{name}\": 1, ...)"
        ));
    }
    let n = o.len();
    let mut names: Vec<Option<String>> = vec![None; n];
    for (name, value) in o {
        let i = value
            .as_u64()
            .filter(|&i| (i as usize) < n)
            .ok_or_else(|| {
                format!(
                    "\"labels\": {name:?} has the value {value}: values must be the integers 0 to {}, each once",
                    n - 1
                )
            })? as usize;
        if let Some(other) = &names[i] {
            return Err(format!(
                "\"labels\": {other:?} and {name:?} both have the value {i}"
            ));
        }
        names[i] = Some(name.clone());
    }
    Ok(names
        .into_iter()
        .map(|n| n.expect("each value once"))
        .collect())
}

/// `training`: `[{"image": "./imagesTr/x.nii.gz", "label": "./labelsTr/x.nii.gz"}, ...]`.
fn training(v: &Value) -> std::result::Result<Vec<Listed>, String> {
    let a = v
        .as_array()
        .ok_or_else(|| format!("\"training\" is {}, expected an array", what(v)))?;
    let mut out = Vec::with_capacity(a.len());
    for (at, e) in a.iter().enumerate() {
        let path = |key: &str| -> std::result::Result<String, String> {
            let s = e.get(key).and_then(Value::as_str).ok_or_else(|| {
                format!("training[{at}] has no \"{key}\" path (expected {{\"image\": ..., \"label\": ...}})")
            })?;
            relative(s).map_err(|why| format!("training[{at}] {key} {s:?}: {why}"))
        };
        out.push(Listed {
            image: path("image")?,
            label: path("label")?,
            at,
        });
    }
    Ok(out)
}

/// A path of dataset.json as a relative path with `/` separators ("./imagesTr/x.nii.gz" is
/// "imagesTr/x.nii.gz"); absolute paths and `..` are refused: a case lies inside the dataset.
pub fn relative(s: &str) -> std::result::Result<String, String> {
    if s.starts_with('/') || s.contains('\\') || s.contains('\0') {
        return Err("not a relative path with / separators".into());
    }
    let parts: Vec<&str> = s
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.contains(&"..") {
        return Err("climbs out of the dataset folder with ..".into());
    }
    if parts.is_empty() {
        return Err("names no file".into());
    }
    Ok(parts.join("/"))
}

/// The case id and ending of a file name: `x.nii.gz` -> ("x", ".nii.gz"), where the name ends
/// with `ending` (either NIfTI ending when None).
pub fn split_ending<'a>(name: &'a str, ending: Option<&str>) -> Option<(&'a str, &'a str)> {
    let lower = name.to_ascii_lowercase();
    let ends: &[&str] = match ending {
        Some(".nii") => &[".nii"],
        Some(_) => &[".nii.gz"],
        None => &[".nii.gz", ".nii"],
    };
    ends.iter().find_map(|e| {
        (lower.ends_with(e) && name.len() > e.len()).then(|| name.split_at(name.len() - e.len()))
    })
}

#[cfg(test)]
mod tests;
