//! The training cases: from dataset.json's `training` list, else the files of imagesTr/; each
//! case's image and label files found, and their headers checked against dataset.json (the
//! channel count) and against each other (one grid for all of a case's volumes). A case that
//! does not pass is rejected whole, naming the file at fault.

use super::*;
use crate::source::nifti;
use rayon::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// One file of a case: its path relative to the dataset folder (for reports) and on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaseFile {
    pub rel: String,
    pub path: PathBuf,
}

/// A training case whose headers agree with dataset.json and with each other.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    pub id: String,
    /// nnU-Net's one 3-D file per channel, in channel order; else one file whose volumes (its
    /// 4th axis) are the channels.
    pub images: Vec<CaseFile>,
    pub per_channel: bool,
    pub label: CaseFile,
    /// x, y, z of every volume of the case.
    pub grid: [usize; 3],
    /// Where its voxels lie: its first image file's header (every file of the case agrees).
    pub geometry: crate::source::volume::Geometry,
}

/// What the dataset holds for training.
#[derive(Debug, Default)]
pub struct Found {
    pub cases: Vec<Case>,
    /// (file relative to the dataset folder, why): each a case left out, or a file of imagesTr/
    /// that is no case's.
    pub rejects: Vec<(String, String)>,
    pub notes: Vec<String>,
    /// Cases of imagesTs/ (or of dataset.json's `test` list): they have no labels.
    pub test_cases: usize,
    /// Files looked at: the cases' images and labels, and those rejected on their own.
    pub inputs: usize,
}

/// A case's files before their headers are read.
struct Candidate {
    id: String,
    images: Vec<CaseFile>,
    per_channel: bool,
    label: CaseFile,
}

