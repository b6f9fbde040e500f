//! What the input is (`detect`) and what it holds (`plan`): array datasets (IDX, CIFAR, .npy) here,
//! trees in `tree`, prep datasets and column-major files in `stored`.

use super::folders::plan_tree;
use super::stored::plan_stored;
use super::units::{array_units, Array, ArrayData, Plan, Unit, ARRAY_CHUNK};
use super::*;

pub(super) fn detect(input: &Path) -> Kind {
    if input.is_dir() {
        if input.join(manifest::FILE_NAME).is_file() {
            match crate::format::dataset_format(input).as_deref() {
                Ok(crate::format::colmajor::FORMAT) => return Kind::Colmajor,
                Ok(manifest::FORMAT) => return Kind::Shards,
                _ => {}
            }
        }
        if crate::source::msd::detect(input) {
            return Kind::Msd;
        }
        if crate::format::colmajor::looks_like_seed(input) {
            return Kind::Colmajor;
        }
        if idx::detect(input) {
            return Kind::Idx;
        }
        if cifar::find(input).is_some() {
            return Kind::Cifar;
        }
        // .npy files at the top make it an array dataset even when their names are not ones
        // `npy::find` knows: the plan then lists the names it looks for.
        if npy::find(input).map_or(true, |p| !p.is_empty()) || has_top_npy(input) {
            return Kind::Npy;
        }
    }
    Kind::Auto
}

pub(super) fn has_top_npy(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|rd| {
        rd.flatten().any(|e| {
            e.path()
                .extension()
                .is_some_and(|x| x.eq_ignore_ascii_case("npy"))
        })
    })
}

/// What the input holds: its kind (detected unless given), checked against the options, and
/// planned by the planner of that kind.
pub(super) fn plan(o: &ConvertOptions) -> Result<Plan> {
    let input = &o.input;
    if !input.exists() {
        return Err(Error::Invalid(format!(
            "{}: no such file or directory",
            tree::shown_path(input)
        )));
    }
    let kind = if o.kind == Kind::Auto {
        detect(input)
    } else {
        o.kind
    };
    refuse_shape(o, kind)?;
    refuse_labels(o, kind)?;
    if o.skip_empty_masks && kind != Kind::Msd {
        return Err(Error::Invalid(format!(
            "{}: --skip-empty-masks leaves out the slices of volumes whose label slice is all background (a Medical Segmentation Decathlon / nnU-Net folder); this input is {}",
            tree::shown_path(input),
            match kind {
                Kind::Auto => "a folder of files".to_string(),
                k => format!("a {k:?} dataset"),
            }
        )));
    }
    match kind {
        Kind::Msd => super::msd::plan_msd(o),
        Kind::Idx => plan_idx(o),
        Kind::Cifar => plan_cifar(o),
        Kind::Npy => plan_npy(o),
        Kind::Auto | Kind::Images | Kind::Tiff | Kind::Video | Kind::Dicom | Kind::Nifti => {
            plan_tree(o, kind)
        }
        Kind::Colmajor | Kind::Shards => plan_stored(o, kind),
    }
}

/// A file of the input that cannot be read, as an error naming it.
fn fail(input: &Path, name: &str, r: Reject) -> Error {
    Error::Source(format!("{}: {r}", tree::shown_path(&input.join(name))))
}

/// `--shape` is only for column-major files without a manifest.
fn refuse_shape(o: &ConvertOptions, kind: Kind) -> Result<()> {
    if o.shape.is_some() && kind != Kind::Colmajor {
        return Err(Error::Invalid(format!(
            "{}: --shape gives the sample shape of column-major files without a manifest; this input is {}",
            tree::shown_path(&o.input),
            match kind {
                Kind::Auto => "a folder of files".to_string(),
                Kind::Shards => "a prep shard dataset, whose manifest says its shape".to_string(),
                k => format!("a {k:?} dataset"),
            }
        )));
    }
    Ok(())
}

