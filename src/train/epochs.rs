//! The one loop for every backend: epochs of steps, checkpoints, evaluation and the summary.

use super::device::check_cpu_memory;
use super::eval::{evaluate, Tested};
use super::feed::Feed;
use super::feed::HostFeed;
use super::metrics::{human_secs, rewrite_metrics, EpochMetrics, StoreTraffic, Summary};
use super::recipe::Recipe;
use super::schedule::one_cycle;
use super::*;

/// What a training run needs besides the backend and its feed.
pub struct RunCtx<'a> {
    pub opts: &'a TrainOptions,
    pub dir: &'a Path,
    pub recipe: &'a Recipe,
    pub resume: Option<(Vec<(String, Vec<f32>)>, Cursor)>,
    pub train_src: Arc<Source>,
    pub test_src: Option<Arc<Source>>,
    pub per_epoch: usize,
    pub workers: usize,
    /// What the device and the input pipeline are, for the log and summary.json.
    pub device_desc: String,
    /// This rank's share of each epoch (`Share::ALL` for one process); rank 0 writes the run.
    pub share: Share,
}

pub(super) fn run(
    o: &TrainOptions,
    dir: &Path,
    r: &Recipe,
    resume: Option<(Vec<(String, Vec<f32>)>, Cursor)>,
    data: Data,
) -> Result<Trained> {
    let fields = r.task.kind != TaskKind::Class;
    let train_src = data.source_for("train", fields)?;
    let test_src = if data.has_split("test") {
        Some(data.source_for("test", fields)?)
    } else {
        if !o.quiet && o.world.as_ref().is_none_or(|w| w.rank == 0) {
            eprintln!(
                "{} has no test split: training without a test accuracy (prep convert --test-fraction F draws one)",
                crate::util::error::shown_path(&data.dir)
            );
        }
        None
    };
    if train_src
        .spec
        .shape
        .0
        .iter()
        .map(|&d| d as usize)
        .collect::<Vec<_>>()
        != [r.model.channels, r.model.height, r.model.width]
    {
        return Err(Error::Invalid(format!(
            "{}: its samples are {}, the run was made for {}x{}x{}",
            shown_path(&r.data),
            train_src.spec.shape,
            r.model.channels,
            r.model.height,
            r.model.width
        )));
    }
    let share = match &o.world {
        Some(w) => Share::new(w.rank, w.size)?,
        None => Share::ALL,
    };
    if share.count > 1 && r.device == "cpu" {
        return Err(Error::Invalid(format!(
            "the CPU backend trains in one process; a world of {} ranks needs a GPU for each (--device cuda)",
            share.count
        )));
    }
    let per_epoch = input::rank_batches(&train_src.block_sizes(), share.count, r.batch);
    if per_epoch == 0 {
        return Err(Error::Invalid(if share.count > 1 {
            format!(
                "the training split has {} samples in {} blocks, too few for {} ranks at --batch {} (per GPU): ranks share a split by whole blocks and each needs at least one batch; write the data with smaller blocks (--block-samples {} of synth or convert) or train on fewer GPUs",
                train_src.samples,
                train_src.num_blocks(),
                share.count,
                r.batch,
                r.batch
            )
        } else {
            format!(
                "the training split has {} samples, fewer than one batch of {}",
                train_src.samples, r.batch
            )
        }));
    }
    // Threads decoding blocks ahead: on the CPU two outpace any training step, and more would
    // only hold more blocks (the lookahead grows with them) as the thread count grows.
    let workers = if r.device == "cpu" {
        rayon::current_num_threads().min(2)
    } else {
        rayon::current_num_threads()
    };
    let ctx = RunCtx {
        opts: o,
        dir,
        recipe: r,
        resume,
        train_src: train_src.clone(),
        test_src,
        per_epoch,
        workers,
        device_desc: "cpu".into(),
        share,
    };
    if r.device == "cpu" {
        check_cpu_memory(r, train_src.spec.bytes())?;
        let feed = HostFeed::new(train_src, r, workers)?.for_rank(share);
        return run_on(Cpu::default(), Box::new(feed), ctx);
    }
    #[cfg(feature = "cuda")]
    {
        cuda::run(ctx)
    }
    #[cfg(not(feature = "cuda"))]
    Err(Error::Invalid(format!(
        "--device {}: this build of prep has no CUDA backend",
        r.device
    )))
}

