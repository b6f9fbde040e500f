// TEMPORARY stub (replaced by the scores branch at merge)
use serde::{Deserialize, Serialize};
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SegScores { pub mean_dice: Option<f64>, pub pixel_accuracy: Option<f64> }
impl SegScores { pub fn from_counts(_c: &[u64], _n: &[String]) -> Self { todo!() } pub fn summary(&self) -> String { todo!() } }
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LabelScores { pub map: Option<f64>, pub exact_match: Option<f64> }
impl LabelScores { pub fn summary(&self) -> String { todo!() } }
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RegressionScores { pub mean_r2: Option<f64> }
impl RegressionScores { pub fn summary(&self) -> String { todo!() } }
pub struct LabelAccumulator;
impl LabelAccumulator { pub fn new(_k: usize) -> Self { todo!() } pub fn add(&mut self, _a: &[f32], _b: &[f32]) -> crate::util::error::Result<()> { todo!() } pub fn finish(self, _n: &[String]) -> LabelScores { todo!() } }
pub struct RegressionAccumulator;
impl RegressionAccumulator { pub fn new(_k: usize) -> Self { todo!() } pub fn add(&mut self, _a: &[f32], _b: &[f32]) { todo!() } pub fn finish(self, _n: &[String]) -> RegressionScores { todo!() } }
