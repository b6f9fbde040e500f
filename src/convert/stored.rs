//! A prep dataset or column-major files as input: planned by shard block or sample chunk, and
//! decoded into the target's shape and dtype.

use super::units::Failed;
use super::units::{Plan, Stored, Unit, Values};
use super::*;

/// A prep dataset (shards or column-major, to change its format, dtype, size or blocks) or
/// column-major files without a manifest: its splits and classes as they are, one unit per
/// shard block or per chunk of column-major samples. Labels of column-major files are checked
/// here in one pass over the labels files.
pub(super) fn plan_stored(o: &ConvertOptions, kind: Kind) -> Result<Plan> {
    let input = &o.input;
    refuse_out_is_input(o)?;
    let mut splits: BTreeMap<String, Vec<Unit>> = BTreeMap::new();
    let mut rejects = Vec::new();
    let mut inputs = 0;
    let mut notes = Vec::new();
    let (classes, shape, dtype) = if kind == Kind::Shards {
        shard_units(o, &mut splits, &mut rejects, &mut inputs)?
    } else {
        let manifest_path = input.join(manifest::FILE_NAME);
        let (found, shape, dtype, classes) = if manifest_path.is_file() {
            read_colmajor_manifest(o)?
        } else {
            read_colmajor_files(o, &mut notes)?
        };
        column_units(o, found, dtype, &mut splits, &mut inputs);
        (classes, shape, dtype)
    };
    Ok(Plan {
        fields: Default::default(),
        kind,
        classes,
        splits,
        native: None,
        rejects,
        inputs,
        root: input.clone(),
        notes,
        split_key: None,
        drawn: None,
        stored: Some((shape, dtype)),
    })
}

/// A dataset whose samples carry fields is not converted again: the conversion carries images
/// and classes only, and would drop the fields without a word; the column-major layout has no
/// place for them at all.
fn refuse_fields(o: &ConvertOptions, fields: &crate::format::fields::Fields) -> Result<()> {
    if fields.is_empty() {
        return Ok(());
    }
    let names: Vec<String> = fields
        .iter()
        .map(|f| format!("{} ({})", f.name, f.kind.name()))
        .collect();
    let why = if o.format == OutputFormat::Colmajor {
        "the column-major layout has images and class labels only (formats/colmajor.md)"
    } else {
        "converting a dataset again keeps only its images and classes"
    };
    Err(Error::Invalid(format!(
        "{}: its samples carry fields ({}); {why}, so prep refuses rather than drop them. \
         Read it as it is (prep train, prep inspect, the Python reader)",
        tree::shown_path(&o.input),
        names.join(", ")
    )))
}

/// The splits of column-major files, each read by its reader.
type ColumnSplits = Vec<(String, ColmajorSplitReader)>;

/// The output is not the dataset read.
fn refuse_out_is_input(o: &ConvertOptions) -> Result<()> {
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same(&o.input, &o.out) {
        return Err(Error::Invalid(format!(
            "{}: --out must be another directory than the dataset converted",
            tree::shown_path(&o.out)
        )));
    }
    Ok(())
}

/// `--shape`, where given, must be the shape the manifest says.
fn check_shape(o: &ConvertOptions, have: &Shape) -> Result<()> {
    match &o.shape {
        Some(s) if s != have => Err(Error::Invalid(format!(
            "{}: --shape {s}, but the manifest says {have}",
            tree::shown_path(&o.input)
        ))),
        _ => Ok(()),
    }
}

/// A unit per block of each shard of a prep shard dataset (a shard that cannot be opened is
/// rejected with --on-error skip); returns its classes, shape and dtype.
fn shard_units(
    o: &ConvertOptions,
    splits: &mut BTreeMap<String, Vec<Unit>>,
    rejects: &mut Vec<RejectEntry>,
    inputs: &mut usize,
) -> Result<(Vec<String>, Shape, Option<Dtype>)> {
    let ds = Dataset::open(&o.input)?;
    let m = &ds.manifest;
    check_shape(o, &m.sample.shape)?;
    refuse_fields(o, &m.fields)?;
    for (split, info) in &m.splits {
        let mut units = Vec::new();
        for sh in &info.shards {
            *inputs += 1;
            let r = match ds.open_shard(sh) {
                Ok(r) => r,
                Err(e) if o.on_error == OnError::Skip => {
                    rejects.push(RejectEntry {
                        path: sh.file.clone(),
                        reason: e.to_string(),
                    });
                    continue;
                }
                Err(e) => return Err(e),
            };
            let src = Arc::new(Stored::Shard(r));
            let Stored::Shard(r) = &*src else {
                unreachable!()
            };
            units.extend((0..r.num_blocks()).map(|b| Unit::Stored {
                name: format!("{} block {b}", sh.file),
                src: src.clone(),
                start: b,
                len: r.entry(b).num_samples as usize,
            }));
        }
        splits.insert(split.clone(), units);
    }
    Ok((
        m.classes.clone(),
        m.sample.shape.clone(),
        Some(m.sample.dtype),
    ))
}

