//! NumPy `.npy` arrays: images of shape (N, H, W), (N, H, W, C) or (N, C, H, W) with dtype
//! uint8, uint16 or float, and labels of shape (N,) of any integer type. For a u8/u16 target float
//! values are taken as values in [0, 1] (to u8); for an f16/f32 target they are kept: float16 and
//! float32 exactly, float64 rounded to the nearest float32. File pairs are found by name:
//! `{train,test}_{images,labels}.npy`, `x_{train,test}.npy` / `y_{train,test}.npy`, or one
//! `images.npy` + `labels.npy`.

use super::Reject;
use crate::shard::Dtype;
use std::path::{Path, PathBuf};

/// An image array, loaded into memory as u8, u16, f16 or f32 values in sample-major HWC or CHW
/// order.
pub struct NpyImages {
    pub n: usize,
    pub channels: usize,
    pub height: usize,
    pub width: usize,
    /// true: each sample is C x H x W; false: H x W x C.
    pub planar: bool,
    pub dtype: Dtype,
    /// Values of `dtype`, little-endian.
    pub data: Vec<u8>,
}

const MAX_BYTES: u64 = 16 << 30;

/// Largest header accepted: numpy writes well under 1 KiB, and `np.load` refuses more than
/// 10 000 bytes by default.
const MAX_HEADER: u64 = 64 << 10;
/// Deepest bracket nesting accepted in the header (see `check_header`).
const MAX_HEADER_DEPTH: usize = 4;

fn open(path: &Path) -> Result<npyz::NpyFile<std::io::BufReader<std::fs::File>>, Reject> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).map_err(|e| Reject::new(e.to_string()))?;
    let len = f.metadata().map_err(|e| Reject::new(e.to_string()))?.len();
    let mut head = Vec::new();
    (&mut f)
        .take(12 + MAX_HEADER)
        .read_to_end(&mut head)
        .map_err(|e| Reject::new(e.to_string()))?;
    check_header(&head, len)?;
    f.seek(SeekFrom::Start(0))
        .map_err(|e| Reject::new(e.to_string()))?;
    npyz::NpyFile::new(std::io::BufReader::new(f))
        .map_err(|e| Reject::new(format!("not a valid .npy file: {e}")))
}

/// What npyz trusts before it allocates and multiplies: it allocates the header length the file
/// declares (up to 4 GiB from a 12-byte file), and multiplies the shape's dimensions unchecked
/// (a panic where overflow checks are on). So the header must lie within the file and
/// `MAX_HEADER`, and its shape must be integers whose product (zeros counted as 1, as npyz's
/// strides multiply past them) fits in 64 bits. `head`: the file's first bytes, `len`: its size.
fn check_header(head: &[u8], len: u64) -> Result<(), Reject> {
    if head.len() < 10 || &head[..6] != b"\x93NUMPY" {
        return Err(Reject::new("not a valid .npy file: no \\x93NUMPY magic"));
    }
    let (text_at, text_len) = match head[6] {
        1 => (10, u16::from_le_bytes([head[8], head[9]]) as u64),
        2 | 3 if head.len() >= 12 => (
            12,
            u32::from_le_bytes(head[8..12].try_into().unwrap()) as u64,
        ),
        v => {
            return Err(Reject::new(format!(
                "not a valid .npy file: format version {v}.{} (truncated or unknown)",
                head[7]
            )))
        }
    };
    if text_len > MAX_HEADER || text_at + text_len > len {
        return Err(Reject::new(format!(
            "not a valid .npy file: the header declares {text_len} bytes, the file has {} after the preamble (at most {MAX_HEADER} are read)",
            len.saturating_sub(text_at)
        )));
    }
    let text = &head[text_at as usize..(text_at + text_len) as usize];
    // npyz parses the header with a backtracking grammar whose time grows about threefold with
    // each level of brackets: a 128-byte header 27 braces deep did not finish in 200 s (the npy
    // fuzz target). The dtypes prep reads need two levels (the dict and the shape tuple); record
    // dtypes, which nest deeper, are rejected later anyway.
    let mut depth = 0usize;
    for &c in text {
        match c {
            b'{' | b'[' | b'(' => depth += 1,
            b'}' | b']' | b')' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if depth > MAX_HEADER_DEPTH {
            return Err(Reject::new(format!(
                "not a valid .npy file: the header nests brackets more than {MAX_HEADER_DEPTH} deep"
            )));
        }
    }
    let bad_shape =
        || Reject::new("not a valid .npy file: the header has no 'shape' tuple of integers");
    let key = [&b"'shape'"[..], b"\"shape\""]
        .iter()
        .find_map(|k| {
            text.windows(k.len())
                .position(|w| w == *k)
                .map(|i| i + k.len())
        })
        .ok_or_else(bad_shape)?;
    let rest = &text[key..];
    let skip_ws = |s: &[u8]| {
        s.iter()
            .position(|c| !c.is_ascii_whitespace())
            .unwrap_or(s.len())
    };
    let rest = &rest[skip_ws(rest)..];
    let rest = rest.strip_prefix(b":").ok_or_else(bad_shape)?;
    let rest = &rest[skip_ws(rest)..];
    let close = match rest.first() {
        Some(b'(') => b')',
        Some(b'[') => b']',
        _ => return Err(bad_shape()),
    };
    let end = rest
        .iter()
        .position(|&c| c == close)
        .ok_or_else(bad_shape)?;
    let mut product: u64 = 1;
    for dim in rest[1..end].split(|&c| c == b',') {
        let dim = std::str::from_utf8(dim).map_err(|_| bad_shape())?.trim();
        if dim.is_empty() {
            continue; // "(3,)"
        }
        if !dim.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad_shape());
        }
        product = dim
            .parse::<u64>()
            .ok()
            .and_then(|d| product.checked_mul(d.max(1)))
            .ok_or_else(|| {
                Reject::new(format!(
                    "absurd array shape: the dimensions ({}) overflow 64 bits",
                    String::from_utf8_lossy(&rest[1..end])
                ))
            })?;
    }
    Ok(())
}