/// `--labels` and `--label-from` label a folder's files, not a dataset with labels of its own.
fn refuse_labels(o: &ConvertOptions, kind: Kind) -> Result<()> {
    if matches!(
        kind,
        Kind::Idx | Kind::Cifar | Kind::Npy | Kind::Msd | Kind::Colmajor | Kind::Shards
    ) {
        for (flag, given) in [
            ("--labels", o.labels.is_some()),
            ("--label-from", o.label_from.is_some()),
            ("--masks", o.masks.is_some()),
            ("--classes folders", o.folder_classes),
        ] {
            if given {
                return Err(Error::Invalid(format!(
                    "{}: {flag} labels the files of a folder, but this is a {kind:?} dataset with labels of its own",
                    tree::shown_path(&o.input)
                )));
            }
        }
        if o.meta && kind != Kind::Msd {
            let npy = if kind == Kind::Npy {
                " (.npy arrays take their metadata from meta_<split>.jsonl beside them)"
            } else {
                ""
            };
            return Err(Error::Invalid(format!(
                "{}: --meta gives the samples of a folder's files where they come from, but this is a {kind:?} dataset{npy}",
                tree::shown_path(&o.input)
            )));
        }
    }
    Ok(())
}

/// IDX files (MNIST's layout): the train and test images with their labels.
fn plan_idx(o: &ConvertOptions) -> Result<Plan> {
    let input = &o.input;
    let mut splits: BTreeMap<String, Vec<Unit>> = BTreeMap::new();
    let mut classes = 0;
    let mut native = None;
    for split in ["train", "test"] {
        let Some((ip, lp)) = idx::find(input, split) else {
            continue;
        };
        let name = |p: &Path| {
            p.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned()
        };
        let im = idx::read(&ip).map_err(|r| fail(input, &name(&ip), r))?;
        let lb = idx::read(&lp).map_err(|r| fail(input, &name(&lp), r))?;
        if im.dims.len() != 3 || lb.dims.len() != 1 || lb.dims[0] != im.dims[0] {
            return Err(fail(
                input,
                &name(&ip),
                Reject::new(format!(
                    "images {:?} and labels {:?} do not match",
                    im.dims, lb.dims
                )),
            ));
        }
        let labels: Vec<u32> = lb.data.iter().map(|&l| l as u32).collect();
        classes = classes.max(labels.iter().max().map_or(0, |&m| m as usize + 1));
        let a = Arc::new(Array {
            targets: None,
            meta: None,
            name: name(&ip),
            n: im.dims[0],
            channels: 1,
            height: im.dims[1],
            width: im.dims[2],
            planar: true,
            dtype: Dtype::U8,
            data: ArrayData::Bytes(im.data),
            labels,
        });
        native = Some((1, (a.height as u32, a.width as u32), Dtype::U8));
        splits.insert(split.into(), array_units(&name(&ip), a));
    }
    let classes = idx::class_names(input, classes.max(1))
        .unwrap_or_else(|| (0..classes.max(1)).map(|k| k.to_string()).collect());
    Ok(Plan {
        fields: Default::default(),
        kind: Kind::Idx,
        classes,
        splits,
        native,
        rejects: vec![],
        inputs: 4,
        root: input.clone(),
        notes: vec![],
        split_key: None,
        stored: None,
        drawn: None,
    })
}

/// CIFAR-10 or CIFAR-100 batches, by split.
fn plan_cifar(o: &ConvertOptions) -> Result<Plan> {
    let input = &o.input;
    let mut splits: BTreeMap<String, Vec<Unit>> = BTreeMap::new();
    let (v, train, test) = cifar::find(input).ok_or_else(|| {
        Error::Invalid(format!(
            "{}: no CIFAR batches (data_batch_N.bin or train.bin)",
            tree::shown_path(input)
        ))
    })?;
    let mut max_label = 0;
    let inputs = train.len() + test.len();
    for (split, files) in [("train", train), ("test", test)] {
        let mut units = Vec::new();
        for f in files {
            let name = f
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            let raw = cifar::read(&f, v).map_err(|r| fail(input, &name, r))?;
            let n = raw.len() / v.record();
            let mut data = Vec::with_capacity(n * cifar::PIXELS);
            let mut labels = Vec::with_capacity(n);
            for rec in raw.chunks_exact(v.record()) {
                labels.push(rec[v.label_offset()] as u32);
                data.extend_from_slice(&rec[v.record() - cifar::PIXELS..]);
            }
            max_label = max_label.max(*labels.iter().max().unwrap_or(&0));
            let a = Arc::new(Array {
                targets: None,
                meta: None,
                name: name.clone(),
                n,
                channels: 3,
                height: 32,
                width: 32,
                planar: true,
                dtype: Dtype::U8,
                data: ArrayData::Bytes(data),
                labels,
            });
            units.extend(array_units(&name, a));
        }
        if !units.is_empty() {
            splits.insert(split.into(), units);
        }
    }
    let k = (max_label as usize + 1).max(if v == cifar::Variant::Cifar10 {
        10
    } else {
        100
    });
    let classes = cifar::class_names(input, v)
        .filter(|n| n.len() >= k)
        .unwrap_or_else(|| (0..k).map(|i| i.to_string()).collect());
    Ok(Plan {
        fields: Default::default(),
        kind: Kind::Cifar,
        classes,
        splits,
        native: Some((3, (32, 32), Dtype::U8)),
        rejects: vec![],
        inputs,
        root: input.clone(),
        notes: vec![],
        split_key: None,
        stored: None,
        drawn: None,
    })
}