/// The training cases of the dataset at `root` described by `d`, headers read on every core.
/// An imagesTr/ that cannot be listed is an error; anything about one case is its reject.
pub fn find_cases(root: &Path, d: &Description) -> Result<Found> {
    let mut found = Found::default();
    let candidates = match &d.training {
        Some(list) => listed(root, d, list, &mut found)?,
        None => unlisted(root, d, &mut found)?,
    };
    if let Some(k) = d.num_training {
        let n = candidates.len() + found.rejects.len();
        if k as usize != n {
            let what = if d.training.is_some() {
                "its training list names"
            } else {
                "imagesTr/ holds"
            };
            found.rejects.push((
                DATASET_JSON.into(),
                format!("numTraining is {k}, but {what} {n} cases"),
            ));
        }
    }
    found.inputs +=
        candidates.iter().map(|c| c.images.len() + 1).sum::<usize>() + found.rejects.len();
    let checked: Vec<std::result::Result<Case, (String, String)>> =
        candidates.into_par_iter().map(|c| check(c, d)).collect();
    for c in checked {
        match c {
            Ok(c) => found.cases.push(c),
            Err(r) => found.rejects.push(r),
        }
    }
    found.test_cases = match d.test_listed {
        Some(n) => n,
        None => test_cases(root, d)?,
    };
    Ok(found)
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

fn file(root: &Path, rel: String) -> CaseFile {
    CaseFile {
        path: root.join(&rel),
        rel,
    }
}

/// The cases of dataset.json's `training` list. A listed image that is not there as one file
/// may be nnU-Net's channel files (`x_0000.nii.gz`, ... beside where `x.nii.gz` would be).
fn listed(
    root: &Path,
    d: &Description,
    list: &[Listed],
    found: &mut Found,
) -> Result<Vec<Candidate>> {
    let mut out = Vec::new();
    let mut ids = BTreeSet::new();
    let mut used = BTreeSet::new();
    for l in list {
        let at = l.at;
        let (dir, name) = l.image.rsplit_once('/').unwrap_or(("", &l.image));
        let Some((id, ending)) = split_ending(name, d.ending.as_deref()) else {
            found.rejects.push((
                l.image.clone(),
                format!("listed in dataset.json (training[{at}]) but not a NIfTI file name (.nii.gz, .nii)"),
            ));
            continue;
        };
        if !ids.insert(id.to_string()) {
            found.rejects.push((
                l.image.clone(),
                format!("listed twice in dataset.json's training (training[{at}])"),
            ));
            continue;
        }
        let images = if root.join(&l.image).is_file() {
            Ok((vec![file(root, l.image.clone())], false))
        } else if root.join(join(dir, &channel_name(id, 0, ending))).is_file() {
            channel_files(root, dir, id, ending, d, |c| {
                root.join(join(dir, &channel_name(id, c, ending))).is_file()
            })
            .map(|f| (f, true))
        } else {
            Err((
                l.image.clone(),
                format!(
                    "missing: dataset.json lists it (training[{at}]), and there is no {} (nnU-Net's first channel file) either",
                    channel_name(id, 0, ending)
                ),
            ))
        };
        let (images, per_channel) = match images {
            Ok(i) => i,
            Err(r) => {
                found.rejects.push(r);
                continue;
            }
        };
        used.extend(images.iter().map(|f| f.rel.clone()));
        if !root.join(&l.label).is_file() {
            found.rejects.push((
                l.label.clone(),
                format!(
                    "missing: dataset.json lists it as the label of case {id} (training[{at}])"
                ),
            ));
            continue;
        }
        out.push(Candidate {
            id: id.to_string(),
            images,
            per_channel,
            label: file(root, l.label.clone()),
        });
    }
    // Files of imagesTr/ that no listed case uses are left out, and said.
    let extra: Vec<String> = names(&root.join(IMAGES_TR))?
        .into_iter()
        .map(|n| join(IMAGES_TR, &n))
        .filter(|rel| !used.contains(rel))
        .collect();
    if let Some(first) = extra.first() {
        found.notes.push(format!(
            "msd: {} in imagesTr/ not in dataset.json's training list, left out (e.g. {})",
            count(extra.len(), "file"),
            crate::util::error::shown(first)
        ));
    }
    Ok(out)
}

/// `x_0003.nii.gz`: nnU-Net's file of channel 3 of case x.
fn channel_name(id: &str, c: usize, ending: &str) -> String {
    format!("{id}_{c:04}{ending}")
}

/// The files of channels 0 to C-1 of case `id` in `dir`, where `exists(c)` says whether
/// channel c's file is there: all of them, and no file for channel C.
fn channel_files(
    root: &Path,
    dir: &str,
    id: &str,
    ending: &str,
    d: &Description,
    exists: impl Fn(usize) -> bool,
) -> std::result::Result<Vec<CaseFile>, (String, String)> {
    let n = d.channels.len();
    let rel = |c: usize| join(dir, &channel_name(id, c, ending));
    if let Some(c) = (0..n).find(|&c| !exists(c)) {
        return Err((
            rel(c),
            format!(
                "missing: case {id} needs a file for each of the {} dataset.json names ({}), channel {c} ({}) has none",
                count(n, "channel"),
                d.channels.join(", "),
                d.channels[c]
            ),
        ));
    }
    if exists(n) {
        return Err((
            rel(n),
            format!(
                "a file for channel {n} of case {id}, but dataset.json names {} ({})",
                count(n, "channel"),
                d.channels.join(", ")
            ),
        ));
    }
    Ok((0..n).map(|c| file(root, rel(c))).collect())
}

/// The cases in imagesTr/ when dataset.json lists none: nnU-Net v2 (`channel_names`) has one
/// file per channel (`CASE_0000.nii.gz`), MSD one file per case.
fn unlisted(root: &Path, d: &Description, found: &mut Found) -> Result<Vec<Candidate>> {
    let mut out = Vec::new();
    let ending_name = d.ending.as_deref().unwrap_or(".nii.gz or .nii");
    let label = |id: &str, ending: &str| file(root, join(LABELS_TR, &format!("{id}{ending}")));
    // Case id -> channel -> (file name, ending).
    let mut by_case: BTreeMap<String, BTreeMap<usize, String>> = BTreeMap::new();
    let mut endings: BTreeMap<String, String> = BTreeMap::new();
    for name in names(&root.join(IMAGES_TR))? {
        let rel = join(IMAGES_TR, &name);
        let Some((stem, ending)) = split_ending(&name, d.ending.as_deref()) else {
            found
                .rejects
                .push((rel, format!("not a NIfTI volume ({ending_name})")));
            continue;
        };
        if !d.per_channel_files {
            out.push(Candidate {
                id: stem.to_string(),
                images: vec![file(root, rel)],
                per_channel: false,
                label: label(stem, ending),
            });
            continue;
        }
        match channel_of(stem) {
            Some((id, c)) => {
                by_case.entry(id.to_string()).or_default().insert(c, name.clone());
                endings.insert(id.to_string(), ending.to_string());
            }
            None => found.rejects.push((
                rel,
                format!("not named CASE_XXXX{ending}: nnU-Net's layout (dataset.json's channel_names) has one file per channel, numbered from _0000"),
            )),
        }
    }
    for (id, files) in by_case {
        let ending = &endings[&id];
        let images = channel_files(root, IMAGES_TR, &id, ending, d, |c| files.contains_key(&c));
        // A channel beyond C that is not C itself (a gap) is no file of the case either.
        let stray = files.keys().find(|&&c| c > d.channels.len());
        match (images, stray) {
            (Err(r), _) => found.rejects.push(r),
            (Ok(_), Some(&c)) => found.rejects.push((
                join(IMAGES_TR, &files[&c]),
                format!(
                    "a file for channel {c} of case {id}, but dataset.json names {} ({})",
                    count(d.channels.len(), "channel"),
                    d.channels.join(", ")
                ),
            )),
            (Ok(images), None) => out.push(Candidate {
                label: label(&id, ending),
                id,
                images,
                per_channel: true,
            }),
        }
    }
    // Cases in name order, whichever way they were found.
    out.sort_by(|a, b| a.id.cmp(&b.id));
    let mut kept = Vec::new();
    for c in out {
        if c.label.path.is_file() {
            kept.push(c);
        } else {
            found.rejects.push((
                c.label.rel.clone(),
                format!("missing: the label of case {} ({})", c.id, c.images[0].rel),
            ));
        }
    }
    Ok(kept)
}

/// `x_0003` -> ("x", 3).
pub(super) fn channel_of(stem: &str) -> Option<(&str, usize)> {
    let b = stem.as_bytes();
    let n = b.len();
    if n < 6 || b[n - 5] != b'_' || !b[n - 4..].iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some((&stem[..n - 5], stem[n - 4..].parse().ok()?))
}

/// The names of the regular files (or links to them) in `dir`, sorted; hidden names (`.x`, and
/// the `._x` files macOS leaves in archives of the Decathlon) left out.
fn names(dir: &Path) -> Result<Vec<String>> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut out = Vec::new();
    for e in rd {
        let e = e.map_err(|e| Error::io(dir, e))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && e.path().is_file() {
            out.push(name);
        }
    }
    out.sort();
    Ok(out)
}

