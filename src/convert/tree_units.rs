//! The units of a labelled tree: one per file, DICOM files grouped into series, each unit's split
//! drawn by `split`. Before that, what the DICOM headers say of the tree: class folders that are
//! in fact patient folders, and modalities that should not share one dataset.

use super::file_fields::{FileFields, MaskRule};
use super::split::{self, By, Drawn};
use super::units::{SeriesLabel, SeriesMask, Unit};
use super::*;

/// A name in double quotes, escaped as a JSON string (a newline in it forges no line).
pub(super) fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// "1 file", "3 files".
pub(super) fn count(n: usize, what: &str) -> String {
    // "series" is its own plural.
    let s = if n == 1 || what.ends_with("series") {
        ""
    } else {
        "s"
    };
    format!("{n} {what}{s}")
}

/// Each DICOM file's header (read up to its pixel data), by relative path.
pub(super) type Headers<'t> = BTreeMap<&'t str, dicom::SeriesHeader>;

/// The units of a labelled tree, by split, and what decided the split.
pub(super) struct TreeUnits {
    pub(super) splits: BTreeMap<String, Vec<Unit>>,
    /// The key the DICOM inputs were split by when one key served them all ("PatientID",
    /// "StudyInstanceUID", "SeriesInstanceUID"), "path" when there are none or none had an
    /// identifier, "mixed" otherwise. Other files are split by their path.
    pub(super) split_key: String,
    /// Units split by each key.
    pub(super) split_keys: BTreeMap<String, usize>,
    /// DICOM files that do not fit their series.
    pub(super) rejects: Vec<RejectEntry>,
    pub(super) notes: Vec<String>,
    /// What the draw of train and test gave (None: split folders split the tree).
    pub(super) drawn: Option<Drawn>,
}

/// One unit per file, except DICOM files, which are grouped into series (`source::dicom::series`): a
/// series is one unit. Units keep the order of their first files. DICOM inputs are split by their
/// patient (else study, else series) so that no patient is in both splits, and a volume or video
/// file as a whole; these groups are drawn by `split`'s rule, other files by a hash of their
/// path.
pub(super) fn tree_units(
    o: &ConvertOptions,
    chosen: Vec<(&tree::TreeFile, String)>,
    classes: &[String],
    folders: &tree::SplitFolders,
    with: &BTreeMap<String, Arc<FileFields>>,
    headers: &Headers,
) -> TreeUnits {
    let s = Sorter {
        o,
        classes,
        folders,
        by_folder: matches!(folders, tree::SplitFolders::Splits(_)),
        with,
    };
    let mut made = Made::default();
    let (inputs, at) = file_units(&s, &chosen, headers, &mut made);
    let g = series::group(inputs, &o.decode);
    let (n_series, n_files) = series_units(&s, g.groups, &at, &mut made);
    made.units.sort_by_key(|u| u.0);
    let by_unit = made.units.into_iter().map(|(_, by, u)| (by, u)).collect();
    let (drawn_units, drawn) = split::draw(by_unit, o.test_fraction);
    let mut splits: BTreeMap<String, Vec<Unit>> = BTreeMap::new();
    for (split, unit) in drawn_units {
        splits.entry(split).or_default().push(unit);
    }
    let split_key = match made.dicom_keys.len() {
        0 if s.by_folder => "folders".to_string(),
        0 => "path".to_string(),
        1 => made.dicom_keys.first().expect("one").to_string(),
        _ => "mixed".to_string(),
    };
    let notes = dicom_notes(n_series, n_files, &made.dicom_keys, &g.uneven);
    TreeUnits {
        splits,
        split_key,
        split_keys: made.split_keys,
        rejects: g
            .rejects
            .into_iter()
            .map(|(path, reason)| RejectEntry { path, reason })
            .chain(made.field_rejects)
            .collect(),
        notes,
        drawn,
    }
}

