//! Training on CUDA: the backend, the input mode (`--memory`) and the feed that goes with it.
//!
//! - `device`: the whole training split decoded once into GPU memory (as stored); each
//!   step gathers its samples by index. Per epoch, one upload of the order and augmentations.
//! - `stream`: the host pipeline decodes blocks on CPU threads; batches go through a ring of
//!   pinned buffers, copied on a separate stream while the previous step computes.
//! - `managed`: the same pipeline into a ring of CUDA managed memory, prefetched slot by slot.
//!
//! `auto` takes `device` when the split fits half of the GPU's free memory, else `stream`.

use super::input::{mix, rank_batches, share_order, Share, Source};
use super::{augmentation, run_on, Feed, HostFeed, Recipe, RunCtx, Trained};
use crate::format::shard::Dtype;
use crate::nn::cuda::staging::Kind;
use crate::nn::cuda::{mem_info, probe, Buf, Cuda, Dt, Precision};
use crate::nn::{Backend, Model};
use crate::util::error::{Error, Result};
use crate::util::mem::human;
use std::sync::Arc;

fn dev_err(e: String) -> Error {
    Error::Device(e)
}

pub fn run(mut ctx: RunCtx) -> Result<Trained> {
    let r = ctx.recipe;
    let o = ctx.opts;
    let ordinal = device_ordinal(&r.device);
    let prec = precision_of(r);
    let split_bytes = ctx.train_src.samples as u64 * ctx.train_src.spec.bytes() as u64;
    let name = probe(ordinal).map_err(dev_err)?;
    // The staging ring's kind comes with the backend; `auto` is settled once the free memory is
    // known, between `device` and `stream`, which share the pinned ring.
    let mode = o.memory.clone();
    let mut be = start_backend(&ctx, ordinal, prec, &mode)?;
    // The joined world stays open as the ranks' liveness until this function returns.
    let world = join_world_if_rank(&mut be, o, r)?;
    let (free, total) = mem_info().map_err(dev_err)?;
    let sample_bytes = ctx.train_src.spec.bytes();
    let need = |b: usize| step_bytes(r, prec, sample_bytes, b);
    check_batch_fits(r, &need, free, ordinal)?;
    let mode = settle_input_mode(mode, split_bytes, free, need(r.batch))?;
    plan_convolutions(&mut be, r)?;
    if !o.quiet {
        print_input(&mode, split_bytes, free, total, prec);
    }
    ctx.device_desc = device_desc(ordinal, &name, prec, &mode);
    let feed = make_feed(&mut be, &ctx, &mode)?;
    super::timing::mark("input ready");
    let out = run_on(be, feed, ctx);
    if let Some((joined, mut watch)) = world {
        match &out {
            Ok(_) => watch.finish(),
            Err(e) => watch.fail(&e.to_string()),
        }
        drop(joined);
    }
    out
}

