//! File trees: walk a folder in a fixed order, label each file (by its class sub-folder, a labels
//! CSV, a regex over its path, or one class for a flat folder), and decide its split from a hash of
//! its path.

pub use super::labels_csv::{csv_path, read_labels_csv, CsvRow, LabelsCsv};
use super::FileKind;
pub use crate::util::error::{shown, shown_path};
use regex::Regex;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One file of the tree and what it will be.
#[derive(Debug, Clone)]
pub struct TreeFile {
    /// Path relative to the tree's root, with '/' separators (bytes of a name that are not
    /// UTF-8 written `\xNN`, see [`name_text`]): names the file in reports, and decides its
    /// split.
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
    /// Symbolic links to folders, not followed (relative paths, sorted).
    pub folder_links: Vec<String>,
    /// Symbolic links to nothing (relative paths, sorted).
    pub dangling: Vec<String>,
    /// FIFOs, sockets and devices, or links to them (relative path, what it is): never opened.
    pub special: Vec<(String, &'static str)>,
    /// The name a one-class dataset gets where it is not the walked folder's own (an `images/`
    /// folder is named after the dataset folder around it).
    pub named: Option<String>,
}

impl Tree {
    /// The name a one-class dataset gets: the folder's name, or a single file's name without
    /// its extensions.
    pub fn own_name(&self, input: &Path) -> String {
        if let Some(n) = &self.named {
            return n.clone();
        }
        if self.single {
            let name = input.file_name().map(name_text).unwrap_or_default();
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
            .and_then(|p| p.file_name().map(name_text))
            .or_else(|| input.file_name().map(name_text))
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

/// One name of a path as text: as it is when it is UTF-8, else with each byte that is not
/// written `\xNN` (Linux allows any bytes but '/' and NUL in a name; class names, reports and
/// the split hash need text).
pub fn name_text(name: &std::ffi::OsStr) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for chunk in name.as_bytes().utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02X}"));
        }
    }
    out
}

/// Every regular file under `input`, sorted by relative path; hidden files and folders (names
/// starting with '.') are skipped. A single file is a tree of one, rooted at its folder.
/// A symbolic link to a file is read as the file it points to, wherever that is; a link to a
/// folder is not followed (so a tree has no loops and every file one path: see `folder_links`),
/// and a link that points to nothing is listed in `dangling`. The walk keeps its own stack, so
/// any depth the file system allows is walked. An error names the folder it concerns.
pub fn walk(input: &Path) -> crate::Result<Tree> {
    use crate::util::error::IoContext;
    if let Some(t) = crate::store::local::special(input) {
        return Err(crate::store::local::not_a_file(input, &t));
    }
    if input.is_file() {
        let rel = input.file_name().map(name_text).unwrap_or_default();
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
            folder_links: vec![],
            dangling: vec![],
            special: vec![],
            named: None,
        });
    }
    let mut tree = Tree {
        root: input.to_path_buf(),
        single: false,
        files: vec![],
        folder_links: vec![],
        dangling: vec![],
        special: vec![],
        named: None,
    };
    let read = |dir: &Path| -> crate::Result<std::vec::IntoIter<std::fs::DirEntry>> {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .and_then(|rd| rd.collect::<Result<Vec<_>, _>>())
            .at(dir)?;
        // Reversed: the stack pops the smallest name first.
        entries.sort_by_key(|e| std::cmp::Reverse(e.file_name()));
        Ok(entries.into_iter())
    };
    // Each open folder with its relative path and the entries left to visit, largest name first.
    let mut stack = vec![(String::new(), read(input)?)];
    while let Some((dir_rel, entries)) = stack.last_mut() {
        let Some(e) = entries.next_back() else {
            stack.pop();
            continue;
        };
        let name = e.file_name();
        if name.as_encoded_bytes().starts_with(b".") {
            continue;
        }
        let rel = if dir_rel.is_empty() {
            name_text(&name)
        } else {
            format!("{dir_rel}/{}", name_text(&name))
        };
        let p = e.path();
        let ft = e.file_type().at(&p)?;
        if ft.is_dir() {
            let entries = read(&p)?;
            stack.push((rel, entries));
        } else if ft.is_file() || (ft.is_symlink() && p.is_file()) {
            tree.files.push(TreeFile {
                rel,
                kind: FileKind::of(&p),
                path: p,
            });
        } else if ft.is_symlink() && p.is_dir() {
            tree.folder_links.push(rel);
        } else if let Some(t) = crate::store::local::special(&p) {
            tree.special.push((rel, crate::store::local::describe(&t)));
        } else if ft.is_symlink() && std::fs::metadata(&p).is_err() {
            tree.dangling.push(rel);
        }
    }
    // Names that are not UTF-8 are written with escapes, which a name that is UTF-8 could spell
    // too: two files with one relative path would share their split and their report lines.
    tree.files.sort_by(|a, b| a.rel.cmp(&b.rel));
    if let Some(w) = tree.files.windows(2).find(|w| w[0].rel == w[1].rel) {
        return Err(crate::Error::Invalid(format!(
            "{} and {} are both {} once names that are not UTF-8 are written with \\xNN escapes; rename one",
            shown_path(&w[0].path),
            shown_path(&w[1].path),
            shown(&w[0].rel)
        )));
    }
    Ok(tree)
}

