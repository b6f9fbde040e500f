//! Host-side metrics of the segmentation (`mask`), multi-label (`labels`) and regression (`values`)
//! tasks: pure functions and small accumulators over plain arrays, so any backend (and any rank of a
//! data-parallel run) can feed them, and the results serialise into `metrics.jsonl` and
//! `summary.json`. Undefined figures (a class in neither prediction nor truth, a label without
//! positives, constant targets) are `None` (JSON `null`), never a made-up 0 or 1.

use crate::util::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// At most this many names are spelled out in a one-line summary; the rest are counted.
const SUMMARY_NAMES: usize = 8;

fn invalid(what: String) -> Error {
    Error::Invalid(what)
}

fn ratio(num: f64, den: f64) -> Option<f64> {
    (den > 0.0).then(|| num / den)
}

/// The mean of the defined values, `None` when there are none.
fn mean_defined(values: impl IntoIterator<Item = Option<f64>>) -> Option<f64> {
    let (sum, n) = values
        .into_iter()
        .flatten()
        .fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    ratio(sum, n as f64)
}

fn check_names(what: &str, names: &[String], k: usize) -> Result<()> {
    if names.len() != k {
        return Err(invalid(format!(
            "{what}: {} names for {k} columns",
            names.len()
        )));
    }
    Ok(())
}

/// `0.912`, or `-` for an undefined figure.
fn fixed(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.decimals$}"))
}

/// Three significant digits for figures in a target's own units (1.23e-5 to 4.56e6 alike).
fn sig3(v: Option<f64>) -> String {
    let Some(v) = v else {
        return "-".into();
    };
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let mag = v.abs().log10().floor();
    if (-3.0..5.0).contains(&mag) {
        let dec = (2.0 - mag).max(0.0) as usize;
        format!("{v:.dec$}")
    } else {
        format!("{v:.2e}")
    }
}

/// `(a 0.95, b 0.87, ... and 3 more)` over named figures.
fn named_list(names: &[String], values: impl Iterator<Item = String>) -> String {
    let shown: Vec<String> = names
        .iter()
        .zip(values)
        .take(SUMMARY_NAMES)
        .map(|(n, v)| format!("{n} {v}"))
        .collect();
    let more = names.len().saturating_sub(SUMMARY_NAMES);
    let tail = if more > 0 {
        format!(", ... and {more} more")
    } else {
        String::new()
    };
    format!("({}{tail})", shown.join(", "))
}

// ---------------------------------------------------------------------------------------------
// Segmentation

/// Per-class pixel counts `[tp, fp, fn]` of predicted against true masks, added a batch at a time.
/// Every counted pixel is a tp or fn of its true class, so the counts also give pixel accuracy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegCounts {
    counts: Vec<[u64; 3]>,
}

impl SegCounts {
    pub fn new(classes: usize) -> SegCounts {
        SegCounts {
            counts: vec![[0; 3]; classes],
        }
    }

    /// Adds predicted and true class maps of the same length (any number of HxW masks back to
    /// back). Pixels whose truth is `ignore` are skipped; any other value outside the classes, in
    /// either map, is an error naming its index (and nothing of the batch is counted).
    pub fn add(&mut self, pred: &[u32], truth: &[u32], ignore: Option<u32>) -> Result<()> {
        let k = self.counts.len();
        if pred.len() != truth.len() {
            return Err(invalid(format!(
                "segmentation counts: {} predicted pixels for {} true ones",
                pred.len(),
                truth.len()
            )));
        }
        let bad = pred
            .iter()
            .zip(truth)
            .position(|(&p, &t)| Some(t) != ignore && (p as usize >= k || t as usize >= k));
        if let Some(i) = bad {
            return Err(invalid(format!(
                "segmentation counts: pixel {i} has prediction {} and truth {} for {k} classes",
                pred[i], truth[i]
            )));
        }
        for (&p, &t) in pred.iter().zip(truth) {
            if Some(t) == ignore {
                continue;
            }
            if p == t {
                self.counts[t as usize][0] += 1;
            } else {
                self.counts[p as usize][1] += 1;
                self.counts[t as usize][2] += 1;
            }
        }
        Ok(())
    }

    /// Adds another rank's (or batch's) counts over the same classes.
    pub fn merge(&mut self, other: &SegCounts) -> Result<()> {
        if other.counts.len() != self.counts.len() {
            return Err(invalid(format!(
                "segmentation counts: merging {} classes into {}",
                other.counts.len(),
                self.counts.len()
            )));
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            for (x, y) in a.iter_mut().zip(b) {
                *x += y;
            }
        }
        Ok(())
    }