/// The training loop, the same for every backend: build (or restore) the model, then epochs of
/// steps, each ended by testing, its metrics and a checkpoint, then the summary and plots.
pub fn run_on<B: Backend>(be: B, feed: Box<dyn Feed<B>>, ctx: RunCtx) -> Result<Trained> {
    let mut l = Loop::start(be, feed, ctx)?;
    while l.cur.epoch < l.r.epochs {
        let t_epoch = Instant::now();
        let Some(lr) = l.train_epoch()? else {
            // Stopped after `--stop-after` steps: the checkpoint is written.
            return Ok(l.trained(None));
        };
        l.end_epoch(lr, t_epoch)?;
    }
    l.finish()
}

/// A run in progress. Fields drop in order: the model and the feed's buffers before the backend.
struct Loop<'a, B: Backend> {
    model: Model<B>,
    feed: Box<dyn Feed<B>>,
    be: B,
    cur: Cursor,
    o: &'a TrainOptions,
    r: &'a Recipe,
    dir: &'a Path,
    /// Rank 0's alone (its figures are the ones written); the others go on to the next step,
    /// where NCCL holds them until rank 0 joins.
    test_src: Option<Arc<Source>>,
    per_epoch: usize,
    workers: usize,
    device_desc: String,
    share: Share,
    /// This process writes the run folder (rank 0; the one process of a plain run).
    writer: bool,
    /// metrics.jsonl, which keeps exactly the finished epochs.
    metrics_path: PathBuf,
    history: Vec<EpochMetrics>,
    ckpt: PathBuf,
    /// Steps and samples of this process (a resumed run counts from its resumption).
    steps_here: usize,
    seen_here: u64,
    peak_gpu: u64,
    /// The last epoch's test figures.
    last_eval: Option<Tested>,
    cpu_clock: Option<CpuClock>,
    t_start: Instant,
    startup_s: f64,
    /// Store traffic at the end of the last epoch.
    traffic: StoreTraffic,
}

impl<'a, B: Backend> Loop<'a, B> {
    fn start(mut be: B, feed: Box<dyn Feed<B>>, ctx: RunCtx<'a>) -> Result<Self> {
        let t_start = Instant::now();
        let RunCtx {
            opts: o,
            dir,
            recipe: r,
            resume,
            train_src: _,
            test_src,
            per_epoch,
            workers,
            device_desc,
            share,
        } = ctx;
        let writer = share.index == 0;
        let (model, cur) = match resume {
            Some((state, cur)) => {
                let mut m = Model::new(&mut be, r.model.clone(), &state);
                m.set_momentum(&mut be, &state);
                (m, cur)
            }
            None => (
                Model::new(&mut be, r.model.clone(), &init_values(&r.model, r.seed)),
                Cursor::default(),
            ),
        };
        let mut model = model;
        model.objective = r.task.objective();
        timing::mark("model built");
        let metrics_path = dir.join("metrics.jsonl");
        let history = read_history(&metrics_path, cur.epoch)?;
        if writer {
            rewrite_metrics(&metrics_path, &history)?;
        }
        // On the CPU a run can take many minutes: after a few seconds of steps, say how long it
        // will take and how to make it shorter (printed once).
        let cpu_clock = (device_desc == "cpu" && !o.quiet && writer).then(CpuClock::default);
        Ok(Loop {
            model,
            feed,
            be,
            cur,
            o,
            r,
            dir,
            test_src: test_src.filter(|_| writer),
            per_epoch,
            workers,
            device_desc,
            share,
            writer,
            metrics_path,
            peak_gpu: history.iter().map(|m| m.gpu_mem_bytes).max().unwrap_or(0),
            history,
            ckpt: dir.join(checkpoint::FILE),
            steps_here: 0,
            seen_here: 0,
            last_eval: None,
            cpu_clock,
            t_start,
            startup_s: f64::NAN,
            traffic: StoreTraffic::now(),
        })
    }