/// Pairs of .npy files (images and labels), by split.
fn plan_npy(o: &ConvertOptions) -> Result<Plan> {
    let input = &o.input;
    let pairs = npy_pairs(input)?;
    let mut splits: BTreeMap<String, Vec<Unit>> = BTreeMap::new();
    let mut max_label = 0;
    let mut native = None;
    // The field of `y` arrays that are not classes: the same kind in every pair.
    let mut field: Option<Field> = None;
    let mut read = Vec::new();
    // Each pair's metadata file, or the name it would have.
    let mut metas = Vec::new();
    // How train and test were drawn, for one unsplit pair.
    let mut drawn = None;
    for (split, ip, lp) in &pairs {
        let float = o.dtype.is_some_and(Dtype::is_float);
        let im = npy::read_images(ip, float).map_err(|r| fail(input, &file_name(ip), r))?;
        let targets = npy::read_targets(lp, im.n, (im.height, im.width))
            .map_err(|r| fail(input, &file_name(lp), r))?;
        let (labels, targets) = match targets {
            npy::Targets::Class(labels) => (labels, None),
            t => {
                let f = target_field(&t);
                field = Some(join_fields(input, &file_name(lp), field.take(), f)?);
                (vec![0; im.n], Some(t))
            }
        };
        max_label = max_label.max(labels.iter().copied().max().unwrap_or(0));
        let mp = crate::source::meta::beside(lp);
        let meta = if mp.exists() {
            let m = crate::source::meta::read(&mp, im.n)
                .map_err(|r| fail(input, &file_name(&mp), r))?;
            Ok(Arc::new(m))
        } else {
            Err(mp)
        };
        native = Some((
            (im.channels.min(3)) as u8,
            (im.height as u32, im.width as u32),
            im.dtype,
        ));
        metas.push(meta.clone());
        read.push((split, ip, im, labels, targets, meta));
    }
    let meta_field = meta_field(input, &metas)?;
    for (split, ip, im, labels, mut targets, meta) in read {
        // Every mask is read as the field's dtype (u16 where any split's values need it).
        if let (Some(npy::Targets::Mask { array, .. }), Some(f)) = (&mut targets, &field) {
            array.dtype = f.dtype;
        }
        let a = Arc::new(Array {
            targets,
            meta: meta.ok().zip(meta_field.clone()),
            name: file_name(ip),
            n: im.n,
            channels: im.channels,
            height: im.height,
            width: im.width,
            planar: im.planar,
            dtype: im.dtype,
            data: ArrayData::Npy(im),
            labels,
        });
        if split.is_empty() {
            // One unsplit pair: drawn by runs of samples kept whole, about a hundred of them (a
            // run of 2048 at most), so that a small array still gets the fraction asked.
            let name = file_name(ip);
            let run = a.n.div_ceil(100).clamp(1, ARRAY_CHUNK);
            let runs = (0..a.n)
                .step_by(run)
                .map(|start| {
                    let key = format!("{name}[{start}..]");
                    let unit = Unit::Array {
                        name: key.clone(),
                        array: a.clone(),
                        start,
                        len: run.min(a.n - start),
                    };
                    (super::split::By::Group { what: "chunk", key }, unit)
                })
                .collect();
            let (by_split, d) = super::split::draw(runs, o.test_fraction);
            drawn = d;
            for (s, u) in by_split {
                splits.entry(s).or_default().push(u);
            }
        } else {
            splits.insert(split.clone(), array_units(&file_name(ip), a));
        }
    }
    let classes = match field {
        // Samples with a mask, labels or values have no class of their own: one class.
        Some(_) => vec!["all".to_string()],
        None => (0..=max_label).map(|k| k.to_string()).collect(),
    };
    Ok(Plan {
        fields: Fields(field.into_iter().chain(meta_field).collect()),
        kind: Kind::Npy,
        classes,
        splits,
        native,
        rejects: vec![],
        inputs: pairs.len() * 2,
        root: input.clone(),
        notes: vec![],
        split_key: None,
        stored: None,
        drawn,
    })
}

