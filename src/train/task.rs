//! What a run learns (`--task`): the class, or one of the samples' fields (DESIGN.md, "Tasks"):
//! `mask` -> segmentation (per-pixel cross-entropy + soft Dice), `labels` -> multi-label (BCE with
//! logits), `values` -> regression (MSE or smooth L1 on standardised targets). The task follows
//! the dataset: its one trainable field, else the class; `--task` picks one where there are
//! several. Recorded in the recipe, so that `--resume` and `prep eval` train and score the same.

use super::*;
use crate::format::fields::{Field, FieldKind, FieldStats};
use crate::format::shard::Manifest;
use crate::nn::Objective;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskKind {
    #[default]
    Class,
    Mask,
    Labels,
    Values,
}

impl TaskKind {
    pub fn name(self) -> &'static str {
        match self {
            TaskKind::Class => "class",
            TaskKind::Mask => "mask",
            TaskKind::Labels => "labels",
            TaskKind::Values => "values",
        }
    }

    /// The model a run of this task trains unless `--model` says otherwise.
    pub fn default_model(self) -> &'static str {
        match self {
            TaskKind::Mask => "unet",
            _ => "small",
        }
    }
}

/// A mask value of this name (nnU-Net's convention) is left out of the loss and the scores.
pub const IGNORE_NAME: &str = "ignore";

/// The task of a run, as its recipe records it. Runs made before tasks existed learned classes.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Task {
    pub kind: TaskKind,
    /// The field trained on (none for classes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// What each output means: a mask's value names, the labels, the values (empty for classes,
    /// whose names are the recipe's `classes`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    /// A mask value left out of the loss and the scores (the one named `ignore`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore: Option<u32>,
    /// Weight of the soft Dice term beside the per-pixel cross-entropy (masks).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dice: f32,
    /// Values: smooth L1 (beta 1) instead of mean squared error.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub smooth_l1: bool,
    /// Values: each one's mean and standard deviation over the training split (from the
    /// manifest): the model learns (v - mean) / std, and scores are in the values' own units.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub value_mean: Vec<f32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub value_std: Vec<f32>,
}

fn is_zero(v: &f32) -> bool {
    *v == 0.0
}

/// The weight of the Dice term: nnU-Net's default, cross-entropy and Dice weighted alike.
pub const DICE_WEIGHT: f32 = 1.0;

impl Task {
    /// The task for `manifest`'s dataset: `--task` (a kind, or a field's name) or the one the
    /// data suggests. `classes` is the number of classes the data has.
    pub fn choose(
        arg: Option<&str>,
        manifest: Option<&Manifest>,
        data: &Path,
        loss: Option<&str>,
    ) -> Result<Task> {
        let fields: Vec<&Field> = manifest
            .map(|m| {
                m.fields
                    .iter()
                    .filter(|f| f.kind != FieldKind::Meta)
                    .collect()
            })
            .unwrap_or_default();
        let classes = manifest.map_or(0, |m| m.classes.len());
        let listed = || {
            let mut v = vec!["class".to_string()];
            v.extend(
                fields
                    .iter()
                    .map(|f| format!("{} ({})", f.name, f.kind.name())),
            );
            v.join(", ")
        };
        let field = match arg {
            Some("class") => None,
            Some(a) => {
                let hits: Vec<&&Field> = fields
                    .iter()
                    .filter(|f| f.name == a || f.kind.name() == a)
                    .collect();
                match hits.as_slice() {
                    [f] => Some(**f),
                    [] => {
                        return Err(Error::Invalid(format!(
                            "--task {a}: {} has no such field to train on; it has: {}",
                            shown_path(data),
                            listed()
                        )))
                    }
                    _ => {
                        return Err(Error::Invalid(format!(
                            "--task {a}: {} has several {a} fields; name one: {}",
                            shown_path(data),
                            listed()
                        )))
                    }
                }
            }
            None => match fields.as_slice() {
                [] => None,
                [f] => Some(*f),
                _ => {
                    return Err(Error::Invalid(format!(
                        "{} holds several targets; pick one with --task: {}",
                        shown_path(data),
                        listed()
                    )))
                }
            },
        };
        let Some(f) = field else {
            if classes == 1 && !fields.is_empty() {
                return Err(Error::Invalid(format!(
                    "--task class: {} has one class, so there is nothing to learn from it; train on a field instead: {}",
                    shown_path(data),
                    listed()
                )));
            }
            if loss.is_some_and(|l| l != "auto") {
                return Err(Error::Invalid(
                    "--loss applies to a values task; classes train with cross-entropy".into(),
                ));
            }
            return Ok(Task::default());
        };
        let m = manifest.expect("fields come from a manifest");
        Self::of_field(f, m, data, loss)
    }

