//! Every write can fail: disk full, read-only folder, an output path that is a file, at each stage; one line naming the path and the cause.
//!
//! A full disk at each stage is injected with the test-only `PREP_TEST_FAIL_WRITE=STAGE:BYTES`
//! (src/output.rs: the files of STAGE take BYTES bytes, then ENOSPC), so it runs everywhere; a
//! real small tmpfs and a read-only mount are used too where the test can mount one (a user
//! and mount namespace, `unshare -rm`), and a folder without write permission where the test
//! does not run as root. Each case checks: exit 1, one line naming the file with the OS's
//! message once, no temporary file or staging folder left, the previous output intact.

use super::{leftovers, one_line, s, synth_args, LOCK};
use crate::util::{files, prep, run, shard_files, small_dataset, stdout};
use std::path::Path;
use std::process::Output;

const FAIL: &str = "PREP_TEST_FAIL_WRITE";
const ENOSPC: &str = "No space left on device (os error 28)";

/// prep `args` with the files of `stage` failing after `bytes` bytes; it must exit 1.
fn failing(stage: &str, bytes: u64, args: &[&str]) -> Output {
    let o = prep()
        .args(args)
        .env(FAIL, format!("{stage}:{bytes}"))
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(1),
        "{args:?} with {stage}:{bytes}\n{}",
        crate::util::stderr(&o)
    );
    o
}

fn len(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().len()
}

#[test]
fn disk_full_at_each_stage_of_synth() {
    let t = tempfile::tempdir().unwrap();
    let reference = t.path().join("reference");
    run(&synth_args(s(&reference), &[]), 0);
    let shard = |d: &Path, i: usize| d.join(format!("train/train-{i:05}.shard"));

    // Shards: full in the middle of the third, after two whole ones.
    let out = t.path().join("shards");
    let budget =
        len(&shard(&reference, 0)) + len(&shard(&reference, 1)) + len(&shard(&reference, 2)) / 2;
    let o = failing("shard", budget, &synth_args(s(&out), &[]));
    one_line(&o, &[&shard(&out, 2).display().to_string(), ENOSPC]);
    assert_eq!(leftovers(&out), Vec::<String>::new());
    for i in 0..2 {
        assert_eq!(
            std::fs::read(shard(&out, i)).unwrap(),
            std::fs::read(shard(&reference, i)).unwrap()
        );
    }
    assert!(!shard(&out, 2).exists() && !out.join("manifest.json").exists());
    let args = synth_args(s(&out), &[]);
    let o = run(&args[..args.len() - 1], 0);
    assert!(
        stdout(&o).contains("resumed: 2 shards kept"),
        "{}",
        stdout(&o)
    );
    assert!(shard_files(&out) == shard_files(&reference));

    // The manifest: every shard is kept, the rerun only writes the manifest.
    let out = t.path().join("manifest");
    let o = failing("manifest", 0, &synth_args(s(&out), &[]));
    one_line(
        &o,
        &[&out.join("manifest.json").display().to_string(), ENOSPC],
    );
    assert_eq!(leftovers(&out), Vec::<String>::new());
    assert!(!out.join("manifest.json").exists());
    let args = synth_args(s(&out), &[]);
    let o = run(&args[..args.len() - 1], 0);
    assert!(stdout(&o).contains("0 written"), "{}", stdout(&o));
    run(&["verify", s(&out), "--quiet"], 0);

    // Column-major files: the images file is given its space first (a full disk is an error
    // there, not a crash when its memory map is written), then the labels file fails.
    let out = t.path().join("colmajor");
    let args = synth_args(s(&out), &["--format", "colmajor"]);
    let o = failing("colmajor", 0, &args);
    one_line(
        &o,
        &[&out.join("images_train.bin").display().to_string(), ENOSPC],
    );
    assert_eq!(leftovers(&out), Vec::<String>::new());
    let images = 3000 * 3 * 12 * 12 * 4;
    let o = failing("colmajor", images + 100, &args);
    one_line(
        &o,
        &[&out.join("labels_train.bin").display().to_string(), ENOSPC],
    );
    assert_eq!(leftovers(&out), Vec::<String>::new());
    assert!(!out.join("images_train.bin").exists() && !out.join("labels_train.bin").exists());
    run(&args, 0);
    run(&["verify", s(&out), "--quiet"], 0);
}

