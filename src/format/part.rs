//! Fan-out of data preparation over a job array: `prep synth|convert --part I/N` writes part I of
//! N of one job as a dataset of its own whose manifest says which part it is (`Part`), and
//! `prep merge` (`crate::convert::merge`) joins the N parts into the dataset a single run writes.
//!
//! Every part plans the whole job (all splits, all inputs, the class list) and keeps a
//! contiguous range of it, so parts agree on everything but their range without talking to each
//! other, and the ranges in index order are the whole job in order.

use crate::util::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use twox_hash::XxHash3_64;

/// `--part I/N`: part I (counted from 0) of N.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartSpec {
    pub index: u32,
    pub count: u32,
}

impl FromStr for PartSpec {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::Invalid(format!(
                "--part {s}: {why} (expected I/N with 0 <= I < N, e.g. 0/4, or \
                 $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT)"
            ))
        };
        let (i, n) = s.split_once('/').ok_or_else(|| bad("no '/'"))?;
        let num = |t: &str, what: &str| {
            t.trim()
                .parse::<u32>()
                .map_err(|_| bad(&format!("{what} '{t}' is not a whole number")))
        };
        let (index, count) = (num(i, "index")?, num(n, "count")?);
        if count == 0 {
            return Err(bad("the count N must be at least 1"));
        }
        if index >= count {
            return Err(bad(&format!(
                "the index {index} must be below the count {count} (parts are numbered from 0 to {})",
                count - 1
            )));
        }
        Ok(PartSpec { index, count })
    }
}

impl PartSpec {
    /// "part 1 of 3", for messages.
    pub fn describe(&self) -> String {
        format!("part {} of {}", self.index, self.count)
    }
}

impl fmt::Display for PartSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// The `part` member of a part's manifest: which part it is and what `prep merge` needs to check
/// that N folders are the parts of one job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Part {
    pub index: u32,
    pub count: u32,
    /// 16 hex digits of xxh3 over everything that defines the whole job (for synth its
    /// parameters; for convert the options that shape the output, the class list and every
    /// input in order): the parts of one job, and only they, have the same `job`.
    pub job: String,
    /// What `ranges` count: `"samples"` (synth; convert of IDX, CIFAR and .npy files) or
    /// `"inputs"` (convert of a tree: files and DICOM series; of a dataset: shard blocks or
    /// column-major chunks).
    pub of: String,
    /// Per split of the whole job: the range of it this part holds.
    pub ranges: BTreeMap<String, PartRange>,
}

/// Items `start..end` of a split of `total` items.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartRange {
    pub start: u64,
    pub end: u64,
    pub total: u64,
}

impl Part {
    pub fn spec(&self) -> PartSpec {
        PartSpec {
            index: self.index,
            count: self.count,
        }
    }
}

/// Part `p` of `total` items cut into whole chunks of `chunk` items (the last chunk may be
/// short): chunks `floor(C * i / N)..floor(C * (i + 1) / N)` of the `C` chunks, as items. Parts
/// differ by at most one chunk; with more parts than chunks some parts are empty.
pub fn share(total: u64, chunk: u64, p: PartSpec) -> (u64, u64) {
    let chunks = total.div_ceil(chunk.max(1)) as u128;
    let at = |i: u32| {
        let c = (chunks * i as u128 / p.count as u128) as u64;
        c.saturating_mul(chunk.max(1)).min(total)
    };
    (at(p.index), at(p.index + 1))
}

/// The `job` digest of some bytes: 16 lowercase hex digits of xxh3.
pub fn digest(bytes: &[u8]) -> String {
    format!("{:016x}", XxHash3_64::oneshot(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_spec_parses_and_refuses() {
        assert_eq!(
            "2/3".parse::<PartSpec>().unwrap(),
            PartSpec { index: 2, count: 3 }
        );
        for bad in ["3/3", "0/0", "a/b", "1", "-1/3", "1/3/4", ""] {
            let e = bad.parse::<PartSpec>().unwrap_err().to_string();
            assert!(e.starts_with(&format!("--part {bad}:")), "{e}");
        }
        assert!("3/3"
            .parse::<PartSpec>()
            .unwrap_err()
            .to_string()
            .contains("below the count 3"));
    }

    #[test]
    fn shares_tile_the_whole_at_chunk_boundaries() {
        for (total, chunk, n) in [
            (10u64, 3u64, 3u32),
            (1, 8, 4),
            (100, 1, 7),
            (0, 5, 2),
            (9, 3, 3),
        ] {
            let mut at = 0;
            for i in 0..n {
                let (a, b) = share(total, chunk, PartSpec { index: i, count: n });
                assert_eq!(a, at);
                assert!(b >= a);
                assert!(a % chunk == 0 || a == total);
                at = b;
            }
            assert_eq!(at, total);
        }
        assert_eq!(
            share(u64::MAX, 1 << 40, PartSpec { index: 1, count: 2 }).1,
            u64::MAX
        );
    }
}
