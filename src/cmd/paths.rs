//! What a path named on the command line is, looked at before it is used: a typo, a file given
//! for its folder, or two arguments swapped get an error that names the mistake (a usage error,
//! exit 2) rather than the first file that could not be opened inside it.

use prep::util::error::shown_path;
use prep::{Error, Result};
use std::path::Path;

/// What a path holds, by a look at its type and a few names in it (nothing is read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum What {
    Missing,
    /// A dataset's `manifest.json` itself.
    ManifestFile,
    File,
    /// A folder with a `manifest.json`.
    Dataset,
    /// A folder with a run's `config.json` (what `prep train` writes).
    Run,
    /// A folder holding shard or column-major files without a manifest (a damaged dataset).
    DatasetWithoutManifest,
    /// Any other folder.
    Folder,
}

pub fn what(p: &Path) -> What {
    let Ok(meta) = std::fs::metadata(p) else {
        return What::Missing;
    };
    if !meta.is_dir() {
        return if p
            .file_name()
            .is_some_and(|n| n == prep::format::shard::manifest::FILE_NAME)
        {
            What::ManifestFile
        } else {
            What::File
        };
    }
    if p.join(prep::format::shard::manifest::FILE_NAME).exists() {
        return What::Dataset;
    }
    if p.join("config.json").exists() {
        return What::Run;
    }
    let stored = std::fs::read_dir(p).is_ok_and(|rd| {
        rd.flatten().take(10_000).any(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.ends_with(".shard") || (n.starts_with("images_") && n.ends_with(".bin"))
        })
    });
    if stored {
        What::DatasetWithoutManifest
    } else {
        What::Folder
    }
}

/// "fmist/ does not exist", with the nearest name beside it when there is one close enough to be
/// a typo of it.
fn missing(p: &Path) -> Error {
    let shown = shown_dir(p);
    let near = nearest_sibling(p)
        .map(|n| format!(" (did you mean {n}?)"))
        .unwrap_or_default();
    Error::Invalid(format!("{shown} does not exist{near}"))
}

/// A folder's path as a user writes it, with a trailing slash.
fn shown_dir(p: &Path) -> String {
    let s = shown_path(p);
    // A quoted path (one with odd bytes) stays as quoted.
    if s.ends_with('/') || s.ends_with('"') {
        s
    } else {
        format!("{s}/")
    }
}

/// The entry beside `p` whose name is within two edits of `p`'s (not `p`'s own).
fn nearest_sibling(p: &Path) -> Option<String> {
    let name = p.file_name()?.to_string_lossy().into_owned();
    let parent = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let mut best: Option<(usize, String)> = None;
    for e in std::fs::read_dir(&parent).ok()?.flatten().take(10_000) {
        let n = e.file_name().to_string_lossy().into_owned();
        let d = edit_distance(&name, &n);
        if d > 0 && d <= 2 && best.as_ref().is_none_or(|(b, _)| d < *b) {
            best = Some((d, n));
        }
    }
    let (_, n) = best?;
    Some(shown_dir(&p.with_file_name(n)))
}

fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    if a.len().abs_diff(b.len()) > 2 || a.len() > 256 || b.len() > 256 {
        return usize::MAX;
    }
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// Check that `p` is a dataset folder (or a damaged one, which `verify` reports), and that no
/// other prep is writing it. `usage`: how the
/// command is written, for the case of swapped arguments ("eval takes RUN then DATA").
pub fn expect_dataset(p: &Path, usage: &str) -> Result<()> {
    if prep::store::remote::is_url(p) {
        // A store is looked at when the dataset is opened; a URL prep cannot read is refused now.
        return prep::store::remote::parse(p.to_str().unwrap_or_default()).map(|_| ());
    }
    // A folder another prep is writing has no manifest yet: say who writes it instead.
    prep::format::lock::check_not_written(p)?;
    let shown = shown_path(p);
    match what(p) {
        What::Dataset | What::DatasetWithoutManifest => Ok(()),
        What::Missing => Err(missing(p)),
        What::ManifestFile => Err(Error::Invalid(format!(
            "{shown} is a dataset's manifest; give the dataset's folder, {}",
            shown_dir(p.parent().unwrap_or(Path::new(".")))
        ))),
        What::File => Err(Error::Invalid(format!(
            "{shown} is a file, not a dataset folder (a folder that prep convert or prep synth wrote)"
        ))),
        What::Run => Err(Error::Invalid(format!(
            "{} is a run folder, not a dataset: {usage}",
            shown_dir(p)
        ))),
        What::Folder => Err(Error::Invalid(format!(
            "{} is not a prep dataset (it has no manifest.json); make one with prep convert or prep synth",
            shown_dir(p)
        ))),
    }
}

/// Check that `p` is a run folder, one that `prep train` wrote, and (`unlocked`) that no other
/// prep is writing it.
pub fn expect_run(p: &Path, usage: &str, unlocked: bool) -> Result<()> {
    if unlocked {
        prep::format::lock::check_not_written(p)?;
    }
    let shown = shown_path(p);
    match what(p) {
        What::Run => Ok(()),
        What::Missing => Err(missing(p)),
        What::Dataset | What::DatasetWithoutManifest => Err(Error::Invalid(format!(
            "{} is a dataset, not a run folder: {usage}",
            shown_dir(p)
        ))),
        What::ManifestFile | What::File => Err(Error::Invalid(format!(
            "{shown} is a file, not a run folder (the folder prep train --out wrote)"
        ))),
        What::Folder => Err(Error::Invalid(format!(
            "{} is not a run folder (it has no config.json); prep train --out writes one",
            shown_dir(p)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_within_two_edits_are_suggested() {
        assert_eq!(edit_distance("fmist", "fmnist"), 1);
        assert_eq!(edit_distance("fmnist", "fmnist"), 0);
        assert_eq!(edit_distance("abc", "xyz"), 3);
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("fmnist")).unwrap();
        std::fs::create_dir(t.path().join("cifar")).unwrap();
        let e = expect_dataset(&t.path().join("fmist"), "").unwrap_err();
        let e = e.to_string();
        assert!(
            e.contains("fmist/ does not exist") && e.contains("did you mean"),
            "{e}"
        );
        assert!(e.contains("fmnist/?"), "{e}");
        let e = expect_dataset(&t.path().join("zzzzzzz"), "").unwrap_err();
        assert!(!e.to_string().contains("did you mean"), "{e}");
    }
}
