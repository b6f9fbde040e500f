//! The conversion itself: plan, decode on every core, write shards or column-major files into
//! staging, then publish; and the part of a fanned-out job.

use super::decode::decode_unit;
use super::folders::labelling;
use super::output::{already_converted, check_out, publish, request_key, shown_list};
use super::plan::plan;
use super::stored::stored_target;
use super::target::target;
use super::units::{reject_to_error, Failed, Plan, Unit};
use super::*;

/// `locked`: the caller (this function, starting again) already holds the lock on `o.out`.
pub(super) fn convert_into(o: &ConvertOptions, locked: bool) -> Result<ConvertReport> {
    let t0 = Instant::now();
    if !(0.0..=1.0).contains(&o.test_fraction) {
        return Err(Error::Invalid(format!(
            "--test-fraction must be in [0, 1], got {}",
            o.test_fraction
        )));
    }
    // A bad --labels/--label-from is refused before anything is created.
    labelling(o)?;
    // A dataset (or any folder) being written by another prep is not read half-written.
    if o.input.is_dir() {
        crate::format::lock::check_not_written(&o.input)?;
    }
    if o.part.is_some() && o.format == OutputFormat::Colmajor {
        return Err(Error::Invalid(
            "--part writes shards (column-major files cannot be joined by appending): merge the \
             parts, then `prep convert MERGED --format colmajor`"
                .into(),
        ));
    }
    let out = &o.out;
    // One writer per folder, from before anything in it is looked at or removed; released (and
    // the folder removed if this run created it and left it empty) when this returns.
    let _lock = if locked {
        None
    } else {
        Some(crate::format::lock::lock_dir(out)?)
    };
    let request = request_key(o);
    if !o.force {
        if let Some(r) = already_converted(o, &request) {
            return Ok(r);
        }
    }
    check_out(out, o.force)?;
    let mut plan = plan(o)?;
    if let Some(names) = &o.class_names {
        if names.len() != plan.classes.len() {
            return Err(Error::Invalid(format!(
                "--class-names gives {} names, but {} has {} classes ({})",
                names.len(),
                tree::shown_path(&o.input),
                plan.classes.len(),
                shown_list(&plan.classes)
            )));
        }
        plan.classes = names.clone();
    }
    crate::util::interrupt::check()?;
    let mut notes = plan.notes.clone();
    let (t, spec, auto_u8) = match &plan.stored {
        Some((shape, dtype)) => stored_target(o, shape, *dtype)?,
        None => {
            let t = target(o, &plan, &mut notes)?;
            let spec = SampleSpec {
                shape: Shape::new(vec![t.channels as u32, t.height, t.width])?,
                dtype: t.dtype,
            };
            (t, spec, false)
        }
    };
    // The headers read above skip their work once a signal asked to stop.
    crate::util::interrupt::check()?;
    if !o.quiet {
        for n in &notes {
            eprintln!("{n}");
        }
    }
    spec.check()?;
    // Float targets take scans in their own units, unwindowed.
    let decode = DecodeOptions {
        float: t.dtype.is_float(),
        ..o.decode.clone()
    };
    let k = plan.classes.len() as u32;
    let bs = o
        .block_samples
        .unwrap_or_else(|| default_block_samples(spec.bytes()))
        .max(1);
    let sb = o
        .shard_blocks
        .unwrap_or_else(|| default_shard_blocks(bs, spec.bytes()))
        .max(1);
    let codec = if o.format == OutputFormat::Colmajor {
        Codec::Zstd { level: 1 }
    } else {
        o.codec
    };
    // The whole input was planned and the target decided from it, so every part agrees on
    // them; now keep this part's range.
    let part = match o.part {
        Some(_) if auto_u8 => {
            return Err(Error::Invalid(format!(
            "{}: with --part, column-major files without manifest.json need --dtype (u8 or f32): \
                 each part would otherwise decide the dtype from its own values",
            tree::shown_path(&o.input)
        )))
        }
        Some(p) => {
            let job = serde_json::json!({
                "converter": "prep-convert/1",
                "kind": plan.kind,
                "classes": plan.classes,
                "sample": spec,
                "target": t,
                "format": o.format.name(),
                "codec": codec,
                "block_samples": bs,
                "shard_blocks": sb,
                "test_fraction": o.test_fraction,
                "on_error": format!("{:?}", o.on_error),
                "decode": format!("{decode:?}"),
                "label_from": o.label_from,
                "split_key": plan.split_key,
                "inputs": plan.inputs,
                "rejects": plan.rejects,
            });
            Some(take_part(&mut plan, p, &job))
        }
        None => None,
    };

    let staging = out.join(STAGING);
    if staging.exists() {
        std::fs::remove_dir_all(&staging).at(&staging)?;
    }
    std::fs::create_dir_all(&staging).at(&staging)?;
    // Where a value of column-major files read as u8 (`Values::Auto`) was not a u8 pixel / 255.
    let mut not_u8: Option<String> = None;
    let result = (|| -> Result<(BTreeMap<String, SplitInfo>, Vec<RejectEntry>)> {
        let total: usize = plan.splits.values().map(Vec::len).sum();
        let pb = crate::util::progress::bar(total as u64, "convert", "inputs", o.quiet);
        let mut rejects = plan.rejects.clone();
        if o.on_error == OnError::Fail {
            if let Some(r) = rejects.first() {
                return Err(reject_to_error(
                    &plan.root,
                    &r.path,
                    Reject::new(r.reason.clone()),
                ));
            }
        }
        let mut infos = BTreeMap::new();
        for (split, units) in &plan.splits {
            let mut w = SplitWriter::new(&staging, split, &spec, codec, k, sb);
            let mut pending: Vec<Block> = Vec::new();
            let mut px_buf: Vec<u8> = Vec::new();
            let mut lb_buf: Vec<u32> = Vec::new();
            let threads = rayon::current_num_threads();
            let flush = |pending: &mut Vec<Block>, w: &mut SplitWriter| -> Result<()> {
                let enc = pending
                    .par_iter()
                    .map(|b| b.encode(&spec, k, codec))
                    .collect::<Result<Vec<_>>>()?;
                pending.clear();
                enc.iter().try_for_each(|e| w.push(e))
            };
            ordered_map(
                units.len(),
                threads,
                2 * threads,
                |i| Ok::<_, Error>(decode_unit(&units[i], &t, &decode)),
                |i, r| {
                    pb.inc(1);
                    match r {
                        Err(Failed::NotU8(why)) => {
                            let e = Error::Invalid(why.clone());
                            not_u8 = Some(why);
                            return Err(e);
                        }
                        Err(Failed::Reject(reason)) => {
                            if o.on_error == OnError::Fail {
                                return Err(reject_to_error(&plan.root, units[i].name(), reason));
                            }
                            rejects.push(RejectEntry {
                                path: units[i].name().to_string(),
                                reason: reason.0,
                            });
                        }
                        Ok((px, labels, left_out)) => {
                            for r in left_out {
                                if o.on_error == OnError::Fail {
                                    return Err(reject_to_error(
                                        &o.input,
                                        &r.path,
                                        Reject::new(r.reason),
                                    ));
                                }
                                rejects.push(r);
                            }
                            px_buf.extend_from_slice(&px);
                            lb_buf.extend_from_slice(&labels);
                            while lb_buf.len() >= bs as usize {
                                pending.push(make_block(
                                    &mut px_buf,
                                    &mut lb_buf,
                                    bs as usize,
                                    spec.bytes(),
                                ));
                                if pending.len() >= threads {
                                    flush(&mut pending, &mut w)?;
                                }
                            }
                        }
                    }
                    Ok(())
                },
            )?;
            if !lb_buf.is_empty() {
                let n = lb_buf.len();
                pending.push(make_block(&mut px_buf, &mut lb_buf, n, spec.bytes()));
            }
            flush(&mut pending, &mut w)?;
            let shards = w.finish()?;
            if !shards.is_empty() {
                infos.insert(split.clone(), SplitInfo::from_shards(&spec, k, shards));
            }
        }
        pb.finish_and_clear();
        if infos.is_empty() && part.is_some() {
            // A part may hold nothing (more parts than inputs, or all of its inputs rejected):
            // it is still a part, and the merge decides whether the job made anything.
            for split in plan.splits.keys() {
                infos.insert(split.clone(), SplitInfo::from_shards(&spec, k, vec![]));
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
    })();
    let (infos, rejects) = match result {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            if let (true, Some(why)) = (auto_u8, not_u8) {
                // Checked as the values are read: the first that is not k / 255 decides f32, and
                // the conversion starts again (nothing has been published).
                let note = format!("dtype: f32 ({why})");
                if !o.quiet {
                    eprintln!("{note}");
                }
                // Still holding the lock on `out`.
                let mut r = convert_into(
                    &ConvertOptions {
                        dtype: Some(Dtype::F32),
                        ..o.clone()
                    },
                    true,
                )?;
                r.notes.insert(0, note);
                return Ok(r);
            }
            return Err(e);
        }
    };
    if auto_u8 {
        let note = "dtype: u8 (every value is a u8 pixel / 255)".to_string();
        if !o.quiet {
            eprintln!("{note}");
        }
        notes.push(note);
    }
    let mut source = serde_json::json!({
        "converter": "prep-convert/1",
        "request": request,
        "input": o.input.display().to_string(),
        "kind": plan.kind,
        "target": t,
        "test_fraction": o.test_fraction,
        "inputs": plan.inputs,
        "rejects": rejects.len(),
    });
    if let Some(ts) = &plan.split_key {
        source["split_key"] = ts.key.clone().into();
        source["split_keys"] = serde_json::json!(ts.keys);
        if !ts.folders.is_empty() {
            source["split_folders"] = serde_json::json!(ts.folders);
            source["test_fraction"] = serde_json::Value::Null;
        }
    }
    if let Some(p) = o.part {
        // Taken out again by `prep merge`, with `rejects` summed over the parts.
        source["part"] = p.to_string().into();
    }
    let provenance = Provenance::here(source);
    let splits: BTreeMap<String, u64> = infos.iter().map(|(s, i)| (s.clone(), i.samples)).collect();
    // Every file is written into staging, the rejects list and the manifest too, before the old
    // dataset (with --force) is removed: a write that fails (a full disk) leaves it as it was.
    // Publishing is then renames only, the manifest last.
    let finish = || -> Result<()> {
        if !rejects.is_empty() {
            let mut text = String::new();
            for r in &rejects {
                text.push_str(&serde_json::to_string(r).expect("serialises"));
                text.push('\n');
            }
            write_atomic(&staging.join(REJECTS), text.as_bytes())?;
        }
        match o.format {
            OutputFormat::Shards => {
                let mut m = Manifest::new(
                    spec.clone(),
                    plan.classes.clone(),
                    codec,
                    bs,
                    infos.clone(),
                    provenance.clone(),
                );
                m.part = part.clone();
                m.write(&staging)?;
                let files = m.splits.values().flat_map(|s| &s.shards).map(|s| &s.file);
                publish(&staging, out, o.force, files)
            }
            OutputFormat::Colmajor => {
                // Shards in staging become the colmajor files: now the sample counts are known.
                let mut cm_splits = BTreeMap::new();
                let mut stats = BTreeMap::new();
                let m = Manifest::new(
                    spec.clone(),
                    plan.classes.clone(),
                    codec,
                    bs,
                    infos.clone(),
                    provenance.clone(),
                );
                write_atomic(&staging.join(manifest::FILE_NAME), &m.to_bytes())?;
                let ds = crate::format::shard::Dataset::open(&staging)?;
                for (split, info) in &ds.manifest.splits {
                    let mut cw = ColmajorWriter::create(&staging, split, info.samples, &spec, k)?;
                    for sh in &info.shards {
                        let r = ds.open_shard(sh)?;
                        for b in 0..r.num_blocks() {
                            crate::util::interrupt::check()?;
                            let block = r.read_block(b)?;
                            let st = crate::format::shard::Stats::of_block(&block, &spec, k);
                            cw.push(&block, &st)?;
                        }
                    }
                    stats.insert(split.clone(), cw.finish()?);
                    cm_splits.insert(
                        split.clone(),
                        ColmajorSplit {
                            samples: info.samples,
                            images: crate::format::colmajor::images_name(split),
                            labels: crate::format::colmajor::labels_name(split),
                            class_counts: info.class_counts.clone(),
                        },
                    );
                }
                let (mean, std) = stats[stats_split(stats.keys())].mean_std(&spec);
                let cm = ColmajorManifest {
                    format: crate::format::colmajor::FORMAT.into(),
                    version: spec.dtype.format_version() as u32,
                    sample: spec.clone(),
                    classes: plan.classes.clone(),
                    mean,
                    std,
                    splits: cm_splits,
                    provenance: provenance.clone(),
                    checksum: String::new(),
                };
                // In place of the shards' manifest, which is no longer read.
                cm.write(&staging)?;
                let files = cm.splits.values().flat_map(|s| [&s.images, &s.labels]);
                publish(&staging, out, o.force, files)
            }
        }
    };
    if let Err(e) = finish() {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    let _ = std::fs::remove_dir_all(&staging);
    let secs = t0.elapsed().as_secs_f64();
    let samples: u64 = splits.values().sum();
    Ok(ConvertReport {
        out: out.clone(),
        kind: plan.kind,
        shape: spec.shape.0.clone(),
        dtype: spec.dtype,
        classes: plan.classes.len(),
        splits,
        inputs: plan.inputs,
        rejects,
        split_folders: plan
            .split_key
            .as_ref()
            .map(|t| t.folders.clone())
            .unwrap_or_default(),
        notes,
        seconds: secs,
        samples_per_sec: samples as f64 / secs.max(1e-9),
        bytes_on_disk: crate::format::folder::dir_bytes(out),
        peak_rss_bytes: crate::util::mem::peak_rss_bytes(),
        already_complete: false,
    })
}

/// Keep part `p` of every split of `plan`: the units (arrays: the samples) of a contiguous
/// range, in order. Returns the manifest's `part` member; its `job` digest covers `job` (what
/// shapes the output) and every unit of the whole plan in order with its label, and what
/// cheaply tells one input from another of the same name (a file's length, an array's labels).
pub(super) fn take_part(plan: &mut Plan, p: PartSpec, job: &serde_json::Value) -> Part {
    use xxhash_rust::xxh3::Xxh3;
    let mut h = Xxh3::new();
    h.update(&serde_json::to_vec(job).expect("serialises"));
    for (split, units) in &plan.splits {
        h.update(split.as_bytes());
        h.update(b"\0");
        // One file system call per file: done on every core.
        let sums: Vec<[u64; 2]> = units
            .par_iter()
            .map(|u| match u {
                Unit::File { path, label, .. } => [
                    std::fs::metadata(path).map_or(u64::MAX, |m| m.len()),
                    label.map_or(u64::MAX, u64::from),
                ],
                Unit::Array {
                    array, start, len, ..
                } => {
                    let mut h = Xxh3::new();
                    for l in &array.labels[*start..start + len] {
                        h.update(&l.to_le_bytes());
                    }
                    [h.digest(), *len as u64]
                }
                Unit::Series { plan, label, .. } => [plan.files() as u64, u64::from(*label)],
                Unit::Stored { len, .. } => [0, *len as u64],
            })
            .collect();
        for (u, sum) in units.iter().zip(sums) {
            h.update(u.name().as_bytes());
            h.update(b"\0");
            h.update(&sum[0].to_le_bytes());
            h.update(&sum[1].to_le_bytes());
        }
    }
    // Arrays are cut by sample, anything else by unit (a file, a series, a block).
    let weight = |u: &Unit| match u {
        Unit::Array { len, .. } => *len as u64,
        _ => 1,
    };
    let arrays = plan
        .splits
        .values()
        .flatten()
        .any(|u| matches!(u, Unit::Array { .. }));
    let mut ranges = BTreeMap::new();
    for (split, units) in plan.splits.iter_mut() {
        let total: u64 = units.iter().map(weight).sum();
        let (a, b) = crate::format::part::share(total, 1, p);
        let mut kept = Vec::new();
        let mut at = 0u64;
        for u in std::mem::take(units) {
            let w = weight(&u);
            let (s, e) = (at.max(a), (at + w).min(b));
            if s < e {
                kept.push(match u {
                    Unit::Array { array, start, .. } if (s, e) != (at, at + w) => {
                        let start = start + (s - at) as usize;
                        Unit::Array {
                            name: format!("{}[{start}..]", array.name),
                            array,
                            start,
                            len: (e - s) as usize,
                        }
                    }
                    u => u,
                });
            }
            at += w;
        }
        *units = kept;
        ranges.insert(
            split.clone(),
            PartRange {
                start: a,
                end: b,
                total,
            },
        );
    }
    Part {
        index: p.index,
        count: p.count,
        job: format!("{:016x}", h.digest()),
        of: if arrays { "samples" } else { "inputs" }.into(),
        ranges,
    }
}

pub(super) fn make_block(px: &mut Vec<u8>, labels: &mut Vec<u32>, n: usize, sb: usize) -> Block {
    let mut b = Block::zeroed(n, sb);
    b.pixels_mut().copy_from_slice(&px[..n * sb]);
    for (i, &l) in labels[..n].iter().enumerate() {
        b.set_label(i, l);
    }
    px.drain(..n * sb);
    labels.drain(..n);
    b
}