/// What decides a unit's label and split.
struct Sorter<'a> {
    o: &'a ConvertOptions,
    classes: &'a [String],
    folders: &'a tree::SplitFolders,
    /// The tree's own split folders split it.
    by_folder: bool,
    /// Each file's fields, where the plan has fields.
    with: &'a BTreeMap<String, Arc<FileFields>>,
}

impl Sorter<'_> {
    /// The index of class `c` among the sorted classes.
    fn label(&self, c: &str) -> u32 {
        self.classes
            .binary_search_by(|x| x.as_str().cmp(c))
            .expect("class listed") as u32
    }

    /// What decides a unit's split: its split folder (`rel` is its first file), else `by`.
    fn split_by(&self, rel: &str, by: By) -> By {
        if let tree::SplitFolders::Splits(m) = self.folders {
            if let Some(s) = rel.split_once('/').and_then(|(top, _)| m.get(top)) {
                return By::Folder(s.clone());
            }
        }
        by
    }

    /// A unit of one file of class `c`.
    fn file_unit(&self, f: &tree::TreeFile, c: &str) -> Unit {
        Unit::File {
            rel: f.rel.clone(),
            path: f.path.clone(),
            kind: f.kind,
            label: Some(self.label(c)),
            with: self.with.get(&f.rel).cloned(),
        }
    }
}

/// The units made so far, and the keys that split them.
#[derive(Default)]
struct Made {
    /// (position of the first file among the inputs, what decides its split, unit)
    units: Vec<(usize, By, Unit)>,
    split_keys: BTreeMap<String, usize>,
    dicom_keys: std::collections::BTreeSet<&'static str>,
    /// Files of series that cannot carry the plan's fields.
    field_rejects: Vec<RejectEntry>,
}

/// Every DICOM header, read in parallel up to the pixel data.
pub(super) fn read_dicom_headers<'t>(
    o: &ConvertOptions,
    chosen: &[(&'t tree::TreeFile, String)],
) -> Headers<'t> {
    let dicom: Vec<&tree::TreeFile> = chosen
        .iter()
        .filter(|(f, _)| f.kind == Some(FileKind::Dicom))
        .map(|(f, _)| *f)
        .collect();
    let pb = crate::util::progress::bar(dicom.len() as u64, "headers", "files", o.quiet);
    let headers: BTreeMap<&str, dicom::SeriesHeader> = dicom
        .par_iter()
        .filter_map(|f| {
            // Once a signal asked to stop, the rest is skipped (convert_into then stops).
            if crate::util::interrupt::requested().is_some() {
                return None;
            }
            let h = dicom::read_header(&f.path).ok();
            pb.inc(1);
            // A header that cannot be read leaves the file on its own: decoding it says why.
            h.map(|h| (f.rel.as_str(), h))
        })
        .collect();
    pb.finish_and_clear();
    headers
}

/// A unit for each file without a DICOM header; the others are returned as series inputs, with
/// the position of every file among the inputs.
fn file_units<'c>(
    s: &Sorter,
    chosen: &'c [(&tree::TreeFile, String)],
    headers: &Headers,
    made: &mut Made,
) -> (Vec<series::Input>, BTreeMap<&'c str, usize>) {
    let mut at: BTreeMap<&str, usize> = BTreeMap::new();
    let mut inputs = Vec::new();
    for (i, (f, c)) in chosen.iter().enumerate() {
        at.insert(&f.rel, i);
        match headers.get(f.rel.as_str()) {
            Some(h) => inputs.push(series::Input {
                rel: f.rel.clone(),
                path: f.path.clone(),
                class: c.clone(),
                header: h.clone(),
            }),
            None => {
                let key = if s.by_folder { "folders" } else { "path" };
                if f.kind == Some(FileKind::Dicom) {
                    made.dicom_keys.insert(key);
                }
                *made.split_keys.entry(key.into()).or_default() += 1;
                // A volume or a video holds many samples: a group of its own.
                let by = match f.kind {
                    Some(FileKind::Nifti | FileKind::Video) => By::Group {
                        what: "file",
                        key: f.rel.clone(),
                    },
                    _ => By::Path(f.rel.clone()),
                };
                made.units
                    .push((i, s.split_by(&f.rel, by), s.file_unit(f, c)));
            }
        }
    }
    (inputs, at)
}

