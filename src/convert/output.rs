//! The output folder: a rerun with nothing to do (`request_key`), refusing a folder that holds
//! something else, and publishing a finished conversion.

use super::units::{Layout, Plan, Written};
use super::*;

/// "a, b, c" or "a, b, ... (10 in all)".
pub(super) fn shown_list(v: &[String]) -> String {
    if v.len() <= 6 {
        v.join(", ")
    } else {
        format!("{}, ... ({} in all)", v[..4].join(", "), v.len())
    }
}

/// A digest of what decides a conversion's output: the options, and the input files' names,
/// sizes and modification times (one stat per file, no reading). Equal digests: a rerun of the
/// same command on unchanged inputs.
pub(super) fn request_key(o: &ConvertOptions) -> String {
    use std::hash::Hasher;
    use twox_hash::XxHash3_64 as Xxh3;
    let mut h = Xxh3::new();
    let canon = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    h.write(
        format!(
            "{:?}",
            (
                canon(&o.input),
                o.kind,
                &o.shape,
                o.size,
                o.channels,
                o.dtype,
                &o.fit,
                (&o.label_from, &o.class_names),
                o.test_fraction.to_bits(),
                &o.on_error,
                &o.decode,
                (
                    &o.format,
                    &o.codec,
                    o.block_samples,
                    o.shard_blocks,
                    &o.part
                ),
            )
        )
        .as_bytes(),
    );
    // Only where given: the keys of earlier conversions stay as they were.
    if o.meta {
        h.write(b"meta");
    }
    if o.skip_empty_masks {
        h.write(b"skip_empty_masks");
    }
    if o.folder_classes {
        h.write(b"folder_classes");
    }
    if o.mixed_modalities {
        h.write(b"mixed_modalities");
    }
    // Links are not followed into folders (a link loop would never end): a link to a folder
    // counts by where it points, a link to a file by that file.
    pub(super) fn walk(root: &Path, p: &Path, h: &mut Xxh3) {
        // A signal stops the walk; the plan that follows checks for it and ends the run.
        if crate::util::interrupt::requested().is_some() {
            return;
        }
        let Ok(meta) = std::fs::symlink_metadata(p) else {
            return;
        };
        let meta = if meta.file_type().is_symlink() {
            match std::fs::metadata(p) {
                Ok(m) if !m.is_dir() || p == root => m,
                _ => {
                    h.write(
                        p.strip_prefix(root)
                            .unwrap_or(p)
                            .as_os_str()
                            .as_encoded_bytes(),
                    );
                    h.write(b"\0->");
                    if let Ok(t) = std::fs::read_link(p) {
                        h.write(t.as_os_str().as_encoded_bytes());
                    }
                    return;
                }
            }
        } else {
            meta
        };
        if meta.is_dir() {
            let Ok(rd) = std::fs::read_dir(p) else {
                return;
            };
            let mut names: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
            names.sort();
            for n in names {
                walk(root, &n, h);
            }
        } else {
            use std::os::unix::fs::MetadataExt;
            h.write(
                p.strip_prefix(root)
                    .unwrap_or(p)
                    .as_os_str()
                    .as_encoded_bytes(),
            );
            h.write(&[0]);
            for v in [meta.len() as i64, meta.mtime(), meta.mtime_nsec()] {
                h.write(&v.to_le_bytes());
            }
        }
    }
    walk(&o.input, &o.input, &mut h);
    if let Some(l) = &o.labels {
        walk(l, l, &mut h);
    }
    // Only where given: the requests of conversions without them keep their digests.
    if !o.values.is_empty() || o.masks.is_some() || o.mask_names.is_some() {
        h.write(format!("{:?}", (&o.values, &o.masks, &o.mask_names)).as_bytes());
    }
    if let Some(m) = &o.masks {
        walk(m, m, &mut h);
    }
    format!("{:016x}", h.finish())
}

/// The report of a finished conversion that `o.out` holds when it was made by the same request
/// (options and unchanged inputs) and is whole (manifest sealed, every listed file there).
pub(super) fn already_converted(o: &ConvertOptions, request: &str) -> Option<ConvertReport> {
    if !o.out.join(manifest::FILE_NAME).is_file() {
        return None;
    }
    let s = crate::format::inspect::summarize(&o.out).ok()?;
    let src = &s.provenance["source"];
    if src["request"].as_str() != Some(request) {
        return None;
    }
    Some(ConvertReport {
        out: o.out.clone(),
        kind: serde_json::from_value(src["kind"].clone()).unwrap_or(o.kind),
        shape: s.shape.clone(),
        dtype: serde_json::from_value(serde_json::Value::String(s.dtype.clone())).ok()?,
        classes: s.classes.len(),
        splits: s
            .splits
            .iter()
            .map(|x| (x.name.clone(), x.samples))
            .collect(),
        inputs: src["inputs"].as_u64().unwrap_or(0) as usize,
        rejects: vec![],
        split_folders: serde_json::from_value(src["split_folders"].clone()).unwrap_or_default(),
        split: serde_json::from_value(src["split"].clone()).ok(),
        notes: vec![],
        seconds: 0.0,
        samples_per_sec: 0.0,
        bytes_on_disk: s.bytes_on_disk,
        peak_rss_bytes: crate::util::mem::peak_rss_bytes(),
        already_complete: true,
    })
}

