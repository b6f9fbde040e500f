//! `prep merge`: join the parts of a fanned-out `synth` or `convert` job (`crate::format::part`) into one
//! dataset.
//!
//! The parts are checked first, all of them, before anything is written: same job, same count,
//! every index once, each complete (manifest, and every shard's length, header, footer and footer
//! checksum as the manifest says). Then their shards are hard-linked (copied across file systems)
//! into `OUT/.prep-staging/`, named as a single run names them, and moved into `OUT` with one
//! manifest written last. On error nothing new is left in `OUT`.

use crate::convert::{REJECTS, STAGING};
use crate::format::folder::PARTIAL_MARKER;
use crate::format::part::Part;
use crate::format::shard::manifest::{self, Provenance, ShardInfo, SplitInfo};
use crate::format::shard::{shard_file_name, Dataset, Manifest};
use crate::store::output::write_atomic;
use crate::util::error::{Error, IoContext, Result};
use rayon::prelude::*;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Debug, Clone, Serialize)]
pub struct MergeReport {
    pub out: PathBuf,
    pub parts: u32,
    pub splits: BTreeMap<String, u64>,
    pub shards: usize,
    /// Shards hard-linked from their part, and shards copied (where a link was impossible).
    pub linked: usize,
    pub copied: usize,
    pub rejects: usize,
    pub bytes: u64,
    pub seconds: f64,
}

/// One part folder, read and checked on its own.
struct Loaded {
    dir: PathBuf,
    ds: Dataset,
    part: Part,
}

impl Loaded {
    fn name(&self) -> String {
        self.dir.display().to_string()
    }
}

/// Read a part's manifest; an unfinished part (its command has not completed) is said to be so.
fn load(dir: &Path) -> Result<Loaded> {
    if !dir.is_dir() {
        return Err(Error::Invalid(format!(
            "{}: no such directory",
            dir.display()
        )));
    }
    crate::format::lock::check_not_written(dir)?;
    let unfinished = |what: &str| {
        Err(Error::Source(format!(
            "{}: incomplete part: {what}; run its command again to finish it",
            dir.display()
        )))
    };
    if dir.join(PARTIAL_MARKER).exists() {
        return unfinished(&format!(
            "its generation has not finished ({PARTIAL_MARKER} is there)"
        ));
    }
    if !dir.join(manifest::FILE_NAME).exists() {
        if dir.join(STAGING).exists() {
            return unfinished(&format!(
                "its conversion has not finished (no {}, {STAGING}/ is there)",
                manifest::FILE_NAME
            ));
        }
        return Err(Error::Invalid(format!(
            "{}: not a part: it holds no {}",
            dir.display(),
            manifest::FILE_NAME
        )));
    }
    if crate::format::dataset_format(dir).ok().as_deref() == Some(crate::format::colmajor::FORMAT) {
        return Err(Error::Invalid(format!(
            "{}: a column-major dataset, not a part (parts are shard datasets)",
            dir.display()
        )));
    }
    let ds = Dataset::open(dir)?;
    let part = ds.manifest.part.clone().ok_or_else(|| {
        Error::Invalid(format!(
            "{}: not a part: its manifest has no \"part\" member (it was made without --part)",
            dir.display()
        ))
    })?;
    Ok(Loaded {
        dir: dir.to_path_buf(),
        ds,
        part,
    })
}

