//! A tree of files: how it is labelled (class folders, a labels CSV or a regex), its split folders,
//! and its units (DICOM files grouped into series).

use super::tree_fields;
use super::tree_units::{check_modalities, patient_folders, read_dicom_headers, tree_units};
pub(super) use super::tree_units::{count, json_str};
use super::units::{Plan, TreeSplit};
use super::*;

/// How the files of a tree get their classes.
pub(super) enum Labelling {
    /// From the layout: class sub-folders, or one class for a flat folder or a single file.
    Layout,
    Csv(tree::LabelsCsv),
    Regex(tree::LabelRegex),
}

pub(super) fn labelling(o: &ConvertOptions) -> Result<Labelling> {
    if o.folder_classes && (o.labels.is_some() || o.label_from.is_some()) {
        return Err(Error::Invalid(
            "--classes folders takes the classes from the folders, --labels and --label-from from elsewhere; give one".into(),
        ));
    }
    Ok(match (&o.labels, &o.label_from) {
        (Some(_), Some(_)) => {
            return Err(Error::Invalid(
                "--labels and --label-from both say how files are labelled; give one".into(),
            ))
        }
        (Some(p), None) => {
            Labelling::Csv(tree::read_labels_csv(p, &o.values).map_err(Error::Invalid)?)
        }
        (None, Some(re)) => Labelling::Regex(tree::LabelRegex::new(re).map_err(Error::Invalid)?),
        (None, None) if !o.values.is_empty() => {
            return Err(Error::Invalid(
                "--values names columns of the labels CSV: give it with --labels FILE.csv".into(),
            ))
        }
        (None, None) => Labelling::Layout,
    })
}

/// A tree of files: which are usable, their classes and splits, their fields, and its units.
pub(super) fn plan_tree(o: &ConvertOptions, kind: Kind) -> Result<Plan> {
    let masks = tree_fields::mask_source(o)?;
    // A dataset laid out as images/ beside masks/: the tree is its images folder.
    let in_images;
    let (o, dataset) = match &masks {
        Some(
            m @ tree_fields::MaskSource {
                layout: Some((ds, _)),
                ..
            },
        ) => {
            in_images = ConvertOptions {
                input: m.images.clone(),
                ..o.clone()
            };
            (&in_images, Some(ds))
        }
        _ => (o, None),
    };
    let mut tree = tree::walk(&o.input)?;
    if let Some(ds) = dataset {
        tree.named = Some(tree::Tree::own_name(&tree, ds));
    }
    if let Some(m) = &masks {
        tree_fields::leave_out_masks(&mut tree, &m.masks);
    }
    let mut labelling = labelling(o)?;
    if let (Some(_), Labelling::Csv(m)) = (dataset, &mut labelling) {
        tree_fields::csv_below_images(m, &tree.root);
    }
    let mut rejects = Vec::new();
    let mut notes = Vec::new();
    let usable = usable_files(&tree, &labelling, kind, &mut rejects);
    reject_special_entries(&tree, &labelling, &mut rejects, &mut notes);
    let masked = masks.is_some();
    let (chosen, folders) = label_files(
        o,
        &tree,
        &labelling,
        (usable, masked),
        &mut rejects,
        &mut notes,
    )?;
    let csv = match &labelling {
        Labelling::Csv(m) => Some(m),
        _ => None,
    };
    let mut mask_rejects = Vec::new();
    let (mut chosen, fields, with) = tree_fields::attach(
        o,
        masks.as_ref(),
        csv,
        chosen,
        &mut rejects,
        &mut mask_rejects,
        &mut notes,
    )?;
    note_splits(o, &labelling, &chosen, &folders, &mut notes)?;
    let headers = read_dicom_headers(o, &chosen);
    check_modalities(o, &chosen, &headers, &mut notes)?;
    if matches!(labelling, Labelling::Layout) {
        patient_folders(o, &tree, &mut chosen, &headers, &mut notes);
    }
    let classes = sorted_classes(o, &chosen, &rejects)?;
    let kind = found_kind(kind, &chosen);
    let inputs = chosen.len() + rejects.len() + mask_rejects.len();
    let tu = tree_units(o, chosen, &classes, &folders, &with, &headers);
    rejects.extend(tu.rejects);
    notes.extend(tu.notes);
    let mut plan = Plan {
        fields,
        kind,
        classes,
        splits: tu.splits,
        native: None,
        rejects,
        inputs,
        root: tree.root.clone(),
        notes,
        split_key: Some(TreeSplit {
            key: tu.split_key,
            keys: tu.split_keys,
            folders: match folders {
                tree::SplitFolders::Splits(m) => m,
                _ => BTreeMap::new(),
            },
        }),
        stored: None,
        drawn: tu.drawn,
    };
    if let Some(ds) = dataset {
        tree_fields::from_dataset_folder(&mut plan, ds);
    }
    plan.rejects.extend(mask_rejects);
    Ok(plan)
}