    /// `[tp, fp, fn]` per class.
    pub fn counts(&self) -> &[[u64; 3]] {
        &self.counts
    }
}

/// Segmentation figures of one evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SegScores {
    pub classes: Vec<String>,
    /// 2tp / (2tp + fp + fn) per class; `None` for a class in neither prediction nor truth.
    pub dice: Vec<Option<f64>>,
    /// tp / (tp + fp + fn) per class; `None` likewise.
    pub iou: Vec<Option<f64>>,
    /// Means over the foreground classes (all but `background`) whose figure is defined.
    pub mean_dice: Option<f64>,
    pub mean_iou: Option<f64>,
    /// Correct pixels over counted pixels (background included).
    pub pixel_accuracy: Option<f64>,
    /// The class left out of the means (0 unless the dataset declares otherwise), if any.
    pub background: Option<usize>,
    /// `[tp, fp, fn]` per class, so any other figure can be derived later.
    pub counts: Vec<[u64; 3]>,
}

impl SegScores {
    pub fn from_counts(
        counts: &[[u64; 3]],
        classes: &[String],
        background: Option<usize>,
    ) -> Result<SegScores> {
        check_names("segmentation", classes, counts.len())?;
        if background.is_some_and(|b| b >= counts.len()) {
            return Err(invalid(format!(
                "segmentation: background class {background:?} of {} classes",
                counts.len()
            )));
        }
        let f = |c: &[u64; 3]| c.map(|v| v as f64);
        let dice: Vec<Option<f64>> = counts
            .iter()
            .map(f)
            .map(|[tp, fp, fn_]| ratio(2.0 * tp, 2.0 * tp + fp + fn_))
            .collect();
        let iou: Vec<Option<f64>> = counts
            .iter()
            .map(f)
            .map(|[tp, fp, fn_]| ratio(tp, tp + fp + fn_))
            .collect();
        let fg = |v: &[Option<f64>]| {
            let it = v.iter().enumerate().filter(|(i, _)| Some(*i) != background);
            mean_defined(it.map(|(_, d)| *d))
        };
        let correct: f64 = counts.iter().map(|c| c[0] as f64).sum();
        let pixels: f64 = counts.iter().map(|c| (c[0] + c[2]) as f64).sum();
        Ok(SegScores {
            classes: classes.to_vec(),
            mean_dice: fg(&dice),
            mean_iou: fg(&iou),
            dice,
            iou,
            pixel_accuracy: ratio(correct, pixels),
            background,
            counts: counts.to_vec(),
        })
    }

