//! NumPy `.npy` arrays: images of shape (N, H, W), (N, H, W, C) or (N, C, H, W) with dtype
//! uint8, uint16 or float, and labels of shape (N,) or (N, 1) of any integer type. For a u8/u16
//! target float values are taken as values in [0, 1] (to u8); for an f16/f32 target they are kept:
//! float16 and float32 exactly, float64 rounded to the nearest float32. Arrays may be in C or
//! Fortran order (`np.asfortranarray`, MATLAB, Julia) and little- or big-endian (`>u2`, `>f4`): a
//! dataset is the same whichever way its arrays were saved.
//!
//! Image data is never loaded whole: [`NpyImages::read`] reads the samples of one block with
//! positioned reads (one run per block in C order; in Fortran order, where a sample's values lie
//! N apart, one run per value position covering the whole block, transposed in memory), so memory
//! stays at a block whatever the array's size. File pairs are found by name (see [`find`]).

use super::Reject;
use crate::format::shard::Dtype;
use std::path::{Path, PathBuf};

/// An image array whose samples are read on demand as u8, u16, f16 or f32 values in
/// sample-major HWC or CHW order.
pub struct NpyImages {
    pub n: usize,
    pub channels: usize,
    pub height: usize,
    pub width: usize,
    /// true: each sample is C x H x W; false: H x W x C.
    pub planar: bool,
    /// The values `read` hands out.
    pub dtype: Dtype,
    src: Source,
}

/// Where an array's values lie and how they are stored.
struct Source {
    file: std::fs::File,
    /// Offset of the first value.
    data_at: u64,
    elem: Elem,
    /// Fortran order: the first axis (the sample index) varies fastest.
    fortran: bool,
    /// The shape without its first axis: one sample's dimensions.
    dims: Vec<usize>,
}

/// One stored value's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Elem {
    /// 'u', 'i', 'f' or 'b'.
    kind: char,
    size: usize,
    big_endian: bool,
}

const MAX_BYTES: u64 = 16 << 30;

/// Largest header accepted: numpy writes well under 1 KiB, and `np.load` refuses more than
/// 10 000 bytes by default.
const MAX_HEADER: u64 = 64 << 10;
/// Deepest bracket nesting accepted in the header (see `check_header`).
const MAX_HEADER_DEPTH: usize = 4;

/// An opened array: its header read and checked, its data not yet touched.
struct Opened {
    file: std::fs::File,
    len: u64,
    data_at: u64,
    shape: Vec<usize>,
    fortran: bool,
    elem: Elem,
    /// The dtype as the header writes it, for messages.
    descr: String,
}

fn open(path: &Path) -> Result<Opened, Reject> {
    use std::io::Read;
    let mut file = super::open_input(path)?;
    let len = file
        .metadata()
        .map_err(|e| Reject::new(e.to_string()))?
        .len();
    let mut head = Vec::new();
    (&mut file)
        .take(12 + MAX_HEADER)
        .read_to_end(&mut head)
        .map_err(|e| Reject::new(e.to_string()))?;
    let data_at = check_header(&head, len)?;
    let header = npyz::NpyHeader::from_reader(&head[..])
        .map_err(|e| Reject::new(format!("not a valid .npy file: {e}")))?;
    let npyz::DType::Plain(ts) = header.dtype() else {
        return Err(Reject::new(
            "structured (record) arrays are not supported: save each field as its own array",
        ));
    };
    let descr = ts.to_string();
    let kind = match ts.type_char() {
        npyz::TypeChar::Uint => 'u',
        npyz::TypeChar::Int => 'i',
        npyz::TypeChar::Float => 'f',
        npyz::TypeChar::Bool => 'b',
        _ => 'x',
    };
    let elem = Elem {
        kind,
        size: ts.size_field() as usize,
        big_endian: ts.endianness() == npyz::Endianness::Big,
    };
    let shape = header.shape().iter().map(|&d| d as usize).collect();
    Ok(Opened {
        file,
        len,
        data_at,
        shape,
        fortran: header.order() == npyz::Order::Fortran,
        elem,
        descr: descr.trim_start_matches(['<', '>', '|', '=']).to_string(),
    })
}