/// Read an image array. `float`: the target is f16/f32, so float arrays keep their values (f2 as
/// f16, f4 as f32, f8 rounded to f32); otherwise they become u8 as values in [0, 1].
pub fn read_images(path: &Path, float: bool) -> Result<NpyImages, Reject> {
    let npy = open(path)?;
    if npy.order() == npyz::Order::Fortran {
        return Err(Reject::new(
            "Fortran-ordered arrays are not supported; save with np.ascontiguousarray",
        ));
    }
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let (n, c, h, w, planar) = match shape[..] {
        [n, h, w] => (n, 1, h, w, true),
        [n, a, b, c] if matches!(c, 1 | 3 | 4) => (n, c, a, b, false),
        [n, c, h, w] if matches!(c, 1 | 3 | 4) => (n, c, h, w, true),
        _ => {
            return Err(Reject::new(format!(
            "image array shape {shape:?} is not (N,H,W), (N,H,W,C) or (N,C,H,W) with C in 1,3,4"
        )))
        }
    };
    let elems = [n, c, h, w]
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d as u64));
    let type_str = descr(&npy);
    let t = type_str.trim_start_matches(['<', '|', '=']);
    let (dtype, size) = match t {
        "u1" => (Dtype::U8, 1),
        "u2" => (Dtype::U16, 2),
        "f2" if float => (Dtype::F16, 2),
        "f2" => (Dtype::U8, 2),
        "f4" | "f8" if float => (Dtype::F32, if t == "f8" { 8 } else { 4 }),
        "f4" => (Dtype::U8, 4),
        "f8" => (Dtype::U8, 8),
        t => {
            return Err(Reject::new(format!(
                "image dtype {t} is not supported (uint8, uint16, float16, float32, float64)"
            )))
        }
    };
    // `size` is the bytes a value takes as read, before any conversion: the larger allocation.
    elems
        .and_then(|e| e.checked_mul(size))
        .filter(|&b| b <= MAX_BYTES && h > 0 && w > 0)
        .ok_or_else(|| Reject::new(format!("absurd image array shape {shape:?}")))?;
    let bad = |e: std::io::Error| Reject::new(format!("cannot read data: {e}"));
    let data: Vec<u8> = match (t, dtype) {
        ("u1", _) => npy.into_vec::<u8>().map_err(bad)?,
        ("u2", _) => le_bytes(npy.into_vec::<u16>().map_err(bad)?, u16::to_le_bytes),
        ("f2", Dtype::F16) => le_bytes(npy.into_vec::<half::f16>().map_err(bad)?, |v| {
            v.to_le_bytes()
        }),
        ("f4", Dtype::F32) => le_bytes(npy.into_vec::<f32>().map_err(bad)?, f32::to_le_bytes),
        // Rounded to nearest; beyond float32's range a value becomes infinite, which the
        // conversion then rejects.
        ("f8", Dtype::F32) => le_bytes(npy.into_vec::<f64>().map_err(bad)?, |v| {
            (v as f32).to_le_bytes()
        }),
        ("f2", _) => npy
            .into_vec::<half::f16>()
            .map_err(bad)?
            .into_iter()
            .map(|v| unit_to_u8(v.to_f64()))
            .collect(),
        ("f4", _) => npy
            .into_vec::<f32>()
            .map_err(bad)?
            .into_iter()
            .map(|v| unit_to_u8(v as f64))
            .collect(),
        _ => npy
            .into_vec::<f64>()
            .map_err(bad)?
            .into_iter()
            .map(unit_to_u8)
            .collect(),
    };
    if data.len() != n * c * h * w * dtype.size() {
        return Err(Reject::new(
            "array data is shorter than its shape (truncated)",
        ));
    }
    Ok(NpyImages {
        n,
        channels: c,
        height: h,
        width: w,
        planar,
        dtype,
        data,
    })
}