    /// `mean Dice 0.912 (road 0.95, car 0.87), mean IoU 0.840, pixel accuracy 0.981`; the list
    /// names the foreground classes.
    pub fn summary(&self) -> String {
        let fg: Vec<usize> = (0..self.classes.len())
            .filter(|&i| Some(i) != self.background)
            .collect();
        let names: Vec<String> = fg.iter().map(|&i| self.classes[i].clone()).collect();
        let dice = fg.iter().map(|&i| fixed(self.dice[i], 2));
        format!(
            "mean Dice {} {}, mean IoU {}, pixel accuracy {}",
            fixed(self.mean_dice, 3),
            named_list(&names, dice),
            fixed(self.mean_iou, 3),
            fixed(self.pixel_accuracy, 3)
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Multi-label

/// What a model's multi-label outputs are; F1 and exact match predict a label where the
/// probability exceeds 0.5, i.e. where the logit exceeds 0 (strictly, as torchmetrics does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScoreKind {
    Logits,
    Probabilities,
}

impl ScoreKind {
    fn threshold(self) -> f32 {
        match self {
            ScoreKind::Logits => 0.0,
            ScoreKind::Probabilities => 0.5,
        }
    }
}

/// Average precision of one label as scikit-learn's `average_precision_score` computes it:
/// scores sorted in decreasing order, one operating point per distinct score (tied samples enter
/// together), AP = sum over points of (R_i - R_{i-1}) * P_i with R_0 = 0. `None` without
/// positives (recall is undefined). A NaN score ranks below every other score (a NaN is never a
/// positive prediction either).
pub fn average_precision(scores: &[f32], truth: &[u8]) -> Result<Option<f64>> {
    if scores.len() != truth.len() {
        return Err(invalid(format!(
            "average precision: {} scores for {} truths",
            scores.len(),
            truth.len()
        )));
    }
    let mut pairs = Vec::with_capacity(scores.len());
    for (&s, &t) in scores.iter().zip(truth) {
        pairs.push((s, truth_bit(t)?));
    }
    Ok(ap_sorting(&mut pairs))
}

fn truth_bit(t: u8) -> Result<bool> {
    match t {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(invalid(format!("multi-label truth {t} is not 0 or 1"))),
    }
}

/// `average_precision` on (score, positive) pairs, which it reorders.
fn ap_sorting(pairs: &mut [(f32, bool)]) -> Option<f64> {
    let positives = pairs.iter().filter(|p| p.1).count();
    if positives == 0 {
        return None;
    }
    for p in pairs.iter_mut() {
        if p.0.is_nan() {
            p.0 = f32::NEG_INFINITY;
        }
    }
    // Decreasing; -0.0 and 0.0 sort next to each other and compare equal, so they form one group.
    pairs.sort_unstable_by(|a, b| b.0.total_cmp(&a.0));
    let (mut tp, mut seen, mut ap) = (0usize, 0usize, 0.0f64);
    let mut i = 0;
    while i < pairs.len() {
        let group = pairs[i..].iter().take_while(|p| p.0 == pairs[i].0).count();
        let group_tp = pairs[i..i + group].iter().filter(|p| p.1).count();
        tp += group_tp;
        seen += group;
        // Recall rises by group_tp / positives at this point; precision is taken after the group.
        ap += (group_tp as f64 / positives as f64) * (tp as f64 / seen as f64);
        i += group;
    }
    Some(ap)
}

/// Multi-label outputs and truth added a batch at a time. F1 and exact match are counted over
/// every sample. Average precision needs every score, so the accumulator keeps them (n x k f32
/// plus n x k bytes of truth): up to `MAX_VALUES` scores by default. Past that bound it keeps a
/// systematic subsample, every 2^j-th sample in the order added (j grows by one each time the
/// bound is reached), so memory stays bounded; `LabelScores::ap_samples` says how many AP used.
#[derive(Debug, Clone)]
pub struct LabelAccum {
    k: usize,
    kind: ScoreKind,
    samples: u64,
    /// `[tp, fp, fn]` per label at the threshold.
    counts: Vec<[u64; 3]>,
    exact: u64,
    kept_scores: Vec<f32>,
    kept_truth: Vec<u8>,
    /// A sample is kept when its index is a multiple of this (a power of two).
    stride: u64,
    max_rows: usize,
}

impl LabelAccum {
    /// The default bound on kept scores: 200 MB of f32 plus 50 MB of truth.
    pub const MAX_VALUES: usize = 50_000_000;

    pub fn new(labels: usize, kind: ScoreKind) -> LabelAccum {
        Self::with_max_values(labels, kind, Self::MAX_VALUES)
    }

    /// An accumulator that keeps at most `max_values` scores (at least two samples' worth).
    pub fn with_max_values(labels: usize, kind: ScoreKind, max_values: usize) -> LabelAccum {
        LabelAccum {
            k: labels,
            kind,
            samples: 0,
            counts: vec![[0; 3]; labels],
            exact: 0,
            kept_scores: Vec::new(),
            kept_truth: Vec::new(),
            stride: 1,
            max_rows: (max_values / labels.max(1)).max(2),
        }
    }

    /// Adds a batch: `scores` and `truth` are [n, k] row-major, truth 0 or 1. A bad batch (wrong
    /// length, a truth other than 0/1) is an error and leaves the accumulator as it was.
    pub fn add(&mut self, scores: &[f32], truth: &[u8]) -> Result<()> {
        let k = self.k;
        if scores.len() != truth.len() || k == 0 || scores.len() % k != 0 {
            return Err(invalid(format!(
                "multi-label scores: {} scores and {} truths for {k} labels",
                scores.len(),
                truth.len()
            )));
        }
        if let Some(i) = truth.iter().position(|&t| t > 1) {
            return Err(invalid(format!(
                "multi-label truth of sample {} label {} is {}, not 0 or 1",
                i / k,
                i % k,
                truth[i]
            )));
        }
        let t = self.kind.threshold();
        for (s, y) in scores.chunks_exact(k).zip(truth.chunks_exact(k)) {
            let mut all = true;
            for (c, (&s, &y)) in self.counts.iter_mut().zip(s.iter().zip(y)) {
                let (p, y) = (s > t, y == 1);
                all &= p == y;
                match (p, y) {
                    (true, true) => c[0] += 1,
                    (true, false) => c[1] += 1,
                    (false, true) => c[2] += 1,
                    (false, false) => {}
                }
            }
            self.exact += all as u64;
            if self.samples % self.stride == 0 {
                self.kept_scores.extend_from_slice(s);
                self.kept_truth.extend_from_slice(y);
                if self.kept_truth.len() / k > self.max_rows {
                    self.halve();
                }
            }
            self.samples += 1;
        }
        Ok(())
    }

    /// Keeps every second kept sample (those whose index is a multiple of twice the stride).
    fn halve(&mut self) {
        let k = self.k;
        let rows = self.kept_truth.len() / k;
        for r in (0..rows).step_by(2) {
            let (from, to) = (r * k, (r / 2) * k);
            self.kept_scores.copy_within(from..from + k, to);
            self.kept_truth.copy_within(from..from + k, to);
        }
        let keep = rows.div_ceil(2) * k;
        self.kept_scores.truncate(keep);
        self.kept_truth.truncate(keep);
        self.stride *= 2;
    }

    /// The figures over everything added, with the labels' names.
    pub fn finish(&self, labels: &[String]) -> Result<LabelScores> {
        check_names("multi-label", labels, self.k)?;
        let k = self.k;
        let rows = self.kept_truth.len() / k.max(1);
        let mut pairs = Vec::with_capacity(rows);
        let ap: Vec<Option<f64>> = (0..k)
            .map(|j| {
                pairs.clear();
                let col = (0..rows)
                    .map(|r| (self.kept_scores[r * k + j], self.kept_truth[r * k + j] == 1));
                pairs.extend(col);
                ap_sorting(&mut pairs)
            })
            .collect();
        let f1: Vec<Option<f64>> = self
            .counts
            .iter()
            .map(|c| c.map(|v| v as f64))
            .map(|[tp, fp, fn_]| ratio(2.0 * tp, 2.0 * tp + fp + fn_))
            .collect();
        let sum = |i: usize| self.counts.iter().map(|c| c[i] as f64).sum::<f64>();
        let (tp, fp, fn_) = (sum(0), sum(1), sum(2));
        Ok(LabelScores {
            labels: labels.to_vec(),
            map: mean_defined(ap.iter().copied()),
            micro_f1: ratio(2.0 * tp, 2.0 * tp + fp + fn_),
            macro_f1: mean_defined(f1.iter().copied()),
            ap,
            f1,
            exact_match: ratio(self.exact as f64, self.samples as f64),
            samples: self.samples,
            ap_samples: rows as u64,
        })
    }
}

/// Multi-label figures of one evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabelScores {
    pub labels: Vec<String>,
    /// Average precision per label; `None` for a label without positives.
    pub ap: Vec<Option<f64>>,
    /// F1 per label at the threshold; `None` for a label neither predicted nor true anywhere
    /// (scikit-learn's `zero_division=np.nan`; its default would count it as 0).
    pub f1: Vec<Option<f64>>,
    /// Mean AP over labels with at least one positive.
    pub map: Option<f64>,
    /// F1 of the pooled counts of all labels.
    pub micro_f1: Option<f64>,
    /// Mean of the defined per-label F1.
    pub macro_f1: Option<f64>,
    /// Samples whose every label is predicted right, over all samples.
    pub exact_match: Option<f64>,
    pub samples: u64,
    /// Samples the AP was computed over (fewer than `samples` past `LabelAccum`'s bound).
    pub ap_samples: u64,
}

impl LabelScores {
    /// `mAP 0.873, micro F1 0.910, macro F1 0.880, exact match 0.620`.
    pub fn summary(&self) -> String {
        let sub = if self.ap_samples < self.samples {
            format!(" (AP over {} of {} samples)", self.ap_samples, self.samples)
        } else {
            String::new()
        };
        format!(
            "mAP {}{sub}, micro F1 {}, macro F1 {}, exact match {}",
            fixed(self.map, 3),
            fixed(self.micro_f1, 3),
            fixed(self.macro_f1, 3),
            fixed(self.exact_match, 3)
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Regression

/// Regression errors added a batch at a time in bounded memory (five f64 per target), with f64
/// sums and Welford's running mean and squared deviation of the targets for R2's SS_tot. Give it
/// predictions and targets in the targets' own units (undo any standardisation first).
#[derive(Debug, Clone, PartialEq)]
pub struct RegAccum {
    k: usize,
    n: u64,
    abs: Vec<f64>,
    sq: Vec<f64>,
    mean: Vec<f64>,
    m2: Vec<f64>,
}

impl RegAccum {
    pub fn new(targets: usize) -> RegAccum {
        RegAccum {
            k: targets,
            n: 0,
            abs: vec![0.0; targets],
            sq: vec![0.0; targets],
            mean: vec![0.0; targets],
            m2: vec![0.0; targets],
        }
    }

    /// Adds a batch of predictions and targets, [n, k] row-major.
    pub fn add(&mut self, pred: &[f32], target: &[f32]) -> Result<()> {
        let k = self.k;
        if pred.len() != target.len() || k == 0 || pred.len() % k != 0 {
            return Err(invalid(format!(
                "regression: {} predictions and {} targets for {k} targets",
                pred.len(),
                target.len()
            )));
        }
        for (p, y) in pred.chunks_exact(k).zip(target.chunks_exact(k)) {
            self.n += 1;
            let n = self.n as f64;
            for j in 0..k {
                let (p, y) = (p[j] as f64, y[j] as f64);
                let e = p - y;
                self.abs[j] += e.abs();
                self.sq[j] += e * e;
                let d = y - self.mean[j];
                self.mean[j] += d / n;
                self.m2[j] += d * (y - self.mean[j]);
            }
        }
        Ok(())
    }

    /// Adds another rank's accumulator (Chan et al.'s pairwise update of mean and M2).
    pub fn merge(&mut self, other: &RegAccum) -> Result<()> {
        if other.k != self.k {
            return Err(invalid(format!(
                "regression: merging {} targets into {}",
                other.k, self.k
            )));
        }
        let (na, nb) = (self.n as f64, other.n as f64);
        let n = na + nb;
        if other.n == 0 {
            return Ok(());
        }
        for j in 0..self.k {
            let d = other.mean[j] - self.mean[j];
            self.abs[j] += other.abs[j];
            self.sq[j] += other.sq[j];
            self.mean[j] += d * nb / n;
            self.m2[j] += other.m2[j] + d * d * na * nb / n;
        }
        self.n += other.n;
        Ok(())
    }

    pub fn finish(&self, names: &[String]) -> Result<RegScores> {
        check_names("regression", names, self.k)?;
        let n = self.n as f64;
        let mae: Vec<Option<f64>> = self.abs.iter().map(|&a| ratio(a, n)).collect();
        let rmse: Vec<Option<f64>> = self
            .sq
            .iter()
            .map(|&s| ratio(s, n).map(f64::sqrt))
            .collect();
        let r2: Vec<Option<f64>> = (0..self.k)
            .map(|j| ratio(self.sq[j], self.m2[j]).map(|f| 1.0 - f))
            .collect();
        Ok(RegScores {
            names: names.to_vec(),
            mean_mae: mean_defined(mae.iter().copied()),
            mean_rmse: mean_defined(rmse.iter().copied()),
            mean_r2: mean_defined(r2.iter().copied()),
            mae,
            rmse,
            r2,
            samples: self.n,
        })
    }
}

/// Regression figures of one evaluation, per target in its own units.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegScores {
    pub names: Vec<String>,
    /// `None` without samples.
    pub mae: Vec<Option<f64>>,
    pub rmse: Vec<Option<f64>>,
    /// 1 - SS_res / SS_tot; `None` when the targets are constant (SS_tot = 0) or absent.
    pub r2: Vec<Option<f64>>,
    /// Means over targets (of MAE and RMSE in mixed units when the targets' units differ).
    pub mean_mae: Option<f64>,
    pub mean_rmse: Option<f64>,
    /// Mean over targets with a defined R2.
    pub mean_r2: Option<f64>,
    pub samples: u64,
}

impl RegScores {
    /// `R2 0.970 (area 0.98, distractors 0.96), MAE (area 1.23, distractors 0.0456), RMSE (...)`:
    /// MAE and RMSE per target only, since their units differ.
    pub fn summary(&self) -> String {
        let r2 = self.r2.iter().map(|&v| fixed(v, 2));
        let mae = self.mae.iter().map(|&v| sig3(v));
        let rmse = self.rmse.iter().map(|&v| sig3(v));
        format!(
            "R2 {} {}, MAE {}, RMSE {}",
            fixed(self.mean_r2, 3),
            named_list(&self.names, r2),
            named_list(&self.names, mae),
            named_list(&self.names, rmse)
        )
    }
}

#[cfg(test)]
mod tests;
