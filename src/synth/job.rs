//! Writing a synthetic dataset, resumably. Shards are deterministic in (parameters, shard index), so
//! a rerun after a crash keeps every shard that was completed (renamed into place), rewrites the
//! rest, and ends byte-identical to an uninterrupted run.

use super::{split_id, Generator, Task, Version};
use crate::format::colmajor::{ColmajorManifest, ColmajorSplit, ColmajorWriter};
use crate::format::fields::{FieldStats, Fields};
use crate::format::part::{Part, PartRange, PartSpec};
use crate::format::shard::manifest::{self, read_capped, Provenance, ShardInfo, SplitInfo};
use crate::format::shard::{
    default_block_samples, default_shard_blocks, shard_file_name, Codec, Manifest, SampleSpec,
    Shape, ShardReader, ShardWriter, Stats,
};
use crate::format::OutputFormat;
use crate::store::output::write_atomic;
use crate::util::error::{Error, IoContext, Result};
use crate::util::pipeline::ordered_map;
use indicatif::ProgressBar;
use rayon::prelude::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Marks a dataset directory whose generation has started but not finished; holds the parameters so
/// that a rerun can tell a resume from a different request.
pub use crate::format::folder::{clean, dir_bytes, PARTIAL_MARKER};

#[derive(Debug, Clone)]
pub struct SynthOptions {
    pub out: PathBuf,
    /// (split name, samples); splits with zero samples are left out.
    pub splits: Vec<(String, u64)>,
    pub shape: Shape,
    pub classes: u32,
    pub seed: u64,
    /// Which generator; `Version::V1` reproduces datasets made before version 2 byte for byte.
    pub generator: Version,
    pub format: OutputFormat,
    pub codec: Codec,
    pub block_samples: Option<u32>,
    pub shard_blocks: Option<u32>,
    /// Replace a different dataset already in `out`.
    pub force: bool,
    /// Write only this part of the job: whole shards of every split (`crate::format::part`).
    pub part: Option<PartSpec>,
    pub quiet: bool,
    /// Where each finished shard goes as soon as it is written (an upload to a store), so that
    /// the output folder holds a few shards at a time.
    pub uploader: Option<std::sync::Arc<crate::format::publish::Uploader>>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct SynthReport {
    pub out: PathBuf,
    pub samples: u64,
    pub samples_generated: u64,
    pub seconds: f64,
    pub samples_per_sec: f64,
    pub shards_written: usize,
    pub shards_reused: usize,
    pub bytes_on_disk: u64,
    pub peak_rss_bytes: u64,
    pub already_complete: bool,
}

/// Write the class dataset `opts` describes (`synthesize_task` with `Task::Class`).
pub fn synthesize(opts: &SynthOptions) -> Result<SynthReport> {
    synthesize_task(opts, Task::Class)
}

/// Write the dataset `opts` describes, each sample carrying `task`'s field beside its image and
/// class (`prep synth --task`).
pub fn synthesize_task(opts: &SynthOptions, task: Task) -> Result<SynthReport> {
    synthesize_into(opts, task).map_err(|e| {
        e.when_interrupted(|| match opts.format {
            OutputFormat::Shards => format!(
                "the finished shards are kept in {}: the same command resumes",
                opts.out.display()
            ),
            OutputFormat::Colmajor => format!(
                "{} is unfinished: the same command writes it again",
                opts.out.display()
            ),
        })
    })
}

fn synthesize_into(opts: &SynthOptions, task: Task) -> Result<SynthReport> {
    let t0 = Instant::now();
    let gen = Generator::with_version(opts.shape.clone(), opts.classes, opts.seed, opts.generator)?;
    let spec = gen.spec.clone();
    let fields = task.fields(&gen)?;
    if opts.format == OutputFormat::Colmajor && !fields.is_empty() {
        return Err(Error::Invalid(format!(
            "--task {} adds a field ({}) to every sample, and the column-major layout has no \
             place for fields: use --format shards (the default)",
            task.name(),
            fields.0[0].name
        )));
    }
    let splits = splits_to_write(opts)?;
    let (bs, sb) = block_layout(opts, &spec)?;
    let params_of = |version: Version| job_params(opts, &spec, &splits, (bs, sb), version, task);
    let job = params_of(opts.generator);
    // A part's shards: whole shards, so that the parts' shards in order are a single run's.
    let per_shard = bs as u64 * sb as u64;
    let ranges = part_ranges(opts, &splits, per_shard);
    let params = with_part(opts, job.clone())?;
    let out = &opts.out;
    // One writer per folder, from before anything in it is looked at or removed.
    let _lock = crate::format::lock::lock_dir(out)?;
    if prepare_dir(
        out,
        &params,
        &with_part(opts, params_of(Version::V1))?,
        opts.force,
    )? {
        return Ok(SynthReport::already_complete(out, &ranges, t0));
    }
    let total: u64 = ranges.iter().map(|r| r.3 - r.2).sum();
    let pb = crate::util::progress::bar(total, "synth", "samples", opts.quiet);
    let mut report = SynthReport::started(out, total);
    let provenance = Provenance::here(params);
    match opts.format {
        OutputFormat::Shards => write_shards_dataset(
            opts,
            (&gen, task, &fields),
            &ranges,
            (bs, sb),
            &job,
            provenance,
            &pb,
            &mut report,
        )?,
        OutputFormat::Colmajor => {
            write_colmajor_dataset(opts, &gen, &splits, bs, provenance, &pb, &mut report)?
        }
    }
    std::fs::remove_file(out.join(PARTIAL_MARKER)).at(out.join(PARTIAL_MARKER))?;
    pb.finish_and_clear();
    report.finish(out, t0);
    Ok(report)
}

/// The parameters a dataset made by `opts` records as its provenance's source (a part's with its
/// part): what a rerun compares with what a folder or a store already holds.
pub(super) fn source_params(opts: &SynthOptions, task: Task) -> Result<serde_json::Value> {
    let gen = Generator::with_version(opts.shape.clone(), opts.classes, opts.seed, opts.generator)?;
    let splits = splits_to_write(opts)?;
    let layout = block_layout(opts, &gen.spec)?;
    with_part(
        opts,
        job_params(opts, &gen.spec, &splits, layout, opts.generator, task),
    )
}

/// The splits with samples to generate; none is an error.
fn splits_to_write(opts: &SynthOptions) -> Result<Vec<(String, u64)>> {
    let splits: Vec<(String, u64)> = opts
        .splits
        .iter()
        .filter(|(_, n)| *n > 0)
        .cloned()
        .collect();
    if splits.is_empty() {
        return Err(Error::Invalid(
            "nothing to generate: --train and --test are both 0".into(),
        ));
    }
    Ok(splits)
}

/// Samples a block and blocks a shard: the options' or the defaults for this sample size.
fn block_layout(opts: &SynthOptions, spec: &SampleSpec) -> Result<(u32, u32)> {
    let bs = opts
        .block_samples
        .unwrap_or_else(|| default_block_samples(spec.bytes()))
        .max(1);
    if bs as u64 * (spec.bytes() as u64 + 4) > crate::format::shard::format::MAX_BLOCK_RAW {
        return Err(Error::Invalid(format!(
            "--block-samples {bs}: a block of {} samples would exceed 1 GiB",
            spec.shape
        )));
    }
    let sb = opts
        .shard_blocks
        .unwrap_or_else(|| default_shard_blocks(bs, spec.bytes()))
        .max(1);
    Ok((bs, sb))
}

/// The parameters that define the dataset made by generator `version`, as its manifest records.
fn job_params(
    opts: &SynthOptions,
    spec: &SampleSpec,
    splits: &[(String, u64)],
    (bs, sb): (u32, u32),
    version: Version,
    task: Task,
) -> serde_json::Value {
    let mut p = json!({
        "generator": version.name(),
        "seed": opts.seed,
        "shape": spec.shape,
        "classes": opts.classes,
        "splits": splits.iter().map(|(s, n)| (s.clone(), json!(n))).collect::<serde_json::Map<_, _>>(),
        "format": opts.format.name(),
        "codec": opts.codec,
        "block_samples": bs,
        "shard_blocks": sb,
    });
    // Version 1's parameters stay exactly what they were before version 2 existed, so its
    // datasets are recognised (complete: nothing to do; partial: resumed).
    if let Version::V2 { difficulty } = version {
        p["difficulty"] = json!(difficulty);
    }
    // Likewise a class dataset's parameters are those of every prep before tasks existed.
    if task != Task::Class {
        p["task"] = json!(task.name());
    }
    p
}

/// A split's part to write: (split, its samples, first sample, end sample).
type SplitRange = (String, u64, u64, u64);

/// Each split's samples in this part (all of them without `--part`), in whole shards.
fn part_ranges(opts: &SynthOptions, splits: &[(String, u64)], per_shard: u64) -> Vec<SplitRange> {
    let whole = PartSpec { index: 0, count: 1 };
    splits
        .iter()
        .map(|(s, n)| {
            let (a, b) = crate::format::part::share(*n, per_shard, opts.part.unwrap_or(whole));
            (s.clone(), *n, a, b)
        })
        .collect()
}

/// Parameters `p` with the part this run writes, if any (shards only).
fn with_part(opts: &SynthOptions, mut p: serde_json::Value) -> Result<serde_json::Value> {
    // A part records which it is among its parameters, so that a rerun resumes it and another
    // part is never mistaken for it; `prep merge` takes the member out again.
    if let Some(part) = opts.part {
        if opts.format == OutputFormat::Colmajor {
            return Err(Error::Invalid(
                "--part writes shards (column-major files cannot be joined by appending): \
                 merge the parts, then `prep convert MERGED --format colmajor`"
                    .into(),
            ));
        }
        p["part"] = json!(part.to_string());
    }
    Ok(p)
}

impl SynthReport {
    /// The report of a dataset that `out` already holds, complete.
    fn already_complete(out: &Path, ranges: &[SplitRange], t0: Instant) -> SynthReport {
        SynthReport {
            out: out.to_path_buf(),
            samples: ranges.iter().map(|r| r.3 - r.2).sum(),
            samples_generated: 0,
            seconds: t0.elapsed().as_secs_f64(),
            samples_per_sec: 0.0,
            shards_written: 0,
            shards_reused: 0,
            bytes_on_disk: dir_bytes(out),
            peak_rss_bytes: crate::util::mem::peak_rss_bytes(),
            already_complete: true,
        }
    }