    /// The steps of the epoch in progress, from its next batch. Returns the last step's learning
    /// rate, or `None` when `--stop-after` ended the run here.
    fn train_epoch(&mut self) -> Result<Option<f32>> {
        let (r, per_epoch) = (self.r, self.per_epoch);
        let total_steps = per_epoch * r.epochs;
        let pb = crate::util::progress::bar(
            ((per_epoch - self.cur.batch) * r.batch) as u64,
            &format!("epoch {}", self.cur.epoch + 1),
            "samples",
            self.o.quiet,
        );
        self.feed
            .start(&mut self.be, self.cur.epoch, self.cur.batch)?;
        let mut lr = one_cycle(self.cur.step, total_steps, r.lr);
        let mut t_seg = Instant::now();
        // Host time waiting for batches and issuing the steps (PREP_PROFILE=1).
        let (mut t_feed, mut t_issue) = (0.0f64, 0.0f64);
        let mut t0 = Instant::now();
        if self.steps_here == 0 {
            self.startup_s = timing::since_start();
            timing::mark("first step begins");
        }
        loop {
            // An interruption (here, or seen by the input's threads) stops the run like
            // `stop_after`: a checkpoint of the steps done so far, then the error.
            let next = match crate::util::interrupt::check()
                .and_then(|()| self.feed.next(&mut self.be, &mut self.model))
            {
                Err(e) if e.is_interrupted() => {
                    if self.steps_here > 0 {
                        self.flush(t_seg)?;
                        self.save()?;
                    }
                    return Err(e);
                }
                r => r?,
            };
            let Some((index, n)) = next else { break };
            let t1 = Instant::now();
            t_feed += (t1 - t0).as_secs_f64();
            lr = one_cycle(self.cur.step, total_steps, r.lr);
            self.step(n, lr);
            t0 = Instant::now();
            t_issue += (t0 - t1).as_secs_f64();
            if self.steps_here == 0 && timing::enabled() {
                // Waits for the GPU (only with PREP_TIMING), so the mark says when it finished.
                self.be.gpu_mem_bytes();
                timing::mark("first step done");
            }
            self.cur.step += 1;
            self.cur.batch = index + 1;
            self.cur.seen += n as u64;
            self.cur.pixels += self.image_pixels(index, n);
            pb.inc(n as u64);
            self.steps_here += 1;
            self.seen_here += n as u64;
            if let Some(line) = self.cpu_estimate() {
                pb.suspend(|| eprintln!("{line}"));
            }
            let stop = self.o.stop_after == Some(self.steps_here);
            let every = r.checkpoint_every;
            if stop || (every > 0 && self.cur.step % every == 0 && self.cur.batch < per_epoch) {
                self.flush(t_seg)?;
                self.save()?;
                t_seg = Instant::now();
            }
            if stop {
                return Ok(None);
            }
        }
        self.flush(t_seg)?;
        if self.share.count > 1 && self.cur.batch < per_epoch {
            // The others would wait for this rank's next step for ever.
            return Err(Error::Source(format!(
                "rank {}: its share of epoch {} ran out after {} of its {per_epoch} batches (damaged blocks were skipped); with several GPUs every rank must take the same steps: repair the data (prep verify names the blocks)",
                self.share.index,
                self.cur.epoch + 1,
                self.cur.batch
            )));
        }
        if std::env::var("PREP_PROFILE").as_deref() == Ok("1") {
            eprintln!(
                "host time this epoch: {t_feed:.3} s getting batches, {t_issue:.3} s issuing steps, {:.3} s training in all",
                self.cur.train_seconds
            );
        }
        pb.finish_and_clear();
        Ok(Some(lr))
    }

    /// One training step of `n` samples. The first step of a process runs directly (it sizes the
    /// buffers and picks the convolution algorithms); the backend may record the next one as a
    /// graph and replay it for every later step of this batch size.
    fn step(&mut self, n: usize, lr: f32) {
        let (r, be, model) = (self.r, &mut self.be, &mut self.model);
        let full = n == r.batch;
        if full && self.steps_here > 0 && be.replay(lr) {
            return;
        }
        let recording = full && self.steps_here > 0 && be.begin_capture();
        let (sm, mo, wd) = (r.label_smoothing, r.momentum, r.weight_decay);
        model.train_step(be, n, sm, lr, mo, wd);
        if recording {
            if be.end_capture() {
                be.replay(lr);
            } else {
                model.train_step(be, n, sm, lr, mo, wd);
            }
        }
    }

    /// Pixels of batch `index`'s masks that lie inside their images after the crop (a mask
    /// task's training accuracy is of these); 0 for other tasks.
    fn image_pixels(&self, index: usize, n: usize) -> u64 {
        let (r, m) = (self.r, &self.r.model);
        if r.task.kind != TaskKind::Mask {
            return 0;
        }
        let (h, w) = (m.height as i64, m.width as i64);
        if self.cur.epoch >= r.augment_epochs {
            return (n as i64 * h * w) as u64;
        }
        let pad = r.crop_pad as i64;
        augmentation(r, self.cur.epoch, self.share.batch_key(index), n)
            .iter()
            .map(|a| {
                let inside = |d: u8, len: i64| (len - (d as i64 - pad).abs()).max(0);
                (inside(a.dy, h) * inside(a.dx, w)) as u64
            })
            .sum()
    }