/// Column-major files with prep's manifest: their splits (labels checked against its classes),
/// shape, dtype and classes.
fn read_colmajor_manifest(
    o: &ConvertOptions,
) -> Result<(ColumnSplits, Shape, Option<Dtype>, Vec<String>)> {
    let input = &o.input;
    let m = ColmajorManifest::read(input)?;
    check_shape(o, &m.sample.shape)?;
    let mut found = Vec::new();
    for split in m.splits.keys() {
        let r = ColmajorSplitReader::open(input, &m, split)?;
        r.check_labels(Some(m.classes.len()))?;
        found.push((split.clone(), r));
    }
    Ok((found, m.sample.shape, Some(m.sample.dtype), m.classes))
}

/// Column-major files without a manifest: the shape from --shape, the classes from the labels.
fn read_colmajor_files(
    o: &ConvertOptions,
    notes: &mut Vec<String>,
) -> Result<(ColumnSplits, Shape, Option<Dtype>, Vec<String>)> {
    let input = &o.input;
    let pairs = crate::format::colmajor::find_splits(input)?;
    if pairs.is_empty() {
        return Err(Error::Invalid(format!(
            "{}: no images_<split>.bin with labels_<split>.bin: not column-major files",
            tree::shown_path(input)
        )));
    }
    let shape = o.shape.clone().ok_or_else(|| {
        Error::Invalid(format!(
            "{}: column-major files without manifest.json do not say their sample shape: give it with --shape CxHxW",
            tree::shown_path(input)
        ))
    })?;
    let mut found = Vec::new();
    let mut k = 1;
    for (split, ip, lp) in pairs {
        let r = ColmajorSplitReader::open_files(&ip, &lp, &shape)?;
        k = k.max(r.check_labels(None)?.len());
        found.push((split, r));
    }
    notes.push(format!(
        "no manifest.json: {shape} samples from --shape, {k} classes (0 to {}) from the labels",
        k - 1
    ));
    let classes = (0..k).map(|c| c.to_string()).collect();
    Ok((found, shape, None, classes))
}

/// A unit per chunk of samples of each column-major split.
fn column_units(
    o: &ConvertOptions,
    found: ColumnSplits,
    dtype: Option<Dtype>,
    splits: &mut BTreeMap<String, Vec<Unit>>,
    inputs: &mut usize,
) {
    let values = match (dtype, o.dtype) {
        (Some(d), _) => Values::Manifest(d),
        (None, None) => Values::Auto,
        (None, Some(_)) => Values::Float,
    };
    for (split, r) in found {
        *inputs += 2;
        let (n, chunk) = (
            r.samples,
            crate::format::colmajor::chunk_samples(r.features),
        );
        let file = crate::format::colmajor::images_name(&split);
        let src = Arc::new(Stored::Columns(r, values));
        splits.insert(
            split,
            (0..n)
                .step_by(chunk)
                .map(|start| Unit::Stored {
                    name: format!("{file}[{start}..]"),
                    src: src.clone(),
                    start,
                    len: chunk.min(n - start),
                })
                .collect(),
        );
    }
}

