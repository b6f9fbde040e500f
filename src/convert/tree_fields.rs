//! What the files of a tree carry beside their images: a mask each (`--masks DIR`, or a dataset
//! laid out as `images/` beside `masks/` or `labels/`), paired by relative path and stem, and the
//! labels and values of a labels CSV's other columns. Declared here when the tree is planned,
//! read file by file as it is decoded (`file_fields`), and the mask's value names settled from
//! the values seen once everything is written.
//!
//! A tree's mask field is planned with an empty shape (it is the target's, decided later: a
//! mask is brought to the target with its image by `fit_mask`) and, without `--mask-names`,
//! empty names: `fill` gives it every value of its dtype while blocks are written, and
//! `settle_mask_names` keeps "0".."max" of the values seen (block headers carry only sizes; the
//! names live in the manifest), so masks are decoded once.

use super::file_fields::{FileFields, MaskRule};
use super::units::{Plan, Unit};
use super::*;
use crate::format::fields::FieldKind;
use crate::source::mask;

/// Where a tree's masks are.
pub(super) struct MaskSource {
    /// The folder of images, which is walked as the tree.
    pub(super) images: PathBuf,
    pub(super) masks: PathBuf,
    /// Found from the input's layout (no `--masks`): the input folder around both, and its
    /// other entries.
    pub(super) layout: Option<(PathBuf, Vec<String>)>,
}

impl MaskSource {
    /// A mask as reports name it: relative to the folder reports start from (the input with
    /// `--masks` inside it, the dataset folder of a layout), else its absolute path.
    fn shown(&self, rel: &str) -> String {
        let base = match &self.layout {
            Some((ds, _)) => ds.clone(),
            None => self.images.clone(),
        };
        let full = self.masks.join(rel);
        let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        match abs(&full).strip_prefix(abs(&base)) {
            Ok(r) => r.to_string_lossy().into_owned(),
            Err(_) => abs(&full).to_string_lossy().into_owned(),
        }
    }
}

/// `--masks DIR`, else the `images/` + `masks/` layout of the input, else none.
pub(super) fn mask_source(o: &ConvertOptions) -> Result<Option<MaskSource>> {
    if let Some(m) = &o.masks {
        if !m.is_dir() {
            return Err(Error::Invalid(format!(
                "--masks {}: not a folder",
                tree::shown_path(m)
            )));
        }
        return Ok(Some(MaskSource {
            images: o.input.clone(),
            masks: m.clone(),
            layout: None,
        }));
    }
    if !o.input.is_dir() {
        return Ok(None);
    }
    Ok(
        tree::mask_layout(&o.input).map(|(images, masks, others)| MaskSource {
            images,
            masks,
            layout: Some((o.input.clone(), others)),
        }),
    )
}

/// With `--masks` inside the input, the masks are not images of the tree.
pub(super) fn leave_out_masks(tree: &mut tree::Tree, masks: &Path) {
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let Ok(inside) = canon(masks)
        .strip_prefix(canon(&tree.root))
        .map(Path::to_path_buf)
    else {
        return;
    };
    let prefix = format!("{}/", inside.to_string_lossy());
    if prefix == "/" {
        return;
    }
    let keep = |rel: &str| !rel.starts_with(&prefix);
    tree.files.retain(|f| keep(&f.rel));
    tree.folder_links.retain(|r| keep(r));
    tree.dangling.retain(|r| keep(r));
    tree.special.retain(|(r, _)| keep(r));
}

/// A plan of the images folder of a dataset laid out as images/ beside masks/ names its files
/// from the dataset folder, as its masks are named.
pub(super) fn from_dataset_folder(plan: &mut Plan, ds: &Path) {
    let images = plan
        .root
        .file_name()
        .map(tree::name_text)
        .unwrap_or_default();
    let from_ds = |rel: &mut String| *rel = format!("{images}/{rel}");
    for u in plan.splits.values_mut().flatten() {
        if let Unit::File { rel, .. } = u {
            from_ds(rel);
        }
    }
    plan.rejects.iter_mut().for_each(|r| from_ds(&mut r.path));
    plan.root = ds.to_path_buf();
}

