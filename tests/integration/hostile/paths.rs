//! Hostile paths: labels CSVs and manifests naming files outside the tree, symlink loops, file
//! names with spaces, newlines or invalid UTF-8, and such paths on the command line. Each test
//! makes its own corpus in a temporary folder.

use crate::util::{prep, run, small_dataset, stderr, stdout};
use image::{GrayImage, Luma};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Output;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A path from raw bytes (Linux allows any bytes but '/' and NUL in a name).
fn raw(dir: &Path, name: &[u8]) -> PathBuf {
    dir.join(OsStr::from_bytes(name))
}

fn png(path: &Path, v: u8) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    GrayImage::from_fn(8, 8, |x, y| Luma([v.wrapping_add((x * 5 + y) as u8)]))
        .save_with_format(path, image::ImageFormat::Png)
        .unwrap();
}

/// Run prep with arguments that need not be UTF-8; panic unless it exits with `code`.
fn run_os(args: &[&OsStr], code: i32) -> Output {
    let o = prep().args(args).output().expect("prep runs");
    assert_eq!(
        o.status.code(),
        Some(code),
        "prep {args:?}\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        stderr(&o)
    );
    o
}

/// `prep convert INPUT --out OUT EXTRA...`.
fn convert(input: &Path, out: &Path, extra: &[&str], code: i32) -> Output {
    let mut a: Vec<&OsStr> = vec!["convert".as_ref(), input.as_os_str(), "--out".as_ref()];
    a.push(out.as_os_str());
    a.extend(extra.iter().map(|e| OsStr::new(*e)));
    run_os(&a, code)
}

fn manifest(out: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap()
}

/// Samples of every split together.
fn total(out: &Path) -> u64 {
    let m = manifest(out);
    m["splits"]
        .as_object()
        .unwrap()
        .values()
        .map(|s| s["samples"].as_u64().unwrap())
        .sum()
}