fn le_bytes<T, const N: usize>(v: Vec<T>, f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    v.into_iter().flat_map(f).collect()
}

/// The dtype descriptor without quotes or byte-order mark, e.g. "u1", "f4", "i8".
fn descr<R: std::io::Read>(npy: &npyz::NpyFile<R>) -> String {
    let d = npy.dtype().descr();
    d.trim_matches(['\'', '"'])
        .trim_start_matches(['<', '|', '='])
        .to_string()
}

/// Floats are taken as values in [0, 1] (clamped), as most pipelines store them.
fn unit_to_u8(v: f64) -> u8 {
    (v.clamp(0.0, 1.0) * 255.0).round() as u8
}

pub fn read_labels(path: &Path, n: usize) -> Result<Vec<u32>, Reject> {
    let npy = open(path)?;
    let shape = npy.shape().to_vec();
    if shape != [n as u64] {
        return Err(Reject::new(format!(
            "labels have shape {shape:?}, expected ({n},)"
        )));
    }
    let t = descr(&npy);
    let vals: Vec<i64> = match t.trim_start_matches(['<', '|', '=']) {
        "u1" => npy
            .into_vec::<u8>()
            .map(|v| v.into_iter().map(i64::from).collect()),
        "i1" => npy
            .into_vec::<i8>()
            .map(|v| v.into_iter().map(i64::from).collect()),
        "u2" => npy
            .into_vec::<u16>()
            .map(|v| v.into_iter().map(i64::from).collect()),
        "i2" => npy
            .into_vec::<i16>()
            .map(|v| v.into_iter().map(i64::from).collect()),
        "u4" => npy
            .into_vec::<u32>()
            .map(|v| v.into_iter().map(i64::from).collect()),
        "i4" => npy
            .into_vec::<i32>()
            .map(|v| v.into_iter().map(i64::from).collect()),
        "i8" => npy.into_vec::<i64>(),
        "u8" => npy.into_vec::<u64>().map(|v| {
            v.into_iter()
                .map(|x| x.min(i64::MAX as u64) as i64)
                .collect()
        }),
        other => {
            return Err(Reject::new(format!(
                "label dtype {other} is not an integer type"
            )))
        }
    }
    .map_err(|e| Reject::new(format!("cannot read labels: {e}")))?;
    vals.into_iter()
        .enumerate()
        .map(|(i, v)| {
            u32::try_from(v)
                .ok()
                .filter(|&v| v < crate::shard::format::MAX_CLASSES)
                .ok_or_else(|| {
                    Reject::new(format!(
                        "label {v} of sample {i} is not a class index 0..65535"
                    ))
                })
        })
        .collect()
}

/// (split name, images file, labels file) pairs found in `dir`.
pub fn find(dir: &Path) -> Vec<(String, PathBuf, PathBuf)> {
    let has = |n: &str| dir.join(n).is_file().then(|| dir.join(n));
    let mut out = Vec::new();
    for split in ["train", "test"] {
        let pairs = [
            (format!("{split}_images.npy"), format!("{split}_labels.npy")),
            (format!("x_{split}.npy"), format!("y_{split}.npy")),
            (format!("{split}-images.npy"), format!("{split}-labels.npy")),
        ];
        if let Some((i, l)) = pairs.iter().find_map(|(i, l)| Some((has(i)?, has(l)?))) {
            out.push((split.to_string(), i, l));
        }
    }
    if out.is_empty() {
        if let (Some(i), Some(l)) = (has("images.npy"), has("labels.npy")) {
            out.push((String::new(), i, l));
        }
    }
    out
}