/// Two classes of small PNGs and one file that does not decode (a rejects list).
fn image_tree(root: &Path) {
    for (class, v) in [("cats", 40u8), ("dogs", 160)] {
        let d = root.join(class);
        std::fs::create_dir_all(&d).unwrap();
        for i in 0..12u8 {
            image::GrayImage::from_fn(16, 16, |x, y| {
                image::Luma([v.wrapping_add(i * 7 + (x * 3 + y) as u8)])
            })
            .save(d.join(format!("{i}.png")))
            .unwrap();
        }
    }
    std::fs::write(root.join("dogs/broken.png"), b"not a png").unwrap();
}

#[test]
fn disk_full_at_each_stage_of_convert_keeps_the_old_dataset() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    image_tree(&input);
    let out = t.path().join("out");
    run(&["convert", s(&input), "--out", s(&out), "--quiet"], 0);
    assert!(out.join("rejects.jsonl").exists());
    let before = files(&out);
    for (stage, name, extra) in [
        ("shard", ".shard", &[][..]),
        ("manifest", "manifest.json", &[]),
        ("rejects", "rejects.jsonl", &[]),
        ("colmajor", "images_", &["--format", "colmajor"]),
        ("manifest", "manifest.json", &["--format", "colmajor"]),
    ] {
        let mut args = vec![
            "convert",
            s(&input),
            "--out",
            s(&out),
            "--force",
            "--size",
            "8x8",
            "--quiet",
        ];
        args.extend_from_slice(extra);
        let o = failing(stage, 0, &args);
        one_line(&o, &[s(&out), name, ENOSPC]);
        assert_eq!(leftovers(&out), Vec::<String>::new(), "{stage}");
        assert!(files(&out) == before, "{stage}: the old dataset changed");
    }
    // A new folder: nothing is left at all.
    let new = t.path().join("new");
    let o = failing(
        "rejects",
        10,
        &["convert", s(&input), "--out", s(&new), "--quiet"],
    );
    one_line(&o, &["rejects.jsonl", ENOSPC]);
    assert!(!new.exists(), "a failed convert left {}", new.display());
    // Without the failure the replacement goes through.
    run(
        &[
            "convert",
            s(&input),
            "--out",
            s(&out),
            "--force",
            "--size",
            "8x8",
            "--quiet",
        ],
        0,
    );
    assert!(files(&out) != before);
    run(&["verify", s(&out), "--quiet"], 0);
}