fn classes(out: &Path) -> Vec<String> {
    manifest(out)["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect()
}

/// rejects.jsonl: (path, reason), one JSON object per line.
fn rejects(out: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(out.join("rejects.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("one JSON object per line");
            (
                v["path"].as_str().unwrap().to_string(),
                v["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn reason<'a>(r: &'a [(String, String)], path: &str) -> &'a str {
    &r.iter()
        .find(|(p, _)| p == path)
        .unwrap_or_else(|| panic!("no reject for {path:?} in {r:?}"))
        .1
}

/// Rewrite `dir/manifest.json` through `edit` and seal it again, as a hostile writer would.
fn doctor(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut m = manifest(dir);
    edit(&mut m);
    std::fs::write(
        dir.join("manifest.json"),
        prep::format::shard::manifest::seal(&m),
    )
    .unwrap();
}

#[test]
fn labels_csv_rows_outside_missing_quoted_bom_crlf() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    png(&input.join("a.png"), 1);
    png(&input.join("b.png"), 2);
    png(&input.join("c d.png"), 3);
    png(&input.join("sub/e.png"), 4);
    png(&input.join("f,g.png"), 5);
    png(&input.join("h\ni.png"), 6);
    png(&input.join("unlisted.png"), 7);
    png(&input.join(".hidden.png"), 8);
    png(&t.path().join("x.png"), 9); // outside the tree, beside it
    let csv = t.path().join("labels.csv");
    // A byte order mark, CRLF line ends, a header, quoted fields with a comma and a newline,
    // paths spelt with ./, // and a/.., rows that leave the tree, a missing file, a hidden one.
    let rows = [
        "path,label",
        "a.png,cat",
        "../x.png,dog",
        "/etc/passwd,dog",
        "nothere.png,cat",
        "\"c d.png\", dog ",
        "./sub//e.png,cat",
        "sub/../b.png,dog",
        "\"f,g.png\",cat",
        "\"h\ni.png\",\"dog\"",
        "sub/../../in/a2.png,cat",
        ".hidden.png,cat",
    ];
    let text = format!("\u{feff}{}\r\n", rows.join("\r\n"));
    std::fs::write(&csv, text).unwrap();
    let out = t.path().join("out");
    let o = convert(&input, &out, &["--labels", s(&csv), "--size", "8x8"], 0);
    assert_eq!(total(&out), 6, "a, b, c d, sub/e, f,g and h\\ni");
    assert_eq!(classes(&out), ["cat", "dog"]);
    let r = rejects(&out);
    assert_eq!(r.len(), 5, "{r:?}");
    let csv_name = csv.display().to_string();
    for (path, line, what) in [
        ("../x.png", 3, "leaves the input folder"),
        ("/etc/passwd", 4, "absolute"),
        ("nothere.png", 5, "missing"),
        // Line 10 starts the quoted name with a newline: this row is on line 12.
        ("sub/../../in/a2.png", 12, "leaves the input folder"),
        (".hidden.png", 13, "not read (hidden"),
    ] {
        let why = reason(&r, path);
        assert!(
            why.contains(&format!("{csv_name} line {line}")) && why.contains(what),
            "{path}: {why}"
        );
    }
    // The stderr summary names them too, one line each.
    let e = stderr(&o);
    assert!(e.contains("skipped 5 inputs"), "{e}");
    assert!(e.contains("  ../x.png: listed in"), "{e}");

    // --on-error fail stops at the first such row, naming it and its line, and writes nothing.
    let out2 = t.path().join("out2");
    let o = convert(
        &input,
        &out2,
        &["--labels", s(&csv), "--on-error", "fail"],
        1,
    );
    let e = stderr(&o);
    assert!(e.contains("labels.csv line "), "{e}");
    assert!(!out2.exists());
}

#[test]
fn labels_csv_malformed_is_a_usage_error_naming_the_line() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    png(&input.join("a.png"), 1);
    png(&input.join("b.png"), 2);
    let out = t.path().join("out");
    let csv = t.path().join("l.csv");
    for (text, names) in [
        (&b""[..], &["l.csv: no `path,label` rows"][..]),
        (b"path,label\r\n", &["l.csv: no `path,label` rows"]),
        (
            b"a.png,cat\n./a.png,dog\n",
            &["l.csv: line 2: a.png is listed twice (first on line 1)"],
        ),
        (
            b"a.png,cat\nb.png,dog,extra\n",
            &["l.csv: line 2: expected `path,label`, found 3 fields"],
        ),
        (b"a.png,\n", &["l.csv: line 1: an empty label"]),
        (b" ,cat\n", &["l.csv: line 1: an empty path"]),
        (
            b"\"a.png,cat\n",
            &["l.csv: line 1: expected `path,label`, found 1 fields"],
        ),
        (b"./,cat\n", &["l.csv: line 1", "the input folder itself"]),
        (b"a.png,c\xffat\n", &["l.csv", "UTF-8"]),
        (
            b"a.png,cat\n\"b\nx.png\",dog\nb.png,dog\nb.png,cat\n",
            &["l.csv: line 5: b.png is listed twice (first on line 4)"],
        ),
    ] {
        std::fs::write(&csv, text).unwrap();
        let o = convert(&input, &out, &["--labels", s(&csv)], 2);
        let e = stderr(&o);
        for n in names {
            assert!(
                e.contains(n),
                "{:?}: no {n:?} in {e}",
                String::from_utf8_lossy(text)
            );
        }
        assert!(!out.exists());
    }
}

#[test]
fn manifests_naming_files_outside_the_dataset_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let ds = small_dataset(t.path(), &[]);
    let pristine = std::fs::read(ds.join("manifest.json")).unwrap();
    let out = t.path().join("out");
    for bad in [
        "../../etc/passwd",
        "/etc/passwd",
        "train/../../x.shard",
        "./train/train-00000.shard",
        "",
    ] {
        std::fs::write(ds.join("manifest.json"), &pristine).unwrap();
        doctor(&ds, |m| {
            m["splits"]["train"]["shards"][0]["file"] = bad.into()
        });
        for args in [
            vec!["verify", s(&ds)],
            vec!["inspect", s(&ds)],
            vec!["convert", s(&ds), "--out", s(&out)],
            vec!["train", s(&ds), "--device", "cpu", "--out", s(&out)],
        ] {
            let o = run(&args, 1);
            let e = stdout(&o) + &stderr(&o);
            assert!(
                e.contains(&format!("{}", ds.join("manifest.json").display())),
                "{e}"
            );
            assert!(
                e.contains(&format!("shard path {bad:?} is not a relative path inside")),
                "{args:?}: {e}"
            );
            assert!(!out.exists());
        }
    }
    // A split name is a folder name: one that climbs is refused the same way.
    std::fs::write(ds.join("manifest.json"), &pristine).unwrap();
    doctor(&ds, |m| {
        let s = m["splits"].as_object_mut().unwrap();
        let v = s.remove("test").unwrap();
        s.insert("../test".into(), v);
    });
    let o = run(&["verify", s(&ds)], 1);
    let e = stdout(&o) + &stderr(&o);
    assert!(
        e.contains("split name \"../test\" is not a plain name"),
        "{e}"
    );

    // A shard that is a symbolic link to a file outside is read as what it points to, and
    // refused as not a shard: nothing of that file is shown.
    std::fs::write(ds.join("manifest.json"), &pristine).unwrap();
    let secret = t.path().join("secret.txt");
    std::fs::write(&secret, "password=hunter2\n".repeat(100)).unwrap();
    let shard = ds.join("train/train-00000.shard");
    std::fs::remove_file(&shard).unwrap();
    symlink(&secret, &shard).unwrap();
    let o = run(&["verify", s(&ds)], 1);
    let e = stdout(&o) + &stderr(&o);
    assert!(e.contains("train-00000.shard"), "{e}");
    assert!(!e.contains("hunter2"), "{e}");
}

#[test]
fn colmajor_manifest_split_names_cannot_leave_the_folder() {
    let t = tempfile::tempdir().unwrap();
    let ds = small_dataset(t.path(), &["--format", "colmajor"]);
    // A folder named images_.. makes images_../../x.bin resolve next to the dataset.
    std::fs::create_dir(ds.join("images_..")).unwrap();
    std::fs::write(t.path().join("outside.bin"), [0u8; 64]).unwrap();
    let pristine = std::fs::read(ds.join("manifest.json")).unwrap();
    for (name, images, labels) in [
        (
            "../../outside",
            "images_../../outside.bin",
            "labels_../../outside.bin",
        ),
        (
            "/etc/passwd",
            "images_/etc/passwd.bin",
            "labels_/etc/passwd.bin",
        ),
        ("", "images_.bin", "labels_.bin"),
    ] {
        std::fs::write(ds.join("manifest.json"), &pristine).unwrap();
        doctor(&ds, |m| {
            let s = m["splits"].as_object_mut().unwrap();
            let mut v = s.remove("test").unwrap();
            v["images"] = images.into();
            v["labels"] = labels.into();
            s.insert(name.into(), v);
        });
        let out = t.path().join("out");
        for args in [
            vec!["verify", s(&ds)],
            vec!["convert", s(&ds), "--out", s(&out)],
            vec!["train", s(&ds), "--device", "cpu", "--out", s(&out)],
        ] {
            let o = run(&args, 1);
            let e = stdout(&o) + &stderr(&o);
            assert!(e.contains("manifest.json"), "{e}");
            assert!(
                e.contains(&format!("split name {name:?} is not a plain name")),
                "{args:?}: {e}"
            );
            assert!(!out.exists());
        }
    }
}

#[test]
fn merge_refuses_a_part_naming_files_outside_it() {
    let t = tempfile::tempdir().unwrap();
    let parts: Vec<PathBuf> = (0..2)
        .map(|i| {
            let p = t.path().join(format!("p{i}"));
            let part = format!("{i}/2");
            run(
                &[
                    "synth",
                    "--train",
                    "600",
                    "--test",
                    "100",
                    "--shape",
                    "1x8x8",
                    "--block-samples",
                    "64",
                    "--out",
                    s(&p),
                    "--part",
                    &part,
                    "--quiet",
                ],
                0,
            );
            p
        })
        .collect();
    // Part 1 points at part 0's shard, and at a file outside both.
    for bad in ["../p0/train/train-00000.shard", "/etc/passwd"] {
        doctor(&parts[1], |m| {
            m["splits"]["train"]["shards"][0]["file"] = bad.into()
        });
        let out = t.path().join("merged");
        let e = stderr(&run(&["merge", s(&out), s(&parts[0]), s(&parts[1])], 1));
        assert!(
            e.contains(&format!("{}", parts[1].join("manifest.json").display())),
            "{e}"
        );
        assert!(e.contains(&format!("{bad:?}")), "{e}");
        assert!(!out.exists());
    }
    // A part's rejects.jsonl is copied line by line: a line that is not a reject record is
    // refused, naming the file and the line.
    let fresh = t.path().join("p1");
    std::fs::remove_dir_all(&fresh).unwrap();
    run(
        &[
            "synth",
            "--train",
            "600",
            "--test",
            "100",
            "--shape",
            "1x8x8",
            "--block-samples",
            "64",
            "--out",
            s(&fresh),
            "--part",
            "1/2",
            "--quiet",
        ],
        0,
    );
    let rj = fresh.join("rejects.jsonl");
    std::fs::write(
        &rj,
        "{\"path\":\"a.png\",\"reason\":\"bad\"}\nforged line\n",
    )
    .unwrap();
    let out = t.path().join("merged");
    let e = stderr(&run(&["merge", s(&out), s(&parts[0]), s(&fresh)], 1));
    assert!(
        e.contains(&format!("{}: line 2: not a reject record", rj.display())),
        "{e}"
    );
    assert!(!out.exists());
    std::fs::write(&rj, "{\"path\":\"a.png\",\"reason\":\"bad\"}\n").unwrap();
    run(&["merge", s(&out), s(&parts[0]), s(&fresh)], 0);
    assert_eq!(
        std::fs::read_to_string(out.join("rejects.jsonl")).unwrap(),
        "{\"path\":\"a.png\",\"reason\":\"bad\"}\n"
    );
}

#[test]
fn symlink_loops_dangling_links_and_links_out_of_the_tree() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    png(&input.join("cats/a.png"), 1);
    png(&input.join("dogs/b.png"), 2);
    png(&t.path().join("outside.png"), 3);
    symlink("..", input.join("cats/loop")).unwrap(); // a loop through the parent
    symlink(".", input.join("dogs/here")).unwrap(); // a loop through itself
    symlink("self.png", input.join("dogs/self.png")).unwrap(); // a link to itself
    symlink("nowhere.png", input.join("dogs/dangling.png")).unwrap();
    symlink("../../outside.png", input.join("dogs/out.png")).unwrap(); // a file outside
    symlink(input.join("cats"), input.join("more")).unwrap(); // a folder link at the top
    let out = t.path().join("out");
    let o = convert(&input, &out, &["--size", "8x8"], 0);
    // Files through links are read wherever they point; folders through links are not walked.
    assert_eq!(total(&out), 3, "cats/a, dogs/b and dogs/out");
    assert_eq!(classes(&out), ["cats", "dogs"]);
    let r = rejects(&out);
    assert_eq!(r.len(), 2, "{r:?}");
    for p in ["dogs/dangling.png", "dogs/self.png"] {
        assert!(reason(&r, p).contains("symbolic link to nothing"), "{r:?}");
    }
    let e = stderr(&o);
    assert!(
        e.contains("3 symbolic links to folders not followed (e.g. cats/loop)"),
        "{e}"
    );
    // --on-error fail stops at the dangling link, by name.
    let o = convert(&input, &t.path().join("out2"), &["--on-error", "fail"], 1);
    assert!(stderr(&o).contains("dogs/dangling.png"), "{}", stderr(&o));
    // The input itself a link to a folder: walked.
    let l = t.path().join("link-in");
    symlink(&input, &l).unwrap();
    convert(&l, &t.path().join("out3"), &["--size", "8x8"], 0);
    assert_eq!(total(&t.path().join("out3")), 3);
}

/// Make `depth` nested folders named `name` under `dir` with a PNG at the bottom, through
/// relative calls, so that the depth is not bounded by the longest path the kernel takes.
fn nest(dir: &Path, name: &str, depth: usize) {
    use std::ffi::CString;
    let cname = CString::new(name).unwrap();
    let cdir = CString::new(dir.as_os_str().as_bytes()).unwrap();
    let mut bytes = Vec::new();
    GrayImage::from_pixel(8, 8, Luma([9]))
        .write_to(
            &mut std::io::Cursor::new(&mut bytes),
            image::ImageFormat::Png,
        )
        .unwrap();
    unsafe {
        let mut fd = libc::open(cdir.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY);
        assert!(fd >= 0);
        for _ in 0..depth {
            assert_eq!(libc::mkdirat(fd, cname.as_ptr(), 0o755), 0);
            let next = libc::openat(fd, cname.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY);
            assert!(next >= 0);
            libc::close(fd);
            fd = next;
        }
        let f = libc::openat(
            fd,
            c"deep.png".as_ptr(),
            libc::O_WRONLY | libc::O_CREAT,
            0o644,
        );
        assert!(f >= 0);
        assert_eq!(
            libc::write(f, bytes.as_ptr().cast(), bytes.len()),
            bytes.len() as isize
        );
        libc::close(f);
        libc::close(fd);
    }
}

#[test]
fn deep_nesting_walks_or_stops_naming_the_folder() {
    let t = tempfile::tempdir().unwrap();
    // 1500 levels: a 3000-byte path, within the kernel's limit: walked, the file converted.
    let input = t.path().join("in");
    png(&input.join("top/a.png"), 1);
    std::fs::create_dir_all(input.join("deep")).unwrap();
    nest(&input.join("deep"), "d", 1500);
    let out = t.path().join("out");
    convert(&input, &out, &["--size", "8x8"], 0);
    assert_eq!(total(&out), 2);
    assert_eq!(classes(&out), ["deep", "top"]);
    // 1000 levels of 8-byte names: 9000 bytes, past PATH_MAX: a clear error naming the
    // folder it could not read, no crash.
    let input = t.path().join("in2");
    png(&input.join("top/a.png"), 1);
    std::fs::create_dir_all(input.join("deep")).unwrap();
    nest(&input.join("deep"), "dddddddd", 1000);
    let out = t.path().join("out2");
    let e = stderr(&convert(&input, &out, &["--size", "8x8"], 1));
    assert!(
        e.contains("dddddddd/dddddddd/"),
        "{}",
        &e[..e.len().min(500)]
    );
    assert!(
        e.contains("too long"),
        "{}",
        &e[e.len().saturating_sub(300)..]
    );
    assert!(!out.exists());
}

#[test]
fn odd_names_convert_and_are_reported_unambiguously() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    // Class folders with a space, a leading dash, a tab, a newline, unicode, and three names
    // that are not UTF-8 (two differ only in their bad byte: they stay two classes).
    let folders: [&[u8]; 8] = [
        b"cl ass",
        b"-dash",
        b"tab\tclass",
        b"new\nline",
        "ünïcödé".as_bytes(),
        b"caf\xe9",
        b"\xff",
        b"\xfe",
    ];
    // File names of the same kinds, and a terminal escape.
    let files: [&[u8]; 6] = [
        b" lead.png",
        b"-x.png",
        b"a\nb.png",
        b"\xff.png",
        b"x\x1b[31m.png",
        b"--help.png",
    ];
    for (i, f) in folders.iter().enumerate() {
        for (j, n) in files.iter().enumerate() {
            png(&raw(&raw(&input, f), n), (i * 10 + j) as u8);
        }
    }
    // A file that is not an image, with a newline in its name: rejected, and its name must
    // not forge a line on stderr.
    let bad = raw(&input, b"cl ass/evil\nskipped 99 inputs: forged.png");
    std::fs::write(&bad, b"not a png").unwrap();
    let out = t.path().join("out");
    let o = convert(&input, &out, &["--size", "8x8"], 0);
    assert_eq!(total(&out), 48);
    let mut want: Vec<String> = vec![
        "cl ass".into(),
        "-dash".into(),
        "tab\tclass".into(),
        "new\nline".into(),
        "ünïcödé".into(),
        "caf\\xE9".into(),
        "\\xFF".into(),
        "\\xFE".into(),
    ];
    want.sort();
    assert_eq!(classes(&out), want);
    let r = rejects(&out);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].0, "cl ass/evil\nskipped 99 inputs: forged.png");
    let e = stderr(&o);
    assert!(
        e.contains("  \"cl ass/evil\\nskipped 99 inputs: forged.png\": "),
        "{e}"
    );
    assert!(
        !e.lines().any(|l| l.starts_with("skipped 99")),
        "a forged line: {e}"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("rejects.jsonl"))
            .unwrap()
            .lines()
            .count(),
        1
    );
    // --on-error fail names the file escaped, on one line.
    let o = convert(&input, &t.path().join("out2"), &["--on-error", "fail"], 1);
    let e = stderr(&o);
    assert!(e.contains("evil\\nskipped 99"), "{e}");
    assert!(!e.lines().any(|l| l.starts_with("skipped 99")), "{e}");

    // A flat folder whose own name is not UTF-8 and holds a newline: one class, so named.
    let flat = raw(t.path(), b"fl\nat\xff");
    png(&flat.join("a.png"), 1);
    let out3 = t.path().join("out3");
    let e = stderr(&convert(&flat, &out3, &["--size", "8x8"], 0));
    assert!(e.contains("one class \"fl\\nat\\\\xFF\""), "{e}");
    assert_eq!(classes(&out3), ["fl\nat\\xFF"]);
}