    fn of_field(f: &Field, m: &Manifest, data: &Path, loss: Option<&str>) -> Result<Task> {
        let kind = match f.kind {
            FieldKind::Mask => TaskKind::Mask,
            FieldKind::Labels => TaskKind::Labels,
            FieldKind::Values => TaskKind::Values,
            FieldKind::Meta => unreachable!("meta fields are not offered"),
        };
        let image = &m.sample.shape.0;
        if kind == TaskKind::Mask && (image.len() != 3 || f.shape != image[1..]) {
            return Err(Error::Invalid(format!(
                "{}: its mask `{}` is {:?} for images of {}; a segmentation model takes 2-D masks of the image's height and width",
                shown_path(data),
                f.name,
                f.shape,
                m.sample.shape
            )));
        }
        let smooth_l1 = match (kind, loss) {
            (_, None | Some("auto")) => false,
            (TaskKind::Values, Some("mse")) => false,
            (TaskKind::Values, Some("smooth-l1")) => true,
            (_, Some(l)) => {
                return Err(Error::Invalid(format!(
                    "--loss {l} applies to a values task (mse or smooth-l1); {} trains with {}",
                    kind.name(),
                    if kind == TaskKind::Mask {
                        "cross-entropy + Dice"
                    } else {
                        "binary cross-entropy"
                    }
                )))
            }
        };
        let mut t = Task {
            kind,
            field: Some(f.name.clone()),
            names: f.names.clone(),
            ignore: None,
            dice: 0.0,
            smooth_l1,
            value_mean: Vec::new(),
            value_std: Vec::new(),
        };
        match kind {
            TaskKind::Mask => {
                t.dice = DICE_WEIGHT;
                t.ignore = f
                    .names
                    .iter()
                    .position(|n| n.eq_ignore_ascii_case(IGNORE_NAME))
                    .map(|i| i as u32);
                if f.names.len() < 2 {
                    return Err(Error::Invalid(format!(
                        "{}: its mask `{}` names {} value(s); segmentation needs a background and at least one class",
                        shown_path(data),
                        f.name,
                        f.names.len()
                    )));
                }
            }
            TaskKind::Values => {
                let stats = train_stats(m, &f.name);
                let n = m.splits.get("train").map_or(0, |s| s.samples) as f64;
                for j in 0..f.names.len() {
                    let (mean, std) = match stats {
                        Some(s) if n > 0.0 => {
                            let mean = s.sum[j] / n;
                            let var = (s.sumsq[j] / n - mean * mean).max(0.0);
                            (mean, var.sqrt())
                        }
                        _ => (0.0, 1.0),
                    };
                    t.value_mean.push(mean as f32);
                    // A constant value is learned as its offset from the mean.
                    let std = std as f32;
                    t.value_std.push(if std > 0.0 && std.is_finite() {
                        std
                    } else {
                        1.0
                    });
                }
            }
            _ => {}
        }
        Ok(t)
    }

    /// Outputs of the model: classes, mask values, labels or values.
    pub fn outputs(&self, classes: usize) -> usize {
        match self.kind {
            TaskKind::Class => classes,
            _ => self.names.len(),
        }
    }

    /// The names of the model's outputs.
    pub fn output_names<'a>(&'a self, classes: &'a [String]) -> &'a [String] {
        match self.kind {
            TaskKind::Class => classes,
            _ => &self.names,
        }
    }

    /// Peak learning rate unless `--lr` says otherwise: the model's, and for values a 24th of
    /// it. Squared errors of unbounded targets take larger steps than a softmax's bounded ones:
    /// `small` on synthetic areas (1x16x16, 4 epochs) reached R2 0.41 at 0.05 and 0.02 at 0.2,
    /// and diverged at its class rate of 1.2.
    pub fn default_lr(&self, model: &str) -> f32 {
        let lr = crate::nn::architecture::default_lr(model);
        match self.kind {
            TaskKind::Values => lr / 24.0,
            _ => lr,
        }
    }