/// A file's key for pairing with its mask: its relative path without its last extension
/// (`a/b/x.jpg` pairs with `a/b/x.png`).
pub fn stem_key(rel: &str) -> &str {
    let name_at = rel.rfind('/').map_or(0, |i| i + 1);
    match rel[name_at..].rfind('.') {
        Some(i) if i > 0 => &rel[..name_at + i],
        _ => rel,
    }
}

/// The folders of a dataset laid out as `images/` beside `masks/` (or `labels/`), any case:
/// (images folder, masks folder, the other entries of `dir`). The masks folder must hold an
/// image file (a `labels/` of YOLO text files is no mask folder); `masks/` wins over `labels/`.
pub fn mask_layout(dir: &Path) -> Option<(PathBuf, PathBuf, Vec<String>)> {
    let mut entries: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| (name_text(&e.file_name()), e.path()))
        .filter(|(n, _)| !n.starts_with('.'))
        .collect();
    entries.sort();
    let folder = |want: &str| {
        entries
            .iter()
            .find(|(n, p)| n.eq_ignore_ascii_case(want) && p.is_dir())
            .map(|(_, p)| p.clone())
    };
    let images = folder("images")?;
    let masks = ["masks", "labels"]
        .iter()
        .filter_map(|m| folder(m))
        .find(|m| holds_an_image(m))?;
    let others = entries
        .into_iter()
        .filter(|(_, p)| *p != images && *p != masks)
        .map(|(n, p)| if p.is_dir() { format!("{n}/") } else { n })
        .collect();
    Some((images, masks, others))
}

/// Whether an image file lies under `dir` (a bounded look: the first 10,000 entries).
fn holds_an_image(dir: &Path) -> bool {
    let mut stack = vec![dir.to_path_buf()];
    let mut seen = 0;
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            seen += 1;
            if seen > 10_000 {
                return false;
            }
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            } else if matches!(FileKind::of(&p), Some(FileKind::Image | FileKind::Tiff)) {
                return true;
            }
        }
    }
    false
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

/// The names of top-level folders that hold a split rather than a class (any case): `train`,
/// and the held-out ones.
pub const TRAIN_FOLDER: &str = "train";
pub const HELD_OUT_FOLDERS: [&str; 4] = ["val", "valid", "validation", "test"];

/// How the top-level folders of a tree split it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SplitFolders {
    /// No split folders (some top folder is not a split name, or files stand at the top).
    None,
    /// Only a `train` folder (its name as written): the classes are below it, and the test split
    /// is drawn by hash as for any tree.
    TrainOnly(String),
    /// The dataset's own splits: top folder (as written) -> split name. `train` is `train`;
    /// `test` is `test`; a `val`/`valid`/`validation` folder is `test` when there is no `test`
    /// folder (so that `prep train` evaluates on it and `prep eval` reads it by default), else
    /// `val`.
    Splits(BTreeMap<String, String>),
}

/// The split folders among `tops`, the top-level folders that hold the dataset's files, when every
/// one of them is named as a split; `loose`: files stand directly at the top too (then there are
/// none). Two folders for one split (`val/` and `validation/`, `Train/` and `train/`) are an error
/// naming both.
pub fn split_folders<'a>(
    tops: impl IntoIterator<Item = &'a str>,
    loose: bool,
) -> Result<SplitFolders, String> {
    let tops: std::collections::BTreeSet<&str> = tops.into_iter().collect();
    let kind = |t: &str| {
        let l = t.to_ascii_lowercase();
        if l == TRAIN_FOLDER {
            Some("train")
        } else if l == "test" {
            Some("test")
        } else if HELD_OUT_FOLDERS.contains(&l.as_str()) {
            Some("val")
        } else {
            None
        }
    };
    if loose || tops.is_empty() || tops.iter().any(|t| kind(t).is_none()) {
        return Ok(SplitFolders::None);
    }
    let mut by: BTreeMap<&str, &str> = BTreeMap::new();
    for t in &tops {
        let k = kind(t).expect("checked");
        if let Some(other) = by.insert(k, t) {
            return Err(format!(
                "{}/ and {}/ are both {} folders; keep one (or convert each on its own)",
                shown(other),
                shown(t),
                if k == "train" {
                    "training"
                } else {
                    "held-out split"
                }
            ));
        }
    }
    if by.len() == 1 && by.contains_key("train") {
        return Ok(SplitFolders::TrainOnly(by["train"].to_string()));
    }
    let has_test = by.contains_key("test");
    Ok(SplitFolders::Splits(
        by.into_iter()
            .map(|(k, t)| {
                let split = if k == "val" && !has_test { "test" } else { k };
                (t.to_string(), split.to_string())
            })
            .collect(),
    ))
}