/// Check that the parts are the N parts of one job, and return them in index order.
fn check_together(mut parts: Vec<Loaded>) -> Result<Vec<Loaded>> {
    // The job most parts are of (the first argument's on a tie) is the job; the others are named.
    let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
    for p in &parts {
        *votes.entry(&p.part.job).or_default() += 1;
    }
    let most = votes.values().copied().max().unwrap_or(0);
    let job = parts
        .iter()
        .map(|p| p.part.job.as_str())
        .find(|j| votes[j] == most)
        .expect("at least one part")
        .to_string();
    let reference = parts
        .iter()
        .position(|p| p.part.job == job)
        .expect("a part of the job");
    let r = &parts[reference];
    for p in &parts {
        if p.part.job != job {
            return Err(Error::Invalid(format!(
                "{}: {} of another job (job {}; {} is {} of job {job}): its command \
                 differs in an option that shapes the data, or in its input",
                p.name(),
                p.part.spec().describe(),
                p.part.job,
                r.name(),
                r.part.spec().describe(),
            )));
        }
    }
    for p in &parts {
        if p.part.count != r.part.count {
            return Err(Error::Invalid(format!(
                "{}: {}, but {} is {}: the job was cut into a different number of parts",
                p.name(),
                p.part.spec().describe(),
                r.name(),
                r.part.spec().describe()
            )));
        }
        // The job digest covers these; a hand-edited manifest might still disagree.
        let (a, b) = (&p.ds.manifest, &r.ds.manifest);
        if a.sample != b.sample
            || a.classes != b.classes
            || a.fields != b.fields
            || a.codec != b.codec
            || a.block_samples != b.block_samples
            || p.part.of != r.part.of
        {
            return Err(Error::Invalid(format!(
                "{}: its samples, classes, fields, codec or blocks differ from those of {}, a part of the same job",
                p.name(),
                r.name()
            )));
        }
    }
    let n = r.part.count;
    let mut by_index: BTreeMap<u32, &Loaded> = BTreeMap::new();
    for p in &parts {
        if let Some(q) = by_index.insert(p.part.index, p) {
            return Err(Error::Invalid(format!(
                "{} and {} are both {}: give each part once",
                q.name(),
                p.name(),
                p.part.spec().describe()
            )));
        }
    }
    let missing: Vec<String> = (0..n)
        .filter(|i| !by_index.contains_key(i))
        .map(|i| i.to_string())
        .collect();
    if !missing.is_empty() {
        let given: Vec<String> = by_index
            .iter()
            .map(|(i, p)| format!("{i} in {}", p.name()))
            .collect();
        return Err(Error::Invalid(format!(
            "missing part {} of {n} (given: {}): its folder was not named, or that task of the job has not run",
            missing.join(", "),
            given.join(", ")
        )));
    }
    parts.sort_by_key(|p| p.part.index);
    // In index order, the ranges of each split follow on from each other and cover it.
    let splits: BTreeSet<&String> = parts.iter().flat_map(|p| p.part.ranges.keys()).collect();
    for split in splits {
        let mut at = 0;
        for p in &parts {
            let Some(range) = p.part.ranges.get(split) else {
                return Err(Error::Invalid(format!(
                    "{}: records no range of split {split}, which other parts of the job have",
                    p.name()
                )));
            };
            let total = parts[0].part.ranges[split].total;
            let last = p.part.index + 1 == n;
            if range.start != at || range.total != total || (last && range.end != total) {
                return Err(Error::Invalid(format!(
                    "{}: holds {} {}..{} of {} in split {split}, but the parts before it end at {at}",
                    p.name(),
                    p.part.of,
                    range.start,
                    range.end,
                    range.total
                )));
            }
            at = range.end;
        }
    }
    Ok(parts)
}