/// A file of the input that is not part of the dataset, with the reason.
fn reject(rejects: &mut Vec<RejectEntry>, path: &str, reason: String) {
    rejects.push(RejectEntry {
        path: path.to_string(),
        reason,
    })
}

/// The files this run decodes; the others are rejected with their kind.
fn usable_files<'t>(
    tree: &'t tree::Tree,
    labelling: &Labelling,
    kind: Kind,
    rejects: &mut Vec<RejectEntry>,
) -> Vec<&'t tree::TreeFile> {
    let accepts = |k: FileKind| match kind {
        Kind::Images => matches!(k, FileKind::Image | FileKind::Tiff),
        Kind::Tiff => k == FileKind::Tiff,
        Kind::Video => k == FileKind::Video,
        Kind::Dicom => k == FileKind::Dicom,
        Kind::Nifti => k == FileKind::Nifti,
        _ => true,
    };
    // Files of a kind this run decodes; with a CSV, only the files it lists are part of the
    // dataset (anything else in the folder is left alone, not reported).
    let mut usable = Vec::new();
    for f in &tree.files {
        if let Labelling::Csv(m) = labelling {
            if !m.rows.contains_key(&f.rel) {
                continue;
            }
        }
        match f.kind {
            None => reject(
                rejects,
                &f.rel,
                "not an image, video or scan file (unknown extension)".into(),
            ),
            Some(k) if !accepts(k) => reject(
                rejects,
                &f.rel,
                format!("is a {} file, not {kind:?}", k.name()).to_lowercase(),
            ),
            Some(_) => usable.push(f),
        }
    }
    usable
}

/// Dangling links and FIFOs or devices are rejected; links to folders get a note.
fn reject_special_entries(
    tree: &tree::Tree,
    labelling: &Labelling,
    rejects: &mut Vec<RejectEntry>,
    notes: &mut Vec<String>,
) {
    // Links that point to nothing are bad inputs (with a CSV, only where it lists them: as
    // missing, below); links to folders are not followed, which a note says.
    if !matches!(labelling, Labelling::Csv(_)) {
        for rel in &tree.dangling {
            reject(
                rejects,
                rel,
                "a symbolic link to nothing (a missing target, or a loop)".into(),
            );
        }
    }
    // Never opened: a FIFO would block the read, a device never end it.
    for (rel, what) in &tree.special {
        reject(rejects, rel, format!("is {what}, not a regular file"));
    }
    if let Some(first) = tree.folder_links.first() {
        let n = tree.folder_links.len();
        notes.push(format!(
            "{n} symbolic link{} to folders not followed (e.g. {})",
            if n == 1 { "" } else { "s" },
            tree::shown(first)
        ));
    }
}

