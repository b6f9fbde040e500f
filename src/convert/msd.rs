//! A Medical Segmentation Decathlon / nnU-Net dataset (`source::msd`, `formats/msd.md`) as a
//! plan: one unit per training case, split into train and test by case (`split::draw`: a case's
//! slices are never in two splits, and a few cases still give both splits), one class (`all`) and a `mask` field named by
//! dataset.json's labels. imagesTs/ has no labels: it is left out, with a note.

use super::units::{CaseJob, Plan, TreeSplit, Unit};
use super::*;
use crate::source::msd::{self, Case, CaseOptions};
use std::sync::atomic::{AtomicU64, Ordering};

pub(super) fn plan_msd(o: &ConvertOptions) -> Result<Plan> {
    let root = &o.input;
    let desc = msd::read_description(root)?;
    let c = desc.channels.len();
    if let Some(asked) = o.channels.filter(|&k| k as usize != c) {
        return Err(Error::Invalid(format!(
            "{}: --channels {asked}, but its dataset.json names {} ({}): samples keep them all; leave out --channels",
            tree::shown_path(root),
            count(c, "channel"),
            desc.channels.join(", ")
        )));
    }
    let found = msd::find_cases(root, &desc)?;
    let rejects: Vec<RejectEntry> = found
        .rejects
        .iter()
        .map(|(path, reason)| RejectEntry {
            path: path.clone(),
            reason: reason.clone(),
        })
        .collect();
    let Some(first) = found.cases.first() else {
        let example = rejects
            .first()
            .map(|r| format!(", e.g. {}: {}", tree::shown(&r.path), r.reason))
            .unwrap_or_default();
        return Err(Error::Source(format!(
            "{}: no usable training case ({} rejected{example})",
            tree::shown_path(root),
            rejects.len()
        )));
    };
    let native = slice_size(first, &o.decode)?;
    let (h, w) = o.size.unwrap_or(native);
    let mut notes = notes(o, &desc, &found, native);
    let k = desc.labels.len();
    let mask = if k <= 256 { Dtype::U8 } else { Dtype::U16 };
    let field = Field::mask("mask", &[c as u32, h, w], mask, desc.labels.clone());
    field.validate(&[c as u32, h, w]).map_err(|why| {
        Error::Source(format!(
            "{}: {why}",
            tree::shown_path(&root.join(msd::DATASET_JSON))
        ))
    })?;
    let meta = o.meta.then(|| {
        let longest = found
            .cases
            .iter()
            .map(|c| c.id.len() + c.images[0].rel.len())
            .max();
        let keys = [
            "case",
            "source",
            "slice",
            "spacing_x",
            "spacing_y",
            "spacing_z",
        ];
        let bytes = crate::source::meta::file_bytes(6 * longest.unwrap_or(0) + 2);
        Field::meta("meta", keys.map(String::from).to_vec(), bytes)
    });
    let job = Arc::new(CaseJob {
        options: CaseOptions {
            channels: desc.channels.clone(),
            labels: k,
            mask,
            skip_empty: o.skip_empty_masks,
        },
        meta: meta.clone(),
        skipped: AtomicU64::new(0),
    });
    let by_case = found
        .cases
        .into_iter()
        .map(|case| {
            let by = super::split::By::Group {
                what: "case",
                key: case.id.clone(),
            };
            let unit = Unit::Case {
                name: case.images[0].rel.clone(),
                case: Arc::new(case),
                job: job.clone(),
            };
            (by, unit)
        })
        .collect();
    let (by_split, drawn) = super::split::draw(by_case, o.test_fraction);
    let mut splits: BTreeMap<String, Vec<Unit>> = BTreeMap::new();
    for (split, unit) in by_split {
        splits.entry(split).or_default().push(unit);
    }
    let per_split: Vec<String> = splits
        .iter()
        .map(|(s, u)| format!("{s} {}", u.len()))
        .collect();
    notes.push(format!(
        "msd: train/test split by case id ({}), every slice of a case in its case's split",
        per_split.join(", ")
    ));
    let n: usize = splits.values().map(Vec::len).sum();
    Ok(Plan {
        fields: Fields(std::iter::once(field).chain(meta).collect()),
        kind: Kind::Msd,
        classes: vec!["all".to_string()],
        splits,
        native: Some((c as u8, (h, w), Dtype::U8)),
        rejects,
        inputs: found.inputs,
        root: root.clone(),
        notes,
        split_key: Some(TreeSplit {
            key: "case".into(),
            keys: BTreeMap::from([("case".to_string(), n)]),
            folders: BTreeMap::new(),
        }),
        stored: None,
        drawn,
    })
}

/// (height, width) of a case's slices as `nifti` cuts them: oriented, resampled, along the axis.
fn slice_size(c: &Case, d: &crate::source::DecodeOptions) -> Result<(u32, u32)> {
    let g = c
        .geometry
        .target(d.orientation, d.spacing)
        .map_err(|r| Error::Source(format!("{}: {r}", tree::shown_path(&c.images[0].path))))?;
    let (h, w) = crate::source::volume::slice_size(g.dims, d.axis);
    Ok((h as u32, w as u32))
}