    /// Loss figures stay on the device between these points, so that no step waits for one.
    fn flush(&mut self, t_seg: Instant) -> Result<()> {
        let (loss, correct) = self.be.take_loss_stats();
        self.be.status().map_err(Error::Device)?;
        let cur = &mut self.cur;
        cur.train_seconds += t_seg.elapsed().as_secs_f64();
        cur.loss_sum += loss;
        cur.correct += correct;
        if !cur.loss_sum.is_finite() {
            return Err(Error::Invalid(format!(
                "the loss became {} at epoch {} step {}: lower --lr",
                cur.loss_sum,
                cur.epoch + 1,
                cur.step
            )));
        }
        Ok(())
    }

    fn save(&mut self) -> Result<()> {
        save_state(
            self.writer,
            &self.ckpt,
            &self.model,
            &mut self.be,
            &self.cur,
        )
    }

    /// After 3 s of CPU steps, the time the run still needs, once, where it is a minute or more.
    fn cpu_estimate(&mut self) -> Option<String> {
        let clock = self.cpu_clock.as_mut()?;
        let Some((since, from)) = clock.from else {
            // The first step sizes buffers: time from after it.
            clock.from = Some((Instant::now(), self.seen_here));
            return None;
        };
        if since.elapsed().as_secs_f64() < 3.0 {
            return None;
        }
        self.cpu_clock = None;
        let (r, per_epoch, epoch) = (self.r, self.per_epoch, self.cur.epoch);
        let rate = (self.seen_here - from) as f64 / since.elapsed().as_secs_f64();
        let left_this = (per_epoch - self.cur.batch) * r.batch;
        let left = left_this + (r.epochs - epoch - 1) * per_epoch * r.batch;
        let test = self.test_src.as_ref().map_or(0, |t| t.samples);
        // Testing runs forward only: about a third of a training step's time.
        let secs = |train: usize, epochs: usize| {
            (train as f64 + (epochs * test) as f64 / 3.0) / rate.max(1e-9)
        };
        let total = secs(left, r.epochs - epoch);
        if total < 60.0 {
            return None;
        }
        let one = secs(per_epoch * r.batch, 1);
        let fewer = if r.epochs - epoch > 2 {
            format!("--epochs 2 (about {}), or ", human_secs(2.0 * one))
        } else {
            String::new()
        };
        Some(format!(
            "on the CPU at {:.0} samples/s this run needs about {} more ({} epochs); for a quicker one: {fewer}a machine with a GPU",
            rate,
            human_secs(total),
            r.epochs - epoch,
        ))
    }

    /// Test, log and keep the finished epoch's metrics, and checkpoint at its end.
    fn end_epoch(&mut self, lr: f32, t_epoch: Instant) -> Result<()> {
        let epoch = self.cur.epoch;
        let skipped = self.feed.damaged();
        let gpu_mem = self.be.gpu_mem_bytes();
        self.peak_gpu = self.peak_gpu.max(gpu_mem);
        let tested = match self.test() {
            // The epoch's training is done: keep it, and test again on --resume.
            Err(e) if e.is_interrupted() => {
                self.save()?;
                return Err(e);
            }
            r => r?,
        };
        let cur = &self.cur;
        let m = EpochMetrics {
            epoch: epoch + 1,
            train_loss: cur.loss_sum / cur.seen.max(1) as f64,
            train_accuracy: train_accuracy(self.r, cur),
            test_loss: tested.loss,
            test_accuracy: tested.accuracy,
            test_score: tested.scores.as_ref().map(|s| s.headline().1),
            test_scores: tested
                .scores
                .as_ref()
                .map(|s| serde_json::to_value(s).expect("serialises")),
            lr,
            // The world's rate: the ranks step together, each on its own batch.
            samples_per_sec: (cur.seen * self.share.count as u64) as f64
                / cur.train_seconds.max(1e-9),
            seconds: t_epoch.elapsed().as_secs_f64(),
            host_rss_bytes: crate::util::mem::rss_bytes(),
            gpu_mem_bytes: gpu_mem,
            damaged_blocks_skipped: skipped,
            store: StoreTraffic::now().since(self.traffic),
        };
        self.traffic = StoreTraffic::now();
        if !self.o.quiet {
            eprintln!("{}", epoch_line(&m, self.r.epochs, &tested));
        }
        self.history.push(m);
        if self.writer {
            rewrite_metrics(&self.metrics_path, &self.history)?;
        }
        self.cur = Cursor {
            epoch: epoch + 1,
            batch: 0,
            step: self.cur.step,
            ..Default::default()
        };
        self.save()?;
        timing::mark(&format!("epoch {} done", epoch + 1));
        self.last_eval = Some(tested);
        Ok(())
    }

