use super::outln;
use super::{thousands, UsageError};
use crate::cli::{
    ClassesArg, ConvertArgs, FitArg, FourthAxisArg, KindArg, OnErrorArg, OrientationArg,
};
use anyhow::Context;
use prep::convert::{convert, ConvertOptions, ConvertReport, Kind, OnError};
use prep::format::shard::Dtype;
use prep::source::transform::Fit;
use prep::source::DecodeOptions;
use prep::util::mem::human;
use std::process::ExitCode;

fn pair<T: std::str::FromStr>(s: &str, sep: char, what: &str) -> Result<(T, T), UsageError> {
    let bad = || UsageError(format!("bad {what} '{s}'"));
    let (a, b) = s.split_once(sep).ok_or_else(bad)?;
    Ok((
        a.trim().parse().map_err(|_| bad())?,
        b.trim().parse().map_err(|_| bad())?,
    ))
}

/// `prep convert`: the flags checked, the conversion run, and what it made printed.
pub fn run(a: ConvertArgs, quiet: bool) -> anyhow::Result<ExitCode> {
    let size = parse_size(&a)?;
    let window = parse_window(&a)?;
    let dtype = a.dtype.map(Dtype::from);
    refuse_bad_flags(&a, window, dtype)?;
    let class_names = match &a.class_names {
        None => None,
        Some(s) => Some(names("--class-names", s)?),
    };
    let mut opts = convert_options(&a, quiet, size, window, dtype, class_names)?;
    opts.mask_names = match &a.mask_names {
        None => None,
        Some(s) => Some(mask_names(s)?),
    };
    let (r, published) = super::remote_out::write_to(&a.out, a.force, quiet, |out, _| {
        let opts = ConvertOptions {
            out: out.to_path_buf(),
            ..opts
        };
        Ok(convert(&opts)?)
    })
    .with_context(|| {
        format!(
            "prep convert {} into {}",
            prep::source::tree::shown_path(&a.input),
            prep::source::tree::shown_path(&a.out)
        )
    })?;
    if a.json {
        outln!("{}", super::with_upload(&r, &published)?);
    } else if !quiet {
        print_report(&a, &r)?;
        super::print_upload(&published)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `--size`: HxW, or one side for a square, within a sample's cap.
fn parse_size(a: &ConvertArgs) -> anyhow::Result<Option<(u32, u32)>> {
    Ok(match &a.size {
        Some(s) => {
            let lower = s.trim().to_ascii_lowercase();
            let bad = || {
                UsageError(format!(
                    "--size {s}: expected HxW or one side for a square, e.g. 32x32, 224x160 or 32"
                ))
            };
            // One number is a square: --size 32 is 32x32.
            let (h, w): (u32, u32) = match lower.split_once('x') {
                Some(_) if lower.matches('x').count() > 1 => {
                    return Err(UsageError(format!(
                        "--size {s}: expected HxW (the channels are --channels), e.g. 32x32"
                    ))
                    .into())
                }
                Some(_) => pair(&lower, 'x', "--size (expected HxW, e.g. 32x32)")?,
                None => {
                    let n = lower.parse().map_err(|_| bad())?;
                    (n, n)
                }
            };
            if h == 0 || w == 0 {
                return Err(UsageError(format!("--size {s}: sides must be at least 1")).into());
            }
            // H times W (times the channels, checked once they are known) within a sample's cap.
            prep::format::shard::Shape::new(vec![1, h, w])
                .map_err(|e| UsageError(format!("--size {s}: {e}")))?;
            Some((h, w))
        }
        None => None,
    })
}

/// `--window LOW:HIGH`, finite with LOW < HIGH.
fn parse_window(a: &ConvertArgs) -> anyhow::Result<Option<(f64, f64)>> {
    Ok(match &a.window {
        Some(s) => {
            let (lo, hi) = pair::<f64>(s, ':', "--window (expected LOW:HIGH, e.g. -1000:400)")?;
            if !(lo.is_finite() && hi.is_finite() && lo < hi) {
                return Err(UsageError(format!(
                    "--window {s}: LOW and HIGH must be finite numbers with LOW < HIGH"
                ))
                .into());
            }
            Some((lo, hi))
        }
        None => None,
    })
}

/// Flags that cannot work, refused as usage errors before any work.
fn refuse_bad_flags(
    a: &ConvertArgs,
    window: Option<(f64, f64)>,
    dtype: Option<Dtype>,
) -> anyhow::Result<()> {
    if window.is_some() && dtype.is_some_and(Dtype::is_float) {
        return Err(UsageError(
            "--window does not apply to --dtype f16/f32, which keep the values unwindowed".into(),
        )
        .into());
    }
    if let Some(f) = a.fps {
        if !(f > 0.0 && f.is_finite()) {
            return Err(UsageError(format!("--fps {f}: must be a positive number")).into());
        }
    }
    if let Some(re) = &a.label_from {
        // Refused before any work, as a usage error.
        prep::source::tree::LabelRegex::new(re).map_err(UsageError)?;
    }
    Ok(())
}

/// The library's options from the command line's.
fn convert_options(
    a: &ConvertArgs,
    quiet: bool,
    size: Option<(u32, u32)>,
    window: Option<(f64, f64)>,
    dtype: Option<Dtype>,
    class_names: Option<Vec<String>>,
) -> anyhow::Result<ConvertOptions> {
    Ok(ConvertOptions {
        class_names,
        input: a.input.clone(),
        out: a.out.clone(),
        kind: match a.kind {
            KindArg::Auto => Kind::Auto,
            KindArg::Idx => Kind::Idx,
            KindArg::Cifar => Kind::Cifar,
            KindArg::Images => Kind::Images,
            KindArg::Video => Kind::Video,
            KindArg::Dicom => Kind::Dicom,
            KindArg::Nifti => Kind::Nifti,
            KindArg::Tiff => Kind::Tiff,
            KindArg::Npy => Kind::Npy,
            KindArg::Msd => Kind::Msd,
            KindArg::Colmajor => Kind::Colmajor,
            KindArg::Shards => Kind::Shards,
        },
        shape: a.shape.clone(),
        size,
        channels: a.channels.map(|c| if c >= 2 { 3 } else { 1 }),
        dtype,
        fit: match a.fit {
            FitArg::Crop => Fit::Crop,
            FitArg::Stretch => Fit::Stretch,
            FitArg::Pad => Fit::Pad,
        },
        labels: a.labels.clone(),
        values: a.values.iter().map(|v| v.trim().to_string()).collect(),
        masks: a.masks.clone(),
        mask_names: None,
        label_from: a.label_from.clone(),
        test_fraction: a.test_fraction,
        test_fraction_given: a.given.iter().any(|g| g == "test_fraction"),
        folder_classes: a.classes == ClassesArg::Folders,
        mixed_modalities: a.mixed_modalities,
        on_error: match a.on_error {
            OnErrorArg::Skip => OnError::Skip,
            OnErrorArg::Fail => OnError::Fail,
        },
        decode: DecodeOptions {
            every: a.every,
            fps: a.fps,
            axis: a.axis as usize,
            window,
            orientation: match a.orientation {
                OrientationArg::Lps => prep::source::volume::Orientation::Lps,
                OrientationArg::Stored => prep::source::volume::Orientation::Stored,
            },
            spacing: a.spacing,
            fourth: match a.fourth_axis {
                FourthAxisArg::Auto => prep::source::volume::FourthAxis::Auto,
                FourthAxisArg::Channels => prep::source::volume::FourthAxis::Channels,
                FourthAxisArg::Time => prep::source::volume::FourthAxis::Time,
            },
            ..Default::default()
        },
        format: a.store.format(),
        codec: a.store.codec()?,
        block_samples: a.store.block_samples,
        shard_blocks: a.store.shard_blocks,
        force: a.force,
        part: a.part,
        skip_empty_masks: a.skip_empty_masks,
        meta: a.meta,
        quiet,
    })
}

/// What the conversion made (or found already made), and the first of its rejects.
fn print_report(a: &ConvertArgs, r: &ConvertReport) -> anyhow::Result<()> {
    let shape: Vec<String> = r.shape.iter().map(|d| d.to_string()).collect();
    let splits = splits_line(r);
    if r.already_complete {
        outln!(
            "{} already holds this conversion of {} ({splits}, {} on disk); nothing to do (--force converts again)",
            prep::source::tree::shown_path(&a.out),
            a.input.display(),
            human(r.bytes_on_disk)
        );
        return Ok(());
    }
    outln!(
        "converted {} ({:?}) to {}: {splits} of {} {}, {} classes, in {:.2} s ({} samples/s), {} on disk, peak RSS {}",
        a.input.display(),
        r.kind,
        a.out.display(),
        shape.join("x"),
        r.dtype,
        r.classes,
        r.seconds,
        thousands(r.samples_per_sec as u64),
        human(r.bytes_on_disk),
        human(r.peak_rss_bytes)
    );
    if let Some(s) = &r.split {
        outln!("{}", s.line());
    }
    print_rejects(a, r);
    Ok(())
}

/// The samples of each split; a tree's own split folders are named with their counts: "splits
/// from folders: train 1,200, val/ -> test 300".
fn splits_line(r: &ConvertReport) -> String {
    if r.split_folders.is_empty() {
        let each: Vec<String> = r
            .splits
            .iter()
            .map(|(s, n)| format!("{} {s}", thousands(*n)))
            .collect();
        format!("{} samples", each.join(" + "))
    } else {
        let each: Vec<String> = r
            .split_folders
            .iter()
            .map(|(folder, s)| {
                let n = thousands(r.splits.get(s).copied().unwrap_or(0));
                if folder == s {
                    format!("{s} {n}")
                } else {
                    format!("{}/ -> {s} {n}", prep::source::tree::shown(folder))
                }
            })
            .collect();
        format!(
            "{} samples (splits from folders: {})",
            thousands(r.splits.values().sum()),
            each.join(", ")
        )
    }
}

/// The count of rejects and the first ten, on stderr.
fn print_rejects(a: &ConvertArgs, r: &ConvertReport) {
    if !r.rejects.is_empty() {
        // An array's unusable samples are rejected one by one, not the whole array.
        eprintln!(
            "skipped {} inputs or array samples, listed with reasons in {}:",
            r.rejects.len(),
            a.out.join("rejects.jsonl").display()
        );
        for x in r.rejects.iter().take(10) {
            eprintln!(
                "  {}: {}",
                prep::source::tree::shown(&x.path),
                prep::source::tree::shown(&x.reason)
            );
        }
        if r.rejects.len() > 10 {
            eprintln!("  ... and {} more", r.rejects.len() - 10);
        }
    }
}

/// `--mask-names`: as `--class-names`, at most 65536 (a u16 mask's values).
fn mask_names(arg: &str) -> anyhow::Result<Vec<String>> {
    let n = names("--mask-names", arg)?;
    if n.len() > prep::format::fields::MAX_NAMES {
        return Err(UsageError(format!(
            "--mask-names gives {} names; a mask has at most {} values",
            n.len(),
            prep::format::fields::MAX_NAMES
        ))
        .into());
    }
    Ok(n)
}

/// `--class-names` (`flag`): 'a,b,c', or @FILE with one name a line (blank lines and a trailing
/// newline ignored). Names must be distinct and not empty.
fn names(flag: &str, arg: &str) -> anyhow::Result<Vec<String>> {
    let names: Vec<String> = if let Some(file) = arg.strip_prefix('@') {
        let path = std::path::Path::new(file);
        let text = prep::store::local::read_text_capped(path, 16 << 20, "a names file")?;
        text.lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect()
    } else {
        arg.split(',').map(|s| s.trim().to_string()).collect()
    };
    if names.iter().any(String::is_empty) {
        return Err(UsageError(format!("{flag} {arg}: a name is empty")).into());
    }
    let mut seen = std::collections::BTreeSet::new();
    if let Some(d) = names.iter().find(|n| !seen.insert(n.as_str())) {
        return Err(UsageError(format!("{flag}: {d} is named twice")).into());
    }
    Ok(names)
}
