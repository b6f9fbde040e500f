//! Labels CSVs (`--labels FILE`): a file's class, and where the CSV has more columns, its labels
//! (0/1 columns, the `labels` field) and values (the columns `--values` names, the `values`
//! field).
//!
//! Two shapes. `path,label` rows, with or without that header row: the class of each file, as
//! prep always read them. Or a header row naming the columns (its first field `path`, `file` or
//! `filename`, any case): the first column holds paths, a column named `label` or `class` (any
//! case) the class; the columns `--values` names hold numbers (f32, finite); every other column
//! holds 0 or 1. A CSV without a class column labels every file with one class.

use crate::util::error::{shown, shown_path};
use std::collections::BTreeMap;
use std::path::Path;

/// One row of a labels CSV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvRow {
    /// The class; empty where the CSV has no class column.
    pub label: String,
    /// The line the row starts on (from 1), for messages.
    pub line: u64,
    /// The row's field bytes: its labels (one 0/1 byte each), then its values (f32,
    /// little-endian), as every sample of its file carries them. Empty without such columns.
    pub fields: Box<[u8]>,
}

/// The labels of a labels CSV: relative path (as [`csv_path`] makes it) -> row, and the rows
/// whose path cannot name a file of the tree (an absolute path, one that leaves it through
/// `..`): (path as written, why, naming the CSV and the line), rejected like missing files.
#[derive(Debug, Clone, Default)]
pub struct LabelsCsv {
    pub rows: BTreeMap<String, CsvRow>,
    pub outside: Vec<(String, String)>,
    /// Rows whose cells cannot label their file (a values cell that is empty or not a finite
    /// number, an empty labels cell): (relative path, why, naming the CSV, line and column).
    /// Their files are rejected.
    pub bad: Vec<(String, String)>,
    /// The CSV gives classes (a `label` or `class` column, or `path,label` rows).
    pub has_class: bool,
    /// The 0/1 columns, in CSV order: the names of the `labels` field.
    pub labels: Vec<String>,
    /// The `--values` columns, in that order: the names of the `values` field.
    pub values: Vec<String>,
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

/// The records of a CSV with the line each starts on (a UTF-8 byte order mark, CRLF line ends,
/// quoted fields and white space around fields allowed).
fn records(name: &str, bytes: &[u8]) -> Result<Vec<(u64, Vec<String>)>, String> {
    let mut r = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(bytes);
    let mut out = Vec::new();
    let mut rec = csv::StringRecord::new();
    // Line numbers counted here: the csv crate's lag by one after a CRLF line end.
    let (mut counted, mut lines) = (0, 0u64);
    while r
        .read_record(&mut rec)
        .map_err(|e| format!("{name}: {e}"))?
    {
        let mut start = rec.position().map_or(0, |p| p.byte() as usize).max(counted);
        while matches!(bytes.get(start), Some(b'\r' | b'\n')) {
            start += 1;
        }
        lines += bytes[counted..start]
            .iter()
            .filter(|&&b| b == b'\n')
            .count() as u64;
        counted = start;
        let mut fields: Vec<String> = rec.iter().map(str::to_string).collect();
        if out.is_empty() {
            if let Some(f) = fields.first_mut() {
                *f = f.trim_start_matches('\u{feff}').trim().to_string();
            }
        }
        out.push((lines + 1, fields));
    }
    Ok(out)
}

/// Which column is what, from the header row (None: no header, `path,label` rows).
struct Columns {
    names: Vec<String>,
    class: Option<usize>,
    labels: Vec<usize>,
    values: Vec<usize>,
}

fn is_header(first: &[String]) -> bool {
    first
        .first()
        .is_some_and(|f| ["path", "file", "filename"].contains(&f.to_ascii_lowercase().as_str()))
}

/// The columns a header names, checked against `--values`.
fn columns(name: &str, header: &[String], values: &[String]) -> Result<Columns, String> {
    let names: Vec<String> = header.to_vec();
    for (i, n) in names.iter().enumerate() {
        if n.is_empty() {
            return Err(format!(
                "{name}: column {} of the header has no name",
                i + 1
            ));
        }
        if names[..i].contains(n) {
            return Err(format!(
                "{name}: the header names column {} twice",
                shown(n)
            ));
        }
    }
    let classy: Vec<usize> = (1..names.len())
        .filter(|&i| ["label", "class"].contains(&names[i].to_ascii_lowercase().as_str()))
        .collect();
    if classy.len() > 1 {
        return Err(format!(
            "{name}: columns {} and {} both name the class; keep one",
            shown(&names[classy[0]]),
            shown(&names[classy[1]])
        ));
    }
    let class = classy.first().copied();
    let mut vcols = Vec::new();
    for v in values {
        let i = (1..names.len()).find(|&i| &names[i] == v).ok_or_else(|| {
            format!(
                "--values {}: {name} has no such column (its columns: {})",
                shown(v),
                names.join(", ")
            )
        })?;
        if Some(i) == class {
            return Err(format!(
                "--values {}: that column of {name} is the class",
                shown(v)
            ));
        }
        if vcols.contains(&i) {
            return Err(format!("--values names {} twice", shown(v)));
        }
        vcols.push(i);
    }
    let labels = (1..names.len())
        .filter(|&i| Some(i) != class && !vcols.contains(&i))
        .collect();
    Ok(Columns {
        names,
        class,
        labels,
        values: vcols,
    })
}

/// Labels from a labels CSV (see the module's rules); `values`: the `--values` columns. Paths
/// are relative to the tree's root. A row of the wrong number of fields, an empty path or class,
/// a path listed twice, a column that is neither 0/1 nor named by `--values`, and a file without
/// rows are errors naming the file and the line; a cell that cannot label its row's file puts
/// the row in `bad`.
pub fn read_labels_csv(path: &Path, values: &[String]) -> Result<LabelsCsv, String> {
    let name = shown_path(path);
    let bytes = crate::store::local::read_capped(path, 1 << 30, "a labels CSV")
        .map_err(|e| e.to_string())?;
    let recs = records(&name, &bytes)?;
    let header = recs.first().is_some_and(|(_, f)| is_header(f));
    let cols = match recs.first() {
        Some((_, first)) if header => Some(columns(&name, first, values)?),
        _ if !values.is_empty() => {
            return Err(format!(
                "{name}: --values names columns, but the CSV has no header row naming them (e.g. path,label,{})",
                values.join(",")
            ))
        }
        _ => None,
    };
    // `path,label` CSVs keep their messages.
    let plain = cols.as_ref().is_none_or(|c| is_plain(&c.names));
    let mut out = LabelsCsv {
        has_class: cols.as_ref().is_none_or(|c| c.class.is_some()),
        labels: cols.as_ref().map_or(vec![], |c| {
            c.labels.iter().map(|&i| c.names[i].clone()).collect()
        }),
        values: cols.as_ref().map_or(vec![], |c| {
            c.values.iter().map(|&i| c.names[i].clone()).collect()
        }),
        ..Default::default()
    };
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for (line, rec) in recs.into_iter().skip(usize::from(header)) {
        let at = format!("{name}: line {line}");
        let want = cols.as_ref().map_or(2, |c| c.names.len());
        if rec.len() != want {
            return Err(match &cols {
                Some(c) if !plain => format!(
                    "{at}: {} fields, but the header names {want} ({})",
                    rec.len(),
                    c.names.join(",")
                ),
                _ => format!("{at}: expected `path,label`, found {} fields", rec.len()),
            });
        }
        let raw = rec[0].as_str();
        let class_at = cols.as_ref().map_or(Some(1), |c| c.class);
        let label = class_at.map_or("", |i| rec[i].as_str());
        if raw.is_empty() || (class_at.is_some() && label.is_empty()) {
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
        if let Some(first) = lines.insert(key.clone(), line) {
            return Err(format!(
                "{at}: {} is listed twice (first on line {first})",
                shown(&key)
            ));
        }
        let fields = match &cols {
            Some(c) => match row_fields(&name, line, c, &rec)? {
                Ok(f) => f,
                Err(why) => {
                    out.bad.push((key, why));
                    continue;
                }
            },
            None => Box::default(),
        };
        let row = CsvRow {
            label: label.to_string(),
            line,
            fields,
        };
        out.rows.insert(key, row);
    }
    if out.rows.is_empty() && out.outside.is_empty() && out.bad.is_empty() {
        return Err(format!("{name}: no `path,label` rows"));
    }
    Ok(out)
}

/// A first row `path,label` (any case): the header of a plain CSV.
fn is_plain(first: &[String]) -> bool {
    first.len() == 2 && ["label", "class"].contains(&first[1].to_ascii_lowercase().as_str())
}

/// A row's labels and values as field bytes. Outer Err: a labels cell that is not 0 or 1 (the
/// column is not a label: the whole CSV is refused); inner Err: a cell that cannot label this
/// row's file.
fn row_fields(
    name: &str,
    line: u64,
    c: &Columns,
    rec: &[String],
) -> Result<Result<Box<[u8]>, String>, String> {
    let mut out = Vec::with_capacity(c.labels.len() + 4 * c.values.len());
    let cell = |i: usize| format!("{name} line {line}, column {}", shown(&c.names[i]));
    for &i in &c.labels {
        match rec[i].as_str() {
            "0" => out.push(0),
            "1" => out.push(1),
            "" => return Ok(Err(format!("{}: an empty cell (a label is 0 or 1)", cell(i)))),
            v => {
                return Err(format!(
                    "{name}: column {} holds {} on line {line}, not 0 or 1: columns other than the path, the class (label or class) and those --values names are 0/1 labels; name it with --values {} if it holds numbers",
                    shown(&c.names[i]),
                    shown(v),
                    shown(&c.names[i])
                ))
            }
        }
    }
    for &i in &c.values {
        let v = rec[i].as_str();
        let x = match v.parse::<f32>() {
            _ if v.is_empty() => return Ok(Err(format!("{}: an empty cell", cell(i)))),
            Ok(x) if x.is_finite() => x,
            Ok(_) => {
                return Ok(Err(format!(
                    "{}: {} is not a finite number in f32",
                    cell(i),
                    shown(v)
                )))
            }
            Err(_) => return Ok(Err(format!("{}: {} is not a number", cell(i), shown(v)))),
        };
        out.extend_from_slice(&x.to_le_bytes());
    }
    Ok(Ok(out.into_boxed_slice()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str, values: &[&str]) -> Result<LabelsCsv, String> {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("l.csv");
        std::fs::write(&p, text).unwrap();
        let v: Vec<String> = values.iter().map(|s| s.to_string()).collect();
        read_labels_csv(&p, &v)
    }

    #[test]
    fn labels_csv_lines_paths_and_outside_rows() {
        let l = read(
            "\u{feff}path,label\r\na.png,x\r\n\"b\nc.png\",y\r\n../d.png,x\r\n./e//f/../g.png, z \r\n",
            &[],
        )
        .unwrap();
        let rows: Vec<(&str, &str, u64)> = l
            .rows
            .iter()
            .map(|(k, r)| (k.as_str(), r.label.as_str(), r.line))
            .collect();
        assert_eq!(
            rows,
            [("a.png", "x", 2), ("b\nc.png", "y", 3), ("e/g.png", "z", 6)]
        );
        assert!(l.has_class && l.labels.is_empty() && l.values.is_empty());
        assert!(l.rows.values().all(|r| r.fields.is_empty()));
        assert_eq!(l.outside.len(), 1);
        assert!(l.outside[0].1.contains("line 5"), "{:?}", l.outside);
        assert_eq!(
            csv_path("a/../../b"),
            Err("the path leaves the input folder through ..")
        );
        assert!(csv_path("/a").is_err());
        assert_eq!(csv_path("a\\b"), Ok("a/b".into()));
        // No header: path,label rows as ever.
        let l = read("a.png,x\nb.png,y\n", &[]).unwrap();
        assert_eq!(l.rows.len(), 2);
        let e = read("a.png,x,1\n", &[]).unwrap_err();
        assert!(
            e.contains("line 1: expected `path,label`, found 3 fields"),
            "{e}"
        );
    }

    #[test]
    fn columns_give_labels_and_values() {
        let l = read(
            "Path,cat,age,Class,dog,weight\na.png,1,30.5,x,0,-2\nb.png,0,1e-3,y,1,7\n",
            &["weight", "age"],
        )
        .unwrap();
        assert!(l.has_class);
        assert_eq!(l.labels, ["cat", "dog"]);
        assert_eq!(l.values, ["weight", "age"]);
        let a = &l.rows["a.png"];
        assert_eq!(a.label, "x");
        let mut want = vec![1u8, 0];
        want.extend((-2.0f32).to_le_bytes());
        want.extend(30.5f32.to_le_bytes());
        assert_eq!(&a.fields[..], &want[..]);
        let b = &l.rows["b.png"];
        assert_eq!(&b.fields[6..10], &1e-3f32.to_le_bytes());
        // Without a class column: no classes.
        let l = read("file,cat\na.png,1\n", &[]).unwrap();
        assert!(!l.has_class);
        assert_eq!(l.rows["a.png"].label, "");
        assert_eq!(&l.rows["a.png"].fields[..], &[1]);
    }

    #[test]
    fn bad_cells_reject_their_rows_and_bad_columns_the_csv() {
        let l = read(
            "path,label,age,cat\na.png,x,,1\nb.png,x,NaN,1\nc.png,x,inf,0\nd.png,x,old,0\ne.png,x,1e39,1\nf.png,x,2,\ng.png,x,3,1\n",
            &["age"],
        )
        .unwrap();
        assert_eq!(l.rows.len(), 1);
        let bad: BTreeMap<&str, &str> = l
            .bad
            .iter()
            .map(|(k, w)| (k.as_str(), w.as_str()))
            .collect();
        assert!(
            bad["a.png"].ends_with("line 2, column age: an empty cell"),
            "{bad:?}"
        );
        assert!(
            bad["b.png"].contains("NaN is not a finite number"),
            "{bad:?}"
        );
        assert!(bad["c.png"].contains("inf is not a finite"), "{bad:?}");
        assert!(bad["d.png"].contains("old is not a number"), "{bad:?}");
        assert!(bad["e.png"].contains("1e39 is not a finite"), "{bad:?}");
        assert!(
            bad["f.png"].contains("column cat: an empty cell"),
            "{bad:?}"
        );
        let e = read("path,label,age\na.png,x,31\n", &[]).unwrap_err();
        assert!(
            e.contains("column age holds 31 on line 2, not 0 or 1") && e.contains("--values age"),
            "{e}"
        );
        let e = read("path,label,age\na.png,x,31\n", &["weight"]).unwrap_err();
        assert!(
            e.contains("--values weight: ") && e.contains("no such column"),
            "{e}"
        );
        let e = read("a.png,x\n", &["age"]).unwrap_err();
        assert!(e.contains("no header row"), "{e}");
        let e = read("path,label,cat\na.png,x\n", &[]).unwrap_err();
        assert!(
            e.contains("line 2: 2 fields, but the header names 3"),
            "{e}"
        );
        let e = read("path,label,class\na.png,x,y\n", &[]).unwrap_err();
        assert!(e.contains("both name the class"), "{e}");
    }
}