/// The target of a conversion of stored samples: their shape (the last two dimensions resized
/// by `--size`, for C x H x W samples) and their dtype unless `--dtype`; channels are kept.
/// Returns whether the dtype is u8 only as long as the values allow it (`Values::Auto`).
pub(super) fn stored_target(
    o: &ConvertOptions,
    shape: &Shape,
    dtype: Option<Dtype>,
) -> Result<(Target, SampleSpec, bool)> {
    let dims = &shape.0;
    let c = dims[0];
    if let Some(ch) = o.channels {
        if ch as u32 != c {
            return Err(Error::Invalid(format!(
                "--channels {ch}: converting a prep dataset or column-major files keeps the samples' {c} channels"
            )));
        }
    }
    let (h, w) = match dims.len() {
        3 => (dims[1], dims[2]),
        _ => (1, *dims.last().expect("a shape has dimensions")),
    };
    let (th, tw) = match o.size {
        Some(sz) if dims.len() != 3 && sz != (h, w) => {
            return Err(Error::Invalid(format!(
                "--size resizes C x H x W images; these samples are {shape}"
            )))
        }
        Some(sz) => sz,
        None => (h, w),
    };
    let out_shape = if dims.len() == 3 {
        Shape::new(vec![c, th, tw])?
    } else {
        shape.clone()
    };
    let auto = o.dtype.is_none() && dtype.is_none();
    let t = Target {
        channels: c.min(u8::MAX as u32) as u8,
        height: th,
        width: tw,
        dtype: o.dtype.or(dtype).unwrap_or(Dtype::U8),
        fit: o.fit,
    };
    let spec = SampleSpec {
        shape: out_shape,
        dtype: t.dtype,
    };
    Ok((t, spec, auto))
}

/// Samples of a stored unit (a shard block, or a chunk of column-major samples) in the target:
/// kept as they are when shape and dtype agree, else each value taken as `value / divisor`
/// (pixels in [0, 1], float values as they are) and stored by `colmajor::encode_scaled`, resized
/// plane by plane when `--size` asks (integer to integer pixels as images are resized, anything
/// else through float planes). A sample that cannot be stored is left out with its reason.
pub(super) fn decode_stored(
    src: &Stored,
    start: usize,
    len: usize,
    t: &Target,
    out: &mut Vec<u8>,
    labels: &mut Vec<u32>,
) -> Result<Vec<RejectEntry>, Failed> {
    let mut rejects = Vec::new();
    // The samples as stored (dtype, shape, pixels, labels), and the index in the unit of each.
    let (dtype, shape, px, lb, idx) = match src {
        Stored::Shard(r) => {
            let b = r
                .read_block(start)
                .map_err(|e| Reject::new(e.to_string()))?;
            let n = b.len();
            let lb: Vec<u32> = b.labels().collect();
            let mut px = b.into_data();
            px.truncate(n * r.spec().bytes());
            (r.spec().dtype, &r.spec().shape, px, lb, (0..n).collect())
        }
        Stored::Columns(r, values) => {
            let f = r.features;
            let mut vals = vec![0f32; len * f];
            r.read_chunk(start, len, &mut vals);
            let (d, strict) = match *values {
                Values::Manifest(d) => (d, true),
                Values::Auto => (Dtype::U8, true),
                Values::Float => (Dtype::F32, false),
            };
            let sb = f * d.size();
            let mut px = vec![0u8; len * sb];
            let mut lb = Vec::with_capacity(len);
            let mut idx = Vec::with_capacity(len);
            let mut at = 0;
            // Labels were checked when planning.
            for (i, (v, l)) in vals.chunks_exact(f).zip(r.labels(start, len)).enumerate() {
                let p = &mut px[at..at + sb];
                let res = crate::format::colmajor::encode_exact(
                    v,
                    if strict { d } else { Dtype::F32 },
                    p,
                );
                match res {
                    Ok(()) => {
                        at += sb;
                        lb.push(l as u32);
                        idx.push(i);
                    }
                    Err((k, val)) if *values == Values::Auto && val.is_finite() => {
                        return Err(Failed::NotU8(format!(
                            "{} feature {k} holds {val}, not a u8 pixel / 255",
                            sample_name(src, start, i)
                        )))
                    }
                    Err((k, val)) => rejects.push(RejectEntry {
                        path: sample_name(src, start, i),
                        reason: if val.is_finite() {
                            format!(
                                "feature {k}: value {val} is not a {d} value as the manifest says ({d} pixels are stored as k / {})",
                                d.divisor()
                            )
                        } else {
                            format!("feature {k}: value {val}: float samples must be finite")
                        },
                    }),
                }
            }
            px.truncate(at);
            (d, &r.shape, px, lb, idx)
        }
    };
    let dims = &shape.0;
    let resize = dims.len() == 3 && (t.height, t.width) != (dims[1], dims[2]);
    let sb_in = shape.elems() * dtype.size();
    let mut vals: Vec<f32> = Vec::new();
    for (j, (&l, &i)) in lb.iter().zip(&idx).enumerate() {
        let p = &px[j * sb_in..(j + 1) * sb_in];
        let at = out.len();
        let r = if !resize && dtype == t.dtype {
            out.extend_from_slice(p);
            Ok(())
        } else if !resize {
            vals.clear();
            vals.extend((0..shape.elems()).map(|k| crate::format::colmajor::value_of(dtype, p, k)));
            out.resize(at + vals.len() * t.dtype.size(), 0);
            crate::format::colmajor::encode_scaled(&vals, t.dtype, &mut out[at..])
                .map_err(|e| format!("feature {}: {e}", e.index()))
        } else {
            resize_planes(p, dtype, (dims[0] as usize, dims[1], dims[2]), t, out)
        };
        match r {
            Ok(()) => labels.push(l),
            Err(reason) => {
                out.truncate(at);
                rejects.push(RejectEntry {
                    path: sample_name(src, start, i),
                    reason,
                });
            }
        }
    }
    Ok(rejects)
}