impl Opened {
    /// Refuse a file too short for its shape before any value is read.
    fn check_length(&self, elems: u64) -> Result<(), Reject> {
        let need = elems
            .checked_mul(self.elem.size as u64)
            .and_then(|b| b.checked_add(self.data_at));
        match need {
            Some(need) if need <= self.len => Ok(()),
            _ => Err(Reject::new(format!(
                "array data is shorter than its shape (truncated): the shape {:?} of {} needs {} bytes of data, the file has {}",
                self.shape,
                self.descr,
                elems.saturating_mul(self.elem.size as u64),
                self.len - self.data_at
            ))),
        }
    }
}

/// What npyz trusts before it allocates and multiplies: it allocates the header length the file
/// declares (up to 4 GiB from a 12-byte file), and multiplies the shape's dimensions unchecked
/// (a panic where overflow checks are on). So the header must lie within the file and
/// `MAX_HEADER`, and its shape must be integers whose product (zeros counted as 1, as npyz's
/// strides multiply past them) fits in 64 bits. `head`: the file's first bytes, `len`: its size.
/// Returns the offset of the data.
fn check_header(head: &[u8], len: u64) -> Result<u64, Reject> {
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
    Ok(text_at + text_len)
}

/// Open an image array. `float`: the target is f16/f32, so float arrays keep their values (f2 as
/// f16, f4 as f32, f8 rounded to f32); otherwise they become u8 as values in [0, 1]. Only the
/// header is read here, and the file's length checked against the shape.
pub fn read_images(path: &Path, float: bool) -> Result<NpyImages, Reject> {
    let o = open(path)?;
    let shape = o.shape.clone();
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
    let dtype = match (o.elem.kind, o.elem.size) {
        ('u', 1) => Dtype::U8,
        ('u', 2) => Dtype::U16,
        ('f', 2) if float => Dtype::F16,
        ('f', 4 | 8) if float => Dtype::F32,
        ('f', 2 | 4 | 8) => Dtype::U8,
        _ => {
            return Err(Reject::new(format!(
                "image dtype {} is not supported (uint8, uint16, float16, float32, float64)",
                o.descr
            )))
        }
    };
    let elems = [n, c, h, w]
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d as u64))
        .filter(|&e| {
            e.checked_mul(o.elem.size as u64)
                .is_some_and(|b| b <= MAX_BYTES)
                && h > 0
                && w > 0
        })
        .ok_or_else(|| Reject::new(format!("absurd image array shape {shape:?}")))?;
    o.check_length(elems)?;
    Ok(NpyImages {
        n,
        channels: c,
        height: h,
        width: w,
        planar,
        dtype,
        src: Source {
            file: o.file,
            data_at: o.data_at,
            elem: o.elem,
            fortran: o.fortran,
            dims: shape[1..].to_vec(),
        },
    })
}

impl NpyImages {
    /// Bytes of one sample as `read` hands it out.
    pub fn sample_bytes(&self) -> usize {
        self.channels * self.height * self.width * self.dtype.size()
    }