/// Cases in imagesTs/: nnU-Net's distinct case ids of its channel files, else its volumes.
fn test_cases(root: &Path, d: &Description) -> Result<usize> {
    let dir = root.join(IMAGES_TS);
    if !dir.is_dir() {
        return Ok(0);
    }
    let mut ids = BTreeSet::new();
    for n in names(&dir)? {
        if let Some((stem, _)) = split_ending(&n, d.ending.as_deref()) {
            let id = match channel_of(stem) {
                Some((id, _)) if d.per_channel_files => id,
                _ => stem,
            };
            ids.insert(id.to_string());
        }
    }
    Ok(ids.len())
}

/// Read a candidate's headers: the label one 3-D volume; the images C volumes in one file or
/// one in each; every volume on the label's grid.
fn check(c: Candidate, d: &Description) -> std::result::Result<Case, (String, String)> {
    let head = |f: &CaseFile| nifti::grid(&f.path).map_err(|r| (f.rel.clone(), r.0));
    let lg = head(&c.label)?;
    if lg.volumes != 1 {
        return Err((
            c.label.rel.clone(),
            format!("is {}: a label is one 3-D volume", lg.shown()),
        ));
    }
    let n = d.channels.len();
    for f in &c.images {
        let g = head(f)?;
        if c.per_channel && g.volumes != 1 {
            return Err((
                f.rel.clone(),
                format!(
                    "is {}: in nnU-Net's layout each channel file is one 3-D volume",
                    g.shown()
                ),
            ));
        }
        if !c.per_channel && g.volumes != n {
            return Err((
                f.rel.clone(),
                format!(
                    "is {}: {} along its 4th axis, but dataset.json names {} ({})",
                    g.shown(),
                    count(g.volumes, "volume"),
                    count(n, "channel"),
                    d.channels.join(", ")
                ),
            ));
        }
        if g.dims != lg.dims {
            return Err((
                f.rel.clone(),
                format!(
                    "is {}, its label {} is {}: a case's volumes must share one grid",
                    g.shown(),
                    c.label.rel,
                    lg.shown()
                ),
            ));
        }
    }
    let geometry = head(&c.images[0])?.geometry;
    if let Some(why) = crate::source::volume::disagree(&geometry, &lg.geometry) {
        return Err((
            c.label.rel.clone(),
            format!(
                "{why} of its image {}: a label must lie on its image's voxels",
                c.images[0].rel
            ),
        ));
    }
    Ok(Case {
        id: c.id,
        images: c.images,
        per_channel: c.per_channel,
        label: c.label,
        grid: lg.dims,
        geometry,
    })
}

/// "1 file", "3 files".
pub(super) fn count(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}
