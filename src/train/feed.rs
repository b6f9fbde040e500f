//! Batches for a backend that takes them from the host: the CPU's, and the GPU's stream mode.

use super::recipe::Recipe;
use super::schedule::augmentation;
use super::*;

/// Batches from the host pipeline (`input::epoch`), normalised and augmented by the backend.
pub struct HostFeed {
    src: Arc<Source>,
    recipe: Recipe,
    on_damage: OnDamage,
    workers: usize,
    per_epoch: usize,
    epoch: usize,
    loader: Option<input::Loader>,
    damaged: Arc<Mutex<Vec<String>>>,
    share: Share,
    /// The trained field among the batch's fields (none for classes), and whether it is u16.
    field: Option<(usize, bool)>,
}

impl HostFeed {
    pub fn new(src: Arc<Source>, r: &Recipe, workers: usize) -> Result<Self> {
        let field = target_field(&src, r)?;
        Ok(HostFeed {
            field,
            share: Share::ALL,
            per_epoch: input::batches_per_epoch(src.samples, r.batch),
            src,
            recipe: r.clone(),
            on_damage: if r.skip_damaged {
                OnDamage::Skip
            } else {
                OnDamage::Stop
            },
            workers,
            epoch: 0,
            loader: None,
            damaged: Arc::new(Mutex::new(Vec::new())),
        })
    }

    /// Read only share `share` of each epoch (a data-parallel rank): `input::rank_batches` of it.
    pub fn for_rank(mut self, share: Share) -> Self {
        self.per_epoch =
            input::rank_batches(&self.src.block_sizes(), share.count, self.recipe.batch);
        self.share = share;
        self
    }
}

impl<B: Backend> Feed<B> for HostFeed {
    fn start(&mut self, _be: &mut B, epoch: usize, start: usize) -> Result<()> {
        self.loader = None;
        self.epoch = epoch;
        self.damaged = Arc::new(Mutex::new(Vec::new()));
        self.loader = Some(input::epoch_share(
            self.src.clone(),
            EpochPlan {
                batch: self.recipe.batch,
                seed: self.recipe.seed,
                epoch,
                start,
                shuffle: true,
                keep_partial: false,
                share: self.share,
            },
            self.on_damage,
            self.workers,
            None,
            self.damaged.clone(),
        ));
        Ok(())
    }

    fn next(&mut self, be: &mut B, model: &mut Model<B>) -> Result<Option<(usize, usize)>> {
        let Some(loader) = &self.loader else {
            return Ok(None);
        };
        let batch = match loader.rx.recv() {
            Ok(b) => b?,
            Err(_) => return Ok(None),
        };
        if batch.index >= self.per_epoch {
            self.loader = None;
            return Ok(None);
        }
        let r = &self.recipe;
        let n = batch.labels.len();
        let raw = RawBatch {
            pixels: &batch.pixels,
            dtype: self.src.spec.dtype,
            n,
            c: r.model.channels,
            h: r.model.height,
            w: r.model.width,
            labels: &batch.labels,
        };
        let (aug, pad) = if self.epoch < r.augment_epochs {
            (
                augmentation(r, self.epoch, self.share.batch_key(batch.index), n),
                r.crop_pad,
            )
        } else {
            (Vec::new(), 0)
        };
        model.load(be, &raw, &r.mean, &r.std, pad, &aug);
        if let Some((f, wide)) = self.field {
            r.task
                .load(be, model, Some(&batch.fields[f]), wide, n, pad, &aug);
        }
        loader.give_back(batch.pixels);
        Ok(Some((batch.index, n)))
    }

    fn damaged(&self) -> usize {
        self.damaged.lock().unwrap().len()
    }
}

/// The field a run trains on among `src`'s fields, and whether its values are u16.
pub(super) fn target_field(src: &Source, r: &Recipe) -> Result<Option<(usize, bool)>> {
    Ok(r.task
        .field_index(src)?
        .map(|f| (f, src.fields.0[f].dtype == Dtype::U16)))
}

/// The standard deviation a channel is divided by. u8/u16 statistics are of pixels in [0, 1]: a
/// floor of 1e-3 keeps a near-constant channel from blowing up. f16/f32 ones are in the data's own
/// units, where no fixed floor fits: only a zero (constant channel) or an f32 overflow becomes 1.
pub(super) fn norm_std(std: f64, dtype: Dtype) -> f32 {
    let s = std as f32;
    if !dtype.is_float() {
        s.max(1e-3)
    } else if s > 0.0 && s.is_finite() {
        s
    } else {
        1.0
    }
}

/// Where training batches come from and how they reach the backend: the host pipeline
/// (`HostFeed`, every backend) or, on CUDA, a dataset cached in GPU memory.
pub trait Feed<B: Backend> {
    /// Begin `epoch` at batch `start`.
    fn start(&mut self, be: &mut B, epoch: usize, start: usize) -> Result<()>;
    /// Put the next batch into the model's input and labels: `Some((batch index, samples))`, or
    /// `None` at the end of the epoch.
    fn next(&mut self, be: &mut B, model: &mut Model<B>) -> Result<Option<(usize, usize)>>;
    /// Damaged blocks skipped so far in this epoch.
    fn damaged(&self) -> usize;
}
