//! float32 values back to stored pixels: exact u8/u16 where they are pixels / 255 (or 65535), or
//! scaled.

use super::*;

/// The f32 that the colmajor writer stores for u8 pixel `k`: `k / 255`, one float32 division.
pub(super) fn u8_value(k: u8) -> f32 {
    k as f32 / 255.0
}

/// `v` as the u8 pixel `k` when `v` is bit for bit the value the colmajor layout stores for it
/// (`float32(k) / 255`); None for anything else (-0.0 included, so that a round trip through u8
/// gives back the very bytes).
#[inline]
pub fn exact_u8(v: f32) -> Option<u8> {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let t = TABLE.get_or_init(|| std::array::from_fn(|k| u8_value(k as u8).to_bits()));
    // k/255 in float32 is within 2^-24 relative of the true quotient, so v * 255 rounds to k.
    let k = (v * 255.0).round();
    (0.0..=255.0)
        .contains(&k)
        .then_some(k as u8)
        .filter(|&k| t[k as usize] == v.to_bits())
}

/// `v` as the u16 pixel `k` when it is bit for bit `float32(k) / 65535`.
#[inline]
pub fn exact_u16(v: f32) -> Option<u16> {
    let k = (v * 65535.0).round();
    (0.0..=65535.0)
        .contains(&k)
        .then_some(k as u16)
        .filter(|&k| (k as f32 / 65535.0).to_bits() == v.to_bits())
}

/// Store float32 `values` as `dtype` (little-endian into `out`) when each is exactly a value of
/// that dtype as the colmajor layout stores it: u8/u16 pixels as `k / max`, f16 values exactly
/// (and finite), f32 finite. Otherwise the index and value of the first that is not.
pub fn encode_exact(values: &[f32], dtype: Dtype, out: &mut [u8]) -> Result<(), (usize, f32)> {
    let miss = |i: usize| Err((i, values[i]));
    match dtype {
        Dtype::U8 => {
            for (i, (&v, o)) in values.iter().zip(out.iter_mut()).enumerate() {
                match exact_u8(v) {
                    Some(k) => *o = k,
                    None => return miss(i),
                }
            }
        }
        Dtype::U16 => {
            for (i, (&v, o)) in values.iter().zip(out.chunks_exact_mut(2)).enumerate() {
                match exact_u16(v) {
                    Some(k) => o.copy_from_slice(&k.to_le_bytes()),
                    None => return miss(i),
                }
            }
        }
        Dtype::F16 => {
            for (i, (&v, o)) in values.iter().zip(out.chunks_exact_mut(2)).enumerate() {
                let h = half::f16::from_f32(v);
                if !v.is_finite() || h.to_f32().to_bits() != v.to_bits() {
                    return miss(i);
                }
                o.copy_from_slice(&h.to_le_bytes());
            }
        }
        Dtype::F32 => {
            for (i, (&v, o)) in values.iter().zip(out.chunks_exact_mut(4)).enumerate() {
                if !v.is_finite() {
                    return miss(i);
                }
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
    }
    Ok(())
}

/// Why `encode_scaled` could not store a value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ScaleError {
    /// NaN or infinite.
    NotFinite(usize, f32),
    /// An integer dtype takes values in [0, 1].
    OutOfRange(usize, f32),
    /// Beyond f16's range.
    TooLarge(usize, f32),
}

impl std::fmt::Display for ScaleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            ScaleError::NotFinite(_, v) => write!(f, "value {v}: float samples must be finite"),
            ScaleError::OutOfRange(_, v) => write!(
                f,
                "value {v} is outside [0, 1], which --dtype u8/u16 scale to pixels; use --dtype f32 to keep it"
            ),
            ScaleError::TooLarge(_, v) => {
                write!(f, "value {v} is beyond f16's range (±65504): use --dtype f32")
            }
        }
    }
}

impl ScaleError {
    pub fn index(&self) -> usize {
        match *self {
            ScaleError::NotFinite(i, _)
            | ScaleError::OutOfRange(i, _)
            | ScaleError::TooLarge(i, _) => i,
        }
    }
}

/// Store values (pixels in [0, 1] for integer dtypes, anything finite for floats) as `dtype`:
/// u8/u16 as `round(v * 255)` / `round(v * 65535)` (so `k / 255` gives back `k`), f16 rounded to
/// nearest, f32 as they are.
pub fn encode_scaled(values: &[f32], dtype: Dtype, out: &mut [u8]) -> Result<(), ScaleError> {
    for (i, &v) in values.iter().enumerate() {
        if !v.is_finite() {
            return Err(ScaleError::NotFinite(i, v));
        }
        match dtype {
            Dtype::U8 | Dtype::U16 if !(0.0..=1.0).contains(&v) => {
                return Err(ScaleError::OutOfRange(i, v))
            }
            Dtype::U8 => out[i] = (v * 255.0).round() as u8,
            Dtype::U16 => {
                out[2 * i..2 * i + 2].copy_from_slice(&((v * 65535.0).round() as u16).to_le_bytes())
            }
            Dtype::F16 => {
                let h = half::f16::from_f32(v);
                if h.is_infinite() {
                    return Err(ScaleError::TooLarge(i, v));
                }
                out[2 * i..2 * i + 2].copy_from_slice(&h.to_le_bytes());
            }
            Dtype::F32 => out[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes()),
        }
    }
    Ok(())
}

/// A stored sample value as the colmajor layout holds it: `k / max` for u8/u16 pixels (one
/// float32 division, as the writer does), the value itself for f16/f32.
#[inline]
pub fn value_of(dtype: Dtype, px: &[u8], i: usize) -> f32 {
    dtype.get(px, i) / dtype.divisor() as f32
}