/// Sample `i` of a stored unit, for the rejects report: `images_train.bin[17]`, or
/// `train-00000.shard block 3 sample 5`.
pub(super) fn sample_name(src: &Stored, start: usize, i: usize) -> String {
    let file = |p: &Path| {
        p.file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned()
    };
    match src {
        Stored::Shard(r) => format!("{} block {start} sample {i}", file(r.path())),
        Stored::Columns(r, _) => format!("{}[{}]", file(&r.images_path), start + i),
    }
}

/// One C x H x W sample of `dtype` resized to the target's height and width, plane by plane
/// (channels resize independently, so this is what resizing the whole image gives), appended to
/// `out` as the target dtype. u8/u16 to u8/u16 goes through the image resizer as images do;
/// otherwise each plane is a float plane of `value / divisor`.
pub(super) fn resize_planes(
    p: &[u8],
    dtype: Dtype,
    (c, h, w): (usize, u32, u32),
    t: &Target,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    use image::{DynamicImage, ImageBuffer};
    let plane = h as usize * w as usize;
    let one = Target {
        channels: 1,
        ..t.clone()
    };
    let ints = !dtype.is_float() && !t.dtype.is_float();
    for ch in 0..c {
        let range = ch * plane..(ch + 1) * plane;
        if ints {
            let img = match dtype {
                Dtype::U8 => DynamicImage::ImageLuma8(
                    ImageBuffer::from_raw(w, h, p[range].to_vec()).expect("h * w pixels"),
                ),
                _ => DynamicImage::ImageLuma16(
                    ImageBuffer::from_raw(w, h, range.map(|k| dtype.get(p, k) as u16).collect())
                        .expect("h * w pixels"),
                ),
            };
            to_sample(Frame::Image(img), &one, out).map_err(|r| r.0)?;
            continue;
        }
        let data: Vec<f32> = range
            .clone()
            .map(|k| crate::format::colmajor::value_of(dtype, p, k))
            .collect();
        if !t.dtype.is_float() {
            // Pixels come from values in [0, 1]; the resize keeps them there (up to rounding).
            if let Some(&v) = data.iter().find(|v| !(0.0..=1.0).contains(*v)) {
                return Err(format!(
                    "channel {ch}: {}",
                    crate::format::colmajor::ScaleError::OutOfRange(0, v)
                ));
            }
        }
        let frame = Frame::Float(FloatFrame {
            channels: 1,
            height: h,
            width: w,
            data,
        });
        if t.dtype.is_float() {
            to_sample(frame, &one, out).map_err(|r| format!("channel {ch}: {}", r.0))?;
        } else {
            let mut f = Vec::new();
            let as_f32 = Target {
                dtype: Dtype::F32,
                ..one.clone()
            };
            to_sample(frame, &as_f32, &mut f).map_err(|r| format!("channel {ch}: {}", r.0))?;
            let vals: Vec<f32> = f
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]).clamp(0.0, 1.0))
                .collect();
            let at = out.len();
            out.resize(at + vals.len() * t.dtype.size(), 0);
            crate::format::colmajor::encode_scaled(&vals, t.dtype, &mut out[at..])
                .map_err(|e| format!("channel {ch}: {e}"))?;
        }
    }
    Ok(())
}
