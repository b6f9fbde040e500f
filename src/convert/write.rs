//! Decoding every split's units on every core, in order, and writing them as blocks of shards into
//! the staging folder; rejects are collected (or stop the run with `--on-error fail`).

use super::decode::decode_unit;
use super::units::{reject_to_error, Failed, Layout, Plan, Written};
use super::*;

/// Decode and write every split of `plan` into `staging`. `is_part`: an empty result is still a
/// part (the merge decides whether the job made anything). A value of column-major files read
/// as u8 that is not a u8 pixel / 255 ends this with the reason in `not_u8`.
pub(super) fn write_splits(
    o: &ConvertOptions,
    plan: &Plan,
    job: &Layout,
    staging: &Path,
    is_part: bool,
    not_u8: &mut Option<String>,
) -> Result<Written> {
    let total: usize = plan.splits.values().map(Vec::len).sum();
    let pb = crate::util::progress::bar(total as u64, "convert", "inputs", o.quiet);
    let mut rejects = plan.rejects.clone();
    if o.on_error == OnError::Fail {
        if let Some(r) = rejects.first() {
            let reason = Reject::new(r.reason.clone());
            return Err(reject_to_error(&plan.root, &r.path, reason));
        }
    }
    let mut infos = BTreeMap::new();
    for (split, units) in &plan.splits {
        let mut w = SplitWriter::new(staging, split, &job.spec, job.codec, job.k, job.sb)
            .with_fields(&job.fields);
        let mut blocks = Blocks::new(job);
        ordered_map(
            units.len(),
            blocks.threads,
            2 * blocks.threads,
            |i| Ok::<_, Error>(decode_unit(&units[i], &job.target, &job.decode)),
            |i, r| {
                pb.inc(1);
                match r {
                    Err(Failed::NotU8(why)) => {
                        let e = Error::Invalid(why.clone());
                        *not_u8 = Some(why);
                        Err(e)
                    }
                    Err(Failed::Reject(reason)) => {
                        if o.on_error == OnError::Fail {
                            return Err(reject_to_error(&plan.root, units[i].name(), reason));
                        }
                        rejects.push(RejectEntry {
                            path: units[i].name().to_string(),
                            reason: reason.0,
                        });
                        Ok(())
                    }
                    Ok((px, labels, fields, left_out)) => {
                        for r in left_out {
                            if o.on_error == OnError::Fail {
                                let reason = Reject::new(r.reason);
                                return Err(reject_to_error(&o.input, &r.path, reason));
                            }
                            rejects.push(r);
                        }
                        blocks.add(&px, &labels, &fields, &mut w)
                    }
                }
            },
        )?;
        blocks.finish(&mut w)?;
        let shards = w.finish()?;
        if !shards.is_empty() {
            infos.insert(
                split.clone(),
                SplitInfo::from_shards(&job.spec, job.k, shards),
            );
        }
    }
    pb.finish_and_clear();
    if infos.is_empty() && is_part {
        for split in plan.splits.keys() {
            infos.insert(
                split.clone(),
                SplitInfo::from_shards(&job.spec, job.k, vec![]),
            );
        }
    }
    if infos.is_empty() {
        let example = rejects
            .first()
            .map(|r| format!(", e.g. {}: {}", tree::shown(&r.path), r.reason))
            .unwrap_or_default();
        return Err(Error::Source(format!(
            "{}: no input could be decoded ({} rejected{example})",
            tree::shown_path(&o.input),
            rejects.len()
        )));
    }
    Ok((infos, rejects))
}

/// Decoded samples cut into blocks of `block_samples`, compressed a core's worth at a time.
struct Blocks<'a> {
    job: &'a Layout,
    threads: usize,
    pending: Vec<Block>,
    px: Vec<u8>,
    labels: Vec<u32>,
    /// Each sample's field bytes in turn (`Fields::bytes` a sample).
    fields: Vec<u8>,
    /// The buffers of blocks written, filled again: fresh ones of several MiB each cost the
    /// kernel a page fault and a page cleared per 4 KiB.
    spare: Vec<Vec<u8>>,
}

impl<'a> Blocks<'a> {
    fn new(job: &'a Layout) -> Self {
        Blocks {
            job,
            threads: rayon::current_num_threads(),
            pending: Vec::new(),
            px: Vec::new(),
            labels: Vec::new(),
            fields: Vec::new(),
            spare: Vec::new(),
        }
    }

    fn add(&mut self, px: &[u8], labels: &[u32], fields: &[u8], w: &mut SplitWriter) -> Result<()> {
        self.px.extend_from_slice(px);
        self.labels.extend_from_slice(labels);
        self.fields.extend_from_slice(fields);
        let bs = self.job.bs as usize;
        // Blocks are cut from the front, and what is left moved down once: cutting one at a
        // time moved the rest after every block.
        let mut taken = 0;
        while self.labels.len() - taken >= bs {
            let b = self.make_block(taken, bs);
            taken += bs;
            self.pending.push(b);
            if self.pending.len() >= self.threads {
                self.flush(w)?;
            }
        }
        self.take_off(taken);
        Ok(())
    }

    fn flush(&mut self, w: &mut SplitWriter) -> Result<()> {
        let (spec, k, codec) = (&self.job.spec, self.job.k, self.job.codec);
        let fields = &self.job.fields;
        let enc = self
            .pending
            .par_iter()
            .map(|b| b.encode_fields(spec, k, codec, fields))
            .collect::<Result<Vec<_>>>()?;
        self.spare
            .extend(self.pending.drain(..).map(Block::into_data));
        enc.iter().try_for_each(|e| w.push(e))
    }

    /// The last, short block, and everything still pending.
    fn finish(mut self, w: &mut SplitWriter) -> Result<()> {
        if !self.labels.is_empty() {
            let n = self.labels.len();
            let b = self.make_block(0, n);
            self.pending.push(b);
        }
        self.flush(w)
    }
}

impl Blocks<'_> {
    /// Samples `s0..s0 + n` gathered into a block (fields from sample-major to the block's
    /// field-major layout).
    fn make_block(&mut self, s0: usize, n: usize) -> Block {
        let (sb, fields) = (self.job.spec.bytes(), &self.job.fields);
        let fb = fields.bytes();
        let buf = self.spare.pop().unwrap_or_default();
        let mut b = Block::reuse_with_fields(buf, n, sb, fb);
        b.pixels_mut()
            .copy_from_slice(&self.px[s0 * sb..(s0 + n) * sb]);
        for (i, &l) in self.labels[s0..s0 + n].iter().enumerate() {
            b.set_label(i, l);
        }
        let mut at = 0;
        for (f, field) in fields.iter().enumerate() {
            let size = field.bytes();
            for i in 0..n {
                let src = (s0 + i) * fb + at;
                b.field_mut(fields, f, i)
                    .copy_from_slice(&self.fields[src..src + size]);
            }
            at += size;
        }
        b
    }

    /// Drop the first `n` samples, made into blocks.
    fn take_off(&mut self, n: usize) {
        let (sb, fb) = (self.job.spec.bytes(), self.job.fields.bytes());
        self.px.drain(..n * sb);
        self.labels.drain(..n);
        self.fields.drain(..n * fb);
    }
}