/// The ordinal of `cuda:N` (0 for plain `cuda`).
fn device_ordinal(device: &str) -> usize {
    device
        .strip_prefix("cuda:")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The recipe's GPU arithmetic.
fn precision_of(r: &Recipe) -> Precision {
    match r.precision.as_str() {
        "f32" => Precision::F32,
        _ => Precision::Bf16,
    }
}

/// The backend on GPU `ordinal`, with its staging ring for input `mode` and the run's algorithms.
fn start_backend(ctx: &RunCtx, ordinal: usize, prec: Precision, mode: &str) -> Result<Cuda> {
    let r = ctx.recipe;
    let kind = if mode == "managed" {
        Kind::Managed
    } else {
        Kind::Pinned
    };
    let mut be = Cuda::new(ordinal, prec, kind).map_err(dev_err)?;
    super::timing::mark("backend ready");
    if super::timing::enabled() {
        eprintln!("timing: backend: {}", be.startup_report());
    }
    be.set_sync_bn(r.sync_bn);
    // The algorithms this run folder recorded (a resumed run), and the record of this run's.
    if !ctx.dir.as_os_str().is_empty() {
        be.use_run_algorithms(ctx.dir, ctx.share.index == 0);
    }
    Ok(be)
}

/// Join the world of ranks this process belongs to, if any, and say so unless quiet.
fn join_world_if_rank(
    be: &mut Cuda,
    o: &super::TrainOptions,
    r: &Recipe,
) -> Result<Option<(crate::dist::Joined, crate::dist::Watch)>> {
    // A rank of several joins the others before anything is timed: NCCL's id from rank 0
    // through the rendezvous, then the communicator.
    Ok(match &o.world {
        Some(w) => {
            let joined = join_world(be, w, r)?;
            if !o.quiet {
                eprintln!(
                    "world: rank {} of {} ({}), NCCL {}",
                    w.rank,
                    w.size,
                    w.launcher,
                    crate::nn::cuda::nccl::version()
                );
            }
            Some(joined)
        }
        None => None,
    })
}

/// GPU memory a step at batch `b` needs beside the input.
fn step_bytes(r: &Recipe, prec: Precision, sample_bytes: usize, b: usize) -> u64 {
    let act_bytes = if prec == Precision::F32 { 4 } else { 2 };
    crate::train::plan::CONV_WORKSPACE_BYTES
        + r.model.parameter_bytes()
        + r.model.activation_bytes(b, act_bytes)
        + 3 * (b * sample_bytes) as u64
}

/// Refuse a batch whose step cannot fit the `free` GPU memory, naming one that does.
fn check_batch_fits(
    r: &Recipe,
    need: &dyn Fn(usize) -> u64,
    free: usize,
    ordinal: usize,
) -> Result<()> {
    // What a step needs beside the input (the libraries are loaded by now, so `free` excludes
    // them): refuse before the first step a batch that cannot fit, naming one that does.
    if need(r.batch) > free as u64 {
        let fits = (1..r.batch).rev().find(|&b| need(b) <= free as u64);
        return Err(Error::Device(format!(
            "model `{}` on {}x{}x{} images at batch {} needs about {} of GPU memory for its activations, gradients and weights, more than the {} free on cuda:{ordinal}; {}",
            r.model.name,
            r.model.channels,
            r.model.height,
            r.model.width,
            r.batch,
            human(need(r.batch)),
            human(free as u64),
            match fits {
                Some(b) => format!("use --batch {b} or less"),
                None => "no batch size fits: use smaller images (prep convert --size) or --model small".into(),
            }
        )));
    }
    Ok(())
}

/// The input mode: `auto` settled by whether the split fits the memory a step leaves, and
/// `device` refused where it does not.
fn settle_input_mode(mode: String, split_bytes: u64, free: usize, step: u64) -> Result<String> {
    let budget = (free as u64 / 2).min(free as u64 - step);
    let mode = if mode == "auto" {
        if split_bytes <= budget {
            "device".to_string()
        } else {
            "stream".to_string()
        }
    } else {
        mode
    };
    if mode == "device" && split_bytes > budget {
        return Err(Error::Device(format!(
            "--memory device: the training split needs {} of GPU memory, more than the {} left of the {} free once the model has its {}; use --memory stream",
            human(split_bytes),
            human(budget),
            human(free as u64),
            human(step)
        )));
    }
    Ok(mode)
}

/// Have cuDNN list its candidate algorithms for every convolution of the model.
fn plan_convolutions(be: &mut Cuda, r: &Recipe) -> Result<()> {
    // cuDNN lists its candidate algorithms per convolution now (the first real batch times them).
    for (s, input) in r.model.convs(r.batch) {
        be.prepare_conv(&s, input);
    }
    be.status().map_err(dev_err)?;
    super::timing::mark("convolutions planned");
    Ok(())
}

/// Say what the input mode is, the GPU memory free and the precision.
fn print_input(mode: &str, split_bytes: u64, free: usize, total: usize, prec: Precision) {
    let what = match mode {
        "device" => format!(
            "device (the {} training split held in GPU memory)",
            human(split_bytes)
        ),
        "stream" => "stream (blocks decoded on CPU threads, pinned ring of 3 batches, copies on their own stream)".into(),
        _ => "managed (blocks decoded on CPU threads into a ring of 3 batches of managed memory, prefetched)".into(),
    };
    eprintln!(
        "input: {what}; {} of {} GPU memory free; precision {}",
        human(free as u64),
        human(total as u64),
        match prec {
            Precision::F32 => "float32",
            Precision::Bf16 => "bfloat16 with float32 master weights",
        }
    );
}

/// The device and input pipeline in words, for the log and summary.json.
fn device_desc(ordinal: usize, name: &str, prec: Precision, mode: &str) -> String {
    format!(
        "cuda:{ordinal} ({name}), {}, input {mode}",
        match prec {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        }
    )
}

/// The feed of input `mode`: the split held in GPU memory, or the host pipeline.
fn make_feed(be: &mut Cuda, ctx: &RunCtx, mode: &str) -> Result<Box<dyn Feed<Cuda>>> {
    let r = ctx.recipe;
    let share = ctx.share;
    Ok(if mode == "device" {
        let mut f = DeviceFeed::new(be, ctx.train_src.clone(), r, ctx.workers)?;
        f.share = share;
        Box::new(f)
    } else {
        Box::new(HostFeed::new(ctx.train_src.clone(), r, ctx.workers)?.for_rank(share))
    })
}

/// Join the data-parallel world `w` on this rank's GPU: rank 0 makes NCCL's unique id, the
/// rendezvous hands it to every rank, and all make the communicator. A watcher thread then ends
/// this process (exit status 1, naming the rank and why) as soon as another rank ends without
/// finishing, since this one may be waiting in a collective that will never complete.
fn join_world(
    be: &mut Cuda,
    w: &crate::dist::World,
    r: &Recipe,
) -> Result<(crate::dist::Joined, crate::dist::Watch)> {
    use crate::nn::cuda::nccl;
    // Ranks of another job on the same port or file do not join this one.
    let mut key = 0u64;
    for part in [
        r.data.to_string_lossy().as_bytes(),
        r.model.name.as_bytes(),
        &(r.batch as u64).to_le_bytes(),
        &r.seed.to_le_bytes(),
        &(r.epochs as u64).to_le_bytes(),
    ] {
        for &b in part {
            key = mix(key ^ b as u64);
        }
        key = mix(key ^ 0xFF);
    }
    let joined = crate::dist::join(w, &format!("{key:016x}"), nccl::unique_id)
        .map_err(|e| Error::Device(format!("rank {} of {}: {e}", w.rank, w.size)))?;
    be.join_world(w.rank, w.size, &joined.payload)
        .map_err(|e| Error::Device(format!("rank {} of {}: {e}", w.rank, w.size)))?;
    let me = w.rank;
    let watch = joined
        .watch(move |end| {
            eprintln!(
                "error: rank {me} stops because rank {} ended: {}",
                end.rank, end.reason
            );
            // A rank stopped by SIGINT/SIGTERM (the whole world was signalled): this one is
            // stopping too. Rank 0 saves a checkpoint on the way: its watcher gives it time to
            // (the process ends as soon as it has); the other ranks have nothing to save and
            // end now, so the run ends within a second rather than after the grace.
            if me == 0 && crate::util::interrupt::requested().is_some() {
                std::thread::sleep(std::time::Duration::from_secs(10));
            }
            // Without exit handlers: the CUDA driver's would wait for a collective that the
            // dead rank never joins. The last checkpoint is whole (written by rename).
            unsafe { libc::_exit(1) };
        })
        .map_err(Error::Device)?;
    Ok((joined, watch))
}

/// The training split in GPU memory, and per epoch its order and augmentations.
pub struct DeviceFeed {
    pix: Buf,
    labels: Buf,
    order: Buf,
    aug: Buf,
    mean_std: Buf,
    /// The trained field of every sample (none for classes): masks as stored (u8 or u16), or
    /// labels and values as f32 targets (`Task::host_targets`); and whether masks are u16.
    targets: Option<(Buf, bool)>,
    sizes: Vec<usize>,
    present: Vec<bool>,
    dtype: Dtype,
    recipe: Recipe,
    per_epoch: usize,
    epoch: usize,
    next: usize,
    augment: bool,
    damaged: usize,
    /// This rank's share of each epoch (`Share::ALL` for one process).
    pub share: Share,
}

impl DeviceFeed {
    pub fn new(be: &mut Cuda, src: Arc<Source>, r: &Recipe, workers: usize) -> Result<Self> {
        let sb = src.spec.bytes();
        let sizes = src.block_sizes();
        let total: usize = sizes.iter().sum();
        let mut pix = be.empty(Dt::U8);
        if !be.ensure(&mut pix, total * sb, Dt::U8) {
            be.status().map_err(dev_err)?;
        }
        let mut labels = vec![0u32; total];
        let field = super::feed::target_field(&src, r)?;
        let task = &r.task;
        let mask = task.kind == super::TaskKind::Mask;
        // Masks go to the GPU block by block as they are; labels and values are small and are
        // converted on the host first.
        let mut mask_buf = be.empty(Dt::U8);
        let mut host_targets: Vec<f32> = Vec::new();
        let fb = field.map_or(0, |(f, _)| src.fields.0[f].bytes());
        if let (Some(_), true) = (field, mask) {
            if !be.ensure(&mut mask_buf, total * fb, Dt::U8) {
                be.status().map_err(dev_err)?;
            }
        }
        let mut present = vec![true; sizes.len()];
        let mut damaged = 0;
        let mut start = 0usize;
        let stream = be.stream().cu_stream();
        let skip = r.skip_damaged;
        crate::util::pipeline::ordered_map(
            sizes.len(),
            workers,
            2 * workers.max(2),
            |i| Ok::<_, Error>(src.read(i)),
            |i, block| {
                let at = start;
                start += sizes[i];
                match block {
                    Ok(b) => {
                        for (j, l) in b.labels().enumerate() {
                            labels[at + j] = l;
                        }
                        // Pageable source: staged by the driver before the call returns.
                        unsafe {
                            cudarc::driver::result::memcpy_htod_async(
                                pix.ptr() + (at * sb) as u64,
                                b.pixels(),
                                stream,
                            )
                        }
                        .map_err(|e| Error::Device(format!("copying to the GPU: {e:?}")))?;
                        if let Some((f, _)) = field {
                            let n = b.len();
                            let bytes = &b.fields()[src.fields.range(f, n)];
                            if mask {
                                unsafe {
                                    cudarc::driver::result::memcpy_htod_async(
                                        mask_buf.ptr() + (at * fb) as u64,
                                        bytes,
                                        stream,
                                    )
                                }
                                .map_err(|e| Error::Device(format!("copying to the GPU: {e:?}")))?;
                            } else {
                                let k = task.names.len();
                                host_targets.resize(at * k, 0.0);
                                host_targets.extend(task.host_targets(bytes, n));
                            }
                        }
                        Ok(())
                    }
                    Err(e) if skip => {
                        eprintln!("warning: skipping damaged block: {e}");
                        present[i] = false;
                        damaged += 1;
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            },
        )?;
        let mut lab = be.empty(Dt::U32);
        be.upload_into(&mut lab, &labels, Dt::U32);
        let targets = match field {
            None => None,
            Some((_, wide)) if mask => Some((mask_buf, wide)),
            Some(_) => {
                // Samples of damaged blocks at the end were never filled in: they are never read.
                host_targets.resize(total * task.names.len(), 0.0);
                let mut t = be.empty(Dt::F32);
                be.upload_into(&mut t, &host_targets, Dt::F32);
                Some((t, false))
            }
        };
        let mut ms = r.mean.clone();
        ms.extend_from_slice(&r.std);
        let mut mean_std = be.empty(Dt::F32);
        be.upload_into(&mut mean_std, &ms, Dt::F32);
        // The split is in place before any step is timed.
        be.synchronize().map_err(dev_err)?;
        Ok(DeviceFeed {
            pix,
            labels: lab,
            order: be.empty(Dt::U32),
            aug: be.empty(Dt::U32),
            mean_std,
            targets,
            sizes,
            present,
            dtype: src.spec.dtype,
            recipe: r.clone(),
            per_epoch: 0,
            epoch: 0,
            next: 0,
            augment: false,
            damaged,
            share: Share::ALL,
        })
    }
}

impl Feed<Cuda> for DeviceFeed {
    fn start(&mut self, be: &mut Cuda, epoch: usize, start: usize) -> Result<()> {
        let r = &self.recipe;
        let order = share_order(&self.sizes, &self.present, r.seed, epoch, true, self.share);
        let b = r.batch;
        self.per_epoch = order.len() / b;
        if self.share.count > 1 {
            // Every rank takes the same steps (the rest of its share waits for another epoch).
            let n = rank_batches(&self.sizes, self.share.count, b);
            if self.per_epoch < n {
                return Err(Error::Source(format!(
                    "rank {}: its share of epoch {} holds {} batches, fewer than the {n} every rank takes, as damaged blocks were skipped; with several GPUs repair the data (prep verify names the blocks)",
                    self.share.index,
                    epoch + 1,
                    self.per_epoch
                )));
            }
            self.per_epoch = n;
        }
        self.epoch = epoch;
        self.next = start.min(self.per_epoch);
        self.augment = epoch < r.augment_epochs;
        be.upload_into(&mut self.order, &order, Dt::U32);
        if self.augment {
            let mut packed = Vec::with_capacity(self.per_epoch * b);
            for i in 0..self.per_epoch {
                packed.extend(
                    augmentation(r, epoch, self.share.batch_key(i), b)
                        .iter()
                        .map(|a| a.packed()),
                );
            }
            be.upload_into(&mut self.aug, &packed, Dt::U32);
        }
        be.status().map_err(dev_err)
    }

    fn next(&mut self, be: &mut Cuda, model: &mut Model<Cuda>) -> Result<Option<(usize, usize)>> {
        if self.next >= self.per_epoch {
            return Ok(None);
        }
        let r = &self.recipe;
        let (i, b) = (self.next, r.batch);
        let off = (i * b * 4) as u64;
        let (aug, pad) = if self.augment {
            (self.aug.ptr() + off, r.crop_pad)
        } else {
            (0, 0)
        };
        be.load_device(
            self.pix.ptr(),
            self.dtype,
            self.order.ptr() + off,
            self.labels.ptr(),
            aug,
            self.mean_std.ptr(),
            b,
            (r.model.channels, r.model.height, r.model.width),
            pad,
            &mut model.input,
            &mut model.labels,
        );
        if let Some((t, wide)) = &self.targets {
            let (h, w) = (r.model.height, r.model.width);
            let order = self.order.ptr() + off;
            if r.task.kind == super::TaskKind::Mask {
                let ignore = r.task.ignore;
                be.load_masks_device(
                    t.ptr(),
                    *wide,
                    order,
                    aug,
                    b,
                    h,
                    w,
                    pad,
                    ignore,
                    &mut model.targets,
                );
            } else {
                let k = r.task.names.len();
                be.gather_targets_device(t.ptr(), order, b, k, &mut model.targets);
            }
        }
        self.next += 1;
        Ok(Some((i, b)))
    }

    fn damaged(&self) -> usize {
        self.damaged
    }
}

/// The GPU input modes and whole runs (GPU machine: `scripts/gpu-check.sh`, stage `tests`).
#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::architecture::init_values;
    use crate::nn::ModelConfig;

    fn gpu() -> Option<Cuda> {
        crate::nn::cuda::tests::gpu(Precision::F32, Kind::Pinned)
    }

    /// The split held in GPU memory (`--memory device`) yields the very batches the host pipeline
    /// streams: same samples, same order, same crops and flips, from the start of an epoch and from a
    /// resume point, with and without augmentation.
    #[test]
    fn dataset_in_gpu_memory_feeds_the_batches_the_stream_feeds() {
        use crate::format::shard::Dataset;
        use crate::train::input::Source;
        use crate::train::{Feed, HostFeed, Recipe};
        let Some(mut g) = gpu() else {
            return;
        };
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("ds");
        crate::synth::test_dataset(&out, 2000, "3x8x8");
        let ds = Dataset::open(&out).unwrap();
        let src = Source::open(&ds, "train").unwrap();
        let cfg = ModelConfig::small(3, 8, 8, 10);
        let r = Recipe {
            data: out.clone(),
            model: cfg.clone(),
            task: Default::default(),
            epochs: 3,
            batch: 64,
            lr: 0.1,
            momentum: 0.9,
            weight_decay: 5e-4,
            label_smoothing: 0.1,
            seed: 7,
            crop_pad: 1,
            flip: true,
            augment_epochs: 2,
            checkpoint_every: 0,
            device: "cuda:0".into(),
            precision: "bf16".into(),
            skip_damaged: false,
            world: 1,
            sync_bn: false,
            mean: ds.manifest.mean.iter().map(|&v| v as f32).collect(),
            std: ds.manifest.std.iter().map(|&v| v as f32).collect(),
            classes: ds.manifest.classes.clone(),
            tool: "test".into(),
            layout: Default::default(),
            input_dtype: None,
            data_id: None,
        };
        let mut host = HostFeed::new(src.clone(), &r, 2).unwrap();
        let dev_src = src.clone();
        let mut dev = DeviceFeed::new(&mut g, src, &r, 2).unwrap();
        let init = init_values(&cfg, 1);
        let mut m1 = Model::new(&mut g, cfg.clone(), &init);
        let mut m2 = Model::new(&mut g, cfg, &init);
        for (epoch, start) in [(0, 0), (1, 5), (2, 0)] {
            Feed::<Cuda>::start(&mut host, &mut g, epoch, start).unwrap();
            dev.start(&mut g, epoch, start).unwrap();
            let mut batches = 0;
            loop {
                let a = host.next(&mut g, &mut m1).unwrap();
                let b = dev.next(&mut g, &mut m2).unwrap();
                assert_eq!(a, b, "epoch {epoch}: batch index and size");
                if a.is_none() {
                    break;
                }
                assert_eq!(
                    g.download(&m1.input),
                    g.download(&m2.input),
                    "epoch {epoch} batch {a:?}"
                );
                assert_eq!(
                    g.download(&m1.labels),
                    g.download(&m2.labels),
                    "labels, epoch {epoch}"
                );
                batches += 1;
            }
            assert_eq!(batches, 2000 / 64 - start, "epoch {epoch}");
        }
        // A data-parallel rank's share: the same batches in both modes, as many as every rank
        // takes (`rank_batches`: 15 of 64 from 16 of the 32 blocks).
        let share = Share::new(1, 2).unwrap();
        let mut host = HostFeed::new(dev_src.clone(), &r, 2)
            .unwrap()
            .for_rank(share);
        dev.share = share;
        for (epoch, start) in [(0, 0), (1, 3)] {
            Feed::<Cuda>::start(&mut host, &mut g, epoch, start).unwrap();
            dev.start(&mut g, epoch, start).unwrap();
            let mut batches = 0;
            while let Some(a) = host.next(&mut g, &mut m1).unwrap() {
                assert_eq!(
                    Some(a),
                    dev.next(&mut g, &mut m2).unwrap(),
                    "share, epoch {epoch}"
                );
                assert_eq!(g.download(&m1.input), g.download(&m2.input), "share {a:?}");
                assert_eq!(g.download(&m1.labels), g.download(&m2.labels));
                batches += 1;
            }
            assert_eq!(dev.next(&mut g, &mut m2).unwrap(), None);
            assert_eq!(batches, 15 - start, "share, epoch {epoch}");
        }
        g.status().unwrap();
    }

    /// GPU training is deterministic (deterministic cuDNN algorithms, remembered across processes;
    /// no atomics in the gradients): a run stopped mid-epoch and resumed from its checkpoint ends with
    /// the very bits of an uninterrupted run, in each input mode, and two clean runs agree too.
    #[test]
    fn resumed_run_ends_bit_identical_to_an_uninterrupted_one() {
        use crate::train::{checkpoint, train, TrainOptions};
        if gpu().is_none() {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let ds = t.path().join("ds");
        crate::synth::test_dataset(&ds, 3000, "3x16x16");
        let opts = |out: &str, memory: &str, stop_after: Option<usize>| TrainOptions {
            data: ds.clone(),
            shape: None,
            out: Some(t.path().join(out)),
            resume: None,
            model: Some("small".into()),
            width: None,
            task: None,
            loss: None,
            epochs: 2,
            batch: 128,
            lr: Some(0.4),
            momentum: 0.9,
            weight_decay: 5e-4,
            label_smoothing: 0.1,
            seed: 5,
            augment: true,
            checkpoint_every: 0,
            device: "cuda:0".into(),
            memory: memory.into(),
            precision: "bf16".into(),
            skip_damaged: false,
            quiet: true,
            stop_after,
            world: None,
            sync_bn: false,
        };
        let weights =
            |out: &str| checkpoint::load(&t.path().join(out).join(checkpoint::FILE)).unwrap();
        train(&opts("clean", "stream", None)).unwrap();
        let clean = weights("clean");
        assert_eq!(clean.1.epoch, 2);
        train(&opts("again", "stream", None)).unwrap();
        assert!(weights("again").0 == clean.0, "two clean runs differ");
        for memory in ["stream", "device"] {
            let out = format!("stopped-{memory}");
            // 3000 samples, batch 128: 24 steps an epoch; stop in the middle of the first.
            train(&opts(&out, memory, Some(9))).unwrap();
            assert_eq!(weights(&out).1.epoch, 0);
            let mut resume = opts("-", memory, None);
            resume.out = None;
            resume.resume = Some(t.path().join(&out));
            train(&resume).unwrap();
            let (w, cur) = weights(&out);
            assert_eq!(cur.epoch, 2);
            for ((name, a), (_, b)) in clean.0.iter().zip(&w) {
                let differ = a
                    .iter()
                    .zip(b)
                    .filter(|(x, y)| x.to_bits() != y.to_bits())
                    .count();
                assert_eq!(
                    differ,
                    0,
                    "{memory}: {name}: {differ} of {} values differ",
                    a.len()
                );
            }
        }
    }
}