    /// Append samples `start..start + len` to `out`: each `sample_bytes` of little-endian `dtype`
    /// values in the sample's own C order (H x W x C or C x H x W).
    pub fn read(&self, start: usize, len: usize, out: &mut Vec<u8>) -> Result<(), Reject> {
        assert!(start + len <= self.n, "samples {start}+{len} of {}", self.n);
        let s = &self.src;
        let size = s.elem.size;
        let per = self.channels * self.height * self.width;
        let bad = |e: std::io::Error| Reject::new(format!("cannot read data: {e}"));
        let at = out.len();
        out.resize(at + len * per * self.dtype.size(), 0);
        let dst = &mut out[at..];
        let put = |dst: &mut [u8], k: usize, raw: &[u8]| {
            self.convert(
                raw,
                &mut dst[k * self.dtype.size()..(k + 1) * self.dtype.size()],
            )
        };
        use std::os::unix::fs::FileExt;
        if !s.fortran {
            // One run: the block's samples lie one after another.
            let from = s.data_at + (start * per * size) as u64;
            if s.elem.kind != 'f' && !s.elem.big_endian && size == self.dtype.size() {
                // Little-endian integers of the output's width: the bytes as they are, read
                // straight into place.
                return s.file.read_exact_at(dst, from).map_err(bad);
            }
            let mut buf = vec![0u8; len * per * size];
            s.file.read_exact_at(&mut buf, from).map_err(bad)?;
            for (k, raw) in buf.chunks_exact(size).enumerate() {
                put(dst, k, raw);
            }
            return Ok(());
        }
        // Fortran order: value position p of every sample (p counted with the first per-sample
        // axis fastest) is one run of N values; the block's part of it is read and scattered to
        // each sample's C-order position.
        let dims = &s.dims;
        let mut c_stride = vec![1usize; dims.len()];
        for a in (0..dims.len().saturating_sub(1)).rev() {
            c_stride[a] = c_stride[a + 1] * dims[a + 1];
        }
        let mut idx = vec![0usize; dims.len()];
        let mut buf = vec![0u8; len * size];
        for p in 0..per {
            let c_pos: usize = idx.iter().zip(&c_stride).map(|(i, s)| i * s).sum();
            s.file
                .read_exact_at(&mut buf, s.data_at + ((p * self.n + start) * size) as u64)
                .map_err(bad)?;
            for (j, raw) in buf.chunks_exact(size).enumerate() {
                put(dst, j * per + c_pos, raw);
            }
            for (a, i) in idx.iter_mut().enumerate() {
                *i += 1;
                if *i < dims[a] {
                    break;
                }
                *i = 0;
            }
        }
        Ok(())
    }

    /// One stored value to one value of `self.dtype`, little-endian.
    fn convert(&self, raw: &[u8], dst: &mut [u8]) {
        let e = self.src.elem;
        let mut b = [0u8; 8];
        b[..e.size].copy_from_slice(raw);
        if e.big_endian {
            b[..e.size].reverse();
        }
        let f = match (e.kind, e.size) {
            ('f', 2) => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
            ('f', 4) => f32::from_le_bytes(b[..4].try_into().unwrap()) as f64,
            ('f', 8) => f64::from_le_bytes(b),
            _ => {
                // Integer arrays are read in their own type.
                dst.copy_from_slice(&b[..dst.len()]);
                return;
            }
        };
        match self.dtype {
            Dtype::F16 => dst.copy_from_slice(&half::f16::from_f64(f).to_le_bytes()),
            // Rounded to nearest; beyond float32's range a value becomes infinite, which the
            // conversion then rejects.
            Dtype::F32 => dst.copy_from_slice(&(f as f32).to_le_bytes()),
            _ => dst[0] = unit_to_u8(f),
        }
    }
}

/// Floats are taken as values in [0, 1] (clamped), as most pipelines store them.
fn unit_to_u8(v: f64) -> u8 {
    (v.clamp(0.0, 1.0) * 255.0).round() as u8
}

