//! Flag values as people write them: counts with a decimal suffix or an exponent (`60k`, `1.5M`,
//! `1e6`, `60,000`), and sample shapes with a hint when they are written channels last.

use clap::builder::TypedValueParser;
use clap::error::ErrorKind;
use prep::format::shard::Shape;
use std::ffi::OsStr;
use std::marker::PhantomData;

/// What a count flag takes, for its error messages and `--help`.
pub const COUNT_FORMS: &str =
    "60000, 60,000, 60k, 1.5M or 1e6 (decimal: k or K = 10^3, M = 10^6, G = 10^9, T = 10^12)";

/// A count: digits (with `,` or `_` between groups), an optional fraction and exponent, and an
/// optional decimal suffix; the value must be a whole number. Binary suffixes (`Ki`) are refused
/// rather than read as decimal ones.
pub fn parse_count(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let bad = || format!("'{s}' is not a count: write {COUNT_FORMS}");
    if t.ends_with('i') || t.ends_with("iB") {
        return Err(format!(
            "'{s}': binary suffixes (Ki, Mi, Gi) are not taken, counts are decimal: write {COUNT_FORMS}"
        ));
    }
    let (body, suffix_exp) = match t.char_indices().last() {
        Some((i, c)) => match c {
            'k' | 'K' => (&t[..i], 3),
            'M' => (&t[..i], 6),
            'G' => (&t[..i], 9),
            'T' => (&t[..i], 12),
            'm' | 'g' | 't' => {
                return Err(format!(
                    "'{s}': the suffixes above k are capitals: write {COUNT_FORMS}"
                ))
            }
            _ => (t, 0),
        },
        None => return Err(bad()),
    };
    let (mantissa, exp) = match body.split_once(['e', 'E']) {
        Some((m, e)) => {
            if suffix_exp > 0 {
                return Err(bad());
            }
            let e: u32 = e
                .strip_prefix('+')
                .unwrap_or(e)
                .parse()
                .map_err(|_| bad())?;
            (m, e)
        }
        None => (body, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    // Group separators between digits only: "1,000" and "1_000", not ",1" or "1,".
    let grouped = |p: &str| {
        !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_digit() || c == ',' || c == '_')
            && p.starts_with(|c: char| c.is_ascii_digit())
            && p.ends_with(|c: char| c.is_ascii_digit())
    };
    if !grouped(int) || !(frac.is_empty() || frac.chars().all(|c| c.is_ascii_digit())) {
        return Err(bad());
    }
    if mantissa.ends_with('.') {
        return Err(bad());
    }
    let digits: String = int
        .chars()
        .chain(frac.chars())
        .filter(|c| c.is_ascii_digit())
        .collect();
    let digits = digits.trim_start_matches('0');
    let scale = (exp + suffix_exp) as i64 - frac.len() as i64;
    let too_big = || format!("'{s}' is too large");
    if digits.is_empty() {
        return Ok(0);
    }
    if digits.len() > 30 {
        return Err(too_big());
    }
    let mut v: u128 = digits.parse().map_err(|_| bad())?;
    if scale >= 0 {
        for _ in 0..scale {
            v = v.checked_mul(10).ok_or_else(too_big)?;
        }
    } else {
        for _ in 0..(-scale) {
            if v % 10 != 0 {
                return Err(format!("'{s}' is not a whole number: write {COUNT_FORMS}"));
            }
            v /= 10;
        }
    }
    u64::try_from(v).map_err(|_| too_big())
}

/// A count flag in `lo..=hi`, for clap: [`parse_count`], then the range. The message names the
/// flag (as clap's own do) and the forms taken.
#[derive(Clone)]
pub struct Count<T> {
    lo: u64,
    hi: u64,
    t: PhantomData<fn() -> T>,
}

pub fn count<T>(lo: u64, hi: u64) -> Count<T> {
    Count {
        lo,
        hi,
        t: PhantomData,
    }
}

impl<T: TryFrom<u64> + Clone + Send + Sync + 'static> TypedValueParser for Count<T> {
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<T, clap::Error> {
        let flag = arg.map_or_else(|| "...".to_string(), |a| a.to_string());
        let fail = |why: String| {
            let mut e = clap::Error::raw(
                ErrorKind::ValueValidation,
                format!("invalid value for '{flag}': {why}\n"),
            );
            // Usage and `--help` hints as clap's own errors give them.
            e = e.with_cmd(cmd);
            e
        };
        let s = value.to_string_lossy();
        let v = parse_count(&s).map_err(fail)?;
        if v < self.lo || v > self.hi {
            // As clap's own range check writes it.
            return Err(fail(format!("{s} is not in {}..={}", self.lo, self.hi)));
        }
        T::try_from(v).map_err(|_| fail(format!("{s} is not in {}..={}", self.lo, self.hi)))
    }
}

/// `--shape`: a sample shape, channels first. Three dimensions whose last is 1, 3 or 4 and whose
/// first is over 4 are channels last (numpy's and PIL's HxWxC): refused with the shape to write,
/// since taken as written they would be a few-pixel-wide image of many channels.
pub fn shape(s: &str) -> Result<Shape, String> {
    let sh: Shape = s.parse().map_err(|e: prep::Error| e.to_string())?;
    if let [h, w, c] = sh.0[..] {
        if matches!(c, 1 | 3 | 4) && h > 4 {
            return Err(format!(
                "{s} looks like HxWxC (numpy and PIL order); prep takes CxHxW, channels first: --shape {c}x{h}x{w}"
            ));
        }
    }
    Ok(sh)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_in_every_form() {
        for (s, v) in [
            ("0", 0),
            ("60000", 60_000),
            ("60,000", 60_000),
            ("1_000_000", 1_000_000),
            ("10k", 10_000),
            ("10K", 10_000),
            ("1M", 1_000_000),
            ("1.5M", 1_500_000),
            ("2G", 2_000_000_000),
            ("1T", 1_000_000_000_000),
            ("1e6", 1_000_000),
            ("1E6", 1_000_000),
            ("2.5e3", 2_500),
            ("1e+3", 1_000),
            ("1.000", 1),
            (" 7 ", 7),
        ] {
            assert_eq!(parse_count(s), Ok(v), "{s}");
        }
        for s in [
            "", "1x", "1.5", "1e-3", "1.2345k", "1m", "1Ki", "1MiB", "-1", ",1", "1,", "1.", "k",
            "1e", "1kM", "1e3k", "nan", "1e40",
        ] {
            assert!(parse_count(s).is_err(), "{s} taken");
        }
        assert!(parse_count("1.5").unwrap_err().contains("whole number"));
        assert!(parse_count("1Ki").unwrap_err().contains("binary"));
        assert!(parse_count("99999999999999999999999")
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn channels_last_shapes_get_the_shape_to_write() {
        let e = shape("32x32x3").unwrap_err();
        assert!(e.contains("--shape 3x32x32"), "{e}");
        assert!(shape("28x28x1").unwrap_err().contains("--shape 1x28x28"));
        assert!(shape("224x224x4").is_err());
        for ok in ["3x32x32", "1x28x28", "4x4x3", "16x8x8", "2x3", "1x4x4x4"] {
            assert!(shape(ok).is_ok(), "{ok}");
        }
    }
}
