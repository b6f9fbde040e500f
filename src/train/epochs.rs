//! The one loop for every backend: epochs of steps, checkpoints, evaluation and the summary.

use super::device::check_cpu_memory;
use super::eval::evaluate;
use super::feed::Feed;
use super::feed::HostFeed;
use super::metrics::{human_secs, rewrite_metrics, EpochMetrics, Summary};
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
    let train_src = data.source("train")?;
    let test_src = if data.has_split("test") {
        Some(data.source("test")?)
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
                "the training split has {} samples in {} blocks, too few for {} ranks at --batch {} (per GPU): each rank needs at least one batch from its share of the blocks",
                train_src.samples,
                train_src.num_blocks(),
                share.count,
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
        let feed = HostFeed::new(train_src, r, workers).for_rank(share);
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

/// The training loop, the same for every backend.
pub fn run_on<B: Backend>(be: B, feed: Box<dyn Feed<B>>, ctx: RunCtx) -> Result<Trained> {
    let t_start = Instant::now();
    let mut startup_s = f64::NAN;
    // Locals drop in reverse order: the model and the feed's buffers before the backend.
    let mut be = be;
    let mut feed = feed;
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
    // Rank 0 alone evaluates (its figures are the ones written); the others go on to the next
    // step, where NCCL holds them until rank 0 joins.
    let test_src = test_src.filter(|_| writer);
    let total_steps = per_epoch * r.epochs;
    let (mut model, mut cur) = match resume {
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
    timing::mark("model built");
    // metrics.jsonl keeps exactly the finished epochs (a killed run may have written no more).
    let metrics_path = dir.join("metrics.jsonl");
    let mut history: Vec<EpochMetrics> = match crate::store::local::read_capped(
        &metrics_path,
        crate::store::local::JSON_CAP,
        "a metrics log",
    ) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        // A run killed before its first epoch has none.
        Err(_) if !metrics_path.exists() => String::new(),
        Err(e) => return Err(e),
    }
    .lines()
    .filter_map(|l| serde_json::from_str(l).ok())
    .take(cur.epoch)
    .collect();
    if writer {
        rewrite_metrics(&metrics_path, &history)?;
    }
    let ckpt = dir.join(checkpoint::FILE);
    let mut steps_here = 0;
    let mut peak_gpu = history.iter().map(|m| m.gpu_mem_bytes).max().unwrap_or(0);
    let mut last_eval: Option<(f64, f64, Vec<Vec<u64>>)> = None;
    // On the CPU a run can take many minutes: after a few seconds of steps, say how long it will
    // take and how to make it shorter (printed once).
    let mut cpu_clock: Option<(Instant, u64)> =
        (device_desc == "cpu" && !o.quiet && writer).then(|| (Instant::now(), 0));
    let mut seen_here = 0u64;
    // Loss figures stay on the device between these points, so that no step waits for one.
    let flush = |be: &mut B, cur: &mut Cursor, t_seg: Instant| -> Result<()> {
        let (loss, correct) = be.take_loss_stats();
        be.status().map_err(Error::Device)?;
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
    };
    while cur.epoch < r.epochs {
        let epoch = cur.epoch;
        let t_epoch = Instant::now();
        let pb = crate::util::progress::bar(
            ((per_epoch - cur.batch) * r.batch) as u64,
            &format!("epoch {}", epoch + 1),
            "samples",
            o.quiet,
        );
        feed.start(&mut be, epoch, cur.batch)?;
        let mut lr = one_cycle(cur.step, total_steps, r.lr);
        let mut t_seg = Instant::now();
        // Host time waiting for batches and issuing the steps (PREP_PROFILE=1).
        let (mut t_feed, mut t_issue) = (0.0f64, 0.0f64);
        let mut t0 = Instant::now();
        if steps_here == 0 {
            startup_s = timing::since_start();
            timing::mark("first step begins");
        }
        loop {
            // An interruption (here, or seen by the input's threads) stops the run like
            // `stop_after`: a checkpoint of the steps done so far, then the error.
            let next = match crate::util::interrupt::check()
                .and_then(|()| feed.next(&mut be, &mut model))
            {
                Err(e) if e.is_interrupted() => {
                    if steps_here > 0 {
                        flush(&mut be, &mut cur, t_seg)?;
                        save_state(writer, &ckpt, &model, &mut be, &cur)?;
                    }
                    return Err(e);
                }
                r => r?,
            };
            let Some((index, n)) = next else { break };
            let t1 = Instant::now();
            t_feed += (t1 - t0).as_secs_f64();
            lr = one_cycle(cur.step, total_steps, r.lr);
            // The first step of a process runs directly (it sizes the buffers and picks the
            // convolution algorithms); the backend may record the next one as a graph and replay
            // it for every later step of this batch size.
            let full = n == r.batch;
            if !(full && steps_here > 0 && be.replay(lr)) {
                let recording = full && steps_here > 0 && be.begin_capture();
                let (sm, mo, wd) = (r.label_smoothing, r.momentum, r.weight_decay);
                model.train_step(&mut be, n, sm, lr, mo, wd);
                if recording {
                    if be.end_capture() {
                        be.replay(lr);
                    } else {
                        model.train_step(&mut be, n, sm, lr, mo, wd);
                    }
                }
            }
            t0 = Instant::now();
            t_issue += (t0 - t1).as_secs_f64();
            if steps_here == 0 && timing::enabled() {
                // Waits for the GPU (only with PREP_TIMING), so the mark says when it finished.
                be.gpu_mem_bytes();
                timing::mark("first step done");
            }
            cur.step += 1;
            cur.batch = index + 1;
            cur.seen += n as u64;
            pb.inc(n as u64);
            steps_here += 1;
            seen_here += n as u64;
            if let Some((since, from)) = cpu_clock {
                if steps_here == 1 {
                    // The first step sizes buffers: time from after it.
                    cpu_clock = Some((Instant::now(), seen_here));
                } else if since.elapsed().as_secs_f64() >= 3.0 {
                    let rate = (seen_here - from) as f64 / since.elapsed().as_secs_f64();
                    let left_this = (per_epoch - cur.batch) * r.batch;
                    let left = left_this + (r.epochs - epoch - 1) * per_epoch * r.batch;
                    let test = test_src.as_ref().map_or(0, |t| t.samples);
                    // Testing runs forward only: about a third of a training step's time.
                    let secs = |train: usize, epochs: usize| {
                        (train as f64 + (epochs * test) as f64 / 3.0) / rate.max(1e-9)
                    };
                    let total = secs(left, r.epochs - epoch);
                    if total >= 60.0 {
                        let one = secs(per_epoch * r.batch, 1);
                        let fewer = if r.epochs - epoch > 2 {
                            format!("--epochs 2 (about {}), or ", human_secs(2.0 * one))
                        } else {
                            String::new()
                        };
                        let line = format!(
                            "on the CPU at {:.0} samples/s this run needs about {} more ({} epochs); for a quicker one: {fewer}a machine with a GPU",
                            rate,
                            human_secs(total),
                            r.epochs - epoch,
                        );
                        pb.suspend(|| eprintln!("{line}"));
                    }
                    cpu_clock = None;
                }
            }
            let stop = o.stop_after == Some(steps_here);
            if stop
                || (r.checkpoint_every > 0
                    && cur.step % r.checkpoint_every == 0
                    && cur.batch < per_epoch)
            {
                flush(&mut be, &mut cur, t_seg)?;
                save_state(writer, &ckpt, &model, &mut be, &cur)?;
                t_seg = Instant::now();
            }
            if stop {
                return Ok(Trained {
                    dir: dir.to_path_buf(),
                    summary: None,
                });
            }
        }
        flush(&mut be, &mut cur, t_seg)?;
        if share.count > 1 && cur.batch < per_epoch {
            // The others would wait for this rank's next step for ever.
            return Err(Error::Source(format!(
                "rank {}: its share of epoch {} ran out after {} of its {per_epoch} batches (damaged blocks were skipped); with several GPUs every rank must take the same steps: repair the data (prep verify names the blocks)",
                share.index,
                epoch + 1,
                cur.batch
            )));
        }
        if std::env::var("PREP_PROFILE").as_deref() == Ok("1") {
            eprintln!(
                "host time this epoch: {t_feed:.3} s getting batches, {t_issue:.3} s issuing steps, {:.3} s training in all",
                cur.train_seconds
            );
        }
        let skipped = feed.damaged();
        pb.finish_and_clear();
        let gpu_mem = be.gpu_mem_bytes();
        peak_gpu = peak_gpu.max(gpu_mem);
        let (test_loss, test_acc, confusion) = match &test_src {
            Some(t) => match evaluate(&mut be, &mut model, r, t.clone(), workers) {
                // The epoch's training is done: keep it, and test again on --resume.
                Err(e) if e.is_interrupted() => {
                    save_state(writer, &ckpt, &model, &mut be, &cur)?;
                    return Err(e);
                }
                r => r?,
            },
            None => (f64::NAN, f64::NAN, vec![]),
        };
        let m = EpochMetrics {
            epoch: epoch + 1,
            train_loss: cur.loss_sum / cur.seen.max(1) as f64,
            train_accuracy: cur.correct as f64 / cur.seen.max(1) as f64,
            test_loss,
            test_accuracy: test_acc,
            lr,
            // The world's rate: the ranks step together, each on its own batch.
            samples_per_sec: (cur.seen * share.count as u64) as f64 / cur.train_seconds.max(1e-9),
            seconds: t_epoch.elapsed().as_secs_f64(),
            host_rss_bytes: crate::util::mem::rss_bytes(),
            gpu_mem_bytes: gpu_mem,
            damaged_blocks_skipped: skipped,
        };
        if !o.quiet {
            let gpu = if gpu_mem > 0 {
                format!(" | GPU {}", crate::util::mem::human(gpu_mem))
            } else {
                String::new()
            };
            let test = if m.test_accuracy.is_nan() {
                "no test split".to_string()
            } else {
                format!("test loss {:.4} acc {:.4}", m.test_loss, m.test_accuracy)
            };
            eprintln!(
                "epoch {:>3}/{}: train loss {:.4} acc {:.4} | {test} | {:.0} samples/s | {:.1} s | RSS {}{gpu}",
                m.epoch, r.epochs, m.train_loss, m.train_accuracy, m.samples_per_sec, m.seconds, crate::util::mem::human(m.host_rss_bytes)
            );
        }
        history.push(m);
        if writer {
            rewrite_metrics(&metrics_path, &history)?;
        }
        cur = Cursor {
            epoch: epoch + 1,
            batch: 0,
            step: cur.step,
            ..Default::default()
        };
        save_state(writer, &ckpt, &model, &mut be, &cur)?;
        timing::mark(&format!("epoch {} done", epoch + 1));
        last_eval = Some((test_loss, test_acc, confusion));
    }
    if !writer {
        return Ok(Trained {
            dir: dir.to_path_buf(),
            summary: None,
        });
    }
    let (test_loss, test_accuracy, confusion) = match last_eval {
        Some(e) => e,
        None => match &test_src {
            Some(t) => evaluate(&mut be, &mut model, r, t.clone(), workers)?,
            None => (f64::NAN, f64::NAN, vec![]),
        },
    };
    let train_secs: f64 = history.iter().map(|m| m.seconds).sum();
    let sps = history.iter().map(|m| m.samples_per_sec).sum::<f64>() / history.len().max(1) as f64;
    let summary = Summary {
        test_accuracy,
        test_loss,
        epochs: r.epochs,
        samples_per_sec: sps,
        seconds: train_secs.max(t_start.elapsed().as_secs_f64()),
        peak_rss_bytes: crate::util::mem::peak_rss_bytes(),
        peak_gpu_mem_bytes: peak_gpu,
        device: device_desc,
        layout: r.layout,
        confusion: confusion.clone(),
        classes: r.classes.clone(),
        startup_s,
    };
    write_atomic(
        &dir.join("summary.json"),
        serde_json::to_string_pretty(&summary).unwrap().as_bytes(),
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
    plot::curves_png(&points, &dir.join("curves.png"))?;
    if !confusion.is_empty() {
        plot::confusion_png(&confusion, &r.classes, &dir.join("confusion.png"))?;
        let mut csv = format!("true\\predicted,{}\n", r.classes.join(","));
        for (k, row) in confusion.iter().enumerate() {
            csv.push_str(&format!(
                "{},{}\n",
                r.classes[k],
                row.iter()
                    .map(|v| v.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ));
        }
        write_atomic(&dir.join("confusion.csv"), csv.as_bytes())?;
    }
    timing::mark("plots written");
    Ok(Trained {
        dir: dir.to_path_buf(),
        summary: Some(summary),
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