    fn test(&mut self) -> Result<Tested> {
        match &self.test_src {
            Some(t) => evaluate(
                &mut self.be,
                &mut self.model,
                self.r,
                t.clone(),
                self.workers,
            ),
            None => Ok(Tested {
                loss: f64::NAN,
                accuracy: f64::NAN,
                ..Default::default()
            }),
        }
    }

    fn trained(&self, summary: Option<Summary>) -> Trained {
        Trained {
            dir: self.dir.to_path_buf(),
            summary,
        }
    }

    /// summary.json, the curves and the confusion matrix (the writing rank only).
    fn finish(mut self) -> Result<Trained> {
        if !self.writer {
            return Ok(self.trained(None));
        }
        let tested = match self.last_eval.take() {
            Some(e) => e,
            // A resumed run that had finished its epochs.
            None => self.test()?,
        };
        let (r, history) = (self.r, &self.history);
        let train_secs: f64 = history.iter().map(|m| m.seconds).sum();
        let sps =
            history.iter().map(|m| m.samples_per_sec).sum::<f64>() / history.len().max(1) as f64;
        let headline = tested.scores.as_ref().map(|s| s.headline());
        let summary = Summary {
            task: r.task.kind,
            test_accuracy: tested.accuracy,
            test_loss: tested.loss,
            test_score_name: headline.map(|h| h.0.to_string()),
            test_score: headline.map(|h| h.1),
            test_scores: tested
                .scores
                .as_ref()
                .map(|s| serde_json::to_value(s).expect("serialises")),
            epochs: r.epochs,
            samples_per_sec: sps,
            seconds: train_secs.max(self.t_start.elapsed().as_secs_f64()),
            peak_rss_bytes: crate::util::mem::peak_rss_bytes(),
            peak_gpu_mem_bytes: self.peak_gpu,
            device: self.device_desc.clone(),
            layout: r.layout,
            confusion: tested.confusion.clone(),
            classes: r.task.output_names(&r.classes).to_vec(),
            startup_s: self.startup_s,
        };
        write_results(self.dir, &summary, history, &tested.shown, r)?;
        Ok(self.trained(Some(summary)))
    }
}

/// Rate of CPU steps from after the first one (`cpu_estimate`).
#[derive(Default)]
struct CpuClock {
    from: Option<(Instant, u64)>,
}

/// The finished epochs of a run folder's metrics log (a killed run may have written more).
fn read_history(path: &Path, epochs: usize) -> Result<Vec<EpochMetrics>> {
    let local =
        crate::store::local::read_capped(path, crate::store::local::JSON_CAP, "a metrics log");
    let text = match local {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        // A run killed before its first epoch has none.
        Err(_) if !path.exists() => String::new(),
        Err(e) => return Err(e),
    };
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .take(epochs)
        .collect())
}

/// The training accuracy of the epoch in progress: of samples (classes; labels: every label
/// right), of the pixels inside the images (masks); none for values.
fn train_accuracy(r: &Recipe, cur: &Cursor) -> f64 {
    let seen = cur.seen.max(1) as f64;
    match r.task.kind {
        TaskKind::Values => f64::NAN,
        TaskKind::Mask => cur.correct as f64 / cur.pixels.max(1) as f64,
        _ => cur.correct as f64 / seen,
    }
}

/// The epoch's line on stderr.
fn epoch_line(m: &EpochMetrics, epochs: usize, tested: &Tested) -> String {
    let human = crate::util::mem::human;
    let gpu = if m.gpu_mem_bytes > 0 {
        format!(" | GPU {}", human(m.gpu_mem_bytes))
    } else {
        String::new()
    };
    let train = if m.train_accuracy.is_nan() {
        format!("train loss {:.4}", m.train_loss)
    } else {
        format!("train loss {:.4} acc {:.4}", m.train_loss, m.train_accuracy)
    };
    let test = match &tested.scores {
        _ if m.test_loss.is_nan() => "no test split".to_string(),
        Some(s) => format!("test loss {:.4} {}", m.test_loss, s.summary()),
        None => format!("test loss {:.4} acc {:.4}", m.test_loss, m.test_accuracy),
    };
    format!(
        "epoch {:>3}/{}: {train} | {test} | {:.0} samples/s | {:.1} s | RSS {}{gpu}",
        m.epoch,
        epochs,
        m.samples_per_sec,
        m.seconds,
        human(m.host_rss_bytes)
    )
}