/// What the plan decided on its own: the layout read, slice sizes that differ, imagesTs/ left
/// out, files of imagesTr/ not listed.
fn notes(
    o: &ConvertOptions,
    desc: &msd::Description,
    found: &msd::Found,
    native: (u32, u32),
) -> Vec<String> {
    let per_channel = found.cases.iter().filter(|c| c.per_channel).count();
    let layout = match (per_channel, found.cases.len() - per_channel) {
        (0, _) => "one file per case (MSD)",
        (_, 0) => "one file per channel (nnU-Net)",
        _ => "one file per case (MSD) and one per channel (nnU-Net)",
    };
    let mut notes = vec![format!(
        "msd: {}, {layout}; channels {}; mask values {}",
        count(found.cases.len(), "training case"),
        desc.channels.join(", "),
        super::output::shown_list(&desc.labels)
    )];
    notes.extend(found.notes.iter().cloned());
    if o.size.is_none() {
        let sizes: std::collections::BTreeSet<(u32, u32)> = found
            .cases
            .iter()
            .filter_map(|c| slice_size(c, &o.decode).ok())
            .collect();
        if sizes.len() > 1 {
            let area = |s: &&(u32, u32)| s.0 as u64 * s.1 as u64;
            let small = sizes.iter().min_by_key(area).expect("two sizes");
            let large = sizes.iter().max_by_key(area).expect("two sizes");
            notes.push(format!(
                "size: {}x{}, the first case's (cases range from {}x{} to {}x{}); --size HxW to choose (masks follow by nearest neighbour)",
                native.0, native.1, small.0, small.1, large.0, large.1
            ));
        }
    }
    if found.test_cases > 0 {
        notes.push(format!(
            "msd: imagesTs/ ({}) has no labels and is not converted: a mask of all background would read as labelled",
            count(found.test_cases, "case")
        ));
    }
    notes
}

/// Decode one case into the unit's samples; a case that cannot be used is one reject naming
/// the file at fault (the unit's name is its first image).
pub(super) fn decode_case(
    case: &Case,
    job: &CaseJob,
    t: &Target,
    d: &DecodeOptions,
    px: &mut Vec<u8>,
    labels: &mut Vec<u32>,
    fields: &mut Vec<u8>,
) -> Vec<RejectEntry> {
    match msd::decode_case(case, &job.options, t, d) {
        Ok(s) => {
            *px = s.px;
            match &job.meta {
                None => *fields = s.masks,
                Some(f) => {
                    let facts = case_facts(case, d);
                    let mb = s.masks.len() / s.n.max(1);
                    for (m, &slice) in s.masks.chunks_exact(mb.max(1)).zip(&s.slices) {
                        fields.extend_from_slice(m);
                        let mut obj = facts.clone();
                        obj.insert("slice".into(), slice.into());
                        match f.encode_meta(&obj) {
                            Ok(v) => fields.extend(v),
                            Err(why) => {
                                return vec![RejectEntry {
                                    path: case.images[0].rel.clone(),
                                    reason: why,
                                }]
                            }
                        }
                    }
                }
            }
            labels.resize(s.n, 0);
            job.skipped.fetch_add(s.skipped as u64, Ordering::Relaxed);
            vec![]
        }
        Err((path, why)) => vec![RejectEntry {
            path,
            reason: why.0,
        }],
    }
}

/// After the run: how many slices `--skip-empty-masks` left out, where the plan has cases.
pub(super) fn skipped_note(plan: &Plan) -> Option<String> {
    let job = plan.splits.values().flatten().find_map(|u| match u {
        Unit::Case { job, .. } => Some(job),
        _ => None,
    })?;
    if !job.options.skip_empty {
        return None;
    }
    let n = job.skipped.load(Ordering::Relaxed);
    Some(format!(
        "--skip-empty-masks: {} left out, their masks all background",
        count(n as usize, "slice")
    ))
}

fn count(n: usize, what: &str) -> String {
    super::folders::count(n, what)
}

/// A case's metadata beside each slice's number: its id, first image file and voxel spacing (as
/// its volumes are cut: oriented, resampled).
fn case_facts(
    case: &Case,
    d: &crate::source::DecodeOptions,
) -> serde_json::Map<String, serde_json::Value> {
    let mut m = serde_json::Map::new();
    m.insert("case".into(), case.id.clone().into());
    m.insert("source".into(), case.images[0].rel.clone().into());
    let spacing = case
        .geometry
        .target(d.orientation, d.spacing)
        .map_or([None; 3], |g| g.spacing);
    for (k, v) in ["spacing_x", "spacing_y", "spacing_z"].iter().zip(spacing) {
        if let Some(v) = v.and_then(serde_json::Number::from_f64) {
            m.insert(k.to_string(), serde_json::Value::Number(v));
        }
    }
    m
}
