//! How train and test are drawn where an input has no split of its own: the one rule every
//! source uses (trees of files and DICOM series, MSD cases, an unsplit .npy pair).
//!
//! Each unit is split by a key. A key that holds many samples is a group: a DICOM patient (else
//! study, else series), an MSD case, a volume or video file, a run of an array's samples. Groups
//! are ranked by a hash of their key and the first round(fraction x groups) go to test, at least
//! one when the fraction is above 0 and there are two groups or more, and at least one is left
//! for train when it is below 1: five patients at 0.1 still give a test patient, where a hash
//! threshold gives none about half the time. A file of one sample (a plain image) keeps the hash
//! of its path (`tree::is_test`): many of them give the fraction anyway, and adding a file moves
//! no other. What came out is recorded (`Drawn` when planned, `SplitReport` once the samples
//! are counted), with a warning where the groups cannot give the fraction asked.

use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// How one unit's split is decided.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum By {
    /// By its split folder: the tree keeps its own splits.
    Folder(String),
    /// By a hash of its path: a file of one sample.
    Path(String),
    /// By its group: `what` names the key ("PatientID", "case", "file", ...), `key` its value.
    Group { what: &'static str, key: String },
}

/// What a draw gave, known when the input is planned.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(super) struct Drawn {
    /// `--test-fraction`.
    pub(super) asked: f64,
    /// What a group is: the key all groups were split by, "mixed" for several; None where
    /// every unit was split by its path.
    pub(super) by: Option<String>,
    /// Groups by split (splits without any left out).
    pub(super) groups: BTreeMap<String, usize>,
    /// Files split by a hash of their path, by split.
    pub(super) files: BTreeMap<String, usize>,
    /// Why the groups cannot give the fraction asked.
    pub(super) warning: Option<String>,
}

/// How many of `n` groups go to test at `fraction` (see the module's rule).
pub(super) fn test_count(n: usize, fraction: f64) -> usize {
    if n == 0 || fraction <= 0.0 {
        return 0;
    }
    if fraction >= 1.0 {
        return n;
    }
    if n == 1 {
        // One group cannot be in both splits: train, which a warning says.
        return 0;
    }
    ((fraction * n as f64).round() as usize).clamp(1, n - 1)
}

/// The groups of `keys` that go to test: the first `test_count` by a hash of the key (the key
/// itself breaks ties), so the choice is the same on every run and machine.
pub(super) fn test_groups<'a>(
    keys: impl IntoIterator<Item = &'a str>,
    fraction: f64,
) -> BTreeSet<&'a str> {
    let distinct: BTreeSet<&str> = keys.into_iter().collect();
    let mut ranked: Vec<&str> = distinct.into_iter().collect();
    ranked.sort_by_key(|k| (twox_hash::XxHash3_64::oneshot(k.as_bytes()), *k));
    let n = test_count(ranked.len(), fraction);
    ranked.into_iter().take(n).collect()
}