/// A unit for each group of DICOM files (a series, or a file on its own); returns the series
/// and the files in them.
fn series_units(
    s: &Sorter,
    groups: Vec<series::Group>,
    at: &BTreeMap<&str, usize>,
    made: &mut Made,
) -> (usize, usize) {
    let (mut n_series, mut n_files) = (0, 0);
    for group in groups {
        let key = if s.by_folder {
            "folders"
        } else {
            group.key.name()
        };
        made.dicom_keys.insert(key);
        *made.split_keys.entry(key.into()).or_default() += 1;
        let unit = match group.what {
            series::What::File { rel, path } => Unit::File {
                with: s.with.get(&rel).cloned(),
                rel,
                path,
                kind: Some(FileKind::Dicom),
                label: Some(s.label(&group.class)),
            },
            // A labels CSV's columns label single files; a series is one volume of many.
            series::What::Series(plan)
                if plan
                    .slots
                    .iter()
                    .flatten()
                    .any(|f| s.with.get(&f.rel).is_some_and(|w| w.csv_labels_it())) =>
            {
                for f in plan.slots.iter().flatten() {
                    made.field_rejects.push(RejectEntry {
                        path: f.rel.clone(),
                        reason: format!(
                            "in DICOM series {}, one volume: the labels CSV's label and value columns label single files (convert the series without them)",
                            plan.uid
                        ),
                    });
                }
                continue;
            }
            series::What::Series(plan) => {
                let mask = match series_mask(&plan, s.with) {
                    Ok(m) => m,
                    Err(why) => {
                        for f in plan.slots.iter().flatten() {
                            made.field_rejects.push(RejectEntry {
                                path: f.rel.clone(),
                                reason: why.clone(),
                            });
                        }
                        continue;
                    }
                };
                n_series += 1;
                n_files += plan.files();
                let meta = plan
                    .slots
                    .iter()
                    .flatten()
                    .find_map(|f| s.with.get(&f.rel).and_then(|w| w.meta.clone()));
                Unit::Series {
                    meta,
                    mask,
                    name: format!(
                        "{} (series {}, {} files)",
                        group.first,
                        plan.uid,
                        plan.files()
                    ),
                    probe: plan.probe(&s.o.decode),
                    plan: Arc::new(plan),
                    label: s.label(&group.class),
                }
            }
        };
        let by = By::Group {
            what: match group.key {
                series::SplitKey::Path => "file",
                k => k.name(),
            },
            key: group.key_value,
        };
        made.units
            .push((at[group.first.as_str()], s.split_by(&group.first, by), unit));
    }
    (n_series, n_files)
}

