//! One unit into target samples, with the samples that could not be used.

use super::file_fields::push_mask;
use super::stored::decode_stored;
use super::units::{Decoded, Failed, SeriesLabel, SeriesMask, Unit};
use super::*;

/// Decode one unit into target samples. A file is used whole or rejected whole; an array unit
/// and a stored one leave out the samples that cannot be used.
pub(super) fn decode_unit(u: &Unit, t: &Target, d: &DecodeOptions) -> Result<Decoded, Failed> {
    let mut px = Vec::new();
    let mut labels = Vec::new();
    let mut fields = Vec::new();
    let mut left_out = Vec::new();
    match u {
        Unit::Array {
            array, start, len, ..
        } => left_out = array.samples(*start, *len, t, &mut px, &mut labels, &mut fields)?,
        Unit::Stored {
            src, start, len, ..
        } => left_out = decode_stored(src, *start, *len, t, &mut px, &mut labels)?,
        Unit::File {
            path,
            kind,
            label,
            with,
            rel,
        } => {
            let kind = kind.ok_or_else(|| Reject::new("unknown file kind"))?;
            let label = label.expect("tree units are labelled");
            // A decoder bug must not take the whole run down: a panic becomes this file's reject.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                // The mask is decoded once, before its image, whose frames it follows.
                let masks = match with {
                    Some(w) => w.read_mask()?,
                    None => None,
                };
                let facts = with.as_ref().and_then(|w| w.facts(kind, path, rel, d));
                kind.decode(path, d, &mut |frame| {
                    let i = labels.len();
                    if let Some(w) = with {
                        let (_, hw) = frame.native();
                        w.push(i, hw, masks.as_deref(), t, &mut fields)?;
                        w.push_meta(i, facts.as_ref(), d, &mut fields)?;
                    }
                    to_sample(frame, t, &mut px)
                        .map_err(|why| Reject::new(format!("image {i}: {why}")))?;
                    labels.push(label);
                    Ok(())
                })?;
                match with {
                    Some(w) => w.check_frames(labels.len(), masks.as_deref()),
                    None => Ok(()),
                }
            }));
            match r {
                Ok(r) => r?,
                Err(_) => return Err(Reject::new("the decoder crashed on this file").into()),
            }
            if labels.is_empty() {
                return Err(Reject::new("holds no images").into());
            }
        }
        Unit::Case { case, job, .. } => {
            // A decoder bug must not take the whole run down: a panic becomes this case's reject.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                super::msd::decode_case(case, job, t, d, &mut px, &mut labels, &mut fields)
            }));
            left_out = match r {
                Ok(left) => left,
                Err(_) => return Err(Reject::new("the decoder crashed on this case").into()),
            };
        }
        Unit::Series {
            plan,
            label,
            meta,
            mask,
            ..
        } => {
            let facts = meta.as_ref().map(|_| series_facts(plan, d));
            // The series' masks, cut as its images will be; a label that cannot be used leaves
            // the whole series out, each file named.
            let masks = match mask.as_ref().map(|m| series_masks(plan, m, d)) {
                Some(Err(why)) => {
                    let left = plan
                        .slots
                        .iter()
                        .flatten()
                        .map(|f| RejectEntry {
                            path: f.rel.clone(),
                            reason: why.0.clone(),
                        })
                        .collect();
                    return Ok((px, labels, fields, left));
                }
                Some(Ok(m)) => Some(m),
                None => None,
            };
            // Files that do not make it are named one by one, so a series never fails as a whole
            // here.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let left = series::decode_series(plan, d, &mut |frame| {
                    let i = labels.len();
                    if let (Some(m), Some(ms)) = (mask, &masks) {
                        let (_, hw) = frame.native();
                        let Some(mf) = ms.get(i).filter(|mf| (mf.height, mf.width) == hw) else {
                            return Err(Reject::new(format!(
                                "its masks do not cut to slice {i} ({}x{}): the series and its label disagree",
                                hw.0, hw.1
                            )));
                        };
                        push_mask(mf, &m.rule, &series_label_name(m, i), t, &mut fields)?;
                    }
                    to_sample(frame, t, &mut px)
                        .map_err(|why| Reject::new(format!("image {i}: {why}")))?;
                    if let (Some(f), Some(facts)) = (meta, &facts) {
                        let m = facts.image(i, d);
                        fields.extend(f.encode_meta(&m).map_err(Reject::new)?);
                    }
                    labels.push(*label);
                    Ok(())
                })?;
                // A mask for every slice, a slice for every mask: a slice left out along the
                // stored axis would shift every mask after it.
                match &masks {
                    Some(ms) if ms.len() != labels.len() => Err(series::leave_all(
                        plan,
                        left,
                        &format!(
                            "its series {} gave {} slices, its label {}: a series with masks needs every slice",
                            plan.uid,
                            labels.len(),
                            ms.len()
                        ),
                    )),
                    _ => Ok(left),
                }
            }));
            let left = match r {
                Ok(Ok(left)) => left,
                Ok(Err(all)) => {
                    px.clear();
                    labels.clear();
                    fields.clear();
                    all
                }
                Err(_) => {
                    px.clear();
                    labels.clear();
                    fields.clear();
                    let why = format!("the decoder crashed on its series {}", plan.uid);
                    plan.slots
                        .iter()
                        .flatten()
                        .map(|f| (f.rel.clone(), why.clone()))
                        .collect()
                }
            };
            left_out = left
                .into_iter()
                .map(|(path, reason)| RejectEntry { path, reason })
                .collect();
        }
    }
    Ok((px, labels, fields, left_out))
}

/// A series' masks as `source::dicom::labels` cuts them.
fn series_masks(
    plan: &series::SeriesPlan,
    m: &SeriesMask,
    d: &DecodeOptions,
) -> Result<Vec<crate::source::mask::MaskFrame>, Reject> {
    use crate::source::dicom::labels::{series_masks, Label};
    match &m.label {
        SeriesLabel::Volume(p, shown) => series_masks(plan, Label::Volume(p), d)
            .map_err(|r| Reject::new(format!("label volume {shown}: {}", r.0))),
        SeriesLabel::Stack(v) => {
            let paths: Vec<&Path> = v.iter().map(|(p, _)| p.as_path()).collect();
            series_masks(plan, Label::Stack(&paths), d)
        }
    }
}

/// The mask a series' slice `i` comes from, as reports name it.
fn series_label_name(m: &SeriesMask, i: usize) -> String {
    match &m.label {
        SeriesLabel::Volume(_, shown) => shown.clone(),
        SeriesLabel::Stack(v) => v.get(i).map_or_else(String::new, |x| x.1.clone()),
    }
}

/// The facts of a DICOM series read as one volume: its first file's patient, series and pixel
/// spacing, slices numbered in volume order.
fn series_facts(plan: &series::SeriesPlan, d: &DecodeOptions) -> crate::source::meta::FileFacts {
    let first = plan.slots.iter().flatten().next();
    let h = first
        .and_then(|f| crate::source::dicom::read_header(&f.path).ok())
        .unwrap_or_default();
    let rel = first.map_or("", |f| f.rel.as_str());
    let spacing = plan
        .geometry
        .target(d.orientation, d.spacing)
        .map_or([None; 3], |g| g.spacing);
    crate::source::meta::FileFacts::of_series(rel, &h, spacing)
}