/// Read a labels array of `n` integers, of shape (N,) or (N, 1) (Keras's CIFAR labels).
pub fn read_labels(path: &Path, n: usize) -> Result<Vec<u32>, Reject> {
    let o = open(path)?;
    if o.shape != [n] && o.shape != [n, 1] {
        return Err(Reject::new(format!(
            "labels have shape {:?}, expected ({n},)",
            o.shape
        )));
    }
    let Elem {
        kind,
        size,
        big_endian,
    } = o.elem;
    if !matches!(kind, 'u' | 'i') || !matches!(size, 1 | 2 | 4 | 8) {
        return Err(Reject::new(format!(
            "label dtype {} is not an integer type",
            o.descr
        )));
    }
    o.check_length(n as u64)?;
    let mut buf = vec![0u8; n * size];
    use std::os::unix::fs::FileExt;
    o.file
        .read_exact_at(&mut buf, o.data_at)
        .map_err(|e| Reject::new(format!("cannot read labels: {e}")))?;
    buf.chunks_exact(size)
        .enumerate()
        .map(|(i, raw)| {
            let mut b = [0u8; 8];
            b[..size].copy_from_slice(raw);
            if big_endian {
                b[..size].reverse();
            }
            // Sign-extend signed values.
            let v = if kind == 'i' && b[size - 1] & 0x80 != 0 {
                b[size..].fill(0xff);
                i64::from_le_bytes(b) as i128
            } else {
                u64::from_le_bytes(b) as i128
            };
            u32::try_from(v)
                .ok()
                .filter(|&v| v < crate::format::shard::format::MAX_CLASSES)
                .ok_or_else(|| {
                    Reject::new(format!(
                        "label {v} of sample {i} is not a class index 0..65535"
                    ))
                })
        })
        .collect()
}

/// The split names a pair of files may carry, as they are written in file names, and the split
/// each becomes: a validation pair is the test split when there is no test pair (as for split
/// folders), else `val`.
const SPLIT_NAMES: [(&str, &str); 5] = [
    ("train", "train"),
    ("test", "test"),
    ("val", "val"),
    ("valid", "val"),
    ("validation", "val"),
];

/// The (images, labels) file names for split `s`, in the order they are looked for.
pub fn pair_names(s: &str) -> [(String, String); 6] {
    [
        (format!("{s}_images.npy"), format!("{s}_labels.npy")),
        (format!("{s}-images.npy"), format!("{s}-labels.npy")),
        (format!("images_{s}.npy"), format!("labels_{s}.npy")),
        (format!("x_{s}.npy"), format!("y_{s}.npy")),
        (format!("X_{s}.npy"), format!("y_{s}.npy")),
        (format!("X_{s}.npy"), format!("Y_{s}.npy")),
    ]
}

/// What `find` looks for, for messages and `--help`.
pub const NAMES_HELP: &str = "train_images.npy + train_labels.npy (or train-images/train-labels, images_train/labels_train), x_train.npy + y_train.npy (or X_train.npy), for the splits train, test and val/valid/validation; or one images.npy + labels.npy, split by hash";

/// (split name, images file, labels file) pairs found in `dir`; an error names two pairs that claim
/// one split.
pub fn find(dir: &Path) -> Result<Vec<(String, PathBuf, PathBuf)>, String> {
    // Anything by these names counts: a FIFO or folder is then refused by name when opened.
    let has = |n: &str| dir.join(n).exists();
    let mut found: Vec<(&str, &str, String, String)> = Vec::new();
    for (written, split) in SPLIT_NAMES {
        if let Some((i, l)) = pair_names(written)
            .into_iter()
            .find(|(i, l)| has(i) && has(l))
        {
            if let Some(other) = found.iter().find(|f| f.1 == split) {
                return Err(format!(
                    "{} and {} both hold a {split} split; keep one",
                    other.2, i
                ));
            }
            found.push((written, split, i, l));
        }
    }
    let has_test = found.iter().any(|f| f.1 == "test");
    let mut out: Vec<_> = found
        .into_iter()
        .map(|(_, split, i, l)| {
            let split = if split == "val" && !has_test {
                "test"
            } else {
                split
            };
            (split.to_string(), dir.join(i), dir.join(l))
        })
        .collect();
    if out.is_empty() && has("images.npy") && has("labels.npy") {
        out.push((
            String::new(),
            dir.join("images.npy"),
            dir.join("labels.npy"),
        ));
    }
    Ok(out)
}