/// Each usable file with its class, and the splits its top folders may give.
fn label_files<'t>(
    o: &ConvertOptions,
    tree: &tree::Tree,
    labelling: &Labelling,
    (usable, masked): (Vec<&'t tree::TreeFile>, bool),
    rejects: &mut Vec<RejectEntry>,
    notes: &mut Vec<String>,
) -> Result<(Vec<(&'t tree::TreeFile, String)>, tree::SplitFolders)> {
    let (chosen, mut folders) = match labelling {
        Labelling::Csv(m) => {
            if !m.has_class {
                notes.push(format!(
                    "one class {}: {} has no label or class column",
                    json_str(&tree.own_name(&o.input)),
                    tree::shown_path(o.labels.as_deref().unwrap_or(Path::new("")))
                ));
            }
            (
                csv_classes(o, tree, m, usable, rejects),
                tree::SplitFolders::None,
            )
        }
        Labelling::Regex(re) => (regex_classes(re, usable, rejects), tree::SplitFolders::None),
        Labelling::Layout => layout_classes(o, tree, usable, masked, notes)?,
    };
    // Labels from a CSV or a regex: split folders at the top still keep their splits.
    if !matches!(labelling, Labelling::Layout) {
        let loose = chosen.iter().any(|(f, _)| f.top_folder().is_none());
        folders = split_folders(o, chosen.iter().filter_map(|(f, _)| f.top_folder()), loose)?;
    }
    Ok((chosen, folders))
}

/// Classes from the labels CSV; rows that name no file of the tree are rejected.
fn csv_classes<'t>(
    o: &ConvertOptions,
    tree: &tree::Tree,
    m: &tree::LabelsCsv,
    usable: Vec<&'t tree::TreeFile>,
    rejects: &mut Vec<RejectEntry>,
) -> Vec<(&'t tree::TreeFile, String)> {
    // Without a class column, every file is one class named after the input.
    let one = (!m.has_class).then(|| tree.own_name(&o.input));
    let mut chosen = Vec::new();
    chosen.extend(usable.into_iter().map(|f| {
        let label = &m.rows[&f.rel].label;
        (f, one.clone().unwrap_or_else(|| label.clone()))
    }));
    // Rows that name no file of the tree: missing, or not walked (hidden, behind a
    // link to a folder, not a regular file), or outside it.
    let csv = o
        .labels
        .as_deref()
        .map(tree::shown_path)
        .unwrap_or_default();
    let walked: std::collections::BTreeSet<&str> =
        tree.files.iter().map(|f| f.rel.as_str()).collect();
    for (rel, row) in &m.rows {
        if !walked.contains(rel.as_str()) {
            let why = if tree.root.join(rel).exists() {
                "not read (hidden, inside a linked folder, or not a regular file)"
            } else {
                "missing"
            };
            reject(
                rejects,
                rel,
                format!("listed in {csv} line {} but {why}", row.line),
            );
        }
    }
    for (raw, why) in m.outside.iter().chain(&m.bad) {
        reject(rejects, raw, why.clone());
    }
    chosen
}

/// Classes from `--label-from`; a path it does not match is rejected.
fn regex_classes<'t>(
    re: &tree::LabelRegex,
    usable: Vec<&'t tree::TreeFile>,
    rejects: &mut Vec<RejectEntry>,
) -> Vec<(&'t tree::TreeFile, String)> {
    let mut chosen = Vec::new();
    for f in usable {
        match re.class_of(&f.rel) {
            Ok(c) => chosen.push((f, c)),
            Err(why) => reject(rejects, &f.rel, why),
        }
    }
    chosen
}

