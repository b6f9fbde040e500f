//! The library's layering (DESIGN.md, "Where things live"), read off its own sources: a room
//! imports only rooms below it, and no file imports one that imports it back, directly or around
//! a circle. Test code (after a file's `#[cfg(test)]`) and a file's edges to its own parent
//! modules are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The rooms from the bottom up: a room may import the rooms of lower ranks (and itself).
const RANKS: [(&str, u8); 9] = [
    ("util", 0),
    ("store", 1),
    ("format", 2),
    ("source", 3),
    ("nn", 3),
    ("dist", 3),
    ("synth", 4),
    ("convert", 4),
    ("train", 4),
];

fn rank(room: &str) -> Option<u8> {
    RANKS.iter().find(|(r, _)| *r == room).map(|(_, k)| *k)
}

/// Every library source under `src/` (the binary's main.rs, cli.rs and cmd/ aside) as its module
/// path (`format::shard::reader`).
fn modules(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    fn walk(dir: &Path, at: Vec<String>, out: &mut BTreeMap<Vec<String>, PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            if p.is_dir() {
                let mut m = at.clone();
                m.push(name);
                walk(&p, m, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let mut m = at.clone();
                if name != "mod" {
                    m.push(name);
                }
                out.insert(m, p);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, vec![], &mut out);
    out.retain(|m, _| {
        !m.is_empty() && !matches!(m[0].as_str(), "main" | "cli" | "cmd" | "parse" | "lib")
    });
    out
}

/// The source's code up to its test module, without comments.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = text.split("#[cfg(test)]").next().unwrap();
    let mut out = String::new();
    for line in text.lines() {
        let l = line.split("//").next().unwrap();
        out.push_str(l);
        out.push('\n');
    }
    out
}

/// The module paths a source names (`crate::a::b::C`, `super::x`), resolved to the longest
/// prefix that is a module.
fn imports(
    me: &[String],
    path: &Path,
    all: &BTreeMap<Vec<String>, PathBuf>,
) -> BTreeSet<Vec<String>> {
    let code = code(path);
    let mut out = BTreeSet::new();
    let bytes = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let mut i = 0;
    while i < bytes.len() {
        if !code.is_char_boundary(i) {
            i += 1;
            continue;
        }
        let rest = &code[i..];
        let (start, mut at) = if rest.starts_with("crate::") && (i == 0 || !ident(bytes[i - 1])) {
            (7, vec![])
        } else if rest.starts_with("super::") && (i == 0 || !ident(bytes[i - 1])) {
            // `super` of module a::b (a/b.rs or a/b/mod.rs) is a.
            (7, me[..me.len() - 1].to_vec())
        } else {
            i += 1;
            continue;
        };
        let end = rest[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .map_or(rest.len(), |e| start + e);
        for seg in rest[start..end].split("::").filter(|s| !s.is_empty()) {
            if seg == "super" {
                at.pop();
            } else {
                at.push(seg.to_string());
            }
        }
        // The longest prefix that is a module.
        while !at.is_empty() && !all.contains_key(&at) {
            at.pop();
        }
        if !at.is_empty() && at != me {
            out.insert(at);
        }
        i += end.max(1);
    }
    out
}

/// Every import between two modules of the library, a file's own ancestors left out.
fn graph(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let all = modules(src);
    all.iter()
        .map(|(m, p)| {
            let to = imports(m, p, &all)
                .into_iter()
                .filter(|t| !m.starts_with(t))
                .collect();
            (m.clone(), to)
        })
        .collect()
}

fn name(m: &[String]) -> String {
    m.join("::")
}

/// What breaks the layering: imports of a higher room, and circles.
fn breaks(src: &Path) -> Vec<String> {
    let g = graph(src);
    let mut bad = Vec::new();
    for (m, to) in &g {
        let Some(mine) = rank(&m[0]) else {
            bad.push(format!("{} is in no room of the layering", name(m)));
            continue;
        };
        for t in to {
            if t[0] == m[0] {
                continue;
            }
            match rank(&t[0]) {
                Some(r) if r < mine => {}
                _ => bad.push(format!(
                    "{} imports {} (a room not below it)",
                    name(m),
                    name(t)
                )),
            }
        }
    }
    // Circles: a depth-first search for a back edge.
    let mut state: BTreeMap<&Vec<String>, u8> = BTreeMap::new();
    fn visit<'a>(
        m: &'a Vec<String>,
        g: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        state: &mut BTreeMap<&'a Vec<String>, u8>,
        stack: &mut Vec<&'a Vec<String>>,
        bad: &mut Vec<String>,
    ) {
        state.insert(m, 1);
        stack.push(m);
        for t in g.get(m).into_iter().flatten() {
            match state.get(t) {
                Some(1) => {
                    let from = stack.iter().position(|s| *s == t).unwrap();
                    let circle: Vec<String> = stack[from..].iter().map(|s| name(s)).collect();
                    bad.push(format!("circle: {} -> {}", circle.join(" -> "), name(t)));
                }
                Some(_) => {}
                None => visit(t, g, state, stack, bad),
            }
        }
        stack.pop();
        state.insert(m, 2);
    }
    for m in g.keys() {
        if !state.contains_key(m) {
            visit(m, &g, &mut state, &mut Vec::new(), &mut bad);
        }
    }
    bad
}

#[test]
fn the_library_keeps_its_layering() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let bad = breaks(&src);
    assert!(
        bad.is_empty(),
        "the layering is broken:\n{}",
        bad.join("\n")
    );
}

/// The check fails on what it is for: an upward import and a circle, planted in a copy.
#[test]
fn the_layering_check_fails_on_a_planted_upward_import_and_circle() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    let w = |p: &str, text: &str| {
        let p = src.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    w("lib.rs", "pub mod util; pub mod format; pub mod train;");
    w("util/mod.rs", "pub mod error; pub mod mem;");
    w(
        "util/error.rs",
        "use crate::util::mem::x; // crate::train in a comment is no import\n",
    );
    w(
        "util/mem.rs",
        "pub fn x() {}\n#[cfg(test)]\nmod t { use crate::train::y; }\n",
    );
    w("format/mod.rs", "use crate::util::error::E;");
    w("train/mod.rs", "use crate::format::X; pub fn y() {}");
    assert_eq!(breaks(&src), Vec::<String>::new());
    // An upward import: util reaching into train.
    w("util/mem.rs", "pub fn x() { crate::train::y() }");
    let b = breaks(&src);
    assert_eq!(
        b[0], "util::mem imports train (a room not below it)",
        "{b:?}"
    );
    // A circle inside a room.
    w("util/mem.rs", "use super::error::E; pub fn x() {}");
    let b = breaks(&src);
    assert!(
        b.len() == 1 && b[0].starts_with("circle: util::error -> util::mem -> util::error"),
        "{b:?}"
    );
}
