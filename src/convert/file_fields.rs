//! What one file's samples carry beside image and class, read as the file is decoded: its mask
//! (decoded once, checked against its image's size and frames, brought to the target with the
//! image's placement by `fit_mask`) and its labels CSV's labels and values.

use super::*;
use crate::source::mask::{self, MaskFrame, MaskValues};
use crate::source::meta::FileFacts;
use crate::source::transform::fit_mask;

/// How a tree's masks are stored: the field's dtype, and with `--mask-names` how many values
/// it names (a value at or beyond rejects its file).
#[derive(Debug)]
pub(super) struct MaskRule {
    pub(super) dtype: Dtype,
    pub(super) names: Option<usize>,
}

/// What one file's samples carry beside image and class.
#[derive(Debug)]
pub(super) struct FileFields {
    /// Its mask: (path, as reports name it, the field's rules).
    pub(super) mask: Option<(PathBuf, String, Arc<MaskRule>)>,
    /// The mask is a label volume over its DICOM series (`source::dicom::labels`), not an
    /// image of this file's own.
    pub(super) volume: bool,
    /// Its labels and values from the labels CSV, the same for every frame.
    pub(super) csv: Box<[u8]>,
    /// The metadata field (`--meta`), last of the fields: each frame's facts of its file.
    pub(super) meta: Option<Field>,
}

impl FileFields {
    /// The mask's frames, decoded once for the whole file (None without a mask).
    pub(super) fn read_mask(&self) -> Result<Option<Vec<MaskFrame>>, Reject> {
        match &self.mask {
            None => Ok(None),
            Some((_, shown, _)) if self.volume => Err(Reject::new(format!(
                "label volume {shown} labels a DICOM series, but this file is on its own (multi-frame, without a Series Instance UID, or the only file of its series): give it a mask image of its own"
            ))),
            Some((path, shown, _)) => mask::read(path)
                .map(Some)
                .map_err(|why| Reject::new(format!("mask {shown}: {why}"))),
        }
    }

    /// Append frame `i`'s field bytes; its image is `(height, width)` before it is brought to
    /// the target `t`, and so must its mask be.
    pub(super) fn push(
        &self,
        i: usize,
        (h, w): (u32, u32),
        masks: Option<&[MaskFrame]>,
        t: &Target,
        out: &mut Vec<u8>,
    ) -> Result<(), Reject> {
        if let (Some((_, shown, rule)), Some(ms)) = (&self.mask, masks) {
            let m = ms.get(i).ok_or_else(|| {
                Reject::new(format!(
                    "mask {shown} has {}, its image at least {}",
                    frames(ms.len()),
                    i + 1
                ))
            })?;
            if (m.height, m.width) != (h, w) {
                return Err(Reject::new(format!(
                    "mask {shown} is {}x{}, its image {h}x{w} (height x width): a mask has its image's size",
                    m.height, m.width
                )));
            }
            push_mask(m, rule, shown, t, out)?;
        }
        out.extend_from_slice(&self.csv);
        Ok(())
    }

    /// Append frame `i`'s metadata (after `push`: it is the last field).
    pub(super) fn push_meta(
        &self,
        i: usize,
        facts: Option<&FileFacts>,
        d: &DecodeOptions,
        out: &mut Vec<u8>,
    ) -> Result<(), Reject> {
        if let (Some(f), Some(facts)) = (&self.meta, facts) {
            out.extend(f.encode_meta(&facts.image(i, d)).map_err(Reject::new)?);
        }
        Ok(())
    }

    /// The facts of the file `path` (`rel`) its metadata comes from, where it has some.
    pub(super) fn facts(
        &self,
        kind: FileKind,
        path: &Path,
        rel: &str,
        d: &DecodeOptions,
    ) -> Option<FileFacts> {
        self.meta.as_ref()?;
        Some(FileFacts::of(kind, path, rel, d))
    }

    /// Whether the file's samples carry anything besides metadata.
    pub(super) fn csv_labels_it(&self) -> bool {
        !self.csv.is_empty()
    }

    /// After the image's `n` frames: its mask must have had as many.
    pub(super) fn check_frames(&self, n: usize, masks: Option<&[MaskFrame]>) -> Result<(), Reject> {
        match (&self.mask, masks) {
            (Some((_, shown, _)), Some(ms)) if ms.len() != n => Err(Reject::new(format!(
                "mask {shown} has {}, its image {n}",
                frames(ms.len())
            ))),
            _ => Ok(()),
        }
    }
}

fn frames(n: usize) -> String {
    format!("{n} frame{}", if n == 1 { "" } else { "s" })
}

/// A mask frame brought to the target (nearest, with its image's placement) in the field's
/// dtype; a value beyond `--mask-names` rejects its file.
pub(super) fn push_mask(
    m: &MaskFrame,
    rule: &MaskRule,
    shown: &str,
    t: &Target,
    out: &mut Vec<u8>,
) -> Result<(), Reject> {
    let max = m.values.max();
    if let Some(n) = rule.names {
        if max as usize >= n {
            return Err(Reject::new(format!(
                "mask {shown} holds value {max}, beyond its {n} names (--mask-names)"
            )));
        }
    }
    let (w, h) = (m.width, m.height);
    match (&m.values, rule.dtype) {
        (MaskValues::U8(v), Dtype::U8) => out.extend_from_slice(&fit_mask(v, w, h, t)),
        (MaskValues::U8(v), _) => {
            for x in fit_mask(v, w, h, t) {
                out.extend_from_slice(&(x as u16).to_le_bytes());
            }
        }
        (MaskValues::U16(v), Dtype::U8) => {
            // The headers promised 8 bits (the file changed since, or lied).
            if max > 255 {
                return Err(Reject::new(format!(
                    "mask {shown} holds value {max}, but the masks are stored as u8 (their headers say 8 bits; --mask-names with more than 256 names stores u16)"
                )));
            }
            out.extend(fit_mask(v, w, h, t).into_iter().map(|x| x as u8));
        }
        (MaskValues::U16(v), _) => {
            for x in fit_mask(v, w, h, t) {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
    }
    Ok(())
}
