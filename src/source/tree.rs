//! File trees: walk a folder in a fixed order, label each file by its class sub-folder or a labels
//! CSV, and decide its split from a hash of its path.

use super::FileKind;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One file of the tree and what it will be.
#[derive(Debug, Clone)]
pub struct TreeFile {
    /// Path relative to the tree's root, with '/' separators: names the file in reports, and
    /// decides its split.
    pub rel: String,
    pub path: PathBuf,
    /// None: not a kind prep decodes (it will be rejected with a reason).
    pub kind: Option<FileKind>,
    pub class: Option<String>,
}

/// Every regular file under `root`, sorted by relative path; hidden files and folders (names
/// starting with '.') are skipped. A single file is a tree of one.
pub fn walk(root: &Path) -> std::io::Result<Vec<TreeFile>> {
    let mut out = Vec::new();
    if root.is_file() {
        let rel = root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        out.push(TreeFile {
            rel,
            path: root.to_path_buf(),
            kind: FileKind::of(root),
            class: None,
        });
        return Ok(out);
    }
    fn rec(root: &Path, dir: &Path, out: &mut Vec<TreeFile>) -> std::io::Result<()> {
        let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let p = e.path();
            let ft = e.file_type()?;
            if ft.is_dir() {
                rec(root, &p, out)?;
            } else if ft.is_file() || (ft.is_symlink() && p.is_file()) {
                let rel: Vec<String> = p
                    .strip_prefix(root)
                    .unwrap_or(&p)
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                let class = (rel.len() > 1).then(|| rel[0].clone());
                out.push(TreeFile {
                    rel: rel.join("/"),
                    kind: FileKind::of(&p),
                    path: p,
                    class,
                });
            }
        }
        Ok(())
    }
    rec(root, root, &mut out)?;
    Ok(out)
}

/// Labels from a CSV of `path,label` rows (a header row `path,label` is allowed). Paths are
/// relative to the tree's root. Returns rel path -> label name.
pub fn read_labels_csv(path: &Path) -> Result<BTreeMap<String, String>, String> {
    let mut r = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(false)
        .trim(csv::Trim::All)
        .from_path(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut map = BTreeMap::new();
    for (i, rec) in r.records().enumerate() {
        let rec = rec.map_err(|e| format!("{}: {e}", path.display()))?;
        if rec.len() != 2 {
            return Err(format!(
                "{}: line {}: expected `path,label`",
                path.display(),
                i + 1
            ));
        }
        if i == 0 && rec[0].eq_ignore_ascii_case("path") && rec[1].eq_ignore_ascii_case("label") {
            continue;
        }
        let key = rec[0].trim_start_matches("./").replace('\\', "/");
        if map.insert(key.clone(), rec[1].to_string()).is_some() {
            return Err(format!(
                "{}: line {}: {key} is listed twice",
                path.display(),
                i + 1
            ));
        }
    }
    Ok(map)
}

/// Whether a file goes to the test split: a hash of its relative path, so the split is the same on
/// every run and machine and does not move when other files are added.
pub fn is_test(rel: &str, fraction: f64) -> bool {
    let h = xxhash_rust::xxh3::xxh3_64(rel.as_bytes());
    ((h >> 11) as f64 / (1u64 << 53) as f64) < fraction
}