/// Open every shard of every part as its manifest lists it (not its blocks): the shards with
/// their statistics, by part then split.
fn check_complete(parts: &[Loaded]) -> Result<Vec<BTreeMap<String, Vec<ShardInfo>>>> {
    parts
        .iter()
        .map(|p| {
            let mut splits = BTreeMap::new();
            for (split, info) in &p.ds.manifest.splits {
                let shards = info
                    .shards
                    .par_iter()
                    .map(|sh| {
                        let r = p.ds.open_shard(sh).map_err(|e| {
                            Error::Source(format!(
                                "{}: incomplete or damaged part: shard {}: {e}",
                                p.name(),
                                sh.file
                            ))
                        })?;
                        Ok(ShardInfo {
                            stats: r.stats().clone(),
                            ..sh.clone()
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                splits.insert(split.clone(), shards);
            }
            Ok(splits)
        })
        .collect()
}

/// Hard-link `from` to `to`, or copy it where a link cannot be made (another file system, or one
/// without hard links). Returns true for a link.
fn link_or_copy(from: &Path, to: &Path) -> Result<bool> {
    if std::fs::hard_link(from, to).is_ok() {
        return Ok(true);
    }
    std::fs::copy(from, to).at(to)?;
    std::fs::File::open(to).and_then(|f| f.sync_all()).at(to)?;
    Ok(false)
}

/// The rejects of every part, in part order, each once: rejects found while planning the whole
/// input (files of an unknown kind, say) are listed by every part.
fn merged_rejects(parts: &[Loaded]) -> Result<Vec<String>> {
    let mut seen = BTreeSet::new();
    let mut lines = Vec::new();
    for p in parts {
        let path = p.dir.join(REJECTS);
        if !path.exists() {
            continue;
        }
        for (i, line) in crate::store::local::read_text_capped(&path, 1 << 30, "a rejects list")?
            .lines()
            .enumerate()
        {
            // Copied as they are, so each must be one reject record: a part cannot forge
            // lines of another kind into the merged list.
            if !line.is_empty()
                && serde_json::from_str::<crate::convert::RejectEntry>(line).is_err()
            {
                return Err(Error::Source(format!(
                    "{}: line {}: not a reject record ({{\"path\": ..., \"reason\": ...}})",
                    crate::util::error::shown_path(&path),
                    i + 1
                )));
            }
            if !line.is_empty() && seen.insert(line.to_string()) {
                lines.push(line.to_string());
            }
        }
    }
    Ok(lines)
}

/// Merge the parts in `dirs` into `out`: checked, planned, placed, and undone on failure.
pub fn merge(out: &Path, dirs: &[PathBuf], quiet: bool) -> Result<MergeReport> {
    let t0 = Instant::now();
    let parts = dirs.iter().map(|d| load(d)).collect::<Result<Vec<_>>>()?;
    if parts.is_empty() {
        return Err(Error::Invalid("no parts to merge".into()));
    }
    let parts = check_together(parts)?;
    refuse_out_among_parts(&parts, out)?;
    // One writer per folder: from here on OUT is ours (created if new; removed again, if it was
    // new, when the merge fails).
    let lock = crate::format::lock::lock_dir(out)?;
    let created = lock.created();
    refuse_busy_out(out)?;
    let shards = check_complete(&parts)?;
    let rejects = merged_rejects(&parts)?;
    let (plan, infos) = plan_shards(&parts, &shards)?;
    let m = merged_manifest(&parts[0].ds.manifest, infos, &rejects);

    let staging = out.join(STAGING);
    let mut placed: Vec<PathBuf> = Vec::new();
    let result = place_shards(out, &staging, &plan, &rejects, &m, quiet, &mut placed);
    let _ = std::fs::remove_dir_all(&staging);
    let (linked, copied) = match result {
        Ok(r) => r,
        Err(e) => {
            undo_merge(out, created, &placed, &m);
            return Err(e);
        }
    };
    Ok(MergeReport {
        out: out.to_path_buf(),
        parts: parts.len() as u32,
        splits: m
            .splits
            .iter()
            .map(|(s, i)| (s.clone(), i.samples))
            .collect(),
        shards: plan.len(),
        linked,
        copied,
        rejects: rejects.len(),
        bytes: plan.iter().map(|(_, i)| i.bytes).sum(),
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// A part folder is not merged into itself.
fn refuse_out_among_parts(parts: &[Loaded], out: &Path) -> Result<()> {
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if let Some(p) = parts.iter().find(|p| same(&p.dir, out)) {
        return Err(Error::Invalid(format!(
            "{}: OUT is one of the parts; merge into a new folder",
            p.name()
        )));
    }
    Ok(())
}

/// OUT must be new or empty (but for our lock and a staging folder left behind).
fn refuse_busy_out(out: &Path) -> Result<()> {
    let busy = std::fs::read_dir(out)
        .at(out)?
        .flatten()
        .any(|e| e.file_name() != STAGING && e.file_name() != crate::format::lock::LOCK_FILE);
    if busy {
        return Err(Error::Invalid(format!(
            "{} is not empty; merge into a new or empty folder",
            out.display()
        )));
    }
    Ok(())
}

/// The shards to place (from, as named in OUT) and the splits they make; no samples at all is
/// an error.
fn plan_shards(
    parts: &[Loaded],
    shards: &[BTreeMap<String, Vec<ShardInfo>>],
) -> Result<(Vec<(PathBuf, ShardInfo)>, BTreeMap<String, SplitInfo>)> {
    // The dataset a single run writes: each split's shards in part order, named from 0.
    let r = &parts[0].ds.manifest;
    let (spec, k) = (r.sample.clone(), r.num_classes());
    let mut plan: Vec<(PathBuf, ShardInfo)> = Vec::new();
    let mut infos = BTreeMap::new();
    let names: BTreeSet<&String> = shards.iter().flat_map(|s| s.keys()).collect();
    for split in names {
        let mut list = Vec::new();
        for (p, by_split) in parts.iter().zip(shards) {
            for sh in by_split.get(split).into_iter().flatten() {
                let info = ShardInfo {
                    file: shard_file_name(split, list.len()),
                    ..sh.clone()
                };
                plan.push((p.dir.join(&sh.file), info.clone()));
                list.push(info);
            }
        }
        let info = SplitInfo::from_shards(&spec, k, list);
        // As a single run, a split without samples is left out.
        if info.samples > 0 {
            infos.insert(split.clone(), info);
        }
    }
    if infos.is_empty() {
        return Err(Error::Source(format!(
            "the {} parts hold no samples: no input of the job could be decoded",
            parts.len()
        )));
    }
    Ok((plan, infos))
}

/// The manifest of the merged dataset, from the first part's (`r`).
fn merged_manifest(
    r: &Manifest,
    infos: BTreeMap<String, SplitInfo>,
    rejects: &[String],
) -> Manifest {
    // The source the parts share, as a single run records it: without the part, and for a
    // conversion with the rejects of the whole job.
    let mut source = r.provenance.source.clone();
    if let Some(o) = source.as_object_mut() {
        o.shift_remove("part");
        // The merged dataset was not made by one part's request: a rerun of it converts.
        o.shift_remove("request");
        if o.contains_key("rejects") {
            o.insert("rejects".into(), rejects.len().into());
        }
    }
    Manifest::new(
        r.sample.clone(),
        r.classes.clone(),
        r.codec,
        r.block_samples,
        infos,
        Provenance::here(source),
    )
    .with_fields(r.fields.clone())
}

/// Link (or copy) every shard into staging, then move them into OUT with the rejects and the
/// manifest last; `placed` lists what reached OUT. Returns the shards linked and copied.
fn place_shards(
    out: &Path,
    staging: &Path,
    plan: &[(PathBuf, ShardInfo)],
    rejects: &[String],
    m: &Manifest,
    quiet: bool,
    placed: &mut Vec<PathBuf>,
) -> Result<(usize, usize)> {
    if staging.exists() {
        std::fs::remove_dir_all(staging).at(staging)?;
    }
    let pb = crate::util::progress::bar(plan.len() as u64, "merge", "shards", quiet);
    let mut linked = 0;
    for (from, info) in plan {
        crate::util::interrupt::check()?;
        let to = staging.join(&info.file);
        let dir = to.parent().expect("a shard is in a split folder");
        std::fs::create_dir_all(dir).at(dir)?;
        if link_or_copy(from, &to)? {
            linked += 1;
        }
        let len = std::fs::metadata(&to).at(&to)?.len();
        if len != info.bytes {
            return Err(Error::Source(format!(
                "{}: {len} bytes once placed in {}, {} expected: was it changed during the merge?",
                from.display(),
                out.display(),
                info.bytes
            )));
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    // Everything is staged: move it into place, the manifest last.
    for (_, info) in plan {
        let to = out.join(&info.file);
        let dir = to.parent().expect("a shard is in a split folder");
        std::fs::create_dir_all(dir).at(dir)?;
        crate::store::output::rename_durably(&staging.join(&info.file), &to)?;
        placed.push(to);
    }
    if !rejects.is_empty() {
        let mut text = rejects.join("\n");
        text.push('\n');
        write_atomic(&out.join(REJECTS), text.as_bytes())?;
        placed.push(out.join(REJECTS));
    }
    m.write(out)?;
    Ok((linked, plan.len() - linked))
}

/// After a failed merge, nothing new is left in OUT: the folder if this merge created it, else
/// what it placed there.
fn undo_merge(out: &Path, created: bool, placed: &[PathBuf], m: &Manifest) {
    if created {
        // Still locked: the lock file goes with the folder.
        let _ = std::fs::remove_dir_all(out);
    } else {
        for f in placed {
            let _ = std::fs::remove_file(f);
        }
        for split in m.splits.keys() {
            let _ = std::fs::remove_dir(out.join(split));
        }
    }
}