/// The metadata field of the .npy pairs' metadata files (`meta_<split>.jsonl`): every key of
/// any, room for the largest line. Some splits with a file and others without is an error:
/// their samples would carry nothing without a word.
fn meta_field(
    input: &Path,
    metas: &[std::result::Result<Arc<crate::source::meta::MetaLines>, PathBuf>],
) -> Result<Option<Field>> {
    let with: Vec<_> = metas.iter().filter_map(|m| m.as_ref().ok()).collect();
    if with.is_empty() {
        return Ok(None);
    }
    if let Some(Err(missing)) = metas.iter().find(|m| m.is_err()) {
        return Err(Error::Invalid(format!(
            "{}: {} holds metadata but there is no {}: give every split its metadata file or none",
            tree::shown_path(input),
            file_name(&with[0].path),
            file_name(missing),
        )));
    }
    let mut keys: Vec<String> = Vec::new();
    for m in &with {
        for k in &m.keys {
            if !keys.contains(k) {
                keys.push(k.clone());
            }
        }
    }
    let bytes = with.iter().map(|m| m.bytes).max().unwrap_or(2);
    if keys.is_empty() {
        keys.push("none".into());
    }
    Ok(Some(Field::meta("meta", keys, bytes)))
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}

/// The field a `y` array that is not classes makes: `mask` (value names "0", "1", ...; its
/// shape the target's, known once the target is: `tree_fields::fill`), `labels` or `values`
/// (names "0".."K-1").
fn target_field(t: &npy::Targets) -> Field {
    let names = |n: usize| (0..n).map(|k| k.to_string()).collect::<Vec<_>>();
    match t {
        npy::Targets::Mask { array, values } => Field {
            shape: vec![],
            ..Field::mask("mask", &[1], array.dtype, names(*values))
        },
        npy::Targets::Labels { k, .. } => Field::labels("labels", names(*k)),
        npy::Targets::Values { k, .. } => Field::values("values", names(*k)),
        npy::Targets::Class(_) => unreachable!("classes are no field"),
    }
}

/// The field of every pair: one kind and size; a mask's names those of its largest value.
fn join_fields(input: &Path, file: &str, seen: Option<Field>, f: Field) -> Result<Field> {
    let Some(seen) = seen else { return Ok(f) };
    let same = seen.kind == f.kind
        && (f.kind == crate::format::fields::FieldKind::Mask || seen.names.len() == f.names.len());
    if !same {
        return Err(Error::Invalid(format!(
            "{}: {file} holds {} of {}, another targets file {} of {}: every split's targets must be of one kind",
            tree::shown_path(input),
            f.kind.name(),
            f.names.len(),
            seen.kind.name(),
            seen.names.len()
        )));
    }
    let mut joined = if f.names.len() > seen.names.len() {
        f
    } else {
        seen
    };
    if joined.kind == crate::format::fields::FieldKind::Mask && joined.names.len() > 256 {
        joined.dtype = Dtype::U16;
    }
    Ok(joined)
}

/// The (split, images, labels) .npy files of a folder; none is an error listing the names.
fn npy_pairs(input: &Path) -> Result<Vec<(String, PathBuf, PathBuf)>> {
    let pairs = if input.is_dir() {
        npy::find(input).map_err(|e| Error::Invalid(format!("{}: {e}", tree::shown_path(input))))?
    } else {
        vec![]
    };
    if pairs.is_empty() {
        return Err(Error::Invalid(format!(
            "{}: no pair of .npy files by the names prep looks for: {}",
            tree::shown_path(input),
            npy::NAMES_HELP
        )));
    }
    Ok(pairs)
}