/// Classes from the layout: one class for a flat folder, else class sub-folders, below split
/// folders where the top folders are splits (images with masks may stand directly in their
/// split folders: one class).
fn layout_classes<'t>(
    o: &ConvertOptions,
    tree: &tree::Tree,
    usable: Vec<&'t tree::TreeFile>,
    masked: bool,
    notes: &mut Vec<String>,
) -> Result<(Vec<(&'t tree::TreeFile, String)>, tree::SplitFolders)> {
    let mut chosen: Vec<(&tree::TreeFile, String)> = Vec::new();
    let mut folders = tree::SplitFolders::None;
    let (loose, nested): (Vec<_>, Vec<_>) =
        usable.into_iter().partition(|f| f.top_folder().is_none());
    refuse_loose_and_nested(o, &loose, &nested)?;
    if !loose.is_empty() {
        // A flat folder (or one file): everything is one class, named after it.
        let class = tree.own_name(&o.input);
        notes.push(if tree.single {
            format!("one class {}: a single file", json_str(&class))
        } else {
            format!(
                "one class {}: {} directly in {} (class sub-folders, --labels or --label-from give more classes)",
                json_str(&class),
                count(loose.len(), "file"),
                tree::shown_path(&o.input)
            )
        });
        chosen.extend(loose.into_iter().map(|f| (f, class.clone())));
    } else {
        folders = split_folders(o, nested.iter().filter_map(|f| f.top_folder()), false)?;
        if folders == tree::SplitFolders::None {
            chosen.extend(nested.into_iter().filter_map(|f| {
                let c = f.top_folder()?.to_string();
                Some((f, c))
            }));
        } else if masked && nested.iter().all(|f| !below_top(f).contains('/')) {
            let class = tree.own_name(&o.input);
            notes.push(format!(
                "one class {}: the images stand directly in their split folders",
                json_str(&class)
            ));
            chosen.extend(nested.into_iter().map(|f| (f, class.clone())));
        } else {
            chosen = classes_below_splits(o, nested)?;
        }
    }
    Ok((chosen, folders))
}

/// A file's path below its top folder.
fn below_top(f: &tree::TreeFile) -> &str {
    f.rel.split_once('/').map_or("", |(_, r)| r)
}

/// Files directly in the folder and files in sub-folders leave the classes unclear.
fn refuse_loose_and_nested(
    o: &ConvertOptions,
    loose: &[&tree::TreeFile],
    nested: &[&tree::TreeFile],
) -> Result<()> {
    if let (Some(a), Some(b)) = (loose.first(), nested.first()) {
        let folders: std::collections::BTreeSet<_> =
            nested.iter().filter_map(|f| f.top_folder()).collect();
        return Err(Error::Invalid(format!(
            "{}: {} directly in the folder (e.g. {}) and {} in {} (e.g. {}/), so the classes are unclear; move the loose files into class sub-folders, convert one sub-folder on its own, or label every file with --labels FILE.csv or --label-from REGEX",
            tree::shown_path(&o.input),
            count(loose.len(), "file"),
            tree::shown(&a.rel),
            nested.len(),
            count(folders.len(), "sub-folder"),
            tree::shown(b.top_folder().unwrap_or_default())
        )));
    }
    Ok(())
}

/// split/class/file: the class is the folder below the split's.
fn classes_below_splits<'t>(
    o: &ConvertOptions,
    nested: Vec<&'t tree::TreeFile>,
) -> Result<Vec<(&'t tree::TreeFile, String)>> {
    let mut chosen = Vec::new();
    for f in nested {
        let below = f.rel.split_once('/').and_then(|(_, r)| r.split_once('/'));
        match below {
            Some((class, _)) => chosen.push((f, class.to_string())),
            None => {
                let top = f.top_folder().unwrap_or_default();
                return Err(Error::Invalid(format!(
                    "{}: {} stands directly in the split folder {}/, whose files need class sub-folders ({}/CLASS/...); move it into one, or label every file with --labels FILE.csv or --label-from REGEX",
                    tree::shown_path(&o.input),
                    tree::shown(&f.rel),
                    tree::shown(top),
                    tree::shown(top)
                )));
            }
        }
    }
    Ok(chosen)
}

