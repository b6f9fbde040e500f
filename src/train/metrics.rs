//! What a run reports: each epoch's figures (metrics.jsonl) and the summary (summary.json).

use super::*;

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EpochMetrics {
    pub epoch: usize,
    pub train_loss: f64,
    pub train_accuracy: f64,
    pub test_loss: f64,
    pub test_accuracy: f64,
    pub lr: f32,
    pub samples_per_sec: f64,
    pub seconds: f64,
    pub host_rss_bytes: u64,
    pub gpu_mem_bytes: u64,
    pub damaged_blocks_skipped: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    pub test_accuracy: f64,
    pub test_loss: f64,
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
