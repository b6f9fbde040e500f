//! The target shape and dtype: what the user asked for, else what the sources are.

use super::units::{Plan, Unit};
use super::*;

/// What the headers of every file of a tree say: how many give colour and grey images, and the
/// smallest and largest first image (by area).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Survey {
    pub(super) colour: u64,
    pub(super) grey: u64,
    pub(super) smallest: Option<(u32, u32)>,
    pub(super) largest: Option<(u32, u32)>,
    /// Volumes whose 4th axis is channels: how many, and the fewest and most channels.
    pub(super) multi: u64,
    pub(super) channels: Option<(u8, u8)>,
}

impl Survey {
    pub(super) fn of(p: &Probe) -> Survey {
        Survey {
            colour: u64::from(p.colour),
            grey: u64::from(!p.colour && p.channels.is_none()),
            smallest: p.size,
            largest: p.size,
            multi: u64::from(p.channels.is_some()),
            channels: p.channels.map(|c| (c, c)),
        }
    }

    /// Order-independent, so a parallel reduction gives the same answer every time.
    pub(super) fn merge(a: Survey, b: Survey) -> Survey {
        let key = |s: &(u32, u32)| (s.0 as u64 * s.1 as u64, *s);
        let pick = |x: Option<(u32, u32)>, y: Option<(u32, u32)>, min: bool| match (x, y) {
            (Some(x), Some(y)) => Some(if (key(&x) <= key(&y)) == min { x } else { y }),
            (x, y) => x.or(y),
        };
        Survey {
            colour: a.colour + b.colour,
            grey: a.grey + b.grey,
            smallest: pick(a.smallest, b.smallest, true),
            largest: pick(a.largest, b.largest, false),
            multi: a.multi + b.multi,
            channels: match (a.channels, b.channels) {
                (Some(x), Some(y)) => Some((x.0.min(y.0), x.1.max(y.1))),
                (x, y) => x.or(y),
            },
        }
    }
}

/// Probe the header of every file unit, on every core. Memory stays bounded: each probe reads one
/// header and only the counts are kept.
pub(super) fn survey(o: &ConvertOptions, p: &Plan) -> Survey {
    let units: Vec<&Unit> = p.splits.values().flatten().collect();
    let pb = crate::util::progress::bar(units.len() as u64, "probe", "inputs", o.quiet);
    let s = units
        .par_iter()
        .map(|u| {
            // A file whose header cannot be read counts for nothing here; decoding rejects it
            // with the reason.
            if crate::util::interrupt::requested().is_some() {
                return Survey::default();
            }
            let s = match u.probe(&o.decode) {
                Some(Ok(probe)) => Survey::of(&probe),
                _ => Survey::default(),
            };
            pb.inc(1);
            s
        })
        .reduce(Survey::default, Survey::merge);
    pb.finish_and_clear();
    s
}

/// The target shape: options first, else the source's own. Size: the first tree file that
/// decodes (train files first). Channels: 3 when any file of a tree is colour, from every file's
/// header. What was decided from inputs that disagree goes into `notes`.
pub(super) fn target(o: &ConvertOptions, p: &Plan, notes: &mut Vec<String>) -> Result<Target> {
    let native = match p.native {
        Some(n) => Some(n),
        // Probe train files first: the default shape must not depend on how the split fell.
        None => p
            .splits
            .get("train")
            .into_iter()
            .chain(
                p.splits
                    .iter()
                    .filter(|(k, _)| *k != "train")
                    .map(|(_, v)| v),
            )
            .flatten()
            .take(32)
            .find_map(|u| match u {
                Unit::File {
                    path,
                    kind: Some(k),
                    ..
                } => {
                    let mut first = None;
                    let _ = k.decode(path, &o.decode, &mut |frame| {
                        first = Some(frame.native());
                        Err(Reject::new("probe done"))
                    });
                    first.map(|(c, hw)| (c, hw, Dtype::U8))
                }
                Unit::Series { probe, .. } => probe.as_ref().ok().and_then(|p| {
                    p.size
                        .map(|hw| (if p.colour { 3 } else { 1 }, hw, Dtype::U8))
                }),
                _ => None,
            }),
    };
    let (mut c, (h, w), _) = native.unwrap_or((3, (32, 32), Dtype::U8));
    // A tree's files need not agree: one colour photo among grey ones must not lose its colour
    // because a grey one came first.
    if o.channels.is_none() && p.native.is_none() {
        let s = survey(o, p);
        if let Some((few, most)) = s.channels {
            if few != most || s.colour + s.grey > 0 {
                return Err(Error::Invalid(format!(
                    "{}: {} of {} channels (a 4th axis of modalities) beside {} of 1 or 3: every sample needs one channel count (convert them apart, or --fourth-axis time)",
                    tree::shown_path(&o.input),
                    folders::count(s.multi as usize, "volume"),
                    if few == most { few.to_string() } else { format!("{few} to {most}") },
                    folders::count((s.colour + s.grey) as usize, "input")
                )));
            }
            c = few;
        } else if s.colour > 0 {
            c = 3;
        } else if s.grey > 0 {
            c = 1;
        }
        if s.colour > 0 && s.grey > 0 {
            notes.push(format!(
                "channels: 3 ({} colour inputs, {} grey); --channels 1 to keep grey",
                s.colour, s.grey
            ));
        }
        if let (None, Some(small), Some(large)) = (o.size, s.smallest, s.largest) {
            if small != large {
                notes.push(format!(
                    "size: {h}x{w}, the first input's (inputs range from {}x{} to {}x{}); --size HxW to choose",
                    small.0, small.1, large.0, large.1
                ));
            }
        }
    }
    let (h, w) = o.size.unwrap_or((h, w));
    let t = Target {
        channels: o.channels.unwrap_or(c),
        height: h,
        width: w,
        dtype: o.dtype.unwrap_or(Dtype::U8),
        fit: o.fit,
    };
    Shape::new(vec![t.channels as u32, t.height, t.width])?;
    Ok(t)
}