/// Whether a file goes to the test split: a hash of its relative path, so the split is the same on
/// every run and machine and does not move when other files are added.
pub fn is_test(rel: &str, fraction: f64) -> bool {
    let h = twox_hash::XxHash3_64::oneshot(rel.as_bytes());
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

#[cfg(test)]
mod mask_layout_tests {
    use super::*;

    #[test]
    fn stems_and_layouts() {
        assert_eq!(stem_key("a/b/x.jpg"), "a/b/x");
        assert_eq!(stem_key("a.b/x.tar.png"), "a.b/x.tar");
        assert_eq!(stem_key("a.b/.x"), "a.b/.x");
        assert_eq!(stem_key("noext"), "noext");
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        std::fs::create_dir_all(d.join("Images/train")).unwrap();
        std::fs::create_dir_all(d.join("labels/train")).unwrap();
        // YOLO text labels are no masks.
        std::fs::write(d.join("labels/train/x.txt"), "0 0.5 0.5 1 1").unwrap();
        assert!(mask_layout(d).is_none());
        std::fs::write(d.join("labels/train/x.png"), b"x").unwrap();
        std::fs::write(d.join("README.md"), b"x").unwrap();
        let (i, m, others) = mask_layout(d).unwrap();
        assert_eq!((i, m), (d.join("Images"), d.join("labels")));
        assert_eq!(others, ["README.md"]);
        // masks/ wins over labels/.
        std::fs::create_dir_all(d.join("masks")).unwrap();
        std::fs::write(d.join("masks/x.tif"), b"x").unwrap();
        let (_, m, others) = mask_layout(d).unwrap();
        assert_eq!(m, d.join("masks"));
        assert_eq!(others, ["README.md", "labels/"]);
    }
}

#[cfg(test)]
mod split_tests {
    use super::*;

    fn splits(tops: &[&str]) -> Vec<(String, String)> {
        match split_folders(tops.iter().copied(), false).unwrap() {
            SplitFolders::Splits(m) => m.into_iter().collect(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn split_folders_by_name() {
        let p = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(
            splits(&["train", "val"]),
            [p("train", "train"), p("val", "test")]
        );
        assert_eq!(
            splits(&["Train", "Validation"]),
            [p("Train", "train"), p("Validation", "test")]
        );
        assert_eq!(
            splits(&["test", "train", "valid"]),
            [p("test", "test"), p("train", "train"), p("valid", "val")]
        );
        assert_eq!(splits(&["test"]), [p("test", "test")]);
        assert_eq!(
            split_folders(["train"], false).unwrap(),
            SplitFolders::TrainOnly("train".into())
        );
        for (tops, loose) in [
            (&["train", "val", "cats"][..], false),
            (&["train", "val"], true),
        ] {
            assert_eq!(
                split_folders(tops.iter().copied(), loose).unwrap(),
                SplitFolders::None
            );
        }
        let e = split_folders(["train", "val", "validation"], false).unwrap_err();
        assert!(e.contains("val/ and validation/"), "{e}");
        assert!(split_folders(["Train", "train"], false).is_err());
    }
}

#[cfg(test)]
mod csv_tests {
    use super::*;

    #[test]
    fn names_that_are_not_utf8_are_escaped_and_shown_on_one_line() {
        use std::os::unix::ffi::OsStrExt;
        let n = std::ffi::OsStr::from_bytes(b"caf\xe9 \xff\xfe.png");
        assert_eq!(name_text(n), "caf\\xE9 \\xFF\\xFE.png");
        assert_eq!(shown("a b.png"), "a b.png");
        assert_eq!(shown("a\nb.png"), "\"a\\nb.png\"");
        assert_eq!(shown(" a.png"), "\" a.png\"");
        assert_eq!(shown("\"q\".png"), "\"\\\"q\\\".png\"");
    }
}
