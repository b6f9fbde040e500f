//! What a run reports: each epoch's figures (metrics.jsonl) and the summary (summary.json).

use super::*;

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EpochMetrics {
    pub epoch: usize,
    pub train_loss: f64,
    /// NaN (null in the file) where a task has no accuracy (values) or there is no test split.
    #[serde(deserialize_with = "null_as_nan")]
    pub train_accuracy: f64,
    #[serde(deserialize_with = "null_as_nan")]
    pub test_loss: f64,
    #[serde(deserialize_with = "null_as_nan")]
    pub test_accuracy: f64,
    /// A task other than classes: its headline on the test split (mean Dice, mAP or R2) and its
    /// scores in full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_score: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_scores: Option<serde_json::Value>,
    pub lr: f32,
    pub samples_per_sec: f64,
    pub seconds: f64,
    pub host_rss_bytes: u64,
    pub gpu_mem_bytes: u64,
    pub damaged_blocks_skipped: usize,
    /// Read from a store over a network: this epoch's requests, bytes and cache hits (its
    /// training and its test together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<StoreTraffic>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StoreTraffic {
    pub requests: u64,
    pub bytes: u64,
    pub cache_hits: u64,
}

impl StoreTraffic {
    /// The process's traffic so far (`store::remote::traffic`).
    pub fn now() -> Self {
        let (requests, bytes, cache_hits) = crate::store::remote::traffic();
        StoreTraffic {
            requests,
            bytes,
            cache_hits,
        }
    }

    /// What happened since `before`, or None where nothing was read from a store.
    pub fn since(self, before: StoreTraffic) -> Option<Self> {
        let d = StoreTraffic {
            requests: self.requests - before.requests,
            bytes: self.bytes - before.bytes,
            cache_hits: self.cache_hits - before.cache_hits,
        };
        (d.requests + d.cache_hits > 0).then_some(d)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    /// What the run learned: class, mask, labels or values.
    #[serde(default)]
    pub task: TaskKind,
    #[serde(deserialize_with = "null_as_nan")]
    pub test_accuracy: f64,
    #[serde(deserialize_with = "null_as_nan")]
    pub test_loss: f64,
    /// A task other than classes: the name of its headline figure, the figure and the scores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_score_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_score: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_scores: Option<serde_json::Value>,
    pub epochs: usize,
    pub samples_per_sec: f64,
    pub seconds: f64,
    pub peak_rss_bytes: u64,
    pub peak_gpu_mem_bytes: u64,
    pub device: String,
    /// The layout of the data trained on: shards or colmajor.
    pub layout: Layout,
    pub confusion: Vec<Vec<u64>>,
    pub classes: Vec<String>,
    /// Seconds from the process's start to its first training step (issue 24: what a run costs
    /// before it trains; 0 in files written before this field).
    #[serde(default)]
    pub startup_s: f64,
}

/// A figure written as null (serde_json writes NaN so) reads back as NaN, so that the lines
/// of a run without a test split, or of a task without an accuracy, are kept on `--resume`.
fn null_as_nan<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// "45 s", "14 min", "2.5 h".
pub(super) fn human_secs(s: f64) -> String {
    if s < 90.0 {
        format!("{s:.0} s")
    } else if s < 5400.0 {
        format!("{:.0} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

pub(super) fn rewrite_metrics(path: &Path, history: &[EpochMetrics]) -> Result<()> {
    let mut text = Vec::new();
    for m in history {
        writeln!(text, "{}", serde_json::to_string(m).unwrap()).unwrap();
    }
    write_atomic(path, &text)
}
