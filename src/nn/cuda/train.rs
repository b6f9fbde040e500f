//! Training on CUDA: the backend, the input mode (`--memory`) and the feed that goes with it.
//!
//! - `device`: the whole training split decoded once into GPU memory (u8/u16, as stored); each
//!   step gathers its samples by index. Per epoch, one upload of the order and augmentations.
//! - `stream`: the host pipeline decodes blocks on CPU threads; batches go through a ring of
//!   pinned buffers, copied on a separate stream while the previous step computes.
//! - `managed`: the same pipeline into a ring of CUDA managed memory, prefetched slot by slot.
//!
//! `auto` takes `device` when the split fits half of the GPU's free memory, else `stream`.

use super::staging::Kind;
use super::{mem_info, Buf, Cuda, Dt, Precision};
use crate::error::{Error, Result};
use crate::mem::human;
use crate::nn::model::WIDTHS;
use crate::nn::{Backend, Model};
use crate::shard::Dtype;
use crate::train::input::{epoch_order, Source};
use crate::train::{augmentation, run_on, Feed, HostFeed, Recipe, RunCtx, Trained};
use std::sync::Arc;

fn dev_err(e: String) -> Error {
    Error::Device(e)
}

pub fn run(mut ctx: RunCtx) -> Result<Trained> {
    let r = ctx.recipe;
    let o = ctx.opts;
    let ordinal: usize = r
        .device
        .strip_prefix("cuda:")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let prec = match r.precision.as_str() {
        "f32" => Precision::F32,
        _ => Precision::Bf16,
    };
    let split_bytes = ctx.train_src.samples as u64 * ctx.train_src.spec.bytes() as u64;
    let name = super::probe(ordinal).map_err(dev_err)?;
    // The staging ring's kind comes with the backend; `auto` is settled once the free memory is
    // known, between `device` and `stream`, which share the pinned ring.
    let mode = o.memory.clone();
    let kind = if mode == "managed" {
        Kind::Managed
    } else {
        Kind::Pinned
    };
    let mut be = Cuda::new(ordinal, prec, kind).map_err(dev_err)?;
    let (free, total) = mem_info().map_err(dev_err)?;
    let budget = free as u64 / 2;
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
            "--memory device: the training split needs {} of GPU memory, more than half of the {} free; use --memory stream",
            human(split_bytes),
            human(free as u64)
        )));
    }
    let (c, h, w) = (r.model.channels, r.model.height, r.model.width);
    // cuDNN lists its candidate algorithms per convolution now (the first real batch times them).
    let dims = [(h, w), (h / 2, w / 2), (h / 4, w / 4)];
    let mut cin = c;
    for (s, &(hh, ww)) in dims.iter().enumerate() {
        be.prepare_conv(r.batch, cin, WIDTHS[s], hh, ww);
        cin = WIDTHS[s];
    }
    be.status().map_err(dev_err)?;
    let what = match mode.as_str() {
        "device" => format!(
            "device (the {} training split held in GPU memory)",
            human(split_bytes)
        ),
        "stream" => "stream (blocks decoded on CPU threads, pinned ring of 3 batches, copies on their own stream)".into(),
        _ => "managed (blocks decoded on CPU threads into a ring of 3 batches of managed memory, prefetched)".into(),
    };
    if !o.quiet {
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
    ctx.device_desc = format!(
        "cuda:{ordinal} ({name}), {}, input {mode}",
        match prec {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        }
    );
    let feed: Box<dyn Feed<Cuda>> = if mode == "device" {
        Box::new(DeviceFeed::new(
            &mut be,
            ctx.train_src.clone(),
            r,
            ctx.workers,
        )?)
    } else {
        Box::new(HostFeed::new(ctx.train_src.clone(), r, ctx.workers))
    };
    run_on(be, feed, ctx)
}

/// The training split in GPU memory, and per epoch its order and augmentations.
pub struct DeviceFeed {
    pix: Buf,
    labels: Buf,
    order: Buf,
    aug: Buf,
    mean_std: Buf,
    sizes: Vec<usize>,
    present: Vec<bool>,
    u16: bool,
    recipe: Recipe,
    per_epoch: usize,
    epoch: usize,
    next: usize,
    augment: bool,
    damaged: usize,
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
        let mut present = vec![true; sizes.len()];
        let mut damaged = 0;
        let mut start = 0usize;
        let stream = be.stream().cu_stream();
        let skip = r.skip_damaged;
        crate::pipeline::ordered_map(
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
            sizes,
            present,
            u16: src.spec.dtype == Dtype::U16,
            recipe: r.clone(),
            per_epoch: 0,
            epoch: 0,
            next: 0,
            augment: false,
            damaged,
        })
    }
}

impl Feed<Cuda> for DeviceFeed {
    fn start(&mut self, be: &mut Cuda, epoch: usize, start: usize) -> Result<()> {
        let r = &self.recipe;
        let order = epoch_order(&self.sizes, &self.present, r.seed, epoch);
        let b = r.batch;
        self.per_epoch = order.len() / b;
        self.epoch = epoch;
        self.next = start.min(self.per_epoch);
        self.augment = epoch < r.augment_epochs;
        be.upload_into(&mut self.order, &order, Dt::U32);
        if self.augment {
            let mut packed = Vec::with_capacity(self.per_epoch * b);
            for i in 0..self.per_epoch {
                packed.extend(augmentation(r, epoch, i, b).iter().map(|a| a.packed()));
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
            self.u16,
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
        self.next += 1;
        Ok(Some((i, b)))
    }

    fn damaged(&self) -> usize {
        self.damaged
    }
}