/// The split of each unit, in the order given, and what the draw gave (None where every unit
/// kept its split folder's split: nothing was drawn).
pub(super) fn draw<T>(units: Vec<(By, T)>, fraction: f64) -> (Vec<(String, T)>, Option<Drawn>) {
    let groups: BTreeSet<(&'static str, String)> = units
        .iter()
        .filter_map(|(b, _)| match b {
            By::Group { what, key } => Some((*what, key.clone())),
            _ => None,
        })
        .collect();
    // Ranked by the key's value alone; two kinds of key with one value are one group.
    let test: BTreeSet<String> = test_groups(groups.iter().map(|(_, k)| k.as_str()), fraction)
        .into_iter()
        .map(String::from)
        .collect();
    let whats: BTreeSet<&str> = groups.iter().map(|(w, _)| *w).collect();
    let mut drawn = Drawn {
        asked: fraction,
        by: match whats.len() {
            0 => None,
            1 => whats.first().map(|w| w.to_string()),
            _ => Some("mixed".into()),
        },
        groups: BTreeMap::new(),
        files: BTreeMap::new(),
        warning: None,
    };
    let mut in_split: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut any_drawn = false;
    let mut out = Vec::with_capacity(units.len());
    for (b, t) in units {
        let split = match b {
            By::Folder(s) => s,
            By::Path(p) => {
                any_drawn = true;
                let s = split_name(crate::source::tree::is_test(&p, fraction));
                *drawn.files.entry(s.clone()).or_default() += 1;
                s
            }
            By::Group { key, .. } => {
                any_drawn = true;
                let s = split_name(test.contains(&key));
                in_split.entry(s.clone()).or_default().insert(key);
                s
            }
        };
        out.push((split, t));
    }
    drawn.groups = in_split.into_iter().map(|(s, k)| (s, k.len())).collect();
    if !any_drawn {
        return (out, None);
    }
    drawn.warning = group_warning(&drawn);
    (out, Some(drawn))
}

fn split_name(test: bool) -> String {
    if test { "test" } else { "train" }.to_string()
}

/// "patient"/"patients" for a key's name.
pub(super) fn noun(by: &str, n: usize) -> String {
    let (one, many) = match by {
        "PatientID" => ("patient", "patients"),
        "StudyInstanceUID" => ("study", "studies"),
        "SeriesInstanceUID" => ("series", "series"),
        "case" => ("case", "cases"),
        "file" | "path" => ("file", "files"),
        "chunk" => ("run of samples", "runs of samples"),
        _ => ("group", "groups"),
    };
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Whether a realised fraction is too far from the one asked to pass without a word: more than
/// a quarter of it and more than 0.02 away.
fn far_off(realised: f64, asked: f64) -> bool {
    (realised - asked).abs() > (0.25 * asked).max(0.02)
}

/// The warning when the groups cannot give the fraction asked: one group (no test split), or
/// too few for it (3 patients at 0.1 give 1 of 3).
fn group_warning(d: &Drawn) -> Option<String> {
    let by = d.by.as_deref()?;
    let f = d.asked;
    if f <= 0.0 || f >= 1.0 {
        return None;
    }
    let n: usize = d.groups.values().sum();
    let test = d.groups.get("test").copied().unwrap_or(0);
    if n == 1 {
        return Some(format!(
            "warning: {}: no test split (--test-fraction {f} asks for one): all of it is in train; a held-out set needs at least 2",
            noun(by, 1)
        ));
    }
    let r = test as f64 / n as f64;
    far_off(r, f).then(|| {
        format!(
            "warning: {} cannot give a test fraction of {f}: {} of {n} ({r:.2}) in test, {} in train",
            noun(by, n),
            test,
            n - test
        )
    })
}

/// The split as it came out, for the summary and the manifest's `provenance.source.split`.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct SplitReport {
    /// `--test-fraction`.
    pub test_fraction: f64,
    /// What a group is ("PatientID", "StudyInstanceUID", "case", "file", "chunk", "mixed"),
    /// "path" where every input was a file split by a hash of its path.
    pub by: String,
    /// Groups by split; files split by their path count as groups of their own.
    pub groups: BTreeMap<String, usize>,
    /// The share of the groups in test.
    pub groups_test_fraction: f64,
    /// Samples by split; None in the manifest (its `splits` count them) and for one part of a
    /// job (`--part`), which holds only its share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<BTreeMap<String, u64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples_test_fraction: Option<f64>,
    /// Where the split is not what was asked (printed on stderr, even with --quiet).
    pub warnings: Vec<String>,
}

impl SplitReport {
    /// The draw with the samples each split came to (None for a part of a job).
    pub(super) fn new(d: &Drawn, samples: Option<BTreeMap<String, u64>>) -> Self {
        let mut groups = d.groups.clone();
        for (s, n) in &d.files {
            *groups.entry(s.clone()).or_default() += n;
        }
        let share = |m: &BTreeMap<String, u64>| {
            let total: u64 = m.values().sum();
            (total > 0).then(|| m.get("test").copied().unwrap_or(0) as f64 / total as f64)
        };
        let as_u64 = |m: &BTreeMap<String, usize>| -> BTreeMap<String, u64> {
            m.iter().map(|(k, v)| (k.clone(), *v as u64)).collect()
        };
        let by = d.by.clone().unwrap_or_else(|| "path".into());
        let mut warnings: Vec<String> = d.warning.iter().cloned().collect();
        let samples_test_fraction = samples.as_ref().and_then(share);
        if let (Some(m), Some(r)) = (&samples, samples_test_fraction) {
            let f = d.asked;
            let empty = |s: &str| m.get(s).copied().unwrap_or(0) == 0;
            if f > 0.0 && f < 1.0 && d.warning.is_none() {
                for s in ["test", "train"] {
                    if empty(s) {
                        warnings.push(format!(
                            "warning: the {s} split is empty (--test-fraction {f}): {} in train, {} in test",
                            noun(&by, groups.get("train").copied().unwrap_or(0)),
                            groups.get("test").copied().unwrap_or(0)
                        ));
                    }
                }
                // Groups of unequal size: far off in samples, though right in groups.
                if warnings.is_empty() && d.by.is_some() && (r - f).abs() > (0.5 * f).max(0.05) {
                    warnings.push(format!(
                        "warning: the test split holds {r:.2} of the samples (--test-fraction {f}): its {} of {} hold {} samples of {}",
                        groups.get("test").copied().unwrap_or(0),
                        noun(&by, groups.values().sum()),
                        m.get("test").copied().unwrap_or(0),
                        m.values().sum::<u64>()
                    ));
                }
            }
        }
        SplitReport {
            test_fraction: d.asked,
            groups_test_fraction: share(&as_u64(&groups)).unwrap_or(0.0),
            by,
            groups,
            samples,
            samples_test_fraction,
            warnings,
        }
    }

    /// The summary's line: "split by PatientID: train 4 patients, 40 samples; test 1 patient,
    /// 4 samples (0.09 of the samples, 0.20 of the patients; --test-fraction 0.1)".
    pub fn line(&self) -> String {
        // train first, then test, then any other.
        let mut order: Vec<(&String, &usize)> = self.groups.iter().collect();
        order.sort_by_key(|(s, _)| (s.as_str() != "train", s.as_str() != "test", s.to_string()));
        let each: Vec<String> = order
            .into_iter()
            .map(|(s, &n)| match &self.samples {
                Some(m) => {
                    let k = m.get(s).copied().unwrap_or(0);
                    let plural = if k == 1 { "" } else { "s" };
                    format!("{s} {}, {k} sample{plural}", noun(&self.by, n))
                }
                None => format!("{s} {}", noun(&self.by, n)),
            })
            .collect();
        let many = noun(&self.by, 2);
        let many = many.trim_start_matches("2 ");
        let shares = match self.samples_test_fraction {
            Some(s) => format!(
                "{s:.2} of the samples, {:.2} of the {many}",
                self.groups_test_fraction
            ),
            None => format!("{:.2} of the {many}", self.groups_test_fraction),
        };
        format!(
            "split by {}: {} ({shares}; --test-fraction {})",
            self.by,
            each.join("; "),
            self.test_fraction
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_requested_split_gets_a_group_when_it_can() {
        // (groups, fraction) -> test groups
        for (n, f, want) in [
            (0, 0.1, 0),
            (1, 0.1, 0),
            (1, 0.9, 0),
            (1, 1.0, 1),
            (2, 0.1, 1),
            (2, 0.9, 1),
            (3, 0.1, 1),
            (5, 0.1, 1),
            (5, 0.5, 3),
            (5, 0.0, 0),
            (5, 1.0, 5),
            (20, 0.1, 2),
            (20, 0.99, 19),
            (1000, 0.1, 100),
        ] {
            assert_eq!(test_count(n, f), want, "{n} groups at {f}");
        }
    }

    #[test]
    fn the_test_groups_are_the_same_whatever_the_order() {
        let keys: Vec<String> = (0..20).map(|i| format!("PAT{i:03}")).collect();
        let a = test_groups(keys.iter().map(String::as_str), 0.25);
        let b = test_groups(keys.iter().rev().map(String::as_str), 0.25);
        assert_eq!(a, b);
        assert_eq!(a.len(), 5);
        // Repeated keys are one group.
        let twice = test_groups(keys.iter().chain(&keys).map(String::as_str), 0.25);
        assert_eq!(twice, a);
    }

    fn group(k: &str) -> By {
        By::Group {
            what: "PatientID",
            key: k.into(),
        }
    }

    #[test]
    fn a_group_is_whole_in_one_split_and_counted_once() {
        let units: Vec<(By, usize)> = (0..30)
            .map(|i| (group(&format!("P{}", i % 3)), i))
            .collect();
        let (splits, d) = draw(units, 0.1);
        let d = d.unwrap();
        let mut of: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
        for (s, i) in &splits {
            of.entry(i % 3).or_default().insert(s.clone());
        }
        assert!(of.values().all(|s| s.len() == 1), "{of:?}");
        assert_eq!(d.groups.values().sum::<usize>(), 3);
        assert_eq!(d.groups["test"], 1);
        assert_eq!(d.by.as_deref(), Some("PatientID"));
        let w = d.warning.unwrap();
        assert!(
            w.contains("3 patients cannot give a test fraction of 0.1: 1 of 3 (0.33)"),
            "{w}"
        );
    }

    #[test]
    fn warnings_follow_the_group_count() {
        let warn = |n: usize, f: f64| {
            let units = (0..n).map(|i| (group(&format!("P{i}")), ())).collect();
            draw(units, f).1.unwrap().warning
        };
        assert!(warn(1, 0.1).unwrap().contains("1 patient: no test split"));
        assert!(warn(3, 0.1).is_some());
        assert!(warn(5, 0.1).unwrap().contains("1 of 5 (0.20)"));
        assert_eq!(warn(20, 0.1), None);
        assert_eq!(warn(20, 0.5), None);
        // Asked for none, or for all: no warning.
        assert_eq!(warn(1, 0.0), None);
        assert_eq!(warn(3, 1.0), None);
    }

    #[test]
    fn folders_draw_nothing_and_paths_keep_their_hash() {
        let (s, d) = draw(vec![(By::Folder("val".into()), 1)], 0.5);
        assert_eq!(s, vec![("val".to_string(), 1)]);
        assert_eq!(d, None);
        let units: Vec<(By, ())> = (0..200)
            .map(|i| (By::Path(format!("a/{i}.png")), ()))
            .collect();
        let (s, d) = draw(units, 0.3);
        for (i, (split, _)) in s.iter().enumerate() {
            let want = crate::source::tree::is_test(&format!("a/{i}.png"), 0.3);
            assert_eq!(split == "test", want);
        }
        let d = d.unwrap();
        assert_eq!(d.by, None);
        assert_eq!(d.files.values().sum::<usize>(), 200);
        assert_eq!(d.warning, None);
    }

    #[test]
    fn the_report_counts_samples_and_warns_where_they_are_off() {
        let units = (0..5).map(|i| (group(&format!("P{i}")), ())).collect();
        let d = draw(units, 0.5).1.unwrap();
        assert_eq!(
            d.groups,
            BTreeMap::from([("test".into(), 3), ("train".into(), 2)])
        );
        let samples = BTreeMap::from([("test".to_string(), 43u64), ("train".to_string(), 1)]);
        let r = SplitReport::new(&d, Some(samples));
        assert_eq!(r.groups_test_fraction, 0.6);
        assert!((r.samples_test_fraction.unwrap() - 43.0 / 44.0).abs() < 1e-12);
        assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
        assert!(
            r.warnings[0].contains("holds 0.98 of the samples"),
            "{:?}",
            r.warnings
        );
        assert_eq!(
            r.line(),
            "split by PatientID: train 2 patients, 1 sample; test 3 patients, 43 samples (0.98 of the samples, 0.60 of the patients; --test-fraction 0.5)"
        );
        // A part of a job: no samples, no sample warning.
        let r = SplitReport::new(&d, None);
        assert_eq!(r.samples, None);
        assert!(r.warnings.is_empty());
        // Files by path: an empty test split is said.
        let units = (0..3).map(|i| (By::Path(format!("{i}.png")), ())).collect();
        let d = draw(units, 0.1).1.unwrap();
        let n = d.files.get("train").copied().unwrap_or(0) as u64;
        let t = 3 - n;
        let r = SplitReport::new(
            &d,
            Some(BTreeMap::from([("train".into(), n), ("test".into(), t)])),
        );
        assert_eq!(r.by, "path");
        assert_eq!(r.warnings.is_empty(), t > 0 && n > 0, "{:?}", r.warnings);
    }
}
