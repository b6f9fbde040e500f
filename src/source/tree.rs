//! File trees: walk a folder in a fixed order, label each file (by its class sub-folder, a labels
//! CSV, a regex over its path, or one class for a flat folder), and decide its split from a hash of
//! its path.

use super::FileKind;
use regex::Regex;
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
}

impl TreeFile {
    /// The sub-folder of the root the file is in (its first path component), None for a file
    /// standing directly in the root.
    pub fn top_folder(&self) -> Option<&str> {
        self.rel.split_once('/').map(|(top, _)| top)
    }
}

/// A walked input.
#[derive(Debug, Clone)]
pub struct Tree {
    /// The folder that the files' relative paths start from (a single file's own folder).
    pub root: PathBuf,
    /// The input was one file rather than a folder.
    pub single: bool,
    /// Sorted by relative path.
    pub files: Vec<TreeFile>,
}

impl Tree {
    /// The name a one-class dataset gets: the folder's name, or a single file's name without
    /// its extensions.
    pub fn own_name(&self, input: &Path) -> String {
        if self.single {
            let name = input
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let lower = name.to_ascii_lowercase();
            // Two-part extensions first: "brain.nii.gz" is "brain".
            let cut = [".nii.gz", ".tar.gz"]
                .iter()
                .find(|e| lower.ends_with(*e))
                .map(|e| name.len() - e.len())
                .or_else(|| name.rfind('.').filter(|&i| i > 0))
                .unwrap_or(name.len());
            return non_empty(&name[..cut]);
        }
        // "." and "scans/" have no usable file_name of their own: ask the file system.
        let name = std::fs::canonicalize(input)
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .or_else(|| input.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_default();
        non_empty(&name)
    }
}

fn non_empty(s: &str) -> String {
    if s.is_empty() {
        "all".into()
    } else {
        s.to_string()
    }
}

/// Every regular file under `input`, sorted by relative path; hidden files and folders (names
/// starting with '.') are skipped. A single file is a tree of one, rooted at its folder.
pub fn walk(input: &Path) -> std::io::Result<Tree> {
    if input.is_file() {
        let rel = input
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let root = match input.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        return Ok(Tree {
            root,
            single: true,
            files: vec![TreeFile {
                rel,
                path: input.to_path_buf(),
                kind: FileKind::of(input),
            }],
        });
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
                out.push(TreeFile {
                    rel: rel.join("/"),
                    kind: FileKind::of(&p),
                    path: p,
                });
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    rec(input, input, &mut files)?;
    Ok(Tree {
        root: input.to_path_buf(),
        single: false,
        files,
    })
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

/// `--label-from REGEX`: the class of a file is the first capture group of the regex matched
/// against its path relative to the input (with '/' separators).
#[derive(Debug, Clone)]
pub struct LabelRegex(Regex);

impl LabelRegex {
    /// Compile `pattern`; one without a capture group cannot name a class, so it is refused
    /// here rather than rejecting every file.
    pub fn new(pattern: &str) -> Result<Self, String> {
        let re = Regex::new(pattern).map_err(|e| format!("--label-from '{pattern}': {e}"))?;
        if re.captures_len() < 2 {
            return Err(format!(
                "--label-from '{pattern}' has no capture group; put the part of the path that names the class in parentheses, e.g. '^([^/]+)/' or '^(\\w+)_\\d+\\.png$'"
            ));
        }
        Ok(LabelRegex(re))
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// The class of the file at `rel`, or why it has none (for the rejects report).
    pub fn class_of(&self, rel: &str) -> Result<String, String> {
        let caps = self
            .0
            .captures(rel)
            .ok_or_else(|| format!("path does not match --label-from '{}'", self.as_str()))?;
        match caps.get(1).map(|m| m.as_str()) {
            Some(c) if !c.is_empty() => Ok(c.to_string()),
            _ => Err(format!(
                "--label-from '{}' matches but its first group captures nothing",
                self.as_str()
            )),
        }
    }
}

/// Whether a file goes to the test split: a hash of its relative path, so the split is the same on
/// every run and machine and does not move when other files are added.
pub fn is_test(rel: &str, fraction: f64) -> bool {
    let h = xxhash_rust::xxh3::xxh3_64(rel.as_bytes());
    ((h >> 11) as f64 / (1u64 << 53) as f64) < fraction
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_regex_groups_and_misses() {
        let re = LabelRegex::new(r"^(\w+)_\d+\.png$").unwrap();
        assert_eq!(re.class_of("cat_01.png").unwrap(), "cat");
        assert!(re
            .class_of("cat.png")
            .unwrap_err()
            .contains("does not match"));
        let dir = LabelRegex::new(r"^[^/]+/([^/]+)/").unwrap();
        assert_eq!(dir.class_of("p1/tumour/a.dcm").unwrap(), "tumour");
        let opt = LabelRegex::new(r"^(x)?.*$").unwrap();
        assert!(opt
            .class_of("a.png")
            .unwrap_err()
            .contains("captures nothing"));
        assert!(LabelRegex::new(r"^\w+\.png$")
            .unwrap_err()
            .contains("no capture group"));
        assert!(LabelRegex::new(r"^(\w+")
            .unwrap_err()
            .contains("--label-from"));
    }

    #[test]
    fn single_file_is_a_tree_of_one_in_its_folder() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("brain.nii.gz");
        std::fs::write(&p, b"x").unwrap();
        let tree = walk(&p).unwrap();
        assert!(tree.single);
        assert_eq!(tree.root, t.path());
        assert_eq!(tree.files.len(), 1);
        assert_eq!(tree.files[0].rel, "brain.nii.gz");
        assert_eq!(tree.files[0].top_folder(), None);
        assert_eq!(tree.own_name(&p), "brain");
        let q = t.path().join("clip.v2.mp4");
        assert_eq!(
            Tree {
                single: true,
                ..tree.clone()
            }
            .own_name(&q),
            "clip.v2"
        );
    }

    #[test]
    fn folder_names_itself_even_as_dot() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("scans");
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::fs::write(d.join("sub/a.png"), b"x").unwrap();
        std::fs::write(d.join(".hidden.png"), b"x").unwrap();
        let tree = walk(&d).unwrap();
        assert_eq!(tree.own_name(&d), "scans");
        assert_eq!(tree.own_name(&d.join("sub/..")), "scans");
        assert_eq!(tree.files.len(), 1);
        assert_eq!(tree.files[0].top_folder(), Some("sub"));
    }
}