/// What a `y` array holds for each sample, by its shape and dtype: a class ((N,) or (N, 1)
/// integers), a mask ((N, H, W) integers of the images' height and width), labels ((N, K) of
/// 0 and 1, integer or bool) or values ((N,) or (N, K) floats).
pub enum Targets {
    Class(Vec<u32>),
    /// Read a block at a time like the images, as u8 (at most 256 values) or u16; `values` is
    /// the largest value plus one.
    Mask {
        array: NpyImages,
        values: usize,
    },
    /// N x K, row-major.
    Labels {
        k: usize,
        v: Vec<u8>,
    },
    Values {
        k: usize,
        v: Vec<f32>,
    },
}

/// Most columns of a labels or values array; a mask's largest value is below 2^16.
const MAX_TARGETS: usize = 1 << 16;

/// Read the targets array at `path` for `n` samples of `hw` (height, width).
pub fn read_targets(path: &Path, n: usize, hw: (usize, usize)) -> Result<Targets, Reject> {
    let o = open(path)?;
    let float = o.elem.kind == 'f';
    match o.shape[..] {
        [m] | [m, 1] if m == n && !float => read_labels(path, n).map(Targets::Class),
        // One float per sample: a value (regression), not a class.
        [m] if m == n => read_matrix(o, n, 1),
        [m, h, w] if m == n && (h, w) == hw => read_mask(o, n, hw),
        [m, k] if m == n && (1..=MAX_TARGETS).contains(&k) => read_matrix(o, n, k),
        _ => Err(Reject::new(format!(
            "targets have shape {:?}: expected ({n},) classes, ({n}, {}, {}) a mask of the images' size, or ({n}, K) labels or values",
            o.shape, hw.0, hw.1
        ))),
    }
}

/// Every value of an integer array as i128, `chunk` values at a time (positioned reads: memory
/// stays at a chunk), in storage order.
fn each_int(
    o: &Opened,
    elems: usize,
    f: &mut dyn FnMut(usize, i128) -> Result<(), Reject>,
) -> Result<(), Reject> {
    use std::os::unix::fs::FileExt;
    let size = o.elem.size;
    let chunk = (1 << 20) / size;
    let mut buf = Vec::new();
    let mut at = 0;
    while at < elems {
        let m = chunk.min(elems - at);
        buf.resize(m * size, 0);
        o.file
            .read_exact_at(&mut buf, o.data_at + (at * size) as u64)
            .map_err(|e| Reject::new(format!("cannot read data: {e}")))?;
        for (j, raw) in buf.chunks_exact(size).enumerate() {
            let mut b = [0u8; 8];
            b[..size].copy_from_slice(raw);
            if o.elem.big_endian {
                b[..size].reverse();
            }
            let v = if o.elem.kind == 'i' && b[size - 1] & 0x80 != 0 {
                b[size..].fill(0xff);
                i64::from_le_bytes(b) as i128
            } else {
                u64::from_le_bytes(b) as i128
            };
            f(at + j, v)?;
        }
        at += m;
    }
    Ok(())
}

/// The largest of an array's `elems` bytes, read a chunk at a time.
fn max_byte(o: &Opened, elems: usize) -> Result<u8, Reject> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; elems.min(1 << 20)];
    let (mut at, mut max) = (0, 0u8);
    while at < elems {
        let m = buf.len().min(elems - at);
        o.file
            .read_exact_at(&mut buf[..m], o.data_at + at as u64)
            .map_err(|e| Reject::new(format!("cannot read data: {e}")))?;
        max = max.max(buf[..m].iter().copied().max().unwrap_or(0));
        at += m;
    }
    Ok(max)
}