/// A note on how the split folders split the tree (refusing --test-fraction where they do).
fn note_splits(
    o: &ConvertOptions,
    labelling: &Labelling,
    chosen: &[(&tree::TreeFile, String)],
    folders: &tree::SplitFolders,
    notes: &mut Vec<String>,
) -> Result<()> {
    match folders {
        tree::SplitFolders::Splits(m) => {
            if o.test_fraction_given {
                return Err(Error::Invalid(format!(
                    "--test-fraction {}: {} keeps its own splits in the folders {}, so none is drawn by hash; leave --test-fraction out (or convert the training folder alone to split it by hash)",
                    o.test_fraction,
                    tree::shown_path(&o.input),
                    m.keys().map(|k| format!("{}/", tree::shown(k))).collect::<Vec<_>>().join(", ")
                )));
            }
            let each: Vec<String> = m
                .iter()
                .map(|(folder, split)| {
                    if folder == split {
                        format!("{}/", tree::shown(folder))
                    } else {
                        format!("{}/ -> {split}", tree::shown(folder))
                    }
                })
                .collect();
            notes.push(format!(
                "splits from folders: {} (prep train evaluates on the test split, prep eval reads it by default); no split drawn by hash",
                each.join(", ")
            ));
        }
        tree::SplitFolders::TrainOnly(t) => notes.push(format!(
            "{}/ is the only folder: its sub-folders are the classes, and the test split is drawn from it by a hash of each path (--test-fraction {})",
            tree::shown(t),
            o.test_fraction
        )),
        tree::SplitFolders::None => {
            let named: Vec<&str> = chosen
                .iter()
                .filter_map(|(f, _)| f.top_folder())
                .filter(|t| {
                    let l = t.to_ascii_lowercase();
                    l == tree::TRAIN_FOLDER || tree::HELD_OUT_FOLDERS.contains(&l.as_str())
                })
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            if !named.is_empty() && matches!(labelling, Labelling::Layout) {
                notes.push(format!(
                    "{} named like split folders, but not every top folder is one: each top folder is a class, and the test split is drawn by hash",
                    named.iter().map(|t| format!("{}/", tree::shown(t))).collect::<Vec<_>>().join(" and ")
                ));
            }
        }
    }
    Ok(())
}

/// The classes, sorted; none at all means no usable input.
fn sorted_classes(
    o: &ConvertOptions,
    chosen: &[(&tree::TreeFile, String)],
    rejects: &[RejectEntry],
) -> Result<Vec<String>> {
    let classes: Vec<String> = {
        let mut c: Vec<String> = chosen.iter().map(|(_, c)| c.clone()).collect();
        c.sort();
        c.dedup();
        c
    };
    if classes.is_empty() {
        let example = rejects
            .first()
            .map(|r| format!(", e.g. {}: {}", tree::shown(&r.path), r.reason))
            .unwrap_or_default();
        return Err(Error::Invalid(format!(
            "{}: found no usable input files ({} rejected{example})",
            tree::shown_path(&o.input),
            rejects.len(),
        )));
    }
    Ok(classes)
}

/// The kind it turned out to be, for the report: one kind of file, or a folder of images.
fn found_kind(kind: Kind, chosen: &[(&tree::TreeFile, String)]) -> Kind {
    match kind {
        Kind::Auto => {
            let mut kinds = chosen.iter().filter_map(|(f, _)| f.kind);
            match kinds.next() {
                Some(first) if kinds.all(|k| k == first) => match first {
                    FileKind::Image => Kind::Images,
                    FileKind::Tiff => Kind::Tiff,
                    FileKind::Video => Kind::Video,
                    FileKind::Dicom => Kind::Dicom,
                    FileKind::Nifti => Kind::Nifti,
                },
                _ => Kind::Images,
            }
        }
        k => k,
    }
}

/// `tree::split_folders`, its error naming the input.
pub(super) fn split_folders<'a>(
    o: &ConvertOptions,
    tops: impl IntoIterator<Item = &'a str>,
    loose: bool,
) -> Result<tree::SplitFolders> {
    tree::split_folders(tops, loose)
        .map_err(|e| Error::Invalid(format!("{}: {e}", tree::shown_path(&o.input))))
}