#[test]
fn names_equal_once_escaped_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    png(&raw(&input, b"c/a\xff.png"), 1);
    png(&input.join("c/a\\xFF.png"), 2); // a backslash, spelt as the escape of the other
    let out = t.path().join("out");
    let e = stderr(&convert(&input, &out, &[], 2));
    assert!(
        e.contains("a\\xFF.png once names that are not UTF-8"),
        "{e}"
    );
    assert!(e.contains("rename one"), "{e}");
    assert!(!out.exists());
}

#[test]
fn odd_paths_on_the_command_line() {
    let t = tempfile::tempdir().unwrap();
    // INPUT and --out with spaces, a newline, a leading dash and bytes that are not UTF-8.
    let input = raw(t.path(), b"-in put\n\xff");
    png(&input.join("a/x.png"), 1);
    png(&input.join("b/y.png"), 2);
    let out = raw(t.path(), b"-out dir\n\xfe");
    convert(&input, &out, &["--size", "8x8"], 0);
    assert_eq!(total(&out), 2);
    let cmd = manifest(&out)["provenance"]["command"].clone();
    assert!(
        cmd.to_string().contains("-in put\\n\u{fffd}"),
        "the command line is recorded, bad bytes replaced: {cmd}"
    );
    run_os(&["verify".as_ref(), out.as_os_str()], 0);
    run_os(&["inspect".as_ref(), out.as_os_str(), "--json".as_ref()], 0);
    // synth with such an --out (the command line was read with std::env::args, which panics).
    let so = raw(t.path(), b"synth \xff out");
    run_os(
        &[
            "synth".as_ref(),
            "--train".as_ref(),
            "64".as_ref(),
            "--shape".as_ref(),
            "1x8x8".as_ref(),
            "--out".as_ref(),
            so.as_os_str(),
            "--quiet".as_ref(),
        ],
        0,
    );
    run_os(&["verify".as_ref(), so.as_os_str()], 0);
    // Errors name such paths on one line.
    let missing = raw(t.path(), b"no\nsuch\xff");
    let o = convert(&missing, &t.path().join("o"), &[], 2);
    let e = stderr(&o);
    assert!(e.contains("no\\nsuch"), "{e}");
    assert_eq!(e.trim_end().lines().count(), 1, "{e}");
    // train, eval, verify and inspect too (a missing input is a usage error everywhere).
    for args in [
        vec![
            "train".as_ref(),
            missing.as_os_str(),
            "--device".as_ref(),
            "cpu".as_ref(),
        ],
        vec!["eval".as_ref(), missing.as_os_str(), missing.as_os_str()],
        vec!["verify".as_ref(), missing.as_os_str()],
        vec!["inspect".as_ref(), missing.as_os_str()],
    ] {
        let e = stderr(&run_os(&args, 2));
        assert!(e.contains("no\\nsuch"), "{args:?}: {e}");
        assert_eq!(e.trim_end().lines().count(), 1, "{args:?}: {e}");
    }
    // A flag value that must be text is refused as a usage error, not a panic.
    let o = run_os(
        &[
            "convert".as_ref(),
            input.as_os_str(),
            "--label-from".as_ref(),
            OsStr::from_bytes(b"(\xff)"),
        ],
        2,
    );
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
}

#[test]
fn video_names_are_file_names_to_ffmpeg() {
    let Some(ffmpeg) = crate::video::ffmpeg_or_skip() else {
        return;
    };
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("clips");
    // Written under a plain name (ffmpeg would take these as a protocol or an option), then
    // renamed.
    for name in ["pipe:1.mp4", "-v.mp4", "concat:x.mp4"] {
        let tmp = dir.join("tmp.mp4");
        crate::video::clip(&ffmpeg, &tmp, "1", &[]);
        std::fs::rename(&tmp, dir.join(name)).unwrap();
    }
    let out = t.path().join("out");
    convert(&dir, &out, &["--size", "8x8", "--every", "5"], 0);
    assert!(rejects(&out).is_empty(), "{:?}", rejects(&out));
    assert!(total(&out) >= 3);
    // A single file given relative to the working folder: `pipe:1.mp4` is that file.
    let o = prep()
        .current_dir(&dir)
        .args(["convert", "pipe:1.mp4", "--out"])
        .arg(t.path().join("one"))
        .args(["--size", "8x8", "--every", "5"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(total(&t.path().join("one")) >= 1);
}