/// Where a series' masks come from, if its files have masks: one label volume for all its
/// files, or a mask image for the first file of every slice. Err: why the series cannot have
/// them (some slices with masks and some without, a volume and images mixed, two volumes).
fn series_mask(
    plan: &series::SeriesPlan,
    with: &BTreeMap<String, Arc<FileFields>>,
) -> std::result::Result<Option<SeriesMask>, String> {
    type Found<'a> = (&'a PathBuf, &'a String, &'a Arc<MaskRule>, bool);
    let masks: Vec<Option<Found>> = plan
        .slots
        .iter()
        .map(|slot| {
            let w = with.get(&slot[0].rel)?;
            let (p, shown, rule) = w.mask.as_ref()?;
            Some((p, shown, rule, w.volume))
        })
        .collect();
    if masks.iter().all(Option::is_none) {
        return Ok(None);
    }
    let Some(all) = masks.iter().copied().collect::<Option<Vec<_>>>() else {
        return Err(format!(
            "in DICOM series {}, some slices have masks and some not: a series' masks are one label volume or an image for every slice",
            plan.uid
        ));
    };
    let (_, shown, rule, volume) = all[0];
    if volume {
        if all.iter().any(|m| !m.3 || m.0 != all[0].0) {
            return Err(format!(
                "in DICOM series {}, label volume {shown} covers only some of its slices (others have their own masks, or another volume)",
                plan.uid
            ));
        }
        return Ok(Some(SeriesMask {
            rule: rule.clone(),
            label: SeriesLabel::Volume(all[0].0.clone(), shown.clone()),
        }));
    }
    if all.iter().any(|m| m.3) {
        return Err(format!(
            "in DICOM series {}, mask images and a label volume are mixed",
            plan.uid
        ));
    }
    Ok(Some(SeriesMask {
        rule: rule.clone(),
        label: SeriesLabel::Stack(all.iter().map(|m| (m.0.clone(), m.1.clone())).collect()),
    }))
}

/// How the DICOM files were grouped and split, and the series converted slice by slice.
fn dicom_notes(
    n_series: usize,
    n_files: usize,
    dicom_keys: &std::collections::BTreeSet<&'static str>,
    uneven: &[String],
) -> Vec<String> {
    let mut notes = Vec::new();
    if n_series > 0 {
        let by: Vec<String> = dicom_keys.iter().map(|k| k.to_string()).collect();
        notes.push(format!(
            "dicom: {} in {}, each one volume; train/test split by {}",
            count(n_files, "file"),
            count(n_series, "series"),
            by.join(", else ")
        ));
    }
    for u in uneven {
        notes.push(format!("{u}; converted slice by slice"));
    }
    notes
}

/// Class folders that are patient folders (PAT001/, PAT002/ as a PACS exports them): every class
/// of the layout holds DICOM files of one PatientID, no two classes share one, and each folder is
/// named by its PatientID. As classes
/// they would put every class wholly in one split; so, unless `--classes folders` asks for them,
/// the tree is one class named after the input, split by patient, and a note says so.
pub(super) fn patient_folders(
    o: &ConvertOptions,
    tree: &tree::Tree,
    chosen: &mut [(&tree::TreeFile, String)],
    headers: &Headers,
    notes: &mut Vec<String>,
) {
    let Some((folders, agree)) = patients_by_folder(chosen, headers) else {
        return;
    };
    let shown: Vec<String> = folders
        .iter()
        .map(|(c, p)| {
            if c == p {
                format!("{}/", tree::shown(c))
            } else {
                format!("{}/ ({})", tree::shown(c), tree::shown(p))
            }
        })
        .collect();
    let shown = super::output::shown_list(&shown);
    if !agree {
        notes.push(format!(
            "warning: every class folder holds the files of one patient ({shown}), so every class is wholly in one split; the folder names are not the PatientIDs, so they stay classes"
        ));
        return;
    }
    if o.folder_classes {
        notes.push(format!(
            "warning: the class folders are patients, each holding the files of one PatientID ({shown}): as --classes folders asks they are the classes, so every class is wholly in one split"
        ));
        return;
    }
    let class = tree.own_name(&o.input);
    for (_, c) in chosen.iter_mut() {
        c.clone_from(&class);
    }
    notes.push(format!(
        "dicom: the folders are patients, not classes ({shown}: each holds the files of one PatientID, no two the same): one class {}, split by patient; --labels or --label-from give classes, --classes folders keeps the folders as classes",
        json_str(&class)
    ));
}

