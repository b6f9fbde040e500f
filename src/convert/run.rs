//! The conversion as named stages: check the request, plan, decide the layout, keep this part's
//! share, decode and write into staging (`write.rs`), then publish (`output.rs`) and report.

use super::folders::labelling;
use super::output::{already_converted, check_out, publish_dataset, request_key, shown_list};
use super::part::take_part;
use super::plan::plan;
use super::stored::stored_target;
use super::target::target;
use super::tree_fields;
use super::units::{Layout, Plan, Written};
use super::write::write_splits;
use super::*;

/// `locked`: the caller (this function, starting again) already holds the lock on `o.out`.
pub(super) fn convert_into(o: &ConvertOptions, locked: bool) -> Result<ConvertReport> {
    let t0 = Instant::now();
    check_options(o)?;
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
    name_classes(o, &mut plan)?;
    if let Some(w) = plan.drawn.as_ref().and_then(|d| d.warning.clone()) {
        plan.notes.push(w);
    }
    crate::util::interrupt::check()?;
    let mut notes = plan.notes.clone();
    let volumes = super::volumes::survey(&plan, &o.decode);
    notes.extend(volumes.iter().flat_map(|v| v.notes(&o.decode)));
    let mut job = decide(o, &plan, &mut notes)?;
    // The whole input was planned and the layout decided from it, so every part agrees on
    // them; now keep this part's range.
    let part = match o.part {
        Some(p) => Some(cut_part(o, &mut plan, &job, p)?),
        None => None,
    };
    let staging = out.join(STAGING);
    if staging.exists() {
        std::fs::remove_dir_all(&staging).at(&staging)?;
    }
    std::fs::create_dir_all(&staging).at(&staging)?;
    let mut not_u8: Option<String> = None;
    let written = write_splits(o, &plan, &job, &staging, part.is_some(), &mut not_u8);
    let (mut infos, rejects) = match written {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            return match (job.auto_u8, not_u8) {
                (true, Some(why)) => again_as_f32(o, why),
                _ => Err(e),
            };
        }
    };
    let skipped = super::msd::skipped_note(&plan);
    let named = tree_fields::settle_mask_names(&plan.fields, &mut job.fields, &mut infos);
    for note in [skipped, named].into_iter().flatten() {
        if !o.quiet {
            eprintln!("{note}");
        }
        notes.push(note);
    }
    if job.auto_u8 {
        let note = "dtype: u8 (every value is a u8 pixel / 255)".to_string();
        if !o.quiet {
            eprintln!("{note}");
        }
        notes.push(note);
    }
    // What the split came to; a part holds only its share of the samples.
    let split = plan.drawn.as_ref().map(|d| {
        let samples = part
            .is_none()
            .then(|| infos.iter().map(|(s, i)| (s.clone(), i.samples)).collect());
        super::split::SplitReport::new(d, samples)
    });
    for w in split.iter().flat_map(|s| &s.warnings) {
        if !notes.contains(w) {
            eprintln!("{w}");
            notes.push(w.clone());
        }
    }
    let mut provenance = provenance(o, &plan, &job, &request, rejects.len());
    if let Some(v) = &volumes {
        provenance.source["volumes"] = v.json(&o.decode);
    }
    if job.decode.scan_values && super::volumes::has_scans(&plan) {
        // What a u16 sample of a scan holds (`transform::U16_OFFSET`).
        provenance.source["u16_values"] = "modality value + 32768".into();
    }
    let written: Written = (infos, rejects);
    let published = publish_dataset(o, &plan, &job, &staging, &written, part, provenance);
    let _ = std::fs::remove_dir_all(&staging);
    published?;
    let mut r = report(o, plan, &job, written, notes, t0);
    r.split = split;
    Ok(r)
}

/// What can be refused before anything is created or read.
fn check_options(o: &ConvertOptions) -> Result<()> {
    if !(0.0..=1.0).contains(&o.test_fraction) {
        return Err(Error::Invalid(format!(
            "--test-fraction must be in [0, 1], got {}",
            o.test_fraction
        )));
    }
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
    Ok(())
}

/// `--class-names` in place of the names the input gave, one per class.
fn name_classes(o: &ConvertOptions, plan: &mut Plan) -> Result<()> {
    let Some(names) = &o.class_names else {
        return Ok(());
    };
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
    Ok(())
}

/// The target shape and dtype, how inputs decode into it, and the block and shard sizes.
fn decide(o: &ConvertOptions, plan: &Plan, notes: &mut Vec<String>) -> Result<Layout> {
    let (target, spec, auto_u8) = match &plan.stored {
        Some((shape, dtype)) => stored_target(o, shape, *dtype)?,
        None => {
            let t = target(o, plan, notes)?;
            let spec = SampleSpec {
                shape: Shape::new(vec![t.channels as u32, t.height, t.width])?,
                dtype: t.dtype,
            };
            (t, spec, false)
        }
    };
    let fields = tree_fields::fill(&plan.fields, &target);
    refuse_fields_here(o, &fields, &target)?;
    // The headers read above skip their work once a signal asked to stop.
    crate::util::interrupt::check()?;
    for n in notes.iter() {
        // A warning is said even with --quiet: a split that is not what was asked, ...
        if !o.quiet || n.starts_with("warning:") {
            eprintln!("{n}");
        }
    }
    spec.check()?;
    // Float targets take scans in their own units, unwindowed; so do u16 ones without --window.
    let decode = DecodeOptions {
        float: target.dtype.is_float(),
        scan_values: target.dtype == Dtype::U16 && o.decode.window.is_none(),
        ..o.decode.clone()
    };
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
    codec.fits(&spec).map_err(Error::Invalid)?;
    Ok(Layout {
        target,
        spec,
        auto_u8,
        decode,
        k: plan.classes.len() as u32,
        bs,
        sb,
        codec,
        fields,
    })
}