fn read_mask(o: Opened, n: usize, (h, w): (usize, usize)) -> Result<Targets, Reject> {
    if !matches!(o.elem.kind, 'u' | 'i' | 'b') || !matches!(o.elem.size, 1 | 2 | 4 | 8) {
        return Err(Reject::new(format!(
            "a mask's dtype {} is not an integer type",
            o.descr
        )));
    }
    let elems = (n as u64)
        .checked_mul((h * w) as u64)
        .filter(|e| {
            e.checked_mul(o.elem.size as u64)
                .is_some_and(|b| b <= MAX_BYTES)
        })
        .ok_or_else(|| Reject::new(format!("absurd mask array shape {:?}", o.shape)))?;
    o.check_length(elems)?;
    // One pass for the largest value (the mask's names), and no negative or too large one.
    let mut max = 0i128;
    if o.elem.size == 1 && o.elem.kind != 'i' {
        // Bytes cannot be negative or too large: only their largest value is wanted.
        max = max_byte(&o, elems as usize)? as i128;
    } else {
        each_int(&o, elems as usize, &mut |i, v| {
            if !(0..MAX_TARGETS as i128).contains(&v) {
                let (s, p) = (i / (h * w), i % (h * w));
                return Err(Reject::new(format!(
                    "mask value {v} of sample {s} at row {}, column {} is not 0..65535",
                    p / w,
                    p % w
                )));
            }
            max = max.max(v);
            Ok(())
        })?;
    }
    let values = max as usize + 1;
    let array = NpyImages {
        n,
        channels: 1,
        height: h,
        width: w,
        planar: true,
        // Integer values are read in their own type, truncated to this one: they fit (above).
        dtype: if values <= 256 { Dtype::U8 } else { Dtype::U16 },
        src: Source {
            file: o.file,
            data_at: o.data_at,
            elem: o.elem,
            fortran: o.fortran,
            dims: o.shape[1..].to_vec(),
        },
    };
    Ok(Targets::Mask { array, values })
}

fn read_matrix(o: Opened, n: usize, k: usize) -> Result<Targets, Reject> {
    let elems = n
        .checked_mul(k)
        .filter(|e| {
            e.checked_mul(o.elem.size)
                .is_some_and(|b| b as u64 <= MAX_BYTES)
        })
        .ok_or_else(|| Reject::new(format!("absurd targets shape {:?}", o.shape)))?;
    o.check_length(elems as u64)?;
    // Row-major N x K whatever the storage order.
    let at = |i: usize| if o.fortran { (i % n) * k + i / n } else { i };
    match o.elem.kind {
        'u' | 'i' | 'b' => {
            let mut v = vec![0u8; elems];
            each_int(&o, elems, &mut |i, x| {
                let j = at(i);
                if !(0..=1).contains(&x) {
                    return Err(Reject::new(format!(
                        "label {x} of sample {} column {} is not 0 or 1: integer (N, K) targets are labels (K-hot); save values as floats",
                        j / k,
                        j % k
                    )));
                }
                v[j] = x as u8;
                Ok(())
            })?;
            Ok(Targets::Labels { k, v })
        }
        'f' if matches!(o.elem.size, 2 | 4 | 8) => {
            use std::os::unix::fs::FileExt;
            let size = o.elem.size;
            let mut raw = vec![0u8; elems * size];
            o.file
                .read_exact_at(&mut raw, o.data_at)
                .map_err(|e| Reject::new(format!("cannot read data: {e}")))?;
            let mut v = vec![0f32; elems];
            for (i, r) in raw.chunks_exact(size).enumerate() {
                let mut b = [0u8; 8];
                b[..size].copy_from_slice(r);
                if o.elem.big_endian {
                    b[..size].reverse();
                }
                v[at(i)] = match size {
                    2 => half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
                    4 => f32::from_le_bytes(b[..4].try_into().unwrap()),
                    _ => f64::from_le_bytes(b) as f32,
                };
            }
            Ok(Targets::Values { k, v })
        }
        _ => Err(Reject::new(format!(
            "targets dtype {} is neither integer nor float",
            o.descr
        ))),
    }
}
