//! `--part I/N`: one contiguous share of every split of a plan, and the job digest that lets
//! `prep merge` tell the parts of one job from those of another.

use super::units::{Plan, Unit};
use super::*;

/// Keep part `p` of every split of `plan`: the units (arrays: the samples) of a contiguous
/// range, in order. Returns the manifest's `part` member; its `job` digest covers `job` (what
/// shapes the output) and every unit of the whole plan in order with its label, and what
/// cheaply tells one input from another of the same name (a file's length, an array's labels).
pub(super) fn take_part(plan: &mut Plan, p: PartSpec, job: &serde_json::Value) -> Part {
    use std::hash::Hasher;
    use twox_hash::XxHash3_64 as Xxh3;
    let mut h = Xxh3::new();
    h.write(&serde_json::to_vec(job).expect("serialises"));
    for (split, units) in &plan.splits {
        h.write(split.as_bytes());
        h.write(b"\0");
        // One file system call per file: done on every core.
        let sums: Vec<[u64; 2]> = units
            .par_iter()
            .map(|u| match u {
                Unit::File { path, label, .. } => [
                    std::fs::metadata(path).map_or(u64::MAX, |m| m.len()),
                    label.map_or(u64::MAX, u64::from),
                ],
                Unit::Array {
                    array, start, len, ..
                } => {
                    let mut h = Xxh3::new();
                    for l in &array.labels[*start..start + len] {
                        h.write(&l.to_le_bytes());
                    }
                    [h.finish(), *len as u64]
                }
                Unit::Series { plan, label, .. } => [plan.files() as u64, u64::from(*label)],
                Unit::Stored { len, .. } => [0, *len as u64],
                Unit::Case { case, .. } => [
                    std::iter::once(&case.label)
                        .chain(&case.images)
                        .map(|f| std::fs::metadata(&f.path).map_or(u64::MAX, |m| m.len()))
                        .fold(0u64, u64::wrapping_add),
                    case.images.len() as u64,
                ],
            })
            .collect();
        for (u, sum) in units.iter().zip(sums) {
            h.write(u.name().as_bytes());
            h.write(b"\0");
            h.write(&sum[0].to_le_bytes());
            h.write(&sum[1].to_le_bytes());
        }
    }
    // Arrays are cut by sample, anything else by unit (a file, a series, a block).
    let weight = |u: &Unit| match u {
        Unit::Array { len, .. } => *len as u64,
        _ => 1,
    };
    let arrays = plan
        .splits
        .values()
        .flatten()
        .any(|u| matches!(u, Unit::Array { .. }));
    let mut ranges = BTreeMap::new();
    for (split, units) in plan.splits.iter_mut() {
        let total: u64 = units.iter().map(weight).sum();
        let (a, b) = crate::format::part::share(total, 1, p);
        let mut kept = Vec::new();
        let mut at = 0u64;
        for u in std::mem::take(units) {
            let w = weight(&u);
            let (s, e) = (at.max(a), (at + w).min(b));
            if s < e {
                kept.push(match u {
                    Unit::Array { array, start, .. } if (s, e) != (at, at + w) => {
                        let start = start + (s - at) as usize;
                        Unit::Array {
                            name: format!("{}[{start}..]", array.name),
                            array,
                            start,
                            len: (e - s) as usize,
                        }
                    }
                    u => u,
                });
            }
            at += w;
        }
        *units = kept;
        ranges.insert(
            split.clone(),
            PartRange {
                start: a,
                end: b,
                total,
            },
        );
    }
    Part {
        index: p.index,
        count: p.count,
        job: format!("{:016x}", h.finish()),
        of: if arrays { "samples" } else { "inputs" }.into(),
        ranges,
    }
}