/// Each class with its one PatientID, where every class holds one patient and no two the same,
/// and whether every folder's name agrees with its PatientID (then they are patient folders: see
/// `patient_folders`); None where not, or a file is not DICOM or has no PatientID.
fn patients_by_folder(
    chosen: &[(&tree::TreeFile, String)],
    headers: &Headers,
) -> Option<(Vec<(String, String)>, bool)> {
    let mut ids: BTreeMap<&str, std::collections::BTreeSet<&str>> = BTreeMap::new();
    for (f, c) in chosen {
        if f.kind != Some(FileKind::Dicom) {
            return None;
        }
        ids.entry(c.as_str()).or_default();
        // A header that cannot be read says nothing; decoding the file says why.
        if let Some(h) = headers.get(f.rel.as_str()) {
            ids.get_mut(c.as_str())?.insert(h.patient_id.as_deref()?);
        }
    }
    let distinct: std::collections::BTreeSet<&str> = ids.values().flatten().copied().collect();
    let one_each = ids.values().all(|p| p.len() == 1);
    // The folder's name must agree with its PatientID: class folders of one patient each
    // (ct/, mr/ in a small set) stay classes.
    let agree = ids
        .iter()
        .all(|(c, p)| p.first().is_some_and(|id| names_agree(c, id)));
    (ids.len() >= 2 && one_each && distinct.len() == ids.len()).then(|| {
        let folders = ids
            .into_iter()
            .map(|(c, p)| (c.to_string(), p.first().expect("one").to_string()))
            .collect();
        (folders, agree)
    })
}

/// Whether a folder's name is its PatientID: the same letters and digits (any case, other
/// characters ignored), or one holding the other where the shorter has 3 or more of them and
/// a digit ("Patient_001" and "001", "PAT001" and "pat-001").
fn names_agree(folder: &str, id: &str) -> bool {
    let norm = |s: &str| -> String {
        s.chars()
            .filter(char::is_ascii_alphanumeric)
            .map(|c| c.to_ascii_lowercase())
            .collect()
    };
    let (f, i) = (norm(folder.rsplit('/').next().unwrap_or(folder)), norm(id));
    let (short, long) = if f.len() <= i.len() {
        (&f, &i)
    } else {
        (&i, &f)
    };
    f == i
        || (short.len() >= 3
            && short.chars().any(|c| c.is_ascii_digit())
            && long.contains(short.as_str()))
}

/// DICOM files of several modalities (CT beside MR: Hounsfield units beside arbitrary signal)
/// would share one class and one normalisation: refused, naming each modality with its file
/// count, unless `--mixed-modalities` keeps them (a note says so). Files without a Modality
/// do not make a mix on their own.
pub(super) fn check_modalities(
    o: &ConvertOptions,
    chosen: &[(&tree::TreeFile, String)],
    headers: &Headers,
    notes: &mut Vec<String>,
) -> Result<()> {
    let mut by: BTreeMap<&str, (usize, &str)> = BTreeMap::new();
    let mut without = 0;
    for (f, _) in chosen {
        let Some(h) = headers.get(f.rel.as_str()) else {
            continue;
        };
        match h.modality.as_deref() {
            Some(m) => by.entry(m).or_insert((0, &f.rel)).0 += 1,
            None => without += 1,
        }
    }
    if by.len() < 2 {
        return Ok(());
    }
    let list: Vec<String> = by
        .iter()
        .map(|(m, (n, first))| {
            format!(
                "{} {} (e.g. {})",
                tree::shown(m),
                count(*n, "file"),
                tree::shown(first)
            )
        })
        .collect();
    let none = if without > 0 {
        format!(", and {} without a Modality", count(without, "file"))
    } else {
        String::new()
    };
    if o.mixed_modalities {
        notes.push(format!(
            "dicom: modalities mixed in one dataset, as --mixed-modalities asks: {}{none}",
            list.join(", ")
        ));
        return Ok(());
    }
    Err(Error::Invalid(format!(
        "{}: DICOM files of {} modalities: {}{none}. Their values are in different units (CT in Hounsfield units, MR in arbitrary signal), and one dataset would give them one class and one normalisation: convert each modality on its own (a folder each), or give --mixed-modalities to keep them together",
        tree::shown_path(&o.input),
        by.len(),
        list.join(", ")
    )))
}