/// summary.json, curves.png and, with a test split, confusion.png and confusion.csv (classes)
/// or masks.png (a grid of predicted masks).
fn write_results(
    dir: &Path,
    summary: &Summary,
    history: &[EpochMetrics],
    shown: &[super::eval::Shown],
    r: &Recipe,
) -> Result<()> {
    write_atomic(
        &dir.join("summary.json"),
        serde_json::to_string_pretty(summary).unwrap().as_bytes(),
    )?;
    let points: Vec<plot::EpochPoint> = history
        .iter()
        .map(|m| plot::EpochPoint {
            epoch: m.epoch,
            train_loss: m.train_loss,
            test_loss: m.test_loss,
            train_accuracy: m.train_accuracy,
            test_accuracy: m.test_accuracy,
        })
        .collect();
    timing::mark("summary written");
    let panel = metric_panel(summary, history);
    plot::curves_with_png(&points, panel.as_ref(), &dir.join("curves.png"))?;
    let (confusion, classes) = (&summary.confusion, &summary.classes);
    if !confusion.is_empty() {
        plot::confusion_png(confusion, classes, &dir.join("confusion.png"))?;
        let mut csv = format!("true\\predicted,{}\n", classes.join(","));
        for (k, row) in confusion.iter().enumerate() {
            let row: Vec<String> = row.iter().map(|v| v.to_string()).collect();
            csv.push_str(&format!("{},{}\n", classes[k], row.join(",")));
        }
        write_atomic(&dir.join("confusion.csv"), csv.as_bytes())?;
    }
    if !shown.is_empty() {
        let m = &r.model;
        let (images, truth, pred) = (
            shown
                .iter()
                .flat_map(|s| s.image.iter().copied())
                .collect::<Vec<_>>(),
            shown
                .iter()
                .flat_map(|s| s.truth.iter().copied())
                .collect::<Vec<_>>(),
            shown
                .iter()
                .flat_map(|s| s.predicted.iter().copied())
                .collect::<Vec<_>>(),
        );
        let grid = super::plot_masks::MaskGrid {
            images: &images,
            truth: &truth,
            pred: &pred,
            shape: [m.channels, m.height, m.width],
            classes,
            background: Some(0),
        };
        super::plot_masks::masks_png(&grid, &dir.join("masks.png"))?;
    }
    timing::mark("plots written");
    Ok(())
}

/// The task's panel of curves.png: its headline per epoch on the test split and, for masks and
/// labels, each class's or label's figure beside it (none for classes).
fn metric_panel(summary: &Summary, history: &[EpochMetrics]) -> Option<plot::MetricPanel> {
    let name = summary.test_score_name.clone()?;
    let mut series = vec![plot::Series {
        name: format!("test {name}"),
        values: history
            .iter()
            .map(|m| m.test_score.unwrap_or(f64::NAN))
            .collect(),
    }];
    // Per class (Dice) or label (AP), from each epoch's scores as written.
    let per = match summary.task {
        TaskKind::Mask => Some(("dice", "classes", 1)),
        TaskKind::Labels => Some(("ap", "labels", 0)),
        _ => None,
    };
    if let Some((key, names_key, first)) = per {
        let names: Vec<String> = summary
            .test_scores
            .as_ref()
            .and_then(|v| serde_json::from_value(v[names_key].clone()).ok())
            .unwrap_or_default();
        for (j, n) in names.iter().enumerate().skip(first) {
            let values = history
                .iter()
                .map(|m| {
                    m.test_scores
                        .as_ref()
                        .and_then(|v| v[key][j].as_f64())
                        .unwrap_or(f64::NAN)
                })
                .collect();
            series.push(plot::Series {
                name: n.clone(),
                values,
            });
        }
    }
    Some(plot::MetricPanel {
        title: name,
        series,
        unit: summary.task != TaskKind::Values,
        with_accuracy: summary.task != TaskKind::Values,
    })
}

/// A checkpoint, written by the writing rank only (rank 0; the one process of a plain run).
pub(super) fn save_state<B: Backend>(
    writer: bool,
    path: &Path,
    model: &Model<B>,
    be: &mut B,
    cur: &Cursor,
) -> Result<()> {
    if writer {
        checkpoint::save(path, &model.state(be), cur)
    } else {
        Ok(())
    }
}
