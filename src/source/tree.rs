//! File trees: walk a folder in a fixed order, label each file (by its class sub-folder, a labels
//! CSV, a regex over its path, or one class for a flat folder), and decide its split from a hash of
//! its path.

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
}

impl Tree {
    /// The name a one-class dataset gets: the folder's name, or a single file's name without
    /// its extensions.
    pub fn own_name(&self, input: &Path) -> String {
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
        });
    }
    let mut tree = Tree {
        root: input.to_path_buf(),
        single: false,
        files: vec![],
        folder_links: vec![],
        dangling: vec![],
        special: vec![],
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

/// One row of a labels CSV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvRow {
    pub label: String,
    /// The line the row starts on (from 1), for messages.
    pub line: u64,
}

/// The labels of a labels CSV: relative path (as [`csv_path`] makes it) -> row, and the rows
/// whose path cannot name a file of the tree (an absolute path, one that leaves it through
/// `..`): (path as written, why, naming the CSV and the line), rejected like missing files.
#[derive(Debug, Clone, Default)]
pub struct LabelsCsv {
    pub rows: BTreeMap<String, CsvRow>,
    pub outside: Vec<(String, String)>,
}

/// A labels CSV's path relative to the tree's root as a tree names its files: '\' read as '/',
/// empty and `.` components dropped, `a/../b` is `b`. An absolute path, or one whose `..` climbs
/// above the root, names no file of the tree: Err says why.
pub fn csv_path(raw: &str) -> Result<String, &'static str> {
    let p = raw.replace('\\', "/");
    if p.starts_with('/') {
        return Err("the path is absolute (paths are relative to the input folder)");
    }
    let mut parts: Vec<&str> = Vec::new();
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts
                    .pop()
                    .ok_or("the path leaves the input folder through ..")?;
            }
            c => parts.push(c),
        }
    }
    Ok(parts.join("/"))
}

/// Labels from a CSV of `path,label` rows (a header row `path,label` is allowed; a UTF-8 byte
/// order mark, CRLF line ends, quoted fields and white space around fields are too). Paths are
/// relative to the tree's root. A row without both fields, a path listed twice and a file
/// without rows are errors naming the file and the line.
pub fn read_labels_csv(path: &Path) -> Result<LabelsCsv, String> {
    let name = shown_path(path);
    let bytes = crate::store::local::read_capped(path, 1 << 30, "a labels CSV")
        .map_err(|e| e.to_string())?;
    let mut r = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(&bytes[..]);
    let mut out = LabelsCsv::default();
    let mut rec = csv::StringRecord::new();
    // Line numbers counted here: the csv crate's lag by one after a CRLF line end.
    let (mut counted, mut lines) = (0, 0u64);
    for i in 0.. {
        if !r
            .read_record(&mut rec)
            .map_err(|e| format!("{name}: {e}"))?
        {
            break;
        }
        let mut start = rec.position().map_or(0, |p| p.byte() as usize).max(counted);
        while matches!(bytes.get(start), Some(b'\r' | b'\n')) {
            start += 1;
        }
        lines += bytes[counted..start]
            .iter()
            .filter(|&&b| b == b'\n')
            .count() as u64;
        counted = start;
        let line = lines + 1;
        let at = format!("{name}: line {line}");
        let first = rec.get(0).map(|f| f.trim_start_matches('\u{feff}').trim());
        if rec.len() != 2 {
            return Err(format!(
                "{at}: expected `path,label`, found {} fields",
                rec.len()
            ));
        }
        let (raw, label) = (first.unwrap_or_default(), &rec[1]);
        if i == 0 && raw.eq_ignore_ascii_case("path") && label.eq_ignore_ascii_case("label") {
            continue;
        }
        if raw.is_empty() || label.is_empty() {
            return Err(format!(
                "{at}: an empty {}",
                if raw.is_empty() { "path" } else { "label" }
            ));
        }
        let key = match csv_path(raw) {
            Ok(k) if !k.is_empty() => k,
            Ok(_) => {
                return Err(format!(
                    "{at}: {} names the input folder itself, not a file",
                    shown(raw)
                ))
            }
            Err(why) => {
                out.outside.push((
                    raw.to_string(),
                    format!("listed in {name} line {line} but {why}"),
                ));
                continue;
            }
        };
        let row = CsvRow {
            label: label.to_string(),
            line,
        };
        if let Some(first) = out.rows.insert(key.clone(), row) {
            return Err(format!(
                "{at}: {} is listed twice (first on line {})",
                shown(&key),
                first.line
            ));
        }
    }
    if out.rows.is_empty() && out.outside.is_empty() {
        return Err(format!("{name}: no `path,label` rows"));
    }
    Ok(out)
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
    fn labels_csv_lines_paths_and_outside_rows() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("l.csv");
        std::fs::write(
            &p,
            "\u{feff}path,label\r\na.png,x\r\n\"b\nc.png\",y\r\n../d.png,x\r\n./e//f/../g.png, z \r\n",
        )
        .unwrap();
        let l = read_labels_csv(&p).unwrap();
        let rows: Vec<(&str, &str, u64)> = l
            .rows
            .iter()
            .map(|(k, r)| (k.as_str(), r.label.as_str(), r.line))
            .collect();
        assert_eq!(
            rows,
            [("a.png", "x", 2), ("b\nc.png", "y", 3), ("e/g.png", "z", 6)]
        );
        assert_eq!(l.outside.len(), 1);
        assert!(l.outside[0].1.contains("line 5"), "{:?}", l.outside);
        assert_eq!(
            csv_path("a/../../b"),
            Err("the path leaves the input folder through ..")
        );
        assert!(csv_path("/a").is_err());
        assert_eq!(csv_path("a\\b"), Ok("a/b".into()));
    }

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
