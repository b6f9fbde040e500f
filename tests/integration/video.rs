//! `prep convert --kind video` end to end, with clips made by ffmpeg's test source.
//!
//! Without ffmpeg these tests print "skipped: ffmpeg not on PATH" and pass, unless
//! PREP_REQUIRE_FFMPEG=1 (as in CI), where they fail.

use crate::util::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The ffmpeg to make clips with (the one `prep` will use too), or None to skip.
pub(crate) fn ffmpeg_or_skip() -> Option<PathBuf> {
    let found = match std::env::var_os("PREP_FFMPEG").filter(|p| !p.is_empty()) {
        Some(p) => Some(PathBuf::from(p)).filter(|p| p.is_file()),
        None => std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(format!("ffmpeg{}", std::env::consts::EXE_SUFFIX)))
                .find(|p| p.is_file())
        }),
    };
    if found.is_none() {
        if std::env::var("PREP_REQUIRE_FFMPEG").as_deref() == Ok("1") {
            panic!("PREP_REQUIRE_FFMPEG=1 but ffmpeg was not found on PATH (or PREP_FFMPEG)");
        }
        println!("skipped: ffmpeg not on PATH");
    }
    found
}

/// Make a clip of ffmpeg's test pattern: `seconds` at 10 fps, 64x48.
pub(crate) fn clip(ffmpeg: &Path, out: &Path, seconds: &str, codec: &[&str]) {
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let o = Command::new(ffmpeg)
        .args([
            "-nostdin",
            "-v",
            "error",
            "-y",
            "-f",
            "lavfi",
            "-i",
            "testsrc=size=64x48:rate=10",
        ])
        .args(["-t", seconds, "-pix_fmt", "yuv420p"])
        .args(codec)
        .arg(out)
        .stdin(Stdio::null())
        .output()
        .expect("ffmpeg runs");
    assert!(
        o.status.success(),
        "ffmpeg failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// in/cats/a.mp4 (30 frames) and in/dogs/b.avi (20 frames).
fn two_classes(ffmpeg: &Path, dir: &Path) -> PathBuf {
    let input = dir.join("in");
    clip(ffmpeg, &input.join("cats/a.mp4"), "3", &[]);
    clip(ffmpeg, &input.join("dogs/b.avi"), "2", &["-c:v", "mpeg4"]);
    input
}

#[test]
fn convert_videos_every_second_frame() {
    let Some(ff) = ffmpeg_or_skip() else { return };
    let t = tempfile::tempdir().unwrap();
    let input = two_classes(&ff, t.path());
    let out = t.path().join("out");
    let (i, o) = (input.to_str().unwrap(), out.to_str().unwrap());
    run(
        &[
            "convert",
            i,
            "--out",
            o,
            "--kind",
            "video",
            "--size",
            "32x32",
            "--every",
            "2",
            "--test-fraction",
            "0",
            "--quiet",
        ],
        0,
    );

    let r = run(&["inspect", o, "--json"], 0);
    let v: serde_json::Value = serde_json::from_slice(&r.stdout)
        .unwrap_or_else(|e| panic!("inspect --json: {e}\n{}", stdout(&r)));
    assert_eq!(v["shape"], serde_json::json!([3, 32, 32]), "{v}");
    assert_eq!(v["classes"], serde_json::json!(["cats", "dogs"]), "{v}");
    let splits = v["splits"].as_array().expect("splits is an array");
    let train = splits
        .iter()
        .find(|s| s["name"] == "train")
        .expect("a train split");
    assert_eq!(train["samples"], 25, "{v}");
    assert_eq!(train["class_counts"], serde_json::json!([15, 10]), "{v}");
    // --test-fraction 0: no test samples (an empty split, or none at all).
    let test_samples: u64 = splits
        .iter()
        .filter(|s| s["name"] != "train")
        .map(|s| s["samples"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(test_samples, 0, "{v}");
}

#[test]
fn convert_videos_at_a_frame_rate() {
    let Some(ff) = ffmpeg_or_skip() else { return };
    let t = tempfile::tempdir().unwrap();
    let input = two_classes(&ff, t.path());
    let out = t.path().join("out");
    let (i, o) = (input.to_str().unwrap(), out.to_str().unwrap());
    run(
        &[
            "convert",
            i,
            "--out",
            o,
            "--kind",
            "video",
            "--size",
            "32x32",
            "--fps",
            "2",
            "--test-fraction",
            "0",
            "--quiet",
        ],
        0,
    );
    let r = run(&["inspect", o, "--json"], 0);
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    let train = v["splits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "train")
        .unwrap();
    let counts: Vec<u64> = train["class_counts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_u64().unwrap())
        .collect();
    // About 2 frames a second: 3 s and 2 s of video.
    assert!(
        counts.len() == 2 && (5..=7).contains(&counts[0]) && (3..=5).contains(&counts[1]),
        "{v}"
    );
}

/// A PREP_FFMPEG that points nowhere stops the conversion with a message that says how to fix it.
#[test]
fn missing_ffmpeg_is_explained() {
    let Some(ff) = ffmpeg_or_skip() else { return };
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    clip(&ff, &input.join("cats/a.mp4"), "1", &[]);
    let out = t.path().join("out");
    let nowhere = t.path().join("no/such/ffmpeg");
    let o = prep()
        .args([
            "convert",
            input.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--kind",
            "video",
        ])
        .args(["--size", "32x32", "--on-error", "fail", "--quiet"])
        .env("PREP_FFMPEG", &nowhere)
        .output()
        .expect("prep runs");
    let text = format!("{}{}", stdout(&o), stderr(&o));
    assert!(!o.status.success(), "{text}");
    assert!(
        text.contains("PREP_FFMPEG") && text.contains("install ffmpeg"),
        "{text}"
    );
}