    /// The report of a generation of `total` samples about to start.
    fn started(out: &Path, total: u64) -> SynthReport {
        SynthReport {
            out: out.to_path_buf(),
            samples: total,
            samples_generated: 0,
            seconds: 0.0,
            samples_per_sec: 0.0,
            shards_written: 0,
            shards_reused: 0,
            bytes_on_disk: 0,
            peak_rss_bytes: 0,
            already_complete: false,
        }
    }

    /// Fill in the time, rate, size and memory of a finished generation.
    fn finish(&mut self, out: &Path, t0: Instant) {
        self.seconds = t0.elapsed().as_secs_f64();
        self.samples_per_sec = self.samples_generated as f64 / self.seconds.max(1e-9);
        // The dataset's size from its manifest: shards may have been uploaded and removed.
        self.bytes_on_disk = Manifest::read(out)
            .ok()
            .and_then(|m| {
                let shards: u64 = m
                    .splits
                    .values()
                    .flat_map(|s| &s.shards)
                    .map(|s| s.bytes)
                    .sum();
                let manifest =
                    std::fs::metadata(out.join(crate::format::shard::manifest::FILE_NAME)).ok()?;
                Some(shards + manifest.len())
            })
            .unwrap_or_else(|| dir_bytes(out));
        self.peak_rss_bytes = crate::util::mem::peak_rss_bytes();
    }
}

/// Write (or keep) every split's shards of this part, then the manifest.
#[allow(clippy::too_many_arguments)]
fn write_shards_dataset(
    opts: &SynthOptions,
    (gen, task, fields): (&Generator, Task, &Fields),
    ranges: &[SplitRange],
    (bs, sb): (u32, u32),
    job: &serde_json::Value,
    provenance: Provenance,
    pb: &ProgressBar,
    report: &mut SynthReport,
) -> Result<()> {
    let out = &opts.out;
    let spec = gen.spec.clone();
    let names = gen.class_names();
    let per_shard = bs as u64 * sb as u64;
    let mut infos = BTreeMap::new();
    for (split, n, a, b) in ranges {
        // `a` and `b` are multiples of a shard or the end of the split.
        let shards = a.div_ceil(per_shard) as usize..b.div_ceil(per_shard) as usize;
        let shards = write_split_shards(
            (gen, task, fields),
            out,
            split,
            *n,
            shards,
            (bs, sb),
            opts.codec,
            opts.uploader.as_deref(),
            pb,
            report,
        )?;
        infos.insert(
            split.clone(),
            SplitInfo::from_shards(&spec, opts.classes, shards),
        );
    }
    // A part without samples in a split leaves it out, as a single run leaves out an
    // empty split; a part without any keeps them all, empty, to stay a dataset.
    if infos.values().any(|s| s.samples > 0) {
        infos.retain(|_, s| s.samples > 0);
    }
    let mut m = Manifest::new(spec, names, opts.codec, bs, infos, provenance);
    if !fields.is_empty() {
        m = m.with_fields(fields.clone());
    }
    if let Some(p) = opts.part {
        m.part = Some(part_record(p, job, ranges));
    }
    m.write(out)
}

/// What the manifest of part `p` records: which part of which job, and its samples of each split.
fn part_record(p: PartSpec, job: &serde_json::Value, ranges: &[SplitRange]) -> Part {
    Part {
        index: p.index,
        count: p.count,
        job: crate::format::part::digest(&serde_json::to_vec(job).expect("serialises")),
        of: "samples".into(),
        ranges: ranges
            .iter()
            .map(|(s, n, a, b)| {
                let r = PartRange {
                    start: *a,
                    end: *b,
                    total: *n,
                };
                (s.clone(), r)
            })
            .collect(),
    }
}

/// Write every split as column-major files, then the manifest.
fn write_colmajor_dataset(
    opts: &SynthOptions,
    gen: &Generator,
    splits: &[(String, u64)],
    bs: u32,
    provenance: Provenance,
    pb: &ProgressBar,
    report: &mut SynthReport,
) -> Result<()> {
    let out = &opts.out;
    let spec = gen.spec.clone();
    let names = gen.class_names();
    let mut infos = BTreeMap::new();
    let mut all_stats = BTreeMap::new();
    for (split, n) in splits {
        let stats = write_split_colmajor(gen, out, split, *n, bs, pb)?;
        report.samples_generated += n;
        infos.insert(
            split.clone(),
            ColmajorSplit {
                samples: *n,
                images: crate::format::colmajor::images_name(split),
                labels: crate::format::colmajor::labels_name(split),
                class_counts: stats.class_counts.clone(),
            },
        );
        all_stats.insert(split.clone(), stats);
    }
    let (mean, std) = all_stats[manifest::stats_split(all_stats.keys())].mean_std(&spec);
    ColmajorManifest {
        format: crate::format::colmajor::FORMAT.into(),
        version: spec.dtype.format_version() as u32,
        sample: spec,
        classes: names,
        mean,
        std,
        splits: infos,
        provenance,
        checksum: String::new(),
    }
    .write(out)
}

/// Decide what to do with what `out` already holds. Returns true when it already holds exactly the
/// requested dataset, complete. Otherwise leaves the directory ready for (re)generation, with the
/// partial marker written.
///
/// `v1_params` are these parameters with generator version 1: a dataset made with them (by a prep
/// before version 2, say, whose default they were) is refused like any other, with a hint.
fn prepare_dir(
    out: &Path,
    params: &serde_json::Value,
    v1_params: &serde_json::Value,
    force: bool,
) -> Result<bool> {
    let manifest_path = out.join(manifest::FILE_NAME);
    let marker = out.join(PARTIAL_MARKER);
    let refuse = |why: String, found: Option<serde_json::Value>| {
        let hint = if found.as_ref() == Some(v1_params) && params != v1_params {
            "; it was made by generator version 1 with otherwise the same parameters: pass \
             --generator 1 to keep or resume it, choose another --out, or pass --force to replace it"
        } else {
            "; choose another --out, or pass --force to replace it"
        };
        Err(Error::Invalid(format!("{why}{hint}")))
    };
    if manifest_path.exists() {
        let source = read_source(&manifest_path).ok();
        let same = source.as_ref() == Some(params);
        if same && complete(out)? {
            return Ok(true);
        }
        if !same && !force {
            return refuse(
                format!(
                    "{} already holds a different dataset ({})",
                    out.display(),
                    differences(source.as_ref(), params)
                ),
                source,
            );
        }
    } else if marker.exists() {
        let source = read_capped(&marker)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
        let same = source.as_ref() == Some(params);
        if !same && !force {
            return refuse(
                format!(
                    "{} holds an unfinished dataset made with other parameters",
                    out.display()
                ),
                source,
            );
        }
        if !same {
            clean(out)?;
        }
    } else if std::fs::read_dir(out)
        .at(out)?
        .flatten()
        .any(|e| e.file_name() != crate::format::lock::LOCK_FILE)
        && !force
    {
        return refuse(
            format!("{} is not empty and holds no prep dataset", out.display()),
            None,
        );
    }
    if force
        && manifest_path.exists()
        && read_source(&manifest_path)
            .map(|s| &s != params)
            .unwrap_or(true)
    {
        clean(out)?;
    }
    write_atomic(
        &marker,
        serde_json::to_string_pretty(params).unwrap().as_bytes(),
    )?;
    if manifest_path.exists() {
        // From now on the directory is being rewritten: no manifest may claim it is complete.
        std::fs::remove_file(&manifest_path).at(&manifest_path)?;
    }
    Ok(false)
}

/// What differs between the settings a dataset was made with and those asked for, as
/// "train: 60000 there, 20000 asked; seed: 1 there, 7 asked".
pub(super) fn differences(found: Option<&serde_json::Value>, asked: &serde_json::Value) -> String {
    let Some(serde_json::Value::Object(found)) = found else {
        return "it was not made by prep synth".into();
    };
    let serde_json::Value::Object(asked) = asked else {
        return String::new();
    };
    let show = |v: Option<&serde_json::Value>| match v {
        None => "unset".to_string(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    };
    let mut keys: Vec<&String> = found.keys().chain(asked.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut out = Vec::new();
    for k in keys {
        let (f, a) = (found.get(k), asked.get(k));
        if f == a {
            continue;
        }
        // Splits are told one by one: "--test 500 there, 1000 asked".
        if let (Some(serde_json::Value::Object(fs)), Some(serde_json::Value::Object(as_))) = (f, a)
        {
            let mut names: Vec<&String> = fs.keys().chain(as_.keys()).collect();
            names.sort();
            names.dedup();
            for n in names {
                if fs.get(n) != as_.get(n) {
                    out.push(format!(
                        "{n}: {} there, {} asked",
                        show(fs.get(n)),
                        show(as_.get(n))
                    ));
                }
            }
            continue;
        }
        out.push(format!("{k}: {} there, {} asked", show(f), show(a)));
    }
    if out.is_empty() {
        "made the same way, but not finished".into()
    } else {
        out.join("; ")
    }
}

fn read_source(manifest_path: &Path) -> Result<serde_json::Value> {
    let bytes = read_capped(manifest_path)?;
    let v: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| Error::manifest(manifest_path, e.to_string()))?;
    Ok(v["provenance"]["source"].clone())
}

/// Cheap completeness check of an existing dataset: manifest checksum and every shard's
/// header, trailer and footer (not every block: that is `prep verify`).
fn complete(out: &Path) -> Result<bool> {
    let bytes = read_capped(&out.join(manifest::FILE_NAME))?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    if v["format"] == crate::format::colmajor::FORMAT {
        return Ok(ColmajorManifest::read(out).is_ok());
    }
    let Ok(ds) = crate::format::shard::Dataset::open(out) else {
        return Ok(false);
    };
    let ok = ds.shards().all(|(_, info)| ds.open_shard(info).is_ok());
    Ok(ok)
}

/// Remove what an earlier, different generation left: only files of the names prep writes.
/// A small synthetic training split for tests: `samples` of `shape`, blocks of 64 samples, five
/// blocks a shard.
#[cfg(test)]
pub fn test_dataset(out: &Path, samples: u64, shape: &str) {
    synthesize(&SynthOptions {
        out: out.to_path_buf(),
        splits: vec![("train".into(), samples)],
        shape: shape.parse().unwrap(),
        classes: 10,
        seed: 3,
        // The data the training tests were written against.
        generator: super::Version::V1,
        format: crate::format::OutputFormat::Shards,
        codec: crate::format::shard::Codec::Zstd { level: 1 },
        block_samples: Some(64),
        shard_blocks: Some(5),
        force: false,
        part: None,
        quiet: true,
        uploader: None,
    })
    .unwrap();
}

/// Blocks in flight: enough to keep every core busy while this thread writes, few enough to bound
/// memory (each block is about 4 MiB decoded).
fn window_blocks() -> usize {
    2 * rayon::current_num_threads()
}

/// Write (or keep) shards `shards` of `split` (`n` samples) of generator `gen`'s samples with
/// `task`'s `fields`.
#[allow(clippy::too_many_arguments)]
fn write_split_shards(
    (gen, task, fields): (&Generator, Task, &Fields),
    out: &Path,
    split: &str,
    n: u64,
    shards: std::ops::Range<usize>,
    (bs, sb): (u32, u32),
    codec: Codec,
    uploader: Option<&crate::format::publish::Uploader>,
    pb: &ProgressBar,
    report: &mut SynthReport,
) -> Result<Vec<ShardInfo>> {
    let spec = &gen.spec;
    let sid = split_id(split);
    let per_shard = bs as u64 * sb as u64;
    let mut done: BTreeMap<usize, ShardInfo> = BTreeMap::new();
    let mut todo = Vec::new();
    // Shards are named by their index in the whole split, in a part too: merging renames none.
    for i in shards {
        let start = i as u64 * per_shard;
        let samples = per_shard.min(n - start);
        let rel = shard_file_name(split, i);
        match reusable(
            &out.join(&rel),
            &rel,
            (spec, fields),
            gen.classes,
            codec,
            samples,
            samples.div_ceil(bs as u64),
        ) {
            Some(info) => {
                pb.inc(samples);
                report.shards_reused += 1;
                if let Some(u) = uploader {
                    u.send(&out.join(&rel), &info)?;
                }
                done.insert(i, info);
            }
            None => todo.push((i, start, samples)),
        }
    }
    report.shards_written += todo.len();
    // Every block still to write, in file order: (shard, first sample, samples, last of its shard).
    let mut items = Vec::new();
    for &(shard, start, samples) in &todo {
        let nblocks = samples.div_ceil(bs as u64);
        for b in 0..nblocks {
            let first = start + b * bs as u64;
            let len = (bs as u64).min(start + samples - first) as usize;
            items.push((shard, first, len, b + 1 == nblocks));
        }
    }
    let mut written = Vec::new();
    let mut current: Option<ShardWriter> = None;
    ordered_map(
        items.len(),
        rayon::current_num_threads(),
        window_blocks(),
        |i| {
            let (_, first, len, _) = items[i];
            gen.render_task_block(task, fields, sid, first, len)
                .encode_fields(spec, gen.classes, codec, fields)
        },
        |i, block| {
            let (shard, _, _, last) = items[i];
            if current.is_none() {
                current = Some(
                    ShardWriter::create(
                        out,
                        &shard_file_name(split, shard),
                        spec,
                        codec,
                        gen.classes,
                    )?
                    .with_fields(fields),
                );
            }
            current.as_mut().unwrap().push(&block)?;
            pb.inc(block.num_samples as u64);
            if last {
                let info = current.take().unwrap().finish()?;
                if let Some(u) = uploader {
                    u.send(&out.join(&info.file), &info)?;
                }
                written.push((shard, info));
            }
            Ok(())
        },
    )?;
    for (i, info) in written {
        report.samples_generated += info.samples;
        done.insert(i, info);
    }
    Ok(done.into_values().collect())
}

/// A shard left by an earlier run, if it is complete and is the one these parameters make.
fn reusable(
    path: &Path,
    rel: &str,
    (spec, fields): (&SampleSpec, &Fields),
    classes: u32,
    codec: Codec,
    samples: u64,
    blocks: u64,
) -> Option<ShardInfo> {
    let r = ShardReader::open(path).ok()?;
    let h = &r.header;
    let same = h.spec == *spec
        && h.num_classes == classes
        && h.codec == codec.code()
        && h.num_samples == samples
        && h.num_blocks as u64 == blocks
        && h.field_bytes as usize == fields.bytes()
        && h.num_fields as usize == fields.0.len();
    if !same {
        return None;
    }
    let mut info = ShardInfo {
        file: rel.to_string(),
        samples,
        blocks: h.num_blocks,
        bytes: r.file_len,
        footer_xxh3: format!("{:016x}", r.trailer.footer_xxh3),
        fields: Vec::new(),
        stats: r.stats().clone(),
    };
    info.fields = kept_field_stats(r.with_fields(fields.clone()))?;
    Some(info)
}

/// The summaries of a kept shard's fields (none without fields). They live in the manifest only,
/// which a rerun has not got, so every block is read again: a block that fails its checks makes
/// the shard one to write again.
fn kept_field_stats(r: ShardReader) -> Option<Vec<FieldStats>> {
    let fields = r.fields().clone();
    if fields.is_empty() {
        return Some(Vec::new());
    }
    // Each block's summaries, added in block order as the writer added them: the same sums.
    let per_block: Vec<Option<Vec<FieldStats>>> = (0..r.num_blocks())
        .into_par_iter()
        .map(|i| {
            let b = r.read_block(i).ok()?;
            Some(fields.summarise(b.fields(), b.len()))
        })
        .collect();
    let mut acc: Vec<FieldStats> = fields.iter().map(FieldStats::empty).collect();
    for st in per_block {
        for (a, s) in acc.iter_mut().zip(st?) {
            a.add(&s);
        }
    }
    Some(acc)
}

fn write_split_colmajor(
    gen: &Generator,
    out: &Path,
    split: &str,
    n: u64,
    bs: u32,
    pb: &ProgressBar,
) -> Result<Stats> {
    let sid = split_id(split);
    let mut w = ColmajorWriter::create(out, split, n, &gen.spec, gen.classes)?;
    let nblocks = n.div_ceil(bs as u64);
    let mut b0 = 0;
    while b0 < nblocks {
        crate::util::interrupt::check()?;
        let b1 = (b0 + window_blocks() as u64).min(nblocks);
        let blocks: Vec<_> = (b0..b1)
            .into_par_iter()
            .map(|b| {
                let first = b * bs as u64;
                let len = (bs as u64).min(n - first) as usize;
                let block = gen.render_block(sid, first, len);
                let stats = Stats::of_block(&block, &gen.spec, gen.classes);
                (block, stats)
            })
            .collect();
        for (block, stats) in &blocks {
            w.push(block, stats)?;
            pb.inc(block.len() as u64);
        }
        b0 = b1;
    }
    w.finish()
}