/// Refuse to replace an existing dataset without --force; the replacement itself happens only
/// after the new one is complete.
pub(super) fn check_out(out: &Path, force: bool) -> Result<()> {
    if force {
        return Ok(());
    }
    let busy = std::fs::read_dir(out).at(out)?.flatten().any(|e| {
        let n = e.file_name();
        n != STAGING && n != REJECTS && n != crate::format::lock::LOCK_FILE
    });
    if busy {
        return Err(Error::Invalid(format!(
            "{} is not empty; choose another --out, or pass --force to replace what it holds once the conversion succeeds",
            tree::shown_path(out)
        )));
    }
    Ok(())
}

/// Replace the old dataset in `out` (with --force) by the one complete in `staging`: its data
/// `files`, its rejects list (or none: an old one is removed) and, last, its manifest.
pub(super) fn publish<'a>(
    staging: &Path,
    out: &Path,
    force: bool,
    files: impl Iterator<Item = &'a String>,
) -> Result<()> {
    if force {
        crate::format::folder::clean(out)?;
    }
    for f in files {
        let to = out.join(f);
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir).at(dir)?;
        }
        crate::store::output::rename_durably(&staging.join(f), &to)?;
    }
    let rejects = out.join(REJECTS);
    if staging.join(REJECTS).exists() {
        crate::store::output::rename_durably(&staging.join(REJECTS), &rejects)?;
    } else if rejects.exists() {
        std::fs::remove_file(&rejects).at(&rejects)?;
    }
    let m = manifest::FILE_NAME;
    crate::store::output::rename_durably(&staging.join(m), &out.join(m))
}

/// Write the rejects list and the manifest (or turn the staged shards into column-major files),
/// all into staging, then publish. Every file is written before the old dataset (with --force)
/// is removed: a write that fails (a full disk) leaves it as it was. Publishing is then renames
/// only, the manifest last.
pub(super) fn publish_dataset(
    o: &ConvertOptions,
    plan: &Plan,
    job: &Layout,
    staging: &Path,
    (infos, rejects): &Written,
    part: Option<Part>,
    provenance: Provenance,
) -> Result<()> {
    if !rejects.is_empty() {
        let mut text = String::new();
        for r in rejects {
            text.push_str(&serde_json::to_string(r).expect("serialises"));
            text.push('\n');
        }
        write_atomic(&staging.join(REJECTS), text.as_bytes())?;
    }
    let mut m = Manifest::new(
        job.spec.clone(),
        plan.classes.clone(),
        job.codec,
        job.bs,
        infos.clone(),
        provenance,
    )
    .with_fields(job.fields.clone());
    match o.format {
        OutputFormat::Shards => {
            m.part = part;
            m.write(staging)?;
            let files = m.splits.values().flat_map(|s| &s.shards).map(|s| &s.file);
            publish(staging, &o.out, o.force, files)
        }
        OutputFormat::Colmajor => {
            write_atomic(&staging.join(manifest::FILE_NAME), &m.to_bytes())?;
            let cm = shards_to_colmajor(staging, job.k, m.provenance)?;
            let files = cm.splits.values().flat_map(|s| [&s.images, &s.labels]);
            publish(staging, &o.out, o.force, files)
        }
    }
}

/// The shards in staging become the column-major files (now the sample counts are known), and
/// their manifest in place of the shards' one, which is no longer read.
fn shards_to_colmajor(staging: &Path, k: u32, provenance: Provenance) -> Result<ColmajorManifest> {
    let ds = Dataset::open(staging)?;
    let spec = &ds.manifest.sample;
    let mut cm_splits = BTreeMap::new();
    let mut stats = BTreeMap::new();
    for (split, info) in &ds.manifest.splits {
        let mut cw = ColmajorWriter::create(staging, split, info.samples, spec, k)?;
        for sh in &info.shards {
            let r = ds.open_shard(sh)?;
            for b in 0..r.num_blocks() {
                crate::util::interrupt::check()?;
                let block = r.read_block(b)?;
                let st = crate::format::shard::Stats::of_block(&block, spec, k);
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
    let (mean, std) = stats[stats_split(stats.keys())].mean_std(spec);
    let cm = ColmajorManifest {
        format: crate::format::colmajor::FORMAT.into(),
        version: spec.dtype.format_version() as u32,
        sample: spec.clone(),
        classes: ds.manifest.classes.clone(),
        mean,
        std,
        splits: cm_splits,
        provenance,
        checksum: String::new(),
    };
    cm.write(staging)?;
    Ok(cm)
}