    pub fn objective(&self) -> Objective {
        match self.kind {
            TaskKind::Class => Objective::Classes,
            TaskKind::Mask => Objective::Segment { dice: self.dice },
            TaskKind::Labels => Objective::Labels,
            TaskKind::Values => Objective::Values {
                smooth_l1: self.smooth_l1,
            },
        }
    }

    /// Whether `model` can learn this task: a per-pixel output for masks, one vector per sample
    /// for everything else.
    pub fn check_model(&self, model: &str) -> Result<()> {
        let dense = model == "unet";
        match (self.kind, dense) {
            (TaskKind::Mask, false) => Err(Error::Invalid(format!(
                "--model {model} gives one output per image; segmentation (--task mask) needs a per-pixel one: --model unet"
            ))),
            (TaskKind::Mask, true) => Ok(()),
            (k, true) => Err(Error::Invalid(format!(
                "--model unet gives a per-pixel output; --task {} needs one per image: --model small or resnet18",
                k.name()
            ))),
            _ => Ok(()),
        }
    }

    /// Index of the trained field among the source's fields.
    pub fn field_index(&self, src: &Source) -> Result<Option<usize>> {
        let Some(name) = &self.field else {
            return Ok(None);
        };
        src.fields
            .find(name)
            .map(Some)
            .ok_or_else(|| Error::Invalid(format!("the data has no field `{name}` to train on")))
    }

    /// Targets of a batch as f32, `[n, k]`: labels 0/1, values standardised. `bytes` holds the
    /// field's values of the batch's samples in order.
    pub fn host_targets(&self, bytes: &[u8], n: usize) -> Vec<f32> {
        let k = self.names.len();
        match self.kind {
            TaskKind::Labels => bytes[..n * k].iter().map(|&b| b as f32).collect(),
            TaskKind::Values => bytes[..4 * n * k]
                .chunks_exact(4)
                .enumerate()
                .map(|(i, b)| {
                    let v = f32::from_le_bytes(b.try_into().unwrap());
                    let j = i % k;
                    (v - self.value_mean[j]) / self.value_std[j]
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Put the batch's targets into `model.targets` (nothing for classes): masks cropped and
    /// flipped as their images (`aug`, `pad`), labels and values as `host_targets`.
    #[allow(clippy::too_many_arguments)]
    pub fn load<B: Backend>(
        &self,
        be: &mut B,
        model: &mut Model<B>,
        field: Option<&[u8]>,
        wide: bool,
        n: usize,
        pad: usize,
        aug: &[Aug],
    ) {
        let Some(bytes) = field else { return };
        match self.kind {
            TaskKind::Class => {}
            TaskKind::Mask => {
                let (_, h, w) = (model.cfg.channels, model.cfg.height, model.cfg.width);
                be.load_masks(
                    bytes,
                    wide,
                    n,
                    h,
                    w,
                    pad,
                    aug,
                    self.ignore,
                    &mut model.targets,
                )
            }
            TaskKind::Labels | TaskKind::Values => {
                be.load_targets(&self.host_targets(bytes, n), &mut model.targets)
            }
        }
    }
}

/// The training split's summary of field `name`.
fn train_stats<'a>(m: &'a Manifest, name: &str) -> Option<&'a FieldStats> {
    let i = m.fields.find(name)?;
    m.splits.get("train")?.fields.get(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_standardised_and_labels_kept() {
        let t = Task {
            kind: TaskKind::Values,
            names: vec!["a".into(), "b".into()],
            value_mean: vec![1.0, -2.0],
            value_std: vec![2.0, 0.5],
            ..Default::default()
        };
        let bytes: Vec<u8> = [3.0f32, -2.0, 1.0, -1.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(t.host_targets(&bytes, 2), [1.0, 0.0, 0.0, 2.0]);
        let l = Task {
            kind: TaskKind::Labels,
            names: vec!["x".into(), "y".into(), "z".into()],
            ..Default::default()
        };
        assert_eq!(
            l.host_targets(&[1, 0, 1, 0, 0, 1], 2),
            [1., 0., 1., 0., 0., 1.]
        );
    }

    #[test]
    fn models_fit_their_tasks() {
        let mask = Task {
            kind: TaskKind::Mask,
            ..Default::default()
        };
        assert!(mask.check_model("unet").is_ok());
        assert!(mask.check_model("small").is_err());
        let labels = Task {
            kind: TaskKind::Labels,
            ..Default::default()
        };
        assert!(labels.check_model("resnet18").is_ok());
        assert!(labels.check_model("unet").is_err());
        assert!(Task::default().check_model("unet").is_err());
    }
}