/// A labels CSV of a dataset laid out as images/ beside masks/ may name its files from the
/// dataset folder (`images/train/x.jpg`) rather than from `images/`: where every row does, the
/// prefix is dropped.
pub(super) fn csv_below_images(m: &mut tree::LabelsCsv, images: &Path) {
    let prefix = format!(
        "{}/",
        images.file_name().map(tree::name_text).unwrap_or_default()
    );
    let all = m
        .rows
        .keys()
        .chain(m.bad.iter().map(|(k, _)| k))
        .all(|k| k.starts_with(&prefix));
    if !all || (m.rows.is_empty() && m.bad.is_empty()) {
        return;
    }
    let cut = |k: &str| k[prefix.len()..].to_string();
    m.rows = std::mem::take(&mut m.rows)
        .into_iter()
        .map(|(k, r)| (cut(&k), r))
        .collect();
    for (k, _) in &mut m.bad {
        *k = cut(k);
    }
}

/// A tree's fields: its mask (every image paired with its mask, images without one and masks
/// without an image rejected), and its labels CSV's labels and values. Returns the files kept
/// with their classes, the fields, and each kept file's field bytes (empty without fields).
/// Images without masks go to `rejects`, masks without images to `mask_rejects` (named as
/// `MaskSource::shown` names them).
#[allow(clippy::type_complexity)]
pub(super) fn attach<'t>(
    o: &ConvertOptions,
    ms: Option<&MaskSource>,
    csv: Option<&tree::LabelsCsv>,
    chosen: Vec<(&'t tree::TreeFile, String)>,
    rejects: &mut Vec<RejectEntry>,
    mask_rejects: &mut Vec<RejectEntry>,
    notes: &mut Vec<String>,
) -> Result<(
    Vec<(&'t tree::TreeFile, String)>,
    Fields,
    BTreeMap<String, Arc<FileFields>>,
)> {
    if o.mask_names.is_some() && ms.is_none() {
        return Err(Error::Invalid(format!(
            "--mask-names names mask values, but {} has no masks (give --masks DIR, or lay it out as images/ beside masks/)",
            tree::shown_path(&o.input)
        )));
    }
    let mut fields = Vec::new();
    let mut chosen = chosen;
    let mut paired: BTreeMap<&str, (PathBuf, String, bool)> = BTreeMap::new();
    let mut rule = None;
    if let Some(ms) = ms {
        if o.part.is_some() && o.mask_names.is_none() {
            return Err(Error::Invalid(format!(
                "{}: with --part, masks need --mask-names: each part would otherwise name the mask values it saw, and the parts would not merge",
                tree::shown_path(&o.input)
            )));
        }
        let (kept, by) = pair(ms, chosen, rejects, mask_rejects, notes)?;
        chosen = kept;
        paired = by;
        let wide = paired.par_iter().any(|(_, (p, _, _))| mask::wide(p));
        let names = o.mask_names.clone();
        let dtype = if wide || names.as_ref().is_some_and(|n| n.len() > 256) {
            Dtype::U16
        } else {
            Dtype::U8
        };
        let r = Arc::new(MaskRule {
            dtype,
            names: names.as_ref().map(Vec::len),
        });
        rule = Some(r);
        // Shape and (without --mask-names) names come later: see the module's notes.
        fields.push(Field {
            name: "mask".into(),
            kind: FieldKind::Mask,
            dtype,
            shape: vec![],
            names: names.unwrap_or_default(),
        });
    }
    let csv = csv.filter(|c| !c.labels.is_empty() || !c.values.is_empty());
    if let Some(c) = csv {
        if !c.labels.is_empty() {
            fields.push(Field::labels("labels", c.labels.clone()));
        }
        if !c.values.is_empty() {
            fields.push(Field::values("values", c.values.clone()));
        }
    }
    let meta = o.meta.then(|| {
        let longest = chosen
            .iter()
            .map(|(f, _)| serde_json::to_string(&f.rel).map_or(0, |s| s.len()))
            .max()
            .unwrap_or(0);
        let keys = crate::source::meta::FILE_KEYS.map(String::from).to_vec();
        Field::meta("meta", keys, crate::source::meta::file_bytes(longest))
    });
    fields.extend(meta.clone());
    let mut per_file = BTreeMap::new();
    if !fields.is_empty() {
        for (f, _) in &chosen {
            let pair = paired.get(f.rel.as_str());
            let volume = pair.is_some_and(|p| p.2);
            let mask = pair
                .zip(rule.as_ref())
                .map(|((p, shown, _), r)| (p.clone(), shown.clone(), r.clone()));
            let csv = csv.map_or_else(Box::default, |c| c.rows[&f.rel].fields.clone());
            let meta = meta.clone();
            per_file.insert(
                f.rel.clone(),
                Arc::new(FileFields {
                    mask,
                    volume,
                    csv,
                    meta,
                }),
            );
        }
    }
    Ok((chosen, Fields(fields), per_file))
}

/// Each image with the mask of its relative path and stem, in the masks folder.
#[allow(clippy::type_complexity)]
fn pair<'t>(
    ms: &MaskSource,
    chosen: Vec<(&'t tree::TreeFile, String)>,
    rejects: &mut Vec<RejectEntry>,
    mask_rejects: &mut Vec<RejectEntry>,
    notes: &mut Vec<String>,
) -> Result<(
    Vec<(&'t tree::TreeFile, String)>,
    BTreeMap<&'t str, (PathBuf, String, bool)>,
)> {
    let mt = tree::walk(&ms.masks)?;
    let mut by_stem: BTreeMap<&str, Vec<&tree::TreeFile>> = BTreeMap::new();
    // Label volumes of DICOM series, by the series folder they are named after.
    let mut volumes: BTreeMap<&str, &tree::TreeFile> = BTreeMap::new();
    let mut not_images = 0;
    for m in &mt.files {
        match m.kind {
            Some(FileKind::Image | FileKind::Tiff) => {
                by_stem.entry(tree::stem_key(&m.rel)).or_default().push(m)
            }
            Some(FileKind::Nifti) => {
                volumes.insert(volume_key(&m.rel), m);
            }
            _ => not_images += 1,
        }
    }
    let mut used = std::collections::BTreeSet::new();
    let mut used_volumes = std::collections::BTreeSet::new();
    let mut kept = Vec::new();
    let mut paired = BTreeMap::new();
    for (f, c) in chosen {
        let dicom = f.kind == Some(FileKind::Dicom);
        if !dicom && !matches!(f.kind, Some(FileKind::Image | FileKind::Tiff)) {
            rejects.push(RejectEntry {
                path: f.rel.clone(),
                reason: format!(
                    "masks pair with images (PNG, JPEG, BMP, GIF, WebP, TIFF) and DICOM files; this is a {} file",
                    f.kind.map_or("other", FileKind::name)
                ),
            });
            continue;
        }
        let key = tree::stem_key(&f.rel);
        // A DICOM slice without a mask image of its own takes its folder's label volume.
        let folder = f.rel.rfind('/').map_or("", |i| &f.rel[..i]);
        match by_stem.get(key).map(Vec::as_slice) {
            None if dicom && volumes.contains_key(folder) => {
                let m = volumes[folder];
                used_volumes.insert(folder);
                paired.insert(f.rel.as_str(), (m.path.clone(), ms.shown(&m.rel), true));
                kept.push((f, c));
            }
            Some([m]) => {
                used.insert(key);
                paired.insert(f.rel.as_str(), (m.path.clone(), ms.shown(&m.rel), false));
                kept.push((f, c));
            }
            Some(several) => {
                used.insert(key);
                let names: Vec<String> = several.iter().map(|m| ms.shown(&m.rel)).collect();
                rejects.push(RejectEntry {
                    path: f.rel.clone(),
                    reason: format!(
                        "{} masks pair with it: {}; keep one",
                        names.len(),
                        names.join(", ")
                    ),
                });
            }
            None => rejects.push(RejectEntry {
                path: f.rel.clone(),
                reason: if dicom {
                    format!(
                        "no mask: nothing named {}.* in {}, and no label volume {}.nii(.gz) for its series folder",
                        ms.shown(key),
                        tree::shown_path(&ms.masks),
                        ms.shown(if folder.is_empty() { "." } else { folder })
                    )
                } else {
                    format!(
                        "no mask: nothing named {}.* in {}",
                        ms.shown(key),
                        tree::shown_path(&ms.masks)
                    )
                },
            }),
        }
    }
    for (key, m) in &volumes {
        if !used_volumes.contains(key) {
            mask_rejects.push(RejectEntry {
                path: ms.shown(&m.rel),
                reason: "a label volume without a DICOM series (no DICOM files in a folder of its relative path and stem)".into(),
            });
        }
    }
    for (key, ms_) in &by_stem {
        if !used.contains(key) {
            for m in ms_ {
                mask_rejects.push(RejectEntry {
                    path: ms.shown(&m.rel),
                    reason: "a mask without an image (nothing of its relative path and stem among the images)".into(),
                });
            }
        }
    }
    let n = paired.len();
    let mut note = match &ms.layout {
        Some((ds, others)) => {
            let mut s = format!(
                "masks: {} laid out as {}/ beside {}/, paired by relative path and stem ({}); paths are relative to {}",
                tree::shown_path(ds),
                name_of(&ms.images),
                name_of(&ms.masks),
                count(n, "pair"),
                tree::shown_path(ds)
            );
            if !others.is_empty() {
                s.push_str(&format!(
                    "; not read: {}",
                    super::output::shown_list(others)
                ));
            }
            s
        }
        None => format!(
            "masks: from {}, paired by relative path and stem ({})",
            tree::shown_path(&ms.masks),
            count(n, "pair")
        ),
    };
    if not_images > 0 {
        note.push_str(&format!(
            "; {} in the masks folder that are not images left alone",
            count(not_images, "file")
        ));
    }
    notes.push(note);
    Ok((kept, paired))
}

/// A label volume's key: its relative path without `.nii` or `.nii.gz` ("p1/ct" for
/// "p1/ct.nii.gz"), the series folder it labels.
fn volume_key(rel: &str) -> &str {
    let lower = rel.to_ascii_lowercase();
    for end in [".nii.gz", ".nii"] {
        if lower.ends_with(end) {
            return &rel[..rel.len() - end.len()];
        }
    }
    rel
}

fn name_of(p: &Path) -> String {
    p.file_name().map(tree::name_text).unwrap_or_default()
}

/// "1 pair", "3 pairs".
fn count(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

/// The fields as written: a tree's mask takes the target's spatial shape, and without
/// `--mask-names` every value of its dtype as names until `settle_mask_names`.
pub(super) fn fill(fields: &Fields, t: &Target) -> Fields {
    Fields(
        fields
            .iter()
            .map(|f| {
                let mut f = f.clone();
                if f.kind == FieldKind::Mask && f.shape.is_empty() {
                    f.shape = vec![t.height, t.width];
                    if f.names.is_empty() {
                        let n = if f.dtype == Dtype::U8 { 256 } else { 65536 };
                        f.names = (0..n).map(|v| v.to_string()).collect();
                    }
                }
                f
            })
            .collect(),
    )
}

/// A tree's mask planned without names is named "0".."max" of the values written, and its
/// summaries cut to them; a note says so.
pub(super) fn settle_mask_names(
    planned: &Fields,
    fields: &mut Fields,
    infos: &mut BTreeMap<String, SplitInfo>,
) -> Option<String> {
    let f = planned
        .iter()
        .position(|f| f.kind == FieldKind::Mask && f.names.is_empty())?;
    let seen = |counts: &[u64]| counts.iter().rposition(|&c| c > 0);
    let max = infos
        .values()
        .filter_map(|s| s.fields.get(f).and_then(|st| seen(&st.counts)))
        .max()
        .unwrap_or(0);
    fields.0[f].names.truncate(max + 1);
    for s in infos.values_mut() {
        let stats = s
            .fields
            .get_mut(f)
            .into_iter()
            .chain(s.shards.iter_mut().filter_map(|sh| sh.fields.get_mut(f)));
        for st in stats {
            st.counts.truncate(max + 1);
        }
    }
    let total = |v: usize| -> u64 {
        infos
            .values()
            .filter_map(|s| s.fields.get(f).and_then(|st| st.counts.get(v)))
            .sum()
    };
    let mut note =
        format!("mask values: 0 to {max} seen, named \"0\"..\"{max}\" (--mask-names names them)");
    let only_0_255 = max == 255 && (1..255).all(|v| total(v) == 0);
    if only_0_255 {
        note.push_str(
            "; only 0 and 255 occur: black-and-white masks? save class indices (0 and 1) to have two values",
        );
    }
    Some(note)
}