/// Fields the output cannot hold: none in column-major files; a mask only at the target size.
/// A .npy mask is declared at its own size (its images are not resized); a tree's and an MSD
/// case's masks at the target's, brought there with their image's placement
/// (`transform::fit_mask`).
fn refuse_fields_here(o: &ConvertOptions, fields: &Fields, t: &Target) -> Result<()> {
    let Some(first) = fields.iter().next() else {
        return Ok(());
    };
    if o.format == OutputFormat::Colmajor {
        return Err(Error::Invalid(format!(
            "{}: its samples carry a field ({}, {}); the column-major layout has images and class labels only (formats/colmajor.md): write shards",
            tree::shown_path(&o.input),
            first.name,
            first.kind.name()
        )));
    }
    for f in fields.iter() {
        if f.kind == crate::format::fields::FieldKind::Mask && f.shape != [t.height, t.width] {
            return Err(Error::Invalid(format!(
                "{}: its masks are {}x{}, the target {}x{}: samples with masks are kept at their own size (leave out --size and --shape's height and width)",
                tree::shown_path(&o.input),
                f.shape[0],
                f.shape[1],
                t.height,
                t.width
            )));
        }
    }
    Ok(())
}

/// Keep part `p` of the plan; its job digest covers everything that shapes the output.
fn cut_part(o: &ConvertOptions, plan: &mut Plan, job: &Layout, p: PartSpec) -> Result<Part> {
    if job.auto_u8 {
        return Err(Error::Invalid(format!(
            "{}: with --part, column-major files without manifest.json need --dtype (u8 or f32): \
             each part would otherwise decide the dtype from its own values",
            tree::shown_path(&o.input)
        )));
    }
    let mut digest = serde_json::json!({
        "converter": "prep-convert/1",
        "kind": plan.kind,
        "classes": plan.classes,
        "sample": job.spec,
        "target": job.target,
        "format": o.format.name(),
        "codec": job.codec,
        "block_samples": job.bs,
        "shard_blocks": job.sb,
        "test_fraction": o.test_fraction,
        "on_error": format!("{:?}", o.on_error),
        "decode": format!("{:?}", job.decode),
        "label_from": o.label_from,
        "split_key": plan.split_key,
        "inputs": plan.inputs,
        "rejects": plan.rejects,
    });
    if !job.fields.is_empty() {
        // Only where there are fields: the jobs of datasets without keep their digests.
        digest["fields"] = serde_json::json!(job.fields);
    }
    if o.meta {
        digest["meta"] = true.into();
    }
    if o.skip_empty_masks {
        digest["skip_empty_masks"] = true.into();
    }
    Ok(take_part(plan, p, &digest))
}

/// Checked as the values are read: the first that is not k / 255 decides f32, and the
/// conversion starts again (nothing has been published; the lock on the output is still held).
fn again_as_f32(o: &ConvertOptions, why: String) -> Result<ConvertReport> {
    let note = format!("dtype: f32 ({why})");
    if !o.quiet {
        eprintln!("{note}");
    }
    let f32_options = ConvertOptions {
        dtype: Some(Dtype::F32),
        ..o.clone()
    };
    let mut r = convert_into(&f32_options, true)?;
    r.notes.insert(0, note);
    Ok(r)
}

/// The manifest's `provenance.source`: what was converted, how, and the rerun digest.
fn provenance(
    o: &ConvertOptions,
    plan: &Plan,
    job: &Layout,
    request: &str,
    rejects: usize,
) -> Provenance {
    let mut source = serde_json::json!({
        "converter": "prep-convert/1",
        "request": request,
        "input": o.input.display().to_string(),
        "kind": plan.kind,
        "target": job.target,
        "test_fraction": o.test_fraction,
        "inputs": plan.inputs,
        "rejects": rejects,
    });
    if let Some(ts) = &plan.split_key {
        source["split_key"] = ts.key.clone().into();
        source["split_keys"] = serde_json::json!(ts.keys);
        if !ts.folders.is_empty() {
            source["split_folders"] = serde_json::json!(ts.folders);
            source["test_fraction"] = serde_json::Value::Null;
        }
    }
    if let Some(d) = &plan.drawn {
        // The groups each split came to, and the warning where they cannot give the fraction;
        // the samples are the manifest's `splits` (as planned, so every part of a job records
        // the same, and `prep merge` keeps it).
        source["split"] = serde_json::json!(super::split::SplitReport::new(d, None));
    }
    if o.skip_empty_masks {
        source["skip_empty_masks"] = true.into();
    }
    if let Some(p) = o.part {
        // Taken out again by `prep merge`, with `rejects` summed over the parts.
        source["part"] = p.to_string().into();
    }
    Provenance::here(source)
}

fn report(
    o: &ConvertOptions,
    plan: Plan,
    job: &Layout,
    (infos, rejects): Written,
    notes: Vec<String>,
    t0: Instant,
) -> ConvertReport {
    let splits: BTreeMap<String, u64> = infos.iter().map(|(s, i)| (s.clone(), i.samples)).collect();
    let secs = t0.elapsed().as_secs_f64();
    let samples: u64 = splits.values().sum();
    ConvertReport {
        out: o.out.clone(),
        kind: plan.kind,
        shape: job.spec.shape.0.clone(),
        dtype: job.spec.dtype,
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
        split: None,
        seconds: secs,
        samples_per_sec: samples as f64 / secs.max(1e-9),
        bytes_on_disk: crate::format::folder::dir_bytes(&o.out),
        peak_rss_bytes: crate::util::mem::peak_rss_bytes(),
        already_complete: false,
    }
}