#[test]
fn disk_full_at_each_stage_of_training() {
    let t = tempfile::tempdir().unwrap();
    let ds = small_dataset(t.path(), &[]);
    let args = |out: &Path| -> Vec<String> {
        [
            "train",
            s(&ds),
            "--device",
            "cpu",
            "--epochs",
            "2",
            "--batch",
            "256",
            "--quiet",
            "--out",
            s(out),
        ]
        .iter()
        .map(|a| a.to_string())
        .collect()
    };
    let reference = t.path().join("reference");
    let a = args(&reference);
    run(&a.iter().map(String::as_str).collect::<Vec<_>>(), 0);
    let ckpt_len = len(&reference.join("checkpoint.safetensors"));
    let first_line = std::fs::read_to_string(reference.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .len() as u64
        + 1;
    let epoch_of = |d: &Path| {
        prep::train::checkpoint::load(&d.join("checkpoint.safetensors"))
            .unwrap()
            .1
            .epoch
    };
    let lines = |d: &Path| {
        std::fs::read_to_string(d.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .count()
    };

    for (stage, budget, file) in [
        // The second checkpoint (end of epoch 2) fails: the first stays.
        (
            "checkpoint",
            ckpt_len + ckpt_len / 2,
            "checkpoint.safetensors",
        ),
        // metrics.jsonl rewritten with epoch 2 fails: the file with epoch 1 stays.
        ("metrics", first_line + first_line / 2, "metrics.jsonl"),
        // The curves at the end fail: the last checkpoint stays.
        ("plot", 0, "curves.png"),
    ] {
        let dir = t.path().join(stage);
        let a = args(&dir);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let o = failing(stage, budget, &a);
        one_line(&o, &[&dir.join(file).display().to_string(), ENOSPC]);
        assert_eq!(leftovers(&dir), Vec::<String>::new(), "{stage}");
        assert!(!dir.join(file).exists() || stage != "plot", "{stage}");
        match stage {
            "checkpoint" => assert_eq!(epoch_of(&dir), 1),
            "metrics" => {
                assert_eq!(epoch_of(&dir), 1);
                assert_eq!(lines(&dir), 1);
            }
            _ => assert_eq!(epoch_of(&dir), 2),
        }
        // The run goes on from what was kept, to the weights of an uninterrupted run.
        run(&["train", "--resume", s(&dir), "--quiet"], 0);
        assert_eq!(lines(&dir), 2);
        assert!(dir.join("curves.png").exists() && dir.join("summary.json").exists());
        let w = |d: &Path| {
            prep::train::checkpoint::load(&d.join("checkpoint.safetensors"))
                .unwrap()
                .0
        };
        assert!(
            w(&dir) == w(&reference),
            "{stage}: the resumed run's weights differ"
        );
    }
}

#[test]
fn output_path_that_is_a_file() {
    let t = tempfile::tempdir().unwrap();
    let ds = small_dataset(t.path(), &[]);
    let f = t.path().join("a-file");
    std::fs::write(&f, b"keep me").unwrap();
    let sub = f.join("sub");
    for (out, why) in [
        (&f, "File exists (os error 17)"),
        (&sub, "Not a directory (os error 20)"),
    ] {
        for args in [
            synth_args(s(out), &[]),
            vec!["convert", s(&ds), "--out", s(out), "--quiet"],
            vec![
                "train",
                s(&ds),
                "--device",
                "cpu",
                "--epochs",
                "1",
                "--out",
                s(out),
                "--quiet",
            ],
        ] {
            let o = run(&args, 1);
            one_line(&o, &[&format!("{}: {why}", out.display())]);
            assert_eq!(std::fs::read(&f).unwrap(), b"keep me");
        }
    }
    // merge into a file.
    let parts: Vec<_> = (0..2)
        .map(|i| {
            let p = t.path().join(format!("p{i}"));
            run(&synth_args(s(&p), &["--part", &format!("{i}/2")]), 0);
            p
        })
        .collect();
    let o = run(&["merge", s(&f), s(&parts[0]), s(&parts[1]), "--quiet"], 1);
    one_line(
        &o,
        &[&format!("{}: File exists (os error 17)", f.display())],
    );
    assert_eq!(std::fs::read(&f).unwrap(), b"keep me");
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn read_only_folder() {
    if is_root() {
        println!(
            "skipped: running as root, where folder permissions do not stop writes; \
             a read-only mount is tested in real_small_file_system where mounting works"
        );
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    let ds = small_dataset(t.path(), &[]);
    let before = files(&ds);
    let ro = |p: &Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    ro(&ds, 0o555);
    let o = run(&synth_args(s(&ds), &["--seed", "9", "--force"]), 1);
    one_line(
        &o,
        &[
            &ds.join(LOCK).display().to_string(),
            "Permission denied (os error 13)",
        ],
    );
    let parent = t.path().join("ro");
    std::fs::create_dir(&parent).unwrap();
    ro(&parent, 0o555);
    let o = run(
        &[
            "convert",
            s(&ds),
            "--out",
            s(&parent.join("new")),
            "--quiet",
        ],
        1,
    );
    one_line(&o, &["Permission denied (os error 13)", "ro/new"]);
    ro(&ds, 0o755);
    ro(&parent, 0o755);
    assert!(files(&ds) == before);
    run(&["verify", s(&ds), "--quiet"], 0);
}

/// A real full disk and a real read-only file system: a 4 MiB tmpfs, mounted in a user and mount
/// namespace of a shell that runs prep (the mount is gone when it ends; results are written
/// beside it). Skipped, saying why, where such a namespace cannot be made.
#[test]
fn real_small_file_system() {
    let t = tempfile::tempdir().unwrap();
    let mnt = t.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let probe = std::process::Command::new("unshare")
        .args([
            "-rm",
            "sh",
            "-c",
            &format!("mount -t tmpfs -o size=64k tmpfs '{}'", mnt.display()),
        ])
        .output();
    match &probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            println!(
                "skipped: cannot mount a tmpfs in a user namespace here ({}); a full disk is \
                 covered by the PREP_TEST_FAIL_WRITE tests",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            return;
        }
        Err(e) => {
            println!("skipped: no unshare ({e}); a full disk is covered by the PREP_TEST_FAIL_WRITE tests");
            return;
        }
    }
    let small = small_dataset(t.path(), &[]);
    let res = t.path().join("res");
    std::fs::create_dir_all(&res).unwrap();
    let synth = crate::util::SMALL_SYNTH[..].join(" ");
    let big_synth = synth.replacen("--train 3000", "--train 30000", 1);
    assert_ne!(synth, big_synth);
    let script = format!(
        r#"set -u
P='{p}'; D='{d}'; E='{e}'; SMALL='{small}'
mount -t tmpfs -o size=4m tmpfs "$D" || exit 97
"$P" {big_synth} --out "$D/synth" --quiet 2>"$E/synth.err"; echo $? >"$E/synth.rc"
"$P" {synth} --format colmajor --out "$D/cm" --quiet 2>"$E/cm.err"; echo $? >"$E/cm.rc"
find "$D" -name '*.tmp' -o -name .prep-staging -o -name .prep.lock >"$E/left1"
rm -rf "$D/synth" "$D/cm"
"$P" convert "$SMALL" --out "$D/conv" --quiet 2>"$E/c1.err"; echo $? >"$E/c1.rc"
(cd "$D/conv" && find . -type f | sort | xargs md5sum) >"$E/before"
"$P" convert "$SMALL" --out "$D/conv" --force --codec none --size 48x48 --quiet 2>"$E/c2.err"; echo $? >"$E/c2.rc"
(cd "$D/conv" && find . -type f | sort | xargs md5sum) >"$E/after"
find "$D" -name '*.tmp' -o -name .prep-staging -o -name .prep.lock >"$E/left2"
mount -o remount,ro "$D"
"$P" {synth} --out "$D/ro" --quiet 2>"$E/ro.err"; echo $? >"$E/ro.rc"
"#,
        p = env!("CARGO_BIN_EXE_prep"),
        d = mnt.display(),
        e = res.display(),
        small = small.display(),
    );
    let o = std::process::Command::new("unshare")
        .args(["-rm", "sh", "-c", &script])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let read = |n: &str| std::fs::read_to_string(res.join(n)).unwrap();
    let one = |err: &str, rc: &str, why: &str| {
        let e = read(err);
        assert_eq!(read(rc).trim(), "1", "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(
            e.contains(why) && e.matches("(os error").count() == 1,
            "{e}"
        );
        println!("{}", e.trim());
    };
    one("synth.err", "synth.rc", ENOSPC);
    one("cm.err", "cm.rc", ENOSPC);
    assert_eq!(read("left1"), "");
    assert_eq!(read("c1.rc").trim(), "0", "{}", read("c1.err"));
    one("c2.err", "c2.rc", ENOSPC);
    assert_eq!(read("before"), read("after"), "the old dataset changed");
    assert_eq!(read("left2"), "");
    one("ro.err", "ro.rc", "Read-only file system (os error 30)");
}
